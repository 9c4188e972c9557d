/*
 * gateway/api.h — the HTTP APIs llamad-http speaks, as data: a request body
 * (OpenAI chat completions and completions, Ollama chat and generate)
 * parsed into one form, and the answers written back in each API's shape.
 *
 * Pure: no sockets, no event loop (tests/fuzz/fuzz_http.c drives it). A
 * refused body gives the HTTP status and a message naming the field.
 */
#ifndef LLAMAD_GATEWAY_API_H
#define LLAMAD_GATEWAY_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define API_MAX_STOP 16

enum api_kind {
	API_OPENAI_CHAT,      /* POST /v1/chat/completions */
	API_OPENAI_COMPLETE,  /* POST /v1/completions */
	API_OLLAMA_CHAT,      /* POST /api/chat */
	API_OLLAMA_GENERATE,  /* POST /api/generate */
};

/* Roles are llamad.proto's Role values. */
struct api_msg {
	int role;
	char *text;
};

struct api_req {
	enum api_kind kind;
	char *model;
	bool stream;
	bool include_usage;        /* OpenAI stream_options.include_usage */
	bool chat;                 /* messages (chat template) vs raw prompt */
	char *system;              /* the leading system message(s), or NULL */
	struct api_msg *msgs;      /* the rest of the conversation, in order */
	size_t n_msgs;
	char *prompt;              /* raw prompt (completions, generate raw) */
	/* sampler and length: has_ says the request set it */
	bool has_max_tokens, has_temperature, has_top_p, has_top_k, has_min_p,
	     has_seed, has_presence, has_frequency, has_repeat_penalty,
	     has_repeat_last_n;
	uint32_t max_tokens;
	float temperature, top_p, min_p, presence, frequency, repeat_penalty;
	int32_t top_k, repeat_last_n;
	uint64_t seed;
	char *stop[API_MAX_STOP];
	size_t n_stop;
};

/* Parse body (len bytes, not NUL-terminated) as a request of kind. 0 on
 * success (free q with api_req_free); else the HTTP status (400) with
 * a one-line message in err naming the field. q is freed on failure. */
int api_parse(enum api_kind kind, const char *body, size_t len, struct api_req *q,
	      char *err, size_t errlen);

void api_req_free(struct api_req *q);

/* Trim ASCII white space at both ends: the matching rule's normal form of
 * a message's text (a copy; NULL on ENOMEM). */
char *api_norm(const char *s, size_t *len);

/* OpenAI finish_reason / Ollama done_reason of a llamad StopReason. */
const char *api_finish_reason(int stop_reason);

#endif

/*
 * gateway/render.h — the answers' JSON in each API's shape: OpenAI chat
 * completion objects and chunks, text completions, Ollama's chat and
 * generate lines, and both APIs' error objects. Each returns a malloc'd
 * NUL-terminated string (NULL on ENOMEM). Pure.
 */
#ifndef LLAMAD_GATEWAY_RENDER_H
#define LLAMAD_GATEWAY_RENDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gateway/api.h"

struct render_ctx {
	enum api_kind kind;
	const char *id;            /* "chatcmpl-..." / "cmpl-..." */
	int64_t created;           /* Unix seconds */
	const char *model;
};

struct render_done {
	int reason;                /* llamad StopReason */
	uint32_t prompt_tokens;    /* the whole prompt: history and new turn */
	uint32_t cached_tokens;    /* of which were not computed again */
	uint32_t completion_tokens;
	double total_ms, prefill_ms, generate_ms;
};

/* The HTTP error body: OpenAI's {"error": {message, type, param, code}} or
 * Ollama's {"error": message} (kind says which). */
char *render_error(enum api_kind kind, int status, const char *msg);

/* Streamed piece of text (len bytes; valid UTF-8). OpenAI: one SSE chunk
 * object (first: role set as well); Ollama: one NDJSON object. */
char *render_piece(const struct render_ctx *c, const char *text, size_t len, bool first);

/* The stream's last object(s): OpenAI's finish chunk (and the usage chunk,
 * usage set, as a second string in *usage_out); Ollama's done line. */
char *render_stream_end(const struct render_ctx *c, const struct render_done *d,
			bool usage, char **usage_out);

/* A whole (not streamed) answer of text (len bytes). */
char *render_whole(const struct render_ctx *c, const struct render_done *d,
		   const char *text, size_t len);

/* RFC 3339 UTC time with nanoseconds, as Ollama writes created_at. */
void render_time(char *buf, size_t n);

#endif

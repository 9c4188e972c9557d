/*
 * gateway/render.c — see render.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "gateway/render.h"

static bool is_openai(enum api_kind k)
{
	return k == API_OPENAI_CHAT || k == API_OPENAI_COMPLETE;
}

static char *dump(json_t *o)
{
	if (!o)
		return NULL;
	char *s = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	return s;
}

static const char *error_type(int status)
{
	switch (status) {
	case 400: case 413: case 422:
		return "invalid_request_error";
	case 401: case 403:
		return "authentication_error";
	case 404:
		return "not_found_error";
	case 429:
		return "rate_limit_error";
	default:
		return status >= 500 ? "server_error" : "invalid_request_error";
	}
}

char *render_error(enum api_kind kind, int status, const char *msg)
{
	if (!is_openai(kind))
		return dump(json_pack("{s:s}", "error", msg));
	return dump(json_pack("{s:{s:s,s:s,s:n,s:n}}", "error", "message", msg, "type",
			      error_type(status), "param", "code"));
}

void render_time(char *buf, size_t n)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	struct tm tm;
	gmtime_r(&ts.tv_sec, &tm);
	char d[32];
	strftime(d, sizeof(d), "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(buf, n, "%s.%09ldZ", d, ts.tv_nsec);
}

static json_t *str_n(const char *s, size_t n)
{
	return json_stringn_nocheck(s, n);
}

static int64_t ns(double ms)
{
	return (int64_t)(ms * 1e6);
}

/* Ollama's object for a piece or the end: model, created_at, message or
 * response, done. */
static json_t *ollama_obj(const struct render_ctx *c, const char *text, size_t len, bool done)
{
	char t[48];
	render_time(t, sizeof(t));
	json_t *o = json_pack("{s:s,s:s}", "model", c->model, "created_at", t);
	if (!o)
		return NULL;
	if (c->kind == API_OLLAMA_CHAT)
		json_object_set_new(o, "message",
				    json_pack("{s:s,s:o}", "role", "assistant", "content", str_n(text, len)));
	else
		json_object_set_new(o, "response", str_n(text, len));
	json_object_set_new(o, "done", json_boolean(done));
	return o;
}

static void ollama_counts(json_t *o, const struct render_done *d)
{
	json_object_set_new(o, "done_reason", json_string(d->reason == 2 || d->reason == 4 ? "length" : "stop"));
	json_object_set_new(o, "total_duration", json_integer(ns(d->total_ms)));
	json_object_set_new(o, "load_duration", json_integer(0));
	json_object_set_new(o, "prompt_eval_count", json_integer(d->prompt_tokens));
	json_object_set_new(o, "prompt_eval_duration", json_integer(ns(d->prefill_ms)));
	json_object_set_new(o, "eval_count", json_integer(d->completion_tokens));
	json_object_set_new(o, "eval_duration", json_integer(ns(d->generate_ms)));
}

static json_t *usage_obj(const struct render_done *d)
{
	return json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens", (json_int_t)d->prompt_tokens,
			 "completion_tokens", (json_int_t)d->completion_tokens, "total_tokens",
			 (json_int_t)d->prompt_tokens + d->completion_tokens, "prompt_tokens_details",
			 "cached_tokens", (json_int_t)d->cached_tokens);
}

static json_t *openai_head(const struct render_ctx *c, const char *object)
{
	return json_pack("{s:s,s:s,s:I,s:s,s:s}", "id", c->id, "object", object, "created",
			 (json_int_t)c->created, "model", c->model, "system_fingerprint", "llamad");
}

char *render_piece(const struct render_ctx *c, const char *text, size_t len, bool first)
{
	if (!is_openai(c->kind))
		return dump(ollama_obj(c, text, len, false));
	bool chat = c->kind == API_OPENAI_CHAT;
	json_t *o = openai_head(c, chat ? "chat.completion.chunk" : "text_completion");
	if (!o)
		return NULL;
	json_t *ch;
	if (chat) {
		json_t *delta = first ? json_pack("{s:s,s:o}", "role", "assistant", "content", str_n(text, len))
				      : json_pack("{s:o}", "content", str_n(text, len));
		ch = json_pack("{s:i,s:o,s:n,s:n}", "index", 0, "delta", delta, "logprobs", "finish_reason");
	} else {
		ch = json_pack("{s:o,s:i,s:n,s:n}", "text", str_n(text, len), "index", 0, "logprobs",
			       "finish_reason");
	}
	json_object_set_new(o, "choices", json_pack("[o]", ch));
	return dump(o);
}

char *render_stream_end(const struct render_ctx *c, const struct render_done *d,
			bool usage, char **usage_out)
{
	*usage_out = NULL;
	if (!is_openai(c->kind)) {
		json_t *o = ollama_obj(c, "", 0, true);
		if (o)
			ollama_counts(o, d);
		return dump(o);
	}
	bool chat = c->kind == API_OPENAI_CHAT;
	const char *object = chat ? "chat.completion.chunk" : "text_completion";
	json_t *o = openai_head(c, object);
	if (!o)
		return NULL;
	json_t *ch = chat ? json_pack("{s:i,s:{},s:n,s:s}", "index", 0, "delta", "logprobs", "finish_reason",
				      api_finish_reason(d->reason))
			  : json_pack("{s:s,s:i,s:n,s:s}", "text", "", "index", 0, "logprobs", "finish_reason",
				      api_finish_reason(d->reason));
	json_object_set_new(o, "choices", json_pack("[o]", ch));
	if (usage) {
		json_t *u = openai_head(c, object);
		if (u) {
			json_object_set_new(u, "choices", json_array());
			json_object_set_new(u, "usage", usage_obj(d));
			*usage_out = dump(u);
		}
	}
	return dump(o);
}

char *render_whole(const struct render_ctx *c, const struct render_done *d,
		   const char *text, size_t len)
{
	if (!is_openai(c->kind)) {
		json_t *o = ollama_obj(c, text, len, true);
		if (o)
			ollama_counts(o, d);
		return dump(o);
	}
	bool chat = c->kind == API_OPENAI_CHAT;
	json_t *o = openai_head(c, chat ? "chat.completion" : "text_completion");
	if (!o)
		return NULL;
	json_t *ch = chat ? json_pack("{s:i,s:{s:s,s:o,s:n},s:n,s:s}", "index", 0, "message", "role",
				      "assistant", "content", str_n(text, len), "refusal", "logprobs",
				      "finish_reason", api_finish_reason(d->reason))
			  : json_pack("{s:o,s:i,s:n,s:s}", "text", str_n(text, len), "index", 0,
				      "logprobs", "finish_reason", api_finish_reason(d->reason));
	json_object_set_new(o, "choices", json_pack("[o]", ch));
	json_object_set_new(o, "usage", usage_obj(d));
	return dump(o);
}

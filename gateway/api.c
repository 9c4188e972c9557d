/*
 * gateway/api.c — see api.h. The field rules follow each API's reference:
 * what is not supported yet (n > 1, tools, logprobs, JSON output formats,
 * images, suffixes) is refused with a 400 naming the field rather than
 * silently ignored; fields that change nothing here (user, keep_alive,
 * num_ctx, ...) are accepted.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "gateway/api.h"
#include "llamad.pb-c.h"

struct pctx {
	struct api_req *q;
	char *err;
	size_t errlen;
};

static int bad(struct pctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(struct pctx *c, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(c->err, c->errlen, fmt, ap);
	va_end(ap);
	return 400;
}

void api_req_free(struct api_req *q)
{
	free(q->model);
	free(q->system);
	for (size_t i = 0; i < q->n_msgs; i++)
		free(q->msgs[i].text);
	free(q->msgs);
	free(q->prompt);
	for (size_t i = 0; i < q->n_stop; i++)
		free(q->stop[i]);
	memset(q, 0, sizeof(*q));
}

char *api_norm(const char *s, size_t *len)
{
	size_t n = strlen(s);
	size_t a = 0;
	while (a < n && (s[a] == ' ' || s[a] == '\t' || s[a] == '\n' || s[a] == '\r'))
		a++;
	while (n > a && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r'))
		n--;
	char *o = strndup(s + a, n - a);
	if (o && len)
		*len = n - a;
	return o;
}

const char *api_finish_reason(int r)
{
	switch (r) {
	case LLAMAD__STOP_REASON__STOP_MAX_TOKENS:
	case LLAMAD__STOP_REASON__STOP_CONTEXT_FULL:
		return "length";
	default:
		return "stop";
	}
}

/* ---- field readers ------------------------------------------------------- */

/* The string at key (NULL if absent or null). 400 if another type or not
 * UTF-8 (jansson checks that on load). */
static int get_str(struct pctx *c, json_t *o, const char *key, const char **out)
{
	json_t *v = json_object_get(o, key);
	*out = NULL;
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_string(v))
		return bad(c, "'%s' must be a string", key);
	*out = json_string_value(v);
	if (strlen(*out) != json_string_length(v))
		return bad(c, "'%s' contains a NUL character", key);
	return 0;
}

static int get_num(struct pctx *c, json_t *o, const char *key, double lo, double hi,
		   bool *has, double *out)
{
	json_t *v = json_object_get(o, key);
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_number(v))
		return bad(c, "'%s' must be a number", key);
	double d = json_number_value(v);
	if (!(d >= lo && d <= hi))
		return bad(c, "'%s' must be between %.15g and %.15g", key, lo, hi);
	*has = true;
	*out = d;
	return 0;
}

static int get_int(struct pctx *c, json_t *o, const char *key, double lo, double hi,
		   bool *has, double *out)
{
	json_t *v = json_object_get(o, key);
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_integer(v) && !(json_is_real(v) && json_real_value(v) == floor(json_real_value(v))))
		return bad(c, "'%s' must be an integer", key);
	return get_num(c, o, key, lo, hi, has, out);
}

static int get_bool(struct pctx *c, json_t *o, const char *key, bool *out)
{
	json_t *v = json_object_get(o, key);
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_boolean(v))
		return bad(c, "'%s' must be true or false", key);
	*out = json_is_true(v);
	return 0;
}

/* A field this gateway does not support yet: refused unless absent, null,
 * or the value that means "off" (ok_false: false; ok_one: 1; empty arrays). */
static int unsupported(struct pctx *c, json_t *o, const char *key, const char *why)
{
	json_t *v = json_object_get(o, key);
	if (!v || json_is_null(v) || json_is_false(v) ||
	    (json_is_array(v) && json_array_size(v) == 0) ||
	    (json_is_string(v) && json_string_length(v) == 0))
		return 0;
	return bad(c, "'%s' is not supported: %s", key, why);
}

static int add_stop(struct pctx *c, const char *key, json_t *v)
{
	if (!json_is_string(v))
		return bad(c, "'%s' must be a string or an array of strings", key);
	if (json_string_length(v) == 0)
		return 0;
	if (c->q->n_stop == API_MAX_STOP)
		return bad(c, "'%s' holds more than %d strings", key, API_MAX_STOP);
	if (strlen(json_string_value(v)) != json_string_length(v))
		return bad(c, "'%s' contains a NUL character", key);
	char *s = strdup(json_string_value(v));
	if (!s)
		return 500;
	c->q->stop[c->q->n_stop++] = s;
	return 0;
}

static int get_stop(struct pctx *c, json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);
	if (!v || json_is_null(v))
		return 0;
	if (json_is_array(v)) {
		size_t i;
		json_t *e;
		json_array_foreach(v, i, e) {
			int rc = add_stop(c, key, e);
			if (rc)
				return rc;
		}
		return 0;
	}
	return add_stop(c, key, v);
}

/* ---- the sampler: OpenAI's top-level fields, Ollama's options ----------- */

static int openai_sampler(struct pctx *c, json_t *o)
{
	struct api_req *q = c->q;
	double d;
	bool h = false;
	int rc;
	if ((rc = get_int(c, o, "max_completion_tokens", 1, 1 << 30, &h, &d)))
		return rc;
	if (!h && (rc = get_int(c, o, "max_tokens", 1, 1 << 30, &h, &d)))
		return rc;
	if (h) {
		q->has_max_tokens = true;
		q->max_tokens = (uint32_t)d;
	}
	if ((rc = get_num(c, o, "temperature", 0, 2, &q->has_temperature, &d)))
		return rc;
	q->temperature = (float)d;
	if ((rc = get_num(c, o, "top_p", 0, 1, &q->has_top_p, &d)))
		return rc;
	q->top_p = d > 0 ? (float)d : 1e-6f;
	if ((rc = get_int(c, o, "seed", -9.2e18, 1.8e19, &q->has_seed, &d)))
		return rc;
	q->seed = d < 0 ? (uint64_t)(int64_t)d : (uint64_t)d;
	if ((rc = get_num(c, o, "presence_penalty", -2, 2, &q->has_presence, &d)))
		return rc;
	q->presence = (float)d;
	if ((rc = get_num(c, o, "frequency_penalty", -2, 2, &q->has_frequency, &d)))
		return rc;
	q->frequency = (float)d;
	if ((rc = get_stop(c, o, "stop")))
		return rc;
	bool one = false;
	if ((rc = get_int(c, o, "n", 1, 1 << 20, &one, &d)))
		return rc;
	if (one && d != 1)
		return bad(c, "'n' must be 1: one choice per request is supported");
	if ((rc = unsupported(c, o, "logprobs", "token log-probabilities are not returned")) ||
	    (rc = unsupported(c, o, "top_logprobs", "token log-probabilities are not returned")) ||
	    (rc = unsupported(c, o, "logit_bias", "logit biases are not applied")) ||
	    (rc = unsupported(c, o, "tools", "tool calls are not supported")) ||
	    (rc = unsupported(c, o, "functions", "function calls are not supported")))
		return rc;
	/* with no tools (they are refused above), "none" and "auto" both mean
	 * an answer without a tool call: what is given anyway */
	json_t *tc = json_object_get(o, "tool_choice");
	if (tc && !json_is_null(tc) &&
	    !(json_is_string(tc) && (!strcmp(json_string_value(tc), "none") ||
				     !strcmp(json_string_value(tc), "auto"))))
		return bad(c, "'tool_choice' is not supported: tool calls are not supported "
			   "(send \"none\" or \"auto\", or leave it out)");
	json_t *rf = json_object_get(o, "response_format");
	if (rf && !json_is_null(rf)) {
		json_t *t = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
		if (!t || !json_is_string(t) || strcmp(json_string_value(t), "text"))
			return bad(c, "'response_format' is not supported: only {\"type\": \"text\"}");
	}
	json_t *so = json_object_get(o, "stream_options");
	if (so && !json_is_null(so)) {
		if (!json_is_object(so))
			return bad(c, "'stream_options' must be an object");
		struct pctx c2 = *c;
		if ((rc = get_bool(&c2, so, "include_usage", &q->include_usage)))
			return bad(c, "'stream_options.include_usage' must be true or false");
	}
	return 0;
}

static int ollama_options(struct pctx *c, json_t *o)
{
	json_t *opt = json_object_get(o, "options");
	if (!opt || json_is_null(opt))
		return 0;
	if (!json_is_object(opt))
		return bad(c, "'options' must be an object");
	struct api_req *q = c->q;
	double d;
	bool h = false;
	int rc;
	if ((rc = get_int(c, opt, "num_predict", -2, 1 << 30, &h, &d)))
		return rc;
	if (h && d >= 1) {  /* 0, -1, -2: no limit of its own, as Ollama takes them */
		q->has_max_tokens = true;
		q->max_tokens = (uint32_t)d;
	}
	if ((rc = get_num(c, opt, "temperature", 0, 100, &q->has_temperature, &d)))
		return rc;
	q->temperature = (float)d;
	if ((rc = get_num(c, opt, "top_p", 0, 1, &q->has_top_p, &d)))
		return rc;
	q->top_p = d > 0 ? (float)d : 1e-6f;
	if ((rc = get_int(c, opt, "top_k", 0, 1 << 30, &q->has_top_k, &d)))
		return rc;
	q->top_k = (int32_t)d;
	if ((rc = get_num(c, opt, "min_p", 0, 0.999, &q->has_min_p, &d)))
		return rc;
	q->min_p = (float)d;
	if ((rc = get_int(c, opt, "seed", -9.2e18, 1.8e19, &q->has_seed, &d)))
		return rc;
	q->seed = d < 0 ? (uint64_t)(int64_t)d : (uint64_t)d;
	/* 0 is what litellm sends for "no penalty" (its frequency_penalty 0):
	 * taken as 1, the penalty that changes nothing */
	if ((rc = get_num(c, opt, "repeat_penalty", 0, 10, &q->has_repeat_penalty, &d)))
		return rc;
	if (q->has_repeat_penalty && d > 0 && d < 1e-3)
		return bad(c, "'options.repeat_penalty' must be 0 (off), or between 0.001 and 10");
	q->repeat_penalty = d == 0 ? 1.0f : (float)d;
	if ((rc = get_int(c, opt, "repeat_last_n", -1, 1 << 30, &q->has_repeat_last_n, &d)))
		return rc;
	q->repeat_last_n = (int32_t)d;
	if ((rc = get_num(c, opt, "presence_penalty", -10, 10, &q->has_presence, &d)))
		return rc;
	q->presence = (float)d;
	if ((rc = get_num(c, opt, "frequency_penalty", -10, 10, &q->has_frequency, &d)))
		return rc;
	q->frequency = (float)d;
	return get_stop(c, opt, "stop");
}

/* ---- messages ------------------------------------------------------------ */

static int role_of(const char *s)
{
	if (!strcmp(s, "user"))
		return LLAMAD__ROLE__ROLE_USER;
	if (!strcmp(s, "assistant"))
		return LLAMAD__ROLE__ROLE_ASSISTANT;
	if (!strcmp(s, "system") || !strcmp(s, "developer"))
		return LLAMAD__ROLE__ROLE_SYSTEM;
	return -1;
}

/* A message's content: a string, or (OpenAI) an array of text parts. */
static int content_text(struct pctx *c, json_t *m, size_t i, char **out)
{
	json_t *v = json_object_get(m, "content");
	*out = NULL;
	json_t *r = json_object_get(m, "role");
	if (v && json_is_null(v) && r && json_is_string(r) &&
	    !strcmp(json_string_value(r), "assistant")) {
		/* OpenAI's form of an assistant turn with no text */
		*out = strdup("");
		return *out ? 0 : 500;
	}
	if (!v || json_is_null(v))
		return bad(c, "'messages[%zu].content' is missing", i);
	if (json_is_string(v)) {
		if (strlen(json_string_value(v)) != json_string_length(v))
			return bad(c, "'messages[%zu].content' contains a NUL character", i);
		*out = strdup(json_string_value(v));
		return *out ? 0 : 500;
	}
	if (!json_is_array(v) || c->q->kind != API_OPENAI_CHAT)
		return bad(c, "'messages[%zu].content' must be a string", i);
	size_t total = 0, k;
	json_t *p;
	json_array_foreach(v, k, p) {
		json_t *t = json_is_object(p) ? json_object_get(p, "type") : NULL;
		json_t *x = json_is_object(p) ? json_object_get(p, "text") : NULL;
		if (!t || !json_is_string(t))
			return bad(c, "'messages[%zu].content[%zu].type' must be a string", i, k);
		if (strcmp(json_string_value(t), "text"))
			return bad(c, "'messages[%zu].content[%zu].type' \"%s\" is not supported: only text parts",
				   i, k, json_string_value(t));
		if (!x || !json_is_string(x) || strlen(json_string_value(x)) != json_string_length(x))
			return bad(c, "'messages[%zu].content[%zu].text' must be a string", i, k);
		total += json_string_length(x);
	}
	char *s = malloc(total + 1);
	if (!s)
		return 500;
	size_t at = 0;
	json_array_foreach(v, k, p) {
		json_t *x = json_object_get(p, "text");
		memcpy(s + at, json_string_value(x), json_string_length(x));
		at += json_string_length(x);
	}
	s[at] = 0;
	*out = s;
	return 0;
}

/* Append text to *sys (system messages before the first other message
 * make the session's system prompt, joined by a blank line). */
static int join_system(char **sys, const char *text)
{
	if (!*sys) {
		*sys = strdup(text);
		return *sys ? 0 : 500;
	}
	size_t a = strlen(*sys), b = strlen(text);
	char *n = realloc(*sys, a + b + 3);
	if (!n)
		return 500;
	memcpy(n + a, "\n\n", 2);
	memcpy(n + a + 2, text, b + 1);
	*sys = n;
	return 0;
}

static int parse_messages(struct pctx *c, json_t *o)
{
	struct api_req *q = c->q;
	json_t *ms = json_object_get(o, "messages");
	if (!ms || json_is_null(ms))
		return bad(c, "'messages' is missing");
	if (!json_is_array(ms))
		return bad(c, "'messages' must be an array");
	size_t n = json_array_size(ms);
	if (n == 0 && q->kind == API_OPENAI_CHAT)
		return bad(c, "'messages' is empty");
	q->msgs = calloc(n ? n : 1, sizeof(*q->msgs));
	if (!q->msgs)
		return 500;
	size_t i;
	json_t *m;
	json_array_foreach(ms, i, m) {
		if (!json_is_object(m))
			return bad(c, "'messages[%zu]' must be an object", i);
		json_t *r = json_object_get(m, "role");
		if (!r || !json_is_string(r))
			return bad(c, "'messages[%zu].role' must be a string", i);
		int role = role_of(json_string_value(r));
		if (role < 0)
			return bad(c, "'messages[%zu].role' \"%s\" is not one of system, developer, user, assistant",
				   i, json_string_value(r));
		if (json_object_get(m, "tool_calls") && !json_is_null(json_object_get(m, "tool_calls")))
			return bad(c, "'messages[%zu].tool_calls' is not supported: tool calls are not supported", i);
		json_t *img = json_object_get(m, "images");
		if (img && !json_is_null(img) && !(json_is_array(img) && json_array_size(img) == 0))
			return bad(c, "'messages[%zu].images' is not supported: the model reads text only", i);
		char *text;
		int rc = content_text(c, m, i, &text);
		if (rc)
			return rc;
		if (role == LLAMAD__ROLE__ROLE_SYSTEM && q->n_msgs == 0) {
			rc = join_system(&q->system, text);
			free(text);
			if (rc)
				return rc;
			continue;
		}
		q->msgs[q->n_msgs].role = role;
		q->msgs[q->n_msgs].text = text;
		q->n_msgs++;
	}
	if (q->kind == API_OPENAI_CHAT && q->n_msgs == 0)
		return bad(c, "'messages' holds no user or assistant message");
	return 0;
}

/* A raw prompt: OpenAI's string or array of one string. */
static int parse_prompt(struct pctx *c, json_t *o, bool required)
{
	json_t *v = json_object_get(o, "prompt");
	if (v && json_is_array(v)) {
		if (json_array_size(v) != 1)
			return bad(c, "'prompt' must be a string (an array of one string at most)");
		v = json_array_get(v, 0);
	}
	if (!v || json_is_null(v)) {
		if (required)
			return bad(c, "'prompt' is missing");
		v = NULL;
	} else if (!json_is_string(v)) {
		return bad(c, "'prompt' must be a string");
	} else if (strlen(json_string_value(v)) != json_string_length(v)) {
		return bad(c, "'prompt' contains a NUL character");
	}
	c->q->prompt = strdup(v ? json_string_value(v) : "");
	return c->q->prompt ? 0 : 500;
}

static int parse_body(struct pctx *c, json_t *o)
{
	struct api_req *q = c->q;
	const char *model;
	int rc = get_str(c, o, "model", &model);
	if (rc)
		return rc;
	if (!model || !*model)
		return bad(c, "'model' is missing");
	if (!(q->model = strdup(model)))
		return 500;
	switch (q->kind) {
	case API_OPENAI_CHAT:
		q->chat = true;
		if ((rc = get_bool(c, o, "stream", &q->stream)) || (rc = openai_sampler(c, o)))
			return rc;
		return parse_messages(c, o);
	case API_OPENAI_COMPLETE:
		q->has_max_tokens = true;  /* OpenAI's default for completions */
		q->max_tokens = 16;
		if ((rc = get_bool(c, o, "stream", &q->stream)) || (rc = openai_sampler(c, o)) ||
		    (rc = unsupported(c, o, "echo", "the prompt is not echoed")) ||
		    (rc = unsupported(c, o, "suffix", "insertion is not supported")))
			return rc;
		bool h = false;
		double d;
		if ((rc = get_int(c, o, "best_of", 1, 1 << 20, &h, &d)))
			return rc;
		if (h && d != 1)
			return bad(c, "'best_of' must be 1");
		return parse_prompt(c, o, true);
	case API_OLLAMA_CHAT:
		q->chat = true;
		q->stream = true;  /* Ollama streams unless told not to */
		if ((rc = get_bool(c, o, "stream", &q->stream)) || (rc = ollama_options(c, o)) ||
		    (rc = unsupported(c, o, "tools", "tool calls are not supported")) ||
		    (rc = unsupported(c, o, "format", "structured outputs are not supported")))
			return rc;
		return parse_messages(c, o);
	case API_OLLAMA_GENERATE: {
		q->stream = true;
		bool raw = false;
		if ((rc = get_bool(c, o, "stream", &q->stream)) || (rc = ollama_options(c, o)) ||
		    (rc = get_bool(c, o, "raw", &raw)) ||
		    (rc = unsupported(c, o, "format", "structured outputs are not supported")) ||
		    (rc = unsupported(c, o, "suffix", "insertion is not supported")) ||
		    (rc = unsupported(c, o, "images", "the model reads text only")) ||
		    (rc = unsupported(c, o, "context", "send the conversation to /api/chat instead")))
			return rc;
		const char *sys, *tmpl;
		if ((rc = get_str(c, o, "system", &sys)) || (rc = get_str(c, o, "template", &tmpl)))
			return rc;
		if (tmpl && *tmpl)
			return bad(c, "'template' is not supported: llamad applies the model's chat template");
		if ((rc = parse_prompt(c, o, false)))
			return rc;
		if (raw)
			return 0;
		/* not raw: the prompt is one user turn of a chat */
		q->chat = true;
		if (sys && *sys && !(q->system = strdup(sys)))
			return 500;
		if (!*q->prompt) {
			/* Ollama: an empty prompt only loads the model */
			free(q->prompt);
			q->prompt = NULL;
			return 0;
		}
		q->msgs = calloc(1, sizeof(*q->msgs));
		if (!q->msgs)
			return 500;
		q->msgs[0].role = LLAMAD__ROLE__ROLE_USER;
		q->msgs[0].text = q->prompt;
		q->prompt = NULL;
		q->n_msgs = 1;
		return 0;
	}
	}
	return 500;
}

int api_parse(enum api_kind kind, const char *body, size_t len, struct api_req *q,
	      char *err, size_t errlen)
{
	memset(q, 0, sizeof(*q));
	q->kind = kind;
	struct pctx c = { q, err, errlen };
	json_error_t je;
	json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
	int rc;
	if (!o)
		rc = bad(&c, "the body is not JSON: %s (at byte %d)", je.text, je.position);
	else if (!json_is_object(o))
		rc = bad(&c, "the body must be a JSON object");
	else
		rc = parse_body(&c, o);
	if (rc == 500)
		snprintf(err, errlen, "out of memory");
	json_decref(o);
	if (rc)
		api_req_free(q);
	return rc;
}

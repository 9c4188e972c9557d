/*
 * tests/fuzz/fuzz_http.c — llamad-http's request parsing and answers
 * without sockets. The first byte picks the API (chat completions,
 * completions, Ollama chat, Ollama generate); the rest is the body. A
 * refused body must carry a message and give 400 (500 only for ENOMEM);
 * an accepted one must be whole (model, roles, texts, at most 16 stop
 * strings), its conversation chain computable, and every answer made
 * from its texts must be JSON that gives the texts back exactly.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "gateway/api.h"
#include "gateway/conv.h"
#include "gateway/render.h"
#include "llamad.pb-c.h"

/* s must parse as JSON; the string at key (and under sub) equals text. */
static void check(char *s, const char *key, const char *sub, const char *text)
{
	if (!s)
		return;  /* ENOMEM */
	json_error_t e;
	json_t *o = json_loads(s, 0, &e);
	if (!o)
		abort();
	json_t *v = json_object_get(o, key);
	if (sub) {
		if (json_is_array(v))
			v = json_object_get(json_array_get(v, 0), sub);
		else
			v = json_object_get(v, sub);
		if (v && json_is_object(v))
			v = json_object_get(v, "content");
	}
	if (text && (!v || !json_is_string(v) || strcmp(json_string_value(v), text)))
		abort();
	json_decref(o);
	free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	enum api_kind k = (enum api_kind)(data[0] % 4);
	struct api_req q;
	char err[512];
	err[0] = 0;
	int st = api_parse(k, (const char *)data + 1, size - 1, &q, err, sizeof(err));
	if (st) {
		if ((st != 400 && st != 500) || !err[0])
			abort();
		check(render_error(k, st, err), "error", NULL, NULL);
		return 0;
	}
	if (!q.model || !*q.model || q.n_stop > API_MAX_STOP)
		abort();
	for (size_t i = 0; i < q.n_stop; i++)
		if (!q.stop[i] || !*q.stop[i])
			abort();
	if (q.chat == (q.prompt != NULL))
		abort();  /* a chat has messages, a raw request a prompt */
	uint64_t *c = malloc((q.n_msgs + 1) * sizeof(*c));
	if (!c)
		abort();
	conv_chain(q.model, q.system, q.msgs, q.n_msgs, c);
	for (size_t i = 0; i < q.n_msgs; i++) {
		if (!q.msgs[i].text || c[i + 1] == 0)
			abort();
		int r = q.msgs[i].role;
		if (r != LLAMAD__ROLE__ROLE_USER && r != LLAMAD__ROLE__ROLE_ASSISTANT &&
		    r != LLAMAD__ROLE__ROLE_SYSTEM)
			abort();
	}
	free(c);
	/* answers made of the request's own texts */
	const char *t = q.n_msgs ? q.msgs[q.n_msgs - 1].text : q.prompt ? q.prompt : "";
	struct render_ctx rc = { k, "id", 1, q.model };
	struct render_done d = { LLAMAD__STOP_REASON__STOP_EOS, 3, 1, 2, 1, 1, 1 };
	bool openai = k == API_OPENAI_CHAT || k == API_OPENAI_COMPLETE;
	const char *key = openai ? "choices" : k == API_OLLAMA_CHAT ? "message" : "response";
	const char *piece_sub = openai ? (k == API_OPENAI_CHAT ? "delta" : "text") : k == API_OLLAMA_CHAT ? "content" : NULL;
	const char *whole_sub = openai ? (k == API_OPENAI_CHAT ? "message" : "text") : k == API_OLLAMA_CHAT ? "content" : NULL;
	check(render_piece(&rc, t, strlen(t), true), key, piece_sub, t);
	check(render_whole(&rc, &d, t, strlen(t)), key, whole_sub, t);
	char *usage = NULL;
	check(render_stream_end(&rc, &d, q.include_usage, &usage), "model", NULL, q.model);
	check(usage, "model", NULL, q.model);
	api_req_free(&q);
	return 0;
}

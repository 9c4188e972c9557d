/*
 * tests/unit/test_gateway.c — llamad-http's pure parts: request bodies
 * parsed (gateway/api.c: fields, defaults, refusals naming the field),
 * the conversation index (gateway/conv.c: which session continues a
 * resent conversation), and the answers' JSON shapes (gateway/render.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "gateway/api.h"
#include "gateway/conv.h"
#include "gateway/render.h"
#include "llamad.pb-c.h"

static int parse(enum api_kind k, const char *body, struct api_req *q, char *err)
{
	return api_parse(k, body, strlen(body), q, err, 256);
}

/* The body is refused with 400 and a message containing want. */
static void refused(enum api_kind k, const char *body, const char *want)
{
	struct api_req q;
	char err[256] = "";
	int st = parse(k, body, &q, err);
	if (st != 400 || !strstr(err, want))
		fail_msg("%s: got %d \"%s\", want 400 naming \"%s\"", body, st, err, want);
}

static void test_openai_chat(void **state)
{
	(void)state;
	struct api_req q;
	char err[256];
	assert_int_equal(parse(API_OPENAI_CHAT,
			       "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
			       "{\"role\":\"developer\",\"content\":\"No lists.\"},"
			       "{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":\"Hello\"},"
			       "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"How \"},{\"type\":\"text\",\"text\":\"are you?\"}]}],"
			       "\"max_tokens\":7,\"temperature\":0.5,\"top_p\":0.9,\"seed\":42,\"stop\":[\"x\",\"y\"],"
			       "\"presence_penalty\":0.1,\"frequency_penalty\":-0.2,\"stream\":true,"
			       "\"stream_options\":{\"include_usage\":true},\"n\":1,\"user\":\"u\",\"tool_choice\":\"none\"}",
			       &q, err), 0);
	assert_string_equal(q.model, "m");
	assert_true(q.chat && q.stream && q.include_usage);
	assert_string_equal(q.system, "Be brief.\n\nNo lists.");   /* leading system messages join */
	assert_int_equal(q.n_msgs, 3);
	assert_int_equal(q.msgs[0].role, LLAMAD__ROLE__ROLE_USER);
	assert_int_equal(q.msgs[1].role, LLAMAD__ROLE__ROLE_ASSISTANT);
	assert_string_equal(q.msgs[2].text, "How are you?");
	assert_true(q.has_max_tokens && q.max_tokens == 7);
	assert_true(q.has_temperature && q.temperature == 0.5f);
	assert_true(q.has_top_p && q.top_p > 0.89f && q.top_p < 0.91f);
	assert_true(q.has_seed && q.seed == 42);
	assert_true(q.has_presence && q.has_frequency && q.frequency < 0);
	assert_int_equal(q.n_stop, 2);
	assert_string_equal(q.stop[1], "y");
	assert_false(q.has_top_k);
	api_req_free(&q);

	/* max_completion_tokens wins over max_tokens; a later system message is a turn */
	assert_int_equal(parse(API_OPENAI_CHAT,
			       "{\"model\":\"m\",\"max_tokens\":9,\"max_completion_tokens\":3,\"stop\":\"s\","
			       "\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"system\",\"content\":\"b\"}]}",
			       &q, err), 0);
	assert_int_equal(q.max_tokens, 3);
	assert_null(q.system);
	assert_int_equal(q.n_msgs, 2);
	assert_int_equal(q.msgs[1].role, LLAMAD__ROLE__ROLE_SYSTEM);
	assert_int_equal(q.n_stop, 1);
	assert_false(q.stream);
	api_req_free(&q);
}

static void test_openai_refusals(void **state)
{
	(void)state;
	const enum api_kind C = API_OPENAI_CHAT;
	refused(C, "", "not JSON");
	refused(C, "[1]", "JSON object");
	refused(C, "{\"model\":\"m\",\"model\":\"n\",\"messages\":[]}", "not JSON");  /* duplicate key */
	refused(C, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}", "'model' is missing");
	refused(C, "{\"model\":3,\"messages\":[]}", "'model' must be a string");
	refused(C, "{\"model\":\"m\"}", "'messages' is missing");
	refused(C, "{\"model\":\"m\",\"messages\":{}}", "'messages' must be an array");
	refused(C, "{\"model\":\"m\",\"messages\":[]}", "'messages' is empty");
	refused(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"}]}", "no user or assistant");
	refused(C, "{\"model\":\"m\",\"messages\":[1]}", "'messages[0]' must be an object");
	refused(C, "{\"model\":\"m\",\"messages\":[{\"content\":\"a\"}]}", "'messages[0].role'");
	refused(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"tool\",\"content\":\"a\"}]}", "\"tool\" is not one of");
	refused(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\"}]}", "'messages[0].content' is missing");
	refused(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}", "NUL");
	refused(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}",
		"only text parts");
	refused(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"temperature\":\"hot\"}",
		"'temperature' must be a number");
	refused(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"temperature\":3}",
		"'temperature' must be between 0 and 2");
	refused(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"max_tokens\":0}",
		"'max_tokens' must be between 1 and 1073741824");
	refused(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"max_tokens\":1.5}",
		"'max_tokens' must be an integer");
	refused(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"stream\":1}",
		"'stream' must be true or false");
	refused(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"n\":2}", "'n' must be 1");
	refused(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"tools\":[{}]}", "'tools'");
	refused(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"logprobs\":true}", "'logprobs'");
	refused(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"response_format\":{\"type\":\"json_object\"}}",
		"'response_format'");
	refused(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"tool_choice\":\"required\"}",
		"send \"none\" or \"auto\"");
	refused(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":null}]}",
		"'messages[0].content' is missing");
	refused(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"stop\":[1]}", "'stop'");
	refused(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
		   "\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\",\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]}",
		"more than 16");
	refused(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"stream_options\":{\"include_usage\":3}}",
		"'stream_options.include_usage'");
	/* accepted "off" values of unsupported fields */
	struct api_req q;
	char err[256];
	assert_int_equal(parse(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
			       "\"tools\":[],\"logprobs\":false,\"response_format\":{\"type\":\"text\"},\"n\":1}",
			       &q, err), 0);
	api_req_free(&q);
	/* tool_choice "auto" without tools: an answer without tool calls */
	assert_int_equal(parse(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
			       "\"tool_choice\":\"auto\"}", &q, err), 0);
	api_req_free(&q);
	/* an assistant turn with content null (OpenAI's form): an empty turn */
	assert_int_equal(parse(C, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
			       "{\"role\":\"assistant\",\"content\":null},{\"role\":\"user\",\"content\":\"b\"}]}",
			       &q, err), 0);
	assert_int_equal(q.n_msgs, 3);
	assert_string_equal(q.msgs[1].text, "");
	api_req_free(&q);
}

static void test_completions_and_ollama(void **state)
{
	(void)state;
	struct api_req q;
	char err[256];
	assert_int_equal(parse(API_OPENAI_COMPLETE, "{\"model\":\"m\",\"prompt\":[\"Once\"]}", &q, err), 0);
	assert_false(q.chat);
	assert_string_equal(q.prompt, "Once");
	assert_true(q.has_max_tokens && q.max_tokens == 16);   /* OpenAI's default */
	api_req_free(&q);
	refused(API_OPENAI_COMPLETE, "{\"model\":\"m\"}", "'prompt' is missing");
	refused(API_OPENAI_COMPLETE, "{\"model\":\"m\",\"prompt\":[\"a\",\"b\"]}", "'prompt'");
	refused(API_OPENAI_COMPLETE, "{\"model\":\"m\",\"prompt\":\"a\",\"echo\":true}", "'echo'");
	refused(API_OPENAI_COMPLETE, "{\"model\":\"m\",\"prompt\":\"a\",\"best_of\":3}", "'best_of'");

	/* Ollama streams by default; options map onto the sampler */
	assert_int_equal(parse(API_OLLAMA_CHAT,
			       "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\",\"images\":[]}],"
			       "\"keep_alive\":\"5m\",\"options\":{\"num_predict\":5,\"temperature\":0,\"top_k\":3,"
			       "\"min_p\":0.1,\"seed\":7,\"repeat_penalty\":1.1,\"repeat_last_n\":-1,\"stop\":[\"z\"],\"num_ctx\":4096}}",
			       &q, err), 0);
	assert_true(q.stream && q.chat);
	assert_true(q.has_max_tokens && q.max_tokens == 5);
	assert_true(q.has_temperature && q.temperature == 0);
	assert_true(q.has_top_k && q.top_k == 3);
	assert_true(q.has_min_p && q.has_seed && q.seed == 7);
	assert_true(q.has_repeat_last_n && q.repeat_last_n == -1);
	assert_int_equal(q.n_stop, 1);
	api_req_free(&q);
	/* num_predict -1: no limit of the request's own */
	assert_int_equal(parse(API_OLLAMA_CHAT, "{\"model\":\"m\",\"stream\":false,\"messages\":[],\"options\":{\"num_predict\":-1}}",
			       &q, err), 0);
	assert_false(q.stream || q.has_max_tokens);
	assert_int_equal(q.n_msgs, 0);   /* Ollama: no messages loads the model */
	api_req_free(&q);
	/* repeat_penalty 0 (litellm's "no penalty"): the penalty 1, which is off */
	assert_int_equal(parse(API_OLLAMA_CHAT, "{\"model\":\"m\",\"messages\":[],\"options\":{\"repeat_penalty\":0}}",
			       &q, err), 0);
	assert_true(q.has_repeat_penalty && q.repeat_penalty == 1.0f);
	api_req_free(&q);
	refused(API_OLLAMA_CHAT, "{\"model\":\"m\",\"messages\":[],\"options\":{\"repeat_penalty\":0.0001}}",
		"must be 0 (off), or between 0.001 and 10");
	refused(API_OLLAMA_CHAT, "{\"model\":\"m\",\"messages\":[],\"options\":3}", "'options' must be an object");
	refused(API_OLLAMA_CHAT, "{\"model\":\"m\",\"messages\":[],\"format\":\"json\"}", "'format'");
	refused(API_OLLAMA_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\",\"images\":[\"x\"]}]}",
		"'messages[0].images'");
	refused(API_OLLAMA_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[]}]}", "must be a string");

	/* generate: a chat turn unless raw */
	assert_int_equal(parse(API_OLLAMA_GENERATE, "{\"model\":\"m\",\"prompt\":\"p\",\"system\":\"s\"}", &q, err), 0);
	assert_true(q.chat);
	assert_string_equal(q.system, "s");
	assert_int_equal(q.n_msgs, 1);
	assert_string_equal(q.msgs[0].text, "p");
	assert_null(q.prompt);
	api_req_free(&q);
	assert_int_equal(parse(API_OLLAMA_GENERATE, "{\"model\":\"m\",\"prompt\":\"p\",\"raw\":true}", &q, err), 0);
	assert_false(q.chat);
	assert_string_equal(q.prompt, "p");
	api_req_free(&q);
	refused(API_OLLAMA_GENERATE, "{\"model\":\"m\",\"prompt\":\"p\",\"context\":[1,2]}", "'context'");
	refused(API_OLLAMA_GENERATE, "{\"model\":\"m\",\"prompt\":\"p\",\"template\":\"{{.Prompt}}\"}", "'template'");
	/* num_predict 0: as Ollama takes it, no limit of the request's own */
	assert_int_equal(parse(API_OLLAMA_GENERATE, "{\"model\":\"m\",\"prompt\":\"p\",\"options\":{\"num_predict\":0}}",
			       &q, err), 0);
	assert_false(q.has_max_tokens);
	api_req_free(&q);
	refused(API_OLLAMA_GENERATE, "{\"model\":\"m\",\"prompt\":\"p\",\"options\":{\"num_predict\":-3}}", "num_predict");
}

static void test_norm(void **state)
{
	(void)state;
	size_t n;
	char *s = api_norm(" \n\tHello world \r\n", &n);
	assert_string_equal(s, "Hello world");
	assert_int_equal(n, 11);
	free(s);
	s = api_norm("   ", &n);
	assert_string_equal(s, "");
	free(s);
	assert_string_equal(api_finish_reason(LLAMAD__STOP_REASON__STOP_MAX_TOKENS), "length");
	assert_string_equal(api_finish_reason(LLAMAD__STOP_REASON__STOP_CONTEXT_FULL), "length");
	assert_string_equal(api_finish_reason(LLAMAD__STOP_REASON__STOP_EOS), "stop");
	assert_string_equal(api_finish_reason(LLAMAD__STOP_REASON__STOP_STRING), "stop");
}

/* ---- the conversation index ------------------------------------------------ */

#define U LLAMAD__ROLE__ROLE_USER
#define A LLAMAD__ROLE__ROLE_ASSISTANT

static void chain(const char *sys, const struct api_msg *m, size_t n, uint64_t *c)
{
	assert_int_equal(conv_chain("model", sys, m, n, c), 0);
}

static void test_conv_hashes(void **state)
{
	(void)state;
	/* white space at the ends does not matter; roles, text, order,
	 * system and model do */
	assert_true(conv_step(5, U, "hi") == conv_step(5, U, "  hi\n"));
	assert_true(conv_step(5, U, "hi") != conv_step(5, A, "hi"));
	assert_true(conv_step(5, U, "hi") != conv_step(6, U, "hi"));
	assert_true(conv_step(5, U, "hi") != conv_step(5, U, "h i"));
	assert_true(conv_seed("m", NULL) != conv_seed("m", "s"));
	assert_true(conv_seed("m", NULL) != conv_seed("n", NULL));
	assert_true(conv_seed("m", "s") == conv_seed("m", " s "));
	/* the empty system prompt and none differ (different sessions) */
	assert_true(conv_seed("m", "") != conv_seed("m", NULL));
	assert_true(conv_seed("m", NULL) != 0 && conv_step(0, U, "") != 0);
}

static void test_conv_find(void **state)
{
	(void)state;
	struct conv_index x = { 0 };
	struct api_msg m[] = { { U, "hi" }, { A, "hello" }, { U, "more" }, { A, "sure" }, { U, "again" } };
	uint64_t c[6];
	chain(NULL, m, 5, c);

	/* nothing held */
	struct conv_match r = conv_find(&x, 1000, 0, c, 5);
	assert_null(r.s);

	/* s1 holds turns 1-2 (hi, hello): a request of 3 messages continues it as it is */
	struct conv_sess *s1 = conv_add(&x, "s1", 1000, 0, c, 2);
	assert_non_null(s1);
	r = conv_find(&x, 1000, 0, c, 3);
	assert_ptr_equal(r.s, s1);
	assert_int_equal(r.turns, 2);
	assert_true(r.exact);
	/* another uid, another model: not theirs */
	assert_null(conv_find(&x, 1001, 0, c, 3).s);
	assert_null(conv_find(&x, 1000, 1, c, 3).s);
	/* another system prompt: other seed */
	uint64_t c2[6];
	chain("sys", m, 5, c2);
	assert_null(conv_find(&x, 1000, 0, c2, 3).s);

	/* busy: still found, but not exact (fork it) */
	s1->busy = true;
	r = conv_find(&x, 1000, 0, c, 3);
	assert_ptr_equal(r.s, s1);
	assert_false(r.exact);
	s1->busy = false;

	/* s1 grows to 4 turns; an edited 3rd message matches 2 turns, not exact */
	assert_int_equal(conv_set(&x, s1, c, 4), 0);
	struct api_msg e[] = { { U, "hi" }, { A, "hello" }, { U, "edited" } };
	uint64_t ce[4];
	chain(NULL, e, 3, ce);
	r = conv_find(&x, 1000, 0, ce, 3);
	assert_ptr_equal(r.s, s1);
	assert_int_equal(r.turns, 2);
	assert_false(r.exact);

	/* a fork holding exactly 2 turns wins over the longer one for the
	 * edited request: equal match, exact */
	struct conv_sess *s2 = conv_add(&x, "s2", 1000, 0, ce, 2);
	r = conv_find(&x, 1000, 0, ce, 3);
	assert_ptr_equal(r.s, s2);
	assert_true(r.exact);
	/* the longest match wins over an exact shorter one */
	r = conv_find(&x, 1000, 0, c, 5);
	assert_ptr_equal(r.s, s1);
	assert_int_equal(r.turns, 4);
	assert_true(r.exact);

	/* turns a context shift dropped cannot be rewound to */
	s1->dropped = 3;
	r = conv_find(&x, 1000, 0, ce, 3);   /* would need s1 at 2 turns */
	assert_ptr_equal(r.s, s2);
	r = conv_find(&x, 1000, 0, c, 5);    /* s1 at 4 >= 3 still fine */
	assert_ptr_equal(r.s, s1);
	s1->dropped = 0;

	/* an assistant answer resent with other white space still matches */
	struct api_msg w[] = { { U, "hi " }, { A, "\nhello\n\n" }, { U, "more" } };
	uint64_t cw[4];
	chain(NULL, w, 3, cw);
	r = conv_find(&x, 1000, 0, cw, 3);
	assert_int_equal(r.turns, 3);
	/* a cut answer (a prefix of what was generated) does not */
	struct api_msg t[] = { { U, "hi" }, { A, "hell" }, { U, "more" } };
	uint64_t ct[4];
	chain(NULL, t, 3, ct);
	r = conv_find(&x, 1000, 0, ct, 3);
	assert_int_equal(r.turns, 1);

	/* conv_push appends the answer */
	assert_int_equal(conv_push(s2, conv_step(ce[2], A, "ok")), 0);
	assert_int_equal(s2->n, 3);
	assert_ptr_equal(conv_get(&x, "s2"), s2);
	assert_null(conv_get(&x, "nope"));
	conv_free_all(&x);
	assert_int_equal(x.count, 0);
}

static void test_conv_lru(void **state)
{
	(void)state;
	struct conv_index x = { 0 };
	uint64_t c[2] = { 1, 2 };
	struct conv_sess *a = conv_add(&x, "a", 7, 0, c, 1);
	struct conv_sess *b = conv_add(&x, "b", 7, 0, c, 1);
	struct conv_sess *o = conv_add(&x, "o", 8, 0, c, 1);   /* another uid */
	struct conv_sess *d = conv_add(&x, "d", 7, 0, c, 1);
	assert_int_equal(x.count, 4);
	/* uid 7 holds 3: keep 3 -> no victim; keep 2 -> the least recent, a */
	assert_null(conv_victim(&x, 7, 0, 3));
	assert_ptr_equal(conv_victim(&x, 7, 0, 2), a);
	conv_touch(&x, a);
	assert_ptr_equal(conv_victim(&x, 7, 0, 2), b);
	b->busy = true;                      /* never a busy one */
	assert_ptr_equal(conv_victim(&x, 7, 0, 2), d);
	assert_null(conv_victim(&x, 8, 0, 0) == o ? NULL : (void *)1);
	conv_remove(&x, d);
	assert_int_equal(x.count, 3);
	conv_free_all(&x);
}

/* ---- the answers' shapes ----------------------------------------------------- */

static json_t *load(char *s)
{
	assert_non_null(s);
	json_error_t e;
	json_t *o = json_loads(s, 0, &e);
	if (!o)
		fail_msg("not JSON: %s: %s", s, e.text);
	free(s);
	return o;
}

static const char *str_at(json_t *o, const char *path)
{
	/* dotted path with numeric indexes: choices.0.delta.content */
	char buf[128];
	snprintf(buf, sizeof(buf), "%s", path);
	json_t *v = o;
	for (char *k = strtok(buf, "."); k && v; k = strtok(NULL, "."))
		v = (*k >= '0' && *k <= '9') ? json_array_get(v, (size_t)atoi(k)) : json_object_get(v, k);
	return v && json_is_string(v) ? json_string_value(v) : NULL;
}

static json_int_t int_at(json_t *o, const char *a, const char *b)
{
	json_t *v = json_object_get(json_object_get(o, a), b);
	assert_true(json_is_integer(v));
	return json_integer_value(v);
}

static void test_render(void **state)
{
	(void)state;
	struct render_ctx c = { API_OPENAI_CHAT, "chatcmpl-1", 100, "m" };
	struct render_done d = { LLAMAD__STOP_REASON__STOP_MAX_TOKENS, 20, 15, 5, 10, 2, 8 };
	json_t *o = load(render_piece(&c, "a\"b\n\xc3\xa9", 6, true));
	assert_string_equal(str_at(o, "object"), "chat.completion.chunk");
	assert_string_equal(str_at(o, "choices.0.delta.role"), "assistant");
	assert_string_equal(str_at(o, "choices.0.delta.content"), "a\"b\n\xc3\xa9");
	json_decref(o);
	o = load(render_piece(&c, "x", 1, false));
	assert_null(str_at(o, "choices.0.delta.role"));
	json_decref(o);
	char *usage;
	o = load(render_stream_end(&c, &d, true, &usage));
	assert_string_equal(str_at(o, "choices.0.finish_reason"), "length");
	json_decref(o);
	o = load(usage);
	assert_int_equal(json_array_size(json_object_get(o, "choices")), 0);
	assert_int_equal(int_at(o, "usage", "prompt_tokens"), 20);
	assert_int_equal(int_at(o, "usage", "completion_tokens"), 5);
	assert_int_equal(int_at(o, "usage", "total_tokens"), 25);
	json_decref(o);
	o = load(render_stream_end(&c, &d, false, &usage));
	assert_null(usage);
	json_decref(o);
	o = load(render_whole(&c, &d, "hello", 5));
	assert_string_equal(str_at(o, "object"), "chat.completion");
	assert_string_equal(str_at(o, "choices.0.message.content"), "hello");
	assert_int_equal(json_integer_value(json_object_get(json_object_get(json_object_get(o, "usage"),
		"prompt_tokens_details"), "cached_tokens")), 15);
	json_decref(o);

	c.kind = API_OPENAI_COMPLETE;
	o = load(render_whole(&c, &d, "hi", 2));
	assert_string_equal(str_at(o, "object"), "text_completion");
	assert_string_equal(str_at(o, "choices.0.text"), "hi");
	json_decref(o);

	c.kind = API_OLLAMA_CHAT;
	o = load(render_piece(&c, "p", 1, true));
	assert_string_equal(str_at(o, "message.content"), "p");
	assert_true(json_is_false(json_object_get(o, "done")));
	assert_non_null(str_at(o, "created_at"));
	json_decref(o);
	o = load(render_stream_end(&c, &d, false, &usage));
	assert_true(json_is_true(json_object_get(o, "done")));
	assert_string_equal(str_at(o, "done_reason"), "length");
	assert_int_equal(json_integer_value(json_object_get(o, "eval_count")), 5);
	assert_int_equal(json_integer_value(json_object_get(o, "prompt_eval_count")), 20);
	assert_int_equal(json_integer_value(json_object_get(o, "total_duration")), 10000000);  /* ns */
	assert_int_equal(json_integer_value(json_object_get(o, "eval_duration")), 8000000);
	json_decref(o);
	c.kind = API_OLLAMA_GENERATE;
	o = load(render_whole(&c, &d, "r", 1));
	assert_string_equal(str_at(o, "response"), "r");
	json_decref(o);

	o = load(render_error(API_OPENAI_CHAT, 404, "no \"such\" model"));
	assert_string_equal(str_at(o, "error.message"), "no \"such\" model");
	assert_string_equal(str_at(o, "error.type"), "not_found_error");
	json_decref(o);
	o = load(render_error(API_OLLAMA_CHAT, 400, "bad"));
	assert_string_equal(str_at(o, "error"), "bad");
	json_decref(o);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_openai_chat),
		cmocka_unit_test(test_openai_refusals),
		cmocka_unit_test(test_completions_and_ollama),
		cmocka_unit_test(test_norm),
		cmocka_unit_test(test_conv_hashes),
		cmocka_unit_test(test_conv_find),
		cmocka_unit_test(test_conv_lru),
		cmocka_unit_test(test_render),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}

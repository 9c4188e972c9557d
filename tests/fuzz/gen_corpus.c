/*
 * tests/fuzz/gen_corpus.c — writes the generated seeds of tests/fuzz/corpus/
 * (request frames, a small session file). Run once by hand when the
 * protocol or the session format changes:
 *   make && cc -I. -Ibuild -Ibuild/proto -D_GNU_SOURCE tests/fuzz/gen_corpus.c \
 *     build/libllamad-core.a build/libllamad-proto.a $(pkg-config --libs \
 *     libprotobuf-c libxxhash jansson sentencepiece) -lstdc++ -lm -o /tmp/gen \
 *     && /tmp/gen tests/fuzz/corpus
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/frame.h"
#include "session/store.h"

static void put(const char *dir, const char *name, const Llamad__Request *q)
{
	uint8_t *f;
	size_t n;
	char path[512];
	if (frame_pack(&q->base, &f, &n) != 0)
		abort();
	snprintf(path, sizeof(path), "%s/fuzz_request/%s", dir, name);
	FILE *o = fopen(path, "wb");
	if (!o || fwrite(f, 1, n, o) != n)
		abort();
	fclose(o);
	free(f);
}

int main(int argc, char **argv)
{
	const char *dir = argc > 1 ? argv[1] : "tests/fuzz/corpus";
	Llamad__Request q = LLAMAD__REQUEST__INIT;
	PB_SET(&q, id, 1);

	Llamad__Hello h = LLAMAD__HELLO__INIT;
	PB_SET(&h, protocol_version, 1);
	h.client = "llamactl 0.2";
	q.op_case = LLAMAD__REQUEST__OP_HELLO;
	q.hello = &h;
	put(dir, "hello", &q);

	Llamad__OpenSession o = LLAMAD__OPEN_SESSION__INIT;
	o.session = "chat-1";
	o.system = "You are terse. ✓";
	PB_SET(&o, template_, LLAMAD__TEMPLATE__TEMPLATE_LLAMA2);
	PB_SET(&o, context_policy, LLAMAD__CONTEXT_POLICY__CONTEXT_SHIFT);
	q.op_case = LLAMAD__REQUEST__OP_OPEN;
	q.open = &o;
	put(dir, "open", &q);

	Llamad__Append a = LLAMAD__APPEND__INIT;
	a.session = "chat-1";
	a.text = "Once upon a time 🐉 在很久以前";
	PB_SET(&a, role, LLAMAD__ROLE__ROLE_USER);
	q.op_case = LLAMAD__REQUEST__OP_APPEND;
	q.append = &a;
	put(dir, "append", &q);

	Llamad__SamplerOptions so = LLAMAD__SAMPLER_OPTIONS__INIT;
	PB_SET(&so, temperature, 0.8f);
	PB_SET(&so, top_k, 40);
	PB_SET(&so, seed, 42);
	char *stops[] = { "\n\n", "The end" };
	Llamad__Generate g = LLAMAD__GENERATE__INIT;
	g.session = "chat-1";
	g.prompt = "Tell me a story.";
	PB_SET(&g, max_tokens, 64);
	g.sampler = &so;
	g.n_stop = 2;
	g.stop = stops;
	q.op_case = LLAMAD__REQUEST__OP_GENERATE;
	q.generate = &g;
	put(dir, "generate", &q);

	Llamad__Fork fk = LLAMAD__FORK__INIT;
	fk.session = "chat-1";
	fk.target = "chat-2";
	q.op_case = LLAMAD__REQUEST__OP_FORK;
	q.fork = &fk;
	put(dir, "fork", &q);

	Llamad__Tokenize tk = LLAMAD__TOKENIZE__INIT;
	tk.text = "Hello world";
	PB_SET(&tk, add_bos, 1);
	q.op_case = LLAMAD__REQUEST__OP_TOKENIZE;
	q.tokenize = &tk;
	put(dir, "tokenize", &q);

	uint32_t ids[] = { 1, 403, 407, 261, 2 };
	Llamad__Detokenize dt = LLAMAD__DETOKENIZE__INIT;
	dt.n_tokens = 5;
	dt.tokens = ids;
	q.op_case = LLAMAD__REQUEST__OP_DETOKENIZE;
	q.detokenize = &dt;
	put(dir, "detokenize", &q);

	Llamad__Save sv = LLAMAD__SAVE__INIT;
	PB_SET(&sv, all, 1);
	q.op_case = LLAMAD__REQUEST__OP_SAVE;
	q.save = &sv;
	put(dir, "save", &q);

	/* a session file: 20 tokens, 2 turns, 18 cached (2 blocks of 16) in
	 * the pool shape of fuzz_store.c */
	struct kvpool *pool = kvpool_new(64, 16, 2, 8);
	struct sess_table t;
	if (!pool || sess_table_init(&t, pool) != 0)
		abort();
	struct session *s = sess_create(&t, 1000, "s1");
	int32_t tok[20];
	for (int i = 0; i < 20; i++)
		tok[i] = 1 + i * 7;
	if (!s || sess_append(s, tok, 12, CHAT_USER, "hi ☃", 1) ||
	    sess_append(s, tok + 12, 8, CHAT_ASSISTANT, NULL, 1))
		abort();
	s->system = strdup("be brief");
	s->tmpl = CHAT_TEMPLATE_LLAMA2;
	s->policy = SESS_CTX_SHIFT;
	if (kvseq_prepare(pool, &s->kv, 18, 0) != 0)
		abort();
	s->n_cached = 18;
	char path[512], *cause = NULL;
	snprintf(path, sizeof(path), "%s/fuzz_store", dir);
	if (store_save(path, s, pool, 0x0123456789abcdefULL, &cause) != 0) {
		fprintf(stderr, "%s\n", cause);
		return 1;
	}
	sess_table_done(&t);
	kvpool_free(pool);
	return 0;
}

/*
 * tests/fuzz/gen_corpus.c — writes the generated seeds of tests/fuzz/corpus/
 * (request frames, a small session file, byte-level BPE tokenizer.json files
 * and texts for fuzz_bpe). Run once by hand when the protocol, the session
 * format or fuzz_bpe's input layout changes:
 *   make && cc -I. -Ibuild -Ibuild/proto -D_GNU_SOURCE tests/fuzz/gen_corpus.c \
 *     build/libllamad-core.a build/libllamad-proto.a $(pkg-config --libs \
 *     libprotobuf-c libxxhash jansson sentencepiece libpcre2-8) -lstdc++ -lm -o /tmp/gen \
 *     && /tmp/gen tests/fuzz/corpus
 */
#include <jansson.h>
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

/* fuzz_bpe seed: the mode byte, then n bytes of d, then (when text is not
 * NULL) a NUL and the text. */
static void put_bpe(const char *dir, const char *name, char mode, const char *d, size_t n,
		    const char *text)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/fuzz_bpe/%s", dir, name);
	FILE *o = fopen(path, "wb");
	if (!o || fputc(mode, o) == EOF || fwrite(d, 1, n, o) != n ||
	    (text && (fputc(0, o) == EOF || fputs(text, o) == EOF)))
		abort();
	fclose(o);
}

/* UTF-8 of GPT-2's byte-level code point for byte v (bytes_to_unicode). */
static void byte_level(unsigned v, char out[3])
{
	unsigned cp = v, k = 0;
	if (!((v >= 0x21 && v <= 0x7e) || (v >= 0xa1 && v <= 0xac) || v >= 0xae)) {
		for (unsigned u = 0; u < v; u++)
			k += !((u >= 0x21 && u <= 0x7e) || (u >= 0xa1 && u <= 0xac) || u >= 0xae);
		cp = 0x100 + k;
	}
	if (cp < 0x80) {
		out[0] = (char)cp;
		out[1] = 0;
	} else {
		out[0] = (char)(0xc0 | cp >> 6);
		out[1] = (char)(0x80 | (cp & 0x3f));
		out[2] = 0;
	}
}

/* A small valid byte-level BPE tokenizer.json: the 256 byte tokens, a few
 * merged ones, one special added token. llama3: Llama 3's Split + ByteLevel
 * pre-tokenizer, string merges; else GPT-2's ByteLevel, [left, right] merges. */
static char *mini_tokenizer(int llama3)
{
	static const char *const merges[][3] = {
		{ "h", "e", "he" }, { "l", "l", "ll" }, { "he", "ll", "hell" }, { "hell", "o", "hello" },
		{ "\xc4\xa0", "w", "\xc4\xa0w" }, { "o", "r", "or" }, { "\xc4\xa0w", "or", "\xc4\xa0wor" },
		{ "1", "2", "12" }, { "12", "3", "123" }, { "\xc4\xa0", "\xc4\xa0", "\xc4\xa0\xc4\xa0" },
	};
	json_t *vocab = json_object(), *mg = json_array();
	int id = 0;
	char bl[3];
	for (unsigned v = 0; v < 256; v++) {
		byte_level(v, bl);
		json_object_set_new(vocab, bl, json_integer(id++));
	}
	for (size_t i = 0; i < sizeof merges / sizeof merges[0]; i++) {
		json_object_set_new(vocab, merges[i][2], json_integer(id++));
		char m[32];
		snprintf(m, sizeof m, "%s %s", merges[i][0], merges[i][1]);
		json_array_append_new(mg, llama3 ? json_string(m)
						 : json_pack("[s, s]", merges[i][0], merges[i][1]));
	}
	json_t *pre = llama3
		? json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]}",
			    "type", "Sequence", "pretokenizers", "type", "Split", "pattern", "Regex",
			    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
			    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
			    "behavior", "Isolated", "invert", 0, "type", "ByteLevel",
			    "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0)
		: json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0,
			    "trim_offsets", 1, "use_regex", 1);
	json_t *root = json_pack("{s:[{s:i, s:s, s:b}], s:n, s:o, s:{s:s, s:b, s:b, s:o, s:o}}",
				 "added_tokens", "id", id, "content", "<|eot_id|>", "special", 1,
				 "normalizer", "pre_tokenizer", pre,
				 "model", "type", "BPE", "byte_fallback", 0, "ignore_merges", llama3,
				 "vocab", vocab, "merges", mg);
	if (!root)
		abort();
	char *s = json_dumps(root, JSON_COMPACT);
	json_decref(root);
	if (!s)
		abort();
	return s;
}

static void bpe_seeds(const char *dir)
{
	/* text for the real Llama 3 tokenizer (mode 0) */
	static const char *const texts[][2] = {
		{ "text-hello", "Hello world" },
		{ "text-code", "int main(void)\n{\n\treturn 0;  \n}\n\n" },
		{ "text-numbers", "1 12 123 1234 3.14159 1,000,000" },
		{ "text-contractions", "I'm DON'T you'RE it's He'LL" },
		{ "text-unicode", "\xe6\x88\x91\xe4\xbb\xac \xd0\x9f\xd1\x80\xd0\xb8 "
				  "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9 "
				  "caf\xc3\xa9 \xe0\xb8\xaa\xe0\xb8\xa7" },
		{ "text-spaces", "a \xc2\x85" "b \xef\xbb\xbf" "c \xe1\xa0\x8e d\xc2\xa0\xe3\x80\x80 \t\r\n" },
		{ "text-special", "<|begin_of_text|><|eot_id|>" },
	};
	for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
		put_bpe(dir, texts[i][0], 0, texts[i][1], strlen(texts[i][1]), NULL);
	put_bpe(dir, "text-bad-utf8", 0, "ok\xc3(\xed\xa0\x80", 7, NULL);

	/* tokenizer.json files (mode 1), with and without text after them */
	char *l3 = mini_tokenizer(1), *g2 = mini_tokenizer(0);
	put_bpe(dir, "json-llama3", 1, l3, strlen(l3), "hello world 123 hello\n");
	put_bpe(dir, "json-llama3-notext", 1, l3, strlen(l3), NULL);
	put_bpe(dir, "json-gpt2", 1, g2, strlen(g2), "hello  world's 12345 <|eot_id|>");
	put_bpe(dir, "json-cut", 1, l3, strlen(l3) / 2, NULL);
	free(l3);
	free(g2);
}

int main(int argc, char **argv)
{
	const char *dir = argc > 1 ? argv[1] : "tests/fuzz/corpus";
	bpe_seeds(dir);
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

/*
 * tests/fuzz/gen_corpus.c — writes the generated seeds of tests/fuzz/corpus/
 * (request frames, small session files of versions 2 and 3 — the latter
 * with their block files, in fuzz_store.c's input layout —, a tiny Llama 3
 * style GGUF with a "gpt2" byte-level BPE vocabulary, rope_freqs.weight and
 * tied embeddings, byte-level BPE tokenizer.json files and texts for
 * fuzz_bpe). Run once by
 * hand when the protocol, the session format, the GGUF reader or fuzz_bpe's
 * input layout changes:
 *   make && cc -I. -Ibuild -Ibuild/proto -D_GNU_SOURCE tests/fuzz/gen_corpus.c \
 *     build/libllamad-core.a build/libllamad-text.a build/libllamad-format.a \
 *     build/libllamad-proto.a build/libllamad-util.a $(pkg-config --libs \
 *     libprotobuf-c libxxhash jansson sentencepiece libpcre2-8) -lstdc++ -lm -o /tmp/gen \
 *     && /tmp/gen tests/fuzz/corpus
 * (a build with the CUDA backend adds -L/usr/local/cuda/lib64 -lcudart_static
 * -ldl -lrt). The f32 session of fuzz_store/1000-s1.session keeps whatever
 * its pool's memory held as K/V, so its bytes differ from run to run.
 */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proto/frame.h"
#include "session/blocks.h"
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

/* ---- a tiny GGUF with a gpt2 vocabulary ------------------------------------ */

struct gbuf {
	uint8_t p[32768];
	size_t n;
};

static void gput(struct gbuf *b, const void *d, size_t n)
{
	if (b->n + n > sizeof(b->p))
		abort();
	memcpy(b->p + b->n, d, n);
	b->n += n;
}

static void gle(struct gbuf *b, uint64_t v, int n)
{
	for (int i = 0; i < n; i++) {
		uint8_t x = (uint8_t)(v >> (8 * i));
		gput(b, &x, 1);
	}
}

static void gstr(struct gbuf *b, const char *s, size_t n)
{
	gle(b, n, 8);
	gput(b, s, n);
}

static void gkey(struct gbuf *b, int *nkv, const char *k, uint32_t type)
{
	gstr(b, k, strlen(k));
	gle(b, type, 4);
	++*nkv;
}

static void gkv_u32(struct gbuf *b, int *nkv, const char *k, uint32_t v)
{
	gkey(b, nkv, k, 4);
	gle(b, v, 4);
}

static void gkv_f32(struct gbuf *b, int *nkv, const char *k, float v)
{
	uint32_t u;
	memcpy(&u, &v, 4);
	gkey(b, nkv, k, 6);
	gle(b, u, 4);
}

static void gkv_str(struct gbuf *b, int *nkv, const char *k, const char *v)
{
	gkey(b, nkv, k, 8);
	gstr(b, v, strlen(v));
}

/* The ByteLevel string of byte c (printable ASCII and Latin-1 as
 * themselves, the other bytes U+0100.. in order), UTF-8 into out. */
static size_t byte_piece(int c, char *out)
{
	int keep = (c >= 0x21 && c <= 0x7e) || (c >= 0xa1 && c <= 0xac) || c >= 0xae, cp = c;
	if (!keep) {
		cp = 0x100;
		for (int k = 0; k < c; k++)
			cp += !((k >= 0x21 && k <= 0x7e) || (k >= 0xa1 && k <= 0xac) || k >= 0xae);
	}
	if (cp < 0x80) {
		out[0] = (char)cp;
		return 1;
	}
	out[0] = (char)(0xc0 | cp >> 6);
	out[1] = (char)(0x80 | (cp & 0x3f));
	return 2;
}

/* dim 8, 1 layer, 2 heads / 1 kv head (head_dim 4), ffn 16; vocabulary:
 * the 256 bytes, 3 merges, 3 control tokens (262); F32 tensors with
 * deterministic values; no output.weight (tied). */
static void put_gguf(const char *dir)
{
	enum { D = 8, F = 16, KV = 4, NV = 262 };
	static struct gbuf kv, out;
	int nkv = 0;
	kv.n = out.n = 0;
	gkv_str(&kv, &nkv, "general.architecture", "llama");
	gkv_u32(&kv, &nkv, "general.alignment", 32);
	gkv_u32(&kv, &nkv, "llama.context_length", 131072);
	gkv_u32(&kv, &nkv, "llama.embedding_length", D);
	gkv_u32(&kv, &nkv, "llama.block_count", 1);
	gkv_u32(&kv, &nkv, "llama.feed_forward_length", F);
	gkv_u32(&kv, &nkv, "llama.attention.head_count", 2);
	gkv_u32(&kv, &nkv, "llama.attention.head_count_kv", 1);
	gkv_f32(&kv, &nkv, "llama.rope.freq_base", 500000.0f);
	gkv_f32(&kv, &nkv, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
	gkv_str(&kv, &nkv, "tokenizer.ggml.model", "gpt2");
	gkv_str(&kv, &nkv, "tokenizer.ggml.pre", "llama-bpe");
	static const char *const extra[] = { "\xc4\xa0t", "he", "\xc4\xa0the", "<|begin_of_text|>",
					     "<|end_of_text|>", "<|eot_id|>" };
	gkey(&kv, &nkv, "tokenizer.ggml.tokens", 9);
	gle(&kv, 8, 4);
	gle(&kv, NV, 8);
	for (int c = 0; c < 256; c++) {
		char pc[2];
		gstr(&kv, pc, byte_piece(c, pc));
	}
	for (int i = 0; i < 6; i++)
		gstr(&kv, extra[i], strlen(extra[i]));
	gkey(&kv, &nkv, "tokenizer.ggml.token_type", 9);
	gle(&kv, 5, 4);
	gle(&kv, NV, 8);
	for (int i = 0; i < NV; i++)
		gle(&kv, i >= 259 ? 3 : 1, 4);
	static const char *const merges[] = { "\xc4\xa0 t", "h e", "\xc4\xa0t he" };
	gkey(&kv, &nkv, "tokenizer.ggml.merges", 9);
	gle(&kv, 8, 4);
	gle(&kv, 3, 8);
	for (int i = 0; i < 3; i++)
		gstr(&kv, merges[i], strlen(merges[i]));
	gkv_u32(&kv, &nkv, "tokenizer.ggml.bos_token_id", 259);
	gkv_u32(&kv, &nkv, "tokenizer.ggml.eos_token_id", 260);
	gkv_u32(&kv, &nkv, "tokenizer.ggml.eot_token_id", 261);

	struct { const char *name; int ne0, ne1; } t[] = {
		{ "rope_freqs.weight", KV / 2, 0 }, { "token_embd.weight", D, NV },
		{ "blk.0.attn_norm.weight", D, 0 }, { "blk.0.attn_q.weight", D, D },
		{ "blk.0.attn_k.weight", D, KV }, { "blk.0.attn_v.weight", D, KV },
		{ "blk.0.attn_output.weight", D, D }, { "blk.0.ffn_norm.weight", D, 0 },
		{ "blk.0.ffn_gate.weight", D, F }, { "blk.0.ffn_up.weight", D, F },
		{ "blk.0.ffn_down.weight", F, D }, { "output_norm.weight", D, 0 },
	};
	int nt = (int)(sizeof(t) / sizeof(t[0]));
	gput(&out, "GGUF", 4);
	gle(&out, 3, 4);
	gle(&out, (uint64_t)nt, 8);
	gle(&out, (uint64_t)nkv, 8);
	gput(&out, kv.p, kv.n);
	uint64_t off = 0;
	for (int i = 0; i < nt; i++) {
		gstr(&out, t[i].name, strlen(t[i].name));
		gle(&out, t[i].ne1 ? 2 : 1, 4);
		gle(&out, (uint64_t)t[i].ne0, 8);
		if (t[i].ne1)
			gle(&out, (uint64_t)t[i].ne1, 8);
		gle(&out, 0, 4);  /* F32 */
		gle(&out, off, 8);
		off += ((uint64_t)t[i].ne0 * (t[i].ne1 ? t[i].ne1 : 1) * 4 + 31) / 32 * 32;
	}
	while (out.n % 32)
		gle(&out, 0, 1);
	for (int i = 0; i < nt; i++) {
		int n = t[i].ne0 * (t[i].ne1 ? t[i].ne1 : 1);
		for (int k = 0; k < n; k++) {
			/* norms near 1, RoPE divisors 1 and 32, matrices small */
			float v = strstr(t[i].name, "norm") ? 1.0f :
				  i == 0 ? (k ? 32.0f : 1.0f) : 0.3f * sinf(0.7f * (float)(k + 31 * i));
			uint32_t u;
			memcpy(&u, &v, 4);
			gle(&out, u, 4);
		}
		while (out.n % 32)
			gle(&out, 0, 1);
	}
	char path[512];
	snprintf(path, sizeof(path), "%s/fuzz_gguf/llama3-gpt2-tiny", dir);
	FILE *o = fopen(path, "wb");
	if (!o || fwrite(out.p, 1, out.n, o) != out.n)
		abort();
	fclose(o);
}

/* ---- version 3 state files with their block files ---------------------- */

struct bytes {
	unsigned char *p;
	size_t n, cap;
};

static void bput(struct bytes *b, const void *d, size_t n)
{
	if (b->n + n > b->cap) {
		b->cap = (b->n + n) * 2;
		if (!(b->p = realloc(b->p, b->cap)))
			abort();
	}
	memcpy(b->p + b->n, d, n);
	b->n += n;
}

static void bfile(struct bytes *b, const char *path)
{
	FILE *f = fopen(path, "rb");
	unsigned char buf[4096];
	size_t k;
	if (!f)
		abort();
	while ((k = fread(buf, 1, sizeof(buf), f)) > 0)
		bput(b, buf, k);
	fclose(f);
}

/* fuzz_store.c's separator of the files in one input */
#define SEP "@KVB@"

/*
 * A session of 40 tokens, 37 cached (two full blocks in block files, the
 * third inline), saved from a pool of `type` by store_save_shared into a
 * scratch folder, then written as one fuzz_store input: the state file,
 * block file 0 unless skip0 (a missing block), block file 1, `extra`
 * sections (SEP NAME "\n" BYTES, already formatted), and last a file
 * "mode" holding the byte that chooses the pool and the consistent-names
 * pass (fuzz_store.c).
 */
static void put_v3(const char *dir, const char *name, enum kt_dtype type, int skip0,
		   const char *extra, size_t extra_n, unsigned char mode)
{
	char tmpl[] = "/tmp/gen_corpus.XXXXXX", path[512];
	if (!mkdtemp(tmpl))
		abort();
	struct kvpool *pool = kvpool_new_typed(NULL, type, 8, 64, 16, 2, 8);
	struct sess_table t;
	if (!pool || sess_table_init(&t, pool) != 0)
		abort();
	memset(pool->kv.base, 0, kt_kv_block_bytes(&pool->kv) * 64);
	struct session *s = sess_create(&t, 1000, "s3");
	int32_t tok[40];
	for (int i = 0; i < 40; i++)
		tok[i] = 3 + i * 11;
	if (!s || sess_append(s, tok, 24, CHAT_USER, "shared prefix", 1) ||
	    sess_append(s, tok + 24, 16, CHAT_ASSISTANT, NULL, 1) ||
	    kvseq_prepare(pool, &s->kv, 37, 0) != 0)
		abort();
	s->tmpl = CHAT_TEMPLATE_LLAMA3;
	s->policy = SESS_CTX_SHIFT;
	float k[8], v[8];
	for (int p = 0; p < 37; p++)
		for (int l = 0; l < 2; l++) {
			for (int c = 0; c < 8; c++) {
				k[c] = sinf((float)(p * 8 + c + l)) * 3;
				v[c] = cosf((float)(p * 8 + c - l)) * 2;
			}
			kt_kv_put(&pool->kv, s->kv.blocks[p / 16], l, p % 16, k, v);
		}
	s->n_cached = 37;
	uint64_t names[2], seed = 0x5eed0000d00dULL;
	names[0] = blk_name(seed, tok, 16);
	names[1] = blk_name(names[0], tok + 16, 16);
	struct store_chain ch = { .seed = seed, .names = names, .n = 2 };
	int written;
	char *cause = NULL;
	if (store_save_shared(tmpl, s, pool, 0x0123456789abcdefULL, &ch, &written, &cause) != 0 ||
	    written != 2) {
		fprintf(stderr, "%s\n", cause ? cause : "block files not written");
		exit(1);
	}
	struct bytes in = { 0 };
	snprintf(path, sizeof(path), "%s/1000-s3.session", tmpl);
	bfile(&in, path);
	if (memmem(in.p, in.n, SEP, strlen(SEP)))
		abort();  /* the separator must not occur in a file */
	unlink(path);
	for (int i = 0; i < 2; i++) {
		char fname[64];
		blk_file_name(fname, sizeof(fname), 1000, names[i]);
		snprintf(path, sizeof(path), "%s/" BLK_DIR "/%s", tmpl, fname);
		if (i || !skip0) {
			bput(&in, SEP "\n", strlen(SEP) + 1);
			size_t at = in.n;
			bfile(&in, path);
			if (memmem(in.p + at, in.n - at, SEP, strlen(SEP)))
				abort();
		}
		unlink(path);
	}
	bput(&in, extra, extra_n);
	bput(&in, SEP "mode\n", strlen(SEP) + 5);
	bput(&in, &mode, 1);
	snprintf(path, sizeof(path), "%s/" BLK_DIR, tmpl);
	rmdir(path);
	if (rmdir(tmpl) != 0)
		abort();
	snprintf(path, sizeof(path), "%s/fuzz_store/%s", dir, name);
	FILE *o = fopen(path, "wb");
	if (!o || fwrite(in.p, 1, in.n, o) != in.n)
		abort();
	fclose(o);
	free(in.p);
	sess_table_done(&t);
	kvpool_free(pool);
}

/* mode: pool type (% 3: f32, f16, q8_0), consistent names ((/ 3) & 1) */
static void v3_seeds(const char *dir)
{
	put_v3(dir, "1000-s3-f32.v3", KT_F32, 0, "", 0, 0);          /* f32 pool */
	put_v3(dir, "1000-s3-f32-chain.v3", KT_F32, 0, "", 0, 4);    /* f16 pool, chain */
	put_v3(dir, "1000-s3-f16.v3", KT_F16, 0, "", 0, 2);          /* q8_0 pool */
	put_v3(dir, "1000-s3-q8.v3", KT_Q8_0, 0, "", 0, 3);          /* f32 pool, chain */
	put_v3(dir, "1000-s3-missing.v3", KT_F16, 1, "", 0, 1);      /* block 0 missing */
	/* for blk_collect: a temporary file, an unreferenced block file (a
	 * copy of nothing: a short one), a name that is not a block's */
	static const char extra[] = SEP ".tmp-1000-00000000000000aa.kvb.1.0\npartial"
				    SEP "1000-00000000000000bb.kvb\nLLAMADB1"
				    SEP "1000-00000000000000BB.kvb\nupper-case hex is not ours";
	put_v3(dir, "1000-s3-collect.v3", KT_F32, 0, extra, sizeof(extra) - 1, 0);
}

int main(int argc, char **argv)
{
	const char *dir = argc > 1 ? argv[1] : "tests/fuzz/corpus";
	put_gguf(dir);
	v3_seeds(dir);
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

	Llamad__GetTranscript tx = LLAMAD__GET_TRANSCRIPT__INIT;
	tx.session = "chat-1";
	PB_SET(&tx, from_turn, 2);
	PB_SET(&tx, last_turns, 3);
	PB_SET(&tx, token_ids, 1);
	q.op_case = LLAMAD__REQUEST__OP_TRANSCRIPT;
	q.transcript = &tx;
	put(dir, "transcript", &q);

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
	s->turns[1].end = 2;  /* an answer cut by max_tokens */
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
	/* the same session in f16 and q8_0 K/V (ids s1h, s1q) */
	static const enum kt_dtype types[] = { KT_F16, KT_Q8_0 };
	for (int ti = 0; ti < 2; ti++) {
		pool = kvpool_new_typed(NULL, types[ti], 8, 64, 16, 2, 8);
		if (!pool || sess_table_init(&t, pool) != 0)
			abort();
		s = sess_create(&t, 1000, ti ? "s1q" : "s1h");
		if (!s || sess_append(s, tok, 12, CHAT_USER, "hi", 1) ||
		    sess_append(s, tok + 12, 8, CHAT_ASSISTANT, NULL, 1) ||
		    kvseq_prepare(pool, &s->kv, 18, 0) != 0)
			abort();
		s->tmpl = CHAT_TEMPLATE_LLAMA2;
		s->policy = SESS_CTX_SHIFT;
		memset(pool->kv.base, 0, kt_kv_block_bytes(&pool->kv) * 64);
		float k[8], v[8];
		for (int p = 0; p < 18; p++)
			for (int l = 0; l < 2; l++) {
				for (int c = 0; c < 8; c++) {
					k[c] = sinf((float)(p * 8 + c + l));
					v[c] = cosf((float)(p * 8 + c - l));
				}
				kt_kv_put(&pool->kv, s->kv.blocks[p / 16], l, p % 16, k, v);
			}
		s->n_cached = 18;
		if (store_save(path, s, pool, 0x0123456789abcdefULL, &cause) != 0) {
			fprintf(stderr, "%s\n", cause);
			return 1;
		}
		sess_table_done(&t);
		kvpool_free(pool);
	}
	return 0;
}

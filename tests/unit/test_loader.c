/*
 * tests/unit/test_loader.c — model_load on good and bad inputs
 * (model/model.c, model/load_llama2c.c, model/load_hf.c).
 *
 * Every malformed input must give NULL and a cause naming the file and the
 * reason, never a crash. Broken files are made in a private temp folder from
 * $MODELS/stories260K.bin and $MODELS/stories260K-hf (read, modified, written
 * back with jansson). The good variants (f16, bf16, sharded, a path to the
 * .safetensors file) must give the same greedy tokens as the f32 folder and
 * the llama2.c .bin.
 */
#include <errno.h>
#include <ftw.h>
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/unit/testutil.h"

#include "kernels/backend.h"
#include "model/forward.h"
#include "model/model.h"
#include "text/chat.h"
#include "session/kvpool.h"

#define N_GEN 20
#define PROMPT "Once upon a time"

/* Everything the tests share: the temp folder and the pristine sources. */
static char tmpdir[256];
static uint8_t *bin;           /* stories260K.bin */
static size_t bin_len;
static json_t *src_cfg;        /* stories260K-hf/config.json */
static json_t *src_hdr;        /* its model.safetensors header */
static const uint8_t *src_data;/* its data section (inside src_st) */
static size_t src_dlen;
static uint8_t *src_st;
static size_t src_st_len;
static uint8_t *src_tok;       /* its tokenizer.model */
static size_t src_tok_len;
static int32_t ref_tokens[N_GEN];  /* greedy tokens of the f32 folder */
static float *ref_logits;          /* its logits after the prompt */
static int ref_vocab;

/* ---- files ---------------------------------------------------------------- */

static const char *models_dir(void)
{
	const char *m = getenv("MODELS");
	return m && *m ? m : "../shared/models";
}

/* Write a safetensors file: 8-byte length, header, data. The header is
 * padded with spaces so that the data starts 8-byte aligned if pad is set,
 * or at an odd offset (misaligned for every dtype) if not. */
static void write_st(const char *path, json_t *hdr, const void *data, size_t dlen, int pad)
{
	char *h = json_dumps(hdr, JSON_COMPACT);
	assert_non_null(h);
	size_t hl = strlen(h), padded = pad ? (hl + 7) / 8 * 8 : hl / 8 * 8 + 9;
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	uint8_t len8[8];
	for (int i = 0; i < 8; i++)
		len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
	assert_int_equal(fwrite(len8, 1, 8, f), 8);
	assert_int_equal(fwrite(h, 1, hl, f), hl);
	for (size_t i = hl; i < padded; i++)
		fputc(' ', f);
	if (dlen)
		assert_int_equal(fwrite(data, 1, dlen, f), dlen);
	assert_int_equal(fclose(f), 0);
	free(h);
}

/* A new folder tmpdir/name holding config.json (cfg, or none if NULL) and
 * tokenizer.model (if tok). Returns the malloc'd folder path. */
static char *hf_dir(const char *name, json_t *cfg, int tok)
{
	char *d = fmt("%s/%s", tmpdir, name);
	assert_int_equal(mkdir(d, 0700), 0);
	if (cfg) {
		char *p = fmt("%s/config.json", d);
		assert_int_equal(json_dump_file(cfg, p, JSON_INDENT(2)), 0);
		free(p);
	}
	if (tok) {
		char *p = fmt("%s/tokenizer.model", d);
		spit(p, src_tok, src_tok_len);
		free(p);
	}
	return d;
}

/* The pristine f32 model.safetensors into folder d, header modified by hdr
 * (NULL: unchanged). */
static void put_st(const char *d, json_t *hdr)
{
	char *p = fmt("%s/model.safetensors", d);
	write_st(p, hdr ? hdr : src_hdr, src_data, src_dlen, 1);
	free(p);
}

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(p);
}

/* ---- running ---------------------------------------------------------------- */

/* Greedy decode of N_GEN tokens after BOS + PROMPT, as daemon/oneshot.c does
 * (one prefill, then one token per step). logits0 (vocab), if not NULL,
 * receives the logits after the prompt. */
static void greedy(const struct model *m, int32_t *out, float *logits0)
{
	const struct model_config *c = &m->cfg;
	int32_t *hist = NULL;
	int n = tok_encode(m->tok, PROMPT, strlen(PROMPT), 1, &hist);
	assert_true(n > 1);
	int total = n + N_GEN;
	hist = realloc(hist, (size_t)total * sizeof(int32_t));
	assert_non_null(hist);
	struct backend *be = backend_cpu_new(1);  /* the loader, not the pool, is under test */
	struct kvpool *pool = kvpool_new((total + 15) / 16, 16, c->n_layers, model_kv_dim(c));
	struct fwd *f = fwd_new(m, be, 64);
	float *logits = malloc((size_t)c->vocab * sizeof(float));
	struct kvseq seq = { 0 };
	assert_non_null(be);
	assert_non_null(pool);
	assert_non_null(f);
	assert_non_null(logits);
	assert_int_equal(kvseq_prepare(pool, &seq, total, 0), 0);
	struct fwd_seq s = { hist, n, 0, seq.blocks, logits, 0 };
	assert_int_equal(fwd_run(f, &pool->kv, &s, 1), 0);
	if (logits0)
		memcpy(logits0, logits, (size_t)c->vocab * sizeof(float));
	for (int i = 0; i < N_GEN; i++) {
		int32_t best = 0;
		for (int v = 1; v < c->vocab; v++)
			if (logits[v] > logits[best])
				best = v;
		out[i] = best;
		hist[n + i] = best;
		if (i + 1 == N_GEN)
			break;
		struct fwd_seq d = { &hist[n + i], 1, n + i, seq.blocks, logits, 0 };
		assert_int_equal(fwd_run(f, &pool->kv, &d, 1), 0);
	}
	kvseq_release(pool, &seq);
	free(logits);
	fwd_free(f);
	kvpool_free(pool);
	backend_free(be);
	free(hist);
}

static struct model *load_ok(const char *path, const char *tok)
{
	char *cause = NULL;
	struct model *m = model_load(path, tok, &cause);
	if (!m) {
		fprintf(stderr, "model_load(%s): %s\n", path, cause ? cause : "(no cause)");
		free(cause);
		fail();
	}
	assert_null(cause);
	return m;
}

static void print_tokens(const char *what, const int32_t *t)
{
	fprintf(stderr, "%s:", what);
	for (int i = 0; i < N_GEN; i++)
		fprintf(stderr, " %d", t[i]);
	fprintf(stderr, "\n");
}

/* Load path and check its greedy tokens against the f32 folder's; logits
 * after the prompt within rel (relative to the largest |logit|). */
static struct model *expect_same_tokens(const char *path, const char *tok, double rel)
{
	struct model *m = load_ok(path, tok);
	assert_int_equal(m->cfg.vocab, ref_vocab);
	int32_t got[N_GEN];
	float *l0 = malloc((size_t)ref_vocab * sizeof(float));
	assert_non_null(l0);
	greedy(m, got, l0);
	double amax = 0, dmax = 0;
	for (int i = 0; i < ref_vocab; i++) {
		amax = fmax(amax, fabs(ref_logits[i]));
		dmax = fmax(dmax, fabs((double)l0[i] - ref_logits[i]));
	}
	free(l0);
	if (memcmp(got, ref_tokens, sizeof(got)) || dmax > rel * amax) {
		fprintf(stderr, "%s: max logit difference %g (limit %g)\n", path, dmax, rel * amax);
		print_tokens("want", ref_tokens);
		print_tokens("got ", got);
		fail();
	}
	return m;
}

/* ---- failures ---------------------------------------------------------------- */

/*
 * model_load(path, tok) must fail; its cause must contain every string of
 * the NULL-terminated list (the file and the reason).
 */
static void expect_fail(const char *path, const char *tok, ...)
{
	char *cause = NULL;
	struct model *m = model_load(path, tok, &cause);
	if (m) {
		fprintf(stderr, "model_load(%s) succeeded, expected a failure\n", path);
		model_free(m);
		fail();
	}
	if (!cause) {
		fprintf(stderr, "model_load(%s) failed without a cause\n", path);
		fail();
	}
	va_list ap;
	va_start(ap, tok);
	const char *s;
	while ((s = va_arg(ap, const char *))) {
		if (!strstr(cause, s)) {
			fprintf(stderr, "cause \"%s\" lacks \"%s\"\n", cause, s);
			va_end(ap);
			free(cause);
			fail();
		}
	}
	va_end(ap);
	free(cause);
	/* a NULL cause pointer is allowed too */
	assert_null(model_load(path, tok, NULL));
}

/* ---- setup ------------------------------------------------------------------ */

static int group_setup(void **state)
{
	(void)state;
	const char *t = getenv("TMPDIR");
	snprintf(tmpdir, sizeof(tmpdir), "%s/llamad-test-loader-XXXXXX", t && *t ? t : "/tmp");
	if (!mkdtemp(tmpdir))
		return -1;
	char *p = fmt("%s/stories260K.bin", models_dir());
	bin = (uint8_t *)slurp(p, &bin_len);
	free(p);
	p = fmt("%s/stories260K-hf/model.safetensors", models_dir());
	src_st = (uint8_t *)slurp(p, &src_st_len);
	free(p);
	p = fmt("%s/stories260K-hf/tokenizer.model", models_dir());
	src_tok = (uint8_t *)slurp(p, &src_tok_len);
	free(p);
	p = fmt("%s/stories260K-hf/config.json", models_dir());
	src_cfg = json_load_file(p, 0, NULL);
	free(p);
	if (!bin || !src_st || !src_tok || !src_cfg || src_st_len < 8) {
		fprintf(stderr, "cannot read the test models in %s\n", models_dir());
		return -1;
	}
	uint64_t hl = 0;
	for (int i = 7; i >= 0; i--)
		hl = hl << 8 | src_st[i];
	src_hdr = json_loadb((const char *)src_st + 8, (size_t)hl, 0, NULL);
	if (!src_hdr)
		return -1;
	src_data = src_st + 8 + hl;
	src_dlen = src_st_len - 8 - hl;

	/* the reference: the f32 folder as shipped */
	p = fmt("%s/stories260K-hf", models_dir());
	struct model *m = model_load(p, NULL, NULL);
	free(p);
	if (!m)
		return -1;
	ref_vocab = m->cfg.vocab;
	ref_logits = malloc((size_t)ref_vocab * sizeof(float));
	greedy(m, ref_tokens, ref_logits);
	model_free(m);
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	if (tmpdir[0])
		nftw(tmpdir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	free(bin);
	free(src_st);
	free(src_tok);
	free(ref_logits);
	json_decref(src_cfg);
	json_decref(src_hdr);
	return 0;
}

/* ---- llama2.c .bin ---------------------------------------------------------- */

static void test_missing_and_empty(void **state)
{
	(void)state;
	char *p = fmt("%s/no-such-model.bin", tmpdir);
	expect_fail(p, NULL, p, "cannot open", "No such file", NULL);
	free(p);
	p = fmt("%s/empty.bin", tmpdir);
	spit(p, "", 0);
	expect_fail(p, NULL, p, "empty file", NULL);
	free(p);
	p = fmt("%s/short.bin", tmpdir);
	spit(p, bin, 27);
	expect_fail(p, NULL, p, "truncated", "27 bytes", NULL);
	free(p);
	/* a folder with nothing in it */
	p = fmt("%s/empty-dir", tmpdir);
	assert_int_equal(mkdir(p, 0700), 0);
	expect_fail(p, NULL, p, "config.json", NULL);
	free(p);
	/* an explicit tokenizer that does not exist */
	p = fmt("%s/stories260K.bin", models_dir());
	char *t = fmt("%s/no-such-tokenizer.model", tmpdir);
	expect_fail(p, t, t, NULL);
	free(t);
	free(p);
}

static void test_truncated_bin(void **state)
{
	(void)state;
	char *p = fmt("%s/header-only.bin", tmpdir);
	spit(p, bin, 28);
	expect_fail(p, NULL, p, "truncated", "28 bytes", "1056540", NULL);
	free(p);
	p = fmt("%s/first5000.bin", tmpdir);
	spit(p, bin, 5000);
	expect_fail(p, NULL, p, "truncated", "5000 bytes", NULL);
	free(p);
	p = fmt("%s/minus1.bin", tmpdir);
	spit(p, bin, bin_len - 1);
	expect_fail(p, NULL, p, "truncated", NULL);
	free(p);
	p = fmt("%s/plus1.bin", tmpdir);
	uint8_t *b = malloc(bin_len + 1);
	assert_non_null(b);
	memcpy(b, bin, bin_len);
	b[bin_len] = 0;
	spit(p, b, bin_len + 1);
	free(b);
	expect_fail(p, NULL, p, "size does not match header", "1056541", NULL);
	free(p);
}

/* The .bin with header field i set to v; must fail with reason why. */
static void bad_header(const char *name, const int32_t *h, const char *why)
{
	char *p = fmt("%s/%s.bin", tmpdir, name);
	uint8_t *b = malloc(bin_len);
	assert_non_null(b);
	memcpy(b, bin, bin_len);
	memcpy(b, h, 28);
	spit(p, b, bin_len);
	free(b);
	expect_fail(p, NULL, p, why, NULL);
	free(p);
}

static void test_bad_header(void **state)
{
	(void)state;
	int32_t h0[7];
	memcpy(h0, bin, 28);
	/* dim hidden layers heads kv vocab seq */
	assert_int_equal(h0[0], 64);
	assert_int_equal(h0[3], 8);
	struct { const char *name; int field; int32_t v; const char *why; } cases[] = {
		{ "heads0", 3, 0, "head count out of range" },
		{ "heads-neg", 3, -8, "head count out of range" },
		{ "dim-neg", 0, -64, "dim out of range" },
		{ "dim0", 0, 0, "dim out of range" },
		{ "hidden-neg", 1, -172, "ffn size out of range" },
		{ "layers-neg", 2, -5, "layer count out of range" },
		{ "layers0", 2, 0, "layer count out of range" },
		{ "kv0", 4, 0, "kv head count must divide" },
		{ "kv3", 4, 3, "kv head count must divide" },
		{ "kv16", 4, 16, "kv head count must divide" },
		{ "seq-neg", 6, -512, "context length out of range" },
		{ "vocab-min", 5, INT32_MIN, "vocabulary size out of range" },
		{ "vocab2", 5, 2, "vocabulary size out of range" },
		/* overflow attempts */
		{ "dim2^30", 0, 1 << 30, "dim out of range" },
		{ "hidden2^30", 1, 1 << 30, "ffn size out of range" },
		{ "layers2^30", 2, 1 << 30, "layer count out of range" },
		{ "heads2^30", 3, 1 << 30, "head count out of range" },
		{ "vocab2^30", 5, 1 << 30, "vocabulary size out of range" },
		{ "vocab-2^30", 5, -(1 << 30), "vocabulary size out of range" },
		{ "seq2^30", 6, 1 << 30, "context length out of range" },
		{ "dimmax", 0, INT32_MAX, "dim out of range" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int32_t h[7];
		memcpy(h, h0, sizeof(h));
		h[cases[i].field] = cases[i].v;
		bad_header(cases[i].name, h, cases[i].why);
	}
	/* odd head size: dim 72 / 8 heads = 9 */
	int32_t odd[7] = { 72, 172, 5, 8, 4, 512, 512 };
	bad_header("headdim9", odd, "head dimension");
	/* 64 / 6 heads = 10, even, but 6 does not divide 64 */
	int32_t six[7] = { 64, 172, 5, 6, 3, 512, 512 };
	bad_header("heads6", six, "dim is not a multiple of the head count");
	/* every field at the largest value the range checks allow: the size
	 * arithmetic (64-bit) must not overflow and reports the file as short */
	int32_t big[7] = { 65536, 1 << 20, 1024, 128, 128, -(1 << 22), 1 << 24 };
	bad_header("allmax", big, "truncated");
}

static void test_foreign_formats(void **state)
{
	(void)state;
	/* (real GGUF files load: tests/unit/test_gguf.c) */
	/* a GGUF magic on a file of the right size for the legacy header */
	char *p = fmt("%s/fake.gguf.bin", tmpdir);
	uint8_t *b = malloc(bin_len);
	assert_non_null(b);
	memcpy(b, bin, bin_len);
	memcpy(b, "GGUF", 4);
	spit(p, b, bin_len);
	expect_fail(p, NULL, p, "GGUF", NULL);
	free(p);
	/* llama2.c export v1: uint32 magic 0x616b3432 ("ak42") then version 1,
	 * as export.py writes it with struct.pack('I', ...) (little-endian) */
	p = fmt("%s/v1.bin", tmpdir);
	uint32_t magic = 0x616b3432, version = 1;
	memcpy(b, &magic, 4);
	memcpy(b + 4, &version, 4);
	spit(p, b, 256 + 4096);
	expect_fail(p, NULL, p, "v1/v2", "not supported", NULL);
	free(p);
	free(b);
	/* a .safetensors suffix on something else */
	p = fmt("%s/notst/model.safetensors", tmpdir);
	char *d = fmt("%s/notst", tmpdir);
	assert_int_equal(mkdir(d, 0700), 0);
	char *c = fmt("%s/config.json", d);
	assert_int_equal(json_dump_file(src_cfg, c, 0), 0);
	spit(p, bin, bin_len);
	expect_fail(p, NULL, p, "not a safetensors file", NULL);
	free(c);
	free(d);
	free(p);
}

static void test_vocab_mismatch(void **state)
{
	(void)state;
	char *p = fmt("%s/stories260K.bin", models_dir());
	char *t = fmt("%s/tokenizer.model", models_dir());
	expect_fail(p, t, t, p, "32000", "512", NULL);
	/* the default tokenizer beside the .bin is the 32000-piece one too: it
	 * says it was found beside the model and asks for --tokenizer */
	expect_fail(p, NULL, "tokenizer.model", "32000", "vocabulary of 512", "found beside the model",
		    "--tokenizer PATH", NULL);
	free(t);
	free(p);
}

/* ---- Hugging Face folders ------------------------------------------------------ */

/* A folder with a config modified by edit(cfg), the f32 weights and the
 * tokenizer; must fail naming config.json and why. */
static void bad_config(const char *name, void (*edit)(json_t *), const char *why)
{
	json_t *cfg = json_deep_copy(src_cfg);
	edit(cfg);
	char *d = hf_dir(name, cfg, 1);
	put_st(d, NULL);
	char *c = fmt("%s/config.json", d);
	expect_fail(d, NULL, c, why, NULL);
	free(c);
	free(d);
	json_decref(cfg);
}

static void no_hidden(json_t *c) { json_object_del(c, "hidden_size"); }
static void str_hidden(json_t *c) { json_object_set_new(c, "hidden_size", json_string("64")); }
static void neg_layers(json_t *c) { json_object_set_new(c, "num_hidden_layers", json_integer(-5)); }
static void gpt2(json_t *c) { json_object_set_new(c, "model_type", json_string("gpt2")); }
static void kv3(json_t *c) { json_object_set_new(c, "num_key_value_heads", json_integer(3)); }
static void huge_hidden(json_t *c) { json_object_set_new(c, "hidden_size", json_integer(1LL << 40)); }
static void heads0(json_t *c) { json_object_set_new(c, "num_attention_heads", json_integer(0)); }
static void rope_scaling(json_t *c)
{
	json_object_set_new(c, "rope_scaling",
			    json_pack("{s:s, s:f}", "type", "linear", "factor", 2.0));
}

static void test_hf_config(void **state)
{
	(void)state;
	/* missing config.json */
	char *d = hf_dir("no-config", NULL, 1);
	put_st(d, NULL);
	expect_fail(d, NULL, "config.json", "No such file", NULL);
	free(d);
	/* not JSON, and JSON but not an object */
	d = hf_dir("config-garbage", NULL, 1);
	put_st(d, NULL);
	char *c = fmt("%s/config.json", d);
	spit(c, "hidden_size = 64\n", 17);
	expect_fail(d, NULL, c, "expected near", NULL);
	spit(c, "[64, 5]", 7);
	expect_fail(d, NULL, c, "not a JSON object", NULL);
	spit(c, "{\"hidden_size\": 64,", 19);
	expect_fail(d, NULL, c, NULL);
	free(c);
	free(d);

	bad_config("no-hidden", no_hidden, "\"hidden_size\"");
	bad_config("str-hidden", str_hidden, "\"hidden_size\"");
	bad_config("neg-layers", neg_layers, "\"num_hidden_layers\"");
	bad_config("heads0", heads0, "\"num_attention_heads\"");
	bad_config("gpt2", gpt2, "model_type \"gpt2\"");
	bad_config("rope-scaling", rope_scaling, "rope_scaling");
	bad_config("kv3", kv3, "kv head count must divide");
	bad_config("huge-hidden", huge_hidden, "\"hidden_size\"");
}

/* Folder name with the pristine config and tokenizer and a model.safetensors
 * made of raw bytes; must fail naming model.safetensors and why. */
static void bad_st_bytes(const char *name, const void *data, size_t len, const char *why)
{
	char *d = hf_dir(name, src_cfg, 1);
	char *p = fmt("%s/model.safetensors", d);
	spit(p, data, len);
	expect_fail(d, NULL, p, why, NULL);
	free(p);
	free(d);
}

static void test_hf_safetensors_file(void **state)
{
	(void)state;
	/* no weights at all */
	char *d = hf_dir("no-weights", src_cfg, 1);
	expect_fail(d, NULL, d, "no model.safetensors", NULL);
	free(d);

	bad_st_bytes("st-tiny", "\x10\0\0", 3, "truncated");
	/* header length larger than the file */
	uint8_t *b = malloc(src_st_len);
	assert_non_null(b);
	memcpy(b, src_st, src_st_len);
	uint64_t big = src_st_len;  /* > src_st_len - 8 */
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(big >> (8 * i));
	bad_st_bytes("st-hlen", b, src_st_len, "header length");
	/* a header length near 2^64 (overflow attempt) */
	memset(b, 0xff, 8);
	bad_st_bytes("st-hlen-max", b, src_st_len, "header length");
	free(b);
	/* header not JSON */
	static const char notjson[] = "\x10\0\0\0\0\0\0\0this is not json????";
	bad_st_bytes("st-notjson", notjson, sizeof(notjson) - 1, "corrupt safetensors header");
	static const char arr[] = "\x08\0\0\0\0\0\0\0[1,2,3] ";
	bad_st_bytes("st-array", arr, sizeof(arr) - 1, "corrupt safetensors header");
	/* truncated data: the f32 file cut in the middle */
	bad_st_bytes("st-cut", src_st, src_st_len / 2, "out of range");
	/* valid empty header: every tensor missing */
	static const char empty[] = "\x02\0\0\0\0\0\0\0{}";
	d = hf_dir("st-empty", src_cfg, 1);
	char *p = fmt("%s/model.safetensors", d);
	spit(p, empty, sizeof(empty) - 1);
	expect_fail(d, NULL, "model.embed_tokens.weight", "missing", NULL);
	free(p);
	free(d);
}

/* Folder name whose header is the pristine one edited by edit(hdr); must
 * fail naming what. */
static void bad_hdr(const char *name, void (*edit)(json_t *), const char *what, const char *why)
{
	json_t *h = json_deep_copy(src_hdr);
	edit(h);
	char *d = hf_dir(name, src_cfg, 1);
	put_st(d, h);
	expect_fail(d, NULL, what, why, NULL);
	free(d);
	json_decref(h);
}

#define Q0 "model.layers.0.self_attn.q_proj.weight"
#define UP3 "model.layers.3.mlp.up_proj.weight"
#define NORM2 "model.layers.2.post_attention_layernorm.weight"

static void set_q0(json_t *h, const char *key, json_t *v)
{
	json_object_set_new(json_object_get(h, Q0), key, v);
}
static void dtype_i8(json_t *h) { set_q0(h, "dtype", json_string("I8")); }
static void dtype_num(json_t *h) { set_q0(h, "dtype", json_integer(8)); }
static void offsets_past_end(json_t *h)
{
	/* a 64x64 f32 span that ends 4 bytes past the data */
	json_int_t end = (json_int_t)src_dlen + 4;
	set_q0(h, "data_offsets", json_pack("[I, I]", end - 64 * 64 * 4, end));
}
static void offsets_huge(json_t *h)
{
	set_q0(h, "data_offsets", json_pack("[I, I]", (json_int_t)INT64_MAX - 16384,
					    (json_int_t)INT64_MAX));
}
static void offsets_reversed(json_t *h)
{
	set_q0(h, "data_offsets", json_pack("[i, i]", 16384, 0));
}
static void offsets_negative(json_t *h)
{
	set_q0(h, "data_offsets", json_pack("[i, i]", -16384, 0));
}
static void offsets_short(json_t *h)
{
	/* 4 bytes fewer than the shape needs */
	json_t *o = json_object_get(json_object_get(h, Q0), "data_offsets");
	json_int_t b = json_integer_value(json_array_get(o, 0));
	set_q0(h, "data_offsets", json_pack("[I, I]", b, b + 64 * 64 * 4 - 4));
}
static void shape_wrong(json_t *h) { set_q0(h, "shape", json_pack("[i, i]", 32, 128)); }
static void shape_3d(json_t *h) { set_q0(h, "shape", json_pack("[i, i, i]", 64, 8, 8)); }
static void shape_overflow(json_t *h)
{
	/* 2^32 x 2^32 elements: the element count wraps to 0 in 64 bits */
	set_q0(h, "shape", json_pack("[I, I]", (json_int_t)1 << 32, (json_int_t)1 << 32));
	set_q0(h, "data_offsets", json_pack("[i, i]", 0, 0));
}
static void shape_neg(json_t *h) { set_q0(h, "shape", json_pack("[i, i]", -64, -64)); }
static void shape_5d(json_t *h) { set_q0(h, "shape", json_pack("[i,i,i,i,i]", 4, 4, 4, 4, 4)); }
static void norm_2d(json_t *h)
{
	json_object_set_new(json_object_get(h, NORM2), "shape", json_pack("[i, i]", 1, 64));
}
static void drop_up3(json_t *h) { json_object_del(h, UP3); }
static void drop_norm(json_t *h) { json_object_del(h, "model.norm.weight"); }
static void no_dtype(json_t *h) { json_object_del(json_object_get(h, Q0), "dtype"); }
static void entry_not_object(json_t *h) { json_object_set_new(h, Q0, json_integer(3)); }

static void test_hf_tensors(void **state)
{
	(void)state;
	bad_hdr("t-i8", dtype_i8, Q0, "unsupported dtype I8");
	bad_hdr("t-dtype-num", dtype_num, Q0, "malformed");
	bad_hdr("t-past-end", offsets_past_end, Q0, "data offsets");
	bad_hdr("t-huge-off", offsets_huge, Q0, "data offsets");
	bad_hdr("t-reversed", offsets_reversed, Q0, "data offsets");
	bad_hdr("t-negative", offsets_negative, Q0, "data offsets");
	bad_hdr("t-short", offsets_short, Q0, "data offsets");
	bad_hdr("t-shape", shape_wrong, Q0, "shape [32, 128]");
	bad_hdr("t-shape3d", shape_3d, Q0, "shape");
	bad_hdr("t-shape-ovf", shape_overflow, Q0, "shape");
	bad_hdr("t-shape-neg", shape_neg, Q0, "out of range");
	bad_hdr("t-shape5d", shape_5d, Q0, "malformed");
	bad_hdr("t-norm2d", norm_2d, NORM2, "expected [64]");
	bad_hdr("t-missing", drop_up3, UP3, "missing");
	bad_hdr("t-missing-norm", drop_norm, "model.norm.weight", "missing");
	bad_hdr("t-no-dtype", no_dtype, Q0, "malformed");
	bad_hdr("t-not-object", entry_not_object, Q0, "malformed");

	/* a missing tokenizer in the folder names it and the way out */
	char *d = hf_dir("no-tokenizer", src_cfg, 0);
	put_st(d, NULL);
	expect_fail(d, NULL, "tokenizer.model", "--tokenizer", NULL);
	free(d);
}

/* ---- good variants ------------------------------------------------------------- */

/* Write the pristine tensors converted to dtype into path; only tensors for
 * which keep(name, arg) holds (all if keep is NULL). pad: align the data. */
static void write_converted(const char *path, enum kt_dtype dt, int (*keep)(const char *, int),
			    int arg, int pad)
{
	json_t *h = json_object();
	size_t cap = src_dlen, n = 0;
	uint8_t *out = malloc(cap);
	assert_non_null(out);
	const char *key;
	json_t *v;
	json_object_foreach(src_hdr, key, v) {
		if (!strcmp(key, "__metadata__")) {
			json_object_set(h, key, v);
			continue;
		}
		if (keep && !keep(key, arg))
			continue;
		json_t *o = json_object_get(v, "data_offsets");
		size_t b = (size_t)json_integer_value(json_array_get(o, 0));
		size_t e = (size_t)json_integer_value(json_array_get(o, 1));
		assert_string_equal(json_string_value(json_object_get(v, "dtype")), "F32");
		size_t cnt = (e - b) / 4, bytes = cnt * kt_dtype_size(dt);
		for (size_t i = 0; i < cnt; i++) {
			float f;
			memcpy(&f, src_data + b + 4 * i, 4);
			if (dt == KT_F32) {
				memcpy(out + n + 4 * i, &f, 4);
			} else {
				uint16_t x = dt == KT_F16 ? kt_f32_to_f16(f) : kt_f32_to_bf16(f);
				memcpy(out + n + 2 * i, &x, 2);
			}
		}
		json_t *t = json_pack("{s:s, s:O, s:[I, I]}", "dtype",
				      dt == KT_F32 ? "F32" : dt == KT_F16 ? "F16" : "BF16",
				      "shape", json_object_get(v, "shape"),
				      "data_offsets", (json_int_t)n, (json_int_t)(n + bytes));
		assert_non_null(t);
		json_object_set_new(h, key, t);
		n += bytes;
	}
	write_st(path, h, out, n, pad);
	json_decref(h);
	free(out);
}

static void test_hf_f32_matches_bin(void **state)
{
	(void)state;
	/* the .bin (llama2.c layout, interleaved RoPE) and the HF folder (rotate_half
	 * layout) are the same model: same tokens, logits equal to rounding
	 * (measured: bit-identical) */
	char *p = fmt("%s/stories260K.bin", models_dir());
	char *t = fmt("%s/tok512.model", models_dir());
	struct model *m = expect_same_tokens(p, t, 1e-5);
	assert_string_equal(m->format, "llama2.c");
	assert_int_equal(m->cfg.dim, 64);
	assert_int_equal(m->cfg.n_layers, 5);
	assert_int_equal(m->cfg.n_heads, 8);
	assert_int_equal(m->cfg.n_kv_heads, 4);
	assert_int_equal(m->cfg.head_dim, 8);
	assert_int_equal(m->cfg.ffn_dim, 172);
	assert_int_equal(m->cfg.vocab, 512);
	assert_int_equal(m->cfg.max_ctx, 512);
	model_free(m);
	/* the story the reference starts with: ", there was a little girl..." */
	char *text = NULL;
	m = load_ok(p, t);
	assert_true(tok_decode(m->tok, ref_tokens, N_GEN, &text) >= 0);
	assert_non_null(strstr(text, "there was a little girl named Lily"));
	free(text);
	model_free(m);
	free(t);
	free(p);

	/* a copy of the f32 folder whose data is NOT 8-byte aligned (unpadded
	 * header): the loader copies misaligned matrices */
	char *d = hf_dir("f32-unaligned", src_cfg, 1);
	p = fmt("%s/model.safetensors", d);
	write_st(p, src_hdr, src_data, src_dlen, 0);
	m = expect_same_tokens(d, NULL, 0);
	model_free(m);
	free(p);
	free(d);
}

static void test_hf_f16_bf16(void **state)
{
	(void)state;
	/* f16: 10 mantissa bits. The greedy tokens are the same as f32's for
	 * these 20 steps; the logits after the prompt are within 0.2% of the
	 * largest |logit| (measured: 0.0079 of 17.8, 4.5e-4) */
	char *d = hf_dir("f16", src_cfg, 1);
	char *p = fmt("%s/model.safetensors", d);
	write_converted(p, KT_F16, NULL, 0, 1);
	struct model *m = expect_same_tokens(d, NULL, 2e-3);
	assert_int_equal(m->wtype, KT_F16);
	model_free(m);
	free(p);
	free(d);
	/* bf16: 7 mantissa bits. Same tokens; logits within 1.5% (measured:
	 * 0.072 of 17.8, 4e-3) */
	d = hf_dir("bf16", src_cfg, 1);
	p = fmt("%s/model.safetensors", d);
	write_converted(p, KT_BF16, NULL, 0, 1);
	m = expect_same_tokens(d, NULL, 1.5e-2);
	assert_int_equal(m->wtype, KT_BF16);
	model_free(m);
	free(p);
	free(d);
}

/* shard 1: embeddings and layers 0-1; shard 2: the rest */
static int in_shard(const char *name, int shard)
{
	int first = !strcmp(name, "model.embed_tokens.weight") ||
		    !strncmp(name, "model.layers.0.", 15) || !strncmp(name, "model.layers.1.", 15);
	return shard == 1 ? first : !first;
}

static void test_hf_sharded(void **state)
{
	(void)state;
	char *d = hf_dir("sharded", src_cfg, 1);
	static const char *const shard[2] = { "model-00001-of-00002.safetensors",
					      "model-00002-of-00002.safetensors" };
	json_t *wm = json_object();
	for (int s = 0; s < 2; s++) {
		char *p = fmt("%s/%s", d, shard[s]);
		/* shard 2 unpadded: its data is misaligned */
		write_converted(p, KT_F32, in_shard, s + 1, s == 0);
		free(p);
	}
	const char *key;
	json_t *v;
	json_object_foreach(src_hdr, key, v) {
		if (strcmp(key, "__metadata__"))
			json_object_set_new(wm, key, json_string(shard[in_shard(key, 1) ? 0 : 1]));
	}
	json_t *idx = json_pack("{s:{s:i}, s:o}", "metadata", "total_size", (int)src_dlen,
				"weight_map", wm);
	char *ip = fmt("%s/model.safetensors.index.json", d);
	assert_int_equal(json_dump_file(idx, ip, JSON_INDENT(2)), 0);
	json_decref(idx);
	struct model *m = expect_same_tokens(d, NULL, 0);
	assert_int_equal(m->n_maps, 2);
	model_free(m);
	/* the index path itself works too */
	m = expect_same_tokens(ip, NULL, 0);
	model_free(m);

	/* an index naming a shard that is not there names the shard */
	idx = json_pack("{s:{s:s}}", "weight_map", "model.norm.weight", "model-00003-of-00002.safetensors");
	assert_int_equal(json_dump_file(idx, ip, 0), 0);
	json_decref(idx);
	expect_fail(d, NULL, "model-00003-of-00002.safetensors", "cannot open", NULL);
	/* a shard name that leaves the folder is refused */
	idx = json_pack("{s:{s:s}}", "weight_map", "model.norm.weight", "../sharded/x.safetensors");
	assert_int_equal(json_dump_file(idx, ip, 0), 0);
	json_decref(idx);
	expect_fail(d, NULL, ip, "bad shard name", NULL);
	/* an index without a weight_map */
	spit(ip, "{}", 2);
	expect_fail(d, NULL, ip, "weight_map", NULL);
	free(ip);
	free(d);
}

static void test_hf_paths(void **state)
{
	(void)state;
	/* a path to the .safetensors file, and to config.json */
	char *p = fmt("%s/stories260K-hf/model.safetensors", models_dir());
	struct model *m = expect_same_tokens(p, NULL, 0);
	assert_string_equal(m->format, "safetensors");
	model_free(m);
	free(p);
	p = fmt("%s/stories260K-hf/config.json", models_dir());
	m = expect_same_tokens(p, NULL, 0);
	model_free(m);
	free(p);
	/* an explicit tokenizer overrides the folder's */
	p = fmt("%s/stories260K-hf", models_dir());
	char *t = fmt("%s/tok512.model", models_dir());
	m = expect_same_tokens(p, t, 0);
	model_free(m);
	free(t);
	/* and a wrong one is caught */
	t = fmt("%s/tokenizer.model", models_dir());
	expect_fail(p, t, t, "32000", "512", NULL);
	free(t);
	free(p);
	/* model_free accepts NULL */
	model_free(NULL);
}

/* The chat template of a folder: tokenizer_config.json's chat_template (a
 * string, or the "default" entry of a list), else chat_template.jinja;
 * kept as text and classified. Malformed ones are errors naming the file. */
static void test_hf_chat_template(void **state)
{
	(void)state;
	char *d = hf_dir("tmpl", src_cfg, 1);
	put_st(d, NULL);
	char *tc = fmt("%s/tokenizer_config.json", d), *jinja = fmt("%s/chat_template.jinja", d);
	/* none */
	struct model *m = load_ok(d, NULL);
	assert_int_equal(m->chat_template, CHAT_TEMPLATE_AUTO);
	assert_null(m->chat_template_text);
	model_free(m);
	/* the real Llama 3 tokenizer_config.json (its model_max_length, 1e30,
	 * is no JSON integer jansson holds) */
	char *real = fmt("%s/llama3-tokenizer/tokenizer_config.json", models_dir());
	size_t n;
	uint8_t *b = (uint8_t *)slurp(real, &n);
	assert_non_null(b);
	spit(tc, b, n);
	free(b);
	json_t *rc = json_load_file(real, JSON_DECODE_INT_AS_REAL, NULL);
	const char *want = json_string_value(json_object_get(rc, "chat_template"));
	assert_non_null(want);
	m = load_ok(d, NULL);
	assert_int_equal(m->chat_template, CHAT_TEMPLATE_LLAMA3);
	assert_string_equal(m->chat_template_text, want);
	model_free(m);
	/* a list: the entry named default */
	static const char list[] =
		"{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"<|start_header_id|>"
		"<|eot_id|>\"}, {\"name\": \"default\", \"template\": \"[INST] <<SYS>> x\"}]}";
	spit(tc, list, sizeof(list) - 1);
	m = load_ok(d, NULL);
	assert_int_equal(m->chat_template, CHAT_TEMPLATE_LLAMA2);
	assert_string_equal(m->chat_template_text, "[INST] <<SYS>> x");
	model_free(m);
	/* no chat_template in it: chat_template.jinja */
	spit(tc, "{\"bos_token\": \"<s>\", \"chat_template\": null}", 43);
	spit(jinja, want, strlen(want));
	m = load_ok(d, NULL);
	assert_int_equal(m->chat_template, CHAT_TEMPLATE_LLAMA3);
	assert_string_equal(m->chat_template_text, want);
	model_free(m);
	/* tokenizer_config.json's wins over the file */
	spit(tc, "{\"chat_template\": \"{{ messages }}\"}", 35);
	m = load_ok(d, NULL);
	assert_int_equal(m->chat_template, CHAT_TEMPLATE_AUTO);
	assert_string_equal(m->chat_template_text, "{{ messages }}");
	model_free(m);
	/* malformed */
	spit(tc, "{\"chat_template\": ", 18);
	expect_fail(d, NULL, tc, NULL);
	spit(tc, "{\"chat_template\": 42}", 21);
	expect_fail(d, NULL, tc, "chat_template is neither a string nor a list", NULL);
	spit(tc, "{\"chat_template\": [{\"name\": \"default\"}]}", 40);
	expect_fail(d, NULL, tc, "an entry without a template string", NULL);
	json_decref(rc);
	free(real);
	free(tc);
	free(jinja);
	free(d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_missing_and_empty),
		cmocka_unit_test(test_truncated_bin),
		cmocka_unit_test(test_bad_header),
		cmocka_unit_test(test_foreign_formats),
		cmocka_unit_test(test_vocab_mismatch),
		cmocka_unit_test(test_hf_config),
		cmocka_unit_test(test_hf_safetensors_file),
		cmocka_unit_test(test_hf_tensors),
		cmocka_unit_test(test_hf_f32_matches_bin),
		cmocka_unit_test(test_hf_f16_bf16),
		cmocka_unit_test(test_hf_sharded),
		cmocka_unit_test(test_hf_paths),
		cmocka_unit_test(test_hf_chat_template),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

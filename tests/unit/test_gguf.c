/*
 * tests/unit/test_gguf.c — the GGUF loader (model/load_gguf.c): hyper-parameters,
 * weights, the tokenizer rebuilt from metadata, and malformed files.
 *
 * Files, from $MODELS (default ../shared/models) and $SHARED (../shared):
 *   stories260K.gguf                  GGUF v3, 48 F32 tensors, same weights
 *                                     as stories260K.bin (no Q/K permutation)
 *   stories260K.bin + tok512.model    the llama2.c reference
 *   ggml-vocab-llama-spm.gguf(.inp/.out)  vocab-only Llama 2 tokenizer and
 *                                     llama.cpp's test vectors
 *   reference/stories260K_greedy.txt  greedy text from llama2.c's run.c
 *
 * Variants (tied output, quantized types, F16 norms, extra tensors, other
 * metadata) are rebuilt from the parts of stories260K.gguf by a small GGUF
 * writer below; corrupt ones are the original bytes truncated or patched at
 * field offsets found by an independent walk of the file. Every malformed
 * file must give NULL and a cause naming the file, never a crash.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/unit/testutil.h"
#include "tests/unit/gguf_file.h"
#include "tests/unit/model_expect.h"

#include "kernels/backend.h"
#include "model/forward.h"
#include "model/model.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "text/vocab.h"
#include "tests/unit/tok_vectors.h"
#include "session/kvpool.h"

#define BLOCK 16
#define POOL_BLOCKS 64

struct fixture {
	char *gguf_path, *bin_path, *tok_path, *vocab_path;
	uint8_t *orig;          /* stories260K.gguf */
	size_t orig_len;
	struct gguf_walk w;     /* its independent walk */
	char tmpdir[256];
	struct model *gg, *bin;
	struct backend *be;
	struct kvpool *pool;
	int vocab;
};

static struct fixture *fx;

static void put64(uint8_t *p, uint64_t v)
{
	memcpy(p, &v, 8);
}

static void put32(uint8_t *p, uint32_t v)
{
	memcpy(p, &v, 4);
}

/* ---- the pristine file's walk -------------------------------------------------- */

static const struct gguf_kv_rec *kv_rec(const char *key)
{
	for (int i = 0; i < fx->w.n_kv; i++)
		if (!strcmp(fx->w.kv[i].key, key))
			return &fx->w.kv[i];
	fail_msg("no key %s in the original file", key);
	return NULL;
}

static const struct gguf_ti_rec *ti_rec(const char *name)
{
	for (int i = 0; i < fx->w.n_ti; i++)
		if (!strcmp(fx->w.ti[i].name, name))
			return &fx->w.ti[i];
	fail_msg("no tensor %s in the original file", name);
	return NULL;
}

/* ---- a GGUF writer for variants ----------------------------------------------- */

struct variant {
	struct gguf_buf kvs;    /* serialized key/value pairs */
	int n_kv;
	struct gguf_tensor t[80];
	int n_t;
	uint32_t alignment;
};

/* The original's metadata (minus keys named in skip, NULL-terminated) and
 * tensors (minus skip_tensor). */
static void variant_init(struct variant *v, const char *const *skip, const char *skip_tensor)
{
	memset(v, 0, sizeof(*v));
	v->alignment = 32;
	for (int i = 0; i < fx->w.n_kv; i++) {
		int drop = 0;
		for (int j = 0; skip && skip[j]; j++)
			drop |= !strcmp(skip[j], fx->w.kv[i].key);
		if (drop)
			continue;
		gguf_buf_add(&v->kvs, fx->orig + fx->w.kv[i].off, fx->w.kv[i].end - fx->w.kv[i].off);
		v->n_kv++;
	}
	for (int i = 0; i < fx->w.n_ti; i++) {
		const struct gguf_ti_rec *r = &fx->w.ti[i];
		if (skip_tensor && !strcmp(r->name, skip_tensor))
			continue;
		struct gguf_tensor *t = &v->t[v->n_t++];
		strcpy(t->name, r->name);
		t->n_dims = r->n_dims;
		memcpy(t->ne, r->ne, sizeof t->ne);
		t->type = r->type;
		assert_int_equal(r->type, 0);
		t->data = fx->orig + fx->w.data_start + r->offset;
		t->bytes = 4 * (size_t)(r->ne[0] * r->ne[1] * r->ne[2] * r->ne[3]);
	}
}

static struct gguf_tensor *variant_tensor(struct variant *v, const char *name)
{
	for (int i = 0; i < v->n_t; i++)
		if (!strcmp(v->t[i].name, name))
			return &v->t[i];
	fail_msg("variant has no tensor %s", name);
	return NULL;
}

static void variant_kv_u32(struct variant *v, const char *key, uint32_t val)
{
	gguf_buf_str(&v->kvs, key);
	gguf_buf_u32(&v->kvs, 4);
	gguf_buf_u32(&v->kvs, val);
	v->n_kv++;
}

static void variant_kv_str(struct variant *v, const char *key, const char *val)
{
	gguf_buf_str(&v->kvs, key);
	gguf_buf_u32(&v->kvs, 8);
	gguf_buf_str(&v->kvs, val);
	v->n_kv++;
}

/* Serialize: malloc'd bytes, length in *len. */
static uint8_t *variant_bytes(const struct variant *v, size_t *len)
{
	uint8_t *b = gguf_serialize(&v->kvs, v->n_kv, v->t, v->n_t, v->alignment, len);
	free(v->kvs.p);
	return b;
}

/* ---- files -------------------------------------------------------------------- */

static char *tmp_path(const char *name)
{
	return path_join(fx->tmpdir, name);
}

/* Write data as tmpdir/name, load it (no tokenizer override); expect NULL
 * and a cause naming the file and containing each of the NULL-terminated
 * strings. */
static void expect_fail(const char *name, const void *data, size_t len, ...)
{
	char *p = tmp_path(name);
	spit(p, data, len);
	va_list ap;
	va_start(ap, len);
	/* TEST_GGUF_VERBOSE: show every message */
	expect_load_fail_v(name, p, NULL, p, getenv("TEST_GGUF_VERBOSE") != NULL, ap);
	va_end(ap);
	unlink(p);
	free(p);
}

/* Load data written as tmpdir/name; must succeed. */
static struct model *load_ok(const char *name, const void *data, size_t len, const char *tok)
{
	char *p = tmp_path(name);
	spit(p, data, len);
	struct model *m = expect_load_ok(name, p, tok);
	unlink(p);
	free(p);
	return m;
}

/* A copy of the original. */
static uint8_t *orig_copy(void)
{
	uint8_t *b = malloc(fx->orig_len);
	assert_non_null(b);
	memcpy(b, fx->orig, fx->orig_len);
	return b;
}

/* ---- fixture -------------------------------------------------------------------- */

static int group_setup(void **state)
{
	(void)state;
	const char *models = env_or("MODELS", "../shared/models");
	fx = calloc(1, sizeof(*fx));
	if (!fx)
		return -1;
	fx->gguf_path = path_join(models, "stories260K.gguf");
	fx->bin_path = path_join(models, "stories260K.bin");
	fx->tok_path = path_join(models, "tok512.model");
	fx->vocab_path = path_join(models, "ggml-vocab-llama-spm.gguf");
	fx->orig = (uint8_t *)slurp(fx->gguf_path, &fx->orig_len);
	if (!fx->orig) {
		fprintf(stderr, "cannot read %s\n", fx->gguf_path);
		return -1;
	}
	gguf_walk(fx->orig, fx->orig_len, &fx->w);
	snprintf(fx->tmpdir, sizeof fx->tmpdir, "/tmp/llamad-test-gguf-XXXXXX");
	if (!mkdtemp(fx->tmpdir))
		return -1;
	char *cause = NULL;
	fx->gg = model_load(fx->gguf_path, NULL, &cause);
	if (!fx->gg)
		fprintf(stderr, "model_load %s: %s\n", fx->gguf_path, cause ? cause : "?");
	free(cause);
	cause = NULL;
	fx->bin = model_load(fx->bin_path, fx->tok_path, &cause);
	if (!fx->bin)
		fprintf(stderr, "model_load %s: %s\n", fx->bin_path, cause ? cause : "?");
	free(cause);
	if (!fx->gg || !fx->bin)
		return -1;
	fx->vocab = fx->gg->cfg.vocab;
	fx->be = backend_cpu_new(1);
	const struct model_config *c = &fx->gg->cfg;
	fx->pool = kvpool_new(POOL_BLOCKS, BLOCK, c->n_layers, model_kv_dim(c));
	return fx->be && fx->pool ? 0 : -1;
}

static int group_teardown(void **state)
{
	(void)state;
	if (fx) {
		model_free(fx->gg);
		model_free(fx->bin);
		backend_free(fx->be);
		kvpool_free(fx->pool);
		if (fx->tmpdir[0])
			rmdir(fx->tmpdir);
		free(fx->orig);
		free(fx->gguf_path);
		free(fx->bin_path);
		free(fx->tok_path);
		free(fx->vocab_path);
		free(fx);
	}
	return 0;
}

/* ---- forward helpers ----------------------------------------------------------------- */

static int run_seq(struct fwd *f, struct kvseq *s, const int32_t *tok, int n, int pos,
		   float *logits)
{
	assert_int_equal(kvseq_prepare(fx->pool, s, pos + n, pos), 0);
	struct fwd_seq q = { tok, n, pos, s->blocks, logits, 0 };
	return fwd_run(f, &fx->pool->kv, &q, 1);
}

/* The first golden block of the reference file (see test_forward.c). */
static char *golden_text(void)
{
	const char *shared = env_or("SHARED", "../shared");
	char *path = path_join(shared, "reference/stories260K_greedy.txt");
	size_t len;
	char *all = slurp(path, &len);
	if (!all)
		fail_msg("cannot read %s", path);
	free(path);
	static const char open[] = "--- stdout ---\n", close_[] = "--- end stdout ---";
	char *a = strstr(all, open);
	assert_non_null(a);
	a += sizeof open - 1;
	char *b = strstr(a, close_);
	assert_non_null(b);
	assert_true(b > a && b[-1] == '\n');
	b--;
	char *t = strndup(a, (size_t)(b - a));
	assert_non_null(t);
	free(all);
	return t;
}

/*
 * Greedy-generate from "Once upon a time" with m (its own tokenizer), 65 - n
 * tokens as run.c does for -n 64; if ref is given, run it in lockstep on
 * the same ids and require bit-identical logits at every step. Returns the
 * decoded text (malloc'd).
 */
static char *greedy(const struct model *m, const struct model *ref)
{
	int32_t *ids;
	int n = tok_encode(m->tok, "Once upon a time", 16, 1, &ids);
	assert_int_equal(n, 5);
	assert_int_equal(ids[0], m->cfg.bos);
	int n_gen = 65 - n;
	int32_t *all = malloc((size_t)(n + n_gen) * sizeof(int32_t));
	assert_non_null(all);
	memcpy(all, ids, (size_t)n * sizeof(int32_t));
	struct fwd *f = fwd_new(m, fx->be, 64), *g = ref ? fwd_new(ref, fx->be, 64) : NULL;
	assert_non_null(f);
	float *l = malloc((size_t)fx->vocab * sizeof(float));
	float *lr = malloc((size_t)fx->vocab * sizeof(float));
	assert_non_null(l);
	assert_non_null(lr);
	struct kvseq s = { 0 }, sr = { 0 };
	assert_int_equal(run_seq(f, &s, ids, n, 0, l), 0);
	if (g) {
		assert_int_equal(run_seq(g, &sr, ids, n, 0, lr), 0);
		assert_memory_equal(l, lr, (size_t)fx->vocab * sizeof(float));
	}
	int total = n;
	for (int i = 0; i < n_gen; i++) {
		int32_t t = argmax(l, fx->vocab);
		if (t == m->cfg.bos)
			break;
		all[total++] = t;
		if (i + 1 == n_gen)
			break;
		assert_int_equal(run_seq(f, &s, &t, 1, total - 1, l), 0);
		if (g) {
			assert_int_equal(run_seq(g, &sr, &t, 1, total - 1, lr), 0);
			if (memcmp(l, lr, (size_t)fx->vocab * sizeof(float)))
				fail_msg("logits differ from the reference at step %d", i);
		}
	}
	char *text = NULL;
	assert_true(tok_decode(m->tok, all, total, &text) >= 0);
	kvseq_release(fx->pool, &s);
	kvseq_release(fx->pool, &sr);
	fwd_free(f);
	fwd_free(g);
	free(l);
	free(lr);
	free(all);
	free(ids);
	return text;
}

/* ---- the good file --------------------------------------------------------------- */

static void test_hparams(void **state)
{
	(void)state;
	const struct model *m = fx->gg;
	const struct model_config *c = &m->cfg;
	assert_string_equal(m->format, "gguf");
	assert_int_equal(c->dim, 64);
	assert_int_equal(c->n_layers, 5);
	assert_int_equal(c->n_heads, 8);
	assert_int_equal(c->n_kv_heads, 4);
	assert_int_equal(c->head_dim, 8);
	assert_int_equal(c->ffn_dim, 172);
	assert_int_equal(c->vocab, 512);
	assert_int_equal(c->max_ctx, 2048);  /* the converter's default */
	assert_true(c->rms_eps == 1e-5f);
	assert_true(c->rope_theta == 10000.0f);
	assert_int_equal(c->rope_layout, KT_ROPE_INTERLEAVED);
	assert_int_equal(c->bos, 1);
	assert_int_equal(c->eos, 2);
	assert_int_equal(m->wtype, KT_F32);
	assert_int_equal(m->chat_template, CHAT_TEMPLATE_AUTO);
	assert_null(m->chat_template_text);
	assert_int_equal(fx->bin->chat_template, CHAT_TEMPLATE_AUTO);
	/* output.weight is present: its own copy, not the embedding */
	assert_ptr_not_equal(m->cls.data, m->embed.data);
	/* weights point into the file's map */
	const uint8_t *base = m->maps[0].addr;
	assert_ptr_equal(m->embed.data, base + fx->w.data_start + ti_rec("token_embd.weight")->offset);
	assert_ptr_equal(m->layers[4].ffn_norm,
			 base + fx->w.data_start + ti_rec("blk.4.ffn_norm.weight")->offset);
	/* tokenizer from the metadata */
	assert_non_null(m->tok);
	assert_int_equal(tok_n_vocab(m->tok), 512);
	assert_int_equal(tok_bos(m->tok), 1);
	assert_int_equal(tok_eos(m->tok), 2);
	assert_true(tok_is_control(m->tok, 0));
	uint8_t byte;
	assert_true(tok_is_byte(m->tok, 3, &byte));
	assert_int_equal(byte, 0);
	assert_true(tok_is_byte(m->tok, 258, &byte));
	assert_int_equal(byte, 0xff);
	char desc[256];
	model_describe(m, desc, sizeof desc);
	assert_non_null(strstr(desc, "gguf"));
}

/* Same weights as the .bin, bit for bit (the README's claim). */
static void test_weights_equal_bin(void **state)
{
	(void)state;
	const struct model *g = fx->gg, *b = fx->bin;
	const struct model_config *c = &g->cfg;
	size_t D = (size_t)c->dim, F = (size_t)c->ffn_dim, KV = (size_t)model_kv_dim(c);
#define SAME_W(x, y, n) do { \
		assert_int_equal((x).dtype, (y).dtype); \
		assert_int_equal((x).rows, (y).rows); \
		assert_int_equal((x).cols, (y).cols); \
		assert_memory_equal((x).data, (y).data, (n) * sizeof(float)); \
	} while (0)
	SAME_W(g->embed, b->embed, (size_t)c->vocab * D);
	SAME_W(g->cls, b->cls, (size_t)c->vocab * D);
	assert_memory_equal(g->final_norm, b->final_norm, D * sizeof(float));
	for (int l = 0; l < c->n_layers; l++) {
		const struct model_layer *x = &g->layers[l], *y = &b->layers[l];
		assert_memory_equal(x->att_norm, y->att_norm, D * sizeof(float));
		assert_memory_equal(x->ffn_norm, y->ffn_norm, D * sizeof(float));
		SAME_W(x->wq, y->wq, D * D);
		SAME_W(x->wk, y->wk, KV * D);
		SAME_W(x->wv, y->wv, KV * D);
		SAME_W(x->wo, y->wo, D * D);
		SAME_W(x->w1, y->w1, F * D);
		SAME_W(x->w2, y->w2, D * F);
		SAME_W(x->w3, y->w3, F * D);
	}
#undef SAME_W
}

/* Greedy text equals run.c's, and the logits equal the .bin's at every step. */
static void test_greedy_golden(void **state)
{
	(void)state;
	char *want = golden_text();
	char *got = greedy(fx->gg, fx->bin);
	if (strcmp(got, want) != 0)
		fail_msg("greedy output differs from run.c:\n got: [%s]\nwant: [%s]", got, want);
	free(got);
	free(want);
}

/* The metadata's vocabulary encodes like tok512.model. tok512 keeps
 * SentencePiece's default remove_extra_whitespaces (true) while the GGUF
 * has no such key and gets false, as llama.cpp does: they agree on text
 * without runs of spaces, and differ on it. */
static void test_tokenizer_vs_tok512(void **state)
{
	(void)state;
	static const char *const texts[] = {
		"Once upon a time",
		"Lily and her mom went to the park. They saw a big tree!",
		"Hello, world: 2024-01-02 at 10:30.",
		"line one\nline two\n\ttabbed",
		"h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x99\x82",  /* byte fallback */
		"x",
		"",
	};
	char *cause = NULL;
	struct tok *ref = tok_load(fx->tok_path, &cause);
	assert_non_null(ref);
	const struct tok *t = fx->gg->tok;
	for (int id = 0; id < 512; id++)
		assert_string_equal(tok_piece(t, id), tok_piece(ref, id));
	for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
		int32_t *a = NULL, *b = NULL;
		int na = tok_encode(t, texts[i], strlen(texts[i]), 1, &a);
		int nb = tok_encode(ref, texts[i], strlen(texts[i]), 1, &b);
		assert_true(na >= 1);
		if (na != nb || memcmp(a, b, (size_t)na * sizeof(int32_t)))
			fail_msg("\"%s\": GGUF tokenizer gives %d ids, tok512 %d", texts[i], na, nb);
		char *back = NULL;
		assert_true(tok_decode(t, a, na, &back) >= 0);
		assert_string_equal(back, texts[i]);
		free(back);
		free(a);
		free(b);
	}
	/* runs of spaces: kept by the GGUF tokenizer, collapsed by tok512 */
	const char *sp = "Once  upon";
	int32_t *a = NULL, *b = NULL;
	int na = tok_encode(t, sp, strlen(sp), 0, &a);
	int nb = tok_encode(ref, sp, strlen(sp), 0, &b);
	assert_true(na > nb);
	char *back = NULL;
	assert_true(tok_decode(t, a, na, &back) >= 0);
	assert_string_equal(back, sp);
	free(back);
	free(a);
	free(b);
	tok_free(ref);
}

/* --tokenizer wins over the metadata. */
static void test_tokenizer_override(void **state)
{
	(void)state;
	char *cause = NULL;
	struct model *m = model_load(fx->gguf_path, fx->tok_path, &cause);
	assert_non_null(m);
	int32_t *ids = NULL;
	/* tok512 collapses spaces: the override is the one in use */
	int n = tok_encode(m->tok, "Once  upon   a time", 19, 1, &ids);
	assert_int_equal(n, 5);
	free(ids);
	model_free(m);
	/* an override that does not exist is an error naming it */
	char *bad = tmp_path("no-such-tokenizer.model");
	assert_null(model_load(fx->gguf_path, bad, &cause));
	assert_non_null(cause);
	assert_non_null(strstr(cause, bad));
	free(cause);
	free(bad);
}

/* ---- the vocab-only Llama 2 file -------------------------------------------------- */

static void test_vocab_only_vectors(void **state)
{
	(void)state;
	char *cause = NULL;
	struct tok *t = tok_load_gguf(fx->vocab_path, &cause);
	if (!t)
		fail_msg("%s", cause ? cause : "?");
	assert_int_equal(tok_n_vocab(t), 32000);
	assert_int_equal(tok_bos(t), 1);
	assert_int_equal(tok_eos(t), 2);
	assert_int_equal(tok_drops_leading_space(t), 1);
	assert_string_equal(tok_piece(t, 450), "\xe2\x96\x81The");

	check_ggml_vectors(t, NULL);
	tok_free(t);

	/* as a model it has no weights */
	struct model *m = model_load(fx->vocab_path, NULL, &cause);
	assert_null(m);
	assert_non_null(strstr(cause, fx->vocab_path));
	assert_non_null(strstr(cause, "token_embd.weight"));
	free(cause);
	cause = NULL;

	/* tok_load_gguf on things that are not GGUF or carry no vocabulary */
	assert_null(tok_load_gguf(fx->tok_path, &cause));
	assert_non_null(strstr(cause, fx->tok_path));
	assert_non_null(strstr(cause, "GGUF"));
	free(cause);
	cause = NULL;
	static const char *const no_tok[] = {
		"tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.scores",
		"tokenizer.ggml.token_type", NULL,
	};
	struct variant v;
	variant_init(&v, no_tok, NULL);
	size_t len;
	uint8_t *b = variant_bytes(&v, &len);
	char *p = tmp_path("notok.gguf");
	spit(p, b, len);
	assert_null(tok_load_gguf(p, &cause));
	assert_non_null(strstr(cause, p));
	assert_non_null(strstr(cause, "no tokenizer"));
	free(cause);
	cause = NULL;
	assert_null(tok_load_gguf(fx->tmpdir, &cause));  /* a directory */
	assert_non_null(strstr(cause, fx->tmpdir));
	free(cause);
	unlink(p);
	free(p);
	free(b);
}

/* ---- variants ----------------------------------------------------------------------- */

/* No output.weight: the classifier is the embedding; same logits. No
 * tokenizer keys: tokenizer.model beside the file, else a clear error. */
static void test_tied_and_tokenizer_fallback(void **state)
{
	(void)state;
	static const char *const no_tok[] = {
		"tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.scores",
		"tokenizer.ggml.token_type", NULL,
	};
	struct variant v;
	variant_init(&v, no_tok, "output.weight");
	size_t len;
	uint8_t *b = variant_bytes(&v, &len);
	/* no tokenizer.model beside it */
	expect_fail("tied.gguf", b, len, "tokenizer.model", "--tokenizer", NULL);
	/* with one */
	size_t tl;
	char *tokdata = slurp(fx->tok_path, &tl);
	assert_non_null(tokdata);
	char *tp = tmp_path("tokenizer.model");
	spit(tp, tokdata, tl);
	struct model *m = load_ok("tied.gguf", b, len, NULL);
	unlink(tp);
	assert_ptr_equal(m->cls.data, m->embed.data);
	char *want = golden_text();
	char *got = greedy(m, fx->bin);
	assert_string_equal(got, want);
	free(got);
	free(want);
	model_free(m);
	free(tp);
	free(tokdata);
	free(b);
}

/* Quantized and half-precision tensors are mapped with the right dtype;
 * F16 norms become fp32; a Q8_0/Q4_0 row length must be a multiple of 32. */
static void test_dtypes(void **state)
{
	(void)state;
	static const char *const mats[] = { "attn_q", "attn_k", "attn_v", "attn_output",
					    "ffn_gate", "ffn_up" };
	struct variant v;
	variant_init(&v, NULL, NULL);
	size_t cap = 1 << 20;
	uint8_t *scratch = calloc(1, cap);
	assert_non_null(scratch);
	size_t used = 0;
	for (int l = 0; l < 5; l++)
		for (int i = 0; i < 6; i++) {
			char name[64];
			snprintf(name, sizeof name, "blk.%d.%s.weight", l, mats[i]);
			struct gguf_tensor *t = variant_tensor(&v, name);
			uint64_t n = t->ne[0] * t->ne[1];
			int q8 = (l + i) % 2 == 0;
			t->type = q8 ? 8 : 2;
			t->bytes = (size_t)(n / 32 * (q8 ? 34 : 18));
			assert_true(used + t->bytes <= cap);
			for (size_t k = 0; k < t->bytes; k++)  /* recognisable bytes */
				scratch[used + k] = (uint8_t)(k * 7 + l * 13 + i);
			t->data = scratch + used;
			used += t->bytes;
		}
	/* F16 final norm, BF16 ffn_down of layer 0 (172-wide rows: fine unquantized) */
	struct gguf_tensor *fn = variant_tensor(&v, "output_norm.weight");
	uint16_t h[64];
	const float *src = fn->data;
	for (int i = 0; i < 64; i++)
		h[i] = kt_f32_to_f16(src[i]);
	fn->type = 1;
	fn->data = h;
	fn->bytes = sizeof h;
	struct gguf_tensor *dn = variant_tensor(&v, "blk.0.ffn_down.weight");
	uint16_t *bf = malloc(172 * 64 * 2);
	assert_non_null(bf);
	for (int i = 0; i < 172 * 64; i++)
		bf[i] = kt_f32_to_bf16(((const float *)dn->data)[i]);
	dn->type = 30;
	dn->data = bf;
	dn->bytes = 172 * 64 * 2;
	size_t len;
	uint8_t *b = variant_bytes(&v, &len);
	struct model *m = load_ok("quant.gguf", b, len, NULL);
	assert_int_equal(m->wtype, KT_Q8_0);  /* blk.0.attn_q */
	assert_int_equal(m->layers[0].wq.dtype, KT_Q8_0);
	assert_int_equal(m->layers[0].wk.dtype, KT_Q4_0);
	assert_int_equal(m->layers[1].wq.dtype, KT_Q4_0);
	assert_int_equal(m->layers[0].w2.dtype, KT_BF16);
	assert_int_equal(m->layers[1].w2.dtype, KT_F32);
	assert_int_equal(m->layers[0].wq.rows, 64);
	assert_int_equal(m->layers[0].wq.cols, 64);
	assert_int_equal(m->layers[2].w3.rows, 172);
	/* the bytes are the ones written, in place */
	used = 0;
	for (int l = 0; l < 5; l++)
		for (int i = 0; i < 6; i++) {
			const struct kt_weight *w[6] = { &m->layers[l].wq, &m->layers[l].wk,
							 &m->layers[l].wv, &m->layers[l].wo,
							 &m->layers[l].w1, &m->layers[l].w3 };
			int q8 = (l + i) % 2 == 0;
			size_t bytes = (size_t)w[i]->rows * w[i]->cols / 32 * (q8 ? 34 : 18);
			assert_int_equal(w[i]->dtype, q8 ? KT_Q8_0 : KT_Q4_0);
			assert_memory_equal(w[i]->data, scratch + used, bytes);
			used += bytes;
		}
	assert_memory_equal(m->layers[0].w2.data, bf, 172 * 64 * 2);
	for (int i = 0; i < 64; i++)
		assert_true(m->final_norm[i] == kt_f16_to_f32(h[i]));
	/* quantized bytes count in the weight size and the fingerprint */
	size_t want_wb = (size_t)512 * 64 * 4;  /* output.weight, F32 */
	for (int l = 0; l < 5; l++) {
		const struct model_layer *L = &m->layers[l];
		const struct kt_weight *w[7] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->w1,
						 &L->w2, &L->w3 };
		for (int i = 0; i < 7; i++) {
			size_t blk = w[i]->dtype == KT_Q8_0 ? 34 : w[i]->dtype == KT_Q4_0 ? 18 : 0;
			size_t el = w[i]->dtype == KT_F32 ? 4 : 2;
			want_wb += blk ? (size_t)w[i]->rows * w[i]->cols / 32 * blk
				       : (size_t)w[i]->rows * w[i]->cols * el;
		}
	}
	assert_int_equal(m->weight_bytes, want_wb);
	uint64_t fp = m->fingerprint;
	model_free(m);
	uint8_t *at = memmem(b, len, scratch, 64);  /* blk.0.attn_q's bytes in the file */
	assert_non_null(at);
	at[40] ^= 1;
	m = load_ok("quant2.gguf", b, len, NULL);
	assert_true(m->fingerprint != fp);
	model_free(m);
	free(b);

	/* Q8_0 with 172-element rows */
	variant_init(&v, NULL, NULL);
	dn = variant_tensor(&v, "blk.3.ffn_down.weight");
	dn->type = 8;
	dn->bytes = 64 * 172;  /* whatever: refused before the size matters */
	b = variant_bytes(&v, &len);
	expect_fail("q8rows.gguf", b, len, "blk.3.ffn_down.weight", "multiple of 32", NULL);
	free(b);
	free(bf);
	free(scratch);
}

/*
 * Quantized files compute: every matrix whose rows are a multiple of 32
 * (all but ffn_down's 172) quantized to Q8_0 / Q4_0 with the kernels'
 * quantizer, against an F32 file holding the same weights dequantized. The
 * quantized matmul is defined to equal the f32 one on the dequantized row,
 * so the logits must be bit-identical at every greedy step.
 */
static void test_quant_compute(void **state)
{
	(void)state;
	static const uint32_t gtypes[2] = { 8, 2 };
	static const enum kt_dtype kts[2] = { KT_Q8_0, KT_Q4_0 };
	for (int k = 0; k < 2; k++) {
		struct variant vq, vd;
		variant_init(&vq, NULL, NULL);
		variant_init(&vd, NULL, NULL);
		void *bufs[2 * 80] = { 0 };
		int nb = 0;
		for (int i = 0; i < vq.n_t; i++) {
			struct gguf_tensor *q = &vq.t[i], *d = &vd.t[i];
			if (q->n_dims != 2 || q->ne[0] % 32)
				continue;
			size_t rows = (size_t)q->ne[1], cols = (size_t)q->ne[0];
			size_t rb = kt_row_bytes(kts[k], cols);
			uint8_t *qb = malloc(rows * rb);
			float *db = malloc(rows * cols * sizeof(float));
			assert_non_null(qb);
			assert_non_null(db);
			for (size_t r = 0; r < rows; r++) {
				const float *src = (const float *)q->data + r * cols;
				if (kts[k] == KT_Q8_0)
					kt_quantize_q8_0(src, qb + r * rb, cols);
				else
					kt_quantize_q4_0(src, qb + r * rb, cols);
				kt_row_to_f32(kts[k], qb + r * rb, db + r * cols, cols);
			}
			q->type = gtypes[k];
			q->data = qb;
			q->bytes = rows * rb;
			d->data = db;
			bufs[nb++] = qb;
			bufs[nb++] = db;
		}
		size_t lq, ld;
		uint8_t *bq = variant_bytes(&vq, &lq), *bd = variant_bytes(&vd, &ld);
		struct model *mq = load_ok("q.gguf", bq, lq, NULL);
		struct model *md = load_ok("deq.gguf", bd, ld, NULL);
		assert_int_equal(mq->wtype, kts[k]);
		assert_int_equal(mq->embed.dtype, kts[k]);
		assert_int_equal(mq->cls.dtype, kts[k]);
		assert_int_equal(mq->layers[3].w2.dtype, KT_F32);
		char desc[256];
		model_describe(mq, desc, sizeof desc);
		assert_non_null(strstr(desc, kt_dtype_name(kts[k])));
		assert_true(mq->weight_bytes < md->weight_bytes);
		/* exact path: logits bit-identical to the dequantized model's */
		struct backend *def = fx->be;
		setenv("LLAMAD_CPU_EXACT_Q", "1", 1);
		fx->be = backend_cpu_new(1);
		unsetenv("LLAMAD_CPU_EXACT_Q");
		assert_non_null(fx->be);
		char *text = greedy(mq, md);
		backend_free(fx->be);
		fx->be = def;
		/* default path (8-bit activations where the CPU has VNNI): Q8_0
		 * still gives the same greedy text */
		char *fast = greedy(mq, NULL);
		print_message("%s: %s\n%s, default path: %s\n", kt_dtype_name(kts[k]), text,
			      kt_dtype_name(kts[k]), fast);
		if (kts[k] == KT_Q8_0)
			assert_string_equal(fast, text);
		free(fast);
		free(text);
		model_free(mq);
		model_free(md);
		free(bq);
		free(bd);
		for (int i = 0; i < nb; i++)
			free(bufs[i]);
	}
}

/* Metadata and tensor-set variants that must be refused, and a few that
 * must load. */
static void test_variants(void **state)
{
	(void)state;
	struct variant v;
	size_t len;
	uint8_t *b;
	static const char *const arch[] = { "general.architecture", NULL };
	static const char *const tokm[] = { "tokenizer.ggml.model", NULL };
	static const char *const ropedim[] = { "llama.rope.dimension_count", NULL };
	static const char *const ffn[] = { "llama.feed_forward_length", NULL };
	static const char *const heads[] = { "llama.attention.head_count", NULL };

	variant_init(&v, arch, NULL);
	variant_kv_str(&v, "general.architecture", "falcon");
	b = variant_bytes(&v, &len);
	expect_fail("falcon.gguf", b, len, "architecture \"falcon\"", "not supported", NULL);
	free(b);

	variant_init(&v, arch, NULL);
	b = variant_bytes(&v, &len);
	expect_fail("noarch.gguf", b, len, "general.architecture", "missing", NULL);
	free(b);

	variant_init(&v, arch, NULL);
	variant_kv_u32(&v, "general.architecture", 7);
	b = variant_bytes(&v, &len);
	expect_fail("archtype.gguf", b, len, "general.architecture", "u32", NULL);
	free(b);

	/* a "gpt2" (BPE) vocabulary needs merges: SentencePiece pieces with no
	 * tokenizer.ggml.merges are refused (test_llama3.c has real ones) */
	variant_init(&v, tokm, NULL);
	variant_kv_str(&v, "tokenizer.ggml.model", "gpt2");
	b = variant_bytes(&v, &len);
	expect_fail("gpt2tok.gguf", b, len, "tokenizer.ggml.merges", "missing", NULL);
	/* ... which --tokenizer gets around */
	struct model *m = load_ok("gpt2tok.gguf", b, len, fx->tok_path);
	model_free(m);
	free(b);

	variant_init(&v, ropedim, NULL);
	variant_kv_u32(&v, "llama.rope.dimension_count", 4);
	b = variant_bytes(&v, &len);
	expect_fail("ropedim.gguf", b, len, "rope.dimension_count", "partial RoPE", NULL);
	free(b);

	variant_init(&v, ffn, NULL);
	variant_kv_u32(&v, "llama.feed_forward_length", 173);
	b = variant_bytes(&v, &len);
	expect_fail("ffn.gguf", b, len, "blk.0.ffn_gate.weight", "shape", NULL);
	free(b);

	variant_init(&v, ffn, NULL);
	b = variant_bytes(&v, &len);
	expect_fail("noffn.gguf", b, len, "llama.feed_forward_length", "missing", NULL);
	free(b);

	variant_init(&v, heads, NULL);
	variant_kv_u32(&v, "llama.attention.head_count", 6);
	b = variant_bytes(&v, &len);
	expect_fail("heads.gguf", b, len, "head_count", NULL);
	free(b);

	variant_init(&v, NULL, NULL);
	variant_kv_u32(&v, "llama.expert_count", 8);
	b = variant_bytes(&v, &len);
	expect_fail("moe.gguf", b, len, "mixture-of-experts", NULL);
	free(b);

	variant_init(&v, NULL, NULL);
	variant_kv_str(&v, "llama.rope.scaling.type", "yarn");
	b = variant_bytes(&v, &len);
	expect_fail("yarn.gguf", b, len, "RoPE scaling \"yarn\"", NULL);
	free(b);

	/* an extra tensor (a bias) is refused by name, not ignored */
	variant_init(&v, NULL, NULL);
	struct gguf_tensor *t = &v.t[v.n_t++];
	*t = *variant_tensor(&v, "blk.2.ffn_norm.weight");
	strcpy(t->name, "blk.2.attn_q.bias");
	b = variant_bytes(&v, &len);
	expect_fail("bias.gguf", b, len, "blk.2.attn_q.bias", "not supported", NULL);
	free(b);

	/* a missing tensor */
	variant_init(&v, NULL, "blk.3.attn_v.weight");
	b = variant_bytes(&v, &len);
	expect_fail("missing.gguf", b, len, "blk.3.attn_v.weight", "missing", NULL);
	free(b);

	/* an unsupported K-quant tensor, a supported one whose rows are not
	 * whole 256-weight super-blocks, and an unknown type */
	variant_init(&v, NULL, NULL);
	variant_tensor(&v, "blk.0.attn_q.weight")->type = 10;
	b = variant_bytes(&v, &len);
	expect_fail("q2k.gguf", b, len, "tensor blk.0.attn_q.weight has type Q2_K",
		    "does not support", NULL);
	free(b);
	variant_init(&v, NULL, NULL);
	variant_tensor(&v, "blk.0.attn_q.weight")->type = 12;
	b = variant_bytes(&v, &len);
	expect_fail("q4k.gguf", b, len, "tensor blk.0.attn_q.weight of type Q4_K",
		    "not a multiple of 256", NULL);
	free(b);

	/* version 2 has the same layout */
	b = orig_copy();
	put32(b + 4, 2);
	m = load_ok("v2.gguf", b, fx->orig_len, NULL);
	assert_int_equal(m->cfg.n_layers, 5);
	model_free(m);
	free(b);

	/* alignment 64: loads, same greedy text */
	variant_init(&v, NULL, NULL);
	variant_kv_u32(&v, "general.alignment", 64);
	v.alignment = 64;
	b = variant_bytes(&v, &len);
	m = load_ok("align64.gguf", b, len, NULL);
	char *want = golden_text(), *got = greedy(m, NULL);
	assert_string_equal(got, want);
	free(got);
	free(want);
	model_free(m);
	free(b);

	variant_init(&v, NULL, NULL);
	variant_kv_u32(&v, "general.alignment", 24);
	b = variant_bytes(&v, &len);
	expect_fail("align24.gguf", b, len, "general.alignment", NULL);
	free(b);

	/* chat templates */
	variant_init(&v, NULL, NULL);
	variant_kv_str(&v, "tokenizer.chat_template",
		       "{% for message in messages %}[INST] <<SYS>>\n{{ x }}\n<</SYS>>\n\n"
		       "{{ message['content'] }} [/INST]{% endfor %}");
	b = variant_bytes(&v, &len);
	m = load_ok("chat.gguf", b, len, NULL);
	assert_int_equal(m->chat_template, CHAT_TEMPLATE_LLAMA2);
	model_free(m);
	free(b);
	variant_init(&v, NULL, NULL);
	variant_kv_str(&v, "tokenizer.chat_template",
		       "{% for m in messages %}<|im_start|>{{ m.role }}\n{% endfor %}");
	b = variant_bytes(&v, &len);
	m = load_ok("chatml.gguf", b, len, NULL);
	assert_int_equal(m->chat_template, CHAT_TEMPLATE_AUTO);
	assert_string_equal(m->chat_template_text,  /* kept: the daemon says it is unknown */
			    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% endfor %}");
	model_free(m);
	free(b);
	static const char l3[] = "{% for message in messages %}<|start_header_id|>"
				 "{{ message['role'] }}<|end_header_id|>\n\n{{ message['content'] "
				 "| trim }}<|eot_id|>{% endfor %}";
	variant_init(&v, NULL, NULL);
	variant_kv_str(&v, "tokenizer.chat_template", l3);
	b = variant_bytes(&v, &len);
	m = load_ok("llama3.gguf", b, len, NULL);
	assert_int_equal(m->chat_template, CHAT_TEMPLATE_LLAMA3);
	assert_string_equal(m->chat_template_text, l3);
	model_free(m);
	free(b);

	/* add_space_prefix false reaches the normalizer */
	variant_init(&v, NULL, NULL);
	gguf_buf_str(&v.kvs, "tokenizer.ggml.add_space_prefix");
	gguf_buf_u32(&v.kvs, 7);
	gguf_buf_add(&v.kvs, "\0", 1);
	v.n_kv++;
	b = variant_bytes(&v, &len);
	m = load_ok("nospace.gguf", b, len, NULL);
	int32_t *ids = NULL;
	int n = tok_encode(m->tok, "Once", 4, 0, &ids);
	assert_true(n >= 1);
	assert_true(strncmp(tok_piece(m->tok, ids[0]), "\xe2\x96\x81", 3) != 0);
	assert_int_equal(tok_drops_leading_space(m->tok), 0);
	free(ids);
	model_free(m);
	free(b);
}

/* ---- corrupt files ------------------------------------------------------------------- */

/* Truncations at many offsets, every one a clear failure. */
static void test_truncated(void **state)
{
	(void)state;
	const struct gguf_kv_rec *tk = kv_rec("tokenizer.ggml.tokens");
	size_t fixed[] = {
		0, 3, 4, 8, 20, 23, 24, 24 + 5, tk->val_off + 6, tk->val_off + 2000,
		kv_rec("llama.block_count")->val_off + 2, fx->w.kv[fx->w.n_kv - 1].end - 1,
		fx->w.ti[0].off + 4, fx->w.ti[10].ne_off + 3, fx->w.ti[20].offset_off + 7,
		fx->w.infos_end - 1, fx->w.infos_end, fx->w.infos_end + 5, fx->w.data_start,
		fx->w.data_start + 100, fx->orig_len / 2, fx->orig_len - 256,
		fx->orig_len - 1,
	};
	int n = 0;
	for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++, n++)
		expect_fail("trunc.gguf", fx->orig, fixed[i], NULL);
	/* every 37th offset through the metadata and descriptors, then the data */
	for (size_t off = 0; off < fx->w.data_start + 64; off += 37, n++)
		expect_fail("trunc.gguf", fx->orig, off, NULL);
	for (size_t off = fx->w.data_start; off < fx->orig_len; off += 9973, n++)
		expect_fail("trunc.gguf", fx->orig, off, NULL);
	assert_true(n > 400);
	/* the messages say what is wrong */
	expect_fail("t0.gguf", fx->orig, 0, "empty", NULL);
	expect_fail("t3.gguf", fx->orig, 3, "GGUF", NULL);
	expect_fail("t20.gguf", fx->orig, 20, "truncated", NULL);
	expect_fail("tkv.gguf", fx->orig, tk->val_off + 2000, "truncated",
		    "tokenizer.ggml.tokens", NULL);
	expect_fail("tti.gguf", fx->orig, fx->w.ti[10].ne_off + 3, "truncated",
		    fx->w.ti[10].name, NULL);
	expect_fail("tdata.gguf", fx->orig, fx->orig_len - 1, "blk.4.ffn_norm.weight",
		    "past the end", NULL);
	/* tok_load_gguf sees truncations too */
	char *p = tmp_path("tt.gguf");
	spit(p, fx->orig, tk->val_off + 100);
	char *cause = NULL;
	assert_null(tok_load_gguf(p, &cause));
	assert_non_null(strstr(cause, p));
	assert_non_null(strstr(cause, "truncated"));
	free(cause);
	unlink(p);
	free(p);
}

/* Patched counts, lengths, types and offsets. */
static void test_patched(void **state)
{
	(void)state;
	uint8_t *b = orig_copy();
	size_t L = fx->orig_len;
	const struct gguf_kv_rec *tk = kv_rec("tokenizer.ggml.tokens");
	const struct gguf_ti_rec *q = ti_rec("blk.0.attn_q.weight");
	const struct gguf_ti_rec *last = &fx->w.ti[fx->w.n_ti - 1];

#define PATCH(setup, ...) do { \
		memcpy(b, fx->orig, L); \
		setup; \
		expect_fail("patched.gguf", b, L, __VA_ARGS__, NULL); \
	} while (0)

	PATCH(memcpy(b, "GGUG", 4), "not a GGUF file");
	PATCH(put32(b + 4, 1), "version 1");
	PATCH(put32(b + 4, 4), "unsupported GGUF version 4");
	PATCH(put32(b + 4, 0x03000000), "big-endian");
	PATCH(put64(b + 16, UINT64_MAX), "key/value pairs");
	PATCH(put64(b + 16, 1ull << 40), "key/value pairs");
	PATCH(put64(b + 16, 5000), "GGUF");
	PATCH(put64(b + 8, UINT64_MAX), "tensors");
	PATCH(put64(b + 8, 1ull << 33), "tensors");
	PATCH(put64(b + 8, 49), "tensor 48");
	PATCH(put64(b + 8, 47), "blk.4.ffn_norm.weight", "missing");
	/* a huge key length, a huge string length, a huge array count */
	PATCH(put64(b + 24, UINT64_MAX), "truncated", "key 0");
	PATCH(put64(b + 24, 1ull << 62), "truncated", "key 0");
	PATCH(put64(b + kv_rec("general.architecture")->val_off, UINT64_MAX - 3),
	      "general.architecture", "truncated");
	PATCH(put64(b + tk->val_off + 12, UINT64_MAX), "truncated");  /* first token */
	PATCH(put64(b + tk->val_off + 4, UINT64_MAX), "tokenizer.ggml.tokens", "claims");
	PATCH(put64(b + tk->val_off + 4, 1ull << 61), "tokenizer.ggml.tokens", "claims");
	PATCH(put64(b + kv_rec("tokenizer.ggml.scores")->val_off + 4, 1ull << 62),
	      "tokenizer.ggml.scores", "claims");
	/* unknown value and element types */
	PATCH(put32(b + kv_rec("llama.block_count")->type_off, 99),
	      "llama.block_count", "unknown value type 99");
	PATCH(put32(b + tk->type_off, 13), "unknown value type 13");
	PATCH(put32(b + tk->val_off, 99), "tokenizer.ggml.tokens", "unknown element type 99");
	/* a hyper-parameter of the wrong type or out of range */
	PATCH(put32(b + kv_rec("llama.block_count")->type_off, 6), "llama.block_count",
	      "expected an integer");
	PATCH(put32(b + kv_rec("llama.block_count")->val_off, 0), "llama.block_count",
	      "out of range");
	PATCH(put32(b + kv_rec("llama.block_count")->val_off, 0x80000000u),
	      "llama.block_count", "out of range");
	PATCH(put32(b + kv_rec("llama.block_count")->val_off, 6), "blk.5");
	PATCH(put32(b + kv_rec("llama.attention.head_count_kv")->val_off, 3), "kv head");
	PATCH(put32(b + kv_rec("llama.embedding_length")->val_off, 1u << 20), "dim");
	/* the wrong architecture string (same length) */
	PATCH(memcpy(b + kv_rec("general.architecture")->val_off + 8, "qwen2", 5),
	      "architecture \"qwen2\"");
	PATCH(memcpy(b + kv_rec("tokenizer.ggml.model")->val_off + 8, "bert5", 5),
	      "tokenizer model \"bert5\"");
	/* tokenizer arrays that disagree */
	PATCH(put32(b + kv_rec("tokenizer.ggml.scores")->val_off, 5),
	      "tokenizer.ggml.scores", "not an array of f32");
	PATCH(put32(b + kv_rec("tokenizer.ggml.token_type")->val_off + 12 + 4 * 100, 9),
	      "token 100", "unknown token type 9");
	PATCH(put32(b + kv_rec("tokenizer.ggml.token_type")->val_off + 12 + 4 * 7, 2),
	      "unk is already defined");
	PATCH(memcpy(b + tk->val_off + 12 + 8, "<s>\0\0", 5), "NUL");
	/* tensor descriptors */
	PATCH(put32(b + q->ndims_off, 9), "blk.0.attn_q.weight", "9 dimensions");
	PATCH(put32(b + q->ndims_off, 0), "blk.0.attn_q.weight", "0 dimensions");
	PATCH(put64(b + q->ne_off, 1ull << 62), "blk.0.attn_q.weight", "bad shape");
	PATCH(put64(b + q->ne_off, 0), "blk.0.attn_q.weight", "bad shape");
	PATCH(put64(b + q->ne_off + 8, 0x100000040ull), "blk.0.attn_q.weight", "bad shape");
	PATCH(put64(b + q->ne_off, 0x7fffffff); put64(b + q->ne_off + 8, 0x7fffffff),
	      "blk.0.attn_q.weight", "past the end");
	PATCH(put64(b + q->ne_off + 8, 65), "blk.0.attn_q.weight", "shape");
	PATCH(put32(b + q->type_off, 10), "tensor blk.0.attn_q.weight has type Q2_K");
	PATCH(put32(b + q->type_off, 11), "has type Q3_K");
	PATCH(put32(b + q->type_off, 14), "blk.0.attn_q.weight", "Q6_K", "multiple of 256");
	PATCH(put32(b + q->type_off, 99), "blk.0.attn_q.weight", "unknown ggml type 99");
	PATCH(put64(b + q->offset_off, 1ull << 40), "blk.0.attn_q.weight", "past the end");
	PATCH(put64(b + q->offset_off, UINT64_MAX - 31), "blk.0.attn_q.weight", "past the end");
	PATCH(put64(b + q->offset_off, q->offset + 4), "blk.0.attn_q.weight", "alignment");
	PATCH(put64(b + last->offset_off, last->offset + 32), last->name, "past the end");
	PATCH(put64(b + last->off, 0), "name of 0 bytes");
	PATCH(put64(b + last->off, 5000), "name of 5000 bytes");
#undef PATCH
	free(b);
}

/* 300 seeded random mutations of the metadata and descriptors: loads may
 * fail or (for harmless bytes) succeed, but never crash or leak. */
static void test_random_mutations(void **state)
{
	(void)state;
	uint64_t seed = 0x9e3779b97f4a7c15ull;
	uint8_t *b = orig_copy();
	char *p = tmp_path("mut.gguf");
	/* structural fields: counts, lengths, types, dims, offsets */
	size_t fields[256];
	int nf = 0;
	fields[nf++] = 4;
	fields[nf++] = 8;
	fields[nf++] = 16;
	for (int i = 0; i < fx->w.n_kv; i++) {
		fields[nf++] = fx->w.kv[i].off;
		fields[nf++] = fx->w.kv[i].type_off;
		fields[nf++] = fx->w.kv[i].val_off;
	}
	for (int i = 0; i < fx->w.n_ti && nf < 250; i += 3) {
		fields[nf++] = fx->w.ti[i].ndims_off;
		fields[nf++] = fx->w.ti[i].ne_off;
		fields[nf++] = fx->w.ti[i].type_off;
		fields[nf++] = fx->w.ti[i].offset_off;
	}
	int loaded = 0;
	for (int iter = 0; iter < 300; iter++) {
		memcpy(b, fx->orig, fx->orig_len);
		int k = 1 + (int)((seed >> 33) % 4);
		for (int j = 0; j < k; j++) {
			seed = seed * 6364136223846793005ull + 1442695040888963407ull;
			uint64_t r = seed >> 16;
			size_t off;
			if (r & 1) {
				off = fields[(r >> 1) % (uint64_t)nf];
				static const uint64_t vals[] = { 0, 1, 2, 9, 13, 99, 0xff,
								 0x7fffffff, 0xffffffff,
								 1ull << 32, 1ull << 62,
								 UINT64_MAX };
				uint64_t v = vals[(r >> 20) % 12];
				size_t w = (r >> 30) & 1 ? 8 : 4;
				if (off + w <= fx->w.infos_end)
					memcpy(b + off, &v, w);
			} else {
				off = (size_t)((r >> 1) % fx->w.data_start);
				b[off] ^= (uint8_t)(1u << ((r >> 40) % 8));
			}
		}
		size_t len = fx->orig_len;
		if (iter % 10 == 9)
			len = (size_t)((seed >> 20) % fx->orig_len);
		spit(p, b, len);
		char *cause = NULL;
		struct model *m = model_load(p, NULL, &cause);
		if (m) {
			loaded++;
			model_free(m);
		} else {
			assert_non_null(cause);
			assert_non_null(strstr(cause, p));
		}
		free(cause);
		cause = NULL;
		struct tok *t = tok_load_gguf(p, &cause);
		if (!t)
			assert_non_null(cause);
		tok_free(t);
		free(cause);
	}
	print_message("random mutations: %d of 300 still loaded\n", loaded);
	unlink(p);
	free(p);
	free(b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hparams),
		cmocka_unit_test(test_weights_equal_bin),
		cmocka_unit_test(test_greedy_golden),
		cmocka_unit_test(test_tokenizer_vs_tok512),
		cmocka_unit_test(test_tokenizer_override),
		cmocka_unit_test(test_vocab_only_vectors),
		cmocka_unit_test(test_tied_and_tokenizer_fallback),
		cmocka_unit_test(test_dtypes),
		cmocka_unit_test(test_quant_compute),
		cmocka_unit_test(test_variants),
		cmocka_unit_test(test_truncated),
		cmocka_unit_test(test_patched),
		cmocka_unit_test(test_random_mutations),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

/*
 * tests/unit/test_llama3.c — Llama 3 models end to end: a random-weight
 * llama3-tiny (dim 64, 2 layers, 4 heads / 1 kv head, head_dim 16, vocab
 * 128256, tied embeddings, rope_theta 500000 with llama3 RoPE scaling, 128k
 * context) made by llamad-genmodel as a Hugging Face folder (f32), converted
 * by llamad-quantize --type f32 to GGUF.
 *
 *   - the RoPE divisor table against the formula (computed here
 *     independently), the same in both formats, and inv_freq bit-identical;
 *   - logits of the two formats bit-identical (memcmp) for 41 rows at
 *     positions 8200..8240 (past original_max_position_embeddings 8192)
 *     after an 8200-token prefill, and for 16 greedy steps after them; the
 *     same folder without rope_scaling gives different logits;
 *   - tied embeddings: neither file has a classifier tensor and both models
 *     use the embedding;
 *   - the GGUF's "gpt2" vocabulary equals the tokenizer.json one;
 *   - the fingerprint covers the RoPE table;
 *   - an independent numpy forward pass (tests/tools/llama3_ref.py, float64)
 *     over the same 8241 ids: the same 16 greedy tokens, logits within
 *     REF_TOL (the maximum difference is printed);
 *   - malformed GGUF and config.json variants refused naming the file and
 *     the reason.
 *
 * Env: BUILD (build), MODELS (../shared/models), PYTHON (/usr/bin/python3:
 * the one with numpy), SRC (.: where tests/tools/llama3_ref.py is).
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
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "tests/unit/testutil.h"
#include "tests/unit/gguf_file.h"
#include "tests/unit/model_expect.h"

#include "kernels/backend.h"
#include "model/forward.h"
#include "model/model.h"
#include "text/tokenizer.h"
#include "text/vocab.h"
#include "session/kvpool.h"

#define BLOCK 16
#define N_PRE 8200               /* prefilled before the compared rows */
#define N_ROWS 41                /* rows with all logits: positions 8200..8240 */
#define N_PROMPT (N_PRE + N_ROWS)
#define N_GEN 16                 /* greedy steps after the prompt */
#define POOL_BLOCKS ((N_PROMPT + N_GEN) / BLOCK + 4)
#define HALF 8                   /* head_dim / 2 */
/* numpy float64 vs llamad's float32: the logits are O(1) sums of ~1e3
 * products; float32 rounding through two layers stays near 1e-5 (measured
 * 2.5e-6), so 1e-3 is loose yet far below the differences that a wrong
 * RoPE table makes (~1e-1, see test_formats_bit_identical). */
#define REF_TOL 1e-3
/* refusals print their causes */
#define VERBOSE (getenv("TEST_LLAMA3_VERBOSE") != NULL)

/* One greedy run: the N_ROWS prompt rows, then the logits each greedy
 * choice was made from (n_steps rows) and the ids chosen (n_gen; one less
 * than n_steps if an end-of-turn id stopped it). */
struct run {
	float *rows;
	float *steps;
	int n_steps;
	int32_t ids[N_GEN];
	int n_gen;
};

/* ---- a GGUF file as parts, to rewrite -------------------------------------- */

struct gkv {
	char key[128];
	uint32_t type;
	const uint8_t *val;      /* value bytes (after the type) */
	size_t vlen;
};

struct gg {
	struct gkv kv[64];
	int nkv;
	struct gguf_tensor t[64];
	int nt;
	void *own[16];           /* buffers the variant made */
	int n_own;
};

struct fixture {
	char dir[256];
	char *hf, *gguf, *plain;    /* folder, its GGUF, the folder without rope_scaling */
	struct model *mh, *mg, *mp;
	struct backend *be;
	struct kvpool *pool;
	int vocab;
	int32_t prompt[N_PROMPT];
	struct run rh, rg, rp;      /* lazily run */
	int ran_h, ran_g, ran_p;
	uint8_t *gbytes;
	size_t glen;
	struct gg parsed;
};

static struct fixture *fx;

static const char *build_dir(void)
{
	return env_or("BUILD", "build");
}

static const char *models_dir(void)
{
	return env_or("MODELS", "../shared/models");
}

static int run_cmd(const char *cmd)
{
	int rc = system(cmd);
	if (rc != 0)
		fprintf(stderr, "test_llama3: '%s' exited %d\n", cmd, rc);
	return rc;
}

/* ---- GGUF parts (from gguf_file.h's independent walk) and writing ---------- */

/* The f32 file b[0..len) as parts pointing into it. */
static void gg_parse(const uint8_t *b, size_t len, struct gg *g)
{
	static struct gguf_walk w;
	gguf_walk(b, len, &w);
	memset(g, 0, sizeof(*g));
	for (int i = 0; i < w.n_kv; i++) {
		struct gkv *k = &g->kv[g->nkv++];
		memcpy(k->key, w.kv[i].key, sizeof(k->key));
		k->type = w.kv[i].type;
		k->val = b + w.kv[i].val_off;
		k->vlen = w.kv[i].end - w.kv[i].val_off;
	}
	for (int i = 0; i < w.n_ti; i++) {
		const struct gguf_ti_rec *r = &w.ti[i];
		struct gguf_tensor *t = &g->t[g->nt++];
		memcpy(t->name, r->name, sizeof(t->name));
		t->n_dims = r->n_dims;
		memcpy(t->ne, r->ne, sizeof(t->ne));
		t->type = r->type;
		assert_true(t->type == 0 || t->type == 1);  /* the f32 file: F32 (and F16) */
		t->bytes = (size_t)(r->ne[0] * r->ne[1] * r->ne[2] * r->ne[3]) * (t->type ? 2 : 4);
		assert_true(w.data_start + r->offset + t->bytes <= len);
		t->data = b + w.data_start + r->offset;
	}
}

static void *gg_own(struct gg *g, size_t n)
{
	assert_true(g->n_own < 16);
	void *p = calloc(1, n ? n : 1);
	assert_non_null(p);
	g->own[g->n_own++] = p;
	return p;
}

static void gg_done(struct gg *g)
{
	for (int i = 0; i < g->n_own; i++)
		free(g->own[i]);
	g->n_own = 0;
}

static struct gkv *gg_kv(struct gg *g, const char *key)
{
	for (int i = 0; i < g->nkv; i++)
		if (!strcmp(g->kv[i].key, key))
			return &g->kv[i];
	return NULL;
}

static struct gguf_tensor *gg_t(struct gg *g, const char *name)
{
	for (int i = 0; i < g->nt; i++)
		if (!strcmp(g->t[i].name, name))
			return &g->t[i];
	return NULL;
}

static void gg_del_kv(struct gg *g, const char *key)
{
	struct gkv *k = gg_kv(g, key);
	assert_non_null(k);
	*k = g->kv[--g->nkv];
}

static void gg_del_t(struct gg *g, const char *name)
{
	struct gguf_tensor *t = gg_t(g, name);
	assert_non_null(t);
	*t = g->t[--g->nt];
}

/* Set key to a value of type (bytes copied), replacing or adding it. */
static void gg_set_kv(struct gg *g, const char *key, uint32_t type, const void *val, size_t n)
{
	struct gkv *k = gg_kv(g, key);
	if (!k) {
		assert_true(g->nkv < 64);
		k = &g->kv[g->nkv++];
		snprintf(k->key, sizeof(k->key), "%s", key);
	}
	uint8_t *v = gg_own(g, n);
	memcpy(v, val, n);
	k->type = type;
	k->val = v;
	k->vlen = n;
}

static void gg_set_str(struct gg *g, const char *key, const char *s)
{
	struct gguf_buf v = { 0 };
	gguf_buf_str(&v, s);
	gg_set_kv(g, key, 8, v.p, v.n);
	free(v.p);
}

/* An array of n u32 values (element type et: 4 u32, 5 i32). */
static void gg_set_u32s(struct gg *g, const char *key, uint32_t et, const uint32_t *x, size_t n)
{
	struct gguf_buf v = { 0 };
	gguf_buf_u32(&v, et);
	gguf_buf_u64(&v, n);
	for (size_t i = 0; i < n; i++)
		gguf_buf_u32(&v, x[i]);
	gg_set_kv(g, key, 9, v.p, v.n);
	free(v.p);
}

/* Set a tensor (1-D of n elements or 2-D), replacing or adding it. */
static void gg_set_t(struct gg *g, const char *name, uint32_t type, uint64_t ne0, uint64_t ne1,
		     const void *data, size_t bytes)
{
	struct gguf_tensor *t = gg_t(g, name);
	if (!t) {
		assert_true(g->nt < 64);
		t = &g->t[g->nt++];
		snprintf(t->name, sizeof(t->name), "%s", name);
	}
	t->n_dims = ne1 ? 2 : 1;
	t->ne[0] = ne0;
	t->ne[1] = ne1;
	t->type = type;
	uint8_t *d = gg_own(g, bytes);
	memcpy(d, data, bytes);
	t->data = d;
	t->bytes = bytes;
}

/* The parts as a GGUF file (data aligned to 32, as llamad-quantize writes). */
static void gg_write(const struct gg *g, const char *path)
{
	struct gguf_buf kvs = { 0 };
	for (int i = 0; i < g->nkv; i++) {
		gguf_buf_str(&kvs, g->kv[i].key);
		gguf_buf_u32(&kvs, g->kv[i].type);
		gguf_buf_add(&kvs, g->kv[i].val, g->kv[i].vlen);
	}
	size_t len;
	uint8_t *b = gguf_serialize(&kvs, g->nkv, g->t, g->nt, 32, &len);
	free(kvs.p);
	spit(path, b, len);
	free(b);
}

/* ---- HF folder variants ------------------------------------------------------- */

/* A folder dir/name holding links to the weights and tokenizer files of the
 * generated folder and config.json = its config changed by edit. */
static char *hf_variant(const char *name, void (*edit)(json_t *), int with_tokenizer)
{
	char *d = fmt("%s/%s", fx->dir, name);
	mkdir(d, 0777);
	static const char *const files[] = { "model.safetensors", "tokenizer.json",
					     "tokenizer_config.json", "generation_config.json" };
	for (size_t i = 0; i < 4; i++) {
		if (i > 0 && !with_tokenizer)
			break;
		char *src = fmt("%s/%s", fx->hf, files[i]), *dst = fmt("%s/%s", d, files[i]);
		unlink(dst);
		assert_int_equal(symlink(src, dst), 0);
		free(src);
		free(dst);
	}
	char *src = fmt("%s/config.json", fx->hf), *dst = fmt("%s/config.json", d);
	json_t *c = json_load_file(src, 0, NULL);
	assert_non_null(c);
	edit(c);
	assert_int_equal(json_dump_file(c, dst, JSON_INDENT(1)), 0);
	json_decref(c);
	free(src);
	free(dst);
	return d;
}

static void drop_scaling(json_t *c)
{
	json_object_del(c, "rope_scaling");
}

/* model_load of path must fail with a cause naming `names` (the file) and
 * containing each NULL-terminated string. */
static void expect_fail(const char *path, const char *names, ...)
{
	va_list ap;
	va_start(ap, names);
	expect_load_fail_v(path, path, NULL, names, VERBOSE, ap);
	va_end(ap);
}

static struct model *load_ok(const char *path)
{
	return expect_load_ok(path, path, NULL);
}

/* ---- fixture ------------------------------------------------------------------ */

static int group_setup(void **state)
{
	(void)state;
	fx = calloc(1, sizeof(*fx));
	if (!fx)
		return -1;
	snprintf(fx->dir, sizeof(fx->dir), "/tmp/llamad-test-llama3-XXXXXX");
	if (!mkdtemp(fx->dir)) {
		perror("mkdtemp");
		return -1;
	}
	char *hf = NULL, *gg = NULL, *cmd = NULL;
	if (asprintf(&hf, "%s/hf", fx->dir) < 0 || asprintf(&gg, "%s/tiny.gguf", fx->dir) < 0 ||
	    asprintf(&cmd, "%s/llamad-genmodel --shape llama3-tiny --out %s --tokenizer "
		     "%s/llama3-tokenizer/tokenizer.json >%s/genmodel.log 2>&1 && "
		     "%s/llamad-quantize --model %s --type f32 --out %s >%s/quantize.log 2>&1",
		     build_dir(), hf, models_dir(), fx->dir, build_dir(), hf, gg, fx->dir) < 0)
		return -1;
	fx->hf = hf;
	fx->gguf = gg;
	int rc = run_cmd(cmd);
	free(cmd);
	if (rc)
		return -1;
	char *cause = NULL;
	fx->mh = model_load(fx->hf, NULL, &cause);
	if (!fx->mh) {
		fprintf(stderr, "test_llama3: %s\n", cause);
		free(cause);
		return -1;
	}
	fx->mg = model_load(fx->gguf, NULL, &cause);
	if (!fx->mg) {
		fprintf(stderr, "test_llama3: %s\n", cause);
		free(cause);
		return -1;
	}
	fx->gbytes = (uint8_t *)slurp(fx->gguf, &fx->glen);
	if (!fx->gbytes)
		return -1;
	gg_parse(fx->gbytes, fx->glen, &fx->parsed);
	fx->vocab = fx->mh->cfg.vocab;
	fx->be = backend_cpu_new(2);
	const struct model_config *c = &fx->mh->cfg;
	fx->pool = kvpool_new(POOL_BLOCKS, BLOCK, c->n_layers, model_kv_dim(c));
	/* BOS, then ids of ordinary tokens drawn from a fixed stream */
	rng_seed(3);
	fx->prompt[0] = tok_bos(fx->mh->tok);
	for (int i = 1; i < N_PROMPT; i++)
		fx->prompt[i] = (int32_t)(rng_u64() % 128000);
	return fx->be && fx->pool ? 0 : -1;
}

static void run_free(struct run *r)
{
	free(r->rows);
	free(r->steps);
}

static int group_teardown(void **state)
{
	(void)state;
	if (!fx)
		return 0;
	model_free(fx->mh);
	model_free(fx->mg);
	model_free(fx->mp);
	run_free(&fx->rh);
	run_free(&fx->rg);
	run_free(&fx->rp);
	kvpool_free(fx->pool);
	backend_free(fx->be);
	free(fx->gbytes);
	if (!getenv("TEST_LLAMA3_KEEP")) {
		char *cmd = fmt("rm -rf '%s'", fx->dir);
		run_cmd(cmd);
		free(cmd);
	}
	free(fx->hf);
	free(fx->gguf);
	free(fx->plain);
	free(fx);
	return 0;
}

/* The prompt through m: N_PRE tokens prefilled without logits, N_ROWS with
 * all their logits, then greedy steps. */
static void run_model(const struct model *m, struct run *r)
{
	size_t V = (size_t)fx->vocab;
	r->rows = xmalloc(N_ROWS * V * sizeof(float));
	r->steps = xmalloc(N_GEN * V * sizeof(float));
	poison(r->rows, N_ROWS * V);
	struct fwd *f = fwd_new(m, fx->be, 512);
	assert_non_null(f);
	struct kvseq s = { 0 };
	assert_int_equal(kvseq_prepare(fx->pool, &s, N_PROMPT + N_GEN, 0), 0);
	struct fwd_seq a = { fx->prompt, N_PRE, 0, s.blocks, NULL, 0 };
	assert_int_equal(fwd_run(f, &fx->pool->kv, &a, 1), 0);
	struct fwd_seq b = { fx->prompt + N_PRE, N_ROWS, N_PRE, s.blocks, r->rows, 1 };
	assert_int_equal(fwd_run(f, &fx->pool->kv, &b, 1), 0);
	memcpy(r->steps, r->rows + (N_ROWS - 1) * V, V * sizeof(float));
	r->n_steps = r->n_gen = 0;
	for (int k = 0; k < N_GEN; k++) {
		r->n_steps++;
		int32_t id = argmax(r->steps + k * V, (int)V);
		if (tok_is_end(m->tok, id))
			break;
		r->ids[r->n_gen++] = id;
		if (k + 1 == N_GEN)
			break;
		struct fwd_seq d = { &r->ids[k], 1, N_PROMPT + k, s.blocks, r->steps + (k + 1) * V, 0 };
		assert_int_equal(fwd_run(f, &fx->pool->kv, &d, 1), 0);
	}
	kvseq_release(fx->pool, &s);
	fwd_free(f);
	assert_finite(r->rows, N_ROWS * V);
}

static const struct run *run_hf(void)
{
	if (!fx->ran_h) {
		run_model(fx->mh, &fx->rh);
		fx->ran_h = 1;
	}
	return &fx->rh;
}

static const struct run *run_gguf(void)
{
	if (!fx->ran_g) {
		run_model(fx->mg, &fx->rg);
		fx->ran_g = 1;
	}
	return &fx->rg;
}

static const struct model *plain_model(void)
{
	if (!fx->mp) {
		fx->plain = hf_variant("plain", drop_scaling, 1);
		fx->mp = load_ok(fx->plain);
	}
	return fx->mp;
}

static const struct run *run_plain(void)
{
	if (!fx->ran_p) {
		run_model(plain_model(), &fx->rp);
		fx->ran_p = 1;
	}
	return &fx->rp;
}

static double max_abs_diff(const float *a, const float *b, size_t n)
{
	double m = 0;
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)a[i] - (double)b[i]);
		if (d > m)
			m = d;
	}
	return m;
}

/* ---- tests -------------------------------------------------------------------- */

static void test_config(void **state)
{
	(void)state;
	const struct model_config *h = &fx->mh->cfg, *g = &fx->mg->cfg;
	const struct model_config *cs[2] = { h, g };
	for (int i = 0; i < 2; i++) {
		const struct model_config *c = cs[i];
		assert_int_equal(c->dim, 64);
		assert_int_equal(c->n_layers, 2);
		assert_int_equal(c->n_heads, 4);
		assert_int_equal(c->n_kv_heads, 1);
		assert_int_equal(c->head_dim, 16);
		assert_int_equal(c->ffn_dim, 128);
		assert_int_equal(c->vocab, 128256);
		assert_int_equal(c->max_ctx, 131072);
		assert_true(c->rope_theta == 500000.0f);
		assert_int_equal(c->bos, 128000);
		assert_int_equal(c->eos, 128001);
		assert_null(model_config_check(c));
	}
	assert_int_equal(h->rope_layout, KT_ROPE_HALF);
	assert_int_equal(g->rope_layout, KT_ROPE_INTERLEAVED);
	char d[512];
	model_describe(fx->mh, d, sizeof(d));
	assert_non_null(strstr(d, "ctx 131072 (scaled RoPE)"));
	/* fwd_run takes positions up to the 128k context, no further (the
	 * check comes before any block is touched) */
	struct fwd *f = fwd_new(fx->mh, fx->be, 16);
	assert_non_null(f);
	int32_t one = 5, table[1] = { 0 };
	struct fwd_seq q = { &one, 1, 131072, table, NULL, 0 };
	assert_int_equal(fwd_run(f, &fx->pool->kv, &q, 1), -EINVAL);
	fwd_free(f);
}

/* The divisors from the formula, computed here from the f32 base frequency,
 * the same in both formats; inv_freq bit-identical. */
static void test_rope_table(void **state)
{
	(void)state;
	const float *rh = fx->mh->rope_freqs, *rg = fx->mg->rope_freqs;
	assert_non_null(rh);
	assert_non_null(rg);
	assert_memory_equal(rh, rg, HALF * sizeof(float));
	assert_memory_equal(fx->mh->inv_freq, fx->mg->inv_freq, HALF * sizeof(float));
	const struct model *mp = plain_model();
	assert_null(mp->rope_freqs);
	int n_one = 0, n_factor = 0, n_mid = 0;
	for (int i = 0; i < HALF; i++) {
		float base = 1.0f / powf(500000.0f, (float)(2 * i) / 16.0f);
		double wl = 2 * M_PI / base, want;
		if (wl < 8192.0 / 4) {
			want = 1;
			n_one++;
		} else if (wl > 8192.0 / 1) {
			want = 32;
			n_factor++;
		} else {
			double s = (8192.0 / wl - 1) / (4 - 1);
			want = 1 / ((1 - s) / 32 + s);
			n_mid++;
		}
		if (rh[i] != (float)want)
			fail_msg("rope_freqs[%d] = %.9g, want %.9g", i, (double)rh[i], want);
		/* unscaled: the plain folder's table is the base frequency */
		assert_true(mp->inv_freq[i] == base);
		assert_true(fx->mh->inv_freq[i] == base / rh[i]);
		if (rh[i] != 1.0f && mp->inv_freq[i] == fx->mh->inv_freq[i])
			fail_msg("inv_freq[%d] not scaled", i);
	}
	/* head_dim 16, theta 500000: wavelengths 6.3 .. 6.1e5; 4 unchanged, one
	 * in the smooth band, 3 divided by the factor */
	assert_int_equal(n_one, 4);
	assert_int_equal(n_mid, 1);
	assert_int_equal(n_factor, 3);
	print_message("rope_freqs: %g %g %g %g %g %g %g %g\n", (double)rh[0], (double)rh[1],
		      (double)rh[2], (double)rh[3], (double)rh[4], (double)rh[5], (double)rh[6],
		      (double)rh[7]);
	/* model_rope_llama3 refuses parameters that would divide by zero */
	float out[HALF];
	assert_non_null(model_rope_llama3(500000.0f, 16, 32, 4, 4, 8192, out));
	assert_non_null(model_rope_llama3(500000.0f, 16, 0, 1, 4, 8192, out));
	assert_non_null(model_rope_llama3(500000.0f, 16, NAN, 1, 4, 8192, out));
	assert_non_null(model_rope_llama3(500000.0f, 16, 32, 1, 4, 0, out));
	assert_null(model_rope_llama3(500000.0f, 16, 32, 1, 4, 8192, out));
	assert_memory_equal(out, rh, sizeof(out));
}

/* Neither file has a classifier tensor; both models use the embedding. */
static void test_tied(void **state)
{
	(void)state;
	assert_ptr_equal(fx->mh->cls.data, fx->mh->embed.data);
	assert_ptr_equal(fx->mg->cls.data, fx->mg->embed.data);
	char *st = fmt("%s/model.safetensors", fx->hf);
	size_t n;
	char *b = slurp(st, &n);
	assert_non_null(b);
	uint64_t hl = le64((const uint8_t *)b);
	assert_true(hl < n);
	b[8 + hl] = 0;   /* the header only */
	assert_non_null(strstr(b + 8, "\"model.embed_tokens.weight\""));
	assert_null(strstr(b + 8, "lm_head"));
	free(b);
	free(st);
	assert_non_null(gg_t(&fx->parsed, "token_embd.weight"));
	assert_null(gg_t(&fx->parsed, "output.weight"));
	assert_non_null(gg_t(&fx->parsed, "rope_freqs.weight"));
	/* weight_bytes counts the classifier once per token read, like the
	 * untied case: both formats agree */
	assert_int_equal(fx->mh->weight_bytes, fx->mg->weight_bytes);
}

static void test_formats_bit_identical(void **state)
{
	(void)state;
	const struct run *h = run_hf(), *g = run_gguf(), *p = run_plain();
	size_t V = (size_t)fx->vocab;
	if (memcmp(h->rows, g->rows, N_ROWS * V * sizeof(float)))
		fail_msg("HF and GGUF logits differ at positions %d..%d (max %g)", N_PRE,
			 N_PROMPT - 1, max_abs_diff(h->rows, g->rows, N_ROWS * V));
	assert_int_equal(h->n_steps, g->n_steps);
	assert_int_equal(h->n_gen, g->n_gen);
	assert_memory_equal(h->ids, g->ids, (size_t)h->n_gen * sizeof(int32_t));
	assert_memory_equal(h->steps, g->steps, (size_t)h->n_steps * V * sizeof(float));
	/* without the scaling, the same weights give other logits */
	double dp = max_abs_diff(h->rows, p->rows, N_ROWS * V);
	print_message("HF = GGUF bit for bit over %d rows at positions %d..%d and %d greedy "
		      "steps; unscaled RoPE differs by up to %g\n", N_ROWS, N_PRE, N_PROMPT - 1,
		      h->n_steps, dp);
	assert_true(dp > 0.01);
	int differ = 0;
	for (int i = 0; i < N_ROWS; i++)
		differ += argmax(h->rows + i * V, (int)V) != argmax(p->rows + i * V, (int)V);
	print_message("%d of %d rows change their top token without the scaling\n", differ,
		      N_ROWS);
}

/* The GGUF's gpt2 vocabulary is the tokenizer.json one. */
static void test_tokenizer(void **state)
{
	(void)state;
	const struct tok *a = fx->mh->tok, *b = fx->mg->tok;
	assert_int_equal(tok_kind(a), TOK_BPE);
	assert_int_equal(tok_kind(b), TOK_BPE);
	assert_int_equal(tok_n_vocab(a), tok_n_vocab(b));
	for (int i = 0; i < tok_n_vocab(a); i++) {
		if (strcmp(tok_piece(a, i), tok_piece(b, i)) || tok_type(a, i) != tok_type(b, i))
			fail_msg("token %d: \"%s\" type %d vs \"%s\" type %d", i, tok_piece(a, i),
				 tok_type(a, i), tok_piece(b, i), tok_type(b, i));
	}
	assert_int_equal(tok_n_merges(a), 280147);
	assert_int_equal(tok_n_merges(a), tok_n_merges(b));
	for (int i = 0; i < tok_n_merges(a); i++)
		if (strcmp(tok_merge(a, i), tok_merge(b, i)))
			fail_msg("merge %d: \"%s\" vs \"%s\"", i, tok_merge(a, i), tok_merge(b, i));
	assert_string_equal(tok_pre(a), "llama-bpe");
	assert_string_equal(tok_pre(b), "llama-bpe");
	assert_int_equal(tok_bos(a), tok_bos(b));
	assert_int_equal(tok_eos(a), tok_eos(b));
	/* end of turn: <|end_of_text|> and <|eot_id|> in both; 128008 is
	 * <|eom_id|> in Llama 3.1's vocabulary (then both have it, by name) but
	 * <|reserved_special_token_4|> in 3.0's, which MODELS holds: then only
	 * generation_config.json names it, which the HF folder reads and a
	 * GGUF (eos / eot / eom keys) cannot carry */
	assert_true(tok_is_end(a, 128001) && tok_is_end(b, 128001));
	assert_true(tok_is_end(a, 128009) && tok_is_end(b, 128009));
	assert_true(tok_is_end(a, 128008));
	assert_int_equal(tok_is_end(b, 128008), !strcmp(tok_piece(b, 128008), "<|eom_id|>"));
	for (int i = 0; i < tok_n_end(b); i++)
		assert_true(tok_is_end(a, tok_end(b, i)));
	const char *text = "Hello, world! Llama 3's tokenizer: 12345 ünïcödé 🦙\n\n  spaces";
	int32_t *ia = NULL, *ib = NULL;
	int na = tok_encode(a, text, strlen(text), 1, &ia);
	int nb = tok_encode(b, text, strlen(text), 1, &ib);
	assert_true(na > 10);
	assert_int_equal(na, nb);
	assert_memory_equal(ia, ib, (size_t)na * sizeof(int32_t));
	free(ia);
	free(ib);
	/* the vocabulary alone from the GGUF */
	char *cause = NULL;
	struct tok *t = tok_load_gguf(fx->gguf, &cause);
	if (!t)
		fail_msg("tok_load_gguf: %s", cause);
	assert_int_equal(tok_kind(t), TOK_BPE);
	assert_int_equal(tok_n_vocab(t), 128256);
	tok_free(t);
	/* what llamad-quantize wrote */
	struct gkv *k = gg_kv(&fx->parsed, "tokenizer.ggml.model");
	assert_non_null(k);
	assert_memory_equal(k->val + 8, "gpt2", 4);
	assert_null(gg_kv(&fx->parsed, "tokenizer.ggml.scores"));
	k = gg_kv(&fx->parsed, "tokenizer.ggml.eot_token_id");
	assert_non_null(k);
	assert_int_equal(le32(k->val), 128009);
	k = gg_kv(&fx->parsed, "tokenizer.ggml.pre");
	assert_non_null(k);
	assert_memory_equal(k->val + 8, "llama-bpe", 9);
}

/* The fingerprint covers the RoPE table: the same weights and
 * hyper-parameters without the scaling are another model. */
static void test_fingerprint(void **state)
{
	(void)state;
	const struct model *p = plain_model();
	assert_true(fx->mh->fingerprint != 0);
	assert_true(p->fingerprint != fx->mh->fingerprint);
	struct model *again = load_ok(fx->hf);
	assert_true(again->fingerprint == fx->mh->fingerprint);
	model_free(again);
}

/* numpy (tests/tools/llama3_ref.py, float64) over the same ids. */
static void test_numpy_reference(void **state)
{
	(void)state;
	const struct run *h = run_hf();
	size_t V = (size_t)fx->vocab;
	char *ids = fmt("%s/prompt.ids", fx->dir), *out = fmt("%s/ref.f32", fx->dir);
	char *js = fmt("%s/ref.json", fx->dir);
	FILE *f = fopen(ids, "w");
	assert_non_null(f);
	for (int i = 0; i < N_PROMPT; i++)
		fprintf(f, "%d\n", fx->prompt[i]);
	assert_int_equal(fclose(f), 0);
	char *cmd = fmt("%s %s/tests/tools/llama3_ref.py --model %s --ids %s --n %d --logits %s "
			">%s", env_or("PYTHON", "/usr/bin/python3"), env_or("SRC", "."), fx->hf,
			ids, N_GEN, out, js);
	assert_int_equal(run_cmd(cmd), 0);
	json_t *r = json_load_file(js, 0, NULL);
	assert_non_null(r);
	json_t *gen = json_object_get(r, "generated"), *mg = json_object_get(r, "margins");
	assert_true(json_is_array(gen) && json_is_array(mg));
	assert_int_equal(json_integer_value(json_object_get(r, "prompt_len")), N_PROMPT);
	int n_ref = (int)json_array_size(mg);
	assert_int_equal(n_ref, h->n_steps);
	assert_int_equal((int)json_array_size(gen), h->n_gen);
	double min_margin = 1e9;
	for (int i = 0; i < h->n_gen; i++) {
		int id = (int)json_integer_value(json_array_get(gen, (size_t)i));
		if (id != h->ids[i])
			fail_msg("greedy token %d: numpy %d, llamad %d", i, id, h->ids[i]);
	}
	for (int i = 0; i < n_ref; i++) {
		double m = json_real_value(json_array_get(mg, (size_t)i));
		if (m < min_margin)
			min_margin = m;
	}
	size_t len;
	float *ref = (float *)slurp(out, &len);
	assert_non_null(ref);
	assert_int_equal(len, (size_t)n_ref * V * sizeof(float));
	double d = max_abs_diff(ref, h->steps, (size_t)n_ref * V), big = 0;
	for (size_t i = 0; i < (size_t)n_ref * V; i++)
		if (fabs(ref[i]) > big)
			big = fabs(ref[i]);
	print_message("numpy float64 vs llamad over %d greedy steps at positions %d..%d: the "
		      "same %d tokens; max |logit difference| %.3g (max |logit| %.3g, smallest "
		      "top-2 margin %.3g)\n", n_ref, N_PROMPT - 1, N_PROMPT + n_ref - 2, h->n_gen,
		      d, big, min_margin);
	assert_true(d < REF_TOL);
	/* the comparison tells scaled from unscaled: llamad without the
	 * scaling is far from numpy's row after the prompt */
	double du = max_abs_diff(ref, run_plain()->steps, V);
	print_message("llamad without the RoPE scaling vs numpy after the prompt: max |logit "
		      "difference| %.3g\n", du);
	assert_true(du > 100 * REF_TOL);
	free(ref);
	json_decref(r);
	free(cmd);
	free(ids);
	free(out);
	free(js);
}

/* GGUF variants: rope_freqs, scaling type, the gpt2 vocabulary. */
static void gg_expect_fail(struct gg *g, const char *name, ...)
{
	char *p = fmt("%s/%s", fx->dir, name);
	gg_write(g, p);
	gg_done(g);
	va_list ap;
	va_start(ap, name);
	expect_load_fail_v(name, p, NULL, p, VERBOSE, ap);
	va_end(ap);
	unlink(p);
	free(p);
}

static struct model *gg_load(struct gg *g, const char *name)
{
	char *p = fmt("%s/%s", fx->dir, name);
	gg_write(g, p);
	gg_done(g);
	struct model *m = load_ok(p);
	unlink(p);
	free(p);
	return m;
}

static void test_gguf_variants(void **state)
{
	(void)state;
	struct gg g;
	float rf[HALF];
	memcpy(rf, fx->mh->rope_freqs, sizeof(rf));

	/* the file as parsed here, written again, loads to the same model */
	g = fx->parsed;
	struct model *m = gg_load(&g, "same.gguf");
	assert_true(m->fingerprint == fx->mg->fingerprint);
	model_free(m);

	g = fx->parsed;
	gg_set_t(&g, "rope_freqs.weight", 0, HALF - 1, 0, rf, (HALF - 1) * 4);
	gg_expect_fail(&g, "rf-short.gguf", "rope_freqs.weight", "expected [8]", NULL);
	g = fx->parsed;
	gg_set_t(&g, "rope_freqs.weight", 0, HALF, 2, rf, sizeof(rf));
	gg_expect_fail(&g, "rf-2d.gguf", "rope_freqs.weight", "shape", NULL);
	g = fx->parsed;
	uint16_t h16[HALF] = { 0 };
	gg_set_t(&g, "rope_freqs.weight", 1, HALF, 0, h16, sizeof(h16));
	gg_expect_fail(&g, "rf-f16.gguf", "rope_freqs.weight", "F16", "F32 expected", NULL);
	float bad[HALF];
	memcpy(bad, rf, sizeof(bad));
	bad[3] = 0;
	g = fx->parsed;
	gg_set_t(&g, "rope_freqs.weight", 0, HALF, 0, bad, sizeof(bad));
	gg_expect_fail(&g, "rf-zero.gguf", "rope_freqs.weight", "entry 3", "finite positive", NULL);
	bad[3] = NAN;
	g = fx->parsed;
	gg_set_t(&g, "rope_freqs.weight", 0, HALF, 0, bad, sizeof(bad));
	gg_expect_fail(&g, "rf-nan.gguf", "entry 3", "finite positive", NULL);
	bad[3] = -rf[3];
	g = fx->parsed;
	gg_set_t(&g, "rope_freqs.weight", 0, HALF, 0, bad, sizeof(bad));
	gg_expect_fail(&g, "rf-neg.gguf", "entry 3", NULL);

	/* without rope_freqs: the unscaled model, same table as the HF folder
	 * without rope_scaling */
	g = fx->parsed;
	gg_del_t(&g, "rope_freqs.weight");
	m = gg_load(&g, "no-rf.gguf");
	assert_null(m->rope_freqs);
	assert_memory_equal(m->inv_freq, plain_model()->inv_freq, sizeof(rf));
	assert_true(m->fingerprint != fx->mg->fingerprint);
	model_free(m);

	/* llama.rope.scaling.type: "none" is fine, others refused */
	g = fx->parsed;
	gg_set_str(&g, "llama.rope.scaling.type", "none");
	m = gg_load(&g, "none.gguf");
	assert_memory_equal(m->rope_freqs, rf, sizeof(rf));
	model_free(m);
	static const char *const types[] = { "yarn", "linear", "longrope" };
	for (size_t i = 0; i < 3; i++) {
		g = fx->parsed;
		gg_set_str(&g, "llama.rope.scaling.type", types[i]);
		char *want = fmt("RoPE scaling \"%s\"", types[i]);
		gg_expect_fail(&g, "scaling.gguf", want, "not supported", NULL);
		free(want);
	}

	/* other unknown tensors are still refused */
	g = fx->parsed;
	float bias[64] = { 0 };
	gg_set_t(&g, "blk.0.attn_q.bias", 0, 64, 0, bias, sizeof(bias));
	gg_expect_fail(&g, "bias.gguf", "blk.0.attn_q.bias", "not part of a Llama model", NULL);
	g = fx->parsed;
	gg_set_t(&g, "blk.0.rope_freqs.weight", 0, HALF, 0, rf, sizeof(rf));
	gg_expect_fail(&g, "layer-rf.gguf", "blk.0.rope_freqs.weight", "not part", NULL);

	/* an untied copy of the classifier loads as its own tensor */
	g = fx->parsed;
	struct gguf_tensor *te = gg_t(&g, "token_embd.weight");
	gg_set_t(&g, "output.weight", 0, te->ne[0], te->ne[1], te->data, te->bytes);
	m = gg_load(&g, "untied.gguf");
	assert_ptr_not_equal(m->cls.data, m->embed.data);
	model_free(m);

	/* the gpt2 vocabulary */
	g = fx->parsed;
	gg_del_kv(&g, "tokenizer.ggml.merges");
	gg_expect_fail(&g, "no-merges.gguf", "tokenizer.ggml.merges", "missing", NULL);
	g = fx->parsed;
	uint32_t three[3] = { 1, 2, 3 };
	gg_set_u32s(&g, "tokenizer.ggml.merges", 4, three, 3);
	gg_expect_fail(&g, "merges-u32.gguf", "tokenizer.ggml.merges", "not an array of strings",
		       NULL);
	g = fx->parsed;
	gg_set_str(&g, "tokenizer.ggml.merges", "Ġ t");
	gg_expect_fail(&g, "merges-str.gguf", "tokenizer.ggml.merges", "not an array", NULL);
	g = fx->parsed;
	gg_set_u32s(&g, "tokenizer.ggml.token_type", 5, three, 3);
	gg_expect_fail(&g, "types-short.gguf", "tokenizer.ggml.token_type", "3 elements",
		       "128256 tokens", NULL);
	g = fx->parsed;
	gg_set_str(&g, "tokenizer.ggml.pre", "qwen2");
	gg_expect_fail(&g, "pre.gguf", "pre-tokenizer \"qwen2\"", NULL);
	g = fx->parsed;
	gg_set_u32s(&g, "tokenizer.ggml.pre", 4, three, 1);
	gg_expect_fail(&g, "pre-type.gguf", "tokenizer.ggml.pre", "expected string", NULL);

	/* a merge that is not "left right": the BPE loader's reason */
	g = fx->parsed;
	struct gkv *mk = gg_kv(&g, "tokenizer.ggml.merges");
	uint8_t *mv = gg_own(&g, mk->vlen);
	memcpy(mv, mk->val, mk->vlen);
	/* the first merge is "Ġ Ġ" (5 bytes): make its space a letter */
	assert_int_equal(le64(mv + 12), 5);
	mv[12 + 8 + 2] = 'x';
	mk->val = mv;
	gg_expect_fail(&g, "merge-bad.gguf", "merge 0", NULL);
	/* a token type out of range */
	g = fx->parsed;
	struct gkv *tk = gg_kv(&g, "tokenizer.ggml.token_type");
	uint8_t *tv = gg_own(&g, tk->vlen);
	memcpy(tv, tk->val, tk->vlen);
	tv[12 + 4 * 100] = 9;
	tk->val = tv;
	gg_expect_fail(&g, "type-bad.gguf", "token 100", "unknown token type 9", NULL);
	/* without token types (optional): loads, the specials are then normal
	 * tokens and the end-of-turn ids come only from the keys */
	g = fx->parsed;
	gg_del_kv(&g, "tokenizer.ggml.token_type");
	m = gg_load(&g, "no-types.gguf");
	assert_int_equal(tok_kind(m->tok), TOK_BPE);
	model_free(m);
}

/* config.json variants. */
static void rs_yarn(json_t *c)
{
	json_object_set_new(c, "rope_scaling", json_pack("{s:s, s:f, s:i}", "rope_type", "yarn",
							  "factor", 4.0,
							  "original_max_position_embeddings", 8192));
}
static void rs_linear(json_t *c)
{
	json_object_set_new(c, "rope_scaling", json_pack("{s:s, s:f}", "type", "linear",
							  "factor", 2.0));
}
static void rs_dynamic(json_t *c)
{
	json_object_set_new(c, "rope_scaling", json_pack("{s:s, s:f}", "rope_type", "dynamic",
							  "factor", 2.0));
}
static void rs_longrope(json_t *c)
{
	json_object_set_new(c, "rope_scaling", json_pack("{s:s}", "rope_type", "longrope"));
}
static void rs_old_key(json_t *c)
{
	json_t *rs = json_object_get(c, "rope_scaling");
	json_object_del(rs, "rope_type");
	json_object_set_new(rs, "type", json_string("llama3"));
}
static void rs_no_factor(json_t *c)
{
	json_object_del(json_object_get(c, "rope_scaling"), "factor");
}
static void rs_no_orig(json_t *c)
{
	json_object_del(json_object_get(c, "rope_scaling"), "original_max_position_embeddings");
}
static void rs_str_low(json_t *c)
{
	json_object_set_new(json_object_get(c, "rope_scaling"), "low_freq_factor",
			    json_string("1"));
}
static void rs_low_high(json_t *c)
{
	json_object_set_new(json_object_get(c, "rope_scaling"), "low_freq_factor",
			    json_real(4.0));
}
static void rs_number(json_t *c)
{
	json_object_set_new(c, "rope_scaling", json_integer(5));
}
static void rs_no_type(json_t *c)
{
	json_object_del(json_object_get(c, "rope_scaling"), "rope_type");
}
static void rs_default(json_t *c)
{
	json_object_set_new(c, "rope_scaling", json_pack("{s:s}", "rope_type", "default"));
}
static void rs_null(json_t *c)
{
	json_object_set_new(c, "rope_scaling", json_null());
}
static void eos_list(json_t *c)
{
	json_object_set_new(c, "eos_token_id", json_pack("[i, i, i]", 128001, 128008, 128009));
}
static void eos_bad(json_t *c)
{
	json_object_set_new(c, "eos_token_id", json_pack("[s]", "x"));
}
static void keep(json_t *c)
{
	(void)c;
}

static void hf_expect_fail(const char *name, void (*edit)(json_t *), ...)
{
	char *d = hf_variant(name, edit, 1);
	char *cfg = fmt("%s/config.json", d);
	va_list ap;
	va_start(ap, edit);
	expect_load_fail_v(name, d, NULL, cfg, VERBOSE, ap);
	va_end(ap);
	free(cfg);
	free(d);
}

static void test_hf_variants(void **state)
{
	(void)state;
	hf_expect_fail("yarn", rs_yarn, "rope_scaling type \"yarn\"", "llama3 is", NULL);
	hf_expect_fail("linear", rs_linear, "rope_scaling type \"linear\"", NULL);
	hf_expect_fail("dynamic", rs_dynamic, "rope_scaling type \"dynamic\"", NULL);
	hf_expect_fail("longrope", rs_longrope, "rope_scaling type \"longrope\"", NULL);
	hf_expect_fail("no-factor", rs_no_factor, "llama3", "\"factor\"", NULL);
	hf_expect_fail("no-orig", rs_no_orig, "\"original_max_position_embeddings\"", NULL);
	hf_expect_fail("str-low", rs_str_low, "\"low_freq_factor\"", NULL);
	hf_expect_fail("low-high", rs_low_high, "low_freq_factor < high_freq_factor", NULL);
	hf_expect_fail("rs-number", rs_number, "rope_scaling is not an object", NULL);
	hf_expect_fail("rs-no-type", rs_no_type, "no rope_type", NULL);
	hf_expect_fail("eos-bad", eos_bad, "\"eos_token_id\"", NULL);

	/* "type" (older configs) works as "rope_type" */
	char *d = hf_variant("old-key", rs_old_key, 1);
	struct model *m = load_ok(d);
	assert_memory_equal(m->rope_freqs, fx->mh->rope_freqs, HALF * sizeof(float));
	model_free(m);
	free(d);
	/* "default" and null: no scaling */
	void (*none[2])(json_t *) = { rs_default, rs_null };
	for (int i = 0; i < 2; i++) {
		d = hf_variant(i ? "rs-null" : "rs-default", none[i], 1);
		m = load_ok(d);
		assert_null(m->rope_freqs);
		assert_memory_equal(m->inv_freq, plain_model()->inv_freq, HALF * sizeof(float));
		model_free(m);
		free(d);
	}
	/* eos_token_id as a list (Llama 3.1 Instruct's config.json), here with no
	 * generation_config.json beside it: its ids end turns */
	d = hf_variant("eos-list", eos_list, 1);
	char *gc = fmt("%s/generation_config.json", d);
	unlink(gc);
	m = load_ok(d);
	assert_true(tok_is_end(m->tok, 128001));
	assert_true(tok_is_end(m->tok, 128008));
	assert_true(tok_is_end(m->tok, 128009));
	model_free(m);
	free(gc);
	free(d);
	/* no tokenizer.model: tokenizer.json is used (the fixture's folder);
	 * neither: the error names tokenizer.model and the way out */
	d = hf_variant("no-tok", keep, 0);
	expect_fail(d, "tokenizer.model", "--tokenizer", NULL);
	free(d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_config),
		cmocka_unit_test(test_rope_table),
		cmocka_unit_test(test_tied),
		cmocka_unit_test(test_tokenizer),
		cmocka_unit_test(test_fingerprint),
		cmocka_unit_test(test_formats_bit_identical),
		cmocka_unit_test(test_numpy_reference),
		cmocka_unit_test(test_gguf_variants),
		cmocka_unit_test(test_hf_variants),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

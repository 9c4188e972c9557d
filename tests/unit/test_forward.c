/*
 * tests/unit/test_forward.c — the batched forward pass (model/forward.c) on
 * the real stories260K model, through the CPU backend and the paged KV pool.
 *
 * Files, from $MODELS (default ../shared/models) and $SHARED (../shared):
 *   stories260K.bin + tok512.model     llama2.c checkpoint, interleaved RoPE
 *   stories260K-hf/                    the same weights as an HF folder
 *                                      (rotate_half Q/K rows)
 *   reference/stories260K_greedy.txt   greedy text from llama2.c's run.c
 *
 * Everything that the design promises to be independent of scheduling is
 * compared bit for bit (memcmp): prefill vs token-by-token decode, a
 * sequence alone vs in a batch, 1 vs 2 threads, chunked vs unchunked, and
 * the two file formats.
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

#include <cmocka.h>

#include "tests/unit/testutil.h"

#include "kernels/backend.h"
#include "model/forward.h"
#include "model/model.h"
#include "text/tokenizer.h"
#include "session/kvpool.h"

#define BLOCK 16
#define POOL_BLOCKS 256

struct fixture {
	struct model *bin;     /* stories260K.bin */
	struct model *hf;      /* stories260K-hf */
	struct backend *be1, *be2;
	struct kvpool *pool;
	int vocab;
};

static struct fixture *fx;


static float *logits_new(int rows)
{
	size_t n = (size_t)rows * fx->vocab;
	float *l = malloc(n * sizeof(float));
	assert_non_null(l);
	for (size_t i = 0; i < n; i++)
		l[i] = NAN;  /* poison: a row fwd_run does not write fails */
	return l;
}

/* tok_encode with BOS; returns the count, ids in *ids (malloc'd). */
static int encode(const struct model *m, const char *text, int32_t **ids)
{
	int n = tok_encode(m->tok, text, strlen(text), 1, ids);
	assert_true(n > 1);
	assert_int_equal((*ids)[0], m->cfg.bos);
	return n;
}

/* Extend s to cover [0, pos + n) (writable from pos) and run tokens as one
 * sequence at pos. Returns fwd_run's result. */
static int run_seq(struct fwd *f, struct kvseq *s, const int32_t *tok, int n, int pos,
		   float *logits, int all)
{
	assert_int_equal(kvseq_prepare(fx->pool, s, pos + n, pos), 0);
	struct fwd_seq q = { tok, n, pos, s->blocks, logits, all };
	return fwd_run(f, &fx->pool->kv, &q, 1);
}

/* Logits of the last token of tok[0..n), run from scratch in a fresh
 * sequence as one prefill. */
static void prefill_fresh(struct fwd *f, const int32_t *tok, int n, float *logits)
{
	struct kvseq s = { 0 };
	assert_int_equal(run_seq(f, &s, tok, n, 0, logits, 0), 0);
	kvseq_release(fx->pool, &s);
}

static void assert_logits_equal(const float *a, const float *b, size_t rows,
				const char *what)
{
	size_t n = rows * (size_t)fx->vocab;
	if (memcmp(a, b, n * sizeof(float)) == 0)
		return;
	for (size_t i = 0; i < n; i++)
		if (memcmp(&a[i], &b[i], sizeof(float)))
			fail_msg("%s: logits differ at row %zu id %zu: %.9g vs %.9g", what,
				 i / fx->vocab, i % fx->vocab, (double)a[i], (double)b[i]);
}

/* ---- fixture ---------------------------------------------------------------- */

static int group_setup(void **state)
{
	(void)state;
	const char *models = env_or("MODELS", "../shared/models");
	char *bin = path_join(models, "stories260K.bin");
	char *tok = path_join(models, "tok512.model");
	char *hf = path_join(models, "stories260K-hf");
	char *cause = NULL;
	fx = calloc(1, sizeof(*fx));
	if (!fx)
		return -1;
	fx->bin = model_load(bin, tok, &cause);
	if (!fx->bin)
		fprintf(stderr, "model_load %s: %s\n", bin, cause ? cause : "?");
	free(cause);
	cause = NULL;
	fx->hf = model_load(hf, NULL, &cause);
	if (!fx->hf)
		fprintf(stderr, "model_load %s: %s\n", hf, cause ? cause : "?");
	free(cause);
	free(bin);
	free(tok);
	free(hf);
	if (!fx->bin || !fx->hf)
		return -1;
	fx->vocab = fx->bin->cfg.vocab;
	fx->be1 = backend_cpu_new(1);
	fx->be2 = backend_cpu_new(2);
	const struct model_config *c = &fx->bin->cfg;
	fx->pool = kvpool_new(POOL_BLOCKS, BLOCK, c->n_layers, model_kv_dim(c));
	return fx->be1 && fx->be2 && fx->pool ? 0 : -1;
}

static int group_teardown(void **state)
{
	(void)state;
	if (fx) {
		model_free(fx->bin);
		model_free(fx->hf);
		backend_free(fx->be1);
		backend_free(fx->be2);
		kvpool_free(fx->pool);
		free(fx);
	}
	return 0;
}

/* Every test leaves the pool as it found it. A test that fails midway
 * leaks its sequences: report that and start the next test on a new pool. */
static int check_pool_empty(void **state)
{
	(void)state;
	if (kvpool_n_free(fx->pool) == POOL_BLOCKS)
		return 0;
	const struct model_config *c = &fx->bin->cfg;
	kvpool_free(fx->pool);
	fx->pool = kvpool_new(POOL_BLOCKS, BLOCK, c->n_layers, model_kv_dim(c));
	return -1;
}

/* ---- tests ------------------------------------------------------------------ */

static void test_model_shape(void **state)
{
	(void)state;
	const struct model_config *b = &fx->bin->cfg, *h = &fx->hf->cfg;
	assert_int_equal(b->dim, 64);
	assert_int_equal(b->n_layers, 5);
	assert_int_equal(b->n_heads, 8);
	assert_int_equal(b->n_kv_heads, 4);
	assert_int_equal(b->head_dim, 8);
	assert_int_equal(b->ffn_dim, 172);
	assert_int_equal(b->vocab, 512);
	assert_int_equal(b->max_ctx, 512);
	assert_int_equal(b->rope_layout, KT_ROPE_INTERLEAVED);
	assert_int_equal(h->rope_layout, KT_ROPE_HALF);
	assert_int_equal(h->dim, b->dim);
	assert_int_equal(h->n_layers, b->n_layers);
	assert_int_equal(h->n_heads, b->n_heads);
	assert_int_equal(h->n_kv_heads, b->n_kv_heads);
	assert_int_equal(h->head_dim, b->head_dim);
	assert_int_equal(h->ffn_dim, b->ffn_dim);
	assert_int_equal(h->vocab, b->vocab);
	assert_int_equal(h->max_ctx, b->max_ctx);
	assert_true(h->rms_eps == b->rms_eps);
	assert_true(h->rope_theta == b->rope_theta);
	assert_int_equal(b->bos, 1);
	assert_int_equal(h->bos, 1);
}

/* (a) one prefill call vs one decode call per token: last logits equal. */
static void test_prefill_vs_decode(void **state)
{
	(void)state;
	int32_t *ids;
	int n = encode(fx->bin, "Once upon a time", &ids);
	struct fwd *f = fwd_new(fx->bin, fx->be1, 512);
	assert_non_null(f);
	float *a = logits_new(1), *b = logits_new(1);

	prefill_fresh(f, ids, n, a);
	assert_finite(a, (size_t)fx->vocab);

	struct kvseq s = { 0 };
	for (int i = 0; i < n; i++) {
		float *l = logits_new(1);
		assert_int_equal(run_seq(f, &s, ids + i, 1, i, l, 0), 0);
		assert_finite(l, (size_t)fx->vocab);
		if (i == n - 1)
			memcpy(b, l, (size_t)fx->vocab * sizeof(float));
		free(l);
	}
	assert_logits_equal(a, b, 1, "prefill vs token-by-token");
	/* mixed: half as prefill, then the rest one by one */
	kvseq_release(fx->pool, &s);
	int h = n / 2;
	free(b);
	b = logits_new(1);
	assert_int_equal(run_seq(f, &s, ids, h, 0, NULL, 0), 0);
	for (int i = h; i < n; i++)
		assert_int_equal(run_seq(f, &s, ids + i, 1, i, b, 0), 0);
	assert_logits_equal(a, b, 1, "half prefill + decode");
	kvseq_release(fx->pool, &s);

	fwd_free(f);
	fwd_free(NULL);
	free(a);
	free(b);
	free(ids);
}

/* (b) three sequences of different lengths in one fwd_run vs each alone;
 * then a decode step for all three (different positions) in one call vs
 * alone; then a batch mixing decode and a new prefill. */
static void test_batch_invariance(void **state)
{
	(void)state;
	static const char *const prompts[3] = {
		"Once upon a time",
		"Lily and her mom went to the park. They saw a big tree",
		"The cat",
	};
	struct fwd *f = fwd_new(fx->bin, fx->be1, 512);
	assert_non_null(f);
	int32_t *ids[3];
	int n[3];
	float *alone[3], *batch[3];
	struct kvseq sa[3] = { { 0 } }, sb[3] = { { 0 } };
	struct fwd_seq q[3];
	for (int i = 0; i < 3; i++) {
		n[i] = encode(fx->bin, prompts[i], &ids[i]);
		alone[i] = logits_new(1);
		batch[i] = logits_new(1);
		assert_int_equal(run_seq(f, &sa[i], ids[i], n[i], 0, alone[i], 0), 0);
		assert_int_equal(kvseq_prepare(fx->pool, &sb[i], n[i], 0), 0);
	}
	assert_true(n[0] != n[1] && n[1] != n[2] && n[0] != n[2]);
	for (int i = 0; i < 3; i++)
		q[i] = (struct fwd_seq){ ids[i], n[i], 0, sb[i].blocks, batch[i], 0 };
	assert_int_equal(fwd_run(f, &fx->pool->kv, q, 3), 0);
	for (int i = 0; i < 3; i++)
		assert_logits_equal(alone[i], batch[i], 1, "prefill batch of 3 vs alone");

	/* one decode step each: the argmax of its own logits */
	int32_t next[3];
	for (int i = 0; i < 3; i++) {
		next[i] = argmax(alone[i], fx->vocab);
		assert_int_equal(run_seq(f, &sa[i], &next[i], 1, n[i], alone[i], 0), 0);
		assert_int_equal(kvseq_prepare(fx->pool, &sb[i], n[i] + 1, n[i]), 0);
		q[i] = (struct fwd_seq){ &next[i], 1, n[i], sb[i].blocks, batch[i], 0 };
	}
	assert_int_equal(fwd_run(f, &fx->pool->kv, q, 3), 0);
	for (int i = 0; i < 3; i++)
		assert_logits_equal(alone[i], batch[i], 1, "decode batch of 3 vs alone");

	/* decode of sequence 0 sharing a call with a fresh prefill of prompt 1 */
	struct kvseq sc = { 0 };
	float *l0 = logits_new(1), *l1 = logits_new(1), *r1 = logits_new(1);
	int32_t nx = argmax(alone[0], fx->vocab);
	assert_int_equal(run_seq(f, &sa[0], &nx, 1, n[0] + 1, alone[0], 0), 0);
	assert_int_equal(kvseq_prepare(fx->pool, &sb[0], n[0] + 2, n[0] + 1), 0);
	assert_int_equal(kvseq_prepare(fx->pool, &sc, n[1], 0), 0);
	struct fwd_seq mix[2] = {
		{ ids[1], n[1], 0, sc.blocks, l1, 0 },
		{ &nx, 1, n[0] + 1, sb[0].blocks, l0, 0 },
	};
	assert_int_equal(fwd_run(f, &fx->pool->kv, mix, 2), 0);
	assert_logits_equal(alone[0], l0, 1, "decode next to a prefill");
	prefill_fresh(f, ids[1], n[1], r1);
	assert_logits_equal(r1, l1, 1, "prefill next to a decode");

	kvseq_release(fx->pool, &sc);
	for (int i = 0; i < 3; i++) {
		kvseq_release(fx->pool, &sa[i]);
		kvseq_release(fx->pool, &sb[i]);
		free(alone[i]);
		free(batch[i]);
		free(ids[i]);
	}
	free(l0);
	free(l1);
	free(r1);
	fwd_free(f);
}

/* (c) the llama2.c file and the HF folder: same ids, same logits (every
 * row), although Q/K rows are stored in different RoPE pair layouts. */
static void test_bin_vs_hf(void **state)
{
	(void)state;
	const char *text = "Once upon a time, there was a little girl named Lily.";
	int32_t *ib, *ih;
	int nb = encode(fx->bin, text, &ib), nh = encode(fx->hf, text, &ih);
	assert_int_equal(nb, nh);
	assert_memory_equal(ib, ih, (size_t)nb * sizeof(int32_t));
	struct fwd *fb = fwd_new(fx->bin, fx->be1, 512);
	struct fwd *fh = fwd_new(fx->hf, fx->be1, 512);
	assert_non_null(fb);
	assert_non_null(fh);
	float *lb = logits_new(nb), *lh = logits_new(nb);
	struct kvseq sb = { 0 }, sh = { 0 };
	assert_int_equal(run_seq(fb, &sb, ib, nb, 0, lb, 1), 0);
	assert_int_equal(run_seq(fh, &sh, ih, nh, 0, lh, 1), 0);
	assert_finite(lb, (size_t)nb * fx->vocab);
	assert_logits_equal(lb, lh, (size_t)nb, ".bin vs HF");
	/* the KV written is the same too (both store K in interleaved order) */
	const struct kt_kv *kv = &fx->pool->kv;
	float *ka = malloc((size_t)kv->kv_dim * sizeof(float));
	float *kb = malloc((size_t)kv->kv_dim * sizeof(float));
	assert_non_null(ka);
	assert_non_null(kb);
	for (int p = 0; p < nb; p++)
		for (int l = 0; l < fx->bin->cfg.n_layers; l++) {
			kt_kv_get_k(kv, sb.blocks[p / BLOCK], l, p % BLOCK, ka);
			kt_kv_get_k(kv, sh.blocks[p / BLOCK], l, p % BLOCK, kb);
			assert_memory_equal(ka, kb, (size_t)kv->kv_dim * sizeof(float));
			kt_kv_get_v(kv, sb.blocks[p / BLOCK], l, p % BLOCK, ka);
			kt_kv_get_v(kv, sh.blocks[p / BLOCK], l, p % BLOCK, kb);
			assert_memory_equal(ka, kb, (size_t)kv->kv_dim * sizeof(float));
		}
	free(ka);
	free(kb);
	/* a few greedy steps stay identical */
	int pos = nb;
	float *db = logits_new(1), *dh = logits_new(1);
	memcpy(db, lb + (size_t)(nb - 1) * fx->vocab, (size_t)fx->vocab * sizeof(float));
	for (int i = 0; i < 8; i++, pos++) {
		int32_t t = argmax(db, fx->vocab);
		assert_int_equal(run_seq(fb, &sb, &t, 1, pos, db, 0), 0);
		assert_int_equal(run_seq(fh, &sh, &t, 1, pos, dh, 0), 0);
		assert_logits_equal(db, dh, 1, ".bin vs HF decode");
	}
	kvseq_release(fx->pool, &sb);
	kvseq_release(fx->pool, &sh);
	fwd_free(fb);
	fwd_free(fh);
	free(lb);
	free(lh);
	free(db);
	free(dh);
	free(ib);
	free(ih);
}

/* The first golden block of the reference file: the text between
 * "--- stdout ---\n" and "--- end stdout ---", without the final newline
 * run.c prints after generating. malloc'd. */
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
	b--;  /* run.c's closing printf("\n") */
	char *t = strndup(a, (size_t)(b - a));
	assert_non_null(t);
	free(all);
	return t;
}

/* (d) greedy generation matches llama2.c's run.c. Its first block is
 * `run -t 0 -n 64 -i "Once upon a time"`: 64 positions in all, i.e. run.c
 * prints the tokens at positions 1..64, so with a prompt of n ids (BOS
 * included) it generates 65 - n tokens (60 for the 5-id prompt), stopping
 * early only if the model emits BOS. The output echoes the prompt, which is
 * what decoding [prompt ids + generated] gives. */
static void test_greedy_golden(void **state)
{
	(void)state;
	const int steps = 64;
	char *want = golden_text();
	int32_t *ids;
	int n = encode(fx->bin, "Once upon a time", &ids);
	assert_int_equal(n, 5);
	int n_gen = steps + 1 - n;
	assert_int_equal(n_gen, 60);
	int32_t *all = malloc((size_t)(n + n_gen) * sizeof(int32_t));
	assert_non_null(all);
	memcpy(all, ids, (size_t)n * sizeof(int32_t));

	struct fwd *f = fwd_new(fx->bin, fx->be2, 64);
	assert_non_null(f);
	float *l = logits_new(1);
	struct kvseq s = { 0 };
	assert_int_equal(run_seq(f, &s, ids, n, 0, l, 0), 0);
	int total = n;
	for (int i = 0; i < n_gen; i++) {
		int32_t t = argmax(l, fx->vocab);
		if (t == fx->bin->cfg.bos)
			break;
		all[total++] = t;
		if (i + 1 < n_gen)
			assert_int_equal(run_seq(f, &s, &t, 1, total - 1, l, 0), 0);
	}
	assert_int_equal(total, n + n_gen);
	char *got = NULL;
	int glen = tok_decode(fx->bin->tok, all, total, &got);
	assert_true(glen >= 0);
	if (strcmp(got, want) != 0)
		fail_msg("greedy output differs from run.c:\n got: [%s]\nwant: [%s]", got, want);
	assert_int_equal((size_t)glen, strlen(want));

	kvseq_release(fx->pool, &s);
	fwd_free(f);
	free(got);
	free(want);
	free(l);
	free(all);
	free(ids);
}

/* (e) bad input is refused with -EINVAL before anything is computed. */
static void test_einval(void **state)
{
	(void)state;
	const struct model_config *c = &fx->bin->cfg;
	struct fwd *f = fwd_new(fx->bin, fx->be1, 16);
	assert_non_null(f);
	struct kvseq s = { 0 }, ok = { 0 };
	assert_int_equal(kvseq_prepare(fx->pool, &s, c->max_ctx, 0), 0);
	assert_int_equal(kvseq_prepare(fx->pool, &ok, 4, 0), 0);
	float *l = logits_new(1), *lok = logits_new(1);
	int32_t good[3] = { 1, 100, 200 };
	int32_t bad_hi[3] = { 1, c->vocab, 200 };
	int32_t bad_neg[3] = { 1, -1, 200 };
	int32_t last[1] = { c->vocab - 1 };
	struct fwd_seq q = { good, 3, 0, s.blocks, l, 0 };

	q.tokens = bad_hi;
	assert_int_equal(fwd_run(f, &fx->pool->kv, &q, 1), -EINVAL);
	q.tokens = bad_neg;
	assert_int_equal(fwd_run(f, &fx->pool->kv, &q, 1), -EINVAL);
	q.tokens = good;
	q.pos = c->max_ctx - 2;  /* pos + n = max_ctx + 1 */
	assert_int_equal(fwd_run(f, &fx->pool->kv, &q, 1), -EINVAL);
	q.pos = c->max_ctx;
	q.n_tokens = 1;
	assert_int_equal(fwd_run(f, &fx->pool->kv, &q, 1), -EINVAL);
	q.pos = -1;
	assert_int_equal(fwd_run(f, &fx->pool->kv, &q, 1), -EINVAL);
	q.pos = 0;
	q.n_tokens = 0;
	assert_int_equal(fwd_run(f, &fx->pool->kv, &q, 1), -EINVAL);
	for (int i = 0; i < fx->vocab; i++)
		assert_true(isnan(l[i]));  /* nothing was written */

	/* a bad sequence anywhere in the batch refuses the whole batch */
	struct fwd_seq two[2] = {
		{ good, 3, 0, ok.blocks, lok, 0 },
		{ bad_hi, 3, 0, s.blocks, l, 0 },
	};
	assert_int_equal(fwd_run(f, &fx->pool->kv, two, 2), -EINVAL);
	for (int i = 0; i < fx->vocab; i++)
		assert_true(isnan(lok[i]));

	/* the limits themselves are fine: last position, last id */
	q = (struct fwd_seq){ last, 1, c->max_ctx - 1, s.blocks, l, 0 };
	assert_int_equal(fwd_run(f, &fx->pool->kv, &q, 1), 0);
	assert_finite(l, (size_t)fx->vocab);
	q = (struct fwd_seq){ good, 3, c->max_ctx - 3, s.blocks, l, 0 };
	assert_int_equal(fwd_run(f, &fx->pool->kv, &q, 1), 0);
	/* no logits requested is fine too */
	q.logits = NULL;
	assert_int_equal(fwd_run(f, &fx->pool->kv, &q, 1), 0);
	/* an empty batch does nothing */
	assert_int_equal(fwd_run(f, &fx->pool->kv, NULL, 0), 0);

	kvseq_release(fx->pool, &s);
	kvseq_release(fx->pool, &ok);
	fwd_free(f);
	free(l);
	free(lok);
}

/* (f) all_logits: row i equals the last logits of the prefix tokens[0..i];
 * more rows than the classifier's 16-row chunk. */
static void test_all_logits(void **state)
{
	(void)state;
	int32_t *ids;
	int n = encode(fx->bin,
		       "Once upon a time, there was a little girl named Lily. "
		       "She loved to play outside.", &ids);
	assert_true(n > 16);
	struct fwd *f = fwd_new(fx->bin, fx->be1, 512);
	assert_non_null(f);
	float *all = logits_new(n), *one = logits_new(1);
	struct kvseq s = { 0 };
	assert_int_equal(run_seq(f, &s, ids, n, 0, all, 1), 0);
	assert_finite(all, (size_t)n * fx->vocab);
	for (int i = 0; i < n; i++) {
		prefill_fresh(f, ids, i + 1, one);
		assert_logits_equal(all + (size_t)i * fx->vocab, one, 1, "all_logits row vs prefix");
	}
	/* all_logits for a decode step is just its one row */
	float *d1 = logits_new(1), *d2 = logits_new(1);
	int32_t t = argmax(all + (size_t)(n - 1) * fx->vocab, fx->vocab);
	struct kvseq s2 = { 0 };
	assert_int_equal(run_seq(f, &s2, ids, n, 0, NULL, 0), 0);
	assert_int_equal(run_seq(f, &s, &t, 1, n, d1, 1), 0);
	assert_int_equal(run_seq(f, &s2, &t, 1, n, d2, 0), 0);
	assert_logits_equal(d1, d2, 1, "all_logits decode");
	kvseq_release(fx->pool, &s);
	kvseq_release(fx->pool, &s2);
	fwd_free(f);
	free(all);
	free(one);
	free(d1);
	free(d2);
	free(ids);
}

/* (g) 1 vs 2 threads: a prefill long enough for every op to go parallel
 * (matmul, attention, silu_mul), then decode steps. */
static void test_threads(void **state)
{
	(void)state;
	const int n = 400;
	int32_t *tok = malloc((size_t)n * sizeof(int32_t));
	assert_non_null(tok);
	uint32_t r = 12345;
	tok[0] = fx->bin->cfg.bos;
	for (int i = 1; i < n; i++) {
		r = r * 1103515245u + 12345u;
		tok[i] = 3 + (int32_t)((r >> 8) % (uint32_t)(fx->vocab - 3));
	}
	struct fwd *f1 = fwd_new(fx->bin, fx->be1, 512);
	struct fwd *f2 = fwd_new(fx->bin, fx->be2, 512);
	assert_non_null(f1);
	assert_non_null(f2);
	float *a = logits_new(n), *b = logits_new(n);
	struct kvseq s1 = { 0 }, s2 = { 0 };
	assert_int_equal(run_seq(f1, &s1, tok, n, 0, a, 1), 0);
	assert_int_equal(run_seq(f2, &s2, tok, n, 0, b, 1), 0);
	assert_finite(a, (size_t)n * fx->vocab);
	assert_logits_equal(a, b, (size_t)n, "1 vs 2 threads, prefill");
	for (int i = 0; i < 5; i++) {
		int32_t t = argmax(a, fx->vocab);
		assert_int_equal(run_seq(f1, &s1, &t, 1, n + i, a, 0), 0);
		assert_int_equal(run_seq(f2, &s2, &t, 1, n + i, b, 0), 0);
		assert_logits_equal(a, b, 1, "1 vs 2 threads, decode");
	}
	kvseq_release(fx->pool, &s1);
	kvseq_release(fx->pool, &s2);
	fwd_free(f1);
	fwd_free(f2);
	free(a);
	free(b);
	free(tok);
}

/* (h) a fwd with room for 3 tokens cuts a 10-token prompt (and a batch of
 * sequences) into chunks; the logits equal those of one big call. */
static void test_chunking(void **state)
{
	(void)state;
	int32_t *ids;
	int n = encode(fx->bin, "Once upon a time, there was a little", &ids);
	if (n > 10)
		n = 10;
	assert_int_equal(n, 10);
	struct fwd *small = fwd_new(fx->bin, fx->be1, 3);
	struct fwd *big = fwd_new(fx->bin, fx->be1, 512);
	assert_non_null(small);
	assert_non_null(big);
	float *a = logits_new(1), *b = logits_new(1);
	prefill_fresh(small, ids, n, a);
	prefill_fresh(big, ids, n, b);
	assert_logits_equal(a, b, 1, "max_tokens 3 vs 512, last");
	float *aa = logits_new(n), *ab = logits_new(n);
	struct kvseq s1 = { 0 }, s2 = { 0 };
	assert_int_equal(run_seq(small, &s1, ids, n, 0, aa, 1), 0);
	assert_int_equal(run_seq(big, &s2, ids, n, 0, ab, 1), 0);
	assert_logits_equal(aa, ab, (size_t)n, "max_tokens 3 vs 512, all rows");
	kvseq_release(fx->pool, &s1);
	kvseq_release(fx->pool, &s2);

	/* a batch of 3 sequences (7 + 1 + 4 tokens): chunks cut across them */
	int len[3] = { 7, 1, 4 };
	const int32_t *src[3] = { ids, ids + 2, ids + 5 };
	struct kvseq sa[3] = { { 0 } }, sb[3] = { { 0 } };
	struct fwd_seq qa[3], qb[3];
	float *la[3], *lb[3];
	for (int i = 0; i < 3; i++) {
		la[i] = logits_new(len[i]);
		lb[i] = logits_new(len[i]);
		assert_int_equal(kvseq_prepare(fx->pool, &sa[i], len[i], 0), 0);
		assert_int_equal(kvseq_prepare(fx->pool, &sb[i], len[i], 0), 0);
		qa[i] = (struct fwd_seq){ src[i], len[i], 0, sa[i].blocks, la[i], i != 1 };
		qb[i] = (struct fwd_seq){ src[i], len[i], 0, sb[i].blocks, lb[i], i != 1 };
	}
	assert_int_equal(fwd_run(small, &fx->pool->kv, qa, 3), 0);
	assert_int_equal(fwd_run(big, &fx->pool->kv, qb, 3), 0);
	for (int i = 0; i < 3; i++) {
		int rows = i != 1 ? len[i] : 1;
		assert_finite(la[i], (size_t)rows * fx->vocab);
		assert_logits_equal(la[i], lb[i], (size_t)rows, "chunked batch");
		kvseq_release(fx->pool, &sa[i]);
		kvseq_release(fx->pool, &sb[i]);
		free(la[i]);
		free(lb[i]);
	}
	fwd_free(small);
	fwd_free(big);
	free(a);
	free(b);
	free(aa);
	free(ab);
	free(ids);
}

/* A fork shares the prompt's KV; the two branches then diverge and each
 * equals a fresh run of its own tokens (copy-on-write kept them apart). */
static void test_fork_branches(void **state)
{
	(void)state;
	int32_t *ids;
	int n = encode(fx->bin, "Once upon a time, there was a", &ids);
	int32_t *ext = malloc((size_t)(n + 1) * sizeof(int32_t));
	assert_non_null(ext);
	memcpy(ext, ids, (size_t)n * sizeof(int32_t));
	struct fwd *f = fwd_new(fx->bin, fx->be1, 512);
	assert_non_null(f);
	float *l = logits_new(1), *ref = logits_new(1);
	struct kvseq a = { 0 }, b = { 0 };
	assert_int_equal(run_seq(f, &a, ids, n, 0, l, 0), 0);
	assert_int_equal(kvseq_fork(fx->pool, &b, &a), 0);
	int32_t ta = 100, tb = 200;
	/* b first: it copies the shared last block, then a writes its own */
	assert_int_equal(run_seq(f, &b, &tb, 1, n, l, 0), 0);
	ext[n] = tb;
	prefill_fresh(f, ext, n + 1, ref);
	assert_logits_equal(l, ref, 1, "fork branch b");
	assert_int_equal(run_seq(f, &a, &ta, 1, n, l, 0), 0);
	ext[n] = ta;
	prefill_fresh(f, ext, n + 1, ref);
	assert_logits_equal(l, ref, 1, "fork branch a");
	kvseq_release(fx->pool, &a);
	kvseq_release(fx->pool, &b);
	fwd_free(f);
	free(l);
	free(ref);
	free(ext);
	free(ids);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_model_shape, check_pool_empty),
		cmocka_unit_test_teardown(test_prefill_vs_decode, check_pool_empty),
		cmocka_unit_test_teardown(test_batch_invariance, check_pool_empty),
		cmocka_unit_test_teardown(test_bin_vs_hf, check_pool_empty),
		cmocka_unit_test_teardown(test_greedy_golden, check_pool_empty),
		cmocka_unit_test_teardown(test_einval, check_pool_empty),
		cmocka_unit_test_teardown(test_all_logits, check_pool_empty),
		cmocka_unit_test_teardown(test_threads, check_pool_empty),
		cmocka_unit_test_teardown(test_chunking, check_pool_empty),
		cmocka_unit_test_teardown(test_fork_branches, check_pool_empty),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

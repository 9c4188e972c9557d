/*
 * tests/bench/shift.c — llamad-bench --shift: a context shift, by the two
 * ways of keeping the tokens that stay when the oldest ones are removed:
 *
 *   re-prefill   the kept tokens after the removed ones run through the
 *                model again at their new positions (what llamad does:
 *                session/turns.c forgets their cache);
 *   re-rotation  their cached K is rotated back by the positions they
 *                move (RoPE makes that a rotation of each channel pair)
 *                and K/V are moved, nothing recomputed (llama.cpp's
 *                context shift).
 *
 * A shift keeps the first `keep` tokens and removes half of the rest (the
 * oldest), as llamad's turn_slide and llama.cpp do.
 *
 * Time, in the K/V type asked (--kv-type): the re-prefill of the kept tail
 * (the head stays cached) and the rotation of that tail's K with the move
 * of its K/V rows (host memory, one thread, each row read as fp32 and
 * stored again in the pool's type: no backend has such an op), beside the
 * decode time of a token; the next shift comes `discard` tokens later, so
 * re-prefill costs prefill_tail / discard per generated token.
 *
 * Accuracy: a text sampled (temperature 0.8, fixed seed) from the logits
 * of re-prefill with K/V in f32, through `shifts` shifts, is fed to six
 * caches: re-prefill and re-rotation, each with K/V stored in f32, f16 and
 * q8_0 (kernels/backend.h's types; a rotated row is stored again, rounded
 * again). Each step compares their logits with those of re-prefill in
 * f32, which are bit-identical to a fresh prefill of the tokens kept
 * (checked at the end): the mean KL divergence, the largest logit
 * difference and how often the most likely token is the same, per phase
 * (the number of shifts so far). Re-rotation differs for two reasons: the
 * kept tokens' K/V in layers after the first still carry what they
 * attended to before the shift (the removed tokens), and the rotation's
 * rounding, which a narrow K type makes larger and repeats at each shift
 * a row survives.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "model/forward.h"
#include "session/kvpool.h"
#include "tests/bench/shift.h"
#include "util/clock.h"

#define MAX_PHASES 16

/* One KV cache of the comparison. */
struct cache {
	const char *name;
	int rotate;               /* a shift rotates and moves K/V (else re-prefill) */
	enum kt_dtype dtype;      /* K/V element type */
	struct kvpool *pool;
	struct kvseq seq;
	int cached;               /* positions [0, cached) have K/V */
	float *logits;            /* (vocab) of the last position run */
	/* against re-prefill in f32, per phase */
	double kl[MAX_PHASES], dmax[MAX_PHASES];
	long same[MAX_PHASES], n[MAX_PHASES];
};

static int cache_init(struct cache *c, const struct model *m, int window)
{
	const struct model_config *cf = &m->cfg;
	c->pool = kvpool_new_typed(NULL, c->dtype, cf->head_dim,
				   (window + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS, KV_BLOCK_TOKENS,
				   cf->n_layers, model_kv_dim(cf));
	c->logits = malloc((size_t)cf->vocab * sizeof(float));
	if (!c->pool || !c->logits || kvseq_prepare(c->pool, &c->seq, window, 0))
		return -1;
	return 0;
}

static void cache_done(struct cache *c)
{
	if (c->pool)
		kvseq_release(c->pool, &c->seq);
	kvpool_free(c->pool);
	free(c->logits);
}

/* Run tokens [from, to) of toks through c from position from (its cache
 * holds [0, from)), the last one's logits into c->logits. */
static int cache_run(struct cache *c, struct fwd *f, const int32_t *toks, int from, int to)
{
	struct fwd_seq s = { toks + from, to - from, from, c->seq.blocks, c->logits, 0 };
	int rc = fwd_run(f, &c->pool->kv, &s, 1);
	if (rc)
		return rc;
	c->cached = to;
	return 0;
}

/* Re-rotation: move the K/V of positions [src, end) of c down by d, each K
 * channel pair rotated back by d positions (K is stored in the interleaved
 * layout whatever the weights', the RoPE op's output), each row read as
 * fp32 and stored again in the pool's type. -ENOMEM or 0. */
static int rotate_move(struct cache *c, const struct model *m, int src, int end, int d)
{
	const struct kt_kv *kv = &c->pool->kv;
	int bs = kv->block_size, hd = m->cfg.head_dim, half = hd / 2, kd = kv->kv_dim;
	float co[256], si[256];
	float *k = malloc((size_t)kd * 2 * sizeof(float)), *v = k + kd;
	if (!k)
		return -ENOMEM;
	for (int i = 0; i < half; i++) {
		float ang = (float)(-d) * m->inv_freq[i];
		co[i] = cosf(ang);
		si[i] = sinf(ang);
	}
	for (int p = src; p < end; p++) {  /* upwards: a row is read before it is written */
		int q = p - d;
		int32_t bp = c->seq.blocks[p / bs], bq = c->seq.blocks[q / bs];
		for (int l = 0; l < m->cfg.n_layers; l++) {
			kt_kv_get_k(kv, bp, l, p % bs, k);
			kt_kv_get_v(kv, bp, l, p % bs, v);
			for (int h = 0; h < m->cfg.n_kv_heads; h++)
				for (int i = 0; i < half; i++) {
					float *x = k + h * hd + 2 * i, a = x[0], b = x[1];
					x[0] = a * co[i] - b * si[i];
					x[1] = a * si[i] + b * co[i];
				}
			kt_kv_put(kv, bq, l, q % bs, k, v);
		}
	}
	free(k);
	return 0;
}

/* Softmax of l (n) in double into p. */
static void softmax(const float *l, int n, double *p)
{
	float mx = l[0];
	for (int i = 1; i < n; i++)
		mx = fmaxf(mx, l[i]);
	double z = 0;
	for (int i = 0; i < n; i++)
		z += p[i] = exp((double)l[i] - mx);
	for (int i = 0; i < n; i++)
		p[i] /= z;
}

static int argmax(const float *l, int n)
{
	int b = 0;
	for (int i = 1; i < n; i++)
		if (l[i] > l[b])
			b = i;
	return b;
}

/* Fold c's logits against the reference's (ref, probabilities pr) into
 * phase ph. */
static void compare(struct cache *c, const float *ref, const double *pr, double *pc, int vocab,
		    int ph)
{
	softmax(c->logits, vocab, pc);
	double kl = 0, dm = 0;
	for (int i = 0; i < vocab; i++) {
		if (pr[i] > 0)
			kl += pr[i] * (log(pr[i]) - log(pc[i] > 1e-300 ? pc[i] : 1e-300));
		dm = fmax(dm, fabs((double)c->logits[i] - ref[i]));
	}
	c->kl[ph] += kl;
	c->dmax[ph] = fmax(c->dmax[ph], dm);
	c->same[ph] += argmax(c->logits, vocab) == argmax(ref, vocab);
	c->n[ph]++;
}

static uint64_t xorshift(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

/* A token from logits l at temperature 0.8. */
static int32_t sample(const float *l, int n, double *p, uint64_t *rng)
{
	float t[n];
	for (int i = 0; i < n; i++)
		t[i] = l[i] / 0.8f;
	softmax(t, n, p);
	double u = (double)(xorshift(rng) >> 11) * 0x1.0p-53, acc = 0;
	for (int i = 0; i < n; i++)
		if ((acc += p[i]) > u)
			return i;
	return n - 1;
}

/* The time of a shift's two ways, beside decoding. */
static int timing(struct model *m, struct fwd *f, const struct shift_opts *o, int threads,
		  int window, int keep, int discard)
{
	struct cache c = { .name = "timing", .dtype = o->kv_type };
	int32_t *toks = malloc((size_t)window * sizeof(int32_t));
	if (!toks || cache_init(&c, m, window)) {
		free(toks);
		cache_done(&c);
		return -1;
	}
	uint64_t x = 88172645463325252ull;
	toks[0] = m->cfg.bos;
	for (int i = 1; i < window; i++)
		toks[i] = 3 + (int32_t)(xorshift(&x) % (uint64_t)(m->cfg.vocab - 3));
	cache_run(&c, f, toks, 0, window);
	int tail = window - keep - discard;
	double pre = 1e30, rot = 1e30, dec = 1e30;
	for (int r = 0; r < o->reps; r++) {
		double t0 = clock_mono_s();
		cache_run(&c, f, toks, keep, keep + tail);   /* the tail at its new place */
		double t1 = clock_mono_s();
		if (rotate_move(&c, m, keep + discard, window, discard))
			break;
		double t2 = clock_mono_s();
		for (int i = 0; i < 8; i++)   /* decode after the shift */
			cache_run(&c, f, toks, keep + tail + i, keep + tail + i + 1);
		double t3 = clock_mono_s();
		pre = fmin(pre, t1 - t0);
		rot = fmin(rot, t2 - t1);
		dec = fmin(dec, (t3 - t2) / 8);
	}
	printf("shift_time model=%s kv_type=%s threads=%d window=%d keep=%d discard=%d "
	       "kept_tail=%d "
	       "reprefill_tail_ms=%.3f rotate_tail_ms=%.3f decode_ms=%.3f "
	       "reprefill_per_token_ms=%.3f reprefill_overhead_pct=%.1f "
	       "rotate_per_token_ms=%.4f rotate_overhead_pct=%.2f\n",
	       m->path, kt_dtype_name(o->kv_type), threads, window, keep, discard, tail, pre * 1e3,
	       rot * 1e3,
	       dec * 1e3, pre / discard * 1e3, 100.0 * pre / discard / dec, rot / discard * 1e3,
	       100.0 * rot / discard / dec);
	free(toks);
	cache_done(&c);
	return 0;
}

/* The four caches through o->shifts shifts. */
static int accuracy(struct model *m, struct fwd *f, const struct shift_opts *o, int window,
		    int keep, int discard)
{
	int vocab = m->cfg.vocab, shifts = o->shifts < MAX_PHASES ? o->shifts : MAX_PHASES - 1;
	enum { N_CACHES = 6 };
	struct cache cs[N_CACHES + 1] = {
		{ .name = "reprefill-f32", .dtype = KT_F32 },
		{ .name = "rotate-f32", .dtype = KT_F32, .rotate = 1 },
		{ .name = "reprefill-f16", .dtype = KT_F16 },
		{ .name = "rotate-f16", .dtype = KT_F16, .rotate = 1 },
		{ .name = "reprefill-q8_0", .dtype = KT_Q8_0 },
		{ .name = "rotate-q8_0", .dtype = KT_Q8_0, .rotate = 1 },
		{ .name = "fresh", .dtype = KT_F32 },   /* the end's check: a fresh prefill */
	};
	int32_t *toks = malloc((size_t)window * sizeof(int32_t));
	double *pr = malloc((size_t)vocab * sizeof(double)), *pc = malloc((size_t)vocab * sizeof(double));
	int rc = toks && pr && pc ? 0 : -1;
	for (int i = 0; i <= N_CACHES && !rc; i++)
		rc = cache_init(&cs[i], m, window);
	uint64_t rng = 0x9e3779b97f4a7c15ull ^ o->seed;
	int n = 1, ph = 0, since = 0;
	if (!rc) {
		toks[0] = m->cfg.bos;
		for (int i = 0; i < N_CACHES && !rc; i++)
			rc = cache_run(&cs[i], f, toks, 0, 1);
	}
	/* until the last phase has as many tokens as a shift brings */
	while (!rc && !(ph == shifts && since >= discard)) {
		int32_t next = sample(cs[0].logits, vocab, pr, &rng);
		if (n + 1 > window) {   /* the shift: keep [0, keep), drop discard after it */
			memmove(toks + keep, toks + keep + discard,
				(size_t)(n - keep - discard) * sizeof(int32_t));
			for (int i = 0; i < N_CACHES && !rc; i++) {
				if (cs[i].rotate) {
					rc = rotate_move(&cs[i], m, keep + discard, n, discard);
					cs[i].cached = n - discard;
				} else {
					cs[i].cached = keep;
				}
			}
			n -= discard;
			ph++;
			since = 0;
		}
		toks[n++] = next;
		for (int i = 0; i < N_CACHES && !rc; i++)
			rc = cache_run(&cs[i], f, toks, cs[i].cached, n);
		softmax(cs[0].logits, vocab, pr);
		for (int i = 1; i < N_CACHES; i++)
			compare(&cs[i], cs[0].logits, pr, pc, vocab, ph);
		since++;
	}
	if (!rc)
		rc = cache_run(&cs[N_CACHES], f, toks, 0, n);
	if (!rc) {
		int equal = memcmp(cs[N_CACHES].logits, cs[0].logits, (size_t)vocab * sizeof(float)) == 0;
		printf("shift_accuracy model=%s window=%d keep=%d discard=%d shifts=%d tokens=%d "
		       "fresh_prefill_bit_identical=%s\n", m->path, window, keep, discard, shifts,
		       window - 1 + shifts * discard, equal ? "yes" : "NO");
		for (int i = 1; i < N_CACHES; i++)
			for (int p = 0; p <= shifts; p++)
				printf("shift_accuracy cache=%s phase=%d steps=%ld kl_mean=%.3g "
				       "dlogit_max=%.4g top1_same_pct=%.2f\n", cs[i].name, p, cs[i].n[p],
				       cs[i].n[p] ? cs[i].kl[p] / cs[i].n[p] : 0.0, cs[i].dmax[p],
				       cs[i].n[p] ? 100.0 * cs[i].same[p] / cs[i].n[p] : 0.0);
	}
	for (int i = 0; i <= N_CACHES; i++)
		cache_done(&cs[i]);
	free(toks);
	free(pr);
	free(pc);
	return rc;
}

int shift_bench(struct model *m, const struct shift_opts *o)
{
	int window = o->window > 0 && o->window < m->cfg.max_ctx ? o->window : m->cfg.max_ctx;
	int keep = o->keep;
	if (keep < 1 || keep + 2 >= window || o->reps < 1) {
		fprintf(stderr, "llamad-bench: --keep must be 1..window-3 (window %d)\n", window);
		return 1;
	}
	int discard = (window - keep) / 2;
	struct backend *be = backend_cpu_new(o->threads);
	struct fwd *f = be ? fwd_new(m, be, window) : NULL;
	int rc = f ? timing(m, f, o, be->n_threads, window, keep, discard) : -1;
	if (!rc && o->shifts > 0)
		rc = accuracy(m, f, o, window, keep, discard);
	if (rc)
		fprintf(stderr, "llamad-bench: --shift: out of memory or a forward pass failed\n");
	fwd_free(f);
	backend_free(be);
	return rc ? 1 : 0;
}

/*
 * tests/gpu/check.c — llamad-gpucheck: the CUDA backend against the CPU
 * backend, and its benchmarks.
 *
 *   llamad-gpucheck ops       every op on random inputs, CUDA vs CPU (kv_store
 *                             and attention with K/V in f32, f16, q8_0: the
 *                             typed stores' bytes equal to the CPU's)
 *   llamad-gpucheck logits    a 2-layer model of 7B width (random weights):
 *                             prefill and decode logits, CUDA vs CPU
 *   llamad-gpucheck cands     every layer candidate (base, fused, persistent,
 *                             splitk: kernels/cuda/plan.h) x f16 / Q8_0 /
 *                             Q4_0 / Q4_K on a 2-layer GQA model of 7B width:
 *                             logits of batch 1, 3, 5 and 8 rows vs CPU;
 *                             f16 / Q8_0 weights also with K/V in f16 and
 *                             q8_0 (logits and the stored K/V vs CPU)
 *   llamad-gpucheck prof      a few matrix-vector products, for ncu
 *   llamad-gpucheck bench [--quick]
 *                             7B shape (random weights): copy bandwidth, GEMM
 *                             rate, per candidate x dtype (f16, Q8_0, Q4_0,
 *                             Q4_K) batch-1 and batch-8 decode (f16: also at
 *                             3,000 tokens); 64-session decode, 2,048-token
 *                             prefill, a 32-token turn after 3,000 tokens
 *
 * Each check prints "ok"/"FAIL" with its relative error ||gpu - cpu|| /
 * ||cpu|| against its tolerance (docs/PERF.md lists them); outputs are
 * poisoned with NaN first, so an unwritten element fails. Bench lines are
 * key=value. Exit status: 0 all passed, 1 a check failed, 77 no usable GPU.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/backend.h"
#include "kernels/cuda/plan.h"
#include "model/forward.h"
#include "session/kvpool.h"

static int n_fail, n_ok;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float frand(void)  /* uniform in [-1, 1) */
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (float)((rng_state >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	if (!p) {
		fprintf(stderr, "out of memory (%zu bytes)\n", n);
		exit(2);
	}
	return p;
}

static float *rand_vec(size_t n, float scale)
{
	float *v = xmalloc(n * sizeof(float));
	for (size_t i = 0; i < n; i++)
		v[i] = frand() * scale;
	return v;
}

static double rel_err(const float *got, const float *ref, size_t n)
{
	double num = 0, den = 0;
	for (size_t i = 0; i < n; i++) {
		if (!isfinite(got[i]))
			return INFINITY;
		double d = (double)got[i] - ref[i];
		num += d * d;
		den += (double)ref[i] * ref[i];
	}
	return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void report(const char *what, double err, double tol)
{
	int ok = err <= tol;
	printf("%-4s %-44s relerr %.2e  tol %.0e\n", ok ? "ok" : "FAIL", what, err, tol);
	fflush(stdout);
	ok ? n_ok++ : n_fail++;
}

/* Device buffer holding a copy of host (or NaN when host is NULL). */
static float *dev(struct backend *g, const float *host, size_t n)
{
	float *d = g->ops->mem_alloc(g, n * sizeof(float));
	float *tmp = NULL;
	if (!host) {
		tmp = xmalloc(n * sizeof(float));
		for (size_t i = 0; i < n; i++)
			tmp[i] = NAN;
		host = tmp;
	}
	if (!d || g->ops->upload(g, d, host, n * sizeof(float)) != 0) {
		fprintf(stderr, "device allocation/upload of %zu floats failed\n", n);
		exit(1);
	}
	free(tmp);
	return d;
}

static float *back(struct backend *g, const float *d, size_t n)
{
	float *h = xmalloc(n * sizeof(float));
	if (g->ops->download(g, h, d, n * sizeof(float)) != 0) {
		fprintf(stderr, "download failed\n");
		exit(1);
	}
	return h;
}

/* ---- weights in any dtype from fp32 values ---- */

static void *make_weight(enum kt_dtype t, const float *f, int rows, int cols)
{
	size_t rb = kt_row_bytes(t, (size_t)cols);
	uint8_t *w = xmalloc(rb * rows);
	for (int r = 0; r < rows; r++) {
		const float *src = f + (size_t)r * cols;
		uint8_t *dst = w + rb * r;
		switch (t) {
		case KT_F32: memcpy(dst, src, rb); break;
		case KT_F16:
			for (int c = 0; c < cols; c++)
				((uint16_t *)dst)[c] = kt_f32_to_f16(src[c]);
			break;
		case KT_BF16:
			for (int c = 0; c < cols; c++)
				((uint16_t *)dst)[c] = kt_f32_to_bf16(src[c]);
			break;
		case KT_Q8_0: kt_quantize_q8_0(src, dst, (size_t)cols); break;
		case KT_Q4_0: kt_quantize_q4_0(src, dst, (size_t)cols); break;
		case KT_Q4_K: kt_quantize_q4_k(src, dst, (size_t)cols); break;
		case KT_Q5_K: kt_quantize_q5_k(src, dst, (size_t)cols); break;
		case KT_Q6_K: kt_quantize_q6_k(src, dst, (size_t)cols); break;
		}
	}
	return w;
}

/* Random weights kept for freeing; a whole random model when m is used. */
struct rmodel {
	struct model m;
	void *bufs[16];
	int n_bufs;
};

static void *wbuf(struct rmodel *r, enum kt_dtype t, int rows, int cols)
{
	float *f = rand_vec((size_t)rows * cols, 1.0f / sqrtf((float)cols));
	void *w = make_weight(t, f, rows, cols);
	free(f);
	r->bufs[r->n_bufs++] = w;
	return w;
}

/* ---- op checks ---- */

static void check_matmul(struct backend *cpu, struct backend *g, enum kt_dtype t, int rows,
			 int cols, int T, double tol)
{
	float *wf = rand_vec((size_t)rows * cols, 1.0f / sqrtf((float)cols));
	struct kt_weight w = { make_weight(t, wf, rows, cols), t, rows, cols, NULL }, dw;
	float *x = rand_vec((size_t)T * cols, 1.0f);
	float *ref = xmalloc((size_t)T * rows * sizeof(float));
	cpu->ops->matmul(cpu, ref, x, &w, T);
	if (g->ops->weight_place(g, &dw, &w, KT_USE_MATMUL) != 0) {
		fprintf(stderr, "weight_place failed\n");
		exit(1);
	}
	float *dx = dev(g, x, (size_t)T * cols), *dy = dev(g, NULL, (size_t)T * rows);
	g->ops->matmul(g, dy, dx, &dw, T);
	float *got = back(g, dy, (size_t)T * rows);
	char name[96];
	snprintf(name, sizeof(name), "matmul %s %dx%d T=%d (device %s)", kt_dtype_name(t), rows,
		 cols, T, kt_dtype_name(dw.dtype));
	report(name, rel_err(got, ref, (size_t)T * rows), tol);
	g->ops->weight_release(g, &dw);
	g->ops->mem_free(g, dx);
	g->ops->mem_free(g, dy);
	free(wf);
	free((void *)w.data);
	free(x);
	free(ref);
	free(got);
}

/* The fused matmul forms against the CPU's separate ops: q/k/v sharing x,
 * y += x W^T, silu(x G^T) * (x U^T). */
static void check_fused(struct backend *cpu, struct backend *g, enum kt_dtype t, int T, double tol)
{
	int D = 512, F = 1376, KV = 128;
	struct rmodel tmp = { 0 };
	struct kt_weight w[3] = { { wbuf(&tmp, t, D, D), t, D, D, NULL }, { wbuf(&tmp, t, KV, D), t, KV, D, NULL },
				  { wbuf(&tmp, t, F, D), t, F, D, NULL } };
	struct kt_weight up = { wbuf(&tmp, t, F, D), t, F, D, NULL }, dw[3], dup;
	for (int i = 0; i < 3; i++)
		g->ops->weight_place(g, &dw[i], &w[i], KT_USE_MATMUL);
	g->ops->weight_place(g, &dup, &up, KT_USE_MATMUL);
	float *x = rand_vec((size_t)T * D, 1.f), *dx = dev(g, x, (size_t)T * D);
	/* matmul_n */
	float *ref[3], *dy[3];
	const struct kt_weight *dws[3] = { &dw[0], &dw[1], &dw[2] };
	for (int i = 0; i < 3; i++) {
		ref[i] = xmalloc((size_t)T * w[i].rows * 4);
		cpu->ops->matmul(cpu, ref[i], x, &w[i], T);
		dy[i] = dev(g, NULL, (size_t)T * w[i].rows);
	}
	g->ops->matmul_n(g, 3, dy, dws, dx, T);
	double worst = 0;
	for (int i = 0; i < 3; i++) {
		float *got = back(g, dy[i], (size_t)T * w[i].rows);
		double e = rel_err(got, ref[i], (size_t)T * w[i].rows);
		worst = e > worst ? e : worst;
		free(got);
	}
	char name[96];
	snprintf(name, sizeof(name), "matmul_n (q,k,v) %s T=%d", kt_dtype_name(t), T);
	report(name, worst, tol);
	/* matmul_add: y0 + x W0^T */
	float *y0 = rand_vec((size_t)T * D, 1.f), *dy0 = dev(g, y0, (size_t)T * D);
	cpu->ops->add(cpu, y0, ref[0], (size_t)T * D);
	g->ops->matmul_add(g, dy0, dx, &dw[0], T);
	float *got = back(g, dy0, (size_t)T * D);
	snprintf(name, sizeof(name), "matmul_add %s T=%d", kt_dtype_name(t), T);
	report(name, rel_err(got, y0, (size_t)T * D), tol);
	free(got);
	/* matmul_swiglu: silu(x W2^T) * (x U^T) */
	float *u = xmalloc((size_t)T * F * 4), *dh = dev(g, NULL, (size_t)T * F);
	cpu->ops->matmul(cpu, u, x, &up, T);
	cpu->ops->silu_mul(cpu, ref[2], u, (size_t)T * F);
	g->ops->matmul_swiglu(g, dh, dx, &dw[2], &dup, T);
	got = back(g, dh, (size_t)T * F);
	snprintf(name, sizeof(name), "matmul_swiglu %s T=%d", kt_dtype_name(t), T);
	report(name, rel_err(got, ref[2], (size_t)T * F), tol);
	free(got);
	for (int i = 0; i < 3; i++) {
		g->ops->weight_release(g, &dw[i]);
		g->ops->mem_free(g, dy[i]);
		free(ref[i]);
	}
	g->ops->weight_release(g, &dup);
	g->ops->mem_free(g, dx);
	g->ops->mem_free(g, dy0);
	g->ops->mem_free(g, dh);
	for (int i = 0; i < tmp.n_bufs; i++)
		free(tmp.bufs[i]);
	free(x); free(y0); free(u);
}

static void check_elementwise(struct backend *cpu, struct backend *g)
{
	size_t n = 100003;
	float *a = rand_vec(n, 4.f), *b = rand_vec(n, 2.f), *a2 = xmalloc(n * 4);
	memcpy(a2, a, n * 4);
	float *da = dev(g, a, n), *db = dev(g, b, n);
	cpu->ops->silu_mul(cpu, a2, b, n);
	g->ops->silu_mul(g, da, db, n);
	float *got = back(g, da, n);
	report("silu_mul n=100003", rel_err(got, a2, n), 1e-6);
	free(got);
	memcpy(a2, a, n * 4);
	g->ops->upload(g, da, a, n * 4);
	cpu->ops->add(cpu, a2, b, n);
	g->ops->add(g, da, db, n);
	got = back(g, da, n);
	report("add n=100003", rel_err(got, a2, n), 1e-7);
	free(got);
	int T = 7, d = 4096;
	float *x = rand_vec((size_t)T * d, 3.f), *w = rand_vec(d, 1.f), *y = xmalloc((size_t)T * d * 4);
	float *dx = dev(g, x, (size_t)T * d), *dw = dev(g, w, d), *dy = dev(g, NULL, (size_t)T * d);
	cpu->ops->rmsnorm(cpu, y, x, w, d, T, 1e-5f);
	g->ops->rmsnorm(g, dy, dx, dw, d, T, 1e-5f);
	got = back(g, dy, (size_t)T * d);
	report("rmsnorm 7x4096", rel_err(got, y, (size_t)T * d), 1e-6);
	free(got);
	float *bufs[] = { da, db, dx, dw, dy };
	for (int i = 0; i < 5; i++)
		g->ops->mem_free(g, bufs[i]);
	free(a); free(b); free(a2); free(x); free(w); free(y);
}

/* A fake paged batch: T rows over sequences with their own block tables. */
struct pbatch {
	int T;
	int32_t tok[256];
	int pos[256];
	struct kt_attn_row rows[256];
};

static void check_embed(struct backend *cpu, struct backend *g, enum kt_dtype t)
{
	int V = 1000, D = 4096, T = 13;
	float *f = rand_vec((size_t)V * D, 1.f);
	struct kt_weight w = { make_weight(t, f, V, D), t, V, D, NULL }, dw;
	g->ops->weight_place(g, &dw, &w, KT_USE_ROWS);
	struct pbatch b = { .T = T };
	int32_t tab[1] = { 0 };
	for (int i = 0; i < T; i++) {
		b.tok[i] = (int32_t)((unsigned)(frand() + 1.f) * 499u + (unsigned)i * 37u) % V;
		b.pos[i] = 0;
		b.rows[i].block_table = tab;
		b.rows[i].pos = 0;
	}
	struct kt_kv kv = { NULL, 1, 16, 1, 64, KT_F32, 0 };
	float *ref = xmalloc((size_t)T * D * 4), *dy = dev(g, NULL, (size_t)T * D);
	cpu->ops->embed(cpu, ref, &w, b.tok, T);
	g->ops->batch_begin(g, &kv, b.tok, b.pos, b.rows, T);
	g->ops->embed(g, dy, &dw, b.tok, T);
	float *got = back(g, dy, (size_t)T * D);
	char name[64];
	snprintf(name, sizeof(name), "embed %s 1000x4096 T=13", kt_dtype_name(t));
	/* exact types; K-quants within an fp32 rounding (the device may fuse
	 * d*sc*q - dmin*m into one fma) */
	double tol = t == KT_F32 || t == KT_Q8_0 || t == KT_Q4_0 ? 1e-7 : kt_dtype_is_quant(t) ? 1e-6 : 1e-3;
	report(name, rel_err(got, ref, (size_t)T * D), tol);
	g->ops->weight_release(g, &dw);
	g->ops->mem_free(g, dy);
	free(f); free((void *)w.data); free(ref); free(got);
}

static void check_rope(struct backend *cpu, struct backend *g, enum kt_rope_layout lay)
{
	int T = 9, nh = 8, nkv = 2, hd = 128;
	size_t nq = (size_t)T * nh * hd, nk = (size_t)T * nkv * hd;
	float *q = rand_vec(nq, 1.f), *k = rand_vec(nk, 1.f), inv[64];
	for (int i = 0; i < hd / 2; i++)
		inv[i] = 1.0f / powf(10000.f, (float)(2 * i) / hd);
	struct pbatch b = { .T = T };
	int32_t tab[300];
	for (int i = 0; i < 300; i++)
		tab[i] = i;
	for (int t = 0; t < T; t++) {
		b.pos[t] = b.rows[t].pos = (int)((frand() + 1.f) * 2000.f);
		b.rows[t].block_table = tab;
		b.tok[t] = 1;
	}
	struct kt_kv kv = { NULL, 300, 16, 1, 64, KT_F32, 0 };
	float *dq = dev(g, q, nq), *dk = dev(g, k, nk), *dinv = dev(g, inv, hd / 2);
	cpu->ops->rope(cpu, q, k, b.pos, T, nh, nkv, hd, inv, lay);
	g->ops->batch_begin(g, &kv, b.tok, b.pos, b.rows, T);
	g->ops->rope(g, dq, dk, b.pos, T, nh, nkv, hd, dinv, lay);
	float *gq = back(g, dq, nq), *gk = back(g, dk, nk);
	report(lay == KT_ROPE_HALF ? "rope q (rotate-half layout)" : "rope q (interleaved)",
	       rel_err(gq, q, nq), 1e-5);
	report(lay == KT_ROPE_HALF ? "rope k (rotate-half layout)" : "rope k (interleaved)",
	       rel_err(gk, k, nk), 1e-5);
	g->ops->mem_free(g, dq); g->ops->mem_free(g, dk); g->ops->mem_free(g, dinv);
	free(q); free(k); free(gq); free(gk);
}

/* Where two byte ranges first differ, or -1. */
static long first_diff(const void *a, const void *b, size_t n)
{
	const unsigned char *x = a, *y = b;
	for (size_t i = 0; i < n; i++)
		if (x[i] != y[i])
			return (long)i;
	return -1;
}

/* kv_store + attention over a pool with random content and shuffled block
 * tables: a decode batch (one row per sequence) and a mixed prefill batch,
 * K/V of element type kvt (f32; f16 and q8_0 stored and attended in that
 * type: the device's stored bytes must be the CPU's). */
static void check_attention(struct backend *cpu, struct backend *g, int nh, int nkv, int hd,
			    enum kt_dtype kvt)
{
	const int NB = 640, BS = 16, L = 2, layer = 1;
	int kvd = nkv * hd;
	struct kvpool *hp = kvpool_new_typed(NULL, kvt, hd, NB, BS, L, kvd);
	struct kvpool *gp = kvpool_new_typed(g, kvt, hd, NB, BS, L, kvd);
	if (!hp || !gp) {
		fprintf(stderr, "pool allocation failed\n");
		exit(1);
	}
	size_t pool_b = kt_kv_block_bytes(&hp->kv) * NB;
	if (kvt == KT_F32) {
		for (size_t i = 0; i < pool_b / 4; i++)
			((float *)hp->kv.base)[i] = frand();
	} else {
		/* every row a stored row of random values */
		float *k = xmalloc((size_t)kvd * 4), *v = xmalloc((size_t)kvd * 4);
		for (int b = 0; b < NB; b++)
			for (int l = 0; l < L; l++)
				for (int r = 0; r < BS; r++) {
					for (int c = 0; c < kvd; c++) {
						k[c] = frand();
						v[c] = frand();
					}
					kt_kv_put(&hp->kv, b, l, r, k, v);
				}
		free(k);
		free(v);
	}
	g->ops->upload(g, gp->kv.base, hp->kv.base, pool_b);
	/* five sequences: histories 0, 15, 16, 700, 3000 */
	int hist[5] = { 0, 15, 16, 700, 3000 };
	int32_t *perm = xmalloc(NB * sizeof(int32_t));
	for (int i = 0; i < NB; i++)
		perm[i] = i;
	for (int i = NB - 1; i > 0; i--) {
		int j = (int)((frand() + 1.f) * 0.5f * (float)i);
		int32_t t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
	}
	int32_t *tabs[5];
	int used = 0;
	for (int s = 0; s < 5; s++) {
		int nb = (hist[s] + 40) / BS + 1;
		tabs[s] = perm + used;
		used += nb;
	}
	static const char *pass_name[3] = { "decode", "mixed", "long runs" };
	/* long runs (>= 16 rows) take the GEMM form: f16 operands */
	static const double pass_tol[3] = { 2e-5, 2e-5, 3e-3 };
	for (int pass = 0; pass < 3; pass++) {
		struct pbatch b = { 0 };
		/* decode: one row each; mixed: runs of 9 and 5 rows (tiles) and
		 * single rows; long runs: 37 rows of seq 0, 20 of seq 3 and two
		 * single rows */
		int dec[5][2] = { { 0, 1 }, { 1, 1 }, { 2, 1 }, { 3, 1 }, { 4, 1 } };
		int mix[4][2] = { { 0, 9 }, { 3, 5 }, { 4, 1 }, { 2, 1 } };
		int big[4][2] = { { 0, 37 }, { 3, 20 }, { 4, 1 }, { 2, 1 } };
		int (*plan)[2] = pass == 2 ? big : pass ? mix : dec;
		int np = pass ? 4 : 5;
		for (int i = 0; i < np; i++)
			for (int r = 0; r < plan[i][1]; r++) {
				int s = plan[i][0];
				b.pos[b.T] = b.rows[b.T].pos = hist[s] + r;
				b.rows[b.T].block_table = tabs[s];
				b.tok[b.T++] = 1;
			}
		size_t nq = (size_t)b.T * nh * hd, nk = (size_t)b.T * kvd;
		float *q = rand_vec(nq, 1.f), *k = rand_vec(nk, 1.f), *v = rand_vec(nk, 1.f);
		float *ref = xmalloc(nq * 4);
		float *dq = dev(g, q, nq), *dk = dev(g, k, nk), *dv = dev(g, v, nk), *dout = dev(g, NULL, nq);
		cpu->ops->reserve(cpu, 4096, b.T);
		cpu->ops->kv_store(cpu, &hp->kv, layer, k, v, b.rows, b.T);
		cpu->ops->attention(cpu, ref, q, &hp->kv, layer, b.rows, b.T, nh, nkv, hd);
		g->ops->batch_begin(g, &gp->kv, b.tok, b.pos, b.rows, b.T);
		g->ops->kv_store(g, &gp->kv, layer, dk, dv, b.rows, b.T);
		g->ops->attention(g, dout, dq, &gp->kv, layer, b.rows, b.T, nh, nkv, hd);
		float *got = back(g, dout, nq);
		char name[96], kn[16] = "";
		if (kvt != KT_F32)
			snprintf(kn, sizeof(kn), " kv %s", kt_dtype_name(kvt));
		snprintf(name, sizeof(name), "attention %s T=%d heads %d/%d hd %d%s",
			 pass_name[pass], b.T, nh, nkv, hd, kn);
		report(name, rel_err(got, ref, nq), pass_tol[pass]);
		unsigned char *gpool = xmalloc(pool_b);
		if (g->ops->download(g, gpool, gp->kv.base, pool_b) != 0) {
			fprintf(stderr, "download failed\n");
			exit(1);
		}
		long at = first_diff(gpool, hp->kv.base, pool_b);
		if (kvt == KT_F32)
			snprintf(name, sizeof(name), "kv_store %s T=%d (whole pool)", pass_name[pass], b.T);
		else
			snprintf(name, sizeof(name), "kv_store %s T=%d hd %d%s bytes", pass_name[pass], b.T,
				 hd, kn);
		if (at >= 0)
			printf("     (first differing byte %ld of %zu: block %ld, +%ld)\n", at, pool_b,
			       at / (long)kt_kv_block_bytes(&hp->kv), at % (long)kt_kv_block_bytes(&hp->kv));
		report(name, at >= 0 ? 1.0 : 0.0, 0);
		float *bufs[] = { dq, dk, dv, dout };
		for (int i = 0; i < 4; i++)
			g->ops->mem_free(g, bufs[i]);
		free(q); free(k); free(v); free(ref); free(got); free(gpool);
	}
	free(perm);
	kvpool_free(hp);
	kvpool_free(gp);
}

static const enum kt_dtype kq_types[3] = { KT_Q4_K, KT_Q5_K, KT_Q6_K };

static int run_ops(struct backend *cpu, struct backend *g16, struct backend *g32)
{
	/* Q8_0 / Q4_0 products with fp32 activations (LLAMAD_CUDA_EXACT_Q) */
	char *cause = NULL;
	setenv("LLAMAD_CUDA_EXACT_Q", "1", 1);
	struct backend *gq = backend_cuda_new(0, BACKEND_W_F16, &cause);
	unsetenv("LLAMAD_CUDA_EXACT_Q");
	if (!gq || gq->ops->reserve(gq, 4096, 256))
		return 1;
	check_elementwise(cpu, g16);
	check_rope(cpu, g16, KT_ROPE_INTERLEAVED);
	check_rope(cpu, g16, KT_ROPE_HALF);
	enum kt_dtype et[] = { KT_F32, KT_F16, KT_Q8_0, KT_Q4_0, KT_Q4_K, KT_Q5_K, KT_Q6_K };
	for (int i = 0; i < 7; i++)
		check_embed(cpu, g32, et[i]);
	/* K/V in f32, f16 and q8_0 (q8_0 groups of 32, 16 for hd 48, 8 for
	 * hd 8): the same tolerances, the stored bytes the CPU's */
	const enum kt_dtype kvts[3] = { KT_F32, KT_F16, KT_Q8_0 };
	for (int i = 0; i < 3; i++) {
		check_attention(cpu, g16, 32, 8, 128, kvts[i]);
		check_attention(cpu, g16, 12, 12, 64, kvts[i]);
		check_attention(cpu, g16, 8, 4, 8, kvts[i]);
		check_attention(cpu, g16, 6, 6, 48, kvts[i]);
	}
	/* 8-bit activations (the default for Q8_0 / Q4_0 at <= 8 rows): the
	 * activation rounding, ~0.4% per value, dominates */
	const double q8act = 1e-2;
	int Tf[] = { 1, 5, 9 };
	for (int i = 0; i < 3; i++) {
		check_fused(cpu, g16, KT_F16, Tf[i], Tf[i] > 8 ? 2e-3 : 1e-5);
		check_fused(cpu, g16, KT_Q4_0, Tf[i], Tf[i] > 8 ? 2e-3 : q8act);
		check_fused(cpu, g16, KT_Q8_0, Tf[i], Tf[i] > 8 ? 2e-3 : q8act);
		check_fused(cpu, gq, KT_Q4_0, Tf[i], Tf[i] > 8 ? 2e-3 : 1e-5);
		check_fused(cpu, g32, KT_F32, Tf[i], 1e-5);
		check_fused(cpu, g16, KT_Q4_K, Tf[i], Tf[i] > 8 ? 2e-3 : 1e-5);
		check_fused(cpu, g16, KT_Q6_K, Tf[i], Tf[i] > 8 ? 2e-3 : 1e-5);
	}
	int Ts[] = { 1, 2, 5, 8, 9, 64 };
	for (int i = 0; i < 6; i++) {
		int T = Ts[i], big = T > 8;
		/* <= 8 rows: fp32 activations against exact weights (fp32 sums);
		 * more: cuBLAS with activations rounded to f16 (bf16) */
		check_matmul(cpu, g32, KT_F32, 512, 4096, T, 1e-5);
		check_matmul(cpu, g32, KT_F32, 100, 300, T, 1e-5);
		check_matmul(cpu, g16, KT_F16, 512, 4096, T, big ? 2e-3 : 1e-5);
		check_matmul(cpu, g16, KT_F16, 96, 288, T, big ? 2e-3 : 1e-5);
		check_matmul(cpu, g16, KT_BF16, 512, 4096, T, big ? 1e-2 : 1e-5);
		check_matmul(cpu, g16, KT_Q8_0, 512, 4096, T, big ? 2e-3 : q8act);
		check_matmul(cpu, g16, KT_Q8_0, 96, 288, T, big ? 2e-3 : q8act);
		check_matmul(cpu, g16, KT_Q4_0, 512, 4096, T, big ? 2e-3 : q8act);
		check_matmul(cpu, gq, KT_Q8_0, 512, 4096, T, big ? 2e-3 : 1e-5);
		check_matmul(cpu, gq, KT_Q8_0, 96, 288, T, big ? 2e-3 : 1e-5);
		check_matmul(cpu, gq, KT_Q4_0, 512, 4096, T, big ? 2e-3 : 1e-5);
		/* K-quants in their blocks: fp32 decode at <= 8 rows, f16
		 * expansion for cuBLAS above */
		for (int k = 0; k < 3; k++)
			check_matmul(cpu, g16, kq_types[k], 256, 4096, T, big ? 2e-3 : 1e-5);
		check_matmul(cpu, g16, KT_F32, 300, 4096, T, 2e-3);  /* f32 file, f16 device */
	}
	backend_free(gq);
	return 0;
}

/* ---- random models (no file) ---- */

/* A Llama of the given shape; every layer shares one set of host matrices
 * (each is still placed on the device separately). Norms are 1 +- 0.1. */
static struct rmodel *rmodel_new(int dim, int layers, int heads, int kv_heads, int ffn, int vocab,
				 int ctx, enum kt_dtype t, int distinct_layers)
{
	struct rmodel *r = calloc(1, sizeof(*r));
	struct model *m = &r->m;
	struct model_config *c = &m->cfg;
	c->dim = dim;
	c->n_layers = layers;
	c->n_heads = heads;
	c->n_kv_heads = kv_heads;
	c->head_dim = dim / heads;
	c->ffn_dim = ffn;
	c->vocab = vocab;
	c->max_ctx = ctx;
	c->rms_eps = 1e-5f;
	c->rope_theta = 10000.f;
	c->rope_layout = KT_ROPE_INTERLEAVED;
	m->wtype = t;
	m->layers = calloc((size_t)layers, sizeof(*m->layers));
	int hd = c->head_dim, kvd = kv_heads * hd;
	float *norms = xmalloc((size_t)(2 * layers + 1) * dim * sizeof(float));
	for (size_t i = 0; i < (size_t)(2 * layers + 1) * dim; i++)
		norms[i] = 1.f + 0.1f * frand();
	m->inv_freq = xmalloc((size_t)hd / 2 * sizeof(float));
	for (int i = 0; i < hd / 2; i++)
		m->inv_freq[i] = 1.0f / powf(c->rope_theta, (float)(2 * i) / hd);
	m->embed = (struct kt_weight){ wbuf(r, t, vocab, dim), t, vocab, dim, NULL };
	m->cls = m->embed;
	m->final_norm = norms + (size_t)2 * layers * dim;
	for (int l = 0; l < layers; l++) {
		struct model_layer *L = &m->layers[l];
		if (l == 0 || distinct_layers) {
			if (r->n_bufs + 5 > 16) {
				fprintf(stderr, "rmodel: too many distinct layers\n");
				exit(2);
			}
			L->wq = (struct kt_weight){ wbuf(r, t, dim, dim), t, dim, dim, NULL };
			L->wk = (struct kt_weight){ wbuf(r, t, kvd, dim), t, kvd, dim, NULL };
			L->wv = (struct kt_weight){ L->wk.data, t, kvd, dim, NULL };
			L->wo = (struct kt_weight){ L->wq.data, t, dim, dim, NULL };
			L->w1 = (struct kt_weight){ wbuf(r, t, ffn, dim), t, ffn, dim, NULL };
			L->w3 = (struct kt_weight){ L->w1.data, t, ffn, dim, NULL };
			L->w2 = (struct kt_weight){ wbuf(r, t, dim, ffn), t, dim, ffn, NULL };
		} else {
			struct model_layer *F = &m->layers[0];
			L->wq = F->wq; L->wk = F->wk; L->wv = F->wv; L->wo = F->wo;
			L->w1 = F->w1; L->w2 = F->w2; L->w3 = F->w3;
		}
		L->att_norm = norms + (size_t)2 * l * dim;
		L->ffn_norm = norms + (size_t)(2 * l + 1) * dim;
	}
	size_t per_layer = kt_row_bytes(t, dim) * ((size_t)2 * dim + 2 * kvd + 2 * ffn) +
			   kt_row_bytes(t, ffn) * dim;
	m->weight_bytes = per_layer * layers + kt_row_bytes(t, dim) * vocab + kt_row_bytes(t, dim);
	r->bufs[r->n_bufs++] = norms;
	return r;
}

static void rmodel_free(struct rmodel *r)
{
	for (int i = 0; i < r->n_bufs; i++)
		free(r->bufs[i]);
	free(r->m.layers);
	free(r->m.inv_freq);
	free(r);
}

/* Run one sequence's tokens at pos through fwd (all logits when all). */
static int run_seq(struct fwd *f, struct kvpool *p, struct kvseq *s, const int32_t *tok, int n,
		   int pos, float *logits, int all)
{
	if (kvseq_prepare(p, s, pos + n, pos) != 0)
		return -ENOSPC;
	struct fwd_seq q = { tok, n, pos, s->blocks, logits, all };
	return fwd_run(f, &p->kv, &q, 1);
}

/* Logits of a 2-layer model of 7B width, CPU vs CUDA (f32 and f16 device
 * weights): a 40-token prefill (every row) and 8 decode steps. */
static void run_logits(struct backend *cpu, struct backend *g, const char *label, double tol,
		       enum kt_dtype t)
{
	struct rmodel *r = rmodel_new(4096, 2, 32, 32, 11008, 32000, 4096, t, 1);
	const struct model *m = &r->m;
	int V = m->cfg.vocab, NP = 40, ND = 8;
	struct fwd *fc = fwd_new(m, cpu, 64), *fg = fwd_new(m, g, 64);
	struct kvpool *pc = kvpool_new(8, 16, 2, 4096), *pg = kvpool_new_on(g, 8, 16, 2, 4096);
	if (!fc || !fg || !pc || !pg) {
		fprintf(stderr, "logits: setup failed\n");
		exit(1);
	}
	struct kvseq sc = { 0 }, sg = { 0 };
	int32_t tok[48];
	for (int i = 0; i < NP + ND; i++)
		tok[i] = (int32_t)(((unsigned)i * 2654435761u) % (unsigned)V);
	float *lc = xmalloc((size_t)NP * V * 4), *lg = xmalloc((size_t)NP * V * 4);
	for (size_t i = 0; i < (size_t)NP * V; i++)
		lg[i] = NAN;
	run_seq(fc, pc, &sc, tok, NP, 0, lc, 1);
	int rc = run_seq(fg, pg, &sg, tok, NP, 0, lg, 1);
	char name[96];
	snprintf(name, sizeof(name), "logits 2x4096 prefill 40 rows, %s", label);
	report(name, rc ? INFINITY : rel_err(lg, lc, (size_t)NP * V), tol);
	double worst = 0;
	for (int i = 0; i < ND; i++) {
		for (int j = 0; j < V; j++)
			lg[j] = NAN;
		run_seq(fc, pc, &sc, tok + NP + i, 1, NP + i, lc, 0);
		rc = run_seq(fg, pg, &sg, tok + NP + i, 1, NP + i, lg, 0);
		double e = rc ? INFINITY : rel_err(lg, lc, (size_t)V);
		if (e > worst)
			worst = e;
	}
	snprintf(name, sizeof(name), "logits 2x4096 decode x8 (graphs), %s", label);
	report(name, worst, tol);
	kvseq_release(pc, &sc);
	kvseq_release(pg, &sg);
	fwd_free(fc);
	fwd_free(fg);
	kvpool_free(pc);
	kvpool_free(pg);
	free(lc);
	free(lg);
	rmodel_free(r);
}

/* ---- layer candidates (kernels/cuda/plan.h) ---- */

/* A CUDA backend (f16 device weights) running candidate name, or NULL. */
static struct backend *cand_backend(const char *name)
{
	char *cause = NULL;
	struct backend *g = backend_cuda_new(0, BACKEND_W_F16, &cause);
	free(cause);
	if (g && (backend_cuda_set_kernels(g, name) || g->ops->reserve(g, 4096, 256))) {
		backend_free(g);
		return NULL;
	}
	return g;
}

/* The steps the candidates are checked on, after a 12-token prefill of
 * sequence 8 (the ops path): 6 batch-1 decode steps (graphs), a 5-token
 * append (5 rows of one sequence), sequences 0-7 given 3 tokens each (3
 * rows), then 4 steps of all 8 at once (8 rows, graphs). Logit rows per
 * step; 67 in all. */
#define CAND_STEPS 19
#define CAND_ROWS 67
static const int cand_rows[CAND_STEPS] = { 1, 1, 1, 1, 1, 1, 5, 3, 3, 3, 3, 3, 3, 3, 3,
					   8, 8, 8, 8 };

/* Run the steps on f and pool p (a fresh pool of 64 blocks of 16 for 2
 * layers), every step's logits into out (CAND_ROWS x vocab, poisoned
 * first); returns the first failure's code, 0 when all ran. */
static int cand_drive(struct fwd *f, struct kvpool *p, int V, float *out)
{
	struct kvseq s[9];
	memset(s, 0, sizeof(s));
	int32_t tok[64];
	for (int i = 0; i < 64; i++)
		tok[i] = (int32_t)(((unsigned)i * 2654435761u + 17) % (unsigned)V);
	for (size_t i = 0; i < (size_t)CAND_ROWS * V; i++)
		out[i] = NAN;
	float *o = out, *pre = xmalloc((size_t)V * 4);  /* the prefill's last row */
	int rc = run_seq(f, p, &s[8], tok, 12, 0, pre, 0), pos = 12;
	free(pre);
	for (int k = 0; k < 7 && !rc; k++) {
		rc = run_seq(f, p, &s[8], tok + pos, cand_rows[k], pos, o, 1);
		pos += cand_rows[k];
		o += (size_t)cand_rows[k] * V;
	}
	for (int q = 0; q < 8 && !rc; q++, o += (size_t)3 * V)
		rc = run_seq(f, p, &s[q], tok + 20 + q, 3, 0, o, 1);
	for (int k = 0; k < 4 && !rc; k++, o += (size_t)8 * V) {
		struct fwd_seq fs[8];
		for (int q = 0; q < 8 && !rc; q++) {
			rc = kvseq_prepare(p, &s[q], 4 + k, 3 + k);
			fs[q] = (struct fwd_seq){ tok + 40 + q + k, 1, 3 + k, s[q].blocks,
						  o + (size_t)q * V, 0 };
		}
		if (!rc)
			rc = fwd_run(f, &p->kv, fs, 8);
	}
	for (int q = 0; q < 9; q++)
		kvseq_release(p, &s[q]);
	return rc;
}

/* The pool of cand_drive: 64 blocks of 16 for 2 layers of kv_dim 1024 (head
 * dim 128) in element type kvt on be (NULL: host memory), zeroed so that
 * the slots a drive leaves unwritten compare equal. */
static struct kvpool *cand_pool(struct backend *be, enum kt_dtype kvt)
{
	struct kvpool *p = kvpool_new_typed(be, kvt, 128, 64, 16, 2, 1024);
	if (!p)
		return NULL;
	size_t bytes = kt_kv_block_bytes(&p->kv) * 64;
	void *z = calloc(1, bytes);
	int rc = !z ? -1 : be ? be->ops->upload(be, p->kv.base, z, bytes) : (memset(p->kv.base, 0, bytes), 0);
	free(z);
	if (rc) {
		kvpool_free(p);
		return NULL;
	}
	return p;
}

/* Every K and V value of pools a (host) and b (device) as fp32, over the
 * blocks a drive handed out: ||b - a|| / ||a||. */
static double pool_err(const struct kvpool *a, const struct kvpool *b)
{
	const struct kt_kv *kv = &a->kv;
	size_t bb = kt_kv_block_bytes(kv);
	struct kt_kv one = *kv;
	one.n_blocks = 1;
	one.base = xmalloc(bb);
	float *x = xmalloc((size_t)kv->kv_dim * 4), *y = xmalloc((size_t)kv->kv_dim * 4);
	double num = 0, den = 0;
	for (int blk = 0; blk < kv->n_blocks; blk++) {
		if (!a->touched[blk])
			continue;
		if (kvpool_get_block(b, blk, one.base)) {
			num = INFINITY;
			break;
		}
		for (int l = 0; l < kv->n_layers; l++)
			for (int r = 0; r < kv->block_size; r++)
				for (int w = 0; w < 2; w++) {
					(w ? kt_kv_get_v : kt_kv_get_k)(kv, blk, l, r, x);
					(w ? kt_kv_get_v : kt_kv_get_k)(&one, 0, l, r, y);
					for (int c = 0; c < kv->kv_dim; c++) {
						double d = (double)y[c] - x[c];
						num += isfinite(y[c]) ? d * d : INFINITY;
						den += (double)x[c] * x[c];
					}
				}
	}
	free(one.base);
	free(x);
	free(y);
	return den > 0 ? sqrt(num / den) : sqrt(num);
}

/*
 * The bytes of layer 0 of every block a drive handed out in the device's
 * typed pool p against kt_kv_put of the values an f32 run of the same
 * candidate stored (f32: its pool copied to the host). Layer 0's K and V
 * come from the tokens alone, not from attention, so both runs computed
 * the same fp32 values with the same kernels and only the store differs:
 * the device's conversions are checked bit for bit through the layer
 * path. 0, or 1 + the first block that differs.
 */
static int layer0_bytes(const struct kvpool *f32, const struct kvpool *p)
{
	struct kt_kv got = p->kv, want = p->kv;
	got.n_blocks = want.n_blocks = 1;
	size_t bb = kt_kv_block_bytes(&got), span = kt_kv_span_bytes(&got);
	got.base = xmalloc(bb);
	want.base = xmalloc(bb);
	float *k = xmalloc((size_t)got.kv_dim * 4), *v = xmalloc((size_t)got.kv_dim * 4);
	int bad = 0;
	for (int b = 0; b < p->kv.n_blocks && !bad; b++) {
		if (!p->touched[b])
			continue;
		if (kvpool_get_block(p, b, got.base)) {
			bad = 1 + b;
			break;
		}
		for (int r = 0; r < got.block_size; r++) {
			kt_kv_get_k(&f32->kv, b, 0, r, k);
			kt_kv_get_v(&f32->kv, b, 0, r, v);
			kt_kv_put(&want, 0, 0, r, k, v);
		}
		/* layer 0's K and V spans lead the block */
		if (memcmp(got.base, want.base, 2 * span))
			bad = 1 + b;
	}
	free(got.base);
	free(want.base);
	free(k);
	free(v);
	return bad;
}

/*
 * Candidate cand against the CPU's logits ref (cand_drive on the CPU): the
 * worst error over the steps. K/V in element type kvt (the pool zeroed
 * first); f32 with keep: the device pool copied into keep (host, f32)
 * after the drive. A typed pool: also the K/V the candidate stored against
 * the CPU's (ref_pool, after its drive), as fp32 values, within the same
 * tolerance; with keep (an f32 run of the candidate this one plans as),
 * layer 0's bytes (layer0_bytes).
 */
static int run_cand(struct rmodel *r, const float *ref, const char *cand, enum kt_dtype t,
		    double tol, enum kt_dtype kvt, const struct kvpool *ref_pool,
		    struct kvpool *keep)
{
	const struct model *m = &r->m;
	int V = m->cfg.vocab;
	struct backend *g = cand_backend(cand);
	struct fwd *f = g ? fwd_new(m, g, 64) : NULL;
	struct kvpool *p = g ? cand_pool(g, kvt) : NULL;
	float *got = xmalloc((size_t)CAND_ROWS * V * 4);
	char name[128];
	snprintf(name, sizeof(name), "cand %s %s%s%s%s", cand, kt_dtype_name(t),
		 m->cfg.rope_layout == KT_ROPE_HALF ? " half-rope" : "",
		 kvt == KT_F32 ? "" : " kv ", kvt == KT_F32 ? "" : kt_dtype_name(kvt));
	double worst = f && p && !cand_drive(f, p, V, got) && !g->failed ? 0 : INFINITY;
	size_t off = 0;
	for (int k = 0; k < CAND_STEPS && isfinite(worst); k++) {
		size_t n = (size_t)cand_rows[k] * V;
		double e = rel_err(got + off, ref + off, n);
		worst = e > worst ? e : worst;
		off += n;
	}
	report(name, worst, tol);
	double kv_worst = 0;
	if (ref_pool) {
		kv_worst = isfinite(worst) ? pool_err(ref_pool, p) : INFINITY;
		snprintf(name, sizeof(name), "cand %s %s: stored K/V %s vs CPU", cand, kt_dtype_name(t),
			 kt_dtype_name(kvt));
		report(name, kv_worst, tol);
	}
	if (keep && kvt == KT_F32) {
		for (int b = 0; b < 64 && isfinite(worst); b++)
			if (kvpool_get_block(p, b, kvpool_host_block(keep, b)))
				worst = INFINITY;
	} else if (keep) {
		int at = isfinite(worst) ? layer0_bytes(keep, p) : -1;
		snprintf(name, sizeof(name), "cand %s %s: layer 0 K/V %s bytes", cand, kt_dtype_name(t),
			 kt_dtype_name(kvt));
		if (at > 0)
			printf("     (block %d differs from the f32 run's values stored on the host)\n",
			       at - 1);
		report(name, at ? 1.0 : 0.0, 0);
		kv_worst = at ? INFINITY : kv_worst;
	}
	free(got);
	fwd_free(f);
	kvpool_free(p);
	backend_free(g);
	return worst <= tol && kv_worst <= tol ? 0 : -1;
}

/* Every candidate x dtype; "cands: CAND DTYPE ok|FAIL" lines for run.sh. */
static void run_cands(struct backend *cpu)
{
	/* f16 / Q4_K: the same weights on both sides, fp32 sums, but the
	 * 12-row prefill goes through cuBLAS (activations rounded to f16; Q4_K
	 * expanded to f16) and its KV feeds every later step: run_logits'
	 * 2e-2; Q8_0 / Q4_0: 8-bit activations against the CPU's exact
	 * products. An indexing mistake costs O(1). */
	const enum kt_dtype dts[4] = { KT_F16, KT_Q8_0, KT_Q4_0, KT_Q4_K };
	const double tols[4] = { 2e-2, 3e-2, 3e-2, 2e-2 };
	for (int d = 0; d < 4; d++) {
		struct rmodel *r = rmodel_new(4096, 2, 32, 8, 11008, 32000, 512, dts[d], 1);
		int V = r->m.cfg.vocab, fail[CU_N_CAND] = { 0 };
		float *ref = xmalloc((size_t)CAND_ROWS * V * 4);
		/* the typed runs below: each candidate's f32 run's K/V (host) */
		int typed = dts[d] == KT_F16 || dts[d] == KT_Q8_0;
		struct kvpool *keep[CU_N_CAND] = { NULL };
		for (int c = 0; c < CU_N_CAND && typed; c++)
			if (!(keep[c] = cand_pool(NULL, KT_F32))) {
				fprintf(stderr, "cands: out of memory\n");
				exit(1);
			}
		/* f16 also with the rotate-half RoPE layout */
		for (int half = 0; half < (d == 0 ? 2 : 1); half++) {
			r->m.cfg.rope_layout = half ? KT_ROPE_HALF : KT_ROPE_INTERLEAVED;
			struct fwd *fc = fwd_new(&r->m, cpu, 64);
			struct kvpool *pc = kvpool_new(64, 16, 2, 1024);
			if (!fc || !pc || cand_drive(fc, pc, V, ref)) {
				fprintf(stderr, "cands: the CPU reference failed\n");
				exit(1);
			}
			fwd_free(fc);
			kvpool_free(pc);
			for (int c = 0; c < CU_N_CAND; c++)
				fail[c] |= run_cand(r, ref, cu_cand_name((enum cu_cand)c), dts[d], tols[d],
						    KT_F32, NULL, half ? NULL : keep[c]);
		}
		for (int c = 0; c < CU_N_CAND; c++)
			printf("cands: %s %s %s\n", cu_cand_name((enum cu_cand)c), kt_dtype_name(dts[d]),
			       fail[c] ? "FAIL" : "ok");
		/* K/V in f16 and q8_0 (f16 weights, and Q8_0 ones with their 8-bit
		 * products and split-K): the CPU's typed store and attention are
		 * the reference, same tolerance, and layer 0's bytes are those of
		 * the f32 run's values converted on the host (with a q8_0 pool
		 * persistent plans as fused: fused's run); apart from the lines
		 * above, which pick the winners (the CUDA backend offers typed K/V
		 * only with LLAMAD_CUDA_KV_TYPED=1) */
		r->m.cfg.rope_layout = KT_ROPE_INTERLEAVED;
		for (int ki = 0; ki < 2 && typed; ki++) {
			enum kt_dtype kvt = ki ? KT_Q8_0 : KT_F16;
			struct fwd *fc = fwd_new(&r->m, cpu, 64);
			struct kvpool *pc = cand_pool(NULL, kvt);
			if (!fc || !pc || cand_drive(fc, pc, V, ref)) {
				fprintf(stderr, "cands: the CPU reference (kv %s) failed\n", kt_dtype_name(kvt));
				exit(1);
			}
			fwd_free(fc);
			for (int c = 0; c < CU_N_CAND; c++) {
				int as = c == CU_CAND_PERSIST && kvt == KT_Q8_0 ? CU_CAND_FUSED : c;
				int bad = run_cand(r, ref, cu_cand_name((enum cu_cand)c), dts[d], tols[d], kvt, pc,
						   keep[as]);
				printf("cands-kv: %s %s %s %s\n", cu_cand_name((enum cu_cand)c),
				       kt_dtype_name(dts[d]), kt_dtype_name(kvt), bad ? "FAIL" : "ok");
			}
			kvpool_free(pc);
		}
		for (int c = 0; c < CU_N_CAND; c++)
			kvpool_free(keep[c]);
		free(ref);
		rmodel_free(r);
	}
}

/* ---- benchmarks ---- */

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(double), cmp_d);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void sync_be(struct backend *g, float *probe)
{
	float h;
	g->ops->download(g, &h, probe, sizeof(h));
}

/* device-to-device copy, bytes read + written per second */
static double bench_copy(struct backend *g)
{
	size_t n = 2ull << 30;
	float *a = g->ops->mem_alloc(g, n), *b = g->ops->mem_alloc(g, n);
	if (!a || !b)
		return 0;
	g->ops->copy(g, b, a, n);
	sync_be(g, b);
	double t[5];
	for (int i = 0; i < 5; i++) {
		double t0 = now_s();
		g->ops->copy(g, b, a, n);
		sync_be(g, b);
		t[i] = now_s() - t0;
	}
	g->ops->mem_free(g, a);
	g->ops->mem_free(g, b);
	return 2.0 * n / median(t, 5);
}

/* our matmul path on a large f16 problem: FLOP/s */
static double bench_gemm(struct backend *g)
{
	int M = 8192, K = 8192, T = 4096;
	struct rmodel tmp = { 0 };
	void *w = wbuf(&tmp, KT_F16, M, K);
	struct kt_weight hw = { w, KT_F16, M, K, NULL }, dw;
	if (g->ops->weight_place(g, &dw, &hw, KT_USE_MATMUL) != 0)
		return 0;
	float *x = rand_vec((size_t)T * K, 1.f);
	float *dx = dev(g, x, (size_t)T * K), *dy = dev(g, NULL, (size_t)T * M);
	g->ops->reserve(g, 4096, T);
	g->ops->matmul(g, dy, dx, &dw, T);
	sync_be(g, dy);
	double t[5];
	for (int i = 0; i < 5; i++) {
		double t0 = now_s();
		g->ops->matmul(g, dy, dx, &dw, T);
		sync_be(g, dy);
		t[i] = now_s() - t0;
	}
	g->ops->weight_release(g, &dw);
	g->ops->mem_free(g, dx);
	g->ops->mem_free(g, dy);
	free(x);
	free(w);
	return 2.0 * M * K * T / median(t, 5);
}

/* one matrix-vector product (batch 1), weight bytes per second */
static void bench_gemv(struct backend *g, enum kt_dtype t, int rows, int cols, double bw)
{
	struct rmodel tmp = { 0 };
	struct kt_weight hw = { wbuf(&tmp, t, rows, cols), t, rows, cols, NULL }, dw[8];
	for (int i = 0; i < 8; i++)  /* rotate over 8 copies: more than the L2 */
		if (g->ops->weight_place(g, &dw[i], &hw, KT_USE_MATMUL) != 0)
			return;
	float *x = rand_vec(cols, 1.f), *dx = dev(g, x, cols), *dy = dev(g, NULL, rows);
	for (int i = 0; i < 8; i++)
		g->ops->matmul(g, dy, dx, &dw[i], 1);
	sync_be(g, dy);
	int reps = 400;
	double t0 = now_s();
	for (int i = 0; i < reps; i++)
		g->ops->matmul(g, dy, dx, &dw[i % 8], 1);
	sync_be(g, dy);
	double per = (now_s() - t0) / reps;
	double bytes = (double)kt_row_bytes(t, cols) * rows;
	printf("gemv dtype=%s %dx%d us=%.1f gb_s=%.0f pct_copy_bw=%.1f\n", kt_dtype_name(t), rows,
	       cols, per * 1e6, bytes / per / 1e9, 100.0 * bytes / per / bw);
	for (int i = 0; i < 8; i++)
		g->ops->weight_release(g, &dw[i]);
	g->ops->mem_free(g, dx);
	g->ops->mem_free(g, dy);
	free(x);
	free((void *)hw.data);
}

/* batch-1 decode: n steps after a 16-token prompt on a fresh sequence */
static double bench_decode1(struct fwd *f, struct kvpool *p, const int32_t *tok, float *logits,
			    int nd)
{
	struct kvseq s = { 0 };
	run_seq(f, p, &s, tok, 16, 0, logits, 0);
	double dt[128];
	for (int i = 0; i < nd; i++) {
		double a = now_s();
		run_seq(f, p, &s, tok + 16 + i, 1, 16 + i, logits, 0);
		dt[i] = now_s() - a;
	}
	kvseq_release(p, &s);
	return median(dt + 2, nd - 2);
}

/* n sessions decoding together after 32-token prompts: tokens per second */
static double bench_decode_n(struct fwd *f, struct kvpool *p, const int32_t *tok, float *logits,
			     int V, int n, int steps)
{
	struct kvseq ss[64];
	struct fwd_seq q[64];
	memset(ss, 0, sizeof(ss));
	memset(q, 0, sizeof(q));
	for (int i = 0; i < n; i++) {
		kvseq_prepare(p, &ss[i], 32, 0);
		q[i] = (struct fwd_seq){ tok + i, 32, 0, ss[i].blocks, logits + (size_t)i * V, 0 };
	}
	fwd_run(f, &p->kv, q, n);
	double a = 0;
	for (int k = 0; k < steps + 2; k++) {
		if (k == 2)
			a = now_s();
		for (int i = 0; i < n; i++) {
			kvseq_prepare(p, &ss[i], 33 + k, 32 + k);
			q[i] = (struct fwd_seq){ tok + 100 + i + k, 1, 32 + k, ss[i].blocks,
						 logits + (size_t)i * V, 0 };
		}
		fwd_run(f, &p->kv, q, n);
	}
	double el = now_s() - a;
	for (int i = 0; i < n; i++)
		kvseq_release(p, &ss[i]);
	return (double)n * steps / el;
}

/*
 * The 7B shape r (dtype t) on backend g running candidate cand: batch-1
 * and batch-8 decode, batch-1 decode at 3,000 tokens (f16); with extras
 * (f16, base) also 64 sessions, a 2,048-token prefill and the 32-token turn
 * after 3,000 tokens (more rows than the matrix-vector kernels take: the
 * same ops for every candidate).
 */
static void bench_model(struct backend *g, struct rmodel *r, enum kt_dtype t, const char *cand,
			double bw, double gemm, int quick, int extras)
{
	double t0 = now_s();
	const struct model *m = &r->m;
	int V = m->cfg.vocab;
	struct fwd *f = fwd_new(m, g, 2048);
	size_t nblocks = (64 * 96 + 3100 + 2100 + 300) / 16 + 64;
	struct kvpool *p = f ? kvpool_new_on(g, (int)nblocks, 16, 32, 4096) : NULL;
	if (!f || !p) {
		printf("bench %s %s: setup failed (device memory?)\n", cand, kt_dtype_name(t));
		fwd_free(f);
		return;
	}
	printf("bench_setup cand=%s dtype=%s load_s=%.1f weight_bytes=%zu\n", cand, kt_dtype_name(t),
	       now_s() - t0, m->weight_bytes);
	float *logits = xmalloc((size_t)64 * V * 4);
	int32_t tok[4096];
	for (int i = 0; i < 4096; i++)
		tok[i] = (int32_t)(((unsigned)i * 2654435761u) % (unsigned)V);

	double step = bench_decode1(f, p, tok, logits, quick ? 32 : 128);
	double roof = bw / (double)m->weight_bytes;
	printf("decode1 cand=%s dtype=%s tok_s=%.1f step_ms=%.3f roof_tok_s=%.1f pct_roof=%.1f%s\n",
	       cand, kt_dtype_name(t), 1.0 / step, step * 1e3, roof, 100.0 / step / roof,
	       g->failed ? " DEVICE-ERROR" : "");
	double d8 = bench_decode_n(f, p, tok, logits, V, 8, quick ? 8 : 32);
	printf("decode8 cand=%s dtype=%s tok_s=%.0f step_ms=%.2f%s\n", cand, kt_dtype_name(t), d8,
	       8e3 / d8, g->failed ? " DEVICE-ERROR" : "");
	if (extras) {
		double d64 = bench_decode_n(f, p, tok, logits, V, 64, quick ? 8 : 32);
		printf("decode64 tok_s=%.0f step_ms=%.2f\n", d64, 64e3 / d64);

		/* prefill of 2,048 tokens on an empty sequence */
		struct kvseq s = { 0 };
		double pt[3];
		for (int k = 0; k < 4; k++) {
			double b0 = now_s();
			run_seq(f, p, &s, tok, 2048, 0, logits, 0);
			if (k)
				pt[k - 1] = now_s() - b0;
			kvseq_release(p, &s);
		}
		double pm = median(pt, 3);
		const struct model_config *c = &m->cfg;
		double mm_flops = 2.0 * 2048 * ((double)c->n_layers * ((double)4 * c->dim * c->dim +
						 3.0 * c->dim * c->ffn_dim));
		double att_flops = 4.0 * c->n_layers * c->dim * (2048.0 * 2049.0 / 2);
		printf("prefill2048 tok_s=%.0f ms=%.1f matmul_tflops=%.1f all_tflops=%.1f gemm_tflops=%.1f "
		       "pct_gemm=%.1f\n", 2048 / pm, pm * 1e3, mm_flops / pm / 1e12,
		       (mm_flops + att_flops) / pm / 1e12, gemm / 1e12,
		       100.0 * (mm_flops + att_flops) / pm / gemm);
	}
	if (t == KT_F16) {
		/* a 32-token turn after 3,000 tokens: time to its first token's
		 * logits; then batch-1 decode at 3,000 tokens of context */
		struct kvseq s = { 0 };
		double dt[16];
		run_seq(f, p, &s, tok, 2048, 0, logits, 0);
		run_seq(f, p, &s, tok + 2048, 952, 2048, logits, 0);
		if (extras) {
			double tt[5];
			for (int k = 0; k < 5; k++) {
				double b0 = now_s();
				run_seq(f, p, &s, tok + 3000, 32, 3000, logits, 0);
				tt[k] = now_s() - b0;
			}
			printf("turn32_after3000 first_token_ms=%.2f\n", median(tt, 5) * 1e3);
		} else {
			run_seq(f, p, &s, tok + 3000, 32, 3000, logits, 0);
		}
		for (int i = 0; i < 16; i++) {
			double b0 = now_s();
			run_seq(f, p, &s, tok + 3032 + i, 1, 3032 + i, logits, 0);
			dt[i] = now_s() - b0;
		}
		printf("decode1_at3000 cand=%s tok_s=%.1f\n", cand, 1.0 / median(dt + 2, 14));
		kvseq_release(p, &s);
	}
	fwd_free(f);
	kvpool_free(p);
	free(logits);
}

/* Every dtype x candidate, each candidate on a backend of its own (a
 * device error in one leaves the others running). */
static void bench_all(double bw, double gemm, int quick)
{
	const enum kt_dtype dts[4] = { KT_F16, KT_Q8_0, KT_Q4_0, KT_Q4_K };
	for (int d = 0; d < 4; d++) {
		struct rmodel *r = rmodel_new(4096, 32, 32, 32, 11008, 32000, 4096, dts[d], 0);
		for (int c = 0; c < CU_N_CAND; c++) {
			struct backend *g = cand_backend(cu_cand_name((enum cu_cand)c));
			if (!g) {
				printf("bench cand=%s: no backend\n", cu_cand_name((enum cu_cand)c));
				continue;
			}
			bench_model(g, r, dts[d], cu_cand_name((enum cu_cand)c), bw, gemm, quick, dts[d] == KT_F16 && c == 0);
			backend_free(g);
		}
		rmodel_free(r);
	}
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "ops";
	int quick = argc > 2 && !strcmp(argv[2], "--quick");
	char *cause = NULL;
	struct backend *g16 = backend_cuda_new(0, BACKEND_W_F16, &cause);
	if (!g16) {
		printf("skip: %s\n", cause ? cause : "no CUDA backend");
		free(cause);
		return 77;
	}
	printf("device: %s\n", g16->desc);
	struct backend *g32 = backend_cuda_new(0, BACKEND_W_F32, &cause);
	/* the reference: quantized weights as their dequantized fp32 values
	 * (the CPU's exact path, not its 8-bit activations) */
	setenv("LLAMAD_CPU_EXACT_Q", "1", 1);
	struct backend *cpu = backend_cpu_new(0);
	unsetenv("LLAMAD_CPU_EXACT_Q");
	if (!g32 || !cpu || g16->ops->reserve(g16, 4096, 256) || g32->ops->reserve(g32, 4096, 256)) {
		fprintf(stderr, "setup failed\n");
		return 1;
	}
	if (!strcmp(mode, "ops")) {
		run_ops(cpu, g16, g32);
	} else if (!strcmp(mode, "logits")) {
		/* fp32 weights and fp32 attention throughout: tight; then the
		 * defaults (the 40-row prefill takes f16 attention GEMMs) */
		setenv("LLAMAD_CUDA_GEMM_ATTN", "0", 1);
		struct backend *gx = backend_cuda_new(0, BACKEND_W_F32, &cause);
		unsetenv("LLAMAD_CUDA_GEMM_ATTN");
		if (!gx)
			return 1;
		run_logits(cpu, gx, "f32 weights, fp32 attention", 1e-4, KT_F32);
		backend_free(gx);
		run_logits(cpu, g32, "f32 weights", 3e-3, KT_F32);
		run_logits(cpu, g16, "f16 weights", 2e-2, KT_F32);
		/* Q4_K kept in its blocks on the device; the 40-row prefill
		 * expands it to f16 for cuBLAS */
		run_logits(cpu, g16, "q4_k weights", 2e-2, KT_Q4_K);
	} else if (!strcmp(mode, "cands")) {
		run_cands(cpu);
	} else if (!strcmp(mode, "prof")) {
		/* a few batch-1 products and one decode step, for a profiler */
		double bw = 4.2e12;
		bench_gemv(g16, KT_F16, 11008, 4096, bw);
		bench_gemv(g16, KT_Q4_0, 11008, 4096, bw);
		bench_gemv(g16, KT_Q4_K, 11008, 4096, bw);
	} else if (!strcmp(mode, "bench")) {
		double bw = bench_copy(g16), gemm = bench_gemm(g16);
		printf("copy_bw_gb_s=%.0f gemm_f16_tflops=%.1f\n", bw / 1e9, gemm / 1e12);
		enum kt_dtype gt[5] = { KT_F16, KT_Q8_0, KT_Q4_0, KT_Q4_K, KT_Q6_K };
		for (int i = 0; i < 5; i++) {
			bench_gemv(g16, gt[i], 4096, 4096, bw);
			bench_gemv(g16, gt[i], 11008, 4096, bw);
		}
		bench_all(bw, gemm, quick);
	} else {
		fprintf(stderr, "usage: llamad-gpucheck ops|logits|cands|prof|bench [--quick]\n");
		return 2;
	}
	if (g16->failed || g32->failed) {
		printf("FAIL the CUDA backend reported a device error\n");
		n_fail++;
	}
	if (strcmp(mode, "bench"))
		printf("%s: %d passed, %d failed\n", mode, n_ok, n_fail);
	backend_free(g16);
	backend_free(g32);
	backend_free(cpu);
	return n_fail ? 1 : 0;
}

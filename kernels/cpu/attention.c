/*
 * kernels/cpu/attention.c — the CPU backend's paged attention: causal
 * attention of each row over its sequence's K/V blocks (f32, f16, q8_0),
 * sixteen-float single rows, eight-float rows and tiles of the query
 * vectors that share a KV head, split over the pool's threads; and the
 * per-thread score scratch. Reductions use a fixed order per row, so a
 * row's result never depends on what shares its call.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/vec.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* The f32 store's K span / V row of (block, layer, row). */
static inline const float *kv_kt32(const struct kt_kv *kv, int32_t b, int layer)
{
	return kt_kv_kt(kv, b, layer);
}

static inline const float *kv_v32(const struct kt_kv *kv, int32_t b, int layer, int row)
{
	return (const float *)kt_kv_vspan(kv, b, layer) + (size_t)row * kv->kv_dim;
}

struct attn_job {
	float *out;
	const float *q;
	const struct kt_kv *kv;
	int layer;
	const struct kt_attn_row *rows;
	int n_tok, n_heads, n_kv_heads, hd;
	float **scratch;
	size_t scratch_len;      /* floats in each thread's scratch */
	int wide;                /* sixteen-float code (attn_one) */
};

/* From here on (attention) multiply-adds may fuse (FMA): the same
 * binary always fuses the same way, so results stay deterministic and
 * batch-invariant. */
#pragma GCC optimize("fp-contract=fast")

/* Scores of one block: s[i] = sum_d q[d] * kt[d*bs + i] for i < bs, each a
 * sequential sum over d (the same order for every i, block and batch). */
static inline __attribute__((always_inline)) void
block_scores(float *s, const float *q, const float *kt, int hd, int bs)
{
	if (bs == 16) {
		v16f a = { 0 };
		for (int d = 0; d < hd; d++)
			a += q[d] * ld16(kt + (size_t)d * 16);
		memcpy(s, &a, sizeof(a));
		return;
	}
	for (int i = 0; i < bs; i++) {
		float acc = 0;
		for (int d = 0; d < hd; d++)
			acc += q[d] * kt[(size_t)d * bs + i];
		s[i] = acc;
	}
}

/* In place: sc[p] = exp(sc[p]*scale - max) for p < n; returns 1 / their sum.
 * Works on whole groups of 8 (sc has room up to a whole block; the
 * positions past n are set to -inf first), in an order that depends only on
 * n. */
static inline __attribute__((always_inline)) float softmax_row(float *sc, int n, float scale)
{
	int n8 = (n + 7) & ~7;
	for (int p = n; p < n8; p++)
		sc[p] = -INFINITY;
	v8f vmx = { -INFINITY, -INFINITY, -INFINITY, -INFINITY,
		    -INFINITY, -INFINITY, -INFINITY, -INFINITY };
	for (int p = 0; p < n8; p += 8) {
		v8f x = ld8(sc + p) * scale;
		st8(sc + p, x);
		v8i gt = x > vmx;
		vmx = (v8f)(((v8i)x & gt) | ((v8i)vmx & ~gt));
	}
	float mx = vmx[0];
	for (int k = 1; k < 8; k++)
		mx = vmx[k] > mx ? vmx[k] : mx;
	v8f vs = { 0 };
	for (int p = 0; p < n8; p += 8) {
		v8f x = vexp8(ld8(sc + p) - mx);
		st8(sc + p, x);
		vs += x;
	}
	return 1.0f / hsum8(vs);
}

/* block_scores() of four blocks at once (block size 16). */
static inline __attribute__((always_inline)) void
block_scores4(float *s, const float *q, const float *k0, const float *k1, const float *k2,
	      const float *k3, int hd)
{
	v16f a0 = { 0 }, a1 = { 0 }, a2 = { 0 }, a3 = { 0 };
	for (int d = 0; d < hd; d++) {
		float qd = q[d];
		a0 += qd * ld16(k0 + (size_t)d * 16);
		a1 += qd * ld16(k1 + (size_t)d * 16);
		a2 += qd * ld16(k2 + (size_t)d * 16);
		a3 += qd * ld16(k3 + (size_t)d * 16);
	}
	memcpy(s, &a0, sizeof(a0));
	memcpy(s + 16, &a1, sizeof(a1));
	memcpy(s + 32, &a2, sizeof(a2));
	memcpy(s + 48, &a3, sizeof(a3));
}

#define PRAGMA(x) _Pragma(#x)

/*
 * out[d0, d0+W*NV) = sum_p sc[p]*inv * V[p][off, off+W*NV): NV registers of
 * W floats (a compile-time count, so they stay in registers) held across
 * positions. One source for both widths: v_accum16 in sixteen-float
 * vectors (one AVX-512 register, or two AVX ones; NV <= 4), v_accum in
 * eight-float ones (NV <= 8).
 */
#define V_ACCUM(NAME, VT, LD, W, MAXV)                                                   \
	static inline __attribute__((always_inline)) void                               \
	NAME(float *out, const float *sc, float inv, const struct kt_kv *kv,              \
	     const int32_t *tab, int layer, int n, size_t off, const int NV, int d0)      \
	{                                                                                \
		int bs = kv->block_size;                                                 \
		size_t kd = (size_t)kv->kv_dim;                                          \
		VT acc[MAXV] = { { 0 } };                                                \
		for (int p0 = 0; p0 < n; p0 += bs) {                                     \
			int m = n - p0 < bs ? n - p0 : bs;                               \
			const float *vb = kv_v32(kv, tab[p0 / bs], layer, 0) + off;      \
			for (int i = 0; i < m; i++) {                                    \
				float a = sc[p0 + i] * inv;                              \
				PRAGMA(GCC unroll MAXV)                                  \
				for (int k = 0; k < NV; k++)                             \
					acc[k] += a * LD(vb + (size_t)i * kd + W * k);   \
			}                                                                \
		}                                                                        \
		PRAGMA(GCC unroll MAXV)                                                  \
		for (int k = 0; k < NV; k++)                                             \
			memcpy(out + d0 + W * k, &acc[k], sizeof(VT));                   \
	}

V_ACCUM(v_accum16, v16f, ld16, 16, 4)
V_ACCUM(v_accum, v8f, ld8, 8, 8)

/* The locals of one (token, head) of job j: its query and output rows,
 * its sequence's block table and length, its KV head and that head's
 * offset in a K span, its softmax scale, and its sequence's blocks. */
#define HEAD_LOCALS(j, t, h)                                                      \
	int kvh = h / (j->n_heads / j->n_kv_heads);                               \
	const float *q = j->q + ((size_t)t * j->n_heads + h) * hd;                \
	float *out = j->out + ((size_t)t * j->n_heads + h) * hd;                  \
	const int32_t *tab = j->rows[t].block_table;                              \
	int n = j->rows[t].pos + 1;                                               \
	float scale = 1.0f / sqrtf((float)hd);                                    \
	size_t hoff = (size_t)kvh * hd * bs;                                      \
	int nb = (n + bs - 1) / bs

/* The output dimensions [d0, hd) of a head (HEAD_LOCALS), once its scores
 * are a softmax (times inv): eight-float vectors for all whole groups of
 * eight, up to 64 dims at a time in registers held across positions, then
 * one at a time; each output a sequential sum over p. */
#define V_OUT8(j, sc, inv, d0)                                                            \
	do {                                                                              \
		while (hd - d0 >= 8) {                                                    \
			int nv = (hd - d0) / 8 < 8 ? (hd - d0) / 8 : 8;                   \
			switch (nv) {                                                     \
			case 1: v_accum(out, sc, inv, kv, tab, j->layer, n, (size_t)kvh * hd + d0, 1, d0); break; \
			case 2: v_accum(out, sc, inv, kv, tab, j->layer, n, (size_t)kvh * hd + d0, 2, d0); break; \
			case 3: v_accum(out, sc, inv, kv, tab, j->layer, n, (size_t)kvh * hd + d0, 3, d0); break; \
			case 4: v_accum(out, sc, inv, kv, tab, j->layer, n, (size_t)kvh * hd + d0, 4, d0); break; \
			case 5: v_accum(out, sc, inv, kv, tab, j->layer, n, (size_t)kvh * hd + d0, 5, d0); break; \
			case 6: v_accum(out, sc, inv, kv, tab, j->layer, n, (size_t)kvh * hd + d0, 6, d0); break; \
			case 7: v_accum(out, sc, inv, kv, tab, j->layer, n, (size_t)kvh * hd + d0, 7, d0); break; \
			default: v_accum(out, sc, inv, kv, tab, j->layer, n, (size_t)kvh * hd + d0, 8, d0); break; \
			}                                                                 \
			d0 += nv * 8;                                                     \
		}                                                                         \
		for (; d0 < hd; d0++) {                                                   \
			float acc = 0;                                                    \
			for (int p = 0; p < n; p++)                                       \
				acc += sc[p] * inv *                                      \
				       kv_v32(kv, tab[p / bs], j->layer, p % bs)          \
					       [(size_t)kvh * hd + d0];                   \
			out[d0] = acc;                                                    \
		}                                                                         \
	} while (0)

/* One (token, head): softmax(q K^T / sqrt(hd)) V over positions [0, pos].
 * sc has room for pos+1 rounded up to a whole block. Built twice: for
 * AVX-512 (sixteen-float vectors in one register) and for the baseline; each
 * lane does the same arithmetic in both, so the results are identical. */
#if defined(__x86_64__)
__attribute__((target_clones("avx512f", "default")))
#endif
static void attn_one(const struct attn_job *j, int t, int h, float *sc)
{
	const struct kt_kv *kv = j->kv;
	int hd = j->hd, bs = kv->block_size;
	HEAD_LOCALS(j, t, h);
	int b = 0;
	if (bs == 16) {
		/* four blocks at a time: four independent FMA chains, each block's
		 * scores still a sequential sum over d */
		for (; b + 4 <= nb; b += 4)
			block_scores4(sc + b * 16, q, kv_kt32(kv, tab[b], j->layer) + hoff,
				      kv_kt32(kv, tab[b + 1], j->layer) + hoff,
				      kv_kt32(kv, tab[b + 2], j->layer) + hoff,
				      kv_kt32(kv, tab[b + 3], j->layer) + hoff, hd);
	}
	for (; b < nb; b++)
		block_scores(sc + b * bs, q, kv_kt32(kv, tab[b], j->layer) + hoff, hd, bs);
	float inv = softmax_row(sc, n, scale);
	/* out = sum_p a_p v_p: sixteen-float vectors, up to 64 dims at a time,
	 * then v_out8 for the rest */
	int d0 = 0;
	while (hd - d0 >= 16) {
		int nv = (hd - d0) / 16 < 4 ? (hd - d0) / 16 : 4;
		size_t off = (size_t)kvh * hd + d0;
		switch (nv) {
		case 1: v_accum16(out, sc, inv, kv, tab, j->layer, n, off, 1, d0); break;
		case 2: v_accum16(out, sc, inv, kv, tab, j->layer, n, off, 2, d0); break;
		case 3: v_accum16(out, sc, inv, kv, tab, j->layer, n, off, 3, d0); break;
		default: v_accum16(out, sc, inv, kv, tab, j->layer, n, off, 4, d0); break;
		}
		d0 += nv * 16;
	}
	V_OUT8(j, sc, inv, d0);
}

/*
 * The same two functions in eight-float vectors, for CPUs without AVX-512
 * (and other targets): GCC lowers the sixteen-float vectors above to
 * memory round trips there (stories15M decode spent 28 % of its time in
 * attn_one's AVX2 clone). Each lane does exactly the arithmetic of the
 * sixteen-lane code (a score: fused multiply-adds over d in order; an
 * output: over p in order), so the results are identical; the dimension
 * chunks differ, which no value depends on.
 */

/* block_scores() of a block of 16: two halves of eight */
static inline __attribute__((always_inline)) void
block_scores16_8(float *s, const float *q, const float *kt, int hd)
{
	v8f a0 = { 0 }, a1 = { 0 };
	for (int d = 0; d < hd; d++) {
		a0 += q[d] * ld8(kt + (size_t)d * 16);
		a1 += q[d] * ld8(kt + (size_t)d * 16 + 8);
	}
	st8(s, a0);
	st8(s + 8, a1);
}

/* block_scores4() in halves: two blocks of 16 at a time (four chains) */
static inline __attribute__((always_inline)) void
block_scores2_8(float *s, const float *q, const float *k0, const float *k1, int hd)
{
	v8f a0 = { 0 }, a1 = { 0 }, b0 = { 0 }, b1 = { 0 };
	for (int d = 0; d < hd; d++) {
		float qd = q[d];
		a0 += qd * ld8(k0 + (size_t)d * 16);
		a1 += qd * ld8(k0 + (size_t)d * 16 + 8);
		b0 += qd * ld8(k1 + (size_t)d * 16);
		b1 += qd * ld8(k1 + (size_t)d * 16 + 8);
	}
	st8(s, a0);
	st8(s + 8, a1);
	st8(s + 16, b0);
	st8(s + 24, b1);
}

static void attn_one8(const struct attn_job *j, int t, int h, float *sc)
{
	const struct kt_kv *kv = j->kv;
	int hd = j->hd, bs = kv->block_size;
	HEAD_LOCALS(j, t, h);
	int b = 0;
	if (bs == 16) {
		for (; b + 2 <= nb; b += 2)
			block_scores2_8(sc + b * 16, q, kv_kt32(kv, tab[b], j->layer) + hoff,
					kv_kt32(kv, tab[b + 1], j->layer) + hoff, hd);
		for (; b < nb; b++)
			block_scores16_8(sc + b * 16, q, kv_kt32(kv, tab[b], j->layer) + hoff, hd);
	}
	for (; b < nb; b++)
		block_scores(sc + b * bs, q, kv_kt32(kv, tab[b], j->layer) + hoff, hd, bs);
	float inv = softmax_row(sc, n, scale);
	int d0 = 0;
	V_OUT8(j, sc, inv, d0);
}

/*
 * Attention over a typed store (f16, q8_0; kernels/backend.h), in
 * eight-float vectors: the stored elements are converted in the inner
 * loops as they are loaded (F16C, or sign-extension of the int8 codes),
 * never into a copy of the sequence. Each value is a fixed sequence of
 * operations (a score: per q8_0 group a sum over its channels in order,
 * times the position's scale, groups in order; f16: one sum over d; an
 * output: a sum over positions in order), so results stay deterministic
 * and batch-invariant. Block size 16, head_dim a multiple of 8
 * (kt_kv_dtype_ok).
 */
static inline __attribute__((always_inline)) float h2f(uint16_t h)
{
#if defined(__F16C__)
	return _cvtsh_ss(h);
#else
	return kt_f16_to_f32(h);
#endif
}

static inline __attribute__((always_inline)) v8f ldh8(const uint16_t *p)
{
#if defined(__F16C__)
	return (v8f)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#else
	v8f v;
	for (int i = 0; i < 8; i++)
		v[i] = kt_f16_to_f32(p[i]);
	return v;
#endif
}

static inline __attribute__((always_inline)) v8f ldb8(const int8_t *p)
{
#if defined(__AVX2__)
	return (v8f)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
#else
	v8f v;
	for (int i = 0; i < 8; i++)
		v[i] = (float)p[i];
	return v;
#endif
}

/* Eight stored elements from element index i of a span (codes for q8_0). */
static inline __attribute__((always_inline)) v8f tld8(const char *span, size_t i, const int DT)
{
	if (DT == KT_F16)
		return ldh8((const uint16_t *)span + i);
	return ldb8((const int8_t *)span + i);
}

/*
 * A tile: up to ATTN_TILE query vectors that read the same K and V - the
 * heads of one KV head (GQA) for one or more consecutive tokens of one
 * sequence - attended together, so each K and V element loaded serves
 * every vector of the tile (a 20-word turn after 1,500 tokens of the 1B
 * shape reads each kv head's K/V once per 2 tokens instead of once per
 * token and head). Eight-float vectors, any element type: each vector's
 * scores, softmax and output are the same operations in the same order as
 * the single-row code (a score: fused multiply-adds over d, per q8_0 group
 * then times the scale; an output lane: over positions in order), so a
 * row's result is the same bits whatever else shares its tile or call.
 * A tile computes NR vectors, the fewest of 1, 2, 4 and ATTN_TILE that hold
 * its rows (spare ones repeat the last row): a decode token of the 1B shape
 * (4 query heads a KV head) computed 8, half of them thrown away, and one
 * of an MHA model 8 for 1. Block size 16, head_dim a multiple of 8.
 */
/* Blocks ahead whose slices a tile fetches while it computes one: the
 * blocks of a sequence lie anywhere in the pool, so no hardware prefetcher
 * finds the next, and every block's first loads waited on memory (a 1B
 * decode at 2,048 positions spent a third of its time in attention, most of
 * it on the loads of K and V). */
#define ATTN_PF 2

static inline __attribute__((always_inline)) void prefetch_span(const char *p, size_t n)
{
	for (size_t o = 0; o < n; o += 64)
		__builtin_prefetch(p + o);
}

static inline __attribute__((always_inline)) v8f kload8(const char *span, size_t i, const int DT)
{
	if (DT == KT_F32)
		return ld8((const float *)span + i);
	return tld8(span, i, DT);
}

static inline __attribute__((always_inline)) void
attn_tile_t(const struct attn_job *j, int t0, int nt, int h0, int nh, float *scratch,
	    size_t stride, const int DT, const int NR)
{
	const struct kt_kv *kv = j->kv;
	int hd = j->hd, R = nt * nh;
	int kvh = h0 / (j->n_heads / j->n_kv_heads), c0 = kvh * hd;
	const int32_t *tab = j->rows[t0].block_table;
	const float *q[ATTN_TILE];
	float *out[ATTN_TILE], *sc[ATTN_TILE], inv[ATTN_TILE];
	int n[ATTN_TILE], nmax = 0;
	for (int r = 0; r < NR; r++) {
		int rr = r < R ? r : R - 1;   /* spare lanes repeat the last row */
		int t = t0 + rr / nh, h = h0 + rr % nh;
		q[r] = j->q + ((size_t)t * j->n_heads + h) * hd;
		out[r] = j->out + ((size_t)t * j->n_heads + h) * hd;
		sc[r] = scratch + (size_t)r * stride;
		n[r] = j->rows[t].pos + 1;
		nmax = n[r] > nmax ? n[r] : nmax;
	}
	int nb = (nmax + 15) / 16;
	int G = DT == KT_Q8_0 ? kv->group : hd;
	/* the tile's slice of a block: its K channels' 16 positions (plus the
	 * q8_0 scales, a line at most), its V rows' channels */
	const size_t esz = DT == KT_F32 ? 4 : DT == KT_F16 ? 2 : 1;
	const size_t kbytes = (size_t)hd * 16 * esz, vbytes = (size_t)hd * esz;
	for (int b = 0; b < nb; b++) {
		const char *kt = kt_kv_kt(kv, tab[b], j->layer);
		const uint16_t *ks = (const uint16_t *)(kt + (size_t)16 * kv->kv_dim);
		if (b + ATTN_PF < nb)
			prefetch_span((const char *)kt_kv_kt(kv, tab[b + ATTN_PF], j->layer) +
				      (size_t)c0 * 16 * esz, kbytes);
		for (int half = 0; half < 16; half += 8) {
			v8f a[ATTN_TILE];
#pragma GCC unroll 8
			for (int r = 0; r < NR; r++)
				a[r] = (v8f){ 0 };
			for (int g0 = 0; g0 < hd; g0 += G) {
				/* q8_0: each code times its position's scale, the
				 * value kt_kv_get_k gives */
				v8f s = { 1, 1, 1, 1, 1, 1, 1, 1 };
				if (DT == KT_Q8_0)
					s = ldh8(ks + (size_t)((c0 + g0) / G) * 16 + half);
				for (int d = g0; d < g0 + G; d++) {
					v8f k = kload8(kt, (size_t)(c0 + d) * 16 + half, DT);
					if (DT == KT_Q8_0)
						k *= s;
#pragma GCC unroll 8
					for (int r = 0; r < NR; r++)
						a[r] += q[r][d] * k;
				}
			}
#pragma GCC unroll 8
			for (int r = 0; r < NR; r++)
				st8(sc[r] + b * 16 + half, a[r]);
		}
	}
	/* the weights sc * (1/sum), once per position (the single-row code
	 * multiplies them as it goes: the same products); past a row's n
	 * they are 0 and its lanes are not updated */
	float scale = 1.0f / sqrtf((float)hd);
	int nmin = nmax;
	for (int r = 0; r < R; r++) {
		inv[r] = softmax_row(sc[r], n[r], scale);
		for (int p = 0; p < n[r]; p++)
			sc[r][p] *= inv[r];
		nmin = n[r] < nmin ? n[r] : nmin;
	}
	size_t kd = (size_t)kv->kv_dim;
	int ng = kv->kv_dim / (DT == KT_Q8_0 ? kv->group : 1);
	/* a block of V at a time, sixteen channels a pass over its rows (the
	 * block stays in L1 across the passes; V is read once per tile), the
	 * sums kept in vacc between blocks: each lane still adds positions in
	 * order */
	static _Thread_local float vacc[ATTN_TILE][512];
	/* plain loops, not memset/memcpy calls: the kernels are not built
	 * for ThreadSanitizer and the pool's atomics are invisible to it, so
	 * an intercepted libc call writing rows that another worker wrote in
	 * an earlier call reads to it as a race */
	for (int r = 0; r < NR; r++)
		for (int d = 0; d < hd; d++)
			vacc[r][d] = 0;
	for (int b = 0; b < nb; b++) {
		const char *vs = kt_kv_vspan(kv, tab[b], j->layer);
		const uint16_t *vsc = (const uint16_t *)(vs + (size_t)16 * kd);
		int m = nmax - b * 16 < 16 ? nmax - b * 16 : 16;
		if (b + ATTN_PF < nb) {
			const char *nv = (const char *)kt_kv_vspan(kv, tab[b + ATTN_PF], j->layer) +
					 (size_t)c0 * esz;
			for (int i = 0; i < 16; i++)
				prefetch_span(nv + (size_t)i * kd * esz, vbytes);
		}
		for (int d0 = 0; d0 < hd; d0 += 16) {
			int c = c0 + d0, two = hd - d0 >= 16;
			v8f acc[ATTN_TILE][2];
#pragma GCC unroll 8
			for (int r = 0; r < NR; r++) {
				acc[r][0] = ld8(vacc[r] + d0);
				acc[r][1] = two ? ld8(vacc[r] + d0 + 8) : acc[r][0];
			}
			for (int i = 0; i < m; i++) {
				int p = b * 16 + i;
				v8f v0 = kload8(vs, (size_t)i * kd + c, DT);
				v8f v1 = two ? kload8(vs, (size_t)i * kd + c + 8, DT) : v0;
				if (DT == KT_Q8_0) {  /* scale * code: kt_kv_get_v's value */
					v0 *= h2f(vsc[(size_t)i * ng + c / kv->group]);
					v1 *= h2f(vsc[(size_t)i * ng + (c + 8 * two) / kv->group]);
				}
#pragma GCC unroll 8
				for (int r = 0; r < NR; r++) {
					if (p >= nmin && p >= n[r])
						continue;
					acc[r][0] += sc[r][p] * v0;
					acc[r][1] += sc[r][p] * v1;
				}
			}
#pragma GCC unroll 8
			for (int r = 0; r < NR; r++) {
				st8(vacc[r] + d0, acc[r][0]);
				if (two)
					st8(vacc[r] + d0 + 8, acc[r][1]);
			}
		}
	}
	for (int r = 0; r < R; r++)
		for (int d = 0; d < hd; d += 8)
			st8(out[r] + d, ld8(vacc[r] + d));
}

/* attn_tile_t for one element type, built for x86-64-v4 (AVX-512 with VL:
 * 32 vector registers for the tile's accumulators) and the baseline. */
#if defined(__x86_64__)
#define ATTN_TILE_CLONES __attribute__((target_clones("arch=x86-64-v4", "default")))
#else
#define ATTN_TILE_CLONES
#endif
#define ATTN_TILE_FN(name, DT)                                                              \
	ATTN_TILE_CLONES static void name(const struct attn_job *j, int t0, int nt, int h0,  \
					  int nh, float *s, size_t stride)                     \
	{                                                                                   \
		int R = nt * nh;                                                            \
		if (R <= 1)                                                                 \
			attn_tile_t(j, t0, nt, h0, nh, s, stride, DT, 1);                   \
		else if (R <= 2)                                                            \
			attn_tile_t(j, t0, nt, h0, nh, s, stride, DT, 2);                   \
		else if (R <= 4)                                                            \
			attn_tile_t(j, t0, nt, h0, nh, s, stride, DT, 4);                   \
		else                                                                        \
			attn_tile_t(j, t0, nt, h0, nh, s, stride, DT, ATTN_TILE);           \
	}
ATTN_TILE_FN(attn_tile_f32, KT_F32)
ATTN_TILE_FN(attn_tile_f16, KT_F16)
ATTN_TILE_FN(attn_tile_q8, KT_Q8_0)

/* Tiles: per kv head, its query heads in parts of up to ATTN_TILE, each
 * part with as many consecutive tokens as fill the tile (a tile's tokens
 * share one block table); item i of the n_kv_heads x parts x chunks. */
static void attn_tiles(const struct attn_job *j, int ith, int nth)
{
	int G = j->n_heads / j->n_kv_heads;
	int nh = G < ATTN_TILE ? G : ATTN_TILE, parts = (G + nh - 1) / nh;
	int nt = ATTN_TILE / nh, chunks = (j->n_tok + nt - 1) / nt;
	int total = j->n_kv_heads * parts * chunks;
	int per = (total + nth - 1) / nth;
	int a = ith * per, b = a + per < total ? a + per : total;
	size_t stride = j->scratch_len / ATTN_TILE;
	for (int i = a; i < b; i++) {
		int chunk = i % chunks, part = i / chunks % parts, kvh = i / chunks / parts;
		int h0 = kvh * G + part * nh, hn = G - part * nh < nh ? G - part * nh : nh;
		int t1 = chunk * nt + nt < j->n_tok ? chunk * nt + nt : j->n_tok;
		for (int t0 = chunk * nt; t0 < t1;) {
			int te = t0 + 1;
			while (te < t1 && j->rows[te].block_table == j->rows[t0].block_table)
				te++;
			switch (j->kv->dtype) {
			case KT_F16: attn_tile_f16(j, t0, te - t0, h0, hn, j->scratch[ith], stride); break;
			case KT_Q8_0: attn_tile_q8(j, t0, te - t0, h0, hn, j->scratch[ith], stride); break;
			default: attn_tile_f32(j, t0, te - t0, h0, hn, j->scratch[ith], stride); break;
			}
			t0 = te;
		}
	}
}

static void attn_worker(void *ctx, int ith, int nth)
{
	const struct attn_job *j = ctx;
	if (j->kv->block_size == 16 && j->hd % 8 == 0) {
		attn_tiles(j, ith, nth);
		return;
	}
	/* other shapes (f32 only: kt_kv_dtype_ok), one (token, head) at a
	 * time, head-major: consecutive items are the rows of one head, which
	 * read the same K/V blocks while they are still in cache */
	int total = j->n_tok * j->n_heads;
	int per = (total + nth - 1) / nth;
	int a = ith * per, b = a + per < total ? a + per : total;
	for (int i = a; i < b; i++) {
		int t = i % j->n_tok, h = i / j->n_tok;
		if (j->wide)
			attn_one(j, t, h, j->scratch[ith]);
		else
			attn_one8(j, t, h, j->scratch[ith]);
	}
}

int cpu_scratch_reserve(struct cpu_backend *cb, size_t len)
{
	if (len <= cb->scratch_len)
		return 0;
	int n = tpool_size(cb->pool);
	for (int i = 0; i < n; i++) {
		float *p = realloc(cb->scratch[i], len * sizeof(float));
		if (!p)
			return -ENOMEM;
		cb->scratch[i] = p;
	}
	cb->scratch_len = len;
	return 0;
}

void cpu_attention(struct backend *be, float *out, const float *q,
		   const struct kt_kv *kv, int layer,
		   const struct kt_attn_row *rows, int n_tok,
		   int n_heads, int n_kv_heads, int hd)
{
	struct cpu_backend *cb = (struct cpu_backend *)be;
	size_t maxlen = 0, work = 0;
	for (int t = 0; t < n_tok; t++) {
		size_t l = (size_t)rows[t].pos + 1;
		maxlen = l > maxlen ? l : maxlen;
		work += l;
	}
	/* fwd_new() reserved room for the model's context; a caller that goes
	 * past it without reserving is a bug, not a run-time condition */
	if (cpu_scratch_reserve(cb, ATTN_TILE * (maxlen + 64)) != 0)
		abort();
	struct attn_job j = { out, q, kv, layer, rows, n_tok, n_heads, n_kv_heads, hd,
			      cb->scratch, cb->scratch_len, cb->attn_wide };
	work *= (size_t)n_heads * hd;
	int nth = work < 262144 ? 1 : tpool_size(cb->pool);
	tpool_run(cb->pool, attn_worker, &j, nth);
}

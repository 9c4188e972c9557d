/*
 * kernels/cpu/ops.c — the CPU backend: element-wise ops, RMSNorm, RoPE,
 * paged KV store and attention, and the backend table. Matmul lives in
 * matmul.c. Reductions use a fixed order per row so results are independent
 * of batch composition and thread count.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cpu/cpu.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif


float cpu_dot(const float *a, const float *b, int n)
{
	float acc[16] = { 0 };
	int k = 0;
	for (; k + 16 <= n; k += 16)
		for (int j = 0; j < 16; j++)
			acc[j] += a[k + j] * b[k + j];
	for (int j = 0; k + j < n; j++)
		acc[j] += a[k + j] * b[k + j];
	for (int s = 8; s >= 1; s /= 2)
		for (int j = 0; j < s; j++)
			acc[j] += acc[j + s];
	return acc[0];
}

/* Eight floats as one value: GCC/clang vector extension, an AVX register
 * where the target has one. Loads and stores go through memcpy (unaligned). */
typedef float v8f __attribute__((vector_size(32)));

static inline v8f ld8(const float *p)
{
	v8f v;
	memcpy(&v, p, sizeof(v));
	return v;
}

typedef float v16f __attribute__((vector_size(64)));

/* Sixteen-float values never cross a real call (everything using them is
 * inlined), so the ABI note GCC gives for them does not apply. */
#pragma GCC diagnostic ignored "-Wpsabi"

static inline __attribute__((always_inline)) v16f ld16(const float *p)
{
	v16f v;
	memcpy(&v, p, sizeof(v));
	return v;
}

static inline float hsum8(v8f v)
{
	return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

typedef int32_t v8i __attribute__((vector_size(32)));

static inline void st8(float *p, v8f v)
{
	memcpy(p, &v, sizeof(v));
}

static void cpu_rmsnorm(struct backend *be, float *y, const float *x,
			const float *w, int n, int n_tok, float eps)
{
	(void)be;
	for (int t = 0; t < n_tok; t++) {
		const float *xr = x + (size_t)t * n;
		float *yr = y + (size_t)t * n;
		float ss = cpu_dot(xr, xr, n);
		float s = 1.0f / sqrtf(ss / n + eps);
		for (int i = 0; i < n; i++)
			yr[i] = w[i] * (s * xr[i]);
	}
}

static void rope_heads(float *v, int n_heads, int hd, const float *c, const float *s,
		       enum kt_rope_layout layout)
{
	int half = hd / 2;
	for (int h = 0; h < n_heads; h++) {
		float *x = v + (size_t)h * hd;
		if (layout == KT_ROPE_INTERLEAVED) {
			for (int i = 0; i < half; i++) {
				float a = x[2 * i], b = x[2 * i + 1];
				x[2 * i] = a * c[i] - b * s[i];
				x[2 * i + 1] = a * s[i] + b * c[i];
			}
		} else {
			float tmp[512];
			for (int i = 0; i < half; i++) {
				float a = x[i], b = x[i + half];
				tmp[2 * i] = a * c[i] - b * s[i];
				tmp[2 * i + 1] = a * s[i] + b * c[i];
			}
			memcpy(x, tmp, (size_t)hd * sizeof(float));
		}
	}
}

static void cpu_rope(struct backend *be, float *q, float *k, const int *pos,
		     int n_tok, int n_heads, int n_kv_heads, int hd,
		     const float *inv_freq, enum kt_rope_layout layout)
{
	(void)be;
	float c[256], s[256];
	int half = hd / 2;
	if (hd > 512)
		abort();  /* loaders refuse head_dim > 512 */
	for (int t = 0; t < n_tok; t++) {
		for (int i = 0; i < half; i++) {
			float ang = (float)pos[t] * inv_freq[i];
			c[i] = cosf(ang);
			s[i] = sinf(ang);
		}
		rope_heads(q + (size_t)t * n_heads * hd, n_heads, hd, c, s, layout);
		rope_heads(k + (size_t)t * n_kv_heads * hd, n_kv_heads, hd, c, s, layout);
	}
}

static void cpu_kv_store(struct backend *be, const struct kt_kv *kv, int layer,
			 const float *k, const float *v,
			 const struct kt_attn_row *rows, int n_tok)
{
	(void)be;
	int bs = kv->block_size, kd = kv->kv_dim;
	for (int t = 0; t < n_tok; t++) {
		int p = rows[t].pos;
		int32_t b = rows[t].block_table[p / bs];
		if (kv->dtype != KT_F32) {
			kt_kv_put(kv, b, layer, p % bs, k + (size_t)t * kd, v + (size_t)t * kd);
			continue;
		}
		int r = p % bs;
		float *kt = kt_kv_kt(kv, b, layer);
		const float *kr = k + (size_t)t * kd;
		for (int c = 0; c < kd; c++)
			kt[(size_t)c * bs + r] = kr[c];
		memcpy((float *)kt_kv_vspan(kv, b, layer) + (size_t)r * kd, v + (size_t)t * kd,
		       (size_t)kd * sizeof(float));
	}
}

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

/* From here on (attention, SiLU) multiply-adds may fuse (FMA): the same
 * binary always fuses the same way, so results stay deterministic and
 * batch-invariant. RoPE above stays unfused so that its two pair layouts
 * give identical bits. */
#pragma GCC optimize("fp-contract=fast")

/* exp of eight floats to ~1 ulp in vector arithmetic: range reduction by
 * ln 2 and a degree-6 minimax polynomial (Cephes' expf). Every lane runs the
 * same instructions, so a value's result never depends on its neighbours. */
static inline v8f vexp8(v8f x)
{
	const v8f lo = { -87, -87, -87, -87, -87, -87, -87, -87 };
	const v8f hi = { 88, 88, 88, 88, 88, 88, 88, 88 };
	v8i m = x < lo;
	x = (v8f)(((v8i)x & ~m) | ((v8i)lo & m));
	m = x > hi;
	x = (v8f)(((v8i)x & ~m) | ((v8i)hi & m));
	const float magic = 12582912.0f;  /* 1.5 * 2^23: round to integer */
	v8f fn = x * 1.44269504088896341f + magic;
	v8i n = (v8i)fn - 0x4b400000;
	fn -= magic;
	v8f r = x - fn * 0.693359375f + fn * 2.12194440e-4f;
	v8f p = r * 1.9875691500e-4f + 1.3981999507e-3f;
	p = p * r + 8.3334519073e-3f;
	p = p * r + 4.1665795894e-2f;
	p = p * r + 1.6666665459e-1f;
	p = p * r + 5.0000001201e-1f;
	p = p * r * r + r + 1.0f;
	return p * (v8f)((n + 127) << 23);
}

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

/* out[d0, d0+16*NV) = sum_p sc[p]*inv * V[p][off, off+16*NV), the same with
 * sixteen-float vectors (one AVX-512 register, or two AVX ones). */
static inline __attribute__((always_inline)) void
v_accum16(float *out, const float *sc, float inv, const struct kt_kv *kv, const int32_t *tab,
	  int layer, int n, size_t off, const int NV, int d0)
{
	int bs = kv->block_size;
	size_t kd = (size_t)kv->kv_dim;
	v16f acc[4] = { { 0 } };
	for (int p0 = 0; p0 < n; p0 += bs) {
		int m = n - p0 < bs ? n - p0 : bs;
		const float *vb = kv_v32(kv, tab[p0 / bs], layer, 0) + off;
		for (int i = 0; i < m; i++) {
			float a = sc[p0 + i] * inv;
#pragma GCC unroll 4
			for (int k = 0; k < NV; k++)
				acc[k] += a * ld16(vb + (size_t)i * kd + 16 * k);
		}
	}
#pragma GCC unroll 4
	for (int k = 0; k < NV; k++)
		memcpy(out + d0 + 16 * k, &acc[k], sizeof(v16f));
}

/* out[d0, d0+8*NV) = sum_p sc[p]*inv * V[p][off, off+8*NV): NV registers
 * (a compile-time count, so they stay in registers) held across positions. */
static inline __attribute__((always_inline)) void
v_accum(float *out, const float *sc, float inv, const struct kt_kv *kv, const int32_t *tab,
	int layer, int n, size_t off, const int NV, int d0)
{
	int bs = kv->block_size;
	size_t kd = (size_t)kv->kv_dim;
	v8f acc[8] = { { 0 } };
	for (int p0 = 0; p0 < n; p0 += bs) {
		int m = n - p0 < bs ? n - p0 : bs;
		const float *vb = kv_v32(kv, tab[p0 / bs], layer, 0) + off;
		for (int i = 0; i < m; i++) {
			float a = sc[p0 + i] * inv;
#pragma GCC unroll 8
			for (int k = 0; k < NV; k++)
				acc[k] += a * ld8(vb + (size_t)i * kd + 8 * k);
		}
	}
#pragma GCC unroll 8
	for (int k = 0; k < NV; k++)
		memcpy(out + d0 + 8 * k, &acc[k], sizeof(v8f));
}

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
	int kvh = h / (j->n_heads / j->n_kv_heads);
	const float *q = j->q + ((size_t)t * j->n_heads + h) * hd;
	float *out = j->out + ((size_t)t * j->n_heads + h) * hd;
	const int32_t *tab = j->rows[t].block_table;
	int n = j->rows[t].pos + 1;
	float scale = 1.0f / sqrtf((float)hd);
	size_t hoff = (size_t)kvh * hd * bs;
	int nb = (n + bs - 1) / bs, b = 0;
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
	/* out = sum_p a_p v_p: up to 64 dims at a time in registers held
	 * across positions; each output a sequential sum over p */
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
	while (hd - d0 >= 8) {
		int nv = (hd - d0) / 8 < 8 ? (hd - d0) / 8 : 8;
		switch (nv) {
		case 1: v_accum(out, sc, inv, kv, tab, j->layer, n, (size_t)kvh * hd + d0, 1, d0); break;
		case 2: v_accum(out, sc, inv, kv, tab, j->layer, n, (size_t)kvh * hd + d0, 2, d0); break;
		case 3: v_accum(out, sc, inv, kv, tab, j->layer, n, (size_t)kvh * hd + d0, 3, d0); break;
		case 4: v_accum(out, sc, inv, kv, tab, j->layer, n, (size_t)kvh * hd + d0, 4, d0); break;
		case 5: v_accum(out, sc, inv, kv, tab, j->layer, n, (size_t)kvh * hd + d0, 5, d0); break;
		case 6: v_accum(out, sc, inv, kv, tab, j->layer, n, (size_t)kvh * hd + d0, 6, d0); break;
		case 7: v_accum(out, sc, inv, kv, tab, j->layer, n, (size_t)kvh * hd + d0, 7, d0); break;
		default: v_accum(out, sc, inv, kv, tab, j->layer, n, (size_t)kvh * hd + d0, 8, d0); break;
		}
		d0 += nv * 8;
	}
	for (; d0 < hd; d0++) {
		float acc = 0;
		for (int p = 0; p < n; p++)
			acc += sc[p] * inv *
			       kv_v32(kv, tab[p / bs], j->layer, p % bs)[(size_t)kvh * hd + d0];
		out[d0] = acc;
	}
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
	int kvh = h / (j->n_heads / j->n_kv_heads);
	const float *q = j->q + ((size_t)t * j->n_heads + h) * hd;
	float *out = j->out + ((size_t)t * j->n_heads + h) * hd;
	const int32_t *tab = j->rows[t].block_table;
	int n = j->rows[t].pos + 1;
	float scale = 1.0f / sqrtf((float)hd);
	size_t hoff = (size_t)kvh * hd * bs;
	int nb = (n + bs - 1) / bs, b = 0;
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
	while (hd - d0 >= 8) {
		int nv = (hd - d0) / 8 < 8 ? (hd - d0) / 8 : 8;
		size_t off = (size_t)kvh * hd + d0;
		switch (nv) {
		case 1: v_accum(out, sc, inv, kv, tab, j->layer, n, off, 1, d0); break;
		case 2: v_accum(out, sc, inv, kv, tab, j->layer, n, off, 2, d0); break;
		case 3: v_accum(out, sc, inv, kv, tab, j->layer, n, off, 3, d0); break;
		case 4: v_accum(out, sc, inv, kv, tab, j->layer, n, off, 4, d0); break;
		case 5: v_accum(out, sc, inv, kv, tab, j->layer, n, off, 5, d0); break;
		case 6: v_accum(out, sc, inv, kv, tab, j->layer, n, off, 6, d0); break;
		case 7: v_accum(out, sc, inv, kv, tab, j->layer, n, off, 7, d0); break;
		default: v_accum(out, sc, inv, kv, tab, j->layer, n, off, 8, d0); break;
		}
		d0 += nv * 8;
	}
	for (; d0 < hd; d0++) {
		float acc = 0;
		for (int p = 0; p < n; p++)
			acc += sc[p] * inv *
			       kv_v32(kv, tab[p / bs], j->layer, p % bs)[(size_t)kvh * hd + d0];
		out[d0] = acc;
	}
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
 * Block size 16, head_dim a multiple of 8.
 */
#define ATTN_TILE 8

static inline __attribute__((always_inline)) v8f kload8(const char *span, size_t i, const int DT)
{
	if (DT == KT_F32)
		return ld8((const float *)span + i);
	return tld8(span, i, DT);
}

static inline __attribute__((always_inline)) void
attn_tile_t(const struct attn_job *j, int t0, int nt, int h0, int nh, float *scratch,
	    size_t stride, const int DT)
{
	const struct kt_kv *kv = j->kv;
	int hd = j->hd, R = nt * nh;
	int kvh = h0 / (j->n_heads / j->n_kv_heads), c0 = kvh * hd;
	const int32_t *tab = j->rows[t0].block_table;
	const float *q[ATTN_TILE];
	float *out[ATTN_TILE], *sc[ATTN_TILE], inv[ATTN_TILE];
	int n[ATTN_TILE], nmax = 0;
	for (int r = 0; r < ATTN_TILE; r++) {
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
	for (int b = 0; b < nb; b++) {
		const char *kt = kt_kv_kt(kv, tab[b], j->layer);
		const uint16_t *ks = (const uint16_t *)(kt + (size_t)16 * kv->kv_dim);
		for (int half = 0; half < 16; half += 8) {
			v8f a[ATTN_TILE] = { { 0 } };
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
					for (int r = 0; r < ATTN_TILE; r++)
						a[r] += q[r][d] * k;
				}
			}
			for (int r = 0; r < ATTN_TILE; r++)
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
	for (int r = 0; r < ATTN_TILE; r++)
		for (int d = 0; d < hd; d++)
			vacc[r][d] = 0;
	for (int b = 0; b < nb; b++) {
		const char *vs = kt_kv_vspan(kv, tab[b], j->layer);
		const uint16_t *vsc = (const uint16_t *)(vs + (size_t)16 * kd);
		int m = nmax - b * 16 < 16 ? nmax - b * 16 : 16;
		for (int d0 = 0; d0 < hd; d0 += 16) {
			int c = c0 + d0, two = hd - d0 >= 16;
			v8f acc[ATTN_TILE][2];
			for (int r = 0; r < ATTN_TILE; r++) {
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
				for (int r = 0; r < ATTN_TILE; r++) {
					if (p >= nmin && p >= n[r])
						continue;
					acc[r][0] += sc[r][p] * v0;
					acc[r][1] += sc[r][p] * v1;
				}
			}
			for (int r = 0; r < ATTN_TILE; r++) {
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
		attn_tile_t(j, t0, nt, h0, nh, s, stride, DT);                              \
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

static int ensure_scratch(struct cpu_backend *cb, size_t len)
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

static void cpu_attention(struct backend *be, float *out, const float *q,
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
	if (ensure_scratch(cb, ATTN_TILE * (maxlen + 64)) != 0)
		abort();
	struct attn_job j = { out, q, kv, layer, rows, n_tok, n_heads, n_kv_heads, hd,
			      cb->scratch, cb->scratch_len, cb->attn_wide };
	work *= (size_t)n_heads * hd;
	int nth = work < 262144 ? 1 : tpool_size(cb->pool);
	tpool_run(cb->pool, attn_worker, &j, nth);
}

struct ew_job {
	float *g;
	const float *u;
	size_t n;
};

static void silu_worker(void *ctx, int ith, int nth)
{
	struct ew_job *j = ctx;
	size_t per = ((j->n + nth - 1) / nth + 15) & ~(size_t)15;
	size_t a = (size_t)ith * per, b = a + per < j->n ? a + per : j->n;
	float *g = j->g;
	const float *u = j->u;
	size_t i = a;
	for (; i + 8 <= b; i += 8) {
		v8f x = ld8(g + i);
		st8(g + i, x / (1.0f + vexp8(-x)) * ld8(u + i));
	}
	if (i < b) {  /* the tail through the same vector code */
		float tg[8] = { 0 }, tu[8] = { 0 };
		memcpy(tg, g + i, (b - i) * sizeof(float));
		memcpy(tu, u + i, (b - i) * sizeof(float));
		v8f x = ld8(tg);
		st8(tg, x / (1.0f + vexp8(-x)) * ld8(tu));
		memcpy(g + i, tg, (b - i) * sizeof(float));
	}
}

static void cpu_silu_mul(struct backend *be, float *g, const float *u, size_t n)
{
	struct cpu_backend *cb = (struct cpu_backend *)be;
	struct ew_job j = { g, u, n };
	tpool_run(cb->pool, silu_worker, &j, n < 65536 ? 1 : tpool_size(cb->pool));
}

static void cpu_add(struct backend *be, float *y, const float *x, size_t n)
{
	(void)be;
	for (size_t i = 0; i < n; i++)
		y[i] += x[i];
}

static void cpu_embed(struct backend *be, float *y, const struct kt_weight *table,
		      const int32_t *tok, int n_tok)
{
	(void)be;
	int d = table->cols;
	size_t rb = kt_row_bytes(table->dtype, (size_t)d);
	for (int t = 0; t < n_tok; t++)
		kt_row_to_f32(table->dtype, (const uint8_t *)table->data + (size_t)tok[t] * rb,
			      y + (size_t)t * d, (size_t)d);
}

static int cpu_reserve(struct backend *be, int max_pos, int max_tokens)
{
	struct cpu_backend *cb = (struct cpu_backend *)be;
	if (cb->qx_cols > 0 && cpu_qx_reserve(cb, max_tokens, cb->qx_cols) != 0)
		return -ENOMEM;
	if (cb->xb_cols > 0 &&
	    cpu_xb_reserve(cb, (size_t)(max_tokens > 0 ? max_tokens : 1) * cb->xb_cols) != 0)
		return -ENOMEM;
	/* scores are computed a whole block at a time: room for four rows'
	 * scores, each up to a whole block past max_pos */
	return ensure_scratch(cb, ATTN_TILE * ((size_t)(max_pos > 0 ? max_pos : 1) + 64));
}

static void cpu_free(struct backend *be)
{
	struct cpu_backend *cb = (struct cpu_backend *)be;
	if (cb->scratch) {
		for (int i = 0; i < tpool_size(cb->pool); i++)
			free(cb->scratch[i]);
		free(cb->scratch);
	}
	tpool_free(cb->pool);
	free(cb->qx);
	free(cb->xb);
	free(cb);
}

/* Backend memory is host memory: plain allocations and memcpy. */
static void *cpu_mem_alloc(struct backend *be, size_t bytes)
{
	(void)be;
	return aligned_alloc(64, (bytes + 63) & ~(size_t)63);
}

static void cpu_mem_free(struct backend *be, void *p)
{
	(void)be;
	free(p);
}

static int cpu_copy(struct backend *be, void *dst, const void *src, size_t bytes)
{
	(void)be;
	if (bytes)
		memmove(dst, src, bytes);
	return 0;
}

/* Weights are read where they lie (mmapped or converted at load); with
 * AVX512-VNNI, quantized matrices for matmul also get their packed form;
 * bf16 ones with bf16 dot products set the room their activations need. */
static int cpu_weight_place(struct backend *be, struct kt_weight *dst,
			    const struct kt_weight *src, int use)
{
	struct cpu_backend *cb = (struct cpu_backend *)be;
	*dst = *src;
	dst->pack = NULL;
	if ((use & KT_USE_MATMUL) && cb->bf16_dot && src->dtype == KT_BF16 &&
	    src->cols > cb->xb_cols)
		cb->xb_cols = src->cols;
	if (!(use & KT_USE_MATMUL) || !cb->pack_quant || !kt_dtype_is_quant(src->dtype))
		return 0;
	struct cpu_qpack *p;
	int rc = cpu_qpack_new(src, cb->pool, &p);
	if (rc == -ENOMEM) {
		/* the mapped weights still serve, on the exact path: slower,
		 * not fatal; status says so */
		cb->pack_quant = 0;
		size_t n = strlen(be->desc);
		snprintf(be->desc + n, sizeof(be->desc) - n, " (out of memory packing: exact path)");
		return 0;
	}
	if (rc)
		return 0;      /* not packable (-EINVAL): matmul's exact path serves it */
	dst->pack = p;
	if (src->cols > cb->qx_cols)
		cb->qx_cols = src->cols;
	return 0;
}

static void cpu_weight_release(struct backend *be, struct kt_weight *w)
{
	(void)be;
	cpu_qpack_free(w->pack);
	w->pack = NULL;
}

static const struct backend_ops cpu_ops = {
	.name = "cpu",
	.matmul = cpu_matmul,
	.rmsnorm = cpu_rmsnorm,
	.rope = cpu_rope,
	.kv_store = cpu_kv_store,
	.attention = cpu_attention,
	.silu_mul = cpu_silu_mul,
	.add = cpu_add,
	.embed = cpu_embed,
	.reserve = cpu_reserve,
	.free = cpu_free,
	.mem_alloc = cpu_mem_alloc,
	.mem_free = cpu_mem_free,
	.upload = cpu_copy,
	.download = cpu_copy,
	.copy = cpu_copy,
	.weight_place = cpu_weight_place,
	.weight_release = cpu_weight_release,
};

/* The CPU's instruction sets (cpu.h); the switches apply to the paths only. */
int cpu_has(enum cpu_feature f)
{
#if defined(__x86_64__)
	__builtin_cpu_init();
	switch (f) {
	case CPU_AVX512F: return __builtin_cpu_supports("avx512f");
	case CPU_AVX512:
		return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
		       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("f16c");
	case CPU_AVX2:
		return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
		       __builtin_cpu_supports("f16c");
	case CPU_VNNI:
		return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vnni");
	case CPU_BF16:
		return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
		       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
	}
#else
	(void)f;
#endif
	return 0;
}

struct backend *backend_cpu_new(int n_threads)
{
	if (n_threads <= 0) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);
		n_threads = n > 0 ? (int)n : 1;
	}
	struct cpu_backend *cb = calloc(1, sizeof(*cb));
	if (!cb)
		return NULL;
	cb->be.ops = &cpu_ops;
	cb->be.n_threads = n_threads;
	cb->be.host_mem = 1;
	cb->have_avx512 = cpu_has(CPU_AVX512) && !backend_env_flag("LLAMAD_NO_AVX512");
	cb->have_avx2 = cpu_has(CPU_AVX2) && !backend_env_flag("LLAMAD_NO_AVX2");
	/* sixteen-float attention where it is one register (the AVX-512
	 * clone); the eight-float code elsewhere: the same results */
	cb->attn_wide = cpu_has(CPU_AVX512F);
	cb->be.kv_types = 1u << KT_F32 | 1u << KT_F16 | 1u << KT_Q8_0;
	/* quantized weights are packed for 8-bit activations where the CPU
	 * has AVX512-VNNI or AVX2; the packed form's results do not depend on
	 * the kernel, so LLAMAD_NO_AVX512 / LLAMAD_NO_AVX2 keep packing and
	 * run the next kernel down (AVX2, then the portable one) */
	int vnni = cpu_has(CPU_VNNI);
	cb->pack_quant = (vnni || cpu_has(CPU_AVX2)) && !backend_env_flag("LLAMAD_CPU_EXACT_Q");
	cb->have_vnni = cb->have_avx512 && vnni;
	/* bf16 weights take bf16 activations where VDPBF16PS does the
	 * products (twice the fp32 FMA's rate); elsewhere, or with
	 * LLAMAD_CPU_EXACT_BF16, fp32 activations as for f16 weights. As
	 * for packing, LLAMAD_NO_AVX512 keeps the numerics and runs the
	 * portable loop (the same bits, slowly) */
	cb->bf16_dot = cpu_has(CPU_BF16) && !backend_env_flag("LLAMAD_CPU_EXACT_BF16");
	snprintf(cb->be.desc, sizeof(cb->be.desc), "cpu, %d thread%s%s%s%s", n_threads,
		 n_threads == 1 ? "" : "s",
		 cb->have_avx512 ? ", avx512" : cb->have_avx2 ? ", avx2" : "",
		 !cb->pack_quant ? "" : cb->have_vnni ? ", vnni" :
		 cb->have_avx2 ? ", int8 dot" : ", packed quantized",
		 cb->bf16_dot ? ", bf16 dot" : "");
	cb->pool = tpool_new(n_threads);
	cb->scratch = cb->pool ? calloc((size_t)n_threads, sizeof(float *)) : NULL;
	if (!cb->pool || !cb->scratch || ensure_scratch(cb, 4096) != 0) {
		cpu_free(&cb->be);
		return NULL;
	}
	return &cb->be;
}



/*
 * kernels/cpu/mm_float.c — y = x W^T for f32/f16/bf16 weights and fp32
 * activations: the AVX-512 tiles, their AVX2 twin (8-lane halves of the
 * same 16-lane accumulators) and the portable loop, bit-identical.
 *
 * Batch invariance: every output element is one 16-lane fp32 accumulator
 * running over the input width in steps of 16 (the tail through a masked
 * load), then one fixed horizontal sum. Register tiles of several tokens x
 * several rows only share loads, never partial sums, so an element's value
 * is the same whatever the tile, the thread split or the batch size.
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/mm_int.h"

#if defined(__x86_64__)
AVX512 INLINE __m512 ld_w(const void *base, enum kt_dtype dt, size_t i)
{
	if (dt == KT_F32)
		return _mm512_loadu_ps((const float *)base + i);
	__m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i));
	if (dt == KT_F16)
		return _mm512_cvtph_ps(h);
	return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

AVX512 INLINE __m512 ld_w_mask(const void *base, enum kt_dtype dt, size_t i, __mmask16 m)
{
	if (dt == KT_F32)
		return _mm512_maskz_loadu_ps(m, (const float *)base + i);
	__m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)base + i);
	if (dt == KT_F16)
		return _mm512_cvtph_ps(h);
	return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* One NT x NR tile: tokens [t0, t0+NT) x rows [r0, r0+NR). */
AVX512 INLINE void tile(float *y, const float *x, const void *w, enum kt_dtype dt,
			int K, int N, int t0, int r0, const int NT, const int NR)
{
	__m512 acc[6][8];
	acc_zero(acc, NT, NR);
	int k = 0;
	const char *wb = (const char *)w;
	size_t esz = dt == KT_F32 ? 4 : 2;
	for (; k + 16 <= K; k += 16) {
		__m512 wv[8];
		if (t0 == 0) {
			/* fetch the rows of the next row block (the next NR*K
			 * elements) while this one is computed, one cache line per
			 * row and step; once per row block (its first token tile).
			 * Batch-1 decode is bound by memory latency without it. */
#pragma GCC unroll 8
			for (int r = 0; r < NR; r++)
				_mm_prefetch(wb + ((size_t)(r0 + NR + r) * K + k) * esz, _MM_HINT_T0);
		}
#pragma GCC unroll 8
		for (int r = 0; r < NR; r++) {
			/* in registers: GCC would otherwise fold every use into
			 * its FMA as a memory operand (NT loads of a weight vector,
			 * or NR of an input one), and the load ports, not the FMA
			 * pipes, would set the pace: 80 % of the FMA peak on a
			 * Zen 4 core, 92-96 % with the loads held */
			wv[r] = ld_w(w, dt, (size_t)(r0 + r) * K + k);
			__asm__("" : "+v"(wv[r]));
		}
#pragma GCC unroll 6
		for (int t = 0; t < NT; t++) {
			__m512 xv = _mm512_loadu_ps(x + (size_t)(t0 + t) * K + k);
			__asm__("" : "+v"(xv));
#pragma GCC unroll 8
			for (int r = 0; r < NR; r++)
				acc[t][r] = _mm512_fmadd_ps(xv, wv[r], acc[t][r]);
		}
	}
	if (k < K) {
		__mmask16 m = (__mmask16)((1u << (K - k)) - 1);
		__m512 wv[8];
#pragma GCC unroll 8
		for (int r = 0; r < NR; r++)
			wv[r] = ld_w_mask(w, dt, (size_t)(r0 + r) * K + k, m);
#pragma GCC unroll 6
		for (int t = 0; t < NT; t++) {
			__m512 xv = _mm512_maskz_loadu_ps(m, x + (size_t)(t0 + t) * K + k);
#pragma GCC unroll 8
			for (int r = 0; r < NR; r++)
				acc[t][r] = _mm512_fmadd_ps(xv, wv[r], acc[t][r]);
		}
	}
	acc_store(y, acc, N, t0, r0, NT, NR);
}

/* All tokens x rows [r0, r1) for one dtype (dt is a constant at each call). */
AVX512 INLINE void rows_avx512(float *y, const float *x, const void *w, enum kt_dtype dt,
			       int K, int N, int n_tok, int r0, int r1)
{
	int r = r0;
#define TILE_F(t, q, nt, nr) tile(y, x, w, dt, K, N, t, q, nt, nr)
	ROWS_TILED(r, r1, n_tok, K, dt == KT_F32 ? 4 : 2, TILE_F);
#undef TILE_F
}

ROWS_FOR(cpu_avx512_f32, rows_avx512, KT_F32)
ROWS_FOR(cpu_avx512_f16, rows_avx512, KT_F16)
ROWS_FOR(cpu_avx512_bf16, rows_avx512, KT_BF16)

/* ---- AVX2 + FMA + F16C ---------------------------------------------------
 *
 * The same arithmetic with 8-lane registers (CPUs without AVX-512): the
 * 16-lane accumulator of an element is kept as two halves, lanes 0-7 and
 * 8-15 (lane j still takes input columns k + j, k = 0, 16, ...), and the
 * horizontal sum adds the halves (s = 8), the 128-bit halves of that (4),
 * then pairs (2) and the last two (1): cpu_generic_rows's tree, so the bits are
 * those of cpu_generic_rows and of the AVX-512 path. The tail (K % 16 columns)
 * runs on zero-padded copies and is blended so that the lanes past K keep
 * their value, as cpu_generic_rows leaves them.
 */

/* Eight weights from element i as fp32. */
AVX2 INLINE __m256 a2_ld_w(const void *base, enum kt_dtype dt, size_t i)
{
	if (dt == KT_F32)
		return _mm256_loadu_ps((const float *)base + i);
	__m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)base + i));
	if (dt == KT_F16)
		return _mm256_cvtph_ps(h);
	return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* Lanes [0, n) of 8 set, as a blend mask (n may be <= 0 or >= 8). */

/* Copy the n < 64 bytes of a row's tail into a zeroed stack tile. Byte by
 * byte through volatile, so the compiler never turns it into a call of
 * memcpy: the worker threads then make no libc call (ThreadSanitizer builds
 * leave kernels/ uninstrumented, and an intercepted memcpy of activations
 * handed over by the uninstrumented thread pool would read as a race). */
static inline void tail_copy(void *dst, const void *src, size_t n)
{
	unsigned char *d = dst;
	const volatile unsigned char *s = src;
	for (size_t i = 0; i < n; i++)
		d[i] = s[i];
}

AVX2 INLINE __m256 a2_mask(int n)
{
	return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n),
						      _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
}

/* One NT x NR tile: tokens [t0, t0+NT) x rows [r0, r0+NR). */
AVX2 INLINE void a2_tile(float *y, const float *x, const void *w, enum kt_dtype dt,
			 int K, int N, int t0, int r0, const int NT, const int NR)
{
	__m256 lo[4][4], hi[4][4];
#pragma GCC unroll 4
	for (int t = 0; t < NT; t++)
#pragma GCC unroll 4
		for (int r = 0; r < NR; r++)
			lo[t][r] = hi[t][r] = _mm256_setzero_ps();
	const char *wb = (const char *)w;
	const size_t esz = dt == KT_F32 ? 4 : 2;
	int k = 0;
	for (; k + 16 <= K; k += 16) {
		if (t0 == 0) {
			/* the next row block, as the AVX-512 tile does */
#pragma GCC unroll 4
			for (int r = 0; r < NR; r++)
				_mm_prefetch(wb + ((size_t)(r0 + NR + r) * K + k) * esz, _MM_HINT_T0);
		}
#pragma GCC unroll 4
		for (int r = 0; r < NR; r++) {
			__m256 wl = a2_ld_w(w, dt, (size_t)(r0 + r) * K + k);
			__m256 wh = a2_ld_w(w, dt, (size_t)(r0 + r) * K + k + 8);
#pragma GCC unroll 4
			for (int t = 0; t < NT; t++) {
				const float *xp = x + (size_t)(t0 + t) * K + k;
				lo[t][r] = _mm256_fmadd_ps(_mm256_loadu_ps(xp), wl, lo[t][r]);
				hi[t][r] = _mm256_fmadd_ps(_mm256_loadu_ps(xp + 8), wh, hi[t][r]);
			}
		}
	}
	if (k < K) {
		const int n = K - k;
		const __m256 ml = a2_mask(n), mh = a2_mask(n - 8);
		float xt[4][16] __attribute__((aligned(32)));
#pragma GCC unroll 4
		for (int t = 0; t < NT; t++) {
			memset(xt[t], 0, sizeof(xt[t]));
			tail_copy(xt[t], x + (size_t)(t0 + t) * K + k, (size_t)n * sizeof(float));
		}
#pragma GCC unroll 4
		for (int r = 0; r < NR; r++) {
			float wt[16] __attribute__((aligned(32))) = { 0 };
			tail_copy(wt, wb + ((size_t)(r0 + r) * K + k) * esz, (size_t)n * esz);
			__m256 wl = a2_ld_w(wt, dt, 0), wh = a2_ld_w(wt, dt, 8);
#pragma GCC unroll 4
			for (int t = 0; t < NT; t++) {
				lo[t][r] = _mm256_blendv_ps(lo[t][r],
					_mm256_fmadd_ps(_mm256_load_ps(xt[t]), wl, lo[t][r]), ml);
				hi[t][r] = _mm256_blendv_ps(hi[t][r],
					_mm256_fmadd_ps(_mm256_load_ps(xt[t] + 8), wh, hi[t][r]), mh);
			}
		}
	}
#pragma GCC unroll 4
	for (int t = 0; t < NT; t++)
#pragma GCC unroll 4
		for (int r = 0; r < NR; r++)
			y[(size_t)(t0 + t) * N + r0 + r] = a2_hsum(lo[t][r], hi[t][r]);
}

/* All tokens x rows [r0, r1) for one dtype (dt is a constant at each call):
 * batch 1 four rows at a time; batches 3 tokens x 2 rows (12 of the 16
 * registers accumulate), then the tails. */
AVX2 INLINE void rows_avx2(float *y, const float *x, const void *w, enum kt_dtype dt,
			   int K, int N, int n_tok, int r0, int r1)
{
	int r = r0;
	if (n_tok == 1) {
		for (; r + 4 <= r1; r += 4)
			a2_tile(y, x, w, dt, K, N, 0, r, 1, 4);
		for (; r < r1; r++)
			a2_tile(y, x, w, dt, K, N, 0, r, 1, 1);
		return;
	}
	for (; r + 2 <= r1; r += 2) {
		int t = 0;
		for (; t + 3 <= n_tok; t += 3)
			a2_tile(y, x, w, dt, K, N, t, r, 3, 2);
		switch (n_tok - t) {
		case 2: a2_tile(y, x, w, dt, K, N, t, r, 2, 2); break;
		case 1: a2_tile(y, x, w, dt, K, N, t, r, 1, 2); break;
		}
	}
	for (; r < r1; r++) {
		int t = 0;
		for (; t + 4 <= n_tok; t += 4)
			a2_tile(y, x, w, dt, K, N, t, r, 4, 1);
		for (; t < n_tok; t++)
			a2_tile(y, x, w, dt, K, N, t, r, 1, 1);
	}
}

ROWS_FOR2(cpu_avx2_f32, rows_avx2, KT_F32)
ROWS_FOR2(cpu_avx2_f16, rows_avx2, KT_F16)
ROWS_FOR2(cpu_avx2_bf16, rows_avx2, KT_BF16)
#endif /* __x86_64__ */

static float w_at(const void *w, enum kt_dtype dt, size_t i)
{
	switch (dt) {
	case KT_F32: return ((const float *)w)[i];
	case KT_F16: return kt_f16_to_f32(((const uint16_t *)w)[i]);
	case KT_BF16: return kt_bf16_to_f32(((const uint16_t *)w)[i]);
	case KT_Q8_0:
	case KT_Q4_0:
	case KT_Q4_K:
	case KT_Q5_K:
	case KT_Q6_K: break;     /* cpu_generic_rows_q */
	}
	return 0;
}

/* Portable path: the same 16-lane fused multiply-add order and the same
 * reduction tree as the AVX-512 path, so both give identical bits. */
void cpu_generic_rows(float *y, const float *x, const struct kt_weight *w,
		      int n_tok, int r0, int r1)
{
	int K = w->cols, N = w->rows;
	for (int r = r0; r < r1; r++) {
		for (int t = 0; t < n_tok; t++) {
			const float *xr = x + (size_t)t * K;
			size_t wo = (size_t)r * K;
			float acc[16] = { 0 };
			for (int k = 0; k < K; k += 16)
				for (int j = 0; j < 16 && k + j < K; j++)
					acc[j] = fmaf(xr[k + j], w_at(w->data, w->dtype, wo + k + j), acc[j]);
			for (int s = 8; s >= 1; s /= 2)
				for (int j = 0; j < s; j++)
					acc[j] += acc[j + s];
			y[(size_t)t * N + r] = acc[0];
		}
	}
}

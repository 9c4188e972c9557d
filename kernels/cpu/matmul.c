/*
 * kernels/cpu/matmul.c — y = x W^T for fp32 activations and f32/f16/bf16
 * weights, multi-threaded over weight rows.
 *
 * Batch invariance: every output element is one 16-lane fp32 accumulator
 * running over the input width in steps of 16 (the tail through a masked
 * load), then one fixed horizontal sum. Register tiles of several tokens x
 * several rows only share loads, never partial sums, so an element's value
 * is the same whatever the tile, the thread split or the batch size.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

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
	__m512 acc[4][8];
#pragma GCC unroll 4
	for (int t = 0; t < NT; t++)
#pragma GCC unroll 8
		for (int r = 0; r < NR; r++)
			acc[t][r] = _mm512_setzero_ps();
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
		for (int r = 0; r < NR; r++)
			wv[r] = ld_w(w, dt, (size_t)(r0 + r) * K + k);
#pragma GCC unroll 4
		for (int t = 0; t < NT; t++) {
			__m512 xv = _mm512_loadu_ps(x + (size_t)(t0 + t) * K + k);
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
#pragma GCC unroll 4
		for (int t = 0; t < NT; t++) {
			__m512 xv = _mm512_maskz_loadu_ps(m, x + (size_t)(t0 + t) * K + k);
#pragma GCC unroll 8
			for (int r = 0; r < NR; r++)
				acc[t][r] = _mm512_fmadd_ps(xv, wv[r], acc[t][r]);
		}
	}
#pragma GCC unroll 4
	for (int t = 0; t < NT; t++)
#pragma GCC unroll 8
		for (int r = 0; r < NR; r++)
			y[(size_t)(t0 + t) * N + r0 + r] = _mm512_reduce_add_ps(acc[t][r]);
}

/* All tokens x rows [r0, r1) for one dtype (dt is a constant at each call). */
AVX512 INLINE void rows_avx512(float *y, const float *x, const void *w, enum kt_dtype dt,
			       int K, int N, int n_tok, int r0, int r1)
{
	int r = r0;
	if (n_tok == 1) {
		for (; r + 8 <= r1; r += 8)
			tile(y, x, w, dt, K, N, 0, r, 1, 8);
	}
	for (; r + 4 <= r1; r += 4) {
		int t = 0;
		for (; t + 4 <= n_tok; t += 4)
			tile(y, x, w, dt, K, N, t, r, 4, 4);
		switch (n_tok - t) {
		case 3: tile(y, x, w, dt, K, N, t, r, 3, 4); break;
		case 2: tile(y, x, w, dt, K, N, t, r, 2, 4); break;
		case 1: tile(y, x, w, dt, K, N, t, r, 1, 4); break;
		}
	}
	for (; r < r1; r++) {
		int t = 0;
		for (; t + 4 <= n_tok; t += 4)
			tile(y, x, w, dt, K, N, t, r, 4, 1);
		for (; t < n_tok; t++)
			tile(y, x, w, dt, K, N, t, r, 1, 1);
	}
}

AVX512 static void rows_f32(float *y, const float *x, const void *w, int K, int N,
			    int n_tok, int r0, int r1)
{
	rows_avx512(y, x, w, KT_F32, K, N, n_tok, r0, r1);
}

AVX512 static void rows_f16(float *y, const float *x, const void *w, int K, int N,
			    int n_tok, int r0, int r1)
{
	rows_avx512(y, x, w, KT_F16, K, N, n_tok, r0, r1);
}

AVX512 static void rows_bf16(float *y, const float *x, const void *w, int K, int N,
			     int n_tok, int r0, int r1)
{
	rows_avx512(y, x, w, KT_BF16, K, N, n_tok, r0, r1);
}
#endif /* __x86_64__ */

static float w_at(const void *w, enum kt_dtype dt, size_t i)
{
	switch (dt) {
	case KT_F32: return ((const float *)w)[i];
	case KT_F16: return kt_f16_to_f32(((const uint16_t *)w)[i]);
	case KT_BF16: return kt_bf16_to_f32(((const uint16_t *)w)[i]);
	}
	return 0;
}

/* Portable path: the same 16-lane fused multiply-add order and the same
 * reduction tree as the AVX-512 path, so both give identical bits. */
static void rows_generic(float *y, const float *x, const struct kt_weight *w,
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

void cpu_matmul_rows(int avx512, float *y, const float *x,
		     const struct kt_weight *w, int n_tok, int r0, int r1)
{
#if defined(__x86_64__)
	if (avx512) {
		switch (w->dtype) {
		case KT_F32: rows_f32(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		case KT_F16: rows_f16(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		case KT_BF16: rows_bf16(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		}
	}
#else
	(void)avx512;
#endif
	rows_generic(y, x, w, n_tok, r0, r1);
}

struct mm_job {
	float *y;
	const float *x;
	const struct kt_weight *w;
	int n_tok;
	int avx512;
};

static void mm_worker(void *ctx, int ith, int nth)
{
	struct mm_job *j = ctx;
	int rows = j->w->rows;
	/* split rows in chunks that are multiples of 8 */
	int per = ((rows + nth - 1) / nth + 7) & ~7;
	int r0 = ith * per, r1 = r0 + per;
	if (r1 > rows)
		r1 = rows;
	if (r0 < r1)
		cpu_matmul_rows(j->avx512, j->y, j->x, j->w, j->n_tok, r0, r1);
}

void cpu_matmul(struct backend *be, float *y, const float *x,
		const struct kt_weight *w, int n_tok)
{
	struct cpu_backend *cb = (struct cpu_backend *)be;
	struct mm_job j = { y, x, w, n_tok, cb->have_avx512 };
	size_t work = (size_t)w->rows * w->cols * kt_dtype_size(w->dtype) +
		      (size_t)n_tok * w->rows * w->cols / 4;
	/* below ~256 KiB of weights a second thread costs more than it gives */
	int nth = work < (256u << 10) ? 1 : tpool_size(cb->pool);
	tpool_run(cb->pool, mm_worker, &j, nth);
}

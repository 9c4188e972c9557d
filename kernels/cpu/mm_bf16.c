/*
 * kernels/cpu/mm_bf16.c — bf16 weights x bf16 activations: the
 * activations rounded to bf16, and the products with VDPBF16PS (AVX512-BF16)
 * or the portable loop that gives its bits.
 */
#include <math.h>

#include "kernels/cpu/mm_int.h"

/* ---- bf16 weights x bf16 activations (AVX512-BF16) -------------------------
 *
 * Where the CPU has VDPBF16PS and LLAMAD_CPU_EXACT_BF16 is not set
 * (cb->bf16_dot), bf16 weights multiply the activations rounded to bf16
 * (cpu_bf16_round): one instruction makes 32 products into 16 lanes, twice
 * the work of an fp32 FMA. f32 and f16 weights keep fp32 activations.
 *
 * The arithmetic of an element: lane j of one 16-lane accumulator takes,
 * for each 32-column step k in order, acc = fma(x[k+2j+1], w[k+2j+1], acc)
 * and then acc = fma(x[k+2j], w[k+2j], acc), each rounded to fp32, denormal
 * inputs read as zero and denormal results flushed to zero (VDPBF16PS as
 * Intel defines it; this Zen 4 agrees on 32 M random lanes); columns past K
 * are zeros. Then the fixed horizontal sum. cpu_generic_bf16_dot does that in
 * C, so every path gives the same bits, whatever the batch.
 */

/* x rounded to bf16, to nearest even; zero and denormals to a signed zero
 * (VCVTNEPS2BF16's rule), NaN to a quiet NaN of the same sign. */
static inline uint16_t bf16_round1(float f)
{
	return fabsf(f) < 0x1p-126f ? (uint16_t)(signbit(f) ? 0x8000u : 0) : kt_f32_to_bf16(f);
}

/* A bf16 input as VDPBF16PS reads it: denormals as a signed zero. */
static inline float bf16_daz(uint16_t h)
{
	return kt_bf16_to_f32((h & 0x7f80u) ? h : (uint16_t)(h & 0x8000u));
}

/* A result as VDPBF16PS leaves it: denormals flushed to a signed zero. */
static inline float bf16_ftz(float f)
{
	return fabsf(f) < 0x1p-126f ? copysignf(0.0f, f) : f;
}

#if defined(__x86_64__)

BF16 void cpu_avx512_bf16_round(uint16_t *o, const float *x, size_t n)
{
	const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7fff);
	const __m512i expo = _mm512_set1_epi32(0x7f800000), abs = _mm512_set1_epi32(0x7fffffff);
	for (size_t i = 0; i < n; i += 16) {
		__mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
		__m512i u = _mm512_maskz_loadu_epi32(m, x + i);
		__m512i hi = _mm512_srli_epi32(u, 16);
		__m512i r = _mm512_srli_epi32(
			_mm512_add_epi32(u, _mm512_add_epi32(half, _mm512_and_si512(hi, one))), 16);
		__mmask16 den = _mm512_testn_epi32_mask(u, expo);
		__mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs), expo);
		r = _mm512_mask_and_epi32(r, den, hi, _mm512_set1_epi32(0x8000));
		r = _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(0x40));
		_mm512_mask_cvtepi32_storeu_epi16(o + i, m, r);
	}
}

/* One 32-column step of a bf16 tile: columns [k, k+32) under mask m (the
 * tail's columns past K read as zeros). */
BF16 INLINE void bstep(__m512 acc[6][8], const uint16_t *xb, const uint16_t *w, int K, int t0,
		       int r0, int k, __mmask32 m, const int NT, const int NR)
{
	__m512i wv[8];
	if (t0 == 0) {
#pragma GCC unroll 8
		for (int r = 0; r < NR; r++)
			_mm_prefetch((const char *)(w + (size_t)(r0 + NR + r) * K + k), _MM_HINT_T0);
	}
#pragma GCC unroll 8
	for (int r = 0; r < NR; r++) {
		wv[r] = _mm512_maskz_loadu_epi16(m, w + (size_t)(r0 + r) * K + k);
		__asm__("" : "+v"(wv[r]));  /* in registers: see tile() */
	}
#pragma GCC unroll 6
	for (int t = 0; t < NT; t++) {
		__m512i xv = _mm512_maskz_loadu_epi16(m, xb + (size_t)(t0 + t) * K + k);
		__asm__("" : "+v"(xv));
#pragma GCC unroll 8
		for (int r = 0; r < NR; r++)
			acc[t][r] = _mm512_dpbf16_ps(acc[t][r], (__m512bh)xv, (__m512bh)wv[r]);
	}
}

/* One NT x NR tile of bf16 products: tokens [t0, t0+NT) x rows [r0, r0+NR). */
BF16 INLINE void btile(float *y, const uint16_t *xb, const uint16_t *w, int K, int N, int t0,
		       int r0, const int NT, const int NR)
{
	__m512 acc[6][8];
	acc_zero(acc, NT, NR);
	int k = 0;
	for (; k + 32 <= K; k += 32)
		bstep(acc, xb, w, K, t0, r0, k, (__mmask32)~0u, NT, NR);
	if (k < K)
		bstep(acc, xb, w, K, t0, r0, k, (__mmask32)((1u << (K - k)) - 1), NT, NR);
	acc_store(y, acc, N, t0, r0, NT, NR);
}

/* All tokens x rows [r0, r1): the tiles and row blocks of rows_avx512. */
BF16 void cpu_avx512_bf16_dot(float *y, const uint16_t *xb, const uint16_t *w, int K, int N,
				  int n_tok, int r0, int r1)
{
	int r = r0;
#define TILE_B(t, q, nt, nr) btile(y, xb, w, K, N, t, q, nt, nr)
	ROWS_TILED(r, r1, n_tok, K, 2, TILE_B);
#undef TILE_B
}
#endif /* __x86_64__ */

/* Portable: the same operations in C (see the section's comment). */
void cpu_generic_bf16_dot(float *y, const uint16_t *xb, const uint16_t *w, int K, int N,
			      int n_tok, int r0, int r1)
{
	for (int r = r0; r < r1; r++) {
		const uint16_t *wr = w + (size_t)r * K;
		for (int t = 0; t < n_tok; t++) {
			const uint16_t *xr = xb + (size_t)t * K;
			float acc[16] = { 0 };
			for (int k = 0; k < K; k += 32)
				for (int j = 0; j < 16; j++) {
					int i = k + 2 * j;
					float x0 = i < K ? bf16_daz(xr[i]) : 0, w0 = i < K ? bf16_daz(wr[i]) : 0;
					float x1 = i + 1 < K ? bf16_daz(xr[i + 1]) : 0;
					float w1 = i + 1 < K ? bf16_daz(wr[i + 1]) : 0;
					acc[j] = bf16_ftz(fmaf(x1, w1, acc[j]));
					acc[j] = bf16_ftz(fmaf(x0, w0, acc[j]));
				}
			for (int s = 8; s >= 1; s /= 2)
				for (int j = 0; j < s; j++)
					acc[j] += acc[j + s];
			y[(size_t)t * N + r] = acc[0];
		}
	}
}

void cpu_generic_bf16_round(uint16_t *xb, const float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		xb[i] = bf16_round1(x[i]);
}

/*
 * kernels/cpu/mm_int.h — what the matmul kernels share (private to
 * kernels/cpu/mm_*.c and matmul.c): the instruction-set attributes, the
 * AVX-512 accumulator tile, the row-block walk, the AVX2 horizontal sum,
 * the per-dtype entry points and their declarations. matmul.c picks the
 * kernel for an isa and a dtype (cpu_matmul_rows, cpu_matmul_rows_bf16,
 * cpu_bf16_round, cpu_qx_quantize, cpu_qpack_rows); every kernel of one
 * arithmetic gives the same bits.
 */
#ifndef LLAMAD_KERNELS_CPU_MM_INT_H
#define LLAMAD_KERNELS_CPU_MM_INT_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/cpu.h"

/* ---- portable kernels (any CPU) ---- */

/* f32/f16/bf16 weights, fp32 activations (mm_float.c) and the quantized
 * ones dequantized (mm_quant.c): rows [r0, r1) of w for n_tok tokens. */
void cpu_generic_rows(float *y, const float *x, const struct kt_weight *w, int n_tok, int r0,
		      int r1);
void cpu_generic_rows_q(float *y, const float *x, const struct kt_weight *w, int n_tok,
			int r0, int r1);
/* bf16 weights x bf16 activations (mm_bf16.c): the activations rounded,
 * and rows [r0, r1) of the K-column, N-row w. */
void cpu_generic_bf16_round(uint16_t *xb, const float *x, size_t n);
void cpu_generic_bf16_dot(float *y, const uint16_t *xb, const uint16_t *w, int K, int N,
			  int n_tok, int r0, int r1);

#if defined(__x86_64__)
#include <immintrin.h>
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))
#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c,avx512bf16")))

/* The x86 kernels of one dtype: all tokens x rows [r0, r1) of the
 * K-column, N-row weight at w (mm_float.c, mm_quant.c). */
#define CPU_MM_ROWS(name) \
	void name(float *y, const float *x, const void *w, int K, int N, int n_tok, int r0, int r1)
AVX512 CPU_MM_ROWS(cpu_avx512_f32);
AVX512 CPU_MM_ROWS(cpu_avx512_f16);
AVX512 CPU_MM_ROWS(cpu_avx512_bf16);
AVX512 CPU_MM_ROWS(cpu_avx512_q8_0);
AVX512 CPU_MM_ROWS(cpu_avx512_q4_0);
AVX512 CPU_MM_ROWS(cpu_avx512_q4_k);
AVX512 CPU_MM_ROWS(cpu_avx512_q5_k);
AVX512 CPU_MM_ROWS(cpu_avx512_q6_k);
AVX2 CPU_MM_ROWS(cpu_avx2_f32);
AVX2 CPU_MM_ROWS(cpu_avx2_f16);
AVX2 CPU_MM_ROWS(cpu_avx2_bf16);
AVX2 CPU_MM_ROWS(cpu_avx2_q8_0);
AVX2 CPU_MM_ROWS(cpu_avx2_q4_0);
AVX2 CPU_MM_ROWS(cpu_avx2_q4_k);
AVX2 CPU_MM_ROWS(cpu_avx2_q5_k);
AVX2 CPU_MM_ROWS(cpu_avx2_q6_k);
/* VDPBF16PS (mm_bf16.c) */
BF16 void cpu_avx512_bf16_round(uint16_t *o, const float *x, size_t n);
BF16 void cpu_avx512_bf16_dot(float *y, const uint16_t *xb, const uint16_t *w, int K, int N,
			      int n_tok, int r0, int r1);

/* A tile's accumulators: zeroed; reduced into y (tokens t0.., rows r0..)
 * by the fixed horizontal sum. */
AVX512 INLINE void acc_zero(__m512 acc[6][8], const int NT, const int NR)
{
#pragma GCC unroll 6
	for (int t = 0; t < NT; t++)
#pragma GCC unroll 8
		for (int r = 0; r < NR; r++)
			acc[t][r] = _mm512_setzero_ps();
}

AVX512 INLINE void acc_store(float *y, __m512 acc[6][8], int N, int t0, int r0, const int NT,
			     const int NR)
{
#pragma GCC unroll 6
	for (int t = 0; t < NT; t++)
#pragma GCC unroll 8
		for (int r = 0; r < NR; r++)
			y[(size_t)(t0 + t) * N + r0 + r] = _mm512_reduce_add_ps(acc[t][r]);
}

/* Tokens per tile of a batch: 6 x 4 rows = 24 accumulators, + 4 weight
 * vectors and an input one, of the 32 registers (4 x 4: 1-3 % slower). */
#define TT 6

/* Weight bytes of a batch's row block: it stays in L2 while every token
 * tile runs over it, and each token tile's inputs stay there across the
 * block's rows. Four rows at a time (a block of one row tile), the inputs
 * of the whole batch came back from L3 for every four rows: 4 MB of them
 * for each four rows at 8,192 columns and 128 tokens, and prefill ran at
 * the pace of a shared L3. */
#define ROW_BLOCK_BYTES (256u << 10)

/* The tiles of all tokens x rows [r, r1), rows of esz bytes a column:
 * batch 1 eight rows at a time; batches in row blocks of ROW_BLOCK_BYTES,
 * every TT x 4 tile over a block before the next block, then the token
 * tail's tile; the last rows (r1 - r0 mod 4) 4 x 1 and 1 x 1. TILE(t, q,
 * NT, NR) computes tokens [t, t+NT) x rows [q, q+NR). */
#define ROWS_TILED(r, r1, n_tok, K, esz, TILE)                                   \
	do {                                                                     \
		if ((n_tok) == 1)                                                \
			for (; r + 8 <= (r1); r += 8)                            \
				TILE(0, r, 1, 8);                                \
		int rb_ = (int)(ROW_BLOCK_BYTES / ((size_t)(K) * (esz))) & ~3;    \
		if (rb_ < 4)                                                     \
			rb_ = 4;                                                 \
		while (r + 4 <= (r1)) {                                          \
			int re_ = r + (((r1) - r < rb_ ? (r1) - r : rb_) & ~3);   \
			int t_ = 0;                                              \
			for (; t_ + TT <= (n_tok); t_ += TT)                     \
				for (int q_ = r; q_ < re_; q_ += 4)               \
					TILE(t_, q_, TT, 4);                     \
			for (int q_ = r; q_ < re_ && t_ < (n_tok); q_ += 4) {     \
				switch ((n_tok) - t_) {                          \
				case 5: TILE(t_, q_, 5, 4); break;               \
				case 4: TILE(t_, q_, 4, 4); break;               \
				case 3: TILE(t_, q_, 3, 4); break;               \
				case 2: TILE(t_, q_, 2, 4); break;               \
				case 1: TILE(t_, q_, 1, 4); break;               \
				}                                                \
			}                                                        \
			r = re_;                                                 \
		}                                                                \
		for (; r < (r1); r++) {                                          \
			int t_ = 0;                                              \
			for (; t_ + 4 <= (n_tok); t_ += 4)                       \
				TILE(t_, r, 4, 1);                               \
			for (; t_ < (n_tok); t_++)                               \
				TILE(t_, r, 1, 1);                               \
		}                                                                \
	} while (0)


/* One entry point per dtype: the dtype is a constant inside, so the inlined
 * row loop is specialised for it. */
#define ROWS_FOR(name, impl, dt)                                                  \
	AVX512 void name(float *y, const float *x, const void *w, int K, int N, \
				int n_tok, int r0, int r1)                             \
	{                                                                       \
		impl(y, x, w, dt, K, N, n_tok, r0, r1);                           \
	}

#define ROWS_FOR2(name, impl, dt)                                                 \
	AVX2 void name(float *y, const float *x, const void *w, int K, int N, \
			      int n_tok, int r0, int r1)                             \
	{                                                                       \
		impl(y, x, w, dt, K, N, n_tok, r0, r1);                           \
	}

/* lanes 0-15 as two halves -> the fixed reduction tree */
AVX2 INLINE float a2_hsum(__m256 lo, __m256 hi)
{
	__m256 v = _mm256_add_ps(lo, hi);
	__m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	a = _mm_add_ps(a, _mm_movehl_ps(a, a));
	a = _mm_add_ss(a, _mm_movehdup_ps(a));
	return _mm_cvtss_f32(a);
}
#endif /* __x86_64__ */

#endif

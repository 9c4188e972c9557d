/*
 * kernels/cpu/matmul.c — y = x W^T for fp32 activations and f32/f16/bf16
 * or block-quantized (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K) weights, multi-threaded
 * over weight rows.
 *
 * Batch invariance: every output element is one 16-lane fp32 accumulator
 * running over the input width in steps of 16 (the tail through a masked
 * load), then one fixed horizontal sum. Register tiles of several tokens x
 * several rows only share loads, never partial sums, so an element's value
 * is the same whatever the tile, the thread split or the batch size.
 */
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
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

/* All tokens x rows [r0, r1) for one dtype (dt is a constant at each call). */
AVX512 INLINE void rows_avx512(float *y, const float *x, const void *w, enum kt_dtype dt,
			       int K, int N, int n_tok, int r0, int r1)
{
	int r = r0;
#define TILE_F(t, q, nt, nr) tile(y, x, w, dt, K, N, t, q, nt, nr)
	ROWS_TILED(r, r1, n_tok, K, dt == KT_F32 ? 4 : 2, TILE_F);
#undef TILE_F
}

/* One entry point per dtype: the dtype is a constant inside, so the inlined
 * row loop is specialised for it. */
#define ROWS_FOR(name, impl, dt)                                                  \
	AVX512 static void name(float *y, const float *x, const void *w, int K, int N, \
				int n_tok, int r0, int r1)                             \
	{                                                                       \
		impl(y, x, w, dt, K, N, n_tok, r0, r1);                           \
	}

ROWS_FOR(rows_f32, rows_avx512, KT_F32)
ROWS_FOR(rows_f16, rows_avx512, KT_F16)
ROWS_FOR(rows_bf16, rows_avx512, KT_BF16)

/* ---- block-quantized weights (Q8_0, Q4_0) ------------------------------
 *
 * The arithmetic of every output element: for each 32-weight block of its
 * row, in order, the two 16-weight halves (weights 0-15, then 16-31) are
 * dequantized to fp32 (w = d * q for Q8_0, w = d * (q - 8) for Q4_0, the
 * f16 scale times a small integer: an fp32 product, exact in fact) and
 * fused into the same 16-lane accumulator, lane j taking weight j of the
 * half; then the fixed horizontal sum. That is the f32 loop above run on the
 * dequantized row, so the portable path (rows_generic_q) matches it bit for
 * bit, and no tile shape, split or batch size changes it.
 *
 * Q4_0 dequantizes through a 16-entry table d * {-8..7} built per block and
 * indexed by the nibbles (vpermps): the same products in fewer uops.
 *
 * Memory: a quantized row is short (Q4_0: 432 bytes at 768 columns), so a
 * tile of consecutive rows interleaves many rows inside one 4 KiB page,
 * which the hardware streamer cannot follow (batch-1 decode ran at 60-70 %
 * of the memory roof that way). Tiles therefore take their rows from
 * separate streams of consecutive rows: row i of a tile is row j of stream
 * i, so each stream is read in ascending order, and the rows two further on
 * in each stream are prefetched.
 */

#define Q_STREAMS 8     /* rows per batch-1 tile, one per stream */
#define Q_NBMAX 512     /* blocks per row (K <= 16384) for pipelined scales */

INLINE size_t q_block_bytes(enum kt_dtype dt)
{
	return dt == KT_Q8_0 ? 2 + KT_QBLOCK : 2 + KT_QBLOCK / 2;
}

/* The block's f16 scale, converted and broadcast. */
AVX512 INLINE __m512 q_scale(const uint8_t *blk)
{
	short h;
	memcpy(&h, blk, 2);
	return _mm512_cvtph_ps(_mm256_set1_epi16(h));
}

/* The two dequantized halves of one block; d = its scale, broadcast. */
AVX512 INLINE void q_deq(const uint8_t *blk, enum kt_dtype dt, __m512 d, __m512 *w0, __m512 *w1)
{
	if (dt == KT_Q8_0) {
		__m512i a = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2)));
		__m512i b = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 18)));
		*w0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(a));
		*w1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(b));
	} else {
		const __m512 base = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1,
						   0, 1, 2, 3, 4, 5, 6, 7);
		__m512 tab = _mm512_mul_ps(d, base);
		__m512i n = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2)));
		*w0 = _mm512_permutexvar_ps(n, tab);                        /* low nibbles */
		*w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(n, 4), tab);  /* high */
	}
}

/*
 * Batch-1 tile: rows r0, r0 + stride, ..., r0 + (NR-1) * stride of the one
 * token, dequantized on the fly; each row's bytes `pf` further on are
 * prefetched.
 *
 * Scales: with hcur, this tile's f16 scales ([NR][nbmax], copied with
 * scalar moves during the previous tile, so long stored) are converted 16
 * at a time and broadcast from memory, which leaves the shuffle port to the
 * weights; the tile meanwhile copies the next tile's (the rows one further
 * on in each stream) into hnext, if not NULL. Without hcur each scale is
 * converted where it is used.
 */
AVX512 INLINE void qtile_1(float *y, const float *x, const uint8_t *w, enum kt_dtype dt,
			   int K, int r0, int stride, size_t pf, const uint16_t *hcur,
			   uint16_t *hnext, int nbmax, const int NR)
{
	const size_t bb = q_block_bytes(dt), rb = (size_t)K / KT_QBLOCK * bb;
	const int nb = K / KT_QBLOCK;
	const uint8_t *row[Q_STREAMS];
	__m512 acc[Q_STREAMS];
#pragma GCC unroll 8
	for (int r = 0; r < NR; r++) {
		row[r] = w + (size_t)(r0 + r * stride) * rb;
		acc[r] = _mm512_setzero_ps();
	}
	for (int c0 = 0; c0 < nb; c0 += 16) {
		int cn = nb - c0 < 16 ? nb - c0 : 16;
		float sc[Q_STREAMS][16];
		if (hcur) {
#pragma GCC unroll 8
			for (int r = 0; r < NR; r++)
				_mm512_storeu_ps(sc[r], _mm512_cvtph_ps(_mm256_loadu_si256(
					(const __m256i *)(hcur + (size_t)r * nbmax + c0))));
		}
		for (int b = c0; b < c0 + cn; b++) {
			size_t off = (size_t)b * bb;
			/* one prefetch per row and cache line or a little more:
			 * every block of 34 bytes, every third of 18 */
			if (dt == KT_Q8_0 || b % 3 == 0) {
#pragma GCC unroll 8
				for (int r = 0; r < NR; r++)
					_mm_prefetch((const char *)row[r] + pf + off, _MM_HINT_T0);
			}
			if (hnext) {
#pragma GCC unroll 8
				for (int r = 0; r < NR; r++)
					memcpy(hnext + (size_t)r * nbmax + b, row[r] + rb + off, 2);
			}
			__m512 x0 = _mm512_loadu_ps(x + (size_t)b * KT_QBLOCK);
			__m512 x1 = _mm512_loadu_ps(x + (size_t)b * KT_QBLOCK + 16);
#pragma GCC unroll 8
			for (int r = 0; r < NR; r++) {
				__m512 w0, w1;
				__m512 d = hcur ? _mm512_set1_ps(sc[r][b - c0]) : q_scale(row[r] + off);
				q_deq(row[r] + off, dt, d, &w0, &w1);
				acc[r] = _mm512_fmadd_ps(x0, w0, acc[r]);
				acc[r] = _mm512_fmadd_ps(x1, w1, acc[r]);
			}
		}
	}
#pragma GCC unroll 8
	for (int r = 0; r < NR; r++)
		y[r0 + r * stride] = _mm512_reduce_add_ps(acc[r]);
}

/* Batch 1, rows [r0, r1): Q_STREAMS streams of L consecutive rows, then the
 * rest four and one at a time. */
AVX512 INLINE void rows_q_1(float *y, const float *x, const uint8_t *w, enum kt_dtype dt,
			    int K, int r0, int r1)
{
	const size_t bb = q_block_bytes(dt), rb = (size_t)K / KT_QBLOCK * bb;
	const int nb = K / KT_QBLOCK, L = (r1 - r0) / Q_STREAMS;
	if (L > 0 && nb <= Q_NBMAX) {
		/* the streams' first two rows are not prefetched by any tile */
		for (int i = 0; i < Q_STREAMS; i++)
			for (size_t o = 0; o < (size_t)(L < 2 ? L : 2) * rb; o += 64)
				_mm_prefetch((const char *)w + (size_t)(r0 + i * L) * rb + o,
					     _MM_HINT_T0);
		uint16_t h[2][Q_STREAMS * Q_NBMAX];
		int nb16 = (nb + 15) & ~15;  /* 16-scale loads past nb read zeros */
		for (int i = 0; i < Q_STREAMS; i++) {
			for (int b = 0; b < nb; b++)
				memcpy(&h[0][i * Q_NBMAX + b],
				       w + (size_t)(r0 + i * L) * rb + (size_t)b * bb, 2);
			for (int b = nb; b < nb16; b++)
				h[0][i * Q_NBMAX + b] = h[1][i * Q_NBMAX + b] = 0;
		}
		for (int j = 0; j < L; j++)
			qtile_1(y, x, w, dt, K, r0 + j, L, 2 * rb, h[j & 1],
				j + 1 < L ? h[(j + 1) & 1] : NULL, Q_NBMAX, Q_STREAMS);
	} else {
		for (int j = 0; j < L; j++)
			qtile_1(y, x, w, dt, K, r0 + j, L, 2 * rb, NULL, NULL, 0, Q_STREAMS);
	}
	int r = r0 + Q_STREAMS * L;
	for (; r + 4 <= r1; r += 4)
		qtile_1(y, x, w, dt, K, r, 1, 4 * rb, NULL, NULL, 0, 4);
	for (; r < r1; r++)
		qtile_1(y, x, w, dt, K, r, 1, rb, NULL, NULL, 0, 1);
}

/*
 * Batches: for a block of QR rows and a chunk of QK input columns, the rows
 * are dequantized once into wbuf (fp32) and every token of the group runs
 * over them with NT x QR register tiles, its 16-lane accumulators kept in
 * abuf between chunks (a store and reload of the same fp32 values: the
 * arithmetic is unchanged). The row blocks are streams, as for batch 1.
 */
#define QR 4            /* rows per row block */
#define QK 512          /* input columns per chunk (16 blocks) */
#define QT 64           /* tokens per group */

/* Dequantize NR rows (row[]) over columns [k0, k0+kn) into wbuf[r][0..kn);
 * if pf, prefetch the same columns pf bytes further on. K-quants (k0 and kn
 * multiples of KT_QK_K) go through kt_row_to_f32: the same fp32 values the
 * portable path uses. */
AVX512 INLINE void q_deq_rows(float *wbuf, const uint8_t *const *row, enum kt_dtype dt,
			      int k0, int kn, size_t pf, const int NR)
{
	if (dt == KT_Q4_K || dt == KT_Q5_K || dt == KT_Q6_K) {
		const size_t bb = kt_row_bytes(dt, KT_QK_K);
		for (int r = 0; r < NR; r++) {
			const uint8_t *p = row[r] + (size_t)(k0 / KT_QK_K) * bb;
			if (pf)
				for (size_t o = 0; o < (size_t)(kn / KT_QK_K) * bb; o += 64)
					_mm_prefetch((const char *)p + pf + o, _MM_HINT_T0);
			kt_row_to_f32(dt, p, wbuf + (size_t)r * QK, (size_t)kn);
		}
		return;
	}
	const size_t bb = q_block_bytes(dt);
	int b0 = k0 / KT_QBLOCK, nb = kn / KT_QBLOCK;
	for (int r = 0; r < NR; r++)
		for (int b = 0; b < nb; b++) {
			const uint8_t *blk = row[r] + (size_t)(b0 + b) * bb;
			if (pf)
				_mm_prefetch((const char *)blk + pf, _MM_HINT_T0);
			__m512 w0, w1;
			q_deq(blk, dt, q_scale(blk), &w0, &w1);
			_mm512_storeu_ps(wbuf + (size_t)r * QK + b * KT_QBLOCK, w0);
			_mm512_storeu_ps(wbuf + (size_t)r * QK + b * KT_QBLOCK + 16, w1);
		}
}

/* NT tokens x NR rows over one chunk: acc (abuf[t][r], 16 lanes) +=
 * x[t][k0..k0+kn) * wbuf[r][0..kn); first: start from zero. */
AVX512 INLINE void qtile_n(float *abuf, const float *x, const float *wbuf, int K, int k0, int kn,
			   int first, const int NT, const int NR)
{
	__m512 acc[4][QR];
#pragma GCC unroll 4
	for (int t = 0; t < NT; t++)
#pragma GCC unroll 4
		for (int r = 0; r < NR; r++)
			acc[t][r] = first ? _mm512_setzero_ps()
					  : _mm512_loadu_ps(abuf + ((size_t)t * QR + r) * 16);
	for (int k = 0; k < kn; k += 16) {
		__m512 wv[QR];
#pragma GCC unroll 4
		for (int r = 0; r < NR; r++) {
			wv[r] = _mm512_loadu_ps(wbuf + (size_t)r * QK + k);
			__asm__("" : "+v"(wv[r]));  /* in registers: see tile() */
		}
#pragma GCC unroll 4
		for (int t = 0; t < NT; t++) {
			__m512 xv = _mm512_loadu_ps(x + (size_t)t * K + k0 + k);
			__asm__("" : "+v"(xv));
#pragma GCC unroll 4
			for (int r = 0; r < NR; r++)
				acc[t][r] = _mm512_fmadd_ps(xv, wv[r], acc[t][r]);
		}
	}
#pragma GCC unroll 4
	for (int t = 0; t < NT; t++)
#pragma GCC unroll 4
		for (int r = 0; r < NR; r++)
			_mm512_storeu_ps(abuf + ((size_t)t * QR + r) * 16, acc[t][r]);
}

/* Tokens [t0, t0+nt) (nt <= QT) x the NR rows of one row block (row[];
 * output rows r0, r0 + stride, ...), all chunks; pf as q_deq_rows. */
AVX512 INLINE void q_block_rows(float *y, const float *x, const uint8_t *const *row,
				enum kt_dtype dt, size_t pf, int K, int N, int t0, int nt,
				int r0, int stride, const int NR)
{
	float wbuf[QR * QK] __attribute__((aligned(64)));
	float abuf[QT * QR * 16] __attribute__((aligned(64)));
	const float *xt = x + (size_t)t0 * K;
	for (int k0 = 0; k0 < K; k0 += QK) {
		int kn = K - k0 < QK ? K - k0 : QK, first = k0 == 0;
		q_deq_rows(wbuf, row, dt, k0, kn, t0 == 0 ? pf : 0, NR);
		int t = 0;
		for (; t + 4 <= nt; t += 4)
			qtile_n(abuf + (size_t)t * QR * 16, xt + (size_t)t * K, wbuf, K, k0, kn,
				first, 4, NR);
		float *ab = abuf + (size_t)t * QR * 16;
		const float *xr = xt + (size_t)t * K;
		switch (nt - t) {
		case 3: qtile_n(ab, xr, wbuf, K, k0, kn, first, 3, NR); break;
		case 2: qtile_n(ab, xr, wbuf, K, k0, kn, first, 2, NR); break;
		case 1: qtile_n(ab, xr, wbuf, K, k0, kn, first, 1, NR); break;
		}
	}
	for (int t = 0; t < nt; t++)
		for (int r = 0; r < NR; r++)
			y[(size_t)(t0 + t) * N + r0 + r * stride] =
				_mm512_reduce_add_ps(_mm512_loadu_ps(abuf + ((size_t)t * QR + r) * 16));
}

/* All tokens x rows [r0, r1) of a quantized matrix (dt constant per call).
 * K-quants always take the dequantize-then-tile route (batch 1 included):
 * rows dequantized a chunk at a time by kt_row_to_f32, then qtile_n. */
AVX512 INLINE void rows_q_avx512(float *y, const float *x, const uint8_t *w, enum kt_dtype dt,
				 int K, int N, int n_tok, int r0, int r1)
{
	if (n_tok == 1 && (dt == KT_Q8_0 || dt == KT_Q4_0)) {
		rows_q_1(y, x, w, dt, K, r0, r1);
		return;
	}
	const size_t rb = kt_row_bytes(dt, (size_t)K);
	/* QR streams of L consecutive rows each, then the rest one at a time */
	int L = (r1 - r0) / QR;
	for (int j = 0; j < L; j++) {
		const uint8_t *row[QR];
		for (int i = 0; i < QR; i++)
			row[i] = w + (size_t)(r0 + j + i * L) * rb;
		for (int t = 0; t < n_tok; t += QT)
			q_block_rows(y, x, row, dt, 2 * rb, K, N, t, n_tok - t < QT ? n_tok - t : QT,
				     r0 + j, L, QR);
	}
	for (int r = r0 + QR * L; r < r1; r++) {
		const uint8_t *row[1] = { w + (size_t)r * rb };
		for (int t = 0; t < n_tok; t += QT)
			q_block_rows(y, x, row, dt, rb, K, N, t, n_tok - t < QT ? n_tok - t : QT,
				     r, 1, 1);
	}
}

ROWS_FOR(rows_q8_0, rows_q_avx512, KT_Q8_0)
ROWS_FOR(rows_q4_0, rows_q_avx512, KT_Q4_0)
ROWS_FOR(rows_q4_k, rows_q_avx512, KT_Q4_K)
ROWS_FOR(rows_q5_k, rows_q_avx512, KT_Q5_K)
ROWS_FOR(rows_q6_k, rows_q_avx512, KT_Q6_K)

/* ---- AVX2 + FMA + F16C ---------------------------------------------------
 *
 * The same arithmetic with 8-lane registers (CPUs without AVX-512): the
 * 16-lane accumulator of an element is kept as two halves, lanes 0-7 and
 * 8-15 (lane j still takes input columns k + j, k = 0, 16, ...), and the
 * horizontal sum adds the halves (s = 8), the 128-bit halves of that (4),
 * then pairs (2) and the last two (1): rows_generic's tree, so the bits are
 * those of rows_generic and of the AVX-512 path. The tail (K % 16 columns)
 * runs on zero-padded copies and is blended so that the lanes past K keep
 * their value, as rows_generic leaves them.
 */
#define AVX2 __attribute__((target("avx2,fma,f16c")))

/* lanes 0-15 as two halves -> the fixed reduction tree */
AVX2 INLINE float a2_hsum(__m256 lo, __m256 hi)
{
	__m256 v = _mm256_add_ps(lo, hi);
	__m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	a = _mm_add_ps(a, _mm_movehl_ps(a, a));
	a = _mm_add_ss(a, _mm_movehdup_ps(a));
	return _mm_cvtss_f32(a);
}

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

#define ROWS_FOR2(name, impl, dt)                                                 \
	AVX2 static void name(float *y, const float *x, const void *w, int K, int N, \
			      int n_tok, int r0, int r1)                             \
	{                                                                       \
		impl(y, x, w, dt, K, N, n_tok, r0, r1);                           \
	}

ROWS_FOR2(rows2_f32, rows_avx2, KT_F32)
ROWS_FOR2(rows2_f16, rows_avx2, KT_F16)
ROWS_FOR2(rows2_bf16, rows_avx2, KT_BF16)

/* ---- AVX2: block-quantized weights dequantized to fp32 --------------------
 *
 * rows_generic_q's arithmetic in 8-lane halves: every weight is the exact
 * fp32 value kt_row_to_f32 gives (Q8_0 d * q, Q4_0 d * (q - 8): products
 * of the f16 scale and a small integer, exact), fused into lane j of the
 * element's 16-lane accumulator for weight j of each 16-weight half block;
 * then a2_hsum. Batch 1 (Q8_0, Q4_0) dequantizes in registers from
 * Q2_STREAMS streams of consecutive rows, as rows_q_1 does; batches and the
 * K-quants dequantize a row block a chunk at a time into a buffer (the
 * K-quants with kt_row_to_f32) and run token x row tiles over it.
 */
#define Q2_STREAMS 4    /* rows per batch-1 tile, one per stream */

/* The block's f16 scale, converted and broadcast. */
AVX2 INLINE __m256 a2_q_scale(const uint8_t *blk)
{
	short h;
	memcpy(&h, blk, 2);
	return _mm256_cvtph_ps(_mm_set1_epi16(h));
}

/* Weights 0-7, 8-15, 16-23, 24-31 of one Q8_0 / Q4_0 block; d its scale. */
AVX2 INLINE void a2_q_deq(const uint8_t *blk, enum kt_dtype dt, __m256 d, __m256 w[4])
{
	if (dt == KT_Q8_0) {
#pragma GCC unroll 4
		for (int i = 0; i < 4; i++)
			w[i] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
				_mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * i)))));
		return;
	}
	/* byte i: weight i in the low nibble, i + 16 in the high one */
	const __m256i m = _mm256_set1_epi32(15), o = _mm256_set1_epi32(8);
	__m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2)));
	__m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 10)));
	w[0] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(a, m), o)));
	w[1] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(b, m), o)));
	w[2] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(a, 4), o)));
	w[3] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(b, 4), o)));
}

/* Batch-1 tile: rows r0, r0 + stride, ..., of the one token; each row's
 * bytes pf further on are prefetched. */
AVX2 INLINE void a2_qtile_1(float *y, const float *x, const uint8_t *w, enum kt_dtype dt,
			    int K, int r0, int stride, size_t pf, const int NR)
{
	const size_t bb = q_block_bytes(dt), rb = (size_t)K / KT_QBLOCK * bb;
	const int nb = K / KT_QBLOCK;
	const uint8_t *row[Q2_STREAMS];
	__m256 lo[Q2_STREAMS], hi[Q2_STREAMS];
#pragma GCC unroll 4
	for (int r = 0; r < NR; r++) {
		row[r] = w + (size_t)(r0 + r * stride) * rb;
		lo[r] = hi[r] = _mm256_setzero_ps();
	}
	for (int b = 0; b < nb; b++) {
		size_t off = (size_t)b * bb;
		if (dt == KT_Q8_0 || b % 3 == 0) {
#pragma GCC unroll 4
			for (int r = 0; r < NR; r++)
				_mm_prefetch((const char *)row[r] + pf + off, _MM_HINT_T0);
		}
		const float *xb = x + (size_t)b * KT_QBLOCK;
#pragma GCC unroll 4
		for (int r = 0; r < NR; r++) {
			__m256 wv[4];
			a2_q_deq(row[r] + off, dt, a2_q_scale(row[r] + off), wv);
			lo[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xb), wv[0], lo[r]);
			hi[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 8), wv[1], hi[r]);
			lo[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 16), wv[2], lo[r]);
			hi[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 24), wv[3], hi[r]);
		}
	}
#pragma GCC unroll 4
	for (int r = 0; r < NR; r++)
		y[r0 + r * stride] = a2_hsum(lo[r], hi[r]);
}

/* Batch 1, rows [r0, r1): Q2_STREAMS streams of L consecutive rows, then
 * the rest one at a time. */
AVX2 INLINE void a2_rows_q_1(float *y, const float *x, const uint8_t *w, enum kt_dtype dt,
			     int K, int r0, int r1)
{
	const size_t rb = (size_t)K / KT_QBLOCK * q_block_bytes(dt);
	const int L = (r1 - r0) / Q2_STREAMS;
	for (int j = 0; j < L; j++)
		a2_qtile_1(y, x, w, dt, K, r0 + j, L, 2 * rb, Q2_STREAMS);
	for (int r = r0 + Q2_STREAMS * L; r < r1; r++)
		a2_qtile_1(y, x, w, dt, K, r, 1, rb, 1);
}

/* Dequantize NR rows (row[]) over columns [k0, k0+kn) into wbuf[r][0..kn);
 * as q_deq_rows. */
AVX2 INLINE void a2_q_deq_rows(float *wbuf, const uint8_t *const *row, enum kt_dtype dt,
			       int k0, int kn, size_t pf, const int NR)
{
	if (dt == KT_Q4_K || dt == KT_Q5_K || dt == KT_Q6_K) {
		const size_t bb = kt_row_bytes(dt, KT_QK_K);
		for (int r = 0; r < NR; r++) {
			const uint8_t *p = row[r] + (size_t)(k0 / KT_QK_K) * bb;
			if (pf)
				for (size_t o = 0; o < (size_t)(kn / KT_QK_K) * bb; o += 64)
					_mm_prefetch((const char *)p + pf + o, _MM_HINT_T0);
			kt_row_to_f32(dt, p, wbuf + (size_t)r * QK, (size_t)kn);
		}
		return;
	}
	const size_t bb = q_block_bytes(dt);
	int b0 = k0 / KT_QBLOCK, nb = kn / KT_QBLOCK;
	for (int r = 0; r < NR; r++)
		for (int b = 0; b < nb; b++) {
			const uint8_t *blk = row[r] + (size_t)(b0 + b) * bb;
			if (pf)
				_mm_prefetch((const char *)blk + pf, _MM_HINT_T0);
			__m256 wv[4];
			a2_q_deq(blk, dt, a2_q_scale(blk), wv);
			float *o = wbuf + (size_t)r * QK + b * KT_QBLOCK;
#pragma GCC unroll 4
			for (int i = 0; i < 4; i++)
				_mm256_storeu_ps(o + 8 * i, wv[i]);
		}
}

/* NT tokens x NR rows (row offsets rw[] into wbuf) over one chunk: the
 * halves (abuf[t][r], 16 floats) += x[t][k0..k0+kn) * wbuf rows; first:
 * start from zero. */
AVX2 INLINE void a2_qtile_n(float *abuf, const float *x, const float *wbuf, int K, int k0,
			    int kn, int first, int rb0, const int NT, const int NR)
{
	__m256 lo[3][2], hi[3][2];
#pragma GCC unroll 3
	for (int t = 0; t < NT; t++)
#pragma GCC unroll 2
		for (int r = 0; r < NR; r++) {
			const float *a = abuf + ((size_t)t * QR + rb0 + r) * 16;
			lo[t][r] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(a);
			hi[t][r] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(a + 8);
		}
	for (int k = 0; k < kn; k += 16) {
#pragma GCC unroll 2
		for (int r = 0; r < NR; r++) {
			const float *wr = wbuf + (size_t)(rb0 + r) * QK + k;
			__m256 wl = _mm256_loadu_ps(wr), wh = _mm256_loadu_ps(wr + 8);
#pragma GCC unroll 3
			for (int t = 0; t < NT; t++) {
				const float *xp = x + (size_t)t * K + k0 + k;
				lo[t][r] = _mm256_fmadd_ps(_mm256_loadu_ps(xp), wl, lo[t][r]);
				hi[t][r] = _mm256_fmadd_ps(_mm256_loadu_ps(xp + 8), wh, hi[t][r]);
			}
		}
	}
#pragma GCC unroll 3
	for (int t = 0; t < NT; t++)
#pragma GCC unroll 2
		for (int r = 0; r < NR; r++) {
			float *a = abuf + ((size_t)t * QR + rb0 + r) * 16;
			_mm256_storeu_ps(a, lo[t][r]);
			_mm256_storeu_ps(a + 8, hi[t][r]);
		}
}

/* Tokens [t0, t0+nt) (nt <= QT) x the NR rows of one row block (row[];
 * output rows r0, r0 + stride, ...), all chunks; pf as a2_q_deq_rows. */
AVX2 INLINE void a2_q_block_rows(float *y, const float *x, const uint8_t *const *row,
				 enum kt_dtype dt, size_t pf, int K, int N, int t0, int nt,
				 int r0, int stride, const int NR)
{
	float wbuf[QR * QK] __attribute__((aligned(32)));
	float abuf[QT * QR * 16] __attribute__((aligned(32)));
	const float *xt = x + (size_t)t0 * K;
	for (int k0 = 0; k0 < K; k0 += QK) {
		int kn = K - k0 < QK ? K - k0 : QK, first = k0 == 0;
		a2_q_deq_rows(wbuf, row, dt, k0, kn, t0 == 0 ? pf : 0, NR);
		for (int rp = 0; rp < NR; rp += 2) {
			int t = 0;
			for (; t + 3 <= nt; t += 3) {
				float *ab = abuf + (size_t)t * QR * 16;
				const float *xr = xt + (size_t)t * K;
				if (NR - rp >= 2)
					a2_qtile_n(ab, xr, wbuf, K, k0, kn, first, rp, 3, 2);
				else
					a2_qtile_n(ab, xr, wbuf, K, k0, kn, first, rp, 3, 1);
			}
			float *ab = abuf + (size_t)t * QR * 16;
			const float *xr = xt + (size_t)t * K;
			switch ((nt - t) * 2 + (NR - rp >= 2 ? 2 : 1)) {
			case 6: a2_qtile_n(ab, xr, wbuf, K, k0, kn, first, rp, 2, 2); break;
			case 5: a2_qtile_n(ab, xr, wbuf, K, k0, kn, first, rp, 2, 1); break;
			case 4: a2_qtile_n(ab, xr, wbuf, K, k0, kn, first, rp, 1, 2); break;
			case 3: a2_qtile_n(ab, xr, wbuf, K, k0, kn, first, rp, 1, 1); break;
			}
		}
	}
	for (int t = 0; t < nt; t++)
		for (int r = 0; r < NR; r++) {
			const float *a = abuf + ((size_t)t * QR + r) * 16;
			y[(size_t)(t0 + t) * N + r0 + r * stride] =
				a2_hsum(_mm256_loadu_ps(a), _mm256_loadu_ps(a + 8));
		}
}

/* All tokens x rows [r0, r1) of a quantized matrix (dt constant per call),
 * as rows_q_avx512. */
AVX2 INLINE void rows_q_avx2(float *y, const float *x, const uint8_t *w, enum kt_dtype dt,
			     int K, int N, int n_tok, int r0, int r1)
{
	if (n_tok == 1 && (dt == KT_Q8_0 || dt == KT_Q4_0)) {
		a2_rows_q_1(y, x, w, dt, K, r0, r1);
		return;
	}
	const size_t rb = kt_row_bytes(dt, (size_t)K);
	int L = (r1 - r0) / QR;
	for (int j = 0; j < L; j++) {
		const uint8_t *row[QR];
		for (int i = 0; i < QR; i++)
			row[i] = w + (size_t)(r0 + j + i * L) * rb;
		for (int t = 0; t < n_tok; t += QT)
			a2_q_block_rows(y, x, row, dt, 2 * rb, K, N, t,
					n_tok - t < QT ? n_tok - t : QT, r0 + j, L, QR);
	}
	for (int r = r0 + QR * L; r < r1; r++) {
		const uint8_t *row[1] = { w + (size_t)r * rb };
		for (int t = 0; t < n_tok; t += QT)
			a2_q_block_rows(y, x, row, dt, rb, K, N, t,
					n_tok - t < QT ? n_tok - t : QT, r, 1, 1);
	}
}

ROWS_FOR2(rows2_q8_0, rows_q_avx2, KT_Q8_0)
ROWS_FOR2(rows2_q4_0, rows_q_avx2, KT_Q4_0)
ROWS_FOR2(rows2_q4_k, rows_q_avx2, KT_Q4_K)
ROWS_FOR2(rows2_q5_k, rows_q_avx2, KT_Q5_K)
ROWS_FOR2(rows2_q6_k, rows_q_avx2, KT_Q6_K)
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
	case KT_Q6_K: break;     /* rows_generic_q */
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

/* Portable path for the quantized dtypes: each block (32 weights, 256 for
 * the K-quants) dequantized with kt_row_to_f32 (the same fp32 values), then
 * the 16-lane FMA order and reduction tree of rows_generic. */
static void rows_generic_q(float *y, const float *x, const struct kt_weight *w,
			   int n_tok, int r0, int r1)
{
	int K = w->cols, N = w->rows, bw = (int)kt_block_weights(w->dtype);
	size_t rb = kt_row_bytes(w->dtype, (size_t)K), bb = kt_row_bytes(w->dtype, (size_t)bw);
	for (int r = r0; r < r1; r++) {
		const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
		for (int t = 0; t < n_tok; t++) {
			const float *xr = x + (size_t)t * K;
			float acc[16] = { 0 };
			for (int b = 0; b < K / bw; b++) {
				float wq[KT_QK_K];
				kt_row_to_f32(w->dtype, row + (size_t)b * bb, wq, (size_t)bw);
				for (int h = 0; h < bw; h += 16)
					for (int j = 0; j < 16; j++)
						acc[j] = fmaf(xr[b * bw + h + j], wq[h + j], acc[j]);
			}
			for (int s = 8; s >= 1; s /= 2)
				for (int j = 0; j < s; j++)
					acc[j] += acc[j + s];
			y[(size_t)t * N + r] = acc[0];
		}
	}
}

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
 * are zeros. Then the fixed horizontal sum. rows_generic_bf16 does that in
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
#define BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c,avx512bf16")))

BF16 static void bf16_round_avx512(uint16_t *o, const float *x, size_t n)
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
BF16 static void rows_bf16_avx512(float *y, const uint16_t *xb, const uint16_t *w, int K, int N,
				  int n_tok, int r0, int r1)
{
	int r = r0;
#define TILE_B(t, q, nt, nr) btile(y, xb, w, K, N, t, q, nt, nr)
	ROWS_TILED(r, r1, n_tok, K, 2, TILE_B);
#undef TILE_B
}
#endif /* __x86_64__ */

/* Portable: the same operations in C (see the section's comment). */
static void rows_generic_bf16(float *y, const uint16_t *xb, const uint16_t *w, int K, int N,
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

void cpu_bf16_round(int isa, uint16_t *xb, const float *x, size_t n)
{
#if defined(__x86_64__)
	if (isa == CPU_ISA_AVX512) {
		bf16_round_avx512(xb, x, n);
		return;
	}
#else
	(void)isa;
#endif
	for (size_t i = 0; i < n; i++)
		xb[i] = bf16_round1(x[i]);
}

void cpu_matmul_rows_bf16(int isa, float *y, const uint16_t *xb, const struct kt_weight *w,
			  int n_tok, int r0, int r1)
{
#if defined(__x86_64__)
	if (isa == CPU_ISA_AVX512) {
		rows_bf16_avx512(y, xb, w->data, w->cols, w->rows, n_tok, r0, r1);
		return;
	}
#else
	(void)isa;
#endif
	rows_generic_bf16(y, xb, w->data, w->cols, w->rows, n_tok, r0, r1);
}

void cpu_matmul_rows(int isa, float *y, const float *x,
		     const struct kt_weight *w, int n_tok, int r0, int r1)
{
#if defined(__x86_64__)
	if (isa == CPU_ISA_AVX2) {
		switch (w->dtype) {
		case KT_F32: rows2_f32(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		case KT_F16: rows2_f16(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		case KT_BF16: rows2_bf16(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		case KT_Q8_0: rows2_q8_0(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		case KT_Q4_0: rows2_q4_0(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		case KT_Q4_K: rows2_q4_k(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		case KT_Q5_K: rows2_q5_k(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		case KT_Q6_K: rows2_q6_k(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		}
	}
	if (isa == CPU_ISA_AVX512) {
		switch (w->dtype) {
		case KT_F32: rows_f32(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		case KT_F16: rows_f16(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		case KT_BF16: rows_bf16(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		case KT_Q8_0: rows_q8_0(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		case KT_Q4_0: rows_q4_0(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		case KT_Q4_K: rows_q4_k(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		case KT_Q5_K: rows_q5_k(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		case KT_Q6_K: rows_q6_k(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		}
	}
#else
	(void)isa;
#endif
	if (kt_dtype_is_quant(w->dtype))
		rows_generic_q(y, x, w, n_tok, r0, r1);
	else
		rows_generic(y, x, w, n_tok, r0, r1);
}

struct mm_job {
	float *y;
	const float *x;
	const uint16_t *xb;     /* bf16 dot products: x rounded (cpu_bf16_round) */
	const struct kt_weight *w;
	int n_tok;
	int isa;
};

int cpu_mm_isa(const struct cpu_backend *cb)
{
	return cb->have_avx512 ? CPU_ISA_AVX512 : cb->have_avx2 ? CPU_ISA_AVX2 : CPU_ISA_PORTABLE;
}

/* Thread ith of nth's share [*a, *b) of [0, n), in chunks that are
 * multiples of align (empty when none is left for it). */
static void share(int n, int ith, int nth, int align, int *a, int *b)
{
	int per = ((n + nth - 1) / nth + align - 1) / align * align;
	*a = ith * per;
	*b = *a + per < n ? *a + per : n;
}

static void mm_worker(void *ctx, int ith, int nth)
{
	struct mm_job *j = ctx;
	int r0, r1;
	share(j->w->rows, ith, nth, 8, &r0, &r1);
	if (r0 < r1 && j->xb)
		cpu_matmul_rows_bf16(j->isa, j->y, j->xb, j->w, j->n_tok, r0, r1);
	else if (r0 < r1)
		cpu_matmul_rows(j->isa, j->y, j->x, j->w, j->n_tok, r0, r1);
}

/* *buf with room for need bytes (64-byte aligned, contents not kept;
 * *have: its bytes): 0 or -ENOMEM. */
static int reserve(void *buf, size_t *have, size_t need)
{
	if (need <= *have)
		return 0;
	void *p;
	if (posix_memalign(&p, 64, need))
		return -ENOMEM;
	free(*(void **)buf);
	*(void **)buf = p;
	*have = need;
	return 0;
}

int cpu_qx_reserve(struct cpu_backend *cb, int n_tok, int cols)
{
	return reserve(&cb->qx, &cb->qx_len,
		       (size_t)(n_tok > 0 ? n_tok : 1) * cpu_qx_row_bytes(cols));
}

/* Packed weights: activations quantized (tokens split over the threads),
 * then row groups split over them. */
struct qmm_job {
	float *y;
	const float *x;
	const struct kt_weight *w;
	uint8_t *qx;
	int n_tok, isa;
	int chunk;              /* groups a worker takes at a time */
	_Atomic int next;       /* first group not yet taken */
};

int cpu_q_isa(const struct cpu_backend *cb)
{
	return cb->have_vnni ? CPU_ISA_AVX512 : cb->have_avx2 ? CPU_ISA_AVX2 : CPU_ISA_PORTABLE;
}

static void qx_worker(void *ctx, int ith, int nth)
{
	struct qmm_job *j = ctx;
	int t0, t1;
	share(j->n_tok, ith, nth, 1, &t0, &t1);
	if (t0 < t1)
		cpu_qx_quantize(j->isa, j->qx, j->x, j->w->cols, t0, t1);
}

/* Workers take chunks of groups in ascending order until none is left, so
 * a worker the system holds up (another process on its core) delays the
 * matmul by at most a chunk instead of by its whole half; each worker
 * still reads ascending addresses. A group's results do not depend on who
 * computes it. */
static void qmm_worker(void *ctx, int ith, int nth)
{
	(void)ith;
	(void)nth;
	struct qmm_job *j = ctx;
	int ng = cpu_qpack_groups(j->w->pack);
	for (;;) {
		int g0 = atomic_fetch_add_explicit(&j->next, j->chunk, memory_order_relaxed);
		if (g0 >= ng)
			return;
		int g1 = g0 + j->chunk < ng ? g0 + j->chunk : ng;
		cpu_qpack_rows(j->isa, j->y, j->qx, j->w->pack, j->n_tok, g0, g1);
	}
}

/* bf16 dot products: the activations rounded into j->xb, tokens split
 * over the threads (mm_worker then takes the rows). */
static void xb_worker(void *ctx, int ith, int nth)
{
	struct mm_job *j = ctx;
	int t0, t1;
	share(j->n_tok, ith, nth, 1, &t0, &t1);
	size_t K = (size_t)j->w->cols;
	if (t0 < t1)
		cpu_bf16_round(j->isa, (uint16_t *)j->xb + t0 * K, j->x + t0 * K,
			       (size_t)(t1 - t0) * K);
}

int cpu_xb_reserve(struct cpu_backend *cb, size_t n)
{
	return reserve(&cb->xb, &cb->xb_len, n * sizeof(uint16_t));
}

void cpu_matmul(struct backend *be, float *y, const float *x,
		const struct kt_weight *w, int n_tok)
{
	struct cpu_backend *cb = (struct cpu_backend *)be;
	size_t wbytes = (size_t)w->rows * kt_row_bytes(w->dtype, (size_t)w->cols);
	struct mm_job j = { y, x, NULL, w, n_tok, cpu_mm_isa(cb) };
	/* bf16 dot products (room reserved up front by cpu_reserve; without
	 * it, the fp32 path, as packed quantized weights fall back): the
	 * activations rounded, then the rows as below. The isa picks the
	 * kernels of both: VDPBF16PS with AVX-512, else the portable loop */
	if (w->dtype == KT_BF16 && cb->bf16_dot && cpu_xb_reserve(cb, (size_t)n_tok * w->cols) == 0) {
		j.xb = cb->xb;
		int nth = tpool_size(cb->pool);
		tpool_run(cb->pool, xb_worker, &j, n_tok < 4 * nth ? 1 : nth);
	} else if (w->pack && cpu_qx_reserve(cb, n_tok, w->cols) == 0) {
		int nth = tpool_size(cb->pool), ng = cpu_qpack_groups(w->pack);
		/* about 8 chunks a worker, whole tiles of 4 groups */
		int chunk = ((ng + 8 * nth - 1) / (8 * nth) + 3) & ~3;
		struct qmm_job q = { y, x, w, cb->qx, n_tok, cpu_q_isa(cb), chunk, 0 };
		tpool_run(cb->pool, qx_worker, &q, n_tok < 4 * nth ? 1 : nth);
		tpool_run(cb->pool, qmm_worker, &q, wbytes < (256u << 10) ? 1 : nth);
		return;
	}
	/* rows over the threads: fp32 activations (not packed, or no memory
	 * for the 8-bit ones: the exact path), or the bf16 ones above */
	size_t work = wbytes + (size_t)n_tok * w->rows * w->cols / 4;
	/* below ~256 KiB of weights a second thread costs more than it gives */
	int nth = work < (256u << 10) ? 1 : tpool_size(cb->pool);
	tpool_run(cb->pool, mm_worker, &j, nth);
}

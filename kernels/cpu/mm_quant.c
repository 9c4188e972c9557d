/*
 * kernels/cpu/mm_quant.c — y = x W^T for block-quantized weights (Q8_0,
 * Q4_0, Q4_K, Q5_K, Q6_K) dequantized to fp32 inside the products (the
 * exact path: fp32 activations): AVX-512, its AVX2 twin and the portable
 * loop, bit-identical, batch-invariant as mm_float.c. The packed 8-bit
 * path (qdot.c) serves these weights where it applies.
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/mm_int.h"

#if defined(__x86_64__)
/* ---- block-quantized weights (Q8_0, Q4_0) ------------------------------
 *
 * The arithmetic of every output element: for each 32-weight block of its
 * row, in order, the two 16-weight halves (weights 0-15, then 16-31) are
 * dequantized to fp32 (w = d * q for Q8_0, w = d * (q - 8) for Q4_0, the
 * f16 scale times a small integer: an fp32 product, exact in fact) and
 * fused into the same 16-lane accumulator, lane j taking weight j of the
 * half; then the fixed horizontal sum. That is the f32 loop above run on the
 * dequantized row, so the portable path (cpu_generic_rows_q) matches it bit for
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
 * portable path uses; Q8_0 / Q4_0 blocks through the isa's DEQ_STORE (one
 * block's 32 weights to o). One source for every isa (ATTR its target). */
#define Q_DEQ_ROWS(ATTR, NAME, DEQ_STORE)                                                  \
	ATTR INLINE void NAME(float *wbuf, const uint8_t *const *row, enum kt_dtype dt,    \
			      int k0, int kn, size_t pf, const int NR)                     \
	{                                                                                  \
		if (dt == KT_Q4_K || dt == KT_Q5_K || dt == KT_Q6_K) {                     \
			const size_t bb = kt_row_bytes(dt, KT_QK_K);                       \
			for (int r = 0; r < NR; r++) {                                     \
				const uint8_t *p = row[r] + (size_t)(k0 / KT_QK_K) * bb;   \
				if (pf)                                                    \
					for (size_t o = 0; o < (size_t)(kn / KT_QK_K) * bb;   \
					     o += 64)                                          \
						_mm_prefetch((const char *)p + pf + o,         \
							     _MM_HINT_T0);                     \
				kt_row_to_f32(dt, p, wbuf + (size_t)r * QK, (size_t)kn);   \
			}                                                                  \
			return;                                                            \
		}                                                                          \
		const size_t bb = q_block_bytes(dt);                                       \
		int b0 = k0 / KT_QBLOCK, nb = kn / KT_QBLOCK;                              \
		for (int r = 0; r < NR; r++)                                               \
			for (int b = 0; b < nb; b++) {                                     \
				const uint8_t *blk = row[r] + (size_t)(b0 + b) * bb;       \
				if (pf)                                                    \
					_mm_prefetch((const char *)blk + pf, _MM_HINT_T0); \
				DEQ_STORE(blk, dt, wbuf + (size_t)r * QK + b * KT_QBLOCK); \
			}                                                                  \
	}

/* One Q8_0 / Q4_0 block's 32 weights, dequantized, to o. */
#define Q_DEQ_STORE(blk, dt, o)                                 \
	do {                                                    \
		__m512 w0, w1;                                  \
		q_deq(blk, dt, q_scale(blk), &w0, &w1);         \
		_mm512_storeu_ps(o, w0);                        \
		_mm512_storeu_ps(o + 16, w1);                   \
	} while (0)

Q_DEQ_ROWS(AVX512, q_deq_rows, Q_DEQ_STORE)

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

/*
 * Tokens [t0, t0+nt) (nt <= QT) x the NR rows of one row block (row[];
 * output rows r0, r0 + stride, ...), all chunks; pf as DEQ_ROWS's. One
 * source for every isa (ATTR its target, ALIGN its vectors' bytes): per
 * chunk the rows dequantized by DEQ_ROWS into wbuf, then the isa's
 * CHUNK_TILES (its register tiles over the chunk, the tokens' 16-lane
 * accumulators kept in abuf); last each accumulator summed by SUM16.
 */
#define Q_BLOCK_ROWS(ATTR, NAME, ALIGN, DEQ_ROWS, CHUNK_TILES, SUM16)                      \
	ATTR INLINE void NAME(float *y, const float *x, const uint8_t *const *row,          \
			      enum kt_dtype dt, size_t pf, int K, int N, int t0, int nt,    \
			      int r0, int stride, const int NR)                             \
	{                                                                                   \
		float wbuf[QR * QK] __attribute__((aligned(ALIGN)));                        \
		float abuf[QT * QR * 16] __attribute__((aligned(ALIGN)));                   \
		const float *xt = x + (size_t)t0 * K;                                       \
		for (int k0 = 0; k0 < K; k0 += QK) {                                        \
			int kn = K - k0 < QK ? K - k0 : QK, first = k0 == 0;                \
			DEQ_ROWS(wbuf, row, dt, k0, kn, t0 == 0 ? pf : 0, NR);              \
			CHUNK_TILES();                                                      \
		}                                                                           \
		for (int t = 0; t < nt; t++)                                                \
			for (int r = 0; r < NR; r++)                                        \
				y[(size_t)(t0 + t) * N + r0 + r * stride] =                 \
					SUM16(abuf + ((size_t)t * QR + r) * 16);            \
	}

/* AVX-512: tiles of 4 tokens x the block's rows, then the token tail. */
#define Q512_CHUNK_TILES()                                                                  \
	do {                                                                                \
		int t = 0;                                                                  \
		for (; t + 4 <= nt; t += 4)                                                 \
			qtile_n(abuf + (size_t)t * QR * 16, xt + (size_t)t * K, wbuf, K,    \
				k0, kn, first, 4, NR);                                      \
		float *ab = abuf + (size_t)t * QR * 16;                                     \
		const float *xr = xt + (size_t)t * K;                                       \
		switch (nt - t) {                                                           \
		case 3: qtile_n(ab, xr, wbuf, K, k0, kn, first, 3, NR); break;              \
		case 2: qtile_n(ab, xr, wbuf, K, k0, kn, first, 2, NR); break;              \
		case 1: qtile_n(ab, xr, wbuf, K, k0, kn, first, 1, NR); break;              \
		}                                                                           \
	} while (0)
#define Q512_SUM16(a) _mm512_reduce_add_ps(_mm512_loadu_ps(a))

Q_BLOCK_ROWS(AVX512, q_block_rows, 64, q_deq_rows, Q512_CHUNK_TILES, Q512_SUM16)

/*
 * All tokens x rows [r0, r1) of a quantized matrix (dt constant per call):
 * batch 1 of Q8_0 / Q4_0 through the isa's ROWS_1 (dequantized in
 * registers); batches and the K-quants (batch 1 included) through its
 * BLOCK_ROWS, QR streams of L consecutive rows each, then the rest one at
 * a time. One source for every isa (ATTR its target).
 */
#define ROWS_Q(ATTR, NAME, ROWS_1, BLOCK_ROWS)                                             \
	ATTR INLINE void NAME(float *y, const float *x, const uint8_t *w, enum kt_dtype dt, \
			      int K, int N, int n_tok, int r0, int r1)                      \
	{                                                                                   \
		if (n_tok == 1 && (dt == KT_Q8_0 || dt == KT_Q4_0)) {                       \
			ROWS_1(y, x, w, dt, K, r0, r1);                                     \
			return;                                                             \
		}                                                                           \
		const size_t rb = kt_row_bytes(dt, (size_t)K);                              \
		int L = (r1 - r0) / QR;                                                     \
		for (int j = 0; j < L; j++) {                                               \
			const uint8_t *row[QR];                                             \
			for (int i = 0; i < QR; i++)                                        \
				row[i] = w + (size_t)(r0 + j + i * L) * rb;                 \
			for (int t = 0; t < n_tok; t += QT)                                 \
				BLOCK_ROWS(y, x, row, dt, 2 * rb, K, N, t,                  \
					   n_tok - t < QT ? n_tok - t : QT, r0 + j, L, QR); \
		}                                                                           \
		for (int r = r0 + QR * L; r < r1; r++) {                                    \
			const uint8_t *row[1] = { w + (size_t)r * rb };                     \
			for (int t = 0; t < n_tok; t += QT)                                 \
				BLOCK_ROWS(y, x, row, dt, rb, K, N, t,                      \
					   n_tok - t < QT ? n_tok - t : QT, r, 1, 1);       \
		}                                                                           \
	}

ROWS_Q(AVX512, rows_q_avx512, rows_q_1, q_block_rows)

/* The entry points of every quantized dtype (mm_int.h), FOR being an isa's
 * ROWS_FOR, P its name prefix. */
#define ROWS_FOR_QUANT(FOR, P, IMPL)   \
	FOR(P##q8_0, IMPL, KT_Q8_0)    \
	FOR(P##q4_0, IMPL, KT_Q4_0)    \
	FOR(P##q4_k, IMPL, KT_Q4_K)    \
	FOR(P##q5_k, IMPL, KT_Q5_K)    \
	FOR(P##q6_k, IMPL, KT_Q6_K)

ROWS_FOR_QUANT(ROWS_FOR, cpu_avx512_, rows_q_avx512)

/* ---- AVX2: block-quantized weights dequantized to fp32 --------------------
 *
 * cpu_generic_rows_q's arithmetic in 8-lane halves: every weight is the exact
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

/* One Q8_0 / Q4_0 block's 32 weights, dequantized, to o. */
#define A2_Q_DEQ_STORE(blk, dt, o)                              \
	do {                                                    \
		__m256 wv[4];                                   \
		a2_q_deq(blk, dt, a2_q_scale(blk), wv);         \
		float *o_ = (o);                                \
		_Pragma("GCC unroll 4")                         \
		for (int i = 0; i < 4; i++)                     \
			_mm256_storeu_ps(o_ + 8 * i, wv[i]);    \
	} while (0)

Q_DEQ_ROWS(AVX2, a2_q_deq_rows, A2_Q_DEQ_STORE)

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

/* AVX2: tiles of 3 tokens x 2 rows (12 of the 16 registers), then the
 * tails. */
#define A2_CHUNK_TILES()                                                                    \
	for (int rp = 0; rp < NR; rp += 2) {                                                \
		int t = 0;                                                                  \
		for (; t + 3 <= nt; t += 3) {                                               \
			float *ab = abuf + (size_t)t * QR * 16;                             \
			const float *xr = xt + (size_t)t * K;                               \
			if (NR - rp >= 2)                                                   \
				a2_qtile_n(ab, xr, wbuf, K, k0, kn, first, rp, 3, 2);       \
			else                                                                \
				a2_qtile_n(ab, xr, wbuf, K, k0, kn, first, rp, 3, 1);       \
		}                                                                           \
		float *ab = abuf + (size_t)t * QR * 16;                                     \
		const float *xr = xt + (size_t)t * K;                                       \
		switch ((nt - t) * 2 + (NR - rp >= 2 ? 2 : 1)) {                            \
		case 6: a2_qtile_n(ab, xr, wbuf, K, k0, kn, first, rp, 2, 2); break;        \
		case 5: a2_qtile_n(ab, xr, wbuf, K, k0, kn, first, rp, 2, 1); break;        \
		case 4: a2_qtile_n(ab, xr, wbuf, K, k0, kn, first, rp, 1, 2); break;        \
		case 3: a2_qtile_n(ab, xr, wbuf, K, k0, kn, first, rp, 1, 1); break;        \
		}                                                                           \
	}
#define A2_SUM16(a) a2_hsum(_mm256_loadu_ps(a), _mm256_loadu_ps((a) + 8))

Q_BLOCK_ROWS(AVX2, a2_q_block_rows, 32, a2_q_deq_rows, A2_CHUNK_TILES, A2_SUM16)

ROWS_Q(AVX2, rows_q_avx2, a2_rows_q_1, a2_q_block_rows)

ROWS_FOR_QUANT(ROWS_FOR2, cpu_avx2_, rows_q_avx2)
#endif /* __x86_64__ */

/* Portable path for the quantized dtypes: each block (32 weights, 256 for
 * the K-quants) dequantized with kt_row_to_f32 (the same fp32 values), then
 * the 16-lane FMA order and reduction tree of cpu_generic_rows. */
void cpu_generic_rows_q(float *y, const float *x, const struct kt_weight *w,
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

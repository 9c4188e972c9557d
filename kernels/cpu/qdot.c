/*
 * kernels/cpu/qdot.c — quantized matmul with 8-bit activations and integer
 * dot products (AVX512-VNNI, AVX2, portable), over a row-interleaved copy
 * of the weights.
 *
 * Why: dequantizing 4-bit weights to fp32 inside the dot product costs
 * about 7 vector operations per 32 weights, so on two cores Q4_0 decode was
 * compute-bound at ~73 % of the memory roof and K-quants far below. Here the
 * weights stay small integers and one VPDPBUSD multiplies 64 of them by 64
 * 8-bit activations and sums them in fours, 16 rows at a time.
 *
 * Layout: qpack.h (struct cpu_qpack, built by qpack.c).
 *
 * Activations (cpu_qx_quantize): per token, per block of 32, dx = max|x| /
 * 127, xq = round-to-nearest-even(x * (1/dx)) as int8, and the sums sl, sh
 * of xq over its halves 0-15 and 16-31.
 *
 * Arithmetic of output (row, token): acc = 0; for each sub-block b in order,
 * with the exact integer sums il = sum u*xq over codes 0-15, ih over 16-31:
 *   Q8_0, Q4_0: acc = fma(float(il + ih - o*(sl+sh)), d*dx, acc), o = 128, 8
 *   Q4_K, Q5_K: acc = fma(float(il + ih), (d*sc)*dx, acc);
 *               acc = fma(float(-(sl+sh)), (dmin*m)*dx, acc)
 *   Q6_K:       acc = fma(float(il - 32*sl), (d*sca)*dx, acc);
 *               acc = fma(float(ih - 32*sh), (d*scb)*dx, acc)
 * The same fp32 operations in the same order in the portable code and the
 * vector code, for any batch or split: bit-identical, batch-invariant. The
 * result differs from the dequantized-f32 product by the activation
 * rounding (relative error ~1e-3 on a dot product; tests/unit/test_quant.c).
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/qpack.h"

/* ---- activations --------------------------------------------------------
 * Row of one token: int8 xq[cols], then per block float dx, int32 sl, sh. */

size_t cpu_qx_row_bytes(int cols)
{
	return ((size_t)cols + (size_t)(cols / QB) * 12 + 63) & ~(size_t)63;
}

void cpu_generic_qx_block(const float *x, int8_t *q, float *d, int32_t *sl, int32_t *sh)
{
	float amax = 0;
	for (int j = 0; j < QB; j++)
		amax = fmaxf(amax, fabsf(x[j]));
	float dx = amax / 127.0f, id = dx != 0 ? 1.0f / dx : 0.0f;
	int s[2] = { 0, 0 };
	for (int j = 0; j < QB; j++) {
		float v = nearbyintf(x[j] * id);
		int qi = !(v > -128.0f) ? -128 : v > 127.0f ? 127 : (int)v;
		q[j] = (int8_t)qi;
		s[j / 16] += qi;
	}
	*d = dx;
	*sl = s[0];
	*sh = s[1];
}

#if defined(__x86_64__)
#include <immintrin.h>
#define INLINE static inline __attribute__((always_inline))

VNNI void cpu_avx512_qx_block(const float *x, int8_t *q, float *d, int32_t *sl, int32_t *sh)
{
	__m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
	float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
	float dx = amax / 127.0f, id = dx != 0 ? 1.0f / dx : 0.0f;
	__m512 vid = _mm512_set1_ps(id);
	/* cvtps rounds to nearest even (the default MXCSR mode), as nearbyintf;
	 * NaN gives INT_MIN, saturated to -128 as the portable code does */
	__m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, vid));
	__m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, vid));
	qa = _mm512_max_epi32(_mm512_min_epi32(qa, _mm512_set1_epi32(127)), _mm512_set1_epi32(-128));
	qb = _mm512_max_epi32(_mm512_min_epi32(qb, _mm512_set1_epi32(127)), _mm512_set1_epi32(-128));
	_mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(qa));
	_mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtepi32_epi8(qb));
	*d = dx;
	*sl = _mm512_reduce_add_epi32(qa);
	*sh = _mm512_reduce_add_epi32(qb);
}
#endif

/* ---- portable kernel ---------------------------------------------------- */

static int code_at(const struct cpu_qpack *p, const uint8_t *ur, int lane, int k)
{
	int c = (k & 15) / 4, i = k & 3, hi = k >= 16;
	if (p->dt == KT_Q8_0)
		return ur[64 * (k / 4) + 4 * lane + i];
	int v = (ur[64 * c + 4 * lane + i] >> (hi ? 4 : 0)) & 15;
	if (p->dt == KT_Q5_K) {
		uint64_t m;
		memcpy(&m, ur + 256 + 8 * (k / 4), 8);
		v |= (int)((m >> (4 * lane + i)) & 1) << 4;
	}
	if (p->dt == KT_Q6_K)
		v |= ((ur[256 + 64 * hi + 4 * lane + i] >> (2 * c)) & 3) << 4;
	return v;
}

void cpu_generic_qrows(float *y, const uint8_t *qx, const struct cpu_qpack *p,
			 int n_tok, int g0, int g1)
{
	for (int g = g0; g < g1; g++) {
		const uint8_t *gp = p->data + (size_t)g * p->group_bytes;
		for (int lane = 0; lane < QG && g * QG + lane < p->rows; lane++) {
			for (int t = 0; t < n_tok; t++) {
				struct qx_row x = qx_row(qx, p->cols, t);
				float acc = 0;
				for (int b = 0; b < p->nb; b++) {
					const uint8_t *ur = gp + (size_t)b * p->ub;
					const uint8_t *s = gp + p->s_off + (size_t)b * 32;
					const uint8_t *h = gp + p->h_off + (size_t)(b / 8) * h_bytes(p->dt);
					int32_t il = 0, ih = 0, sl = x.sl[b], sh = x.sh[b];
					for (int k = 0; k < QB; k++) {
						int32_t v = code_at(p, ur, lane, k) * x.q[b * QB + k];
						if (k < 16)
							il += v;
						else
							ih += v;
					}
					float dx = x.d[b];
					switch (p->dt) {
					case KT_Q8_0:
					case KT_Q4_0: {
						int32_t o = p->dt == KT_Q8_0 ? 128 : 8;
						float sc = kt_f16_to_f32(ld16(s + 2 * lane)) * dx;
						acc = fmaf((float)(il + ih - o * (sl + sh)), sc, acc);
						break;
					}
					case KT_Q4_K:
					case KT_Q5_K: {
						float d = kt_f16_to_f32(ld16(h + 2 * lane));
						float dm = kt_f16_to_f32(ld16(h + 32 + 2 * lane));
						float a = d * (float)s[lane] * dx, m = dm * (float)s[16 + lane] * dx;
						acc = fmaf((float)(il + ih), a, acc);
						acc = fmaf((float)(-(sl + sh)), m, acc);
						break;
					}
					case KT_Q6_K: {
						float d = kt_f16_to_f32(ld16(h + 2 * lane));
						float a = d * (float)(int8_t)s[lane] * dx;
						float c = d * (float)(int8_t)s[16 + lane] * dx;
						acc = fmaf((float)(il - 32 * sl), a, acc);
						acc = fmaf((float)(ih - 32 * sh), c, acc);
						break;
					}
					default: break;
					}
				}
				y[(size_t)t * p->rows + g * QG + lane] = acc;
			}
		}
	}
}

/* ---- AVX512-VNNI kernel -------------------------------------------------- */

#if defined(__x86_64__)

/*
 * What unpacking a sub-block's codes does at any register width, written
 * once for the VNNI kernel's 512-bit whole group and the AVX2 kernel's
 * 256-bit half group (u: the first 64-byte chunk as the width reads it; LD,
 * AND, OR, SRLI16, SLLI16, SET1_8: the width's load and byte operations):
 * Q8_0's 8 chunks loaded as they are; the nibbles of chunks 0-3 split,
 * the low ones to v[c], the high ones to v[c + 4]; Q6_K's two high bits of
 * every code, from the two planes at q6, merged in above them.
 */
#define CODES_Q8(LD, u, v)                                                        \
	do {                                                                      \
		_Pragma("GCC unroll 8")                                           \
		for (int c = 0; c < 8; c++)                                       \
			v[c] = LD((u) + 64 * c);                                  \
	} while (0)
#define CODES_NIBBLES(VI, LD, AND, SRLI16, SET1_8, u, v)                          \
	do {                                                                      \
		const VI m4 = SET1_8(15);                                         \
		_Pragma("GCC unroll 4")                                           \
		for (int c = 0; c < 4; c++) {                                     \
			VI b = LD((u) + 64 * c);                                  \
			v[c] = AND(b, m4);                                        \
			v[c + 4] = AND(SRLI16(b, 4), m4);                         \
		}                                                                 \
	} while (0)
#define CODES_Q6_HIGH(VI, LD, AND, OR, SLLI16, SRLI16, SET1_8, q6, v)             \
	do {                                                                      \
		const VI m30 = SET1_8(0x30);                                      \
		_Pragma("GCC unroll 2")                                           \
		for (int h = 0; h < 2; h++) {                                     \
			VI b = LD((q6) + 64 * h);                                 \
			v[4 * h + 0] = OR(v[4 * h + 0], AND(SLLI16(b, 4), m30));  \
			v[4 * h + 1] = OR(v[4 * h + 1], AND(SLLI16(b, 2), m30));  \
			v[4 * h + 2] = OR(v[4 * h + 2], AND(b, m30));             \
			v[4 * h + 3] = OR(v[4 * h + 3], AND(SRLI16(b, 2), m30));  \
		}                                                                 \
	} while (0)

#define LD512(p) _mm512_load_si512((const void *)(p))
#define LD256(p) _mm256_load_si256((const __m256i *)(p))

/* The 8 chunks of sub-block codes of one group, as bytes (chunk c: codes
 * 4c..4c+3 of every row). */
VNNI INLINE void unpack(const uint8_t *ur, enum kt_dtype dt, __m512i v[8])
{
	if (dt == KT_Q8_0) {
		CODES_Q8(LD512, ur, v);
		return;
	}
	CODES_NIBBLES(__m512i, LD512, _mm512_and_si512, _mm512_srli_epi16, _mm512_set1_epi8, ur, v);
	if (dt == KT_Q5_K) {
		const __m512i b4 = _mm512_set1_epi8(16);
#pragma GCC unroll 8
		for (int c = 0; c < 8; c++) {
			__mmask64 k;
			memcpy(&k, ur + 256 + 8 * c, 8);
			v[c] = _mm512_or_si512(v[c], _mm512_maskz_mov_epi8(k, b4));
		}
	}
	if (dt == KT_Q6_K)
		CODES_Q6_HIGH(__m512i, LD512, _mm512_and_si512, _mm512_or_si512, _mm512_slli_epi16,
			      _mm512_srli_epi16, _mm512_set1_epi8, ur + 256, v);
}

/* Token-independent scale vectors of one group's sub-block b. */
struct vscale {
	__m512 a, c;
};

VNNI INLINE struct vscale vscales(const struct cpu_qpack *p, const uint8_t *gp, int b,
				  enum kt_dtype dt)
{
	const uint8_t *s = gp + p->s_off + (size_t)b * 32;
	const uint8_t *h = gp + p->h_off + (size_t)(b / 8) * h_bytes(dt);
	struct vscale v;
	v.c = _mm512_setzero_ps();
	switch (dt) {
	case KT_Q4_K:
	case KT_Q5_K: {
		__m512 d = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)h));
		__m512 dm = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(h + 32)));
		v.a = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)s))));
		v.c = _mm512_mul_ps(dm, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(s + 16)))));
		break;
	}
	case KT_Q6_K: {
		__m512 d = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)h));
		v.a = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *)s))));
		v.c = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *)(s + 16)))));
		break;
	}
	default:
		v.a = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)s));
		break;
	}
	return v;
}

/* acc += sub-block b of one group times token x (codes v, scales sv). */
VNNI INLINE __m512 qstep(__m512 acc, const __m512i v[8], struct vscale sv, const struct qx_row *x,
			 int b, enum kt_dtype dt)
{
	int32_t xw[8];
	memcpy(xw, x->q + (size_t)b * QB, 32);
	int32_t sl = x->sl[b], sh = x->sh[b];
	__m512i lo, hi;
	switch (dt) {
	case KT_Q8_0: lo = _mm512_set1_epi32(-128 * (sl + sh)); hi = _mm512_setzero_si512(); break;
	case KT_Q4_0: lo = _mm512_set1_epi32(-8 * (sl + sh)); hi = _mm512_setzero_si512(); break;
	case KT_Q6_K: lo = _mm512_set1_epi32(-32 * sl); hi = _mm512_set1_epi32(-32 * sh); break;
	default: lo = hi = _mm512_setzero_si512(); break;
	}
#pragma GCC unroll 4
	for (int c = 0; c < 4; c++) {
		lo = _mm512_dpbusd_epi32(lo, v[c], _mm512_set1_epi32(xw[c]));
		hi = _mm512_dpbusd_epi32(hi, v[c + 4], _mm512_set1_epi32(xw[c + 4]));
	}
	__m512 dx = _mm512_set1_ps(x->d[b]);
	if (dt == KT_Q6_K) {
		acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), _mm512_mul_ps(sv.a, dx), acc);
		return _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), _mm512_mul_ps(sv.c, dx), acc);
	}
	acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi)), _mm512_mul_ps(sv.a, dx), acc);
	if (dt == KT_Q4_K || dt == KT_Q5_K)
		acc = _mm512_fmadd_ps(_mm512_set1_ps((float)(-(sl + sh))), _mm512_mul_ps(sv.c, dx), acc);
	return acc;
}

#define QT_MAX 4   /* tokens per tile */
#define QGR_MAX 4  /* groups per tile */

/* A tile's NT token rows of the activations (x[t]: token t0 + t) and its
 * NG groups of the packed weights (gp[g]: group g0 + g); every isa's. */
#define TILE_ROWS(x, gp)                                                          \
	struct qx_row x[QT_MAX];                                                  \
	const uint8_t *gp[QGR_MAX];                                               \
	_Pragma("GCC unroll 4")                                                   \
	for (int t = 0; t < NT; t++)                                              \
		x[t] = qx_row(qx, p->cols, t0 + t);                               \
	_Pragma("GCC unroll 4")                                                   \
	for (int g = 0; g < NG; g++)                                              \
		gp[g] = p->data + (size_t)(g0 + g) * p->group_bytes

/* Groups g0 .. g0+NG-1 x tokens t0 .. t0+NT-1, all sub-blocks. */
VNNI INLINE void qtile(float *y, const uint8_t *qx, const struct cpu_qpack *p, enum kt_dtype dt,
		       int g0, int t0, const int NG, const int NT)
{
	__m512 acc[QGR_MAX][QT_MAX];
	TILE_ROWS(x, gp);
#pragma GCC unroll 4
	for (int g = 0; g < NG; g++)
#pragma GCC unroll 4
		for (int t = 0; t < NT; t++)
			acc[g][t] = _mm512_setzero_ps();
	for (int b = 0; b < p->nb; b++) {
#pragma GCC unroll 4
		for (int g = 0; g < NG; g++) {
			const uint8_t *ur = gp[g] + (size_t)b * p->ub;
			if (t0 == 0)    /* the next sub-blocks' codes, once per group */
				for (size_t o = 0; o < p->ub; o += 64)
					_mm_prefetch((const char *)ur + 4 * p->ub + o, _MM_HINT_T0);
			__m512i v[8];
			unpack(ur, dt, v);
			struct vscale sv = vscales(p, gp[g], b, dt);
#pragma GCC unroll 4
			for (int t = 0; t < NT; t++)
				acc[g][t] = qstep(acc[g][t], v, sv, &x[t], b, dt);
		}
	}
#pragma GCC unroll 4
	for (int g = 0; g < NG; g++) {
		int r0 = (g0 + g) * QG, n = p->rows - r0 < QG ? p->rows - r0 : QG;
		__mmask16 m = (__mmask16)((1u << n) - 1);
#pragma GCC unroll 4
		for (int t = 0; t < NT; t++)
			_mm512_mask_storeu_ps(y + (size_t)(t0 + t) * p->rows + r0, m, acc[g][t]);
	}
}

VNNI INLINE void rows_vnni(float *y, const uint8_t *qx, const struct cpu_qpack *p,
			   enum kt_dtype dt, int n_tok, int g0, int g1)
{
	if (n_tok == 1) {
		int g = g0;
		for (; g + 4 <= g1; g += 4)
			qtile(y, qx, p, dt, g, 0, 4, 1);
		for (; g < g1; g++)
			qtile(y, qx, p, dt, g, 0, 1, 1);
		return;
	}
	int g = g0;
	for (; g + 2 <= g1; g += 2) {
		int t = 0;
		for (; t + 4 <= n_tok; t += 4)
			qtile(y, qx, p, dt, g, t, 2, 4);
		for (; t < n_tok; t++)
			qtile(y, qx, p, dt, g, t, 2, 1);
	}
	for (; g < g1; g++) {
		int t = 0;
		for (; t + 4 <= n_tok; t += 4)
			qtile(y, qx, p, dt, g, t, 1, 4);
		for (; t < n_tok; t++)
			qtile(y, qx, p, dt, g, t, 1, 1);
	}
}

#define QROWS_FOR(name, dt)                                                            \
	VNNI void name(float *y, const uint8_t *qx, const struct cpu_qpack *p,    \
			      int n_tok, int g0, int g1)                                 \
	{                                                                              \
		rows_vnni(y, qx, p, dt, n_tok, g0, g1);                                  \
	}

QROWS_FOR(cpu_vnni_qrows_q8_0, KT_Q8_0)
QROWS_FOR(cpu_vnni_qrows_q4_0, KT_Q4_0)
QROWS_FOR(cpu_vnni_qrows_q4_k, KT_Q4_K)
QROWS_FOR(cpu_vnni_qrows_q5_k, KT_Q5_K)
QROWS_FOR(cpu_vnni_qrows_q6_k, KT_Q6_K)

/* ---- AVX2 kernel ---------------------------------------------------------
 *
 * The same packed layout, half a group (8 rows: bytes 0-31 or 32-63 of each
 * 64-byte chunk, lane r' = row 8 * half + r') per 256-bit register, and
 * integer sums with VPMADDUBSW (unsigned codes x signed activations, pairs
 * summed to int16) and VPMADDWD (pairs of those to int32). VPMADDUBSW
 * saturates a pair sum past int16, so codes are summed in int16 only where
 * that cannot happen: a pair of codes u < 2^n times activations in
 * [-128, 127] is at most 2 * (2^n - 1) * 128 in magnitude, and no more of
 * them are added in int16 than 32767 allows before VPMADDWD widens them:
 *   4-bit codes (Q4_0, Q4_K): 3840 a pair, all 8 pairs of a sub-block;
 *   Q5_K (< 32, 7936): the 4 of codes 0-15 and the 4 of 16-31 apart;
 *   Q6_K (< 64, 16128): 2 at a time;
 *   Q8_0 (< 256, would saturate): split in nibbles, u = 16 uh + ul, the 8
 *     pairs of each summed apart, then VPMADDWD by 1 and by 16.
 * So every integer sum is exact (il + ih, and for Q6_K il and ih, are the
 * portable kernel's), and the fp32 operations after them are its
 * operations in its order, one lane per row: bit-identical results.
 */
#define AVX2 __attribute__((target("avx2,fma,f16c")))

AVX2 void cpu_avx2_qx_block(const float *x, int8_t *q, float *d, int32_t *sl, int32_t *sh)
{
	const __m256 sign = _mm256_set1_ps(-0.0f);
	__m256 v[4], m = _mm256_setzero_ps();
	/* the running maximum as the second operand: a NaN input is passed
	 * over, as fmaxf passes it over */
	for (int i = 0; i < 4; i++) {
		v[i] = _mm256_loadu_ps(x + 8 * i);
		m = _mm256_max_ps(_mm256_andnot_ps(sign, v[i]), m);
	}
	__m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
	h = _mm_max_ps(h, _mm_movehl_ps(h, h));
	h = _mm_max_ss(h, _mm_movehdup_ps(h));
	float amax = _mm_cvtss_f32(h);
	float dx = amax / 127.0f, id = dx != 0 ? 1.0f / dx : 0.0f;
	const __m256 vid = _mm256_set1_ps(id), lo = _mm256_set1_ps(-128.0f), hi = _mm256_set1_ps(127.0f);
	__m256i qi[4];
	for (int i = 0; i < 4; i++) {
		/* clamped, then rounded to nearest even (the default MXCSR
		 * mode, as nearbyintf): the bounds are integers, so this is the
		 * portable code's round-then-clamp; a NaN gives -128 (max
		 * returns its second operand when the first is NaN), +-inf the
		 * bound, as there */
		__m256 f = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v[i], vid), lo), hi);
		qi[i] = _mm256_cvtps_epi32(f);
	}
	/* 32 int32 -> int8: the packs work within 128-bit lanes; the dwords
	 * are then put back in order */
	__m256i b8 = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]),
					_mm256_packs_epi32(qi[2], qi[3]));
	b8 = _mm256_permutevar8x32_epi32(b8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
	_mm256_storeu_si256((__m256i *)q, b8);
	__m256i s = _mm256_hadd_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3]));
	s = _mm256_hadd_epi32(s, s);   /* per 128-bit lane: sl' sh' sl' sh' */
	__m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
	*d = dx;
	*sl = _mm_cvtsi128_si32(t);
	*sh = _mm_extract_epi32(t, 1);
}

/* The 8 code vectors of one half group's sub-block (ur: the group's
 * sub-block): v[c] byte 4r'+i = code 4c+i of row r' of the half (Q8_0: the
 * stored u = q + 128, all 8 bits). */
AVX2 INLINE void a2_codes(const uint8_t *ur, int half, enum kt_dtype dt, __m256i v[8])
{
	const uint8_t *u = ur + 32 * half;
	if (dt == KT_Q8_0) {
		CODES_Q8(LD256, u, v);
		return;
	}
	CODES_NIBBLES(__m256i, LD256, _mm256_and_si256, _mm256_srli_epi16, _mm256_set1_epi8, u, v);
	if (dt == KT_Q5_K) {
		/* mask c: this half's 32 bits; bit j -> 16 in byte j */
		const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
						     2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
		const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
		const __m256i b4 = _mm256_set1_epi8(16);
#pragma GCC unroll 8
		for (int c = 0; c < 8; c++) {
			int32_t mk;
			memcpy(&mk, ur + 256 + 8 * c + 4 * half, 4);
			__m256i e = _mm256_shuffle_epi8(_mm256_set1_epi32(mk), sel);
			e = _mm256_cmpeq_epi8(_mm256_and_si256(e, bit), bit);
			v[c] = _mm256_or_si256(v[c], _mm256_and_si256(e, b4));
		}
	}
	if (dt == KT_Q6_K)
		CODES_Q6_HIGH(__m256i, LD256, _mm256_and_si256, _mm256_or_si256, _mm256_slli_epi16,
			      _mm256_srli_epi16, _mm256_set1_epi8, ur + 256 + 32 * half, v);
}

/* Activation dword c (codes 4c..4c+3) of xq, broadcast: loaded straight
 * from the row (a copy to the stack first stalls the loads on store
 * forwarding). */
AVX2 INLINE __m256i a2_xw(const int8_t *xq, int c)
{
	int32_t w;
	memcpy(&w, xq + 4 * c, 4);
	return _mm256_set1_epi32(w);
}

/* int16 pair sums of codes v times activation dword c */
#define A2_MUL(v, c) _mm256_maddubs_epi16((v), a2_xw(xq, (c)))
/* int16 lanes -> int32 lanes, pairs summed, times k */
#define A2_WIDEN(a, k) _mm256_madd_epi16((a), _mm256_set1_epi16(k))

/* Integer sums of the codes v times one token's activations xq (32 of a
 * sub-block): lane r' = il + ih in *i0 (Q6_K: il in *i0, ih in *i1);
 * Q8_0 with sgn: il + ih - 128 (sl + sh), the sum of q * x itself. */
AVX2 INLINE void a2_dot(const __m256i v[8], const int8_t *xq, enum kt_dtype dt, const int sgn,
			__m256i *i0, __m256i *i1)
{
	switch (dt) {
	case KT_Q8_0:
		if (sgn) {
			/* |x| (unsigned: 128 for -128) times q * sign(x), q =
			 * u - 128 in [-127, 127] (no -128: see p->q8_min): pairs
			 * within 2 * 128 * 127, widened at once */
			const __m256i m80 = _mm256_set1_epi8((char)0x80);
			__m256i a = _mm256_setzero_si256();
#pragma GCC unroll 8
			for (int c = 0; c < 8; c++) {
				__m256i xv = a2_xw(xq, c);
				__m256i q = _mm256_xor_si256(v[c], m80);
				a = _mm256_add_epi32(a, A2_WIDEN(_mm256_maddubs_epi16(
					_mm256_abs_epi8(xv), _mm256_sign_epi8(q, xv)), 1));
			}
			*i0 = a;
		} else {
			/* any u: nibbles */
			const __m256i m4 = _mm256_set1_epi8(15);
			__m256i al = _mm256_setzero_si256(), ah = _mm256_setzero_si256();
#pragma GCC unroll 8
			for (int c = 0; c < 8; c++) {
				al = _mm256_add_epi16(al, A2_MUL(_mm256_and_si256(v[c], m4), c));
				ah = _mm256_add_epi16(ah, A2_MUL(_mm256_and_si256(
					_mm256_srli_epi16(v[c], 4), m4), c));
			}
			*i0 = _mm256_add_epi32(A2_WIDEN(al, 1), A2_WIDEN(ah, 16));
		}
		break;
	case KT_Q5_K: {
		__m256i a = A2_MUL(v[0], 0), b = A2_MUL(v[4], 4);
#pragma GCC unroll 3
		for (int c = 1; c < 4; c++) {
			a = _mm256_add_epi16(a, A2_MUL(v[c], c));
			b = _mm256_add_epi16(b, A2_MUL(v[c + 4], c + 4));
		}
		*i0 = _mm256_add_epi32(A2_WIDEN(a, 1), A2_WIDEN(b, 1));
		break;
	}
	case KT_Q6_K: {
		__m256i a0 = _mm256_add_epi16(A2_MUL(v[0], 0), A2_MUL(v[1], 1));
		__m256i a1 = _mm256_add_epi16(A2_MUL(v[2], 2), A2_MUL(v[3], 3));
		__m256i b0 = _mm256_add_epi16(A2_MUL(v[4], 4), A2_MUL(v[5], 5));
		__m256i b1 = _mm256_add_epi16(A2_MUL(v[6], 6), A2_MUL(v[7], 7));
		*i0 = _mm256_add_epi32(A2_WIDEN(a0, 1), A2_WIDEN(a1, 1));
		*i1 = _mm256_add_epi32(A2_WIDEN(b0, 1), A2_WIDEN(b1, 1));
		break;
	}
	default: {   /* 4-bit codes */
		__m256i a = A2_MUL(v[0], 0);
#pragma GCC unroll 7
		for (int c = 1; c < 8; c++)
			a = _mm256_add_epi16(a, A2_MUL(v[c], c));
		*i0 = A2_WIDEN(a, 1);
		break;
	}
	}
}

/* Token-independent scale vectors of one half group's sub-block b. */
struct a2_scale {
	__m256 a, c;
};

AVX2 INLINE struct a2_scale a2_scales(const struct cpu_qpack *p, const uint8_t *gp, int b,
				      int half, enum kt_dtype dt)
{
	const uint8_t *s = gp + p->s_off + (size_t)b * 32;
	const uint8_t *h = gp + p->h_off + (size_t)(b / 8) * h_bytes(dt);
	struct a2_scale v;
	v.c = _mm256_setzero_ps();
	switch (dt) {
	case KT_Q4_K:
	case KT_Q5_K: {
		__m256 d = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(h + 16 * half)));
		__m256 dm = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(h + 32 + 16 * half)));
		v.a = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
			_mm_loadl_epi64((const __m128i *)(s + 8 * half)))));
		v.c = _mm256_mul_ps(dm, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
			_mm_loadl_epi64((const __m128i *)(s + 16 + 8 * half)))));
		break;
	}
	case KT_Q6_K: {
		__m256 d = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(h + 16 * half)));
		v.a = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
			_mm_loadl_epi64((const __m128i *)(s + 8 * half)))));
		v.c = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
			_mm_loadl_epi64((const __m128i *)(s + 16 + 8 * half)))));
		break;
	}
	default:
		v.a = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(s + 16 * half)));
		break;
	}
	return v;
}

/* acc += sub-block b of one half group (codes v, scales sv) times token x:
 * cpu_generic_qrows's fp32 operations. */
AVX2 INLINE __m256 a2_step(__m256 acc, const __m256i v[8], struct a2_scale sv,
			   const struct qx_row *x, int b, enum kt_dtype dt, const int sgn)
{
	__m256i i0, i1 = _mm256_setzero_si256();
	a2_dot(v, x->q + (size_t)b * QB, dt, sgn, &i0, &i1);
	int32_t sl = x->sl[b], sh = x->sh[b];
	__m256 dx = _mm256_set1_ps(x->d[b]);
	switch (dt) {
	case KT_Q8_0:
	case KT_Q4_0: {
		int32_t o = dt == KT_Q8_0 ? 128 : 8;
		if (!sgn)
			i0 = _mm256_sub_epi32(i0, _mm256_set1_epi32(o * (sl + sh)));
		return _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), _mm256_mul_ps(sv.a, dx), acc);
	}
	case KT_Q6_K:
		acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(i0, _mm256_set1_epi32(32 * sl))),
				      _mm256_mul_ps(sv.a, dx), acc);
		return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(i1, _mm256_set1_epi32(32 * sh))),
				       _mm256_mul_ps(sv.c, dx), acc);
	default:
		acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), _mm256_mul_ps(sv.a, dx), acc);
		return _mm256_fmadd_ps(_mm256_set1_ps((float)(-(sl + sh))), _mm256_mul_ps(sv.c, dx), acc);
	}
}

/* Batch 1 runs one group at a time: the pack's groups are contiguous, so
 * the kernel reads one ascending stream (the group's codes, then its
 * scales, then the next group), which the hardware prefetcher follows,
 * and the software prefetch A2_PF bytes ahead of the codes runs on into
 * the next group. Two or four groups at a time (four streams a few KiB
 * long each for narrow matrices) read 10-45 % slower on the 2-core EPYC
 * guest (stories15M's 32000 x 288 classifier: 6 against 2.5 ns a row
 * block); 4-8 KiB ahead was the best distance there (2 KiB: -10 %). */
#define A2_PF 6144

/* Groups g0 .. g0+NG-1 (both halves) x tokens t0 .. t0+NT-1, all
 * sub-blocks. */
AVX2 INLINE void a2_qtile(float *y, const uint8_t *qx, const struct cpu_qpack *p, enum kt_dtype dt,
			  const int sgn, int g0, int t0, const int NG, const int NT)
{
	__m256 acc[QGR_MAX][2][QT_MAX];
	TILE_ROWS(x, gp);
#pragma GCC unroll 4
	for (int g = 0; g < NG; g++)
#pragma GCC unroll 4
		for (int t = 0; t < NT; t++)
			acc[g][0][t] = acc[g][1][t] = _mm256_setzero_ps();
	for (int b = 0; b < p->nb; b++) {
#pragma GCC unroll 4
		for (int g = 0; g < NG; g++) {
			const uint8_t *ur = gp[g] + (size_t)b * p->ub;
			if (t0 == 0)    /* A2_PF bytes on, once per group */
				for (size_t o = 0; o < p->ub; o += 64)
					_mm_prefetch((const char *)ur + A2_PF + o, _MM_HINT_T0);
#pragma GCC unroll 2
			for (int hf = 0; hf < 2; hf++) {
				__m256i v[8];
				a2_codes(ur, hf, dt, v);
				struct a2_scale sv = a2_scales(p, gp[g], b, hf, dt);
#pragma GCC unroll 4
				for (int t = 0; t < NT; t++)
					acc[g][hf][t] = a2_step(acc[g][hf][t], v, sv, &x[t], b, dt, sgn);
			}
		}
	}
	const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
#pragma GCC unroll 4
	for (int g = 0; g < NG; g++)
#pragma GCC unroll 2
		for (int hf = 0; hf < 2; hf++) {
			int r0 = (g0 + g) * QG + 8 * hf, n = p->rows - r0;
			if (n <= 0)
				continue;
			__m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane);
#pragma GCC unroll 4
			for (int t = 0; t < NT; t++)
				_mm256_maskstore_ps(y + (size_t)(t0 + t) * p->rows + r0, m, acc[g][hf][t]);
		}
}

AVX2 INLINE void rows_avx2(float *y, const uint8_t *qx, const struct cpu_qpack *p,
			   enum kt_dtype dt, const int sgn, int n_tok, int g0, int g1)
{
	int g = g0;
	if (n_tok == 1) {
		for (; g < g1; g++)
			a2_qtile(y, qx, p, dt, sgn, g, 0, 1, 1);
		return;
	}
	for (; g < g1; g++) {
		int t = 0;
		for (; t + 4 <= n_tok; t += 4)
			a2_qtile(y, qx, p, dt, sgn, g, t, 1, 4);
		for (; t < n_tok; t++)
			a2_qtile(y, qx, p, dt, sgn, g, t, 1, 1);
	}
}

#define QROWS2_FOR(name, dt, sgn)                                                      \
	AVX2 void name(float *y, const uint8_t *qx, const struct cpu_qpack *p,    \
			      int n_tok, int g0, int g1)                                 \
	{                                                                              \
		rows_avx2(y, qx, p, dt, sgn, n_tok, g0, g1);                             \
	}

QROWS2_FOR(cpu_avx2_qrows_q8_0, KT_Q8_0, 1)
QROWS2_FOR(cpu_avx2_qrows_q8_0n, KT_Q8_0, 0)
QROWS2_FOR(cpu_avx2_qrows_q4_0, KT_Q4_0, 0)
QROWS2_FOR(cpu_avx2_qrows_q4_k, KT_Q4_K, 0)
QROWS2_FOR(cpu_avx2_qrows_q5_k, KT_Q5_K, 0)
QROWS2_FOR(cpu_avx2_qrows_q6_k, KT_Q6_K, 0)
#endif /* __x86_64__ */

int cpu_qpack_groups(const struct cpu_qpack *p)
{
	return p->n_groups;
}

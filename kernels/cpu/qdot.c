/*
 * kernels/cpu/qdot.c — quantized matmul with 8-bit activations and integer
 * dot products (AVX512-VNNI), over a row-interleaved copy of the weights.
 *
 * Why: dequantizing 4-bit weights to fp32 inside the dot product costs
 * about 7 vector operations per 32 weights, so on two cores Q4_0 decode was
 * compute-bound at ~73 % of the memory roof and K-quants far below. Here the
 * weights stay small integers and one VPDPBUSD multiplies 64 of them by 64
 * 8-bit activations and sums them in fours, 16 rows at a time.
 *
 * Layout (struct cpu_qpack, built once by cpu_qpack_new at weight
 * placement): rows in groups of QG = 16, row r of a group in 32-bit lane r.
 * Per group, per sub-block b of QB = 32 weights (its codes u[0..31], see
 * struct kt_qcodes), the u region holds chunks of 64 bytes whose lane r
 * carries four consecutive codes of row r:
 *   Q8_0: 8 chunks; chunk c lane r = u[4c .. 4c+3]
 *   4-bit (Q4_0, Q4_K, and the low four bits of Q5_K, Q6_K): 4 chunks;
 *     chunk c lane r byte i = u[4c+i] & 15 | (u[16+4c+i] & 15) << 4
 *   Q5_K: + 8 masks of 64 bits, mask c bit 4r+i = bit 4 of u[4c+i]
 *   Q6_K: + 2 planes of 64 bytes; plane h lane r byte i holds bits 4-5 of
 *     u[16h + 4c + i] at bits 2c..2c+1, c = 0..3
 * then the s region (32 bytes per sub-block: Q8_0/Q4_0 f16 d[16];
 * Q4_K/Q5_K sc[16], m[16] as bytes; Q6_K int8 sc[16] of codes 0-15 and
 * sc[16] of 16-31) and the h region (per 256-weight super-block: Q4_K/Q5_K
 * f16 d[16], dmin[16]; Q6_K f16 d[16]).
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
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kernels/cpu/cpu.h"

#define QG 16    /* rows per group */
#define QB 32    /* weights per sub-block (and activation block) */

struct cpu_qpack {
	enum kt_dtype dt;
	int rows, cols, nb, n_groups;
	size_t ub, s_off, h_off, group_bytes;
	uint8_t *data;
};

static size_t u_bytes(enum kt_dtype dt)
{
	switch (dt) {
	case KT_Q8_0: return 512;
	case KT_Q5_K: return 256 + 64;
	case KT_Q6_K: return 256 + 128;
	default: return 256;
	}
}

static size_t h_bytes(enum kt_dtype dt)
{
	return dt == KT_Q4_K || dt == KT_Q5_K ? 64 : dt == KT_Q6_K ? 32 : 0;
}

static void st16(uint8_t *p, uint16_t v)
{
	memcpy(p, &v, 2);
}

static uint16_t ld16(const uint8_t *p)
{
	uint16_t v;
	memcpy(&v, p, 2);
	return v;
}

/* K-quants: sub-block j of a row's block (codes q) into the pack as
 * sub-block b of lane `lane` of group g. */
static void pack_sub(const struct cpu_qpack *p, uint8_t *g, int lane, int b,
		     const struct kt_qcodes *q, int j)
{
	const uint8_t *u = q->u + QB * j;
	uint8_t *ur = g + (size_t)b * p->ub, *s = g + p->s_off + (size_t)b * 32;
	for (int c = 0; c < 4; c++)
		for (int i = 0; i < 4; i++)
			ur[64 * c + 4 * lane + i] =
				(uint8_t)((u[4 * c + i] & 15) | (u[16 + 4 * c + i] & 15) << 4);
	if (p->dt == KT_Q5_K) {
		for (int c = 0; c < 8; c++) {
			uint64_t m;
			memcpy(&m, ur + 256 + 8 * c, 8);
			for (int i = 0; i < 4; i++)
				m |= (uint64_t)((u[4 * c + i] >> 4) & 1) << (4 * lane + i);
			memcpy(ur + 256 + 8 * c, &m, 8);
		}
	}
	if (p->dt == KT_Q6_K) {
		for (int h = 0; h < 2; h++)
			for (int i = 0; i < 4; i++) {
				int v = 0;
				for (int c = 0; c < 4; c++)
					v |= ((u[16 * h + 4 * c + i] >> 4) & 3) << (2 * c);
				ur[256 + 64 * h + 4 * lane + i] = (uint8_t)v;
			}
	}
	switch (p->dt) {
	case KT_Q4_K:
	case KT_Q5_K:
		s[lane] = (uint8_t)q->sc[j];
		s[16 + lane] = (uint8_t)q->m[j];
		break;
	case KT_Q6_K:
		s[lane] = (uint8_t)(int8_t)q->sc[2 * j];
		s[16 + lane] = (uint8_t)(int8_t)q->sc[2 * j + 1];
		break;
	default: break;
	}
	if (j == 0 && h_bytes(p->dt)) {
		uint8_t *h = g + p->h_off + (size_t)(b / 8) * h_bytes(p->dt);
		st16(h + 2 * lane, q->d);
		if (p->dt != KT_Q6_K)
			st16(h + 32 + 2 * lane, q->dmin);
	}
}

struct pack_job {
	struct cpu_qpack *p;
	const struct kt_weight *w;
};

/* Q8_0 / Q4_0 rows: their blocks' bytes are already in chunk order (a
 * Q4_0 byte i holds codes i and i+16), so dwords are copied as they are,
 * Q8_0's offset by 128 per byte. */
static void pack_row_fast(const struct cpu_qpack *p, uint8_t *gp, int lane, const uint8_t *row)
{
	size_t bb = kt_row_bytes(p->dt, QB);
	int nc = p->dt == KT_Q8_0 ? 8 : 4;
	for (int b = 0; b < p->nb; b++) {
		const uint8_t *blk = row + (size_t)b * bb;
		uint8_t *ur = gp + (size_t)b * p->ub;
		for (int c = 0; c < nc; c++) {
			uint32_t v;
			memcpy(&v, blk + 2 + 4 * c, 4);
			if (p->dt == KT_Q8_0)
				v ^= 0x80808080u;
			memcpy(ur + 64 * c + 4 * lane, &v, 4);
		}
		memcpy(gp + p->s_off + (size_t)b * 32 + 2 * lane, blk, 2);
	}
}

static void pack_worker(void *ctx, int ith, int nth)
{
	struct pack_job *j = ctx;
	struct cpu_qpack *p = j->p;
	int bw = (int)kt_block_weights(p->dt);
	size_t rb = kt_row_bytes(p->dt, (size_t)p->cols), bb = kt_row_bytes(p->dt, (size_t)bw);
	struct kt_qcodes q;
	for (int g = ith; g < p->n_groups; g += nth) {
		uint8_t *gp = p->data + (size_t)g * p->group_bytes;   /* zeroed by mmap */
		for (int lane = 0; lane < QG && g * QG + lane < p->rows; lane++) {
			const uint8_t *row = (const uint8_t *)j->w->data + (size_t)(g * QG + lane) * rb;
			if (p->dt == KT_Q8_0 || p->dt == KT_Q4_0) {
				pack_row_fast(p, gp, lane, row);
				continue;
			}
			for (int blk = 0; blk < p->cols / bw; blk++) {
				kt_block_codes(p->dt, row + (size_t)blk * bb, &q);
				for (int s = 0; s < bw / QB; s++)
					pack_sub(p, gp, lane, blk * (bw / QB) + s, &q, s);
			}
		}
	}
}

int cpu_qpack_new(const struct kt_weight *w, struct tpool *pool, struct cpu_qpack **out)
{
	*out = NULL;
	if (!kt_dtype_is_quant(w->dtype) || w->cols <= 0 || w->rows <= 0 ||
	    w->cols % (int)kt_block_weights(w->dtype))
		return -EINVAL;
	struct cpu_qpack *p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->dt = w->dtype;
	p->rows = w->rows;
	p->cols = w->cols;
	p->nb = w->cols / QB;
	p->n_groups = (w->rows + QG - 1) / QG;
	p->ub = u_bytes(p->dt);
	p->s_off = (size_t)p->nb * p->ub;
	p->h_off = p->s_off + (size_t)p->nb * 32;
	p->group_bytes = (p->h_off + (size_t)(p->nb / 8) * h_bytes(p->dt) + 63) & ~(size_t)63;
	/* its own mapping: page-aligned, transparent huge pages where the
	 * system allows (fewer TLB misses on the streams) */
	void *m = mmap(NULL, cpu_qpack_bytes(p), PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED) {
		free(p);
		return -ENOMEM;
	}
	madvise(m, cpu_qpack_bytes(p), MADV_HUGEPAGE);
	p->data = m;
	struct pack_job j = { p, w };
	if (pool)
		tpool_run(pool, pack_worker, &j, tpool_size(pool));
	else
		pack_worker(&j, 0, 1);
	*out = p;
	return 0;
}

void cpu_qpack_free(struct cpu_qpack *p)
{
	if (p) {
		munmap(p->data, cpu_qpack_bytes(p));
		free(p);
	}
}

size_t cpu_qpack_bytes(const struct cpu_qpack *p)
{
	return (size_t)p->n_groups * p->group_bytes;
}

/* ---- activations --------------------------------------------------------
 * Row of one token: int8 xq[cols], then per block float dx, int32 sl, sh. */

size_t cpu_qx_row_bytes(int cols)
{
	return ((size_t)cols + (size_t)(cols / QB) * 12 + 63) & ~(size_t)63;
}

/* Token t's row of qx: codes, block scales, half sums. The pointers are
 * writable only where qx is (cpu_qx_quantize); the kernels only read. */
struct qx_row {
	int8_t *q;
	float *d;
	int32_t *sl, *sh;
};

static struct qx_row qx_row(const uint8_t *qx, int cols, int t)
{
	uint8_t *p = (uint8_t *)qx + (size_t)t * cpu_qx_row_bytes(cols);
	int nb = cols / QB;
	struct qx_row r = { (int8_t *)p, (float *)(p + cols), (int32_t *)(p + cols) + nb,
			    (int32_t *)(p + cols) + 2 * nb };
	return r;
}

static void qx_block_generic(const float *x, int8_t *q, float *d, int32_t *sl, int32_t *sh)
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
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

VNNI static void qx_block_avx512(const float *x, int8_t *q, float *d, int32_t *sl, int32_t *sh)
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

void cpu_qx_quantize(int vnni, uint8_t *qx, const float *x, int cols, int t0, int t1)
{
	for (int t = t0; t < t1; t++) {
		struct qx_row r = qx_row(qx, cols, t);
		const float *xr = x + (size_t)t * cols;
		for (int b = 0; b < cols / QB; b++) {
#if defined(__x86_64__)
			if (vnni) {
				qx_block_avx512(xr + b * QB, r.q + b * QB, r.d + b, r.sl + b, r.sh + b);
				continue;
			}
#else
			(void)vnni;
#endif
			qx_block_generic(xr + b * QB, r.q + b * QB, r.d + b, r.sl + b, r.sh + b);
		}
	}
}

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

static void rows_generic(float *y, const uint8_t *qx, const struct cpu_qpack *p,
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

/* The 8 chunks of sub-block codes of one group, as bytes (chunk c: codes
 * 4c..4c+3 of every row). */
VNNI INLINE void unpack(const uint8_t *ur, enum kt_dtype dt, __m512i v[8])
{
	if (dt == KT_Q8_0) {
#pragma GCC unroll 8
		for (int c = 0; c < 8; c++)
			v[c] = _mm512_load_si512((const void *)(ur + 64 * c));
		return;
	}
	const __m512i m4 = _mm512_set1_epi8(15);
#pragma GCC unroll 4
	for (int c = 0; c < 4; c++) {
		__m512i b = _mm512_load_si512((const void *)(ur + 64 * c));
		v[c] = _mm512_and_si512(b, m4);
		v[c + 4] = _mm512_and_si512(_mm512_srli_epi16(b, 4), m4);
	}
	if (dt == KT_Q5_K) {
		const __m512i b4 = _mm512_set1_epi8(16);
#pragma GCC unroll 8
		for (int c = 0; c < 8; c++) {
			__mmask64 k;
			memcpy(&k, ur + 256 + 8 * c, 8);
			v[c] = _mm512_or_si512(v[c], _mm512_maskz_mov_epi8(k, b4));
		}
	}
	if (dt == KT_Q6_K) {
		const __m512i m30 = _mm512_set1_epi8(0x30);
#pragma GCC unroll 2
		for (int h = 0; h < 2; h++) {
			__m512i b = _mm512_load_si512((const void *)(ur + 256 + 64 * h));
			v[4 * h + 0] = _mm512_or_si512(v[4 * h + 0], _mm512_and_si512(_mm512_slli_epi16(b, 4), m30));
			v[4 * h + 1] = _mm512_or_si512(v[4 * h + 1], _mm512_and_si512(_mm512_slli_epi16(b, 2), m30));
			v[4 * h + 2] = _mm512_or_si512(v[4 * h + 2], _mm512_and_si512(b, m30));
			v[4 * h + 3] = _mm512_or_si512(v[4 * h + 3], _mm512_and_si512(_mm512_srli_epi16(b, 2), m30));
		}
	}
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

/* Groups g0 .. g0+NG-1 x tokens t0 .. t0+NT-1, all sub-blocks. */
VNNI INLINE void qtile(float *y, const uint8_t *qx, const struct cpu_qpack *p, enum kt_dtype dt,
		       int g0, int t0, const int NG, const int NT)
{
	__m512 acc[QGR_MAX][QT_MAX];
	struct qx_row x[QT_MAX];
	const uint8_t *gp[QGR_MAX];
#pragma GCC unroll 4
	for (int t = 0; t < NT; t++)
		x[t] = qx_row(qx, p->cols, t0 + t);
#pragma GCC unroll 4
	for (int g = 0; g < NG; g++) {
		gp[g] = p->data + (size_t)(g0 + g) * p->group_bytes;
#pragma GCC unroll 4
		for (int t = 0; t < NT; t++)
			acc[g][t] = _mm512_setzero_ps();
	}
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
	VNNI static void name(float *y, const uint8_t *qx, const struct cpu_qpack *p,    \
			      int n_tok, int g0, int g1)                                 \
	{                                                                              \
		rows_vnni(y, qx, p, dt, n_tok, g0, g1);                                  \
	}

QROWS_FOR(qrows_q8_0, KT_Q8_0)
QROWS_FOR(qrows_q4_0, KT_Q4_0)
QROWS_FOR(qrows_q4_k, KT_Q4_K)
QROWS_FOR(qrows_q5_k, KT_Q5_K)
QROWS_FOR(qrows_q6_k, KT_Q6_K)
#endif /* __x86_64__ */

int cpu_qpack_groups(const struct cpu_qpack *p)
{
	return p->n_groups;
}

void cpu_qpack_rows(int vnni, float *y, const uint8_t *qx, const struct cpu_qpack *p,
		    int n_tok, int g0, int g1)
{
#if defined(__x86_64__)
	if (vnni) {
		switch (p->dt) {
		case KT_Q8_0: qrows_q8_0(y, qx, p, n_tok, g0, g1); return;
		case KT_Q4_0: qrows_q4_0(y, qx, p, n_tok, g0, g1); return;
		case KT_Q4_K: qrows_q4_k(y, qx, p, n_tok, g0, g1); return;
		case KT_Q5_K: qrows_q5_k(y, qx, p, n_tok, g0, g1); return;
		case KT_Q6_K: qrows_q6_k(y, qx, p, n_tok, g0, g1); return;
		default: break;
		}
	}
#else
	(void)vnni;
#endif
	rows_generic(y, qx, p, n_tok, g0, g1);
}

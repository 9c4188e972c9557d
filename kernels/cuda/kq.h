/*
 * kernels/cuda/kq.h — one weight of a GGML K-quant super-block (Q4_K, Q5_K,
 * Q6_K) as fp32, for the CUDA kernels (device) and their host test (C,
 * tests/unit/test_quant.c).
 *
 * The CUDA backend keeps K-quant matrices on the device in the file's own
 * bytes (rows of super-blocks), so one decoder serves the matrix-vector
 * kernel (kq_sub: a 32-weight sub-block per lane, its scales once, 16 bits
 * of codes per pair of weights), the f16 expansion for cuBLAS and the embedding gather
 * (kq_at). It reads only the super-block's bytes, 16 bits at a time (Q6_K's
 * 210-byte blocks are only 2-aligned), and computes each weight with the
 * same fp32 expression as the host decoder (kernels/convert.c).
 */
#ifndef LLAMAD_KERNELS_CUDA_KQ_H
#define LLAMAD_KERNELS_CUDA_KQ_H

#include <stdint.h>

#include "kernels/backend.h"

#ifdef __CUDACC__
#define KQ_FN static __host__ __device__ __forceinline__
#else
#define KQ_FN static inline
#endif

/* bytes of one super-block of t */
KQ_FN int kq_block_bytes(enum kt_dtype t)
{
	return t == KT_Q4_K ? 144 : t == KT_Q5_K ? 176 : 210;
}

/* The 16 bits at the even offset off of b, little-endian. Plain loads on
 * the device, so that the compiler can share them between weights. */
KQ_FN unsigned kq_u16(const uint8_t *b, int off)
{
#ifdef __CUDA_ARCH__
	return *(const unsigned short *)(b + off);
#else
	return (unsigned)b[off] | (unsigned)b[off + 1] << 8;
#endif
}

KQ_FN unsigned kq_byte(const uint8_t *b, int off)
{
	return kq_u16(b, off & ~1) >> (8 * (off & 1)) & 255u;
}

KQ_FN float kq_half(const uint8_t *b, int off)
{
	unsigned h = kq_u16(b, off);
#ifdef __CUDA_ARCH__
	return __half2float(__ushort_as_half((unsigned short)h));
#else
	return kt_f16_to_f32((uint16_t)h);
#endif
}

/*
 * The scales of sub-block j (weights 32 j .. 32 j + 31) of the super-block
 * at b: s[0] for its first 16 weights, s[1] for the others (different only
 * in Q6_K, whose scales cover 16 weights), s[2] the offset (Q4_K / Q5_K).
 */
KQ_FN void kq_scales(enum kt_dtype t, const uint8_t *b, int j, float *s)
{
	if (t == KT_Q6_K) {
		/* int8 scales from byte 192, f16 d at 208 */
		int n = j >> 2, k = j & 3;
		float d = kq_half(b, 208);
		s[0] = d * (float)(int8_t)kq_byte(b, 192 + 8 * n + 2 * k);
		s[1] = d * (float)(int8_t)kq_byte(b, 192 + 8 * n + 2 * k + 1);
		s[2] = 0.f;
		return;
	}
	/* f16 d, dmin, then 6-bit scales and mins packed in 12 bytes */
	int sc, m;
	if (j < 4) {
		sc = (int)(kq_byte(b, 4 + j) & 63);
		m = (int)(kq_byte(b, 8 + j) & 63);
	} else {
		unsigned lo = kq_byte(b, 8 + j);
		sc = (int)((lo & 15) | (kq_byte(b, j) >> 6) << 4);
		m = (int)((lo >> 4) | (kq_byte(b, 4 + j) >> 6) << 4);
	}
	s[0] = s[1] = kq_half(b, 0) * (float)sc;
	s[2] = kq_half(b, 2) * (float)m;
}

/*
 * The codes of weights l and l + 1 (l even) of sub-block j, in bits 0-7 and
 * 8-15. Q4_K / Q5_K: 4-bit codes from byte 16 (Q5_K: 48), sub-blocks 2m and
 * 2m + 1 in the low and high nibbles of the same 32 bytes; Q5_K's fifth
 * bits from byte 16, bit j for sub-block j. Q6_K: halves of 128 weights,
 * each 64 bytes of low nibbles (quarters 0, 1 in the low nibbles of two
 * 32-byte rows, quarters 2, 3 in the high ones) and 32 bytes of top bits
 * from byte 128 (two per quarter).
 */
KQ_FN unsigned kq_code2(enum kt_dtype t, const uint8_t *b, int j, int l)
{
	if (t == KT_Q6_K) {
		int n = j >> 2, k = j & 3;
		unsigned lo = kq_u16(b, 64 * n + 32 * (k & 1) + l) >> (4 * (k >> 1)) & 0x0f0fu;
		unsigned hi = kq_u16(b, 128 + 32 * n + l) >> (2 * k) & 0x0303u;
		return lo | hi << 4;
	}
	unsigned q = kq_u16(b, (t == KT_Q4_K ? 16 : 48) + 32 * (j >> 1) + l) >> (4 * (j & 1)) & 0x0f0fu;
	if (t == KT_Q5_K)
		q |= (kq_u16(b, 16 + l) >> j & 0x0101u) << 4;
	return q;
}

/* Weight l of a sub-block from its scales and code q: Q4_K / Q5_K
 * (d sc) q - dmin m, Q6_K (d sc) (q - 32). */
KQ_FN float kq_weight(enum kt_dtype t, const float *s, int l, unsigned q)
{
	float sl = l < 16 ? s[0] : s[1];
	return t == KT_Q6_K ? sl * (float)((int)q - 32) : sl * (float)q - s[2];
}

/* The 32 weights of sub-block j of the super-block at b (the matrix-vector
 * kernel's decode: inlined and unrolled, f stays in registers). */
KQ_FN void kq_sub(enum kt_dtype t, const uint8_t *b, int j, float *f)
{
	float s[3];
	kq_scales(t, b, j, s);
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
	for (int l = 0; l < 32; l += 2) {
		unsigned q = kq_code2(t, b, j, l);
		f[l] = kq_weight(t, s, l, q & 255u);
		f[l + 1] = kq_weight(t, s, l + 1, q >> 8);
	}
}

/* Weight i (0..255) of the K-quant super-block at b. */
KQ_FN float kq_at(enum kt_dtype t, const uint8_t *b, int i)
{
	int j = i >> 5, l = i & 31;
	float s[3];
	kq_scales(t, b, j, s);
	return kq_weight(t, s, l, kq_code2(t, b, j, l & ~1) >> (8 * (l & 1)) & 255u);
}

/* Element c of row r of a K-quant matrix of cols columns (row-major rows
 * of super-blocks). */
KQ_FN float kq_w_at(enum kt_dtype t, const void *w, int cols, int r, int c)
{
	size_t bb = (size_t)kq_block_bytes(t);
	const uint8_t *b = (const uint8_t *)w + ((size_t)r * (size_t)(cols / 256) + (size_t)(c / 256)) * bb;
	return kq_at(t, b, c % 256);
}

#endif

/*
 * kernels/cuda/kq.h — one weight of a GGML K-quant super-block (Q4_K, Q5_K,
 * Q6_K) as fp32, for the CUDA kernels (device) and their host test (C,
 * tests/unit/test_quant.c).
 *
 * The CUDA backend keeps K-quant matrices on the device in the file's own
 * bytes (rows of super-blocks), so one decoder serves the matrix-vector
 * kernel, the f16 expansion for cuBLAS and the embedding gather. It reads
 * only the super-block's bytes, 16 bits at a time (Q6_K's 210-byte blocks
 * are only 2-aligned), and computes each weight with the same fp32
 * expression as the host decoder (kernels/convert.c): Q4_K / Q5_K
 * (d sc) q - dmin m, Q6_K (d sc) (q - 32).
 */
#ifndef LLAMAD_KERNELS_CUDA_KQ_H
#define LLAMAD_KERNELS_CUDA_KQ_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "kernels/backend.h"
#ifdef __cplusplus
}
#endif

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

/* byte off of b (b and off even or not: read through its aligned pair) */
KQ_FN unsigned kq_byte(const uint8_t *b, int off)
{
#ifdef __CUDA_ARCH__
	unsigned w = __ldg((const unsigned short *)(b + (off & ~1)));
	return (w >> (8 * (off & 1))) & 255u;
#else
	return b[off];
#endif
}

KQ_FN float kq_half(const uint8_t *b, int off)
{
	unsigned h = kq_byte(b, off) | kq_byte(b, off + 1) << 8;
#ifdef __CUDA_ARCH__
	return __half2float(__ushort_as_half((unsigned short)h));
#else
	return kt_f16_to_f32((uint16_t)h);
#endif
}

/* Weight i (0..255) of the K-quant super-block at b. */
KQ_FN float kq_at(enum kt_dtype t, const uint8_t *b, int i)
{
	int j = i >> 5, l = i & 31;   /* sub-block of 32, index in it */
	if (t == KT_Q6_K) {
		/* halves of 128: ql 64 bytes (two 32-byte rows, low then high
		 * nibbles), qh 32 bytes (2 bits per quarter), 16-weight scales */
		int n = j >> 2, k = j & 3;
		int q = (int)(kq_byte(b, 64 * n + 32 * (k & 1) + l) >> (4 * (k >> 1)) & 15) |
			(int)(kq_byte(b, 128 + 32 * n + l) >> (2 * k) & 3) << 4;
		int sc = (int)(int8_t)kq_byte(b, 192 + 8 * n + 2 * k + (l >> 4));
		return kq_half(b, 208) * (float)sc * (float)(q - 32);
	}
	/* Q4_K / Q5_K: d, dmin, 6-bit sub-block scales and mins in 12 bytes,
	 * (Q5_K: 32 bytes of fifth bits, bit j for sub-block j), then 4-bit
	 * codes, sub-blocks 2m and 2m+1 in the low and high nibbles of 32 bytes */
	int sc, m;
	if (j < 4) {
		sc = (int)(kq_byte(b, 4 + j) & 63);
		m = (int)(kq_byte(b, 8 + j) & 63);
	} else {
		unsigned lo = kq_byte(b, 8 + j);
		sc = (int)((lo & 15) | (kq_byte(b, j) >> 6) << 4);
		m = (int)((lo >> 4) | (kq_byte(b, 4 + j) >> 6) << 4);
	}
	int qs = (t == KT_Q4_K ? 16 : 48) + 32 * (j >> 1);
	int q = (int)(kq_byte(b, qs + l) >> (4 * (j & 1)) & 15);
	if (t == KT_Q5_K)
		q |= (int)(kq_byte(b, 16 + l) >> j & 1) << 4;
	float d1 = kq_half(b, 0) * (float)sc, m1 = kq_half(b, 2) * (float)m;
	return d1 * (float)q - m1;
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

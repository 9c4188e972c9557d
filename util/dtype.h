/*
 * util/dtype.h — the element types of weights and K/V (f32, f16, bf16 and
 * the GGML block quantizations): their numbers, block sizes, row sizes and
 * names, shared by format/ (the files' type codes), kernels/ and the rest.
 */
#ifndef LLAMAD_UTIL_DTYPE_H
#define LLAMAD_UTIL_DTYPE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

enum kt_dtype {
	KT_F32 = 0,
	KT_F16 = 1,
	KT_BF16 = 2,
	/* GGML block quantizations: 32 weights per block */
	KT_Q8_0 = 3,     /* f16 scale d + 32 x int8 q: w = d * q        (34 bytes) */
	KT_Q4_0 = 4,     /* f16 scale d + 16 bytes of nibbles: w = d * (q - 8)
			  * (18 bytes; byte i holds weight i in its low nibble
			  * and weight i+16 in its high nibble) */
	/* GGML K-quants: super-blocks of KT_QK_K = 256 weights */
	KT_Q4_K = 5,     /* f16 d, f16 dmin, 12 bytes of 6-bit scales sc[8] and
			  * mins m[8] (sub-blocks of 32), 128 bytes of nibbles:
			  * w = d*sc * q - dmin*m                   (144 bytes) */
	KT_Q5_K = 6,     /* as Q4_K plus 32 bytes of fifth bits qh before the
			  * nibbles: w = d*sc * (q + 16*h) - dmin*m (176 bytes) */
	KT_Q6_K = 7,     /* 128 bytes low nibbles ql, 64 bytes high 2 bits qh,
			  * 16 int8 scales (sub-blocks of 16), f16 d:
			  * w = d*sc * (q - 32)                     (210 bytes) */
};

#define KT_QBLOCK 32     /* weights per Q8_0 / Q4_0 block */
#define KT_QK_K 256      /* weights per K-quant super-block */

/* Bytes of one block of each quantized type. */
#define KT_Q8_0_BYTES (2 + KT_QBLOCK)
#define KT_Q4_0_BYTES (2 + KT_QBLOCK / 2)
#define KT_Q4_K_BYTES (2 + 2 + 12 + KT_QK_K / 2)
#define KT_Q5_K_BYTES (2 + 2 + 12 + KT_QK_K / 8 + KT_QK_K / 2)
#define KT_Q6_K_BYTES (KT_QK_K / 2 + KT_QK_K / 4 + KT_QK_K / 16 + 2)

/* Bytes per element of a plain dtype; 0 for quantized ones (use
 * kt_row_bytes). */
size_t kt_dtype_size(enum kt_dtype t);
/* Weights per block: 1 for the plain dtypes, KT_QBLOCK for Q8_0 / Q4_0,
 * KT_QK_K for the K-quants. */
size_t kt_block_weights(enum kt_dtype t);
/* Bytes of one row of n elements (n a multiple of kt_block_weights(t)). */
size_t kt_row_bytes(enum kt_dtype t, size_t n);
/* 1 for the block-quantized types (K-quants included). */
int kt_dtype_is_quant(enum kt_dtype t);
/* Lower-case name ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q5_k",
 * "q6_k"). */
const char *kt_dtype_name(enum kt_dtype t);

#ifdef __cplusplus
}
#endif

#endif

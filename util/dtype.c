/*
 * util/dtype.c — sizes and names of the element types (util/dtype.h).
 */
#include "util/dtype.h"

size_t kt_dtype_size(enum kt_dtype t)
{
	switch (t) {
	case KT_F32: return 4;
	case KT_F16: return 2;
	case KT_BF16: return 2;
	case KT_Q8_0:
	case KT_Q4_0:
	case KT_Q4_K:
	case KT_Q5_K:
	case KT_Q6_K: return 0;
	}
	return 0;
}

size_t kt_block_weights(enum kt_dtype t)
{
	switch (t) {
	case KT_F32:
	case KT_F16:
	case KT_BF16: return 1;
	case KT_Q8_0:
	case KT_Q4_0: return KT_QBLOCK;
	case KT_Q4_K:
	case KT_Q5_K:
	case KT_Q6_K: return KT_QK_K;
	}
	return 1;
}

size_t kt_row_bytes(enum kt_dtype t, size_t n)
{
	switch (t) {
	case KT_F32: return 4 * n;
	case KT_F16:
	case KT_BF16: return 2 * n;
	case KT_Q8_0: return n / KT_QBLOCK * KT_Q8_0_BYTES;
	case KT_Q4_0: return n / KT_QBLOCK * KT_Q4_0_BYTES;
	case KT_Q4_K: return n / KT_QK_K * KT_Q4_K_BYTES;
	case KT_Q5_K: return n / KT_QK_K * KT_Q5_K_BYTES;
	case KT_Q6_K: return n / KT_QK_K * KT_Q6_K_BYTES;
	}
	return 0;
}

int kt_dtype_is_quant(enum kt_dtype t)
{
	return t == KT_Q8_0 || t == KT_Q4_0 || t == KT_Q4_K || t == KT_Q5_K || t == KT_Q6_K;
}

const char *kt_dtype_name(enum kt_dtype t)
{
	switch (t) {
	case KT_F32: return "f32";
	case KT_F16: return "f16";
	case KT_BF16: return "bf16";
	case KT_Q8_0: return "q8_0";
	case KT_Q4_0: return "q4_0";
	case KT_Q4_K: return "q4_k";
	case KT_Q5_K: return "q5_k";
	case KT_Q6_K: return "q6_k";
	}
	return "?";
}

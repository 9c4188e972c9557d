/*
 * kernels/cpu/cpu.h — internals shared by the CPU backend's files.
 */
#ifndef LLAMAD_KERNELS_CPU_CPU_H
#define LLAMAD_KERNELS_CPU_CPU_H

#include "kernels/backend.h"
#include "kernels/cpu/threadpool.h"

struct cpu_backend {
	struct backend be;
	struct tpool *pool;
	int have_avx512;
	float **scratch;        /* per-thread scratch (attention scores) */
	size_t scratch_len;     /* floats in each */
};

/* Matmul entry point of the CPU backend (kernels/cpu/matmul.c). */
void cpu_matmul(struct backend *be, float *y, const float *x,
		const struct kt_weight *w, int n_tok);

/* Single-threaded matmul of rows [r0, r1) of w (any dtype; Q8_0/Q4_0 need
 * w->cols a multiple of kt_block_weights(w->dtype)), for testing and for the pool workers.
 * avx512 selects the AVX-512 kernels; the result is bit-identical either
 * way, and for any row range. */
void cpu_matmul_rows(int avx512, float *y, const float *x,
		     const struct kt_weight *w, int n_tok, int r0, int r1);

/* Dot product of n fp32 values with the fixed reduction order every op uses. */
float cpu_dot(const float *a, const float *b, int n);

#endif

/*
 * kernels/cpu/qpack.h — the packed form of quantized weights (private to
 * kernels/cpu/: qpack.c builds it, qdot.c's kernels read it, matmul.c
 * picks the kernel) and the 8-bit activations those kernels take.
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
 */
#ifndef LLAMAD_KERNELS_CPU_QPACK_H
#define LLAMAD_KERNELS_CPU_QPACK_H

#include <stdint.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

#define QG 16    /* rows per group */
#define QB 32    /* weights per sub-block (and activation block) */

struct cpu_qpack {
	enum kt_dtype dt;
	int rows, cols, nb, n_groups;
	size_t ub, s_off, h_off, group_bytes;
	uint8_t *data;
	int q8_min;     /* Q8_0: some code is -128 (u = 0); see the AVX2 kernel */
};

static inline size_t h_bytes(enum kt_dtype dt)
{
	return dt == KT_Q4_K || dt == KT_Q5_K ? 64 : dt == KT_Q6_K ? 32 : 0;
}

static inline uint16_t ld16(const uint8_t *p)
{
	uint16_t v;
	memcpy(&v, p, 2);
	return v;
}

/* ---- activations: per token int8 xq[cols], then per block float dx,
 * int32 sl, sh (cpu_qx_row_bytes) ---- */

/* Token t's row of qx: codes, block scales, half sums. The pointers are
 * writable only where qx is (cpu_qx_quantize); the kernels only read. */
struct qx_row {
	int8_t *q;
	float *d;
	int32_t *sl, *sh;
};

static inline struct qx_row qx_row(const uint8_t *qx, int cols, int t)
{
	uint8_t *p = (uint8_t *)qx + (size_t)t * cpu_qx_row_bytes(cols);
	int nb = cols / QB;
	struct qx_row r = { (int8_t *)p, (float *)(p + cols), (int32_t *)(p + cols) + nb,
			    (int32_t *)(p + cols) + 2 * nb };
	return r;
}

/* One block of QB activations quantized (qdot.c): the same bytes from
 * every isa. */
void cpu_generic_qx_block(const float *x, int8_t *q, float *d, int32_t *sl, int32_t *sh);
/* Row groups [g0, g1) of p for n_tok tokens of qx, portable (qdot.c). */
void cpu_generic_qrows(float *y, const uint8_t *qx, const struct cpu_qpack *p, int n_tok,
		       int g0, int g1);

#if defined(__x86_64__)
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define QAVX2 __attribute__((target("avx2,fma,f16c")))
VNNI void cpu_avx512_qx_block(const float *x, int8_t *q, float *d, int32_t *sl, int32_t *sh);
QAVX2 void cpu_avx2_qx_block(const float *x, int8_t *q, float *d, int32_t *sl, int32_t *sh);
/* The packed kernels of one dtype (qdot.c): AVX512-VNNI, and AVX2 (Q8_0
 * in two forms: _q8_0n where some code is -128, see qdot.c). */
#define CPU_QROWS(name) \
	void name(float *y, const uint8_t *qx, const struct cpu_qpack *p, int n_tok, int g0, int g1)
VNNI CPU_QROWS(cpu_vnni_qrows_q8_0);
VNNI CPU_QROWS(cpu_vnni_qrows_q4_0);
VNNI CPU_QROWS(cpu_vnni_qrows_q4_k);
VNNI CPU_QROWS(cpu_vnni_qrows_q5_k);
VNNI CPU_QROWS(cpu_vnni_qrows_q6_k);
QAVX2 CPU_QROWS(cpu_avx2_qrows_q8_0);
QAVX2 CPU_QROWS(cpu_avx2_qrows_q8_0n);
QAVX2 CPU_QROWS(cpu_avx2_qrows_q4_0);
QAVX2 CPU_QROWS(cpu_avx2_qrows_q4_k);
QAVX2 CPU_QROWS(cpu_avx2_qrows_q5_k);
QAVX2 CPU_QROWS(cpu_avx2_qrows_q6_k);
#undef QAVX2
#endif

#endif

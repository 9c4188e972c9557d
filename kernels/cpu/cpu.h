/*
 * kernels/cpu/cpu.h — internals shared by the CPU backend's files.
 */
#ifndef LLAMAD_KERNELS_CPU_CPU_H
#define LLAMAD_KERNELS_CPU_CPU_H

#include "kernels/backend.h"
#include "kernels/cpu/threadpool.h"

/* Instruction sets the CPU has (whatever the LLAMAD_NO_* switches say):
 * AVX-512F alone (the attention clones); AVX-512F/BW/VL + F16C (matmul);
 * AVX2 + FMA + F16C; AVX-512F + VNNI (the packed integer path); AVX-512F/BW/VL
 * + BF16 (bf16 dot products). */
enum cpu_feature { CPU_AVX512F, CPU_AVX512, CPU_AVX2, CPU_VNNI, CPU_BF16 };
int cpu_has(enum cpu_feature f);

/* Which vector code a kernel runs. Every choice gives the same bits. */
enum cpu_isa {
	CPU_ISA_PORTABLE = 0,  /* plain C */
	CPU_ISA_AVX512 = 1,    /* AVX-512F/BW/VL (packed quantized: + VNNI) */
	CPU_ISA_AVX2 = 2,      /* AVX2 + FMA + F16C */
};

struct cpu_backend {
	struct backend be;
	struct tpool *pool;
	int have_avx512;
	int have_avx2;          /* AVX2 + FMA + F16C (used without AVX-512) */
	int attn_wide;          /* attention in sixteen-float vectors (AVX-512F);
				 * else eight: the same results (tests flip it) */
	float **scratch;        /* per-thread scratch (attention scores) */
	size_t scratch_len;     /* floats in each */
	int have_vnni;          /* AVX512-VNNI: quantized weights are packed */
	int pack_quant;         /* pack quantized weights at placement */
	uint8_t *qx;            /* 8-bit activations for packed matmuls */
	size_t qx_len;          /* bytes at qx */
	int qx_cols;            /* widest packed weight placed */
	int bf16_dot;           /* bf16 weights x bf16-rounded activations
				 * (CPUs with AVX512-BF16, unless
				 * LLAMAD_CPU_EXACT_BF16; VDPBF16PS, or the
				 * portable loop under LLAMAD_NO_AVX512) */
	uint16_t *xb;           /* the bf16 activations of such a matmul */
	size_t xb_len;          /* bytes at xb */
	int xb_cols;            /* widest bf16 weight placed for matmul */
};

/* Quantized weights with 8-bit activations (kernels/cpu/qdot.c). */
struct cpu_qpack;
/* Pack w (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K) row-interleaved, with pool's
 * threads if pool is not NULL. 0, -EINVAL (not a packable dtype or shape)
 * or -ENOMEM. */
int cpu_qpack_new(const struct kt_weight *w, struct tpool *pool, struct cpu_qpack **out);
void cpu_qpack_free(struct cpu_qpack *p);
size_t cpu_qpack_bytes(const struct cpu_qpack *p);
/* The bytes cpu_qpack_new would map for w (0: not packable). */
size_t cpu_qpack_size(const struct kt_weight *w);
/* Row groups (16 rows each): the unit cpu_qpack_rows splits on. */
int cpu_qpack_groups(const struct cpu_qpack *p);
/* Bytes of one token's quantized activations of width cols. */
size_t cpu_qx_row_bytes(int cols);
/* Quantize tokens [t0, t1) of x (rows of cols) into qx (rows of
 * cpu_qx_row_bytes(cols), 64-byte aligned). isa (enum cpu_isa) picks the
 * vector code; the bytes are the same whichever. */
void cpu_qx_quantize(int isa, uint8_t *qx, const float *x, int cols, int t0, int t1);
/* y (n_tok x rows) for row groups [g0, g1) of p from quantized activations;
 * isa picks the kernel (CPU_ISA_AVX512: AVX512-VNNI; CPU_ISA_AVX2); the
 * result is bit-identical whichever and for any group range. */
void cpu_qpack_rows(int isa, float *y, const uint8_t *qx, const struct cpu_qpack *p,
		    int n_tok, int g0, int g1);
/* The isa of the packed kernels on this backend. */
int cpu_q_isa(const struct cpu_backend *cb);

/* Matmul entry point of the CPU backend (kernels/cpu/matmul.c). */
void cpu_matmul(struct backend *be, float *y, const float *x,
		const struct kt_weight *w, int n_tok);
/* y[i] = x W[i]^T for n <= 3 weights sharing x (the op table's
 * matmul_n): packed ones in one job over all their row groups, the
 * activations quantized once; otherwise cpu_matmul for each. The same
 * bits as cpu_matmul either way. */
void cpu_matmul_n(struct backend *be, int n, float *const *y, const struct kt_weight *const *w,
		  const float *x, int n_tok);

/* Single-threaded matmul of rows [r0, r1) of w (any dtype; Q8_0/Q4_0 need
 * w->cols a multiple of kt_block_weights(w->dtype)), for testing and for the pool workers.
 * isa (enum cpu_isa) selects the kernels (the caller checks the CPU has
 * them); the result is bit-identical whichever, and for any row range. */
void cpu_matmul_rows(int isa, float *y, const float *x,
		     const struct kt_weight *w, int n_tok, int r0, int r1);
/* The isa cpu_matmul uses on this backend. */
int cpu_mm_isa(const struct cpu_backend *cb);

/* Room in cb->qx for n_tok tokens of width cols: 0 or -ENOMEM. */
int cpu_qx_reserve(struct cpu_backend *cb, int n_tok, int cols);

/* bf16 weights x bf16 activations (kernels/cpu/matmul.c, cb->bf16_dot).
 * cpu_bf16_round: x rounded to bf16 (nearest even; denormals to a signed
 * zero; NaN stays NaN), the same bits whichever isa. cpu_matmul_rows_bf16:
 * rows [r0, r1) of a bf16 w against such activations; isa CPU_ISA_AVX512
 * runs VDPBF16PS (the caller checks cpu_has(CPU_BF16)), anything else the
 * portable loop: bit-identical, and for any row range or batch. */
void cpu_bf16_round(int isa, uint16_t *xb, const float *x, size_t n);
void cpu_matmul_rows_bf16(int isa, float *y, const uint16_t *xb, const struct kt_weight *w,
			  int n_tok, int r0, int r1);
/* Room in cb->xb for n elements: 0 or -ENOMEM. */
int cpu_xb_reserve(struct cpu_backend *cb, size_t n);

/* Dot product of n fp32 values with the fixed reduction order every op uses. */
float cpu_dot(const float *a, const float *b, int n);

/* The table's ops (struct backend_ops, kernels/backend.h), each in its file:
 * elementwise.c */
void cpu_rmsnorm(struct backend *be, float *y, const float *x, const float *w, int n, int n_tok,
		 float eps);
void cpu_rope(struct backend *be, float *q, float *k, const int *pos, int n_tok, int n_heads,
	      int n_kv_heads, int hd, const float *inv_freq, enum kt_rope_layout layout);
void cpu_silu_mul(struct backend *be, float *g, const float *u, size_t n);
void cpu_add(struct backend *be, float *y, const float *x, size_t n);
void cpu_embed(struct backend *be, float *y, const struct kt_weight *table, const int32_t *tok,
	       int n_tok);
/* kv_store.c */
void cpu_kv_store(struct backend *be, const struct kt_kv *kv, int layer, const float *k,
		  const float *v, const struct kt_attn_row *rows, int n_tok);
/* attention.c */
void cpu_attention(struct backend *be, float *out, const float *q, const struct kt_kv *kv,
		   int layer, const struct kt_attn_row *rows, int n_tok, int n_heads,
		   int n_kv_heads, int hd);

/* Query vectors attended together (attention.c's tiles); the per-thread
 * scratch holds ATTN_TILE rows of scores. */
#define ATTN_TILE 8
/* Room for len floats in every thread's attention scratch: 0 or -ENOMEM. */
int cpu_scratch_reserve(struct cpu_backend *cb, size_t len);

#endif

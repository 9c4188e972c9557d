/*
 * kernels/cuda/cuda.cuh — the CUDA backend's shared state and launchers.
 *
 * One .cu per op; each exports a launcher taking the stream (and the few
 * staged arrays it reads) so the ops in ops.cu stay thin. Activations
 * are fp32 on the device; weights are f16/bf16/f32, repacked Q8_0/Q4_0
 * (quants first, then one f16 scale per 32 weights) or K-quants in the
 * file's own super-blocks (decoded by kq.h); the KV pool keeps the
 * CPU backend's layout in each element type (kernels/backend.h: f32, f16,
 * q8_0) so blocks move between them byte for byte.
 */
#ifndef LLAMAD_KERNELS_CUDA_CUDA_CUH
#define LLAMAD_KERNELS_CUDA_CUDA_CUH

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/cuda/kq.h"
#include "kernels/cuda/plan.h"

/* attention: query rows per tile of the prefill kernel (CU_GEMV_MAX,
 * CU_MAX_SPLIT, CU_PART_FLOATS: plan.h) */
#define CU_QT 16

/* Staged batch (batch_begin): device arrays the ops index. */
struct cu_batch {
	int32_t *tok;      /* (T) */
	int *pos;          /* (T) */
	int *row_tab;      /* (T) table index of each row */
	int32_t *tables;   /* (n_tables, tab_stride) block ids */
	int *tiles;        /* (n_tiles, 3): first row, rows, first position */
	int tab_stride;
	int n_tok, n_tiles;
	int single_rows;   /* every tile is one row (decode) */
	int n_small_tiles; /* tiles[0, n_small_tiles) are rows outside big runs */
};

/* Runs of at least CU_BIG_RUN consecutive rows of one sequence take the
 * GEMM form of attention; their tiles come after the others. */
#define CU_BIG_RUN 16
#define CU_MAX_RUNS 64
struct cu_run {
	int t0, n, p0, tab;  /* first row, rows, first position, table index */
};

/* Dequantizing / converting matrix-vector product y = x W^T for
 * n_tok <= CU_GEMV_MAX rows. */
void cu_gemv(cudaStream_t st, float *y, const float *x, const struct kt_weight *w, int n_tok);
/* The epilogue of the fused q/k/v product (MODE 3): q rotated into y[0],
 * k rotated and v stored into the KV pool at each row's slot (f32, or f16
 * rounded to nearest even); for a q8_0 pool, whose scale of a group of
 * channels no single warp sees, k rotated and v into y[1] and y[2] as rows,
 * for cu_kv_store to quantize. */
struct cu_gemv_epi {
	void *kv;                 /* the pool's base */
	const float *inv_freq;
	const int *pos, *row_tab;
	const int32_t *tables;
	int tab_stride, n_layers, bs, kv_dim, layer, hd, half;
	int kv_dt;                /* the pool's element type */
};

/* The fused forms (one dtype, n_tok <= CU_GEMV_MAX): mode 0, up to three
 * products sharing x (y[i] = x W[i]^T); mode 1, y[0] += x W[0]^T; mode 2,
 * y[0] = silu(x W[0]^T) * (x W[1]^T); mode 3, q/k/v with RoPE and the KV
 * store (epi). */
struct cu_gemv_job {
	const void *w[3];
	float *y[3];
	int rows[3];
	int n, cols, vec;
	/* Q8_0 / Q4_0 with 8-bit activations when set: scratch for x as int8
	 * (n_tok x cols), its scales and sums (n_tok x cols/32 each) */
	int8_t *xq;
	float *xd;
	int *xs;
	/* norm: x is RMS-normalized with weights g inside the kernel */
	const float *g;
	float eps;
	/* split-K: partials (parts x n_tok x rows) and a counter per block of
	 * rows (zero between launches) */
	float *part;
	unsigned *count;
	struct cu_gemv_epi e;
};
void cu_gemv_run(cudaStream_t st, struct cu_gemv_job *j, enum kt_dtype dt, int mode,
		 const float *x, int n_tok);
/* The same without quantizing x first (j->xq already holds it when QX). */
void cu_gemv_launch(cudaStream_t st, struct cu_gemv_job *j, enum kt_dtype dt, int mode,
		    const float *x, int n_tok);
/* Fused forms: norm_qkv (mode 3, x normalized by j->g inside, quantized
 * there for Q8_0 / Q4_0 when qx), qkv (mode 3 from a normalized x, through
 * j->xq when qx), norm_swiglu (mode 2, normalized inside); split-K y += x
 * W^T over `parts` (Q8_0 / Q4_0, x quantized inside). Return 0, or -1 when
 * the shape does not suit them (nothing launched). */
int cu_gemv_fused(cudaStream_t st, struct cu_gemv_job *j, enum kt_dtype dt, int mode, int norm,
		  int qx, const float *x, int n_tok);
int cu_gemv_splitk(cudaStream_t st, struct cu_gemv_job *j, enum kt_dtype dt, const float *x,
		   int n_tok, int parts);
/* x (nb blocks of 32) as 8-bit values, scales and sums. */
void cu_quant_x(cudaStream_t st, int8_t *xq, float *xd, int *xs, const float *x, size_t nb);
/* W (Q8_0 / Q4_0 repacked, or a K-quant) to f16, row-major rows x cols. */
void cu_dequant_f16(cudaStream_t st, __half *dst, const struct kt_weight *w);
/* n fp32 values to f16 / bf16. */
void cu_f32_to_f16(cudaStream_t st, __half *dst, const float *src, size_t n);
void cu_f32_to_bf16(cudaStream_t st, __nv_bfloat16 *dst, const float *src, size_t n);
/* GGML Q8_0 / Q4_0 blocks (src, device) to the repacked layout. */
void cu_repack_q(cudaStream_t st, void *dst, const void *src, enum kt_dtype t, size_t rows,
		 size_t cols);

void cu_rmsnorm(cudaStream_t st, float *y, const float *x, const float *w, int n, int n_tok,
		float eps);
void cu_rope(cudaStream_t st, float *q, float *k, const int *pos, int n_tok, int n_heads,
	     int n_kv_heads, int hd, const float *inv_freq, enum kt_rope_layout layout);
void cu_kv_store(cudaStream_t st, const struct kt_kv *kv, int layer, const float *k,
		 const float *v, const struct cu_batch *b);
/* Attention over the staged batch; part: CU_PART_FLOATS of scratch. */
void cu_attention(cudaStream_t st, float *out, const float *q, const struct kt_kv *kv,
		  int layer, const struct cu_batch *b, int n_heads, int n_kv_heads, int hd,
		  float *part, int n_sm);
/* The GEMM form of attention for a run of n rows at positions p0.. of one
 * sequence (table tab on the device): gather K/V [0, P) as f16, queries as
 * f16, causal softmax of S into f16 probabilities, outputs back to rows. */
void cu_attn_gather(cudaStream_t st, __half *kc, __half *vc, const struct kt_kv *kv, int layer,
		    const int32_t *tab, int P, int n_kv_heads, int hd);
void cu_attn_q16(cudaStream_t st, __half *qc, const float *q, int t0, int n, int n_heads,
		 int n_kv_heads, int hd);
void cu_attn_softmax(cudaStream_t st, __half *pm, const float *S, int rows, int n, int P, int p0);
void cu_attn_scatter(cudaStream_t st, float *out, const float *oc, int t0, int n, int n_heads,
		     int n_kv_heads, int hd);
/* The arguments of the attention kernels (attention.cu, attn.cuh). */
struct attn_args {
	float *out, *part;
	const float *q;
	const void *base;  /* the KV pool, elements of kv_dt */
	const int *pos, *row_tab, *tiles;
	const int32_t *tables;
	int tab_stride, n_heads, group, hd, bs, n_layers, kv_dim, layer, n_split;
	float scale;
	int kv_dt;         /* the pool's element type (KT_F32, KT_F16, KT_Q8_0) */
	int kv_gsh;        /* q8_0: log2 of its channels per scale (kv->group) */
};
/* Fill a for the staged batch b (n_split for decode rows). */
void cu_attn_fill(struct attn_args *a, float *out, const float *q, const struct kt_kv *kv,
		  int layer, const struct cu_batch *b, int n_heads, int n_kv_heads, int hd,
		  float *part);

/* The persistent layer kernel's arguments (candidates/layer.cu): the four products
 * (qkv with its epilogue and norm, o, gate/up with its norm, down; their y
 * and x are the layer's buffers: o.y[0] = down.y[0] = x, ffn.y[0] = hb)
 * and the attention's (its out = att, the input of o). */
struct cu_layer_args {
	struct cu_gemv_job qkv, o, ffn, down;
	float *x;
	struct attn_args at;
};
/* Blocks of the persistent kernel for dt that stay resident on n_sm SMs
 * with smem bytes each (opting in above 48 KB); 0 when it cannot run. */
int cu_layer_blocks(enum kt_dtype dt, int qx, size_t smem, int n_sm);
/* Launch it (cooperative): the launch's cudaError_t (0 when it started). */
int cu_layer_launch(cudaStream_t st, const struct cu_layer_args *a, enum kt_dtype dt, int qx,
		    int blocks, size_t smem);
void cu_silu_mul(cudaStream_t st, float *g, const float *u, size_t n);
void cu_add(cudaStream_t st, float *y, const float *x, size_t n);
void cu_embed(cudaStream_t st, float *y, const struct kt_weight *table, const int32_t *tok,
	      int n_tok);

/*
 * Programmatic dependent launch: kernels launched with cu_launch_pdl may
 * start while the previous kernel in the stream finishes; each calls
 * cu_pdl_wait() before touching memory that kernel writes or reads, and
 * cu_pdl_trigger() to let the next one be scheduled. Without the launch
 * attribute both are no-ops.
 */
static __device__ __forceinline__ void cu_pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

static __device__ __forceinline__ void cu_pdl_trigger(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

/* cu_launch_pdl's failed launch, for this thread (error.cu: launched()
 * takes it). */
void cu_note_launch_error(cudaError_t e);

/* A launch on st with the one attribute at (PDL, cooperative). */
static inline cudaLaunchConfig_t cu_launch_cfg(dim3 grid, dim3 block, size_t smem, cudaStream_t st,
					       cudaLaunchAttribute *at)
{
	cudaLaunchConfig_t cfg = {};
	cfg.gridDim = grid;
	cfg.blockDim = block;
	cfg.dynamicSmemBytes = smem;
	cfg.stream = st;
	cfg.attrs = at;
	cfg.numAttrs = 1;
	return cfg;
}

template <typename... K, typename... A>
static inline void cu_launch_pdl(void (*kernel)(K...), dim3 grid, dim3 block, size_t smem,
				 cudaStream_t st, A... args)
{
	cudaLaunchAttribute at[1];
	at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
	at[0].val.programmaticStreamSerializationAllowed = 1;
	cudaLaunchConfig_t cfg = cu_launch_cfg(grid, block, smem, st, at);
	cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, args...);
	if (e != cudaSuccess)
		cu_note_launch_error(e);
}

/* Q8_0 / Q4_0 repacked: quants of all rows, then the f16 scales. */
static inline size_t cu_q_quant_bytes(enum kt_dtype t, size_t rows, size_t cols)
{
	return t == KT_Q8_0 ? rows * cols : rows * cols / 2;
}

/* Element (r, c) of a placed weight matrix as fp32. */
static __device__ __forceinline__ float cu_w_at(const void *w, enum kt_dtype dt, size_t rows, int cols,
				       int r, int c)
{
	size_t i = (size_t)r * cols + c;
	switch (dt) {
	case KT_F32: return ((const float *)w)[i];
	case KT_F16: return __half2float(((const __half *)w)[i]);
	case KT_BF16: return __bfloat162float(((const __nv_bfloat16 *)w)[i]);
	case KT_Q8_0: {
		const int8_t *qs = (const int8_t *)w;
		const __half *sc = (const __half *)(qs + rows * cols);
		return __half2float(sc[i / 32]) * (float)qs[i];
	}
	case KT_Q4_0: {
		const uint8_t *qs = (const uint8_t *)w;
		const __half *sc = (const __half *)(qs + rows * cols / 2);
		size_t blk = i / 32;
		int in = (int)(i % 32);
		int q = (qs[blk * 16 + in % 16] >> (in >= 16 ? 4 : 0)) & 15;
		return __half2float(sc[blk]) * (float)(q - 8);
	}
	case KT_Q4_K:
	case KT_Q5_K:
	case KT_Q6_K:
		return kq_w_at(dt, w, cols, r, c);
	default:
		return 0.f;
	}
}

#endif

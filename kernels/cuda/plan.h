/*
 * kernels/cuda/plan.h — the CUDA backend's layer candidates and their launch
 * plans, in C: the backend (candidates/layer_op.cu) executes a plan step by step, and a
 * CPU test (tests/unit/test_cuplan.c) computes and prints the same plans, so
 * the launches per layer and the bytes each reads are known before a GPU
 * says anything.
 *
 * A candidate is one way to run a transformer layer for a small batch
 * (n_tok <= CU_GEMV_MAX rows, the matrix-vector regime):
 *   base        today's kernels, one op at a time (rmsnorm, [quant_x],
 *               q/k/v, rope, kv_store, attention, [combine], o + residual,
 *               rmsnorm, gate/up + SwiGLU, down + residual)
 *   fused       the RMSNorm inside the products that read its output (each
 *               block computes the row's scale itself; Q8_0 / Q4_0 quantize
 *               the normalized x to 8 bits there too), RoPE and the KV store
 *               in the q/k/v product's epilogue (a warp computes both rows
 *               of a rotation pair)
 *   persistent  batch 1 only: one cooperative kernel per layer, its phases
 *               (fused q/k/v, attention, combine, o + residual, fused
 *               gate/up, down + residual) separated by grid-wide barriers
 *   splitk      Q8_0 / Q4_0 only: fused, and the o and down products split
 *               along K over several blocks, each quantizing only its slice
 *               of x, the last block of a row group summing the partials in
 *               a fixed order
 * A candidate that does not apply to a shape (splitk on f16, persistent
 * for 2 rows or a q8_0 KV pool) plans as fused; every candidate falls back
 * to the ops one at a time (cuBLAS and all) above CU_GEMV_MAX rows or for
 * mixed dtypes. With a q8_0 KV pool the fused q/k/v product leaves k and v
 * as rows (arg 1: a group's scale needs channels other warps compute) and
 * a kv_store step quantizes them; f32 and f16 pools take them in the
 * epilogue.
 *
 * Written 2026-12-02 without a GPU: the fused, persistent and splitk kernels
 * have never run on one (tests/gpu/run.sh checks each against the CPU before
 * timing it; docs/PERF.md), so every dtype's fixed choice is base.
 *
 * The helpers marked CU_FN are shared by the kernels and the CPU test: the
 * q/k/v row pairing of the fused epilogue, RoPE's rotation, KV slot offsets,
 * the 8-bit activation blocks, the attention and split-K split counts.
 */
#ifndef LLAMAD_KERNELS_CUDA_PLAN_H
#define LLAMAD_KERNELS_CUDA_PLAN_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"

#ifdef __CUDACC__
#include <cuda_fp16.h>
#define CU_FN static __host__ __device__ __forceinline__
#else
#define CU_FN static inline
#endif

/* largest batch the matrix-vector kernels take; bigger ones go to cuBLAS */
#define CU_GEMV_MAX 8
/* warps per block of the matrix-vector kernels; of the persistent kernel */
#define CU_GW 8
#define CU_PW 4
/* attention: most splits along the sequence, floats of the split partials */
#define CU_MAX_SPLIT 16
#define CU_PART_FLOATS (16u << 20)
/* dynamic shared memory a block may stage activations in without opting in
 * (the base kernels: no static shared memory); the same for the fused,
 * split-K and persistent kernels, whose own static shared memory (a
 * reduction's 32 floats and a flag) counts in the same 48 KB; the most the
 * persistent kernel opts in to */
#define CU_SMEM_PLAIN (48u * 1024)
#define CU_SMEM_DYN (CU_SMEM_PLAIN - 256)
#define CU_SMEM_PERSIST (160u * 1024)
/* most split-K parts */
#define CU_MAX_SPLITK 8

#ifdef __cplusplus
extern "C" {
#endif

enum cu_cand {
	CU_CAND_BASE = 0,
	CU_CAND_FUSED = 1,
	CU_CAND_PERSIST = 2,
	CU_CAND_SPLITK = 3,
	CU_N_CAND = 4,
};

/* "base", "fused", "persistent", "splitk" */
const char *cu_cand_name(enum cu_cand c);
/* The candidate named s, or -1. */
int cu_cand_parse(const char *s);

/* The candidate of each dtype (indexed by enum kt_dtype, KT_Q6_K + 1
 * entries): the fixed table decided from the GPU runs' logs (docs/PERF.md;
 * base until a run has settled one), then a spec applied over it. */
#define CU_N_DTYPE (KT_Q6_K + 1)
void cu_cand_defaults(int table[CU_N_DTYPE]);
/* spec: a candidate name for every dtype ("fused"), or a comma-separated
 * list of dtype=name ("q4_0=persistent,f16=fused"; dtype names as
 * kt_dtype_name prints them). Returns 0, or -1 (table untouched) when a
 * name is unknown. */
int cu_cand_spec(const char *spec, int table[CU_N_DTYPE]);

enum cu_kind {
	CU_K_RMSNORM,         /* arg 0: attention norm, x -> xb; 1: ffn norm */
	CU_K_QUANT_X,         /* arg 0: xb, 1: att, 2: hb to 8-bit blocks */
	CU_K_GEMV_QKV,        /* q, k, v = xb Wq/Wk/Wv^T */
	CU_K_ROPE,
	CU_K_KV_STORE,
	CU_K_ATTN,
	CU_K_ATTN_COMBINE,
	CU_K_GEMV_ADD,        /* arg 0: x += att Wo^T; 1: x += hb W2^T */
	CU_K_GEMV_SWIGLU,     /* hb = silu(xb W1^T) * (xb W3^T) */
	CU_K_NORM_QKV_ROPE_KV,/* fused: norm of x, q/k/v, RoPE, KV store */
	CU_K_QKV_ROPE_KV,     /* fused from xb (the norm did not fit) */
	CU_K_NORM_SWIGLU,     /* fused: norm of x, gate/up, SwiGLU */
	CU_K_SPLITK_ADD,      /* arg as GEMV_ADD, split along K */
	CU_K_LAYER,           /* the persistent kernel: every phase */
	CU_N_KIND,
};

const char *cu_kind_name(enum cu_kind k);

/* The shape a plan is made for. */
struct cu_shape {
	int dim, n_heads, n_kv_heads, hd, ffn;
	int n_tok;           /* rows of the batch */
	int n_tiles;         /* attention tiles (n_tok when single_rows) */
	int single_rows;     /* decode: every row its own sequence's only row */
	enum kt_dtype dt;    /* the dtype of all seven matrices */
	int qx;              /* Q8_0 / Q4_0 products take 8-bit activations */
	int n_sm;
	int persist_blocks;  /* resident blocks of the persistent kernel (0: none) */
	int ctx;             /* positions a row attends (bytes estimate only) */
	enum kt_dtype kv_dt; /* the KV pool's element type (KT_F32: 0) */
};

struct cu_step {
	enum cu_kind kind;
	int arg;
	unsigned grid[3], block;
	size_t smem;
	double bytes;        /* bytes read from memory (weights, activations, KV) */
	int splits;          /* attention splits (ATTN, LAYER); K parts (SPLITK_ADD) */
	int syncs;           /* grid-wide barriers (LAYER) */
};

#define CU_PLAN_MAX 16

struct cu_plan {
	enum cu_cand cand;   /* the candidate planned (after fallbacks) */
	int n;
	struct cu_step s[CU_PLAN_MAX];
};

/* Plan one layer of candidate `want` for shape sh. Returns 0, or -1 when
 * no plan applies (too many rows: the ops path runs). */
int cu_plan_layer(enum cu_cand want, const struct cu_shape *sh, struct cu_plan *p);
/* Shared memory of the persistent kernel for a layer of shape sh. */
size_t cu_plan_persist_smem(const struct cu_shape *sh);
/* Sum of bytes over a plan's steps. */
double cu_plan_bytes(const struct cu_plan *p);
/* One line per step into buf ("  3 gemv_qkv grid=1536 ..."), for logs and
 * the plan test. Returns buf. */
char *cu_plan_format(const struct cu_plan *p, char *buf, size_t size);

#ifdef __cplusplus
}
#endif

/* ---- helpers shared with the kernels ---- */

/* Attention splits so that units x heads x splits fills the GPU twice
 * over, within the partials' room. Independent of the context length on
 * purpose: a recorded graph replays at every length. */
CU_FN int cu_attn_split(int units, int n_heads, int hd, int n_tok, int n_sm)
{
	int want = (2 * n_sm + units * n_heads - 1) / (units * n_heads);
	if (want > CU_MAX_SPLIT)
		want = CU_MAX_SPLIT;
	while (want > 1 && (size_t)n_tok * n_heads * want * (hd + 2) > CU_PART_FLOATS)
		want--;
	return want < 1 ? 1 : want;
}

/* K parts of a split-K product of rows x cols (Q8_0 / Q4_0): enough blocks
 * (CU_GW rows each) for four per SM, each part at least 32 blocks of 32
 * weights (one per lane). */
CU_FN int cu_splitk_parts(int rows, int cols, int n_sm)
{
	int groups = (rows + CU_GW - 1) / CU_GW, nb = cols / 32;
	int s = (4 * n_sm + groups - 1) / groups, most = nb / 32;
	if (s > most)
		s = most;
	if (s > CU_MAX_SPLITK)
		s = CU_MAX_SPLITK;
	return s < 1 ? 1 : s;
}

/* Blocks of 32 weights [b0, b1) of part s of S over nb blocks. */
CU_FN void cu_splitk_range(int nb, int s, int S, int *b0, int *b1)
{
	*b0 = (int)((long)nb * s / S);
	*b1 = (int)((long)nb * (s + 1) / S);
}

/* How a matrix-vector block stages its activations (gemv.cuh's stage_x). */
enum {
	XS_NONE = -1,  /* not staged: x read from global memory */
	XS_F32 = 0,    /* fp32 rows as they are */
	XS_NORM = 1,   /* fp32 rows RMS-normalized */
	XS_Q8 = 2,     /* 8-bit blocks copied from cu_quant_x's output */
	XS_QIN = 3,    /* 8-bit blocks of x made here (a slice of nb for split-K) */
	XS_QNORM = 4,  /* 8-bit blocks of the normalized x made here */
};

/* Shared memory stage_x takes for n_tok rows of cols: fp32, or nb blocks
 * of 32 as 8-bit codes, a scale and a sum each. */
CU_FN size_t cu_stage_bytes(int src, int n_tok, int cols, int nb)
{
	if (src == XS_F32 || src == XS_NORM)
		return (size_t)n_tok * cols * 4;
	return (size_t)n_tok * nb * 40;
}

/* Shared memory of a decode attention unit (CU_PW warps): the query and
 * each warp's partial (max, sum, hd weighted values). */
CU_FN size_t cu_attn_decode_smem(int hd)
{
	return ((size_t)hd + CU_PW * ((size_t)hd + 2)) * sizeof(float);
}

/* Shared memory of the persistent kernel: the widest vector a phase stages
 * (fp32, or 8-bit with scales and sums) or a decode attention unit's. */
CU_FN size_t cu_persist_smem(int widest, int hd, int qx)
{
	size_t st = cu_stage_bytes(qx ? XS_QIN : XS_F32, 1, widest, widest / 32);
	size_t at = cu_attn_decode_smem(hd);
	return st > at ? st : at;
}

/* One rotation pair (or, for v, two consecutive rows) of the fused q/k/v
 * product: warp job g. Matrix m (0 q, 1 k, 2 v), weight rows r0, r1, the
 * output channels c0, c0 + 1 of that matrix's row, frequency index fi. */
struct cu_pair {
	int m, r0, r1, c0, fi;
};

/* Job g of q_rows + k_rows + v_rows rows (each a multiple of hd, hd even)
 * in pairs; 0 when g is past the last. RoPE takes the pairs (2i, 2i+1) of
 * a head (interleaved) or (i, i + hd/2) (half layout) and always writes
 * the interleaved layout: channels h*hd + 2i, 2i + 1. */
CU_FN int cu_qkv_pair(int g, int q_rows, int k_rows, int v_rows, int hd, int half,
		      struct cu_pair *p)
{
	int nq = q_rows / 2, nk = k_rows / 2, nv = v_rows / 2;
	if (g < 0 || g >= nq + nk + nv)
		return 0;
	if (g >= nq + nk) {
		p->m = 2;
		p->c0 = 2 * (g - nq - nk);
		p->r0 = p->c0;
		p->r1 = p->c0 + 1;
		p->fi = 0;
		return 1;
	}
	p->m = g < nq ? 0 : 1;
	int j = g < nq ? g : g - nq, h = j / (hd / 2), i = j % (hd / 2);
	p->fi = i;
	p->c0 = h * hd + 2 * i;
	p->r0 = half ? h * hd + i : p->c0;
	p->r1 = half ? h * hd + i + hd / 2 : p->c0 + 1;
	return 1;
}

/* RoPE's rotation of the pair (a, b) by the angle with cosine c, sine s:
 * the CPU backend's expressions. */
CU_FN void cu_rope_rot(float a, float b, float c, float s, float *o0, float *o1)
{
	*o0 = a * c - b * s;
	*o1 = a * s + b * c;
}

/* Offsets (elements from the pool's base: floats, or f16 values, whose
 * store has the same element layout) of K channel ch / V channel ch of
 * (block, layer, row r): K is stored transposed per (block, layer),
 * [kv_dim][bs], V row-major [bs][kv_dim] after it (kernels/backend.h). */
CU_FN size_t cu_kv_k_off(int32_t block, int n_layers, int layer, int bs, int kv_dim, int ch,
			 int r)
{
	size_t span = (size_t)bs * kv_dim;
	return ((size_t)block * n_layers + layer) * 2 * span + (size_t)ch * bs + r;
}

CU_FN size_t cu_kv_v_off(int32_t block, int n_layers, int layer, int bs, int kv_dim, int ch,
			 int r)
{
	size_t span = (size_t)bs * kv_dim;
	return (((size_t)block * n_layers + layer) * 2 + 1) * span + (size_t)r * kv_dim + ch;
}

/* ---- the typed KV store (kernels/backend.h: kv->dtype f32, f16, q8_0) ----
 *
 * Byte offsets that hold for every element type, and the conversions of
 * the CPU's kt_kv_put (kernels/convert.c) written once for the kernels and
 * the CPU test: compiled for the device they use the CUDA intrinsics that
 * round the same way (__float2half_rn: to nearest even; rintf: ties to
 * even; IEEE division, no fast-math), compiled as C the CPU's own
 * functions, so test_cuplan checks the arithmetic around them and
 * llamad-gpucheck the bytes a GPU writes. Written 2026-12-03 without a GPU:
 * the device side has never run. */

/* Bytes of one K or V span of (block, layer) (kt_kv_span_bytes): bs x
 * kv_dim elements, then for q8_0 the f16 scales, bs x kv_dim / group. */
CU_FN size_t cu_kv_span_bytes(int dt, int bs, int kv_dim, int group)
{
	size_t n = (size_t)bs * kv_dim;
	if (dt == KT_Q8_0)
		return n + (size_t)bs * (size_t)(kv_dim / group) * 2;
	return n * (dt == KT_F16 ? 2 : 4);
}

/* Byte offset from the pool's base of the K (which 0) or V (which 1) span
 * of (block, layer), spans of span bytes. */
CU_FN size_t cu_kv_span_off(int32_t block, int n_layers, int layer, int which, size_t span)
{
	return (((size_t)block * n_layers + layer) * 2 + which) * span;
}

/* q8_0: index among a span's scales (after its bs x kv_dim codes) of the
 * scale of group g at row r: K's channel-major as its codes, V's row-major. */
CU_FN size_t cu_kv_k_scale(int bs, int g, int r)
{
	return (size_t)g * bs + r;
}

CU_FN size_t cu_kv_v_scale(int kv_dim, int group, int g, int r)
{
	return (size_t)r * (kv_dim / group) + g;
}

/* f16 bits of f rounded to nearest even, as kt_f32_to_f16 (overflow to
 * infinity; a NaN becomes the quiet NaN 0x7e00 with f's sign, which the
 * device's conversion would not give by itself). */
CU_FN uint16_t cu_f16_bits(float f)
{
#ifdef __CUDA_ARCH__
	if (f != f)
		return (uint16_t)((__float_as_uint(f) >> 16 & 0x8000u) | 0x7e00u);
	return __half_as_ushort(__float2half_rn(f));
#else
	return kt_f32_to_f16(f);
#endif
}

/* The value of f16 bits h (exact). */
CU_FN float cu_f16_val(uint16_t h)
{
#ifdef __CUDA_ARCH__
	return __half2float(__ushort_as_half(h));
#else
	return kt_f16_to_f32(h);
#endif
}

/* q8_0 K/V, one group of channels of one row (kt_kv_q8_group): amax folds
 * in |x| skipping NaN (the group's largest magnitude, from 0; fold partial
 * maxima the same way, in any order); the scale's f16 bits are those of
 * amax / 127; the codes are taken against the stored scale, with inv its
 * correctly rounded inverse (0 for a zero scale): round-to-nearest-even
 * of x * inv, clamped to +-127, 0 for a NaN. */
CU_FN float cu_kv_amax(float amax, float x)
{
	float a = fabsf(x);
	return a > amax ? a : amax;
}

CU_FN uint16_t cu_kv_q8_scale(float amax)
{
	return cu_f16_bits(amax / 127.0f);
}

CU_FN float cu_kv_q8_inv(uint16_t scale)
{
	float d = cu_f16_val(scale);
	return d != 0 ? 1.0f / d : 0.0f;
}

CU_FN int8_t cu_kv_q8_code(float x, float inv)
{
	float r = rintf(x * inv);
	return (int8_t)(r != r ? 0 : r > 127 ? 127 : r < -127 ? -127 : r);
}

/* The 8-bit form of one activation given its block's largest magnitude
 * amax: scale d = amax / 127, q = round-to-nearest-even(v / d). */
CU_FN float cu_qx_scale(float amax)
{
	return amax / 127.f;
}

CU_FN int cu_qx_code(float v, float d)
{
	return d > 0.f ? (int)rintf(v / d) : 0;
}

#endif

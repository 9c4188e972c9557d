/*
 * kernels/backend.h — the numeric ops of the forward pass behind one interface.
 *
 * A backend knows nothing of sessions, sockets, protobuf or files. It sees
 * dense activation buffers (fp32, row-major, one row per token), weight
 * matrices (struct kt_weight) and a paged KV store addressed through block
 * tables. Every op computes each output row with a fixed reduction order, so a
 * row's result never depends on how many other rows share the call (batch
 * invariance: greedy output is the same alone or under load).
 *
 * The CPU backend (kernels/cpu/) is the reference and is always built. A CUDA
 * backend (kernels/cuda/) plugs into the same table when it is compiled in.
 */
#ifndef LLAMAD_KERNELS_BACKEND_H
#define LLAMAD_KERNELS_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "util/dtype.h"

#ifdef __cplusplus
extern "C" {   /* the CUDA backend's .cu files include it */
#endif

/* Dequantize / convert one row of n elements of any dtype to fp32. */
void kt_row_to_f32(enum kt_dtype t, const void *row, float *out, size_t n);
/*
 * The integer form of one block of a quantized dtype (KT_QBLOCK weights for
 * Q8_0 / Q4_0, KT_QK_K for the K-quants): unsigned codes u[] and scales
 * (d, dmin as f16 bits) such that weight i, in sub-block j = i / 32, is
 *   Q8_0: d * (u - 128)              Q4_0: d * (u - 8)
 *   Q4_K, Q5_K: (d * sc[j]) * u - dmin * m[j]     (u < 16, < 32; sc, m < 64)
 *   Q6_K: (d * sc[i / 16]) * (u - 32)             (u < 64; sc int8)
 * kt_row_to_f32 computes exactly these fp32 expressions.
 */
struct kt_qcodes {
	uint8_t u[KT_QK_K];
	uint16_t d, dmin;
	int sc[16], m[8];
};
void kt_block_codes(enum kt_dtype t, const void *block, struct kt_qcodes *q);
/* Quantize n fp32 values (n a multiple of KT_QBLOCK) to Q8_0 / Q4_0, with
 * the round-to-nearest scheme of the GGML reference quantizers. */
void kt_quantize_q8_0(const float *x, void *out, size_t n);
void kt_quantize_q4_0(const float *x, void *out, size_t n);
/* Quantize n fp32 values (n a multiple of KT_QK_K) to Q4_K / Q5_K / Q6_K
 * with a simple min/max scheme (not GGML's optimizing search): per
 * sub-block the smallest scale (and, Q4_K/Q5_K, offset) covering its range,
 * the super-block scales chosen so no 6-bit (8-bit for Q6_K) sub-block
 * scale clamps, each weight rounded to nearest. Every weight is then within
 * half a step (d*sc/2, and dmin/2 for the offset) of its input, up to fp32
 * rounding. */
void kt_quantize_q4_k(const float *x, void *out, size_t n);
void kt_quantize_q5_k(const float *x, void *out, size_t n);
void kt_quantize_q6_k(const float *x, void *out, size_t n);

/* A weight matrix W of shape (rows, cols), row-major, rows contiguous
 * (row stride == cols). Used as y = x W^T: cols is the input width. */
struct kt_weight {
	const void *data;
	enum kt_dtype dtype;
	int rows, cols;
	/* the backend's own form of the matrix for matmul (the CPU backend's
	 * row-interleaved quantized layout), or NULL: set by weight_place */
	void *pack;
};

/* What a placed weight is used for (weight_place). */
#define KT_USE_MATMUL 1  /* as W in matmul */
#define KT_USE_ROWS 2    /* rows read by embed */

/*
 * Paged KV store. Memory is n_blocks blocks; a block holds block_size
 * positions of K and V for every layer, as two spans per layer of
 * kt_kv_span_bytes() each:
 *   block b, layer l: K at base + ((b*n_layers + l)*2 + 0) * span
 *                     V at base + ((b*n_layers + l)*2 + 1) * span
 * K is stored transposed, channel-major: element (row r, channel c) at
 * [c*block_size + r], so attention scores a whole block of positions with
 * vector FMAs and no horizontal sums. V is row-major: [r*kv_dim + c].
 * Position p of a sequence lives in block table[p/block_size] at row
 * p%block_size. A block is one contiguous span of kt_kv_block_bytes(), which
 * is what copy-on-write, eviction and saving move.
 *
 * Elements are of kv->dtype:
 *   KT_F32, KT_F16: one value per element at the index above (f16: IEEE
 *     half bits, rounded to nearest even when stored).
 *   KT_Q8_0: an int8 code per element at the index above, then, after the
 *     block_size*kv_dim codes of the span, f16 scales: one per position and
 *     group of `group` consecutive channels (group divides head_dim, so a
 *     group never straddles two heads): K's scale of (r, group g) at
 *     [g*block_size + r] (channel-major like K), V's at
 *     [r*(kv_dim/group) + g]. Value = scale * code. A group is quantized
 *     much as GGML's q8_0 is: scale = f16(max|x| / 127), code =
 *     round-to-nearest-even(x * (1/scale)) clamped to +-127 (0 when the
 *     scale is 0): the code is taken against the stored (f16) scale, so a
 *     value is within half a step of its input. One scale per
 *     position (not per channel over the block's positions) because
 *     positions are written one at a time as tokens come and a stored code
 *     never changes; groups of 32 channels as in q8_0 (8 or 16 for a head
 *     narrower than 32, e.g. stories260K's 8).
 * Zero-initialized (dtype 0, group 0) is the f32 store.
 */
struct kt_kv {
	void *base;
	int n_blocks;
	int block_size;
	int n_layers;
	int kv_dim;       /* n_kv_heads * head_dim */
	enum kt_dtype dtype;  /* KT_F32, KT_F16 or KT_Q8_0 */
	int group;        /* KT_Q8_0: channels per scale; else unused */
};

/* The group kt_kv uses for head dimension hd (32, 16 or 8, the largest
 * that divides hd), or 0 when hd is not a multiple of 8 (then KT_Q8_0 is
 * not available). */
int kt_kv_group_for(int hd);
/* 1 if dtype can be a KV element type with head dimension hd. */
int kt_kv_dtype_ok(enum kt_dtype dtype, int hd);
/* Bytes of one K or V span of one layer of one block. */
size_t kt_kv_span_bytes(const struct kt_kv *kv);
/* Bytes one block occupies. */
size_t kt_kv_block_bytes(const struct kt_kv *kv);
/* Bytes one position takes across all layers (block bytes / block_size,
 * scales included). */
double kt_kv_token_bytes(const struct kt_kv *kv);
/* Start of block b (all its layers). */
void *kt_kv_block(const struct kt_kv *kv, int32_t block);
/* Start of the K span of (block, layer): the codes, then (Q8_0) scales. */
void *kt_kv_kt(const struct kt_kv *kv, int32_t block, int layer);
/* Start of the V span of (block, layer). */
void *kt_kv_vspan(const struct kt_kv *kv, int32_t block, int layer);
/* The K / V row of (block, layer, row) as fp32 (kv_dim floats). */
void kt_kv_get_k(const struct kt_kv *kv, int32_t block, int layer, int row, float *out);
void kt_kv_get_v(const struct kt_kv *kv, int32_t block, int layer, int row, float *out);
/* Store the fp32 rows k and v (kv_dim floats each) at (block, layer, row),
 * converted to kv->dtype. */
void kt_kv_put(const struct kt_kv *kv, int32_t block, int layer, int row, const float *k,
	       const float *v);
/* Quantize n fp32 values (one group) to int8 codes as the KT_Q8_0 store
 * does; returns the scale's f16 bits. */
uint16_t kt_kv_q8_group(const float *x, int8_t *codes, int n);

/* RoPE pair layout of the Q/K projections as stored in the weights. */
enum kt_rope_layout {
	KT_ROPE_INTERLEAVED = 0, /* pairs (2i, 2i+1): llama2.c, Meta, GGUF */
	KT_ROPE_HALF = 1,        /* pairs (i, i+hd/2): Hugging Face rotate_half */
};

/* One attention row: the query of one token, at position pos of its sequence,
 * attending to positions [0, pos] of that sequence's KV. */
struct kt_attn_row {
	const int32_t *block_table;
	int pos;
};

/* One layer's weights and shape, for a backend's layer op. */
struct kt_layer {
	const float *att_norm, *ffn_norm;
	const struct kt_weight *wq, *wk, *wv, *wo, *w1, *w2, *w3;
	int dim, n_heads, n_kv_heads, head_dim, ffn_dim;
	float eps;
	const float *inv_freq;
	enum kt_rope_layout layout;
};

/* The activation buffers of a layer (backend memory): the residual stream
 * x (n_tok x dim) and scratch the ops use. */
struct kt_layer_bufs {
	float *x, *xb, *q, *k, *v, *att, *hb, *hb2;
	const int *pos;
	const struct kt_attn_row *rows;
};

struct backend;

struct backend_ops {
	const char *name;
	/* y[t][r] = sum_c x[t][c] * W[r][c]  for t < n_tok, r < W.rows.
	 * x: (n_tok, W.cols) fp32; y: (n_tok, W.rows) fp32. */
	void (*matmul)(struct backend *be, float *y, const float *x,
		       const struct kt_weight *w, int n_tok);
	/* y[t] = x[t] * rsqrt(mean(x[t]^2) + eps) * w, fp32, rows of width n. */
	void (*rmsnorm)(struct backend *be, float *y, const float *x,
			const float *w, int n, int n_tok, float eps);
	/* Rotate q (n_tok, n_heads*hd) and k (n_tok, n_kv_heads*hd) in place for
	 * positions pos[t]; inv_freq has hd/2 entries. Input pairs are taken in
	 * `layout`; output is always in the interleaved layout. */
	void (*rope)(struct backend *be, float *q, float *k, const int *pos,
		     int n_tok, int n_heads, int n_kv_heads, int hd,
		     const float *inv_freq, enum kt_rope_layout layout);
	/* Write k, v rows (n_tok, kv_dim) of layer `layer` into the KV store at
	 * each row's (block_table, pos). */
	void (*kv_store)(struct backend *be, const struct kt_kv *kv, int layer,
			 const float *k, const float *v,
			 const struct kt_attn_row *rows, int n_tok);
	/* Causal attention: out[t] (n_heads*hd) for query q[t] over positions
	 * [0, rows[t].pos] of layer `layer`; GQA maps query head h to kv head
	 * h / (n_heads / n_kv_heads). Scores scaled by 1/sqrt(hd), softmax fp32. */
	void (*attention)(struct backend *be, float *out, const float *q,
			  const struct kt_kv *kv, int layer,
			  const struct kt_attn_row *rows, int n_tok,
			  int n_heads, int n_kv_heads, int hd);
	/* g[i] = silu(g[i]) * u[i] for i < n. */
	void (*silu_mul)(struct backend *be, float *g, const float *u, size_t n);
	/* y[i] += x[i] for i < n. */
	void (*add)(struct backend *be, float *y, const float *x, size_t n);
	/* y[t] = row tok[t] of the embedding table, converted to fp32. */
	void (*embed)(struct backend *be, float *y, const struct kt_weight *table,
		      const int32_t *tok, int n_tok);
	/* Prepare for sequences of up to max_pos positions and batches of up
	 * to max_tokens rows, so that no op allocates while running. Returns 0
	 * or -ENOMEM. */
	int (*reserve)(struct backend *be, int max_pos, int max_tokens);
	void (*free)(struct backend *be);

	/*
	 * Memory the ops read and write ("backend memory"): activations, the
	 * KV pool, placed weights. Host memory on the CPU backend, device
	 * memory on CUDA. mem_alloc returns NULL when out of memory; copies
	 * return 0 or -EIO once the backend has failed (a sticky device error:
	 * see `failed`). Downloads wait for every op queued before them.
	 */
	void *(*mem_alloc)(struct backend *be, size_t bytes);
	void (*mem_free)(struct backend *be, void *p);
	int (*upload)(struct backend *be, void *dst, const void *host_src, size_t bytes);
	int (*download)(struct backend *be, void *host_dst, const void *src, size_t bytes);
	int (*copy)(struct backend *be, void *dst, const void *src, size_t bytes);
	/* Make dst a copy of src in backend memory, possibly in another dtype
	 * or layout that only this backend's matmul/embed read (CUDA: f32 to
	 * f16, quantized blocks repacked). `use` (KT_USE_*) says which ops
	 * will read it. The CPU backend aliases src, and for matmul adds its
	 * row-interleaved form of quantized matrices (dst->pack). Returns 0,
	 * -ENOMEM or -EIO. */
	int (*weight_place)(struct backend *be, struct kt_weight *dst,
			    const struct kt_weight *src, int use);
	void (*weight_release)(struct backend *be, struct kt_weight *w);
	/* Stage one batch before its ops run: the ops that take tok, pos or
	 * rows until the next batch_begin are called with exactly these
	 * arrays, so a device backend uploads them once here. NULL: nothing
	 * to stage. */
	int (*batch_begin)(struct backend *be, const struct kt_kv *kv, const int32_t *tok,
			   const int *pos, const struct kt_attn_row *rows, int n_tok);
	/*
	 * Optional replay of recorded batches (CUDA graphs), keyed by (owner,
	 * key). graph_replay runs the ops recorded under the key against the
	 * staged batch and returns 1, or returns 0 when nothing usable is
	 * recorded. Then the caller may bracket the ops with
	 * graph_record_begin / graph_record_end: that records them, and
	 * graph_record_end runs them once and returns 0, or returns nonzero
	 * when recording failed and nothing ran (the caller runs the ops again,
	 * unrecorded). A recording holds the buffers and the KV pool of its
	 * batch: an owner must reuse them for the same key. NULL: no recording.
	 */
	int (*graph_replay)(struct backend *be, const void *owner, int key);
	void (*graph_record_begin)(struct backend *be, const void *owner, int key);
	int (*graph_record_end)(struct backend *be, const void *owner, int key);
	/* Free and total bytes of device memory; NULL on host memory. */
	int (*mem_info)(struct backend *be, size_t *free_b, size_t *total_b);
	/*
	 * Optional fused forms of matmul, fewer passes over the activations
	 * and fewer launches (NULL: forward.c composes them from the ops
	 * above). matmul_n: y[i] = x W[i]^T for n <= 3 weights sharing x;
	 * matmul_add: y += x W^T; matmul_swiglu: h = silu(x G^T) * (x U^T).
	 */
	void (*matmul_n)(struct backend *be, int n, float *const *y,
			 const struct kt_weight *const *w, const float *x, int n_tok);
	void (*matmul_add)(struct backend *be, float *y, const float *x,
			   const struct kt_weight *w, int n_tok);
	void (*matmul_swiglu)(struct backend *be, float *h, const float *x,
			      const struct kt_weight *gate, const struct kt_weight *up, int n_tok);
	/*
	 * Optional: one whole transformer layer over the staged batch, as the
	 * ops above compose it in model/forward.c (x += attention(norm(x));
	 * x += ffn(norm(x)); the KV of layer `layer` stored). Returns 1 when it
	 * ran, 0 when the caller must run the ops one by one (the backend has
	 * no layer form for this batch). NULL: always the ops.
	 */
	int (*layer)(struct backend *be, const struct kt_kv *kv, int layer,
		     const struct kt_layer *L, const struct kt_layer_bufs *b, int n_tok);
};

struct backend {
	const struct backend_ops *ops;
	int n_threads;
	int host_mem;      /* backend memory is plain host memory */
	volatile int failed;  /* a sticky device error: every later call fails */
	char desc[96];     /* for logs and status: "cpu, 2 threads, avx512" */
	unsigned kv_types; /* bit 1 << dtype for each KV element type its ops
			    * store and attend over (kernels/backend.h) */
};

/* Levels of the backends' messages: the values of daemon/log.h's LL_*. */
enum backend_log_level {
	BACKEND_LOG_ERROR = 0,
	BACKEND_LOG_WARN = 1,
	BACKEND_LOG_INFO = 2,
	BACKEND_LOG_DEBUG = 3,
};

/* Send the backends' messages (a device error, a fallback they take) to fn:
 * it gets a level and one line without a newline ("cuda: ..."). NULL, the
 * default, prints "llamad: LINE" on stderr (the tests and tools). Set it
 * before any backend opens; it is read, not locked, from the threads that
 * run ops. */
void backend_set_log(void (*fn)(int level, const char *msg));
/* Format a message as printf does and hand it to the hook of
 * backend_set_log() (for the backends themselves). */
void backend_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* 1 if the environment variable name is set to something other than "" or
 * a string starting with '0' (the backends' LLAMAD_* switches). */
int backend_env_flag(const char *name);

/* Which backend backend_open() makes. */
enum backend_kind {
	BACKEND_AUTO = 0,  /* CUDA when a usable GPU is there, else the CPU */
	BACKEND_CPU = 1,
	BACKEND_CUDA = 2,
};

/* Device weight dtype of the CUDA backend for f32/f16/bf16 matrices. */
enum backend_wtype {
	BACKEND_W_F16 = 0, /* f32 and f16 as f16; bf16 stays bf16 */
	BACKEND_W_BF16 = 1,/* f32 and bf16 as bf16; f16 stays f16 */
	BACKEND_W_F32 = 2, /* as in the file (f32 stays f32) */
};

struct backend_opts {
	enum backend_kind kind;
	int n_threads;     /* CPU workers (<= 0: all cores) */
	int gpu;           /* CUDA device ordinal */
	enum backend_wtype wtype;
};

/* The KV element type be can hold for heads of hd channels: want, or when
 * it cannot (not in be->kv_types, or kt_kv_dtype_ok fails) f16, else f32,
 * with *why set to the reason ("on this backend", "for this head
 * dimension"); *why NULL when want is kept. */
enum kt_dtype backend_kv_type(const struct backend *be, enum kt_dtype want, int hd,
			      const char **why);

/* Create the backend opts asks for. NULL with *cause (malloc'd) when the
 * CUDA backend was asked for and no usable GPU is there (or the build has
 * no CUDA backend), or on ENOMEM. When BACKEND_AUTO falls back to the CPU,
 * *note (malloc'd; note may be NULL) says why the GPU was not used. */
struct backend *backend_open(const struct backend_opts *opts, char **cause, char **note);
/* Free and total bytes of backend memory (CUDA: the device's); -ENOSYS on
 * host memory. */
int backend_mem_info(struct backend *be, size_t *free_b, size_t *total_b);

/* Create the CPU backend with n_threads workers (<= 0: all online cores).
 * Returns NULL on ENOMEM. Free with backend_free(). */
struct backend *backend_cpu_new(int n_threads);
/* Create the CUDA backend on device `gpu` (only in builds with CUDA).
 * NULL with *cause (malloc'd) when no usable device is there. */
struct backend *backend_cuda_new(int gpu, enum backend_wtype wtype, char **cause);
/* The CUDA backend's layer kernels (a diagnostic, for llamad-gpucheck):
 * spec as LLAMAD_CUDA_KERNELS takes it (llamad(8)). 0, -EINVAL for a spec
 * not understood, -ENOSYS when be is not the CUDA backend. */
int backend_cuda_set_kernels(struct backend *be, const char *spec);
/* Destroy a backend; accepts NULL. */
void backend_free(struct backend *be);

/* fp16 / bf16 <-> fp32 scalar conversions (exact, round-to-nearest-even). */
float kt_f16_to_f32(uint16_t h);
uint16_t kt_f32_to_f16(float f);
float kt_bf16_to_f32(uint16_t h);
uint16_t kt_f32_to_bf16(float f);

#ifdef __cplusplus
}
#endif

#endif

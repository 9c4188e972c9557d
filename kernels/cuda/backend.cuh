/*
 * kernels/cuda/backend.cuh — private to the CUDA backend's host side: its
 * state (struct cu_backend) and what its files call of each other.
 *   backend.cu   the op table; open, reserve, close
 *   error.cu     sticky errors, the launch error of cu_launch_pdl
 *   mem.cu       device memory, host <-> device copies, scratch growth
 *   weights.cu   weight upload, Q8_0 / Q4_0 repacking, the K-quant check
 *   stage.cu     batch staging
 *   graph.cu     CUDA graph record and replay
 *   ops.cu       the ops (cuBLAS, or the launchers of the per-op files)
 *   candidates/layer_op.cu  the layer op executing a candidate's plan
 *                (plan.h)
 *
 * Everything runs on one stream in issue order, so ops need no events
 * between them; downloads synchronize. cuBLAS is loaded with dlopen when the
 * backend is created, so a build with CUDA runs (on the CPU) where the
 * library is missing. Any CUDA error other than a failed allocation marks
 * the backend failed (be->failed): every later copy returns -EIO and the
 * daemon exits for systemd to restart it.
 */
#ifndef LLAMAD_KERNELS_CUDA_BACKEND_CUH
#define LLAMAD_KERNELS_CUDA_BACKEND_CUH

#include <cublas_v2.h>

#include "kernels/cuda/cuda.cuh"

/* cuBLAS entry points, resolved at run time */
struct cublas_fns {
	void *lib;
	decltype(&cublasCreate_v2) create;
	decltype(&cublasDestroy_v2) destroy;
	decltype(&cublasSetStream_v2) set_stream;
	decltype(&cublasSetWorkspace_v2) set_workspace;
	decltype(&cublasSetMathMode) set_math_mode;
	cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
				  int, const void *, const void *, cudaDataType, int, const void *,
				  cudaDataType, int, const void *, void *, cudaDataType, int,
				  cublasComputeType_t, cublasGemmAlgo_t);
	decltype(&cublasSgemm_v2) sgemm;
	cublasStatus_t (*gemm_batched)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
				       int, int, const void *, const void *, cudaDataType, int,
				       long long, const void *, cudaDataType, int, long long,
				       const void *, void *, cudaDataType, int, long long, int,
				       cublasComputeType_t, cublasGemmAlgo_t);
};

struct cu_graph {
	const void *owner;
	int key;
	const void *kv_base;      /* the pool it was recorded with: base, element */
	int kv_dt, kv_group;      /* type and q8_0 group (its kernels depend on them) */
	cudaGraphExec_t exec;
};

struct cu_backend {
	struct backend be;
	int dev, n_sm;
	enum backend_wtype wtype;
	cudaStream_t stream;
	struct cublas_fns cb;
	cublasHandle_t blas;
	void *blas_ws;
	/* batch staging: pinned host copy and its device twin, fixed offsets */
	int cap_tok, max_pos, tab_stride;
	size_t stage_ints;
	int32_t *h_stage, *d_stage;
	cudaEvent_t staged;       /* the last staging copy has been read */
	struct cu_batch batch;
	struct cu_run runs[CU_MAX_RUNS];  /* big runs of the staged batch */
	int n_runs, big_run;      /* big_run: rows from which a run takes GEMMs (0: never) */
	void *att;                /* scratch of the GEMM form of attention */
	size_t att_bytes;
	const int32_t *h_tok;     /* the host arrays of the staged batch */
	const void *kv_base;      /* its KV pool: base, element type, q8_0 group */
	int kv_dt, kv_group;
	/* scratch */
	void *xh;                 /* activations as f16 / bf16 for cuBLAS */
	size_t xh_bytes;
	__half *wh;               /* a quantized matrix as f16 for cuBLAS */
	size_t wh_bytes;
	float *part;              /* attention split partials */
	float *tmp;               /* the up projection of matmul_swiglu */
	size_t tmp_bytes;
	void *xq;                 /* activations as 8 bits for Q8_0 / Q4_0 */
	size_t xq_bytes;
	int q8_act;               /* quantize activations for Q8_0 / Q4_0 */
	/* K-quants (Q4_K, Q5_K, Q6_K): 0 not yet checked, 1 kept in the file's
	 * blocks, -1 expanded to wtype (kq_check, LLAMAD_CUDA_KQ_F16) */
	int kq[3];
	size_t max_cols, max_rows, max_qelems;
	/* layer candidates (plan.h): per dtype; logged once each; split-K
	 * partials and counters; resident blocks of the persistent kernel per
	 * dtype, -1 not yet known */
	int cand[CU_N_DTYPE], cand_said[CU_N_DTYPE];
	float *skpart;
	unsigned *skcount;
	size_t skpart_bytes, skcount_bytes;
	int persist[CU_N_DTYPE];
	size_t persist_smem[CU_N_DTYPE];
	unsigned placed;          /* bit per dtype of the matrices placed */
	/* graphs */
	struct cu_graph *graphs;
	int n_graphs, cap_graphs;
	int capturing, graphs_off;
};

#define CB(be) ((struct cu_backend *)(be))

/* error.cu. ck, blas_ck: 0 on success; -ENOMEM for a failed allocation
 * (the caller's to report); else -EIO, the backend failed and what logged
 * once. launched: ck of the launch just made for op (cu_launch_pdl's noted
 * error, else cudaGetLastError). */
int ck(struct cu_backend *c, cudaError_t e, const char *what);
void launched(struct cu_backend *c, const char *op);
int blas_ck(struct cu_backend *c, cublasStatus_t s, const char *what);

/* mem.cu: the memory entries of the op table (backend.h's contracts); grow:
 * a device scratch buffer to at least need bytes, its contents lost, 0 or
 * ck's error (-EIO while recording a graph). */
void *cu_mem_alloc(struct backend *be, size_t bytes);
void cu_mem_free(struct backend *be, void *p);
int cu_upload(struct backend *be, void *dst, const void *src, size_t bytes);
int cu_download(struct backend *be, void *dst, const void *src, size_t bytes);
int cu_copy(struct backend *be, void *dst, const void *src, size_t bytes);
int cu_mem_info(struct backend *be, size_t *free_b, size_t *total_b);
int grow(struct cu_backend *c, void **buf, size_t *cap, size_t need);

/* weights.cu: weight_place and weight_release of the op table (backend.h) */
int cu_weight_place(struct backend *be, struct kt_weight *dst, const struct kt_weight *src,
		    int use);
void cu_weight_release(struct backend *be, struct kt_weight *w);

/* graph.cu: graph_replay, graph_record_begin and _end of the op table
 * (backend.h); drop_graphs destroys every recorded graph (synchronizes). */
void drop_graphs(struct cu_backend *c);
int cu_graph_replay(struct backend *be, const void *owner, int key);
void cu_graph_record_begin(struct backend *be, const void *owner, int key);
int cu_graph_record_end(struct backend *be, const void *owner, int key);

/* stage.cu: stage_alloc, staging for cap rows and tables of stride blocks
 * (the graphs recorded are dropped; 0 or ck's error); batch_begin of the op
 * table (backend.h); staged: 1 when n_tok is the staged batch's rows, else
 * 0 and the backend failed (a caller bug, logged for op). */
int stage_alloc(struct cu_backend *c, int cap, int stride);
int cu_batch_begin(struct backend *be, const struct kt_kv *kv, const int32_t *tok,
		   const int *pos, const struct kt_attn_row *rows, int n);
int staged(struct cu_backend *c, int n_tok, const char *op);

/* ops.cu: q8_blocks, q8_scratch: the 8-bit activation scratch (blocks of
 * 32, and j pointed at it); job_of: the job of n products sharing x; gemv:
 * such a job launched in mode (cu_gemv_job), its scratch grown first; then
 * the ops of the op table (backend.h). */
size_t q8_blocks(const struct cu_backend *c);
void q8_scratch(struct cu_backend *c, struct cu_gemv_job *j);
struct cu_gemv_job job_of(int n, const struct kt_weight *const *w, float *const *y);
void gemv(struct cu_backend *c, int mode, int n, float *const *y,
	  const struct kt_weight *const *w, const float *x, int n_tok);
void cu_op_matmul(struct backend *be, float *y, const float *x, const struct kt_weight *w,
		  int n_tok);
void cu_op_matmul_n(struct backend *be, int n, float *const *y,
		    const struct kt_weight *const *w, const float *x, int n_tok);
void cu_op_matmul_add(struct backend *be, float *y, const float *x,
		      const struct kt_weight *w, int n_tok);
void cu_op_matmul_swiglu(struct backend *be, float *h, const float *x,
			 const struct kt_weight *gate, const struct kt_weight *up, int n_tok);
void cu_op_rmsnorm(struct backend *be, float *y, const float *x, const float *w, int n,
		   int n_tok, float eps);
void cu_op_rope(struct backend *be, float *q, float *k, const int *pos, int n_tok,
		int n_heads, int n_kv_heads, int hd, const float *inv_freq,
		enum kt_rope_layout layout);
void cu_op_kv_store(struct backend *be, const struct kt_kv *kv, int layer, const float *k,
		    const float *v, const struct kt_attn_row *rows, int n_tok);
void cu_op_attention(struct backend *be, float *out, const float *q, const struct kt_kv *kv,
		     int layer, const struct kt_attn_row *rows, int n_tok, int n_heads,
		     int n_kv_heads, int hd);
void cu_op_silu_mul(struct backend *be, float *g, const float *u, size_t n);
void cu_op_add(struct backend *be, float *y, const float *x, size_t n);
void cu_op_embed(struct backend *be, float *y, const struct kt_weight *table,
		 const int32_t *tok, int n_tok);

/* candidates/layer_op.cu: persist_prepare, the persistent kernel's occupancy for the
 * dtypes placed (before any recording); the layer op of the op table
 * (backend.h); set_kernels: the candidates per dtype from spec as
 * LLAMAD_CUDA_KERNELS takes it, 0 or -EINVAL (nothing changed). */
void persist_prepare(struct cu_backend *c);
int cu_op_layer(struct backend *be, const struct kt_kv *kv, int layer,
		const struct kt_layer *L, const struct kt_layer_bufs *b, int n_tok);
int set_kernels(struct cu_backend *c, const char *spec);

#endif

/*
 * kernels/cuda/backend.cu — the CUDA backend: device memory, weight
 * placement, batch staging, CUDA graphs, cuBLAS, and the op table.
 *
 * Everything runs on one stream in issue order, so ops need no events
 * between them; downloads synchronize. cuBLAS is loaded with dlopen when the
 * backend is created, so a build with CUDA runs (on the CPU) where the
 * library is missing. Any CUDA error other than a failed allocation marks
 * the backend failed (be->failed): every later copy returns -EIO and the
 * daemon exits for systemd to restart it.
 */
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
	const float *kv_base;
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
	const float *kv_base;
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

/* Record an error: allocation failures are the caller's to report; any
 * other error is sticky for us. Returns 0 on success. */
static int ck(struct cu_backend *c, cudaError_t e, const char *what)
{
	if (e == cudaSuccess)
		return 0;
	if (e == cudaErrorMemoryAllocation) {
		cudaGetLastError();
		return -ENOMEM;
	}
	if (!c->be.failed)
		backend_log(BACKEND_LOG_ERROR, "cuda: %s: %s", what, cudaGetErrorString(e));
	c->be.failed = 1;
	return -EIO;
}

static thread_local cudaError_t pdl_error = cudaSuccess;  /* this thread's last */

void cu_note_launch_error(cudaError_t e)
{
	pdl_error = e;
}

cudaError_t cu_take_launch_error(void)
{
	cudaError_t e = pdl_error;
	pdl_error = cudaSuccess;
	return e;
}

static void launched(struct cu_backend *c, const char *op)
{
	cudaError_t e = cu_take_launch_error();
	ck(c, e != cudaSuccess ? e : cudaGetLastError(), op);
}

static int blas_ck(struct cu_backend *c, cublasStatus_t s, const char *what)
{
	if (s == CUBLAS_STATUS_SUCCESS)
		return 0;
	if (!c->be.failed)
		backend_log(BACKEND_LOG_ERROR, "cuda: %s: cuBLAS status %d", what, (int)s);
	c->be.failed = 1;
	return -EIO;
}

/* ---- memory ---- */

static void *cu_mem_alloc(struct backend *be, size_t bytes)
{
	void *p = NULL;
	if (CB(be)->capturing || ck(CB(be), cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc"))
		return NULL;
	return p;
}

static void cu_mem_free(struct backend *be, void *p)
{
	(void)be;
	if (p)
		cudaFree(p);
}

static int cu_upload(struct backend *be, void *dst, const void *src, size_t bytes)
{
	struct cu_backend *c = CB(be);
	if (be->failed)
		return -EIO;
	if (ck(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream), "upload"))
		return -EIO;
	return ck(c, cudaStreamSynchronize(c->stream), "upload") ? -EIO : 0;
}

static int cu_download(struct backend *be, void *dst, const void *src, size_t bytes)
{
	struct cu_backend *c = CB(be);
	if (be->failed)
		return -EIO;
	if (ck(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream), "download"))
		return -EIO;
	return ck(c, cudaStreamSynchronize(c->stream), "download") ? -EIO : 0;
}

static int cu_copy(struct backend *be, void *dst, const void *src, size_t bytes)
{
	struct cu_backend *c = CB(be);
	if (be->failed)
		return -EIO;
	return ck(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream),
		  "copy") ? -EIO : 0;
}

static int cu_mem_info(struct backend *be, size_t *free_b, size_t *total_b)
{
	return ck(CB(be), cudaMemGetInfo(free_b, total_b), "cudaMemGetInfo");
}

/* Grow a device scratch buffer (never while recording a graph). */
static int grow(struct cu_backend *c, void **buf, size_t *cap, size_t need)
{
	if (*cap >= need)
		return 0;
	if (c->capturing) {
		ck(c, cudaErrorStreamCaptureUnsupported, "scratch growth while recording");
		return -EIO;
	}
	cudaStreamSynchronize(c->stream);
	cudaFree(*buf);
	*buf = NULL;
	*cap = 0;
	int rc = ck(c, cudaMalloc(buf, need), "scratch");
	if (!rc)
		*cap = need;
	return rc;
}

/* ---- weights ---- */

#define CHUNK (16u << 20)  /* elements converted per step at placement */

/* Upload n fp32 values and store them as the device dtype dt at dst. */
static int put_f32(struct cu_backend *c, void *dst, enum kt_dtype dt, const float *src,
		   size_t n, float *tmp)
{
	for (size_t i = 0; i < n; i += CHUNK) {
		size_t k = n - i < CHUNK ? n - i : CHUNK;
		if (dt == KT_F32) {
			if (ck(c, cudaMemcpyAsync((float *)dst + i, src + i, k * 4,
						  cudaMemcpyHostToDevice, c->stream), "weights"))
				return -EIO;
			continue;
		}
		if (ck(c, cudaMemcpyAsync(tmp, src + i, k * 4, cudaMemcpyHostToDevice, c->stream),
		       "weights"))
			return -EIO;
		if (dt == KT_F16)
			cu_f32_to_f16(c->stream, (__half *)dst + i, tmp, k);
		else
			cu_f32_to_bf16(c->stream, (__nv_bfloat16 *)dst + i, tmp, k);
		launched(c, "convert weights");
		if (ck(c, cudaStreamSynchronize(c->stream), "weights"))
			return -EIO;
	}
	return ck(c, cudaStreamSynchronize(c->stream), "weights");
}

static int kq_index(enum kt_dtype t)
{
	return t == KT_Q4_K ? 0 : t == KT_Q5_K ? 1 : t == KT_Q6_K ? 2 : -1;
}

/*
 * The K-quant kernels (kq.h; matmul.cu's matrix-vector product, the f16
 * expansion for cuBLAS) had not run on a GPU when they were written, so the
 * first matrix of each K type placed is checked against the host decoder:
 * its first rows times a fixed vector, and the same rows expanded to f16.
 * 1: they agree; 0: they do not (the type is then expanded at load, as
 * before, and the log says so); -EIO / -ENOMEM: the device failed.
 */
static int kq_check(struct cu_backend *c, const void *d, const struct kt_weight *src)
{
	int rows = src->rows < 16 ? src->rows : 16, cols = src->cols;
	size_t n = (size_t)rows * cols, rb = kt_row_bytes(src->dtype, (size_t)cols);
	float *hx = (float *)malloc((size_t)cols * 4), *hw = (float *)malloc((size_t)cols * 4);
	float *hy = (float *)malloc((size_t)rows * 4);
	__half *hh = (__half *)malloc(n * 2);
	void *dev = NULL;
	int rc = hx && hw && hy && hh ? 0 : -ENOMEM;
	if (!rc)
		rc = ck(c, cudaMalloc(&dev, (size_t)cols * 4 + (size_t)rows * 4 + n * 2),
			"cudaMalloc K-quant check");
	if (!rc) {
		float *dx = (float *)dev, *dy = dx + cols;
		__half *dh = (__half *)(dy + rows);
		for (int i = 0; i < cols; i++)
			hx[i] = (float)(i * 37 % 101 - 50) / 50.f;
		struct kt_weight w = { d, src->dtype, rows, cols, NULL };
		rc = ck(c, cudaMemcpyAsync(dx, hx, (size_t)cols * 4, cudaMemcpyHostToDevice, c->stream),
			"K-quant check");
		cu_gemv(c->stream, dy, dx, &w, 1);
		launched(c, "K-quant check");
		cu_dequant_f16(c->stream, dh, &w);
		launched(c, "K-quant check");
		if (!rc)
			rc = ck(c, cudaMemcpyAsync(hy, dy, (size_t)rows * 4, cudaMemcpyDeviceToHost,
						   c->stream), "K-quant check");
		if (!rc)
			rc = ck(c, cudaMemcpyAsync(hh, dh, n * 2, cudaMemcpyDeviceToHost, c->stream),
				"K-quant check");
		if (!rc)
			rc = ck(c, cudaStreamSynchronize(c->stream), "K-quant check");
		if (c->be.failed)
			rc = -EIO;
	}
	int bad_r = -1, bad_c = -1;
	double got = 0, want = 0;
	for (int r = 0; !rc && r < rows && bad_r < 0; r++) {
		kt_row_to_f32(src->dtype, (const uint8_t *)src->data + (size_t)r * rb, hw, (size_t)cols);
		double sum = 0, mag = 0;
		for (int i = 0; i < cols && bad_r < 0; i++) {
			sum += (double)hw[i] * hx[i];
			mag += fabs((double)hw[i] * hx[i]);
			double h = (double)__half2float(hh[(size_t)r * cols + i]);
			if (isfinite(hw[i]) && !(fabs(h - hw[i]) <= fabs((double)hw[i]) / 1024 + 6e-8)) {
				bad_r = r, bad_c = i;
				got = h, want = hw[i];
			}
		}
		/* (a row with non-finite weights, as a corrupt file may have,
		 * proves nothing either way) */
		if (bad_r < 0 && isfinite(sum) && !(fabs(hy[r] - sum) <= 1e-4 * mag + 1e-30)) {
			bad_r = r;
			got = hy[r], want = sum;
		}
	}
	if (!rc && bad_r >= 0)
		backend_log(BACKEND_LOG_WARN, "cuda: the device %s decoder disagrees with the host's "
			    "(%s of row %d: %.6g, want %.6g): %s matrices are expanded to 16 bits "
			    "at load",
			    kt_dtype_name(src->dtype), bad_c < 0 ? "product" : "weight", bad_r, got,
			    want, kt_dtype_name(src->dtype));
	cudaFree(dev);
	free(hx);
	free(hw);
	free(hy);
	free(hh);
	return rc ? rc : bad_r < 0;
}

static int cu_weight_place(struct backend *be, struct kt_weight *dst, const struct kt_weight *src,
			   int use)
{
	/* `use` is only passed on: every placed weight serves matmul and
	 * embed alike */
	struct cu_backend *c = CB(be);
	size_t rows = (size_t)src->rows, cols = (size_t)src->cols, n = rows * cols;
	*dst = *src;
	dst->data = NULL;
	if (be->failed)
		return -EIO;
	enum kt_dtype dt = src->dtype, wide =
		c->wtype == BACKEND_W_F32 ? KT_F32 : c->wtype == BACKEND_W_BF16 ? KT_BF16 : KT_F16;
	int kq = kq_index(dt);
	if (dt == KT_F32 || (kq >= 0 && c->kq[kq] < 0))
		dt = wide;   /* f32 checkpoints, K-quants found wrong on this device */
	/* placed as the file has them: f16, bf16, K-quants; Q8_0 / Q4_0 are
	 * repacked (quants, then scales) */
	int raw = dt == src->dtype && (!kt_dtype_is_quant(dt) || kq >= 0);
	size_t bytes = raw ? kt_row_bytes(dt, cols) * rows
		     : kt_dtype_is_quant(dt) ? cu_q_quant_bytes(dt, rows, cols) + n / 32 * 2
					     : n * kt_dtype_size(dt);
	void *d = NULL, *tmp = NULL;
	int rc = ck(c, cudaMalloc(&d, bytes), "cudaMalloc weights");
	if (rc)
		return rc;
	if (raw) {
		rc = ck(c, cudaMemcpyAsync(d, src->data, bytes, cudaMemcpyHostToDevice, c->stream),
			"weights");
		if (!rc)
			rc = ck(c, cudaStreamSynchronize(c->stream), "weights");
	} else if (dt == src->dtype) {  /* Q8_0 / Q4_0: repack on the device */
		size_t fb = kt_row_bytes(dt, cols) * rows;
		rc = ck(c, cudaMalloc(&tmp, fb), "cudaMalloc weights");
		if (!rc)
			rc = ck(c, cudaMemcpyAsync(tmp, src->data, fb, cudaMemcpyHostToDevice,
						   c->stream), "weights");
		if (!rc) {
			cu_repack_q(c->stream, d, tmp, dt, rows, cols);
			launched(c, "repack weights");
			rc = ck(c, cudaStreamSynchronize(c->stream), "weights");
		}
	} else if (src->dtype == KT_F32) {
		rc = ck(c, cudaMalloc(&tmp, (size_t)CHUNK * 4), "cudaMalloc weights");
		if (!rc)
			rc = put_f32(c, d, dt, (const float *)src->data, n, (float *)tmp);
	} else {  /* K-quants expanded: rows to fp32 on the host, a chunk at a time */
		size_t rows_per = CHUNK / cols ? CHUNK / cols : 1;
		float *host = (float *)malloc(rows_per * cols * sizeof(float));
		rc = host ? ck(c, cudaMalloc(&tmp, rows_per * cols * 4), "cudaMalloc weights") : -ENOMEM;
		size_t rb = kt_row_bytes(src->dtype, cols);
		for (size_t r = 0; r < rows && !rc; r += rows_per) {
			size_t k = rows - r < rows_per ? rows - r : rows_per;
			for (size_t i = 0; i < k; i++)
				kt_row_to_f32(src->dtype, (const uint8_t *)src->data + (r + i) * rb,
					      host + i * cols, cols);
			rc = put_f32(c, (uint8_t *)d + r * cols * kt_dtype_size(dt), dt, host, k * cols,
				     (float *)tmp);
		}
		free(host);
	}
	cudaFree(tmp);
	if (!rc && raw && kq >= 0 && !c->kq[kq]) {
		rc = kq_check(c, d, src);
		if (rc >= 0) {
			c->kq[kq] = rc ? 1 : -1;
			rc = 0;
			if (c->kq[kq] < 0) {
				cudaFree(d);
				return cu_weight_place(be, dst, src, use);
			}
		}
	}
	if (rc) {
		cudaFree(d);
		return rc;
	}
	dst->data = d;
	dst->dtype = dt;
	if (cols > c->max_cols)
		c->max_cols = cols;
	if (rows > c->max_rows)
		c->max_rows = rows;
	c->placed |= 1u << dt;
	if (kt_dtype_is_quant(dt) && n > c->max_qelems)
		c->max_qelems = n;
	return 0;
}

static void cu_weight_release(struct backend *be, struct kt_weight *w)
{
	(void)be;
	if (w->data)
		cudaFree((void *)w->data);
	w->data = NULL;
}

/* Forget every recorded graph (after the stream's work is done). */
static void drop_graphs(struct cu_backend *c)
{
	cudaStreamSynchronize(c->stream);
	for (int i = 0; i < c->n_graphs; i++)
		cudaGraphExecDestroy(c->graphs[i].exec);
	c->n_graphs = 0;
}

/* ---- batch staging ---- */

/* Staging layout (ints), fixed offsets so that graphs can replay:
 * tok [0,cap) pos [cap,2cap) row_tab [2cap,3cap) tiles [3cap,6cap)
 * tables [6cap, 6cap + cap*stride). */
static int stage_alloc(struct cu_backend *c, int cap, int stride)
{
	if (c->capturing)
		return -EIO;
	cudaStreamSynchronize(c->stream);
	cudaFreeHost(c->h_stage);
	cudaFree(c->d_stage);
	c->h_stage = NULL;
	c->d_stage = NULL;
	drop_graphs(c);  /* recorded pointers go stale */
	size_t n = (size_t)cap * 6 + (size_t)cap * stride;
	int rc = ck(c, cudaMallocHost((void **)&c->h_stage, n * 4), "cudaMallocHost");
	if (!rc)
		rc = ck(c, cudaMalloc((void **)&c->d_stage, n * 4), "cudaMalloc");
	if (rc)
		return rc;
	c->cap_tok = cap;
	c->tab_stride = stride;
	c->stage_ints = n;
	int32_t *d = c->d_stage;
	c->batch.tok = d;
	c->batch.pos = d + cap;
	c->batch.row_tab = d + 2 * cap;
	c->batch.tiles = d + 3 * cap;
	c->batch.tables = d + 6 * cap;
	c->batch.tab_stride = stride;
	return 0;
}

static int cu_batch_begin(struct backend *be, const struct kt_kv *kv, const int32_t *tok,
			  const int *pos, const struct kt_attn_row *rows, int n)
{
	struct cu_backend *c = CB(be);
	if (be->failed)
		return -EIO;
	int bs = kv->block_size, max_p = 0;
	for (int t = 0; t < n; t++)
		if (rows[t].pos > max_p)
			max_p = rows[t].pos;
	int stride = (max_p > c->max_pos ? max_p : c->max_pos) / bs + 2;
	if (n > c->cap_tok || stride > c->tab_stride) {
		int cap = n > c->cap_tok ? n : c->cap_tok;
		if (stage_alloc(c, cap, stride > c->tab_stride ? stride : c->tab_stride))
			return -EIO;
	}
	/* the previous staging copy must have been read before we overwrite */
	if (ck(c, cudaEventSynchronize(c->staged), "staging"))
		return -EIO;
	int cap = c->cap_tok, S = c->tab_stride;
	int32_t *h = c->h_stage, *row_tab = h + 2 * cap, *tiles = h + 3 * cap, *tabs = h + 6 * cap;
	int n_tab = 0;
	const int32_t *cur = NULL;
	int tab_max = -1;
	for (int t = 0; t < n; t++) {
		h[t] = tok[t];
		h[cap + t] = pos[t];
		int p = rows[t].pos;
		if (rows[t].block_table != cur) {
			if (cur)
				memcpy(tabs + (size_t)(n_tab - 1) * S, cur, (size_t)(tab_max / bs + 1) * 4);
			cur = rows[t].block_table;
			n_tab++;
			tab_max = -1;
		}
		if (p > tab_max)
			tab_max = p;
		row_tab[t] = n_tab - 1;
	}
	if (cur)
		memcpy(tabs + (size_t)(n_tab - 1) * S, cur, (size_t)(tab_max / bs + 1) * 4);
	/* runs: consecutive rows of one table at consecutive positions. Small
	 * runs become tiles of up to CU_QT rows first; big runs' tiles follow
	 * (used only when their GEMMs cannot run) */
	int n_tiles = 0, single = 1;
	c->n_runs = 0;
	for (int pass = 0; pass < 2; pass++) {
		if (pass == 1)
			c->batch.n_small_tiles = n_tiles;
		for (int t = 0, e; t < n; t = e) {
			for (e = t + 1; e < n && row_tab[e] == row_tab[t] && pos[e] == pos[e - 1] + 1; e++)
				;
			int big = c->big_run > 0 && e - t >= c->big_run && c->n_runs < CU_MAX_RUNS;
			if (big != pass)
				continue;
			if (big)
				c->runs[c->n_runs++] = (struct cu_run){ t, e - t, pos[t], row_tab[t] };
			for (int u = t; u < e; u += CU_QT) {
				int *nt = tiles + 3 * n_tiles++;
				nt[0] = u;
				nt[1] = e - u < CU_QT ? e - u : CU_QT;
				nt[2] = pos[u];
				single &= nt[1] == 1;
			}
		}
	}
	single &= c->n_runs == 0;
	c->batch.n_tok = n;
	c->batch.n_tiles = n_tiles;
	c->batch.single_rows = single;
	c->h_tok = tok;
	c->kv_base = kv->base;
	size_t ints = (size_t)6 * cap + (size_t)n_tab * S;
	if (ck(c, cudaMemcpyAsync(c->d_stage, h, ints * 4, cudaMemcpyHostToDevice, c->stream),
	       "staging") ||
	    ck(c, cudaEventRecord(c->staged, c->stream), "staging"))
		return -EIO;
	return 0;
}

/* The ops take the host arrays of the staged batch; anything else is a
 * caller bug. */
static int staged(struct cu_backend *c, int n_tok, const char *op)
{
	if (n_tok == c->batch.n_tok)
		return 1;
	if (!c->be.failed)
		backend_log(BACKEND_LOG_ERROR, "cuda: %s called with %d rows, %d staged", op, n_tok,
			    c->batch.n_tok);
	c->be.failed = 1;
	return 0;
}

/* ---- ops ---- */

/* y = x W^T (beta 0) or y += x W^T (beta 1) through cuBLAS: activations
 * rounded to W's 16-bit type (fp32 stays fp32), quantized W expanded to f16
 * first; fp32 accumulation. */
static void blas_mm(struct cu_backend *c, float *y, const float *x, const struct kt_weight *w,
		    int n_tok, float beta)
{
	const float one = 1.f;
	int m = w->rows, k = w->cols;
	if (w->dtype == KT_F32) {
		blas_ck(c, c->cb.sgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n_tok, k, &one,
				       (const float *)w->data, k, x, k, &beta, y, m), "sgemm");
		return;
	}
	size_t xn = (size_t)n_tok * k;
	if (grow(c, &c->xh, &c->xh_bytes, xn * 2))
		return;
	cudaDataType_t t = w->dtype == KT_BF16 ? CUDA_R_16BF : CUDA_R_16F;
	if (t == CUDA_R_16BF)
		cu_f32_to_bf16(c->stream, (__nv_bfloat16 *)c->xh, x, xn);
	else
		cu_f32_to_f16(c->stream, (__half *)c->xh, x, xn);
	launched(c, "matmul convert");
	const void *W = w->data;
	if (kt_dtype_is_quant(w->dtype)) {
		if (grow(c, (void **)&c->wh, &c->wh_bytes, (size_t)m * k * 2))
			return;
		cu_dequant_f16(c->stream, c->wh, w);
		launched(c, "matmul dequantize");
		W = c->wh;
	}
	blas_ck(c, c->cb.gemm_ex(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n_tok, k, &one, W, t, k,
				 c->xh, t, k, &beta, y, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
				 CUBLAS_GEMM_DEFAULT), "gemm");
}

/* Blocks of 32 the 8-bit activation scratch holds: CU_GEMV_MAX rows of the
 * widest matrix input (cu_reserve sizes it). */
static size_t q8_blocks(const struct cu_backend *c)
{
	return (size_t)CU_GEMV_MAX * (c->max_cols / 32 + 1);
}

/* Point j at that scratch: codes, then scales, then sums. */
static void q8_scratch(struct cu_backend *c, struct cu_gemv_job *j)
{
	size_t nb = q8_blocks(c);
	j->xq = (int8_t *)c->xq;
	j->xd = (float *)((char *)c->xq + nb * 32);
	j->xs = (int *)((char *)c->xq + nb * 36);
}

/* The job of n products sharing x: weights and outputs. */
static struct cu_gemv_job job_of(int n, const struct kt_weight *const *w, float *const *y)
{
	struct cu_gemv_job j;
	memset(&j, 0, sizeof(j));
	j.n = n;
	j.cols = w[0]->cols;
	for (int i = 0; i < n; i++) {
		j.w[i] = w[i]->data;
		j.y[i] = y[i];
		j.rows[i] = w[i]->rows;
	}
	return j;
}

/* A matrix-vector job for up to three weights of one dtype sharing x. */
static void gemv(struct cu_backend *c, int mode, int n, float *const *y,
		 const struct kt_weight *const *w, const float *x, int n_tok)
{
	struct cu_gemv_job j = job_of(n, w, y);
	if (c->q8_act && kt_dtype_is_quant(w[0]->dtype)) {
		if (grow(c, &c->xq, &c->xq_bytes, q8_blocks(c) * 40))
			return;
		q8_scratch(c, &j);
	}
	cu_gemv_run(c->stream, &j, w[0]->dtype, mode, x, n_tok);
	launched(c, "matmul");
}

static void cu_op_matmul(struct backend *be, float *y, const float *x, const struct kt_weight *w,
			 int n_tok)
{
	struct cu_backend *c = CB(be);
	if (be->failed || n_tok <= 0)
		return;
	if (n_tok <= CU_GEMV_MAX)
		gemv(c, 0, 1, &y, &w, x, n_tok);
	else
		blas_mm(c, y, x, w, n_tok, 0.f);
}

static void cu_op_matmul_n(struct backend *be, int n, float *const *y,
			   const struct kt_weight *const *w, const float *x, int n_tok)
{
	struct cu_backend *c = CB(be);
	int same = 1;
	for (int i = 1; i < n; i++)
		same &= w[i]->dtype == w[0]->dtype && w[i]->cols == w[0]->cols;
	if (be->failed || n_tok <= 0)
		return;
	if (n_tok <= CU_GEMV_MAX && same && n <= 3) {
		gemv(c, 0, n, y, w, x, n_tok);
		return;
	}
	for (int i = 0; i < n; i++)
		cu_op_matmul(be, y[i], x, w[i], n_tok);
}

static void cu_op_matmul_add(struct backend *be, float *y, const float *x,
			     const struct kt_weight *w, int n_tok)
{
	struct cu_backend *c = CB(be);
	if (be->failed || n_tok <= 0)
		return;
	if (n_tok <= CU_GEMV_MAX)
		gemv(c, 1, 1, &y, &w, x, n_tok);
	else
		blas_mm(c, y, x, w, n_tok, 1.f);
}

static void cu_op_matmul_swiglu(struct backend *be, float *h, const float *x,
				const struct kt_weight *gate, const struct kt_weight *up, int n_tok)
{
	struct cu_backend *c = CB(be);
	if (be->failed || n_tok <= 0)
		return;
	if (n_tok <= CU_GEMV_MAX && gate->dtype == up->dtype && gate->rows == up->rows &&
	    gate->cols == up->cols) {
		const struct kt_weight *w[2] = { gate, up };
		float *y[2] = { h, NULL };
		gemv(c, 2, 2, y, w, x, n_tok);
		return;
	}
	size_t n = (size_t)n_tok * up->rows;
	if (grow(c, (void **)&c->tmp, &c->tmp_bytes, n * sizeof(float)))
		return;
	cu_op_matmul(be, h, x, gate, n_tok);
	cu_op_matmul(be, c->tmp, x, up, n_tok);
	cu_silu_mul(c->stream, h, c->tmp, n);
	launched(c, "silu_mul");
}

static void cu_op_rmsnorm(struct backend *be, float *y, const float *x, const float *w, int n,
			  int n_tok, float eps)
{
	if (be->failed)
		return;
	cu_rmsnorm(CB(be)->stream, y, x, w, n, n_tok, eps);
	launched(CB(be), "rmsnorm");
}

static void cu_op_rope(struct backend *be, float *q, float *k, const int *pos, int n_tok,
		       int n_heads, int n_kv_heads, int hd, const float *inv_freq,
		       enum kt_rope_layout layout)
{
	struct cu_backend *c = CB(be);
	(void)pos;
	if (be->failed || !staged(c, n_tok, "rope"))
		return;
	cu_rope(c->stream, q, k, c->batch.pos, n_tok, n_heads, n_kv_heads, hd, inv_freq, layout);
	launched(c, "rope");
}

static void cu_op_kv_store(struct backend *be, const struct kt_kv *kv, int layer, const float *k,
			   const float *v, const struct kt_attn_row *rows, int n_tok)
{
	struct cu_backend *c = CB(be);
	(void)rows;
	if (be->failed || !staged(c, n_tok, "kv_store"))
		return;
	cu_kv_store(c->stream, kv, layer, k, v, &c->batch);
	launched(c, "kv_store");
}

/* 256-byte aligned pieces of one scratch allocation */
static size_t carve(size_t *off, size_t bytes)
{
	size_t o = *off;
	*off += (bytes + 255) & ~(size_t)255;
	return o;
}

/* Scratch for the GEMM form of the staged big runs: 0, or -1 when it
 * cannot be had (then the tile kernel does those rows). */
static int attention_gemm_scratch(struct cu_backend *c, int n_heads, int n_kv_heads, int hd)
{
	size_t need = 0;
	for (int i = 0; i < c->n_runs; i++) {
		size_t P = (size_t)c->runs[i].p0 + c->runs[i].n, R = (size_t)n_heads * c->runs[i].n, o = 0;
		carve(&o, (size_t)n_kv_heads * P * hd * 2);
		carve(&o, (size_t)n_kv_heads * P * hd * 2);
		carve(&o, R * hd * 2);
		carve(&o, R * P * 4);
		carve(&o, R * P * 2);
		carve(&o, R * hd * 4);
		if (o > need)
			need = o;
	}
	if (c->att_bytes < need) {
		int rc = grow(c, &c->att, &c->att_bytes, need);
		if (rc == -ENOMEM)
			return -1;
		if (rc)
			return 0;  /* device failure: already recorded */
	}
	return 0;
}

/* The GEMM form for the staged big runs (after the kernels for the other
 * rows: their combine step writes every row). */
static void attention_gemm(struct cu_backend *c, float *out, const float *q, const struct kt_kv *kv,
			   int layer, int n_heads, int n_kv_heads, int hd)
{
	const float one = 1.f, zero = 0.f;
	int group = n_heads / n_kv_heads;
	for (int i = 0; i < c->n_runs; i++) {
		const struct cu_run *r = &c->runs[i];
		int P = r->p0 + r->n, R = group * r->n;
		size_t o = 0;
		char *base = (char *)c->att;
		__half *kc = (__half *)(base + carve(&o, (size_t)n_kv_heads * P * hd * 2));
		__half *vc = (__half *)(base + carve(&o, (size_t)n_kv_heads * P * hd * 2));
		__half *qc = (__half *)(base + carve(&o, (size_t)n_heads * r->n * hd * 2));
		float *S = (float *)(base + carve(&o, (size_t)n_heads * r->n * P * 4));
		__half *pm = (__half *)(base + carve(&o, (size_t)n_heads * r->n * P * 2));
		float *oc = (float *)(base + carve(&o, (size_t)n_heads * r->n * hd * 4));
		cu_attn_gather(c->stream, kc, vc, kv, layer,
			       c->batch.tables + (size_t)r->tab * c->batch.tab_stride, P, n_kv_heads, hd);
		cu_attn_q16(c->stream, qc, q, r->t0, r->n, n_heads, n_kv_heads, hd);
		launched(c, "attention gather");
		/* S^T (P x R, col-major) = K (P x hd) . Q^T, per kv head */
		blas_ck(c, c->cb.gemm_batched(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, P, R, hd, &one,
					      kc, CUDA_R_16F, hd, (long long)P * hd, qc, CUDA_R_16F,
					      hd, (long long)R * hd, &zero, S, CUDA_R_32F, P,
					      (long long)R * P, n_kv_heads, CUBLAS_COMPUTE_32F,
					      CUBLAS_GEMM_DEFAULT), "attention scores");
		cu_attn_softmax(c->stream, pm, S, n_heads * r->n, r->n, P, r->p0);
		launched(c, "attention softmax");
		/* O^T (hd x R) = V^T (hd x P) . P^T (P x R), per kv head */
		blas_ck(c, c->cb.gemm_batched(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, hd, R, P, &one,
					      vc, CUDA_R_16F, hd, (long long)P * hd, pm, CUDA_R_16F,
					      P, (long long)R * P, &zero, oc, CUDA_R_32F, hd,
					      (long long)R * hd, n_kv_heads, CUBLAS_COMPUTE_32F,
					      CUBLAS_GEMM_DEFAULT), "attention values");
		cu_attn_scatter(c->stream, out, oc, r->t0, r->n, n_heads, n_kv_heads, hd);
		launched(c, "attention scatter");
	}
}

static void cu_op_attention(struct backend *be, float *out, const float *q, const struct kt_kv *kv,
			    int layer, const struct kt_attn_row *rows, int n_tok, int n_heads,
			    int n_kv_heads, int hd)
{
	struct cu_backend *c = CB(be);
	(void)rows;
	if (be->failed || !staged(c, n_tok, "attention"))
		return;
	struct cu_batch b = c->batch;
	int gemm = c->n_runs > 0 && attention_gemm_scratch(c, n_heads, n_kv_heads, hd) == 0;
	b.n_tiles = gemm ? b.n_small_tiles : b.n_tiles;
	if (b.n_tiles > 0)
		cu_attention(c->stream, out, q, kv, layer, &b, n_heads, n_kv_heads, hd, c->part,
			     c->n_sm);
	launched(c, "attention");
	if (gemm)
		attention_gemm(c, out, q, kv, layer, n_heads, n_kv_heads, hd);
}

static void cu_op_silu_mul(struct backend *be, float *g, const float *u, size_t n)
{
	if (be->failed)
		return;
	cu_silu_mul(CB(be)->stream, g, u, n);
	launched(CB(be), "silu_mul");
}

static void cu_op_add(struct backend *be, float *y, const float *x, size_t n)
{
	if (be->failed)
		return;
	cu_add(CB(be)->stream, y, x, n);
	launched(CB(be), "add");
}

static void cu_op_embed(struct backend *be, float *y, const struct kt_weight *table,
			const int32_t *tok, int n_tok)
{
	struct cu_backend *c = CB(be);
	if (be->failed || !staged(c, n_tok, "embed"))
		return;
	if (tok != c->h_tok) {
		backend_log(BACKEND_LOG_ERROR, "cuda: embed called with tokens that were not staged");
		be->failed = 1;
		return;
	}
	cu_embed(c->stream, y, table, c->batch.tok, n_tok);
	launched(c, "embed");
}

static void persist_prepare(struct cu_backend *c);

static int cu_reserve(struct backend *be, int max_pos, int max_tokens)
{
	struct cu_backend *c = CB(be);
	if (max_pos > c->max_pos)
		c->max_pos = max_pos;
	int T = max_tokens > c->cap_tok ? max_tokens : c->cap_tok;
	/* tables: stride for block size 1 at worst would be huge; use 16 (the
	 * daemon's) and let batch_begin grow it for smaller blocks */
	int stride = c->max_pos / 16 + 2;
	if ((T > c->cap_tok || stride > c->tab_stride) &&
	    stage_alloc(c, T, stride > c->tab_stride ? stride : c->tab_stride))
		return -ENOMEM;
	if (!c->part && ck(c, cudaMalloc((void **)&c->part, (size_t)CU_PART_FLOATS * 4), "cudaMalloc"))
		return -ENOMEM;
	if (grow(c, &c->xh, &c->xh_bytes, (size_t)T * (c->max_cols ? c->max_cols : 1) * 2) ||
	    grow(c, (void **)&c->tmp, &c->tmp_bytes, (size_t)T * (c->max_rows ? c->max_rows : 1) * 4) ||
	    grow(c, &c->xq, &c->xq_bytes, q8_blocks(c) * 40) ||
	    grow(c, (void **)&c->wh, &c->wh_bytes, c->max_qelems * 2))
		return -ENOMEM;
	/* split-K (the o and down products: dim rows, at most max_cols):
	 * partials of every part, a counter per block of rows (zero) */
	size_t rows = c->max_cols ? c->max_cols : 1;
	size_t cnt = (rows / CU_GW + 1) * sizeof(unsigned);
	if (grow(c, (void **)&c->skpart, &c->skpart_bytes,
		 (size_t)CU_MAX_SPLITK * CU_GEMV_MAX * rows * sizeof(float)))
		return -ENOMEM;
	if (c->skcount_bytes < cnt) {
		if (grow(c, (void **)&c->skcount, &c->skcount_bytes, cnt) ||
		    ck(c, cudaMemsetAsync(c->skcount, 0, cnt, c->stream), "cudaMemset") ||
		    ck(c, cudaStreamSynchronize(c->stream), "cudaMemset"))
			return -ENOMEM;
	}
	persist_prepare(c);
	return 0;
}

/* ---- layer candidates ---- */

/* A batch the layer kernels take: staged, matrix-vector sized, and one
 * dtype for all seven matrices (their shapes are the loaders', built from
 * the config; a Q4_K_M file's Q6_K wv and w2 keep its layers on the ops). */
static int layer_ok(struct cu_backend *c, const struct kt_layer *L, int n_tok)
{
	const struct kt_weight *w[7] = { L->wq, L->wk, L->wv, L->wo, L->w1, L->w2, L->w3 };
	if (c->be.failed || n_tok != c->batch.n_tok || n_tok > CU_GEMV_MAX || c->n_runs)
		return 0;
	for (int i = 1; i < 7; i++)
		if (w[i]->dtype != w[0]->dtype)
			return 0;
	return 1;
}

/* the job of one product: weights, outputs, 8-bit scratch when qx */
static struct cu_gemv_job layer_job(struct cu_backend *c, int n, const struct kt_weight *const *w,
				    float *const *y, int qx)
{
	struct cu_gemv_job j = job_of(n, w, y);
	if (qx)
		q8_scratch(c, &j);
	j.vec = w[0]->cols % 8 == 0 ? w[0]->cols : 0;
	return j;
}

static struct cu_gemv_epi layer_epi(struct cu_backend *c, const struct kt_kv *kv, int layer,
				    const struct kt_layer *L)
{
	struct cu_gemv_epi e;
	e.kv = kv->base;
	e.inv_freq = L->inv_freq;
	e.pos = c->batch.pos;
	e.row_tab = c->batch.row_tab;
	e.tables = c->batch.tables;
	e.tab_stride = c->batch.tab_stride;
	e.n_layers = kv->n_layers;
	e.bs = kv->block_size;
	e.kv_dim = kv->kv_dim;
	e.layer = layer;
	e.hd = L->head_dim;
	e.half = L->layout == KT_ROPE_HALF;
	return e;
}

/* Resident blocks of the persistent kernel for dtype dt with smem bytes of
 * shared memory: cached, the figure for at least that much shared memory;
 * queried (not while recording: 0, the layer runs fused). */
static int persist_blocks(struct cu_backend *c, int dt, int qx, size_t smem)
{
	if (c->persist[dt] >= 0 && smem <= c->persist_smem[dt])
		return c->persist[dt];
	if (c->capturing) {
		/* the attribute and occupancy calls are kept out of a recording */
		backend_log(BACKEND_LOG_WARN, "cuda: the persistent kernel's occupancy for %s was "
			    "not known before recording: this layer runs fused",
			    kt_dtype_name((enum kt_dtype)dt));
		return 0;
	}
	c->persist[dt] = cu_layer_blocks((enum kt_dtype)dt, qx, smem, c->n_sm);
	c->persist_smem[dt] = smem;
	return c->persist[dt];
}

/* The persistent kernel's resident blocks for each dtype placed that runs
 * it, before any recording (cu_reserve): for the widest matrix input and
 * the largest head the kernel takes (128), at least what any layer asks. */
static void persist_prepare(struct cu_backend *c)
{
	for (int dt = 0; dt < CU_N_DTYPE; dt++)
		if (c->placed >> dt & 1 && c->max_cols && c->cand[dt] == CU_CAND_PERSIST) {
			int qx = c->q8_act && (dt == KT_Q8_0 || dt == KT_Q4_0);
			persist_blocks(c, dt, qx, cu_persist_smem((int)c->max_cols, 128, qx));
		}
}

/* q/k/v through the ops one at a time (a fused step that could not run) */
static void qkv_ops(struct cu_backend *c, const struct kt_kv *kv, int layer,
		    const struct kt_layer *L, const struct kt_layer_bufs *b, int n_tok, int normed)
{
	if (!normed)
		cu_rmsnorm(c->stream, b->xb, b->x, L->att_norm, L->dim, n_tok, L->eps);
	float *const y[3] = { b->q, b->k, b->v };
	const struct kt_weight *const w[3] = { L->wq, L->wk, L->wv };
	gemv(c, 0, 3, y, w, b->xb, n_tok);
	cu_rope(c->stream, b->q, b->k, c->batch.pos, n_tok, L->n_heads, L->n_kv_heads, L->head_dim,
		L->inv_freq, L->layout);
	cu_kv_store(c->stream, kv, layer, b->k, b->v, &c->batch);
}

static int cu_op_layer(struct backend *be, const struct kt_kv *kv, int layer,
		       const struct kt_layer *L, const struct kt_layer_bufs *b, int n_tok)
{
	struct cu_backend *c = CB(be);
	if (!layer_ok(c, L, n_tok))
		return 0;
	enum kt_dtype dt = L->wq->dtype;
	if (c->cand[dt] == CU_CAND_BASE && c->cand_said[dt])
		return 0;  /* the default, today's kernels: the ops one at a time */
	int qd = L->n_heads * L->head_dim, D = L->dim, F = L->ffn_dim, hd = L->head_dim;
	int qx = c->q8_act && (dt == KT_Q8_0 || dt == KT_Q4_0) && D % 32 == 0 && qd % 32 == 0 &&
		 F % 32 == 0;
	struct cu_shape sh = { D, L->n_heads, L->n_kv_heads, hd, F, n_tok,
			       c->batch.single_rows ? n_tok : c->batch.n_tiles, c->batch.single_rows,
			       dt, qx, c->n_sm, 0, 0 };
	/* (its attention unit takes a position a lane: blocks of <= 32) */
	if (c->cand[dt] == CU_CAND_PERSIST && n_tok == 1 && sh.single_rows &&
	    kv->block_size <= 32)
		sh.persist_blocks = persist_blocks(c, dt, qx, cu_plan_persist_smem(&sh));
	struct cu_plan p;
	if (cu_plan_layer((enum cu_cand)c->cand[dt], &sh, &p))
		return 0;
	if (!c->cand_said[dt]) {
		c->cand_said[dt] = 1;
		backend_log(BACKEND_LOG_INFO, "cuda: %s layers run the %s kernels (%d launches per "
			    "layer for %d row%s)", kt_dtype_name(dt), cu_cand_name(p.cand), p.n, n_tok,
			    n_tok == 1 ? "" : "s");
	}
	if (p.cand == CU_CAND_BASE)
		return 0;  /* today's kernels: the ops one at a time, as planned */
	cudaStream_t st = c->stream;
	float *const xin[3] = { b->xb, b->att, b->hb };
	const int xcols[3] = { D, qd, F };
	for (int i = 0; i < p.n && !be->failed; i++) {
		const struct cu_step *s = &p.s[i];
		const struct kt_weight *wadd = s->arg ? L->w2 : L->wo;
		float *xadd = s->arg ? b->hb : b->att;
		switch (s->kind) {
		case CU_K_RMSNORM:
			cu_rmsnorm(st, b->xb, b->x, s->arg ? L->ffn_norm : L->att_norm, D, n_tok, L->eps);
			break;
		case CU_K_QUANT_X: {
			struct cu_gemv_job j;
			q8_scratch(c, &j);
			cu_quant_x(st, j.xq, j.xd, j.xs, xin[s->arg], (size_t)n_tok * xcols[s->arg] / 32);
			break;
		}
		case CU_K_NORM_QKV_ROPE_KV:
		case CU_K_QKV_ROPE_KV: {
			int norm = s->kind == CU_K_NORM_QKV_ROPE_KV;
			const struct kt_weight *const w[3] = { L->wq, L->wk, L->wv };
			float *const y[3] = { b->q, b->k, b->v };
			struct cu_gemv_job j = layer_job(c, 3, w, y, qx);
			j.g = L->att_norm;
			j.eps = L->eps;
			j.e = layer_epi(c, kv, layer, L);
			if (cu_gemv_fused(st, &j, dt, 3, norm, qx, norm ? b->x : b->xb, n_tok))
				qkv_ops(c, kv, layer, L, b, n_tok, !norm);
			break;
		}
		case CU_K_ATTN:  /* launches its combine step too */
			cu_attention(st, b->att, b->q, kv, layer, &c->batch, L->n_heads, L->n_kv_heads, hd,
				     c->part, c->n_sm);
			break;
		case CU_K_ATTN_COMBINE:
			break;
		case CU_K_GEMV_ADD: {
			struct cu_gemv_job j = layer_job(c, 1, &wadd, &b->x, qx);
			cu_gemv_launch(st, &j, dt, 1, xadd, n_tok);
			break;
		}
		case CU_K_SPLITK_ADD: {
			struct cu_gemv_job j = layer_job(c, 1, &wadd, &b->x, 0);
			j.part = c->skpart;
			j.count = c->skcount;
			if (cu_gemv_splitk(st, &j, dt, xadd, n_tok, s->splits))
				gemv(c, 1, 1, &b->x, &wadd, xadd, n_tok);
			break;
		}
		case CU_K_NORM_SWIGLU:
		case CU_K_GEMV_SWIGLU: {
			const struct kt_weight *const w[2] = { L->w1, L->w3 };
			float *const y[2] = { b->hb, NULL };
			struct cu_gemv_job j = layer_job(c, 2, w, y, qx);
			j.g = L->ffn_norm;
			j.eps = L->eps;
			if (s->kind == CU_K_GEMV_SWIGLU)
				cu_gemv_launch(st, &j, dt, 2, b->xb, n_tok);
			else if (cu_gemv_fused(st, &j, dt, 2, 1, qx, b->x, n_tok)) {
				cu_rmsnorm(st, b->xb, b->x, L->ffn_norm, D, n_tok, L->eps);
				gemv(c, 2, 2, y, w, b->xb, n_tok);
			}
			break;
		}
		case CU_K_LAYER: {
			struct cu_layer_args a;
			const struct kt_weight *const wqkv[3] = { L->wq, L->wk, L->wv };
			float *const yqkv[3] = { b->q, b->k, b->v };
			const struct kt_weight *const wffn[2] = { L->w1, L->w3 };
			float *const yffn[2] = { b->hb, NULL };
			a.qkv = layer_job(c, 3, wqkv, yqkv, 0);
			a.qkv.g = L->att_norm;
			a.qkv.eps = L->eps;
			a.qkv.e = layer_epi(c, kv, layer, L);
			a.o = layer_job(c, 1, &L->wo, &b->x, 0);
			a.ffn = layer_job(c, 2, wffn, yffn, 0);
			a.ffn.g = L->ffn_norm;
			a.ffn.eps = L->eps;
			a.down = layer_job(c, 1, &L->w2, &b->x, 0);
			a.x = b->x;
			cu_attn_fill(&a.at, b->att, b->q, kv, layer, &c->batch, L->n_heads, L->n_kv_heads,
				     hd, c->part);
			a.at.n_split = s->splits;
			cudaError_t e = (cudaError_t)cu_layer_launch(st, &a, dt, qx, (int)s->grid[0],
								     s->smem);
			if (e != cudaSuccess) {
				/* not a device failure: this dtype runs fused from now on */
				cudaGetLastError();
				backend_log(BACKEND_LOG_WARN, "cuda: the persistent %s layer kernel "
					    "did not start (%s): %s layers run fused", kt_dtype_name(dt),
					    cudaGetErrorString(e), kt_dtype_name(dt));
				c->persist[dt] = 0;
				c->persist_smem[dt] = (size_t)-1;
				return cu_op_layer(be, kv, layer, L, b, n_tok);
			}
			break;
		}
		default:
			break;
		}
		launched(c, cu_kind_name(s->kind));
	}
	return 1;
}

static int set_kernels(struct cu_backend *c, const char *spec)
{
	int t[CU_N_DTYPE];
	memcpy(t, c->cand, sizeof(t));
	if (cu_cand_spec(spec, t))
		return -EINVAL;
	memcpy(c->cand, t, sizeof(t));
	memset(c->cand_said, 0, sizeof(c->cand_said));
	drop_graphs(c);  /* recorded graphs hold the old kernels */
	return 0;
}

/* ---- graphs ---- */

static struct cu_graph *find_graph(struct cu_backend *c, const void *owner, int key)
{
	for (int i = 0; i < c->n_graphs; i++)
		if (c->graphs[i].owner == owner && c->graphs[i].key == key)
			return &c->graphs[i];
	return NULL;
}

static int cu_graph_replay(struct backend *be, const void *owner, int key)
{
	struct cu_backend *c = CB(be);
	if (c->graphs_off || be->failed)
		return 0;
	struct cu_graph *g = find_graph(c, owner, key);
	if (!g)
		return 0;
	if (g->kv_base != c->kv_base) {  /* another pool: record again */
		cudaGraphExecDestroy(g->exec);
		*g = c->graphs[--c->n_graphs];
		return 0;
	}
	return ck(c, cudaGraphLaunch(g->exec, c->stream), "graph launch") == 0;
}

static void cu_graph_record_begin(struct backend *be, const void *owner, int key)
{
	struct cu_backend *c = CB(be);
	(void)owner;
	(void)key;
	if (c->graphs_off || be->failed)
		return;
	if (cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess)
		c->capturing = 1;
	else
		cudaGetLastError();
}

static int cu_graph_record_end(struct backend *be, const void *owner, int key)
{
	struct cu_backend *c = CB(be);
	if (!c->capturing)
		return -1;
	c->capturing = 0;
	cudaGraph_t graph = NULL;
	cudaGraphExec_t exec = NULL;
	cudaError_t e = cudaStreamEndCapture(c->stream, &graph);
	if (e == cudaSuccess && !be->failed)
		e = cudaGraphInstantiate(&exec, graph, 0);
	if (graph)
		cudaGraphDestroy(graph);
	if (e != cudaSuccess || be->failed) {
		/* an op could not be recorded: run unrecorded from now on */
		backend_log(BACKEND_LOG_WARN, "cuda: graph recording failed (%s); running without "
			    "graphs", cudaGetErrorString(e));
		cudaGetLastError();
		c->graphs_off = 1;
		be->failed = 0;  /* capture errors are not device errors */
		return -1;
	}
	if (c->n_graphs == c->cap_graphs) {
		int nc = c->cap_graphs ? 2 * c->cap_graphs : 16;
		struct cu_graph *ng = (struct cu_graph *)realloc(c->graphs, nc * sizeof(*ng));
		if (!ng) {
			cudaGraphExecDestroy(exec);
			c->graphs_off = 1;
			return -1;
		}
		c->graphs = ng;
		c->cap_graphs = nc;
	}
	struct cu_graph *g = &c->graphs[c->n_graphs++];
	g->owner = owner;
	g->key = key;
	g->kv_base = c->kv_base;
	g->exec = exec;
	return ck(c, cudaGraphLaunch(exec, c->stream), "graph launch") ? -1 : 0;
}

static void cu_free(struct backend *be)
{
	struct cu_backend *c = CB(be);
	drop_graphs(c);
	free(c->graphs);
	if (c->blas)
		c->cb.destroy(c->blas);
	if (c->cb.lib)
		dlclose(c->cb.lib);
	cudaFree(c->blas_ws);
	cudaFree(c->xh);
	cudaFree(c->wh);
	cudaFree(c->part);
	cudaFree(c->tmp);
	cudaFree(c->att);
	cudaFree(c->xq);
	cudaFree(c->skpart);
	cudaFree(c->skcount);
	cudaFree(c->d_stage);
	cudaFreeHost(c->h_stage);
	if (c->staged)
		cudaEventDestroy(c->staged);
	if (c->stream)
		cudaStreamDestroy(c->stream);
	free(c);
}

static const struct backend_ops cuda_ops = {
	"cuda",
	cu_op_matmul,
	cu_op_rmsnorm,
	cu_op_rope,
	cu_op_kv_store,
	cu_op_attention,
	cu_op_silu_mul,
	cu_op_add,
	cu_op_embed,
	cu_reserve,
	cu_free,
	cu_mem_alloc,
	cu_mem_free,
	cu_upload,
	cu_download,
	cu_copy,
	cu_weight_place,
	cu_weight_release,
	cu_batch_begin,
	cu_graph_replay,
	cu_graph_record_begin,
	cu_graph_record_end,
	cu_mem_info,
	cu_op_matmul_n,
	cu_op_matmul_add,
	cu_op_matmul_swiglu,
	cu_op_layer,
};

static int load_cublas(struct cublas_fns *f, char **cause)
{
	const char *names[] = { "libcublas.so.13", "libcublas.so.12", "libcublas.so" };
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && !f->lib; i++)
		f->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
	if (!f->lib) {
		if (asprintf(cause, "cannot load cuBLAS (libcublas.so.13): %s", dlerror()) < 0)
			*cause = NULL;
		return -1;
	}
#define SYM(field, name) \
	if (!(*(void **)&f->field = dlsym(f->lib, name))) { \
		if (asprintf(cause, "cuBLAS lacks %s", name) < 0) \
			*cause = NULL; \
		return -1; \
	}
	SYM(create, "cublasCreate_v2");
	SYM(destroy, "cublasDestroy_v2");
	SYM(set_stream, "cublasSetStream_v2");
	SYM(set_workspace, "cublasSetWorkspace_v2");
	SYM(set_math_mode, "cublasSetMathMode");
	SYM(gemm_ex, "cublasGemmEx");
	SYM(sgemm, "cublasSgemm_v2");
	SYM(gemm_batched, "cublasGemmStridedBatchedEx");
#undef SYM
	return 0;
}

extern "C" struct backend *backend_cuda_new(int gpu, enum backend_wtype wtype, char **cause)
{
	*cause = NULL;
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess || n == 0) {
		/* the runtime reports a missing driver as an old one: tell them
		 * apart, and say which versions when it is old */
		void *drv = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
		int dv = 0;
		char why[160];
		if (!drv)
			snprintf(why, sizeof(why), "no NVIDIA driver: libcuda.so.1 cannot be loaded");
		else if (e == cudaErrorInsufficientDriver && cudaDriverGetVersion(&dv) == cudaSuccess)
			snprintf(why, sizeof(why), "the NVIDIA driver supports CUDA %d.%d, this build "
				 "needs %d.%d or newer", dv / 1000, dv % 1000 / 10, CUDART_VERSION / 1000,
				 CUDART_VERSION % 1000 / 10);
		else
			snprintf(why, sizeof(why), "%s",
				 e != cudaSuccess ? cudaGetErrorString(e) : "none found");
		if (drv)
			dlclose(drv);
		if (asprintf(cause, "no usable CUDA device (%s)", why) < 0)
			*cause = NULL;
		cudaGetLastError();
		return NULL;
	}
	if (gpu < 0 || gpu >= n) {
		if (asprintf(cause, "CUDA device %d does not exist (%d found)", gpu, n) < 0)
			*cause = NULL;
		return NULL;
	}
	cudaDeviceProp prop;
	if (cudaGetDeviceProperties(&prop, gpu) != cudaSuccess || cudaSetDevice(gpu) != cudaSuccess) {
		if (asprintf(cause, "CUDA device %d cannot be used", gpu) < 0)
			*cause = NULL;
		return NULL;
	}
	if (prop.major < 9) {
		if (asprintf(cause, "%s (compute capability %d.%d) is older than this build's "
			     "target (sm_90, Hopper)", prop.name, prop.major, prop.minor) < 0)
			*cause = NULL;
		return NULL;
	}
	struct cu_backend *c = (struct cu_backend *)calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->be.ops = &cuda_ops;
	c->be.n_threads = 1;
	c->dev = gpu;
	c->n_sm = prop.multiProcessorCount;
	c->wtype = wtype;
	/* rows from which a sequence's new rows take the GEMM form of
	 * attention (f16 operands); LLAMAD_CUDA_GEMM_ATTN=0 keeps every row on
	 * the fp32 kernels */
	const char *ga = getenv("LLAMAD_CUDA_GEMM_ATTN");
	c->big_run = ga && *ga ? atoi(ga) : CU_BIG_RUN;
	/* Q8_0 / Q4_0 matrix-vector products quantize the activations to 8
	 * bits (__dp4a); LLAMAD_CUDA_EXACT_Q=1 keeps them fp32 */
	c->q8_act = !backend_env_flag("LLAMAD_CUDA_EXACT_Q");
	/* K-quants stay in their blocks; LLAMAD_CUDA_KQ_F16=1 expands them at
	 * load to the type of the file's f32 matrices (wtype) */
	if (backend_env_flag("LLAMAD_CUDA_KQ_F16"))
		c->kq[0] = c->kq[1] = c->kq[2] = -1;
	/* layer kernels per dtype: the fixed table, LLAMAD_CUDA_KERNELS over
	 * it (a diagnostic: llamad(8)) */
	cu_cand_defaults(c->cand);
	memset(c->persist, 0xff, sizeof(c->persist));
	const char *ks = getenv("LLAMAD_CUDA_KERNELS");
	if (ks && *ks && cu_cand_spec(ks, c->cand))
		backend_log(BACKEND_LOG_WARN, "cuda: LLAMAD_CUDA_KERNELS=%s is not understood (a "
			    "candidate: base, fused, persistent, splitk; or dtype=candidate,...): "
			    "ignored", ks);
	if (load_cublas(&c->cb, cause) ||
	    cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking) != cudaSuccess ||
	    cudaEventCreateWithFlags(&c->staged, cudaEventDisableTiming) != cudaSuccess ||
	    c->cb.create(&c->blas) != CUBLAS_STATUS_SUCCESS ||
	    c->cb.set_stream(c->blas, c->stream) != CUBLAS_STATUS_SUCCESS ||
	    cudaMalloc(&c->blas_ws, 32u << 20) != cudaSuccess ||
	    c->cb.set_workspace(c->blas, c->blas_ws, 32u << 20) != CUBLAS_STATUS_SUCCESS) {
		if (!*cause && asprintf(cause, "cannot set up CUDA on %s: %s", prop.name,
					cudaGetErrorString(cudaGetLastError())) < 0)
			*cause = NULL;
		cu_free(&c->be);
		return NULL;
	}
	/* fp32 matrices stay fp32 (no TF32) */
	c->cb.set_math_mode(c->blas, CUBLAS_DEFAULT_MATH);
	cudaEventRecord(c->staged, c->stream);
	static const char *wn[] = { "f16", "bf16", "f32" };
	char name[48];
	memcpy(name, prop.name, sizeof(name) - 1);
	name[sizeof(name) - 1] = 0;
	snprintf(c->be.desc, sizeof(c->be.desc), "cuda, %s (sm_%d%d, %d SMs, %.1f GiB), %s weights",
		 name, prop.major, prop.minor, prop.multiProcessorCount,
		 prop.totalGlobalMem / 1073741824.0, wn[wtype]);
	return &c->be;
}

extern "C" int backend_cuda_set_kernels(struct backend *be, const char *spec)
{
	if (!be || be->ops != &cuda_ops)
		return -ENOSYS;
	return set_kernels(CB(be), spec);
}

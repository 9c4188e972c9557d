/*
 * kernels/cuda/ops.cu — the ops of the op table: products through cuBLAS
 * above CU_GEMV_MAX rows and the matrix-vector kernels below; the other ops
 * check the staged batch and call their launchers (one .cu per op).
 */
#include <errno.h>
#include <string.h>

#include "kernels/cuda/backend.cuh"

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
size_t q8_blocks(const struct cu_backend *c)
{
	return (size_t)CU_GEMV_MAX * (c->max_cols / 32 + 1);
}

/* Point j at that scratch: codes, then scales, then sums. */
void q8_scratch(struct cu_backend *c, struct cu_gemv_job *j)
{
	size_t nb = q8_blocks(c);
	j->xq = (int8_t *)c->xq;
	j->xd = (float *)((char *)c->xq + nb * 32);
	j->xs = (int *)((char *)c->xq + nb * 36);
}

/* The job of n products sharing x: weights and outputs. */
struct cu_gemv_job job_of(int n, const struct kt_weight *const *w, float *const *y)
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
void gemv(struct cu_backend *c, int mode, int n, float *const *y,
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

void cu_op_matmul(struct backend *be, float *y, const float *x, const struct kt_weight *w,
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

void cu_op_matmul_n(struct backend *be, int n, float *const *y,
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

void cu_op_matmul_add(struct backend *be, float *y, const float *x,
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

void cu_op_matmul_swiglu(struct backend *be, float *h, const float *x,
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

void cu_op_rmsnorm(struct backend *be, float *y, const float *x, const float *w, int n,
		   int n_tok, float eps)
{
	if (be->failed)
		return;
	cu_rmsnorm(CB(be)->stream, y, x, w, n, n_tok, eps);
	launched(CB(be), "rmsnorm");
}

void cu_op_rope(struct backend *be, float *q, float *k, const int *pos, int n_tok,
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

void cu_op_kv_store(struct backend *be, const struct kt_kv *kv, int layer, const float *k,
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

void cu_op_attention(struct backend *be, float *out, const float *q, const struct kt_kv *kv,
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

void cu_op_silu_mul(struct backend *be, float *g, const float *u, size_t n)
{
	if (be->failed)
		return;
	cu_silu_mul(CB(be)->stream, g, u, n);
	launched(CB(be), "silu_mul");
}

void cu_op_add(struct backend *be, float *y, const float *x, size_t n)
{
	if (be->failed)
		return;
	cu_add(CB(be)->stream, y, x, n);
	launched(CB(be), "add");
}

void cu_op_embed(struct backend *be, float *y, const struct kt_weight *table,
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

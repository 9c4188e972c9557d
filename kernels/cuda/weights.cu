/*
 * kernels/cuda/weights.cu — weight placement: f16 / bf16 and K-quant blocks
 * uploaded as the file has them, Q8_0 / Q4_0 repacked on the device, f32
 * matrices (and K-quants found wrong on this device) converted to the
 * device weight type a chunk at a time; the first matrix of each K-quant
 * type checked against the host decoder (kq_check).
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "kernels/cuda/backend.cuh"

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

int cu_weight_place(struct backend *be, struct kt_weight *dst, const struct kt_weight *src,
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

void cu_weight_release(struct backend *be, struct kt_weight *w)
{
	(void)be;
	if (w->data)
		cudaFree((void *)w->data);
	w->data = NULL;
}

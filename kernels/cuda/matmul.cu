/*
 * kernels/cuda/matmul.cu — matrix-vector products for small batches and
 * the conversions the cuBLAS path needs.
 *
 * The matrix-vector kernels read every weight byte once per call for up to
 * CU_GEMV_MAX activation rows: one warp per output row (and SwiGLU's gate
 * and up rows together), each lane keeping several 16-byte loads of its
 * row in flight, the activations staged in shared memory per block; lanes
 * are summed with shuffles; fp32 accumulation throughout.
 *  - f32 / f16 / bf16 (and quantized ones in exact mode): weights widened
 *    to fp32 in registers, fp32 activations.
 *  - Q4_K / Q5_K / Q6_K: each lane decodes a 32-weight sub-block of the
 *    file's super-blocks (kq.h) to fp32 in registers, fp32 activations.
 *    Never run on a GPU yet: the backend checks them against the host
 *    decoder when it places the first matrix of each type (weights.cu).
 *  - Q8_0 / Q4_0 (default): the activations are first quantized to 8 bits
 *    per block of 32 (scale = max|x| / 127, as llama.cpp does on GPUs), and
 *    each block's dot product is 8 __dp4a integer instructions, times the
 *    two scales; Q4_0's offset of 8 comes off through the block's sum of
 *    quantized activations.
 */
#include <stdio.h>

#include "kernels/cuda/gemv.cuh"


/* One warp per block of 32 activations: 8-bit values, scale, sum. */
static __global__ void quant_x_kernel(int8_t *xq, float *xd, int *xs, const float *x, size_t n_blocks)
{
	cu_pdl_wait();
	cu_pdl_trigger();
	size_t b = blockIdx.x * (size_t)(blockDim.x / 32) + threadIdx.x / 32;
	int lane = threadIdx.x & 31;
	if (b >= n_blocks)
		return;
	float d;
	int sum;
	xq[b * 32 + lane] = (int8_t)warp_quant32(x[b * 32 + lane], &d, &sum);
	if (!lane) {
		xd[b] = d;
		xs[b] = sum;
	}
}

void cu_quant_x(cudaStream_t st, int8_t *xq, float *xd, int *xs, const float *x, size_t nb)
{
	cu_launch_pdl(quant_x_kernel, dim3((unsigned)((nb + 7) / 8)), dim3(256), 0, st, xq, xd, xs, x, nb);
}

/* the plain kernels for mode, once j->vec is set (qx: 8-bit x in j->xq) */
static void gemv_modes(cudaStream_t st, struct cu_gemv_job *j, enum kt_dtype dt, int mode,
		       const float *x, int n_tok, int qx)
{
	if (mode == 0)
		gemv_mode<0, 0>(st, j, dt, x, n_tok, qx);
	else if (mode == 1)
		gemv_mode<1, 0>(st, j, dt, x, n_tok, qx);
	else
		gemv_mode<2, 0>(st, j, dt, x, n_tok, qx);
}

void cu_gemv_launch(cudaStream_t st, struct cu_gemv_job *j, enum kt_dtype dt, int mode,
		    const float *x, int n_tok)
{
	gemv_modes(st, j, dt, mode, x, n_tok, cu_gemv_prep(j, dt));
}

void cu_gemv_run(cudaStream_t st, struct cu_gemv_job *j, enum kt_dtype dt, int mode,
		 const float *x, int n_tok)
{
	int qx = cu_gemv_prep(j, dt);
	if (qx)
		cu_quant_x(st, j->xq, j->xd, j->xs, x, (size_t)n_tok * j->cols / 32);
	gemv_modes(st, j, dt, mode, x, n_tok, qx);
}

void cu_gemv(cudaStream_t st, float *y, const float *x, const struct kt_weight *w, int n_tok)
{
	struct cu_gemv_job j;
	memset(&j, 0, sizeof(j));
	j.w[0] = w->data;
	j.y[0] = y;
	j.rows[0] = w->rows;
	j.n = 1;
	j.cols = w->cols;
	cu_gemv_run(st, &j, w->dtype, 0, x, n_tok);
}

static __global__ void dequant_kernel(__half *dst, const void *w, enum kt_dtype dt, size_t rows, int cols)
{
	size_t n = rows * cols;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		dst[i] = __float2half(cu_w_at(w, dt, rows, cols, (int)(i / cols), (int)(i % cols)));
}

void cu_dequant_f16(cudaStream_t st, __half *dst, const struct kt_weight *w)
{
	dequant_kernel<<<1024, 256, 0, st>>>(dst, w->data, w->dtype, (size_t)w->rows, w->cols);
}

static __global__ void to_f16_kernel(__half *dst, const float *src, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		dst[i] = __float2half_rn(src[i]);
}

static __global__ void to_bf16_kernel(__nv_bfloat16 *dst, const float *src, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		dst[i] = __float2bfloat16_rn(src[i]);
}

static unsigned grid_for(size_t n)
{
	size_t g = (n + 255) / 256;
	return (unsigned)(g < 4096 ? (g ? g : 1) : 4096);
}

void cu_f32_to_f16(cudaStream_t st, __half *dst, const float *src, size_t n)
{
	to_f16_kernel<<<grid_for(n), 256, 0, st>>>(dst, src, n);
}

void cu_f32_to_bf16(cudaStream_t st, __nv_bfloat16 *dst, const float *src, size_t n)
{
	to_bf16_kernel<<<grid_for(n), 256, 0, st>>>(dst, src, n);
}

/* One GGML block per thread: its scale to the scale array, its quants to
 * the quant array (same order within the block). */
static __global__ void repack_kernel(uint8_t *dst, const uint8_t *src, int q8, size_t n_blocks)
{
	size_t qb = q8 ? 32 : 16, sb = 2 + qb;
	__half *sc = (__half *)(dst + n_blocks * qb);
	for (size_t b = blockIdx.x * (size_t)blockDim.x + threadIdx.x; b < n_blocks;
	     b += (size_t)gridDim.x * blockDim.x) {
		const uint8_t *s = src + b * sb;
		sc[b] = __ushort_as_half((unsigned short)(s[0] | s[1] << 8));
		for (size_t i = 0; i < qb; i++)
			dst[b * qb + i] = s[2 + i];
	}
}

void cu_repack_q(cudaStream_t st, void *dst, const void *src, enum kt_dtype t, size_t rows,
		 size_t cols)
{
	size_t nb = rows * cols / 32;
	repack_kernel<<<grid_for(nb), 256, 0, st>>>((uint8_t *)dst, (const uint8_t *)src,
						     t == KT_Q8_0, nb);
}

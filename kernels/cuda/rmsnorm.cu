/*
 * kernels/cuda/rmsnorm.cu — y = x * rsqrt(mean(x^2) + eps) * w, one block
 * per row, fp32 sums reduced through shared memory (block_sumsq, gemv.cuh:
 * the fused matrix-vector kernels, 256 threads too, normalize in the same
 * order, so their scale is the same bits; the persistent kernel's 128
 * threads sum in another order).
 */
#include "kernels/cuda/gemv.cuh"

static __global__ void rmsnorm_kernel(float *y, const float *x, const float *w, int n, float eps)
{
	cu_pdl_wait();
	cu_pdl_trigger();
	__shared__ float part[32];
	const float *xr = x + (size_t)blockIdx.x * n;
	float *yr = y + (size_t)blockIdx.x * n;
	/* the fused 256-thread kernels compute this scale the same way */
	float scale = rsqrtf(block_sumsq<256>(xr, n, part) / (float)n + eps);
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		yr[i] = xr[i] * scale * w[i];
}

void cu_rmsnorm(cudaStream_t st, float *y, const float *x, const float *w, int n, int n_tok,
		float eps)
{
	if (n_tok > 0)
		cu_launch_pdl(rmsnorm_kernel, dim3(n_tok), dim3(256), 0, st, y, x, w, n, eps);
}

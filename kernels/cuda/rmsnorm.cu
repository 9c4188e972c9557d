/*
 * kernels/cuda/rmsnorm.cu — y = x * rsqrt(mean(x^2) + eps) * w, one block
 * per row, fp32 sums reduced through shared memory (block_sumsq, gemv.cuh:
 * the fused kernels normalize with the same order, so their scale is the
 * same bits).
 */
#include "kernels/cuda/gemv.cuh"

__global__ void rmsnorm_kernel(float *y, const float *x, const float *w, int n, float eps)
{
	cu_pdl_wait();
	cu_pdl_trigger();
	__shared__ float part[32];
	const float *xr = x + (size_t)blockIdx.x * n;
	float *yr = y + (size_t)blockIdx.x * n;
	/* the fused kernels compute the same scale with the same reduction */
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

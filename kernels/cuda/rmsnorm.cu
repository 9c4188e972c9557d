/*
 * kernels/cuda/rmsnorm.cu — y = x * rsqrt(mean(x^2) + eps) * w, one block
 * per row, fp32 sums reduced through shared memory.
 */
#include "kernels/cuda/cuda.cuh"

__global__ void rmsnorm_kernel(float *y, const float *x, const float *w, int n, float eps)
{
	cu_pdl_wait();
	cu_pdl_trigger();
	__shared__ float part[32];
	const float *xr = x + (size_t)blockIdx.x * n;
	float *yr = y + (size_t)blockIdx.x * n;
	float ss = 0.f;
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		ss += xr[i] * xr[i];
	for (int o = 16; o > 0; o >>= 1)
		ss += __shfl_xor_sync(0xffffffffu, ss, o);
	if ((threadIdx.x & 31) == 0)
		part[threadIdx.x >> 5] = ss;
	__syncthreads();
	if (threadIdx.x < 32) {
		float v = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0.f;
		for (int o = 16; o > 0; o >>= 1)
			v += __shfl_xor_sync(0xffffffffu, v, o);
		if (threadIdx.x == 0)
			part[0] = v;
	}
	__syncthreads();
	float scale = rsqrtf(part[0] / (float)n + eps);
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		yr[i] = xr[i] * scale * w[i];
}

void cu_rmsnorm(cudaStream_t st, float *y, const float *x, const float *w, int n, int n_tok,
		float eps)
{
	if (n_tok > 0)
		cu_launch_pdl(rmsnorm_kernel, dim3(n_tok), dim3(256), 0, st, y, x, w, n, eps);
}

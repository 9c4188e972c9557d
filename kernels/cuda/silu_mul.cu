/*
 * kernels/cuda/silu_mul.cu — g = silu(g) * u, element-wise.
 */
#include "kernels/cuda/cuda.cuh"

static __global__ void silu_mul_kernel(float *g, const float *u, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float x = g[i];
		g[i] = x / (1.f + expf(-x)) * u[i];
	}
}

void cu_silu_mul(cudaStream_t st, float *g, const float *u, size_t n)
{
	size_t blocks = (n + 255) / 256;
	if (n)
		silu_mul_kernel<<<(unsigned)(blocks < 8192 ? blocks : 8192), 256, 0, st>>>(g, u, n);
}

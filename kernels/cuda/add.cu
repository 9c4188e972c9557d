/*
 * kernels/cuda/add.cu — the residual add y += x, element-wise.
 */
#include "kernels/cuda/cuda.cuh"

static __global__ void add_kernel(float *y, const float *x, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		y[i] += x[i];
}

void cu_add(cudaStream_t st, float *y, const float *x, size_t n)
{
	size_t blocks = (n + 255) / 256;
	if (n)
		add_kernel<<<(unsigned)(blocks < 8192 ? blocks : 8192), 256, 0, st>>>(y, x, n);
}

/*
 * kernels/cuda/embed.cu — gather the embedding rows of the batch's tokens
 * as fp32 (table in any placed dtype).
 */
#include "kernels/cuda/cuda.cuh"

static __global__ void embed_kernel(float *y, const void *w, enum kt_dtype dt, size_t rows, int cols,
				    const int32_t *tok)
{
	cu_pdl_wait();
	cu_pdl_trigger();
	int t = blockIdx.x;
	size_t r = (size_t)tok[t];
	for (int c = threadIdx.x; c < cols; c += blockDim.x)
		y[(size_t)t * cols + c] = cu_w_at(w, dt, rows, cols, (int)r, c);
}

void cu_embed(cudaStream_t st, float *y, const struct kt_weight *table, const int32_t *tok,
	      int n_tok)
{
	if (n_tok > 0)
		cu_launch_pdl(embed_kernel, dim3(n_tok), dim3(256), 0, st, y, table->data, table->dtype,
			      (size_t)table->rows, table->cols, tok);
}

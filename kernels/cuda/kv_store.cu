/*
 * kernels/cuda/kv_store.cu — write the batch's k and v rows of one layer
 * into their KV blocks (K transposed, V row-major: kernels/backend.h).
 */
#include "kernels/cuda/cuda.cuh"

static __global__ void kv_store_kernel(float *base, int n_layers, int bs, int kv_dim, int layer,
				       const float *k, const float *v, const int *pos, const int *row_tab,
				       const int32_t *tables, int tab_stride)
{
	cu_pdl_wait();
	cu_pdl_trigger();
	int t = blockIdx.x;
	int p = pos[t];
	int32_t b = tables[(size_t)row_tab[t] * tab_stride + p / bs];
	int r = p % bs;
	size_t span = (size_t)bs * kv_dim;
	float *kt = base + (((size_t)b * n_layers + layer) * 2) * span;
	float *vr = kt + span + (size_t)r * kv_dim;
	const float *kr = k + (size_t)t * kv_dim, *vs = v + (size_t)t * kv_dim;
	for (int c = threadIdx.x; c < kv_dim; c += blockDim.x) {
		kt[(size_t)c * bs + r] = kr[c];
		vr[c] = vs[c];
	}
}

void cu_kv_store(cudaStream_t st, const struct kt_kv *kv, int layer, const float *k,
		 const float *v, const struct cu_batch *b)
{
	if (b->n_tok > 0)
		cu_launch_pdl(kv_store_kernel, dim3(b->n_tok), dim3(256), 0, st, (float *)kv->base, kv->n_layers,
			      kv->block_size, kv->kv_dim, layer, k, v, b->pos, b->row_tab, b->tables,
			      b->tab_stride);
}

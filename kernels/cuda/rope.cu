/*
 * kernels/cuda/rope.cu — rotary embedding of q and k in place, one block
 * per (row, head): the head is read into shared memory first, since the
 * rotate-half layout moves values across the head.
 */
#include "kernels/cuda/cuda.cuh"

static __global__ void rope_kernel(float *q, float *k, const int *pos, int n_heads, int n_kv_heads,
				   int hd, const float *inv_freq, int half_layout)
{
	cu_pdl_wait();
	cu_pdl_trigger();
	extern __shared__ float hv[];
	int t = blockIdx.x, h = blockIdx.y;
	float *v;
	if (h < n_heads)
		v = q + ((size_t)t * n_heads + h) * hd;
	else if (h < n_heads + n_kv_heads)
		v = k + ((size_t)t * n_kv_heads + (h - n_heads)) * hd;
	else
		return;
	for (int i = threadIdx.x; i < hd; i += blockDim.x)
		hv[i] = v[i];
	__syncthreads();
	int half = hd / 2;
	float p = (float)pos[t];
	for (int i = threadIdx.x; i < half; i += blockDim.x) {
		float a, b;
		if (half_layout) {
			a = hv[i];
			b = hv[i + half];
		} else {
			a = hv[2 * i];
			b = hv[2 * i + 1];
		}
		float ang = p * inv_freq[i];
		float c = cosf(ang), s = sinf(ang);
		v[2 * i] = a * c - b * s;
		v[2 * i + 1] = a * s + b * c;
	}
}

void cu_rope(cudaStream_t st, float *q, float *k, const int *pos, int n_tok, int n_heads,
	     int n_kv_heads, int hd, const float *inv_freq, enum kt_rope_layout layout)
{
	if (n_tok <= 0)
		return;
	dim3 grid(n_tok, n_heads + n_kv_heads);
	int thr = hd / 2 < 32 ? 32 : (hd / 2 > 256 ? 256 : hd / 2);
	cu_launch_pdl(rope_kernel, grid, dim3(thr), hd * sizeof(float), st, q, k, pos, n_heads,
		      n_kv_heads, hd, inv_freq, (int)(layout == KT_ROPE_HALF));
}

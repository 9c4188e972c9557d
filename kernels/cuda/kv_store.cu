/*
 * kernels/cuda/kv_store.cu — write the batch's k and v rows of one layer
 * into their KV blocks (K transposed, V row-major: kernels/backend.h), in
 * the store's element type: f32 as they are, f16 rounded to nearest even,
 * q8_0 as int8 codes with one f16 scale per row and group of channels. The
 * bytes are the CPU backend's (kt_kv_put) for the same rows, so blocks move
 * between the backends and into state files as they are.
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

/*
 * The f16 and q8_0 stores (plan.h's conversions). q8_0: each warp takes 32
 * channels at a time, lane = channel, so a group (8, 16 or 32 channels:
 * a divisor of 32) is an aligned run of lanes whose largest magnitude is
 * folded with shuffles inside the run; every lane then codes its value
 * against the group's stored scale, and the group's first lane stores the
 * scale. (A block of 256 threads: whole warps, every lane in each loop
 * step, the channels past kv_dim as zeros whose groups are not stored.)
 * Never run on a GPU yet (written 2026-12-03 without one).
 */
template <int DT>
static __global__ void kv_store_typed_kernel(char *base, int n_layers, int bs, int kv_dim, int group,
					     int layer, const float *k, const float *v, const int *pos,
					     const int *row_tab, const int32_t *tables, int tab_stride)
{
	cu_pdl_wait();
	cu_pdl_trigger();
	int t = blockIdx.x, p = pos[t];
	int32_t b = tables[(size_t)row_tab[t] * tab_stride + p / bs];
	int r = p % bs;
	size_t span = cu_kv_span_bytes(DT, bs, kv_dim, group);
	char *ks = base + cu_kv_span_off(b, n_layers, layer, 0, span), *vs = ks + span;
	const float *kr = k + (size_t)t * kv_dim, *vr = v + (size_t)t * kv_dim;
	if (DT == KT_F16) {
		uint16_t *k16 = (uint16_t *)ks, *v16 = (uint16_t *)vs + (size_t)r * kv_dim;
		for (int c = threadIdx.x; c < kv_dim; c += blockDim.x) {
			k16[(size_t)c * bs + r] = cu_f16_bits(kr[c]);
			v16[c] = cu_f16_bits(vr[c]);
		}
		return;
	}
	int lane = threadIdx.x & 31;
	int8_t *kc = (int8_t *)ks, *vc = (int8_t *)vs + (size_t)r * kv_dim;
	uint16_t *ksc = (uint16_t *)(ks + (size_t)bs * kv_dim), *vsc = (uint16_t *)(vs + (size_t)bs * kv_dim);
	for (int c0 = threadIdx.x - lane; c0 < kv_dim; c0 += blockDim.x) {
		int c = c0 + lane, in = c < kv_dim;
		float x = in ? kr[c] : 0.f, y = in ? vr[c] : 0.f;
		float ax = cu_kv_amax(0.f, x), ay = cu_kv_amax(0.f, y);
		for (int o = group / 2; o > 0; o >>= 1) {
			ax = cu_kv_amax(ax, __shfl_xor_sync(0xffffffffu, ax, o));
			ay = cu_kv_amax(ay, __shfl_xor_sync(0xffffffffu, ay, o));
		}
		if (!in)
			continue;
		uint16_t dk = cu_kv_q8_scale(ax), dv = cu_kv_q8_scale(ay);
		kc[(size_t)c * bs + r] = cu_kv_q8_code(x, cu_kv_q8_inv(dk));
		vc[c] = cu_kv_q8_code(y, cu_kv_q8_inv(dv));
		if (c % group == 0) {
			ksc[cu_kv_k_scale(bs, c / group, r)] = dk;
			vsc[cu_kv_v_scale(kv_dim, group, c / group, r)] = dv;
		}
	}
}

void cu_kv_store(cudaStream_t st, const struct kt_kv *kv, int layer, const float *k,
		 const float *v, const struct cu_batch *b)
{
	if (b->n_tok <= 0)
		return;
	if (kv->dtype == KT_F16 || kv->dtype == KT_Q8_0)
		cu_launch_pdl(kv->dtype == KT_F16 ? kv_store_typed_kernel<KT_F16>
						  : kv_store_typed_kernel<KT_Q8_0>,
			      dim3(b->n_tok), dim3(256), 0, st, (char *)kv->base, kv->n_layers,
			      kv->block_size, kv->kv_dim, kv->group, layer, k, v, b->pos, b->row_tab,
			      b->tables, b->tab_stride);
	else
		cu_launch_pdl(kv_store_kernel, dim3(b->n_tok), dim3(256), 0, st, (float *)kv->base, kv->n_layers,
			      kv->block_size, kv->kv_dim, layer, k, v, b->pos, b->row_tab, b->tables,
			      b->tab_stride);
}

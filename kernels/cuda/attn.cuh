/*
 * kernels/cuda/attn.cuh — the decode attention units (one query row and
 * head, one split of its KV blocks, AW warps; NC 0: K and V not read
 * through the read-only cache, for a kernel that wrote them itself) and
 * the merge of the splits,
 * shared by attention.cu's kernels and the persistent layer kernel
 * (layer.cu). attention.cu says how they work.
 */
#ifndef LLAMAD_KERNELS_CUDA_ATTN_CUH
#define LLAMAD_KERNELS_CUDA_ATTN_CUH

#include <math.h>

#include "kernels/cuda/cuda.cuh"

#define AW CU_PW  /* warps per decode block */


__device__ __forceinline__ float warp_max(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

__device__ __forceinline__ float warp_sum(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

/* weight of a partial with max m against the overall max M */
__device__ __forceinline__ float rescale(float m, float M)
{
	return m == -INFINITY ? 0.f : expf(m - M);
}

__device__ __forceinline__ const float *k_block(const struct attn_args &a, int32_t b, int kvh)
{
	size_t span = (size_t)a.bs * a.kv_dim;
	return a.base + (((size_t)b * a.n_layers + a.layer) * 2) * span + (size_t)kvh * a.hd * a.bs;
}

__device__ __forceinline__ const float *v_block(const struct attn_args &a, int32_t b, int kvh)
{
	size_t span = (size_t)a.bs * a.kv_dim;
	return a.base + (((size_t)b * a.n_layers + a.layer) * 2 + 1) * span + (size_t)kvh * a.hd;
}

/* Write (m, l, acc) of (row t, head h, split s): final when one split. */
__device__ __forceinline__ void put_result(const struct attn_args &a, int t, int h, int s, int c,
					   float m, float l, float acc, int write_ml)
{
	if (a.n_split == 1) {
		a.out[((size_t)t * a.n_heads + h) * a.hd + c] = acc / l;
		return;
	}
	float *p = a.part + (((size_t)t * a.n_heads + h) * a.n_split + s) * (a.hd + 2);
	if (write_ml) {
		p[0] = m;
		p[1] = l;
	}
	p[2 + c] = acc;
}

/* Merge n partials (m, l, then hd weighted sums; hd + 2 floats apart): put
 * (c, M, L, A) for the calling thread's channels c, A the sum rescaled to
 * the overall max M, L the rescaled total. */
template <typename F>
__device__ __forceinline__ void merge_parts(const float *p, int n, int hd, F put)
{
	float M = -INFINITY;
	for (int w = 0; w < n; w++)
		M = fmaxf(M, p[w * (hd + 2)]);
	float L = 0.f;
	for (int w = 0; w < n; w++)
		L += p[w * (hd + 2) + 1] * rescale(p[w * (hd + 2)], M);
	for (int c = threadIdx.x; c < hd; c += blockDim.x) {
		float A = 0.f;
		for (int w = 0; w < n; w++)
			A += p[w * (hd + 2) + 2 + c] * rescale(p[w * (hd + 2)], M);
		put(c, M, L, A);
	}
}

template <int CPL>
__device__ __forceinline__ void attn_decode_unit(const struct attn_args &a, int t, int h, int s,
						 float *sm)
{
	int kvh = h / a.group, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, hd = a.hd;
	float *qs = sm, *ws = sm + hd;
	for (int c = threadIdx.x; c < hd; c += blockDim.x)
		qs[c] = a.q[((size_t)t * a.n_heads + h) * hd + c] * a.scale;
	__syncthreads();
	int p = a.pos[t], bs = a.bs, nblk = p / bs + 1;
	const int32_t *tab = a.tables + (size_t)a.row_tab[t] * a.tab_stride;
	float m = -INFINITY, l = 0.f, acc[CPL];
#pragma unroll
	for (int j = 0; j < CPL; j++)
		acc[j] = 0.f;
	for (int bi = s + a.n_split * warp; bi < nblk; bi += a.n_split * AW) {
		int32_t b = tab[bi];
		const float *kt = k_block(a, b, kvh), *vb = v_block(a, b, kvh);
		int n = min(bs, p + 1 - bi * bs);
		float sc = -INFINITY;
		if (lane < n) {
			float d = 0.f;
			for (int c = 0; c < hd; c++)
				d += qs[c] * kt[(size_t)c * bs + lane];
			sc = d;
		}
		float mn = fmaxf(m, warp_max(sc));
		float pr = lane < n ? expf(sc - mn) : 0.f;
		float alpha = rescale(m, mn);
		l = l * alpha + warp_sum(pr);
#pragma unroll
		for (int j = 0; j < CPL; j++)
			acc[j] *= alpha;
		for (int r = 0; r < n; r++) {
			float pv = __shfl_sync(0xffffffffu, pr, r);
			const float *vr = vb + (size_t)r * a.kv_dim;
#pragma unroll
			for (int j = 0; j < CPL; j++) {
				int c = lane + 32 * j;
				if (c < hd)
					acc[j] += pv * vr[c];
			}
		}
		m = mn;
	}
	float *mine = ws + warp * (hd + 2);
	if (lane == 0) {
		mine[0] = m;
		mine[1] = l;
	}
#pragma unroll
	for (int j = 0; j < CPL; j++)
		if (lane + 32 * j < hd)
			mine[2 + lane + 32 * j] = acc[j];
	__syncthreads();
	merge_parts(ws, AW, hd, [&](int c, float M, float L, float A) {
		put_result(a, t, h, s, c, M, L, A, c == 0);
	});
}

/*
 * Decode with 16-position blocks and head_dim a multiple of 8, up to NKMAX*8:
 * each warp loads a whole KV block at once (K as hd*16/128 float4 per lane,
 * V as one float4 of channels per lane per position), all loads in flight
 * together, then scores from registers: lane L holds K channels
 * c = 8i + L/4 of positions 4(L%4)..+3, reduced over the 8 lanes sharing L%4.
 */
template <int NKMAX, int NC>
__device__ __forceinline__ void attn_decode16_unit(const struct attn_args &a, int t, int h, int s,
						   float *sm)
{
	int kvh = h / a.group, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, hd = a.hd;
	int nk = hd / 8, vlane = lane * 4 < hd;
	float *qs = sm, *ws = sm + hd;
	for (int c = threadIdx.x; c < hd; c += blockDim.x)
		qs[c] = a.q[((size_t)t * a.n_heads + h) * hd + c] * a.scale;
	__syncthreads();
	int p = a.pos[t], nblk = p / 16 + 1;
	const int32_t *tab = a.tables + (size_t)a.row_tab[t] * a.tab_stride;
	float m = -INFINITY, l = 0.f;
	float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
	for (int bi = s + a.n_split * warp; bi < nblk; bi += a.n_split * AW) {
		int32_t b = tab[bi];
		const float4 *k4 = (const float4 *)k_block(a, b, kvh);
		const float *vb = v_block(a, b, kvh);
		int n = min(16, p + 1 - bi * 16);
		float4 kr[NKMAX], vr[16];
#pragma unroll
		for (int i = 0; i < NKMAX; i++)
			if (i < nk)
				kr[i] = NC ? __ldg(k4 + i * 32 + lane) : __ldcg(k4 + i * 32 + lane);
#pragma unroll
		for (int r = 0; r < 16; r++)
			vr[r] = !vlane || r >= n ? make_float4(0.f, 0.f, 0.f, 0.f)
				: NC ? __ldg((const float4 *)(vb + (size_t)r * a.kv_dim) + lane)
				     : __ldcg((const float4 *)(vb + (size_t)r * a.kv_dim) + lane);
		float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#pragma unroll
		for (int i = 0; i < NKMAX; i++)
			if (i < nk) {
				float qc = qs[i * 8 + lane / 4];
				s0 += qc * kr[i].x;
				s1 += qc * kr[i].y;
				s2 += qc * kr[i].z;
				s3 += qc * kr[i].w;
			}
#pragma unroll
		for (int o = 4; o < 32; o <<= 1) {
			s0 += __shfl_xor_sync(0xffffffffu, s0, o);
			s1 += __shfl_xor_sync(0xffffffffu, s1, o);
			s2 += __shfl_xor_sync(0xffffffffu, s2, o);
			s3 += __shfl_xor_sync(0xffffffffu, s3, o);
		}
		/* position lane (< 16): lane/4 holds it as component lane%4 */
		int src = (lane & 15) >> 2;
		float t0 = __shfl_sync(0xffffffffu, s0, src), t1 = __shfl_sync(0xffffffffu, s1, src);
		float t2 = __shfl_sync(0xffffffffu, s2, src), t3 = __shfl_sync(0xffffffffu, s3, src);
		int comp = lane & 3;
		float sc = comp == 0 ? t0 : comp == 1 ? t1 : comp == 2 ? t2 : t3;
		if (lane >= n)
			sc = -INFINITY;
		float mn = fmaxf(m, warp_max(sc));
		float pr = lane < n ? expf(sc - mn) : 0.f;
		float alpha = rescale(m, mn);
		l = l * alpha + warp_sum(pr);
		acc.x *= alpha;
		acc.y *= alpha;
		acc.z *= alpha;
		acc.w *= alpha;
#pragma unroll
		for (int r = 0; r < 16; r++) {
			float pv = __shfl_sync(0xffffffffu, pr, r);
			acc.x += pv * vr[r].x;
			acc.y += pv * vr[r].y;
			acc.z += pv * vr[r].z;
			acc.w += pv * vr[r].w;
		}
		m = mn;
	}
	float *mine = ws + warp * (hd + 2);
	if (lane == 0) {
		mine[0] = m;
		mine[1] = l;
	}
	if (vlane) {
		mine[2 + lane * 4] = acc.x;
		mine[3 + lane * 4] = acc.y;
		mine[4 + lane * 4] = acc.z;
		mine[5 + lane * 4] = acc.w;
	}
	__syncthreads();
	merge_parts(ws, AW, hd, [&](int c, float M, float L, float A) {
		put_result(a, t, h, s, c, M, L, A, c == 0);
	});
}

/* Merge the splits of (row, head) i: a thread per channel. */
__device__ __forceinline__ void attn_combine_unit(float *out, const float *part, int hd,
						  int n_split, int i)
{
	merge_parts(part + (size_t)i * n_split * (hd + 2), n_split, hd,
		    [&](int c, float M, float L, float A) {
			    (void)M;
			    out[(size_t)i * hd + c] = A / L;
		    });
}

#endif

/*
 * kernels/cuda/attn.cuh — the decode attention units (one query row and
 * head, one split of its KV blocks, AW warps; NC 0: K and V not read
 * through the read-only cache, for a kernel that wrote them itself) and
 * the merge of the splits,
 * shared by attention.cu's kernels and the persistent layer kernel
 * (candidates/layer.cu). attention.cu says how they work.
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
	return (const float *)a.base + (((size_t)b * a.n_layers + a.layer) * 2) * span +
	       (size_t)kvh * a.hd * a.bs;
}

__device__ __forceinline__ const float *v_block(const struct attn_args &a, int32_t b, int kvh)
{
	size_t span = (size_t)a.bs * a.kv_dim;
	return (const float *)a.base + (((size_t)b * a.n_layers + a.layer) * 2 + 1) * span +
	       (size_t)kvh * a.hd;
}

/*
 * The store's element type DT (kernels/backend.h): f32, or f16 and q8_0
 * converted as they are loaded (an f16 value widened, a q8_0 code times its
 * row's scale of the channel's group: exact in fp32, an 8-bit integer times
 * an 11-bit significand), so attention over a typed store computes what the
 * f32 kernels compute over the values it holds. No copy of a sequence is
 * made. The typed loads have never run on a GPU (written 2026-12-03
 * without one).
 */

/* Start (bytes) of the K (which 0) or V (1) span of block b. */
template <int DT>
__device__ __forceinline__ const char *kv_span(const struct attn_args &a, int32_t b, int which)
{
	size_t span = cu_kv_span_bytes(DT, a.bs, a.kv_dim, 1 << a.kv_gsh);
	return (const char *)a.base + cu_kv_span_off(b, a.n_layers, a.layer, which, span);
}

/* Element i of a typed span as fp32; q8_0: times the scale at index si
 * among the span's scales. */
template <int DT>
__device__ __forceinline__ float kv_at(const struct attn_args &a, const char *span, size_t i,
				       size_t si)
{
	if (DT == KT_F16)
		return __half2float(((const __half *)span)[i]);
	const __half *sc = (const __half *)(span + (size_t)a.bs * a.kv_dim);
	return __half2float(sc[si]) * (float)((const int8_t *)span)[i];
}

/* One block's K and V for kv head kvh: element (channel c of the head,
 * row r) of K and (r, c) of V as fp32. */
template <int DT>
struct kv_blk {
	const void *k, *v;  /* f32: the head's first K / V element; else the spans */
	int ch0;            /* the head's first channel */

	__device__ __forceinline__ kv_blk(const struct attn_args &a, int32_t b, int kvh)
	{
		ch0 = kvh * a.hd;
		if (DT == KT_F32) {
			k = k_block(a, b, kvh);
			v = v_block(a, b, kvh);
		} else {
			k = kv_span<DT>(a, b, 0);
			v = kv_span<DT>(a, b, 1);
		}
	}

	__device__ __forceinline__ float kat(const struct attn_args &a, int c, int r) const
	{
		if (DT == KT_F32)
			return ((const float *)k)[(size_t)c * a.bs + r];
		int ch = ch0 + c;
		return kv_at<DT>(a, (const char *)k, (size_t)ch * a.bs + r,
				 cu_kv_k_scale(a.bs, ch >> a.kv_gsh, r));
	}

	__device__ __forceinline__ float vat(const struct attn_args &a, int r, int c) const
	{
		if (DT == KT_F32)
			return ((const float *)v)[(size_t)r * a.kv_dim + c];
		int ch = ch0 + c;
		/* (cu_kv_v_scale with group 1 << kv_gsh) */
		return kv_at<DT>(a, (const char *)v, (size_t)r * a.kv_dim + ch,
				 (size_t)r * (a.kv_dim >> a.kv_gsh) + (ch >> a.kv_gsh));
	}
};

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

template <int CPL, int DT = KT_F32>
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
		const kv_blk<DT> kb(a, b, kvh);
		int n = min(bs, p + 1 - bi * bs);
		float sc = -INFINITY;
		if (lane < n) {
			float d = 0.f;
			for (int c = 0; c < hd; c++)
				d += qs[c] * kb.kat(a, c, lane);
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
#pragma unroll
			for (int j = 0; j < CPL; j++) {
				int c = lane + 32 * j;
				if (c < hd)
					acc[j] += pv * kb.vat(a, r, c);
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
 * One KV block of the 16-position decode unit in a lane's registers: K
 * channel kvh*hd + 8i + lane/4 at rows 4(lane%4)..+3 (i < nk), V channels
 * 4 lane..+3 of rows r < n (zeros past them and for lanes past hd/4), all
 * loads issued together. f32 as floats; a typed store as it is stored (f16
 * pairs, q8_0 codes and scales: fewer registers than the floats), widened
 * where kf / vf use them.
 */
template <int DT, int NKMAX>
struct d16_regs {
	float4 k[NKMAX], v[16];

	template <int NC>
	__device__ __forceinline__ void load(const struct attn_args &a, int32_t b, int kvh, int nk,
					     int n, int lane, int vlane)
	{
		const float4 *k4 = (const float4 *)k_block(a, b, kvh);
		const float *vb = v_block(a, b, kvh);
#pragma unroll
		for (int i = 0; i < NKMAX; i++)
			if (i < nk)
				k[i] = NC ? __ldg(k4 + i * 32 + lane) : __ldcg(k4 + i * 32 + lane);
#pragma unroll
		for (int r = 0; r < 16; r++)
			v[r] = !vlane || r >= n ? make_float4(0.f, 0.f, 0.f, 0.f)
				: NC ? __ldg((const float4 *)(vb + (size_t)r * a.kv_dim) + lane)
				     : __ldcg((const float4 *)(vb + (size_t)r * a.kv_dim) + lane);
	}

	__device__ __forceinline__ float4 kf(int i) const { return k[i]; }
	__device__ __forceinline__ float4 vf(int r) const { return v[r]; }
};

__device__ __forceinline__ float4 h4_f32(uint2 u)
{
	float2 lo = __half22float2(*(const __half2 *)&u.x), hi = __half22float2(*(const __half2 *)&u.y);
	return make_float4(lo.x, lo.y, hi.x, hi.y);
}

__device__ __forceinline__ float4 q4_f32(int u, float4 d)
{
	return make_float4(d.x * (float)(int8_t)u, d.y * (float)(int8_t)(u >> 8),
			   d.z * (float)(int8_t)(u >> 16), d.w * (float)(int8_t)(u >> 24));
}

template <int NKMAX>
struct d16_regs<KT_F16, NKMAX> {
	uint2 k[NKMAX], v[16];

	template <int NC>
	__device__ __forceinline__ void load(const struct attn_args &a, int32_t b, int kvh, int nk,
					     int n, int lane, int vlane)
	{
		const char *ks = kv_span<KT_F16>(a, b, 0), *vs = kv_span<KT_F16>(a, b, 1);
		int ch = kvh * a.hd + (lane >> 2), r0 = 4 * (lane & 3);
#pragma unroll
		for (int i = 0; i < NKMAX; i++)
			if (i < nk) {
				const uint2 *p = (const uint2 *)ks + ((size_t)(ch + 8 * i) * 16 + r0) / 4;
				k[i] = NC ? __ldg(p) : __ldcg(p);
			}
		ch = kvh * a.hd + 4 * lane;
#pragma unroll
		for (int r = 0; r < 16; r++) {
			const uint2 *p = (const uint2 *)vs + ((size_t)r * a.kv_dim + ch) / 4;
			v[r] = !vlane || r >= n ? make_uint2(0u, 0u) : NC ? __ldg(p) : __ldcg(p);
		}
	}

	__device__ __forceinline__ float4 kf(int i) const { return h4_f32(k[i]); }
	__device__ __forceinline__ float4 vf(int r) const { return h4_f32(v[r]); }
};

template <int NKMAX>
struct d16_regs<KT_Q8_0, NKMAX> {
	int k[NKMAX], v[16];
	uint2 ks[NKMAX];   /* K: the four rows' scales of the channel's group */
	__half vs[16];     /* V: row r's scale of the lane's group */

	template <int NC>
	__device__ __forceinline__ void load(const struct attn_args &a, int32_t b, int kvh, int nk,
					     int n, int lane, int vlane)
	{
		const char *ksp = kv_span<KT_Q8_0>(a, b, 0), *vsp = kv_span<KT_Q8_0>(a, b, 1);
		const __half *ksc = (const __half *)(ksp + (size_t)16 * a.kv_dim);
		const __half *vsc = (const __half *)(vsp + (size_t)16 * a.kv_dim);
		int ch = kvh * a.hd + (lane >> 2), r0 = 4 * (lane & 3);
		/* channel ch + 8i's group: the head's first (a head is whole
		 * groups) plus i / (group / 8), whatever the lane */
		const uint2 *q0 = (const uint2 *)(ksc + cu_kv_k_scale(16, (kvh * a.hd) >> a.kv_gsh, r0));
#pragma unroll
		for (int i = 0; i < NKMAX; i++)
			if (i < nk) {
				const int *p = (const int *)ksp + ((size_t)(ch + 8 * i) * 16 + r0) / 4;
				const uint2 *q = q0 + 4 * (i >> (a.kv_gsh - 3));  /* 16 scales a group */
				k[i] = NC ? __ldg(p) : __ldcg(p);
				ks[i] = NC ? __ldg(q) : __ldcg(q);
			}
		ch = kvh * a.hd + 4 * lane;
		/* (cu_kv_v_scale with group 1 << kv_gsh) */
		size_t si = (size_t)(ch >> a.kv_gsh), sstride = (size_t)(a.kv_dim >> a.kv_gsh);
#pragma unroll
		for (int r = 0; r < 16; r++) {
			const int *p = (const int *)vsp + ((size_t)r * a.kv_dim + ch) / 4;
			const __half *q = vsc + (size_t)r * sstride + si;
			int in = vlane && r < n;
			v[r] = !in ? 0 : NC ? __ldg(p) : __ldcg(p);
			vs[r] = !in ? __ushort_as_half(0) : NC ? __ldg(q) : __ldcg(q);
		}
	}

	__device__ __forceinline__ float4 kf(int i) const { return q4_f32(k[i], h4_f32(ks[i])); }
	__device__ __forceinline__ float4 vf(int r) const
	{
		float d = __half2float(vs[r]);
		return q4_f32(v[r], make_float4(d, d, d, d));
	}
};

/*
 * Decode with 16-position blocks and head_dim a multiple of 8, up to NKMAX*8:
 * each warp loads a whole KV block at once (K as hd*16/128 float4 per lane,
 * V as one float4 of channels per lane per position), all loads in flight
 * together, then scores from registers: lane L holds K channels
 * c = 8i + L/4 of positions 4(L%4)..+3, reduced over the 8 lanes sharing L%4.
 */
template <int NKMAX, int NC, int DT = KT_F32>
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
		int n = min(16, p + 1 - bi * 16);
		d16_regs<DT, NKMAX> kv;
		kv.template load<NC>(a, b, kvh, nk, n, lane, vlane);
		float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#pragma unroll
		for (int i = 0; i < NKMAX; i++)
			if (i < nk) {
				float qc = qs[i * 8 + lane / 4];
				float4 k = kv.kf(i);
				s0 += qc * k.x;
				s1 += qc * k.y;
				s2 += qc * k.z;
				s3 += qc * k.w;
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
			float4 v = kv.vf(r);
			acc.x += pv * v.x;
			acc.y += pv * v.y;
			acc.z += pv * v.z;
			acc.w += pv * v.w;
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

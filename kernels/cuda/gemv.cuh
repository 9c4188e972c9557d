/*
 * kernels/cuda/gemv.cuh — the pieces of the matrix-vector kernels, shared
 * by the one-op-at-a-time kernel (matmul.cu), the fused and split-K ones
 * (matmul.cu) and the persistent layer kernel (candidates/layer.cu).
 *
 * A warp computes the dot products of one or two weight rows (NWR) with up
 * to CU_GEMV_MAX activation rows (NT) staged in shared memory:
 *   job_setup  which weight rows warp job g takes (plain rows across up to
 *              three matrices, gate/up pairs, or RoPE pairs of q/k/v)
 *   fetch      the next U 16-byte loads per lane per row (issued before
 *              their use: the first batch even before the previous kernel
 *              ends, under programmatic dependent launch)
 *   rows_dot   the products, fp32 accumulation, summed over the warp
 *   job_store  the epilogue: store, add (residual), SwiGLU, or RoPE and the
 *              KV store of the fused q/k/v product
 *   stage_x    the block's activations in shared memory: fp32 as they are or
 *              RMS-normalized (the block computes the row's scale; with 256
 *              threads in rmsnorm.cu's order, so the same bits), or 8-bit
 *              blocks copied from cu_quant_x or made here (of x, of the
 *              normalized x, or of a slice of x for split-K)
 */
#ifndef LLAMAD_KERNELS_CUDA_GEMV_CUH
#define LLAMAD_KERNELS_CUDA_GEMV_CUH

#include "kernels/cuda/cuda.cuh"

/* weights per lane step: a 16-byte load (f32: two), a K-quant sub-block */
static constexpr __host__ __device__ int step_w(enum kt_dtype dt)
{
	return dt == KT_Q8_0 ? 16 : dt == KT_F32 || dt == KT_F16 || dt == KT_BF16 ? 8 : 32;
}

/* 16 bytes of weights, streamed (STREAM: not kept in L1) or read-only */
template <int STREAM>
__device__ __forceinline__ uint4 ld16(const void *p)
{
	return STREAM ? __ldcs((const uint4 *)p) : __ldg((const uint4 *)p);
}

/* W weights of a 16-byte chunk as fp32 (f16 / bf16 / fp32 pairs of chunks
 * are handled by the caller: fp32 takes two chunks per 8 weights). */
template <enum kt_dtype DT>
__device__ __forceinline__ void widen8(uint4 u, uint4 u2, float *f)
{
	if (DT == KT_F16) {
		const __half2 *h = (const __half2 *)&u;
#pragma unroll
		for (int i = 0; i < 4; i++) {
			float2 v = __half22float2(h[i]);
			f[2 * i] = v.x;
			f[2 * i + 1] = v.y;
		}
	} else if (DT == KT_BF16) {
		const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
#pragma unroll
		for (int i = 0; i < 4; i++) {
			float2 v = __bfloat1622float2(h[i]);
			f[2 * i] = v.x;
			f[2 * i + 1] = v.y;
		}
	} else {
		f[0] = __uint_as_float(u.x); f[1] = __uint_as_float(u.y);
		f[2] = __uint_as_float(u.z); f[3] = __uint_as_float(u.w);
		f[4] = __uint_as_float(u2.x); f[5] = __uint_as_float(u2.y);
		f[6] = __uint_as_float(u2.z); f[7] = __uint_as_float(u2.w);
	}
}

/* Weights c..c+W-1 of row r as fp32 (c a multiple of W). */
template <enum kt_dtype DT>
__device__ __forceinline__ void loadw(const void *w, size_t rows, int cols, int r, int c,
				      float *f)
{
	if (DT == KT_F32 || DT == KT_F16 || DT == KT_BF16) {
		const int es = DT == KT_F32 ? 4 : 2;
		const uint4 *p = (const uint4 *)((const char *)w + ((size_t)r * cols + c) * es);
		uint4 u = __ldg(p);
		widen8<DT>(u, DT == KT_F32 ? __ldg(p + 1) : u, f);
	} else if (DT == KT_Q8_0) {
		const int8_t *qs = (const int8_t *)w;
		const __half *sc = (const __half *)(qs + rows * cols);
		uint4 u = __ldg((const uint4 *)(qs + (size_t)r * cols + c));
		float d = __half2float(sc[(size_t)r * (cols / 32) + c / 32]);
		const int8_t *b = (const int8_t *)&u;
#pragma unroll
		for (int i = 0; i < 16; i++)
			f[i] = d * (float)b[i];
	} else if (DT == KT_Q4_0) {
		/* one whole block: byte i holds weight i (low) and i+16 (high) */
		const uint8_t *qs = (const uint8_t *)w;
		const __half *sc = (const __half *)(qs + rows * cols / 2);
		size_t blk = (size_t)r * (cols / 32) + c / 32;
		uint4 u = __ldg((const uint4 *)(qs + blk * 16));
		float d = __half2float(sc[blk]);
		const uint8_t *b = (const uint8_t *)&u;
#pragma unroll
		for (int i = 0; i < 16; i++) {
			f[i] = d * (float)((b[i] & 15) - 8);
			f[i + 16] = d * (float)((b[i] >> 4) - 8);
		}
	} else {
		/* K-quants: one 32-weight sub-block of a super-block */
		const uint8_t *b = (const uint8_t *)w +
			((size_t)r * (cols / 256) + c / 256) * kq_block_bytes(DT);
		kq_sub(DT, b, c % 256 / 32, f);
	}
}

/* the loads fetch/rows_dot keep in flight (16-byte streaming loads): the
 * 8-bit products and the plain dtypes; K-quants and the exact Q8_0 / Q4_0
 * path decode as they load */
template <enum kt_dtype DT, int QX>
struct gemv_pre {
	static constexpr int value = QX || DT == KT_F32 || DT == KT_F16 || DT == KT_BF16;
};

/*
 * U 16-byte chunks of weights per row for the batch at base: the warp's
 * lanes take consecutive 16-byte pieces (8 f16/bf16 or 4 fp32 weights; fp32
 * takes two pieces per 8 weights) up to lim weights; quantized rows (QX)
 * one 32-weight block per lane up to block lim (Q8_0: two pieces).
 */
template <enum kt_dtype DT, int QX, int U, int NWR, int STREAM>
__device__ __forceinline__ void fetch(const void *const *wp, const size_t *wrows, const int *wr,
				      int cols, int lim, int base, int lane, uint4 (&wa)[NWR][U],
				      uint4 (&wb)[NWR][U], float (&dw)[NWR][U])
{
#pragma unroll
	for (int i = 0; i < NWR; i++)
#pragma unroll
		for (int u = 0; u < U; u++) {
			if (QX) {
				int nb = cols / 32, b = base + u * 32 + lane;
				if (b >= lim)
					continue;
				size_t blk = (size_t)wr[i] * nb + b;
				if (DT == KT_Q8_0) {
					const int8_t *qs = (const int8_t *)wp[i];
					wa[i][u] = ld16<STREAM>(qs + blk * 32);
					wb[i][u] = ld16<STREAM>(qs + blk * 32 + 16);
					dw[i][u] = __half2float(((const __half *)(qs + wrows[i] * cols))[blk]);
				} else {
					const uint8_t *qs = (const uint8_t *)wp[i];
					wa[i][u] = ld16<STREAM>(qs + blk * 16);
					dw[i][u] = __half2float(((const __half *)(qs + wrows[i] * cols / 2))[blk]);
				}
			} else {
				const int es = DT == KT_F32 ? 4 : 2;
				int c = base + (u * 32 + lane) * 8;
				if (c >= lim)
					continue;
				const char *p = (const char *)wp[i] + ((size_t)wr[i] * cols + c) * es;
				wa[i][u] = ld16<STREAM>(p);
				if (DT == KT_F32)
					wb[i][u] = ld16<STREAM>(p + 16);
			}
		}
}

/* Staged activations: fp32 rows of stride xstride, or 8-bit blocks (QX)
 * whose first is block xoff of x, xstride bytes per row, scales and sums
 * xstride / 32 per row. */
struct gemv_x {
	const float *f;
	const int8_t *q;
	const float *d;
	const int *s;
	int xstride, xoff;
};

/*
 * acc[i][t] = row wr[i] of wp[i] . staged row t, over weights [0, vec)
 * (then the columns past vec one by one), or for QX the blocks [b0, b1).
 * On entry wa/wb/dw hold the batch at the first base (PRE kinds). Every
 * lane ends with the warp's sums.
 */
template <int NT, enum kt_dtype DT, int QX, int U, int NWR>
__device__ __forceinline__ void rows_dot(const void *const *wp, const size_t *wrows, const int *wr,
					 int cols, int vec, int b0, int b1, int lane,
					 const struct gemv_x &x, uint4 (&wa)[NWR][U],
					 uint4 (&wb)[NWR][U], float (&dw)[NWR][U],
					 float (&acc)[NWR][NT])
{
#pragma unroll
	for (int i = 0; i < NWR; i++)
#pragma unroll
		for (int t = 0; t < NT; t++)
			acc[i][t] = 0.f;
	if (gemv_pre<DT, QX>::value) {
		const int STEP = QX ? 32 * U : 256 * U;   /* blocks (QX) or weights per batch */
		int start = QX ? b0 : 0, lim = QX ? b1 : vec, xnb = x.xstride / 32;
		for (int base = start; base < lim; base += STEP) {
#pragma unroll
			for (int u = 0; u < U; u++) {
				if (QX) {
					int b = base + u * 32 + lane;
					if (b >= lim)
						continue;
					int xb = b - x.xoff;
#pragma unroll
					for (int t = 0; t < NT; t++) {
						const uint4 *xp = (const uint4 *)(x.q + (size_t)t * x.xstride + (size_t)xb * 32);
						uint4 xa = xp[0], xc = xp[1];
						float d = x.d[t * xnb + xb];
						int off = DT == KT_Q4_0 ? 8 * x.s[t * xnb + xb] : 0;
#pragma unroll
						for (int i = 0; i < NWR; i++) {
							uint4 lo = wa[i][u], hi = wb[i][u];
							if (DT == KT_Q4_0) {
								hi = make_uint4((lo.x >> 4) & 0x0f0f0f0fu, (lo.y >> 4) & 0x0f0f0f0fu,
										(lo.z >> 4) & 0x0f0f0f0fu, (lo.w >> 4) & 0x0f0f0f0fu);
								lo = make_uint4(lo.x & 0x0f0f0f0fu, lo.y & 0x0f0f0f0fu,
										lo.z & 0x0f0f0f0fu, lo.w & 0x0f0f0f0fu);
							}
							int sum = __dp4a((int)lo.x, (int)xa.x, 0);
							sum = __dp4a((int)lo.y, (int)xa.y, sum);
							sum = __dp4a((int)lo.z, (int)xa.z, sum);
							sum = __dp4a((int)lo.w, (int)xa.w, sum);
							sum = __dp4a((int)hi.x, (int)xc.x, sum);
							sum = __dp4a((int)hi.y, (int)xc.y, sum);
							sum = __dp4a((int)hi.z, (int)xc.z, sum);
							sum = __dp4a((int)hi.w, (int)xc.w, sum);
							acc[i][t] += dw[i][u] * d * (float)(sum - off);
						}
					}
				} else {
					int c = base + (u * 32 + lane) * 8;
					if (c >= lim)
						continue;
#pragma unroll
					for (int i = 0; i < NWR; i++) {
						float f[8];
						widen8<DT>(wa[i][u], DT == KT_F32 ? wb[i][u] : wa[i][u], f);
#pragma unroll
						for (int t = 0; t < NT; t++) {
							const float4 *xp = (const float4 *)(x.f + (size_t)t * x.xstride + c);
							float4 a = xp[0], b = xp[1];
							acc[i][t] += f[0] * a.x + f[1] * a.y + f[2] * a.z + f[3] * a.w +
								     f[4] * b.x + f[5] * b.y + f[6] * b.z + f[7] * b.w;
						}
					}
				}
			}
			if (base + STEP < lim)
				fetch<DT, QX, U, NWR, 1>(wp, wrows, wr, cols, lim, base + STEP, lane, wa, wb, dw);
		}
	} else {
		/* Q8_0 / Q4_0 widened to fp32 (exact mode), K-quants */
		constexpr int W = step_w(DT);
		for (int c = lane * W; c < vec; c += 32 * W) {
#pragma unroll
			for (int i = 0; i < NWR; i++) {
				float f[W];
				loadw<DT>(wp[i], wrows[i], cols, wr[i], c, f);
#pragma unroll
				for (int t = 0; t < NT; t++) {
					const float4 *xp = (const float4 *)(x.f + (size_t)t * x.xstride + c);
#pragma unroll
					for (int k = 0; k < W / 4; k++) {
						float4 v = xp[k];
						acc[i][t] += f[4 * k] * v.x + f[4 * k + 1] * v.y +
							     f[4 * k + 2] * v.z + f[4 * k + 3] * v.w;
					}
				}
			}
		}
	}
	if (!QX)
		for (int c = vec + lane; c < cols; c += 32)
#pragma unroll
			for (int i = 0; i < NWR; i++) {
				float wv = cu_w_at(wp[i], DT, wrows[i], cols, wr[i], c);
#pragma unroll
				for (int t = 0; t < NT; t++)
					acc[i][t] += wv * x.f[(size_t)t * x.xstride + c];
			}
#pragma unroll
	for (int i = 0; i < NWR; i++)
#pragma unroll
		for (int t = 0; t < NT; t++)
#pragma unroll
			for (int o = 16; o > 0; o >>= 1)
				acc[i][t] += __shfl_xor_sync(0xffffffffu, acc[i][t], o);
}

/* ---- warp jobs ---- */

/* The rows of warp job g. MODE 0: plain rows numbered across up to three
 * matrices sharing x (q, k, v in one launch); 1: y += x W^T; 2: gate and
 * up rows g; 3: the fused q/k/v's RoPE pairs (plan.h). */
struct gemv_rows {
	const void *wp[2];
	size_t wrows[2];
	int wr[2];
	int wk;            /* matrix of y (MODE 0 / 1 / 3) */
	int col;           /* MODE 3: output channel of the pair; else the row */
	int fi;            /* MODE 3: frequency index */
};

template <int MODE>
__device__ __forceinline__ int job_setup(const struct cu_gemv_job &j, int g, struct gemv_rows &r)
{
	if (MODE == 3) {
		struct cu_pair p;
		if (!cu_qkv_pair(g, j.rows[0], j.rows[1], j.rows[2], j.e.hd, j.e.half, &p))
			return 0;
		r.wp[0] = r.wp[1] = j.w[p.m];
		r.wrows[0] = r.wrows[1] = (size_t)j.rows[p.m];
		r.wr[0] = p.r0;
		r.wr[1] = p.r1;
		r.wk = p.m;
		r.col = p.c0;
		r.fi = p.fi;
		return 1;
	}
	if (MODE == 2) {
		r.wp[0] = j.w[0];
		r.wp[1] = j.w[1];
		r.wrows[0] = (size_t)j.rows[0];
		r.wrows[1] = (size_t)j.rows[1];
		r.wr[0] = r.wr[1] = r.col = g;
		r.wk = 0;
		return g < j.rows[0];
	}
	int wr = g, wk = 0;
	while (wk < j.n - 1 && wr >= j.rows[wk]) {
		wr -= j.rows[wk];
		wk++;
	}
	r.wp[0] = r.wp[1] = j.w[wk];
	r.wrows[0] = r.wrows[1] = (size_t)j.rows[wk];
	r.wr[0] = r.wr[1] = r.col = wr;
	r.wk = wk;
	return wr < j.rows[wk];
}

/* Store value x at element i of the fused epilogue's KV pool, in its
 * element type: f32 as it is, f16 rounded as the CPU's kt_kv_put (never
 * run on a GPU: written 2026-12-03 without one). */
__device__ __forceinline__ void epi_kv_put(const struct cu_gemv_epi &e, size_t i, float x)
{
	if (e.kv_dt == KT_F16)
		((uint16_t *)e.kv)[i] = cu_f16_bits(x);
	else
		((float *)e.kv)[i] = x;
}

/* The epilogue of a job (every lane holds the sums; lane 0 stores). */
template <int NT, int MODE, int NWR>
__device__ __forceinline__ void job_store(const struct cu_gemv_job &j, const struct gemv_rows &r,
					  int lane, float (&acc)[NWR][NT])
{
	if (lane)
		return;
#pragma unroll
	for (int t = 0; t < NT; t++) {
		if (MODE == 3) {
			const struct cu_gemv_epi &e = j.e;
			float a = acc[0][t], b = acc[NWR - 1][t];
			int p = e.pos[t];
			/* q, and k / v of a q8_0 pool: rows of y (kv_store follows) */
			int rows_out = r.wk == 0 || e.kv_dt == KT_Q8_0;
			int32_t blk = rows_out ? 0 : e.tables[(size_t)e.row_tab[t] * e.tab_stride + p / e.bs];
			int slot = p % e.bs;
			if (r.wk == 2) {
				if (rows_out) {
					float *y = j.y[2] + (size_t)t * j.rows[2] + r.col;
					y[0] = a;
					y[1] = b;
					continue;
				}
				epi_kv_put(e, cu_kv_v_off(blk, e.n_layers, e.layer, e.bs, e.kv_dim, r.col, slot), a);
				epi_kv_put(e, cu_kv_v_off(blk, e.n_layers, e.layer, e.bs, e.kv_dim, r.col + 1, slot), b);
				continue;
			}
			float ang = (float)p * e.inv_freq[r.fi], o0, o1;
			cu_rope_rot(a, b, cosf(ang), sinf(ang), &o0, &o1);
			if (rows_out) {
				float *q = j.y[r.wk] + (size_t)t * j.rows[r.wk] + r.col;
				q[0] = o0;
				q[1] = o1;
			} else {
				epi_kv_put(e, cu_kv_k_off(blk, e.n_layers, e.layer, e.bs, e.kv_dim, r.col, slot), o0);
				epi_kv_put(e, cu_kv_k_off(blk, e.n_layers, e.layer, e.bs, e.kv_dim, r.col + 1, slot), o1);
			}
			continue;
		}
		float *y = j.y[r.wk] + (size_t)t * j.rows[r.wk] + r.col;
		if (MODE == 2) {
			float gt = acc[0][t];
			*y = gt / (1.f + expf(-gt)) * acc[NWR - 1][t];
		} else if (MODE == 1) {
			*y += acc[0][t];
		} else {
			*y = acc[0][t];
		}
	}
}

/* ---- staging ---- */

/* (the kinds, XS_*, and their sizes, cu_stage_bytes: plan.h) */

/* Sum of squares of xr[0, n) over the block of NTHR threads, in
 * rmsnorm.cu's order: thread-strided sums, then the warps', then the
 * block's (red: 32 floats of shared memory). Every thread gets it. */
template <int NTHR>
__device__ __forceinline__ float block_sumsq(const float *xr, int n, float *red)
{
	float ss = 0.f;
	for (int i = threadIdx.x; i < n; i += NTHR)
		ss += xr[i] * xr[i];
	for (int o = 16; o > 0; o >>= 1)
		ss += __shfl_xor_sync(0xffffffffu, ss, o);
	if ((threadIdx.x & 31) == 0)
		red[threadIdx.x >> 5] = ss;
	__syncthreads();
	if (threadIdx.x < 32) {
		float v = threadIdx.x < NTHR / 32 ? red[threadIdx.x] : 0.f;
		for (int o = 16; o > 0; o >>= 1)
			v += __shfl_xor_sync(0xffffffffu, v, o);
		if (threadIdx.x == 0)
			red[0] = v;
	}
	__syncthreads();
	float r = red[0];
	__syncthreads();
	return r;
}

/* One lane's value of a 32-activation block as 8 bits: its code, and the
 * block's scale and sum of codes in every lane (quant_x's formula). */
__device__ __forceinline__ int warp_quant32(float v, float *d, int *sum)
{
	float a = fabsf(v);
	for (int o = 16; o > 0; o >>= 1)
		a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
	*d = cu_qx_scale(a);
	int q = cu_qx_code(v, *d), s = q;
	for (int o = 16; o > 0; o >>= 1)
		s += __shfl_xor_sync(0xffffffffu, s, o);
	*sum = s;
	return q;
}

/*
 * Stage NT rows of x (cols wide) in shared memory sm as SRC says; for the
 * 8-bit kinds, blocks [b0, b1) of 32 (all of them but for split-K). g, eps:
 * the norm's weights; xq/xd/xs: cu_quant_x's output (XS_Q8). Ends with the
 * block synchronized. Returns where the products find them.
 */
template <int NT, int SRC, int NTHR, int NC = 1>
__device__ __forceinline__ struct gemv_x stage_x(float4 *sm, const float *x, int cols,
						 const float *g, float eps, const int8_t *xq,
						 const float *xd, const int *xs, int b0, int b1,
						 float *red)
{
	struct gemv_x r;
	r.f = NULL;
	r.q = NULL;
	r.d = NULL;
	r.s = NULL;
	r.xoff = 0;
	/* (the block size a constant: the strided loops unroll, their loads
	 * in flight together) */
	const int nthr = NTHR, nw = NTHR / 32;
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	if (SRC == XS_F32 || SRC == XS_NORM) {
#pragma unroll 4
		for (int i = threadIdx.x; i < NT * cols / 4; i += nthr)
			sm[i] = NC ? __ldg((const float4 *)x + i) : __ldcg((const float4 *)x + i);
		__syncthreads();
		float *f = (float *)sm;
		if (SRC == XS_NORM) {
			for (int t = 0; t < NT; t++) {
				float *row = f + (size_t)t * cols;
				float scale = rsqrtf(block_sumsq<NTHR>(row, cols, red) / (float)cols + eps);
#pragma unroll 4
				for (int i = threadIdx.x; i < cols; i += nthr)
					row[i] = row[i] * scale * g[i];
			}
			__syncthreads();
		}
		r.f = f;
		r.xstride = cols;
		return r;
	}
	int nb = b1 - b0;  /* blocks staged per row */
	int8_t *q = (int8_t *)sm;
	float *d = (float *)(q + (size_t)NT * nb * 32);
	int *s = (int *)(d + NT * nb);
	if (SRC == XS_Q8) {
		uint4 *dst = (uint4 *)sm;
#pragma unroll 4
		for (int i = threadIdx.x; i < NT * cols / 16; i += nthr)
			dst[i] = ((const uint4 *)xq)[i];
		for (int i = threadIdx.x; i < NT * nb; i += nthr) {
			d[i] = xd[i];
			s[i] = xs[i];
		}
	} else {
		for (int t = 0; t < NT; t++) {
			const float *row = x + (size_t)t * cols;
			float scale = 1.f;
			if (SRC == XS_QNORM)
				scale = rsqrtf(block_sumsq<NTHR>(row, cols, red) / (float)cols + eps);
			for (int b = warp; b < nb; b += nw) {
				int c = (b0 + b) * 32 + lane;
				float v = SRC == XS_QNORM ? row[c] * scale * g[c] : row[c];
				float bd;
				int bs;
				q[((size_t)t * nb + b) * 32 + lane] = (int8_t)warp_quant32(v, &bd, &bs);
				if (!lane) {
					d[t * nb + b] = bd;
					s[t * nb + b] = bs;
				}
			}
		}
	}
	__syncthreads();
	r.q = q;
	r.d = d;
	r.s = s;
	r.xstride = nb * 32;
	r.xoff = b0;
	return r;
}


/* ---- the kernel and its launchers ---- */

#define GW CU_GW   /* warps per block */

/*
 * Warp job g per warp (job_setup), CU_GW warps a block. Each lane issues U
 * 16-byte weight loads per row before using any; the first batch is issued
 * before waiting for the previous kernel (weights do not depend on it:
 * programmatic dependent launch lets this overlap the previous kernel's
 * tail). The activations are then staged in shared memory once per block
 * (SRC, gemv.cuh) when they fit, else read from global memory (XS_NONE).
 * MODE: job_setup's; MODE 3 is the fused q/k/v with RoPE and the KV store.
 */
template <int NT, enum kt_dtype DT, int MODE, int QX, int U, int SRC>
__global__ void __launch_bounds__(GW * 32)
gemv_kernel(struct cu_gemv_job j, const float *__restrict__ x)
{
	extern __shared__ float4 xsm4[];
	__shared__ float red[32];
	const int NWR = MODE >= 2 ? 2 : 1;
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, cols = j.cols;
	struct gemv_rows r;
	int valid = job_setup<MODE>(j, blockIdx.x * GW + warp, r);
	uint4 wa[NWR][U], wb[NWR][U];
	float dw[NWR][U];
	const int PRE = gemv_pre<DT, QX>::value;
	int lim = QX ? cols / 32 : j.vec;
	if (valid && PRE)
		fetch<DT, QX, U, NWR, 1>(r.wp, r.wrows, r.wr, cols, lim, 0, lane, wa, wb, dw);
	cu_pdl_wait();
	cu_pdl_trigger();
	struct gemv_x xs;
	if constexpr (SRC == XS_NONE) {
		xs.f = x;
		xs.q = j.xq;
		xs.d = j.xd;
		xs.s = j.xs;
		xs.xstride = cols;
		xs.xoff = 0;
	} else {
		xs = stage_x<NT, SRC, GW * 32>(xsm4, x, cols, j.g, j.eps, j.xq, j.xd, j.xs, 0, cols / 32,
					       red);
	}
	if (!valid)
		return;
	float acc[NWR][NT];
	rows_dot<NT, DT, QX, U, NWR>(r.wp, r.wrows, r.wr, cols, j.vec, 0, cols / 32, lane, xs, wa,
				     wb, dw, acc);
	job_store<NT, MODE, NWR>(j, r, lane, acc);
}

/* Shared memory for staged activations (QX: 8-bit blocks), 0 when they do
 * not fit without opting in. */
static inline size_t xs_bytes(const struct cu_gemv_job *j, int n_tok, int qx)
{
	size_t b = cu_stage_bytes(qx ? XS_Q8 : XS_F32, n_tok, j->cols, j->cols / 32);
	return b <= CU_SMEM_PLAIN && j->cols % 32 == 0 ? b : 0;
}

/* warp jobs of a launch */
static inline int n_jobs(const struct cu_gemv_job *j, int mode)
{
	int total = j->rows[0] + (j->n > 1 ? j->rows[1] : 0) + (j->n > 2 ? j->rows[2] : 0);
	return mode == 3 ? total / 2 : mode == 0 ? total : j->rows[0];
}

/* SRC: XS_NONE picks the plain staging when it fits (fp32 or the 8-bit
 * copy), else none; the fused kinds need theirs to fit (checked by the
 * callers). */
template <int NT, enum kt_dtype DT, int MODE, int QX, int U, int SRC>
static void launch(cudaStream_t st, const struct cu_gemv_job *j, const float *x, int n_tok)
{
	dim3 grid((n_jobs(j, MODE) + GW - 1) / GW), block(GW * 32);
	if constexpr (SRC != XS_NONE) {
		size_t sm = cu_stage_bytes(SRC, n_tok, j->cols, j->cols / 32);
		cu_launch_pdl(gemv_kernel<NT, DT, MODE, QX, U, SRC>, grid, block, sm, st, *j, x);
	} else {
		size_t sm = xs_bytes(j, n_tok, QX);
		if (sm)
			cu_launch_pdl(gemv_kernel<NT, DT, MODE, QX, U, QX ? XS_Q8 : XS_F32>, grid, block,
				      sm, st, *j, x);
		else
			cu_launch_pdl(gemv_kernel<NT, DT, MODE, QX, U, XS_NONE>, grid, block, 0, st, *j,
				      x);
	}
}

/* FUSE: 0 plain (staged when it fits without opting in: fp32, or the 8-bit
 * copy of cu_quant_x's output; else read from memory), 1 normalized in the
 * kernel (fp32 or, QX, 8-bit made there; the caller checks it fits) */
template <int NT, int MODE, int FUSE>
static void gemv_dt(cudaStream_t st, const struct cu_gemv_job *j, enum kt_dtype dt,
		    const float *x, int qx)
{
	const int SF = FUSE == 1 ? XS_NORM : XS_NONE;
	const int SQ = FUSE == 1 ? XS_QNORM : XS_NONE;
	switch (dt) {
	case KT_F32: launch<NT, KT_F32, MODE, 0, 2, SF>(st, j, x, NT); break;
	case KT_F16: launch<NT, KT_F16, MODE, 0, 4, SF>(st, j, x, NT); break;
	case KT_BF16: launch<NT, KT_BF16, MODE, 0, 4, SF>(st, j, x, NT); break;
	case KT_Q8_0:
		if (qx)
			launch<NT, KT_Q8_0, MODE, 1, 2, SQ>(st, j, x, NT);
		else
			launch<NT, KT_Q8_0, MODE, 0, 1, SF>(st, j, x, NT);
		break;
	case KT_Q4_0:
		if (qx)
			launch<NT, KT_Q4_0, MODE, 1, 2, SQ>(st, j, x, NT);
		else
			launch<NT, KT_Q4_0, MODE, 0, 1, SF>(st, j, x, NT);
		break;
	case KT_Q4_K: launch<NT, KT_Q4_K, MODE, 0, 1, SF>(st, j, x, NT); break;
	case KT_Q5_K: launch<NT, KT_Q5_K, MODE, 0, 1, SF>(st, j, x, NT); break;
	case KT_Q6_K: launch<NT, KT_Q6_K, MODE, 0, 1, SF>(st, j, x, NT); break;
	default: break;
	}
}

template <int MODE, int FUSE>
static void gemv_mode(cudaStream_t st, const struct cu_gemv_job *j, enum kt_dtype dt,
		      const float *x, int n_tok, int qx)
{
	switch (n_tok) {
	case 1: gemv_dt<1, MODE, FUSE>(st, j, dt, x, qx); break;
	case 2: gemv_dt<2, MODE, FUSE>(st, j, dt, x, qx); break;
	case 3: gemv_dt<3, MODE, FUSE>(st, j, dt, x, qx); break;
	case 4: gemv_dt<4, MODE, FUSE>(st, j, dt, x, qx); break;
	case 5: gemv_dt<5, MODE, FUSE>(st, j, dt, x, qx); break;
	case 6: gemv_dt<6, MODE, FUSE>(st, j, dt, x, qx); break;
	case 7: gemv_dt<7, MODE, FUSE>(st, j, dt, x, qx); break;
	case 8: gemv_dt<8, MODE, FUSE>(st, j, dt, x, qx); break;
	default: break;
	}
}

/* j->vec and whether the 8-bit path applies */
static inline int cu_gemv_prep(struct cu_gemv_job *j, enum kt_dtype dt)
{
	/* W-wide steps need rows (weights and x) starting W-aligned */
	int W = step_w(dt);
	j->vec = j->cols % W == 0 ? j->cols : 0;
	return j->xq && (dt == KT_Q8_0 || dt == KT_Q4_0) && j->cols % 32 == 0;
}

#endif

/*
 * kernels/cuda/matmul.cu — matrix-vector products for small batches and
 * the conversions the cuBLAS path needs.
 *
 * The matrix-vector kernels read every weight byte once per call for up to
 * CU_GEMV_MAX activation rows: one warp per output row (and SwiGLU's gate
 * and up rows together), each lane keeping several 16-byte loads of its
 * row in flight, the activations staged in shared memory per block; lanes
 * are summed with shuffles; fp32 accumulation throughout.
 *  - f32 / f16 / bf16 (and quantized ones in exact mode): weights widened
 *    to fp32 in registers, fp32 activations.
 *  - Q4_K / Q5_K / Q6_K: each lane decodes a 32-weight sub-block of the
 *    file's super-blocks (kq.h) to fp32 in registers, fp32 activations.
 *    Never run on a GPU yet: the backend checks them against the host
 *    decoder when it places the first matrix of each type (backend.cu).
 *  - Q8_0 / Q4_0 (default): the activations are first quantized to 8 bits
 *    per block of 32 (scale = max|x| / 127, as llama.cpp does on GPUs), and
 *    each block's dot product is 8 __dp4a integer instructions, times the
 *    two scales; Q4_0's offset of 8 comes off through the block's sum of
 *    quantized activations.
 */
#include <stdio.h>

#include "kernels/cuda/cuda.cuh"


/* weights per lane step: a 16-byte load (f32: two), a K-quant sub-block */
static constexpr __host__ __device__ int step_w(enum kt_dtype dt)
{
	return dt == KT_Q8_0 ? 16 : dt == KT_F32 || dt == KT_F16 || dt == KT_BF16 ? 8 : 32;
}

/* Weights c..c+W-1 of row r as fp32 (c a multiple of W). */
template <enum kt_dtype DT>
__device__ __forceinline__ void loadw(const void *w, size_t rows, int cols, int r, int c,
				      float *f)
{
	if (DT == KT_F32) {
		const float4 *p = (const float4 *)((const float *)w + (size_t)r * cols + c);
		float4 a = __ldg(p), b = __ldg(p + 1);
		f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w;
		f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
	} else if (DT == KT_F16) {
		uint4 u = __ldg((const uint4 *)((const __half *)w + (size_t)r * cols + c));
		const __half2 *h = (const __half2 *)&u;
#pragma unroll
		for (int i = 0; i < 4; i++) {
			float2 v = __half22float2(h[i]);
			f[2 * i] = v.x;
			f[2 * i + 1] = v.y;
		}
	} else if (DT == KT_BF16) {
		uint4 u = __ldg((const uint4 *)((const __nv_bfloat16 *)w + (size_t)r * cols + c));
		const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
#pragma unroll
		for (int i = 0; i < 4; i++) {
			float2 v = __bfloat1622float2(h[i]);
			f[2 * i] = v.x;
			f[2 * i + 1] = v.y;
		}
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

#define GW 8   /* warps per block */

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

/* U 16-byte chunks of weights per row for the chunk batch at base: the
 * warp's lanes take consecutive 16-byte pieces (8 f16/bf16 or 4 fp32 weights;
 * fp32 takes two pieces per 8 weights), quantized rows one 32-weight block
 * per lane (Q8_0: two pieces). */
template <enum kt_dtype DT, int QX, int U, int NWR, int STREAM>
__device__ __forceinline__ void fetch(const void *const *wp, const size_t *wrows, int wr, int cols,
				      int vec, int base, int lane, uint4 (&wa)[NWR][U],
				      uint4 (&wb)[NWR][U], float (&dw)[NWR][U])
{
#pragma unroll
	for (int i = 0; i < NWR; i++)
#pragma unroll
		for (int u = 0; u < U; u++) {
			if (QX) {
				int nb = cols / 32, b = base + u * 32 + lane;
				if (b >= nb)
					continue;
				size_t blk = (size_t)wr * nb + b;
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
				if (c >= vec)
					continue;
				const char *p = (const char *)wp[i] + ((size_t)wr * cols + c) * es;
				wa[i][u] = ld16<STREAM>(p);
				if (DT == KT_F32)
					wb[i][u] = ld16<STREAM>(p + 16);
			}
		}
}

/*
 * One warp per output row (MODE 2: its gate and up rows), 8 warps a block.
 * Each lane issues U 16-byte weight loads per row before using any; the
 * first batch is issued before waiting for the previous kernel (weights do
 * not depend on it: programmatic dependent launch lets this overlap the
 * previous kernel's tail). The activations are then staged in shared
 * memory once per block when they fit (XS): fp32, or for Q8_0 / Q4_0 (QX)
 * the 8-bit blocks cu_quant_x made (quantizing inside every block was
 * measured slower: each block redid the whole vector).
 * MODE 0: up to three products sharing x, rows numbered across them (q, k,
 * v in one launch); MODE 1: y += x W^T; MODE 2: y = silu(x G^T) * (x U^T).
 */
template <int NT, enum kt_dtype DT, int MODE, int QX, int U, int XS>
__global__ void __launch_bounds__(GW * 32)
gemv_kernel(struct cu_gemv_job j, const float *__restrict__ x)
{
	extern __shared__ float4 xsm4[];
	const int NWR = MODE == 2 ? 2 : 1;
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, cols = j.cols;
	int g = blockIdx.x * GW + warp;
	/* this warp's weight rows */
	const void *wp[2] = { NULL, NULL };
	size_t wrows[2] = { 0, 0 };
	int wr = g, wk = 0, valid;
	if (MODE == 2) {
		valid = g < j.rows[0];
		wp[0] = j.w[0];
		wp[1] = j.w[1];
		wrows[0] = (size_t)j.rows[0];
		wrows[1] = (size_t)j.rows[1];
	} else {
		while (wk < j.n - 1 && wr >= j.rows[wk]) {
			wr -= j.rows[wk];
			wk++;
		}
		valid = wr < j.rows[wk];
		wp[0] = j.w[wk];
		wrows[0] = (size_t)j.rows[wk];
	}
	const int STEP = QX ? 32 * U : 256 * U;   /* blocks (QX) or weights per batch */
	int span = QX ? cols / 32 : j.vec;
	uint4 wa[NWR][U], wb[NWR][U];
	float dw[NWR][U];
	/* the 16-byte streaming loads: 8-bit products, f32 / f16 / bf16 */
	const int PRE = QX || DT == KT_F32 || DT == KT_F16 || DT == KT_BF16;
	if (valid && PRE)
		fetch<DT, QX, U, NWR, 1>(wp, wrows, wr, cols, j.vec, 0, lane, wa, wb, dw);
	cu_pdl_wait();
	cu_pdl_trigger();
	/* stage x: fp32 rows, or 8-bit rows then scales and sums */
	const float *xf = x;
	const int8_t *xq = j.xq;
	const float *xd = j.xd;
	const int *xs = j.xs;
	if (XS) {
		if (QX) {
			/* copy the 8-bit activations cu_quant_x made */
			int nb = NT * cols / 32;
			uint4 *d = (uint4 *)xsm4;
			for (int i = threadIdx.x; i < NT * cols / 16; i += GW * 32)
				d[i] = ((const uint4 *)j.xq)[i];
			float *sd = (float *)((int8_t *)xsm4 + NT * cols);
			int *ss = (int *)(sd + nb);
			for (int i = threadIdx.x; i < nb; i += GW * 32) {
				sd[i] = j.xd[i];
				ss[i] = j.xs[i];
			}
			xq = (const int8_t *)xsm4;
			xd = sd;
			xs = ss;
		} else {
			for (int i = threadIdx.x; i < NT * cols / 4; i += GW * 32)
				xsm4[i] = __ldg((const float4 *)x + i);
			xf = (const float *)xsm4;
		}
		__syncthreads();
	}
	if (!valid)
		return;
	float acc[NWR][NT];
#pragma unroll
	for (int i = 0; i < NWR; i++)
#pragma unroll
		for (int t = 0; t < NT; t++)
			acc[i][t] = 0.f;
	if (PRE) {
		int nb = cols / 32;
		for (int base = 0; base < span; base += STEP) {
#pragma unroll
			for (int u = 0; u < U; u++) {
				if (QX) {
					int b = base + u * 32 + lane;
					if (b >= nb)
						continue;
#pragma unroll
					for (int t = 0; t < NT; t++) {
						const uint4 *xp = (const uint4 *)(xq + (size_t)t * cols + (size_t)b * 32);
						uint4 xa = xp[0], xb = xp[1];
						float d = xd[t * nb + b];
						int off = DT == KT_Q4_0 ? 8 * xs[t * nb + b] : 0;
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
							sum = __dp4a((int)hi.x, (int)xb.x, sum);
							sum = __dp4a((int)hi.y, (int)xb.y, sum);
							sum = __dp4a((int)hi.z, (int)xb.z, sum);
							sum = __dp4a((int)hi.w, (int)xb.w, sum);
							acc[i][t] += dw[i][u] * d * (float)(sum - off);
						}
					}
				} else {
					int c = base + (u * 32 + lane) * 8;
					if (c >= span)
						continue;
#pragma unroll
					for (int i = 0; i < NWR; i++) {
						float f[8];
						widen8<DT>(wa[i][u], DT == KT_F32 ? wb[i][u] : wa[i][u], f);
#pragma unroll
						for (int t = 0; t < NT; t++) {
							const float4 *xp = (const float4 *)(xf + (size_t)t * cols + c);
							float4 a = xp[0], b = xp[1];
							acc[i][t] += f[0] * a.x + f[1] * a.y + f[2] * a.z + f[3] * a.w +
								     f[4] * b.x + f[5] * b.y + f[6] * b.z + f[7] * b.w;
						}
					}
				}
			}
			if (base + STEP < span)
				fetch<DT, QX, U, NWR, 1>(wp, wrows, wr, cols, j.vec, base + STEP, lane, wa, wb, dw);
		}
	} else {
		/* Q8_0 / Q4_0 widened to fp32 (exact mode), K-quants */
		constexpr int W = step_w(DT);
		for (int c = lane * W; c < j.vec; c += 32 * W) {
#pragma unroll
			for (int i = 0; i < NWR; i++) {
				float f[W];
				loadw<DT>(wp[i], wrows[i], cols, wr, c, f);
#pragma unroll
				for (int t = 0; t < NT; t++) {
					const float4 *xp = (const float4 *)(xf + (size_t)t * cols + c);
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
		for (int c = j.vec + lane; c < cols; c += 32)
#pragma unroll
			for (int i = 0; i < NWR; i++) {
				float wv = cu_w_at(wp[i], DT, wrows[i], cols, wr, c);
#pragma unroll
				for (int t = 0; t < NT; t++)
					acc[i][t] += wv * xf[(size_t)t * cols + c];
			}
#pragma unroll
	for (int i = 0; i < NWR; i++)
#pragma unroll
		for (int t = 0; t < NT; t++)
#pragma unroll
			for (int o = 16; o > 0; o >>= 1)
				acc[i][t] += __shfl_xor_sync(0xffffffffu, acc[i][t], o);
	if (lane)
		return;
#pragma unroll
	for (int t = 0; t < NT; t++) {
		float *y = j.y[wk] + (size_t)t * j.rows[wk] + wr;
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

/* Shared memory for staged activations (QX: quantized in the kernel), 0
 * when they do not fit in 48 KB. */
static size_t xs_bytes(const struct cu_gemv_job *j, int n_tok, int qx)
{
	size_t b = qx ? (size_t)n_tok * j->cols + (size_t)n_tok * j->cols / 32 * 8
		      : (size_t)n_tok * j->cols * 4;
	return b <= 48 * 1024 && j->cols % 32 == 0 ? b : 0;
}

template <int NT, enum kt_dtype DT, int MODE, int QX, int U>
static void launch(cudaStream_t st, const struct cu_gemv_job *j, const float *x, int n_tok)
{
	int total = MODE == 0 ? j->rows[0] + (j->n > 1 ? j->rows[1] : 0) + (j->n > 2 ? j->rows[2] : 0)
			      : j->rows[0];
	dim3 grid((total + GW - 1) / GW), block(GW * 32);
	size_t sm = xs_bytes(j, n_tok, QX);
	if (sm)
		cu_launch_pdl(gemv_kernel<NT, DT, MODE, QX, U, 1>, grid, block, sm, st, *j, x);
	else
		cu_launch_pdl(gemv_kernel<NT, DT, MODE, QX, U, 0>, grid, block, 0, st, *j, x);
}

template <int NT, int MODE>
static void gemv_dt(cudaStream_t st, const struct cu_gemv_job *j, enum kt_dtype dt,
		    const float *x, int qx)
{
	switch (dt) {
	case KT_F32: launch<NT, KT_F32, MODE, 0, 2>(st, j, x, NT); break;
	case KT_F16: launch<NT, KT_F16, MODE, 0, 4>(st, j, x, NT); break;
	case KT_BF16: launch<NT, KT_BF16, MODE, 0, 4>(st, j, x, NT); break;
	case KT_Q8_0:
		if (qx)
			launch<NT, KT_Q8_0, MODE, 1, 2>(st, j, x, NT);
		else
			launch<NT, KT_Q8_0, MODE, 0, 1>(st, j, x, NT);
		break;
	case KT_Q4_0:
		if (qx)
			launch<NT, KT_Q4_0, MODE, 1, 2>(st, j, x, NT);
		else
			launch<NT, KT_Q4_0, MODE, 0, 1>(st, j, x, NT);
		break;
	case KT_Q4_K: launch<NT, KT_Q4_K, MODE, 0, 1>(st, j, x, NT); break;
	case KT_Q5_K: launch<NT, KT_Q5_K, MODE, 0, 1>(st, j, x, NT); break;
	case KT_Q6_K: launch<NT, KT_Q6_K, MODE, 0, 1>(st, j, x, NT); break;
	default: break;
	}
}

template <int MODE>
static void gemv_mode(cudaStream_t st, const struct cu_gemv_job *j, enum kt_dtype dt,
		      const float *x, int n_tok, int qx)
{
	switch (n_tok) {
	case 1: gemv_dt<1, MODE>(st, j, dt, x, qx); break;
	case 2: gemv_dt<2, MODE>(st, j, dt, x, qx); break;
	case 3: gemv_dt<3, MODE>(st, j, dt, x, qx); break;
	case 4: gemv_dt<4, MODE>(st, j, dt, x, qx); break;
	case 5: gemv_dt<5, MODE>(st, j, dt, x, qx); break;
	case 6: gemv_dt<6, MODE>(st, j, dt, x, qx); break;
	case 7: gemv_dt<7, MODE>(st, j, dt, x, qx); break;
	case 8: gemv_dt<8, MODE>(st, j, dt, x, qx); break;
	default: break;
	}
}

/* One warp per block of 32 activations: 8-bit values, scale, sum. */
__global__ void quant_x_kernel(int8_t *xq, float *xd, int *xs, const float *x, size_t n_blocks)
{
	cu_pdl_wait();
	cu_pdl_trigger();
	size_t b = blockIdx.x * (size_t)(blockDim.x / 32) + threadIdx.x / 32;
	int lane = threadIdx.x & 31;
	if (b >= n_blocks)
		return;
	float v = x[b * 32 + lane], a = fabsf(v);
	for (int o = 16; o > 0; o >>= 1)
		a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
	float d = a / 127.f;
	int q = d > 0.f ? __float2int_rn(v / d) : 0;
	xq[b * 32 + lane] = (int8_t)q;
	int sum = q;
	for (int o = 16; o > 0; o >>= 1)
		sum += __shfl_xor_sync(0xffffffffu, sum, o);
	if (!lane) {
		xd[b] = d;
		xs[b] = sum;
	}
}

void cu_quant_x(cudaStream_t st, int8_t *xq, float *xd, int *xs, const float *x, size_t nb)
{
	cu_launch_pdl(quant_x_kernel, dim3((unsigned)((nb + 7) / 8)), dim3(256), 0, st, xq, xd, xs, x, nb);
}

void cu_gemv_run(cudaStream_t st, struct cu_gemv_job *j, enum kt_dtype dt, int mode,
		 const float *x, int n_tok)
{
	/* W-wide steps need rows (weights and x) starting W-aligned */
	int W = step_w(dt);
	j->vec = j->cols % W == 0 ? j->cols : 0;
	int qx = j->xq && (dt == KT_Q8_0 || dt == KT_Q4_0) && j->cols % 32 == 0;
	if (qx)
		cu_quant_x(st, j->xq, j->xd, j->xs, x, (size_t)n_tok * j->cols / 32);
	if (mode == 0)
		gemv_mode<0>(st, j, dt, x, n_tok, qx);
	else if (mode == 1)
		gemv_mode<1>(st, j, dt, x, n_tok, qx);
	else
		gemv_mode<2>(st, j, dt, x, n_tok, qx);
}

void cu_gemv(cudaStream_t st, float *y, const float *x, const struct kt_weight *w, int n_tok)
{
	struct cu_gemv_job j;
	memset(&j, 0, sizeof(j));
	j.w[0] = w->data;
	j.y[0] = y;
	j.rows[0] = w->rows;
	j.n = 1;
	j.cols = w->cols;
	cu_gemv_run(st, &j, w->dtype, 0, x, n_tok);
}

__global__ void dequant_kernel(__half *dst, const void *w, enum kt_dtype dt, size_t rows, int cols)
{
	size_t n = rows * cols;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		dst[i] = __float2half(cu_w_at(w, dt, rows, cols, (int)(i / cols), (int)(i % cols)));
}

void cu_dequant_f16(cudaStream_t st, __half *dst, const struct kt_weight *w)
{
	dequant_kernel<<<1024, 256, 0, st>>>(dst, w->data, w->dtype, (size_t)w->rows, w->cols);
}

__global__ void to_f16_kernel(__half *dst, const float *src, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		dst[i] = __float2half_rn(src[i]);
}

__global__ void to_bf16_kernel(__nv_bfloat16 *dst, const float *src, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		dst[i] = __float2bfloat16_rn(src[i]);
}

static unsigned grid_for(size_t n)
{
	size_t g = (n + 255) / 256;
	return (unsigned)(g < 4096 ? (g ? g : 1) : 4096);
}

void cu_f32_to_f16(cudaStream_t st, __half *dst, const float *src, size_t n)
{
	to_f16_kernel<<<grid_for(n), 256, 0, st>>>(dst, src, n);
}

void cu_f32_to_bf16(cudaStream_t st, __nv_bfloat16 *dst, const float *src, size_t n)
{
	to_bf16_kernel<<<grid_for(n), 256, 0, st>>>(dst, src, n);
}

/* One GGML block per thread: its scale to the scale array, its quants to
 * the quant array (same order within the block). */
__global__ void repack_kernel(uint8_t *dst, const uint8_t *src, int q8, size_t n_blocks)
{
	size_t qb = q8 ? 32 : 16, sb = 2 + qb;
	__half *sc = (__half *)(dst + n_blocks * qb);
	for (size_t b = blockIdx.x * (size_t)blockDim.x + threadIdx.x; b < n_blocks;
	     b += (size_t)gridDim.x * blockDim.x) {
		const uint8_t *s = src + b * sb;
		sc[b] = __ushort_as_half((unsigned short)(s[0] | s[1] << 8));
		for (size_t i = 0; i < qb; i++)
			dst[b * qb + i] = s[2 + i];
	}
}

void cu_repack_q(cudaStream_t st, void *dst, const void *src, enum kt_dtype t, size_t rows,
		 size_t cols)
{
	size_t nb = rows * cols / 32;
	repack_kernel<<<grid_for(nb), 256, 0, st>>>((uint8_t *)dst, (const uint8_t *)src,
						     t == KT_Q8_0, nb);
}

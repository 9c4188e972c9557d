/*
 * kernels/cuda/matmul.cu — matrix-vector products for small batches and
 * the conversions the cuBLAS path needs.
 *
 * The matrix-vector kernels read every weight byte once per call for up to
 * CU_GEMV_MAX activation rows: a warp takes NR weight rows at once (two
 * output rows, or the gate and up rows of one SwiGLU output) so that the
 * activation loads are shared, each lane moving 16 bytes of a row per step
 * with several steps in flight; lanes are summed with shuffles, fp32
 * accumulation throughout.
 *  - f32 / f16 / bf16 (and quantized ones in exact mode): weights widened
 *    to fp32 in registers, fp32 activations.
 *  - Q8_0 / Q4_0 (default): the activations are first quantized to 8 bits
 *    per block of 32 (scale = max|x| / 127, as llama.cpp does on GPUs), and
 *    each block's dot product is 8 __dp4a integer instructions, times the
 *    two scales; Q4_0's offset of 8 comes off through the block's sum of
 *    quantized activations.
 */
#include "kernels/cuda/cuda.cuh"

#define WARPS 4
#define NR 2      /* weight rows per warp */

/* weights per lane step: 16-byte loads of every dtype */
template <enum kt_dtype DT> struct step { enum { W = DT == KT_Q8_0 ? 16 : DT == KT_Q4_0 ? 32 : 8 }; };

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
	}
}

/* The warp's weight rows: pointer, row count of their matrix, row index. */
struct wrows {
	const void *w[NR];
	size_t rows[NR];
	int r[NR];
	int n;   /* valid rows */
};

__device__ __forceinline__ void warp_reduce(float *v, int n)
{
	for (int i = 0; i < n; i++)
#pragma unroll
		for (int o = 16; o > 0; o >>= 1)
			v[i] += __shfl_xor_sync(0xffffffffu, v[i], o);
}

/* fp32 activations: acc[i][t] = row i . x[t] */
template <int NT, enum kt_dtype DT>
__device__ __forceinline__ void dot_f(const struct wrows &R, int cols, int vec,
				      const float *__restrict__ x, float (&acc)[NR][NT])
{
	const int W = step<DT>::W;
	int lane = threadIdx.x & 31;
#pragma unroll
	for (int i = 0; i < NR; i++)
#pragma unroll
		for (int t = 0; t < NT; t++)
			acc[i][t] = 0.f;
#pragma unroll 2
	for (int c = lane * W; c < vec; c += 32 * W) {
		float f[NR][W];
#pragma unroll
		for (int i = 0; i < NR; i++)
			if (i < R.n)
				loadw<DT>(R.w[i], R.rows[i], cols, R.r[i], c, f[i]);
#pragma unroll
		for (int t = 0; t < NT; t++) {
			const float4 *xp = (const float4 *)(x + (size_t)t * cols + c);
#pragma unroll
			for (int k = 0; k < W / 4; k++) {
				float4 v = __ldg(xp + k);
#pragma unroll
				for (int i = 0; i < NR; i++)
					acc[i][t] += f[i][4 * k] * v.x + f[i][4 * k + 1] * v.y +
						     f[i][4 * k + 2] * v.z + f[i][4 * k + 3] * v.w;
			}
		}
	}
	for (int c = vec + lane; c < cols; c += 32)
#pragma unroll
		for (int i = 0; i < NR; i++)
			if (i < R.n) {
				float wv = cu_w_at(R.w[i], DT, R.rows[i], cols, R.r[i], c);
#pragma unroll
				for (int t = 0; t < NT; t++)
					acc[i][t] += wv * x[(size_t)t * cols + c];
			}
	warp_reduce(&acc[0][0], NR * NT);
}

/* 8-bit activations (xq, scale xd and sum xs per block of 32): Q8_0 / Q4_0
 * weights with __dp4a. */
template <int NT, enum kt_dtype DT>
__device__ __forceinline__ void dot_q(const struct wrows &R, int cols, const int8_t *__restrict__ xq,
				      const float *__restrict__ xd, const int *__restrict__ xs,
				      float (&acc)[NR][NT])
{
	int lane = threadIdx.x & 31, nb = cols / 32;
#pragma unroll
	for (int i = 0; i < NR; i++)
#pragma unroll
		for (int t = 0; t < NT; t++)
			acc[i][t] = 0.f;
#pragma unroll 2
	for (int b = lane; b < nb; b += 32) {
		uint4 w0[NR], w1[NR];
		float dw[NR];
#pragma unroll
		for (int i = 0; i < NR; i++) {
			if (i >= R.n)
				continue;
			size_t blk = (size_t)R.r[i] * nb + b;
			if (DT == KT_Q8_0) {
				const int8_t *qs = (const int8_t *)R.w[i];
				const uint4 *p = (const uint4 *)(qs + blk * 32);
				w0[i] = __ldg(p);
				w1[i] = __ldg(p + 1);
				dw[i] = __half2float(((const __half *)(qs + R.rows[i] * cols))[blk]);
			} else {
				const uint8_t *qs = (const uint8_t *)R.w[i];
				uint4 u = __ldg((const uint4 *)(qs + blk * 16));
				w0[i] = make_uint4(u.x & 0x0f0f0f0fu, u.y & 0x0f0f0f0fu, u.z & 0x0f0f0f0fu,
						   u.w & 0x0f0f0f0fu);
				w1[i] = make_uint4((u.x >> 4) & 0x0f0f0f0fu, (u.y >> 4) & 0x0f0f0f0fu,
						   (u.z >> 4) & 0x0f0f0f0fu, (u.w >> 4) & 0x0f0f0f0fu);
				dw[i] = __half2float(((const __half *)(qs + R.rows[i] * cols / 2))[blk]);
			}
		}
#pragma unroll
		for (int t = 0; t < NT; t++) {
			const uint4 *xp = (const uint4 *)(xq + (size_t)t * cols + (size_t)b * 32);
			uint4 xa = __ldg(xp), xb = __ldg(xp + 1);
			float d = __ldg(xd + (size_t)t * nb + b);
			int off = DT == KT_Q4_0 ? 8 * __ldg(xs + (size_t)t * nb + b) : 0;
#pragma unroll
			for (int i = 0; i < NR; i++) {
				int s = __dp4a((int)w0[i].x, (int)xa.x, 0);
				s = __dp4a((int)w0[i].y, (int)xa.y, s);
				s = __dp4a((int)w0[i].z, (int)xa.z, s);
				s = __dp4a((int)w0[i].w, (int)xa.w, s);
				s = __dp4a((int)w1[i].x, (int)xb.x, s);
				s = __dp4a((int)w1[i].y, (int)xb.y, s);
				s = __dp4a((int)w1[i].z, (int)xb.z, s);
				s = __dp4a((int)w1[i].w, (int)xb.w, s);
				acc[i][t] += dw[i] * d * (float)(s - off);
			}
		}
	}
	warp_reduce(&acc[0][0], NR * NT);
}

/*
 * MODE 0: up to three products sharing x, rows numbered across them (q, k,
 * v in one launch), NR output rows per warp; MODE 1: y += x W^T, NR rows
 * per warp; MODE 2: y = silu(x G^T) * (x U^T), one output row per warp.
 * QX: x comes quantized (dot_q), else fp32 (dot_f).
 */
template <int NT, enum kt_dtype DT, int MODE, int QX>
__global__ void __launch_bounds__(WARPS * 32)
gemv_kernel(struct cu_gemv_job j, const float *__restrict__ x)
{
	int lane = threadIdx.x & 31;
	int gw = blockIdx.x * WARPS + (threadIdx.x >> 5);
	struct wrows R;
	int k[NR];
	R.n = 0;
	if (MODE == 2) {
		if (gw >= j.rows[0])
			return;
		for (int i = 0; i < 2; i++) {
			R.w[i] = j.w[i];
			R.rows[i] = (size_t)j.rows[i];
			R.r[i] = gw;
			k[i] = 0;
		}
		R.n = 2;
	} else {
#pragma unroll
		for (int i = 0; i < NR; i++) {
			int r = gw * NR + i, kk = 0;
			while (kk < j.n - 1 && r >= j.rows[kk]) {
				r -= j.rows[kk];
				kk++;
			}
			if (r >= j.rows[kk])
				break;
			R.w[i] = j.w[kk];
			R.rows[i] = (size_t)j.rows[kk];
			R.r[i] = r;
			k[i] = kk;
			R.n = i + 1;
		}
		if (!R.n)
			return;
	}
	float acc[NR][NT];
	if (QX)
		dot_q<NT, DT>(R, j.cols, j.xq, j.xd, j.xs, acc);
	else
		dot_f<NT, DT>(R, j.cols, j.vec, x, acc);
	if (lane)
		return;
	if (MODE == 2) {
#pragma unroll
		for (int t = 0; t < NT; t++) {
			float g = acc[0][t];
			j.y[0][(size_t)t * j.rows[0] + gw] = g / (1.f + expf(-g)) * acc[1][t];
		}
	} else {
#pragma unroll
		for (int t = 0; t < NT; t++) {
#pragma unroll
			for (int i = 0; i < NR; i++) {
				if (i >= R.n)
					continue;
				float *y = j.y[k[i]] + (size_t)t * j.rows[k[i]] + R.r[i];
				if (MODE == 1)
					*y += acc[i][t];
				else
					*y = acc[i][t];
			}
		}
	}
}

template <int NT, int MODE>
static void gemv_dt(cudaStream_t st, const struct cu_gemv_job *j, enum kt_dtype dt,
		    const float *x, int qx)
{
	int total = MODE == 0 ? j->rows[0] + (j->n > 1 ? j->rows[1] : 0) + (j->n > 2 ? j->rows[2] : 0)
			      : j->rows[0];
	int per_block = MODE == 2 ? WARPS : WARPS * NR;
	dim3 grid((total + per_block - 1) / per_block), block(WARPS * 32);
	switch (dt) {
	case KT_F32: gemv_kernel<NT, KT_F32, MODE, 0><<<grid, block, 0, st>>>(*j, x); break;
	case KT_F16: gemv_kernel<NT, KT_F16, MODE, 0><<<grid, block, 0, st>>>(*j, x); break;
	case KT_BF16: gemv_kernel<NT, KT_BF16, MODE, 0><<<grid, block, 0, st>>>(*j, x); break;
	case KT_Q8_0:
		if (qx)
			gemv_kernel<NT, KT_Q8_0, MODE, 1><<<grid, block, 0, st>>>(*j, x);
		else
			gemv_kernel<NT, KT_Q8_0, MODE, 0><<<grid, block, 0, st>>>(*j, x);
		break;
	case KT_Q4_0:
		if (qx)
			gemv_kernel<NT, KT_Q4_0, MODE, 1><<<grid, block, 0, st>>>(*j, x);
		else
			gemv_kernel<NT, KT_Q4_0, MODE, 0><<<grid, block, 0, st>>>(*j, x);
		break;
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

void cu_gemv_run(cudaStream_t st, struct cu_gemv_job *j, enum kt_dtype dt, int mode,
		 const float *x, int n_tok)
{
	/* W-wide steps need rows (weights and x) starting W-aligned */
	int W = dt == KT_Q8_0 ? 16 : dt == KT_Q4_0 ? 32 : 8;
	j->vec = j->cols % W == 0 ? j->cols : 0;
	int qx = j->xq && (dt == KT_Q8_0 || dt == KT_Q4_0) && j->cols % 32 == 0;
	if (qx) {
		size_t nb = (size_t)n_tok * j->cols / 32;
		quant_x_kernel<<<(unsigned)((nb + 7) / 8), 256, 0, st>>>(j->xq, j->xd, j->xs, x, nb);
	}
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

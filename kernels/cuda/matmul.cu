/*
 * kernels/cuda/matmul.cu — matrix-vector products for small batches and
 * the conversions the cuBLAS path needs.
 *
 * cu_gemv: one warp per output row, reading the row once for up to
 * CU_GEMV_MAX activation rows; each lane takes 8 consecutive weights per
 * step (16-byte loads for f16/bf16, 32 for f32, 8 for Q8_0, 4 for Q4_0),
 * dequantizes them in registers and accumulates in fp32; lanes are summed
 * with shuffles. Weight bytes are read exactly once per call, so the kernel
 * runs at memory speed for decode.
 */
#include "kernels/cuda/cuda.cuh"

#define WARPS 4

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

/* Dot products of row r of w with the NT rows of x, summed over the warp
 * (every lane gets the totals). */
template <int NT, enum kt_dtype DT>
__device__ __forceinline__ void row_dot(const void *__restrict__ w, size_t rows, int cols,
					int vec, int r, const float *__restrict__ x, float *acc)
{
	const int W = step<DT>::W;
	int lane = threadIdx.x & 31;
#pragma unroll
	for (int t = 0; t < NT; t++)
		acc[t] = 0.f;
#pragma unroll 2
	for (int c = lane * W; c < vec; c += 32 * W) {
		float f[W];
		loadw<DT>(w, rows, cols, r, c, f);
#pragma unroll
		for (int t = 0; t < NT; t++) {
			const float4 *xp = (const float4 *)(x + (size_t)t * cols + c);
			float a = 0.f;
#pragma unroll
			for (int i = 0; i < W / 4; i++) {
				float4 v = __ldg(xp + i);
				a += f[4 * i] * v.x + f[4 * i + 1] * v.y + f[4 * i + 2] * v.z +
				     f[4 * i + 3] * v.w;
			}
			acc[t] += a;
		}
	}
	for (int c = vec + lane; c < cols; c += 32) {
		float wv = cu_w_at(w, DT, rows, cols, r, c);
#pragma unroll
		for (int t = 0; t < NT; t++)
			acc[t] += wv * x[(size_t)t * cols + c];
	}
#pragma unroll
	for (int t = 0; t < NT; t++) {
#pragma unroll
		for (int o = 16; o > 0; o >>= 1)
			acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], o);
	}
}

/*
 * One warp per output row. MODE 0: up to three products sharing x, rows
 * numbered across them (q, k, v in one launch); MODE 1: y += x W^T (the
 * residual add); MODE 2: y = silu(x G^T) * (x U^T), gate and up rows of
 * one index in the same warp.
 */
template <int NT, enum kt_dtype DT, int MODE>
__global__ void __launch_bounds__(WARPS * 32)
gemv_kernel(struct cu_gemv_job j, const float *__restrict__ x)
{
	int lane = threadIdx.x & 31;
	int r = blockIdx.x * WARPS + (threadIdx.x >> 5), k = 0;
	if (MODE == 0)
		while (k < j.n - 1 && r >= j.rows[k]) {
			r -= j.rows[k];
			k++;
		}
	if (r >= j.rows[k])
		return;
	float acc[NT];
	row_dot<NT, DT>(j.w[k], (size_t)j.rows[k], j.cols, j.vec, r, x, acc);
	if (MODE == 2) {
		float up[NT];
		row_dot<NT, DT>(j.w[1], (size_t)j.rows[1], j.cols, j.vec, r, x, up);
#pragma unroll
		for (int t = 0; t < NT; t++)
			acc[t] = acc[t] / (1.f + expf(-acc[t])) * up[t];
	}
	if (lane == 0) {
#pragma unroll
		for (int t = 0; t < NT; t++) {
			float *y = j.y[k] + (size_t)t * j.rows[k] + r;
			if (MODE == 1)
				*y += acc[t];
			else
				*y = acc[t];
		}
	}
}

template <int NT, int MODE>
static void gemv_dt(cudaStream_t st, const struct cu_gemv_job *j, enum kt_dtype dt,
		    const float *x)
{
	int total = MODE == 0 ? j->rows[0] + (j->n > 1 ? j->rows[1] : 0) + (j->n > 2 ? j->rows[2] : 0)
			      : j->rows[0];
	dim3 grid((total + WARPS - 1) / WARPS), block(WARPS * 32);
	switch (dt) {
	case KT_F32: gemv_kernel<NT, KT_F32, MODE><<<grid, block, 0, st>>>(*j, x); break;
	case KT_F16: gemv_kernel<NT, KT_F16, MODE><<<grid, block, 0, st>>>(*j, x); break;
	case KT_BF16: gemv_kernel<NT, KT_BF16, MODE><<<grid, block, 0, st>>>(*j, x); break;
	case KT_Q8_0: gemv_kernel<NT, KT_Q8_0, MODE><<<grid, block, 0, st>>>(*j, x); break;
	case KT_Q4_0: gemv_kernel<NT, KT_Q4_0, MODE><<<grid, block, 0, st>>>(*j, x); break;
	default: break;
	}
}

template <int MODE>
static void gemv_mode(cudaStream_t st, const struct cu_gemv_job *j, enum kt_dtype dt,
		      const float *x, int n_tok)
{
	switch (n_tok) {
	case 1: gemv_dt<1, MODE>(st, j, dt, x); break;
	case 2: gemv_dt<2, MODE>(st, j, dt, x); break;
	case 3: gemv_dt<3, MODE>(st, j, dt, x); break;
	case 4: gemv_dt<4, MODE>(st, j, dt, x); break;
	case 5: gemv_dt<5, MODE>(st, j, dt, x); break;
	case 6: gemv_dt<6, MODE>(st, j, dt, x); break;
	case 7: gemv_dt<7, MODE>(st, j, dt, x); break;
	case 8: gemv_dt<8, MODE>(st, j, dt, x); break;
	default: break;
	}
}

void cu_gemv_run(cudaStream_t st, struct cu_gemv_job *j, enum kt_dtype dt, int mode,
		 const float *x, int n_tok)
{
	/* W-wide steps need rows (weights and x) starting W-aligned */
	int W = dt == KT_Q8_0 ? 16 : dt == KT_Q4_0 ? 32 : 8;
	j->vec = j->cols % W == 0 ? j->cols : 0;
	if (mode == 0)
		gemv_mode<0>(st, j, dt, x, n_tok);
	else if (mode == 1)
		gemv_mode<1>(st, j, dt, x, n_tok);
	else
		gemv_mode<2>(st, j, dt, x, n_tok);
}

void cu_gemv(cudaStream_t st, float *y, const float *x, const struct kt_weight *w, int n_tok)
{
	struct cu_gemv_job j = { { w->data, NULL, NULL }, { y, NULL, NULL }, { w->rows, 0, 0 }, 1,
				 w->cols, 0 };
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

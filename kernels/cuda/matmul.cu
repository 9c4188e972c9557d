/*
 * kernels/cuda/matmul.cu — matrix-vector products for small batches and
 * the conversions the cuBLAS path needs.
 *
 * The matrix-vector kernels read every weight byte once per call for up to
 * CU_GEMV_MAX activation rows: a block of 256 threads takes 4-8 weight rows
 * (output rows, or the gate and up rows of SwiGLU outputs) and splits
 * their columns across its threads, each moving 16 bytes of every row per
 * step so that many loads are in flight and the activation loads are
 * shared; fp32 accumulation throughout.
 *  - f32 / f16 / bf16 (and quantized ones in exact mode): weights widened
 *    to fp32 in registers, fp32 activations.
 *  - Q8_0 / Q4_0 (default): the activations are first quantized to 8 bits
 *    per block of 32 (scale = max|x| / 127, as llama.cpp does on GPUs), and
 *    each block's dot product is 8 __dp4a integer instructions, times the
 *    two scales; Q4_0's offset of 8 comes off through the block's sum of
 *    quantized activations.
 */
#include "kernels/cuda/cuda.cuh"


/* weights per lane step: 16-byte loads of every dtype */
template <enum kt_dtype DT> struct step { static constexpr int W = DT == KT_Q8_0 ? 16 : DT == KT_Q4_0 ? 32 : 8; };

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

/* Output rows per block: quantized weights take one 32-weight block per
 * thread step, so a block covers more rows; SwiGLU reads two weight rows
 * per output row. At most 8 weight rows per block. */
template <int QX, int MODE> struct rows_per { static constexpr int R = (QX ? 8 : 4) / (MODE == 2 ? 2 : 1); };

/*
 * One block of 256 threads per R output rows, the columns split across its
 * threads: each thread keeps its 16-byte loads of every row in flight at
 * once, partial sums go through warp shuffles and shared memory.
 * MODE 0: up to three products sharing x, rows numbered across them (q, k,
 * v in one launch); MODE 1: y += x W^T; MODE 2: y = silu(x G^T) * (x U^T).
 * QX: x comes as 8-bit blocks (Q8_0 / Q4_0 with __dp4a), else fp32.
 */
template <int NT, enum kt_dtype DT, int MODE, int QX>
__global__ void __launch_bounds__(256)
gemv_kernel(struct cu_gemv_job j, const float *__restrict__ x)
{
	const int R = rows_per<QX, MODE>::R, NW = MODE == 2 ? 2 * R : R;
	const int W = step<DT>::W;
	__shared__ float red[8][NW * NT];
	int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	int g0 = blockIdx.x * R;
	const void *wp[NW];
	size_t wrows[NW];
	int wr[NW], wk[NW], nw = 0;
#pragma unroll
	for (int i = 0; i < NW; i++) {
		wp[i] = NULL;
		wrows[i] = 0;
		wr[i] = 0;
		wk[i] = 0;
	}
	if (MODE == 2) {
		int n = min(R, j.rows[0] - g0);
#pragma unroll
		for (int i = 0; i < NW; i++) {
			int h = i < R ? 0 : 1, o = i < R ? i : i - R;
			if (o < n) {
				wp[i] = j.w[h];
				wrows[i] = (size_t)j.rows[h];
				wr[i] = g0 + o;
			}
		}
		nw = NW;   /* rows past n stay null and are skipped */
	} else {
#pragma unroll
		for (int i = 0; i < NW; i++) {
			int r = g0 + i, k = 0;
			while (k < j.n - 1 && r >= j.rows[k]) {
				r -= j.rows[k];
				k++;
			}
			if (r < j.rows[k]) {
				wp[i] = j.w[k];
				wrows[i] = (size_t)j.rows[k];
				wr[i] = r;
				wk[i] = k;
				nw = i + 1;
			}
		}
	}
	float acc[NW][NT];
#pragma unroll
	for (int i = 0; i < NW; i++)
#pragma unroll
		for (int t = 0; t < NT; t++)
			acc[i][t] = 0.f;
	int cols = j.cols;
	if (QX) {
		int nb = cols / 32;
		for (int b = tid; b < nb; b += 256) {
			uint4 w0[NW], w1[NW];
			float dw[NW];
#pragma unroll
			for (int i = 0; i < NW; i++) {
				if (!wp[i])
					continue;
				size_t blk = (size_t)wr[i] * nb + b;
				if (DT == KT_Q8_0) {
					const int8_t *qs = (const int8_t *)wp[i];
					const uint4 *p = (const uint4 *)(qs + blk * 32);
					w0[i] = __ldg(p);
					w1[i] = __ldg(p + 1);
					dw[i] = __half2float(((const __half *)(qs + wrows[i] * cols))[blk]);
				} else {
					const uint8_t *qs = (const uint8_t *)wp[i];
					uint4 u = __ldg((const uint4 *)(qs + blk * 16));
					w0[i] = make_uint4(u.x & 0x0f0f0f0fu, u.y & 0x0f0f0f0fu,
							   u.z & 0x0f0f0f0fu, u.w & 0x0f0f0f0fu);
					w1[i] = make_uint4((u.x >> 4) & 0x0f0f0f0fu, (u.y >> 4) & 0x0f0f0f0fu,
							   (u.z >> 4) & 0x0f0f0f0fu, (u.w >> 4) & 0x0f0f0f0fu);
					dw[i] = __half2float(((const __half *)(qs + wrows[i] * cols / 2))[blk]);
				}
			}
#pragma unroll
			for (int t = 0; t < NT; t++) {
				const uint4 *xp = (const uint4 *)(j.xq + (size_t)t * cols + (size_t)b * 32);
				uint4 xa = __ldg(xp), xb = __ldg(xp + 1);
				float d = __ldg(j.xd + (size_t)t * nb + b);
				int off = DT == KT_Q4_0 ? 8 * __ldg(j.xs + (size_t)t * nb + b) : 0;
#pragma unroll
				for (int i = 0; i < NW; i++) {
					if (!wp[i])
						continue;
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
	} else {
		for (int c = tid * W; c < j.vec; c += 256 * W) {
			float f[NW][W];
#pragma unroll
			for (int i = 0; i < NW; i++)
				if (wp[i])
					loadw<DT>(wp[i], wrows[i], cols, wr[i], c, f[i]);
#pragma unroll
			for (int t = 0; t < NT; t++) {
				const float4 *xp = (const float4 *)(x + (size_t)t * cols + c);
#pragma unroll
				for (int k = 0; k < W / 4; k++) {
					float4 v = __ldg(xp + k);
#pragma unroll
					for (int i = 0; i < NW; i++)
						if (wp[i])
							acc[i][t] += f[i][4 * k] * v.x + f[i][4 * k + 1] * v.y +
								     f[i][4 * k + 2] * v.z + f[i][4 * k + 3] * v.w;
				}
			}
		}
		for (int c = j.vec + tid; c < cols; c += 256)
#pragma unroll
			for (int i = 0; i < NW; i++)
				if (wp[i]) {
					float wv = cu_w_at(wp[i], DT, wrows[i], cols, wr[i], c);
#pragma unroll
					for (int t = 0; t < NT; t++)
						acc[i][t] += wv * x[(size_t)t * cols + c];
				}
	}
	/* sum over the block: warps by shuffles, then the 8 warps' partials */
#pragma unroll
	for (int i = 0; i < NW; i++)
#pragma unroll
		for (int t = 0; t < NT; t++) {
			float v = acc[i][t];
#pragma unroll
			for (int o = 16; o > 0; o >>= 1)
				v += __shfl_xor_sync(0xffffffffu, v, o);
			if (!lane)
				red[warp][i * NT + t] = v;
		}
	__syncthreads();
	__shared__ float fin[NW * NT];
	if (tid < NW * NT) {
		float v = 0.f;
#pragma unroll
		for (int w = 0; w < 8; w++)
			v += red[w][tid];
		fin[tid] = v;
	}
	__syncthreads();
	if (tid >= NW * NT)
		return;
	int i = tid / NT, t = tid % NT;
	if (MODE == 2) {
		if (i >= R || !wp[i])
			return;
		float g = fin[tid], u = fin[(i + R) * NT + t];
		j.y[0][(size_t)t * j.rows[0] + wr[i]] = g / (1.f + expf(-g)) * u;
	} else {
		if (i >= nw || !wp[i])
			return;
		float *y = j.y[wk[i]] + (size_t)t * j.rows[wk[i]] + wr[i];
		if (MODE == 1)
			*y += fin[tid];
		else
			*y = fin[tid];
	}
}

template <int NT, int MODE>
static void gemv_dt(cudaStream_t st, const struct cu_gemv_job *j, enum kt_dtype dt,
		    const float *x, int qx)
{
	int total = MODE == 0 ? j->rows[0] + (j->n > 1 ? j->rows[1] : 0) + (j->n > 2 ? j->rows[2] : 0)
			      : j->rows[0];
	int per_block = qx ? (int)rows_per<1, MODE>::R : (int)rows_per<0, MODE>::R;
	dim3 grid((total + per_block - 1) / per_block), block(256);
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

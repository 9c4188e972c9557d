/*
 * kernels/cuda/candidates/fused.cu — the fused matrix-vector kernels of the
 * layer
 * candidates (plan.h): RMSNorm inside the products that read it (8-bit
 * activations made there for Q8_0 / Q4_0), the q/k/v product with RoPE and
 * the KV store in its epilogue, and split-K products for Q8_0 / Q4_0. Built
 * from gemv.cuh's pieces, apart from matmul.cu for compile time. Never run
 * on a GPU yet (written 2026-12-02 without one).
 */
#include "kernels/cuda/gemv.cuh"

/*
 * Split-K y += x W^T (Q8_0 / Q4_0, 8-bit activations): block (b, s) takes
 * the rows of block b over the blocks of 32 weights of part s, quantizing
 * only that slice of x. With several parts each writes its sums to
 * j.part; the last block of a row group to finish (a counter per group)
 * adds the parts in order, so the result does not depend on which block
 * came last, and resets the counter for the next launch.
 */
template <int NT, enum kt_dtype DT, int U>
__global__ void __launch_bounds__(GW * 32)
splitk_kernel(struct cu_gemv_job j, const float *__restrict__ x)
{
	extern __shared__ float4 xsm4[];
	__shared__ float red[32];
	__shared__ int last;
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, cols = j.cols, S = gridDim.y;
	int s = blockIdx.y, b0, b1;
	cu_splitk_range(cols / 32, s, S, &b0, &b1);
	struct gemv_rows r;
	int valid = job_setup<1>(j, blockIdx.x * GW + warp, r);
	uint4 wa[1][U], wb[1][U];
	float dw[1][U];
	if (valid)
		fetch<DT, 1, U, 1, 1>(r.wp, r.wrows, r.wr, cols, b1, b0, lane, wa, wb, dw);
	cu_pdl_wait();
	cu_pdl_trigger();
	struct gemv_x xs = stage_x<NT, XS_QIN, GW * 32>(xsm4, x, cols, NULL, 0.f, NULL, NULL, NULL, b0,
							b1, red);
	float acc[1][NT];
	if (valid)
		rows_dot<NT, DT, 1, U, 1>(r.wp, r.wrows, r.wr, cols, 0, b0, b1, lane, xs, wa, wb, dw, acc);
	if (S == 1) {
		if (valid)
			job_store<NT, 1, 1>(j, r, lane, acc);
		return;
	}
	int rows = j.rows[0];
	if (valid && !lane)
#pragma unroll
		for (int t = 0; t < NT; t++)
			j.part[((size_t)s * NT + t) * rows + r.col] = acc[0][t];
	__threadfence();
	__syncthreads();
	if (threadIdx.x == 0)
		last = atomicAdd(&j.count[blockIdx.x], 1u) == (unsigned)S - 1;
	__syncthreads();
	if (!last)
		return;
	__threadfence();
	if (valid && !lane) {
#pragma unroll
		for (int t = 0; t < NT; t++) {
			float sum = 0.f;
			for (int k = 0; k < S; k++)
				sum += __ldcg(&j.part[((size_t)k * NT + t) * rows + r.col]);
			j.y[0][(size_t)t * rows + r.col] += sum;
		}
	}
	if (threadIdx.x == 0)
		j.count[blockIdx.x] = 0;
}

int cu_gemv_fused(cudaStream_t st, struct cu_gemv_job *j, enum kt_dtype dt, int mode, int norm,
		  int qx, const float *x, int n_tok)
{
	if (!qx)
		j->xq = NULL;
	int q = cu_gemv_prep(j, dt);
	size_t need = cu_stage_bytes(q ? XS_Q8 : XS_F32, n_tok, j->cols, j->cols / 32);
	/* the norm needs its staging (beside the kernel's 128 bytes of its own);
	 * q/k/v from xb stages it when it fits, else reads it from memory */
	if (n_tok < 1 || n_tok > CU_GEMV_MAX || j->cols % 32 || (norm && need > CU_SMEM_DYN) ||
	    (mode == 3 && (j->e.hd % 2 || j->rows[0] % 2 || j->rows[1] % 2 || j->rows[2] % 2)) ||
	    (mode == 2 && !norm) || (mode != 2 && mode != 3))
		return -1;
	if (mode == 3 && norm)
		gemv_mode<3, 1>(st, j, dt, x, n_tok, q);
	else if (mode == 3)
		gemv_mode<3, 0>(st, j, dt, x, n_tok, q);
	else
		gemv_mode<2, 1>(st, j, dt, x, n_tok, q);
	return 0;
}

template <int NT>
static void splitk_dt(cudaStream_t st, const struct cu_gemv_job *j, enum kt_dtype dt,
		      const float *x, int parts)
{
	int most = (j->cols / 32 + parts - 1) / parts;
	size_t sm = cu_stage_bytes(XS_QIN, NT, j->cols, most);
	dim3 grid((j->rows[0] + GW - 1) / GW, parts), block(GW * 32);
	if (dt == KT_Q8_0)
		cu_launch_pdl(splitk_kernel<NT, KT_Q8_0, 2>, grid, block, sm, st, *j, x);
	else
		cu_launch_pdl(splitk_kernel<NT, KT_Q4_0, 2>, grid, block, sm, st, *j, x);
}

int cu_gemv_splitk(cudaStream_t st, struct cu_gemv_job *j, enum kt_dtype dt, const float *x,
		   int n_tok, int parts)
{
	int most = parts > 0 ? (j->cols / 32 + parts - 1) / parts : 0;
	if ((dt != KT_Q8_0 && dt != KT_Q4_0) || j->cols % 32 || parts < 1 ||
	    parts > CU_MAX_SPLITK || (parts > 1 && (!j->part || !j->count)) || n_tok < 1 ||
	    n_tok > CU_GEMV_MAX || cu_stage_bytes(XS_QIN, n_tok, j->cols, most) > CU_SMEM_DYN)
		return -1;
	j->vec = 0;
	switch (n_tok) {
	case 1: splitk_dt<1>(st, j, dt, x, parts); break;
	case 2: splitk_dt<2>(st, j, dt, x, parts); break;
	case 3: splitk_dt<3>(st, j, dt, x, parts); break;
	case 4: splitk_dt<4>(st, j, dt, x, parts); break;
	case 5: splitk_dt<5>(st, j, dt, x, parts); break;
	case 6: splitk_dt<6>(st, j, dt, x, parts); break;
	case 7: splitk_dt<7>(st, j, dt, x, parts); break;
	case 8: splitk_dt<8>(st, j, dt, x, parts); break;
	default: break;
	}
	return 0;
}


/*
 * kernels/cuda/candidates/layer.cu — the persistent candidate (plan.h): a
 * whole layer
 * of a batch-1 decode step as one cooperative kernel, its phases separated
 * by grid-wide barriers instead of kernel boundaries:
 *   1. RMSNorm of x (every block computes it for itself), q/k/v, RoPE, the
 *      KV store (gemv.cuh's fused q/k/v jobs; an f32 or f16 pool: q8_0's
 *      scales need a group's channels, which no warp has, so a q8_0 pool's
 *      layers run fused, plan.c)
 *   2. attention: (head, split) units of attn.cuh's decode kernel (the
 *      general one: the 16-position kernel's 64 registers of K and V per
 *      lane spilled at the 128 registers that keep 4 blocks per SM)
 *   3. the splits merged (when there are several)
 *   4. x += att Wo^T
 *   5. RMSNorm of x, hb = silu(x W1^T) * (x W3^T)
 *   6. x += hb W2^T
 * Every block stays resident (the grid is the occupancy times the SMs), and
 * takes warp jobs (or attention units) grid-stride, so the weights stream
 * with the same loads as the separate kernels; each warp issues its first
 * weight loads of a phase before the barrier that opens it. Activations
 * written inside the kernel are read without the read-only cache (NC 0).
 * Never run on a GPU yet (written 2026-12-02 without one).
 */
#include <cooperative_groups.h>

#include "kernels/cuda/attn.cuh"
#include "kernels/cuda/gemv.cuh"

namespace cg = cooperative_groups;

/* One warp job in two halves: begin (its rows and first weight loads,
 * which depend on nothing the phases write, so they are issued before the
 * barrier that opens the phase) and finish (products and epilogue). */
template <enum kt_dtype DT, int MODE, int QX, int U>
struct pjob {
	static const int NWR = MODE >= 2 ? 2 : 1;
	struct gemv_rows r;
	int valid;
	uint4 wa[NWR][U], wb[NWR][U];
	float dw[NWR][U];

	__device__ __forceinline__ void begin(const struct cu_gemv_job &j, int g, int lane)
	{
		valid = job_setup<MODE>(j, g, r);
		if (valid && gemv_pre<DT, QX>::value)
			fetch<DT, QX, U, NWR, 1>(r.wp, r.wrows, r.wr, j.cols, QX ? j.cols / 32 : j.vec, 0,
						 lane, wa, wb, dw);
	}

	__device__ __forceinline__ void finish(const struct cu_gemv_job &j, int lane,
					       const struct gemv_x &xs)
	{
		if (!valid)
			return;
		float acc[NWR][1];
		rows_dot<1, DT, QX, U, NWR>(r.wp, r.wrows, r.wr, j.cols, j.vec, 0, j.cols / 32, lane, xs,
					    wa, wb, dw, acc);
		job_store<1, MODE, NWR>(j, r, lane, acc);
	}
};

/* The rest of a phase: jobs g0, g0 + gs, ... < jobs; p holds g0 begun. */
template <typename P>
__device__ __forceinline__ void run_jobs(P &p, const struct cu_gemv_job &j, int jobs, int g0,
					 int gs, int lane, const struct gemv_x &xs)
{
	for (int g = g0;;) {
		p.finish(j, lane, xs);
		g += gs;
		if (g >= jobs)
			break;
		p.begin(j, g, lane);
	}
}

template <enum kt_dtype DT, int QX, int U>
__global__ void __launch_bounds__(CU_PW * 32, 4) layer_kernel(struct cu_layer_args a)
{
	cg::grid_group grid = cg::this_grid();
	extern __shared__ float4 sm4[];
	__shared__ float red[32];
	const int SN = QX ? XS_QNORM : XS_NORM, SP = QX ? XS_QIN : XS_F32;
	int D = a.qkv.cols, qd = a.o.cols, F = a.down.cols, lane = threadIdx.x & 31;
	int g0 = blockIdx.x * CU_PW + (threadIdx.x >> 5), gs = gridDim.x * CU_PW;

	/* 1: norm, q/k/v, RoPE, KV store */
	{
		pjob<DT, 3, QX, U> p;
		p.begin(a.qkv, g0, lane);
		struct gemv_x xs = stage_x<1, SN, CU_PW * 32, 0>(sm4, a.x, D, a.qkv.g, a.qkv.eps, NULL,
								 NULL, NULL, 0, D / 32, red);
		run_jobs(p, a.qkv, (a.qkv.rows[0] + a.qkv.rows[1] + a.qkv.rows[2]) / 2, g0, gs, lane, xs);
	}
	grid.sync();

	/* 2, 3: attention, the splits merged */
	float *smf = (float *)sm4;
	for (int u = blockIdx.x; u < a.at.n_heads * a.at.n_split; u += gridDim.x) {
		/* an f32 or f16 pool (q8_0 runs fused: plan.c) */
		if (a.at.kv_dt == KT_F16)
			attn_decode_unit<4, KT_F16>(a.at, 0, u % a.at.n_heads, u / a.at.n_heads, smf);
		else
			attn_decode_unit<4>(a.at, 0, u % a.at.n_heads, u / a.at.n_heads, smf);
		__syncthreads();
	}
	if (a.at.n_split > 1) {
		grid.sync();
		for (int u = blockIdx.x; u < a.at.n_heads; u += gridDim.x)
			attn_combine_unit(a.at.out, a.at.part, a.at.hd, a.at.n_split, u);
	}

	/* 4: x += att Wo^T */
	{
		pjob<DT, 1, QX, U> p;
		p.begin(a.o, g0, lane);
		grid.sync();
		struct gemv_x xs = stage_x<1, SP, CU_PW * 32, 0>(sm4, a.at.out, qd, NULL, 0.f, NULL,
								 NULL, NULL, 0, qd / 32, red);
		run_jobs(p, a.o, D, g0, gs, lane, xs);
	}

	/* 5: norm, hb = silu(x W1^T) * (x W3^T) */
	{
		pjob<DT, 2, QX, U> p;
		p.begin(a.ffn, g0, lane);
		grid.sync();
		struct gemv_x xs = stage_x<1, SN, CU_PW * 32, 0>(sm4, a.x, D, a.ffn.g, a.ffn.eps, NULL,
								 NULL, NULL, 0, D / 32, red);
		run_jobs(p, a.ffn, a.ffn.rows[0], g0, gs, lane, xs);
	}

	/* 6: x += hb W2^T */
	{
		pjob<DT, 1, QX, U> p;
		p.begin(a.down, g0, lane);
		grid.sync();
		struct gemv_x xs = stage_x<1, SP, CU_PW * 32, 0>(sm4, a.ffn.y[0], F, NULL, 0.f, NULL,
								 NULL, NULL, 0, F / 32, red);
		run_jobs(p, a.down, D, g0, gs, lane, xs);
	}
}

/* the instantiation for dt (QX: 8-bit activations), or NULL */
static void *pick(enum kt_dtype dt, int qx)
{
	switch (dt) {
	case KT_F32: return (void *)layer_kernel<KT_F32, 0, 2>;
	case KT_F16: return (void *)layer_kernel<KT_F16, 0, 4>;
	case KT_BF16: return (void *)layer_kernel<KT_BF16, 0, 4>;
	case KT_Q8_0: return qx ? (void *)layer_kernel<KT_Q8_0, 1, 2> : NULL;
	case KT_Q4_0: return qx ? (void *)layer_kernel<KT_Q4_0, 1, 2> : NULL;
	case KT_Q4_K: return (void *)layer_kernel<KT_Q4_K, 0, 1>;
	case KT_Q5_K: return (void *)layer_kernel<KT_Q5_K, 0, 1>;
	case KT_Q6_K: return (void *)layer_kernel<KT_Q6_K, 0, 1>;
	default: return NULL;
	}
}

int cu_layer_blocks(enum kt_dtype dt, int qx, size_t smem, int n_sm)
{
	void *k = pick(dt, qx);
	int per = 0;
	if (!k || smem > CU_SMEM_PERSIST)
		return 0;
	if (smem > CU_SMEM_DYN &&
	    cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess) {
		cudaGetLastError();
		return 0;
	}
	if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, k, CU_PW * 32, smem) != cudaSuccess) {
		cudaGetLastError();
		return 0;
	}
	return per * n_sm;
}

int cu_layer_launch(cudaStream_t st, const struct cu_layer_args *a, enum kt_dtype dt, int qx,
		    int blocks, size_t smem)
{
	void *k = pick(dt, qx);
	if (!k || blocks <= 0)
		return (int)cudaErrorInvalidValue;
	cudaLaunchAttribute at[1];
	at[0].id = cudaLaunchAttributeCooperative;
	at[0].val.cooperative = 1;
	cudaLaunchConfig_t cfg = cu_launch_cfg(dim3((unsigned)blocks), dim3(CU_PW * 32), smem, st, at);
	struct cu_layer_args copy = *a;
	void *args[] = { &copy };
	return (int)cudaLaunchKernelExC(&cfg, k, args);
}

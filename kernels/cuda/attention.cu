/*
 * kernels/cuda/attention.cu — causal attention over the paged KV cache.
 *
 * Two kernels, both split along the sequence so that a single long session
 * still fills the GPU: split s of a (row or tile, head) takes the KV blocks
 * b = s, s + n_split, ... and keeps a running max m, sum l and weighted V
 * sum (online softmax); the splits' partials are merged by a combine
 * kernel (or written straight out when there is one split).
 *
 *  - decode: one query row per (row, head); its 4 warps take interleaved
 *    KV blocks, a lane per position for the scores (K is stored transposed,
 *    so a block's 16 positions are 16 consecutive floats per channel) and a
 *    lane per channel for V.
 *  - tile (prefill and mixed batches): up to CU_QT consecutive rows of one
 *    sequence per (tile, head); each KV block is loaded into shared memory
 *    once and used by every row of the tile.
 *
 * Each kernel is instantiated per element type of the pool (kv->dtype:
 * f32, f16, q8_0; attn.cuh): a typed store's elements are widened as they
 * are loaded (into registers, or the tile's shared memory), and the GEMM
 * form gathers its f16 copies from the typed store. The f16 and q8_0
 * instantiations have never run on a GPU (written 2026-12-03 without one).
 */
#include "kernels/cuda/attn.cuh"

#define TT 128 /* threads per tile block */

template <int CPL, int DT>
__global__ void __launch_bounds__(AW * 32) attn_decode_kernel(struct attn_args a)
{
	cu_pdl_wait();
	cu_pdl_trigger();
	extern __shared__ float sm[];
	attn_decode_unit<CPL, DT>(a, blockIdx.x / a.n_heads, blockIdx.x % a.n_heads, blockIdx.y, sm);
}

template <int NKMAX, int DT>
__global__ void __launch_bounds__(AW * 32) attn_decode16_kernel(struct attn_args a)
{
	cu_pdl_wait();
	cu_pdl_trigger();
	extern __shared__ float sm[];
	attn_decode16_unit<NKMAX, 1, DT>(a, blockIdx.x / a.n_heads, blockIdx.x % a.n_heads, blockIdx.y,
					 sm);
}

template <int CPT, int DT>
__global__ void __launch_bounds__(TT) attn_tile_kernel(struct attn_args a)
{
	extern __shared__ float sm[];
	int ti = blockIdx.x, h = blockIdx.y, s = blockIdx.z, tid = threadIdx.x;
	int t0 = a.tiles[3 * ti], nq = a.tiles[3 * ti + 1], p0 = a.tiles[3 * ti + 2];
	int hd = a.hd, bs = a.bs, kvh = h / a.group, qst = hd + 1;
	float *Qs = sm;                       /* [CU_QT][hd+1] */
	float *Ks = Qs + CU_QT * qst;         /* [hd][bs] */
	float *Vs = Ks + hd * bs;             /* [bs][hd] */
	float *S = Vs + bs * hd;              /* [CU_QT][bs+1] */
	float *Mr = S + CU_QT * (bs + 1), *Lr = Mr + CU_QT, *Al = Lr + CU_QT;
	for (int e = tid; e < CU_QT * hd; e += TT) {
		int qi = e / hd, c = e % hd;
		Qs[qi * qst + c] = qi < nq ? a.q[((size_t)(t0 + qi) * a.n_heads + h) * hd + c] * a.scale
					   : 0.f;
	}
	if (tid < CU_QT) {
		Mr[tid] = -INFINITY;
		Lr[tid] = 0.f;
	}
	const int32_t *tab = a.tables + (size_t)a.row_tab[t0] * a.tab_stride;
	int nblk = (p0 + nq - 1) / bs + 1;
	float acc[CPT][CU_QT];
#pragma unroll
	for (int j = 0; j < CPT; j++)
#pragma unroll
		for (int qi = 0; qi < CU_QT; qi++)
			acc[j][qi] = 0.f;
	for (int bi = s; bi < nblk; bi += a.n_split) {
		__syncthreads();
		int32_t b = tab[bi];
		if (DT == KT_F32) {
			const float *kt = k_block(a, b, kvh), *vb = v_block(a, b, kvh);
			for (int e = tid; e < hd * bs; e += TT)
				Ks[e] = kt[e];
			for (int e = tid; e < hd * bs; e += TT)
				Vs[e] = vb[(size_t)(e / hd) * a.kv_dim + e % hd];
		} else {
			const kv_blk<DT> kb(a, b, kvh);
			for (int e = tid; e < hd * bs; e += TT)
				Ks[e] = kb.kat(a, e / bs, e % bs);
			for (int e = tid; e < hd * bs; e += TT)
				Vs[e] = kb.vat(a, e / hd, e % hd);
		}
		__syncthreads();
		for (int e = tid; e < CU_QT * bs; e += TT) {
			int qi = e / bs, ki = e % bs;
			float d = -INFINITY;
			if (qi < nq && bi * bs + ki <= p0 + qi) {
				d = 0.f;
				for (int c = 0; c < hd; c++)
					d += Qs[qi * qst + c] * Ks[c * bs + ki];
			}
			S[qi * (bs + 1) + ki] = d;
		}
		__syncthreads();
		if (tid < CU_QT) {
			float *sr = S + tid * (bs + 1), mo = Mr[tid], mx = mo;
			for (int k = 0; k < bs; k++)
				mx = fmaxf(mx, sr[k]);
			float alpha = 1.f;
			if (mx != -INFINITY) {
				alpha = rescale(mo, mx);
				float sum = 0.f;
				for (int k = 0; k < bs; k++) {
					float pk = sr[k] == -INFINITY ? 0.f : expf(sr[k] - mx);
					sr[k] = pk;
					sum += pk;
				}
				Lr[tid] = Lr[tid] * alpha + sum;
				Mr[tid] = mx;
			} else {
				for (int k = 0; k < bs; k++)
					sr[k] = 0.f;
			}
			Al[tid] = alpha;
		}
		__syncthreads();
#pragma unroll
		for (int j = 0; j < CPT; j++) {
			int c = tid + TT * j;
			if (c >= hd)
				continue;
#pragma unroll
			for (int qi = 0; qi < CU_QT; qi++) {
				float v = acc[j][qi] * Al[qi];
				const float *sr = S + qi * (bs + 1);
				for (int k = 0; k < bs; k++)
					v += sr[k] * Vs[k * hd + c];
				acc[j][qi] = v;
			}
		}
	}
	__syncthreads();
#pragma unroll
	for (int j = 0; j < CPT; j++) {
		int c = tid + TT * j;
		if (c >= hd)
			continue;
#pragma unroll
		for (int qi = 0; qi < CU_QT; qi++)
			if (qi < nq)
				put_result(a, t0 + qi, h, s, c, Mr[qi], Lr[qi], acc[j][qi], c == 0);
	}
}

/* Merge the splits of (row, head): one block each, a thread per channel. */
static __global__ void attn_combine_kernel(float *out, const float *part, int hd, int n_split)
{
	cu_pdl_wait();
	cu_pdl_trigger();
	attn_combine_unit(out, part, hd, n_split, blockIdx.x);
}

template <typename K>
static void allow_smem(K kernel, size_t bytes)
{
	if (bytes > 48 * 1024)
		cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

/* The pool's fields of a: layer `layer` of kv, heads of hd channels. */
static void attn_kv(struct attn_args &a, const struct kt_kv *kv, int layer, int hd)
{
	a.base = kv->base;
	a.hd = hd;
	a.bs = kv->block_size;
	a.n_layers = kv->n_layers;
	a.kv_dim = kv->kv_dim;
	a.layer = layer;
	a.kv_dt = kv->dtype;
	a.kv_gsh = 0;
	while (kv->dtype == KT_Q8_0 && (2 << a.kv_gsh) <= kv->group)
		a.kv_gsh++;
}

void cu_attn_fill(struct attn_args *ap, float *out, const float *q, const struct kt_kv *kv,
		  int layer, const struct cu_batch *b, int n_heads, int n_kv_heads, int hd,
		  float *part)
{
	struct attn_args &a = *ap;
	a.out = out;
	a.part = part;
	a.q = q;
	a.pos = b->pos;
	a.row_tab = b->row_tab;
	a.tiles = b->tiles;
	a.tables = b->tables;
	a.tab_stride = b->tab_stride;
	a.n_heads = n_heads;
	a.group = n_heads / n_kv_heads;
	attn_kv(a, kv, layer, hd);
	a.scale = 1.0f / sqrtf((float)hd);
	a.n_split = 1;
}

/* The kernels of a's batch for element type DT. */
template <int DT>
static void attention_dt(cudaStream_t st, struct attn_args &a, const struct cu_batch *b,
			 float *out, float *part, int n_heads, int hd, int n_sm)
{
	if (b->single_rows) {
		a.n_split = cu_attn_split(b->n_tok, n_heads, hd, b->n_tok, n_sm);
		dim3 grid(b->n_tok * n_heads, a.n_split);
		size_t smem = cu_attn_decode_smem(hd);
		if (a.bs == 16 && hd % 8 == 0 && hd <= 128) {
			if (hd <= 32)
				cu_launch_pdl(attn_decode16_kernel<4, DT>, grid, dim3(AW * 32), smem, st, a);
			else if (hd <= 64)
				cu_launch_pdl(attn_decode16_kernel<8, DT>, grid, dim3(AW * 32), smem, st, a);
			else
				cu_launch_pdl(attn_decode16_kernel<16, DT>, grid, dim3(AW * 32), smem, st, a);
		} else if (hd <= 32)
			cu_launch_pdl(attn_decode_kernel<1, DT>, grid, dim3(AW * 32), smem, st, a);
		else if (hd <= 64)
			cu_launch_pdl(attn_decode_kernel<2, DT>, grid, dim3(AW * 32), smem, st, a);
		else if (hd <= 128)
			cu_launch_pdl(attn_decode_kernel<4, DT>, grid, dim3(AW * 32), smem, st, a);
		else
			cu_launch_pdl(attn_decode_kernel<8, DT>, grid, dim3(AW * 32), smem, st, a);
	} else {
		a.n_split = cu_attn_split(b->n_tiles, n_heads, hd, b->n_tok, n_sm);
		dim3 grid(b->n_tiles, n_heads, a.n_split);
		int bs = a.bs;
		size_t smem = (CU_QT * (hd + 1) + 2 * hd * bs + CU_QT * (bs + 1) + 3 * CU_QT) *
			      sizeof(float);
		if (hd <= TT) {
			allow_smem(attn_tile_kernel<1, DT>, smem);
			attn_tile_kernel<1, DT><<<grid, TT, smem, st>>>(a);
		} else {
			allow_smem(attn_tile_kernel<2, DT>, smem);
			attn_tile_kernel<2, DT><<<grid, TT, smem, st>>>(a);
		}
	}
	if (a.n_split > 1)
		cu_launch_pdl(attn_combine_kernel, dim3(b->n_tok * n_heads), dim3(128), 0, st, out,
			      (const float *)part, hd, a.n_split);
}

void cu_attention(cudaStream_t st, float *out, const float *q, const struct kt_kv *kv,
		  int layer, const struct cu_batch *b, int n_heads, int n_kv_heads, int hd,
		  float *part, int n_sm)
{
	if (b->n_tok <= 0)
		return;
	struct attn_args a;
	cu_attn_fill(&a, out, q, kv, layer, b, n_heads, n_kv_heads, hd, part);
	if (kv->dtype == KT_F16)
		attention_dt<KT_F16>(st, a, b, out, part, n_heads, hd, n_sm);
	else if (kv->dtype == KT_Q8_0)
		attention_dt<KT_Q8_0>(st, a, b, out, part, n_heads, hd, n_sm);
	else
		attention_dt<KT_F32>(st, a, b, out, part, n_heads, hd, n_sm);
}

/*
 * Long runs of new rows (prefill): attention as two batched GEMMs per
 * sequence run (cuBLAS, f16 operands, fp32 accumulate) with a causal
 * softmax between them. The run's K and V (positions [0, P)) are gathered
 * from their blocks into contiguous f16 [kv_head][P][hd]; queries become
 * [kv_head][group*n][hd] (rows (g, i): query head kv_head*group + g, row i),
 * scaled by 1/sqrt(hd).
 */
static __global__ void attn_gather_kernel(__half *kc, __half *vc, const float *base, const int32_t *tab,
					  int n_layers, int bs, int kv_dim, int layer, int hd, int P)
{
	int p = blockIdx.x, kvh = blockIdx.y;
	int32_t b = tab[p / bs];
	int r = p % bs;
	size_t span = (size_t)bs * kv_dim;
	const float *kt = base + (((size_t)b * n_layers + layer) * 2) * span + (size_t)kvh * hd * bs;
	const float *vr = base + (((size_t)b * n_layers + layer) * 2 + 1) * span +
			  (size_t)r * kv_dim + (size_t)kvh * hd;
	size_t o = ((size_t)kvh * P + p) * hd;
	for (int c = threadIdx.x; c < hd; c += blockDim.x) {
		kc[o + c] = __float2half_rn(kt[(size_t)c * bs + r]);
		vc[o + c] = __float2half_rn(vr[c]);
	}
}

/* The same from a typed store (a): f16 elements copied as they are, q8_0
 * values (code times scale, exact in fp32) rounded to f16. */
template <int DT>
static __global__ void attn_gather_typed_kernel(__half *kc, __half *vc, struct attn_args a,
						const int32_t *tab, int P)
{
	int p = blockIdx.x, kvh = blockIdx.y, hd = a.hd;
	int r = p % a.bs;
	const kv_blk<DT> kb(a, tab[p / a.bs], kvh);
	size_t o = ((size_t)kvh * P + p) * hd;
	for (int c = threadIdx.x; c < hd; c += blockDim.x) {
		if (DT == KT_F16) {
			kc[o + c] = ((const __half *)kb.k)[(size_t)(kb.ch0 + c) * a.bs + r];
			vc[o + c] = ((const __half *)kb.v)[(size_t)r * a.kv_dim + kb.ch0 + c];
		} else {
			kc[o + c] = __float2half_rn(kb.kat(a, c, r));
			vc[o + c] = __float2half_rn(kb.vat(a, r, c));
		}
	}
}

static __global__ void attn_q16_kernel(__half *qc, const float *q, int t0, int n, int n_heads, int group,
				       int hd, float scale)
{
	int i = blockIdx.x, h = blockIdx.y, kvh = h / group, g = h % group;
	const float *src = q + ((size_t)(t0 + i) * n_heads + h) * hd;
	__half *dst = qc + (((size_t)kvh * group + g) * n + i) * hd;
	for (int c = threadIdx.x; c < hd; c += blockDim.x)
		dst[c] = __float2half_rn(src[c] * scale);
}

/* Row rho = (kvh*group + g)*n + i of S (length P) attends to [0, p0 + i]. */
static __global__ void attn_softmax_kernel(__half *pm, const float *S, int n, int P, int p0)
{
	__shared__ float red[32];
	size_t rho = blockIdx.x;
	const float *s = S + rho * P;
	__half *o = pm + rho * P;
	int lim = p0 + (int)(rho % n) + 1;
	float mx = -INFINITY;
	for (int k = threadIdx.x; k < lim; k += blockDim.x)
		mx = fmaxf(mx, s[k]);
	mx = warp_max(mx);
	if ((threadIdx.x & 31) == 0)
		red[threadIdx.x >> 5] = mx;
	__syncthreads();
	mx = -INFINITY;
	for (int w = 0; w < (int)blockDim.x / 32; w++)
		mx = fmaxf(mx, red[w]);
	__syncthreads();
	float sum = 0.f;
	for (int k = threadIdx.x; k < lim; k += blockDim.x)
		sum += expf(s[k] - mx);
	sum = warp_sum(sum);
	if ((threadIdx.x & 31) == 0)
		red[threadIdx.x >> 5] = sum;
	__syncthreads();
	sum = 0.f;
	for (int w = 0; w < (int)blockDim.x / 32; w++)
		sum += red[w];
	float inv = 1.f / sum;
	for (int k = threadIdx.x; k < P; k += blockDim.x)
		o[k] = __float2half_rn(k < lim ? expf(s[k] - mx) * inv : 0.f);
}

static __global__ void attn_scatter_kernel(float *out, const float *oc, int t0, int n, int n_heads,
					   int group, int hd)
{
	int i = blockIdx.x, h = blockIdx.y, kvh = h / group, g = h % group;
	const float *src = oc + (((size_t)kvh * group + g) * n + i) * hd;
	float *dst = out + ((size_t)(t0 + i) * n_heads + h) * hd;
	for (int c = threadIdx.x; c < hd; c += blockDim.x)
		dst[c] = src[c];
}

void cu_attn_gather(cudaStream_t st, __half *kc, __half *vc, const struct kt_kv *kv, int layer,
		    const int32_t *tab, int P, int n_kv_heads, int hd)
{
	dim3 grid(P, n_kv_heads);
	if (kv->dtype == KT_F16 || kv->dtype == KT_Q8_0) {
		struct attn_args a;
		memset(&a, 0, sizeof(a));
		attn_kv(a, kv, layer, hd);
		if (kv->dtype == KT_F16)
			attn_gather_typed_kernel<KT_F16><<<grid, 128, 0, st>>>(kc, vc, a, tab, P);
		else
			attn_gather_typed_kernel<KT_Q8_0><<<grid, 128, 0, st>>>(kc, vc, a, tab, P);
		return;
	}
	attn_gather_kernel<<<grid, 128, 0, st>>>(kc, vc, (const float *)kv->base, tab, kv->n_layers, kv->block_size,
						 kv->kv_dim, layer, hd, P);
}

void cu_attn_q16(cudaStream_t st, __half *qc, const float *q, int t0, int n, int n_heads,
		 int n_kv_heads, int hd)
{
	dim3 grid(n, n_heads);
	attn_q16_kernel<<<grid, 128, 0, st>>>(qc, q, t0, n, n_heads, n_heads / n_kv_heads, hd,
					      1.0f / sqrtf((float)hd));
}

void cu_attn_softmax(cudaStream_t st, __half *pm, const float *S, int rows, int n, int P, int p0)
{
	attn_softmax_kernel<<<rows, 256, 0, st>>>(pm, S, n, P, p0);
}

void cu_attn_scatter(cudaStream_t st, float *out, const float *oc, int t0, int n, int n_heads,
		     int n_kv_heads, int hd)
{
	dim3 grid(n, n_heads);
	attn_scatter_kernel<<<grid, 128, 0, st>>>(out, oc, t0, n, n_heads, n_heads / n_kv_heads, hd);
}

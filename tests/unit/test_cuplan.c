/*
 * tests/unit/test_cuplan.c — the CUDA backend's layer candidates, checked on
 * the CPU (kernels/cuda/candidates/plan.c, plan.h: built without nvcc):
 *   - the launch plan of every candidate for the 7B shape and a Llama 3 8B
 *     shape (GQA), f16 / Q8_0 / Q4_0 / Q4_K, batch 1 and 8: the launches per
 *     layer each must have, the bytes read (the layer's weights once, within
 *     the activations' share), the fallbacks (splitk on f16, persistent for
 *     8 rows); every plan is printed, so the expected launch counts are
 *     known before a GPU runs them (LLAMAD_PLAN_QUIET=1 keeps them quiet)
 *   - the device helpers compiled as C, bit for bit against the CPU
 *     backend: the fused q/k/v epilogue (RoPE pairs, rotation, KV slots)
 *     applied to product rows equals the CPU's rope + kv_store, for both
 *     pair layouts and GQA, into f32, f16 and q8_0 pools; every q/k/v row
 *     belongs to exactly one job; split-K parts tile the blocks; the 8-bit
 *     activation formula
 *   - the typed KV store (f16, q8_0): span sizes and offsets as
 *     kernels/convert.c's, the q8_0 group arithmetic as kt_kv_q8_group
 *     (ties, zeros, NaN, infinities, overflowing and subnormal scales), and
 *     kv_store.cu's kernel, written out in C over those helpers, giving the
 *     CPU backend's bytes; the plans of a typed pool (q8_0: a kv_store step
 *     after the fused q/k/v, persistent planned as fused). The conversions
 *     themselves run here as the CPU's functions: that the device's
 *     intrinsics give the same bytes is llamad-gpucheck's to show
 *   - LLAMAD_CUDA_KERNELS specs
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/backend.h"
#include "kernels/cuda/plan.h"
#include "tests/unit/testutil.h"

#define N_SM 132  /* an H200 */

static struct cu_shape shape(int dim, int heads, int kv_heads, int ffn, enum kt_dtype dt, int n_tok)
{
	struct cu_shape s;
	memset(&s, 0, sizeof(s));
	s.dim = dim;
	s.n_heads = heads;
	s.n_kv_heads = kv_heads;
	s.hd = dim / heads;
	s.ffn = ffn;
	s.n_tok = s.n_tiles = n_tok;
	s.single_rows = 1;
	s.dt = dt;
	s.qx = dt == KT_Q8_0 || dt == KT_Q4_0;
	s.n_sm = N_SM;
	s.persist_blocks = 4 * N_SM;
	s.ctx = 64;
	return s;
}

static double layer_weight_bytes(const struct cu_shape *s)
{
	int qd = s->n_heads * s->hd, kv = s->n_kv_heads * s->hd;
	double rows_d = (double)qd + 2.0 * kv + 2.0 * s->ffn;  /* rows of dim columns */
	return rows_d * kt_row_bytes(s->dt, (size_t)s->dim) +
	       (double)s->dim * kt_row_bytes(s->dt, (size_t)qd) +
	       (double)s->dim * kt_row_bytes(s->dt, (size_t)s->ffn);
}

static int count_kind(const struct cu_plan *p, enum cu_kind k)
{
	int n = 0;
	for (int i = 0; i < p->n; i++)
		n += p->s[i].kind == k;
	return n;
}

static void show(const char *label, const struct cu_shape *s, enum cu_cand want,
		 const struct cu_plan *p)
{
	if (getenv("LLAMAD_PLAN_QUIET"))
		return;
	char buf[4096];
	printf("plan %s %s n_tok=%d want=%s got=%s launches=%d bytes=%.0f\n%s", label,
	       kt_dtype_name(s->dt), s->n_tok, cu_cand_name(want), cu_cand_name(p->cand), p->n,
	       cu_plan_bytes(p), cu_plan_format(p, buf, sizeof(buf)));
}

/* The expected launches per layer, by candidate, dtype and batch. */
static void test_plans_7b(void **state)
{
	(void)state;
	const enum kt_dtype dts[4] = { KT_F16, KT_Q8_0, KT_Q4_0, KT_Q4_K };
	/* base: 10 (rmsnorm, qkv, rope, kv_store, attention, combine, o,
	 * rmsnorm, gate/up, down) + 4 quant_x for the 8-bit products; fused:
	 * 6 (+2 quant_x); splitk: 6; persistent: 1 */
	const int want1[4][4] = {
		/* f16 */ { 10, 6, 1, 6 },
		/* q8 */  { 14, 8, 1, 6 },
		/* q4 */  { 14, 8, 1, 6 },
		/* q4k */ { 10, 6, 1, 6 },
	};
	for (int d = 0; d < 4; d++)
		for (int c = 0; c < CU_N_CAND; c++) {
			struct cu_shape s = shape(4096, 32, 32, 11008, dts[d], 1);
			struct cu_plan p;
			assert_int_equal(cu_plan_layer((enum cu_cand)c, &s, &p), 0);
			show("7B", &s, (enum cu_cand)c, &p);
			if (p.n != want1[d][c])
				fail_msg("%s %s: %d launches, want %d", kt_dtype_name(dts[d]),
					 cu_cand_name((enum cu_cand)c), p.n, want1[d][c]);
			/* splitk applies to the 8-bit products only */
			int want_c = c == CU_CAND_SPLITK && !s.qx ? CU_CAND_FUSED : c;
			assert_int_equal(p.cand, want_c);
			/* every weight byte once; activations and KV a small share */
			double wb = layer_weight_bytes(&s), pb = cu_plan_bytes(&p);
			if (!(pb >= wb && pb <= wb * 1.1))
				fail_msg("%s %s: plan reads %.0f bytes, weights are %.0f",
					 kt_dtype_name(dts[d]), cu_cand_name((enum cu_cand)c), pb, wb);
			if (c == CU_CAND_PERSIST) {
				assert_int_equal(p.s[0].kind, CU_K_LAYER);
				assert_int_equal(p.s[0].syncs, 5);  /* 9 attention splits: combine */
				assert_int_equal(p.s[0].splits, 9);
				assert_int_equal(p.s[0].grid[0], 4 * N_SM);
			}
			if (c == CU_CAND_FUSED || p.cand == CU_CAND_SPLITK) {
				assert_int_equal(count_kind(&p, CU_K_NORM_QKV_ROPE_KV), 1);
				assert_int_equal(count_kind(&p, CU_K_NORM_SWIGLU), 1);
				assert_int_equal(count_kind(&p, CU_K_RMSNORM), 0);
				assert_int_equal(count_kind(&p, CU_K_ROPE), 0);
				assert_int_equal(count_kind(&p, CU_K_KV_STORE), 0);
				/* a warp per rotation pair: 12288 rows, 6144 warps */
				assert_int_equal(p.s[0].grid[0], 6144 / CU_GW);
			}
			if (p.cand == CU_CAND_SPLITK) {
				assert_int_equal(count_kind(&p, CU_K_SPLITK_ADD), 2);
				assert_int_equal(count_kind(&p, CU_K_QUANT_X), 0);
				for (int i = 0; i < p.n; i++)
					if (p.s[i].kind == CU_K_SPLITK_ADD) {
						/* 512 row groups for 132 SMs: 2 parts */
						assert_int_equal(p.s[i].splits, 2);
						assert_true(p.s[i].smem <= CU_SMEM_DYN);
					}
			}
		}
	/* batch 8: the fp32 norm no longer fits in a block's 48 KB (8 x 16 KB),
	 * so fused keeps the rmsnorm but still fuses RoPE and the KV store;
	 * 8-bit rows fit (8 x 5 KB); persistent is batch 1 only */
	struct cu_shape s = shape(4096, 32, 32, 11008, KT_F16, 8);
	struct cu_plan p;
	assert_int_equal(cu_plan_layer(CU_CAND_FUSED, &s, &p), 0);
	show("7B", &s, CU_CAND_FUSED, &p);
	assert_int_equal(count_kind(&p, CU_K_RMSNORM), 2);
	assert_int_equal(count_kind(&p, CU_K_QKV_ROPE_KV), 1);
	assert_int_equal(p.n, 8);
	assert_int_equal(cu_plan_layer(CU_CAND_PERSIST, &s, &p), 0);
	assert_int_equal(p.cand, CU_CAND_FUSED);
	s = shape(4096, 32, 32, 11008, KT_Q4_0, 8);
	assert_int_equal(cu_plan_layer(CU_CAND_SPLITK, &s, &p), 0);
	show("7B", &s, CU_CAND_SPLITK, &p);
	assert_int_equal(p.n, 6);
	assert_int_equal(count_kind(&p, CU_K_NORM_QKV_ROPE_KV), 1);
	s = shape(4096, 32, 32, 11008, KT_Q8_0, 8);
	assert_int_equal(cu_plan_layer(CU_CAND_BASE, &s, &p), 0);
	show("7B", &s, CU_CAND_BASE, &p);
	assert_int_equal(p.n, 14);
	/* more rows than the matrix-vector kernels take: the ops path */
	s = shape(4096, 32, 32, 11008, KT_F16, 9);
	assert_int_equal(cu_plan_layer(CU_CAND_FUSED, &s, &p), -1);
	/* no resident blocks: persistent plans as fused */
	s = shape(4096, 32, 32, 11008, KT_F16, 1);
	s.persist_blocks = 0;
	assert_int_equal(cu_plan_layer(CU_CAND_PERSIST, &s, &p), 0);
	assert_int_equal(p.cand, CU_CAND_FUSED);
}

/* A Llama 3 8B layer (GQA 32/8, ffn 14336): the persistent kernel stages the
 * 14,336-wide hb (56 KB fp32, opting in), q/k/v pairs over 6,144 rows. */
static void test_plans_llama3(void **state)
{
	(void)state;
	struct cu_shape s = shape(4096, 32, 8, 14336, KT_F16, 1);
	struct cu_plan p;
	for (int c = 0; c < CU_N_CAND; c++) {
		assert_int_equal(cu_plan_layer((enum cu_cand)c, &s, &p), 0);
		show("llama3-8B", &s, (enum cu_cand)c, &p);
		double wb = layer_weight_bytes(&s), pb = cu_plan_bytes(&p);
		assert_true(pb >= wb && pb <= wb * 1.1);
	}
	assert_int_equal(cu_plan_layer(CU_CAND_PERSIST, &s, &p), 0);
	assert_int_equal(p.cand, CU_CAND_PERSIST);
	assert_int_equal(p.s[0].smem, (size_t)14336 * 4);
	assert_int_equal(cu_plan_layer(CU_CAND_FUSED, &s, &p), 0);
	assert_int_equal(p.s[0].grid[0], (4096 + 2 * 1024) / 2 / CU_GW);
	/* Q4_0 persistent stages 8-bit blocks: 14336 + 14336/32*8 bytes */
	s = shape(4096, 32, 8, 14336, KT_Q4_0, 1);
	assert_int_equal(cu_plan_layer(CU_CAND_PERSIST, &s, &p), 0);
	assert_int_equal(p.s[0].smem, (size_t)14336 + 14336 / 32 * 8);
}

/* Every row of q, k and v is in exactly one job, in RoPE's pairs. */
static void test_qkv_pairs_cover(void **state)
{
	(void)state;
	const int cfg[][3] = { { 4, 4, 8 }, { 8, 2, 16 }, { 32, 8, 128 }, { 3, 1, 6 } };
	for (size_t ci = 0; ci < sizeof(cfg) / sizeof(cfg[0]); ci++)
		for (int half = 0; half < 2; half++) {
			int H = cfg[ci][0], KH = cfg[ci][1], hd = cfg[ci][2];
			int rows[3] = { H * hd, KH * hd, KH * hd };
			int total = rows[0] + rows[1] + rows[2];
			int *seen = calloc((size_t)total, sizeof(int)), *outc = calloc((size_t)total, sizeof(int));
			int base[3] = { 0, rows[0], rows[0] + rows[1] };
			struct cu_pair p;
			int g = 0;
			for (; cu_qkv_pair(g, rows[0], rows[1], rows[2], hd, half, &p); g++) {
				seen[base[p.m] + p.r0]++;
				seen[base[p.m] + p.r1]++;
				outc[base[p.m] + p.c0]++;
				outc[base[p.m] + p.c0 + 1]++;
				assert_int_equal(p.c0 % 2, 0);
				if (p.m < 2) {
					int h = p.c0 / hd, i = p.c0 % hd / 2;
					assert_int_equal(p.fi, i);
					assert_int_equal(p.r0, half ? h * hd + i : p.c0);
					assert_int_equal(p.r1, half ? h * hd + i + hd / 2 : p.c0 + 1);
				} else {
					assert_int_equal(p.r0, p.c0);
					assert_int_equal(p.r1, p.c0 + 1);
				}
			}
			assert_int_equal(g, total / 2);
			assert_int_equal(cu_qkv_pair(-1, rows[0], rows[1], rows[2], hd, half, &p), 0);
			for (int i = 0; i < total; i++) {
				assert_int_equal(seen[i], 1);
				assert_int_equal(outc[i], 1);
			}
			free(seen);
			free(outc);
		}
}

/*
 * kv_store.cu's typed kernel (f16, q8_0) written out in C over the same
 * helpers of plan.h: each row's K and V into its slot; q8_0 a warp's 32
 * channels at a time, each group's largest magnitude folded from its
 * lanes' (in lane order here, in a shuffle tree there: a maximum, the same
 * in any order), codes against the stored scale, the scale stored by the
 * group's first lane.
 */
static void kv_store_sim(const struct kt_kv *kv, int layer, const float *k, const float *v,
			 const struct kt_attn_row *rows, int n_tok)
{
	int bs = kv->block_size, kd = kv->kv_dim, G = kv->group, dt = kv->dtype;
	for (int t = 0; t < n_tok; t++) {
		int p = rows[t].pos, r = p % bs;
		int32_t b = rows[t].block_table[p / bs];
		size_t span = cu_kv_span_bytes(dt, bs, kd, G);
		char *ks = (char *)kv->base + cu_kv_span_off(b, kv->n_layers, layer, 0, span), *vs = ks + span;
		const float *kr = k + (size_t)t * kd, *vr = v + (size_t)t * kd;
		if (dt == KT_F16) {
			for (int c = 0; c < kd; c++) {
				((uint16_t *)ks)[(size_t)c * bs + r] = cu_f16_bits(kr[c]);
				((uint16_t *)vs)[(size_t)r * kd + c] = cu_f16_bits(vr[c]);
			}
			continue;
		}
		uint16_t *ksc = (uint16_t *)(ks + (size_t)bs * kd), *vsc = (uint16_t *)(vs + (size_t)bs * kd);
		for (int c0 = 0; c0 < kd; c0 += 32)
			for (int l0 = 0; l0 < 32; l0 += G) {
				float ax = 0.f, ay = 0.f;
				for (int l = l0; l < l0 + G; l++) {
					int c = c0 + l, in = c < kd;
					ax = cu_kv_amax(ax, cu_kv_amax(0.f, in ? kr[c] : 0.f));
					ay = cu_kv_amax(ay, cu_kv_amax(0.f, in ? vr[c] : 0.f));
				}
				if (c0 + l0 >= kd)
					continue;
				uint16_t dk = cu_kv_q8_scale(ax), dv = cu_kv_q8_scale(ay);
				for (int l = l0; l < l0 + G; l++) {
					int c = c0 + l;
					((int8_t *)ks)[(size_t)c * bs + r] = cu_kv_q8_code(kr[c], cu_kv_q8_inv(dk));
					((int8_t *)vs)[(size_t)r * kd + c] = cu_kv_q8_code(vr[c], cu_kv_q8_inv(dv));
				}
				ksc[cu_kv_k_scale(bs, (c0 + l0) / G, r)] = dk;
				vsc[cu_kv_v_scale(kd, G, (c0 + l0) / G, r)] = dv;
			}
	}
}

/* The epilogue's store of x at element i of an f32 or f16 pool
 * (epi_kv_put in gemv.cuh). */
static void epi_put(const struct kt_kv *kv, size_t i, float x)
{
	if (kv->dtype == KT_F16)
		((uint16_t *)kv->base)[i] = cu_f16_bits(x);
	else
		((float *)kv->base)[i] = x;
}

/*
 * The fused epilogue, as the kernel computes it (job_store in gemv.cuh),
 * from the products q, k, v of n_tok rows: q rotated in place into qo, k
 * rotated and v stored in the KV pool at each row's slot; for a q8_0 pool
 * k rotated and v as rows (into kq, vq), then the kv_store step.
 */
static void epilogue(float *qo, const float *q, const float *k, const float *v, int n_tok,
		     int H, int KH, int hd, int half, const int *pos, const struct kt_attn_row *rows,
		     const float *inv_freq, const struct kt_kv *kv, int layer, float *kq, float *vq)
{
	int qr = H * hd, kr = KH * hd, as_rows = kv->dtype == KT_Q8_0;
	struct cu_pair p;
	for (int g = 0; cu_qkv_pair(g, qr, kr, kr, hd, half, &p); g++)
		for (int t = 0; t < n_tok; t++) {
			const float *src = p.m == 0 ? q + (size_t)t * qr : p.m == 1 ? k + (size_t)t * kr
										   : v + (size_t)t * kr;
			float a = src[p.r0], b = src[p.r1];
			int ps = pos[t], slot = rows[t].pos % kv->block_size;
			int32_t blk = rows[t].block_table[rows[t].pos / kv->block_size];
			if (p.m == 2) {
				if (as_rows) {
					vq[(size_t)t * kr + p.c0] = a;
					vq[(size_t)t * kr + p.c0 + 1] = b;
					continue;
				}
				epi_put(kv, cu_kv_v_off(blk, kv->n_layers, layer, kv->block_size, kv->kv_dim,
							p.c0, slot), a);
				epi_put(kv, cu_kv_v_off(blk, kv->n_layers, layer, kv->block_size, kv->kv_dim,
							p.c0 + 1, slot), b);
				continue;
			}
			float ang = (float)ps * inv_freq[p.fi], o0, o1;
			cu_rope_rot(a, b, cosf(ang), sinf(ang), &o0, &o1);
			if (p.m == 0) {
				qo[(size_t)t * qr + p.c0] = o0;
				qo[(size_t)t * qr + p.c0 + 1] = o1;
			} else if (as_rows) {
				kq[(size_t)t * kr + p.c0] = o0;
				kq[(size_t)t * kr + p.c0 + 1] = o1;
			} else {
				epi_put(kv, cu_kv_k_off(blk, kv->n_layers, layer, kv->block_size, kv->kv_dim,
							p.c0, slot), o0);
				epi_put(kv, cu_kv_k_off(blk, kv->n_layers, layer, kv->block_size, kv->kv_dim,
							p.c0 + 1, slot), o1);
			}
		}
	if (as_rows)
		kv_store_sim(kv, layer, kq, vq, rows, n_tok);
}

static void test_epilogue_matches_cpu(void **state)
{
	(void)state;
	rng_seed(1717);
	struct backend *be = backend_cpu_new(1);
	assert_non_null(be);
	const int cfg[][3] = { { 4, 4, 16 }, { 8, 2, 32 }, { 6, 3, 64 }, { 4, 2, 8 } };
	const enum kt_dtype kvt[3] = { KT_F32, KT_F16, KT_Q8_0 };
	for (int ti = 0; ti < 3; ti++)
		for (size_t ci = 0; ci < sizeof(cfg) / sizeof(cfg[0]); ci++)
			for (int half = 0; half < 2; half++) {
				int H = cfg[ci][0], KH = cfg[ci][1], hd = cfg[ci][2], T = 5, L = 3, layer = 1;
				int bs = 16, nblocks = 6, qr = H * hd, kr = KH * hd;
				struct kt_kv kv1 = { NULL, nblocks, bs, L, kr, kvt[ti],
						     kvt[ti] == KT_Q8_0 ? kt_kv_group_for(hd) : 0 }, kv2 = kv1;
				/* the pools' bytes alike, whatever they are */
				size_t kvn = kt_kv_block_bytes(&kv1) * nblocks;
				kv1.base = malloc(kvn);
				kv2.base = malloc(kvn);
				for (size_t i = 0; i < kvn; i++)
					((uint8_t *)kv1.base)[i] = ((uint8_t *)kv2.base)[i] = (uint8_t)rng_u64();
				float *q = malloc((size_t)T * qr * 4), *k = malloc((size_t)T * kr * 4);
				float *v = malloc((size_t)T * kr * 4), *qo = malloc((size_t)T * qr * 4);
				float *kq = malloc((size_t)T * kr * 4), *vq = malloc((size_t)T * kr * 4);
				float *inv = malloc((size_t)hd / 2 * 4);
				for (int i = 0; i < T * qr; i++)
					q[i] = rng_float(-2, 2);
				for (int i = 0; i < T * kr; i++) {
					k[i] = rng_float(-2, 2);
					v[i] = rng_float(-2, 2);
				}
				for (int i = 0; i < hd / 2; i++)
					inv[i] = powf(10000.f, -2.f * i / hd);
				/* two sequences: rows at scattered positions and blocks */
				int32_t tab_a[4] = { 5, 2, 0, 3 }, tab_b[2] = { 1, 4 };
				struct kt_attn_row rows[5] = { { tab_a, 7 }, { tab_a, 16 }, { tab_a, 63 },
							      { tab_b, 0 }, { tab_b, 31 } };
				int pos[5];
				for (int t = 0; t < T; t++)
					pos[t] = rows[t].pos;
				for (int i = 0; i < T * qr; i++)
					qo[i] = NAN;
				epilogue(qo, q, k, v, T, H, KH, hd, half, pos, rows, inv, &kv2, layer, kq, vq);
				/* the CPU backend: rope in place, then kv_store */
				be->ops->rope(be, q, k, pos, T, H, KH, hd, inv,
					      half ? KT_ROPE_HALF : KT_ROPE_INTERLEAVED);
				be->ops->kv_store(be, &kv1, layer, k, v, rows, T);
				if (memcmp(q, qo, (size_t)T * qr * 4))
					fail_msg("%s cfg %zu half %d: rotated q differs from the CPU rope",
						 kt_dtype_name(kvt[ti]), ci, half);
				if (memcmp(kv1.base, kv2.base, kvn))
					fail_msg("%s cfg %zu half %d: KV pool differs from the CPU kv_store",
						 kt_dtype_name(kvt[ti]), ci, half);
				free(kv1.base);
				free(kv2.base);
				free(q);
				free(k);
				free(v);
				free(qo);
				free(kq);
				free(vq);
				free(inv);
			}
	backend_free(be);
}

/* Spans of the typed store where kernels/convert.c puts them, for every
 * element type, head dimension and (block, layer). */
static void test_kv_layout_typed(void **state)
{
	(void)state;
	const enum kt_dtype kvt[3] = { KT_F32, KT_F16, KT_Q8_0 };
	const int hds[5] = { 8, 16, 48, 64, 128 };
	for (int ti = 0; ti < 3; ti++)
		for (int hi = 0; hi < 5; hi++)
			for (int kh = 1; kh <= 3; kh++) {
				int hd = hds[hi], G = kvt[ti] == KT_Q8_0 ? kt_kv_group_for(hd) : 0;
				struct kt_kv kv = { (void *)(uintptr_t)0x10000, 7, 16, 3, kh * hd, kvt[ti], G };
				size_t span = cu_kv_span_bytes(kv.dtype, kv.block_size, kv.kv_dim, G);
				assert_int_equal(span, kt_kv_span_bytes(&kv));
				for (int b = 0; b < kv.n_blocks; b++)
					for (int l = 0; l < kv.n_layers; l++) {
						char *base = kv.base;
						assert_ptr_equal(base + cu_kv_span_off(b, 3, l, 0, span),
								 kt_kv_kt(&kv, b, l));
						assert_ptr_equal(base + cu_kv_span_off(b, 3, l, 1, span),
								 kt_kv_vspan(&kv, b, l));
					}
			}
}

/* One q8_0 group through plan.h's helpers, as kv_store.cu takes it. */
static uint16_t q8_group_sim(const float *x, int8_t *codes, int n)
{
	float amax = 0.f;
	for (int i = 0; i < n; i++)
		amax = cu_kv_amax(amax, x[i]);
	uint16_t d = cu_kv_q8_scale(amax);
	float inv = cu_kv_q8_inv(d);
	for (int i = 0; i < n; i++)
		codes[i] = cu_kv_q8_code(x[i], inv);
	return d;
}

/* The q8_0 group arithmetic of the kernels = kt_kv_q8_group, bit for bit:
 * random groups of 8, 16 and 32 at scales from subnormal f16 scales to
 * ones that overflow f16, exact halves (ties to even), zeros, NaN and
 * infinities. */
static void test_kv_q8_group(void **state)
{
	(void)state;
	rng_seed(4242);
	const float scales[7] = { 1e-9f, 3e-6f, 1e-3f, 1.f, 300.f, 6e6f, 1e30f };
	for (int rep = 0; rep < 6000; rep++) {
		int n = 8 << (rep % 3);
		float x[32], sc = scales[rep / 3 % 7];
		for (int i = 0; i < n; i++)
			x[i] = rng_float(-sc, sc);
		switch (rep % 11) {
		case 0: /* ties: amax 127 gives scale 1, codes of exact halves */
			for (int i = 0; i < n; i++)
				x[i] = (float)((int)(rng_u64() % 254) - 127) + 0.5f;
			x[0] = 127.f;
			break;
		case 1: memset(x, 0, sizeof(x)); break;
		case 2: x[rep % n] = NAN; break;
		case 3: x[rep % n] = rep & 1 ? INFINITY : -INFINITY; break;
		case 4: x[rep % n] = -0.f; x[(rep + 1) % n] = -sc; break;
		default: break;
		}
		int8_t c1[32], c2[32];
		uint16_t d1 = kt_kv_q8_group(x, c1, n), d2 = q8_group_sim(x, c2, n);
		if (d1 != d2 || memcmp(c1, c2, (size_t)n))
			fail_msg("rep %d (n %d, scale %g): scale %04x vs %04x or codes differ", rep, n,
				 (double)sc, d1, d2);
	}
	/* the rounding itself */
	assert_int_equal(cu_kv_q8_code(2.5f, 1.f), 2);
	assert_int_equal(cu_kv_q8_code(-3.5f, 1.f), -4);
	assert_int_equal(cu_kv_q8_code(300.f, 1.f), 127);
	assert_int_equal(cu_kv_q8_code(-300.f, 1.f), -127);
	assert_int_equal(cu_kv_q8_code(NAN, 1.f), 0);
	assert_int_equal(cu_kv_q8_inv(0), 0);
	assert_int_equal(cu_f16_bits(NAN), 0x7e00);
	assert_int_equal(cu_f16_bits(-NAN), 0xfe00);
	assert_int_equal(cu_f16_bits(65520.f), 0x7c00);
	assert_int_equal(cu_f16_bits(65519.f), 0x7bff);
}

/* kv_store.cu's typed kernel (in C, kv_store_sim) writes the bytes the
 * CPU backend's kv_store writes: f16 and q8_0, head dims 8 to 128, GQA
 * widths, rows at scattered slots, values spanning many binades with
 * zeros, a NaN and an infinity. */
static void test_kv_store_typed(void **state)
{
	(void)state;
	rng_seed(515);
	struct backend *be = backend_cpu_new(1);
	assert_non_null(be);
	const int hds[4] = { 8, 48, 64, 128 };
	for (int ti = 0; ti < 2; ti++)
		for (int hi = 0; hi < 4; hi++)
			for (int kh = 1; kh <= 3; kh++) {
				enum kt_dtype dt = ti ? KT_Q8_0 : KT_F16;
				int hd = hds[hi], kd = kh * hd, T = 6, nb = 5;
				struct kt_kv kv1 = { NULL, nb, 16, 2, kd, dt, ti ? kt_kv_group_for(hd) : 0 };
				struct kt_kv kv2 = kv1;
				size_t bytes = kt_kv_block_bytes(&kv1) * nb;
				kv1.base = malloc(bytes);
				kv2.base = malloc(bytes);
				for (size_t i = 0; i < bytes; i++)
					((uint8_t *)kv1.base)[i] = ((uint8_t *)kv2.base)[i] = (uint8_t)rng_u64();
				float *k = malloc((size_t)T * kd * 4), *v = malloc((size_t)T * kd * 4);
				for (int i = 0; i < T * kd; i++) {
					float m = ldexpf(1.f, (int)(rng_u64() % 40) - 24);
					k[i] = rng_float(-m, m);
					v[i] = rng_float(-m, m) * 3.f;
				}
				for (int c = 0; c < kd; c++)
					k[(size_t)2 * kd + c] = 0.f;      /* a zero row */
				k[(size_t)3 * kd + kd / 2] = NAN;
				v[(size_t)4 * kd + 1] = INFINITY;
				int32_t tab_a[3] = { 4, 0, 2 }, tab_b[2] = { 3, 1 };
				struct kt_attn_row rows[6] = { { tab_a, 0 }, { tab_a, 17 }, { tab_a, 47 },
							      { tab_b, 5 }, { tab_b, 16 }, { tab_b, 31 } };
				be->ops->kv_store(be, &kv1, 1, k, v, rows, T);
				kv_store_sim(&kv2, 1, k, v, rows, T);
				if (memcmp(kv1.base, kv2.base, bytes))
					fail_msg("%s hd %d x %d: the kernel's bytes differ from the CPU's",
						 kt_dtype_name(dt), hd, kh);
				free(kv1.base);
				free(kv2.base);
				free(k);
				free(v);
			}
	backend_free(be);
}

/* Plans over a typed pool: f16 as f32 (its K/V bytes halved); q8_0 a
 * kv_store step after the fused q/k/v (which leaves k and v as rows, arg
 * 1), persistent planned as fused, base unchanged. */
static void test_plans_kv_types(void **state)
{
	(void)state;
	const enum kt_dtype dts[4] = { KT_F16, KT_Q8_0, KT_Q4_0, KT_Q4_K };
	const int toks[2] = { 1, 8 };
	for (int d = 0; d < 4; d++)
		for (int ni = 0; ni < 2; ni++)
			for (int c = 0; c < CU_N_CAND; c++) {
				struct cu_shape s = shape(4096, 32, 8, 14336, dts[d], toks[ni]);
				s.ctx = 4096;
				struct cu_plan p32, p16, p8;
				assert_int_equal(cu_plan_layer((enum cu_cand)c, &s, &p32), 0);
				s.kv_dt = KT_F16;
				assert_int_equal(cu_plan_layer((enum cu_cand)c, &s, &p16), 0);
				s.kv_dt = KT_Q8_0;
				assert_int_equal(cu_plan_layer((enum cu_cand)c, &s, &p8), 0);
				show("llama3-8B kv q8_0", &s, (enum cu_cand)c, &p8);
				assert_int_equal(p16.cand, p32.cand);
				assert_int_equal(p16.n, p32.n);
				for (int i = 0; i < p32.n; i++) {
					assert_int_equal(p16.s[i].kind, p32.s[i].kind);
					assert_int_equal(p16.s[i].arg, p32.s[i].arg);
					if (p32.s[i].kind == CU_K_ATTN || p32.s[i].kind == CU_K_LAYER)
						assert_true(p16.s[i].bytes < p32.s[i].bytes);
					else
						assert_true(p16.s[i].bytes == p32.s[i].bytes);
				}
				/* q8_0 against the f32 plan of the candidate it runs */
				struct cu_plan ref;
				s.kv_dt = KT_F32;
				assert_int_equal(cu_plan_layer(p8.cand, &s, &ref), 0);
				assert_int_equal(p8.cand, c == CU_CAND_PERSIST ? CU_CAND_FUSED : p32.cand);
				if (p8.cand == CU_CAND_BASE) {
					assert_int_equal(p8.n, ref.n);
					continue;
				}
				assert_int_equal(p8.n, ref.n + 1);
				int j = 0;
				for (int i = 0; i < p8.n; i++) {
					int qkv = p8.s[i].kind == CU_K_NORM_QKV_ROPE_KV ||
						  p8.s[i].kind == CU_K_QKV_ROPE_KV;
					if (i > 0 && (p8.s[i - 1].kind == CU_K_NORM_QKV_ROPE_KV ||
						      p8.s[i - 1].kind == CU_K_QKV_ROPE_KV)) {
						assert_int_equal(p8.s[i].kind, CU_K_KV_STORE);
						assert_int_equal(p8.s[i].grid[0], toks[ni]);
						continue;
					}
					assert_int_equal(p8.s[i].kind, ref.s[j].kind);
					assert_int_equal(p8.s[i].arg, qkv ? 1 : ref.s[j].arg);
					j++;
				}
				assert_int_equal(count_kind(&p8, CU_K_KV_STORE), 1);
			}
}

/* Split-K parts tile [0, nb) in order; the part count stays in range. */
static void test_splitk_parts(void **state)
{
	(void)state;
	for (int nb = 1; nb < 400; nb += 7)
		for (int S = 1; S <= CU_MAX_SPLITK; S++) {
			int end = 0;
			for (int s = 0; s < S; s++) {
				int b0, b1;
				cu_splitk_range(nb, s, S, &b0, &b1);
				assert_int_equal(b0, end);
				assert_true(b1 >= b0);
				assert_true(b1 - b0 <= (nb + S - 1) / S);
				end = b1;
			}
			assert_int_equal(end, nb);
		}
	assert_int_equal(cu_splitk_parts(4096, 4096, 132), 2);
	assert_int_equal(cu_splitk_parts(4096, 11008, 132), 2);
	assert_int_equal(cu_splitk_parts(1024, 4096, 132), 4);   /* 32 blocks per part at most 4 */
	assert_int_equal(cu_splitk_parts(64, 1024, 132), 1);     /* 32 blocks: one part */
	assert_int_equal(cu_splitk_parts(8, 65536, 132), CU_MAX_SPLITK);
}

/* The 8-bit activation block: d = amax / 127, codes round to nearest even
 * and stay within +-127; d * q within d/2 of the value. */
static void test_qx_block(void **state)
{
	(void)state;
	rng_seed(99);
	for (int rep = 0; rep < 2000; rep++) {
		float x[32], amax = 0;
		float sc = rep % 3 == 0 ? 1e-3f : rep % 3 == 1 ? 1.f : 300.f;
		for (int i = 0; i < 32; i++) {
			x[i] = rng_float(-sc, sc);
			if (fabsf(x[i]) > amax)
				amax = fabsf(x[i]);
		}
		float d = cu_qx_scale(amax);
		assert_true(d == amax / 127.f);
		for (int i = 0; i < 32; i++) {
			int q = cu_qx_code(x[i], d);
			assert_true(q >= -127 && q <= 127);
			assert_true(fabsf(d * (float)q - x[i]) <= d * 0.5001f);
		}
	}
	assert_int_equal(cu_qx_code(5.f, 0.f), 0);
	assert_int_equal(cu_qx_code(2.5f, 1.f), 2);   /* ties to even */
	assert_int_equal(cu_qx_code(-3.5f, 1.f), -4);
}

static void test_cand_spec(void **state)
{
	(void)state;
	int t[CU_N_DTYPE];
	cu_cand_defaults(t);
	for (int i = 0; i < CU_N_DTYPE; i++)
		assert_int_equal(t[i], CU_CAND_BASE);   /* no GPU run has settled one yet */
	assert_int_equal(cu_cand_spec("fused", t), 0);
	for (int i = 0; i < CU_N_DTYPE; i++)
		assert_int_equal(t[i], CU_CAND_FUSED);
	assert_int_equal(cu_cand_spec("q4_0=persistent,f16=base,q8_0=splitk", t), 0);
	assert_int_equal(t[KT_Q4_0], CU_CAND_PERSIST);
	assert_int_equal(t[KT_F16], CU_CAND_BASE);
	assert_int_equal(t[KT_Q8_0], CU_CAND_SPLITK);
	assert_int_equal(t[KT_Q4_K], CU_CAND_FUSED);
	int before[CU_N_DTYPE];
	memcpy(before, t, sizeof(t));
	const char *bad[] = { "nope", "q4_0=nope", "q9_0=fused", "q4_0", "f16=fused,", "=fused" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int rc = cu_cand_spec(bad[i], t);
		if (!strcmp(bad[i], "f16=fused,")) {   /* a trailing comma is harmless */
			assert_int_equal(rc, 0);
			assert_int_equal(t[KT_F16], CU_CAND_FUSED);
			memcpy(t, before, sizeof(t));
			continue;
		}
		if (rc != -1)
			fail_msg("spec '%s' accepted", bad[i]);
		assert_memory_equal(t, before, sizeof(t));
	}
	for (int c = 0; c < CU_N_CAND; c++)
		assert_int_equal(cu_cand_parse(cu_cand_name((enum cu_cand)c)), c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_plans_7b),
		cmocka_unit_test(test_plans_llama3),
		cmocka_unit_test(test_qkv_pairs_cover),
		cmocka_unit_test(test_epilogue_matches_cpu),
		cmocka_unit_test(test_kv_layout_typed),
		cmocka_unit_test(test_kv_q8_group),
		cmocka_unit_test(test_kv_store_typed),
		cmocka_unit_test(test_plans_kv_types),
		cmocka_unit_test(test_splitk_parts),
		cmocka_unit_test(test_qx_block),
		cmocka_unit_test(test_cand_spec),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}

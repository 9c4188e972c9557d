/*
 * kernels/cuda/candidates/layer_op.cu — the layer op: a whole layer for a
 * staged batch of
 * up to CU_GEMV_MAX rows of one dtype, run step by step as the dtype's
 * candidate plans it (plan.h); set_kernels, the candidates per dtype.
 * Never run on a GPU yet (written 2026-12-02 without one): the fused,
 * split-K and persistent steps it executes (plan.h, docs/PERF.md).
 */
#include <errno.h>
#include <string.h>

#include "kernels/cuda/backend.cuh"

/* A batch the layer kernels take: staged, matrix-vector sized, and one
 * dtype for all seven matrices (their shapes are the loaders', built from
 * the config; a Q4_K_M file's Q6_K wv and w2 keep its layers on the ops). */
static int layer_ok(struct cu_backend *c, const struct kt_layer *L, int n_tok)
{
	const struct kt_weight *w[7] = { L->wq, L->wk, L->wv, L->wo, L->w1, L->w2, L->w3 };
	if (c->be.failed || n_tok != c->batch.n_tok || n_tok > CU_GEMV_MAX || c->n_runs)
		return 0;
	for (int i = 1; i < 7; i++)
		if (w[i]->dtype != w[0]->dtype)
			return 0;
	return 1;
}

/* the job of one product: weights, outputs, 8-bit scratch when qx */
static struct cu_gemv_job layer_job(struct cu_backend *c, int n, const struct kt_weight *const *w,
				    float *const *y, int qx)
{
	struct cu_gemv_job j = job_of(n, w, y);
	if (qx)
		q8_scratch(c, &j);
	j.vec = w[0]->cols % 8 == 0 ? w[0]->cols : 0;
	return j;
}

static struct cu_gemv_epi layer_epi(struct cu_backend *c, const struct kt_kv *kv, int layer,
				    const struct kt_layer *L)
{
	struct cu_gemv_epi e;
	e.kv = kv->base;
	e.kv_dt = kv->dtype;
	e.inv_freq = L->inv_freq;
	e.pos = c->batch.pos;
	e.row_tab = c->batch.row_tab;
	e.tables = c->batch.tables;
	e.tab_stride = c->batch.tab_stride;
	e.n_layers = kv->n_layers;
	e.bs = kv->block_size;
	e.kv_dim = kv->kv_dim;
	e.layer = layer;
	e.hd = L->head_dim;
	e.half = L->layout == KT_ROPE_HALF;
	return e;
}

/* Resident blocks of the persistent kernel for dtype dt with smem bytes of
 * shared memory: cached, the figure for at least that much shared memory;
 * queried (not while recording: 0, the layer runs fused). */
static int persist_blocks(struct cu_backend *c, int dt, int qx, size_t smem)
{
	if (c->persist[dt] >= 0 && smem <= c->persist_smem[dt])
		return c->persist[dt];
	if (c->capturing) {
		/* the attribute and occupancy calls are kept out of a recording */
		backend_log(BACKEND_LOG_WARN, "cuda: the persistent kernel's occupancy for %s was "
			    "not known before recording: this layer runs fused",
			    kt_dtype_name((enum kt_dtype)dt));
		return 0;
	}
	c->persist[dt] = cu_layer_blocks((enum kt_dtype)dt, qx, smem, c->n_sm);
	c->persist_smem[dt] = smem;
	return c->persist[dt];
}

/* The persistent kernel's resident blocks for each dtype placed that runs
 * it, before any recording (cu_reserve): for the widest matrix input and
 * the largest head the kernel takes (128), at least what any layer asks. */
void persist_prepare(struct cu_backend *c)
{
	for (int dt = 0; dt < CU_N_DTYPE; dt++)
		if (c->placed >> dt & 1 && c->max_cols && c->cand[dt] == CU_CAND_PERSIST) {
			int qx = c->q8_act && (dt == KT_Q8_0 || dt == KT_Q4_0);
			persist_blocks(c, dt, qx, cu_persist_smem((int)c->max_cols, 128, qx));
		}
}

/* q/k/v through the ops one at a time (a fused step that could not run) */
static void qkv_ops(struct cu_backend *c, const struct kt_kv *kv, int layer,
		    const struct kt_layer *L, const struct kt_layer_bufs *b, int n_tok, int normed)
{
	if (!normed)
		cu_rmsnorm(c->stream, b->xb, b->x, L->att_norm, L->dim, n_tok, L->eps);
	float *const y[3] = { b->q, b->k, b->v };
	const struct kt_weight *const w[3] = { L->wq, L->wk, L->wv };
	gemv(c, 0, 3, y, w, b->xb, n_tok);
	cu_rope(c->stream, b->q, b->k, c->batch.pos, n_tok, L->n_heads, L->n_kv_heads, L->head_dim,
		L->inv_freq, L->layout);
	cu_kv_store(c->stream, kv, layer, b->k, b->v, &c->batch);
}

int cu_op_layer(struct backend *be, const struct kt_kv *kv, int layer,
		const struct kt_layer *L, const struct kt_layer_bufs *b, int n_tok)
{
	struct cu_backend *c = CB(be);
	if (!layer_ok(c, L, n_tok))
		return 0;
	enum kt_dtype dt = L->wq->dtype;
	if (c->cand[dt] == CU_CAND_BASE && c->cand_said[dt])
		return 0;  /* the default, today's kernels: the ops one at a time */
	int qd = L->n_heads * L->head_dim, D = L->dim, F = L->ffn_dim, hd = L->head_dim;
	int qx = c->q8_act && (dt == KT_Q8_0 || dt == KT_Q4_0) && D % 32 == 0 && qd % 32 == 0 &&
		 F % 32 == 0;
	struct cu_shape sh = { D, L->n_heads, L->n_kv_heads, hd, F, n_tok,
			       c->batch.single_rows ? n_tok : c->batch.n_tiles, c->batch.single_rows,
			       dt, qx, c->n_sm, 0, 0, kv->dtype };
	/* (its attention unit takes a position a lane: blocks of <= 32) */
	if (c->cand[dt] == CU_CAND_PERSIST && n_tok == 1 && sh.single_rows &&
	    kv->block_size <= 32)
		sh.persist_blocks = persist_blocks(c, dt, qx, cu_plan_persist_smem(&sh));
	struct cu_plan p;
	if (cu_plan_layer((enum cu_cand)c->cand[dt], &sh, &p))
		return 0;
	if (!c->cand_said[dt]) {
		c->cand_said[dt] = 1;
		backend_log(BACKEND_LOG_INFO, "cuda: %s layers run the %s kernels (%d launches per "
			    "layer for %d row%s)", kt_dtype_name(dt), cu_cand_name(p.cand), p.n, n_tok,
			    n_tok == 1 ? "" : "s");
	}
	if (p.cand == CU_CAND_BASE)
		return 0;  /* today's kernels: the ops one at a time, as planned */
	cudaStream_t st = c->stream;
	float *const xin[3] = { b->xb, b->att, b->hb };
	const int xcols[3] = { D, qd, F };
	for (int i = 0; i < p.n && !be->failed; i++) {
		const struct cu_step *s = &p.s[i];
		const struct kt_weight *wadd = s->arg ? L->w2 : L->wo;
		float *xadd = s->arg ? b->hb : b->att;
		switch (s->kind) {
		case CU_K_RMSNORM:
			cu_rmsnorm(st, b->xb, b->x, s->arg ? L->ffn_norm : L->att_norm, D, n_tok, L->eps);
			break;
		case CU_K_QUANT_X: {
			struct cu_gemv_job j;
			q8_scratch(c, &j);
			cu_quant_x(st, j.xq, j.xd, j.xs, xin[s->arg], (size_t)n_tok * xcols[s->arg] / 32);
			break;
		}
		case CU_K_NORM_QKV_ROPE_KV:
		case CU_K_QKV_ROPE_KV: {
			int norm = s->kind == CU_K_NORM_QKV_ROPE_KV;
			const struct kt_weight *const w[3] = { L->wq, L->wk, L->wv };
			float *const y[3] = { b->q, b->k, b->v };
			struct cu_gemv_job j = layer_job(c, 3, w, y, qx);
			j.g = L->att_norm;
			j.eps = L->eps;
			j.e = layer_epi(c, kv, layer, L);
			if (cu_gemv_fused(st, &j, dt, 3, norm, qx, norm ? b->x : b->xb, n_tok))
				qkv_ops(c, kv, layer, L, b, n_tok, !norm);
			break;
		}
		case CU_K_KV_STORE:  /* after a q/k/v step that left K and V as rows (q8_0) */
			cu_kv_store(st, kv, layer, b->k, b->v, &c->batch);
			break;
		case CU_K_ATTN:  /* launches its combine step too */
			cu_attention(st, b->att, b->q, kv, layer, &c->batch, L->n_heads, L->n_kv_heads, hd,
				     c->part, c->n_sm);
			break;
		case CU_K_ATTN_COMBINE:
			break;
		case CU_K_GEMV_ADD: {
			struct cu_gemv_job j = layer_job(c, 1, &wadd, &b->x, qx);
			cu_gemv_launch(st, &j, dt, 1, xadd, n_tok);
			break;
		}
		case CU_K_SPLITK_ADD: {
			struct cu_gemv_job j = layer_job(c, 1, &wadd, &b->x, 0);
			j.part = c->skpart;
			j.count = c->skcount;
			if (cu_gemv_splitk(st, &j, dt, xadd, n_tok, s->splits))
				gemv(c, 1, 1, &b->x, &wadd, xadd, n_tok);
			break;
		}
		case CU_K_NORM_SWIGLU:
		case CU_K_GEMV_SWIGLU: {
			const struct kt_weight *const w[2] = { L->w1, L->w3 };
			float *const y[2] = { b->hb, NULL };
			struct cu_gemv_job j = layer_job(c, 2, w, y, qx);
			j.g = L->ffn_norm;
			j.eps = L->eps;
			if (s->kind == CU_K_GEMV_SWIGLU)
				cu_gemv_launch(st, &j, dt, 2, b->xb, n_tok);
			else if (cu_gemv_fused(st, &j, dt, 2, 1, qx, b->x, n_tok)) {
				cu_rmsnorm(st, b->xb, b->x, L->ffn_norm, D, n_tok, L->eps);
				gemv(c, 2, 2, y, w, b->xb, n_tok);
			}
			break;
		}
		case CU_K_LAYER: {
			struct cu_layer_args a;
			const struct kt_weight *const wqkv[3] = { L->wq, L->wk, L->wv };
			float *const yqkv[3] = { b->q, b->k, b->v };
			const struct kt_weight *const wffn[2] = { L->w1, L->w3 };
			float *const yffn[2] = { b->hb, NULL };
			a.qkv = layer_job(c, 3, wqkv, yqkv, 0);
			a.qkv.g = L->att_norm;
			a.qkv.eps = L->eps;
			a.qkv.e = layer_epi(c, kv, layer, L);
			a.o = layer_job(c, 1, &L->wo, &b->x, 0);
			a.ffn = layer_job(c, 2, wffn, yffn, 0);
			a.ffn.g = L->ffn_norm;
			a.ffn.eps = L->eps;
			a.down = layer_job(c, 1, &L->w2, &b->x, 0);
			a.x = b->x;
			cu_attn_fill(&a.at, b->att, b->q, kv, layer, &c->batch, L->n_heads, L->n_kv_heads,
				     hd, c->part);
			a.at.n_split = s->splits;
			cudaError_t e = (cudaError_t)cu_layer_launch(st, &a, dt, qx, (int)s->grid[0],
								     s->smem);
			if (e != cudaSuccess) {
				/* not a device failure: this dtype runs fused from now on */
				cudaGetLastError();
				backend_log(BACKEND_LOG_WARN, "cuda: the persistent %s layer kernel "
					    "did not start (%s): %s layers run fused", kt_dtype_name(dt),
					    cudaGetErrorString(e), kt_dtype_name(dt));
				c->persist[dt] = 0;
				c->persist_smem[dt] = (size_t)-1;
				return cu_op_layer(be, kv, layer, L, b, n_tok);
			}
			break;
		}
		default:
			break;
		}
		launched(c, cu_kind_name(s->kind));
	}
	return 1;
}

int set_kernels(struct cu_backend *c, const char *spec)
{
	int t[CU_N_DTYPE];
	memcpy(t, c->cand, sizeof(t));
	if (cu_cand_spec(spec, t))
		return -EINVAL;
	memcpy(c->cand, t, sizeof(t));
	memset(c->cand_said, 0, sizeof(c->cand_said));
	drop_graphs(c);  /* recorded graphs hold the old kernels */
	return 0;
}

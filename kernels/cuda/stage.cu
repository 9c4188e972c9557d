/*
 * kernels/cuda/stage.cu — batch staging: a batch's tokens, positions, block
 * tables and attention tiles copied to the device once, at fixed offsets so
 * that graphs replay, with the big runs that take the GEMM form of attention.
 */
#include <errno.h>
#include <string.h>

#include "kernels/cuda/backend.cuh"

/* Staging layout (ints), fixed offsets so that graphs can replay:
 * tok [0,cap) pos [cap,2cap) row_tab [2cap,3cap) tiles [3cap,6cap)
 * tables [6cap, 6cap + cap*stride). */
int stage_alloc(struct cu_backend *c, int cap, int stride)
{
	if (c->capturing)
		return -EIO;
	cudaStreamSynchronize(c->stream);
	cudaFreeHost(c->h_stage);
	cudaFree(c->d_stage);
	c->h_stage = NULL;
	c->d_stage = NULL;
	drop_graphs(c);  /* recorded pointers go stale */
	size_t n = (size_t)cap * 6 + (size_t)cap * stride;
	int rc = ck(c, cudaMallocHost((void **)&c->h_stage, n * 4), "cudaMallocHost");
	if (!rc)
		rc = ck(c, cudaMalloc((void **)&c->d_stage, n * 4), "cudaMalloc");
	if (rc)
		return rc;
	c->cap_tok = cap;
	c->tab_stride = stride;
	c->stage_ints = n;
	int32_t *d = c->d_stage;
	c->batch.tok = d;
	c->batch.pos = d + cap;
	c->batch.row_tab = d + 2 * cap;
	c->batch.tiles = d + 3 * cap;
	c->batch.tables = d + 6 * cap;
	c->batch.tab_stride = stride;
	return 0;
}

int cu_batch_begin(struct backend *be, const struct kt_kv *kv, const int32_t *tok,
		   const int *pos, const struct kt_attn_row *rows, int n)
{
	struct cu_backend *c = CB(be);
	if (be->failed)
		return -EIO;
	int bs = kv->block_size, max_p = 0;
	for (int t = 0; t < n; t++)
		if (rows[t].pos > max_p)
			max_p = rows[t].pos;
	int stride = (max_p > c->max_pos ? max_p : c->max_pos) / bs + 2;
	if (n > c->cap_tok || stride > c->tab_stride) {
		int cap = n > c->cap_tok ? n : c->cap_tok;
		if (stage_alloc(c, cap, stride > c->tab_stride ? stride : c->tab_stride))
			return -EIO;
	}
	/* the previous staging copy must have been read before we overwrite */
	if (ck(c, cudaEventSynchronize(c->staged), "staging"))
		return -EIO;
	int cap = c->cap_tok, S = c->tab_stride;
	int32_t *h = c->h_stage, *row_tab = h + 2 * cap, *tiles = h + 3 * cap, *tabs = h + 6 * cap;
	int n_tab = 0;
	const int32_t *cur = NULL;
	int tab_max = -1;
	for (int t = 0; t < n; t++) {
		h[t] = tok[t];
		h[cap + t] = pos[t];
		int p = rows[t].pos;
		if (rows[t].block_table != cur) {
			if (cur)
				memcpy(tabs + (size_t)(n_tab - 1) * S, cur, (size_t)(tab_max / bs + 1) * 4);
			cur = rows[t].block_table;
			n_tab++;
			tab_max = -1;
		}
		if (p > tab_max)
			tab_max = p;
		row_tab[t] = n_tab - 1;
	}
	if (cur)
		memcpy(tabs + (size_t)(n_tab - 1) * S, cur, (size_t)(tab_max / bs + 1) * 4);
	/* runs: consecutive rows of one table at consecutive positions. Small
	 * runs become tiles of up to CU_QT rows first; big runs' tiles follow
	 * (used only when their GEMMs cannot run) */
	int n_tiles = 0, single = 1;
	c->n_runs = 0;
	for (int pass = 0; pass < 2; pass++) {
		if (pass == 1)
			c->batch.n_small_tiles = n_tiles;
		for (int t = 0, e; t < n; t = e) {
			for (e = t + 1; e < n && row_tab[e] == row_tab[t] && pos[e] == pos[e - 1] + 1; e++)
				;
			int big = c->big_run > 0 && e - t >= c->big_run && c->n_runs < CU_MAX_RUNS;
			if (big != pass)
				continue;
			if (big)
				c->runs[c->n_runs++] = (struct cu_run){ t, e - t, pos[t], row_tab[t] };
			for (int u = t; u < e; u += CU_QT) {
				int *nt = tiles + 3 * n_tiles++;
				nt[0] = u;
				nt[1] = e - u < CU_QT ? e - u : CU_QT;
				nt[2] = pos[u];
				single &= nt[1] == 1;
			}
		}
	}
	single &= c->n_runs == 0;
	c->batch.n_tok = n;
	c->batch.n_tiles = n_tiles;
	c->batch.single_rows = single;
	c->h_tok = tok;
	c->kv_base = kv->base;
	c->kv_dt = kv->dtype;
	c->kv_group = kv->group;
	size_t ints = (size_t)6 * cap + (size_t)n_tab * S;
	if (ck(c, cudaMemcpyAsync(c->d_stage, h, ints * 4, cudaMemcpyHostToDevice, c->stream),
	       "staging") ||
	    ck(c, cudaEventRecord(c->staged, c->stream), "staging"))
		return -EIO;
	return 0;
}

/* The ops take the host arrays of the staged batch; anything else is a
 * caller bug. */
int staged(struct cu_backend *c, int n_tok, const char *op)
{
	if (n_tok == c->batch.n_tok)
		return 1;
	if (!c->be.failed)
		backend_log(BACKEND_LOG_ERROR, "cuda: %s called with %d rows, %d staged", op, n_tok,
			    c->batch.n_tok);
	c->be.failed = 1;
	return 0;
}

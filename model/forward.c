/*
 * model/forward.c — Llama forward pass over a batch of token rows.
 *
 * Per layer, for all rows at once (T rows, D = dim, Q = n_heads*hd,
 * KV = n_kv_heads*hd, F = ffn):
 *   xb = rmsnorm(x) * att_norm                      (T, D)
 *   q, k, v = xb Wq^T, xb Wk^T, xb Wv^T              (T, Q) (T, KV) (T, KV)
 *   rope(q, k) at each row's position; store k, v in the paged KV
 *   att = softmax(q K^T / sqrt(hd)) V per row/head   (T, Q)
 *   x += att Wo^T                                    (T, D)
 *   xb = rmsnorm(x) * ffn_norm
 *   x += (silu(xb W1^T) * (xb W3^T)) W2^T            (T, F) -> (T, D)
 * The last layer past storing its K/V runs on the rows that need logits
 * alone (host-memory backends; compact_out_rows). Then only those rows:
 * rmsnorm * final_norm, classifier.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"

/* classifier rows computed per matmul call (bounds the logits scratch) */
#define LOGIT_ROWS 64

/* Where a row's logits go: sequence output and row within it. */
struct out_row {
	float *dst;
	int row;   /* index in the batch */
};

/*
 * Activations live in backend memory (device memory on CUDA), as do the
 * weights the ops read: fwd_new places the model there (the CPU backend
 * aliases it) and keeps the placed copy in `dm`.
 */
struct fwd {
	const struct model *m;
	struct backend *be;
	int max_tokens;
	struct model dm;             /* placed weights: layers, norms, inv_freq */
	struct model_layer *dl;
	void **vecs;                 /* norm / rope vectors uploaded by fwd_new */
	int n_vecs;
	int placed;                  /* weights placed (release them in fwd_free) */
	float *x, *xb, *q, *k, *v, *att, *hb, *hb2;
	float *lx, *lout;            /* logit rows: (max_tokens, D), (lrows, vocab) */
	float *lout_host;            /* lout downloaded (device backends only) */
	int lrows;
	int32_t *tok;
	int *pos;
	struct out_row *outs;
	struct kt_attn_row *rows;
};

static void *bmem(struct fwd *f, size_t bytes)
{
	return f->be->ops->mem_alloc(f->be, bytes ? bytes : 1);
}

/* A host vector where the ops can read it: the same pointer on host memory,
 * else an uploaded copy (freed by fwd_free). */
static const float *place_vec(struct fwd *f, const float *v, size_t n)
{
	if (f->be->host_mem)
		return v;
	float *d = bmem(f, n * sizeof(float));
	if (!d)
		return NULL;
	f->vecs[f->n_vecs++] = d;
	if (f->be->ops->upload(f->be, d, v, n * sizeof(float)) != 0)
		return NULL;
	return d;
}

/* A matmul-only weight the backend copied (device memory, the CPU's packed
 * form): its file pages need not stay resident. */
static void drop_source(struct fwd *f, const struct kt_weight *dst, const struct kt_weight *src)
{
	if (dst->pack || dst->data != src->data)
		model_drop_pages(f->m, src->data,
				 (size_t)src->rows * kt_row_bytes(src->dtype, (size_t)src->cols));
}

/* Place every weight of f->m into backend memory (f->dm). 0 or -errno. */
static int place_model(struct fwd *f)
{
	const struct model *m = f->m;
	const struct model_config *c = &m->cfg;
	struct backend *be = f->be;
	f->dm = *m;
	f->dl = calloc((size_t)c->n_layers, sizeof(*f->dl));
	f->vecs = calloc((size_t)c->n_layers * 2 + 2, sizeof(void *));
	if (!f->dl || !f->vecs)
		return -ENOMEM;
	f->dm.layers = f->dl;
	f->placed = 1;
	int tied = m->cls.data == m->embed.data;
	int rc = be->ops->weight_place(be, &f->dm.embed, &m->embed,
				       KT_USE_ROWS | (tied ? KT_USE_MATMUL : 0));
	if (!rc && tied)
		f->dm.cls = f->dm.embed;   /* tied: one copy */
	else if (!rc && !(rc = be->ops->weight_place(be, &f->dm.cls, &m->cls, KT_USE_MATMUL)))
		drop_source(f, &f->dm.cls, &m->cls);
	for (int l = 0; l < c->n_layers && !rc; l++) {
		const struct model_layer *L = &m->layers[l];
		struct model_layer *D = &f->dl[l];
		const struct kt_weight *src[7] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->w1, &L->w2, &L->w3 };
		struct kt_weight *dst[7] = { &D->wq, &D->wk, &D->wv, &D->wo, &D->w1, &D->w2, &D->w3 };
		for (int i = 0; i < 7 && !rc; i++) {
			rc = be->ops->weight_place(be, dst[i], src[i], KT_USE_MATMUL);
			if (!rc)
				drop_source(f, dst[i], src[i]);
		}
		if (!rc && (!(D->att_norm = place_vec(f, L->att_norm, (size_t)c->dim)) ||
			    !(D->ffn_norm = place_vec(f, L->ffn_norm, (size_t)c->dim))))
			rc = be->failed ? -EIO : -ENOMEM;
	}
	if (!rc && (!(f->dm.final_norm = place_vec(f, m->final_norm, (size_t)c->dim)) ||
		    !(f->dm.inv_freq = (float *)place_vec(f, m->inv_freq, (size_t)c->head_dim / 2))))
		rc = be->failed ? -EIO : -ENOMEM;
	return rc;
}

static void release_model(struct fwd *f)
{
	struct backend *be = f->be;
	if (f->placed) {
		if (f->dm.cls.data != f->dm.embed.data)
			be->ops->weight_release(be, &f->dm.cls);
		be->ops->weight_release(be, &f->dm.embed);
		for (int l = 0; f->dl && l < f->m->cfg.n_layers; l++) {
			struct model_layer *D = &f->dl[l];
			struct kt_weight *w[7] = { &D->wq, &D->wk, &D->wv, &D->wo, &D->w1, &D->w2, &D->w3 };
			for (int i = 0; i < 7; i++)
				be->ops->weight_release(be, w[i]);
		}
	}
	for (int i = 0; i < f->n_vecs; i++)
		be->ops->mem_free(be, f->vecs[i]);
	free(f->vecs);
	free(f->dl);
}

struct fwd *fwd_new(const struct model *m, struct backend *be, int max_tokens)
{
	const struct model_config *c = &m->cfg;
	struct fwd *f = calloc(1, sizeof(*f));
	if (!f)
		return NULL;
	size_t T = (size_t)(max_tokens > 0 ? max_tokens : 1);
	size_t qd = (size_t)c->n_heads * c->head_dim, kv = (size_t)model_kv_dim(c);
	f->m = m;
	f->be = be;
	f->max_tokens = (int)T;
	f->lrows = (int)(T < LOGIT_ROWS ? T : LOGIT_ROWS);
	f->tok = malloc(T * sizeof(int32_t));
	f->pos = malloc(T * sizeof(int));
	f->rows = malloc(T * sizeof(*f->rows));
	f->outs = malloc(T * sizeof(*f->outs));
	if (!be->host_mem)
		f->lout_host = malloc((size_t)f->lrows * c->vocab * sizeof(float));
	if (!f->tok || !f->pos || !f->rows || !f->outs || (!be->host_mem && !f->lout_host) ||
	    place_model(f) != 0)
		goto fail;
	f->x = bmem(f, T * c->dim * sizeof(float));
	f->xb = bmem(f, T * ((size_t)c->dim > qd ? (size_t)c->dim : qd) * sizeof(float));
	f->q = bmem(f, T * qd * sizeof(float));
	f->k = bmem(f, T * kv * sizeof(float));
	f->v = bmem(f, T * kv * sizeof(float));
	f->att = bmem(f, T * qd * sizeof(float));
	f->hb = bmem(f, T * c->ffn_dim * sizeof(float));
	f->hb2 = bmem(f, T * c->ffn_dim * sizeof(float));
	f->lx = bmem(f, T * c->dim * sizeof(float));
	f->lout = bmem(f, (size_t)f->lrows * c->vocab * sizeof(float));
	if (!f->x || !f->xb || !f->q || !f->k || !f->v || !f->att || !f->hb || !f->hb2 ||
	    !f->lx || !f->lout || be->ops->reserve(be, c->max_ctx, (int)T) != 0)
		goto fail;
	return f;
fail:
	fwd_free(f);
	return NULL;
}

void fwd_free(struct fwd *f)
{
	if (!f)
		return;
	float *bufs[] = { f->x, f->xb, f->q, f->k, f->v, f->att, f->hb, f->hb2, f->lx, f->lout };
	for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
		if (bufs[i])
			f->be->ops->mem_free(f->be, bufs[i]);
	release_model(f);
	free(f->lout_host);
	free(f->tok);
	free(f->pos);
	free(f->rows);
	free(f->outs);
	free(f);
}

/* y[i] = x W[i]^T for n weights sharing x: one call where the backend has
 * matmul_n, else one matmul each. */
static void matmul_shared(struct fwd *f, int n, float *const *y, const struct kt_weight *const *w,
			  const float *x, int T)
{
	const struct backend_ops *op = f->be->ops;
	if (op->matmul_n) {
		op->matmul_n(f->be, n, y, w, x, T);
		return;
	}
	for (int i = 0; i < n; i++)
		op->matmul(f->be, y[i], x, w[i], T);
}

/* y += x W^T: fused where the backend has it, else through f->xb. */
static void matmul_add(struct fwd *f, float *y, const float *x, const struct kt_weight *w, int T)
{
	const struct backend_ops *op = f->be->ops;
	if (op->matmul_add) {
		op->matmul_add(f->be, y, x, w, T);
		return;
	}
	op->matmul(f->be, f->xb, x, w, T);
	op->add(f->be, y, f->xb, (size_t)T * w->rows);
}

/*
 * Rows that want logits (outs[i].row, ascending), moved to rows 0..n_out-1
 * of the residual x, the queries q and f->rows, for the rest of the last
 * layer. A prefill wants one row of many: the last layer's attention, Wo
 * and feed-forward for the others (1/n_layers of the matrix work, half at
 * two layers) would change nothing that is read. Every op treats rows
 * independently (the same bits whatever rows run beside), so the kept
 * rows' values are those of the full run. Host memory only: a row at a
 * time, each to a lower or the same index, never overlapping.
 */
static void compact_out_rows(struct fwd *f, const struct out_row *outs, int n_out)
{
	const struct model_config *c = &f->m->cfg;
	size_t D = (size_t)c->dim, Q = (size_t)c->n_heads * c->head_dim;
	for (int i = 0; i < n_out; i++) {
		int r = outs[i].row;
		if (r == i)
			continue;
		memcpy(f->x + i * D, f->x + (size_t)r * D, D * sizeof(float));
		memcpy(f->q + i * Q, f->q + (size_t)r * Q, Q * sizeof(float));
		f->rows[i] = f->rows[r];
	}
}

/* Every layer for T staged rows, then the final norm of the n_out rows that
 * want logits, gathered into f->lx. */
static void run_layers(struct fwd *f, const struct kt_kv *kv, int T,
		       const struct out_row *outs, int n_out)
{
	const struct model *m = &f->dm;
	const struct model_config *c = &m->cfg;
	const struct backend_ops *op = f->be->ops;
	struct backend *be = f->be;
	int D = c->dim, hd = c->head_dim;

	int compacted = 0;  /* the last layer ran on the n_out rows alone */
	op->embed(be, f->x, &m->embed, f->tok, T);
	struct kt_layer_bufs bufs = { f->x, f->xb, f->q, f->k, f->v, f->att, f->hb, f->hb2,
				      f->pos, f->rows };
	for (int l = 0; l < c->n_layers; l++) {
		const struct model_layer *L = &m->layers[l];
		if (op->layer) {
			struct kt_layer kl = { L->att_norm, L->ffn_norm, &L->wq, &L->wk, &L->wv, &L->wo,
					       &L->w1, &L->w2, &L->w3, D, c->n_heads, c->n_kv_heads,
					       hd, c->ffn_dim, c->rms_eps, m->inv_freq, c->rope_layout };
			if (op->layer(be, kv, l, &kl, &bufs, T))
				continue;
		}
		/* attention block */
		op->rmsnorm(be, f->xb, f->x, L->att_norm, D, T, c->rms_eps);
		float *const qkv[3] = { f->q, f->k, f->v };
		const struct kt_weight *const wqkv[3] = { &L->wq, &L->wk, &L->wv };
		matmul_shared(f, 3, qkv, wqkv, f->xb, T);
		op->rope(be, f->q, f->k, f->pos, T, c->n_heads, c->n_kv_heads, hd,
			 m->inv_freq, c->rope_layout);
		op->kv_store(be, kv, l, f->k, f->v, f->rows, T);
		if (l == c->n_layers - 1 && n_out < T && be->host_mem) {
			/* the last layer past its K/V matters only to rows that
			 * want logits: they alone go on, moved to the front */
			compact_out_rows(f, outs, n_out);
			if (n_out == 0)
				return;
			T = n_out;
			compacted = 1;
		}
		op->attention(be, f->att, f->q, kv, l, f->rows, T, c->n_heads, c->n_kv_heads, hd);
		matmul_add(f, f->x, f->att, &L->wo, T);
		/* feed-forward block */
		op->rmsnorm(be, f->xb, f->x, L->ffn_norm, D, T, c->rms_eps);
		if (op->matmul_swiglu) {
			op->matmul_swiglu(be, f->hb, f->xb, &L->w1, &L->w3, T);
		} else {
			float *const gu[2] = { f->hb, f->hb2 };
			const struct kt_weight *const wgu[2] = { &L->w1, &L->w3 };
			matmul_shared(f, 2, gu, wgu, f->xb, T);
			op->silu_mul(be, f->hb, f->hb2, (size_t)T * c->ffn_dim);
		}
		matmul_add(f, f->x, f->hb, &L->w2, T);
	}
	if (n_out == 0)
		return;
	/* gather the rows that want logits (runs of consecutive rows at once) */
	for (int i = 0, j; i < n_out; i = j) {
		for (j = i + 1; j < n_out && outs[j].row == outs[j - 1].row + 1; j++)
			;
		op->copy(be, f->lx + (size_t)i * D,
			 f->x + (size_t)(compacted ? i : outs[i].row) * D,
			 (size_t)(j - i) * D * sizeof(float));
	}
	op->rmsnorm(be, f->lx, f->lx, m->final_norm, D, n_out, c->rms_eps);
}

/* Logits of rows [i0, i0+n) of lx, computed into lout, to their outputs. */
static int logits_out(struct fwd *f, const struct out_row *outs, int i0, int n)
{
	int V = f->m->cfg.vocab;
	const float *src = f->lout;   /* host memory: read in place */
	if (!f->be->host_mem) {
		int rc = f->be->ops->download(f->be, f->lout_host, f->lout,
					      (size_t)n * V * sizeof(float));
		if (rc)
			return rc;
		src = f->lout_host;
	}
	for (int i = 0; i < n; i++)
		memcpy(outs[i0 + i].dst, src + (size_t)i * V, (size_t)V * sizeof(float));
	return 0;
}

/*
 * Run T rows already staged in f->tok/pos/rows; write logits for out rows.
 * A decode batch (each row its own sequence's only new token, all wanting
 * logits: `graph_key` > 0) is recorded once per size and replayed after.
 */
static int run_rows(struct fwd *f, const struct kt_kv *kv, int T,
		    const struct out_row *outs, int n_out, int graph_key)
{
	const struct backend_ops *op = f->be->ops;
	struct backend *be = f->be;
	const struct kt_weight *cls = &f->dm.cls;
	int D = f->m->cfg.dim;

	if (op->batch_begin && op->batch_begin(be, kv, f->tok, f->pos, f->rows, T) != 0)
		return -EIO;
	if (graph_key > 0 && op->graph_replay) {
		int ran = op->graph_replay(be, f, graph_key);
		if (!ran) {
			op->graph_record_begin(be, f, graph_key);
			run_layers(f, kv, T, outs, n_out);
			op->matmul(be, f->lout, f->lx, cls, n_out);
			ran = op->graph_record_end(be, f, graph_key) == 0;
		}
		if (ran)
			return be->failed ? -EIO : logits_out(f, outs, 0, n_out);
	}
	run_layers(f, kv, T, outs, n_out);
	for (int i0 = 0; i0 < n_out; i0 += f->lrows) {
		int n = n_out - i0 < f->lrows ? n_out - i0 : f->lrows;
		op->matmul(be, f->lout, f->lx + (size_t)i0 * D, cls, n);
		int rc = logits_out(f, outs, i0, n);
		if (rc)
			return rc;
	}
	return be->failed ? -EIO : 0;
}

int fwd_run(struct fwd *f, const struct kt_kv *kv, const struct fwd_seq *seqs, int n_seqs)
{
	const struct model_config *c = &f->m->cfg;
	int total = 0, decode = n_seqs > 0;
	for (int s = 0; s < n_seqs; s++) {
		const struct fwd_seq *q = &seqs[s];
		if (q->n_tokens <= 0 || q->pos < 0 || q->pos + q->n_tokens > c->max_ctx)
			return -EINVAL;
		for (int i = 0; i < q->n_tokens; i++)
			if (q->tokens[i] < 0 || q->tokens[i] >= c->vocab)
				return -EINVAL;
		total += q->n_tokens;
		decode &= q->n_tokens == 1 && q->logits && !q->all_logits;
	}
	if (f->be->failed)
		return -EIO;
	/* a whole decode batch in one call: recorded / replayed by its size */
	int graph_key = decode && total <= f->lrows && total <= f->max_tokens ? total : 0;
	struct out_row *outs = f->outs;
	int T = 0, n_out = 0;
	for (int s = 0; s < n_seqs; s++) {
		const struct fwd_seq *q = &seqs[s];
		for (int i = 0; i < q->n_tokens; i++) {
			f->tok[T] = q->tokens[i];
			f->pos[T] = q->pos + i;
			f->rows[T].block_table = q->block_table;
			f->rows[T].pos = q->pos + i;
			int last = i == q->n_tokens - 1;
			if (q->logits && (q->all_logits || last)) {
				outs[n_out].dst = q->logits + (q->all_logits ? (size_t)i * c->vocab : 0);
				outs[n_out].row = T;
				n_out++;
			}
			if (++T == f->max_tokens) {
				int rc = run_rows(f, kv, T, outs, n_out, graph_key);
				if (rc)
					return rc;
				T = n_out = 0;
			}
		}
	}
	if (T > 0)
		return run_rows(f, kv, T, outs, n_out, graph_key);
	return 0;
}

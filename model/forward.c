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
 * Then only rows that need logits: rmsnorm * final_norm, classifier.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"

/* classifier rows computed per matmul call */
#define LOGIT_ROWS 16

/* Where a row's logits go: sequence output and row within it. */
struct out_row {
	float *dst;
	int row;   /* index in the batch */
};

struct fwd {
	const struct model *m;
	struct backend *be;
	int max_tokens;
	float *x, *xb, *q, *k, *v, *att, *hb, *hb2;
	float *lx, *lout;            /* logit rows: (max_tokens, D), (lrows, vocab) */
	int lrows;
	int32_t *tok;
	int *pos;
	struct out_row *outs;
	struct kt_attn_row *rows;
};

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
	f->x = malloc(T * c->dim * sizeof(float));
	f->xb = malloc(T * ((size_t)c->dim > qd ? (size_t)c->dim : qd) * sizeof(float));
	f->q = malloc(T * qd * sizeof(float));
	f->k = malloc(T * kv * sizeof(float));
	f->v = malloc(T * kv * sizeof(float));
	f->att = malloc(T * qd * sizeof(float));
	f->hb = malloc(T * c->ffn_dim * sizeof(float));
	f->hb2 = malloc(T * c->ffn_dim * sizeof(float));
	f->lx = malloc(T * c->dim * sizeof(float));
	f->lrows = (int)(T < LOGIT_ROWS ? T : LOGIT_ROWS);
	f->lout = malloc((size_t)f->lrows * c->vocab * sizeof(float));
	f->tok = malloc(T * sizeof(int32_t));
	f->pos = malloc(T * sizeof(int));
	f->rows = malloc(T * sizeof(*f->rows));
	f->outs = malloc(T * sizeof(*f->outs));
	if (!f->outs || be->ops->reserve(be, c->max_ctx, (int)T) != 0 || !f->x || !f->xb || !f->q || !f->k || !f->v || !f->att || !f->hb || !f->hb2 ||
	    !f->lx || !f->lout || !f->tok || !f->pos || !f->rows) {
		fwd_free(f);
		return NULL;
	}
	return f;
}

void fwd_free(struct fwd *f)
{
	if (!f)
		return;
	free(f->x);
	free(f->xb);
	free(f->q);
	free(f->k);
	free(f->v);
	free(f->att);
	free(f->hb);
	free(f->hb2);
	free(f->lx);
	free(f->lout);
	free(f->tok);
	free(f->pos);
	free(f->rows);
	free(f->outs);
	free(f);
}

/* Run T rows already staged in f->tok/pos/rows; write logits for out rows. */
static void run_rows(struct fwd *f, const struct kt_kv *kv, int T,
		     const struct out_row *outs, int n_out)
{
	const struct model *m = f->m;
	const struct model_config *c = &m->cfg;
	const struct backend_ops *op = f->be->ops;
	struct backend *be = f->be;
	int D = c->dim, hd = c->head_dim;

	op->embed(be, f->x, &m->embed, f->tok, T);
	for (int l = 0; l < c->n_layers; l++) {
		const struct model_layer *L = &m->layers[l];
		/* attention block */
		op->rmsnorm(be, f->xb, f->x, L->att_norm, D, T, c->rms_eps);
		op->matmul(be, f->q, f->xb, &L->wq, T);
		op->matmul(be, f->k, f->xb, &L->wk, T);
		op->matmul(be, f->v, f->xb, &L->wv, T);
		op->rope(be, f->q, f->k, f->pos, T, c->n_heads, c->n_kv_heads, hd,
			 m->inv_freq, c->rope_layout);
		op->kv_store(be, kv, l, f->k, f->v, f->rows, T);
		op->attention(be, f->att, f->q, kv, l, f->rows, T, c->n_heads, c->n_kv_heads, hd);
		op->matmul(be, f->xb, f->att, &L->wo, T);
		op->add(be, f->x, f->xb, (size_t)T * D);
		/* feed-forward block */
		op->rmsnorm(be, f->xb, f->x, L->ffn_norm, D, T, c->rms_eps);
		op->matmul(be, f->hb, f->xb, &L->w1, T);
		op->matmul(be, f->hb2, f->xb, &L->w3, T);
		op->silu_mul(be, f->hb, f->hb2, (size_t)T * c->ffn_dim);
		op->matmul(be, f->xb, f->hb, &L->w2, T);
		op->add(be, f->x, f->xb, (size_t)T * D);
	}
	if (n_out == 0)
		return;
	for (int i = 0; i < n_out; i++)
		memcpy(f->lx + (size_t)i * D, f->x + (size_t)outs[i].row * D, (size_t)D * sizeof(float));
	op->rmsnorm(be, f->lx, f->lx, m->final_norm, D, n_out, c->rms_eps);
	for (int i0 = 0; i0 < n_out; i0 += f->lrows) {
		int n = n_out - i0 < f->lrows ? n_out - i0 : f->lrows;
		op->matmul(be, f->lout, f->lx + (size_t)i0 * D, &m->cls, n);
		for (int i = 0; i < n; i++)
			memcpy(outs[i0 + i].dst, f->lout + (size_t)i * c->vocab,
			       (size_t)c->vocab * sizeof(float));
	}
}

int fwd_run(struct fwd *f, const struct kt_kv *kv, const struct fwd_seq *seqs, int n_seqs)
{
	const struct model_config *c = &f->m->cfg;
	for (int s = 0; s < n_seqs; s++) {
		const struct fwd_seq *q = &seqs[s];
		if (q->n_tokens <= 0 || q->pos < 0 || q->pos + q->n_tokens > c->max_ctx)
			return -EINVAL;
		for (int i = 0; i < q->n_tokens; i++)
			if (q->tokens[i] < 0 || q->tokens[i] >= c->vocab)
				return -EINVAL;
	}
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
				run_rows(f, kv, T, outs, n_out);
				T = n_out = 0;
			}
		}
	}
	if (T > 0)
		run_rows(f, kv, T, outs, n_out);
	return 0;
}

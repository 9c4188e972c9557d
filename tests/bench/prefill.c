/*
 * tests/bench/prefill.c — the logits of every position of one prefill
 * (fwd_seq.all_logits) and their log-softmax in double.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/bench/prefill.h"

int prefill_init(struct prefill *p, const struct model *m, int threads, int max_tokens)
{
	const struct model_config *c = &m->cfg;
	memset(p, 0, sizeof(*p));
	p->max_tokens = max_tokens;
	p->be = backend_cpu_new(threads);
	p->pool = kvpool_new((max_tokens + 15) / 16, 16, c->n_layers, model_kv_dim(c));
	p->fw = p->be ? fwd_new(m, p->be, max_tokens) : NULL;
	p->logits = malloc((size_t)max_tokens * c->vocab * sizeof(float));
	if (!p->be || !p->pool || !p->fw || !p->logits ||
	    kvseq_prepare(p->pool, &p->seq, max_tokens, 0))
		return -ENOMEM;
	return 0;
}

int prefill_run(struct prefill *p, const int32_t *toks, int n)
{
	struct fwd_seq s = { toks, n, 0, p->seq.blocks, p->logits, 1 };
	return fwd_run(p->fw, &p->pool->kv, &s, 1);
}

void prefill_done(struct prefill *p)
{
	if (p->pool)
		kvseq_release(p->pool, &p->seq);
	free(p->logits);
	fwd_free(p->fw);
	kvpool_free(p->pool);
	backend_free(p->be);
	memset(p, 0, sizeof(*p));
}

/* The largest logit is subtracted in fp32 and the sum of exponentials
 * taken in double, in index order: --perplexity's figures as they were
 * before this helper. */
int log_softmax(const float *l, int n, double *lp)
{
	int top = 0;
	for (int i = 1; i < n; i++)
		if (l[i] > l[top])
			top = i;
	float mx = l[top];
	double z = 0;
	for (int i = 0; i < n; i++)
		z += exp((double)l[i] - mx);
	double lz = log(z);
	for (int i = 0; i < n; i++)
		lp[i] = (double)l[i] - mx - lz;
	return top;
}

/*
 * tests/bench/prefill.h — the logits of every position of one prefill, and
 * their log-softmax: what llamad-bench's --perplexity, --kl-ref and
 * --kl-write run (tests/bench/prefill.c).
 */
#ifndef LLAMAD_TESTS_BENCH_PREFILL_H
#define LLAMAD_TESTS_BENCH_PREFILL_H

#include "model/forward.h"
#include "session/kvpool.h"

/* A prefill from an empty sequence, K/V in f32, on the CPU backend. */
struct prefill {
	struct backend *be;
	struct kvpool *pool;
	struct kvseq seq;
	struct fwd *fw;
	float *logits;          /* (max_tokens, vocab): prefill_run's rows */
	int max_tokens;
};

/* Set p up for prefills of up to max_tokens tokens of m (which must
 * outlive it) on threads CPU threads (0: all). 0, or -ENOMEM (p is then
 * ready for prefill_done). */
int prefill_init(struct prefill *p, const struct model *m, int threads, int max_tokens);
/* Run toks[0..n), n <= max_tokens, from position 0: p->logits holds their
 * n rows. 0, or fwd_run's -errno. */
int prefill_run(struct prefill *p, const int32_t *toks, int n);
/* Release what prefill_init took; accepts a zeroed or failed p. */
void prefill_done(struct prefill *p);

/* The log-softmax of the n logits l, in double, into lp; returns the
 * index of the largest logit (the first of equals). */
int log_softmax(const float *l, int n, double *lp);

#endif

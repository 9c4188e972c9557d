/*
 * tests/bench/kv_quality.c — llamad-kvq: what storing K/V in f16 or q8_0
 * costs in accuracy, against f32 K/V, on one model (CPU backend).
 *
 *   llamad-kvq --model PATH [--tokenizer PATH] [--threads N] [--windows N]
 *              [--window N] [--greedy N] [--seed N]
 *
 * The text: --windows windows of --window tokens (default 4 x 512), each
 * sampled from the model itself with f32 K/V (temperature 1, no
 * truncation, a seeded generator; window w starts with BOS and token
 * w+some letter so the windows differ). Then, per K/V type, each window is
 * run through the model in one prefill with every position's logits, and
 * compared position by position with the f32 run of the same window:
 *   kl        mean KL(p_f32 || p_type) of the next-token distributions (nats)
 *   top1      share of positions whose most likely token is the same
 *   ppl       perplexity of the window's actual next tokens, and its change
 *             from f32 in percent
 * and, from the first 16 tokens of each window, --greedy tokens (256) are
 * generated greedily one at a time (decode) with each type:
 *   greedy    share of those tokens equal to f32's at the same step, and
 *             the first step where they part (-1: never).
 * Prints one line per type: kvq: type=... kl=... top1=... ppl=... d_ppl_pct=
 * greedy=... first_diff=... (windows summed; first_diff the smallest).
 */
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"
#include "session/kvpool.h"

struct run {
	const struct model *m;
	struct backend *be;
	struct fwd *f;
	int ctx;
};

static uint64_t rng_next(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* Index of the largest of n values (the first of equals). */
static int argmax(const float *l, int n)
{
	int b = 0;
	for (int i = 1; i < n; i++)
		b = l[i] > l[b] ? i : b;
	return b;
}

/* log-softmax of l (n values) into out (double). */
static void log_softmax(const float *l, int n, double *out)
{
	double mx = l[argmax(l, n)], z = 0;
	for (int i = 0; i < n; i++)
		z += exp((double)l[i] - mx);
	double lz = mx + log(z);
	for (int i = 0; i < n; i++)
		out[i] = (double)l[i] - lz;
}

/* Decode tokens one at a time from the prompt ids[0..n0) up to n tokens in
 * ids, with K/V of type dt: sampled at temperature 1 from rng when rng is
 * set, else greedy. Returns 0 or -1. */
static int decode(struct run *r, enum kt_dtype dt, int32_t *ids, int n0, int n, uint64_t *rng)
{
	const struct model_config *c = &r->m->cfg;
	struct kvpool *pool = kvpool_new_typed(NULL, dt, c->head_dim, (n + 15) / 16, 16,
					       c->n_layers, model_kv_dim(c));
	float *logits = malloc((size_t)c->vocab * sizeof(float));
	double *lp = malloc((size_t)c->vocab * sizeof(double));
	struct kvseq seq = { 0 };
	int rc = -1;
	if (!pool || !logits || !lp || kvseq_prepare(pool, &seq, n, 0))
		goto out;
	struct fwd_seq s = { ids, n0, 0, seq.blocks, logits, 0 };
	if (fwd_run(r->f, &pool->kv, &s, 1))
		goto out;
	for (int p = n0; p < n; p++) {
		int next;
		if (rng) {
			log_softmax(logits, c->vocab, lp);
			double u = (double)(rng_next(rng) >> 11) / 9007199254740992.0, acc = 0;
			next = c->vocab - 1;
			for (int i = 0; i < c->vocab; i++)
				if ((acc += exp(lp[i])) > u) {
					next = i;
					break;
				}
		} else {
			next = argmax(logits, c->vocab);
		}
		ids[p] = next;
		if (p + 1 == n)
			break;
		struct fwd_seq d = { ids + p, 1, p, seq.blocks, logits, 0 };
		if (fwd_run(r->f, &pool->kv, &d, 1))
			goto out;
	}
	rc = 0;
out:
	kvseq_release(pool, &seq);
	kvpool_free(pool);
	free(logits);
	free(lp);
	return rc;
}

/* Every position's logits (n x vocab) of ids[0..n) in one prefill with K/V
 * of type dt. */
static float *prefill_logits(struct run *r, enum kt_dtype dt, const int32_t *ids, int n)
{
	const struct model_config *c = &r->m->cfg;
	struct kvpool *pool = kvpool_new_typed(NULL, dt, c->head_dim, (n + 15) / 16, 16,
					       c->n_layers, model_kv_dim(c));
	float *logits = malloc((size_t)n * c->vocab * sizeof(float));
	struct kvseq seq = { 0 };
	if (!pool || !logits || kvseq_prepare(pool, &seq, n, 0)) {
		free(logits);
		logits = NULL;
	} else {
		struct fwd_seq s = { ids, n, 0, seq.blocks, logits, 1 };
		if (fwd_run(r->f, &pool->kv, &s, 1)) {
			free(logits);
			logits = NULL;
		}
	}
	kvseq_release(pool, &seq);
	kvpool_free(pool);
	return logits;
}

int main(int argc, char **argv)
{
	const char *model_path = NULL, *tok_path = NULL;
	int threads = 0, n_win = 4, win = 512, n_greedy = 256;
	uint64_t seed = 20261203;
	static const struct option opts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "tokenizer", required_argument, NULL, 'k' },
		{ "threads", required_argument, NULL, 't' },
		{ "windows", required_argument, NULL, 'w' },
		{ "window", required_argument, NULL, 'W' },
		{ "greedy", required_argument, NULL, 'g' },
		{ "seed", required_argument, NULL, 's' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int ch;
	while ((ch = getopt_long(argc, argv, "m:t:h", opts, NULL)) != -1) {
		switch (ch) {
		case 'm': model_path = optarg; break;
		case 'k': tok_path = optarg; break;
		case 't': threads = atoi(optarg); break;
		case 'w': n_win = atoi(optarg); break;
		case 'W': win = atoi(optarg); break;
		case 'g': n_greedy = atoi(optarg); break;
		case 's': seed = strtoull(optarg, NULL, 0); break;
		case 'h':
			printf("usage: llamad-kvq --model PATH [--tokenizer PATH] [--threads N]\n"
			       "       [--windows N] [--window TOKENS] [--greedy TOKENS] [--seed N]\n");
			return 0;
		default:
			return 2;
		}
	}
	if (!model_path || n_win < 1 || win < 32 || n_greedy < 1 || !seed) {
		fprintf(stderr, "llamad-kvq: --model is required; --windows >= 1, --window >= 32,"
			" --greedy >= 1, --seed not 0\n");
		return 2;
	}
	char *cause = NULL;
	struct model *m = model_load(model_path, tok_path, &cause);
	if (!m) {
		fprintf(stderr, "llamad-kvq: %s\n", cause);
		free(cause);
		return 1;
	}
	const struct model_config *c = &m->cfg;
	int gl = 16 + n_greedy;
	int ctx = win > gl ? win : gl;
	if (ctx > c->max_ctx) {
		fprintf(stderr, "llamad-kvq: %d tokens do not fit the %d-token context\n", ctx,
			c->max_ctx);
		return 2;
	}
	struct run r = { m, backend_cpu_new(threads), NULL, ctx };

	r.f = r.be ? fwd_new(m, r.be, ctx) : NULL;
	int V = c->vocab;
	int32_t *text = malloc((size_t)n_win * win * sizeof(int32_t));
	int32_t *g32 = malloc((size_t)n_win * gl * sizeof(int32_t)), *gt = malloc((size_t)gl * 4);
	double *l32 = malloc((size_t)V * sizeof(double)), *lt = malloc((size_t)V * sizeof(double));
	float **ref = calloc((size_t)n_win, sizeof(float *));
	if (!r.f || !text || !g32 || !gt || !l32 || !lt || !ref) {
		fprintf(stderr, "llamad-kvq: out of memory\n");
		return 1;
	}
	uint64_t rng = seed;
	for (int w = 0; w < n_win; w++) {
		int32_t *t = text + (size_t)w * win;
		t[0] = c->bos;
		if (decode(&r, KT_F32, t, 1, win, &rng)) {
			fprintf(stderr, "llamad-kvq: the f32 run failed\n");
			return 1;
		}
		ref[w] = prefill_logits(&r, KT_F32, t, win);
		memcpy(g32 + (size_t)w * gl, t, 16 * sizeof(int32_t));
		if (!ref[w] || decode(&r, KT_F32, g32 + (size_t)w * gl, 16, gl, NULL)) {
			fprintf(stderr, "llamad-kvq: the f32 run failed\n");
			return 1;
		}
	}
	printf("kvq: model=%s windows=%d window=%d positions=%d greedy=%d seed=%llu\n", m->path,
	       n_win, win, n_win * (win - 1), n_greedy, (unsigned long long)seed);
	static const enum kt_dtype types[] = { KT_F32, KT_F16, KT_Q8_0 };
	double ppl32 = 0;
	for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
		enum kt_dtype dt = types[ti];
		if (!kt_kv_dtype_ok(dt, c->head_dim))
			continue;
		double kl = 0, nll = 0;
		long top1 = 0, npos = 0, gsame = 0;
		int first = -1;
		for (int w = 0; w < n_win; w++) {
			const int32_t *t = text + (size_t)w * win;
			float *lg = prefill_logits(&r, dt, t, win);
			if (!lg) {
				fprintf(stderr, "llamad-kvq: the %s run failed\n", kt_dtype_name(dt));
				return 1;
			}
			for (int p = 0; p + 1 < win; p++, npos++) {
				const float *a = ref[w] + (size_t)p * V, *b = lg + (size_t)p * V;
				log_softmax(a, V, l32);
				log_softmax(b, V, lt);
				for (int i = 0; i < V; i++)
					kl += exp(l32[i]) * (l32[i] - lt[i]);
				top1 += argmax(a, V) == argmax(b, V);
				nll -= lt[t[p + 1]];
			}
			free(lg);
			memcpy(gt, t, 16 * sizeof(int32_t));
			if (decode(&r, dt, gt, 16, gl, NULL)) {
				fprintf(stderr, "llamad-kvq: the %s run failed\n", kt_dtype_name(dt));
				return 1;
			}
			const int32_t *g = g32 + (size_t)w * gl;
			for (int i = 16; i < gl; i++) {
				gsame += gt[i] == g[i];
				if (gt[i] != g[i] && (first < 0 || i - 16 < first))
					first = i - 16;
			}
		}
		double ppl = exp(nll / (double)npos);
		if (dt == KT_F32)
			ppl32 = ppl;
		printf("kvq: type=%s kl=%.3e top1=%.4f ppl=%.5f d_ppl_pct=%+.4f greedy=%.4f "
		       "first_diff=%d\n", kt_dtype_name(dt), kl / (double)npos,
		       (double)top1 / (double)npos, ppl, (ppl / ppl32 - 1) * 100,
		       (double)gsame / ((double)n_win * n_greedy), first);
	}
	for (int w = 0; w < n_win; w++)
		free(ref[w]);
	free(ref);
	free(text);
	free(g32);
	free(gt);
	free(l32);
	free(lt);
	fwd_free(r.f);
	backend_free(r.be);
	model_free(m);
	return 0;
}

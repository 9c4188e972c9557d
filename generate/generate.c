/*
 * generate/generate.c — see generate.h.
 */
#include <errno.h>

#include "generate/generate.h"

int gen_init(struct gen *g, const struct model *m, const struct sampler_params *sp,
	     const char *const *stops, int n_stops, int max_tokens, int at_start,
	     stop_emit_fn emit, void *ctx)
{
	g->m = m;
	g->generated = 0;
	g->max_tokens = max_tokens;
	g->emit = emit;
	g->emit_ctx = ctx;
	if (sampler_init(&g->smp, sp, m->cfg.vocab) != 0)
		return -ENOMEM;
	if (stopper_init(&g->stop, stops, n_stops) != 0) {
		sampler_done(&g->smp);
		return -ENOMEM;
	}
	detok_init(&g->dt, m->tok, at_start);
	return 0;
}

void gen_done(struct gen *g)
{
	sampler_done(&g->smp);
	stopper_done(&g->stop);
}

int32_t gen_sample(struct gen *g, float *logits, const int32_t *history, int n_history)
{
	return sampler_sample(&g->smp, logits, history, n_history);
}

int gen_is_end(const struct gen *g, int32_t tok)
{
	return tok == g->m->cfg.eos || tok_is_end(g->m->tok, tok);
}

int gen_accept(struct gen *g, int32_t tok)
{
	g->generated++;
	if (gen_is_end(g, tok))
		return GEN_EOS;
	char buf[128];
	int k = detok_feed(&g->dt, tok, buf, sizeof(buf));
	if (k > 0 && stopper_push(&g->stop, buf, (size_t)k, g->emit, g->emit_ctx) == 1)
		return GEN_STOP_STRING;
	return g->generated >= g->max_tokens ? GEN_MAX_TOKENS : GEN_GO;
}

void gen_finish(struct gen *g, int why)
{
	char buf[64];
	int k = detok_flush(&g->dt, buf, sizeof(buf));
	if (k > 0)
		stopper_push(&g->stop, buf, (size_t)k, g->emit, g->emit_ctx);
	if (why != GEN_STOP_STRING)
		stopper_flush(&g->stop, g->emit, g->emit_ctx);
}

const char *gen_stop_string(const struct gen *g)
{
	return g->stop.hit >= 0 ? g->stop.stops[g->stop.hit] : NULL;
}

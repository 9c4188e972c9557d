/*
 * generate/generate.h — the per-token generation loop, once for every caller
 * (the daemon's jobs and `llamad --prompt`): sample from the logits, count
 * the token, stream its text through the detokenizer and the stop strings,
 * and say when and why the generation ends.
 *
 * The caller owns the forward pass and the history: per token it calls
 * gen_sample() on the logits, appends the token to its history (or not,
 * see gen_is_end), then gen_accept(); at the end gen_finish() releases the
 * text held back. Text reaches the emit callback as it becomes final.
 */
#ifndef LLAMAD_GEN_GENERATE_H
#define LLAMAD_GEN_GENERATE_H

#include <stdint.h>

#include "generate/sampler.h"
#include "model/model.h"
#include "text/stop.h"
#include "text/tokenizer.h"

/* Why a generation ended (GEN_GO: it goes on). */
enum gen_end {
	GEN_GO = 0,
	GEN_EOS,           /* the model ended its answer */
	GEN_MAX_TOKENS,    /* max_tokens reached */
	GEN_STOP_STRING,   /* a stop string appeared (not in the text) */
	GEN_CONTEXT_FULL,  /* no room for the next token */
	GEN_CANCELLED,     /* the caller stopped it */
};

struct gen {
	const struct model *m;
	struct sampler smp;
	struct detok dt;
	struct stopper stop;
	int generated;     /* tokens accepted, the end token included */
	int max_tokens;
	stop_emit_fn emit;
	void *emit_ctx;
};

/*
 * Start a generation with model m (not owned): sampler settings sp, n
 * stop strings (copied), at most max_tokens tokens; text goes to
 * emit(ctx, ...). at_start: the answer opens a text (drop the first
 * piece's leading space). 0 or -ENOMEM (nothing to gen_done then).
 */
int gen_init(struct gen *g, const struct model *m, const struct sampler_params *sp,
	     const char *const *stops, int n_stops, int max_tokens, int at_start,
	     stop_emit_fn emit, void *ctx);
void gen_done(struct gen *g);

/* The next token from logits (vocab floats, modified: penalties and
 * temperature) after history[0, n_history). */
int32_t gen_sample(struct gen *g, float *logits, const int32_t *history, int n_history);
/* 1 if tok ends the answer: the model's EOS or any end-of-turn id of its
 * tokenizer (tok_is_end: <|eot_id|>, <|eom_id|>, <|end_of_text|>, ...). */
int gen_is_end(const struct gen *g, int32_t tok);
/*
 * Take tok as generated: count it and, unless it ends the answer, stream
 * its text. Returns GEN_EOS for the end token, GEN_STOP_STRING once a stop
 * string appeared, GEN_MAX_TOKENS when this was the last token allowed,
 * else GEN_GO.
 */
int gen_accept(struct gen *g, int32_t tok);
/* The generation ended for `why` (enum gen_end): emit the text held back
 * (all but a matched stop string). */
void gen_finish(struct gen *g, int why);
/* The stop string that ended it (GEN_STOP_STRING), else NULL. */
const char *gen_stop_string(const struct gen *g);

#endif

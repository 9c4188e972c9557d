/*
 * generate/sampler.h — next-token selection from logits.
 *
 * Order of operations: repetition / presence / frequency penalties over the
 * last `penalty_last_n` tokens; then, if temperature <= 0, argmax (greedy,
 * lowest id wins ties); else logits / temperature, top-k, softmax, top-p
 * (smallest set whose mass >= top_p), min-p (drop p < min_p * p_max),
 * renormalise, draw with the sampler's own PRNG. Same seed + same logits
 * sequence = same tokens.
 */
#ifndef LLAMAD_GEN_SAMPLER_H
#define LLAMAD_GEN_SAMPLER_H

#include <stdint.h>

struct sampler_params {
	float temperature;       /* <= 0: greedy */
	int top_k;               /* <= 0 or >= vocab: off */
	float top_p;             /* >= 1: off */
	float min_p;             /* <= 0: off */
	float repeat_penalty;    /* 1: off; > 1 discourages repeats */
	int penalty_last_n;      /* window for all penalties; 0: off, -1: whole history */
	float presence_penalty;  /* subtracted once if the token occurred */
	float frequency_penalty; /* subtracted per occurrence */
	uint64_t seed;
};

/* Defaults: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, penalties
 * off (repeat 1.0, last_n 64), seed 0 (the caller picks one). */
void sampler_params_default(struct sampler_params *p);
/* Check ranges; returns NULL if fine, else a static reason. */
const char *sampler_params_check(const struct sampler_params *p);

struct sampler_cand {
	float v;
	int32_t id;
};

struct sampler {
	struct sampler_params p;
	uint64_t rng;
	int vocab;
	struct sampler_cand *cand;   /* (vocab) scratch */
	int32_t *count;              /* (vocab) occurrences in the window */
};

/* Returns 0 or -ENOMEM. */
int sampler_init(struct sampler *s, const struct sampler_params *p, int vocab);
void sampler_done(struct sampler *s);
/* Pick the next token. logits (vocab) is modified (penalties applied).
 * history: tokens so far (prompt and generated), for the penalties. */
int32_t sampler_sample(struct sampler *s, float *logits, const int32_t *history, int n_history);
/* Uniform float in [0, 1) from the sampler's PRNG (exposed for tests). */
float sampler_uniform(struct sampler *s);

#endif

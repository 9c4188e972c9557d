/*
 * tests/bench/shift.h — llamad-bench --shift (tests/bench/shift.c): what a
 * context shift costs and how exact it is, re-prefilling the kept tokens
 * against rotating their cached K.
 */
#ifndef LLAMAD_TESTS_BENCH_SHIFT_H
#define LLAMAD_TESTS_BENCH_SHIFT_H

#include "model/model.h"

struct shift_opts {
	int threads;     /* CPU backend threads (0: all) */
	int window;      /* the context: tokens a sequence may hold (0: the model's) */
	int keep;        /* tokens at the front no shift removes (BOS, a system prompt) */
	int shifts;      /* shifts the accuracy run goes through (0: timing only) */
	int reps;        /* timing: best of */
	unsigned seed;   /* sampling of the accuracy run's text */
	enum kt_dtype kv_type;  /* K/V element type of the timing */
};

/*
 * Measure on m (owned by the caller) and print key=value lines on stdout:
 * the time to re-prefill the tokens a shift keeps against the time to
 * rotate and move their K/V (host memory, one thread), beside the decode
 * time they are spread over; then, with opts->shifts, the logits of a
 * sequence generated through that many shifts by six caches (re-prefill
 * and re-rotation, K/V in f32, f16 and q8_0) against re-prefill in f32,
 * which equals a fresh prefill of what is kept. Returns 0, or 1 with
 * a message on stderr.
 */
int shift_bench(struct model *m, const struct shift_opts *opts);

#endif

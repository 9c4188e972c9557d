/*
 * tests/bench/optime.h — per-op timing of a backend for llamad-bench
 * --op-times (tests/bench/optime.c).
 */
#ifndef LLAMAD_BENCH_OPTIME_H
#define LLAMAD_BENCH_OPTIME_H

#include <stdio.h>

#include "kernels/backend.h"

/* Route be's ops through timed wrappers (counts reset), or back. */
void optime_wrap(struct backend *be);
void optime_unwrap(struct backend *be);
void optime_reset(void);
/* The table: each op's calls, microseconds a token and share of total_s
 * (the wall time of the n_tok tokens), then the products by weight shape
 * and type with the bandwidth they reached. */
void optime_print(FILE *f, double total_s, int n_tok);

#endif

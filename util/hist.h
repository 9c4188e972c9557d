/*
 * util/hist.h — histograms over fixed bucket bounds, as Status carries
 * them (llamad-protocol(7)): le[] the bounds in seconds, ascending;
 * counts[i] the observations in (le[i-1], le[i]] (the first bucket from
 * minus infinity), counts[n_le] those above the last bound. Counts are per
 * bucket, not cumulative. The daemon observes (hist_observe), llamactl
 * reads quantiles back (hist_quantile).
 */
#ifndef LLAMAD_UTIL_HIST_H
#define LLAMAD_UTIL_HIST_H

#include <stddef.h>
#include <stdint.h>

#define HIST_MAX_BOUNDS 16

struct hist {
	const double *le;        /* n_le bounds, ascending (not owned) */
	size_t n_le;             /* at most HIST_MAX_BOUNDS */
	uint64_t counts[HIST_MAX_BOUNDS + 1];
	double sum;
	uint64_t count;
};

/* An empty histogram over the n_le bounds le (kept, not copied; n_le is
 * cut to HIST_MAX_BOUNDS). */
void hist_init(struct hist *h, const double *le, size_t n_le);
/* The bucket of v: the first i with v <= le[i], else n_le. */
size_t hist_bucket(const double *le, size_t n_le, double v);
/* Count one observation of v. */
void hist_observe(struct hist *h, double v);
/*
 * The q-quantile (0 < q <= 1) of per-bucket counts[n_le + 1] over the
 * bounds le, interpolated linearly inside its bucket (the first bucket
 * from 0): a bucket's observations are taken as spread evenly over it.
 * One in the bucket above the last bound is le[n_le - 1] with *above set
 * (the histogram cannot say more). NaN when no observation was counted.
 */
double hist_quantile(const double *le, size_t n_le, const uint64_t *counts, double q,
		     int *above);

#endif

/*
 * util/hist.c — see hist.h.
 */
#include <math.h>
#include <string.h>

#include "util/hist.h"

void hist_init(struct hist *h, const double *le, size_t n_le)
{
	memset(h, 0, sizeof(*h));
	h->le = le;
	h->n_le = n_le < HIST_MAX_BOUNDS ? n_le : HIST_MAX_BOUNDS;
}

size_t hist_bucket(const double *le, size_t n_le, double v)
{
	size_t a = 0, b = n_le;   /* the answer is in [a, b] */
	while (a < b) {
		size_t m = a + (b - a) / 2;
		if (v <= le[m])
			b = m;
		else
			a = m + 1;
	}
	return a;
}

void hist_observe(struct hist *h, double v)
{
	if (isnan(v))
		return;
	h->counts[hist_bucket(h->le, h->n_le, v)]++;
	h->sum += v;
	h->count++;
}

double hist_quantile(const double *le, size_t n_le, const uint64_t *counts, double q,
		     int *above)
{
	uint64_t total = 0;
	*above = 0;
	for (size_t i = 0; i <= n_le; i++)
		total += counts[i];
	if (total == 0 || n_le == 0)
		return NAN;
	if (q > 1)
		q = 1;
	double rank = q * (double)total, before = 0;
	for (size_t i = 0; i < n_le; i++) {
		if (counts[i] > 0 && before + (double)counts[i] >= rank) {
			double lo = i ? le[i - 1] : 0, hi = le[i];
			double f = (rank - before) / (double)counts[i];
			return lo + (hi - lo) * (f > 0 ? f : 0);
		}
		before += (double)counts[i];
	}
	*above = 1;
	return le[n_le - 1];
}

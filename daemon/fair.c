/*
 * daemon/fair.c — see fair.h.
 */
#include "daemon/fair.h"

/* Each observation weighs this much more than the one before it: the
 * line follows the last few hundred steps (a model's load, the machine's
 * other work) without jumping with each one. */
#define FAIR_DECAY 0.99
/* Steps seen before the line is trusted. */
#define FAIR_WARM 8

struct fair_shape fair_shape_of(int dim, int n_layers, int n_heads, int n_kv_heads, int head_dim,
				int ffn_dim, int vocab)
{
	double d = dim, kv = (double)n_kv_heads * head_dim, q = (double)n_heads * head_dim;
	struct fair_shape f;
	/* q, k, v, o and the SwiGLU's three products: a multiply-add each */
	f.row = 2e-6 * n_layers * (d * q + 2 * d * kv + q * d + 3 * d * ffn_dim);
	/* each head's score and its weighted value, per position before */
	f.per_pos = 4e-6 * n_layers * q;
	/* the classifier, and sampling over the vocabulary (a few passes) */
	f.logits = 2e-6 * d * vocab + 20e-6 * vocab;
	return f;
}

void fair_observe(struct fair_cost *c, double x1, double x2, double seconds)
{
	if (x1 <= 0 || seconds <= 0)
		return;
	const double d = FAIR_DECAY;
	c->n = c->n * d + 1;
	c->x1 = c->x1 * d + x1;
	c->x2 = c->x2 * d + x2;
	c->t = c->t * d + seconds;
	c->x11 = c->x11 * d + x1 * x1;
	c->x12 = c->x12 * d + x1 * x2;
	c->x22 = c->x22 * d + x2 * x2;
	c->x1t = c->x1t * d + x1 * seconds;
	c->x2t = c->x2t * d + x2 * seconds;
}

int fair_known(const struct fair_cost *c)
{
	/* the weights of FAIR_WARM observations: 1 + d + d^2 + ... */
	double warm = 0, w = 1;
	for (int i = 0; i < FAIR_WARM; i++, w *= FAIR_DECAY)
		warm += w;
	return c->n >= warm - 1e-9;
}

/* Solve [p q; q r] [u v]' = [e f]': 1 when well conditioned, the answers
 * in *u, *v. */
static int solve2(double p, double q, double r, double e, double f, double *u, double *v)
{
	double det = p * r - q * q;
	if (!(p > 0 && r > 0) || det <= 1e-6 * p * r)
		return 0;
	*u = (e * r - q * f) / det;
	*v = (p * f - q * e) / det;
	return 1;
}

int fair_line(const struct fair_cost *c, double *a, double *k1, double *k2)
{
	*a = 0;
	*k1 = 1e-9;
	*k2 = 0;
	if (c->n <= 0 || c->x1 <= 0)
		return 0;
	double n = c->n, m1 = c->x1 / n, m2 = c->x2 / n, mt = c->t / n;
	double v11 = c->x11 / n - m1 * m1, v12 = c->x12 / n - m1 * m2, v22 = c->x22 / n - m2 * m2;
	double c1 = c->x1t / n - m1 * mt, c2 = c->x2t / n - m2 * mt;
	double u, v;
	/* the plane, when the work varied enough to tell a apart */
	if (v11 > 0.01 * m1 * m1 && solve2(v11, v12, v22, c1, c2, &u, &v) && u > 0 && v >= 0) {
		double i = mt - u * m1 - v * m2;
		if (i >= 0 && i <= 0.9 * mt) {
			*a = i;
			*k1 = u;
			*k2 = v;
			return 1;
		}
	}
	/* through the origin: a = 0 */
	if (solve2(c->x11 / n, c->x12 / n, c->x22 / n, c->x1t / n, c->x2t / n, &u, &v) && u > 0 &&
	    v >= 0) {
		*k1 = u;
		*k2 = v;
		return 0;
	}
	/* one price for all work */
	*k1 = *k2 = mt / (m1 + m2);
	return 0;
}

static double row_cost(const struct fair_job *j, int i)
{
	return j->cost0 + j->dcost * i;
}

int fair_pick(struct fair_user *users, int n_users, struct fair_job *jobs, int n_jobs, double a,
	      int row_cap, unsigned turn)
{
	double cheapest = -1, dearest = 0;
	for (int i = 0; i < n_jobs; i++) {
		jobs[i].take = 0;
		if (jobs[i].want <= 0)
			continue;
		if (cheapest < 0 || jobs[i].cost0 < cheapest)
			cheapest = jobs[i].cost0;
		if (jobs[i].cost0 > dearest)
			dearest = jobs[i].cost0;
	}
	if (cheapest < 0 || n_users <= 0)
		return 0;
	double budget = (FAIR_FACTOR - 1) * a + FAIR_FACTOR * cheapest;
	if (n_users == 1) {
		budget = (FAIR_SOLO_FACTOR - 1) * a + FAIR_SOLO_FACTOR * cheapest;
		if (budget < FAIR_SOLO_S - a)
			budget = FAIR_SOLO_S - a;
	}
	double quantum = budget / n_users, cap = budget + dearest;
	for (int u = 0; u < n_users; u++) {
		users[u].credit += quantum;
		if (users[u].credit > cap)
			users[u].credit = cap;
	}
	/* rounds of a row for each user in turn, while its credit covers its
	 * next one (so that a cap on the rows is shared as the time is) */
	int cur[n_users];
	for (int u = 0; u < n_users; u++)
		cur[u] = 0;
	int given = 0, more = 1;
	while (more && given < row_cap) {
		more = 0;
		for (int k = 0; k < n_users && given < row_cap; k++) {
			int u = (int)((turn + (unsigned)k) % (unsigned)n_users);
			/* the user's job with rows left, from where it was */
			while (cur[u] < n_jobs && (jobs[cur[u]].user != u ||
						    jobs[cur[u]].take >= jobs[cur[u]].want))
				cur[u]++;
			if (cur[u] == n_jobs)
				continue;
			struct fair_job *j = &jobs[cur[u]];
			double cost = row_cost(j, j->take);
			if (users[u].credit < cost)
				continue;
			users[u].credit -= cost;
			j->take++;
			given++;
			more = 1;
		}
	}
	if (given == 0 && row_cap > 0) {
		/* no credit covers a row yet: the richest user's first one */
		int best = 0;
		for (int u = 1; u < n_users; u++)
			if (users[u].credit > users[best].credit)
				best = u;
		for (int i = 0; i < n_jobs; i++)
			if (jobs[i].user == best && jobs[i].want > 0) {
				users[best].credit -= row_cost(&jobs[i], 0);
				jobs[i].take = 1;
				given = 1;
				break;
			}
	}
	return given;
}

/*
 * tests/unit/test_sampler.c — next-token selection (generate/sampler.c).
 *
 * Greedy ties, PRNG reproducibility, the sampled distribution against the
 * softmax (chi-square bound), the truncations (top-k, top-p, min-p), the
 * temperature, the penalties (exact values, window respected), parameter
 * range checks and NaN logits. No model files needed.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "generate/sampler.h"

/* Parameters with every truncation and penalty off, temperature t. */
static struct sampler_params plain(float t, uint64_t seed)
{
	struct sampler_params p;
	sampler_params_default(&p);
	p.temperature = t;
	p.top_k = 0;
	p.top_p = 1.0f;
	p.min_p = 0.0f;
	p.repeat_penalty = 1.0f;
	p.presence_penalty = 0.0f;
	p.frequency_penalty = 0.0f;
	p.seed = seed;
	return p;
}

/* Draw n tokens from fixed logits (copied fresh each draw); counts[V]. */
static void draw(const struct sampler_params *p, const float *logits, int V, int n,
		 int *counts)
{
	struct sampler s;
	float *l = malloc((size_t)V * sizeof(float));
	assert_non_null(l);
	assert_int_equal(sampler_init(&s, p, V), 0);
	memset(counts, 0, (size_t)V * sizeof(int));
	for (int i = 0; i < n; i++) {
		memcpy(l, logits, (size_t)V * sizeof(float));
		int32_t t = sampler_sample(&s, l, NULL, 0);
		assert_true(t >= 0 && t < V);
		counts[t]++;
	}
	sampler_done(&s);
	free(l);
}

/* Chi-square statistic of counts against probabilities prob (sum 1). */
static double chi2(const int *counts, const double *prob, int V, int n)
{
	double x = 0;
	for (int i = 0; i < V; i++) {
		double e = prob[i] * n;
		if (e == 0) {
			assert_int_equal(counts[i], 0);
			continue;
		}
		x += (counts[i] - e) * (counts[i] - e) / e;
	}
	return x;
}

/*
 * Check counts from n draws against prob: every frequency within 0.02 and
 * chi-square below 30. With 3 degrees of freedom P(chi2 > 30) is ~1.4e-6,
 * so a correct sampler fails by bad luck essentially never; the checks are
 * also deterministic (fixed seeds). A wrong sampler (uniform, off-by-one
 * token, cdf bug) scores in the hundreds or thousands.
 */
static void assert_matches(const int *counts, const double *prob, int V, int n)
{
	for (int i = 0; i < V; i++) {
		double f = (double)counts[i] / n;
		if (fabs(f - prob[i]) > 0.02) {
			fprintf(stderr, "token %d: frequency %.4f, probability %.4f\n", i, f, prob[i]);
			fail();
		}
	}
	double x = chi2(counts, prob, V, n);
	if (x > 30.0) {
		fprintf(stderr, "chi-square %.2f > 30\n", x);
		fail();
	}
}

static void test_greedy_argmax(void **state)
{
	(void)state;
	struct sampler_params p = plain(0.0f, 1);
	struct sampler s;
	assert_int_equal(sampler_init(&s, &p, 6), 0);
	float a[6] = { 1, 5, -2, 5, 4.999f, 5 };   /* tie among 1, 3, 5 */
	assert_int_equal(sampler_sample(&s, a, NULL, 0), 1);
	float b[6] = { -3, -1, -2, -1, -7, -10 };  /* all negative, tie 1 and 3 */
	assert_int_equal(sampler_sample(&s, b, NULL, 0), 1);
	float c[6] = { 0, 0, 0, 0, 0, 0 };         /* all equal: lowest id */
	assert_int_equal(sampler_sample(&s, c, NULL, 0), 0);
	float d[6] = { -INFINITY, -INFINITY, 3, 2, 9, -1 };
	assert_int_equal(sampler_sample(&s, d, NULL, 0), 4);
	float e[6] = { 0, 1, 2, 3, 4, 100 };       /* last id */
	assert_int_equal(sampler_sample(&s, e, NULL, 0), 5);
	/* negative temperature is greedy too */
	s.p.temperature = -1.0f;
	float f[6] = { 0, 1, 7, 3, 7, 1 };
	assert_int_equal(sampler_sample(&s, f, NULL, 0), 2);
	sampler_done(&s);
}

/* Same seed + same logits = same sequence; different seeds differ. */
static void test_seed_reproducible(void **state)
{
	(void)state;
	enum { V = 16, N = 200 };
	float logits[V];
	for (int i = 0; i < V; i++)
		logits[i] = 0.3f * (float)(i % 5) - 0.1f * (float)i;
	int32_t seq[3][N];
	uint64_t seeds[3] = { 42, 42, 43 };
	for (int r = 0; r < 3; r++) {
		struct sampler_params p = plain(1.0f, seeds[r]);
		struct sampler s;
		assert_int_equal(sampler_init(&s, &p, V), 0);
		for (int i = 0; i < N; i++) {
			float l[V];
			memcpy(l, logits, sizeof(l));
			seq[r][i] = sampler_sample(&s, l, NULL, 0);
		}
		sampler_done(&s);
	}
	assert_memory_equal(seq[0], seq[1], sizeof(seq[0]));
	int diff = 0;
	for (int i = 0; i < N; i++)
		diff += seq[0][i] != seq[2][i];
	/* independent streams over ~16 tokens agree ~1/10 of the time */
	assert_true(diff > N / 2);

	/* seed 0 is a valid seed and also reproducible */
	struct sampler a, b;
	struct sampler_params p0 = plain(1.0f, 0);
	assert_int_equal(sampler_init(&a, &p0, V), 0);
	assert_int_equal(sampler_init(&b, &p0, V), 0);
	for (int i = 0; i < N; i++)
		assert_true(sampler_uniform(&a) == sampler_uniform(&b));
	sampler_done(&a);
	sampler_done(&b);
}

static void test_uniform_range(void **state)
{
	(void)state;
	struct sampler_params p = plain(1.0f, 7);
	struct sampler s;
	assert_int_equal(sampler_init(&s, &p, 4), 0);
	int bins[10] = { 0 };
	double sum = 0;
	for (int i = 0; i < 100000; i++) {
		float u = sampler_uniform(&s);
		assert_true(u >= 0.0f && u < 1.0f);
		bins[(int)(u * 10)]++;
		sum += u;
	}
	assert_true(fabs(sum / 100000 - 0.5) < 0.01);
	for (int i = 0; i < 10; i++)
		assert_true(bins[i] > 9500 && bins[i] < 10500);
	sampler_done(&s);
}

/* Temperature 1, no truncation: draws follow softmax(logits). */
static void test_distribution(void **state)
{
	(void)state;
	enum { V = 4, N = 20000 };
	const double prob[V] = { 0.1, 0.2, 0.3, 0.4 };
	float logits[V];
	for (int i = 0; i < V; i++)
		logits[i] = (float)log(prob[i]) + 3.0f;  /* softmax is shift-invariant */
	static const uint64_t seeds[] = { 1, 2, 12345, 0xdeadbeefcafef00dull };
	for (size_t k = 0; k < sizeof(seeds) / sizeof(seeds[0]); k++) {
		struct sampler_params p = plain(1.0f, seeds[k]);
		int counts[V];
		draw(&p, logits, V, N, counts);
		assert_matches(counts, prob, V, N);
	}
	/* sanity of the bound: uniform counts are rejected by the same check */
	const double uni[V] = { 0.25, 0.25, 0.25, 0.25 };
	struct sampler_params p = plain(1.0f, 1);
	int counts[V];
	draw(&p, logits, V, N, counts);
	assert_true(chi2(counts, uni, V, N) > 1000);
}

static void test_top_k(void **state)
{
	(void)state;
	enum { V = 8, N = 5000 };
	float logits[V] = { 0.5f, 1.0f, 2.0f, 0.9f, 1.9f, -1.0f, 0.0f, 1.5f };
	struct sampler_params p = plain(1.0f, 3);
	int counts[V];
	p.top_k = 1;
	draw(&p, logits, V, N, counts);
	assert_int_equal(counts[2], N);

	/* top_k 2: only ids 2 and 4, in proportion e^2 : e^1.9 */
	p.top_k = 2;
	draw(&p, logits, V, N, counts);
	assert_int_equal(counts[2] + counts[4], N);
	double p2 = 1.0 / (1.0 + exp(-0.1));
	double prob[V] = { 0 };
	prob[2] = p2;
	prob[4] = 1 - p2;
	assert_matches(counts, prob, V, N);

	/* top_k >= vocab is off: every token shows up */
	p.top_k = V;
	draw(&p, logits, V, 20000, counts);
	for (int i = 0; i < V; i++)
		assert_true(counts[i] > 0);
}

/*
 * top-k over a Llama 3-sized vocabulary takes the k best without sorting
 * everything: the kept set and its order must be the full sort's (value,
 * then the lower id first on a tie). 39 tokens hold the best values, then
 * three tokens tie for the 40th place: only the lowest id of them may be
 * drawn, and the draws follow the softmax of the 40 kept.
 */
static void test_top_k_large_vocab(void **state)
{
	(void)state;
	enum { V = 128256, N = 5000, K = 40 };
	float *logits = malloc((size_t)V * sizeof(float));
	int *counts = malloc((size_t)V * sizeof(int));
	double *prob = calloc((size_t)V, sizeof(double));
	assert_true(logits && counts && prob);
	uint64_t x = 12345;
	for (int i = 0; i < V; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		logits[i] = (float)(x % 64) / 32.0f;      /* [0, 2): many ties */
	}
	int top[K];
	for (int j = 0; j < K - 1; j++) {            /* 39 best, spread over the ids */
		top[j] = 1000 + j * 3001;
		logits[top[j]] = 3.1f + 0.01f * (float)j;
	}
	top[K - 1] = 7;                              /* the 40th place, tied three ways */
	logits[7] = logits[70000] = logits[120000] = 3.0f;
	struct sampler_params p = plain(1.0f, 11);
	p.top_k = K;
	draw(&p, logits, V, N, counts);
	double sum = 0;
	for (int j = 0; j < K; j++)
		sum += exp((double)logits[top[j]]);
	for (int j = 0; j < K; j++)
		prob[top[j]] = exp((double)logits[top[j]]) / sum;
	assert_int_equal(counts[70000], 0);
	assert_int_equal(counts[120000], 0);
	for (int i = 0; i < V; i++)
		if (prob[i] == 0)
			assert_int_equal(counts[i], 0);
	for (int j = 0; j < K; j++) {
		double f = (double)counts[top[j]] / N;
		if (fabs(f - prob[top[j]]) > 0.02) {
			fprintf(stderr, "token %d: frequency %.4f, probability %.4f\n", top[j], f,
				prob[top[j]]);
			fail();
		}
	}
	free(logits);
	free(counts);
	free(prob);
}

static void test_top_p(void **state)
{
	(void)state;
	enum { V = 3, N = 5000 };
	float logits[V] = { logf(0.6f), logf(0.3f), logf(0.1f) };
	struct sampler_params p = plain(1.0f, 5);
	int counts[V];
	p.top_p = 0.5f;   /* 0.6 alone already covers it */
	draw(&p, logits, V, N, counts);
	assert_int_equal(counts[0], N);

	p.top_p = 0.8f;   /* {0.6, 0.3}, renormalised to 2/3, 1/3 */
	draw(&p, logits, V, N, counts);
	assert_int_equal(counts[2], 0);
	const double prob[V] = { 2.0 / 3, 1.0 / 3, 0 };
	assert_matches(counts, prob, V, N);

	p.top_p = 1.0f;   /* off */
	draw(&p, logits, V, N, counts);
	assert_true(counts[2] > 0);
}

static void test_min_p(void **state)
{
	(void)state;
	enum { V = 5, N = 8000 };
	/* probabilities 0.5, 0.25, 0.15, 0.06, 0.04; min_p 0.2 -> limit 0.1 */
	const float pr[V] = { 0.5f, 0.25f, 0.15f, 0.06f, 0.04f };
	float logits[V];
	for (int i = 0; i < V; i++)
		logits[i] = logf(pr[i]);
	struct sampler_params p = plain(1.0f, 9);
	p.min_p = 0.2f;
	int counts[V];
	draw(&p, logits, V, N, counts);
	assert_int_equal(counts[3], 0);
	assert_int_equal(counts[4], 0);
	const double prob[V] = { 0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0, 0 };
	assert_matches(counts, prob, V, N);

	/* min_p 0.55 -> limit 0.275: only the first */
	p.min_p = 0.55f;
	draw(&p, logits, V, N, counts);
	assert_int_equal(counts[0], N);
}

/* Lower temperature sharpens: p_i ~ p_i^(1/T). */
static void test_temperature(void **state)
{
	(void)state;
	enum { V = 2, N = 20000 };
	float logits[V] = { logf(0.6f), logf(0.4f) };
	int counts[V];
	struct sampler_params p = plain(0.5f, 11);
	draw(&p, logits, V, N, counts);
	const double sharp[V] = { 0.36 / 0.52, 0.16 / 0.52 };
	assert_matches(counts, sharp, V, N);
	/* higher temperature flattens */
	p = plain(2.0f, 11);
	draw(&p, logits, V, N, counts);
	double a = sqrt(0.6), b = sqrt(0.4);
	const double flat[V] = { a / (a + b), b / (a + b) };
	assert_matches(counts, flat, V, N);
	/* the logits passed in are not scaled in place (penalties off) */
	float l[V] = { 1.0f, 2.0f };
	struct sampler s;
	assert_int_equal(sampler_init(&s, &p, V), 0);
	sampler_sample(&s, l, NULL, 0);
	assert_true(l[0] == 1.0f && l[1] == 2.0f);
	sampler_done(&s);
}

/* Apply the sampler's penalties (greedy, so nothing else happens) and
 * return the modified logits in l. */
static void penalise(const struct sampler_params *p, float *l, int V,
		     const int32_t *hist, int n)
{
	struct sampler s;
	assert_int_equal(sampler_init(&s, p, V), 0);
	sampler_sample(&s, l, hist, n);
	sampler_done(&s);
}

static void test_repeat_penalty(void **state)
{
	(void)state;
	enum { V = 6 };
	struct sampler_params p = plain(0.0f, 1);
	p.repeat_penalty = 2.0f;
	p.penalty_last_n = 3;
	/* window = last 3 = {1, 2, 2}; 0 and 3 are outside it */
	const int32_t hist[] = { 0, 3, 1, 2, 2 };
	float l[V] = { 4.0f, 6.0f, -1.5f, 3.0f, 5.0f, 0.0f };
	penalise(&p, l, V, hist, 5);
	assert_true(l[0] == 4.0f);    /* outside the window */
	assert_true(l[1] == 3.0f);    /* positive: divided */
	assert_true(l[2] == -3.0f);   /* negative: multiplied, once despite 2 occurrences */
	assert_true(l[3] == 3.0f);    /* outside the window */
	assert_true(l[4] == 5.0f);
	assert_true(l[5] == 0.0f);

	/* whole history (-1) */
	p.penalty_last_n = -1;
	float m[V] = { 4.0f, 6.0f, -1.5f, 3.0f, 5.0f, 0.0f };
	penalise(&p, m, V, hist, 5);
	assert_true(m[0] == 2.0f && m[1] == 3.0f && m[2] == -3.0f && m[3] == 1.5f);
	assert_true(m[4] == 5.0f && m[5] == 0.0f);

	/* window larger than the history: whole history */
	p.penalty_last_n = 100;
	float o[V] = { 4.0f, 6.0f, -1.5f, 3.0f, 5.0f, 0.0f };
	penalise(&p, o, V, hist, 5);
	assert_true(o[0] == 2.0f && o[3] == 1.5f);

	/* window 0: off */
	p.penalty_last_n = 0;
	float q[V] = { 4.0f, 6.0f, -1.5f, 3.0f, 5.0f, 0.0f };
	penalise(&p, q, V, hist, 5);
	assert_true(q[0] == 4.0f && q[1] == 6.0f && q[2] == -1.5f && q[3] == 3.0f);

	/* it changes the greedy choice: 1 (6 -> 3) loses to 4 (5) */
	p.penalty_last_n = 3;
	float r[V] = { 4.0f, 6.0f, -1.5f, 3.0f, 5.0f, 0.0f };
	struct sampler s;
	assert_int_equal(sampler_init(&s, &p, V), 0);
	assert_int_equal(sampler_sample(&s, r, hist, 5), 4);
	/* the occurrence table is reset between calls: same penalty again */
	float t[V] = { 4.0f, 6.0f, -1.5f, 3.0f, 5.0f, 0.0f };
	sampler_sample(&s, t, hist, 5);
	assert_true(t[1] == 3.0f && t[2] == -3.0f);
	/* out-of-range history ids are ignored */
	const int32_t bad[] = { -1, 99, 1 };
	float u[V] = { 4.0f, 6.0f, -1.5f, 3.0f, 5.0f, 0.0f };
	sampler_sample(&s, u, bad, 3);
	assert_true(u[1] == 3.0f && u[0] == 4.0f && u[5] == 0.0f);
	sampler_done(&s);
}

static void test_presence_frequency(void **state)
{
	(void)state;
	enum { V = 5 };
	struct sampler_params p = plain(0.0f, 1);
	p.penalty_last_n = 4;
	p.presence_penalty = 0.5f;
	p.frequency_penalty = 0.25f;
	/* window {1, 1, 1, 3}; 2 is outside it */
	const int32_t hist[] = { 2, 2, 1, 1, 1, 3 };
	float l[V] = { 1.0f, 1.0f, 1.0f, 1.0f, 1.0f };
	penalise(&p, l, V, hist, 6);
	assert_true(l[0] == 1.0f);
	assert_true(l[1] == 1.0f - 3 * 0.25f - 0.5f);   /* -0.25 */
	assert_true(l[2] == 1.0f);
	assert_true(l[3] == 1.0f - 0.25f - 0.5f);       /* 0.25 */
	assert_true(l[4] == 1.0f);

	/* negative penalties encourage */
	p.presence_penalty = -1.0f;
	p.frequency_penalty = 0.0f;
	float m[V] = { 1.0f, 1.0f, 1.0f, 1.0f, 1.0f };
	penalise(&p, m, V, hist, 6);
	assert_true(m[1] == 2.0f && m[3] == 2.0f && m[2] == 1.0f);

	/* combined with the repetition penalty: divide first, then subtract */
	p.repeat_penalty = 2.0f;
	p.presence_penalty = 0.5f;
	p.frequency_penalty = 0.25f;
	float o[V] = { 3.0f, 3.0f, 3.0f, -3.0f, 3.0f };
	penalise(&p, o, V, hist, 6);
	assert_true(o[1] == 1.5f - 0.75f - 0.5f);
	assert_true(o[3] == -6.0f - 0.25f - 0.5f);
	assert_true(o[0] == 3.0f && o[2] == 3.0f);
}

static void test_params_check(void **state)
{
	(void)state;
	struct sampler_params d, p;
	sampler_params_default(&d);
	assert_null(sampler_params_check(&d));
	assert_true(d.temperature == 0.8f && d.top_k == 40 && d.top_p == 0.95f &&
		    d.min_p == 0.05f && d.repeat_penalty == 1.0f && d.penalty_last_n == 64);
	p = plain(0.0f, 0);
	assert_null(sampler_params_check(&p));

#define BAD(field, value)                                         \
	do {                                                      \
		p = d;                                            \
		p.field = (value);                                \
		const char *why = sampler_params_check(&p);       \
		if (!why) {                                       \
			fprintf(stderr, "accepted %s = %s\n", #field, #value); \
			fail();                                   \
		}                                                 \
	} while (0)
#define GOOD(field, value)                                        \
	do {                                                      \
		p = d;                                            \
		p.field = (value);                                \
		const char *why = sampler_params_check(&p);       \
		if (why) {                                        \
			fprintf(stderr, "refused %s = %s: %s\n", #field, #value, why); \
			fail();                                   \
		}                                                 \
	} while (0)
	BAD(temperature, -0.5f);
	BAD(temperature, 101.0f);
	BAD(temperature, NAN);
	BAD(temperature, INFINITY);
	GOOD(temperature, 0.0f);
	GOOD(temperature, 100.0f);
	BAD(top_k, -1);
	GOOD(top_k, 0);
	GOOD(top_k, 1000000);
	BAD(top_p, 0.0f);
	BAD(top_p, -0.1f);
	BAD(top_p, 1.5f);
	BAD(top_p, NAN);
	GOOD(top_p, 1.0f);
	GOOD(top_p, 0.01f);
	BAD(min_p, -0.1f);
	BAD(min_p, 1.0f);
	BAD(min_p, NAN);
	GOOD(min_p, 0.0f);
	BAD(repeat_penalty, 0.0f);
	BAD(repeat_penalty, -1.0f);
	BAD(repeat_penalty, 11.0f);
	BAD(repeat_penalty, NAN);
	GOOD(repeat_penalty, 1.3f);
	BAD(penalty_last_n, -2);
	GOOD(penalty_last_n, -1);
	GOOD(penalty_last_n, 0);
	BAD(presence_penalty, 11.0f);
	BAD(presence_penalty, -11.0f);
	BAD(presence_penalty, NAN);
	BAD(frequency_penalty, 10.5f);
	BAD(frequency_penalty, -INFINITY);
	BAD(frequency_penalty, NAN);
	GOOD(frequency_penalty, -2.0f);
#undef BAD
#undef GOOD
}

static void test_nan_logits(void **state)
{
	(void)state;
	enum { V = 6, N = 3000 };
	/* greedy: NaN first, NaN in the middle, NaN last */
	struct sampler_params g = plain(0.0f, 1);
	struct sampler s;
	assert_int_equal(sampler_init(&s, &g, V), 0);
	float a[V] = { NAN, -1.0f, 2.0f, NAN, 1.0f, -5.0f };
	assert_int_equal(sampler_sample(&s, a, NULL, 0), 2);
	float b[V] = { NAN, NAN, -3.0f, -4.0f, NAN, -2.0f };
	assert_int_equal(sampler_sample(&s, b, NULL, 0), 5);
	float c[V] = { 0.0f, 1.0f, NAN, 0.5f, 1.0f, NAN };
	assert_int_equal(sampler_sample(&s, c, NULL, 0), 1);
	sampler_done(&s);

	/* sampled, with and without truncation: NaN ids never drawn */
	const float l[V] = { NAN, 0.0f, 0.1f, NAN, -0.2f, NAN };
	int counts[V];
	struct sampler_params p = plain(1.0f, 17);
	draw(&p, l, V, N, counts);
	assert_int_equal(counts[0] + counts[3] + counts[5], 0);
	assert_true(counts[1] > 0 && counts[2] > 0 && counts[4] > 0);
	sampler_params_default(&p);
	p.seed = 18;
	draw(&p, l, V, N, counts);
	assert_int_equal(counts[0] + counts[3] + counts[5], 0);
	/* with penalties on a NaN token that is in the history */
	p.repeat_penalty = 1.5f;
	p.presence_penalty = 0.5f;
	struct sampler t;
	assert_int_equal(sampler_init(&t, &p, V), 0);
	const int32_t hist[] = { 0, 3, 1 };
	for (int i = 0; i < N; i++) {
		float x[V];
		memcpy(x, l, sizeof(x));
		int32_t id = sampler_sample(&t, x, hist, 3);
		assert_true(id == 1 || id == 2 || id == 4);
	}
	sampler_done(&t);
}

/* +inf takes all the mass (also when the temperature overflows a large
 * finite logit); -inf is never drawn. */
static void test_inf_logits(void **state)
{
	(void)state;
	enum { V = 4, N = 500 };
	int counts[V];
	const float a[V] = { 0.0f, INFINITY, 1.0f, -INFINITY };
	struct sampler_params p = plain(1.0f, 21);
	draw(&p, a, V, N, counts);
	assert_int_equal(counts[1], N);
	p = plain(0.0f, 21);
	draw(&p, a, V, N, counts);
	assert_int_equal(counts[1], N);
	const float b[V] = { 3e38f, 1.0f, 2e38f, 0.0f };  /* x 10 overflows */
	p = plain(0.1f, 22);
	draw(&p, b, V, N, counts);
	assert_int_equal(counts[1] + counts[3], 0);
	assert_int_equal(counts[0] + counts[2], N);
	const float c[V] = { -INFINITY, 0.0f, -INFINITY, 0.0f };
	p = plain(1.0f, 23);
	draw(&p, c, V, N, counts);
	assert_int_equal(counts[0] + counts[2], 0);
	assert_true(counts[1] > 0 && counts[3] > 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_greedy_argmax),
		cmocka_unit_test(test_seed_reproducible),
		cmocka_unit_test(test_uniform_range),
		cmocka_unit_test(test_distribution),
		cmocka_unit_test(test_top_k),
		cmocka_unit_test(test_top_k_large_vocab),
		cmocka_unit_test(test_top_p),
		cmocka_unit_test(test_min_p),
		cmocka_unit_test(test_temperature),
		cmocka_unit_test(test_repeat_penalty),
		cmocka_unit_test(test_presence_frequency),
		cmocka_unit_test(test_params_check),
		cmocka_unit_test(test_nan_logits),
		cmocka_unit_test(test_inf_logits),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * tests/unit/test_hist.c — util/hist.c: which bucket a value falls in
 * (bounds inclusive above), the per-bucket counts, sum and count, and
 * the quantiles read back from the buckets.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "util/hist.h"

static const double le[] = { 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30 };
#define N_LE (sizeof(le) / sizeof(le[0]))

static void test_bucket(void **state)
{
	(void)state;
	assert_int_equal(hist_bucket(le, N_LE, 0), 0);
	assert_int_equal(hist_bucket(le, N_LE, -1), 0);
	assert_int_equal(hist_bucket(le, N_LE, 0.005), 0);       /* a bound is its bucket's */
	assert_int_equal(hist_bucket(le, N_LE, 0.0050001), 1);
	assert_int_equal(hist_bucket(le, N_LE, 0.01), 1);
	assert_int_equal(hist_bucket(le, N_LE, 0.3), 6);
	assert_int_equal(hist_bucket(le, N_LE, 1), 7);
	assert_int_equal(hist_bucket(le, N_LE, 30), N_LE - 1);
	assert_int_equal(hist_bucket(le, N_LE, 30.5), N_LE);     /* above the last bound */
	assert_int_equal(hist_bucket(le, N_LE, INFINITY), N_LE);
	assert_int_equal(hist_bucket(le, 0, 1), 0);              /* no bounds: one bucket */
	/* every value against a linear search */
	for (double v = 0; v < 40; v += 0.0007) {
		size_t i = 0;
		while (i < N_LE && v > le[i])
			i++;
		assert_int_equal(hist_bucket(le, N_LE, v), i);
	}
}

static void test_observe(void **state)
{
	(void)state;
	struct hist h;
	hist_init(&h, le, N_LE);
	assert_int_equal(h.n_le, N_LE);
	const double v[] = { 0.001, 0.005, 0.007, 0.3, 0.3, 45, 2 };
	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
		hist_observe(&h, v[i]);
	hist_observe(&h, NAN);   /* not counted */
	assert_int_equal(h.count, 7);
	assert_true(fabs(h.sum - 47.613) < 1e-9);
	const uint64_t want[N_LE + 1] = { 2, 1, 0, 0, 0, 0, 2, 0, 1, 0, 0, 0, 1 };
	uint64_t total = 0;
	for (size_t i = 0; i <= N_LE; i++) {
		assert_int_equal(h.counts[i], want[i]);
		total += h.counts[i];
	}
	assert_int_equal(total, h.count);   /* not cumulative: they add up to count */
}

static void test_quantile(void **state)
{
	(void)state;
	uint64_t c[N_LE + 1] = { 0 };
	int above;
	assert_true(isnan(hist_quantile(le, N_LE, c, 0.5, &above)));
	/* 10 in (0.1, 0.25]: the median halfway through it, p99 near its top */
	c[5] = 10;
	assert_true(fabs(hist_quantile(le, N_LE, c, 0.5, &above) - 0.175) < 1e-12);
	assert_false(above);
	assert_true(fabs(hist_quantile(le, N_LE, c, 0.99, &above) - 0.2485) < 1e-12);
	assert_true(fabs(hist_quantile(le, N_LE, c, 1, &above) - 0.25) < 1e-12);
	/* the first bucket runs from 0 */
	c[5] = 0;
	c[0] = 4;
	assert_true(fabs(hist_quantile(le, N_LE, c, 0.5, &above) - 0.0025) < 1e-12);
	/* 90 low, 10 above every bound: p50 low, p99 "above 30" */
	c[0] = 0;
	c[1] = 90;
	c[N_LE] = 10;
	double p50 = hist_quantile(le, N_LE, c, 0.5, &above);
	assert_false(above);
	assert_true(p50 > 0.005 && p50 <= 0.01);
	assert_true(fabs(p50 - (0.005 + 0.005 * 50.0 / 90)) < 1e-12);
	assert_true(fabs(hist_quantile(le, N_LE, c, 0.9, &above) - 0.01) < 1e-12);
	assert_false(above);
	assert_true(hist_quantile(le, N_LE, c, 0.99, &above) == 30);
	assert_true(above);
	/* empty buckets between are skipped */
	uint64_t d[N_LE + 1] = { 0 };
	d[0] = 1;
	d[9] = 1;
	assert_true(fabs(hist_quantile(le, N_LE, d, 0.5, &above) - 0.005) < 1e-12);
	assert_true(fabs(hist_quantile(le, N_LE, d, 0.99, &above) - (2.5 + 2.5 * 0.98)) < 1e-12);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bucket),
		cmocka_unit_test(test_observe),
		cmocka_unit_test(test_quantile),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}

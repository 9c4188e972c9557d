/*
 * tests/unit/test_fair.c — daemon/fair.c: the cost plane learnt from
 * steps, and the deficit round robin that deals a step's rows among
 * users: equal time, whatever the number of jobs; a row every step for a
 * user whose rows are cheap; many rows each where a step's fixed cost
 * dominates; progress when no credit covers a row; the cap.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/fair.h"

static void test_plane(void **state)
{
	(void)state;
	/* t = 1 ms + 0.1 ms/MFLOP of products + 0.3 ms/MFLOP of attention */
	struct fair_cost c = { 0 };
	assert_false(fair_known(&c));
	for (int i = 0; i < 300; i++) {
		double x1 = 1 + (i * 7 % 13), x2 = (i * 5 % 11) * 0.5;
		fair_observe(&c, x1, x2, 1e-3 + 1e-4 * x1 + 3e-4 * x2);
	}
	assert_true(fair_known(&c));
	double a, k1, k2;
	fair_line(&c, &a, &k1, &k2);
	assert_true(fabs(a - 1e-3) < 1e-6);
	assert_true(fabs(k1 - 1e-4) < 1e-8);
	assert_true(fabs(k2 - 3e-4) < 1e-8);
}

static void test_constant_work(void **state)
{
	(void)state;
	/* every step alike: nothing tells a apart, all cost is the work's */
	struct fair_cost c = { 0 };
	for (int i = 0; i < 50; i++)
		fair_observe(&c, 64, 16, 2e-3);
	double a, k1, k2;
	fair_line(&c, &a, &k1, &k2);
	assert_true(a == 0);
	assert_true(fabs(k1 * 64 + k2 * 16 - 2e-3) < 1e-9);
	/* the older steps fade: a new cost shows within a few hundred */
	for (int i = 0; i < 600; i++)
		fair_observe(&c, 64, 16, 4e-3);
	fair_line(&c, &a, &k1, &k2);
	assert_true(fabs(k1 * 64 + k2 * 16 - 4e-3) < 1e-4);
}

/* n steps of two users: user 0 one job of cost c0 a row, user 1 64 jobs
 * of cost c1; the rows each got in all. */
static void run(int n, double a, double c0, double c1, int cap, int *got0, int *got1, int *min0)
{
	struct fair_user u[2] = { { 0, 0 }, { 65534, 0 } };
	struct fair_job j[65];
	*got0 = *got1 = 0;
	*min0 = 1 << 30;
	for (int s = 0; s < n; s++) {
		j[0] = (struct fair_job){ 0, 1, c0, 0, 0 };
		for (int i = 1; i < 65; i++)
			j[i] = (struct fair_job){ 1, 1, c1, 0, 0 };
		int given = fair_pick(u, 2, j, 65, a, cap, (unsigned)s);
		int g1 = 0;
		for (int i = 1; i < 65; i++)
			g1 += j[i].take;
		assert_int_equal(given, j[0].take + g1);
		assert_true(given >= 1 && given <= cap);
		*got0 += j[0].take;
		*got1 += g1;
		if (j[0].take < *min0)
			*min0 = j[0].take;
	}
}

static void test_equal_rows(void **state)
{
	(void)state;
	int g0, g1, m0;
	/* rows alike, no fixed cost: a row each a step, however many jobs */
	run(100, 0, 1, 1, 512, &g0, &g1, &m0);
	assert_int_equal(m0, 1);
	assert_int_equal(g0, 100);
	assert_int_equal(g1, 100);
}

static void test_dear_rows(void **state)
{
	(void)state;
	int g0, g1, m0;
	/* user 1's rows cost 3 of user 0's: user 0 still a row every step,
	 * user 1 a row every third step (equal time) */
	run(300, 0, 1, 3, 512, &g0, &g1, &m0);
	assert_int_equal(m0, 1);
	assert_int_equal(g0, 300);
	assert_true(g1 >= 95 && g1 <= 105);
}

static void test_fixed_cost(void **state)
{
	(void)state;
	int g0, g1, m0;
	/* a step costs 100 whatever its rows (a GPU's weight reads), a row 1:
	 * user 1 takes about a / 2 + 1 rows a step, user 0 its row */
	run(100, 100, 1, 1, 512, &g0, &g1, &m0);
	assert_int_equal(m0, 1);
	assert_true(g1 >= 100 * 50 && g1 <= 100 * 52);
	/* and the cap holds */
	run(100, 100, 1, 1, 16, &g0, &g1, &m0);
	assert_true(g0 + g1 <= 1600);
	assert_true(g0 >= 90);
}

static void test_progress(void **state)
{
	(void)state;
	/* a user whose rows each cost far more than any quantum still gets
	 * some, and the other is not starved */
	int g0, g1, m0;
	run(200, 0, 1, 40, 512, &g0, &g1, &m0);
	assert_true(g1 >= 3);
	assert_true(g0 >= 190);
	/* a prefill job whose rows cost a tenth of the other user's decode
	 * row (and grow dearer): equal time, the decode row every ~10 steps */
	struct fair_user u[2] = { { 1, 0 }, { 2, 0 } };
	int dec = 0, pre = 0;
	for (int s = 0; s < 100; s++) {
		struct fair_job j[2] = { { 0, 1, 1, 0, 0 }, { 1, 1000, 0.1, 0.0001, 0 } };
		fair_pick(u, 2, j, 2, 0, 512, (unsigned)s);
		dec += j[0].take;
		pre += j[1].take;
	}
	assert_true(dec >= 8 && dec <= 12);
	assert_true(pre >= 90 && pre <= 110);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_plane),
		cmocka_unit_test(test_constant_work),
		cmocka_unit_test(test_equal_rows),
		cmocka_unit_test(test_dear_rows),
		cmocka_unit_test(test_fixed_cost),
		cmocka_unit_test(test_progress),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}

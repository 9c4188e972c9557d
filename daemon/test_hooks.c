/*
 * daemon/test_hooks.c — what the tests ask of the engine through the
 * environment, kept out of the step: LLAMAD_TEST_STEP_DELAY_MS makes every
 * forward pass that many milliseconds slower (a slow model), and
 * LLAMAD_TEST_FAIL_AFTER=N fails pass N and every one after it as a dead
 * backend does (-EIO, the backend marked failed). Unset, the engine's own
 * pass runs unwrapped.
 */
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include "daemon/engine_int.h"

static int hooked_pass(struct engine *e, int nb)
{
	const struct test_hooks *h = &e->hooks;
	int rc = h->inner(e, nb);
	if (h->step_delay_ms > 0)
		usleep((useconds_t)h->step_delay_ms * 1000);
	/* this pass is number n_forward + 1: the step counts it after */
	if (h->fail_after && e->n_forward + 1 >= h->fail_after) {
		e->be->failed = 1;
		rc = -EIO;
	}
	return rc;
}

void test_hooks_install(struct engine *e)
{
	const char *fa = getenv("LLAMAD_TEST_FAIL_AFTER");
	const char *sd = getenv("LLAMAD_TEST_STEP_DELAY_MS");
	e->hooks.fail_after = fa && *fa ? strtoull(fa, NULL, 10) : 0;
	e->hooks.step_delay_ms = sd && *sd ? (int)strtol(sd, NULL, 10) : 0;
	if (!e->hooks.fail_after && e->hooks.step_delay_ms <= 0)
		return;
	e->hooks.inner = e->pass;
	e->pass = hooked_pass;
}

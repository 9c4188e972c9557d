/*
 * tests/unit/model_expect.h — what test_gguf.c and test_llama3.c share:
 * model_load that must fail with a cause naming the file and the reason,
 * or must succeed. Include after <cmocka.h>.
 */
#ifndef LLAMAD_TESTS_MODEL_EXPECT_H
#define LLAMAD_TESTS_MODEL_EXPECT_H

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

/* model_load(path, tok) must return NULL with a cause that contains names
 * (the file it must blame) and each string of the NULL-terminated list ap
 * (which the caller va_starts and va_ends). label names the case in the
 * failure messages; verbose: print the cause. */
static inline void expect_load_fail_v(const char *label, const char *path, const char *tok,
				      const char *names, int verbose, va_list ap)
{
	char *cause = NULL;
	struct model *m = model_load(path, tok, &cause);
	if (m)
		fail_msg("%s loaded, expected a failure", label);
	if (!cause)
		fail_msg("%s: no cause", label);
	if (!strstr(cause, names))
		fail_msg("%s: cause does not name %s: %s", label, names, cause);
	if (verbose)
		print_message("%s\n", cause);
	const char *want;
	while ((want = va_arg(ap, const char *)))
		if (!strstr(cause, want))
			fail_msg("%s: cause lacks \"%s\": %s", label, want, cause);
	free(cause);
}

/* model_load(path, tok) must succeed (label in the failure message);
 * returns the model. */
static inline struct model *expect_load_ok(const char *label, const char *path, const char *tok)
{
	char *cause = NULL;
	struct model *m = model_load(path, tok, &cause);
	if (!m)
		fail_msg("%s: %s", label, cause ? cause : "?");
	free(cause);
	return m;
}

#endif

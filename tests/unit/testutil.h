/*
 * tests/unit/testutil.h — small helpers shared by the unit tests (include
 * after <cmocka.h>): environment defaults, paths, whole-file reads.
 */
#ifndef LLAMAD_TESTS_TESTUTIL_H
#define LLAMAD_TESTS_TESTUTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* getenv(name) if set and non-empty, else def. */
static inline const char *env_or(const char *name, const char *def)
{
	const char *v = getenv(name);
	return v && *v ? v : def;
}

/* malloc'd "dir/name" */
static inline char *path_join(const char *dir, const char *name)
{
	size_t n = strlen(dir) + strlen(name) + 2;
	char *p = malloc(n);
	assert_non_null(p);
	snprintf(p, n, "%s/%s", dir, name);
	return p;
}

/* Read a whole file; malloc'd, NUL-terminated, length in *len; NULL if it
 * cannot be opened. */
static inline char *slurp(const char *path, size_t *len)
{
	*len = 0;
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	size_t cap = 4096, n = 0;
	char *buf = malloc(cap);
	assert_non_null(buf);
	for (;;) {
		if (n + 1 >= cap) {
			cap *= 2;
			buf = realloc(buf, cap);
			assert_non_null(buf);
		}
		size_t r = fread(buf + n, 1, cap - n - 1, f);
		if (r == 0)
			break;
		n += r;
	}
	fclose(f);
	buf[n] = '\0';
	*len = n;
	return buf;
}

#endif

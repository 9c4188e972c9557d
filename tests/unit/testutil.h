/*
 * tests/unit/testutil.h — small helpers shared by the unit tests (include
 * after <cmocka.h>): environment defaults, paths, whole-file reads.
 */
#ifndef LLAMAD_TESTS_TESTUTIL_H
#define LLAMAD_TESTS_TESTUTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A seeded splitmix64 stream, so every run draws the same inputs. */
static uint64_t rng_state;

static inline void rng_seed(uint64_t s)
{
	rng_state = s * 0x9e3779b97f4a7c15ull + 1;
}

static inline uint64_t rng_u64(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* uniform in [lo, hi) */
static inline float rng_float(float lo, float hi)
{
	double u = (double)(rng_u64() >> 11) * 0x1p-53;
	return (float)(lo + (hi - lo) * u);
}

/* malloc that fails the test instead of returning NULL */
static inline void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	assert_non_null(p);
	return p;
}

/* Fill with NaN, so an op that writes nothing fails the comparison. */
static inline void poison(float *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = NAN;
}

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

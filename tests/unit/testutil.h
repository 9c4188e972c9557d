/*
 * tests/unit/testutil.h — small helpers shared by the unit tests (include
 * after <cmocka.h>): environment defaults, paths, whole-file reads and
 * writes, logits.
 */
#ifndef LLAMAD_TESTS_TESTUTIL_H
#define LLAMAD_TESTS_TESTUTIL_H

#include <math.h>
#include <stdarg.h>
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

/* malloc'd printf; fails the test if it cannot allocate */
static inline char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static inline char *fmt(const char *f, ...)
{
	va_list ap;
	va_start(ap, f);
	char *s = NULL;
	if (vasprintf(&s, f, ap) < 0)
		s = NULL;
	va_end(ap);
	assert_non_null(s);
	return s;
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

/* Write len bytes of data as the file path (created or truncated). */
static inline void spit(const char *path, const void *data, size_t len)
{
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	if (len)
		assert_int_equal(fwrite(data, 1, len, f), len);
	assert_int_equal(fclose(f), 0);
}

/* Index of the largest of l[0..n), the first on a tie (greedy decoding). */
static inline int argmax(const float *l, int n)
{
	int b = 0;
	for (int i = 1; i < n; i++)
		if (l[i] > l[b])
			b = i;
	return b;
}

/* Fail the test if any of l[0..n) is NaN or infinite. */
static inline void assert_finite(const float *l, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!isfinite(l[i]))
			fail_msg("logit %zu is %g", i, (double)l[i]);
}

/* cmocka's skip() with the reason on the test's output. */
#define SKIP_WITHOUT(cond, what)                                                 \
	do {                                                                     \
		if (!(cond)) {                                                   \
			print_message("skipped: this CPU has no %s\n", what);     \
			skip();                                                  \
		}                                                                \
	} while (0)

#endif

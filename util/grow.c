/*
 * util/grow.c — see grow.h.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "util/grow.h"

int grow(void *p, size_t *cap, size_t need, size_t elem, size_t first)
{
	if (need <= *cap)
		return 0;
	size_t c = *cap ? *cap : first;
	while (c < need)
		c *= 2;
	void *a;
	memcpy(&a, p, sizeof(a));
	void *n = realloc(a, c * elem);
	if (!n)
		return -ENOMEM;
	memcpy(p, &n, sizeof(n));
	*cap = c;
	return 0;
}

/*
 * util/grow.h — the one way an array that is appended to grows.
 */
#ifndef LLAMAD_UTIL_GROW_H
#define LLAMAD_UTIL_GROW_H

#include <stddef.h>

/* Room for need elements of elem bytes in the array *p (a pointer to the
 * array's pointer), whose capacity in elements is *cap: when need is more,
 * the capacity doubles, from *cap or from first when *cap is 0, until it
 * holds need, and the array is reallocated. 0, or -ENOMEM with *p and *cap
 * as they were. */
int grow(void *p, size_t *cap, size_t need, size_t elem, size_t first);

#endif

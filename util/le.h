/*
 * util/le.h — little-endian integer fields of the files llamad writes,
 * read and written byte by byte whatever the host's order.
 */
#ifndef LLAMAD_UTIL_LE_H
#define LLAMAD_UTIL_LE_H

#include <stdint.h>

/* The n low bytes of v at p, least significant first. */
static inline void put_le(unsigned char *p, uint64_t v, int n)
{
	for (int i = 0; i < n; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static inline uint64_t get_le(const unsigned char *p, int n)
{
	uint64_t v = 0;
	for (int i = 0; i < n; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

static inline uint32_t get_u32(const unsigned char *p) { return (uint32_t)get_le(p, 4); }
static inline uint64_t get_u64(const unsigned char *p) { return get_le(p, 8); }

#endif

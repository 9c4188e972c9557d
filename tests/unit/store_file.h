/*
 * tests/unit/store_file.h — the state file layout (session/store.h,
 * versions 2 and 3) as the tests that forge or edit files see it: header
 * field offsets, where the K/V and (version 3) the shared blocks' names
 * lie, and resealing an edited image the way a writer would. Written from
 * the format's description, not from store.c, so that the tests check the
 * code against the documented layout.
 */
#ifndef LLAMAD_TESTS_STORE_FILE_H
#define LLAMAD_TESTS_STORE_FILE_H

#include <stddef.h>
#include <stdint.h>

#include <xxhash.h>

enum {
	SF_VERSION = 8,
	SF_FINGERPRINT = 16,
	SF_KV_DTYPE = 24,
	SF_BLOCK_SIZE = 28,
	SF_N_LAYERS = 32,
	SF_KV_DIM = 36,
	SF_N_TOKENS = 40,
	SF_N_CACHED = 44,
	SF_N_TURNS = 48,
	SF_UID = 52,
	SF_N_REFS = 64,            /* version 3 (flags before) */
	SF_BODY_BYTES = 92,
	SF_ID = 100,
	SF_ID_BYTES = 129,
	SF_CHECKSUM = 229,
	SF_META_SUM = 237,
	SF_HEADER_SUM = 245,
	SF_HEADER_SUM_V1 = 237,    /* version 1: no meta_sum */
	SF_HEADER_BYTES = 256,
};

static inline void sf_put(unsigned char *p, uint64_t v, int n)
{
	for (int i = 0; i < n; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static inline uint64_t sf_get(const unsigned char *p, int n)
{
	uint64_t v = 0;
	for (int i = 0; i < n; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

/* Bytes of one K/V block of the shape and element type image b's header
 * names (kernels/backend.h: per layer a K and a V span of block_size x
 * kv_dim elements; q8_0 adds an f16 scale per position and group of the
 * dtype field's second byte). An unknown type counts as f32. Unsigned
 * arithmetic: absurd fields give a wrong size, not undefined behaviour. */
static inline uint64_t sf_block_bytes(const unsigned char *b)
{
	uint64_t dt = sf_get(b + SF_KV_DTYPE, 4), kvd = sf_get(b + SF_KV_DIM, 4);
	uint64_t span = sf_get(b + SF_BLOCK_SIZE, 4) * kvd, group = dt >> 8;
	if ((dt & 0xff) == 1)
		span *= 2;
	else if ((dt & 0xff) == 3 && group)
		span += 2 * (span / group);
	else
		span *= 4;
	return 2 * span * sf_get(b + SF_N_LAYERS, 4);
}

/* Shared blocks (version 3: the header's n_refs; none before). */
static inline uint64_t sf_n_refs(const unsigned char *b)
{
	return sf_get(b + SF_VERSION, 4) >= 3 ? sf_get(b + SF_N_REFS, 4) : 0;
}

/* Bytes of the K/V part of image b (the header's counts): the cached
 * blocks not kept in block files. */
static inline uint64_t sf_kv_bytes(const unsigned char *b)
{
	uint64_t bs = sf_get(b + SF_BLOCK_SIZE, 4), cached = sf_get(b + SF_N_CACHED, 4);
	uint64_t blocks = bs ? (cached + bs - 1) / bs : 0, refs = sf_n_refs(b);
	return (blocks > refs ? blocks - refs : 0) * sf_block_bytes(b);
}

/* Offset in an image of len bytes of a version 3 file's refs section (the
 * chain's seed, then the n_refs names): the end of the body before its
 * K/V. 0 when the header's counts do not fit in len. */
static inline size_t sf_refs_off(const unsigned char *b, size_t len)
{
	uint64_t body = len > SF_HEADER_BYTES ? len - SF_HEADER_BYTES : 0;
	uint64_t kv = sf_kv_bytes(b), refs = 8 + 8 * sf_n_refs(b);
	if (sf_n_refs(b) > (1u << 24) || kv > body || body - kv < refs)
		return 0;
	return (size_t)(SF_HEADER_BYTES + body - kv - refs);
}

/* Recompute the header checksum after editing header bytes. */
static inline void sf_fix_header_sum(unsigned char *b)
{
	sf_put(b + SF_HEADER_SUM, XXH64(b, SF_HEADER_SUM, 0), 8);
}

/* Recompute every checksum of a version 2 or 3 image of len bytes after
 * editing it: meta_sum (the body before its K/V, as the header's counts
 * place it), the body checksum, the header checksum. */
static inline void sf_reseal(unsigned char *b, size_t len)
{
	size_t body = len > SF_HEADER_BYTES ? len - SF_HEADER_BYTES : 0;
	uint64_t kv = sf_kv_bytes(b);
	size_t meta = kv <= body ? body - (size_t)kv : body;
	sf_put(b + SF_META_SUM, XXH64(b + SF_HEADER_BYTES, meta, 0), 8);
	sf_put(b + SF_CHECKSUM, XXH64(b + SF_HEADER_BYTES, body, 0), 8);
	sf_fix_header_sum(b);
}

#endif

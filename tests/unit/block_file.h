/*
 * tests/unit/block_file.h — the block file layout (session/blocks.h) as the
 * tests that forge or edit block files see it: header field offsets and
 * resealing an edited image. Written from the format's description, not
 * from blocks.c (as store_file.h for state files).
 */
#ifndef LLAMAD_TESTS_BLOCK_FILE_H
#define LLAMAD_TESTS_BLOCK_FILE_H

#include <stddef.h>
#include <stdint.h>

#include <xxhash.h>

#include "store_file.h"

enum {
	BF_MAGIC = 0,
	BF_VERSION = 8,
	BF_HEADER_BYTES_FIELD = 12,
	BF_NAME = 16,
	BF_PARENT = 24,
	BF_UID = 32,
	BF_KV_DTYPE = 36,
	BF_FINGERPRINT = 40,
	BF_BLOCK_SIZE = 48,
	BF_N_LAYERS = 52,
	BF_KV_DIM = 56,
	BF_ZERO = 60,
	BF_BODY_BYTES = 64,
	BF_CHECKSUM = 72,
	BF_HEADER_SUM = 80,
	BF_HEADER_BYTES = 96,      /* the fields above, zero-padded */
};

/* Recompute the header checksum after editing header bytes (b holds at
 * least BF_HEADER_BYTES). */
static inline void bf_fix_header_sum(unsigned char *b)
{
	sf_put(b + BF_HEADER_SUM, XXH64(b, BF_HEADER_SUM, 0), 8);
}

/* Recompute both checksums of a block image of len bytes (len >=
 * BF_HEADER_BYTES): the body's (everything after the header), then the
 * header's. */
static inline void bf_reseal(unsigned char *b, size_t len)
{
	sf_put(b + BF_CHECKSUM, XXH64(b + BF_HEADER_BYTES, len - BF_HEADER_BYTES, 0), 8);
	bf_fix_header_sum(b);
}

#endif

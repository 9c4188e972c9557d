/*
 * session/kvsize.h — how large the KV pool is when the settings leave it to
 * llamad (kv_memory = auto on the CPU, gpu_kv_share = auto on a GPU), and
 * what a pool of a given size holds, in tokens and in full contexts.
 *
 * Arithmetic only: the caller gives a block's bytes (kt_kv_block_bytes of
 * the pool's shape, so the KV element type counts), the positions a block
 * holds, the tokens one session may reach (its context) and the memory the
 * pool lives in (host memory available, util/mem.h, or the device memory
 * left free after the weights).
 *
 * The automatic size: KV_AUTO_CONTEXTS full contexts, so that a few
 * sessions can each reach the context; at least KV_AUTO_MIN_BYTES, the old
 * fixed default, so that a small model still holds many sessions; at most
 * 1/KV_AUTO_MEM_SHARE of the memory, so that other daemons (one per model)
 * and the evicted caches still fit beside it.
 */
#ifndef LLAMAD_SESSION_KVSIZE_H
#define LLAMAD_SESSION_KVSIZE_H

#include <stdint.h>

#define KV_AUTO_CONTEXTS 4
#define KV_AUTO_MIN_BYTES ((uint64_t)256 << 20)
#define KV_AUTO_MEM_SHARE 4

/* The most blocks a pool has (block ids are int32_t). */
#define KV_MAX_BLOCKS ((uint64_t)INT32_MAX)

struct kv_size {
	uint64_t blocks;     /* whole blocks, at most KV_MAX_BLOCKS */
	uint64_t bytes;      /* blocks x block_bytes */
	uint64_t tokens;     /* blocks x block_tokens */
	double contexts;     /* tokens / ctx: full contexts it holds */
	int by_memory;       /* kv_size_auto: cut to the share of the memory */
};

/* What a pool of `bytes` holds: as many whole blocks of block_bytes (each
 * block_tokens positions) as fit, up to KV_MAX_BLOCKS (possibly 0), and
 * the contexts of ctx tokens they make. block_bytes, block_tokens and ctx
 * are positive. */
void kv_size_of(struct kv_size *out, uint64_t bytes, uint64_t block_bytes, int block_tokens,
		int ctx);

/* The automatic pool (see the top): KV_AUTO_CONTEXTS contexts of ctx
 * tokens rounded up to whole blocks, raised to KV_AUTO_MIN_BYTES, then cut
 * to mem_bytes / KV_AUTO_MEM_SHARE (mem_bytes 0: unknown, not cut; by_memory
 * says it was cut); in whole blocks, at least one, at most KV_MAX_BLOCKS. */
void kv_size_auto(struct kv_size *out, uint64_t block_bytes, int block_tokens, int ctx,
		  uint64_t mem_bytes);

#endif

/*
 * session/kvsize.c — see kvsize.h.
 */
#include "session/kvsize.h"

static void fill(struct kv_size *out, uint64_t blocks, uint64_t block_bytes, int block_tokens,
		 int ctx)
{
	if (blocks > KV_MAX_BLOCKS)
		blocks = KV_MAX_BLOCKS;
	out->blocks = blocks;
	out->bytes = blocks * block_bytes;   /* <= bytes asked, or INT32_MAX x a block */
	out->tokens = blocks * (uint64_t)block_tokens;
	out->contexts = (double)out->tokens / ctx;
}

void kv_size_of(struct kv_size *out, uint64_t bytes, uint64_t block_bytes, int block_tokens,
		int ctx)
{
	out->by_memory = 0;
	fill(out, bytes / block_bytes, block_bytes, block_tokens, ctx);
}

void kv_size_auto(struct kv_size *out, uint64_t block_bytes, int block_tokens, int ctx,
		  uint64_t mem_bytes)
{
	/* the contexts, in whole blocks (a session's last block is whole too) */
	uint64_t per_ctx = ((uint64_t)ctx + (uint64_t)block_tokens - 1) / (uint64_t)block_tokens;
	uint64_t blocks = per_ctx * KV_AUTO_CONTEXTS;
	uint64_t min_blocks = KV_AUTO_MIN_BYTES / block_bytes;
	if (blocks < min_blocks)
		blocks = min_blocks;
	out->by_memory = 0;
	uint64_t cap = mem_bytes / KV_AUTO_MEM_SHARE / block_bytes;
	if (mem_bytes && blocks > cap) {
		blocks = cap;
		out->by_memory = 1;
	}
	if (blocks < 1)
		blocks = 1;
	fill(out, blocks, block_bytes, block_tokens, ctx);
}

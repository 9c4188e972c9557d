/*
 * tests/unit/test_kvsize.c — the KV pool's automatic size and what a pool
 * holds (session/kvsize.c): model shapes and memory figures in, blocks,
 * bytes, tokens and contexts out, and the bounds: at least
 * KV_AUTO_CONTEXTS contexts and KV_AUTO_MIN_BYTES unless the memory share
 * cuts it, never over 1/KV_AUTO_MEM_SHARE of the memory, at least one
 * block, at most KV_MAX_BLOCKS.
 */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/unit/testutil.h"

#include "session/kvpool.h"
#include "session/kvsize.h"

#define MiB ((uint64_t)1 << 20)
#define GiB ((uint64_t)1 << 30)

/* A block's bytes for a model shape, as the engine computes them. */
static uint64_t block_bytes(int n_layers, int kv_dim)
{
	struct kt_kv shape = { .block_size = KV_BLOCK_TOKENS, .n_layers = n_layers,
			       .kv_dim = kv_dim };
	return kt_kv_block_bytes(&shape);
}

/* The shapes: stories260K (5 layers, kv_dim 32, ctx 512), stories110M (12,
 * 768, 1024), Llama 2 7B (32, 4096, 4096), Llama 3.1 8B (32, 1024 with
 * GQA, 131072). */
static void test_shapes(void **state)
{
	(void)state;
	struct kv_size k;
	/* stories260K: 4 contexts are 2.5 MiB, raised to 256 MiB */
	uint64_t bb = block_bytes(5, 32);
	assert_int_equal(bb, 20480);
	kv_size_auto(&k, bb, KV_BLOCK_TOKENS, 512, 24 * GiB);
	assert_int_equal(k.blocks, 13107);
	assert_int_equal(k.bytes, 13107 * bb);
	assert_int_equal(k.tokens, 13107 * 16);
	assert_false(k.by_memory);
	assert_true(k.contexts > 409.5 && k.contexts < 409.7);

	/* stories110M: 72 MiB a context; 4 are 288 MiB */
	bb = block_bytes(12, 768);
	assert_int_equal(bb, 1179648);
	kv_size_auto(&k, bb, KV_BLOCK_TOKENS, 1024, 24 * GiB);
	assert_int_equal(k.blocks, 4 * 64);
	assert_int_equal(k.bytes, 288 * MiB);
	assert_true(k.contexts == 4.0);
	assert_false(k.by_memory);

	/* 7B: 1 MiB a token (f32), 4 GiB a context: 16 GiB fit in 1/4 of
	 * 128 GiB; on a 32 GiB machine 1/4 holds two contexts */
	bb = block_bytes(32, 4096);
	assert_int_equal(bb, 16 * MiB);
	kv_size_auto(&k, bb, KV_BLOCK_TOKENS, 4096, 128 * GiB);
	assert_int_equal(k.bytes, 16 * GiB);
	assert_int_equal(k.tokens, 4 * 4096);
	assert_false(k.by_memory);
	kv_size_auto(&k, bb, KV_BLOCK_TOKENS, 4096, 32 * GiB);
	assert_int_equal(k.bytes, 8 * GiB);
	assert_true(k.contexts == 2.0);
	assert_true(k.by_memory);
	/* the same in a 2-byte KV type: half the block, four contexts again */
	kv_size_auto(&k, bb / 2, KV_BLOCK_TOKENS, 4096, 32 * GiB);
	assert_int_equal(k.bytes, 8 * GiB);
	assert_true(k.contexts == 4.0);
	assert_false(k.by_memory);

	/* Llama 3.1 8B: 256 KiB a token, 32 GiB a 128k context: the 16 GiB
	 * of a 64 GiB machine hold half of one */
	bb = block_bytes(32, 1024);
	assert_int_equal(bb, 4 * MiB);
	kv_size_auto(&k, bb, KV_BLOCK_TOKENS, 131072, 64 * GiB);
	assert_int_equal(k.bytes, 16 * GiB);
	assert_int_equal(k.tokens, 65536);
	assert_true(k.contexts == 0.5);
	assert_true(k.by_memory);
}

/* The edges: unknown memory, less memory than a block, a context that is
 * not whole blocks, the block count's limit. */
static void test_edges(void **state)
{
	(void)state;
	struct kv_size k;
	uint64_t bb = 16 * MiB;
	/* memory unknown: four contexts, not cut */
	kv_size_auto(&k, bb, KV_BLOCK_TOKENS, 4096, 0);
	assert_int_equal(k.bytes, 16 * GiB);
	assert_false(k.by_memory);
	/* a quarter of the memory holds no block: one block all the same */
	kv_size_auto(&k, bb, KV_BLOCK_TOKENS, 4096, 40 * MiB);
	assert_int_equal(k.blocks, 1);
	assert_int_equal(k.tokens, 16);
	assert_true(k.by_memory);
	/* 100 tokens take 7 blocks; 4 x 7 blocks of 16 MiB are over 256 MiB */
	kv_size_auto(&k, bb, KV_BLOCK_TOKENS, 100, 0);
	assert_int_equal(k.blocks, 28);
	assert_true(k.contexts == 28 * 16 / 100.0);
	/* a block over KV_AUTO_MIN_BYTES: still the contexts */
	kv_size_auto(&k, 512 * MiB, KV_BLOCK_TOKENS, 16, 0);
	assert_int_equal(k.blocks, 4);
	/* block ids are int32_t */
	kv_size_auto(&k, 1, 1, INT_MAX, 0);
	assert_int_equal(k.blocks, KV_MAX_BLOCKS);
	assert_int_equal(k.tokens, KV_MAX_BLOCKS);

	/* an explicit size: whole blocks, possibly none */
	kv_size_of(&k, 1 * MiB, 20480, KV_BLOCK_TOKENS, 512);
	assert_int_equal(k.blocks, 51);
	assert_int_equal(k.bytes, 51 * 20480);
	assert_int_equal(k.tokens, 816);
	assert_true(k.contexts > 1.59 && k.contexts < 1.6);
	assert_false(k.by_memory);
	kv_size_of(&k, 20479, 20480, KV_BLOCK_TOKENS, 512);
	assert_int_equal(k.blocks, 0);
	assert_int_equal(k.tokens, 0);
	assert_true(k.contexts == 0);
	kv_size_of(&k, UINT64_MAX, 4, KV_BLOCK_TOKENS, 512);
	assert_int_equal(k.blocks, KV_MAX_BLOCKS);
	/* the report: stories110M under 16 MiB holds 224 tokens of 1024 */
	kv_size_of(&k, 16 * MiB, block_bytes(12, 768), KV_BLOCK_TOKENS, 1024);
	assert_int_equal(k.tokens, 224);
	assert_true(k.contexts < 1);
}

/* The bounds over random shapes and memories. */
static void test_bounds(void **state)
{
	(void)state;
	rng_seed(26);
	for (int i = 0; i < 100000; i++) {
		int layers = 1 + (int)(rng_u64() % 128), kv_dim = 8 * (1 + (int)(rng_u64() % 2048));
		int ctx = 16 + (int)(rng_u64() % 262144);
		uint64_t bb = block_bytes(layers, kv_dim) / (1 + rng_u64() % 4);  /* f32 .. 1 byte */
		uint64_t mem = rng_u64() % 8 ? rng_u64() % (4096 * GiB) : 0;
		struct kv_size k;
		kv_size_auto(&k, bb, KV_BLOCK_TOKENS, ctx, mem);
		uint64_t per_ctx = ((uint64_t)ctx + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
		uint64_t want = per_ctx * KV_AUTO_CONTEXTS;
		if (want < KV_AUTO_MIN_BYTES / bb)
			want = KV_AUTO_MIN_BYTES / bb;
		assert_true(k.blocks >= 1 && k.blocks <= KV_MAX_BLOCKS);
		assert_int_equal(k.bytes, k.blocks * bb);
		assert_int_equal(k.tokens, k.blocks * KV_BLOCK_TOKENS);
		if (mem && k.blocks > 1)   /* never over the share */
			assert_true(k.bytes <= mem / KV_AUTO_MEM_SHARE);
		if (k.by_memory) {         /* cut: as many blocks as the share holds */
			assert_true(k.blocks < want);
			assert_true(k.blocks == 1 || k.bytes + bb > mem / KV_AUTO_MEM_SHARE);
		} else {                   /* the contexts and the floor, exactly */
			assert_int_equal(k.blocks, want);
			assert_true(k.tokens >= (uint64_t)KV_AUTO_CONTEXTS * (uint64_t)ctx);
			assert_true(k.bytes + bb > KV_AUTO_MIN_BYTES);
		}
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_shapes),
		cmocka_unit_test(test_edges),
		cmocka_unit_test(test_bounds),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}

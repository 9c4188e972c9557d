/*
 * tests/unit/test_kvpool.c — the paged KV block pool and per-sequence block
 * tables (session/kvpool.c): allocation, refcounts, growth, fork with
 * copy-on-write, truncate/release, and -ENOSPC leaving state unchanged;
 * block names (prefix sharing): the name index (lookups, collisions,
 * backward-shift deletion), free named blocks (the cached list, what
 * kvpool_alloc takes last), kvseq_prepare dropping or copying named
 * blocks, kvpool_release_free sparing them, kvseq_attach, kvpool_mark.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <sys/mman.h>
#include <unistd.h>

#include "session/kvpool.h"

#define NB 8    /* blocks */
#define BS 4    /* positions per block */
#define NL 2    /* layers */
#define KVD 6   /* kv_dim */

static struct kvpool *pool_new(void)
{
	struct kvpool *p = kvpool_new(NB, BS, NL, KVD);
	assert_non_null(p);
	assert_int_equal(kvpool_n_free(p), NB);
	assert_int_equal(p->kv.n_blocks, NB);
	assert_int_equal(p->kv.block_size, BS);
	assert_int_equal(p->kv.n_layers, NL);
	assert_int_equal(p->kv.kv_dim, KVD);
	assert_int_equal(p->cow_copies, 0);
	return p;
}

static float *block_ptr(struct kvpool *p, int32_t b)
{
	return kt_kv_block(&p->kv, b);
}

static size_t block_floats(struct kvpool *p)
{
	return kt_kv_block_bytes(&p->kv) / sizeof(float);
}

/* Fill a whole block with values derived from tag. */
static void block_fill(struct kvpool *p, int32_t b, float tag)
{
	float *f = block_ptr(p, b);
	for (size_t i = 0; i < block_floats(p); i++)
		f[i] = tag * 1000.0f + (float)i;
}

static int block_is(struct kvpool *p, int32_t b, float tag)
{
	const float *f = block_ptr(p, b);
	for (size_t i = 0; i < block_floats(p); i++)
		if (f[i] != tag * 1000.0f + (float)i)
			return 0;
	return 1;
}

/* Count the references a set of sequences hold to each block and check the
 * pool's refcounts and free count agree with it. */
static void check_pool(struct kvpool *p, struct kvseq *const *seqs, int n)
{
	int32_t want[NB] = { 0 };
	for (int s = 0; s < n; s++)
		for (int i = 0; i < seqs[s]->n_blocks; i++) {
			int32_t b = seqs[s]->blocks[i];
			assert_true(b >= 0 && b < NB);
			want[b]++;
		}
	int used = 0;
	for (int b = 0; b < NB; b++) {
		assert_int_equal(p->refs[b], want[b]);
		used += want[b] > 0;
	}
	assert_int_equal(kvpool_n_free(p), NB - used);
	/* the free list holds exactly the unreferenced blocks, once each */
	int seen[NB] = { 0 };
	for (int i = 0; i < p->n_free; i++) {
		int32_t b = p->free_list[i];
		assert_true(b >= 0 && b < NB);
		assert_int_equal(want[b], 0);
		assert_int_equal(seen[b]++, 0);
	}
}

static void test_new_free(void **state)
{
	(void)state;
	assert_null(kvpool_new(0, BS, NL, KVD));
	assert_null(kvpool_new(NB, 0, NL, KVD));
	assert_null(kvpool_new(NB, BS, 0, KVD));
	assert_null(kvpool_new(NB, BS, NL, -1));
	struct kvpool *p = pool_new();
	assert_int_equal(kt_kv_block_bytes(&p->kv), (size_t)NL * 2 * BS * KVD * sizeof(float));
	/* the whole store is addressable (ASan checks the writes) */
	for (int b = 0; b < NB; b++)
		block_fill(p, b, (float)b);
	for (int b = 0; b < NB; b++)
		assert_true(block_is(p, b, (float)b));
	kvpool_free(p);
	kvpool_free(NULL);
}

static void test_alloc_until_enospc(void **state)
{
	(void)state;
	struct kvpool *p = pool_new();
	int taken[NB] = { 0 };
	int32_t ids[NB];
	for (int i = 0; i < NB; i++) {
		int32_t b = kvpool_alloc(p);
		assert_true(b >= 0 && b < NB);
		assert_int_equal(taken[b], 0);
		taken[b] = 1;
		ids[i] = b;
		assert_int_equal(p->refs[b], 1);
		assert_int_equal(kvpool_n_free(p), NB - 1 - i);
	}
	assert_int_equal(ids[0], 0);  /* block 0 is taken first */
	assert_int_equal(kvpool_alloc(p), -ENOSPC);
	assert_int_equal(kvpool_alloc(p), -ENOSPC);
	assert_int_equal(kvpool_n_free(p), 0);
	/* give one back: it is the next one handed out */
	kvpool_unref(p, ids[3]);
	assert_int_equal(kvpool_n_free(p), 1);
	assert_int_equal(p->refs[ids[3]], 0);
	assert_int_equal(kvpool_alloc(p), ids[3]);
	assert_int_equal(kvpool_alloc(p), -ENOSPC);
	for (int i = 0; i < NB; i++)
		kvpool_unref(p, ids[i]);
	assert_int_equal(kvpool_n_free(p), NB);
	for (int i = 0; i < NB; i++)
		assert_true(kvpool_alloc(p) >= 0);
	assert_int_equal(kvpool_alloc(p), -ENOSPC);
	kvpool_free(p);
}

static void test_refcounts(void **state)
{
	(void)state;
	struct kvpool *p = pool_new();
	int32_t b = kvpool_alloc(p);
	assert_true(b >= 0);
	kvpool_ref(p, b);
	kvpool_ref(p, b);
	assert_int_equal(p->refs[b], 3);
	assert_int_equal(kvpool_n_free(p), NB - 1);
	kvpool_unref(p, b);
	kvpool_unref(p, b);
	assert_int_equal(p->refs[b], 1);
	assert_int_equal(kvpool_n_free(p), NB - 1);  /* still held */
	kvpool_unref(p, b);
	assert_int_equal(p->refs[b], 0);
	assert_int_equal(kvpool_n_free(p), NB);
	assert_int_equal(kvpool_alloc(p), b);
	assert_int_equal(p->refs[b], 1);
	kvpool_free(p);
}

static void test_prepare_grows(void **state)
{
	(void)state;
	struct kvpool *p = pool_new();
	struct kvseq s = { 0 };
	struct kvseq *all[] = { &s };
	/* empty prepare takes nothing */
	assert_int_equal(kvseq_prepare(p, &s, 0, 0), 0);
	assert_int_equal(s.n_blocks, 0);
	assert_int_equal(kvseq_prepare(p, &s, 1, 0), 0);
	assert_int_equal(s.n_blocks, 1);
	int32_t b0 = s.blocks[0];
	assert_int_equal(kvseq_prepare(p, &s, BS, 1), 0);  /* fills block 0 */
	assert_int_equal(s.n_blocks, 1);
	assert_int_equal(s.blocks[0], b0);
	assert_int_equal(kvseq_prepare(p, &s, BS + 1, BS), 0);
	assert_int_equal(s.n_blocks, 2);
	assert_int_equal(s.blocks[0], b0);
	assert_int_equal(kvseq_prepare(p, &s, 3 * BS + 1, BS + 1), 0);
	assert_int_equal(s.n_blocks, 4);
	assert_true(s.cap >= 4);
	check_pool(p, all, 1);
	/* a smaller n_pos never shrinks */
	assert_int_equal(kvseq_prepare(p, &s, 2, 1), 0);
	assert_int_equal(s.n_blocks, 4);
	assert_int_equal(p->cow_copies, 0);
	/* grow to the whole pool, past the initial table capacity */
	assert_int_equal(kvseq_prepare(p, &s, NB * BS, 3 * BS + 1), 0);
	assert_int_equal(s.n_blocks, NB);
	assert_int_equal(kvpool_n_free(p), 0);
	check_pool(p, all, 1);
	kvseq_release(p, &s);
	assert_null(s.blocks);
	assert_int_equal(s.n_blocks, 0);
	assert_int_equal(kvpool_n_free(p), NB);
	kvpool_free(p);
}

/* Fork a sequence of 10 positions (2 full blocks + 1 holding 2 of 4): every
 * block shared, nothing allocated; preparing the fork to write position 10
 * copies only the last block. */
static void test_fork_cow(void **state)
{
	(void)state;
	struct kvpool *p = pool_new();
	struct kvseq src = { 0 }, dst = { 0 };
	struct kvseq *all[] = { &src, &dst };
	assert_int_equal(kvseq_prepare(p, &src, 10, 0), 0);
	assert_int_equal(src.n_blocks, 3);
	int32_t sb[3];
	for (int i = 0; i < 3; i++) {
		sb[i] = src.blocks[i];
		block_fill(p, sb[i], (float)(i + 1));
	}
	int free0 = kvpool_n_free(p);

	assert_int_equal(kvseq_fork(p, &dst, &src), 0);
	assert_int_equal(dst.n_blocks, 3);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(dst.blocks[i], sb[i]);
		assert_int_equal(p->refs[sb[i]], 2);
	}
	assert_int_equal(kvpool_n_free(p), free0);  /* forking copies nothing */
	assert_int_equal(p->cow_copies, 0);
	check_pool(p, all, 2);

	/* the fork writes position 10 (row 2 of its block 2) */
	assert_int_equal(kvseq_prepare(p, &dst, 11, 10), 0);
	assert_int_equal(p->cow_copies, 1);
	assert_int_equal(kvpool_n_free(p), free0 - 1);
	assert_int_equal(dst.n_blocks, 3);
	assert_int_equal(dst.blocks[0], sb[0]);
	assert_int_equal(dst.blocks[1], sb[1]);
	int32_t nb = dst.blocks[2];
	assert_true(nb != sb[0] && nb != sb[1] && nb != sb[2]);
	assert_true(block_is(p, nb, 3.0f));  /* a full copy of the source block */
	/* the source is untouched */
	for (int i = 0; i < 3; i++)
		assert_int_equal(src.blocks[i], sb[i]);
	assert_int_equal(p->refs[sb[0]], 2);
	assert_int_equal(p->refs[sb[1]], 2);
	assert_int_equal(p->refs[sb[2]], 1);
	assert_int_equal(p->refs[nb], 1);
	check_pool(p, all, 2);
	/* writing into the copy leaves the source block as it was */
	block_fill(p, nb, 9.0f);
	for (int i = 0; i < 3; i++)
		assert_true(block_is(p, sb[i], (float)(i + 1)));

	/* the source writing its own last block copies nothing: it owns it now */
	assert_int_equal(kvseq_prepare(p, &src, 11, 10), 0);
	assert_int_equal(p->cow_copies, 1);
	assert_int_equal(src.blocks[2], sb[2]);
	/* preparing the fork again (block already private) copies nothing */
	assert_int_equal(kvseq_prepare(p, &dst, 12, 11), 0);
	assert_int_equal(p->cow_copies, 1);
	assert_int_equal(dst.blocks[2], nb);

	/* rewriting from position 0 copies the still shared full blocks */
	assert_int_equal(kvseq_prepare(p, &dst, 12, 0), 0);
	assert_int_equal(p->cow_copies, 3);
	assert_true(dst.blocks[0] != sb[0] && dst.blocks[1] != sb[1]);
	assert_true(block_is(p, dst.blocks[0], 1.0f) && block_is(p, dst.blocks[1], 2.0f));
	assert_int_equal(p->refs[sb[0]], 1);
	assert_int_equal(p->refs[sb[1]], 1);
	check_pool(p, all, 2);

	kvseq_release(p, &dst);
	kvseq_release(p, &src);
	assert_int_equal(kvpool_n_free(p), NB);
	kvpool_free(p);
}

/* A fork at a block boundary (8 positions = 2 full blocks): appending
 * position 8 takes a fresh block and copies nothing. */
static void test_fork_at_boundary(void **state)
{
	(void)state;
	struct kvpool *p = pool_new();
	struct kvseq src = { 0 }, dst = { 0 };
	struct kvseq *all[] = { &src, &dst };
	assert_int_equal(kvseq_prepare(p, &src, 2 * BS, 0), 0);
	assert_int_equal(kvseq_fork(p, &dst, &src), 0);
	int free0 = kvpool_n_free(p);
	assert_int_equal(kvseq_prepare(p, &dst, 2 * BS + 1, 2 * BS), 0);
	assert_int_equal(p->cow_copies, 0);
	assert_int_equal(dst.n_blocks, 3);
	assert_int_equal(kvpool_n_free(p), free0 - 1);
	assert_int_equal(dst.blocks[0], src.blocks[0]);
	assert_int_equal(dst.blocks[1], src.blocks[1]);
	check_pool(p, all, 2);
	/* a fork of a fork shares with both */
	struct kvseq d2 = { 0 };
	struct kvseq *all3[] = { &src, &dst, &d2 };
	assert_int_equal(kvseq_fork(p, &d2, &dst), 0);
	assert_int_equal(p->refs[src.blocks[0]], 3);
	check_pool(p, all3, 3);
	kvseq_release(p, &d2);
	kvseq_release(p, &src);
	check_pool(p, all, 2);
	kvseq_release(p, &dst);
	assert_int_equal(kvpool_n_free(p), NB);
	kvpool_free(p);
}

static void test_truncate_release(void **state)
{
	(void)state;
	struct kvpool *p = pool_new();
	struct kvseq a = { 0 }, b = { 0 };
	struct kvseq *all[] = { &a, &b };
	assert_int_equal(kvseq_prepare(p, &a, 4 * BS, 0), 0);
	assert_int_equal(kvseq_fork(p, &b, &a), 0);
	assert_int_equal(kvpool_n_free(p), NB - 4);
	/* truncating a shared sequence only drops references */
	kvseq_truncate(p, &b, BS + 1);
	assert_int_equal(b.n_blocks, 2);
	assert_int_equal(kvpool_n_free(p), NB - 4);
	check_pool(p, all, 2);
	/* truncating the last holder frees */
	kvseq_truncate(p, &a, BS);
	assert_int_equal(a.n_blocks, 1);
	assert_int_equal(kvpool_n_free(p), NB - 2);
	check_pool(p, all, 2);
	/* truncate to a longer length keeps everything */
	kvseq_truncate(p, &b, 100);
	assert_int_equal(b.n_blocks, 2);
	kvseq_truncate(p, &b, 0);
	assert_int_equal(b.n_blocks, 0);
	assert_non_null(b.blocks);  /* table kept for reuse */
	check_pool(p, all, 2);
	/* the emptied sequence grows again */
	assert_int_equal(kvseq_prepare(p, &b, 3, 0), 0);
	assert_int_equal(b.n_blocks, 1);
	check_pool(p, all, 2);
	kvseq_release(p, &a);
	kvseq_release(p, &b);
	assert_null(a.blocks);
	assert_int_equal(a.cap, 0);
	assert_int_equal(kvpool_n_free(p), NB);
	/* releasing an empty, never used sequence is fine */
	struct kvseq e = { 0 };
	kvseq_release(p, &e);
	assert_int_equal(kvpool_n_free(p), NB);
	kvpool_free(p);
}

/* A prepare that needs more blocks than are free fails with -ENOSPC and
 * changes neither the sequence nor the pool. */
static void test_prepare_enospc(void **state)
{
	(void)state;
	struct kvpool *p = pool_new();
	struct kvseq a = { 0 }, b = { 0 };
	struct kvseq *all[] = { &a, &b };
	assert_int_equal(kvseq_prepare(p, &a, 6 * BS, 0), 0);
	assert_int_equal(kvseq_prepare(p, &b, BS, 0), 0);
	int32_t b0 = b.blocks[0];
	/* b needs 2 more blocks, 1 is free */
	assert_int_equal(kvseq_prepare(p, &b, 3 * BS, BS), -ENOSPC);
	assert_int_equal(b.n_blocks, 1);
	assert_int_equal(b.blocks[0], b0);
	assert_int_equal(kvpool_n_free(p), 1);
	check_pool(p, all, 2);
	/* past the whole pool */
	assert_int_equal(kvseq_prepare(p, &b, 1000 * BS, 0), -ENOSPC);
	assert_int_equal(b.n_blocks, 1);
	assert_int_equal(b.blocks[0], b0);
	check_pool(p, all, 2);
	/* exactly what is left succeeds */
	assert_int_equal(kvseq_prepare(p, &b, 2 * BS, BS), 0);
	assert_int_equal(b.n_blocks, 2);
	assert_int_equal(kvpool_n_free(p), 0);
	assert_int_equal(kvseq_prepare(p, &b, 2 * BS + 1, 2 * BS), -ENOSPC);
	assert_int_equal(b.n_blocks, 2);
	check_pool(p, all, 2);
	kvseq_release(p, &a);
	kvseq_release(p, &b);

	/* copies count too: a fork of 2 blocks rewriting from 0 needs 2 copies */
	struct kvseq c = { 0 }, d = { 0 }, fill = { 0 };
	struct kvseq *all3[] = { &c, &d, &fill };
	assert_int_equal(kvseq_prepare(p, &c, 2 * BS, 0), 0);
	assert_int_equal(kvseq_fork(p, &d, &c), 0);
	assert_int_equal(kvseq_prepare(p, &fill, 5 * BS, 0), 0);
	assert_int_equal(kvpool_n_free(p), 1);
	int32_t d0 = d.blocks[0], d1 = d.blocks[1];
	assert_int_equal(kvseq_prepare(p, &d, 2 * BS, 0), -ENOSPC);
	assert_int_equal(d.n_blocks, 2);
	assert_int_equal(d.blocks[0], d0);
	assert_int_equal(d.blocks[1], d1);
	assert_int_equal(p->cow_copies, 0);
	check_pool(p, all3, 3);
	/* 1 copy + 1 new block with 1 free: also refused, unchanged */
	assert_int_equal(kvseq_prepare(p, &d, 2 * BS + 1, 2 * BS - 1), -ENOSPC);
	assert_int_equal(d.n_blocks, 2);
	assert_int_equal(d.blocks[1], d1);
	assert_int_equal(p->cow_copies, 0);
	check_pool(p, all3, 3);
	/* 1 copy with 1 free: fine */
	assert_int_equal(kvseq_prepare(p, &d, 2 * BS, 2 * BS - 1), 0);
	assert_int_equal(p->cow_copies, 1);
	assert_int_equal(d.blocks[0], d0);
	assert_true(d.blocks[1] != d1);
	check_pool(p, all3, 3);
	kvseq_release(p, &c);
	kvseq_release(p, &d);
	kvseq_release(p, &fill);
	assert_int_equal(kvpool_n_free(p), NB);
	kvpool_free(p);
}

/* Resident pages of [p, p + n) (mincore). */
static size_t resident(const void *p, size_t n)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE), np = (n + pg - 1) / pg, r = 0;
	unsigned char *v = malloc(np);
	assert_non_null(v);
	assert_int_equal(mincore((void *)p, n, v), 0);
	for (size_t i = 0; i < np; i++)
		r += v[i] & 1;
	free(v);
	return r;
}

/*
 * kvpool_release_free gives back the pages of free blocks, the pages two
 * free blocks share included: an f16 block of stories260K's shape (5
 * layers, kv_dim 32) is 10,240 bytes, 2.5 pages, and a page under a block
 * in use stays.
 */
static void test_release_shared_pages(void **state)
{
	(void)state;
	struct kvpool *p = kvpool_new_typed(NULL, KT_F16, 8, 16, 16, 5, 32);
	assert_non_null(p);
	size_t bb = kt_kv_block_bytes(&p->kv), all = bb * 16;
	assert_int_equal(bb, 10240);
	int32_t b[16];
	for (int i = 0; i < 16; i++) {
		b[i] = kvpool_alloc(p);
		memset(kt_kv_block(&p->kv, b[i]), 1, bb);
	}
	assert_true(resident(p->kv.base, all) >= all / (size_t)sysconf(_SC_PAGESIZE));
	for (int i = 0; i < 16; i++)
		if (b[i] != 5)
			kvpool_unref(p, b[i]);
	kvpool_release_free(p);
	/* block 5 (bytes 51,200-61,440: pages 12-15 on 4 KiB pages) stays */
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	size_t lo = 5 * bb / pg, hi = (6 * bb + pg - 1) / pg;
	assert_int_equal(resident(p->kv.base, all), hi - lo);
	kvpool_unref(p, 5);
	kvpool_release_free(p);
	assert_int_equal(resident(p->kv.base, all), 0);
	kvpool_free(p);
}

/* ---- block names (prefix sharing) ------------------------------------ */

/* Tokens of a block: BS values derived from seed. */
static void toks(int32_t *t, int n, uint32_t seed)
{
	for (int i = 0; i < n; i++)
		t[i] = (int32_t)(seed * 7919u + (uint32_t)i * 31u + 1u);
}

/* The free structures and the name index agree with the refcounts and the
 * names: every unreferenced block is on the plain free list (no name) or
 * the cached list (named), once; n_free counts both; the cached list is a
 * well-linked chain; the index holds each named block exactly once and
 * nothing else, and a lookup by what made each name finds its block. */
static void check_names(const struct kvpool *p)
{
	int n = p->kv.n_blocks, bs = p->kv.block_size;
	char *where = calloc((size_t)n, 1);  /* 1: plain free list, 2: cached list */
	int *seen = calloc((size_t)n, sizeof(int));
	assert_non_null(where);
	assert_non_null(seen);
	assert_true(p->n_plain >= 0 && p->n_plain <= n);
	for (int i = 0; i < p->n_plain; i++) {
		int32_t b = p->free_list[i];
		assert_true(b >= 0 && b < n);
		assert_int_equal(where[b], 0);
		where[b] = 1;
		assert_int_equal(p->refs[b], 0);
		assert_true(p->name[b] == 0);
	}
	int k = 0;
	for (int32_t b = p->lru_head, prev = -1; b >= 0; prev = b, b = p->lru_next[b]) {
		assert_true(b < n);
		assert_int_equal(where[b], 0);
		where[b] = 2;
		assert_int_equal(p->lru_prev[b], prev);
		assert_int_equal(p->refs[b], 0);
		assert_true(p->name[b] != 0);
		if (p->lru_next[b] < 0)
			assert_int_equal(p->lru_tail, b);
		k++;
		assert_true(k <= n);
	}
	if (k == 0) {
		assert_int_equal(p->lru_head, -1);
		assert_int_equal(p->lru_tail, -1);
	}
	assert_int_equal(k, p->n_lru);
	assert_int_equal(kvpool_n_cached(p), k);
	int n_zero = 0, n_named = 0;
	for (int b = 0; b < n; b++) {
		assert_true(p->refs[b] >= 0);
		if (p->refs[b] == 0) {
			n_zero++;
			assert_true(where[b] != 0);
		} else {
			assert_int_equal(where[b], 0);
		}
		n_named += p->name[b] != 0;
	}
	assert_int_equal(kvpool_n_free(p), n_zero);
	assert_int_equal(p->n_free, p->n_plain + p->n_lru);
	int occupied = 0;
	for (uint32_t i = 0; i <= p->index_mask; i++) {
		int32_t b = p->index[i];
		if (b < 0)
			continue;
		assert_true(b < n);
		assert_true(p->name[b] != 0);
		seen[b]++;
		occupied++;
	}
	assert_int_equal(occupied, n_named);
	for (int b = 0; b < n; b++) {
		if (!p->name[b])
			continue;
		assert_int_equal(seen[b], 1);
		assert_int_equal(kvpool_lookup(p, p->name[b], p->parent[b], p->owner[b],
					       p->tok + (size_t)b * (size_t)bs), b);
	}
	free(where);
	free(seen);
}

/* Refcounts equal the references the sequences hold, and check_names. */
static void check_seqs(const struct kvpool *p, struct kvseq *const *seqs, int n)
{
	int nb = p->kv.n_blocks;
	int32_t *want = calloc((size_t)nb, sizeof(int32_t));
	assert_non_null(want);
	for (int s = 0; s < n; s++)
		for (int i = 0; i < seqs[s]->n_blocks; i++) {
			int32_t b = seqs[s]->blocks[i];
			assert_true(b >= 0 && b < nb);
			want[b]++;
		}
	for (int b = 0; b < nb; b++)
		assert_int_equal(p->refs[b], want[b]);
	free(want);
	check_names(p);
}

static void test_name_lookup(void **state)
{
	(void)state;
	struct kvpool *p = pool_new();
	int32_t a = kvpool_alloc(p), b = kvpool_alloc(p), c = kvpool_alloc(p);
	int32_t ta[BS], tb[BS], tc[BS], t[BS];
	toks(ta, BS, 1);
	toks(tb, BS, 2);
	toks(tc, BS, 3);
	assert_int_equal(kvpool_lookup(p, 0x1234, 7, 1000, ta), -1);  /* nothing named */
	kvpool_name(p, a, 0x1234, 7, 1000, ta);
	assert_true(p->name[a] == 0x1234);
	assert_int_equal(kvpool_lookup(p, 0x1234, 7, 1000, ta), a);
	check_names(p);
	/* everything a name was made of must match */
	assert_int_equal(kvpool_lookup(p, 0x1235, 7, 1000, ta), -1);
	assert_int_equal(kvpool_lookup(p, 0x1234, 8, 1000, ta), -1);
	assert_int_equal(kvpool_lookup(p, 0x1234, 0, 1000, ta), -1);
	assert_int_equal(kvpool_lookup(p, 0x1234, 7, 1001, ta), -1);
	assert_int_equal(kvpool_lookup(p, 0x1234, 7, 0, ta), -1);
	for (int i = 0; i < BS; i++) {
		memcpy(t, ta, sizeof(t));
		t[i]++;
		assert_int_equal(kvpool_lookup(p, 0x1234, 7, 1000, t), -1);
	}
	/* name 0 is no name, whatever else matches */
	assert_int_equal(kvpool_lookup(p, 0, 7, 1000, ta), -1);
	/* the pool keeps its own copy of the tokens */
	memcpy(t, tb, sizeof(t));
	kvpool_name(p, b, 0x5678, 0x1234, 1000, t);
	memset(t, 0x5a, sizeof(t));
	assert_int_equal(kvpool_lookup(p, 0x5678, 0x1234, 1000, tb), b);
	assert_int_equal(kvpool_lookup(p, 0x5678, 0x1234, 1000, t), -1);
	/* a second block of the same name made of other tokens (a hash
	 * collision): each is found by its own tokens only */
	kvpool_name(p, c, 0x1234, 7, 1000, tc);
	assert_int_equal(kvpool_lookup(p, 0x1234, 7, 1000, ta), a);
	assert_int_equal(kvpool_lookup(p, 0x1234, 7, 1000, tc), c);
	check_names(p);
	/* unname: gone, the others stay; refcounts and free count untouched */
	kvpool_unname(p, a);
	assert_true(p->name[a] == 0);
	assert_int_equal(kvpool_lookup(p, 0x1234, 7, 1000, ta), -1);
	assert_int_equal(kvpool_lookup(p, 0x1234, 7, 1000, tc), c);
	assert_int_equal(kvpool_lookup(p, 0x5678, 0x1234, 1000, tb), b);
	assert_int_equal(p->refs[a], 1);
	assert_int_equal(kvpool_n_free(p), NB - 3);
	check_names(p);
	kvpool_unname(p, a);  /* twice: a no-op */
	check_names(p);
	/* a renamed block is found under its new name only */
	kvpool_name(p, a, 0x9abc, 7, 1000, ta);
	assert_int_equal(kvpool_lookup(p, 0x9abc, 7, 1000, ta), a);
	assert_int_equal(kvpool_lookup(p, 0x1234, 7, 1000, ta), -1);
	check_names(p);
	kvpool_unname(p, c);
	kvpool_unname(p, b);
	kvpool_unname(p, a);
	check_names(p);
	for (uint32_t i = 0; i <= p->index_mask; i++)
		assert_int_equal(p->index[i], -1);
	kvpool_free(p);
}

static uint64_t splitmix(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* home_of's scratch pool */
static struct kvpool *home_q;
static int home_q_blocks;

static void home_done(void)
{
	kvpool_free(home_q);
	home_q = NULL;
}

/* The slot name lands in when the index of a pool of n_blocks is empty:
 * its home slot (learnt from the pool itself, not from its hash). */
static uint32_t home_of(int n_blocks, uint64_t name)
{
	struct kvpool *q = home_q;
	if (!q || home_q_blocks != n_blocks) {
		kvpool_free(q);
		q = home_q = kvpool_new(n_blocks, BS, 1, 1);
		assert_non_null(q);
		home_q_blocks = n_blocks;
		assert_int_equal(kvpool_alloc(q), 0);
	}
	int32_t t[BS] = { 0 };
	kvpool_name(q, 0, name, 0, 0, t);
	uint32_t home = UINT32_MAX;
	for (uint32_t i = 0; i <= q->index_mask; i++)
		if (q->index[i] == 0)
			home = i;
	assert_true(home != UINT32_MAX);
	kvpool_unname(q, 0);
	return home;
}

/* n names whose home slot (in a pool of n_blocks) is `home`. */
static void names_at(int n_blocks, uint32_t home, uint64_t *out, int n, uint64_t *rng)
{
	for (int k = 0; k < n;) {
		uint64_t v = splitmix(rng);
		if (v && home_of(n_blocks, v) == home)
			out[k++] = v;
	}
}

#define NBI 64  /* blocks of the pools the index tests use: 128 slots */

/* Linear probing without tombstones: every slot from an entry's home up
 * to the entry is occupied (else a lookup would stop short of it). */
static void check_runs(const struct kvpool *p, const uint32_t *home)
{
	for (uint32_t j = 0; j <= p->index_mask; j++) {
		int32_t b = p->index[j];
		if (b < 0)
			continue;
		for (uint32_t i = home[b]; i != j; i = (i + 1) & p->index_mask)
			assert_true(p->index[i] >= 0);
	}
}

/* Occupied slots exactly [from, from + n) (cyclically). */
static void check_run_is(const struct kvpool *p, uint32_t from, int n)
{
	for (uint32_t k = 0; k <= p->index_mask; k++) {
		uint32_t j = (from + k) & p->index_mask;
		if ((int)k < n)
			assert_true(p->index[j] >= 0);
		else
			assert_int_equal(p->index[j], -1);
	}
}

/*
 * Names that collide in the index: one run of 11 entries from home h
 * (6 homed at h, 3 at h + 1, 2 at h + 3, inserted interleaved), and the
 * same across the end of the table (homes 126, 127, 0). Removing entries
 * from the middle, the start and the end of a run must keep every other
 * one findable and the run contiguous (backward-shift deletion, no
 * tombstones).
 */
static void collision_run(uint32_t h)
{
	struct kvpool *p = kvpool_new(NBI, BS, NL, KVD);
	assert_non_null(p);
	assert_int_equal(p->index_mask, 127);
	uint32_t mask = p->index_mask, home[NBI];
	uint64_t rng = 42 + h, n_h[6], n_h1[3], n_h3[2];
	names_at(NBI, h, n_h, 6, &rng);
	names_at(NBI, (h + 1) & mask, n_h1, 3, &rng);
	names_at(NBI, (h + 3) & mask, n_h3, 2, &rng);
	/* insertion order: h, h+1, h, h+3, h, h+1, h, h, h+1, h+3, h */
	const uint64_t order[11] = { n_h[0], n_h1[0], n_h[1], n_h3[0], n_h[2], n_h1[1],
				     n_h[3], n_h[4], n_h1[2], n_h3[1], n_h[5] };
	const uint32_t order_home[11] = { h, h + 1, h, h + 3, h, h + 1, h, h, h + 1, h + 3, h };
	int32_t blk[11], t[BS];
	for (int k = 0; k < NBI; k++)
		assert_int_equal(kvpool_alloc(p), k);
	for (int k = 0; k < 11; k++) {
		blk[k] = k * 5 % NBI;  /* block ids not in insertion order */
		home[blk[k]] = order_home[k] & mask;
		toks(t, BS, (uint32_t)k);
		kvpool_name(p, blk[k], order[k], 100 + (uint64_t)k, 7, t);
		check_runs(p, home);
	}
	check_run_is(p, h, 11);
	check_names(p);
	/* some entries are displaced: the run is real */
	int displaced = 0;
	for (uint32_t k = 0; k < 11; k++)
		displaced += p->index[(h + k) & mask] >= 0 && home[p->index[(h + k) & mask]] !=
			((h + k) & mask);
	assert_true(displaced >= 8);

	/* remove: an h entry from the middle (3rd inserted), an h+1 one, the
	 * one at the run's start, an h+3 one, the run's last entry */
	const int del[5] = { 2, 5, 0, 3, 10 };
	int gone[11] = { 0 };
	for (int d = 0; d < 5; d++) {
		kvpool_unname(p, blk[del[d]]);
		gone[del[d]] = 1;
		assert_true(p->name[blk[del[d]]] == 0);
		toks(t, BS, (uint32_t)del[d]);
		assert_int_equal(kvpool_lookup(p, order[del[d]], 100 + (uint64_t)del[d], 7, t), -1);
		for (int k = 0; k < 11; k++) {
			if (gone[k])
				continue;
			toks(t, BS, (uint32_t)k);
			assert_int_equal(kvpool_lookup(p, order[k], 100 + (uint64_t)k, 7, t), blk[k]);
		}
		check_runs(p, home);
		check_run_is(p, h, 11 - d - 1);  /* the hole was filled */
		check_names(p);
	}
	/* and every remaining one, last to first */
	for (int k = 10; k >= 0; k--) {
		if (gone[k])
			continue;
		kvpool_unname(p, blk[k]);
		gone[k] = 1;
		check_runs(p, home);
		check_names(p);
		for (int m = 0; m < 11; m++) {
			toks(t, BS, (uint32_t)m);
			assert_int_equal(kvpool_lookup(p, order[m], 100 + (uint64_t)m, 7, t),
					 gone[m] ? -1 : blk[m]);
		}
	}
	check_run_is(p, h, 0);
	kvpool_free(p);
}

static void test_name_collisions(void **state)
{
	(void)state;
	collision_run(40);
	collision_run(126);  /* the run wraps past slot 127 */
	collision_run(127);
	home_done();
}

/*
 * Random names (most of them homed in a few slots around the end of the
 * table, so runs are long and wrap) named and unnamed on held blocks,
 * against a reference of which block holds which name. After every step
 * every named block is found, every name not held is not, and the index
 * has no tombstone.
 */
static void test_name_stress(void **state)
{
	(void)state;
	struct kvpool *p = kvpool_new(NBI, BS, NL, KVD);
	assert_non_null(p);
	for (int k = 0; k < NBI; k++)
		assert_int_equal(kvpool_alloc(p), k);
	enum { NC = 160 };
	uint64_t rng = 7, cand[NC];
	uint32_t cand_home[NC], home[NBI];
	int holder[NC];           /* block holding candidate k, or -1 */
	int held_by[NBI];         /* candidate block b holds, or -1 */
	uint64_t parent[NC];
	uint32_t owner[NC];
	for (int k = 0; k < NC; k++) {
		if (k < 120) {  /* homes 125, 126, 127, 0, 1, 2 */
			uint32_t hm = (125u + (uint32_t)(k % 6)) & 127u;
			names_at(NBI, hm, &cand[k], 1, &rng);
		} else {
			do
				cand[k] = splitmix(&rng);
			while (!cand[k]);
		}
		cand_home[k] = home_of(NBI, cand[k]);
		holder[k] = -1;
		parent[k] = splitmix(&rng);
		owner[k] = (uint32_t)(k % 3);
	}
	for (int b = 0; b < NBI; b++)
		held_by[b] = -1;
	int32_t t[BS];
	int named = 0, max_named = 0;
	for (int step = 0; step < 20000; step++) {
		uint64_t r = splitmix(&rng);
		int b = (int)(r % NBI);
		if (held_by[b] >= 0 && (r >> 8) % 8 < (named > 48 ? 6u : 3u)) {
			holder[held_by[b]] = -1;
			held_by[b] = -1;
			kvpool_unname(p, b);
			named--;
		} else if (held_by[b] < 0) {
			int k = (int)((r >> 16) % NC);
			if (holder[k] >= 0)
				continue;
			holder[k] = b;
			held_by[b] = k;
			home[b] = cand_home[k];
			toks(t, BS, (uint32_t)k);
			kvpool_name(p, b, cand[k], parent[k], owner[k], t);
			named++;
			max_named = named > max_named ? named : max_named;
		} else {
			continue;
		}
		for (int k = 0; k < NC; k++) {
			toks(t, BS, (uint32_t)k);
			assert_int_equal(kvpool_lookup(p, cand[k], parent[k], owner[k], t), holder[k]);
		}
		check_runs(p, home);
		if (step % 64 == 0)
			check_names(p);
	}
	assert_true(max_named >= 40);  /* the index got crowded */
	check_names(p);
	kvpool_free(p);
	home_done();
}

/* A named block whose last reference goes stays findable, on the cached
 * list (counted free); taking it back by reference leaves the list. The
 * list is ordered by when blocks were freed. */
static void test_cached_list(void **state)
{
	(void)state;
	struct kvpool *p = pool_new();
	int32_t a = kvpool_alloc(p), b = kvpool_alloc(p), c = kvpool_alloc(p);
	int32_t ta[BS], tb[BS];
	toks(ta, BS, 1);
	toks(tb, BS, 2);
	kvpool_name(p, a, 0xa, 1, 5, ta);
	kvpool_name(p, b, 0xb, 0xa, 5, tb);
	assert_int_equal(kvpool_n_cached(p), 0);
	assert_int_equal(kvpool_n_free(p), NB - 3);
	kvpool_unref(p, a);
	assert_int_equal(p->refs[a], 0);
	assert_int_equal(kvpool_n_cached(p), 1);
	assert_int_equal(kvpool_n_free(p), NB - 2);
	assert_true(p->name[a] == 0xa);
	assert_int_equal(kvpool_lookup(p, 0xa, 1, 5, ta), a);
	check_names(p);
	kvpool_unref(p, c);  /* unnamed: the plain free list */
	assert_int_equal(kvpool_n_cached(p), 1);
	assert_int_equal(kvpool_n_free(p), NB - 1);
	kvpool_unref(p, b);
	assert_int_equal(kvpool_n_cached(p), 2);
	assert_int_equal(kvpool_n_free(p), NB);
	assert_int_equal(p->lru_head, a);
	assert_int_equal(p->lru_tail, b);
	check_names(p);
	/* a lookup takes no reference; kvpool_ref takes the block back */
	int32_t x = kvpool_lookup(p, 0xb, 0xa, 5, tb);
	assert_int_equal(x, b);
	assert_int_equal(p->refs[b], 0);
	kvpool_ref(p, x);
	assert_int_equal(p->refs[b], 1);
	assert_int_equal(kvpool_n_cached(p), 1);
	assert_int_equal(kvpool_n_free(p), NB - 1);
	assert_int_equal(p->lru_head, a);
	assert_int_equal(p->lru_tail, a);
	assert_true(p->name[b] == 0xb);  /* still named while held */
	check_names(p);
	kvpool_ref(p, b);  /* a second reference: no list change */
	assert_int_equal(p->refs[b], 2);
	assert_int_equal(kvpool_n_free(p), NB - 1);
	kvpool_unref(p, b);
	assert_int_equal(kvpool_n_cached(p), 1);
	kvpool_unref(p, b);
	assert_int_equal(kvpool_n_cached(p), 2);
	assert_int_equal(p->lru_head, a);
	assert_int_equal(p->lru_tail, b);
	/* a taken and freed again: now the most recently freed */
	kvpool_ref(p, kvpool_lookup(p, 0xa, 1, 5, ta));
	kvpool_unref(p, a);
	assert_int_equal(p->lru_head, b);
	assert_int_equal(p->lru_tail, a);
	check_names(p);
	/* unnaming a free named block makes it a plain free one */
	kvpool_unname(p, b);
	assert_int_equal(kvpool_n_cached(p), 1);
	assert_int_equal(kvpool_n_free(p), NB);
	assert_int_equal(kvpool_lookup(p, 0xb, 0xa, 5, tb), -1);
	check_names(p);
	kvpool_free(p);
}

/* kvpool_alloc hands out unnamed free blocks first, then the least
 * recently freed named one, forgetting its name. */
static void test_alloc_named_last(void **state)
{
	(void)state;
	struct kvpool *p = pool_new();
	for (int i = 0; i < NB; i++)
		assert_int_equal(kvpool_alloc(p), i);
	int32_t t1[BS], t4[BS], t6[BS];
	toks(t1, BS, 1);
	toks(t4, BS, 4);
	toks(t6, BS, 6);
	kvpool_name(p, 1, 0x11, 0, 9, t1);
	kvpool_name(p, 4, 0x44, 0, 9, t4);
	kvpool_name(p, 6, 0x66, 0, 9, t6);
	/* freed in the order 4, 6, 0, 1, 7: plain {0, 7}, cached [4, 6, 1] */
	kvpool_unref(p, 4);
	kvpool_unref(p, 6);
	kvpool_unref(p, 0);
	kvpool_unref(p, 1);
	kvpool_unref(p, 7);
	assert_int_equal(kvpool_n_free(p), 5);
	assert_int_equal(kvpool_n_cached(p), 3);
	check_names(p);
	int32_t x = kvpool_alloc(p), y = kvpool_alloc(p);
	assert_true((x == 0 && y == 7) || (x == 7 && y == 0));
	assert_int_equal(p->names_dropped, 0);
	assert_int_equal(kvpool_n_cached(p), 3);
	assert_int_equal(kvpool_lookup(p, 0x44, 0, 9, t4), 4);
	check_names(p);
	/* no plain block left: the oldest named one, 4 */
	assert_int_equal(kvpool_alloc(p), 4);
	assert_int_equal(p->names_dropped, 1);
	assert_true(p->name[4] == 0);
	assert_int_equal(p->refs[4], 1);
	assert_int_equal(kvpool_lookup(p, 0x44, 0, 9, t4), -1);
	assert_int_equal(kvpool_n_cached(p), 2);
	assert_int_equal(kvpool_n_free(p), 2);
	check_names(p);
	/* 6 taken and freed again: 1 is now the oldest */
	kvpool_ref(p, kvpool_lookup(p, 0x66, 0, 9, t6));
	kvpool_unref(p, 6);
	assert_int_equal(kvpool_alloc(p), 1);
	assert_int_equal(p->names_dropped, 2);
	assert_int_equal(kvpool_lookup(p, 0x11, 0, 9, t1), -1);
	assert_int_equal(kvpool_lookup(p, 0x66, 0, 9, t6), 6);
	assert_int_equal(kvpool_alloc(p), 6);
	assert_int_equal(p->names_dropped, 3);
	assert_int_equal(kvpool_lookup(p, 0x66, 0, 9, t6), -1);
	assert_int_equal(kvpool_alloc(p), -ENOSPC);
	assert_int_equal(p->names_dropped, 3);
	assert_int_equal(kvpool_n_free(p), 0);
	assert_int_equal(kvpool_n_cached(p), 0);
	check_names(p);
	/* an unnamed-by-hand free block goes before a named one */
	kvpool_name(p, 2, 0x22, 0, 9, t1);
	kvpool_name(p, 3, 0x33, 0, 9, t4);
	kvpool_unref(p, 2);
	kvpool_unref(p, 3);
	kvpool_unname(p, 3);
	assert_int_equal(kvpool_alloc(p), 3);
	assert_int_equal(p->names_dropped, 3);
	assert_int_equal(kvpool_lookup(p, 0x22, 0, 9, t1), 2);
	check_names(p);
	kvpool_free(p);
}

/*
 * Random allocations, references, names, unnames and lookups against a
 * reference model of refcounts, names and the order named blocks were
 * freed in: kvpool_alloc must take a plain block while there is one, else
 * the oldest freed named block.
 */
static void test_free_lists_stress(void **state)
{
	(void)state;
	struct kvpool *p = kvpool_new(NBI / 2, BS, NL, KVD);
	assert_non_null(p);
	enum { N = NBI / 2 };
	int refs[N] = { 0 };
	uint64_t name[N] = { 0 };
	int lru[N], n_lru = 0;  /* free named blocks, oldest first */
	uint64_t rng = 99, next_name = 0x1000, dropped = 0;
	int max_lru = 0;
	int32_t t[BS];
	for (int step = 0; step < 30000; step++) {
		uint64_t r = splitmix(&rng);
		/* by weight: alloc 4, unref 5, ref 1, name 3, unname 1, lookup 2 */
		static const int8_t ops[16] = { 0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 3, 3, 3, 4, 5, 5 };
		int b = (int)((r >> 8) % N), op = ops[r % 16];
		if (op == 0) {  /* alloc */
			int plain = 0;
			for (int i = 0; i < N; i++)
				plain += refs[i] == 0 && !name[i];
			int32_t got = kvpool_alloc(p);
			if (plain == 0 && n_lru == 0) {
				assert_int_equal(got, -ENOSPC);
				continue;
			}
			assert_true(got >= 0 && got < N);
			assert_int_equal(refs[got], 0);
			if (plain) {
				assert_true(name[got] == 0);
			} else {
				assert_int_equal(got, lru[0]);
				memmove(lru, lru + 1, (size_t)--n_lru * sizeof(int));
				name[got] = 0;
				dropped++;
			}
			refs[got] = 1;
		} else if (op == 1 && refs[b] > 0) {  /* unref */
			kvpool_unref(p, b);
			if (--refs[b] == 0 && name[b])
				lru[n_lru++] = b;
		} else if (op == 2 && refs[b] > 0) {  /* another reference */
			kvpool_ref(p, b);
			refs[b]++;
		} else if (op == 3 && refs[b] > 0 && !name[b]) {  /* name a held block */
			name[b] = next_name++;
			toks(t, BS, (uint32_t)name[b]);
			kvpool_name(p, b, name[b], name[b] ^ 0xff, 3, t);
		} else if (op == 4 && name[b]) {  /* unname, held or free */
			kvpool_unname(p, b);
			if (refs[b] == 0) {
				int i = 0;
				while (lru[i] != b)
					i++;
				memmove(lru + i, lru + i + 1, (size_t)(--n_lru - i) * sizeof(int));
			}
			name[b] = 0;
		} else if (op == 5 && name[b]) {  /* found and taken by reference */
			toks(t, BS, (uint32_t)name[b]);
			assert_int_equal(kvpool_lookup(p, name[b], name[b] ^ 0xff, 3, t), b);
			kvpool_ref(p, b);
			if (refs[b]++ == 0) {
				int i = 0;
				while (lru[i] != b)
					i++;
				memmove(lru + i, lru + i + 1, (size_t)(--n_lru - i) * sizeof(int));
			}
		}
		int n_free = 0;
		for (int i = 0; i < N; i++) {
			assert_int_equal(p->refs[i], refs[i]);
			assert_true(p->name[i] == name[i]);
			n_free += refs[i] == 0;
		}
		assert_int_equal(kvpool_n_free(p), n_free);
		assert_int_equal(kvpool_n_cached(p), n_lru);
		max_lru = n_lru > max_lru ? n_lru : max_lru;
		assert_int_equal(p->names_dropped, dropped);
		int i = 0;
		for (int32_t x = p->lru_head; x >= 0; x = p->lru_next[x])
			assert_int_equal(x, lru[i++]);
		assert_int_equal(i, n_lru);
		if (step % 128 == 0)
			check_names(p);
	}
	/* named blocks were taken for other use, from a list of several */
	assert_true(dropped > 200);
	assert_true(max_lru >= 6);
	check_names(p);
	kvpool_free(p);
}

/* kvseq_from_host counts free named blocks as free and takes them when no
 * plain one is left: their names go before their bytes are overwritten. */
static void test_from_host_takes_named(void **state)
{
	(void)state;
	struct kvpool *p = pool_new();
	struct kvseq hold = { 0 }, s = { 0 };
	struct kvseq *all[] = { &hold, &s };
	assert_int_equal(kvseq_prepare(p, &hold, (NB - 3) * BS, 0), 0);
	int32_t nb[3], t[3][BS];
	for (int i = 0; i < 3; i++) {
		nb[i] = kvpool_alloc(p);
		toks(t[i], BS, (uint32_t)i);
		kvpool_name(p, nb[i], 0x70 + (uint64_t)i, 0, 4, t[i]);
		block_fill(p, nb[i], 5.0f);
	}
	for (int i = 0; i < 3; i++)
		kvpool_unref(p, nb[i]);
	assert_int_equal(kvpool_n_free(p), 3);
	assert_int_equal(kvpool_n_cached(p), 3);
	size_t bb = kt_kv_block_bytes(&p->kv);
	float *src = malloc(4 * bb);
	assert_non_null(src);
	for (size_t k = 0; k < 4 * bb / sizeof(float); k++)
		src[k] = 1000.0f + (float)(k / (bb / sizeof(float))) * 1000.0f +
			 (float)(k % (bb / sizeof(float)));
	/* 4 blocks with 3 free: refused, nothing dropped */
	assert_int_equal(kvseq_from_host(p, &s, src, 4), -ENOSPC);
	assert_int_equal(s.n_blocks, 0);
	assert_int_equal(p->names_dropped, 0);
	assert_int_equal(kvpool_n_cached(p), 3);
	/* 2: the two freed first lose their names, the third stays */
	assert_int_equal(kvseq_from_host(p, &s, src, 2), 0);
	assert_int_equal(s.n_blocks, 2);
	assert_int_equal(p->names_dropped, 2);
	assert_int_equal(kvpool_n_cached(p), 1);
	assert_int_equal(kvpool_lookup(p, 0x70, 0, 4, t[0]), -1);
	assert_int_equal(kvpool_lookup(p, 0x71, 0, 4, t[1]), -1);
	assert_int_equal(kvpool_lookup(p, 0x72, 0, 4, t[2]), nb[2]);
	assert_true(block_is(p, s.blocks[0], 1.0f));
	assert_true(block_is(p, s.blocks[1], 2.0f));
	assert_true(block_is(p, nb[2], 5.0f));
	check_seqs(p, all, 2);
	free(src);
	kvseq_release(p, &s);
	kvseq_release(p, &hold);
	check_names(p);
	kvpool_free(p);
}

/* kvseq_prepare over a named block: one the sequence alone holds loses its
 * name (its content is about to change); a shared one is copied and keeps
 * its name for the others. */
static void test_prepare_named(void **state)
{
	(void)state;
	struct kvpool *p = pool_new();
	struct kvseq s = { 0 }, d = { 0 };
	struct kvseq *all[] = { &s, &d };
	int32_t t[3][BS];
	assert_int_equal(kvseq_prepare(p, &s, 3 * BS, 0), 0);
	for (int i = 0; i < 3; i++) {
		toks(t[i], BS, (uint32_t)i);
		kvpool_name(p, s.blocks[i], 0x100 + (uint64_t)i, 0xff + (uint64_t)i, 1, t[i]);
		block_fill(p, s.blocks[i], (float)(i + 1));
	}
	int32_t s0 = s.blocks[0], s1 = s.blocks[1], s2 = s.blocks[2];
	/* growing (writing past the named blocks) keeps every name */
	assert_int_equal(kvseq_prepare(p, &s, 3 * BS + 1, 3 * BS), 0);
	for (int i = 0; i < 3; i++)
		assert_true(p->name[s.blocks[i]] == 0x100 + (uint64_t)i);
	assert_true(p->name[s.blocks[3]] == 0);
	check_seqs(p, all, 2);
	/* writing from inside block 1: blocks 1 and 2 lose their names */
	assert_int_equal(kvseq_prepare(p, &s, 3 * BS + 1, BS + 1), 0);
	assert_int_equal(s.blocks[1], s1);
	assert_int_equal(s.blocks[2], s2);
	assert_int_equal(p->cow_copies, 0);
	assert_true(p->name[s0] == 0x100);
	assert_true(p->name[s1] == 0);
	assert_true(p->name[s2] == 0);
	assert_int_equal(kvpool_lookup(p, 0x101, 0x100, 1, t[1]), -1);
	assert_int_equal(kvpool_lookup(p, 0x102, 0x101, 1, t[2]), -1);
	assert_int_equal(kvpool_lookup(p, 0x100, 0xff, 1, t[0]), s0);
	check_seqs(p, all, 2);
	/* shared and named: a copy for the writer, the name stays */
	kvpool_name(p, s1, 0x101, 0x100, 1, t[1]);
	assert_int_equal(kvseq_fork(p, &d, &s), 0);
	assert_int_equal(kvseq_prepare(p, &d, 2 * BS, BS), 0);
	assert_int_equal(p->cow_copies, 1);
	int32_t c = d.blocks[1];
	assert_true(c != s1);
	assert_true(p->name[c] == 0);
	assert_true(p->name[s1] == 0x101);
	assert_int_equal(kvpool_lookup(p, 0x101, 0x100, 1, t[1]), s1);
	assert_true(block_is(p, c, 2.0f));
	assert_int_equal(p->refs[s1], 1);
	assert_int_equal(d.blocks[0], s0);  /* not written: still shared */
	assert_int_equal(p->refs[s0], 2);
	assert_true(p->name[s0] == 0x100);
	check_seqs(p, all, 2);
	/* s now holds block 1 alone: writing it unnames it */
	assert_int_equal(kvseq_prepare(p, &s, 2 * BS, BS), 0);
	assert_int_equal(s.blocks[1], s1);
	assert_true(p->name[s1] == 0);
	assert_int_equal(p->cow_copies, 1);
	/* a refused prepare leaves names as they were */
	struct kvseq fill = { 0 };
	struct kvseq *all3[] = { &s, &d, &fill };
	assert_int_equal(kvseq_prepare(p, &fill, kvpool_n_free(p) * BS, 0), 0);
	assert_int_equal(kvseq_prepare(p, &d, 2 * BS, 0), -ENOSPC);  /* s0 needs a copy */
	assert_true(p->name[s0] == 0x100);
	check_seqs(p, all3, 3);
	kvseq_release(p, &fill);
	kvseq_release(p, &d);
	kvseq_release(p, &s);
	assert_int_equal(kvpool_n_free(p), NB);
	assert_int_equal(kvpool_n_cached(p), 1);  /* s0 */
	check_names(p);
	kvpool_free(p);
}

/*
 * kvpool_release_free gives back the pages of plain free blocks but not
 * those of free named ones: their K/V is still to be found (blocks of 2
 * pages: 2 layers x K,V x 16 positions x 32 floats = 8 KiB).
 */
static void test_release_keeps_named(void **state)
{
	(void)state;
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	struct kvpool *p = kvpool_new(8, 16, 2, 32);
	assert_non_null(p);
	size_t bb = kt_kv_block_bytes(&p->kv);
	assert_int_equal(bb, 8192);
	if (bb % pg != 0) {
		kvpool_free(p);
		skip();
	}
	int32_t b[4], t[16] = { 0 };
	for (int i = 0; i < 4; i++) {
		b[i] = kvpool_alloc(p);
		memset(kvpool_host_block(p, b[i]), 0x30 + i, bb);
	}
	kvpool_name(p, b[1], 0xbeef, 1, 2, t);
	for (int i = 0; i < 4; i++)
		kvpool_unref(p, b[i]);
	assert_int_equal(kvpool_n_cached(p), 1);
	assert_int_equal(kvpool_release_free(p), 3 * bb);
	const uint8_t *named = kvpool_host_block(p, b[1]);
	assert_int_equal(resident(named, bb), bb / pg);
	for (size_t k = 0; k < bb; k++)
		assert_int_equal(named[k], 0x31);
	for (int i = 0; i < 4; i++) {
		if (i == 1)
			continue;
		const uint8_t *q = kvpool_host_block(p, b[i]);
		assert_int_equal(resident(q, bb), 0);
		assert_int_equal(q[0], 0);  /* given back: reads as zero pages */
		assert_int_equal(q[bb - 1], 0);
	}
	assert_int_equal(kvpool_lookup(p, 0xbeef, 1, 2, t), b[1]);
	/* nothing new to give back */
	assert_int_equal(kvpool_release_free(p), 0);
	assert_int_equal(named[100], 0x31);
	/* once unnamed it is an ordinary free block */
	kvpool_unname(p, b[1]);
	assert_int_equal(kvpool_release_free(p), bb);
	assert_int_equal(resident(named, bb), 0);
	assert_int_equal(named[0], 0);
	/* every block free and unnamed: the names' pages went back too (the
	 * load test's RSS after a burst), and read as no name */
	assert_int_equal(resident(p->tok, 16 * sizeof(int32_t) * (size_t)p->kv.n_blocks), 0);
	assert_int_equal(resident(p->name, sizeof(uint64_t) * (size_t)p->kv.n_blocks), 0);
	assert_int_equal(kvpool_lookup(p, 0xbeef, 1, 2, t), -1);
	check_names(p);
	kvpool_free(p);
}

/* The same where blocks share pages (f16 stories260K shape, 2.5 pages a
 * block): the pages a free named block shares with free neighbours stay. */
static void test_release_keeps_named_shared_pages(void **state)
{
	(void)state;
	struct kvpool *p = kvpool_new_typed(NULL, KT_F16, 8, 16, 16, 5, 32);
	assert_non_null(p);
	size_t bb = kt_kv_block_bytes(&p->kv), all = bb * 16, pg = (size_t)sysconf(_SC_PAGESIZE);
	int32_t t[16] = { 0 };
	for (int i = 0; i < 16; i++) {
		assert_int_equal(kvpool_alloc(p), i);
		memset(kt_kv_block(&p->kv, i), 0x40 + i, bb);
	}
	kvpool_name(p, 5, 0x5, 1, 2, t);
	for (int i = 0; i < 16; i++)
		kvpool_unref(p, i);
	kvpool_release_free(p);
	size_t lo = 5 * bb / pg, hi = (6 * bb + pg - 1) / pg;
	assert_int_equal(resident(p->kv.base, all), hi - lo);
	const uint8_t *q = kt_kv_block(&p->kv, 5);
	for (size_t k = 0; k < bb; k++)
		assert_int_equal(q[k], 0x45);
	kvpool_free(p);
}

/* kvseq_attach: append (i == n_blocks) or replace (i < n_blocks), taking a
 * reference and releasing the block replaced; a free named block leaves
 * the cached list. */
static void test_attach(void **state)
{
	(void)state;
	struct kvpool *p = pool_new();
	struct kvseq s = { 0 }, o = { 0 };
	struct kvseq *all[] = { &s, &o };
	assert_int_equal(kvseq_prepare(p, &o, 2 * BS, 0), 0);
	int32_t o0 = o.blocks[0], o1 = o.blocks[1];
	/* append another sequence's block */
	assert_int_equal(kvseq_attach(p, &s, 0, o0), 0);
	assert_int_equal(s.n_blocks, 1);
	assert_int_equal(s.blocks[0], o0);
	assert_int_equal(p->refs[o0], 2);
	assert_int_equal(kvpool_n_free(p), NB - 2);
	check_seqs(p, all, 2);
	/* append a free named block: it leaves the cached list */
	int32_t f = kvpool_alloc(p), tf[BS];
	toks(tf, BS, 5);
	kvpool_name(p, f, 0xf, 0, 1, tf);
	kvpool_unref(p, f);
	assert_int_equal(kvpool_n_cached(p), 1);
	assert_int_equal(kvpool_n_free(p), NB - 2);
	assert_int_equal(kvseq_attach(p, &s, 1, kvpool_lookup(p, 0xf, 0, 1, tf)), 0);
	assert_int_equal(s.n_blocks, 2);
	assert_int_equal(s.blocks[1], f);
	assert_int_equal(p->refs[f], 1);
	assert_int_equal(kvpool_n_cached(p), 0);
	assert_int_equal(kvpool_n_free(p), NB - 3);
	assert_true(p->name[f] == 0xf);
	check_seqs(p, all, 2);
	/* replace a shared block: it only loses a reference */
	assert_int_equal(kvseq_attach(p, &s, 0, o1), 0);
	assert_int_equal(s.n_blocks, 2);
	assert_int_equal(s.blocks[0], o1);
	assert_int_equal(p->refs[o0], 1);
	assert_int_equal(p->refs[o1], 2);
	assert_int_equal(kvpool_n_free(p), NB - 3);
	check_seqs(p, all, 2);
	/* replace the block s alone held, named: back to the cached list */
	assert_int_equal(kvseq_attach(p, &s, 1, o0), 0);
	assert_int_equal(p->refs[f], 0);
	assert_int_equal(kvpool_n_cached(p), 1);
	assert_int_equal(kvpool_lookup(p, 0xf, 0, 1, tf), f);
	assert_int_equal(kvpool_n_free(p), NB - 2);
	check_seqs(p, all, 2);
	/* replace an unnamed block s alone held: the plain free list */
	int32_t g = kvpool_alloc(p);
	assert_int_equal(kvseq_attach(p, &s, 2, g), 0);
	kvpool_unref(p, g);  /* s's reference is the only one now */
	assert_int_equal(p->refs[g], 1);
	assert_int_equal(kvseq_attach(p, &s, 2, o1), 0);
	assert_int_equal(p->refs[g], 0);
	assert_int_equal(kvpool_n_cached(p), 1);
	check_seqs(p, all, 2);
	/* a block attached where it already is: nothing changes */
	assert_int_equal(kvseq_attach(p, &s, 0, o1), 0);
	assert_int_equal(p->refs[o1], 3);
	assert_int_equal(s.n_blocks, 3);
	check_seqs(p, all, 2);
	/* appends past the table's first capacity */
	for (int i = 3; i < 20; i++) {
		assert_int_equal(kvseq_attach(p, &s, i, o0), 0);
		assert_int_equal(s.n_blocks, i + 1);
	}
	assert_true(s.cap >= 20);
	assert_int_equal(p->refs[o0], 19);
	check_seqs(p, all, 2);
	kvseq_release(p, &s);
	kvseq_release(p, &o);
	assert_int_equal(kvpool_n_free(p), NB);
	check_names(p);
	kvpool_free(p);
}

/* kvpool_mark: once per block per epoch; a new epoch forgets the marks,
 * also when the epoch counter wraps. */
static void test_mark(void **state)
{
	(void)state;
	struct kvpool *p = pool_new();
	uint32_t e = kvpool_mark_epoch(p);
	assert_true(e != 0);
	assert_int_equal(kvpool_mark(p, 5), 1);
	assert_int_equal(kvpool_mark(p, 5), 0);
	assert_int_equal(kvpool_mark(p, 0), 1);
	assert_int_equal(kvpool_mark(p, 0), 0);
	uint32_t e2 = kvpool_mark_epoch(p);
	assert_true(e2 != e && e2 != 0);
	assert_int_equal(kvpool_mark(p, 0), 1);
	assert_int_equal(kvpool_mark(p, 0), 0);
	/* block 5 was last marked in epoch e: after 2^32 epochs the counter
	 * comes back to e, and 5 must not read as marked */
	p->mark_epoch = UINT32_MAX - 1;
	assert_int_equal(kvpool_mark_epoch(p), UINT32_MAX);
	assert_int_equal(kvpool_mark(p, 3), 1);
	uint32_t w = kvpool_mark_epoch(p);
	assert_true(w != 0 && w != UINT32_MAX);
	assert_int_equal(kvpool_mark(p, 5), 1);
	assert_int_equal(kvpool_mark(p, 3), 1);
	assert_int_equal(kvpool_mark(p, 0), 1);
	for (int b = 0; b < NB; b++)
		kvpool_mark(p, b);
	for (int b = 0; b < NB; b++)
		assert_int_equal(kvpool_mark(p, b), 0);
	kvpool_free(p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_new_free),
		cmocka_unit_test(test_alloc_until_enospc),
		cmocka_unit_test(test_refcounts),
		cmocka_unit_test(test_prepare_grows),
		cmocka_unit_test(test_fork_cow),
		cmocka_unit_test(test_fork_at_boundary),
		cmocka_unit_test(test_truncate_release),
		cmocka_unit_test(test_prepare_enospc),
		cmocka_unit_test(test_release_shared_pages),
		cmocka_unit_test(test_name_lookup),
		cmocka_unit_test(test_name_collisions),
		cmocka_unit_test(test_name_stress),
		cmocka_unit_test(test_cached_list),
		cmocka_unit_test(test_alloc_named_last),
		cmocka_unit_test(test_free_lists_stress),
		cmocka_unit_test(test_from_host_takes_named),
		cmocka_unit_test(test_prepare_named),
		cmocka_unit_test(test_release_keeps_named),
		cmocka_unit_test(test_release_keeps_named_shared_pages),
		cmocka_unit_test(test_attach),
		cmocka_unit_test(test_mark),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}

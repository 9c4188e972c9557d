/*
 * tests/unit/test_kvpool.c — the paged KV block pool and per-sequence block
 * tables (session/kvpool.c): allocation, refcounts, growth, fork with
 * copy-on-write, truncate/release, and -ENOSPC leaving state unchanged.
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
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * session/kvpool.h — the paged KV block pool and per-sequence block tables.
 *
 * One allocation holds every block (layout in kernels/backend.h, struct
 * kt_kv). Blocks are refcounted: a fork shares all of a sequence's blocks,
 * and a shared block is copied only when a sequence is about to write into it
 * (copy-on-write), so forking copies no KV.
 *
 * Blocks can also carry a name (prefix sharing, session/session.c): a full
 * block's content named by a hash chain (the previous block's name and its
 * tokens, the first seeded by owner, template, model and KV type). The pool
 * keeps an index name -> block and, per named block, what the name was made
 * of (parent name, owner, tokens), which every lookup compares: a block is
 * only ever found by the owner and the exact token prefix that made it. A
 * named block whose last reference goes stays reusable (kvpool_lookup finds
 * it) on a least-recently-freed list; it counts as free, and
 * kvpool_alloc takes it, forgetting the name, only when no unnamed block is
 * left. A block about to be written (kvseq_prepare) loses its name.
 */
#ifndef LLAMAD_SESSION_KVPOOL_H
#define LLAMAD_SESSION_KVPOOL_H

#include <stdint.h>

#include "kernels/backend.h"

/* Positions per KV block: the daemon's pool and one-shot runs use this. */
#define KV_BLOCK_TOKENS 16

struct kvpool {
	struct kt_kv kv;
	struct backend *be;   /* owner of kv.base's memory; NULL: host malloc */
	int32_t *refs;        /* (n_blocks) */
	int32_t *free_list;   /* stack of free block ids */
	int n_free;
	uint64_t cow_copies;  /* blocks copied by copy-on-write */
	uint8_t *touched;     /* (n_blocks) handed out since the last release */
	int n_plain;          /* free_list entries (free blocks without a name) */
	/* names (prefix sharing) */
	uint64_t *name;       /* (n_blocks) 0: none */
	uint64_t *parent;     /* (n_blocks) the name of the block before (or the seed) */
	uint32_t *owner;      /* (n_blocks) uid */
	int32_t *tok;         /* (n_blocks x block_size) the tokens it holds */
	int32_t *index;       /* open addressing over names: block id or -1 */
	uint32_t index_mask;
	int32_t *lru_prev, *lru_next;  /* free named blocks, oldest first */
	int32_t lru_head, lru_tail;
	int n_lru;
	uint32_t *freed_at;   /* (n_blocks) now_s when a named block became free */
	uint32_t now_s;       /* the owner's clock, seconds (set by the caller) */
	uint64_t names_dropped;  /* free named blocks taken for other use */
	uint32_t *mark;       /* (n_blocks) scratch of kvpool_mark_epoch */
	uint32_t mark_epoch;
};

/* A sequence's block table: blocks[i] holds positions [i*bs, (i+1)*bs). */
struct kvseq {
	int32_t *blocks;
	int n_blocks;
	int cap;
};

/* Pool of n_blocks blocks of block_size positions for n_layers x kv_dim,
 * in host memory. Returns NULL on ENOMEM. */
struct kvpool *kvpool_new(int n_blocks, int block_size, int n_layers, int kv_dim);
/* The same in the backend memory of be (device memory on CUDA). */
struct kvpool *kvpool_new_on(struct backend *be, int n_blocks, int block_size,
			     int n_layers, int kv_dim);
/* The same with elements of dtype (KT_F32, KT_F16, KT_Q8_0: the layout of
 * kernels/backend.h) for heads of head_dim channels. NULL also when dtype
 * is not available for that shape (kt_kv_dtype_ok; typed stores need
 * block_size 16). */
struct kvpool *kvpool_new_typed(struct backend *be, enum kt_dtype dtype, int head_dim,
				int n_blocks, int block_size, int n_layers, int kv_dim);
/* Block b's bytes in host memory, or NULL when the pool lives on a device
 * (then use kvpool_get_block / kvpool_put_block). */
void *kvpool_host_block(const struct kvpool *p, int32_t b);
/* Copy block b out to host memory / in from host memory
 * (kt_kv_block_bytes each). 0 or -EIO (the device failed). */
int kvpool_get_block(const struct kvpool *p, int32_t b, void *dst);
int kvpool_put_block(struct kvpool *p, int32_t b, const void *src);
/* Free; accepts NULL. */
void kvpool_free(struct kvpool *p);
/* Take a free block (refcount 1). Returns its id or -ENOSPC. */
int32_t kvpool_alloc(struct kvpool *p);
/* Add / drop one reference; the block returns to the free list at zero. */
void kvpool_ref(struct kvpool *p, int32_t b);
void kvpool_unref(struct kvpool *p, int32_t b);
/* Give the pages of free blocks used since the last call back to the
 * system (host pools; a no-op on a device). Returns the bytes released. */
size_t kvpool_release_free(struct kvpool *p);
/* Blocks not in use (free named blocks included: they are taken when
 * needed). */
static inline int kvpool_n_free(const struct kvpool *p) { return p->n_free; }
/* Free blocks that still hold a named prefix. */
static inline int kvpool_n_cached(const struct kvpool *p) { return p->n_lru; }
/* Forget the names of free blocks freed at least age_s seconds ago (by
 * now_s), oldest first: they become plain free blocks, whose pages
 * kvpool_release_free gives back. Returns how many. */
int kvpool_expire_cached(struct kvpool *p, uint32_t age_s);
/* Seconds until the oldest free named block is age_s old (0: now; -1:
 * there is none). */
long kvpool_next_expiry(const struct kvpool *p, uint32_t age_s);

/* Name block b (full, written, unnamed, and no other block of that name):
 * `name` made from `parent` and its block_size tokens, for owner. */
void kvpool_name(struct kvpool *p, int32_t b, uint64_t name, uint64_t parent, uint32_t owner,
		 const int32_t *tokens);
/* Forget b's name (a no-op if it has none). A free named block becomes
 * an ordinary free one. */
void kvpool_unname(struct kvpool *p, int32_t b);
/* The block named `name` made from exactly parent, owner and tokens, or -1.
 * Takes no reference (kvseq_attach does). */
int32_t kvpool_lookup(const struct kvpool *p, uint64_t name, uint64_t parent, uint32_t owner,
		      const int32_t *tokens);
/* A new epoch for kvpool_mark (the marks are cleared when the counter wraps). */
static inline uint32_t kvpool_mark_epoch(struct kvpool *p)
{
	if (++p->mark_epoch == 0) {
		for (int i = 0; i < p->kv.n_blocks; i++)
			p->mark[i] = 0;
		p->mark_epoch = 1;
	}
	return p->mark_epoch;
}
/* 1 the first time b is marked in the current epoch, then 0. */
static inline int kvpool_mark(struct kvpool *p, int32_t b)
{
	if (p->mark[b] == p->mark_epoch)
		return 0;
	p->mark[b] = p->mark_epoch;
	return 1;
}

/* Make seq cover positions [0, n_pos) and make every block that holds a
 * position >= write_from exclusively owned (copying shared ones). On -ENOSPC
 * (or -EIO from a failed device copy) the sequence is left as it was. */
int kvseq_prepare(struct kvpool *p, struct kvseq *s, int n_pos, int write_from);
/* Share all of src's blocks with dst (dst must be empty). */
int kvseq_fork(struct kvpool *p, struct kvseq *dst, const struct kvseq *src);
/* Make block b (any block: free named ones leave the free list) the i-th
 * of s, i <= s->n_blocks, taking a reference; a block s held there is
 * released. 0 or -ENOMEM. */
int kvseq_attach(struct kvpool *p, struct kvseq *s, int i, int32_t b);
/* Keep only the blocks covering [0, n_pos); release the rest. */
void kvseq_truncate(struct kvpool *p, struct kvseq *s, int n_pos);
/* Release every block and the table itself. */
void kvseq_release(struct kvpool *p, struct kvseq *s);
/* Copy s's blocks, in table order, to host memory at dst (s->n_blocks x
 * kt_kv_block_bytes); s is unchanged. 0 or -EIO (the device failed). */
int kvseq_to_host(const struct kvpool *p, const struct kvseq *s, void *dst);
/* Fill the empty sequence s with n_blocks new blocks holding the bytes at
 * src (as kvseq_to_host wrote them). 0, -ENOSPC (fewer free blocks than
 * n_blocks), -ENOMEM or -EIO; on error s stays empty and no block is kept. */
int kvseq_from_host(struct kvpool *p, struct kvseq *s, const void *src, int n_blocks);

#endif

/*
 * session/kvpool.h — the paged KV block pool and per-sequence block tables.
 *
 * One allocation holds every block (layout in kernels/backend.h, struct
 * kt_kv). Blocks are refcounted: a fork shares all of a sequence's blocks,
 * and a shared block is copied only when a sequence is about to write into it
 * (copy-on-write), so forking copies no KV.
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
/* Blocks not in use. */
static inline int kvpool_n_free(const struct kvpool *p) { return p->n_free; }

/* Make seq cover positions [0, n_pos) and make every block that holds a
 * position >= write_from exclusively owned (copying shared ones). On -ENOSPC
 * (or -EIO from a failed device copy) the sequence is left as it was. */
int kvseq_prepare(struct kvpool *p, struct kvseq *s, int n_pos, int write_from);
/* Share all of src's blocks with dst (dst must be empty). */
int kvseq_fork(struct kvpool *p, struct kvseq *dst, const struct kvseq *src);
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

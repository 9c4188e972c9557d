/*
 * session/kvpool.c — see kvpool.h.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "session/kvpool.h"
#include "util/grow.h"

struct kvpool *kvpool_new_typed(struct backend *be, enum kt_dtype dtype, int head_dim,
				int n_blocks, int block_size, int n_layers, int kv_dim)
{
	if (n_blocks <= 0 || block_size <= 0 || n_layers <= 0 || kv_dim <= 0)
		return NULL;
	if (dtype != KT_F32 && (block_size != 16 || head_dim <= 0 || kv_dim % head_dim != 0 ||
				!kt_kv_dtype_ok(dtype, head_dim)))
		return NULL;
	struct kvpool *p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	p->be = be && !be->host_mem ? be : NULL;
	p->kv.n_blocks = n_blocks;
	p->kv.block_size = block_size;
	p->kv.n_layers = n_layers;
	p->kv.kv_dim = kv_dim;
	p->kv.dtype = dtype;
	p->kv.group = dtype == KT_Q8_0 ? kt_kv_group_for(head_dim) : 0;
	size_t bytes = kt_kv_block_bytes(&p->kv) * (size_t)n_blocks;
	if (p->be)
		p->kv.base = p->be->ops->mem_alloc(p->be, bytes);
	else {
		/* page-aligned, so a block of whole pages gives all of them
		 * back in kvpool_release_free (at 64 bytes the pages each block
		 * shares with its neighbours stayed resident) */
		size_t pg = (size_t)sysconf(_SC_PAGESIZE);
		p->kv.base = aligned_alloc(pg, (bytes + pg - 1) & ~(pg - 1));
	}
	p->refs = calloc((size_t)n_blocks, sizeof(int32_t));
	p->touched = calloc((size_t)n_blocks, 1);
	p->free_list = malloc((size_t)n_blocks * sizeof(int32_t));
	if (!p->kv.base || !p->refs || !p->free_list || !p->touched) {
		kvpool_free(p);
		return NULL;
	}
	for (int i = 0; i < n_blocks; i++)
		p->free_list[i] = n_blocks - 1 - i;  /* block 0 is taken first */
	p->n_free = n_blocks;
	return p;
}

struct kvpool *kvpool_new_on(struct backend *be, int n_blocks, int block_size,
			     int n_layers, int kv_dim)
{
	return kvpool_new_typed(be, KT_F32, 0, n_blocks, block_size, n_layers, kv_dim);
}

struct kvpool *kvpool_new(int n_blocks, int block_size, int n_layers, int kv_dim)
{
	return kvpool_new_on(NULL, n_blocks, block_size, n_layers, kv_dim);
}

void kvpool_free(struct kvpool *p)
{
	if (!p)
		return;
	if (p->be)
		p->be->ops->mem_free(p->be, p->kv.base);
	else
		free(p->kv.base);
	free(p->refs);
	free(p->touched);
	free(p->free_list);
	free(p);
}

/* Are blocks [lo, hi] all free (those past the pool: its page padding)? */
static int range_free(const struct kvpool *p, uintptr_t lo, intptr_t hi)
{
	for (intptr_t i = (intptr_t)lo; i <= hi; i++)
		if (i < p->kv.n_blocks && p->refs[i] != 0)
			return 0;
	return 1;
}

size_t kvpool_release_free(struct kvpool *p)
{
	if (p->be)
		return 0;
	size_t bb = kt_kv_block_bytes(&p->kv), page = (size_t)sysconf(_SC_PAGESIZE), done = 0;
	for (int i = 0; i < p->n_free; i++) {
		int32_t b = p->free_list[i];
		if (!p->touched[b])
			continue;
		p->touched[b] = 0;
		/* the whole pages inside the block, and the pages it shares with
		 * neighbours when they are free too (an f16 block of stories260K
		 * is 2.5 pages) */
		uintptr_t base = (uintptr_t)p->kv.base;
		uintptr_t a = (uintptr_t)kt_kv_block(&p->kv, b), e = a + bb;
		uintptr_t a0 = a & ~(uintptr_t)(page - 1), e0 = (e + page - 1) & ~(uintptr_t)(page - 1);
		a = (a + page - 1) & ~(uintptr_t)(page - 1);
		e &= ~(uintptr_t)(page - 1);
		if (a0 < a && range_free(p, (a0 - base) / bb, b - 1))
			a = a0;
		if (e0 > e && range_free(p, b + 1, (e0 - 1 - base) / bb))
			e = e0;
		if (e > a && madvise((void *)a, e - a, MADV_DONTNEED) == 0)
			done += e - a;
	}
	return done;
}

void *kvpool_host_block(const struct kvpool *p, int32_t b)
{
	return p->be ? NULL : kt_kv_block(&p->kv, b);
}

int kvpool_get_block(const struct kvpool *p, int32_t b, void *dst)
{
	size_t bb = kt_kv_block_bytes(&p->kv);
	if (!p->be) {
		memcpy(dst, kt_kv_block(&p->kv, b), bb);
		return 0;
	}
	return p->be->ops->download(p->be, dst, kt_kv_block(&p->kv, b), bb);
}

int kvpool_put_block(struct kvpool *p, int32_t b, const void *src)
{
	size_t bb = kt_kv_block_bytes(&p->kv);
	if (!p->be) {
		memcpy(kt_kv_block(&p->kv, b), src, bb);
		return 0;
	}
	return p->be->ops->upload(p->be, kt_kv_block(&p->kv, b), src, bb);
}

int32_t kvpool_alloc(struct kvpool *p)
{
	if (p->n_free == 0)
		return -ENOSPC;
	int32_t b = p->free_list[--p->n_free];
	p->refs[b] = 1;
	p->touched[b] = 1;
	return b;
}

void kvpool_ref(struct kvpool *p, int32_t b)
{
	p->refs[b]++;
}

void kvpool_unref(struct kvpool *p, int32_t b)
{
	if (--p->refs[b] == 0)
		p->free_list[p->n_free++] = b;
}

static int seq_grow(struct kvseq *s, int n)
{
	size_t cap = (size_t)s->cap;
	int rc = grow(&s->blocks, &cap, (size_t)n, sizeof(int32_t), 8);
	s->cap = (int)cap;
	return rc;
}

int kvseq_prepare(struct kvpool *p, struct kvseq *s, int n_pos, int write_from)
{
	int bs = p->kv.block_size;
	int need = (n_pos + bs - 1) / bs;
	int first_w = write_from / bs;
	if (seq_grow(s, need) != 0)
		return -ENOMEM;
	/* count blocks needed: new ones plus copies of shared ones */
	int want = need > s->n_blocks ? need - s->n_blocks : 0;
	for (int i = first_w; i < s->n_blocks && i < need; i++)
		want += p->refs[s->blocks[i]] > 1;
	if (want > p->n_free)
		return -ENOSPC;
	size_t bb = kt_kv_block_bytes(&p->kv);
	for (int i = first_w; i < s->n_blocks && i < need; i++) {
		int32_t old = s->blocks[i];
		if (p->refs[old] <= 1)
			continue;
		int32_t nb = kvpool_alloc(p);
		if (p->be) {
			if (p->be->ops->copy(p->be, kt_kv_block(&p->kv, nb),
					     kt_kv_block(&p->kv, old), bb) != 0) {
				kvpool_unref(p, nb);
				return -EIO;
			}
		} else {
			memcpy(kt_kv_block(&p->kv, nb), kt_kv_block(&p->kv, old), bb);
		}
		kvpool_unref(p, old);
		s->blocks[i] = nb;
		p->cow_copies++;
	}
	while (s->n_blocks < need)
		s->blocks[s->n_blocks++] = kvpool_alloc(p);
	return 0;
}

int kvseq_fork(struct kvpool *p, struct kvseq *dst, const struct kvseq *src)
{
	if (seq_grow(dst, src->n_blocks) != 0)
		return -ENOMEM;
	for (int i = 0; i < src->n_blocks; i++) {
		dst->blocks[i] = src->blocks[i];
		kvpool_ref(p, src->blocks[i]);
	}
	dst->n_blocks = src->n_blocks;
	return 0;
}

void kvseq_truncate(struct kvpool *p, struct kvseq *s, int n_pos)
{
	int bs = p->kv.block_size;
	int keep = (n_pos + bs - 1) / bs;
	while (s->n_blocks > keep)
		kvpool_unref(p, s->blocks[--s->n_blocks]);
}

void kvseq_release(struct kvpool *p, struct kvseq *s)
{
	kvseq_truncate(p, s, 0);
	free(s->blocks);
	s->blocks = NULL;
	s->cap = 0;
}

int kvseq_to_host(const struct kvpool *p, const struct kvseq *s, void *dst)
{
	size_t bb = kt_kv_block_bytes(&p->kv);
	for (int i = 0; i < s->n_blocks; i++)
		if (kvpool_get_block(p, s->blocks[i], (char *)dst + (size_t)i * bb) != 0)
			return -EIO;
	return 0;
}

int kvseq_from_host(struct kvpool *p, struct kvseq *s, const void *src, int n_blocks)
{
	if (n_blocks > p->n_free)
		return -ENOSPC;
	if (seq_grow(s, n_blocks ? n_blocks : 1) != 0)
		return -ENOMEM;
	size_t bb = kt_kv_block_bytes(&p->kv);
	for (int i = 0; i < n_blocks; i++) {
		s->blocks[s->n_blocks++] = kvpool_alloc(p);
		if (kvpool_put_block(p, s->blocks[i], (const char *)src + (size_t)i * bb) != 0) {
			kvseq_release(p, s);
			return -EIO;
		}
	}
	return 0;
}

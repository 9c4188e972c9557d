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

/* Zeroed, page-aligned, whole pages. */
static void *meta_alloc(size_t n, size_t size)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE), bytes = (n * size + pg - 1) & ~(pg - 1);
	void *m = aligned_alloc(pg, bytes ? bytes : pg);
	if (m)
		memset(m, 0, bytes ? bytes : pg);
	return m;
}

/* Give back the pages of array a (elem bytes per block, per_block of them)
 * whose blocks are all free and unnamed: read again they are zero, which
 * is what such a block's entries are worth (no name, mark 0 <
 * any epoch; the rest unused). */
static void meta_release(const struct kvpool *p, void *a, size_t elem)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE), total = (size_t)p->kv.n_blocks * elem;
	for (size_t off = 0; off < total; off += pg) {
		size_t b0 = off / elem, b1 = (off + pg - 1) / elem;  /* blocks on the page */
		int idle = 1;
		for (size_t b = b0; b <= b1 && b < (size_t)p->kv.n_blocks && idle; b++)
			idle = p->refs[b] == 0 && p->name[b] == 0;
		if (idle)
			madvise((char *)a + off, pg, MADV_DONTNEED);
	}
}

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
	size_t n = (size_t)n_blocks;
	p->refs = calloc(n, sizeof(int32_t));
	p->touched = calloc(n, 1);
	p->free_list = malloc(n * sizeof(int32_t));
	/* what names need, per block: page-aligned, so that the pages of
	 * free unnamed blocks go back with theirs (kvpool_release_free) */
	p->name = meta_alloc(n, sizeof(uint64_t));
	p->parent = meta_alloc(n, sizeof(uint64_t));
	p->owner = meta_alloc(n, sizeof(uint32_t));
	p->tok = meta_alloc(n * (size_t)block_size, sizeof(int32_t));
	p->lru_prev = meta_alloc(n, sizeof(int32_t));
	p->lru_next = meta_alloc(n, sizeof(int32_t));
	p->mark = meta_alloc(n, sizeof(uint32_t));
	p->freed_at = meta_alloc(n, sizeof(uint32_t));
	/* at most half full: short probe runs */
	uint32_t slots = 16;
	while (slots < 2 * n)
		slots *= 2;
	p->index = malloc(slots * sizeof(int32_t));
	p->index_mask = slots - 1;
	if (!p->kv.base || !p->refs || !p->free_list || !p->touched || !p->name || !p->parent ||
	    !p->owner || !p->tok || !p->lru_prev || !p->lru_next || !p->mark || !p->index ||
	    !p->freed_at) {
		kvpool_free(p);
		return NULL;
	}
	memset(p->index, 0xff, slots * sizeof(int32_t));
	for (int i = 0; i < n_blocks; i++)
		p->free_list[i] = n_blocks - 1 - i;  /* block 0 is taken first */
	p->n_free = p->n_plain = n_blocks;
	p->lru_head = p->lru_tail = -1;
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
	free(p->name);
	free(p->parent);
	free(p->owner);
	free(p->tok);
	free(p->index);
	free(p->lru_prev);
	free(p->lru_next);
	free(p->mark);
	free(p->freed_at);
	free(p);
}

/* ---- names ------------------------------------------------------------ */

static uint32_t slot_of(const struct kvpool *p, uint64_t name)
{
	return (uint32_t)(name ^ (name >> 32)) & p->index_mask;
}

static void lru_remove(struct kvpool *p, int32_t b)
{
	int32_t pr = p->lru_prev[b], nx = p->lru_next[b];
	if (pr >= 0)
		p->lru_next[pr] = nx;
	else
		p->lru_head = nx;
	if (nx >= 0)
		p->lru_prev[nx] = pr;
	else
		p->lru_tail = pr;
	p->n_lru--;
}

static void lru_push(struct kvpool *p, int32_t b)
{
	p->lru_prev[b] = p->lru_tail;
	p->lru_next[b] = -1;
	if (p->lru_tail >= 0)
		p->lru_next[p->lru_tail] = b;
	else
		p->lru_head = b;
	p->lru_tail = b;
	p->n_lru++;
}

void kvpool_name(struct kvpool *p, int32_t b, uint64_t name, uint64_t parent, uint32_t owner,
		 const int32_t *tokens)
{
	int bs = p->kv.block_size;
	uint32_t i = slot_of(p, name);
	while (p->index[i] >= 0)
		i = (i + 1) & p->index_mask;
	p->index[i] = b;
	p->name[b] = name;
	p->parent[b] = parent;
	p->owner[b] = owner;
	memcpy(p->tok + (size_t)b * (size_t)bs, tokens, (size_t)bs * sizeof(int32_t));
}

void kvpool_unname(struct kvpool *p, int32_t b)
{
	if (!p->name[b])
		return;
	uint32_t i = slot_of(p, p->name[b]);
	while (p->index[i] != b)
		i = (i + 1) & p->index_mask;
	/* backward-shift deletion: move later entries of the run into the hole
	 * when their home slot does not lie (cyclically) between hole and them */
	for (uint32_t j = i;;) {
		p->index[i] = -1;
		for (;;) {
			j = (j + 1) & p->index_mask;
			if (p->index[j] < 0)
				goto done;
			uint32_t home = slot_of(p, p->name[p->index[j]]);
			if (((j - home) & p->index_mask) >= ((j - i) & p->index_mask))
				break;
		}
		p->index[i] = p->index[j];
		i = j;
	}
done:
	p->name[b] = 0;
	if (p->refs[b] == 0) {  /* a free named block becomes a plain free one */
		lru_remove(p, b);
		p->free_list[p->n_plain++] = b;
	}
}

int kvpool_expire_cached(struct kvpool *p, uint32_t age_s)
{
	int n = 0;
	while (p->lru_head >= 0 && p->now_s - p->freed_at[p->lru_head] >= age_s) {
		kvpool_unname(p, p->lru_head);
		n++;
	}
	return n;
}

long kvpool_next_expiry(const struct kvpool *p, uint32_t age_s)
{
	if (p->lru_head < 0)
		return -1;
	uint32_t age = p->now_s - p->freed_at[p->lru_head];
	return age >= age_s ? 0 : (long)(age_s - age);
}

int32_t kvpool_lookup(const struct kvpool *p, uint64_t name, uint64_t parent, uint32_t owner,
		      const int32_t *tokens)
{
	int bs = p->kv.block_size;
	if (!name)
		return -1;
	for (uint32_t i = slot_of(p, name); p->index[i] >= 0; i = (i + 1) & p->index_mask) {
		int32_t b = p->index[i];
		if (p->name[b] == name && p->parent[b] == parent && p->owner[b] == owner &&
		    !memcmp(p->tok + (size_t)b * (size_t)bs, tokens, (size_t)bs * sizeof(int32_t)))
			return b;
	}
	return -1;
}

/* Are blocks [lo, hi] all free (those past the pool: its page padding)? */
static int range_free(const struct kvpool *p, uintptr_t lo, intptr_t hi)
{
	for (intptr_t i = (intptr_t)lo; i <= hi; i++)
		if (i < p->kv.n_blocks && (p->refs[i] != 0 || p->name[i]))
			return 0;
	return 1;
}

size_t kvpool_release_free(struct kvpool *p)
{
	if (p->be)
		return 0;
	size_t bb = kt_kv_block_bytes(&p->kv), page = (size_t)sysconf(_SC_PAGESIZE), done = 0;
	for (int i = 0; i < p->n_plain; i++) {  /* named free blocks keep their bytes */
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
	/* and the names' pages of blocks that are all free, unnamed (name
	 * last: the others test it); not counted in what is returned */
	size_t bs = (size_t)p->kv.block_size;
	meta_release(p, p->parent, sizeof(uint64_t));
	meta_release(p, p->owner, sizeof(uint32_t));
	meta_release(p, p->tok, bs * sizeof(int32_t));
	meta_release(p, p->lru_prev, sizeof(int32_t));
	meta_release(p, p->lru_next, sizeof(int32_t));
	meta_release(p, p->mark, sizeof(uint32_t));
	meta_release(p, p->freed_at, sizeof(uint32_t));
	meta_release(p, p->name, sizeof(uint64_t));
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
	if (p->n_plain == 0) {  /* the least recently freed named block */
		p->names_dropped++;
		kvpool_unname(p, p->lru_head);
	}
	int32_t b = p->free_list[--p->n_plain];
	p->n_free--;
	p->refs[b] = 1;
	p->touched[b] = 1;
	return b;
}

void kvpool_ref(struct kvpool *p, int32_t b)
{
	if (p->refs[b]++ == 0) {  /* a free named block (kvpool_lookup) */
		lru_remove(p, b);
		p->n_free--;
	}
}

void kvpool_unref(struct kvpool *p, int32_t b)
{
	if (--p->refs[b] != 0)
		return;
	if (p->name[b]) {
		p->freed_at[b] = p->now_s;
		lru_push(p, b);
	} else
		p->free_list[p->n_plain++] = b;
	p->n_free++;
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
		if (p->refs[old] <= 1) {
			kvpool_unname(p, old);  /* its content changes */
			continue;
		}
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

int kvseq_attach(struct kvpool *p, struct kvseq *s, int i, int32_t b)
{
	if (i == s->n_blocks && seq_grow(s, i + 1) != 0)
		return -ENOMEM;
	kvpool_ref(p, b);
	if (i < s->n_blocks)
		kvpool_unref(p, s->blocks[i]);
	else
		s->n_blocks++;
	s->blocks[i] = b;
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

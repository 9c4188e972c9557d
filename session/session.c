/*
 * session/session.c — see session.h.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "session/blocks.h"
#include "session/session.h"
#include "util/grow.h"

int sess_id_valid(const char *id)
{
	return session_id_ok(id);
}

static uint32_t hash_id(uid_t uid, const char *id)
{
	uint32_t h = 2166136261u ^ (uint32_t)uid;
	for (const unsigned char *p = (const unsigned char *)id; *p; p++)
		h = (h ^ *p) * 16777619u;
	return h;
}

int sess_table_init(struct sess_table *t, struct kvpool *pool)
{
	memset(t, 0, sizeof(*t));
	t->n_buckets = 1024;
	t->buckets = calloc((size_t)t->n_buckets, sizeof(*t->buckets));
	t->pool = pool;
	return t->buckets ? 0 : -ENOMEM;
}

void sess_clear_history(struct sess_table *t, struct session *s)
{
	kvseq_release(t->pool, &s->kv);
	for (int i = 0; i < s->n_turns; i++)
		free(s->turns[i].text);
	free(s->turns);
	free(s->tokens);
	free(s->system);
	free(s->next_system);
	free(s->chain);
	s->turns = NULL;
	s->tokens = NULL;
	s->chain = NULL;
	s->system = s->next_system = NULL;
	s->n_turns = s->turns_cap = s->n_tokens = s->cap = s->n_cached = 0;
	s->chain_n = s->chain_cap = 0;
	s->inexact = 0;
}

static void sess_free(struct sess_table *t, struct session *s)
{
	sess_clear_history(t, s);
	free(s->file_refs);
	free(s);
}

void sess_table_done(struct sess_table *t)
{
	if (!t->buckets)
		return;
	for (int b = 0; b < t->n_buckets; b++) {
		struct session *s = t->buckets[b];
		while (s) {
			struct session *n = s->hnext;
			sess_free(t, s);
			s = n;
		}
	}
	free(t->buckets);
	t->buckets = NULL;
	t->count = 0;
}

struct session *sess_get(struct sess_table *t, uid_t uid, const char *id)
{
	uint32_t b = hash_id(uid, id) % (uint32_t)t->n_buckets;
	for (struct session *s = t->buckets[b]; s; s = s->hnext)
		if (s->uid == uid && !strcmp(s->id, id))
			return s;
	return NULL;
}

struct session *sess_find(struct sess_table *t, uid_t uid, const char *id)
{
	struct session *s = sess_get(t, uid, id);
	if (s || uid != 0)
		return s;
	/* root: another uid's session of that name */
	for (int i = 0; i < t->n_buckets; i++)
		for (struct session *s = t->buckets[i]; s; s = s->hnext)
			if (!strcmp(s->id, id))
				return s;
	return NULL;
}

struct session *sess_create(struct sess_table *t, uid_t uid, const char *id)
{
	struct session *s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	memcpy(s->id, id, strlen(id) + 1);
	s->uid = uid;
	s->tmpl = CHAT_TEMPLATE_LLAMA2;
	s->policy = SESS_CTX_ERROR;
	uint32_t b = hash_id(uid, id) % (uint32_t)t->n_buckets;
	s->hnext = t->buckets[b];
	t->buckets[b] = s;
	t->count++;
	return s;
}

void sess_drop(struct sess_table *t, struct session *s)
{
	uint32_t b = hash_id(s->uid, s->id) % (uint32_t)t->n_buckets;
	for (struct session **pp = &t->buckets[b]; *pp; pp = &(*pp)->hnext) {
		if (*pp == s) {
			*pp = s->hnext;
			t->count--;
			break;
		}
	}
	sess_free(t, s);
}

static int grow_tokens(struct session *s, int n)
{
	size_t cap = (size_t)s->cap;
	int rc = grow(&s->tokens, &cap, (size_t)n, sizeof(int32_t), 256);
	s->cap = (int)cap;
	return rc;
}

static int grow_turns(struct session *s, int n)
{
	size_t cap = (size_t)s->turns_cap;
	int rc = grow(&s->turns, &cap, (size_t)n, sizeof(*s->turns), 16);
	s->turns_cap = (int)cap;
	return rc;
}

static char *dup_or_null(const char *s, int *fail)
{
	if (!s)
		return NULL;
	char *d = strdup(s);
	if (!d)
		*fail = 1;
	return d;
}

struct session *sess_fork(struct sess_table *t, struct session *src, uid_t uid,
			  const char *dst_id)
{
	struct session *s = sess_create(t, uid, dst_id);
	if (!s)
		return NULL;
	int fail = grow_tokens(s, src->n_tokens) || grow_turns(s, src->n_turns) ||
		   kvseq_fork(t->pool, &s->kv, &src->kv);
	if (!fail) {
		memcpy(s->tokens, src->tokens, (size_t)src->n_tokens * sizeof(int32_t));
		s->n_tokens = src->n_tokens;
		s->n_cached = src->n_cached;
		for (int i = 0; i < src->n_turns; i++) {
			s->turns[i] = src->turns[i];
			s->turns[i].text = dup_or_null(src->turns[i].text, &fail);
			s->n_turns = i + 1;
		}
		s->system = dup_or_null(src->system, &fail);
		s->next_system = dup_or_null(src->next_system, &fail);
		s->tmpl = src->tmpl;
		s->policy = src->policy;
		s->last_use_ms = src->last_use_ms;
		s->shift_turns = src->shift_turns;
		s->shift_tokens = src->shift_tokens;
		s->inexact = src->inexact;  /* its blocks are src's */
	}
	if (fail) {
		sess_drop(t, s);
		return NULL;
	}
	return s;
}

int sess_append(struct session *s, const int32_t *ids, int n, int role,
		const char *text, int new_turn)
{
	if (grow_tokens(s, s->n_tokens + n) || grow_turns(s, s->n_turns + 1))
		return -ENOMEM;
	if (new_turn || s->n_turns == 0) {
		char *copy = NULL;
		if (text && !(copy = strdup(text)))
			return -ENOMEM;
		s->turns[s->n_turns].start = s->n_tokens;
		s->turns[s->n_turns].role = (uint8_t)role;
		s->turns[s->n_turns].end = 0;
		s->turns[s->n_turns].text = copy;
		s->turns[s->n_turns].slid = 0;
		s->n_turns++;
	}
	if (n > 0)
		memcpy(s->tokens + s->n_tokens, ids, (size_t)n * sizeof(int32_t));
	s->n_tokens += n;
	return 0;
}

void sess_uncache(struct sess_table *t, struct session *s, int n)
{
	/* every caller changes the tokens from n on: the chain ends before */
	int whole = n / t->pool->kv.block_size;
	if (s->chain_n > whole)
		s->chain_n = whole;
	if (n < s->n_cached)
		s->n_cached = n;
	if (s->n_cached == 0)
		s->inexact = 0;
	kvseq_truncate(t->pool, &s->kv, s->n_cached);
}

int sess_rewind(struct sess_table *t, struct session *s)
{
	if (s->n_turns == 0)
		return -ENOENT;
	struct sess_turn *tt = &s->turns[--s->n_turns];
	int removed = s->n_tokens - tt->start;
	s->n_tokens = tt->start;
	free(tt->text);
	sess_uncache(t, s, s->n_tokens);
	return removed;
}

int sess_remove_turns(struct sess_table *t, struct session *s, int first, int count)
{
	if (first < 0 || count <= 0 || first + count > s->n_turns)
		return -EINVAL;
	int a = s->turns[first].start;
	int b = first + count < s->n_turns ? s->turns[first + count].start : s->n_tokens;
	memmove(s->tokens + a, s->tokens + b, (size_t)(s->n_tokens - b) * sizeof(int32_t));
	s->n_tokens -= b - a;
	for (int i = first; i < first + count; i++)
		free(s->turns[i].text);
	memmove(s->turns + first, s->turns + first + count,
		(size_t)(s->n_turns - first - count) * sizeof(*s->turns));
	s->n_turns -= count;
	for (int i = first; i < s->n_turns; i++)
		s->turns[i].start -= b - a;
	sess_uncache(t, s, a);
	return 0;
}

int sess_remove_tokens(struct sess_table *t, struct session *s, int idx, int from, int count)
{
	if (idx < 0 || idx >= s->n_turns || from < 0 || count <= 0)
		return -EINVAL;
	int a = s->turns[idx].start + from;
	int end = idx + 1 < s->n_turns ? s->turns[idx + 1].start : s->n_tokens;
	if (a + count > end)
		return -EINVAL;
	memmove(s->tokens + a, s->tokens + a + count,
		(size_t)(s->n_tokens - a - count) * sizeof(int32_t));
	s->n_tokens -= count;
	for (int i = idx + 1; i < s->n_turns; i++)
		s->turns[i].start -= count;
	sess_uncache(t, s, a);
	return 0;
}

int sess_replace_turn(struct sess_table *t, struct session *s, int idx,
		      const int32_t *ids, int n)
{
	if (idx < 0 || idx >= s->n_turns)
		return -EINVAL;
	int a = s->turns[idx].start;
	int b = idx + 1 < s->n_turns ? s->turns[idx + 1].start : s->n_tokens;
	int delta = n - (b - a);
	if (grow_tokens(s, s->n_tokens + delta))
		return -ENOMEM;
	memmove(s->tokens + a + n, s->tokens + b, (size_t)(s->n_tokens - b) * sizeof(int32_t));
	memcpy(s->tokens + a, ids, (size_t)n * sizeof(int32_t));
	s->n_tokens += delta;
	for (int i = idx + 1; i < s->n_turns; i++)
		s->turns[i].start += delta;
	sess_uncache(t, s, a);
	return 0;
}

/* ---- prefix sharing ------------------------------------------------- */

void sess_set_sharing(struct sess_table *t, int on, uint64_t base)
{
	t->share = on;
	t->name_base = base;
}

uint64_t sess_chain_seed(const struct sess_table *t, const struct session *s)
{
	uint64_t v[3] = { t->name_base, (uint64_t)s->uid, (uint64_t)(uint32_t)s->tmpl };
	return XXH64(v, sizeof(v), 0x6c6c616d61642d70ull);  /* "llamad-p" */
}

/* Extend s's chain over its first n whole blocks. 0 or -ENOMEM. */
static int chain_upto(struct sess_table *t, struct session *s, int n)
{
	int bs = t->pool->kv.block_size;
	uint64_t seed = sess_chain_seed(t, s);
	if (seed != s->chain_seed) {  /* another owner or template (a fork) */
		s->chain_seed = seed;
		s->chain_n = 0;
	}
	if (n <= s->chain_n)
		return 0;
	size_t cap = (size_t)s->chain_cap;
	if (grow(&s->chain, &cap, (size_t)n, sizeof(uint64_t), 16) != 0)
		return -ENOMEM;
	s->chain_cap = (int)cap;
	for (int i = s->chain_n; i < n; i++) {
		s->chain[i] = blk_name(i ? s->chain[i - 1] : seed, s->tokens + (size_t)i * (size_t)bs,
				       bs);
	}
	s->chain_n = n;
	return 0;
}

uint64_t sess_block_name(struct sess_table *t, struct session *s, int i)
{
	return chain_upto(t, s, i + 1) == 0 ? s->chain[i] : 0;
}

int sess_share_prefix(struct sess_table *t, struct session *s)
{
	struct kvpool *p = t->pool;
	int bs = p->kv.block_size, got = 0;
	if (!t->share || s->inexact || s->n_cached % bs)
		return 0;
	for (int i = s->n_cached / bs; (i + 1) * bs <= s->n_tokens - 1 && i <= s->kv.n_blocks;
	     i++) {
		if (chain_upto(t, s, i + 1) != 0)
			break;
		uint64_t parent = i ? s->chain[i - 1] : s->chain_seed;
		int32_t b = kvpool_lookup(p, s->chain[i], parent, (uint32_t)s->uid,
					  s->tokens + (size_t)i * (size_t)bs);
		if (b < 0 || kvseq_attach(p, &s->kv, i, b) != 0)
			break;
		s->n_cached += bs;
		got += bs;
	}
	t->prefix_hit_tokens += (uint64_t)got;
	return got;
}

void sess_name_blocks(struct sess_table *t, struct session *s)
{
	struct kvpool *p = t->pool;
	int bs = p->kv.block_size;
	int n = s->n_cached / bs;
	if (!t->share || s->inexact || n > s->kv.n_blocks || chain_upto(t, s, n) != 0)
		return;
	for (int i = 0; i < n; i++) {
		int32_t b = s->kv.blocks[i];
		if (p->name[b])
			continue;  /* named (by s, or under another seed: a fork) */
		uint64_t parent = i ? s->chain[i - 1] : s->chain_seed;
		const int32_t *tok = s->tokens + (size_t)i * (size_t)bs;
		int32_t same = kvpool_lookup(p, s->chain[i], parent, (uint32_t)s->uid, tok);
		if (same < 0)
			kvpool_name(p, b, s->chain[i], parent, (uint32_t)s->uid, tok);
		else if (p->refs[b] == 1)
			kvseq_attach(p, &s->kv, i, same);  /* cannot fail: i < n_blocks */
	}
}

int sess_uid_blocks(struct sess_table *t, uid_t uid)
{
	struct kvpool *p = t->pool;
	int n = 0;
	kvpool_mark_epoch(p);
	for (int b = 0; b < t->n_buckets; b++)
		for (struct session *s = t->buckets[b]; s; s = s->hnext)
			if (s->uid == uid && s->loc == SESS_POOL)
				for (int i = 0; i < s->kv.n_blocks; i++)
					n += kvpool_mark(p, s->kv.blocks[i]);
	return n;
}

int sess_shared_blocks(const struct sess_table *t, const struct session *s)
{
	int n = 0;
	for (int i = 0; i < s->kv.n_blocks; i++)
		n += t->pool->refs[s->kv.blocks[i]] > 1;
	return n;
}

static void visit(struct sess_table *t, uid_t uid, int all,
		  void (*fn)(struct session *s, void *ctx), void *ctx)
{
	for (int b = 0; b < t->n_buckets; b++)
		for (struct session *s = t->buckets[b], *next; s; s = next) {
			next = s->hnext;  /* fn may drop s */
			if (all || s->uid == uid)
				fn(s, ctx);
		}
}

void sess_foreach(struct sess_table *t, uid_t uid,
		  void (*fn)(struct session *s, void *ctx), void *ctx)
{
	visit(t, uid, uid == 0, fn, ctx);
}

void sess_foreach_owned(struct sess_table *t, uid_t uid,
			void (*fn)(struct session *s, void *ctx), void *ctx)
{
	visit(t, uid, 0, fn, ctx);
}

uint32_t sess_length(const struct session *s)
{
	return s->loc == SESS_DISK ? s->disk_tokens : (uint32_t)s->n_tokens;
}

/*
 * session/session.c — see session.h.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "proto/limits.h"
#include "session/session.h"
#include "util/grow.h"

int sess_id_valid(const char *id)
{
	return llamad_session_id_ok(id);
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
	s->turns = NULL;
	s->tokens = NULL;
	s->system = s->next_system = NULL;
	s->n_turns = s->turns_cap = s->n_tokens = s->cap = s->n_cached = 0;
}

static void sess_free(struct sess_table *t, struct session *s)
{
	sess_clear_history(t, s);
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
	if (n < s->n_cached)
		s->n_cached = n;
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

int sess_shared_blocks(const struct sess_table *t, const struct session *s)
{
	int n = 0;
	for (int i = 0; i < s->kv.n_blocks; i++)
		n += t->pool->refs[s->kv.blocks[i]] > 1;
	return n;
}

void sess_foreach(struct sess_table *t, uid_t uid,
		  void (*fn)(struct session *s, void *ctx), void *ctx)
{
	for (int b = 0; b < t->n_buckets; b++)
		for (struct session *s = t->buckets[b], *next; s; s = next) {
			next = s->hnext;  /* fn may drop s */
			if (uid == 0 || s->uid == uid)
				fn(s, ctx);
		}
}

uint32_t sess_length(const struct session *s)
{
	return s->loc == SESS_DISK ? s->disk_tokens : (uint32_t)s->n_tokens;
}

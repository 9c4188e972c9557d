/*
 * gateway/conv.c — see conv.h.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "gateway/api.h"
#include "gateway/conv.h"

static uint64_t nonzero(uint64_t h)
{
	return h ? h : 1;
}

uint64_t conv_seed(const char *model, const char *system)
{
	uint64_t h = XXH64(model, strlen(model) + 1, 0x6c6c616d61642d68ull);
	const char *s = system ? system : "";
	size_t n;
	char *t = api_norm(s, &n);
	if (!t)
		return nonzero(XXH64(s, strlen(s), h));
	h = XXH64(t, n, h ^ (system ? 1 : 0));
	free(t);
	return nonzero(h);
}

uint64_t conv_step(uint64_t h, int role, const char *text)
{
	size_t n;
	char *t = api_norm(text, &n);
	uint64_t seed = h * 31 + (uint64_t)role + 1;
	uint64_t r = t ? XXH64(t, n, seed) : XXH64(text, strlen(text), seed);
	free(t);
	return nonzero(r);
}

int conv_chain(const char *model, const char *system, const struct api_msg *m, size_t n,
	       uint64_t *c)
{
	c[0] = conv_seed(model, system);
	for (size_t i = 0; i < n; i++)
		c[i + 1] = conv_step(c[i], m[i].role, m[i].text);
	return 0;
}

static void unlink_s(struct conv_index *x, struct conv_sess *s)
{
	if (s->prev)
		s->prev->next = s->next;
	else
		x->head = s->next;
	if (s->next)
		s->next->prev = s->prev;
	else
		x->tail = s->prev;
	s->prev = s->next = NULL;
}

static void push_front(struct conv_index *x, struct conv_sess *s)
{
	s->prev = NULL;
	s->next = x->head;
	if (x->head)
		x->head->prev = s;
	else
		x->tail = s;
	x->head = s;
}

void conv_touch(struct conv_index *x, struct conv_sess *s)
{
	s->last_use = ++x->clock;
	unlink_s(x, s);
	push_front(x, s);
}

static int reserve(struct conv_sess *s, uint32_t n)
{
	if (n + 1 <= s->cap)
		return 0;
	uint32_t cap = s->cap ? s->cap : 8;
	while (cap < n + 1)
		cap *= 2;
	uint64_t *h = realloc(s->h, cap * sizeof(*h));
	if (!h)
		return -ENOMEM;
	s->h = h;
	s->cap = cap;
	return 0;
}

int conv_set(struct conv_index *x, struct conv_sess *s, const uint64_t *c, uint32_t n)
{
	if (reserve(s, n))
		return -ENOMEM;
	memcpy(s->h, c, (n + 1) * sizeof(*c));
	s->n = n;
	conv_touch(x, s);
	return 0;
}

int conv_push(struct conv_sess *s, uint64_t h)
{
	if (reserve(s, s->n + 1))
		return -ENOMEM;
	s->h[++s->n] = h;
	return 0;
}

struct conv_sess *conv_add(struct conv_index *x, const char *name, uint32_t uid,
			   uint32_t model, const uint64_t *c, uint32_t n)
{
	struct conv_sess *s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	size_t len = strlen(name);
	if (len >= sizeof(s->name) || reserve(s, n)) {
		free(s->h);
		free(s);
		return NULL;
	}
	memcpy(s->name, name, len + 1);
	s->uid = uid;
	s->model = model;
	memcpy(s->h, c, (n + 1) * sizeof(*c));
	s->n = n;
	s->last_use = ++x->clock;
	push_front(x, s);
	x->count++;
	return s;
}

void conv_remove(struct conv_index *x, struct conv_sess *s)
{
	unlink_s(x, s);
	x->count--;
	free(s->h);
	free(s);
}

struct conv_match conv_find(struct conv_index *x, uint32_t uid, uint32_t model,
			    const uint64_t *c, uint32_t n)
{
	struct conv_match best = { 0 };
	for (struct conv_sess *s = x->head; s; s = s->next) {
		if (s->uid != uid || s->model != model || s->h[0] != c[0])
			continue;
		uint32_t lim = s->n < n ? s->n : n;
		uint32_t j = 0;
		while (j < lim && s->h[j + 1] == c[j + 1])
			j++;
		if (j < s->dropped)
			continue;
		bool exact = !s->busy && s->n == j;
		/* longer first; then exact; the list is most recent first */
		if (!best.s || j > best.turns || (j == best.turns && exact && !best.exact)) {
			best.s = s;
			best.turns = j;
			best.exact = exact;
		}
	}
	return best;
}

struct conv_sess *conv_victim(struct conv_index *x, uint32_t uid, uint32_t model, size_t keep)
{
	size_t seen = 0;
	for (struct conv_sess *s = x->head; s; s = s->next)
		if (s->uid == uid && s->model == model)
			seen++;
	if (seen <= keep)
		return NULL;
	for (struct conv_sess *s = x->tail; s; s = s->prev)
		if (s->uid == uid && s->model == model && !s->busy)
			return s;
	return NULL;
}

struct conv_sess *conv_get(struct conv_index *x, const char *name)
{
	for (struct conv_sess *s = x->head; s; s = s->next)
		if (!strcmp(s->name, name))
			return s;
	return NULL;
}

void conv_free_all(struct conv_index *x)
{
	while (x->head)
		conv_remove(x, x->head);
}

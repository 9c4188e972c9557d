/*
 * gateway/conv.h — which llamad session already holds a conversation.
 *
 * OpenAI and Ollama clients resend the whole conversation with every
 * request. The gateway keeps, for each session it made, the chain of its
 * turns' hashes: h[0] is the seed (model, system prompt), h[i] hashes turn
 * i's role and normalized text (api_norm: white space trimmed at both ends)
 * into h[i-1]. A request's messages hash the same way; the session whose
 * chain shares the longest beginning with the request's is the one to
 * continue: used as it is when it holds exactly that beginning, forked and
 * rewound to it otherwise (a regenerated or edited turn).
 *
 * Pure bookkeeping (no sockets): tests/unit/test_conv.c.
 */
#ifndef LLAMAD_GATEWAY_CONV_H
#define LLAMAD_GATEWAY_CONV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CONV_NAME_MAX 48

struct conv_sess {
	char name[CONV_NAME_MAX];
	uint32_t uid;
	uint32_t model;            /* index of the model (its llamad) */
	uint32_t n;                /* turns held (hashes h[1..n]) */
	uint32_t cap;
	uint64_t *h;               /* h[0..n] */
	uint32_t dropped;          /* turns a context shift removed from the front */
	bool busy;                 /* a request of the gateway runs on it */
	uint64_t last_use;         /* a counter: higher is more recent */
	struct conv_sess *prev, *next;  /* most recently used first */
};

struct conv_index {
	struct conv_sess *head, *tail;
	size_t count;
	uint64_t clock;
};

/* Chain hashes (never 0). */
uint64_t conv_seed(const char *model, const char *system);
uint64_t conv_step(uint64_t h, int role, const char *text);

/* The request's chain: c[0] = seed, c[i] for messages 1..n (n+1 values,
 * the caller's array). 0, or -ENOMEM. */
struct api_msg;
int conv_chain(const char *model, const char *system, const struct api_msg *m, size_t n,
	       uint64_t *c);

struct conv_match {
	struct conv_sess *s;       /* NULL: none holds even the seed */
	uint32_t turns;            /* how many of the request's messages it holds */
	bool exact;                /* s holds exactly those turns and is free */
};

/* Best session of (uid, model) for the chain c[0..n]: the longest common
 * beginning, then a free session holding no more than that, then the most
 * recently used. Matches shorter than `dropped` do not count (the turns
 * are gone from the session). */
struct conv_match conv_find(struct conv_index *x, uint32_t uid, uint32_t model,
			    const uint64_t *c, uint32_t n);

/* A new entry holding chain c[0..n] (n turns); most recent. NULL on ENOMEM. */
struct conv_sess *conv_add(struct conv_index *x, const char *name, uint32_t uid,
			   uint32_t model, const uint64_t *c, uint32_t n);

/* s now holds n turns with chain c[0..n]; marks it most recently used. */
int conv_set(struct conv_index *x, struct conv_sess *s, const uint64_t *c, uint32_t n);

/* One more turn of hash h (the answer); 0 or -ENOMEM. */
int conv_push(struct conv_sess *s, uint64_t h);

void conv_touch(struct conv_index *x, struct conv_sess *s);
void conv_remove(struct conv_index *x, struct conv_sess *s);

/* The least recently used free session of uid and model beyond the first
 * keep ones (NULL: none): the one to drop when a caller holds too many. */
struct conv_sess *conv_victim(struct conv_index *x, uint32_t uid, uint32_t model, size_t keep);

/* Entry by name (NULL: none). */
struct conv_sess *conv_get(struct conv_index *x, const char *name);

void conv_free_all(struct conv_index *x);

#endif

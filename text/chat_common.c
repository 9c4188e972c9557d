/*
 * text/chat_common.c — the rules several chat templates share (their rows
 * point at these; chat_int.h).
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat_int.h"

int chat_generation_bos(const struct tok *t, const struct chat_ctx *c, int32_t **ids)
{
	(void)t;
	if (c->n_tokens > 0)
		return 0;
	int32_t *v = malloc(sizeof(int32_t));
	if (!v)
		return -ENOMEM;
	v[0] = c->bos;
	*ids = v;
	return 1;
}

int chat_first_turn_bos(const struct chat_ctx *c, const int32_t *old, int n_old,
			int32_t **ids)
{
	if (n_old > 0 && old[0] == c->bos)
		return 0;
	int32_t *v = malloc((size_t)(n_old + 1) * sizeof(int32_t));
	if (!v)
		return -ENOMEM;
	v[0] = c->bos;
	memcpy(v + 1, old, (size_t)n_old * sizeof(int32_t));
	*ids = v;
	return n_old + 1;
}

void chat_copy_tag(char *tag, size_t cap, const char *text, size_t n)
{
	if (!cap)
		return;
	if (n >= cap)
		n = cap - 1;
	memcpy(tag, text, n);
	tag[n] = 0;
}

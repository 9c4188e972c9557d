/*
 * text/stop.c — see stop.h.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "text/stop.h"
#include "util/grow.h"

int stopper_init(struct stopper *s, const char *const *stops, int n)
{
	memset(s, 0, sizeof(*s));
	s->hit = -1;
	if (n > 0 && !(s->stops = calloc((size_t)n, sizeof(char *))))
		return -ENOMEM;
	for (int i = 0; i < n; i++) {
		if (!stops[i] || !*stops[i])
			continue;
		if (!(s->stops[s->n_stops] = strdup(stops[i]))) {
			stopper_done(s);
			return -ENOMEM;
		}
		s->n_stops++;
	}
	return 0;
}

void stopper_done(struct stopper *s)
{
	for (int i = 0; i < s->n_stops; i++)
		free(s->stops[i]);
	free(s->stops);
	free(s->pend);
	memset(s, 0, sizeof(*s));
	s->hit = -1;
}

/* Length of the longest suffix of pend that is a proper prefix of a stop. */
static size_t held_suffix(const struct stopper *s)
{
	size_t best = 0;
	for (int i = 0; i < s->n_stops; i++) {
		size_t sl = strlen(s->stops[i]);
		size_t max = sl - 1 < s->n_pend ? sl - 1 : s->n_pend;
		for (size_t k = max; k > best; k--) {
			if (memcmp(s->pend + s->n_pend - k, s->stops[i], k) == 0) {
				best = k;
				break;
			}
		}
	}
	return best;
}

int stopper_push(struct stopper *s, const char *text, size_t len, stop_emit_fn emit, void *ctx)
{
	if (s->hit >= 0)
		return 1;
	if (s->n_stops == 0) {
		if (len)
			emit(ctx, text, len);
		return 0;
	}
	if (grow(&s->pend, &s->cap, s->n_pend + len, 1, 64))
		return -ENOMEM;
	memcpy(s->pend + s->n_pend, text, len);
	s->n_pend += len;
	/* earliest match of any stop string */
	size_t first = s->n_pend;
	for (int i = 0; i < s->n_stops; i++) {
		char *m = memmem(s->pend, s->n_pend, s->stops[i], strlen(s->stops[i]));
		if (m && (size_t)(m - s->pend) < first) {
			first = (size_t)(m - s->pend);
			s->hit = i;
		}
	}
	if (s->hit >= 0) {
		if (first)
			emit(ctx, s->pend, first);
		s->n_pend = 0;
		return 1;
	}
	size_t keep = held_suffix(s);
	size_t out = s->n_pend - keep;
	if (out) {
		emit(ctx, s->pend, out);
		memmove(s->pend, s->pend + out, keep);
		s->n_pend = keep;
	}
	return 0;
}

void stopper_flush(struct stopper *s, stop_emit_fn emit, void *ctx)
{
	if (s->n_pend && s->hit < 0)
		emit(ctx, s->pend, s->n_pend);
	s->n_pend = 0;
}

/*
 * text/tokenizer.c — struct tok: one kind (its table of operations,
 * tok_int.h, and its state), the end-of-turn ids, and the calls of
 * tokenizer.h sent to the kind. Loading from files is tok_load.c's;
 * decoding whole sequences, detok.c's.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "text/tok_int.h"
#include "text/tokenizer.h"
#include "util/cause.h"

#define TOK_MAX_END 16

struct tok {
	const struct tok_ops *ops;
	void *k;                 /* the kind's state */
	int32_t end[TOK_MAX_END];
	int n_end;
};

struct tok *tok_wrap(const struct tok_ops *ops, void *k, const char *what, char **cause)
{
	if (!k)
		return NULL;
	struct tok *t = calloc(1, sizeof(*t));
	if (!t) {
		ops->free(k);
		cause_set(cause, "tokenizer %s: out of memory", what);
		return NULL;
	}
	t->ops = ops;
	t->k = k;
	int eos = tok_eos(t);
	if (eos >= 0)
		t->end[t->n_end++] = eos;
	if (ops->end_ids) {
		int n = 0;
		const int32_t *e = ops->end_ids(k, &n);
		for (int i = 0; i < n; i++)
			tok_add_end(t, e[i]);
	}
	return t;
}

const struct tok_ops *tok_ops_of(const struct tok *t, const void **k)
{
	*k = t->k;
	return t->ops;
}

struct tok *tok_load_mem(const void *data, size_t len, const char *what, char **cause)
{
	if (cause)
		*cause = NULL;
	return tok_wrap(&tok_spm_ops, spm_load_mem(data, len, what, cause), what, cause);
}

struct tok *tok_load_bpe(const struct tok_bpe_spec *spec, const char *what, char **cause)
{
	if (cause)
		*cause = NULL;
	return tok_wrap(&tok_bpe_ops, bpe_load_spec(spec, what, cause), what, cause);
}

void tok_free(struct tok *t)
{
	if (!t)
		return;
	t->ops->free(t->k);
	free(t);
}

int tok_kind(const struct tok *t)
{
	return t->ops->kind;
}

int tok_n_vocab(const struct tok *t)
{
	return t->ops->n_vocab(t->k);
}

int tok_bos(const struct tok *t)
{
	return t->ops->bos(t->k);
}

int tok_eos(const struct tok *t)
{
	return t->ops->eos(t->k);
}

int tok_is_end(const struct tok *t, int id)
{
	for (int i = 0; i < t->n_end; i++)
		if (t->end[i] == id)
			return 1;
	return 0;
}

int tok_n_end(const struct tok *t)
{
	return t->n_end;
}

int tok_end(const struct tok *t, int i)
{
	return i >= 0 && i < t->n_end ? t->end[i] : -1;
}

int tok_add_end(struct tok *t, int id)
{
	if (id < 0 || id >= tok_n_vocab(t) || !tok_is_control(t, id))
		return -EINVAL;
	if (tok_is_end(t, id))
		return 0;
	if (t->n_end == TOK_MAX_END)
		return -EINVAL;
	t->end[t->n_end++] = id;
	return 0;
}

int tok_n_merges(const struct tok *t)
{
	return t->ops->n_merges ? t->ops->n_merges(t->k) : 0;
}

const char *tok_merge(const struct tok *t, int i)
{
	return t->ops->merge ? t->ops->merge(t->k, i) : NULL;
}

const char *tok_pre(const struct tok *t)
{
	return t->ops->pre ? t->ops->pre(t->k) : NULL;
}

int tok_bytes(const struct tok *t, int id, const uint8_t **p, size_t *n)
{
	return t->ops->bytes ? t->ops->bytes(t->k, id, p, n) : 0;
}

int tok_encode(const struct tok *t, const char *text, size_t len, int add_bos, int32_t **ids)
{
	if (!t || !ids || (!text && len))
		return -EINVAL;
	return t->ops->encode(t->k, text ? text : "", len, add_bos, ids);
}

const char *tok_piece(const struct tok *t, int id)
{
	return t->ops->piece(t->k, id);
}

int tok_piece_to_id(const struct tok *t, const char *piece)
{
	if (!piece)
		return -1;
	return t->ops->piece_to_id(t->k, piece);
}

size_t tok_text(const struct tok *t, int id, char *out, size_t cap)
{
	const uint8_t *p;
	size_t n = 0;
	uint8_t b;
	const char *s = tok_piece(t, id);
	if (!s || tok_is_control(t, id))
		return 0;
	if (tok_bytes(t, id, &p, &n)) {
		n = n < cap ? n : cap;
		memcpy(out, p, n);
		return n;
	}
	if (tok_is_byte(t, id, &b)) {
		if (cap)
			out[0] = (char)b;
		return cap ? 1 : 0;
	}
	for (; *s && n < cap; n++) {
		if (!strncmp(s, "\xe2\x96\x81", 3)) {   /* U+2581: a space */
			out[n] = ' ';
			s += 3;
		} else {
			out[n] = *s++;
		}
	}
	return n;
}

int tok_is_byte(const struct tok *t, int id, uint8_t *byte)
{
	return t->ops->is_byte ? t->ops->is_byte(t->k, id, byte) : 0;
}

int tok_is_control(const struct tok *t, int id)
{
	return t->ops->is_control(t->k, id);
}

float tok_score(const struct tok *t, int id)
{
	return t->ops->score ? t->ops->score(t->k, id) : 0.0f;
}

int tok_type(const struct tok *t, int id)
{
	return t->ops->type(t->k, id);
}

int tok_drops_leading_space(const struct tok *t)
{
	return t->ops->drops_leading_space ? t->ops->drops_leading_space(t->k) : 0;
}

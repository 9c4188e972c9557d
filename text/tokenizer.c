/*
 * text/tokenizer.c — struct tok: one of the two kinds (tok_int.h), the
 * end-of-turn ids, and the calls of tokenizer.h sent to the kind.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/llama2c.h"
#include "text/tok_int.h"
#include "text/tokenizer.h"
#include "text/vocab.h"
#include "util/cause.h"
#include "util/file.h"

#define TOK_MAX_END 16

struct tok {
	enum tok_kind kind;
	struct spm *spm;         /* TOK_SPM */
	struct bpe *bpe;         /* TOK_BPE */
	int32_t end[TOK_MAX_END];
	int n_end;
};

static void set_cause(char **cause, const char *path, const char *why, int err)
{
	cause_set(cause, "tokenizer %s: %s%s%s", path, why, err ? ": " : "", err ? strerror(err) : "");
}

static struct tok *wrap(struct spm *s, struct bpe *b, char **cause, const char *what)
{
	if (!s && !b)
		return NULL;
	struct tok *t = calloc(1, sizeof(*t));
	if (!t) {
		spm_free(s);
		bpe_free(b);
		set_cause(cause, what, "out of memory", 0);
		return NULL;
	}
	t->kind = b ? TOK_BPE : TOK_SPM;
	t->spm = s;
	t->bpe = b;
	int eos = tok_eos(t);
	if (eos >= 0)
		t->end[t->n_end++] = eos;
	if (b) {
		int n = 0;
		const int32_t *e = bpe_end_ids(b, &n);
		for (int i = 0; i < n; i++)
			tok_add_end(t, e[i]);
	}
	return t;
}

static int is_json(const char *path, const char *buf, size_t len)
{
	size_t n = strlen(path);
	if (n >= 5 && strcmp(path + n - 5, ".json") == 0)
		return 1;
	size_t i = 0;
	while (i < len && (buf[i] == ' ' || buf[i] == '\n' || buf[i] == '\t' || buf[i] == '\r'))
		i++;
	return i < len && buf[i] == '{';
}

struct tok *tok_load(const char *path, char **cause)
{
	return tok_load_with(path, NULL, cause);
}

struct tok *tok_load_with(const char *path, const struct hf_text *ht, char **cause)
{
	if (cause)
		*cause = NULL;
	if (!path) {
		set_cause(cause, "(null)", "no path given", 0);
		return NULL;
	}
	if (file_has_magic(path, "GGUF", 4))  /* mapped by the GGUF reader, not read whole */
		return tok_load_gguf(path, cause);
	char *buf = NULL;
	size_t len = 0;
	int rc = file_read(path, (size_t)1 << 30, &buf, &len);
	if (rc < 0) {
		set_cause(cause, path, rc == -EISDIR || rc == -EINVAL ? "cannot read" : "cannot open",
			  -rc);
		return NULL;
	}
	struct tok *t;
	if (is_json(path, buf, len)) {
		t = ht ? tok_load_hf_json(path, buf, len, ht, cause) : tok_load_json(path, buf, len, cause);
	} else if (l2c_tok_check(buf, len, NULL)) {
		t = tok_load_llama2c(buf, len, path, cause);
	} else if (len > 0 && buf[0] != 0x0a) {
		/* a ModelProto starts with its pieces (field 1, length-delimited) */
		set_cause(cause, path, "not a tokenizer this llamad reads (a SentencePiece "
			  "tokenizer.model, a llama2.c tokenizer.bin, a Hugging Face "
			  "tokenizer.json or a GGUF file)", 0);
		t = NULL;
	} else {
		t = wrap(spm_load_mem(buf, len, path, cause), NULL, cause, path);
	}
	free(buf);
	return t;
}

struct tok *tok_load_mem(const void *data, size_t len, const char *what, char **cause)
{
	if (cause)
		*cause = NULL;
	return wrap(spm_load_mem(data, len, what, cause), NULL, cause, what);
}

struct tok *tok_load_bpe(const struct tok_bpe_spec *spec, const char *what, char **cause)
{
	if (cause)
		*cause = NULL;
	return wrap(NULL, bpe_load_spec(spec, what, cause), cause, what);
}

void tok_free(struct tok *t)
{
	if (!t)
		return;
	spm_free(t->spm);
	bpe_free(t->bpe);
	free(t);
}

int tok_kind(const struct tok *t)
{
	return t->kind;
}

int tok_n_vocab(const struct tok *t)
{
	return t->bpe ? bpe_n_vocab(t->bpe) : spm_n_vocab(t->spm);
}

int tok_bos(const struct tok *t)
{
	return t->bpe ? bpe_bos(t->bpe) : spm_bos(t->spm);
}

int tok_eos(const struct tok *t)
{
	return t->bpe ? bpe_eos(t->bpe) : spm_eos(t->spm);
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
	return t->bpe ? bpe_n_merges(t->bpe) : 0;
}

const char *tok_merge(const struct tok *t, int i)
{
	return t->bpe ? bpe_merge(t->bpe, i) : NULL;
}

const char *tok_pre(const struct tok *t)
{
	return t->bpe ? bpe_pre(t->bpe) : NULL;
}

int tok_bytes(const struct tok *t, int id, const uint8_t **p, size_t *n)
{
	return t->bpe ? bpe_bytes(t->bpe, id, p, n) : 0;
}

int tok_encode(const struct tok *t, const char *text, size_t len, int add_bos, int32_t **ids)
{
	if (!t || !ids || (!text && len))
		return -EINVAL;
	return t->bpe ? bpe_encode(t->bpe, text ? text : "", len, add_bos, ids)
		      : spm_encode(t->spm, text, len, add_bos, ids);
}

int detok_all(const struct tok *t, const int32_t *ids, int n, int at_start, int skip_bad,
	       char **text)
{
	size_t cap = 256, len = 0;
	char *out = malloc(cap);
	if (!out)
		return -ENOMEM;
	struct detok d;
	detok_init(&d, t, at_start);
	int vocab = tok_n_vocab(t);
	for (int i = 0; i <= n; i++) {
		if (skip_bad && i < n && (ids[i] < 0 || ids[i] >= vocab))
			continue;
		for (;;) {  /* a full buffer leaves the stream as it was: grow, retry */
			int k = i < n ? detok_feed(&d, ids[i], out + len, cap - len)
				      : detok_flush(&d, out + len, cap - len);
			if (k >= 0) {
				len += (size_t)k;
				break;
			}
			if (k != -ENOSPC || cap > (1u << 30)) {
				free(out);
				return k == -ENOSPC ? -EOVERFLOW : k;
			}
			char *o = realloc(out, cap * 2);
			if (!o) {
				free(out);
				return -ENOMEM;
			}
			out = o;
			cap *= 2;
		}
	}
	out[len] = 0;
	*text = out;
	return (int)len;
}

int tok_decode(const struct tok *t, const int32_t *ids, int n, char **text)
{
	if (!t || !text || n < 0 || (!ids && n))
		return -EINVAL;
	*text = NULL;
	for (int i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= tok_n_vocab(t))
			return -EINVAL;
	/* BPE decode is the streaming detokenizer run over the whole sequence */
	return t->bpe ? detok_all(t, ids, n, 0, 0, text) : spm_decode(t->spm, ids, n, text);
}

const char *tok_piece(const struct tok *t, int id)
{
	return t->bpe ? bpe_piece(t->bpe, id) : spm_piece(t->spm, id);
}

int tok_piece_to_id(const struct tok *t, const char *piece)
{
	if (!piece)
		return -1;
	return t->bpe ? bpe_piece_to_id(t->bpe, piece) : spm_piece_to_id(t->spm, piece);
}

int tok_is_byte(const struct tok *t, int id, uint8_t *byte)
{
	return t->bpe ? 0 : spm_is_byte(t->spm, id, byte);
}

int tok_is_control(const struct tok *t, int id)
{
	if (t->bpe) {
		int ty = bpe_type(t->bpe, id);
		return ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_UNKNOWN;
	}
	return spm_is_control(t->spm, id);
}

float tok_score(const struct tok *t, int id)
{
	return t->bpe ? 0.0f : spm_score(t->spm, id);
}

int tok_type(const struct tok *t, int id)
{
	return t->bpe ? bpe_type(t->bpe, id) : spm_type(t->spm, id);
}

int tok_drops_leading_space(const struct tok *t)
{
	return t->bpe ? 0 : spm_drops_leading_space(t->spm);
}

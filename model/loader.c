/*
 * model/loader.c — what the format loaders share (loader.h): the file
 * maps and buffers a model owns, the weights' size, and model_finish (the
 * RoPE table and the tokenizer, once a loader has the weights).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/loader.h"
#include "text/vocab.h"
#include "util/file.h"

/* Keep a map (munmapped by model_free). 0 or -ENOMEM. */
static int model_add_map(struct model *m, void *addr, size_t len)
{
	struct model_map *n = realloc(m->maps, (size_t)(m->n_maps + 1) * sizeof(*n));
	if (!n)
		return -ENOMEM;
	m->maps = n;
	m->maps[m->n_maps].addr = addr;
	m->maps[m->n_maps].len = len;
	m->n_maps++;
	return 0;
}

void *model_own(struct model *m, size_t bytes)
{
	void **n = realloc(m->owned, (size_t)(m->n_owned + 1) * sizeof(*n));
	if (!n)
		return NULL;
	m->owned = n;
	void *p = calloc(1, bytes ? bytes : 1);
	if (p)
		m->owned[m->n_owned++] = p;
	return p;
}

int model_map_file(struct model *m, const char *path, const uint8_t **data,
		   size_t *len, char **cause)
{
	int rc = file_map(path, data, len, cause);
	if (rc)
		return rc;
	if (model_add_map(m, (void *)*data, *len) != 0) {
		file_unmap(*data, *len);
		cause_set(cause, "%s: out of memory", path);
		return -ENOMEM;
	}
	return 0;
}

int model_has_suffix(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);
	return a >= b && strcmp(s + a - b, suf) == 0;
}

size_t model_weight_bytes(const struct kt_weight *w)
{
	return (size_t)w->rows * kt_row_bytes(w->dtype, (size_t)w->cols);
}

int model_finish(struct model *m, const char *tokenizer, const char *default_tok,
		 const struct hf_text *side, char **cause)
{
	struct model_config *c = &m->cfg;
	int half = c->head_dim / 2;
	m->inv_freq = model_own(m, (size_t)half * sizeof(float));
	if (!m->inv_freq)
		return -ENOMEM;
	model_inv_freq(c, m->rope_freqs, m->inv_freq);

	size_t wb = model_weight_bytes(&m->cls);
	for (int l = 0; l < c->n_layers; l++) {
		const struct model_layer *L = &m->layers[l];
		wb += model_weight_bytes(&L->wq) + model_weight_bytes(&L->wk) + model_weight_bytes(&L->wv) +
		      model_weight_bytes(&L->wo) + model_weight_bytes(&L->w1) + model_weight_bytes(&L->w2) +
		      model_weight_bytes(&L->w3);
	}
	m->weight_bytes = wb;

	/* a tokenizer the loader built from the model file's own metadata
	 * (GGUF) is kept unless --tokenizer overrides it */
	const char *tp = tokenizer ? tokenizer : m->tok ? m->path : default_tok;
	if (m->tok && tokenizer) {
		tok_free(m->tok);
		m->tok = NULL;
	}
	if (!m->tok)
		m->tok = tok_load_with(tp, tokenizer ? NULL : side, cause);
	if (!m->tok) {
		if (!tokenizer && cause && *cause) {
			char *inner = *cause;
			*cause = NULL;
			cause_set(cause, "%s (pass --tokenizer PATH)", inner);
			free(inner);
		}
		return -EINVAL;
	}
	if (tok_n_vocab(m->tok) != c->vocab) {
		if (tokenizer)
			cause_set(cause, "%s: tokenizer has %d pieces but model %s has vocab "
				  "%d: they do not belong together", tp, tok_n_vocab(m->tok),
				  m->path, c->vocab);
		else
			cause_set(cause, "%s: the tokenizer found beside the model (no "
				  "--tokenizer given) has %d pieces, but model %s has a "
				  "vocabulary of %d: pass its own tokenizer with --tokenizer PATH",
				  tp, tok_n_vocab(m->tok), m->path, c->vocab);
		return -EINVAL;
	}
	if (tok_bos(m->tok) >= 0)
		c->bos = tok_bos(m->tok);
	if (tok_eos(m->tok) >= 0)
		c->eos = tok_eos(m->tok);
	return 0;
}

/*
 * model/model.c — a model's life: which loader reads a path (the
 * registry), its fingerprint, its description, freeing it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <xxhash.h>

#include "model/loader.h"
#include "model/model.h"

void model_drop_pages(const struct model *m, const void *p, size_t len)
{
	uintptr_t a = (uintptr_t)p, e = a + len;
	for (int i = 0; i < m->n_maps; i++) {
		uintptr_t ma = (uintptr_t)m->maps[i].addr, me = ma + m->maps[i].len;
		if (a < ma || e > me)
			continue;
		uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
		uintptr_t lo = (a + pg - 1) & ~(pg - 1), hi = e & ~(pg - 1);
		if (lo < hi)   /* shared read-only file mapping: only drops PTEs */
			madvise((void *)lo, hi - lo, MADV_DONTNEED);
		return;
	}
}

static void hash_weight(XXH64_state_t *st, const struct kt_weight *w)
{
	uint32_t dt = (uint32_t)w->dtype;
	XXH64_update(st, &dt, sizeof(dt));
	XXH64_update(st, w->data, model_weight_bytes(w));
}

static uint64_t model_fingerprint(const struct model *m)
{
	const struct model_config *c = &m->cfg;
	XXH64_state_t *st = XXH64_createState();
	if (!st)
		return 0;
	XXH64_reset(st, 0);
	int32_t hp[] = { c->dim, c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim,
			 c->ffn_dim, c->vocab, c->max_ctx, (int32_t)c->rope_layout };
	XXH64_update(st, hp, sizeof(hp));
	XXH64_update(st, &c->rms_eps, sizeof(c->rms_eps));
	XXH64_update(st, &c->rope_theta, sizeof(c->rope_theta));
	/* unscaled, the table is a function of theta and head_dim (hashed
	 * above), so models without scaling keep their fingerprints */
	if (m->rope_freqs && m->inv_freq)
		XXH64_update(st, m->inv_freq, (size_t)(c->head_dim / 2) * sizeof(float));
	hash_weight(st, &m->embed);
	for (int l = 0; l < c->n_layers; l++) {
		const struct model_layer *L = &m->layers[l];
		XXH64_update(st, L->att_norm, (size_t)c->dim * sizeof(float));
		XXH64_update(st, L->ffn_norm, (size_t)c->dim * sizeof(float));
		hash_weight(st, &L->wq);
		hash_weight(st, &L->wk);
		hash_weight(st, &L->wv);
		hash_weight(st, &L->wo);
		hash_weight(st, &L->w1);
		hash_weight(st, &L->w2);
		hash_weight(st, &L->w3);
	}
	XXH64_update(st, m->final_norm, (size_t)c->dim * sizeof(float));
	hash_weight(st, &m->cls);
	uint64_t h = XXH64_digest(st);
	XXH64_freeState(st);
	return h;
}

/* The formats, in the order their probes are asked: a folder or a
 * safetensors/config.json path, then GGUF (by name or magic), then
 * llama2.c, which takes anything else and says what it is not. */
static const struct model_loader *const loaders[] = {
	&model_loader_hf, &model_loader_gguf, &model_loader_llama2c,
};

struct model *model_load(const char *path, const char *tokenizer, char **cause)
{
	struct model *m = calloc(1, sizeof(*m));
	if (!m || !(m->path = strdup(path))) {
		free(m);
		cause_set(cause, "%s: out of memory", path);
		return NULL;
	}
	m->cfg.bos = 1;
	m->cfg.eos = 2;
	const struct model_loader *l = loaders[0];
	for (size_t i = 0; i < sizeof loaders / sizeof loaders[0]; i++)
		if ((l = loaders[i])->probe(path))
			break;
	m->format = l->name;
	if (l->load(m, path, tokenizer, cause) != 0) {
		model_free(m);
		return NULL;
	}
	m->fingerprint = model_fingerprint(m);
	return m;
}

void model_free(struct model *m)
{
	if (!m)
		return;
	tok_free(m->tok);
	for (int i = 0; i < m->n_maps; i++)
		munmap(m->maps[i].addr, m->maps[i].len);
	free(m->maps);
	for (int i = 0; i < m->n_owned; i++)
		free(m->owned[i]);
	free(m->owned);
	free(m->layers);
	free(m->chat_template_text);
	free(m->path);
	free(m);
}

void model_describe(const struct model *m, char *buf, size_t cap)
{
	const struct model_config *c = &m->cfg;
	snprintf(buf, cap,
		 "%s %s: dim %d, layers %d, heads %d/%d kv, head_dim %d, ffn %d, vocab %d, "
		 "ctx %d%s, %s weights, %.1f MiB",
		 m->format, m->path, c->dim, c->n_layers, c->n_heads, c->n_kv_heads,
		 c->head_dim, c->ffn_dim, c->vocab, c->max_ctx,
		 m->rope_freqs ? " (scaled RoPE)" : "", kt_dtype_name(m->wtype),
		 (double)m->weight_bytes / (1 << 20));
}

/*
 * model/model.c — format dispatch and what every loader shares: file
 * mapping, owned buffers, hyper-parameter checks, RoPE table, tokenizer.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "model/model.h"
#include "text/vocab.h"
#include "util/file.h"

int model_add_map(struct model *m, void *addr, size_t len)
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

const char *model_config_check(const struct model_config *c)
{
	if (c->dim <= 0 || c->dim > 65536)
		return "dim out of range";
	if (c->n_layers <= 0 || c->n_layers > 1024)
		return "layer count out of range";
	if (c->n_heads <= 0 || c->n_heads > 1024)
		return "head count out of range";
	if (c->n_kv_heads <= 0 || c->n_kv_heads > c->n_heads || c->n_heads % c->n_kv_heads)
		return "kv head count must divide the head count";
	if (c->head_dim <= 0 || c->head_dim > 512 || c->head_dim % 2)
		return "head dimension must be even and at most 512";
	if (c->ffn_dim <= 0 || c->ffn_dim > 1 << 20)
		return "ffn size out of range";
	if (c->vocab <= 2 || c->vocab > 1 << 22)
		return "vocabulary size out of range";
	if (c->max_ctx <= 0 || c->max_ctx > 1 << 24)
		return "context length out of range";
	if (!(c->rms_eps > 0 && c->rms_eps < 1))
		return "rms eps out of range";
	if (!(c->rope_theta > 1 && c->rope_theta < 1e9))
		return "rope theta out of range";
	return NULL;
}

/* theta^(-2i/hd) in f32: the unscaled inverse frequency, computed one way
 * for every format and for model_rope_llama3. */
static float base_inv_freq(float theta, int hd, int i)
{
	return 1.0f / powf(theta, (float)(2 * i) / (float)hd);
}

const char *model_rope_llama3(float theta, int head_dim, double factor, double low,
			      double high, double orig, float *out)
{
	if (!(factor > 0 && factor < 1e6))
		return "rope_scaling factor must be positive";
	if (!(low > 0 && high > low && high < 1e6))
		return "rope_scaling needs 0 < low_freq_factor < high_freq_factor";
	if (!(orig >= 1 && orig <= 1 << 24))
		return "rope_scaling original_max_position_embeddings out of range";
	double low_wl = orig / low, high_wl = orig / high;
	for (int i = 0; i < head_dim / 2; i++) {
		double w = 2 * M_PI / (double)base_inv_freq(theta, head_dim, i);
		double d;
		if (w < high_wl) {
			d = 1;
		} else if (w > low_wl) {
			d = factor;
		} else {
			double s = (orig / w - low) / (high - low);
			d = 1 / ((1 - s) / factor + s);
		}
		out[i] = (float)d;
	}
	return NULL;
}

static int is_dir(const char *p)
{
	struct stat st;
	return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int has_suffix(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);
	return a >= b && strcmp(s + a - b, suf) == 0;
}

static size_t weight_bytes(const struct kt_weight *w)
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
	for (int i = 0; i < half; i++) {
		m->inv_freq[i] = base_inv_freq(c->rope_theta, c->head_dim, i);
		if (m->rope_freqs)
			m->inv_freq[i] /= m->rope_freqs[i];
	}

	size_t wb = weight_bytes(&m->cls);
	for (int l = 0; l < c->n_layers; l++) {
		const struct model_layer *L = &m->layers[l];
		wb += weight_bytes(&L->wq) + weight_bytes(&L->wk) + weight_bytes(&L->wv) +
		      weight_bytes(&L->wo) + weight_bytes(&L->w1) + weight_bytes(&L->w2) +
		      weight_bytes(&L->w3);
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

static void hash_weight(XXH64_state_t *st, const struct kt_weight *w)
{
	uint32_t dt = (uint32_t)w->dtype;
	XXH64_update(st, &dt, sizeof(dt));
	XXH64_update(st, w->data, weight_bytes(w));
}

uint64_t model_fingerprint(const struct model *m)
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
	m->chat_template = "unknown";
	int rc;
	if (is_dir(path) || has_suffix(path, ".safetensors") ||
	    has_suffix(path, ".safetensors.index.json") || has_suffix(path, "config.json")) {
		rc = model_load_hf(m, path, tokenizer, cause);
	} else if (has_suffix(path, ".gguf") || file_has_magic(path, "GGUF", 4)) {
		rc = model_load_gguf(m, path, tokenizer, cause);
	} else {
		rc = model_load_llama2c(m, path, tokenizer, cause);
	}
	if (rc != 0) {
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

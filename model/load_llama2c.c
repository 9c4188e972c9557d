/*
 * model/load_llama2c.c — llama2.c checkpoints: a legacy header of 7 int32
 * (format/llama2c.c: dim, hidden_dim, n_layers, n_heads, n_kv_heads,
 * vocab_size, seq_len; a positive vocab_size means the classifier is the
 * embedding table), then fp32 arrays in run.c's order. Weights point
 * straight into the read-only map.
 */
#include <errno.h>
#include <libgen.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/llama2c.h"
#include "model/loader.h"
#include "model/model.h"

static struct kt_weight take(const float **p, int rows, int cols)
{
	struct kt_weight w = { *p, KT_F32, rows, cols, NULL };
	*p += (size_t)rows * cols;
	return w;
}

static int load_llama2c(struct model *m, const char *path, const char *tokenizer,
			char **cause)
{
	const uint8_t *data;
	size_t len;
	int rc = model_map_file(m, path, &data, &len, cause);
	if (rc)
		return rc;
	struct l2c_header h;
	rc = l2c_read_header(data, len, &h);
	if (rc == -ENOTSUP) {
		cause_set(cause, "%s: llama2.c export format v1/v2 is not supported "
			  "(only the legacy 7-int32 header)", path);
		return rc;
	}
	if (rc) {
		cause_set(cause, "%s: not a model this llamad reads: %zu bytes, truncated as a "
			  "llama2.c checkpoint (a 28-byte header); models are GGUF files, "
			  "Hugging Face folders (config.json and safetensors) and llama2.c "
			  "checkpoints (.bin)", path, len);
		return rc;
	}
	struct model_config *c = &m->cfg;
	c->dim = h.dim;
	c->ffn_dim = h.hidden_dim;
	c->n_layers = h.n_layers;
	c->n_heads = h.n_heads;
	c->n_kv_heads = h.n_kv_heads;
	int shared = h.vocab_size > 0;
	c->vocab = h.vocab_size > 0 ? h.vocab_size : (h.vocab_size == INT32_MIN ? 0 : -h.vocab_size);
	c->max_ctx = h.seq_len;
	c->head_dim = c->n_heads > 0 ? c->dim / c->n_heads : 0;
	c->rms_eps = 1e-5f;
	c->rope_theta = 10000.0f;
	c->rope_layout = KT_ROPE_INTERLEAVED;
	const char *why = model_config_check(c);
	if (!why && c->dim % c->n_heads)
		why = "dim is not a multiple of the head count";
	if (why) {
		cause_set(cause, "%s: not a llama2.c checkpoint: %s (header %d %d %d %d %d %d "
			  "%d); models are GGUF files, Hugging Face folders (config.json "
			  "and safetensors) and llama2.c checkpoints (.bin)",
			  path, why, h.dim, h.hidden_dim, h.n_layers, h.n_heads, h.n_kv_heads,
			  h.vocab_size, h.seq_len);
		return -EINVAL;
	}
	/* Expected size, in floats, computed in 64 bits (no overflow for sane headers). */
	uint64_t D = (uint64_t)c->dim, L = (uint64_t)c->n_layers, F = (uint64_t)c->ffn_dim;
	uint64_t KV = (uint64_t)model_kv_dim(c), V = (uint64_t)c->vocab;
	uint64_t hs = (uint64_t)c->head_dim;
	uint64_t floats = V * D + L * D + L * D * D + 2 * L * D * KV + L * D * D + L * D +
			  3 * L * D * F + D + 2 * (uint64_t)c->max_ctx * hs / 2;
	if (!shared)
		floats += V * D;
	uint64_t want = L2C_HEADER_BYTES + floats * 4;
	if (len != want) {
		cause_set(cause, "%s: %s: file has %zu bytes, the header's shapes need %llu",
			  path, len < want ? "truncated" : "size does not match header",
			  len, (unsigned long long)want);
		return -EINVAL;
	}
	m->wtype = KT_F32;
	m->layers = calloc((size_t)c->n_layers, sizeof(*m->layers));
	if (!m->layers)
		return -ENOMEM;
	const float *p = (const float *)(data + L2C_HEADER_BYTES);
	int kv = model_kv_dim(c);
	m->embed = take(&p, c->vocab, c->dim);
	for (int l = 0; l < c->n_layers; l++)
		m->layers[l].att_norm = p + (size_t)l * c->dim;
	p += (size_t)c->n_layers * c->dim;
	for (int l = 0; l < c->n_layers; l++)
		m->layers[l].wq = take(&p, c->dim, c->dim);
	for (int l = 0; l < c->n_layers; l++)
		m->layers[l].wk = take(&p, kv, c->dim);
	for (int l = 0; l < c->n_layers; l++)
		m->layers[l].wv = take(&p, kv, c->dim);
	for (int l = 0; l < c->n_layers; l++)
		m->layers[l].wo = take(&p, c->dim, c->dim);
	for (int l = 0; l < c->n_layers; l++)
		m->layers[l].ffn_norm = p + (size_t)l * c->dim;
	p += (size_t)c->n_layers * c->dim;
	for (int l = 0; l < c->n_layers; l++)
		m->layers[l].w1 = take(&p, c->ffn_dim, c->dim);
	for (int l = 0; l < c->n_layers; l++)
		m->layers[l].w2 = take(&p, c->dim, c->ffn_dim);
	for (int l = 0; l < c->n_layers; l++)
		m->layers[l].w3 = take(&p, c->ffn_dim, c->dim);
	m->final_norm = p;
	p += c->dim;
	p += (size_t)c->max_ctx * c->head_dim;  /* freq_cis real + imag: recomputed */
	m->cls = shared ? m->embed : take(&p, c->vocab, c->dim);

	char *dup = strdup(path);
	char *deftok = NULL;
	if (!dup || asprintf(&deftok, "%s/tokenizer.model", dirname(dup)) < 0)
		deftok = NULL;
	free(dup);
	if (!deftok)
		return -ENOMEM;
	rc = model_finish(m, tokenizer, deftok, NULL, cause);
	free(deftok);
	return rc;
}

/* Anything the other formats did not claim: the loader says what it is
 * not. */
static int probe_llama2c(const char *path)
{
	(void)path;
	return 1;
}

const struct model_loader model_loader_llama2c = { "llama2.c", probe_llama2c, load_llama2c };

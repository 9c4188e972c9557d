/*
 * model/load_gguf.c — the weights and hyper-parameters of a GGUF file (the
 * container is read by format/gguf.c, the vocabulary and chat template by
 * text/vocab_gguf.c). Matrices are used in place from the read-only map
 * (copied only if misaligned); norm vectors become fp32.
 *
 * GGUF Llama files store wq/wk rows in Meta's interleaved RoPE pair order
 * (llama.cpp's converter undoes Hugging Face's permutation), so the model is
 * KT_ROPE_INTERLEAVED, like a llama2.c checkpoint.
 *
 * RoPE scaling: llama.rope.scaling.type must be absent or "none"; Llama
 * 3.1/3.2 files carry their scaling as the tensor rope_freqs.weight (F32,
 * head_dim/2 divisors of the inverse frequencies, as llama.cpp writes it),
 * which becomes m->rope_freqs.
 */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "model/loader.h"
#include "model/model.h"
#include "text/chat.h"
#include "text/vocab.h"
#include "util/file.h"

/* A matrix W (rows, cols): GGUF shape [cols, rows]. */
static int get_matrix(struct model *m, struct gguf *g, const char *name, int rows, int cols,
		      struct kt_weight *w)
{
	struct gguf_tensor *t = gguf_find_tensor(g, name);
	if (!t) {
		cause_set(g->cause, "%s: tensor %s is missing", g->path, name);
		return -EINVAL;
	}
	t->used = 1;
	if (t->ne[0] != (uint64_t)cols || t->ne[1] != (uint64_t)rows || t->ne[2] != 1 ||
	    t->ne[3] != 1) {
		cause_set(g->cause, "%s: tensor %s has shape [%llu, %llu, %llu, %llu], the "
			  "hyper-parameters imply [%d, %d]", g->path, name,
			  (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
			  (unsigned long long)t->ne[2], (unsigned long long)t->ne[3],
			  cols, rows);
		return -EINVAL;
	}
	const struct ggml_type *gt = gguf_ggml_type(t->type);
	w->dtype = (enum kt_dtype)gt->kt;
	w->rows = rows;
	w->cols = cols;
	/* fp32 wants 4-byte alignment; fp16, bf16 and the f16 block scales 2 */
	size_t al = gt->kt == KT_F32 ? 4 : 2;
	if ((uintptr_t)t->data % al) {
		void *p = model_own(m, t->bytes);
		if (!p)
			return -ENOMEM;
		memcpy(p, t->data, t->bytes);
		w->data = p;
	} else {
		w->data = t->data;
	}
	return 0;
}

/* A norm vector of n elements as fp32 (converted from f16/bf16 if needed). */
static int get_vector(struct model *m, struct gguf *g, const char *name, int n,
		      const float **out)
{
	struct gguf_tensor *t = gguf_find_tensor(g, name);
	if (!t) {
		cause_set(g->cause, "%s: tensor %s is missing", g->path, name);
		return -EINVAL;
	}
	t->used = 1;
	if (t->ne[0] != (uint64_t)n || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1) {
		cause_set(g->cause, "%s: tensor %s has shape [%llu, %llu, %llu, %llu], "
			  "expected [%d]", g->path, name, (unsigned long long)t->ne[0],
			  (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
			  (unsigned long long)t->ne[3], n);
		return -EINVAL;
	}
	const struct ggml_type *gt = gguf_ggml_type(t->type);
	if (gt->kt == KT_F32 && (uintptr_t)t->data % 4 == 0) {
		*out = (const float *)t->data;
		return 0;
	}
	if (gt->kt != KT_F32 && gt->kt != KT_F16 && gt->kt != KT_BF16) {
		cause_set(g->cause, "%s: norm tensor %s has type %s (F32, F16 or BF16 "
			  "expected)", g->path, name, gt->name);
		return -ENOTSUP;
	}
	float *v = model_own(m, (size_t)n * sizeof(float));
	if (!v)
		return -ENOMEM;
	kt_row_to_f32(gt->kt, t->data, v, (size_t)n);  /* F32/F16/BF16, checked above */
	*out = v;
	return 0;
}

/* rope_freqs.weight: head_dim/2 F32 divisors of the RoPE inverse
 * frequencies, each finite and positive; m->rope_freqs points at them. */
static int get_rope_freqs(struct model *m, struct gguf *g)
{
	struct gguf_tensor *t = gguf_find_tensor(g, "rope_freqs.weight");
	int n = m->cfg.head_dim / 2;
	t->used = 1;
	if (t->type != 0) {
		cause_set(g->cause, "%s: tensor rope_freqs.weight has type %s (F32 expected)",
			  g->path, gguf_ggml_type(t->type)->name);
		return -EINVAL;
	}
	if (t->ne[0] != (uint64_t)n || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1) {
		cause_set(g->cause, "%s: tensor rope_freqs.weight has shape [%llu, %llu, %llu, "
			  "%llu], expected [%d] (head_dim / 2)", g->path,
			  (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
			  (unsigned long long)t->ne[2], (unsigned long long)t->ne[3], n);
		return -EINVAL;
	}
	float *v = model_own(m, (size_t)n * sizeof(float));
	if (!v)
		return -ENOMEM;
	memcpy(v, t->data, (size_t)n * sizeof(float));  /* little-endian, as the host */
	for (int i = 0; i < n; i++)
		if (!(v[i] > 0 && v[i] < 1e30f)) {
			cause_set(g->cause, "%s: tensor rope_freqs.weight: entry %d is %g, not a "
				  "finite positive divisor", g->path, i, (double)v[i]);
			return -EINVAL;
		}
	m->rope_freqs = v;
	return 0;
}

/* ---- model ------------------------------------------------------------------ */

static int check_arch(struct gguf *g)
{
	const uint8_t *s;
	size_t n;
	int r = gguf_kv_str(g, "general.architecture", &s, &n);
	if (r < 0)
		return r;
	if (r == 0) {
		cause_set(g->cause, "%s: GGUF key general.architecture is missing", g->path);
		return -EINVAL;
	}
	if (!gguf_str_is(s, n, "llama")) {
		char b[96];
		cause_set(g->cause, "%s: architecture \"%s\" is not supported (llama is)",
			  g->path, gguf_shown(s, n, b));
		return -ENOTSUP;
	}
	return 0;
}

static int read_hparams(struct model *m, struct gguf *g)
{
	struct model_config *c = &m->cfg;
	int r, kl = 0, vl = 0, rope_dim = 0, experts = 0;
	if ((r = gguf_kv_param(g, "llama.embedding_length", -1, &c->dim)) ||
	    (r = gguf_kv_param(g, "llama.block_count", -1, &c->n_layers)) ||
	    (r = gguf_kv_param(g, "llama.feed_forward_length", -1, &c->ffn_dim)) ||
	    (r = gguf_kv_param(g, "llama.attention.head_count", -1, &c->n_heads)) ||
	    (r = gguf_kv_param(g, "llama.attention.head_count_kv", c->n_heads, &c->n_kv_heads)) ||
	    (r = gguf_kv_param(g, "llama.context_length", -1, &c->max_ctx)) ||
	    (r = gguf_kv_float(g, "llama.attention.layer_norm_rms_epsilon", 1e-5, &c->rms_eps)) ||
	    (r = gguf_kv_float(g, "llama.rope.freq_base", 10000.0, &c->rope_theta)))
		return r;
	if (c->dim % c->n_heads) {
		cause_set(g->cause, "%s: embedding_length %d is not a multiple of "
			  "head_count %d", g->path, c->dim, c->n_heads);
		return -EINVAL;
	}
	c->head_dim = c->dim / c->n_heads;
	if ((r = gguf_kv_param(g, "llama.rope.dimension_count", c->head_dim, &rope_dim)) ||
	    (r = gguf_kv_param(g, "llama.attention.key_length", c->head_dim, &kl)) ||
	    (r = gguf_kv_param(g, "llama.attention.value_length", c->head_dim, &vl)))
		return r;
	if (rope_dim != c->head_dim) {
		cause_set(g->cause, "%s: llama.rope.dimension_count %d differs from the "
			  "head dimension %d (partial RoPE is not supported)", g->path,
			  rope_dim, c->head_dim);
		return -ENOTSUP;
	}
	if (kl != c->head_dim || vl != c->head_dim) {
		cause_set(g->cause, "%s: attention key/value length %d/%d differs from "
			  "embedding_length / head_count = %d (not supported)", g->path,
			  kl, vl, c->head_dim);
		return -ENOTSUP;
	}
	int64_t ex = 0;
	if ((r = gguf_kv_int(g, "llama.expert_count", &ex)) < 0)
		return r;
	experts = ex > 0;
	if (experts) {
		cause_set(g->cause, "%s: mixture-of-experts models (llama.expert_count %lld) "
			  "are not supported", g->path, (long long)ex);
		return -ENOTSUP;
	}
	const uint8_t *s;
	size_t n;
	if ((r = gguf_kv_str(g, "llama.rope.scaling.type", &s, &n)) < 0)
		return r;
	if (r == 1 && !gguf_str_is(s, n, "none")) {
		char b[96];
		cause_set(g->cause, "%s: RoPE scaling \"%s\" (llama.rope.scaling.type) is "
			  "not supported (none is, and Llama 3.1 scaling as the tensor "
			  "rope_freqs.weight)", g->path, gguf_shown(s, n, b));
		return -ENOTSUP;
	}
	c->rope_layout = KT_ROPE_INTERLEAVED;
	return 0;
}

/* Tensors point into the read-only map; the tokenizer is `tokenizer` if
 * given, else the file's own vocabulary, else tokenizer.model beside the
 * file. */
static int load_gguf(struct model *m, const char *path, const char *tokenizer, char **cause)
{
	const uint8_t *data;
	size_t len;
	int rc = model_map_file(m, path, &data, &len, cause);
	if (rc)
		return rc;
	struct gguf g = { .path = path, .base = data, .len = len, .cause = cause };
	char *deftok = NULL;
	struct model_config *c = &m->cfg;
	if ((rc = gguf_parse_kv(&g)) || (rc = check_arch(&g)) || (rc = gguf_parse_tensors(&g)) ||
	    (rc = read_hparams(m, &g)))
		goto out;

	/* the vocabulary size is the embedding table's */
	struct gguf_tensor *te = gguf_find_tensor(&g, "token_embd.weight");
	if (!te) {
		cause_set(cause, "%s: tensor token_embd.weight is missing", path);
		rc = -EINVAL;
		goto out;
	}
	c->vocab = te->ne[1] <= INT_MAX ? (int)te->ne[1] : 0;
	int vk = 0;
	if ((rc = gguf_kv_param(&g, "llama.vocab_size", c->vocab, &vk)))
		goto out;
	if (vk != c->vocab) {
		cause_set(cause, "%s: llama.vocab_size %d but token_embd.weight has %d rows",
			  path, vk, c->vocab);
		rc = -EINVAL;
		goto out;
	}
	const char *why = model_config_check(c);
	if (why) {
		cause_set(cause, "%s: %s", path, why);
		rc = -EINVAL;
		goto out;
	}

	m->layers = calloc((size_t)c->n_layers, sizeof(*m->layers));
	if (!m->layers) {
		rc = -ENOMEM;
		goto out;
	}
	int D = c->dim, Q = c->n_heads * c->head_dim, KV = model_kv_dim(c), F = c->ffn_dim;
	if ((rc = get_matrix(m, &g, "token_embd.weight", c->vocab, D, &m->embed)) ||
	    (rc = get_vector(m, &g, "output_norm.weight", D, &m->final_norm)))
		goto out;
	if (gguf_find_tensor(&g, "output.weight")) {
		if ((rc = get_matrix(m, &g, "output.weight", c->vocab, D, &m->cls)))
			goto out;
	} else {
		m->cls = m->embed;  /* tied */
	}
	for (int l = 0; l < c->n_layers; l++) {
		struct model_layer *L = &m->layers[l];
		char nm[8][64];
		static const char *const parts[8] = {
			"attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
			"ffn_gate", "ffn_down",
		};
		for (int i = 0; i < 8; i++)
			snprintf(nm[i], sizeof nm[i], "blk.%d.%s.weight", l, parts[i]);
		char up[64];
		snprintf(up, sizeof up, "blk.%d.ffn_up.weight", l);
		if ((rc = get_vector(m, &g, nm[0], D, &L->att_norm)) ||
		    (rc = get_vector(m, &g, nm[1], D, &L->ffn_norm)) ||
		    (rc = get_matrix(m, &g, nm[2], Q, D, &L->wq)) ||
		    (rc = get_matrix(m, &g, nm[3], KV, D, &L->wk)) ||
		    (rc = get_matrix(m, &g, nm[4], KV, D, &L->wv)) ||
		    (rc = get_matrix(m, &g, nm[5], D, Q, &L->wo)) ||
		    (rc = get_matrix(m, &g, nm[6], F, D, &L->w1)) ||
		    (rc = get_matrix(m, &g, nm[7], D, F, &L->w2)) ||
		    (rc = get_matrix(m, &g, up, F, D, &L->w3)))
			goto out;
	}
	if (gguf_find_tensor(&g, "rope_freqs.weight") && (rc = get_rope_freqs(m, &g)))
		goto out;
	/* anything else (biases, experts, extra layers) would be silently
	 * ignored: refuse it */
	for (size_t i = 0; i < g.n_t; i++) {
		if (g.t[i].used)
			continue;
		char b[96];
		cause_set(cause, "%s: tensor %s is not part of a Llama model llamad can "
			  "run (biases, experts are not supported)", path,
			  gguf_shown(g.t[i].name, g.t[i].name_len, b));
		rc = -ENOTSUP;
		goto out;
	}
	m->wtype = m->layers[0].wq.dtype;
	size_t tl = 0;
	if ((rc = vocab_gguf_template(&g, &m->chat_template_text, &tl)))
		goto out;
	if (m->chat_template_text)
		m->chat_template = chat_classify_template(m->chat_template_text, tl);

	/* tokenizer: --tokenizer wins, then the metadata, then tokenizer.model
	 * beside the file */
	if (!tokenizer && (rc = vocab_gguf(&g, &m->tok)))
		goto out;
	char *dup = strdup(path);
	if (!dup || asprintf(&deftok, "%s/tokenizer.model", dirname(dup)) < 0)
		deftok = NULL;
	free(dup);
	if (!deftok) {
		rc = -ENOMEM;
		goto out;
	}
	int embedded = m->tok != NULL;
	rc = model_finish(m, tokenizer, deftok, NULL, cause);
	if (rc && !tokenizer && !embedded && cause && *cause) {
		char *inner = *cause;
		*cause = NULL;
		cause_set(cause, "%s: no tokenizer in the GGUF metadata; %s", path, inner);
		free(inner);
	}
out:
	free(deftok);
	gguf_done(&g);
	return rc;
}

/* A .gguf name, or the GGUF magic. */
static int probe_gguf(const char *path)
{
	return model_has_suffix(path, ".gguf") || file_has_magic(path, "GGUF", 4);
}

const struct model_loader model_loader_gguf = { "gguf", probe_gguf, load_gguf };

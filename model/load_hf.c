/*
 * model/load_hf.c — Hugging Face folders: config.json for the
 * hyper-parameters, model.safetensors (or shards listed in
 * model.safetensors.index.json) for the weights.
 *
 * The safetensors files are read by format/safetensors.c. Matrices
 * are used in place from the read-only map (copied only when misaligned);
 * norm vectors are converted to owned fp32. HF stores wq/wk rows in the
 * rotate_half pair layout: the model is marked KT_ROPE_HALF and the RoPE op
 * reads pairs (i, i+hd/2), which gives bit-identical results to llama2.c's
 * interleaved layout.
 *
 * config.json's rope_scaling may be absent, null, "default" or "llama3"
 * (Llama 3.1/3.2: a table of per-frequency divisors, model_rope_llama3);
 * other types are refused. The tokenizer is tokenizer.model, else
 * tokenizer.json; the folder's tokenizer_config.json, generation_config.json
 * and chat_template.jinja are read once, by text/vocab_hf.c.
 */
#include <errno.h>
#include <jansson.h>
#include <libgen.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "format/safetensors.h"
#include "model/loader.h"
#include "model/model.h"
#include "text/chat.h"
#include "text/vocab.h"

/* Map one shard and add its tensors to the set. */
static int st_add_file(struct model *m, struct st_set *s, const char *path, char **cause)
{
	const uint8_t *data;
	size_t len;
	int rc = model_map_file(m, path, &data, &len, cause);
	return rc ? rc : st_parse(s, path, data, len, cause);
}

static int get_matrix(struct model *m, const struct st_set *s, const char *name,
		      int rows, int cols, struct kt_weight *w, char **cause)
{
	const struct st_tensor *t = st_find(s, name);
	if (!t) {
		cause_set(cause, "%s: tensor %s is missing", m->path, name);
		return -EINVAL;
	}
	if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols) {
		cause_set(cause, "%s: tensor %s has shape [%lld, %lld], config.json implies [%d, %d]",
			  t->file, name, (long long)t->shape[0],
			  (long long)(t->ndim > 1 ? t->shape[1] : 0), rows, cols);
		return -EINVAL;
	}
	w->dtype = t->dtype;
	w->rows = rows;
	w->cols = cols;
	size_t esz = kt_dtype_size(t->dtype);
	if ((uintptr_t)t->data % esz) {
		size_t bytes = (size_t)rows * cols * esz;
		void *p = model_own(m, bytes);
		if (!p)
			return -ENOMEM;
		memcpy(p, t->data, bytes);
		w->data = p;
	} else {
		w->data = t->data;
	}
	return 0;
}

static int get_vector(struct model *m, const struct st_set *s, const char *name, int n,
		      const float **out, char **cause)
{
	const struct st_tensor *t = st_find(s, name);
	if (!t) {
		cause_set(cause, "%s: tensor %s is missing", m->path, name);
		return -EINVAL;
	}
	if (t->ndim != 1 || t->shape[0] != n) {
		cause_set(cause, "%s: tensor %s has %lld elements in %d dims, expected [%d]",
			  t->file, name, (long long)t->shape[0], t->ndim, n);
		return -EINVAL;
	}
	float *v = model_own(m, (size_t)n * sizeof(float));
	if (!v)
		return -ENOMEM;
	kt_row_to_f32(t->dtype, t->data, v, (size_t)n);  /* parse_dtype gives F32/F16/BF16 only */
	*out = v;
	return 0;
}

static int cfg_int(json_t *root, const char *key, int def, int *out)
{
	json_t *v = json_object_get(root, key);
	if (!v || json_is_null(v)) {
		if (def < 0)
			return -1;
		*out = def;
		return 0;
	}
	if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
		return -1;
	*out = (int)json_integer_value(v);
	return 0;
}

static int cfg_float(json_t *root, const char *key, double def, float *out)
{
	json_t *v = json_object_get(root, key);
	if (!v || json_is_null(v)) {
		*out = (float)def;
		return 0;
	}
	if (!json_is_number(v))
		return -1;
	*out = (float)json_number_value(v);
	return 0;
}

/* eos_token_id: an id, or a list of ids (Llama 3.1 Instruct): the first is
 * the EOS, all of them (at most MAX_EOS) go to ids / *n. Absent: 2. */
#define MAX_EOS 8
static int cfg_eos(json_t *root, struct model_config *c, int *ids, int *n)
{
	json_t *v = json_object_get(root, "eos_token_id");
	*n = 0;
	if (!json_is_array(v))
		return cfg_int(root, "eos_token_id", 2, &c->eos);
	size_t k = json_array_size(v);
	if (k == 0 || k > MAX_EOS)
		return -1;
	for (size_t i = 0; i < k; i++) {
		json_t *e = json_array_get(v, i);
		if (!json_is_integer(e) || json_integer_value(e) < 0 ||
		    json_integer_value(e) > INT32_MAX)
			return -1;
		ids[(*n)++] = (int)json_integer_value(e);
	}
	c->eos = ids[0];
	return 0;
}

/* A number field of a rope_scaling object; NULL if fine, else its name. */
static const char *rs_num(json_t *rs, const char *key, double *out)
{
	json_t *v = json_object_get(rs, key);
	if (!json_is_number(v))
		return key;
	*out = json_number_value(v);
	return NULL;
}

/* config.json rope_scaling: absent, null or rope_type "default": none;
 * "llama3" (Llama 3.1/3.2): the divisor table m->rope_freqs; any other type
 * is refused, naming it. */
static int read_rope_scaling(struct model *m, json_t *rs, const char *cpath, char **cause)
{
	if (!rs || json_is_null(rs))
		return 0;
	if (!json_is_object(rs)) {
		cause_set(cause, "%s: rope_scaling is not an object", cpath);
		return -EINVAL;
	}
	json_t *ty = json_object_get(rs, "rope_type");
	if (!ty)
		ty = json_object_get(rs, "type");
	if (!json_is_string(ty)) {
		cause_set(cause, "%s: rope_scaling has no rope_type string", cpath);
		return -EINVAL;
	}
	const char *t = json_string_value(ty);
	if (!strcmp(t, "default"))
		return 0;
	if (strcmp(t, "llama3") != 0) {
		cause_set(cause, "%s: rope_scaling type \"%.40s\" is not supported "
			  "(llama3 is)", cpath, t);
		return -ENOTSUP;
	}
	double f, lo, hi, orig;
	const char *bad = rs_num(rs, "factor", &f);
	if (!bad)
		bad = rs_num(rs, "low_freq_factor", &lo);
	if (!bad)
		bad = rs_num(rs, "high_freq_factor", &hi);
	if (!bad)
		bad = rs_num(rs, "original_max_position_embeddings", &orig);
	if (bad) {
		cause_set(cause, "%s: rope_scaling llama3: missing or invalid \"%s\"",
			  cpath, bad);
		return -EINVAL;
	}
	const struct model_config *c = &m->cfg;
	float *rf = model_own(m, (size_t)(c->head_dim / 2) * sizeof(float));
	if (!rf)
		return -ENOMEM;
	const char *why = model_rope_llama3(c->rope_theta, c->head_dim, f, lo, hi, orig, rf);
	if (why) {
		cause_set(cause, "%s: %s", cpath, why);
		return -EINVAL;
	}
	m->rope_freqs = rf;
	return 0;
}

static int read_config(struct model *m, const char *dir, int *tied, int *eos_ids, int *n_eos,
		       char **cause)
{
	char *cpath = NULL;
	if (asprintf(&cpath, "%s/config.json", dir) < 0)
		return -ENOMEM;
	json_error_t jerr;
	json_t *root = json_load_file(cpath, 0, &jerr);
	int rc = 0;
	if (!root || !json_is_object(root)) {
		cause_set(cause, "%s: %s", cpath, root ? "not a JSON object" : jerr.text);
		rc = -EINVAL;
		goto out;
	}
	json_t *mt = json_object_get(root, "model_type");
	if (json_is_string(mt) && strcmp(json_string_value(mt), "llama") != 0 &&
	    strcmp(json_string_value(mt), "mistral") != 0) {
		cause_set(cause, "%s: model_type \"%s\" is not supported (llama is)",
			  cpath, json_string_value(mt));
		rc = -ENOTSUP;
		goto out;
	}
	struct model_config *c = &m->cfg;
	const char *bad = NULL;
	if (cfg_int(root, "hidden_size", -1, &c->dim))
		bad = "hidden_size";
	else if (cfg_int(root, "num_hidden_layers", -1, &c->n_layers))
		bad = "num_hidden_layers";
	else if (cfg_int(root, "num_attention_heads", -1, &c->n_heads) || c->n_heads == 0)
		bad = "num_attention_heads";
	else if (cfg_int(root, "num_key_value_heads", c->n_heads, &c->n_kv_heads))
		bad = "num_key_value_heads";
	else if (cfg_int(root, "head_dim", c->dim / c->n_heads, &c->head_dim))
		bad = "head_dim";
	else if (cfg_int(root, "intermediate_size", -1, &c->ffn_dim))
		bad = "intermediate_size";
	else if (cfg_int(root, "vocab_size", -1, &c->vocab))
		bad = "vocab_size";
	else if (cfg_int(root, "max_position_embeddings", 2048, &c->max_ctx))
		bad = "max_position_embeddings";
	else if (cfg_float(root, "rms_norm_eps", 1e-6, &c->rms_eps))
		bad = "rms_norm_eps";
	else if (cfg_float(root, "rope_theta", 10000.0, &c->rope_theta))
		bad = "rope_theta";
	else if (cfg_int(root, "bos_token_id", 1, &c->bos))
		bad = "bos_token_id";
	else if (cfg_eos(root, c, eos_ids, n_eos))
		bad = "eos_token_id";
	if (bad) {
		cause_set(cause, "%s: missing or invalid \"%s\"", cpath, bad);
		rc = -EINVAL;
		goto out;
	}
	json_t *tw = json_object_get(root, "tie_word_embeddings");
	*tied = json_is_true(tw);
	c->rope_layout = KT_ROPE_HALF;
	const char *why = model_config_check(c);
	if (why) {
		cause_set(cause, "%s: %s", cpath, why);
		rc = -EINVAL;
		goto out;
	}
	rc = read_rope_scaling(m, json_object_get(root, "rope_scaling"), cpath, cause);
out:
	json_decref(root);
	free(cpath);
	return rc;
}

static int file_exists(const char *p)
{
	struct stat st;
	return stat(p, &st) == 0;
}

/* Shards named in model.safetensors.index.json, each once, in order. */
static int load_index(struct model *m, struct st_set *s, const char *dir,
		      const char *ipath, char **cause)
{
	json_error_t jerr;
	json_t *root = json_load_file(ipath, 0, &jerr);
	json_t *wm = root ? json_object_get(root, "weight_map") : NULL;
	if (!json_is_object(wm)) {
		cause_set(cause, "%s: %s", ipath, root ? "no weight_map object" : jerr.text);
		json_decref(root);
		return -EINVAL;
	}
	int rc = 0;
	const char *key;
	json_t *val;
	json_object_foreach(wm, key, val) {
		const char *f = json_string_value(val);
		if (!f || strchr(f, '/') || !strcmp(f, "..")) {
			cause_set(cause, "%s: bad shard name for %s", ipath, key);
			rc = -EINVAL;
			break;
		}
		char *fp = NULL;
		if (asprintf(&fp, "%s/%s", dir, f) < 0) {
			rc = -ENOMEM;
			break;
		}
		int seen = 0;
		for (int i = 0; i < s->n_files; i++)
			seen |= !strcmp(s->files[i], fp);
		if (!seen)
			rc = st_add_file(m, s, fp, cause);
		free(fp);
		if (rc)
			break;
	}
	json_decref(root);
	return rc;
}

static int load_hf(struct model *m, const char *path, const char *tokenizer, char **cause)
{
	struct stat st;
	int isdir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
	char *tmp = strdup(path);
	char *dir = tmp ? strdup(isdir ? path : dirname(tmp)) : NULL;
	free(tmp);
	if (!dir)
		return -ENOMEM;
	struct st_set s = { 0 };
	char *ipath = NULL, *wpath = NULL, *deftok = NULL;
	int tied = 0, rc, eos_ids[MAX_EOS], n_eos = 0;
	struct hf_text ht = { 0 };
	if ((rc = read_config(m, dir, &tied, eos_ids, &n_eos, cause)) ||
	    (rc = hf_text_read(dir, 1, &ht, cause)))
		goto out;
	if (ht.chat_template) {  /* the folder's text: tokenizer_config.json, chat_template.jinja */
		m->chat_template_text = ht.chat_template;
		m->chat_template = chat_classify_template(ht.chat_template, ht.chat_template_len);
		ht.chat_template = NULL;
	}
	/* the tokenizer: tokenizer.model, else tokenizer.json (Llama 3); if
	 * neither, the error names tokenizer.model */
	if (asprintf(&ipath, "%s/model.safetensors.index.json", dir) < 0 ||
	    asprintf(&wpath, "%s/model.safetensors", dir) < 0 ||
	    asprintf(&deftok, "%s/tokenizer.model", dir) < 0) {
		rc = -ENOMEM;
		goto out;
	}
	if (!file_exists(deftok)) {
		char *tj = NULL;
		if (asprintf(&tj, "%s/tokenizer.json", dir) < 0) {
			rc = -ENOMEM;
			goto out;
		}
		if (file_exists(tj)) {
			free(deftok);
			deftok = tj;
		} else {
			free(tj);
		}
	}
	size_t plen = strlen(path);
	if (!isdir && plen > 12 && !strcmp(path + plen - 12, ".safetensors"))
		rc = st_add_file(m, &s, path, cause);
	else if (file_exists(ipath))
		rc = load_index(m, &s, dir, ipath, cause);
	else if (file_exists(wpath))
		rc = st_add_file(m, &s, wpath, cause);
	else {
		cause_set(cause, "%s: no model.safetensors or model.safetensors.index.json", dir);
		rc = -ENOENT;
	}
	if (rc)
		goto out;

	struct model_config *c = &m->cfg;
	int qd = c->n_heads * c->head_dim, kv = model_kv_dim(c);
	m->layers = calloc((size_t)c->n_layers, sizeof(*m->layers));
	if (!m->layers) {
		rc = -ENOMEM;
		goto out;
	}
	if ((rc = get_matrix(m, &s, "model.embed_tokens.weight", c->vocab, c->dim, &m->embed, cause)))
		goto out;
	char name[128];
#define LAYER_MAT(field, suffix, r, cl)                                              \
	snprintf(name, sizeof(name), "model.layers.%d.%s.weight", l, suffix);        \
	if ((rc = get_matrix(m, &s, name, r, cl, &L->field, cause)))               \
		goto out;
	for (int l = 0; l < c->n_layers; l++) {
		struct model_layer *L = &m->layers[l];
		snprintf(name, sizeof(name), "model.layers.%d.input_layernorm.weight", l);
		if ((rc = get_vector(m, &s, name, c->dim, &L->att_norm, cause)))
			goto out;
		snprintf(name, sizeof(name), "model.layers.%d.post_attention_layernorm.weight", l);
		if ((rc = get_vector(m, &s, name, c->dim, &L->ffn_norm, cause)))
			goto out;
		LAYER_MAT(wq, "self_attn.q_proj", qd, c->dim);
		LAYER_MAT(wk, "self_attn.k_proj", kv, c->dim);
		LAYER_MAT(wv, "self_attn.v_proj", kv, c->dim);
		LAYER_MAT(wo, "self_attn.o_proj", c->dim, qd);
		LAYER_MAT(w1, "mlp.gate_proj", c->ffn_dim, c->dim);
		LAYER_MAT(w2, "mlp.down_proj", c->dim, c->ffn_dim);
		LAYER_MAT(w3, "mlp.up_proj", c->ffn_dim, c->dim);
	}
#undef LAYER_MAT
	if ((rc = get_vector(m, &s, "model.norm.weight", c->dim, &m->final_norm, cause)))
		goto out;
	if (!tied || st_find(&s, "lm_head.weight")) {
		if ((rc = get_matrix(m, &s, "lm_head.weight", c->vocab, c->dim, &m->cls, cause)))
			goto out;
	} else {
		m->cls = m->embed;
	}
	m->wtype = m->layers[0].wq.dtype;
	rc = model_finish(m, tokenizer, deftok, &ht, cause);
	/* a list of eos_token_id: each one that is a control token of the
	 * tokenizer ends a turn (others are not ends a template could emit) */
	for (int i = 0; !rc && i < n_eos; i++)
		tok_add_end(m->tok, eos_ids[i]);
out:
	hf_text_done(&ht);
	st_set_done(&s);
	free(ipath);
	free(wpath);
	free(deftok);
	free(dir);
	return rc;
}

static int is_dir(const char *p)
{
	struct stat st;
	return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* A folder, a .safetensors file in one, its index or its config.json. */
static int probe_hf(const char *path)
{
	return is_dir(path) || model_has_suffix(path, ".safetensors") ||
	       model_has_suffix(path, ".safetensors.index.json") ||
	       model_has_suffix(path, "config.json");
}

const struct model_loader model_loader_hf = { "safetensors", probe_hf, load_hf };

/*
 * text/vocab_hf.c — the text side of a Hugging Face folder: tokenizer.json
 * (a byte-level BPE vocabulary, Llama 3's), and what tokenizer_config.json,
 * generation_config.json and chat_template.jinja say besides it (BOS and EOS
 * by name, the end-of-turn ids, the chat template), each file read once.
 *
 * tokenizer.json is turned into a struct tok_bpe_spec, as a GGUF "gpt2"
 * vocabulary is (text/vocab_gguf.c), and built by the BPE kind. Its
 * vocabulary is model.vocab plus added_tokens (special ones are control
 * tokens, the others user-defined); its merges are strings "left right" or
 * pairs [left, right]; its pre-tokenizer must be one llamad knows: the
 * ByteLevel regex (GPT-2) or Llama 3's Split + ByteLevel.
 */
#include <errno.h>
#include <jansson.h>
#include <libgen.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "text/tok_int.h"
#include "text/tokenizer.h"
#include "text/vocab.h"
#include "util/cause.h"
#include "util/file.h"

#define HF_MAX_VOCAB (1 << 22)

static const char *json_type_name(const json_t *v)
{
	switch (json_typeof(v)) {
	case JSON_OBJECT: return "an object";
	case JSON_ARRAY: return "an array";
	case JSON_STRING: return "a string";
	case JSON_INTEGER: return "an integer";
	case JSON_REAL: return "a number";
	case JSON_TRUE:
	case JSON_FALSE: return "a boolean";
	default: return "null";
	}
}

/* ---- the side files ------------------------------------------------------------ */

/* A special-token setting of tokenizer_config.json: "<|x|>" or {content}. */
static const char *config_token(json_t *cfg, const char *key)
{
	json_t *v = json_object_get(cfg, key);
	if (json_is_object(v))
		v = json_object_get(v, "content");
	return json_string_value(v);
}

/* s (n bytes) as ht's chat template. 0 or -ENOMEM. */
static int keep_template(struct hf_text *ht, const char *s, size_t n)
{
	if (!(ht->chat_template = malloc(n + 1)))
		return -ENOMEM;
	memcpy(ht->chat_template, s, n);
	ht->chat_template[n] = 0;
	ht->chat_template_len = n;
	return 0;
}

/*
 * tokenizer_config.json's chat_template, as transformers finds it: a
 * string, or a list of {name, template} of which the one named "default"
 * is taken, else the first. 0 (none is fine), or -EINVAL for another
 * shape, -ENOMEM.
 */
static int config_template(struct hf_text *ht, json_t *root, const char *path, char **cause)
{
	json_t *ct = json_object_get(root, "chat_template");
	if (ct && json_is_array(ct)) {
		json_t *pick = NULL, *e;
		size_t i;
		json_array_foreach(ct, i, e) {
			json_t *nm = json_object_get(e, "name");
			if (!pick || (json_is_string(nm) && !strcmp(json_string_value(nm), "default")))
				pick = e;
		}
		ct = pick ? json_object_get(pick, "template") : NULL;
		if (pick && !json_is_string(ct)) {
			cause_set(cause, "%s: chat_template: an entry without a template string", path);
			return -EINVAL;
		}
	} else if (ct && !json_is_string(ct) && !json_is_null(ct)) {
		cause_set(cause, "%s: chat_template is neither a string nor a list of {name, "
			  "template}", path);
		return -EINVAL;
	}
	return json_is_string(ct) ? keep_template(ht, json_string_value(ct), json_string_length(ct))
				  : 0;
}

/* chat_template.jinja, when tokenizer_config.json had no template. */
static int jinja_template(struct hf_text *ht, const char *dir, char **cause)
{
	char *path = NULL, *text = NULL;
	size_t n = 0;
	if (asprintf(&path, "%s/chat_template.jinja", dir) < 0)
		return -ENOMEM;
	int rc = file_read(path, (size_t)1 << 30, &text, &n);
	if (rc == 0)
		rc = keep_template(ht, text, n);
	else if (rc == -ENOENT)
		rc = 0;
	else
		cause_set(cause, "%s: %s", path, strerror(-rc));
	free(text);
	free(path);
	return rc;
}

/* tokenizer_config.json: BOS and EOS by name, and (for_model) the chat
 * template. */
static int read_config(struct hf_text *ht, const char *dir, int for_model, char **cause)
{
	char *path = NULL;
	if (asprintf(&path, "%s/tokenizer_config.json", dir) < 0)
		return -ENOMEM;
	json_error_t jerr;
	/* Llama 3's model_max_length (1e30) is no integer jansson holds */
	struct stat st;
	json_t *root = NULL;
	int rc = 0;
	if (stat(path, &st) != 0) {
		/* none: nothing said */
	} else if (!(root = json_load_file(path, JSON_DECODE_INT_AS_REAL, &jerr)) && !for_model) {
		/* beside a tokenizer.json named alone, an unreadable one is ignored */
	} else if (for_model && (!root || !json_is_object(root))) {
		cause_set(cause, "%s: %s", path, root ? "not a JSON object" : jerr.text);
		rc = -EINVAL;
	} else if (root) {
		const char *bos = config_token(root, "bos_token"), *eos = config_token(root, "eos_token");
		if ((bos && !(ht->bos_token = strdup(bos))) || (eos && !(ht->eos_token = strdup(eos))))
			rc = -ENOMEM;
		if (!rc && for_model)
			rc = config_template(ht, root, path, cause);
	}
	json_decref(root);
	free(path);
	return rc;
}

/* generation_config.json's eos_token_id: an id or a list of them. */
static int read_generation(struct hf_text *ht, const char *dir)
{
	char *path = NULL;
	if (asprintf(&path, "%s/generation_config.json", dir) < 0)
		return -ENOMEM;
	json_t *gc = json_load_file(path, 0, NULL);
	json_t *e = json_object_get(gc, "eos_token_id");
	size_t n = json_is_array(e) ? json_array_size(e) : 1;
	int rc = 0;
	if (n && !(ht->gen_eos = malloc(n * sizeof(*ht->gen_eos))))
		rc = -ENOMEM;
	for (size_t i = 0; !rc && i < n; i++) {
		json_t *v = json_is_array(e) ? json_array_get(e, i) : e;
		if (json_is_integer(v))
			ht->gen_eos[ht->n_gen_eos++] = (int)json_integer_value(v);
	}
	json_decref(gc);
	free(path);
	return rc;
}

int hf_text_read(const char *dir, int for_model, struct hf_text *ht, char **cause)
{
	memset(ht, 0, sizeof(*ht));
	int rc = read_config(ht, dir, for_model, cause);
	if (!rc)
		rc = read_generation(ht, dir);
	if (!rc && for_model && !ht->chat_template)
		rc = jinja_template(ht, dir, cause);
	if (rc == -ENOMEM)
		cause_set(cause, "%s: out of memory", dir);
	if (rc)
		hf_text_done(ht);
	return rc;
}

void hf_text_done(struct hf_text *ht)
{
	free(ht->bos_token);
	free(ht->eos_token);
	free(ht->chat_template);
	free(ht->gen_eos);
	memset(ht, 0, sizeof(*ht));
}

/* ---- tokenizer.json ------------------------------------------------------------- */

/* What tokenizer.json becomes: the spec and the storage it points into
 * (strings stay in the parsed JSON, which lives as long). */
struct hf_vocab {
	const char *path;
	char **cause;
	struct tok_bpe_spec sp;
	const char **tokens;
	size_t *token_len;
	int32_t *types;
	const char **merges;
	size_t *merge_len, *merge_left;
	char **owned;            /* "left right" made from [left, right] pairs */
	size_t n_owned;
	int32_t *eot;
};

static void hv_done(struct hf_vocab *v)
{
	free(v->tokens);
	free(v->token_len);
	free(v->types);
	for (size_t i = 0; i < v->n_owned; i++)
		free(v->owned[i]);
	free(v->owned);
	free(v->merges);
	free(v->merge_len);
	free(v->merge_left);
	free(v->eot);
}

/* The pre-tokenizer of tokenizer.json, matched against the known ones: its
 * GGUF name, or NULL (cause set). */
static const char *json_pre(struct hf_vocab *v, json_t *root)
{
	json_t *pt = json_object_get(root, "pre_tokenizer");
	const char *ty = json_string_value(json_object_get(pt, "type"));
	json_t *norm = json_object_get(root, "normalizer");
	if (norm && !json_is_null(norm)) {
		tok_fail(v->cause, v->path, "normalizer \"%s\" is not supported (byte-level BPE has none)",
			json_string_value(json_object_get(norm, "type")) ?: "?");
		return NULL;
	}
	if (ty && !strcmp(ty, "ByteLevel") && json_is_true(json_object_get(pt, "use_regex")))
		return "gpt2";
	if (ty && !strcmp(ty, "Sequence")) {
		json_t *seq = json_object_get(pt, "pretokenizers");
		json_t *sp = json_array_get(seq, 0), *bl = json_array_get(seq, 1);
		const char *re = json_string_value(json_object_get(json_object_get(sp, "pattern"),
								   "Regex"));
		const char *beh = json_string_value(json_object_get(sp, "behavior"));
		if (json_array_size(seq) == 2 && re && beh && !strcmp(beh, "Isolated") &&
		    !json_is_true(json_object_get(sp, "invert")) &&
		    !strcmp(json_string_value(json_object_get(bl, "type")) ?: "", "ByteLevel") &&
		    !json_is_true(json_object_get(bl, "use_regex")) &&
		    !json_is_true(json_object_get(bl, "add_prefix_space"))) {
			const char *name = bpe_pre_of_regex(re);
			if (!name)
				tok_fail(v->cause, v->path, "pre-tokenizer split regex is not one llamad knows (Llama 3's)");
			return name;
		}
	}
	tok_fail(v->cause, v->path, "pre-tokenizer %s is not supported (ByteLevel, or Llama 3's Split + ByteLevel)",
		ty ? ty : "(none)");
	return NULL;
}

/* model.vocab and added_tokens into the spec's tokens, lengths and types. */
static int json_vocab(struct hf_vocab *v, json_t *model, json_t *added)
{
	json_t *vocab = json_object_get(model, "vocab");
	if (!json_is_object(vocab)) {
		tok_fail(v->cause, v->path, "model.vocab is %s, not an object",
			vocab ? json_type_name(vocab) : "missing");
		return -EINVAL;
	}
	/* ids: the vocabulary's, then the added tokens' */
	json_int_t max = -1;
	const char *key;
	json_t *e;
	json_object_foreach(vocab, key, e) {
		if (!json_is_integer(e) || json_integer_value(e) < 0 ||
		    json_integer_value(e) >= HF_MAX_VOCAB) {
			char sb[200];
			tok_fail(v->cause, v->path, "model.vocab token \"%s\" has id %s", tok_shown(key, strlen(key), sb),
				json_is_integer(e) ? "out of range" : json_type_name(e));
			return -EINVAL;
		}
		if (json_integer_value(e) > max)
			max = json_integer_value(e);
	}
	size_t i;
	json_array_foreach(added, i, e) {
		json_t *id = json_object_get(e, "id");
		if (!json_is_integer(id) || json_integer_value(id) < 0 ||
		    json_integer_value(id) >= HF_MAX_VOCAB ||
		    !json_is_string(json_object_get(e, "content"))) {
			tok_fail(v->cause, v->path, "added_tokens[%zu] has no valid id and content", i);
			return -EINVAL;
		}
		if (json_integer_value(id) > max)
			max = json_integer_value(id);
	}
	int n = (int)max + 1;
	if (n < 256) {
		tok_fail(v->cause, v->path, "vocabulary of %d tokens is too small for byte-level BPE", n);
		return -EINVAL;
	}
	v->tokens = calloc((size_t)n, sizeof(*v->tokens));
	v->token_len = calloc((size_t)n, sizeof(*v->token_len));
	v->types = calloc((size_t)n, sizeof(*v->types));
	if (!v->tokens || !v->token_len || !v->types)
		return -ENOMEM;
	json_object_foreach(vocab, key, e) {
		int id = (int)json_integer_value(e);
		if (v->tokens[id]) {
			char s1[200], s2[200];
			tok_fail(v->cause, v->path, "id %d is used twice (\"%s\" and \"%s\")", id,
				tok_shown(v->tokens[id], v->token_len[id], s1),
				tok_shown(key, strlen(key), s2));
			return -EINVAL;
		}
		v->tokens[id] = key;
		v->token_len[id] = strlen(key);
		v->types[id] = TOK_TYPE_NORMAL;
	}
	json_array_foreach(added, i, e) {
		int id = (int)json_integer_value(json_object_get(e, "id"));
		json_t *c = json_object_get(e, "content");
		const char *s = json_string_value(c);
		size_t sl = json_string_length(c);
		if (v->tokens[id] && (v->token_len[id] != sl || memcmp(v->tokens[id], s, sl))) {
			char s1[200], s2[200];
			tok_fail(v->cause, v->path, "id %d is used twice (\"%s\" and added token \"%s\")", id,
				tok_shown(v->tokens[id], v->token_len[id], s1), tok_shown(s, sl, s2));
			return -EINVAL;
		}
		v->tokens[id] = s;
		v->token_len[id] = sl;
		v->types[id] = json_is_true(json_object_get(e, "special")) ? TOK_TYPE_CONTROL
									   : TOK_TYPE_USER_DEFINED;
	}
	v->sp.n_vocab = n;
	v->sp.tokens = v->tokens;
	v->sp.token_len = v->token_len;
	v->sp.types = v->types;
	return 0;
}

/* model.merges into the spec: strings as they are, pairs as "left right"
 * with the left's length (a token may hold a space). */
static int json_merges(struct hf_vocab *v, json_t *model)
{
	json_t *merges = json_object_get(model, "merges");
	if (!json_is_array(merges)) {
		tok_fail(v->cause, v->path, "model.merges is %s, not an array",
			merges ? json_type_name(merges) : "missing");
		return -EINVAL;
	}
	size_t n = json_array_size(merges);
	if (n > INT32_MAX) {
		tok_fail(v->cause, v->path, "%zu merges is too many", n);
		return -EINVAL;
	}
	v->merges = calloc(n ? n : 1, sizeof(*v->merges));
	v->merge_len = calloc(n ? n : 1, sizeof(*v->merge_len));
	v->merge_left = calloc(n ? n : 1, sizeof(*v->merge_left));
	v->owned = calloc(n ? n : 1, sizeof(*v->owned));
	if (!v->merges || !v->merge_len || !v->merge_left || !v->owned)
		return -ENOMEM;
	size_t i;
	json_t *m;
	json_array_foreach(merges, i, m) {
		if (json_is_string(m)) {
			v->merges[i] = json_string_value(m);
			v->merge_len[i] = json_string_length(m);
			v->merge_left[i] = TOK_MERGE_SPLIT;
		} else if (json_is_array(m) && json_array_size(m) == 2 &&
			   json_is_string(json_array_get(m, 0)) &&
			   json_is_string(json_array_get(m, 1))) {
			json_t *l = json_array_get(m, 0), *r = json_array_get(m, 1);
			size_t ln = json_string_length(l), rn = json_string_length(r);
			char *s = malloc(ln + rn + 2);
			if (!s)
				return -ENOMEM;
			v->owned[v->n_owned++] = s;
			memcpy(s, json_string_value(l), ln);
			s[ln] = ' ';
			memcpy(s + ln + 1, json_string_value(r), rn);
			s[ln + rn + 1] = 0;
			v->merges[i] = s;
			v->merge_len[i] = ln + rn + 1;
			v->merge_left[i] = ln;
		} else {
			tok_fail(v->cause, v->path, "model.merges[%zu] is %s, not a merge", i, json_type_name(m));
			return -EINVAL;
		}
	}
	v->sp.n_merges = (int)n;
	v->sp.merges = v->merges;
	v->sp.merge_len = v->merge_len;
	v->sp.merge_left = v->merge_left;
	return 0;
}

/* The id of the token spelt name (tokenizer_config.json names BOS and EOS
 * so), or -1. */
static int token_named(const struct hf_vocab *v, const char *name)
{
	size_t n = strlen(name);
	for (int id = 0; id < v->sp.n_vocab; id++)
		if (v->tokens[id] && v->token_len[id] == n && !memcmp(v->tokens[id], name, n))
			return id;
	return -1;
}

/* The side files' word on BOS, EOS and the end-of-turn ids. */
static int side_specials(struct hf_vocab *v, const struct hf_text *ht)
{
	v->sp.bos = ht && ht->bos_token ? token_named(v, ht->bos_token) : -1;
	v->sp.eos = ht && ht->eos_token ? token_named(v, ht->eos_token) : -1;
	if (ht && ht->n_gen_eos) {
		if (!(v->eot = malloc((size_t)ht->n_gen_eos * sizeof(*v->eot))))
			return -ENOMEM;
		memcpy(v->eot, ht->gen_eos, (size_t)ht->n_gen_eos * sizeof(*v->eot));
		v->sp.eot = v->eot;
		v->sp.n_eot = ht->n_gen_eos;
	}
	return 0;
}

struct tok *tok_load_hf_json(const char *path, const char *text, size_t len,
			     const struct hf_text *ht, char **cause)
{
	if (cause)
		*cause = NULL;
	struct hf_vocab v = { .path = path, .cause = cause };
	json_error_t err;
	json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
	struct tok *t = NULL;
	int rc = -EINVAL;
	if (!root) {
		tok_fail(cause, path, "not valid JSON (line %d: %s)", err.line, err.text);
		goto out;
	}
	json_t *model = json_object_get(root, "model");
	const char *mt = json_string_value(json_object_get(model, "type"));
	if (!json_is_object(model) || !mt || strcmp(mt, "BPE")) {
		tok_fail(cause, path, "model type %s is not supported (BPE is)", mt ? mt : "(missing)");
		goto out;
	}
	if (json_is_true(json_object_get(model, "byte_fallback"))) {
		tok_fail(cause, path, "BPE with byte_fallback is not byte-level BPE (not supported)");
		goto out;
	}
	if (!(v.sp.pre = json_pre(&v, root)))
		goto out;
	json_t *added = json_object_get(root, "added_tokens");
	if (added && !json_is_array(added)) {
		tok_fail(cause, path, "added_tokens is %s, not an array", json_type_name(added));
		goto out;
	}
	json_t *im = json_object_get(model, "ignore_merges");
	if (im)
		v.sp.ignore_merges = json_is_true(im) ? 1 : -1;
	if ((rc = json_vocab(&v, model, added)) || (rc = json_merges(&v, model)) ||
	    (rc = side_specials(&v, ht)))
		goto out;
	t = tok_load_bpe(&v.sp, path, cause);
out:
	if (rc == -ENOMEM)
		tok_fail(cause, path, "out of memory");
	if (!t && cause && !*cause)
		tok_fail(cause, path, "cannot load (error %d)", rc);
	hv_done(&v);
	json_decref(root);
	return t;
}

struct tok *tok_load_json(const char *path, const char *text, size_t len, char **cause)
{
	char *dup = strdup(path);
	struct hf_text ht;
	int have = dup && hf_text_read(dirname(dup), 0, &ht, NULL) == 0;
	free(dup);
	struct tok *t = tok_load_hf_json(path, text, len, have ? &ht : NULL, cause);
	if (have)
		hf_text_done(&ht);
	return t;
}

/*
 * text/vocab_gguf.c — a tokenizer from a GGUF file's metadata
 * (tokenizer.ggml.*), and the file's chat template text.
 *
 * tokenizer.ggml.model "llama" is turned back into a SentencePiece
 * ModelProto (proto/sentencepiece_model.proto, through tok_load_spm) and
 * handed to the tokenizer shim, so encoding is libsentencepiece's own;
 * "gpt2" (Llama 3's byte-level BPE: tokens, token_type, merges, pre, the
 * special ids) goes to tok_load_bpe. The container is read by
 * format/gguf.c.
 */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "text/tokenizer.h"
#include "text/vocab.h"
#include "util/cause.h"
#include "util/file.h"

/* A special token id key: the id if present and in [0, n), else -1. */
static int special_id(const struct gguf *g, const char *key, int n, int *out)
{
	int64_t v;
	int r = gguf_kv_int(g, key, &v);
	if (r < 0)
		return r;
	*out = r == 1 && v >= 0 && v < n ? (int)v : -1;
	return 0;
}

/*
 * A "gpt2" vocabulary (byte-level BPE, Llama 3): tokens (checked by the
 * caller), token_type (optional; one per token), merges (required, strings
 * "left right" in rank order), pre (optional; tok_load_bpe refuses one it
 * does not know), bos/eos and the eot/eom ids, to tok_load_bpe. Scores, if
 * any, are not used. 0 with *out set, or a negative errno with the cause.
 */
static int build_tok_bpe(struct gguf *g, const struct gguf_kv *tk, struct tok **out)
{
	int n = (int)tk->arr_n, r;
	const uint8_t *types = NULL;
	uint32_t ty_type = 0;
	if ((r = gguf_kv_array(g, "tokenizer.ggml.token_type", GV_I32, GV_U32, tk->arr_n, &types,
			       &ty_type)) < 0)
		return r;
	const struct gguf_kv *mk = gguf_find_kv(g, "tokenizer.ggml.merges");
	if (!mk || mk->type != GV_ARRAY || mk->arr_type != GV_STRING) {
		cause_set(g->cause, "%s: GGUF key tokenizer.ggml.merges is %s (a \"gpt2\" "
			  "vocabulary needs its merges as an array of strings)", g->path,
			  mk ? "not an array of strings" : "missing");
		return -EINVAL;
	}
	if (mk->arr_n > INT_MAX) {
		cause_set(g->cause, "%s: GGUF key tokenizer.ggml.merges has %llu entries, "
			  "too many", g->path, (unsigned long long)mk->arr_n);
		return -EINVAL;
	}
	const uint8_t *ps = NULL;
	size_t pn = 0;
	if ((r = gguf_kv_str(g, "tokenizer.ggml.pre", &ps, &pn)) < 0)
		return r;
	struct tok_bpe_spec sp = { .n_vocab = n, .n_merges = (int)mk->arr_n };
	int eot = -1, eom = -1;
	if ((r = special_id(g, "tokenizer.ggml.bos_token_id", n, &sp.bos)) ||
	    (r = special_id(g, "tokenizer.ggml.eos_token_id", n, &sp.eos)) ||
	    (r = special_id(g, "tokenizer.ggml.eot_token_id", n, &eot)) ||
	    (r = special_id(g, "tokenizer.ggml.eom_token_id", n, &eom)))
		return r;
	int32_t ends[2];
	if (eot >= 0)
		ends[sp.n_eot++] = eot;
	if (eom >= 0)
		ends[sp.n_eot++] = eom;
	sp.eot = ends;
	const char **toks = NULL, **merges = NULL;
	size_t *tok_len = NULL, *merge_len = NULL;
	int32_t *ty = NULL;
	char *pre = NULL;
	r = -ENOMEM;
	if (gguf_str_array(tk, &toks, &tok_len) || gguf_str_array(mk, &merges, &merge_len))
		goto out;
	if (types) {
		if (!(ty = malloc((size_t)n * sizeof(*ty))))
			goto out;
		for (int i = 0; i < n; i++)
			ty[i] = (int32_t)gguf_le32(types + 4 * (size_t)i);
	}
	if (ps) {
		if (memchr(ps, 0, pn)) {
			cause_set(g->cause, "%s: GGUF key tokenizer.ggml.pre contains a NUL "
				  "byte", g->path);
			r = -EINVAL;
			goto out;
		}
		if (!(pre = strndup((const char *)ps, pn)))
			goto out;
	}
	sp.tokens = toks;
	sp.token_len = tok_len;
	sp.types = ty;
	sp.merges = merges;
	sp.merge_len = merge_len;
	sp.pre = pre;
	*out = tok_load_bpe(&sp, g->path, g->cause);
	r = *out ? 0 : -EINVAL;
out:
	if (r == -ENOMEM)
		cause_set(g->cause, "%s: out of memory", g->path);
	free(toks);
	free(tok_len);
	free(merges);
	free(merge_len);
	free(ty);
	free(pre);
	return r;
}

int vocab_gguf(struct gguf *g, struct tok **out)
{
	*out = NULL;
	const uint8_t *ms = NULL;
	size_t mn = 0;
	int r = gguf_kv_str(g, "tokenizer.ggml.model", &ms, &mn);
	if (r < 0)
		return r;
	const struct gguf_kv *tk = gguf_find_kv(g, "tokenizer.ggml.tokens");
	if (r == 0 && !tk)
		return 0;
	if (r == 0) {
		cause_set(g->cause, "%s: GGUF has tokenizer.ggml.tokens but no "
			  "tokenizer.ggml.model", g->path);
		return -EINVAL;
	}
	int gpt2 = gguf_str_is(ms, mn, "gpt2");
	if (!gpt2 && !gguf_str_is(ms, mn, "llama")) {
		char b[96];
		cause_set(g->cause, "%s: tokenizer model \"%s\" is not supported "
			  "(\"llama\", SentencePiece BPE, and \"gpt2\", byte-level BPE, "
			  "are); pass --tokenizer PATH", g->path, gguf_shown(ms, mn, b));
		return -ENOTSUP;
	}
	if (!tk || tk->type != GV_ARRAY || tk->arr_type != GV_STRING) {
		cause_set(g->cause, "%s: GGUF key tokenizer.ggml.tokens is %s", g->path,
			  tk ? "not an array of strings" : "missing");
		return -EINVAL;
	}
	if (tk->arr_n < 1 || tk->arr_n > (1 << 22)) {
		cause_set(g->cause, "%s: GGUF vocabulary of %llu tokens is out of range",
			  g->path, (unsigned long long)tk->arr_n);
		return -EINVAL;
	}
	if (gpt2)
		return build_tok_bpe(g, tk, out);
	int n = (int)tk->arr_n;
	const uint8_t *scores = NULL, *types = NULL;
	uint32_t st_type = 0, ty_type = 0;
	if ((r = gguf_kv_array(g, "tokenizer.ggml.scores", GV_F32, GV_F32, tk->arr_n, &scores,
			       &st_type)) < 0 ||
	    (r = gguf_kv_array(g, "tokenizer.ggml.token_type", GV_I32, GV_U32, tk->arr_n, &types,
			       &ty_type)) < 0)
		return r;
	int unk, bos, eos, pad, dummy = 1, rmws = 0;
	if ((r = special_id(g, "tokenizer.ggml.unknown_token_id", n, &unk)) ||
	    (r = special_id(g, "tokenizer.ggml.bos_token_id", n, &bos)) ||
	    (r = special_id(g, "tokenizer.ggml.eos_token_id", n, &eos)) ||
	    (r = special_id(g, "tokenizer.ggml.padding_token_id", n, &pad)) ||
	    (r = gguf_kv_bool(g, "tokenizer.ggml.add_space_prefix", 1, &dummy)) ||
	    (r = gguf_kv_bool(g, "tokenizer.ggml.remove_extra_whitespaces", 0, &rmws)))
		return r;

	/* piece strings, NUL-terminated copies (the strings were bounds-checked
	 * when the metadata was parsed) */
	char **str = calloc((size_t)n, sizeof(*str));
	float *sc = calloc((size_t)n, sizeof(*sc));
	int32_t *ty = calloc((size_t)n, sizeof(*ty));
	r = -ENOMEM;
	if (!str || !sc || !ty)
		goto out;
	const uint8_t *p = tk->val;
	for (int i = 0; i < n; i++) {
		size_t len = (size_t)gguf_le64(p);
		const uint8_t *s = p + 8;
		p = s + len;
		if (memchr(s, 0, len)) {
			cause_set(g->cause, "%s: GGUF token %d contains a NUL byte", g->path, i);
			r = -EINVAL;
			goto out;
		}
		if (!(str[i] = strndup((const char *)s, len)))
			goto out;
		if (scores) {
			uint32_t u = gguf_le32(scores + 4 * (size_t)i);
			memcpy(&sc[i], &u, 4);
		}
		ty[i] = types ? (int32_t)gguf_le32(types + 4 * (size_t)i) : TOK_TYPE_NORMAL;
	}
	struct tok_spm_spec spec = {
		.n_vocab = n, .pieces = (const char *const *)str, .scores = sc, .types = ty,
		.unk = unk, .bos = bos, .eos = eos, .pad = pad,
		.add_dummy_prefix = dummy, .remove_extra_whitespaces = rmws,
	};
	*out = tok_load_spm(&spec, g->path, g->cause);
	r = *out ? 0 : -EINVAL;
out:
	if (r == -ENOMEM)
		cause_set(g->cause, "%s: out of memory", g->path);
	if (str)
		for (int i = 0; i < n; i++)
			free(str[i]);
	free(str);
	free(sc);
	free(ty);
	return r;
}

int vocab_gguf_template(const struct gguf *g, char **text, size_t *len)
{
	const uint8_t *s;
	size_t n;
	*text = NULL;
	*len = 0;
	if (gguf_kv_str(g, "tokenizer.chat_template", &s, &n) != 1)
		return 0;
	if (!(*text = malloc(n + 1)))
		return -ENOMEM;
	memcpy(*text, s, n);
	(*text)[n] = 0;
	*len = n;
	return 0;
}

struct tok *tok_load_gguf(const char *path, char **cause)
{
	const uint8_t *data;
	size_t len;
	struct tok *t = NULL;
	if (file_map(path, &data, &len, cause) == 0) {
		struct gguf g = { .path = path, .base = data, .len = len, .cause = cause };
		if (gguf_parse_kv(&g) == 0 && vocab_gguf(&g, &t) == 0 && !t)
			cause_set(cause, "%s: GGUF file has no tokenizer", path);
		gguf_done(&g);
		file_unmap(data, len);
	}
	return t;
}

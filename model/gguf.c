/*
 * model/gguf.c — GGUF files (versions 2 and 3, little-endian), the format of
 * llama.cpp: hyper-parameters and the tokenizer as typed key/value metadata,
 * then tensor descriptors, then the aligned tensor data.
 *
 *   header   "GGUF", u32 version, u64 n_tensors, u64 n_kv
 *   n_kv     key (u64 length + bytes), u32 value type, value
 *   tensors  name (string), u32 n_dims, u64 ne[n_dims] (ne[0] is the row
 *            length), u32 ggml type, u64 offset into the data section
 *   data     from the first multiple of general.alignment (default 32)
 *            after the descriptors
 *
 * The file is mmapped read-only and every length, count and offset is
 * checked against its size before it is used: a truncated or corrupt file
 * gives an error naming the file and what is wrong. Matrices are used in
 * place from the map (copied only if misaligned); norm vectors become fp32.
 *
 * GGUF Llama files store wq/wk rows in Meta's interleaved RoPE pair order
 * (llama.cpp's converter undoes Hugging Face's permutation), so the model is
 * KT_ROPE_INTERLEAVED, like a llama2.c checkpoint.
 *
 * RoPE scaling: llama.rope.scaling.type must be absent or "none"; Llama
 * 3.1/3.2 files carry their scaling as the tensor rope_freqs.weight (F32,
 * head_dim/2 divisors of the inverse frequencies, as llama.cpp writes it),
 * which becomes m->rope_freqs.
 *
 * The vocabulary (tokenizer.ggml.*): tokenizer.ggml.model "llama" is turned
 * back into a SentencePiece ModelProto (proto/sentencepiece_model.proto) and
 * handed to the tokenizer shim, so encoding is libsentencepiece's own;
 * "gpt2" (Llama 3's byte-level BPE: tokens, token_type, merges, pre, the
 * special ids) goes to tok_load_bpe.
 */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "text/chat.h"

/* GGUF metadata value types */
enum {
	GV_U8 = 0, GV_I8 = 1, GV_U16 = 2, GV_I16 = 3, GV_U32 = 4, GV_I32 = 5,
	GV_F32 = 6, GV_BOOL = 7, GV_STRING = 8, GV_ARRAY = 9, GV_U64 = 10,
	GV_I64 = 11, GV_F64 = 12, GV_N
};

static const char *const gv_names[GV_N] = {
	"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string",
	"array", "u64", "i64", "f64",
};

/* bytes of a fixed-size value type; 0 for string and array */
static const uint8_t gv_size[GV_N] = { 1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8 };

#define GGUF_MAX_DIMS 4
#define GGUF_MAX_NAME 1024      /* tensor names are at most 64 bytes in practice */
#define GGUF_MAX_DEPTH 3        /* arrays of arrays nest at most this deep */

/* ggml tensor types: those llamad reads, and the names of the rest for
 * error messages. */
struct ggml_type {
	const char *name;
	int kt;          /* enum kt_dtype, or -1 if not supported */
	int block;       /* elements per block */
	int bytes;       /* bytes per block */
};

static const struct ggml_type ggml_types[] = {
	[0] = { "F32", KT_F32, 1, 4 },
	[1] = { "F16", KT_F16, 1, 2 },
	[2] = { "Q4_0", KT_Q4_0, KT_QBLOCK, 18 },
	[3] = { "Q4_1", -1, 0, 0 },
	[6] = { "Q5_0", -1, 0, 0 },
	[7] = { "Q5_1", -1, 0, 0 },
	[8] = { "Q8_0", KT_Q8_0, KT_QBLOCK, 34 },
	[9] = { "Q8_1", -1, 0, 0 },
	[10] = { "Q2_K", -1, 0, 0 },
	[11] = { "Q3_K", -1, 0, 0 },
	[12] = { "Q4_K", KT_Q4_K, KT_QK_K, 144 },
	[13] = { "Q5_K", KT_Q5_K, KT_QK_K, 176 },
	[14] = { "Q6_K", KT_Q6_K, KT_QK_K, 210 },
	[15] = { "Q8_K", -1, 0, 0 },
	[16] = { "IQ2_XXS", -1, 0, 0 },
	[17] = { "IQ2_XS", -1, 0, 0 },
	[18] = { "IQ3_XXS", -1, 0, 0 },
	[19] = { "IQ1_S", -1, 0, 0 },
	[20] = { "IQ4_NL", -1, 0, 0 },
	[21] = { "IQ3_S", -1, 0, 0 },
	[22] = { "IQ2_S", -1, 0, 0 },
	[23] = { "IQ4_XS", -1, 0, 0 },
	[24] = { "I8", -1, 0, 0 },
	[25] = { "I16", -1, 0, 0 },
	[26] = { "I32", -1, 0, 0 },
	[27] = { "I64", -1, 0, 0 },
	[28] = { "F64", -1, 0, 0 },
	[29] = { "IQ1_M", -1, 0, 0 },
	[30] = { "BF16", KT_BF16, 1, 2 },
	[34] = { "TQ1_0", -1, 0, 0 },
	[35] = { "TQ2_0", -1, 0, 0 },
	[39] = { "MXFP4", -1, 0, 0 },
};
#define N_GGML_TYPES (sizeof ggml_types / sizeof ggml_types[0])

struct gguf_kv {
	const uint8_t *key;
	size_t key_len;
	uint32_t type;
	const uint8_t *val;      /* the value; for arrays, the first element */
	uint32_t arr_type;       /* arrays only */
	uint64_t arr_n;
};

struct gguf_tensor {
	const uint8_t *name;
	size_t name_len;
	uint32_t n_dims;
	uint64_t ne[GGUF_MAX_DIMS];
	uint32_t type;
	uint64_t offset;         /* into the data section */
	const uint8_t *data;
	size_t bytes;
	int used;
};

struct gguf {
	const char *path;
	const uint8_t *base;
	size_t len;
	size_t pos;              /* parse cursor, <= len */
	uint32_t version;
	uint64_t n_kv_hdr, n_tensors_hdr;
	struct gguf_kv *kv;
	size_t n_kv, cap_kv;
	struct gguf_tensor *t;
	size_t n_t, cap_t;
	uint64_t alignment;
	char **cause;
};

static void gguf_done(struct gguf *g)
{
	free(g->kv);
	free(g->t);
}

/* ---- reading -------------------------------------------------------------- */

/* Copy a byte string from the file into out (NUL-terminated, at most 80
 * bytes shown), replacing anything but printable ASCII: for messages. */
static const char *shown(const uint8_t *s, size_t n, char out[96])
{
	size_t k = 0;
	for (size_t i = 0; i < n && k < 80; i++)
		out[k++] = s[i] >= 0x20 && s[i] < 0x7f && s[i] != '"' ? (char)s[i] : '?';
	if (n > 80) {
		memcpy(out + k, "...", 3);
		k += 3;
	}
	out[k] = '\0';
	return out;
}

static uint64_t le64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

/* Make sure n more bytes exist at the cursor; else a "truncated" error
 * naming `what`. */
static int need(struct gguf *g, uint64_t n, const char *what)
{
	if (n <= g->len - g->pos)
		return 0;
	cause_set(g->cause, "%s: truncated or corrupt GGUF: %s at offset %zu needs "
			"%llu bytes, the file has %zu left", g->path, what, g->pos,
			(unsigned long long)n, g->len - g->pos);
	return -EINVAL;
}

static int rd_u32(struct gguf *g, uint32_t *v, const char *what)
{
	if (need(g, 4, what))
		return -EINVAL;
	*v = le32(g->base + g->pos);
	g->pos += 4;
	return 0;
}

static int rd_u64(struct gguf *g, uint64_t *v, const char *what)
{
	if (need(g, 8, what))
		return -EINVAL;
	*v = le64(g->base + g->pos);
	g->pos += 8;
	return 0;
}

/* A string: u64 length, then the bytes (not NUL-terminated). */
static int rd_str(struct gguf *g, const uint8_t **s, size_t *n, const char *what)
{
	uint64_t len;
	if (rd_u64(g, &len, what) || need(g, len, what))
		return -EINVAL;
	*s = g->base + g->pos;
	*n = (size_t)len;
	g->pos += (size_t)len;
	return 0;
}

/* Check and step over one value of `type` (recursing into arrays). `key`
 * names it in messages. */
static int skip_value(struct gguf *g, uint32_t type, int depth, const char *key)
{
	char what[160];
	if (type >= GV_N) {
		cause_set(g->cause, "%s: corrupt GGUF: key %s has unknown value type %u",
				g->path, key, type);
		return -EINVAL;
	}
	if (type == GV_STRING) {
		const uint8_t *s;
		size_t n;
		snprintf(what, sizeof what, "the string value of %s", key);
		return rd_str(g, &s, &n, what);
	}
	if (type != GV_ARRAY) {
		snprintf(what, sizeof what, "the value of %s", key);
		if (need(g, gv_size[type], what))
			return -EINVAL;
		g->pos += gv_size[type];
		return 0;
	}
	if (depth >= GGUF_MAX_DEPTH) {
		cause_set(g->cause, "%s: corrupt GGUF: key %s nests arrays more than %d deep",
				g->path, key, GGUF_MAX_DEPTH);
		return -EINVAL;
	}
	uint32_t et;
	uint64_t n;
	snprintf(what, sizeof what, "the array header of %s", key);
	if (rd_u32(g, &et, what) || rd_u64(g, &n, what))
		return -EINVAL;
	if (et >= GV_N) {
		cause_set(g->cause, "%s: corrupt GGUF: array %s has unknown element type %u",
				g->path, key, et);
		return -EINVAL;
	}
	/* every element takes at least one byte (a string or array, 8) */
	uint64_t min = gv_size[et] ? gv_size[et] : (et == GV_STRING ? 8 : 12);
	if (n > (g->len - g->pos) / min) {
		cause_set(g->cause, "%s: truncated or corrupt GGUF: array %s claims %llu "
				"%s elements, more than the %zu bytes left can hold", g->path,
				key, (unsigned long long)n, gv_names[et], g->len - g->pos);
		return -EINVAL;
	}
	if (gv_size[et]) {
		g->pos += (size_t)n * gv_size[et];
		return 0;
	}
	for (uint64_t i = 0; i < n; i++)
		if (skip_value(g, et, depth + 1, key))
			return -EINVAL;
	return 0;
}

/* Header and key/value pairs. Leaves the cursor at the tensor infos. */
static int parse_kv(struct gguf *g)
{
	char kb[96];
	if (g->len < 4 || memcmp(g->base, "GGUF", 4) != 0) {
		cause_set(g->cause, "%s: not a GGUF file (no GGUF magic)", g->path);
		return -EINVAL;
	}
	g->pos = 4;
	if (rd_u32(g, &g->version, "the GGUF version"))
		return -EINVAL;
	uint32_t v = g->version, sw = __builtin_bswap32(v);
	if (v == 1) {
		cause_set(g->cause, "%s: GGUF version 1 is not supported (an early "
				"format with 32-bit counts: convert the model again)", g->path);
		return -ENOTSUP;
	}
	if (v != 2 && v != 3) {
		if (sw >= 1 && sw <= 3)
			cause_set(g->cause, "%s: big-endian GGUF files are not supported",
					g->path);
		else
			cause_set(g->cause, "%s: unsupported GGUF version %u (2 and 3 are "
					"supported)", g->path, v);
		return -ENOTSUP;
	}
	if (rd_u64(g, &g->n_tensors_hdr, "the tensor count") ||
	    rd_u64(g, &g->n_kv_hdr, "the key/value count"))
		return -EINVAL;
	/* a key/value pair takes at least 13 bytes, a tensor info 32 */
	size_t left = g->len - g->pos;
	if (g->n_kv_hdr > left / 13) {
		cause_set(g->cause, "%s: truncated or corrupt GGUF: the header claims %llu "
				"key/value pairs, more than the file's %zu bytes can hold",
				g->path, (unsigned long long)g->n_kv_hdr, g->len);
		return -EINVAL;
	}
	if (g->n_tensors_hdr > left / 32) {
		cause_set(g->cause, "%s: truncated or corrupt GGUF: the header claims %llu "
				"tensors, more than the file's %zu bytes can hold",
				g->path, (unsigned long long)g->n_tensors_hdr, g->len);
		return -EINVAL;
	}
	for (uint64_t i = 0; i < g->n_kv_hdr; i++) {
		if (g->n_kv == g->cap_kv) {
			size_t nc = g->cap_kv ? 2 * g->cap_kv : 32;
			struct gguf_kv *n = realloc(g->kv, nc * sizeof(*n));
			if (!n) {
				cause_set(g->cause, "%s: out of memory", g->path);
				return -ENOMEM;
			}
			g->kv = n;
			g->cap_kv = nc;
		}
		struct gguf_kv *kv = &g->kv[g->n_kv];
		memset(kv, 0, sizeof(*kv));
		char what[64];
		snprintf(what, sizeof what, "key %llu", (unsigned long long)i);
		if (rd_str(g, &kv->key, &kv->key_len, what))
			return -EINVAL;
		shown(kv->key, kv->key_len, kb);
		if (rd_u32(g, &kv->type, "a value type"))
			return -EINVAL;
		if (kv->type == GV_ARRAY && g->len - g->pos >= 12) {
			kv->arr_type = le32(g->base + g->pos);
			kv->arr_n = le64(g->base + g->pos + 4);
			kv->val = g->base + g->pos + 12;
		} else {
			kv->val = g->base + g->pos;
		}
		if (skip_value(g, kv->type, 0, kb))
			return -EINVAL;
		g->n_kv++;
	}
	return 0;
}

static const struct gguf_kv *find_kv(const struct gguf *g, const char *key)
{
	size_t n = strlen(key);
	for (size_t i = 0; i < g->n_kv; i++)
		if (g->kv[i].key_len == n && memcmp(g->kv[i].key, key, n) == 0)
			return &g->kv[i];
	return NULL;
}

static int wrong_type(const struct gguf *g, const char *key, uint32_t type, const char *want)
{
	cause_set(g->cause, "%s: GGUF key %s has type %s, expected %s", g->path, key,
			gv_names[type], want);
	return -EINVAL;
}

/* An integer of any width. 1 and *out if present, 0 if absent, -EINVAL if
 * not an integer (cause set). */
static int kv_int(const struct gguf *g, const char *key, int64_t *out)
{
	const struct gguf_kv *kv = find_kv(g, key);
	if (!kv)
		return 0;
	const uint8_t *p = kv->val;
	switch (kv->type) {
	case GV_U8: *out = p[0]; break;
	case GV_I8: *out = (int8_t)p[0]; break;
	case GV_U16: *out = (uint16_t)(p[0] | p[1] << 8); break;
	case GV_I16: *out = (int16_t)(uint16_t)(p[0] | p[1] << 8); break;
	case GV_U32: *out = le32(p); break;
	case GV_I32: *out = (int32_t)le32(p); break;
	case GV_U64: *out = le64(p) > INT64_MAX ? INT64_MAX : (int64_t)le64(p); break;
	case GV_I64: *out = (int64_t)le64(p); break;
	default: return wrong_type(g, key, kv->type, "an integer");
	}
	return 1;
}

/* A hyper-parameter: an integer in [1, INT_MAX]. `def` < 0: required. */
static int kv_param(const struct gguf *g, const char *key, int def, int *out)
{
	int64_t v;
	int r = kv_int(g, key, &v);
	if (r < 0)
		return r;
	if (r == 0) {
		if (def < 0) {
			cause_set(g->cause, "%s: GGUF key %s is missing", g->path, key);
			return -EINVAL;
		}
		*out = def;
		return 0;
	}
	if (v < 1 || v > INT_MAX) {
		cause_set(g->cause, "%s: GGUF key %s = %lld is out of range", g->path, key,
				(long long)v);
		return -EINVAL;
	}
	*out = (int)v;
	return 0;
}

static int kv_float(const struct gguf *g, const char *key, double def, float *out)
{
	const struct gguf_kv *kv = find_kv(g, key);
	if (!kv) {
		*out = (float)def;
		return 0;
	}
	if (kv->type == GV_F32) {
		uint32_t u = le32(kv->val);
		memcpy(out, &u, 4);
	} else if (kv->type == GV_F64) {
		uint64_t u = le64(kv->val);
		double d;
		memcpy(&d, &u, 8);
		*out = (float)d;
	} else {
		return wrong_type(g, key, kv->type, "f32");
	}
	return 0;
}

static int kv_bool(const struct gguf *g, const char *key, int def, int *out)
{
	const struct gguf_kv *kv = find_kv(g, key);
	if (!kv) {
		*out = def;
		return 0;
	}
	if (kv->type != GV_BOOL)
		return wrong_type(g, key, kv->type, "bool");
	*out = kv->val[0] != 0;
	return 0;
}

/* A string value: 1 with s/n if present, 0 if absent, -EINVAL if another
 * type. */
static int kv_str(const struct gguf *g, const char *key, const uint8_t **s, size_t *n)
{
	const struct gguf_kv *kv = find_kv(g, key);
	if (!kv)
		return 0;
	if (kv->type != GV_STRING)
		return wrong_type(g, key, kv->type, "string");
	*n = (size_t)le64(kv->val);
	*s = kv->val + 8;
	return 1;
}

static int str_is(const uint8_t *s, size_t n, const char *lit)
{
	return n == strlen(lit) && memcmp(s, lit, n) == 0;
}

/* ---- tensors ---------------------------------------------------------------- */

static const struct ggml_type *ggml_type_of(uint32_t t)
{
	return t < N_GGML_TYPES && ggml_types[t].name ? &ggml_types[t] : NULL;
}

/* Tensor infos, alignment, data section; every tensor's extent checked. */
static int parse_tensors(struct gguf *g)
{
	char nb[96];
	int64_t al = 32;
	int r = kv_int(g, "general.alignment", &al);
	if (r < 0)
		return r;
	if (al < 1 || al > (1 << 30) || (al & (al - 1))) {
		cause_set(g->cause, "%s: corrupt GGUF: general.alignment %lld is not a "
				"power of two", g->path, (long long)al);
		return -EINVAL;
	}
	g->alignment = (uint64_t)al;
	for (uint64_t i = 0; i < g->n_tensors_hdr; i++) {
		if (g->n_t == g->cap_t) {
			size_t nc = g->cap_t ? 2 * g->cap_t : 64;
			struct gguf_tensor *n = realloc(g->t, nc * sizeof(*n));
			if (!n) {
				cause_set(g->cause, "%s: out of memory", g->path);
				return -ENOMEM;
			}
			g->t = n;
			g->cap_t = nc;
		}
		struct gguf_tensor *t = &g->t[g->n_t];
		memset(t, 0, sizeof(*t));
		char what[160];
		snprintf(what, sizeof what, "the name of tensor %llu", (unsigned long long)i);
		if (rd_str(g, &t->name, &t->name_len, what))
			return -EINVAL;
		shown(t->name, t->name_len, nb);
		if (t->name_len == 0 || t->name_len > GGUF_MAX_NAME) {
			cause_set(g->cause, "%s: corrupt GGUF: tensor %llu has a name of %zu bytes",
					g->path, (unsigned long long)i, t->name_len);
			return -EINVAL;
		}
		snprintf(what, sizeof what, "the shape of tensor %s", nb);
		if (rd_u32(g, &t->n_dims, what))
			return -EINVAL;
		if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS) {
			cause_set(g->cause, "%s: corrupt GGUF: tensor %s has %u dimensions "
					"(1 to %d allowed)", g->path, nb, t->n_dims, GGUF_MAX_DIMS);
			return -EINVAL;
		}
		uint64_t n_el = 1;
		for (uint32_t d = 0; d < t->n_dims; d++) {
			if (rd_u64(g, &t->ne[d], what))
				return -EINVAL;
			if (t->ne[d] == 0 || t->ne[d] > INT32_MAX ||
			    n_el > (uint64_t)INT64_MAX / t->ne[d]) {
				cause_set(g->cause, "%s: corrupt GGUF: tensor %s has a bad shape "
						"(dimension %u is %llu)", g->path, nb, d,
						(unsigned long long)t->ne[d]);
				return -EINVAL;
			}
			n_el *= t->ne[d];
		}
		for (uint32_t d = t->n_dims; d < GGUF_MAX_DIMS; d++)
			t->ne[d] = 1;
		snprintf(what, sizeof what, "the type and offset of tensor %s", nb);
		if (rd_u32(g, &t->type, what) || rd_u64(g, &t->offset, what))
			return -EINVAL;
		const struct ggml_type *gt = ggml_type_of(t->type);
		if (!gt) {
			cause_set(g->cause, "%s: tensor %s has unknown ggml type %u",
					g->path, nb, t->type);
			return -ENOTSUP;
		}
		if (gt->kt < 0) {
			cause_set(g->cause, "%s: tensor %s has type %s, which llamad does not "
					"support yet (F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K and Q6_K are)", g->path,
					nb, gt->name);
			return -ENOTSUP;
		}
		if (t->ne[0] % (uint64_t)gt->block) {
			cause_set(g->cause, "%s: corrupt GGUF: tensor %s of type %s has rows of "
					"%llu elements, not a multiple of %d", g->path, nb,
					gt->name, (unsigned long long)t->ne[0], gt->block);
			return -EINVAL;
		}
		uint64_t blocks = n_el / (uint64_t)gt->block;
		if (blocks > SIZE_MAX / (uint64_t)gt->bytes) {
			cause_set(g->cause, "%s: corrupt GGUF: tensor %s is too large",
					g->path, nb);
			return -EINVAL;
		}
		t->bytes = (size_t)(blocks * (uint64_t)gt->bytes);
		if (t->offset % g->alignment) {
			cause_set(g->cause, "%s: corrupt GGUF: tensor %s has offset %llu, not a "
					"multiple of the alignment %llu", g->path, nb,
					(unsigned long long)t->offset,
					(unsigned long long)g->alignment);
			return -EINVAL;
		}
		g->n_t++;
	}
	if (g->n_t == 0)
		return 0;
	size_t pad = (size_t)((g->alignment - g->pos % g->alignment) % g->alignment);
	if (pad > g->len - g->pos) {
		cause_set(g->cause, "%s: truncated GGUF: the file ends (%zu bytes) before "
				"its tensor data", g->path, g->len);
		return -EINVAL;
	}
	size_t data_off = g->pos + pad, dlen = g->len - data_off;
	for (size_t i = 0; i < g->n_t; i++) {
		struct gguf_tensor *t = &g->t[i];
		if (t->offset > dlen || t->bytes > dlen - t->offset) {
			cause_set(g->cause, "%s: truncated or corrupt GGUF: tensor %s (%zu bytes "
					"at offset %llu) extends past the end of the data section "
					"(%zu bytes)", g->path, shown(t->name, t->name_len, nb),
					t->bytes, (unsigned long long)t->offset, dlen);
			return -EINVAL;
		}
		t->data = g->base + data_off + t->offset;
	}
	return 0;
}

static struct gguf_tensor *find_tensor(struct gguf *g, const char *name)
{
	size_t n = strlen(name);
	for (size_t i = 0; i < g->n_t; i++)
		if (g->t[i].name_len == n && memcmp(g->t[i].name, name, n) == 0)
			return &g->t[i];
	return NULL;
}

/* A matrix W (rows, cols): GGUF shape [cols, rows]. */
static int get_matrix(struct model *m, struct gguf *g, const char *name, int rows, int cols,
		      struct kt_weight *w)
{
	struct gguf_tensor *t = find_tensor(g, name);
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
	const struct ggml_type *gt = ggml_type_of(t->type);
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
	struct gguf_tensor *t = find_tensor(g, name);
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
	const struct ggml_type *gt = ggml_type_of(t->type);
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
	struct gguf_tensor *t = find_tensor(g, "rope_freqs.weight");
	int n = m->cfg.head_dim / 2;
	t->used = 1;
	if (t->type != 0) {
		cause_set(g->cause, "%s: tensor rope_freqs.weight has type %s (F32 expected)",
				g->path, ggml_type_of(t->type)->name);
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

/* ---- tokenizer ------------------------------------------------------------- */

/* An array key of element type `et` (or `et2`) and count n: 1 and the first
 * element if present, 0 if absent, -EINVAL otherwise. */
static int kv_array(const struct gguf *g, const char *key, uint32_t et, uint32_t et2,
		    uint64_t n, const uint8_t **first, uint32_t *got)
{
	const struct gguf_kv *kv = find_kv(g, key);
	if (!kv)
		return 0;
	if (kv->type != GV_ARRAY || (kv->arr_type != et && kv->arr_type != et2)) {
		cause_set(g->cause, "%s: GGUF key %s is not an array of %s", g->path, key,
				gv_names[et]);
		return -EINVAL;
	}
	if (kv->arr_n != n) {
		cause_set(g->cause, "%s: GGUF key %s has %llu elements for %llu tokens",
				g->path, key, (unsigned long long)kv->arr_n,
				(unsigned long long)n);
		return -EINVAL;
	}
	*first = kv->val;
	*got = kv->arr_type;
	return 1;
}

/* A special token id key: the id if present and in [0, n), else -1. */
static int special(const struct gguf *g, const char *key, int n, int *out)
{
	int64_t v;
	int r = kv_int(g, key, &v);
	if (r < 0)
		return r;
	*out = r == 1 && v >= 0 && v < n ? (int)v : -1;
	return 0;
}

/* GGUF token types (llama.cpp) to SentencePiece piece types; 0 if invalid. */
/* The strings of a GGUF string array (bounds-checked when the metadata was
 * parsed) as (pointer, length) pairs into the map; n arrays allocated. */
static int str_array(const struct gguf_kv *kv, const char ***s, size_t **len)
{
	size_t n = (size_t)kv->arr_n;
	*s = malloc((n ? n : 1) * sizeof(**s));
	*len = malloc((n ? n : 1) * sizeof(**len));
	if (!*s || !*len)
		return -ENOMEM;
	const uint8_t *p = kv->val;
	for (size_t i = 0; i < n; i++) {
		(*len)[i] = (size_t)le64(p);
		(*s)[i] = (const char *)p + 8;
		p += 8 + (*len)[i];
	}
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
	if ((r = kv_array(g, "tokenizer.ggml.token_type", GV_I32, GV_U32, tk->arr_n, &types,
			  &ty_type)) < 0)
		return r;
	const struct gguf_kv *mk = find_kv(g, "tokenizer.ggml.merges");
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
	if ((r = kv_str(g, "tokenizer.ggml.pre", &ps, &pn)) < 0)
		return r;
	struct tok_bpe_spec sp = { .n_vocab = n, .n_merges = (int)mk->arr_n };
	int eot = -1, eom = -1;
	if ((r = special(g, "tokenizer.ggml.bos_token_id", n, &sp.bos)) ||
	    (r = special(g, "tokenizer.ggml.eos_token_id", n, &sp.eos)) ||
	    (r = special(g, "tokenizer.ggml.eot_token_id", n, &eot)) ||
	    (r = special(g, "tokenizer.ggml.eom_token_id", n, &eom)))
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
	if (str_array(tk, &toks, &tok_len) || str_array(mk, &merges, &merge_len))
		goto out;
	if (types) {
		if (!(ty = malloc((size_t)n * sizeof(*ty))))
			goto out;
		for (int i = 0; i < n; i++)
			ty[i] = (int32_t)le32(types + 4 * (size_t)i);
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

/*
 * Build the tokenizer from tokenizer.ggml.*: "gpt2" through build_tok_bpe,
 * "llama" as a SentencePiece ModelProto.
 * 0 with *out set; 0 with *out NULL if the file carries no tokenizer;
 * negative errno with the cause set.
 */
static int build_tok(struct gguf *g, struct tok **out)
{
	*out = NULL;
	const uint8_t *ms = NULL;
	size_t mn = 0;
	int r = kv_str(g, "tokenizer.ggml.model", &ms, &mn);
	if (r < 0)
		return r;
	const struct gguf_kv *tk = find_kv(g, "tokenizer.ggml.tokens");
	if (r == 0 && !tk)
		return 0;
	if (r == 0) {
		cause_set(g->cause, "%s: GGUF has tokenizer.ggml.tokens but no "
				"tokenizer.ggml.model", g->path);
		return -EINVAL;
	}
	int gpt2 = str_is(ms, mn, "gpt2");
	if (!gpt2 && !str_is(ms, mn, "llama")) {
		char b[96];
		cause_set(g->cause, "%s: tokenizer model \"%s\" is not supported "
				"(\"llama\", SentencePiece BPE, and \"gpt2\", byte-level BPE, "
				"are); pass --tokenizer PATH", g->path, shown(ms, mn, b));
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
	if ((r = kv_array(g, "tokenizer.ggml.scores", GV_F32, GV_F32, tk->arr_n, &scores,
			  &st_type)) < 0 ||
	    (r = kv_array(g, "tokenizer.ggml.token_type", GV_I32, GV_U32, tk->arr_n, &types,
			  &ty_type)) < 0)
		return r;
	int unk, bos, eos, pad, dummy = 1, rmws = 0;
	if ((r = special(g, "tokenizer.ggml.unknown_token_id", n, &unk)) ||
	    (r = special(g, "tokenizer.ggml.bos_token_id", n, &bos)) ||
	    (r = special(g, "tokenizer.ggml.eos_token_id", n, &eos)) ||
	    (r = special(g, "tokenizer.ggml.padding_token_id", n, &pad)) ||
	    (r = kv_bool(g, "tokenizer.ggml.add_space_prefix", 1, &dummy)) ||
	    (r = kv_bool(g, "tokenizer.ggml.remove_extra_whitespaces", 0, &rmws)))
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
		size_t len = (size_t)le64(p);
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
			uint32_t u = le32(scores + 4 * (size_t)i);
			memcpy(&sc[i], &u, 4);
		}
		ty[i] = types ? (int32_t)le32(types + 4 * (size_t)i) : TOK_TYPE_NORMAL;
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

/* tokenizer.chat_template: its kind into m->chat_template, its text into
 * m->chat_template_text (none: "unknown", NULL). 0 or -ENOMEM. */
static int chat_template_kind(const struct gguf *g, struct model *m)
{
	const uint8_t *s;
	size_t n;
	if (kv_str(g, "tokenizer.chat_template", &s, &n) != 1)
		return 0;
	if (!(m->chat_template_text = malloc(n + 1)))
		return -ENOMEM;
	memcpy(m->chat_template_text, s, n);
	m->chat_template_text[n] = 0;
	m->chat_template = chat_classify_template((const char *)s, n);
	return 0;
}

/* ---- model ------------------------------------------------------------------ */

static int check_arch(struct gguf *g)
{
	const uint8_t *s;
	size_t n;
	int r = kv_str(g, "general.architecture", &s, &n);
	if (r < 0)
		return r;
	if (r == 0) {
		cause_set(g->cause, "%s: GGUF key general.architecture is missing", g->path);
		return -EINVAL;
	}
	if (!str_is(s, n, "llama")) {
		char b[96];
		cause_set(g->cause, "%s: architecture \"%s\" is not supported (llama is)",
				g->path, shown(s, n, b));
		return -ENOTSUP;
	}
	return 0;
}

static int read_hparams(struct model *m, struct gguf *g)
{
	struct model_config *c = &m->cfg;
	int r, kl = 0, vl = 0, rope_dim = 0, experts = 0;
	if ((r = kv_param(g, "llama.embedding_length", -1, &c->dim)) ||
	    (r = kv_param(g, "llama.block_count", -1, &c->n_layers)) ||
	    (r = kv_param(g, "llama.feed_forward_length", -1, &c->ffn_dim)) ||
	    (r = kv_param(g, "llama.attention.head_count", -1, &c->n_heads)) ||
	    (r = kv_param(g, "llama.attention.head_count_kv", c->n_heads, &c->n_kv_heads)) ||
	    (r = kv_param(g, "llama.context_length", -1, &c->max_ctx)) ||
	    (r = kv_float(g, "llama.attention.layer_norm_rms_epsilon", 1e-5, &c->rms_eps)) ||
	    (r = kv_float(g, "llama.rope.freq_base", 10000.0, &c->rope_theta)))
		return r;
	if (c->dim % c->n_heads) {
		cause_set(g->cause, "%s: embedding_length %d is not a multiple of "
				"head_count %d", g->path, c->dim, c->n_heads);
		return -EINVAL;
	}
	c->head_dim = c->dim / c->n_heads;
	if ((r = kv_param(g, "llama.rope.dimension_count", c->head_dim, &rope_dim)) ||
	    (r = kv_param(g, "llama.attention.key_length", c->head_dim, &kl)) ||
	    (r = kv_param(g, "llama.attention.value_length", c->head_dim, &vl)))
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
	if ((r = kv_int(g, "llama.expert_count", &ex)) < 0)
		return r;
	experts = ex > 0;
	if (experts) {
		cause_set(g->cause, "%s: mixture-of-experts models (llama.expert_count %lld) "
				"are not supported", g->path, (long long)ex);
		return -ENOTSUP;
	}
	const uint8_t *s;
	size_t n;
	if ((r = kv_str(g, "llama.rope.scaling.type", &s, &n)) < 0)
		return r;
	if (r == 1 && !str_is(s, n, "none")) {
		char b[96];
		cause_set(g->cause, "%s: RoPE scaling \"%s\" (llama.rope.scaling.type) is "
				"not supported (none is, and Llama 3.1 scaling as the tensor "
				"rope_freqs.weight)", g->path, shown(s, n, b));
		return -ENOTSUP;
	}
	c->rope_layout = KT_ROPE_INTERLEAVED;
	return 0;
}

/*
 * model_load_gguf — fill m from the GGUF file at path (called by model_load
 * with m->path set). Tensors point into the read-only map; the tokenizer is
 * `tokenizer` if given, else the file's own vocabulary, else tokenizer.model
 * beside the file. 0, or a negative errno with *cause naming the file.
 */
int model_load_gguf(struct model *m, const char *path, const char *tokenizer, char **cause)
{
	const uint8_t *data;
	size_t len;
	int rc = model_map_file(m, path, &data, &len, cause);
	if (rc)
		return rc;
	struct gguf g = { .path = path, .base = data, .len = len, .cause = cause };
	char *deftok = NULL;
	struct model_config *c = &m->cfg;
	if ((rc = parse_kv(&g)) || (rc = check_arch(&g)) || (rc = parse_tensors(&g)) ||
	    (rc = read_hparams(m, &g)))
		goto out;

	/* the vocabulary size is the embedding table's */
	struct gguf_tensor *te = find_tensor(&g, "token_embd.weight");
	if (!te) {
		cause_set(cause, "%s: tensor token_embd.weight is missing", path);
		rc = -EINVAL;
		goto out;
	}
	c->vocab = te->ne[1] <= INT_MAX ? (int)te->ne[1] : 0;
	int vk = 0;
	if ((rc = kv_param(&g, "llama.vocab_size", c->vocab, &vk)))
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

	m->format = "gguf";
	m->layers = calloc((size_t)c->n_layers, sizeof(*m->layers));
	if (!m->layers) {
		rc = -ENOMEM;
		goto out;
	}
	int D = c->dim, Q = c->n_heads * c->head_dim, KV = model_kv_dim(c), F = c->ffn_dim;
	if ((rc = get_matrix(m, &g, "token_embd.weight", c->vocab, D, &m->embed)) ||
	    (rc = get_vector(m, &g, "output_norm.weight", D, &m->final_norm)))
		goto out;
	if (find_tensor(&g, "output.weight")) {
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
	if (find_tensor(&g, "rope_freqs.weight") && (rc = get_rope_freqs(m, &g)))
		goto out;
	/* anything else (biases, experts, extra layers) would be silently
	 * ignored: refuse it */
	for (size_t i = 0; i < g.n_t; i++) {
		if (g.t[i].used)
			continue;
		char b[96];
		cause_set(cause, "%s: tensor %s is not part of a Llama model llamad can "
				"run (biases, experts are not supported)", path,
				shown(g.t[i].name, g.t[i].name_len, b));
		rc = -ENOTSUP;
		goto out;
	}
	m->wtype = m->layers[0].wq.dtype;
	if ((rc = chat_template_kind(&g, m)))
		goto out;

	/* tokenizer: --tokenizer wins, then the metadata, then tokenizer.model
	 * beside the file */
	if (!tokenizer && (rc = build_tok(&g, &m->tok)))
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
	rc = model_finish(m, tokenizer, deftok, cause);
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

/* gguf_load_tokenizer — see model.h: only the metadata is parsed. */
struct tok *gguf_load_tokenizer(const char *path, char **cause)
{
	struct model *m = calloc(1, sizeof(*m));
	if (!m) {
		cause_set(cause, "%s: out of memory", path);
		return NULL;
	}
	const uint8_t *data;
	size_t len;
	struct tok *t = NULL;
	if (model_map_file(m, path, &data, &len, cause) == 0) {
		struct gguf g = { .path = path, .base = data, .len = len, .cause = cause };
		if (parse_kv(&g) == 0 && build_tok(&g, &t) == 0 && !t)
			cause_set(cause, "%s: GGUF file has no tokenizer", path);
		gguf_done(&g);
	}
	model_free(m);
	return t;
}

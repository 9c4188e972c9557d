/*
 * format/gguf.c — see gguf.h.
 */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "util/dtype.h"
#include "util/cause.h"
#include "util/grow.h"

static const char *const gv_names[GV_N] = {
	"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string",
	"array", "u64", "i64", "f64",
};

/* bytes of a fixed-size value type; 0 for string and array */
static const uint8_t gv_size[GV_N] = { 1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8 };

#define GGUF_MAX_NAME 1024      /* tensor names are at most 64 bytes in practice */
#define GGUF_MAX_DEPTH 3        /* arrays of arrays nest at most this deep */

/* ggml tensor types by number: those llamad reads, and the names of the rest
 * for error messages. */
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

void gguf_done(struct gguf *g)
{
	free(g->kv);
	free(g->t);
}

/* ---- reading -------------------------------------------------------------- */

const char *gguf_shown(const uint8_t *s, size_t n, char out[96])
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
	*v = gguf_le32(g->base + g->pos);
	g->pos += 4;
	return 0;
}

static int rd_u64(struct gguf *g, uint64_t *v, const char *what)
{
	if (need(g, 8, what))
		return -EINVAL;
	*v = gguf_le64(g->base + g->pos);
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

int gguf_parse_kv(struct gguf *g)
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
		if (grow(&g->kv, &g->cap_kv, g->n_kv + 1, sizeof(*g->kv), 32)) {
			cause_set(g->cause, "%s: out of memory", g->path);
			return -ENOMEM;
		}
		struct gguf_kv *kv = &g->kv[g->n_kv];
		memset(kv, 0, sizeof(*kv));
		char what[64];
		snprintf(what, sizeof what, "key %llu", (unsigned long long)i);
		if (rd_str(g, &kv->key, &kv->key_len, what))
			return -EINVAL;
		gguf_shown(kv->key, kv->key_len, kb);
		if (rd_u32(g, &kv->type, "a value type"))
			return -EINVAL;
		if (kv->type == GV_ARRAY && g->len - g->pos >= 12) {
			kv->arr_type = gguf_le32(g->base + g->pos);
			kv->arr_n = gguf_le64(g->base + g->pos + 4);
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

/* ---- keys ------------------------------------------------------------------ */

const struct gguf_kv *gguf_find_kv(const struct gguf *g, const char *key)
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

int gguf_kv_int(const struct gguf *g, const char *key, int64_t *out)
{
	const struct gguf_kv *kv = gguf_find_kv(g, key);
	if (!kv)
		return 0;
	const uint8_t *p = kv->val;
	switch (kv->type) {
	case GV_U8: *out = p[0]; break;
	case GV_I8: *out = (int8_t)p[0]; break;
	case GV_U16: *out = (uint16_t)(p[0] | p[1] << 8); break;
	case GV_I16: *out = (int16_t)(uint16_t)(p[0] | p[1] << 8); break;
	case GV_U32: *out = gguf_le32(p); break;
	case GV_I32: *out = (int32_t)gguf_le32(p); break;
	case GV_U64: *out = gguf_le64(p) > INT64_MAX ? INT64_MAX : (int64_t)gguf_le64(p); break;
	case GV_I64: *out = (int64_t)gguf_le64(p); break;
	default: return wrong_type(g, key, kv->type, "an integer");
	}
	return 1;
}

int gguf_kv_param(const struct gguf *g, const char *key, int def, int *out)
{
	int64_t v;
	int r = gguf_kv_int(g, key, &v);
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

int gguf_kv_float(const struct gguf *g, const char *key, double def, float *out)
{
	const struct gguf_kv *kv = gguf_find_kv(g, key);
	if (!kv) {
		*out = (float)def;
		return 0;
	}
	if (kv->type == GV_F32) {
		uint32_t u = gguf_le32(kv->val);
		memcpy(out, &u, 4);
	} else if (kv->type == GV_F64) {
		uint64_t u = gguf_le64(kv->val);
		double d;
		memcpy(&d, &u, 8);
		*out = (float)d;
	} else {
		return wrong_type(g, key, kv->type, "f32");
	}
	return 0;
}

int gguf_kv_bool(const struct gguf *g, const char *key, int def, int *out)
{
	const struct gguf_kv *kv = gguf_find_kv(g, key);
	if (!kv) {
		*out = def;
		return 0;
	}
	if (kv->type != GV_BOOL)
		return wrong_type(g, key, kv->type, "bool");
	*out = kv->val[0] != 0;
	return 0;
}

int gguf_kv_str(const struct gguf *g, const char *key, const uint8_t **s, size_t *n)
{
	const struct gguf_kv *kv = gguf_find_kv(g, key);
	if (!kv)
		return 0;
	if (kv->type != GV_STRING)
		return wrong_type(g, key, kv->type, "string");
	*n = (size_t)gguf_le64(kv->val);
	*s = kv->val + 8;
	return 1;
}

int gguf_kv_array(const struct gguf *g, const char *key, uint32_t et, uint32_t et2,
		  uint64_t n, const uint8_t **first, uint32_t *got)
{
	const struct gguf_kv *kv = gguf_find_kv(g, key);
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

int gguf_str_array(const struct gguf_kv *kv, const char ***s, size_t **len)
{
	size_t n = (size_t)kv->arr_n;
	*s = malloc((n ? n : 1) * sizeof(**s));
	*len = malloc((n ? n : 1) * sizeof(**len));
	if (!*s || !*len)
		return -ENOMEM;
	const uint8_t *p = kv->val;
	for (size_t i = 0; i < n; i++) {
		(*len)[i] = (size_t)gguf_le64(p);
		(*s)[i] = (const char *)p + 8;
		p += 8 + (*len)[i];
	}
	return 0;
}

int gguf_str_is(const uint8_t *s, size_t n, const char *lit)
{
	return n == strlen(lit) && memcmp(s, lit, n) == 0;
}

/* ---- tensors ---------------------------------------------------------------- */

const struct ggml_type *gguf_ggml_type(uint32_t t)
{
	return t < N_GGML_TYPES && ggml_types[t].name ? &ggml_types[t] : NULL;
}

int gguf_parse_tensors(struct gguf *g)
{
	char nb[96];
	int64_t al = 32;
	int r = gguf_kv_int(g, "general.alignment", &al);
	if (r < 0)
		return r;
	if (al < 1 || al > (1 << 30) || (al & (al - 1))) {
		cause_set(g->cause, "%s: corrupt GGUF: general.alignment %lld is not a "
			  "power of two", g->path, (long long)al);
		return -EINVAL;
	}
	g->alignment = (uint64_t)al;
	for (uint64_t i = 0; i < g->n_tensors_hdr; i++) {
		if (grow(&g->t, &g->cap_t, g->n_t + 1, sizeof(*g->t), 64)) {
			cause_set(g->cause, "%s: out of memory", g->path);
			return -ENOMEM;
		}
		struct gguf_tensor *t = &g->t[g->n_t];
		memset(t, 0, sizeof(*t));
		char what[160];
		snprintf(what, sizeof what, "the name of tensor %llu", (unsigned long long)i);
		if (rd_str(g, &t->name, &t->name_len, what))
			return -EINVAL;
		gguf_shown(t->name, t->name_len, nb);
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
		const struct ggml_type *gt = gguf_ggml_type(t->type);
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
				  "(%zu bytes)", g->path, gguf_shown(t->name, t->name_len, nb),
				  t->bytes, (unsigned long long)t->offset, dlen);
			return -EINVAL;
		}
		t->data = g->base + data_off + t->offset;
	}
	return 0;
}

struct gguf_tensor *gguf_find_tensor(struct gguf *g, const char *name)
{
	size_t n = strlen(name);
	for (size_t i = 0; i < g->n_t; i++)
		if (g->t[i].name_len == n && memcmp(g->t[i].name, name, n) == 0)
			return &g->t[i];
	return NULL;
}

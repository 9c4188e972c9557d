/*
 * format/safetensors.c — see safetensors.h.
 */
#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/safetensors.h"
#include "util/cause.h"

void st_set_done(struct st_set *s)
{
	for (int i = 0; i < s->n; i++)
		free(s->t[i].name);
	free(s->t);
	for (int i = 0; i < s->n_files; i++)
		free(s->files[i]);
	free(s->files);
}

static int parse_dtype(const char *s, enum kt_dtype *dt)
{
	if (!strcmp(s, "F32"))
		*dt = KT_F32;
	else if (!strcmp(s, "F16"))
		*dt = KT_F16;
	else if (!strcmp(s, "BF16"))
		*dt = KT_BF16;
	else
		return -1;
	return 0;
}

int st_parse(struct st_set *s, const char *path, const uint8_t *data, size_t len, char **cause)
{
	char **nf = realloc(s->files, (size_t)(s->n_files + 1) * sizeof(*nf));
	if (!nf)
		return -ENOMEM;
	s->files = nf;
	if (!(s->files[s->n_files] = strdup(path)))
		return -ENOMEM;
	const char *fpath = s->files[s->n_files++];

	if (len < 8) {
		cause_set(cause, "%s: truncated: %zu bytes, no safetensors header", fpath, len);
		return -EINVAL;
	}
	uint64_t hlen = 0;
	for (int i = 7; i >= 0; i--)
		hlen = hlen << 8 | data[i];
	if (hlen < 2 || hlen > len - 8 || hlen > (100u << 20)) {
		cause_set(cause, "%s: not a safetensors file (header length %llu, file %zu bytes)",
			  fpath, (unsigned long long)hlen, len);
		return -EINVAL;
	}
	json_error_t jerr;
	json_t *root = json_loadb((const char *)data + 8, (size_t)hlen, 0, &jerr);
	if (!root || !json_is_object(root)) {
		cause_set(cause, "%s: corrupt safetensors header: %s", fpath,
			  root ? "not an object" : jerr.text);
		json_decref(root);
		return -EINVAL;
	}
	const uint8_t *base = data + 8 + hlen;
	size_t dlen = len - 8 - (size_t)hlen;
	const char *key;
	json_t *val;
	int rc = 0;
	json_object_foreach(root, key, val) {
		if (!strcmp(key, "__metadata__"))
			continue;
		json_t *jd = json_object_get(val, "dtype");
		json_t *js = json_object_get(val, "shape");
		json_t *jo = json_object_get(val, "data_offsets");
		if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) ||
		    json_array_size(jo) != 2 || json_array_size(js) > 4) {
			cause_set(cause, "%s: tensor %s: malformed header entry", fpath, key);
			rc = -EINVAL;
			break;
		}
		struct st_tensor t = { 0 };
		t.file = fpath;
		if (parse_dtype(json_string_value(jd), &t.dtype) != 0) {
			cause_set(cause, "%s: tensor %s: unsupported dtype %s (f32, f16, bf16 are)",
				  fpath, key, json_string_value(jd));
			rc = -ENOTSUP;
			break;
		}
		t.ndim = (int)json_array_size(js);
		uint64_t numel = 1;
		for (int i = 0; i < t.ndim; i++) {
			json_t *e = json_array_get(js, (size_t)i);
			json_int_t v = json_is_integer(e) ? json_integer_value(e) : -1;
			if (v < 0 || v > (1LL << 32)) {
				numel = UINT64_MAX;
				break;
			}
			t.shape[i] = v;
			numel *= (uint64_t)v;
		}
		json_t *j0 = json_array_get(jo, 0), *j1 = json_array_get(jo, 1);
		json_int_t b = json_is_integer(j0) ? json_integer_value(j0) : -1;
		json_int_t e = json_is_integer(j1) ? json_integer_value(j1) : -1;
		if (numel == UINT64_MAX || b < 0 || e < b || (uint64_t)e > dlen ||
		    (uint64_t)(e - b) != numel * kt_dtype_size(t.dtype)) {
			cause_set(cause, "%s: tensor %s: data offsets or shape out of range "
				  "(truncated or corrupt file)", fpath, key);
			rc = -EINVAL;
			break;
		}
		t.data = base + b;
		if (s->n == s->cap) {
			int nc = s->cap ? s->cap * 2 : 64;
			struct st_tensor *n = realloc(s->t, (size_t)nc * sizeof(*n));
			if (!n) {
				rc = -ENOMEM;
				break;
			}
			s->t = n;
			s->cap = nc;
		}
		if (!(t.name = strdup(key))) {
			rc = -ENOMEM;
			break;
		}
		s->t[s->n++] = t;
	}
	json_decref(root);
	return rc;
}

const struct st_tensor *st_find(const struct st_set *s, const char *name)
{
	for (int i = 0; i < s->n; i++)
		if (!strcmp(s->t[i].name, name))
			return &s->t[i];
	return NULL;
}

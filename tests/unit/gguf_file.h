/*
 * tests/unit/gguf_file.h — GGUF v3 files taken apart and put together by
 * test_gguf.c and test_llama3.c, independently of model/load_gguf.c (the
 * parser they check): a walk of a well-formed file that records where each
 * key/value pair and tensor info lies, and a writer from serialized pairs
 * and tensor descriptions. Include after <cmocka.h>.
 */
#ifndef LLAMAD_TESTS_GGUF_FILE_H
#define LLAMAD_TESTS_GGUF_FILE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- reading ------------------------------------------------------------------ */

static inline uint64_t le64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static inline uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* bytes of a value of type t at p (within a well-formed file) */
static inline size_t gguf_value_len(const uint8_t *p, uint32_t t)
{
	static const uint8_t fixed[13] = { 1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8 };
	assert_true(t < 13);
	if (t == 8)
		return 8 + (size_t)le64(p);
	if (t != 9)
		return fixed[t];
	uint32_t et = le32(p);
	uint64_t n = le64(p + 4);
	size_t len = 12;
	for (uint64_t i = 0; i < n; i++)
		len += gguf_value_len(p + len, et);
	return len;
}

/* A key/value pair: where it lies in the file. */
struct gguf_kv_rec {
	size_t off, end;        /* the whole pair: key length .. end of value */
	char key[128];
	uint32_t type;
	size_t type_off, val_off;
};

/* A tensor info: its fields and where each lies. */
struct gguf_ti_rec {
	size_t off, end;
	char name[96];
	uint32_t n_dims;
	uint64_t ne[4];         /* 1 past n_dims */
	uint32_t type;
	uint64_t offset;        /* from data_start */
	size_t ndims_off, ne_off, type_off, offset_off;
};

struct gguf_walk {
	struct gguf_kv_rec kv[64];
	int n_kv;
	struct gguf_ti_rec ti[64];
	int n_ti;
	size_t infos_end, data_start;   /* data_start: infos_end rounded up to 32 */
};

/* b[p..): a length-prefixed string into out (NUL-terminated); returns the
 * offset after it. */
static inline size_t gguf_walk_str(const uint8_t *b, size_t len, size_t p, char *out, size_t cap)
{
	assert_true(p + 8 <= len);
	size_t n = (size_t)le64(b + p);
	assert_true(n < cap && p + 8 + n <= len);
	memcpy(out, b + p + 8, n);
	out[n] = '\0';
	return p + 8 + n;
}

/* Walk the well-formed GGUF v3 file b[0..len) (at most 64 pairs and 64
 * tensors, data aligned to 32) into w; anything else fails the test. */
static inline void gguf_walk(const uint8_t *b, size_t len, struct gguf_walk *w)
{
	memset(w, 0, sizeof(*w));
	assert_true(len >= 24);
	assert_memory_equal(b, "GGUF", 4);
	assert_int_equal(le32(b + 4), 3);
	uint64_t nt = le64(b + 8), nkv = le64(b + 16);
	assert_true(nkv <= 64 && nt <= 64);
	size_t p = 24;
	for (uint64_t i = 0; i < nkv; i++) {
		struct gguf_kv_rec *k = &w->kv[w->n_kv++];
		k->off = p;
		p = gguf_walk_str(b, len, p, k->key, sizeof(k->key));
		k->type_off = p;
		k->type = le32(b + p);
		p += 4;
		k->val_off = p;
		p += gguf_value_len(b + p, k->type);
		k->end = p;
		assert_true(p <= len);
	}
	for (uint64_t i = 0; i < nt; i++) {
		struct gguf_ti_rec *t = &w->ti[w->n_ti++];
		t->off = p;
		p = gguf_walk_str(b, len, p, t->name, sizeof(t->name));
		t->ndims_off = p;
		t->n_dims = le32(b + p);
		assert_true(t->n_dims <= 4);
		p += 4;
		t->ne_off = p;
		for (int d = 0; d < 4; d++)
			t->ne[d] = 1;
		for (uint32_t d = 0; d < t->n_dims; d++, p += 8)
			t->ne[d] = le64(b + p);
		t->type_off = p;
		t->type = le32(b + p);
		p += 4;
		t->offset_off = p;
		t->offset = le64(b + p);
		p += 8;
		t->end = p;
		assert_true(p <= len);
	}
	w->infos_end = p;
	w->data_start = (p + 31) / 32 * 32;
}

/* ---- writing ------------------------------------------------------------------ */

/* A growing byte buffer (zero-initialized to start; p malloc'd). */
struct gguf_buf {
	uint8_t *p;
	size_t n, cap;
};

static inline void gguf_buf_add(struct gguf_buf *b, const void *d, size_t n)
{
	if (b->n + n > b->cap) {
		b->cap = (b->n + n) * 2 + 64;
		b->p = realloc(b->p, b->cap);
		assert_non_null(b->p);
	}
	if (n)
		memcpy(b->p + b->n, d, n);
	b->n += n;
}

static inline void gguf_buf_u32(struct gguf_buf *b, uint32_t v)
{
	uint8_t x[4];
	for (int i = 0; i < 4; i++)
		x[i] = (uint8_t)(v >> (8 * i));
	gguf_buf_add(b, x, 4);
}

static inline void gguf_buf_u64(struct gguf_buf *b, uint64_t v)
{
	uint8_t x[8];
	for (int i = 0; i < 8; i++)
		x[i] = (uint8_t)(v >> (8 * i));
	gguf_buf_add(b, x, 8);
}

/* a GGUF string: u64 length, bytes */
static inline void gguf_buf_str(struct gguf_buf *b, const char *s)
{
	gguf_buf_u64(b, strlen(s));
	gguf_buf_add(b, s, strlen(s));
}

/* A tensor to write: its info and its data (not owned). */
struct gguf_tensor {
	char name[96];
	uint32_t n_dims;
	uint64_t ne[4];
	uint32_t type;
	const void *data;
	size_t bytes;
};

/* A GGUF v3 file: the header, the n_kv pairs serialized in kvs, the infos
 * of t[0..n_t) with their data in that order, each tensor at a multiple of
 * alignment from the data section, which starts at one. Returns the
 * malloc'd bytes, their length in *len. */
static inline uint8_t *gguf_serialize(const struct gguf_buf *kvs, int n_kv,
				      const struct gguf_tensor *t, int n_t, uint32_t alignment,
				      size_t *len)
{
	struct gguf_buf b = { 0 };
	gguf_buf_add(&b, "GGUF", 4);
	gguf_buf_u32(&b, 3);
	gguf_buf_u64(&b, (uint64_t)n_t);
	gguf_buf_u64(&b, (uint64_t)n_kv);
	gguf_buf_add(&b, kvs->p, kvs->n);
	uint64_t off = 0;
	for (int i = 0; i < n_t; i++) {
		gguf_buf_str(&b, t[i].name);
		gguf_buf_u32(&b, t[i].n_dims);
		for (uint32_t d = 0; d < t[i].n_dims; d++)
			gguf_buf_u64(&b, t[i].ne[d]);
		gguf_buf_u32(&b, t[i].type);
		gguf_buf_u64(&b, off);
		off = (off + t[i].bytes + alignment - 1) / alignment * alignment;
	}
	static const uint8_t zero[4096];
	assert_true(alignment > 0 && alignment <= sizeof(zero));
	gguf_buf_add(&b, zero, (alignment - b.n % alignment) % alignment);
	size_t base = b.n;
	for (int i = 0; i < n_t; i++) {
		gguf_buf_add(&b, zero, (alignment - (b.n - base) % alignment) % alignment);
		gguf_buf_add(&b, t[i].data, t[i].bytes);
	}
	*len = b.n;
	return b.p;
}

#endif

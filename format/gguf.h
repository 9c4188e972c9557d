/*
 * format/gguf.h — a reader of GGUF containers (versions 2 and 3,
 * little-endian), the file format of llama.cpp: typed key/value metadata,
 * then tensor descriptors, then the aligned tensor data.
 *
 *   header   "GGUF", u32 version, u64 n_tensors, u64 n_kv
 *   n_kv     key (u64 length + bytes), u32 value type, value
 *   tensors  name (string), u32 n_dims, u64 ne[n_dims] (ne[0] is the row
 *            length), u32 ggml type, u64 offset into the data section
 *   data     from the first multiple of general.alignment (default 32)
 *            after the descriptors
 *
 * It reads a file the caller has in memory (mapped read-only) and knows
 * nothing of models or tokenizers: the weight loader (model/load_gguf.c) and
 * the vocabulary loader (text/vocab_gguf.c) ask it for keys and tensors.
 * Every length, count and offset is checked against the file's size
 * before it is used: a truncated or corrupt file gives an error naming the
 * file and what is wrong (*g->cause, util/cause.h), never a crash.
 */
#ifndef LLAMAD_FORMAT_GGUF_H
#define LLAMAD_FORMAT_GGUF_H

#include <endian.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* GGUF metadata value types */
enum {
	GV_U8 = 0, GV_I8 = 1, GV_U16 = 2, GV_I16 = 3, GV_U32 = 4, GV_I32 = 5,
	GV_F32 = 6, GV_BOOL = 7, GV_STRING = 8, GV_ARRAY = 9, GV_U64 = 10,
	GV_I64 = 11, GV_F64 = 12, GV_N
};

#define GGUF_MAX_DIMS 4

/* A ggml tensor type: the ones llamad reads, and the names of the rest
 * for error messages. */
struct ggml_type {
	const char *name;
	int kt;          /* enum kt_dtype (util/dtype.h), or -1 if not supported */
	int block;       /* elements per block */
	int bytes;       /* bytes per block */
};

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
	int used;                /* set by the caller for tensors it took */
};

/* A file being read. The caller sets path (named in messages), base, len
 * and cause (may be NULL); the rest starts zeroed. */
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

/* Little-endian integers at p (any alignment). */
static inline uint64_t gguf_le64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, sizeof(v));
	return le64toh(v);
}

static inline uint32_t gguf_le32(const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, sizeof(v));
	return le32toh(v);
}

/* Free what the reader allocated (not the file). */
void gguf_done(struct gguf *g);

/* The header and the key/value pairs, every value checked; leaves the
 * cursor at the tensor infos. 0, -EINVAL (corrupt, truncated, not GGUF),
 * -ENOTSUP (version 1, big-endian, unknown version) or -ENOMEM, with the
 * cause set. */
int gguf_parse_kv(struct gguf *g);
/* After gguf_parse_kv: the tensor infos, general.alignment and the data
 * section; every tensor's type known and supported, its extent inside the
 * file. Same errors. */
int gguf_parse_tensors(struct gguf *g);

/* The pair of key, or NULL. */
const struct gguf_kv *gguf_find_kv(const struct gguf *g, const char *key);
/* An integer of any width. 1 and *out if present, 0 if absent, -EINVAL if
 * not an integer (cause set). */
int gguf_kv_int(const struct gguf *g, const char *key, int64_t *out);
/* A hyper-parameter: an integer in [1, INT_MAX]; absent, def (def < 0: a
 * required key, its absence an error). 0 or -EINVAL with the cause. */
int gguf_kv_param(const struct gguf *g, const char *key, int def, int *out);
/* An f32 or f64 as float; absent, def. 0 or -EINVAL (another type). */
int gguf_kv_float(const struct gguf *g, const char *key, double def, float *out);
/* A bool; absent, def. 0 or -EINVAL (another type). */
int gguf_kv_bool(const struct gguf *g, const char *key, int def, int *out);
/* A string value: 1 with s/n (into the file, not NUL-terminated) if
 * present, 0 if absent, -EINVAL if another type. */
int gguf_kv_str(const struct gguf *g, const char *key, const uint8_t **s, size_t *n);
/* An array key of element type `et` (or `et2`) and count n: 1 and the
 * first element (its type in *got) if present, 0 if absent, -EINVAL
 * otherwise (cause set). */
int gguf_kv_array(const struct gguf *g, const char *key, uint32_t et, uint32_t et2,
		  uint64_t n, const uint8_t **first, uint32_t *got);
/* The strings of a string array (bounds-checked when the metadata was
 * parsed) as (pointer, length) pairs into the file: *s and *len malloc'd
 * (the caller frees both, also on -ENOMEM). 0 or -ENOMEM. */
int gguf_str_array(const struct gguf_kv *kv, const char ***s, size_t **len);

/* The tensor called name, or NULL. */
struct gguf_tensor *gguf_find_tensor(struct gguf *g, const char *name);
/* The ggml type numbered t, or NULL if unknown. */
const struct ggml_type *gguf_ggml_type(uint32_t t);

/* 1 if s[0, n) is the string lit. */
int gguf_str_is(const uint8_t *s, size_t n, const char *lit);
/* s[0, n) for a message: at most 80 bytes of it, anything but printable
 * ASCII as '?', "..." when cut; into out, which it returns. */
const char *gguf_shown(const uint8_t *s, size_t n, char out[96]);

#endif

/*
 * format/safetensors.h — a reader of safetensors files, the weights of
 * Hugging Face folders: an 8-byte little-endian header length, a JSON
 * header {name: {dtype, shape, data_offsets: [begin, end]}} and the data.
 * A set gathers the tensors of one file or of the shards of a model.
 *
 * It reads files the caller has in memory (mapped read-only) and knows
 * nothing of models: every offset and shape is checked against the
 * file's size, and a bad file gives an error naming it (*cause,
 * util/cause.h).
 */
#ifndef LLAMAD_FORMAT_SAFETENSORS_H
#define LLAMAD_FORMAT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "util/dtype.h"

struct st_tensor {
	char *name;
	const char *file;      /* shard path (owned by st_set.files) */
	const uint8_t *data;
	enum kt_dtype dtype;
	int ndim;
	int64_t shape[4];
};

struct st_set {
	struct st_tensor *t;
	int n, cap;
	char **files;
	int n_files;
};

/* Free the set's names and paths (not the files' memory). */
void st_set_done(struct st_set *s);

/* Add the tensors of the safetensors file at path, data[0, len) in memory
 * (and staying there while the set is used): F32, F16 and BF16 tensors of
 * up to 4 dimensions. 0, or -EINVAL (truncated, corrupt), -ENOTSUP
 * (another dtype), -ENOMEM, with *cause naming the file. */
int st_parse(struct st_set *s, const char *path, const uint8_t *data, size_t len, char **cause);

/* The tensor called name, or NULL. */
const struct st_tensor *st_find(const struct st_set *s, const char *name);

#endif

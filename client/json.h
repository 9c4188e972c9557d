/*
 * client/json.h — a small streaming JSON writer for llamactl --json.
 *
 * Values are written to a FILE as they come; the writer tracks commas and
 * nesting. Strings are escaped per RFC 8259; bytes that are not valid UTF-8
 * are written as U+FFFD so the output always parses.
 */
#ifndef LLAMACTL_JSON_H
#define LLAMACTL_JSON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define JSON_MAX_DEPTH 16

struct json {
	FILE *f;
	int depth;
	bool first[JSON_MAX_DEPTH];  /* no value written yet at this level */
	bool after_key;              /* a key was written, its value is next */
};

/* Start writing to f (not owned). */
void json_init(struct json *j, FILE *f);

/* Open / close an object or an array. Nesting beyond JSON_MAX_DEPTH is a
 * programming error and aborts. */
void json_obj_begin(struct json *j);
void json_obj_end(struct json *j);
void json_arr_begin(struct json *j);
void json_arr_end(struct json *j);

/* Write an object key; the next call writes its value. */
void json_key(struct json *j, const char *key);

/* Scalar values; json_str(NULL) writes null. json_strn writes len bytes. */
void json_str(struct json *j, const char *s);
void json_strn(struct json *j, const char *s, size_t len);
void json_u64(struct json *j, uint64_t v);
void json_i64(struct json *j, int64_t v);
void json_double(struct json *j, double v);
void json_bool(struct json *j, bool v);
void json_null(struct json *j);

/* End the document with a newline. */
void json_end(struct json *j);

/* Write s (len bytes) as a quoted, escaped JSON string to f. */
void json_write_string(FILE *f, const char *s, size_t len);

#endif

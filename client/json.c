/*
 * client/json.c — see json.h.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "client/json.h"

void json_init(struct json *j, FILE *f)
{
	memset(j, 0, sizeof(*j));
	j->f = f;
	j->first[0] = true;
}

/* Comma before a value (or a key) unless it is the first in its container
 * or the value of a key just written. */
static void sep(struct json *j)
{
	if (j->after_key) {
		j->after_key = false;
		return;
	}
	if (!j->first[j->depth])
		fputc(',', j->f);
	j->first[j->depth] = false;
}

static void begin(struct json *j, char c)
{
	sep(j);
	if (j->depth + 1 >= JSON_MAX_DEPTH)
		abort();
	fputc(c, j->f);
	j->first[++j->depth] = true;
}

static void finish(struct json *j, char c)
{
	if (j->depth > 0)
		j->depth--;
	fputc(c, j->f);
}

void json_obj_begin(struct json *j) { begin(j, '{'); }
void json_obj_end(struct json *j) { finish(j, '}'); }
void json_arr_begin(struct json *j) { begin(j, '['); }
void json_arr_end(struct json *j) { finish(j, ']'); }

void json_key(struct json *j, const char *key)
{
	sep(j);
	json_write_string(j->f, key, strlen(key));
	fputc(':', j->f);
	j->after_key = true;
}

/* Length of the valid UTF-8 sequence at s (n bytes left), or 0. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
	unsigned c = s[0];
	size_t len;
	unsigned min;
	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf) {
		len = 2; min = 0x80;
	} else if (c >= 0xe0 && c <= 0xef) {
		len = 3; min = 0x800;
	} else if (c >= 0xf0 && c <= 0xf4) {
		len = 4; min = 0x10000;
	} else {
		return 0;
	}
	if (n < len)
		return 0;
	unsigned cp = c & (0x7f >> len);
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (s[i] & 0x3f);
	}
	if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return len;
}

void json_write_string(FILE *f, const char *s, size_t len)
{
	const unsigned char *p = (const unsigned char *)s;
	fputc('"', f);
	size_t i = 0;
	while (i < len) {
		unsigned c = p[i];
		if (c >= 0x80) {
			size_t k = utf8_len(p + i, len - i);
			if (k == 0) {
				fputs("\\ufffd", f);
				i++;
			} else {
				fwrite(p + i, 1, k, f);
				i += k;
			}
			continue;
		}
		switch (c) {
		case '"': fputs("\\\"", f); break;
		case '\\': fputs("\\\\", f); break;
		case '\n': fputs("\\n", f); break;
		case '\r': fputs("\\r", f); break;
		case '\t': fputs("\\t", f); break;
		case '\b': fputs("\\b", f); break;
		case '\f': fputs("\\f", f); break;
		default:
			if (c < 0x20 || c == 0x7f)
				fprintf(f, "\\u%04x", c);
			else
				fputc((int)c, f);
		}
		i++;
	}
	fputc('"', f);
}

void json_str(struct json *j, const char *s)
{
	if (!s) {
		json_null(j);
		return;
	}
	json_strn(j, s, strlen(s));
}

void json_strn(struct json *j, const char *s, size_t len)
{
	sep(j);
	json_write_string(j->f, s, len);
}

void json_u64(struct json *j, uint64_t v)
{
	sep(j);
	fprintf(j->f, "%llu", (unsigned long long)v);
}

void json_i64(struct json *j, int64_t v)
{
	sep(j);
	fprintf(j->f, "%lld", (long long)v);
}

void json_double(struct json *j, double v)
{
	sep(j);
	if (isfinite(v))
		fprintf(j->f, "%.15g", v);
	else
		fputs("null", j->f);
}

void json_bool(struct json *j, bool v)
{
	sep(j);
	fputs(v ? "true" : "false", j->f);
}

void json_null(struct json *j)
{
	sep(j);
	fputs("null", j->f);
}

void json_end(struct json *j)
{
	fputc('\n', j->f);
}

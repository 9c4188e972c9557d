/*
 * proto/names.c — see names.h.
 */
#include <ctype.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "proto/names.h"

/* Length of the prefix all of d's value names share, cut back to just
 * after an underscore (0 when they share none). */
static size_t common_prefix(const ProtobufCEnumDescriptor *d)
{
	if (d->n_values == 0)
		return 0;
	const char *first = d->values[0].name;
	size_t len = strlen(first);
	for (unsigned i = 1; i < d->n_values; i++) {
		const char *s = d->values[i].name;
		size_t k = 0;
		while (k < len && s[k] == first[k])
			k++;
		len = k;
	}
	while (len > 0 && first[len - 1] != '_')
		len--;
	return len;
}

/* The derived name of d->values[i] into buf (n > 0 bytes): its length. */
static size_t derive(const ProtobufCEnumDescriptor *d, unsigned i, size_t prefix, char sep,
		     char *buf, size_t n)
{
	const char *s = d->values[i].name;
	if (!s[prefix])
		prefix = 0;   /* the whole name is the prefix: keep it */
	size_t len = 0;
	for (s += prefix; *s; s++, len++)
		if (len + 1 < n)
			buf[len] = *s == '_' ? sep : (char)tolower((unsigned char)*s);
	buf[len + 1 < n ? len : n - 1] = '\0';
	return len;
}

/* Index in d->values of value, or -1. */
static int value_index(const ProtobufCEnumDescriptor *d, int value)
{
	const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(d, value);
	return v ? (int)(v - d->values) : -1;
}

int pb_enum_derive_name(const ProtobufCEnumDescriptor *d, int value, char sep, char *buf,
			size_t n)
{
	int i = value_index(d, value);
	if (i < 0)
		return -ENOENT;
	if (n == 0)
		return -ENOSPC;
	size_t len = derive(d, (unsigned)i, common_prefix(d), sep, buf, n);
	return len < n ? (int)len : -ENOSPC;
}

static const char *alias_of(const struct pb_enum_names *t, int value)
{
	for (const struct pb_enum_alias *a = t->alias; a && a->name; a++)
		if (a->value == value)
			return a->name;
	return NULL;
}

/* Build t's names: one block holding the pointers, then the derived
 * strings (a value's derived name is never longer than its .proto name). */
static const char *const *build(const struct pb_enum_names *t)
{
	const ProtobufCEnumDescriptor *d = t->desc;
	size_t bytes = d->n_values * sizeof(char *);
	for (unsigned i = 0; i < d->n_values; i++)
		bytes += strlen(d->values[i].name) + 1;
	const char **names = malloc(bytes ? bytes : 1);
	if (!names)
		return NULL;
	char *p = (char *)(names + d->n_values), *end = (char *)names + bytes;
	size_t prefix = common_prefix(d);
	for (unsigned i = 0; i < d->n_values; i++) {
		names[i] = alias_of(t, d->values[i].value);
		if (!names[i]) {
			names[i] = p;
			p += derive(d, i, prefix, t->sep, p, (size_t)(end - p)) + 1;
		}
	}
	return names;
}

/* t's names, built on first use; NULL out of memory. Two threads may both
 * build them: one table is kept, the other freed. */
static const char *const *names_of(struct pb_enum_names *t)
{
	const char *const *names = atomic_load_explicit(&t->names, memory_order_acquire);
	if (names)
		return names;
	const char *const *mine = build(t);
	if (!mine)
		return NULL;
	if (atomic_compare_exchange_strong_explicit(&t->names, &names, mine,
						    memory_order_acq_rel, memory_order_acquire))
		return mine;
	free((void *)mine);
	return names;
}

const char *pb_enum_name(struct pb_enum_names *t, int value)
{
	int i = value_index(t->desc, value);
	const char *const *names = i < 0 ? NULL : names_of(t);
	return names ? names[i] : NULL;
}

bool pb_enum_value(struct pb_enum_names *t, const char *name, int *value)
{
	const char *const *names = names_of(t);
	for (unsigned i = 0; names && i < t->desc->n_values; i++) {
		if (strcmp(names[i], name) == 0) {
			*value = t->desc->values[i].value;
			return true;
		}
	}
	return false;
}

/*
 * proto/names.h — short names of the protocol's enum values, derived from
 * their protobuf-c descriptors: the one place where "llama3", "max_tokens"
 * or "disk" come from, for llamactl's text and --json output, the daemon's
 * messages and configuration, and the tests.
 *
 * A value's derived name is its .proto name without the prefix that all of
 * its enum's value names share (up to and including an underscore),
 * lowercased, each remaining '_' written as the table's separator:
 * TEMPLATE_LLAMA3 -> "llama3", STOP_MAX_TOKENS -> "max_tokens",
 * LOCATION_RAM -> "ram"; ErrorCode's names share no prefix, so with the
 * separator ' ' BAD_REQUEST -> "bad request". Where a program chose another
 * form for a value (the daemon calls TEMPLATE_DEFAULT "auto", llamactl
 * calls STOP_STRING "stop"), it lists an alias; every other value, one
 * added to the .proto included, is named without code.
 *
 * Nothing here logs. Tables are filled in once, on first use, and may be
 * shared between threads.
 */
#ifndef LLAMAD_PROTO_NAMES_H
#define LLAMAD_PROTO_NAMES_H

#include <stdbool.h>
#include <stddef.h>

#include <protobuf-c/protobuf-c.h>

/* A name chosen for one value instead of its derived name. */
struct pb_enum_alias {
	int value;
	const char *name;
};

/*
 * The names of one enum, as one program writes them. Define it with
 * PB_ENUM_NAMES (desc: the enum; sep: written for '_'; alias: a list ended
 * by an entry whose name is NULL, or NULL). The names are built from the
 * descriptor on first use (one allocation, kept for the life of the
 * program like the descriptor itself, never freed); `names` is private.
 */
struct pb_enum_names {
	const ProtobufCEnumDescriptor *desc;
	const struct pb_enum_alias *alias;
	char sep;
	_Atomic(const char *const *) names;   /* by index in desc->values */
};

#define PB_ENUM_NAMES(desc, sep, alias) { (desc), (alias), (sep), NULL }

/* Write the derived name of `value` (no alias) into buf (n bytes, NUL
 * included). Returns its length, -ENOENT if d has no such value, or
 * -ENOSPC if it does not fit (buf then holds what fits). */
int pb_enum_derive_name(const ProtobufCEnumDescriptor *d, int value, char sep, char *buf,
			size_t n);

/* The name of `value`: its alias if it has one, else its derived name.
 * NULL if the enum has no such value (the caller picks its word for an
 * unknown value) or if memory ran out building the table. The string lives
 * as long as the program. */
const char *pb_enum_name(struct pb_enum_names *t, int value);

/* The value whose name (as pb_enum_name gives it: an alias hides the
 * derived name) is `name`: true and *value set, or false. */
bool pb_enum_value(struct pb_enum_names *t, const char *name, int *value);

#endif

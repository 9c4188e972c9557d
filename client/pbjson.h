/*
 * client/pbjson.h — llamactl's --json output of protocol messages, written
 * from their protobuf-c descriptors: a field added to llamad.proto appears
 * in the output without code.
 *
 * A message is a JSON object whose keys are its fields' .proto names, in
 * field-number order, each written as its type says: numbers, booleans,
 * strings (bytes too, as UTF-8-safe strings), enum values by their names
 * (client/enums.h), repeated fields as arrays, messages as objects. An
 * optional field that is not set is written as its default value (0, false,
 * the enum's first value), a string or a message as null; a oneof member
 * that is not chosen is left out. The forms llamactl chose otherwise, on
 * purpose, are rows of one table in pbjson.c (fields left out, left out when
 * unset, null or "" when unset, timings rounded, keys moved).
 */
#ifndef LLAMACTL_PBJSON_H
#define LLAMACTL_PBJSON_H

#include <protobuf-c/protobuf-c.h>

#include "client/json.h"

/* Write msg as a JSON object (a value: after a key, in an array, or alone). */
void pbjson_object(struct json *j, const ProtobufCMessage *msg);

/* Write msg's fields as members of the object being written, so that the
 * caller can add its own keys before or after them ("event", ...). */
void pbjson_members(struct json *j, const ProtobufCMessage *msg);

/*
 * One JSON document on stdout, a line, its shape written as a format (as
 * jansson's json_pack reads one), so that an object is one call and not
 * a call a field: '{' '}' '[' ']' open and close; in an object a key is
 * 's' (const char *) and its value follows; values: 's' a string
 * (const char *; NULL is null), 's#' a string of a length (const char *,
 * size_t), 'u' a uint64_t, 'i' an int64_t, 'b' a bool (int), 'n' null,
 * 'M' (in an object, in a key's place) the members of a protocol message
 * (const ProtobufCMessage *, as pbjson_members). Spaces, ':' and ',' are
 * for the reader and ignored. Numbers must be passed as the format's type
 * (cast them). A malformed format is a programming error and aborts.
 */
void pbjson_line(const char *fmt, ...);

#endif

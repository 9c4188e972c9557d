/*
 * daemon/validate.h — checks on a decoded Request before it reaches the
 * engine. Pure: no libevent, no I/O, so it can be fuzzed on its own
 * (tests/fuzz/fuzz_request.c).
 */
#ifndef LLAMAD_DAEMON_VALIDATE_H
#define LLAMAD_DAEMON_VALIDATE_H

#include <stdint.h>

#include "llamad.pb-c.h"
#include "proto/limits.h"

#define MAX_GEN_TOKENS (1u << 20)

/* Check request q (as unpacked by protobuf-c; not modified, not owned).
 * Every enum field present, at any depth, must hold a value its enum's
 * descriptor names (protobuf-c takes any int32: -1 is refused here, naming
 * the field). max_text bounds every text field and the token count of a
 * Detokenize.
 * Returns 0, or -EINVAL (BAD_REQUEST), -E2BIG (TOO_LARGE) or -ENOSYS
 * (UNKNOWN_OP; the wire codes by reply_code, daemon/reply.h) with *why set
 * to a one-line message (static, or for TOO_LARGE, naming the size and the
 * limit, in a buffer of this thread's valid until the next call). */
int request_validate(const Llamad__Request *q, uint32_t max_text, const char **why);

/* The most unknown fields a request may carry: a newer client's few
 * additions pass, a flood is refused before protobuf-c unpacks it (it
 * keeps every unknown field, ~80 bytes of bookkeeping each: the count is
 * what multiplies memory; their bytes are copied once, no more than the
 * frame's). */
#define REQUEST_UNKNOWN_FIELDS 64
/* The most string, bytes and message fields (each an allocation once
 * unpacked; a Generate with 1024 stop entries has ~1030). */
#define REQUEST_STRINGS 2048

/* Scan the serialized Request body[0, len) before it is unpacked: more
 * unknown fields than REQUEST_UNKNOWN_FIELDS, or more string,
 * bytes and message fields than REQUEST_STRINGS, at any depth, is -E2BIG
 * (TOO_LARGE), and so is a string field over max_text bytes (no string
 * of a request may be longer: a frame of one 16 MiB text is refused
 * without protobuf-c copying it); a string field, at any depth, holding a
 * NUL byte
 * (protobuf-c would hand it over cut at the NUL: "name\0x" would open
 * session "name") is -EINVAL. 0 otherwise, with *why set on an error (a
 * message in this thread's buffer for TOO_LARGE). *id is the request's id
 * (0 when the bytes hold none), for the error's reply. Bytes that do not
 * parse are left to the unpacker. */
int request_scan(const uint8_t *body, size_t len, uint32_t max_text, uint64_t *id,
		 const char **why);

#endif

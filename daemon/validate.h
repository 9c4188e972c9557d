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
 * max_text bounds every text field and the token count of a Detokenize.
 * Returns 0, or -EINVAL (BAD_REQUEST), -E2BIG (TOO_LARGE) or -ENOSYS
 * (UNKNOWN_OP; the wire codes by reply_code, daemon/reply.h) with *why set
 * to a one-line message (static, or for TOO_LARGE, naming the size and the
 * limit, in a buffer of this thread's valid until the next call). */
int request_validate(const Llamad__Request *q, uint32_t max_text, const char **why);

/* Check the serialized Request body[0, len) that protobuf-c unpacked: no
 * string field, at any depth, holds a NUL byte (protobuf-c would hand it
 * over cut at the NUL: "name\0x" would open session "name"). 0, or -EINVAL
 * with *why set. Bytes that do not parse are left to the unpacker. */
int request_strings_ok(const uint8_t *body, size_t len, const char **why);

#endif

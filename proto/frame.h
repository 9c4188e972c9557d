/*
 * proto/frame.h — length-prefixed framing of protobuf-c messages.
 *
 * A frame is a 4-byte big-endian length followed by that many bytes of one
 * serialized message (proto/llamad.proto). These helpers are shared by the
 * daemon, llamactl and the tests; they know nothing of sessions.
 */
#ifndef LLAMAD_PROTO_FRAME_H
#define LLAMAD_PROTO_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "llamad.pb-c.h"

#define FRAME_HDR 4
#define FRAME_MAX_DEFAULT (16u << 20)   /* 16 MiB */
#define LLAMAD_PROTOCOL_VERSION 1

/* Set an optional (proto2) scalar field of a protobuf-c message and its
 * has_ flag: PB_SET(&hello, protocol_version, 1). */
#define PB_SET(msg, field, value) ((msg)->has_##field = 1, (msg)->field = (value))

/* Length stored in a 4-byte header. */
static inline uint32_t frame_get_len(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static inline void frame_put_len(uint8_t *p, uint32_t n)
{
	p[0] = (uint8_t)(n >> 24);
	p[1] = (uint8_t)(n >> 16);
	p[2] = (uint8_t)(n >> 8);
	p[3] = (uint8_t)n;
}

/* Serialize msg into a malloc'd frame (header + body). Returns 0 and sets
 * *out / *len, or -ENOMEM. */
int frame_pack(const ProtobufCMessage *msg, uint8_t **out, size_t *len);

/* A blocking stream socket connected to the Unix socket at path (close on
 * exec; connect retried on EINTR): the fd, or -errno (-ENAMETOOLONG if
 * path does not fit a sockaddr_un, -ENOENT if it is empty). */
int frame_dial(const char *path);

/* Write all len bytes to fd (blocking, retrying on EINTR). 0 or -errno. */
int frame_write_all(int fd, const void *buf, size_t len);

/* Send msg as one frame on a blocking fd. 0 or -errno. */
int frame_send(int fd, const ProtobufCMessage *msg);

/* Read one Response frame and unpack it; NULL on error with *err set to a
 * negative errno (-EBADMSG if it does not unpack). Free the result with
 * llamad__response__free_unpacked(r, NULL). */
Llamad__Response *frame_recv_response(int fd, uint32_t max, int *err);

/* Short, stable name of an error code: its ErrorCode name written with
 * spaces (proto/names.h: UNKNOWN_SESSION -> "unknown session"; UNKNOWN_OP,
 * INTERNAL and STORAGE read "unknown operation", "internal error", "storage
 * error"), "error" for 0 and for a code this build does not know. */
const char *frame_error_name(int code);

#endif

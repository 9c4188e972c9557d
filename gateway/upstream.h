/*
 * gateway/upstream.h — llamad-http's connection to one llamad: the framed
 * protobuf protocol (proto/llamad.proto) over a Unix socket, asynchronous on
 * the gateway's event loop.
 *
 * One connection serves one HTTP request: it is opened, says Hello (acting
 * for the HTTP caller's uid when that is not the gateway's own), carries the
 * request's calls one after the other, and is closed. Closing it while a
 * Generate runs makes llamad cancel the generation (STOP_CANCELLED).
 */
#ifndef LLAMAD_GATEWAY_UPSTREAM_H
#define LLAMAD_GATEWAY_UPSTREAM_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <event2/event.h>

#include "proto/frame.h"

struct up;

/* Called with each reply to the call in flight: streamed token events and
 * then the terminal reply (any other body). r is NULL when the connection
 * failed (err: a negative errno; -ECONNRESET when llamad closed it); the
 * connection is then unusable. r belongs to the connection: copy what is
 * kept. */
typedef void (*up_fn)(void *arg, const Llamad__Response *r, int err);

/* Connect to the socket at path. NULL with *err a negative errno (ENOENT,
 * ECONNREFUSED: nothing listens; EACCES). */
struct up *up_open(struct event_base *base, const char *path, int *err);

/* Send req (its id is set here) and call fn for its replies. One call at a
 * time: a second before the first's terminal reply is -EBUSY. 0, -EMSGSIZE
 * (over the daemon's max_frame, once Hello told it) or -ENOMEM. */
int up_call(struct up *u, Llamad__Request *req, up_fn fn, void *arg);

/* Send req without waiting for its reply (a Cancel beside the call in
 * flight): its replies are dropped. 0 or a negative errno. */
int up_send_only(struct up *u, Llamad__Request *req);

/* Id of the call in flight (0: none). */
uint64_t up_current(const struct up *u);

/* Close and free; no callback is called after. NULL is fine. */
void up_close(struct up *u);

/* The largest frame llamad accepts (HelloReply.max_frame; a default before
 * it). */
void up_set_max_frame(struct up *u, uint32_t max_frame);

#endif

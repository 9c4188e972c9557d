/*
 * client/conn.h — llamactl's connection to llamad: socket path, connect,
 * handshake, request/response matching, streamed generation and Cancel.
 *
 * One request is waited for at a time; answers carrying another id (a late
 * reply to a Cancel, say) are read and discarded. Nothing here prints: every
 * function returns 0 or a negative errno and hands daemon replies, errors
 * included, to the caller.
 */
#ifndef LLAMACTL_CONN_H
#define LLAMACTL_CONN_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/frame.h"

#define LLAMACTL_VERSION "0.2.0"
#define LLAMACTL_CLIENT "llamactl " LLAMACTL_VERSION

struct conn {
	int fd;                    /* -1 when closed */
	uint64_t next_id;          /* next request id (ids start at 1) */
	uint32_t max_frame;        /* largest frame the daemon accepts */
	uint32_t max_text;         /* largest text field; 0 if not told */
	size_t refused_bytes;      /* the last frame conn_send refused (-EMSGSIZE) */
	uint32_t context_length;   /* from HelloReply; 0 if not told */
	uint32_t idle_timeout;     /* from HelloReply: closed after this many idle
				    * seconds (0: never, or not told) */
	double last_reply;         /* monotonic seconds of the last frame read */
	char *server;              /* HelloReply.server, owned, may be NULL */
	char *model;               /* HelloReply.model, owned, may be NULL */
	/* Interrupts (used by the interactive chat; both may stay NULL):
	 * while a request is awaited, *intr becoming nonzero sends one Cancel
	 * for it and the wait goes on for its terminal reply; a second
	 * interrupt after that makes the wait return -EINTR. wait_mask is the
	 * signal mask installed while sleeping in ppoll(), so a signal blocked
	 * elsewhere is only taken there (no lost wake-ups). */
	volatile sig_atomic_t *intr;
	const sigset_t *wait_mask;
};

/* Initialise c as closed. */
void conn_init(struct conn *c);

/* Connect c to the Unix socket at path. 0, or a negative errno from socket()
 * or connect() (-ENAMETOOLONG if path does not fit a sockaddr_un). */
int conn_connect(struct conn *c, const char *path);

/* Send Hello (protocol 1, LLAMACTL_CLIENT) and wait for the reply. On 0,
 * *out is the reply (a HelloReply or an Error; the caller frees it with
 * llamad__response__free_unpacked); a HelloReply's fields are also copied
 * into c. Negative errno on a transport failure. */
int conn_hello(struct conn *c, Llamad__Response **out);

/* Close the socket and free what c owns; c may be closed already. */
void conn_close(struct conn *c);

/* Give req a fresh id, send it and return the id in *id. 0, -EMSGSIZE if the
 * frame exceeds the daemon's max_frame, or another negative errno (-EPIPE,
 * -ECONNRESET: the connection is gone). req stays owned by the caller. */
int conn_send(struct conn *c, Llamad__Request *req, uint64_t *id);

/* Called with every streamed (Response.token) reply to the awaited request.
 * Return 0 to go on, a negative errno to abandon the wait with it. */
typedef int (*conn_event_fn)(void *ctx, const Llamad__Response *r);

/* Wait for the terminal reply to request id: any body but a token event.
 * Token events go to fn (may be NULL: dropped). Replies with another id are
 * discarded, except an Error with id 0, which the daemon uses for a frame it
 * could not attribute and is returned as the answer. Handles c->intr as
 * described above; *cancelled (may be NULL) tells whether a Cancel was sent.
 * On 0, *out is the terminal reply (caller frees). Negative errno on a
 * transport or protocol failure, -EINTR on a second interrupt, or fn's. */
int conn_wait(struct conn *c, uint64_t id, conn_event_fn fn, void *ctx,
	      Llamad__Response **out, bool *cancelled);

/* The next reply, whatever request it answers (several in flight: the
 * caller matches ids). 0 with *out (caller frees), or a negative errno. */
int conn_next(struct conn *c, Llamad__Response **out);

/* conn_send + conn_wait for a request without streamed events. */
int conn_call(struct conn *c, Llamad__Request *req, Llamad__Response **out);

/* Human text for a transport failure code from the functions above. */
const char *conn_strerror(int err);

#endif

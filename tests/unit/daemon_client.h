/*
 * tests/unit/daemon_client.h — the protocol client the daemon tests share:
 * send a request, read replies until the one for an id, keeping the others
 * for later. Include after <cmocka.h> and proto/frame.h, with WAIT_MS (the
 * longest wait for one reply) and RECV_MAX (largest frame) defined.
 */
#ifndef LLAMAD_TESTS_DAEMON_CLIENT_H
#define LLAMAD_TESTS_DAEMON_CLIENT_H

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A reply read while waiting for another id. */
struct stash {
	struct stash *next;
	Llamad__Response *r;
};

/* One connection: its socket, the last request id, the replies kept. */
struct cli {
	int fd;
	uint64_t next_id;
	struct stash *kept;
};

/* Next Response on fd within ms; NULL with *err (-ETIMEDOUT, -ECONNRESET
 * on end of stream, ...). */
static inline Llamad__Response *recv_within(int fd, int ms, int *err)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	int rc;
	do
		rc = poll(&p, 1, ms);
	while (rc < 0 && errno == EINTR);
	if (rc <= 0) {
		*err = -ETIMEDOUT;
		return NULL;
	}
	return frame_recv_response(fd, RECV_MAX, err);
}

static inline uint64_t cli_send(struct cli *c, Llamad__Request *q)
{
	q->has_id = 1;
	q->id = ++c->next_id;
	int rc = frame_send(c->fd, &q->base);
	if (rc)
		fail_msg("send: %s", strerror(-rc));
	return q->id;
}

/* The next reply for id: a kept one first, else read (keeping others). */
static inline Llamad__Response *cli_next(struct cli *c, uint64_t id)
{
	for (struct stash **pp = &c->kept; *pp; pp = &(*pp)->next) {
		if ((*pp)->r->id == id) {
			struct stash *s = *pp;
			Llamad__Response *r = s->r;
			*pp = s->next;
			free(s);
			return r;
		}
	}
	for (;;) {
		int err = 0;
		Llamad__Response *r = recv_within(c->fd, WAIT_MS, &err);
		if (!r)
			fail_msg("waiting for the reply to %llu: %s", (unsigned long long)id,
				 strerror(-err));
		if (r->id == id)
			return r;
		struct stash *s = calloc(1, sizeof(*s)), **tail = &c->kept;
		assert_non_null(s);
		s->r = r;
		while (*tail)
			tail = &(*tail)->next;
		*tail = s;
	}
}

static inline Llamad__Response *cli_call(struct cli *c, Llamad__Request *q)
{
	return cli_next(c, cli_send(c, q));
}

static inline void rfree(Llamad__Response *r)
{
	if (r)
		llamad__response__free_unpacked(r, NULL);
}

/* A reply's body for failure messages (error code and text). */
static inline const char *body_name(const Llamad__Response *r)
{
	static char buf[400];
	if (r->body_case == LLAMAD__RESPONSE__BODY_ERROR) {
		snprintf(buf, sizeof(buf), "error %d (%s: %s)", r->error->code,
			 frame_error_name(r->error->code), r->error->message ? r->error->message : "");
		return buf;
	}
	snprintf(buf, sizeof(buf), "body %d", r->body_case);
	return buf;
}

#endif

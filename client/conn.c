/*
 * client/conn.c — see conn.h.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/conn.h"
#include "util/clock.h"

void conn_init(struct conn *c)
{
	memset(c, 0, sizeof(*c));
	c->fd = -1;
	c->next_id = 1;
	c->max_frame = FRAME_MAX_DEFAULT;
}

int conn_connect(struct conn *c, const char *path)
{
	int fd = frame_dial(path);
	if (fd < 0)
		return fd;
	c->fd = fd;
	return 0;
}

static char *dup_or_null(const char *s)
{
	return s ? strdup(s) : NULL;
}

int conn_hello(struct conn *c, Llamad__Response **out)
{
	Llamad__Hello h = LLAMAD__HELLO__INIT;
	h.has_protocol_version = 1;
	h.protocol_version = LLAMAD_PROTOCOL_VERSION;
	h.client = (char *)LLAMACTL_CLIENT;
	Llamad__Request req = LLAMAD__REQUEST__INIT;
	req.op_case = LLAMAD__REQUEST__OP_HELLO;
	req.hello = &h;
	int rc = conn_call(c, &req, out);
	if (rc)
		return rc;
	const Llamad__Response *r = *out;
	if (r->body_case == LLAMAD__RESPONSE__BODY_HELLO && r->hello) {
		const Llamad__HelloReply *hr = r->hello;
		if (hr->has_max_frame && hr->max_frame > 0)
			c->max_frame = hr->max_frame;
		if (hr->has_context_length)
			c->context_length = hr->context_length;
		if (hr->has_max_text)
			c->max_text = hr->max_text;
		c->idle_timeout = hr->has_idle_timeout ? hr->idle_timeout : 0;
		free(c->server);
		free(c->model);
		c->server = dup_or_null(hr->server);
		c->model = dup_or_null(hr->model);
	}
	return 0;
}

void conn_close(struct conn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	free(c->server);
	free(c->model);
	c->server = NULL;
	c->model = NULL;
}

int conn_send(struct conn *c, Llamad__Request *req, uint64_t *id)
{
	if (c->fd < 0)
		return -ENOTCONN;
	req->has_id = 1;
	req->id = c->next_id++;
	size_t n = protobuf_c_message_get_packed_size(&req->base);
	if (n > c->max_frame) {
		c->refused_bytes = n;
		return -EMSGSIZE;
	}
	int rc = frame_send(c->fd, &req->base);
	if (rc)
		return rc;
	if (id)
		*id = req->id;
	return 0;
}

static int send_cancel(struct conn *c, uint64_t target)
{
	Llamad__Cancel cn = LLAMAD__CANCEL__INIT;
	cn.has_request_id = 1;
	cn.request_id = target;
	Llamad__Request req = LLAMAD__REQUEST__INIT;
	req.op_case = LLAMAD__REQUEST__OP_CANCEL;
	req.cancel = &cn;
	return conn_send(c, &req, NULL);
}

/* Sleep until the socket is readable or a signal arrives. 0 when readable,
 * -EINTR on a signal, or another negative errno. */
static int wait_readable(struct conn *c)
{
	struct pollfd p = { .fd = c->fd, .events = POLLIN };
	int k = ppoll(&p, 1, NULL, c->wait_mask);
	if (k < 0)
		return -errno;
	return 0;   /* readable, or hung up: the read reports which */
}

int conn_wait(struct conn *c, uint64_t id, conn_event_fn fn, void *ctx,
	      Llamad__Response **out, bool *cancelled)
{
	bool sent_cancel = false;
	if (cancelled)
		*cancelled = false;
	if (c->fd < 0)
		return -ENOTCONN;
	for (;;) {
		if (c->intr && *c->intr) {
			*c->intr = 0;
			if (sent_cancel)
				return -EINTR;
			int rc = send_cancel(c, id);
			if (rc)
				return rc;
			sent_cancel = true;
			if (cancelled)
				*cancelled = true;
		}
		if (c->intr) {
			int rc = wait_readable(c);
			if (rc == -EINTR)
				continue;
			if (rc)
				return rc;
		}
		Llamad__Response *r = NULL;
		int err = conn_next(c, &r);
		if (err)
			return err;
		bool mine = r->has_id && r->id == id;
		bool unattributed = (!r->has_id || r->id == 0) &&
			r->body_case == LLAMAD__RESPONSE__BODY_ERROR;
		if (!mine && !unattributed) {
			llamad__response__free_unpacked(r, NULL);
			continue;
		}
		if (r->body_case == LLAMAD__RESPONSE__BODY_TOKEN) {
			int rc = fn ? fn(ctx, r) : 0;
			llamad__response__free_unpacked(r, NULL);
			if (rc)
				return rc;
			continue;
		}
		*out = r;
		return 0;
	}
}

int conn_next(struct conn *c, Llamad__Response **out)
{
	if (c->fd < 0)
		return -ENOTCONN;
	int err = 0;
	Llamad__Response *r = frame_recv_response(c->fd, FRAME_MAX_DEFAULT, &err);
	if (!r)
		return err;
	c->last_reply = clock_mono_s();
	*out = r;
	return 0;
}

int conn_call(struct conn *c, Llamad__Request *req, Llamad__Response **out)
{
	uint64_t id;
	int rc = conn_send(c, req, &id);
	if (rc)
		return rc;
	return conn_wait(c, id, NULL, NULL, out, NULL);
}

const char *conn_strerror(int err)
{
	switch (err) {
	case -ECONNRESET:
		return "the daemon closed the connection";
	case -EPROTO:
		return "the daemon closed the connection mid-message";
	case -EBADMSG:
		return "the daemon sent a message that does not decode";
	case -EMSGSIZE:
		return "message too large";
	default:
		return strerror(-err);
	}
}

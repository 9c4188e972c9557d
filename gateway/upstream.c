/*
 * gateway/upstream.c — see upstream.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>

#include "gateway/upstream.h"

struct up {
	struct bufferevent *bev;
	uint64_t next_id;
	uint64_t cur;              /* id of the call in flight, 0: none */
	up_fn fn;
	void *arg;
	uint32_t max_frame;
	bool *alive;               /* set false by up_close while a callback runs */
};

/* The call ends: later replies with its id are not delivered. */
static void deliver(struct up *u, const Llamad__Response *r, int err, bool *gone)
{
	up_fn fn = u->fn;
	void *arg = u->arg;
	bool terminal = !r || r->body_case != LLAMAD__RESPONSE__BODY_TOKEN;
	if (terminal) {
		u->cur = 0;
		u->fn = NULL;
	}
	if (!fn)
		return;
	bool alive = true;
	u->alive = &alive;
	fn(arg, r, err);
	if (!alive) {
		*gone = true;
		return;
	}
	u->alive = NULL;
}

static void fail(struct up *u, int err)
{
	bool gone = false;
	if (u->cur)
		deliver(u, NULL, err, &gone);
}

static void on_read(struct bufferevent *bev, void *ctx)
{
	struct up *u = ctx;
	struct evbuffer *in = bufferevent_get_input(bev);
	for (;;) {
		size_t have = evbuffer_get_length(in);
		if (have < FRAME_HDR)
			return;
		uint8_t hdr[FRAME_HDR];
		evbuffer_copyout(in, hdr, FRAME_HDR);
		uint32_t len = frame_get_len(hdr);
		if (len > (64u << 20)) {
			fail(u, -EBADMSG);
			return;
		}
		if (have < FRAME_HDR + (size_t)len)
			return;
		const uint8_t *p = evbuffer_pullup(in, FRAME_HDR + (ssize_t)len);
		Llamad__Response *r = llamad__response__unpack(NULL, len, p + FRAME_HDR);
		evbuffer_drain(in, FRAME_HDR + (size_t)len);
		if (!r) {
			fail(u, -EBADMSG);
			return;
		}
		bool gone = false;
		/* replies to another id (a Cancel's, say) are dropped; an Error
		 * with id 0 is the daemon's answer to a frame it could not
		 * attribute: it ends the call in flight */
		if (u->cur && (r->id == u->cur ||
			       (r->id == 0 && r->body_case == LLAMAD__RESPONSE__BODY_ERROR)))
			deliver(u, r, 0, &gone);
		llamad__response__free_unpacked(r, NULL);
		if (gone)
			return;
	}
}

static void on_event(struct bufferevent *bev, short what, void *ctx)
{
	(void)bev;
	struct up *u = ctx;
	if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
		int e = (what & BEV_EVENT_ERROR) && errno ? -errno : -ECONNRESET;
		fail(u, e);
	}
}

struct up *up_open(struct event_base *base, const char *path, int *err)
{
	int fd = frame_dial(path);
	if (fd < 0) {
		*err = fd;
		return NULL;
	}
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
		*err = -errno;
		close(fd);
		return NULL;
	}
	struct up *u = calloc(1, sizeof(*u));
	if (!u) {
		close(fd);
		*err = -ENOMEM;
		return NULL;
	}
	u->bev = bufferevent_socket_new(base, fd, BEV_OPT_CLOSE_ON_FREE);
	if (!u->bev) {
		close(fd);
		free(u);
		*err = -ENOMEM;
		return NULL;
	}
	u->next_id = 1;
	u->max_frame = FRAME_MAX_DEFAULT;
	bufferevent_setcb(u->bev, on_read, NULL, on_event, u);
	bufferevent_enable(u->bev, EV_READ | EV_WRITE);
	return u;
}

void up_set_max_frame(struct up *u, uint32_t max_frame)
{
	if (max_frame)
		u->max_frame = max_frame;
}

static int send_req(struct up *u, Llamad__Request *req)
{
	req->has_id = 1;
	req->id = u->next_id++;
	size_t n = llamad__request__get_packed_size(req);
	if (n > u->max_frame)
		return -EMSGSIZE;
	uint8_t *buf;
	size_t len;
	int rc = frame_pack(&req->base, &buf, &len);
	if (rc)
		return rc;
	rc = bufferevent_write(u->bev, buf, len) == 0 ? 0 : -ENOMEM;
	free(buf);
	return rc;
}

int up_send_only(struct up *u, Llamad__Request *req)
{
	return send_req(u, req);
}

int up_call(struct up *u, Llamad__Request *req, up_fn fn, void *arg)
{
	if (u->cur)
		return -EBUSY;
	int rc = send_req(u, req);
	if (rc)
		return rc;
	u->cur = req->id;
	u->fn = fn;
	u->arg = arg;
	return 0;
}

uint64_t up_current(const struct up *u)
{
	return u->cur;
}

void up_close(struct up *u)
{
	if (!u)
		return;
	if (u->alive)
		*u->alive = false;
	bufferevent_free(u->bev);
	free(u);
}

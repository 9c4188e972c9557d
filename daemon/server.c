/*
 * daemon/server.c — the event thread: the Unix socket, connections, framing,
 * request validation, and delivery of the engine's replies. Never blocks on
 * compute or disk. The only file that uses libevent and libsystemd.
 *
 * Frames are read from each connection's input buffer as they complete. A
 * frame whose length exceeds max_frame gets a TOO_LARGE error and the
 * connection is closed (the stream can no longer be trusted); a frame that
 * does not decode, or a request that fails validation, gets an error reply
 * and the connection stays open. Valid requests go to the engine.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <systemd/sd-daemon.h>

#include "daemon/log.h"
#include "daemon/server.h"
#include "daemon/validate.h"
#include "daemon/version.h"
#include "proto/frame.h"
#include "proto/path.h"
#include "util/cause.h"

#define OUT_LIMIT REPLY_MAX     /* bytes queued to a client that does not read */
/* Flow control: a connection's requests are read while fewer than this
 * many, and fewer than max_frame bytes of them, wait for their last reply. */
#define MAX_INFLIGHT 256
/* Request memory: once its header is in, a frame claims its whole length
 * from a budget for all connections and one for each uid, and keeps it
 * until its request's last reply (the request, unpacked, is about as large
 * as its frame); a frame that does not fit waits, unread, until others
 * are answered (a frame, once admitted, is never stopped halfway, so two
 * large frames of one uid cannot wait for each other). Frames of up to
 * SMALL_FRAME bytes wait only for their own uid's share, never for the
 * others' total, so that no user's large frames can hold back everyone's
 * small requests. A large frame is read into a buffer of its own, whole
 * and contiguous when it is complete (evbuffer_pullup would copy it once
 * more). A frame must be complete within frame_timeout seconds of its
 * first byte, plus one second per FRAME_MIN_RATE bytes of its length. */
#define HELD_ALL(max_frame) (4 * (size_t)(max_frame))
#define HELD_UID(max_frame) ((size_t)(max_frame) + (1u << 20))
#define SMALL_FRAME (64u << 10)
#define FRAME_MIN_RATE (256u << 10)

/* A request of a connection that has not had its last reply yet. */
struct inflight {
	struct inflight *next;
	uint64_t id;
	uint32_t bytes;          /* its frame */
	uid_t uid;               /* whose budget they count in */
};

struct conn {
	uint64_t id;
	struct bufferevent *bev;
	uid_t uid;               /* the uid it acts as: its requests', its budget's */
	uid_t peer;              /* the peer's own (SO_PEERCRED): differs from uid
				  * once a gateway's Hello names another */
	int own_only;            /* its Hello named on_behalf_of_uid (any, its own
				  * too): it sees uid's sessions only, root's too */
	pid_t pid;
	uint64_t frames;         /* frames read */
	int closing;             /* close once the output is flushed */
	int read_eof;            /* the client shut down its side: close once
				  * every request read has had its last reply */
	int paused;              /* reading stopped by flow control */
	struct inflight *fl_head, *fl_tail;  /* requests at the engine, in order */
	uint32_t n_inflight;
	uint64_t inflight_bytes;
	size_t held;             /* bytes claimed by an unfinished frame: all of it
				  * once admitted, else what is buffered */
	int admitted;            /* the unfinished frame's whole length is granted */
	int starved;             /* not read: the request-memory budget is spent */
	uint8_t *fbuf;           /* a large admitted frame's body, read so far: */
	uint32_t flen, fgot;     /* its length, the bytes of it in fbuf */
	struct event *ev_frame;  /* the unfinished frame's deadline (pending: set) */
	struct event *ev_idle;   /* idle_timeout, while no request is in flight */
	struct server *srv;
};

/* What one uid holds: bytes of unfinished frames and of requests waiting
 * for their last reply (by the uid connections act as), connections (by
 * their peer's uid). */
struct uid_acct {
	uid_t uid;
	size_t bytes;
	size_t inflight;
	uint32_t conns;
};

struct server {
	struct event_base *base;
	struct evconnlistener *listener;
	struct event *ev_notify, *ev_term, *ev_int, *ev_hup, *ev_watchdog, *ev_exit;
	struct event *ev_relisten;  /* re-enables the listener after EMFILE */
	time_t emfile_logged;
	int notify_fd;
	struct engine *eng;
	struct config *cfg;
	const char *config_path;
	char *socket_path;       /* ours to unlink at exit (NULL if activated) */
	/* connections by id: open addressing, linear probing */
	struct conn **slots;
	size_t n_slots, n_conns;
	uint64_t next_id, accepted;
	int stopping;
	uint64_t watchdog_usec;
	size_t held;             /* unfinished frames' bytes, all connections */
	size_t inflight;         /* requests' bytes waiting for their last reply */
	size_t n_starved;        /* connections waiting for the budget */
	struct uid_acct *uh;     /* ... by uid (a few entries: linear search) */
	size_t n_uh, cap_uh;
	time_t refused_said;     /* the last logged refusal of a connection */
	uint64_t refused;        /* refused since then, not logged */
};

/* ---- connection map ------------------------------------------------------ */

static size_t slot_of(const struct server *s, uint64_t id)
{
	return (size_t)(id * 0x9e3779b97f4a7c15ull >> 17) & (s->n_slots - 1);
}

static int map_put(struct server *s, struct conn *c)
{
	if ((s->n_conns + 1) * 2 > s->n_slots) {
		size_t n = s->n_slots ? s->n_slots * 2 : 64;
		struct conn **ns = calloc(n, sizeof(*ns));
		if (!ns)
			return -ENOMEM;
		struct conn **old = s->slots;
		size_t on = s->n_slots;
		s->slots = ns;
		s->n_slots = n;
		for (size_t i = 0; i < on; i++)
			if (old[i]) {
				size_t k = slot_of(s, old[i]->id);
				while (s->slots[k])
					k = (k + 1) & (n - 1);
				s->slots[k] = old[i];
			}
		free(old);
	}
	size_t k = slot_of(s, c->id);
	while (s->slots[k])
		k = (k + 1) & (s->n_slots - 1);
	s->slots[k] = c;
	s->n_conns++;
	return 0;
}

static struct conn *map_get(const struct server *s, uint64_t id)
{
	if (!s->n_slots)
		return NULL;
	for (size_t k = slot_of(s, id);; k = (k + 1) & (s->n_slots - 1)) {
		if (!s->slots[k])
			return NULL;
		if (s->slots[k]->id == id)
			return s->slots[k];
	}
}

static void map_del(struct server *s, uint64_t id)
{
	size_t mask = s->n_slots - 1, k = slot_of(s, id);
	while (s->slots[k] && s->slots[k]->id != id)
		k = (k + 1) & mask;
	if (!s->slots[k])
		return;
	s->slots[k] = NULL;
	s->n_conns--;
	/* re-insert the rest of the cluster */
	for (size_t j = (k + 1) & mask; s->slots[j]; j = (j + 1) & mask) {
		struct conn *c = s->slots[j];
		s->slots[j] = NULL;
		size_t h = slot_of(s, c->id);
		while (s->slots[h])
			h = (h + 1) & mask;
		s->slots[h] = c;
	}
}

static void publish_counts(struct server *s)
{
	engine_set_connections(s->eng, (int)s->n_conns, s->accepted);
}

/* ---- connections -------------------------------------------------------- */

static void hold(struct conn *c, size_t now);
static void wake_starved(struct server *s);
static struct uid_acct *uid_acct(struct server *s, uid_t uid);

static void conn_close(struct conn *c)
{
	struct server *s = c->srv;
	size_t released = 0;
	for (struct inflight *f = c->fl_head, *n; f; f = n) {
		n = f->next;
		struct uid_acct *fa = uid_acct(s, f->uid);
		if (fa)
			fa->inflight -= f->bytes;
		s->inflight -= f->bytes;
		released += f->bytes;
		free(f);
	}
	free(c->fbuf);
	if (c->starved)
		s->n_starved--;
	map_del(s, c->id);
	struct uid_acct *a = uid_acct(s, c->peer);
	if (a && a->conns > 0)
		a->conns--;
	engine_disconnect(s->eng, c->id);
	size_t held = c->held;
	hold(c, 0);
	if (c->ev_frame)
		event_free(c->ev_frame);
	if (c->ev_idle)
		event_free(c->ev_idle);
	bufferevent_free(c->bev);
	log_msg(LL_DEBUG, "connection %llu closed", (unsigned long long)c->id);
	free(c);
	publish_counts(s);
	if (held || released)
		wake_starved(s);
}

/* Refuse request id of c for -errno err before it reaches the engine
 * (counted with the engine's errors: daemon/reply.c). */
static void conn_error(struct conn *c, uint64_t id, int err, const char *msg)
{
	struct reply *r = reply_error(c->id, id, reply_code(err), msg);
	if (!r) {
		log_msg(LL_ERROR, "out of memory for a reply to connection %llu",
			(unsigned long long)c->id);
		return;
	}
	bufferevent_write(c->bev, r->data, r->len);
	free(r);
}

/* Close c once what is queued for it has been written. */
static void conn_close_after_flush(struct conn *c)
{
	c->closing = 1;
	bufferevent_disable(c->bev, EV_READ);
	if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
		conn_close(c);
}

/* idle_timeout runs while no request of c is in flight: from its accept,
 * and from its last reply; a request read stops it (bytes of a frame that
 * is not complete do not: a client trickling a byte a second is idle). */
static void idle_arm(struct conn *c)
{
	int t = c->srv->cfg->idle_timeout;
	if (t > 0 && c->n_inflight == 0) {
		struct timeval tv = { t, 0 };
		evtimer_add(c->ev_idle, &tv);
	} else {
		evtimer_del(c->ev_idle);
	}
}

static void on_idle(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	struct conn *c = arg;
	if (c->n_inflight > 0 || c->closing)
		return;
	log_msg(LL_DEBUG, "connection %llu idle for %d s; closing", (unsigned long long)c->id,
		c->srv->cfg->idle_timeout);
	conn_close(c);
}

/* What uid holds (an entry made when missing; NULL out of memory). */
static struct uid_acct *uid_acct(struct server *s, uid_t uid)
{
	for (size_t i = 0; i < s->n_uh; i++)
		if (s->uh[i].uid == uid)
			return &s->uh[i];
	if (s->n_uh == s->cap_uh) {
		size_t cap = s->cap_uh ? 2 * s->cap_uh : 8;
		struct uid_acct *n = realloc(s->uh, cap * sizeof(*n));
		if (!n)
			return NULL;
		s->uh = n;
		s->cap_uh = cap;
	}
	s->uh[s->n_uh] = (struct uid_acct){ uid, 0, 0, 0 };
	return &s->uh[s->n_uh++];
}

/* The bytes of unfinished frames buffered for uid (NULL out of memory). */
static size_t *uid_held(struct server *s, uid_t uid)
{
	struct uid_acct *a = uid_acct(s, uid);
	return a ? &a->bytes : NULL;
}

/* c now holds `now` bytes of an unfinished frame: the totals follow. */
static void hold(struct conn *c, size_t now)
{
	struct server *s = c->srv;
	size_t *u = uid_held(s, c->uid);
	s->held = s->held - c->held + now;
	if (u)
		*u = *u >= c->held ? *u - c->held + now : now;
	c->held = now;
}

/* c may not read more: its claim, with the bytes of all connections'
 * or its uid's unfinished frames and waiting requests, passes the budget
 * (a claim of SMALL_FRAME or less: its uid's only). */
static int over_budget(struct conn *c)
{
	struct server *s = c->srv;
	struct uid_acct *u = uid_acct(s, c->uid);
	if (u && u->bytes + u->inflight > HELD_UID(s->cfg->max_frame))
		return 1;
	return c->held > SMALL_FRAME && s->held + s->inflight > HELD_ALL(s->cfg->max_frame);
}

static void starve(struct conn *c, int on)
{
	if (c->starved == on)
		return;
	c->starved = on;
	if (on)
		c->srv->n_starved++;
	else
		c->srv->n_starved--;
}

static void on_read(struct bufferevent *bev, void *arg);

/* Budgeted bytes went away: read the connections that waited for them
 * again, while the budget lasts. */
static void wake_starved(struct server *s)
{
	for (size_t i = 0; s->n_starved > 0 && i < s->n_slots; i++) {
		struct conn *c = s->slots[i];
		if (!c || !c->starved || c->closing || over_budget(c))
			continue;
		starve(c, 0);
		if (!c->paused)
			bufferevent_enable(c->bev, EV_READ);
	}
}

static void on_frame_late(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	struct conn *c = arg;
	char msg[128];
	snprintf(msg, sizeof(msg), "a frame was not completed in time (%zu bytes of it came); "
		 "closing", c->held);
	log_msg(LL_INFO, "connection %llu (uid %u): %s", (unsigned long long)c->id,
		(unsigned)c->uid, msg);
	conn_error(c, 0, -EINVAL, msg);
	conn_close_after_flush(c);
}

/* Move what came of c's large frame into its buffer: 1 when it is whole. */
static int fill_frame(struct conn *c, struct evbuffer *in)
{
	size_t have = evbuffer_get_length(in), want = c->flen - c->fgot;
	size_t n = have < want ? have : want;
	if (n > 0 && evbuffer_remove(in, c->fbuf + c->fgot, n) == (int)n)
		c->fgot += (uint32_t)n;
	return c->fgot == c->flen;
}

/* After a read: the unfinished frame buffered claims its whole length
 * (once its header is in) if the budgets allow, else c stops being read,
 * holding only what came, until others complete theirs; an admitted frame
 * is read to its end. The frame's deadline runs from its first byte, and
 * waits while c does (the wait is not c's). */
static void settle(struct conn *c)
{
	struct server *s = c->srv;
	struct evbuffer *in = bufferevent_get_input(c->bev);
	size_t was = c->held, now = c->closing ? 0 : evbuffer_get_length(in), claim = now;
	uint32_t len = s->cfg->max_frame;
	if (c->fbuf && !c->closing) {
		now += FRAME_HDR + c->fgot;
		len = c->flen;
		claim = FRAME_HDR + (size_t)len;
	} else if (now >= FRAME_HDR) {
		uint8_t hdr[FRAME_HDR];
		evbuffer_copyout(in, hdr, FRAME_HDR);
		len = frame_get_len(hdr);
		if (FRAME_HDR + (size_t)len > claim)
			claim = FRAME_HDR + (size_t)len;
	}
	if (now == 0) {
		c->admitted = 0;
		hold(c, 0);
	} else {
		hold(c, claim);
		if (!c->admitted && over_budget(c)) {
			hold(c, now);
			if (!c->starved)
				log_msg(LL_DEBUG, "connection %llu (uid %u): a frame of %u bytes waits for "
					"others to be answered (%zu bytes claimed in all)",
					(unsigned long long)c->id, (unsigned)c->uid, len,
					s->held + s->inflight);
			starve(c, 1);
			bufferevent_disable(c->bev, EV_READ);
		} else {
			c->admitted = now >= FRAME_HDR;
			if (c->admitted && !c->fbuf && len > SMALL_FRAME && now < claim &&
			    (c->fbuf = malloc(len))) {
				/* from now on its bytes go straight into a buffer of its own */
				evbuffer_drain(in, FRAME_HDR);
				c->flen = len;
				c->fgot = 0;
				fill_frame(c, in);
			}
		}
	}
	if (now == 0 || c->starved) {
		evtimer_del(c->ev_frame);
	} else if (!evtimer_pending(c->ev_frame, NULL)) {
		struct timeval tv = { s->cfg->frame_timeout + (time_t)(len / FRAME_MIN_RATE), 0 };
		evtimer_add(c->ev_frame, &tv);
	}
	if (c->held < was)
		wake_starved(s);
}

/* Request id of bytes went to the engine: 0, or -ENOMEM. Its bytes count
 * in the budgets until its last reply. */
static int track(struct conn *c, uint64_t id, uint32_t bytes)
{
	struct inflight *f = malloc(sizeof(*f));
	struct uid_acct *a = uid_acct(c->srv, c->uid);
	if (!f || !a) {
		free(f);
		return -ENOMEM;
	}
	*f = (struct inflight){ NULL, id, bytes, c->uid };
	a->inflight += bytes;
	c->srv->inflight += bytes;
	if (c->fl_tail)
		c->fl_tail->next = f;
	else
		c->fl_head = f;
	c->fl_tail = f;
	c->n_inflight++;
	c->inflight_bytes += bytes;
	evtimer_del(c->ev_idle);   /* a request in flight: not idle */
	return 0;
}

/* The last reply to request id of c went out: forget the oldest request
 * of that id. */
static void untrack(struct conn *c, uint64_t id)
{
	struct inflight *prev = NULL;
	for (struct inflight *f = c->fl_head; f; prev = f, f = f->next) {
		if (f->id != id)
			continue;
		if (prev)
			prev->next = f->next;
		else
			c->fl_head = f->next;
		if (c->fl_tail == f)
			c->fl_tail = prev;
		c->n_inflight--;
		c->inflight_bytes -= f->bytes;
		struct uid_acct *a = uid_acct(c->srv, f->uid);
		if (a)
			a->inflight -= f->bytes;
		c->srv->inflight -= f->bytes;
		free(f);
		if (c->n_inflight == 0)
			idle_arm(c);
		wake_starved(c->srv);
		return;
	}
}

/* Is c's allowance of requests waiting for the engine used up? */
static int flow_full(const struct conn *c)
{
	return c->n_inflight >= MAX_INFLIGHT || c->inflight_bytes >= c->srv->cfg->max_frame;
}

/* A half-closed connection whose requests have all been answered closes
 * (once its output is written). */
static void maybe_finish(struct conn *c)
{
	if (c->read_eof && c->n_inflight == 0 && !c->closing)
		conn_close_after_flush(c);
}

/* Control characters of text out, for the log: s into buf (n > 0 bytes). */
static const char *loggable(const char *s, char *buf, size_t n)
{
	size_t k = 0;
	for (; s && *s && k + 1 < n; s++, k++)
		buf[k] = (unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s;
	buf[k] = 0;
	return buf;
}

/*
 * A Hello that names on_behalf_of_uid (first: it is the connection's first
 * request): 0, c now acting for that uid (or as it was, when the Hello asks
 * a protocol version the engine will refuse, or names c's own uid), or
 * -errno with why for the error reply, c keeping its uid. Root, the
 * daemon's own user and the users in trusted_gateways (the list of now:
 * SIGHUP changes it) may act for others; only root for root. The daemon's
 * own user gains nothing by it: it reads every state file already (so
 * llamad-http.service runs as that user with nothing to configure). The unfinished-frame bytes c holds move
 * to the new uid's account.
 *
 * Any such Hello, one naming the peer's own uid included, makes c see the
 * sessions of the uid it acts as only (own_only): root's view of every
 * user's sessions (their names, ListSessions, Save all) is root's own,
 * never a gateway's caller's, even when the caller is root. A gateway
 * therefore names its caller in every Hello, itself included.
 */
static int act_for(struct conn *c, const Llamad__Hello *h, int first, char *why, size_t n)
{
	struct server *s = c->srv;
	uid_t u = (uid_t)h->on_behalf_of_uid;
	if (!first) {
		snprintf(why, n, "on_behalf_of_uid is only accepted in the first request");
		return -EINVAL;
	}
	if ((h->has_protocol_version && h->protocol_version != LLAMAD_PROTOCOL_VERSION))
		return 0;
	if (u == c->peer) {
		c->own_only = 1;
		return 0;
	}
	if (c->peer != 0 && c->peer != geteuid() &&
	    !config_uid_listed(&s->cfg->trusted_gateways, (uint32_t)c->peer)) {
		snprintf(why, n, "uid %u is not a trusted gateway (trusted_gateways in llamad.conf)",
			 (unsigned)c->peer);
		return -EACCES;
	}
	if (u == 0 && c->peer != 0) {
		snprintf(why, n, "uid %u may not act for root (only root may)", (unsigned)c->peer);
		return -EACCES;
	}
	char caller[272];
	loggable(h->caller, caller, sizeof(caller));
	log_msg(LL_INFO, "connection %llu (uid %u): acting for uid %u%s%s%s",
		(unsigned long long)c->id, (unsigned)c->peer, (unsigned)u, *caller ? " (" : "",
		caller, *caller ? ")" : "");
	size_t held = c->held;
	hold(c, 0);
	c->uid = u;
	c->own_only = 1;
	hold(c, held);
	return 0;
}

static void read_frames(struct bufferevent *bev, struct conn *c)
{
	struct server *s = c->srv;
	struct evbuffer *in = bufferevent_get_input(bev);
	for (;;) {
		if (c->closing)
			return;
		if (flow_full(c)) {   /* read again when replies have gone out */
			c->paused = 1;
			bufferevent_disable(bev, EV_READ);
			return;
		}
		uint8_t *body, *own = NULL;
		uint32_t len;
		if (c->fbuf) {
			if (!fill_frame(c, in)) {
				if (c->read_eof) {   /* the client will send no more of it */
					conn_error(c, 0, -EINVAL, "connection shut down mid-frame");
					free(c->fbuf);
					c->fbuf = NULL;
					maybe_finish(c);
				}
				return;
			}
			body = own = c->fbuf;
			len = c->flen;
			c->fbuf = NULL;
			goto whole;
		}
		size_t avail = evbuffer_get_length(in);
		if (avail < FRAME_HDR) {
			maybe_finish(c);
			return;
		}
		uint8_t hdr[FRAME_HDR];
		evbuffer_copyout(in, hdr, FRAME_HDR);
		len = frame_get_len(hdr);
		if (len > s->cfg->max_frame) {
			char msg[96];
			snprintf(msg, sizeof(msg), "frame of %u bytes exceeds the limit of %u", len,
				 s->cfg->max_frame);
			log_msg(LL_INFO, "connection %llu (uid %u): %s; closing",
				(unsigned long long)c->id, (unsigned)c->uid, msg);
			conn_error(c, 0, -E2BIG, msg);
			conn_close_after_flush(c);
			return;
		}
		if (avail < FRAME_HDR + (size_t)len) {
			if (c->read_eof) {   /* the client will send no more of it */
				conn_error(c, 0, -EINVAL, "connection shut down mid-frame");
				evbuffer_drain(in, avail);
				maybe_finish(c);
			}
			return;
		}
		evbuffer_drain(in, FRAME_HDR);
		body = evbuffer_pullup(in, len);
whole:
		c->admitted = 0;   /* the next frame is judged on its own */
		int first = c->frames++ == 0;
		const char *why = NULL;
		/* before protobuf-c's work */
		uint64_t sid;
		int rc = request_scan(body, len, s->cfg->max_text, &sid, &why);
		Llamad__Request *q = rc != -E2BIG ? llamad__request__unpack(NULL, len, body) : NULL;
		if (own)
			free(own);
		else
			evbuffer_drain(in, len);
		if (rc == -E2BIG) {
			conn_error(c, sid, rc, why);
			continue;
		}
		if (!q) {
			conn_error(c, 0, -EINVAL,
				   "malformed message (not a Request)");
			continue;
		}
		if (!rc)
			rc = request_validate(q, s->cfg->max_text, &why);
		if (rc) {
			conn_error(c, q->id, rc, why);
			llamad__request__free_unpacked(q, NULL);
			continue;
		}
		char refused[160];
		if (q->op_case == LLAMAD__REQUEST__OP_HELLO && q->hello->has_on_behalf_of_uid &&
		    (rc = act_for(c, q->hello, first, refused, sizeof(refused)))) {
			log_msg(LL_INFO, "connection %llu (uid %u): %s", (unsigned long long)c->id,
				(unsigned)c->peer, refused);
			conn_error(c, q->id, rc, refused);
			llamad__request__free_unpacked(q, NULL);
			continue;
		}
		if (s->stopping) {
			conn_error(c, q->id, -ESHUTDOWN, "the daemon is stopping");
			llamad__request__free_unpacked(q, NULL);
			continue;
		}
		if (track(c, q->id, FRAME_HDR + len) != 0) {
			conn_error(c, q->id, -ENOMEM, "out of memory");
			llamad__request__free_unpacked(q, NULL);
			continue;
		}
		engine_submit(s->eng, c->id, c->uid, c->own_only, q);
	}
}

static void on_read(struct bufferevent *bev, void *arg)
{
	struct conn *c = arg;
	struct server *s = c->srv;
	uint64_t id = c->id;
	read_frames(bev, c);
	if (map_get(s, id) == c)   /* not closed on the way */
		settle(c);
}

static void on_write(struct bufferevent *bev, void *arg)
{
	struct conn *c = arg;
	if (c->closing && evbuffer_get_length(bufferevent_get_output(bev)) == 0)
		conn_close(c);
}

/* 1 if c's client closed the connection altogether, not only its sending
 * side (shutdown(SHUT_WR)): a Unix stream socket then polls as hung up. */
static int peer_gone(const struct conn *c)
{
	struct pollfd p = { .fd = bufferevent_getfd(c->bev), .events = 0 };
	return poll(&p, 1, 0) < 0 || (p.revents & (POLLHUP | POLLERR));
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
	(void)bev;
	struct conn *c = arg;
	if ((what & BEV_EVENT_EOF) && !(what & (BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT)) &&
	    !c->closing && !peer_gone(c)) {
		/* the client shut down its sending side (or closed): answer
		 * what it sent, then close */
		c->read_eof = 1;
		on_read(c->bev, c);
		return;
	}
	if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT))
		conn_close(c);
}

/* Peers whose connections count against no user's share and may take the
 * connections kept in reserve: root, the daemon's own user and the users
 * in trusted_gateways (the gateways, which connect for their callers). */
static int privileged(const struct server *s, uid_t peer)
{
	return peer == 0 || peer == geteuid() ||
	       config_uid_listed(&s->cfg->trusted_gateways, (uint32_t)peer);
}

/*
 * May a connection from peer (holding a's connections) be taken? The
 * last max_connections / 16 connections are kept for the privileged
 * peers, so that no user's connections can lock root, the daemon's own
 * user or a gateway out; a user other than those holds at most
 * max_connections_per_uid. 1, or 0 with why.
 */
static int admit(const struct server *s, uid_t peer, const struct uid_acct *a, char *why,
		 size_t n)
{
	const struct config *cfg = s->cfg;
	size_t max = (size_t)cfg->max_connections;
	int priv = privileged(s, peer);
	size_t reserve = max / 16;
	if (s->stopping) {
		snprintf(why, n, "the daemon is stopping");
		return 0;
	}
	if (s->n_conns >= max) {
		snprintf(why, n, "the daemon holds max_connections (%zu) connections", max);
		return 0;
	}
	if (!priv && s->n_conns >= max - reserve) {
		snprintf(why, n, "the daemon holds %zu connections; the last %zu of max_connections "
			 "(%zu) are kept for root and trusted gateways", s->n_conns, reserve, max);
		return 0;
	}
	if (!priv && cfg->max_connections_per_uid > 0 &&
	    a->conns >= (uint32_t)cfg->max_connections_per_uid) {
		snprintf(why, n, "uid %u holds %u connections, its share (max_connections_per_uid); "
			 "close some", (unsigned)peer, a->conns);
		return 0;
	}
	return 1;
}

/* Refuse a connection just accepted: an Error frame saying why
 * (RESOURCE_EXHAUSTED; SHUTTING_DOWN when stopping), then closed. Logged
 * at most every 10 s, with the number refused meanwhile. */
static void refuse_connection(struct server *s, int fd, uid_t peer, const char *why)
{
	struct reply *r = reply_error(0, 0, reply_code(s->stopping ? -ESHUTDOWN : -EUSERS), why);
	if (r) {
		/* the first bytes on a new connection: the socket takes them */
		if (send(fd, r->data, r->len, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
			log_msg(LL_DEBUG, "refusing a connection: %s", strerror(errno));
		free(r);
	}
	close(fd);
	time_t now = time(NULL);
	if (now - s->refused_said >= 10) {
		log_msg(LL_WARN, "refusing a connection from uid %u: %s", (unsigned)peer, why);
		if (s->refused)
			log_msg(LL_WARN, "(%llu more connections refused in the last %lld s)",
				(unsigned long long)s->refused, (long long)(now - s->refused_said));
		s->refused_said = now;
		s->refused = 0;
	} else {
		s->refused++;
	}
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
		      int socklen, void *arg)
{
	(void)l;
	(void)sa;
	(void)socklen;
	struct server *s = arg;
	struct ucred cred;
	socklen_t cl = sizeof(cred);
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0) {
		log_msg(LL_WARN, "cannot read peer credentials: %s", strerror(errno));
		close(fd);
		return;
	}
	char why[200];
	struct uid_acct *a = uid_acct(s, cred.uid);
	if (!a || !admit(s, cred.uid, a, why, sizeof(why))) {
		refuse_connection(s, fd, cred.uid, a ? why : "out of memory");
		return;
	}
	struct conn *c = calloc(1, sizeof(*c));
	evutil_make_socket_closeonexec(fd);
	struct bufferevent *bev = bufferevent_socket_new(s->base, fd, BEV_OPT_CLOSE_ON_FREE);
	if (!c || !bev) {
		free(c);
		if (bev)
			bufferevent_free(bev);
		else
			close(fd);
		return;
	}
	c->ev_frame = evtimer_new(s->base, on_frame_late, c);
	c->ev_idle = evtimer_new(s->base, on_idle, c);
	if (!c->ev_frame || !c->ev_idle) {
		if (c->ev_frame)
			event_free(c->ev_frame);
		if (c->ev_idle)
			event_free(c->ev_idle);
		bufferevent_free(bev);
		free(c);
		return;
	}
	c->id = ++s->next_id;
	c->bev = bev;
	c->uid = c->peer = cred.uid;
	c->pid = cred.pid;
	c->srv = s;
	if (map_put(s, c) != 0) {
		event_free(c->ev_frame);
		event_free(c->ev_idle);
		bufferevent_free(bev);
		free(c);
		return;
	}
	s->accepted++;
	a->conns++;
	publish_counts(s);
	bufferevent_setcb(bev, on_read, on_write, on_event, c);
	idle_arm(c);
	bufferevent_enable(bev, EV_READ | EV_WRITE);
	log_msg(LL_DEBUG, "connection %llu from uid %u pid %d", (unsigned long long)c->id,
		(unsigned)cred.uid, (int)cred.pid);
}

/* ---- engine output ------------------------------------------------------- */

static void shut_down(struct server *s);

static void on_notify(evutil_socket_t fd, short what, void *arg)
{
	(void)what;
	struct server *s = arg;
	uint64_t v;
	if (read(fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		log_msg(LL_ERROR, "eventfd read: %s", strerror(errno));
	int finished = 0;
	struct reply *o = engine_take_out(s->eng, &finished);
	while (o) {
		struct reply *n = o->next;
		struct conn *c = map_get(s, o->conn);
		if (c && !c->closing) {
			struct evbuffer *out = bufferevent_get_output(c->bev);
			if (evbuffer_get_length(out) + o->len > OUT_LIMIT) {
				log_msg(LL_WARN, "connection %llu does not read its replies (%zu bytes "
					"waiting); closing", (unsigned long long)c->id,
					evbuffer_get_length(out));
				conn_close(c);
			} else {
				bufferevent_write(c->bev, o->data, o->len);
				if (o->terminal)
					untrack(c, o->id);   /* the last one: idle from now */
				if (c->paused && !flow_full(c)) {
					c->paused = 0;
					if (!c->starved)
						bufferevent_enable(c->bev, EV_READ);
					on_read(c->bev, c);   /* frames already buffered */
				} else {
					maybe_finish(c);
				}
			}
		}
		free(o);
		o = n;
	}
	if (s->stopping && finished)
		shut_down(s);
}

/* ---- signals, systemd ----------------------------------------------------- */

static void on_exit_timer(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	struct server *s = arg;
	event_base_loopexit(s->base, NULL);
}

/* The engine has stopped and its last replies are written: deliver what is
 * queued, then go. */
static void shut_down(struct server *s)
{
	/* close every connection after its output drains, and stop the loop at
	 * the latest 2 s from now */
	for (size_t i = 0; i < s->n_slots; i++) {
		struct conn *c = s->slots[i];
		if (c && !c->closing) {
			conn_close_after_flush(c);
			i = (size_t)-1;  /* the map may have changed: rescan */
		}
	}
	if (!s->ev_exit) {
		s->ev_exit = evtimer_new(s->base, on_exit_timer, s);
		struct timeval tv = { 2, 0 };
		if (s->ev_exit)
			evtimer_add(s->ev_exit, &tv);
	}
	if (s->n_conns == 0)
		event_base_loopexit(s->base, NULL);
}

/*
 * accept() failed. Out of file descriptors (EMFILE / ENFILE): the pending
 * connection stays queued and libevent would call again at once, spinning
 * the event thread; stop listening for 100 ms instead (connections still
 * queue in the kernel's backlog) and say so at most every 10 s.
 */
static void on_accept_error(struct evconnlistener *l, void *arg)
{
	struct server *s = arg;
	int err = EVUTIL_SOCKET_ERROR();
	if (err != EMFILE && err != ENFILE) {
		log_msg(LL_WARN, "accept: %s", strerror(err));
		return;
	}
	time_t now = time(NULL);
	if (now - s->emfile_logged >= 10) {
		log_msg(LL_WARN, "accept: %s (%zu connections open); pausing new connections "
			"briefly (raise LimitNOFILE or lower max_connections)", strerror(err),
			s->n_conns);
		s->emfile_logged = now;
	}
	evconnlistener_disable(l);
	struct timeval tv = { 0, 100000 };
	if (s->ev_relisten)
		event_add(s->ev_relisten, &tv);
}

static void on_relisten(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	struct server *s = arg;
	if (!s->stopping && s->listener)
		evconnlistener_enable(s->listener);
}

/* Take the hard open-file limit as the soft one: every connection is a
 * descriptor. Warn when max_connections cannot fit. */
static void raise_fd_limit(const struct config *cfg)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
		return;
	if (rl.rlim_cur < rl.rlim_max) {
		rlim_t want = rl.rlim_max == RLIM_INFINITY ? (rlim_t)1 << 20 : rl.rlim_max;
		struct rlimit nl = { want, rl.rlim_max };
		if (setrlimit(RLIMIT_NOFILE, &nl) == 0)
			rl.rlim_cur = want;
	}
	if ((rlim_t)cfg->max_connections + 64 > rl.rlim_cur)
		log_msg(LL_WARN, "max_connections %d is more than the open-file limit (%llu) "
			"allows; connections beyond it wait in the backlog", cfg->max_connections,
			(unsigned long long)rl.rlim_cur);
}

static void on_term(evutil_socket_t sig, short what, void *arg)
{
	(void)what;
	struct server *s = arg;
	if (s->stopping)
		return;
	log_msg(LL_INFO, "%s: stopping", sig == SIGINT ? "SIGINT" : "SIGTERM");
	sd_notify(0, "STOPPING=1\nSTATUS=stopping");
	s->stopping = 1;
	if (s->listener)
		evconnlistener_disable(s->listener);
	engine_shutdown(s->eng);
}

static void on_hup(evutil_socket_t sig, short what, void *arg)
{
	(void)sig;
	(void)what;
	struct server *s = arg;
	if (!s->config_path) {
		log_msg(LL_INFO, "SIGHUP: no configuration file to reload");
		return;
	}
	struct config n = *s->cfg;
	char *cause = NULL;
	/* reload_only: restart-only keys keep their values; strings are not
	 * reloadable, so the copy shares them safely */
	if (config_load(&n, s->config_path, 1, &cause) != 0) {
		log_msg(LL_ERROR, "SIGHUP: %s; keeping the current settings",
			cause ? cause : "cannot reload");
		free(cause);
		return;
	}
	config_apply(s->cfg, &n);
	*s->cfg = n;
	engine_reload(s->eng, &n);
	for (size_t i = 0; i < s->n_slots; i++)
		if (s->slots[i])
			idle_arm(s->slots[i]);
	log_msg(LL_INFO, "SIGHUP: reloaded %s", s->config_path);
}

static void on_watchdog(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)arg;
	sd_notify(0, "WATCHDOG=1");
}

/* ---- the socket ------------------------------------------------------------ */

/* What to do when the default socket cannot be made (no --socket given). */
static const char *default_hint(const struct config *cfg)
{
	if (cfg->socket)
		return "";
	if (geteuid() != 0 && !getenv("XDG_RUNTIME_DIR"))
		return " (the default socket of a user without XDG_RUNTIME_DIR is "
		       LLAMAD_SOCKET_SYSTEM ", for the system daemon: pass --socket PATH, or "
		       "set XDG_RUNTIME_DIR)";
	return " (pass --socket PATH to listen elsewhere)";
}

/* Bind and listen on path: the fd, or -errno with *cause. With check_only,
 * only make sure that it could (its folder made if missing): 0 or -errno. */
static int bind_socket(const struct config *cfg, const char *path, int check_only, char **cause)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof(sa.sun_path)) {
		cause_set(cause, "socket path %s is %zu bytes; a Unix socket's path is at most %zu: "
			  "choose a shorter --socket", path, strlen(path), sizeof(sa.sun_path) - 1);
		return -ENAMETOOLONG;
	}
	strcpy(sa.sun_path, path);
	/* create the parent folder if missing (one level) */
	char *dir = strdup(path);
	char *slash = dir ? strrchr(dir, '/') : NULL;
	if (slash && slash != dir) {
		*slash = 0;
		struct stat ds;
		if (stat(dir, &ds) != 0 && mkdir(dir, 0755) != 0) {
			int e = errno;
			cause_set(cause, "cannot create %s, the folder of the socket %s: %s%s", dir, path,
				  strerror(e), default_hint(cfg));
			free(dir);
			return -e;
		}
		if (access(dir, W_OK | X_OK) != 0) {
			int e = errno;
			cause_set(cause, "cannot make the socket %s: %s: %s%s", path, dir, strerror(e),
				  default_hint(cfg));
			free(dir);
			return -e;
		}
	}
	free(dir);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	/* a live daemon answers on the path; a stale file does not */
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
		close(fd);
		cause_set(cause, "another llamad is listening on %s: stop it, or give this one "
			  "another --socket", path);
		return -EADDRINUSE;
	}
	close(fd);
	struct stat st;
	if (lstat(path, &st) == 0 && !S_ISSOCK(st.st_mode)) {
		cause_set(cause, "%s exists and is not a socket; not replacing it (remove it, or "
			  "pass another --socket)", path);
		return -EEXIST;
	}
	if (check_only)
		return 0;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	unlink(path);  /* a stale socket: nobody answered on it */
	mode_t old = umask(0177);
	int rc = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
	umask(old);
	if (rc != 0 || chmod(path, cfg->socket_mode) != 0 || listen(fd, 128) != 0) {
		int e = errno;
		cause_set(cause, "cannot listen on %s: %s%s", path, strerror(e), default_hint(cfg));
		close(fd);
		return -e;
	}
	if (cfg->socket_group) {
		struct group *g = getgrnam(cfg->socket_group);
		if (!g || chown(path, (uid_t)-1, g->gr_gid) != 0) {
			int e = g ? errno : ENOENT;
			cause_set(cause, "cannot give %s to group %s: %s", path, cfg->socket_group,
				  g ? strerror(e) : "no such group");
			close(fd);
			unlink(path);
			return -e;
		}
	}
	return fd;
}

int server_check_socket(const struct config *cfg, char **cause)
{
	if (sd_listen_fds(0) > 0)
		return 0;   /* systemd's socket: taken as it is */
	char *path = cfg->socket ? strdup(cfg->socket) : path_default_socket();
	if (!path)
		return -ENOMEM;
	int rc = bind_socket(cfg, path, 1, cause);
	free(path);
	return rc;
}

static int open_listener(struct server *s, char **cause)
{
	int fd = -1;
	int n = sd_listen_fds(1);
	if (n > 1) {
		cause_set(cause, "socket activation passed %d sockets; llamad takes one", n);
		return -EINVAL;
	}
	if (n == 1) {
		fd = SD_LISTEN_FDS_START;
		if (sd_is_socket_unix(fd, SOCK_STREAM, 1, NULL, 0) <= 0) {
			cause_set(cause, "the activated socket is not a listening Unix stream socket");
			return -EINVAL;
		}
		evutil_make_socket_nonblocking(fd);
		log_msg(LL_INFO, "listening on the socket passed by systemd");
	} else {
		char *path = s->cfg->socket ? strdup(s->cfg->socket) : path_default_socket();
		if (!path)
			return -ENOMEM;
		fd = bind_socket(s->cfg, path, 0, cause);
		if (fd < 0) {
			free(path);
			return fd;
		}
		s->socket_path = path;
		log_msg(LL_INFO, "listening on %s (mode %04o)", path, s->cfg->socket_mode);
	}
	s->listener = evconnlistener_new(s->base, on_accept, s,
					 LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, -1, fd);
	if (!s->listener) {
		cause_set(cause, "cannot watch the listening socket");
		close(fd);
		return -ENOMEM;
	}
	evconnlistener_set_error_cb(s->listener, on_accept_error);
	s->ev_relisten = evtimer_new(s->base, on_relisten, s);
	return s->ev_relisten ? 0 : -ENOMEM;
}

/* The engine's backend failed and the daemon exits: say so to systemd. */
static void on_fatal(const char *status)
{
	sd_notifyf(0, "STATUS=%s\nSTOPPING=1", status);
}

int server_run(struct config *cfg, const char *config_path, struct engine *eng, char **cause)
{
	struct server s = { 0 };
	s.cfg = cfg;
	s.config_path = config_path;
	s.eng = eng;
	s.notify_fd = -1;
	int rc = -ENOMEM;
	signal(SIGPIPE, SIG_IGN);
	raise_fd_limit(cfg);
	s.base = event_base_new();
	if (!s.base)
		goto out;
	s.notify_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (s.notify_fd < 0) {
		rc = -errno;
		goto out;
	}
	if ((rc = open_listener(&s, cause)) != 0)
		goto out;
	s.ev_notify = event_new(s.base, s.notify_fd, EV_READ | EV_PERSIST, on_notify, &s);
	s.ev_term = evsignal_new(s.base, SIGTERM, on_term, &s);
	s.ev_int = evsignal_new(s.base, SIGINT, on_term, &s);
	s.ev_hup = evsignal_new(s.base, SIGHUP, on_hup, &s);
	if (!s.ev_notify || !s.ev_term || !s.ev_int || !s.ev_hup ||
	    event_add(s.ev_notify, NULL) || event_add(s.ev_term, NULL) ||
	    event_add(s.ev_int, NULL) || event_add(s.ev_hup, NULL)) {
		rc = -ENOMEM;
		goto out;
	}
	if (sd_watchdog_enabled(0, &s.watchdog_usec) > 0 && s.watchdog_usec > 0) {
		s.ev_watchdog = event_new(s.base, -1, EV_PERSIST, on_watchdog, &s);
		struct timeval tv = { (time_t)(s.watchdog_usec / 2000000),
				      (suseconds_t)(s.watchdog_usec / 2 % 1000000) };
		if (s.ev_watchdog)
			event_add(s.ev_watchdog, &tv);
		log_msg(LL_INFO, "watchdog every %.1f s", s.watchdog_usec / 2e6);
	}
	engine_on_fatal(eng, on_fatal);
	if ((rc = engine_start(eng, s.notify_fd)) != 0) {
		cause_set(cause, "cannot start the engine thread: %s", strerror(-rc));
		goto out;
	}
	sd_notifyf(0, "READY=1\nSTATUS=serving %s on %s", engine_backend_name(eng),
		   s.socket_path ? s.socket_path : "the activated socket");
	log_msg(LL_INFO, "ready (llamad %s, %s)", LLAMAD_VERSION, engine_backend_name(eng));
	event_base_dispatch(s.base);
	if (!s.stopping)
		engine_shutdown(eng);
	rc = 0;
out:
	for (size_t i = 0; i < s.n_slots; i++)
		if (s.slots[i]) {
			bufferevent_free(s.slots[i]->bev);
			event_free(s.slots[i]->ev_frame);
			event_free(s.slots[i]->ev_idle);
			free(s.slots[i]);
		}
	free(s.slots);
	free(s.uh);
	if (s.listener)
		evconnlistener_free(s.listener);
	if (s.ev_relisten)
		event_free(s.ev_relisten);
	if (s.socket_path) {
		unlink(s.socket_path);
		free(s.socket_path);
	}
	if (s.ev_notify)
		event_free(s.ev_notify);
	if (s.ev_term)
		event_free(s.ev_term);
	if (s.ev_int)
		event_free(s.ev_int);
	if (s.ev_hup)
		event_free(s.ev_hup);
	/* the sessions are saved by now; a second SIGTERM (systemd, an
	 * impatient admin) must not cut the rest of the clean-up short */
	signal(SIGTERM, SIG_IGN);
	signal(SIGINT, SIG_IGN);
	signal(SIGHUP, SIG_IGN);
	if (s.ev_watchdog)
		event_free(s.ev_watchdog);
	if (s.ev_exit)
		event_free(s.ev_exit);
	if (s.base)
		event_base_free(s.base);
	/* the engine thread writes to the eventfd until it stops */
	engine_shutdown(eng);
	engine_join(eng);
	if (s.notify_fd >= 0)
		close(s.notify_fd);
	return rc;
}

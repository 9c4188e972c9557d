/*
 * gateway/conn.c — see conn.h.
 *
 * A connection's state (struct gwc) is made with its bufferevent (the
 * evhttp_set_bevcb hook, before libevent has the socket) and joined to
 * libevent's connection once libevent has set it up: at the first bytes
 * that come, or a moment after the accept for a silent one. libevent's
 * connection is the argument of the callbacks it sets on the
 * bufferevent (bufferevent_getcb); its close callback frees the state.
 * Until then the bufferevent holds an extra reference, so that a
 * connection libevent gave up during its set-up is seen as such (its
 * callbacks cleared), never freed under the state.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>

#include "gateway/conn.h"
#include "gateway/reply.h"
#include "gateway/render.h"
#include "gateway/reqscan.h"

#define LINGER_S 2                 /* a refused connection's last seconds */
#define BODY_RATE (64u << 10)      /* bytes a second a body gets at least */
#define HEAD_LINES 100

enum phase {
	P_NONE,                    /* no request being read */
	P_SETUP,                   /* joined to libevent's connection soon */
	P_HEAD,                    /* a head is coming: its deadline */
	P_BODY,                    /* a body is coming: its deadline */
	P_LINGER,                  /* refused: closed when the timer fires */
};

/* What a connection is counted as: a user, or a remote address. */
struct key {
	int kind;                  /* K_NONE, K_UID, K_ADDR */
	uint32_t uid;
	unsigned char addr[16];
};
enum { K_NONE, K_UID, K_ADDR };

struct gwc {
	struct gwc *hnext;         /* the table, by bufferevent */
	struct gw *g;
	struct bufferevent *bev;
	struct evhttp_connection *evcon;  /* once joined */
	struct event *timer;
	int phase;
	int joined, refused, answering;
	int family;                /* of the socket accepted */
	int have_uid;              /* who.uid is the peer's user */
	struct caller who;
	struct key key;            /* counted as (K_NONE: not counted) */
	struct rscan rs;
	uint64_t body_len;         /* the body being read (0: chunked) */
	void (*on_close)(struct evhttp_connection *, void *);
	void *on_close_arg;
};

/* Connections a caller holds. */
struct count {
	struct key key;
	uint32_t n;
	time_t said;               /* last logged refusal */
};

static struct {
	struct gw *g;
	struct gwc **slots;        /* chained, by bufferevent address */
	size_t n_slots, n;
	struct count *counts;
	size_t n_counts, cap_counts;
	struct evconnlistener *listeners[8];
	size_t n_listeners;
	struct event *relisten;
	time_t emfile_said;
} C;

/* ---- the table ------------------------------------------------------------- */

static size_t slot(const void *bev)
{
	return (size_t)(((uintptr_t)bev >> 4) * 0x9e3779b97f4a7c15ull >> 20) & (C.n_slots - 1);
}

static int table_put(struct gwc *c)
{
	if ((C.n + 1) * 2 > C.n_slots) {
		size_t n = C.n_slots ? C.n_slots * 2 : 256;
		struct gwc **ns = calloc(n, sizeof(*ns));
		if (!ns)
			return -ENOMEM;
		struct gwc **old = C.slots;
		size_t on = C.n_slots;
		C.slots = ns;
		C.n_slots = n;
		for (size_t i = 0; i < on; i++)
			for (struct gwc *e = old[i], *nx; e; e = nx) {
				nx = e->hnext;
				size_t k = slot(e->bev);
				e->hnext = C.slots[k];
				C.slots[k] = e;
			}
		free(old);
	}
	size_t k = slot(c->bev);
	c->hnext = C.slots[k];
	C.slots[k] = c;
	C.n++;
	return 0;
}

static struct gwc *table_get(const struct bufferevent *bev)
{
	if (!C.n_slots || !bev)
		return NULL;
	for (struct gwc *e = C.slots[slot(bev)]; e; e = e->hnext)
		if (e->bev == bev)
			return e;
	return NULL;
}

static void table_del(struct gwc *c)
{
	for (struct gwc **p = &C.slots[slot(c->bev)]; *p; p = &(*p)->hnext)
		if (*p == c) {
			*p = c->hnext;
			C.n--;
			return;
		}
}

/* ---- counts -------------------------------------------------------------- */

static int same_key(const struct key *a, const struct key *b)
{
	return a->kind == b->kind && (a->kind == K_UID ? a->uid == b->uid
				      : !memcmp(a->addr, b->addr, sizeof(a->addr)));
}

static struct count *count_of(const struct key *k, int make)
{
	for (size_t i = 0; i < C.n_counts; i++)
		if (same_key(&C.counts[i].key, k))
			return &C.counts[i];
	if (!make)
		return NULL;
	if (C.n_counts == C.cap_counts) {
		size_t cap = C.cap_counts ? 2 * C.cap_counts : 16;
		struct count *n = realloc(C.counts, cap * sizeof(*n));
		if (!n)
			return NULL;
		C.counts = n;
		C.cap_counts = cap;
	}
	C.counts[C.n_counts] = (struct count){ .key = *k };
	return &C.counts[C.n_counts++];
}

static void uncount(struct gwc *c)
{
	struct count *n = c->key.kind != K_NONE ? count_of(&c->key, 0) : NULL;
	if (n && n->n > 0 && --n->n == 0)
		*n = C.counts[--C.n_counts];   /* the table stays as small as the callers */
	c->key.kind = K_NONE;
}

static const char *key_name(const struct key *k, char *buf, size_t n)
{
	if (k->kind == K_UID) {
		snprintf(buf, n, "uid %u", (unsigned)k->uid);
	} else {
		char a[INET6_ADDRSTRLEN];
		inet_ntop(AF_INET6, k->addr, a, sizeof(a));
		snprintf(buf, n, "address %s", a);
	}
	return buf;
}

/* c counts as k from now on: 0, or -EUSERS when k holds its share. */
static int count_as(struct gwc *c, const struct key *k)
{
	if (c->key.kind != K_NONE && same_key(&c->key, k))
		return 0;
	struct count *n = count_of(k, 1);
	if (!n)
		return -ENOMEM;
	if (n->n >= C.g->max_caller_conns) {
		time_t now = time(NULL);
		if (now - n->said >= 10) {
			char name[80];
			gw_log(C.g, GW_WARN, "%s holds %u connections (--max-caller-connections): refusing "
			       "more", key_name(k, name, sizeof(name)), n->n);
			n->said = now;
		}
		C.g->st.conns_refused++;
		return -EUSERS;
	}
	n->n++;
	uncount(c);
	c->key = *k;
	return 0;
}

/* ---- who is calling --------------------------------------------------------- */

/* The owner of the local TCP socket whose address is peer and whose peer
 * is self (the caller's end of a loopback connection), from the kernel's
 * socket table by netlink: one lookup, whatever the number of sockets. */
static int diag_owner(const struct sockaddr_storage *peer, const struct sockaddr_storage *self,
		      uid_t *uid)
{
	int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
	if (fd < 0)
		return -errno;
	struct {
		struct nlmsghdr nlh;
		struct inet_diag_req_v2 r;
	} q;
	memset(&q, 0, sizeof(q));
	q.nlh.nlmsg_len = sizeof(q);
	q.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
	q.nlh.nlmsg_flags = NLM_F_REQUEST;
	q.r.sdiag_family = (uint8_t)peer->ss_family;
	q.r.sdiag_protocol = IPPROTO_TCP;
	q.r.idiag_states = ~0u;
	q.r.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
	q.r.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
	/* the caller's socket: its own address is our peer, its peer is us */
	if (peer->ss_family == AF_INET) {
		const struct sockaddr_in *p = (const void *)peer, *s = (const void *)self;
		q.r.id.idiag_sport = p->sin_port;
		q.r.id.idiag_dport = s->sin_port;
		memcpy(q.r.id.idiag_src, &p->sin_addr, 4);
		memcpy(q.r.id.idiag_dst, &s->sin_addr, 4);
	} else {
		const struct sockaddr_in6 *p = (const void *)peer, *s = (const void *)self;
		q.r.id.idiag_sport = p->sin6_port;
		q.r.id.idiag_dport = s->sin6_port;
		memcpy(q.r.id.idiag_src, &p->sin6_addr, 16);
		memcpy(q.r.id.idiag_dst, &s->sin6_addr, 16);
	}
	struct sockaddr_nl nl = { .nl_family = AF_NETLINK };
	int rc = -EIO;
	if (sendto(fd, &q, sizeof(q), 0, (struct sockaddr *)&nl, sizeof(nl)) != (ssize_t)sizeof(q)) {
		rc = -errno;
		close(fd);
		return rc;
	}
	union {
		struct nlmsghdr h;
		char b[8192];
	} buf;
	struct timeval tv = { 1, 0 };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	ssize_t k = recv(fd, buf.b, sizeof(buf.b), 0);
	if (k < 0)
		rc = -errno;
	for (struct nlmsghdr *h = &buf.h; k > 0 && NLMSG_OK(h, (size_t)k); h = NLMSG_NEXT(h, k)) {
		if (h->nlmsg_type == NLMSG_ERROR) {
			const struct nlmsgerr *e = NLMSG_DATA(h);
			rc = e->error ? e->error : -ENOENT;
			break;
		}
		if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY) {
			const struct inet_diag_msg *m = NLMSG_DATA(h);
			*uid = m->idiag_uid;
			rc = 0;
			break;
		}
	}
	close(fd);
	return rc;
}

/* The same from /proc/net/tcp, tcp6 (a kernel without sock_diag). */
static int proc_owner(const struct sockaddr_storage *peer, const struct sockaddr_storage *self,
		      uid_t *uid)
{
	char want_l[80], want_r[80];
	const char *file;
	if (peer->ss_family == AF_INET) {
		const struct sockaddr_in *p = (const void *)peer, *s = (const void *)self;
		snprintf(want_l, sizeof(want_l), "%08X:%04X", p->sin_addr.s_addr, ntohs(p->sin_port));
		snprintf(want_r, sizeof(want_r), "%08X:%04X", s->sin_addr.s_addr, ntohs(s->sin_port));
		file = "/proc/net/tcp";
	} else {
		const struct sockaddr_in6 *p = (const void *)peer, *s = (const void *)self;
		uint32_t a[4], b[4];
		memcpy(a, &p->sin6_addr, 16);
		memcpy(b, &s->sin6_addr, 16);
		snprintf(want_l, sizeof(want_l), "%08X%08X%08X%08X:%04X", a[0], a[1], a[2], a[3], ntohs(p->sin6_port));
		snprintf(want_r, sizeof(want_r), "%08X%08X%08X%08X:%04X", b[0], b[1], b[2], b[3], ntohs(s->sin6_port));
		file = "/proc/net/tcp6";
	}
	FILE *f = fopen(file, "r");
	if (!f)
		return -errno;
	char line[512], l[80], r[80];
	unsigned u;
	int rc = -ESRCH;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, " %*u: %79s %79s %*x %*x:%*x %*x:%*x %*x %u", l, r, &u) == 3 &&
		    !strcmp(l, want_l) && !strcmp(r, want_r)) {
			*uid = u;
			rc = 0;
			break;
		}
	fclose(f);
	return rc;
}

static int is_loopback(const struct sockaddr_storage *sa)
{
	if (sa->ss_family == AF_INET)
		return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
	if (sa->ss_family == AF_INET6) {
		const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
		return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
	}
	return 0;
}

/* Who is at the other end of c's socket fd, and what it counts as. */
static void identify(struct gwc *c, int fd, struct key *k)
{
	struct sockaddr_storage self, peer;
	socklen_t sl = sizeof(self), pl = sizeof(peer);
	k->kind = K_NONE;
	if (getsockname(fd, (struct sockaddr *)&self, &sl) < 0)
		return;
	c->family = self.ss_family;
	if (self.ss_family == AF_UNIX) {
		struct ucred cr;
		socklen_t cl = sizeof(cr);
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) < 0)
			return;
		c->who.uid = cr.uid;
		c->have_uid = 1;
		snprintf(c->who.who, sizeof(c->who.who), "unix:uid %u", (unsigned)cr.uid);
	} else if (getpeername(fd, (struct sockaddr *)&peer, &pl) == 0) {
		uid_t u;
		if (is_loopback(&peer) && (diag_owner(&peer, &self, &u) == 0 || proc_owner(&peer, &self, &u) == 0)) {
			c->who.uid = u;
			c->have_uid = 1;
			snprintf(c->who.who, sizeof(c->who.who), "tcp:uid %u", (unsigned)u);
		} else {
			/* a remote caller, until its token says who: its address */
			k->kind = K_ADDR;
			memset(k->addr, 0, sizeof(k->addr));
			if (peer.ss_family == AF_INET6) {
				memcpy(k->addr, &((struct sockaddr_in6 *)&peer)->sin6_addr, 16);
			} else {
				k->addr[10] = k->addr[11] = 0xff;
				memcpy(k->addr + 12, &((struct sockaddr_in *)&peer)->sin_addr, 4);
			}
			return;
		}
	}
	if (c->have_uid) {
		k->kind = K_UID;
		k->uid = (uint32_t)c->who.uid;
	}
}

/* ---- refusals ----------------------------------------------------------------- */

/* Answer status with msg in the API's form straight to c's socket, shut
 * its sending side, throw away what comes, and close it in LINGER_S
 * seconds (the client reads the answer meanwhile). */
static void refuse(struct gwc *c, int status, int ollama, const char *msg)
{
	char *body = render_error(ollama ? API_OLLAMA_CHAT : API_OPENAI_CHAT, status, msg);
	const char *b = body ? body : "{\"error\":\"refused\"}";
	char out[1024];
	int k = snprintf(out, sizeof(out), "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
			 "Content-Length: %zu\r\nConnection: close\r\n\r\n%s\n", status, http_reason(status),
			 strlen(b) + 1, b);
	free(body);
	int fd = bufferevent_getfd(c->bev);
	/* a few hundred bytes on a connection that has been sent nothing since
	 * its last answer: the socket takes them */
	if (fd >= 0 && k > 0 && (size_t)k < sizeof(out)) {
		if (send(fd, out, (size_t)k, MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
			gw_log(c->g, GW_DEBUG, "%d: %m", status);
		shutdown(fd, SHUT_WR);
	}
	c->g->st.requests++;
	c->g->st.errors_4xx++;
	gw_log(c->g, GW_DEBUG, "%s: %d %s", c->who.who[0] ? c->who.who : "a caller", status, msg);
	c->refused = 1;
	c->phase = P_LINGER;
	struct timeval tv = { LINGER_S, 0 };
	evtimer_add(c->timer, &tv);
	evbuffer_drain(bufferevent_get_input(c->bev), evbuffer_get_length(bufferevent_get_input(c->bev)));
}

/* ---- the connection's life ---------------------------------------------------- */

static void on_evcon_close(struct evhttp_connection *hc, void *arg);
static void on_input(struct evbuffer *in, const struct evbuffer_cb_info *info, void *arg);

/* Join c to libevent's connection, once libevent has set it up: 1, or 0
 * when libevent gave the connection up (c is freed: c is gone). */
static int join(struct gwc *c)
{
	if (c->joined)
		return 1;
	bufferevent_data_cb rcb = NULL;
	bufferevent_event_cb ecb = NULL;
	void *arg = NULL;
	bufferevent_getcb(c->bev, &rcb, NULL, &ecb, &arg);
	if (!ecb || !arg) {
		/* freed by libevent (its callbacks cleared): ours went with it
		 * but the reference taken at its making */
		struct bufferevent *bev = c->bev;
		evbuffer_remove_cb(bufferevent_get_input(bev), on_input, c);
		table_del(c);
		event_free(c->timer);
		free(c);
		bufferevent_decref(bev);
		return 0;
	}
	c->joined = 1;
	c->evcon = arg;
	evhttp_connection_set_closecb(c->evcon, on_evcon_close, c);
	struct key k;
	int fd = bufferevent_getfd(c->bev);
	if (fd >= 0)
		identify(c, fd, &k);
	else
		k.kind = K_NONE;
	bufferevent_decref(c->bev);   /* libevent's own reference holds it now */
	c->g->st.conns_open++;
	if (k.kind != K_NONE && count_as(c, &k) == -EUSERS) {
		char name[80], msg[160];
		snprintf(msg, sizeof(msg), "%s holds %u connections, the most a caller may "
			 "(--max-caller-connections)", key_name(&k, name, sizeof(name)),
			 C.g->max_caller_conns);
		refuse(c, 429, 0, msg);
	}
	return 1;
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	struct gwc *c = arg;
	switch (c->phase) {
	case P_SETUP:
		c->phase = P_NONE;
		join(c);
		return;
	case P_HEAD:
	case P_BODY: {
		if (c->answering) {
			/* a request behind one being answered: its time runs after */
			struct timeval tv = { C.g->header_timeout, 0 };
			evtimer_add(c->timer, &tv);
			return;
		}
		char msg[160];
		snprintf(msg, sizeof(msg), "the request %s was not complete within %d s of its first "
			 "byte (--header-timeout)", c->phase == P_HEAD ? "head" : "body",
			 c->phase == P_HEAD ? C.g->header_timeout
					    : C.g->header_timeout + (int)(c->body_len / BODY_RATE));
		C.g->st.conns_cut++;
		refuse(c, 408, c->rs.ollama, msg);
		/* a trickle is not read to its end: closed at once */
		evhttp_connection_free(c->evcon);
		return;
	}
	case P_LINGER:
		evhttp_connection_free(c->evcon);   /* on_evcon_close frees c */
		return;
	}
}

static void arm(struct gwc *c, int phase, int seconds)
{
	c->phase = phase;
	struct timeval tv = { seconds, 0 };
	evtimer_add(c->timer, &tv);
}

/* Bytes came: read through the scanner, deadlines set, refusals made. */
static void on_input(struct evbuffer *in, const struct evbuffer_cb_info *info, void *arg)
{
	struct gwc *c = arg;
	if (!info->n_added || !join(c))
		return;
	if (c->refused) {
		evbuffer_drain(in, evbuffer_get_length(in));
		return;
	}
	struct evbuffer_ptr at;
	if (evbuffer_ptr_set(in, &at, info->orig_size, EVBUFFER_PTR_SET) < 0)
		return;
	size_t left = info->n_added;
	while (left > 0) {
		struct evbuffer_iovec v[8];
		int nv = evbuffer_peek(in, (ev_ssize_t)left, &at, v, 8);
		if (nv <= 0)
			return;
		for (int i = 0; i < nv && left > 0; i++) {
			size_t len = v[i].iov_len < left ? v[i].iov_len : left;
			size_t off = 0;
			for (;;) {
				struct rs_event ev;
				off += rscan_feed(&c->rs, (const char *)v[i].iov_base + off, len - off, &ev);
				if (ev.kind == RS_NONE)
					break;
				switch (ev.kind) {
				case RS_START:
					arm(c, P_HEAD, C.g->header_timeout);
					break;
				case RS_HEAD_END:
					c->body_len = ev.body == 1 ? ev.body_len : ev.body == 2 ? C.g->max_body : 0;
					if (ev.body)
						arm(c, P_BODY, C.g->header_timeout + (int)(c->body_len / BODY_RATE));
					break;
				case RS_DONE:
					c->phase = P_NONE;
					evtimer_del(c->timer);
					break;
				case RS_ERROR:
					if (ev.status == 431 || ev.status == 400)
						C.g->st.heads_refused++;
					refuse(c, ev.status, ev.ollama, ev.msg);
					return;
				}
			}
			left -= len;
			if (evbuffer_ptr_set(in, &at, len, EVBUFFER_PTR_ADD) < 0)
				return;
		}
	}
}

static void on_evcon_close(struct evhttp_connection *hc, void *arg)
{
	struct gwc *c = arg;
	if (c->on_close)
		c->on_close(hc, c->on_close_arg);
	evbuffer_remove_cb(bufferevent_get_input(c->bev), on_input, c);
	uncount(c);
	table_del(c);
	event_free(c->timer);
	c->g->st.conns_open--;
	free(c);
}

static struct bufferevent *make_bev(struct event_base *base, void *arg)
{
	struct gw *g = arg;
	struct bufferevent *bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
	struct gwc *c = bev ? calloc(1, sizeof(*c)) : NULL;
	if (!c)
		return bev;   /* not watched: libevent's limits only */
	c->g = g;
	c->bev = bev;
	rscan_init(&c->rs, g->max_header, HEAD_LINES, g->max_body);
	c->timer = evtimer_new(base, on_timer, c);
	if (!c->timer || table_put(c) < 0) {
		if (c->timer)
			event_free(c->timer);
		free(c);
		return bev;
	}
	bufferevent_incref(bev);
	evbuffer_add_cb(bufferevent_get_input(bev), on_input, c);
	arm(c, P_SETUP, 0);
	return bev;
}

/* ---- the listeners ----------------------------------------------------------- */

static void on_relisten(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)arg;
	if (C.g->stopping)
		return;   /* the listeners are gone */
	for (size_t i = 0; i < C.n_listeners; i++)
		evconnlistener_enable(C.listeners[i]);
}

/* accept() failed. Out of descriptors, the pending connection stays
 * queued and libevent would call again at once (a busy loop, a log line
 * each time: "accept(): Too many open files"): every listener pauses for
 * 100 ms instead (connections wait in the backlog). */
static void on_accept_error(struct evconnlistener *l, void *arg)
{
	(void)l;
	(void)arg;
	int err = EVUTIL_SOCKET_ERROR();
	if (err != EMFILE && err != ENFILE && err != ENOBUFS && err != ENOMEM) {
		gw_log(C.g, GW_WARN, "accept: %s", strerror(err));
		return;
	}
	time_t now = time(NULL);
	if (now - C.emfile_said >= 10) {
		gw_log(C.g, GW_WARN, "accept: %s (%u connections open); pausing new connections "
		       "briefly (raise LimitNOFILE, or lower --max-caller-connections)", strerror(err),
		       C.g->st.conns_open);
		C.emfile_said = now;
	}
	for (size_t i = 0; i < C.n_listeners; i++)
		evconnlistener_disable(C.listeners[i]);
	struct timeval tv = { 0, 100000 };
	if (C.relisten)
		event_add(C.relisten, &tv);
}

void conn_listener(struct gw *g, struct evconnlistener *l)
{
	(void)g;
	if (C.n_listeners < sizeof(C.listeners) / sizeof(C.listeners[0]))
		C.listeners[C.n_listeners++] = l;
	evconnlistener_set_error_cb(l, on_accept_error);
}

void conn_setup(struct gw *g)
{
	C.g = g;
	C.relisten = evtimer_new(g->base, on_relisten, NULL);
	evhttp_set_bevcb(g->http, make_bev, g);
	/* libevent's own bound, behind the scanner's (never reached first) */
	evhttp_set_max_headers_size(g->http, (ev_ssize_t)g->max_header);
}

/* ---- what the routes ask ------------------------------------------------------- */

static struct gwc *of_req(struct evhttp_request *req)
{
	struct evhttp_connection *hc = evhttp_request_get_connection(req);
	struct gwc *c = hc ? table_get(evhttp_connection_get_bufferevent(hc)) : NULL;
	return c && join(c) ? c : NULL;
}

int conn_caller(struct evhttp_request *req, struct caller *who)
{
	struct gwc *c = of_req(req);
	if (!c)
		return -ESRCH;
	if (!c->have_uid || (c->family != AF_UNIX && C.g->n_tokens))
		return -ENOENT;
	*who = c->who;
	return 0;
}

int conn_claim(struct evhttp_request *req, uid_t uid)
{
	struct gwc *c = of_req(req);
	if (!c)
		return 0;
	struct key k = { .kind = K_UID, .uid = (uint32_t)uid };
	return count_as(c, &k) == -EUSERS ? -EUSERS : 0;
}

static void on_complete(struct evhttp_request *req, void *arg)
{
	(void)req;
	struct gwc *c = arg;
	c->answering = 0;
}

void conn_answering(struct evhttp_request *req)
{
	struct gwc *c = of_req(req);
	if (!c)
		return;
	c->answering = 1;
	evhttp_request_set_on_complete_cb(req, on_complete, c);
}

void conn_on_close(struct evhttp_connection *hc, void (*fn)(struct evhttp_connection *, void *),
		   void *arg)
{
	struct gwc *c = table_get(evhttp_connection_get_bufferevent(hc));
	if (!c || !c->joined) {
		evhttp_connection_set_closecb(hc, fn, arg);
		return;
	}
	c->on_close = fn;
	c->on_close_arg = arg;
}

/*
 * tests/load/load.c — llamad-load: many concurrent clients of a running
 * daemon, over its socket, with faults.
 *
 *   llamad-load --socket PATH [--conns N] [--seconds S] [--idle N]
 *               [--half-frames N] [--half-frame-wait S] [--disconnect-rate P]
 *               [--save-rate P] [--saved-log FILE] [--min-tokens N]
 *               [--max-tokens N] [--seed N] [--prefix NAME] [--keep-sessions]
 *               [--expect-kill]
 *   llamad-load --socket PATH --cleanup         drop every session of the caller
 *   llamad-load --socket PATH --check-saved FILE
 *
 * Load (the default): --conns connections (default 64) each open their own
 * session (PREFIX-PID-CONN-GEN, a random template), then loop for --seconds
 * (default 10): an Append and a Generate without prompt, or a Generate with
 * a prompt, of --min-tokens..--max-tokens tokens (16..32), random or greedy
 * sampling, sometimes a stop string; now and then a GetInfo, a Save (with
 * probability --save-rate after a generation), or a Drop and a new session
 * (also before the session nears its context length). One request is in
 * flight per connection; everything runs in one thread around poll().
 *
 * Faults: --disconnect-rate P closes the connection of that fraction of the
 * generations after a random number of tokens, then reconnects and reopens
 * the session. --idle N holds N more connections that never send; --half-
 * frames N connections send a 4-byte length promising 1000 bytes and only 10
 * of them, then stall. After the run the load waits up to --half-frame-wait
 * seconds (default 0: no wait) for the daemon to close the stalled ones.
 *
 * Checks, on every reply: the id is the one in flight; the body is the one
 * the request calls for (or an Error); a Generate sends token events and
 * then one Done, whose generated_tokens equals the tokens streamed (plus
 * the unsent EOS) and is at most max_tokens; token text is valid UTF-8; no
 * frame exceeds 16 MiB; no connection is closed by the daemon; requests in
 * flight never go 10 s without any reply on any connection. Errors are
 * counted by code; BUSY and RESOURCE_EXHAUSTED are allowed (the request is
 * retried after a pause), any other is a failure. At the end a new
 * connection must get Hello and Status answered ("served").
 *
 * --save-rate with --saved-log FILE appends "saved NAME TOKENS" for every
 * Save answered and "drop NAME" before every Drop is sent. With
 * --expect-kill, the daemon going away (the load's connections close and
 * reconnecting is refused) ends the run without failing. --check-saved FILE,
 * run against a daemon restarted on the same state directory, asserts every
 * session whose last line is "saved" exists with at least that many tokens,
 * and that a few of them still generate.
 *
 * Output: human lines, then one "load: key=value ..." summary line.
 * Exit status: 0 all checks passed, 1 a check failed, 2 usage, 3 no daemon.
 *
 * Build (no make rule yet; the flags of llamad-bench-daemon):
 *   cc -std=c11 -O2 -g -Wall -Wextra -Werror -D_GNU_SOURCE -I. -Ibuild/proto \
 *      tests/load/load.c proto/frame.c build/proto/llamad.pb-c.c \
 *      $(pkg-config --libs libprotobuf-c) -lm -o build/llamad-load
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "proto/frame.h"
#include "util/grow.h"

#define RECV_MAX FRAME_MAX_DEFAULT  /* larger replies are a protocol violation */
#define STALL_MAX_S 10.0             /* longer without any reply: "stopped serving" */
#define N_CODES 128                  /* error codes counted: 0..127 */
#define CODE_SLOT(c) ((c) >= 100 ? (c) - 100 + 64 : (c))  /* 0..63, 100.. -> 64.. */

/* ---- options and global counters ------------------------------------------ */

static struct {
	const char *socket, *prefix, *saved_log, *check_saved;
	int conns, idle, half_frames, min_tokens, max_tokens, keep_sessions, expect_kill;
	int cleanup;
	double seconds, disconnect_rate, save_rate, half_frame_wait;
	uint64_t seed;
} opt = { .conns = 64, .seconds = 10, .min_tokens = 16, .max_tokens = 32,
	  .prefix = "load" };

static struct {
	uint64_t requests, generations, tokens, errors[N_CODES], violations, disconnects,
		reconnects, conn_lost, sessions_created, sessions_dropped, saves, busy_retries;
	int daemon_gone;
} st;

static FILE *saved_log;

/* Latencies in seconds, grown as needed. */
struct samples {
	double *v;
	size_t n, cap;
};
static struct samples first_lat, token_lat;

static void sample_add(struct samples *s, double x)
{
	if (s->n == s->cap) {
		size_t c = s->cap ? s->cap * 2 : 4096;
		double *p = realloc(s->v, c * sizeof(*p));
		if (!p)
			return;  /* a lost sample, not a failure */
		s->v = p;
		s->cap = c;
	}
	s->v[s->n++] = x;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* q-quantile (0..1) of s, sorted in place; 0 when empty. */
static double quantile(struct samples *s, double q)
{
	if (!s->n)
		return 0;
	qsort(s->v, s->n, sizeof(double), cmp_double);
	size_t k = (size_t)(q * (double)(s->n - 1) + 0.5);
	return s->v[k < s->n ? k : s->n - 1];
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng_state;

static uint64_t rnd(void)
{
	/* xorshift64* */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545f4914f6cdd1dull;
}

static double rnd01(void)
{
	return (double)(rnd() >> 11) * (1.0 / 9007199254740992.0);
}

static int rnd_in(int lo, int hi)  /* [lo, hi] */
{
	return lo + (int)(rnd() % (uint64_t)(hi - lo + 1));
}

/* A protocol violation: counted and printed (the first 20). */
static void violation(int conn, const char *fmt, ...)
{
	st.violations++;
	if (st.violations > 20)
		return;
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "llamad-load: violation on connection %d: ", conn);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

static int valid_utf8(const char *s)
{
	const unsigned char *p = (const unsigned char *)s;
	while (*p) {
		unsigned c = *p++;
		int n;
		uint32_t cp;
		if (c < 0x80)
			continue;
		else if ((c & 0xe0) == 0xc0)
			n = 1, cp = c & 0x1f;
		else if ((c & 0xf0) == 0xe0)
			n = 2, cp = c & 0x0f;
		else if ((c & 0xf8) == 0xf0)
			n = 3, cp = c & 0x07;
		else
			return 0;
		for (int i = 0; i < n; i++) {
			if ((p[i] & 0xc0) != 0x80)
				return 0;
			cp = cp << 6 | (p[i] & 0x3f);
		}
		p += n;
		if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
		    cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return 0;
	}
	return 1;
}

/* ---- sockets --------------------------------------------------------------- */

/* A connected socket (blocking), or -errno. */
static int dial(void)
{
	return frame_dial(opt.socket);
}

static int set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	return fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ? -errno : 0;
}

/* 1 if the daemon has closed fd (end of stream or error), reading and
 * counting any bytes it sent into *got; 0 if still open. Non-blocking. */
static int peer_closed(int fd, size_t *got)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	if (poll(&p, 1, 0) <= 0)
		return 0;
	uint8_t b[4096];
	for (;;) {
		ssize_t k = recv(fd, b, sizeof(b), MSG_DONTWAIT);
		if (k > 0) {
			if (got)
				*got += (size_t)k;
			continue;
		}
		if (k == 0)
			return 1;
		return errno == EAGAIN || errno == EINTR ? 0 : 1;
	}
}

/* ---- blocking calls (probe, cleanup, check) ------------------------------- */

static uint64_t blk_id;

/* Send q on a blocking fd and return its reply within ms, or NULL. Token
 * events of a Generate are skipped up to Done (counted in *n_tok). */
static Llamad__Response *blk_call(int fd, Llamad__Request *q, int ms, int *n_tok)
{
	PB_SET(q, id, ++blk_id);
	if (frame_send(fd, &q->base) != 0)
		return NULL;
	double end = now_s() + ms / 1e3;
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int left = (int)((end - now_s()) * 1e3);
		if (left <= 0 || poll(&p, 1, left) <= 0)
			return NULL;
		int err = 0;
		Llamad__Response *r = frame_recv_response(fd, RECV_MAX, &err);
		if (!r)
			return NULL;
		if (r->id == q->id && r->body_case != LLAMAD__RESPONSE__BODY_TOKEN)
			return r;
		if (r->body_case == LLAMAD__RESPONSE__BODY_TOKEN && n_tok)
			*n_tok += (int)r->token->n_tokens;
		llamad__response__free_unpacked(r, NULL);
	}
}

static int is_error(const Llamad__Response *r)
{
	return r->body_case == LLAMAD__RESPONSE__BODY_ERROR;
}

/* q: a Hello from `client` (h filled, q pointing at it). */
static void hello_request(Llamad__Hello *h, Llamad__Request *q, const char *client)
{
	*h = (Llamad__Hello)LLAMAD__HELLO__INIT;
	PB_SET(h, protocol_version, LLAMAD_PROTOCOL_VERSION);
	h->client = (char *)client;
	*q = (Llamad__Request)LLAMAD__REQUEST__INIT;
	q->op_case = LLAMAD__REQUEST__OP_HELLO;
	q->hello = h;
}

/* Hello + Status on a new connection within 5 s: 0, or -1. Prints the
 * daemon's counts as key=value into out. */
static int probe(char *out, size_t cap)
{
	snprintf(out, cap, "daemon_sessions=? daemon_connections=?");
	int fd = dial();
	if (fd < 0)
		return -1;
	int ok = -1;
	Llamad__Hello h;
	Llamad__Request q;
	hello_request(&h, &q, "llamad-load probe");
	Llamad__Response *r = blk_call(fd, &q, 5000, NULL);
	if (r && r->body_case == LLAMAD__RESPONSE__BODY_HELLO) {
		llamad__response__free_unpacked(r, NULL);
		Llamad__GetStatus gs = LLAMAD__GET_STATUS__INIT;
		Llamad__Request q2 = LLAMAD__REQUEST__INIT;
		q2.op_case = LLAMAD__REQUEST__OP_STATUS;
		q2.status = &gs;
		r = blk_call(fd, &q2, 5000, NULL);
		if (r && r->body_case == LLAMAD__RESPONSE__BODY_STATUS) {
			snprintf(out, cap, "daemon_sessions=%u daemon_connections=%u "
				 "daemon_rss_mb=%.1f", r->status->sessions,
				 r->status->connections, r->status->rss_bytes / 1048576.0);
			ok = 0;
		}
	}
	if (r)
		llamad__response__free_unpacked(r, NULL);
	close(fd);
	return ok;
}

/* Drop the caller's sessions whose name starts with prefix (NULL: all).
 * Returns the number dropped, or -1 on failure. */
static int drop_all(const char *prefix)
{
	int fd = dial();
	if (fd < 0)
		return -1;
	Llamad__ListSessions ls = LLAMAD__LIST_SESSIONS__INIT;
	Llamad__Request q = LLAMAD__REQUEST__INIT;
	q.op_case = LLAMAD__REQUEST__OP_LIST;
	q.list = &ls;
	Llamad__Response *r = blk_call(fd, &q, 10000, NULL);
	if (!r || r->body_case != LLAMAD__RESPONSE__BODY_SESSIONS) {
		if (r)
			llamad__response__free_unpacked(r, NULL);
		close(fd);
		return -1;
	}
	int n = 0, bad = 0;
	size_t plen = prefix ? strlen(prefix) : 0;
	for (size_t i = 0; i < r->sessions->n_sessions; i++) {
		const char *name = r->sessions->sessions[i]->session;
		if (!name || (prefix && strncmp(name, prefix, plen) != 0))
			continue;
		Llamad__Drop d = LLAMAD__DROP__INIT;
		d.session = (char *)name;
		Llamad__Request qd = LLAMAD__REQUEST__INIT;
		qd.op_case = LLAMAD__REQUEST__OP_DROP;
		qd.drop = &d;
		Llamad__Response *rd = blk_call(fd, &qd, 10000, NULL);
		if (rd && rd->body_case == LLAMAD__RESPONSE__BODY_OK)
			n++;
		else if (!rd || rd->error->code != LLAMAD__ERROR_CODE__UNKNOWN_SESSION) {
			fprintf(stderr, "llamad-load: cannot drop %s: %s\n", name,
				rd ? rd->error->message : "no reply");
			bad = 1;
		}
		if (rd)
			llamad__response__free_unpacked(rd, NULL);
	}
	llamad__response__free_unpacked(r, NULL);
	close(fd);
	return bad ? -1 : n;
}

/* ---- the load: connections -------------------------------------------------- */

enum op { OP_NONE, OP_HELLO, OP_OPEN, OP_APPEND, OP_GENERATE, OP_DROP, OP_INFO, OP_SAVE };
static const char *const op_name[] = { "none", "hello", "open", "append", "generate",
				       "drop", "info", "save" };

struct conn {
	int idx, fd;
	uint8_t *in;              /* unparsed input */
	size_t in_len, in_cap;
	uint8_t *out;             /* unsent output */
	size_t out_len, out_off, out_cap;
	uint64_t next_id, want_id;
	enum op op;               /* request in flight, OP_NONE if none */
	double t_sent, t_last, wake;  /* wake: no new request before this time */
	char sess[128];
	int sess_gen, sess_open, raw;
	uint32_t sess_tokens;
	int gen_after_append;     /* the Append in flight is followed by a Generate */
	/* the Generate in flight */
	uint32_t max_tokens;
	int n_tok, disconnect_at, done_seen;
	int reconnecting;         /* reopen the session after a reconnect */
	int need_info;            /* a failed Append/Generate may have changed the
				   * history: GetInfo before the next turn */
	unsigned epoch;           /* bumped when the socket is closed */
};

static struct conn *conns;
static uint32_t ctx_len = 512;
static double t_reply;        /* when the last reply of any connection came */
static double t_end;
static int stopping;          /* past the deadline: no new requests */

static const char *const words[] = { "the", "little", "dog", "ran", "to", "a", "big",
	"tree", "and", "saw", "bird", "sun", "was", "happy", "mom", "said", "play", "ball",
	"Lily", "Tim", "friend", "park", "went", "home", "one", "day" };
#define N_WORDS (sizeof(words) / sizeof(words[0]))

static void random_text(char *buf, size_t cap, int n_words)
{
	size_t len = 0;
	buf[0] = 0;
	for (int i = 0; i < n_words && len + 16 < cap; i++)
		len += (size_t)snprintf(buf + len, cap - len, "%s%s", i ? " " : "",
					words[rnd() % N_WORDS]);
}

static void conn_close_fd(struct conn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	c->epoch++;
	c->in_len = c->out_len = c->out_off = 0;
	c->op = OP_NONE;
}

/* Queue q (with a fresh id) on c; it is written by flush_out. */
static int conn_send(struct conn *c, Llamad__Request *q, enum op op)
{
	PB_SET(q, id, ++c->next_id);
	size_t n = protobuf_c_message_get_packed_size(&q->base);
	size_t need = c->out_len + FRAME_HDR + n;
	if (grow(&c->out, &c->out_cap, need, 1, 1024))
		return -ENOMEM;
	frame_put_len(c->out + c->out_len, (uint32_t)n);
	protobuf_c_message_pack(&q->base, c->out + c->out_len + FRAME_HDR);
	c->out_len = need;
	c->want_id = q->id;
	c->op = op;
	c->t_sent = now_s();
	return 0;
}

/* Write what is queued; 0, or -errno when the connection is broken. */
static int flush_out(struct conn *c)
{
	while (c->out_off < c->out_len) {
		ssize_t k = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
				 MSG_NOSIGNAL | MSG_DONTWAIT);
		if (k < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				return 0;
			return -errno;
		}
		c->out_off += (size_t)k;
	}
	c->out_len = c->out_off = 0;
	return 0;
}

static void send_hello(struct conn *c)
{
	Llamad__Hello h;
	Llamad__Request q;
	hello_request(&h, &q, "llamad-load");
	conn_send(c, &q, OP_HELLO);
}

static void send_open(struct conn *c, int fresh)
{
	if (fresh) {
		c->sess_gen++;
		snprintf(c->sess, sizeof(c->sess), "%s-%d-%d-%d", opt.prefix, (int)getpid(),
			 c->idx, c->sess_gen);
		c->raw = (int)(rnd() & 1);
	}
	Llamad__OpenSession o = LLAMAD__OPEN_SESSION__INIT;
	o.session = c->sess;
	PB_SET(&o, template_, c->raw ? LLAMAD__TEMPLATE__TEMPLATE_RAW
				     : LLAMAD__TEMPLATE__TEMPLATE_LLAMA2);
	PB_SET(&o, context_policy, LLAMAD__CONTEXT_POLICY__CONTEXT_ERROR);
	if (fresh)
		PB_SET(&o, create_only, 1);
	if (fresh && c->sess_gen == 1 && !c->raw && (rnd() & 1))
		o.system = (char *)"You tell short stories.";
	Llamad__Request q = LLAMAD__REQUEST__INIT;
	q.op_case = LLAMAD__REQUEST__OP_OPEN;
	q.open = &o;
	conn_send(c, &q, OP_OPEN);
}

static Llamad__Role turn_role(const struct conn *c)
{
	return c->raw ? LLAMAD__ROLE__ROLE_RAW : LLAMAD__ROLE__ROLE_USER;
}

static void send_append(struct conn *c)
{
	char text[256];
	random_text(text, sizeof(text), rnd_in(3, 15));
	Llamad__Append a = LLAMAD__APPEND__INIT;
	a.session = c->sess;
	PB_SET(&a, role, turn_role(c));
	a.text = text;
	Llamad__Request q = LLAMAD__REQUEST__INIT;
	q.op_case = LLAMAD__REQUEST__OP_APPEND;
	q.append = &a;
	conn_send(c, &q, OP_APPEND);
}

static void send_generate(struct conn *c, int with_prompt)
{
	char text[256];
	Llamad__Generate g = LLAMAD__GENERATE__INIT;
	Llamad__SamplerOptions so = LLAMAD__SAMPLER_OPTIONS__INIT;
	char *stop[1] = { (char *)" the " };
	g.session = c->sess;
	if (with_prompt) {
		random_text(text, sizeof(text), rnd_in(3, 15));
		g.prompt = text;
		PB_SET(&g, role, turn_role(c));
	}
	c->max_tokens = (uint32_t)rnd_in(opt.min_tokens, opt.max_tokens);
	PB_SET(&g, max_tokens, c->max_tokens);
	if (rnd() % 4 == 0) {
		PB_SET(&so, temperature, 0);
	} else {
		PB_SET(&so, temperature, 0.8f);
		PB_SET(&so, seed, rnd());
	}
	g.sampler = &so;
	if (rnd() % 8 == 0) {
		g.n_stop = 1;
		g.stop = stop;
	}
	Llamad__Request q = LLAMAD__REQUEST__INIT;
	q.op_case = LLAMAD__REQUEST__OP_GENERATE;
	q.generate = &g;
	c->n_tok = 0;
	c->done_seen = 0;
	c->disconnect_at = opt.disconnect_rate > 0 && rnd01() < opt.disconnect_rate
				   ? rnd_in(1, (int)c->max_tokens - 1) : -1;
	conn_send(c, &q, OP_GENERATE);
	st.generations++;
}

static void send_simple(struct conn *c, enum op op)
{
	Llamad__Request q = LLAMAD__REQUEST__INIT;
	Llamad__Drop d = LLAMAD__DROP__INIT;
	Llamad__GetInfo gi = LLAMAD__GET_INFO__INIT;
	Llamad__Save sv = LLAMAD__SAVE__INIT;
	if (op == OP_DROP) {
		d.session = c->sess;
		q.op_case = LLAMAD__REQUEST__OP_DROP;
		q.drop = &d;
		if (saved_log) {  /* before sending: the file may go at once */
			fprintf(saved_log, "drop %s\n", c->sess);
			fflush(saved_log);
		}
	} else if (op == OP_INFO) {
		gi.session = c->sess;
		q.op_case = LLAMAD__REQUEST__OP_INFO;
		q.info = &gi;
	} else {
		sv.session = c->sess;
		q.op_case = LLAMAD__REQUEST__OP_SAVE;
		q.save = &sv;
	}
	conn_send(c, &q, op);
}

/* The next request of an idle connection. */
static void next_request(struct conn *c)
{
	if (!c->sess_open) {
		send_open(c, !c->reconnecting);
		return;
	}
	if (c->need_info) {
		send_simple(c, OP_INFO);
		return;
	}
	/* a new session before this one could fill up: a turn is at most ~60
	 * tokens with the template, then the answer */
	uint32_t room = (uint32_t)opt.max_tokens + 100;
	if (c->sess_tokens + room > ctx_len || rnd() % 50 == 0) {
		send_simple(c, OP_DROP);
		return;
	}
	if (rnd() % 40 == 0) {
		send_simple(c, OP_INFO);
		return;
	}
	if (rnd() & 1) {
		c->gen_after_append = 1;
		send_append(c);
	} else {
		send_generate(c, 1);
	}
}

static int conn_connect(struct conn *c)
{
	int fd = dial();
	if (fd < 0)
		return fd;
	set_nonblock(fd);
	c->fd = fd;
	c->in_len = c->out_len = c->out_off = 0;
	c->op = OP_NONE;
	send_hello(c);
	return 0;
}

/* Abrupt close in the middle of a stream, then a new connection. */
static void disconnect_and_reconnect(struct conn *c)
{
	st.disconnects++;
	conn_close_fd(c);
	c->sess_open = 0;
	c->reconnecting = 1;
	if (conn_connect(c) == 0)
		st.reconnects++;
	else if (opt.expect_kill)
		st.daemon_gone = 1;
	else
		violation(c->idx, "cannot reconnect: %s", strerror(errno));
}

static void count_error(struct conn *c, enum op op, const Llamad__Error *e)
{
	int code = e->has_code ? (int)e->code : 0;
	if (code < 0 || code > 163 || (code >= 64 && code < 100))
		code = 0;  /* unknown codes are counted as 0 */
	st.errors[CODE_SLOT(code)]++;
	st.requests++;
	if (op == OP_APPEND || op == OP_GENERATE)
		c->need_info = 1;  /* it may have ended midway, its text kept */
	if (code == LLAMAD__ERROR_CODE__BUSY || code == LLAMAD__ERROR_CODE__RESOURCE_EXHAUSTED) {
		st.busy_retries++;
		c->wake = now_s() + 0.01 + rnd01() * 0.04;
		return;
	}
	if (st.errors[CODE_SLOT(code)] <= 5)
		fprintf(stderr, "llamad-load: connection %d, %s on %s: %s (%s)\n", c->idx,
			frame_error_name(code), op_name[op], e->message ? e->message : "",
			c->sess);
	/* keep going on a fresh session */
	c->sess_open = 0;
	c->reconnecting = 0;
	c->wake = now_s() + 0.05;
}

/* One reply for c. */
static void on_response(struct conn *c, Llamad__Response *r)
{
	double t = now_s();
	t_reply = t;
	if (c->op == OP_NONE || r->id != c->want_id) {
		violation(c->idx, "reply id %llu (body %d), expected %llu (%s)",
			  (unsigned long long)r->id, r->body_case,
			  (unsigned long long)c->want_id, op_name[c->op]);
		return;
	}
	enum op op = c->op;
	if (r->body_case == LLAMAD__RESPONSE__BODY_ERROR) {
		if (op == OP_GENERATE && c->done_seen)
			violation(c->idx, "error after Done");
		c->op = OP_NONE;
		c->gen_after_append = 0;
		count_error(c, op, r->error);
		return;
	}
	if (op == OP_GENERATE) {
		if (r->body_case == LLAMAD__RESPONSE__BODY_TOKEN) {
			const Llamad__TokenEvent *ev = r->token;
			if (ev->text && !valid_utf8(ev->text))
				violation(c->idx, "token text is not UTF-8");
			if (ev->n_tokens) {
				if (c->n_tok == 0)
					sample_add(&first_lat, t - c->t_sent);
				else
					sample_add(&token_lat, (t - c->t_last) / (double)ev->n_tokens);
				c->t_last = t;
				c->n_tok += (int)ev->n_tokens;
				st.tokens += ev->n_tokens;
			}
			if ((uint32_t)c->n_tok > c->max_tokens)
				violation(c->idx, "%d tokens streamed, max_tokens %u", c->n_tok,
					  c->max_tokens);
			if (c->disconnect_at >= 0 && c->n_tok >= c->disconnect_at)
				disconnect_and_reconnect(c);
			return;
		}
		if (r->body_case != LLAMAD__RESPONSE__BODY_DONE) {
			violation(c->idx, "generate answered with body %d", r->body_case);
			c->op = OP_NONE;
			return;
		}
		const Llamad__Done *d = r->done;
		uint32_t g = d->generated_tokens;
		int eos = d->reason == LLAMAD__STOP_REASON__STOP_EOS;
		if (!(g == (uint32_t)c->n_tok || (eos && g == (uint32_t)c->n_tok + 1)))
			violation(c->idx, "Done says %u tokens, %d streamed (reason %d)", g, c->n_tok,
				  d->reason);
		if (g > c->max_tokens)
			violation(c->idx, "Done: %u tokens > max_tokens %u", g, c->max_tokens);
		if (d->reason < LLAMAD__STOP_REASON__STOP_EOS ||
		    d->reason > LLAMAD__STOP_REASON__STOP_CONTEXT_FULL)
			violation(c->idx, "Done with reason %d", d->reason);
		if (d->reason == LLAMAD__STOP_REASON__STOP_MAX_TOKENS && g != c->max_tokens)
			violation(c->idx, "max_tokens stop after %u of %u", g, c->max_tokens);
		c->sess_tokens = d->session_tokens;
		c->done_seen = 1;
		st.requests++;
		c->op = OP_NONE;
		if (opt.save_rate > 0 && rnd01() < opt.save_rate)
			send_simple(c, OP_SAVE);
		return;
	}
	c->op = OP_NONE;
	st.requests++;
	switch (op) {
	case OP_HELLO:
		if (r->body_case != LLAMAD__RESPONSE__BODY_HELLO ||
		    r->hello->protocol_version != LLAMAD_PROTOCOL_VERSION) {
			violation(c->idx, "bad Hello reply (body %d)", r->body_case);
			break;
		}
		if (r->hello->context_length)
			ctx_len = r->hello->context_length;
		break;
	case OP_OPEN:
	case OP_APPEND:
	case OP_INFO:
		if (r->body_case != LLAMAD__RESPONSE__BODY_SESSION || !r->session->session ||
		    strcmp(r->session->session, c->sess) != 0) {
			violation(c->idx, "%s answered with body %d", op_name[op], r->body_case);
			break;
		}
		c->sess_tokens = r->session->tokens;
		if (op == OP_INFO)
			c->need_info = 0;
		if (op == OP_OPEN) {
			if (!c->reconnecting && !r->session->created)
				violation(c->idx, "create_only open of %s did not create it", c->sess);
			st.sessions_created += r->session->created;
			c->sess_open = 1;
			c->reconnecting = 0;
			c->need_info = 0;
		} else if (op == OP_APPEND) {
			if (!r->session->tokens_added)
				violation(c->idx, "append added no tokens");
			if (c->gen_after_append) {
				c->gen_after_append = 0;
				send_generate(c, 0);
			}
		}
		break;
	case OP_DROP:
		if (r->body_case != LLAMAD__RESPONSE__BODY_OK)
			violation(c->idx, "drop answered with body %d", r->body_case);
		st.sessions_dropped++;
		c->sess_open = 0;
		break;
	case OP_SAVE:
		if (r->body_case != LLAMAD__RESPONSE__BODY_SAVED) {
			violation(c->idx, "save answered with body %d", r->body_case);
			break;
		}
		st.saves++;
		if (saved_log && r->saved->sessions >= 1) {
			fprintf(saved_log, "saved %s %u\n", c->sess, c->sess_tokens);
			fflush(saved_log);
		}
		break;
	default:
		break;
	}
}

/* Read and handle what c has; 0, or -1 if the connection ended. */
static int conn_read(struct conn *c)
{
	for (;;) {
		if (c->in_cap - c->in_len < 65536) {
			size_t cap = c->in_cap ? c->in_cap * 2 : 131072;
			uint8_t *p = realloc(c->in, cap);
			if (!p)
				return -1;
			c->in = p;
			c->in_cap = cap;
		}
		ssize_t k = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, MSG_DONTWAIT);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && errno == EAGAIN)
			return 0;
		if (k <= 0) {
			if (c->in_len)
				violation(c->idx, "stream ended inside a frame");
			return -1;
		}
		c->in_len += (size_t)k;
		size_t off = 0;
		while (c->in_len - off >= FRAME_HDR) {
			uint32_t n = frame_get_len(c->in + off);
			if (n > RECV_MAX) {
				violation(c->idx, "frame of %u bytes", n);
				return -1;
			}
			if (c->in_len - off < FRAME_HDR + (size_t)n)
				break;
			Llamad__Response *r = llamad__response__unpack(NULL, n, c->in + off + FRAME_HDR);
			off += FRAME_HDR + n;
			if (!r) {
				violation(c->idx, "a frame that is not a Response");
				continue;
			}
			unsigned epoch = c->epoch;
			on_response(c, r);
			llamad__response__free_unpacked(r, NULL);
			if (c->epoch != epoch)
				return 0;  /* closed on purpose and reconnected: old input gone */
		}
		memmove(c->in, c->in + off, c->in_len - off);
		c->in_len -= off;
	}
}

/* ---- idle and half-frame connections ------------------------------------- */

struct side {
	int fd;
	double opened, closed;    /* closed: when the daemon closed it (0: open) */
	size_t got;               /* bytes the daemon sent */
};
static struct side *idles, *halves;
static int n_idles, n_halves;

static int open_side(struct side *s, int half)
{
	s->fd = dial();
	if (s->fd < 0)
		return s->fd;
	s->opened = now_s();
	s->closed = 0;
	s->got = 0;
	if (half) {
		uint8_t buf[FRAME_HDR + 10];
		frame_put_len(buf, 1000);
		memset(buf + FRAME_HDR, 0x08, 10);  /* field 1 varints: a Request id, ... */
		if (frame_write_all(s->fd, buf, sizeof(buf)) != 0)
			return -EPIPE;
	}
	return 0;
}

static void check_sides(struct side *v, int n)
{
	double t = now_s();
	for (int i = 0; i < n; i++)
		if (v[i].fd >= 0 && !v[i].closed && peer_closed(v[i].fd, &v[i].got))
			v[i].closed = t;
}

static int count_closed(const struct side *v, int n)
{
	int k = 0;
	for (int i = 0; i < n; i++)
		k += v[i].fd < 0 || v[i].closed > 0;
	return k;
}

/* ---- the load run ------------------------------------------------------------ */

static int run_load(void)
{
	char status_line[160];
	if (probe(status_line, sizeof(status_line)) != 0) {
		fprintf(stderr, "llamad-load: no daemon answers on %s\n", opt.socket);
		return 3;
	}
	if (opt.saved_log) {
		saved_log = fopen(opt.saved_log, "a");
		if (!saved_log) {
			fprintf(stderr, "llamad-load: %s: %s\n", opt.saved_log, strerror(errno));
			return 2;
		}
	}
	idles = calloc((size_t)opt.idle + 1, sizeof(*idles));
	halves = calloc((size_t)opt.half_frames + 1, sizeof(*halves));
	conns = calloc((size_t)opt.conns, sizeof(*conns));
	struct pollfd *pfd = calloc((size_t)opt.conns, sizeof(*pfd));
	if (!idles || !halves || !conns || !pfd) {
		fprintf(stderr, "llamad-load: out of memory\n");
		return 1;
	}
	int setup_failed = 0;
	for (int i = 0; i < opt.half_frames; i++, n_halves++)
		if (open_side(&halves[i], 1) != 0) {
			fprintf(stderr, "llamad-load: half-frame connection %d: %s\n", i,
				strerror(errno));
			setup_failed = 1;
			break;
		}
	for (int i = 0; i < opt.idle && !setup_failed; i++, n_idles++)
		if (open_side(&idles[i], 0) != 0) {
			fprintf(stderr, "llamad-load: idle connection %d: %s\n", i, strerror(errno));
			setup_failed = 1;
			break;
		}
	double t0 = now_s();
	t_end = t0 + opt.seconds;
	for (int i = 0; i < opt.conns; i++) {
		conns[i].idx = i;
		conns[i].fd = -1;
		if (!setup_failed && conn_connect(&conns[i]) != 0) {
			fprintf(stderr, "llamad-load: connection %d: %s\n", i, strerror(errno));
			setup_failed = 1;
		}
	}
	double t_check = 0, grace_end = t_end + 30, max_stall = 0;
	int active = opt.conns;
	t_reply = t0;
	while (!setup_failed && active > 0 && !st.daemon_gone) {
		double t = now_s();
		if (t >= t_end)
			stopping = 1;
		if (t >= grace_end) {
			fprintf(stderr, "llamad-load: requests still unanswered 30 s after the end\n");
			for (int i = 0; i < opt.conns; i++)
				if (conns[i].fd >= 0 && conns[i].op != OP_NONE)
					violation(i, "%s unanswered", op_name[conns[i].op]);
			break;
		}
		if (t >= t_check) {
			check_sides(idles, n_idles);
			check_sides(halves, n_halves);
			t_check = t + 0.25;
		}
		int timeout = 50, waiting = 0;
		active = 0;
		for (int i = 0; i < opt.conns; i++) {
			struct conn *c = &conns[i];
			pfd[i].fd = -1;
			if (c->fd < 0)
				continue;
			if (c->op == OP_NONE && c->out_len == 0) {
				if (stopping) {
					conn_close_fd(c);
					continue;
				}
				if (t < c->wake) {
					int ms = (int)((c->wake - t) * 1e3) + 1;
					timeout = ms < timeout ? ms : timeout;
				} else {
					next_request(c);
				}
			}
			if (c->out_len && flush_out(c) != 0) {
				if (opt.expect_kill) {
					st.daemon_gone = 1;
				} else {
					st.conn_lost++;
					violation(i, "write failed during %s", op_name[c->op]);
				}
				conn_close_fd(c);
				continue;
			}
			active++;
			waiting += c->op != OP_NONE;
			pfd[i].fd = c->fd;
			pfd[i].events = POLLIN | (c->out_len ? POLLOUT : 0);
		}
		if (!active)
			break;
		/* the longest time requests were in flight and nothing came back */
		if (waiting && t - t_reply > max_stall)
			max_stall = t - t_reply;
		if (!waiting)
			t_reply = t;
		int n = poll(pfd, (nfds_t)opt.conns, timeout);
		if (n < 0 && errno != EINTR) {
			perror("llamad-load: poll");
			return 1;
		}
		for (int i = 0; i < opt.conns && n > 0; i++) {
			struct conn *c = &conns[i];
			if (pfd[i].fd < 0 || !pfd[i].revents || pfd[i].fd != c->fd)
				continue;
			if (pfd[i].revents & (POLLIN | POLLHUP | POLLERR)) {
				if (conn_read(c) != 0) {
					if (opt.expect_kill) {
						st.daemon_gone = 1;
					} else {
						st.conn_lost++;
						violation(i, "the daemon closed the connection (%s in "
							  "flight)", op_name[c->op]);
					}
					conn_close_fd(c);
				}
			}
		}
	}
	double elapsed = now_s() - t0;
	int active_secs_ok = elapsed > 0;
	/* what the idle connections saw during the run */
	check_sides(idles, n_idles);
	check_sides(halves, n_halves);
	int idle_closed = count_closed(idles, n_idles);
	int half_closed_run = count_closed(halves, n_halves);
	/* stalled half frames: wait for the daemon to close them */
	double wait_end = now_s() + opt.half_frame_wait;
	while (opt.half_frame_wait > 0 && count_closed(halves, n_halves) < n_halves &&
	       now_s() < wait_end) {
		usleep(100000);
		check_sides(halves, n_halves);
	}
	int half_closed = count_closed(halves, n_halves);
	double half_max_s = 0;
	size_t half_got = 0;
	for (int i = 0; i < n_halves; i++) {
		if (halves[i].closed > 0 && halves[i].closed - halves[i].opened > half_max_s)
			half_max_s = halves[i].closed - halves[i].opened;
		half_got += halves[i].got;
	}
	size_t idle_got = 0;
	for (int i = 0; i < n_idles; i++)
		idle_got += idles[i].got;
	int served = !st.daemon_gone && probe(status_line, sizeof(status_line)) == 0;
	int dropped = 0;
	if (served && !opt.keep_sessions) {
		char pfx[96];
		snprintf(pfx, sizeof(pfx), "%s-%d-", opt.prefix, (int)getpid());
		dropped = drop_all(pfx);
	}
	for (int i = 0; i < n_idles; i++)
		if (idles[i].fd >= 0)
			close(idles[i].fd);
	for (int i = 0; i < n_halves; i++)
		if (halves[i].fd >= 0)
			close(halves[i].fd);
	for (int i = 0; i < opt.conns; i++) {
		conn_close_fd(&conns[i]);
		free(conns[i].in);
		free(conns[i].out);
	}

	/* ---- report ---- */
	uint64_t bad = 0, allowed = 0;
	char errs[512] = "", names[512] = "";
	size_t el = 0, nl = 0;
	for (int code = 0; code < 164; code++) {
		if (code >= 64 && code < 100)
			continue;
		uint64_t k = st.errors[CODE_SLOT(code)];
		if (!k)
			continue;
		if (code == LLAMAD__ERROR_CODE__BUSY || code == LLAMAD__ERROR_CODE__RESOURCE_EXHAUSTED)
			allowed += k;
		else
			bad += k;
		el += (size_t)snprintf(errs + el, sizeof(errs) - el, "%serr_%d=%llu",
				       el ? " " : "", code, (unsigned long long)k);
		if (el >= sizeof(errs))
			el = sizeof(errs) - 1;
		nl += (size_t)snprintf(names + nl, sizeof(names) - nl, "%s%s %llu", nl ? ", " : "",
				       frame_error_name(code), (unsigned long long)k);
		if (nl >= sizeof(names))
			nl = sizeof(names) - 1;
	}
	double fl50 = quantile(&first_lat, 0.5) * 1e3, fl99 = quantile(&first_lat, 0.99) * 1e3;
	double tl50 = quantile(&token_lat, 0.5) * 1e3, tl99 = quantile(&token_lat, 0.99) * 1e3;
	double tok_s = active_secs_ok ? (double)st.tokens / elapsed : 0;
	printf("connections %d active, %d idle (%d closed by the daemon during the run), "
	       "%d half-frame (%d closed during the run, %d after %.0f s more)\n",
	       opt.conns, n_idles, idle_closed, n_halves, half_closed_run, half_closed,
	       opt.half_frame_wait);
	printf("requests %llu, generations %llu, tokens %llu in %.1f s = %.0f tok/s\n",
	       (unsigned long long)st.requests, (unsigned long long)st.generations,
	       (unsigned long long)st.tokens, elapsed, tok_s);
	printf("first token p50 %.1f ms p99 %.1f ms; per token p50 %.2f ms p99 %.2f ms\n",
	       fl50, fl99, tl50, tl99);
	printf("errors: %s (allowed busy/exhausted %llu, other %llu); violations %llu; "
	       "disconnects %llu, reconnects %llu; sessions created %llu dropped %llu "
	       "(+%d at the end); saves %llu\n", nl ? names : "none",
	       (unsigned long long)allowed, (unsigned long long)bad,
	       (unsigned long long)st.violations, (unsigned long long)st.disconnects,
	       (unsigned long long)st.reconnects, (unsigned long long)st.sessions_created,
	       (unsigned long long)st.sessions_dropped, dropped < 0 ? 0 : dropped,
	       (unsigned long long)st.saves);
	printf("daemon %s%s; longest time with requests in flight and no reply: %.0f ms\n",
	       served ? "served to the end" : "STOPPED serving",
	       st.daemon_gone ? " (gone, as expected)" : "", max_stall * 1e3);
	printf("load: conns=%d seconds=%.2f requests=%llu generations=%llu tokens=%llu "
	       "tok_s=%.1f first_p50_ms=%.2f first_p99_ms=%.2f token_p50_ms=%.3f "
	       "token_p99_ms=%.3f errors=%llu errors_allowed=%llu violations=%llu "
	       "conn_lost=%llu disconnects=%llu reconnects=%llu sessions_created=%llu "
	       "saves=%llu idle=%d idle_closed=%d idle_bytes=%zu half_frames=%d "
	       "half_closed=%d half_max_s=%.1f half_bytes=%zu served=%d max_stall_ms=%.0f "
	       "daemon_gone=%d dropped_at_end=%d %s%s%s\n",
	       opt.conns, elapsed, (unsigned long long)st.requests,
	       (unsigned long long)st.generations, (unsigned long long)st.tokens, tok_s, fl50,
	       fl99, tl50, tl99, (unsigned long long)bad, (unsigned long long)allowed,
	       (unsigned long long)st.violations, (unsigned long long)st.conn_lost,
	       (unsigned long long)st.disconnects, (unsigned long long)st.reconnects,
	       (unsigned long long)st.sessions_created, (unsigned long long)st.saves, n_idles,
	       idle_closed, idle_got, n_halves, half_closed, half_max_s, half_got, served,
	       max_stall * 1e3, st.daemon_gone, dropped, status_line, el ? " " : "", errs);
	free(pfd);
	free(conns);
	free(idles);
	free(halves);
	free(first_lat.v);
	free(token_lat.v);
	if (saved_log)
		fclose(saved_log);
	int fail = setup_failed || bad || st.violations || (!served && !opt.expect_kill) ||
		   (max_stall > STALL_MAX_S && !st.daemon_gone) ||
		   (opt.half_frame_wait > 0 && half_closed < n_halves) || dropped < 0 ||
		   st.requests == 0;
	return fail ? 1 : 0;
}

/* ---- --check-saved --------------------------------------------------------------- */

struct saved_rec {
	char name[130];
	long tokens;              /* -1: dropped after its last save */
};

static int check_saved(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		fprintf(stderr, "llamad-load: %s: %s\n", path, strerror(errno));
		return 2;
	}
	struct saved_rec *recs = NULL;
	size_t n = 0, cap = 0;
	char line[256], what[16], name[130];
	long tok;
	while (fgets(line, sizeof(line), f)) {
		int k = sscanf(line, "%15s %129s %ld", what, name, &tok);
		if (k < 2)
			continue;
		long v = !strcmp(what, "saved") && k == 3 ? tok : -1;
		size_t i;
		for (i = 0; i < n && strcmp(recs[i].name, name) != 0; i++)
			;
		if (i == n) {
			if (n == cap) {
				cap = cap ? cap * 2 : 64;
				struct saved_rec *p = realloc(recs, cap * sizeof(*p));
				if (!p) {
					fclose(f);
					free(recs);
					return 1;
				}
				recs = p;
			}
			snprintf(recs[n].name, sizeof(recs[n].name), "%s", name);
			n++;
		}
		recs[i].tokens = v;
	}
	fclose(f);
	int fd = dial();
	if (fd < 0) {
		fprintf(stderr, "llamad-load: no daemon answers on %s\n", opt.socket);
		free(recs);
		return 3;
	}
	int expected = 0, found = 0, missing = 0, short_ = 0, generated = 0, gen_failed = 0;
	for (size_t i = 0; i < n; i++) {
		if (recs[i].tokens < 0)
			continue;
		expected++;
		Llamad__GetInfo gi = LLAMAD__GET_INFO__INIT;
		gi.session = recs[i].name;
		Llamad__Request q = LLAMAD__REQUEST__INIT;
		q.op_case = LLAMAD__REQUEST__OP_INFO;
		q.info = &gi;
		Llamad__Response *r = blk_call(fd, &q, 10000, NULL);
		if (!r || is_error(r)) {
			missing++;
			fprintf(stderr, "llamad-load: saved session %s (%ld tokens) did not come "
				"back: %s\n", recs[i].name, recs[i].tokens,
				r ? r->error->message : "no reply");
		} else if ((long)r->session->tokens < recs[i].tokens) {
			short_++;
			fprintf(stderr, "llamad-load: session %s came back with %u tokens, saved "
				"with %ld\n", recs[i].name, r->session->tokens, recs[i].tokens);
		} else {
			found++;
		}
		if (r)
			llamad__response__free_unpacked(r, NULL);
		if (generated + gen_failed >= 8)
			continue;
		/* a restored session still generates */
		Llamad__Generate g = LLAMAD__GENERATE__INIT;
		Llamad__SamplerOptions so = LLAMAD__SAMPLER_OPTIONS__INIT;
		PB_SET(&so, temperature, 0);
		g.session = recs[i].name;
		g.sampler = &so;
		PB_SET(&g, max_tokens, 4);
		Llamad__Request qg = LLAMAD__REQUEST__INIT;
		qg.op_case = LLAMAD__REQUEST__OP_GENERATE;
		qg.generate = &g;
		int nt = 0;
		r = blk_call(fd, &qg, 10000, &nt);
		if (r && r->body_case == LLAMAD__RESPONSE__BODY_DONE) {
			generated++;
		} else {
			gen_failed++;
			fprintf(stderr, "llamad-load: restored %s does not generate: %s\n",
				recs[i].name, r && is_error(r) ? r->error->message : "no reply");
		}
		if (r)
			llamad__response__free_unpacked(r, NULL);
	}
	close(fd);
	free(recs);
	printf("check-saved: expected=%d found=%d missing=%d short=%d generated=%d "
	       "gen_failed=%d\n", expected, found, missing, short_, generated, gen_failed);
	return expected > 0 && !missing && !short_ && !gen_failed ? 0 : 1;
}

/* ---- main -------------------------------------------------------------------------- */

static int usage(void)
{
	fputs("usage: llamad-load --socket PATH [--conns N] [--seconds S] [--idle N]\n"
	      "         [--half-frames N] [--half-frame-wait S] [--disconnect-rate P]\n"
	      "         [--save-rate P] [--saved-log FILE] [--min-tokens N] [--max-tokens N]\n"
	      "         [--seed N] [--prefix NAME] [--keep-sessions] [--expect-kill]\n"
	      "       llamad-load --socket PATH --cleanup\n"
	      "       llamad-load --socket PATH --check-saved FILE\n", stderr);
	return 2;
}

int main(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		int flag = 1;
		if (!strcmp(a, "--keep-sessions"))
			opt.keep_sessions = 1;
		else if (!strcmp(a, "--expect-kill"))
			opt.expect_kill = 1;
		else if (!strcmp(a, "--cleanup"))
			opt.cleanup = 1;
		else if (!strcmp(a, "-h") || !strcmp(a, "--help"))
			return usage(), 0;
		else
			flag = 0;
		if (flag)
			continue;
		if (!v)
			return usage();
		char *end;
		double d = strtod(v, &end);
		int num = *v && !*end;
		if (!strcmp(a, "--socket"))
			opt.socket = v;
		else if (!strcmp(a, "--prefix"))
			opt.prefix = v;
		else if (!strcmp(a, "--saved-log"))
			opt.saved_log = v;
		else if (!strcmp(a, "--check-saved"))
			opt.check_saved = v;
		else if (!num)
			return fprintf(stderr, "llamad-load: %s wants a number\n", a), usage();
		else if (!strcmp(a, "--conns") && d >= 1 && d <= 100000)
			opt.conns = (int)d;
		else if (!strcmp(a, "--seconds") && d > 0)
			opt.seconds = d;
		else if (!strcmp(a, "--idle") && d >= 0 && d <= 1e6)
			opt.idle = (int)d;
		else if (!strcmp(a, "--half-frames") && d >= 0 && d <= 1e6)
			opt.half_frames = (int)d;
		else if (!strcmp(a, "--half-frame-wait") && d >= 0)
			opt.half_frame_wait = d;
		else if (!strcmp(a, "--disconnect-rate") && d >= 0 && d <= 1)
			opt.disconnect_rate = d;
		else if (!strcmp(a, "--save-rate") && d >= 0 && d <= 1)
			opt.save_rate = d;
		else if (!strcmp(a, "--min-tokens") && d >= 2 && d <= 4096)
			opt.min_tokens = (int)d;
		else if (!strcmp(a, "--max-tokens") && d >= 2 && d <= 4096)
			opt.max_tokens = (int)d;
		else if (!strcmp(a, "--seed"))
			opt.seed = (uint64_t)d;
		else
			return fprintf(stderr, "llamad-load: bad option %s %s\n", a, v), usage();
		i++;
	}
	if (!opt.socket || opt.min_tokens > opt.max_tokens)
		return usage();
	signal(SIGPIPE, SIG_IGN);
	if (opt.cleanup) {
		int n = drop_all(NULL);
		printf("cleanup: dropped=%d\n", n);
		return n < 0 ? 1 : 0;
	}
	if (opt.check_saved)
		return check_saved(opt.check_saved);
	if (!opt.seed)
		opt.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
	rng_state = opt.seed | 1;
	printf("llamad-load: seed %llu\n", (unsigned long long)opt.seed);
	fflush(stdout);
	return run_load();
}

/*
 * tests/unit/daemon_client.h — the protocol client the daemon tests share:
 * send a request, read replies until the one for an id, keeping the others
 * for later, and collect a generation's streamed replies. Include after
 * <cmocka.h> and proto/frame.h, with WAIT_MS (the longest wait for one
 * reply) and RECV_MAX (largest frame) defined.
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
	/* corked (cli_cork): requests are kept here and written all at once
	 * by cli_uncork, so that the daemon reads them in one go */
	int corked;
	uint8_t *cork;
	size_t cork_len;
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

/* A Request for op_case (no id yet; the caller sets its body). */
static inline Llamad__Request request_of(Llamad__Request__OpCase op_case)
{
	Llamad__Request q = LLAMAD__REQUEST__INIT;
	q.op_case = op_case;
	return q;
}

static inline uint64_t cli_send(struct cli *c, Llamad__Request *q)
{
	q->has_id = 1;
	q->id = ++c->next_id;
	if (c->corked) {
		uint8_t *f;
		size_t n;
		if (frame_pack(&q->base, &f, &n) != 0)
			fail_msg("out of memory");
		c->cork = realloc(c->cork, c->cork_len + n);
		assert_non_null(c->cork);
		memcpy(c->cork + c->cork_len, f, n);
		c->cork_len += n;
		free(f);
		return q->id;
	}
	int rc = frame_send(c->fd, &q->base);
	if (rc)
		fail_msg("send: %s", strerror(-rc));
	return q->id;
}

/* Keep the requests sent from now on, until cli_uncork writes them all in
 * one write. */
static inline void cli_cork(struct cli *c)
{
	c->corked = 1;
}

static inline void cli_uncork(struct cli *c)
{
	c->corked = 0;
	int rc = frame_write_all(c->fd, c->cork, c->cork_len);
	if (rc)
		fail_msg("send: %s", strerror(-rc));
	free(c->cork);
	c->cork = NULL;
	c->cork_len = 0;
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

/* ---- generations ---- */

/* What to ask of a Generate. */
struct genopt {
	const char *prompt;      /* NULL: none */
	int role;                /* -1: default */
	uint32_t max_tokens;     /* 0: default */
	float temperature;       /* < 0: default; 0: greedy */
	int64_t seed;            /* < 0: unset */
};

#define GREEDY(p, n) ((struct genopt){ (p), -1, (n), 0.0f, -1 })

static inline uint64_t gen_send(struct cli *c, const char *name, struct genopt o)
{
	Llamad__SamplerOptions so = LLAMAD__SAMPLER_OPTIONS__INIT;
	so.has_temperature = o.temperature >= 0;
	so.temperature = o.temperature;
	so.has_seed = o.seed >= 0;
	so.seed = (uint64_t)o.seed;
	Llamad__Generate g = LLAMAD__GENERATE__INIT;
	g.session = (char *)name;
	g.prompt = (char *)o.prompt;
	g.has_role = o.role >= 0;
	g.role = o.role;
	g.has_max_tokens = o.max_tokens > 0;
	g.max_tokens = o.max_tokens;
	g.sampler = &so;
	Llamad__Request q = request_of(LLAMAD__REQUEST__OP_GENERATE);
	q.generate = &g;
	return cli_send(c, &q);
}

struct gen {
	char *text;
	size_t len;
	uint32_t *toks;
	size_t n, events;
	int error;               /* 0: ended with Done */
	char msg[256];
	int reason;
	uint32_t prompt_tokens, shared_tokens, generated, session_tokens, context_tokens;
	int has_dropped;         /* Done said what a shift removed */
	uint32_t dropped_turns, dropped_tokens, slid_tokens;
};

static inline void gen_free(struct gen *g)
{
	free(g->text);
	free(g->toks);
	memset(g, 0, sizeof(*g));
}

/* Fold one reply of a generation into g; 1 once it was the terminal one. */
static inline int gen_take(struct gen *g, Llamad__Response *r)
{
	int done = 1;
	if (r->body_case == LLAMAD__RESPONSE__BODY_TOKEN) {
		Llamad__TokenEvent *t = r->token;
		size_t tl = t->text ? strlen(t->text) : 0;
		g->text = realloc(g->text, g->len + tl + 1);
		g->toks = realloc(g->toks, (g->n + t->n_tokens + 1) * sizeof(uint32_t));
		assert_non_null(g->text);
		assert_non_null(g->toks);
		memcpy(g->text + g->len, t->text ? t->text : "", tl);
		g->len += tl;
		g->text[g->len] = 0;
		if (t->n_tokens)
			memcpy(g->toks + g->n, t->tokens, t->n_tokens * sizeof(uint32_t));
		g->n += t->n_tokens;
		g->events++;
		done = 0;
	} else if (r->body_case == LLAMAD__RESPONSE__BODY_DONE) {
		g->reason = r->done->reason;
		g->prompt_tokens = r->done->prompt_tokens;
		g->shared_tokens = r->done->shared_tokens;
		g->context_tokens = r->done->context_tokens;
		g->generated = r->done->generated_tokens;
		g->session_tokens = r->done->session_tokens;
		g->has_dropped = r->done->has_dropped_turns && r->done->has_dropped_tokens &&
				 r->done->has_slid_tokens;
		g->dropped_turns = r->done->dropped_turns;
		g->dropped_tokens = r->done->dropped_tokens;
		g->slid_tokens = r->done->slid_tokens;
	} else if (r->body_case == LLAMAD__RESPONSE__BODY_ERROR) {
		g->error = r->error->code;
		snprintf(g->msg, sizeof(g->msg), "%s", r->error->message ? r->error->message : "");
	} else {
		fail_msg("unexpected reply to a generate: %s", body_name(r));
	}
	rfree(r);
	if (!g->text)
		g->text = calloc(1, 1);
	return done;
}

#endif

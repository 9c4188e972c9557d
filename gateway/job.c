/*
 * gateway/job.c — one generation request, from its parsed body to the
 * last byte of its answer: a small state machine over one connection to
 * the model's llamad.
 *
 *   HELLO -> (drop the caller's least recently used session if over
 *   --max-conversations) -> OPEN a new session | FORK a held one and
 *   REWIND it | use a held one as it is -> APPEND the messages it lacks
 *   but the last -> GENERATE with the last as its prompt -> stream ->
 *   index the session's turns (conv.h) -> done.
 *
 * The sessions it makes use the context policy shift, as llamactl chat's
 * do: a history resent longer than the context loses its oldest exchanges
 * (the system prompt stays) and is answered. Headers wait for the first
 * token (or the Done), so that a request llamad refuses gets its HTTP
 * status, streamed or not.
 *
 * Raw prompts (/v1/completions, /api/generate with raw) run in an
 * ephemeral session of the raw template, dropped when the connection
 * closes. X-Llamad-Session names a session the client keeps itself: it is
 * opened (made when missing, with shift) and only the newest message is
 * sent.
 *
 * A client that goes away mid-stream cancels the generation (Cancel, then
 * the Done is awaited so the session's turns are known); a stalled one
 * times out in libevent (--timeout) and is treated the same.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "gateway/conn.h"
#include "gateway/http_int.h"
#include "gateway/render.h"
#include "util/clock.h"

enum step {
	ST_HELLO, ST_LIST, ST_TRANSCRIPT, ST_DROP_OLD, ST_OPEN, ST_FORK, ST_REWIND, ST_APPEND, ST_GENERATE,
	ST_CANCELLING, ST_CLEANUP,
};

struct job {
	struct gw *g;
	struct evhttp_request *req;
	struct evhttp_connection *hconn;
	enum api_kind kind;
	struct api_req q;
	struct caller who;
	struct gw_model *m;
	uint32_t model_ix;
	struct up *up;
	enum step step;
	/* the session */
	char session[CONV_NAME_MAX + 80];
	bool explicit_session;
	struct conv_sess *s;       /* its index entry (chat, gateway-made) */
	char from[CONV_NAME_MAX];  /* ST_FORK: the held session forked */
	char dropping[CONV_NAME_MAX];  /* ST_DROP_OLD: the session dropped */
	uint64_t *chain;           /* c[0..n_msgs] */
	uint32_t held;             /* messages the session holds (match) */
	uint32_t next_msg;         /* next message to append */
	uint32_t rewinds;          /* ST_REWIND: still to do */
	bool mutated;              /* the session changed: index or drop it */
	bool reopen;               /* ST_OPEN: the client's session exists; open it as it is */
	bool made;                 /* this request made the session (opened or forked) */
	bool up_dead;              /* the connection to llamad failed */
	uint32_t computed;         /* tokens llamad computed for the Appends */
	/* the answer */
	uint64_t gen_id;
	struct evbuffer *text;     /* everything streamed (the answer) */
	bool streaming;            /* headers sent */
	bool first_piece;
	bool client_gone;
	bool req_orphaned;         /* libevent let go of req: ours to free */
	struct event *watch;       /* looks for the client going away */
	/* the index rebuilt after a restart: the sessions found, read so far */
	char **found;
	size_t n_found, n_read;
	uint64_t *t_chain;         /* the one being read: its chain */
	uint32_t t_n, t_next;      /* turns hashed; the next page's first turn */
	bool t_bad;                /* cannot be hashed as it was sent */
	bool t_shifted;            /* because a shift dropped its first turns */
	char id[48];
	struct render_ctx rc;
	double t0;
};


static void job_free(struct job *j)
{
	if (j->watch)
		event_free(j->watch);
	for (size_t i = 0; i < j->n_found; i++)
		free(j->found[i]);
	free(j->found);
	free(j->t_chain);
	if (j->s)
		j->s->busy = false;
	if (j->streaming)
		j->g->st.streams--;
	j->g->st.active--;
	if (j->hconn)
		conn_on_close(j->hconn, NULL, NULL);
	up_close(j->up);
	api_req_free(&j->q);
	free(j->chain);
	if (j->text)
		evbuffer_free(j->text);
	if (j->req_orphaned)
		evhttp_request_free(j->req);
	free(j);
}

/* The session's index entry is no longer to be trusted: forget it. */
static void forget(struct job *j)
{
	if (j->s) {
		conv_remove(&j->g->conv, j->s);
		j->s = NULL;
	}
}

/* Write one streamed object: SSE "data: X\n\n" (OpenAI) or "X\n" (NDJSON). */
static void stream_obj(struct job *j, const char *obj)
{
	struct evbuffer *b = evbuffer_new();
	if (!b)
		return;
	if (j->kind == API_OPENAI_CHAT || j->kind == API_OPENAI_COMPLETE)
		evbuffer_add_printf(b, "data: %s\n\n", obj);
	else
		evbuffer_add_printf(b, "%s\n", obj);
	evhttp_send_reply_chunk(j->req, b);
	evbuffer_free(b);
}

static void start_stream(struct job *j)
{
	struct evkeyvalq *h = evhttp_request_get_output_headers(j->req);
	bool sse = j->kind == API_OPENAI_CHAT || j->kind == API_OPENAI_COMPLETE;
	evhttp_add_header(h, "Content-Type", sse ? "text/event-stream" : "application/x-ndjson");
	evhttp_add_header(h, "Cache-Control", "no-cache");
	evhttp_send_reply_start(j->req, 200, "OK");
	j->streaming = true;
	j->g->st.streams++;
}

/* The answer's end is going out: libevent may free the connection while
 * sending it (an error reply closes it), and on_client_close must not run
 * for a job that is ending anyway. */
static void detach(struct job *j)
{
	if (j->hconn) {
		conn_on_close(j->hconn, NULL, NULL);
		j->hconn = NULL;
	}
}

static void on_reply(void *arg, const Llamad__Response *r, int err);

/* End the request with an error: an error object in the stream when the
 * answer has begun, an HTTP error otherwise. */
static void job_fail(struct job *j, int status, const char *msg)
{
	detach(j);
	if (j->client_gone) {
		/* nobody to tell */
	} else if (j->streaming) {
		char *e = render_error(j->kind, status, msg);
		if (e)
			stream_obj(j, e);
		free(e);
		if (j->kind == API_OPENAI_CHAT || j->kind == API_OPENAI_COMPLETE)
			stream_obj(j, "[DONE]");
		evhttp_send_reply_end(j->req);
		if (status >= 500)
			j->g->st.errors_5xx++;
		else
			j->g->st.errors_4xx++;
	} else {
		http_send_error(j->g, j->req, j->kind, status, "%s", msg);
	}
	if (j->mutated)
		forget(j);
	if (j->made && j->up && !j->up_dead) {
		/* a session this request made holds none of what the client
		 * has: dropped, not left for nobody to find (the job ends with
		 * the Drop's reply, ST_CLEANUP) */
		if (j->watch) {
			event_free(j->watch);
			j->watch = NULL;
		}
		Llamad__Drop d = LLAMAD__DROP__INIT;
		d.session = j->session;
		Llamad__Request rq = LLAMAD__REQUEST__INIT;
		rq.op_case = LLAMAD__REQUEST__OP_DROP;
		rq.drop = &d;
		j->step = ST_CLEANUP;
		if (up_call(j->up, &rq, on_reply, j) == 0)
			return;
	}
	job_free(j);
}

static const char *role_word(int role)
{
	switch (role) {
	case LLAMAD__ROLE__ROLE_SYSTEM: return "system";
	case LLAMAD__ROLE__ROLE_ASSISTANT: return "assistant";
	case LLAMAD__ROLE__ROLE_USER: return "user";
	default: return "raw";
	}
}

static void fail_llamad(struct job *j, const Llamad__Response *r, int err)
{
	char msg[512];
	if (!r) {
		j->up_dead = true;
		snprintf(msg, sizeof(msg), "the connection to llamad (%s) failed: %s", j->m->socket,
			 strerror(-err));
		job_fail(j, 503, msg);
		return;
	}
	const Llamad__Error *e = r->body_case == LLAMAD__RESPONSE__BODY_ERROR ? r->error : NULL;
	if (!e) {
		snprintf(msg, sizeof(msg), "llamad answered with an unexpected reply (%d)", (int)r->body_case);
		job_fail(j, 500, msg);
		return;
	}
	const char *what = e->message ? e->message : frame_error_name(e->code);
	if (e->code == LLAMAD__ERROR_CODE__CONTEXT_FULL && j->q.chat &&
	    (j->step == ST_APPEND || j->step == ST_GENERATE)) {
		/* which message: the Generate's is the one it took last */
		uint32_t m = j->step == ST_GENERATE && j->next_msg ? j->next_msg - 1 : j->next_msg;
		snprintf(msg, sizeof(msg), "message %u of %zu (%s): %s", m + 1, j->q.n_msgs,
			 m < j->q.n_msgs ? role_word(j->q.msgs[m].role) : "?", what);
	} else {
		snprintf(msg, sizeof(msg), "%s", what);
	}
	int status = http_status_of(e->code);
	if (e->code == LLAMAD__ERROR_CODE__PERMISSION_DENIED)
		gw_log(j->g, GW_ERR, "llamad at %s refuses to let this gateway act for uid %u: %s",
		       j->m->socket, (unsigned)j->who.uid, msg);
	job_fail(j, status, msg);
}

static bool is_error(const Llamad__Response *r)
{
	return !r || r->body_case == LLAMAD__RESPONSE__BODY_ERROR;
}

static void call(struct job *j, Llamad__Request *rq)
{
	int rc = up_call(j->up, rq, on_reply, j);
	if (rc == -EMSGSIZE) {
		job_fail(j, 413, "the request does not fit in one frame of llamad's max_frame");
		return;
	}
	if (rc) {
		fail_llamad(j, NULL, rc);
		return;
	}
	if (rq->op_case == LLAMAD__REQUEST__OP_GENERATE)
		j->gen_id = rq->id;
}

/* ---- steps ---------------------------------------------------------------- */

static void new_name(char *buf, size_t n, uid_t uid)
{
	uint64_t r = 0;
	if (getrandom(&r, sizeof(r), 0) != sizeof(r))
		r = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
	snprintf(buf, n, GW_SESSION_PREFIX "%u-%016llx", (unsigned)uid, (unsigned long long)r);
}

/* A message's text as llamad takes it: an empty one (an answer that was
 * empty, say) is one space, since llamad refuses empty turns and the
 * session must hold a turn for every message. */
static char *turn_text(char *t)
{
	return *t ? t : (char *)" ";
}

static void do_open(struct job *j, bool raw)
{
	Llamad__OpenSession o = LLAMAD__OPEN_SESSION__INIT;
	o.session = j->session;
	if (raw) {
		PB_SET(&o, template_, LLAMAD__TEMPLATE__TEMPLATE_RAW);
		PB_SET(&o, ephemeral, 1);
	} else {
		o.system = j->q.system;
	}
	if (!raw && !j->reopen) {
		/* made here: shift, as llamactl chat's; a client's own session
		 * that exists keeps its policy (opened again, as it is) */
		PB_SET(&o, context_policy, LLAMAD__CONTEXT_POLICY__CONTEXT_SHIFT);
		PB_SET(&o, create_only, 1);
	} else if (raw) {
		PB_SET(&o, create_only, 1);
	}
	Llamad__Request rq = LLAMAD__REQUEST__INIT;
	rq.op_case = LLAMAD__REQUEST__OP_OPEN;
	rq.open = &o;
	j->step = ST_OPEN;
	call(j, &rq);
}

static void do_generate(struct job *j)
{
	Llamad__SamplerOptions so = LLAMAD__SAMPLER_OPTIONS__INIT;
	const struct api_req *q = &j->q;
	if (q->has_temperature)
		PB_SET(&so, temperature, q->temperature);
	if (q->has_top_p)
		PB_SET(&so, top_p, q->top_p);
	if (q->has_top_k)
		PB_SET(&so, top_k, q->top_k);
	if (q->has_min_p)
		PB_SET(&so, min_p, q->min_p);
	if (q->has_seed)
		PB_SET(&so, seed, q->seed);
	if (q->has_presence)
		PB_SET(&so, presence_penalty, q->presence);
	if (q->has_frequency)
		PB_SET(&so, frequency_penalty, q->frequency);
	if (q->has_repeat_penalty)
		PB_SET(&so, repeat_penalty, q->repeat_penalty);
	if (q->has_repeat_last_n)
		PB_SET(&so, repeat_last_n, q->repeat_last_n);
	Llamad__Generate gq = LLAMAD__GENERATE__INIT;
	gq.session = j->session;
	gq.sampler = &so;
	if (q->has_max_tokens)
		PB_SET(&gq, max_tokens, q->max_tokens);
	gq.stop = (char **)q->stop;
	gq.n_stop = q->n_stop;
	if (!q->chat) {
		gq.prompt = q->prompt;
		PB_SET(&gq, role, LLAMAD__ROLE__ROLE_RAW);
	} else if (j->next_msg < q->n_msgs) {
		/* the newest message travels with the Generate */
		gq.prompt = turn_text(q->msgs[j->next_msg].text);
		PB_SET(&gq, role, q->msgs[j->next_msg].role);
		j->next_msg++;
	}
	Llamad__Request rq = LLAMAD__REQUEST__INIT;
	rq.op_case = LLAMAD__REQUEST__OP_GENERATE;
	rq.generate = &gq;
	j->step = ST_GENERATE;
	j->mutated = true;
	j->first_piece = true;
	call(j, &rq);
}

static void do_append_or_generate(struct job *j)
{
	/* every message but the last goes as an Append */
	if (j->q.chat && j->next_msg + 1 < j->q.n_msgs) {
		Llamad__Append a = LLAMAD__APPEND__INIT;
		a.session = j->session;
		PB_SET(&a, role, j->q.msgs[j->next_msg].role);
		a.text = turn_text(j->q.msgs[j->next_msg].text);
		Llamad__Request rq = LLAMAD__REQUEST__INIT;
		rq.op_case = LLAMAD__REQUEST__OP_APPEND;
		rq.append = &a;
		j->step = ST_APPEND;
		j->mutated = true;
		call(j, &rq);
		return;
	}
	do_generate(j);
}

static void do_rewind_or_append(struct job *j)
{
	if (j->rewinds > 0) {
		Llamad__Rewind w = LLAMAD__REWIND__INIT;
		w.session = j->session;
		Llamad__Request rq = LLAMAD__REQUEST__INIT;
		rq.op_case = LLAMAD__REQUEST__OP_REWIND;
		rq.rewind = &w;
		j->step = ST_REWIND;
		j->mutated = true;
		call(j, &rq);
		return;
	}
	do_append_or_generate(j);
}

/* Choose the session: the held one that matches best, a fork of it, or a
 * new one. */
static void plan_session(struct job *j)
{
	struct gw *g = j->g;
	if (!j->q.chat) {
		new_name(j->session, sizeof(j->session), j->who.uid);
		do_open(j, true);
		return;
	}
	if (j->explicit_session) {
		/* the client keeps the conversation: only its newest turn is new */
		j->next_msg = j->q.n_msgs ? (uint32_t)j->q.n_msgs - 1 : 0;
		do_open(j, false);
		return;
	}
	uint32_t n = (uint32_t)j->q.n_msgs;
	free(j->chain);  /* chosen again after dropping an old session */
	j->chain = malloc((n + 1) * sizeof(*j->chain));
	if (!j->chain) {
		job_fail(j, 500, "out of memory");
		return;
	}
	conv_chain(j->m->name, j->q.system, j->q.msgs, n, j->chain);
	struct conv_match mt = conv_find(&g->conv, j->who.uid, j->model_ix, j->chain, n);
	/* the newest message is always sent: a match holding all of them
	 * (the same request again) is rewound by one */
	if (mt.s && mt.turns == n && n > 0) {
		mt.turns = n - 1;
		mt.exact = false;
	}
	if (mt.s && mt.exact && mt.turns > 0) {
		j->s = mt.s;
		j->s->busy = true;
		conv_touch(&g->conv, j->s);
		snprintf(j->session, sizeof(j->session), "%s", j->s->name);
		j->held = j->next_msg = mt.turns;
		g->st.conv_exact++;
		do_append_or_generate(j);
		return;
	}
	struct conv_sess *old = conv_victim(&g->conv, j->who.uid, j->model_ix,
					    g->max_convs ? g->max_convs - 1 : 0);
	if (old && old != mt.s) {
		/* the name outlives the entry: the Drop is packed after it goes */
		snprintf(j->dropping, sizeof(j->dropping), "%s", old->name);
		Llamad__Drop d = LLAMAD__DROP__INIT;
		d.session = j->dropping;
		Llamad__Request rq = LLAMAD__REQUEST__INIT;
		rq.op_case = LLAMAD__REQUEST__OP_DROP;
		rq.drop = &d;
		gw_log(g, GW_DEBUG, "dropping %s: uid %u holds --max-conversations", old->name,
		       (unsigned)j->who.uid);
		conv_remove(&g->conv, old);
		j->step = ST_DROP_OLD;
		call(j, &rq);
		return;
	}
	new_name(j->session, sizeof(j->session), j->who.uid);
	j->s = conv_add(&g->conv, j->session, j->who.uid, j->model_ix, j->chain, 0);
	if (!j->s) {
		job_fail(j, 500, "out of memory");
		return;
	}
	j->s->busy = true;
	if (mt.s && mt.turns > 0) {
		snprintf(j->from, sizeof(j->from), "%s", mt.s->name);
		j->held = j->next_msg = mt.turns;
		j->rewinds = mt.s->n - mt.turns;
		j->s->dropped = mt.s->dropped;
		Llamad__Fork f = LLAMAD__FORK__INIT;
		f.session = j->from;
		f.target = j->session;
		Llamad__Request rq = LLAMAD__REQUEST__INIT;
		rq.op_case = LLAMAD__REQUEST__OP_FORK;
		rq.fork = &f;
		j->step = ST_FORK;
		j->mutated = true;
		j->made = true;
		g->st.conv_forked++;
		call(j, &rq);
		return;
	}
	g->st.conv_new++;
	j->mutated = true;
	j->made = true;
	do_open(j, false);
}

/* ---- replies ---------------------------------------------------------------- */

/* r says that the held session this request continues as it was (not a
 * fork, not the client's own) is unknown to llamad: dropped by someone,
 * or llamad restarted without its state. Its index entry is forgotten and
 * the session chosen again (a new one, or a fork of another): true. Only
 * the first call on the held session qualifies, so this happens once. */
static bool held_gone(struct job *j, const Llamad__Response *r, uint32_t first_msg)
{
	if (!r || r->body_case != LLAMAD__RESPONSE__BODY_ERROR || !r->error ||
	    r->error->code != LLAMAD__ERROR_CODE__UNKNOWN_SESSION || j->explicit_session ||
	    j->from[0] || !j->s || j->held == 0 || first_msg != j->held)
		return false;
	gw_log(j->g, GW_DEBUG, "%s: gone from llamad; choosing the session again", j->session);
	forget(j);
	free(j->chain);
	j->chain = NULL;
	j->held = j->next_msg = 0;
	j->mutated = false;
	j->g->st.conv_exact--;
	plan_session(j);
	return true;
}

static void on_token(struct job *j, const Llamad__TokenEvent *t)
{
	if (j->q.stream && !j->client_gone && !j->streaming)
		start_stream(j);  /* the answer has begun: no HTTP error now */
	if (!t->text || !*t->text)
		return;
	size_t len = strlen(t->text);
	evbuffer_add(j->text, t->text, len);
	j->g->st.streamed_tokens++;
	if (!j->streaming || j->client_gone)
		return;
	char *o = render_piece(&j->rc, t->text, len, j->first_piece);
	j->first_piece = false;
	if (o)
		stream_obj(j, o);
	free(o);
}

static void on_done(struct job *j, const Llamad__Done *d)
{
	struct render_done rd = { 0 };
	rd.reason = d->reason;
	rd.completion_tokens = d->generated_tokens;
	/* the prompt as the model saw it (what a shift kept); of it, what
	 * llamad did not compute for this request (its Appends' and the
	 * Generate's own counts) */
	if (d->has_context_tokens && d->context_tokens)
		rd.prompt_tokens = d->context_tokens;
	else
		rd.prompt_tokens = d->session_tokens > d->generated_tokens
					   ? d->session_tokens - d->generated_tokens : 0;
	uint64_t computed = (uint64_t)j->computed + d->prompt_tokens;
	rd.cached_tokens = rd.prompt_tokens > computed ? rd.prompt_tokens - (uint32_t)computed : 0;
	rd.prefill_ms = d->prefill_ms;
	rd.generate_ms = d->generate_ms;
	rd.total_ms = (clock_mono_s() - j->t0) * 1e3;

	size_t len = evbuffer_get_length(j->text);
	evbuffer_add(j->text, "", 1);
	const char *text = (const char *)evbuffer_pullup(j->text, -1);

	/* the session now holds the request's messages and the answer */
	if (j->s && j->chain) {
		uint32_t n = (uint32_t)j->q.n_msgs;
		j->s->dropped += d->dropped_turns;
		if (conv_set(&j->g->conv, j->s, j->chain, n) ||
		    conv_push(j->s, conv_step(j->chain[n], LLAMAD__ROLE__ROLE_ASSISTANT, text)))
			forget(j);
	}
	if (j->client_gone) {
		j->g->st.cancelled++;
		job_free(j);
		return;
	}
	if (j->q.stream && !j->streaming)
		start_stream(j);  /* nothing was generated: the stream is its end */
	detach(j);
	if (j->streaming) {
		char *usage = NULL;
		char *end = render_stream_end(&j->rc, &rd, j->q.include_usage, &usage);
		if (end)
			stream_obj(j, end);
		if (usage)
			stream_obj(j, usage);
		free(end);
		free(usage);
		if (j->kind == API_OPENAI_CHAT || j->kind == API_OPENAI_COMPLETE)
			stream_obj(j, "[DONE]");
		evhttp_send_reply_end(j->req);
	} else {
		char *body = render_whole(&j->rc, &rd, text, len);
		if (body)
			http_send_json(j->g, j->req, 200, body);
		else
			http_send_error(j->g, j->req, j->kind, 500, "out of memory");
		free(body);
	}
	job_free(j);
}

/* ---- the index after a restart of the gateway ---------------------------------
 *
 * The index lives in the gateway's memory. The first request of a caller
 * for a model after the gateway starts lists the caller's sessions of
 * that model made by a gateway (http-UID-...) and reads each one's
 * transcript into the index, so that its conversations continue where
 * they were (and --max-conversations counts them). A session whose
 * transcript cannot be hashed as it was sent (a context shift dropped
 * turns, a turn cut to fit a frame) is left out. Only sessions that
 * llamad says the caller owns are taken, whatever their names: the
 * connection acts for the caller (own sessions only, even as root), and
 * the owner of each listed session is checked again here.
 */

static bool known(struct gw *g, uint32_t uid, uint32_t model)
{
	for (size_t i = 0; i < g->n_known; i++)
		if (g->known[i].uid == uid && g->known[i].model == model)
			return true;
	return false;
}

static void mark_known(struct gw *g, uint32_t uid, uint32_t model)
{
	void *n = realloc(g->known, (g->n_known + 1) * sizeof(*g->known));
	if (!n)
		return;  /* asked again next time */
	g->known = n;
	g->known[g->n_known++] = (struct gw_known){ uid, model };
}

static void ask_list(struct job *j, const char *after)
{
	Llamad__ListSessions l = LLAMAD__LIST_SESSIONS__INIT;
	l.after = (char *)after;
	Llamad__Request rq = LLAMAD__REQUEST__INIT;
	rq.op_case = LLAMAD__REQUEST__OP_LIST;
	rq.list = &l;
	j->step = ST_LIST;
	call(j, &rq);
}

static void ask_transcript(struct job *j)
{
	Llamad__GetTranscript t = LLAMAD__GET_TRANSCRIPT__INIT;
	t.session = j->found[j->n_read];
	PB_SET(&t, from_turn, j->t_next);
	Llamad__Request rq = LLAMAD__REQUEST__INIT;
	rq.op_case = LLAMAD__REQUEST__OP_TRANSCRIPT;
	rq.transcript = &t;
	j->step = ST_TRANSCRIPT;
	call(j, &rq);
}

/* The next session of the list to read, or on to the request. */
static void next_found(struct job *j)
{
	free(j->t_chain);
	j->t_chain = NULL;
	j->t_n = j->t_next = 0;
	j->t_bad = j->t_shifted = false;
	if (j->n_read < j->n_found) {
		ask_transcript(j);
		return;
	}
	mark_known(j->g, j->who.uid, j->model_ix);
	plan_session(j);
}

static void on_list(struct job *j, const Llamad__Response *r)
{
	if (!r || r->body_case != LLAMAD__RESPONSE__BODY_SESSIONS || !r->sessions) {
		next_found(j);  /* the index stays as it is: nothing lost */
		return;
	}
	char prefix[32];
	int pl = snprintf(prefix, sizeof(prefix), GW_SESSION_PREFIX "%u-", (unsigned)j->who.uid);
	const Llamad__SessionList *l = r->sessions;
	for (size_t i = 0; i < l->n_sessions; i++) {
		const Llamad__SessionInfo *si = l->sessions[i];
		const char *name = si->session;
		if (!name || !si->has_owner_uid || si->owner_uid != (uint32_t)j->who.uid ||
		    si->ephemeral || strncmp(name, prefix, (size_t)pl) ||
		    strlen(name) >= CONV_NAME_MAX || conv_get(&j->g->conv, name))
			continue;
		char **n = realloc(j->found, (j->n_found + 1) * sizeof(*n));
		if (!n || !(n[j->n_found] = strdup(name))) {
			j->found = n ? n : j->found;
			break;
		}
		j->found = n;
		j->n_found++;
	}
	if (l->next && *l->next) {
		ask_list(j, l->next);
		return;
	}
	next_found(j);
}

static void on_transcript(struct job *j, const Llamad__Response *r)
{
	const Llamad__Transcript *t = r && r->body_case == LLAMAD__RESPONSE__BODY_TRANSCRIPT ? r->transcript : NULL;
	if (!t || t->dropped_turns || t->busy)
		j->t_bad = true;
	if (t && t->dropped_turns && !t->busy)
		j->t_shifted = true;
	if (!j->t_bad) {
		if (!j->t_chain) {
			j->t_chain = malloc((t->turns + 1) * sizeof(*j->t_chain));
			if (!j->t_chain)
				j->t_bad = true;
			else
				j->t_chain[0] = conv_seed(j->m->name, t->system && *t->system ? t->system : NULL);
		}
		for (size_t i = 0; !j->t_bad && i < t->n_items; i++) {
			const Llamad__Turn *u = t->items[i];
			if (u->truncated || !u->text || j->t_n >= t->turns) {
				j->t_bad = true;
				break;
			}
			int role = u->generated ? LLAMAD__ROLE__ROLE_ASSISTANT : (int)u->role;
			j->t_chain[j->t_n + 1] = conv_step(j->t_chain[j->t_n], role, u->text);
			j->t_n++;
		}
		if (!j->t_bad && t->next < t->turns && t->next > j->t_next) {
			j->t_next = t->next;
			ask_transcript(j);
			return;
		}
	}
	if (!j->t_bad && j->t_n > 0) {
		conv_add(&j->g->conv, j->found[j->n_read], j->who.uid, j->model_ix, j->t_chain, j->t_n);
	} else if (j->t_shifted) {
		/* its beginning is gone, so no request can be matched to it; kept
		 * in the index, unmatchable, so that --max-conversations counts it
		 * and drops it in its turn */
		uint64_t seed = conv_seed(j->m->name, t && t->system && *t->system ? t->system : NULL);
		struct conv_sess *s = conv_add(&j->g->conv, j->found[j->n_read], j->who.uid,
					       j->model_ix, &seed, 0);
		if (s)
			s->dropped = UINT32_MAX;
	}
	j->n_read++;
	next_found(j);
}

/* ---- replies, step by step -------------------------------------------------- */

static void on_hello(struct job *j, const Llamad__Response *r, int err)
{
	if (is_error(r)) {
		fail_llamad(j, r, err);
		return;
	}
	if (r->body_case == LLAMAD__RESPONSE__BODY_HELLO && r->hello) {
		/* a daemon that ignored on_behalf_of_uid (older than gateways)
		 * would serve the caller as the gateway */
		if (r->hello->has_uid && r->hello->uid != (uint32_t)j->who.uid) {
			gw_log(j->g, GW_ERR, "llamad at %s serves this connection as uid %u, not the "
			       "caller's %u", j->m->socket, (unsigned)r->hello->uid, (unsigned)j->who.uid);
			job_fail(j, 500, "llamad did not accept the caller's identity");
			return;
		}
		if (!r->hello->has_uid && j->who.uid != j->g->self_uid) {
			job_fail(j, 500, "this llamad is too old to serve callers as themselves "
				 "(no HelloReply.uid)");
			return;
		}
		up_set_max_frame(j->up, r->hello->max_frame);
		if (!j->m->desc && r->hello->model)
			j->m->desc = strdup(r->hello->model);
	}
	if (j->q.chat && !j->explicit_session && !known(j->g, j->who.uid, j->model_ix)) {
		ask_list(j, NULL);
		return;
	}
	plan_session(j);
}

static void on_fork(struct job *j, const Llamad__Response *r, int err)
{
	if (!is_error(r)) {
		do_rewind_or_append(j);
		return;
	}
	if (r && r->error && (r->error->code == LLAMAD__ERROR_CODE__UNKNOWN_SESSION ||
			      r->error->code == LLAMAD__ERROR_CODE__BUSY)) {
		/* the held session is gone (dropped by someone, or a restart
		 * without state) or busy: start anew */
		struct conv_sess *old = conv_get(&j->g->conv, j->from);
		if (old && r->error->code == LLAMAD__ERROR_CODE__UNKNOWN_SESSION)
			conv_remove(&j->g->conv, old);
		j->held = j->next_msg = 0;
		j->rewinds = 0;
		j->s->dropped = 0;
		do_open(j, false);
		return;
	}
	fail_llamad(j, r, err);
}

static void on_generate(struct job *j, const Llamad__Response *r, int err)
{
	if (r && r->body_case == LLAMAD__RESPONSE__BODY_TOKEN && r->token)
		on_token(j, r->token);
	else if (r && r->body_case == LLAMAD__RESPONSE__BODY_DONE && r->done)
		on_done(j, r->done);
	/* do_generate counted the newest message sent */
	else if (!(r && j->step == ST_GENERATE && held_gone(j, r, j->next_msg - 1)))
		fail_llamad(j, r, err);
}

static void on_reply(void *arg, const Llamad__Response *r, int err)
{
	struct job *j = arg;
	switch (j->step) {
	case ST_HELLO:
		on_hello(j, r, err);
		break;
	case ST_LIST:
		on_list(j, r);
		break;
	case ST_TRANSCRIPT:
		on_transcript(j, r);
		break;
	case ST_DROP_OLD:
		/* best effort: an unknown session was dropped already */
		if (r)
			plan_session(j);
		else
			fail_llamad(j, r, err);
		break;
	case ST_OPEN:
		if (j->explicit_session && !j->reopen && r && r->body_case == LLAMAD__RESPONSE__BODY_ERROR &&
		    r->error && r->error->code == LLAMAD__ERROR_CODE__SESSION_EXISTS) {
			j->reopen = true;
			do_open(j, false);
		} else if (is_error(r)) {
			fail_llamad(j, r, err);
		} else {
			do_append_or_generate(j);
		}
		break;
	case ST_FORK:
		on_fork(j, r, err);
		break;
	case ST_REWIND:
		if (is_error(r)) {
			fail_llamad(j, r, err);
			break;
		}
		j->rewinds--;
		do_rewind_or_append(j);
		break;
	case ST_APPEND:
		if (is_error(r)) {
			if (!held_gone(j, r, j->next_msg))
				fail_llamad(j, r, err);
			break;
		}
		if (r->body_case == LLAMAD__RESPONSE__BODY_SESSION && r->session) {
			j->computed += r->session->computed_tokens;
			if (j->s)
				j->s->dropped += r->session->dropped_turns;
		}
		j->next_msg++;
		do_append_or_generate(j);
		break;
	case ST_GENERATE:
	case ST_CANCELLING:
		on_generate(j, r, err);
		break;
	case ST_CLEANUP:
		job_free(j);
		break;
	}
}

/* The HTTP client went away (or stalled past --timeout). */
static void on_client_close(struct evhttp_connection *hc, void *arg)
{
	(void)hc;
	struct job *j = arg;
	j->client_gone = true;
	j->hconn = NULL;
	/* a connection that ends (EOF, error, --timeout) before the answer
	 * has ended detaches the request and leaves it to its owner; only
	 * one still on the connection (libevent freeing it all) is libevent's */
	j->req_orphaned = evhttp_request_get_connection(j->req) == NULL;
	if (j->step == ST_GENERATE && up_current(j->up) == j->gen_id) {
		/* cancel and wait for the Done, so the session's turns are known */
		Llamad__Cancel c = LLAMAD__CANCEL__INIT;
		PB_SET(&c, request_id, j->gen_id);
		Llamad__Request rq = LLAMAD__REQUEST__INIT;
		rq.op_case = LLAMAD__REQUEST__OP_CANCEL;
		rq.cancel = &c;
		if (up_send_only(j->up, &rq) == 0) {
			j->step = ST_CANCELLING;
			return;
		}
	}
	/* elsewhere the next reply finds client_gone; closing the upstream
	 * now ends whatever runs */
	if (j->mutated)
		forget(j);
	job_free(j);
}

/* libevent 2.1 stops reading a connection while its request is answered,
 * so it learns of a client that went away only when a write fails: never,
 * for an answer not streamed. Every WATCH_S the connection is peeked at;
 * an end of file frees it, which runs on_client_close (the generation is
 * cancelled). A client that only shuts down its sending side while it
 * waits is taken for gone as well. */
#define WATCH_S 0.25

static void watch_client(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	struct job *j = arg;
	struct bufferevent *bev = j->hconn ? evhttp_connection_get_bufferevent(j->hconn) : NULL;
	int cfd = bev ? bufferevent_getfd(bev) : -1;
	if (cfd >= 0) {
		char c;
		ssize_t k = recv(cfd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
		if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
			evhttp_connection_free(j->hconn);  /* on_client_close; j may be gone */
			return;
		}
	}
	struct timeval tv = { 0, (int)(WATCH_S * 1e6) };
	evtimer_add(j->watch, &tv);
}

void job_start(struct gw *g, struct evhttp_request *req, enum api_kind kind,
	       const struct caller *c)
{
	struct evbuffer *in = evhttp_request_get_input_buffer(req);
	size_t len = evbuffer_get_length(in);
	const char *body = (const char *)evbuffer_pullup(in, -1);
	struct job *j = calloc(1, sizeof(*j));
	if (!j || !(j->text = evbuffer_new())) {
		free(j);
		http_send_error(g, req, kind, 500, "out of memory");
		return;
	}
	j->g = g;
	j->req = req;
	j->kind = kind;
	j->who = *c;
	j->t0 = clock_mono_s();
	g->st.active++;
	char err[512];
	int st = api_parse(kind, body ? body : "", len, &j->q, err, sizeof(err));
	if (st) {
		http_send_error(g, req, kind, st, "%s", err);
		j->g->st.active--;
		evbuffer_free(j->text);
		free(j);
		return;
	}
	j->m = gw_find_model(g, j->q.model);
	if (!j->m) {
		char names[400] = "";
		size_t at = 0;
		for (size_t i = 0; i < g->n_models && at < sizeof(names) - 1; i++)
			at += (size_t)snprintf(names + at, sizeof(names) - at, "%s%s", i ? ", " : "",
					       g->models[i].name);
		snprintf(err, sizeof(err), "model '%s' is not served here; the models are: %s",
			 j->q.model, names);
		job_fail(j, 404, err);
		return;
	}
	j->model_ix = (uint32_t)(j->m - g->models);
	const char *hs = evhttp_find_header(evhttp_request_get_input_headers(req), "X-Llamad-Session");
	if (hs && *hs) {
		if (strlen(hs) >= CONV_NAME_MAX + 64) {
			job_fail(j, 400, "X-Llamad-Session: the name is too long");
			return;
		}
		if (!strncmp(hs, GW_SESSION_PREFIX, strlen(GW_SESSION_PREFIX))) {
			job_fail(j, 400, "X-Llamad-Session: names beginning with " GW_SESSION_PREFIX
				 " are the gateway's own conversations; choose another name");
			return;
		}
		snprintf(j->session, sizeof(j->session), "%s", hs);
		j->explicit_session = true;
	}
	bool openai = kind == API_OPENAI_CHAT || kind == API_OPENAI_COMPLETE;
	uint64_t r = 0;
	if (getrandom(&r, sizeof(r), 0) != sizeof(r))
		r = (uint64_t)time(NULL);
	snprintf(j->id, sizeof(j->id), "%s-%016llx", kind == API_OPENAI_COMPLETE ? "cmpl" : "chatcmpl",
		 (unsigned long long)r);
	j->rc = (struct render_ctx){ kind, j->id, (int64_t)time(NULL), j->m->name };
	(void)openai;
	if (g->log_prompts)
		for (size_t i = 0; i < j->q.n_msgs; i++)
			gw_log(g, GW_INFO, "uid %u message %zu: %s", (unsigned)c->uid, i, j->q.msgs[i].text);
	/* Ollama: a chat without messages, or an empty generate prompt, only
	 * loads the model: answer at once */
	if ((kind == API_OLLAMA_CHAT || kind == API_OLLAMA_GENERATE) && j->q.chat && j->q.n_msgs == 0) {
		char t[48];
		render_time(t, sizeof(t));
		char body2[256];
		snprintf(body2, sizeof(body2),
			 kind == API_OLLAMA_CHAT ? "{\"model\":\"%s\",\"created_at\":\"%s\",\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done_reason\":\"load\",\"done\":true}"
						 : "{\"model\":\"%s\",\"created_at\":\"%s\",\"response\":\"\",\"done_reason\":\"load\",\"done\":true}",
			 j->m->name, t);
		http_send_json(g, req, 200, body2);
		j->g->st.active--;
		api_req_free(&j->q);
		evbuffer_free(j->text);
		free(j);
		return;
	}
	int e;
	j->up = http_dial(g, j->m, c, on_reply, j, &e);
	if (!j->up) {
		snprintf(err, sizeof(err), "llamad for model '%s' is not reachable at %s: %s", j->m->name,
			 j->m->socket, strerror(-e));
		job_fail(j, 503, err);
		return;
	}
	j->step = ST_HELLO;
	j->hconn = evhttp_request_get_connection(req);
	conn_on_close(j->hconn, on_client_close, j);
	j->watch = evtimer_new(g->base, watch_client, j);
	if (j->watch) {
		struct timeval tv = { 0, (int)(WATCH_S * 1e6) };
		evtimer_add(j->watch, &tv);
	}
}

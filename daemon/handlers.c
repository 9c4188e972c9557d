/*
 * daemon/handlers.c — what each request does, on the engine thread.
 *
 * One table row per operation: the handler and the preconditions the
 * dispatcher checks once, in this order, before calling it: the session
 * the request names exists for the caller (NEED_SESSION), it is not
 * running another request (NOT_BUSY), the caller is within its session
 * quota (QUOTA), its K/V is in the pool (RESIDENT). A handler answers
 * itself (a reply, or a job that answers later) and returns 0, or returns
 * -errno with a one-line message in rq->msg and the dispatcher sends the
 * error (reply_code maps the errno).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "daemon/engine_int.h"
#include "daemon/log.h"
#include "daemon/version.h"
#include "proto/frame.h"
#include "text/chat.h"
#include "util/clock.h"
#include "util/utf8.h"

enum { NEED_SESSION = 1, NOT_BUSY = 2, QUOTA = 4, RESIDENT = 8 };

/* One request being handled. */
struct req {
	uint64_t conn, id;
	uid_t uid;
	int own_only;            /* struct cmd's: uid's sessions only, even root's */
	double t_arrive;         /* queued for the engine (struct cmd's) */
	const Llamad__Request *q;
	struct session *s;       /* NEED_SESSION: the session it names */
	char msg[256];           /* the error's text */
};

static int fail(struct req *rq, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Set rq's error message; returns err. */
static int fail(struct req *rq, int err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(rq->msg, sizeof(rq->msg), fmt, ap);
	va_end(ap);
	return err;
}

/* A Response with body c (the caller sets the body's pointer). */
static Llamad__Response response(Llamad__Response__BodyCase c)
{
	Llamad__Response r = LLAMAD__RESPONSE__INIT;
	r.body_case = c;
	return r;
}

static void reply_body(struct engine *e, const struct req *rq, Llamad__Response *r)
{
	PB_SET(r, id, rq->id);
	engine_reply(e, rq->conn, r);
}

/* ---- session replies -------------------------------------------------------- */

/* A SessionInfo reply on s (created < 0: not set). */
static void send_info(struct engine *e, uint64_t conn, uint64_t id, struct session *s,
		      int created)
{
	struct info_env env = engine_info_env(e, s);
	engine_send(e, reply_info(conn, id, s, &env, created, NULL));
}

/* ---- preconditions ------------------------------------------------------------ */

struct count_ctx {
	int n, active, in_ram, on_disk;
};

static void count_one(struct session *s, void *ctx)
{
	struct count_ctx *c = ctx;
	c->n++;
	c->active += s->busy;
	c->in_ram += s->loc == SESS_RAM;
	c->on_disk += s->loc == SESS_DISK;
}

/* The session called name that a request of uid sees: uid's own; for
 * root also another user's of that name (sess_find), unless own_only (a
 * connection acting for a caller: a gateway's callers reach their own
 * sessions only, whatever the names). NULL if none. */
static struct session *find_as(struct engine *e, uid_t uid, int own_only, const char *name)
{
	return own_only ? sess_get(&e->st, uid, name) : sess_find(&e->st, uid, name);
}

static struct session *find_for(struct engine *e, const struct req *rq, const char *name)
{
	return find_as(e, rq->uid, rq->own_only, name);
}

/* Visit the sessions rq's sender sees (root's own connections: all). */
static void visit_for(struct engine *e, const struct req *rq, void (*fn)(struct session *, void *),
		      void *ctx)
{
	if (rq->own_only)
		sess_foreach_owned(&e->st, rq->uid, fn, ctx);
	else
		sess_foreach(&e->st, rq->uid, fn, ctx);
}

/* -EUSERS if uid holds its quota of sessions, -EDQUOT if its saved
 * sessions fill its share of the disk (a new one could not be saved). */
static int check_quota(struct engine *e, struct req *rq)
{
	char *cause = NULL;
	int rc = res_disk_full(&e->res, rq->uid, 0, &cause);
	if (rc) {
		fail(rq, rc, "%s", cause ? cause : "out of memory");
		free(cause);
		return rc;
	}
	if (e->cfg.max_sessions_per_uid <= 0 || rq->uid == 0)
		return 0;
	struct count_ctx c = { 0 };
	sess_foreach(&e->st, rq->uid, count_one, &c);
	if (c.n < e->cfg.max_sessions_per_uid)
		return 0;
	return fail(rq, -EUSERS, "uid %u holds its quota of %d sessions", (unsigned)rq->uid,
		    e->cfg.max_sessions_per_uid);
}

/* -EUSERS if the table is full. */
static int check_room(struct engine *e, struct req *rq)
{
	if (e->st.count < e->cfg.max_sessions)
		return 0;
	return fail(rq, -EUSERS, "the daemon holds its maximum of %d sessions", e->cfg.max_sessions);
}

/* ---- the handlers ----------------------------------------------------------- */

static int on_hello(struct engine *e, struct req *rq)
{
	const Llamad__Hello *h = rq->q->hello;
	if (h->has_protocol_version && h->protocol_version != LLAMAD_PROTOCOL_VERSION)
		return fail(rq, -EPROTONOSUPPORT,
			    "protocol version %u is not supported (this daemon speaks %d)",
			    h->protocol_version, LLAMAD_PROTOCOL_VERSION);
	Llamad__HelloReply hr = LLAMAD__HELLO_REPLY__INIT;
	PB_SET(&hr, protocol_version, LLAMAD_PROTOCOL_VERSION);
	hr.server = (char *)"llamad " LLAMAD_VERSION;
	hr.model = e->model_desc;
	PB_SET(&hr, max_frame, e->cfg.max_frame);
	PB_SET(&hr, max_text, e->cfg.max_text);
	PB_SET(&hr, context_length, (uint32_t)engine_session_limit(e));
	PB_SET(&hr, uid, (uint32_t)rq->uid);   /* a gateway's: the uid it acts for */
	PB_SET(&hr, idle_timeout, (uint32_t)e->cfg.idle_timeout);
	Llamad__Response r = response(LLAMAD__RESPONSE__BODY_HELLO);
	r.hello = &hr;
	reply_body(e, rq, &r);
	return 0;
}

_Static_assert((int)LLAMAD__TEMPLATE__TEMPLATE_DEFAULT == CHAT_TEMPLATE_AUTO &&
	       (int)LLAMAD__TEMPLATE__TEMPLATE_LLAMA2 == CHAT_TEMPLATE_LLAMA2 &&
	       (int)LLAMAD__TEMPLATE__TEMPLATE_RAW == CHAT_TEMPLATE_RAW &&
	       (int)LLAMAD__TEMPLATE__TEMPLATE_LLAMA3 == CHAT_TEMPLATE_LLAMA3,
	       "text/chat.h's templates are the wire's");

static int on_open(struct engine *e, struct req *rq)
{
	const Llamad__OpenSession *o = rq->q->open;
	struct session *s = find_for(e, rq, o->session);
	if (s && s->uid != rq->uid)
		s = NULL;  /* root opening its own session of a name another uid has */
	if (s) {
		if (o->create_only)
			return fail(rq, -EEXIST, "'%s' is taken (create_only): choose another name",
				    o->session);
		if (o->has_context_policy && o->context_policy && (int)o->context_policy != s->policy) {
			s->policy = (int)o->context_policy;  /* the one setting a reopen changes */
			s->dirty = 1;
		}
		s->last_use_ms = clock_unix_ms();
		send_info(e, rq->conn, rq->id, s, 0);
		return 0;
	}
	int tmpl = o->has_template_ && o->template_ ? (int)o->template_ : e->default_tmpl;
	const char *unusable = chat_template_unusable(e->m->tok, tmpl);
	if (unusable)
		return fail(rq, -EINVAL, "template %s: %s", chat_template_name(tmpl), unusable);
	int rc = check_room(e, rq);
	if (rc || (rc = check_quota(e, rq)))
		return rc;
	s = sess_create(&e->st, rq->uid, o->session);
	if (!s || (o->system && !(s->system = strdup(o->system)))) {
		if (s)
			sess_drop(&e->st, s);
		return fail(rq, -ENOMEM, "out of memory");
	}
	s->tmpl = tmpl;
	s->policy = o->has_context_policy && o->context_policy ? (int)o->context_policy
								: e->cfg.context_policy;
	s->ephemeral = o->ephemeral;
	s->owner_conn = rq->conn;
	s->dirty = 1;
	s->last_use_ms = clock_unix_ms();
	log_msg(LL_DEBUG, "session %s created by uid %u", s->id, (unsigned)rq->uid);
	send_info(e, rq->conn, rq->id, s, 1);
	return 0;
}

/* Add a client's turn to rq's session: the token count or -errno. */
static int add_turn(struct engine *e, struct req *rq, int has_role, int role, const char *text)
{
	struct turn_env te = engine_turns(e);
	int n = turn_append(&te, rq->s, has_role ? role : CHAT_USER, text ? text : "", rq->msg,
			    sizeof(rq->msg));
	if (n >= 0)
		rq->s->last_use_ms = clock_unix_ms();
	return n;
}

static int on_append(struct engine *e, struct req *rq)
{
	const Llamad__Append *a = rq->q->append;
	uint32_t shifts = rq->s->shift_turns;
	int n = add_turn(e, rq, a->has_role, (int)a->role, a->text);
	if (n < 0)
		return n;
	struct job *j = job_new(JOB_APPEND, rq->conn, rq->id, rq->s);
	if (!j)
		return fail(rq, -ENOMEM, "out of memory");
	j->tokens_added = n;
	j->dropped_turns = (int)(rq->s->shift_turns - shifts);
	job_add(e, j);
	return 0;
}

static void fill_sampler(const struct engine *e, const Llamad__SamplerOptions *o,
			 struct sampler_params *p)
{
	const struct config *c = &e->cfg;
	p->temperature = o && o->has_temperature ? o->temperature : c->temperature;
	p->top_k = o && o->has_top_k ? o->top_k : c->top_k;
	p->top_p = o && o->has_top_p ? o->top_p : c->top_p;
	p->min_p = o && o->has_min_p ? o->min_p : c->min_p;
	p->repeat_penalty = o && o->has_repeat_penalty ? o->repeat_penalty : c->repeat_penalty;
	p->penalty_last_n = o && o->has_repeat_last_n ? o->repeat_last_n : c->repeat_last_n;
	p->presence_penalty = o && o->has_presence_penalty ? o->presence_penalty : c->presence_penalty;
	p->frequency_penalty = o && o->has_frequency_penalty ? o->frequency_penalty
							      : c->frequency_penalty;
	if (o && o->has_seed)
		p->seed = o->seed;
	else if (getrandom(&p->seed, sizeof(p->seed), 0) != sizeof(p->seed))
		p->seed = (uint64_t)clock_unix_ms();
}

static int on_generate(struct engine *e, struct req *rq)
{
	const Llamad__Generate *g = rq->q->generate;
	struct session *s = rq->s;
	struct sampler_params sp;
	fill_sampler(e, g->sampler, &sp);
	const char *why = sampler_params_check(&sp);
	if (why)
		return fail(rq, -EINVAL, "%s", why);
	/* the default: max_tokens, at most half the context (512 on a model
	 * of 512 would end every default answer "context full") */
	int half = engine_session_limit(e) / 2 > 0 ? engine_session_limit(e) / 2 : 1;
	int max_tokens = e->cfg.max_tokens < half ? e->cfg.max_tokens : half;
	if (g->has_max_tokens && g->max_tokens)
		max_tokens = (int)g->max_tokens;
	struct job *j = job_new(JOB_GENERATE, rq->conn, rq->id, s);
	if (!j || !(j->logits = malloc((size_t)e->m->cfg.vocab * sizeof(float)))) {
		job_free(j);
		return fail(rq, -ENOMEM, "out of memory");
	}
	/* a reply starts a new text: chat answers begin after [/INST] or the
	 * assistant header */
	if (gen_init(&j->gen, e->m, &sp, (const char *const *)g->stop, (int)g->n_stop, max_tokens,
		     chat_rules(s->tmpl)->answer_at_start, job_emit_text, j) != 0) {
		job_free(j);
		return fail(rq, -ENOMEM, "out of memory");
	}
	j->gen_ok = 1;
	j->t_arrive = rq->t_arrive;
	j->shift_turns0 = s->shift_turns;   /* the prompt's shift counts too */
	j->shift_tokens0 = s->shift_tokens;
	j->keep_turn = s->n_turns;
	if (g->prompt && *g->prompt) {  /* an empty prompt is no prompt */
		int n = add_turn(e, rq, g->has_role, (int)g->role, g->prompt);
		if (n < 0) {
			job_free(j);
			return n;
		}
		/* the prompt's turn (a llama2 system prompt adds none); a shift
		 * to make room for it may have moved it */
		j->keep_turn = n > 0 ? s->n_turns - 1 : s->n_turns;
	}
	struct turn_env te = engine_turns(e);
	int opened = turn_generation(&te, s, rq->msg, sizeof(rq->msg));
	if (opened < 0) {
		job_free(j);
		return opened;
	}
	j->answer_turn = opened;  /* llama3's generation prompt opened the answer */
	if (s->n_cached >= s->n_tokens)
		sess_uncache(&e->st, s, s->n_tokens - 1);  /* we need the last token's logits */
	job_add(e, j);
	return 0;
}

static int on_fork(struct engine *e, struct req *rq)
{
	const Llamad__Fork *f = rq->q->fork;
	struct session *dst = find_for(e, rq, f->target);
	if (dst && dst->uid == rq->uid)
		return fail(rq, -EEXIST, "'%s' is taken: fork to another name, or drop it first",
			    f->target);
	int rc = check_room(e, rq);
	if (rc)
		return rc;
	dst = sess_fork(&e->st, rq->s, rq->uid, f->target);
	if (!dst)
		return fail(rq, -ENOMEM, "out of memory");
	/* a busy source's answer in progress is not the fork's (it would stay
	 * open there, never ended): the fork takes the committed history */
	for (struct job *j = e->jobs; j; j = j->next)
		if (j->s == rq->s && j->kind == JOB_GENERATE && j->answer_turn && dst->n_turns > 0)
			sess_remove_turns(&e->st, dst, dst->n_turns - 1, 1);
	dst->ephemeral = 0;
	dst->dirty = 1;
	dst->last_use_ms = clock_unix_ms();
	send_info(e, rq->conn, rq->id, dst, 1);
	return 0;
}

static void reply_ok(struct engine *e, const struct req *rq)
{
	Llamad__Ok ok = LLAMAD__OK__INIT;
	Llamad__Response r = response(LLAMAD__RESPONSE__BODY_OK);
	r.ok = &ok;
	reply_body(e, rq, &r);
}

static int on_drop(struct engine *e, struct req *rq)
{
	log_msg(LL_DEBUG, "session %s dropped", rq->s->id);
	res_drop(&e->res, rq->s, 1);
	reply_ok(e, rq);
	return 0;
}

static int on_info(struct engine *e, struct req *rq)
{
	send_info(e, rq->conn, rq->id, rq->s, -1);
	return 0;
}

/* A list carries at most this much of each system prompt (GetInfo: all). */
#define LIST_SYSTEM_MAX 256

struct list_ctx {
	struct session **v;
	size_t n;
};

static void list_one(struct session *s, void *ctx)
{
	struct list_ctx *l = ctx;
	l->v[l->n++] = s;
}

/* Sessions in list order: by name, then owner (root sees several users'). */
static int list_order(const void *a, const void *b)
{
	const struct session *x = *(struct session *const *)a, *y = *(struct session *const *)b;
	int c = strcmp(x->id, y->id);
	return c ? c : (x->uid > y->uid) - (x->uid < y->uid);
}

/* 1 if s comes after the cursor "NAME/UID" (a SessionList.next; names
 * hold no '/'): the cursor stays good when sessions come and go. */
static int after_cursor(const struct session *s, const char *cursor)
{
	const char *slash = strrchr(cursor, '/');
	size_t nl = slash ? (size_t)(slash - cursor) : strlen(cursor);
	int c = strncmp(s->id, cursor, nl);
	if (c == 0 && s->id[nl] != 0)
		c = 1;   /* cursor's name is a prefix of s's */
	if (c)
		return c > 0;
	return slash && (unsigned long)s->uid > strtoul(slash + 1, NULL, 10);
}

/* The sessions the caller may see, by name, as many as fit one max_frame
 * reply after the cursor; each system prompt cut to its first
 * LIST_SYSTEM_MAX bytes (on a character boundary, system_cut set). */
static int on_list(struct engine *e, struct req *rq)
{
	const char *cursor = rq->q->list->after;
	struct list_ctx l = { calloc((size_t)e->st.count + 1, sizeof(struct session *)), 0 };
	Llamad__SessionInfo *infos = calloc((size_t)e->st.count + 1, sizeof(*infos));
	Llamad__SessionInfo **ptrs = calloc((size_t)e->st.count + 1, sizeof(*ptrs));
	char (*cut)[LIST_SYSTEM_MAX + 1] = calloc((size_t)e->st.count + 1, sizeof(*cut));
	if (!l.v || !infos || !ptrs || !cut) {
		free(l.v);
		free(infos);
		free(ptrs);
		free(cut);
		return fail(rq, -ENOMEM, "out of memory");
	}
	visit_for(e, rq, list_one, &l);
	qsort(l.v, l.n, sizeof(*l.v), list_order);
	size_t budget = e->cfg.max_frame > 1024 ? e->cfg.max_frame - 512 : 512, used = 0, n = 0;
	char next[SESSION_ID_MAX + 16] = "";
	for (size_t i = 0; i < l.n; i++) {
		struct session *s = l.v[i];
		if (cursor && *cursor && !after_cursor(s, cursor))
			continue;
		struct info_env env = engine_info_env(e, s);
		reply_session_info(s, &env, &infos[n]);
		if (s->system && strlen(s->system) > LIST_SYSTEM_MAX) {
			size_t k = utf8_valid_prefix(s->system, LIST_SYSTEM_MAX);
			memcpy(cut[n], s->system, k);
			cut[n][k] = 0;
			infos[n].system = cut[n];
			PB_SET(&infos[n], system_cut, 1);
		}
		size_t size = llamad__session_info__get_packed_size(&infos[n]) + 6;
		if (n > 0 && used + size > budget) {   /* the page is full: more follow */
			const struct session *last = l.v[i - 1];
			snprintf(next, sizeof(next), "%s/%u", last->id, (unsigned)last->uid);
			break;
		}
		used += size;
		ptrs[n] = &infos[n];
		n++;
	}
	Llamad__SessionList sl = LLAMAD__SESSION_LIST__INIT;
	sl.n_sessions = n;
	sl.sessions = ptrs;
	if (*next)
		sl.next = next;
	Llamad__Response r = response(LLAMAD__RESPONSE__BODY_SESSIONS);
	r.sessions = &sl;
	reply_body(e, rq, &r);
	free(l.v);
	free(infos);
	free(ptrs);
	free(cut);
	return 0;
}

static int on_rewind(struct engine *e, struct req *rq)
{
	struct session *s = rq->s;
	if (sess_rewind(&e->st, s) < 0)
		return fail(rq, -EINVAL, "session '%s' has no turn to remove", s->id);
	s->last_use_ms = clock_unix_ms();
	s->dirty = 1;
	send_info(e, rq->conn, rq->id, s, -1);
	return 0;
}

static int on_tokenize(struct engine *e, struct req *rq)
{
	const Llamad__Tokenize *t = rq->q->tokenize;
	int32_t *ids = NULL;
	const char *text = t->text ? t->text : "";
	int n = tok_encode(e->m->tok, text, strlen(text), t->add_bos, &ids);
	uint32_t *u = n > 0 ? malloc((size_t)n * sizeof(uint32_t)) : NULL;
	char **pieces = n > 0 ? malloc((size_t)n * sizeof(char *)) : NULL;
	ProtobufCBinaryData *texts = n > 0 ? malloc((size_t)n * sizeof(*texts)) : NULL;
	size_t room = 0;   /* a token's text is never longer than its piece */
	for (int i = 0; i < n && pieces; i++) {
		pieces[i] = (char *)tok_piece(e->m->tok, ids[i]);
		room += pieces[i] ? strlen(pieces[i]) : 0;
	}
	char *buf = n > 0 ? malloc(room + 1) : NULL;
	if (n < 0 || (n > 0 && (!u || !pieces || !texts || !buf))) {
		free(ids);
		free(u);
		free(pieces);
		free(texts);
		free(buf);
		return n < 0 ? fail(rq, -EPROTO, "cannot tokenize the text") : fail(rq, -ENOMEM,
										     "out of memory");
	}
	size_t at = 0;
	for (int i = 0; i < n; i++) {
		u[i] = (uint32_t)ids[i];
		size_t k = tok_text(e->m->tok, ids[i], buf + at, room - at);
		texts[i] = (ProtobufCBinaryData){ k, (uint8_t *)buf + at };
		at += k;
	}
	Llamad__Tokens tk = LLAMAD__TOKENS__INIT;
	tk.n_tokens = (size_t)n;
	tk.tokens = u;
	tk.n_pieces = (size_t)n;
	tk.pieces = pieces;
	tk.n_texts = (size_t)n;
	tk.texts = texts;
	Llamad__Response r = response(LLAMAD__RESPONSE__BODY_TOKENS);
	r.tokens = &tk;
	reply_body(e, rq, &r);
	free(ids);
	free(u);
	free(pieces);
	free(texts);
	free(buf);
	return 0;
}

static int on_detokenize(struct engine *e, struct req *rq)
{
	const Llamad__Detokenize *d = rq->q->detokenize;
	for (size_t i = 0; i < d->n_tokens; i++)
		if (d->tokens[i] >= (uint32_t)e->m->cfg.vocab)
			return fail(rq, -EINVAL, "token %u is outside the vocabulary (%d)",
				    d->tokens[i], e->m->cfg.vocab);
	int32_t *ids = malloc((d->n_tokens + 1) * sizeof(int32_t));
	if (!ids)
		return fail(rq, -ENOMEM, "out of memory");
	for (size_t i = 0; i < d->n_tokens; i++)
		ids[i] = (int32_t)d->tokens[i];
	char *text = NULL;
	int n = tok_decode(e->m->tok, ids, (int)d->n_tokens, &text);
	free(ids);
	if (n < 0)
		return fail(rq, -EPROTO, "cannot decode");
	Llamad__Text t = LLAMAD__TEXT__INIT;
	t.text = text;
	Llamad__Response r = response(LLAMAD__RESPONSE__BODY_TEXT);
	r.text = &t;
	reply_body(e, rq, &r);
	free(text);
	return 0;
}

static int cancel_parked(struct engine *e, uint64_t conn, uint64_t id, const struct session *s);

/* Cancel{session}: whatever runs in the session and every request waiting
 * for it, whichever connection sent them (the caller owns the session). */
static int cancel_session(struct engine *e, struct req *rq, const char *name)
{
	struct session *s = find_for(e, rq, name);
	if (!s)
		return fail(rq, -ENOENT, "no session named '%s'", name);
	for (struct job *j = e->jobs; j; j = j->next)
		if (j->s == s && !j->cancelled)
			j->cancelled = 1;
	cancel_parked(e, 0, 0, s);
	reply_ok(e, rq);
	return 0;
}

static int on_cancel(struct engine *e, struct req *rq)
{
	const Llamad__Cancel *c = rq->q->cancel;
	if (c->session)
		return cancel_session(e, rq, c->session);
	/* a running request first (of several with that id: any one), else
	 * the first waiting one */
	for (struct job *j = e->jobs; j; j = j->next) {
		if (j->conn == rq->conn && j->req_id == c->request_id && !j->cancelled) {
			j->cancelled = 1;
			reply_ok(e, rq);
			return 0;
		}
	}
	if (cancel_parked(e, rq->conn, c->request_id, NULL)) {
		reply_ok(e, rq);
		return 0;
	}
	return fail(rq, -ESRCH, "no running request with id %llu on this connection",
		    (unsigned long long)c->request_id);
}

static uint64_t rss_bytes(void)
{
	FILE *f = fopen("/proc/self/statm", "re");
	unsigned long size = 0, res = 0;
	if (f) {
		if (fscanf(f, "%lu %lu", &size, &res) != 2)
			res = 0;
		fclose(f);
	}
	return (uint64_t)res * (uint64_t)sysconf(_SC_PAGESIZE);
}

/* h as the wire's Histogram (pointing into h). */
static void wire_hist(const struct hist *h, Llamad__Histogram *w)
{
	llamad__histogram__init(w);
	w->n_le = h->n_le;
	w->le = (double *)h->le;
	w->n_counts = h->n_le + 1;
	w->counts = (uint64_t *)h->counts;
	PB_SET(w, sum, h->sum);
	PB_SET(w, count, h->count);
}

/*
 * Status: root and the daemon's own user see every user's figures; any
 * other caller (a gateway's caller as well: the uid it acts for) sees its
 * own sessions, requests, tokens and files, and nothing that counts other
 * users' work (Status.own).
 */
static int on_status(struct engine *e, struct req *rq)
{
	int all = rq->uid == 0 || rq->uid == geteuid();
	const struct res_counters *n = &e->res.n;
	Llamad__Counters c = LLAMAD__COUNTERS__INIT;
	int open = 0;
	if (all) {
		PB_SET(&c, requests, e->n_requests);
		PB_SET(&c, errors, reply_errors());
		PB_SET(&c, prefilled_tokens, e->n_prefilled);
		PB_SET(&c, generated_tokens, e->n_generated);
		PB_SET(&c, forward_passes, e->n_forward);
		PB_SET(&c, cow_copies, e->pool->cow_copies);
		PB_SET(&c, prefix_hit_tokens, e->st.prefix_hit_tokens);
		PB_SET(&c, block_files_written, e->res.n.blocks_written);
		PB_SET(&c, block_files_removed, e->res.n.blocks_removed);
		PB_SET(&c, block_files_refused, e->res.n.blocks_refused);
		PB_SET(&c, evictions_ram, n->evict_ram);
		PB_SET(&c, evictions_disk, n->evict_disk);
		PB_SET(&c, restores, n->restores);
		PB_SET(&c, saves, n->saves);
		PB_SET(&c, save_errors, n->save_errors);
		PB_SET(&c, files_set_aside, n->set_aside);
		pthread_mutex_lock(&e->mu);
		PB_SET(&c, connections, e->conns_accepted);
		open = e->conns_open;
		pthread_mutex_unlock(&e->mu);
	} else {
		const struct uid_stats *u = engine_uid_stats(e, rq->uid);
		PB_SET(&c, requests, u->requests);
		PB_SET(&c, prefilled_tokens, u->prefilled);
		PB_SET(&c, generated_tokens, u->generated);
	}
	Llamad__Status st = LLAMAD__STATUS__INIT;
	st.server = (char *)"llamad " LLAMAD_VERSION;
	st.model = e->model_desc;
	st.backend = e->backend_name;
	if (e->be->host_mem)  /* CPU worker threads; a GPU's desc says the rest */
		PB_SET(&st, threads, (uint32_t)e->be->n_threads);
	PB_SET(&st, uptime_s, clock_mono_s() - e->t_start);
	/* a non-root client sees only the count of its own sessions */
	struct count_ctx k = { 0 };
	visit_for(e, rq, count_one, &k);
	PB_SET(&st, sessions, (uint32_t)k.n);
	PB_SET(&st, sessions_in_ram, (uint32_t)k.in_ram);
	PB_SET(&st, sessions_on_disk, (uint32_t)k.on_disk);
	PB_SET(&st, active, (uint32_t)k.active);
	st.state_dir = e->res.dir ? e->res.dir : (char *)"";
	PB_SET(&st, ram_bytes_total, e->cfg.ram_cache);
	st.chat_template = e->default_tmpl_why;
	PB_SET(&st, kv_blocks_total, (uint32_t)e->pool->kv.n_blocks);
	PB_SET(&st, kv_block_tokens, (uint32_t)e->pool->kv.block_size);
	PB_SET(&st, kv_bytes_total, (uint64_t)e->pool->kv.n_blocks * kt_kv_block_bytes(&e->pool->kv));
	st.kv_type = (char *)kt_dtype_name(e->pool->kv.dtype);
	PB_SET(&st, prefix_sharing, e->st.share != 0);
	PB_SET(&st, weight_bytes, e->m->weight_bytes);
	PB_SET(&st, context_length, (uint32_t)engine_session_limit(e));
	st.counters = &c;
	Llamad__Histogram ttft, token_time;
	struct res_disk d;
	res_disk_use(&e->res, all ? 0 : rq->uid, &d);  /* all: every user's files */
	PB_SET(&st, block_files, d.blocks);
	PB_SET(&st, block_file_bytes, d.block_bytes);
	if (all) {
		PB_SET(&st, ram_bytes_used, (uint64_t)e->res.ram_used);
		PB_SET(&st, connections, (uint32_t)open);
		PB_SET(&st, kv_blocks_free, (uint32_t)kvpool_n_free(e->pool));
		PB_SET(&st, kv_blocks_cached, (uint32_t)kvpool_n_cached(e->pool));
		wire_hist(&e->ttft, &ttft);
		wire_hist(&e->token_time, &token_time);
		st.ttft = &ttft;
		st.token_time = &token_time;
		PB_SET(&st, rss_bytes, rss_bytes());
	} else {
		PB_SET(&st, own, 1);
	}
	if (e->res.dir) {
		PB_SET(&st, disk_bytes, d.bytes);
		PB_SET(&st, disk_quota_bytes, res_disk_quota(&e->res, rq->uid));
	}
	Llamad__Response r = response(LLAMAD__RESPONSE__BODY_STATUS);
	r.status = &st;
	reply_body(e, rq, &r);
	return 0;
}

struct save_ctx {
	struct engine *e;
	struct res_saved *out;
};

static void save_one(struct session *s, void *ctx)
{
	struct save_ctx *sc = ctx;
	res_save_into(&sc->e->res, s, 0, sc->out);
}

static int on_save(struct engine *e, struct req *rq)
{
	const Llamad__Save *sv = rq->q->save;
	if (!e->res.dir)
		return fail(rq, -EIO, "persistence is off (state_dir = none)");
	struct res_saved c = { 0 };
	if (sv->all) {
		struct save_ctx sc = { e, &c };
		visit_for(e, rq, save_one, &sc);
	} else {
		struct session *s = sv->session ? find_for(e, rq, sv->session) : NULL;
		if (!s)
			return fail(rq, -ENOENT, "no session named '%s'", sv->session ? sv->session : "");
		if (s->ephemeral)
			return fail(rq, -EINVAL, "session '%s' is ephemeral: it is never saved", s->id);
		res_save_into(&e->res, s, 1, &c);  /* in RAM or on disk: saved already */
	}
	if (c.errors) {
		int rc = c.first_rc == -EDQUOT ? -EDQUOT : -EIO;
		fail(rq, rc, "%d session%s not saved: %s", c.errors, c.errors == 1 ? "" : "s",
		     c.first_error ? c.first_error : "");
		free(c.first_error);
		return rc;
	}
	Llamad__Saved sd = LLAMAD__SAVED__INIT;
	PB_SET(&sd, sessions, (uint32_t)c.n);
	PB_SET(&sd, bytes, c.bytes);
	PB_SET(&sd, block_bytes, c.block_bytes);
	Llamad__Response r = response(LLAMAD__RESPONSE__BODY_SAVED);
	r.saved = &sd;
	reply_body(e, rq, &r);
	return 0;
}

/* ---- transcripts --------------------------------------------------------------- */

_Static_assert(SESS_END_MAX == LLAMAD__STOP_REASON__STOP_CANCELLED &&
	       (int)LLAMAD__ROLE__ROLE_RAW == CHAT_RAW && (int)LLAMAD__ROLE__ROLE_USER == CHAT_USER,
	       "a turn's end and role are the wire's StopReason and Role");

/* Bytes a message of `size` bytes takes as a length-delimited field. */
static size_t field_bytes(size_t size)
{
	size_t n = 2;  /* tag, and the length's first byte */
	for (size_t v = size >> 7; v; v >>= 7)
		n++;
	return n + size;
}

/* Turn i of h into *t; its text (and ids) malloc'd into *own / *ids. */
static int fill_turn(struct engine *e, const struct session *h, int i, int with_ids,
		     Llamad__Turn *t, char **own, uint32_t **ids)
{
	const struct sess_turn *st = &h->turns[i];
	int a = st->start, b = i + 1 < h->n_turns ? h->turns[i + 1].start : h->n_tokens;
	llamad__turn__init(t);
	*own = NULL;
	*ids = NULL;
	PB_SET(t, index, (uint32_t)i);
	PB_SET(t, role, (Llamad__Role)st->role);
	PB_SET(t, tokens, (uint32_t)(b - a));
	PB_SET(t, start, (uint32_t)a);
	int generated = !st->text && st->role == CHAT_ASSISTANT;
	PB_SET(t, generated, generated);
	if (st->end) {
		PB_SET(t, stop_reason, (Llamad__StopReason)st->end);
	}
	if (st->slid > 0) {
		PB_SET(t, slid_tokens, (uint32_t)st->slid);
	}
	if (st->text) {
		t->text = st->text;
	} else if (chat_answer_text(e->m->tok, h->tmpl, h->tokens + a, b - a, own) < 0) {
		return -ENOMEM;
	} else {
		t->text = *own;
	}
	if (with_ids && b > a) {
		if (!(*ids = malloc((size_t)(b - a) * sizeof(uint32_t))))
			return -ENOMEM;
		for (int k = a; k < b; k++)
			(*ids)[k - a] = (uint32_t)h->tokens[k];
		t->n_token_ids = (size_t)(b - a);
		t->token_ids = *ids;
	}
	return 0;
}

/* Cut t to fit room bytes as a field: token ids dropped, the text cut at a
 * character boundary. */
static void cut_turn(Llamad__Turn *t, size_t room)
{
	t->n_token_ids = 0;
	PB_SET(t, truncated, 1);
	size_t fixed = field_bytes(protobuf_c_message_get_packed_size(&t->base)) -
		       (t->text ? strlen(t->text) : 0);
	size_t keep = room > fixed + 8 ? room - fixed - 8 : 0;
	if (t->text && strlen(t->text) > keep)
		t->text[utf8_valid_prefix(t->text, keep)] = '\0';
}

static int on_transcript(struct engine *e, struct req *rq)
{
	const Llamad__GetTranscript *g = rq->q->transcript;
	struct session tmp, *h;
	char *cause = NULL;
	int rc = res_history(&e->res, rq->s, &tmp, &h, &cause);
	if (rc) {
		fail(rq, rc, "%s", cause ? cause : "cannot read the session");
		free(cause);
		return rc;
	}
	int n = h->n_turns;
	int a = g->has_from_turn && g->from_turn < (uint32_t)n ? (int)g->from_turn
				: g->has_from_turn ? n : 0;
	if (g->last_turns && (uint32_t)(n - a) > g->last_turns)
		a = n - (int)g->last_turns;
	Llamad__Transcript tr = LLAMAD__TRANSCRIPT__INIT;
	tr.session = rq->s->id;
	PB_SET(&tr, turns, (uint32_t)n);
	PB_SET(&tr, first, (uint32_t)a);
	PB_SET(&tr, next, (uint32_t)n);  /* its size, for the budget; set below */
	PB_SET(&tr, template_, (Llamad__Template)h->tmpl);
	PB_SET(&tr, location, (Llamad__Location)rq->s->loc);
	PB_SET(&tr, busy, rq->s->busy);
	PB_SET(&tr, dropped_turns, rq->s->shift_turns);   /* kept while the daemon runs */
	PB_SET(&tr, dropped_tokens, rq->s->shift_tokens);
	tr.system = h->system;
	/* the reply fits a frame of max_frame bytes: room for the Response
	 * around it, then turns while they fit (at least one, cut if it must) */
	size_t budget = e->cfg.max_frame - 32, used = protobuf_c_message_get_packed_size(&tr.base);
	if (used > budget / 2) {
		tr.system = NULL;  /* a system prompt that crowds out the turns */
		used = protobuf_c_message_get_packed_size(&tr.base);
	}
	Llamad__Turn *turns = calloc((size_t)(n - a) + 1, sizeof(*turns));
	Llamad__Turn **ptrs = calloc((size_t)(n - a) + 1, sizeof(*ptrs));
	char **own = calloc((size_t)(n - a) + 1, sizeof(*own));
	uint32_t **ids = calloc((size_t)(n - a) + 1, sizeof(*ids));
	int k = 0;
	rc = turns && ptrs && own && ids ? 0 : -ENOMEM;
	for (int i = a; i < n && !rc; i++, k++) {
		Llamad__Turn *t = &turns[k];
		rc = fill_turn(e, h, i, g->token_ids, t, &own[k], &ids[k]);
		if (rc)
			break;
		size_t sz = field_bytes(protobuf_c_message_get_packed_size(&t->base));
		if (used + sz > budget) {
			if (k > 0)
				break;
			if (!own[k] && t->text && !(t->text = own[k] = strdup(t->text))) {
				rc = -ENOMEM;
				break;
			}
			cut_turn(t, budget - used);
			sz = field_bytes(protobuf_c_message_get_packed_size(&t->base));
		}
		used += sz;
		ptrs[k] = t;
	}
	if (!rc) {
		PB_SET(&tr, next, (uint32_t)(a + k));
		tr.n_items = (size_t)k;
		tr.items = ptrs;
		Llamad__Response r = response(LLAMAD__RESPONSE__BODY_TRANSCRIPT);
		r.transcript = &tr;
		reply_body(e, rq, &r);
	}
	for (int i = 0; own && i <= n - a; i++) {
		free(own[i]);
		free(ids[i]);
	}
	free(turns);
	free(ptrs);
	free(own);
	free(ids);
	if (h == &tmp)
		sess_clear_history(&e->st, &tmp);
	return rc ? fail(rq, rc, "out of memory") : 0;
}

/* ---- the table -------------------------------------------------------------- */

#define NAMED(field, name) \
	static const char *session_of_##field(const Llamad__Request *q) { return q->field->name; }
NAMED(append, session)
NAMED(generate, session)
NAMED(fork, session)
NAMED(drop, session)
NAMED(info, session)
NAMED(rewind, session)
NAMED(transcript, session)
#undef NAMED

struct op {
	Llamad__Request__OpCase op;
	int (*run)(struct engine *e, struct req *rq);
	unsigned pre;
	const char *(*session_of)(const Llamad__Request *q);  /* NEED_SESSION */
};

static const struct op ops[] = {
	{ LLAMAD__REQUEST__OP_HELLO, on_hello, 0, NULL },
	{ LLAMAD__REQUEST__OP_OPEN, on_open, 0, NULL },
	{ LLAMAD__REQUEST__OP_APPEND, on_append, NEED_SESSION | NOT_BUSY | RESIDENT, session_of_append },
	{ LLAMAD__REQUEST__OP_GENERATE, on_generate, NEED_SESSION | NOT_BUSY | RESIDENT,
	  session_of_generate },
	{ LLAMAD__REQUEST__OP_FORK, on_fork, NEED_SESSION | QUOTA | RESIDENT, session_of_fork },
	{ LLAMAD__REQUEST__OP_DROP, on_drop, NEED_SESSION | NOT_BUSY, session_of_drop },
	{ LLAMAD__REQUEST__OP_LIST, on_list, 0, NULL },
	{ LLAMAD__REQUEST__OP_INFO, on_info, NEED_SESSION, session_of_info },
	{ LLAMAD__REQUEST__OP_REWIND, on_rewind, NEED_SESSION | NOT_BUSY | RESIDENT, session_of_rewind },
	{ LLAMAD__REQUEST__OP_TOKENIZE, on_tokenize, 0, NULL },
	{ LLAMAD__REQUEST__OP_DETOKENIZE, on_detokenize, 0, NULL },
	{ LLAMAD__REQUEST__OP_CANCEL, on_cancel, 0, NULL },
	{ LLAMAD__REQUEST__OP_STATUS, on_status, 0, NULL },
	{ LLAMAD__REQUEST__OP_SAVE, on_save, 0, NULL },
	{ LLAMAD__REQUEST__OP_TRANSCRIPT, on_transcript, NEED_SESSION, session_of_transcript },
};

/* The preconditions of op for rq: 0 or -errno with rq->msg. */
static int check(struct engine *e, const struct op *op, struct req *rq)
{
	if (op->pre & NEED_SESSION) {
		const char *name = op->session_of(rq->q);
		rq->s = name ? find_for(e, rq, name) : NULL;
		if (!rq->s)
			return fail(rq, -ENOENT, "no session named '%s'", name ? name : "");
	}
	if ((op->pre & NOT_BUSY) && rq->s->busy)
		return fail(rq, -EBUSY, "session '%s' is running another request", rq->s->id);
	int rc;
	if ((op->pre & QUOTA) && (rc = check_quota(e, rq)))
		return rc;
	if (op->pre & RESIDENT) {
		char *cause = NULL;
		rc = res_ensure(&e->res, rq->s, &cause);
		if (rc)
			fail(rq, rc, "%s", cause ? cause : strerror(-rc));
		free(cause);
		return rc;
	}
	return 0;
}

static const struct op *op_of(const Llamad__Request *q)
{
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
		if (ops[i].op == q->op_case)
			return &ops[i];
	return NULL;
}

/* Run request c now. */
static void run_request(struct engine *e, const struct cmd *c)
{
	const Llamad__Request *q = c->req;
	struct req rq = { .conn = c->conn, .id = q->id, .uid = c->uid, .own_only = c->own_only,
			  .t_arrive = c->t_arrive, .q = q };
	const struct op *op = op_of(q);
	int rc = op ? check(e, op, &rq) : fail(&rq, -ENOSYS, "unknown operation");
	if (rc == 0)
		rc = op->run(e, &rq);
	if (rc)
		engine_error(e, rq.conn, rq.id, rc, "%s", rq.msg);
}

/* The session a waiting-capable request names, as its sender sees it, or
 * NULL (no such session, or an operation that never waits). */
static struct session *waits_for(struct engine *e, const struct cmd *c)
{
	const struct op *op = op_of(c->req);
	if (!op || !(op->pre & NOT_BUSY))
		return NULL;
	const char *name = op->session_of(c->req);
	return name ? find_as(e, c->uid, c->own_only, name) : NULL;
}

int handle_request(struct engine *e, struct cmd *c)
{
	e->n_requests++;
	engine_uid_stats(e, c->uid)->requests++;
	struct session *s = waits_for(e, c);
	int queued = 0;
	for (struct cmd *p = e->parked_head; s && p; p = p->next)
		queued += waits_for(e, p) == s;
	if (!s || (!s->busy && !queued)) {
		run_request(e, c);
		return 0;
	}
	if (queued >= PARK_MAX) {
		engine_error(e, c->conn, c->req->id, -EBUSY, "session '%s' has %d requests "
			     "waiting to run (at most %d)", s->id, queued, PARK_MAX);
		return 0;
	}
	park_push(e, c);
	return 1;
}



void run_parked(struct engine *e)
{
	struct cmd *prev = NULL;
	for (struct cmd *c = e->parked_head, *n; c; c = n) {
		n = c->next;
		struct session *s = waits_for(e, c);
		if (s && s->busy) {   /* still busy: it, and those after it, wait */
			prev = c;
			continue;
		}
		park_remove(e, prev, c);
		run_request(e, c);
		cmd_free(c);
		n = prev ? prev->next : e->parked_head;  /* the list may have changed */
	}
}


/* Cancel waiting requests: with s NULL the first one of conn with id,
 * else every one waiting for session s. Each reply says it never ran (a
 * Generate: Done STOP_CANCELLED, nothing generated; others: CANCELLED).
 * Returns how many were cancelled. */
static int cancel_parked(struct engine *e, uint64_t conn, uint64_t id, const struct session *s)
{
	int n = 0;
	for (struct cmd *c = e->parked_head, *prev = NULL, *next; c; c = next) {
		next = c->next;
		if (s ? waits_for(e, c) != s : c->conn != conn || c->req->id != id) {
			prev = c;
			continue;
		}
		park_remove(e, prev, c);
		n++;
		uint64_t to = c->conn, rid = c->req->id;
		if (c->req->op_case == LLAMAD__REQUEST__OP_GENERATE) {
			const struct session *ws = waits_for(e, c);
			Llamad__Done d = LLAMAD__DONE__INIT;
			PB_SET(&d, reason, LLAMAD__STOP_REASON__STOP_CANCELLED);
			PB_SET(&d, prompt_tokens, 0);
			PB_SET(&d, generated_tokens, 0);
			PB_SET(&d, session_tokens, ws ? sess_length(ws) : 0);
			PB_SET(&d, dropped_turns, 0);
			PB_SET(&d, dropped_tokens, 0);
			PB_SET(&d, slid_tokens, 0);
			Llamad__Response r = response(LLAMAD__RESPONSE__BODY_DONE);
			PB_SET(&r, id, rid);
			r.done = &d;
			engine_reply(e, to, &r);
		} else {
			engine_error(e, to, rid, -ECANCELED, "cancelled before it ran");
		}
		cmd_free(c);
		if (!s)
			return n;
	}
	return n;
}

/* ---- a connection goes -------------------------------------------------------- */

struct gone_ctx {
	struct engine *e;
	uint64_t conn;
};

static void drop_ephemeral(struct session *s, void *ctx)
{
	struct gone_ctx *g = ctx;
	if (!s->ephemeral || s->owner_conn != g->conn)
		return;
	if (s->busy)
		s->owner_conn = 0;  /* orphaned: its job's end drops it (job_remove) */
	else
		res_drop(&g->e->res, s, 0);
}

void handle_disconnect(struct engine *e, uint64_t conn)
{
	for (struct job *j = e->jobs; j; j = j->next)
		if (j->conn == conn)
			j->cancelled = 2;
	park_drop_conn(e, conn);
	struct gone_ctx g = { e, conn };
	sess_foreach(&e->st, 0, drop_ephemeral, &g);
}

/*
 * daemon/engine.c — see engine.h.
 *
 * Everything here runs on the engine thread except the queue functions at
 * the bottom (engine_submit, engine_disconnect, engine_take_out, ...), which
 * only touch the two queues under e->mu.
 *
 * Session history and the cache: tokens[0, n_cached) have K/V; the rest are
 * pending. An append job prefills all pending tokens but the last (the one
 * whose logits the next generation needs); a generate job runs the pending
 * tokens with logits for the last one, samples, appends the sample (pending
 * again) and repeats. So a turn costs only its own tokens.
 */
#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <systemd/sd-daemon.h>

#include "daemon/engine.h"
#include "daemon/log.h"
#include "daemon/version.h"
#include "model/chat.h"
#include "model/forward.h"
#include "model/sampler.h"
#include "model/stop.h"
#include "proto/frame.h"
#include "session/session.h"
#include "session/store.h"

#define KV_BLOCK_TOKENS 16
#define MAX_STOPS 16

enum cmd_kind { CMD_REQUEST, CMD_DISCONNECT };

struct cmd {
	struct cmd *next;
	int kind;
	uint64_t conn;
	uid_t uid;
	Llamad__Request *req;
};

enum job_kind { JOB_APPEND, JOB_GENERATE };

struct job {
	struct job *next;
	int kind;
	uint64_t conn, req_id;
	struct session *s;
	int cancelled;           /* 1: Cancel, 2: client gone */
	int tokens_added;        /* append: the turn's tokens */
	int prompt_tokens;       /* tokens prefilled by this request */
	int generated;
	int max_tokens;
	int answer_turn;         /* generate: assistant turn opened */
	struct sampler smp;
	struct detok dt;
	struct stopper stop;
	char *text;              /* text released by the stopper this step */
	size_t n_text, cap_text;
	double t0, t_first;
	float *logits;
};

struct engine {
	struct model *m;
	struct backend *be;
	struct fwd *fwd;
	struct kvpool *pool;
	struct sess_table st;
	struct config cfg;       /* engine-thread copy; reload under mu */
	struct config pending_cfg;
	int have_pending_cfg;
	char backend_name[96];
	char model_desc[512];
	int ctx;                 /* model context length */
	int step_cap;            /* scratch rows of fwd */

	pthread_t thread;
	int started;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct cmd *cmd_head, *cmd_tail;
	struct engine_out *out_head, *out_tail;
	int notify_fd;
	uint64_t fail_after;     /* LLAMAD_TEST_FAIL_AFTER (tests): fail at pass N */
	int idle_ticks, trimmed; /* seconds idle; memory given back since */
	int shutdown;
	int finished;
	int conns_open;
	uint64_t conns_accepted;

	struct job *jobs;
	int n_jobs;
	unsigned rr;             /* round-robin start */
	struct fwd_seq *seqs;
	struct job **batch;
	int batch_cap;
	int out_pending;

	double t_start;
	uint64_t n_requests, n_errors, n_prefilled, n_generated, n_forward;

	/* persistence and eviction */
	char *state_dir;         /* NULL: persistence off */
	size_t ram_used;         /* bytes of evicted K/V in host memory */
	unsigned evict_scan;     /* current eviction pass (see evict_one) */
	double last_idle_scan;
	uint64_t n_evict_ram, n_evict_disk, n_restores, n_saves, n_save_errors;
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int64_t unix_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- output ---------------------------------------------------------- */

static void queue_out(struct engine *e, struct engine_out *o)
{
	pthread_mutex_lock(&e->mu);
	if (e->out_tail) {
		e->out_tail->next = o;  /* the event thread has a wake-up coming */
	} else {
		e->out_head = o;
		e->out_pending = 1;
	}
	e->out_tail = o;
	pthread_mutex_unlock(&e->mu);
}

static void flush_notify(struct engine *e)
{
	if (!e->out_pending)
		return;
	e->out_pending = 0;
	uint64_t one = 1;
	if (write(e->notify_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		log_msg(LL_ERROR, "engine: cannot signal the event loop: %s", strerror(errno));
}

static void send_response(struct engine *e, uint64_t conn, Llamad__Response *r)
{
	size_t n = llamad__response__get_packed_size(r);
	struct engine_out *o = malloc(sizeof(*o) + FRAME_HDR + n);
	if (!o) {
		log_msg(LL_ERROR, "engine: out of memory for a reply to connection %llu",
			(unsigned long long)conn);
		return;
	}
	o->next = NULL;
	o->conn = conn;
	o->len = FRAME_HDR + n;
	frame_put_len(o->data, (uint32_t)n);
	llamad__response__pack(r, o->data + FRAME_HDR);
	queue_out(e, o);
}

static void send_error(struct engine *e, uint64_t conn, uint64_t id, int code,
		       const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static void send_error(struct engine *e, uint64_t conn, uint64_t id, int code,
		       const char *fmt, ...)
{
	char msg[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	Llamad__Error err = LLAMAD__ERROR__INIT;
	PB_SET(&err, code, code);
	err.message = msg;
	Llamad__Response r = LLAMAD__RESPONSE__INIT;
	PB_SET(&r, id, id);
	r.body_case = LLAMAD__RESPONSE__BODY_ERROR;
	r.error = &err;
	e->n_errors++;
	send_response(e, conn, &r);
}

static void send_ok(struct engine *e, uint64_t conn, uint64_t id)
{
	Llamad__Ok ok = LLAMAD__OK__INIT;
	Llamad__Response r = LLAMAD__RESPONSE__INIT;
	PB_SET(&r, id, id);
	r.body_case = LLAMAD__RESPONSE__BODY_OK;
	r.ok = &ok;
	send_response(e, conn, &r);
}

static int session_limit(const struct engine *e)
{
	int lim = e->ctx;
	if (e->cfg.max_session_tokens > 0 && e->cfg.max_session_tokens < lim)
		lim = e->cfg.max_session_tokens;
	return lim;
}

static void fill_info(struct engine *e, struct session *s, Llamad__SessionInfo *i)
{
	llamad__session_info__init(i);
	i->session = s->id;
	PB_SET(i, tokens, s->loc == SESS_DISK ? s->disk_tokens : (uint32_t)s->n_tokens);
	PB_SET(i, location, s->loc);
	PB_SET(i, saved, !s->dirty && s->file_bytes > 0);
	PB_SET(i, file_bytes, s->file_bytes);
	PB_SET(i, cached_tokens, (uint32_t)s->n_cached);
	PB_SET(i, kv_blocks, (uint32_t)s->kv.n_blocks);
	PB_SET(i, kv_bytes, (uint64_t)s->kv.n_blocks * kt_kv_block_bytes(&e->pool->kv));
	PB_SET(i, shared_blocks, (uint32_t)sess_shared_blocks(&e->st, s));
	PB_SET(i, last_use_ms, s->last_use_ms);
	PB_SET(i, template_, s->tmpl);
	PB_SET(i, context_policy, s->policy);
	PB_SET(i, turns, (uint32_t)s->n_turns);
	PB_SET(i, busy, s->busy);
	PB_SET(i, prefilled_tokens, s->prefilled);
	PB_SET(i, generated_tokens, s->generated);
	i->system = s->system;
	PB_SET(i, owner_uid, (uint32_t)s->uid);
	PB_SET(i, ephemeral, s->ephemeral);
	PB_SET(i, context_length, (uint32_t)session_limit(e));
}

static void send_info(struct engine *e, uint64_t conn, uint64_t id, struct session *s,
		      int created, int tokens_added)
{
	Llamad__SessionInfo info;
	fill_info(e, s, &info);
	if (created >= 0) {
		PB_SET(&info, created, created);
	}
	if (tokens_added >= 0) {
		PB_SET(&info, tokens_added, (uint32_t)tokens_added);
	}
	Llamad__Response r = LLAMAD__RESPONSE__INIT;
	PB_SET(&r, id, id);
	r.body_case = LLAMAD__RESPONSE__BODY_SESSION;
	r.session = &info;
	send_response(e, conn, &r);
}

/* ---- jobs --------------------------------------------------------------- */

static void job_free(struct job *j)
{
	if (!j)
		return;
	if (j->kind == JOB_GENERATE) {
		sampler_done(&j->smp);
		stopper_done(&j->stop);
	}
	free(j->text);
	free(j->logits);
	free(j);
}

static void job_add(struct engine *e, struct job *j)
{
	j->next = e->jobs;
	e->jobs = j;
	e->n_jobs++;
	j->s->busy = 1;
}

static void job_remove(struct engine *e, struct job *j)
{
	for (struct job **pp = &e->jobs; *pp; pp = &(*pp)->next) {
		if (*pp == j) {
			*pp = j->next;
			e->n_jobs--;
			break;
		}
	}
	struct session *s = j->s;
	s->busy = 0;
	s->dirty = 1;
	s->last_use_ms = unix_ms();
	job_free(j);
	/* an ephemeral session whose connection went away while it was busy
	 * (see handle_disconnect) goes with its last job */
	if (s->ephemeral && s->owner_conn == 0)
		sess_drop(&e->st, s);
}

static void emit_text(void *ctx, const char *text, size_t len)
{
	struct job *j = ctx;
	if (j->n_text + len + 1 > j->cap_text) {
		size_t c = j->cap_text ? j->cap_text * 2 : 256;
		while (c < j->n_text + len + 1)
			c *= 2;
		char *p = realloc(j->text, c);
		if (!p)
			return;  /* text of this event lost; the tokens are still sent */
		j->text = p;
		j->cap_text = c;
	}
	memcpy(j->text + j->n_text, text, len);
	j->n_text += len;
	j->text[j->n_text] = 0;
}

static void send_token_event(struct engine *e, struct job *j, const int32_t *tok, int n)
{
	Llamad__TokenEvent ev = LLAMAD__TOKEN_EVENT__INIT;
	uint32_t ids[1];
	ev.text = j->text ? j->text : (char *)"";
	if (n > 0) {
		ids[0] = (uint32_t)tok[0];
		ev.n_tokens = 1;
		ev.tokens = ids;
	}
	Llamad__Response r = LLAMAD__RESPONSE__INIT;
	PB_SET(&r, id, j->req_id);
	r.body_case = LLAMAD__RESPONSE__BODY_TOKEN;
	r.token = &ev;
	if (j->cancelled != 2)
		send_response(e, j->conn, &r);
	j->n_text = 0;
	if (j->text)
		j->text[0] = 0;
}

/* End a generate job with Done. */
static void finish_generate(struct engine *e, struct job *j, int reason)
{
	char buf[64];
	int k = detok_flush(&j->dt, buf, sizeof(buf));
	if (k > 0)
		stopper_push(&j->stop, buf, (size_t)k, emit_text, j);
	if (reason != LLAMAD__STOP_REASON__STOP_STRING)
		stopper_flush(&j->stop, emit_text, j);
	if (j->n_text)
		send_token_event(e, j, NULL, 0);
	double t = now_s();
	Llamad__Done d = LLAMAD__DONE__INIT;
	PB_SET(&d, reason, reason);
	PB_SET(&d, prompt_tokens, (uint32_t)j->prompt_tokens);
	PB_SET(&d, generated_tokens, (uint32_t)j->generated);
	PB_SET(&d, prefill_ms, ((j->t_first > 0 ? j->t_first : t) - j->t0) * 1e3);
	PB_SET(&d, generate_ms, j->t_first > 0 ? (t - j->t_first) * 1e3 : 0);
	PB_SET(&d, session_tokens, (uint32_t)j->s->n_tokens);
	if (reason == LLAMAD__STOP_REASON__STOP_STRING && j->stop.hit >= 0)
		d.stop = j->stop.stops[j->stop.hit];
	Llamad__Response r = LLAMAD__RESPONSE__INIT;
	PB_SET(&r, id, j->req_id);
	r.body_case = LLAMAD__RESPONSE__BODY_DONE;
	r.done = &d;
	if (j->cancelled != 2)
		send_response(e, j->conn, &r);
	log_msg(LL_DEBUG, "session %s: generated %d tokens (%s)", j->s->id, j->generated,
		reason == LLAMAD__STOP_REASON__STOP_EOS ? "eos" : "stopped");
	job_remove(e, j);
}

static void fail_job(struct engine *e, struct job *j, int code, const char *msg)
{
	if (j->cancelled != 2)
		send_error(e, j->conn, j->req_id, code, "%s", msg);
	job_remove(e, j);
}

/* ---- templates and context ------------------------------------------- */

static int last_user_turn(const struct session *s)
{
	for (int i = s->n_turns - 1; i >= 0; i--)
		if (s->turns[i].role == SESS_USER)
			return i;
	return -1;
}

static int has_user_turn(const struct session *s)
{
	return last_user_turn(s) >= 0;
}

/*
 * Make room for `need` more tokens under the session's policy. For shift:
 * drop whole exchanges from the front (never turn keep_from or later), then
 * re-encode the first user turn with the system prompt (llama2) or restore
 * BOS (raw). Returns 0, or -ENOSPC if it cannot fit.
 */
static int make_room(struct engine *e, struct session *s, int need, int keep_from)
{
	int limit = session_limit(e);
	if (s->n_tokens + need <= limit)
		return 0;
	if (s->policy != SESS_CTX_SHIFT)
		return -ENOSPC;
	int removed = 0;
	for (int guard = 0; guard < 4; guard++) {
		while (s->n_tokens + need > limit) {
			/* the first exchange: turn 0 up to the next user turn
			 * (raw sessions: any turn boundary) */
			int k = 1;
			while (s->tmpl == SESS_TMPL_LLAMA2 && k < s->n_turns &&
			       s->turns[k].role != SESS_USER)
				k++;
			if (k > keep_from || k >= s->n_turns)
				return -ENOSPC;
			if (sess_remove_turns(&e->st, s, 0, k) != 0)
				return -ENOSPC;
			keep_from -= k;
			removed = 1;
		}
		if (!removed || s->n_turns == 0)
			return 0;
		/* give the new first turn what a first turn has */
		int32_t *ids = NULL;
		int n;
		struct sess_turn *t0 = &s->turns[0];
		if (s->tmpl == SESS_TMPL_LLAMA2 && t0->role == SESS_USER && t0->text) {
			n = chat_encode_user_turn(e->m->tok, s->system, t0->text, &ids);
		} else {
			int a = t0->start, b = s->n_turns > 1 ? s->turns[1].start : s->n_tokens;
			if (b > a && s->tokens[a] == e->m->cfg.bos)
				return 0;
			n = b - a + 1;
			ids = malloc((size_t)n * sizeof(int32_t));
			if (ids) {
				ids[0] = e->m->cfg.bos;
				memcpy(ids + 1, s->tokens + a, (size_t)(b - a) * sizeof(int32_t));
			}
		}
		if (n < 0 || !ids) {
			free(ids);
			return -ENOSPC;
		}
		int rc = sess_replace_turn(&e->st, s, 0, ids, n);
		free(ids);
		if (rc)
			return -ENOSPC;
		if (s->n_tokens + need <= limit)
			return 0;
		removed = 0;
	}
	return -ENOSPC;
}

/*
 * Encode a client turn for s. Returns the number of ids (*ids malloc'd, may
 * be 0 for a system turn, which only sets the system prompt) or a negative
 * ErrorCode.
 */
static int encode_turn(struct engine *e, struct session *s, int role, const char *text,
		       int32_t **ids)
{
	const struct tok *tk = e->m->tok;
	*ids = NULL;
	if (s->tmpl == SESS_TMPL_RAW || role == SESS_RAW) {
		/* SentencePiece puts a space before every text it encodes; a
		 * continuation that starts with its own space gives that one */
		int first = s->n_tokens == 0;
		if (!first && text[0] == ' ')
			text++;
		int n = tok_encode(tk, text, strlen(text), first, ids);
		return n < 0 ? -LLAMAD__ERROR_CODE__INTERNAL : n;
	}
	if ((role == SESS_USER || role == SESS_SYSTEM) && chat_has_tags(text, strlen(text)))
		return -LLAMAD__ERROR_CODE__REFUSED_TEXT;
	if (role == SESS_SYSTEM)
		return 0;
	if (role == SESS_USER) {
		const char *sys = s->next_system ? s->next_system : (has_user_turn(s) ? NULL : s->system);
		int32_t *u = NULL;
		int n = chat_encode_user_turn(tk, sys, text, &u);
		if (n < 0)
			return n == -EPERM ? -LLAMAD__ERROR_CODE__REFUSED_TEXT
					   : -LLAMAD__ERROR_CODE__INTERNAL;
		/* close an answer that ended without EOS */
		int close = s->n_turns > 0 && s->turns[s->n_turns - 1].role == SESS_ASSISTANT &&
			    s->tokens[s->n_tokens - 1] != e->m->cfg.eos;
		if (close) {
			int32_t *v = realloc(u, (size_t)(n + 1) * sizeof(int32_t));
			if (!v) {
				free(u);
				return -LLAMAD__ERROR_CODE__INTERNAL;
			}
			memmove(v + 1, v, (size_t)n * sizeof(int32_t));
			v[0] = e->m->cfg.eos;
			u = v;
			n++;
		}
		*ids = u;
		return n;
	}
	/* an answer written by the client: " {a} </s>" as in Meta's format */
	size_t tl = strlen(text);
	char *t = malloc(tl + 2);
	if (!t)
		return -LLAMAD__ERROR_CODE__INTERNAL;
	size_t a = 0, b = tl;
	while (a < b && (text[a] == ' ' || text[a] == '\n' || text[a] == '\t' || text[a] == '\r'))
		a++;
	while (b > a && (text[b - 1] == ' ' || text[b - 1] == '\n' || text[b - 1] == '\t' ||
			 text[b - 1] == '\r'))
		b--;
	memcpy(t, text + a, b - a);
	t[b - a] = ' ';
	t[b - a + 1] = 0;
	int32_t *v = NULL;
	int n = tok_encode(tk, t, b - a + 1, 0, &v);
	free(t);
	if (n < 0)
		return -LLAMAD__ERROR_CODE__INTERNAL;
	int32_t *w = realloc(v, (size_t)(n + 1) * sizeof(int32_t));
	if (!w) {
		free(v);
		return -LLAMAD__ERROR_CODE__INTERNAL;
	}
	w[n++] = e->m->cfg.eos;
	*ids = w;
	return n;
}

/*
 * Append a client turn to s. Returns the number of tokens added (>= 0) or a
 * negative ErrorCode with msg filled in.
 */
static int append_turn(struct engine *e, struct session *s, int role, const char *text,
		       char *msg, size_t cap)
{
	int32_t *ids = NULL;
	int n = encode_turn(e, s, role, text, &ids);
	if (n < 0) {
		snprintf(msg, cap, "%s", n == -LLAMAD__ERROR_CODE__REFUSED_TEXT
				 ? "text contains a chat control tag ([INST], [/INST], <<SYS>>, <</SYS>>)"
				 : "cannot tokenize the text");
		return n;
	}
	if (n == 0 && role == SESS_SYSTEM && s->tmpl == SESS_TMPL_LLAMA2) {
		char **slot = has_user_turn(s) ? &s->next_system : &s->system;
		char *d = strdup(text);
		if (!d) {
			snprintf(msg, cap, "out of memory");
			return -LLAMAD__ERROR_CODE__RESOURCE_EXHAUSTED;
		}
		free(*slot);
		*slot = d;
		return 0;
	}
	int limit = session_limit(e);
	if (make_room(e, s, n, s->n_turns) != 0) {
		snprintf(msg, cap, "the turn needs %d tokens; the session holds %d of its %d-token "
			 "context", n, s->n_tokens, limit);
		free(ids);
		return -LLAMAD__ERROR_CODE__CONTEXT_FULL;
	}
	if (sess_append(s, ids, n, role == SESS_RAW || s->tmpl == SESS_TMPL_RAW ? SESS_RAW : role,
			text, 1) != 0) {
		free(ids);
		snprintf(msg, cap, "out of memory");
		return -LLAMAD__ERROR_CODE__RESOURCE_EXHAUSTED;
	}
	if (role == SESS_USER && s->next_system) {
		free(s->next_system);
		s->next_system = NULL;
	}
	free(ids);
	s->last_use_ms = unix_ms();
	return n;
}

/* ---- persistence and eviction ----------------------------------------------
 *
 * A session's K/V lives in the pool (SESS_POOL), in host memory after an
 * eviction (SESS_RAM, bounded by ram_cache), or only in its state file
 * (SESS_DISK: the table keeps a stub with the header's counts). Eviction
 * takes the least recently used idle session; a session comes back on its
 * next use. Changed sessions are saved after save_delay idle seconds, before
 * they leave memory, on Save requests and at shutdown. All of it runs on
 * the engine thread, between steps.
 */

static size_t block_bytes(const struct engine *e)
{
	return kt_kv_block_bytes(&e->pool->kv);
}

/* The reason in a session/store.c cause ("state file PATH: reason") of
 * session s, for the wire, which never carries a path; strerror(-rc) if the
 * cause is not of that form. */
static const char *store_reason(const struct engine *e, const struct session *s,
				const char *cause, int rc)
{
	char *path = store_path(e->state_dir, s->uid, s->id);
	const char *r = NULL;
	size_t n = path ? strlen(path) : 0;
	if (path && cause && !strncmp(cause, "state file ", 11) && !strncmp(cause + 11, path, n) &&
	    !strncmp(cause + 11 + n, ": ", 2))
		r = cause + 13 + n;
	free(path);
	return r ? r : strerror(-rc);
}

/* Save a pool session's history and settings without its K/V (which a
 * failed device cannot give back): restored, it is recomputed from the
 * tokens on its next turn. */
static void save_history(struct session *s, void *ctx)
{
	struct engine *e = ctx;
	/* changed since saved: dirty, or in the middle of a turn */
	if (s->ephemeral || s->loc != SESS_POOL || !(s->dirty || s->busy) || !e->state_dir)
		return;
	char *cause = NULL;
	int rc = store_save_history(e->state_dir, s, e->pool, e->m->fingerprint, &cause);
	if (rc)
		log_msg(LL_ERROR, "cannot save session %s: %s", s->id, cause ? cause : strerror(-rc));
	free(cause);
}

/*
 * A sticky device error: nothing more can run on this GPU. Save what can be
 * saved (histories; their K/V is recomputed later), tell systemd and exit
 * non-zero; Restart=on-failure brings llamad back with the sessions.
 */
static void backend_died(struct engine *e)
{
	log_msg(LL_ERROR, "the %s backend failed (%s); saving session histories and exiting "
		"so that the service restarts", e->be->ops->name, e->be->desc);
	sd_notify(0, "STATUS=backend failed: saving sessions and restarting\nSTOPPING=1");
	sess_foreach(&e->st, 0, save_history, e);
	_exit(EXIT_FAILURE);
}

/* Write s's state file. 0, 1 if there is nothing to write (persistence off,
 * ephemeral, not in the pool), or -errno with *cause. */
static int save_session(struct engine *e, struct session *s, char **cause)
{
	if (!e->state_dir || s->ephemeral || s->loc != SESS_POOL)
		return 1;
	int rc = store_save(e->state_dir, s, e->pool, e->m->fingerprint, cause);
	if (rc) {
		e->n_save_errors++;
		return rc;
	}
	char *p = store_path(e->state_dir, s->uid, s->id);
	struct stat st;
	s->file_bytes = p && stat(p, &st) == 0 ? (uint64_t)st.st_size : 0;
	free(p);
	s->dirty = 0;
	s->foreign = 0;
	s->save_failed = 0;
	e->n_saves++;
	return 0;
}

/* Turn a session into a disk stub: free its history and blocks. */
static void to_stub(struct engine *e, struct session *s)
{
	s->disk_tokens = (uint32_t)s->n_tokens;
	sess_clear_history(&e->st, s);
	if (s->ram_kv) {
		e->ram_used -= s->ram_bytes;
		free(s->ram_kv);
		s->ram_kv = NULL;
		s->ram_bytes = 0;
		s->ram_blocks = 0;
	}
	s->loc = SESS_DISK;
}

struct lru_ctx {
	const struct session *keep;
	int loc;
	unsigned scan;
	struct session *best;
};

static void lru_pick(struct session *s, void *ctx)
{
	struct lru_ctx *l = ctx;
	if (s == l->keep || s->busy || s->loc != l->loc || s->ephemeral ||
	    s->evict_scan == l->scan)
		return;
	if (l->loc == SESS_POOL && s->kv.n_blocks == 0)
		return;
	if (l->loc == SESS_RAM && s->dirty)
		return;  /* only saved sessions may leave host memory for disk */
	if (!l->best || s->last_use_ms < l->best->last_use_ms)
		l->best = s;
}

/* Least recently used idle session in loc not yet tried in this scan. */
static struct session *lru(struct engine *e, const struct session *keep, int loc)
{
	struct lru_ctx l = { keep, loc, e->evict_scan, NULL };
	sess_foreach(&e->st, 0, lru_pick, &l);
	return l.best;
}

/* Move v's blocks to host memory. 1 on success. */
static int to_ram(struct engine *e, struct session *v)
{
	size_t bytes = (size_t)v->kv.n_blocks * block_bytes(e);
	if (e->ram_used + bytes > e->cfg.ram_cache || !(v->ram_kv = malloc(bytes ? bytes : 1)))
		return 0;
	for (int i = 0; i < v->kv.n_blocks; i++)
		if (kvpool_get_block(e->pool, v->kv.blocks[i],
				     (char *)v->ram_kv + (size_t)i * block_bytes(e)) != 0) {
			free(v->ram_kv);
			v->ram_kv = NULL;
			return 0;
		}
	v->ram_bytes = bytes;
	v->ram_blocks = v->kv.n_blocks;
	e->ram_used += bytes;
	kvseq_release(e->pool, &v->kv);
	v->loc = SESS_RAM;
	e->n_evict_ram++;
	log_msg(LL_DEBUG, "session %s moved to host memory (%zu bytes)", v->id, bytes);
	return 1;
}

/*
 * Move the least recently used idle pool session that can move out: to host
 * memory if it fits in ram_cache (making room there by sending saved RAM
 * sessions to disk), else to disk. With a state directory a session leaves
 * the pool only once its state file is current, so nothing unsaved ever
 * sits outside the pool. Returns 1 if a session moved, 0 if none could.
 */
static int evict_one(struct engine *e, const struct session *keep)
{
	e->evict_scan++;
	struct session *v;
	while ((v = lru(e, keep, SESS_POOL))) {
		v->evict_scan = e->evict_scan;  /* try each candidate once */
		if (e->state_dir && (v->dirty || !v->file_bytes)) {
			char *cause = NULL;
			if (save_session(e, v, &cause) < 0) {
				if (!v->save_failed)
					log_msg(LL_ERROR, "cannot save session %s to evict it: %s",
						v->id, cause);
				v->save_failed = 1;
				free(cause);
				continue;  /* keep it in the pool; try another */
			}
		}
		size_t bytes = (size_t)v->kv.n_blocks * block_bytes(e);
		if (bytes <= e->cfg.ram_cache) {
			while (e->ram_used + bytes > e->cfg.ram_cache && e->state_dir) {
				struct session *r = lru(e, keep, SESS_RAM);
				if (!r)
					break;
				to_stub(e, r);
				e->n_evict_disk++;
			}
			if (to_ram(e, v))
				return 1;
		}
		if (e->state_dir) {
			to_stub(e, v);
			e->n_evict_disk++;
			log_msg(LL_DEBUG, "session %s moved to the state directory", v->id);
			return 1;
		}
	}
	return 0;
}

/* Evict until n blocks are free. 0 or -ENOSPC. */
static int free_blocks(struct engine *e, int n, const struct session *keep)
{
	while (kvpool_n_free(e->pool) < n)
		if (!evict_one(e, keep))
			return -ENOSPC;
	return 0;
}

/* Bring s back into the pool. 0, or -1 after sending the error. */
static int ensure_resident(struct engine *e, struct session *s, uint64_t conn, uint64_t id)
{
	if (s->loc == SESS_POOL)
		return 0;
	if (s->loc == SESS_RAM) {
		if (free_blocks(e, s->ram_blocks, s) != 0) {
			send_error(e, conn, id, LLAMAD__ERROR_CODE__RESOURCE_EXHAUSTED,
				   "the KV cache is full and nothing can be evicted");
			return -1;
		}
		struct kvseq kv = { 0 };
		int nb = s->ram_blocks;
		kv.blocks = malloc((size_t)(nb ? nb : 1) * sizeof(int32_t));
		if (!kv.blocks) {
			send_error(e, conn, id, LLAMAD__ERROR_CODE__RESOURCE_EXHAUSTED, "out of memory");
			return -1;
		}
		kv.cap = nb ? nb : 1;
		int rc = 0;
		for (int i = 0; i < nb; i++) {
			kv.blocks[i] = kvpool_alloc(e->pool);
			if (!rc)
				rc = kvpool_put_block(e->pool, kv.blocks[i],
						      (char *)s->ram_kv + (size_t)i * block_bytes(e));
		}
		if (rc) {
			kv.n_blocks = nb;
			kvseq_release(e->pool, &kv);
			send_error(e, conn, id, LLAMAD__ERROR_CODE__INTERNAL,
				   "the device failed while restoring the session");
			return -1;
		}
		kv.n_blocks = nb;
		free(s->kv.blocks);
		s->kv = kv;
		e->ram_used -= s->ram_bytes;
		free(s->ram_kv);
		s->ram_kv = NULL;
		s->ram_bytes = 0;
		s->ram_blocks = 0;
		s->loc = SESS_POOL;
		e->n_restores++;
		return 0;
	}
	/* SESS_DISK */
	char *path = store_path(e->state_dir, s->uid, s->id);
	char *cause = NULL;
	int allow_foreign = e->cfg.foreign_cache == 0;
	int rc = path ? store_load(path, s, e->pool, e->m->fingerprint, allow_foreign, &cause)
		      : -ENOMEM;
	if (rc == -ENOSPC) {
		free(cause);
		cause = NULL;
		int need = (int)((s->disk_tokens + e->pool->kv.block_size - 1) / e->pool->kv.block_size);
		if (free_blocks(e, need, s) == 0)
			rc = store_load(path, s, e->pool, e->m->fingerprint, allow_foreign, &cause);
	}
	free(path);
	if (rc) {
		int code = rc == -ENOSPC ? LLAMAD__ERROR_CODE__RESOURCE_EXHAUSTED
					 : LLAMAD__ERROR_CODE__STORAGE;
		log_msg(LL_WARN, "cannot restore session %s: %s", s->id, cause ? cause : strerror(-rc));
		if (rc == -ESTALE)
			send_error(e, conn, id, code, "session '%s' was saved under a different model "
				   "(foreign_cache = refuse)", s->id);
		else if (rc == -ENOSPC)
			send_error(e, conn, id, code, "cannot restore session '%s': the KV cache is "
				   "full", s->id);
		else
			send_error(e, conn, id, code, "cannot restore session '%s': %s", s->id,
				   store_reason(e, s, cause, rc));
		free(cause);
		return -1;
	}
	/* checksums prove the file intact, not that this model can run it (a
	 * foreign file may come from a bigger vocabulary or context): a token
	 * fwd_run refuses would fail every job batched with this session */
	const char *unfit = NULL;
	if (s->n_tokens > e->ctx)
		unfit = "its history is longer than this model's context";
	for (int i = 0; i < s->n_tokens && !unfit; i++)
		if (s->tokens[i] < 0 || s->tokens[i] >= e->m->cfg.vocab)
			unfit = "its history holds token ids outside this model's vocabulary";
	if (unfit) {
		log_msg(LL_WARN, "cannot restore session %s: %s", s->id, unfit);
		send_error(e, conn, id, LLAMAD__ERROR_CODE__STORAGE, "cannot restore session '%s': %s",
			   s->id, unfit);
		to_stub(e, s);
		return -1;
	}
	s->loc = SESS_POOL;
	/* a cache rebuilt from the tokens (another model or KV shape) is worth
	 * saving again once it exists */
	s->dirty = s->foreign || (s->n_cached == 0 && s->n_tokens > 0);
	if (s->foreign)
		log_msg(LL_INFO, "session %s was saved under another model: its cache is rebuilt "
			"from its %d tokens", s->id, s->n_tokens);
	e->n_restores++;
	return 0;
}

struct idle_ctx {
	struct engine *e;
	int64_t before;
};

static void save_if_idle(struct session *s, void *ctx)
{
	struct idle_ctx *c = ctx;
	if (!s->dirty || s->busy || s->ephemeral || s->loc != SESS_POOL ||
	    s->last_use_ms > c->before)
		return;
	char *cause = NULL;
	if (save_session(c->e, s, &cause) < 0) {
		if (!s->save_failed)  /* once until it works again */
			log_msg(LL_ERROR, "cannot save session %s: %s", s->id, cause);
		s->save_failed = 1;
		s->last_use_ms = unix_ms();  /* retry after another delay */
	}
	free(cause);
}

/* At most once a second: save sessions idle for save_delay seconds. */
static void save_idle(struct engine *e)
{
	if (!e->state_dir)
		return;
	double t = now_s();
	if (t - e->last_idle_scan < 1.0)
		return;
	e->last_idle_scan = t;
	struct idle_ctx c = { e, unix_ms() - (int64_t)e->cfg.save_delay * 1000 };
	sess_foreach(&e->st, 0, save_if_idle, &c);
}

struct save_all_ctx {
	struct engine *e;
	uid_t uid;
	int only_dirty;
	int n, errors;
	uint64_t bytes;
	char *first_error;
};

static void save_one_of_all(struct session *s, void *ctx)
{
	struct save_all_ctx *c = ctx;
	if ((c->uid != 0 && s->uid != c->uid) || (c->only_dirty && !s->dirty))
		return;
	char *cause = NULL;
	int rc = save_session(c->e, s, &cause);
	if (rc == 0) {
		c->n++;
		c->bytes += s->file_bytes;
	} else if (rc < 0) {
		c->errors++;
		log_msg(LL_ERROR, "cannot save session %s: %s", s->id, cause ? cause : strerror(-rc));
		/* for the wire: the reason without the file's path */
		if (!c->first_error && asprintf(&c->first_error, "session '%s': %s", s->id,
						store_reason(c->e, s, cause, rc)) < 0)
			c->first_error = NULL;
		free(cause);
	}
}

static void report_bad_file(void *ctx, const char *path, const char *reason)
{
	(void)ctx;
	log_msg(LL_WARN, "state file %s: %s", path, reason);
}

/* Table stubs for the sessions in the state directory. */
static void list_saved(struct engine *e)
{
	struct store_entry *ents = NULL;
	int n = store_list(e->state_dir, &ents, report_bad_file, NULL);
	if (n < 0) {
		log_msg(LL_ERROR, "cannot read the state directory %s: %s", e->state_dir,
			strerror(-n));
		return;
	}
	int foreign = 0, listed = 0;
	for (int i = 0; i < n; i++) {
		if (sess_get(&e->st, ents[i].uid, ents[i].id))
			continue;
		if (e->st.count >= e->cfg.max_sessions) {
			log_msg(LL_WARN, "state file %s: not listed: max_sessions (%d) reached",
				ents[i].path, e->cfg.max_sessions);
			continue;
		}
		struct session *s = sess_create(&e->st, ents[i].uid, ents[i].id);
		if (!s)
			break;
		s->loc = SESS_DISK;
		s->disk_tokens = ents[i].n_tokens;
		s->tmpl = (int)ents[i].tmpl;
		s->policy = (int)ents[i].policy;
		s->prefilled = ents[i].prefilled;
		s->generated = ents[i].generated;
		s->last_use_ms = ents[i].last_use_ms;
		s->file_bytes = ents[i].file_bytes;
		s->foreign = ents[i].fingerprint != e->m->fingerprint;
		foreign += s->foreign;
		listed++;
	}
	if (listed > 0)
		log_msg(LL_INFO, "%d saved session%s in %s%s", listed, listed == 1 ? "" : "s",
			e->state_dir, foreign ? " (some saved under another model)" : "");
	store_entries_free(ents, n);
}

/* ---- request handlers ------------------------------------------------ */

static struct session *find_session(struct engine *e, uint64_t conn, uid_t uid, uint64_t id,
				    const char *name)
{
	struct session *s = name ? sess_find(&e->st, uid, name) : NULL;
	if (!s)
		send_error(e, conn, id, LLAMAD__ERROR_CODE__UNKNOWN_SESSION,
			   "no session named '%s'", name ? name : "");
	return s;
}

static int refuse_busy(struct engine *e, uint64_t conn, uint64_t id, struct session *s)
{
	if (!s->busy)
		return 0;
	send_error(e, conn, id, LLAMAD__ERROR_CODE__BUSY,
		   "session '%s' is running another request", s->id);
	return 1;
}

static void on_hello(struct engine *e, uint64_t conn, uint64_t id, const Llamad__Hello *h)
{
	if (h->has_protocol_version && h->protocol_version != LLAMAD_PROTOCOL_VERSION) {
		send_error(e, conn, id, LLAMAD__ERROR_CODE__BAD_VERSION,
			   "protocol version %u is not supported (this daemon speaks %d)",
			   h->protocol_version, LLAMAD_PROTOCOL_VERSION);
		return;
	}
	Llamad__HelloReply hr = LLAMAD__HELLO_REPLY__INIT;
	PB_SET(&hr, protocol_version, LLAMAD_PROTOCOL_VERSION);
	hr.server = (char *)"llamad " LLAMAD_VERSION;
	hr.model = e->model_desc;
	PB_SET(&hr, max_frame, e->cfg.max_frame);
	PB_SET(&hr, context_length, (uint32_t)session_limit(e));
	Llamad__Response r = LLAMAD__RESPONSE__INIT;
	PB_SET(&r, id, id);
	r.body_case = LLAMAD__RESPONSE__BODY_HELLO;
	r.hello = &hr;
	send_response(e, conn, &r);
}

struct count_ctx {
	uid_t uid;
	int n;
};

static void count_uid(struct session *s, void *ctx)
{
	struct count_ctx *c = ctx;
	c->n += s->uid == c->uid;
}

/* 1 (after sending the error) if uid holds its quota of sessions. */
static int quota_full(struct engine *e, uint64_t conn, uint64_t id, uid_t uid)
{
	if (e->cfg.max_sessions_per_uid <= 0)
		return 0;
	struct count_ctx c = { uid, 0 };
	sess_foreach(&e->st, uid, count_uid, &c);
	if (c.n < e->cfg.max_sessions_per_uid)
		return 0;
	send_error(e, conn, id, LLAMAD__ERROR_CODE__RESOURCE_EXHAUSTED,
		   "uid %u holds its quota of %d sessions", (unsigned)uid, e->cfg.max_sessions_per_uid);
	return 1;
}

static void on_save(struct engine *e, uint64_t conn, uid_t uid, uint64_t id, const Llamad__Save *sv)
{
	if (!e->state_dir) {
		send_error(e, conn, id, LLAMAD__ERROR_CODE__STORAGE,
			   "persistence is off (state_dir = none)");
		return;
	}
	struct save_all_ctx c = { e, uid, 0, 0, 0, 0, NULL };
	if (sv->all) {
		sess_foreach(&e->st, uid, save_one_of_all, &c);
	} else {
		struct session *s = find_session(e, conn, uid, id, sv->session);
		if (!s)
			return;
		if (s->ephemeral) {
			send_error(e, conn, id, LLAMAD__ERROR_CODE__BAD_REQUEST,
				   "session '%s' is ephemeral: it is never saved", s->id);
			return;
		}
		save_one_of_all(s, &c);
		if (c.n == 0 && c.errors == 0) {  /* in RAM or on disk: already saved */
			c.n = 1;
			c.bytes = s->file_bytes;
		}
	}
	if (c.errors) {
		send_error(e, conn, id, LLAMAD__ERROR_CODE__STORAGE, "%d session%s not saved: %s",
			   c.errors, c.errors == 1 ? "" : "s", c.first_error ? c.first_error : "");
		free(c.first_error);
		return;
	}
	Llamad__Saved sd = LLAMAD__SAVED__INIT;
	PB_SET(&sd, sessions, (uint32_t)c.n);
	PB_SET(&sd, bytes, c.bytes);
	Llamad__Response r = LLAMAD__RESPONSE__INIT;
	PB_SET(&r, id, id);
	r.body_case = LLAMAD__RESPONSE__BODY_SAVED;
	r.saved = &sd;
	send_response(e, conn, &r);
}

/* Template of new sessions that do not choose: the model file's when it
 * names the Llama 2 format, else the configured one. */
static int default_template(const struct engine *e)
{
	if (e->m->chat_template && !strcmp(e->m->chat_template, "llama2"))
		return SESS_TMPL_LLAMA2;
	return e->cfg.tmpl;
}

static void on_open(struct engine *e, uint64_t conn, uid_t uid, uint64_t id,
		    const Llamad__OpenSession *o)
{
	struct session *s = sess_find(&e->st, uid, o->session);
	if (s && s->uid != uid)
		s = NULL;  /* root opening its own session of a name another uid has */
	if (s) {
		if (o->create_only) {
			send_error(e, conn, id, LLAMAD__ERROR_CODE__SESSION_EXISTS,
				   "session '%s' exists", o->session);
			return;
		}
		s->last_use_ms = unix_ms();
		send_info(e, conn, id, s, 0, -1);
		return;
	}
	if (o->system && chat_has_tags(o->system, strlen(o->system))) {
		send_error(e, conn, id, LLAMAD__ERROR_CODE__REFUSED_TEXT,
			   "system prompt contains a chat control tag");
		return;
	}
	if (e->st.count >= e->cfg.max_sessions) {
		send_error(e, conn, id, LLAMAD__ERROR_CODE__RESOURCE_EXHAUSTED,
			   "the daemon holds its maximum of %d sessions", e->cfg.max_sessions);
		return;
	}
	if (quota_full(e, conn, id, uid))
		return;
	s = sess_create(&e->st, uid, o->session);
	if (!s || (o->system && !(s->system = strdup(o->system)))) {
		if (s)
			sess_drop(&e->st, s);
		send_error(e, conn, id, LLAMAD__ERROR_CODE__RESOURCE_EXHAUSTED, "out of memory");
		return;
	}
	s->tmpl = o->has_template_ && o->template_ ? (int)o->template_ : default_template(e);
	s->policy = o->has_context_policy && o->context_policy ? (int)o->context_policy
								: e->cfg.context_policy;
	s->ephemeral = o->ephemeral;
	s->owner_conn = conn;
	s->dirty = 1;
	s->last_use_ms = unix_ms();
	log_msg(LL_DEBUG, "session %s created by uid %u", s->id, (unsigned)uid);
	send_info(e, conn, id, s, 1, -1);
}

static void start_append_job(struct engine *e, uint64_t conn, uint64_t id, struct session *s,
			     int added)
{
	struct job *j = calloc(1, sizeof(*j));
	if (!j) {
		send_error(e, conn, id, LLAMAD__ERROR_CODE__RESOURCE_EXHAUSTED, "out of memory");
		return;
	}
	j->kind = JOB_APPEND;
	j->conn = conn;
	j->req_id = id;
	j->s = s;
	j->tokens_added = added;
	j->t0 = now_s();
	job_add(e, j);
}

static void on_append(struct engine *e, uint64_t conn, uid_t uid, uint64_t id,
		      const Llamad__Append *a)
{
	struct session *s = find_session(e, conn, uid, id, a->session);
	if (!s || refuse_busy(e, conn, id, s) || ensure_resident(e, s, conn, id))
		return;
	char msg[200];
	int n = append_turn(e, s, a->has_role ? (int)a->role : SESS_USER, a->text ? a->text : "",
			    msg, sizeof(msg));
	if (n < 0) {
		send_error(e, conn, id, -n, "%s", msg);
		return;
	}
	start_append_job(e, conn, id, s, n);
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
		p->seed = (uint64_t)unix_ms();
}

static void on_generate(struct engine *e, uint64_t conn, uid_t uid, uint64_t id,
			const Llamad__Generate *g)
{
	struct session *s = find_session(e, conn, uid, id, g->session);
	if (!s || refuse_busy(e, conn, id, s) || ensure_resident(e, s, conn, id))
		return;
	struct sampler_params sp;
	fill_sampler(e, g->sampler, &sp);
	const char *why = sampler_params_check(&sp);
	if (why) {
		send_error(e, conn, id, LLAMAD__ERROR_CODE__BAD_REQUEST, "%s", why);
		return;
	}
	struct job *j = calloc(1, sizeof(*j));
	int vocab = e->m->cfg.vocab;
	if (!j || !(j->logits = malloc((size_t)vocab * sizeof(float))) ||
	    sampler_init(&j->smp, &sp, vocab) != 0) {
		if (j)
			free(j->logits);
		free(j);
		send_error(e, conn, id, LLAMAD__ERROR_CODE__RESOURCE_EXHAUSTED, "out of memory");
		return;
	}
	j->kind = JOB_GENERATE;
	if (stopper_init(&j->stop, (const char *const *)g->stop, (int)g->n_stop) != 0) {
		sampler_done(&j->smp);
		free(j->logits);
		free(j);
		send_error(e, conn, id, LLAMAD__ERROR_CODE__RESOURCE_EXHAUSTED, "out of memory");
		return;
	}
	j->conn = conn;
	j->req_id = id;
	j->s = s;
	j->t0 = now_s();
	j->max_tokens = g->has_max_tokens && g->max_tokens ? (int)g->max_tokens : e->cfg.max_tokens;
	if (g->prompt) {
		char msg[200];
		int n = append_turn(e, s, g->has_role ? (int)g->role : SESS_USER, g->prompt, msg,
				    sizeof(msg));
		if (n < 0) {
			send_error(e, conn, id, -n, "%s", msg);
			job_free(j);
			return;
		}
	}
	if (s->n_tokens == 0) {
		int32_t bos = e->m->cfg.bos;
		if (sess_append(s, &bos, 1, SESS_RAW, NULL, 1) != 0) {
			send_error(e, conn, id, LLAMAD__ERROR_CODE__RESOURCE_EXHAUSTED, "out of memory");
			job_free(j);
			return;
		}
	}
	if (s->n_cached >= s->n_tokens)
		sess_uncache(&e->st, s, s->n_tokens - 1);  /* we need the last token's logits */
	/* a reply starts a new text: llama2 answers begin after [/INST] */
	detok_init(&j->dt, e->m->tok, s->tmpl == SESS_TMPL_LLAMA2);
	job_add(e, j);
}

static void on_fork(struct engine *e, uint64_t conn, uid_t uid, uint64_t id,
		    const Llamad__Fork *f)
{
	struct session *src = find_session(e, conn, uid, id, f->session);
	if (!src || quota_full(e, conn, id, uid) || ensure_resident(e, src, conn, id))
		return;
	struct session *dst = sess_find(&e->st, uid, f->target);
	if (dst && dst->uid == uid) {
		send_error(e, conn, id, LLAMAD__ERROR_CODE__SESSION_EXISTS,
			   "session '%s' exists", f->target);
		return;
	}
	if (e->st.count >= e->cfg.max_sessions) {
		send_error(e, conn, id, LLAMAD__ERROR_CODE__RESOURCE_EXHAUSTED,
			   "the daemon holds its maximum of %d sessions", e->cfg.max_sessions);
		return;
	}
	dst = sess_fork(&e->st, src, uid, f->target);
	if (!dst) {
		send_error(e, conn, id, LLAMAD__ERROR_CODE__RESOURCE_EXHAUSTED, "out of memory");
		return;
	}
	dst->ephemeral = 0;
	dst->dirty = 1;
	dst->last_use_ms = unix_ms();
	send_info(e, conn, id, dst, 1, -1);
}

static void on_drop(struct engine *e, uint64_t conn, uid_t uid, uint64_t id, const Llamad__Drop *d)
{
	struct session *s = find_session(e, conn, uid, id, d->session);
	if (!s || refuse_busy(e, conn, id, s))
		return;
	log_msg(LL_DEBUG, "session %s dropped", s->id);
	if (e->state_dir && store_remove(e->state_dir, s->uid, s->id) != 0)
		log_msg(LL_WARN, "session %s: cannot remove its state file", s->id);
	if (s->ram_kv)
		e->ram_used -= s->ram_bytes;
	sess_drop(&e->st, s);
	send_ok(e, conn, id);
}

struct list_ctx {
	struct engine *e;
	Llamad__SessionInfo *infos;
	Llamad__SessionInfo **ptrs;
	size_t n;
};

static void list_one(struct session *s, void *ctx)
{
	struct list_ctx *l = ctx;
	fill_info(l->e, s, &l->infos[l->n]);
	l->ptrs[l->n] = &l->infos[l->n];
	l->n++;
}

static void on_list(struct engine *e, uint64_t conn, uid_t uid, uint64_t id)
{
	size_t cap = (size_t)e->st.count + 1;
	struct list_ctx l = { e, calloc(cap, sizeof(Llamad__SessionInfo)),
			      calloc(cap, sizeof(Llamad__SessionInfo *)), 0 };
	if (!l.infos || !l.ptrs) {
		free(l.infos);
		free(l.ptrs);
		send_error(e, conn, id, LLAMAD__ERROR_CODE__RESOURCE_EXHAUSTED, "out of memory");
		return;
	}
	sess_foreach(&e->st, uid, list_one, &l);
	Llamad__SessionList sl = LLAMAD__SESSION_LIST__INIT;
	sl.n_sessions = l.n;
	sl.sessions = l.ptrs;
	Llamad__Response r = LLAMAD__RESPONSE__INIT;
	PB_SET(&r, id, id);
	r.body_case = LLAMAD__RESPONSE__BODY_SESSIONS;
	r.sessions = &sl;
	send_response(e, conn, &r);
	free(l.infos);
	free(l.ptrs);
}

static void on_rewind(struct engine *e, uint64_t conn, uid_t uid, uint64_t id,
		      const Llamad__Rewind *rw)
{
	struct session *s = find_session(e, conn, uid, id, rw->session);
	if (!s || refuse_busy(e, conn, id, s) || ensure_resident(e, s, conn, id))
		return;
	if (sess_rewind(&e->st, s) < 0) {
		send_error(e, conn, id, LLAMAD__ERROR_CODE__BAD_REQUEST,
			   "session '%s' has no turn to remove", s->id);
		return;
	}
	s->last_use_ms = unix_ms();
	s->dirty = 1;
	send_info(e, conn, id, s, -1, -1);
}

static void on_tokenize(struct engine *e, uint64_t conn, uint64_t id, const Llamad__Tokenize *t)
{
	int32_t *ids = NULL;
	const char *text = t->text ? t->text : "";
	int n = tok_encode(e->m->tok, text, strlen(text), t->add_bos, &ids);
	uint32_t *u = n > 0 ? malloc((size_t)n * sizeof(uint32_t)) : NULL;
	char **pieces = n > 0 ? malloc((size_t)n * sizeof(char *)) : NULL;
	if (n < 0 || (n > 0 && (!u || !pieces))) {
		free(ids);
		free(u);
		free(pieces);
		send_error(e, conn, id, LLAMAD__ERROR_CODE__INTERNAL, "cannot tokenize the text");
		return;
	}
	for (int i = 0; i < n; i++) {
		u[i] = (uint32_t)ids[i];
		pieces[i] = (char *)tok_piece(e->m->tok, ids[i]);
	}
	Llamad__Tokens tk = LLAMAD__TOKENS__INIT;
	tk.n_tokens = (size_t)n;
	tk.tokens = u;
	tk.n_pieces = (size_t)n;
	tk.pieces = pieces;
	Llamad__Response r = LLAMAD__RESPONSE__INIT;
	PB_SET(&r, id, id);
	r.body_case = LLAMAD__RESPONSE__BODY_TOKENS;
	r.tokens = &tk;
	send_response(e, conn, &r);
	free(ids);
	free(u);
	free(pieces);
}

static void on_detokenize(struct engine *e, uint64_t conn, uint64_t id,
			  const Llamad__Detokenize *d)
{
	int32_t *ids = malloc((d->n_tokens + 1) * sizeof(int32_t));
	if (!ids) {
		send_error(e, conn, id, LLAMAD__ERROR_CODE__RESOURCE_EXHAUSTED, "out of memory");
		return;
	}
	for (size_t i = 0; i < d->n_tokens; i++) {
		if (d->tokens[i] >= (uint32_t)e->m->cfg.vocab) {
			send_error(e, conn, id, LLAMAD__ERROR_CODE__BAD_REQUEST,
				   "token %u is outside the vocabulary (%d)", d->tokens[i],
				   e->m->cfg.vocab);
			free(ids);
			return;
		}
		ids[i] = (int32_t)d->tokens[i];
	}
	char *text = NULL;
	int n = tok_decode(e->m->tok, ids, (int)d->n_tokens, &text);
	free(ids);
	if (n < 0) {
		send_error(e, conn, id, LLAMAD__ERROR_CODE__INTERNAL, "cannot decode");
		return;
	}
	Llamad__Text t = LLAMAD__TEXT__INIT;
	t.text = text;
	Llamad__Response r = LLAMAD__RESPONSE__INIT;
	PB_SET(&r, id, id);
	r.body_case = LLAMAD__RESPONSE__BODY_TEXT;
	r.text = &t;
	send_response(e, conn, &r);
	free(text);
}

static void on_cancel(struct engine *e, uint64_t conn, uint64_t id, const Llamad__Cancel *c)
{
	for (struct job *j = e->jobs; j; j = j->next) {
		if (j->conn == conn && j->req_id == c->request_id && !j->cancelled) {
			j->cancelled = 1;
			send_ok(e, conn, id);
			return;
		}
	}
	send_error(e, conn, id, LLAMAD__ERROR_CODE__UNKNOWN_REQUEST,
		   "no running request with id %llu on this connection",
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

static void on_status(struct engine *e, uint64_t conn, uid_t uid, uint64_t id)
{
	Llamad__Counters c = LLAMAD__COUNTERS__INIT;
	PB_SET(&c, requests, e->n_requests);
	PB_SET(&c, errors, e->n_errors);
	PB_SET(&c, prefilled_tokens, e->n_prefilled);
	PB_SET(&c, generated_tokens, e->n_generated);
	PB_SET(&c, forward_passes, e->n_forward);
	PB_SET(&c, cow_copies, e->pool->cow_copies);
	PB_SET(&c, evictions_ram, e->n_evict_ram);
	PB_SET(&c, evictions_disk, e->n_evict_disk);
	PB_SET(&c, restores, e->n_restores);
	PB_SET(&c, saves, e->n_saves);
	PB_SET(&c, save_errors, e->n_save_errors);
	pthread_mutex_lock(&e->mu);
	PB_SET(&c, connections, e->conns_accepted);
	int open = e->conns_open;
	pthread_mutex_unlock(&e->mu);
	Llamad__Status st = LLAMAD__STATUS__INIT;
	st.server = (char *)"llamad " LLAMAD_VERSION;
	st.model = e->model_desc;
	st.backend = e->backend_name;
	if (e->be->host_mem)  /* CPU worker threads; a GPU's desc says the rest */
		PB_SET(&st, threads, (uint32_t)e->be->n_threads);
	PB_SET(&st, uptime_s, now_s() - e->t_start);
	/* a non-root client sees only the count of its own sessions */
	int mine = 0, active = 0, in_ram = 0, on_disk = 0;
	for (int b = 0; b < e->st.n_buckets; b++)
		for (struct session *s = e->st.buckets[b]; s; s = s->hnext)
			if (uid == 0 || s->uid == uid) {
				mine++;
				active += s->busy;
				in_ram += s->loc == SESS_RAM;
				on_disk += s->loc == SESS_DISK;
			}
	PB_SET(&st, sessions, (uint32_t)mine);
	PB_SET(&st, sessions_in_ram, (uint32_t)in_ram);
	PB_SET(&st, sessions_on_disk, (uint32_t)on_disk);
	st.state_dir = e->state_dir ? e->state_dir : (char *)"";
	PB_SET(&st, ram_bytes_used, (uint64_t)e->ram_used);
	PB_SET(&st, ram_bytes_total, e->cfg.ram_cache);
	char tmpl[96];
	int from_model = e->m->chat_template && !strcmp(e->m->chat_template, "llama2");
	snprintf(tmpl, sizeof(tmpl), "%s (%s)",
		 default_template(e) == SESS_TMPL_LLAMA2 ? "llama2" : "raw",
		 from_model ? "from the model file" : "configured; the model file names no Llama 2 template");
	st.chat_template = tmpl;
	PB_SET(&st, active, (uint32_t)active);
	PB_SET(&st, connections, (uint32_t)open);
	PB_SET(&st, kv_blocks_total, (uint32_t)e->pool->kv.n_blocks);
	PB_SET(&st, kv_blocks_free, (uint32_t)kvpool_n_free(e->pool));
	PB_SET(&st, kv_block_tokens, KV_BLOCK_TOKENS);
	PB_SET(&st, kv_bytes_total, (uint64_t)e->pool->kv.n_blocks * kt_kv_block_bytes(&e->pool->kv));
	PB_SET(&st, weight_bytes, e->m->weight_bytes);
	PB_SET(&st, context_length, (uint32_t)session_limit(e));
	st.counters = &c;
	PB_SET(&st, rss_bytes, rss_bytes());
	Llamad__Response r = LLAMAD__RESPONSE__INIT;
	PB_SET(&r, id, id);
	r.body_case = LLAMAD__RESPONSE__BODY_STATUS;
	r.status = &st;
	send_response(e, conn, &r);
}

static void handle_request(struct engine *e, uint64_t conn, uid_t uid, Llamad__Request *q)
{
	uint64_t id = q->id;
	e->n_requests++;
	switch (q->op_case) {
	case LLAMAD__REQUEST__OP_HELLO: on_hello(e, conn, id, q->hello); break;
	case LLAMAD__REQUEST__OP_OPEN: on_open(e, conn, uid, id, q->open); break;
	case LLAMAD__REQUEST__OP_APPEND: on_append(e, conn, uid, id, q->append); break;
	case LLAMAD__REQUEST__OP_GENERATE: on_generate(e, conn, uid, id, q->generate); break;
	case LLAMAD__REQUEST__OP_FORK: on_fork(e, conn, uid, id, q->fork); break;
	case LLAMAD__REQUEST__OP_DROP: on_drop(e, conn, uid, id, q->drop); break;
	case LLAMAD__REQUEST__OP_LIST: on_list(e, conn, uid, id); break;
	case LLAMAD__REQUEST__OP_INFO: {
		struct session *s = find_session(e, conn, uid, id, q->info->session);
		if (s)
			send_info(e, conn, id, s, -1, -1);
		break;
	}
	case LLAMAD__REQUEST__OP_REWIND: on_rewind(e, conn, uid, id, q->rewind); break;
	case LLAMAD__REQUEST__OP_TOKENIZE: on_tokenize(e, conn, id, q->tokenize); break;
	case LLAMAD__REQUEST__OP_DETOKENIZE: on_detokenize(e, conn, id, q->detokenize); break;
	case LLAMAD__REQUEST__OP_CANCEL: on_cancel(e, conn, id, q->cancel); break;
	case LLAMAD__REQUEST__OP_STATUS: on_status(e, conn, uid, id); break;
	case LLAMAD__REQUEST__OP_SAVE: on_save(e, conn, uid, id, q->save); break;
	default:
		send_error(e, conn, id, LLAMAD__ERROR_CODE__UNKNOWN_OP, "unknown operation");
		break;
	}
}

struct drop_ctx {
	struct engine *e;
	uint64_t conn;
	struct session *victims[64];
	int n;
};

static void collect_ephemeral(struct session *s, void *ctx)
{
	struct drop_ctx *d = ctx;
	if (!s->ephemeral || s->owner_conn != d->conn)
		return;
	if (s->busy)
		s->owner_conn = 0;  /* orphaned: job_remove drops it */
	else if (d->n < 64)
		d->victims[d->n++] = s;
}

static void handle_disconnect(struct engine *e, uint64_t conn)
{
	for (struct job *j = e->jobs; j; j = j->next)
		if (j->conn == conn)
			j->cancelled = 2;
	/* ephemeral sessions of this connection go now if idle; busy ones
	 * (whoever's job runs on them) when their job ends, see job_remove() */
	struct drop_ctx d = { e, conn, { 0 }, 0 };
	do {
		d.n = 0;
		sess_foreach(&e->st, 0, collect_ephemeral, &d);
		for (int i = 0; i < d.n; i++)
			sess_drop(&e->st, d.victims[i]);
	} while (d.n == 64);
}

/* ---- the step ----------------------------------------------------------- */

/* Sample from j->logits, append the token, stream its text. */
static void after_logits(struct engine *e, struct job *j)
{
	struct session *s = j->s;
	if (j->t_first == 0)
		j->t_first = now_s();
	int32_t next = sampler_sample(&j->smp, j->logits, s->tokens, s->n_tokens);
	int eos = next == e->m->cfg.eos;
	if (s->n_tokens + 1 > session_limit(e)) {
		int keep = last_user_turn(s);
		if (make_room(e, s, 1, keep < 0 ? s->n_turns : keep) != 0) {
			finish_generate(e, j, LLAMAD__STOP_REASON__STOP_CONTEXT_FULL);
			return;
		}
	}
	if (sess_append(s, &next, 1, SESS_ASSISTANT, NULL, !j->answer_turn) != 0) {
		fail_job(e, j, LLAMAD__ERROR_CODE__RESOURCE_EXHAUSTED, "out of memory");
		return;
	}
	j->answer_turn = 1;
	j->generated++;
	s->generated++;
	e->n_generated++;
	if (eos) {
		finish_generate(e, j, LLAMAD__STOP_REASON__STOP_EOS);
		return;
	}
	char buf[128];
	int k = detok_feed(&j->dt, next, buf, sizeof(buf));
	int hit = k > 0 && stopper_push(&j->stop, buf, (size_t)k, emit_text, j) == 1;
	send_token_event(e, j, &next, 1);
	if (hit)
		finish_generate(e, j, LLAMAD__STOP_REASON__STOP_STRING);
	else if (j->generated >= j->max_tokens)
		finish_generate(e, j, LLAMAD__STOP_REASON__STOP_MAX_TOKENS);
}

static void step(struct engine *e)
{
	/* retire cancelled jobs and finished appends first */
	for (struct job *j = e->jobs, *nx; j; j = nx) {
		nx = j->next;
		if (j->cancelled) {
			if (j->kind == JOB_GENERATE)
				finish_generate(e, j, LLAMAD__STOP_REASON__STOP_CANCELLED);
			else
				fail_job(e, j, LLAMAD__ERROR_CODE__CANCELLED,
					 "cancelled; the turn stays and is prefilled later");
			continue;
		}
		if (j->kind == JOB_APPEND && j->s->n_tokens - j->s->n_cached <= 1) {
			if (j->cancelled != 2)
				send_info(e, j->conn, j->req_id, j->s, -1, j->tokens_added);
			job_remove(e, j);
		}
	}
	if (e->n_jobs == 0)
		return;
	if (e->n_jobs > e->batch_cap) {
		int cap = e->n_jobs * 2;
		struct fwd_seq *ns = realloc(e->seqs, (size_t)cap * sizeof(*ns));
		if (ns)
			e->seqs = ns;
		struct job **nb = realloc(e->batch, (size_t)cap * sizeof(*nb));
		if (nb)
			e->batch = nb;
		if (!ns || !nb)
			return;  /* retried next step */
		e->batch_cap = cap;
	}
	/* order: decode tokens first (one per generating session), then
	 * prefill chunks, round-robin from a rotating start */
	struct job *order[2][e->n_jobs];
	int n_order[2] = { 0, 0 };
	int idx = 0, start = (int)(e->rr++ % (unsigned)e->n_jobs);
	struct job *all[e->n_jobs];
	for (struct job *j = e->jobs; j; j = j->next)
		all[idx++] = j;
	for (int k = 0; k < e->n_jobs; k++) {
		struct job *j = all[(start + k) % e->n_jobs];
		int pending = j->s->n_tokens - j->s->n_cached;
		int decode = j->kind == JOB_GENERATE && pending == 1;
		order[decode ? 0 : 1][n_order[decode ? 0 : 1]++] = j;
	}
	int budget = e->cfg.step_tokens < e->step_cap ? e->cfg.step_tokens : e->step_cap;
	int nb = 0;
	for (int pass = 0; pass < 2; pass++) {
		for (int k = 0; k < n_order[pass] && budget > 0; k++) {
			struct job *j = order[pass][k];
			struct session *s = j->s;
			int pending = s->n_tokens - s->n_cached;
			int want = j->kind == JOB_APPEND ? pending - 1 : pending;
			int take = want < budget ? want : budget;
			if (take <= 0)
				continue;
			int rc = kvseq_prepare(e->pool, &s->kv, s->n_cached + take, s->n_cached);
			while (rc == -ENOSPC && evict_one(e, s))
				rc = kvseq_prepare(e->pool, &s->kv, s->n_cached + take, s->n_cached);
			if (rc) {
				fail_job(e, j, LLAMAD__ERROR_CODE__RESOURCE_EXHAUSTED,
					 "the KV cache is full (raise kv_memory or drop sessions)");
				continue;
			}
			struct fwd_seq *q = &e->seqs[nb];
			q->tokens = s->tokens + s->n_cached;
			q->n_tokens = take;
			q->pos = s->n_cached;
			q->block_table = s->kv.blocks;
			q->logits = j->kind == JOB_GENERATE && take == want ? j->logits : NULL;
			q->all_logits = 0;
			e->batch[nb++] = j;
			budget -= take;
		}
	}
	if (nb == 0)
		return;
	int rc = fwd_run(e->fwd, &e->pool->kv, e->seqs, nb);
	e->n_forward++;
	if (e->fail_after && e->n_forward >= e->fail_after) {
		e->be->failed = 1;  /* LLAMAD_TEST_FAIL_AFTER: a backend failure on cue */
		rc = -EIO;
	}
	if (rc && e->be->failed)
		backend_died(e);
	if (rc) {
		log_msg(LL_ERROR, "forward pass failed: %s", strerror(-rc));
		for (int i = 0; i < nb; i++)
			fail_job(e, e->batch[i], LLAMAD__ERROR_CODE__INTERNAL, "forward pass failed");
		return;
	}
	for (int i = 0; i < nb; i++) {
		struct job *j = e->batch[i];
		struct fwd_seq *q = &e->seqs[i];
		struct session *s = j->s;
		s->n_cached += q->n_tokens;
		s->prefilled += (uint64_t)q->n_tokens;
		e->n_prefilled += (uint64_t)q->n_tokens;
		if (j->kind == JOB_GENERATE && j->t_first == 0)
			j->prompt_tokens += q->n_tokens;
		if (q->logits)
			after_logits(e, j);
	}
}

/* ---- thread ----------------------------------------------------------- */

static void end_all(struct engine *e)
{
	while (e->jobs) {
		struct job *j = e->jobs;
		fail_job(e, j, LLAMAD__ERROR_CODE__SHUTTING_DOWN, "the daemon is stopping");
	}
}

static void *engine_main(void *arg)
{
	struct engine *e = arg;
	for (;;) {
		pthread_mutex_lock(&e->mu);
		while (!e->cmd_head && e->n_jobs == 0 && !e->shutdown && !e->have_pending_cfg) {
			if (!e->trimmed && e->idle_ticks >= 2) {
				/* idle for two seconds: give back memory the last burst
				 * touched (free K/V blocks, the heap's free top) */
				pthread_mutex_unlock(&e->mu);
				size_t kv = kvpool_release_free(e->pool);
				malloc_trim(0);
				log_msg(LL_DEBUG, "idle: released %zu bytes of free K/V blocks", kv);
				pthread_mutex_lock(&e->mu);
				e->trimmed = 1;
				continue;
			}
			if (!e->state_dir && e->trimmed) {
				pthread_cond_wait(&e->cv, &e->mu);
				continue;
			}
			/* wake up once a second to save idle sessions and count
			 * idle time */
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec += 1;
			if (pthread_cond_timedwait(&e->cv, &e->mu, &ts) == ETIMEDOUT) {
				e->idle_ticks++;
				if (e->state_dir)
					break;
			}
		}
		if (e->cmd_head || e->n_jobs) {
			e->idle_ticks = 0;
			e->trimmed = 0;
		}
		struct cmd *c = e->cmd_head;
		e->cmd_head = e->cmd_tail = NULL;
		int shut = e->shutdown;
		if (e->have_pending_cfg) {
			/* reloadable keys only (config_set with reload_only) */
			struct config *n = &e->pending_cfg;
			e->cfg.max_sessions = n->max_sessions;
			e->cfg.max_sessions_per_uid = n->max_sessions_per_uid;
			e->cfg.save_delay = n->save_delay;
			e->cfg.foreign_cache = n->foreign_cache;
			e->cfg.max_session_tokens = n->max_session_tokens;
			e->cfg.max_frame = n->max_frame;
			e->cfg.max_text = n->max_text;
			e->cfg.step_tokens = n->step_tokens;
			e->cfg.max_tokens = n->max_tokens;
			e->cfg.tmpl = n->tmpl;
			e->cfg.context_policy = n->context_policy;
			e->cfg.temperature = n->temperature;
			e->cfg.top_k = n->top_k;
			e->cfg.top_p = n->top_p;
			e->cfg.min_p = n->min_p;
			e->cfg.repeat_penalty = n->repeat_penalty;
			e->cfg.repeat_last_n = n->repeat_last_n;
			e->cfg.presence_penalty = n->presence_penalty;
			e->cfg.frequency_penalty = n->frequency_penalty;
			e->have_pending_cfg = 0;
		}
		pthread_mutex_unlock(&e->mu);
		while (c) {
			struct cmd *n = c->next;
			if (shut && c->kind == CMD_REQUEST) {
				send_error(e, c->conn, c->req->id, LLAMAD__ERROR_CODE__SHUTTING_DOWN,
					   "the daemon is stopping");
			} else if (c->kind == CMD_REQUEST) {
				handle_request(e, c->conn, c->uid, c->req);
			} else {
				handle_disconnect(e, c->conn);
			}
			if (c->req)
				llamad__request__free_unpacked(c->req, NULL);
			free(c);
			c = n;
		}
		if (shut) {
			end_all(e);
			if (e->state_dir) {
				struct save_all_ctx sa = { e, 0, 1, 0, 0, 0, NULL };
				sess_foreach(&e->st, 0, save_one_of_all, &sa);
				free(sa.first_error);
				log_msg(sa.errors ? LL_ERROR : LL_INFO, "saved %d session%s at shutdown%s",
					sa.n, sa.n == 1 ? "" : "s",
					sa.errors ? "; some could not be saved (see above)" : "");
			}
			pthread_mutex_lock(&e->mu);
			e->finished = 1;
			pthread_mutex_unlock(&e->mu);
			e->out_pending = 1;
			flush_notify(e);
			return NULL;
		}
		if (e->n_jobs)
			step(e);
		save_idle(e);
		flush_notify(e);
	}
}

/* mkdir -p with mode 0700 for what it creates. */
static int mkdirs(const char *path)
{
	char *p = strdup(path);
	if (!p)
		return -ENOMEM;
	for (char *q = p + 1; ; q++) {
		if (*q == '/' || !*q) {
			char c = *q;
			*q = 0;
			if (mkdir(p, 0700) != 0 && errno != EEXIST) {
				int e = errno;
				free(p);
				return -e;
			}
			*q = c;
			if (!c)
				break;
		}
	}
	free(p);
	return 0;
}

/* The state directory: the setting, else $STATE_DIRECTORY (systemd), else
 * /var/lib/llamad for root, else $XDG_STATE_HOME/llamad or
 * ~/.local/state/llamad. "none" turns persistence off. */
static int resolve_state_dir(struct engine *e, const char *setting)
{
	char *d = NULL;
	if (setting && !strcmp(setting, "none"))
		return 0;
	if (setting) {
		d = strdup(setting);
	} else if (getenv("STATE_DIRECTORY") && *getenv("STATE_DIRECTORY")) {
		d = strndup(getenv("STATE_DIRECTORY"), strcspn(getenv("STATE_DIRECTORY"), ":"));
	} else if (geteuid() == 0) {
		d = strdup("/var/lib/llamad");
	} else if (getenv("XDG_STATE_HOME") && *getenv("XDG_STATE_HOME")) {
		if (asprintf(&d, "%s/llamad", getenv("XDG_STATE_HOME")) < 0)
			d = NULL;
	} else if (getenv("HOME")) {
		if (asprintf(&d, "%s/.local/state/llamad", getenv("HOME")) < 0)
			d = NULL;
	}
	if (!d) {
		log_msg(LL_WARN, "no state directory: sessions will not be saved");
		return -ENOENT;
	}
	int rc = mkdirs(d);
	if (rc)
		log_msg(LL_ERROR, "state directory %s: %s; sessions cannot be saved until it "
			"can be written", d, strerror(-rc));
	else
		log_msg(LL_INFO, "state directory %s", d);
	e->state_dir = d;
	return 0;
}

struct engine *engine_new(struct model *m, const struct config *cfg, char **cause)
{
	struct engine *e = calloc(1, sizeof(*e));
	if (!e)
		return NULL;
	e->m = m;
	e->cfg = *cfg;
	/* the strings stay owned by the caller's config */
	e->ctx = m->cfg.max_ctx;
	e->t_start = now_s();
	const char *fa = getenv("LLAMAD_TEST_FAIL_AFTER");
	e->fail_after = fa && *fa ? strtoull(fa, NULL, 10) : 0;
	pthread_mutex_init(&e->mu, NULL);
	pthread_cond_init(&e->cv, NULL);
	struct backend_opts bo = { .kind = (enum backend_kind)cfg->device, .n_threads = cfg->threads,
				   .wtype = (enum backend_wtype)cfg->gpu_weights };
	char *note = NULL;
	e->be = backend_open(&bo, cause, &note);
	if (!e->be) {
		if (!*cause && asprintf(cause, "out of memory creating the backend") < 0)
			*cause = NULL;
		engine_free(e);
		return NULL;
	}
	if (note)
		log_msg(LL_INFO, "device auto: using the CPU (%s)", note);
	free(note);
	log_msg(LL_INFO, "backend: %s", e->be->desc);
	e->step_cap = cfg->step_tokens > 64 ? cfg->step_tokens : 64;
	if (e->step_cap < 4096)
		e->step_cap = 4096 < e->ctx ? 4096 : (e->ctx > 64 ? e->ctx : 64);
	if (e->step_cap < cfg->step_tokens)
		e->step_cap = cfg->step_tokens;
	/* weights and scratch first: on a GPU the KV pool takes a share of
	 * what they leave */
	double t_place = now_s();
	e->fwd = fwd_new(m, e->be, e->step_cap);
	if (e->fwd)   /* uploads, or the CPU's packing of quantized matrices */
		log_msg(LL_INFO, "weights placed in %.0f ms (%s)", (now_s() - t_place) * 1e3,
			e->be->desc);
	if (!e->fwd) {
		if (asprintf(cause, "%s placing the weights and %d-token scratch on the %s",
			     e->be->failed ? "device error" : "out of memory", e->step_cap,
			     e->be->ops->name) < 0)
			*cause = NULL;
		engine_free(e);
		return NULL;
	}
	int kv_dim = model_kv_dim(&m->cfg);
	size_t bb = (size_t)m->cfg.n_layers * 2 * KV_BLOCK_TOKENS * kv_dim * sizeof(float);
	uint64_t kv_bytes = cfg->kv_memory;
	size_t dev_free, dev_total;
	if (backend_mem_info(e->be, &dev_free, &dev_total) == 0) {
		kv_bytes = (uint64_t)dev_free / 100 * (uint64_t)cfg->gpu_kv_share;
		log_msg(LL_INFO, "GPU memory: %.1f GiB free of %.1f GiB after the weights; "
			"KV cache %.1f GiB (gpu_kv_share %d%%)", dev_free / 1073741824.0,
			dev_total / 1073741824.0, kv_bytes / 1073741824.0, cfg->gpu_kv_share);
	}
	uint64_t nblocks = kv_bytes / bb;
	if (nblocks > INT32_MAX)
		nblocks = INT32_MAX;
	if (nblocks < 1) {
		if (asprintf(cause, "a KV cache of %llu bytes holds %llu blocks of %zu bytes; "
			     "need at least one (raise %s)", (unsigned long long)kv_bytes,
			     (unsigned long long)nblocks, bb,
			     e->be->host_mem ? "kv_memory" : "gpu_kv_share") < 0)
			*cause = NULL;
		engine_free(e);
		return NULL;
	}
	e->pool = kvpool_new_on(e->be, (int)nblocks, KV_BLOCK_TOKENS, m->cfg.n_layers, kv_dim);
	if (!e->pool || sess_table_init(&e->st, e->pool) != 0) {
		if (asprintf(cause, "out of memory allocating %llu bytes of KV cache",
			     (unsigned long long)kv_bytes) < 0)
			*cause = NULL;
		engine_free(e);
		return NULL;
	}
	snprintf(e->backend_name, sizeof(e->backend_name), "%s", e->be->desc);
	model_describe(m, e->model_desc, sizeof(e->model_desc));
	if (resolve_state_dir(e, cfg->state_dir) == 0 && e->state_dir)
		list_saved(e);
	return e;
}

int engine_start(struct engine *e, int notify_fd)
{
	e->notify_fd = notify_fd;
	int rc = pthread_create(&e->thread, NULL, engine_main, e);
	if (rc)
		return -rc;
	e->started = 1;
	return 0;
}

static void push_cmd(struct engine *e, struct cmd *c)
{
	pthread_mutex_lock(&e->mu);
	if (e->cmd_tail)
		e->cmd_tail->next = c;
	else
		e->cmd_head = c;
	e->cmd_tail = c;
	pthread_cond_signal(&e->cv);
	pthread_mutex_unlock(&e->mu);
}

void engine_submit(struct engine *e, uint64_t conn, uid_t uid, Llamad__Request *req)
{
	struct cmd *c = calloc(1, sizeof(*c));
	if (!c) {
		llamad__request__free_unpacked(req, NULL);
		return;
	}
	c->kind = CMD_REQUEST;
	c->conn = conn;
	c->uid = uid;
	c->req = req;
	push_cmd(e, c);
}

void engine_disconnect(struct engine *e, uint64_t conn)
{
	struct cmd *c = calloc(1, sizeof(*c));
	if (!c)
		return;
	c->kind = CMD_DISCONNECT;
	c->conn = conn;
	push_cmd(e, c);
}

void engine_reload(struct engine *e, const struct config *cfg)
{
	pthread_mutex_lock(&e->mu);
	e->pending_cfg = *cfg;
	e->have_pending_cfg = 1;
	pthread_cond_signal(&e->cv);
	pthread_mutex_unlock(&e->mu);
}

void engine_shutdown(struct engine *e)
{
	pthread_mutex_lock(&e->mu);
	e->shutdown = 1;
	pthread_cond_signal(&e->cv);
	pthread_mutex_unlock(&e->mu);
}

int engine_finished(struct engine *e)
{
	pthread_mutex_lock(&e->mu);
	int f = e->finished;
	pthread_mutex_unlock(&e->mu);
	return f;
}

struct engine_out *engine_take_out(struct engine *e)
{
	pthread_mutex_lock(&e->mu);
	struct engine_out *o = e->out_head;
	e->out_head = e->out_tail = NULL;
	pthread_mutex_unlock(&e->mu);
	return o;
}

void engine_set_connections(struct engine *e, int open, uint64_t accepted)
{
	pthread_mutex_lock(&e->mu);
	e->conns_open = open;
	e->conns_accepted = accepted;
	pthread_mutex_unlock(&e->mu);
}

const char *engine_backend_name(const struct engine *e)
{
	return e->backend_name;
}

void engine_join(struct engine *e)
{
	if (e->started)
		pthread_join(e->thread, NULL);
	e->started = 0;
}

void engine_free(struct engine *e)
{
	if (!e)
		return;
	engine_join(e);
	while (e->jobs) {
		struct job *j = e->jobs;
		e->jobs = j->next;
		job_free(j);
	}
	for (struct cmd *c = e->cmd_head, *n; c; c = n) {
		n = c->next;
		if (c->req)
			llamad__request__free_unpacked(c->req, NULL);
		free(c);
	}
	for (struct engine_out *o = e->out_head, *n; o; o = n) {
		n = o->next;
		free(o);
	}
	sess_table_done(&e->st);
	fwd_free(e->fwd);
	kvpool_free(e->pool);
	backend_free(e->be);
	free(e->seqs);
	free(e->batch);
	free(e->state_dir);
	pthread_mutex_destroy(&e->mu);
	pthread_cond_destroy(&e->cv);
	free(e);
}

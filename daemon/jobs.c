/*
 * daemon/jobs.c — the engine's work in flight, shared by the step
 * (engine.c) and the request handlers (handlers.c): the replies queued for
 * the event thread, the requests waiting for their session, the jobs that
 * run over several steps, and the limits a session runs under. Engine
 * thread only, except engine_send's queue, under e->mu.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/engine_int.h"
#include "daemon/log.h"
#include "util/clock.h"
#include "util/grow.h"

/* ---- output ---------------------------------------------------------- */

void engine_send(struct engine *e, struct reply *o)
{
	if (!o) {
		log_msg(LL_ERROR, "engine: out of memory for a reply");
		return;
	}
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

void engine_notify(struct engine *e)
{
	if (!e->out_pending)
		return;
	e->out_pending = 0;
	uint64_t one = 1;
	if (write(e->notify_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		log_msg(LL_ERROR, "engine: cannot signal the event loop: %s", strerror(errno));
}

void engine_reply(struct engine *e, uint64_t conn, const Llamad__Response *r)
{
	engine_send(e, reply_pack(conn, r));
}

void engine_error(struct engine *e, uint64_t conn, uint64_t id, int err, const char *fmt, ...)
{
	char msg[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	engine_send(e, reply_error(conn, id, reply_code(err), msg));
}

struct uid_stats *engine_uid_stats(struct engine *e, uid_t uid)
{
	static struct uid_stats scratch;
	for (int i = 0; i < e->n_ustats; i++)
		if (e->ustats[i].uid == uid)
			return &e->ustats[i];
	if (e->n_ustats == e->cap_ustats) {
		int cap = e->cap_ustats ? 2 * e->cap_ustats : 8;
		struct uid_stats *n = realloc(e->ustats, (size_t)cap * sizeof(*n));
		if (!n)
			return &scratch;
		e->ustats = n;
		e->cap_ustats = cap;
	}
	e->ustats[e->n_ustats] = (struct uid_stats){ .uid = uid };
	return &e->ustats[e->n_ustats++];
}

int engine_session_limit(const struct engine *e)
{
	int lim = e->ctx;
	if (e->cfg.max_session_tokens > 0 && e->cfg.max_session_tokens < lim)
		lim = e->cfg.max_session_tokens;
	return lim;
}

struct info_env engine_info_env(struct engine *e, const struct session *s)
{
	struct info_env env = {
		.block_bytes = kt_kv_block_bytes(&e->pool->kv),
		.shared_blocks = (uint32_t)sess_shared_blocks(&e->st, s),
		.context_length = (uint32_t)engine_session_limit(e),
	};
	return env;
}

struct turn_env engine_turns(struct engine *e)
{
	struct turn_env te = { &e->st, e->m->tok, e->m->cfg.bos, e->m->cfg.eos,
				engine_session_limit(e) };
	return te;
}

/* ---- jobs --------------------------------------------------------------- */

struct job *job_new(int kind, uint64_t conn, uint64_t id, struct session *s)
{
	struct job *j = calloc(1, sizeof(*j));
	if (!j)
		return NULL;
	j->kind = kind;
	j->conn = conn;
	j->req_id = id;
	j->s = s;
	j->t0 = clock_mono_s();
	return j;
}

void job_free(struct job *j)
{
	if (!j)
		return;
	if (j->gen_ok)
		gen_done(&j->gen);
	free(j->text);
	free(j->logits);
	free(j);
}

void job_add(struct engine *e, struct job *j)
{
	j->next = e->jobs;
	e->jobs = j;
	e->n_jobs++;
	j->s->busy = 1;
}

void job_remove(struct engine *e, struct job *j)
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
	s->last_use_ms = clock_unix_ms();
	job_free(j);
	/* an ephemeral session whose connection went away while it was busy
	 * (see handle_disconnect) goes with its last job */
	if (s->ephemeral && s->owner_conn == 0)
		res_drop(&e->res, s, 0);
}

void job_emit_text(void *ctx, const char *text, size_t len)
{
	struct job *j = ctx;
	if (grow(&j->text, &j->cap_text, j->n_text + len + 1, 1, 256))
		return;  /* text of this event lost; the tokens are still sent */
	memcpy(j->text + j->n_text, text, len);
	j->n_text += len;
	j->text[j->n_text] = 0;
}

/* ---- requests waiting for their session ------------------------------------ */

void park_push(struct engine *e, struct cmd *c)
{
	c->next = NULL;  /* after the others: requests run in the order they came */
	if (e->parked_tail)
		e->parked_tail->next = c;
	else
		e->parked_head = c;
	e->parked_tail = c;
}

void park_remove(struct engine *e, struct cmd *prev, struct cmd *c)
{
	if (prev)
		prev->next = c->next;
	else
		e->parked_head = c->next;
	if (e->parked_tail == c)
		e->parked_tail = prev;
	c->next = NULL;
}

void cmd_free(struct cmd *c)
{
	llamad__request__free_unpacked(c->req, NULL);
	free(c);
}

void end_parked(struct engine *e, int err, const char *msg)
{
	while (e->parked_head) {
		struct cmd *c = e->parked_head;
		park_remove(e, NULL, c);
		engine_error(e, c->conn, c->req->id, err, "%s", msg);
		cmd_free(c);
	}
}

void park_drop_conn(struct engine *e, uint64_t conn)
{
	struct cmd *prev = NULL;
	for (struct cmd *c = e->parked_head, *n; c; c = n) {
		n = c->next;
		if (c->conn != conn) {
			prev = c;
			continue;
		}
		park_remove(e, prev, c);
		cmd_free(c);
	}
}

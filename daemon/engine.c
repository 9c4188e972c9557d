/*
 * daemon/engine.c — see engine.h: the engine thread, its two queues, the
 * jobs and the batched step. What each request does is in handlers.c;
 * where sessions live (pool, host memory, disk) in session/residency.c.
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
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "daemon/engine_int.h"
#include "daemon/fair.h"
#include "daemon/log.h"
#include "proto/frame.h"
#include "session/kvsize.h"
#include "util/cause.h"
#include "util/clock.h"
#include "util/mem.h"

/* Send r as the reply of j's request (its id set here), unless j's client
 * has gone. */
static void job_reply(struct engine *e, struct job *j, Llamad__Response *r)
{
	PB_SET(r, id, j->req_id);
	if (j->cancelled != 2)
		engine_reply(e, j->conn, r);
}

/* The bounds of Status's histograms, in seconds (llamad.proto). */
static const double ttft_le[] = { 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30 };
static const double token_time_le[] = { 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1 };

/* A token event of j goes out: the first is its time to first token, the
 * others the time since the one before. */
static void observe_event(struct engine *e, struct job *j)
{
	double t = clock_mono_s();
	if (j->t_last_event > 0)
		hist_observe(&e->token_time, t - j->t_last_event);
	else
		hist_observe(&e->ttft, t - j->t_arrive);
	j->t_last_event = t;
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
		if (j->cancelled != 2)   /* the last text alone is no token */
			observe_event(e, j);
	}
	Llamad__Response r = LLAMAD__RESPONSE__INIT;
	r.body_case = LLAMAD__RESPONSE__BODY_TOKEN;
	r.token = &ev;
	job_reply(e, j, &r);
	j->n_text = 0;
	if (j->text)
		j->text[0] = 0;
}

/* The wire's StopReason of each enum gen_end. */
static const int stop_reasons[] = {
	[GEN_EOS] = LLAMAD__STOP_REASON__STOP_EOS,
	[GEN_MAX_TOKENS] = LLAMAD__STOP_REASON__STOP_MAX_TOKENS,
	[GEN_STOP_STRING] = LLAMAD__STOP_REASON__STOP_STRING,
	[GEN_CONTEXT_FULL] = LLAMAD__STOP_REASON__STOP_CONTEXT_FULL,
	[GEN_CANCELLED] = LLAMAD__STOP_REASON__STOP_CANCELLED,
};

/* End a generate job with Done for why (enum gen_end). */
static void finish_generate(struct engine *e, struct job *j, int why)
{
	gen_finish(&j->gen, why);
	struct session *s = j->s;
	if (j->answer_turn && s->n_turns > 0 && s->turns[s->n_turns - 1].role == CHAT_ASSISTANT &&
	    !s->turns[s->n_turns - 1].text)
		s->turns[s->n_turns - 1].end = (uint8_t)stop_reasons[why];  /* transcripts */
	if (j->n_text)
		send_token_event(e, j, NULL, 0);
	double t = clock_mono_s();
	Llamad__Done d = LLAMAD__DONE__INIT;
	PB_SET(&d, reason, stop_reasons[why]);
	PB_SET(&d, prompt_tokens, (uint32_t)j->prompt_tokens);
	PB_SET(&d, shared_tokens, (uint32_t)j->shared_tokens);
	PB_SET(&d, generated_tokens, (uint32_t)j->gen.generated);
	PB_SET(&d, prefill_ms, ((j->t_first > 0 ? j->t_first : t) - j->t0) * 1e3);
	PB_SET(&d, generate_ms, j->t_first > 0 ? (t - j->t_first) * 1e3 : 0);
	PB_SET(&d, session_tokens, (uint32_t)j->s->n_tokens);
	PB_SET(&d, context_tokens, (uint32_t)j->context_tokens);
	if (why == GEN_STOP_STRING)
		d.stop = (char *)gen_stop_string(&j->gen);
	/* what a context shift removed meanwhile (always said: a client tells
	 * a daemon that does not by the field's absence) */
	PB_SET(&d, dropped_turns, s->shift_turns - j->shift_turns0);
	PB_SET(&d, dropped_tokens, (uint32_t)(s->shift_tokens - j->shift_tokens0));
	PB_SET(&d, slid_tokens, j->answer_turn && s->n_turns > 0 ?
				(uint32_t)s->turns[s->n_turns - 1].slid : 0);
	Llamad__Response r = LLAMAD__RESPONSE__INIT;
	r.body_case = LLAMAD__RESPONSE__BODY_DONE;
	r.done = &d;
	job_reply(e, j, &r);
	log_msg(LL_DEBUG, "session %s: generated %d tokens (%s)", j->s->id, j->gen.generated,
		why == GEN_EOS ? "eos" : "stopped");
	job_remove(e, j);
}

/* End j with an error (-errno err). */
static void fail_job(struct engine *e, struct job *j, int err, const char *msg)
{
	if (j->cancelled != 2)
		engine_error(e, j->conn, j->req_id, err, "%s", msg);
	job_remove(e, j);
}

/*
 * A sticky device error: nothing more can run on this GPU. Save what can be
 * saved (histories; their K/V is recomputed later), tell the service
 * manager and exit non-zero; Restart=on-failure brings llamad back with
 * the sessions.
 */
static void backend_died(struct engine *e)
{
	log_msg(LL_ERROR, "the %s backend failed (%s); saving session histories and exiting "
		"so that the service restarts", e->be->ops->name, e->be->desc);
	if (e->on_fatal)
		e->on_fatal("backend failed: saving sessions and restarting");
	res_save_histories(&e->res);
	_exit(EXIT_FAILURE);
}

/* ---- the step ----------------------------------------------------------- */

/* Sample from j->logits, append the token, stream its text. */
static void after_logits(struct engine *e, struct job *j)
{
	struct session *s = j->s;
	if (j->t_first == 0) {
		j->t_first = clock_mono_s();
		j->context_tokens = s->n_tokens;
	}
	int32_t next = gen_sample(&j->gen, j->logits, s->tokens, s->n_tokens);
	if (s->n_tokens + 1 > engine_session_limit(e)) {
		/* shift: earlier exchanges go, then the answer slides (never the
		 * question it answers, nor what must stay before it) */
		struct turn_env te = engine_turns(e);
		int rc = turn_slide(&te, s, &j->keep_turn, j->answer_turn);
		if (rc == -ENOMEM) {
			fail_job(e, j, rc, "out of memory");
			return;
		}
		if (rc != 0) {
			finish_generate(e, j, GEN_CONTEXT_FULL);
			return;
		}
	}
	/* an answer that ends is stored with its template's end of turn
	 * (llama3 <|eot_id|>, llama2 EOS), whichever end id the model chose
	 * (<|end_of_text|>, <|eom_id|>, ...): what the next turn follows */
	int32_t stored = next;
	if (gen_is_end(&j->gen, next)) {
		int32_t eot = chat_end_of_turn(e->m->tok, s->tmpl, e->m->cfg.eos);
		if (eot >= 0)
			stored = eot;
	}
	if (sess_append(s, &stored, 1, CHAT_ASSISTANT, NULL, !j->answer_turn) != 0) {
		fail_job(e, j, -ENOMEM, "out of memory");
		return;
	}
	j->answer_turn = 1;
	s->generated++;
	e->n_generated++;
	engine_uid_stats(e, s->uid)->generated++;
	int why = gen_accept(&j->gen, next);
	if (why != GEN_EOS)
		send_token_event(e, j, &next, 1);
	if (why != GEN_GO)
		finish_generate(e, j, why);
}

/* s may grow to `tokens` cached tokens only within its owner's share of the
 * KV pool (max_kv_share_per_uid; root has no limit): the owner's other idle
 * sessions leave the pool first. 0, or -EUSERS with the share in *share. */
static int within_share(struct engine *e, struct session *s, int tokens, int *share)
{
	int pct = e->cfg.max_kv_share_per_uid;
	*share = (int)((int64_t)e->pool->kv.n_blocks * pct / 100);
	int need = (tokens + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS - s->kv.n_blocks;
	if (pct >= 100 || s->uid == 0 || need <= 0)
		return 0;
	for (;;) {
		/* blocks its sessions share count once */
		int held = sess_uid_blocks(&e->st, s->uid);
		if (held + need <= *share)
			return 0;
		if (!res_evict_one_of(&e->res, s, s->uid))
			return -EUSERS;
	}
}

/*
 * With fair_share on, deal this step's rows among the users with work
 * (daemon/fair.h; one user alone: a step of FAIR_SOLO_FACTOR its cheapest
 * row's time, at least FAIR_SOLO_S): cand[0, n) are the jobs in the
 * step's order, limit[k] becomes the most rows cand[k] may run. The users'
 * credit carries from step to step while they have work. limit[] stays as
 * it was (every row within budget) when fair_share is off, the costs are
 * not known yet, or no job has rows to run.
 */
static void share_step(struct engine *e, struct job **cand, int n, int budget, int *limit)
{
	if (!e->cfg.fair_share || !fair_known(&e->cost))
		return;
	struct fair_user users[n];
	struct fair_job jobs[n];
	int n_users = 0;
	double a, k1, k2;
	int told = fair_line(&e->cost, &a, &k1, &k2);
	for (int i = 0; i < n; i++) {
		const struct session *s = cand[i]->s;
		int want = s->n_tokens - s->n_cached - (cand[i]->kind == JOB_APPEND);
		int u = 0;
		while (u < n_users && users[u].uid != (uint32_t)s->uid)
			u++;
		if (want > 0 && u == n_users) {
			users[n_users].uid = (uint32_t)s->uid;
			users[n_users++].credit = 0;
			for (int f = 0; f < e->n_fusers; f++)
				if (e->fusers[f].uid == (uint32_t)s->uid)
					users[u].credit = e->fusers[f].credit;
		}
		jobs[i].user = u;
		jobs[i].want = want > 0 ? (want < budget ? want : budget) : 0;
		int logits = cand[i]->kind == JOB_GENERATE && want == 1;
		jobs[i].cost0 = k1 * (e->shape.row + (logits ? e->shape.logits : 0)) +
				k2 * e->shape.per_pos * s->n_cached;
		jobs[i].dcost = k2 * e->shape.per_pos;
	}
	if (n_users == 0) {
		e->n_fusers = 0;
		return;
	}
	if (n_users == 1 && !told) {
		/* one user, a not known: every row (batching may pay), and now
		 * and then half of them, so that the fit learns a */
		e->n_fusers = 0;
		int rows = 0;
		for (int i = 0; i < n; i++)
			rows += jobs[i].want;
		if (e->n_forward % FAIR_PROBE != 0 || rows < 2)
			return;
		for (int i = 0, half = rows / 2; i < n; i++) {
			limit[i] = jobs[i].want < half ? jobs[i].want : half;
			half -= limit[i];
		}
		return;
	}
	fair_pick(users, n_users, jobs, n, a, budget, e->rr_user++);
	for (int i = 0; i < n; i++)
		limit[i] = jobs[i].take;
	/* the credit of the users with work, for the next step */
	if (n_users > e->cap_fusers) {
		struct fair_user *nf = realloc(e->fusers, (size_t)n_users * sizeof(*nf));
		if (!nf)
			return;
		e->fusers = nf;
		e->cap_fusers = n_users;
	}
	memcpy(e->fusers, users, (size_t)n_users * sizeof(*users));
	e->n_fusers = n_users;
}

/* The forward pass of the step's batch: e->pass unless a test wrapped it. */
static int forward_pass(struct engine *e, int nb)
{
	return fwd_run(e->fwd, &e->pool->kv, e->seqs, nb);
}

static void step(struct engine *e)
{
	/* retire cancelled jobs and finished appends first */
	for (struct job *j = e->jobs, *nx; j; j = nx) {
		nx = j->next;
		if (j->cancelled) {
			if (j->kind == JOB_GENERATE)
				finish_generate(e, j, GEN_CANCELLED);
			else
				fail_job(e, j, -ECANCELED,
					 "cancelled; the turn stays and is prefilled later");
			continue;
		}
		if (j->kind == JOB_APPEND && j->s->n_tokens - j->s->n_cached <= 1) {
			j->s->busy = 0;  /* done: the reply says so (job_remove clears it too) */
			if (j->cancelled != 2) {
				struct info_env env = engine_info_env(e, j->s);
				struct info_append ia = { j->tokens_added, j->prompt_tokens,
							  j->dropped_turns };
				engine_send(e, reply_info(j->conn, j->req_id, j->s, &env, -1, &ia));
			}
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
	/* the step's order: decode tokens first (one per generating session),
	 * then prefill chunks, round-robin from a rotating start */
	int idx = 0, start = (int)(e->rr++ % (unsigned)e->n_jobs);
	struct job *all[e->n_jobs], *cand[e->n_jobs];
	for (struct job *j = e->jobs; j; j = j->next)
		all[idx++] = j;
	int budget = e->cfg.step_tokens < e->step_cap ? e->cfg.step_tokens : e->step_cap;
	int n_cand = 0, limit[e->n_jobs];
	for (int pass = 0; pass < 2; pass++)
		for (int k = 0; k < e->n_jobs; k++) {
			struct job *j = all[(start + k) % e->n_jobs];
			int decode = j->kind == JOB_GENERATE && j->s->n_tokens - j->s->n_cached == 1;
			if (decode == (pass == 0)) {
				limit[n_cand] = budget;
				cand[n_cand++] = j;
			}
		}
	share_step(e, cand, n_cand, budget, limit);
	int nb = 0;
	double work = 0, attn = 0;   /* the step's (fair.h: x1, x2) */
	for (int k = 0; k < n_cand && budget > 0; k++) {
		struct job *j = cand[k];
		struct session *s = j->s;
		if (limit[k] <= 0)
			continue;   /* its user's share of this step is taken */
		/* whole blocks another session of its owner holds */
		int hit = sess_share_prefix(&e->st, s);
		if (j->kind == JOB_GENERATE && j->t_first == 0)
			j->shared_tokens += hit;
		int pending = s->n_tokens - s->n_cached;
		int want = j->kind == JOB_APPEND ? pending - 1 : pending;
		int take = want < budget ? want : budget;
		if (take > limit[k])
			take = limit[k];
		if (take <= 0)
			continue;
		/* the whole of what it wants must fit its owner's share, not
		 * only this step's part: refused before it takes blocks that
		 * it would then hold for nothing */
		int share;
		if (within_share(e, s, s->n_cached + want, &share)) {
			char msg[160];
			snprintf(msg, sizeof(msg), "uid %u holds its share of the KV cache (%d of "
				 "%d blocks: max_kv_share_per_uid %d%%); drop or save sessions",
				 (unsigned)s->uid, share, e->pool->kv.n_blocks,
				 e->cfg.max_kv_share_per_uid);
			fail_job(e, j, -EUSERS, msg);
			continue;
		}
		int rc = kvseq_prepare(e->pool, &s->kv, s->n_cached + take, s->n_cached);
		while (rc == -ENOSPC && res_evict_one(&e->res, s))
			rc = kvseq_prepare(e->pool, &s->kv, s->n_cached + take, s->n_cached);
		if (rc) {
			fail_job(e, j, rc == -ENOSPC ? -ENOBUFS : rc,
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
		work += take * e->shape.row + (q->logits ? e->shape.logits : 0);
		attn += e->shape.per_pos * ((double)take * q->pos + (double)take * (take - 1) / 2);
	}
	if (nb == 0)
		return;
	double t0 = clock_mono_s();
	int rc = e->pass(e, nb);
	e->n_forward++;
	if (rc && e->be->failed)
		backend_died(e);
	if (rc) {
		log_msg(LL_ERROR, "forward pass failed: %s", strerror(-rc));
		for (int i = 0; i < nb; i++)
			fail_job(e, e->batch[i], -ENOTRECOVERABLE, "forward pass failed");
		return;
	}
	for (int i = 0; i < nb; i++) {
		struct job *j = e->batch[i];
		struct fwd_seq *q = &e->seqs[i];
		struct session *s = j->s;
		s->n_cached += q->n_tokens;
		sess_name_blocks(&e->st, s);
		s->prefilled += (uint64_t)q->n_tokens;
		e->n_prefilled += (uint64_t)q->n_tokens;
		engine_uid_stats(e, s->uid)->prefilled += (uint64_t)q->n_tokens;
		if (j->t_first == 0)  /* appends never sample */
			j->prompt_tokens += q->n_tokens;
		if (q->logits)
			after_logits(e, j);
	}
	/* what a step of this much work costs, sampling included */
	fair_observe(&e->cost, work, attn, clock_mono_s() - t0);
}

/* ---- thread ----------------------------------------------------------- */

static void end_all(struct engine *e)
{
	while (e->jobs)
		fail_job(e, e->jobs, -ESHUTDOWN, "the daemon is stopping");
}

/* At most once a second: save sessions idle for save_delay seconds. */
static void save_idle(struct engine *e)
{
	double t = clock_mono_s();
	if (!e->res.dir || t - e->last_idle_scan < 1.0)
		return;
	e->last_idle_scan = t;
	res_save_idle(&e->res, clock_unix_ms() - (int64_t)e->cfg.save_delay * 1000);
}

static void save_at_shutdown(struct engine *e)
{
	if (!e->res.dir)
		return;
	struct res_saved sa = { 0 };
	res_save_all(&e->res, 0, 1, &sa);
	free(sa.first_error);
	log_msg(sa.errors ? LL_ERROR : LL_INFO, "saved %d session%s at shutdown%s", sa.n,
		sa.n == 1 ? "" : "s", sa.errors ? "; some could not be saved (see above)" : "");
}

/*
 * Settle the template new sessions get (e->default_tmpl: the template
 * setting, else the model file's, chat_resolve_template) and log which and
 * why (a model file whose template llamad does not know is a warning: the
 * log says which is used instead); at start and when a reload changes the
 * setting. Returns NULL, or the reason the model cannot use it (logged as
 * an error).
 */
static const char *say_template(struct engine *e)
{
	const char *why = e->default_tmpl_why;
	int tmpl = e->default_tmpl = chat_resolve_template(e->cfg.tmpl, e->m->chat_template,
							   e->m->chat_template_text != NULL,
							   e->default_tmpl_why,
							   sizeof(e->default_tmpl_why));
	const char *unusable = chat_template_unusable(e->m->tok, tmpl);
	int unknown = e->cfg.tmpl == CHAT_TEMPLATE_AUTO && e->m->chat_template_text &&
		      e->m->chat_template == CHAT_TEMPLATE_AUTO;
	if (unusable)
		log_msg(LL_ERROR, "chat template of new sessions: %s: %s", why, unusable);
	else
		log_msg(unknown ? LL_WARN : LL_INFO, "chat template of new sessions: %s", why);
	return unusable;
}

static void *engine_main(void *arg)
{
	struct engine *e = arg;
	for (;;) {
		pthread_mutex_lock(&e->mu);
		while (!e->cmd_head && e->n_jobs == 0 && !e->shutdown && !e->have_pending_cfg) {
			uint32_t keep = (uint32_t)e->cfg.prefix_cache_time;
			e->pool->now_s = (uint32_t)clock_mono_s();
			long expiry = kvpool_next_expiry(e->pool, keep);
			if (e->idle_ticks >= 2 && (!e->trimmed || expiry == 0)) {
				/* idle for two seconds: give back memory the last burst
				 * touched (free K/V blocks, the heap's free top), and the
				 * blocks of prefixes unused for prefix_cache_time */
				pthread_mutex_unlock(&e->mu);
				int old = kvpool_expire_cached(e->pool, keep);
				size_t kv = kvpool_release_free(e->pool);
				malloc_trim(0);
				log_msg(LL_DEBUG, "idle: released %zu bytes of free K/V blocks (%d of them "
					"held prefixes unused for %u s)", kv, old, (unsigned)keep);
				pthread_mutex_lock(&e->mu);
				e->trimmed = 1;
				continue;
			}
			if (!e->res.dir && e->trimmed && expiry < 0) {
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
				if (e->res.dir)
					break;
			}
		}
		if (e->cmd_head || e->n_jobs) {
			e->idle_ticks = 0;
			e->trimmed = 0;
		}
		e->pool->now_s = (uint32_t)clock_mono_s();  /* when blocks are freed */
		struct cmd *c = e->cmd_head;
		e->cmd_head = e->cmd_tail = NULL;
		int shut = e->shutdown;
		int new_tmpl = 0;
		if (e->have_pending_cfg) {
			/* taken whole: config_load(reload_only) kept the restart-only
			 * keys (and the strings, which the caller owns) as they were */
			new_tmpl = e->cfg.tmpl != e->pending_cfg.tmpl;
			e->cfg = e->pending_cfg;
			e->res.refuse_foreign = e->cfg.foreign_cache;
			e->res.disk_share = e->cfg.disk_share_per_uid;
			e->st.share = e->cfg.prefix_sharing;
			e->have_pending_cfg = 0;
		}
		pthread_mutex_unlock(&e->mu);
		if (new_tmpl)
			say_template(e);
		while (c) {
			struct cmd *n = c->next;
			c->next = NULL;
			if (shut && c->kind == CMD_REQUEST) {
				engine_error(e, c->conn, c->req->id, -ESHUTDOWN, "the daemon is stopping");
			} else if (c->kind == CMD_REQUEST) {
				if (handle_request(e, c))
					c = NULL;  /* waits for its session */
			} else {
				handle_disconnect(e, c->conn);
			}
			if (c && c->req)
				llamad__request__free_unpacked(c->req, NULL);
			free(c);
			c = n;
		}
		if (shut) {
			end_parked(e, -ESHUTDOWN, "the daemon is stopping");
			end_all(e);
			save_at_shutdown(e);
			pthread_mutex_lock(&e->mu);
			e->finished = 1;
			pthread_mutex_unlock(&e->mu);
			e->out_pending = 1;
			engine_notify(e);
			return NULL;
		}
		run_parked(e);
		if (e->n_jobs)
			step(e);
		run_parked(e);
		save_idle(e);
		engine_notify(e);
	}
}

_Static_assert((int)RES_ERROR == LL_ERROR && (int)RES_WARN == LL_WARN &&
	       (int)RES_INFO == LL_INFO && (int)RES_DEBUG == LL_DEBUG,
	       "residency's report levels are the daemon's log levels");

/* Reports of session/residency.c go to the log. */
static void report(void *ctx, int level, const char *msg)
{
	(void)ctx;
	log_msg(level, "%s", msg);
}

/* "1.5 GiB", "256 MiB", "640 KiB": n bytes for the log. */
static const char *log_bytes(char *buf, size_t cap, uint64_t n)
{
	static const char *const units[] = { "KiB", "MiB", "GiB", "TiB" };
	double v = (double)n / 1024;
	int u = 0;
	while (v >= 1024 && u < 3) {
		v /= 1024;
		u++;
	}
	snprintf(buf, cap, v == (double)(uint64_t)v || v >= 100 ? "%.0f %s" : "%.1f %s", v,
		 units[u]);
	return buf;
}

/*
 * The KV pool's size (*ks) for blocks of bb bytes: kv_memory on the CPU,
 * gpu_kv_share of the device memory left after the weights on a GPU, or,
 * when the setting is auto, session/kvsize.h's automatic size over that
 * memory (host: util/mem.h's available memory, or LLAMAD_TEST_MEM_AVAILABLE
 * bytes in tests). Logs what the pool holds, in tokens and in contexts of
 * the session limit, and warns when that is under one context. 0, or
 * -EINVAL with *cause when the pool would hold no block.
 */
static int size_pool(struct engine *e, uint64_t bb, struct kv_size *ks, char **cause)
{
	const struct config *cfg = &e->cfg;
	int ctx = engine_session_limit(e);
	char how[256], b1[32], b2[32], b3[32];
	const char *knob = "kv_memory";
	uint64_t mem = 0;        /* the memory an automatic size takes a share of */
	uint64_t asked = 0;      /* the bytes a setting asks for */
	int by_cgroup = 0;
	size_t dev_free, dev_total;
	if (!e->be->host_mem && backend_mem_info(e->be, &dev_free, &dev_total) == 0) {
		knob = "gpu_kv_share";
		log_msg(LL_INFO, "GPU memory: %s free of %s after the weights",
			log_bytes(b1, sizeof(b1), dev_free), log_bytes(b2, sizeof(b2), dev_total));
		if (cfg->gpu_kv_share > 0) {
			asked = (uint64_t)dev_free / 100 * (uint64_t)cfg->gpu_kv_share;
			kv_size_of(ks, asked, bb, KV_BLOCK_TOKENS, ctx);
			snprintf(how, sizeof(how), "gpu_kv_share %d%% of the %s free: %s",
				 cfg->gpu_kv_share, b1, log_bytes(b2, sizeof(b2), asked));
		} else {
			mem = dev_free;
			kv_size_auto(ks, bb, KV_BLOCK_TOKENS, ctx, mem);
			snprintf(how, sizeof(how), "gpu_kv_share auto: %d contexts, at least %s, at "
				 "most 1/%d of the %s free", KV_AUTO_CONTEXTS,
				 log_bytes(b2, sizeof(b2), KV_AUTO_MIN_BYTES), KV_AUTO_MEM_SHARE, b1);
		}
	} else if (cfg->kv_memory > 0) {
		asked = cfg->kv_memory;
		kv_size_of(ks, asked, bb, KV_BLOCK_TOKENS, ctx);
		snprintf(how, sizeof(how), "kv_memory %s", log_bytes(b1, sizeof(b1), asked));
	} else {
		const char *fake = getenv("LLAMAD_TEST_MEM_AVAILABLE");
		mem = fake && *fake ? strtoull(fake, NULL, 10) : mem_available(&by_cgroup);
		kv_size_auto(ks, bb, KV_BLOCK_TOKENS, ctx, mem);
		int n = snprintf(how, sizeof(how), "kv_memory auto: %d contexts, at least %s",
				 KV_AUTO_CONTEXTS, log_bytes(b1, sizeof(b1), KV_AUTO_MIN_BYTES));
		snprintf(how + n, sizeof(how) - (size_t)n, mem ? ", at most 1/%d of the %s available%s"
			 : " (the available memory is unknown)", KV_AUTO_MEM_SHARE,
			 log_bytes(b2, sizeof(b2), mem), by_cgroup ? " within the cgroup's limit" : "");
	}
	if (ks->blocks < 1) {
		cause_set(cause, "a KV cache of %s (%s) holds no block of %s (%d tokens); raise %s",
			  log_bytes(b3, sizeof(b3), asked), how, log_bytes(b1, sizeof(b1), bb),
			  KV_BLOCK_TOKENS, knob);
		return -EINVAL;
	}
	log_msg(LL_INFO, "KV cache: %s, %llu tokens (%llu blocks of %d), %.1f contexts of %d "
		"tokens (%s)", log_bytes(b3, sizeof(b3), ks->bytes), (unsigned long long)ks->tokens,
		(unsigned long long)ks->blocks, KV_BLOCK_TOKENS, ks->contexts, ctx, how);
	if (ks->tokens < (uint64_t)ctx) {
		uint64_t per_ctx = ((uint64_t)ctx + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS * bb;
		char note[64] = "";
		if (ks->by_memory)
			snprintf(note, sizeof(note), "; auto takes at most 1/%d of the memory",
				 KV_AUTO_MEM_SHARE);
		log_msg(LL_WARN, "KV cache: it holds %llu tokens, less than one context of %d: a "
			"session fails with \"the KV cache is full\" after about %llu tokens; %s %s "
			"(one context takes %s%s) or lower max_session_tokens",
			(unsigned long long)ks->tokens, ctx, (unsigned long long)ks->tokens,
			ks->by_memory ? "set" : "raise", knob, log_bytes(b1, sizeof(b1), per_ctx), note);
	}
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
	e->t_start = clock_mono_s();
	hist_init(&e->ttft, ttft_le, sizeof(ttft_le) / sizeof(ttft_le[0]));
	hist_init(&e->token_time, token_time_le, sizeof(token_time_le) / sizeof(token_time_le[0]));
	e->pass = forward_pass;
	test_hooks_install(e);
	pthread_mutex_init(&e->mu, NULL);
	pthread_cond_init(&e->cv, NULL);
	struct backend_opts bo = { .kind = (enum backend_kind)cfg->device, .n_threads = cfg->threads,
				   .wtype = (enum backend_wtype)cfg->gpu_weights };
	char *note = NULL;
	e->be = backend_open(&bo, cause, &note);
	if (!e->be) {
		if (!*cause)
			cause_set(cause, "out of memory creating the backend");
		engine_free(e);
		return NULL;
	}
	if (note)
		log_msg(LL_INFO, "device auto: using the CPU (%s)", note);
	free(note);
	log_msg(LL_INFO, "backend: %s", e->be->desc);
	const struct model_config *mc = &m->cfg;
	e->shape = fair_shape_of(mc->dim, mc->n_layers, mc->n_heads, mc->n_kv_heads, mc->head_dim,
				 mc->ffn_dim, mc->vocab);
	e->step_cap = cfg->step_tokens > 64 ? cfg->step_tokens : 64;
	if (e->step_cap < 4096)
		e->step_cap = 4096 < e->ctx ? 4096 : (e->ctx > 64 ? e->ctx : 64);
	if (e->step_cap < cfg->step_tokens)
		e->step_cap = cfg->step_tokens;
	/* weights and scratch first: on a GPU the KV pool takes a share of
	 * what they leave */
	double t_place = clock_mono_s();
	e->fwd = fwd_new(m, e->be, e->step_cap);
	if (e->fwd)   /* uploads, or the CPU's packing of quantized matrices */
		log_msg(LL_INFO, "weights placed in %.0f ms (%s)", (clock_mono_s() - t_place) * 1e3,
			e->be->desc);
	if (!e->fwd) {
		cause_set(cause, "%s placing the weights and %d-token scratch on the %s",
			  e->be->failed ? "device error" : "out of memory", e->step_cap,
			  e->be->ops->name);
		engine_free(e);
		return NULL;
	}
	/* the pool's shape and element type: every size below comes from its
	 * block's bytes, so that the KV element type counts */
	int hd = m->cfg.head_dim;
	const char *why;
	enum kt_dtype kvt = backend_kv_type(e->be, (enum kt_dtype)cfg->kv_type, hd, &why);
	if (why)
		log_msg(LL_WARN, "kv_type %s is not available %s: the KV cache is %s",
			kt_dtype_name((enum kt_dtype)cfg->kv_type), why, kt_dtype_name(kvt));
	struct kt_kv shape = { .block_size = KV_BLOCK_TOKENS, .n_layers = m->cfg.n_layers,
			       .kv_dim = model_kv_dim(&m->cfg), .dtype = kvt,
			       .group = kvt == KT_Q8_0 ? kt_kv_group_for(hd) : 0 };
	struct kv_size ks;
	if (size_pool(e, kt_kv_block_bytes(&shape), &ks, cause) != 0) {
		engine_free(e);
		return NULL;
	}
	e->pool = kvpool_new_typed(e->be, kvt, hd, (int)ks.blocks, shape.block_size,
				   shape.n_layers, shape.kv_dim);
	if (!e->pool || sess_table_init(&e->st, e->pool) != 0) {
		cause_set(cause, "out of memory allocating %llu bytes of KV cache",
			  (unsigned long long)ks.bytes);
		engine_free(e);
		return NULL;
	}
	snprintf(e->backend_name, sizeof(e->backend_name), "%s", e->be->desc);
	model_describe(m, e->model_desc, sizeof(e->model_desc));
	const char *unusable = say_template(e);
	if (unusable) {
		cause_set(cause, "chat template %s: %s", e->default_tmpl_why, unusable);
		engine_free(e);
		return NULL;
	}
	res_init(&e->res, &e->st, m->fingerprint, e->ctx, m->cfg.vocab, cfg->ram_cache, report, e);
	e->res.refuse_foreign = cfg->foreign_cache;
	e->res.disk_share = cfg->disk_share_per_uid;
	{
		/* block names: this model, this KV type and layout */
		uint64_t v[4] = { m->fingerprint, (uint64_t)e->pool->kv.dtype,
				  (uint64_t)e->pool->kv.group, (uint64_t)e->pool->kv.block_size };
		sess_set_sharing(&e->st, cfg->prefix_sharing, XXH64(v, sizeof(v), 0));
	}
	int rc = res_set_dir(&e->res, cfg->state_dir);
	if (rc == -EBUSY) {
		char *d = res_dir_of(cfg->state_dir);
		cause_set(cause, "state directory %s is in use by another llamad (pid %ld): give "
			  "each daemon its own --state-dir (or --state-dir none)", d ? d : "?",
			  e->res.lock_holder);
		free(d);
		engine_free(e);
		return NULL;
	}
	if (rc == 0 && e->res.dir)
		res_list(&e->res, cfg->max_sessions);
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

void engine_submit(struct engine *e, uint64_t conn, uid_t uid, int own_only, Llamad__Request *req)
{
	struct cmd *c = calloc(1, sizeof(*c));
	if (!c) {
		llamad__request__free_unpacked(req, NULL);
		return;
	}
	c->kind = CMD_REQUEST;
	c->conn = conn;
	c->uid = uid;
	c->own_only = own_only;
	c->req = req;
	c->t_arrive = clock_mono_s();
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

struct reply *engine_take_out(struct engine *e, int *finished)
{
	pthread_mutex_lock(&e->mu);
	*finished = e->finished;
	struct reply *o = e->out_head;
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

void engine_on_fatal(struct engine *e, void (*fn)(const char *status))
{
	e->on_fatal = fn;
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
	for (struct reply *o = e->out_head, *n; o; o = n) {
		n = o->next;
		free(o);
	}
	res_done(&e->res);
	sess_table_done(&e->st);
	fwd_free(e->fwd);
	kvpool_free(e->pool);
	backend_free(e->be);
	free(e->seqs);
	free(e->batch);
	free(e->fusers);
	free(e->ustats);
	pthread_mutex_destroy(&e->mu);
	pthread_cond_destroy(&e->cv);
	free(e);
}

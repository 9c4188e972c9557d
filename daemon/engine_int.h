/*
 * daemon/engine_int.h — the engine's insides, shared by engine.c (the
 * thread, its command queue and the batched step), jobs.c (the work in
 * flight: replies out, waiting requests, jobs) and handlers.c (what each
 * request does). Nothing else includes it.
 *
 * Everything below runs on the engine thread, except where a field says
 * "under mu".
 */
#ifndef LLAMAD_DAEMON_ENGINE_INT_H
#define LLAMAD_DAEMON_ENGINE_INT_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/engine.h"
#include "daemon/fair.h"
#include "daemon/reply.h"
#include "generate/generate.h"
#include "model/forward.h"
#include "session/residency.h"
#include "session/session.h"
#include "session/turns.h"
#include "util/hist.h"

enum cmd_kind { CMD_REQUEST, CMD_DISCONNECT };

/* A request or a connection close, queued by the event thread. */
struct cmd {
	struct cmd *next;
	int kind;
	uint64_t conn;
	uid_t uid;
	int own_only;            /* sees uid's sessions only, even as root (a
				  * connection acting for a caller) */
	Llamad__Request *req;
	double t_arrive;         /* clock_mono_s() when it was queued */
};

enum job_kind { JOB_APPEND, JOB_GENERATE };

/* What one uid's requests did since the start. */
struct uid_stats {
	uid_t uid;
	uint64_t requests, prefilled, generated;
};

/* A request that runs over several steps: an Append being prefilled or a
 * Generate. Its session is busy while it runs. */
struct job {
	struct job *next;
	int kind;
	uint64_t conn, req_id;
	struct session *s;
	int cancelled;           /* 1: Cancel, 2: client gone */
	int tokens_added;        /* append: the turn's tokens */
	int prompt_tokens;       /* tokens prefilled by this request (generate:
				  * before its first token) */
	int dropped_turns;       /* append: turns a shift dropped for it */
	int context_tokens;      /* generate: the history when it first sampled */
	int shared_tokens;       /* prompt tokens other sessions' blocks held */
	int answer_turn;         /* generate: assistant turn opened */
	int keep_turn;           /* generate: its first turn (the prompt's, else
				  * the answer's): a context shift keeps it */
	int gen_ok;              /* generate: gen set up */
	uint32_t shift_turns0;   /* generate: its session's shift counters when */
	uint64_t shift_tokens0;  /* it began (Done says what the request added) */
	struct gen gen;
	char *text;              /* text released this step, for the token event */
	size_t n_text, cap_text;
	double t0, t_first;
	double t_arrive;         /* generate: its request queued (Status.ttft) */
	double t_last_event;     /* generate: its last token event (0: none yet) */
	float *logits;
};

struct engine {
	struct model *m;
	struct backend *be;
	struct fwd *fwd;
	struct kvpool *pool;
	struct sess_table st;
	struct residency res;    /* where sessions live; saving, eviction */
	struct config cfg;       /* engine-thread copy */
	struct config pending_cfg;  /* under mu: from engine_reload */
	int have_pending_cfg;       /* under mu */
	char backend_name[96];
	char model_desc[512];
	int ctx;                 /* model context length */
	/* the template of new sessions that choose none (the template setting,
	 * else the model file's), and one line saying which and why: the
	 * start-up log's and Status's; settled at start and on reload */
	int default_tmpl;
	char default_tmpl_why[256];
	int step_cap;            /* scratch rows of fwd */
	void (*on_fatal)(const char *status);

	pthread_t thread;
	int started;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct cmd *cmd_head, *cmd_tail;   /* under mu */
	struct reply *out_head, *out_tail; /* under mu */
	int notify_fd;
	/* the step's forward pass over e->seqs[0..nb): forward_pass
	 * (engine.c), or test_hooks.c's wrapper of it */
	int (*pass)(struct engine *e, int nb);
	struct test_hooks {
		int (*inner)(struct engine *e, int nb);  /* the wrapped pass */
		uint64_t fail_after;  /* LLAMAD_TEST_FAIL_AFTER: fail at pass N */
		int step_delay_ms;    /* LLAMAD_TEST_STEP_DELAY_MS: sleep per pass */
	} hooks;
	int idle_ticks, trimmed; /* seconds idle; memory given back since */
	int shutdown;            /* under mu */
	int finished;            /* under mu */
	int conns_open;          /* under mu */
	uint64_t conns_accepted; /* under mu */

	struct job *jobs;
	int n_jobs;
	/* requests waiting for their session (busy with another request), in
	 * arrival order (jobs.c's list; handlers.c: which wait, run_parked) */
	struct cmd *parked_head, *parked_tail;
	unsigned rr;             /* round-robin start */
	/* fair shares of the steps among users (daemon/fair.h): the model's
	 * work per row, step times by work, the credit of the users with work,
	 * whose turn is first */
	struct fair_shape shape;
	struct fair_cost cost;
	struct fair_user *fusers;
	int n_fusers, cap_fusers;
	unsigned rr_user;
	struct fwd_seq *seqs;
	struct job **batch;
	int batch_cap;
	int out_pending;

	double t_start;
	double last_idle_scan;
	uint64_t n_requests, n_prefilled, n_generated, n_forward;
	/* the same by uid (Status shows a user other than root and the
	 * daemon's own its own figures) */
	struct uid_stats *ustats;
	int n_ustats, cap_ustats;
	/* since start-up: time to a Generate's first token event, and
	 * between its token events (Status.ttft, token_time) */
	struct hist ttft, token_time;
};

/* ---- jobs.c: the work in flight ---- */
/* Queue r (NULL: it could not be made, which is logged) for the event
 * thread. */
void engine_send(struct engine *e, struct reply *r);
/* Wake the event thread if replies were queued since the last call. */
void engine_notify(struct engine *e);
void engine_reply(struct engine *e, uint64_t conn, const Llamad__Response *r);
/* An Error reply for -errno err (reply_code) with a printf message. */
void engine_error(struct engine *e, uint64_t conn, uint64_t id, int err, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));
/* uid's figures (an entry made when missing; a scratch entry when out of
 * memory, so that counting never fails). */
struct uid_stats *engine_uid_stats(struct engine *e, uid_t uid);
/* Tokens one session may hold (the model's context, or max_session_tokens). */
int engine_session_limit(const struct engine *e);
/* The turn rules' view of the engine. */
/* The test hooks the environment asks for (test_hooks.c): with
 * LLAMAD_TEST_STEP_DELAY_MS or LLAMAD_TEST_FAIL_AFTER set, e->pass is
 * wrapped in a slow or failing one; else it stays as it is. */
void test_hooks_install(struct engine *e);

struct turn_env engine_turns(struct engine *e);
/* What a SessionInfo of s says besides the session: the engine's word. */
struct info_env engine_info_env(struct engine *e, const struct session *s);
/* A new job of kind for request id of conn on s (not yet running); NULL on
 * ENOMEM. */
struct job *job_new(int kind, uint64_t conn, uint64_t id, struct session *s);
/* Start j: it joins the next step and its session is busy. */
void job_add(struct engine *e, struct job *j);
/* j ends: it leaves the list and is freed; its session is idle again (and
 * goes, if ephemeral and its connection has gone). */
void job_remove(struct engine *e, struct job *j);
void job_free(struct job *j);
/* Collects a generate job's text for its next token event (stop_emit_fn). */
void job_emit_text(void *ctx, const char *text, size_t len);
/* The waiting requests (handlers.c decides which wait and when they run):
 * c joins the end of the list; c (after prev, or first) leaves it; the
 * requests of connection conn are forgotten. */
void park_push(struct engine *e, struct cmd *c);
void park_remove(struct engine *e, struct cmd *prev, struct cmd *c);
void park_drop_conn(struct engine *e, uint64_t conn);
/* The waiting requests end: each gets `err` (a -errno: SHUTTING_DOWN at
 * shutdown) as its reply. */
void end_parked(struct engine *e, int err, const char *msg);
/* Free a command and its request. */
void cmd_free(struct cmd *c);

/* ---- handlers.c ---- */
/* Apply one request, c (CMD_REQUEST): the table of operations and their
 * preconditions. A request that needs its session idle while the session
 * runs another one (or has requests waiting before it) waits, in arrival
 * order, up to PARK_MAX per session: then handle_request keeps c and
 * returns 1; else it returns 0 and the caller frees c. */
#define PARK_MAX 64
int handle_request(struct engine *e, struct cmd *c);
/* Run the waiting requests whose sessions are idle now, in order (between
 * steps). */
void run_parked(struct engine *e);
/* Connection conn closed: its jobs are cancelled, its waiting requests
 * forgotten, its idle ephemeral sessions dropped (busy ones when their
 * job ends). */
void handle_disconnect(struct engine *e, uint64_t conn);
#endif

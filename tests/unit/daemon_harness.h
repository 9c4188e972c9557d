/*
 * tests/unit/daemon_harness.h — the real llamad as the daemon tests
 * (test_daemon.c, test_persist.c) run it: start the binary on a private
 * socket with its stdout and stderr in a log file, wait until the socket
 * accepts, connect, stop it (SIGTERM, with a deadline) and read its log for
 * sanitizer reports; then the request helpers both files use on top of
 * daemon_client.h (open, append, info, drop, fork, cancel, generate, the
 * expected-reply checks).
 *
 * Include after <cmocka.h>, tests/unit/testutil.h and proto/frame.h, with
 * WAIT_MS (the longest wait for one reply) and RECV_MAX (largest frame)
 * defined; this header includes daemon_client.h.
 */
#ifndef LLAMAD_TESTS_DAEMON_HARNESS_H
#define LLAMAD_TESTS_DAEMON_HARNESS_H

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/unit/daemon_client.h"

enum { T_LLAMA2 = LLAMAD__TEMPLATE__TEMPLATE_LLAMA2, T_RAW = LLAMAD__TEMPLATE__TEMPLATE_RAW };

/* The prompt of the golden texts (stories260K). */
static const char *const PROMPT = "Once upon a time";

static inline double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static inline void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

/* ---- the daemon process ------------------------------------------------- */

/* One llamad: its pid (0: not running), a tag for messages, its socket and
 * its log file. */
struct daemon {
	pid_t pid;
	char tag[32];
	char sock[160];
	char log[160];
};

/* Print the last 3000 bytes of d's log to stderr. */
static inline void daemon_dump_log_tail(const struct daemon *d)
{
	FILE *f = fopen(d->log, "r");
	if (!f)
		return;
	char buf[4096];
	fseek(f, 0, SEEK_END);
	long sz = ftell(f);
	fseek(f, sz > 3000 ? sz - 3000 : 0, SEEK_SET);
	size_t k = fread(buf, 1, sizeof(buf) - 1, f);
	buf[k] = 0;
	fclose(f);
	fprintf(stderr, "---- %s (tail) ----\n%s---- end ----\n", d->log, buf);
}

/* Sanitizer reports in d's log: 1 if any (each printed), else 0. */
static inline int daemon_log_has_sanitizer_report(const struct daemon *d)
{
	FILE *f = fopen(d->log, "r");
	if (!f)
		return 0;
	char *line = NULL;
	size_t cap = 0;
	int bad = 0;
	while (getline(&line, &cap, f) > 0) {
		if (strstr(line, "ERROR: AddressSanitizer") || strstr(line, "runtime error:") ||
		    strstr(line, "ERROR: LeakSanitizer") ||
		    strstr(line, "WARNING: ThreadSanitizer")) {
			fprintf(stderr, "%s: %s", d->log, line);
			bad = 1;
		}
	}
	free(line);
	fclose(f);
	return bad;
}

/*
 * Fork and exec the llamad binary at path `llamad` as d (d->sock and d->log
 * set by the caller): --model model --tokenizer tok --threads threads
 * --log-level debug --state-dir state_dir --socket d->sock, then the options
 * in extra (NULL ended; extra may be NULL). Its stdout and stderr go to
 * d->log; it gets no systemd environment (notify socket, socket activation,
 * watchdog, STATE_DIRECTORY). Sets d->pid; 0, or -errno if fork fails.
 */
static inline int daemon_spawn(struct daemon *d, const char *llamad, const char *model,
			       const char *tok, const char *threads, const char *state_dir,
			       const char *const *extra)
{
	const char *argv[64];
	int n = 0;
	const char *fixed[] = { "llamad", "--model", model, "--tokenizer", tok,
				"--threads", threads, "--log-level", "debug",
				"--state-dir", state_dir, "--socket", d->sock };
	for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
		argv[n++] = fixed[i];
	for (int i = 0; extra && extra[i] && n < 63; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;
	pid_t pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
			close(fd);
		}
		unsetenv("NOTIFY_SOCKET");
		unsetenv("LISTEN_FDS");
		unsetenv("LISTEN_PID");
		unsetenv("WATCHDOG_USEC");
		unsetenv("STATE_DIRECTORY");
		execv(llamad, (char *const *)argv);
		_exit(127);
	}
	d->pid = pid;
	return 0;
}

/* Wait up to timeout_ms for d's socket to accept a connection: 0 once it
 * does; -ECHILD if the daemon exited first (*status gets its wait status,
 * d->pid becomes 0); -ETIMEDOUT (it keeps running). */
static inline int daemon_wait_listening(struct daemon *d, int timeout_ms, int *status)
{
	double t0 = now_ms();
	for (;;) {
		int fd = frame_dial(d->sock);
		if (fd >= 0) {
			close(fd);
			return 0;
		}
		if (waitpid(d->pid, status, WNOHANG) == d->pid) {
			d->pid = 0;
			return -ECHILD;
		}
		if (now_ms() - t0 > timeout_ms)
			return -ETIMEDOUT;
		sleep_ms(5);
	}
}

/* SIGTERM d, then wait up to timeout_ms for it to exit (SIGKILL after).
 * Returns its wait status, or -1 if it had to be killed or could not be
 * waited for; d->pid becomes 0. A d not running gives 0. */
static inline int daemon_stop(struct daemon *d, int timeout_ms)
{
	if (d->pid <= 0)
		return 0;
	kill(d->pid, SIGTERM);
	int status = 0;
	double t0 = now_ms();
	for (;;) {
		pid_t w = waitpid(d->pid, &status, WNOHANG);
		if (w == d->pid)
			break;
		if (w < 0 && errno != EINTR) {
			status = -1;
			break;
		}
		if (now_ms() - t0 > timeout_ms) {
			kill(d->pid, SIGKILL);
			waitpid(d->pid, NULL, 0);
			status = -1;
			break;
		}
		sleep_ms(2);
	}
	d->pid = 0;
	return status;
}

/* 1 if a stop status is a clean exit 0. */
static inline int daemon_exited_ok(int status)
{
	return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* ---- connections ----------------------------------------------------------- */

/* A new connection to d (fails the case if it cannot connect); free with
 * cli_free. */
static inline struct cli *cli_new(const struct daemon *d)
{
	struct cli *c = calloc(1, sizeof(*c));
	assert_non_null(c);
	c->fd = frame_dial(d->sock);
	if (c->fd < 0)
		fail_msg("cannot connect to %s: %s", d->sock, strerror(-c->fd));
	c->next_id = 1000;
	return c;
}

/* Close c and free the replies it kept; NULL is fine. */
static inline void cli_free(struct cli *c)
{
	if (!c)
		return;
	if (c->fd >= 0)
		close(c->fd);
	for (struct stash *s = c->kept, *n; s; s = n) {
		n = s->next;
		llamad__response__free_unpacked(s->r, NULL);
		free(s);
	}
	free(c);
}

/* ---- expected replies ---------------------------------------------------------- */

/* Fail (naming line) unless r is the error `code` with a non-empty one-line
 * message that contains `text` (NULL: any) and, when no_path, no '/' (never
 * a path on the wire); free r. */
static inline void expect_error_at(Llamad__Response *r, int code, const char *text, int no_path,
				   int line)
{
	if (r->body_case != LLAMAD__RESPONSE__BODY_ERROR || (int)r->error->code != code)
		fail_msg("line %d: expected error %d (%s), got %s", line, code,
			 frame_error_name(code), body_name(r));
	assert_non_null(r->error->message);
	assert_true(strlen(r->error->message) > 0);
	assert_null(strchr(r->error->message, '\n'));
	if (no_path && strchr(r->error->message, '/'))
		fail_msg("line %d: error message \"%s\" holds a path", line, r->error->message);
	if (text && !strstr(r->error->message, text))
		fail_msg("line %d: error message \"%s\" does not mention \"%s\"", line,
			 r->error->message, text);
	rfree(r);
}

/* r, after failing (naming line) unless its body is bc. */
#define expect_body(r, bc) expect_body_at((r), (bc), __LINE__)
static inline Llamad__Response *expect_body_at(Llamad__Response *r, int bc, int line)
{
	if (r->body_case != (Llamad__Response__BodyCase)bc)
		fail_msg("line %d: expected body %d, got %s", line, bc, body_name(r));
	return r;
}

/* ---- requests --------------------------------------------------------------------- */

/* What an OpenSession asks (tmpl/policy 0: the daemon's default; system
 * NULL: none). */
static inline Llamad__Response *op_open(struct cli *c, const char *name, int tmpl, int policy,
					const char *system, int ephemeral)
{
	Llamad__OpenSession o = LLAMAD__OPEN_SESSION__INIT;
	o.session = (char *)name;
	o.has_template_ = tmpl != 0;
	o.template_ = tmpl;
	o.has_context_policy = policy != 0;
	o.context_policy = policy;
	o.system = (char *)system;
	o.has_ephemeral = ephemeral != 0;
	o.ephemeral = ephemeral != 0;
	Llamad__Request q = request_of(LLAMAD__REQUEST__OP_OPEN);
	q.open = &o;
	return cli_call(c, &q);
}

/* Open a session that must be new (and, without a system prompt, empty). */
static inline void must_open(struct cli *c, const char *name, int tmpl, int policy,
			     const char *system, int ephemeral)
{
	Llamad__Response *r = expect_body(op_open(c, name, tmpl, policy, system, ephemeral),
					  LLAMAD__RESPONSE__BODY_SESSION);
	assert_string_equal(r->session->session, name);
	assert_true(r->session->has_created && r->session->created);
	if (!system)
		assert_int_equal(r->session->tokens, 0);
	rfree(r);
}

static inline Llamad__Response *op_append(struct cli *c, const char *name, int role,
					  const char *text)
{
	Llamad__Append a = LLAMAD__APPEND__INIT;
	a.session = (char *)name;
	a.has_role = role >= 0;
	a.role = role;
	a.text = (char *)text;
	Llamad__Request q = request_of(LLAMAD__REQUEST__OP_APPEND);
	q.append = &a;
	return cli_call(c, &q);
}

/* The requests that name only a session. */
#define SESSION_OP(fn, OPCASE, field, Type, INIT)                           \
	static inline Llamad__Response *fn(struct cli *c, const char *name) \
	{                                                                   \
		Type m = INIT;                                              \
		m.session = (char *)name;                                   \
		Llamad__Request q = request_of(OPCASE);                     \
		q.field = &m;                                               \
		return cli_call(c, &q);                                     \
	}
SESSION_OP(op_info, LLAMAD__REQUEST__OP_INFO, info, Llamad__GetInfo, LLAMAD__GET_INFO__INIT)
SESSION_OP(op_drop, LLAMAD__REQUEST__OP_DROP, drop, Llamad__Drop, LLAMAD__DROP__INIT)
SESSION_OP(op_rewind, LLAMAD__REQUEST__OP_REWIND, rewind, Llamad__Rewind, LLAMAD__REWIND__INIT)
#undef SESSION_OP

/* GetTranscript of name: turns from `from` (< 0: unset), the last `last`
 * (0: all), with token ids when ids. */
static inline Llamad__Response *op_transcript(struct cli *c, const char *name, int64_t from,
					      uint32_t last, int ids)
{
	Llamad__GetTranscript g = LLAMAD__GET_TRANSCRIPT__INIT;
	g.session = (char *)name;
	g.has_from_turn = from >= 0;
	g.from_turn = from >= 0 ? (uint32_t)from : 0;
	g.has_last_turns = last > 0;
	g.last_turns = last;
	g.has_token_ids = ids != 0;
	g.token_ids = ids != 0;
	Llamad__Request q = request_of(LLAMAD__REQUEST__OP_TRANSCRIPT);
	q.transcript = &g;
	return cli_call(c, &q);
}

static inline Llamad__Response *op_fork(struct cli *c, const char *src, const char *dst)
{
	Llamad__Fork f = LLAMAD__FORK__INIT;
	f.session = (char *)src;
	f.target = (char *)dst;
	Llamad__Request q = request_of(LLAMAD__REQUEST__OP_FORK);
	q.fork = &f;
	return cli_call(c, &q);
}

/* Send a Cancel of the request `target`; returns the Cancel's id. */
static inline uint64_t cancel_send(struct cli *c, uint64_t target)
{
	Llamad__Cancel cn = LLAMAD__CANCEL__INIT;
	cn.has_request_id = 1;
	cn.request_id = target;
	Llamad__Request q = request_of(LLAMAD__REQUEST__OP_CANCEL);
	q.cancel = &cn;
	return cli_send(c, &q);
}

/* Send a Cancel of everything in session `name` (and, when target is not
 * 0, also naming request target: a bad request); returns its id. */
static inline uint64_t cancel_session_send(struct cli *c, const char *name, uint64_t target)
{
	Llamad__Cancel cn = LLAMAD__CANCEL__INIT;
	cn.session = (char *)name;
	if (target) {
		cn.has_request_id = 1;
		cn.request_id = target;
	}
	Llamad__Request q = request_of(LLAMAD__REQUEST__OP_CANCEL);
	q.cancel = &cn;
	return cli_send(c, &q);
}

/* The daemon's Status (the response is the caller's to free). */
static inline Llamad__Response *op_status(struct cli *c)
{
	Llamad__GetStatus g = LLAMAD__GET_STATUS__INIT;
	Llamad__Request q = request_of(LLAMAD__REQUEST__OP_STATUS);
	q.status = &g;
	return expect_body(cli_call(c, &q), LLAMAD__RESPONSE__BODY_STATUS);
}

static inline void must_drop(struct cli *c, const char *name)
{
	rfree(expect_body(op_drop(c, name), LLAMAD__RESPONSE__BODY_OK));
}

/* SessionInfo of name (the response stays owned by the caller: free it). */
static inline Llamad__Response *must_info(struct cli *c, const char *name)
{
	Llamad__Response *r = expect_body(op_info(c, name), LLAMAD__RESPONSE__BODY_SESSION);
	assert_string_equal(r->session->session, name);
	return r;
}

/* ---- generations ------------------------------------------------------------------- */

/* Collect the replies of the generation `id` into g until its terminal one. */
static inline void gen_wait(struct cli *c, uint64_t id, struct gen *g)
{
	while (!gen_take(g, cli_next(c, id)))
		;
}

static inline void generate(struct cli *c, const char *name, struct genopt o, struct gen *g)
{
	memset(g, 0, sizeof(*g));
	gen_wait(c, gen_send(c, name, o), g);
}

/* A generation that must end with Done after max_tokens tokens (or with
 * EOS, for a chat answer, when allow_eos). */
#define generate_ok(c, name, o, g, allow_eos) \
	generate_ok_at((c), (name), (o), (g), (allow_eos), __LINE__)
static inline void generate_ok_at(struct cli *c, const char *name, struct genopt o,
				  struct gen *g, int allow_eos, int line)
{
	generate(c, name, o, g);
	if (g->error)
		fail_msg("line %d: generate on %s: error %d: %s", line, name, g->error, g->msg);
	if (allow_eos && g->reason == LLAMAD__STOP_REASON__STOP_EOS)
		return;
	if (g->reason != LLAMAD__STOP_REASON__STOP_MAX_TOKENS || g->n != o.max_tokens ||
	    g->generated != o.max_tokens)
		fail_msg("line %d: generate on %s: reason %d after %zu tokens (%u counted), "
			 "wanted %u", line, name, g->reason, g->n, g->generated, o.max_tokens);
}

/* Fail (naming line) unless a and b are the same text and tokens. */
#define assert_same_gen(a, b) assert_same_gen_at((a), (b), __LINE__)
static inline void assert_same_gen_at(const struct gen *a, const struct gen *b, int line)
{
	if (strcmp(a->text, b->text) || a->n != b->n ||
	    memcmp(a->toks, b->toks, a->n * sizeof(uint32_t)))
		fail_msg("line %d: generations differ:\n  \"%s\" (%zu tokens)\n  \"%s\" (%zu tokens)",
			 line, a->text, a->n, b->text, b->n);
}

#endif

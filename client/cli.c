/*
 * client/cli.c — see cli.h.
 */
#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "client/cli.h"
#include "client/pbjson.h"
#include "util/file.h"
#include "util/grow.h"

void gen_opts_init(struct gen_opts *g)
{
	memset(g, 0, sizeof(*g));
	Llamad__SamplerOptions init = LLAMAD__SAMPLER_OPTIONS__INIT;
	g->sampler = init;
}

/* --json was given: errors also go to stdout as JSON objects. */
static bool json_errors;

/* The error object of cli_error, on stdout. */
static void json_error(const char *kind, int code, const char *msg)
{
	struct json j;
	json_init(&j, stdout);
	json_obj_begin(&j);
	json_key(&j, "event");
	json_str(&j, "error");
	json_key(&j, "error");
	json_str(&j, kind);
	json_key(&j, "code");
	json_u64(&j, (uint64_t)(code > 0 ? code : 0));
	json_key(&j, "message");
	json_str(&j, msg);
	json_obj_end(&j);
	json_end(&j);
	fflush(stdout);
}

/* An error: "PROG: MSG" on stderr (then HINT's line, if any), and the
 * JSON error object on stdout under --json. */
static void verror(const char *prog, const char *hint, const char *kind, int code,
		   const char *fmt, va_list ap)
{
	char msg[1024];
	vsnprintf(msg, sizeof(msg), fmt, ap);
	fprintf(stderr, "%s: %s\n%s", prog, msg, hint ? hint : "");
	if (json_errors)
		json_error(kind, code, msg);
}

void cli_error(const char *kind, int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	verror("llamactl", NULL, kind, code, fmt, ap);
	va_end(ap);
}

const char *cli_prog(const struct cli *cli)
{
	static char buf[64];
	if (!cli || !cli->cmd)
		return "llamactl";
	snprintf(buf, sizeof(buf), "llamactl %s", cli->cmd->name);
	return buf;
}

noreturn void cli_usage_error(const struct cli *cli, const char *fmt, ...)
{
	char prog[64], hint[96];
	snprintf(prog, sizeof(prog), "%s", cli_prog(cli));
	snprintf(hint, sizeof(hint), "Try '%s --help'.\n", prog);
	va_list ap;
	va_start(ap, fmt);
	verror(prog, hint, "usage", 0, fmt, ap);
	va_end(ap);
	exit(EXIT_USAGE);
}

uint64_t cli_parse_u64(const struct cli *cli, const char *what, const char *arg,
		       uint64_t min, uint64_t max)
{
	char *end;
	errno = 0;
	if (!arg || !*arg || *arg == '-' || *arg == '+')
		cli_usage_error(cli, "%s: '%s' is not a number", what, arg ? arg : "");
	unsigned long long v = strtoull(arg, &end, 10);
	if (errno || *end)
		cli_usage_error(cli, "%s: '%s' is not a number", what, arg);
	if (v < min || v > max)
		cli_usage_error(cli, "%s: %s is out of range [%llu, %llu]", what, arg,
				(unsigned long long)min, (unsigned long long)max);
	return v;
}

static int64_t parse_i32(const struct cli *cli, const char *what, const char *arg,
			 long min, long max)
{
	char *end;
	errno = 0;
	long v = strtol(arg, &end, 10);
	if (errno || end == arg || *end)
		cli_usage_error(cli, "%s: '%s' is not a number", what, arg);
	if (v < min || v > max)
		cli_usage_error(cli, "%s: %s is out of range [%ld, %ld]", what, arg, min, max);
	return v;
}

static float parse_float(const struct cli *cli, const char *what, const char *arg,
			 double min, double max)
{
	char *end;
	errno = 0;
	double v = strtod(arg, &end);
	if (errno || end == arg || *end || !isfinite(v))
		cli_usage_error(cli, "%s: '%s' is not a number", what, arg);
	if (v < min || v > max)
		cli_usage_error(cli, "%s: %s is out of range [%g, %g]", what, arg, min, max);
	return (float)v;
}

/* Returns true if o was a sampler option (and applies it). */
static bool sampler_opt(struct cli *cli, struct gen_opts *g, int o, const char *arg)
{
	Llamad__SamplerOptions *s = &g->sampler;
	switch (o) {
	case OPT_TEMP:
		s->has_temperature = 1;
		s->temperature = parse_float(cli, "--temperature", arg, 0, 100);
		return true;
	case OPT_TOPK:
		s->has_top_k = 1;
		s->top_k = (int32_t)parse_i32(cli, "--top-k", arg, 0, 1 << 30);
		return true;
	case OPT_TOPP:
		s->has_top_p = 1;
		s->top_p = parse_float(cli, "--top-p", arg, 1e-6, 1);
		return true;
	case OPT_MINP:
		s->has_min_p = 1;
		s->min_p = parse_float(cli, "--min-p", arg, 0, 0.999);
		return true;
	case OPT_REPEAT:
		s->has_repeat_penalty = 1;
		s->repeat_penalty = parse_float(cli, "--repeat-penalty", arg, 1e-3, 10);
		return true;
	case OPT_LASTN:
		s->has_repeat_last_n = 1;
		s->repeat_last_n = (int32_t)parse_i32(cli, "--repeat-last-n", arg, -1, 1 << 30);
		return true;
	case OPT_PRESENCE:
		s->has_presence_penalty = 1;
		s->presence_penalty = parse_float(cli, "--presence-penalty", arg, -10, 10);
		return true;
	case OPT_FREQ:
		s->has_frequency_penalty = 1;
		s->frequency_penalty = parse_float(cli, "--frequency-penalty", arg, -10, 10);
		return true;
	case OPT_SEED:
		s->has_seed = 1;
		s->seed = cli_parse_u64(cli, "--seed", arg, 0, UINT64_MAX);
		return true;
	case OPT_MAXTOK:
		g->has_max_tokens = true;
		g->max_tokens = (uint32_t)cli_parse_u64(cli, "--max-tokens", arg, 1, 1u << 20);
		return true;
	case OPT_STOP:
		if (!*arg)
			cli_usage_error(cli, "--stop: empty stop string");
		if (g->n_stop >= LLAMAD_MAX_STOPS)
			cli_usage_error(cli, "--stop: at most %d stop strings", LLAMAD_MAX_STOPS);
		g->stop[g->n_stop++] = (char *)arg;
		return true;
	}
	return false;
}

void cli_opt(struct cli *cli, struct gen_opts *g, int o, const char *arg)
{
	switch (o) {
	case 'h':
		cli_print_help(cli, stdout);
		cli_flush_stdout();
		exit(EXIT_OK);
	case 'v':
		cli->verbose = true;
		return;
	case OPT_JSON:
		cli->json = json_errors = true;
		return;
	case OPT_SOCKET:
		if (!*arg)
			cli_usage_error(cli, "--socket: empty path");
		cli->socket = arg;   /* this path alone: no default candidates */
		for (; cli->n_candidates > 0; cli->n_candidates--)
			free(cli->candidates[cli->n_candidates - 1]);
		return;
	}
	if (g && sampler_opt(cli, g, o, arg))
		return;
	if (o == 'n' && g) {   /* -n is --max-tokens */
		sampler_opt(cli, g, OPT_MAXTOK, arg);
		return;
	}
	/* '?', ':' or an option this command does not take: getopt has
	 * already said what was wrong. */
	fprintf(stderr, "Try '%s --help'.\n", cli_prog(cli));
	if (json_errors)
		json_error("usage", 0, "bad option (see --help)");
	exit(EXIT_USAGE);
}

/* The Hello on a fresh connection: 0 or -errno; a refusal exits. */
static int say_hello(struct cli *cli)
{
	Llamad__Response *r = NULL;
	int rc = conn_hello(&cli->conn, &r);
	if (rc)
		return rc;
	cli_expect(r, LLAMAD__RESPONSE__BODY_HELLO);
	llamad__response__free_unpacked(r, NULL);
	return 0;
}

int cli_try_connect(struct cli *cli)
{
	conn_close(&cli->conn);
	int rc = conn_connect(&cli->conn, cli->socket);
	if (!rc && (rc = say_hello(cli)) != 0)
		conn_close(&cli->conn);
	return rc;
}

/* What to do about a failed connect (err < 0) to path, into buf (cap). */
static const char *connect_hint(const char *path, int err, char *buf, size_t cap)
{
	struct stat st;
	if (err == -ENOENT || err == -ECONNREFUSED)
		return " (is llamad running? `systemctl status llamad.socket`, or --socket PATH)";
	if (err == -EACCES && stat(path, &st) == 0) {
		struct group *g = getgrgid(st.st_gid);
		struct passwd *u = getpwuid(st.st_uid);
		const char *gname = g ? g->gr_name : "?";
		if (snprintf(buf, cap, " (the socket is %04o %s:%s: the daemon's users are the "
			     "members of group %s; `sudo usermod -aG %s %s`, then log in again)",
			     (unsigned)(st.st_mode & 07777), u ? u->pw_name : "?", gname, gname,
			     gname, getenv("USER") ? getenv("USER") : "$USER") < 0)
			return "";
		return buf;
	}
	return "";
}

/* Connect to cli->socket or the first candidate with a daemon (cli_connect);
 * cli->socket becomes the path reached, else the last tried. 0, or the
 * last -errno with every path tried and its error in tried ("A: why, nor
 * B: why"). */
static int dial(struct cli *cli, char *tried, size_t cap)
{
	int n = cli->n_candidates > 0 ? cli->n_candidates : 1;
	int rc = -ENOENT;
	size_t used = 0;
	tried[0] = '\0';
	for (int i = 0; i < n; i++) {
		if (cli->n_candidates > 0)
			cli->socket = cli->candidates[i];
		rc = conn_connect(&cli->conn, cli->socket);
		if (rc == 0)
			return 0;
		int k = snprintf(tried + used, cap - used, "%s%s: %s", i ? ", nor to " : "",
				 cli->socket, strerror(-rc));
		if (k > 0)
			used += (size_t)k < cap - used ? (size_t)k : cap - used - 1;
		if (rc != -ENOENT && rc != -ECONNREFUSED)
			break;
	}
	return rc;
}

void cli_connect(struct cli *cli)
{
	char tried[1200];
	int rc = dial(cli, tried, sizeof(tried));
	if (rc) {
		char hint[512];
		cli_error("connect", 0, "cannot connect to %s%s", tried,
			  connect_hint(cli->socket, rc, hint, sizeof(hint)));
		exit(EXIT_CONNECT);
	}
	rc = say_hello(cli);
	if (rc)
		cli_die_conn(cli, rc);
}

noreturn void cli_die_conn(const struct cli *cli, int err)
{
	if (err == -EMSGSIZE)
		cli_error("too large", 0, "request of %zu bytes too large for the daemon (it "
			  "accepts frames of at most %u bytes: max_frame)", cli->conn.refused_bytes,
			  cli->conn.max_frame);
	else
		cli_error("connection", 0, "connection to %s lost: %s", cli->socket,
			  conn_strerror(err));
	exit(EXIT_DAEMON);
}

void cli_print_error(const Llamad__Response *r)
{
	const Llamad__Error *e = r->error;
	int code = e && e->has_code ? (int)e->code : 0;
	const char *msg = e && e->message && *e->message ? e->message : "(no message)";
	fprintf(stderr, "llamactl: %s: %s\n", frame_error_name(code), msg);
	if (json_errors)
		json_error(frame_error_name(code), code, msg);
}

Llamad__Response *cli_expect(Llamad__Response *r, Llamad__Response__BodyCase want)
{
	if (r->body_case == LLAMAD__RESPONSE__BODY_ERROR) {
		cli_print_error(r);
		llamad__response__free_unpacked(r, NULL);   /* clean for LeakSanitizer */
		exit(EXIT_DAEMON);
	}
	if (r->body_case != want) {
		cli_error("reply", 0, "unexpected reply from the daemon (body %d, expected %d)",
			  (int)r->body_case, (int)want);
		llamad__response__free_unpacked(r, NULL);
		exit(EXIT_DAEMON);
	}
	return r;
}

Llamad__Response *cli_call_any(struct cli *cli, Llamad__Request *req)
{
	Llamad__Response *r;
	int rc = conn_call(&cli->conn, req, &r);
	if (rc)
		cli_die_conn(cli, rc);
	return r;
}

Llamad__Response *cli_call(struct cli *cli, Llamad__Request *req,
			   Llamad__Response__BodyCase want)
{
	return cli_expect(cli_call_any(cli, req), want);
}

noreturn void cli_write_failed(int err)
{
	if (err == EPIPE)
		exit(EXIT_OK);  /* the reader has what it wanted (| head) */
	fprintf(stderr, "llamactl: write error on stdout: %s\n", strerror(err));
	exit(EXIT_DAEMON);
}

void cli_flush_stdout(void)
{
	if (fflush(stdout) != 0 || ferror(stdout))
		cli_write_failed(errno ? errno : EIO);
}

noreturn void cli_die_local(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	verror("llamactl", NULL, "local", 0, fmt, ap);
	va_end(ap);
	exit(EXIT_DAEMON);
}

char *cli_read_all(int fd, size_t *len)
{
	char *buf = NULL;
	int rc = file_read_fd(fd, (size_t)1 << 40, &buf, len);
	if (rc == -ENOMEM)
		cli_die_local("out of memory reading stdin");
	if (rc < 0)
		cli_die_local("cannot read stdin: %s", strerror(-rc));
	return buf;
}

void cli_ephemeral_name(char *buf, size_t n)
{
	uint64_t r = 0;
	if (getrandom(&r, sizeof(r), GRND_NONBLOCK) != (ssize_t)sizeof(r)) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		r = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)ts.tv_sec;
	}
	snprintf(buf, n, "llamactl-%ld-%016llx", (long)getpid(), (unsigned long long)r);
}

Llamad__Response *cli_open_session(struct cli *cli, const char *session,
				   const struct open_opts *op, bool errors_ok)
{
	Llamad__OpenSession o = LLAMAD__OPEN_SESSION__INIT;
	o.session = (char *)session;
	o.system = (char *)op->system;
	if (op->tmpl != LLAMAD__TEMPLATE__TEMPLATE_DEFAULT) {
		PB_SET(&o, template_, op->tmpl);
	}
	if (op->policy != LLAMAD__CONTEXT_POLICY__CONTEXT_DEFAULT) {
		PB_SET(&o, context_policy, op->policy);
	}
	if (op->ephemeral) {
		PB_SET(&o, ephemeral, 1);
	}
	if (op->create_only) {
		PB_SET(&o, create_only, 1);
	}
	Llamad__Request req = LLAMAD__REQUEST__INIT;
	req.op_case = LLAMAD__REQUEST__OP_OPEN;
	req.open = &o;
	Llamad__Response *r = cli_call_any(cli, &req);
	if (errors_ok && r->body_case == LLAMAD__RESPONSE__BODY_ERROR)
		return r;
	cli_expect(r, LLAMAD__RESPONSE__BODY_SESSION);
	if (r->session && r->session->has_context_policy)
		cli->policy = (int)r->session->context_policy;
	return r;
}

Llamad__Response *cli_open_chat(struct cli *cli, const char *session, struct open_opts o)
{
	if (o.create_only && o.policy == LLAMAD__CONTEXT_POLICY__CONTEXT_DEFAULT)
		o.policy = LLAMAD__CONTEXT_POLICY__CONTEXT_SHIFT;  /* a new one anyway */
	if (o.policy != LLAMAD__CONTEXT_POLICY__CONTEXT_DEFAULT || o.create_only)
		return cli_open_session(cli, session, &o, false);
	/* create it with shift; if it exists, open it as it is */
	struct open_opts create = o;
	create.policy = LLAMAD__CONTEXT_POLICY__CONTEXT_SHIFT;
	create.create_only = true;
	Llamad__Response *r = cli_open_session(cli, session, &create, true);
	if (r->body_case == LLAMAD__RESPONSE__BODY_ERROR && r->error &&
	    r->error->code == LLAMAD__ERROR_CODE__SESSION_EXISTS) {
		llamad__response__free_unpacked(r, NULL);
		return cli_open_session(cli, session, &o, false);
	}
	return cli_expect(r, LLAMAD__RESPONSE__BODY_SESSION);
}

Llamad__ContextPolicy cli_parse_policy(const struct cli *cli, const char *arg)
{
	int v;
	if (cli_enum_value(&llamad__context_policy__descriptor, arg, &v) &&
	    v != LLAMAD__CONTEXT_POLICY__CONTEXT_DEFAULT)
		return (Llamad__ContextPolicy)v;
	cli_usage_error(cli, "--context-policy: '%s' is not shift or error", arg);
}

bool cli_note_shift(FILE *f, bool color, const Llamad__Done *d)
{
	if (!d->has_dropped_turns || !d->has_dropped_tokens || !d->has_slid_tokens)
		return false;
	uint32_t slid = d->slid_tokens <= d->dropped_tokens ? d->slid_tokens : d->dropped_tokens;
	uint32_t turn_tokens = d->dropped_tokens - slid;
	if (d->dropped_turns == 0 && slid == 0)
		return true;
	fprintf(f, "%s[the context was full: ", color ? "\033[2m" : "");
	if (d->dropped_turns)
		fprintf(f, "the oldest turns were dropped (%u turn%s, %u token%s)%s",
			d->dropped_turns, d->dropped_turns == 1 ? "" : "s", turn_tokens,
			turn_tokens == 1 ? "" : "s", slid ? " and " : " to make room");
	if (slid)
		fprintf(f, "the answer's first %u token%s slid out to make room", slid,
			slid == 1 ? "" : "s");
	fprintf(f, "]%s\n", color ? "\033[0m" : "");
	return true;
}

void cli_note_shift_kept(FILE *f, bool color, uint32_t kept)
{
	fprintf(f, "%s[the context was full: the oldest turns were dropped to make room; "
		"%u turns kept]%s\n", color ? "\033[2m" : "", kept, color ? "\033[0m" : "");
}

void cli_note_max_tokens(FILE *f, bool color, uint32_t n)
{
	fprintf(f, "%s[the answer stopped at max_tokens (%u token%s); -n raises it]%s\n",
		color ? "\033[2m" : "", n, n == 1 ? "" : "s", color ? "\033[0m" : "");
}

void cli_cancel_session(struct cli *cli, const char *session)
{
	Llamad__Cancel cn = LLAMAD__CANCEL__INIT;
	cn.session = (char *)session;
	Llamad__Request req = LLAMAD__REQUEST__INIT;
	req.op_case = LLAMAD__REQUEST__OP_CANCEL;
	req.cancel = &cn;
	llamad__response__free_unpacked(cli_call(cli, &req, LLAMAD__RESPONSE__BODY_OK), NULL);
}

void cli_drop_session(struct cli *cli, const char *session, bool quiet)
{
	Llamad__Drop d = LLAMAD__DROP__INIT;
	d.session = (char *)session;
	Llamad__Request req = LLAMAD__REQUEST__INIT;
	req.op_case = LLAMAD__REQUEST__OP_DROP;
	req.drop = &d;
	Llamad__Response *r = cli_call_any(cli, &req);
	if (!quiet)
		cli_expect(r, LLAMAD__RESPONSE__BODY_OK);
	llamad__response__free_unpacked(r, NULL);
}

/* ---- generation ------------------------------------------------------------ */

struct gen_ctx {
	const struct gen_req *g;
	struct gen_result *res;
	int write_errno;
};

/* One token event as a JSON line on stdout, flushed. */
static int json_token_event(const Llamad__TokenEvent *t)
{
	Llamad__TokenEvent none = LLAMAD__TOKEN_EVENT__INIT;
	struct json j;
	json_init(&j, stdout);
	json_obj_begin(&j);
	json_key(&j, "event");
	json_str(&j, "token");
	pbjson_members(&j, t ? &t->base : &none.base);
	json_obj_end(&j);
	json_end(&j);
	return fflush(stdout) != 0 || ferror(stdout) ? -EIO : 0;
}

static int on_token(void *ctx, const Llamad__Response *r)
{
	struct gen_ctx *x = ctx;
	const char *t = r->token ? r->token->text : NULL;
	size_t n = t ? strlen(t) : 0;
	if (x->g->events && json_token_event(r->token) != 0) {
		x->write_errno = errno ? errno : EIO;
		return -EIO;
	}
	if (n == 0)
		return 0;
	if (x->g->echo && x->g->after_label && !x->res->last && !isspace((unsigned char)t[0]) &&
	    fputc(' ', x->g->echo) == EOF) {
		x->write_errno = errno ? errno : EIO;
		return -EIO;
	}
	x->res->last = t[n - 1];
	if (x->g->echo) {
		/* One event, one write: the daemon sends whole characters. */
		if (fwrite(t, 1, n, x->g->echo) != n || fflush(x->g->echo) != 0) {
			x->write_errno = errno ? errno : EIO;
			return -EIO;
		}
	}
	if (x->g->collect) {
		struct gen_result *res = x->res;
		if (grow(&res->text, &res->cap, res->len + n + 1, 1, 1024))
			return -ENOMEM;
		memcpy(res->text + res->len, t, n);
		res->len += n;
		res->text[res->len] = '\0';
	}
	return 0;
}

void cli_generate(struct cli *cli, const struct gen_req *g, struct gen_result *res)
{
	memset(res, 0, sizeof(*res));
	Llamad__Generate gen = LLAMAD__GENERATE__INIT;
	gen.session = (char *)g->session;
	if (g->prompt) {
		gen.prompt = (char *)g->prompt;
		gen.has_role = 1;
		gen.role = g->role;
	}
	if (g->opts) {
		const Llamad__SamplerOptions *so = &g->opts->sampler;
		if (so->has_temperature || so->has_top_k || so->has_top_p || so->has_min_p ||
		    so->has_repeat_penalty || so->has_repeat_last_n ||
		    so->has_presence_penalty || so->has_frequency_penalty || so->has_seed)
			gen.sampler = (Llamad__SamplerOptions *)so;
		if (g->opts->has_max_tokens) {
			gen.has_max_tokens = 1;
			gen.max_tokens = g->opts->max_tokens;
		}
		gen.n_stop = g->opts->n_stop;
		gen.stop = (char **)g->opts->stop;
	}
	Llamad__Request req = LLAMAD__REQUEST__INIT;
	req.op_case = LLAMAD__REQUEST__OP_GENERATE;
	req.generate = &gen;

	uint64_t id;
	int rc = conn_send(&cli->conn, &req, &id);
	if (rc && g->soft && rc != -EMSGSIZE) {
		res->lost = rc;
		return;
	}
	if (rc)
		cli_die_conn(cli, rc);
	struct gen_ctx x = { g, res, 0 };
	rc = conn_wait(&cli->conn, id, on_token, &x, &res->term, &res->cancelled);
	if (rc == -EINTR) {
		res->interrupted = true;
		res->term = NULL;
		return;
	}
	if (rc && g->soft && !x.write_errno && rc != -ENOMEM) {
		res->lost = rc;   /* the connection broke: the caller goes on */
		res->term = NULL;
		return;
	}
	if (rc && rc != -EIO && g->echo && res->last && res->last != '\n' &&
	    isatty(fileno(g->echo))) {
		fputc('\n', g->echo);   /* the message below on a line of its own */
		fflush(g->echo);
	}
	if (rc == -EIO && x.write_errno)
		cli_write_failed(x.write_errno);
	if (rc == -ENOMEM)
		cli_die_local("out of memory");
	if (rc)
		cli_die_conn(cli, rc);
}

void gen_result_done(struct gen_result *res)
{
	free(res->text);
	if (res->term)
		llamad__response__free_unpacked(res->term, NULL);
	memset(res, 0, sizeof(*res));
}

/* ---- names and reports --------------------------------------------------- */

void cli_report_done(const struct cli *cli, const Llamad__Done *d)
{
	int reason = d->has_reason ? (int)d->reason : 0;
	if (cli->verbose) {
		double gs = d->generate_ms > 0 ? d->generated_tokens * 1e3 / d->generate_ms : 0;
		double ps = d->prefill_ms > 0 ? d->prompt_tokens * 1e3 / d->prefill_ms : 0;
		/* prompt tokens other sessions' blocks held (prefix sharing):
		 * not prefilled, so not in the rate */
		char shared[48] = "";
		if (d->has_shared_tokens && d->shared_tokens > 0)
			snprintf(shared, sizeof(shared), " (+%u shared)", d->shared_tokens);
		fprintf(stderr, "llamactl: prompt %u tokens%s in %.1f ms (%.1f tok/s); generated "
			"%u tokens in %.1f ms (%.1f tok/s); stop: %s; session %u tokens\n",
			d->prompt_tokens, shared, d->prefill_ms, ps, d->generated_tokens,
			d->generate_ms, gs, cli_reason_name(reason), d->session_tokens);
	} else if (reason == LLAMAD__STOP_REASON__STOP_CONTEXT_FULL) {
		if (cli->policy == LLAMAD__CONTEXT_POLICY__CONTEXT_SHIFT)
			fprintf(stderr, "llamactl: the answer was cut: what the session must keep "
				"(its system prompt and the question) fills its context (%u tokens); "
				"a shorter question or system prompt leaves room\n",
				d->session_tokens);
		else if (cli->policy == LLAMAD__CONTEXT_POLICY__CONTEXT_ERROR)
			fprintf(stderr, "llamactl: the answer was cut: the session's context is full "
				"and its context policy is error (--context-policy shift lets the "
				"oldest turns make room)\n");
		else
			fprintf(stderr, "llamactl: the session's context is full; the answer was cut "
				"(--context-policy shift lets the oldest turns make room)\n");
	}
}

void cli_json_done_line(const char *session, const struct gen_result *res)
{
	struct json j;
	json_init(&j, stdout);
	json_obj_begin(&j);
	json_key(&j, "event");
	json_str(&j, "done");
	json_key(&j, "session");
	json_str(&j, session);
	json_key(&j, "text");
	json_strn(&j, res->text ? res->text : "", res->len);
	pbjson_members(&j, &res->term->done->base);
	json_obj_end(&j);
	json_end(&j);
}

int cli_gen_finish(struct cli *cli, const char *session, struct gen_result *res)
{
	const Llamad__Done *d = res->term->done;
	if (cli->json) {
		cli_json_done_line(session, res);
	} else {
		fputc('\n', stdout);
	}
	cli_flush_stdout();
	cli_report_done(cli, d);
	gen_result_done(res);
	return EXIT_OK;
}

/* ---- transcripts ---------------------------------------------------------- */

Llamad__Response *cli_transcript(struct cli *cli, const char *session, uint32_t from,
				 uint32_t last, bool ids, const struct transcript_cb *cb)
{
	bool first = true;
	for (;;) {
		Llamad__GetTranscript g = LLAMAD__GET_TRANSCRIPT__INIT;
		g.session = (char *)session;
		PB_SET(&g, from_turn, from);
		if (first && last) {
			PB_SET(&g, last_turns, last);
		}
		if (ids) {
			PB_SET(&g, token_ids, 1);
		}
		Llamad__Request req = LLAMAD__REQUEST__INIT;
		req.op_case = LLAMAD__REQUEST__OP_TRANSCRIPT;
		req.transcript = &g;
		Llamad__Response *r = cli_call_any(cli, &req);
		if (r->body_case == LLAMAD__RESPONSE__BODY_ERROR)
			return r;
		const Llamad__Transcript *t = cli_expect(r, LLAMAD__RESPONSE__BODY_TRANSCRIPT)->transcript;
		if (first && cb->head)
			cb->head(cb->ctx, t);
		first = false;
		for (size_t i = 0; i < t->n_items && cb->turn; i++)
			cb->turn(cb->ctx, t->items[i]);
		/* the next page, unless this was the last (or made no progress) */
		bool more = t->next < t->turns && t->next > (t->has_first ? t->first : from) &&
			    t->n_items > 0;
		from = t->next;
		llamad__response__free_unpacked(r, NULL);
		if (!more)
			return NULL;
	}
}

void cli_print_dropped(FILE *f, const Llamad__Transcript *t)
{
	if (!t->dropped_turns)
		return;   /* an answer's slid tokens alone: its turn says so */
	fprintf(f, "[context shift: %u earlier turn%s dropped to make room; %llu token%s "
		"removed in all, answers' slid-out starts included]\n", t->dropped_turns,
		t->dropped_turns == 1 ? "" : "s", (unsigned long long)t->dropped_tokens,
		t->dropped_tokens == 1 ? "" : "s");
}

void cli_print_turn(FILE *f, const Llamad__Turn *u)
{
	fprintf(f, "[%u] %s (%u token%s", u->index, cli_role_name(u->role), u->tokens,
		u->tokens == 1 ? "" : "s");
	if (u->has_stop_reason)
		fprintf(f, ", ended: %s", cli_reason_name(u->stop_reason));
	if (u->truncated)
		fputs(", cut to fit one reply", f);
	if (u->has_slid_tokens && u->slid_tokens)
		fprintf(f, ", its first %u token%s slid out of the context", u->slid_tokens,
			u->slid_tokens == 1 ? "" : "s");
	fputs(")\n", f);
	const char *t = u->text ? u->text : "";
	size_t n = strlen(t);
	fputs(t, f);
	if (n && t[n - 1] != '\n')
		fputc('\n', f);
	if (u->n_token_ids) {
		fputs("ids:", f);
		for (size_t i = 0; i < u->n_token_ids; i++)
			fprintf(f, " %u", u->token_ids[i]);
		fputc('\n', f);
	}
	fputc('\n', f);
}

/* ---- help and the command table ------------------------------------------ */

static const char global_help[] =
"Talk to llamad, the Llama model daemon, over its Unix socket.\n"
"\n"
"Options (also accepted after the command):\n"
"      --socket PATH   the daemon's socket (default: $LLAMAD_SOCKET, else\n"
"                      $XDG_RUNTIME_DIR/llamad/llamad.sock, or\n"
"                      /run/llamad/llamad.sock for root or without\n"
"                      XDG_RUNTIME_DIR)\n"
"      --json          machine-readable output: JSON objects, one a line, on\n"
"                      stdout (generate, chat and summarize: one per event as\n"
"                      it comes); errors too, as {\"event\":\"error\",...}\n"
"  -v, --verbose       counts, timings and progress on stderr\n"
"  -h, --help          this text; `llamactl COMMAND --help` for a command\n"
"      --version       print the version\n"
"\n"
"Exit status: 0 ok, 1 error from the daemon (or the connection broke),\n"
"2 usage error, 3 cannot connect to the daemon.\n";

void cli_print_help(const struct cli *cli, FILE *f)
{
	const struct command *c = cli ? cli->cmd : NULL;
	if (c) {
		fprintf(f, "usage: llamactl %s%s%s\n\n%s\n%s", c->name, *c->args ? " " : "",
			c->args, c->help, CLI_COMMON_HELP);
		return;
	}
	fprintf(f, "usage: llamactl [--socket PATH] [--json] [-v] COMMAND [ARGS...]\n\n"
		"Commands:\n");
	for (const struct command *const *k = cli ? cli->commands : NULL; k && *k; k++)
		fprintf(f, "  %-10s %s\n", (*k)->name, (*k)->summary);
	fprintf(f, "\n%s", global_help);
}

const struct command *cli_find_command(const struct cli *cli, const char *name)
{
	for (const struct command *const *c = cli->commands; *c; c++)
		if (strcmp((*c)->name, name) == 0)
			return *c;
	return NULL;
}

/* ---- arguments and numbers for people ------------------------------------ */

void cli_human_bytes(char *buf, size_t n, uint64_t v)
{
	static const char *unit[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	double x = (double)v;
	int u = 0;
	while (x >= 1024 && u < 4) {
		x /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, n, "%llu B", (unsigned long long)v);
	else
		snprintf(buf, n, "%.1f %s", x, unit[u]);
}

void cli_human_age(char *buf, size_t n, int64_t last_use_ms)
{
	if (last_use_ms <= 0) {
		snprintf(buf, n, "-");
		return;
	}
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	int64_t now = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
	int64_t s = (now - last_use_ms) / 1000;
	if (s < 0)
		s = 0;
	if (s < 60)
		snprintf(buf, n, "%llds ago", (long long)s);
	else if (s < 3600)
		snprintf(buf, n, "%lldm ago", (long long)(s / 60));
	else if (s < 86400)
		snprintf(buf, n, "%lldh ago", (long long)(s / 3600));
	else
		snprintf(buf, n, "%lldd ago", (long long)(s / 86400));
}

void cli_want_args(const struct cli *cli, int argc, char **argv, int min, int max)
{
	int n = argc - optind;
	if (n > max)
		cli_usage_error(cli, "unexpected argument '%s'%s", argv[optind + max],
				max == 1 ? " (quote text that has spaces)" : "");
	if (n < min)
		cli_usage_error(cli, "missing argument");
}

const char *cli_want_session(const struct cli *cli, const char *name)
{
	if (!llamad_session_id_ok(name))
		cli_usage_error(cli, "'%s' is not a session name: " LLAMAD_SESSION_ID_RULE, name);
	return name;
}

void cli_parse_common(struct cli *cli, int argc, char **argv)
{
	static const struct option opts[] = { CLI_COMMON_OPTS, { 0 } };
	int o;
	while ((o = getopt_long(argc, argv, "hv", opts, NULL)) != -1)
		cli_opt(cli, NULL, o, optarg);
}

void cli_begin(struct cli *cli, int argc, char **argv, int min, int max)
{
	cli_parse_common(cli, argc, argv);
	cli_want_args(cli, argc, argv, min, max);
	cli_connect(cli);
}

const char *cli_begin_session(struct cli *cli, int argc, char **argv)
{
	cli_parse_common(cli, argc, argv);
	cli_want_args(cli, argc, argv, 1, 1);
	cli_want_session(cli, argv[optind]);
	cli_connect(cli);
	return argv[optind];
}

void cli_json_named(const char *key, const char *name)
{
	struct json j;
	json_init(&j, stdout);
	json_obj_begin(&j);
	json_key(&j, key);
	json_str(&j, name);
	json_obj_end(&j);
	json_end(&j);
	cli_flush_stdout();
}

void cli_json_message(const ProtobufCMessage *m)
{
	struct json j;
	json_init(&j, stdout);
	pbjson_object(&j, m);
	json_end(&j);
}

char *cli_text_arg(const char *arg)
{
	if (arg && strcmp(arg, "-") != 0) {
		char *s = strdup(arg);
		if (!s)
			cli_die_local("out of memory");
		return s;
	}
	size_t n;
	return cli_read_all(STDIN_FILENO, &n);
}

/*
 * client/cli_error.c — llamactl's errors: the one place llamactl words an error (stderr, and a JSON
 * error object on stdout under --json) and exits with its status (cli.h).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/cli.h"

/* --json was given: errors also go to stdout as JSON objects. */
static bool json_errors;

/* The error object of cli_error, on stdout. */
static void json_error(const char *kind, int code, const char *msg)
{
	pbjson_line("{s:s, s:s, s:u, s:s}", "event", "error", "error", kind, "code",
		    (uint64_t)(code > 0 ? code : 0), "message", msg);
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

void cli_errors_json(void)
{
	json_errors = true;
}

noreturn void cli_bad_option(const struct cli *cli)
{
	fprintf(stderr, "Try '%s --help'.\n", cli_prog(cli));
	if (json_errors)
		json_error("usage", 0, "bad option (see --help)");
	exit(EXIT_USAGE);
}

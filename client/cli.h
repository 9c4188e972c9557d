/*
 * client/cli.h — what llamactl's command files share: option tables and
 * parsing (cli_opts.c), exit codes and error reporting (cli_error.c),
 * connecting and sessions (cli_conn.c), the generation helper (cli_gen.c),
 * transcripts, help and printing (cli_print.c).
 *
 * Unlike conn.c, these helpers print and exit: they are the program's
 * front end. A function documented as "exits" never returns on failure.
 */
#ifndef LLAMACTL_CLI_H
#define LLAMACTL_CLI_H

#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdnoreturn.h>

#include "client/conn.h"
#include "client/enums.h"
#include "client/json.h"
#include "client/pbjson.h"
#include "proto/limits.h"
#include "proto/path.h"

/* Exit status. */
enum {
	EXIT_OK = 0,
	EXIT_DAEMON = 1,      /* the daemon answered an error, or the link broke */
	EXIT_USAGE = 2,
	EXIT_CONNECT = 3,     /* cannot connect to the socket */
	EXIT_INTERRUPTED = 130,
};

/* Long-option codes shared by the commands (command-specific ones start at
 * OPT_CMD). */
enum {
	OPT_SOCKET = 256, OPT_JSON, OPT_VERSION,
	OPT_TEMP, OPT_TOPK, OPT_TOPP, OPT_MINP, OPT_REPEAT, OPT_LASTN,
	OPT_PRESENCE, OPT_FREQ, OPT_SEED, OPT_MAXTOK, OPT_STOP, OPT_POLICY,
	OPT_CMD = 320,
};

/* Accepted by every command (and before it). */
#define CLI_COMMON_OPTS \
	{ "socket", required_argument, NULL, OPT_SOCKET }, \
	{ "json", no_argument, NULL, OPT_JSON }, \
	{ "verbose", no_argument, NULL, 'v' }, \
	{ "help", no_argument, NULL, 'h' }

/* The session a generating command works in and what a full one does
 * (generate, chat: gen_opts.session, gen_opts.policy). */
#define CLI_SESSION_OPTS \
	{ "session", required_argument, NULL, 's' }, \
	{ "context-policy", required_argument, NULL, OPT_POLICY }

/* Accepted by every command that generates. */
#define CLI_SAMPLER_OPTS \
	{ "temperature", required_argument, NULL, OPT_TEMP }, \
	{ "top-k", required_argument, NULL, OPT_TOPK }, \
	{ "top-p", required_argument, NULL, OPT_TOPP }, \
	{ "min-p", required_argument, NULL, OPT_MINP }, \
	{ "repeat-penalty", required_argument, NULL, OPT_REPEAT }, \
	{ "repeat-last-n", required_argument, NULL, OPT_LASTN }, \
	{ "presence-penalty", required_argument, NULL, OPT_PRESENCE }, \
	{ "frequency-penalty", required_argument, NULL, OPT_FREQ }, \
	{ "seed", required_argument, NULL, OPT_SEED }, \
	{ "max-tokens", required_argument, NULL, OPT_MAXTOK }, \
	{ "stop", required_argument, NULL, OPT_STOP }

/* Help text lines for CLI_SAMPLER_OPTS, shared by the commands' help. */
#define CLI_SAMPLER_HELP \
"Sampling (unset: the daemon's defaults; temperature 0 = greedy):\n" \
"      --temperature T     --top-k K      --top-p P      --min-p P\n" \
"      --repeat-penalty R  --repeat-last-n N\n" \
"      --presence-penalty X  --frequency-penalty X\n" \
"      --seed S            fixed seed (unset: random)\n" \
"  -n, --max-tokens N      generate at most N tokens\n" \
"      --stop TEXT         stop before TEXT (repeatable, up to " LLAMAD_STR(LLAMAD_MAX_STOPS) ")\n"

#define CLI_COMMON_HELP \
"Common options: --socket PATH, --json, -v/--verbose, -h/--help\n"

struct command;

/* Program state: global options and the connection. */
struct cli {
	const struct command *const *commands;  /* the command table, NULL-ended */
	const struct command *cmd;   /* the command running, NULL before */
	const char *socket;          /* socket path in use (or to try first) */
	/* with no --socket: the default paths to try in order
	 * (path_client_sockets), owned; cli_connect sets socket to the one
	 * it reached */
	char *candidates[PATH_CANDIDATES];
	int n_candidates;
	bool json;
	bool verbose;
	/* the context policy of the session last opened (its SessionInfo;
	 * 0: not known), for what a cut answer says */
	int policy;
	struct conn conn;
};

/* One llamactl command: the entry `cmd_NAME_entry` of client/cmd_NAME.c.
 * run parses its options from argv (argv[0] is "llamactl NAME", getopt's
 * optind reset by the caller), connects, runs, and returns the exit
 * status; fatal errors exit. */
struct command {
	const char *name;
	const char *args;            /* synopsis after the name */
	const char *summary;         /* one line for the global help */
	const char *help;            /* body of `llamactl NAME --help` */
	int (*run)(struct cli *cli, int argc, char **argv);
};

/* The command table (cmd.c), ended by NULL. */
extern const struct command *const cmd_table[];

/* The command of cli->commands called name, or NULL. */
const struct command *cli_find_command(const struct cli *cli, const char *name);

/* Sampling and length options of a generation. */
struct gen_opts {
	Llamad__SamplerOptions sampler;
	bool has_max_tokens;
	uint32_t max_tokens;
	char *stop[LLAMAD_MAX_STOPS];
	size_t n_stop;
	const char *session;            /* -s, --session (checked); NULL: none */
	Llamad__ContextPolicy policy;   /* --context-policy; CONTEXT_DEFAULT */
};

/* Initialise g with nothing set. */
void gen_opts_init(struct gen_opts *g);

/* Prefix for messages: "llamactl" or "llamactl CMD". */
const char *cli_prog(const struct cli *cli);

/* Print "PROG: message" and a hint to --help on stderr (with --json, also
 * the error line of cli_error, kind "usage"); exit 2. */
noreturn void cli_usage_error(const struct cli *cli, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* --json was given: from now on errors also go to stdout as JSON objects. */
void cli_errors_json(void);

/* An option the command does not take (getopt said which): a hint to
 * --help on stderr (with --json, the error line, kind "usage"); exit 2. */
noreturn void cli_bad_option(const struct cli *cli);

/* Print the current command's help (or the global help: the commands of
 * cli->commands and the global options) to f. */
void cli_print_help(const struct cli *cli, FILE *f);

/* Parse the options of a command that takes only the common ones. */
void cli_parse_common(struct cli *cli, int argc, char **argv);
/* cli_parse_common, cli_want_args(min, max), then cli_connect: the start
 * of a command with only the common options that talks to the daemon. */
void cli_begin(struct cli *cli, int argc, char **argv, int min, int max);
/* The same for a command whose one argument is a session name (checked by
 * cli_want_session before connecting); returns the name. */
const char *cli_begin_session(struct cli *cli, int argc, char **argv);
/* {"KEY":"NAME"} as one JSON line on stdout, flushed. */
void cli_json_named(const char *key, const char *name);
/* m as one JSON object line on stdout (pbjson_object). */
void cli_json_message(const ProtobufCMessage *m);

/* Check the count of positional arguments after the options: exits 2
 * unless there are min..max of them. */
void cli_want_args(const struct cli *cli, int argc, char **argv, int min, int max);

/* name, if it is a valid session id (LLAMAD_SESSION_ID_RULE); else a
 * usage error naming it (exits 2) before anything is sent. */
const char *cli_want_session(const struct cli *cli, const char *name);

/* Text from a positional argument, or stdin for "-" or NULL. The result is
 * malloc'd; exits 1 out of memory or on a read error. */
char *cli_text_arg(const char *arg);

/* Handle option o (from getopt_long) that the command itself did not:
 * the common options, the sampler options when g is not NULL, and getopt's
 * '?' (usage error). Exits for --help (0) and for bad values or unknown
 * options (2). */
void cli_opt(struct cli *cli, struct gen_opts *g, int o, const char *arg);

/* Parse a whole unsigned number for option `what` in [min, max]; exits 2
 * on a bad value. */
uint64_t cli_parse_u64(const struct cli *cli, const char *what, const char *arg,
		       uint64_t min, uint64_t max);

/* Connect to cli->socket, or without --socket to the first of
 * cli->candidates where a daemon listens (the next is tried only on ENOENT
 * or ECONNREFUSED), and shake hands. Exits 3 if no socket can be reached
 * (the message names every path tried), 1 if the daemon refuses the
 * handshake or the link breaks. */
void cli_connect(struct cli *cli);

/*
 * Report an error: "llamactl: MESSAGE" on stderr and, with --json, also the
 * line {"event":"error","error":KIND,"code":CODE,"message":MESSAGE} on
 * stdout, so that a program reading the JSON never parses human text. KIND
 * is a daemon ErrorCode's name (frame_error_name: "unknown session", ...)
 * with its CODE, or one of llamactl's own with code 0: "usage", "connect"
 * (no daemon at the socket), "connection" (the link broke), "too large",
 * "reply" (an unexpected reply), "local" (stdin, memory, a limit of the
 * command). Does not exit.
 */
void cli_error(const char *kind, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* cli_error("local", ...) and exit 1. */
noreturn void cli_die_local(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A write to stdout failed with errno err: exit quietly with 0 if the
 * reader went away (EPIPE: `| head`), else report it and exit 1. */
noreturn void cli_write_failed(int err);

/* Connect and shake hands without exiting: 0, or the negative errno of the
 * connect or of the handshake (the connection is then closed). A daemon
 * that refuses the handshake is reported and exits 1. */
int cli_try_connect(struct cli *cli);

/* Report a transport failure (err < 0 from conn_*) and exit 1. */
noreturn void cli_die_conn(const struct cli *cli, int err);

/* Report a daemon Error reply as "llamactl: <code name>: <message>"; does
 * not exit. */
void cli_print_error(const Llamad__Response *r);

/* If r is an Error, report it, free r and exit 1; if its body is not `want`,
 * report an unexpected reply and exit 1. Otherwise return r. */
Llamad__Response *cli_expect(Llamad__Response *r, Llamad__Response__BodyCase want);

/* Send req and wait for its reply; exits 1 on a transport failure or a
 * daemon error, or if the reply is not `want`. Caller frees the reply. */
Llamad__Response *cli_call(struct cli *cli, Llamad__Request *req,
			   Llamad__Response__BodyCase want);

/* Send req and wait for its reply, which may be an Error (returned, not
 * reported). Exits 1 on a transport failure only. */
Llamad__Response *cli_call_any(struct cli *cli, Llamad__Request *req);

/* Flush stdout; on a write error report it and exit 1. */
void cli_flush_stdout(void);

/* Read all of fd into a NUL-terminated malloc'd buffer; *len gets its size.
 * Exits 1 on a read error or out of memory. */
char *cli_read_all(int fd, size_t *len);

/* Write a fresh session name for a throw-away session into buf (n >= 48). */
void cli_ephemeral_name(char *buf, size_t n);

/* How a session is opened. */
struct open_opts {
	const char *system;              /* NULL: none */
	Llamad__Template tmpl;           /* TEMPLATE_DEFAULT: leave unset */
	Llamad__ContextPolicy policy;    /* CONTEXT_DEFAULT: leave unset (set: also
					  * changes an existing session's) */
	bool ephemeral, create_only;
};

/* OpenSession with o; returns the SessionInfo reply (caller frees), or, if
 * the daemon refuses, the Error reply when errors_ok, else exits 1. */
Llamad__Response *cli_open_session(struct cli *cli, const char *session,
				   const struct open_opts *o, bool errors_ok);

/* Open session for a chat: with policy CONTEXT_DEFAULT, a session it
 * creates gets CONTEXT_SHIFT (a chat outlives a full context) and an
 * existing one keeps its own; else policy. Exits 1 on a daemon error. */
Llamad__Response *cli_open_chat(struct cli *cli, const char *session, struct open_opts o);

/* Parse --context-policy's argument ("error" or "shift"); exits 2 on
 * another. */
Llamad__ContextPolicy cli_parse_policy(const struct cli *cli, const char *arg);

/* Cancel{session}: end what runs or waits in the session, from any
 * connection; exits 1 on a daemon error (no such session). */
void cli_cancel_session(struct cli *cli, const char *session);

/* The one line that says a context shift happened during a generation,
 * from its Done (dropped_turns, dropped_tokens, slid_tokens): the oldest
 * turns dropped, the answer's first tokens slid out; dim when color;
 * nothing when nothing was removed. Returns false if d does not say (an
 * older daemon's Done): then cli_note_shift_kept, from a comparison of
 * turn counts, is what can be said. */
bool cli_note_shift(FILE *f, bool color, const Llamad__Done *d);
/* The line for an older daemon: the session has `kept` turns, fewer than
 * before the generation. */
void cli_note_shift_kept(FILE *f, bool color, uint32_t kept);

/* Drop a session; exits 1 on failure unless quiet (then errors are
 * ignored, transport failures still exit). */
void cli_drop_session(struct cli *cli, const char *session, bool quiet);

/* One generation. */
struct gen_req {
	const char *session;
	const char *prompt;          /* NULL: continue without a new turn */
	Llamad__Role role;           /* role of prompt */
	const struct gen_opts *opts; /* may be NULL */
	FILE *echo;                  /* stream text here as it comes, or NULL */
	bool after_label;            /* echo follows a label ("assistant:"): a
				      * space before the text unless it starts
				      * with white space */
	bool events;                 /* each token event as a JSON line on stdout
				      * ({"event":"token","text":..,"tokens":[..]}) */
	bool collect;                /* keep the text in the result */
	bool soft;                   /* a broken connection ends the call (res->lost)
				      * instead of the program */
};

struct gen_result {
	char *text;                  /* collected text, NUL-terminated, or NULL */
	size_t len, cap;
	Llamad__Response *term;      /* the Done or Error reply (owned) */
	bool cancelled;              /* a Cancel was sent (interrupt) */
	bool interrupted;            /* a second interrupt abandoned the wait */
	char last;                   /* last byte of text received, or 0 */
	int lost;                    /* soft: the connection broke (-errno); term NULL */
};

/* Run a Generate and wait for its end. Token text is written to g->echo
 * (one fwrite + fflush per event, so a character is never split) and/or
 * kept. Exits 1 on a transport failure (unless g->soft: then res->lost is
 * set) or a write error on g->echo. On return res->term is the terminal
 * reply, or NULL when interrupted or lost (then the connection is
 * unusable). Free with gen_result_done. */
void cli_generate(struct cli *cli, const struct gen_req *g, struct gen_result *res);
/* The Generate message of g (its strings point into g), for a caller that
 * sends it itself. */
void cli_generate_msg(const struct gen_req *g, Llamad__Generate *gen);

/* Free what res holds. */
void gen_result_done(struct gen_result *res);
/* Add t[0..n) to res's collected text. 0 or -ENOMEM. */
int gen_result_add(struct gen_result *res, const char *t, size_t n);

/* With --verbose, print a Done reply's counts and timings on stderr; always
 * say there why an answer was cut by the context: the session's policy is
 * error (cli->policy), or what a shift must keep fills the context. */
void cli_report_done(const struct cli *cli, const Llamad__Done *d);
/* The line that says an answer stopped at max_tokens (`n` tokens), dim
 * when color (chat: the answer looks cut). */
void cli_note_max_tokens(FILE *f, bool color, uint32_t n);

/* Finish a generation that ended with its Done: with --json the line
 * {"event":"done", "session", "text" (all of it), Done's fields} (session
 * NULL: null), else the newline after the echoed text; then
 * cli_report_done. Frees res; returns 0. */
int cli_gen_finish(struct cli *cli, const char *session, struct gen_result *res);
/* The {"event":"done",...} line of cli_gen_finish for res (its term a
 * Done), on stdout. */
void cli_json_done_line(const char *session, const struct gen_result *res);

/* What cli_transcript calls: head once, with the first reply (its
 * items not yet shown), then turn for each turn in order (may be NULL). */
struct transcript_cb {
	void (*head)(void *ctx, const Llamad__Transcript *t);
	void (*turn)(void *ctx, const Llamad__Turn *u);
	void *ctx;
};

/* Fetch session's turns from turn `from` on (last > 0: only the last
 * `last` of them), with their token ids when ids, page by page (a reply
 * holds what fits one frame). Returns NULL when every turn was shown, or
 * the daemon's Error reply (the caller reports and frees it); exits 1 on
 * a transport failure. */
Llamad__Response *cli_transcript(struct cli *cli, const char *session, uint32_t from,
				 uint32_t last, bool ids, const struct transcript_cb *cb);

/* A turn for people, on f: a line "[INDEX] ROLE (N tokens[, ended: WHY][,
 * its first K tokens slid out of the context])" then its text and an
 * empty line. */
void cli_print_turn(FILE *f, const Llamad__Turn *u);
/* The line that says what context shifts removed from a transcript's
 * session ("[context shift: N earlier turns dropped to make room; M tokens
 * removed in all, ...]"), when they dropped turns (an answer that only
 * slid says so on its own line, cli_print_turn). */
void cli_print_dropped(FILE *f, const Llamad__Transcript *t);

/* v bytes for people, into buf (n bytes): "512 B", "1.5 MiB". */
void cli_human_bytes(char *buf, size_t n, uint64_t v);

/* How long ago last_use_ms (Unix time in ms) was, for people, into buf:
 * "5s ago", "3m ago", "2h ago", "4d ago"; "-" when not set (<= 0). */
void cli_human_age(char *buf, size_t n, int64_t last_use_ms);

#endif

/*
 * client/cmd_chat.c — `llamactl chat`: a conversation in one session.
 *
 * On a terminal: a prompt loop, the message read by client/editor.c (line
 * editing and history with libedit, bracketed paste, the signals), answers
 * streamed as they come, slash commands. SIGINT and SIGWINCH stay blocked
 * except while sleeping in ppoll() (reading a key or waiting for the
 * daemon), so none is lost and none interrupts a write. SIGINT while
 * waiting for the daemon sends Cancel for the request; at the prompt it
 * discards the line. Without a terminal: all of stdin is one user turn, the
 * answer goes to stdout, and the program exits.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/cli.h"
#include "client/editor.h"
#include "util/clock.h"

static int cmd_chat(struct cli *cli, int argc, char **argv);

const struct command cmd_chat_entry = {
	.name = "chat",
	.args = "[--session NAME] [--system TEXT] [--template llama3|llama2|raw] [OPTIONS]",
	.summary = "chat in a session (interactive; or one turn from stdin)",
	.help =
"Chat with the model in session NAME (created if missing; without --session,\n"
"a throw-away session dropped on exit).\n"
"\n"
"On a terminal, type a message and press Enter; end a line with \\ to go on\n"
"on the next one. The answer streams as it is generated; Ctrl-C stops it\n"
"(the part already generated stays in the session). Ctrl-C at the prompt\n"
"clears the line; Ctrl-D quits. History: ~/.local/state/llamactl/history.\n"
"A paste of several lines is one message. Answers come after \"assistant:\"\n"
"(in colour on a terminal, unless NO_COLOR is set); with stdout not the\n"
"terminal, your messages go there too (\"user:\"). If the daemon restarts, the\n"
"next message reconnects.\n"
"Commands at the prompt:\n"
"  /fork NAME     fork the session to NAME and go on in NAME\n"
"  /drop          drop the session and quit\n"
"  /system TEXT   add a system turn\n"
"  /regen         remove the last answer and generate it again\n"
"  /history [N]   show the session's counts and its turns (the last N)\n"
"  /quit          quit (the session stays, unless this chat created it\n"
"                 and nothing was said in it)\n"
"  /help          list these commands\n"
"A line starting with // sends a literal /.\n"
"Entering a session that has turns prints its last few first (--recap).\n"
"\n"
"With stdin not a terminal, all of stdin is one user turn: the answer is\n"
"printed and llamactl exits (with --json: JSON lines, as `generate`).\n"
"\n"
"  -s, --session NAME      the session\n"
"      --context-policy P  when the session is full: shift (default for a\n"
"                          session chat creates: the oldest turns make room,\n"
"                          the system prompt stays, a long answer slides on;\n"
"                          a dim line says what went) or error; given, it\n"
"                          also changes an existing session's\n"
"      --recap N           on entering a session that has turns, print the\n"
"                          last N of them (default 4; 0: none)\n"
"      --system TEXT       system prompt of a new session\n"
"      --template NAME     template of a new session: llama3, llama2 or raw\n"
"                          (default: the daemon's, from the model file)\n"
"\n"
CLI_SAMPLER_HELP,
	.run = cmd_chat,
};

struct chat {
	struct cli *cli;
	char *session;              /* current session (owned) */
	bool ephemeral;             /* current session is a throw-away one */
	struct gen_opts g;
	struct editor ed;           /* the terminal input (interactive) */
	bool last_is_system;        /* the last turn we added is /system's */
	uint32_t recap;             /* turns shown on entering a session */
	struct open_opts open;      /* how the session was opened (to reopen it) */
	bool labels;                /* "assistant:" before answers (interactive) */
	bool color;                 /* colour: stdout a terminal, NO_COLOR unset */
	bool echo_user;             /* stdout is not the terminal: the user's turns
				     * go there too, so a log holds both sides */
	bool lost;                  /* the connection broke: reconnect first */
	bool fresh;                 /* this chat created the session and has added
				     * nothing to it yet (dropped at the end if so) */
	uint32_t turns;             /* the session's turns, as last seen */
	bool turns_known;           /* turns is up to date (an older daemon's
				     * shift note compares with it) */
};

/* The prompt (an editor_prompt_fn): the session's name, green on a colour
 * terminal; "> " in a throw-away session. */
static char *chat_prompt(void *ctx, char *buf, size_t n)
{
	struct chat *c = ctx;
	if (c->ephemeral)
		return "> ";
	/* \1 ... \1: the colour's escape sequence takes no room on screen */
	if (c->color)
		snprintf(buf, n, "\1\033[1;32m\1%.120s\1\033[0m\1> ", c->session);
	else
		snprintf(buf, n, "%.120s> ", c->session);
	return buf;
}

/* ---- talking to the daemon -------------------------------------------------- */

/* The connection broke (err < 0): say so; the next request reconnects. */
static void connection_lost(struct chat *c, int err, const char *what)
{
	fprintf(stderr, "llamactl: the connection to llamad was lost (%s)%s%s; the next message "
		"reconnects\n", conn_strerror(err), *what ? " " : "", what);
	conn_close(&c->cli->conn);
	c->lost = true;
}

static void print_info_line(FILE *f, const Llamad__SessionInfo *s);

/* After a lost connection: connect again, waiting up to 30 s for the
 * daemon to come back (Ctrl-C stops waiting), and open the session again.
 * true when connected. */
static bool reconnect(struct chat *c)
{
	struct pollfd p = { .fd = c->cli->conn.fd, .events = POLLIN };
	bool closed_idle = false;
	if (!c->lost && p.fd >= 0 && poll(&p, 1, 0) == 1) {
		/* readable with no request out: the daemon closed it since the
		 * last turn (it stopped or restarted, or the connection was
		 * idle for the daemon's idle_timeout) */
		const struct conn *k = &c->cli->conn;
		closed_idle = k->idle_timeout > 0 &&
			      clock_mono_s() - k->last_reply >= (double)k->idle_timeout - 1;
		conn_close(&c->cli->conn);
		c->lost = true;
	}
	if (!c->lost)
		return true;
	struct cli *cli = c->cli;
	if (closed_idle && cli_try_connect(cli) == 0) {
		/* closed for idling: back at once, said only when the session
		 * did not survive */
		Llamad__Response *r = cli_open_chat(cli, c->session, c->open);
		if (r->session && r->session->created) {
			fputs("llamactl: reconnected; ", stderr);
			print_info_line(stderr, r->session);
		}
		llamad__response__free_unpacked(r, NULL);
		c->lost = false;
		return true;
	}
	fprintf(stderr, "llamactl: reconnecting to %s ...\n", cli->socket);
	editor_drain_sigint();
	int rc = -ENOENT;
	for (int i = 0; i < 60 && !*editor_sigint(); i++) {
		rc = cli_try_connect(cli);
		if (rc == 0 || (rc != -ENOENT && rc != -ECONNREFUSED && rc != -ECONNRESET &&
				rc != -EPIPE && rc != -EAGAIN))
			break;
		struct timespec half = { 0, 500000000L };
		ppoll(NULL, 0, &half, editor_wait_mask());   /* Ctrl-C ends the wait */
	}
	editor_drain_sigint();
	if (rc) {
		fprintf(stderr, "llamactl: cannot reach llamad at %s: %s (the next message tries "
			"again)\n", cli->socket, conn_strerror(rc));
		return false;
	}
	Llamad__Response *r = cli_open_chat(cli, c->session, c->open);
	fputs("llamactl: reconnected; ", stderr);
	if (r->session)
		print_info_line(stderr, r->session);
	llamad__response__free_unpacked(r, NULL);
	c->lost = false;
	return true;
}

/* A user turn of prompt (NULL: continue) in the current session, its
 * answer shown as it comes (JSON lines with --json, collected for the done
 * line). */
static struct gen_req chat_req(const struct chat *c, const char *prompt)
{
	struct gen_req req = {
		.session = c->session,
		.prompt = prompt,
		.role = LLAMAD__ROLE__ROLE_USER,
		.opts = &c->g,
		.echo = c->cli->json ? NULL : stdout,
		.events = c->cli->json,
		.collect = c->cli->json,
	};
	return req;
}

static Llamad__Response *chat_call(struct chat *c, Llamad__Request *req);

/* GetInfo of the current session: the reply, or NULL when it fails, which
 * chat_call reports unless quiet (said nothing: a note that cannot be
 * made is left out). */
static Llamad__Response *info_call(struct chat *c, bool quiet)
{
	Llamad__GetInfo gi = LLAMAD__GET_INFO__INIT;
	gi.session = c->session;
	Llamad__Request req = LLAMAD__REQUEST__INIT;
	req.op_case = LLAMAD__REQUEST__OP_INFO;
	req.info = &gi;
	if (!quiet)
		return chat_call(c, &req);
	Llamad__Response *r = NULL;
	if (conn_call(&c->cli->conn, &req, &r) != 0)
		return NULL;
	if (r->body_case != LLAMAD__RESPONSE__BODY_SESSION || !r->session) {
		llamad__response__free_unpacked(r, NULL);
		return NULL;
	}
	return r;
}

/* After an answer (its Done d; a user turn before it when with_prompt):
 * if a context shift removed turns, or the answer's own first tokens, say
 * so, once, dim. Done says it; an older daemon's does not, and then the
 * session's turns are counted (GetInfo): fewer than before plus that turn
 * means the daemon dropped the oldest ones. */
static void note_shift(struct chat *c, bool with_prompt, const Llamad__Done *d)
{
	if (cli_note_shift(stderr, c->color, d)) {
		c->turns_known = false;   /* not needed: Done will say it again */
		return;
	}
	Llamad__Response *r = info_call(c, true);
	if (!r)
		return;
	uint32_t now = r->session->turns, before = c->turns + (with_prompt ? 1 : 0);
	if (c->turns_known && now < before)
		cli_note_shift_kept(stderr, c->color, now);
	c->turns = now;
	c->turns_known = true;
	llamad__response__free_unpacked(r, NULL);
}

/* Generate in the current session (prompt NULL: continue) and show the
 * answer. Daemon errors are reported and the chat goes on. */
static void chat_generate(struct chat *c, const char *prompt)
{
	struct cli *cli = c->cli;
	struct gen_req req = chat_req(c, prompt);
	struct gen_result res;
	editor_drain_sigint();
	c->last_is_system = false;
	req.soft = true;
	if (c->labels && !cli->json) {
		if (c->echo_user && prompt)   /* the log gets the question too */
			printf("%suser:%s %s\n", c->color ? "\033[1;32m" : "",
			       c->color ? "\033[0m" : "", prompt);
		printf("%sassistant:%s", c->color ? "\033[1;36m" : "", c->color ? "\033[0m" : "");
		fflush(stdout);
		req.after_label = true;
	}
	editor_answer_mode(&c->ed, true);
	cli_generate(cli, &req, &res);
	editor_answer_mode(&c->ed, false);
	if (res.interrupted) {
		fprintf(stderr, "\nllamactl: interrupted while waiting for the daemon\n");
		exit(EXIT_INTERRUPTED);
	}
	if (!cli->json && ((res.last && res.last != '\n') || (c->labels && !res.last)))
		fputc('\n', stdout);
	if (res.lost) {
		cli_flush_stdout();
		connection_lost(c, res.lost, "during the answer; the part shown stays in the session");
		gen_result_done(&res);
		return;
	}
	const Llamad__Response *t = res.term;
	if (cli->json && t->body_case == LLAMAD__RESPONSE__BODY_DONE && t->done)
		cli_json_done_line(c->ephemeral ? NULL : c->session, &res);
	cli_flush_stdout();
	if (t->body_case == LLAMAD__RESPONSE__BODY_DONE) {
		c->fresh = false;
		note_shift(c, prompt != NULL, t->done);
	}
	if (t->body_case == LLAMAD__RESPONSE__BODY_ERROR) {
		if (t->error && t->error->has_code &&
		    t->error->code == LLAMAD__ERROR_CODE__CANCELLED)
			fprintf(stderr, "[cancelled]\n");
		else
			cli_print_error(t);
	} else if (t->body_case == LLAMAD__RESPONSE__BODY_DONE && t->done) {
		if (t->done->has_reason && t->done->reason == LLAMAD__STOP_REASON__STOP_CANCELLED)
			fprintf(stderr, "[cancelled]\n");
		cli_report_done(cli, t->done);
		if (!cli->verbose && !cli->json &&
		    t->done->reason == LLAMAD__STOP_REASON__STOP_MAX_TOKENS)
			cli_note_max_tokens(stderr, c->color, t->done->generated_tokens);
	}
	gen_result_done(&res);
}

/* Send req; on an Error reply report it and return NULL, else the reply.
 * A broken connection is reported too (NULL; the next request
 * reconnects). */
static Llamad__Response *chat_call(struct chat *c, Llamad__Request *req)
{
	editor_drain_sigint();
	Llamad__Response *r = NULL;
	int rc = conn_call(&c->cli->conn, req, &r);
	if (rc) {
		connection_lost(c, rc, "");
		return NULL;
	}
	if (r->body_case == LLAMAD__RESPONSE__BODY_ERROR) {
		cli_print_error(r);
		llamad__response__free_unpacked(r, NULL);
		return NULL;
	}
	return r;
}

static void print_info_line(FILE *f, const Llamad__SessionInfo *s)
{
	fprintf(f, "session %s: %u turns, %u tokens", s->session ? s->session : "?",
		s->turns, s->tokens);
	if (s->context_length)
		fprintf(f, " of %u", s->context_length);
	if (s->cached_tokens != s->tokens)
		fprintf(f, " (%u cached)", s->cached_tokens);
	fprintf(f, ", template %s", cli_template_name(s->template_));
	if (s->ephemeral)
		fputs(", ephemeral", f);
	fputc('\n', f);
}

static void recap_head(void *ctx, const Llamad__Transcript *t)
{
	(void)ctx;
	cli_print_dropped(stdout, t);
	if (t->first > 0)
		printf("(%u earlier turn%s)\n", t->first, t->first == 1 ? "" : "s");
}

static void recap_turn(void *ctx, const Llamad__Turn *u)
{
	(void)ctx;
	cli_print_turn(stdout, u);
}

/* Print the session's turns (last > 0: the last `last`). Errors are
 * reported and the chat goes on. */
static void print_turns(struct chat *c, uint32_t last)
{
	struct transcript_cb cb = { recap_head, recap_turn, NULL };
	editor_drain_sigint();
	Llamad__Response *e = cli_transcript(c->cli, c->session, 0, last, false, &cb);
	cli_flush_stdout();
	if (e) {
		cli_print_error(e);
		llamad__response__free_unpacked(e, NULL);
	}
}

static void slash_help(void)
{
	fputs("/fork NAME     fork the session to NAME and go on in NAME\n"
	      "/drop          drop the session and quit\n"
	      "/system TEXT   add a system turn\n"
	      "/regen         remove the last answer and generate it again\n"
	      "/history [N]   show the session's counts and its turns (the last N)\n"
	      "/quit          quit (the session stays, unless just created and unused)\n"
	      "/help          this list\n"
	      "Ctrl-C stops an answer; Ctrl-D quits; end a line with \\ to continue it.\n",
	      stdout);
}

/* Run a slash command (line starts with '/'). Returns false to quit. */
static bool slash(struct chat *c, char *line)
{
	char *cmd = line + 1;
	char *arg = cmd + strcspn(cmd, " \t\n");
	if (*arg) {
		*arg++ = '\0';
		arg += strspn(arg, " \t\n");
	}
	size_t al = strlen(arg);
	while (al && (arg[al - 1] == ' ' || arg[al - 1] == '\t' || arg[al - 1] == '\n'))
		arg[--al] = '\0';

	if (strcmp(cmd, "quit") == 0 || strcmp(cmd, "exit") == 0 || strcmp(cmd, "q") == 0)
		return false;
	if (strcmp(cmd, "help") == 0 || strcmp(cmd, "?") == 0) {
		slash_help();
		return true;
	}
	if (strcmp(cmd, "history") == 0) {
		char *end = NULL;
		unsigned long n = *arg ? strtoul(arg, &end, 10) : 0;
		if (*arg && (*end || n > UINT32_MAX)) {
			fputs("usage: /history [N]\n", stderr);
			return true;
		}
		Llamad__Response *r = info_call(c, false);
		if (r) {
			print_info_line(stdout, r->session);
			llamad__response__free_unpacked(r, NULL);
			print_turns(c, (uint32_t)n);
		}
		return true;
	}
	if (strcmp(cmd, "fork") == 0) {
		if (!*arg || strpbrk(arg, " \t\n")) {
			fputs("usage: /fork NAME\n", stderr);
			return true;
		}
		Llamad__Fork f = LLAMAD__FORK__INIT;
		f.session = c->session;
		f.target = arg;
		Llamad__Request req = LLAMAD__REQUEST__INIT;
		req.op_case = LLAMAD__REQUEST__OP_FORK;
		req.fork = &f;
		Llamad__Response *r = chat_call(c, &req);
		if (r) {
			char *s = strdup(arg);
			if (s) {
				fprintf(stderr, "forked %s to %s; now in %s\n", c->session, s, s);
				c->fresh = false;
				free(c->session);
				c->session = s;
				c->ephemeral = r->session && r->session->ephemeral;
			}
			llamad__response__free_unpacked(r, NULL);
		}
		return true;
	}
	if (strcmp(cmd, "drop") == 0) {
		Llamad__Drop d = LLAMAD__DROP__INIT;
		d.session = c->session;
		Llamad__Request req = LLAMAD__REQUEST__INIT;
		req.op_case = LLAMAD__REQUEST__OP_DROP;
		req.drop = &d;
		Llamad__Response *r = chat_call(c, &req);
		if (!r)
			return true;
		fprintf(stderr, "dropped %s\n", c->session);
		llamad__response__free_unpacked(r, NULL);
		return false;
	}
	if (strcmp(cmd, "system") == 0) {
		if (!*arg) {
			fputs("usage: /system TEXT\n", stderr);
			return true;
		}
		Llamad__Append a = LLAMAD__APPEND__INIT;
		a.session = c->session;
		a.has_role = 1;
		a.role = LLAMAD__ROLE__ROLE_SYSTEM;
		a.text = arg;
		Llamad__Request req = LLAMAD__REQUEST__INIT;
		req.op_case = LLAMAD__REQUEST__OP_APPEND;
		req.append = &a;
		Llamad__Response *r = chat_call(c, &req);
		if (r) {
			c->last_is_system = true;
			c->fresh = false;
			if (r->session) {
				c->turns = r->session->turns;
				c->turns_known = true;
			}
			if (r->session && r->session->has_tokens_added &&
			    r->session->tokens_added > 0)
				fprintf(stderr, "system turn added (%u tokens)\n",
					r->session->tokens_added);
			else
				fputs("system prompt set for the next turn\n", stderr);
			llamad__response__free_unpacked(r, NULL);
		}
		return true;
	}
	if (strcmp(cmd, "regen") == 0) {
		if (c->last_is_system) {
			fputs("the last turn is a system turn, not an answer\n", stderr);
			return true;
		}
		Llamad__Rewind rw = LLAMAD__REWIND__INIT;
		rw.session = c->session;
		Llamad__Request req = LLAMAD__REQUEST__INIT;
		req.op_case = LLAMAD__REQUEST__OP_REWIND;
		req.rewind = &rw;
		Llamad__Response *r = chat_call(c, &req);
		if (!r)
			return true;
		llamad__response__free_unpacked(r, NULL);
		chat_generate(c, NULL);
		return true;
	}
	fprintf(stderr, "unknown command /%s (/help lists them)\n", cmd);
	return true;
}

/* A session this chat created and left without a turn (/quit or Ctrl-D
 * before any message) is not kept: it would be an empty saved session. */
static void drop_if_unused(struct chat *c)
{
	if (!c->fresh || c->ephemeral || c->lost)
		return;
	Llamad__Response *r = info_call(c, true);
	bool unused = r && r->session->turns == 0 && !r->session->busy;
	if (r)
		llamad__response__free_unpacked(r, NULL);
	if (!unused)
		return;
	cli_drop_session(c->cli, c->session, true);
	fprintf(stderr, "llamactl: nothing was said in the new session %s: not kept\n",
		c->session);
}

static int chat_interactive(struct chat *c)
{
	editor_signals_setup();
	c->cli->conn.intr = editor_sigint();
	c->cli->conn.wait_mask = editor_wait_mask();
	editor_setup(&c->ed, chat_prompt, c);
	fputs("/help for commands, Ctrl-D to quit\n", stderr);
	for (;;) {
		char *line = editor_read(&c->ed);
		if (!line) {
			fputc('\n', c->ed.out);
			break;
		}
		const char *text = line + strspn(line, " \t\n");
		bool go_on = true;
		if (!*text)
			;   /* empty, or cleared by Ctrl-C */
		else if (!reconnect(c))
			;   /* said why; the line is in the history for another try */
		else if (line[0] == '/' && line[1] != '/')
			go_on = slash(c, line);
		else
			chat_generate(c, line[0] == '/' ? line + 1 : line);
		free(line);
		if (!go_on)
			break;
	}
	editor_done(&c->ed);
	cli_flush_stdout();
	drop_if_unused(c);
	return EXIT_OK;
}

/* stdin is not a terminal: one turn, text (owned, freed here). */
static int chat_once(struct chat *c, char *text)
{
	struct cli *cli = c->cli;
	struct gen_req req = chat_req(c, text);
	struct gen_result res;
	cli_generate(cli, &req, &res);
	free(text);
	const Llamad__Response *t = res.term;
	if (t->body_case == LLAMAD__RESPONSE__BODY_ERROR) {
		if (res.last)
			fputc('\n', stdout);
		cli_flush_stdout();
		cli_print_error(t);
		gen_result_done(&res);
		return EXIT_DAEMON;
	}
	Llamad__Done d = *cli_expect(res.term, LLAMAD__RESPONSE__BODY_DONE)->done;
	d.stop = NULL;   /* the counts outlive res; its strings do not */
	int rc = cli_gen_finish(cli, c->ephemeral ? NULL : c->session, &res);
	note_shift(c, true, &d);
	if (!cli->verbose && !cli->json && d.reason == LLAMAD__STOP_REASON__STOP_MAX_TOKENS)
		cli_note_max_tokens(stderr, c->color, d.generated_tokens);
	return rc;
}

static int cmd_chat(struct cli *cli, int argc, char **argv)
{
	enum { O_SYSTEM = OPT_CMD, O_TEMPLATE, O_RECAP };
	static const struct option opts[] = {
		CLI_COMMON_OPTS, CLI_SAMPLER_OPTS, CLI_SESSION_OPTS,
		{ "system", required_argument, NULL, O_SYSTEM },
		{ "template", required_argument, NULL, O_TEMPLATE },
		{ "recap", required_argument, NULL, O_RECAP },
		{ 0 },
	};
	struct chat c;
	memset(&c, 0, sizeof(c));
	c.cli = cli;
	c.recap = 4;
	gen_opts_init(&c.g);
	const char *system = NULL;
	Llamad__Template tmpl = LLAMAD__TEMPLATE__TEMPLATE_DEFAULT;
	int o;
	while ((o = getopt_long(argc, argv, "hvn:s:", opts, NULL)) != -1) {
		switch (o) {
		case O_SYSTEM:
			system = optarg;
			break;
		case O_RECAP:
			c.recap = (uint32_t)cli_parse_u64(cli, "--recap", optarg, 0, UINT32_MAX);
			break;
		case O_TEMPLATE: {
			int v;
			if (!cli_enum_value(&llamad__template__descriptor, optarg, &v) ||
			    v == LLAMAD__TEMPLATE__TEMPLATE_DEFAULT)
				cli_usage_error(cli, "--template: '%s' is not llama3, llama2 or raw",
						optarg);
			tmpl = (Llamad__Template)v;
			break;
		}
		default:
			cli_opt(cli, &c.g, o, optarg);
		}
	}
	if (optind < argc)
		cli_usage_error(cli, "unexpected argument '%s'", argv[optind]);

	char eph[64];
	const char *session = c.g.session;
	if (!session) {
		cli_ephemeral_name(eph, sizeof(eph));
		session = eph;
		c.ephemeral = true;
	}
	c.session = strdup(session);
	if (!c.session) {
		fprintf(stderr, "llamactl: out of memory\n");
		return EXIT_DAEMON;
	}
	bool interactive = isatty(STDIN_FILENO);

	cli_connect(cli);
	char *text = NULL;
	if (!interactive) {
		size_t n;
		text = cli_read_all(STDIN_FILENO, &n);
		if (text[strspn(text, " \t\r\n")] == '\0') {
			free(text);
			free(c.session);
			cli_usage_error(cli, "no message on stdin");
		}
	}
	struct open_opts oo = { .system = system, .tmpl = tmpl, .policy = c.g.policy,
				.ephemeral = c.ephemeral, .create_only = c.ephemeral };
	Llamad__Response *r = cli_open_chat(cli, c.session, oo);
	c.open = oo;
	c.open.create_only = false;   /* reopening after a reconnect */
	c.labels = interactive && !cli->json;
	const char *no_color = getenv("NO_COLOR"), *term = getenv("TERM");
	c.color = c.labels && isatty(STDOUT_FILENO) && !(no_color && *no_color) &&
		  !(term && strcmp(term, "dumb") == 0);
	c.echo_user = c.labels && !isatty(STDOUT_FILENO);
	const Llamad__SessionInfo *s = r->session;
	c.fresh = s && s->has_created && s->created && !c.ephemeral;
	c.turns = s ? s->turns : 0;
	c.turns_known = s != NULL;
	if (s && s->has_created && !s->created) {
		if (system && (!s->system || strcmp(s->system, system) != 0))
			fprintf(stderr, "llamactl: session %s exists; --system ignored "
				"(use /system to add a system turn)\n", c.session);
		if (tmpl != LLAMAD__TEMPLATE__TEMPLATE_DEFAULT && s->has_template_ &&
		    s->template_ != tmpl)
			fprintf(stderr, "llamactl: session %s exists with template %s; "
				"--template ignored\n", c.session, cli_template_name(s->template_));
	}
	if (interactive && s) {
		if (c.ephemeral)
			fprintf(stderr, "llamactl: a throw-away session (use --session NAME "
				"to keep one); model %s\n", cli->conn.model ? cli->conn.model : "?");
		else
			print_info_line(stderr, s);
	}
	bool recap = interactive && !cli->json && s && s->has_created && !s->created &&
		     s->turns > 0 && c.recap > 0;
	llamad__response__free_unpacked(r, NULL);
	if (recap)
		print_turns(&c, c.recap);

	int rc = interactive ? chat_interactive(&c) : chat_once(&c, text);
	free(c.session);
	return rc;
}

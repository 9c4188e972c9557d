/*
 * client/cmd_chat.c — `llamactl chat`: a conversation in one session.
 *
 * On a terminal: a prompt loop with line editing and history (libedit),
 * answers streamed as they come, slash commands. Signals: SIGINT and
 * SIGWINCH stay blocked except while sleeping in ppoll() (reading a key or
 * waiting for the daemon), so none is lost and none interrupts a write.
 * SIGINT while waiting for the daemon sends Cancel for the request; at the
 * prompt it discards the line. Without a terminal: all of stdin is one user
 * turn, the answer goes to stdout, and the program exits.
 */
#include <errno.h>
#include <histedit.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <wchar.h>

#include "client/cli.h"

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
"  /quit          quit (the session stays)\n"
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
"                          the system prompt stays) or error; given, it also\n"
"                          changes an existing session's\n"
"      --recap N           on entering a session that has turns, print the\n"
"                          last N of them (default 4; 0: none)\n"
"      --system TEXT       system prompt of a new session\n"
"      --template NAME     template of a new session: llama3, llama2 or raw\n"
"                          (default: the daemon's, from the model file)\n"
"\n"
CLI_SAMPLER_HELP,
	.run = cmd_chat,
};

#define CHAT_MAX_PASTES 16

struct chat {
	struct cli *cli;
	char *session;              /* current session (owned) */
	bool ephemeral;             /* current session is a throw-away one */
	struct gen_opts g;
	EditLine *el;
	History *hist;
	char hist_path[4096];       /* "" when history is not persisted */
	char prompt[200];
	bool continuation;          /* reading the next line of a \ line */
	bool last_is_system;        /* the last turn we added is /system's */
	uint32_t recap;             /* turns shown on entering a session */
	struct open_opts open;      /* how the session was opened (to reopen it) */
	bool labels;                /* "assistant:" before answers (interactive) */
	bool color;                 /* colour: stdout a terminal, NO_COLOR unset */
	bool echo_user;             /* stdout is not the terminal: the user's turns
				     * go there too, so a log holds both sides */
	bool lost;                  /* the connection broke: reconnect first */
	bool bracketed;             /* bracketed paste is on in the terminal */
	char *pending;              /* bytes chat_getc gives before reading more */
	size_t n_pending, at_pending;
	char *pastes[CHAT_MAX_PASTES];  /* pastes of several lines in this message */
	int n_pastes;
};

static volatile sig_atomic_t g_sigint;
static volatile sig_atomic_t g_sigwinch;
static bool g_line_interrupted;
static sigset_t g_wait_mask;     /* the mask while sleeping: SIGINT open */

static void on_sigint(int sig)
{
	(void)sig;
	g_sigint = 1;
}

static void on_sigwinch(int sig)
{
	(void)sig;
	g_sigwinch = 1;
}

/* Install the handlers and block SIGINT/SIGWINCH outside ppoll(). */
static void signals_setup(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sigemptyset(&sa.sa_mask);
	sa.sa_handler = on_sigint;      /* no SA_RESTART: ppoll returns EINTR */
	sigaction(SIGINT, &sa, NULL);
	sa.sa_handler = on_sigwinch;
	sigaction(SIGWINCH, &sa, NULL);

	sigset_t block;
	sigemptyset(&block);
	sigaddset(&block, SIGINT);
	sigaddset(&block, SIGWINCH);
	sigprocmask(SIG_BLOCK, &block, &g_wait_mask);
	sigdelset(&g_wait_mask, SIGINT);
	sigdelset(&g_wait_mask, SIGWINCH);
}

/* Forget a Ctrl-C pressed while nothing was waiting for one. */
static void drain_sigint(void)
{
	sigset_t pend, only;
	sigemptyset(&only);
	sigaddset(&only, SIGINT);
	struct timespec zero = { 0, 0 };
	while (sigpending(&pend) == 0 && sigismember(&pend, SIGINT))
		if (sigtimedwait(&only, NULL, &zero) < 0 && errno != EINTR)
			break;
	g_sigint = 0;
}

/* One byte from stdin within timeout_ms (< 0: no limit), sleeping in ppoll
 * with the signals open: 1 with *b, 0 at end of input, -1 on an error, -2
 * on a signal or when the time ran out. */
static int read_byte(unsigned char *b, int timeout_ms)
{
	struct pollfd p = { .fd = STDIN_FILENO, .events = POLLIN };
	struct timespec ts = { timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L };
	int k = ppoll(&p, 1, timeout_ms < 0 ? NULL : &ts, &g_wait_mask);
	if (k < 0)
		return errno == EINTR ? -2 : -1;
	if (k == 0)
		return -2;
	ssize_t n = read(STDIN_FILENO, b, 1);
	if (n < 0)
		return errno == EINTR || errno == EAGAIN ? -2 : -1;
	return n == 1 ? 1 : 0;
}

/* Append n bytes to c's pending bytes; false when out of memory. */
static bool push_pending(struct chat *c, const char *s, size_t n)
{
	if (c->at_pending == c->n_pending)
		c->at_pending = c->n_pending = 0;
	char *p = realloc(c->pending, c->n_pending + n + 1);
	if (!p)
		return false;
	memcpy(p + c->n_pending, s, n);
	c->pending = p;
	c->n_pending += n;
	return true;
}

/* The placeholder a paste of several lines stands as in the line. */
static void paste_mark(char *buf, size_t n, int k, const char *text)
{
	int lines = 0;
	size_t len = strlen(text);
	for (size_t i = 0; i < len; i++)
		lines += text[i] == '\n';
	lines += len && text[len - 1] != '\n';
	snprintf(buf, n, "[paste %d: %d lines]", k + 1, lines);
}

/* An escape byte came from the terminal: if a bracketed paste follows
 * (ESC [ 2 0 0 ~ ... ESC [ 2 0 1 ~), take it whole, newlines included: a
 * paste of one line is typed into the line, one of several stands as a
 * placeholder that read_message replaces with it (one message, one turn).
 * Anything else goes back to libedit as it came. */
static void take_escape(struct chat *c)
{
	static const char start[] = "[200~", end[] = "\x1b[201~";
	char seq[8] = "\x1b";
	size_t n = 1;
	unsigned char b;
	while (n < 6 && read_byte(&b, 50) == 1) {
		seq[n++] = (char)b;
		if (b != (unsigned char)start[n - 2])
			break;
	}
	if (n < 6 || memcmp(seq + 1, start, 5) != 0) {
		push_pending(c, seq, n);
		return;
	}
	char *text = NULL;
	size_t len = 0, cap = 0, e = strlen(end);
	unsigned char prev = 0;
	while (read_byte(&b, 1000) == 1) {
		if (len + 2 > cap) {
			char *t = realloc(text, cap = cap ? cap * 2 : 256);
			if (!t)
				break;
			text = t;
		}
		bool crlf = b == '\n' && prev == '\r';   /* the CR stood for it already */
		prev = b;
		if (crlf)
			continue;
		text[len++] = (char)(b == '\r' ? '\n' : b);   /* terminals paste Enter as CR */
		if (len >= e && memcmp(text + len - e, end, e) == 0) {
			len -= e;
			break;
		}
	}
	if (!text)
		return;
	text[len] = '\0';
	if (!memchr(text, '\n', len) || c->n_pastes == CHAT_MAX_PASTES) {
		push_pending(c, text, len);
		free(text);
		return;
	}
	char mark[64];
	paste_mark(mark, sizeof(mark), c->n_pastes, text);
	c->pastes[c->n_pastes++] = text;
	push_pending(c, mark, strlen(mark));
}

/* libedit's character source: one key from stdin, sleeping in ppoll with
 * the signals open. A Ctrl-C becomes Enter with g_line_interrupted set, so
 * el_gets returns and the line is thrown away. */
static int chat_getc(EditLine *el, wchar_t *wc)
{
	static mbstate_t st;
	struct chat *c = NULL;
	el_get(el, EL_CLIENTDATA, &c);
	for (;;) {
		if (g_sigwinch) {
			g_sigwinch = 0;
			el_resize(el);
		}
		if (g_sigint) {
			g_sigint = 0;
			g_line_interrupted = true;
			memset(&st, 0, sizeof(st));
			*wc = L'\n';
			return 1;
		}
		unsigned char ub;
		if (c && c->at_pending < c->n_pending) {
			ub = (unsigned char)c->pending[c->at_pending++];
		} else {
			int k = read_byte(&ub, -1);
			if (k == -2)
				continue;
			if (k <= 0)
				return k;
			if (ub == 0x1b && c && c->bracketed) {
				take_escape(c);
				continue;
			}
		}
		char b = (char)ub;
		size_t r = mbrtowc(wc, &b, 1, &st);
		if (r == (size_t)-2)
			continue;            /* more bytes of this character */
		if (r == (size_t)-1) {
			memset(&st, 0, sizeof(st));
			continue;            /* not a character: skip the byte */
		}
		return 1;
	}
}

static char *prompt_fn(EditLine *el)
{
	struct chat *c = NULL;
	el_get(el, EL_CLIENTDATA, &c);
	if (!c)
		return "> ";
	if (c->continuation)
		return "... ";
	if (c->ephemeral)
		return "> ";
	/* \1 ... \1: the colour's escape sequence takes no room on screen */
	if (c->color)
		snprintf(c->prompt, sizeof(c->prompt), "\1\033[1;32m\1%.120s\1\033[0m\1> ",
			 c->session);
	else
		snprintf(c->prompt, sizeof(c->prompt), "%.120s> ", c->session);
	return c->prompt;
}

/* $XDG_STATE_HOME/llamactl/history, else ~/.local/state/llamactl/history;
 * creates the folder. false if that fails (no persistence). */
static bool history_path(char *buf, size_t n)
{
	const char *state = getenv("XDG_STATE_HOME");
	char base[4096];
	if (state && *state == '/') {
		snprintf(base, sizeof(base), "%s", state);
	} else {
		const char *home = getenv("HOME");
		if (!home || !*home) {
			struct passwd *pw = getpwuid(getuid());
			home = pw ? pw->pw_dir : NULL;
		}
		if (!home || !*home)
			return false;
		if ((size_t)snprintf(base, sizeof(base), "%s/.local/state", home) >= sizeof(base))
			return false;
	}
	if ((size_t)snprintf(buf, n, "%s/llamactl/history", base) >= n)
		return false;
	/* mkdir -p of the folder part */
	char dir[4096 + 16];
	if ((size_t)snprintf(dir, sizeof(dir), "%s/llamactl", base) >= sizeof(dir))
		return false;
	for (char *p = dir + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(dir, 0700) < 0 && errno != EEXIST)
			return false;
		*p = '/';
	}
	if (mkdir(dir, 0700) < 0 && errno != EEXIST)
		return false;
	return true;
}

static void editor_done(struct chat *c);
static struct chat *g_chat;   /* for chat_atexit */

/* Every exit path (a lost connection included) saves the history and
 * leaves the terminal as it was. */
static void chat_atexit(void)
{
	if (g_chat)
		editor_done(g_chat);
}

static void editor_setup(struct chat *c)
{
	HistEvent ev;
	c->hist = history_init();
	if (c->hist) {
		history(c->hist, &ev, H_SETSIZE, 1000);
		history(c->hist, &ev, H_SETUNIQUE, 1);
		if (history_path(c->hist_path, sizeof(c->hist_path)))
			history(c->hist, &ev, H_LOAD, c->hist_path);   /* may not exist yet */
		else
			c->hist_path[0] = '\0';
	}
	c->el = el_init("llamactl", stdin, stdout, stderr);
	if (!c->el) {
		fprintf(stderr, "llamactl: cannot start line editing\n");
		exit(EXIT_DAEMON);
	}
	el_set(c->el, EL_CLIENTDATA, c);
	el_set(c->el, EL_EDITOR, "emacs");
	el_set(c->el, EL_SIGNAL, 0);
	el_set(c->el, EL_GETCFN, chat_getc);
	el_set(c->el, EL_PROMPT_ESC, prompt_fn, '\1');
	if (c->hist)
		el_set(c->el, EL_HIST, history, c->hist);
	el_set(c->el, EL_BIND, "^R", "em-inc-search-prev", NULL);
	el_source(c->el, NULL);   /* ~/.editrc, if any */
	g_chat = c;
	atexit(chat_atexit);
	/* bracketed paste: the terminal marks what is pasted, so that a paste
	 * of several lines is one message, not one per line */
	const char *term = getenv("TERM");
	if (isatty(STDOUT_FILENO) && term && strcmp(term, "dumb") != 0) {
		fputs("\033[?2004h", stdout);
		fflush(stdout);
		c->bracketed = true;
	}
}

static void editor_done(struct chat *c)
{
	if (c->bracketed) {
		fputs("\033[?2004l", stdout);
		fflush(stdout);
		c->bracketed = false;
	}
	for (int k = 0; k < c->n_pastes; k++)
		free(c->pastes[k]);
	c->n_pastes = 0;
	free(c->pending);
	c->pending = NULL;
	c->n_pending = c->at_pending = 0;
	if (c->hist && c->hist_path[0]) {
		HistEvent ev;
		mode_t old = umask(077);
		history(c->hist, &ev, H_SAVE, c->hist_path);
		umask(old);
	}
	if (c->el)
		el_end(c->el);
	if (c->hist)
		history_end(c->hist);
	c->el = NULL;
	c->hist = NULL;
	if (g_chat == c)
		g_chat = NULL;   /* c may live on a stack that is about to go */
}

/* msg (malloc'd) with the placeholders of this message's pastes replaced
 * by what was pasted (a placeholder the user edited stays as it is); the
 * pastes are forgotten. NULL when out of memory. */
static char *expand_pastes(struct chat *c, char *msg)
{
	for (int k = 0; k < c->n_pastes; k++) {
		char mark[64];
		paste_mark(mark, sizeof(mark), k, c->pastes[k]);
		char *at = msg ? strstr(msg, mark) : NULL;
		if (at) {
			size_t ml = strlen(mark), tl = strlen(c->pastes[k]), n = strlen(msg);
			char *m = malloc(n - ml + tl + 1);
			if (m) {
				size_t pre = (size_t)(at - msg);
				memcpy(m, msg, pre);
				memcpy(m + pre, c->pastes[k], tl);
				memcpy(m + pre + tl, at + ml, n - pre - ml + 1);
			}
			free(msg);
			msg = m;
		}
		free(c->pastes[k]);
		c->pastes[k] = NULL;
	}
	c->n_pastes = 0;
	return msg;
}

/* Read one message: a line, or several joined where a line ends with a
 * backslash. Returns a malloc'd string without the final newline, "" for a
 * line discarded by Ctrl-C, or NULL at end of input. */
static char *read_message(struct chat *c)
{
	char *msg = NULL;
	size_t len = 0;
	c->continuation = false;
	for (;;) {
		drain_sigint();
		g_line_interrupted = false;
		int count = 0;
		const char *line = el_gets(c->el, &count);
		if (!line || count <= 0) {
			if (msg) {   /* end of input inside a \ message: send it */
				fputc('\n', stdout);
				return msg;
			}
			return NULL;
		}
		if (g_line_interrupted) {
			free(msg);
			return strdup("");
		}
		size_t n = strlen(line);
		if (n && line[n - 1] == '\n')
			n--;
		bool more = n && line[n - 1] == '\\';
		if (more)
			n--;
		char *m = realloc(msg, len + n + 2);
		if (!m) {
			free(msg);
			return NULL;
		}
		msg = m;
		memcpy(msg + len, line, n);
		len += n;
		if (more)
			msg[len++] = '\n';
		msg[len] = '\0';
		if (!more)
			break;
		c->continuation = true;
	}
	c->continuation = false;
	msg = expand_pastes(c, msg);
	if (msg && c->hist && msg[strspn(msg, " \t\n")]) {
		HistEvent ev;
		history(c->hist, &ev, H_ENTER, msg);
	}
	return msg;
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
	if (!c->lost && p.fd >= 0 && poll(&p, 1, 0) == 1) {
		/* readable with no request out: the daemon closed it (it
		 * stopped, or restarted) since the last turn */
		conn_close(&c->cli->conn);
		c->lost = true;
	}
	if (!c->lost)
		return true;
	struct cli *cli = c->cli;
	fprintf(stderr, "llamactl: reconnecting to %s ...\n", cli->socket);
	drain_sigint();
	int rc = -ENOENT;
	for (int i = 0; i < 60 && !g_sigint; i++) {
		rc = cli_try_connect(cli);
		if (rc == 0 || (rc != -ENOENT && rc != -ECONNREFUSED && rc != -ECONNRESET &&
				rc != -EPIPE && rc != -EAGAIN))
			break;
		struct timespec half = { 0, 500000000L };
		ppoll(NULL, 0, &half, &g_wait_mask);   /* Ctrl-C ends the wait */
	}
	drain_sigint();
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

/* Generate in the current session (prompt NULL: continue) and show the
 * answer. Daemon errors are reported and the chat goes on. */
static void chat_generate(struct chat *c, const char *prompt)
{
	struct cli *cli = c->cli;
	struct gen_req req = {
		.session = c->session,
		.prompt = prompt,
		.role = LLAMAD__ROLE__ROLE_USER,
		.opts = &c->g,
		.echo = cli->json ? NULL : stdout,
		.events = cli->json,
		.collect = cli->json,
	};
	struct gen_result res;
	drain_sigint();
	c->last_is_system = false;
	req.soft = true;
	if (c->labels && !cli->json) {
		if (c->echo_user && prompt)   /* the log gets the question too */
			printf("%suser:%s %s\n", c->color ? "\033[1;32m" : "",
			       c->color ? "\033[0m" : "", prompt);
		printf("%sassistant:%s ", c->color ? "\033[1;36m" : "", c->color ? "\033[0m" : "");
		fflush(stdout);
	}
	cli_generate(cli, &req, &res);
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
	}
	gen_result_done(&res);
}

/* Send req; on an Error reply report it and return NULL, else the reply.
 * A broken connection is reported too (NULL; the next request
 * reconnects). */
static Llamad__Response *chat_call(struct chat *c, Llamad__Request *req)
{
	drain_sigint();
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

static Llamad__Response *info_call(struct chat *c)
{
	Llamad__GetInfo gi = LLAMAD__GET_INFO__INIT;
	gi.session = c->session;
	Llamad__Request req = LLAMAD__REQUEST__INIT;
	req.op_case = LLAMAD__REQUEST__OP_INFO;
	req.info = &gi;
	return chat_call(c, &req);
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
	drain_sigint();
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
	      "/quit          quit (the session stays)\n"
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
		Llamad__Response *r = info_call(c);
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

static int chat_interactive(struct chat *c)
{
	signals_setup();
	c->cli->conn.intr = &g_sigint;
	c->cli->conn.wait_mask = &g_wait_mask;
	editor_setup(c);
	fputs("/help for commands, Ctrl-D to quit\n", stderr);
	for (;;) {
		char *line = read_message(c);
		if (!line) {
			fputc('\n', stdout);
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
	editor_done(c);
	cli_flush_stdout();
	return EXIT_OK;
}

/* stdin is not a terminal: one turn, text (owned, freed here). */
static int chat_once(struct chat *c, char *text)
{
	struct cli *cli = c->cli;
	struct gen_req req = {
		.session = c->session,
		.prompt = text,
		.role = LLAMAD__ROLE__ROLE_USER,
		.opts = &c->g,
		.echo = cli->json ? NULL : stdout,
		.events = cli->json,
		.collect = cli->json,
	};
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
	cli_expect(res.term, LLAMAD__RESPONSE__BODY_DONE);
	return cli_gen_finish(cli, c->ephemeral ? NULL : c->session, &res);
}

static int cmd_chat(struct cli *cli, int argc, char **argv)
{
	enum { O_SYSTEM = OPT_CMD, O_TEMPLATE, O_RECAP, O_POLICY };
	Llamad__ContextPolicy policy = LLAMAD__CONTEXT_POLICY__CONTEXT_DEFAULT;
	static const struct option opts[] = {
		CLI_COMMON_OPTS, CLI_SAMPLER_OPTS,
		{ "session", required_argument, NULL, 's' },
		{ "system", required_argument, NULL, O_SYSTEM },
		{ "template", required_argument, NULL, O_TEMPLATE },
		{ "recap", required_argument, NULL, O_RECAP },
		{ "context-policy", required_argument, NULL, O_POLICY },
		{ 0 },
	};
	struct chat c;
	memset(&c, 0, sizeof(c));
	c.cli = cli;
	c.recap = 4;
	gen_opts_init(&c.g);
	const char *session = NULL, *system = NULL;
	Llamad__Template tmpl = LLAMAD__TEMPLATE__TEMPLATE_DEFAULT;
	int o;
	while ((o = getopt_long(argc, argv, "hvn:s:", opts, NULL)) != -1) {
		switch (o) {
		case 's':
			session = optarg;
			break;
		case O_SYSTEM:
			system = optarg;
			break;
		case O_POLICY:
			policy = cli_parse_policy(cli, optarg);
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
	struct open_opts oo = { .system = system, .tmpl = tmpl, .policy = policy,
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

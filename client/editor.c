/*
 * client/editor.c — reading a message at a terminal: libedit, the history
 * file, the prompt, SIGINT and SIGWINCH, bracketed paste (contracts in
 * editor.h).
 *
 * A key is read by editor_getc, libedit's character source, sleeping in
 * ppoll() with the signals open. A Ctrl-C becomes Enter with the line marked
 * interrupted, and the line is thrown away. An escape byte may start a
 * bracketed paste (take_escape); a paste of several lines is kept aside and
 * a placeholder typed in its place, the bytes libedit is to get next being
 * held in c->pending.
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
#include "client/editor.h"

static volatile sig_atomic_t g_sigint;
static volatile sig_atomic_t g_sigwinch;
static bool g_line_interrupted;
static sigset_t g_wait_mask;     /* the mask while sleeping: SIGINT open */

volatile sig_atomic_t *editor_sigint(void)
{
	return &g_sigint;
}

const sigset_t *editor_wait_mask(void)
{
	return &g_wait_mask;
}

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
void editor_signals_setup(void)
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
void editor_drain_sigint(void)
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
static bool push_pending(struct editor *c, const char *s, size_t n)
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
 * placeholder that editor_read replaces with it (one message, one turn).
 * Anything else goes back to libedit as it came. */
static void take_escape(struct editor *c)
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
	if (!memchr(text, '\n', len) || c->n_pastes == EDITOR_MAX_PASTES) {
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
static int editor_getc(EditLine *el, wchar_t *wc)
{
	static mbstate_t st;
	struct editor *c = NULL;
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
	struct editor *c = NULL;
	el_get(el, EL_CLIENTDATA, &c);
	if (!c)
		return "> ";
	if (c->continuation)
		return "... ";
	return c->prompt_cb(c->prompt_ctx, c->prompt, sizeof(c->prompt));
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

static struct editor *g_editor;   /* for editor_atexit */

/* Every exit path (an exit() anywhere in llamactl included) saves the
 * history and leaves the terminal as it was. */
static void editor_atexit(void)
{
	if (g_editor)
		editor_done(g_editor);
}

void editor_setup(struct editor *c, editor_prompt_fn prompt, void *ctx)
{
	HistEvent ev;
	c->prompt_cb = prompt;
	c->prompt_ctx = ctx;
	c->hist = history_init();
	if (c->hist) {
		history(c->hist, &ev, H_SETSIZE, 1000);
		history(c->hist, &ev, H_SETUNIQUE, 1);
		if (history_path(c->hist_path, sizeof(c->hist_path)))
			history(c->hist, &ev, H_LOAD, c->hist_path);   /* may not exist yet */
		else
			c->hist_path[0] = '\0';
	}
	/* the prompt and the line being typed go to the terminal: stdout, or
	 * stderr when stdout is piped (`chat | tee log`: the log gets the
	 * user: and assistant: lines, the terminal the prompt) */
	c->out = isatty(STDOUT_FILENO) || !isatty(STDERR_FILENO) ? stdout : stderr;
	c->el = el_init("llamactl", stdin, c->out, stderr);
	if (!c->el) {
		fprintf(stderr, "llamactl: cannot start line editing\n");
		exit(EXIT_DAEMON);
	}
	el_set(c->el, EL_CLIENTDATA, c);
	el_set(c->el, EL_EDITOR, "emacs");
	el_set(c->el, EL_SIGNAL, 0);
	el_set(c->el, EL_GETCFN, editor_getc);
	el_set(c->el, EL_PROMPT_ESC, prompt_fn, '\1');
	if (c->hist)
		el_set(c->el, EL_HIST, history, c->hist);
	el_set(c->el, EL_BIND, "^R", "em-inc-search-prev", NULL);
	el_source(c->el, NULL);   /* ~/.editrc, if any */
	g_editor = c;
	atexit(editor_atexit);
	/* bracketed paste: the terminal marks what is pasted, so that a paste
	 * of several lines is one message, not one per line */
	const char *term = getenv("TERM");
	if (isatty(fileno(c->out)) && term && strcmp(term, "dumb") != 0) {
		fputs("\033[?2004h", c->out);
		fflush(c->out);
		c->bracketed = true;
	}
}

void editor_answer_mode(struct editor *c, bool on)
{
	if (on && !c->answering && isatty(STDIN_FILENO) &&
	    tcgetattr(STDIN_FILENO, &c->saved) == 0) {
		struct termios t = c->saved;
		t.c_lflag &= ~(tcflag_t)(ECHO | ECHOCTL);
		t.c_lflag |= NOFLSH;
		c->answering = tcsetattr(STDIN_FILENO, TCSANOW, &t) == 0;
	} else if (!on && c->answering) {
		tcsetattr(STDIN_FILENO, TCSANOW, &c->saved);
		c->answering = false;
	}
}

void editor_done(struct editor *c)
{
	editor_answer_mode(c, false);
	if (c->bracketed) {
		fputs("\033[?2004l", c->out);
		fflush(c->out);
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
	if (g_editor == c)
		g_editor = NULL;   /* c may live on a stack that is about to go */
}

/* msg (malloc'd) with the placeholders of this message's pastes replaced
 * by what was pasted (a placeholder the user edited stays as it is); the
 * pastes are forgotten. NULL when out of memory. */
static char *expand_pastes(struct editor *c, char *msg)
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
char *editor_read(struct editor *c)
{
	char *msg = NULL;
	size_t len = 0;
	c->continuation = false;
	for (;;) {
		editor_drain_sigint();
		g_line_interrupted = false;
		int count = 0;
		const char *line = el_gets(c->el, &count);
		if (!line || count <= 0) {
			if (msg) {   /* end of input inside a \ message: send it */
				fputc('\n', c->out);
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

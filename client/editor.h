/*
 * client/editor.h — reading a message at a terminal, for `llamactl chat`.
 *
 * This module owns the terminal input: line editing with libedit (its
 * EditLine and History), the history file ($XDG_STATE_HOME/llamactl/history,
 * else ~/.local/state/llamactl/history; loaded by editor_setup, saved by
 * editor_done and at exit), the prompt (its text comes from the caller, see
 * editor_prompt_fn), continuation lines (a line ending with \ goes on on
 * the next one) and bracketed paste (a paste of several lines stands as a
 * placeholder "[paste K: N lines]" in the line and is put back in the
 * message editor_read returns, so that it is one message, not one per
 * line).
 *
 * It also owns SIGINT and SIGWINCH: both stay blocked except while sleeping
 * in ppoll() with editor_wait_mask() (reading a key here, or waiting for
 * the daemon in conn.c), so none is lost and none interrupts a write. At
 * the prompt a SIGINT discards the line and a SIGWINCH resizes it;
 * elsewhere the flag editor_sigint() points to tells whoever waits.
 *
 * It knows nothing of the daemon or of the chat. It prints only what
 * libedit shows, the bracketed-paste switches of the terminal, a newline
 * when input ends inside a \ message, and one line before exiting when
 * libedit cannot start (see editor_setup).
 */
#ifndef LLAMACTL_EDITOR_H
#define LLAMACTL_EDITOR_H

#include <histedit.h>
#include <signal.h>
#include <stdbool.h>
#include <termios.h>
#include <stddef.h>

#define EDITOR_MAX_PASTES 16

/* The prompt's text when not going on with a \ line: a constant string, or
 * buf (n bytes) written. Between two \1 bytes, what takes no room on the
 * screen (a colour's escape sequence). Called by libedit at each line. */
typedef char *(*editor_prompt_fn)(void *ctx, char *buf, size_t n);

/* Zeroed before editor_setup (a struct memset to 0); all of it is the
 * module's, read by nobody else. */
struct editor {
	EditLine *el;
	FILE *out;                  /* the terminal: stdout, or stderr if it is piped */
	History *hist;
	char hist_path[4096];       /* "" when history is not persisted */
	char prompt[200];
	bool continuation;          /* reading the next line of a \ line */
	bool bracketed;             /* bracketed paste is on in the terminal */
	bool answering;             /* editor_answer_mode: saved holds the settings */
	struct termios saved;
	char *pending;              /* bytes editor_getc gives before reading more */
	size_t n_pending, at_pending;
	char *pastes[EDITOR_MAX_PASTES];  /* pastes of several lines in this message */
	int n_pastes;
	editor_prompt_fn prompt_cb; /* the prompt's text, with prompt_ctx */
	void *prompt_ctx;
};

/* Install the handlers of SIGINT and SIGWINCH (without SA_RESTART) and
 * block both in this thread; they are open only in ppoll() with
 * editor_wait_mask(). Once, before editor_setup. */
void editor_signals_setup(void);

/* The flag SIGINT sets (conn.c's intr): who sees it nonzero acts on it and
 * clears it. Static storage, never NULL. */
volatile sig_atomic_t *editor_sigint(void);

/* The signal mask to sleep with (ppoll's): once editor_signals_setup has
 * run, this thread's mask from before it, with SIGINT and SIGWINCH open.
 * Static storage, never NULL. */
const sigset_t *editor_wait_mask(void);

/* Forget a Ctrl-C pressed while nothing was waiting for one: the pending
 * SIGINT and the flag. */
void editor_drain_sigint(void);

/* Start line editing on stdin/stdout for c (zeroed, see struct editor):
 * libedit in emacs mode with ^R searching back, ~/.editrc, the history
 * (1000 lines, loaded from the history file, whose folder is made as
 * needed; without a folder, history stays in memory), prompt(ctx) for
 * the prompt, and bracketed paste when stdout is a terminal other than
 * TERM=dumb. Registers an exit handler that calls editor_done on c, so
 * that every exit saves the history and leaves the terminal as it was.
 * When libedit cannot start, prints why and exits (EXIT_DAEMON). */
void editor_setup(struct editor *c, editor_prompt_fn prompt, void *ctx);

/* Read one message: a line, or several joined where a line ends with a
 * backslash, the placeholders of its pastes replaced by what was pasted
 * (one the user edited stays as it is); a message that is not blank goes
 * into the history. Returns a malloc'd string (the caller frees) without
 * the final newline, "" for a line discarded by Ctrl-C, or NULL at end of
 * input (or when out of memory). */
char *editor_read(struct editor *c);

/* While an answer streams (on true; false restores the terminal): the
 * terminal neither echoes what is typed (a ^C, or text typed ahead, would
 * land inside the answer; typed-ahead text still reaches the next prompt)
 * nor discards its pending output on Ctrl-C (NOFLSH), so that the answer
 * shown is the answer kept. Nothing when stdin is not a terminal. */
void editor_answer_mode(struct editor *c, bool on);

/* Turn bracketed paste off, save the history (a file only the user can
 * read), end libedit and free what c holds (pastes and pending bytes
 * included); c is no longer the one the exit handler closes. Safe to call
 * again, and on a zeroed c never set up. */
void editor_done(struct editor *c);

#endif

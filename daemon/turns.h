/*
 * daemon/turns.h — a session's turns under its template: a client's turn
 * joins the history (model/chat.c says which tokens it takes), and a full
 * session makes room under its context policy (shift: drop whole exchanges
 * from the front and give the new first turn what a first turn has).
 */
#ifndef LLAMAD_DAEMON_TURNS_H
#define LLAMAD_DAEMON_TURNS_H

#include <stddef.h>

#include "model/model.h"
#include "session/session.h"

/* What the turn rules need besides the session. */
struct turn_env {
	struct sess_table *st;
	const struct model *m;
	int limit;               /* tokens a session may hold */
};

/*
 * Make room in s for `need` more tokens under its policy, never removing
 * turn keep_from or a later one. 0, or -EMSGSIZE if they cannot fit.
 */
int turn_make_room(const struct turn_env *te, struct session *s, int need, int keep_from);

/*
 * Append a client's turn (role: enum chat_role; text NUL-terminated) to s.
 * A llama2 system turn adds no tokens: it sets the system prompt (of the
 * first user turn, or of the next one once a user turn exists). Returns
 * the number of tokens added (>= 0), or -EPERM (a control tag), -EMSGSIZE
 * (the context cannot hold it), -ENOMEM, -EPROTO (the tokenizer failed),
 * with a one-line message for the client in msg (capacity cap).
 */
int turn_append(const struct turn_env *te, struct session *s, int role, const char *text,
		char *msg, size_t cap);

/* Index of s's last user turn, or -1. */
int turn_last_user(const struct session *s);

#endif

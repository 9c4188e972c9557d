/*
 * session/turns.h — a session's turns under its template: a client's turn
 * joins the history (text/chat.c says which tokens it takes), and a full
 * session makes room under its context policy.
 *
 * Under shift what stays is the system prompt (llama2's, folded into the
 * first turn; llama3's leading system turns) and the turn being added;
 * the exchanges before it go, oldest first, the most recent one included,
 * and the turn that then comes first is given what a first turn has (BOS
 * and the system prompt). An answer that fills the context while it is
 * generated slides the window instead of stopping (turn_slide). Every
 * removal is counted in the session (shift_turns, shift_tokens; a turn's
 * slid). Whatever moves loses its cache: the kept tokens after the first
 * removed one are prefilled again at their new positions (not rotated:
 * docs/PERF.md, "Context shift").
 */
#ifndef LLAMAD_SESSION_TURNS_H
#define LLAMAD_SESSION_TURNS_H

#include <stddef.h>

#include <stdint.h>

#include "session/session.h"

struct tok;

/* What the turn rules need besides the session. */
struct turn_env {
	struct sess_table *st;
	const struct tok *tok;   /* the model's tokenizer */
	int32_t bos, eos;        /* the model's BOS and EOS ids */
	int limit;               /* tokens a session may hold */
};

/*
 * Make room in s for `need` more tokens under its policy, never removing
 * turn keep_from or a later one. Shift drops whole exchanges from the
 * front, oldest first: a user turn and the turns after it up to the next
 * user turn (llama3: or system turn; raw: one turn); llama3 keeps the
 * leading system turns. The turn that then follows what was kept is
 * encoded again as a turn there (BOS and the system prompt when it is the
 * first). 0, -EMSGSIZE if they cannot fit (policy error: whenever s is
 * full), or -ENOMEM.
 */
int turn_make_room(const struct turn_env *te, struct session *s, int need, int keep_from);

/*
 * Room for one more token of the answer being generated in s, when s is
 * full. *keep is the generation's first turn (its prompt's, else its
 * answer's; updated as turns before it go); answer_open: s's last turn is
 * the answer being generated (else its first token opens it). Under
 * shift, the turns before both *keep and the last user turn go, oldest
 * first, and then the oldest tokens of the answers generated after them,
 * this one's included (the template's framing at the start of each
 * answer stays; an earlier answer slid whole goes whole), until half of
 * what the kept turns leave of the context is free: the next shift comes
 * that many tokens later, so re-prefilling what moved costs about one
 * token per token generated. 0 if there was room or room was made,
 * -EMSGSIZE (policy error, or the turns that must stay fill the context),
 * -ENOMEM.
 */
int turn_slide(const struct turn_env *te, struct session *s, int *keep, int answer_open);

/*
 * Append a client's turn (role: enum chat_role; text NUL-terminated) to s.
 * A llama2 system turn adds no tokens: it sets the system prompt (of the
 * first user turn, or of the next one once a user turn exists); a llama3
 * one is a turn of its own. Under shift a turn that does not fit makes room
 * (turn_make_room: every earlier exchange may go), unless it could not fit
 * with the system prompt alone; then nothing changes. Returns the number
 * of tokens the turn holds (>= 0), or -EMSGSIZE (the context cannot hold
 * it), -ENOMEM, -EINVAL (the model's vocabulary lacks the template's
 * control tokens: a session saved under another model), -EPROTO (the
 * tokenizer failed), with a one-line message for the client in msg
 * (capacity cap).
 */
int turn_append(const struct turn_env *te, struct session *s, int role, const char *text,
		char *msg, size_t cap);

/*
 * Before a generation on s: add what its template needs in front of the
 * answer (text/chat.c, chat_encode_generation): BOS in an empty session;
 * llama3, the generation prompt unless the last turn is a user turn (which
 * ends with it), an open answer or a raw turn; under shift the turns
 * before the last one may go to make room. Returns 1 if an assistant
 * turn was opened (the generated tokens belong to it), 0 if not, or
 * -EMSGSIZE, -ENOMEM, -EINVAL (as turn_append), -EPROTO with a message in
 * msg (cap).
 */
int turn_generation(const struct turn_env *te, struct session *s, char *msg, size_t cap);

/* Index of s's last user turn, or -1. */
int turn_last_user(const struct session *s);

#endif

/*
 * session/turns.c — see turns.h.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "session/turns.h"
#include "text/chat.h"

int turn_last_user(const struct session *s)
{
	for (int i = s->n_turns - 1; i >= 0; i--)
		if (s->turns[i].role == CHAT_USER)
			return i;
	return -1;
}

/* What a new turn's encoding depends on in s's history up to turn upto
 * (exclusive; s->n_turns: all of it). */
static struct chat_ctx history_upto(const struct turn_env *te, const struct session *s, int upto)
{
	int n = upto < s->n_turns ? s->turns[upto].start : s->n_tokens;
	int last = upto > 0 ? s->turns[upto - 1].role : -1;
	int has_user = 0;
	for (int i = 0; i < upto && !has_user; i++)
		has_user = s->turns[i].role == CHAT_USER;
	int32_t eot = chat_end_of_turn(te->m->tok, s->tmpl, te->m->cfg.eos);
	struct chat_ctx c = {
		.tmpl = (enum chat_template)s->tmpl,
		.bos = te->m->cfg.bos,
		.eos = te->m->cfg.eos,
		.n_tokens = n,
		.has_user_turn = has_user,
		.last_role = last,
		.open_answer = last == CHAT_ASSISTANT && n > 0 && s->tokens[n - 1] != eot,
		.system = s->system,
		.next_system = s->next_system,
	};
	return c;
}

static struct chat_ctx history_of(const struct turn_env *te, const struct session *s)
{
	return history_upto(te, s, s->n_turns);
}

/* Give turn idx of s (the first one after a shift, or the first after the
 * kept system turns) what a turn there has: 0 or -errno. */
static int renew_turn(const struct turn_env *te, struct session *s, int idx)
{
	struct sess_turn *t = &s->turns[idx];
	int a = t->start, b = idx + 1 < s->n_turns ? s->turns[idx + 1].start : s->n_tokens;
	struct chat_ctx c = history_upto(te, s, idx);
	int32_t *ids = NULL;
	int n;
	if (idx == 0)
		n = chat_encode_first_turn(te->m->tok, &c, (enum chat_role)t->role, t->text,
					   s->tokens + a, b - a, &ids);
	else if (t->text)  /* llama3: a user or system turn after the kept ones */
		n = chat_encode_turn(te->m->tok, &c, (enum chat_role)t->role, t->text, &ids);
	else
		return 0;
	if (n <= 0)
		return n;
	int rc = sess_replace_turn(te->st, s, idx, ids, n);
	free(ids);
	return rc;
}

/* The turns a shift may remove first: [*first, *end), the first exchange
 * after the leading system turns (llama3; llama2 keeps its system prompt
 * outside the turns), up to the next user turn (llama3: or system turn);
 * raw sessions: the first turn. */
static void first_exchange(const struct session *s, int *first, int *end)
{
	const struct chat_rules *r = chat_rules(s->tmpl);
	int a = 0;
	if (r->shift_keeps_system)
		while (a < s->n_turns && s->turns[a].role == CHAT_SYSTEM)
			a++;
	int k = a + 1;
	while (k < s->n_turns && !(r->exchange_starts & 1u << s->turns[k].role))
		k++;
	*first = a;
	*end = k;
}

int turn_make_room(const struct turn_env *te, struct session *s, int need, int keep_from)
{
	int limit = te->limit;
	if (s->n_tokens + need <= limit)
		return 0;
	if (s->policy != SESS_CTX_SHIFT)
		return -EMSGSIZE;
	int removed = 0, a = 0;
	for (int guard = 0; guard < 4; guard++) {
		while (s->n_tokens + need > limit) {
			int k;
			first_exchange(s, &a, &k);
			if (k > keep_from || k >= s->n_turns)
				return -EMSGSIZE;
			if (sess_remove_turns(te->st, s, a, k - a) != 0)
				return -EMSGSIZE;
			keep_from -= k - a;
			removed = 1;
		}
		if (!removed || a >= s->n_turns)
			return 0;
		if (renew_turn(te, s, a) != 0)
			return -EMSGSIZE;
		if (s->n_tokens + need <= limit)
			return 0;
		removed = 0;
	}
	return -EMSGSIZE;
}

/* The client's message for the turn error n (-errno), into msg (cap). */
static void turn_error(const struct turn_env *te, const struct session *s, int n, char *msg,
		       size_t cap)
{
	if (n == -ENOTSUP)
		snprintf(msg, cap, "template %s: %s", chat_template_name(s->tmpl),
			 chat_template_unusable(te->m->tok, s->tmpl));
	else
		snprintf(msg, cap, "%s", n == -ENOMEM ? "out of memory" : "cannot tokenize the text");
}

/* Append ids (n) as a turn of role with text, making room first. */
static int add_ids(const struct turn_env *te, struct session *s, int32_t *ids, int n, int role,
		   const char *text, char *msg, size_t cap)
{
	if (turn_make_room(te, s, n, s->n_turns) != 0) {
		if (n > te->limit || s->policy == SESS_CTX_SHIFT)
			snprintf(msg, cap, "the turn needs %d tokens, more than the %d-token context "
				 "holds with the turns it must keep; send a shorter text", n, te->limit);
		else
			snprintf(msg, cap, "the turn needs %d tokens; the session holds %d of its "
				 "%d-token context (its context policy is error: reopen it with "
				 "context policy shift, llamactl chat --context-policy shift, to drop "
				 "the oldest turns instead, or rewind or drop it)",
				 n, s->n_tokens, te->limit);
		return -EMSGSIZE;
	}
	if (sess_append(s, ids, n, role, text, 1) != 0) {
		snprintf(msg, cap, "out of memory");
		return -ENOMEM;
	}
	return n;
}

int turn_append(const struct turn_env *te, struct session *s, int role, const char *text,
		char *msg, size_t cap)
{
	struct chat_ctx c = history_of(te, s);
	int32_t *ids = NULL;
	int n = chat_encode_turn(te->m->tok, &c, (enum chat_role)role, text, &ids);
	if (n < 0) {
		turn_error(te, s, n, msg, cap);
		return n == -ENOTSUP ? -EINVAL : n;
	}
	if (n == 0 && role == CHAT_SYSTEM && chat_rules(s->tmpl)->system_sets_prompt) {
		char **slot = c.has_user_turn ? &s->next_system : &s->system;
		char *d = strdup(text);
		if (!d) {
			snprintf(msg, cap, "out of memory");
			return -ENOMEM;
		}
		free(*slot);
		*slot = d;
		return 0;
	}
	int stored = role == CHAT_RAW || chat_rules(s->tmpl)->turns_are_raw ? CHAT_RAW : role;
	n = add_ids(te, s, ids, n, stored, text, msg, cap);
	free(ids);
	if (n >= 0 && role == CHAT_USER && s->next_system) {
		free(s->next_system);
		s->next_system = NULL;
	}
	return n;
}

int turn_generation(const struct turn_env *te, struct session *s, char *msg, size_t cap)
{
	struct chat_ctx c = history_of(te, s);
	int32_t *ids = NULL;
	int n = chat_encode_generation(te->m->tok, &c, &ids);
	if (n <= 0) {
		if (n < 0)
			turn_error(te, s, n, msg, cap);
		return n == -ENOTSUP ? -EINVAL : n;
	}
	/* llama3's prompt opens the answer's turn; BOS alone is a raw turn */
	int role = chat_rules(s->tmpl)->prompt_opens_answer ? CHAT_ASSISTANT : CHAT_RAW;
	n = add_ids(te, s, ids, n, role, NULL, msg, cap);
	free(ids);
	return n < 0 ? n : role == CHAT_ASSISTANT;
}

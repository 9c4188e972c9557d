/*
 * daemon/turns.c — see turns.h.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/turns.h"
#include "model/chat.h"

int turn_last_user(const struct session *s)
{
	for (int i = s->n_turns - 1; i >= 0; i--)
		if (s->turns[i].role == CHAT_USER)
			return i;
	return -1;
}

/* What a new turn's encoding depends on in s's history. */
static struct chat_ctx history_of(const struct turn_env *te, const struct session *s)
{
	struct chat_ctx c = {
		.tmpl = (enum chat_template)s->tmpl,
		.bos = te->m->cfg.bos,
		.eos = te->m->cfg.eos,
		.n_tokens = s->n_tokens,
		.has_user_turn = turn_last_user(s) >= 0,
		.open_answer = s->n_turns > 0 && s->turns[s->n_turns - 1].role == CHAT_ASSISTANT &&
			       s->tokens[s->n_tokens - 1] != te->m->cfg.eos,
		.system = s->system,
		.next_system = s->next_system,
	};
	return c;
}

/* Give s's first turn (after a shift) what a first turn has. 0 or -errno. */
static int renew_first_turn(const struct turn_env *te, struct session *s)
{
	struct sess_turn *t0 = &s->turns[0];
	int a = t0->start, b = s->n_turns > 1 ? s->turns[1].start : s->n_tokens;
	struct chat_ctx c = history_of(te, s);
	int32_t *ids = NULL;
	int n = chat_encode_first_turn(te->m->tok, &c, (enum chat_role)t0->role, t0->text,
				       s->tokens + a, b - a, &ids);
	if (n <= 0)
		return n;
	int rc = sess_replace_turn(te->st, s, 0, ids, n);
	free(ids);
	return rc;
}

int turn_make_room(const struct turn_env *te, struct session *s, int need, int keep_from)
{
	int limit = te->limit;
	if (s->n_tokens + need <= limit)
		return 0;
	if (s->policy != SESS_CTX_SHIFT)
		return -EMSGSIZE;
	int removed = 0;
	for (int guard = 0; guard < 4; guard++) {
		while (s->n_tokens + need > limit) {
			/* the first exchange: turn 0 up to the next user turn
			 * (raw sessions: any turn boundary) */
			int k = 1;
			while (s->tmpl == CHAT_TEMPLATE_LLAMA2 && k < s->n_turns &&
			       s->turns[k].role != CHAT_USER)
				k++;
			if (k > keep_from || k >= s->n_turns)
				return -EMSGSIZE;
			if (sess_remove_turns(te->st, s, 0, k) != 0)
				return -EMSGSIZE;
			keep_from -= k;
			removed = 1;
		}
		if (!removed || s->n_turns == 0)
			return 0;
		if (renew_first_turn(te, s) != 0)
			return -EMSGSIZE;
		if (s->n_tokens + need <= limit)
			return 0;
		removed = 0;
	}
	return -EMSGSIZE;
}

int turn_append(const struct turn_env *te, struct session *s, int role, const char *text,
		char *msg, size_t cap)
{
	struct chat_ctx c = history_of(te, s);
	int32_t *ids = NULL;
	int n = chat_encode_turn(te->m->tok, &c, (enum chat_role)role, text, &ids);
	if (n < 0) {
		snprintf(msg, cap, "%s", n == -EPERM
			 ? "text contains a chat control tag ([INST], [/INST], <<SYS>>, <</SYS>>)"
			 : n == -ENOMEM ? "out of memory" : "cannot tokenize the text");
		return n;
	}
	if (n == 0 && role == CHAT_SYSTEM && s->tmpl == CHAT_TEMPLATE_LLAMA2) {
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
	if (turn_make_room(te, s, n, s->n_turns) != 0) {
		snprintf(msg, cap, "the turn needs %d tokens; the session holds %d of its %d-token "
			 "context", n, s->n_tokens, te->limit);
		free(ids);
		return -EMSGSIZE;
	}
	int stored = role == CHAT_RAW || s->tmpl == CHAT_TEMPLATE_RAW ? CHAT_RAW : role;
	if (sess_append(s, ids, n, stored, text, 1) != 0) {
		free(ids);
		snprintf(msg, cap, "out of memory");
		return -ENOMEM;
	}
	if (role == CHAT_USER && s->next_system) {
		free(s->next_system);
		s->next_system = NULL;
	}
	free(ids);
	return n;
}

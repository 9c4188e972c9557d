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
	int32_t eot = chat_end_of_turn(te->tok, s->tmpl, te->eos);
	struct chat_ctx c = {
		.tmpl = (enum chat_template)s->tmpl,
		.bos = te->bos,
		.eos = te->eos,
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

/* The end of turn i of s: the index after its last token. */
static int turn_end(const struct session *s, int i)
{
	return i + 1 < s->n_turns ? s->turns[i + 1].start : s->n_tokens;
}

/* The tokens of turns [a, b) of s. */
static int span(const struct session *s, int a, int b)
{
	return a < b ? turn_end(s, b - 1) - s->turns[a].start : 0;
}

/* The ids a turn (role, text; its ids now old[0, n_old)) takes as the
 * first turn after s's kept head, there at turn `at` (its history s's
 * turns [0, at)): n > 0 with *ids malloc'd, 0 if it stays as it is, or
 * -errno. */
static int encode_at(const struct turn_env *te, const struct session *s, int at, int role,
		     const char *text, const int32_t *old, int n_old, int32_t **ids)
{
	struct chat_ctx c = history_upto(te, s, at);
	*ids = NULL;
	if (at == 0)
		return chat_encode_first_turn(te->tok, &c, (enum chat_role)role, text, old, n_old,
					      ids);
	if (text)  /* llama3: a user or system turn after the kept ones */
		return chat_encode_turn(te->tok, &c, (enum chat_role)role, text, ids);
	return 0;
}

/* Give turn idx of s (the first one after a shift, or the first after the
 * kept system turns) what a turn there has: 0 or -errno. */
static int renew_turn(const struct turn_env *te, struct session *s, int idx)
{
	struct sess_turn *t = &s->turns[idx];
	int32_t *ids = NULL;
	int n = encode_at(te, s, idx, t->role, t->text, s->tokens + t->start,
			  turn_end(s, idx) - t->start, &ids);
	if (n <= 0)
		return n;
	int rc = sess_replace_turn(te->st, s, idx, ids, n);
	free(ids);
	return rc;
}

/* The first turn a shift may drop: after llama3's leading system turns
 * (llama2 keeps its system prompt outside the turns), else 0. */
static int first_droppable(const struct session *s)
{
	int a = 0;
	if (chat_rules(s->tmpl)->shift_keeps_system)
		while (a < s->n_turns && s->turns[a].role == CHAT_SYSTEM)
			a++;
	return a;
}

/* The end of the exchange that starts at turn a: the next turn that
 * begins one (a user turn; llama3: or a system turn; raw: any), or
 * s->n_turns. */
static int exchange_end(const struct session *s, int a)
{
	unsigned starts = chat_rules(s->tmpl)->exchange_starts;
	int k = a + 1;
	while (k < s->n_turns && !(starts & 1u << s->turns[k].role))
		k++;
	return k;
}

/* The turns a shift may drop before turn keep_from: [*first, return),
 * whole exchanges from the first droppable turn. */
static int droppable(const struct session *s, int keep_from, int *first)
{
	int a = first_droppable(s), end = a;
	for (int k; end < s->n_turns && (k = exchange_end(s, end)) <= keep_from;)
		end = k;
	*first = a;
	return end;
}

/* Drop the oldest exchange of s if it ends at or before turn keep_from
 * and give the turn that then comes first after the kept head what a turn
 * there has. Returns the turns dropped (> 0), 0 if none may go, or
 * -errno. */
static int drop_oldest(const struct turn_env *te, struct session *s, int keep_from)
{
	int a = first_droppable(s);
	if (a >= s->n_turns)
		return 0;
	int k = exchange_end(s, a);
	if (k > keep_from)
		return 0;
	int n = s->n_tokens;
	int rc = sess_remove_turns(te->st, s, a, k - a);
	if (rc)
		return rc;
	rc = a < s->n_turns ? renew_turn(te, s, a) : 0;
	/* counted net: the system prompt a renewed first turn takes on moved */
	s->shift_turns += (uint32_t)(k - a);
	s->shift_tokens += (uint64_t)(n > s->n_tokens ? n - s->n_tokens : 0);
	return rc ? rc : k - a;
}

int turn_make_room(const struct turn_env *te, struct session *s, int need, int keep_from)
{
	while (s->n_tokens + need > te->limit) {
		if (s->policy != SESS_CTX_SHIFT)
			return -EMSGSIZE;
		int rc = drop_oldest(te, s, keep_from);
		if (rc <= 0)
			return rc == -ENOMEM ? rc : -EMSGSIZE;
		keep_from -= rc;
	}
	return 0;
}

/* Where the own tokens of turn i of s start in it, if it is an answer the
 * model generated (after BOS and the template's framing), else -1. */
static int answer_body(const struct turn_env *te, const struct session *s, int i)
{
	const struct sess_turn *t = &s->turns[i];
	if (t->role != CHAT_ASSISTANT || t->text)
		return -1;
	return chat_answer_start(te->tok, s->tmpl, s->tokens + t->start, turn_end(s, i) - t->start);
}

/* Tokens of the generated answers from turn `from` on that may slide out. */
static int slidable(const struct turn_env *te, const struct session *s, int from)
{
	int n = 0;
	for (int i = from < 0 ? 0 : from; i < s->n_turns; i++) {
		int b = answer_body(te, s, i);
		if (b >= 0)
			n += turn_end(s, i) - s->turns[i].start - b;
	}
	return n;
}

/* Slide out up to `want` of the oldest tokens of the generated answers
 * from turn `from` on (their framing stays; an answer slid whole goes
 * whole unless it is the last turn and answer_open); turns going before
 * *keep move it. Returns the tokens removed, or -errno. */
static int slide_answers(const struct turn_env *te, struct session *s, int from, int want,
			 int *keep, int answer_open)
{
	int removed = 0;
	for (int i = from < 0 ? 0 : from; i < s->n_turns && removed < want;) {
		int b = answer_body(te, s, i), len = turn_end(s, i) - s->turns[i].start;
		if (b < 0 || b == len) {
			i++;
			continue;
		}
		int d = len - b < want - removed ? len - b : want - removed;
		if (d == len - b && !(answer_open && i == s->n_turns - 1)) {
			int rc = sess_remove_turns(te->st, s, i, 1);
			if (rc)
				return rc;
			s->shift_turns++;
			s->shift_tokens += (uint64_t)len;
			if (i < *keep)
				(*keep)--;
			removed += len;
			continue;
		}
		int rc = sess_remove_tokens(te->st, s, i, b, d);
		if (rc)
			return rc;
		s->turns[i].slid += d;
		s->shift_tokens += (uint64_t)d;
		removed += d;
		i++;
	}
	return removed;
}

int turn_slide(const struct turn_env *te, struct session *s, int *keep, int answer_open)
{
	int limit = te->limit;
	if (s->n_tokens + 1 <= limit)
		return 0;
	if (s->policy != SESS_CTX_SHIFT)
		return -EMSGSIZE;
	/* the turns that stay whole: from the question answered (the last user
	 * turn) or the generation's first turn, whichever comes first */
	int q = turn_last_user(s);
	if (q < 0 || q > *keep)
		q = *keep;
	if (q >= s->n_turns)   /* a continuation: the turn it continues */
		q = s->n_turns - 1;
	/* what no shift removes, and the room to make: half of what it leaves */
	int a, end = droppable(s, q, &a);
	int fixed = s->n_tokens - span(s, a, end) - slidable(te, s, q);
	int room = (limit - fixed) / 2;
	if (room < 1)
		room = 1;
	/* the oldest exchanges first */
	while (s->n_tokens + room > limit) {
		int rc = drop_oldest(te, s, q);
		if (rc < 0)
			return rc;
		if (rc == 0)
			break;
		q -= rc;
		*keep -= rc;
	}
	if (s->n_tokens + 1 <= limit)
		return 0;
	/* then the oldest tokens the answers after the question generated */
	int rc = slide_answers(te, s, q, s->n_tokens + room - limit, keep, answer_open);
	if (rc < 0)
		return rc;
	return s->n_tokens + 1 <= limit ? 0 : -EMSGSIZE;
}

/* The fewest tokens s can hold with a new turn (role, text; ids[0, n) as
 * it joins s now) after a shift that keeps turns from keep_from on:
 * every droppable exchange gone and, when nothing stays between the kept
 * head and the new turn, the new turn encoded as the first there. A count,
 * or -errno. */
static int least_tokens(const struct turn_env *te, const struct session *s, int keep_from,
			int role, const char *text, const int32_t *ids, int n)
{
	int a, end = droppable(s, keep_from, &a);
	int head = a < s->n_turns ? s->turns[a].start : s->n_tokens;
	if (end < s->n_turns)  /* turns that stay between the head and the new turn */
		return s->n_tokens - span(s, a, end) + n;
	int32_t *first = NULL;
	int m = a < s->n_turns ? encode_at(te, s, a, role, text, ids, n, &first) : 0;
	free(first);
	return m < 0 ? m : head + (m > 0 ? m : n);
}

/* The client's message for the turn error n (-errno), into msg (cap). */
static void turn_error(const struct turn_env *te, const struct session *s, int n, char *msg,
		       size_t cap)
{
	if (n == -ENOTSUP)
		snprintf(msg, cap, "template %s: %s", chat_template_name(s->tmpl),
			 chat_template_unusable(te->tok, s->tmpl));
	else
		snprintf(msg, cap, "%s", n == -ENOMEM ? "out of memory" : "cannot tokenize the text");
}

/* Append ids (n) as a turn of role with text under s's policy, making
 * room first: the turns before turn keep_from (s->n_turns: all) may go.
 * Returns the tokens the turn holds, or -errno with msg. */
static int add_ids(const struct turn_env *te, struct session *s, int32_t *ids, int n, int role,
		   const char *text, int keep_from, char *msg, size_t cap)
{
	int limit = te->limit;
	if (s->n_tokens + n > limit) {  /* could it fit at all? */
		int least = s->policy == SESS_CTX_SHIFT
				    ? least_tokens(te, s, keep_from, role, text, ids, n) : n;
		if (least < 0) {
			turn_error(te, s, least, msg, cap);
			return least == -ENOTSUP ? -EINVAL : least;
		}
		if (least > limit) {
			int kept = least - n;
			if (kept > 1)
				snprintf(msg, cap, "the turn needs %d tokens and the system prompt "
					 "before it %d: more than the %d-token context holds; send a "
					 "shorter text", n, kept, limit);
			else
				snprintf(msg, cap, "the turn needs %d tokens, more than the %d-token "
					 "context holds; send a shorter text", least, limit);
			return -EMSGSIZE;
		}
		if (s->policy != SESS_CTX_SHIFT) {
			snprintf(msg, cap, "the turn needs %d tokens; the session holds %d of its "
				 "%d-token context (its context policy is error: reopen it with "
				 "context policy shift, llamactl chat --context-policy shift, to "
				 "drop the oldest turns instead, or rewind or drop it)",
				 n, s->n_tokens, limit);
			return -EMSGSIZE;
		}
	}
	if (sess_append(s, ids, n, role, text, 1) != 0) {
		snprintf(msg, cap, "out of memory");
		return -ENOMEM;
	}
	int rc = turn_make_room(te, s, 0, keep_from < s->n_turns - 1 ? keep_from : s->n_turns - 1);
	if (rc) {  /* least_tokens said it fits: out of memory re-encoding a turn */
		sess_rewind(te->st, s);
		snprintf(msg, cap, "%s", rc == -ENOMEM ? "out of memory" : "the turn does not fit "
			 "the context with the turns it must keep; send a shorter text");
		return rc;
	}
	return s->n_tokens - s->turns[s->n_turns - 1].start;
}

int turn_append(const struct turn_env *te, struct session *s, int role, const char *text,
		char *msg, size_t cap)
{
	struct chat_ctx c = history_of(te, s);
	int32_t *ids = NULL;
	int n = chat_encode_turn(te->tok, &c, (enum chat_role)role, text, &ids);
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
	n = add_ids(te, s, ids, n, stored, text, s->n_turns, msg, cap);
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
	int n = chat_encode_generation(te->tok, &c, &ids);
	if (n <= 0) {
		if (n < 0)
			turn_error(te, s, n, msg, cap);
		return n == -ENOTSUP ? -EINVAL : n;
	}
	/* llama3's prompt opens the answer's turn; BOS alone is a raw turn */
	int role = chat_rules(s->tmpl)->prompt_opens_answer ? CHAT_ASSISTANT : CHAT_RAW;
	n = add_ids(te, s, ids, n, role, NULL, s->n_turns > 0 ? s->n_turns - 1 : 0, msg, cap);
	free(ids);
	return n < 0 ? n : role == CHAT_ASSISTANT;
}

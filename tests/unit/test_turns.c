/*
 * tests/unit/test_turns.c — daemon/turns.c: client turns joining a session
 * and the context policies (error, shift), with the real Llama 2 tokenizer
 * ($MODELS/tokenizer.model). Expected ids come from model/chat.c's
 * chat_encode_dialog (itself checked against ids made outside llamad in
 * test_chat.c): after a shift the session must hold exactly the dialog of
 * the turns that are left.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/turns.h"
#include "tests/unit/llama2_chat.h"

struct fx {
	struct model m;
	struct kvpool *pool;
	struct sess_table st;
	struct turn_env te;
};

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	if (!f || !(f->m.tok = llama2_tok())) {
		free(f);
		return -1;
	}
	f->m.cfg.bos = 1;
	f->m.cfg.eos = 2;
	f->pool = kvpool_new(64, KV_BLOCK_TOKENS, 1, 8);
	if (!f->pool || sess_table_init(&f->st, f->pool) != 0)
		return -1;
	f->te.st = &f->st;
	f->te.m = &f->m;
	f->te.limit = 4096;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;
	sess_table_done(&f->st);
	kvpool_free(f->pool);
	tok_free(f->m.tok);
	free(f);
	return 0;
}

static struct session *fresh(struct fx *f, const char *id, int tmpl, int policy)
{
	struct session *s = sess_get(&f->st, 0, id);
	if (s)
		sess_drop(&f->st, s);
	s = sess_create(&f->st, 0, id);
	assert_non_null(s);
	s->tmpl = tmpl;
	s->policy = policy;
	f->te.limit = 4096;
	return s;
}

static void add(struct fx *f, struct session *s, int role, const char *text)
{
	char msg[200];
	int n = turn_append(&f->te, s, role, text, msg, sizeof(msg));
	if (n < 0)
		fail_msg("turn_append(%s): %d %s", text, n, msg);
}

static void assert_dialog(struct fx *f, const struct session *s, const struct chat_msg *d, int n)
{
	int32_t *want = NULL;
	int nw = chat_encode_dialog(f->m.tok, CHAT_TEMPLATE_LLAMA2, d, n, &want);
	assert_true(nw > 0);
	if (s->n_tokens != nw || memcmp(s->tokens, want, (size_t)nw * sizeof(int32_t)))
		fail_msg("session holds %d tokens, the dialog %d (or they differ)", s->n_tokens, nw);
	free(want);
}

/* A session id holding the first n messages of the dialog. */
static struct session *dialog_session(struct fx *f, const char *id, int policy, int n)
{
	struct session *s = fresh(f, id, CHAT_TEMPLATE_LLAMA2, policy);
	for (int i = 0; i < n; i++)
		add(f, s, dialog[i].role, dialog[i].text);
	return s;
}

/* Turns appended one by one hold the dialog's ids; the system turn sets
 * the prompt without tokens. */
static void test_append_dialog(void **state)
{
	struct fx *f = *state;
	struct session *s = dialog_session(f, "d", SESS_CTX_ERROR, 6);
	assert_string_equal(s->system, "You are terse.");
	assert_int_equal(s->n_turns, 5);
	assert_dialog(f, s, dialog, 6);
	/* a system turn now waits for the next user turn */
	add(f, s, CHAT_SYSTEM, "Be brief.");
	assert_string_equal(s->next_system, "Be brief.");
	int before = s->n_tokens;
	add(f, s, CHAT_USER, "Hi there");
	assert_null(s->next_system);
	int32_t *u = NULL;
	int nu = chat_encode_user_turn(f->m.tok, "Be brief.", "Hi there", &u);
	assert_int_equal(s->n_tokens - before, nu);
	assert_memory_equal(s->tokens + before, u, (size_t)nu * sizeof(int32_t));
	free(u);
}

/* policy error: a turn that does not fit is refused and changes nothing. */
static void test_context_error(void **state)
{
	struct fx *f = *state;
	struct session *s = dialog_session(f, "e", SESS_CTX_ERROR, 5);
	int n = s->n_tokens;
	f->te.limit = n + 5;
	char msg[200];
	assert_int_equal(turn_append(&f->te, s, CHAT_USER, "Thanks. Bye?", msg, sizeof(msg)),
			 -EMSGSIZE);
	assert_non_null(strstr(msg, "the turn needs 13 tokens"));
	assert_int_equal(s->n_tokens, n);
	assert_int_equal(s->n_turns, 4);
	assert_int_equal(turn_make_room(&f->te, s, 6, s->n_turns), -EMSGSIZE);
	assert_int_equal(turn_make_room(&f->te, s, 5, s->n_turns), 0);
}

/* policy shift: the first exchange goes and the next user turn takes the
 * system prompt: the session is the dialog of what is left. */
static void test_context_shift(void **state)
{
	struct fx *f = *state;
	struct session *s = dialog_session(f, "s", SESS_CTX_SHIFT, 5);
	const struct chat_msg left[] = { dialog[0], dialog[3], dialog[4], dialog[5] };
	int32_t *want = NULL;
	int nw = chat_encode_dialog(f->m.tok, CHAT_TEMPLATE_LLAMA2, left, 4, &want);
	free(want);
	assert_true(nw < s->n_tokens + 13);
	f->te.limit = nw;  /* exactly what is left */
	add(f, s, CHAT_USER, "Thanks. Bye?");
	assert_int_equal(s->n_turns, 3);
	assert_dialog(f, s, left, 4);
	/* a token of the answer (as a generation asks): the exchange before
	 * the one being answered goes, never that one */
	f->te.limit = s->n_tokens;
	assert_int_equal(turn_last_user(s), 2);
	assert_int_equal(turn_make_room(&f->te, s, 1, turn_last_user(s)), 0);
	const struct chat_msg last[] = { dialog[0], dialog[5] };
	assert_dialog(f, s, last, 2);
	f->te.limit = s->n_tokens;
	assert_int_equal(turn_make_room(&f->te, s, 1, turn_last_user(s)), -EMSGSIZE);
	assert_dialog(f, s, last, 2);
}

/* raw shift: any turn boundary; the new first turn gets BOS. */
static void test_raw_shift(void **state)
{
	struct fx *f = *state;
	struct session *s = fresh(f, "r", CHAT_TEMPLATE_RAW, SESS_CTX_SHIFT);
	add(f, s, CHAT_USER, "Once upon a time");
	add(f, s, CHAT_USER, " there was a dog");
	add(f, s, CHAT_USER, " and a cat");
	assert_int_equal(s->tokens[0], 1);
	int second = s->turns[1].start, third = s->turns[2].start;
	int32_t keep[64];
	int nk = s->n_tokens - second;
	memcpy(keep, s->tokens + second, (size_t)nk * sizeof(int32_t));
	f->te.limit = s->n_tokens - second + 1 + 2;
	assert_int_equal(turn_make_room(&f->te, s, 2, s->n_turns), 0);
	assert_int_equal(s->n_turns, 2);
	assert_int_equal(s->n_tokens, nk + 1);
	assert_int_equal(s->tokens[0], 1);
	assert_memory_equal(s->tokens + 1, keep, (size_t)nk * sizeof(int32_t));
	assert_int_equal(s->turns[1].start, third - second + 1);
	assert_int_equal(s->turns[0].role, CHAT_RAW);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_append_dialog),
		cmocka_unit_test(test_context_error),
		cmocka_unit_test(test_context_shift),
		cmocka_unit_test(test_raw_shift),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}

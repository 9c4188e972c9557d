/*
 * tests/unit/test_turns.c — session/turns.c: client turns joining a session
 * and the context policies (error, shift), with the real Llama 2 tokenizer
 * ($MODELS/tokenizer.model). Expected ids come from text/chat.c's
 * chat_encode_dialog (itself checked against ids made outside llamad in
 * test_chat.c): after a shift the session must hold exactly the dialog of
 * the turns that are left. The second group does the same for the Llama 3
 * template with the real Llama 3 tokenizer
 * ($MODELS/llama3-tokenizer/tokenizer.json), against chat_encode_dialog
 * (checked against tests/golden/llama3/chat.json in test_chat.c).
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

#include "session/turns.h"
#include "tests/unit/llama2_chat.h"

struct fx {
	struct tok *tok;         /* te.tok, owned */
	struct kvpool *pool;
	struct sess_table st;
	struct turn_env te;
};

/* The fixture over tokenizer t (NULL: fails; its loader said why), the
 * model's BOS and EOS bos and eos (-1: the tokenizer's). */
static int fx_setup(void **state, struct tok *t, int bos, int eos)
{
	struct fx *f = t ? calloc(1, sizeof(*f)) : NULL;
	if (!f) {
		tok_free(t);
		return -1;
	}
	f->tok = t;
	f->te.tok = t;
	f->te.bos = bos >= 0 ? bos : tok_bos(t);
	f->te.eos = eos >= 0 ? eos : tok_eos(t);
	f->pool = kvpool_new(64, KV_BLOCK_TOKENS, 1, 8);
	if (!f->pool || sess_table_init(&f->st, f->pool) != 0)
		return -1;
	f->te.st = &f->st;
	f->te.limit = 4096;
	*state = f;
	return 0;
}

static int setup(void **state)
{
	return fx_setup(state, llama2_tok(), 1, 2);
}

static int teardown(void **state)
{
	struct fx *f = *state;
	sess_table_done(&f->st);
	kvpool_free(f->pool);
	tok_free(f->tok);
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

/* s holds exactly the ids of the dialog d[0..n) in template tmpl (both
 * printed if not). */
static void assert_holds(struct fx *f, const struct session *s, int tmpl,
			 const struct chat_msg *d, int n)
{
	int32_t *want = NULL;
	int nw = chat_encode_dialog(f->te.tok, tmpl, d, n, &want);
	assert_true(nw > 0);
	if (s->n_tokens != nw || memcmp(s->tokens, want, (size_t)nw * sizeof(int32_t))) {
		fprintf(stderr, "session:");
		for (int i = 0; i < s->n_tokens; i++)
			fprintf(stderr, " %d", s->tokens[i]);
		fprintf(stderr, "\ndialog: ");
		for (int i = 0; i < nw; i++)
			fprintf(stderr, " %d", want[i]);
		fprintf(stderr, "\n");
		fail_msg("session holds %d tokens, the dialog %d (or they differ)", s->n_tokens, nw);
	}
	free(want);
}

static void assert_dialog(struct fx *f, const struct session *s, const struct chat_msg *d, int n)
{
	assert_holds(f, s, CHAT_TEMPLATE_LLAMA2, d, n);
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
	int nu = chat_encode_user_turn(f->te.tok, "Be brief.", "Hi there", &u);
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
	int nw = chat_encode_dialog(f->te.tok, CHAT_TEMPLATE_LLAMA2, left, 4, &want);
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

/* policy shift, the new rule: what a new turn must keep is the system
 * prompt; every exchange before it may go, the most recent one included
 * (an answer that filled the context must not end the conversation). */
static void test_shift_drops_the_last_exchange(void **state)
{
	struct fx *f = *state;
	struct session *s = dialog_session(f, "last", SESS_CTX_SHIFT, 5);
	const struct chat_msg left[] = { dialog[0], dialog[5] };
	int32_t *want = NULL;
	int nw = chat_encode_dialog(f->te.tok, CHAT_TEMPLATE_LLAMA2, left, 2, &want);
	free(want);
	f->te.limit = nw;  /* room for the system prompt and the new turn only */
	add(f, s, CHAT_USER, dialog[5].text);
	assert_int_equal(s->n_turns, 1);
	assert_dialog(f, s, left, 2);
	/* a session whose one exchange fills the context: the next turn
	 * replaces it (before, it was refused: "the turns it must keep") */
	s = dialog_session(f, "full", SESS_CTX_SHIFT, 3);
	f->te.limit = s->n_tokens;
	const struct chat_msg then[] = { dialog[0], { CHAT_USER, "More?" } };
	nw = chat_encode_dialog(f->te.tok, CHAT_TEMPLATE_LLAMA2, then, 2, &want);
	free(want);
	assert_true(nw <= s->n_tokens);
	add(f, s, CHAT_USER, then[1].text);
	assert_int_equal(s->n_turns, 1);
	assert_dialog(f, s, then, 2);
	/* the turn the room was made for holds what its first-turn encoding
	 * holds, and turn_append says so */
	s = dialog_session(f, "count", SESS_CTX_SHIFT, 3);
	f->te.limit = s->n_tokens;
	char msg[200];
	int n = turn_append(&f->te, s, CHAT_USER, "More?", msg, sizeof(msg));
	assert_int_equal(n, s->n_tokens);
}

/* policy shift: a turn that could not fit even with the system prompt
 * alone is refused, and nothing of the session goes. */
static void test_shift_refuses_what_never_fits(void **state)
{
	struct fx *f = *state;
	struct session *s = dialog_session(f, "never", SESS_CTX_SHIFT, 5);
	int n = s->n_tokens, turns = s->n_turns;
	int32_t *before = malloc((size_t)n * sizeof(int32_t));
	assert_non_null(before);
	memcpy(before, s->tokens, (size_t)n * sizeof(int32_t));
	const struct chat_msg left[] = { dialog[0], dialog[5] };
	int32_t *want = NULL;
	int nw = chat_encode_dialog(f->te.tok, CHAT_TEMPLATE_LLAMA2, left, 2, &want);
	free(want);
	f->te.limit = nw - 1;
	char msg[256];
	assert_int_equal(turn_append(&f->te, s, CHAT_USER, dialog[5].text, msg, sizeof(msg)),
			 -EMSGSIZE);
	assert_non_null(strstr(msg, "and the system prompt before it"));
	assert_non_null(strstr(msg, "send a shorter text"));
	assert_int_equal(s->n_tokens, n);
	assert_int_equal(s->n_turns, turns);
	assert_memory_equal(s->tokens, before, (size_t)n * sizeof(int32_t));
	/* without a system prompt: the turn alone is too long */
	struct session *o = fresh(f, "never-nosys", CHAT_TEMPLATE_LLAMA2, SESS_CTX_SHIFT);
	add(f, o, CHAT_USER, dialog[1].text);
	f->te.limit = o->n_tokens + 2;
	assert_int_equal(turn_append(&f->te, o, CHAT_USER, "a text of many more words than two",
				     msg, sizeof(msg)), -EMSGSIZE);
	assert_non_null(strstr(msg, "more than the"));
	assert_null(strstr(msg, "system prompt"));
	assert_int_equal(o->n_turns, 1);
	free(before);
}

/* raw under shift: every earlier turn may go; the new turn gets BOS. */
static void test_raw_shift_new_turn(void **state)
{
	struct fx *f = *state;
	struct session *s = fresh(f, "rn", CHAT_TEMPLATE_RAW, SESS_CTX_SHIFT);
	add(f, s, CHAT_USER, "Once upon a time");
	add(f, s, CHAT_USER, " there was a dog");
	int32_t *ids = NULL;
	int n = tok_encode(f->te.tok, "The end", 7, 1, &ids);
	f->te.limit = n;
	add(f, s, CHAT_USER, "The end");
	assert_int_equal(s->n_turns, 1);
	assert_int_equal(s->n_tokens, n);
	assert_memory_equal(s->tokens, ids, (size_t)n * sizeof(int32_t));
	free(ids);
}

/* n token ids of an answer "generated": ids 1000, 1001, ... */
static void generated(struct session *s, int n, int new_turn)
{
	for (int i = 0; i < n; i++) {
		int32_t id = 1000 + i;
		assert_int_equal(sess_append(s, &id, 1, CHAT_ASSISTANT, NULL, new_turn && i == 0), 0);
	}
}

/* An answer that fills the context while it is generated: the exchanges
 * before its question go first, whole, and are counted. */
static void test_slide_drops_exchanges_first(void **state)
{
	struct fx *f = *state;
	struct session *s = dialog_session(f, "sl1", SESS_CTX_SHIFT, 6);
	generated(s, 10, 1);
	int q = s->turns[4].start, n = s->n_tokens;
	int before = q - s->turns[0].start;  /* the two exchanges before the question */
	int32_t *u = NULL;
	int nu = chat_encode_user_turn(f->te.tok, dialog[0].text, dialog[5].text, &u);
	int moved = nu - (s->turns[5].start - q);   /* the system prompt moves to it */
	f->te.limit = n;
	int keep = 4;
	assert_int_equal(turn_slide(&f->te, s, &keep, 1), 0);
	assert_int_equal(keep, 0);
	assert_int_equal(s->n_turns, 2);
	assert_int_equal(s->shift_turns, 4);
	assert_int_equal(s->shift_tokens, (uint64_t)(before - moved));
	assert_int_equal(s->turns[1].slid, 0);
	/* what is left is the question (with the system prompt) and the answer */
	assert_int_equal(s->turns[1].start, nu);
	assert_memory_equal(s->tokens, u, (size_t)nu * sizeof(int32_t));
	assert_int_equal(s->tokens[nu], 1000);
	assert_int_equal(s->n_tokens, nu + 10);
	free(u);
}

/* The answer alone fills the context: its oldest tokens slide out, half of
 * what the question leaves is free after, the question stays whole. */
static void test_slide_the_answer(void **state)
{
	struct fx *f = *state;
	struct session *s = fresh(f, "sl2", CHAT_TEMPLATE_LLAMA2, SESS_CTX_SHIFT);
	add(f, s, CHAT_USER, "Tell me a story.");
	int q = s->n_tokens;
	generated(s, 100, 1);
	f->te.limit = s->n_tokens;
	int keep = 0;
	assert_int_equal(turn_slide(&f->te, s, &keep, 1), 0);
	int room = 100 / 2;
	assert_int_equal(s->n_tokens, f->te.limit - room);
	assert_int_equal(s->n_turns, 2);
	assert_int_equal(s->turns[1].start, q);
	assert_int_equal(s->turns[1].slid, room);
	assert_int_equal(s->tokens[q], 1000 + room);      /* the newer half stays */
	assert_int_equal(s->tokens[s->n_tokens - 1], 1099);
	assert_int_equal(s->shift_turns, 0);
	assert_int_equal(s->shift_tokens, (uint64_t)room);
	assert_true(s->n_cached <= q);                   /* the rest is prefilled again */
	/* and again, as the answer grows */
	generated(s, room, 0);
	assert_int_equal(turn_slide(&f->te, s, &keep, 1), 0);
	assert_int_equal(s->turns[1].slid, 2 * room);
	/* policy error: nothing moves */
	s->policy = SESS_CTX_ERROR;
	generated(s, room, 0);
	int n = s->n_tokens;
	assert_int_equal(turn_slide(&f->te, s, &keep, 1), -EMSGSIZE);
	assert_int_equal(s->n_tokens, n);
	/* the question alone fills the context: nothing can slide */
	struct session *o = fresh(f, "sl3", CHAT_TEMPLATE_LLAMA2, SESS_CTX_SHIFT);
	add(f, o, CHAT_USER, "Tell me a story.");
	f->te.limit = o->n_tokens;
	keep = 0;
	assert_int_equal(turn_slide(&f->te, o, &keep, 0), -EMSGSIZE);
	assert_int_equal(o->n_tokens, f->te.limit);
}

/* A continuation (no prompt; the answer not yet open): the answer it
 * continues slides; one slid whole goes whole. */
static void test_slide_continuation(void **state)
{
	struct fx *f = *state;
	struct session *s = fresh(f, "sl4", CHAT_TEMPLATE_LLAMA2, SESS_CTX_SHIFT);
	add(f, s, CHAT_USER, "Tell me a story.");
	int q = s->n_tokens;
	generated(s, 40, 1);
	generated(s, 2, 1);   /* an earlier continuation, short */
	f->te.limit = s->n_tokens;
	int keep = s->n_turns;   /* the next answer's turn */
	assert_int_equal(turn_slide(&f->te, s, &keep, 0), 0);
	assert_int_equal(s->n_turns, 3);
	assert_int_equal(s->turns[1].slid, 21);
	assert_int_equal(s->tokens[q], 1021);
	assert_int_equal(keep, 3);
	/* the first answer slid whole goes whole; the last turn stays */
	f->te.limit = s->n_tokens - 19;
	assert_int_equal(turn_slide(&f->te, s, &keep, 0), 0);
	assert_int_equal(s->n_turns, 2);
	assert_int_equal(keep, 2);
	assert_int_equal(s->shift_turns, 1);
	assert_int_equal(s->turns[1].start, q);
	assert_true(s->n_tokens < f->te.limit);
}

/* A llama3 session under a model without the Llama 3 vocabulary (one
 * saved under another model): refused, saying why; nothing added. */
static void test_llama3_needs_its_vocabulary(void **state)
{
	struct fx *f = *state;
	struct session *s = fresh(f, "l3-on-l2", CHAT_TEMPLATE_LLAMA3, SESS_CTX_ERROR);
	char msg[256];
	assert_int_equal(turn_append(&f->te, s, CHAT_USER, "hi", msg, sizeof(msg)), -EINVAL);
	assert_non_null(strstr(msg, "template llama3: the llama3 template needs the Llama 3 vocabulary"));
	assert_int_equal(turn_generation(&f->te, s, msg, sizeof(msg)), -EINVAL);
	assert_int_equal(s->n_tokens, 0);
	assert_int_equal(s->n_turns, 0);
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

/* ---- Llama 3 ------------------------------------------------------------------ */

#define EOT 128009

/* BOS and EOS the tokenizer's: EOS is <|end_of_text|>, not the turn's end */
static int l3_setup(void **state)
{
	return fx_setup(state, llama3_tok(), -1, -1);
}

static void assert_l3(struct fx *f, const struct session *s, const struct chat_msg *d, int n)
{
	assert_holds(f, s, CHAT_TEMPLATE_LLAMA3, d, n);
}

static const struct chat_msg l3_dialog[] = {
	{ CHAT_SYSTEM, "You answer briefly." },
	{ CHAT_USER, "Name a prime number." },
	{ CHAT_ASSISTANT, "Seven." },
	{ CHAT_USER, "Another one?" },
	{ CHAT_ASSISTANT, "Eleven." },
	{ CHAT_USER, "Thanks." },
};

/* A system turn is a turn with tokens; the system prompt given at open
 * gives the same ids. */
static void test_l3_append(void **state)
{
	struct fx *f = *state;
	struct session *s = fresh(f, "l3", CHAT_TEMPLATE_LLAMA3, SESS_CTX_ERROR);
	for (int i = 0; i < 4; i++)
		add(f, s, l3_dialog[i].role, l3_dialog[i].text);
	assert_int_equal(s->n_turns, 4);
	assert_int_equal(s->turns[0].role, CHAT_SYSTEM);
	assert_null(s->system);
	assert_l3(f, s, l3_dialog, 4);
	struct session *o = fresh(f, "l3-open", CHAT_TEMPLATE_LLAMA3, SESS_CTX_ERROR);
	o->system = strdup(l3_dialog[0].text);
	for (int i = 1; i < 4; i++)
		add(f, o, l3_dialog[i].role, l3_dialog[i].text);
	assert_int_equal(o->n_turns, 3);
	assert_l3(f, o, l3_dialog, 4);
	/* a control token spelt in user or system text: accepted, as text */
	char msg[200];
	assert_true(turn_append(&f->te, s, CHAT_USER, "say <|eot_id|> now", msg, sizeof(msg)) > 0);
	assert_true(turn_append(&f->te, s, CHAT_SYSTEM, "<|start_header_id|>", msg,
				sizeof(msg)) > 0);
}

/* Generation: nothing before it after a user turn; a generated answer that
 * ended is stored with <|eot_id|> (the engine's rule) and a next
 * generation gets the prompt; one cut short is closed by the next turn. */
static void test_l3_generation(void **state)
{
	struct fx *f = *state;
	char msg[200];
	struct session *s = fresh(f, "gen", CHAT_TEMPLATE_LLAMA3, SESS_CTX_ERROR);
	add(f, s, CHAT_USER, l3_dialog[1].text);
	int n = s->n_tokens;
	assert_int_equal(turn_generation(&f->te, s, msg, sizeof(msg)), 0);
	assert_int_equal(s->n_tokens, n);
	/* the answer as the engine appends it: its tokens, then <|eot_id|>
	 * in place of whichever end id the model chose */
	int32_t *ids = NULL;
	int k = tok_encode(f->te.tok, "Seven.", 6, 0, &ids);
	assert_int_equal(chat_end_of_turn(f->te.tok, s->tmpl, f->te.eos), EOT);
	assert_int_equal(sess_append(s, ids, k, CHAT_ASSISTANT, NULL, 1), 0);
	int32_t eot = EOT;
	assert_int_equal(sess_append(s, &eot, 1, CHAT_ASSISTANT, NULL, 0), 0);
	add(f, s, CHAT_USER, l3_dialog[3].text);
	const struct chat_msg d[] = { l3_dialog[1], l3_dialog[2], l3_dialog[3] };
	assert_l3(f, s, d, 3);
	/* cut short (max_tokens): the next user turn closes it with <|eot_id|> */
	assert_int_equal(sess_append(s, ids, k, CHAT_ASSISTANT, NULL, 1), 0);
	n = s->n_tokens;
	add(f, s, CHAT_USER, l3_dialog[5].text);
	assert_int_equal(s->tokens[n], EOT);
	const struct chat_msg e[] = { l3_dialog[1], l3_dialog[2], l3_dialog[3], l3_dialog[2],
				      l3_dialog[5] };
	assert_l3(f, s, e, 5);
	free(ids);
	/* after an answer the client wrote: the prompt opens an answer turn */
	add(f, s, CHAT_ASSISTANT, "You're welcome.");
	n = s->n_tokens;
	assert_int_equal(turn_generation(&f->te, s, msg, sizeof(msg)), 1);
	assert_int_equal(s->n_turns, 7);
	assert_int_equal(s->turns[6].role, CHAT_ASSISTANT);
	const int32_t prompt[] = { 128006, 78191, 128007, 271 };
	assert_int_equal(s->n_tokens - n, 4);
	assert_memory_equal(s->tokens + n, prompt, sizeof(prompt));
	/* an empty session with a system prompt: BOS, the system message, the prompt */
	struct session *o = fresh(f, "gen-open", CHAT_TEMPLATE_LLAMA3, SESS_CTX_ERROR);
	o->system = strdup(l3_dialog[0].text);
	assert_int_equal(turn_generation(&f->te, o, msg, sizeof(msg)), 1);
	int32_t *want = NULL;
	int nw = chat_encode_dialog(f->te.tok, CHAT_TEMPLATE_LLAMA3, l3_dialog, 1, &want);
	assert_int_equal(o->n_tokens, nw);
	assert_memory_equal(o->tokens, want, (size_t)nw * sizeof(int32_t));
	free(want);
}

/* Shift keeps the leading system turns (or the system prompt given at
 * open) and drops the first exchange after them. */
static void test_l3_shift(void **state)
{
	struct fx *f = *state;
	for (int at_open = 0; at_open < 2; at_open++) {
		struct session *s = fresh(f, "l3s", CHAT_TEMPLATE_LLAMA3, SESS_CTX_SHIFT);
		if (at_open)
			s->system = strdup(l3_dialog[0].text);
		for (int i = at_open; i < 5; i++)
			add(f, s, l3_dialog[i].role, l3_dialog[i].text);
		const struct chat_msg left[] = { l3_dialog[0], l3_dialog[3], l3_dialog[4],
						 l3_dialog[5] };
		int32_t *want = NULL;
		int nw = chat_encode_dialog(f->te.tok, CHAT_TEMPLATE_LLAMA3, left, 4, &want);
		free(want);
		f->te.limit = nw;
		add(f, s, CHAT_USER, l3_dialog[5].text);
		assert_int_equal(s->n_turns, 4 - at_open);
		assert_l3(f, s, left, 4);
		/* a generation's token: the exchange before the one answered goes */
		f->te.limit = s->n_tokens;
		assert_int_equal(turn_make_room(&f->te, s, 1, turn_last_user(s)), 0);
		const struct chat_msg last[] = { l3_dialog[0], l3_dialog[5] };
		assert_l3(f, s, last, 2);
		f->te.limit = s->n_tokens;
		assert_int_equal(turn_make_room(&f->te, s, 1, turn_last_user(s)), -EMSGSIZE);
		assert_l3(f, s, last, 2);
	}
	/* the turn after a dropped answer that was cut short loses the
	 * <|eot_id|> that closed it */
	struct session *s = fresh(f, "l3c", CHAT_TEMPLATE_LLAMA3, SESS_CTX_SHIFT);
	add(f, s, CHAT_SYSTEM, l3_dialog[0].text);
	add(f, s, CHAT_USER, l3_dialog[1].text);
	int32_t *ids = NULL;
	int k = tok_encode(f->te.tok, "Seven", 5, 0, &ids);
	assert_int_equal(sess_append(s, ids, k, CHAT_ASSISTANT, NULL, 1), 0);
	free(ids);
	add(f, s, CHAT_USER, l3_dialog[3].text);
	assert_int_equal(s->tokens[s->turns[3].start], EOT);
	f->te.limit = s->n_tokens;
	assert_int_equal(turn_make_room(&f->te, s, 1, turn_last_user(s)), 0);
	const struct chat_msg left[] = { l3_dialog[0], l3_dialog[3] };
	assert_l3(f, s, left, 2);
}

/* The new rule under llama3: the leading system turns stay, the last
 * exchange goes (a cut-short answer's <|eot_id|> with it), the new turn
 * is encoded where it now stands. */
static void test_l3_shift_new_turn(void **state)
{
	struct fx *f = *state;
	struct session *s = fresh(f, "l3n", CHAT_TEMPLATE_LLAMA3, SESS_CTX_SHIFT);
	add(f, s, CHAT_SYSTEM, l3_dialog[0].text);
	add(f, s, CHAT_USER, l3_dialog[1].text);
	int32_t *ids = NULL;
	int k = tok_encode(f->te.tok, "Seven", 5, 0, &ids);
	assert_int_equal(sess_append(s, ids, k, CHAT_ASSISTANT, NULL, 1), 0);
	free(ids);
	f->te.limit = s->n_tokens;
	add(f, s, CHAT_USER, l3_dialog[3].text);
	const struct chat_msg left[] = { l3_dialog[0], l3_dialog[3] };
	assert_int_equal(s->n_turns, 2);
	assert_l3(f, s, left, 2);
	/* the generation prompt after a finished answer: the exchange it
	 * follows stays, the ones before it go */
	struct session *g = fresh(f, "l3g", CHAT_TEMPLATE_LLAMA3, SESS_CTX_SHIFT);
	for (int i = 0; i < 5; i++)
		add(f, g, l3_dialog[i].role, l3_dialog[i].text);
	f->te.limit = g->n_tokens + 3;  /* the prompt takes 4 */
	char msg[200];
	assert_int_equal(turn_generation(&f->te, g, msg, sizeof(msg)), 1);
	assert_int_equal(g->n_turns, 4);
	assert_int_equal(g->turns[1].role, CHAT_USER);
	const struct chat_msg kept[] = { l3_dialog[0], l3_dialog[3], l3_dialog[4] };
	int32_t *want = NULL;
	int nw = chat_encode_dialog(f->te.tok, CHAT_TEMPLATE_LLAMA3, kept, 3, &want);
	assert_int_equal(g->n_tokens, nw);   /* the dialog ends with the prompt */
	assert_memory_equal(g->tokens, want, (size_t)nw * sizeof(int32_t));
	free(want);
}

/* llama3: an answer the generation prompt opened keeps its header when it
 * slides. */
static void test_l3_slide_keeps_the_header(void **state)
{
	struct fx *f = *state;
	char msg[200];
	struct session *s = fresh(f, "l3sl", CHAT_TEMPLATE_LLAMA3, SESS_CTX_SHIFT);
	add(f, s, CHAT_SYSTEM, l3_dialog[0].text);
	assert_int_equal(turn_generation(&f->te, s, msg, sizeof(msg)), 1);
	int a = s->turns[1].start, head = s->n_tokens - a;
	assert_int_equal(head, 4);
	generated(s, 60, 0);
	f->te.limit = s->n_tokens;
	int keep = 1;
	assert_int_equal(turn_slide(&f->te, s, &keep, 1), 0);
	const int32_t prompt[] = { 128006, 78191, 128007, 271 };
	assert_memory_equal(s->tokens + a, prompt, sizeof(prompt));
	assert_int_equal(s->tokens[a + 4], 1000 + 30);
	assert_int_equal(s->turns[1].slid, 30);
	assert_int_equal(s->n_turns, 2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_append_dialog),
		cmocka_unit_test(test_context_error),
		cmocka_unit_test(test_context_shift),
		cmocka_unit_test(test_raw_shift),
		cmocka_unit_test(test_shift_drops_the_last_exchange),
		cmocka_unit_test(test_shift_refuses_what_never_fits),
		cmocka_unit_test(test_raw_shift_new_turn),
		cmocka_unit_test(test_slide_drops_exchanges_first),
		cmocka_unit_test(test_slide_the_answer),
		cmocka_unit_test(test_slide_continuation),
		cmocka_unit_test(test_llama3_needs_its_vocabulary),
	};
	const struct CMUnitTest l3_tests[] = {
		cmocka_unit_test(test_l3_append),
		cmocka_unit_test(test_l3_generation),
		cmocka_unit_test(test_l3_shift),
		cmocka_unit_test(test_l3_shift_new_turn),
		cmocka_unit_test(test_l3_slide_keeps_the_header),
	};
	int failed = cmocka_run_group_tests(tests, setup, teardown);
	return failed + cmocka_run_group_tests(l3_tests, l3_setup, teardown);
}

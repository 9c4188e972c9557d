/*
 * tests/unit/test_chat.c — the Llama 2 chat template (text/chat.c) with the
 * real Llama 2 tokenizer ($MODELS/tokenizer.model, default ../shared/models).
 *
 * Provenance of the expected ids. They were NOT produced by llamad: each
 * exchange string, formed as Meta's llama reference (generation.py,
 * chat_completion) forms it, was encoded with the sentencepiece command-line
 * tool `spm_encode --model=tokenizer.model --output_format=id`, then BOS (1)
 * and EOS (2) were added by hand (every finished exchange: BOS ... EOS; the
 * last, open user turn: BOS only). spm_encode reads one line per input, so
 * the strings with '\n' were encoded by this python3 helper around it:
 *
 *   def spm(lines):   # one spm_encode run, one id list per input line
 *       out = subprocess.run(['spm_encode', '--model=' + MODEL,
 *                             '--output_format=id'],
 *                            input=''.join(l + '\n' for l in lines).encode(),
 *                            capture_output=True, check=True).stdout.decode()
 *       return [[int(x) for x in l.split()] for l in out.split('\n')[:len(lines)]]
 *   def encode(s):
 *       segs = s.split('\n')
 *       enc = spm([segs[0] + '\x01'] + ['\x01' + x for x in segs[1:]])
 *       ids = enc[0][:-1]                    # drop <0x01> (4)
 *       for e in enc[1:]:
 *           assert e[:2] == [29871, 4]       # drop dummy-prefix '▁', <0x01>
 *           ids += [13] + e[2:]              # 13 = <0x0A>, the newline
 *       return ids
 *
 * Why this is exact: no Llama 2 piece contains '\n' (it is byte-fallback
 * <0x0A>) or '\x01', so BPE never merges across them and the whole-string
 * encoding is the concatenation of the segments' encodings, where only the
 * first segment gets the dummy-prefix '▁'. Prefixing a segment with '\x01'
 * makes spm_encode spend its dummy prefix on a lone '▁' (29871) before
 * <0x01> (4), both dropped. The helper was checked against all 47 strings
 * of llama.cpp's ggml-vocab-llama-spm.gguf.inp/.out (7 contain newlines):
 * 0 mismatches.
 *
 * Exchanges encoded:
 *   "[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi there [/INST] Hello! "
 *   "[INST] What is 2+2? [/INST] 4 "
 *   "[INST] Thanks. Bye? [/INST]"
 *   "[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi there [/INST]"
 *   "[INST] Hi there [/INST]"
 *
 * The Llama 3 template (second group) with the real Llama 3 tokenizer
 * ($MODELS/llama3-tokenizer/tokenizer.json). Expected ids: the cases of
 * tests/golden/llama3/chat.json, NOT produced by llamad: the model's
 * tokenizer_config.json chat_template rendered by @huggingface/jinja and
 * encoded by @huggingface/tokenizers with special tokens recognised
 * (tests/golden/llama3/make_goldens.mjs says how). Every case must match
 * chat_encode_dialog exactly, and a session built turn by turn with
 * chat_encode_turn must hold the same ids.
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
#include <jansson.h>

#include "llamad.pb-c.h"
#include "proto/names.h"
#include "tests/unit/llama2_chat.h"

/* BOS "[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi there [/INST] Hello! " EOS */
static const int32_t ex1[] = {
	1, 518, 25580, 29962, 3532, 14816, 29903, 6778, 13, 3492, 526, 1935, 344,
	29889, 13, 29966, 829, 14816, 29903, 6778, 13, 13, 18567, 727, 518, 29914,
	25580, 29962, 15043, 29991, 29871, 2,
};
/* BOS "[INST] What is 2+2? [/INST] 4 " EOS */
static const int32_t ex2[] = {
	1, 518, 25580, 29962, 1724, 338, 29871, 29906, 29974, 29906, 29973, 518,
	29914, 25580, 29962, 29871, 29946, 29871, 2,
};
/* BOS "[INST] Thanks. Bye? [/INST]" */
static const int32_t ex3[] = {
	1, 518, 25580, 29962, 1834, 29889, 2648, 29872, 29973, 518, 29914, 25580,
	29962,
};
/* BOS "[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi there [/INST]" */
static const int32_t sys_turn[] = {
	1, 518, 25580, 29962, 3532, 14816, 29903, 6778, 13, 3492, 526, 1935, 344,
	29889, 13, 29966, 829, 14816, 29903, 6778, 13, 13, 18567, 727, 518, 29914,
	25580, 29962,
};
/* BOS "[INST] Hi there [/INST]" */
static const int32_t hi_turn[] = { 1, 518, 25580, 29962, 6324, 727, 518, 29914, 25580, 29962 };

#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

static int setup(void **state)
{
	*state = llama2_tok();
	return *state ? 0 : -1;
}

static int teardown(void **state)
{
	tok_free(*state);
	return 0;
}

static void assert_ids(const int32_t *got, int n, const int32_t *want, int nw)
{
	if (n != nw || memcmp(got, want, (size_t)n * sizeof(int32_t))) {
		fprintf(stderr, "got %d ids:", n);
		for (int i = 0; i < n; i++)
			fprintf(stderr, " %d", got[i]);
		fprintf(stderr, "\nwant %d ids:", nw);
		for (int i = 0; i < nw; i++)
			fprintf(stderr, " %d", want[i]);
		fprintf(stderr, "\n");
		fail();
	}
}

static void test_three_turns(void **state)
{
	const struct tok *t = *state;
	assert_int_equal(tok_bos(t), 1);
	assert_int_equal(tok_eos(t), 2);
	int32_t want[N_OF(ex1) + N_OF(ex2) + N_OF(ex3)];
	memcpy(want, ex1, sizeof(ex1));
	memcpy(want + N_OF(ex1), ex2, sizeof(ex2));
	memcpy(want + N_OF(ex1) + N_OF(ex2), ex3, sizeof(ex3));
	int32_t *ids = NULL;
	int n = chat_encode_dialog(t, CHAT_TEMPLATE_LLAMA2, dialog, N_OF(dialog), &ids);
	assert_true(n > 0);
	assert_ids(ids, n, want, N_OF(want));
	free(ids);

	/* the dialog closed after the second answer: ex1 + ex2, no open turn */
	n = chat_encode_dialog(t, CHAT_TEMPLATE_LLAMA2, dialog, 5, &ids);
	assert_ids(ids, n, want, N_OF(ex1) + N_OF(ex2));
	free(ids);
}

/* chat_encode_user_turn equals the matching last part of a dialog. */
static void test_user_turn(void **state)
{
	const struct tok *t = *state;
	int32_t *ids = NULL, *d = NULL;
	int n = chat_encode_user_turn(t, NULL, "Thanks. Bye?", &ids);
	assert_ids(ids, n, ex3, N_OF(ex3));
	int nd = chat_encode_dialog(t, CHAT_TEMPLATE_LLAMA2, dialog, N_OF(dialog), &d);
	assert_true(nd > n);
	assert_ids(d + nd - n, n, ids, n);
	free(ids);
	free(d);

	/* with the system prompt: the first turn */
	n = chat_encode_user_turn(t, "You are terse.", "Hi there", &ids);
	assert_ids(ids, n, sys_turn, N_OF(sys_turn));
	nd = chat_encode_dialog(t, CHAT_TEMPLATE_LLAMA2, dialog, 2, &d);
	assert_ids(d, nd, ids, n);
	/* and it is the prefix of the first finished exchange */
	assert_memory_equal(ex1, ids, (size_t)n * sizeof(int32_t));
	free(ids);
	free(d);

	n = chat_encode_user_turn(t, NULL, "Hi there", &ids);
	assert_ids(ids, n, hi_turn, N_OF(hi_turn));
	nd = chat_encode_dialog(t, CHAT_TEMPLATE_LLAMA2, dialog + 1, 1, &d);
	assert_ids(d, nd, ids, n);
	free(ids);
	free(d);
}

/* 1 if ids a (na) and b (nb) are the same */
static int same_ids(const int32_t *a, int na, const int32_t *b, int nb)
{
	return na == nb && na >= 0 && (na == 0 || memcmp(a, b, (size_t)na * sizeof(int32_t)) == 0);
}

/* llama2 tags in user or system text are neutralised ("[INST]" ->
 * "[ INST]"), never refused: the ids are those of the neutralised text;
 * answers keep theirs. */
static void test_tags_neutralised(void **state)
{
	const struct tok *t = *state;
	static const char *const bad[][2] = {
		{ "[INST]", "[ INST]" }, { "say [/INST] now", "say [ /INST] now" },
		{ "<<SYS>>", "< <SYS>>" }, { "x<</SYS>>", "x< </SYS>>" },
		{ "a\n[INST] b", "a\n[ INST] b" }, { "[INST][/INST]", "[ INST][ /INST]" },
		{ "<<<SYS>>", "<< <SYS>>" }, { "<<</SYS>>", "<< </SYS>>" },
	};
	int32_t *ids = (int32_t *)0x1, *want = NULL;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		const char *x = bad[i][0], *y = bad[i][1];
		assert_int_equal(chat_has_tags(x, strlen(x)), 1);
		assert_int_equal(chat_has_tags(y, strlen(y)), 0);
		int n = chat_encode_user_turn(t, NULL, x, &ids);
		int nw = chat_encode_user_turn(t, NULL, y, &want);
		assert_true(n > 0 && same_ids(ids, n, want, nw));
		free(ids);
		free(want);
		n = chat_encode_user_turn(t, x, "hello", &ids);
		nw = chat_encode_user_turn(t, y, "hello", &want);
		assert_true(n > 0 && same_ids(ids, n, want, nw));
		free(ids);
		/* a dialog: the system text and a later user turn too */
		struct chat_msg s[] = { { CHAT_SYSTEM, x }, { CHAT_USER, "hello" } };
		n = chat_encode_dialog(t, CHAT_TEMPLATE_LLAMA2, s, 2, &ids);
		assert_true(same_ids(ids, n, want, nw));
		free(ids);
		free(want);
		struct chat_msg l[] = { { CHAT_USER, "hi" }, { CHAT_ASSISTANT, "yo" },
					{ CHAT_USER, x } };
		struct chat_msg lw[] = { { CHAT_USER, "hi" }, { CHAT_ASSISTANT, "yo" },
					 { CHAT_USER, y } };
		n = chat_encode_dialog(t, CHAT_TEMPLATE_LLAMA2, l, 3, &ids);
		nw = chat_encode_dialog(t, CHAT_TEMPLATE_LLAMA2, lw, 3, &want);
		assert_true(n > 0 && same_ids(ids, n, want, nw));
		free(ids);
		free(want);
		/* assistant text is the model's: kept as it is */
		struct chat_msg a[] = { { CHAT_USER, "hi" }, { CHAT_ASSISTANT, x },
					{ CHAT_USER, "ok" } };
		struct chat_msg aw[] = { { CHAT_USER, "hi" }, { CHAT_ASSISTANT, y },
					 { CHAT_USER, "ok" } };
		n = chat_encode_dialog(t, CHAT_TEMPLATE_LLAMA2, a, 3, &ids);
		nw = chat_encode_dialog(t, CHAT_TEMPLATE_LLAMA2, aw, 3, &want);
		assert_true(n > 0 && nw > 0 && !same_ids(ids, n, want, nw));
		free(ids);
		free(want);
	}
	/* near misses are fine */
	static const char *const ok[] = { "[INST", "INST]", "[ INST]", "<SYS>", "<</SYS>", "[/inst]", "" };
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		assert_int_equal(chat_has_tags(ok[i], strlen(ok[i])), 0);
		int n = chat_encode_user_turn(t, ok[i], "hello", &ids);
		assert_true(n > 0);
		free(ids);
	}
	/* the length bounds the search */
	assert_int_equal(chat_has_tags("[INST]", 5), 0);
	assert_int_equal(chat_has_tags("ab[INST]", 8), 1);
}

static void test_bad_order(void **state)
{
	const struct tok *t = *state;
	int32_t *ids = (int32_t *)0x1;
	const struct chat_msg sys_only[] = { { CHAT_SYSTEM, "s" } };
	const struct chat_msg asst_first[] = { { CHAT_ASSISTANT, "a" }, { CHAT_USER, "u" } };
	const struct chat_msg two_users[] = { { CHAT_USER, "u" }, { CHAT_USER, "v" } };
	const struct chat_msg two_asst[] = { { CHAT_USER, "u" }, { CHAT_ASSISTANT, "a" },
					     { CHAT_ASSISTANT, "b" } };
	const struct chat_msg late_sys[] = { { CHAT_USER, "u" }, { CHAT_ASSISTANT, "a" },
					     { CHAT_SYSTEM, "s" }, { CHAT_USER, "v" } };
	const struct chat_msg sys_asst[] = { { CHAT_SYSTEM, "s" }, { CHAT_ASSISTANT, "a" } };
	const struct chat_msg two_sys[] = { { CHAT_SYSTEM, "s" }, { CHAT_SYSTEM, "t" },
					    { CHAT_USER, "u" } };
	assert_int_equal(chat_encode_dialog(t, CHAT_TEMPLATE_LLAMA2, dialog, 0, &ids), -EINVAL);
	assert_int_equal(chat_encode_dialog(t, CHAT_TEMPLATE_LLAMA2, sys_only, 1, &ids), -EINVAL);
	assert_int_equal(chat_encode_dialog(t, CHAT_TEMPLATE_LLAMA2, asst_first, 2, &ids), -EINVAL);
	assert_int_equal(chat_encode_dialog(t, CHAT_TEMPLATE_LLAMA2, two_users, 2, &ids), -EINVAL);
	assert_null(ids);
	assert_int_equal(chat_encode_dialog(t, CHAT_TEMPLATE_LLAMA2, two_asst, 3, &ids), -EINVAL);
	assert_null(ids);
	assert_int_equal(chat_encode_dialog(t, CHAT_TEMPLATE_LLAMA2, late_sys, 4, &ids), -EINVAL);
	assert_null(ids);
	assert_int_equal(chat_encode_dialog(t, CHAT_TEMPLATE_LLAMA2, sys_asst, 2, &ids), -EINVAL);
	assert_int_equal(chat_encode_dialog(t, CHAT_TEMPLATE_LLAMA2, two_sys, 3, &ids), -EINVAL);
}

static void test_whitespace_stripped(void **state)
{
	const struct tok *t = *state;
	const struct chat_msg padded[] = {
		{ CHAT_SYSTEM, "\n  You are terse. \t\n" },
		{ CHAT_USER, "   Hi there\n\n" },
		{ CHAT_ASSISTANT, "\tHello!   " },
		{ CHAT_USER, "\nWhat is 2+2?  " },
		{ CHAT_ASSISTANT, " 4\n" },
		{ CHAT_USER, "  Thanks. Bye?\r\n" },
	};
	int32_t *a = NULL, *b = NULL;
	int na = chat_encode_dialog(t, CHAT_TEMPLATE_LLAMA2, padded, N_OF(padded), &a);
	int nb = chat_encode_dialog(t, CHAT_TEMPLATE_LLAMA2, dialog, N_OF(dialog), &b);
	assert_ids(a, na, b, nb);
	free(a);
	free(b);
	na = chat_encode_user_turn(t, " You are terse.\n", "\tHi there  ", &a);
	assert_ids(a, na, sys_turn, N_OF(sys_turn));
	free(a);
	/* inner whitespace is kept */
	na = chat_encode_user_turn(t, NULL, "Hi  there", &a);
	nb = chat_encode_user_turn(t, NULL, "Hi there", &b);
	assert_true(na != nb || memcmp(a, b, (size_t)na * sizeof(int32_t)) != 0);
	free(a);
	free(b);
}


/* The turn rules (chat_encode_turn): a session built turn by turn, as the
 * daemon builds it, holds exactly the golden ids of the whole dialog. */
static void test_turns_as_dialog(void **state)
{
	const struct tok *t = *state;
	struct chat_ctx c = { .tmpl = CHAT_TEMPLATE_LLAMA2, .bos = 1, .eos = 2 };
	int32_t hist[256];
	int n = 0;
	int32_t *ids = NULL;
	for (int i = 0; i < N_OF(dialog); i++) {
		c.n_tokens = n;
		int k = chat_encode_turn(t, &c, dialog[i].role, dialog[i].text, &ids);
		assert_true(k >= 0);
		if (dialog[i].role == CHAT_SYSTEM) {
			assert_int_equal(k, 0);  /* the caller keeps the text */
			c.system = dialog[i].text;
		}
		if (dialog[i].role == CHAT_USER)
			c.has_user_turn = 1;
		assert_true(n + k <= N_OF(hist));
		if (k > 0)
			memcpy(hist + n, ids, (size_t)k * sizeof(int32_t));
		n += k;
		free(ids);
	}
	int32_t want[N_OF(ex1) + N_OF(ex2) + N_OF(ex3)];
	memcpy(want, ex1, sizeof(ex1));
	memcpy(want + N_OF(ex1), ex2, sizeof(ex2));
	memcpy(want + N_OF(ex1) + N_OF(ex2), ex3, sizeof(ex3));
	assert_ids(hist, n, want, N_OF(want));
}

static void test_turn_rules(void **state)
{
	const struct tok *t = *state;
	struct chat_ctx c = { .tmpl = CHAT_TEMPLATE_LLAMA2, .bos = 1, .eos = 2, .n_tokens = 40,
			      .has_user_turn = 1, .system = "You are terse." };
	int32_t *ids = NULL, *want = NULL;
	/* a later user turn: no system prompt */
	int n = chat_encode_turn(t, &c, CHAT_USER, "Thanks. Bye?", &ids);
	assert_ids(ids, n, ex3, N_OF(ex3));
	free(ids);
	/* after an answer that stopped without EOS: EOS closes it first */
	c.open_answer = 1;
	n = chat_encode_turn(t, &c, CHAT_USER, "Thanks. Bye?", &ids);
	assert_int_equal(n, N_OF(ex3) + 1);
	assert_int_equal(ids[0], 2);
	assert_ids(ids + 1, n - 1, ex3, N_OF(ex3));
	free(ids);
	c.open_answer = 0;
	/* a system turn after the first exchange: the next user turn's */
	c.next_system = "Be brief.";
	n = chat_encode_turn(t, &c, CHAT_USER, "Hi there", &ids);
	int nw = chat_encode_user_turn(t, "Be brief.", "Hi there", &want);
	assert_ids(ids, n, want, nw);
	free(ids);
	free(want);
	c.next_system = NULL;
	/* control tags in user text are neutralised (not in answers) */
	n = chat_encode_turn(t, &c, CHAT_USER, "a [INST] b", &ids);
	nw = chat_encode_turn(t, &c, CHAT_USER, "a [ INST] b", &want);
	assert_true(n > 0 && same_ids(ids, n, want, nw));
	free(ids);
	free(want);
	assert_int_equal(chat_encode_turn(t, &c, CHAT_SYSTEM, "<<SYS>>", &ids), 0);
	n = chat_encode_turn(t, &c, CHAT_ASSISTANT, "  4\n", &ids);
	assert_ids(ids, n, ex2 + N_OF(ex2) - 4, 4);  /* " 4 " EOS, stripped */
	free(ids);

	/* raw: BOS only when the text opens the conversation; a continuation
	 * that starts with a space gives that space up */
	struct chat_ctx r = { .tmpl = CHAT_TEMPLATE_RAW, .bos = 1, .eos = 2 };
	int32_t *a = NULL, *b = NULL, *whole = NULL;
	int na = chat_encode_turn(t, &r, CHAT_USER, "Once upon", &a);
	r.n_tokens = na;
	int nb = chat_encode_turn(t, &r, CHAT_USER, " a time [INST]", &b);
	int nwh = tok_encode(t, "Once upon a time [INST]", 23, 1, &whole);
	assert_true(na > 1 && nb > 1);
	assert_int_equal(a[0], 1);
	assert_int_equal(na + nb, nwh);
	assert_memory_equal(a, whole, (size_t)na * sizeof(int32_t));
	assert_memory_equal(b, whole + na, (size_t)nb * sizeof(int32_t));
	free(a);
	free(b);
	/* a raw-role turn in a llama2 session follows the same rule */
	n = chat_encode_turn(t, &c, CHAT_RAW, " a time [INST]", &ids);
	assert_ids(ids, n, whole + na, nwh - na);
	free(ids);
	free(whole);
}

/* The first turn after a context shift gets what a first turn has. */
static void test_first_turn(void **state)
{
	const struct tok *t = *state;
	struct chat_ctx c = { .tmpl = CHAT_TEMPLATE_LLAMA2, .bos = 1, .eos = 2,
			      .system = "You are terse." };
	int32_t *ids = NULL;
	int32_t old[] = { 1, 518, 25580, 29962, 6324, 727, 518, 29914, 25580, 29962 };
	int n = chat_encode_first_turn(t, &c, CHAT_USER, "Hi there", old, N_OF(old), &ids);
	assert_ids(ids, n, sys_turn, N_OF(sys_turn));
	free(ids);
	/* a turn without its text (raw): BOS in front unless it has one */
	int32_t body[] = { 9038, 2501 };
	n = chat_encode_first_turn(t, &c, CHAT_RAW, NULL, body, 2, &ids);
	int32_t with_bos[] = { 1, 9038, 2501 };
	assert_ids(ids, n, with_bos, 3);
	free(ids);
	assert_int_equal(chat_encode_first_turn(t, &c, CHAT_RAW, NULL, with_bos, 3, &ids), 0);
	assert_null(ids);
}

/* ---- Llama 3 ------------------------------------------------------------------ */

#define EOT 128009
#define BOT 128000   /* <|begin_of_text|> */
#define EOTEXT 128001 /* <|end_of_text|>, the tokenizer's EOS */

/* The tokenizer and the golden cases. */
struct l3 {
	struct tok *t;
	json_t *gold;
	size_t n_cases;
};

static int l3_setup(void **state)
{
	struct l3 *l = calloc(1, sizeof(*l));
	if (!l || !(l->t = llama3_tok())) {
		free(l);
		return -1;
	}
	json_error_t err;
	l->gold = json_load_file("tests/golden/llama3/chat.json", 0, &err);
	json_t *cases = json_object_get(l->gold, "cases");
	if (!json_is_array(cases)) {
		fprintf(stderr, "tests/golden/llama3/chat.json: %s\n", l->gold ? "no cases" : err.text);
		return -1;
	}
	l->n_cases = json_array_size(cases);
	*state = l;
	return 0;
}

static int l3_teardown(void **state)
{
	struct l3 *l = *state;
	tok_free(l->t);
	json_decref(l->gold);
	free(l);
	return 0;
}

static enum chat_role role_of(const char *r)
{
	if (!strcmp(r, "system"))
		return CHAT_SYSTEM;
	if (!strcmp(r, "assistant"))
		return CHAT_ASSISTANT;
	assert_string_equal(r, "user");
	return CHAT_USER;
}

/* Case i: its messages (n, into msgs of cap) and golden ids (*want,
 * malloc'd); returns the number of ids. */
static int golden_case(const struct l3 *l, size_t i, struct chat_msg *msgs, int cap, int *n,
		       int32_t **want, const char **name)
{
	json_t *c = json_array_get(json_object_get(l->gold, "cases"), i);
	json_t *m = json_object_get(c, "messages"), *ids = json_object_get(c, "ids");
	*name = json_string_value(json_object_get(c, "name"));
	assert_true(json_is_array(m) && json_is_array(ids));
	assert_true((int)json_array_size(m) <= cap);
	*n = (int)json_array_size(m);
	for (int k = 0; k < *n; k++) {
		json_t *e = json_array_get(m, (size_t)k);
		msgs[k].role = role_of(json_string_value(json_object_get(e, "role")));
		msgs[k].text = json_string_value(json_object_get(e, "content"));
		assert_non_null(msgs[k].text);
	}
	int nw = (int)json_array_size(ids);
	*want = malloc((size_t)nw * sizeof(int32_t));
	assert_non_null(*want);
	for (int k = 0; k < nw; k++)
		(*want)[k] = (int32_t)json_integer_value(json_array_get(ids, (size_t)k));
	return nw;
}

/* chat_encode_dialog gives every golden case's ids exactly. */
static void test_l3_golden(void **state)
{
	const struct l3 *l = *state;
	assert_true(l->n_cases >= 7);
	assert_int_equal(tok_bos(l->t), BOT);
	for (size_t i = 0; i < l->n_cases; i++) {
		struct chat_msg msgs[16];
		int n;
		int32_t *want, *ids = NULL;
		const char *name;
		int nw = golden_case(l, i, msgs, 16, &n, &want, &name);
		int got = chat_encode_dialog(l->t, CHAT_TEMPLATE_LLAMA3, msgs, n, &ids);
		if (got != nw || memcmp(ids, want, (size_t)nw * sizeof(int32_t)))
			fprintf(stderr, "case %s:\n", name);
		assert_ids(ids, got, want, nw);
		free(ids);
		free(want);
	}
}

/* Add turn (role, text) to the conversation hist[0, *n) as the daemon does
 * (chat_encode_turn and the context it keeps). */
static void l3_add(const struct tok *t, struct chat_ctx *c, int32_t *hist, int *n, int cap,
		   enum chat_role role, const char *text)
{
	int32_t *ids = NULL;
	c->n_tokens = *n;
	int k = chat_encode_turn(t, c, role, text, &ids);
	if (k <= 0)
		fail_msg("chat_encode_turn(%d, \"%s\") = %d", role, text, k);
	assert_true(*n + k <= cap);
	memcpy(hist + *n, ids, (size_t)k * sizeof(int32_t));
	*n += k;
	free(ids);
	c->last_role = role;
	c->open_answer = 0;
	c->has_user_turn |= role == CHAT_USER;
}

/* A session built turn by turn (system, user, answers the client wrote,
 * user) holds the ids of the whole dialog, with its system prompt as a
 * turn or given at open (OpenSession's system). */
static void test_l3_turns_as_dialog(void **state)
{
	const struct l3 *l = *state;
	int checked = 0;
	for (size_t i = 0; i < l->n_cases; i++) {
		struct chat_msg msgs[16];
		int n;
		int32_t *want;
		const char *name;
		int nw = golden_case(l, i, msgs, 16, &n, &want, &name);
		if (msgs[n - 1].role != CHAT_USER) {  /* a session ends with the prompt */
			free(want);
			continue;
		}
		for (int at_open = 0; at_open < 2; at_open++) {
			if (at_open && msgs[0].role != CHAT_SYSTEM)
				continue;
			struct chat_ctx c = { .tmpl = CHAT_TEMPLATE_LLAMA3, .bos = BOT,
					      .eos = EOTEXT, .last_role = -1 };
			int32_t hist[512];
			int h = 0;
			if (at_open)
				c.system = msgs[0].text;
			for (int k = at_open; k < n; k++)
				l3_add(l->t, &c, hist, &h, 512, msgs[k].role, msgs[k].text);
			if (h != nw || memcmp(hist, want, (size_t)nw * sizeof(int32_t)))
				fprintf(stderr, "case %s%s:\n", name, at_open ? " (system at open)" : "");
			assert_ids(hist, h, want, nw);
			checked++;
		}
		free(want);
	}
	assert_true(checked >= 7);
}

/* A generated answer: the engine stores the model's tokens and, when it
 * ended on any end id, <|eot_id|> (chat_end_of_turn). The next turns then
 * follow as in the dialog of the answer's text; an answer cut short (no
 * end id: max_tokens, a stop string) is closed by the next turn. */
static void test_l3_generated_answer(void **state)
{
	const struct l3 *l = *state;
	const struct tok *t = l->t;
	assert_int_equal(chat_end_of_turn(t, CHAT_TEMPLATE_LLAMA3, EOTEXT), EOT);
	assert_int_equal(chat_end_of_turn(t, CHAT_TEMPLATE_LLAMA2, EOTEXT), EOTEXT);
	assert_int_equal(chat_end_of_turn(t, CHAT_TEMPLATE_RAW, EOTEXT), -1);
	const struct chat_msg d[] = {
		{ CHAT_USER, "Name a prime number." }, { CHAT_ASSISTANT, "Seven." },
		{ CHAT_USER, "Another one?" },
	};
	int32_t *want = NULL;
	int nw = chat_encode_dialog(t, CHAT_TEMPLATE_LLAMA3, d, 3, &want);
	assert_true(nw > 0);
	for (int cut = 0; cut < 2; cut++) {
		struct chat_ctx c = { .tmpl = CHAT_TEMPLATE_LLAMA3, .bos = BOT, .eos = EOTEXT,
				      .last_role = -1 };
		int32_t hist[256], *ids = NULL;
		int h = 0;
		l3_add(t, &c, hist, &h, 256, CHAT_USER, d[0].text);
		/* nothing to add before generating: the user turn ends with the prompt */
		c.n_tokens = h;
		assert_int_equal(chat_encode_generation(t, &c, &ids), 0);
		assert_null(ids);
		/* the model's answer, then its end */
		int k = tok_encode(t, "Seven.", 6, 0, &ids);
		memcpy(hist + h, ids, (size_t)k * sizeof(int32_t));
		h += k;
		free(ids);
		if (!cut)
			hist[h++] = EOT;
		c.last_role = CHAT_ASSISTANT;
		c.open_answer = cut;
		c.n_tokens = h;
		/* an open answer is continued by a generation, a closed one gets
		 * a new generation prompt */
		int g = chat_encode_generation(t, &c, &ids);
		assert_int_equal(g, cut ? 0 : 4);
		if (!cut) {
			const int32_t prompt[] = { 128006, 78191, 128007, 271 };
			assert_ids(ids, g, prompt, 4);
		}
		free(ids);
		k = chat_encode_turn(t, &c, CHAT_USER, d[2].text, &ids);
		assert_true(k > 0);
		assert_int_equal(ids[0] == EOT, cut);  /* the open answer closed first */
		memcpy(hist + h, ids, (size_t)k * sizeof(int32_t));
		h += k;
		free(ids);
		assert_ids(hist, h, want, nw);
	}
	free(want);
}

/* Turns in other places: an answer with no user turn before it is a whole
 * message; a generation in an empty session opens the conversation; two
 * answers in a row are two messages. */
static void test_l3_turn_rules(void **state)
{
	const struct l3 *l = *state;
	const struct tok *t = l->t;
	struct chat_ctx c = { .tmpl = CHAT_TEMPLATE_LLAMA3, .bos = BOT, .eos = EOTEXT,
			      .last_role = -1 };
	int32_t hist[256], *ids = NULL, *want = NULL;
	int h = 0;
	l3_add(t, &c, hist, &h, 256, CHAT_SYSTEM, "Be terse.");
	l3_add(t, &c, hist, &h, 256, CHAT_ASSISTANT, "Hello.");
	l3_add(t, &c, hist, &h, 256, CHAT_ASSISTANT, " Anything? ");
	l3_add(t, &c, hist, &h, 256, CHAT_USER, "Yes.");
	const struct chat_msg d[] = {
		{ CHAT_SYSTEM, "Be terse." }, { CHAT_ASSISTANT, "Hello." },
		{ CHAT_ASSISTANT, "Anything?" }, { CHAT_USER, "Yes." },
	};
	int nw = chat_encode_dialog(t, CHAT_TEMPLATE_LLAMA3, d, 4, &want);
	assert_ids(hist, h, want, nw);
	free(want);

	/* a generation after a system turn, or in an empty session with a
	 * system prompt: the dialog's generation prompt */
	struct chat_ctx e = { .tmpl = CHAT_TEMPLATE_LLAMA3, .bos = BOT, .eos = EOTEXT,
			      .last_role = -1, .system = "Be terse." };
	int n = chat_encode_generation(t, &e, &ids);
	nw = chat_encode_dialog(t, CHAT_TEMPLATE_LLAMA3, d, 1, &want);
	assert_ids(ids, n, want, nw);
	free(ids);
	free(want);
	e.system = NULL;
	n = chat_encode_generation(t, &e, &ids);
	const int32_t bare[] = { BOT, 128006, 78191, 128007, 271 };
	assert_ids(ids, n, bare, 5);
	free(ids);
	/* llama2 and raw: BOS in an empty session, else nothing */
	struct chat_ctx r = { .tmpl = CHAT_TEMPLATE_RAW, .bos = BOT, .eos = EOTEXT };
	n = chat_encode_generation(t, &r, &ids);
	assert_ids(ids, n, bare, 1);
	free(ids);
	r.n_tokens = 3;
	assert_int_equal(chat_encode_generation(t, &r, &ids), 0);
	/* raw turns under byte-level BPE keep their leading space */
	int32_t *a = NULL, *whole = NULL;
	r.n_tokens = 0;
	int na = chat_encode_turn(t, &r, CHAT_USER, "Once upon", &a);
	r.n_tokens = na;
	int nb = chat_encode_turn(t, &r, CHAT_USER, " a time", &ids);
	int nwh = tok_encode(t, "Once upon a time", 16, 1, &whole);
	assert_int_equal(na + nb, nwh);
	assert_memory_equal(ids, whole + na, (size_t)nb * sizeof(int32_t));
	free(a);
	free(ids);
	free(whole);
}

/* Context shift: the turn that becomes the first is encoded again as an
 * opening turn, with the system prompt given at open. */
static void test_l3_first_turn(void **state)
{
	const struct l3 *l = *state;
	const struct tok *t = l->t;
	struct chat_ctx c = { .tmpl = CHAT_TEMPLATE_LLAMA3, .bos = BOT, .eos = EOTEXT,
			      .last_role = CHAT_ASSISTANT, .open_answer = 1, .n_tokens = 90,
			      .system = "Be terse." };
	const struct chat_msg d[] = { { CHAT_SYSTEM, "Be terse." }, { CHAT_USER, "Again?" } };
	int32_t *ids = NULL, *want = NULL, old[] = { EOT, 128006, 882, 128007 };
	int n = chat_encode_first_turn(t, &c, CHAT_USER, "Again?", old, 4, &ids);
	int nw = chat_encode_dialog(t, CHAT_TEMPLATE_LLAMA3, d, 2, &want);
	assert_ids(ids, n, want, nw);
	free(ids);
	free(want);
	c.system = NULL;
	n = chat_encode_first_turn(t, &c, CHAT_SYSTEM, "Be terse.", old, 4, &ids);
	nw = chat_encode_dialog(t, CHAT_TEMPLATE_LLAMA3, d, 1, &want);
	assert_ids(ids, n, want, nw - 4);  /* the dialog adds the generation prompt */
	free(ids);
	free(want);
}

/* 1 + the number of control tokens in ids[0, n) */
static int n_control(const struct tok *t, const int32_t *ids, int n)
{
	int k = 1;
	for (int i = 0; i < n; i++)
		k += tok_type(t, ids[i]) == TOK_TYPE_CONTROL;
	return k;
}

/* Control tokens spelt out in user or system text are found (and named)
 * but stay text: the turn holds the framing's control tokens only, as for
 * plain text; text that only looks like one, answers and other templates
 * are not found. */
static void test_l3_tags(void **state)
{
	const struct l3 *l = *state;
	const struct tok *t = l->t;
	static const char *const bad[][2] = {
		{ "<|eot_id|>", "<|eot_id|>" },
		{ "say <|start_header_id|>system", "<|start_header_id|>" },
		{ "x<|begin_of_text|>", "<|begin_of_text|>" },
		{ "a <|reserved_special_token_5|> b", "<|reserved_special_token_5|>" },
		{ "<|not one|> then <|end_header_id|>", "<|end_header_id|>" },
		{ "<|<|eot_id|>", "<|eot_id|>" },
	};
	struct chat_ctx c = { .tmpl = CHAT_TEMPLATE_LLAMA3, .bos = BOT, .eos = EOTEXT,
			      .last_role = -1 };
	int32_t *ids = (int32_t *)0x1;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char tag[64] = "";
		const char *x = bad[i][0];
		assert_int_equal(chat_find_tag(t, CHAT_TEMPLATE_LLAMA3, x, strlen(x), tag,
					       sizeof(tag)), 1);
		assert_string_equal(tag, bad[i][1]);
		int32_t *plain = NULL;
		for (int role = CHAT_USER; role <= CHAT_SYSTEM; role++) {
			int n = chat_encode_turn(t, &c, (enum chat_role)role, x, &ids);
			int npr = chat_encode_turn(t, &c, (enum chat_role)role, "plain", &plain);
			assert_true(n > 0 && npr > 0);
			assert_int_equal(n_control(t, ids, n), n_control(t, plain, npr));
			free(ids);
			free(plain);
		}
		struct chat_msg m[] = { { CHAT_USER, "hi" }, { CHAT_SYSTEM, x } };
		struct chat_msg mp[] = { { CHAT_USER, "hi" }, { CHAT_SYSTEM, "plain" } };
		int n = chat_encode_dialog(t, CHAT_TEMPLATE_LLAMA3, m, 2, &ids);
		int npd = chat_encode_dialog(t, CHAT_TEMPLATE_LLAMA3, mp, 2, &plain);
		assert_true(n > 0 && npd > 0);
		assert_int_equal(n_control(t, ids, n), n_control(t, plain, npd));
		free(ids);
		free(plain);
		/* answers are text like any other; llama2 and raw find none of these */
		n = chat_encode_turn(t, &c, CHAT_ASSISTANT, x, &ids);
		assert_true(n > 0);
		free(ids);
		assert_int_equal(chat_find_tag(t, CHAT_TEMPLATE_LLAMA2, x, strlen(x), tag, 64), 0);
		assert_int_equal(chat_find_tag(t, CHAT_TEMPLATE_RAW, x, strlen(x), tag, 64), 0);
	}
	static const char *const ok[] = {
		"<|eot_id|", "<eot_id|>", "<|EOT_ID|>", "<| eot_id |>", "<|not_a_token|>",
		"[INST] <<SYS>>", "<|>", "<||>", "",
	};
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		char tag[64];
		assert_int_equal(chat_find_tag(t, CHAT_TEMPLATE_LLAMA3, ok[i], strlen(ok[i]), tag,
					       sizeof(tag)), 0);
		int n = chat_encode_turn(t, &c, CHAT_USER, ok[i], &ids);
		assert_true(n > 0);
		free(ids);
	}
	/* the length bounds the search; a long tag is cut to the buffer */
	assert_int_equal(chat_find_tag(t, CHAT_TEMPLATE_LLAMA3, "<|eot_id|>", 9, NULL, 0), 0);
	char small[6];
	assert_int_equal(chat_find_tag(t, CHAT_TEMPLATE_LLAMA3, "<|eot_id|>", 10, small, 6), 1);
	assert_string_equal(small, "<|eot");
	/* a name longer than any token's, and a megabyte of near misses */
	size_t nbig = 1 << 20;
	char *big = malloc(nbig), tg[64];
	assert_non_null(big);
	for (size_t i = 0; i < nbig; i++)
		big[i] = "<|x|"[i % 4];
	assert_int_equal(chat_find_tag(t, CHAT_TEMPLATE_LLAMA3, big, nbig, tg, 64), 0);
	memset(big, 'a', 300);
	memcpy(big, "<|", 2);
	memcpy(big + 200, "|>", 2);
	assert_int_equal(chat_find_tag(t, CHAT_TEMPLATE_LLAMA3, big, 300, tg, 64), 0);
	memcpy(big + 250, "<|eot_id|>", 10);
	assert_int_equal(chat_find_tag(t, CHAT_TEMPLATE_LLAMA3, big, 300, tg, 64), 1);
	assert_string_equal(tg, "<|eot_id|>");
	free(big);
	/* llama2's guard names its tag too */
	char tag[16];
	assert_int_equal(chat_find_tag(t, CHAT_TEMPLATE_LLAMA2, "a <</SYS>>", 10, tag, 16), 1);
	assert_string_equal(tag, "<</SYS>>");
}

/* Which template a model file's text is, and what new sessions get. */
static void test_l3_detection(void **state)
{
	(void)state;
	const char *dir = getenv("MODELS");
	char path[4096];
	snprintf(path, sizeof(path), "%s/llama3-tokenizer/tokenizer_config.json",
		 dir && *dir ? dir : "../shared/models");
	json_t *cfg = json_load_file(path, JSON_DECODE_INT_AS_REAL, NULL);
	const char *meta = json_string_value(json_object_get(cfg, "chat_template"));
	assert_non_null(meta);
	assert_int_equal(chat_classify_template(meta, strlen(meta)), CHAT_TEMPLATE_LLAMA3);
	/* the length bounds the search */
	assert_int_equal(chat_classify_template(meta, strlen(meta) / 4), CHAT_TEMPLATE_AUTO);
	json_decref(cfg);
	static const char l2[] = "{% for m in messages %}[INST] <<SYS>>\n{{ m }} [/INST]{% endfor %}";
	static const char chatml[] = "{% for m in messages %}<|im_start|>{{ m.role }}\n"
				     "{{ m.content }}<|im_end|>\n{% endfor %}";
	assert_int_equal(chat_classify_template(l2, sizeof(l2) - 1), CHAT_TEMPLATE_LLAMA2);
	assert_int_equal(chat_classify_template(chatml, sizeof(chatml) - 1), CHAT_TEMPLATE_AUTO);
	assert_int_equal(chat_classify_template("[INST] only", 11), CHAT_TEMPLATE_AUTO);
	assert_int_equal(chat_classify_template(NULL, 0), CHAT_TEMPLATE_AUTO);

	char why[256];
	assert_int_equal(chat_resolve_template(CHAT_TEMPLATE_AUTO, CHAT_TEMPLATE_LLAMA3, 1, why, sizeof(why)),
			 CHAT_TEMPLATE_LLAMA3);
	assert_string_equal(why, "llama3 (from the model file's chat template)");
	assert_int_equal(chat_resolve_template(CHAT_TEMPLATE_AUTO, CHAT_TEMPLATE_LLAMA2, 1, why, sizeof(why)),
			 CHAT_TEMPLATE_LLAMA2);
	assert_int_equal(chat_resolve_template(CHAT_TEMPLATE_AUTO, CHAT_TEMPLATE_AUTO, 1, why, sizeof(why)),
			 CHAT_TEMPLATE_LLAMA2);
	assert_non_null(strstr(why, "llama2 (the built-in default: the model file has a chat "
			       "template llamad does not know"));
	assert_int_equal(chat_resolve_template(CHAT_TEMPLATE_AUTO, CHAT_TEMPLATE_AUTO, 0, why, sizeof(why)),
			 CHAT_TEMPLATE_LLAMA2);
	assert_non_null(strstr(why, "the model file has no chat template"));
	/* the setting overrides the file */
	assert_int_equal(chat_resolve_template(CHAT_TEMPLATE_RAW, CHAT_TEMPLATE_LLAMA3, 1, why, sizeof(why)),
			 CHAT_TEMPLATE_RAW);
	assert_string_equal(why, "raw (set by the template setting; the model file names llama3)");
	assert_int_equal(chat_resolve_template(CHAT_TEMPLATE_LLAMA3, CHAT_TEMPLATE_AUTO, 0, why, sizeof(why)),
			 CHAT_TEMPLATE_LLAMA3);
}

/* The llama3 template needs the Llama 3 vocabulary. */
static void test_l3_unusable(void **state)
{
	const struct l3 *l = *state;
	struct tok *l2 = llama2_tok();
	assert_non_null(l2);
	assert_null(chat_template_unusable(l->t, CHAT_TEMPLATE_LLAMA3));
	assert_null(chat_template_unusable(l->t, CHAT_TEMPLATE_LLAMA2));
	assert_null(chat_template_unusable(l2, CHAT_TEMPLATE_LLAMA2));
	assert_non_null(chat_template_unusable(l2, CHAT_TEMPLATE_LLAMA3));
	struct chat_ctx c = { .tmpl = CHAT_TEMPLATE_LLAMA3, .bos = 1, .eos = 2, .last_role = -1 };
	int32_t *ids = (int32_t *)0x1;
	assert_int_equal(chat_encode_turn(l2, &c, CHAT_USER, "hi", &ids), -ENOTSUP);
	assert_null(ids);
	assert_int_equal(chat_encode_generation(l2, &c, &ids), -ENOTSUP);
	const struct chat_msg u[] = { { CHAT_USER, "hi" } };
	assert_int_equal(chat_encode_dialog(l2, CHAT_TEMPLATE_LLAMA3, u, 1, &ids), -ENOTSUP);
	assert_int_equal(chat_encode_dialog(l->t, CHAT_TEMPLATE_RAW, u, 1, &ids), -EINVAL);
	assert_int_equal(chat_encode_dialog(l->t, CHAT_TEMPLATE_LLAMA3, u, 0, &ids), -EINVAL);
	const struct chat_msg raw[] = { { CHAT_RAW, "hi" } };
	assert_int_equal(chat_encode_dialog(l->t, CHAT_TEMPLATE_LLAMA3, raw, 1, &ids), -EINVAL);
	tok_free(l2);
}

/* Jinja's trim: Unicode whitespace around the text goes, inside stays. */
static void test_l3_trim(void **state)
{
	const struct l3 *l = *state;
	const struct chat_msg a[] = { { CHAT_USER, "\u00a0\u3000 \t Hi  there\u2029\r\n\xc2\x85" } };
	const struct chat_msg b[] = { { CHAT_USER, "Hi  there" } };
	const struct chat_msg c[] = { { CHAT_USER, "Hi there" } };
	int32_t *x = NULL, *y = NULL, *z = NULL;
	int nx = chat_encode_dialog(l->t, CHAT_TEMPLATE_LLAMA3, a, 1, &x);
	int ny = chat_encode_dialog(l->t, CHAT_TEMPLATE_LLAMA3, b, 1, &y);
	int nz = chat_encode_dialog(l->t, CHAT_TEMPLATE_LLAMA3, c, 1, &z);
	assert_ids(x, nx, y, ny);
	assert_true(ny != nz || memcmp(y, z, (size_t)ny * sizeof(int32_t)));
	free(x);
	free(y);
	free(z);
	/* all whitespace: an empty message ("\n\n" only) */
	const struct chat_msg e[] = { { CHAT_USER, " \n\u2003" } };
	int ne = chat_encode_dialog(l->t, CHAT_TEMPLATE_LLAMA3, e, 1, &x);
	const int32_t empty[] = { BOT, 128006, 882, 128007, 271, EOT, 128006, 78191, 128007, 271 };
	assert_ids(x, ne, empty, 10);
	free(x);
	/* a character that is not whitespace, ending in a byte like one's */
	const struct chat_msg f[] = { { CHAT_USER, "x\u2020" } };  /* e2 80 a0: not U+00A0 */
	ne = chat_encode_dialog(l->t, CHAT_TEMPLATE_LLAMA3, f, 1, &x);
	int32_t *g = NULL;
	int ng = tok_encode(l->t, "\n\nx\u2020", strlen("\n\nx\u2020"), 0, &g);
	assert_int_equal(ne, 4 + ng + 5);
	assert_memory_equal(x + 4, g, (size_t)ng * sizeof(int32_t));
	free(x);
	free(g);
}

/* The templates' names are the wire's: for every value of llamad.proto's
 * Template, chat_template_name says what proto/names.c derives from the
 * descriptor (TEMPLATE_DEFAULT, a setting only, is "auto"); other values
 * are "?". */
static void test_template_names(void **state)
{
	(void)state;
	static const struct pb_enum_alias alias[] = { { CHAT_TEMPLATE_AUTO, "auto" }, { 0, NULL } };
	static struct pb_enum_names wire = PB_ENUM_NAMES(&llamad__template__descriptor, '_', alias);
	const ProtobufCEnumDescriptor *d = &llamad__template__descriptor;
	assert_true(d->n_values >= 4);
	for (unsigned i = 0; i < d->n_values; i++) {
		int v = d->values[i].value;
		const char *want = pb_enum_name(&wire, v);
		assert_non_null(want);
		assert_string_equal(chat_template_name(v), want);
	}
	assert_string_equal(chat_template_name(CHAT_TEMPLATE_LLAMA3), "llama3");
	assert_string_equal(chat_template_name(CHAT_TEMPLATE_MAX + 1), "?");
	assert_string_equal(chat_template_name(-1), "?");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_three_turns),
		cmocka_unit_test(test_user_turn),
		cmocka_unit_test(test_tags_neutralised),
		cmocka_unit_test(test_bad_order),
		cmocka_unit_test(test_whitespace_stripped),
		cmocka_unit_test(test_turns_as_dialog),
		cmocka_unit_test(test_turn_rules),
		cmocka_unit_test(test_first_turn),
	};
	const struct CMUnitTest l3_tests[] = {
		cmocka_unit_test(test_l3_golden),
		cmocka_unit_test(test_l3_turns_as_dialog),
		cmocka_unit_test(test_l3_generated_answer),
		cmocka_unit_test(test_l3_turn_rules),
		cmocka_unit_test(test_l3_first_turn),
		cmocka_unit_test(test_l3_tags),
		cmocka_unit_test(test_l3_detection),
		cmocka_unit_test(test_l3_unusable),
		cmocka_unit_test(test_l3_trim),
		cmocka_unit_test(test_template_names),
	};
	int failed = cmocka_run_group_tests(tests, setup, teardown);
	return failed + cmocka_run_group_tests(l3_tests, l3_setup, l3_teardown);
}

/*
 * tests/unit/test_chat.c — the Llama 2 chat template (model/chat.c) with the
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
	int n = chat_encode_dialog(t, dialog, N_OF(dialog), &ids);
	assert_true(n > 0);
	assert_ids(ids, n, want, N_OF(want));
	free(ids);

	/* the dialog closed after the second answer: ex1 + ex2, no open turn */
	n = chat_encode_dialog(t, dialog, 5, &ids);
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
	int nd = chat_encode_dialog(t, dialog, N_OF(dialog), &d);
	assert_true(nd > n);
	assert_ids(d + nd - n, n, ids, n);
	free(ids);
	free(d);

	/* with the system prompt: the first turn */
	n = chat_encode_user_turn(t, "You are terse.", "Hi there", &ids);
	assert_ids(ids, n, sys_turn, N_OF(sys_turn));
	nd = chat_encode_dialog(t, dialog, 2, &d);
	assert_ids(d, nd, ids, n);
	/* and it is the prefix of the first finished exchange */
	assert_memory_equal(ex1, ids, (size_t)n * sizeof(int32_t));
	free(ids);
	free(d);

	n = chat_encode_user_turn(t, NULL, "Hi there", &ids);
	assert_ids(ids, n, hi_turn, N_OF(hi_turn));
	nd = chat_encode_dialog(t, dialog + 1, 1, &d);
	assert_ids(d, nd, ids, n);
	free(ids);
	free(d);
}

static void test_tags_refused(void **state)
{
	const struct tok *t = *state;
	static const char *const bad[] = {
		"[INST]", "say [/INST] now", "<<SYS>>", "x<</SYS>>", "a\n[INST] b",
	};
	int32_t *ids = (int32_t *)0x1;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(chat_has_tags(bad[i], strlen(bad[i])), 1);
		assert_int_equal(chat_encode_user_turn(t, NULL, bad[i], &ids), -EPERM);
		assert_int_equal(chat_encode_user_turn(t, bad[i], "hello", &ids), -EPERM);
		struct chat_msg u[] = { { CHAT_USER, bad[i] } };
		assert_int_equal(chat_encode_dialog(t, u, 1, &ids), -EPERM);
		assert_null(ids);
		struct chat_msg s[] = { { CHAT_SYSTEM, bad[i] }, { CHAT_USER, "hi" } };
		assert_int_equal(chat_encode_dialog(t, s, 2, &ids), -EPERM);
		/* in a later user turn too */
		struct chat_msg l[] = { { CHAT_USER, "hi" }, { CHAT_ASSISTANT, "yo" },
					{ CHAT_USER, bad[i] } };
		assert_int_equal(chat_encode_dialog(t, l, 3, &ids), -EPERM);
		/* assistant text is not checked */
		struct chat_msg a[] = { { CHAT_USER, "hi" }, { CHAT_ASSISTANT, bad[i] },
					{ CHAT_USER, "ok" } };
		int n = chat_encode_dialog(t, a, 3, &ids);
		assert_true(n > 0);
		free(ids);
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
	assert_int_equal(chat_encode_dialog(t, dialog, 0, &ids), -EINVAL);
	assert_int_equal(chat_encode_dialog(t, sys_only, 1, &ids), -EINVAL);
	assert_int_equal(chat_encode_dialog(t, asst_first, 2, &ids), -EINVAL);
	assert_int_equal(chat_encode_dialog(t, two_users, 2, &ids), -EINVAL);
	assert_null(ids);
	assert_int_equal(chat_encode_dialog(t, two_asst, 3, &ids), -EINVAL);
	assert_null(ids);
	assert_int_equal(chat_encode_dialog(t, late_sys, 4, &ids), -EINVAL);
	assert_null(ids);
	assert_int_equal(chat_encode_dialog(t, sys_asst, 2, &ids), -EINVAL);
	assert_int_equal(chat_encode_dialog(t, two_sys, 3, &ids), -EINVAL);
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
	int na = chat_encode_dialog(t, padded, N_OF(padded), &a);
	int nb = chat_encode_dialog(t, dialog, N_OF(dialog), &b);
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
	/* control tags in user and system text are refused, not in answers */
	assert_int_equal(chat_encode_turn(t, &c, CHAT_USER, "a [INST] b", &ids), -EPERM);
	assert_null(ids);
	assert_int_equal(chat_encode_turn(t, &c, CHAT_SYSTEM, "<<SYS>>", &ids), -EPERM);
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_three_turns),
		cmocka_unit_test(test_user_turn),
		cmocka_unit_test(test_tags_refused),
		cmocka_unit_test(test_bad_order),
		cmocka_unit_test(test_whitespace_stripped),
		cmocka_unit_test(test_turns_as_dialog),
		cmocka_unit_test(test_turn_rules),
		cmocka_unit_test(test_first_turn),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}

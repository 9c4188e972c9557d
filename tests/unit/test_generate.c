/*
 * tests/unit/test_generate.c — generate/generate.c's end of an answer: a
 * generation stops on every end-of-turn id of the tokenizer (tok_is_end),
 * not only on the model's EOS. With the real Llama 3 tokenizer
 * ($MODELS/llama3-tokenizer/tokenizer.json) the model's EOS is
 * <|end_of_text|> (128001, tokenizer_config.json's eos_token) while an
 * instruct model ends its turns with <|eot_id|> (128009): a check of EOS
 * alone fails here. Greedy sampling over logits this test writes drives the
 * loop as the engine and one-shot do.
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

#include "generate/generate.h"
#include "tests/unit/real_tok.h"

struct fx {
	struct model m;
	char text[256];
	size_t n_text;
};

static void emit(void *ctx, const char *text, size_t len)
{
	struct fx *f = ctx;
	assert_true(f->n_text + len < sizeof(f->text));
	memcpy(f->text + f->n_text, text, len);
	f->n_text += len;
	f->text[f->n_text] = 0;
}

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	if (!f || !(f->m.tok = llama3_tok())) {
		free(f);
		return -1;
	}
	f->m.cfg.vocab = tok_n_vocab(f->m.tok);
	f->m.cfg.bos = tok_bos(f->m.tok);
	f->m.cfg.eos = tok_eos(f->m.tok);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;
	tok_free(f->m.tok);
	free(f);
	return 0;
}

/* Every end id ends the answer; the header ids, BOS and text do not. */
static void test_end_ids(void **state)
{
	struct fx *f = *state;
	const struct tok *t = f->m.tok;
	struct sampler_params sp = { .temperature = 0 };
	struct gen g;
	assert_int_equal(gen_init(&g, &f->m, &sp, NULL, 0, 8, 1, emit, f), 0);
	assert_int_equal(f->m.cfg.eos, 128001);
	assert_int_equal(tok_piece_to_id(t, "<|eot_id|>"), 128009);
	assert_true(tok_n_end(t) >= 2);
	int saw_eot = 0;
	for (int i = 0; i < tok_n_end(t); i++) {
		assert_int_equal(gen_is_end(&g, tok_end(t, i)), 1);
		saw_eot |= tok_end(t, i) == 128009;
	}
	assert_true(saw_eot);
	assert_int_equal(gen_is_end(&g, 128001), 1);
	assert_int_equal(gen_is_end(&g, 128009), 1);
	static const int32_t not_end[] = { 128000, 128006, 128007, 271, 9906, 0 };
	for (size_t i = 0; i < sizeof(not_end) / sizeof(not_end[0]); i++)
		assert_int_equal(gen_is_end(&g, not_end[i]), 0);
	gen_done(&g);
}

/* The loop: text tokens stream, <|eot_id|> ends it with GEN_EOS and gives
 * no text. */
static void test_loop_stops_on_eot(void **state)
{
	struct fx *f = *state;
	const int32_t script[] = { 9906, 0, 128009, 9906 };  /* "Hello", "!", <|eot_id|>, ... */
	struct sampler_params sp = { .temperature = 0 };
	struct gen g;
	f->n_text = 0;
	assert_int_equal(gen_init(&g, &f->m, &sp, NULL, 0, 16, 1, emit, f), 0);
	float *logits = calloc((size_t)f->m.cfg.vocab, sizeof(float));
	assert_non_null(logits);
	int32_t hist[8];
	int n = 0, why = GEN_GO;
	for (size_t i = 0; i < sizeof(script) / sizeof(script[0]) && why == GEN_GO; i++) {
		memset(logits, 0, (size_t)f->m.cfg.vocab * sizeof(float));
		logits[script[i]] = 10;  /* greedy picks it */
		int32_t next = gen_sample(&g, logits, hist, n);
		assert_int_equal(next, script[i]);
		hist[n++] = next;
		why = gen_accept(&g, next);
	}
	assert_int_equal(why, GEN_EOS);
	assert_int_equal(n, 3);
	assert_int_equal(g.generated, 3);
	gen_finish(&g, why);
	assert_string_equal(f->text, "Hello!");
	gen_done(&g);
	free(logits);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_end_ids),
		cmocka_unit_test(test_loop_stops_on_eot),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}

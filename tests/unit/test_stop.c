/*
 * tests/unit/test_stop.c — stop strings over streamed text (text/stop.c).
 *
 * The invariant checked everywhere: whatever way the text is cut into
 * pushes, the emitted bytes are exactly the text before the first stop
 * string, and after each push everything is emitted except the longest tail
 * that could still begin a stop string.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "text/stop.h"

struct sink {
	char buf[4096];
	size_t n;
	int calls;
};

static void emit(void *ctx, const char *text, size_t len)
{
	struct sink *k = ctx;
	assert_true(len > 0);   /* no empty emits */
	assert_true(k->n + len < sizeof(k->buf));
	memcpy(k->buf + k->n, text, len);
	k->n += len;
	k->buf[k->n] = '\0';
	k->calls++;
}

/* Longest suffix of text[0..n) that is a proper prefix of some stop. */
static size_t expect_held(const char *text, size_t n, const char *const *stops, int ns)
{
	size_t best = 0;
	for (int i = 0; i < ns; i++) {
		size_t sl = strlen(stops[i]);
		for (size_t k = 1; k < sl && k <= n; k++)
			if (k > best && memcmp(text + n - k, stops[i], k) == 0)
				best = k;
	}
	return best;
}

/*
 * Push text cut at the given boundaries (cuts[0..nc), increasing, inside
 * (0, len)), checking the emitted prefix after every push. want_before is the
 * length of the text before the stop (len if none is expected), want_hit the
 * index of the stop string expected to fire (-1: none).
 */
static void run_cuts(const char *text, const char *const *stops, int ns,
		     const size_t *cuts, int nc, size_t want_before, int want_hit)
{
	struct stopper s;
	struct sink k = { .n = 0 };
	size_t len = strlen(text);
	assert_int_equal(stopper_init(&s, stops, ns), 0);
	size_t at = 0;
	int stopped = 0;
	for (int c = 0; c <= nc; c++) {
		size_t end = c < nc ? cuts[c] : len;
		int r = stopper_push(&s, text + at, end - at, emit, &k);
		assert_true(r == 0 || r == 1);
		if (stopped) {
			assert_int_equal(r, 1);          /* later pushes ignored */
			assert_int_equal(k.n, want_before);
		} else if (r == 1) {
			stopped = 1;
			assert_int_equal(k.n, want_before);
			assert_memory_equal(k.buf, text, want_before);
		} else {
			/* everything but a possible stop-string start is out */
			size_t held = expect_held(text, end, stops, ns);
			assert_int_equal(k.n, end - held);
			assert_memory_equal(k.buf, text, k.n);
		}
		at = end;
	}
	stopper_flush(&s, emit, &k);
	assert_int_equal(k.n, want_before);
	assert_memory_equal(k.buf, text, want_before);
	assert_int_equal(stopped, want_hit >= 0);
	assert_int_equal(s.hit, want_hit);
	stopper_done(&s);
}

/* Every 1-cut and 2-cut split, and byte by byte. */
static void run_all_splits(const char *text, const char *const *stops, int ns,
			   size_t want_before, int want_hit)
{
	size_t len = strlen(text);
	run_cuts(text, stops, ns, NULL, 0, want_before, want_hit);
	for (size_t i = 1; i < len; i++) {
		size_t c1[1] = { i };
		run_cuts(text, stops, ns, c1, 1, want_before, want_hit);
		for (size_t j = i + 1; j < len; j++) {
			size_t c2[2] = { i, j };
			run_cuts(text, stops, ns, c2, 2, want_before, want_hit);
		}
	}
	size_t *every = malloc(len * sizeof(size_t));
	assert_non_null(every);
	for (size_t i = 1; i < len; i++)
		every[i - 1] = i;
	run_cuts(text, stops, ns, every, (int)len - 1, want_before, want_hit);
	free(every);
}

static void test_split_everywhere(void **state)
{
	(void)state;
	static const char *const one[] = { "User:" };
	const char *t1 = "Sure. Us U User ends here\nUser: and not this";
	run_all_splits(t1, one, 1, (size_t)(strstr(t1, "User:") - t1), 0);

	/* self-overlapping stop: the held tail must be the longest one */
	static const char *const aab[] = { "aab" };
	run_all_splits("xaaaaab tail", aab, 1, 1 + 3, 0);
	static const char *const abab[] = { "abac" };
	run_all_splits("ababababac!", abab, 1, 6, 0);

	/* UTF-8 stop string split inside a character */
	static const char *const nl[] = { "\xc3\xa9t\xc3\xa9" };  /* "été" */
	run_all_splits("l'\xc3\xa9t\xc3\xa9 dernier", nl, 1, 2, 0);

	/* stop at the very start and at the very end */
	run_all_splits("User: hi", one, 1, 0, 0);
	run_all_splits("hi User:", one, 1, 3, 0);

	/* two stops that never overlap: the one present fires */
	static const char *const two[] = { "<|end|>", "\n\n" };
	run_all_splits("line one\nline two\n\nline three<|end|>", two, 2, 17, 1);
	run_all_splits("a <|en <|end|> b\n\n", two, 2, 7, 0);
}

static void test_held_then_released(void **state)
{
	(void)state;
	static const char *const stops[] = { "</s>" };
	struct stopper s;
	struct sink k = { .n = 0 };
	assert_int_equal(stopper_init(&s, stops, 1), 0);
	assert_int_equal(stopper_push(&s, "abc<", 4, emit, &k), 0);
	assert_int_equal(k.n, 3);
	assert_string_equal(k.buf, "abc");
	assert_int_equal(stopper_push(&s, "/", 1, emit, &k), 0);
	assert_int_equal(k.n, 3);        /* "</" still held */
	assert_int_equal(stopper_push(&s, "x>", 2, emit, &k), 0);
	assert_string_equal(k.buf, "abc</x>");   /* released: not a match */
	assert_int_equal(stopper_push(&s, "<", 1, emit, &k), 0);
	assert_string_equal(k.buf, "abc</x>");
	assert_int_equal(stopper_push(&s, "<", 1, emit, &k), 0);
	assert_string_equal(k.buf, "abc</x><");  /* first '<' released, second held */
	assert_int_equal(stopper_push(&s, "/s", 2, emit, &k), 0);
	assert_string_equal(k.buf, "abc</x><");
	assert_int_equal(stopper_push(&s, ">tail", 5, emit, &k), 1);
	assert_string_equal(k.buf, "abc</x><");
	assert_int_equal(s.hit, 0);
	stopper_flush(&s, emit, &k);     /* nothing after a hit */
	assert_string_equal(k.buf, "abc</x><");
	stopper_done(&s);
}

static void test_earliest_wins(void **state)
{
	(void)state;
	struct stopper s;
	struct sink k = { .n = 0 };
	/* both complete in one push: the one that starts first wins */
	static const char *const st[] = { "world", "lo w", "e" };
	assert_int_equal(stopper_init(&s, st, 2), 0);
	assert_int_equal(stopper_push(&s, "hello world", 11, emit, &k), 1);
	assert_string_equal(k.buf, "hel");
	assert_int_equal(s.hit, 1);
	stopper_done(&s);

	k.n = 0;
	k.buf[0] = '\0';
	assert_int_equal(stopper_init(&s, st, 3), 0);
	assert_int_equal(stopper_push(&s, "hello world", 11, emit, &k), 1);
	assert_string_equal(k.buf, "h");
	assert_int_equal(s.hit, 2);
	stopper_done(&s);

	/* a stop that is a prefix of another: same start, the first listed */
	static const char *const pre[] = { "ab", "abc" };
	k.n = 0;
	k.buf[0] = '\0';
	assert_int_equal(stopper_init(&s, pre, 2), 0);
	assert_int_equal(stopper_push(&s, "xxabc", 5, emit, &k), 1);
	assert_string_equal(k.buf, "xx");
	stopper_done(&s);

	/* earlier start in a later push still beats nothing: split across */
	static const char *const three[] = { "STOP", "END", "\n\n" };
	run_all_splits("text\n then END and STOP", three, 3, 11, 1);
	run_all_splits("a STOP b END", three, 3, 2, 0);
}

static void test_no_stops(void **state)
{
	(void)state;
	struct stopper s;
	struct sink k = { .n = 0 };
	assert_int_equal(stopper_init(&s, NULL, 0), 0);
	assert_int_equal(stopper_push(&s, "any </s> text", 13, emit, &k), 0);
	assert_int_equal(k.calls, 1);
	assert_int_equal(stopper_push(&s, "", 0, emit, &k), 0);
	assert_int_equal(k.calls, 1);    /* empty push: no emit */
	assert_int_equal(stopper_push(&s, "<", 1, emit, &k), 0);
	assert_string_equal(k.buf, "any </s> text<");  /* nothing held */
	stopper_flush(&s, emit, &k);
	assert_string_equal(k.buf, "any </s> text<");
	assert_int_equal(s.hit, -1);
	stopper_done(&s);

	/* empty and NULL stop strings are ignored: pass-through as well */
	static const char *const empties[] = { "", NULL, "" };
	k.n = 0;
	k.calls = 0;
	assert_int_equal(stopper_init(&s, empties, 3), 0);
	assert_int_equal(s.n_stops, 0);
	assert_int_equal(stopper_push(&s, "abc", 3, emit, &k), 0);
	assert_int_equal(k.n, 3);
	stopper_done(&s);
	/* an empty string among real ones does not match everywhere */
	static const char *const mixed[] = { "zz", "" };
	run_all_splits("abc z zz", mixed, 2, 6, 0);
	stopper_done(&s);  /* done twice is harmless */
}

static void test_flush(void **state)
{
	(void)state;
	static const char *const stops[] = { "###", "Q:" };
	struct stopper s;
	struct sink k = { .n = 0 };
	assert_int_equal(stopper_init(&s, stops, 2), 0);
	assert_int_equal(stopper_push(&s, "answer ##", 9, emit, &k), 0);
	assert_string_equal(k.buf, "answer ");
	assert_int_equal(stopper_push(&s, "Q", 1, emit, &k), 0);
	assert_string_equal(k.buf, "answer ##");   /* "##Q" cannot start "###" */
	stopper_flush(&s, emit, &k);
	assert_string_equal(k.buf, "answer ##Q");
	stopper_flush(&s, emit, &k);               /* nothing twice */
	assert_string_equal(k.buf, "answer ##Q");
	/* usable after a flush */
	assert_int_equal(stopper_push(&s, " Q:", 3, emit, &k), 1);
	assert_string_equal(k.buf, "answer ##Q ");
	stopper_done(&s);

	/* flush with nothing held emits nothing */
	k.n = 0;
	k.calls = 0;
	k.buf[0] = '\0';
	assert_int_equal(stopper_init(&s, stops, 2), 0);
	stopper_flush(&s, emit, &k);
	assert_int_equal(k.calls, 0);
	stopper_done(&s);
}

/* Long streams: the held buffer never grows past the longest stop. */
static void test_long_stream(void **state)
{
	(void)state;
	static const char *const stops[] = { "<|im_end|>" };
	struct stopper s;
	struct sink k = { .n = 0 };
	assert_int_equal(stopper_init(&s, stops, 1), 0);
	size_t total = 0;
	for (int i = 0; i < 600; i++) {  /* ends with "<|im_" held */
		const char *piece = (i % 3) ? "<|im_" : "ab";
		size_t before = k.n;
		assert_int_equal(stopper_push(&s, piece, strlen(piece), emit, &k), 0);
		total += strlen(piece);
		assert_true(s.n_pend < strlen(stops[0]));
		assert_int_equal(k.n + s.n_pend, total);
		assert_true(k.n >= before);
	}
	assert_int_equal(stopper_push(&s, "end|>", 5, emit, &k), 1);
	stopper_flush(&s, emit, &k);
	assert_int_equal(k.n, total - strlen("<|im_"));
	stopper_done(&s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_split_everywhere),
		cmocka_unit_test(test_held_then_released),
		cmocka_unit_test(test_earliest_wins),
		cmocka_unit_test(test_no_stops),
		cmocka_unit_test(test_flush),
		cmocka_unit_test(test_long_stream),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}

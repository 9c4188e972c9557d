/*
 * tests/unit/test_tokenizer.c — the SentencePiece shim and the streaming
 * detokenizer (text/tokenizer.cc, text/detok.c).
 *
 * Models come from $MODELS (default ../shared/models):
 *   tokenizer.model                 Llama 2, 32000 pieces
 *   tok512.model                    llama2.c's 512-piece tokenizer
 *   ggml-vocab-llama-spm.gguf.inp   llama.cpp's tokenizer test strings
 *   ggml-vocab-llama-spm.gguf.out   their expected ids (no BOS)
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/unit/testutil.h"

#include "format/llama2c.h"
#include "text/tokenizer.h"
#include "util/utf8.h"
#include "tests/unit/tok_vectors.h"

struct fixture {
	struct tok *llama;  /* tokenizer.model */
	struct tok *t512;   /* tok512.model */
};

static const char *models_dir(void)
{
	const char *m = getenv("MODELS");
	return m && *m ? m : "../shared/models";
}

/* malloc'd "$MODELS/name" */
static char *model_path(const char *name)
{
	return path_join(models_dir(), name);
}


static int group_setup(void **state)
{
	struct fixture *fx = calloc(1, sizeof *fx);
	char *cause = NULL;
	char *p;

	if (!fx)
		return -1;
	p = model_path("tokenizer.model");
	fx->llama = tok_load(p, &cause);
	if (!fx->llama)
		fprintf(stderr, "%s\n", cause ? cause : "?");
	free(cause);
	cause = NULL;
	free(p);
	p = model_path("tok512.model");
	fx->t512 = tok_load(p, &cause);
	if (!fx->t512)
		fprintf(stderr, "%s\n", cause ? cause : "?");
	free(cause);
	free(p);
	*state = fx;
	return fx->llama && fx->t512 ? 0 : -1;
}

static int group_teardown(void **state)
{
	struct fixture *fx = *state;
	if (fx) {
		tok_free(fx->llama);
		tok_free(fx->t512);
		free(fx);
	}
	return 0;
}

/* Encode without BOS; returns the count, ids in *ids. */
static int enc(const struct tok *t, const char *s, int32_t **ids)
{
	int n = tok_encode(t, s, strlen(s), 0, ids);
	assert_true(n >= 0);
	return n;
}

/* Stream ids through a detok (at_start set), checking every chunk is valid
 * UTF-8; returns the malloc'd concatenation, length in *len. */
static char *stream(const struct tok *t, const int32_t *ids, int n,
		    size_t *len)
{
	struct detok d;
	char chunk[128];
	size_t cap = 64, used = 0;
	char *all = malloc(cap);
	assert_non_null(all);
	detok_init(&d, t, 1);
	for (int i = 0; i <= n; i++) {
		int r = i < n ? detok_feed(&d, ids[i], chunk, sizeof chunk)
			      : detok_flush(&d, chunk, sizeof chunk);
		assert_true(r >= 0);
		assert_int_equal(chunk[r], '\0');
		assert_true(utf8_valid(chunk, (size_t)r));
		if (used + (size_t)r + 1 > cap) {
			cap = 2 * (used + (size_t)r + 1);
			all = realloc(all, cap);
			assert_non_null(all);
		}
		memcpy(all + used, chunk, (size_t)r);
		used += (size_t)r;
	}
	all[used] = '\0';
	*len = used;
	return all;
}

/* Check that streaming ids equals tok_decode of them. */
static void assert_stream_matches_decode(const struct tok *t,
					 const int32_t *ids, int n)
{
	char *whole = NULL;
	size_t slen;
	int dlen = tok_decode(t, ids, n, &whole);
	assert_true(dlen >= 0);
	char *s = stream(t, ids, n, &slen);
	assert_int_equal(slen, (size_t)dlen);
	assert_memory_equal(s, whole, slen);
	free(s);
	free(whole);
}

/* ---- llama.cpp vectors ------------------------------------------------ */

/* The 46 vectors (format in tok_vectors.h), each also streamed. */
static void test_ggml_vectors(void **state)
{
	struct fixture *fx = *state;
	/* normal text: streaming gives what tok_decode gives */
	check_ggml_vectors(fx->llama, assert_stream_matches_decode);
}

/* ---- Llama 2 tokenizer ------------------------------------------------ */

static void test_llama_basics(void **state)
{
	struct fixture *fx = *state;
	int32_t *ids = NULL;

	assert_int_equal(tok_n_vocab(fx->llama), 32000);
	assert_int_equal(tok_bos(fx->llama), 1);
	assert_int_equal(tok_eos(fx->llama), 2);
	assert_true(tok_is_control(fx->llama, 0)); /* <unk> */
	assert_true(tok_is_control(fx->llama, 1));
	assert_true(tok_is_control(fx->llama, 2));
	assert_false(tok_is_control(fx->llama, 450));
	assert_false(tok_is_control(fx->llama, 32000));
	assert_null(tok_piece(fx->llama, -1));
	assert_null(tok_piece(fx->llama, 32000));
	assert_int_equal(tok_drops_leading_space(fx->llama), 1);

	int n = tok_encode(fx->llama, "Hello world", 11, 1, &ids);
	assert_int_equal(n, 3);
	assert_int_equal(ids[0], 1);
	assert_int_equal(ids[1], 15043); /* ▁Hello */
	assert_int_equal(ids[2], 3186);  /* ▁world */
	free(ids);

	n = tok_encode(fx->llama, "", 0, 1, &ids);
	assert_int_equal(n, 1);
	assert_int_equal(ids[0], 1);
	free(ids);
	n = tok_encode(fx->llama, "", 0, 0, &ids);
	assert_int_equal(n, 0);
	free(ids);

	assert_int_equal(tok_encode(fx->llama, NULL, 3, 0, &ids), -EINVAL);
}

static void test_llama_roundtrip(void **state)
{
	struct fixture *fx = *state;
	static const char *texts[] = {
		"Hello world",
		"The quick brown fox jumps over the lazy dog.",
		"  two leading spaces, trailing two  ",
		"line one\nline two\n\ttabbed",
		"Crème brûlée à la française, naïve café",
		"Ελληνικά και русский текст",
		"中文测试：你好，世界！",
		"emoji 🙂🦙 and rare CJK 𠀀𪚥",
		"x",
	};
	for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
		int32_t *ids = NULL;
		char *back = NULL;
		int n = enc(fx->llama, texts[i], &ids);
		int len = tok_decode(fx->llama, ids, n, &back);
		assert_int_equal(len, (int)strlen(texts[i]));
		assert_string_equal(back, texts[i]);
		assert_stream_matches_decode(fx->llama, ids, n);
		free(back);
		free(ids);
	}
}

static void test_llama_byte_fallback(void **state)
{
	struct fixture *fx = *state;
	/* U+1F642 and U+20000 are not in the vocabulary: "▁" then 4 bytes */
	static const struct {
		const char *text;
		uint8_t bytes[4];
	} cases[] = {
		{ "🙂", { 0xf0, 0x9f, 0x99, 0x82 } },
		{ "𠀀", { 0xf0, 0xa0, 0x80, 0x80 } },
	};
	for (size_t c = 0; c < 2; c++) {
		int32_t *ids = NULL;
		int n = enc(fx->llama, cases[c].text, &ids);
		assert_int_equal(n, 5);
		assert_string_equal(tok_piece(fx->llama, ids[0]),
				    "\xe2\x96\x81");
		uint8_t b = 0;
		assert_false(tok_is_byte(fx->llama, ids[0], &b));
		for (int i = 1; i < 5; i++) {
			char name[8];
			assert_true(tok_is_byte(fx->llama, ids[i], &b));
			assert_int_equal(b, cases[c].bytes[i - 1]);
			snprintf(name, sizeof name, "<0x%02X>", b);
			assert_string_equal(tok_piece(fx->llama, ids[i]), name);
			assert_false(tok_is_control(fx->llama, ids[i]));
		}
		free(ids);
	}
	/* byte pieces are ids 3..258 */
	uint8_t b;
	assert_true(tok_is_byte(fx->llama, 3, &b));
	assert_int_equal(b, 0x00);
	assert_true(tok_is_byte(fx->llama, 258, &b));
	assert_int_equal(b, 0xff);
	assert_false(tok_is_byte(fx->llama, 259, &b));
	assert_false(tok_is_byte(fx->llama, 2, &b));
	assert_false(tok_is_byte(fx->llama, -1, &b));
}

static void test_llama_piece_ids(void **state)
{
	struct fixture *fx = *state;
	for (int id = 0; id < tok_n_vocab(fx->llama); id++) {
		const char *p = tok_piece(fx->llama, id);
		assert_non_null(p);
		assert_int_equal(tok_piece_to_id(fx->llama, p), id);
	}
	assert_string_equal(tok_piece(fx->llama, 1), "<s>");
	assert_string_equal(tok_piece(fx->llama, 2), "</s>");
	assert_string_equal(tok_piece(fx->llama, 13), "<0x0A>");
	assert_string_equal(tok_piece(fx->llama, 450), "\xe2\x96\x81The");
	assert_int_equal(tok_piece_to_id(fx->llama, "\xe2\x96\x81the"), 278);
	assert_int_equal(tok_piece_to_id(fx->llama, "no such piece here"), -1);
	assert_int_equal(tok_piece_to_id(fx->llama, ""), -1);
	assert_int_equal(tok_piece_to_id(fx->llama, NULL), -1);
}

static void test_decode_bad_ids(void **state)
{
	struct fixture *fx = *state;
	int32_t bad[] = { 450, 32000 };
	int32_t neg[] = { -1 };
	char *text = NULL;
	char buf[64];
	struct detok d;

	assert_int_equal(tok_decode(fx->llama, bad, 2, &text), -EINVAL);
	assert_null(text);
	assert_int_equal(tok_decode(fx->llama, neg, 1, &text), -EINVAL);
	assert_int_equal(tok_decode(fx->llama, NULL, 0, &text), 0);
	assert_string_equal(text, "");
	free(text);
	detok_init(&d, fx->llama, 1);
	assert_int_equal(detok_feed(&d, 32000, buf, sizeof buf), -EINVAL);
	assert_int_equal(detok_feed(&d, -5, buf, sizeof buf), -EINVAL);
}

/* ---- tok512 ----------------------------------------------------------- */

static void test_tok512(void **state)
{
	struct fixture *fx = *state;
	/* from: echo "Once upon a time" |
	 *   spm_encode --model=$MODELS/tok512.model --output_format=id */
	static const int32_t want[] = { 403, 407, 261, 378 };
	int32_t *ids = NULL;

	assert_int_equal(tok_n_vocab(fx->t512), 512);
	assert_int_equal(tok_bos(fx->t512), 1);
	assert_int_equal(tok_eos(fx->t512), 2);
	int n = enc(fx->t512, "Once upon a time", &ids);
	assert_int_equal(n, 4);
	assert_memory_equal(ids, want, sizeof want);
	assert_stream_matches_decode(fx->t512, ids, n);
	free(ids);

	/* tok512 keeps remove_extra_whitespaces at its default (true):
	 * sentencepiece collapses and strips runs of spaces. */
	n = enc(fx->t512, "  Once upon   a time  ", &ids);
	assert_int_equal(n, 4);
	assert_memory_equal(ids, want, sizeof want);
	free(ids);
}

/* ---- streaming detokenizer --------------------------------------------- */

static void test_stream_mixed(void **state)
{
	struct fixture *fx = *state;
	const char *text = "héllo 世界 🙂!";
	int32_t *ids = NULL;
	size_t len;

	/* with BOS: the BOS resets at_start, the dummy prefix is dropped */
	int n = tok_encode(fx->llama, text, strlen(text), 1, &ids);
	assert_true(n > 1);
	assert_int_equal(ids[0], 1);
	char *s = stream(fx->llama, ids, n, &len); /* checks every chunk */
	assert_int_equal(len, strlen(text));
	assert_memory_equal(s, text, len);
	free(s);
	assert_stream_matches_decode(fx->llama, ids, n);
	free(ids);
}

static void test_stream_invalid_byte(void **state)
{
	struct fixture *fx = *state;
	struct detok d;
	char buf[64];
	int ff = tok_piece_to_id(fx->llama, "<0xFF>");
	int e4 = tok_piece_to_id(fx->llama, "<0xE4>");
	int the = tok_piece_to_id(fx->llama, "\xe2\x96\x81The");
	assert_true(ff > 0 && e4 > 0 && the > 0);

	/* a lone 0xFF, then flush: U+FFFD in all */
	detok_init(&d, fx->llama, 1);
	int r1 = detok_feed(&d, ff, buf, sizeof buf);
	assert_true(r1 >= 0);
	char got[32];
	memcpy(got, buf, (size_t)r1);
	int r2 = detok_flush(&d, buf, sizeof buf);
	assert_true(r2 >= 0);
	memcpy(got + r1, buf, (size_t)r2);
	assert_int_equal(r1 + r2, 3);
	assert_memory_equal(got, "\xef\xbf\xbd", 3);

	/* a lone lead byte is held, then becomes U+FFFD at flush */
	detok_init(&d, fx->llama, 1);
	assert_int_equal(detok_feed(&d, e4, buf, sizeof buf), 0);
	assert_int_equal(detok_flush(&d, buf, sizeof buf), 3);
	assert_string_equal(buf, "\xef\xbf\xbd");
	assert_int_equal(detok_flush(&d, buf, sizeof buf), 0);

	/* a piece breaking a sequence: U+FFFD, then the piece (whose space
	 * stays, as the bytes were the first text) */
	detok_init(&d, fx->llama, 1);
	assert_int_equal(detok_feed(&d, e4, buf, sizeof buf), 0);
	assert_int_equal(detok_feed(&d, the, buf, sizeof buf), 7);
	assert_string_equal(buf, "\xef\xbf\xbd The");

	/* tok_decode agrees on these invalid runs */
	int32_t ids1[] = { ff };
	int32_t ids2[] = { e4, the, e4 };
	int32_t ids3[] = { e4, 2, e4, 1, the }; /* EOS/BOS break byte runs */
	assert_stream_matches_decode(fx->llama, ids1, 1);
	assert_stream_matches_decode(fx->llama, ids2, 3);
	/* ids3: a mid-sequence BOS differs from tok_decode by design */
	detok_init(&d, fx->llama, 1);
	assert_int_equal(detok_feed(&d, ids3[0], buf, sizeof buf), 0);
	assert_int_equal(detok_feed(&d, ids3[1], buf, sizeof buf), 3);
	assert_int_equal(detok_feed(&d, ids3[2], buf, sizeof buf), 0);
	assert_int_equal(detok_feed(&d, ids3[3], buf, sizeof buf), 3);
	assert_int_equal(detok_feed(&d, ids3[4], buf, sizeof buf), 3);
	assert_string_equal(buf, "The");
}

static void test_stream_split_emoji(void **state)
{
	struct fixture *fx = *state;
	static const char *pieces[] = { "<0xF0>", "<0x9F>", "<0x99>",
					"<0x82>" };
	struct detok d;
	char buf[64];

	detok_init(&d, fx->llama, 1);
	for (int i = 0; i < 4; i++) {
		int id = tok_piece_to_id(fx->llama, pieces[i]);
		assert_true(id > 0);
		int r = detok_feed(&d, id, buf, sizeof buf);
		if (i < 3) {
			assert_int_equal(r, 0);
			assert_string_equal(buf, "");
		} else {
			assert_int_equal(r, 4);
			assert_string_equal(buf, "🙂");
		}
	}
	assert_int_equal(detok_flush(&d, buf, sizeof buf), 0);
}

static void test_stream_at_start(void **state)
{
	struct fixture *fx = *state;
	struct detok d;
	char buf[64];

	/* at_start drops the space of the first piece only */
	detok_init(&d, fx->llama, 1);
	assert_int_equal(detok_feed(&d, 450, buf, sizeof buf), 3);
	assert_string_equal(buf, "The");
	assert_int_equal(detok_feed(&d, 450, buf, sizeof buf), 4);
	assert_string_equal(buf, " The");
	/* EOS: nothing; BOS: nothing, but the next space is dropped again */
	assert_int_equal(detok_feed(&d, 2, buf, sizeof buf), 0);
	assert_int_equal(detok_feed(&d, 450, buf, sizeof buf), 4);
	assert_int_equal(detok_feed(&d, 1, buf, sizeof buf), 0);
	assert_int_equal(detok_feed(&d, 450, buf, sizeof buf), 3);
	/* <unk> produces no text */
	assert_int_equal(detok_feed(&d, 0, buf, sizeof buf), 0);

	/* without at_start the space stays */
	detok_init(&d, fx->llama, 0);
	assert_int_equal(detok_feed(&d, 450, buf, sizeof buf), 4);
	assert_string_equal(buf, " The");

	/* "▁" alone at start vanishes; the dummy prefix is consumed */
	detok_init(&d, fx->llama, 1);
	assert_int_equal(detok_feed(&d, 29871, buf, sizeof buf), 0);
	assert_int_equal(detok_feed(&d, 450, buf, sizeof buf), 4);
}

static void test_stream_nospace(void **state)
{
	struct fixture *fx = *state;
	struct detok d;
	char small[4], buf[64];
	int e4 = tok_piece_to_id(fx->llama, "<0xE4>");

	detok_init(&d, fx->llama, 0);
	assert_int_equal(detok_feed(&d, 450, small, sizeof small), -ENOSPC);
	assert_int_equal(detok_feed(&d, 450, small, 0), -ENOSPC);
	/* the failed feed left the stream as it was */
	assert_int_equal(detok_feed(&d, 450, buf, sizeof buf), 4);
	assert_int_equal(detok_feed(&d, e4, small, sizeof small), 0);
	assert_int_equal(detok_flush(&d, small, 3), -ENOSPC);
	assert_int_equal(detok_flush(&d, small, sizeof small), 3);
}

/* ---- load errors ------------------------------------------------------ */

static void test_load_errors(void **state)
{
	(void)state;
	char *cause = NULL;
	const char *missing = "/nonexistent/dir/x.model";

	assert_null(tok_load(missing, &cause));
	assert_non_null(cause);
	assert_non_null(strstr(cause, missing));
	assert_non_null(strstr(cause, "No such file"));
	free(cause);
	cause = NULL;
	assert_null(tok_load(missing, NULL)); /* cause is optional */

	char dir[] = "/tmp/test_tokenizer.XXXXXX";
	assert_non_null(mkdtemp(dir));
	char path[128];
	snprintf(path, sizeof path, "%s/garbage.model", dir);
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	for (int i = 0; i < 4096; i++)
		fputc((i * 7919 + 13) & 0xff, f);
	fclose(f);
	assert_null(tok_load(path, &cause));
	assert_non_null(cause);
	assert_non_null(strstr(cause, path));
	assert_non_null(strstr(cause, "not a tokenizer this llamad reads"));
	free(cause);
	cause = NULL;

	/* an empty file parses as an empty proto: still rejected */
	f = fopen(path, "wb");
	assert_non_null(f);
	fclose(f);
	assert_null(tok_load(path, &cause));
	assert_non_null(cause);
	assert_non_null(strstr(cause, path));
	free(cause);
	cause = NULL;
	unlink(path);

	/* a directory */
	assert_null(tok_load(dir, &cause));
	assert_non_null(cause);
	assert_non_null(strstr(cause, dir));
	free(cause);
	cause = NULL;
	rmdir(dir);

	static const char junk[] = "this is not a protobuf at all";
	assert_null(tok_load_mem(junk, sizeof junk, "gguf metadata", &cause));
	assert_non_null(cause);
	assert_non_null(strstr(cause, "gguf metadata"));
	free(cause);
	tok_free(NULL);
}

/* ---- llama2.c tokenizer.bin ---------------------------------------------- */

/* tok_load of a llama2.c tokenizer.bin gives the SentencePiece vocabulary it
 * was exported from: the Llama 2 one equals tokenizer.model piece for piece
 * and encodes llama.cpp's 46 vectors to the same ids; tok512.bin's pieces
 * equal tok512.model's and stories' prompt encodes the same. */
static void test_llama2c_bin(void **state)
{
	struct fixture *fx = *state;
	char *cause = NULL;
	char *p = model_path("tokenizer.bin");
	struct tok *t = tok_load(p, &cause);
	if (!t)
		fail_msg("%s", cause ? cause : "?");
	free(p);
	assert_int_equal(tok_kind(t), TOK_SPM);
	assert_int_equal(tok_n_vocab(t), tok_n_vocab(fx->llama));
	assert_int_equal(tok_bos(t), tok_bos(fx->llama));
	assert_int_equal(tok_eos(t), tok_eos(fx->llama));
	for (int i = 0; i < tok_n_vocab(t); i++) {
		if (strcmp(tok_piece(t, i), tok_piece(fx->llama, i)) ||
		    tok_type(t, i) != tok_type(fx->llama, i) ||
		    tok_score(t, i) != tok_score(fx->llama, i))
			fail_msg("piece %d: \"%s\" type %d score %g; tokenizer.model: \"%s\" %d %g", i,
				 tok_piece(t, i), tok_type(t, i), tok_score(t, i),
				 tok_piece(fx->llama, i), tok_type(fx->llama, i),
				 tok_score(fx->llama, i));
	}
	check_ggml_vectors(t, NULL);
	tok_free(t);

	p = model_path("tok512.bin");
	t = tok_load(p, &cause);
	if (!t)
		fail_msg("%s", cause ? cause : "?");
	assert_int_equal(tok_n_vocab(t), 512);
	for (int i = 0; i < 512; i++)
		assert_string_equal(tok_piece(t, i), tok_piece(fx->t512, i));
	int32_t *a = NULL, *b = NULL;
	int na = tok_encode(t, "Once upon a time, Lily saw 3 dogs.", 34, 1, &a);
	int nb = tok_encode(fx->t512, "Once upon a time, Lily saw 3 dogs.", 34, 1, &b);
	assert_true(na > 5);
	assert_int_equal(na, nb);
	assert_memory_equal(a, b, (size_t)na * sizeof(int32_t));
	free(a);
	free(b);
	tok_free(t);

	/* cut short: not a tokenizer.bin any more, and refused naming the
	 * formats that are read */
	size_t len;
	char *whole = slurp(p, &len);
	assert_non_null(whole);
	free(p);
	char dir[] = "/tmp/test_tokenizer.XXXXXX";
	assert_non_null(mkdtemp(dir));
	char path[128];
	snprintf(path, sizeof(path), "%s/cut.bin", dir);
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(whole, 1, len - 3, f), len - 3);
	fclose(f);
	assert_false(l2c_tok_check(whole, len - 3, NULL));
	assert_true(l2c_tok_check(whole, len, NULL));
	assert_null(tok_load(path, &cause));
	assert_non_null(cause);
	assert_non_null(strstr(cause, "llama2.c tokenizer.bin"));
	free(cause);
	unlink(path);
	rmdir(dir);
	free(whole);
}

static void test_load_mem(void **state)
{
	struct fixture *fx = *state;
	char *p = model_path("tok512.model");
	size_t len;
	char *data = slurp(p, &len);
	char *cause = NULL;
	int32_t *a = NULL, *b = NULL;

	assert_non_null(data);
	struct tok *t = tok_load_mem(data, len, "tok512 in memory", &cause);
	assert_non_null(t);
	free(data); /* the tokenizer keeps its own copy */
	assert_int_equal(tok_n_vocab(t), 512);
	int na = enc(t, "Once upon a time there was a llama.", &a);
	int nb = enc(fx->t512, "Once upon a time there was a llama.", &b);
	assert_int_equal(na, nb);
	assert_memory_equal(a, b, (size_t)na * sizeof *a);
	free(a);
	free(b);
	tok_free(t);
	free(p);
}

/* ---- UTF-8 validation --------------------------------------------------- */

/* --tokenizer may name a GGUF file: its vocabulary is loaded (the
 * SentencePiece one of ggml-vocab-llama-spm.gguf here), and it encodes as
 * tokenizer.model does. */
static void test_load_gguf_vocab(void **state)
{
	(void)state;
	char *p = model_path("ggml-vocab-llama-spm.gguf"), *cause = NULL;
	struct tok *g = tok_load(p, &cause);
	if (!g)
		fprintf(stderr, "%s\n", cause);
	assert_non_null(g);
	char *q = model_path("tokenizer.model");
	struct tok *t = tok_load(q, &cause);
	assert_non_null(t);
	assert_int_equal(tok_n_vocab(g), tok_n_vocab(t));
	const char *text = "Hello world, 12345 caf\xc3\xa9";
	int32_t *a = NULL, *b = NULL;
	int na = tok_encode(g, text, strlen(text), 1, &a);
	int nb = tok_encode(t, text, strlen(text), 1, &b);
	assert_true(na > 2);
	assert_int_equal(na, nb);
	assert_memory_equal(a, b, (size_t)na * sizeof(int32_t));
	free(a);
	free(b);
	tok_free(g);
	tok_free(t);
	free(p);
	free(q);
}

static void test_utf8(void **state)
{
	(void)state;
	static const struct {
		const char *s;
		size_t len;
		int valid;
		size_t prefix;
	} cases[] = {
		{ "", 0, 1, 0 },
		{ "abc", 3, 1, 3 },
		{ "a\0b", 3, 1, 3 },
		{ "h\xc3\xa9llo", 6, 1, 6 },
		{ "\xe4\xb8\x96\xe7\x95\x8c", 6, 1, 6 },
		{ "\xf0\x9f\x99\x82", 4, 1, 4 },
		{ "\xf4\x8f\xbf\xbf", 4, 1, 4 },     /* U+10FFFF */
		{ "\xed\x9f\xbf", 3, 1, 3 },         /* U+D7FF */
		{ "\xee\x80\x80", 3, 1, 3 },         /* U+E000 */
		{ "\xef\xbf\xbd", 3, 1, 3 },         /* U+FFFD */
		{ "\xc0\x80", 2, 0, 0 },             /* overlong NUL */
		{ "\xc1\xbf", 2, 0, 0 },             /* overlong */
		{ "\xe0\x80\xaf", 3, 0, 0 },         /* overlong '/' */
		{ "\xf0\x80\x80\xaf", 4, 0, 0 },     /* overlong */
		{ "\xed\xa0\x80", 3, 0, 0 },         /* surrogate D800 */
		{ "\xed\xbf\xbf", 3, 0, 0 },         /* surrogate DFFF */
		{ "\xf4\x90\x80\x80", 4, 0, 0 },     /* U+110000 */
		{ "\xf5\x80\x80\x80", 4, 0, 0 },
		{ "\xff", 1, 0, 0 },
		{ "\x80", 1, 0, 0 },                 /* lone continuation */
		{ "ab\xe4\xb8", 4, 0, 2 },           /* truncated 3-byte */
		{ "ab\xf0\x9f\x99", 5, 0, 2 },       /* truncated 4-byte */
		{ "\xc3", 1, 0, 0 },
		{ "ok\xe4\xb8" "A", 5, 0, 2 },       /* broken in the middle */
		{ "\xc3\xa9\xc3", 3, 0, 2 },
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		if (utf8_valid(cases[i].s, cases[i].len) != cases[i].valid ||
		    utf8_valid_prefix(cases[i].s, cases[i].len) !=
			    cases[i].prefix)
			fail_msg("utf8 case %zu: valid %d prefix %zu", i,
				 utf8_valid(cases[i].s, cases[i].len),
				 utf8_valid_prefix(cases[i].s, cases[i].len));
	}
}

/* Every invalid byte sequence the detokenizer sees comes out valid and
 * agrees with sentencepiece's whole-sequence decode. */
static void test_stream_byte_runs(void **state)
{
	struct fixture *fx = *state;
	static const uint8_t runs[][5] = {
		{ 4, 0xe4, 0xb8, 0xae, 0x41 }, { 3, 0xe4, 0xb8, 0x41 },
		{ 2, 0xc3, 0x80 },             { 2, 0xc1, 0x80 },
		{ 4, 0xed, 0x90, 0x80, 0x80 }, { 3, 0xed, 0xa0, 0x80 },
		{ 4, 0xf4, 0x90, 0x80, 0x80 }, { 3, 0xe0, 0x80, 0x80 },
		{ 3, 0xe0, 0xa0, 0x80 },       { 4, 0xf0, 0x9f, 0xf0, 0x9f },
		{ 1, 0x00 },                   { 4, 0xbf, 0xf8, 0xc2, 0xa0 },
	};
	for (size_t r = 0; r < sizeof runs / sizeof *runs; r++) {
		int32_t ids[6];
		int n = 0;
		for (int i = 0; i < runs[r][0]; i++)
			ids[n++] = 3 + runs[r][1 + i]; /* <0xXX> is id 3+XX */
		ids[n++] = 450;
		assert_stream_matches_decode(fx->llama, ids, n);
		assert_stream_matches_decode(fx->llama, ids, n - 1);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ggml_vectors),
		cmocka_unit_test(test_llama_basics),
		cmocka_unit_test(test_llama_roundtrip),
		cmocka_unit_test(test_llama_byte_fallback),
		cmocka_unit_test(test_llama_piece_ids),
		cmocka_unit_test(test_decode_bad_ids),
		cmocka_unit_test(test_tok512),
		cmocka_unit_test(test_llama2c_bin),
		cmocka_unit_test(test_stream_mixed),
		cmocka_unit_test(test_stream_invalid_byte),
		cmocka_unit_test(test_stream_split_emoji),
		cmocka_unit_test(test_stream_at_start),
		cmocka_unit_test(test_stream_nospace),
		cmocka_unit_test(test_stream_byte_runs),
		cmocka_unit_test(test_load_errors),
		cmocka_unit_test(test_load_mem),
		cmocka_unit_test(test_load_gguf_vocab),
		cmocka_unit_test(test_utf8),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

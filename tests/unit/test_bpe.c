/*
 * tests/unit/test_bpe.c — the byte-level BPE tokenizer (text/tok_bpe.c)
 * through tokenizer.h, and the streaming detokenizer over its ids.
 *
 *  - the real Llama 3 tokenizer, $MODELS/llama3-tokenizer/tokenizer.json
 *    (default ../shared/models), against goldens made by independent
 *    JavaScript implementations: tests/golden/llama3/tokenize.json and
 *    chat.json (path relative to the repository root, where tests/run.sh
 *    runs; $GOLDEN overrides the folder; see tests/golden/llama3/make.sh);
 *  - its special tokens, end-of-turn ids and input checks;
 *  - small hand-written tokenizer.json files (the 256 byte tokens of GPT-2's
 *    byte-level alphabet and a few merges) for the BPE rules and, mutated,
 *    for every refusal of the loader, each with the file and the reason.
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
#include <jansson.h>

#include "tests/unit/testutil.h"
#include "tests/unit/real_tok.h"

#include "text/tokenizer.h"
#include "util/utf8.h"

#define LLAMA3_BOS 128000
#define LLAMA3_EOS 128001     /* <|end_of_text|> */
#define LLAMA3_SHS 128006     /* <|start_header_id|> */
#define LLAMA3_EHS 128007     /* <|end_header_id|> */
#define LLAMA3_EOT 128009     /* <|eot_id|> */

/* The Split regex of Llama 3's tokenizer.json, as the loader expects it. */
static const char k_llama3_regex[] =
	"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
	" ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

struct fixture {
	struct tok *l3;         /* the Llama 3 tokenizer */
	json_t *tokenize;       /* tokenize.json */
	json_t *chat;           /* chat.json */
	char tmp[64];           /* scratch folder for hand-written files */
};

static struct fixture *g_fx;

static const char *models_dir(void)
{
	return env_or("MODELS", "../shared/models");
}

static json_t *load_golden(const char *name)
{
	char *p = path_join(env_or("GOLDEN", "tests/golden/llama3"), name);
	json_error_t err;
	json_t *j = json_load_file(p, JSON_ALLOW_NUL, &err);
	if (!j)
		fprintf(stderr, "test_bpe: cannot read %s (line %d: %s); run from the repository "
			"root or set GOLDEN\n", p, err.line, err.text);
	free(p);
	return j;
}

static int group_setup(void **state)
{
	struct fixture *fx = calloc(1, sizeof *fx);
	if (!fx)
		return -1;
	fx->l3 = llama3_tok();
	fx->tokenize = load_golden("tokenize.json");
	fx->chat = load_golden("chat.json");
	snprintf(fx->tmp, sizeof fx->tmp, "%s/test_bpe.XXXXXX", env_or("TMPDIR", "/tmp"));
	if (!mkdtemp(fx->tmp)) {
		perror("test_bpe: mkdtemp");
		fx->tmp[0] = 0;
	}
	*state = g_fx = fx;
	return fx->l3 && fx->tokenize && fx->chat && fx->tmp[0] ? 0 : -1;
}

static int group_teardown(void **state)
{
	struct fixture *fx = *state;
	if (!fx)
		return 0;
	tok_free(fx->l3);
	json_decref(fx->tokenize);
	json_decref(fx->chat);
	if (fx->tmp[0])
		rmdir(fx->tmp);  /* each test removes its own files */
	free(fx);
	return 0;
}

/* ---- helpers ---------------------------------------------------------------- */

/* Print ids[from..from+k) of a list, for failure messages. */
static void print_ids(const char *label, const int32_t *ids, size_t n, size_t from)
{
	size_t lo = from > 3 ? from - 3 : 0, hi = from + 5 < n ? from + 5 : n;
	fprintf(stderr, "    %s (%zu ids) [%zu..%zu): ", label, n, lo, hi);
	for (size_t i = lo; i < hi; i++)
		fprintf(stderr, "%s%d", i > lo ? " " : "", ids[i]);
	fprintf(stderr, "\n");
}

/* Compare got with want; on a difference print the case and the first
 * differing position and return 0. */
static int same_ids(const char *name, const int32_t *want, size_t nw, const int32_t *got,
		    size_t ng)
{
	size_t i = 0;
	while (i < nw && i < ng && want[i] == got[i])
		i++;
	if (i == nw && i == ng)
		return 1;
	fprintf(stderr, "  case %s: ids differ at position %zu\n", name, i);
	print_ids("expected", want, nw, i);
	print_ids("llamad  ", got, ng, i);
	return 0;
}

/* A golden case's ids as int32 (malloc'd; n in *n). */
static int32_t *json_ids(json_t *arr, size_t *n)
{
	*n = json_array_size(arr);
	int32_t *ids = xmalloc(*n * sizeof(*ids));
	for (size_t i = 0; i < *n; i++) {
		json_t *v = json_array_get(arr, i);
		assert_true(json_is_integer(v));
		ids[i] = (int32_t)json_integer_value(v);
	}
	return ids;
}

static void show_bytes(const char *label, const char *s, size_t n)
{
	fprintf(stderr, "    %s (%zu bytes): \"", label, n);
	for (size_t i = 0; i < n && i < 120; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\')
			fputc(c, stderr);
		else
			fprintf(stderr, "\\x%02x", c);
	}
	fprintf(stderr, "%s\"\n", n > 120 ? "..." : "");
}

/* 1 if a == b byte for byte; otherwise print both with the case name. */
static int same_bytes(const char *name, const char *what, const char *want, size_t nw,
		      const char *got, size_t ng)
{
	if (nw == ng && memcmp(want, got, nw) == 0)
		return 1;
	size_t i = 0;
	while (i < nw && i < ng && want[i] == got[i])
		i++;
	fprintf(stderr, "  case %s: %s differs from the text at byte %zu\n", name, what, i);
	size_t from = i > 16 ? i - 16 : 0;
	show_bytes("text   ", want + from, nw - from);
	show_bytes("decoded", got + from, ng - from);
	return 0;
}

/* A case of tokenize.json: its name, its text (which may hold NULs) and
 * its golden ids. */
struct golden {
	const char *name, *text;
	size_t len, n;
	const int32_t *ids;
};

/* check on every case of tokenize.json (each prints why it fails); returns
 * how many cases failed. */
static size_t each_golden(const struct fixture *fx,
			  int (*check)(const struct fixture *fx, const struct golden *g))
{
	json_t *cases = json_object_get(fx->tokenize, "cases");
	size_t i, bad = 0;
	json_t *c;
	json_array_foreach(cases, i, c) {
		json_t *tx = json_object_get(c, "text");
		size_t n;
		int32_t *ids = json_ids(json_object_get(c, "ids"), &n);
		const struct golden g = { json_string_value(json_object_get(c, "name")),
					  json_string_value(tx), json_string_length(tx), n, ids };
		bad += !check(fx, &g);
		free(ids);
	}
	return bad;
}

/* ---- Llama 3 goldens ---------------------------------------------------------- */

static void test_golden_has_cases(void **state)
{
	struct fixture *fx = *state;
	json_t *cases = json_object_get(fx->tokenize, "cases");
	assert_true(json_is_array(cases));
	/* a golden file cut short would pass every loop below */
	assert_true(json_array_size(cases) >= 40);
	assert_true(json_array_size(json_object_get(fx->chat, "cases")) >= 5);
	assert_string_equal(json_string_value(json_object_get(fx->chat, "bos_token")),
			    "<|begin_of_text|>");
}

/* tok_encode gives the golden ids exactly (no BOS, special text plain). */
static int encode_ok(const struct fixture *fx, const struct golden *g)
{
	int32_t *got = NULL;
	int n = tok_encode(fx->l3, g->text, g->len, 0, &got);
	int ok = n >= 0 && same_ids(g->name, g->ids, g->n, got, (size_t)n);
	if (n < 0)
		fprintf(stderr, "  case %s: tok_encode failed (%d)\n", g->name, n);
	free(got);
	return ok;
}

static void test_golden_encode(void **state)
{
	struct fixture *fx = *state;
	size_t bad = each_golden(fx, encode_ok);
	if (bad)
		fprintf(stderr, "%zu of %zu golden cases differ\n", bad,
			json_array_size(json_object_get(fx->tokenize, "cases")));
	assert_int_equal(bad, 0);
}

/* tok_decode of the golden ids gives the text back byte for byte. */
static int decode_ok(const struct fixture *fx, const struct golden *g)
{
	char *text = NULL;
	int n = tok_decode(fx->l3, g->ids, (int)g->n, &text);
	int ok = n >= 0 && same_bytes(g->name, "tok_decode", g->text, g->len, text, (size_t)n);
	if (n < 0)
		fprintf(stderr, "  case %s: tok_decode failed (%d)\n", g->name, n);
	free(text);
	return ok;
}

static void test_golden_decode(void **state)
{
	assert_int_equal(each_golden(*state, decode_ok), 0);
}

/* The ids fed one at a time through the streaming detokenizer: every chunk
 * valid UTF-8, all of them together the text. */
static int detok_stream_ok(const struct fixture *fx, const struct golden *g)
{
	size_t nw = g->n, len = 0, cap = g->len + 64;
	const char *name = g->name;
	char *all = xmalloc(cap);
	char chunk[128];
	struct detok d;
	int ok = 1;
	detok_init(&d, fx->l3, 0);
	for (size_t k = 0; k <= nw && ok; k++) {
		int r = k < nw ? detok_feed(&d, g->ids[k], chunk, sizeof chunk)
			       : detok_flush(&d, chunk, sizeof chunk);
		if (r < 0) {
			fprintf(stderr, "  case %s: detok_%s at id %zu failed (%d)\n", name,
				k < nw ? "feed" : "flush", k, r);
			ok = 0;
		} else if (!utf8_valid(chunk, (size_t)r)) {
			fprintf(stderr, "  case %s: chunk after id %zu is not valid UTF-8\n", name, k);
			show_bytes("chunk", chunk, (size_t)r);
			ok = 0;
		} else if (len + (size_t)r > cap) {
			fprintf(stderr, "  case %s: the stream gives more bytes than the text\n", name);
			ok = 0;
		} else {
			memcpy(all + len, chunk, (size_t)r);
			len += (size_t)r;
		}
	}
	if (ok && !same_bytes(name, "the detok stream", g->text, g->len, all, len))
		ok = 0;
	free(all);
	return ok;
}

static void test_golden_detok_stream(void **state)
{
	assert_int_equal(each_golden(*state, detok_stream_ok), 0);
}

/* tok_text of each golden id, one after another, spells the text: byte-level
 * pieces ("Ġhi") come back as the bytes they stand for (" hi"). */
static int token_texts_ok(const struct fixture *fx, const struct golden *g)
{
	size_t cap = g->len + 1, len = 0;
	char *all = xmalloc(cap + 256);
	for (size_t k = 0; k < g->n; k++)
		len += tok_text(fx->l3, g->ids[k], all + len, cap + 256 - len);
	int ok = same_bytes(g->name, "the tokens' texts", g->text, g->len, all, len);
	free(all);
	return ok;
}

static void test_golden_token_texts(void **state)
{
	assert_int_equal(each_golden(*state, token_texts_ok), 0);
}

/* Append the ids of text[0..n) (encoded plain, no BOS) to got[*len..cap). */
static void append_encoded(const struct tok *t, const char *text, size_t n, int32_t *got,
			   size_t *len, size_t cap)
{
	int32_t *ids = NULL;
	int k = tok_encode(t, text, n, 0, &ids);
	assert_true(k >= 0 && *len + (size_t)k <= cap);
	memcpy(got + *len, ids, (size_t)k * sizeof(*ids));
	*len += (size_t)k;
	free(ids);
}

/* chat.json: the rendered template, cut at the special tokens' text (put in
 * by id, as llamad's templates do) with the text between encoded plain,
 * gives the golden ids. */
static void test_golden_chat(void **state)
{
	struct fixture *fx = *state;
	json_t *cases = json_object_get(fx->chat, "cases");
	size_t i, bad = 0;
	json_t *c;
	json_array_foreach(cases, i, c) {
		const char *name = json_string_value(json_object_get(c, "name"));
		const char *r = json_string_value(json_object_get(c, "rendered"));
		size_t nw, n = 0, cap = strlen(r) + 16;
		int32_t *want = json_ids(json_object_get(c, "ids"), &nw);
		int32_t *got = xmalloc(cap * sizeof(*got));
		const char *p = r, *text = r;
		while (*p) {
			const char *e = strncmp(p, "<|", 2) == 0 ? strstr(p + 2, "|>") : NULL;
			char piece[64];
			int id = -1;
			if (e && (size_t)(e + 2 - p) < sizeof piece) {
				memcpy(piece, p, (size_t)(e + 2 - p));
				piece[e + 2 - p] = 0;
				id = tok_piece_to_id(fx->l3, piece);
			}
			if (id < 0 || !tok_is_control(fx->l3, id)) {
				p++;
				continue;
			}
			append_encoded(fx->l3, text, (size_t)(p - text), got, &n, cap - 1);
			got[n++] = id;
			p = text = e + 2;
		}
		append_encoded(fx->l3, text, strlen(text), got, &n, cap);
		bad += !same_ids(name, want, nw, got, n);
		free(want);
		free(got);
	}
	assert_int_equal(bad, 0);
}

/* ---- Llama 3 special tokens and input checks ----------------------------------- */

static void test_llama3_specials(void **state)
{
	struct fixture *fx = *state;
	struct tok *t = fx->l3;
	assert_int_equal(tok_kind(t), TOK_BPE);
	assert_int_equal(tok_n_vocab(t), 128256);
	assert_int_equal(tok_bos(t), LLAMA3_BOS);
	assert_int_equal(tok_eos(t), LLAMA3_EOS);
	assert_true(tok_is_end(t, LLAMA3_EOT));
	assert_true(tok_is_end(t, LLAMA3_EOS));
	assert_false(tok_is_end(t, LLAMA3_BOS));
	assert_false(tok_is_end(t, LLAMA3_SHS));
	assert_false(tok_is_end(t, 13));  /* "." */
	assert_int_equal(tok_piece_to_id(t, "<|start_header_id|>"), LLAMA3_SHS);
	assert_int_equal(tok_piece_to_id(t, "<|end_header_id|>"), LLAMA3_EHS);
	assert_int_equal(tok_piece_to_id(t, "<|eot_id|>"), LLAMA3_EOT);
	assert_int_equal(tok_piece_to_id(t, "<|begin_of_text|>"), LLAMA3_BOS);
	assert_int_equal(tok_piece_to_id(t, "<|no_such_token|>"), -1);
	assert_true(tok_is_control(t, LLAMA3_EOT));
	assert_false(tok_is_control(t, 9906));
	assert_string_equal(tok_piece(t, 9906), "Hello");
	assert_string_equal(tok_piece(t, 1917), "\xc4\xa0world");  /* "Ġworld" */
	assert_null(tok_piece(t, 128256));
	assert_string_equal(tok_pre(t), "llama-bpe");
	assert_int_equal(tok_n_merges(t), 280147);

	/* bytes: "Ġworld" stands for " world", a control token for none */
	const uint8_t *p;
	size_t n;
	assert_int_equal(tok_bytes(t, 1917, &p, &n), 1);
	assert_int_equal(n, 6);
	assert_memory_equal(p, " world", 6);
	assert_int_equal(tok_bytes(t, LLAMA3_EOT, &p, &n), 1);
	assert_int_equal(n, 0);
	assert_int_equal(tok_bytes(t, -1, &p, &n), 0);

	/* BOS on request, once, first */
	int32_t *ids = NULL;
	int k = tok_encode(t, "Hello world", 11, 1, &ids);
	assert_int_equal(k, 3);
	assert_int_equal(ids[0], LLAMA3_BOS);
	assert_int_equal(ids[1], 9906);
	assert_int_equal(ids[2], 1917);
	free(ids);
	k = tok_encode(t, "", 0, 1, &ids);
	assert_int_equal(k, 1);
	assert_int_equal(ids[0], LLAMA3_BOS);
	free(ids);
}

/* Text that spells special tokens stays text: no id >= 128000. */
static void test_llama3_special_text_is_plain(void **state)
{
	struct fixture *fx = *state;
	static const char *const texts[] = {
		"<|eot_id|>", "a<|eot_id|>b", "<|begin_of_text|>hi<|end_of_text|>",
		"<|start_header_id|>user<|end_header_id|>\n\nhello<|eot_id|>",
	};
	for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
		int32_t *ids = NULL;
		int n = tok_encode(fx->l3, texts[i], strlen(texts[i]), 0, &ids);
		assert_true(n > 1);
		for (int k = 0; k < n; k++) {
			if (ids[k] >= 128000)
				fail_msg("\"%s\" encodes to special id %d at %d", texts[i], ids[k], k);
		}
		char *back = NULL;
		int m = tok_decode(fx->l3, ids, n, &back);
		assert_int_equal(m, (int)strlen(texts[i]));
		assert_string_equal(back, texts[i]);
		free(back);
		free(ids);
	}
}

/* Invalid UTF-8 is refused with -EINVAL and no ids. */
static void test_llama3_invalid_utf8(void **state)
{
	struct fixture *fx = *state;
	static const struct {
		const char *what, *s;
	} bad[] = {
		{ "lone continuation byte", "abc\x80" },
		{ "0xff", "\xff" },
		{ "overlong '/'", "\xc0\xaf" },
		{ "overlong NUL", "a\xc0\x80" },
		{ "surrogate U+D800", "\xed\xa0\x80" },
		{ "above U+10FFFF", "\xf4\x90\x80\x80" },
		{ "truncated 3-byte character", "x\xe2\x82" },
		{ "truncated 4-byte character at the end", "\xf0\x9f\x98" },
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		static int32_t stale;
		int32_t *ids = &stale;  /* must be reset to NULL */
		int n = tok_encode(fx->l3, bad[i].s, strlen(bad[i].s), 0, &ids);
		if (n != -EINVAL)
			fail_msg("%s: tok_encode returned %d, not -EINVAL", bad[i].what, n);
		assert_null(ids);
	}
}

/* ---- hand-written byte-level BPE vocabularies --------------------------------- */

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves,
 * the other 68 for U+0100.. in byte order. */
static unsigned byte_to_cp(unsigned b)
{
	static unsigned map[256];
	static int ready;
	if (!ready) {
		unsigned next = 0x100;
		for (unsigned v = 0; v < 256; v++) {
			int printable = (v >= '!' && v <= '~') || (v >= 0xa1 && v <= 0xac) || v >= 0xae;
			map[v] = printable ? v : next++;
		}
		ready = 1;
	}
	return map[b];
}

/* UTF-8 of the byte-level string for bytes s (NUL-terminated out). */
static void bl_string(const char *s, char *out, size_t cap)
{
	size_t o = 0;
	for (; *s; s++) {
		unsigned cp = byte_to_cp((unsigned char)*s);
		assert_true(o + 3 <= cap);
		if (cp < 0x80) {
			out[o++] = (char)cp;
		} else {
			out[o++] = (char)(0xc0 | cp >> 6);
			out[o++] = (char)(0x80 | (cp & 0x3f));
		}
	}
	out[o] = 0;
}

/* A minimal valid tokenizer.json: ids 0..255 the byte tokens (id = byte),
 * then extra tokens (plain bytes, written byte-level here), then one special
 * added token <|end|>; merges as "left right" byte strings. */
static json_t *mini_json(const char *const *extra, const char *const *merges, int ignore_merges)
{
	json_t *vocab = json_object(), *mg = json_array();
	char buf[128], l[64], r[64];
	int id = 0;
	for (unsigned v = 0; v < 256; v++) {
		char s[2] = { (char)v, 0 };
		if (v == 0) {  /* NUL: bl_string stops at it */
			strcpy(buf, "\xc4\x80");  /* U+0100 */
		} else {
			bl_string(s, buf, sizeof buf);
		}
		json_object_set_new(vocab, buf, json_integer(id++));
	}
	for (; extra && *extra; extra++) {
		bl_string(*extra, buf, sizeof buf);
		json_object_set_new(vocab, buf, json_integer(id++));
	}
	for (; merges && *merges; merges++) {
		const char *sp = strchr(*merges + 1, ' ');
		assert_non_null(sp);
		char a[64];
		snprintf(a, sizeof a, "%.*s", (int)(sp - *merges), *merges);
		bl_string(a, l, sizeof l);
		bl_string(sp + 1, r, sizeof r);
		snprintf(buf, sizeof buf, "%s %s", l, r);
		json_array_append_new(mg, json_string(buf));
	}
	json_t *root = json_pack(
		"{s:s, s:[{s:i, s:s, s:b, s:b, s:b, s:b, s:b}], s:n, "
		"s:{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]}, "
		"s:n, s:{s:s, s:b, s:b, s:b}, "
		"s:{s:s, s:n, s:n, s:b, s:b, s:b, s:o, s:o}}",
		"version", "1.0",
		"added_tokens", "id", id, "content", "<|end|>", "single_word", 0, "lstrip", 0,
		"rstrip", 0, "normalized", 0, "special", 1,
		"normalizer",
		"pre_tokenizer", "type", "Sequence", "pretokenizers",
		"type", "Split", "pattern", "Regex", k_llama3_regex, "behavior", "Isolated",
		"invert", 0,
		"type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0,
		"post_processor",
		"decoder", "type", "ByteLevel", "add_prefix_space", 1, "trim_offsets", 1,
		"use_regex", 1,
		"model", "type", "BPE", "dropout", "unk_token", "fuse_unk", 0, "byte_fallback", 0,
		"ignore_merges", ignore_merges, "vocab", vocab, "merges", mg);
	assert_non_null(root);
	return root;
}

static char *write_text(const char *name, const char *s, size_t n)
{
	char *p = path_join(g_fx->tmp, name);
	FILE *f = fopen(p, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(s, 1, n, f), n);
	assert_int_equal(fclose(f), 0);
	return p;
}

/* root written as fx->tmp/name and loaded, which must succeed with no
 * cause; the file is removed again. */
static struct tok *mini_load(const char *name, json_t *root)
{
	char *path = path_join(g_fx->tmp, name);
	assert_int_equal(json_dump_file(root, path, JSON_COMPACT), 0);
	char *cause = NULL;
	struct tok *t = tok_load(path, &cause);
	if (!t)
		fail_msg("tok_load(%s) refused a valid file: %s", path, cause ? cause : "(no cause)");
	assert_null(cause);
	unlink(path);
	free(path);
	return t;
}

/* tok_load(path) must refuse with a cause (printed) that names path and
 * says reason; name: the case. */
static void expect_refused(const char *name, const char *path, const char *reason)
{
	char *cause = NULL;
	struct tok *t = tok_load(path, &cause);
	if (t) {
		tok_free(t);
		fail_msg("%s: tok_load accepted the file (expected a refusal: %s)", name, reason);
	}
	if (!cause)
		fail_msg("%s: refused with no cause", name);
	fprintf(stderr, "  %s: %s\n", name, cause);
	if (!strstr(cause, path))
		fail_msg("%s: the cause does not name the file %s", name, path);
	if (!strstr(cause, reason))
		fail_msg("%s: the cause does not say \"%s\"", name, reason);
	free(cause);
}

/* Encode bytes s and compare with the expected tokens, given as byte strings
 * (looked up by their byte-level spelling). */
static void expect_tokens(struct tok *t, const char *s, const char *const *want)
{
	int32_t *ids = NULL;
	int n = tok_encode(t, s, strlen(s), 0, &ids);
	assert_true(n >= 0);
	int nw = 0;
	while (want[nw])
		nw++;
	int ok = n == nw;
	for (int i = 0; ok && i < n; i++) {
		char bl[128];
		bl_string(want[i], bl, sizeof bl);
		ok = tok_piece_to_id(t, bl) == ids[i];
	}
	if (!ok) {
		fprintf(stderr, "  \"%s\" encodes to", s);
		for (int i = 0; i < n; i++)
			fprintf(stderr, " %d \"%s\"", ids[i], tok_piece(t, ids[i]));
		fprintf(stderr, "; expected");
		for (int i = 0; i < nw; i++)
			fprintf(stderr, " \"%s\"", want[i]);
		fprintf(stderr, "\n");
	}
	free(ids);
	assert_true(ok);
}

#define TOKS(...) ((const char *const[]){ __VA_ARGS__, NULL })

/* Merges apply by rank, the leftmost pair first on a tie, until none
 * applies; the result does not depend on the order pairs appear in. */
static void test_mini_merge_rules(void **state)
{
	(void)state;
	/* "  a" is the merge of " " and "a" */
	json_t *root = mini_json(TOKS("aa", "bc", "ab", "abc", "aaaa", " a", "xyz"),
				 TOKS("a a", "b c", "a b", "aa aa", "a bc", "  a"), 0);
	struct tok *t = mini_load("rules.json", root);
	assert_int_equal(tok_n_vocab(t), 256 + 7 + 1);
	assert_int_equal(tok_n_merges(t), 6);
	assert_int_equal(tok_piece_to_id(t, "<|end|>"), 256 + 7);
	assert_true(tok_is_control(t, 256 + 7));

	expect_tokens(t, "a", TOKS("a"));
	expect_tokens(t, "aaa", TOKS("aa", "a"));            /* leftmost of two equal pairs */
	expect_tokens(t, "aaaa", TOKS("aaaa"));              /* aa+aa, then aa aa (rank 3) */
	expect_tokens(t, "aaaaa", TOKS("aaaa", "a"));
	expect_tokens(t, "abc", TOKS("abc"));                /* "b c" (1) before "a b" (2), then "a bc" */
	expect_tokens(t, "abd", TOKS("ab", "d"));
	expect_tokens(t, "bca", TOKS("bc", "a"));
	expect_tokens(t, "cab", TOKS("c", "ab"));
	expect_tokens(t, "xyz", TOKS("x", "y", "z"));        /* in the vocab, but no merge makes it */
	expect_tokens(t, "a a", TOKS("a", " a"));            /* words "a", " a" */
	expect_tokens(t, "a aa", TOKS("a", " ", "aa"));      /* "a a" (0) before " a" (5) */
	expect_tokens(t, "<|end|>", TOKS("<", "|", "e", "n", "d", "|", ">"));  /* plain text */
	tok_free(t);
	json_decref(root);
}

/* Without ignore_merges a vocabulary word reachable by no merge is spelled
 * by the merges; with it, it is one token. Merges may be [left, right]. */
static void test_mini_ignore_merges_and_pair_form(void **state)
{
	(void)state;
	json_t *root = mini_json(TOKS("xyz", "xy"), TOKS("x y"), 0);
	struct tok *t = mini_load("noignore.json", root);
	expect_tokens(t, "xyz", TOKS("xy", "z"));
	tok_free(t);

	/* the newer merges form: ["x", "y"] */
	json_t *mg = json_object_get(json_object_get(root, "model"), "merges");
	json_array_clear(mg);
	json_array_append_new(mg, json_pack("[s, s]", "x", "y"));
	json_object_set_new(json_object_get(root, "model"), "ignore_merges", json_true());
	t = mini_load("pairs.json", root);
	expect_tokens(t, "xyz", TOKS("xyz"));
	expect_tokens(t, "xyx", TOKS("xy", "x"));
	tok_free(t);
	json_decref(root);
}

/* Every byte round-trips, alone and in a stream of single-byte ids. */
static void test_mini_all_bytes(void **state)
{
	(void)state;
	json_t *root = mini_json(NULL, NULL, 1);
	struct tok *t = mini_load("bytes.json", root);
	for (unsigned v = 0; v < 256; v++) {
		const uint8_t *b;
		size_t n;
		assert_int_equal(tok_bytes(t, (int)v, &b, &n), 1);
		if (n != 1 || b[0] != v)
			fail_msg("token %u stands for %zu bytes, not the byte 0x%02x", v, n, v);
	}
	/* "é" is two byte tokens; the stream holds the first back */
	int32_t ids[2] = { 0xc3, 0xa9 };
	char out[16];
	struct detok d;
	detok_init(&d, t, 0);
	assert_int_equal(detok_feed(&d, ids[0], out, sizeof out), 0);
	assert_int_equal(detok_feed(&d, ids[1], out, sizeof out), 2);
	assert_string_equal(out, "\xc3\xa9");
	/* a lone lead byte at the end becomes U+FFFD */
	assert_int_equal(detok_feed(&d, 0xe2, out, sizeof out), 0);
	assert_int_equal(detok_flush(&d, out, sizeof out), 3);
	assert_string_equal(out, "\xef\xbf\xbd");
	tok_free(t);
	json_decref(root);
}

/* ---- malformed vocabularies ------------------------------------------------------ */

typedef void (*mutate_fn)(json_t *root);

static json_t *model_of(json_t *root)
{
	return json_object_get(root, "model");
}

static json_t *vocab_of(json_t *root)
{
	return json_object_get(model_of(root), "vocab");
}

static void m_merge_unknown(json_t *root)
{
	json_array_append_new(json_object_get(model_of(root), "merges"), json_string("a qq"));
}

static void m_merge_not_in_vocab(json_t *root)
{
	/* both halves are tokens, "xq" is not */
	json_array_append_new(json_object_get(model_of(root), "merges"), json_string("x q"));
}

static void m_merge_makes_added(json_t *root)
{
	/* "xq" only as a special added token: "x q" would emit it from text */
	json_t *a = json_array_get(json_object_get(root, "added_tokens"), 0);
	json_object_set_new(a, "content", json_string("xq"));
	json_array_append_new(json_object_get(model_of(root), "merges"), json_string("x q"));
}

static void m_merge_names_added(json_t *root)
{
	json_t *a = json_array_get(json_object_get(root, "added_tokens"), 0);
	json_object_set_new(a, "special", json_false());
	json_object_set_new(a, "content", json_string("x!"));
	json_object_set_new(vocab_of(root), "x!a", json_integer(260));
	json_array_append_new(json_object_get(model_of(root), "merges"), json_string("x! a"));
}

static void m_merge_no_space(json_t *root)
{
	json_array_append_new(json_object_get(model_of(root), "merges"), json_string("aa"));
}

static void m_merge_not_string(json_t *root)
{
	json_array_append_new(json_object_get(model_of(root), "merges"), json_integer(7));
}

static void m_duplicate_id(json_t *root)
{
	/* "ab" takes the id of "aa": two tokens, one id */
	json_object_set_new(vocab_of(root), "ab",
			    json_integer(json_integer_value(json_object_get(vocab_of(root), "aa"))));
}

static void m_id_gap(json_t *root)
{
	/* "xyz" leaves its id for one past the added token: a hole in the ids */
	json_object_set_new(vocab_of(root), "xyz", json_integer(400));
}

static void m_added_conflict(json_t *root)
{
	json_t *a = json_array_get(json_object_get(root, "added_tokens"), 0);
	json_object_set_new(a, "id", json_integer(json_integer_value(
		json_object_get(vocab_of(root), "aa"))));
}

/* The vocabulary's token "xyz" spelled s instead, with the same id. */
static void respell_xyz(json_t *root, const char *s)
{
	json_t *v = vocab_of(root);
	json_t *id = json_incref(json_object_get(v, "xyz"));
	json_object_del(v, "xyz");
	json_object_set_new(v, s, id);
}

static void m_not_bytelevel_space(json_t *root)
{
	/* a raw space: the byte-level alphabet spells it U+0120 'Ġ' */
	respell_xyz(root, "x z");
}

static void m_not_bytelevel_cjk(json_t *root)
{
	respell_xyz(root, "x\xe4\xb8\x80");  /* U+4E00 */
}

static void m_missing_byte(json_t *root)
{
	/* the byte 'q' (0x71) loses its token; id 0x71 is spelled "qq" */
	json_t *v = vocab_of(root);
	json_object_del(v, "q");
	json_object_set_new(v, "qq", json_integer(0x71));
}

static void m_empty_token(json_t *root)
{
	respell_xyz(root, "");
}

static void m_negative_id(json_t *root)
{
	json_object_set_new(vocab_of(root), "xyz", json_integer(-3));
}

static void m_string_id(json_t *root)
{
	json_object_set_new(vocab_of(root), "xyz", json_string("258"));
}

static void m_vocab_array(json_t *root)
{
	json_object_set_new(model_of(root), "vocab", json_array());
}

static void m_no_merges(json_t *root)
{
	json_object_del(model_of(root), "merges");
}

static void m_model_wordpiece(json_t *root)
{
	json_object_set_new(model_of(root), "type", json_string("WordPiece"));
}

static void m_model_missing(json_t *root)
{
	json_object_del(root, "model");
}

static void m_byte_fallback(json_t *root)
{
	json_object_set_new(model_of(root), "byte_fallback", json_true());
}

static void m_pre_whitespace(json_t *root)
{
	json_object_set_new(root, "pre_tokenizer", json_pack("{s:s}", "type", "Whitespace"));
}

static void m_pre_none(json_t *root)
{
	json_object_set_new(root, "pre_tokenizer", json_null());
}

static void m_pre_other_regex(json_t *root)
{
	json_t *sp = json_array_get(json_object_get(json_object_get(root, "pre_tokenizer"),
						    "pretokenizers"), 0);
	json_object_set_new(json_object_get(sp, "pattern"), "Regex", json_string("\\s+|\\S+"));
}

static void m_pre_prefix_space(json_t *root)
{
	json_t *bl = json_array_get(json_object_get(json_object_get(root, "pre_tokenizer"),
						    "pretokenizers"), 1);
	json_object_set_new(bl, "add_prefix_space", json_true());
}

static void m_normalizer(json_t *root)
{
	json_object_set_new(root, "normalizer", json_pack("{s:s}", "type", "NFC"));
}

static void m_added_not_array(json_t *root)
{
	json_object_set_new(root, "added_tokens", json_object());
}

static void m_added_no_id(json_t *root)
{
	json_object_del(json_array_get(json_object_get(root, "added_tokens"), 0), "id");
}

static void m_small_vocab(json_t *root)
{
	json_t *v = json_object();
	json_object_set_new(v, "a", json_integer(0));
	json_object_set_new(model_of(root), "vocab", v);
	json_array_clear(json_object_get(model_of(root), "merges"));
	json_array_clear(json_object_get(root, "added_tokens"));
}

/* How a malformed file is made: a mutation of the valid one, or raw text
 * (text set), or the valid file cut in the middle (cut set); and what the
 * cause must say. One row, one cmocka test. */
struct bad_case {
	const char *name;
	mutate_fn mutate;
	const char *text;
	int cut;
	const char *reason;
};

#define BAD_CASES(X) \
	X(truncated, NULL, NULL, 1, "not valid JSON") \
	X(not_json, NULL, "this is not JSON\n", 0, "not valid JSON") \
	X(empty_file, NULL, "", 0, "not valid JSON") \
	X(merge_unknown_token, m_merge_unknown, NULL, 0, "names an unknown token \"qq\"") \
	X(merge_not_in_vocab, m_merge_not_in_vocab, NULL, 0, "makes a token the vocabulary lacks") \
	X(merge_makes_added_token, m_merge_makes_added, NULL, 0, \
	  "\"x q\" makes token 259, which is not a vocabulary token") \
	X(merge_names_added_token, m_merge_names_added, NULL, 0, \
	  "\"x! a\" names token 259, which is not a vocabulary token") \
	X(merge_without_space, m_merge_no_space, NULL, 0, "not two tokens separated by a space") \
	X(merge_not_string, m_merge_not_string, NULL, 0, "is an integer, not a merge") \
	X(duplicate_id, m_duplicate_id, NULL, 0, "id 256 is used twice") \
	X(id_gap, m_id_gap, NULL, 0, "id 258 has no token (ids must run from 0") \
	X(added_token_conflict, m_added_conflict, NULL, 0, "and added token \"<|end|>\"") \
	X(not_bytelevel_space, m_not_bytelevel_space, NULL, 0, \
	  "\"x z\" is not a byte-level BPE string") \
	X(not_bytelevel_cjk, m_not_bytelevel_cjk, NULL, 0, "is not a byte-level BPE string") \
	X(missing_byte, m_missing_byte, NULL, 0, "byte 0x71 has no token") \
	X(empty_token, m_empty_token, NULL, 0, "is empty") \
	X(negative_id, m_negative_id, NULL, 0, "has id out of range") \
	X(string_id, m_string_id, NULL, 0, "has id a string") \
	X(vocab_not_object, m_vocab_array, NULL, 0, "model.vocab is an array, not an object") \
	X(merges_missing, m_no_merges, NULL, 0, "model.merges is missing") \
	X(model_wordpiece, m_model_wordpiece, NULL, 0, "model type WordPiece is not supported") \
	X(model_missing, m_model_missing, NULL, 0, "model type (missing) is not supported") \
	X(byte_fallback, m_byte_fallback, NULL, 0, "byte_fallback") \
	X(pre_whitespace, m_pre_whitespace, NULL, 0, "pre-tokenizer Whitespace is not supported") \
	X(pre_none, m_pre_none, NULL, 0, "pre-tokenizer (none) is not supported") \
	X(pre_other_regex, m_pre_other_regex, NULL, 0, "split regex is not one llamad knows") \
	X(pre_prefix_space, m_pre_prefix_space, NULL, 0, "pre-tokenizer Sequence is not supported") \
	X(normalizer, m_normalizer, NULL, 0, "normalizer \"NFC\" is not supported") \
	X(added_tokens_not_array, m_added_not_array, NULL, 0, "added_tokens is an object") \
	X(added_token_without_id, m_added_no_id, NULL, 0, "added_tokens[0] has no valid id") \
	X(vocab_too_small, m_small_vocab, NULL, 0, "too small for byte-level BPE")

static json_t *mini_valid(void)
{
	return mini_json(TOKS("aa", "ab", "xyz"), TOKS("a a", "a b"), 1);
}

/* The unmutated file loads: the refusals below are the mutations' doing. */
static void test_bad_control(void **state)
{
	(void)state;
	json_t *root = mini_valid();
	tok_free(mini_load("valid.json", root));
	json_decref(root);
}

static void run_bad(const struct bad_case *bc)
{
	char name[96];
	char *p;
	snprintf(name, sizeof name, "bad_%s.json", bc->name);
	if (bc->text) {
		p = write_text(name, bc->text, strlen(bc->text));
	} else {
		json_t *root = mini_valid();
		if (bc->mutate)
			bc->mutate(root);
		char *s = json_dumps(root, JSON_COMPACT);
		assert_non_null(s);
		p = write_text(name, s, bc->cut ? strlen(s) / 2 : strlen(s));
		free(s);
		json_decref(root);
	}
	expect_refused(bc->name, p, bc->reason);
	unlink(p);
	free(p);
}

#define BAD_TEST(n, m, t, c, r) \
	static void bad_##n(void **state) \
	{ \
		static const struct bad_case bc = { #n, m, t, c, r }; \
		(void)state; \
		run_bad(&bc); \
	}
BAD_CASES(BAD_TEST)

/* The real tokenizer.json cut in the middle. */
static void test_bad_truncated_llama3(void **state)
{
	(void)state;
	char *src = path_join(models_dir(), "llama3-tokenizer/tokenizer.json");
	size_t n;
	char *buf = slurp(src, &n);
	assert_non_null(buf);
	char *p = write_text("cut_llama3.json", buf, n / 2);
	free(buf);
	free(src);
	expect_refused("cut_llama3", p, "not valid JSON");
	unlink(p);
	free(p);
}

#define BAD_ENTRY(n, m, t, c, r) cmocka_unit_test(bad_##n),

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_golden_has_cases),
		cmocka_unit_test(test_golden_encode),
		cmocka_unit_test(test_golden_decode),
		cmocka_unit_test(test_golden_detok_stream),
		cmocka_unit_test(test_golden_token_texts),
		cmocka_unit_test(test_golden_chat),
		cmocka_unit_test(test_llama3_specials),
		cmocka_unit_test(test_llama3_special_text_is_plain),
		cmocka_unit_test(test_llama3_invalid_utf8),
		cmocka_unit_test(test_mini_merge_rules),
		cmocka_unit_test(test_mini_ignore_merges_and_pair_form),
		cmocka_unit_test(test_mini_all_bytes),
		cmocka_unit_test(test_bad_control),
		cmocka_unit_test(test_bad_truncated_llama3),
		BAD_CASES(BAD_ENTRY)
	};
	return cmocka_run_group_tests_name("test_bpe", tests, group_setup, group_teardown);
}

/*
 * tests/fuzz/fuzz_bpe.c — the byte-level BPE tokenizer (text/tok_bpe.c):
 * the tokenizer.json loader and the encoder, with the streaming
 * detokenizer over its ids.
 *
 * The first input byte picks the half:
 *   even: the rest is text, encoded with the real Llama 3 tokenizer
 *         ($MODELS/llama3-tokenizer/tokenizer.json, loaded once);
 *   odd:  the rest, up to a NUL, is a tokenizer.json written to a private
 *         folder and loaded (it must never crash, leak or hang; a refusal
 *         must come with a cause); if it loads, the bytes after the NUL
 *         are text encoded with it.
 * For the text: valid UTF-8 must encode to ids in range that are never
 * control tokens, and decode back to exactly the text; the ids fed one at
 * a time through detok_feed/detok_flush must give the same bytes in valid
 * UTF-8 chunks. Invalid UTF-8 must be refused with -EINVAL. Any broken rule
 * aborts. Seeds: tests/fuzz/corpus/fuzz_bpe/ (tests/fuzz/gen_corpus.c).
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "text/tokenizer.h"
#include "util/utf8.h"

static struct tok *llama3;
static const char k_sample[] = "Hello world, it's 2024! \xe2\x9c\x93 \xf0\x9f\x90\x89\n";
static char *json_path;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	char *path = fuzz_join(fuzz_models(), "llama3-tokenizer/tokenizer.json");
	char *cause = NULL;
	llama3 = tok_load(path, &cause);
	if (!llama3) {
		fprintf(stderr, "fuzz_bpe: %s\n", cause ? cause : "cannot load");
		abort();
	}
	free(path);
	json_path = fuzz_join(fuzz_tmpdir("fuzz_bpe"), "tokenizer.json");
	return 0;
}

static void check_text(const struct tok *t, const char *text, size_t len)
{
	int32_t *ids = NULL;
	int n = tok_encode(t, text, len, 0, &ids);
	if (!utf8_valid(text, len)) {
		if (n != -EINVAL || ids)
			abort();  /* invalid UTF-8 is refused */
		return;
	}
	if (n < 0) {
		if (n != -ENOMEM)
			abort();  /* valid text always encodes */
		return;
	}
	int nv = tok_n_vocab(t);
	for (int i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= nv || tok_is_control(t, ids[i]))
			abort();  /* special tokens never come out of text */
	char *back = NULL;
	int m = tok_decode(t, ids, n, &back);
	if (m < 0) {
		if (m != -ENOMEM)
			abort();
		free(ids);
		return;
	}
	if ((size_t)m != len || memcmp(back, text, len) != 0)
		abort();  /* byte-level BPE is lossless */

	/* the stream gives the same bytes, each chunk valid UTF-8 */
	char chunk[256];
	size_t got = 0;
	struct detok d;
	detok_init(&d, t, 0);
	for (int i = 0; i <= n; i++) {
		int w = i < n ? detok_feed(&d, ids[i], chunk, sizeof chunk)
			      : detok_flush(&d, chunk, sizeof chunk);
		if (w < 0 || (size_t)w >= sizeof chunk || chunk[w] != 0 ||
		    !utf8_valid(chunk, (size_t)w) || got + (size_t)w > len ||
		    memcmp(chunk, back + got, (size_t)w) != 0)
			abort();
		got += (size_t)w;
	}
	if (got != len)
		abort();
	free(back);
	free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size == 0)
		return 0;
	const char *rest = (const char *)data + 1;
	size_t n = size - 1;
	if (!(data[0] & 1)) {
		check_text(llama3, rest, n);
		return 0;
	}
	const char *nul = memchr(rest, 0, n);
	size_t jn = nul ? (size_t)(nul - rest) : n;
	fuzz_write(json_path, rest, jn);
	char *cause = NULL;
	struct tok *t = tok_load(json_path, &cause);
	if (!t) {
		if (!cause || !strstr(cause, json_path))
			abort();  /* every refusal says which file and why */
		free(cause);
		return 0;
	}
	if (cause || tok_kind(t) != TOK_BPE)
		abort();
	if (nul)
		check_text(t, nul + 1, n - jn - 1);
	else
		check_text(t, k_sample, sizeof k_sample - 1);
	tok_free(t);
	return 0;
}

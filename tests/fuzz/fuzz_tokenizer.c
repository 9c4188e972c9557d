/*
 * tests/fuzz/fuzz_tokenizer.c — the tokenizer shim and the streaming
 * detokenizer (text/tokenizer.c and tok_spm.cc, text/detok.c) over the real
 * tok512.model. The input is text: encode, decode the ids (the text must
 * be valid UTF-8 when the input was). Then the input bytes, two at a time,
 * become ids (mod the vocabulary) fed to the streaming detokenizer: every
 * chunk it returns must be valid UTF-8, or the target aborts.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "text/tokenizer.h"
#include "util/utf8.h"

static struct tok *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	char *path = fuzz_join(fuzz_models(), "tok512.model");
	char *cause = NULL;
	tok = tok_load(path, &cause);
	if (!tok)
		abort();
	free(path);
	return 0;
}

static void check_chunk(const char *out, int n, size_t cap)
{
	if (n < 0 || (size_t)n >= cap || out[n] != 0)
		abort();
	if (!utf8_valid(out, (size_t)n))
		abort();        /* the detokenizer must emit only complete UTF-8 */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *text = (const char *)data;
	int32_t *ids = NULL;
	int n = tok_encode(tok, text, size, size & 1, &ids);
	if (n >= 0) {
		int nv = tok_n_vocab(tok);
		for (int i = 0; i < n; i++)
			if (ids[i] < 0 || ids[i] >= nv)
				abort();
		char *back = NULL;
		int len = tok_decode(tok, ids, n, &back);
		if (len >= 0) {
			if (back[len] != 0)
				abort();        /* (a <0x00> piece may put NULs inside) */
			if (utf8_valid(text, size) && memchr(text, 0, size) == NULL &&
			    !utf8_valid(back, (size_t)len))
				abort();
			free(back);
		}
		free(ids);
	}

	/* streaming: ids from the bytes, both starting modes */
	int nv = tok_n_vocab(tok);
	char out[256];
	for (int at_start = 0; at_start < 2; at_start++) {
		struct detok d;
		detok_init(&d, tok, at_start);
		for (size_t i = 0; i + 1 < size; i += 2) {
			int id = (int)((data[i] | data[i + 1] << 8) % (unsigned)nv);
			int w = detok_feed(&d, id, out, sizeof(out));
			check_chunk(out, w, sizeof(out));
		}
		int w = detok_flush(&d, out, sizeof(out));
		check_chunk(out, w, sizeof(out));
	}
	return 0;
}

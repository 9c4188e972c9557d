/*
 * tests/fuzz/fuzz_template.c — the chat templates (text/chat*.c) over the
 * real tokenizers: tok512.model (SentencePiece) and the Llama 3
 * tokenizer.json (byte-level BPE), loaded once. Linked with the text
 * libraries only (no weight loaders: Makefile's TEXT_FUZZ).
 *
 * Input: byte 0 picks the template (llama2, llama3, raw) and the
 * tokenizer, byte 1 the conversation a turn joins (tokens so far, the last
 * role, an open answer, a user turn before, a system prompt), byte 2 the
 * role; the rest is up to four messages separated by 0x1f (the first is
 * the turn's text and the system prompt's when one is asked for).
 * Rules, any broken one aborts:
 *  - every encoding returns a negative errno, or ids inside the vocabulary
 *    (NULL for none);
 *  - a user turn that opens a conversation is refused with -EPERM exactly
 *    when the template's guard finds a tag in it, and otherwise, for valid
 *    UTF-8 without a NUL, encodes;
 *  - a chat template's dialog of one user message is the ids of that user
 *    turn opening a conversation without a system prompt;
 *  - an answer's text from any ids of a turn is valid UTF-8.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "util/utf8.h"

static struct tok *spm, *bpe;

static struct tok *load(const char *rel)
{
	char *path = fuzz_join(fuzz_models(), rel);
	char *cause = NULL;
	struct tok *t = tok_load(path, &cause);
	if (!t) {
		fprintf(stderr, "fuzz_template: %s\n", cause ? cause : "cannot load");
		abort();
	}
	free(path);
	return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	spm = load("tok512.model");
	bpe = load("llama3-tokenizer/tokenizer.json");
	return 0;
}

/* ids[0, n) of a call that returned n: in range, NULL when none. */
static void check_ids(const struct tok *t, const int32_t *ids, int n)
{
	if (n < 0)
		return;
	if ((n == 0) != (ids == NULL))
		abort();
	for (int i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= tok_n_vocab(t))
			abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 3)
		return 0;
	static const int tmpls[] = { CHAT_TEMPLATE_LLAMA2, CHAT_TEMPLATE_LLAMA3, CHAT_TEMPLATE_RAW };
	int tmpl = tmpls[data[0] % 3];
	const struct tok *t = tmpl == CHAT_TEMPLATE_LLAMA3 || (data[0] & 4) ? bpe : spm;
	if (chat_template_unusable(t, tmpl))
		return 0;
	/* the messages, NUL-terminated copies */
	char *buf = malloc(size - 3 + 1);
	if (!buf)
		return 0;
	memcpy(buf, data + 3, size - 3);
	buf[size - 3] = 0;
	char *msg[4];
	int n_msg = 0;
	for (char *p = buf; n_msg < 4;) {
		msg[n_msg++] = p;
		char *sep = memchr(p, 0x1f, strlen(p));
		if (!sep)
			break;
		*sep = 0;
		p = sep + 1;
	}
	const char *text = msg[0];
	uint8_t h = data[1];
	struct chat_ctx c = {
		.tmpl = (enum chat_template)tmpl, .bos = tok_bos(t), .eos = tok_eos(t),
		.n_tokens = h & 1 ? 7 : 0, .has_user_turn = (h >> 1) & 1,
		.last_role = h & 1 ? (int)((h >> 2) & 3) : -1, .open_answer = (h & 1) && (h & 16),
		.system = h & 32 && n_msg > 1 ? msg[1] : NULL,
	};
	enum chat_role role = (enum chat_role)(data[2] % 4);
	int32_t *ids = NULL;
	int n = chat_encode_turn(t, &c, role, text, &ids);
	check_ids(t, ids, n);
	free(ids);
	n = chat_encode_generation(t, &c, &ids);
	check_ids(t, ids, n);
	free(ids);
	int32_t old[3] = { 5, 6, 7 };
	n = chat_encode_first_turn(t, &c, role, text, old, 3, &ids);
	check_ids(t, ids, n);
	free(ids);

	/* a user turn opening a conversation: never refused, tag or not */
	struct chat_ctx open = { .tmpl = c.tmpl, .bos = c.bos, .eos = c.eos, .last_role = -1 };
	char tag[64];
	int has_tag = chat_find_tag(t, tmpl, text, strlen(text), tag, sizeof tag);  /* exercised */
	int32_t *turn = NULL;
	int nt = chat_encode_turn(t, &open, CHAT_USER, text, &turn);
	check_ids(t, turn, nt);
	if (nt == -EPERM || (utf8_valid(text, strlen(text)) && nt <= 0 && *text))
		abort();
	(void)has_tag;
	/* the dialog of that one message is the same ids */
	if (tmpl != CHAT_TEMPLATE_RAW && nt > 0) {
		struct chat_msg d = { CHAT_USER, text };
		int nd = chat_encode_dialog(t, tmpl, &d, 1, &ids);
		check_ids(t, ids, nd);
		if (nd != nt || memcmp(ids, turn, (size_t)nt * sizeof(int32_t)))
			abort();
		free(ids);
	}
	/* an answer's text from the turn's ids */
	char *answer = NULL;
	int na = nt > 0 ? chat_answer_text(t, tmpl, turn, nt, &answer) : -1;
	if (na >= 0 && !utf8_valid(answer, (size_t)na))
		abort();
	free(answer);
	free(turn);
	free(buf);
	return 0;
}

/*
 * text/chat_raw.c — raw text: no template. Each turn is its text as the
 * tokenizer encodes it, BOS only when it opens the conversation.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat_int.h"

/* Also the rule of a raw turn under any template (chat_encode_turn). */
static int raw_turn(const struct tok *t, const struct chat_ctx *c, enum chat_role role,
		    const char *text, int32_t **ids)
{
	(void)role;
	int first = c->n_tokens == 0;
	/* SentencePiece puts a space before every text it encodes;
	 * byte-level BPE keeps the text's own */
	if (!first && text[0] == ' ' && tok_kind(t) == TOK_SPM)
		text++;
	int n = tok_encode(t, text, strlen(text), first, ids);
	if (n <= 0) {  /* chat.h: *ids NULL when no ids */
		free(*ids);
		*ids = NULL;
	}
	return n < 0 ? -EPROTO : n;
}

static int raw_first_turn(const struct tok *t, const struct chat_ctx *c, enum chat_role role,
			  const char *text, const int32_t *old, int n_old, int32_t **ids)
{
	(void)t;
	(void)role;
	(void)text;
	return chat_first_turn_bos(c, old, n_old, ids);
}

const struct chat_tmpl chat_raw = {
	.id = CHAT_TEMPLATE_RAW,
	.name = "raw",
	.rules = {
		.turns_are_raw = 1,
		.exchange_starts = ~0u,
	},
	.encode_turn = raw_turn,
	.encode_generation = chat_generation_bos,
	.encode_first_turn = raw_first_turn,
};

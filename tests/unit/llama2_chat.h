/*
 * tests/unit/llama2_chat.h — what test_chat.c and test_turns.c share: the
 * real Llama 2 tokenizer ($MODELS/tokenizer.model, default
 * ../shared/models) and the dialog whose golden ids test_chat.c holds.
 * Include after <cmocka.h>.
 */
#ifndef LLAMAD_TESTS_LLAMA2_CHAT_H
#define LLAMAD_TESTS_LLAMA2_CHAT_H

#include <stdio.h>
#include <stdlib.h>

#include "model/chat.h"
#include "model/tokenizer.h"

static const struct chat_msg dialog[] = {
	{ CHAT_SYSTEM, "You are terse." },
	{ CHAT_USER, "Hi there" },
	{ CHAT_ASSISTANT, "Hello!" },
	{ CHAT_USER, "What is 2+2?" },
	{ CHAT_ASSISTANT, "4" },
	{ CHAT_USER, "Thanks. Bye?" },
};

/* The Llama 2 tokenizer, or NULL after printing why. */
static inline struct tok *llama2_tok(void)
{
	const char *dir = getenv("MODELS");
	char path[4096], *cause = NULL;
	snprintf(path, sizeof(path), "%s/tokenizer.model", dir && *dir ? dir : "../shared/models");
	struct tok *t = tok_load(path, &cause);
	if (!t)
		fprintf(stderr, "%s\n", cause ? cause : path);
	free(cause);
	return t;
}

#endif

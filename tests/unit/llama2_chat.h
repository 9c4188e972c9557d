/*
 * tests/unit/llama2_chat.h — what test_chat.c and test_turns.c share: the
 * real Llama 2 tokenizer (llama2_tok, from real_tok.h) and the dialog whose
 * golden ids test_chat.c holds. Include after <cmocka.h>.
 */
#ifndef LLAMAD_TESTS_LLAMA2_CHAT_H
#define LLAMAD_TESTS_LLAMA2_CHAT_H

#include "text/chat.h"
#include "tests/unit/real_tok.h"

static const struct chat_msg dialog[] = {
	{ CHAT_SYSTEM, "You are terse." },
	{ CHAT_USER, "Hi there" },
	{ CHAT_ASSISTANT, "Hello!" },
	{ CHAT_USER, "What is 2+2?" },
	{ CHAT_ASSISTANT, "4" },
	{ CHAT_USER, "Thanks. Bye?" },
};

#endif

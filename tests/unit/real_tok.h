/*
 * tests/unit/real_tok.h — the real tokenizers the unit tests load from
 * $MODELS (default ../shared/models): Llama 2's tokenizer.model and Llama
 * 3's llama3-tokenizer/tokenizer.json. Include after <cmocka.h>.
 */
#ifndef LLAMAD_TESTS_REAL_TOK_H
#define LLAMAD_TESTS_REAL_TOK_H

#include <stdio.h>
#include <stdlib.h>

#include "text/tokenizer.h"

/* The tokenizer $MODELS/name, or NULL after printing why. */
static inline struct tok *models_tok(const char *name)
{
	const char *dir = getenv("MODELS");
	char path[4096], *cause = NULL;
	snprintf(path, sizeof(path), "%s/%s", dir && *dir ? dir : "../shared/models", name);
	struct tok *t = tok_load(path, &cause);
	if (!t)
		fprintf(stderr, "%s\n", cause ? cause : path);
	free(cause);
	return t;
}

/* The Llama 2 tokenizer, or NULL after printing why. */
static inline struct tok *llama2_tok(void)
{
	return models_tok("tokenizer.model");
}

/* The Llama 3 tokenizer, or NULL after printing why. */
static inline struct tok *llama3_tok(void)
{
	return models_tok("llama3-tokenizer/tokenizer.json");
}

#endif

/*
 * text/tok_parts.c — SentencePiece tokenizers from parts: a vocabulary
 * given piece by piece (a GGUF "llama" vocabulary, a llama2.c
 * tokenizer.bin) is written as a SentencePiece ModelProto
 * (proto/sentencepiece_model.proto) and loaded as the library's own
 * tokenizer.model would be.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/llama2c.h"
#include "text/tokenizer.h"
#include "util/cause.h"
#include "sentencepiece_model.pb-c.h"

static void set_cause(char **cause, const char *what, const char *why)
{
	cause_set(cause, "tokenizer %s: %s", what, why);
}

/* The SentencePiece piece type of an enum tok_type (GGUF numbering; 0,
 * undefined, reads as normal), or 0 for an unknown value. */
static int piece_type(int32_t t)
{
	switch (t) {
	case 0:
	case TOK_TYPE_NORMAL: return SENTENCEPIECE__MODEL_PROTO__SENTENCE_PIECE__TYPE__NORMAL;
	case TOK_TYPE_UNKNOWN: return SENTENCEPIECE__MODEL_PROTO__SENTENCE_PIECE__TYPE__UNKNOWN;
	case TOK_TYPE_CONTROL: return SENTENCEPIECE__MODEL_PROTO__SENTENCE_PIECE__TYPE__CONTROL;
	case TOK_TYPE_USER_DEFINED:
		return SENTENCEPIECE__MODEL_PROTO__SENTENCE_PIECE__TYPE__USER_DEFINED;
	case TOK_TYPE_UNUSED: return SENTENCEPIECE__MODEL_PROTO__SENTENCE_PIECE__TYPE__UNUSED;
	case TOK_TYPE_BYTE: return SENTENCEPIECE__MODEL_PROTO__SENTENCE_PIECE__TYPE__BYTE;
	}
	return 0;
}

struct tok *tok_load_spm(const struct tok_spm_spec *s, const char *what, char **cause)
{
	if (cause)
		*cause = NULL;
	int n = s->n_vocab;
	Sentencepiece__ModelProto__SentencePiece *sp = calloc((size_t)n, sizeof(*sp));
	Sentencepiece__ModelProto__SentencePiece **spp = calloc((size_t)n, sizeof(*spp));
	uint8_t *packed = NULL;
	struct tok *t = NULL;
	if (!sp || !spp) {
		set_cause(cause, what, "out of memory");
		goto out;
	}
	int has_byte = 0, has_unk = 0;
	for (int i = 0; i < n; i++) {
		sentencepiece__model_proto__sentence_piece__init(&sp[i]);
		sp[i].piece = (char *)s->pieces[i];
		sp[i].has_score = 1;
		sp[i].score = s->scores ? s->scores[i] : 0.0f;
		int ty = piece_type(s->types ? s->types[i] : TOK_TYPE_NORMAL);
		if (!ty) {
			char why[64];
			snprintf(why, sizeof(why), "token %d has unknown token type %d", i,
				 (int)s->types[i]);
			set_cause(cause, what, why);
			goto out;
		}
		sp[i].has_type = 1;
		sp[i].type = (Sentencepiece__ModelProto__SentencePiece__Type)ty;
		has_byte |= ty == SENTENCEPIECE__MODEL_PROTO__SENTENCE_PIECE__TYPE__BYTE;
		has_unk |= ty == SENTENCEPIECE__MODEL_PROTO__SENTENCE_PIECE__TYPE__UNKNOWN;
		spp[i] = &sp[i];
	}
	/* SentencePiece needs exactly one unknown piece */
	if (!has_unk && s->unk >= 0 && s->unk < n)
		sp[s->unk].type = SENTENCEPIECE__MODEL_PROTO__SENTENCE_PIECE__TYPE__UNKNOWN;

	Sentencepiece__TrainerSpec ts = SENTENCEPIECE__TRAINER_SPEC__INIT;
	ts.has_model_type = 1;
	ts.model_type = SENTENCEPIECE__TRAINER_SPEC__MODEL_TYPE__BPE;
	ts.has_vocab_size = 1;
	ts.vocab_size = n;
	ts.has_byte_fallback = 1;
	ts.byte_fallback = has_byte;
	ts.has_unk_id = ts.has_bos_id = ts.has_eos_id = ts.has_pad_id = 1;
	ts.unk_id = s->unk;
	ts.bos_id = s->bos;
	ts.eos_id = s->eos;
	ts.pad_id = s->pad;
	if (s->unk >= 0 && s->unk < n)
		ts.unk_piece = (char *)s->pieces[s->unk];
	if (s->bos >= 0 && s->bos < n)
		ts.bos_piece = (char *)s->pieces[s->bos];
	if (s->eos >= 0 && s->eos < n)
		ts.eos_piece = (char *)s->pieces[s->eos];
	if (s->pad >= 0 && s->pad < n)
		ts.pad_piece = (char *)s->pieces[s->pad];

	Sentencepiece__NormalizerSpec ns = SENTENCEPIECE__NORMALIZER_SPEC__INIT;
	ns.name = (char *)"identity";
	ns.has_add_dummy_prefix = 1;
	ns.add_dummy_prefix = s->add_dummy_prefix;
	ns.has_remove_extra_whitespaces = 1;
	ns.remove_extra_whitespaces = s->remove_extra_whitespaces;
	ns.has_escape_whitespaces = 1;
	ns.escape_whitespaces = 1;

	Sentencepiece__ModelProto mp = SENTENCEPIECE__MODEL_PROTO__INIT;
	mp.n_pieces = (size_t)n;
	mp.pieces = spp;
	mp.trainer_spec = &ts;
	mp.normalizer_spec = &ns;
	size_t plen = sentencepiece__model_proto__get_packed_size(&mp);
	if (!(packed = malloc(plen ? plen : 1))) {
		set_cause(cause, what, "out of memory");
		goto out;
	}
	sentencepiece__model_proto__pack(&mp, packed);
	t = tok_load_mem(packed, plen, what, cause);
out:
	free(sp);
	free(spp);
	free(packed);
	return t;
}

/* ---- llama2.c tokenizer.bin --------------------------------------------------- */

/* A llama2.c piece in SentencePiece's spelling: spaces as U+2581, and the
 * "\n<s>\n" / "\n</s>\n" its exporter writes for BOS and EOS as <s>, </s>.
 * malloc'd, NULL on ENOMEM. */
static char *spm_spelling(const unsigned char *s, size_t n)
{
	if (n == 5 && !memcmp(s, "\n<s>\n", 5))
		return strdup("<s>");
	if (n == 6 && !memcmp(s, "\n</s>\n", 6))
		return strdup("</s>");
	char *o = malloc(3 * n + 1), *q = o;
	if (!o)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		if (s[i] == ' ') {
			memcpy(q, "\xe2\x96\x81", 3);
			q += 3;
		} else {
			*q++ = (char)s[i];
		}
	}
	*q = '\0';
	return o;
}

/* 1 if piece is "<0xHH>", a byte-fallback piece. */
static int is_byte_piece(const char *p)
{
	return strlen(p) == 6 && !strncmp(p, "<0x", 3) && isxdigit((unsigned char)p[3]) &&
	       isxdigit((unsigned char)p[4]) && p[5] == '>';
}

struct tok *tok_load_llama2c(const void *data, size_t len, const char *what, char **cause)
{
	if (cause)
		*cause = NULL;
	int n = 0;
	if (!l2c_tok_check(data, len, &n)) {
		set_cause(cause, what, "not a llama2.c tokenizer.bin");
		return NULL;
	}
	char **pieces = calloc((size_t)n, sizeof(*pieces));
	float *scores = calloc((size_t)n, sizeof(*scores));
	int32_t *types = calloc((size_t)n, sizeof(*types));
	struct tok *t = NULL;
	int unk = -1, bos = -1, eos = -1;
	if (!pieces || !scores || !types)
		goto nomem;
	const unsigned char *p = (const unsigned char *)data + 4;
	for (int i = 0; i < n; i++) {
		size_t l;
		const unsigned char *piece = l2c_tok_piece(&p, &l, &scores[i]);
		if (!(pieces[i] = spm_spelling(piece, l)))
			goto nomem;
		types[i] = TOK_TYPE_NORMAL;
		if (!strcmp(pieces[i], "<unk>") && unk < 0) {
			types[i] = TOK_TYPE_UNKNOWN;
			unk = i;
		} else if (!strcmp(pieces[i], "<s>") && bos < 0) {
			types[i] = TOK_TYPE_CONTROL;
			bos = i;
		} else if (!strcmp(pieces[i], "</s>") && eos < 0) {
			types[i] = TOK_TYPE_CONTROL;
			eos = i;
		} else if (is_byte_piece(pieces[i])) {
			types[i] = TOK_TYPE_BYTE;
		}
	}
	if (unk < 0) {
		set_cause(cause, what, "llama2.c tokenizer.bin without an <unk> piece");
		goto out;
	}
	struct tok_spm_spec spec = {
		.n_vocab = n, .pieces = (const char *const *)pieces, .scores = scores,
		.types = types, .unk = unk, .bos = bos, .eos = eos, .pad = -1,
		.add_dummy_prefix = 1, .remove_extra_whitespaces = 0,
	};
	t = tok_load_spm(&spec, what, cause);
	goto out;
nomem:
	set_cause(cause, what, "out of memory");
out:
	for (int i = 0; pieces && i < n; i++)
		free(pieces[i]);
	free(pieces);
	free(scores);
	free(types);
	return t;
}

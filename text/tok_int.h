/*
 * text/tok_int.h — inside text/: the kinds behind tokenizer.h and what the
 * tokenizer loaders share. Not for other folders.
 *
 * A kind (SentencePiece in tok_spm.cc, byte-level BPE in tok_bpe.c) is a
 * table of operations over its own state; struct tok (tokenizer.c) holds
 * one kind and sends each call of tokenizer.h to its table. Each
 * operation takes ids already checked against the kind's vocabulary where
 * tokenizer.h says so; an operation a kind lacks is NULL, and tokenizer.c
 * says what that means.
 */
#ifndef LLAMAD_TEXT_TOK_INT_H
#define LLAMAD_TEXT_TOK_INT_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct tok;
struct tok_bpe_spec;

struct tok_ops {
	int kind;                                   /* enum tok_kind */
	void (*free)(void *k);
	int (*n_vocab)(const void *k);
	int (*bos)(const void *k);                  /* -1: none */
	int (*eos)(const void *k);                  /* -1: none */
	int (*encode)(const void *k, const char *text, size_t len, int add_bos, int32_t **ids);
	/* a whole sequence; NULL: the streaming detokenizer run over it */
	int (*decode)(const void *k, const int32_t *ids, int n, char **text);
	const char *(*piece)(const void *k, int id);
	int (*piece_to_id)(const void *k, const char *piece);
	int (*type)(const void *k, int id);         /* enum tok_type, 0 out of range */
	int (*is_control)(const void *k, int id);
	int (*is_byte)(const void *k, int id, uint8_t *byte);   /* NULL: no byte pieces */
	float (*score)(const void *k, int id);                  /* NULL: all 0 */
	int (*bytes)(const void *k, int id, const uint8_t **p, size_t *n); /* NULL: none */
	int (*drops_leading_space)(const void *k);              /* NULL: 0 */
	int (*n_merges)(const void *k);                         /* NULL: no merges */
	const char *(*merge)(const void *k, int i);
	const char *(*pre)(const void *k);                      /* NULL: none */
	const int32_t *(*end_ids)(const void *k, int *n);       /* NULL: none besides EOS */
};

/* SentencePiece (tok_spm.cc): a serialized ModelProto in memory. */
extern const struct tok_ops tok_spm_ops;
void *spm_load_mem(const void *data, size_t len, const char *what, char **cause);

/* byte-level BPE (tok_bpe.c): a vocabulary given as parts. */
extern const struct tok_ops tok_bpe_ops;
void *bpe_load_spec(const struct tok_bpe_spec *spec, const char *what, char **cause);
/* The GGUF name of the pre-tokenizer whose tokenizer.json Split regex is
 * regex, or NULL if llamad knows none. */
const char *bpe_pre_of_regex(const char *regex);

/* A struct tok over kind state k of ops (taken: freed on failure, NULL k
 * gives NULL); its end-of-turn ids are EOS and the kind's. NULL with
 * "tokenizer WHAT: out of memory" in *cause. */
struct tok *tok_wrap(const struct tok_ops *ops, void *k, const char *what, char **cause);
/* The kind of t and its state, for text/ files that dispatch themselves
 * (detok.c's whole-sequence decode). */
const struct tok_ops *tok_ops_of(const struct tok *t, const void **k);

/* How the loaders word a reason (tok_msg.c): "tokenizer WHAT: MESSAGE"
 * into *cause unless it holds one already (the first, most precise reason
 * wins), MESSAGE cut at 511 bytes. */
void tok_fail(char **cause, const char *what, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
void tok_vfail(char **cause, const char *what, const char *fmt, va_list ap)
	__attribute__((format(printf, 3, 0)));
/* s[0..n) quoted for a message: printable ASCII kept, the rest as \xNN, at
 * most about 180 bytes, then "..."; into out, which it returns. */
const char *tok_shown(const char *s, size_t n, char out[200]);

#ifdef __cplusplus
}
#endif

#endif

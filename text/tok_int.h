/*
 * text/tok_int.h — the two kinds behind tokenizer.h; only tokenizer.c,
 * tok_spm.cc and tok_bpe.c include it. Each kind's functions take ids
 * already checked against its vocabulary where tokenizer.h says so.
 */
#ifndef LLAMAD_TEXT_TOK_INT_H
#define LLAMAD_TEXT_TOK_INT_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct tok_bpe_spec;

/* SentencePiece (tok_spm.cc) */
struct spm;
struct spm *spm_load_mem(const void *data, size_t len, const char *what, char **cause);
void spm_free(struct spm *t);
int spm_n_vocab(const struct spm *t);
int spm_bos(const struct spm *t);
int spm_eos(const struct spm *t);
int spm_encode(const struct spm *t, const char *text, size_t len, int add_bos, int32_t **ids);
int spm_decode(const struct spm *t, const int32_t *ids, int n, char **text);
const char *spm_piece(const struct spm *t, int id);
int spm_piece_to_id(const struct spm *t, const char *piece);
int spm_is_byte(const struct spm *t, int id, uint8_t *byte);
int spm_is_control(const struct spm *t, int id);
float spm_score(const struct spm *t, int id);
int spm_type(const struct spm *t, int id);
int spm_drops_leading_space(const struct spm *t);

/* byte-level BPE (tok_bpe.c) */
struct bpe;
struct bpe *bpe_load_spec(const struct tok_bpe_spec *spec, const char *what, char **cause);
void bpe_free(struct bpe *b);
int bpe_n_vocab(const struct bpe *b);
int bpe_bos(const struct bpe *b);
int bpe_eos(const struct bpe *b);
/* the end-of-turn ids the files name besides EOS */
const int32_t *bpe_end_ids(const struct bpe *b, int *n);
int bpe_encode(const struct bpe *b, const char *text, size_t len, int add_bos, int32_t **ids);
const char *bpe_piece(const struct bpe *b, int id);
int bpe_piece_to_id(const struct bpe *b, const char *piece);
int bpe_type(const struct bpe *b, int id);
int bpe_bytes(const struct bpe *b, int id, const uint8_t **p, size_t *n);
int bpe_n_merges(const struct bpe *b);
const char *bpe_merge(const struct bpe *b, int i);
const char *bpe_pre(const struct bpe *b);
/* The GGUF name of the pre-tokenizer whose tokenizer.json Split regex is
 * regex, or NULL if llamad knows none. */
const char *bpe_pre_of_regex(const char *regex);

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

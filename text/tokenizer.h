/*
 * text/tokenizer.h — the one tokenizer interface, over two kinds:
 *
 *  - SentencePiece (Llama 1/2): tokenizer.model, or a GGUF vocabulary with
 *    tokenizer.ggml.model "llama"; text/tok_spm.cc, a C++ shim over
 *    libsentencepiece (the only C++ in the project);
 *  - byte-level BPE (Llama 3.x): a Hugging Face tokenizer.json, or a GGUF
 *    vocabulary with tokenizer.ggml.model "gpt2"; text/tok_bpe.c, with the
 *    pre-tokenizer regex run by PCRE2 (UTF + UCP, JIT where available).
 *
 * text/tokenizer.c holds struct tok and sends each call to its kind's table
 * of operations (text/tok_int.h); text/tok_load.c finds which kind a file
 * is; text/detok.c turns ids back into text (tok_decode, the stream).
 * Special tokens (control pieces: <s>, <|eot_id|>, ...) are never parsed out
 * of text: tok_encode treats every byte as ordinary text, and templates put
 * special ids in by id (tok_piece_to_id). Everything here is thread-safe for
 * concurrent readers once loaded.
 */
#ifndef LLAMAD_TEXT_TOKENIZER_H
#define LLAMAD_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

struct tok;

enum tok_kind { TOK_SPM = 1, TOK_BPE = 2 };

/* Load a tokenizer file: a SentencePiece model (tokenizer.model), a
 * llama2.c tokenizer.bin, a Hugging Face tokenizer.json (a name ending in
 * .json, or content starting with '{') or the vocabulary of a GGUF file;
 * anything else is refused naming these; for tokenizer.json,
 * tokenizer_config.json and generation_config.json beside it name BOS, EOS
 * and the end-of-turn ids (text/vocab_hf.c).
 * Returns NULL on error and, if cause is not NULL, sets *cause to a malloc'd
 * message naming the file and the reason. */
struct tok *tok_load(const char *path, char **cause);
/* Load from a serialized SentencePiece ModelProto held in memory (e.g. built
 * from GGUF metadata). Same error convention; `what` names the source in
 * messages. */
struct tok *tok_load_mem(const void *data, size_t len, const char *what,
			 char **cause);

/* A byte-level BPE vocabulary given as parts (a GGUF "gpt2" vocabulary, a
 * Hugging Face tokenizer.json). Strings are not NUL-terminated: (ptr, len)
 * pairs; types may be NULL (all normal) and holds enum tok_type values.
 * pre names the pre-tokenizer ("llama-bpe" for Llama 3, "gpt2"; NULL means
 * "gpt2"). eot lists extra end-of-turn ids (may be NULL when n_eot is 0).
 * Ids < 0 mean none. */
struct tok_bpe_spec {
	int n_vocab;
	const char *const *tokens;
	const size_t *token_len;
	const int32_t *types;
	int n_merges;
	const char *const *merges;   /* "left right", one space between */
	const size_t *merge_len;
	/* NULL, or per merge the length of its left token (the right one
	 * starts after the space: a token may hold spaces), TOK_MERGE_SPLIT
	 * for "split at the first space after the first byte" */
	const size_t *merge_left;
	const char *pre;
	int ignore_merges;           /* 0: the pre-tokenizer's rule; 1: on; -1: off */
	int bos, eos;
	const int32_t *eot;
	int n_eot;
};
#define TOK_MERGE_SPLIT ((size_t)-1)
/* Build a BPE tokenizer from parts (copied). Same error convention as
 * tok_load; `what` names the source. */
struct tok *tok_load_bpe(const struct tok_bpe_spec *spec, const char *what,
			 char **cause);
/* A SentencePiece vocabulary given as parts (text/tok_parts.c): pieces
 * NUL-terminated in SentencePiece's spelling (U+2581 for a space), scores
 * (NULL: all 0) and types (enum tok_type; NULL: all normal), the special
 * ids (-1: none) and two normalizer flags. */
struct tok_spm_spec {
	int n_vocab;
	const char *const *pieces;
	const float *scores;
	const int32_t *types;
	int unk, bos, eos, pad;
	int add_dummy_prefix, remove_extra_whitespaces;
};
/* Build a SentencePiece BPE tokenizer from parts (copied). Same error
 * convention as tok_load; `what` names the source. */
struct tok *tok_load_spm(const struct tok_spm_spec *spec, const char *what, char **cause);
/* Load a llama2.c tokenizer.bin held in memory: its pieces (spaces back to
 * U+2581, "\n<s>\n"/"\n</s>\n" as <s>/</s>), scores, <0xHH> byte pieces and
 * <unk> make the SentencePiece BPE vocabulary it was exported from. Same
 * error convention as tok_load. */
struct tok *tok_load_llama2c(const void *data, size_t len, const char *what, char **cause);
/* Free; accepts NULL. */
void tok_free(struct tok *t);

int tok_kind(const struct tok *t);  /* enum tok_kind */
int tok_n_vocab(const struct tok *t);
int tok_bos(const struct tok *t);   /* -1 if the model has none */
int tok_eos(const struct tok *t);   /* -1 if the model has none */

/* End-of-turn ids: generation stops on any of them. EOS, and for BPE
 * vocabularies the control tokens <|eot_id|>, <|eom_id|>, <|end_of_text|>
 * where present, the GGUF eot/eom ids and generation_config.json's
 * eos_token_id list. */
int tok_is_end(const struct tok *t, int id);
int tok_n_end(const struct tok *t);
int tok_end(const struct tok *t, int i);   /* i < tok_n_end; -1 otherwise */
/* Add id (a control token in range) to the end-of-turn ids; 0, or -EINVAL. */
int tok_add_end(struct tok *t, int id);

/* BPE only (0 / NULL for SentencePiece): the merges in rank order as
 * "left right" strings (what GGUF's tokenizer.ggml.merges holds), and the
 * pre-tokenizer's GGUF name ("llama-bpe", "gpt2"). */
int tok_n_merges(const struct tok *t);
const char *tok_merge(const struct tok *t, int i);
const char *tok_pre(const struct tok *t);
/* The bytes id stands for (BPE: its byte-level string decoded; control
 * tokens: none, *n = 0). Returns 1 with *p and *n set, 0 if out of range or the
 * tokenizer is SentencePiece (whose pieces are text with U+2581). */
int tok_bytes(const struct tok *t, int id, const uint8_t **p, size_t *n);

/* Encode len bytes of UTF-8 text. If add_bos, the BOS id is prepended.
 * On success returns the number of ids and sets *ids to a malloc'd array the
 * caller frees; returns a negative errno on failure (-EINVAL for bad input,
 * -ENOMEM). */
int tok_encode(const struct tok *t, const char *text, size_t len, int add_bos,
	       int32_t **ids);

/* Decode ids into text the way SentencePiece does for a whole sequence
 * (leading dummy-prefix space removed, byte pieces merged); BPE: the bytes
 * of the ids, control tokens giving none, each invalid UTF-8 byte U+FFFD
 * (what the streaming detokenizer gives). Returns the
 * length and sets *text (malloc'd, NUL-terminated) or a negative errno. */
int tok_decode(const struct tok *t, const int32_t *ids, int n, char **text);

/* The piece string of id ("▁the", "<0x0A>", "<s>"; BPE: "Ġthe", the
 * vocabulary's byte-level string, "<|eot_id|>"), or NULL if out of range.
 * The pointer stays valid for the tokenizer's lifetime. */
const char *tok_piece(const struct tok *t, int id);
/* Id of a piece string, or -1 if absent. */
int tok_piece_to_id(const struct tok *t, const char *piece);
/* The bytes token id stands for in text, into out (cap bytes; at most the
 * piece's length is ever needed): BPE's byte-level string decoded,
 * SentencePiece's piece with U+2581 as a space or its <0xAB> byte; none
 * for a control token or an id out of range. A character may be split
 * between tokens. Returns the length (cut to cap). */
size_t tok_text(const struct tok *t, int id, char *out, size_t cap);
/* If id is a byte-fallback piece (<0xAB>), store the byte and return 1;
 * else 0. */
int tok_is_byte(const struct tok *t, int id, uint8_t *byte);
/* 1 if id is a control token (BOS, EOS, ...) or unknown, which decode to
 * no text; else 0. */
int tok_is_control(const struct tok *t, int id);
/* SentencePiece score of id (the BPE merge priority / unigram log
 * probability), 0 if out of range. */
float tok_score(const struct tok *t, int id);

/* Piece type of id, with GGUF's tokenizer.ggml.token_type numbering. */
enum tok_type {
	TOK_TYPE_NORMAL = 1,
	TOK_TYPE_UNKNOWN = 2,
	TOK_TYPE_CONTROL = 3,
	TOK_TYPE_USER_DEFINED = 4,
	TOK_TYPE_UNUSED = 5,
	TOK_TYPE_BYTE = 6,
};
/* The enum tok_type of id (unknown, control, byte, unused or normal, as
 * sentencepiece classifies it: user-defined pieces read as normal, the
 * library has no predicate for them); 0 if out of range. */
int tok_type(const struct tok *t, int id);
/* 1 if decoding drops the leading U+2581 of the first piece of a text (the
 * model's normalizer adds a dummy prefix or removes extra whitespace, as
 * Llama's does); else 0. The streaming detokenizer follows this. */
int tok_drops_leading_space(const struct tok *t);

/*
 * Streaming detokenizer: feed generated ids one at a time, get back only
 * complete UTF-8 text. A multi-byte character split across byte-fallback
 * tokens is held back until its last byte arrives; an invalid sequence is
 * replaced by U+FFFD. The leading space of the first piece after BOS (or of
 * the first piece fed, when `at_start` is set) is dropped, as SentencePiece
 * does when decoding a whole sequence.
 */
struct detok {
	const struct tok *tok;
	int at_start;        /* next piece is the first of a text */
	uint8_t pend[4];     /* bytes of an incomplete UTF-8 character */
	int n_pend;
};

/* Start a stream. at_start: drop the leading space of the first piece. */
void detok_init(struct detok *d, const struct tok *t, int at_start);
/* Append the text of id to out (capacity cap, >= 64 recommended), NUL
 * terminated. Returns the number of bytes written (0 if held back), or
 * -ENOSPC if out is too small. */
int detok_feed(struct detok *d, int id, char *out, size_t cap);
/* Flush held-back bytes at the end of a stream (as U+FFFD if incomplete).
 * Returns bytes written. */
int detok_flush(struct detok *d, char *out, size_t cap);

/* The stream run over ids[0, n) into *text (malloc'd, NUL-terminated):
 * its length, or -ENOMEM / -EOVERFLOW / detok_feed's error. skip_bad:
 * ids outside the vocabulary are left out instead of failing. */
int detok_all(const struct tok *t, const int32_t *ids, int n, int at_start, int skip_bad,
	      char **text);

#endif

/*
 * format/llama2c.h — the two files of karpathy/llama2.c: a checkpoint in
 * run.c's legacy format (a header of 7 int32, then fp32 arrays) and a
 * tokenizer.bin (max_token_length, then per piece: score f32, length i32,
 * its bytes). A reader of bytes the caller holds; it knows nothing of
 * models or tokenizers (model/load_llama2c.c and text/tok_parts.c use it).
 */
#ifndef LLAMAD_FORMAT_LLAMA2C_H
#define LLAMAD_FORMAT_LLAMA2C_H

#include <stddef.h>
#include <stdint.h>

#define L2C_HEADER_BYTES 28

/* The checkpoint header, as written (a positive vocab_size: the classifier
 * is the embedding table; negative: a classifier of -vocab_size rows
 * follows). */
struct l2c_header {
	int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
};

/* The header of the checkpoint data[0, len): 0, -ENOTSUP for the later
 * export formats (v1/v2, magic "ak42"), or -EINVAL if len is shorter than
 * a header. Nothing else is checked. */
int l2c_read_header(const uint8_t *data, size_t len, struct l2c_header *h);

/* 1 if data[0, len) is a tokenizer.bin: max_token_length in [1, 4096],
 * then at least 3 pieces, each with a finite score and a length in [0,
 * max_token_length] inside the data, and nothing after them; its piece
 * count in *n_vocab (may be NULL). Else 0. */
int l2c_tok_check(const void *data, size_t len, int *n_vocab);

/* The piece at *p (the first is at data + 4 of a checked tokenizer.bin):
 * its bytes (not NUL-terminated), length in *n and score in *score; *p
 * moves to the next. */
const unsigned char *l2c_tok_piece(const unsigned char **p, size_t *n, float *score);

#endif

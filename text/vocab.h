/*
 * text/vocab.h — tokenizers and chat templates from the files a model
 * comes in, for the weight loaders (model/) and tok_load: a GGUF file's
 * metadata (text/vocab_gguf.c).
 *
 * Errors: a negative errno with *cause naming the file and the reason
 * (util/cause.h).
 */
#ifndef LLAMAD_TEXT_VOCAB_H
#define LLAMAD_TEXT_VOCAB_H

#include <stddef.h>

struct gguf;
struct tok;

/*
 * The tokenizer of a GGUF file whose metadata g has parsed
 * (format/gguf.h; g->cause takes the reason): tokenizer.ggml.model "gpt2"
 * (byte-level BPE) or "llama" (SentencePiece). 0 with *out set; 0 with
 * *out NULL if the file carries no tokenizer; -EINVAL, -ENOTSUP or
 * -ENOMEM with the cause set.
 */
int vocab_gguf(struct gguf *g, struct tok **out);

/*
 * The GGUF file's tokenizer.chat_template: 0 with *text (malloc'd,
 * NUL-terminated after its *len bytes) or with *text NULL when it has
 * none (or a value that is not a string); -ENOMEM.
 */
int vocab_gguf_template(const struct gguf *g, char **text, size_t *len);

/*
 * Load only the tokenizer of the GGUF file at path (e.g. a vocab-only
 * file): the file is mapped, its metadata parsed, nothing more. Returns
 * NULL with *cause (naming the file) on error or if the file has none.
 */
struct tok *tok_load_gguf(const char *path, char **cause);

#endif

/*
 * text/vocab.h — tokenizers and chat templates from the files a model
 * comes in, for the weight loaders (model/) and tok_load: a GGUF file's
 * metadata (text/vocab_gguf.c) and a Hugging Face folder's tokenizer.json
 * and side files (text/vocab_hf.c).
 *
 * Errors: a negative errno with *cause naming the file and the reason
 * (util/cause.h).
 */
#ifndef LLAMAD_TEXT_VOCAB_H
#define LLAMAD_TEXT_VOCAB_H

#include <stddef.h>
#include <stdint.h>

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

/* What a Hugging Face folder says about its text besides tokenizer.json. */
struct hf_text {
	char *bos_token, *eos_token;  /* tokenizer_config.json's, by name; NULL: unsaid */
	int32_t *gen_eos;             /* generation_config.json's eos_token_id(s) */
	int n_gen_eos;
	/* the chat template (for_model): tokenizer_config.json's chat_template
	 * (a string, or the "default" entry of a list, else its first), else
	 * chat_template.jinja; NULL: none. NUL-terminated after its len bytes. */
	char *chat_template;
	size_t chat_template_len;
};

/*
 * Read dir's tokenizer_config.json, generation_config.json and, for_model,
 * the chat template, each file once. for_model (the model's own folder): a
 * tokenizer_config.json that is not a JSON object, a chat_template of
 * another shape or an unreadable chat_template.jinja is an error (-EINVAL
 * or -errno, *cause naming the file); otherwise what cannot be read says
 * nothing. Missing files say nothing. 0, or a negative errno; free with
 * hf_text_done (also after an error: it accepts a cleared struct).
 */
int hf_text_read(const char *dir, int for_model, struct hf_text *ht, char **cause);
void hf_text_done(struct hf_text *ht);

/*
 * A tokenizer from the tokenizer.json at path, its text[0, len) in memory,
 * with what the side files said (ht; NULL: nothing): BOS and EOS by name,
 * generation_config's end-of-turn ids. tok_load_json reads the side files
 * beside path itself. NULL with *cause on error.
 */
struct tok *tok_load_hf_json(const char *path, const char *text, size_t len,
			     const struct hf_text *ht, char **cause);
struct tok *tok_load_json(const char *path, const char *text, size_t len, char **cause);

/* tok_load, with ht (NULL: none) standing for the side files of a
 * tokenizer.json at path (a model folder's, read once by its loader). */
struct tok *tok_load_with(const char *path, const struct hf_text *ht, char **cause);

#endif

/*
 * model/loader.h — inside model/: a format loader's row in model.c's
 * registry, and what the loaders share (model/loader.c). Not for other
 * folders: they load models through model_load (model.h).
 *
 * A loader fills a struct model from a path: hyper-parameters (checked
 * with model_config_check), the weights (in place in the read-only maps
 * the model owns, or in buffers it owns), the chat template text, then
 * model_finish for the RoPE table and the tokenizer. It reads its files
 * through format/ and its vocabulary through text/vocab.h, and reports
 * failure as -errno with *cause naming the file (util/cause.h).
 */
#ifndef LLAMAD_MODEL_LOADER_H
#define LLAMAD_MODEL_LOADER_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "util/cause.h"

struct hf_text;

struct model_loader {
	const char *name;        /* the format, as m->format: "gguf", ... */
	/* 1 if path is in this format (by its name or its first bytes) */
	int (*probe)(const char *path);
	/* Fill m (m->path and m->format set) from path: 0, or a negative
	 * errno with *cause naming the file and the reason. */
	int (*load)(struct model *m, const char *path, const char *tokenizer, char **cause);
};

extern const struct model_loader model_loader_hf;       /* load_hf.c */
extern const struct model_loader model_loader_gguf;     /* load_gguf.c */
extern const struct model_loader model_loader_llama2c;  /* load_llama2c.c */

/* A zeroed buffer of bytes that m owns (freed by model_free), or NULL. */
void *model_own(struct model *m, size_t bytes);
/* Map the file at path read-only for m (util/file.h's file_map, kept in
 * m's maps): 0, or a negative errno with *cause naming the file. */
int model_map_file(struct model *m, const char *path, const uint8_t **data,
		   size_t *len, char **cause);
/* 1 if s ends with suf. */
int model_has_suffix(const char *s, const char *suf);
/* Bytes of weight w's data. */
size_t model_weight_bytes(const struct kt_weight *w);

/* RoPE table (from cfg and m->rope_freqs), weight size, tokenizer:
 * `tokenizer` if given, else m->tok if the loader already built one from
 * the file, else default_tok (a tokenizer.json there with side, the
 * folder's side files, if not NULL: text/vocab.h's tok_load_with). */
int model_finish(struct model *m, const char *tokenizer, const char *default_tok,
		 const struct hf_text *side, char **cause);

#endif

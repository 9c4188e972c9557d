/*
 * text/tok_load.c — tok_load: which kind of tokenizer file a path holds
 * (a GGUF file, a Hugging Face tokenizer.json, a llama2.c tokenizer.bin,
 * a SentencePiece tokenizer.model) and the loader that reads it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "format/llama2c.h"
#include "text/tok_int.h"
#include "text/tokenizer.h"
#include "text/vocab.h"
#include "util/cause.h"
#include "util/file.h"

static void set_cause(char **cause, const char *path, const char *why, int err)
{
	cause_set(cause, "tokenizer %s: %s%s%s", path, why, err ? ": " : "", err ? strerror(err) : "");
}

static int is_json(const char *path, const char *buf, size_t len)
{
	size_t n = strlen(path);
	if (n >= 5 && strcmp(path + n - 5, ".json") == 0)
		return 1;
	size_t i = 0;
	while (i < len && (buf[i] == ' ' || buf[i] == '\n' || buf[i] == '\t' || buf[i] == '\r'))
		i++;
	return i < len && buf[i] == '{';
}

struct tok *tok_load(const char *path, char **cause)
{
	return tok_load_with(path, NULL, cause);
}

struct tok *tok_load_with(const char *path, const struct hf_text *ht, char **cause)
{
	if (cause)
		*cause = NULL;
	if (!path) {
		set_cause(cause, "(null)", "no path given", 0);
		return NULL;
	}
	if (file_has_magic(path, "GGUF", 4))  /* mapped by the GGUF reader, not read whole */
		return tok_load_gguf(path, cause);
	char *buf = NULL;
	size_t len = 0;
	int rc = file_read(path, (size_t)1 << 30, &buf, &len);
	if (rc < 0) {
		set_cause(cause, path, rc == -EISDIR || rc == -EINVAL ? "cannot read" : "cannot open",
			  -rc);
		return NULL;
	}
	struct tok *t;
	if (is_json(path, buf, len)) {
		t = ht ? tok_load_hf_json(path, buf, len, ht, cause) : tok_load_json(path, buf, len, cause);
	} else if (l2c_tok_check(buf, len, NULL)) {
		t = tok_load_llama2c(buf, len, path, cause);
	} else if (len > 0 && buf[0] != 0x0a) {
		/* a ModelProto starts with its pieces (field 1, length-delimited) */
		set_cause(cause, path, "not a tokenizer this llamad reads (a SentencePiece "
			  "tokenizer.model, a llama2.c tokenizer.bin, a Hugging Face "
			  "tokenizer.json or a GGUF file)", 0);
		t = NULL;
	} else {
		t = tok_wrap(&tok_spm_ops, spm_load_mem(buf, len, path, cause), path, cause);
	}
	free(buf);
	return t;
}

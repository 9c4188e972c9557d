/*
 * tests/fuzz/fuzz_gguf.c — the GGUF loader (model/load_gguf.c), including the
 * tokenizer built from the file's metadata: the input is model.gguf, loaded
 * with no tokenizer override; then tok_load_gguf on the same file.
 */
#include "fuzz_model.h"
#include "text/tokenizer.h"
#include "text/vocab.h"

static char *file;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	file = fuzz_join(fuzz_tmpdir("fuzz_gguf"), "model.gguf");
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_model_load(file, file, NULL, data, size);
	char *cause = NULL;
	struct tok *t = tok_load_gguf(file, &cause);
	if (!t && !cause)
		abort();
	free(cause);
	tok_free(t);
	return 0;
}

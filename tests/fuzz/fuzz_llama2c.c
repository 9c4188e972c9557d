/*
 * tests/fuzz/fuzz_llama2c.c — the llama2.c .bin loader (model/load_llama2c.c):
 * the input is model.bin, the tokenizer the real tok512.model.
 */
#include "fuzz_model.h"

static char *file, *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	file = fuzz_join(fuzz_tmpdir("fuzz_llama2c"), "model.bin");
	tok = fuzz_join(fuzz_models(), "tok512.model");
	if (access(tok, R_OK) != 0)
		abort();
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_model_load(file, file, tok, data, size);
	return 0;
}

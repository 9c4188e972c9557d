/*
 * tests/fuzz/fuzz_safetensors.c — the Hugging Face loader
 * (model/load_hf.c): a folder holding the real config.json of
 * stories260K-hf and the input as model.safetensors; the tokenizer the real
 * tok512.model.
 */
#include "fuzz_model.h"

static char *dir, *file, *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	dir = fuzz_tmpdir("fuzz_safetensors");
	file = fuzz_join(dir, "model.safetensors");
	tok = fuzz_join(fuzz_models(), "tok512.model");
	char *src = fuzz_join(fuzz_models(), "stories260K-hf/config.json");
	FILE *f = fopen(src, "rb");
	if (!f || access(tok, R_OK) != 0)
		abort();
	static char buf[1 << 16];
	size_t n = fread(buf, 1, sizeof(buf), f);
	fclose(f);
	char *dst = fuzz_join(dir, "config.json");
	fuzz_write(dst, buf, n);
	free(dst);
	free(src);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_model_load(dir, file, tok, data, size);
	return 0;
}

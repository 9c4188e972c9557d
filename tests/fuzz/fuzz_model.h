/*
 * tests/fuzz/fuzz_model.h — the body shared by the model loader targets:
 * the input is written to a file of the given name in a private folder and
 * loaded with model_load; a load that fails must say why.
 */
#ifndef LLAMAD_FUZZ_MODEL_H
#define LLAMAD_FUZZ_MODEL_H

#include <stdlib.h>

#include "fuzz_util.h"
#include "model/model.h"

static inline void fuzz_model_load(const char *load_path, const char *file, const char *tok,
				   const uint8_t *data, size_t size)
{
	fuzz_write(file, data, size);
	char *cause = NULL;
	struct model *m = model_load(load_path, tok, &cause);
	if (!m && !cause)
		abort();
	free(cause);
	model_free(m);
}

#endif

/*
 * tests/unit/tok_vectors.h — llama.cpp's tokenizer test vectors
 * ($MODELS/ggml-vocab-llama-spm.gguf.inp / .out) against a tokenizer; shared
 * by test_tokenizer (the Llama 2 tokenizer.model) and test_gguf (the same
 * vocabulary rebuilt from GGUF metadata). Include after <cmocka.h>,
 * testutil.h and text/tokenizer.h.
 *
 * The .inp file holds the strings, each followed by
 * "\n__ggml_vocab_test__\n" (strings may contain newlines of their own).
 * The .out file has one line per string, ending in '\n'; an empty line is
 * the empty string's (no ids). There are 46 strings and 46 lines.
 */
#ifndef LLAMAD_TESTS_TOK_VECTORS_H
#define LLAMAD_TESTS_TOK_VECTORS_H

/* Encode every string with t (no BOS) and compare the ids; each (may be
 * NULL) is then called with the ids of every string. */
static void check_ggml_vectors(struct tok *t,
			       void (*each)(const struct tok *, const int32_t *, int))
{
	static const char sep[] = "\n__ggml_vocab_test__\n";
	const size_t seplen = sizeof sep - 1;
	const char *models = env_or("MODELS", "../shared/models");
	char *pin = path_join(models, "ggml-vocab-llama-spm.gguf.inp");
	char *pout = path_join(models, "ggml-vocab-llama-spm.gguf.out");
	size_t inlen, outlen;
	char *in = slurp(pin, &inlen), *out = slurp(pout, &outlen);
	assert_non_null(in);
	assert_non_null(out);
	assert_true(inlen >= seplen);
	assert_memory_equal(in + inlen - seplen, sep, seplen);
	assert_true(outlen > 0 && out[outlen - 1] == '\n');
	int n_cases = 0;
	char *ip = in, *op = out;
	while (ip < in + inlen) {
		char *end = memmem(ip, (size_t)(in + inlen - ip), sep, seplen);
		assert_non_null(end);
		char *nl = strchr(op, '\n');
		assert_non_null(nl); /* a line for every string */
		*nl = '\0';
		int32_t *ids = NULL;
		int n = tok_encode(t, ip, (size_t)(end - ip), 0, &ids);
		assert_true(n >= 0);
		int k = 0;
		char *q = op;
		for (;;) {
			char *e;
			long v = strtol(q, &e, 10);
			if (e == q)
				break;
			if (k >= n || ids[k] != v)
				fail_msg("vector %d (\"%.*s\"): id %d is %d, expected %ld", n_cases,
					 (int)(end - ip), ip, k, k < n ? ids[k] : -1, v);
			k++;
			q = e;
		}
		if (k != n)
			fail_msg("vector %d: %d ids, expected %d", n_cases, n, k);
		if (each)
			each(t, ids, n);
		free(ids);
		n_cases++;
		ip = end + seplen;
		op = nl + 1;
	}
	assert_true(op == out + outlen); /* no lines left over */
	assert_int_equal(n_cases, 46);
	free(in);
	free(out);
	free(pin);
	free(pout);
}

#endif

/*
 * tests/bench/kl.h — llamad-bench --kl-ref and --kl-write
 * (tests/bench/kl.c): how far a model's next-token distributions are from
 * a reference's over a text, and the reference written as llama.cpp's
 * llama-perplexity logits file, so that llama.cpp is measured against the
 * same reference on the same tokens.
 */
#ifndef LLAMAD_TESTS_BENCH_KL_H
#define LLAMAD_TESTS_BENCH_KL_H


struct kl_opts {
	const char *model;      /* --model: the model measured (--kl-ref), the
				 * reference (--kl-write) */
	const char *tokenizer;  /* --tokenizer, for every model loaded, or NULL */
	const char *ref;        /* --kl-ref: a model, or a logits file */
	const char *text;       /* --text: the text (not read with a logits file) */
	const char *out;        /* --kl-write: the logits file to write */
	int ctx;                /* tokens a chunk (0: 512) */
	int chunks;             /* chunks (0: the fewest that score 1,000 positions) */
	int threads;            /* CPU backend threads (0: all) */
};

/*
 * --kl-ref: o->model against o->ref over the chunks of the text (or the
 * logits file's tokens). Prints one key=value line on stdout. Returns 0,
 * 1 with a message on stderr (a file, a load, memory), 2 on a usage error.
 */
int kl_compare(const struct kl_opts *o);

/*
 * --kl-write: o->model's log-probabilities at the scored positions of the
 * text's chunks, written to o->out as llama.cpp's --kl-divergence-base
 * file. Prints one key=value line. Returns as kl_compare.
 */
int kl_write(const struct kl_opts *o);

#endif

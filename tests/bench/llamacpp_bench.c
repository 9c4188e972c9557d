/*
 * tests/bench/llamacpp_bench.c — llamacpp-bench: llama.cpp's own speed, for
 * comparison with llamad-bench, through llama.cpp's C API (no JavaScript).
 *
 * Not built by the Makefile: tests/bench/llamacpp.sh compiles it against the
 * llama.h of the llama.cpp release shipped in the node-llama-cpp npm package
 * and links it with that release's prebuilt libllama / libggml (see the
 * script for the exact versions).
 *
 *   llamacpp-bench --libdir DIR [--threads N] [--reps N]
 *                  [--tokenizer GGUF --text FILE]
 *                  [--model GGUF [--prompt-tokens N] [--decode-tokens N] [--depth N]]
 *   llamacpp-bench --libdir DIR --quantize IN.gguf OUT.gguf TYPE [--threads N]
 *
 * --quantize: llama_model_quantize of IN into OUT as TYPE (q4_k_m, q5_k_m,
 * q6_k, q8_0, q4_0, q4_k_s: llama-quantize's mixes, with its defaults), so
 * the files people download (Q4_K_M) are made by llama.cpp itself.
 *
 * --libdir: where libggml-cpu-*.so live; ggml loads the best CPU variant for
 * this machine from there (as llama-bench's ggml_backend_load_all()).
 *
 * --tokenizer/--text: the GGUF's vocabulary only (vocab_only) tokenizes the
 * whole file with one llama_tokenize call (add_special=false,
 * parse_special=false: no BOS, special-token text is plain text), then
 * llama_detokenize turns the ids back into bytes; best of --reps, one thread.
 * One line, the keys of llamad-bench --tokenize plus impl=.
 *
 * --model: as llama-bench (tools/llama-bench/llama-bench.cpp of that
 * release): ggml threadpool of N threads (default params, poll 50) attached
 * to the context, n_ctx = prompt + decode, f16 KV cache, flash attention
 * auto, one warm-up decode. prefill = one llama_decode of a
 * --prompt-tokens batch (BOS + pseudo-random ids, logits of the last token
 * only) on an empty cache (pp test); decode = --decode-tokens single-token
 * llama_decode + llama_synchronize calls at positions 0..N-1 of an empty
 * cache (tg test), or with --depth D at positions D..D+N-1 after D tokens
 * (filled once, in prompt-sized batches; each run first removes what the
 * previous one decoded: llama-bench -d); best of --reps. One line, the keys of llamad-bench
 * where they mean the same, plus impl= and cpu= (the libggml-cpu variant
 * ggml chose). Weight layout is llama.cpp's default (use_extra_bufts: Q4_0
 * and friends repacked for the CPU at load), as llama-bench runs it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <getopt.h>
#include <time.h>
#include <unistd.h>

#include "llama.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int verbose;
static char cpu_variant[256] = "?";

/* Quiet unless -v; remembers which CPU backend library ggml picked. */
static void log_cb(enum ggml_log_level level, const char *text, void *ud)
{
	(void)level;
	(void)ud;
	const char *p = strstr(text, "loaded CPU backend from ");
	if (p) {
		p += strlen("loaded CPU backend from ");
		const char *s = strrchr(p, '/');
		snprintf(cpu_variant, sizeof(cpu_variant), "%s", s ? s + 1 : p);
		cpu_variant[strcspn(cpu_variant, "\n")] = 0;
	}
	if (verbose)
		fputs(text, stderr);
}

static char *read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *b = n >= 0 ? malloc((size_t)n + 1) : NULL;
	if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
		free(b);
		b = NULL;
	}
	fclose(f);
	if (b) {
		b[n] = 0;
		*len = (size_t)n;
	}
	return b;
}

static int tokenize_bench(const char *gguf, const char *text_path, int reps)
{
	size_t len = 0;
	char *text = read_file(text_path, &len);
	if (!text || len > 0x7fffffff - 64) {
		fprintf(stderr, "llamacpp-bench: %s: unreadable or too large\n", text_path);
		return 1;
	}
	struct llama_model_params mp = llama_model_default_params();
	mp.vocab_only = true;
	double t0 = now_s();
	struct llama_model *model = llama_model_load_from_file(gguf, mp);
	double load = now_s() - t0;
	if (!model) {
		fprintf(stderr, "llamacpp-bench: %s: llama.cpp could not load it\n", gguf);
		return 1;
	}
	const struct llama_vocab *vocab = llama_model_get_vocab(model);
	int32_t cap = (int32_t)len + 64;
	llama_token *ids = malloc((size_t)cap * sizeof(*ids));
	int32_t back_cap = (int32_t)len * 2 + 64;
	char *back = malloc((size_t)back_cap);
	if (!ids || !back) {
		fprintf(stderr, "llamacpp-bench: out of memory\n");
		return 1;
	}
	double best_enc = 1e30, best_dec = 1e30;
	int32_t n = 0;
	int same = 0;
	for (int r = 0; r < reps; r++) {
		double a = now_s();
		n = llama_tokenize(vocab, text, (int32_t)len, ids, cap, false, false);
		double b = now_s();
		if (n < 0) {
			fprintf(stderr, "llamacpp-bench: llama_tokenize failed (%d)\n", n);
			return 1;
		}
		int32_t k = llama_detokenize(vocab, ids, n, back, back_cap, false, false);
		double c = now_s();
		same = k >= 0 && (size_t)k == len && memcmp(back, text, len) == 0;
		best_enc = b - a < best_enc ? b - a : best_enc;
		best_dec = c - b < best_dec ? c - b : best_dec;
	}
	enum llama_vocab_type vt = llama_vocab_type(vocab);
	printf("tokenizer=%s kind=%s text=%s bytes=%zu tokens=%d bytes_per_token=%.2f load_s=%.3f "
	       "encode_MB_s=%.2f decode_MB_s=%.2f round_trip=%s impl=llama.cpp-%s\n",
	       gguf, vt == LLAMA_VOCAB_TYPE_BPE ? "bpe" : vt == LLAMA_VOCAB_TYPE_SPM ? "spm" : "other",
	       text_path, len, n, n ? (double)len / n : 0.0, load, len / best_enc / 1e6,
	       len / best_dec / 1e6, same ? "exact" : "DIFFERS", llama_version());
	free(ids);
	free(back);
	free(text);
	llama_model_free(model);
	return 0;
}

static const char *ftype_name(const struct llama_model *model)
{
	/* llama_model_desc is "<arch> <size> <file type>" ("llama 1B Q4_0",
	 * "llama ?B (guessed) all F32", "llama ?B Q4_K - Medium"): the file type as
	 * llama.cpp names it, lower-cased as llamad-bench prints dtypes */
	static char buf[128];
	char desc[128];
	if (llama_model_desc(model, desc, sizeof(desc)) <= 0)
		return "?";
	const char *p = strchr(desc, ' ');
	p = p ? strchr(p + 1, ' ') : NULL;
	if (!p)
		return "?";
	p++;
	if (strncmp(p, "(guessed) ", 10) == 0)   /* no general.file_type */
		p += 10;
	if (strncmp(p, "all ", 4) == 0)
		p += 4;
	snprintf(buf, sizeof(buf), "%.*s", (int)strcspn(p, " "), p);
	for (char *q = buf; *q; q++)
		*q = (char)(*q >= 'A' && *q <= 'Z' ? *q + 32 : *q);
	return buf;
}

static int decode_bench(const char *gguf, int threads, int n_prompt, int n_decode, int depth,
			int reps)
{
	ggml_backend_dev_t cpu_dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
	if (!cpu_dev) {
		fprintf(stderr, "llamacpp-bench: ggml loaded no CPU backend\n");
		return 1;
	}
	ggml_backend_reg_t cpu_reg = ggml_backend_dev_backend_reg(cpu_dev);
	typedef struct ggml_threadpool *(*tp_new_fn)(struct ggml_threadpool_params *);
	typedef void (*tp_free_fn)(struct ggml_threadpool *);
	tp_new_fn tp_new = (tp_new_fn)ggml_backend_reg_get_proc_address(cpu_reg, "ggml_threadpool_new");
	tp_free_fn tp_free = (tp_free_fn)ggml_backend_reg_get_proc_address(cpu_reg, "ggml_threadpool_free");

	struct llama_model_params mp = llama_model_default_params();
	mp.n_gpu_layers = 0;
	struct llama_model *model = llama_model_load_from_file(gguf, mp);
	if (!model) {
		fprintf(stderr, "llamacpp-bench: %s: llama.cpp could not load it\n", gguf);
		return 1;
	}
	/* the prompt alone (prefill), then depth + decode */
	int total = depth + n_decode > n_prompt ? depth + n_decode : n_prompt;
	int train_ctx = llama_model_n_ctx_train(model);
	if (train_ctx > 0 && total > train_ctx) {
		fprintf(stderr, "llamacpp-bench: %d tokens exceed the model's context %d\n", total,
			train_ctx);
		return 2;
	}
	struct llama_context_params cp = llama_context_default_params();
	cp.n_ctx = (uint32_t)total;
	cp.n_batch = cp.n_batch < (uint32_t)n_prompt ? (uint32_t)n_prompt : cp.n_batch;
	cp.n_threads = threads;
	cp.n_threads_batch = threads;
	cp.no_perf = true;
	struct llama_context *ctx = llama_init_from_model(model, cp);
	if (!ctx) {
		fprintf(stderr, "llamacpp-bench: llama_init_from_model failed\n");
		return 1;
	}
	struct ggml_threadpool_params tpp = ggml_threadpool_params_default(threads);
	struct ggml_threadpool *tp = tp_new ? tp_new(&tpp) : NULL;
	if (!tp) {
		fprintf(stderr, "llamacpp-bench: ggml_threadpool_new failed\n");
		return 1;
	}
	llama_attach_threadpool(ctx, tp, NULL);

	const struct llama_vocab *vocab = llama_model_get_vocab(model);
	int V = llama_vocab_n_tokens(vocab);
	llama_token *toks = malloc((size_t)total * sizeof(*toks));
	uint64_t x = 88172645463325252ull;   /* llamad-bench's token sequence */
	toks[0] = llama_vocab_bos(vocab) >= 0 ? llama_vocab_bos(vocab) : 1;
	for (int i = 1; i < total; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		toks[i] = 3 + (int32_t)(x % (uint64_t)(V - 3));
	}
	llama_memory_t mem = llama_get_memory(ctx);
	/* warm-up, as llama-bench: one prompt pass and one decode */
	llama_memory_clear(mem, false);
	if (llama_decode(ctx, llama_batch_get_one(toks, n_prompt)) ||
	    (llama_memory_clear(mem, false), llama_decode(ctx, llama_batch_get_one(toks, 1)))) {
		fprintf(stderr, "llamacpp-bench: llama_decode failed\n");
		return 1;
	}
	llama_synchronize(ctx);
	double best_pf = 1e30, best_dec = 1e30;
	int rc = 0;
	for (int r = 0; r < reps && !rc; r++) {
		llama_memory_clear(mem, false);
		double t0 = now_s();
		rc = llama_decode(ctx, llama_batch_get_one(toks, n_prompt));
		llama_synchronize(ctx);
		double t1 = now_s();
		best_pf = t1 - t0 < best_pf ? t1 - t0 : best_pf;
	}
	/* the depth, once */
	llama_memory_clear(mem, false);
	for (int p = 0; p < depth && !rc; p += n_prompt) {
		int n = depth - p < n_prompt ? depth - p : n_prompt;
		rc = llama_decode(ctx, llama_batch_get_one(&toks[p], n));
	}
	for (int r = 0; r < reps && !rc; r++) {
		llama_memory_seq_rm(mem, 0, depth, -1);
		double t2 = now_s();
		for (int i = 0; i < n_decode && !rc; i++) {
			rc = llama_decode(ctx, llama_batch_get_one(&toks[depth + i], 1));
			llama_synchronize(ctx);
		}
		double t3 = now_s();
		best_dec = t3 - t2 < best_dec ? t3 - t2 : best_dec;
	}
	if (rc) {
		fprintf(stderr, "llamacpp-bench: llama_decode failed (%d)\n", rc);
		return 1;
	}
	/* the prompt's state as llama-server's /slots?action=save writes it
	 * (llama_state_seq_save_file: header, tokens, K/V in the context's
	 * default types, f16) */
	size_t slot = 0;
	llama_memory_clear(mem, false);
	if (!llama_decode(ctx, llama_batch_get_one(toks, n_prompt))) {
		char path[] = "/tmp/llamacpp-slot.XXXXXX";
		int fd = mkstemp(path);
		if (fd >= 0) {
			close(fd);
			slot = llama_state_seq_save_file(ctx, path, 0, toks, (size_t)n_prompt);
			unlink(path);
		}
	}
	/* all_params / size_MB: every tensor (llama_model_n_params/_size),
	 * embedding included — not llamad-bench's params / weight_MB, which
	 * count only what one token reads */
	printf("model=%s dtype=%s all_params=%.1fM threads=%d prompt=%d prefill_tok_s=%.1f "
	       "decode=%d decode_tok_s=%.1f size_MB=%.1f impl=llama.cpp-%s cpu=%s "
	       "slot_file_bytes=%zu slot_bytes_per_token=%.0f depth=%d\n",
	       gguf, ftype_name(model), llama_model_n_params(model) / 1e6, threads, n_prompt,
	       n_prompt / best_pf, n_decode, n_decode / best_dec, llama_model_size(model) / 1e6,
	       llama_version(), cpu_variant, slot, (double)slot / n_prompt, depth);
	free(toks);
	llama_free(ctx);
	if (tp_free)
		tp_free(tp);
	llama_model_free(model);
	return 0;
}

/* llama_model_quantize of in into out as type (a name of llama-quantize's). */
static int quantize(const char *in, const char *out, const char *type, int threads)
{
	static const struct {
		const char *name;
		enum llama_ftype ft;
	} types[] = {
		{ "q4_0", LLAMA_FTYPE_MOSTLY_Q4_0 },     { "q8_0", LLAMA_FTYPE_MOSTLY_Q8_0 },
		{ "q4_k_s", LLAMA_FTYPE_MOSTLY_Q4_K_S }, { "q4_k_m", LLAMA_FTYPE_MOSTLY_Q4_K_M },
		{ "q5_k_m", LLAMA_FTYPE_MOSTLY_Q5_K_M }, { "q6_k", LLAMA_FTYPE_MOSTLY_Q6_K },
	};
	struct llama_model_quantize_params qp = llama_model_quantize_default_params();
	qp.nthread = threads;
	size_t i = 0;
	while (i < sizeof(types) / sizeof(types[0]) && strcasecmp(types[i].name, type))
		i++;
	if (i == sizeof(types) / sizeof(types[0])) {
		fprintf(stderr, "llamacpp-bench: --quantize: unknown type %s\n", type);
		return 2;
	}
	qp.ftype = types[i].ft;
	if (llama_model_quantize(in, out, &qp)) {
		fprintf(stderr, "llamacpp-bench: llama_model_quantize of %s failed\n", in);
		return 1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	const char *libdir = NULL, *model = NULL, *tok = NULL, *text = NULL;
	int threads = 2, reps = 3, n_prompt = 128, n_decode = 128, depth = 0;
	const char *quant_in = NULL;
	static const struct option opts[] = {
		{ "libdir", required_argument, NULL, 'L' },
		{ "model", required_argument, NULL, 'm' },
		{ "tokenizer", required_argument, NULL, 'k' },
		{ "text", required_argument, NULL, 'T' },
		{ "threads", required_argument, NULL, 't' },
		{ "reps", required_argument, NULL, 'r' },
		{ "prompt-tokens", required_argument, NULL, 'p' },
		{ "decode-tokens", required_argument, NULL, 'd' },
		{ "depth", required_argument, NULL, 'D' },
		{ "quantize", required_argument, NULL, 'Q' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int c;
	while ((c = getopt_long(argc, argv, "m:t:vh", opts, NULL)) != -1) {
		switch (c) {
		case 'L': libdir = optarg; break;
		case 'm': model = optarg; break;
		case 'k': tok = optarg; break;
		case 'T': text = optarg; break;
		case 't': threads = atoi(optarg); break;
		case 'r': reps = atoi(optarg); break;
		case 'p': n_prompt = atoi(optarg); break;
		case 'd': n_decode = atoi(optarg); break;
		case 'D': depth = atoi(optarg); break;
		case 'Q': quant_in = optarg; break;
		case 'v': verbose = 1; break;
		default:
			fprintf(stderr, "usage: llamacpp-bench --libdir DIR [--threads N] [--reps N] "
					"[--tokenizer GGUF --text FILE] [--model GGUF "
					"[--prompt-tokens N] [--decode-tokens N] [--depth N]] [-v]\n"
					"       llamacpp-bench --libdir DIR --quantize IN OUT TYPE "
					"[--threads N]\n");
			return c == 'h' ? 0 : 2;
		}
	}
	if (libdir && quant_in && optind + 2 == argc) {
		llama_log_set(log_cb, NULL);
		ggml_backend_load_all_from_path(libdir);
		llama_backend_init();
		int rc = quantize(quant_in, argv[optind], argv[optind + 1], threads);
		llama_backend_free();
		return rc;
	}
	if (!libdir || (!model && !(tok && text)) || threads < 1 || reps < 1 || n_prompt < 1 ||
	    n_decode < 1 || depth < 0 || quant_in) {
		fprintf(stderr, "llamacpp-bench: --libdir and --model or --tokenizer+--text needed\n");
		return 2;
	}
	llama_log_set(log_cb, NULL);
	ggml_backend_load_all_from_path(libdir);
	llama_backend_init();
	int rc = 0;
	if (tok && text)
		rc = tokenize_bench(tok, text, reps);
	if (!rc && model)
		rc = decode_bench(model, threads, n_prompt, n_decode, depth, reps);
	llama_backend_free();
	return rc;
}

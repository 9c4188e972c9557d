/*
 * tests/bench/bench.c — llamad-bench: engine speed and accuracy on one model.
 *
 *   llamad-bench --model PATH [--tokenizer PATH] [--threads N]
 *                [--prompt-tokens N] [--decode-tokens N] [--reps N]
 *                [--kv-type f32|f16|q8_0] [--op-times] [--depth N]
 *   llamad-bench --tokenizer PATH --tokenize TEXTFILE [--reps N]
 *   llamad-bench --model PATH --shift [--window N] [--keep N] [--shifts N]
 *                [--seed S] [--threads N] [--reps N] [--kv-type T]
 *   llamad-bench --model PATH --perplexity TEXTFILE [--tokenizer PATH]
 *   llamad-bench --model PATH --kl-ref REF [--text TEXTFILE] [--ctx N]
 *                [--chunks N] [--tokenizer PATH] [--threads N]
 *   llamad-bench --model PATH --kl-write FILE --text TEXTFILE [--ctx N]
 *                [--chunks N] [--tokenizer PATH] [--threads N]
 *
 * --shift: a context shift, re-prefill against re-rotation of the kept
 * tokens, time and accuracy (tests/bench/shift.c).
 *
 * --kl-ref: the model's next-token distributions against those of REF (a
 * model, or a logits file of --kl-write or llama-perplexity) over chunks
 * of --ctx tokens (default 512) of the text, scored on the second half of
 * each chunk as llama-perplexity --kl-divergence scores them: mean KL,
 * top-1 agreement, both perplexities. --kl-write: the model's
 * log-probabilities there as llama.cpp's --kl-divergence-base file, for
 * llama-perplexity --kl-divergence (tests/bench/kl.c).
 *
 * --tokenize: tokenizer speed alone, on one thread: the load time, then
 * tok_encode of the whole file (no BOS) and tok_decode of its ids, best of
 * --reps (MB/s of the file's bytes); checks the decode gives the file back.
 *
 * Measures, in one run: prefill tok/s of an N-token prompt on an empty
 * sequence, decode tok/s (one token per forward pass, batch 1, positions
 * 0..N-1 of an empty sequence, as llama-bench's tg test does; with
 * --depth D at positions D..D+N-1 after D tokens, as its -d D), best of
 * --reps runs; and two roofs (see "roofs" below): memory read bandwidth
 * (all threads streaming a 1 GiB buffer, right before and after each
 * decode run), against which decode is rated (roof_tok_s = bandwidth /
 * weight bytes read per token; roof_pct), and the FMA peak, against which
 * prefill is (prefill_fma_pct). --no-bandwidth skips both probes. Prints
 * one line of key=value pairs.
 *
 * --op-times: then one more decode run through a timed op table
 * (tests/bench/optime.c), and a table of where its time went: each op's
 * microseconds a token, the products by weight with the GB/s they read.
 */
#include <errno.h>
#include <math.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kernels/cpu/threadpool.h"
#include "model/forward.h"
#include "session/kvpool.h"
#include "tests/bench/kl.h"
#include "tests/bench/optime.h"
#include "tests/bench/prefill.h"
#include "tests/bench/shift.h"

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct bw_job {
	const float *buf;
	size_t n;
	float sums[64];
};

#if defined(__x86_64__)
__attribute__((target("avx512f")))
static float sum_avx512(const float *p, size_t n)
{
	__m512 a[8];
	for (int k = 0; k < 8; k++)
		a[k] = _mm512_setzero_ps();
	for (size_t i = 0; i < n; i += 128)
		for (int k = 0; k < 8; k++)
			a[k] = _mm512_add_ps(a[k], _mm512_load_ps(p + i + 16 * k));
	for (int k = 1; k < 8; k++)
		a[0] = _mm512_add_ps(a[0], a[k]);
	return _mm512_reduce_add_ps(a[0]);
}
#endif

static float sum_plain(const float *p, size_t n)
{
	float acc[16] = { 0 };
	for (size_t i = 0; i < n; i += 16)
		for (int k = 0; k < 16; k++)
			acc[k] += p[i + k];
	float s = 0;
	for (int k = 0; k < 16; k++)
		s += acc[k];
	return s;
}

/* Each thread sums its own contiguous share of the buffer. */
static void bw_worker(void *ctx, int ith, int nth)
{
	struct bw_job *j = ctx;
	size_t per = j->n / (size_t)nth & ~(size_t)127;
	const float *p = j->buf + per * (size_t)ith;
#if defined(__x86_64__)
	if (__builtin_cpu_supports("avx512f")) {
		j->sums[ith] = sum_avx512(p, per);
		return;
	}
#endif
	j->sums[ith] = sum_plain(p, per);
}

/* ---- roofs -----------------------------------------------------------------
 *
 * Memory: all threads sum their shares of a 1 GiB buffer, one pass at a time
 * (bw_pass). Several streams a thread or software prefetch read no more on
 * this guest (8 or 16 streams a thread: 0.81-0.86 of one, measured
 * alternately over 15 rounds); what moves the figure is the host: its other
 * tenants take 24 to 48 GB/s from one second to the next. So a pass is made
 * right before and right after each decode run, the decode is compared with
 * their mean, and roof_pct is the median of those paired ratios (bw_GB_s is
 * the median pass, bw_min/bw_max the spread). A roof measured once, seconds
 * away from the decode, read 113-136 % on a good decode and 47 % on a bad
 * probe.
 *
 * Compute: every thread runs twelve independent FMA chains on registers (the
 * widest vectors the CPU has: AVX-512 or AVX2 + FMA); fma_GFLOP_s counts two
 * flops a lane, 0 where neither exists. prefill_GFLOP_s counts the prefill's
 * matrix and attention flops (prefill_flops); prefill_fma_pct is its share
 * of the FMA roof, for f32, f16 and bf16 weights only (0 for quantized ones,
 * whose packed path multiplies 8-bit integers, four to an fp32 lane). */
struct bw_buf {
	float *buf;
	size_t bytes;
	struct tpool *tp;
	int threads;
};

static int bw_open(struct bw_buf *b, int threads)
{
	b->bytes = (size_t)1 << 30;
	b->threads = threads;
	b->buf = aligned_alloc(64, b->bytes);
	b->tp = tpool_new(threads);
	if (!b->buf || !b->tp) {
		free(b->buf);
		tpool_free(b->tp);
		return -1;
	}
	for (size_t i = 0; i < b->bytes / 4; i++)
		b->buf[i] = (float)(i & 7);
	return 0;
}

static void bw_close(struct bw_buf *b)
{
	tpool_free(b->tp);
	free(b->buf);
}

/* One pass: bytes/s. */
static double bw_pass(struct bw_buf *b)
{
	struct bw_job j = { b->buf, b->bytes / 4, { 0 } };
	double t0 = now_s();
	tpool_run(b->tp, bw_worker, &j, b->threads);
	return (double)b->bytes / (now_s() - t0);
}

struct fma_job {
	long iters;
	int width;              /* floats a vector: 16, 8, or 0 (none) */
};

#if defined(__x86_64__)
#define FMA12(op, r) op " %%" r "12, %%" r "13, %%" r "0\n\t" op " %%" r "12, %%" r "13, %%" r "1\n\t" \
	op " %%" r "12, %%" r "13, %%" r "2\n\t" op " %%" r "12, %%" r "13, %%" r "3\n\t"      \
	op " %%" r "12, %%" r "13, %%" r "4\n\t" op " %%" r "12, %%" r "13, %%" r "5\n\t"      \
	op " %%" r "12, %%" r "13, %%" r "6\n\t" op " %%" r "12, %%" r "13, %%" r "7\n\t"      \
	op " %%" r "12, %%" r "13, %%" r "8\n\t" op " %%" r "12, %%" r "13, %%" r "9\n\t"      \
	op " %%" r "12, %%" r "13, %%" r "10\n\t" op " %%" r "12, %%" r "13, %%" r "11\n\t"
#define FMA_CLOBBER "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", \
	"xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "cc"

/* fn(n): n rounds of the twelve chains on vector registers R (asm) */
#define FMA_CHAINS(fn, isa, R)                                                 \
	__attribute__((target(isa))) static void fn(long n)                    \
	{                                                                      \
		__asm__ volatile("vxorps %%xmm12, %%xmm12, %%xmm12\n\t"          \
				 "vxorps %%xmm13, %%xmm13, %%xmm13\n\t"          \
				 "1:\n\t" FMA12("vfmadd231ps", R) "dec %0\n\t" \
				 "jnz 1b\n\t"                                     \
				 "vzeroupper"                                      \
				 : "+r"(n) : : FMA_CLOBBER);                       \
	}
FMA_CHAINS(fma_chains_512, "avx512f", "zmm")
FMA_CHAINS(fma_chains_256, "avx2,fma", "ymm")
#endif

static void fma_worker(void *ctx, int ith, int nth)
{
	(void)ith;
	(void)nth;
	struct fma_job *j = ctx;
#if defined(__x86_64__)
	if (j->width == 16)
		fma_chains_512(j->iters);
	else if (j->width == 8)
		fma_chains_256(j->iters);
#else
	(void)j;
#endif
}

/* The FMA peak of all threads in flop/s (best of 5), or 0 if unknown. */
static double measure_fma(int threads)
{
	struct fma_job j = { 20000000, 0 };
#if defined(__x86_64__)
	if (__builtin_cpu_supports("avx512f"))
		j.width = 16;
	else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
		j.width = 8;
#endif
	struct tpool *tp = j.width ? tpool_new(threads) : NULL;
	if (!tp)
		return 0;
	double best = 0;
	for (int r = 0; r < 6; r++) {
		double t0 = now_s();
		tpool_run(tp, fma_worker, &j, threads);
		double f = 2.0 * j.width * 12 * j.iters * threads / (now_s() - t0);
		if (r > 0 && f > best)  /* the first run wakes the cores */
			best = f;
	}
	tpool_free(tp);
	return best;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Perplexity of the model on a text file (BOS + its tokens, up to the
 * context): exp of the mean negative log-likelihood of each next token.
 * Prints one key=value line. */
static int perplexity(struct model *m, const char *path, int threads)
{
	FILE *f = fopen(path, "re");
	if (!f) {
		fprintf(stderr, "llamad-bench: %s: %s\n", path, strerror(errno));
		return 1;
	}
	char buf[1 << 16];
	size_t len = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[len] = 0;
	int32_t *ids = NULL;
	int n = tok_encode(m->tok, buf, len, 1, &ids);
	if (n < 2) {
		fprintf(stderr, "llamad-bench: %s: too short\n", path);
		free(ids);
		return 1;
	}
	if (n > m->cfg.max_ctx)
		n = m->cfg.max_ctx;
	int V = m->cfg.vocab;
	struct prefill p;
	double *lp = malloc((size_t)V * sizeof(double));
	if (prefill_init(&p, m, threads, n) || !lp) {
		fprintf(stderr, "llamad-bench: out of memory\n");
		return 1;
	}
	prefill_run(&p, ids, n);
	double nll = 0;
	for (int i = 0; i + 1 < n; i++) {
		log_softmax(p.logits + (size_t)i * V, V, lp);
		nll += -lp[ids[i + 1]];
	}
	printf("model=%s dtype=%s perplexity=%.4f tokens=%d\n", m->path, kt_dtype_name(m->wtype),
	       exp(nll / (n - 1)), n - 1);
	prefill_done(&p);
	free(lp);
	free(ids);
	model_free(m);
	return 0;
}

/* One layer's matrix parameters: Wq, Wk, Wv (qkv) and the rest (Wo and
 * the feed-forward). */
static void layer_params(const struct model_config *c, double *qkv, double *rest)
{
	double qd = (double)c->n_heads * c->head_dim, kv = model_kv_dim(c);
	*qkv = c->dim * (qd + 2 * kv);
	*rest = qd * c->dim + 3.0 * c->dim * c->ffn_dim;
}

/* Parameters in the matrices read per token (embedding excluded). */
static double model_params(const struct model *m)
{
	const struct model_config *c = &m->cfg;
	double qkv, rest;
	layer_params(c, &qkv, &rest);
	return (qkv + rest) * c->n_layers + (double)c->vocab * c->dim;
}

/* Flops of an n-token prefill on an empty sequence, as the engine runs it:
 * every matrix for every token in all layers but the last, whose Wq, Wk
 * and Wv alone run for every token (its K/V) and the rest for the last
 * token only (model/forward.c, compact_out_rows), as the classifier;
 * attention: scores and the weighted sum of V, 2 x 2 x head_dim flops a
 * head and position seen. */
static double prefill_flops(const struct model *m, int n)
{
	const struct model_config *c = &m->cfg;
	double qkv, rest;
	layer_params(c, &qkv, &rest);
	double qd = (double)c->n_heads * c->head_dim;
	double cls = (double)c->vocab * c->dim, L = c->n_layers;
	double mat = n * (L * qkv + (L - 1) * rest) + rest + cls;
	double attn = 4.0 * qd * ((L - 1) * ((double)n * (n + 1) / 2) + n);
	return 2.0 * mat + attn;
}

static int read_text(const char *path, char **buf, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return -errno;
	size_t cap = 1 << 20, n = 0;
	char *b = malloc(cap);
	while (b) {
		size_t r = fread(b + n, 1, cap - n, f);
		n += r;
		if (n < cap)
			break;
		char *nb = realloc(b, cap * 2);
		if (!nb) {
			free(b);
			b = NULL;
			break;
		}
		b = nb;
		cap *= 2;
	}
	fclose(f);
	if (!b)
		return -ENOMEM;
	*buf = b;
	*len = n;
	return 0;
}

static int tokenize_bench(const char *tok_path, const char *text_path, int reps)
{
	char *text = NULL, *cause = NULL;
	size_t len = 0;
	int rc = read_text(text_path, &text, &len);
	if (rc) {
		fprintf(stderr, "llamad-bench: %s: %s\n", text_path, strerror(-rc));
		return 1;
	}
	double t0 = now_s();
	struct tok *t = tok_load(tok_path, &cause);
	double load = now_s() - t0;
	if (!t) {
		fprintf(stderr, "llamad-bench: %s\n", cause);
		return 1;
	}
	double best_enc = 1e30, best_dec = 1e30;
	int n = 0, same = 0;
	for (int r = 0; r < reps; r++) {
		int32_t *ids = NULL;
		char *back = NULL;
		double a = now_s();
		n = tok_encode(t, text, len, 0, &ids);
		double b = now_s();
		if (n < 0) {
			fprintf(stderr, "llamad-bench: %s: encoding failed (%s)\n", text_path,
				strerror(-n));
			return 1;
		}
		int k = tok_decode(t, ids, n, &back);
		double c = now_s();
		same = k >= 0 && (size_t)k == len && memcmp(back, text, len) == 0;
		best_enc = b - a < best_enc ? b - a : best_enc;
		best_dec = c - b < best_dec ? c - b : best_dec;
		free(ids);
		free(back);
	}
	printf("tokenizer=%s kind=%s text=%s bytes=%zu tokens=%d bytes_per_token=%.2f load_s=%.3f "
	       "encode_MB_s=%.2f decode_MB_s=%.2f round_trip=%s\n",
	       tok_path, tok_kind(t) == TOK_BPE ? "bpe" : "spm", text_path, len, n,
	       n ? (double)len / n : 0.0, load, len / best_enc / 1e6, len / best_dec / 1e6,
	       same ? "exact" : "DIFFERS");
	tok_free(t);
	free(text);
	return same ? 0 : 1;
}

int main(int argc, char **argv)
{
	const char *model_path = NULL, *tok_path = NULL;
	int threads = 0, n_prompt = 128, n_decode = 128, reps = 3, skip_bw = 0, op_times = 0;
	int depth = 0;
	const char *ppl_file = NULL, *tok_text = NULL;
	enum kt_dtype kvt = KT_F32;
	int shift = 0;
	struct shift_opts so = { .keep = 16, .shifts = 4, .seed = 1 };
	struct kl_opts ko = { 0 };
	static const struct option opts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "tokenizer", required_argument, NULL, 'k' },
		{ "threads", required_argument, NULL, 't' },
		{ "prompt-tokens", required_argument, NULL, 'p' },
		{ "decode-tokens", required_argument, NULL, 'd' },
		{ "reps", required_argument, NULL, 'r' },
		{ "no-bandwidth", no_argument, NULL, 'B' },
		{ "op-times", no_argument, NULL, 'O' },
		{ "depth", required_argument, NULL, 'D' },
		{ "perplexity", required_argument, NULL, 'P' },
		{ "tokenize", required_argument, NULL, 'T' },
		{ "kv-type", required_argument, NULL, 'K' },
		{ "shift", no_argument, NULL, 'S' },
		{ "window", required_argument, NULL, 'W' },
		{ "keep", required_argument, NULL, 'L' },
		{ "shifts", required_argument, NULL, 'N' },
		{ "seed", required_argument, NULL, 'E' },
		{ "kl-ref", required_argument, NULL, 'R' },
		{ "kl-write", required_argument, NULL, 'w' },
		{ "text", required_argument, NULL, 'x' },
		{ "ctx", required_argument, NULL, 'c' },
		{ "chunks", required_argument, NULL, 'u' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int c;
	while ((c = getopt_long(argc, argv, "m:t:h", opts, NULL)) != -1) {
		switch (c) {
		case 'm': model_path = optarg; break;
		case 'k': tok_path = optarg; break;
		case 't': threads = atoi(optarg); break;
		case 'p': n_prompt = atoi(optarg); break;
		case 'd': n_decode = atoi(optarg); break;
		case 'r': reps = atoi(optarg); break;
		case 'B': skip_bw = 1; break;
		case 'O': op_times = 1; break;
		case 'D': depth = atoi(optarg); break;
		case 'P': ppl_file = optarg; break;
		case 'T': tok_text = optarg; break;
		case 'K':
			kvt = !strcmp(optarg, "f16") ? KT_F16 : !strcmp(optarg, "q8_0") ? KT_Q8_0 : KT_F32;
			if (kvt == KT_F32 && strcmp(optarg, "f32")) {
				fprintf(stderr, "llamad-bench: --kv-type f32, f16 or q8_0\n");
				return 2;
			}
			break;
		case 'S': shift = 1; break;
		case 'W': so.window = atoi(optarg); break;
		case 'L': so.keep = atoi(optarg); break;
		case 'N': so.shifts = atoi(optarg); break;
		case 'E': so.seed = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'R': ko.ref = optarg; break;
		case 'w': ko.out = optarg; break;
		case 'x': ko.text = optarg; break;
		case 'c': ko.ctx = atoi(optarg); break;
		case 'u': ko.chunks = atoi(optarg); break;
		case 'h':
			printf("usage: llamad-bench --model PATH [--tokenizer PATH] [--threads N]\n"
			       "       [--prompt-tokens N] [--decode-tokens N] [--reps N] [--no-bandwidth]\n"
			       "       [--kv-type f32|f16|q8_0] [--op-times] [--depth N]\n"
			       "       llamad-bench --model PATH --perplexity TEXTFILE\n"
			       "       llamad-bench --tokenizer PATH --tokenize TEXTFILE [--reps N]\n"
			       "       llamad-bench --model PATH --shift [--window N] [--keep N]\n"
			       "       [--shifts N] [--seed S] [--threads N] [--reps N]\n"
			       "       llamad-bench --model PATH --kl-ref REF [--text TEXTFILE]\n"
			       "       [--ctx N] [--chunks N] [--tokenizer PATH] [--threads N]\n"
			       "       llamad-bench --model PATH --kl-write FILE --text TEXTFILE\n"
			       "       [--ctx N] [--chunks N] [--tokenizer PATH] [--threads N]\n");
			return 0;
		default:
			return 2;
		}
	}
	if (tok_text && tok_path && reps >= 1)
		return tokenize_bench(tok_path, tok_text, reps);
	if (model_path && (ko.ref || ko.out)) {
		if (ko.ref && ko.out) {
			fprintf(stderr, "llamad-bench: --kl-ref or --kl-write, not both\n");
			return 2;
		}
		ko.model = model_path;
		ko.tokenizer = tok_path;
		ko.threads = threads;
		return ko.ref ? kl_compare(&ko) : kl_write(&ko);
	}
	if (!model_path || n_prompt < 1 || n_decode < 1 || reps < 1 || depth < 0) {
		fprintf(stderr, "llamad-bench: --model is required; counts must be >= 1\n");
		return 2;
	}
	char *cause = NULL;
	struct model *m = model_load(model_path, tok_path, &cause);
	if (!m) {
		fprintf(stderr, "llamad-bench: %s\n", cause);
		free(cause);
		return 1;
	}
	const struct model_config *cf = &m->cfg;
	if (ppl_file)
		return perplexity(m, ppl_file, threads);
	if (shift) {
		so.threads = threads;
		so.reps = reps;
		so.kv_type = kvt;
		int rc = shift_bench(m, &so);
		model_free(m);
		return rc;
	}
	if (depth + n_decode > cf->max_ctx) {
		n_decode = cf->max_ctx - depth;
		if (n_decode < 1 || n_prompt > cf->max_ctx) {
			fprintf(stderr, "llamad-bench: the prompt or depth does not fit the context (%d)\n",
				cf->max_ctx);
			return 2;
		}
	}
	struct backend *be = backend_cpu_new(threads);
	/* the cache holds the prompt (positions 0..) and, apart, the decode
	 * (positions depth..) */
	int total = depth + n_decode > n_prompt ? depth + n_decode : n_prompt;
	struct kvpool *pool = kvpool_new_typed(NULL, kvt, cf->head_dim, (total + 15) / 16, 16,
					       cf->n_layers, model_kv_dim(cf));
	struct fwd *f = fwd_new(m, be, n_prompt);
	int fill_ok = 1;
	float *logits = malloc((size_t)cf->vocab * sizeof(float));
	int32_t *toks = malloc((size_t)total * sizeof(int32_t));
	struct kvseq seq = { 0 };
	if (!be || !pool || !f || !logits || !toks || kvseq_prepare(pool, &seq, total, 0)) {
		fprintf(stderr, "llamad-bench: out of memory\n");
		return 1;
	}
	uint64_t x = 88172645463325252ull;
	toks[0] = cf->bos;
	for (int i = 1; i < total; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		toks[i] = 3 + (int32_t)(x % (uint64_t)(cf->vocab - 3));
	}
	struct bw_buf bwb;
	int have_bw = !skip_bw && bw_open(&bwb, be->n_threads) == 0;
	double fma = skip_bw ? 0 : measure_fma(be->n_threads);
	double best_pf = 1e30, best_dec = 1e30;
	double *bws = calloc((size_t)reps * 2, sizeof(double));
	double *ratio = calloc((size_t)reps, sizeof(double));
	if (!bws || !ratio) {
		fprintf(stderr, "llamad-bench: out of memory\n");
		return 1;
	}
	/* --depth: the first depth tokens in the cache, in prompt-sized
	 * batches, once (a prefill below writes the same K/V at the same
	 * positions: the same tokens) */
	for (int p = 0; p < depth; p += n_prompt) {
		int n = depth - p < n_prompt ? depth - p : n_prompt;
		struct fwd_seq s = { &toks[p], n, p, seq.blocks, logits, 0 };
		fill_ok &= fwd_run(f, &pool->kv, &s, 1) == 0;
	}
	if (!fill_ok) {
		fprintf(stderr, "llamad-bench: the depth's prefill failed\n");
		return 1;
	}
	for (int r = 0; r < reps; r++) {
		struct fwd_seq s = { toks, n_prompt, 0, seq.blocks, logits, 0 };
		double t0 = now_s();
		fwd_run(f, &pool->kv, &s, 1);
		double t1 = now_s();
		if (have_bw)
			bws[2 * r] = bw_pass(&bwb);
		/* decode from an empty context, like llama-bench's tg test
		 * (after depth tokens: its -d) */
		double t2 = now_s();
		for (int i = 0; i < n_decode; i++) {
			struct fwd_seq d = { &toks[depth + i], 1, depth + i, seq.blocks, logits, 0 };
			fwd_run(f, &pool->kv, &d, 1);
		}
		double t3 = now_s();
		if (have_bw) {
			bws[2 * r + 1] = bw_pass(&bwb);
			/* this run's tok/s over the roof of the passes around it */
			ratio[r] = n_decode / (t3 - t2) * (double)m->weight_bytes /
				   ((bws[2 * r] + bws[2 * r + 1]) / 2);
		}
		best_pf = t1 - t0 < best_pf ? t1 - t0 : best_pf;
		best_dec = t3 - t2 < best_dec ? t3 - t2 : best_dec;
	}
	if (have_bw)
		bw_close(&bwb);
	if (op_times) {
		/* one more decode run, op by op through the timed table */
		optime_wrap(be);
		double t0 = now_s();
		for (int i = 0; i < n_decode; i++) {
			struct fwd_seq d = { &toks[depth + i], 1, depth + i, seq.blocks, logits, 0 };
			fwd_run(f, &pool->kv, &d, 1);
		}
		double t1 = now_s();
		optime_unwrap(be);
		optime_print(stdout, t1 - t0, n_decode);
	}
	double bw = have_bw ? median(bws, 2 * reps) : 0;
	double bw_lo = have_bw ? bws[0] : 0, bw_hi = have_bw ? bws[2 * reps - 1] : 0;
	double roof_pct = have_bw ? 100.0 * median(ratio, reps) : 0;
	double pf = n_prompt / best_pf, dec = n_decode / best_dec;
	double roof = bw > 0 ? bw / (double)m->weight_bytes : 0;
	double pf_flops = prefill_flops(m, n_prompt) / best_pf;
	/* the FMA roof is that of fp32 products: f32, f16 and bf16 weights
	 * (packed quantized ones multiply 8-bit integers, 4 a lane) */
	int fp_w = m->wtype == KT_F32 || m->wtype == KT_F16 || m->wtype == KT_BF16;
	printf("model=%s dtype=%s params=%.1fM threads=%d prompt=%d prefill_tok_s=%.1f "
	       "decode=%d decode_tok_s=%.1f weight_MB=%.1f bw_GB_s=%.2f bw_min=%.2f bw_max=%.2f "
	       "roof_tok_s=%.1f roof_pct=%.1f fma_GFLOP_s=%.1f prefill_GFLOP_s=%.1f "
	       "prefill_fma_pct=%.1f kv=%s depth=%d\n",
	       model_path, kt_dtype_name(m->wtype),
	       model_params(m) / 1e6, be->n_threads,
	       n_prompt, pf, n_decode, dec, m->weight_bytes / 1e6, bw / 1e9, bw_lo / 1e9,
	       bw_hi / 1e9, roof, roof_pct, fma / 1e9, pf_flops / 1e9,
	       fma > 0 && fp_w ? 100.0 * pf_flops / fma : 0.0, kt_dtype_name(kvt), depth);
	free(bws);
	free(ratio);
	kvseq_release(pool, &seq);
	free(toks);
	free(logits);
	fwd_free(f);
	kvpool_free(pool);
	backend_free(be);
	model_free(m);
	return 0;
}

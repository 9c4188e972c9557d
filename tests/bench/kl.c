/*
 * tests/bench/kl.c — llamad-bench --kl-ref / --kl-write: the next-token
 * distributions of a model (a quantized GGUF, say) against a reference's
 * (the f32 weights), the way llama.cpp's llama-perplexity --kl-divergence
 * measures them, so that the figures of the two engines compare:
 *
 *   chunks   the text, encoded with BOS, cut into chunks of ctx tokens
 *            (default 512); each chunk runs as one prefill from an empty
 *            sequence, its first token replaced by BOS (llama-perplexity
 *            does the same); by default the fewest chunks that score
 *            1,000 positions (4 of 512), fewer if the text is short;
 *   scored   only the second half of each chunk: the logits of positions
 *            ctx/2 .. ctx-2, each predicting the token after it, so that
 *            every scored prediction has at least ctx/2 tokens before it
 *            (llama-perplexity's choice); ctx - 1 - ctx/2 a chunk;
 *   figures  at each scored position, from the log-softmax of both
 *            models' logits in double: KL(P_ref || P_test) = sum over the
 *            vocabulary of p_ref (log p_ref - log p_test), whether the two
 *            most likely tokens are the same (the first of equals), and
 *            each model's log-probability of the actual next token (the
 *            perplexities). Printed: the mean KL (with its standard
 *            error), its median, 99th percentile (interpolated, as
 *            llama-perplexity's) and maximum; top-1 agreement in %; both
 *            perplexities; and the largest |log p_ref - log p_test| among
 *            the tokens the reference gives a log-probability above -16.
 *
 * The reference is a model (--kl-ref PATH: anything llamad loads) or a
 * logits file (--kl-ref FILE, told by its magic), written by --kl-write or
 * by llama-perplexity --kl-divergence-base. A model runs first over every
 * chunk and its logits of the scored positions are kept (chunks x scored x
 * vocab floats: 523 MB for 4 chunks of 512 at Llama 3's 128,256 tokens);
 * it is freed before the measured model is loaded, so that two large
 * models are never held at once. The text is encoded by the reference's
 * tokenizer; with a file, the file's tokens are used and --text is not
 * read. The two vocabularies must have the same size. With a model
 * reference KL sums over the whole vocabulary (a model against itself
 * gives exactly 0); with a file over the tokens whose stored log-
 * probability is above -16, as llama-perplexity does.
 *
 * The logits file (llama.cpp's examples/perplexity/perplexity.cpp at
 * commit c392e5094 reads and writes it; host byte order, little-endian on
 * every machine llamad runs on):
 *
 *   char     magic[8]   "_logits_"
 *   uint32   n_ctx      tokens a chunk
 *   int32    n_vocab
 *   int32    n_chunk
 *   int32    tokens[n_chunk * n_ctx]   as encoded (BOS first), not with
 *                                      each chunk's first made BOS
 *   per chunk, per scored position (n_ctx - 1 - n_ctx/2 of them), nv =
 *   2 * ((n_vocab + 1) / 2) + 4 uint16:
 *     float  scale      (max - min) / 65535 of the logits, min no lower
 *                       than max - 16
 *     float  min_lp     the log-probability of that min
 *     uint16 q[n_vocab] round((logit - min) / scale); 0 at or below min
 *     uint16 pad        0 when n_vocab is odd
 *   so that log p = scale * q + min_lp, within scale / 2 (1.2e-4 at
 *   most) above the floor; every token 16 or more below the most likely
 *   one is held at the floor.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/bench/kl.h"
#include "tests/bench/prefill.h"
#include "util/file.h"

#define KL_MAGIC "_logits_"
#define KL_HEADER 20             /* magic, n_ctx, n_vocab, n_chunk */
#define KL_CTX 512               /* default tokens a chunk */
#define KL_POSITIONS 1000        /* default: the fewest chunks scoring this many */
#define KL_RANGE 16.0f           /* a record holds log-probs this far below the top */
#define KL_TEXT_MAX (1u << 30)   /* largest --text read */

/* The tokens both models run and where they are scored. */
struct kl_run {
	int ctx, chunks, vocab;
	int first, scored;   /* scored positions: [first, first + scored) = [ctx/2, ctx-1) */
	int32_t *toks;       /* (chunks, ctx) as encoded, BOS first */
};

/* The reference: a model's logits, or a logits file. */
struct kl_ref {
	int vocab;
	float *logits;             /* a model's: (chunks * scored, vocab) */
	const uint8_t *map;        /* a file's, mapped whole */
	size_t len;
	const uint8_t *recs;       /* its first record */
	int nv;                    /* uint16 a record */
};

static struct model *load(const char *path, const char *tok)
{
	char *cause = NULL;
	struct model *m = model_load(path, tok, &cause);
	if (!m) {
		fprintf(stderr, "llamad-bench: %s\n", cause);
		free(cause);
	}
	return m;
}

/* The chunk length asked, checked against m's context. 0, or 2. */
static int set_ctx(struct kl_run *r, const struct model *m, int ctx)
{
	r->ctx = ctx > 0 ? ctx : KL_CTX;
	if (r->ctx < 3 || r->ctx > m->cfg.max_ctx) {
		fprintf(stderr, "llamad-bench: --ctx must be 3..%d (%s's context)\n", m->cfg.max_ctx,
			m->path);
		return 2;
	}
	r->vocab = m->cfg.vocab;
	r->first = r->ctx / 2;
	r->scored = r->ctx - 1 - r->first;
	return 0;
}

/* r's tokens: o->text encoded by m's tokenizer with BOS, o->chunks chunks
 * of r->ctx (set_ctx first) or the default, fewer if the text is short.
 * 0, 1 or 2. */
static int text_chunks(struct kl_run *r, const struct model *m, const struct kl_opts *o)
{
	if (!o->text) {
		fprintf(stderr, "llamad-bench: --text FILE is required\n");
		return 2;
	}
	char *text = NULL;
	size_t len = 0;
	int rc = file_read(o->text, KL_TEXT_MAX, &text, &len);
	if (rc) {
		fprintf(stderr, "llamad-bench: %s: %s\n", o->text, strerror(-rc));
		return 1;
	}
	int n = tok_encode(m->tok, text, len, 1, &r->toks);
	free(text);
	if (n < 0) {
		fprintf(stderr, "llamad-bench: %s: encoding failed (%s)\n", o->text, strerror(-n));
		return 1;
	}
	int have = n / r->ctx;
	int want = o->chunks > 0 ? o->chunks : (KL_POSITIONS + r->scored - 1) / r->scored;
	if (have < 1) {
		fprintf(stderr, "llamad-bench: %s: %d tokens, fewer than a chunk of %d\n", o->text, n,
			r->ctx);
		return 1;
	}
	r->chunks = want < have ? want : have;
	return 0;
}

/* The logits file at o->ref, mapped into f, its tokens and sizes into r
 * (at most o->chunks chunks). 0 or 1. */
static int ref_open_file(struct kl_ref *f, struct kl_run *r, const struct kl_opts *o)
{
	char *cause = NULL;
	if (file_map(o->ref, &f->map, &f->len, &cause)) {
		fprintf(stderr, "llamad-bench: %s\n", cause);
		free(cause);
		return 1;
	}
	uint32_t ctx = 0;
	int32_t vocab = 0, chunks = 0;
	if (f->len >= KL_HEADER) {
		memcpy(&ctx, f->map + 8, 4);
		memcpy(&vocab, f->map + 12, 4);
		memcpy(&chunks, f->map + 16, 4);
	}
	/* bounds that keep the sizes below far from overflowing */
	if (ctx < 3 || ctx > 1u << 20 || vocab < 1 || vocab > 1 << 22 || chunks < 1 ||
	    chunks > 1 << 16) {
		fprintf(stderr, "llamad-bench: %s: not a logits file (n_ctx %u, n_vocab %d, "
			"n_chunk %d)\n", o->ref, ctx, vocab, chunks);
		return 1;
	}
	f->vocab = r->vocab = vocab;
	f->nv = 2 * ((vocab + 1) / 2) + 4;
	r->ctx = (int)ctx;
	r->first = r->ctx / 2;
	r->scored = r->ctx - 1 - r->first;
	size_t ntok = (size_t)ctx * chunks;
	size_t want = KL_HEADER + ntok * 4 + (size_t)chunks * r->scored * f->nv * 2;
	if (f->len != want) {
		fprintf(stderr, "llamad-bench: %s: %zu bytes, not the %zu of n_ctx %u, n_vocab %d, "
			"n_chunk %d\n", o->ref, f->len, want, ctx, vocab, chunks);
		return 1;
	}
	r->toks = malloc(ntok * sizeof(int32_t));
	if (!r->toks) {
		fprintf(stderr, "llamad-bench: out of memory\n");
		return 1;
	}
	memcpy(r->toks, f->map + KL_HEADER, ntok * 4);
	for (size_t i = 0; i < ntok; i++)
		if (r->toks[i] < 0 || r->toks[i] >= vocab) {
			fprintf(stderr, "llamad-bench: %s: token %zu is %d, out of the vocabulary\n",
				o->ref, i, r->toks[i]);
			return 1;
		}
	f->recs = f->map + KL_HEADER + ntok * 4;
	r->chunks = o->chunks > 0 && o->chunks < chunks ? o->chunks : chunks;
	return 0;
}

/* The reference's log-probabilities at scored position row into lp
 * (vocab); returns its most likely token (the first of equals). */
static int ref_row(const struct kl_ref *f, size_t row, double *lp)
{
	if (f->logits)
		return log_softmax(f->logits + row * f->vocab, f->vocab, lp);
	const uint8_t *rec = f->recs + row * f->nv * 2;
	float scale, min_lp;
	memcpy(&scale, rec, 4);
	memcpy(&min_lp, rec + 4, 4);
	int top = 0;
	uint16_t qtop = 0;
	for (int i = 0; i < f->vocab; i++) {
		uint16_t q;
		memcpy(&q, rec + 8 + 2 * (size_t)i, 2);
		lp[i] = (double)scale * q + min_lp;
		if (q > qtop) {
			qtop = q;
			top = i;
		}
	}
	return top;
}

/* Called for each scored position: its row (chunk * scored + position -
 * first), the model's logits there and the token that follows. 0 or a
 * negative errno (stops the run). */
typedef int (*kl_row_fn)(void *arg, size_t row, const float *logits, int32_t next);

/* Run m over r's chunks (each as one prefill, its first token BOS) and
 * call fn at every scored position. 0 or a negative errno. */
static int run_model(const struct model *m, int threads, const struct kl_run *r, kl_row_fn fn,
		     void *arg)
{
	struct prefill p;
	int32_t *buf = malloc((size_t)r->ctx * sizeof(int32_t));
	int rc = prefill_init(&p, m, threads, r->ctx);
	if (!buf)
		rc = -ENOMEM;
	for (int c = 0; !rc && c < r->chunks; c++) {
		const int32_t *t = r->toks + (size_t)c * r->ctx;
		memcpy(buf, t, (size_t)r->ctx * sizeof(int32_t));
		buf[0] = m->cfg.bos;
		rc = prefill_run(&p, buf, r->ctx);
		for (int j = r->first; !rc && j < r->ctx - 1; j++)
			rc = fn(arg, (size_t)c * r->scored + (size_t)(j - r->first),
				p.logits + (size_t)j * r->vocab, t[j + 1]);
	}
	prefill_done(&p);
	free(buf);
	return rc;
}

static int run_failed(const char *path, int rc)
{
	fprintf(stderr, "llamad-bench: %s: %s\n", path,
		rc == -ENOMEM ? "out of memory" : rc == -EIO ? "writing failed" :
		"a forward pass failed");
	return 1;
}

static int keep_row(void *arg, size_t row, const float *logits, int32_t next)
{
	struct kl_ref *f = arg;
	(void)next;
	memcpy(f->logits + row * f->vocab, logits, (size_t)f->vocab * sizeof(float));
	return 0;
}

/* What the comparison adds up. */
struct kl_sum {
	const struct kl_ref *ref;
	double *lr, *lt;      /* (vocab) the reference's and the model's log-probs */
	double *kl;           /* (positions) each position's KL */
	double nll_ref, nll_test, dmax;
	long same;
};

static int compare_row(void *arg, size_t row, const float *logits, int32_t next)
{
	struct kl_sum *s = arg;
	int n = s->ref->vocab;
	int top = log_softmax(logits, n, s->lt);
	int top_ref = ref_row(s->ref, row, s->lr);
	/* a file holds the tokens 16 below the top at its floor: left out */
	double cut = s->ref->logits ? -INFINITY : -KL_RANGE;
	double kl = 0;
	for (int i = 0; i < n; i++) {
		double d = s->lr[i] - s->lt[i];
		if (s->lr[i] > cut)
			kl += exp(s->lr[i]) * d;
		if (s->lr[i] > -KL_RANGE)
			s->dmax = fmax(s->dmax, fabs(d));
	}
	s->kl[row] = kl;
	s->same += top == top_ref;
	s->nll_ref -= s->lr[next];
	s->nll_test -= s->lt[next];
	return 0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* The fraction f quantile of the n sorted values v, interpolated between
 * neighbours as llama-perplexity's percentiles are. */
static double quantile(const double *v, size_t n, double f)
{
	double p = f * (double)(n - 1);
	size_t i = (size_t)p;
	return i + 1 < n ? (1 - (p - i)) * v[i] + (p - i) * v[i + 1] : v[n - 1];
}

int kl_compare(const struct kl_opts *o)
{
	struct kl_run r = { 0 };
	struct kl_ref ref = { 0 };
	struct kl_sum s = { .ref = &ref };
	struct model *m = NULL;
	int rc = 0;
	if (file_has_magic(o->ref, KL_MAGIC, 8)) {
		rc = ref_open_file(&ref, &r, o);
	} else {
		struct model *rm = load(o->ref, o->tokenizer);
		rc = !rm ? 1 : set_ctx(&r, rm, o->ctx);
		if (!rc)
			rc = text_chunks(&r, rm, o);
		if (!rc) {
			ref.vocab = r.vocab;
			ref.logits = malloc((size_t)r.chunks * r.scored * r.vocab * sizeof(float));
			rc = ref.logits ? run_model(rm, o->threads, &r, keep_row, &ref) : -ENOMEM;
			rc = rc ? run_failed(o->ref, rc) : 0;
		}
		model_free(rm);
	}
	if (!rc && !(m = load(o->model, o->tokenizer)))
		rc = 1;
	if (!rc && (m->cfg.vocab != r.vocab || r.ctx > m->cfg.max_ctx)) {
		fprintf(stderr, "llamad-bench: %s: vocabulary %d, context %d; the reference's "
			"chunks need a vocabulary of %d and a context of %d\n", o->model, m->cfg.vocab,
			m->cfg.max_ctx, r.vocab, r.ctx);
		rc = 1;
	}
	size_t n = (size_t)r.chunks * r.scored;
	if (!rc) {
		s.lr = malloc((size_t)r.vocab * sizeof(double));
		s.lt = malloc((size_t)r.vocab * sizeof(double));
		s.kl = malloc(n * sizeof(double));
		rc = s.lr && s.lt && s.kl ? run_model(m, o->threads, &r, compare_row, &s) : -ENOMEM;
		rc = rc ? run_failed(o->model, rc) : 0;
	}
	if (!rc) {
		double sum = 0, sum2 = 0;
		for (size_t i = 0; i < n; i++) {
			sum += s.kl[i];
			sum2 += s.kl[i] * s.kl[i];
		}
		double mean = sum / n, var = n > 1 ? (sum2 / n - mean * mean) / (n - 1) : 0;
		qsort(s.kl, n, sizeof(double), cmp_double);
		printf("kl model=%s dtype=%s path=%s ref=%s ctx=%d chunks=%d scored=%d..%d "
		       "positions=%zu kl_mean=%.6g kl_se=%.2g kl_median=%.6g kl_p99=%.6g "
		       "kl_max=%.6g top1_pct=%.3f ppl_ref=%.4f ppl_test=%.4f dlogp_max=%.4g\n",
		       o->model, kt_dtype_name(m->wtype),
		       backend_env_flag("LLAMAD_CPU_EXACT_Q") ? "exact" : "default", o->ref, r.ctx,
		       r.chunks, r.first, r.ctx - 2, n, mean, var > 0 ? sqrt(var) : 0.0,
		       quantile(s.kl, n, 0.5), quantile(s.kl, n, 0.99), s.kl[n - 1],
		       100.0 * s.same / n, exp(s.nll_ref / n), exp(s.nll_test / n), s.dmax);
	}
	free(s.lr);
	free(s.lt);
	free(s.kl);
	free(ref.logits);
	file_unmap(ref.map, ref.len);
	free(r.toks);
	model_free(m);
	return rc;
}

/* What --kl-write carries from row to row. */
struct kl_out {
	FILE *f;
	int vocab, nv;
	uint16_t *rec;        /* (nv) */
	double nll;
};

/* The record of one scored position (the format above) into rec; returns
 * -log p of token next, from the logits in double. */
static double encode_row(const float *l, int n, int nv, uint16_t *rec, int32_t next)
{
	float mx = l[0], mn = l[0];
	for (int i = 1; i < n; i++) {
		mx = fmaxf(mx, l[i]);
		mn = fminf(mn, l[i]);
	}
	mn = fmaxf(mn, mx - KL_RANGE);
	double z = 0;
	for (int i = 0; i < n; i++)
		z += exp((double)l[i] - mx);
	double lz = log(z);
	float scale = (mx - mn) / 65535.0f, min_lp = (float)((double)mn - mx - lz);
	memcpy(rec, &scale, 4);
	memcpy(rec + 2, &min_lp, 4);
	for (int i = 0; i < nv - 4; i++) {
		double q = i < n && scale > 0 && l[i] > mn ? nearbyint(((double)l[i] - mn) / scale) : 0;
		rec[4 + i] = (uint16_t)(q < 65535 ? q : 65535);
	}
	return -((double)l[next] - mx - lz);
}

static int write_row(void *arg, size_t row, const float *logits, int32_t next)
{
	struct kl_out *w = arg;
	(void)row;
	w->nll += encode_row(logits, w->vocab, w->nv, w->rec, next);
	return fwrite(w->rec, 2, (size_t)w->nv, w->f) == (size_t)w->nv ? 0 : -EIO;
}

int kl_write(const struct kl_opts *o)
{
	struct kl_run r = { 0 };
	struct kl_out w = { 0 };
	struct model *m = load(o->model, o->tokenizer);
	int rc = !m ? 1 : set_ctx(&r, m, o->ctx);
	if (!rc)
		rc = text_chunks(&r, m, o);
	if (!rc && !(w.f = fopen(o->out, "wbe"))) {
		fprintf(stderr, "llamad-bench: %s: %s\n", o->out, strerror(errno));
		rc = 1;
	}
	if (!rc) {
		uint32_t ctx = (uint32_t)r.ctx;
		int32_t hdr[2] = { r.vocab, r.chunks };
		size_t ntok = (size_t)r.ctx * r.chunks;
		w.vocab = r.vocab;
		w.nv = 2 * ((r.vocab + 1) / 2) + 4;
		w.rec = malloc((size_t)w.nv * sizeof(uint16_t));
		if (!w.rec)
			rc = -ENOMEM;
		else if (fwrite(KL_MAGIC, 1, 8, w.f) != 8 || fwrite(&ctx, 4, 1, w.f) != 1 ||
			 fwrite(hdr, 4, 2, w.f) != 2 || fwrite(r.toks, 4, ntok, w.f) != ntok)
			rc = -EIO;
		if (!rc)
			rc = run_model(m, o->threads, &r, write_row, &w);
		if (fclose(w.f) && !rc)
			rc = -EIO;
		if (rc) {
			unlink(o->out);
			rc = run_failed(rc == -EIO ? o->out : o->model, rc);
		}
	}
	if (!rc) {
		size_t n = (size_t)r.chunks * r.scored;
		printf("kl_write=%s model=%s dtype=%s ctx=%d chunks=%d scored=%d..%d positions=%zu "
		       "vocab=%d bytes=%zu ppl=%.4f\n", o->out, o->model, kt_dtype_name(m->wtype),
		       r.ctx, r.chunks, r.first, r.ctx - 2, n, r.vocab,
		       KL_HEADER + (size_t)r.ctx * r.chunks * 4 + n * w.nv * 2, exp(w.nll / n));
	}
	free(w.rec);
	free(r.toks);
	model_free(m);
	return rc;
}

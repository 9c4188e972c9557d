/*
 * daemon/oneshot.c — see oneshot.h. Prefill the prompt in one batch, then
 * decode token by token through generate/generate.c's loop.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/oneshot.h"
#include "generate/generate.h"
#include "model/forward.h"
#include "session/kvpool.h"
#include "util/clock.h"

#define PREFILL_CHUNK 512

static const char *const end_names[] = {
	[GEN_EOS] = "eos", [GEN_MAX_TOKENS] = "max tokens", [GEN_STOP_STRING] = "stop string",
	[GEN_CONTEXT_FULL] = "context full",
};

static void emit_file(void *ctx, const char *text, size_t len)
{
	fwrite(text, 1, len, (FILE *)ctx);
	fflush((FILE *)ctx);
}

/* The prompt as a conversation's opening user turn under the template,
 * with the system prompt (what a session's first turn takes). */
static int encode_prompt(const struct model *m, const struct oneshot_opts *o, int32_t **ids)
{
	struct chat_ctx c = {
		.tmpl = o->tmpl, .bos = m->cfg.bos, .eos = m->cfg.eos, .last_role = -1,
		.system = o->system,
	};
	return chat_encode_turn(m->tok, &c, CHAT_USER, o->prompt, ids);
}

int oneshot_run(struct model *m, const struct oneshot_opts *o, FILE *out)
{
	const struct model_config *c = &m->cfg;
	int32_t *hist = NULL;
	const char *unusable = chat_template_unusable(m->tok, o->tmpl);
	if (unusable) {
		fprintf(stderr, "llamad: --template %s: %s\n", chat_template_name(o->tmpl), unusable);
		return 2;
	}
	int n = encode_prompt(m, o, &hist);
	if (n < 0) {
		fprintf(stderr, "llamad: cannot tokenize the prompt: %s\n", strerror(-n));
		return 2;
	}
	if (n >= c->max_ctx) {
		fprintf(stderr, "llamad: prompt is %d tokens, the context holds %d\n", n, c->max_ctx);
		free(hist);
		return 2;
	}
	int total = n + o->max_tokens < c->max_ctx ? n + o->max_tokens : c->max_ctx;
	int32_t *nh = realloc(hist, (size_t)(total + 1) * sizeof(int32_t));
	if (!nh) {
		free(hist);
		return 1;
	}
	hist = nh;

	int rc = 1;
	struct backend_opts bo = { .kind = (enum backend_kind)o->device, .n_threads = o->threads,
				   .wtype = (enum backend_wtype)o->gpu_weights };
	char *cause = NULL, *note = NULL;
	struct backend *be = backend_open(&bo, &cause, &note);
	if (!be && cause) {
		fprintf(stderr, "llamad: %s\n", cause);
		free(cause);
		free(hist);
		return 1;
	}
	if (be && o->verbose)
		fprintf(stderr, "llamad: backend %s%s%s%s\n", be->desc, note ? " (GPU not used: " : "",
			note ? note : "", note ? ")" : "");
	free(note);
	const char *kv_why = NULL;
	enum kt_dtype kvt = be ? backend_kv_type(be, (enum kt_dtype)o->kv_type, c->head_dim, &kv_why)
			       : KT_F32;
	if (kv_why)
		fprintf(stderr, "llamad: kv_type %s is not available %s: using %s\n",
			kt_dtype_name((enum kt_dtype)o->kv_type), kv_why, kt_dtype_name(kvt));
	struct kvpool *pool = kvpool_new_typed(be, kvt, c->head_dim,
					       (total + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS,
					       KV_BLOCK_TOKENS, c->n_layers, model_kv_dim(c));
	struct fwd *f = be ? fwd_new(m, be, PREFILL_CHUNK) : NULL;
	float *logits = malloc((size_t)c->vocab * sizeof(float));
	struct kvseq seq = { 0 };
	struct gen g;
	int gen_ok = gen_init(&g, m, &o->sp, o->stops, o->n_stops, o->max_tokens, 0, emit_file,
			      out) == 0;
	if (!be || !pool || !f || !logits || !gen_ok || kvseq_prepare(pool, &seq, total, 0) != 0) {
		fprintf(stderr, "llamad: out of memory\n");
		goto out;
	}
	if (o->echo) {
		fputs(o->prompt, out);
		fflush(out);
	}

	double t0 = clock_mono_s();
	struct fwd_seq s = { hist, n, 0, seq.blocks, logits, 0 };
	if (fwd_run(f, &pool->kv, &s, 1) != 0) {
		fprintf(stderr, "llamad: forward pass rejected the prompt\n");
		goto out;
	}
	double t1 = clock_mono_s();
	int pos = n, why;
	for (;;) {
		int32_t next = gen_sample(&g, logits, hist, pos);
		if (gen_is_end(&g, next)) {  /* not part of the text, nor counted */
			why = GEN_EOS;
			break;
		}
		hist[pos] = next;
		if ((why = gen_accept(&g, next)) != GEN_GO)
			break;
		if (pos + 1 >= c->max_ctx) {
			why = GEN_CONTEXT_FULL;
			break;
		}
		struct fwd_seq d = { &hist[pos], 1, pos, seq.blocks, logits, 0 };
		if (fwd_run(f, &pool->kv, &d, 1) != 0) {
			fprintf(stderr, "llamad: forward pass failed\n");
			goto out;
		}
		pos++;
	}
	gen_finish(&g, why);
	fputc('\n', out);
	fflush(out);
	double t2 = clock_mono_s();
	if (o->verbose)
		fprintf(stderr, "llamad: prompt %d tokens in %.1f ms (%.1f tok/s); "
			"generated %d tokens in %.1f ms (%.1f tok/s); stop: %s\n",
			n, (t1 - t0) * 1e3, n / (t1 - t0), g.generated, (t2 - t1) * 1e3,
			g.generated > 1 ? (g.generated - 1) / (t2 - t1) : 0.0, end_names[why]);
	rc = 0;
out:
	if (pool)
		kvseq_release(pool, &seq);
	if (gen_ok)
		gen_done(&g);
	free(logits);
	fwd_free(f);
	kvpool_free(pool);
	backend_free(be);
	free(hist);
	return rc;
}

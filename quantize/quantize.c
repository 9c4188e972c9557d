/*
 * quantize/quantize.c — llamad-quantize: write any model llamad loads as
 * a GGUF v3 file with Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, F16 or F32 matrices.
 *
 *   llamad-quantize --model PATH [--tokenizer PATH]
 *                   --type q8_0|q4_0|q4_k|q5_k|q6_k|f16|f32 --out FILE.gguf
 *
 * What is written (all integers little-endian):
 *   "GGUF", u32 version 3, u64 tensor count, u64 KV count;
 *   KVs: key (u64 length + bytes), u32 value type, value (strings: u64
 *   length + bytes; arrays: u32 element type, u64 count, elements):
 *     general.architecture str "llama", general.name str (the model file or
 *     folder name, extension dropped), general.alignment u32 32,
 *     general.file_type u32 (0 f32, 1 f16, 2 q4_0, 7 q8_0, 15 q4_k (GGML's
 *     Q4_K_M number), 17 q5_k (Q5_K_M), 18 q6_k),
 *     llama.context_length, .embedding_length, .block_count,
 *     .feed_forward_length, .attention.head_count, .attention.head_count_kv,
 *     .rope.dimension_count (= head_dim) u32; llama.attention.key_length and
 *     .value_length u32 (= head_dim) only when head_dim != dim / heads;
 *     llama.attention.layer_norm_rms_epsilon f32, llama.rope.freq_base f32;
 *     a SentencePiece tokenizer: tokenizer.ggml.model str "llama", .tokens
 *     [str], .scores [f32], .token_type [i32] (1 normal, 2 unknown,
 *     3 control, 5 unused, 6 byte), .bos_token_id / .eos_token_id /
 *     .unknown_token_id u32 (each only if the tokenizer has one);
 *     a byte-level BPE one (Llama 3): tokenizer.ggml.model str "gpt2",
 *     .tokens [str] (the vocabulary's ByteLevel strings), .token_type [i32]
 *     (1 normal, 3 control, 4 user-defined, ...), .merges [str] ("left
 *     right" in rank order), .pre str (e.g. "llama-bpe"), .bos_token_id /
 *     .eos_token_id u32 (each only if it has one), .eot_token_id u32 (only
 *     if the vocabulary has <|eot_id|>), no scores;
 *     then either kind: tokenizer.ggml.add_bos_token bool true;
 *     tokenizer.chat_template str, the model file's chat template (only if
 *     it has one);
 *   tensor infos: name, u32 n_dims, u64 dims (ne[0] = the row length first),
 *     u32 ggml type (F32 0, F16 1, Q4_0 2, Q8_0 8, Q4_K 12, Q5_K 13, Q6_K
 *     14), u64 offset from the data
 *     section; zero padding to 32; the data, each tensor at a multiple of 32
 *     from the data section start, zero padding between.
 * Tensors, in this order: rope_freqs.weight (F32, head_dim/2 divisors of
 * the RoPE inverse frequencies; only when the model has RoPE scaling, e.g.
 * a Llama 3.1 rope_scaling); token_embd.weight; per layer blk.N.attn_norm,
 * attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down
 * (.weight); output_norm.weight; output.weight, omitted when the model ties
 * it to the embedding (the loader then uses token_embd.weight, as llama.cpp
 * does). Norm vectors are F32; every matrix, embedding
 * and output included, gets --type, except that a matrix whose rows are not
 * a whole number of 32-weight blocks falls back to F16 for q8_0/q4_0, and
 * one whose rows are not whole 256-weight super-blocks falls back to Q8_0
 * (F16 if not whole 32-weight blocks either) for q4_k/q5_k/q6_k. The K-quant
 * encoders are kt_quantize_q4_k/q5_k/q6_k: a plain min/max scheme, valid
 * GGML blocks but not GGML's optimized choice of scales.
 * attn_q / attn_k rows are in the interleaved RoPE pair order (llama2.c,
 * Meta, GGUF): a Hugging Face model's rotate_half rows are permuted back
 * (per head, row i + j*hd/2 -> 2i + j). A matrix already in the target type
 * is copied row by row unchanged; others go through fp32 (kt_row_to_f32)
 * and kt_quantize_* / kt_f32_to_f16.
 *
 * The file is written to FILE.gguf.tmp.XXXXXX beside it and renamed into
 * place after fflush + fsync + fclose succeed; on an error the temporary
 * file is removed. Exit status: 0 ok, 1 load or I/O error (the message
 * names the file), 2 usage error.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "model/model.h"
#include "text/tokenizer.h"
#include "util/grow.h"

#define GGUF_ALIGN 32

enum gguf_vtype {
	GV_U32 = 4,
	GV_I32 = 5,
	GV_F32 = 6,
	GV_BOOL = 7,
	GV_STR = 8,
	GV_ARR = 9,
};

enum ggml_type {
	GT_F32 = 0,
	GT_F16 = 1,
	GT_Q4_0 = 2,
	GT_Q8_0 = 8,
	GT_Q4_K = 12,
	GT_Q5_K = 13,
	GT_Q6_K = 14,
	GT_BF16 = 30,
};

static const struct {
	const char *flag;
	enum kt_dtype dt;
	uint32_t file_type;
} q_types[] = {
	{ "q8_0", KT_Q8_0, 7 },
	{ "q4_0", KT_Q4_0, 2 },
	{ "q4_k", KT_Q4_K, 15 },
	{ "q5_k", KT_Q5_K, 17 },
	{ "q6_k", KT_Q6_K, 18 },
	{ "f16", KT_F16, 1 },
	{ "f32", KT_F32, 0 },
};

static uint32_t ggml_type_of(enum kt_dtype dt)
{
	switch (dt) {
	case KT_F32: return GT_F32;
	case KT_F16: return GT_F16;
	case KT_BF16: return GT_BF16;
	case KT_Q8_0: return GT_Q8_0;
	case KT_Q4_0: return GT_Q4_0;
	case KT_Q4_K: return GT_Q4_K;
	case KT_Q5_K: return GT_Q5_K;
	case KT_Q6_K: return GT_Q6_K;
	}
	return GT_F32;
}

/* ---- a growable little-endian byte buffer -------------------------------- */

struct buf {
	uint8_t *p;
	size_t n, cap;
	int oom;
};

static void put(struct buf *b, const void *d, size_t n)
{
	if (b->oom)
		return;
	if (grow(&b->p, &b->cap, b->n + n, 1, 4096)) {
		b->oom = 1;
		return;
	}
	memcpy(b->p + b->n, d, n);
	b->n += n;
}

static void put_u32(struct buf *b, uint32_t v)
{
	uint8_t x[4];
	for (int i = 0; i < 4; i++)
		x[i] = (uint8_t)(v >> (8 * i));
	put(b, x, 4);
}

static void put_u64(struct buf *b, uint64_t v)
{
	uint8_t x[8];
	for (int i = 0; i < 8; i++)
		x[i] = (uint8_t)(v >> (8 * i));
	put(b, x, 8);
}

static void put_f32(struct buf *b, float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	put_u32(b, u);
}

static void put_str(struct buf *b, const char *s)
{
	size_t n = strlen(s);
	put_u64(b, n);
	put(b, s, n);
}

/* One KV's key and value type (counted in *n_kv); the caller appends the
 * value. */
static void kv_head(struct buf *b, uint64_t *n_kv, const char *key, enum gguf_vtype t)
{
	put_str(b, key);
	put_u32(b, t);
	++*n_kv;
}

static void kv_u32(struct buf *b, uint64_t *n_kv, const char *key, uint32_t v)
{
	kv_head(b, n_kv, key, GV_U32);
	put_u32(b, v);
}

static void kv_f32(struct buf *b, uint64_t *n_kv, const char *key, float v)
{
	kv_head(b, n_kv, key, GV_F32);
	put_f32(b, v);
}

static void kv_str(struct buf *b, uint64_t *n_kv, const char *key, const char *v)
{
	kv_head(b, n_kv, key, GV_STR);
	put_str(b, v);
}

static void kv_bool(struct buf *b, uint64_t *n_kv, const char *key, int v)
{
	kv_head(b, n_kv, key, GV_BOOL);
	uint8_t x = v ? 1 : 0;
	put(b, &x, 1);
}

/* ---- the tensors ----------------------------------------------------------- */

struct q_tensor {
	char name[64];
	const struct kt_weight *w;   /* a matrix, or NULL for a norm vector */
	const float *vec;            /* the norm vector (n floats) */
	int n;
	enum kt_dtype out;           /* output dtype */
	int rope_heads;              /* >0: attn_q/k rows to permute, this many heads */
	uint64_t offset, nbytes;
};

struct q_plan {
	struct q_tensor *t;
	int n, cap;
};

static int plan_add(struct q_plan *p, const char *name, const struct kt_weight *w,
		    const float *vec, int n, enum kt_dtype out, int rope_heads)
{
	if (p->n == p->cap) {
		int cap = p->cap ? 2 * p->cap : 64;
		struct q_tensor *t = realloc(p->t, (size_t)cap * sizeof(*t));
		if (!t)
			return -ENOMEM;
		p->t = t;
		p->cap = cap;
	}
	struct q_tensor *t = &p->t[p->n++];
	memset(t, 0, sizeof(*t));
	snprintf(t->name, sizeof(t->name), "%s", name);
	t->w = w;
	t->vec = vec;
	t->n = n;
	t->rope_heads = rope_heads;
	if (!w) {
		t->out = KT_F32;
		t->nbytes = (uint64_t)n * 4;
	} else {
		/* a row must be whole blocks to be quantized: K-quants fall
		 * back to Q8_0, then anything quantized to F16 */
		t->out = out;
		if (kt_dtype_is_quant(out) && w->cols % (int)kt_block_weights(out))
			t->out = KT_Q8_0;
		if (kt_dtype_is_quant(t->out) && w->cols % KT_QBLOCK)
			t->out = KT_F16;
		t->nbytes = (uint64_t)w->rows * kt_row_bytes(t->out, (size_t)w->cols);
	}
	return 0;
}

static int build_plan(struct q_plan *p, const struct model *m, enum kt_dtype out)
{
	const struct model_config *c = &m->cfg;
	/* Hugging Face rows are in rotate_half order: permute to interleaved */
	int perm = c->rope_layout == KT_ROPE_HALF;
	char name[64];
	int rc = 0;
	if (m->rope_freqs)
		rc = plan_add(p, "rope_freqs.weight", NULL, m->rope_freqs, c->head_dim / 2, out, 0);
	if (!rc)
		rc = plan_add(p, "token_embd.weight", &m->embed, NULL, 0, out, 0);
	for (int l = 0; l < c->n_layers && !rc; l++) {
		const struct model_layer *L = &m->layers[l];
#define ADD(suffix, w, vec, heads)                                                     \
	do {                                                                            \
		snprintf(name, sizeof(name), "blk.%d.%s.weight", l, suffix);            \
		if (!rc)                                                                \
			rc = plan_add(p, name, w, vec, c->dim, out, heads);             \
	} while (0)
		ADD("attn_norm", NULL, L->att_norm, 0);
		ADD("attn_q", &L->wq, NULL, perm ? c->n_heads : 0);
		ADD("attn_k", &L->wk, NULL, perm ? c->n_kv_heads : 0);
		ADD("attn_v", &L->wv, NULL, 0);
		ADD("attn_output", &L->wo, NULL, 0);
		ADD("ffn_norm", NULL, L->ffn_norm, 0);
		ADD("ffn_gate", &L->w1, NULL, 0);
		ADD("ffn_up", &L->w3, NULL, 0);
		ADD("ffn_down", &L->w2, NULL, 0);
#undef ADD
	}
	if (!rc)
		rc = plan_add(p, "output_norm.weight", NULL, m->final_norm, c->dim, out, 0);
	/* tied: the loader aliases the classifier to token_embd.weight */
	if (!rc && m->cls.data != m->embed.data)
		rc = plan_add(p, "output.weight", &m->cls, NULL, 0, out, 0);
	uint64_t off = 0;
	for (int i = 0; i < p->n; i++) {
		p->t[i].offset = off;
		off += (p->t[i].nbytes + GGUF_ALIGN - 1) / GGUF_ALIGN * GGUF_ALIGN;
	}
	return rc;
}

/* general.name: the model's file or folder name without its extension. */
static void model_name(const char *path, char *out, size_t cap)
{
	size_t n = strlen(path);
	while (n > 1 && path[n - 1] == '/')
		n--;
	size_t s = n;
	while (s > 0 && path[s - 1] != '/')
		s--;
	size_t len = n - s;
	const char *dot = memrchr(path + s, '.', len);
	if (dot && dot > path + s)
		len = (size_t)(dot - (path + s));
	if (len >= cap)
		len = cap - 1;
	memcpy(out, path + s, len);
	out[len] = '\0';
	if (!*out)
		snprintf(out, cap, "llama");
}

/* Header, KVs and tensor infos, up to the padding before the data. */
static int build_header(struct buf *out, const struct model *m, const struct q_plan *p,
			uint32_t file_type)
{
	const struct model_config *c = &m->cfg;
	const struct tok *tk = m->tok;
	int nv = tok_n_vocab(tk), unk = -1;
	for (int i = 0; i < nv && unk < 0 && tok_kind(tk) == TOK_SPM; i++)
		if (tok_type(tk, i) == TOK_TYPE_UNKNOWN)
			unk = i;
	int bos = tok_bos(tk), eos = tok_eos(tk);
	char name[256];
	model_name(m->path, name, sizeof(name));

	struct buf kvb = { 0 };
	struct buf *b = &kvb;
	uint64_t n = 0;
	kv_str(b, &n, "general.architecture", "llama");
	kv_str(b, &n, "general.name", name);
	kv_u32(b, &n, "general.alignment", GGUF_ALIGN);
	kv_u32(b, &n, "general.file_type", file_type);
	kv_u32(b, &n, "llama.context_length", (uint32_t)c->max_ctx);
	kv_u32(b, &n, "llama.embedding_length", (uint32_t)c->dim);
	kv_u32(b, &n, "llama.block_count", (uint32_t)c->n_layers);
	kv_u32(b, &n, "llama.feed_forward_length", (uint32_t)c->ffn_dim);
	kv_u32(b, &n, "llama.attention.head_count", (uint32_t)c->n_heads);
	kv_u32(b, &n, "llama.attention.head_count_kv", (uint32_t)c->n_kv_heads);
	kv_u32(b, &n, "llama.rope.dimension_count", (uint32_t)c->head_dim);
	if (c->head_dim * c->n_heads != c->dim) {
		kv_u32(b, &n, "llama.attention.key_length", (uint32_t)c->head_dim);
		kv_u32(b, &n, "llama.attention.value_length", (uint32_t)c->head_dim);
	}
	kv_f32(b, &n, "llama.attention.layer_norm_rms_epsilon", c->rms_eps);
	kv_f32(b, &n, "llama.rope.freq_base", c->rope_theta);
	int bpe = tok_kind(tk) == TOK_BPE;
	kv_str(b, &n, "tokenizer.ggml.model", bpe ? "gpt2" : "llama");
	kv_head(b, &n, "tokenizer.ggml.tokens", GV_ARR);
	put_u32(b, GV_STR);
	put_u64(b, (uint64_t)nv);
	for (int i = 0; i < nv; i++) {
		const char *s = tok_piece(tk, i);
		put_str(b, s ? s : "");
	}
	if (!bpe) {
		kv_head(b, &n, "tokenizer.ggml.scores", GV_ARR);
		put_u32(b, GV_F32);
		put_u64(b, (uint64_t)nv);
		for (int i = 0; i < nv; i++)
			put_f32(b, tok_score(tk, i));
	}
	kv_head(b, &n, "tokenizer.ggml.token_type", GV_ARR);
	put_u32(b, GV_I32);
	put_u64(b, (uint64_t)nv);
	for (int i = 0; i < nv; i++)
		put_u32(b, (uint32_t)tok_type(tk, i));
	if (bpe) {
		int nm = tok_n_merges(tk);
		kv_head(b, &n, "tokenizer.ggml.merges", GV_ARR);
		put_u32(b, GV_STR);
		put_u64(b, (uint64_t)nm);
		for (int i = 0; i < nm; i++) {
			const char *s = tok_merge(tk, i);
			put_str(b, s ? s : "");
		}
		const char *pre = tok_pre(tk);
		if (pre)
			kv_str(b, &n, "tokenizer.ggml.pre", pre);
	}
	if (bos >= 0)
		kv_u32(b, &n, "tokenizer.ggml.bos_token_id", (uint32_t)bos);
	if (eos >= 0)
		kv_u32(b, &n, "tokenizer.ggml.eos_token_id", (uint32_t)eos);
	if (!bpe && unk >= 0)
		kv_u32(b, &n, "tokenizer.ggml.unknown_token_id", (uint32_t)unk);
	int eot = bpe ? tok_piece_to_id(tk, "<|eot_id|>") : -1;
	if (eot >= 0)
		kv_u32(b, &n, "tokenizer.ggml.eot_token_id", (uint32_t)eot);
	kv_bool(b, &n, "tokenizer.ggml.add_bos_token", 1);
	if (m->chat_template_text)  /* the model file's, so llamad picks the same template */
		kv_str(b, &n, "tokenizer.chat_template", m->chat_template_text);

	put(out, "GGUF", 4);
	put_u32(out, 3);
	put_u64(out, (uint64_t)p->n);
	put_u64(out, n);
	if (!kvb.oom)
		put(out, kvb.p, kvb.n);
	int oom = kvb.oom;
	free(kvb.p);
	for (int i = 0; i < p->n; i++) {
		const struct q_tensor *t = &p->t[i];
		put_str(out, t->name);
		if (t->w) {
			put_u32(out, 2);
			put_u64(out, (uint64_t)t->w->cols);   /* ne[0]: the row length */
			put_u64(out, (uint64_t)t->w->rows);
		} else {
			put_u32(out, 1);
			put_u64(out, (uint64_t)t->n);
		}
		put_u32(out, ggml_type_of(t->out));
		put_u64(out, t->offset);
	}
	static const uint8_t zero[GGUF_ALIGN];
	put(out, zero, (GGUF_ALIGN - out->n % GGUF_ALIGN) % GGUF_ALIGN);
	return oom || out->oom ? -ENOMEM : 0;
}

/* ---- writing ----------------------------------------------------------------- */

static char q_tmp_path[PATH_MAX + 32];    /* temporary file, or "" */
static volatile sig_atomic_t q_tmp_live;

static void q_on_signal(int sig)
{
	if (q_tmp_live)
		unlink(q_tmp_path);
	signal(sig, SIG_DFL);
	raise(sig);
}

/* Source row r of a matrix (after the RoPE permutation) for output row p. */
static int src_row(const struct q_tensor *t, int p)
{
	if (!t->rope_heads)
		return p;
	int hd = t->w->rows / t->rope_heads, half = hd / 2;
	int h = p / hd, k = p % hd, i = k / 2, j = k % 2;
	return h * hd + i + j * half;
}

/* Write one tensor's data: f rows converted to t->out. 0 or -errno. */
static int write_tensor(FILE *f, const struct q_tensor *t, float *tmp, uint8_t *row_out)
{
	if (!t->w) {
		for (int i = 0; i < t->n; i++) {
			uint8_t x[4];
			uint32_t u;
			memcpy(&u, &t->vec[i], 4);
			for (int k = 0; k < 4; k++)
				x[k] = (uint8_t)(u >> (8 * k));
			if (fwrite(x, 1, 4, f) != 4)
				return -EIO;
		}
		return 0;
	}
	const struct kt_weight *w = t->w;
	size_t K = (size_t)w->cols;
	size_t rb_in = kt_row_bytes(w->dtype, K), rb_out = kt_row_bytes(t->out, K);
	for (int p = 0; p < w->rows; p++) {
		const uint8_t *in = (const uint8_t *)w->data + (size_t)src_row(t, p) * rb_in;
		const void *out = in;
		if (w->dtype != t->out) {
			kt_row_to_f32(w->dtype, in, tmp, K);
			switch (t->out) {
			case KT_Q8_0: kt_quantize_q8_0(tmp, row_out, K); break;
			case KT_Q4_0: kt_quantize_q4_0(tmp, row_out, K); break;
			case KT_Q4_K: kt_quantize_q4_k(tmp, row_out, K); break;
			case KT_Q5_K: kt_quantize_q5_k(tmp, row_out, K); break;
			case KT_Q6_K: kt_quantize_q6_k(tmp, row_out, K); break;
			case KT_F16:
				for (size_t k = 0; k < K; k++) {
					uint16_t h = kt_f32_to_f16(tmp[k]);
					row_out[2 * k] = (uint8_t)h;
					row_out[2 * k + 1] = (uint8_t)(h >> 8);
				}
				break;
			case KT_BF16:   /* not an output type; for completeness */
				for (size_t k = 0; k < K; k++) {
					uint16_t h = kt_f32_to_bf16(tmp[k]);
					row_out[2 * k] = (uint8_t)h;
					row_out[2 * k + 1] = (uint8_t)(h >> 8);
				}
				break;
			case KT_F32:
				for (size_t k = 0; k < K; k++) {
					uint32_t u;
					memcpy(&u, &tmp[k], 4);
					for (int i = 0; i < 4; i++)
						row_out[4 * k + i] = (uint8_t)(u >> (8 * i));
				}
				break;
			}
			out = row_out;
		}
		if (fwrite(out, 1, rb_out, f) != rb_out)
			return -EIO;
	}
	return 0;
}

/* Write the whole file to a temporary beside `path`, then rename it into
 * place. 0, or -1 with a message on stderr naming the file. */
static int write_gguf(const char *path, const struct model *m, const struct q_plan *p,
		      const struct buf *hdr)
{
	int n = snprintf(q_tmp_path, sizeof(q_tmp_path), "%s.tmp.XXXXXX", path);
	if (n < 0 || (size_t)n >= sizeof(q_tmp_path)) {
		fprintf(stderr, "llamad-quantize: %s: path too long\n", path);
		return -1;
	}
	int fd = mkstemp(q_tmp_path);
	if (fd < 0) {
		fprintf(stderr, "llamad-quantize: %s: cannot create %s: %s\n", path, q_tmp_path,
			strerror(errno));
		return -1;
	}
	q_tmp_live = 1;
	/* mkstemp makes 0600: give the file the usual 0666 & ~umask */
	mode_t um = umask(0);
	umask(um);
	if (fchmod(fd, 0666 & ~um) != 0) {
		fprintf(stderr, "llamad-quantize: %s: chmod %s: %s\n", path, q_tmp_path,
			strerror(errno));
		close(fd);
		goto fail;
	}
	FILE *f = fdopen(fd, "wb");
	if (!f) {
		fprintf(stderr, "llamad-quantize: %s: %s: %s\n", path, q_tmp_path, strerror(errno));
		close(fd);
		goto fail;
	}
	/* scratch for one row: the widest input is an fp32 row */
	int maxc = m->cfg.dim > m->cfg.ffn_dim ? m->cfg.dim : m->cfg.ffn_dim;
	for (int i = 0; i < p->n; i++)
		if (p->t[i].w && p->t[i].w->cols > maxc)
			maxc = p->t[i].w->cols;
	float *tmp = malloc((size_t)maxc * sizeof(float));
	uint8_t *row = malloc((size_t)maxc * sizeof(float));
	const char *step = NULL;
	int err = 0;
	if (!tmp || !row) {
		step = "out of memory writing";
		err = 0;
	} else if (fwrite(hdr->p, 1, hdr->n, f) != hdr->n) {
		step = "cannot write";
		err = errno;
	}
	static const uint8_t zero[GGUF_ALIGN];
	uint64_t at = 0;   /* bytes of the data section written */
	for (int i = 0; i < p->n && !step; i++) {
		const struct q_tensor *t = &p->t[i];
		if (fwrite(zero, 1, t->offset - at, f) != t->offset - at ||
		    write_tensor(f, t, tmp, row) != 0) {
			step = "cannot write";
			err = errno;
			break;
		}
		at = t->offset + t->nbytes;
	}
	if (!step && fwrite(zero, 1, (GGUF_ALIGN - at % GGUF_ALIGN) % GGUF_ALIGN, f) !=
			     (GGUF_ALIGN - at % GGUF_ALIGN) % GGUF_ALIGN) {
		step = "cannot write";
		err = errno;
	}
	free(tmp);
	free(row);
	if (!step && fflush(f) != 0) {
		step = "cannot write";
		err = errno;
	}
	if (!step && fsync(fileno(f)) != 0) {
		step = "cannot fsync";
		err = errno;
	}
	if (fclose(f) != 0 && !step) {
		step = "cannot close";
		err = errno;
	}
	if (step) {
		fprintf(stderr, "llamad-quantize: %s: %s %s%s%s\n", path, step, q_tmp_path,
			err ? ": " : "", err ? strerror(err) : "");
		goto fail;
	}
	if (rename(q_tmp_path, path) != 0) {
		fprintf(stderr, "llamad-quantize: %s: cannot rename %s into place: %s\n", path,
			q_tmp_path, strerror(errno));
		goto fail;
	}
	q_tmp_live = 0;
	return 0;
fail:
	unlink(q_tmp_path);
	q_tmp_live = 0;
	return -1;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: llamad-quantize --model PATH [--tokenizer PATH]\n"
		"                       --type q8_0|q4_0|q4_k|q5_k|q6_k|f16|f32 --out FILE.gguf\n"
		"\n"
		"Write the model at PATH (anything llamad loads) as a GGUF v3 file:\n"
		"matrices (embedding and output included; no output when tied to the\n"
		"embedding) in --type, norms and RoPE scaling factors in f32, the\n"
		"tokenizer (SentencePiece \"llama\" or BPE \"gpt2\") in the\n"
		"metadata. Matrices whose rows are not whole\n"
		"32-weight blocks stay f16 for q8_0/q4_0; for q4_k/q5_k/q6_k rows\n"
		"that are not whole 256-weight super-blocks are written q8_0 (f16\n"
		"if not whole 32-weight blocks either).\n"
		"\n"
		"Exit status: 0 ok, 1 load or I/O error, 2 usage error.\n");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "tokenizer", required_argument, NULL, 't' },
		{ "type", required_argument, NULL, 'q' },
		{ "out", required_argument, NULL, 'o' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *model = NULL, *tokenizer = NULL, *type = NULL, *out = NULL;
	int c;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'm': model = optarg; break;
		case 't': tokenizer = optarg; break;
		case 'q': type = optarg; break;
		case 'o': out = optarg; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind < argc || !model || !type || !out) {
		fprintf(stderr, "llamad-quantize: --model, --type and --out are required\n");
		usage(stderr);
		return 2;
	}
	int qi = -1;
	for (size_t i = 0; i < sizeof(q_types) / sizeof(q_types[0]); i++)
		if (strcmp(type, q_types[i].flag) == 0)
			qi = (int)i;
	if (qi < 0) {
		fprintf(stderr, "llamad-quantize: unknown --type '%s' (q8_0, q4_0, q4_k, q5_k, q6_k, f16, "
			"f32)\n",
			type);
		return 2;
	}

	char *cause = NULL;
	struct model *m = model_load(model, tokenizer, &cause);
	if (!m) {
		fprintf(stderr, "llamad-quantize: %s\n", cause ? cause : model);
		free(cause);
		return 1;
	}
	signal(SIGINT, q_on_signal);
	signal(SIGTERM, q_on_signal);
	signal(SIGHUP, q_on_signal);

	struct q_plan plan = { 0 };
	struct buf hdr = { 0 };
	int rc = build_plan(&plan, m, q_types[qi].dt);
	if (!rc)
		rc = build_header(&hdr, m, &plan, q_types[qi].file_type);
	if (rc) {
		fprintf(stderr, "llamad-quantize: %s: out of memory\n", out);
		rc = 1;
	} else {
		rc = write_gguf(out, m, &plan, &hdr) ? 1 : 0;
	}
	if (!rc) {
		uint64_t bytes = hdr.n;
		int fallback = 0;
		for (int i = 0; i < plan.n; i++) {
			bytes += (plan.t[i].nbytes + GGUF_ALIGN - 1) / GGUF_ALIGN * GGUF_ALIGN;
			fallback += plan.t[i].w && plan.t[i].out != q_types[qi].dt;
		}
		printf("llamad-quantize: wrote %s: %d tensors, %s matrices, %.2f MiB", out, plan.n,
		       q_types[qi].flag, (double)bytes / (1 << 20));
		if (fallback)
			printf(" (%d with rows of partial blocks left q8_0 or f16)", fallback);
		printf("\n");
	}
	free(hdr.p);
	free(plan.t);
	model_free(m);
	return rc;
}

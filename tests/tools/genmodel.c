/*
 * tests/tools/genmodel.c — llamad-genmodel: write a random-weight Llama model
 * as a Hugging Face folder (config.json, tokenizer_config.json,
 * model.safetensors or sharded model-0000k-of-0000N.safetensors plus
 * model.safetensors.index.json, and the tokenizer), so engine speed can be
 * measured at realistic sizes without real weights, and tests get a model
 * of a given family.
 *
 *   llamad-genmodel --shape NAME --out DIR [--dtype f32|f16|bf16]
 *                   [--layers N] [--seed S] [--tokenizer PATH] [--shards N]
 *
 * Values: every tensor gets its own splitmix64 stream seeded from (seed,
 * tensor name), so a tensor's values depend only on --seed and its name: not
 * on --dtype (f16/bf16 are the f32 values rounded to nearest even), --shards
 * or --layers. Matrices are uniform in [-1/sqrt(fan_in), 1/sqrt(fan_in)) with
 * fan_in = the number of columns (the input features; dim for the embedding
 * and lm_head); norm weights are 1 + uniform [-0.02, 0.02).
 *
 * Families: Llama 1/2 shapes get a SentencePiece tokenizer.model (copied
 * from --tokenizer) and a generated LlamaTokenizer tokenizer_config.json.
 * Llama 3 shapes (llama3-*) are written as Meta ships Llama 3.2: head_dim in
 * config.json, tie_word_embeddings true (no lm_head.weight tensor),
 * rope_theta 500000 with rope_scaling {rope_type "llama3", factor 32,
 * low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings
 * 8192}, max_position_embeddings 131072, bos 128000 / eos 128001, and a
 * generation_config.json whose eos_token_id is [128001, 128008, 128009].
 * Whatever the shape, a --tokenizer ending in .json is a Hugging Face
 * tokenizer.json: it is copied with the tokenizer_config.json beside it
 * (which must exist); any other path is copied as tokenizer.model.
 *
 * Tensors are generated and written in chunks of CHUNK_ELEMS, so memory use
 * is a few MiB whatever the model size. Every file is written to DIR/.NAME.tmp
 * and renamed into place after fflush + fsync + fclose succeed; on an error
 * the temporary file is removed. config.json is written last (after the
 * weights and the index) and removed first, so a folder that has one is
 * complete.
 *
 * Exit status: 0 on success, 1 on an I/O error (the message names the file),
 * 2 on a usage error.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <libgen.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kernels/backend.h"

#define CHUNK_ELEMS (1u << 20)          /* elements generated per fwrite */
#define PROGRESS_MIN_BYTES (512ull << 20) /* no progress lines below this */
#define NORM_NOISE 0.02f

enum gm_family { GM_LLAMA2, GM_LLAMA3 };

struct gm_shape {
	const char *name;
	int dim;
	int n_layers;
	int n_heads;
	int n_kv_heads;
	int ffn;
	int vocab;
	int max_pos;
	int head_dim;          /* 0: dim / n_heads */
	enum gm_family family; /* GM_LLAMA3: tied, llama3 RoPE scaling, BPE */
};

static const struct gm_shape gm_shapes[] = {
	/* name          dim  layers heads kv  ffn    vocab  max_pos hd */
	{ "stories260K",   64,  5,  8,  4,   172,   512,  512, 0, GM_LLAMA2 },
	{ "stories15M",   288,  6,  6,  6,   768, 32000,  256, 0, GM_LLAMA2 },
	{ "stories110M",  768, 12, 12, 12,  2048, 32000, 1024, 0, GM_LLAMA2 },
	{ "7B",          4096, 32, 32, 32, 11008, 32000, 4096, 0, GM_LLAMA2 },
	{ "tiny-gqa",     128,  2,  8,  2,   256, 32000,  512, 0, GM_LLAMA2 },
	/* Llama 3: GQA 4:1, 128256 tokens, 128k context */
	{ "llama3-tiny",   64,  2,  4,  1,   128, 128256, 131072, 16, GM_LLAMA3 },
	{ "llama3-1B",   2048, 16, 32,  8,  8192, 128256, 131072, 64, GM_LLAMA3 },
};

/* Llama 3.2's RoPE (config.json rope_theta and rope_scaling) and special
 * token ids */
#define GM_L3_THETA 500000.0
#define GM_L3_FACTOR 32.0
#define GM_L3_LOW 1.0
#define GM_L3_HIGH 4.0
#define GM_L3_ORIG 8192
#define GM_L3_BOS 128000
#define GM_L3_EOS 128001
static const int gm_l3_eos_list[] = { 128001, 128008, 128009 };

static int gm_head_dim(const struct gm_shape *s)
{
	return s->head_dim ? s->head_dim : s->dim / s->n_heads;
}
#define N_SHAPES (sizeof(gm_shapes) / sizeof(gm_shapes[0]))

enum gm_dtype { GM_F32, GM_F16, GM_BF16 };

static const struct {
	const char *flag;  /* --dtype value */
	const char *st;    /* safetensors dtype */
	const char *torch; /* config.json torch_dtype */
	size_t size;
} gm_dtypes[] = {
	[GM_F32] = { "f32", "F32", "float32", 4 },
	[GM_F16] = { "f16", "F16", "float16", 2 },
	[GM_BF16] = { "bf16", "BF16", "bfloat16", 2 },
};

struct gm_tensor {
	char name[96];
	int64_t rows;     /* shape[0] */
	int64_t cols;     /* shape[1]; 0 for a 1-D tensor of `rows` elements */
	int is_norm;
	int shard;        /* 0-based file index */
	uint64_t begin;   /* data_offsets within its file's data section */
	uint64_t nbytes;
};

struct gm_opts {
	struct gm_shape shape; /* n_layers already overridden by --layers */
	enum gm_dtype dtype;
	uint64_t seed;
	int n_shards;
	const char *out_dir;
	char *tokenizer;       /* malloc'd path */
	int tok_json;          /* tokenizer is a tokenizer.json (BPE) */
};

/* ---- progress and cleanup state (one writer, so globals are fine) ------ */

static uint64_t gm_total_bytes;
static uint64_t gm_done_bytes;
static int gm_last_pct = -1;
static struct timespec gm_t0;
static char gm_tmp_path[4096];          /* temp file being written, or "" */
static volatile sig_atomic_t gm_tmp_live;

static double gm_elapsed(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)(t.tv_sec - gm_t0.tv_sec) +
	       (double)(t.tv_nsec - gm_t0.tv_nsec) * 1e-9;
}

static void gm_on_signal(int sig)
{
	if (gm_tmp_live)
		unlink(gm_tmp_path);
	signal(sig, SIG_DFL);
	raise(sig);
}

static void gm_progress(const char *what)
{
	int pct;

	if (gm_total_bytes < PROGRESS_MIN_BYTES)
		return;
	pct = (int)(gm_done_bytes * 100 / gm_total_bytes);
	if (pct / 5 == gm_last_pct / 5 && gm_last_pct >= 0)
		return;
	gm_last_pct = pct;
	fprintf(stderr, "llamad-genmodel: %3d%%  %8.1f MiB  %6.1f s  %s\n", pct,
		(double)gm_done_bytes / (1 << 20), gm_elapsed(), what);
}

/* ---- numbers -------------------------------------------------------------- */

static uint64_t gm_splitmix64(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t gm_fnv1a64(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (; *s; s++) {
		h ^= (unsigned char)*s;
		h *= 0x100000001b3ull;
	}
	return h;
}

/* Uniform in [-1, 1) with 24 bits of resolution (exact in f32). */
static float gm_uniform(uint64_t *state)
{
	uint64_t z = gm_splitmix64(state);

	return (float)((int32_t)(z >> 40) - (1 << 23)) * 0x1p-23f;
}

static void gm_put_le16(unsigned char *p, uint16_t v)
{
	p[0] = (unsigned char)v;
	p[1] = (unsigned char)(v >> 8);
}

static void gm_put_le32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

/* ---- files ---------------------------------------------------------------- */

static char *gm_join(const char *dir, const char *name)
{
	char *p;

	if (asprintf(&p, "%s/%s", dir, name) < 0)
		return NULL;
	return p;
}

/* mkdir -p. Returns 0 or a negative errno. */
static int gm_mkdirs(const char *path)
{
	char buf[4096];
	size_t n = strlen(path);

	if (n == 0 || n >= sizeof(buf))
		return -ENAMETOOLONG;
	memcpy(buf, path, n + 1);
	for (size_t i = 1; i <= n; i++) {
		if (buf[i] != '/' && buf[i] != '\0')
			continue;
		char c = buf[i];

		buf[i] = '\0';
		if (mkdir(buf, 0777) < 0 && errno != EEXIST)
			return -errno;
		buf[i] = c;
	}
	struct stat st;

	if (stat(path, &st) < 0)
		return -errno;
	if (!S_ISDIR(st.st_mode))
		return -ENOTDIR;
	return 0;
}

/* An output file being written: DIR/.NAME.tmp, renamed to DIR/NAME. */
struct gm_out {
	FILE *f;
	char *final_path;
	char *tmp_path;
};

/* Open DIR/.NAME.tmp for writing. Returns 0 or a negative errno; on error
 * prints a message naming the file. */
static int gm_out_open(struct gm_out *o, const char *dir, const char *name)
{
	char tmp_name[512];

	memset(o, 0, sizeof(*o));
	snprintf(tmp_name, sizeof(tmp_name), ".%s.tmp", name);
	o->final_path = gm_join(dir, name);
	o->tmp_path = gm_join(dir, tmp_name);
	if (!o->final_path || !o->tmp_path ||
	    strlen(o->tmp_path) >= sizeof(gm_tmp_path)) {
		fprintf(stderr, "llamad-genmodel: %s/%s: %s\n", dir, name,
			strerror(ENOMEM));
		return -ENOMEM;
	}
	memcpy(gm_tmp_path, o->tmp_path, strlen(o->tmp_path) + 1);
	gm_tmp_live = 1;
	o->f = fopen(o->tmp_path, "wb");
	if (!o->f) {
		int err = errno;

		gm_tmp_live = 0;
		fprintf(stderr, "llamad-genmodel: %s: %s\n", o->tmp_path,
			strerror(err));
		return -err;
	}
	return 0;
}

/* Write n bytes. Returns 0 or a negative errno (message printed). */
static int gm_out_write(struct gm_out *o, const void *p, size_t n)
{
	if (n == 0)
		return 0;
	errno = 0;
	if (fwrite(p, 1, n, o->f) != n) {
		int err = errno ? errno : EIO;

		fprintf(stderr, "llamad-genmodel: %s: write: %s\n",
			o->tmp_path, strerror(err));
		return -err;
	}
	return 0;
}

/* Finish the file: on ok, flush, fsync, close and rename it into place
 * (returns 0 or a negative errno, message printed); otherwise (or when any
 * of those fail) close and unlink the temporary file. Frees the paths. */
static int gm_out_close(struct gm_out *o, int ok)
{
	int err = 0;
	const char *step = NULL;

	if (o->f) {
		if (ok) {
			if (fflush(o->f) != 0 || ferror(o->f)) {
				err = errno ? errno : EIO;
				step = "write";
			} else if (fsync(fileno(o->f)) < 0) {
				err = errno;
				step = "fsync";
			}
		}
		if (fclose(o->f) != 0 && ok && !err) {
			err = errno;
			step = "close";
		}
		o->f = NULL;
		if (ok && !err && rename(o->tmp_path, o->final_path) < 0) {
			err = errno;
			step = "rename";
		}
		if (!ok || err) {
			unlink(o->tmp_path);
		}
		gm_tmp_live = 0;
		if (err)
			fprintf(stderr, "llamad-genmodel: %s: %s: %s\n",
				step[0] == 'r' ? o->final_path : o->tmp_path,
				step, strerror(err));
	}
	free(o->final_path);
	free(o->tmp_path);
	o->final_path = o->tmp_path = NULL;
	return -err;
}

/* Dump a jansson value as DIR/NAME (2-space indent, trailing newline).
 * Takes ownership of obj. Returns 0 or a negative errno (message printed). */
static int gm_write_json(const char *dir, const char *name, json_t *obj)
{
	struct gm_out o;
	int ret;

	if (!obj) {
		fprintf(stderr, "llamad-genmodel: %s/%s: %s\n", dir, name,
			strerror(ENOMEM));
		return -ENOMEM;
	}
	ret = gm_out_open(&o, dir, name);
	if (ret == 0) {
		errno = 0;
		if (json_dumpf(obj, o.f, JSON_INDENT(2) |
			       JSON_REAL_PRECISION(15)) != 0) {
			ret = errno ? -errno : -EIO;
			fprintf(stderr, "llamad-genmodel: %s: write: %s\n",
				o.tmp_path, strerror(-ret));
		} else {
			ret = gm_out_write(&o, "\n", 1);
		}
		int ret2 = gm_out_close(&o, ret == 0);

		if (ret == 0)
			ret = ret2;
	} else {
		gm_out_close(&o, 0);
	}
	json_decref(obj);
	return ret;
}

/* Copy the file at src to DIR/name. Returns 0 or a negative errno (message
 * printed, naming the file that failed). */
static int gm_copy_file(const char *src, const char *dir, const char *name)
{
	struct gm_out o;
	FILE *in;
	char *buf;
	size_t n;
	int ret;

	in = fopen(src, "rb");
	if (!in) {
		ret = -errno;
		fprintf(stderr, "llamad-genmodel: tokenizer %s: %s\n", src,
			strerror(-ret));
		return ret;
	}
	buf = malloc(1 << 20);
	if (!buf) {
		fclose(in);
		fprintf(stderr, "llamad-genmodel: %s\n", strerror(ENOMEM));
		return -ENOMEM;
	}
	ret = gm_out_open(&o, dir, name);
	while (ret == 0 && (n = fread(buf, 1, 1 << 20, in)) > 0)
		ret = gm_out_write(&o, buf, n);
	if (ret == 0 && ferror(in)) {
		ret = -EIO;
		fprintf(stderr, "llamad-genmodel: tokenizer %s: read error\n",
			src);
	}
	if (ret == 0)
		ret = gm_out_close(&o, 1);
	else
		gm_out_close(&o, 0);
	free(buf);
	fclose(in);
	return ret;
}

/* ---- the model -------------------------------------------------------------- */

/* Fill the tensor table for shape s (names and shapes as in HF
 * LlamaForCausalLM; order: embedding, layers, final norm, lm_head unless the
 * family ties it to the embedding) and assign
 * each tensor to one of n_shards files by contiguous ranges of units (unit 0
 * = embedding, units 1..L = layers, unit L+1 = norm + lm_head). Requires
 * 1 <= n_shards <= L + 2. Returns the number of tensors, or -ENOMEM. Sets
 * *out to a malloc'd array. */
static int gm_build_tensors(const struct gm_shape *s, enum gm_dtype dt,
			    int n_shards, struct gm_tensor **out)
{
	int tied = s->family == GM_LLAMA3;
	int L = s->n_layers, n = 1 + 9 * L + 2 - tied, k = 0;
	int hd = gm_head_dim(s);
	int64_t q_out = (int64_t)s->n_heads * hd, kv_out = (int64_t)s->n_kv_heads * hd;
	struct gm_tensor *t = calloc((size_t)n, sizeof(*t));

	if (!t)
		return -ENOMEM;
#define GM_ADD(unit_, norm_, r_, c_, ...)                                   \
	do {                                                                \
		snprintf(t[k].name, sizeof(t[k].name), __VA_ARGS__);       \
		t[k].rows = (r_);                                           \
		t[k].cols = (c_);                                           \
		t[k].is_norm = (norm_);                                     \
		t[k].shard = (int)((int64_t)(unit_) * n_shards / (L + 2));  \
		t[k].nbytes = (uint64_t)(r_) * (uint64_t)((c_) ? (c_) : 1) * \
			      gm_dtypes[dt].size;                           \
		k++;                                                        \
	} while (0)

	GM_ADD(0, 0, s->vocab, s->dim, "model.embed_tokens.weight");
	for (int i = 0; i < L; i++) {
		int u = i + 1;

		GM_ADD(u, 1, s->dim, 0, "model.layers.%d.input_layernorm.weight", i);
		GM_ADD(u, 0, q_out, s->dim, "model.layers.%d.self_attn.q_proj.weight", i);
		GM_ADD(u, 0, kv_out, s->dim, "model.layers.%d.self_attn.k_proj.weight", i);
		GM_ADD(u, 0, kv_out, s->dim, "model.layers.%d.self_attn.v_proj.weight", i);
		GM_ADD(u, 0, s->dim, q_out, "model.layers.%d.self_attn.o_proj.weight", i);
		GM_ADD(u, 1, s->dim, 0, "model.layers.%d.post_attention_layernorm.weight", i);
		GM_ADD(u, 0, s->ffn, s->dim, "model.layers.%d.mlp.gate_proj.weight", i);
		GM_ADD(u, 0, s->ffn, s->dim, "model.layers.%d.mlp.up_proj.weight", i);
		GM_ADD(u, 0, s->dim, s->ffn, "model.layers.%d.mlp.down_proj.weight", i);
	}
	GM_ADD(L + 1, 1, s->dim, 0, "model.norm.weight");
	if (!tied)
		GM_ADD(L + 1, 0, s->vocab, s->dim, "lm_head.weight");
#undef GM_ADD
	*out = t;
	return k;
}

/* Generate tensor t's values chunk by chunk and append them to o.
 * buf holds CHUNK_ELEMS f32 values; bytes holds CHUNK_ELEMS * 4 bytes. */
static int gm_write_tensor(struct gm_out *o, const struct gm_tensor *t,
			   enum gm_dtype dt, uint64_t seed, float *buf,
			   unsigned char *bytes)
{
	uint64_t state = seed ^ gm_fnv1a64(t->name);
	uint64_t n = (uint64_t)t->rows * (uint64_t)(t->cols ? t->cols : 1);
	float scale = t->is_norm ? NORM_NOISE : 1.0f / sqrtf((float)t->cols);
	float bias = t->is_norm ? 1.0f : 0.0f;
	size_t esz = gm_dtypes[dt].size;

	gm_splitmix64(&state); /* decorrelate nearby seeds */
	for (uint64_t done = 0; done < n;) {
		size_t m = n - done < CHUNK_ELEMS ? (size_t)(n - done) : CHUNK_ELEMS;
		int ret;

		for (size_t i = 0; i < m; i++)
			buf[i] = bias + scale * gm_uniform(&state);
		for (size_t i = 0; i < m; i++) {
			uint32_t u;

			switch (dt) {
			case GM_F32:
				memcpy(&u, &buf[i], sizeof(u));
				gm_put_le32(bytes + 4 * i, u);
				break;
			case GM_F16:
				gm_put_le16(bytes + 2 * i, kt_f32_to_f16(buf[i]));
				break;
			case GM_BF16:
				gm_put_le16(bytes + 2 * i, kt_f32_to_bf16(buf[i]));
				break;
			}
		}
		ret = gm_out_write(o, bytes, m * esz);
		if (ret < 0)
			return ret;
		done += m;
		gm_done_bytes += m * esz;
		gm_progress(t->name);
	}
	return 0;
}

/* Write the safetensors file `name` holding the tensors of shard `shard`
 * (offsets in t[] are filled here). Returns 0 or a negative errno (message
 * printed). */
static int gm_write_safetensors(const char *dir, const char *name,
				struct gm_tensor *t, int n_tensors, int shard,
				enum gm_dtype dt, uint64_t seed, float *buf,
				unsigned char *bytes)
{
	json_t *hdr = json_object(), *meta = json_object();
	char *text = NULL;
	struct gm_out o;
	uint64_t off = 0;
	int ret = -ENOMEM;

	if (!hdr || !meta)
		goto oom;
	if (json_object_set_new(meta, "format", json_string("pt")) ||
	    json_object_set_new(hdr, "__metadata__", meta))
		goto oom;
	meta = NULL;
	for (int i = 0; i < n_tensors; i++) {
		json_t *e, *shape, *offs;

		if (t[i].shard != shard)
			continue;
		t[i].begin = off;
		off += t[i].nbytes;
		shape = t[i].cols ? json_pack("[II]", (json_int_t)t[i].rows,
					      (json_int_t)t[i].cols)
				  : json_pack("[I]", (json_int_t)t[i].rows);
		offs = json_pack("[II]", (json_int_t)t[i].begin, (json_int_t)off);
		e = json_pack("{s:s, s:o, s:o}", "dtype", gm_dtypes[dt].st,
			      "shape", shape, "data_offsets", offs);
		if (!e || json_object_set_new(hdr, t[i].name, e))
			goto oom;
	}
	text = json_dumps(hdr, JSON_COMPACT);
	if (!text)
		goto oom;

	size_t hlen = strlen(text), padded = (hlen + 7) & ~(size_t)7;
	unsigned char len8[8];

	for (int i = 0; i < 8; i++)
		len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
	ret = gm_out_open(&o, dir, name);
	if (ret == 0)
		ret = gm_out_write(&o, len8, 8);
	if (ret == 0)
		ret = gm_out_write(&o, text, hlen);
	if (ret == 0)
		ret = gm_out_write(&o, "        ", padded - hlen);
	for (int i = 0; i < n_tensors && ret == 0; i++)
		if (t[i].shard == shard)
			ret = gm_write_tensor(&o, &t[i], dt, seed, buf, bytes);
	if (ret == 0)
		ret = gm_out_close(&o, 1);
	else
		gm_out_close(&o, 0);
	free(text);
	json_decref(hdr);
	return ret;
oom:
	fprintf(stderr, "llamad-genmodel: %s/%s: %s\n", dir, name,
		strerror(ENOMEM));
	json_decref(meta);
	json_decref(hdr);
	return -ENOMEM;
}

static json_t *gm_config_json(const struct gm_opts *op)
{
	const struct gm_shape *s = &op->shape;
	json_t *c;

	c = json_pack(
		"{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i,"
		" s:f, s:f, s:n, s:s, s:b, s:b, s:b, s:i, s:i, s:s, s:f,"
		" s:i, s:b}",
		"architectures", "LlamaForCausalLM",
		"model_type", "llama",
		"hidden_size", s->dim,
		"intermediate_size", s->ffn,
		"num_hidden_layers", s->n_layers,
		"num_attention_heads", s->n_heads,
		"num_key_value_heads", s->n_kv_heads,
		"head_dim", gm_head_dim(s),
		"vocab_size", s->vocab,
		"max_position_embeddings", s->max_pos,
		"rms_norm_eps", 1e-5,
		"rope_theta", 10000.0,
		"rope_scaling",
		"hidden_act", "silu",
		"tie_word_embeddings", 0,
		"attention_bias", 0,
		"mlp_bias", 0,
		"bos_token_id", 1,
		"eos_token_id", 2,
		"torch_dtype", gm_dtypes[op->dtype].torch,
		"initializer_range", 0.02,
		"pretraining_tp", 1,
		"use_cache", 1);
	if (c && s->family == GM_LLAMA3) {
		json_t *rs = json_pack("{s:f, s:f, s:f, s:i, s:s}",
				       "factor", GM_L3_FACTOR,
				       "low_freq_factor", GM_L3_LOW,
				       "high_freq_factor", GM_L3_HIGH,
				       "original_max_position_embeddings", GM_L3_ORIG,
				       "rope_type", "llama3");

		if (!rs || json_object_set_new(c, "rope_scaling", rs) ||
		    json_object_set_new(c, "rope_theta", json_real(GM_L3_THETA)) ||
		    json_object_set_new(c, "tie_word_embeddings", json_true()) ||
		    json_object_set_new(c, "bos_token_id", json_integer(GM_L3_BOS)) ||
		    json_object_set_new(c, "eos_token_id", json_integer(GM_L3_EOS))) {
			json_decref(c);
			return NULL;
		}
	}
	return c;
}

/* generation_config.json of a Llama 3 shape: the end-of-turn ids as Meta
 * ships them (<|end_of_text|>, <|eom_id|>, <|eot_id|>). */
static json_t *gm_generation_config_json(void)
{
	json_t *eos = json_array();

	for (size_t i = 0; eos && i < sizeof(gm_l3_eos_list) / sizeof(gm_l3_eos_list[0]); i++)
		if (json_array_append_new(eos, json_integer(gm_l3_eos_list[i]))) {
			json_decref(eos);
			return NULL;
		}
	return eos ? json_pack("{s:i, s:o, s:b, s:f, s:f}", "bos_token_id", GM_L3_BOS,
			       "eos_token_id", eos, "do_sample", 1, "temperature", 0.6,
			       "top_p", 0.9)
		   : NULL;
}

static json_t *gm_tokenizer_config_json(const struct gm_opts *op)
{
	return json_pack("{s:s, s:s, s:s, s:s, s:b, s:b, s:i}",
			 "tokenizer_class", "LlamaTokenizer",
			 "bos_token", "<s>",
			 "eos_token", "</s>",
			 "unk_token", "<unk>",
			 "add_bos_token", 1,
			 "add_eos_token", 0,
			 "model_max_length", op->shape.max_pos);
}

/* Remove DIR/name if present: a file from an earlier run that would not
 * match what is written now. Says so on stderr when verbose. */
static void gm_remove_stale(const char *dir, const char *name, int verbose)
{
	char *p = gm_join(dir, name);

	if (p && unlink(p) == 0 && verbose)
		fprintf(stderr, "llamad-genmodel: removed stale %s\n", p);
	free(p);
}

/* Write the weights: one model.safetensors, or op->n_shards files and then
 * model.safetensors.index.json. Returns 0 or a negative errno (message
 * printed). */
static int gm_write_weights(const struct gm_opts *op, struct gm_tensor *t,
			    int n, uint64_t total, float *buf,
			    unsigned char *bytes)
{
	json_t *map, *index;
	int ret = 0;

	if (op->n_shards == 1)
		return gm_write_safetensors(op->out_dir, "model.safetensors", t, n,
					    0, op->dtype, op->seed, buf, bytes);
	map = json_object();
	for (int k = 0; k < op->n_shards && ret == 0; k++) {
		char name[64];

		snprintf(name, sizeof(name), "model-%05d-of-%05d.safetensors",
			 k + 1, op->n_shards);
		ret = gm_write_safetensors(op->out_dir, name, t, n, k, op->dtype,
					   op->seed, buf, bytes);
		for (int i = 0; i < n && ret == 0 && map; i++)
			if (t[i].shard == k &&
			    json_object_set_new(map, t[i].name, json_string(name)))
				ret = -ENOMEM;
	}
	if (ret == 0) {
		/* total_size: the sum of the tensors' data bytes, as HF writes it */
		index = map ? json_pack("{s:{s:I}, s:O}", "metadata", "total_size",
					(json_int_t)total, "weight_map", map)
			    : NULL;
		ret = gm_write_json(op->out_dir, "model.safetensors.index.json",
				    index);
	}
	json_decref(map);
	return ret;
}

/* The tokenizer files: tokenizer.model and a generated
 * tokenizer_config.json, or tokenizer.json and the tokenizer_config.json
 * beside it (a tokenizer of the other kind left by an earlier run is
 * removed, since the loader prefers tokenizer.model). Returns 0 or a
 * negative errno (message printed). */
static int gm_write_tokenizer(const struct gm_opts *op)
{
	if (!op->tok_json) {
		int ret = gm_copy_file(op->tokenizer, op->out_dir, "tokenizer.model");

		gm_remove_stale(op->out_dir, "tokenizer.json", 1);
		if (ret == 0)
			ret = gm_write_json(op->out_dir, "tokenizer_config.json",
					    gm_tokenizer_config_json(op));
		return ret;
	}
	char *dup = strdup(op->tokenizer), *cfg = NULL;
	int ret = -ENOMEM;

	if (dup && asprintf(&cfg, "%s/tokenizer_config.json", dirname(dup)) >= 0) {
		ret = gm_copy_file(op->tokenizer, op->out_dir, "tokenizer.json");
		if (ret == 0)
			ret = gm_copy_file(cfg, op->out_dir, "tokenizer_config.json");
	} else {
		cfg = NULL;
		fprintf(stderr, "llamad-genmodel: %s\n", strerror(ENOMEM));
	}
	if (ret == 0)
		gm_remove_stale(op->out_dir, "tokenizer.model", 1);
	free(cfg);
	free(dup);
	return ret;
}

/* Write the whole folder. Order: stale config.json / index / other-layout
 * weights removed; the tokenizer files (fails fast on a bad tokenizer path);
 * generation_config.json (Llama 3 shapes); weights; index; config.json last,
 * so a folder with a config.json is complete and a failed run leaves none.
 * Returns 0 or a negative errno (message printed). */
static int gm_generate(struct gm_opts *op)
{
	struct gm_tensor *t = NULL;
	float *buf = NULL;
	unsigned char *bytes = NULL;
	int n, ret;
	uint64_t total = 0;

	ret = gm_mkdirs(op->out_dir);
	if (ret < 0) {
		fprintf(stderr, "llamad-genmodel: %s: %s\n", op->out_dir,
			strerror(-ret));
		return ret;
	}
	n = gm_build_tensors(&op->shape, op->dtype, op->n_shards, &t);
	buf = malloc(CHUNK_ELEMS * sizeof(float));
	bytes = malloc(CHUNK_ELEMS * 4);
	if (n < 0 || !buf || !bytes) {
		fprintf(stderr, "llamad-genmodel: %s\n", strerror(ENOMEM));
		ret = -ENOMEM;
		goto out;
	}
	for (int i = 0; i < n; i++)
		total += t[i].nbytes;
	gm_total_bytes = total;
	clock_gettime(CLOCK_MONOTONIC, &gm_t0);

	gm_remove_stale(op->out_dir, "config.json", 0);
	gm_remove_stale(op->out_dir, "model.safetensors.index.json", 0);
	if (op->n_shards > 1)
		gm_remove_stale(op->out_dir, "model.safetensors", 1);
	ret = gm_write_tokenizer(op);
	if (ret == 0 && op->shape.family == GM_LLAMA3)
		ret = gm_write_json(op->out_dir, "generation_config.json",
				    gm_generation_config_json());
	else if (ret == 0)
		gm_remove_stale(op->out_dir, "generation_config.json", 1);
	if (ret == 0)
		ret = gm_write_weights(op, t, n, total, buf, bytes);
	if (ret == 0)
		ret = gm_write_json(op->out_dir, "config.json", gm_config_json(op));
out:
	if (ret == 0)
		fprintf(stderr,
			"llamad-genmodel: wrote %s: %s %s, %d layers, %d tensors, "
			"%" PRIu64 " bytes of weights in %d file%s, %.1f s\n",
			op->out_dir, op->shape.name, gm_dtypes[op->dtype].flag,
			op->shape.n_layers, n, total, op->n_shards,
			op->n_shards == 1 ? "" : "s", gm_elapsed());
	free(t);
	free(buf);
	free(bytes);
	return ret;
}

/* ---- command line ------------------------------------------------------------ */

static void gm_usage(FILE *f)
{
	fprintf(f,
		"usage: llamad-genmodel --shape NAME --out DIR [options]\n"
		"\n"
		"Write a random-weight Llama model as a Hugging Face folder:\n"
		"DIR/config.json, tokenizer_config.json, tokenizer.model (or\n"
		"tokenizer.json) and model.safetensors (or\n"
		"model-0000k-of-0000N.safetensors plus model.safetensors.index.json\n"
		"with --shards N); Llama 3 shapes also generation_config.json.\n"
		"\n"
		"  --shape NAME      model shape (dim/layers/heads/kv heads/ffn/vocab/ctx\n"
		"                    [/head_dim]); llama3-*: tied embeddings, rope_theta\n"
		"                    500000 with llama3 RoPE scaling (factor 32, low 1,\n"
		"                    high 4, original context 8192), BPE tokenizer:\n");
	for (size_t i = 0; i < N_SHAPES; i++) {
		const struct gm_shape *s = &gm_shapes[i];
		char hd[16] = "";

		if (s->head_dim)
			snprintf(hd, sizeof(hd), "/%d", s->head_dim);
		fprintf(f, "                      %-12s %d/%d/%d/%d/%d/%d/%d%s\n",
			s->name, s->dim, s->n_layers, s->n_heads, s->n_kv_heads,
			s->ffn, s->vocab, s->max_pos, hd);
	}
	fprintf(f,
		"  --out DIR         output folder (created if missing; files in it\n"
		"                    with the same names are replaced)\n"
		"  --dtype T         f32 (default), f16 or bf16\n"
		"  --layers N        override the shape's number of layers (1..4096)\n"
		"  --seed S          PRNG seed (default 1); a tensor's values depend only\n"
		"                    on the seed and its name\n"
		"  --tokenizer PATH  tokenizer to copy: a tokenizer.json (with the\n"
		"                    tokenizer_config.json beside it) to DIR/tokenizer.json,\n"
		"                    anything else to DIR/tokenizer.model (default:\n"
		"                    $MODELS/llama3-tokenizer/tokenizer.json for llama3-*,\n"
		"                    $MODELS/tok512.model for a 512-token vocabulary, else\n"
		"                    $MODELS/tokenizer.model; MODELS defaults to\n"
		"                    ../shared/models)\n"
		"  --shards N        split the weights into N files by layer ranges\n"
		"                    (1..layers+2, default 1)\n"
		"  -h, --help        show this help\n"
		"\n"
		"Exit status: 0 ok, 1 I/O error, 2 usage error.\n");
}

static int gm_parse_int(const char *s, long lo, long hi, long *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return -EINVAL;
	*out = v;
	return 0;
}

static int gm_bad(const char *fmt, const char *arg)
{
	fprintf(stderr, "llamad-genmodel: ");
	fprintf(stderr, fmt, arg);
	fprintf(stderr, "\n(see llamad-genmodel --help)\n");
	return 2;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "shape", required_argument, NULL, 's' },
		{ "out", required_argument, NULL, 'o' },
		{ "dtype", required_argument, NULL, 'd' },
		{ "layers", required_argument, NULL, 'l' },
		{ "seed", required_argument, NULL, 'S' },
		{ "tokenizer", required_argument, NULL, 't' },
		{ "shards", required_argument, NULL, 'n' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct gm_opts op = { .dtype = GM_F32, .seed = 1, .n_shards = 1 };
	const char *shape = NULL, *tokenizer = NULL;
	long layers = 0, shards = 1;
	int c, ret;

	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (c) {
		case 's':
			shape = optarg;
			break;
		case 'o':
			op.out_dir = optarg;
			break;
		case 'd': {
			size_t i;

			for (i = 0; i < 3; i++)
				if (strcmp(optarg, gm_dtypes[i].flag) == 0)
					break;
			if (i == 3)
				return gm_bad("bad --dtype '%s' (f32, f16 or bf16)",
					      optarg);
			op.dtype = (enum gm_dtype)i;
			break;
		}
		case 'l':
			if (gm_parse_int(optarg, 1, 4096, &layers) < 0)
				return gm_bad("bad --layers '%s' (1..4096)", optarg);
			break;
		case 'S': {
			char *end;

			errno = 0;
			op.seed = strtoull(optarg, &end, 0);
			if (errno || end == optarg || *end || optarg[0] == '-')
				return gm_bad("bad --seed '%s'", optarg);
			break;
		}
		case 't':
			tokenizer = optarg;
			break;
		case 'n':
			if (gm_parse_int(optarg, 1, 100000, &shards) < 0)
				return gm_bad("bad --shards '%s'", optarg);
			break;
		case 'h':
			gm_usage(stdout);
			return 0;
		default: /* getopt has printed what was wrong */
			fprintf(stderr, "(see llamad-genmodel --help)\n");
			return 2;
		}
	}
	if (optind < argc)
		return gm_bad("unexpected argument '%s'", argv[optind]);
	if (!shape)
		return gm_bad("%s", "--shape is required");
	if (!op.out_dir || !op.out_dir[0])
		return gm_bad("%s", "--out is required");
	size_t si;

	for (si = 0; si < N_SHAPES; si++)
		if (strcmp(shape, gm_shapes[si].name) == 0)
			break;
	if (si == N_SHAPES) {
		fprintf(stderr, "llamad-genmodel: unknown --shape '%s' (", shape);
		for (size_t i = 0; i < N_SHAPES; i++)
			fprintf(stderr, "%s%s", i ? ", " : "", gm_shapes[i].name);
		fprintf(stderr, ")\n(see llamad-genmodel --help)\n");
		return 2;
	}
	op.shape = gm_shapes[si];
	if (layers > 0)
		op.shape.n_layers = (int)layers;
	if (shards > op.shape.n_layers + 2) {
		fprintf(stderr, "llamad-genmodel: --shards %ld is more than "
			"layers + 2 (%d)\n(see llamad-genmodel --help)\n", shards,
			op.shape.n_layers + 2);
		return 2;
	}
	op.n_shards = (int)shards;

	if (tokenizer) {
		op.tokenizer = strdup(tokenizer);
	} else {
		const char *models = getenv("MODELS");

		if (!models || !models[0])
			models = "../shared/models";
		op.tokenizer = gm_join(models, op.shape.family == GM_LLAMA3 ?
				       "llama3-tokenizer/tokenizer.json" :
				       op.shape.vocab == 512 ? "tok512.model" :
				       "tokenizer.model");
	}
	if (!op.tokenizer) {
		fprintf(stderr, "llamad-genmodel: %s\n", strerror(ENOMEM));
		return 1;
	}
	size_t tl = strlen(op.tokenizer);

	op.tok_json = tl >= 5 && strcmp(op.tokenizer + tl - 5, ".json") == 0;

	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = gm_on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);

	ret = gm_generate(&op);
	free(op.tokenizer);
	return ret == 0 ? 0 : 1;
}

/*
 * model/model.h — a loaded Llama-family model: hyper-parameters, weights
 * (mmapped read-only where the file layout allows) and its tokenizer.
 *
 * Formats: llama2.c checkpoints (.bin, legacy 7-int32 header), Hugging
 * Face folders (config.json + model.safetensors or sharded *.safetensors with
 * model.safetensors.index.json; f32/f16/bf16; tokenizer.model or
 * tokenizer.json) and GGUF files (v2/v3, "llama" architecture;
 * f32/f16/bf16/q8_0/q4_0/K-quants; tokenizer from the metadata). Llama 3.1/3.2
 * RoPE scaling comes from either as m->rope_freqs.
 */
#ifndef LLAMAD_MODEL_MODEL_H
#define LLAMAD_MODEL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "text/tokenizer.h"

struct model_config {
	int dim;          /* residual width */
	int n_layers;
	int n_heads;
	int n_kv_heads;   /* <= n_heads, divides it (GQA) */
	int head_dim;     /* even, <= 512 */
	int ffn_dim;      /* SwiGLU hidden width */
	int vocab;
	int max_ctx;      /* context length the model was trained for */
	float rms_eps;
	float rope_theta;
	enum kt_rope_layout rope_layout;  /* pair layout of wq/wk rows */
	int bos, eos;
};

struct model_layer {
	const float *att_norm;   /* (dim) */
	const float *ffn_norm;   /* (dim) */
	struct kt_weight wq;     /* (n_heads*hd, dim) */
	struct kt_weight wk;     /* (n_kv_heads*hd, dim) */
	struct kt_weight wv;     /* (n_kv_heads*hd, dim) */
	struct kt_weight wo;     /* (dim, n_heads*hd) */
	struct kt_weight w1;     /* gate (ffn, dim) */
	struct kt_weight w2;     /* down (dim, ffn) */
	struct kt_weight w3;     /* up (ffn, dim) */
};

struct model_map {
	void *addr;
	size_t len;
};

struct model {
	struct model_config cfg;
	char *path;              /* as given */
	const char *format;      /* "llama2.c", "safetensors", "gguf" */
	/* Chat template the model file declares: its kind, classified once
	 * when loaded (enum chat_template, text/chat.h's
	 * chat_classify_template; CHAT_TEMPLATE_AUTO: unknown, or none), and
	 * its text (malloc'd; NULL if the file has none). From a GGUF's
	 * tokenizer.chat_template, or a Hugging Face folder's
	 * tokenizer_config.json chat_template (chat_template.jinja when that
	 * has none). */
	int chat_template;
	char *chat_template_text;
	enum kt_dtype wtype;     /* dtype of the large matrices */
	struct kt_weight embed;  /* (vocab, dim) */
	struct model_layer *layers;
	const float *final_norm; /* (dim) */
	struct kt_weight cls;    /* (vocab, dim); may alias embed */
	float *inv_freq;         /* (head_dim/2) RoPE inverse frequencies, scaled */
	/* (head_dim/2) RoPE frequency divisors, or NULL (no scaling): inv_freq[i]
	 * = theta^(-2i/head_dim) / rope_freqs[i]. GGUF's rope_freqs.weight; a
	 * Hugging Face rope_scaling of type llama3 gives the same table
	 * (model_rope_llama3), so both formats yield bit-identical inv_freq. */
	const float *rope_freqs;
	struct tok *tok;
	size_t weight_bytes;     /* bytes of all weights read per token */
	uint64_t fingerprint;    /* XXH64 over the hyper-parameters and every weight
				  * byte as loaded (embedding, norms, matrices,
				  * classifier): the identity of a model for saved KV
				  * caches, computed once by model_load */
	/* resources */
	struct model_map *maps;
	int n_maps;
	void **owned;            /* malloc'd buffers (converted norms) */
	int n_owned;
};

/*
 * Load the model at `path` (a llama2.c .bin file, a Hugging Face folder, a
 * .safetensors file inside one, or a GGUF file: a .gguf name or the GGUF
 * magic). `tokenizer` overrides the tokenizer file (default: the GGUF's own
 * vocabulary, else tokenizer.model in the folder / beside the file). Weights
 * are mmapped read-only. Returns NULL on failure with *cause (malloc'd) naming
 * the file and the reason; never crashes on malformed input.
 */
struct model *model_load(const char *path, const char *tokenizer, char **cause);
/* Free a model; accepts NULL. */
void model_free(struct model *m);
/* Tell the kernel the mapped file pages wholly inside [p, p+len) are not
 * needed for now (a backend made its own copy of a weight): they leave
 * the process's resident set and come back from the file if read again.
 * Does nothing for memory that is not one of m's file mappings. */
void model_drop_pages(const struct model *m, const void *p, size_t len);

/* KV elements per position (n_kv_heads * head_dim). */
static inline int model_kv_dim(const struct model_config *c)
{
	return c->n_kv_heads * c->head_dim;
}

/* Format a one-line description ("llama2.c dim 64 layers 5 ...") into buf. */
void model_describe(const struct model *m, char *buf, size_t cap);

/* Validate hyper-parameters; returns NULL if fine, else a static reason. */
const char *model_config_check(const struct model_config *c);

/* Llama 3.1 RoPE scaling ("rope_type": "llama3") as rope_freqs divisors
 * (head_dim/2 floats into out), for theta and head_dim: with inv_freq[i] =
 * theta^(-2i/hd) in f32 and its wavelength w = 2 pi / inv_freq[i], the
 * divisor is 1 where w < orig / high, factor where w > orig / low, else
 * 1 / ((1 - s) / factor + s) with s = (orig / w - low) / (high - low)
 * (arithmetic in double, rounded once to f32). Returns NULL, or a static
 * reason if the parameters are out of range (factor > 0, 0 < low < high,
 * orig >= 1, all finite). */
const char *model_rope_llama3(float theta, int head_dim, double factor, double low,
			      double high, double orig, float *out);
/* The RoPE inverse frequencies of c (head_dim/2 floats into out):
 * theta^(-2i/head_dim) in f32, divided by rope_freqs[i] when rope_freqs is
 * not NULL. */
void model_inv_freq(const struct model_config *c, const float *rope_freqs, float *out);

#endif

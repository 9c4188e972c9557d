/*
 * model/hparams.c — hyper-parameters: their ranges, and the RoPE
 * inverse frequencies (Llama 3.1's scaling included) computed one way for
 * every format.
 */
#include <math.h>
#include <stddef.h>

#include "model/model.h"

const char *model_config_check(const struct model_config *c)
{
	if (c->dim <= 0 || c->dim > 65536)
		return "dim out of range";
	if (c->n_layers <= 0 || c->n_layers > 1024)
		return "layer count out of range";
	if (c->n_heads <= 0 || c->n_heads > 1024)
		return "head count out of range";
	if (c->n_kv_heads <= 0 || c->n_kv_heads > c->n_heads || c->n_heads % c->n_kv_heads)
		return "kv head count must divide the head count";
	if (c->head_dim <= 0 || c->head_dim > 512 || c->head_dim % 2)
		return "head dimension must be even and at most 512";
	if (c->ffn_dim <= 0 || c->ffn_dim > 1 << 20)
		return "ffn size out of range";
	if (c->vocab <= 2 || c->vocab > 1 << 22)
		return "vocabulary size out of range";
	if (c->max_ctx <= 0 || c->max_ctx > 1 << 24)
		return "context length out of range";
	if (!(c->rms_eps > 0 && c->rms_eps < 1))
		return "rms eps out of range";
	if (!(c->rope_theta > 1 && c->rope_theta < 1e9))
		return "rope theta out of range";
	return NULL;
}

/* theta^(-2i/hd) in f32: the unscaled inverse frequency, computed one way
 * for every format and for model_rope_llama3. */
static float base_inv_freq(float theta, int hd, int i)
{
	return 1.0f / powf(theta, (float)(2 * i) / (float)hd);
}

const char *model_rope_llama3(float theta, int head_dim, double factor, double low,
			      double high, double orig, float *out)
{
	if (!(factor > 0 && factor < 1e6))
		return "rope_scaling factor must be positive";
	if (!(low > 0 && high > low && high < 1e6))
		return "rope_scaling needs 0 < low_freq_factor < high_freq_factor";
	if (!(orig >= 1 && orig <= 1 << 24))
		return "rope_scaling original_max_position_embeddings out of range";
	double low_wl = orig / low, high_wl = orig / high;
	for (int i = 0; i < head_dim / 2; i++) {
		double w = 2 * M_PI / (double)base_inv_freq(theta, head_dim, i);
		double d;
		if (w < high_wl) {
			d = 1;
		} else if (w > low_wl) {
			d = factor;
		} else {
			double s = (orig / w - low) / (high - low);
			d = 1 / ((1 - s) / factor + s);
		}
		out[i] = (float)d;
	}
	return NULL;
}

void model_inv_freq(const struct model_config *c, const float *rope_freqs, float *out)
{
	for (int i = 0; i < c->head_dim / 2; i++) {
		out[i] = base_inv_freq(c->rope_theta, c->head_dim, i);
		if (rope_freqs)
			out[i] /= rope_freqs[i];
	}
}

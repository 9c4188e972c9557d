/*
 * kernels/cpu/elementwise.c — the CPU backend's row-wise and element-wise
 * ops: the fixed-order dot product, RMSNorm, RoPE, SiLU x up, add, embed.
 * Reductions use a fixed order per row so results are independent of batch
 * composition and thread count.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/vec.h"

float cpu_dot(const float *a, const float *b, int n)
{
	float acc[16] = { 0 };
	int k = 0;
	for (; k + 16 <= n; k += 16)
		for (int j = 0; j < 16; j++)
			acc[j] += a[k + j] * b[k + j];
	for (int j = 0; k + j < n; j++)
		acc[j] += a[k + j] * b[k + j];
	for (int s = 8; s >= 1; s /= 2)
		for (int j = 0; j < s; j++)
			acc[j] += acc[j + s];
	return acc[0];
}

void cpu_rmsnorm(struct backend *be, float *y, const float *x,
		 const float *w, int n, int n_tok, float eps)
{
	(void)be;
	for (int t = 0; t < n_tok; t++) {
		const float *xr = x + (size_t)t * n;
		float *yr = y + (size_t)t * n;
		float ss = cpu_dot(xr, xr, n);
		float s = 1.0f / sqrtf(ss / n + eps);
		for (int i = 0; i < n; i++)
			yr[i] = w[i] * (s * xr[i]);
	}
}

static void rope_heads(float *v, int n_heads, int hd, const float *c, const float *s,
		       enum kt_rope_layout layout)
{
	int half = hd / 2;
	for (int h = 0; h < n_heads; h++) {
		float *x = v + (size_t)h * hd;
		if (layout == KT_ROPE_INTERLEAVED) {
			for (int i = 0; i < half; i++) {
				float a = x[2 * i], b = x[2 * i + 1];
				x[2 * i] = a * c[i] - b * s[i];
				x[2 * i + 1] = a * s[i] + b * c[i];
			}
		} else {
			float tmp[512];
			for (int i = 0; i < half; i++) {
				float a = x[i], b = x[i + half];
				tmp[2 * i] = a * c[i] - b * s[i];
				tmp[2 * i + 1] = a * s[i] + b * c[i];
			}
			memcpy(x, tmp, (size_t)hd * sizeof(float));
		}
	}
}

void cpu_rope(struct backend *be, float *q, float *k, const int *pos,
	      int n_tok, int n_heads, int n_kv_heads, int hd,
	      const float *inv_freq, enum kt_rope_layout layout)
{
	(void)be;
	float c[256], s[256];
	int half = hd / 2;
	if (hd > 512)
		abort();  /* loaders refuse head_dim > 512 */
	for (int t = 0; t < n_tok; t++) {
		for (int i = 0; i < half; i++) {
			float ang = (float)pos[t] * inv_freq[i];
			c[i] = cosf(ang);
			s[i] = sinf(ang);
		}
		rope_heads(q + (size_t)t * n_heads * hd, n_heads, hd, c, s, layout);
		rope_heads(k + (size_t)t * n_kv_heads * hd, n_kv_heads, hd, c, s, layout);
	}
}

/* From here on (SiLU) multiply-adds may fuse (FMA): the same binary always
 * fuses the same way, so results stay deterministic and batch-invariant.
 * RMSNorm and RoPE above stay unfused so that RoPE's two pair layouts give
 * identical bits. */
#pragma GCC optimize("fp-contract=fast")

struct ew_job {
	float *g;
	const float *u;
	size_t n;
};

static void silu_worker(void *ctx, int ith, int nth)
{
	struct ew_job *j = ctx;
	size_t per = ((j->n + nth - 1) / nth + 15) & ~(size_t)15;
	size_t a = (size_t)ith * per, b = a + per < j->n ? a + per : j->n;
	float *g = j->g;
	const float *u = j->u;
	size_t i = a;
	for (; i + 8 <= b; i += 8) {
		v8f x = ld8(g + i);
		st8(g + i, x / (1.0f + vexp8(-x)) * ld8(u + i));
	}
	if (i < b) {  /* the tail through the same vector code */
		float tg[8] = { 0 }, tu[8] = { 0 };
		memcpy(tg, g + i, (b - i) * sizeof(float));
		memcpy(tu, u + i, (b - i) * sizeof(float));
		v8f x = ld8(tg);
		st8(tg, x / (1.0f + vexp8(-x)) * ld8(tu));
		memcpy(g + i, tg, (b - i) * sizeof(float));
	}
}

void cpu_silu_mul(struct backend *be, float *g, const float *u, size_t n)
{
	struct cpu_backend *cb = (struct cpu_backend *)be;
	struct ew_job j = { g, u, n };
	tpool_run(cb->pool, silu_worker, &j, n < 65536 ? 1 : tpool_size(cb->pool));
}

void cpu_add(struct backend *be, float *y, const float *x, size_t n)
{
	(void)be;
	for (size_t i = 0; i < n; i++)
		y[i] += x[i];
}

void cpu_embed(struct backend *be, float *y, const struct kt_weight *table,
	       const int32_t *tok, int n_tok)
{
	(void)be;
	int d = table->cols;
	size_t rb = kt_row_bytes(table->dtype, (size_t)d);
	for (int t = 0; t < n_tok; t++)
		kt_row_to_f32(table->dtype, (const uint8_t *)table->data + (size_t)tok[t] * rb,
			      y + (size_t)t * d, (size_t)d);
}

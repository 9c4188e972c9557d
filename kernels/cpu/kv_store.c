/*
 * kernels/cpu/kv_store.c — the CPU backend's K/V store: each token's K and
 * V rows written at its position of the paged store (kernels/backend.h
 * layout; f16 and q8_0 through kt_kv_put).
 */
#include <string.h>

#include "kernels/cpu/cpu.h"

void cpu_kv_store(struct backend *be, const struct kt_kv *kv, int layer,
		  const float *k, const float *v,
		  const struct kt_attn_row *rows, int n_tok)
{
	(void)be;
	int bs = kv->block_size, kd = kv->kv_dim;
	for (int t = 0; t < n_tok; t++) {
		int p = rows[t].pos;
		int32_t b = rows[t].block_table[p / bs];
		if (kv->dtype != KT_F32) {
			kt_kv_put(kv, b, layer, p % bs, k + (size_t)t * kd, v + (size_t)t * kd);
			continue;
		}
		int r = p % bs;
		float *kt = kt_kv_kt(kv, b, layer);
		const float *kr = k + (size_t)t * kd;
		for (int c = 0; c < kd; c++)
			kt[(size_t)c * bs + r] = kr[c];
		memcpy((float *)kt_kv_vspan(kv, b, layer) + (size_t)r * kd, v + (size_t)t * kd,
		       (size_t)kd * sizeof(float));
	}
}

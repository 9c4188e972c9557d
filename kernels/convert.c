/*
 * kernels/convert.c — dtype helpers and the KV store address arithmetic
 * shared by every backend.
 */
#include <math.h>
#include <string.h>

#include "kernels/backend.h"

size_t kt_dtype_size(enum kt_dtype t)
{
	switch (t) {
	case KT_F32: return 4;
	case KT_F16: return 2;
	case KT_BF16: return 2;
	}
	return 0;
}

const char *kt_dtype_name(enum kt_dtype t)
{
	switch (t) {
	case KT_F32: return "f32";
	case KT_F16: return "f16";
	case KT_BF16: return "bf16";
	}
	return "?";
}

size_t kt_kv_block_bytes(const struct kt_kv *kv)
{
	return (size_t)kv->n_layers * 2 * kv->block_size * kv->kv_dim * sizeof(float);
}

float *kt_kv_block(const struct kt_kv *kv, int32_t block)
{
	return kv->base + (size_t)block * (kt_kv_block_bytes(kv) / sizeof(float));
}

static float *kv_span(const struct kt_kv *kv, int32_t block, int layer, int which)
{
	size_t span = (size_t)kv->block_size * kv->kv_dim;
	return kv->base + (((size_t)block * kv->n_layers + layer) * 2 + which) * span;
}

float *kt_kv_kt(const struct kt_kv *kv, int32_t block, int layer)
{
	return kv_span(kv, block, layer, 0);
}

float *kt_kv_v(const struct kt_kv *kv, int32_t block, int layer, int row)
{
	return kv_span(kv, block, layer, 1) + (size_t)row * kv->kv_dim;
}

void kt_kv_get_k(const struct kt_kv *kv, int32_t block, int layer, int row, float *out)
{
	const float *kt = kv_span(kv, block, layer, 0);
	for (int c = 0; c < kv->kv_dim; c++)
		out[c] = kt[(size_t)c * kv->block_size + row];
}

static uint32_t f32_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static float bits_f32(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

float kt_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f;
	uint32_t man = h & 0x3ff;
	if (exp == 0) {
		/* zero or subnormal: man * 2^-24 */
		float v = (float)man * 0x1p-24f;
		return sign ? -v : v;
	}
	if (exp == 31)
		return bits_f32(sign | 0x7f800000u | (man << 13));
	return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t kt_f32_to_f16(float f)
{
	uint32_t u = f32_bits(f);
	uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
	uint32_t au = u & 0x7fffffffu;
	if (au >= 0x7f800000u)  /* inf or nan */
		return sign | 0x7c00 | (au > 0x7f800000u ? 0x200 : 0);
	if (au >= 0x477ff000u)  /* rounds to >= 65520: overflow to inf */
		return sign | 0x7c00;
	if (au < 0x38800000u) {
		/* result is subnormal or zero: round(|f| * 2^24) */
		float a = bits_f32(au);
		float m = nearbyintf(a * 0x1p24f);  /* ties-to-even */
		return sign | (uint16_t)m;
	}
	/* normal: round mantissa from 23 to 10 bits, ties to even */
	uint32_t r = au + 0xfffu + ((au >> 13) & 1u);
	return sign | (uint16_t)((r - 0x38000000u) >> 13);
}

float kt_bf16_to_f32(uint16_t h)
{
	return bits_f32((uint32_t)h << 16);
}

uint16_t kt_f32_to_bf16(float f)
{
	uint32_t u = f32_bits(f);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40);  /* quiet nan */
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

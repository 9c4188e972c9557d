/*
 * kernels/convert.c — dtype helpers (sizes, names, fp16/bf16 conversions,
 * GGML Q8_0/Q4_0 block quantization and dequantization) and the KV store
 * address arithmetic shared by every backend.
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
	case KT_Q8_0:
	case KT_Q4_0: return 0;
	}
	return 0;
}

/* Bytes of one quantization block. */
#define Q8_0_BYTES (2 + KT_QBLOCK)
#define Q4_0_BYTES (2 + KT_QBLOCK / 2)

size_t kt_row_bytes(enum kt_dtype t, size_t n)
{
	switch (t) {
	case KT_F32: return 4 * n;
	case KT_F16:
	case KT_BF16: return 2 * n;
	case KT_Q8_0: return n / KT_QBLOCK * Q8_0_BYTES;
	case KT_Q4_0: return n / KT_QBLOCK * Q4_0_BYTES;
	}
	return 0;
}

int kt_dtype_is_quant(enum kt_dtype t)
{
	return t == KT_Q8_0 || t == KT_Q4_0;
}

const char *kt_dtype_name(enum kt_dtype t)
{
	switch (t) {
	case KT_F32: return "f32";
	case KT_F16: return "f16";
	case KT_BF16: return "bf16";
	case KT_Q8_0: return "q8_0";
	case KT_Q4_0: return "q4_0";
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

/* ---- block quantization ------------------------------------------------ */

static uint16_t ld_u16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static void st_u16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

/*
 * Q8_0, as GGML's reference quantizer: d = max|x| / 127, q = round(x * (1/d))
 * (half away from zero; all q 0 when d == 0), d stored as f16 (rounded after
 * the q are formed from the fp32 d).
 */
void kt_quantize_q8_0(const float *x, void *out, size_t n)
{
	uint8_t *o = out;
	for (size_t b = 0; b < n / KT_QBLOCK; b++, x += KT_QBLOCK, o += Q8_0_BYTES) {
		float amax = 0;
		for (int j = 0; j < KT_QBLOCK; j++)
			amax = fmaxf(amax, fabsf(x[j]));
		float d = amax / 127.0f;
		float id = d != 0 ? 1.0f / d : 0.0f;
		st_u16(o, kt_f32_to_f16(d));
		for (int j = 0; j < KT_QBLOCK; j++)
			o[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
	}
}

/*
 * Q4_0, as GGML's reference quantizer: m = the value of largest magnitude
 * (its sign kept; the first such), d = m / -8, q = min(15, trunc(x * (1/d)
 * + 8.5)), so m itself maps to q = 0 and w = d * (q - 8). Weight j of the
 * block goes to the low nibble of byte j, weight j+16 to its high nibble.
 */
void kt_quantize_q4_0(const float *x, void *out, size_t n)
{
	uint8_t *o = out;
	for (size_t b = 0; b < n / KT_QBLOCK; b++, x += KT_QBLOCK, o += Q4_0_BYTES) {
		float amax = 0, m = 0;
		for (int j = 0; j < KT_QBLOCK; j++)
			if (amax < fabsf(x[j])) {
				amax = fabsf(x[j]);
				m = x[j];
			}
		float d = m / -8.0f;
		float id = d != 0 ? 1.0f / d : 0.0f;
		st_u16(o, kt_f32_to_f16(d));
		for (int j = 0; j < KT_QBLOCK / 2; j++) {
			int lo = (int8_t)(x[j] * id + 8.5f);
			int hi = (int8_t)(x[j + KT_QBLOCK / 2] * id + 8.5f);
			lo = lo < 15 ? lo : 15;
			hi = hi < 15 ? hi : 15;
			o[2 + j] = (uint8_t)(lo | hi << 4);
		}
	}
}

void kt_row_to_f32(enum kt_dtype t, const void *row, float *out, size_t n)
{
	const uint8_t *p = row;
	switch (t) {
	case KT_F32:
		memcpy(out, row, n * sizeof(float));
		return;
	case KT_F16:
		for (size_t i = 0; i < n; i++)
			out[i] = kt_f16_to_f32(ld_u16(p + 2 * i));
		return;
	case KT_BF16:
		for (size_t i = 0; i < n; i++)
			out[i] = kt_bf16_to_f32(ld_u16(p + 2 * i));
		return;
	case KT_Q8_0:
		for (size_t b = 0; b < n / KT_QBLOCK; b++, p += Q8_0_BYTES, out += KT_QBLOCK) {
			float d = kt_f16_to_f32(ld_u16(p));
			for (int j = 0; j < KT_QBLOCK; j++)
				out[j] = d * (float)(int8_t)p[2 + j];
		}
		return;
	case KT_Q4_0:
		for (size_t b = 0; b < n / KT_QBLOCK; b++, p += Q4_0_BYTES, out += KT_QBLOCK) {
			float d = kt_f16_to_f32(ld_u16(p));
			for (int j = 0; j < KT_QBLOCK / 2; j++) {
				out[j] = d * (float)((p[2 + j] & 15) - 8);
				out[j + KT_QBLOCK / 2] = d * (float)((p[2 + j] >> 4) - 8);
			}
		}
		return;
	}
}

/*
 * kernels/convert.c — fp16/bf16 conversions, GGML Q8_0/Q4_0 and
 * Q4_K/Q5_K/Q6_K block quantization and dequantization, and the KV store
 * address arithmetic shared by every backend (the types' sizes and names:
 * util/dtype.c).
 */
#include <math.h>
#include <string.h>

#include "kernels/backend.h"

int kt_kv_group_for(int hd)
{
	for (int g = 32; g >= 8; g /= 2)
		if (hd > 0 && hd % g == 0)
			return g;
	return 0;
}

int kt_kv_dtype_ok(enum kt_dtype dtype, int hd)
{
	return dtype == KT_F32 || dtype == KT_F16 || (dtype == KT_Q8_0 && kt_kv_group_for(hd) > 0);
}

size_t kt_kv_span_bytes(const struct kt_kv *kv)
{
	size_t n = (size_t)kv->block_size * kv->kv_dim;
	switch (kv->dtype) {
	case KT_F16: return n * 2;
	case KT_Q8_0: return n + (size_t)kv->block_size * (kv->kv_dim / kv->group) * 2;
	default: return n * sizeof(float);
	}
}

size_t kt_kv_block_bytes(const struct kt_kv *kv)
{
	return (size_t)kv->n_layers * 2 * kt_kv_span_bytes(kv);
}

double kt_kv_token_bytes(const struct kt_kv *kv)
{
	return (double)kt_kv_block_bytes(kv) / kv->block_size;
}

void *kt_kv_block(const struct kt_kv *kv, int32_t block)
{
	return (char *)kv->base + (size_t)block * kt_kv_block_bytes(kv);
}

static char *kv_span(const struct kt_kv *kv, int32_t block, int layer, int which)
{
	return (char *)kv->base +
	       (((size_t)block * kv->n_layers + layer) * 2 + which) * kt_kv_span_bytes(kv);
}

void *kt_kv_kt(const struct kt_kv *kv, int32_t block, int layer)
{
	return kv_span(kv, block, layer, 0);
}

void *kt_kv_vspan(const struct kt_kv *kv, int32_t block, int layer)
{
	return kv_span(kv, block, layer, 1);
}

uint16_t kt_kv_q8_group(const float *x, int8_t *codes, int n)
{
	float amax = 0;
	for (int i = 0; i < n; i++)
		amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
	/* the codes are taken against the scale as stored (f16), so each value
	 * is within half a step of its input */
	uint16_t dh = kt_f32_to_f16(amax / 127.0f);
	float d = kt_f16_to_f32(dh), id = d != 0 ? 1.0f / d : 0.0f;
	for (int i = 0; i < n; i++) {
		float r = nearbyintf(x[i] * id);
		/* a NaN (a row never written, converted whole) gives 0 */
		codes[i] = (int8_t)(r != r ? 0 : r > 127 ? 127 : r < -127 ? -127 : r);
	}
	return dh;
}

/* Element i of a span's codes / the scale of group g at row r, as fp32:
 * the same arithmetic the attention kernels do (scale * code in fp32). */
static float span_elem(const struct kt_kv *kv, const char *span, size_t i)
{
	switch (kv->dtype) {
	case KT_F16: return kt_f16_to_f32(((const uint16_t *)span)[i]);
	case KT_Q8_0: return (float)((const int8_t *)span)[i];
	default: return ((const float *)span)[i];
	}
}

static const uint16_t *span_scales(const struct kt_kv *kv, const char *span)
{
	return (const uint16_t *)(span + (size_t)kv->block_size * kv->kv_dim);
}

void kt_kv_get_k(const struct kt_kv *kv, int32_t block, int layer, int row, float *out)
{
	const char *kt = kv_span(kv, block, layer, 0);
	int bs = kv->block_size;
	for (int c = 0; c < kv->kv_dim; c++) {
		out[c] = span_elem(kv, kt, (size_t)c * bs + row);
		if (kv->dtype == KT_Q8_0)
			out[c] = kt_f16_to_f32(span_scales(kv, kt)[(size_t)(c / kv->group) * bs + row]) * out[c];
	}
}

void kt_kv_get_v(const struct kt_kv *kv, int32_t block, int layer, int row, float *out)
{
	const char *vs = kv_span(kv, block, layer, 1);
	size_t kd = (size_t)kv->kv_dim;
	for (size_t c = 0; c < kd; c++) {
		out[c] = span_elem(kv, vs, (size_t)row * kd + c);
		if (kv->dtype == KT_Q8_0)
			out[c] = kt_f16_to_f32(span_scales(kv, vs)[(size_t)row * (kd / kv->group) +
								   c / kv->group]) * out[c];
	}
}

void kt_kv_put(const struct kt_kv *kv, int32_t block, int layer, int row, const float *k,
	       const float *v)
{
	char *kt = kv_span(kv, block, layer, 0), *vs = kv_span(kv, block, layer, 1);
	int bs = kv->block_size, kd = kv->kv_dim;
	switch (kv->dtype) {
	case KT_F16: {
		uint16_t *k16 = (uint16_t *)kt, *v16 = (uint16_t *)vs + (size_t)row * kd;
		for (int c = 0; c < kd; c++) {
			k16[(size_t)c * bs + row] = kt_f32_to_f16(k[c]);
			v16[c] = kt_f32_to_f16(v[c]);
		}
		break;
	}
	case KT_Q8_0: {
		int g = kv->group, ng = kd / g;
		int8_t codes[32];
		uint16_t *ks = (uint16_t *)(kt + (size_t)bs * kd), *vsc = (uint16_t *)(vs + (size_t)bs * kd);
		for (int j = 0; j < ng; j++) {
			ks[(size_t)j * bs + row] = kt_kv_q8_group(k + (size_t)j * g, codes, g);
			for (int i = 0; i < g; i++)
				((int8_t *)kt)[(size_t)(j * g + i) * bs + row] = codes[i];
			vsc[(size_t)row * ng + j] =
				kt_kv_q8_group(v + (size_t)j * g, (int8_t *)vs + (size_t)row * kd + (size_t)j * g, g);
		}
		break;
	}
	default: {
		float *kf = (float *)kt;
		for (int c = 0; c < kd; c++)
			kf[(size_t)c * bs + row] = k[c];
		memcpy((float *)vs + (size_t)row * kd, v, (size_t)kd * sizeof(float));
		break;
	}
	}
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
	for (size_t b = 0; b < n / KT_QBLOCK; b++, x += KT_QBLOCK, o += KT_Q8_0_BYTES) {
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
	for (size_t b = 0; b < n / KT_QBLOCK; b++, x += KT_QBLOCK, o += KT_Q4_0_BYTES) {
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

/* ---- K-quants ------------------------------------------------------------
 *
 * Q4_K / Q5_K: sub-block j (weights 32j..32j+31) has a 6-bit scale sc[j] and
 * min m[j], packed in 12 bytes s[]: for j < 4, sc[j] = s[j] & 63 and m[j] =
 * s[j+4] & 63; for j >= 4, sc[j] = (s[j+4] & 15) | (s[j-4] >> 6) << 4 and
 * m[j] = (s[j+4] >> 4) | (s[j] >> 6) << 4. The nibbles come in four runs of
 * 32 bytes: run r holds sub-block 2r in its low nibbles and 2r+1 in its
 * high ones (byte l: weight l of each). Q5_K's fifth bit of weight l of
 * sub-block j is bit j of qh[l]. Weight = (d*sc) * q - (dmin*m), each
 * product exact in fp32, one rounding in the difference.
 *
 * Q6_K: two halves of 128 weights; in half h, weight 32k + l (k < 4, l <
 * 32) has its low four bits in ql[64h + l + 32(k&1)] (low nibble for k < 2,
 * high for k >= 2) and its top two in bits 2k..2k+1 of qh[32h + l]; the
 * scale of weight i is the int8 sc[i/16]. Weight = (d*sc) * (q - 32).
 */

static void k_scale_min(const uint8_t *s, int j, int *sc, int *m)
{
	if (j < 4) {
		*sc = s[j] & 63;
		*m = s[j + 4] & 63;
	} else {
		*sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
		*m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
	}
}

static void k_pack_scale_min(uint8_t *s, const int *sc, const int *m)
{
	for (int j = 0; j < 4; j++) {
		s[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
		s[j + 4] = (uint8_t)(m[j] | (m[j + 4] >> 4) << 6);
		s[j + 8] = (uint8_t)((sc[j + 4] & 15) | (m[j + 4] & 15) << 4);
	}
}

/* Codes and scales of one Q4_K (qh NULL) or Q5_K super-block. */
static void codes_q45_k(const uint8_t *blk, const uint8_t *qh, const uint8_t *qs,
			struct kt_qcodes *q)
{
	q->d = ld_u16(blk);
	q->dmin = ld_u16(blk + 2);
	for (int j = 0; j < 8; j++) {
		k_scale_min(blk + 4, j, &q->sc[j], &q->m[j]);
		const uint8_t *s = qs + 32 * (j / 2);
		int shift = 4 * (j & 1);
		for (int l = 0; l < 32; l++)
			q->u[32 * j + l] = (uint8_t)(((s[l] >> shift) & 15) |
						     (qh ? ((qh[l] >> j) & 1) << 4 : 0));
	}
}

static void codes_q6_k(const uint8_t *blk, struct kt_qcodes *q)
{
	const uint8_t *ql = blk, *qh = blk + 128;
	q->d = ld_u16(blk + 208);
	q->dmin = 0;
	for (int i = 0; i < 16; i++)
		q->sc[i] = (int8_t)blk[192 + i];
	for (int h = 0; h < 2; h++)
		for (int k = 0; k < 4; k++)
			for (int l = 0; l < 32; l++) {
				int lo = (ql[64 * h + 32 * (k & 1) + l] >> (k < 2 ? 0 : 4)) & 15;
				int hi = (qh[32 * h + l] >> (2 * k)) & 3;
				q->u[128 * h + 32 * k + l] = (uint8_t)(lo | hi << 4);
			}
}

void kt_block_codes(enum kt_dtype t, const void *block, struct kt_qcodes *q)
{
	const uint8_t *p = block;
	switch (t) {
	case KT_Q8_0:
		q->d = ld_u16(p);
		for (int j = 0; j < KT_QBLOCK; j++)
			q->u[j] = (uint8_t)(p[2 + j] ^ 0x80);   /* int8 q + 128 */
		break;
	case KT_Q4_0:
		q->d = ld_u16(p);
		for (int j = 0; j < KT_QBLOCK / 2; j++) {
			q->u[j] = p[2 + j] & 15;
			q->u[j + KT_QBLOCK / 2] = p[2 + j] >> 4;
		}
		break;
	case KT_Q4_K: codes_q45_k(p, NULL, p + 16, q); break;
	case KT_Q5_K: codes_q45_k(p, p + 16, p + 48, q); break;
	case KT_Q6_K: codes_q6_k(p, q); break;
	case KT_F32:
	case KT_F16:
	case KT_BF16: break;
	}
}

/* One block's weights from its codes: the fp32 expressions of kt_qcodes. */
static void codes_to_f32(enum kt_dtype t, const struct kt_qcodes *q, float *out)
{
	float d = kt_f16_to_f32(q->d);
	switch (t) {
	case KT_Q8_0:
	case KT_Q4_0: {
		int off = t == KT_Q8_0 ? 128 : 8;
		for (int j = 0; j < KT_QBLOCK; j++)
			out[j] = d * (float)(q->u[j] - off);
		break;
	}
	case KT_Q4_K:
	case KT_Q5_K: {
		float dmin = kt_f16_to_f32(q->dmin);
		for (int j = 0; j < 8; j++) {
			float d1 = d * (float)q->sc[j], m1 = dmin * (float)q->m[j];
			for (int l = 0; l < 32; l++)
				out[32 * j + l] = d1 * (float)q->u[32 * j + l] - m1;
		}
		break;
	}
	case KT_Q6_K:
		for (int i = 0; i < KT_QK_K; i++)
			out[i] = d * (float)q->sc[i / 16] * (float)(q->u[i] - 32);
		break;
	case KT_F32:
	case KT_F16:
	case KT_BF16: break;
	}
}

/* The f16 scale nearest to top / steps, raised until steps of it cover top. */
static uint16_t k_super_scale(float top, int steps)
{
	uint16_t h = kt_f32_to_f16(top / (float)steps);
	while (h < 0x7bff && kt_f16_to_f32(h) * (float)steps < top)
		h++;
	return h;
}

/* The sub-block scale code for step s under super-scale d: nearest, raised
 * until d * code >= s, at most cmax. */
static int k_sub_scale(float s, float d, int cmax)
{
	if (d == 0)
		return 0;
	int c = (int)roundf(s / d);
	if (c < cmax && d * (float)c < s)
		c++;
	return c < 0 ? 0 : c > cmax ? cmax : c;
}

/* Q4_K (nq = 15, qh NULL) or Q5_K (nq = 31): one super-block. */
static void quant_q45_k(const float *x, uint8_t *blk, uint8_t *qh, uint8_t *qs, int nq)
{
	float step[8], mins[8], smax = 0, mmax = 0;
	for (int j = 0; j < 8; j++) {
		float lo = 0, hi = x[32 * j];
		for (int l = 0; l < 32; l++) {
			lo = fminf(lo, x[32 * j + l]);
			hi = fmaxf(hi, x[32 * j + l]);
		}
		step[j] = (hi - lo) / (float)nq;
		mins[j] = -lo;
		smax = fmaxf(smax, step[j]);
		mmax = fmaxf(mmax, mins[j]);
	}
	uint16_t hd = k_super_scale(smax, 63), hm = k_super_scale(mmax, 63);
	float d = kt_f16_to_f32(hd), dmin = kt_f16_to_f32(hm);
	int sc[8], m[8];
	for (int j = 0; j < 8; j++) {
		sc[j] = k_sub_scale(step[j], d, 63);
		m[j] = dmin != 0 ? (int)roundf(mins[j] / dmin) : 0;
		m[j] = m[j] > 63 ? 63 : m[j];
	}
	st_u16(blk, hd);
	st_u16(blk + 2, hm);
	k_pack_scale_min(blk + 4, sc, m);
	memset(qs, 0, KT_QK_K / 2);
	if (qh)
		memset(qh, 0, KT_QK_K / 8);
	for (int j = 0; j < 8; j++) {
		float d1 = d * (float)sc[j], m1 = dmin * (float)m[j];
		for (int l = 0; l < 32; l++) {
			int q = d1 != 0 ? (int)roundf((x[32 * j + l] + m1) / d1) : 0;
			q = q < 0 ? 0 : q > nq ? nq : q;
			qs[32 * (j / 2) + l] |= (uint8_t)((q & 15) << (4 * (j & 1)));
			if (qh)
				qh[l] |= (uint8_t)((q >> 4) << j);
		}
	}
}

void kt_quantize_q4_k(const float *x, void *out, size_t n)
{
	uint8_t *o = out;
	for (size_t b = 0; b < n / KT_QK_K; b++, x += KT_QK_K, o += KT_Q4_K_BYTES)
		quant_q45_k(x, o, NULL, o + 16, 15);
}

void kt_quantize_q5_k(const float *x, void *out, size_t n)
{
	uint8_t *o = out;
	for (size_t b = 0; b < n / KT_QK_K; b++, x += KT_QK_K, o += KT_Q5_K_BYTES)
		quant_q45_k(x, o, o + 16, o + 48, 31);
}

void kt_quantize_q6_k(const float *x, void *out, size_t n)
{
	uint8_t *o = out;
	for (size_t b = 0; b < n / KT_QK_K; b++, x += KT_QK_K, o += KT_Q6_K_BYTES) {
		float step[16], smax = 0;
		for (int j = 0; j < 16; j++) {
			float amax = 0;
			for (int l = 0; l < 16; l++)
				amax = fmaxf(amax, fabsf(x[16 * j + l]));
			step[j] = amax / 31.0f;
			smax = fmaxf(smax, step[j]);
		}
		uint16_t hd = k_super_scale(smax, 127);
		float d = kt_f16_to_f32(hd);
		uint8_t *ql = o, *qh = o + 128;
		memset(o, 0, KT_Q6_K_BYTES);
		for (int j = 0; j < 16; j++)
			o[192 + j] = (uint8_t)(int8_t)k_sub_scale(step[j], d, 127);
		st_u16(o + 208, hd);
		for (int i = 0; i < KT_QK_K; i++) {
			float d1 = d * (float)(int8_t)o[192 + i / 16];
			int q = d1 != 0 ? (int)roundf(x[i] / d1) : 0;
			q = (q < -32 ? -32 : q > 31 ? 31 : q) + 32;
			int h = i / 128, k = i % 128 / 32, l = i % 32;
			ql[64 * h + l + 32 * (k & 1)] |= (uint8_t)((q & 15) << (k < 2 ? 0 : 4));
			qh[32 * h + l] |= (uint8_t)((q >> 4) << (2 * k));
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
	case KT_Q4_0:
	case KT_Q4_K:
	case KT_Q5_K:
	case KT_Q6_K: {
		size_t bw = kt_block_weights(t), bb = kt_row_bytes(t, bw);
		struct kt_qcodes q;
		for (size_t b = 0; b < n / bw; b++, p += bb, out += bw) {
			kt_block_codes(t, p, &q);
			codes_to_f32(t, &q, out);
		}
		return;
	}
	}
}

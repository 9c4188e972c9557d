/*
 * tests/unit/test_quant.c — GGML block quantization (kernels/convert.c) and
 * the CPU backend on Q8_0 / Q4_0 weights (kernels/cpu/matmul.c, embed).
 *
 * Checks and their bounds:
 *   row sizes        kt_row_bytes / kt_dtype_size / names, exact.
 *   known blocks     hand-computed bytes of kt_quantize_q8_0/q4_0 (zeros,
 *                    one-hot, exact values, rounding ties, the Q4_0 clamp).
 *   round trip       random rows; with d = the fp32 scale, d16 the stored
 *                    f16 one and q the code:
 *                      Q8_0: |x - d16*q| <= |d|/2 * (1 + 1e-6) + |q|*|d16 - d|
 *                      Q4_0: the same with |d|/2 for codes below the clamp,
 *                            |d| for the clamped ones (x * (1/d) + 8.5 >= 16:
 *                            values opposite in sign to the largest one,
 *                            within |d|/2 of its magnitude: the scheme's
 *                            real bound), and |d16 - d| <= |d| * 2^-11.
 *                    kt_row_to_f32 equals d16 * q (exact: <= 19 bits).
 *   matmul           against a double loop over the exactly decoded weights:
 *                    |y - ref| <= 1e-5 * sum_c |x[c] * w[c]|; bit-identity
 *                    (memcmp) of a row alone vs in a batch, portable vs
 *                    AVX-512, 1 vs 2 threads.
 *   embed            quantized tables: exactly kt_row_to_f32 of the row and
 *                    the independent decode.
 * K-quants (Q4_K, Q5_K, Q6_K; super-blocks of 256):
 *   known blocks     blocks built by an encoder written here from the layout
 *                    (chosen f16 d/dmin, 6-bit scales and mins, codes;
 *                    extremes and random), kt_row_to_f32 exactly equal to
 *                    the fp32 rounding of the exact value computed from the
 *                    chosen parameters; the independent byte decoder
 *                    (ref_weight) equal to it too.
 *   device decoder   kernels/cuda/kq.h (the CUDA kernels' decoder, built
 *                    here as C): weight by weight and a sub-block at once,
 *                    bit-identical to kt_row_to_f32 on the known blocks
 *                    and quantized rows, in bounds (ASan).
 *   round trip       kt_quantize_q4_k/q5_k/q6_k on random rows with
 *                    sub-block magnitudes over many octaves: with d1 =
 *                    d*sc of the weight's sub-block (and dmin for Q4_K/Q5_K)
 *                      |x - w| <= max(d1, dmin)/2 + 2^-20 (|x| + dmin*m + 64 d1)
 *                    and the scales no coarser than needed: d <= max step /
 *                    (63 or 127) * (1 + 2^-9) + 2^-24, d1 <= step + d.
 *   matmul, embed    as for Q8_0/Q4_0 (reference, batch invariance, paths
 *                    bit-identical), on rows of 256..16384 weights.
 * Every output buffer is poisoned with NaN first.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <cmocka.h>

#include "tests/unit/testutil.h"

#include "kernels/backend.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cuda/kq.h"

#define N_ELEMS(a) (sizeof(a) / sizeof((a)[0]))

/* ---- helpers ------------------------------------------------------------ */


/* Independent exact f16 decoder (no code under test). */
static double ref_f16(uint16_t h)
{
	int sign = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
	double v;
	if (e == 0)
		v = ldexp(m, -24);
	else if (e == 31)
		v = m ? NAN : INFINITY;
	else
		v = ldexp(1024 + m, e - 25);
	return sign ? -v : v;
}

static uint16_t le16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

/* Sub-block j's 6-bit scale and min from the 12 packed bytes of a Q4_K /
 * Q5_K super-block, bit by bit as the layout states: j < 4 in the low six
 * bits of bytes j (scale) and j+4 (min); j >= 4 with the low four bits in
 * byte j+4 (scale low nibble, min high nibble) and the top two in the top
 * two bits of bytes j-4 (scale) and j (min). */
static void ref_k_scale(const uint8_t *s, int j, int *sc, int *m)
{
	*sc = *m = 0;
	for (int bit = 0; bit < 6; bit++) {
		int bs, bm;
		if (j < 4) {
			bs = (s[j] >> bit) & 1;
			bm = (s[j + 4] >> bit) & 1;
		} else if (bit < 4) {
			bs = (s[j + 4] >> bit) & 1;
			bm = (s[j + 4] >> (4 + bit)) & 1;
		} else {
			bs = (s[j - 4] >> (6 + bit - 4)) & 1;
			bm = (s[j] >> (6 + bit - 4)) & 1;
		}
		*sc |= bs << bit;
		*m |= bm << bit;
	}
}

/* Weight i (< 256) of one K-quant super-block, decoded in double. */
static double ref_k_weight(enum kt_dtype dt, const uint8_t *blk, size_t i)
{
	if (dt == KT_Q6_K) {
		int half = (int)i / 128, k = (int)i % 128 / 32, l = (int)i % 32;
		int lo = blk[64 * half + l + (k % 2) * 32];
		lo = k < 2 ? lo % 16 : lo / 16;
		int hi = blk[128 + 32 * half + l] / (1 << (2 * k)) % 4;
		int8_t sc = (int8_t)blk[192 + i / 16];
		return ref_f16(le16(blk + 208)) * sc * (lo + 16 * hi - 32);
	}
	int j = (int)i / 32, l = (int)i % 32, sc, m;
	ref_k_scale(blk + 4, j, &sc, &m);
	const uint8_t *qs = blk + (dt == KT_Q5_K ? 48 : 16);
	int q = qs[32 * (j / 2) + l];
	q = j % 2 ? q / 16 : q % 16;
	if (dt == KT_Q5_K)
		q += 16 * ((blk[16 + l] >> j) & 1);
	return ref_f16(le16(blk)) * sc * q - ref_f16(le16(blk + 2)) * m;
}

static size_t ref_k_bytes(enum kt_dtype dt)
{
	return dt == KT_Q4_K ? 144 : dt == KT_Q5_K ? 176 : 210;
}

static int is_k(enum kt_dtype dt)
{
	return dt == KT_Q4_K || dt == KT_Q5_K || dt == KT_Q6_K;
}

/* Weight i of a quantized row, decoded independently in double. */
static double ref_weight(enum kt_dtype dt, const uint8_t *row, size_t i)
{
	if (is_k(dt))
		return ref_k_weight(dt, row + i / 256 * ref_k_bytes(dt), i % 256);
	size_t b = i / 32, j = i % 32;
	if (dt == KT_Q8_0) {
		const uint8_t *blk = row + b * 34;
		return ref_f16(le16(blk)) * (int8_t)blk[2 + j];
	}
	const uint8_t *blk = row + b * 18;
	int q = j < 16 ? blk[2 + j] & 15 : blk[2 + j - 16] >> 4;
	return ref_f16(le16(blk)) * (q - 8);
}

static int have_avx512(void)
{
	return cpu_has(CPU_AVX512);
}

static int have_avx2(void)
{
	return cpu_has(CPU_AVX2);
}

static struct backend *g_be1, *g_be2;

/* ---- sizes and names ------------------------------------------------------ */

static void test_row_bytes(void **state)
{
	(void)state;
	assert_int_equal(KT_QBLOCK, 32);
	assert_int_equal(kt_row_bytes(KT_F32, 768), 3072);
	assert_int_equal(kt_row_bytes(KT_F16, 768), 1536);
	assert_int_equal(kt_row_bytes(KT_BF16, 7), 14);
	assert_int_equal(kt_row_bytes(KT_Q8_0, 32), 34);
	assert_int_equal(kt_row_bytes(KT_Q8_0, 768), 24 * 34);
	assert_int_equal(kt_row_bytes(KT_Q4_0, 32), 18);
	assert_int_equal(kt_row_bytes(KT_Q4_0, 768), 24 * 18);
	assert_int_equal(kt_row_bytes(KT_Q4_0, 11008), 344 * 18);
	assert_int_equal(kt_row_bytes(KT_Q8_0, 0), 0);
	assert_int_equal(kt_dtype_size(KT_Q8_0), 0);
	assert_int_equal(kt_dtype_size(KT_Q4_0), 0);
	assert_int_equal(kt_dtype_size(KT_F32), 4);
	assert_true(kt_dtype_is_quant(KT_Q8_0));
	assert_true(kt_dtype_is_quant(KT_Q4_0));
	assert_false(kt_dtype_is_quant(KT_F32));
	assert_false(kt_dtype_is_quant(KT_F16));
	assert_false(kt_dtype_is_quant(KT_BF16));
	assert_string_equal(kt_dtype_name(KT_Q8_0), "q8_0");
	assert_string_equal(kt_dtype_name(KT_Q4_0), "q4_0");
	assert_int_equal(KT_QK_K, 256);
	assert_int_equal(kt_row_bytes(KT_Q4_K, 256), 144);
	assert_int_equal(kt_row_bytes(KT_Q5_K, 256), 176);
	assert_int_equal(kt_row_bytes(KT_Q6_K, 256), 210);
	assert_int_equal(kt_row_bytes(KT_Q4_K, 4096), 16 * 144);
	assert_int_equal(kt_row_bytes(KT_Q5_K, 11008), 43 * 176);
	assert_int_equal(kt_row_bytes(KT_Q6_K, 768), 3 * 210);
	assert_int_equal(kt_block_weights(KT_F16), 1);
	assert_int_equal(kt_block_weights(KT_Q8_0), 32);
	assert_int_equal(kt_block_weights(KT_Q4_0), 32);
	assert_int_equal(kt_block_weights(KT_Q4_K), 256);
	assert_int_equal(kt_block_weights(KT_Q5_K), 256);
	assert_int_equal(kt_block_weights(KT_Q6_K), 256);
	assert_true(kt_dtype_is_quant(KT_Q4_K));
	assert_true(kt_dtype_is_quant(KT_Q5_K));
	assert_true(kt_dtype_is_quant(KT_Q6_K));
	assert_int_equal(kt_dtype_size(KT_Q6_K), 0);
	assert_string_equal(kt_dtype_name(KT_Q4_K), "q4_k");
	assert_string_equal(kt_dtype_name(KT_Q5_K), "q5_k");
	assert_string_equal(kt_dtype_name(KT_Q6_K), "q6_k");
}

/* ---- known blocks --------------------------------------------------------- */

static void expect_bytes(const uint8_t *got, const uint8_t *want, size_t n, const char *what)
{
	for (size_t i = 0; i < n; i++)
		if (got[i] != want[i])
			fail_msg("%s: byte %zu is 0x%02x, want 0x%02x", what, i, got[i], want[i]);
}

static void test_q8_0_known_blocks(void **state)
{
	(void)state;
	float x[64];
	uint8_t got[68], want[68];

	/* all zeros: d = 0, q = 0 */
	memset(x, 0, sizeof(x));
	memset(got, 0xAA, sizeof(got));
	kt_quantize_q8_0(x, got, 32);
	memset(want, 0, 34);
	expect_bytes(got, want, 34, "q8_0 zeros");
	assert_int_equal(got[34], 0xAA);   /* nothing past the block */

	/* one-hot: x[5] = -3 -> d = 3/127, stored as f16 0x260C
	 * (3/127 = 0.0236220 = 2^-6 * 1.511811; mantissa 0.511811 * 1024 =
	 * 524.09 -> 524 = 0x20C; exponent -6 + 15 = 9 -> 0x2400), q[5] = -127 */
	memset(x, 0, sizeof(x));
	x[5] = -3.0f;
	kt_quantize_q8_0(x, got, 32);
	memset(want, 0, 34);
	want[0] = 0x0C;
	want[1] = 0x26;
	want[2 + 5] = 0x81;   /* -127 */
	expect_bytes(got, want, 34, "q8_0 one-hot");

	/* max |x| = 127: d = 1 (f16 0x3C00), q = round half away from zero */
	static const float v[32] = {
		-127, 127, 0.5f, -0.5f, 1.49f, 2.5f, -2.5f, 100.4f,
		3.5f, -3.5f, 0, -0.0f, 126.6f, -126.5f, 7.51f, -7.49f,
		1, 2, 3, 4, 5, 6, 7, 8, -1, -2, -3, -4, -5, -6, -7, 0.49f,
	};
	static const int8_t q[32] = {
		-127, 127, 1, -1, 1, 3, -3, 100,
		4, -4, 0, 0, 127, -127, 8, -7,
		1, 2, 3, 4, 5, 6, 7, 8, -1, -2, -3, -4, -5, -6, -7, 0,
	};
	/* two blocks: the second is the first times -2 (d = 2, f16 0x4000) */
	for (int j = 0; j < 32; j++) {
		x[j] = v[j];
		x[32 + j] = -2 * v[j];
	}
	kt_quantize_q8_0(x, got, 64);
	want[0] = 0x00;
	want[1] = 0x3C;
	want[34] = 0x00;
	want[35] = 0x40;
	for (int j = 0; j < 32; j++) {
		want[2 + j] = (uint8_t)q[j];
		want[36 + j] = (uint8_t)(int8_t)-q[j];
	}
	expect_bytes(got, want, 68, "q8_0 exact values");

	/* dequantized: d * q */
	float w[64];
	poison(w, 64);
	kt_row_to_f32(KT_Q8_0, got, w, 64);
	for (int j = 0; j < 32; j++) {
		assert_true(w[j] == (float)q[j]);
		assert_true(w[32 + j] == -2.0f * q[j]);
	}
}

static void test_q4_0_known_blocks(void **state)
{
	(void)state;
	float x[64];
	uint8_t got[40], want[36];

	/* all zeros: d = 0 / -8 = -0 (f16 0x8000, as GGML writes it), every
	 * code trunc(0 + 8.5) = 8 */
	memset(x, 0, sizeof(x));
	memset(got, 0xAA, sizeof(got));
	kt_quantize_q4_0(x, got, 32);
	want[0] = 0x00;
	want[1] = 0x80;
	memset(want + 2, 0x88, 16);
	expect_bytes(got, want, 18, "q4_0 zeros");
	assert_int_equal(got[18], 0xAA);

	/* one-hot positive: x[20] = 4 -> m = 4, d = -0.5 (f16 0xB800), id = -2;
	 * x[20]: 4 * -2 + 8.5 = 0.5 -> 0 (w = -0.5 * -8 = 4); zeros -> 8.
	 * Weight 20 is the high nibble of byte 4. */
	memset(x, 0, sizeof(x));
	x[20] = 4.0f;
	kt_quantize_q4_0(x, got, 32);
	want[0] = 0x00;
	want[1] = 0xB8;
	memset(want + 2, 0x88, 16);
	want[2 + 4] = 0x08;
	expect_bytes(got, want, 18, "q4_0 one-hot");

	/* m = -8 -> d = 1 (f16 0x3C00), id = 1, q = min(15, trunc(x + 8.5)) */
	static const float v[32] = {
		-8, 7, 0, 1, -1, 0.5f, -0.5f, 3.49f,
		3.5f, 7.6f, -7.5f, -7.51f, 6.5f, -0.51f, 2, -3,
		5, -5, 4, -4, 6, -6, 7.4f, 7.5f, 0.49f, 1.5f, -1.5f, -2.5f, 2.5f, 0, 0, 0,
	};
	static const uint8_t q[32] = {
		0, 15, 8, 9, 7, 9, 8, 11,
		12, 15, 1, 0, 15, 7, 10, 5,
		13, 3, 12, 4, 14, 2, 15, 15, 8, 10, 7, 6, 11, 8, 8, 8,
	};
	memcpy(x, v, sizeof(v));
	kt_quantize_q4_0(x, got, 32);
	want[0] = 0x00;
	want[1] = 0x3C;
	for (int j = 0; j < 16; j++)
		want[2 + j] = (uint8_t)(q[j] | q[j + 16] << 4);
	expect_bytes(got, want, 18, "q4_0 exact values");
	float w[32];
	poison(w, 32);
	kt_row_to_f32(KT_Q4_0, got, w, 32);
	for (int j = 0; j < 32; j++)
		assert_true(w[j] == (float)(q[j] - 8));

	/* the largest magnitude wins with its sign, the first of equals */
	memset(x, 0, sizeof(x));
	x[3] = 2;
	x[9] = -2;
	kt_quantize_q4_0(x, got, 32);
	assert_int_equal(le16(got), 0xB400);   /* d = 2 / -8 = -0.25 */
	assert_int_equal(got[2 + 3] & 15, 0);  /* x[3] = m -> code 0 */
	assert_int_equal(got[2 + 9] & 15, 15); /* -2 * -4 + 8.5 = 16.5 -> clamp */
}

/* ---- K-quant known blocks ---------------------------------------------------- */

/* The parameters of one K-quant super-block. Q4_K/Q5_K: sc[0..7], m[0..7]
 * in 0..63, q in 0..15 / 0..31. Q6_K: sc[0..15] in -128..127, q in 0..63
 * (the weight uses q - 32); dmin unused. */
struct kparams {
	uint16_t d, dmin;
	int sc[16], m[8], q[256];
};

/* The encoder of this test, from the layout: each field placed bit group by
 * bit group into a zeroed block. */
static void kenc(enum kt_dtype dt, const struct kparams *p, uint8_t *blk)
{
	memset(blk, 0, ref_k_bytes(dt));
	if (dt == KT_Q6_K) {
		for (int i = 0; i < 256; i++) {
			int half = i / 128, k = i % 128 / 32, l = i % 32;
			int lo = p->q[i] & 15, hi = p->q[i] >> 4;
			blk[64 * half + 32 * (k & 1) + l] |= (uint8_t)(lo << (k >= 2 ? 4 : 0));
			blk[128 + 32 * half + l] |= (uint8_t)(hi << (2 * k));
		}
		for (int j = 0; j < 16; j++)
			blk[192 + j] = (uint8_t)(int8_t)p->sc[j];
		blk[208] = (uint8_t)p->d;
		blk[209] = (uint8_t)(p->d >> 8);
		return;
	}
	blk[0] = (uint8_t)p->d;
	blk[1] = (uint8_t)(p->d >> 8);
	blk[2] = (uint8_t)p->dmin;
	blk[3] = (uint8_t)(p->dmin >> 8);
	uint8_t *s = blk + 4;
	for (int j = 0; j < 8; j++) {
		if (j < 4) {
			s[j] |= (uint8_t)p->sc[j];
			s[j + 4] |= (uint8_t)p->m[j];
		} else {
			s[j + 4] |= (uint8_t)((p->sc[j] & 15) | (p->m[j] & 15) << 4);
			s[j - 4] |= (uint8_t)((p->sc[j] >> 4) << 6);
			s[j] |= (uint8_t)((p->m[j] >> 4) << 6);
		}
	}
	uint8_t *qs = blk + (dt == KT_Q5_K ? 48 : 16);
	for (int i = 0; i < 256; i++) {
		int j = i / 32, l = i % 32;
		qs[32 * (j / 2) + l] |= (uint8_t)((p->q[i] & 15) << (j % 2 ? 4 : 0));
		if (dt == KT_Q5_K)
			blk[16 + l] |= (uint8_t)((p->q[i] >> 4) << j);
	}
}

/* Weight i from the parameters, exactly (double holds every product and
 * difference for the scales used here). */
static double kparam_weight(enum kt_dtype dt, const struct kparams *p, int i)
{
	if (dt == KT_Q6_K)
		return ref_f16(p->d) * p->sc[i / 16] * (p->q[i] - 32);
	return ref_f16(p->d) * p->sc[i / 32] * p->q[i] - ref_f16(p->dmin) * p->m[i / 32];
}

static const enum kt_dtype k_dtypes[] = { KT_Q4_K, KT_Q5_K, KT_Q6_K };

/* A random finite f16 of exponent field lo..hi (sign random if sgn). */
static uint16_t rand_f16(int lo, int hi, int sgn)
{
	uint16_t h = (uint16_t)(rng_u64() & 0x3ff);
	h |= (uint16_t)((lo + (int)(rng_u64() % (uint64_t)(hi - lo + 1))) << 10);
	if (sgn && rng_u64() % 2)
		h |= 0x8000;
	return h;
}

/* Random parameters of one super-block; kind 0 all zero, 1 all max, 2 max
 * codes under zero scales, 3 subnormal scales, 4 one-hot (at rep), 5
 * negative d, 6 random. */
static void kparams_make(enum kt_dtype dt, int kind, int rep, struct kparams *k)
{
	int qmax = dt == KT_Q4_K ? 15 : dt == KT_Q5_K ? 31 : 63;
	k->d = kind == 0 ? 0 : kind == 3 ? (uint16_t)(1 + rng_u64() % 1023)
	     : kind == 5 ? 0xbc00 : rand_f16(1, 24, 0);
	k->dmin = kind == 0 ? 0 : kind == 3 ? (uint16_t)(rng_u64() % 1024)
		: rand_f16(1, 24, kind == 6);
	for (int j = 0; j < 16; j++) {
		int r = (int)(rng_u64() % 256);
		k->sc[j] = dt == KT_Q6_K ? r - 128 : r % 64;
		if (kind == 1)
			k->sc[j] = dt == KT_Q6_K ? (j % 2 ? 127 : -128) : 63;
		if (kind == 0 || kind == 2)
			k->sc[j] = 0;
	}
	for (int j = 0; j < 8; j++)
		k->m[j] = kind == 1 || kind == 2 ? 63 : kind == 0 ? 0 : (int)(rng_u64() % 64);
	for (int i = 0; i < 256; i++) {
		k->q[i] = (int)(rng_u64() % (uint64_t)(qmax + 1));
		if (kind == 1 || kind == 2)
			k->q[i] = qmax;
		if (kind == 0)
			k->q[i] = 0;
		if (kind == 4)
			k->q[i] = i == (rep * 37) % 256 ? qmax : 0;
	}
}

static void test_kquant_known_blocks(void **state)
{
	(void)state;
	rng_seed(77);
	uint8_t blk[2][256];
	float out[512];
	for (size_t di = 0; di < N_ELEMS(k_dtypes); di++) {
		enum kt_dtype dt = k_dtypes[di];
		for (int rep = 0; rep < 300; rep++) {
			struct kparams p[2];
			for (int b = 0; b < 2; b++) {
				kparams_make(dt, rep < 6 ? rep : 6, rep, &p[b]);
				kenc(dt, &p[b], blk[b]);
			}
			/* two super-blocks in one row */
			uint8_t row[512];
			size_t bb = kt_row_bytes(dt, 256);
			assert_int_equal(bb, ref_k_bytes(dt));
			memcpy(row, blk[0], bb);
			memcpy(row + bb, blk[1], bb);
			poison(out, 512);
			kt_row_to_f32(dt, row, out, 512);
			for (int i = 0; i < 512; i++) {
				double e = kparam_weight(dt, &p[i / 256], i % 256);
				float want = (float)e;
				if (memcmp(&out[i], &want, 4) && !(out[i] == 0 && want == 0))
					fail_msg("%s rep %d weight %d: kt_row_to_f32 %.9g, want %.9g",
						 kt_dtype_name(dt), rep, i, (double)out[i], (double)want);
				double r = ref_weight(dt, row, (size_t)i);
				if (!(r == e))
					fail_msg("%s rep %d weight %d: test decoder %.17g, params %.17g",
						 kt_dtype_name(dt), rep, i, r, e);
			}
		}
	}
}


/* K-quant round trip: the bounds in the header. */
static void quantize(enum kt_dtype dt, const float *x, void *out, size_t n)
{
	switch (dt) {
	case KT_Q8_0: kt_quantize_q8_0(x, out, n); break;
	case KT_Q4_0: kt_quantize_q4_0(x, out, n); break;
	case KT_Q4_K: kt_quantize_q4_k(x, out, n); break;
	case KT_Q5_K: kt_quantize_q5_k(x, out, n); break;
	case KT_Q6_K: kt_quantize_q6_k(x, out, n); break;
	default: fail_msg("not a quantized dtype");
	}
}

/* The CUDA backend's K-quant decoder (kernels/cuda/kq.h, compiled here as
 * C): every weight bit-identical to kt_row_to_f32, reading only its
 * super-block's bytes (each block alone in an allocation of exactly its
 * size: AddressSanitizer catches a read past it), and kq_w_at finding
 * element (r, c) in a matrix of several rows of several super-blocks. */
static void test_kquant_device_decoder(void **state)
{
	(void)state;
	rng_seed(78);
	for (size_t di = 0; di < N_ELEMS(k_dtypes); di++) {
		enum kt_dtype dt = k_dtypes[di];
		size_t bb = kt_row_bytes(dt, 256);
		assert_int_equal(kq_block_bytes(dt), (int)bb);
		for (int rep = 0; rep < 300; rep++) {
			struct kparams p;
			kparams_make(dt, rep < 6 ? rep : 6, rep, &p);
			uint8_t *blk = xmalloc(bb);
			kenc(dt, &p, blk);
			float want[256];
			poison(want, 256);
			kt_row_to_f32(dt, blk, want, 256);
			for (int i = 0; i < 256; i++) {
				float got = kq_at(dt, blk, i);
				if (memcmp(&got, &want[i], 4))
					fail_msg("%s rep %d weight %d: kq_at %.9g, kt_row_to_f32 %.9g",
						 kt_dtype_name(dt), rep, i, (double)got, (double)want[i]);
			}
			/* the matrix-vector kernel's form: a sub-block at once */
			for (int j = 0; j < 8; j++) {
				float sub[32];
				poison(sub, 32);
				kq_sub(dt, blk, j, sub);
				if (memcmp(sub, want + 32 * j, sizeof(sub)))
					fail_msg("%s rep %d sub-block %d: kq_sub differs from kt_row_to_f32",
						 kt_dtype_name(dt), rep, j);
			}
			free(blk);
		}
		int rows = 3, cols = 5 * 256;
		size_t rb = kt_row_bytes(dt, (size_t)cols);
		float *x = xmalloc((size_t)rows * cols * sizeof(float)), *row = xmalloc(cols * sizeof(float));
		for (int i = 0; i < rows * cols; i++)
			x[i] = rng_float(-1.f, 1.f) * (float)(1 + i % 7);
		uint8_t *w = xmalloc(rb * rows);
		quantize(dt, x, w, (size_t)rows * cols);
		for (int r = 0; r < rows; r++) {
			poison(row, (size_t)cols);
			kt_row_to_f32(dt, w + r * rb, row, (size_t)cols);
			for (int c = 0; c < cols; c++) {
				float got = kq_w_at(dt, w, cols, r, c);
				if (memcmp(&got, &row[c], 4))
					fail_msg("%s (%d, %d): kq_w_at %.9g, kt_row_to_f32 %.9g",
						 kt_dtype_name(dt), r, c, (double)got, (double)row[c]);
			}
		}
		free(x);
		free(row);
		free(w);
	}
}

static void k_round_trip(enum kt_dtype dt)
{
	enum { N = 256 * 16 };
	float *x = xmalloc(N * sizeof(float));
	uint8_t *qb = xmalloc(kt_row_bytes(dt, N));
	float *w = xmalloc(N * sizeof(float));
	int sub = dt == KT_Q6_K ? 16 : 32, nq = dt == KT_Q4_K ? 15 : 31;
	int smax_codes = dt == KT_Q6_K ? 127 : 63;
	size_t bb = kt_row_bytes(dt, 256);
	rng_seed(90 + (uint64_t)dt);
	double worst = 0;
	for (int rep = 0; rep < 40; rep++) {
		/* sub-block magnitudes over many octaves (within a super-block
		 * too), offsets to all-positive or all-negative sub-blocks,
		 * all-zero and constant sub-blocks */
		for (int j = 0; j < N / sub; j++) {
			int oct = rep % 2 ? (int)(rng_u64() % 40) - 30 : (int)(rng_u64() % 6) - 3;
			float mag = ldexpf(1, oct);
			int kind = (int)(rng_u64() % 16);
			float off = kind == 1 ? mag : kind == 2 ? -mag : 0;
			float c = rng_float(-mag, mag);
			for (int l = 0; l < sub; l++)
				x[j * sub + l] = kind == 0 ? 0 : kind == 3 ? c
					       : off + rng_float(-mag, mag);
		}
		quantize(dt, x, qb, N);
		poison(w, N);
		kt_row_to_f32(dt, qb, w, N);
		for (int b = 0; b < N / 256; b++) {
			const uint8_t *blk = qb + (size_t)b * bb;
			const float *xb = x + b * 256;
			double d = ref_f16(le16(blk + (dt == KT_Q6_K ? 208 : 0)));
			double dmin = dt == KT_Q6_K ? 0 : ref_f16(le16(blk + 2));
			/* the steps each sub-block needs, and the largest */
			double step[16], stepmax = 0;
			for (int j = 0; j < 256 / sub; j++) {
				double lo = 0, hi = xb[j * sub], amax = 0;
				for (int l = 0; l < sub; l++) {
					lo = fmin(lo, xb[j * sub + l]);
					hi = fmax(hi, xb[j * sub + l]);
					amax = fmax(amax, fabs(xb[j * sub + l]));
				}
				step[j] = dt == KT_Q6_K ? amax / 31 : (hi - lo) / nq;
				stepmax = fmax(stepmax, step[j]);
			}
			if (!(d >= 0 && d <= stepmax / smax_codes * (1 + 0x1p-9) + 0x1p-24))
				fail_msg("%s block %d: d %.9g for largest step %.9g", kt_dtype_name(dt),
					 b, d, stepmax);
			for (int i = 0; i < 256; i++) {
				int j = i / sub, sc, m = 0;
				if (dt == KT_Q6_K)
					sc = (int8_t)blk[192 + j];
				else
					ref_k_scale(blk + 4, j, &sc, &m);
				double d1 = d * sc, m1 = dmin * m;
				if (!(d1 <= step[j] * (1 + 1e-6) + d && d1 >= 0))
					fail_msg("%s block %d sub %d: d*sc %.9g for step %.9g",
						 kt_dtype_name(dt), b, j, d1, step[j]);
				double r = ref_weight(dt, qb, (size_t)(b * 256 + i));
				if (!(w[b * 256 + i] == (float)r))
					fail_msg("%s: kt_row_to_f32 %.9g, decoded %.9g", kt_dtype_name(dt),
						 (double)w[b * 256 + i], r);
				double err = fabs(xb[i] - (double)w[b * 256 + i]);
				double tol = fmax(d1, dmin) / 2 +
					     0x1p-20 * (fabs(xb[i]) + m1 + 64 * d1);
				if (!(err <= tol))
					fail_msg("%s block %d weight %d: x %.9g -> %.9g (d1 %.9g, dmin "
						 "%.9g, m %d) err %.3g > %.3g", kt_dtype_name(dt), b, i,
						 (double)xb[i], (double)w[b * 256 + i], d1, dmin, m, err, tol);
				if (tol > 0)
					worst = fmax(worst, err / tol);
			}
		}
	}
	print_message("%s round trip: worst error %.3f of its bound\n", kt_dtype_name(dt), worst);
	free(x);
	free(qb);
	free(w);
}

static void test_q4_k_round_trip(void **state)
{
	(void)state;
	k_round_trip(KT_Q4_K);
}

static void test_q5_k_round_trip(void **state)
{
	(void)state;
	k_round_trip(KT_Q5_K);
}

static void test_q6_k_round_trip(void **state)
{
	(void)state;
	k_round_trip(KT_Q6_K);
}

/* ---- round trip ------------------------------------------------------------ */

static void round_trip(enum kt_dtype dt)
{
	enum { N = 32 * 64 };
	float *x = xmalloc(N * sizeof(float));
	uint8_t *qb = xmalloc(kt_row_bytes(dt, N));
	float *w = xmalloc(N * sizeof(float));
	rng_seed(dt == KT_Q8_0 ? 7 : 8);
	for (int rep = 0; rep < 50; rep++) {
		/* block scales over many magnitudes, a few all-zero blocks and
		 * blocks with a tiny spread (subnormal f16 scales) */
		for (int b = 0; b < N / 32; b++) {
			float mag = ldexpf(1, (int)(rng_u64() % 40) - 30);
			int kind = (int)(rng_u64() % 16);
			for (int j = 0; j < 32; j++)
				x[b * 32 + j] = kind == 0 ? 0 : rng_float(-mag, mag);
		}
		size_t bb = kt_row_bytes(dt, 32);
		if (dt == KT_Q8_0)
			kt_quantize_q8_0(x, qb, N);
		else
			kt_quantize_q4_0(x, qb, N);
		poison(w, N);
		kt_row_to_f32(dt, qb, w, N);
		for (int b = 0; b < N / 32; b++) {
			const float *xb = x + b * 32;
			const uint8_t *blk = qb + b * bb;
			float amax = 0, m = 0;
			for (int j = 0; j < 32; j++)
				if (fabsf(xb[j]) > amax) {
					amax = fabsf(xb[j]);
					m = xb[j];
				}
			double d = dt == KT_Q8_0 ? amax / 127.0 : m / -8.0;
			double d16 = ref_f16(le16(blk));
			if (fabs(d16 - d) > fabs(d) * 0x1p-11 + 0x1p-25)
				fail_msg("%s block %d: scale %.9g stored as %.9g", kt_dtype_name(dt),
					 b, d, d16);
			for (int j = 0; j < 32; j++) {
				double r = ref_weight(dt, qb + (size_t)b * bb, (size_t)j);
				if (!(w[b * 32 + j] == r))
					fail_msg("%s: kt_row_to_f32 %.9g, decoded %.9g", kt_dtype_name(dt),
						 (double)w[b * 32 + j], r);
				int code = dt == KT_Q8_0 ? (int8_t)blk[2 + j]
					 : (j < 16 ? blk[2 + j] & 15 : blk[2 + j - 16] >> 4) - 8;
				double err = fabs(xb[j] - r);
				double half = fabs(d) / 2 * (1 + 1e-6);
				/* the clamp only ever yields the top code, 15 - 8 */
				int clamped = dt == KT_Q4_0 && code == 7;
				double tol = (clamped ? 2 * half : half) + abs(code) * fabs(d16 - d);
				if (!(err <= tol))
					fail_msg("%s block %d weight %d: x %.9g -> %.9g (code %d, d %.9g) "
						 "err %.3g > %.3g", kt_dtype_name(dt), b, j,
						 (double)xb[j], r, code, d, err, tol);
				if (dt == KT_Q8_0 && fabsf(xb[j]) == amax && amax > 0)
					assert_int_equal(abs(code), 127);
			}
		}
	}
	free(x);
	free(qb);
	free(w);
}

static void test_q8_0_round_trip(void **state)
{
	(void)state;
	round_trip(KT_Q8_0);
}

static void test_q4_0_round_trip(void **state)
{
	(void)state;
	round_trip(KT_Q4_0);
}

/* ---- matmul ---------------------------------------------------------------- */

static const enum kt_dtype q_dtypes[] = { KT_Q8_0, KT_Q4_0 };
static const int q_cols[] = { 32, 64, 96, 320, 768 };
/* 130 x 768 crosses the backend's threading threshold for both dtypes and
 * splits unevenly (72 + 58 rows) over 2 threads; 17 and 37 leave rows
 * after the 8 (batch 1) and 4 (batches) streams. */
static const int q_rows[] = { 1, 3, 9, 17, 37, 130 };
static const int q_ntok[] = { 1, 2, 3, 5, 6, 7, 13 };
#define MAX_TOK 13

struct q_case {
	struct kt_weight w;
	uint8_t *data;
	float *x;       /* (n_x, cols) */
};

/* A random quantized matrix: most rows quantized from random values, some
 * raw random codes under random finite scales (subnormal ones included;
 * Q8_0 code -128, which the quantizer never writes). */
static void q_case_make(struct q_case *c, enum kt_dtype dt, int rows, int cols, int n_x)
{
	size_t bw = kt_block_weights(dt);
	size_t rb = kt_row_bytes(dt, (size_t)cols), bb = kt_row_bytes(dt, bw);
	c->data = xmalloc(rb * rows);
	float *tmp = xmalloc((size_t)cols * sizeof(float));
	for (int r = 0; r < rows; r++) {
		uint8_t *row = c->data + (size_t)r * rb;
		if (rng_u64() % 4) {
			for (int k = 0; k < cols; k++)
				tmp[k] = rng_float(-1, 1);
			quantize(dt, tmp, row, (size_t)cols);
		} else {
			for (size_t i = 0; i < rb; i++)
				row[i] = (uint8_t)rng_u64();
			for (int b = 0; b < cols / (int)bw; b++) {
				/* exponent 0..29: zero/subnormal to 2^14, never inf/nan;
				 * K-quants: d (Q6_K: at byte 208) and dmin, 0..24 */
				int n_h = dt == KT_Q4_K || dt == KT_Q5_K ? 2 : 1;
				size_t at = dt == KT_Q6_K ? 208 : 0;
				for (int k = 0; k < n_h; k++) {
					uint16_t h = (uint16_t)rng_u64() & 0x83ff;
					h |= (uint16_t)((rng_u64() % (is_k(dt) ? 25 : 30)) << 10);
					row[b * bb + at + 2 * k] = (uint8_t)h;
					row[b * bb + at + 2 * k + 1] = (uint8_t)(h >> 8);
				}
			}
		}
	}
	free(tmp);
	c->w = (struct kt_weight){ c->data, dt, rows, cols, NULL };
	c->x = xmalloc((size_t)n_x * cols * sizeof(float));
	for (size_t i = 0; i < (size_t)n_x * cols; i++)
		c->x[i] = rng_float(-1, 1);
}

static void q_case_done(struct q_case *c)
{
	free(c->data);
	free(c->x);
}

static void q_check(const struct q_case *c, const float *y, int n_tok, const char *what)
{
	int R = c->w.rows, K = c->w.cols;
	size_t rb = kt_row_bytes(c->w.dtype, (size_t)K);
	for (int t = 0; t < n_tok; t++)
		for (int r = 0; r < R; r++) {
			double s = 0, sa = 0;
			for (int k = 0; k < K; k++) {
				double p = (double)c->x[(size_t)t * K + k] *
					   ref_weight(c->w.dtype, c->data + (size_t)r * rb, (size_t)k);
				s += p;
				sa += fabs(p);
			}
			double g = y[(size_t)t * R + r];
			if (!(fabs(g - s) <= 1e-5 * sa + 1e-30))
				fail_msg("%s %s rows %d cols %d n_tok %d: y[%d][%d] = %.9g, ref %.9g "
					 "(tol %.3g)", what, kt_dtype_name(c->w.dtype), R, K, n_tok,
					 t, r, g, s, 1e-5 * sa);
		}
}

/* path: 0 rows portable, 1 rows avx512, 2 backend 1 thread, 3 backend 2,
 * 4 rows avx2 */
static void q_run(int path, float *y, const float *x, const struct kt_weight *w, int n_tok)
{
	poison(y, (size_t)n_tok * w->rows);
	switch (path) {
	case 0: cpu_matmul_rows(0, y, x, w, n_tok, 0, w->rows); break;
	case 1: cpu_matmul_rows(1, y, x, w, n_tok, 0, w->rows); break;
	case 2: g_be1->ops->matmul(g_be1, y, x, w, n_tok); break;
	case 3: g_be2->ops->matmul(g_be2, y, x, w, n_tok); break;
	case 4: cpu_matmul_rows(CPU_ISA_AVX2, y, x, w, n_tok, 0, w->rows); break;
	}
}

static const char *const path_name[] = { "rows(portable)", "rows(avx512)",
					  "backend(1)", "backend(2)", "rows(avx2)" };

/* 1 if the rows path p (0, 1 or 4) runs on this CPU */
static int path_here(int p)
{
	return p == 1 ? have_avx512() : p == 4 ? have_avx2() : 1;
}

static void expect_same(const float *a, const float *b, size_t n, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static void expect_same(const float *a, const float *b, size_t n, const char *fmt, ...)
{
	if (memcmp(a, b, n * sizeof(float)) == 0)
		return;
	char msg[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	for (size_t i = 0; i < n; i++)
		if (memcmp(&a[i], &b[i], sizeof(float)))
			fail_msg("%s: element %zu: %.9g vs %.9g", msg, i, (double)a[i], (double)b[i]);
}

/* Every shape: each token alone vs the reference, then every n_tok vs the
 * reference with each row bit-identical to the same row alone. */
static void q_path_dtypes(int path, const enum kt_dtype *dts, size_t n_dt, const int *cols,
			  size_t n_cols)
{
	rng_seed(200 + (uint64_t)path);
	for (size_t di = 0; di < n_dt; di++)
		for (size_t ci = 0; ci < n_cols; ci++)
			for (size_t ri = 0; ri < N_ELEMS(q_rows); ri++) {
				struct q_case c;
				int R = q_rows[ri], K = cols[ci];
				q_case_make(&c, dts[di], R, K, MAX_TOK);
				float *y = xmalloc((size_t)MAX_TOK * R * sizeof(float));
				float *y1 = xmalloc((size_t)MAX_TOK * R * sizeof(float));
				for (int t = 0; t < MAX_TOK; t++)
					q_run(path, y1 + (size_t)t * R, c.x + (size_t)t * K, &c.w, 1);
				q_check(&c, y1, MAX_TOK, path_name[path]);
				for (size_t ti = 0; ti < N_ELEMS(q_ntok); ti++) {
					int nt = q_ntok[ti];
					q_run(path, y, c.x, &c.w, nt);
					q_check(&c, y, nt, path_name[path]);
					expect_same(y1, y, (size_t)nt * R,
						    "%s %s rows %d cols %d: rows alone vs batch of %d",
						    path_name[path], kt_dtype_name(c.w.dtype), R, K, nt);
				}
				free(y);
				free(y1);
				q_case_done(&c);
			}
}

static void q_path_all(int path)
{
	q_path_dtypes(path, q_dtypes, N_ELEMS(q_dtypes), q_cols, N_ELEMS(q_cols));
}

static const int k_cols[] = { 256, 512, 768, 1280 };

static void k_path_all(int path)
{
	q_path_dtypes(path, k_dtypes, N_ELEMS(k_dtypes), k_cols, N_ELEMS(k_cols));
}

static void test_matmul_k_portable(void **state)
{
	(void)state;
	k_path_all(0);
}

static void test_matmul_k_avx512(void **state)
{
	(void)state;
	if (!have_avx512())
		skip();
	k_path_all(1);
}

static void test_matmul_k_avx2(void **state)
{
	(void)state;
	SKIP_WITHOUT(have_avx2(), "AVX2+FMA+F16C");
	k_path_all(4);
}

static void test_matmul_k_backend_1thread(void **state)
{
	(void)state;
	k_path_all(2);
}

static void test_matmul_k_backend_2threads(void **state)
{
	(void)state;
	k_path_all(3);
}

static void test_matmul_q_portable(void **state)
{
	(void)state;
	q_path_all(0);
}

static void test_matmul_q_avx512(void **state)
{
	(void)state;
	if (!have_avx512())
		skip();
	q_path_all(1);
}

static void test_matmul_q_avx2(void **state)
{
	(void)state;
	SKIP_WITHOUT(have_avx2(), "AVX2+FMA+F16C");
	q_path_all(4);
}

/* The AVX2 exact path against the portable one, bit for bit: every dtype,
 * rows 1..9 (the 4-stream batch-1 tiles and their one-row rest, the 4-row
 * blocks and 2-row tiles of batches), widths of 1 to 17 blocks (K-quants 1,
 * 2, 3 super-blocks: a 256-column tail past the 512-column chunk), every
 * n_tok 1..9 (3-token tiles and the 2- and 1-token rests); each split of
 * the rows in two. */
static void test_matmul_q_avx2_bits(void **state)
{
	(void)state;
	SKIP_WITHOUT(have_avx2(), "AVX2+FMA+F16C");
	static const enum kt_dtype dts[] = { KT_Q8_0, KT_Q4_0, KT_Q4_K, KT_Q5_K, KT_Q6_K };
	static const int qcols[] = { 32, 64, 96, 544 }, kcols[] = { 256, 512, 768 };
	rng_seed(310);
	for (size_t di = 0; di < N_ELEMS(dts); di++)
		for (int ci = 0; ci < (is_k(dts[di]) ? 3 : 4); ci++)
			for (int R = 1; R <= 9; R++) {
				int K = is_k(dts[di]) ? kcols[ci] : qcols[ci];
				struct q_case c;
				q_case_make(&c, dts[di], R, K, 9);
				size_t n = (size_t)9 * R;
				float *a = xmalloc(n * sizeof(float)), *b = xmalloc(n * sizeof(float));
				for (int nt = 1; nt <= 9; nt++) {
					q_run(0, a, c.x, &c.w, nt);
					q_run(4, b, c.x, &c.w, nt);
					expect_same(a, b, (size_t)nt * R, "avx2 %s %d x %d n_tok %d vs portable",
						    kt_dtype_name(c.w.dtype), R, K, nt);
				}
				for (int cut = 1; cut < R; cut++)
					for (int nt = 1; nt <= 9; nt += 8) {
						q_run(0, a, c.x, &c.w, nt);
						poison(b, n);
						cpu_matmul_rows(CPU_ISA_AVX2, b, c.x, &c.w, nt, 0, cut);
						cpu_matmul_rows(CPU_ISA_AVX2, b, c.x, &c.w, nt, cut, R);
						expect_same(a, b, (size_t)nt * R, "avx2 %s %d x %d n_tok %d: rows "
							    "split at %d", kt_dtype_name(c.w.dtype), R, K, nt, cut);
					}
				free(a);
				free(b);
				q_case_done(&c);
			}
}

static void test_matmul_q_backend_1thread(void **state)
{
	(void)state;
	q_path_all(2);
}

static void test_matmul_q_backend_2threads(void **state)
{
	(void)state;
	q_path_all(3);
}

/* Portable == AVX-512 == 1 thread == 2 threads, bit for bit, on shapes that
 * reach every tile: batch-1 streams with pipelined scales (and without:
 * more than 512 blocks a row), the 4-row and 1-row tails, batches over the
 * 64-token group and the 512-column chunk; a row range starting mid-matrix
 * (a thread's share). */
struct q_shape {
	int rows, cols, ntok;
};

static void paths_identical(const enum kt_dtype *dts, size_t n_dt, const struct q_shape *shapes,
			    size_t n_shapes)
{
	static const int isa_of[5] = { CPU_ISA_PORTABLE, CPU_ISA_AVX512, -1, -1, CPU_ISA_AVX2 };
	rng_seed(300);
	for (size_t di = 0; di < n_dt; di++)
		for (size_t si = 0; si < n_shapes; si++) {
			int R = shapes[si].rows, K = shapes[si].cols, T = shapes[si].ntok;
			struct q_case c;
			q_case_make(&c, dts[di], R, K, T);
			size_t n = (size_t)T * R;
			float *y[5];
			for (int p = 0; p < 5; p++) {
				y[p] = xmalloc(n * sizeof(float));
				if (!path_here(p))
					continue;
				q_run(p, y[p], c.x, &c.w, T);
			}
			for (int p = 1; p < 5; p++) {
				if (!path_here(p))
					continue;
				expect_same(y[0], y[p], n, "%s %d x %d, n_tok %d: %s vs %s",
					    kt_dtype_name(c.w.dtype), R, K, T, path_name[0],
					    path_name[p]);
			}
			if (R * K <= 130 * 2048 && T <= 4)
				q_check(&c, y[0], T, "portable");
			/* a sub-range, as a thread would compute it */
			for (int p = 0; p < 5; p++) {
				if (isa_of[p] < 0 || !path_here(p))
					continue;
				float *ys = xmalloc(n * sizeof(float));
				poison(ys, n);
				int r0 = R / 3, r1 = R - R / 5;
				cpu_matmul_rows(isa_of[p], ys, c.x, &c.w, T, r0, r1);
				for (int t = 0; t < T; t++)
					expect_same(y[0] + (size_t)t * R + r0, ys + (size_t)t * R + r0,
						    (size_t)(r1 - r0), "%s %d x %d: rows [%d, %d) alone, %s",
						    kt_dtype_name(c.w.dtype), R, K, r0, r1, path_name[p]);
				free(ys);
			}
			for (int p = 0; p < 5; p++)
				free(y[p]);
			q_case_done(&c);
		}
}

static void test_matmul_q_paths_identical(void **state)
{
	(void)state;
	static const struct q_shape shapes[] = {
		{ 64, 768, 1 }, { 67, 768, 1 }, { 1000, 768, 1 }, { 21, 16416, 1 },
		{ 13, 1024, 2 }, { 19, 544, 70 }, { 300, 768, 4 }, { 9, 16416, 3 },
		{ 130, 2048, 128 },
	};
	paths_identical(q_dtypes, N_ELEMS(q_dtypes), shapes, N_ELEMS(shapes));
}

/* The same for the K-quants: chunks of 512 columns with a 256 tail, rows
 * over 16384 weights, batches over the 64-token group. */
static void test_matmul_k_paths_identical(void **state)
{
	(void)state;
	static const struct q_shape shapes[] = {
		{ 64, 768, 1 }, { 67, 1280, 1 }, { 300, 768, 1 }, { 9, 16640, 1 },
		{ 13, 1024, 2 }, { 19, 512, 70 }, { 300, 768, 4 }, { 9, 16640, 3 },
		{ 130, 2048, 128 },
	};
	paths_identical(k_dtypes, N_ELEMS(k_dtypes), shapes, N_ELEMS(shapes));
}

/* ---- packed weights, 8-bit activations (kernels/cpu/qdot.c) ------------
 *
 * Paths: 4 portable, 5 AVX512-VNNI (cpu_qx_quantize + cpu_qpack_rows), 6 and
 * 7 the 1- and 2-thread backends on a weight placed for matmul (they pack
 * where the CPU has VNNI or AVX2), 8 AVX2. Bounds, with
 * x^ the activations as quantized (dx * xq, decoded here from the bytes the
 * portable quantizer wrote):
 *   vs sum_k w_k x^_k (double):  |y - ref^| <= 1e-5 * sum |w x^|
 *   vs sum_k w_k x_k  (double):  |y - ref| <= sum_b dx_b/2 * sum_{k in b} |w_k|
 *                                             + 1e-5 * sum |w x|
 * (the second is the activation rounding's worst case); paths 5-7
 * bit-identical to 4, a token alone bit-identical to it in a batch, and a
 * group range computed alone identical to the whole.
 */

static int have_vnni(void)
{
#if defined(__x86_64__)
	return cpu_has(CPU_VNNI) && have_avx512();
#else
	return 0;
#endif
}

/* The backends pack quantized weights (and use the 8-bit kernels). */
static int backends_pack(void)
{
	return have_vnni() || have_avx2();
}

/* The kernel isa of packed path 4, 5 or 8, or -1 if this CPU lacks it. */
static int packed_isa(int path)
{
	switch (path) {
	case 4: return CPU_ISA_PORTABLE;
	case 5: return have_vnni() ? CPU_ISA_AVX512 : -1;
	case 8: return have_avx2() ? CPU_ISA_AVX2 : -1;
	}
	return -1;
}

static uint8_t *qx_alloc(int n_tok, int cols)
{
	void *p = NULL;
	if (posix_memalign(&p, 64, (size_t)n_tok * cpu_qx_row_bytes(cols)))
		fail_msg("out of memory");
	return p;
}

/* y = x W^T through path 4-8; returns 0, or -1 when the path is missing
 * here (no VNNI or no AVX2; neither: the backends do not pack). */
static int qp_run(int path, float *y, const float *x, const struct kt_weight *w, int n_tok)
{
	poison(y, (size_t)n_tok * w->rows);
	if (path == 6 || path == 7) {
		if (!backends_pack())
			return -1;
		struct backend *be = path == 6 ? g_be1 : g_be2;
		struct kt_weight pw;
		assert_int_equal(be->ops->weight_place(be, &pw, w, KT_USE_MATMUL), 0);
		if (!pw.pack)
			fail_msg("%s placed for matmul without a packed form", kt_dtype_name(w->dtype));
		be->ops->matmul(be, y, x, &pw, n_tok);
		be->ops->weight_release(be, &pw);
		assert_null(pw.pack);
		return 0;
	}
	int isa = packed_isa(path);
	if (isa < 0)
		return -1;
	struct cpu_qpack *p;
	assert_int_equal(cpu_qpack_new(w, NULL, &p), 0);
	uint8_t *qx = qx_alloc(n_tok, w->cols);
	cpu_qx_quantize(isa, qx, x, w->cols, 0, n_tok);
	cpu_qpack_rows(isa, y, qx, p, n_tok, 0, cpu_qpack_groups(p));
	free(qx);
	cpu_qpack_free(p);
	return 0;
}

static void qp_check(const struct q_case *c, const float *y, int n_tok)
{
	int R = c->w.rows, K = c->w.cols, nb = K / 32;
	size_t rb = kt_row_bytes(c->w.dtype, (size_t)K);
	uint8_t *qx = qx_alloc(n_tok, K);
	cpu_qx_quantize(0, qx, c->x, K, 0, n_tok);
	for (int t = 0; t < n_tok; t++) {
		const uint8_t *qr = qx + (size_t)t * cpu_qx_row_bytes(K);
		float dx[1024];
		memcpy(dx, qr + K, (size_t)nb * sizeof(float));
		for (int r = 0; r < R; r++) {
			double s = 0, sa = 0, sh = 0, sha = 0, bound = 0;
			for (int k = 0; k < K; k++) {
				double w = ref_weight(c->w.dtype, c->data + (size_t)r * rb, (size_t)k);
				double xt = c->x[(size_t)t * K + k];
				double xh = (double)dx[k / 32] * (int8_t)qr[k];
				s += w * xt;
				sa += fabs(w * xt);
				sh += w * xh;
				sha += fabs(w * xh);
				bound += fabs(w) * dx[k / 32] / 2;
			}
			double g = y[(size_t)t * R + r];
			if (!(fabs(g - sh) <= 1e-5 * sha + 1e-30))
				fail_msg("packed %s %d x %d n_tok %d: y[%d][%d] = %.9g, ref with the "
					 "quantized activations %.9g (tol %.3g)", kt_dtype_name(c->w.dtype),
					 R, K, n_tok, t, r, g, sh, 1e-5 * sha);
			if (!(fabs(g - s) <= bound + 1e-5 * sa + 1e-30))
				fail_msg("packed %s %d x %d n_tok %d: y[%d][%d] = %.9g, ref %.9g "
					 "(activation bound %.3g)", kt_dtype_name(c->w.dtype), R, K,
					 n_tok, t, r, g, s, bound);
		}
	}
	free(qx);
}

static void test_packed_matmul(void **state)
{
	(void)state;
	static const enum kt_dtype dts[] = { KT_Q8_0, KT_Q4_0, KT_Q4_K, KT_Q5_K, KT_Q6_K };
	static const int rows[] = { 1, 17, 37, 130 }, ntok[] = { 1, 2, 3, 5, 7, 9 };
	rng_seed(400);
	for (size_t di = 0; di < N_ELEMS(dts); di++)
		for (int ci = 0; ci < 2; ci++)
			for (size_t ri = 0; ri < N_ELEMS(rows); ri++) {
				int R = rows[ri], K = is_k(dts[di]) ? (ci ? 1280 : 256) : (ci ? 800 : 64);
				struct q_case c;
				q_case_make(&c, dts[di], R, K, 9);
				float *y1 = xmalloc((size_t)9 * R * sizeof(float));
				float *y = xmalloc((size_t)9 * R * sizeof(float));
				for (int t = 0; t < 9; t++)
					qp_run(4, y1 + (size_t)t * R, c.x + (size_t)t * K, &c.w, 1);
				qp_check(&c, y1, 9);
				for (int path = 4; path <= 8; path++)
					for (size_t ti = 0; ti < N_ELEMS(ntok); ti++) {
						if (qp_run(path, y, c.x, &c.w, ntok[ti]))
							continue;
						expect_same(y1, y, (size_t)ntok[ti] * R,
							    "packed %s %d x %d path %d: alone vs batch of %d",
							    kt_dtype_name(c.w.dtype), R, K, path, ntok[ti]);
					}
				free(y);
				free(y1);
				q_case_done(&c);
			}
}

/* Group ranges alone equal the whole (a thread's share), in both kernels,
 * on batches that reach every tile (4 groups x 1 token, 2 x 4, 1 x 4 and
 * the one-token tails). */
static void test_packed_group_range(void **state)
{
	(void)state;
	static const enum kt_dtype dts[] = { KT_Q8_0, KT_Q4_0, KT_Q4_K, KT_Q5_K, KT_Q6_K };
	rng_seed(401);
	for (size_t di = 0; di < N_ELEMS(dts); di++) {
		const int R = 16 * 11 + 5, K = 512, T = 7;
		struct q_case c;
		q_case_make(&c, dts[di], R, K, T);
		struct cpu_qpack *p;
		assert_int_equal(cpu_qpack_new(&c.w, NULL, &p), 0);
		assert_int_equal(cpu_qpack_groups(p), 12);
		uint8_t *qx = qx_alloc(T, K);
		cpu_qx_quantize(0, qx, c.x, K, 0, T);
		float *y = xmalloc((size_t)T * R * sizeof(float));
		float *ys = xmalloc((size_t)T * R * sizeof(float));
		for (int path = 4; path <= 8; path += 4) {
			int v = packed_isa(path);
			if (v < 0)
				continue;
			for (int nt = 1; nt <= T; nt += T - 1) {
				poison(y, (size_t)T * R);
				poison(ys, (size_t)T * R);
				cpu_qpack_rows(v, y, qx, p, nt, 0, 12);
				cpu_qpack_rows(v, ys, qx, p, nt, 0, 3);
				cpu_qpack_rows(v, ys, qx, p, nt, 3, 9);
				cpu_qpack_rows(v, ys, qx, p, nt, 9, 12);
				expect_same(y, ys, (size_t)nt * R, "packed %s isa %d n_tok %d: group ranges",
					    kt_dtype_name(c.w.dtype), v, nt);
			}
		}
		if (have_vnni()) {
			/* the VNNI kernel over the same ranges */
			for (int nt = 1; nt <= T; nt += T - 1) {
				poison(y, (size_t)T * R);
				poison(ys, (size_t)T * R);
				cpu_qpack_rows(CPU_ISA_AVX512, y, qx, p, nt, 0, 12);
				cpu_qpack_rows(CPU_ISA_AVX512, ys, qx, p, nt, 0, 3);
				cpu_qpack_rows(CPU_ISA_AVX512, ys, qx, p, nt, 3, 9);
				cpu_qpack_rows(CPU_ISA_AVX512, ys, qx, p, nt, 9, 12);
				expect_same(y, ys, (size_t)nt * R, "packed %s vnni n_tok %d: group ranges",
					    kt_dtype_name(c.w.dtype), nt);
			}
		}
		free(ys);
		free(y);
		free(qx);
		cpu_qpack_free(p);
		q_case_done(&c);
	}
}

/* be's matmul of the placed pw (2 tokens of c) gives the exact path's
 * bits (q_run path 2). */
static void expect_unpacked(struct backend *be, const struct kt_weight *pw, const struct q_case *c,
			    const char *what)
{
	float *y = xmalloc((size_t)2 * c->w.rows * sizeof(float));
	float *ye = xmalloc((size_t)2 * c->w.rows * sizeof(float));
	poison(y, (size_t)2 * c->w.rows);
	be->ops->matmul(be, y, c->x, pw, 2);
	q_run(2, ye, c->x, &c->w, 2);
	expect_same(ye, y, (size_t)2 * c->w.rows, what);
	free(y);
	free(ye);
}

/* Out of memory while packing: the weight is placed unpacked (the exact
 * path serves it, same results as an unplaced weight), the backend stops
 * packing and its description says so. Not under AddressSanitizer, whose
 * shadow memory an address-space limit breaks. */
static void test_packed_out_of_memory(void **state)
{
	(void)state;
#if defined(__SANITIZE_ADDRESS__)
	skip();
#else
	SKIP_WITHOUT(backends_pack(), "AVX512-VNNI or AVX2 (no packing)");
	struct backend *be = backend_cpu_new(1);
	assert_non_null(be);
	struct q_case c;
	rng_seed(403);
	q_case_make(&c, KT_Q4_0, 16 * 64, 4096, 2);
	struct rlimit old, lim;
	assert_int_equal(getrlimit(RLIMIT_AS, &old), 0);
	FILE *f = fopen("/proc/self/statm", "r");
	unsigned long pages = 0;
	assert_non_null(f);
	assert_int_equal(fscanf(f, "%lu", &pages), 1);
	fclose(f);
	/* room for a little more than now, not for the 2.4 MB packed copy */
	lim.rlim_cur = (rlim_t)pages * 4096 + (1u << 20);
	lim.rlim_max = old.rlim_max;
	assert_int_equal(setrlimit(RLIMIT_AS, &lim), 0);
	struct kt_weight pw;
	int rc = be->ops->weight_place(be, &pw, &c.w, KT_USE_MATMUL);
	assert_int_equal(setrlimit(RLIMIT_AS, &old), 0);
	assert_int_equal(rc, 0);
	assert_null(pw.pack);
	assert_non_null(strstr(be->desc, "out of memory packing"));
	expect_unpacked(be, &pw, &c, "unpacked after out of memory");
	be->ops->weight_release(be, &pw);
	q_case_done(&c);
	backend_free(be);
#endif
}

/* matmul_n (q, k, v; gate, up): the products of weights sharing their
 * input in one job give the bits of matmul on each, on 1 and 2 threads,
 * for a token alone and for batches; with one of them unpacked (the exact
 * path) each goes through matmul. */
static void test_packed_matmul_n(void **state)
{
	(void)state;
	static const enum kt_dtype dts[] = { KT_Q8_0, KT_Q4_0, KT_Q4_K, KT_Q6_K };
	const int rows[3] = { 16 * 40, 16 * 9 + 5, 16 * 3 };
	for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); d++) {
		struct q_case c[3];
		rng_seed(405 + (unsigned)d);
		for (int i = 0; i < 3; i++)
			q_case_make(&c[i], dts[d], rows[i], 512, 13);
		for (int bi = 0; bi < 2; bi++) {
			struct backend *be = bi ? g_be2 : g_be1;
			assert_non_null(be->ops->matmul_n);
			struct kt_weight pw[3];
			for (int i = 0; i < 3; i++)
				assert_int_equal(be->ops->weight_place(be, &pw[i], &c[i].w,
									KT_USE_MATMUL), 0);
			assert_int_equal(be->ops->reserve(be, 64, 13), 0);
			for (int unpacked = 0; unpacked <= 1; unpacked++) {
				struct cpu_qpack *keep = pw[1].pack;
				if (unpacked)
					pw[1].pack = NULL;
				for (int n = 1; n <= 3; n++) {
					for (int nt = 1; nt <= 13; nt += 6) {
						float *y[3], *ye[3];
						const struct kt_weight *w[3] = { &pw[0], &pw[1], &pw[2] };
						for (int i = 0; i < n; i++) {
							size_t ny = (size_t)nt * rows[i];
							y[i] = xmalloc(ny * sizeof(float));
							ye[i] = xmalloc(ny * sizeof(float));
							poison(y[i], ny);
							poison(ye[i], ny);
							be->ops->matmul(be, ye[i], c[0].x, w[i], nt);
						}
						be->ops->matmul_n(be, n, y, w, c[0].x, nt);
						for (int i = 0; i < n; i++) {
							expect_same(ye[i], y[i], (size_t)nt * rows[i],
								    "matmul_n against matmul");
							free(y[i]);
							free(ye[i]);
						}
					}
				}
				pw[1].pack = keep;
			}
			for (int i = 0; i < 3; i++)
				be->ops->weight_release(be, &pw[i]);
		}
		for (int i = 0; i < 3; i++)
			q_case_done(&c[i]);
	}
}

/* A packed copy the system has no memory for (MemAvailable, here
 * LLAMAD_CPU_MEM_AVAILABLE) is not made: that weight and the ones placed
 * after it stay unpacked and give the exact path's bits, and the
 * description says so; with 1 MiB more than the copy and its 64 MiB spare,
 * the weight is packed. */
static void test_packed_memory_available(void **state)
{
	(void)state;
	SKIP_WITHOUT(backends_pack(), "AVX512-VNNI or AVX2 (no packing)");
	const char *e = getenv("LLAMAD_CPU_MEM_AVAILABLE");
	char *saved = e ? strdup(e) : NULL;
	struct q_case c;
	rng_seed(404);
	q_case_make(&c, KT_Q4_0, 16 * 64, 4096, 2);
	size_t need = cpu_qpack_size(&c.w), spare = (size_t)64 << 20;
	assert_true(need >= (size_t)16 * 64 * 4096 / 2);
	char v[32];
	for (int fits = 0; fits <= 1; fits++) {
		snprintf(v, sizeof v, "%zu", need + spare + (fits ? 1u << 20 : 0) - 1);
		assert_int_equal(setenv("LLAMAD_CPU_MEM_AVAILABLE", v, 1), 0);
		struct backend *be = backend_cpu_new(1);
		assert_non_null(be);
		struct kt_weight pw, pw2;
		assert_int_equal(be->ops->weight_place(be, &pw, &c.w, KT_USE_MATMUL), 0);
		assert_int_equal(pw.pack != NULL, fits);
		assert_int_equal(strstr(be->desc, "no memory for packing: exact path") != NULL, !fits);
		if (!fits) {
			/* the next weight too, whatever the memory says now */
			assert_int_equal(setenv("LLAMAD_CPU_MEM_AVAILABLE", "0", 1), 0);
			assert_int_equal(be->ops->weight_place(be, &pw2, &c.w, KT_USE_MATMUL), 0);
			assert_null(pw2.pack);
			be->ops->weight_release(be, &pw2);
			expect_unpacked(be, &pw, &c, "unpacked for want of memory");
		}
		be->ops->weight_release(be, &pw);
		backend_free(be);
	}
	assert_int_equal(saved ? setenv("LLAMAD_CPU_MEM_AVAILABLE", saved, 1)
			       : unsetenv("LLAMAD_CPU_MEM_AVAILABLE"), 0);
	free(saved);
	q_case_done(&c);
}

/* The activation quantizer: the vector code writes the portable code's
 * bytes; known values: ties round to even, the block's largest magnitude
 * maps to +-127, zeros to a zero scale. */
static void test_packed_quantize_x(void **state)
{
	(void)state;
	enum { K = 96 };
	float x[3 * K];
	rng_seed(402);
	for (int i = 0; i < K; i++)
		x[i] = rng_float(-5, 5);
	for (int i = 0; i < 32; i++) {   /* block 0 of token 1: dx = 1 exactly */
		x[K + i] = (float)(i % 8) - 3.5f;
		x[2 * K + i] = 0;
	}
	x[K + 31] = 127;
	for (int i = 32; i < K; i++) {
		x[K + i] = rng_float(-1e-3f, 1e-3f);
		x[2 * K + i] = rng_float(-1e6f, 1e6f);
	}
	size_t rb = cpu_qx_row_bytes(K);
	uint8_t *a = qx_alloc(3, K), *b = qx_alloc(3, K);
	memset(a, 0, 3 * rb);
	memset(b, 0, 3 * rb);
	cpu_qx_quantize(0, a, x, K, 0, 3);
	if (have_vnni()) {
		cpu_qx_quantize(CPU_ISA_AVX512, b, x, K, 0, 3);
		assert_memory_equal(a, b, 3 * rb);
	}
	if (have_avx2()) {
		memset(b, 0, 3 * rb);
		cpu_qx_quantize(CPU_ISA_AVX2, b, x, K, 0, 3);
		assert_memory_equal(a, b, 3 * rb);
	}
	const int8_t *q = (const int8_t *)(a + rb);
	float d;
	memcpy(&d, a + rb + K, 4);
	assert_true(d == 1.0f);
	for (int i = 0; i < 31; i++) {
		int want = (int)lrint((double)(i % 8) - 3.5);   /* to even */
		if (q[i] != want)
			fail_msg("x %g: code %d, want %d", (double)x[K + i], q[i], want);
	}
	assert_int_equal(q[31], 127);
	int32_t sums[2];
	memcpy(sums, a + rb + K + 3 * 4, 4);       /* sl of block 0 */
	memcpy(sums + 1, a + rb + K + 6 * 4, 4);   /* sh of block 0 */
	int want_l = 0, want_h = 0;
	for (int i = 0; i < 32; i++)
		*(i < 16 ? &want_l : &want_h) += q[i];
	assert_int_equal(sums[0], want_l);
	assert_int_equal(sums[1], want_h);
	memcpy(&d, a + 2 * rb + K, 4);
	assert_true(d == 0.0f);
	for (int i = 0; i < 32; i++)
		assert_int_equal(((const int8_t *)(a + 2 * rb))[i], 0);
	free(a);
	free(b);
}

/* The AVX2 activation quantizer writes the portable code's bytes on blocks
 * that are not ordinary numbers too: a NaN among finite values (passed
 * over by the maximum, coded -128), +-inf (scale inf, every code from
 * x * 0: -128 for the infinities' NaN, 0 else), only subnormals (the scale
 * underflows, 1/dx overflows: codes clamped to +-127 / -128, zeros' NaN
 * -128), negative zeros, exact ties at +-127.5 and +-0.5, and values
 * clamped at 127 and -128 by the fp32 rounding of x * (1/dx). */
static void test_packed_quantize_x_special(void **state)
{
	(void)state;
	SKIP_WITHOUT(have_avx2(), "AVX2+FMA+F16C");
	enum { NBLK = 10, K = 32 * NBLK };
	float x[K];
	rng_seed(404);
	for (int i = 0; i < K; i++)
		x[i] = rng_float(-2, 2);
	x[3] = NAN;                               /* block 0 */
	x[32 + 5] = INFINITY;                     /* block 1 */
	x[64 + 9] = -INFINITY;                    /* block 2 */
	x[64 + 10] = INFINITY;
	for (int i = 0; i < 32; i++) {
		x[96 + i] = (i % 3 - 1) * 1e-42f;     /* block 3: subnormals and zeros */
		x[128 + i] = -0.0f;                   /* block 4 */
		x[160 + i] = (float)(i - 16) * 0.5f;  /* block 5: ties at +-0.5 steps */
		x[192 + i] = (i & 1 ? -1 : 1) * 1.7e-38f * (float)(i + 1); /* block 6: tiny normals */
		x[224 + i] = (float)(i - 16) / 16.0f;   /* block 7: -1 .. 15/16 */
	}
	x[160 + 31] = 127.0f * 0.5f;              /* dx = 0.5 */
	x[256 + 0] = 3.0f;                        /* block 8: a maximum of 3, a tie of 1.5 */
	x[256 + 1] = 1.5f * 3.0f / 127.0f;
	x[288 + 30] = NAN;                        /* block 9: NaN (in the last 8) and an infinity */
	x[288 + 8] = -INFINITY;
	size_t rb = cpu_qx_row_bytes(K);
	uint8_t *a = qx_alloc(1, K), *b = qx_alloc(1, K);
	memset(a, 0x55, rb);
	memset(b, 0xaa, rb);
	cpu_qx_quantize(CPU_ISA_PORTABLE, a, x, K, 0, 1);
	cpu_qx_quantize(CPU_ISA_AVX2, b, x, K, 0, 1);
	for (int blk = 0; blk < NBLK; blk++) {
		if (memcmp(a + 32 * blk, b + 32 * blk, 32))
			fail_msg("block %d: codes differ from the portable quantizer's", blk);
		for (int k = 0; k < 3; k++)
			if (memcmp(a + K + 4 * (k * NBLK + blk), b + K + 4 * (k * NBLK + blk), 4))
				fail_msg("block %d: %s differs from the portable quantizer's", blk,
					 k == 0 ? "the scale" : k == 1 ? "sl" : "sh");
	}
	free(a);
	free(b);
}

/* Q8_0 codes of -128 (which quantizers never write) made -127: the AVX2
 * kernel then takes its sign-trick form (|x| times q * sign(x)), which
 * needs q > -128; with one left it keeps the nibble form. Returns how many
 * were changed. */
static size_t q8_drop_min(struct q_case *c)
{
	size_t rb = kt_row_bytes(KT_Q8_0, (size_t)c->w.cols), n = 0;
	for (int r = 0; r < c->w.rows; r++)
		for (int b = 0; b < c->w.cols / 32; b++)
			for (int j = 0; j < 32; j++) {
				uint8_t *q = c->data + (size_t)r * rb + (size_t)b * 34 + 2 + j;
				if (*q == 0x80) {
					*q = 0x81;
					n++;
				}
			}
	return n;
}

/* The AVX2 Q8_0 kernel's two forms, each bit-identical to the portable
 * kernel: codes without -128 (sign trick), the same with one -128 put back
 * in a row (nibbles), codes of +-127 with activations of -128 (from NaN;
 * the largest pair sums of the sign trick, 2 * 128 * 127);
 * n_tok 1 and 7, group ranges. */
static void test_packed_q8_forms(void **state)
{
	(void)state;
	SKIP_WITHOUT(have_avx2(), "AVX2+FMA+F16C");
	rng_seed(406);
	for (int form = 0; form < 3; form++)
		for (int K = 32; K <= 800; K += 768) {
			const int R = 37, T = 7;
			struct q_case c;
			q_case_make(&c, KT_Q8_0, R, K, T);
			q8_drop_min(&c);
			size_t rb = kt_row_bytes(KT_Q8_0, (size_t)K);
			if (form == 1)
				c.data[(size_t)(R / 2) * rb + 2 + 5] = 0x80;   /* row R/2, code 5: -128 */
			if (form == 2) {
				/* all codes +-127, x = -128 * dx exactly in odd places */
				for (int r = 0; r < R; r++)
					for (int b = 0; b < K / 32; b++)
						for (int j = 0; j < 32; j++)
							c.data[(size_t)r * rb + (size_t)b * 34 + 2 + j] =
								(uint8_t)(int8_t)(rng_u64() & 1 ? 127 : -127);
				/* NaN activations are coded -128 (the only way
				 * ordinary-sized blocks get it) */
				for (int i = 0; i < T * K; i++)
					c.x[i] = i & 1 ? NAN : (float)(rng_u64() % 255) / 254.0f;
			}
			float *yp = xmalloc((size_t)T * R * sizeof(float));
			float *ya = xmalloc((size_t)T * R * sizeof(float));
			struct cpu_qpack *p;
			assert_int_equal(cpu_qpack_new(&c.w, NULL, &p), 0);
			uint8_t *qx = qx_alloc(T, K);
			cpu_qx_quantize(CPU_ISA_PORTABLE, qx, c.x, K, 0, T);
			for (int nt = 1; nt <= T; nt += T - 1) {
				poison(yp, (size_t)T * R);
				poison(ya, (size_t)T * R);
				cpu_qpack_rows(CPU_ISA_PORTABLE, yp, qx, p, nt, 0, cpu_qpack_groups(p));
				cpu_qpack_rows(CPU_ISA_AVX2, ya, qx, p, nt, 0, 1);
				cpu_qpack_rows(CPU_ISA_AVX2, ya, qx, p, nt, 1, cpu_qpack_groups(p));
				expect_same(yp, ya, (size_t)nt * R, "q8_0 form %d, %d x %d n_tok %d: avx2 vs "
					    "portable", form, R, K, nt);
			}
			free(qx);
			cpu_qpack_free(p);
			free(yp);
			free(ya);
			q_case_done(&c);
		}
}

/* Llama 3.2-1B's matrix shapes (dim 2048, kv 512, ffn 8192; a slice of the
 * 128256-row classifier) on random weights, each packed dtype: the AVX2
 * kernel bit-identical to the portable one at n_tok 1 and 7 and a token's
 * rows alone equal to the same rows in the batch of 7; the 2-thread
 * backend equal to both; every 61st row within qp_check's bounds. */
static void test_packed_real_shapes(void **state)
{
	(void)state;
	SKIP_WITHOUT(have_avx2(), "AVX2+FMA+F16C");
	static const struct q_shape shapes[] = {
		{ 2048, 2048, 7 }, { 512, 2048, 7 }, { 8192, 2048, 7 }, { 2048, 8192, 7 },
		{ 1000, 2048, 7 },
	};
	/* Q8_0 twice: with the raw rows' -128 codes (nibble form), without
	 * (sign-trick form) */
	static const enum kt_dtype dts[] = { KT_Q8_0, KT_Q8_0, KT_Q4_0, KT_Q4_K, KT_Q5_K, KT_Q6_K };
	rng_seed(405);
	for (size_t di = 0; di < N_ELEMS(dts); di++)
		for (size_t si = 0; si < N_ELEMS(shapes); si++) {
			if (di >= 3 && si != 1 && si != 3)
				continue;   /* K-quants: two shapes (time) */
			int R = shapes[si].rows, K = shapes[si].cols, T = shapes[si].ntok;
			struct q_case c;
			q_case_make(&c, dts[di], R, K, T);
			if (di == 1)
				assert_true(q8_drop_min(&c) > 0);
			size_t n = (size_t)T * R;
			float *yp = xmalloc(n * sizeof(float)), *ya = xmalloc(n * sizeof(float));
			float *y1 = xmalloc(n * sizeof(float));
			struct cpu_qpack *p;
			assert_int_equal(cpu_qpack_new(&c.w, NULL, &p), 0);
			uint8_t *qx = qx_alloc(T, K);
			cpu_qx_quantize(CPU_ISA_PORTABLE, qx, c.x, K, 0, T);
			poison(yp, n);
			poison(ya, n);
			cpu_qpack_rows(CPU_ISA_PORTABLE, yp, qx, p, T, 0, cpu_qpack_groups(p));
			cpu_qpack_rows(CPU_ISA_AVX2, ya, qx, p, T, 0, cpu_qpack_groups(p));
			expect_same(yp, ya, n, "%s %d x %d n_tok %d: avx2 vs portable",
				    kt_dtype_name(c.w.dtype), R, K, T);
			for (int t = 0; t < T; t++) {
				const uint8_t *qt = qx + (size_t)t * cpu_qx_row_bytes(K);
				poison(y1, (size_t)R);
				cpu_qpack_rows(CPU_ISA_AVX2, y1, qt, p, 1, 0, cpu_qpack_groups(p));
				expect_same(ya + (size_t)t * R, y1, (size_t)R,
					    "%s %d x %d: token %d alone vs in a batch of %d (avx2)",
					    kt_dtype_name(c.w.dtype), R, K, t, T);
			}
			qp_run(7, y1, c.x, &c.w, T);
			expect_same(yp, y1, n, "%s %d x %d n_tok %d: backend(2) vs portable",
				    kt_dtype_name(c.w.dtype), R, K, T);
			/* bounds on a sample of rows: qp_check on a matrix of them */
			int ns = (R + 60) / 61;
			struct q_case sc = c;
			size_t rb = kt_row_bytes(c.w.dtype, (size_t)K);
			sc.data = xmalloc((size_t)ns * rb);
			float *ys = xmalloc((size_t)T * ns * sizeof(float));
			for (int i = 0; i < ns; i++) {
				memcpy(sc.data + (size_t)i * rb, c.data + (size_t)(61 * i) * rb, rb);
				for (int t = 0; t < T; t++)
					ys[(size_t)t * ns + i] = ya[(size_t)t * R + 61 * i];
			}
			sc.w.data = sc.data;
			sc.w.rows = ns;
			qp_check(&sc, ys, T);
			free(sc.data);
			free(ys);
			free(qx);
			cpu_qpack_free(p);
			free(yp);
			free(ya);
			free(y1);
			q_case_done(&c);
		}
}

/* ---- embed ----------------------------------------------------------------- */

static void embed_dtypes(const enum kt_dtype *dts, size_t n_dt, const int *dims, size_t n_dims)
{
	static const int32_t tok[] = { 0, 36, 5, 5, 12, 1 };
	const int NT = (int)N_ELEMS(tok), V = 37;
	rng_seed(33);
	for (size_t di = 0; di < n_dt; di++)
		for (size_t wi = 0; wi < n_dims; wi++) {
			int d = dims[wi];
			struct q_case c;
			q_case_make(&c, dts[di], V, d, 1);
			size_t rb = kt_row_bytes(c.w.dtype, (size_t)d);
			float *y = xmalloc((size_t)NT * d * sizeof(float));
			float *r = xmalloc((size_t)d * sizeof(float));
			for (int bi = 0; bi < 2; bi++) {
				struct backend *be = bi ? g_be2 : g_be1;
				poison(y, (size_t)NT * d);
				be->ops->embed(be, y, &c.w, tok, NT);
				for (int t = 0; t < NT; t++) {
					const uint8_t *row = c.data + (size_t)tok[t] * rb;
					poison(r, (size_t)d);
					kt_row_to_f32(c.w.dtype, row, r, (size_t)d);
					expect_same(r, y + (size_t)t * d, (size_t)d, "embed %s d %d t %d",
						    kt_dtype_name(c.w.dtype), d, t);
					for (int i = 0; i < d; i++)
						if (!(r[i] == (float)ref_weight(c.w.dtype, row, (size_t)i)))
							fail_msg("embed %s d %d: weight %d", kt_dtype_name(c.w.dtype), d, i);
				}
			}
			free(r);
			free(y);
			q_case_done(&c);
		}
}

static void test_embed_q(void **state)
{
	(void)state;
	static const int dims[] = { 32, 64, 288 };
	embed_dtypes(q_dtypes, N_ELEMS(q_dtypes), dims, N_ELEMS(dims));
}

static void test_embed_k(void **state)
{
	(void)state;
	static const int dims[] = { 256, 512, 1280 };
	embed_dtypes(k_dtypes, N_ELEMS(k_dtypes), dims, N_ELEMS(dims));
}

/* kt_row_to_f32 on the plain dtypes: the scalar conversions. */
static void test_row_to_f32_plain(void **state)
{
	(void)state;
	uint16_t h[40];
	float f[40], out[40];
	rng_seed(44);
	for (int i = 0; i < 40; i++) {
		h[i] = (uint16_t)rng_u64();
		f[i] = rng_float(-3, 3);
	}
	kt_row_to_f32(KT_F32, f, out, 40);
	assert_memory_equal(out, f, sizeof(f));
	kt_row_to_f32(KT_F16, h, out, 40);
	for (int i = 0; i < 40; i++) {
		float want = kt_f16_to_f32(h[i]);
		assert_memory_equal(&out[i], &want, 4);
	}
	kt_row_to_f32(KT_BF16, h, out, 40);
	for (int i = 0; i < 40; i++) {
		float want = kt_bf16_to_f32(h[i]);
		assert_memory_equal(&out[i], &want, 4);
	}
}

static int group_setup(void **state)
{
	(void)state;
	g_be1 = backend_cpu_new(1);
	g_be2 = backend_cpu_new(2);
	if (!g_be1 || !g_be2)
		return -1;
	if (g_be1->ops->reserve(g_be1, 64, 128) || g_be2->ops->reserve(g_be2, 64, 128))
		return -1;
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	backend_free(g_be1);
	backend_free(g_be2);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_row_bytes),
		cmocka_unit_test(test_q8_0_known_blocks),
		cmocka_unit_test(test_q4_0_known_blocks),
		cmocka_unit_test(test_q8_0_round_trip),
		cmocka_unit_test(test_q4_0_round_trip),
		cmocka_unit_test(test_row_to_f32_plain),
		cmocka_unit_test(test_matmul_q_portable),
		cmocka_unit_test(test_matmul_q_avx512),
		cmocka_unit_test(test_matmul_q_avx2),
		cmocka_unit_test(test_matmul_q_avx2_bits),
		cmocka_unit_test(test_matmul_q_backend_1thread),
		cmocka_unit_test(test_matmul_q_backend_2threads),
		cmocka_unit_test(test_matmul_q_paths_identical),
		cmocka_unit_test(test_embed_q),
		cmocka_unit_test(test_kquant_known_blocks),
		cmocka_unit_test(test_kquant_device_decoder),
		cmocka_unit_test(test_q4_k_round_trip),
		cmocka_unit_test(test_q5_k_round_trip),
		cmocka_unit_test(test_q6_k_round_trip),
		cmocka_unit_test(test_matmul_k_portable),
		cmocka_unit_test(test_matmul_k_avx512),
		cmocka_unit_test(test_matmul_k_avx2),
		cmocka_unit_test(test_matmul_k_backend_1thread),
		cmocka_unit_test(test_matmul_k_backend_2threads),
		cmocka_unit_test(test_matmul_k_paths_identical),
		cmocka_unit_test(test_embed_k),
		cmocka_unit_test(test_packed_matmul),
		cmocka_unit_test(test_packed_group_range),
		cmocka_unit_test(test_packed_quantize_x),
		cmocka_unit_test(test_packed_quantize_x_special),
		cmocka_unit_test(test_packed_q8_forms),
		cmocka_unit_test(test_packed_real_shapes),
		cmocka_unit_test(test_packed_out_of_memory),
		cmocka_unit_test(test_packed_memory_available),
		cmocka_unit_test(test_packed_matmul_n),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

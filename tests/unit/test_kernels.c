/*
 * tests/unit/test_kernels.c — every op of the CPU backend (kernels/cpu/,
 * kernels/convert.c) against a naive double-precision loop written here, on
 * random inputs from a seeded PRNG.
 *
 * Tolerances (each check states its bound):
 *   matmul     |y - ref| <= 1e-5 * sum_c |x[c] * w[c]|   (relative to the
 *              magnitude of the terms, so cancellation does not flake); the
 *              reference reads f16/bf16 weights with its own exact decoder.
 *   rmsnorm    |y - ref| <= 1e-5 * |ref| + 1e-30
 *   rope       |y - ref| <= 1e-5 * (|a| + |b|)  for the input pair (a, b); the
 *              angle is pos * inv_freq formed in fp32, as the op's contract
 *              (and llama2.c) has it, then cos/sin in double.
 *   attention  |y - ref| <= 1e-5 * sum_p softmax_p * |v_p| + 1e-7
 *   silu_mul   |y - ref| <= 1e-5 * |ref| + 1e-30
 *   add, embed, kv_store, dtype conversions: exact.
 * Bit-identity (memcmp) is required for batch invariance (a row alone vs in
 * a batch), 1 vs 2 threads, and the two RoPE pair layouts.
 *
 * Every output buffer is poisoned with NaN first, so an op that writes
 * nothing fails the comparison.
 *
 * The shared backends follow the environment: run with LLAMAD_NO_AVX512=1
 * to put the portable matmul behind them (the rows tests call both paths
 * directly either way).
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/unit/testutil.h"

#include "kernels/backend.h"
#include "kernels/cpu/cpu.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* ---- helpers ------------------------------------------------------------ */


static void fill(float *p, size_t n, float lo, float hi)
{
	for (size_t i = 0; i < n; i++)
		p[i] = rng_float(lo, hi);
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

/* Fail with context unless |got - ref| <= tol (a NaN got fails). */
#define CHECK_CLOSE(got, ref, tol, ...)                                          \
	do {                                                                     \
		double g_ = (got), r_ = (ref), t_ = (tol);                       \
		if (!(fabs(g_ - r_) <= t_)) {                                    \
			print_error(__VA_ARGS__);                                \
			fail_msg(" got %.9g ref %.9g err %.3g tol %.3g", g_, r_, \
				 fabs(g_ - r_), t_);                             \
		}                                                                \
	} while (0)

/* Independent exact decoders (no code under test). */
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

static double ref_bf16(uint16_t h)
{
	int sign = h >> 15, e = (h >> 7) & 0xff, m = h & 0x7f;
	double v;
	if (e == 0)
		v = ldexp(m, -133);
	else if (e == 255)
		v = m ? NAN : INFINITY;
	else
		v = ldexp(128 + m, e - 134);
	return sign ? -v : v;
}

/* Independent round-to-nearest-even encoders, from the value in double. */
static uint16_t ref_to_f16(float f)
{
	uint16_t sign = signbit(f) ? 0x8000 : 0;
	if (isnan(f))
		return 0x7e00 | sign;
	double a = fabs((double)f);
	if (a >= 65520.0)
		return sign | 0x7c00;
	if (a < 0x1p-14) {
		double r = nearbyint(a * 0x1p24);  /* exact scaling, ties to even */
		return sign | (uint16_t)r;
	}
	int e;
	frexp(a, &e);          /* a = f * 2^e, f in [0.5, 1) */
	e -= 1;                /* a in [2^e, 2^(e+1)) */
	double r = nearbyint(ldexp(a, 10 - e));   /* in [1024, 2048] */
	if (r == 2048) {
		r = 1024;
		e++;
	}
	if (e > 15)
		return sign | 0x7c00;
	return sign | (uint16_t)(((e + 15) << 10) | ((int)r - 1024));
}

static uint16_t ref_to_bf16(float f)
{
	uint16_t sign = signbit(f) ? 0x8000 : 0;
	double a = fabs((double)f);
	if (isnan(f))
		return 0x7fc0 | sign;
	if (isinf(f))
		return sign | 0x7f80;
	if (a < 0x1p-126) {
		double r = nearbyint(a * 0x1p133);  /* bf16 subnormal quantum */
		return sign | (uint16_t)r;
	}
	int e;
	frexp(a, &e);
	e -= 1;
	double r = nearbyint(ldexp(a, 7 - e));    /* in [128, 256] */
	if (r == 256) {
		r = 128;
		e++;
	}
	if (e > 127)
		return sign | 0x7f80;
	return sign | (uint16_t)(((e + 127) << 7) | ((int)r - 128));
}

static int have_avx512(void)
{
	return cpu_has(CPU_AVX512);
}

static int have_avx2(void)
{
	return cpu_has(CPU_AVX2);
}

/* ---- matmul ------------------------------------------------------------- */

static const enum kt_dtype mm_dtypes[] = { KT_F32, KT_F16, KT_BF16 };
static const int mm_cols[] = { 7, 17, 64, 172, 300 };
/* 130 x 300 crosses the backend's threading threshold for every dtype and
 * splits unevenly (72 + 58 rows) over 2 threads. */
static const int mm_rows[] = { 1, 3, 9, 17, 37, 130 };
static const int mm_ntok[] = { 1, 2, 3, 4, 5, 6, 7, 10, 13 };
#define N_ELEMS(a) (sizeof(a) / sizeof((a)[0]))
#define MAX_TOK 13

/* A random weight matrix and its exact values in double. */
struct mm_case {
	struct kt_weight w;
	double *wd;     /* (rows, cols) exact values */
	float *x;       /* (MAX_TOK, cols) */
};

static void mm_case_make(struct mm_case *c, enum kt_dtype dt, int rows, int cols)
{
	size_t n = (size_t)rows * cols;
	void *data = xmalloc(n * kt_dtype_size(dt));
	c->wd = xmalloc(n * sizeof(double));
	for (size_t i = 0; i < n; i++) {
		float v = rng_float(-1, 1);
		switch (dt) {
		case KT_F32:
			((float *)data)[i] = v;
			c->wd[i] = v;
			break;
		case KT_F16:
			((uint16_t *)data)[i] = ref_to_f16(v);
			c->wd[i] = ref_f16(((uint16_t *)data)[i]);
			break;
		case KT_BF16:
			((uint16_t *)data)[i] = ref_to_bf16(v);
			c->wd[i] = ref_bf16(((uint16_t *)data)[i]);
			break;
		case KT_Q8_0:
		case KT_Q4_0:
		case KT_Q4_K:
		case KT_Q5_K:
		case KT_Q6_K:
			fail_msg("quantized weights are tested in test_quant.c");
		}
	}
	c->w = (struct kt_weight){ data, dt, rows, cols, NULL };
	c->x = xmalloc((size_t)MAX_TOK * cols * sizeof(float));
	fill(c->x, (size_t)MAX_TOK * cols, -1, 1);
}

static void mm_case_done(struct mm_case *c)
{
	free((void *)c->w.data);
	free(c->wd);
	free(c->x);
}

/* Check y (n_tok, rows) against the double reference. */
static void mm_check(const struct mm_case *c, const float *y, int n_tok, const char *what)
{
	int R = c->w.rows, K = c->w.cols;
	for (int t = 0; t < n_tok; t++)
		for (int r = 0; r < R; r++) {
			double s = 0, sa = 0;
			for (int k = 0; k < K; k++) {
				double p = (double)c->x[(size_t)t * K + k] * c->wd[(size_t)r * K + k];
				s += p;
				sa += fabs(p);
			}
			CHECK_CLOSE(y[(size_t)t * R + r], s, 1e-5 * sa + 1e-30,
				    "%s %s rows %d cols %d n_tok %d: y[%d][%d]\n", what,
				    kt_dtype_name(c->w.dtype), R, K, n_tok, t, r);
		}
}

/* Run one matmul path into y (poisoned first). path: 0 rows portable,
 * 1 rows avx512, 2 backend 1 thread, 3 backend 2 threads, 4 rows avx2. */
static struct backend *g_be1, *g_be2;

static void mm_run(int path, float *y, const float *x, const struct kt_weight *w, int n_tok)
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

/* The rows path of an isa (enum cpu_isa). */
static int isa_path(int isa)
{
	return isa == CPU_ISA_AVX512 ? 1 : isa == CPU_ISA_AVX2 ? 4 : 0;
}

/* For every shape: each token's row alone (n_tok = 1) vs the reference;
 * then every n_tok vs the reference, each of its rows bit-identical
 * (memcmp) to the same row computed alone (batch invariance). The AVX-512
 * batch tiles are 6 tokens: n_tok 2-5 are the tail tiles alone, 6 a full
 * one, 7 and 13 full ones and a 1-token tail, 10 a 4-token tail. */
static void mm_path_all(int path)
{
	rng_seed(100 + (uint64_t)path);
	for (size_t di = 0; di < N_ELEMS(mm_dtypes); di++)
		for (size_t ci = 0; ci < N_ELEMS(mm_cols); ci++)
			for (size_t ri = 0; ri < N_ELEMS(mm_rows); ri++) {
				struct mm_case c;
				int R = mm_rows[ri], K = mm_cols[ci];
				mm_case_make(&c, mm_dtypes[di], R, K);
				float *y = xmalloc((size_t)MAX_TOK * R * sizeof(float));
				float *y1 = xmalloc((size_t)MAX_TOK * R * sizeof(float));
				for (int t = 0; t < MAX_TOK; t++)
					mm_run(path, y1 + (size_t)t * R, c.x + (size_t)t * K, &c.w, 1);
				mm_check(&c, y1, MAX_TOK, path_name[path]);
				for (size_t ti = 0; ti < N_ELEMS(mm_ntok); ti++) {
					int nt = mm_ntok[ti];
					mm_run(path, y, c.x, &c.w, nt);
					mm_check(&c, y, nt, path_name[path]);
					for (int t = 0; t < nt; t++)
						if (memcmp(y1 + (size_t)t * R, y + (size_t)t * R,
							   (size_t)R * sizeof(float)))
							fail_msg("%s %s rows %d cols %d: row %d alone differs "
								 "from the same row in a batch of %d",
								 path_name[path], kt_dtype_name(c.w.dtype),
								 R, K, t, nt);
				}
				free(y);
				free(y1);
				mm_case_done(&c);
			}
}

static void test_matmul_portable(void **state)
{
	(void)state;
	mm_path_all(0);
}

static void test_matmul_avx512(void **state)
{
	(void)state;
	if (!have_avx512())
		skip();
	mm_path_all(1);
}

/* Wide rows: a batch's rows go in blocks of ~256 KiB of weights (4,100 f32
 * columns: blocks of 12 rows, then a 2-row tail), every token tile over a
 * block before the next; each element must still equal the portable loop's
 * bit for bit and the same row computed alone. */
static void test_matmul_row_blocks(void **state)
{
	(void)state;
	if (!have_avx512())
		skip();
	rng_seed(7);
	const enum kt_dtype dts[] = { KT_F32, KT_F16 };
	for (size_t di = 0; di < N_ELEMS(dts); di++) {
		struct mm_case c;
		const int R = 50, K = 4100;
		mm_case_make(&c, dts[di], R, K);
		float *y = xmalloc((size_t)MAX_TOK * R * sizeof(float));
		float *yp = xmalloc((size_t)MAX_TOK * R * sizeof(float));
		float *y1 = xmalloc((size_t)R * sizeof(float));
		mm_run(1, y, c.x, &c.w, MAX_TOK);
		mm_check(&c, y, MAX_TOK, "row blocks");
		mm_run(0, yp, c.x, &c.w, MAX_TOK);
		if (memcmp(y, yp, (size_t)MAX_TOK * R * sizeof(float)))
			fail_msg("row blocks %s: avx512 and portable differ", kt_dtype_name(dts[di]));
		for (int t = 0; t < MAX_TOK; t++) {
			mm_run(1, y1, c.x + (size_t)t * K, &c.w, 1);
			if (memcmp(y1, y + (size_t)t * R, (size_t)R * sizeof(float)))
				fail_msg("row blocks %s: token %d alone differs", kt_dtype_name(dts[di]), t);
		}
		free(y);
		free(yp);
		free(y1);
		mm_case_done(&c);
	}
}

static void test_matmul_avx2(void **state)
{
	(void)state;
	SKIP_WITHOUT(have_avx2(), "AVX2+FMA+F16C");
	mm_path_all(4);
}

/* The AVX2 tiles against the portable loop, bit for bit, on every small
 * shape that reaches a tile edge: K = 1..33 (every tail length, none) and
 * wider ones, rows 1..9 (the 4-row and 2-row tiles and their tails), every
 * n_tok 1..9 (3-token tiles and the 2- and 1-token tails, 4 x 1 on the last
 * row); a split row range. Then products that underflow to -0: the lanes
 * past a tail must keep their -0 (rows_generic never touches them), so a
 * row whose every product is a negative zero sums to -0. */
static void test_matmul_avx2_bits(void **state)
{
	(void)state;
	SKIP_WITHOUT(have_avx2(), "AVX2+FMA+F16C");
	static const int cols[] = { 1, 2, 7, 8, 9, 15, 16, 17, 23, 24, 31, 32, 33, 100, 288, 301 };
	rng_seed(11);
	for (size_t di = 0; di < N_ELEMS(mm_dtypes); di++)
		for (size_t ci = 0; ci < N_ELEMS(cols); ci++)
			for (int R = 1; R <= 9; R += (R < 5 ? 1 : 4)) {
				struct mm_case c;
				int K = cols[ci];
				mm_case_make(&c, mm_dtypes[di], R, K);
				size_t ny = (size_t)MAX_TOK * R;
				float *a = xmalloc(ny * sizeof(float)), *b = xmalloc(ny * sizeof(float));
				for (int nt = 1; nt <= 9; nt++) {
					mm_run(0, a, c.x, &c.w, nt);
					mm_run(4, b, c.x, &c.w, nt);
					if (memcmp(a, b, (size_t)nt * R * sizeof(float)))
						fail_msg("avx2 %s rows %d cols %d n_tok %d differs from portable",
							 kt_dtype_name(c.w.dtype), R, K, nt);
				}
				int cut = R / 2;
				poison(b, ny);
				cpu_matmul_rows(CPU_ISA_AVX2, b, c.x, &c.w, 9, 0, cut);
				cpu_matmul_rows(CPU_ISA_AVX2, b, c.x, &c.w, 9, cut, R);
				mm_run(0, a, c.x, &c.w, 9);
				assert_memory_equal(a, b, (size_t)9 * R * sizeof(float));
				free(a);
				free(b);
				mm_case_done(&c);
			}
	/* f32 weights 1e-30, activations -1e-30: every product -1e-60, a
	 * negative zero in fp32 */
	for (int K = 16; K <= 47; K++) {
		float *w = xmalloc((size_t)K * sizeof(float)), *x = xmalloc((size_t)K * sizeof(float));
		for (int k = 0; k < K; k++) {
			w[k] = 1e-30f;
			x[k] = -1e-30f;
		}
		struct kt_weight wt = { w, KT_F32, 1, K, NULL };
		float ya, yb;
		cpu_matmul_rows(CPU_ISA_PORTABLE, &ya, x, &wt, 1, 0, 1);
		cpu_matmul_rows(CPU_ISA_AVX2, &yb, x, &wt, 1, 0, 1);
		assert_true(ya == 0 && signbit(ya));
		if (memcmp(&ya, &yb, sizeof(float)))
			fail_msg("cols %d: avx2 %g (sign %d) vs portable -0", K, (double)yb,
				 signbit(yb) != 0);
		free(w);
		free(x);
	}
}

static void test_matmul_backend_1thread(void **state)
{
	(void)state;
	mm_path_all(2);
}

static void test_matmul_backend_2threads(void **state)
{
	(void)state;
	mm_path_all(3);
}

/* 1 vs 2 threads and portable vs AVX-512 bit-identical; a row range split anywhere gives the same
 * bits as the whole range (what the pool workers rely on). */
static void test_matmul_threads_and_splits(void **state)
{
	(void)state;
	rng_seed(7);
	int avx = have_avx512(), avx2 = have_avx2();
	for (size_t di = 0; di < N_ELEMS(mm_dtypes); di++)
		for (size_t ci = 0; ci < N_ELEMS(mm_cols); ci++)
			for (size_t ri = 0; ri < N_ELEMS(mm_rows); ri++) {
				struct mm_case c;
				int R = mm_rows[ri], K = mm_cols[ci];
				size_t ny = (size_t)MAX_TOK * R;
				mm_case_make(&c, mm_dtypes[di], R, K);
				float *a = xmalloc(ny * sizeof(float));
				float *b = xmalloc(ny * sizeof(float));
				mm_run(2, a, c.x, &c.w, MAX_TOK);
				mm_run(3, b, c.x, &c.w, MAX_TOK);
				assert_memory_equal(a, b, ny * sizeof(float));
				if (avx) {
					/* the portable path uses the same fused
					 * multiply-adds and reduction tree as the
					 * AVX-512 one: identical bits */
					mm_run(0, a, c.x, &c.w, MAX_TOK);
					mm_run(1, b, c.x, &c.w, MAX_TOK);
					assert_memory_equal(a, b, ny * sizeof(float));
				}
				if (avx2) {
					mm_run(0, a, c.x, &c.w, MAX_TOK);
					mm_run(4, b, c.x, &c.w, MAX_TOK);
					assert_memory_equal(a, b, ny * sizeof(float));
				}
				for (int isa = 0; isa <= CPU_ISA_AVX2; isa++) {
					if ((isa == CPU_ISA_AVX512 && !avx) || (isa == CPU_ISA_AVX2 && !avx2))
						continue;
					mm_run(isa_path(isa), a, c.x, &c.w, MAX_TOK);
					int cut = R / 3 + (R > 1);
					poison(b, ny);
					cpu_matmul_rows(isa, b, c.x, &c.w, MAX_TOK, 0, cut);
					cpu_matmul_rows(isa, b, c.x, &c.w, MAX_TOK, cut, R);
					assert_memory_equal(a, b, ny * sizeof(float));
				}
				free(a);
				free(b);
				mm_case_done(&c);
			}
}

/* ---- bf16 weights x bf16 activations --------------------------------------- */

static int have_bf16(void)
{
	return cpu_has(CPU_BF16) && have_avx512();
}

/* cpu_bf16_round: nearest even as the independent encoder, zero and
 * denormals to a signed zero, NaN a NaN of the same sign, infinities and
 * overflow to infinity; both isas the same bits. */
static void test_bf16_round(void **state)
{
	(void)state;
	rng_seed(21);
	enum { N = 4099 };
	float *x = xmalloc(N * sizeof(float));
	uint16_t *a = xmalloc(N * sizeof(uint16_t)), *b = xmalloc(N * sizeof(uint16_t));
	static const uint32_t special[] = {
		0x00000000, 0x80000000, 0x00000001, 0x807fffff, 0x00800000, 0x80800000,
		0x3f808000, 0x3f818000, 0x3f808001, 0x3f80ffff, 0x7f7fffff, 0xff7fffff,
		0x7f800000, 0xff800000, 0x7f800001, 0xffc00000, 0x7fffffff,
	};
	for (int i = 0; i < N; i++) {
		float v = rng_float(-1, 1) * ldexpf(1, (int)(rng_u64() % 60) - 30);
		if (i < (int)N_ELEMS(special))
			memcpy(&v, &special[i], 4);
		x[i] = v;
	}
	cpu_bf16_round(CPU_ISA_PORTABLE, a, x, N);
	for (int i = 0; i < N; i++) {
		uint32_t u = f32_bits(x[i]);
		if (isnan(x[i])) {
			assert_true((a[i] & 0x7f80) == 0x7f80 && (a[i] & 0x7f));
			assert_int_equal(a[i] >> 15, u >> 31);
		} else if (fabsf(x[i]) < 0x1p-126f) {
			assert_int_equal(a[i], (u >> 16) & 0x8000);
		} else {
			assert_int_equal(a[i], ref_to_bf16(x[i]));
		}
	}
	assert_int_equal(a[6], 0x3f80);   /* tie to even: down */
	assert_int_equal(a[7], 0x3f82);   /* tie to even: up */
	assert_int_equal(a[10], 0x7f80);  /* FLT_MAX rounds to infinity */
	if (have_avx512()) {
		for (int n = 0; n <= 40; n++) {  /* every tail length */
			memset(b, 0xee, N * sizeof(uint16_t));
			cpu_bf16_round(CPU_ISA_AVX512, b, x, (size_t)n);
			assert_memory_equal(a, b, (size_t)n * sizeof(uint16_t));
			assert_int_equal(b[n], 0xeeee);  /* nothing past n written */
		}
		cpu_bf16_round(CPU_ISA_AVX512, b, x, N);
		assert_memory_equal(a, b, N * sizeof(uint16_t));
	}
	free(x);
	free(a);
	free(b);
}

/* Rows of bf16 weights against rounded activations: the portable loop
 * against a double reference of the same rounded values; VDPBF16PS against
 * the portable loop bit for bit, every tail of the 32-column steps, every
 * tile edge, each row alone against the batch, any row split; and, with
 * denormal weights and products that underflow, the flushing the
 * instruction does. */
static void test_matmul_bf16_dot(void **state)
{
	(void)state;
	rng_seed(22);
	static const int cols[] = { 1, 2, 31, 32, 33, 64, 65, 300, 4100 };
	static const int rows[] = { 1, 3, 9, 37, 130 };
	int hw = have_bf16();
	for (size_t ci = 0; ci < N_ELEMS(cols); ci++)
		for (size_t ri = 0; ri < N_ELEMS(rows); ri++) {
			int R = rows[ri], K = cols[ci];
			if ((size_t)R * K > 40000)
				continue;
			struct mm_case c;
			mm_case_make(&c, KT_BF16, R, K);
			size_t nx = (size_t)MAX_TOK * K, ny = (size_t)MAX_TOK * R;
			uint16_t *xb = xmalloc(nx * sizeof(uint16_t));
			if (ci == N_ELEMS(cols) - 1)  /* tiny inputs: products underflow */
				for (size_t i = 0; i < nx; i += 7)
					c.x[i] *= 0x1p-70f;
			uint16_t *wb = (uint16_t *)c.w.data;
			for (size_t i = 5; i < (size_t)R * K; i += 97)  /* denormal weights */
				wb[i] = (uint16_t)(wb[i] & 0x807f);
			cpu_bf16_round(CPU_ISA_PORTABLE, xb, c.x, nx);
			float *a = xmalloc(ny * sizeof(float)), *b = xmalloc(ny * sizeof(float));
			poison(a, ny);
			cpu_matmul_rows_bf16(CPU_ISA_PORTABLE, a, xb, &c.w, MAX_TOK, 0, R);
			for (int t = 0; t < MAX_TOK; t++)
				for (int r = 0; r < R; r++) {
					double s = 0, sa = 0;
					for (int k = 0; k < K; k++) {
						uint16_t w = wb[(size_t)r * K + k];
						double p = ref_bf16(xb[(size_t)t * K + k]) *
							   ((w & 0x7f80) ? ref_bf16(w) : 0.0);
						s += p;
						sa += fabs(p);
					}
					CHECK_CLOSE(a[(size_t)t * R + r], s, 1e-5 * sa + 1e-30,
						    "bf16 dot rows %d cols %d: y[%d][%d]\n", R, K, t, r);
				}
			if (hw) {
				poison(b, ny);
				cpu_matmul_rows_bf16(CPU_ISA_AVX512, b, xb, &c.w, MAX_TOK, 0, R);
				assert_memory_equal(a, b, ny * sizeof(float));
				for (size_t ti = 0; ti < N_ELEMS(mm_ntok); ti++) {
					int nt = mm_ntok[ti];
					poison(b, ny);
					cpu_matmul_rows_bf16(CPU_ISA_AVX512, b, xb, &c.w, nt, 0, R);
					assert_memory_equal(a, b, (size_t)nt * R * sizeof(float));
				}
				for (int t = 0; t < MAX_TOK; t++) {
					poison(b, (size_t)R);
					cpu_matmul_rows_bf16(CPU_ISA_AVX512, b, xb + (size_t)t * K, &c.w, 1,
							     0, R);
					assert_memory_equal(a + (size_t)t * R, b, (size_t)R * sizeof(float));
				}
				int cut = R / 3 + (R > 1);
				poison(b, ny);
				cpu_matmul_rows_bf16(CPU_ISA_AVX512, b, xb, &c.w, MAX_TOK, 0, cut);
				cpu_matmul_rows_bf16(CPU_ISA_AVX512, b, xb, &c.w, MAX_TOK, cut, R);
				assert_memory_equal(a, b, ny * sizeof(float));
			}
			free(xb);
			free(a);
			free(b);
			mm_case_done(&c);
		}
	if (!hw)
		print_message("skipped the VDPBF16PS half: this CPU has no AVX512-BF16\n");
}

/* The flushing VDPBF16PS does, made visible: a row of denormal weights
 * against huge inputs (read as zero: 0, not ~1e-9), products that underflow
 * (flushed: 0, not ~1e-40 a column), an input that rounds to a denormal
 * (zero); the portable loop and the instruction agree. */
static void test_matmul_bf16_flush(void **state)
{
	(void)state;
	enum { R = 4, K = 64 };
	uint16_t w[R * K], xb[K];
	float x[K], a[R], b[R];
	for (int k = 0; k < K; k++) {
		x[k] = 1e30f;
		w[0 * K + k] = 0x0001;                 /* denormal weights */
		w[1 * K + k] = ref_to_bf16(1e-30f);    /* products of ~1e-60 ... */
		w[2 * K + k] = ref_to_bf16(1e-25f);
		w[3 * K + k] = ref_to_bf16(1.0f);
	}
	struct kt_weight kw = { w, KT_BF16, R, K, NULL };
	cpu_bf16_round(CPU_ISA_PORTABLE, xb, x, K);
	cpu_matmul_rows_bf16(CPU_ISA_PORTABLE, a, xb, &kw, 1, 0, R);
	assert_true(a[0] == 0.0f);               /* DAZ: not 64 * 1e30 * 9e-41 */
	assert_true(fabsf(a[2] - 64e5f) < 64e5f * 1e-2f);
	for (int k = 0; k < K; k++)
		x[k] = 1e-20f;                     /* x * 1e-30 = 1e-50: underflow */
	x[5] = 0x1p-140f;                          /* a denormal input */
	cpu_bf16_round(CPU_ISA_PORTABLE, xb, x, K);
	assert_int_equal(xb[5], 0);
	cpu_matmul_rows_bf16(CPU_ISA_PORTABLE, a, xb, &kw, 1, 0, R);
	assert_true(a[1] == 0.0f);               /* FTZ: every product flushed */
	assert_true(a[2] == 0.0f);               /* 1e-45: a denormal, flushed */
	assert_true(a[3] > 0.0f);
	if (!have_bf16())
		skip();
	for (int pass = 0; pass < 2; pass++) {
		for (int k = 0; k < K; k++)
			x[k] = pass ? 1e-20f : 1e30f;
		cpu_bf16_round(CPU_ISA_PORTABLE, xb, x, K);
		cpu_matmul_rows_bf16(CPU_ISA_PORTABLE, a, xb, &kw, 1, 0, R);
		cpu_matmul_rows_bf16(CPU_ISA_AVX512, b, xb, &kw, 1, 0, R);
		assert_memory_equal(a, b, sizeof(a));
	}
}

/* The backend: with AVX512-BF16, bf16 weights take rounded activations on
 * 1 and 2 threads (the rows above, bit for bit) and say so in the
 * description, LLAMAD_NO_AVX512=1 too (the portable loop: same bits);
 * LLAMAD_CPU_EXACT_BF16=1 keeps fp32 activations (the rows path of f16
 * weights). */
static void test_matmul_bf16_backend(void **state)
{
	(void)state;
	rng_seed(23);
	const char *e = getenv("LLAMAD_CPU_EXACT_BF16"), *e2 = getenv("LLAMAD_NO_AVX512");
	char *saved = e ? strdup(e) : NULL, *saved2 = e2 ? strdup(e2) : NULL;
	struct mm_case c;
	const int R = 130, K = 300;
	mm_case_make(&c, KT_BF16, R, K);
	size_t ny = (size_t)MAX_TOK * R;
	uint16_t *xb = xmalloc((size_t)MAX_TOK * K * sizeof(uint16_t));
	cpu_bf16_round(CPU_ISA_PORTABLE, xb, c.x, (size_t)MAX_TOK * K);
	float *a = xmalloc(ny * sizeof(float)), *b = xmalloc(ny * sizeof(float));
	for (int mode = 0; mode < 3; mode++) {  /* default, exact, no AVX-512 */
		int exact = mode == 1;
		assert_int_equal(exact ? setenv("LLAMAD_CPU_EXACT_BF16", "1", 1)
				       : unsetenv("LLAMAD_CPU_EXACT_BF16"), 0);
		assert_int_equal(mode == 2 ? setenv("LLAMAD_NO_AVX512", "1", 1)
					   : unsetenv("LLAMAD_NO_AVX512"), 0);
		for (int nth = 1; nth <= 2; nth++) {
			struct backend *be = backend_cpu_new(nth);
			assert_non_null(be);
			struct cpu_backend *cb = (struct cpu_backend *)be;
			int dot = !exact && have_bf16();
			assert_int_equal(cb->have_avx512, mode != 2 && have_avx512());
			assert_int_equal(cb->bf16_dot, dot);
			assert_int_equal(strstr(be->desc, ", bf16 dot") != NULL, dot);
			struct kt_weight pw;
			assert_int_equal(be->ops->weight_place(be, &pw, &c.w, KT_USE_MATMUL), 0);
			assert_int_equal(be->ops->reserve(be, 64, MAX_TOK), 0);
			assert_true(!dot || cb->xb_len >= (size_t)MAX_TOK * K * sizeof(uint16_t));
			for (int nt = 1; nt <= MAX_TOK; nt += 4) {
				poison(a, ny);
				be->ops->matmul(be, a, c.x, &pw, nt);
				poison(b, ny);
				if (dot)
					cpu_matmul_rows_bf16(CPU_ISA_PORTABLE, b, xb, &c.w, nt, 0, R);
				else
					cpu_matmul_rows(CPU_ISA_PORTABLE, b, c.x, &c.w, nt, 0, R);
				assert_memory_equal(a, b, (size_t)nt * R * sizeof(float));
			}
			be->ops->weight_release(be, &pw);
			backend_free(be);
		}
	}
	assert_int_equal(saved ? setenv("LLAMAD_CPU_EXACT_BF16", saved, 1)
			       : unsetenv("LLAMAD_CPU_EXACT_BF16"), 0);
	assert_int_equal(saved2 ? setenv("LLAMAD_NO_AVX512", saved2, 1)
				: unsetenv("LLAMAD_NO_AVX512"), 0);
	free(saved);
	free(saved2);
	free(xb);
	free(a);
	free(b);
	mm_case_done(&c);
}

/* backend_cpu_new picks the AVX-512 path when the CPU has it, else AVX2
 * where the CPU has that, else the portable one; LLAMAD_NO_AVX512=1 and
 * LLAMAD_NO_AVX2=1 take them away. Its output is bit-identical to the
 * chosen rows path, and its description names the vector code. */
static void test_matmul_dispatch(void **state)
{
	(void)state;
	rng_seed(8);
	static const char *const vars[2] = { "LLAMAD_NO_AVX512", "LLAMAD_NO_AVX2" };
	char *saved[2];
	for (int v = 0; v < 2; v++) {
		const char *e = getenv(vars[v]);
		saved[v] = e ? strdup(e) : NULL;
	}
	struct mm_case c;
	mm_case_make(&c, KT_F16, 37, 172);
	size_t ny = (size_t)MAX_TOK * 37;
	float *a = xmalloc(ny * sizeof(float)), *b = xmalloc(ny * sizeof(float));
	/* bit v of `off`: vars[v] set */
	for (int off = 0; off < 4; off++) {
		for (int v = 0; v < 2; v++)
			assert_int_equal(off >> v & 1 ? setenv(vars[v], "1", 1) : unsetenv(vars[v]), 0);
		struct backend *be = backend_cpu_new(1);
		assert_non_null(be);
		struct cpu_backend *cb = (struct cpu_backend *)be;
		int want512 = !(off & 1) && have_avx512(), want2 = !(off & 2) && have_avx2();
		assert_int_equal(cb->have_avx512, want512);
		assert_int_equal(cb->have_avx2, want2);
		int isa = want512 ? CPU_ISA_AVX512 : want2 ? CPU_ISA_AVX2 : CPU_ISA_PORTABLE;
		assert_int_equal(cpu_mm_isa(cb), isa);
		assert_int_equal(strstr(be->desc, ", avx512") != NULL, want512);
		assert_int_equal(strstr(be->desc, ", avx2") != NULL, !want512 && want2);
		poison(a, ny);
		be->ops->matmul(be, a, c.x, &c.w, MAX_TOK);
		mm_run(isa_path(isa), b, c.x, &c.w, MAX_TOK);
		assert_memory_equal(a, b, ny * sizeof(float));
		mm_run(0, b, c.x, &c.w, MAX_TOK);
		assert_memory_equal(a, b, ny * sizeof(float));
		backend_free(be);
	}
	backend_free(NULL);
	for (int v = 0; v < 2; v++) {
		assert_int_equal(saved[v] ? setenv(vars[v], saved[v], 1) : unsetenv(vars[v]), 0);
		free(saved[v]);
	}
	free(a);
	free(b);
	mm_case_done(&c);
}

/* ---- rmsnorm ------------------------------------------------------------ */

static void test_rmsnorm(void **state)
{
	(void)state;
	static const int widths[] = { 1, 7, 17, 64, 300 };
	const float eps = 1e-5f;
	const int NT = 5;
	rng_seed(11);
	for (size_t wi = 0; wi < N_ELEMS(widths); wi++) {
		int n = widths[wi];
		size_t len = (size_t)NT * n;
		float *x = xmalloc(len * sizeof(float)), *w = xmalloc((size_t)n * sizeof(float));
		float *y = xmalloc(len * sizeof(float)), *y1 = xmalloc((size_t)n * sizeof(float));
		float *yi = xmalloc(len * sizeof(float));
		fill(x, len, -3, 3);
		fill(w, (size_t)n, -2, 2);
		for (int bi = 0; bi < 2; bi++) {
			struct backend *be = bi ? g_be2 : g_be1;
			poison(y, len);
			be->ops->rmsnorm(be, y, x, w, n, NT, eps);
			for (int t = 0; t < NT; t++) {
				const float *xr = x + (size_t)t * n;
				double ss = 0;
				for (int i = 0; i < n; i++)
					ss += (double)xr[i] * xr[i];
				double s = 1.0 / sqrt(ss / n + eps);
				for (int i = 0; i < n; i++) {
					double r = w[i] * xr[i] * s;
					CHECK_CLOSE(y[(size_t)t * n + i], r, 1e-5 * fabs(r) + 1e-30,
						    "rmsnorm n %d t %d i %d\n", n, t, i);
				}
				/* row alone == row in the batch */
				poison(y1, (size_t)n);
				be->ops->rmsnorm(be, y1, xr, w, n, 1, eps);
				assert_memory_equal(y1, y + (size_t)t * n, (size_t)n * sizeof(float));
			}
			/* in place (the forward pass normalizes logit rows in place) */
			memcpy(yi, x, len * sizeof(float));
			be->ops->rmsnorm(be, yi, yi, w, n, NT, eps);
			assert_memory_equal(yi, y, len * sizeof(float));
		}
		free(x);
		free(w);
		free(y);
		free(y1);
		free(yi);
	}
}

/* ---- rope --------------------------------------------------------------- */

static void make_inv_freq(float *f, int hd, float theta)
{
	for (int i = 0; i < hd / 2; i++)
		f[i] = 1.0f / powf(theta, (float)(2 * i) / (float)hd);
}

/* Reference rotation of one head vector x (hd) in `layout`, output
 * interleaved, checked against got. */
static void rope_check_head(const float *got, const float *x, int hd, int pos,
			    const float *inv_freq, enum kt_rope_layout layout,
			    const char *what, int t, int h)
{
	int half = hd / 2;
	for (int i = 0; i < half; i++) {
		double a = layout == KT_ROPE_INTERLEAVED ? x[2 * i] : x[i];
		double b = layout == KT_ROPE_INTERLEAVED ? x[2 * i + 1] : x[i + half];
		float angf = (float)pos * inv_freq[i];
		double c = cos((double)angf), s = sin((double)angf);
		double tol = 1e-5 * (fabs(a) + fabs(b));
		CHECK_CLOSE(got[2 * i], a * c - b * s, tol,
			    "%s layout %d hd %d pos %d t %d head %d pair %d (even)\n",
			    what, (int)layout, hd, pos, t, h, i);
		CHECK_CLOSE(got[2 * i + 1], a * s + b * c, tol,
			    "%s layout %d hd %d pos %d t %d head %d pair %d (odd)\n",
			    what, (int)layout, hd, pos, t, h, i);
	}
}

static void test_rope(void **state)
{
	(void)state;
	static const int hds[] = { 2, 6, 8, 64, 128 };
	static const int pos[] = { 0, 1, 2, 15, 16, 511, 4095, 65535 };
	const int NT = (int)N_ELEMS(pos), NH = 8, NKV = 2;
	rng_seed(12);
	for (size_t hi = 0; hi < N_ELEMS(hds); hi++) {
		int hd = hds[hi];
		size_t nq = (size_t)NT * NH * hd, nk = (size_t)NT * NKV * hd;
		float inv_freq[256];
		make_inv_freq(inv_freq, hd, hi & 1 ? 500000.0f : 10000.0f);
		float *q0 = xmalloc(nq * sizeof(float)), *k0 = xmalloc(nk * sizeof(float));
		float *q = xmalloc(nq * sizeof(float)), *k = xmalloc(nk * sizeof(float));
		float *q2 = xmalloc(nq * sizeof(float)), *k2 = xmalloc(nk * sizeof(float));
		fill(q0, nq, -2, 2);
		fill(k0, nk, -2, 2);
		for (int li = 0; li < 2; li++) {
			enum kt_rope_layout lay = li ? KT_ROPE_HALF : KT_ROPE_INTERLEAVED;
			for (int bi = 0; bi < 2; bi++) {
				struct backend *be = bi ? g_be2 : g_be1;
				memcpy(q, q0, nq * sizeof(float));
				memcpy(k, k0, nk * sizeof(float));
				be->ops->rope(be, q, k, pos, NT, NH, NKV, hd, inv_freq, lay);
				for (int t = 0; t < NT; t++) {
					for (int h = 0; h < NH; h++) {
						size_t o = ((size_t)t * NH + h) * hd;
						rope_check_head(q + o, q0 + o, hd, pos[t], inv_freq,
								lay, "q", t, h);
					}
					for (int h = 0; h < NKV; h++) {
						size_t o = ((size_t)t * NKV + h) * hd;
						rope_check_head(k + o, k0 + o, hd, pos[t], inv_freq,
								lay, "k", t, h);
					}
				}
				/* one token alone == the same token in the batch */
				int t = NT - 2;
				size_t oq = (size_t)t * NH * hd, ok = (size_t)t * NKV * hd;
				memcpy(q2, q0 + oq, (size_t)NH * hd * sizeof(float));
				memcpy(k2, k0 + ok, (size_t)NKV * hd * sizeof(float));
				be->ops->rope(be, q2, k2, pos + t, 1, NH, NKV, hd, inv_freq, lay);
				assert_memory_equal(q2, q + oq, (size_t)NH * hd * sizeof(float));
				assert_memory_equal(k2, k + ok, (size_t)NKV * hd * sizeof(float));
			}
		}
		free(q0);
		free(k0);
		free(q);
		free(k);
		free(q2);
		free(k2);
	}
}

/* Permute each head of v (n heads of hd) from the half layout (pairs (i,
 * i+hd/2)) to the interleaved one (pairs (2i, 2i+1)). */
static void half_to_interleaved(float *dst, const float *src, int n, int hd)
{
	int half = hd / 2;
	for (int h = 0; h < n; h++)
		for (int i = 0; i < half; i++) {
			dst[(size_t)h * hd + 2 * i] = src[(size_t)h * hd + i];
			dst[(size_t)h * hd + 2 * i + 1] = src[(size_t)h * hd + i + half];
		}
}

/* KT_ROPE_HALF on x equals KT_ROPE_INTERLEAVED on x permuted: bit-identical. */
static void test_rope_layouts_equivalent(void **state)
{
	(void)state;
	static const int hds[] = { 2, 8, 16, 128 };
	static const int pos[] = { 0, 3, 17, 100, 511, 2047 };
	const int NT = (int)N_ELEMS(pos), NH = 8, NKV = 4;
	rng_seed(13);
	for (size_t hi = 0; hi < N_ELEMS(hds); hi++) {
		int hd = hds[hi];
		size_t nq = (size_t)NT * NH * hd, nk = (size_t)NT * NKV * hd;
		float inv_freq[256];
		make_inv_freq(inv_freq, hd, 10000.0f);
		float *qh = xmalloc(nq * sizeof(float)), *kh = xmalloc(nk * sizeof(float));
		float *qi = xmalloc(nq * sizeof(float)), *ki = xmalloc(nk * sizeof(float));
		fill(qh, nq, -4, 4);
		fill(kh, nk, -4, 4);
		half_to_interleaved(qi, qh, NT * NH, hd);
		half_to_interleaved(ki, kh, NT * NKV, hd);
		g_be1->ops->rope(g_be1, qh, kh, pos, NT, NH, NKV, hd, inv_freq, KT_ROPE_HALF);
		g_be1->ops->rope(g_be1, qi, ki, pos, NT, NH, NKV, hd, inv_freq,
				 KT_ROPE_INTERLEAVED);
		assert_memory_equal(qh, qi, nq * sizeof(float));
		assert_memory_equal(kh, ki, nk * sizeof(float));
		free(qh);
		free(kh);
		free(qi);
		free(ki);
	}
}

/* ---- kv_store + attention ---------------------------------------------- */

struct attn_seq {
	int n_blocks;
	int32_t table[16];
	int n_pos;      /* positions 0..n_pos-1 are stored and queried */
};

struct attn_cfg {
	int block_size, n_blocks, n_layers, layer;
	int n_heads, n_kv_heads, hd;
	int n_seqs;
	struct attn_seq seqs[2];
};

/* Layout per kernels/backend.h, computed here independently. */
/* Start of the K (which 0, transposed [kv_dim][block_size]) or V (which 1,
 * row-major) span of (block, layer), computed independently of the code. */
static float *kv_span_addr(const struct kt_kv *kv, int b, int l, int which)
{
	size_t span = (size_t)kv->block_size * kv->kv_dim;
	return (float *)kv->base + (((size_t)b * kv->n_layers + l) * 2 + which) * span;
}

/* K row of (block, layer, row), gathered from the transposed span. */
static void k_row(const struct kt_kv *kv, int b, int l, int row, float *out)
{
	const float *kt = kv_span_addr(kv, b, l, 0);
	for (int c = 0; c < kv->kv_dim; c++)
		out[c] = kt[(size_t)c * kv->block_size + row];
}

static void attn_case(const struct attn_cfg *cfg)
{
	int kvd = cfg->n_kv_heads * cfg->hd, qd = cfg->n_heads * cfg->hd;
	struct kt_kv kv = { NULL, cfg->n_blocks, cfg->block_size, cfg->n_layers, kvd, KT_F32, 0 };
	size_t kv_floats = kt_kv_block_bytes(&kv) / sizeof(float) * cfg->n_blocks;
	assert_int_equal(kt_kv_block_bytes(&kv),
			 (size_t)cfg->n_layers * 2 * cfg->block_size * kvd * sizeof(float));
	kv.base = xmalloc(kv_floats * sizeof(float));
	poison(kv.base, kv_floats);

	int T = 0;
	for (int s = 0; s < cfg->n_seqs; s++)
		T += cfg->seqs[s].n_pos;
	/* rows: sequences one after another, positions 0..n_pos-1 */
	struct kt_attn_row *rows = xmalloc((size_t)T * sizeof(*rows));
	int *seq_of = xmalloc((size_t)T * sizeof(int));
	for (int s = 0, t = 0; s < cfg->n_seqs; s++)
		for (int p = 0; p < cfg->seqs[s].n_pos; p++, t++) {
			rows[t].block_table = cfg->seqs[s].table;
			rows[t].pos = p;
			seq_of[t] = s;
		}
	float *k = xmalloc((size_t)T * kvd * sizeof(float));
	float *v = xmalloc((size_t)T * kvd * sizeof(float));
	float *q = xmalloc((size_t)T * qd * sizeof(float));
	fill(k, (size_t)T * kvd, -1, 1);
	fill(v, (size_t)T * kvd, -1, 1);
	fill(q, (size_t)T * qd, -1.5, 1.5);

	g_be1->ops->kv_store(g_be1, &kv, cfg->layer, k, v, rows, T);
	/* every row landed where the layout says, and nothing else was written */
	for (int t = 0; t < T; t++) {
		const int32_t *tab = rows[t].block_table;
		int p = rows[t].pos, bs = cfg->block_size;
		float ka[1024], kb[1024];
		assert_true(kvd <= 1024);
		k_row(&kv, tab[p / bs], cfg->layer, p % bs, ka);
		kt_kv_get_k(&kv, tab[p / bs], cfg->layer, p % bs, kb);
		float *va = kv_span_addr(&kv, tab[p / bs], cfg->layer, 1) + (size_t)(p % bs) * kvd;
		assert_ptr_equal(kt_kv_kt(&kv, tab[p / bs], cfg->layer),
				 kv_span_addr(&kv, tab[p / bs], cfg->layer, 0));
		assert_ptr_equal(kv_span_addr(&kv, tab[p / bs], cfg->layer, 1),
				 kt_kv_vspan(&kv, tab[p / bs], cfg->layer));
		float vb[1024];
		kt_kv_get_v(&kv, tab[p / bs], cfg->layer, p % bs, vb);
		assert_memory_equal(vb, va, (size_t)kvd * sizeof(float));
		assert_memory_equal(ka, k + (size_t)t * kvd, (size_t)kvd * sizeof(float));
		assert_memory_equal(kb, ka, (size_t)kvd * sizeof(float));
		assert_memory_equal(va, v + (size_t)t * kvd, (size_t)kvd * sizeof(float));
	}
	size_t written = 0;
	for (size_t i = 0; i < kv_floats; i++)
		written += !isnan(((float *)kv.base)[i]);
	assert_int_equal(written, (size_t)T * kvd * 2);

	float *out = xmalloc((size_t)T * qd * sizeof(float));
	float *out2 = xmalloc((size_t)T * qd * sizeof(float));
	float *one = xmalloc((size_t)qd * sizeof(float));
	poison(out, (size_t)T * qd);
	g_be1->ops->attention(g_be1, out, q, &kv, cfg->layer, rows, T, cfg->n_heads,
			      cfg->n_kv_heads, cfg->hd);

	/* naive contiguous attention in double: this sequence's rows are its
	 * positions in order, so K/V of position p is row (first row + p) */
	int grp = cfg->n_heads / cfg->n_kv_heads;
	double *sc = xmalloc((size_t)T * sizeof(double));
	for (int t = 0; t < T; t++) {
		int first = t - rows[t].pos, n = rows[t].pos + 1;
		for (int h = 0; h < cfg->n_heads; h++) {
			int kh = h / grp;
			const float *qv = q + ((size_t)t * cfg->n_heads + h) * cfg->hd;
			double mx = -INFINITY, sum = 0;
			for (int p = 0; p < n; p++) {
				const float *kr = k + (size_t)(first + p) * kvd + (size_t)kh * cfg->hd;
				double d = 0;
				for (int i = 0; i < cfg->hd; i++)
					d += (double)qv[i] * kr[i];
				sc[p] = d / sqrt((double)cfg->hd);
				mx = sc[p] > mx ? sc[p] : mx;
			}
			for (int p = 0; p < n; p++)
				sum += sc[p] = exp(sc[p] - mx);
			for (int i = 0; i < cfg->hd; i++) {
				double r = 0, ra = 0;
				for (int p = 0; p < n; p++) {
					double vv = v[(size_t)(first + p) * kvd + (size_t)kh * cfg->hd + i];
					r += sc[p] / sum * vv;
					ra += sc[p] / sum * fabs(vv);
				}
				CHECK_CLOSE(out[((size_t)t * cfg->n_heads + h) * cfg->hd + i], r,
					    1e-5 * ra + 1e-7,
					    "attention seq %d pos %d head %d (kv head %d) i %d\n",
					    seq_of[t], rows[t].pos, h, kh, i);
			}
		}
	}

	/* each row alone == the row in the batch; 2 threads == 1 thread */
	for (int t = 0; t < T; t++) {
		poison(one, (size_t)qd);
		g_be1->ops->attention(g_be1, one, q + (size_t)t * qd, &kv, cfg->layer, rows + t,
				      1, cfg->n_heads, cfg->n_kv_heads, cfg->hd);
		if (memcmp(one, out + (size_t)t * qd, (size_t)qd * sizeof(float)))
			fail_msg("attention row %d (seq %d pos %d) alone differs from batch", t,
				 seq_of[t], rows[t].pos);
	}
	poison(out2, (size_t)T * qd);
	g_be2->ops->attention(g_be2, out2, q, &kv, cfg->layer, rows, T, cfg->n_heads,
			      cfg->n_kv_heads, cfg->hd);
	assert_memory_equal(out, out2, (size_t)T * qd * sizeof(float));

	/* the sixteen-float and the eight-float code give the same bits (the
	 * former in its AVX-512 clone where the CPU has it, else its
	 * baseline one) */
	struct cpu_backend *cb1 = (struct cpu_backend *)g_be1;
	int wide = cb1->attn_wide;
	cb1->attn_wide = !wide;
	poison(out2, (size_t)T * qd);
	g_be1->ops->attention(g_be1, out2, q, &kv, cfg->layer, rows, T, cfg->n_heads,
			      cfg->n_kv_heads, cfg->hd);
	cb1->attn_wide = wide;
	if (memcmp(out, out2, (size_t)T * qd * sizeof(float)))
		fail_msg("attention hd %d: the %d-float code differs from the %d-float one",
			 cfg->hd, wide ? 8 : 16, wide ? 16 : 8);

	free(sc);
	free(out);
	free(out2);
	free(one);
	free(q);
	free(k);
	free(v);
	free(rows);
	free(seq_of);
	free(kv.base);
}

/*
 * Typed K/V (f16, q8_0): kv_store converts each row once (the stored value
 * within half a step of the input: f16 2^-11 relative, q8_0 half its
 * group's scale), and attention over the typed store gives exactly the
 * bits of attention over an f32 store holding the same (dequantized)
 * values; a row alone gives the bits it gives in the batch, and two
 * threads those of one. Head dims 8, 16, 64 and 128 (q8_0 groups 8, 16,
 * 32, 32), GQA, two sequences over out-of-order tables, partial last
 * blocks, decode rows and tiles of several tokens.
 */
static void test_attention_typed(void **state)
{
	(void)state;
	static const int hds[] = { 8, 16, 64, 128 };
	static const enum kt_dtype dts[] = { KT_F16, KT_Q8_0 };
	rng_seed(29);
	for (size_t hi = 0; hi < N_ELEMS(hds); hi++)
		for (size_t di = 0; di < N_ELEMS(dts); di++) {
			int hd = hds[hi], NH = 8, NKV = 2, NL = 2, layer = 1, NB = 12;
			int kvd = NKV * hd, qd = NH * hd;
			/* seq 0: 37 positions over blocks {7, 1, 4}; seq 1: 21 over {0, 9} */
			static const int32_t tab0[] = { 7, 1, 4 }, tab1[] = { 0, 9 };
			const int n0 = 37, n1 = 21, T = n0 + n1;
			struct kt_kv tk = { NULL, NB, 16, NL, kvd, dts[di], kt_kv_group_for(hd) };
			struct kt_kv fk = { NULL, NB, 16, NL, kvd, KT_F32, 0 };
			assert_true(kt_kv_dtype_ok(dts[di], hd));
			tk.base = xmalloc(kt_kv_block_bytes(&tk) * NB);
			fk.base = xmalloc(kt_kv_block_bytes(&fk) * NB);
			memset(tk.base, 0, kt_kv_block_bytes(&tk) * NB);
			memset(fk.base, 0, kt_kv_block_bytes(&fk) * NB);
			float *k = xmalloc((size_t)T * kvd * sizeof(float));
			float *v = xmalloc((size_t)T * kvd * sizeof(float));
			float *q = xmalloc((size_t)T * qd * sizeof(float));
			float *o1 = xmalloc((size_t)T * qd * sizeof(float));
			float *o2 = xmalloc((size_t)T * qd * sizeof(float));
			float *kr = xmalloc((size_t)kvd * sizeof(float));
			float *vr = xmalloc((size_t)kvd * sizeof(float));
			fill(k, (size_t)T * kvd, -3, 3);
			fill(v, (size_t)T * kvd, -2, 2);
			fill(q, (size_t)T * qd, -1, 1);
			struct kt_attn_row *rows = xmalloc((size_t)T * sizeof(*rows));
			for (int t = 0; t < T; t++)
				rows[t] = t < n0 ? (struct kt_attn_row){ tab0, t }
						 : (struct kt_attn_row){ tab1, t - n0 };
			g_be1->ops->kv_store(g_be1, &tk, layer, k, v, rows, T);
			for (int t = 0; t < T; t++) {
				int32_t b = rows[t].block_table[rows[t].pos / 16];
				int r = rows[t].pos % 16;
				kt_kv_get_k(&tk, b, layer, r, kr);
				kt_kv_get_v(&tk, b, layer, r, vr);
				for (int pass = 0; pass < 2; pass++) {
					const float *x = (pass ? v : k) + (size_t)t * kvd, *y = pass ? vr : kr;
					for (int g0 = 0; g0 < kvd; g0 += tk.group) {
						float amax = 0;
						for (int c = g0; c < g0 + tk.group; c++)
							amax = fmaxf(amax, fabsf(x[c]));
						for (int c = g0; c < g0 + tk.group; c++) {
							float tol = dts[di] == KT_F16 ? fabsf(x[c]) / 2048 + 1e-7f
										: amax / 127 * 0.5f * 1.002f + 1e-6f;
							CHECK_CLOSE(y[c], x[c], tol, "%s stored %s t %d c %d\n",
								    kt_dtype_name(dts[di]), pass ? "v" : "k", t, c);
						}
					}
				}
				kt_kv_put(&fk, b, layer, r, kr, vr);
			}
			g_be1->ops->attention(g_be1, o1, q, &tk, layer, rows, T, NH, NKV, hd);
			g_be1->ops->attention(g_be1, o2, q, &fk, layer, rows, T, NH, NKV, hd);
			if (memcmp(o1, o2, (size_t)T * qd * sizeof(float)))
				fail_msg("%s hd %d: typed attention differs from f32 attention over "
					 "the same values", kt_dtype_name(dts[di]), hd);
			g_be2->ops->attention(g_be2, o2, q, &tk, layer, rows, T, NH, NKV, hd);
			assert_memory_equal(o1, o2, (size_t)T * qd * sizeof(float));
			for (int t = 0; t < T; t += 5) {
				g_be1->ops->attention(g_be1, o2, q + (size_t)t * qd, &tk, layer, rows + t, 1,
						      NH, NKV, hd);
				if (memcmp(o2, o1 + (size_t)t * qd, (size_t)qd * sizeof(float)))
					fail_msg("%s hd %d: row %d alone differs from the batch",
						 kt_dtype_name(dts[di]), hd, t);
			}
			free(tk.base);
			free(fk.base);
			free(k);
			free(v);
			free(q);
			free(o1);
			free(o2);
			free(kr);
			free(vr);
			free(rows);
		}
}

/* Small blocks, table {5, 2, 7} (out of order), GQA 8/2, 11 positions so
 * queries cross two block boundaries and the last block is partly filled
 * (its unwritten row stays NaN: reading it would show). A second sequence
 * with its own table shares the calls. Layer 1 of 2: layer 0 stays NaN. */
static void test_attention_paged(void **state)
{
	(void)state;
	rng_seed(21);
	struct attn_cfg cfg = {
		.block_size = 4, .n_blocks = 8, .n_layers = 2, .layer = 1,
		.n_heads = 8, .n_kv_heads = 2, .hd = 16, .n_seqs = 2,
		.seqs = { { 3, { 5, 2, 7 }, 11 }, { 2, { 0, 3 }, 6 } },
	};
	attn_case(&cfg);
}

/* Big enough for the backend to use 2 threads: 8 shuffled blocks of 16,
 * 128 query rows; plus the stories260K head shape (8 heads, 4 kv, hd 8). */
static void test_attention_threads(void **state)
{
	(void)state;
	rng_seed(22);
	struct attn_cfg cfg = {
		.block_size = 16, .n_blocks = 12, .n_layers = 3, .layer = 0,
		.n_heads = 8, .n_kv_heads = 2, .hd = 16, .n_seqs = 1,
		.seqs = { { 8, { 9, 3, 11, 0, 7, 5, 1, 10 }, 128 } },
	};
	attn_case(&cfg);
	struct attn_cfg cfg2 = {
		.block_size = 16, .n_blocks = 6, .n_layers = 5, .layer = 4,
		.n_heads = 8, .n_kv_heads = 4, .hd = 8, .n_seqs = 2,
		.seqs = { { 3, { 4, 0, 2 }, 40 }, { 2, { 5, 1 }, 17 } },
	};
	attn_case(&cfg2);
}

/* Head sizes 64 and 128 with blocks of 16: rows of one sequence are taken
 * four at a time (attn_group4) in a batch and one at a time alone; the
 * alone-vs-batch check above requires identical bits. Sequence lengths that
 * are not multiples of 4 leave groups that straddle two sequences (which
 * must not be grouped) and single leftover rows. */
static void test_attention_row_groups(void **state)
{
	(void)state;
	rng_seed(23);
	struct attn_cfg cfg = {
		.block_size = 16, .n_blocks = 10, .n_layers = 2, .layer = 1,
		.n_heads = 4, .n_kv_heads = 2, .hd = 64, .n_seqs = 2,
		.seqs = { { 5, { 8, 1, 6, 3, 0 }, 71 }, { 3, { 2, 9, 4 }, 38 } },
	};
	attn_case(&cfg);
	struct attn_cfg cfg2 = {
		.block_size = 16, .n_blocks = 4, .n_layers = 1, .layer = 0,
		.n_heads = 2, .n_kv_heads = 1, .hd = 128, .n_seqs = 1,
		.seqs = { { 4, { 3, 0, 2, 1 }, 50 } },
	};
	attn_case(&cfg2);
	/* head sizes that take every output chunk of both codes: 48 (stories15M:
	 * 3 x 16, 6 x 8), 20 (8-float chunks and a scalar rest), 192 (row
	 * groups, 3 x 64) */
	static const int hds[] = { 48, 20, 192 };
	for (size_t i = 0; i < N_ELEMS(hds); i++) {
		struct attn_cfg c3 = {
			.block_size = 16, .n_blocks = 6, .n_layers = 1, .layer = 0,
			.n_heads = 4, .n_kv_heads = 2, .hd = hds[i], .n_seqs = 2,
			.seqs = { { 3, { 4, 1, 5 }, 41 }, { 2, { 0, 2 }, 23 } },
		};
		attn_case(&c3);
	}
}

/* ---- element-wise ------------------------------------------------------- */

static void test_silu_mul(void **state)
{
	(void)state;
	static const size_t ns[] = { 1, 15, 17, 1000, 70001 };
	static const float special[] = { 0.0f, -0.0f, 20.0f, -20.0f, 87.5f, -87.5f,
					 100.0f, -100.0f, 1e-20f, -1e-20f };
	rng_seed(31);
	for (size_t ni = 0; ni < N_ELEMS(ns); ni++) {
		size_t n = ns[ni];
		float *g0 = xmalloc(n * sizeof(float)), *u = xmalloc(n * sizeof(float));
		float *g = xmalloc(n * sizeof(float)), *g2 = xmalloc(n * sizeof(float));
		fill(g0, n, -10, 10);
		fill(u, n, -3, 3);
		for (size_t i = 0; i < N_ELEMS(special) && i < n; i++)
			g0[n - 1 - i] = special[i];
		for (int bi = 0; bi < 2; bi++) {
			struct backend *be = bi ? g_be2 : g_be1;
			memcpy(g, g0, n * sizeof(float));
			be->ops->silu_mul(be, g, u, n);
			for (size_t i = 0; i < n; i++) {
				double x = g0[i];
				double r = x / (1.0 + exp(-x)) * u[i];
				CHECK_CLOSE(g[i], r, 1e-5 * fabs(r) + 1e-30,
					    "silu_mul n %zu i %zu g %g u %g\n", n, i, x, (double)u[i]);
			}
			if (bi == 0)
				memcpy(g2, g, n * sizeof(float));
			else
				assert_memory_equal(g, g2, n * sizeof(float));
		}
		free(g0);
		free(u);
		free(g);
		free(g2);
	}
}

static void test_add(void **state)
{
	(void)state;
	static const size_t ns[] = { 1, 17, 1000, 70001 };
	rng_seed(32);
	for (size_t ni = 0; ni < N_ELEMS(ns); ni++) {
		size_t n = ns[ni];
		float *y0 = xmalloc(n * sizeof(float)), *x = xmalloc(n * sizeof(float));
		float *y = xmalloc(n * sizeof(float));
		fill(y0, n, -100, 100);
		fill(x, n, -1, 1);
		for (int bi = 0; bi < 2; bi++) {
			struct backend *be = bi ? g_be2 : g_be1;
			memcpy(y, y0, n * sizeof(float));
			be->ops->add(be, y, x, n);
			/* fp32 addition via double is exactly rounded (53 >= 2*24+2) */
			for (size_t i = 0; i < n; i++)
				if (y[i] != (float)((double)y0[i] + (double)x[i]))
					fail_msg("add n %zu i %zu: %.9g + %.9g = %.9g", n, i,
						 (double)y0[i], (double)x[i], (double)y[i]);
		}
		free(y0);
		free(x);
		free(y);
	}
}

static void test_embed(void **state)
{
	(void)state;
	static const int32_t tok[] = { 0, 36, 5, 5, 12, 1 };
	const int NT = (int)N_ELEMS(tok), V = 37;
	static const int dims[] = { 17, 64, 300 };
	rng_seed(33);
	for (size_t di = 0; di < N_ELEMS(mm_dtypes); di++)
		for (size_t wi = 0; wi < N_ELEMS(dims); wi++) {
			enum kt_dtype dt = mm_dtypes[di];
			int d = dims[wi];
			size_t n = (size_t)V * d;
			void *data = xmalloc(n * kt_dtype_size(dt));
			/* f32: random values; f16/bf16: random bit patterns over the
			 * whole range (subnormals, inf and NaN included) */
			for (size_t i = 0; i < n; i++) {
				if (dt == KT_F32)
					((float *)data)[i] = rng_float(-5, 5);
				else
					((uint16_t *)data)[i] = (uint16_t)rng_u64();
			}
			struct kt_weight tab = { data, dt, V, d, NULL };
			float *y = xmalloc((size_t)NT * d * sizeof(float));
			for (int bi = 0; bi < 2; bi++) {
				struct backend *be = bi ? g_be2 : g_be1;
				poison(y, (size_t)NT * d);
				be->ops->embed(be, y, &tab, tok, NT);
				for (int t = 0; t < NT; t++)
					for (int i = 0; i < d; i++) {
						size_t o = (size_t)tok[t] * d + i;
						double r = dt == KT_F32 ? ((float *)data)[o]
							 : dt == KT_F16 ? ref_f16(((uint16_t *)data)[o])
									: ref_bf16(((uint16_t *)data)[o]);
						float g = y[(size_t)t * d + i];
						int ok = isnan(r) ? isnan(g)
								  : (g == r && !signbit(g) == !signbit(r));
						if (!ok)
							fail_msg("embed %s d %d t %d i %d: got %.9g want %.9g",
								 kt_dtype_name(dt), d, t, i, (double)g, r);
					}
			}
			free(y);
			free(data);
		}
}

/* ---- dtype conversions -------------------------------------------------- */

static void test_dtype_helpers(void **state)
{
	(void)state;
	assert_int_equal(kt_dtype_size(KT_F32), 4);
	assert_int_equal(kt_dtype_size(KT_F16), 2);
	assert_int_equal(kt_dtype_size(KT_BF16), 2);
	assert_string_equal(kt_dtype_name(KT_F32), "f32");
	assert_string_equal(kt_dtype_name(KT_F16), "f16");
	assert_string_equal(kt_dtype_name(KT_BF16), "bf16");
}

/* All 65536 halfs: exact decode, and encode(decode(h)) == h (NaNs stay NaN
 * with their sign). */
static void test_f16_all_halfs(void **state)
{
	(void)state;
	for (uint32_t h = 0; h < 65536; h++) {
		float f = kt_f16_to_f32((uint16_t)h);
		double r = ref_f16((uint16_t)h);
		uint16_t back = kt_f32_to_f16(f);
		if (isnan(r)) {
			if (!isnan(f) || !signbit(f) != !(h & 0x8000))
				fail_msg("f16 0x%04x: want NaN, got %g", h, (double)f);
			if ((back & 0x7c00) != 0x7c00 || !(back & 0x3ff) ||
			    (back & 0x8000) != (h & 0x8000))
				fail_msg("f16 NaN 0x%04x round trip gave 0x%04x", h, back);
			continue;
		}
		if (f != r || !signbit(f) != !signbit(r))
			fail_msg("f16 0x%04x: got %.9g want %.9g", h, (double)f, r);
		if (back != h)
			fail_msg("f16 0x%04x: round trip gave 0x%04x", h, back);
	}
}

/* Every tie between adjacent halfs (and the floats on either side of it)
 * encodes like the independent ties-to-even encoder. */
static void test_f16_ties_exhaustive(void **state)
{
	(void)state;
	for (uint32_t h = 0; h < 0x7c00; h++) {
		double lo = ref_f16((uint16_t)h);
		double hi = h + 1 < 0x7c00 ? ref_f16((uint16_t)(h + 1)) : 65536.0;
		float mid = (float)((lo + hi) / 2);  /* exact: 12 significant bits */
		assert_true((double)mid == (lo + hi) / 2);
		float cand[3] = { mid, nextafterf(mid, 0), nextafterf(mid, INFINITY) };
		for (int i = 0; i < 3; i++)
			for (int s = 0; s < 2; s++) {
				float f = s ? -cand[i] : cand[i];
				uint16_t got = kt_f32_to_f16(f), want = ref_to_f16(f);
				if (got != want)
					fail_msg("f32 %a -> f16 0x%04x, want 0x%04x", (double)f, got, want);
			}
	}
}

static void test_f16_examples(void **state)
{
	(void)state;
	static const struct {
		float f;
		uint16_t h;
	} ex[] = {
		{ 0.0f, 0x0000 }, { -0.0f, 0x8000 }, { 1.0f, 0x3c00 }, { -2.0f, 0xc000 },
		/* ties to even */
		{ 1.0f + 0x1p-11f, 0x3c00 },          /* halfway 1 .. 1+2^-10: even is 1 */
		{ 1.0f + 3 * 0x1p-11f, 0x3c02 },      /* halfway 0x3c01 .. 0x3c02 */
		{ 1.0f + 0x1p-11f + 0x1p-23f, 0x3c01 },  /* just above the tie */
		{ 2049.0f, 0x6800 },                  /* 2048 | 2050: even 2048 */
		{ 2051.0f, 0x6802 },                  /* 2050 | 2052: even 2052 */
		{ 0.333333343f, 0x3555 },
		/* overflow */
		{ 65504.0f, 0x7bff }, { 65519.996f, 0x7bff }, { 65520.0f, 0x7c00 },
		{ -65520.0f, 0xfc00 }, { 1e10f, 0x7c00 }, { INFINITY, 0x7c00 },
		{ -INFINITY, 0xfc00 }, { 3.4028235e38f, 0x7c00 },
		/* subnormals */
		{ 0x1p-24f, 0x0001 }, { 0x1p-25f, 0x0000 },   /* tie 0 | 1: even 0 */
		{ 0x1.000002p-25f, 0x0001 }, { 3 * 0x1p-25f, 0x0002 },
		{ 5 * 0x1p-25f, 0x0002 }, { -0x1p-24f, 0x8001 },
		{ 1023 * 0x1p-24f, 0x03ff }, { 1023.5f * 0x1p-24f, 0x0400 },
		{ 0x1p-14f, 0x0400 }, { 0x1p-26f, 0x0000 }, { 1e-45f, 0x0000 },
		{ -1e-45f, 0x8000 },
	};
	for (size_t i = 0; i < N_ELEMS(ex); i++) {
		uint16_t got = kt_f32_to_f16(ex[i].f);
		if (got != ex[i].h)
			fail_msg("f16 example %zu: %a -> 0x%04x, want 0x%04x", i, (double)ex[i].f,
				 got, ex[i].h);
	}
	assert_true(isinf(kt_f16_to_f32(0x7c00)) && kt_f16_to_f32(0x7c00) > 0);
	assert_true(kt_f16_to_f32(0x0001) == 0x1p-24f);
	assert_true(kt_f16_to_f32(0x7bff) == 65504.0f);
	assert_true(isnan(kt_f16_to_f32(0x7e00)) && isnan(kt_f16_to_f32(0xfc01)));
	/* NaN inputs stay NaN, sign kept */
	uint16_t n1 = kt_f32_to_f16(NAN), n2 = kt_f32_to_f16(-NAN);
	uint16_t n3 = kt_f32_to_f16(bits_f32(0x7f800001u));  /* payload only in low bits */
	assert_true((n1 & 0x7c00) == 0x7c00 && (n1 & 0x3ff) && !(n1 & 0x8000));
	assert_true((n2 & 0x7c00) == 0x7c00 && (n2 & 0x3ff) && (n2 & 0x8000));
	assert_true((n3 & 0x7c00) == 0x7c00 && (n3 & 0x3ff));
}

#if defined(__x86_64__)
__attribute__((target("f16c"))) static float hw_h2f(uint16_t h)
{
	return _cvtsh_ss(h);
}

__attribute__((target("f16c"))) static uint16_t hw_f2h(float f)
{
	return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}
#endif

/* Random float bit patterns: the independent encoder, and the F16C
 * instructions (what the AVX-512 matmul uses) where present. */
static void test_f16_random_vs_reference(void **state)
{
	(void)state;
	rng_seed(41);
#if defined(__x86_64__)
	__builtin_cpu_init();
	int hw = __builtin_cpu_supports("f16c");
#else
	int hw = 0;
#endif
	for (int i = 0; i < (1 << 20); i++) {
		uint32_t u = (uint32_t)rng_u64();
		if (i & 1)  /* half the samples in and around the f16 range */
			u = (u & 0x80ffffffu) | ((uint32_t)(96 + (rng_u64() % 48)) << 23);
		float f = bits_f32(u);
		uint16_t got = kt_f32_to_f16(f);
		if (isnan(f)) {
			assert_true((got & 0x7c00) == 0x7c00 && (got & 0x3ff));
			continue;
		}
		uint16_t want = ref_to_f16(f);
		if (got != want)
			fail_msg("f32 0x%08x (%a) -> f16 0x%04x, want 0x%04x", u, (double)f, got, want);
#if defined(__x86_64__)
		if (hw && hw_f2h(f) != got)
			fail_msg("f32 0x%08x -> f16 0x%04x, F16C says 0x%04x", u, got, hw_f2h(f));
#endif
	}
#if defined(__x86_64__)
	if (hw)
		for (uint32_t h = 0; h < 65536; h++) {
			float a = kt_f16_to_f32((uint16_t)h), b = hw_h2f((uint16_t)h);
			if (isnan(b) ? !isnan(a) : f32_bits(a) != f32_bits(b))
				fail_msg("f16 0x%04x: %a, F16C says %a", h, (double)a, (double)b);
		}
#else
	(void)hw;
#endif
}

static void test_bf16(void **state)
{
	(void)state;
	/* all 65536: exact decode and round trip, NaNs stay NaN */
	for (uint32_t h = 0; h < 65536; h++) {
		float f = kt_bf16_to_f32((uint16_t)h);
		double r = ref_bf16((uint16_t)h);
		uint16_t back = kt_f32_to_bf16(f);
		if (isnan(r)) {
			if (!isnan(f) || (back & 0x7f80) != 0x7f80 || !(back & 0x7f) ||
			    (back & 0x8000) != (h & 0x8000))
				fail_msg("bf16 NaN 0x%04x: %g, round trip 0x%04x", h, (double)f, back);
			continue;
		}
		if (f != r || !signbit(f) != !signbit(r))
			fail_msg("bf16 0x%04x: got %.9g want %.9g", h, (double)f, r);
		if (back != h)
			fail_msg("bf16 0x%04x: round trip gave 0x%04x", h, back);
	}
	static const struct {
		uint32_t f;
		uint16_t h;
	} ex[] = {
		{ 0x3f800000u, 0x3f80 },  /* 1 */
		{ 0x3f808000u, 0x3f80 },  /* 1 + 2^-8: tie, even is 1 */
		{ 0x3f818000u, 0x3f82 },  /* 1 + 3*2^-8: tie, even is 1 + 2^-6 */
		{ 0x3f808001u, 0x3f81 },  /* just above the tie */
		{ 0x3f807fffu, 0x3f80 },  /* just below */
		{ 0x7f7fffffu, 0x7f80 },  /* FLT_MAX rounds to inf */
		{ 0x7f7f7fffu, 0x7f7f },  /* largest that stays finite */
		{ 0xff7fffffu, 0xff80 },
		{ 0x7f800000u, 0x7f80 }, { 0xff800000u, 0xff80 },
		{ 0x00000001u, 0x0000 },  /* smallest subnormal rounds to 0 */
		{ 0x00008000u, 0x0000 },  /* tie 0 | 0x0001: even 0 */
		{ 0x00018000u, 0x0002 },  /* tie 1 | 2: even 2 */
		{ 0x007fffffu, 0x0080 },  /* largest subnormal rounds up to FLT_MIN */
		{ 0x80000000u, 0x8000 },
	};
	for (size_t i = 0; i < N_ELEMS(ex); i++) {
		uint16_t got = kt_f32_to_bf16(bits_f32(ex[i].f));
		if (got != ex[i].h)
			fail_msg("bf16 example 0x%08x -> 0x%04x, want 0x%04x", ex[i].f, got, ex[i].h);
	}
	/* NaNs with payload only in the low 16 bits must not become inf */
	uint16_t n = kt_f32_to_bf16(bits_f32(0x7f800001u));
	assert_true((n & 0x7f80) == 0x7f80 && (n & 0x7f));
	n = kt_f32_to_bf16(bits_f32(0xffffffffu));
	assert_true((n & 0x7f80) == 0x7f80 && (n & 0x7f) && (n & 0x8000));
	/* random bit patterns vs the independent encoder */
	rng_seed(42);
	for (int i = 0; i < (1 << 20); i++) {
		uint32_t u = (uint32_t)rng_u64();
		float f = bits_f32(u);
		if (isnan(f))
			continue;
		uint16_t got = kt_f32_to_bf16(f), want = ref_to_bf16(f);
		if (got != want)
			fail_msg("f32 0x%08x -> bf16 0x%04x, want 0x%04x", u, got, want);
	}
}

static void test_kv_helpers(void **state)
{
	(void)state;
	float base[4];
	struct kt_kv kv = { base, 9, 16, 5, 32, KT_F32, 0 };
	assert_int_equal(kt_kv_block_bytes(&kv), (size_t)5 * 2 * 16 * 32 * 4);
	for (int b = 0; b < 9; b++) {
		assert_ptr_equal(kt_kv_block(&kv, b), kv_span_addr(&kv, b, 0, 0));
		for (int l = 0; l < 5; l++) {
			assert_ptr_equal(kt_kv_kt(&kv, b, l), kv_span_addr(&kv, b, l, 0));
			assert_ptr_equal(kt_kv_vspan(&kv, b, l), kv_span_addr(&kv, b, l, 1));
		}
	}
}

/* ---- main --------------------------------------------------------------- */

static int group_setup(void **state)
{
	(void)state;
	/* the backend paths of the fp32-activation tests: bf16 weights too
	 * (test_matmul_bf16_backend takes the bf16 dot route) */
	setenv("LLAMAD_CPU_EXACT_BF16", "1", 1);
	g_be1 = backend_cpu_new(1);
	g_be2 = backend_cpu_new(2);
	unsetenv("LLAMAD_CPU_EXACT_BF16");
	if (!g_be1 || !g_be2)
		return -1;
	if (g_be1->n_threads != 1 || g_be2->n_threads != 2)
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
		cmocka_unit_test(test_matmul_portable),
		cmocka_unit_test(test_matmul_avx512),
		cmocka_unit_test(test_matmul_row_blocks),
		cmocka_unit_test(test_bf16_round),
		cmocka_unit_test(test_matmul_bf16_dot),
		cmocka_unit_test(test_matmul_bf16_flush),
		cmocka_unit_test(test_matmul_bf16_backend),
		cmocka_unit_test(test_matmul_avx2),
		cmocka_unit_test(test_matmul_avx2_bits),
		cmocka_unit_test(test_matmul_backend_1thread),
		cmocka_unit_test(test_matmul_backend_2threads),
		cmocka_unit_test(test_matmul_threads_and_splits),
		cmocka_unit_test(test_matmul_dispatch),
		cmocka_unit_test(test_rmsnorm),
		cmocka_unit_test(test_rope),
		cmocka_unit_test(test_rope_layouts_equivalent),
		cmocka_unit_test(test_attention_paged),
		cmocka_unit_test(test_attention_typed),
		cmocka_unit_test(test_attention_threads),
		cmocka_unit_test(test_attention_row_groups),
		cmocka_unit_test(test_silu_mul),
		cmocka_unit_test(test_add),
		cmocka_unit_test(test_embed),
		cmocka_unit_test(test_dtype_helpers),
		cmocka_unit_test(test_f16_all_halfs),
		cmocka_unit_test(test_f16_ties_exhaustive),
		cmocka_unit_test(test_f16_examples),
		cmocka_unit_test(test_f16_random_vs_reference),
		cmocka_unit_test(test_bf16),
		cmocka_unit_test(test_kv_helpers),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

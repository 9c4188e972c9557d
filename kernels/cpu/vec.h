/*
 * kernels/cpu/vec.h — the CPU backend's vector values (GCC/clang vector
 * extension: eight and sixteen floats, eight int32) with their loads,
 * stores and sums, and exp of eight floats; for the element-wise ops and
 * attention.
 */
#ifndef LLAMAD_KERNELS_CPU_VEC_H
#define LLAMAD_KERNELS_CPU_VEC_H

#include <stdint.h>
#include <string.h>

/* Eight floats as one value: GCC/clang vector extension, an AVX register
 * where the target has one. Loads and stores go through memcpy (unaligned). */
typedef float v8f __attribute__((vector_size(32)));

static inline v8f ld8(const float *p)
{
	v8f v;
	memcpy(&v, p, sizeof(v));
	return v;
}

typedef float v16f __attribute__((vector_size(64)));

/* Sixteen-float values never cross a real call (everything using them is
 * inlined), so the ABI note GCC gives for them does not apply. */
#pragma GCC diagnostic ignored "-Wpsabi"

static inline __attribute__((always_inline)) v16f ld16(const float *p)
{
	v16f v;
	memcpy(&v, p, sizeof(v));
	return v;
}

static inline float hsum8(v8f v)
{
	return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

typedef int32_t v8i __attribute__((vector_size(32)));

static inline void st8(float *p, v8f v)
{
	memcpy(p, &v, sizeof(v));
}

/* exp's multiply-adds may fuse (FMA), as in the code that uses it (see
 * attention.c) */
#pragma GCC push_options
#pragma GCC optimize("fp-contract=fast")

/* exp of eight floats to ~1 ulp in vector arithmetic: range reduction by
 * ln 2 and a degree-6 minimax polynomial (Cephes' expf). Every lane runs the
 * same instructions, so a value's result never depends on its neighbours. */
static inline v8f vexp8(v8f x)
{
	const v8f lo = { -87, -87, -87, -87, -87, -87, -87, -87 };
	const v8f hi = { 88, 88, 88, 88, 88, 88, 88, 88 };
	v8i m = x < lo;
	x = (v8f)(((v8i)x & ~m) | ((v8i)lo & m));
	m = x > hi;
	x = (v8f)(((v8i)x & ~m) | ((v8i)hi & m));
	const float magic = 12582912.0f;  /* 1.5 * 2^23: round to integer */
	v8f fn = x * 1.44269504088896341f + magic;
	v8i n = (v8i)fn - 0x4b400000;
	fn -= magic;
	v8f r = x - fn * 0.693359375f + fn * 2.12194440e-4f;
	v8f p = r * 1.9875691500e-4f + 1.3981999507e-3f;
	p = p * r + 8.3334519073e-3f;
	p = p * r + 4.1665795894e-2f;
	p = p * r + 1.6666665459e-1f;
	p = p * r + 5.0000001201e-1f;
	p = p * r * r + r + 1.0f;
	return p * (v8f)((n + 127) << 23);
}

#pragma GCC pop_options

#endif

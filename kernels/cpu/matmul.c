/*
 * kernels/cpu/matmul.c — y = x W^T for fp32 activations and f32/f16/bf16
 * or block-quantized (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K) weights, multi-threaded
 * over weight rows: the one place that picks a kernel for an isa and a
 * dtype (mm_float.c, mm_quant.c, mm_bf16.c, qdot.c), and the threads.
 *
 * Batch invariance: every output element is one 16-lane fp32 accumulator
 * running over the input width in steps of 16 (the tail through a masked
 * load), then one fixed horizontal sum. Register tiles of several tokens x
 * several rows only share loads, never partial sums, so an element's value
 * is the same whatever the tile, the thread split or the batch size.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "kernels/cpu/mm_int.h"
#include "kernels/cpu/qpack.h"

void cpu_bf16_round(int isa, uint16_t *xb, const float *x, size_t n)
{
#if defined(__x86_64__)
	if (isa == CPU_ISA_AVX512) {
		cpu_avx512_bf16_round(xb, x, n);
		return;
	}
#else
	(void)isa;
#endif
	cpu_generic_bf16_round(xb, x, n);
}

void cpu_matmul_rows_bf16(int isa, float *y, const uint16_t *xb, const struct kt_weight *w,
			  int n_tok, int r0, int r1)
{
#if defined(__x86_64__)
	if (isa == CPU_ISA_AVX512) {
		cpu_avx512_bf16_dot(y, xb, w->data, w->cols, w->rows, n_tok, r0, r1);
		return;
	}
#else
	(void)isa;
#endif
	cpu_generic_bf16_dot(y, xb, w->data, w->cols, w->rows, n_tok, r0, r1);
}

void cpu_matmul_rows(int isa, float *y, const float *x,
		     const struct kt_weight *w, int n_tok, int r0, int r1)
{
#if defined(__x86_64__)
	if (isa == CPU_ISA_AVX2) {
		switch (w->dtype) {
		case KT_F32: cpu_avx2_f32(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		case KT_F16: cpu_avx2_f16(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		case KT_BF16: cpu_avx2_bf16(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		case KT_Q8_0: cpu_avx2_q8_0(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		case KT_Q4_0: cpu_avx2_q4_0(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		case KT_Q4_K: cpu_avx2_q4_k(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		case KT_Q5_K: cpu_avx2_q5_k(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		case KT_Q6_K: cpu_avx2_q6_k(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		}
	}
	if (isa == CPU_ISA_AVX512) {
		switch (w->dtype) {
		case KT_F32: cpu_avx512_f32(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		case KT_F16: cpu_avx512_f16(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		case KT_BF16: cpu_avx512_bf16(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		case KT_Q8_0: cpu_avx512_q8_0(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		case KT_Q4_0: cpu_avx512_q4_0(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		case KT_Q4_K: cpu_avx512_q4_k(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		case KT_Q5_K: cpu_avx512_q5_k(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		case KT_Q6_K: cpu_avx512_q6_k(y, x, w->data, w->cols, w->rows, n_tok, r0, r1); return;
		}
	}
#else
	(void)isa;
#endif
	if (kt_dtype_is_quant(w->dtype))
		cpu_generic_rows_q(y, x, w, n_tok, r0, r1);
	else
		cpu_generic_rows(y, x, w, n_tok, r0, r1);
}

void cpu_qx_quantize(int isa, uint8_t *qx, const float *x, int cols, int t0, int t1)
{
	for (int t = t0; t < t1; t++) {
		struct qx_row r = qx_row(qx, cols, t);
		const float *xr = x + (size_t)t * cols;
		for (int b = 0; b < cols / QB; b++) {
#if defined(__x86_64__)
			if (isa == CPU_ISA_AVX512) {
				cpu_avx512_qx_block(xr + b * QB, r.q + b * QB, r.d + b, r.sl + b, r.sh + b);
				continue;
			}
			if (isa == CPU_ISA_AVX2) {
				cpu_avx2_qx_block(xr + b * QB, r.q + b * QB, r.d + b, r.sl + b, r.sh + b);
				continue;
			}
#else
			(void)isa;
#endif
			cpu_generic_qx_block(xr + b * QB, r.q + b * QB, r.d + b, r.sl + b, r.sh + b);
		}
	}
}

void cpu_qpack_rows(int isa, float *y, const uint8_t *qx, const struct cpu_qpack *p,
		    int n_tok, int g0, int g1)
{
#if defined(__x86_64__)
	if (isa == CPU_ISA_AVX2) {
		switch (p->dt) {
		case KT_Q8_0:
			if (p->q8_min)
				cpu_avx2_qrows_q8_0n(y, qx, p, n_tok, g0, g1);
			else
				cpu_avx2_qrows_q8_0(y, qx, p, n_tok, g0, g1);
			return;
		case KT_Q4_0: cpu_avx2_qrows_q4_0(y, qx, p, n_tok, g0, g1); return;
		case KT_Q4_K: cpu_avx2_qrows_q4_k(y, qx, p, n_tok, g0, g1); return;
		case KT_Q5_K: cpu_avx2_qrows_q5_k(y, qx, p, n_tok, g0, g1); return;
		case KT_Q6_K: cpu_avx2_qrows_q6_k(y, qx, p, n_tok, g0, g1); return;
		default: break;
		}
	}
	if (isa == CPU_ISA_AVX512) {
		switch (p->dt) {
		case KT_Q8_0: cpu_vnni_qrows_q8_0(y, qx, p, n_tok, g0, g1); return;
		case KT_Q4_0: cpu_vnni_qrows_q4_0(y, qx, p, n_tok, g0, g1); return;
		case KT_Q4_K: cpu_vnni_qrows_q4_k(y, qx, p, n_tok, g0, g1); return;
		case KT_Q5_K: cpu_vnni_qrows_q5_k(y, qx, p, n_tok, g0, g1); return;
		case KT_Q6_K: cpu_vnni_qrows_q6_k(y, qx, p, n_tok, g0, g1); return;
		default: break;
		}
	}
#else
	(void)isa;
#endif
	cpu_generic_qrows(y, qx, p, n_tok, g0, g1);
}

struct mm_job {
	float *y;
	const float *x;
	const uint16_t *xb;     /* bf16 dot products: x rounded (cpu_bf16_round) */
	const struct kt_weight *w;
	int n_tok;
	int isa;
};

int cpu_mm_isa(const struct cpu_backend *cb)
{
	return cb->have_avx512 ? CPU_ISA_AVX512 : cb->have_avx2 ? CPU_ISA_AVX2 : CPU_ISA_PORTABLE;
}

/* Thread ith of nth's share [*a, *b) of [0, n), in chunks that are
 * multiples of align (empty when none is left for it). */
static void share(int n, int ith, int nth, int align, int *a, int *b)
{
	int per = ((n + nth - 1) / nth + align - 1) / align * align;
	*a = ith * per;
	*b = *a + per < n ? *a + per : n;
}

static void mm_worker(void *ctx, int ith, int nth)
{
	struct mm_job *j = ctx;
	int r0, r1;
	share(j->w->rows, ith, nth, 8, &r0, &r1);
	if (r0 < r1 && j->xb)
		cpu_matmul_rows_bf16(j->isa, j->y, j->xb, j->w, j->n_tok, r0, r1);
	else if (r0 < r1)
		cpu_matmul_rows(j->isa, j->y, j->x, j->w, j->n_tok, r0, r1);
}

/* *buf with room for need bytes (64-byte aligned, contents not kept;
 * *have: its bytes): 0 or -ENOMEM. */
static int reserve(void *buf, size_t *have, size_t need)
{
	if (need <= *have)
		return 0;
	void *p;
	if (posix_memalign(&p, 64, need))
		return -ENOMEM;
	free(*(void **)buf);
	*(void **)buf = p;
	*have = need;
	return 0;
}

int cpu_qx_reserve(struct cpu_backend *cb, int n_tok, int cols)
{
	return reserve(&cb->qx, &cb->qx_len,
		       (size_t)(n_tok > 0 ? n_tok : 1) * cpu_qx_row_bytes(cols));
}

/* Packed weights sharing their input (one, or q, k, v; gate, up):
 * activations quantized once (tokens split over the threads), then the
 * row groups of all of them split over the threads, each weight's range
 * padded to whole chunks so that no chunk spans two. */
struct qmm_job {
	float *const *y;
	const struct kt_weight *const *w;
	const float *x;
	uint8_t *qx;
	int n, n_tok, isa;
	int chunk;              /* groups a worker takes at a time */
	int end[3];             /* padded group range of w[i]: [end[i-1], end[i]) */
	_Atomic int next;       /* first group not yet taken */
};

int cpu_q_isa(const struct cpu_backend *cb)
{
	return cb->have_vnni ? CPU_ISA_AVX512 : cb->have_avx2 ? CPU_ISA_AVX2 : CPU_ISA_PORTABLE;
}

static void qx_worker(void *ctx, int ith, int nth)
{
	struct qmm_job *j = ctx;
	int t0, t1;
	share(j->n_tok, ith, nth, 1, &t0, &t1);
	if (t0 < t1)
		cpu_qx_quantize(j->isa, j->qx, j->x, j->w[0]->cols, t0, t1);
}

/* Workers take chunks of groups in ascending order until none is left, so
 * a worker the system holds up (another process on its core) delays the
 * matmul by at most a chunk instead of by its whole half; each worker
 * still reads ascending addresses. A group's results do not depend on who
 * computes it. */
static void qmm_worker(void *ctx, int ith, int nth)
{
	(void)ith;
	(void)nth;
	struct qmm_job *j = ctx;
	for (;;) {
		int g0 = atomic_fetch_add_explicit(&j->next, j->chunk, memory_order_relaxed);
		if (g0 >= j->end[j->n - 1])
			return;
		int i = 0;
		while (g0 >= j->end[i])
			i++;
		const struct cpu_qpack *p = j->w[i]->pack;
		int ng = cpu_qpack_groups(p), a = g0 - (i ? j->end[i - 1] : 0);
		int b = a + j->chunk < ng ? a + j->chunk : ng;
		if (a < b)
			cpu_qpack_rows(j->isa, j->y[i], j->qx, p, j->n_tok, a, b);
	}
}

/* y[i] = x W[i]^T for n <= 3 packed weights of the same width, cb->qx
 * reserved for n_tok tokens of it. */
static void qmm_run(struct cpu_backend *cb, int n, float *const *y,
		    const struct kt_weight *const *w, const float *x, int n_tok)
{
	int nth = tpool_size(cb->pool), ng = 0;
	size_t wbytes = 0;
	for (int i = 0; i < n; i++) {
		ng += cpu_qpack_groups(w[i]->pack);
		wbytes += cpu_qpack_bytes(w[i]->pack);
	}
	/* about 8 chunks a worker, whole tiles of 4 groups */
	int chunk = ((ng + 8 * nth - 1) / (8 * nth) + 3) & ~3;
	struct qmm_job q = { y, w, x, cb->qx, n, n_tok, cpu_q_isa(cb), chunk, { 0 }, 0 };
	for (int i = 0, e = 0; i < n; i++) {
		e += (cpu_qpack_groups(w[i]->pack) + chunk - 1) / chunk * chunk;
		q.end[i] = e;
	}
	tpool_run(cb->pool, qx_worker, &q, n_tok < 4 * nth ? 1 : nth);
	/* below ~256 KiB of weights a second thread costs more than it gives */
	tpool_run(cb->pool, qmm_worker, &q, wbytes < (256u << 10) ? 1 : nth);
}

/* bf16 dot products: the activations rounded into j->xb, tokens split
 * over the threads (mm_worker then takes the rows). */
static void xb_worker(void *ctx, int ith, int nth)
{
	struct mm_job *j = ctx;
	int t0, t1;
	share(j->n_tok, ith, nth, 1, &t0, &t1);
	size_t K = (size_t)j->w->cols;
	if (t0 < t1)
		cpu_bf16_round(j->isa, (uint16_t *)j->xb + t0 * K, j->x + t0 * K,
			       (size_t)(t1 - t0) * K);
}

int cpu_xb_reserve(struct cpu_backend *cb, size_t n)
{
	return reserve(&cb->xb, &cb->xb_len, n * sizeof(uint16_t));
}

void cpu_matmul_n(struct backend *be, int n, float *const *y, const struct kt_weight *const *w,
		  const float *x, int n_tok)
{
	struct cpu_backend *cb = (struct cpu_backend *)be;
	int packed = n >= 1 && n <= 3;
	for (int i = 0; i < n && packed; i++)
		packed = w[i]->pack && w[i]->cols == w[0]->cols;
	if (packed && cpu_qx_reserve(cb, n_tok, w[0]->cols) == 0) {
		qmm_run(cb, n, y, w, x, n_tok);
		return;
	}
	for (int i = 0; i < n; i++)
		cpu_matmul(be, y[i], x, w[i], n_tok);
}

void cpu_matmul(struct backend *be, float *y, const float *x,
		const struct kt_weight *w, int n_tok)
{
	struct cpu_backend *cb = (struct cpu_backend *)be;
	size_t wbytes = (size_t)w->rows * kt_row_bytes(w->dtype, (size_t)w->cols);
	struct mm_job j = { y, x, NULL, w, n_tok, cpu_mm_isa(cb) };
	/* bf16 dot products (room reserved up front by cpu_reserve; without
	 * it, the fp32 path, as packed quantized weights fall back): the
	 * activations rounded, then the rows as below. The isa picks the
	 * kernels of both: VDPBF16PS with AVX-512, else the portable loop */
	if (w->dtype == KT_BF16 && cb->bf16_dot && cpu_xb_reserve(cb, (size_t)n_tok * w->cols) == 0) {
		j.xb = cb->xb;
		int nth = tpool_size(cb->pool);
		tpool_run(cb->pool, xb_worker, &j, n_tok < 4 * nth ? 1 : nth);
	} else if (w->pack && cpu_qx_reserve(cb, n_tok, w->cols) == 0) {
		qmm_run(cb, 1, &y, &w, x, n_tok);
		return;
	}
	/* rows over the threads: fp32 activations (not packed, or no memory
	 * for the 8-bit ones: the exact path), or the bf16 ones above */
	size_t work = wbytes + (size_t)n_tok * w->rows * w->cols / 4;
	/* below ~256 KiB of weights a second thread costs more than it gives */
	int nth = work < (256u << 10) ? 1 : tpool_size(cb->pool);
	tpool_run(cb->pool, mm_worker, &j, nth);
}

/*
 * tests/bench/optime.c — where a forward pass's time goes, op by op
 * (llamad-bench --op-times): the backend's op table is replaced by one
 * whose entries time the real ones (wall clock around each call; the CPU
 * backend's ops return when their threads are done), matrix products
 * grouped by weight shape and type with the bytes they read. A bench
 * tool only: the daemon never wraps its ops.
 */
#include "tests/bench/optime.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "util/dtype.h"

enum { OP_MATMUL, OP_MATMUL_N, OP_MATMUL_ADD, OP_SWIGLU, OP_RMSNORM, OP_ROPE, OP_KV_STORE,
       OP_ATTENTION, OP_SILU_MUL, OP_ADD, OP_EMBED, OP_N };

static const char *const op_names[OP_N] = {
	"matmul", "matmul_n", "matmul_add", "matmul_swiglu", "rmsnorm", "rope", "kv_store",
	"attention", "silu_mul", "add", "embed",
};

/* one weight shape and type of the products: calls, time, bytes read */
struct mm_row {
	int rows, cols;
	enum kt_dtype dtype;
	long calls;
	double s, bytes;
};

#define MM_ROWS 32

static struct {
	const struct backend_ops *real;
	struct backend_ops timed;
	double s[OP_N];
	long calls[OP_N];
	struct mm_row mm[MM_ROWS];
	int n_mm;
} T;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void count(int op, double t0)
{
	T.s[op] += now() - t0;
	T.calls[op]++;
}

/* The products' share by weight: w's row of the table gets dt and w's bytes. */
static void count_weight(const struct kt_weight *w, double dt)
{
	int i = 0;
	while (i < T.n_mm && !(T.mm[i].rows == w->rows && T.mm[i].cols == w->cols &&
			       T.mm[i].dtype == w->dtype))
		i++;
	if (i == T.n_mm) {
		if (T.n_mm == MM_ROWS)
			return;
		T.mm[T.n_mm++] = (struct mm_row){ w->rows, w->cols, w->dtype, 0, 0, 0 };
	}
	T.mm[i].calls++;
	T.mm[i].s += dt;
	T.mm[i].bytes += (double)w->rows * (double)kt_row_bytes(w->dtype, (size_t)w->cols);
}

static void t_matmul(struct backend *be, float *y, const float *x, const struct kt_weight *w,
		     int n_tok)
{
	double t0 = now();
	T.real->matmul(be, y, x, w, n_tok);
	count_weight(w, now() - t0);
	count(OP_MATMUL, t0);
}

static void t_matmul_n(struct backend *be, int n, float *const *y,
		       const struct kt_weight *const *w, const float *x, int n_tok)
{
	double t0 = now();
	T.real->matmul_n(be, n, y, w, x, n_tok);
	double dt = now() - t0;
	double all = 0;
	for (int i = 0; i < n; i++)
		all += (double)w[i]->rows;
	for (int i = 0; i < n; i++)   /* shared in proportion to the rows */
		count_weight(w[i], dt * w[i]->rows / all);
	count(OP_MATMUL_N, t0);
}

static void t_matmul_add(struct backend *be, float *y, const float *x, const struct kt_weight *w,
			 int n_tok)
{
	double t0 = now();
	T.real->matmul_add(be, y, x, w, n_tok);
	count_weight(w, now() - t0);
	count(OP_MATMUL_ADD, t0);
}

static void t_swiglu(struct backend *be, float *h, const float *x, const struct kt_weight *gate,
		     const struct kt_weight *up, int n_tok)
{
	double t0 = now();
	T.real->matmul_swiglu(be, h, x, gate, up, n_tok);
	double dt = now() - t0;
	count_weight(gate, dt / 2);
	count_weight(up, dt / 2);
	count(OP_SWIGLU, t0);
}

static void t_rmsnorm(struct backend *be, float *y, const float *x, const float *w, int n,
		      int n_tok, float eps)
{
	double t0 = now();
	T.real->rmsnorm(be, y, x, w, n, n_tok, eps);
	count(OP_RMSNORM, t0);
}

static void t_rope(struct backend *be, float *q, float *k, const int *pos, int n_tok, int n_heads,
		   int n_kv_heads, int hd, const float *inv_freq, enum kt_rope_layout layout)
{
	double t0 = now();
	T.real->rope(be, q, k, pos, n_tok, n_heads, n_kv_heads, hd, inv_freq, layout);
	count(OP_ROPE, t0);
}

static void t_kv_store(struct backend *be, const struct kt_kv *kv, int layer, const float *k,
		       const float *v, const struct kt_attn_row *rows, int n_tok)
{
	double t0 = now();
	T.real->kv_store(be, kv, layer, k, v, rows, n_tok);
	count(OP_KV_STORE, t0);
}

static void t_attention(struct backend *be, float *out, const float *q, const struct kt_kv *kv,
			int layer, const struct kt_attn_row *rows, int n_tok, int n_heads,
			int n_kv_heads, int hd)
{
	double t0 = now();
	T.real->attention(be, out, q, kv, layer, rows, n_tok, n_heads, n_kv_heads, hd);
	count(OP_ATTENTION, t0);
}

static void t_silu_mul(struct backend *be, float *g, const float *u, size_t n)
{
	double t0 = now();
	T.real->silu_mul(be, g, u, n);
	count(OP_SILU_MUL, t0);
}

static void t_add(struct backend *be, float *y, const float *x, size_t n)
{
	double t0 = now();
	T.real->add(be, y, x, n);
	count(OP_ADD, t0);
}

static void t_embed(struct backend *be, float *y, const struct kt_weight *table,
		    const int32_t *tok, int n_tok)
{
	double t0 = now();
	T.real->embed(be, y, table, tok, n_tok);
	count(OP_EMBED, t0);
}

void optime_wrap(struct backend *be)
{
	T.real = be->ops;
	T.timed = *be->ops;
	T.timed.matmul = t_matmul;
	T.timed.rmsnorm = t_rmsnorm;
	T.timed.rope = t_rope;
	T.timed.kv_store = t_kv_store;
	T.timed.attention = t_attention;
	T.timed.silu_mul = t_silu_mul;
	T.timed.add = t_add;
	T.timed.embed = t_embed;
	/* the optional fused forms stay optional */
	T.timed.matmul_n = be->ops->matmul_n ? t_matmul_n : NULL;
	T.timed.matmul_add = be->ops->matmul_add ? t_matmul_add : NULL;
	T.timed.matmul_swiglu = be->ops->matmul_swiglu ? t_swiglu : NULL;
	T.timed.layer = NULL;   /* op by op, so that each is seen */
	be->ops = &T.timed;
	optime_reset();
}

void optime_unwrap(struct backend *be)
{
	if (T.real)
		be->ops = T.real;
}

void optime_reset(void)
{
	memset(T.s, 0, sizeof(T.s));
	memset(T.calls, 0, sizeof(T.calls));
	T.n_mm = 0;
}

void optime_print(FILE *f, double total_s, int n_tok)
{
	double ops = 0;
	for (int i = 0; i < OP_N; i++)
		ops += T.s[i];
	fprintf(f, "op times over %d tokens (%.2f ms a token; the ops %.1f %% of it):\n", n_tok,
		total_s * 1e3 / n_tok, total_s > 0 ? 100.0 * ops / total_s : 0.0);
	fprintf(f, "  %-14s %8s %10s %7s\n", "op", "calls", "us/token", "share");
	for (int i = 0; i < OP_N; i++)
		if (T.calls[i])
			fprintf(f, "  %-14s %8ld %10.1f %6.1f%%\n", op_names[i], T.calls[i],
				T.s[i] * 1e6 / n_tok, total_s > 0 ? 100.0 * T.s[i] / total_s : 0.0);
	fprintf(f, "  %-14s %8s %10.1f %6.1f%%\n", "(between ops)", "",
		(total_s - ops) * 1e6 / n_tok, total_s > 0 ? 100.0 * (total_s - ops) / total_s : 0.0);
	fprintf(f, "  products by weight:\n  %-7s %-16s %8s %10s %9s %9s\n", "dtype", "rows x cols",
		"calls", "us/token", "GB/s", "us/call");
	for (int i = 0; i < T.n_mm; i++) {
		const struct mm_row *r = &T.mm[i];
		char shape[32];
		snprintf(shape, sizeof(shape), "%d x %d", r->rows, r->cols);
		fprintf(f, "  %-7s %-16s %8ld %10.1f %9.2f %9.1f\n", kt_dtype_name(r->dtype), shape,
			r->calls, r->s * 1e6 / n_tok, r->s > 0 ? r->bytes / r->s / 1e9 : 0.0,
			r->calls ? r->s * 1e6 / (double)r->calls : 0.0);
	}
}

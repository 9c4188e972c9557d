/*
 * kernels/cpu/backend.c — the CPU backend's table (backend_cpu_new): its
 * ops (matmul.c, elementwise.c, kv_store.c, attention.c), host memory,
 * weight placement (the packed form of quantized weights, qdot.c), the
 * instruction sets the CPU has and the switches that turn them off.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cpu/cpu.h"

static int cpu_reserve(struct backend *be, int max_pos, int max_tokens)
{
	struct cpu_backend *cb = (struct cpu_backend *)be;
	if (cb->qx_cols > 0 && cpu_qx_reserve(cb, max_tokens, cb->qx_cols) != 0)
		return -ENOMEM;
	if (cb->xb_cols > 0 &&
	    cpu_xb_reserve(cb, (size_t)(max_tokens > 0 ? max_tokens : 1) * cb->xb_cols) != 0)
		return -ENOMEM;
	/* scores are computed a whole block at a time: room for four rows'
	 * scores, each up to a whole block past max_pos */
	return cpu_scratch_reserve(cb, ATTN_TILE * ((size_t)(max_pos > 0 ? max_pos : 1) + 64));
}

static void cpu_free(struct backend *be)
{
	struct cpu_backend *cb = (struct cpu_backend *)be;
	if (cb->scratch) {
		for (int i = 0; i < tpool_size(cb->pool); i++)
			free(cb->scratch[i]);
		free(cb->scratch);
	}
	tpool_free(cb->pool);
	free(cb->qx);
	free(cb->xb);
	free(cb);
}

/* Backend memory is host memory: plain allocations and memcpy. */
static void *cpu_mem_alloc(struct backend *be, size_t bytes)
{
	(void)be;
	return aligned_alloc(64, (bytes + 63) & ~(size_t)63);
}

static void cpu_mem_free(struct backend *be, void *p)
{
	(void)be;
	free(p);
}

static int cpu_copy(struct backend *be, void *dst, const void *src, size_t bytes)
{
	(void)be;
	if (bytes)
		memmove(dst, src, bytes);
	return 0;
}

/* Bytes of memory the system can still give (MemAvailable: free pages and
 * the page cache it can drop, the model file's included), or
 * LLAMAD_CPU_MEM_AVAILABLE (bytes) where set, for tests; 0 when unknown. */
static size_t mem_available(void)
{
	const char *e = getenv("LLAMAD_CPU_MEM_AVAILABLE");
	if (e && *e)
		return (size_t)strtoull(e, NULL, 10);
	FILE *f = fopen("/proc/meminfo", "r");
	if (!f)
		return 0;
	char line[128];
	unsigned long long kb = 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
			break;
	fclose(f);
	return (size_t)kb * 1024;
}

/* What a packed copy must leave to the rest of the process (scratch, the
 * K/V pool's first blocks, the daemon): 64 MiB. */
#define PACK_SPARE ((size_t)64 << 20)

/* The rest of the quantized weights stay unpacked: the exact path serves
 * them (slower, not fatal); the log and status say so. */
static void pack_off(struct backend *be, const char *why)
{
	struct cpu_backend *cb = (struct cpu_backend *)be;
	cb->pack_quant = 0;
	size_t n = strlen(be->desc);
	snprintf(be->desc + n, sizeof(be->desc) - n, " (%s packing: exact path)", why);
}

/* Weights are read where they lie (mmapped or converted at load); with
 * AVX512-VNNI, quantized matrices for matmul also get their packed form
 * while memory allows it; bf16 ones with bf16 dot products set the room
 * their activations need. */
static int cpu_weight_place(struct backend *be, struct kt_weight *dst,
			    const struct kt_weight *src, int use)
{
	struct cpu_backend *cb = (struct cpu_backend *)be;
	*dst = *src;
	dst->pack = NULL;
	if ((use & KT_USE_MATMUL) && cb->bf16_dot && src->dtype == KT_BF16 &&
	    src->cols > cb->xb_cols)
		cb->xb_cols = src->cols;
	if (!(use & KT_USE_MATMUL) || !cb->pack_quant || !kt_dtype_is_quant(src->dtype))
		return 0;
	/* with overcommit the mapping of a copy that does not fit succeeds,
	 * and the OOM killer comes later: what the system has is asked first */
	size_t need = cpu_qpack_size(src), avail = mem_available();
	if (need && avail && need + PACK_SPARE > avail) {
		backend_log(BACKEND_LOG_WARN,
			    "cpu: packing a %d x %d %s matrix for 8-bit activations needs %zu MiB "
			    "and %zu MiB are available: this and the remaining quantized weights "
			    "stay unpacked (the exact path, several times slower); free memory "
			    "and restart for full speed",
			    src->rows, src->cols, kt_dtype_name(src->dtype), need >> 20, avail >> 20);
		pack_off(be, "no memory for");
		return 0;
	}
	struct cpu_qpack *p;
	int rc = cpu_qpack_new(src, cb->pool, &p);
	if (rc == -ENOMEM) {
		backend_log(BACKEND_LOG_WARN, "cpu: out of memory packing the quantized weights: "
			    "the remaining ones stay unpacked (the exact path, several times slower)");
		pack_off(be, "out of memory");
		return 0;
	}
	if (rc)
		return 0;      /* not packable (-EINVAL): matmul's exact path serves it */
	dst->pack = p;
	if (src->cols > cb->qx_cols)
		cb->qx_cols = src->cols;
	return 0;
}

static void cpu_weight_release(struct backend *be, struct kt_weight *w)
{
	(void)be;
	cpu_qpack_free(w->pack);
	w->pack = NULL;
}

static const struct backend_ops cpu_ops = {
	.name = "cpu",
	.matmul = cpu_matmul,
	.matmul_n = cpu_matmul_n,
	.rmsnorm = cpu_rmsnorm,
	.rope = cpu_rope,
	.kv_store = cpu_kv_store,
	.attention = cpu_attention,
	.silu_mul = cpu_silu_mul,
	.add = cpu_add,
	.embed = cpu_embed,
	.reserve = cpu_reserve,
	.free = cpu_free,
	.mem_alloc = cpu_mem_alloc,
	.mem_free = cpu_mem_free,
	.upload = cpu_copy,
	.download = cpu_copy,
	.copy = cpu_copy,
	.weight_place = cpu_weight_place,
	.weight_release = cpu_weight_release,
};

/* The CPU's instruction sets (cpu.h); the switches apply to the paths only. */
int cpu_has(enum cpu_feature f)
{
#if defined(__x86_64__)
	__builtin_cpu_init();
	switch (f) {
	case CPU_AVX512F: return __builtin_cpu_supports("avx512f");
	case CPU_AVX512:
		return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
		       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("f16c");
	case CPU_AVX2:
		return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
		       __builtin_cpu_supports("f16c");
	case CPU_VNNI:
		return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vnni");
	case CPU_BF16:
		return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
		       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
	}
#else
	(void)f;
#endif
	return 0;
}

struct backend *backend_cpu_new(int n_threads)
{
	if (n_threads <= 0) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);
		n_threads = n > 0 ? (int)n : 1;
	}
	struct cpu_backend *cb = calloc(1, sizeof(*cb));
	if (!cb)
		return NULL;
	cb->be.ops = &cpu_ops;
	cb->be.n_threads = n_threads;
	cb->be.host_mem = 1;
	cb->have_avx512 = cpu_has(CPU_AVX512) && !backend_env_flag("LLAMAD_NO_AVX512");
	cb->have_avx2 = cpu_has(CPU_AVX2) && !backend_env_flag("LLAMAD_NO_AVX2");
	/* sixteen-float attention where it is one register (the AVX-512
	 * clone); the eight-float code elsewhere: the same results */
	cb->attn_wide = cpu_has(CPU_AVX512F);
	cb->be.kv_types = 1u << KT_F32 | 1u << KT_F16 | 1u << KT_Q8_0;
	/* quantized weights are packed for 8-bit activations where the CPU
	 * has AVX512-VNNI or AVX2; the packed form's results do not depend on
	 * the kernel, so LLAMAD_NO_AVX512 / LLAMAD_NO_AVX2 keep packing and
	 * run the next kernel down (AVX2, then the portable one) */
	int vnni = cpu_has(CPU_VNNI);
	cb->pack_quant = (vnni || cpu_has(CPU_AVX2)) && !backend_env_flag("LLAMAD_CPU_EXACT_Q");
	cb->have_vnni = cb->have_avx512 && vnni;
	/* bf16 weights take bf16 activations where VDPBF16PS does the
	 * products (twice the fp32 FMA's rate); elsewhere, or with
	 * LLAMAD_CPU_EXACT_BF16, fp32 activations as for f16 weights. As
	 * for packing, LLAMAD_NO_AVX512 keeps the numerics and runs the
	 * portable loop (the same bits, slowly) */
	cb->bf16_dot = cpu_has(CPU_BF16) && !backend_env_flag("LLAMAD_CPU_EXACT_BF16");
	snprintf(cb->be.desc, sizeof(cb->be.desc), "cpu, %d thread%s%s%s%s", n_threads,
		 n_threads == 1 ? "" : "s",
		 cb->have_avx512 ? ", avx512" : cb->have_avx2 ? ", avx2" : "",
		 !cb->pack_quant ? "" : cb->have_vnni ? ", vnni" :
		 cb->have_avx2 ? ", int8 dot" : ", packed quantized",
		 cb->bf16_dot ? ", bf16 dot" : "");
	cb->pool = tpool_new(n_threads);
	cb->scratch = cb->pool ? calloc((size_t)n_threads, sizeof(float *)) : NULL;
	if (!cb->pool || !cb->scratch || cpu_scratch_reserve(cb, 4096) != 0) {
		cpu_free(&cb->be);
		return NULL;
	}
	return &cb->be;
}

/*
 * kernels/cuda/backend.cu — the CUDA backend's op table, and opening it
 * (the device checks, cuBLAS by dlopen, the LLAMAD_CUDA_* switches),
 * reserving its staging and scratch, and closing it. The state and the
 * other files of the backend's host side: backend.cuh.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/backend.cuh"

static int cu_reserve(struct backend *be, int max_pos, int max_tokens)
{
	struct cu_backend *c = CB(be);
	if (max_pos > c->max_pos)
		c->max_pos = max_pos;
	int T = max_tokens > c->cap_tok ? max_tokens : c->cap_tok;
	/* tables: stride for block size 1 at worst would be huge; use 16 (the
	 * daemon's) and let batch_begin grow it for smaller blocks */
	int stride = c->max_pos / 16 + 2;
	if ((T > c->cap_tok || stride > c->tab_stride) &&
	    stage_alloc(c, T, stride > c->tab_stride ? stride : c->tab_stride))
		return -ENOMEM;
	if (!c->part && ck(c, cudaMalloc((void **)&c->part, (size_t)CU_PART_FLOATS * 4), "cudaMalloc"))
		return -ENOMEM;
	if (grow(c, &c->xh, &c->xh_bytes, (size_t)T * (c->max_cols ? c->max_cols : 1) * 2) ||
	    grow(c, (void **)&c->tmp, &c->tmp_bytes, (size_t)T * (c->max_rows ? c->max_rows : 1) * 4) ||
	    grow(c, &c->xq, &c->xq_bytes, q8_blocks(c) * 40) ||
	    grow(c, (void **)&c->wh, &c->wh_bytes, c->max_qelems * 2))
		return -ENOMEM;
	/* split-K (the o and down products: dim rows, at most max_cols):
	 * partials of every part, a counter per block of rows (zero) */
	size_t rows = c->max_cols ? c->max_cols : 1;
	size_t cnt = (rows / CU_GW + 1) * sizeof(unsigned);
	if (grow(c, (void **)&c->skpart, &c->skpart_bytes,
		 (size_t)CU_MAX_SPLITK * CU_GEMV_MAX * rows * sizeof(float)))
		return -ENOMEM;
	if (c->skcount_bytes < cnt) {
		if (grow(c, (void **)&c->skcount, &c->skcount_bytes, cnt) ||
		    ck(c, cudaMemsetAsync(c->skcount, 0, cnt, c->stream), "cudaMemset") ||
		    ck(c, cudaStreamSynchronize(c->stream), "cudaMemset"))
			return -ENOMEM;
	}
	persist_prepare(c);
	return 0;
}

static void cu_free(struct backend *be)
{
	struct cu_backend *c = CB(be);
	drop_graphs(c);
	free(c->graphs);
	if (c->blas)
		c->cb.destroy(c->blas);
	if (c->cb.lib)
		dlclose(c->cb.lib);
	cudaFree(c->blas_ws);
	cudaFree(c->xh);
	cudaFree(c->wh);
	cudaFree(c->part);
	cudaFree(c->tmp);
	cudaFree(c->att);
	cudaFree(c->xq);
	cudaFree(c->skpart);
	cudaFree(c->skcount);
	cudaFree(c->d_stage);
	cudaFreeHost(c->h_stage);
	if (c->staged)
		cudaEventDestroy(c->staged);
	if (c->stream)
		cudaStreamDestroy(c->stream);
	free(c);
}

static const struct backend_ops cuda_ops = {
	"cuda",
	cu_op_matmul,
	cu_op_rmsnorm,
	cu_op_rope,
	cu_op_kv_store,
	cu_op_attention,
	cu_op_silu_mul,
	cu_op_add,
	cu_op_embed,
	cu_reserve,
	cu_free,
	cu_mem_alloc,
	cu_mem_free,
	cu_upload,
	cu_download,
	cu_copy,
	cu_weight_place,
	cu_weight_release,
	cu_batch_begin,
	cu_graph_replay,
	cu_graph_record_begin,
	cu_graph_record_end,
	cu_mem_info,
	cu_op_matmul_n,
	cu_op_matmul_add,
	cu_op_matmul_swiglu,
	cu_op_layer,
};

static int load_cublas(struct cublas_fns *f, char **cause)
{
	const char *names[] = { "libcublas.so.13", "libcublas.so.12", "libcublas.so" };
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && !f->lib; i++)
		f->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
	if (!f->lib) {
		if (asprintf(cause, "cannot load cuBLAS (libcublas.so.13): %s", dlerror()) < 0)
			*cause = NULL;
		return -1;
	}
#define SYM(field, name) \
	if (!(*(void **)&f->field = dlsym(f->lib, name))) { \
		if (asprintf(cause, "cuBLAS lacks %s", name) < 0) \
			*cause = NULL; \
		return -1; \
	}
	SYM(create, "cublasCreate_v2");
	SYM(destroy, "cublasDestroy_v2");
	SYM(set_stream, "cublasSetStream_v2");
	SYM(set_workspace, "cublasSetWorkspace_v2");
	SYM(set_math_mode, "cublasSetMathMode");
	SYM(gemm_ex, "cublasGemmEx");
	SYM(sgemm, "cublasSgemm_v2");
	SYM(gemm_batched, "cublasGemmStridedBatchedEx");
#undef SYM
	return 0;
}

extern "C" struct backend *backend_cuda_new(int gpu, enum backend_wtype wtype, char **cause)
{
	*cause = NULL;
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess || n == 0) {
		/* the runtime reports a missing driver as an old one: tell them
		 * apart, and say which versions when it is old */
		void *drv = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
		int dv = 0;
		char why[160];
		if (!drv)
			snprintf(why, sizeof(why), "no NVIDIA driver: libcuda.so.1 cannot be loaded");
		else if (e == cudaErrorInsufficientDriver && cudaDriverGetVersion(&dv) == cudaSuccess)
			snprintf(why, sizeof(why), "the NVIDIA driver supports CUDA %d.%d, this build "
				 "needs %d.%d or newer", dv / 1000, dv % 1000 / 10, CUDART_VERSION / 1000,
				 CUDART_VERSION % 1000 / 10);
		else
			snprintf(why, sizeof(why), "%s",
				 e != cudaSuccess ? cudaGetErrorString(e) : "none found");
		if (drv)
			dlclose(drv);
		if (asprintf(cause, "no usable CUDA device (%s)", why) < 0)
			*cause = NULL;
		cudaGetLastError();
		return NULL;
	}
	if (gpu < 0 || gpu >= n) {
		if (asprintf(cause, "CUDA device %d does not exist (%d found)", gpu, n) < 0)
			*cause = NULL;
		return NULL;
	}
	cudaDeviceProp prop;
	if (cudaGetDeviceProperties(&prop, gpu) != cudaSuccess || cudaSetDevice(gpu) != cudaSuccess) {
		if (asprintf(cause, "CUDA device %d cannot be used", gpu) < 0)
			*cause = NULL;
		return NULL;
	}
	if (prop.major < 9) {
		if (asprintf(cause, "%s (compute capability %d.%d) is older than this build's "
			     "target (sm_90, Hopper)", prop.name, prop.major, prop.minor) < 0)
			*cause = NULL;
		return NULL;
	}
	struct cu_backend *c = (struct cu_backend *)calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->be.ops = &cuda_ops;
	c->be.n_threads = 1;
	c->dev = gpu;
	c->n_sm = prop.multiProcessorCount;
	c->wtype = wtype;
	/* rows from which a sequence's new rows take the GEMM form of
	 * attention (f16 operands); LLAMAD_CUDA_GEMM_ATTN=0 keeps every row on
	 * the fp32 kernels */
	const char *ga = getenv("LLAMAD_CUDA_GEMM_ATTN");
	c->big_run = ga && *ga ? atoi(ga) : CU_BIG_RUN;
	/* Q8_0 / Q4_0 matrix-vector products quantize the activations to 8
	 * bits (__dp4a); LLAMAD_CUDA_EXACT_Q=1 keeps them fp32 */
	c->q8_act = !backend_env_flag("LLAMAD_CUDA_EXACT_Q");
	/* K-quants stay in their blocks; LLAMAD_CUDA_KQ_F16=1 expands them at
	 * load to the type of the file's f32 matrices (wtype) */
	if (backend_env_flag("LLAMAD_CUDA_KQ_F16"))
		c->kq[0] = c->kq[1] = c->kq[2] = -1;
	/* layer kernels per dtype: the fixed table, LLAMAD_CUDA_KERNELS over
	 * it (a diagnostic: llamad(8)) */
	cu_cand_defaults(c->cand);
	memset(c->persist, 0xff, sizeof(c->persist));
	const char *ks = getenv("LLAMAD_CUDA_KERNELS");
	if (ks && *ks && cu_cand_spec(ks, c->cand))
		backend_log(BACKEND_LOG_WARN, "cuda: LLAMAD_CUDA_KERNELS=%s is not understood (a "
			    "candidate: base, fused, persistent, splitk; or dtype=candidate,...): "
			    "ignored", ks);
	if (load_cublas(&c->cb, cause) ||
	    cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking) != cudaSuccess ||
	    cudaEventCreateWithFlags(&c->staged, cudaEventDisableTiming) != cudaSuccess ||
	    c->cb.create(&c->blas) != CUBLAS_STATUS_SUCCESS ||
	    c->cb.set_stream(c->blas, c->stream) != CUBLAS_STATUS_SUCCESS ||
	    cudaMalloc(&c->blas_ws, 32u << 20) != cudaSuccess ||
	    c->cb.set_workspace(c->blas, c->blas_ws, 32u << 20) != CUBLAS_STATUS_SUCCESS) {
		if (!*cause && asprintf(cause, "cannot set up CUDA on %s: %s", prop.name,
					cudaGetErrorString(cudaGetLastError())) < 0)
			*cause = NULL;
		cu_free(&c->be);
		return NULL;
	}
	/* fp32 matrices stay fp32 (no TF32) */
	c->cb.set_math_mode(c->blas, CUBLAS_DEFAULT_MATH);
	cudaEventRecord(c->staged, c->stream);
	static const char *wn[] = { "f16", "bf16", "f32" };
	char name[48];
	memcpy(name, prop.name, sizeof(name) - 1);
	name[sizeof(name) - 1] = 0;
	/* f16 / q8_0 K/V: stored and attended on the device in the CPU's
	 * layout (kv_store.cu, attention.cu), but written 2026-12-03 without a
	 * GPU and never run on one: offered only with LLAMAD_CUDA_KV_TYPED=1
	 * until tests/gpu/run.sh has passed with them (llamad(8)); else the
	 * daemon keeps f32 K/V on the device, with its warning */
	c->be.kv_types = 1u << KT_F32;
	if (backend_env_flag("LLAMAD_CUDA_KV_TYPED"))
		c->be.kv_types |= 1u << KT_F16 | 1u << KT_Q8_0;
	snprintf(c->be.desc, sizeof(c->be.desc), "cuda, %s (sm_%d%d, %d SMs, %.1f GiB), %s weights",
		 name, prop.major, prop.minor, prop.multiProcessorCount,
		 prop.totalGlobalMem / 1073741824.0, wn[wtype]);
	return &c->be;
}

extern "C" int backend_cuda_set_kernels(struct backend *be, const char *spec)
{
	if (!be || be->ops != &cuda_ops)
		return -ENOSYS;
	return set_kernels(CB(be), spec);
}

/*
 * kernels/backend.c — choosing a backend at run time.
 *
 * The CUDA backend exists only in builds made with nvcc (LLAMAD_CUDA); the
 * CPU backend always. "auto" takes the GPU when one is usable and says why
 * it did not otherwise.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/backend.h"

#ifndef LLAMAD_CUDA
struct backend *backend_cuda_new(int gpu, enum backend_wtype wtype, char **cause)
{
	(void)gpu;
	(void)wtype;
	if (cause && asprintf(cause, "this llamad was built without the CUDA backend "
			      "(nvcc was not found, or CUDA=0)") < 0)
		*cause = NULL;
	return NULL;
}

int backend_cuda_set_kernels(struct backend *be, const char *spec)
{
	(void)be;
	(void)spec;
	return -ENOSYS;
}
#endif

struct backend *backend_open(const struct backend_opts *o, char **cause, char **note)
{
	*cause = NULL;
	if (note)
		*note = NULL;
	if (o->kind == BACKEND_CPU)
		return backend_cpu_new(o->n_threads);
	char *why = NULL;
	struct backend *be = backend_cuda_new(o->gpu, o->wtype, &why);
	if (be) {
		free(why);
		return be;
	}
	if (o->kind == BACKEND_CUDA) {
		if (asprintf(cause, "--device cuda: %s", why ? why : "the CUDA backend cannot start") < 0)
			*cause = NULL;
		free(why);
		return NULL;
	}
	if (note)
		*note = why;
	else
		free(why);
	return backend_cpu_new(o->n_threads);
}

int backend_mem_info(struct backend *be, size_t *free_b, size_t *total_b)
{
	if (!be->ops->mem_info)
		return -ENOSYS;
	return be->ops->mem_info(be, free_b, total_b);
}

void backend_free(struct backend *be)
{
	if (be)
		be->ops->free(be);
}

enum kt_dtype backend_kv_type(const struct backend *be, enum kt_dtype want, int hd,
			      const char **why)
{
	*why = NULL;
	if ((be->kv_types & 1u << want) && kt_kv_dtype_ok(want, hd))
		return want;
	*why = kt_kv_dtype_ok(want, hd) ? "on this backend" : "for this head dimension";
	return (be->kv_types & 1u << KT_F16) && kt_kv_dtype_ok(KT_F16, hd) ? KT_F16 : KT_F32;
}

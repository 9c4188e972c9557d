/*
 * kernels/cuda/error.cu — the CUDA backend's errors: a CUDA or cuBLAS error
 * other than a failed allocation is sticky (be->failed), and the launch
 * error that cu_launch_pdl (cuda.cuh) notes for its thread. A leaf: the
 * launchers of the per-op files note their errors here, not in backend.cu.
 */
#include <errno.h>

#include "kernels/cuda/backend.cuh"

/* Record an error: allocation failures are the caller's to report; any
 * other error is sticky for us. Returns 0 on success. */
int ck(struct cu_backend *c, cudaError_t e, const char *what)
{
	if (e == cudaSuccess)
		return 0;
	if (e == cudaErrorMemoryAllocation) {
		cudaGetLastError();
		return -ENOMEM;
	}
	if (!c->be.failed)
		backend_log(BACKEND_LOG_ERROR, "cuda: %s: %s", what, cudaGetErrorString(e));
	c->be.failed = 1;
	return -EIO;
}

static thread_local cudaError_t pdl_error = cudaSuccess;  /* this thread's last */

void cu_note_launch_error(cudaError_t e)
{
	pdl_error = e;
}

/* The last launch error of cu_launch_pdl (cudaSuccess when none), cleared. */
static cudaError_t cu_take_launch_error(void)
{
	cudaError_t e = pdl_error;
	pdl_error = cudaSuccess;
	return e;
}

void launched(struct cu_backend *c, const char *op)
{
	cudaError_t e = cu_take_launch_error();
	ck(c, e != cudaSuccess ? e : cudaGetLastError(), op);
}

int blas_ck(struct cu_backend *c, cublasStatus_t s, const char *what)
{
	if (s == CUBLAS_STATUS_SUCCESS)
		return 0;
	if (!c->be.failed)
		backend_log(BACKEND_LOG_ERROR, "cuda: %s: cuBLAS status %d", what, (int)s);
	c->be.failed = 1;
	return -EIO;
}

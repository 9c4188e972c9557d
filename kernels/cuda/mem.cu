/*
 * kernels/cuda/mem.cu — device memory and host <-> device copies (the op
 * table's memory entries), and the growth of the backend's device scratch.
 */
#include <errno.h>

#include "kernels/cuda/backend.cuh"

void *cu_mem_alloc(struct backend *be, size_t bytes)
{
	void *p = NULL;
	if (CB(be)->capturing || ck(CB(be), cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc"))
		return NULL;
	return p;
}

void cu_mem_free(struct backend *be, void *p)
{
	(void)be;
	if (p)
		cudaFree(p);
}

int cu_upload(struct backend *be, void *dst, const void *src, size_t bytes)
{
	struct cu_backend *c = CB(be);
	if (be->failed)
		return -EIO;
	if (ck(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream), "upload"))
		return -EIO;
	return ck(c, cudaStreamSynchronize(c->stream), "upload") ? -EIO : 0;
}

int cu_download(struct backend *be, void *dst, const void *src, size_t bytes)
{
	struct cu_backend *c = CB(be);
	if (be->failed)
		return -EIO;
	if (ck(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream), "download"))
		return -EIO;
	return ck(c, cudaStreamSynchronize(c->stream), "download") ? -EIO : 0;
}

int cu_copy(struct backend *be, void *dst, const void *src, size_t bytes)
{
	struct cu_backend *c = CB(be);
	if (be->failed)
		return -EIO;
	return ck(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream),
		  "copy") ? -EIO : 0;
}

int cu_mem_info(struct backend *be, size_t *free_b, size_t *total_b)
{
	return ck(CB(be), cudaMemGetInfo(free_b, total_b), "cudaMemGetInfo");
}

/* Grow a device scratch buffer (never while recording a graph). */
int grow(struct cu_backend *c, void **buf, size_t *cap, size_t need)
{
	if (*cap >= need)
		return 0;
	if (c->capturing) {
		ck(c, cudaErrorStreamCaptureUnsupported, "scratch growth while recording");
		return -EIO;
	}
	cudaStreamSynchronize(c->stream);
	cudaFree(*buf);
	*buf = NULL;
	*cap = 0;
	int rc = ck(c, cudaMalloc(buf, need), "scratch");
	if (!rc)
		*cap = need;
	return rc;
}

/*
 * kernels/cuda/graph.cu — CUDA graphs: the work of a step recorded once per
 * (owner, key) and replayed while it reads the same KV pool (base, element
 * type and q8_0 group: the kernels recorded are the type's); a recording
 * that fails turns graphs off for the backend.
 */
#include <stdlib.h>

#include "kernels/cuda/backend.cuh"

/* Forget every recorded graph (after the stream's work is done). */
void drop_graphs(struct cu_backend *c)
{
	cudaStreamSynchronize(c->stream);
	for (int i = 0; i < c->n_graphs; i++)
		cudaGraphExecDestroy(c->graphs[i].exec);
	c->n_graphs = 0;
}

static struct cu_graph *find_graph(struct cu_backend *c, const void *owner, int key)
{
	for (int i = 0; i < c->n_graphs; i++)
		if (c->graphs[i].owner == owner && c->graphs[i].key == key)
			return &c->graphs[i];
	return NULL;
}

int cu_graph_replay(struct backend *be, const void *owner, int key)
{
	struct cu_backend *c = CB(be);
	if (c->graphs_off || be->failed)
		return 0;
	struct cu_graph *g = find_graph(c, owner, key);
	if (!g)
		return 0;
	if (g->kv_base != c->kv_base || g->kv_dt != c->kv_dt || g->kv_group != c->kv_group) {
		/* another pool (or one of another type at the same address): the
		 * recorded kernels and offsets are not its own; record again */
		cudaGraphExecDestroy(g->exec);
		*g = c->graphs[--c->n_graphs];
		return 0;
	}
	return ck(c, cudaGraphLaunch(g->exec, c->stream), "graph launch") == 0;
}

void cu_graph_record_begin(struct backend *be, const void *owner, int key)
{
	struct cu_backend *c = CB(be);
	(void)owner;
	(void)key;
	if (c->graphs_off || be->failed)
		return;
	if (cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess)
		c->capturing = 1;
	else
		cudaGetLastError();
}

int cu_graph_record_end(struct backend *be, const void *owner, int key)
{
	struct cu_backend *c = CB(be);
	if (!c->capturing)
		return -1;
	c->capturing = 0;
	cudaGraph_t graph = NULL;
	cudaGraphExec_t exec = NULL;
	cudaError_t e = cudaStreamEndCapture(c->stream, &graph);
	if (e == cudaSuccess && !be->failed)
		e = cudaGraphInstantiate(&exec, graph, 0);
	if (graph)
		cudaGraphDestroy(graph);
	if (e != cudaSuccess || be->failed) {
		/* an op could not be recorded: run unrecorded from now on */
		backend_log(BACKEND_LOG_WARN, "cuda: graph recording failed (%s); running without "
			    "graphs", cudaGetErrorString(e));
		cudaGetLastError();
		c->graphs_off = 1;
		be->failed = 0;  /* capture errors are not device errors */
		return -1;
	}
	if (c->n_graphs == c->cap_graphs) {
		int nc = c->cap_graphs ? 2 * c->cap_graphs : 16;
		struct cu_graph *ng = (struct cu_graph *)realloc(c->graphs, nc * sizeof(*ng));
		if (!ng) {
			cudaGraphExecDestroy(exec);
			c->graphs_off = 1;
			return -1;
		}
		c->graphs = ng;
		c->cap_graphs = nc;
	}
	struct cu_graph *g = &c->graphs[c->n_graphs++];
	g->owner = owner;
	g->key = key;
	g->kv_base = c->kv_base;
	g->kv_dt = c->kv_dt;
	g->kv_group = c->kv_group;
	g->exec = exec;
	return ck(c, cudaGraphLaunch(exec, c->stream), "graph launch") ? -1 : 0;
}

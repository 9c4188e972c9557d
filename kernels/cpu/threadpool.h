/*
 * kernels/cpu/threadpool.h — a fixed pool of worker threads for the CPU
 * backend. One job at a time: tpool_run() runs fn on every thread (the caller
 * is thread 0) and returns when all are done. Workers spin briefly between
 * jobs (a forward pass issues many small jobs) and then sleep on a futex.
 */
#ifndef LLAMAD_KERNELS_CPU_THREADPOOL_H
#define LLAMAD_KERNELS_CPU_THREADPOOL_H

typedef void (*tpool_fn)(void *ctx, int ith, int nth);

struct tpool;

/* Pool of n_threads in all (the caller counts as one; n_threads-1 workers are
 * started). Returns NULL on failure. */
struct tpool *tpool_new(int n_threads);
/* Stop and join the workers; accepts NULL. */
void tpool_free(struct tpool *p);
/* Number of threads (caller included). */
int tpool_size(const struct tpool *p);
/* Run fn(ctx, i, n) for i in [0, n) with n = nth (1 <= nth <= size) and wait.
 * Not reentrant: call from one thread at a time. */
void tpool_run(struct tpool *p, tpool_fn fn, void *ctx, int nth);

#endif

/*
 * kernels/cpu/threadpool.c — see threadpool.h.
 */
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kernels/cpu/threadpool.h"

#define SPIN_ITERS 4000   /* ~0.2 ms of pause before sleeping */

struct tpool {
	int n;
	pthread_t *threads;
	_Atomic uint32_t gen;       /* bumped once per job (futex word) */
	_Atomic int pending;        /* workers still running the job */
	_Atomic int stop;
	_Atomic int sleepers;       /* workers parked on the futex */
	tpool_fn fn;
	void *ctx;
	int nth;
};

struct worker_arg {
	struct tpool *p;
	int ith;
};

static void futex_wait(_Atomic uint32_t *addr, uint32_t val)
{
	syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *addr)
{
	syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

static void *worker_main(void *arg)
{
	struct worker_arg wa = *(struct worker_arg *)arg;
	struct tpool *p = wa.p;
	free(arg);
	/* gen is 0 when the pool starts: a job posted before this thread ran
	 * must still be seen as new */
	uint32_t seen = 0;
	for (;;) {
		uint32_t g;
		int spins = 0;
		while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
			if (++spins < SPIN_ITERS)
				cpu_relax();
			else {
				atomic_fetch_add(&p->sleepers, 1);
				futex_wait(&p->gen, seen);
				atomic_fetch_sub(&p->sleepers, 1);
			}
		}
		seen = g;
		if (atomic_load(&p->stop))
			return NULL;
		if (wa.ith < p->nth)
			p->fn(p->ctx, wa.ith, p->nth);
		atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
	}
}

struct tpool *tpool_new(int n_threads)
{
	if (n_threads < 1)
		n_threads = 1;
	struct tpool *p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	p->n = n_threads;
	p->threads = calloc((size_t)n_threads, sizeof(pthread_t));
	if (!p->threads) {
		free(p);
		return NULL;
	}
	for (int i = 1; i < n_threads; i++) {
		struct worker_arg *wa = malloc(sizeof(*wa));
		if (!wa || (wa->p = p, wa->ith = i,
			    pthread_create(&p->threads[i], NULL, worker_main, wa)) != 0) {
			free(wa);
			p->n = i;  /* join only those started */
			tpool_free(p);
			return NULL;
		}
	}
	return p;
}

void tpool_free(struct tpool *p)
{
	if (!p)
		return;
	atomic_store(&p->stop, 1);
	atomic_fetch_add(&p->gen, 1);
	futex_wake_all(&p->gen);
	for (int i = 1; i < p->n; i++)
		pthread_join(p->threads[i], NULL);
	free(p->threads);
	free(p);
}

int tpool_size(const struct tpool *p)
{
	return p->n;
}

void tpool_run(struct tpool *p, tpool_fn fn, void *ctx, int nth)
{
	if (nth > p->n)
		nth = p->n;
	if (nth <= 1) {
		fn(ctx, 0, 1);
		return;
	}
	p->fn = fn;
	p->ctx = ctx;
	p->nth = nth;
	atomic_store(&p->pending, p->n - 1);
	atomic_fetch_add(&p->gen, 1);
	if (atomic_load(&p->sleepers) > 0)
		futex_wake_all(&p->gen);
	fn(ctx, 0, nth);
	while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0)
		cpu_relax();
}

/*
 * kernels/env.c — what the backends take from the process they run in: the
 * hook their messages go through (backend_set_log, backend_log) and the
 * LLAMAD_* on/off switches (backend_env_flag). A leaf: it calls nothing
 * else in kernels/, so the CPU and CUDA backends call it without calling
 * back into backend.c, which opens them.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/backend.h"

static void (*log_fn)(int level, const char *msg);

void backend_set_log(void (*fn)(int level, const char *msg))
{
	log_fn = fn;
}

void backend_log(int level, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (log_fn)
		log_fn(level, msg);
	else
		fprintf(stderr, "llamad: %s\n", msg);
}

int backend_env_flag(const char *name)
{
	const char *v = getenv(name);
	return v && *v && *v != '0';
}

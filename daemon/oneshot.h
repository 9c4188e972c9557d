/*
 * daemon/oneshot.h — `llamad --prompt`: generate one completion to stdout
 * and exit, without serving. For debugging, scripts and benchmarks.
 */
#ifndef LLAMAD_DAEMON_ONESHOT_H
#define LLAMAD_DAEMON_ONESHOT_H

#include <stdio.h>

#include "generate/sampler.h"
#include "model/model.h"
#include "text/chat.h"

struct oneshot_opts {
	const char *prompt;
	const char *system;
	enum chat_template tmpl;
	int max_tokens;
	int echo;
	int verbose;
	int threads;
	int device;        /* enum backend_kind */
	int gpu_weights;   /* enum backend_wtype */
	int kv_type;       /* enum kt_dtype */
	struct sampler_params sp;
	const char **stops;
	int n_stops;
};

/* Run one generation; text goes to out, errors and timings to stderr.
 * Returns 0 on success, 1 on a runtime error, 2 on bad input. */
int oneshot_run(struct model *m, const struct oneshot_opts *o, FILE *out);

#endif

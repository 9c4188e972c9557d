/*
 * text/stop.h — stop strings over streamed text.
 *
 * Generated text is pushed as it is produced. Text that could still be the
 * start of a stop string is held back; everything else is passed to the emit
 * callback at once. When a stop string appears, the text before it is
 * emitted and the match (and anything after it) is dropped.
 */
#ifndef LLAMAD_TEXT_STOP_H
#define LLAMAD_TEXT_STOP_H

#include <stddef.h>

typedef void (*stop_emit_fn)(void *ctx, const char *text, size_t len);

struct stopper {
	char **stops;
	int n_stops;
	char *pend;
	size_t n_pend, cap;
	int hit;      /* index of the stop string seen, or -1 */
};

/* Copy n stop strings (empty ones are ignored). Returns 0 or -ENOMEM. */
int stopper_init(struct stopper *s, const char *const *stops, int n);
void stopper_done(struct stopper *s);
/* Push text; emits what is safe. Returns 1 once a stop string matched (later
 * pushes are ignored), 0 otherwise, or -ENOMEM. */
int stopper_push(struct stopper *s, const char *text, size_t len, stop_emit_fn emit, void *ctx);
/* Emit whatever is held back (end of generation without a match). */
void stopper_flush(struct stopper *s, stop_emit_fn emit, void *ctx);

#endif

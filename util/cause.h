/*
 * util/cause.h — the one way a function hands a human-readable reason to
 * its caller: `char **cause` (systemd's and tmux's convention).
 *
 * A function that may fail with a reason takes `char **cause` (NULL: the
 * caller does not want it) and, on failure, leaves a malloc'd one-line
 * message there that the caller frees. *cause is NULL or an earlier message
 * when such a function is called: setting it again frees what it held, so
 * the last reason set is the one the caller sees. No logging here or in
 * any library folder: the daemon decides what to print.
 */
#ifndef LLAMAD_UTIL_CAUSE_H
#define LLAMAD_UTIL_CAUSE_H

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

/* *cause = the message formatted from fmt (NULL if out of memory), after
 * freeing what *cause held. Does nothing if cause is NULL. */
void cause_set(char **cause, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* cause_set with a va_list. */
void cause_vset(char **cause, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

#ifdef __cplusplus
}
#endif

#endif

/*
 * util/clock.h — the two clocks the daemon reads: monotonic seconds for
 * durations and rates, and Unix milliseconds for what is shown or saved
 * (a session's last use).
 */
#ifndef LLAMAD_UTIL_CLOCK_H
#define LLAMAD_UTIL_CLOCK_H

#include <stdint.h>

/* CLOCK_MONOTONIC in seconds. */
double clock_mono_s(void);
/* CLOCK_REALTIME in milliseconds since the Unix epoch. */
int64_t clock_unix_ms(void);

#endif

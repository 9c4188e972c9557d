/*
 * daemon/log.c — see log.h.
 */
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "daemon/log.h"

static int max_level = LL_INFO;
static int journal;

void log_set_level(int level)
{
	max_level = level;
}

void log_set_journal(int on)
{
	journal = on;
}

void log_msg(int level, const char *fmt, ...)
{
	static const int prio[] = { 3, 4, 6, 7 };
	static const char *const name[] = { "error", "warning", "info", "debug" };
	if (level > max_level)
		return;
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (journal) {
		fprintf(stderr, "<%d>%s\n", prio[level], msg);
	} else {
		char ts[32];
		time_t t = time(NULL);
		struct tm tm;
		strftime(ts, sizeof(ts), "%Y-%m-%d %H:%M:%S", localtime_r(&t, &tm));
		fprintf(stderr, "%s llamad %s: %s\n", ts, name[level], msg);
	}
	fflush(stderr);
}

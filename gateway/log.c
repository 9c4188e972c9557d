/*
 * gateway/log.c — llamad-http's log lines (gw_log, gw.h): a leaf that
 * every file of the gateway may call.
 */
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "gateway/gw.h"

/* Into the journal, a line carries its syslog priority ("<4>..."), which
 * the journal keeps as the level; elsewhere (a terminal, a file) it reads
 * as llamad's: "YYYY-MM-DD HH:MM:SS llamad-http LEVEL: message". */
void gw_log(struct gw *g, int level, const char *fmt, ...)
{
	if ((level == GW_DEBUG && g->verbose < 1) || (level == GW_INFO && g->quiet))
		return;
	va_list ap;
	va_start(ap, fmt);
	if (g->journal) {
		fprintf(stderr, "<%d>llamad-http: ", level);
	} else {
		char ts[32];
		time_t t = time(NULL);
		struct tm tm;
		strftime(ts, sizeof(ts), "%Y-%m-%d %H:%M:%S", localtime_r(&t, &tm));
		fprintf(stderr, "%s llamad-http %s: ", ts,
			level <= GW_ERR ? "error" : level == GW_WARN ? "warning" :
			level == GW_INFO ? "info" : "debug");
	}
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

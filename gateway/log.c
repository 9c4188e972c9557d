/*
 * gateway/log.c — llamad-http's log lines (gw_log, gw.h): a leaf that
 * every file of the gateway may call.
 */
#include <stdarg.h>
#include <stdio.h>

#include "gateway/gw.h"

void gw_log(struct gw *g, int level, const char *fmt, ...)
{
	if ((level == GW_DEBUG && g->verbose < 1) || (level == GW_INFO && g->quiet))
		return;
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "<%d>llamad-http: ", level);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

/*
 * util/cause.c — see cause.h.
 */
#include <stdio.h>
#include <stdlib.h>

#include "util/cause.h"

void cause_vset(char **cause, const char *fmt, va_list ap)
{
	if (!cause)
		return;
	char *s = NULL;
	if (vasprintf(&s, fmt, ap) < 0)
		s = NULL;
	free(*cause);
	*cause = s;
}

void cause_set(char **cause, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	cause_vset(cause, fmt, ap);
	va_end(ap);
}

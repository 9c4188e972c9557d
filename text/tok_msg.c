/*
 * text/tok_msg.c — how the tokenizer loaders word their reasons (see
 * tok_int.h).
 */
#include <stdio.h>

#include "text/tok_int.h"
#include "util/cause.h"

void tok_vfail(char **cause, const char *what, const char *fmt, va_list ap)
{
	if (!cause || *cause)
		return;
	char msg[512];
	vsnprintf(msg, sizeof msg, fmt, ap);
	cause_set(cause, "tokenizer %s: %s", what, msg);
}

void tok_fail(char **cause, const char *what, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	tok_vfail(cause, what, fmt, ap);
	va_end(ap);
}

const char *tok_shown(const char *s, size_t n, char out[200])
{
	size_t o = 0;
	for (size_t i = 0; i < n && o < 180; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\')
			out[o++] = (char)c;
		else
			o += (size_t)snprintf(out + o, 200 - o, "\\x%02x", c);
	}
	if (o >= 180)
		o += (size_t)snprintf(out + o, 200 - o, "...");
	out[o] = 0;
	return out;
}

/*
 * util/session_id.h — what a session id is: 1 to SESSION_ID_MAX bytes of
 * A-Z a-z 0-9 . _ : -. The session table (session/) and the state files
 * hold ids of this form; the wire's limit (proto/limits.h) is this one.
 * Plain integer literals, so that a usage text can spell the limit.
 */
#ifndef LLAMAD_UTIL_SESSION_ID_H
#define LLAMAD_UTIL_SESSION_ID_H

#include <stddef.h>

#define SESSION_ID_MAX 128 /* bytes per session id */

/* 1 if id is a valid session id, else 0. */
static inline int session_id_ok(const char *id)
{
	size_t n = 0;
	for (const char *p = id; *p; p++, n++) {
		char c = *p;
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '_' || c == ':' || c == '-'))
			return 0;
		if (n >= SESSION_ID_MAX)
			return 0;
	}
	return n >= 1;
}

#endif

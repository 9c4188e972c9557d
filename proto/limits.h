/*
 * proto/limits.h — limits of the wire contract that the daemon enforces and
 * the clients check before sending (llamad-protocol(7)). Plain integer
 * literals, so that LLAMAD_STR() can spell them in usage texts and messages.
 */
#ifndef LLAMAD_PROTO_LIMITS_H
#define LLAMAD_PROTO_LIMITS_H

#include <stddef.h>

/* The decimal text of a limit, as a string literal: LLAMAD_STR(LLAMAD_MAX_STOPS)
 * is "16". */
#define LLAMAD_STR(x) LLAMAD_STR_(x)
#define LLAMAD_STR_(x) #x

#define LLAMAD_MAX_STOPS 16      /* stop strings per Generate */
#define LLAMAD_MAX_STOP_LEN 256  /* bytes per stop string */
#define LLAMAD_MAX_STOP_ENTRIES 1024  /* stop entries, empty ones included */
#define LLAMAD_SESSION_ID_MAX 128 /* bytes per session id */
#define LLAMAD_SESSION_ID_RULE \
	"session ids are 1-" LLAMAD_STR(LLAMAD_SESSION_ID_MAX) " characters of A-Z a-z 0-9 . _ : -"

/* 1 if id is a valid session id (LLAMAD_SESSION_ID_RULE), else 0. */
static inline int llamad_session_id_ok(const char *id)
{
	size_t n = 0;
	for (const char *p = id; *p; p++, n++) {
		char c = *p;
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '_' || c == ':' || c == '-'))
			return 0;
		if (n >= LLAMAD_SESSION_ID_MAX)
			return 0;
	}
	return n >= 1;
}

#endif

/*
 * proto/limits.h — limits of the wire contract that the daemon enforces and
 * the clients check before sending (llamad-protocol(7)). Plain integer
 * literals, so that LLAMAD_STR() can spell them in usage texts and messages;
 * the session id's rule is util/session_id.h's, re-exported.
 */
#ifndef LLAMAD_PROTO_LIMITS_H
#define LLAMAD_PROTO_LIMITS_H

#include <stddef.h>

#include "util/session_id.h"

/* The decimal text of a limit, as a string literal: LLAMAD_STR(LLAMAD_MAX_STOPS)
 * is "16". */
#define LLAMAD_STR(x) LLAMAD_STR_(x)
#define LLAMAD_STR_(x) #x

#define LLAMAD_MAX_STOPS 16      /* stop strings per Generate */
#define LLAMAD_MAX_STOP_LEN 256  /* bytes per stop string */
#define LLAMAD_MAX_STOP_ENTRIES 1024  /* stop entries, empty ones included */
#define LLAMAD_SESSION_ID_MAX SESSION_ID_MAX /* bytes per session id (util/session_id.h) */
#define LLAMAD_SESSION_ID_RULE \
	"session ids are 1-" LLAMAD_STR(LLAMAD_SESSION_ID_MAX) " characters of A-Z a-z 0-9 . _ : -"

/* 1 if id is a valid session id (LLAMAD_SESSION_ID_RULE), else 0. */
static inline int llamad_session_id_ok(const char *id)
{
	return session_id_ok(id);
}

#endif

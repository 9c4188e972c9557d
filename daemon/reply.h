/*
 * daemon/reply.h — the one way a reply is made: a Response packed into a
 * frame for a connection, and errors with their code and one line of text.
 * Used by the event thread (requests refused before the engine) and by the
 * engine alike, so every refusal is counted in one place.
 *
 * Below the request handlers, functions return -errno; reply_code() is the
 * one mapping from an errno to the wire's ErrorCode:
 *   ENOENT UNKNOWN_SESSION     EEXIST SESSION_EXISTS    EBUSY BUSY
 *   EINVAL BAD_REQUEST         EPERM REFUSED_TEXT       EMSGSIZE CONTEXT_FULL
 *   E2BIG TOO_LARGE            ECANCELED CANCELLED      ESRCH UNKNOWN_REQUEST
 *   EPROTONOSUPPORT BAD_VERSION                         ENOSYS UNKNOWN_OP
 *   EACCES PERMISSION_DENIED
 *   ENOMEM, ENOBUFS (the KV cache is full), EUSERS (max_sessions, a uid's
 *   quota of sessions or share of the KV cache) RESOURCE_EXHAUSTED
 *   EIO, ESTALE (the state directory, a state file) STORAGE
 *   EDQUOT (a uid's share of the disk) STORAGE_QUOTA
 *   ESHUTDOWN SHUTTING_DOWN    anything else INTERNAL
 */
#ifndef LLAMAD_DAEMON_REPLY_H
#define LLAMAD_DAEMON_REPLY_H

#include <stddef.h>
#include <stdint.h>

#include "llamad.pb-c.h"

/* The largest reply frame: what the event thread queues for one
 * connection at most (server.c), so that a reply alone never looks like a
 * client that does not read. */
#define REPLY_MAX (64u << 20)

/* One framed Response (4-byte length + message) for connection conn. */
struct reply {
	struct reply *next;
	uint64_t conn;
	uint64_t id;             /* the request's */
	int terminal;            /* the request's last reply (not a token event) */
	size_t len;
	uint8_t data[];
};

/* Pack r for conn. A reply that would pass REPLY_MAX is an Error TOO_LARGE
 * for its request instead, naming both sizes. NULL on ENOMEM (the caller
 * logs). Free with free(). */
struct reply *reply_pack(uint64_t conn, const Llamad__Response *r);
/* An Error reply (code: Llamad__ErrorCode, msg: one line, no path) to
 * request id of conn, counted in reply_errors(). NULL on ENOMEM. */
struct reply *reply_error(uint64_t conn, uint64_t id, int code, const char *msg);
/* The ErrorCode of -errno err (see above). */
int reply_code(int err);
/* Error replies made so far, by any thread. */
uint64_t reply_errors(void);

struct session;
/* What a SessionInfo says besides the session's own fields: the engine's
 * word on it. */
struct info_env {
	uint64_t block_bytes;     /* bytes of one KV block */
	uint32_t shared_blocks;   /* of the session's blocks, those shared with others */
	uint32_t context_length;  /* tokens a session may hold */
};
/* The SessionInfo of s into *i (its strings point into s). */
void reply_session_info(struct session *s, const struct info_env *env, Llamad__SessionInfo *i);
/* What an Append's reply says of the request (SessionInfo's fields). */
struct info_append {
	int tokens_added;         /* the turn's tokens */
	int computed;             /* tokens run through the model for it */
	int dropped_turns;        /* turns a shift dropped to make room */
};
/* A SessionInfo reply on s to request id of conn (created < 0, ap NULL:
 * not set). NULL on ENOMEM (the caller logs). */
struct reply *reply_info(uint64_t conn, uint64_t id, struct session *s,
			 const struct info_env *env, int created, const struct info_append *ap);

#endif

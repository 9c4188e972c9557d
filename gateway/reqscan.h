/*
 * gateway/reqscan.h — where each HTTP/1.x request on a connection begins
 * and ends, read from the bytes as they arrive, before libevent's HTTP
 * parser sees them, and the limits of a request's head.
 *
 * libevent 2.1's server has no hook between a request's head and its body,
 * no deadline for a whole request (its timeout restarts with every byte),
 * no bound on a head unless asked (then an HTML page), and it parses a
 * header line again from its start on every read: one 32 MiB line cost
 * 7.4 s of CPU. The gateway feeds every byte to this scanner first
 * (conn.c), which mirrors libevent's framing of a request:
 *
 *   - a line ends at LF (a CR before it is dropped); a head ends at its
 *     first empty line after the request line;
 *   - HEAD, TRACE and methods libevent does not know have no body;
 *   - else a body is chunked (Transfer-Encoding: chunked), else
 *     Content-Length bytes (none or 0: no body); chunk sizes are hex
 *     lines (empty lines between chunks skipped), a size 0 ends the
 *     chunks and trailer lines follow up to an empty one;
 *
 * and refuses, with the status to answer:
 *
 *   - 431: a head (trailer lines included) over max_head bytes or with
 *     more than max_lines header lines;
 *   - 400: a NUL byte anywhere in a head (libevent would cut the value
 *     there: "Bearer TOKEN\0junk" would pass as the token), a
 *     Content-Length or chunk size that is not a number; a framing on
 *     which libevent versions differ (Content-Length twice, with
 *     Transfer-Encoding, a coding other than chunked, continuation
 *     lines): what one version takes as two requests another takes as
 *     one, so none is taken;
 *   - 413: a body over max_body bytes (from its Content-Length, or as its
 *     chunks come).
 *
 * Pure (no sockets, no allocation): tests/unit/test_reqscan.c,
 * tests/fuzz/fuzz_head.c.
 */
#ifndef LLAMAD_GATEWAY_REQSCAN_H
#define LLAMAD_GATEWAY_REQSCAN_H

#include <stddef.h>
#include <stdint.h>

#define RS_LINE_KEEP 128   /* bytes of a line kept for its meaning */

struct rscan {
	size_t max_head;           /* bytes of a head (request line, headers, CRLFs) */
	unsigned max_lines;        /* header lines of a head */
	uint64_t max_body;
	int state;                 /* RS_IDLE ... (reqscan.c) */
	size_t head_bytes;
	unsigned lines;
	size_t line_len;           /* bytes of the current line so far (no LF) */
	char line[RS_LINE_KEEP];   /* its first bytes */
	int cr;                    /* its last byte so far is a CR */
	int first;                 /* the request line is being read */
	int no_body;               /* its method has no body */
	int folded;                /* a continuation line came (obs-fold) */
	int twice;                 /* Content-Length or Transfer-Encoding again */
	int have_te, chunked;
	int have_len, len_bad;
	uint64_t len;
	uint64_t left;             /* bytes of the body or the chunk still to come */
	uint64_t body_bytes;       /* a chunked body's so far */
	int ollama;                /* the request's path starts with /api/ */
};

enum rs_kind {
	RS_NONE,                   /* all bytes read, nothing to say */
	RS_START,                  /* a request's first byte was read */
	RS_HEAD_END,               /* its head's last byte was read: body, body_len */
	RS_DONE,                   /* its last byte was read */
	RS_ERROR,                  /* refused: status, msg; nothing more is read */
};

struct rs_event {
	int kind;
	int body;                  /* RS_HEAD_END: 0 none, 1 Content-Length, 2 chunked */
	uint64_t body_len;         /* RS_HEAD_END with Content-Length; RS_DONE: the
				  * body's bytes (chunked: the chunks') */
	int status;                /* RS_ERROR: 400, 413 or 431 */
	int ollama;                /* the request's path starts with /api/ */
	char msg[160];             /* RS_ERROR: one line for the client */
};

/* A scanner at the start of a connection. */
void rscan_init(struct rscan *r, size_t max_head, unsigned max_lines, uint64_t max_body);

/* Read p[0, n) up to the next event: the bytes read (all n when ev->kind
 * is RS_NONE; the event's last byte included otherwise). After RS_ERROR
 * the scanner reads everything and says nothing (RS_NONE). */
size_t rscan_feed(struct rscan *r, const char *p, size_t n, struct rs_event *ev);

#endif

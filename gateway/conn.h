/*
 * gateway/conn.h — llamad-http's callers' connections, from accept to
 * close: who each one is, how many each caller holds, and every request's
 * bytes read through gateway/reqscan.c before libevent's parser sees them.
 *
 *   - Who: read once a connection, at accept: on a Unix socket the peer's
 *     user (SO_PEERCRED); on loopback TCP the user owning the caller's
 *     socket (the kernel's socket table: sock_diag, else /proc/net/tcp);
 *     elsewhere (--allow-remote) the caller's address, until a bearer
 *     token names a user (conn_claim).
 *   - How many: a caller holds at most --max-caller-connections
 *     connections at once (a user; a remote address before its token);
 *     one more is answered 429 and closed, so that one user's thousand
 *     connections cannot take the descriptors everyone needs.
 *   - Deadlines: a request's head must be whole within --header-timeout
 *     seconds of its first byte, its body within that plus one second per
 *     64 KiB of it (a chunked body: of --max-body); a connection that
 *     trickles is cut (408) whatever its pace. Idle keep-alive
 *     connections are libevent's --timeout.
 *   - Heads: over --max-header-size bytes or 100 header lines: 431; a NUL
 *     byte, an ambiguous length: 400; a body over --max-body: 413; each
 *     in the API's own JSON form, before libevent reads the request.
 *   - Accept errors (EMFILE: out of descriptors) pause the listener for
 *     100 ms instead of spinning, said at most every 10 s.
 *
 * The refusals above are written to the socket directly (libevent's
 * server has no hook before a request is whole), the connection's sending
 * side shut, and the connection closed 2 s later.
 */
#ifndef LLAMAD_GATEWAY_CONN_H
#define LLAMAD_GATEWAY_CONN_H

#include <stdbool.h>
#include <sys/types.h>

#include <event2/http.h>
#include <event2/listener.h>

struct gw;
struct caller;

/* Watch every connection g->http accepts (evhttp_set_bevcb). */
void conn_setup(struct gw *g);

/* Watch a listener of g's for accept errors. */
void conn_listener(struct gw *g, struct evconnlistener *l);

/* Who sent req, as its connection's peer said at accept (Unix: the peer's
 * user; loopback TCP without --token-file: the socket's owner): 0 with c
 * filled; -ENOENT when a bearer token must say (TCP with --token-file),
 * -ESRCH when the connection is not watched here (out of memory at its
 * accept). */
int conn_caller(struct evhttp_request *req, struct caller *c);

/* A bearer token names uid on req's connection: from now on its
 * connections count as uid's. 0, or -EUSERS when uid holds its share
 * already (the request is answered 429 by the caller, and the connection
 * closes after it). */
int conn_claim(struct evhttp_request *req, uid_t uid);

/* req, read whole, is being answered: no deadline cuts its connection
 * until the answer has gone out. */
void conn_answering(struct evhttp_request *req);

/* fn(hc, arg) when the client's connection closes (NULL: no more). A
 * connection not watched here takes it directly (evhttp's close
 * callback). */
void conn_on_close(struct evhttp_connection *hc, void (*fn)(struct evhttp_connection *, void *),
		   void *arg);

#endif

/*
 * gateway/reply.h — the replies every route shares (reply.c), the caller a
 * request is served for, and the connection to llamad acting for it.
 */
#ifndef LLAMAD_GATEWAY_REPLY_H
#define LLAMAD_GATEWAY_REPLY_H

#include <event2/http.h>

#include "gateway/api.h"
#include "gateway/gw.h"
#include "gateway/upstream.h"

/* Who sent an HTTP request. */
struct caller {
	uid_t uid;
	char who[64];              /* for the log and Hello.caller */
};

/* The reason phrase of an HTTP status the gateway sends. */
const char *http_reason(int status);

/* Send a JSON body (NUL-terminated) with status; counts errors. */
void http_send_json(struct gw *g, struct evhttp_request *req, int status, const char *body);

/* An error in kind's form (api.h's kinds; the Ollama routes use Ollama's). */
void http_send_error(struct gw *g, struct evhttp_request *req, enum api_kind kind, int status,
		     const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* HTTP status for a llamad error code. */
int http_status_of(int code);

/* Open a connection to m's llamad acting for c, and send Hello; fn gets
 * the Hello's reply (an Error when refused). NULL with *err on a connect
 * failure. */
struct up *http_dial(struct gw *g, struct gw_model *m, const struct caller *c, up_fn fn,
		     void *arg, int *err);

#endif

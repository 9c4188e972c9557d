/*
 * gateway/reply.c — what every route shares: the model a request names,
 * JSON replies and errors in the API's form, HTTP statuses for llamad's
 * error codes, and the connection to llamad acting for a caller. It calls
 * no route (http.c, job.c, metrics.c and conn.c call it).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/http.h>

#include "gateway/reply.h"
#include "gateway/render.h"

struct gw_model *gw_find_model(struct gw *g, const char *name)
{
	for (size_t i = 0; i < g->n_models; i++)
		if (!strcmp(g->models[i].name, name))
			return &g->models[i];
	/* Ollama clients name models NAME:TAG; ":latest" is the default tag */
	const char *colon = strrchr(name, ':');
	if (colon && !strcmp(colon, ":latest"))
		for (size_t i = 0; i < g->n_models; i++)
			if (strlen(g->models[i].name) == (size_t)(colon - name) &&
			    !strncmp(g->models[i].name, name, (size_t)(colon - name)))
				return &g->models[i];
	return NULL;
}

int http_status_of(int code)
{
	switch (code) {
	case LLAMAD__ERROR_CODE__BAD_REQUEST:
	case LLAMAD__ERROR_CODE__REFUSED_TEXT:
	case LLAMAD__ERROR_CODE__CONTEXT_FULL:
	case LLAMAD__ERROR_CODE__SESSION_EXISTS:
		return 400;
	case LLAMAD__ERROR_CODE__UNKNOWN_SESSION:
		return 404;
	case LLAMAD__ERROR_CODE__TOO_LARGE:
		return 413;
	case LLAMAD__ERROR_CODE__BUSY:
	case LLAMAD__ERROR_CODE__RESOURCE_EXHAUSTED:
		return 429;
	case LLAMAD__ERROR_CODE__SHUTTING_DOWN:
		return 503;
	case LLAMAD__ERROR_CODE__STORAGE_QUOTA:
		return 507;
	default:
		return 500;
	}
}

const char *http_reason(int status)
{
	switch (status) {
	case 200: return "OK";
	case 400: return "Bad Request";
	case 401: return "Unauthorized";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	case 408: return "Request Timeout";
	case 413: return "Payload Too Large";
	case 429: return "Too Many Requests";
	case 431: return "Request Header Fields Too Large";
	case 503: return "Service Unavailable";
	case 507: return "Insufficient Storage";
	default: return "Internal Server Error";
	}
}

void http_send_json(struct gw *g, struct evhttp_request *req, int status, const char *body)
{
	struct evbuffer *b = evbuffer_new();
	if (b) {
		evbuffer_add(b, body, strlen(body));
		evbuffer_add(b, "\n", 1);
	}
	evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
	if (status >= 500)
		g->st.errors_5xx++;
	else if (status >= 400)
		g->st.errors_4xx++;
	evhttp_send_reply(req, status, http_reason(status), b);
	if (b)
		evbuffer_free(b);
}

void http_send_error(struct gw *g, struct evhttp_request *req, enum api_kind kind, int status,
		     const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	char *body = render_error(kind, status, msg);
	gw_log(g, status >= 500 ? GW_WARN : GW_DEBUG, "%s %s: %d %s",
	       evhttp_request_get_command(req) == EVHTTP_REQ_GET ? "GET" : "POST",
	       evhttp_request_get_uri(req), status, msg);
	http_send_json(g, req, status, body ? body : "{\"error\":\"out of memory\"}");
	free(body);
}

/* ---- the connection to llamad --------------------------------------------- */

struct up *http_dial(struct gw *g, struct gw_model *m, const struct caller *c, up_fn fn,
		     void *arg, int *err)
{
	struct up *u = up_open(g->base, m->socket, err);
	if (!u)
		return NULL;
	Llamad__Hello h = LLAMAD__HELLO__INIT;
	PB_SET(&h, protocol_version, LLAMAD_PROTOCOL_VERSION);
	h.client = (char *)"llamad-http " GW_VERSION;
	/* named even when it is the gateway's own: a connection acting for
	 * a uid sees that uid's sessions only, so a caller served as root
	 * never reaches another user's sessions by their names */
	if (c) {
		PB_SET(&h, on_behalf_of_uid, (uint32_t)c->uid);
		h.caller = (char *)c->who;
	}
	Llamad__Request rq = LLAMAD__REQUEST__INIT;
	rq.op_case = LLAMAD__REQUEST__OP_HELLO;
	rq.hello = &h;
	int rc = up_call(u, &rq, fn, arg);
	if (rc) {
		up_close(u);
		*err = rc;
		return NULL;
	}
	return u;
}

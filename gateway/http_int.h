/*
 * gateway/http_int.h — the handlers the routes (http.c) call: job.c's
 * generations and metrics.c's /metrics; the replies they share are
 * reply.h's.
 */
#ifndef LLAMAD_GATEWAY_HTTP_INT_H
#define LLAMAD_GATEWAY_HTTP_INT_H

#include <event2/http.h>

#include "gateway/reply.h"

/* Start answering a generation request (job.c). */
void job_start(struct gw *g, struct evhttp_request *req, enum api_kind kind,
	       const struct caller *c);

/* GET /metrics (metrics.c), for caller c. */
void metrics_serve(struct gw *g, struct evhttp_request *req, const struct caller *c);

#endif

/*
 * gateway/limit.h — oversized request bodies refused in JSON (limit.c).
 */
#ifndef LLAMAD_GATEWAY_LIMIT_H
#define LLAMAD_GATEWAY_LIMIT_H

#include "gateway/gw.h"

/* Watch every connection g->http accepts: a Content-Length over
 * g->max_body gets a JSON 413 before the body is read. */
void limit_setup(struct gw *g);

#endif

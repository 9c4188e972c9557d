/*
 * gateway/limit.h — oversized request bodies refused in JSON (limit.c).
 */
#ifndef LLAMAD_GATEWAY_LIMIT_H
#define LLAMAD_GATEWAY_LIMIT_H

#include "gateway/gw.h"

/* Filter every connection g->http accepts: bodies over g->max_body get a
 * JSON 413 before they are read. */
void limit_setup(struct gw *g);

#endif

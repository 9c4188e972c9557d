/*
 * proto/limits.h — limits of the wire contract that the daemon enforces and
 * the clients check before sending (llamad-protocol(7)). Plain integer
 * literals, so that LLAMAD_STR() can spell them in usage texts and messages.
 */
#ifndef LLAMAD_PROTO_LIMITS_H
#define LLAMAD_PROTO_LIMITS_H

#define LLAMAD_MAX_STOPS 16      /* stop strings per Generate */
#define LLAMAD_MAX_STOP_LEN 256  /* bytes per stop string */

/* The decimal text of a limit, as a string literal: LLAMAD_STR(LLAMAD_MAX_STOPS)
 * is "16". */
#define LLAMAD_STR(x) LLAMAD_STR_(x)
#define LLAMAD_STR_(x) #x

#endif

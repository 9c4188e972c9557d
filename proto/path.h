/*
 * proto/path.h — where the daemon listens and the clients connect when no
 * socket is named (llamad.conf(5) `socket`, llamactl --socket).
 */
#ifndef LLAMAD_PROTO_PATH_H
#define LLAMAD_PROTO_PATH_H

#define LLAMAD_SOCKET_SYSTEM "/run/llamad/llamad.sock"
#define PATH_CANDIDATES 2

/* The sockets a client tries, in order, when none is named:
 * $LLAMAD_SOCKET alone when set and not empty; else, for a user other than
 * root with $XDG_RUNTIME_DIR set and not empty, the user's own
 * $XDG_RUNTIME_DIR/llamad/llamad.sock and then LLAMAD_SOCKET_SYSTEM (the
 * installed service's); else LLAMAD_SOCKET_SYSTEM alone. A client goes on
 * to the next only when nothing listens at one (ENOENT, ECONNREFUSED).
 * Fills out[] with malloc'd strings (the caller frees them); returns how
 * many, or -ENOMEM (nothing to free). */
int path_client_sockets(char *out[PATH_CANDIDATES]);

/* The daemon's default socket: the first of path_client_sockets (the
 * daemon does not fall back). A malloc'd string, or NULL on ENOMEM. */
char *path_default_socket(void);

#endif

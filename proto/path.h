/*
 * proto/path.h — where the daemon listens and the clients connect when no
 * socket is named (llamad.conf(5) `socket`, llamactl --socket).
 */
#ifndef LLAMAD_PROTO_PATH_H
#define LLAMAD_PROTO_PATH_H

#define LLAMAD_SOCKET_SYSTEM "/run/llamad/llamad.sock"

/* The default socket path: $LLAMAD_SOCKET when set and not empty; else, for
 * a user other than root with $XDG_RUNTIME_DIR set and not empty,
 * $XDG_RUNTIME_DIR/llamad/llamad.sock; else LLAMAD_SOCKET_SYSTEM. Returns a
 * malloc'd string (the caller frees it), or NULL on ENOMEM. */
char *path_default_socket(void);

#endif

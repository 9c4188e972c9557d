/*
 * daemon/server.h — the event loop (see server.c).
 */
#ifndef LLAMAD_DAEMON_SERVER_H
#define LLAMAD_DAEMON_SERVER_H

#include "daemon/config.h"
#include "daemon/engine.h"

/* The listening socket, opened before the model loads so that a socket
 * that cannot be used is said at once (and clients that connect meanwhile
 * wait in its backlog, as with socket activation). */
struct listener {
	int fd;
	char *path;              /* ours to unlink at exit; NULL if activated */
};

/*
 * Open the listening socket: the one systemd passed, else cfg->socket or
 * the default path (path_default_socket), its folder made if missing. 0,
 * or -errno with *cause naming the problem and its fix (path too long,
 * folder missing or not writable, another llamad listening, a file that
 * is not a socket). listener_close undoes it (accepts one never opened).
 */
int listener_open(const struct config *cfg, struct listener *l, char **cause);
void listener_close(struct listener *l);

/*
 * Serve on l (taken over: closed and its socket file removed at the end),
 * start the engine thread, tell systemd READY=1, and serve until SIGTERM
 * or SIGINT; then end running requests with SHUTTING_DOWN, deliver what is
 * queued and return 0 with the engine stopped and joined. SIGHUP re-reads
 * config_path (if not NULL) for the run-time keys. Returns -errno with
 * *cause on a start-up failure.
 */
int server_run(struct config *cfg, const char *config_path, struct engine *eng,
	       struct listener *l, char **cause);

#endif

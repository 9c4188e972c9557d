/*
 * daemon/server.h — the event loop (see server.c).
 */
#ifndef LLAMAD_DAEMON_SERVER_H
#define LLAMAD_DAEMON_SERVER_H

#include "daemon/config.h"
#include "daemon/engine.h"

/*
 * Before the model loads: make sure the socket server_run will open can be
 * opened (its path fits, its folder exists or is made now and can be
 * written, no daemon answers on it, no other file is in the way), so that
 * a problem is said at once rather than after loading gigabytes. 0, or
 * -errno with *cause naming the problem and its fix. Under socket
 * activation: 0.
 */
int server_check_socket(const struct config *cfg, char **cause);

/*
 * Listen (on the socket systemd passed, else on cfg->socket / the default
 * path), start the engine thread, tell systemd READY=1, and serve until
 * SIGTERM or SIGINT; then end running requests with SHUTTING_DOWN, deliver
 * what is queued and return 0 with the engine stopped and joined. SIGHUP
 * re-reads config_path (if not NULL) for the run-time keys. Returns -errno
 * with *cause on a start-up failure.
 */
int server_run(struct config *cfg, const char *config_path, struct engine *eng, char **cause);

#endif

/*
 * daemon/engine.h — the engine thread: owns the model, the backend, the KV
 * pool and the session table, and runs every request against them.
 *
 * The event thread hands it decoded, validated requests (engine_submit) and
 * connection closes; the engine answers with framed Response bytes queued for
 * the event thread (engine_take_out), waking it through an eventfd. Between
 * forward steps it applies control requests; each step runs ONE batched
 * forward pass for every session that has work (prefill chunks within a
 * per-step token budget, one decode token per generating session), samples,
 * and queues token events. Sessions join and leave between steps.
 */
#ifndef LLAMAD_DAEMON_ENGINE_H
#define LLAMAD_DAEMON_ENGINE_H

#include <stdint.h>
#include <sys/types.h>

#include "daemon/config.h"
#include "daemon/reply.h"
#include "llamad.pb-c.h"
#include "model/model.h"

struct engine;

/* Build the engine over a loaded model (not owned) with the settings in cfg
 * (copied). Allocates the KV pool (cfg->kv_memory). NULL with *cause on
 * failure. */
struct engine *engine_new(struct model *m, const struct config *cfg, char **cause);
/* Start the thread; outputs are signalled by writing to notify_fd (an
 * eventfd). 0 or -errno. */
int engine_start(struct engine *e, int notify_fd);
/* Queue a request from connection conn, acting as uid, for the engine;
 * takes ownership of req (freed with llamad__request__free_unpacked).
 * own_only: the connection sees uid's sessions only, even when uid is
 * root (a gateway acting for a caller: its names, lists and saves never
 * reach another user's sessions); else root sees every user's. */
void engine_submit(struct engine *e, uint64_t conn, uid_t uid, int own_only, Llamad__Request *req);
/* Connection conn closed: cancel its requests, drop its ephemeral sessions. */
void engine_disconnect(struct engine *e, uint64_t conn);
/* Apply the run-time-changeable settings of cfg (SIGHUP). */
void engine_reload(struct engine *e, const struct config *cfg);
/* Ask the engine to end every request with SHUTTING_DOWN and stop. */
void engine_shutdown(struct engine *e);
/* Take all queued replies, oldest first (caller frees each with free()).
 * *finished is set to 1 when the engine thread has stopped after
 * engine_shutdown(): these are then its last replies. Read together, under
 * one lock: a "finished" read apart from the take could see the engine end
 * after the take and miss the replies it queued last (the shutdown errors). */
struct reply *engine_take_out(struct engine *e, int *finished);
/* fn(status) is called on the engine thread before the daemon exits on a
 * failed backend (the service manager's status line); before
 * engine_start. */
void engine_on_fatal(struct engine *e, void (*fn)(const char *status));
/* Open connections, for status (the event thread keeps it current). */
void engine_set_connections(struct engine *e, int open, uint64_t accepted);
/* Wait for the thread to end (after engine_shutdown); idempotent. */
void engine_join(struct engine *e);
/* Join the thread (after engine_shutdown) and free everything. Accepts NULL. */
void engine_free(struct engine *e);

/* Backend description ("cpu, 2 threads, avx512"). */
const char *engine_backend_name(const struct engine *e);

#endif

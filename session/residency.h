/*
 * session/residency.h — where each session's K/V lives, and moving it.
 *
 * A session is in one of three places (enum sess_loc): the KV pool (ready
 * to run), host memory after an eviction (SESS_RAM, bounded by ram_cache),
 * or only its state file (SESS_DISK: the table keeps a stub with the
 * header's counts). This module owns all three, the host-memory
 * accounting, saving, restoring and the counters:
 *  - saving: res_save (one), res_save_all (a uid's or every session),
 *    res_save_idle (changed sessions idle for a while); with a state
 *    directory, nothing unsaved ever leaves the pool;
 *  - eviction: res_reserve frees pool blocks by moving the least recently
 *    used idle sessions to host memory if they fit (saved ones already
 *    there move on to disk), else to disk; busy sessions never move;
 *  - restore: res_ensure brings a session back into the pool.
 * Functions return 0 / a count or -errno; human detail for a client goes
 * in *cause (never a path); what the daemon's log should hear goes to the
 * report callback (as session/store_dir.c's store_list does). No wire codes,
 * no logging here.
 */
#ifndef LLAMAD_SESSION_RESIDENCY_H
#define LLAMAD_SESSION_RESIDENCY_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "session/blocks.h"
#include "session/session.h"

/* Levels of reports (the values of daemon/log.h's LL_*). */
enum res_level { RES_ERROR = 0, RES_WARN = 1, RES_INFO = 2, RES_DEBUG = 3 };

typedef void (*res_report_fn)(void *ctx, int level, const char *msg);

struct res_counters {
	uint64_t evict_ram, evict_disk, restores, saves, save_errors;
	uint64_t set_aside;      /* refused state files moved to NAME.corrupt */
	uint64_t blocks_written; /* shared block files written */
	uint64_t blocks_removed; /* shared block files removed: no state file left
				  * refers to them */
	uint64_t blocks_refused; /* block files refused when read (set aside) */
};

struct residency {
	struct sess_table *st;
	struct kvpool *pool;
	char *dir;               /* state directory (owned); NULL: persistence off */
	int lock_fd;             /* dir's LLAMAD_LOCK_FILE, flocked (has_lock) */
	int has_lock;
	long lock_holder;        /* res_set_dir -EBUSY: the other daemon's pid (0: ?) */
	uint64_t fingerprint;    /* the model's */
	int max_tokens, vocab;   /* what a restored history must fit */
	size_t ram_cache;        /* bound of ram_used */
	int refuse_foreign;      /* files of another model: refuse (1) or keep
				  * their history and recompute the cache (0) */
	int disk_share;          /* percent of dir's file system one uid other than
				  * root may fill (disk_share_per_uid; 100: all) */
	size_t ram_used;         /* bytes of evicted K/V in host memory */
	unsigned scan;           /* current eviction pass */
	struct res_counters n;
	/* shared block files (blocks.h): how many state files refer to each;
	 * one whose count reaches 0 is removed. refs_lost: a count could not
	 * be kept (out of memory): nothing is removed until the next start */
	struct blk_refs blocks;
	int refs_lost;
	res_report_fn report;
	void *report_ctx;
};

/* What res_save_all did. */
struct res_saved {
	int n, errors;
	int first_rc;            /* the first error's -errno (-EDQUOT: a quota) */
	uint64_t bytes;          /* of the state files written */
	uint64_t block_bytes;    /* of the shared block files written */
	char *first_error;       /* malloc'd: "session 'ID': reason" (no path) */
};

/* Set up r over st and its pool (neither owned) for a model (fingerprint,
 * context max_tokens, vocabulary size); persistence starts off. */
void res_init(struct residency *r, struct sess_table *st, uint64_t fingerprint, int max_tokens,
	      int vocab, size_t ram_cache, res_report_fn report, void *report_ctx);
/* Free every session's K/V in host memory and the directory name (before
 * sess_table_done). Accepts an r never set up (zeroed). */
void res_done(struct residency *r);

#define LLAMAD_LOCK_FILE "llamad.lock"

/*
 * Choose the state directory: `setting` if given ("none": persistence
 * off), else $STATE_DIRECTORY (systemd: the service's /var/lib/llamad),
 * else $XDG_STATE_HOME/llamad or ~/.local/state/llamad, for root too (a
 * daemon started by hand never shares the service's folder); created (mode
 * 0700) if missing. A folder that cannot be created is kept (saves fail
 * until it can be written) and reported. The folder's LLAMAD_LOCK_FILE is
 * then flocked, exclusively, for as long as r holds it (res_done; the
 * kernel releases it when the process dies), with this pid written in
 * it: two daemons never share a state directory. 0, or -EBUSY when
 * another process holds the lock (its pid in r->lock_holder, 0 when it
 * cannot be read; nothing is set up), -ENOENT when there is no folder to
 * use (persistence off), -ENOMEM.
 */
int res_set_dir(struct residency *r, const char *setting);
/* The folder res_set_dir would choose for setting (malloc'd), or NULL for
 * none ("none", or no folder to use). Makes nothing. */
char *res_dir_of(const char *setting);
/* Table stubs (SESS_DISK) for the readable files of the state directory,
 * up to max_sessions sessions in the table; unusable files are reported by
 * name with the reason and moved aside (store_set_aside: NAME.corrupt,
 * counted in n.set_aside), so that a new session of the same name does not
 * overwrite them. Then the shared block files no listed state file refers
 * to are removed (left by a crash between a block's write and its state
 * file's, or by sessions whose files are gone). The number listed, or
 * -errno if the folder cannot be read. */
int res_list(struct residency *r, int max_sessions);

/* What uid's saved sessions take in the state directory (every user's for
 * uid 0): its state files and its block files. */
struct res_disk {
	uint64_t bytes;        /* state and block files */
	uint64_t block_bytes;  /* of which block files */
	uint32_t blocks;       /* block files */
};
void res_disk_use(struct residency *r, uid_t uid, struct res_disk *d);
/* uid's share of the disk: disk_share percent of the state directory's
 * file system; 0 for no limit (root, 100 %, persistence off). */
uint64_t res_disk_quota(const struct residency *r, uid_t uid);
/* -EDQUOT with *cause (malloc'd) when uid's saved sessions, less
 * `replaced` bytes (the file a save would replace), have reached its share
 * (new sessions and saves of uid are refused), else 0. */
int res_disk_full(struct residency *r, uid_t uid, uint64_t replaced, char **cause);

/* Save session s into *out (counted, or its error reported and the first
 * one kept without the path); a session in host memory or on disk is
 * saved already and counts with its file's size when `count_saved`. A
 * save of a uid over its share of the disk (res_disk_full) fails with
 * -EDQUOT: the session stays in memory, as after any failed save. */
void res_save_into(struct residency *r, struct session *s, int count_saved,
		   struct res_saved *out);
/* Save every session visible to uid (all for 0), only the changed ones if
 * only_dirty. */
void res_save_all(struct residency *r, uid_t uid, int only_dirty, struct res_saved *out);
/* Save the changed pool sessions idle since before `before_ms` (unix ms);
 * a failed save is reported once and retried after another delay. */
void res_save_idle(struct residency *r, int64_t before_ms);
/* Save the history (no K/V) of every changed pool session: for when the
 * pool can no longer be read (a failed device). */
void res_save_histories(struct residency *r);

/* Evict until n blocks are free, never moving `keep`. 0 or -ENOBUFS. */
int res_reserve(struct residency *r, int n, const struct session *keep);
/* Move one idle session out of the pool. 1 if one moved, 0 if none could. */
int res_evict_one(struct residency *r, const struct session *keep);
/* The same among uid's sessions (0: anyone's). */
int res_evict_one_of(struct residency *r, const struct session *keep, uid_t uid);
/*
 * Bring s back into the pool (a no-op if it is there). 0, or -errno with
 * *cause (malloc'd, for the client: names the session, never a path):
 * -ENOBUFS (the pool is full and nothing can be evicted), -ENOMEM,
 * -ENOTRECOVERABLE (the device failed), -ESTALE (saved under another model
 * and refuse_foreign), -EIO (the file cannot be read or does not fit this
 * model; a file that does not fit leaves s a stub again).
 */
int res_ensure(struct residency *r, struct session *s, char **cause);

/*
 * The history of s, wherever it lives: s itself when its history is in
 * memory (pool or host memory: *out = s), or, for a session only on disk,
 * its file's history read into *tmp (a zeroed session this fills; release
 * it with sess_clear_history(r->st, tmp)) without touching the pool:
 * *out = tmp. Token ids are not checked against the vocabulary (a foreign
 * file). 0, or -EIO with *cause as res_ensure's (the file cannot be read).
 */
int res_history(struct residency *r, struct session *s, struct session *tmp,
		struct session **out, char **cause);

/* Remove s from the table with all it holds (pool blocks, host K/V and its
 * accounting); with remove_file, also its state file, except one refused
 * when read (s->file_refused: corrupt), which is moved aside instead
 * (store_set_aside, reported and counted as res_list's). */
void res_drop(struct residency *r, struct session *s, int remove_file);

#endif

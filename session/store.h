/*
 * session/store.h — sessions on disk: one file per session in the state
 * directory, written atomically, read back whole or header-only.
 *
 * File layout (all integers little-endian, written field by field, no
 * struct padding):
 *   header, fixed size STORE_HEADER_BYTES:
 *     magic "LLAMADS1" (8), version u32, header_bytes u32,
 *     fingerprint u64, kv_dtype u32 (low byte the K/V element type: 0 f32,
 *     1 f16, 3 q8_0; next byte q8_0's channels per scale, 8, 16 or 32; a
 *     K/V type other than the pool's is converted when loaded), block_size
 *     u32, n_layers u32,
 *     kv_dim u32, n_tokens u32, n_cached u32, n_turns u32, uid u32, tmpl u32,
 *     policy u32, flags u32 (0; version 3: n_refs, the shared blocks),
 *     last_use_ms i64, prefilled u64,
 *     generated u64, body_bytes u64, id (129 bytes, NUL-padded),
 *     checksum u64 (XXH64 of the body), meta_sum u64 (XXH64 of the body
 *     before the kv part: a history can be read and checked without its
 *     K/V), header_sum u64 (XXH64 of every header byte before it), zero
 *     padding (must be zero)
 *   body:
 *     tokens      n_tokens x i32
 *     turns       n_turns x { start i32; role u8; end u8 (sess_turn.end);
 *                 text_len u32 (0xffffffff: no text); text bytes }
 *     system      len u32 (0xffffffff: none) + bytes
 *     next_system len u32 (same) + bytes
 *     refs        version 3: seed u64 (the session's chain seed), then
 *                 n_refs names u64: its first n_refs blocks, each in its
 *                 block file (session/blocks.h), shared by every state file
 *                 of the owner that begins with it
 *     kv          the other ceil(n_cached / block_size) - n_refs blocks, of
 *                 kt_kv_block_bytes each (in the file's element type), in
 *                 the session's block-table order (the KV layout of
 *                 kernels/backend.h)
 * Writes go to a temporary file in the same folder, are fsynced, renamed
 * over the final name, and the folder is fsynced: a reader sees the old
 * file or the new one, never a torn one. Files are created mode 0600. The
 * block files a version 3 file names are written (when missing) and
 * synced before it. Sessions without shared blocks are written as
 * version 2.
 * The module knows nothing of sockets or the model beyond a fingerprint.
 */
#ifndef LLAMAD_SESSION_STORE_H
#define LLAMAD_SESSION_STORE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "session/session.h"

#define STORE_MAGIC "LLAMADS1"
/* Version 2 added meta_sum and the turns' end byte; version 1 files (no
 * meta_sum: header_sum right after checksum; turns without end) are read
 * too, and written as version 2 at their next save. Version 3 adds shared
 * blocks (refs). */
#define STORE_VERSION 3

#define STORE_HEADER_BYTES 256  /* the fields above, zero-padded */

/* What a directory listing yields for each readable session file. */
struct store_entry {
	char id[SESSION_ID_MAX + 1];
	uid_t uid;
	uint64_t fingerprint;
	uint32_t n_tokens, n_cached, n_turns;
	uint32_t tmpl, policy;
	int64_t last_use_ms;
	uint64_t prefilled, generated;
	uint64_t file_bytes;
	uint32_t n_refs;            /* version 3: blocks in block files */
	char *path;                 /* malloc'd */
};

/* The file name of session (uid, id) inside dir, "<dir>/<uid>-<id>.session";
 * malloc'd. NULL (errno EINVAL) if !sess_id_valid(id), or on ENOMEM. */
char *store_path(const char *dir, uid_t uid, const char *id);

/*
 * Write s (history, turns, and the K/V of its first n_cached positions from
 * pool) to its file in dir, atomically. fingerprint identifies the model.
 * Returns 0 or -errno (e.g. -ENOSPC, -EROFS, -EACCES; -EINVAL or -E2BIG for
 * a session that cannot be written) with *cause set to the malloc'd reason
 * (one line, no path: the caller knows the file, store_path); on error the previous file, if any, is untouched and no
 * temporary file is left behind (except when only the final fsync of the
 * folder fails: the new file is then in place, and the error is returned).
 */
int store_save(const char *dir, const struct session *s, const struct kvpool *pool,
	       uint64_t fingerprint, char **cause);
/* The names of a session's first n full blocks (its chain, session.h) and
 * the chain's seed: what store_save_shared keeps as block files. */
struct store_chain {
	uint64_t seed;
	const uint64_t *names;
	int n;
};
/* store_save with the first ch->n blocks (full, cached) in block files
 * (version 3): those not in the blocks folder yet are written first
 * (*written counts them). Same errors. */
int store_save_shared(const char *dir, const struct session *s, const struct kvpool *pool,
		      uint64_t fingerprint, const struct store_chain *ch, int *written,
		      char **cause);
/* The same without any K/V (n_cached 0 in the file): restored, the session
 * recomputes its cache from the tokens. For when the pool cannot be read
 * (a failed device). */
int store_save_history(const char *dir, const struct session *s, const struct kvpool *pool,
		       uint64_t fingerprint, char **cause);

/*
 * Read the session file at path into s (an empty session from
 * sess_create(); its id and uid must match the file's). If the file's
 * fingerprint equals `fingerprint` and the KV shape matches the pool's, the
 * K/V blocks are loaded into newly allocated pool blocks (n_cached kept);
 * otherwise, if allow_foreign, only the history is loaded (n_cached = 0:
 * the cache is rebuilt from the tokens on next use). The whole body is
 * checksummed before anything is stored into s. Token ids are only checked
 * to be >= 0: the caller checks them against its vocabulary. Returns 0, or
 * -errno with *cause the reason (no path, as for store_save): -EBADMSG (corrupt,
 * checksum, truncated), -EPROTO (wrong magic or version, unknown flags or KV
 * type), -ESTALE (foreign model, or another KV shape, and !allow_foreign),
 * -ENOSPC (pool full), -EINVAL (s not empty, or the file holds another
 * (uid, id)), -ENOMEM, -EIO. On error s is left as it was (empty) and no
 * pool block is kept.
 */
int store_load(const char *path, struct session *s, struct kvpool *pool, uint64_t fingerprint,
	       int allow_foreign, char **cause);

/* What store_load_ex saw besides its result. */
struct store_note {
	/* a block file refused (or missing): the session was loaded without its
	 * K/V (n_cached 0: recomputed from its tokens); bad_why says why */
	int bad_block;
	uint32_t bad_uid;
	uint64_t bad_name;
	char bad_why[256];
	/* version 3: the shared blocks' names (malloc'd, n_refs of them; the
	 * caller frees), as the file has them, whatever was loaded */
	uint64_t *refs;
	int n_refs;
};
/* store_load that survives a bad block file (see struct store_note) and
 * hands back the file's shared block names. Whole blocks the pool already
 * holds under the same name, owner, parent and tokens are shared, not
 * read. note is zeroed first. */
int store_load_ex(const char *path, struct session *s, struct kvpool *pool, uint64_t fingerprint,
		  int allow_foreign, struct store_note *note, char **cause);
/* The shared block names of the state file at path (its history checked by
 * meta_sum; nothing else kept): *refs malloc'd (NULL for none), *n. 0 or
 * store_load_history's errors. */
int store_read_refs(const char *path, uid_t uid, const char *id, uint64_t **refs, int *n,
		    char **cause);

/*
 * Read only the history of the session file at path (tokens, turns,
 * system prompts; no K/V, whatever model wrote it) into s, as store_load
 * with n_cached 0, for showing a session without restoring it. A version 2
 * file's history is checked by its own checksum and its K/V is not read;
 * a version 1 file is read whole for its checksum. Same errors as
 * store_load but -ESTALE and -ENOSPC.
 */
int store_load_history(const char *path, struct session *s, char **cause);

/*
 * List dir's session files, reading headers only. *entries (malloc'd array,
 * free with store_entries_free) gets the valid ones; for each file that
 * cannot be used (bad header, truncated, name not matching its (uid, id),
 * not a regular file), report(ctx, path, reason) is called (may be NULL):
 * the file stays (store_set_aside moves it out of the way).
 * Temporary files of interrupted writes (".tmp-*") are removed, whatever
 * their age, and reported: call it when no save into dir is running (at
 * startup). Entries are sorted by path. Other files are skipped. Returns the
 * count or -errno if dir cannot be read.
 */
int store_list(const char *dir, struct store_entry **entries,
	       void (*report)(void *ctx, const char *path, const char *reason), void *ctx);
/* 1 if the file name (no folder) is one of store_list's temporary files:
 * its reports for them are removals, not refusals. */
int store_is_temp_name(const char *name);
void store_entries_free(struct store_entry *e, int n);

/* Remove the file of (uid, id) if present (absent is 0); the folder is
 * synced, best effort. 0 or -errno (-EINVAL for an invalid id). */
int store_remove(const char *dir, uid_t uid, const char *id);

/* Files set aside: PATH.corrupt, else PATH.corrupt.1 ... .STORE_ASIDE_MAX.
 * store_list never reads them (they do not end in ".session"). */
#define STORE_ASIDE_SUFFIX ".corrupt"
#define STORE_ASIDE_MAX 999
/*
 * Move the file at path (one store_list or store_load refused) out of the
 * way of a new session of the same name, which would overwrite it: renamed
 * to the first free name of PATH.corrupt, PATH.corrupt.1, ... (never over
 * an existing file), the folder synced, best effort. 0 with *aside (may be
 * NULL) the new path, malloc'd; or -errno: -EEXIST (every name taken),
 * -ENOMEM, or the rename's (the file then stays where it was).
 */
int store_set_aside(const char *path, char **aside);

/* Model fingerprint: XXH64 over the hyper-parameters and every weight byte
 * (see model/fingerprint.c). Declared here for the callers that compare. */

#endif

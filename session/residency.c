/*
 * session/residency.c — see residency.h. Everything here runs on the
 * engine thread, between forward steps.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "session/residency.h"
#include "session/store.h"
#include "util/cause.h"
#include "util/clock.h"

static void say(struct residency *r, int level, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void say(struct residency *r, int level, const char *fmt, ...)
{
	char *msg = NULL;
	va_list ap;
	va_start(ap, fmt);
	if (r->report && vasprintf(&msg, fmt, ap) >= 0)
		r->report(r->report_ctx, level, msg);
	va_end(ap);
	free(msg);
}

static size_t block_bytes(const struct residency *r)
{
	return kt_kv_block_bytes(&r->pool->kv);
}

void res_init(struct residency *r, struct sess_table *st, uint64_t fingerprint, int max_tokens,
	      int vocab, size_t ram_cache, res_report_fn report, void *report_ctx)
{
	memset(r, 0, sizeof(*r));
	r->st = st;
	r->pool = st->pool;
	r->fingerprint = fingerprint;
	r->max_tokens = max_tokens;
	r->vocab = vocab;
	r->ram_cache = ram_cache;
	r->report = report;
	r->report_ctx = report_ctx;
}

/* Free s's K/V in host memory with its accounting: the one place that
 * does. */
static void ram_release(struct residency *r, struct session *s)
{
	if (!s->ram_kv)
		return;
	r->ram_used -= s->ram_bytes;
	free(s->ram_kv);
	s->ram_kv = NULL;
	s->ram_bytes = 0;
	s->ram_blocks = 0;
}

static void release_one(struct session *s, void *ctx)
{
	ram_release(ctx, s);
}

void res_done(struct residency *r)
{
	if (r->st)
		sess_foreach(r->st, 0, release_one, r);
	free(r->dir);
	r->dir = NULL;
	blk_refs_free(&r->blocks);
	if (r->has_lock)
		close(r->lock_fd);   /* the flock goes with it */
	r->has_lock = 0;
}

/* ---- the state directory ------------------------------------------------ */

/* mkdir -p with mode 0700 for what it creates. */
static int mkdirs(const char *path)
{
	char *p = strdup(path);
	if (!p)
		return -ENOMEM;
	for (char *q = p + 1; ; q++) {
		if (*q == '/' || !*q) {
			char c = *q;
			*q = 0;
			if (mkdir(p, 0700) != 0 && errno != EEXIST) {
				int e = errno;
				free(p);
				return -e;
			}
			*q = c;
			if (!c)
				break;
		}
	}
	free(p);
	return 0;
}

static const char *env(const char *name)
{
	const char *v = getenv(name);
	return v && *v ? v : NULL;
}

char *res_dir_of(const char *setting)
{
	char *d = NULL;
	if (setting && !strcmp(setting, "none"))
		return NULL;
	if (setting) {
		d = strdup(setting);
	} else if (env("STATE_DIRECTORY")) {
		d = strndup(env("STATE_DIRECTORY"), strcspn(env("STATE_DIRECTORY"), ":"));
	} else if (env("XDG_STATE_HOME")) {
		cause_set(&d, "%s/llamad", env("XDG_STATE_HOME"));
	} else if (getenv("HOME")) {
		cause_set(&d, "%s/.local/state/llamad", getenv("HOME"));
	}
	return d;
}

/* Take dir's lock file (res_set_dir): 0 (held, or none could be made:
 * reported, the folder is used without it), or -EBUSY with the holder's
 * pid in r->lock_holder. */
static int lock_dir(struct residency *r, const char *dir)
{
	char *path = NULL;
	cause_set(&path, "%s/" LLAMAD_LOCK_FILE, dir);
	if (!path)
		return -ENOMEM;
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0) {
		say(r, RES_WARN, "state directory %s: cannot make its lock file (%s); another llamad "
		    "could use the folder at the same time", dir, strerror(errno));
		free(path);
		return 0;
	}
	free(path);
	if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
		int err = errno;
		char buf[32] = "";
		ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
		buf[n > 0 ? n : 0] = 0;
		close(fd);
		if (err != EWOULDBLOCK) {
			say(r, RES_WARN, "state directory %s: cannot lock it (%s)", dir, strerror(err));
			return 0;
		}
		r->lock_holder = strtol(buf, NULL, 10);
		return -EBUSY;
	}
	char pid[32];
	int len = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
	if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)len, 0) != len)
		say(r, RES_WARN, "state directory %s: cannot write the pid into its lock file", dir);
	r->lock_fd = fd;
	r->has_lock = 1;
	return 0;
}

int res_set_dir(struct residency *r, const char *setting)
{
	if (setting && !strcmp(setting, "none"))
		return 0;
	char *d = res_dir_of(setting);
	if (!d) {
		say(r, RES_WARN, "no state directory: sessions will not be saved");
		return -ENOENT;
	}
	int rc = mkdirs(d);
	if (rc) {
		say(r, RES_ERROR, "state directory %s: %s; sessions cannot be saved until it "
		    "can be written", d, strerror(-rc));
	} else if ((rc = lock_dir(r, d)) != 0) {
		free(d);
		return rc;
	} else {
		struct stat st;
		say(r, RES_INFO, "state directory %s", d);
		if (stat(d, &st) == 0 && (st.st_mode & 0077))
			say(r, RES_WARN, "state directory %s is mode %04o: other users can list it, and "
			    "the file names say whose sessions are there and their names; "
			    "`chmod 700 %s`", d, (unsigned)(st.st_mode & 07777), d);
	}
	free(r->dir);
	r->dir = d;
	return 0;
}

/* store_list's reports: a temporary file removed, or a file it refused,
 * which is moved aside (PATH.corrupt): a new session of the same name
 * would otherwise overwrite it at its first save. */
static void report_bad_file(void *ctx, const char *path, const char *reason)
{
	struct residency *r = ctx;
	const char *slash = strrchr(path, '/');
	if (store_is_temp_name(slash ? slash + 1 : path)) {
		say(r, RES_WARN, "state file %s: %s", path, reason);
		return;
	}
	char *aside = NULL;
	int rc = store_set_aside(path, &aside);
	if (rc == 0) {
		r->n.set_aside++;
		say(r, RES_WARN, "state file %s: %s; moved to %s, out of the way of a new session "
		    "of that name", path, reason, aside);
	} else {
		say(r, RES_ERROR, "state file %s: %s; cannot move it aside (%s): a new session of "
		    "that name will overwrite it", path, reason, strerror(-rc));
	}
	free(aside);
}

/* blk_collect's reports. */
static void report_block(void *ctx, const char *name, const char *reason)
{
	struct residency *r = ctx;
	say(r, strstr(reason, "cannot") ? RES_WARN : RES_DEBUG, "block file %s/" BLK_DIR "/%s: %s",
	    r->dir, name, reason);
}

/* Count the shared blocks s's state file (at path) refers to. A file whose
 * names cannot be read is refused when it is restored; its blocks may go. */
static void count_file_refs(struct residency *r, struct session *s, const char *path)
{
	char *why = NULL;
	uint64_t *refs = NULL;
	int n = 0;
	if (store_read_refs(path, s->uid, s->id, &refs, &n, &why) != 0) {
		say(r, RES_WARN, "state file %s: %s", path, why ? why : "cannot be read");
		free(why);
		return;
	}
	for (int i = 0; i < n; i++)
		if (blk_refs_inc(&r->blocks, (uint32_t)s->uid, refs[i]) != 0)
			r->refs_lost = 1;
	s->file_refs = refs;
	s->n_file_refs = n;
}

/* s's state file now refers to refs (n; taken: malloc'd or NULL): count
 * them, and remove the block files of the names it no longer refers to that
 * no other state file does. */
static void set_file_refs(struct residency *r, struct session *s, uint64_t *refs, int n)
{
	uint64_t file = blk_file_bytes(&r->pool->kv);
	for (int i = 0; i < n; i++) {
		if (blk_refs_inc(&r->blocks, (uint32_t)s->uid, refs[i]) != 0) {
			r->refs_lost = 1;
			continue;
		}
		struct blk_ref *e = blk_refs_get(&r->blocks, (uint32_t)s->uid, refs[i]);
		if (e && !e->bytes)
			blk_refs_set_bytes(&r->blocks, e, file);
	}
	for (int i = 0; i < s->n_file_refs; i++) {
		int left = blk_refs_dec(&r->blocks, (uint32_t)s->uid, s->file_refs[i]);
		if (left == 0 && !r->refs_lost &&
		    blk_remove(r->dir, (uint32_t)s->uid, s->file_refs[i]) == 0)
			r->n.blocks_removed++;
	}
	free(s->file_refs);
	s->file_refs = refs;
	s->n_file_refs = n;
}

int res_list(struct residency *r, int max_sessions)
{
	struct store_entry *ents = NULL;
	int n = store_list(r->dir, &ents, report_bad_file, r);
	if (n < 0) {
		say(r, RES_ERROR, "cannot read the state directory %s: %s", r->dir, strerror(-n));
		return n;
	}
	int foreign = 0, listed = 0;
	for (int i = 0; i < n; i++) {
		if (sess_get(r->st, ents[i].uid, ents[i].id))
			continue;
		if (r->st->count >= max_sessions) {
			say(r, RES_WARN, "state file %s: not listed: max_sessions (%d) reached",
			    ents[i].path, max_sessions);
			continue;
		}
		struct session *s = sess_create(r->st, ents[i].uid, ents[i].id);
		if (!s)
			break;
		s->loc = SESS_DISK;
		s->disk_tokens = ents[i].n_tokens;
		s->disk_turns = ents[i].n_turns;
		s->tmpl = (int)ents[i].tmpl;
		s->policy = (int)ents[i].policy;
		s->prefilled = ents[i].prefilled;
		s->generated = ents[i].generated;
		s->last_use_ms = ents[i].last_use_ms;
		s->file_bytes = ents[i].file_bytes;
		s->foreign = ents[i].fingerprint != r->fingerprint;
		foreign += s->foreign;
		listed++;
		if (ents[i].n_refs)
			count_file_refs(r, s, ents[i].path);
	}
	if (listed > 0)
		say(r, RES_INFO, "%d saved session%s in %s%s", listed, listed == 1 ? "" : "s",
		    r->dir, foreign ? " (some saved under another model)" : "");
	store_entries_free(ents, n);
	int gone = r->refs_lost ? 0 : blk_collect(r->dir, &r->blocks, report_block, r);
	if (gone > 0) {
		r->n.blocks_removed += (uint64_t)gone;
		say(r, RES_INFO, "removed %d shared block file%s no saved session refers to", gone,
		    gone == 1 ? "" : "s");
	} else if (gone < 0 && gone != -ENOENT) {
		say(r, RES_WARN, "cannot read the blocks folder of %s: %s", r->dir, strerror(-gone));
	}
	if (r->blocks.n)
		say(r, RES_INFO, "%zu shared block file%s, %llu bytes", r->blocks.n,
		    r->blocks.n == 1 ? "" : "s", (unsigned long long)r->blocks.bytes);
	return listed;
}

/* ---- saving ----------------------------------------------------------------- */

/*
 * After a failed save, the automatic saves of that session (idle, before
 * an eviction) wait SAVE_RETRY_MIN_S, then twice as long after each
 * failure, up to SAVE_RETRY_MAX_S; one that works ends the wait. So a full
 * or broken disk is tried a few times a minute per session, not by every
 * request that needs a block (before: 64,182 failed writes in 10 s of such
 * requests, test_persist save_backoff), and each failure is one log line.
 * A Save request or the shutdown always tries.
 * Per session: one session's file may fail (too large for what is left)
 * while a smaller one's is written.
 */
#define SAVE_RETRY_MIN_S 0.1
#define SAVE_RETRY_MAX_S 30.0

/* 1 if an automatic save of s may run now. */
static int save_due(const struct session *s)
{
	return !s->save_fails || clock_mono_s() >= s->save_retry_s;
}

/* s's save failed with rc: counted, and its automatic saves wait longer.
 * Returns rc. */
static int save_failed(struct residency *r, struct session *s, int rc)
{
	r->n.save_errors++;
	s->save_wait_s = !s->save_fails ? SAVE_RETRY_MIN_S
		: s->save_wait_s * 2 < SAVE_RETRY_MAX_S ? s->save_wait_s * 2 : SAVE_RETRY_MAX_S;
	s->save_fails++;
	s->save_retry_s = clock_mono_s() + s->save_wait_s;
	return rc;
}

static void add_file(struct session *s, void *ctx)
{
	*(uint64_t *)ctx += s->file_bytes;
}

void res_disk_use(struct residency *r, uid_t uid, struct res_disk *d)
{
	*d = (struct res_disk){ 0 };
	if (uid == 0) {
		sess_foreach(r->st, 0, add_file, &d->bytes);
		d->blocks = (uint32_t)r->blocks.n;
		d->block_bytes = r->blocks.bytes;
	} else {
		sess_foreach_owned(r->st, uid, add_file, &d->bytes);
		for (size_t i = 0; i < r->blocks.cap; i++)
			if (r->blocks.v[i].count && r->blocks.v[i].uid == (uint32_t)uid) {
				d->blocks++;
				d->block_bytes += r->blocks.v[i].bytes;
			}
	}
	d->bytes += d->block_bytes;
}

uint64_t res_disk_quota(const struct residency *r, uid_t uid)
{
	struct statvfs fs;
	if (!r->dir || uid == 0 || r->disk_share <= 0 || r->disk_share >= 100 ||
	    statvfs(r->dir, &fs) != 0)
		return 0;
	return (uint64_t)((double)fs.f_blocks * fs.f_frsize * r->disk_share / 100);
}

int res_disk_full(struct residency *r, uid_t uid, uint64_t replaced, char **cause)
{
	uint64_t quota = res_disk_quota(r, uid);
	if (!quota)
		return 0;  /* no limit: the files are not walked */
	struct res_disk d;
	res_disk_use(r, uid, &d);
	if (d.bytes - replaced < quota)
		return 0;
	cause_set(cause, "uid %u's saved sessions take %llu MiB, its share of the disk "
		  "(disk_share_per_uid %d%%: %llu MiB); drop some", (unsigned)uid,
		  (unsigned long long)(d.bytes >> 20), r->disk_share,
		  (unsigned long long)(quota >> 20));
	return -EDQUOT;
}

/* Write pool session s's state file. 0, 1 if there is nothing to write
 * (persistence off, ephemeral, not in the pool), or -errno with *cause
 * (malloc'd: the reason, without the file's path); a failure starts or
 * lengthens s's wait. */
static int res_save(struct residency *r, struct session *s, uint64_t *blk_bytes, char **cause)
{
	if (!r->dir || s->ephemeral || s->loc != SESS_POOL)
		return 1;
	/* its own file is replaced: a session may be saved again while the
	 * others' files leave it room */
	int rc = res_disk_full(r, s->uid, s->file_bytes, cause);
	if (rc)
		return save_failed(r, s, rc);
	/* with sharing on, its full cached blocks go to block files, written
	 * once for every state file of the owner that begins with them */
	int n_refs = r->st->share && !s->inexact ? s->n_cached / r->pool->kv.block_size : 0;
	if (n_refs > s->kv.n_blocks || (n_refs && !sess_block_name(r->st, s, n_refs - 1)))
		n_refs = 0;  /* out of memory for the names: all inline */
	uint64_t *refs = n_refs ? malloc((size_t)n_refs * sizeof(uint64_t)) : NULL;
	if (n_refs && !refs)
		n_refs = 0;
	if (n_refs)
		memcpy(refs, s->chain, (size_t)n_refs * sizeof(uint64_t));
	struct store_chain ch = { .seed = s->chain_seed, .names = refs, .n = n_refs };
	int written = 0;
	rc = store_save_shared(r->dir, s, r->pool, r->fingerprint, &ch, &written, cause);
	r->n.blocks_written += (uint64_t)written;
	if (blk_bytes)
		*blk_bytes += (uint64_t)written * blk_file_bytes(&r->pool->kv);
	if (rc) {
		free(refs);  /* new block files nothing refers to: the next start's */
		return save_failed(r, s, rc);
	}
	char *p = store_path(r->dir, s->uid, s->id);
	struct stat st;
	s->file_bytes = p && stat(p, &st) == 0 ? (uint64_t)st.st_size : 0;
	free(p);
	set_file_refs(r, s, refs, n_refs);
	s->dirty = 0;
	s->foreign = 0;
	if (s->save_fails)
		say(r, RES_INFO, "session %s saved, after %u failed attempt%s", s->id,
		    (unsigned)s->save_fails, s->save_fails == 1 ? "" : "s");
	s->save_fails = 0;
	s->save_wait_s = s->save_retry_s = 0;
	r->n.saves++;
	return 0;
}

/* Report "WHAT SESSION-ID[AFTER]: state file PATH: WHY" (why NULL:
 * strerror(-rc)). */
static void say_file(struct residency *r, int level, const char *what, const struct session *s,
		     const char *after, const char *why, int rc)
{
	char *path = store_path(r->dir, s->uid, s->id);
	say(r, level, "%s %s%s: state file %s: %s", what, s->id, after, path ? path : "?",
	    why ? why : strerror(-rc));
	free(path);
}

/* Report s's failed save (res_save's -errno rc, its cause), with when the
 * automatic saves try again. */
static void say_save_failed(struct residency *r, const struct session *s, const char *after,
			    const char *cause, int rc)
{
	char why[512];
	snprintf(why, sizeof(why), "%s (failure %u; automatic saves wait %.1f s)",
		 cause ? cause : strerror(-rc), (unsigned)s->save_fails, s->save_wait_s);
	say_file(r, RES_ERROR, "cannot save session", s, after, why, rc);
}

void res_save_into(struct residency *r, struct session *s, int count_saved, struct res_saved *out)
{
	char *cause = NULL;
	int rc = res_save(r, s, &out->block_bytes, &cause);
	if (rc == 0 || (rc == 1 && count_saved)) {
		out->n++;
		out->bytes += s->file_bytes;
	} else if (rc < 0) {
		if (!out->errors)
			out->first_rc = rc;
		out->errors++;
		say_save_failed(r, s, "", cause, rc);
		if (!out->first_error)
			cause_set(&out->first_error, "session '%s': %s", s->id,
				  cause ? cause : strerror(-rc));
	}
	free(cause);
}

struct save_all_ctx {
	struct residency *r;
	int only_dirty;
	struct res_saved *out;
};

static void save_one_of_all(struct session *s, void *ctx)
{
	struct save_all_ctx *c = ctx;
	if (!c->only_dirty || s->dirty)
		res_save_into(c->r, s, 0, c->out);
}

void res_save_all(struct residency *r, uid_t uid, int only_dirty, struct res_saved *out)
{
	struct save_all_ctx c = { r, only_dirty, out };
	sess_foreach(r->st, uid, save_one_of_all, &c);
}

struct idle_ctx {
	struct residency *r;
	int64_t before;
};

static void save_if_idle(struct session *s, void *ctx)
{
	struct idle_ctx *c = ctx;
	if (!s->dirty || s->busy || s->ephemeral || s->loc != SESS_POOL ||
	    s->last_use_ms > c->before || !save_due(s))
		return;
	char *cause = NULL;
	int rc = res_save(c->r, s, NULL, &cause);
	if (rc < 0)
		say_save_failed(c->r, s, "", cause, rc);
	free(cause);
}

void res_save_idle(struct residency *r, int64_t before_ms)
{
	struct idle_ctx c = { r, before_ms };
	if (r->dir)
		sess_foreach(r->st, 0, save_if_idle, &c);
}

static void save_history(struct session *s, void *ctx)
{
	struct residency *r = ctx;
	/* changed since saved: dirty, or in the middle of a turn */
	if (s->ephemeral || s->loc != SESS_POOL || !(s->dirty || s->busy))
		return;
	char *cause = NULL;
	int rc = store_save_history(r->dir, s, r->pool, r->fingerprint, &cause);
	if (rc)
		say_file(r, RES_ERROR, "cannot save session", s, "", cause, rc);
	free(cause);
}

void res_save_histories(struct residency *r)
{
	if (r->dir)
		sess_foreach(r->st, 0, save_history, r);
}

/* ---- eviction ------------------------------------------------------------ */

/* Turn a session into a disk stub: free its history, blocks and host K/V. */
static void to_stub(struct residency *r, struct session *s)
{
	s->disk_tokens = (uint32_t)s->n_tokens;
	s->disk_turns = (uint32_t)s->n_turns;
	sess_clear_history(r->st, s);
	ram_release(r, s);
	s->loc = SESS_DISK;
}

struct lru_ctx {
	const struct session *keep;
	int loc;
	unsigned scan;
	struct session *best;
};

static void lru_pick(struct session *s, void *ctx)
{
	struct lru_ctx *l = ctx;
	if (s == l->keep || s->busy || s->loc != l->loc || s->ephemeral || s->evict_scan == l->scan)
		return;
	if (l->loc == SESS_POOL && s->kv.n_blocks == 0)
		return;
	if (l->loc == SESS_RAM && s->dirty)
		return;  /* only saved sessions may leave host memory for disk */
	if (!l->best || s->last_use_ms < l->best->last_use_ms)
		l->best = s;
}

/* Least recently used idle session in loc not yet tried in this scan. */
static struct session *lru(struct residency *r, const struct session *keep, int loc, uid_t uid)
{
	struct lru_ctx l = { keep, loc, r->scan, NULL };
	sess_foreach(r->st, uid, lru_pick, &l);
	return l.best;
}

/* Move v's blocks to host memory. 1 on success. */
static int to_ram(struct residency *r, struct session *v)
{
	size_t bytes = (size_t)v->kv.n_blocks * block_bytes(r);
	if (r->ram_used + bytes > r->ram_cache || !(v->ram_kv = malloc(bytes ? bytes : 1)))
		return 0;
	if (kvseq_to_host(r->pool, &v->kv, v->ram_kv) != 0) {
		free(v->ram_kv);
		v->ram_kv = NULL;
		return 0;
	}
	v->ram_bytes = bytes;
	v->ram_blocks = v->kv.n_blocks;
	r->ram_used += bytes;
	kvseq_release(r->pool, &v->kv);
	v->loc = SESS_RAM;
	r->n.evict_ram++;
	say(r, RES_DEBUG, "session %s moved to host memory (%zu bytes)", v->id, bytes);
	return 1;
}

int res_evict_one(struct residency *r, const struct session *keep)
{
	return res_evict_one_of(r, keep, 0);
}

int res_evict_one_of(struct residency *r, const struct session *keep, uid_t uid)
{
	r->scan++;
	struct session *v;
	while ((v = lru(r, keep, SESS_POOL, uid))) {
		v->evict_scan = r->scan;  /* try each candidate once */
		if (r->dir && (v->dirty || !v->file_bytes)) {
			if (!save_due(v))
				continue;  /* its saves fail: it stays in the pool */
			char *cause = NULL;
			int rc = res_save(r, v, NULL, &cause);
			if (rc < 0) {
				say_save_failed(r, v, " to evict it", cause, rc);
				free(cause);
				continue;  /* keep it in the pool; try another */
			}
		}
		size_t bytes = (size_t)v->kv.n_blocks * block_bytes(r);
		if (bytes <= r->ram_cache) {
			while (r->ram_used + bytes > r->ram_cache && r->dir) {
				struct session *o = lru(r, keep, SESS_RAM, 0);
				if (!o)
					break;
				to_stub(r, o);
				r->n.evict_disk++;
			}
			if (to_ram(r, v))
				return 1;
		}
		if (r->dir) {
			to_stub(r, v);
			r->n.evict_disk++;
			say(r, RES_DEBUG, "session %s moved to the state directory", v->id);
			return 1;
		}
	}
	return 0;
}

int res_reserve(struct residency *r, int n, const struct session *keep)
{
	while (kvpool_n_free(r->pool) < n)
		if (!res_evict_one(r, keep))
			return -ENOBUFS;
	return 0;
}

/* ---- restore ---------------------------------------------------------------- */

static int from_ram(struct residency *r, struct session *s, char **cause)
{
	if (res_reserve(r, s->ram_blocks, s) != 0) {
		cause_set(cause, "the KV cache is full and nothing can be evicted");
		return -ENOBUFS;
	}
	struct kvseq kv = { 0 };
	int rc = kvseq_from_host(r->pool, &kv, s->ram_kv, s->ram_blocks);
	if (rc) {
		cause_set(cause, rc == -EIO ? "the device failed while restoring the session"
					    : "out of memory");
		return rc == -EIO ? -ENOTRECOVERABLE : -ENOMEM;
	}
	kvseq_release(r->pool, &s->kv);
	s->kv = kv;
	ram_release(r, s);
	s->loc = SESS_POOL;
	r->n.restores++;
	return 0;
}

/* A block file s's state file (path) refers to was refused (or is
 * missing): s was restored without its K/V, which is recomputed from its
 * tokens. A refused file is moved aside, so that the next save of a
 * session with that block writes it again. */
static void refuse_block(struct residency *r, struct session *s, const char *path,
			 const struct store_note *note)
{
	char fname[64], *bpath = NULL, *aside = NULL;
	blk_file_name(fname, sizeof(fname), note->bad_uid, note->bad_name);
	r->n.blocks_refused++;
	int moved = asprintf(&bpath, "%s/" BLK_DIR "/%s", r->dir, fname) >= 0 &&
		    store_set_aside(bpath, &aside) == 0;
	say(r, RES_WARN, "session %s: state file %s: %s; its cache is recomputed from its "
	    "tokens%s%s", s->id, path ? path : "?", note->bad_why,
	    moved ? "; the block file was moved to " : "", moved ? aside : "");
	free(aside);
	free(bpath);
}

static int from_disk(struct residency *r, struct session *s, char **cause)
{
	char *path = store_path(r->dir, s->uid, s->id);
	char *why = NULL;
	int allow_foreign = !r->refuse_foreign;
	struct store_note note = { 0 };
	int rc = path ? store_load_ex(path, s, r->pool, r->fingerprint, allow_foreign, &note, &why)
		      : -ENOMEM;
	if (rc == -ENOSPC) {
		free(why);
		why = NULL;
		int bs = r->pool->kv.block_size;
		int need = (int)((s->disk_tokens + (uint32_t)bs - 1) / (uint32_t)bs);
		if (res_reserve(r, need, s) == 0)
			rc = store_load_ex(path, s, r->pool, r->fingerprint, allow_foreign, &note,
					   &why);
	}
	free(note.refs);  /* counted when listed or saved */
	if (note.bad_block)
		refuse_block(r, s, path, &note);
	free(path);
	s->file_refused = rc == -EBADMSG || rc == -EPROTO;   /* a file replaced since: 0 */
	if (rc) {
		say_file(r, RES_WARN, "cannot restore session", s, "", why, rc);
		if (rc == -ESTALE)
			cause_set(cause, "session '%s' was saved under a different model "
				  "(foreign_cache = refuse)", s->id);
		else if (rc == -ENOSPC)
			cause_set(cause, "cannot restore session '%s': the KV cache is full", s->id);
		else
			cause_set(cause, "cannot restore session '%s': %s", s->id,
				  why ? why : strerror(-rc));
		free(why);
		return rc == -ESTALE ? -ESTALE : rc == -ENOSPC ? -ENOBUFS : -EIO;
	}
	/* checksums prove the file intact, not that this model can run it (a
	 * foreign file may come from a bigger vocabulary or context): a token
	 * the forward pass refuses would fail every job batched with it */
	const char *unfit = NULL;
	if (s->n_tokens > r->max_tokens)
		unfit = "its history is longer than this model's context";
	for (int i = 0; i < s->n_tokens && !unfit; i++)
		if (s->tokens[i] < 0 || s->tokens[i] >= r->vocab)
			unfit = "its history holds token ids outside this model's vocabulary";
	if (unfit) {
		say(r, RES_WARN, "cannot restore session %s: %s", s->id, unfit);
		cause_set(cause, "cannot restore session '%s': %s", s->id, unfit);
		to_stub(r, s);
		return -EIO;
	}
	s->loc = SESS_POOL;
	/* a cache rebuilt from the tokens (another model or KV shape) is worth
	 * saving again once it exists */
	s->dirty = s->foreign || (s->n_cached == 0 && s->n_tokens > 0);
	if (s->foreign)
		say(r, RES_INFO, "session %s was saved under another model: its cache is rebuilt "
		    "from its %d tokens", s->id, s->n_tokens);
	r->n.restores++;
	return 0;
}

int res_ensure(struct residency *r, struct session *s, char **cause)
{
	*cause = NULL;
	if (s->loc == SESS_POOL)
		return 0;
	int rc = s->loc == SESS_RAM ? from_ram(r, s, cause) : from_disk(r, s, cause);
	if (rc == 0)  /* its blocks are shareable again (or given up for ones
		       * already named so) */
		sess_name_blocks(r->st, s);
	return rc;
}

/* A refused file of a session being dropped goes aside, not away. */
static void drop_refused_file(struct residency *r, const struct session *s)
{
	char *path = store_path(r->dir, s->uid, s->id), *aside = NULL;
	int rc = path ? store_set_aside(path, &aside) : -ENOMEM;
	if (rc == 0) {
		r->n.set_aside++;
		say(r, RES_WARN, "session %s dropped: its state file %s, refused when read, moved "
		    "to %s", s->id, path, aside);
	} else if (rc != -ENOENT) {
		say(r, RES_ERROR, "session %s dropped: cannot move its refused state file %s aside "
		    "(%s); it stays", s->id, path ? path : "?", strerror(-rc));
	}
	free(aside);
	free(path);
}

void res_drop(struct residency *r, struct session *s, int remove_file)
{
	if (remove_file && r->dir && s->file_refused)
		drop_refused_file(r, s);
	else if (remove_file && r->dir && store_remove(r->dir, s->uid, s->id) != 0)
		say(r, RES_WARN, "session %s: cannot remove its state file", s->id);
	else if (remove_file && r->dir)
		set_file_refs(r, s, NULL, 0);  /* its file is gone */
	ram_release(r, s);
	sess_drop(r->st, s);
}

int res_history(struct residency *r, struct session *s, struct session *tmp,
		struct session **out, char **cause)
{
	if (cause)
		*cause = NULL;
	if (s->loc != SESS_DISK) {
		*out = s;
		return 0;
	}
	memset(tmp, 0, sizeof(*tmp));
	memcpy(tmp->id, s->id, sizeof(tmp->id));
	tmp->uid = s->uid;
	char *path = r->dir ? store_path(r->dir, s->uid, s->id) : NULL;
	char *why = NULL;
	int rc = path ? store_load_history(path, tmp, &why) : -ENOENT;
	free(path);
	s->file_refused = rc == -EBADMSG || rc == -EPROTO;
	if (rc) {
		say_file(r, RES_WARN, "cannot read the history of session", s, "", why, rc);
		cause_set(cause, "cannot read session '%s': %s", s->id,
			  why ? why : strerror(-rc));
		free(why);
		sess_clear_history(r->st, tmp);
		return -EIO;
	}
	tmp->tmpl = s->tmpl;
	tmp->policy = s->policy;
	*out = tmp;
	return 0;
}

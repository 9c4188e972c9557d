/*
 * session/store_save.c — writing a session's state file (store.h's
 * store_save*): the checks that a reader would accept it, the body, the
 * full blocks kept as shared block files, and the write to a temporary
 * file renamed into place.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "session/blocks.h"
#include "session/store_int.h"
#include "util/le.h"

/* ---- save --------------------------------------------------------------- */

/* Buffered writer of the body, hashing as it goes. */
struct wr {
	int fd;
	unsigned char *buf;
	size_t len;
	uint64_t off;           /* file offset of buf[0] */
	XXH64_state_t *st;
};

static int wr_flush(struct wr *w)
{
	int rc = st_pwrite_all(w->fd, w->buf, w->len, w->off);
	w->off += w->len;
	w->len = 0;
	return rc;
}

/* Append n bytes; large spans go straight from p to the file. */
static int wr_put(struct wr *w, const void *p, size_t n)
{
	XXH64_update(w->st, p, n);
	if (n >= IO_DIRECT) {
		int rc = wr_flush(w);
		if (rc)
			return rc;
		rc = st_pwrite_all(w->fd, p, n, w->off);
		w->off += n;
		return rc;
	}
	if (w->len + n > IO_CHUNK) {
		int rc = wr_flush(w);
		if (rc)
			return rc;
	}
	memcpy(w->buf + w->len, p, n);
	w->len += n;
	return 0;
}

static int wr_u32(struct wr *w, uint32_t v)
{
	unsigned char b[4];
	put_le(b, v, 4);
	return wr_put(w, b, 4);
}

/* A text as len u32 + bytes (NO_TEXT for NULL). */
static int wr_text(struct wr *w, const char *t)
{
	if (!t)
		return wr_u32(w, NO_TEXT);
	size_t n = strlen(t);
	int rc = wr_u32(w, (uint32_t)n);
	return rc ? rc : wr_put(w, t, n);
}

/* Length of a text field in the body. */
static uint64_t text_bytes(const char *t)
{
	return 4 + (t ? strlen(t) : 0);
}

static int text_ok(const char *t)
{
	return !t || strlen(t) < NO_TEXT;
}

/* Check that s can be written, with the K/V of its first n_cached positions
 * (s->n_cached, or 0 for the history alone), and that a reader would accept
 * the result; fill the header fields (not the checksum). 0 or -EINVAL /
 * -E2BIG with a reason in why. */
static int save_check(const struct session *s, int n_cached, int n_refs,
		      const struct kvpool *pool, uint64_t fingerprint, struct hdr *h, char *why,
		      size_t whycap)
{
	const struct kt_kv *kv = &pool->kv;
	if (s->n_tokens < 0 || (uint64_t)s->n_tokens > MAX_TOKENS || s->n_turns < 0 ||
	    (uint64_t)s->n_turns > MAX_TURNS) {
		snprintf(why, whycap, "cannot save %d tokens in %d turns", s->n_tokens, s->n_turns);
		return -E2BIG;
	}
	if (s->n_cached < 0 || s->n_cached > s->n_tokens || (s->n_tokens && !s->tokens) ||
	    (s->n_turns && !s->turns)) {
		snprintf(why, whycap, "cannot save: inconsistent session (%d tokens, %d cached)",
			 s->n_tokens, s->n_cached);
		return -EINVAL;
	}
	if (s->tmpl < 1 || s->tmpl > MAX_TMPL || s->policy < 1 || s->policy > MAX_POLICY) {
		snprintf(why, whycap, "cannot save: template %d, context policy %d", s->tmpl, s->policy);
		return -EINVAL;
	}
	if (kv->block_size < 1 || (uint32_t)kv->block_size > MAX_BLOCK_SIZE || kv->n_layers < 1 ||
	    (uint32_t)kv->n_layers > MAX_LAYERS || kv->kv_dim < 1 ||
	    (uint32_t)kv->kv_dim > MAX_KV_DIM) {
		snprintf(why, whycap, "cannot save: unsupported KV shape");
		return -EINVAL;
	}
	uint64_t meta = 4 * (uint64_t)s->n_tokens + text_bytes(s->system) +
			text_bytes(s->next_system);
	if (!text_ok(s->system) || !text_ok(s->next_system)) {
		snprintf(why, whycap, "cannot save: system prompt too long");
		return -E2BIG;
	}
	int prev = 0;
	for (int i = 0; i < s->n_turns; i++) {
		const struct sess_turn *t = &s->turns[i];
		if (t->start < prev || t->start > s->n_tokens || t->role > MAX_ROLE ||
		    t->end > SESS_END_MAX) {
			snprintf(why, whycap, "cannot save: inconsistent turn %d", i);
			return -EINVAL;
		}
		if (!text_ok(t->text)) {
			snprintf(why, whycap, "cannot save: text of turn %d too long", i);
			return -E2BIG;
		}
		prev = t->start;
		meta += TURN_FIXED(2) - 4 + text_bytes(t->text);
	}
	int bs = kv->block_size;
	int n_blocks = (n_cached + bs - 1) / bs;
	if (n_refs < 0 || n_refs > n_cached / bs) {
		snprintf(why, whycap, "cannot save: %d shared blocks of %d cached tokens", n_refs,
			 n_cached);
		return -EINVAL;
	}
	int version = n_refs || (s->inexact && n_cached > 0) ? 3 : 2;
	if (version >= 3)  /* the seed and the names */
		meta += 8 + 8 * (uint64_t)n_refs;
	if (n_blocks > s->kv.n_blocks) {
		snprintf(why, whycap, "cannot save: %d cached positions but %d blocks",
			 n_cached, s->kv.n_blocks);
		return -EINVAL;
	}
	for (int i = 0; i < n_blocks; i++) {
		if (s->kv.blocks[i] < 0 || s->kv.blocks[i] >= kv->n_blocks) {
			snprintf(why, whycap, "cannot save: bad block id %d", (int)s->kv.blocks[i]);
			return -EINVAL;
		}
	}
	memset(h, 0, sizeof(*h));
	/* a file without shared blocks stays version 2; version 3 without
	 * any says the K/V is inexact (session.h) */
	h->version = (uint32_t)version;
	h->n_refs = (uint32_t)n_refs;
	h->fingerprint = fingerprint;
	h->kv_dtype = (uint32_t)kv->dtype | (uint32_t)(kv->dtype == KT_Q8_0 ? kv->group : 0) << 8;
	h->block_size = (uint32_t)bs;
	h->n_layers = (uint32_t)kv->n_layers;
	h->kv_dim = (uint32_t)kv->kv_dim;
	h->n_tokens = (uint32_t)s->n_tokens;
	h->n_cached = (uint32_t)n_cached;
	h->n_turns = (uint32_t)s->n_turns;
	h->uid = (uint32_t)s->uid;
	h->tmpl = (uint32_t)s->tmpl;
	h->policy = (uint32_t)s->policy;
	h->last_use_ms = s->last_use_ms;
	h->prefilled = s->prefilled;
	h->generated = s->generated;
	memcpy(h->id, s->id, strlen(s->id) + 1);
	h->n_blocks = (uint32_t)n_blocks;
	h->block_bytes = kt_kv_block_bytes(kv);
	h->kv_bytes = (uint64_t)(n_blocks - n_refs) * h->block_bytes;
	h->body_bytes = meta + h->kv_bytes;
	return 0;
}

/* Write the body of s (store.h) through w; h->meta_sum gets the hash of
 * what comes before the K/V. */
static int write_body(struct wr *w, const struct session *s, const struct kvpool *pool,
		      const struct store_chain *ch, struct hdr *h)
{
	int rc = 0;
	/* tokens: through a small staging array (little-endian whatever the host) */
	unsigned char tb[4096];
	for (int i = 0; i < s->n_tokens && !rc; i += (int)sizeof(tb) / 4) {
		int n = s->n_tokens - i < (int)sizeof(tb) / 4 ? s->n_tokens - i : (int)sizeof(tb) / 4;
		for (int k = 0; k < n; k++)
			put_le(tb + 4 * k, (uint32_t)s->tokens[i + k], 4);
		rc = wr_put(w, tb, (size_t)n * 4);
	}
	for (int i = 0; i < s->n_turns && !rc; i++) {
		unsigned char f[6];
		put_le(f, (uint32_t)s->turns[i].start, 4);
		f[4] = s->turns[i].role;
		f[5] = s->turns[i].end;
		rc = wr_put(w, f, 6);
		if (!rc)
			rc = wr_text(w, s->turns[i].text);
	}
	if (!rc)
		rc = wr_text(w, s->system);
	if (!rc)
		rc = wr_text(w, s->next_system);
	if (h->version >= 3) {  /* the chain's seed and the shared blocks' names */
		unsigned char nb[8];
		put_le(nb, ch ? ch->seed : 0, 8);
		rc = rc ? rc : wr_put(w, nb, 8);
		for (uint32_t i = 0; i < h->n_refs && !rc; i++) {
			put_le(nb, ch->names[i], 8);
			rc = wr_put(w, nb, 8);
		}
	}
	h->meta_sum = XXH64_digest(w->st);  /* the bytes so far: all but the K/V */
	/* KV, straight from a host pool (runs of consecutive block ids in one
	 * write), or a block at a time through host memory from a device; the
	 * shared blocks are in their block files */
	const int32_t *bl = s->kv.blocks;
	int on_host = kvpool_host_block(pool, 0) != NULL;
	if (!on_host && h->n_blocks && !rc) {
		void *bounce = malloc(h->block_bytes);
		if (!bounce)
			return -ENOMEM;
		for (uint32_t i = h->n_refs; i < h->n_blocks && !rc; i++) {
			rc = kvpool_get_block(pool, bl[i], bounce);
			if (!rc)
				rc = wr_put(w, bounce, h->block_bytes);
		}
		free(bounce);
	}
	for (uint32_t i = h->n_refs, j; on_host && i < h->n_blocks && !rc; i = j) {
		for (j = i + 1; j < h->n_blocks && bl[j] == bl[j - 1] + 1; j++)
			;
		rc = wr_put(w, kt_kv_block(&pool->kv, bl[i]), (size_t)(j - i) * h->block_bytes);
	}
	if (!rc)
		rc = wr_flush(w);
	return rc;
}

/*
 * The block files of s's first ch->n full blocks (blocks.h), those not
 * there yet, then the blocks folder synced: before the state file that
 * refers to them. *written counts new files. 0 or -errno with *cause.
 */
static int write_blocks(const char *dir, const struct session *s, const struct kvpool *pool,
			const struct store_chain *ch, uint64_t fingerprint, int *written,
			uint8_t *fresh, char **cause)
{
	int bdfd = blk_open_dir(dir, 1);
	if (bdfd == -ELOOP)
		return st_fail(cause, -EIO, "the blocks folder is a symbolic link or not a folder: "
			    "not followed");
	if (bdfd < 0)
		return st_fail(cause, bdfd, "cannot open the blocks folder: %s", strerror(-bdfd));
	int bs = pool->kv.block_size, rc = 0;
	size_t bb = kt_kv_block_bytes(&pool->kv);
	void *bounce = kvpool_host_block(pool, 0) ? NULL : malloc(bb);
	if (!kvpool_host_block(pool, 0) && !bounce)
		rc = -ENOMEM;
	for (int i = 0; i < ch->n && !rc; i++) {
		int32_t b = s->kv.blocks[i];
		const void *kv = kvpool_host_block(pool, b);
		if (!kv) {
			rc = kvpool_get_block(pool, b, bounce);
			kv = bounce;
		}
		struct blk_meta m = { .name = ch->names[i], .parent = i ? ch->names[i - 1] : ch->seed,
				      .fingerprint = fingerprint, .uid = (uint32_t)s->uid };
		uint64_t bytes;
		if (!rc)
			rc = blk_write(bdfd, &m, s->tokens + (size_t)i * (size_t)bs, kv, &pool->kv,
				       &bytes, cause);
		if (rc == 1) {
			(*written)++;
			fresh[i] = 1;
			rc = 0;
		}
	}
	if (!rc && *written && (rc = blk_sync(bdfd)) != 0)
		st_fail(cause, rc, "cannot sync the blocks folder: %s", strerror(-rc));
	if (rc && !(cause && *cause))
		st_fail_errno(cause, rc);
	free(bounce);
	close(bdfd);
	/* LLAMAD_TEST_KILL_BETWEEN_WRITES: die here, after new block files and
	 * before the state file (for the test of a crash between the two) */
	if (!rc && *written && getenv("LLAMAD_TEST_KILL_BETWEEN_WRITES"))
		raise(SIGKILL);
	return rc;
}

/* Remove the block files a failed save wrote (fresh[i]). */
static void forget_blocks(const char *dir, const struct session *s, const struct store_chain *ch,
			  const uint8_t *fresh)
{
	for (int i = 0; i < ch->n; i++)
		if (fresh[i])
			blk_remove(dir, (uint32_t)s->uid, ch->names[i]);
}

static int save_file(const char *dir, const struct session *s, int n_cached,
		     const struct store_chain *ch, const struct kvpool *pool, uint64_t fingerprint,
		     int *written, char **cause)
{
	if (cause)
		*cause = NULL;
	char *path = store_path(dir, s->uid, s->id);
	if (!path)
		return errno == EINVAL ? st_fail(cause, -EINVAL, "cannot save: invalid session id")
				       : -ENOMEM;
	struct hdr h;
	char why[256];
	int n_refs = ch ? ch->n : 0;
	int rc = save_check(s, n_cached, n_refs, pool, fingerprint, &h, why, sizeof(why));
	if (rc) {
		st_fail(cause, rc, "%s", why);
		free(path);
		return rc;
	}
	/* the block files this save writes: nothing refers to them until the
	 * state file is renamed into place, and a failed save removes them */
	uint8_t *fresh = n_refs ? calloc((size_t)n_refs, 1) : NULL;
	if (n_refs && !fresh) {
		free(path);
		return st_fail_errno(cause, -ENOMEM);
	}
	if (n_refs && (rc = write_blocks(dir, s, pool, ch, fingerprint, written, fresh, cause))) {
		forget_blocks(dir, s, ch, fresh);
		free(fresh);
		free(path);
		return rc;
	}

	char name[NAME_MAX + 1], tmp[NAME_MAX + 64];  /* both well under NAME_MAX */
	st_file_name(name, sizeof(name), s->uid, s->id);
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		rc = st_fail_errno(cause, -errno);
		if (n_refs)
			forget_blocks(dir, s, ch, fresh);
		free(fresh);
		free(path);
		return rc;
	}
	/* A fresh temporary name: ".tmp-" + final name + pid + counter; O_EXCL
	 * refuses an existing one (a leftover of a crash), then the next counter
	 * is tried. */
	static atomic_uint counter;
	int fd = -1;
	for (int tries = 0; tries < 100; tries++) {
		snprintf(tmp, sizeof(tmp), ".tmp-%s.%ld.%u", name, (long)getpid(),
			 atomic_fetch_add(&counter, 1));
		fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		if (fd >= 0 || errno != EEXIST)
			break;
	}
	if (fd < 0) {
		rc = st_fail_errno(cause, -errno);
		if (n_refs)
			forget_blocks(dir, s, ch, fresh);
		free(fresh);
		close(dfd);
		free(path);
		return rc;
	}

	struct wr w = { .fd = fd, .off = STORE_HEADER_BYTES };
	uint64_t total = STORE_HEADER_BYTES + h.body_bytes;
	w.buf = malloc(IO_CHUNK);
	w.st = XXH64_createState();
	if (!w.buf || !w.st) {
		rc = -ENOMEM;
		goto out;
	}
	XXH64_reset(w.st, 0);
	/* The mode is exact whatever the umask. Reserving the space first fails
	 * fast on a full disk; filesystems without fallocate just skip it. */
	if (fchmod(fd, 0600) < 0) {
		rc = -errno;
		goto out;
	}
	if (fallocate(fd, 0, 0, (off_t)total) < 0 && errno != EOPNOTSUPP && errno != ENOSYS &&
	    errno != EINVAL) {
		rc = -errno;
		goto out;
	}
	rc = write_body(&w, s, pool, ch, &h);
	if (rc)
		goto out;
	/* The header last: it carries the body checksum. */
	h.checksum = XXH64_digest(w.st);
	unsigned char hb[STORE_HEADER_BYTES];
	st_hdr_build(hb, &h);
	rc = st_pwrite_all(fd, hb, sizeof(hb), 0);
	if (rc)
		goto out;
	if (fsync(fd) < 0) {
		rc = -errno;
		goto out;
	}
	/* close() may report a late write error (NFS): it must not be lost */
	rc = close(fd) < 0 ? -errno : 0;
	fd = -1;
	if (rc)
		goto out;
	if (renameat(dfd, tmp, dfd, name) < 0) {
		rc = -errno;
		goto out;
	}
	tmp[0] = '\0';  /* renamed: nothing to clean up */
	/* Make the rename durable. The new file is in place even if this fails;
	 * the error is still returned. Some filesystems cannot sync folders. */
	if (fsync(dfd) < 0 && errno != EINVAL && errno != EROFS) {
		rc = -errno;
		st_fail(cause, rc, "saved, but syncing the folder failed: %s", strerror(errno));
	}
out:
	if (rc && !(cause && *cause))
		st_fail_errno(cause, rc);
	if (fd >= 0)
		close(fd);
	if (rc && tmp[0]) {
		unlinkat(dfd, tmp, 0);
		if (n_refs)
			forget_blocks(dir, s, ch, fresh);
	}
	free(fresh);
	close(dfd);
	XXH64_freeState(w.st);
	free(w.buf);
	free(path);
	return rc;
}

int store_save(const char *dir, const struct session *s, const struct kvpool *pool,
	       uint64_t fingerprint, char **cause)
{
	return save_file(dir, s, s->n_cached, NULL, pool, fingerprint, NULL, cause);
}

int store_save_shared(const char *dir, const struct session *s, const struct kvpool *pool,
		      uint64_t fingerprint, const struct store_chain *ch, int *written,
		      char **cause)
{
	*written = 0;
	return save_file(dir, s, s->n_cached, ch, pool, fingerprint, written, cause);
}

int store_save_history(const char *dir, const struct session *s, const struct kvpool *pool,
		       uint64_t fingerprint, char **cause)
{
	return save_file(dir, s, 0, NULL, pool, fingerprint, NULL, cause);
}

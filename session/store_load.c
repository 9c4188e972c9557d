/*
 * session/store_load.c — reading a state file back (store.h's
 * store_load*, store_read_refs): versions 1-3, K/V converted from another
 * element type, shared blocks found by name or read from their block
 * files; nothing reaches the session before the checksums are verified.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "session/blocks.h"
#include "session/store_int.h"
#include "util/le.h"

/* ---- load --------------------------------------------------------------- */

/* Buffered reader of the body, hashing every byte once, in file order. */
struct rd {
	int fd;
	unsigned char *buf;
	size_t pos, len;        /* unread buffered bytes: buf[pos, len) */
	uint64_t off;           /* file offset of the next byte not yet buffered */
	uint64_t left;          /* body bytes not yet read from the file */
	XXH64_state_t *st;
};

/* Read n body bytes from the file into p (hashing them). A file that ends
 * early (shrunk since fstat) is -EBADMSG. */
static int rd_file(struct rd *r, void *p, size_t n)
{
	if (n > r->left)
		return -EBADMSG;
	ssize_t got = st_pread_all(r->fd, p, n, r->off);
	if (got < 0)
		return (int)got;
	if ((size_t)got < n)
		return -EBADMSG;
	XXH64_update(r->st, p, n);
	r->off += n;
	r->left -= n;
	return 0;
}

/* Copy the next n body bytes to dst (NULL: skip them, still hashed). */
static int rd_get(struct rd *r, void *dst, size_t n)
{
	unsigned char *d = dst;
	while (n) {
		if (r->pos < r->len) {
			size_t k = r->len - r->pos < n ? r->len - r->pos : n;
			if (d) {
				memcpy(d, r->buf + r->pos, k);
				d += k;
			}
			r->pos += k;
			n -= k;
			continue;
		}
		if (d && n >= IO_DIRECT)
			return rd_file(r, d, n);  /* large: no copy through buf */
		size_t k = r->left < IO_CHUNK ? (size_t)r->left : IO_CHUNK;
		if (k == 0)
			return -EBADMSG;
		int rc = rd_file(r, r->buf, k);
		if (rc)
			return rc;
		r->pos = 0;
		r->len = k;
	}
	return 0;
}

/* What is parsed before it is installed into the session. */
struct loaded {
	int32_t *tokens;
	struct sess_turn *turns;
	int n_turns;            /* turns filled so far */
	char *system, *next_system;
	int32_t *blocks;
	int n_blocks;           /* blocks taken from the pool so far */
	uint64_t seed;          /* version 3: the chain's seed and the shared */
	uint64_t *refs;         /* blocks' names (h->n_refs) */
	int converted;          /* a block was converted from another K/V type */
};

/* Where a version 3 file's shared blocks come from. */
struct load_ctx {
	const char *path;       /* the state file's: its folder holds blocks/ */
	uint64_t fingerprint;
	struct store_note *note;  /* a refused block file is said here */
};

static void loaded_free(struct loaded *L, struct kvpool *pool)
{
	free(L->tokens);
	for (int i = 0; i < L->n_turns; i++)
		free(L->turns[i].text);
	free(L->turns);
	free(L->system);
	free(L->next_system);
	for (int i = 0; i < L->n_blocks; i++)
		if (L->blocks[i] >= 0)
			kvpool_unref(pool, L->blocks[i]);
	free(L->blocks);
	free(L->refs);
	memset(L, 0, sizeof(*L));
}

/* A text field, bounded by *meta_left (the non-KV body bytes not yet
 * parsed). *out is NULL for NO_TEXT. */
static int rd_text(struct rd *r, uint64_t *meta_left, char **out, const char **why)
{
	unsigned char b[4];
	*out = NULL;
	if (*meta_left < 4) {
		*why = "corrupt (body layout)";
		return -EBADMSG;
	}
	int rc = rd_get(r, b, 4);
	if (rc)
		return rc;
	*meta_left -= 4;
	uint32_t n = get_u32(b);
	if (n == NO_TEXT)
		return 0;
	if (n > *meta_left) {
		*why = "corrupt (text length past the end of the body)";
		return -EBADMSG;
	}
	char *t = malloc((size_t)n + 1);
	if (!t)
		return -ENOMEM;
	rc = rd_get(r, t, n);
	if (rc) {
		free(t);
		return rc;
	}
	t[n] = '\0';
	*meta_left -= n;
	if (memchr(t, 0, n)) {  /* a C string cannot hold one: corrupt */
		free(t);
		*why = "corrupt (NUL byte in a text)";
		return -EBADMSG;
	}
	*out = t;
	return 0;
}

/* How much of a body read_body takes. */
enum body_part {
	BODY_ALL,         /* history and K/V into pool blocks */
	BODY_HISTORY,     /* history; the K/V only hashed for the checksum */
	BODY_META,        /* history only, checked by the header's meta_sum
			   * (version 2; the K/V is not read at all) */
};

/* Parse the body (positioned just after the header) into L, taking pool
 * blocks for BODY_ALL, and verify the checksum. On error L holds what was
 * taken so far (the caller frees it). */
/*
 * The K/V of a file whose element type is not the pool's, block by block
 * into the pool's blocks: each row read as fp32 from the file's layout and
 * stored in the pool's type (kt_kv_put), as a kv_store of the same values
 * would store it.
 */
static int read_converted(struct rd *r, const struct hdr *h, struct kvpool *pool,
			  const int32_t *blocks, uint32_t n)
{
	void *src = malloc(h->block_bytes), *dst = malloc(kt_kv_block_bytes(&pool->kv));
	float *scratch = malloc(2 * (size_t)h->kv_dim * sizeof(float));
	int rc = src && dst && scratch ? 0 : -ENOMEM;
	for (uint32_t i = 0; i < n && !rc; i++) {
		if ((rc = rd_get(r, src, h->block_bytes)))
			break;
		blk_convert(&h->shape, src, &pool->kv, dst, scratch);
		rc = kvpool_put_block(pool, blocks[i], dst);
	}
	free(src);
	free(dst);
	free(scratch);
	return rc;
}

/* The first h->n_refs blocks of a version 3 file into L->blocks: a block
 * the pool holds under that name (same owner, parent and tokens) is
 * shared; the others are read from their block files. A block file that
 * cannot be used is -ENOLINK, said in lc->note. */
static int load_shared(const struct hdr *h, struct kvpool *pool, struct loaded *L,
		       const struct load_ctx *lc)
{
	int bs = (int)h->block_size, rc = 0, bdfd = -1;
	void *bounce = kvpool_host_block(pool, 0) ? NULL : malloc(kt_kv_block_bytes(&pool->kv));
	if (!kvpool_host_block(pool, 0) && !bounce)
		return -ENOMEM;
	for (uint32_t i = 0; i < h->n_refs && !rc; i++) {
		const int32_t *tok = L->tokens + (size_t)i * (size_t)bs;
		uint64_t parent = i ? L->refs[i - 1] : L->seed;
		int32_t b = kvpool_lookup(pool, L->refs[i], parent, h->uid, tok);
		if (b >= 0) {
			kvpool_ref(pool, b);
			L->blocks[i] = b;
			continue;
		}
		if ((b = kvpool_alloc(pool)) < 0) {
			rc = b;
			break;
		}
		L->blocks[i] = b;
		if (bdfd < 0) {
			char *dir = strdup(lc->path), *slash = dir ? strrchr(dir, '/') : NULL;
			if (slash)
				*slash = '\0';
			bdfd = !dir ? -ENOMEM : blk_open_dir(slash ? dir : ".", 0);
			free(dir);
		}
		struct blk_meta m = { .name = L->refs[i], .parent = parent,
				      .fingerprint = lc->fingerprint, .uid = h->uid };
		void *dst = bounce ? bounce : kvpool_host_block(pool, b);
		char why[160];
		rc = bdfd < 0 ? (snprintf(why, sizeof(why), "no blocks folder: %s", strerror(-bdfd)),
				 bdfd)
			      : blk_read(bdfd, &m, tok, &pool->kv, dst, why, sizeof(why));
		if (rc == 1) {  /* read, converted */
			L->converted = 1;
			rc = 0;
		}
		if (rc == 0 && bounce)
			rc = kvpool_put_block(pool, b, bounce);
		else if (rc && rc != -ENOMEM && rc != -EIO) {
			struct store_note *nt = lc->note;
			if (nt) {
				char fname[64];
				blk_file_name(fname, sizeof(fname), h->uid, m.name);
				nt->bad_block = 1;
				nt->bad_uid = h->uid;
				nt->bad_name = m.name;
				snprintf(nt->bad_why, sizeof(nt->bad_why), "block file %s: %s", fname,
					 why);
			}
			rc = -ENOLINK;
		}
	}
	if (bdfd >= 0)
		close(bdfd);
	free(bounce);
	return rc;
}

static int read_body(struct rd *r, const struct hdr *h, struct kvpool *pool, enum body_part part,
		     const struct load_ctx *lc, struct loaded *L, const char **why)
{
	int load_kv = part == BODY_ALL;
	unsigned fixed = TURN_FIXED(h->version);
	uint64_t meta_left = h->body_bytes - h->kv_bytes;
	int rc;
	*why = NULL;

	/* tokens (the header check guaranteed 4 * n_tokens <= meta_left) */
	if (h->n_tokens) {
		L->tokens = malloc((size_t)h->n_tokens * sizeof(int32_t));
		if (!L->tokens)
			return -ENOMEM;
		unsigned char tb[4096];
		for (uint32_t i = 0; i < h->n_tokens; i += sizeof(tb) / 4) {
			uint32_t n = h->n_tokens - i < sizeof(tb) / 4 ? h->n_tokens - i
								       : (uint32_t)(sizeof(tb) / 4);
			if ((rc = rd_get(r, tb, (size_t)n * 4)))
				return rc;
			for (uint32_t k = 0; k < n; k++) {
				int32_t t = (int32_t)get_u32(tb + 4 * k);
				if (t < 0) {
					*why = "corrupt (negative token id)";
					return -EBADMSG;
				}
				L->tokens[i + k] = t;
			}
		}
		meta_left -= 4 * (uint64_t)h->n_tokens;
	}

	/* turns */
	if (h->n_turns) {
		L->turns = calloc(h->n_turns, sizeof(*L->turns));
		if (!L->turns)
			return -ENOMEM;
	}
	uint32_t prev = 0;
	for (uint32_t i = 0; i < h->n_turns; i++) {
		unsigned char f[6] = { 0 };
		if (meta_left < fixed - 4) {
			*why = "corrupt (body layout)";
			return -EBADMSG;
		}
		if ((rc = rd_get(r, f, fixed - 4)))
			return rc;
		meta_left -= fixed - 4;
		uint32_t start = get_u32(f);
		/* an empty last turn starts at n_tokens (a llama2 system turn) */
		if (start < prev || start > h->n_tokens || f[4] > MAX_ROLE || f[5] > SESS_END_MAX) {
			*why = "corrupt (bad turn)";
			return -EBADMSG;
		}
		prev = start;
		L->turns[i].start = (int)start;
		L->turns[i].role = f[4];
		L->turns[i].end = f[5];
		L->n_turns = (int)i + 1;
		if ((rc = rd_text(r, &meta_left, &L->turns[i].text, why)))
			return rc;
	}
	if ((rc = rd_text(r, &meta_left, &L->system, why)) ||
	    (rc = rd_text(r, &meta_left, &L->next_system, why)))
		return rc;
	if (h->version >= 3) {  /* seed and names (hdr_parse counted them in) */
		unsigned char nb[8];
		L->refs = h->n_refs ? malloc((size_t)h->n_refs * sizeof(uint64_t)) : NULL;
		if (h->n_refs && !L->refs)
			return -ENOMEM;
		if (meta_left < 8 + 8 * (uint64_t)h->n_refs) {
			*why = "corrupt (body layout)";
			return -EBADMSG;
		}
		if ((rc = rd_get(r, nb, 8)))
			return rc;
		L->seed = get_u64(nb);
		for (uint32_t i = 0; i < h->n_refs; i++) {
			if ((rc = rd_get(r, nb, 8)))
				return rc;
			if (!(L->refs[i] = get_u64(nb))) {
				*why = "corrupt (a shared block without a name)";
				return -EBADMSG;
			}
		}
		meta_left -= 8 + 8 * (uint64_t)h->n_refs;
	}
	if (meta_left) {
		*why = "corrupt (body layout)";
		return -EBADMSG;
	}
	if (part == BODY_META) {
		if (XXH64_digest(r->st) != h->meta_sum) {
			*why = "corrupt (checksum mismatch)";
			return -EBADMSG;
		}
		return 0;
	}

	/* KV: into fresh pool blocks (the caller checked there are enough), runs
	 * of consecutive ids in one read; or only hashed for the checksum. */
	if (load_kv && h->n_blocks) {
		L->blocks = malloc((size_t)h->n_blocks * sizeof(int32_t));
		if (!L->blocks)
			return -ENOMEM;
		/* the file's own blocks now, the shared ones once the body is
		 * verified (no block file is read for a corrupt state file) */
		for (uint32_t i = 0; i < h->n_blocks; i++)
			L->blocks[i] = -1;
		L->n_blocks = (int)h->n_blocks;
		for (uint32_t i = h->n_refs; i < h->n_blocks; i++) {
			int32_t b = kvpool_alloc(pool);
			if (b < 0)
				return b;
			L->blocks[i] = b;
		}
		int32_t *own = L->blocks + h->n_refs;
		uint32_t n_own = h->n_blocks - h->n_refs;
		int on_host = kvpool_host_block(pool, 0) != NULL;
		int convert = h->shape.dtype != pool->kv.dtype || h->shape.group != pool->kv.group;
		if (convert) {
			L->converted = n_own > 0;
			if ((rc = read_converted(r, h, pool, own, n_own)))
				return rc;
		} else if (!on_host) {
			void *bounce = malloc(h->block_bytes);
			if (!bounce)
				return -ENOMEM;
			for (uint32_t i = 0; i < n_own && !rc; i++) {
				rc = rd_get(r, bounce, h->block_bytes);
				if (!rc)
					rc = kvpool_put_block(pool, own[i], bounce);
			}
			free(bounce);
			if (rc)
				return rc;
		}
		for (uint32_t i = h->n_refs, j; on_host && !convert && i < h->n_blocks; i = j) {
			for (j = i + 1; j < h->n_blocks && L->blocks[j] == L->blocks[j - 1] + 1; j++)
				;
			rc = rd_get(r, kt_kv_block(&pool->kv, L->blocks[i]),
				    (size_t)(j - i) * h->block_bytes);
			if (rc)
				return rc;
		}
	} else {
		for (uint64_t left = h->kv_bytes; left;) {
			size_t k = left < IO_CHUNK ? (size_t)left : IO_CHUNK;
			if ((rc = rd_get(r, NULL, k)))
				return rc;
			left -= k;
		}
	}
	if (r->left || r->pos != r->len) {
		*why = "corrupt (body layout)";
		return -EBADMSG;
	}
	if (XXH64_digest(r->st) != h->checksum) {
		*why = "corrupt (checksum mismatch)";
		return -EBADMSG;
	}
	return load_kv && h->n_refs ? load_shared(h, pool, L, lc) : 0;
}

/* Does the file's KV shape equal the pool's? (The element type may differ:
 * read_converted converts it.) */
static int shape_matches(const struct hdr *h, const struct kvpool *pool)
{
	return h->block_size == (uint32_t)pool->kv.block_size &&
	       h->n_layers == (uint32_t)pool->kv.n_layers &&
	       h->kv_dim == (uint32_t)pool->kv.kv_dim;
}

/* store_load, or with history_only store_load_history (pool and
 * fingerprint unused). */
static int load(const char *path, struct session *s, struct kvpool *pool, uint64_t fingerprint,
		int allow_foreign, int history_only, int no_kv, struct store_note *note,
		char **cause)
{
	if (cause)
		*cause = NULL;
	if (s->n_tokens || s->n_turns || s->n_cached || s->kv.n_blocks || s->system ||
	    s->next_system)
		return st_fail(cause, -EINVAL, "cannot load into a session that is not empty");

	/* O_NONBLOCK: a FIFO planted under the name must not hang the open. */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0)
		return st_fail_errno(cause, -errno);
	struct rd r = { .fd = fd, .off = STORE_HEADER_BYTES };
	struct loaded L = { 0 };
	struct hdr h;
	char why[256];
	const char *body_why = NULL;
	int rc;
	struct stat st;
	if (fstat(fd, &st) < 0) {
		rc = st_fail_errno(cause, -errno);
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = st_fail(cause, -EINVAL, "not a regular file");
		goto out;
	}
	unsigned char hb[STORE_HEADER_BYTES];
	ssize_t got = st_pread_all(fd, hb, sizeof(hb), 0);
	if (got < 0) {
		rc = st_fail_errno(cause, (int)got);
		goto out;
	}
	rc = st_hdr_parse(hb, (size_t)got, (uint64_t)st.st_size, &h, why, sizeof(why));
	if (rc) {
		st_fail(cause, rc, "%s", why);
		goto out;
	}
	if (h.uid != (uint32_t)s->uid || strcmp(h.id, s->id)) {
		rc = st_fail(cause, -EINVAL, "holds session '%s' of uid %" PRIu32
			  ", not '%s' of uid %u", h.id, h.uid, s->id, (unsigned)s->uid);
		goto out;
	}

	/* Whose cache is it? Foreign or differently shaped K/V is only skipped
	 * (and the history kept) when the caller allows it. */
	int same_model = !history_only && h.fingerprint == fingerprint;
	int same_shape = history_only || h.n_cached == 0 || shape_matches(&h, pool);
	if (!same_model && !allow_foreign) {
		rc = st_fail(cause, -ESTALE, "saved under a different model (fingerprint %016"
			  PRIx64 ", this model %016" PRIx64 ")", h.fingerprint, fingerprint);
		goto out;
	}
	if (!same_shape && !allow_foreign) {
		rc = st_fail(cause, -ESTALE, "saved with a different KV layout (block_size %"
			  PRIu32 ", %" PRIu32 " layers, kv_dim %" PRIu32 "; the cache has %d, %d, %d)",
			  h.block_size, h.n_layers, h.kv_dim, pool->kv.block_size,
			  pool->kv.n_layers, pool->kv.kv_dim);
		goto out;
	}
	int load_kv = !no_kv && same_model && same_shape && h.n_cached > 0;
	if (load_kv && h.n_blocks > (uint32_t)kvpool_n_free(pool)) {
		rc = st_fail(cause, -ENOSPC, "the KV cache is full (%" PRIu32
			  " blocks needed, %d free)", h.n_blocks, kvpool_n_free(pool));
		goto out;
	}

	/* a version 2 file's history has its own checksum: the K/V need not
	 * be read for it */
	enum body_part part = load_kv ? BODY_ALL : history_only && h.version >= 2 ? BODY_META
										  : BODY_HISTORY;
	r.left = part == BODY_META ? h.body_bytes - h.kv_bytes : h.body_bytes;
	/* rd_get never buffers more than is left of the body */
	r.buf = malloc(r.left && r.left < IO_CHUNK ? (size_t)r.left : IO_CHUNK);
	r.st = XXH64_createState();
	if (!r.buf || !r.st) {
		rc = st_fail_errno(cause, -ENOMEM);
		goto out;
	}
	XXH64_reset(r.st, 0);
	posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
	struct load_ctx lc = { .path = path, .fingerprint = fingerprint, .note = note };
	rc = read_body(&r, &h, pool, part, &lc, &L, &body_why);
	if (rc == -EBADMSG && body_why && !strstr(body_why, "checksum") && part != BODY_META) {
		/* A layout error in a body that also fails its checksum is plain
		 * corruption: hash the rest to say so, rather than name whichever
		 * field the damage happened to hit. */
		if (rd_get(&r, NULL, (r.len - r.pos) + r.left) == 0 &&
		    XXH64_digest(r.st) != h.checksum)
			body_why = "corrupt (checksum mismatch)";
	}
	if (rc) {
		if (body_why)
			st_fail(cause, rc, "%s", body_why);
		else if (rc == -EBADMSG)
			st_fail(cause, rc, "truncated while reading");
		else if (rc == -ENOSPC)
			st_fail(cause, rc, "the KV cache is full");
		else if (rc == -ENOLINK && note)
			st_fail(cause, rc, "%s", note->bad_why);
		else
			st_fail_errno(cause, rc);
		goto out;
	}

	/* Verified: install. The session's (empty) arrays are replaced. */
	free(s->tokens);
	s->tokens = L.tokens;
	s->n_tokens = s->cap = (int)h.n_tokens;
	free(s->turns);
	s->turns = L.turns;
	s->n_turns = s->turns_cap = (int)h.n_turns;
	s->system = L.system;
	s->next_system = L.next_system;
	free(s->kv.blocks);
	s->kv.blocks = L.blocks;
	s->kv.n_blocks = s->kv.cap = L.n_blocks;
	s->n_cached = load_kv ? (int)h.n_cached : 0;
	/* K/V converted now, or by the daemon that saved it (version 3 without
	 * shared blocks): not what this daemon computes (session.h) */
	s->inexact = load_kv && (L.converted || (h.version >= 3 && h.n_refs == 0));
	s->tmpl = (int)h.tmpl;
	s->policy = (int)h.policy;
	s->last_use_ms = h.last_use_ms;
	s->prefilled = h.prefilled;
	s->generated = h.generated;
	if (note) {
		note->refs = L.refs;
		note->n_refs = (int)h.n_refs;
		L.refs = NULL;
	}
	free(L.refs);
	memset(&L, 0, sizeof(L));
	rc = 0;
out:
	loaded_free(&L, pool);
	XXH64_freeState(r.st);
	free(r.buf);
	close(fd);
	return rc;
}

int store_load(const char *path, struct session *s, struct kvpool *pool, uint64_t fingerprint,
	       int allow_foreign, char **cause)
{
	struct store_note note;
	return store_load_ex(path, s, pool, fingerprint, allow_foreign, &note, cause);
}

int store_load_ex(const char *path, struct session *s, struct kvpool *pool, uint64_t fingerprint,
		  int allow_foreign, struct store_note *note, char **cause)
{
	memset(note, 0, sizeof(*note));
	int rc = load(path, s, pool, fingerprint, allow_foreign, 0, 0, note, cause);
	if (rc == -ENOLINK) {  /* a block file failed: the history alone */
		if (cause) {
			free(*cause);
			*cause = NULL;
		}
		rc = load(path, s, pool, fingerprint, allow_foreign, 0, 1, note, cause);
	}
	if (rc) {
		free(note->refs);
		note->refs = NULL;
		note->n_refs = 0;
	}
	return rc;
}

int store_load_history(const char *path, struct session *s, char **cause)
{
	return load(path, s, NULL, 0, 1, 1, 0, NULL, cause);
}

int store_read_refs(const char *path, uid_t uid, const char *id, uint64_t **refs, int *n,
		    char **cause)
{
	struct session tmp = { .uid = uid };
	struct store_note note = { 0 };
	snprintf(tmp.id, sizeof(tmp.id), "%s", id);
	int rc = load(path, &tmp, NULL, 0, 1, 1, 0, &note, cause);
	*refs = note.refs;
	*n = note.n_refs;
	for (int i = 0; i < tmp.n_turns; i++)  /* only the names are wanted */
		free(tmp.turns[i].text);
	free(tmp.turns);
	free(tmp.tokens);
	free(tmp.system);
	free(tmp.next_system);
	return rc;
}

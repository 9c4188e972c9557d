/*
 * session/blocks.c — see blocks.h.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "session/blocks.h"
#include "util/cause.h"
#include "util/file.h"
#include "util/le.h"

/* Header field offsets (blocks.h lists the fields in this order). */
enum {
	B_MAGIC = 0,
	B_VERSION = 8,
	B_HEADER_BYTES = 12,
	B_NAME = 16,
	B_PARENT = 24,
	B_UID = 32,
	B_KV_DTYPE = 36,
	B_FINGERPRINT = 40,
	B_BLOCK_SIZE = 48,
	B_N_LAYERS = 52,
	B_KV_DIM = 56,
	B_ZERO = 60,
	B_BODY_BYTES = 64,
	B_CHECKSUM = 72,
	B_HEADER_SUM = 80,
	B_END = 88,
};
_Static_assert(B_END <= BLK_HEADER_BYTES, "block header fields overflow BLK_HEADER_BYTES");

uint64_t blk_file_bytes(const struct kt_kv *shape)
{
	return BLK_HEADER_BYTES + 4 * (uint64_t)shape->block_size + kt_kv_block_bytes(shape);
}

uint64_t blk_name(uint64_t parent, const int32_t *tokens, int block_size)
{
	uint64_t h = XXH64(tokens, (size_t)block_size * sizeof(int32_t), parent);
	return h ? h : 1;
}

void blk_file_name(char *buf, size_t cap, uint32_t uid, uint64_t name)
{
	snprintf(buf, cap, "%" PRIu32 "-%016" PRIx64 BLK_SUFFIX, uid, name);
}

int blk_parse_file_name(const char *fname, uint32_t *uid, uint64_t *name)
{
	unsigned long long u;
	char hex[17];
	int end = 0;
	if (sscanf(fname, "%llu-%16[0-9a-f]" BLK_SUFFIX "%n", &u, hex, &end) != 2 ||
	    fname[end] || strlen(hex) != 16 || u > UINT32_MAX || fname[0] == '-' ||
	    fname[0] == '+')
		return 0;
	char want[64];
	*uid = (uint32_t)u;
	*name = strtoull(hex, NULL, 16);
	blk_file_name(want, sizeof(want), *uid, *name);
	return !strcmp(want, fname);  /* one spelling per block */
}

int blk_open_dir(const char *dir, int create)
{
	char *path;
	if (asprintf(&path, "%s/" BLK_DIR, dir) < 0)
		return -ENOMEM;
	if (create && mkdir(path, 0700) < 0 && errno != EEXIST) {
		int e = -errno;
		free(path);
		return e;
	}
	/* never through a symbolic link: whoever could make blocks/ one would
	 * choose where the daemon writes */
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	int e = fd < 0 ? (errno == ENOTDIR ? -ELOOP : -errno) : fd;
	free(path);
	return e;
}

int blk_sync(int bdfd)
{
	return fsync(bdfd) < 0 && errno != EINVAL && errno != EROFS ? -errno : 0;
}

static uint32_t dtype_field(const struct kt_kv *kv)
{
	return (uint32_t)kv->dtype | (uint32_t)(kv->dtype == KT_Q8_0 ? kv->group : 0) << 8;
}

static int write_all(int fd, const void *buf, size_t n, off_t off)
{
	const unsigned char *p = buf;
	while (n) {
		ssize_t w = pwrite(fd, p, n, off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return w < 0 ? -errno : -EIO;
		p += w;
		n -= (size_t)w;
		off += w;
	}
	return 0;
}

int blk_write(int bdfd, const struct blk_meta *m, const int32_t *tokens, const void *kv,
	      const struct kt_kv *shape, uint64_t *bytes, char **cause)
{
	char name[64], tmp[128];
	blk_file_name(name, sizeof(name), m->uid, m->name);
	struct stat st;
	if (fstatat(bdfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
		*bytes = (uint64_t)st.st_size;
		return 0;
	}
	int bs = shape->block_size;
	size_t kvb = kt_kv_block_bytes(shape), tb = (size_t)bs * 4;
	uint64_t body = tb + kvb;
	unsigned char *buf = malloc(BLK_HEADER_BYTES + tb);
	if (!buf)
		return -ENOMEM;
	unsigned char *h = buf, *t = buf + BLK_HEADER_BYTES;
	for (int i = 0; i < bs; i++)
		put_le(t + 4 * i, (uint32_t)tokens[i], 4);
	XXH64_state_t *xs = XXH64_createState();
	if (!xs) {
		free(buf);
		return -ENOMEM;
	}
	XXH64_reset(xs, 0);
	XXH64_update(xs, t, tb);
	XXH64_update(xs, kv, kvb);
	memset(h, 0, BLK_HEADER_BYTES);
	memcpy(h + B_MAGIC, BLK_MAGIC, 8);
	put_le(h + B_VERSION, BLK_VERSION, 4);
	put_le(h + B_HEADER_BYTES, BLK_HEADER_BYTES, 4);
	put_le(h + B_NAME, m->name, 8);
	put_le(h + B_PARENT, m->parent, 8);
	put_le(h + B_UID, m->uid, 4);
	put_le(h + B_KV_DTYPE, dtype_field(shape), 4);
	put_le(h + B_FINGERPRINT, m->fingerprint, 8);
	put_le(h + B_BLOCK_SIZE, (uint32_t)bs, 4);
	put_le(h + B_N_LAYERS, (uint32_t)shape->n_layers, 4);
	put_le(h + B_KV_DIM, (uint32_t)shape->kv_dim, 4);
	put_le(h + B_BODY_BYTES, body, 8);
	put_le(h + B_CHECKSUM, XXH64_digest(xs), 8);
	put_le(h + B_HEADER_SUM, XXH64(h, B_HEADER_SUM, 0), 8);
	XXH64_freeState(xs);

	static atomic_uint counter;
	int fd = -1, rc;
	for (int tries = 0; tries < 100; tries++) {
		snprintf(tmp, sizeof(tmp), ".tmp-%s.%ld.%u", name, (long)getpid(),
			 atomic_fetch_add(&counter, 1));
		fd = openat(bdfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		if (fd >= 0 || errno != EEXIST)
			break;
	}
	if (fd < 0) {
		rc = -errno;
		cause_set(cause, "%s (creating block file %s)", strerror(-rc), name);
		free(buf);
		return rc;
	}
	rc = fchmod(fd, 0600) < 0 ? -errno : 0;
	if (!rc)
		rc = write_all(fd, buf, BLK_HEADER_BYTES + tb, 0);
	if (!rc)
		rc = write_all(fd, kv, kvb, (off_t)(BLK_HEADER_BYTES + tb));
	if (!rc && fsync(fd) < 0)
		rc = -errno;
	if (close(fd) < 0 && !rc)
		rc = -errno;
	if (!rc && renameat(bdfd, tmp, bdfd, name) < 0)
		rc = -errno;
	if (rc) {
		unlinkat(bdfd, tmp, 0);
		cause_set(cause, "%s (writing block file %s)", strerror(-rc), name);
	}
	free(buf);
	*bytes = blk_file_bytes(shape);
	return rc ? rc : 1;
}

void blk_convert(const struct kt_kv *from, const void *src, const struct kt_kv *to, void *dst,
		 float *scratch)
{
	struct kt_kv s = *from, d = *to;
	s.n_blocks = d.n_blocks = 1;
	s.base = (void *)src;
	d.base = dst;
	float *k = scratch, *v = scratch + from->kv_dim;
	for (int l = 0; l < s.n_layers; l++)
		for (int row = 0; row < s.block_size; row++) {
			kt_kv_get_k(&s, 0, l, row, k);
			kt_kv_get_v(&s, 0, l, row, v);
			kt_kv_put(&d, 0, l, row, k, v);
		}
}

__attribute__((format(printf, 4, 5)))
static int refuse(char *why, size_t whycap, int err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, whycap, fmt, ap);
	va_end(ap);
	return err;
}

int blk_read(int bdfd, const struct blk_meta *want, const int32_t *tokens,
	     const struct kt_kv *to, void *dst, char *why, size_t whycap)
{
	char name[64];
	blk_file_name(name, sizeof(name), want->uid, want->name);
	int fd = openat(bdfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0)
		return refuse(why, whycap, -errno, "%s", strerror(errno));
	int bs = to->block_size, rc = 0;
	unsigned char h[BLK_HEADER_BYTES];
	unsigned char *body = NULL;
	float *scratch = NULL;
	struct stat st;
	ssize_t got = 0;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		rc = refuse(why, whycap, -EBADMSG, "not a regular file");
		goto out;
	}
	got = pread(fd, h, sizeof(h), 0);
	if (got < (ssize_t)sizeof(h)) {
		rc = got < 0 ? refuse(why, whycap, -EIO, "%s", strerror(errno))
			     : refuse(why, whycap, -EBADMSG, "truncated: %lld bytes",
				      (long long)st.st_size);
		goto out;
	}
	if (memcmp(h + B_MAGIC, BLK_MAGIC, 8)) {
		rc = refuse(why, whycap, -EBADMSG, "not a llamad block file (bad magic)");
		goto out;
	}
	if (get_u32(h + B_VERSION) != BLK_VERSION) {
		rc = refuse(why, whycap, -EPROTO, "block file format version %" PRIu32 " unknown",
			    get_u32(h + B_VERSION));
		goto out;
	}
	int pad_ok = 1;
	for (int i = B_END; i < BLK_HEADER_BYTES; i++)
		pad_ok &= h[i] == 0;
	if (get_u64(h + B_HEADER_SUM) != XXH64(h, B_HEADER_SUM, 0) || !pad_ok ||
	    get_u32(h + B_HEADER_BYTES) != BLK_HEADER_BYTES || get_u32(h + B_ZERO)) {
		rc = refuse(why, whycap, -EBADMSG, "corrupt header");
		goto out;
	}
	uint64_t name_in = get_u64(h + B_NAME), parent = get_u64(h + B_PARENT);
	uint32_t uid = get_u32(h + B_UID), dt = get_u32(h + B_KV_DTYPE);
	if (name_in != want->name || uid != want->uid) {
		rc = refuse(why, whycap, -EBADMSG, "holds block %016" PRIx64 " of uid %" PRIu32
			    ": its file name does not match its content", name_in, uid);
		goto out;
	}
	if (parent != want->parent) {
		rc = refuse(why, whycap, -EBADMSG, "follows block %016" PRIx64 ", not %016" PRIx64,
			    parent, want->parent);
		goto out;
	}
	if (get_u64(h + B_FINGERPRINT) != want->fingerprint) {
		rc = refuse(why, whycap, -ESTALE, "written under another model");
		goto out;
	}
	if (get_u32(h + B_BLOCK_SIZE) != (uint32_t)bs ||
	    get_u32(h + B_N_LAYERS) != (uint32_t)to->n_layers ||
	    get_u32(h + B_KV_DIM) != (uint32_t)to->kv_dim) {
		rc = refuse(why, whycap, -ESTALE, "another KV layout");
		goto out;
	}
	struct kt_kv from = *to;
	from.dtype = (enum kt_dtype)(dt & 0xff);
	from.group = (int)(dt >> 8);
	int type_ok = (from.dtype == KT_F32 || from.dtype == KT_F16) ? from.group == 0
		      : from.dtype == KT_Q8_0 && (from.group == 8 || from.group == 16 ||
						  from.group == 32) && bs == 16 &&
			to->kv_dim % from.group == 0 && (to->kv_dim / from.group) > 0;
	if (!type_ok) {
		rc = refuse(why, whycap, -EPROTO, "KV element type %" PRIu32 " not supported", dt);
		goto out;
	}
	size_t tb = (size_t)bs * 4, kvb = kt_kv_block_bytes(&from);
	uint64_t body_bytes = get_u64(h + B_BODY_BYTES);
	if (body_bytes != tb + kvb || (uint64_t)st.st_size != BLK_HEADER_BYTES + body_bytes) {
		rc = refuse(why, whycap, -EBADMSG, "%lld bytes, its header says %llu",
			    (long long)st.st_size, (unsigned long long)(BLK_HEADER_BYTES + body_bytes));
		goto out;
	}
	body = malloc(tb + kvb);
	if (!body) {
		rc = refuse(why, whycap, -ENOMEM, "out of memory");
		goto out;
	}
	got = pread(fd, body, tb + kvb, BLK_HEADER_BYTES);
	if (got != (ssize_t)(tb + kvb)) {
		rc = got < 0 ? refuse(why, whycap, -EIO, "%s", strerror(errno))
			     : refuse(why, whycap, -EBADMSG, "truncated while reading");
		goto out;
	}
	if (XXH64(body, tb + kvb, 0) != get_u64(h + B_CHECKSUM)) {
		rc = refuse(why, whycap, -EBADMSG, "corrupt (checksum mismatch)");
		goto out;
	}
	int32_t *tok = (int32_t *)body;  /* read in place, little-endian */
	for (int i = 0; i < bs; i++)
		tok[i] = (int32_t)get_u32(body + 4 * i);
	if (memcmp(tok, tokens, tb)) {
		rc = refuse(why, whycap, -EBADMSG, "holds other tokens than its session's");
		goto out;
	}
	if (blk_name(parent, tok, bs) != want->name) {
		rc = refuse(why, whycap, -EBADMSG, "its name does not match its content");
		goto out;
	}
	if (from.dtype == to->dtype && from.group == to->group) {
		memcpy(dst, body + tb, kvb);
	} else {
		rc = 1;  /* converted */
		scratch = malloc(2 * (size_t)to->kv_dim * sizeof(float));
		if (!scratch) {
			rc = refuse(why, whycap, -ENOMEM, "out of memory");
			goto out;
		}
		blk_convert(&from, body + tb, to, dst, scratch);
	}
out:
	free(scratch);
	free(body);
	close(fd);
	return rc;
}

/* ---- reference counts ----------------------------------------------- */

static size_t ref_slot(const struct blk_refs *m, uint32_t uid, uint64_t name)
{
	uint64_t k = name ^ ((uint64_t)uid * 0x9e3779b97f4a7c15ull);
	return (size_t)(k ^ (k >> 29)) & (m->cap - 1);
}

struct blk_ref *blk_refs_get(struct blk_refs *m, uint32_t uid, uint64_t name)
{
	if (!m->cap)
		return NULL;
	for (size_t i = ref_slot(m, uid, name); m->v[i].count; i = (i + 1) & (m->cap - 1))
		if (m->v[i].name == name && m->v[i].uid == uid)
			return &m->v[i];
	return NULL;
}

static int refs_grow(struct blk_refs *m)
{
	size_t cap = m->cap ? m->cap * 2 : 64;
	struct blk_ref *old = m->v, *v = calloc(cap, sizeof(*v));
	if (!v)
		return -ENOMEM;
	size_t ocap = m->cap;
	m->v = v;
	m->cap = cap;
	for (size_t i = 0; i < ocap; i++) {
		if (!old[i].count)
			continue;
		size_t j = ref_slot(m, old[i].uid, old[i].name);
		while (v[j].count)
			j = (j + 1) & (cap - 1);
		v[j] = old[i];
	}
	free(old);
	return 0;
}

int blk_refs_inc(struct blk_refs *m, uint32_t uid, uint64_t name)
{
	struct blk_ref *r = blk_refs_get(m, uid, name);
	if (r) {
		r->count++;
		return 0;
	}
	if ((m->n + 1) * 2 > m->cap && refs_grow(m) != 0)
		return -ENOMEM;
	size_t i = ref_slot(m, uid, name);
	while (m->v[i].count)
		i = (i + 1) & (m->cap - 1);
	m->v[i] = (struct blk_ref){ .name = name, .uid = uid, .count = 1 };
	m->n++;
	return 0;
}

int blk_refs_dec(struct blk_refs *m, uint32_t uid, uint64_t name)
{
	struct blk_ref *r = blk_refs_get(m, uid, name);
	if (!r)
		return -ENOENT;
	if (--r->count)
		return (int)r->count;
	m->bytes -= r->bytes;
	m->n--;
	/* backward-shift deletion (as the pool's name index) */
	size_t mask = m->cap - 1, i = (size_t)(r - m->v), j = i;
	for (;;) {
		m->v[i] = (struct blk_ref){ 0 };
		for (;;) {
			j = (j + 1) & mask;
			if (!m->v[j].count)
				return 0;
			size_t home = ref_slot(m, m->v[j].uid, m->v[j].name);
			if (((j - home) & mask) >= ((j - i) & mask))
				break;
		}
		m->v[i] = m->v[j];
		i = j;
	}
}

void blk_refs_set_bytes(struct blk_refs *m, struct blk_ref *r, uint64_t bytes)
{
	m->bytes += bytes - r->bytes;
	r->bytes = bytes;
}

void blk_refs_free(struct blk_refs *m)
{
	free(m->v);
	memset(m, 0, sizeof(*m));
}

/* ---- collection ------------------------------------------------------ */

int blk_collect(const char *dir, struct blk_refs *m,
		void (*report)(void *ctx, const char *name, const char *reason), void *ctx)
{
	int bdfd = blk_open_dir(dir, 0);
	if (bdfd < 0)
		return bdfd;
	DIR *d = fdopendir(bdfd);
	if (!d) {
		int e = -errno;
		close(bdfd);
		return e;
	}
	int removed = 0, rc = 0;
	char why[160];
	for (;;) {
		struct dirent *de = file_readdir(d, &rc);
		if (!de)
			break;
		const char *fname = de->d_name;
		uint32_t uid;
		uint64_t name;
		int tmp = !strncmp(fname, ".tmp-", 5);
		if (!tmp && !blk_parse_file_name(fname, &uid, &name))
			continue;  /* not ours (set-aside files included) */
		struct blk_ref *r = tmp ? NULL : blk_refs_get(m, uid, name);
		if (r) {
			struct stat st;
			if (fstatat(bdfd, fname, &st, AT_SYMLINK_NOFOLLOW) == 0)
				blk_refs_set_bytes(m, r, (uint64_t)st.st_size);
			continue;
		}
		if (unlinkat(bdfd, fname, 0) == 0) {
			removed++;
			snprintf(why, sizeof(why), "removed (%s)", tmp ? "left by an interrupted write"
								: "no saved session refers to it");
		} else {
			snprintf(why, sizeof(why), "cannot remove it: %s", strerror(errno));
		}
		if (report)
			report(ctx, fname, why);
	}
	if (removed)
		blk_sync(bdfd);
	closedir(d);
	return rc ? rc : removed;
}

int blk_remove(const char *dir, uint32_t uid, uint64_t name)
{
	int bdfd = blk_open_dir(dir, 0);
	if (bdfd < 0)
		return bdfd == -ENOENT ? 0 : bdfd;
	char fname[64];
	blk_file_name(fname, sizeof(fname), uid, name);
	int rc = unlinkat(bdfd, fname, 0) < 0 && errno != ENOENT ? -errno : 0;
	close(bdfd);
	return rc;
}

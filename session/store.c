/*
 * session/store.c — see store.h.
 *
 * Everything read from a file is untrusted: every count and length is checked
 * against fixed bounds and against the bytes the file really has before it
 * sizes an allocation or a read, and nothing reaches the caller's session
 * before the body checksum has been verified.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "session/blocks.h"
#include "session/store.h"
#include "util/cause.h"
#include "util/le.h"

/* Header field offsets (store.h lists the fields in this order). */
enum {
	H_MAGIC = 0,
	H_VERSION = 8,
	H_HEADER_BYTES = 12,
	H_FINGERPRINT = 16,
	H_KV_DTYPE = 24,
	H_BLOCK_SIZE = 28,
	H_N_LAYERS = 32,
	H_KV_DIM = 36,
	H_N_TOKENS = 40,
	H_N_CACHED = 44,
	H_N_TURNS = 48,
	H_UID = 52,
	H_TMPL = 56,
	H_POLICY = 60,
	H_FLAGS = 64,                            /* version 3: n_refs */
	H_LAST_USE_MS = 68,
	H_PREFILLED = 76,
	H_GENERATED = 84,
	H_BODY_BYTES = 92,
	H_ID = 100,
	H_CHECKSUM = H_ID + SESSION_ID_MAX + 1,  /* 229 */
	H_META_SUM = H_CHECKSUM + 8,             /* 237 (version 2) */
	H_HEADER_SUM = H_META_SUM + 8,           /* 245 (version 1: 237) */
	H_END = H_HEADER_SUM + 8,                /* 253; zero padding up to 256 */
	H_HEADER_SUM_V1 = H_CHECKSUM + 8,
	H_END_V1 = H_HEADER_SUM_V1 + 8,
};
_Static_assert(H_END <= STORE_HEADER_BYTES, "store header fields overflow STORE_HEADER_BYTES");
_Static_assert(sizeof(STORE_MAGIC) - 1 == 8, "store magic is 8 bytes");

/* Sanity bounds for what a file may claim. */
#define MAX_TOKENS     (1u << 24)
#define MAX_TURNS      (1u << 24)
#define MAX_BLOCK_SIZE (1u << 16)
#define MAX_LAYERS     (1u << 16)
#define MAX_KV_DIM     (1u << 20)
#define MAX_ROLE       CHAT_ROLE_MAX
/* Highest enum sess_template / sess_policy value: raise with the enums. */
#define MAX_TMPL       CHAT_TEMPLATE_MAX
#define MAX_POLICY     SESS_CTX_SHIFT

#define NO_TEXT    0xffffffffu      /* text_len of an absent text */
/* start i32 + role u8 (+ end u8 from version 2) + text_len u32 */
#define TURN_FIXED(version) ((version) >= 2 ? 10u : 9u)
#define IO_CHUNK   ((size_t)4 << 20) /* read/write buffer */
/* Spans at least this large skip the buffer (KV blocks, long texts). */
#define IO_DIRECT  (IO_CHUNK / 2)

/* ---- messages ----------------------------------------------------------- */

/* *cause = the reason, formatted (no path: the caller knows the file;
 * left NULL if out of memory). Returns err, a negative errno. */
__attribute__((format(printf, 3, 4)))
static int fail(char **cause, int err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	cause_vset(cause, fmt, ap);
	va_end(ap);
	return err;
}

static int fail_errno(char **cause, int err)
{
	return fail(cause, err, "%s", strerror(-err));
}

/* ---- paths ------------------------------------------------------------ */

/* "<uid>-<id>.session" into buf (at least NAME_MAX + 1 bytes). */
static void file_name(char *buf, size_t cap, uid_t uid, const char *id)
{
	snprintf(buf, cap, "%u-%s.session", (unsigned)uid, id);
}

/* The id is checked so that a name can never leave dir ("/" and NUL are not
 * in the id alphabet; a dotted id like ".." gets the uid in front). */
char *store_path(const char *dir, uid_t uid, const char *id)
{
	if (!dir || !id || !sess_id_valid(id)) {
		errno = EINVAL;
		return NULL;
	}
	char *p;
	if (asprintf(&p, "%s/%u-%s.session", dir, (unsigned)uid, id) < 0)
		return NULL;
	return p;
}

/* ---- raw I/O -------------------------------------------------------------- */

/* Write all n bytes at off, through short writes and EINTR. 0 or -errno. */
static int pwrite_all(int fd, const void *buf, size_t n, uint64_t off)
{
	const unsigned char *p = buf;
	while (n) {
		ssize_t w = pwrite(fd, p, n, (off_t)off);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (w == 0)
			return -EIO;
		p += w;
		n -= (size_t)w;
		off += (uint64_t)w;
	}
	return 0;
}

/* Read n bytes at off. Returns the count read (< n only at end of file) or
 * -errno. */
static ssize_t pread_all(int fd, void *buf, size_t n, uint64_t off)
{
	unsigned char *p = buf;
	size_t got = 0;
	while (got < n) {
		ssize_t r = pread(fd, p + got, n - got, (off_t)(off + got));
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (r == 0)
			break;
		got += (size_t)r;
	}
	return (ssize_t)got;
}

/* ---- header ------------------------------------------------------------- */

struct hdr {
	uint32_t version, header_bytes;
	uint64_t fingerprint;
	uint32_t kv_dtype, block_size, n_layers, kv_dim;  /* kv_dtype as in the file */
	uint32_t n_tokens, n_cached, n_turns;
	uint32_t uid, tmpl, policy, flags;
	int64_t last_use_ms;
	uint64_t prefilled, generated, body_bytes;
	char id[SESSION_ID_MAX + 1];
	uint64_t checksum;
	uint64_t meta_sum;        /* version 2: XXH64 of the body before the K/V */
	uint32_t n_refs;          /* version 3: full blocks kept as block files */
	/* derived */
	uint32_t n_blocks;        /* ceil(n_cached / block_size) */
	struct kt_kv shape;       /* the file's KV shape and element type (no base) */
	uint64_t block_bytes;     /* of the file's KV shape */
	uint64_t kv_bytes;        /* (n_blocks - n_refs) * block_bytes: inline */
};

static void hdr_build(unsigned char b[STORE_HEADER_BYTES], const struct hdr *h)
{
	memset(b, 0, STORE_HEADER_BYTES);
	memcpy(b + H_MAGIC, STORE_MAGIC, 8);
	put_le(b + H_VERSION, h->version, 4);
	put_le(b + H_HEADER_BYTES, STORE_HEADER_BYTES, 4);
	put_le(b + H_FINGERPRINT, h->fingerprint, 8);
	put_le(b + H_KV_DTYPE, h->kv_dtype, 4);
	put_le(b + H_BLOCK_SIZE, h->block_size, 4);
	put_le(b + H_N_LAYERS, h->n_layers, 4);
	put_le(b + H_KV_DIM, h->kv_dim, 4);
	put_le(b + H_N_TOKENS, h->n_tokens, 4);
	put_le(b + H_N_CACHED, h->n_cached, 4);
	put_le(b + H_N_TURNS, h->n_turns, 4);
	put_le(b + H_UID, h->uid, 4);
	put_le(b + H_TMPL, h->tmpl, 4);
	put_le(b + H_POLICY, h->policy, 4);
	put_le(b + H_FLAGS, h->version >= 3 ? h->n_refs : h->flags, 4);
	put_le(b + H_LAST_USE_MS, (uint64_t)h->last_use_ms, 8);
	put_le(b + H_PREFILLED, h->prefilled, 8);
	put_le(b + H_GENERATED, h->generated, 8);
	put_le(b + H_BODY_BYTES, h->body_bytes, 8);
	memcpy(b + H_ID, h->id, strlen(h->id));  /* the rest stays NUL */
	put_le(b + H_CHECKSUM, h->checksum, 8);
	put_le(b + H_META_SUM, h->meta_sum, 8);
	put_le(b + H_HEADER_SUM, XXH64(b, H_HEADER_SUM, 0), 8);
}

/*
 * Parse and validate the first `got` bytes of a file of file_bytes bytes
 * (got = min(file_bytes, STORE_HEADER_BYTES)): magic, version, header
 * checksum, every field's bounds, and that the body has exactly the size the
 * header claims and can hold what the counts need. 0, or a negative errno
 * with a one-line reason in why: -EPROTO (not ours, other version, unknown
 * feature) or -EBADMSG (corrupt or truncated).
 */
static int hdr_parse(const unsigned char *b, size_t got, uint64_t file_bytes, struct hdr *h,
		     char *why, size_t whycap)
{
	memset(h, 0, sizeof(*h));
	if (got < 8 || (got < 12 && !memcmp(b, STORE_MAGIC, 8))) {
		snprintf(why, whycap, "truncated: %" PRIu64 " bytes, shorter than the %d-byte header",
			 file_bytes, STORE_HEADER_BYTES);
		return -EBADMSG;
	}
	if (memcmp(b + H_MAGIC, STORE_MAGIC, 8)) {
		snprintf(why, whycap, "not a llamad session file (bad magic)");
		return -EPROTO;
	}
	/* The version is checked before the header checksum: another version may
	 * lay its header out differently. */
	h->version = get_u32(b + H_VERSION);
	if (h->version < 1 || h->version > STORE_VERSION) {
		snprintf(why, whycap, "written by %s llamad (format version %" PRIu32 ")",
			 h->version > STORE_VERSION ? "a newer" : "an older", h->version);
		return -EPROTO;
	}
	if (got < STORE_HEADER_BYTES) {
		snprintf(why, whycap, "truncated: %" PRIu64 " bytes, shorter than the %d-byte header",
			 file_bytes, STORE_HEADER_BYTES);
		return -EBADMSG;
	}
	int hsum = h->version >= 2 ? H_HEADER_SUM : H_HEADER_SUM_V1;
	if (get_u64(b + hsum) != XXH64(b, (size_t)hsum, 0)) {
		snprintf(why, whycap, "corrupt header (checksum mismatch)");
		return -EBADMSG;
	}
	/* The padding is outside header_sum: require it zero so that no header
	 * byte goes unchecked. */
	for (int i = hsum + 8; i < STORE_HEADER_BYTES; i++) {
		if (b[i]) {
			snprintf(why, whycap, "corrupt header (non-zero padding)");
			return -EBADMSG;
		}
	}
	h->header_bytes = get_u32(b + H_HEADER_BYTES);
	h->fingerprint = get_u64(b + H_FINGERPRINT);
	h->kv_dtype = get_u32(b + H_KV_DTYPE);
	h->block_size = get_u32(b + H_BLOCK_SIZE);
	h->n_layers = get_u32(b + H_N_LAYERS);
	h->kv_dim = get_u32(b + H_KV_DIM);
	h->n_tokens = get_u32(b + H_N_TOKENS);
	h->n_cached = get_u32(b + H_N_CACHED);
	h->n_turns = get_u32(b + H_N_TURNS);
	h->uid = get_u32(b + H_UID);
	h->tmpl = get_u32(b + H_TMPL);
	h->policy = get_u32(b + H_POLICY);
	h->flags = h->version >= 3 ? 0 : get_u32(b + H_FLAGS);
	h->n_refs = h->version >= 3 ? get_u32(b + H_FLAGS) : 0;
	h->last_use_ms = (int64_t)get_u64(b + H_LAST_USE_MS);
	h->prefilled = get_u64(b + H_PREFILLED);
	h->generated = get_u64(b + H_GENERATED);
	h->body_bytes = get_u64(b + H_BODY_BYTES);
	h->checksum = get_u64(b + H_CHECKSUM);
	h->meta_sum = h->version >= 2 ? get_u64(b + H_META_SUM) : 0;

	if (h->header_bytes != STORE_HEADER_BYTES) {
		snprintf(why, whycap, "corrupt header (header_bytes %" PRIu32 ")", h->header_bytes);
		return -EBADMSG;
	}
	if (h->flags) {
		snprintf(why, whycap, "uses unknown flags 0x%" PRIx32, h->flags);
		return -EPROTO;
	}
	/* kv_dtype: the element type in the low byte, q8_0's channels per
	 * scale in the next (store.h) */
	uint32_t kt = h->kv_dtype & 0xff, kg = h->kv_dtype >> 8;
	int type_ok = (kt == KT_F32 || kt == KT_F16) ? kg == 0
		      : kt == KT_Q8_0 && (kg == 8 || kg == 16 || kg == 32) &&
			h->kv_dim % kg == 0 && h->block_size == 16;
	if (!type_ok || (kt != KT_F32 && h->block_size != 16)) {
		snprintf(why, whycap, "KV element type %" PRIu32 " (group %" PRIu32 ", block_size %"
			 PRIu32 ") is not supported", kt, kg, h->block_size);
		return -EPROTO;
	}
	/* id: NUL-terminated inside its field, NUL-padded, valid */
	const unsigned char *id = b + H_ID;
	const unsigned char *nul = memchr(id, 0, SESSION_ID_MAX + 1);
	int id_ok = nul != NULL;
	for (const unsigned char *p = nul; id_ok && p < id + SESSION_ID_MAX + 1; p++)
		id_ok = *p == 0;
	if (id_ok) {
		memcpy(h->id, id, (size_t)(nul - id) + 1);
		id_ok = sess_id_valid(h->id);
	}
	if (!id_ok) {
		snprintf(why, whycap, "corrupt header (bad session id)");
		return -EBADMSG;
	}
	if (h->block_size < 1 || h->block_size > MAX_BLOCK_SIZE || h->n_layers < 1 ||
	    h->n_layers > MAX_LAYERS || h->kv_dim < 1 || h->kv_dim > MAX_KV_DIM) {
		snprintf(why, whycap, "corrupt header (KV shape: block_size %" PRIu32
			 ", %" PRIu32 " layers, kv_dim %" PRIu32 ")",
			 h->block_size, h->n_layers, h->kv_dim);
		return -EBADMSG;
	}
	if (h->n_tokens > MAX_TOKENS || h->n_cached > h->n_tokens || h->n_turns > MAX_TURNS) {
		snprintf(why, whycap, "corrupt header (%" PRIu32 " tokens, %" PRIu32 " cached, %"
			 PRIu32 " turns)", h->n_tokens, h->n_cached, h->n_turns);
		return -EBADMSG;
	}
	if (h->tmpl < 1 || h->tmpl > MAX_TMPL || h->policy < 1 || h->policy > MAX_POLICY) {
		snprintf(why, whycap, "corrupt header (template %" PRIu32 ", context policy %"
			 PRIu32 ")", h->tmpl, h->policy);
		return -EBADMSG;
	}
	/* Sizes. The shape bounds keep block_bytes under 2^55; the product with
	 * the block count may still overflow. */
	h->n_blocks = (h->n_cached + h->block_size - 1) / h->block_size;
	if (h->n_refs > h->n_cached / h->block_size) {
		snprintf(why, whycap, "corrupt header (%" PRIu32 " shared blocks of %" PRIu32
			 " cached tokens)", h->n_refs, h->n_cached);
		return -EBADMSG;
	}
	h->shape = (struct kt_kv){ .block_size = (int)h->block_size, .n_layers = (int)h->n_layers,
				   .kv_dim = (int)h->kv_dim, .dtype = (enum kt_dtype)kt,
				   .group = (int)kg };
	h->block_bytes = kt_kv_block_bytes(&h->shape);
	uint64_t meta_min = 4 * (uint64_t)h->n_tokens +
			    TURN_FIXED(h->version) * (uint64_t)h->n_turns + 8 +
			    (h->version >= 3 ? 8 + 8 * (uint64_t)h->n_refs : 0);
	if (__builtin_mul_overflow((uint64_t)(h->n_blocks - h->n_refs), h->block_bytes,
				   &h->kv_bytes) ||
	    h->body_bytes < h->kv_bytes || h->body_bytes - h->kv_bytes < meta_min ||
	    h->body_bytes > UINT64_MAX - STORE_HEADER_BYTES) {
		snprintf(why, whycap, "corrupt header (body of %" PRIu64 " bytes cannot hold %" PRIu32
			 " tokens, %" PRIu32 " turns and %" PRIu32 " KV blocks)",
			 h->body_bytes, h->n_tokens, h->n_turns, h->n_blocks);
		return -EBADMSG;
	}
	uint64_t want = STORE_HEADER_BYTES + h->body_bytes;
	if (file_bytes != want) {
		snprintf(why, whycap, "%s: %" PRIu64 " bytes, header says %" PRIu64,
			 file_bytes < want ? "truncated" : "corrupt", file_bytes, want);
		return -EBADMSG;
	}
	return 0;
}

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
	int rc = pwrite_all(w->fd, w->buf, w->len, w->off);
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
		rc = pwrite_all(w->fd, p, n, w->off);
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
		return fail(cause, -EIO, "the blocks folder is a symbolic link or not a folder: "
			    "not followed");
	if (bdfd < 0)
		return fail(cause, bdfd, "cannot open the blocks folder: %s", strerror(-bdfd));
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
		fail(cause, rc, "cannot sync the blocks folder: %s", strerror(-rc));
	if (rc && !(cause && *cause))
		fail_errno(cause, rc);
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
		return errno == EINVAL ? fail(cause, -EINVAL, "cannot save: invalid session id")
				       : -ENOMEM;
	struct hdr h;
	char why[256];
	int n_refs = ch ? ch->n : 0;
	int rc = save_check(s, n_cached, n_refs, pool, fingerprint, &h, why, sizeof(why));
	if (rc) {
		fail(cause, rc, "%s", why);
		free(path);
		return rc;
	}
	/* the block files this save writes: nothing refers to them until the
	 * state file is renamed into place, and a failed save removes them */
	uint8_t *fresh = n_refs ? calloc((size_t)n_refs, 1) : NULL;
	if (n_refs && !fresh) {
		free(path);
		return fail_errno(cause, -ENOMEM);
	}
	if (n_refs && (rc = write_blocks(dir, s, pool, ch, fingerprint, written, fresh, cause))) {
		forget_blocks(dir, s, ch, fresh);
		free(fresh);
		free(path);
		return rc;
	}

	char name[NAME_MAX + 1], tmp[NAME_MAX + 64];  /* both well under NAME_MAX */
	file_name(name, sizeof(name), s->uid, s->id);
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		rc = fail_errno(cause, -errno);
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
		rc = fail_errno(cause, -errno);
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
	hdr_build(hb, &h);
	rc = pwrite_all(fd, hb, sizeof(hb), 0);
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
		fail(cause, rc, "saved, but syncing the folder failed: %s", strerror(errno));
	}
out:
	if (rc && !(cause && *cause))
		fail_errno(cause, rc);
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
	ssize_t got = pread_all(r->fd, p, n, r->off);
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
		return fail(cause, -EINVAL, "cannot load into a session that is not empty");

	/* O_NONBLOCK: a FIFO planted under the name must not hang the open. */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0)
		return fail_errno(cause, -errno);
	struct rd r = { .fd = fd, .off = STORE_HEADER_BYTES };
	struct loaded L = { 0 };
	struct hdr h;
	char why[256];
	const char *body_why = NULL;
	int rc;
	struct stat st;
	if (fstat(fd, &st) < 0) {
		rc = fail_errno(cause, -errno);
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = fail(cause, -EINVAL, "not a regular file");
		goto out;
	}
	unsigned char hb[STORE_HEADER_BYTES];
	ssize_t got = pread_all(fd, hb, sizeof(hb), 0);
	if (got < 0) {
		rc = fail_errno(cause, (int)got);
		goto out;
	}
	rc = hdr_parse(hb, (size_t)got, (uint64_t)st.st_size, &h, why, sizeof(why));
	if (rc) {
		fail(cause, rc, "%s", why);
		goto out;
	}
	if (h.uid != (uint32_t)s->uid || strcmp(h.id, s->id)) {
		rc = fail(cause, -EINVAL, "holds session '%s' of uid %" PRIu32
			  ", not '%s' of uid %u", h.id, h.uid, s->id, (unsigned)s->uid);
		goto out;
	}

	/* Whose cache is it? Foreign or differently shaped K/V is only skipped
	 * (and the history kept) when the caller allows it. */
	int same_model = !history_only && h.fingerprint == fingerprint;
	int same_shape = history_only || h.n_cached == 0 || shape_matches(&h, pool);
	if (!same_model && !allow_foreign) {
		rc = fail(cause, -ESTALE, "saved under a different model (fingerprint %016"
			  PRIx64 ", this model %016" PRIx64 ")", h.fingerprint, fingerprint);
		goto out;
	}
	if (!same_shape && !allow_foreign) {
		rc = fail(cause, -ESTALE, "saved with a different KV layout (block_size %"
			  PRIu32 ", %" PRIu32 " layers, kv_dim %" PRIu32 "; the cache has %d, %d, %d)",
			  h.block_size, h.n_layers, h.kv_dim, pool->kv.block_size,
			  pool->kv.n_layers, pool->kv.kv_dim);
		goto out;
	}
	int load_kv = !no_kv && same_model && same_shape && h.n_cached > 0;
	if (load_kv && h.n_blocks > (uint32_t)kvpool_n_free(pool)) {
		rc = fail(cause, -ENOSPC, "the KV cache is full (%" PRIu32
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
		rc = fail_errno(cause, -ENOMEM);
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
			fail(cause, rc, "%s", body_why);
		else if (rc == -EBADMSG)
			fail(cause, rc, "truncated while reading");
		else if (rc == -ENOSPC)
			fail(cause, rc, "the KV cache is full");
		else if (rc == -ENOLINK && note)
			fail(cause, rc, "%s", note->bad_why);
		else
			fail_errno(cause, rc);
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

/* ---- list, remove ------------------------------------------------------- */

static int has_suffix(const char *s, const char *suf)
{
	size_t n = strlen(s), k = strlen(suf);
	return n > k && !strcmp(s + n - k, suf);
}

int store_is_temp_name(const char *name)
{
	return !strncmp(name, ".tmp-", 5);
}

static int entry_cmp(const void *a, const void *b)
{
	return strcmp(((const struct store_entry *)a)->path, ((const struct store_entry *)b)->path);
}

/* Read and check the header of dir/name. 0 with e filled (e->path not set),
 * or -1 with a reason in why. */
static int list_one(int dfd, const char *name, struct store_entry *e, char *why, size_t whycap)
{
	int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0) {
		snprintf(why, whycap, "cannot open: %s", strerror(errno));
		return -1;
	}
	struct stat st;
	unsigned char hb[STORE_HEADER_BYTES];
	struct hdr h;
	int rc = -1;
	ssize_t got;
	if (fstat(fd, &st) < 0)
		snprintf(why, whycap, "cannot stat: %s", strerror(errno));
	else if (!S_ISREG(st.st_mode))
		snprintf(why, whycap, "not a regular file");
	else if ((got = pread_all(fd, hb, sizeof(hb), 0)) < 0)
		snprintf(why, whycap, "cannot read: %s", strerror((int)-got));
	else if (hdr_parse(hb, (size_t)got, (uint64_t)st.st_size, &h, why, whycap) == 0)
		rc = 0;
	close(fd);
	if (rc)
		return rc;
	/* The name must be the one store_path gives for its contents, or a save
	 * of that session would write a second file. */
	char want[NAME_MAX + 1];
	file_name(want, sizeof(want), (uid_t)h.uid, h.id);
	if (strcmp(want, name)) {
		snprintf(why, whycap, "file name does not match its contents (session '%s' of uid %"
			 PRIu32 ")", h.id, h.uid);
		return -1;
	}
	memset(e, 0, sizeof(*e));
	memcpy(e->id, h.id, sizeof(e->id));
	e->uid = (uid_t)h.uid;
	e->fingerprint = h.fingerprint;
	e->n_tokens = h.n_tokens;
	e->n_cached = h.n_cached;
	e->n_turns = h.n_turns;
	e->tmpl = h.tmpl;
	e->policy = h.policy;
	e->prefilled = h.prefilled;
	e->generated = h.generated;
	e->last_use_ms = h.last_use_ms;
	e->file_bytes = (uint64_t)st.st_size;
	e->n_refs = h.n_refs;
	return 0;
}

/* Entries come sorted by path. A ".tmp-" file is removed whatever its age:
 * call this when no save into dir is in progress (at startup). */
int store_list(const char *dir, struct store_entry **entries,
	       void (*report)(void *ctx, const char *path, const char *reason), void *ctx)
{
	*entries = NULL;
	DIR *d = opendir(dir);
	if (!d)
		return -errno;
	struct store_entry *v = NULL;
	int n = 0, cap = 0, rc = 0;
	char why[320];
	for (;;) {
		errno = 0;
		struct dirent *de = readdir(d);
		if (!de) {
			rc = errno ? -errno : 0;
			break;
		}
		const char *name = de->d_name;
		int is_tmp = store_is_temp_name(name);
		if (!is_tmp && !has_suffix(name, ".session"))
			continue;
		char *path;
		if (asprintf(&path, "%s/%s", dir, name) < 0) {
			rc = -ENOMEM;
			break;
		}
		if (is_tmp) {
			if (unlinkat(dirfd(d), name, 0) == 0)
				snprintf(why, sizeof(why), "removed (left by an interrupted write)");
			else
				snprintf(why, sizeof(why), "cannot remove this leftover of an "
					 "interrupted write: %s", strerror(errno));
			if (report)
				report(ctx, path, why);
			free(path);
			continue;
		}
		struct store_entry e;
		if (list_one(dirfd(d), name, &e, why, sizeof(why)) < 0) {
			if (report)
				report(ctx, path, why);
			free(path);
			continue;
		}
		if (n == cap) {
			int nc = cap ? cap * 2 : 16;
			struct store_entry *nv = realloc(v, (size_t)nc * sizeof(*nv));
			if (!nv) {
				free(path);
				rc = -ENOMEM;
				break;
			}
			v = nv;
			cap = nc;
		}
		e.path = path;
		v[n++] = e;
	}
	closedir(d);
	if (rc) {
		store_entries_free(v, n);
		return rc;
	}
	if (n > 1)
		qsort(v, (size_t)n, sizeof(*v), entry_cmp);
	*entries = v;
	return n;
}

void store_entries_free(struct store_entry *e, int n)
{
	if (!e)
		return;
	for (int i = 0; i < n; i++)
		free(e[i].path);
	free(e);
}

/* The folder is synced (best effort) so that a removed session does not come
 * back after a crash. */
int store_remove(const char *dir, uid_t uid, const char *id)
{
	char *path = store_path(dir, uid, id);
	if (!path)
		return errno == EINVAL ? -EINVAL : -ENOMEM;
	int rc = unlink(path) < 0 && errno != ENOENT ? -errno : 0;
	free(path);
	if (rc == 0) {
		int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd >= 0) {
			fsync(dfd);
			close(dfd);
		}
	}
	return rc;
}

/* ---- set aside ------------------------------------------------------------ */

/* Rename from to `to` unless `to` exists: 0, -EEXIST or -errno. */
static int rename_noreplace(const char *from, const char *to)
{
	if (renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) == 0)
		return 0;
	if (errno != EINVAL && errno != ENOSYS)
		return -errno;
	/* a filesystem without RENAME_NOREPLACE: look first (the folder's
	 * lock keeps other daemons out of it) */
	struct stat st;
	if (lstat(to, &st) == 0)
		return -EEXIST;
	return rename(from, to) == 0 ? 0 : -errno;
}

int store_set_aside(const char *path, char **aside)
{
	char *to = NULL;
	int rc = -EEXIST;
	for (int i = 0; i <= STORE_ASIDE_MAX && rc == -EEXIST; i++) {
		free(to);
		int n = i ? asprintf(&to, "%s" STORE_ASIDE_SUFFIX ".%d", path, i)
			  : asprintf(&to, "%s" STORE_ASIDE_SUFFIX, path);
		if (n < 0)
			return -ENOMEM;
		rc = rename_noreplace(path, to);
	}
	if (rc) {
		free(to);
		return rc;
	}
	/* the rename made durable, best effort, as store_remove */
	char *dir = strdup(path), *slash = dir ? strrchr(dir, '/') : NULL;
	if (slash) {
		*(slash == dir ? slash + 1 : slash) = 0;
		int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd >= 0) {
			fsync(dfd);
			close(dfd);
		}
	}
	free(dir);
	if (aside)
		*aside = to;
	else
		free(to);
	return 0;
}

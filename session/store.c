/*
 * session/store.c — see store.h; this file: the state file's header (its
 * layout in store_int.h), built for the current version and parsed for
 * versions 1-3, the files' names and paths, the raw I/O and the messages.
 * Saving is store_save.c, loading (and converting between K/V types)
 * store_load.c, the folder's listing and removals store_dir.c.
 *
 * Everything read from a file is untrusted: every count and length is checked
 * against fixed bounds and against the bytes the file really has before it
 * sizes an allocation or a read, and nothing reaches the caller's session
 * before the body checksum has been verified.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <xxhash.h>

#include "session/store_int.h"
#include "util/cause.h"
#include "util/le.h"

/* ---- messages ----------------------------------------------------------- */

__attribute__((format(printf, 3, 4)))
int st_fail(char **cause, int err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	cause_vset(cause, fmt, ap);
	va_end(ap);
	return err;
}

int st_fail_errno(char **cause, int err)
{
	return st_fail(cause, err, "%s", strerror(-err));
}

/* ---- paths ------------------------------------------------------------ */

/* "<uid>-<id>.session" into buf (at least NAME_MAX + 1 bytes). */
void st_file_name(char *buf, size_t cap, uid_t uid, const char *id)
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
int st_pwrite_all(int fd, const void *buf, size_t n, uint64_t off)
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
ssize_t st_pread_all(int fd, void *buf, size_t n, uint64_t off)
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

void st_hdr_build(unsigned char b[STORE_HEADER_BYTES], const struct hdr *h)
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
int st_hdr_parse(const unsigned char *b, size_t got, uint64_t file_bytes, struct hdr *h,
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

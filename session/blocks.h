/*
 * session/blocks.h — shared K/V blocks on disk: one file per named block,
 * written once however many state files refer to it.
 *
 * A version 3 state file (session/store.h) keeps the full blocks of its
 * K/V as references: the names of their hash chain (session/session.h,
 * "Prefix sharing"). Each name's bytes are a block file in the state
 * directory's blocks/ folder, "<uid>-<name as 16 hex digits>.kvb":
 *   header, BLK_HEADER_BYTES, little-endian, field by field:
 *     magic "LLAMADB1" (8), version u32 (1), header_bytes u32, name u64,
 *     parent u64 (the name of the block before; block 0: the chain's
 *     seed), uid u32, kv_dtype u32 (as the state file's), fingerprint u64,
 *     block_size u32, n_layers u32, kv_dim u32, zero u32, body_bytes u64,
 *     checksum u64 (XXH64 of the body), header_sum u64 (XXH64 of the
 *     header bytes before it), zero padding
 *   body: the block's block_size token ids (i32), then its K/V
 *     (kt_kv_block_bytes of the file's shape, kernels/backend.h layout).
 * A file's name is its content: XXH64(tokens, seed = parent) must equal
 * the name (0 counts as 1), and the owner, the tokens and the parent must
 * be those the referring state file expects; anything else is refused with
 * the reason. Files are written to a temporary name, fsynced and renamed;
 * the caller syncs the folder (blk_sync) before writing the state file
 * that refers to them: a crash between the two leaves only unreferenced
 * blocks, which blk_collect removes at start-up.
 */
#ifndef LLAMAD_SESSION_BLOCKS_H
#define LLAMAD_SESSION_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"

#define BLK_DIR "blocks"
#define BLK_MAGIC "LLAMADB1"
#define BLK_VERSION 1
#define BLK_HEADER_BYTES 96
#define BLK_SUFFIX ".kvb"

/* The size of a block file of shape's type and layout. */
uint64_t blk_file_bytes(const struct kt_kv *shape);

/* The chain's name of a block from its parent and tokens (never 0). */
uint64_t blk_name(uint64_t parent, const int32_t *tokens, int block_size);

/* "<uid>-<name>.kvb" into buf (at least 40 bytes). */
void blk_file_name(char *buf, size_t cap, uint32_t uid, uint64_t name);

/* Open (creating it, mode 0700, when create) dir's blocks folder: an
 * O_DIRECTORY descriptor, or -errno; -ELOOP when it is a symbolic link
 * (never followed) or not a folder. */
int blk_open_dir(const char *dir, int create);

/* What a block file holds besides its K/V. */
struct blk_meta {
	uint64_t name, parent, fingerprint;
	uint32_t uid;
};

/*
 * Write the block file of m (tokens: block_size ids; kv: one block in
 * shape's type, shape->block_size positions) into the blocks folder bdfd,
 * unless a file of that name is there already. 1 written (its size in
 * *bytes), 0 present, or -errno with *cause the reason (malloc'd). The
 * folder is not synced.
 */
int blk_write(int bdfd, const struct blk_meta *m, const int32_t *tokens, const void *kv,
	      const struct kt_kv *shape, uint64_t *bytes, char **cause);
/* fsync the blocks folder. 0 or -errno (EINVAL, EROFS: not syncable, 0). */
int blk_sync(int bdfd);

/*
 * Read the block file of (uid, name) from bdfd into dst, one block in the
 * layout and type of `to` (converted when the file's type differs), after
 * checking it is exactly the block expected: its name, owner, parent and
 * tokens those given, XXH64 of its tokens under parent its name, model
 * fingerprint and KV shape (block_size, layers, kv_dim) those of `to`,
 * checksums. 0, 1 when it was converted from another element type, or
 * -errno with a one-line reason in why: -ENOENT (missing),
 * -EBADMSG (corrupt, truncated, name not matching the content), -EPROTO
 * (other format version or KV type), -ESTALE (another model or shape),
 * -ENOMEM, -EIO.
 */
int blk_read(int bdfd, const struct blk_meta *want, const int32_t *tokens,
	     const struct kt_kv *to, void *dst, char *why, size_t whycap);

/* Convert one block from `from`'s element type to `to`'s (same shape
 * otherwise): each row as fp32, stored as kv_store stores it (kt_kv_put).
 * scratch: 2 x kv_dim floats. */
void blk_convert(const struct kt_kv *from, const void *src, const struct kt_kv *to, void *dst,
		 float *scratch);

/* Parse "<uid>-<16 hex>.kvb". 1 with *uid and *name, else 0. */
int blk_parse_file_name(const char *fname, uint32_t *uid, uint64_t *name);

/*
 * How many state files refer to each block file (the residency keeps one:
 * a block file goes when its count reaches 0). Open addressing over
 * (uid, name); bytes: the file's size when known.
 */
struct blk_ref {
	uint64_t name;
	uint32_t uid;
	uint32_t count;           /* 0: empty slot */
	uint64_t bytes;
};
struct blk_refs {
	struct blk_ref *v;
	size_t cap, n;            /* slots (a power of two), used */
	uint64_t bytes;           /* sum of the entries' bytes */
};
/* Add one reference. 0 or -ENOMEM. */
int blk_refs_inc(struct blk_refs *m, uint32_t uid, uint64_t name);
/* Drop one reference: the count left (0: the entry is gone), or -ENOENT. */
int blk_refs_dec(struct blk_refs *m, uint32_t uid, uint64_t name);
/* The entry of (uid, name) or NULL. */
struct blk_ref *blk_refs_get(struct blk_refs *m, uint32_t uid, uint64_t name);
/* Set an entry's file size (kept in m->bytes). */
void blk_refs_set_bytes(struct blk_refs *m, struct blk_ref *r, uint64_t bytes);
void blk_refs_free(struct blk_refs *m);

/*
 * At start-up: remove from dir's blocks folder every block file no entry of
 * m refers to, and temporary files of interrupted writes; set the sizes of
 * those kept. report(ctx, file name, reason) for each removal and each
 * file that cannot be removed (may be NULL). The number removed, or -errno
 * when the folder cannot be read (-ENOENT: no folder, nothing to do).
 */
int blk_collect(const char *dir, struct blk_refs *m,
		void (*report)(void *ctx, const char *name, const char *reason), void *ctx);
/* Remove the block file of (uid, name) (absent is 0). 0 or -errno. */
int blk_remove(const char *dir, uint32_t uid, uint64_t name);

#endif

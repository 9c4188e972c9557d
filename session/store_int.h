/*
 * session/store_int.h — what the state-file code shares (store.h is the
 * contract): the header's layout and bounds (store.c), the I/O helpers
 * and messages. Private to session/store*.c.
 */
#ifndef LLAMAD_SESSION_STORE_INT_H
#define LLAMAD_SESSION_STORE_INT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "session/store.h"

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

/* *cause = the reason, formatted (no path: the caller knows the file;
 * left NULL if out of memory). Returns err, a negative errno. */
__attribute__((format(printf, 3, 4)))
int st_fail(char **cause, int err, const char *fmt, ...);
/* st_fail with strerror(-err). */
int st_fail_errno(char **cause, int err);
/* The file name of (uid, id) in a state folder, into buf. */
void st_file_name(char *buf, size_t cap, uid_t uid, const char *id);
/* Whole writes and reads at off, retried on EINTR and short counts:
 * 0 / bytes read, or -errno. */
int st_pwrite_all(int fd, const void *buf, size_t n, uint64_t off);
ssize_t st_pread_all(int fd, void *buf, size_t n, uint64_t off);
/* The header h as its STORE_HEADER_BYTES bytes (the current version). */
void st_hdr_build(unsigned char b[STORE_HEADER_BYTES], const struct hdr *h);
/* Parse and check the header of a file of file_bytes bytes (got of them
 * read into b): store.c says what is checked. 0, or -EPROTO / -EBADMSG
 * with a one-line reason in why. */
int st_hdr_parse(const unsigned char *b, size_t got, uint64_t file_bytes, struct hdr *h,
		 char *why, size_t whycap);

#endif

/*
 * tests/fuzz/fuzz_store.c — session files (session/store.c). The input is
 * a session file. It is loaded twice into an empty session of a small pool
 * (64 blocks of 16 positions, 2 layers, kv_dim 8, head_dim 8): once as
 * is, into the f32 pool, once with its header and body checksums repaired
 * so that the fuzzer reaches the body parser, into an f32, f16 or q8_0
 * pool (the input's last byte chooses: files of the other types are
 * converted as they load); each load with allow_foreign 0 and 1, and the
 * history alone (store_load_history). The session is
 * created with the (uid, id) the header names when that id is valid, so
 * that the load gets past the identity check. Then store_list reads a
 * folder holding the file under its proper name.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <xxhash.h>

#include "fuzz_util.h"
#include "session/store.h"
#include "tests/unit/store_file.h"

#define FP 0x0123456789abcdefULL   /* the fingerprint of tests/fuzz/gen_corpus.c */
#define OFF_UID SF_UID
#define OFF_ID SF_ID
#define OFF_CHECKSUM SF_CHECKSUM

static char *dir, *listdir;
static struct kvpool *pools[3];  /* f32, f16, q8_0 */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	dir = fuzz_tmpdir("fuzz_store");
	listdir = fuzz_join(dir, "list");
	if (mkdir(listdir, 0700) != 0)
		abort();
	static const enum kt_dtype types[] = { KT_F32, KT_F16, KT_Q8_0 };
	for (int i = 0; i < 3; i++)
		if (!(pools[i] = kvpool_new_typed(NULL, types[i], 8, 64, 16, 2, 8)))
			abort();
	return 0;
}

static void put_le64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void load(struct kvpool *pool, const char *path, const char *id, uid_t uid, int foreign)
{
	struct sess_table t;
	if (sess_table_init(&t, pool) != 0)
		abort();
	struct session *s = sess_create(&t, uid, id);
	if (!s)
		abort();
	char *cause = NULL;
	int rc = store_load(path, s, pool, FP, foreign, &cause);
	if (rc != 0 && !cause)
		abort();        /* every failure names its reason */
	if (rc != 0 && (s->n_tokens || s->n_turns || s->kv.n_blocks))
		abort();        /* on error s is left empty */
	if (rc == 0 && (s->n_cached > s->n_tokens || s->n_tokens < 0))
		abort();
	free(cause);
	/* the history alone (a transcript of a session on disk) */
	struct session h;
	memset(&h, 0, sizeof(h));
	memcpy(h.id, s->id, sizeof(h.id));
	h.uid = uid;
	cause = NULL;
	rc = store_load_history(path, &h, &cause);
	if (rc != 0 && (!cause || h.n_tokens || h.n_turns))
		abort();
	if (rc == 0 && (h.n_cached || h.kv.n_blocks))
		abort();        /* no K/V */
	free(cause);
	sess_clear_history(&t, &h);
	sess_table_done(&t);    /* releases the session's blocks */
	if (kvpool_n_free(pool) != 64)
		abort();        /* no block kept */
}

static void report(void *ctx, const char *path, const char *reason)
{
	(void)ctx;
	if (!path || !reason)
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* the identity the header claims, when usable */
	char id[SESSION_ID_MAX + 1] = "x";
	uid_t uid = 0;
	if (size >= OFF_CHECKSUM) {
		memcpy(id, data + OFF_ID, SESSION_ID_MAX);
		id[SESSION_ID_MAX] = 0;
		if (!sess_id_valid(id))
			strcpy(id, "x");
		uid = (uid_t)(data[OFF_UID] | data[OFF_UID + 1] << 8 | data[OFF_UID + 2] << 16 |
			      (uint32_t)data[OFF_UID + 3] << 24);
	}
	char *path = store_path(dir, uid, id);
	if (!path)
		abort();
	fuzz_write(path, data, size);
	load(pools[0], path, id, uid, 0);
	load(pools[0], path, id, uid, 1);

	if (size >= STORE_HEADER_BYTES) {
		uint8_t *fix = malloc(size);
		if (!fix)
			abort();
		memcpy(fix, data, size);
		if (sf_get(fix + SF_VERSION, 4) == 1) {  /* version 1: no meta_sum */
			put_le64(fix + OFF_CHECKSUM, XXH64(fix + STORE_HEADER_BYTES,
							   size - STORE_HEADER_BYTES, 0));
			put_le64(fix + SF_HEADER_SUM_V1, XXH64(fix, SF_HEADER_SUM_V1, 0));
		} else {
			sf_reseal(fix, size);
		}
		fuzz_write(path, fix, size);
		free(fix);
		struct kvpool *p = pools[data[size - 1] % 3];
		load(p, path, id, uid, 0);
		load(p, path, id, uid, 1);
	}
	unlink(path);
	free(path);

	/* a listing of a folder holding the file under its own name */
	path = store_path(listdir, uid, id);
	if (!path)
		abort();
	fuzz_write(path, data, size);
	struct store_entry *e = NULL;
	int n = store_list(listdir, &e, report, NULL);
	if (n < 0)
		abort();
	store_entries_free(e, n);
	unlink(path);
	free(path);
	return 0;
}

/*
 * tests/fuzz/fuzz_store.c — session files (session/store*.c) and the block
 * files version 3 files refer to (session/blocks.c).
 *
 * The input is a state file, then up to 8 block files, each introduced by
 * SEP ("@KVB@") and a file name line: "@KVB@" NAME "\n" BYTES. A NAME that
 * is empty (or not a usable file name) lets the harness choose one: the
 * name of the block the state file expects there (below), else the uid and
 * name the block's own header claims; a NAME ending in "/" makes a folder
 * of that name instead. An input without SEP is a state file alone, as
 * this target's inputs were before version 3 (the blocks folder is then
 * absent in the first pass). The input's last byte chooses the pool (% 3:
 * f32, f16, q8_0) and how names are made consistent ((/ 3) % 3, below).
 *
 * The state file is loaded (store_load_ex) into an empty session of a small
 * pool (64 blocks of 16 positions, 2 layers, kv_dim 8, head_dim 8), with
 * its block files in blocks/ beside it:
 *   1. as is, into the f32 pool, blocks named by their own headers (or
 *      their NAME), with allow_foreign 0 and 1;
 *   2. with the state file's body_bytes set to its size and its checksums
 *      repaired (header, meta_sum, body, as store_file.h places them;
 *      version 1 too) and each block file's (block_file.h), the k-th block
 *      without a NAME named after the k-th name of the state file's refs
 *      section, into the pool the last byte chooses. Mode 1: block k's
 *      owner, parent, tokens and name and the state file's names are first
 *      rewritten into one valid chain over the state file's tokens, so
 *      that mutated inputs reach the K/V conversion behind every check;
 *      mode 2: the same, but each name is the one block k's header holds
 *      (the state file's names follow it), so that only the hash of the
 *      tokens can disagree. A load that kept its shared blocks is repeated
 *      into a second session with those blocks named in the pool: it must
 *      take them from the pool.
 * Each load with store_load_history too. Invariants: a failed load leaves
 * the session empty and the pool's free count where it was; a load gives
 * n_cached <= n_tokens and blocks of one reference each; a refused block
 * file means n_cached 0 and a note naming the file; after release every
 * block is free and the pool's lists add up. store_read_refs must return
 * the names where the layout puts them. blk_collect then runs over the
 * blocks folder with the state file's names as references: exactly the
 * unreferenced block files and the temporary files go. Last, store_list
 * reads a folder holding the state file under its proper name.
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <xxhash.h>

#include "fuzz_util.h"
#include "session/blocks.h"
#include "session/store.h"
#include "tests/unit/block_file.h"
#include "tests/unit/store_file.h"

#define FP 0x0123456789abcdefULL   /* the fingerprint of tests/fuzz/gen_corpus.c */
#define NBLK 64
#define BSZ 16
#define SEP "@KVB@"
#define SEP_LEN 5
#define MAX_FILES 8
#define NAME_MAX_LEN 64

static char *dir, *bdir, *listdir;
static struct kvpool *pools[3];  /* f32, f16, q8_0 */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	dir = fuzz_tmpdir("fuzz_store");
	listdir = fuzz_join(dir, "list");
	bdir = fuzz_join(dir, BLK_DIR);
	if (mkdir(listdir, 0700) != 0 || mkdir(bdir, 0700) != 0)
		abort();
	static const enum kt_dtype types[] = { KT_F32, KT_F16, KT_Q8_0 };
	for (int i = 0; i < 3; i++)
		if (!(pools[i] = kvpool_new_typed(NULL, types[i], 8, NBLK, BSZ, 2, 8)))
			abort();
	return 0;
}

/* ---- the input's parts ------------------------------------------------- */

struct part {
	const uint8_t *d;
	size_t n;
	char name[NAME_MAX_LEN + 2];  /* "" when the harness names it */
};

/* A NAME a file may have in the blocks folder (a folder's: one "/" at
 * its end). */
static int name_ok(const uint8_t *p, size_t n)
{
	if (n > 1 && p[n - 1] == '/')
		n--;
	if (n == 0 || n > NAME_MAX_LEN || (n == 1 && p[0] == '.') ||
	    (n == 2 && p[0] == '.' && p[1] == '.'))
		return 0;
	for (size_t i = 0; i < n; i++)
		if (p[i] == '/' || p[i] == 0)
			return 0;
	return 1;
}

/* Split the input: the state file, then the block files. */
static int split(const uint8_t *data, size_t size, struct part *state, struct part *blk)
{
	const uint8_t *sep = memmem(data, size, SEP, SEP_LEN);
	*state = (struct part){ .d = data, .n = sep ? (size_t)(sep - data) : size };
	int n = 0;
	while (sep && n < MAX_FILES) {
		const uint8_t *p = sep + SEP_LEN, *end = data + size;
		sep = memmem(p, (size_t)(end - p), SEP, SEP_LEN);
		const uint8_t *stop = sep ? sep : end;
		struct part *b = &blk[n++];
		memset(b, 0, sizeof(*b));
		const uint8_t *nl = memchr(p, '\n', (size_t)(stop - p) < NAME_MAX_LEN + 2
							    ? (size_t)(stop - p) : NAME_MAX_LEN + 2);
		if (nl) {
			if (name_ok(p, (size_t)(nl - p)))
				memcpy(b->name, p, (size_t)(nl - p));
			p = nl + 1;
		}
		b->d = p;
		b->n = (size_t)(stop - p);
	}
	return n;
}

/* ---- the folder ----------------------------------------------------------- */

/* An empty blocks folder (made again when absent). */
static void clear_blocks(void)
{
	DIR *d = opendir(bdir);
	if (!d) {
		if (mkdir(bdir, 0700) != 0)
			abort();
		return;
	}
	struct dirent *de;
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") &&
		    unlinkat(dirfd(d), de->d_name, 0) != 0 &&
		    unlinkat(dirfd(d), de->d_name, AT_REMOVEDIR) != 0)
			abort();
	closedir(d);
}

/* The names in the blocks folder (at most 2 * MAX_FILES), sorted. */
struct listing {
	int n;
	char name[2 * MAX_FILES][NAME_MAX_LEN + 1];
	uint64_t size[2 * MAX_FILES];
	int is_dir[2 * MAX_FILES];
};

static void list_blocks(struct listing *l)
{
	DIR *d = opendir(bdir);
	if (!d)
		abort();
	l->n = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (l->n == 2 * MAX_FILES || strlen(de->d_name) > NAME_MAX_LEN)
			abort();
		struct stat st;
		if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
			abort();
		strcpy(l->name[l->n], de->d_name);
		l->is_dir[l->n] = S_ISDIR(st.st_mode);
		l->size[l->n++] = (uint64_t)st.st_size;
	}
	closedir(d);
}

static int listed(const struct listing *l, const char *name)
{
	for (int i = 0; i < l->n; i++)
		if (!strcmp(l->name[i], name))
			return 1;
	return 0;
}

/* ---- the pool -------------------------------------------------------------- */

/* Every block free, the free lists adding up; the names forgotten so that
 * the next load starts from the same pool whatever this one named. */
static void pool_reset(struct kvpool *p)
{
	if (kvpool_n_free(p) != NBLK || p->n_plain + p->n_lru != NBLK)
		abort();
	for (int b = 0; b < NBLK; b++) {
		if (p->refs[b] != 0)
			abort();
		if (p->name[b]) {
			if (kvpool_lookup(p, p->name[b], p->parent[b], p->owner[b],
					  p->tok + (size_t)b * BSZ) != b)
				abort();   /* a named block is found by what made it */
			kvpool_unname(p, b);
		}
	}
	if (p->n_plain != NBLK || p->n_lru != 0)
		abort();
}

static int name_taken(const struct kvpool *p, uint64_t name)
{
	for (int b = 0; b < NBLK; b++)
		if (p->name[b] == name)
			return 1;
	return 0;
}

/* ---- loads ------------------------------------------------------------------ */

/* What a successful load must look like in a pool nothing else holds. */
static void check_loaded(const struct kvpool *pool, const struct session *s,
			 const struct store_note *note, int free0)
{
	if (s->n_tokens < 0 || s->n_cached < 0 || s->n_cached > s->n_tokens)
		abort();
	int nb = (s->n_cached + BSZ - 1) / BSZ;
	if (s->kv.n_blocks != nb || kvpool_n_free(pool) != free0 - nb)
		abort();
	for (int i = 0; i < nb; i++)
		if (s->kv.blocks[i] < 0 || s->kv.blocks[i] >= NBLK || pool->refs[s->kv.blocks[i]] != 1)
			abort();
	if (note->bad_block && (s->n_cached || !strstr(note->bad_why, "block file ") ||
				!strstr(note->bad_why, BLK_SUFFIX)))
		abort();        /* a refused block file: history only, the file named */
	/* the names: at most one a token (a block of one position), one a
	 * full block when the K/V came with them */
	if ((note->n_refs > 0) != (note->refs != NULL) || note->n_refs < 0 ||
	    note->n_refs > s->n_tokens || (s->n_cached && note->n_refs * BSZ > s->n_cached))
		abort();
}

/* Load path into an empty (uid, id) session of pool. seed, when have_seed:
 * the chain's seed the file names (to name the loaded blocks and load
 * again, sharing them). */
static void load(struct kvpool *pool, const char *path, const char *id, uid_t uid, int foreign,
		 int have_seed, uint64_t seed)
{
	struct sess_table t;
	if (sess_table_init(&t, pool) != 0)
		abort();
	struct session *s = sess_create(&t, uid, id);
	if (!s)
		abort();
	int free0 = kvpool_n_free(pool);
	char *cause = NULL;
	struct store_note note;
	int rc = store_load_ex(path, s, pool, FP, foreign, &note, &cause);
	if (rc != 0 && !cause)
		abort();        /* every failure names its reason */
	if (rc != 0 && (s->n_tokens || s->n_turns || s->kv.n_blocks || note.refs ||
			note.n_refs || kvpool_n_free(pool) != free0))
		abort();        /* on error s is left empty, no block kept */
	if (rc == 0)
		check_loaded(pool, s, &note, free0);
	free(cause);

	/* the same file again, with the blocks of the first named in the pool
	 * as a session's would be: they are shared, not read */
	if (rc == 0 && have_seed && note.n_refs > 0 && s->n_cached >= note.n_refs * BSZ) {
		for (int i = 0; i < note.n_refs; i++) {
			int32_t b = s->kv.blocks[i];
			if (!pool->name[b] && !name_taken(pool, note.refs[i]))
				kvpool_name(pool, b, note.refs[i], i ? note.refs[i - 1] : seed,
					    (uint32_t)uid, s->tokens + (size_t)i * BSZ);
		}
		struct sess_table t2;
		if (sess_table_init(&t2, pool) != 0)
			abort();
		struct session *s2 = sess_create(&t2, uid, id);
		struct store_note n2;
		int free1 = kvpool_n_free(pool);
		if (!s2)
			abort();
		rc = store_load_ex(path, s2, pool, FP, foreign, &n2, &cause);
		if (rc == 0) {
			if (n2.bad_block || s2->n_cached != s->n_cached || n2.n_refs != note.n_refs ||
			    memcmp(n2.refs, note.refs, (size_t)note.n_refs * sizeof(uint64_t)))
				abort();
			for (int i = 0; i < note.n_refs; i++) {
				int32_t b = s->kv.blocks[i];
				if (pool->name[b] == note.refs[i] &&
				    (s2->kv.blocks[i] != b || pool->refs[b] != 2))
					abort();  /* a named block is shared */
			}
			for (int i = note.n_refs; i < s2->kv.n_blocks; i++)
				if (pool->refs[s2->kv.blocks[i]] != 1)
					abort();
		} else if (rc != -ENOSPC || kvpool_n_free(pool) != free1) {
			abort();
		}
		free(n2.refs);
		free(cause);
		cause = NULL;
		sess_table_done(&t2);
	}
	free(note.refs);

	/* the history alone (a transcript of a session on disk) */
	struct session h;
	memset(&h, 0, sizeof(h));
	memcpy(h.id, s->id, sizeof(h.id));
	h.uid = uid;
	cause = NULL;
	rc = store_load_history(path, &h, &cause);
	if (rc != 0 && (!cause || h.n_tokens || h.n_turns))
		abort();
	if (rc == 0 && (h.n_cached || h.kv.n_blocks || h.n_tokens < 0))
		abort();        /* no K/V */
	free(cause);
	sess_clear_history(&t, &h);
	sess_table_done(&t);    /* releases the session's blocks */
	pool_reset(pool);
}

/* ---- block names -------------------------------------------------------------- */

/* The k-th name of image st's refs section (state_n bytes), if it has one. */
static int ref_name(const uint8_t *st, size_t state_n, int k, uint64_t *name)
{
	if (state_n < SF_HEADER_BYTES || sf_get(st + SF_VERSION, 4) != 3 ||
	    (uint64_t)k >= sf_n_refs(st))
		return 0;
	size_t off = sf_refs_off(st, state_n);
	if (!off)
		return 0;
	*name = sf_get(st + off + 8 + 8 * (size_t)k, 8);
	return 1;
}

/* Write the block files: a part's own NAME, else (by_refs) the name the
 * state file's refs give the k-th unnamed part, else its header's. */
static void write_blocks(const struct part *blk, uint8_t *const *img, int n, const uint8_t *st,
			 size_t state_n, uint32_t uid, int by_refs)
{
	clear_blocks();
	for (int i = 0, k = 0; i < n; i++) {
		char fname[NAME_MAX_LEN + 2];
		uint64_t name;
		size_t len = strlen(blk[i].name);
		if (len && blk[i].name[len - 1] == '/') {  /* a folder */
			char *p = fuzz_join(bdir, blk[i].name);
			mkdir(p, 0700);
			free(p);
			continue;
		}
		if (blk[i].name[0]) {
			strcpy(fname, blk[i].name);
		} else {
			if (by_refs && ref_name(st, state_n, k, &name))
				blk_file_name(fname, sizeof(fname), uid, name);
			else if (blk[i].n >= BF_UID + 4)
				blk_file_name(fname, sizeof(fname), (uint32_t)sf_get(img[i] + BF_UID, 4),
					      sf_get(img[i] + BF_NAME, 8));
			else
				blk_file_name(fname, sizeof(fname), uid, (uint64_t)k);
			k++;
		}
		char *p = fuzz_join(bdir, fname);
		struct stat st;
		if (lstat(p, &st) != 0 || !S_ISDIR(st.st_mode))  /* a part made a folder of it */
			fuzz_write(p, img[i], blk[i].n);
		free(p);
	}
}

/* Make the state file's names and the unnamed block files one chain over
 * the state file's tokens: block k's parent, owner and tokens those the
 * state file expects, its name the hash of its tokens (adopt 0: a valid
 * chain) or the one its header holds (adopt 1: the state file's follows). */
static void chain_repair(uint8_t *st, size_t state_n, const struct part *blk, uint8_t **img,
			 int n, int adopt)
{
	if (state_n < SF_HEADER_BYTES || sf_get(st + SF_VERSION, 4) != 3)
		return;
	uint64_t bs = sf_get(st + SF_BLOCK_SIZE, 4), n_tok = sf_get(st + SF_N_TOKENS, 4);
	uint64_t n_refs = sf_n_refs(st);
	size_t off = sf_refs_off(st, state_n);
	if (!off || bs < 1 || bs > 4096 || n_refs > n_tok / bs ||
	    SF_HEADER_BYTES + 4 * n_tok > off)
		return;
	uint64_t parent = sf_get(st + off, 8);
	uint32_t uid = (uint32_t)sf_get(st + SF_UID, 4);
	int32_t tok[4096];
	for (int i = 0, k = 0; i < n && (uint64_t)k < n_refs; i++) {
		if (blk[i].name[0])
			continue;
		const uint8_t *t = st + SF_HEADER_BYTES + 4 * bs * (uint64_t)k;
		for (uint64_t j = 0; j < bs; j++)
			tok[j] = (int32_t)sf_get(t + 4 * j, 4);
		uint64_t name = XXH64(tok, bs * sizeof(int32_t), parent);
		name = name ? name : 1;
		if (adopt && blk[i].n >= BF_NAME + 8)
			name = sf_get(img[i] + BF_NAME, 8);
		sf_put(st + off + 8 + 8 * (size_t)k, name, 8);
		if (blk[i].n >= BF_HEADER_BYTES + 4 * bs) {
			uint8_t *b = img[i];
			sf_put(b + BF_NAME, name, 8);
			sf_put(b + BF_PARENT, parent, 8);
			sf_put(b + BF_UID, uid, 4);
			memcpy(b + BF_HEADER_BYTES, t, 4 * bs);
		}
		parent = name;
		k++;
	}
}

/* ---- the folder's collection ------------------------------------------------ */

static void report(void *ctx, const char *path, const char *reason)
{
	(void)ctx;
	if (!path || !reason)
		abort();
}

/* store_read_refs against the layout, then blk_collect with those names. */
static void collect(const char *path, const uint8_t *st, size_t state_n, uid_t uid,
		    const char *id)
{
	uint64_t *refs = NULL;
	int n = 0;
	char *cause = NULL;
	int rc = store_read_refs(path, uid, id, &refs, &n, &cause);
	if (rc != 0 && (!cause || refs || n))
		abort();
	free(cause);
	struct blk_refs m = { 0 };
	for (int i = 0; i < n; i++) {
		uint64_t want;
		if (!ref_name(st, state_n, i, &want) || want != refs[i])
			abort();  /* the names are where the layout puts them */
		if (blk_refs_inc(&m, (uint32_t)uid, refs[i]) != 0)
			abort();
	}
	if (rc == 0 && n != (int)sf_n_refs(st))
		abort();

	struct listing before, after;
	list_blocks(&before);
	int removed = blk_collect(dir, &m, report, NULL);
	list_blocks(&after);
	if (removed < 0)
		abort();
	int gone = 0;
	uint64_t kept_bytes = 0;
	for (int i = 0; i < before.n; i++) {
		const char *f = before.name[i];
		uint32_t u;
		uint64_t name;
		int parsed = blk_parse_file_name(f, &u, &name);
		if (parsed) {  /* one spelling per block */
			char again[64];
			blk_file_name(again, sizeof(again), u, name);
			if (strcmp(again, f))
				abort();
		}
		struct blk_ref *r = parsed ? blk_refs_get(&m, u, name) : NULL;
		int go = (!strncmp(f, ".tmp-", 5) || (parsed && !r)) && !before.is_dir[i];
		if (listed(&after, f) == go)
			abort();  /* exactly the unreferenced and temporary files go */
		gone += go;
		if (r) {
			if (r->bytes != before.size[i])
				abort();
			kept_bytes += before.size[i];
		}
	}
	if (gone != removed || after.n != before.n - gone || m.bytes != kept_bytes)
		abort();
	for (int i = 0; i < n; i++)
		if (blk_refs_dec(&m, (uint32_t)uid, refs[i]) < 0)
			abort();
	if (m.n != 0 || m.bytes != 0)
		abort();
	blk_refs_free(&m);
	free(refs);
}

/* ---- the input ------------------------------------------------------------------ */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size == 0)
		return 0;
	struct part state, blk[MAX_FILES];
	int n_blk = split(data, size, &state, blk);
	uint8_t last = data[size - 1];

	/* the identity the header claims, when usable */
	char id[SESSION_ID_MAX + 1] = "x";
	uid_t uid = 0;
	if (state.n >= SF_CHECKSUM) {
		memcpy(id, state.d + SF_ID, SESSION_ID_MAX);
		id[SESSION_ID_MAX] = 0;
		if (!sess_id_valid(id))
			strcpy(id, "x");
		uid = (uid_t)sf_get(state.d + SF_UID, 4);
	}
	char *path = store_path(dir, uid, id);
	if (!path)
		abort();
	uint8_t *img[MAX_FILES];
	for (int i = 0; i < n_blk; i++) {
		img[i] = malloc(blk[i].n ? blk[i].n : 1);
		if (!img[i])
			abort();
		memcpy(img[i], blk[i].d, blk[i].n);
	}

	/* 1. as is (without block files, without a blocks folder) */
	fuzz_write(path, state.d, state.n);
	write_blocks(blk, img, n_blk, state.d, state.n, (uint32_t)uid, 0);
	if (!n_blk && rmdir(bdir) != 0)
		abort();
	load(pools[0], path, id, uid, 0, 0, 0);
	load(pools[0], path, id, uid, 1, 0, 0);

	/* 2. checksums repaired */
	if (state.n >= SF_HEADER_BYTES) {
		uint8_t *fix = malloc(state.n);
		if (!fix)
			abort();
		memcpy(fix, state.d, state.n);
		if (sf_get(fix + SF_VERSION, 4) == 1) {  /* version 1: no meta_sum */
			sf_put(fix + SF_BODY_BYTES, state.n - SF_HEADER_BYTES, 8);
			sf_put(fix + SF_CHECKSUM, XXH64(fix + SF_HEADER_BYTES,
							state.n - SF_HEADER_BYTES, 0), 8);
			sf_put(fix + SF_HEADER_SUM_V1, XXH64(fix, SF_HEADER_SUM_V1, 0), 8);
		} else {
			sf_put(fix + SF_BODY_BYTES, state.n - SF_HEADER_BYTES, 8);
			if ((last / 3) % 3)
				chain_repair(fix, state.n, blk, img, n_blk, (last / 3) % 3 == 2);
			sf_reseal(fix, state.n);
		}
		for (int i = 0; i < n_blk; i++)
			if (blk[i].n >= BF_HEADER_BYTES)
				bf_reseal(img[i], blk[i].n);
		fuzz_write(path, fix, state.n);
		write_blocks(blk, img, n_blk, fix, state.n, (uint32_t)uid, 1);
		uint64_t seed = 0;
		size_t off = sf_get(fix + SF_VERSION, 4) == 3 ? sf_refs_off(fix, state.n) : 0;
		if (off)
			seed = sf_get(fix + off, 8);
		struct kvpool *p = pools[last % 3];
		load(p, path, id, uid, 0, off != 0, seed);
		load(p, path, id, uid, 1, 0, 0);
		collect(path, fix, state.n, uid, id);
		free(fix);
	}
	clear_blocks();
	unlink(path);
	free(path);
	for (int i = 0; i < n_blk; i++)
		free(img[i]);

	/* a listing of a folder holding the file under its own name */
	path = store_path(listdir, uid, id);
	if (!path)
		abort();
	fuzz_write(path, state.d, state.n);
	struct store_entry *e = NULL;
	int n = store_list(listdir, &e, report, NULL);
	if (n < 0)
		abort();
	store_entries_free(e, n);
	unlink(path);
	free(path);
	return 0;
}

/*
 * tests/unit/test_store.c — session files (session/store*.c): save/load round
 * trips with K/V, file mode and atomic replacement, listing, and rejection of
 * every kind of bad file (corrupt, truncated, other version, other model,
 * other KV shape, wrong owner, full pool) without leaks or crashes.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <xxhash.h>

#include "block_file.h"
#include "session/blocks.h"
#include "session/store.h"
#include "store_file.h"
#include "testutil.h"

#define NB 64   /* blocks */
#define BS 16   /* positions per block */
#define NL 2    /* layers */
#define KVD 8   /* kv_dim */
#define FP 0x0123456789abcdefULL
#define HB STORE_HEADER_BYTES

/* Header offsets used to forge files: store_file.h. */
#define OFF_VERSION SF_VERSION
#define OFF_N_TOKENS SF_N_TOKENS
#define OFF_N_CACHED SF_N_CACHED
#define OFF_N_TURNS SF_N_TURNS
#define OFF_BODY_BYTES SF_BODY_BYTES

/* ---- helpers ------------------------------------------------------------ */

struct env {
	struct kvpool *pool;
	struct sess_table t;
};

static void env_init(struct env *e, int nb, int bs, int nl, int kvd)
{
	e->pool = kvpool_new(nb, bs, nl, kvd);
	assert_non_null(e->pool);
	assert_int_equal(sess_table_init(&e->t, e->pool), 0);
}

static void env_done(struct env *e)
{
	sess_table_done(&e->t);
	kvpool_free(e->pool);
}

/* The group's folder (group_setup); every case's folders are made in it. */
static char group_dir[] = "/tmp/test_store.XXXXXX";

static char *tmpdir_new(void)
{
	char t[sizeof(group_dir) + 16];
	snprintf(t, sizeof(t), "%s/case.XXXXXX", group_dir);
	assert_non_null(mkdtemp(t));
	char *d = strdup(t);
	assert_non_null(d);
	return d;
}

/* Remove dir and what it holds (its blocks folder too). */
static void rm_tree(const char *dir)
{
	DIR *d = opendir(dir);
	if (d) {
		struct dirent *de;
		while ((de = readdir(d)))
			if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") &&
			    unlinkat(dirfd(d), de->d_name, 0) != 0) {
				char *sub = path_join(dir, de->d_name);
				rm_tree(sub);
				free(sub);
			}
		closedir(d);
	}
	rmdir(dir);
}

static void tmpdir_free(char *dir)
{
	rm_tree(dir);
	free(dir);
}

/* Files in dir whose name starts with prefix. */
static int count_prefix(const char *dir, const char *prefix)
{
	DIR *d = opendir(dir);
	assert_non_null(d);
	int n = 0;
	struct dirent *de;
	while ((de = readdir(d)))
		n += !strncmp(de->d_name, prefix, strlen(prefix));
	closedir(d);
	return n;
}

static void write_file(const char *path, const void *buf, size_t n)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, buf, n), (ssize_t)n);
	close(fd);
}

static unsigned char *read_file(const char *path, size_t *n)
{
	unsigned char *b = (unsigned char *)slurp(path, n);
	assert_non_null(b);
	return b;
}

#define fix_header_sum sf_fix_header_sum
#define fix_sums sf_reseal

static float kv_value(int seq_block, size_t i)
{
	return (float)(((uint32_t)seq_block * 7919u + (uint32_t)i * 2654435761u) % 1000003u) * 0.25f;
}

/* Put a hole pattern into the pool's free list so that a sequence gets
 * non-consecutive block ids (exercising both single and coalesced runs). */
static void scramble_pool(struct kvpool *p)
{
	int32_t b[6];
	for (int i = 0; i < 6; i++)
		b[i] = kvpool_alloc(p);
	kvpool_unref(p, b[1]);
	kvpool_unref(p, b[4]);
	kvpool_unref(p, b[0]);  /* next allocations: 0, 4, 1, 6, 7, ... */
	/* b[2], b[3], b[5] stay taken */
}

/*
 * A session with n_tokens tokens in turns: an empty system turn at 0, then
 * user/assistant turns of up to 13 tokens, and (when tokens exist) an empty
 * system turn at the end; system prompts set; the first n_cached positions
 * cached in blocks filled with distinct values. text_len > 0 makes the user
 * texts that long.
 */
static struct session *make_session(struct env *e, uid_t uid, const char *id, int n_tokens,
				    int n_cached, size_t text_len)
{
	struct session *s = sess_create(&e->t, uid, id);
	assert_non_null(s);
	char *big = NULL;
	if (text_len) {
		big = malloc(text_len + 1);
		assert_non_null(big);
		for (size_t i = 0; i < text_len; i++)
			big[i] = (char)('a' + i % 26);
		big[text_len] = '\0';
	}
	int32_t ids[13] = { 0 };
	/* sess_append() of 0 ids into a session without a token array memcpy()s
	 * to NULL (UBSan); give it one */
	s->tokens = malloc(256 * sizeof(int32_t));
	assert_non_null(s->tokens);
	s->cap = 256;
	if (n_tokens > 0)
		assert_int_equal(sess_append(s, ids, 0, CHAT_SYSTEM, "be brief", 1), 0);
	for (int at = 0, k = 0; at < n_tokens; k++) {
		int n = n_tokens - at < 13 ? n_tokens - at : 13;
		for (int i = 0; i < n; i++)
			ids[i] = (at + i) * 7 + 3;
		int role = k % 2 ? CHAT_ASSISTANT : CHAT_USER;
		char text[64];
		snprintf(text, sizeof(text), "user text %d ü", k);
		assert_int_equal(sess_append(s, ids, n, role, role == CHAT_USER ? (big ? big : text)
							 : NULL, 1), 0);
		if (role == CHAT_ASSISTANT)  /* every stop reason, and none */
			s->turns[s->n_turns - 1].end = (uint8_t)(k / 2 % (SESS_END_MAX + 1));
		at += n;
	}
	if (n_tokens > 0)
		assert_int_equal(sess_append(s, ids, 0, CHAT_SYSTEM, "later", 1), 0);
	free(big);
	s->system = strdup("You are a test.");
	s->next_system = n_tokens ? strdup("next system") : NULL;
	s->tmpl = n_tokens % 2 ? CHAT_TEMPLATE_LLAMA3 : CHAT_TEMPLATE_RAW;  /* the highest value too */
	s->policy = SESS_CTX_SHIFT;
	s->last_use_ms = 1700000000123LL;
	s->prefilled = 123456789012ULL;
	s->generated = 4242;
	if (n_cached > 0) {
		assert_int_equal(kvseq_prepare(e->pool, &s->kv, n_cached, 0), 0);
		size_t nf = kt_kv_block_bytes(&e->pool->kv) / sizeof(float);
		for (int b = 0; b < s->kv.n_blocks; b++) {
			float *f = kt_kv_block(&e->pool->kv, s->kv.blocks[b]);
			for (size_t i = 0; i < nf; i++)
				f[i] = kv_value(b, i);
		}
	}
	s->n_cached = n_cached;
	return s;
}

static void assert_str_eq_or_null(const char *a, const char *b)
{
	if (!a || !b)
		assert_ptr_equal(a, b);
	else
		assert_string_equal(a, b);
}

/* b (loaded into pool pb) equals a (in pool pa), K/V included when
 * with_kv; else b has no cache. */
static void assert_same(const struct session *a, const struct kvpool *pa, const struct session *b,
			const struct kvpool *pb, int with_kv)
{
	assert_string_equal(a->id, b->id);
	assert_int_equal(a->uid, b->uid);
	assert_int_equal(a->n_tokens, b->n_tokens);
	if (a->n_tokens)
		assert_memory_equal(a->tokens, b->tokens, (size_t)a->n_tokens * sizeof(int32_t));
	assert_int_equal(a->n_turns, b->n_turns);
	for (int i = 0; i < a->n_turns; i++) {
		assert_int_equal(a->turns[i].start, b->turns[i].start);
		assert_int_equal(a->turns[i].role, b->turns[i].role);
		assert_int_equal(a->turns[i].end, b->turns[i].end);
		assert_str_eq_or_null(a->turns[i].text, b->turns[i].text);
	}
	assert_str_eq_or_null(a->system, b->system);
	assert_str_eq_or_null(a->next_system, b->next_system);
	assert_int_equal(a->tmpl, b->tmpl);
	assert_int_equal(a->policy, b->policy);
	assert_true(a->last_use_ms == b->last_use_ms);
	assert_true(a->prefilled == b->prefilled);
	assert_true(a->generated == b->generated);
	if (!with_kv) {
		assert_int_equal(b->n_cached, 0);
		assert_int_equal(b->kv.n_blocks, 0);
		return;
	}
	assert_int_equal(a->n_cached, b->n_cached);
	int bs = pa->kv.block_size;
	int nb = (a->n_cached + bs - 1) / bs;
	assert_int_equal(b->kv.n_blocks, nb);
	size_t bb = kt_kv_block_bytes(&pa->kv);
	assert_int_equal(bb, kt_kv_block_bytes(&pb->kv));
	for (int i = 0; i < nb; i++) {
		assert_true(b->kv.blocks[i] >= 0 && b->kv.blocks[i] < pb->kv.n_blocks);
		assert_int_equal(pb->refs[b->kv.blocks[i]], 1);
		assert_memory_equal(kt_kv_block(&pa->kv, a->kv.blocks[i]),
				    kt_kv_block(&pb->kv, b->kv.blocks[i]), bb);
	}
}

static void assert_empty(const struct session *s)
{
	assert_int_equal(s->n_tokens, 0);
	assert_int_equal(s->n_turns, 0);
	assert_int_equal(s->n_cached, 0);
	assert_int_equal(s->kv.n_blocks, 0);
	assert_null(s->system);
	assert_null(s->next_system);
}

/* Save a, load it into a fresh pool of the same shape, compare. */
static void round_trip(int n_tokens, int n_cached, size_t text_len)
{
	char *dir = tmpdir_new();
	struct env e1, e2;
	env_init(&e1, NB, BS, NL, KVD);
	scramble_pool(e1.pool);
	struct session *a = make_session(&e1, 1000, "work", n_tokens, n_cached, text_len);
	char *cause = NULL;
	assert_int_equal(store_save(dir, a, e1.pool, FP, &cause), 0);
	assert_null(cause);

	env_init(&e2, NB, BS, NL, KVD);
	scramble_pool(e2.pool);
	int free0 = kvpool_n_free(e2.pool);
	struct session *b = sess_create(&e2.t, 1000, "work");
	char *path = store_path(dir, 1000, "work");
	assert_int_equal(store_load(path, b, e2.pool, FP, 0, &cause), 0);
	assert_null(cause);
	assert_same(a, e1.pool, b, e2.pool, 1);
	assert_int_equal(kvpool_n_free(e2.pool), free0 - (n_cached + BS - 1) / BS);

	/* the loaded session works like any other: it grows and drops cleanly */
	int32_t more[3] = { 1, 2, 3 };
	assert_int_equal(sess_append(b, more, 3, CHAT_USER, "more", 1), 0);
	sess_drop(&e2.t, b);
	assert_int_equal(kvpool_n_free(e2.pool), free0);

	free(path);
	env_done(&e1);
	env_done(&e2);
	tmpdir_free(dir);
}

/* Save a standard session (uid 0, "work"): returns its path; *bytes the size. */
static char *save_std(const char *dir, struct env *e, struct session **out)
{
	struct session *s = make_session(e, 0, "work", 75, 75, 0);
	char *cause = NULL;
	assert_int_equal(store_save(dir, s, e->pool, FP, &cause), 0);
	assert_null(cause);
	if (out)
		*out = s;
	char *path = store_path(dir, 0, "work");
	assert_non_null(path);
	return path;
}

/* Load path into a fresh (uid, id) session of e; returns rc, checks that a
 * failure changes nothing, and drops the session. *cause kept if asked. */
static int try_load(struct env *e, const char *path, uid_t uid, const char *id, uint64_t fp,
		    int allow_foreign, char **cause_out)
{
	int free0 = kvpool_n_free(e->pool);
	struct session *s = sess_create(&e->t, uid, id);
	assert_non_null(s);
	char *cause = NULL;
	int rc = store_load(path, s, e->pool, fp, allow_foreign, &cause);
	if (rc) {
		assert_true(rc < 0);
		assert_non_null(cause);
		assert_true(*cause);
		assert_null(strstr(cause, path));  /* the reason only */
		assert_empty(s);
		assert_int_equal(kvpool_n_free(e->pool), free0);
	} else {
		assert_null(cause);
	}
	sess_drop(&e->t, s);
	assert_int_equal(kvpool_n_free(e->pool), free0);
	if (cause_out)
		*cause_out = cause;
	else
		free(cause);
	return rc;
}

/* ---- fixtures ------------------------------------------------------------- */

/* What a case gets in *state: an empty folder of its own (in group_dir), two
 * pools with session tables of the standard shape (e to save from, e2 to load
 * into) and, with setup_std, the standard session s saved in dir as path. */
struct fx {
	char *dir;
	struct env e, e2;
	struct session *s;
	char *path;
	int mounted;     /* dir is a mount point: unmounted by the teardown */
};

static int group_setup(void **state)
{
	(void)state;
	if (!mkdtemp(group_dir)) {
		perror("test_store: mkdtemp");
		return -1;
	}
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	return rmdir(group_dir) == 0 ? 0 : -1;   /* every case removed its folder */
}

static int setup_env(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	assert_non_null(f);
	f->dir = tmpdir_new();
	env_init(&f->e, NB, BS, NL, KVD);
	env_init(&f->e2, NB, BS, NL, KVD);
	*state = f;
	return 0;
}

static int setup_std(void **state)
{
	setup_env(state);
	struct fx *f = *state;
	f->path = save_std(f->dir, &f->e, &f->s);
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;
	if (!f)
		return 0;
	if (f->mounted)
		umount2(f->dir, MNT_DETACH);
	free(f->path);
	env_done(&f->e2);
	env_done(&f->e);
	tmpdir_free(f->dir);
	free(f);
	return 0;
}

/* ---- round trips ---------------------------------------------------------- */

static void test_round_trip(void **state)
{
	(void)state;
	round_trip(75, 75, 0);    /* 5 blocks, the last partial */
	round_trip(64, 64, 0);    /* whole blocks */
}

static void test_round_trip_empty(void **state)
{
	(void)state;
	round_trip(0, 0, 0);
}

static void test_round_trip_partial_cache(void **state)
{
	(void)state;
	round_trip(100, 33, 0);   /* 3 blocks saved, 4 more in the table not */
	round_trip(100, 0, 0);
	round_trip(1, 1, 0);
}

static void test_round_trip_long_texts(void **state)
{
	(void)state;
	/* texts of 5 MiB: longer than the I/O buffer, read around it */
	round_trip(40, 20, (size_t)5 << 20);
	round_trip(30, 30, 100000);
}

/* Blocks of 8 MiB: KV written and read straight from/to the pool. */
static void test_round_trip_big_blocks(void **state)
{
	(void)state;
	char *dir = tmpdir_new();
	struct env e1, e2;
	env_init(&e1, 4, 256, 8, 512);
	struct session *a = make_session(&e1, 7, "big", 800, 700, 0);
	char *cause = NULL;
	assert_int_equal(store_save(dir, a, e1.pool, FP, &cause), 0);
	env_init(&e2, 5, 256, 8, 512);
	(void)kvpool_alloc(e2.pool);  /* blocks 1..3: one run of three */
	struct session *b = sess_create(&e2.t, 7, "big");
	char *path = store_path(dir, 7, "big");
	assert_int_equal(store_load(path, b, e2.pool, FP, 0, &cause), 0);
	assert_same(a, e1.pool, b, e2.pool, 1);
	assert_int_equal(kvpool_n_free(e2.pool), 1);
	free(path);
	env_done(&e1);
	env_done(&e2);
	tmpdir_free(dir);
}

/* Saving again replaces the file; mode 0600; nothing temporary left. */
static void test_mode_and_replace(void **state)
{
	struct fx *f = *state;
	struct session *s;
	mode_t old = umask(0277);  /* the mode must not depend on the umask */
	char *path = save_std(f->dir, &f->e, &s);
	umask(old);
	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0600);
	assert_true(S_ISREG(st.st_mode));
	assert_int_equal(count_prefix(f->dir, ".tmp-"), 0);

	int32_t more[5] = { 9, 9, 9, 9, 9 };
	assert_int_equal(sess_append(s, more, 5, CHAT_USER, "again", 1), 0);
	char *cause = NULL;
	assert_int_equal(store_save(f->dir, s, f->e.pool, FP, &cause), 0);
	assert_int_equal(count_prefix(f->dir, ".tmp-"), 0);
	assert_int_equal(count_prefix(f->dir, "0-work"), 1);

	struct session *b = sess_create(&f->e2.t, 0, "work");
	assert_int_equal(store_load(path, b, f->e2.pool, FP, 0, &cause), 0);
	assert_same(s, f->e.pool, b, f->e2.pool, 1);
	assert_int_equal(b->n_tokens, 80);
	free(path);
}

static void test_store_path(void **state)
{
	(void)state;
	char *p = store_path("/d", 0, "work");
	assert_string_equal(p, "/d/0-work.session");
	free(p);
	p = store_path("/var/lib/llamad", 4294967294u, "..");
	assert_string_equal(p, "/var/lib/llamad/4294967294-...session");
	free(p);
	assert_null(store_path("/d", 0, "a/b"));
	assert_null(store_path("/d", 0, ""));
}

static void test_remove(void **state)
{
	struct fx *f = *state;
	assert_int_equal(access(f->path, F_OK), 0);
	assert_int_equal(store_remove(f->dir, 0, "work"), 0);
	assert_int_equal(access(f->path, F_OK), -1);
	assert_int_equal(store_remove(f->dir, 0, "work"), 0);     /* already gone */
	assert_int_equal(store_remove(f->dir, 0, "../x"), -EINVAL);
}

/* ---- listing ------------------------------------------------------------ */

struct reports {
	int n;
	char path[8][512];
	char reason[8][512];
};

static void on_report(void *ctx, const char *path, const char *reason)
{
	struct reports *r = ctx;
	assert_true(r->n < 8);
	snprintf(r->path[r->n], sizeof(r->path[0]), "%s", path);
	snprintf(r->reason[r->n], sizeof(r->reason[0]), "%s", reason);
	r->n++;
}

/* The report for a path ending in name, or NULL. */
static const char *reason_of(const struct reports *r, const char *name)
{
	for (int i = 0; i < r->n; i++) {
		size_t a = strlen(r->path[i]), b = strlen(name);
		if (a >= b && !strcmp(r->path[i] + a - b, name))
			return r->reason[i];
	}
	return NULL;
}

static void test_list(void **state)
{
	struct fx *f = *state;
	char *cause = NULL;
	struct session *a = make_session(&f->e, 0, "work", 75, 40, 0);
	struct session *b = make_session(&f->e, 1001, "chat.1", 10, 0, 0);
	b->last_use_ms = -5;
	assert_int_equal(store_save(f->dir, a, f->e.pool, FP, &cause), 0);
	assert_int_equal(store_save(f->dir, b, f->e.pool, FP ^ 1, &cause), 0);

	char *p = path_join(f->dir, ".tmp-0-work.session.123.0");
	write_file(p, "partial", 7);
	free(p);
	p = path_join(f->dir, "junk.session");
	write_file(p, "not a session file at all", 25);
	free(p);
	p = path_join(f->dir, "notes.txt");
	write_file(p, "skipped", 7);
	free(p);
	/* a valid file under another name */
	size_t n;
	char *src = store_path(f->dir, 0, "work");
	unsigned char *buf = read_file(src, &n);
	p = path_join(f->dir, "5-other.session");
	write_file(p, buf, n);
	free(p);
	free(buf);
	p = path_join(f->dir, "7-f->dir.session");
	assert_int_equal(mkdir(p, 0700), 0);
	free(p);

	struct reports r = { 0 };
	struct store_entry *ents = NULL;
	int cnt = store_list(f->dir, &ents, on_report, &r);
	assert_int_equal(cnt, 2);
	/* sorted by path: "0-work" before "1001-chat.1" */
	assert_string_equal(ents[0].id, "work");
	assert_int_equal(ents[0].uid, 0);
	assert_true(ents[0].fingerprint == FP);
	assert_int_equal(ents[0].n_tokens, 75);
	assert_int_equal(ents[0].n_cached, 40);
	assert_int_equal(ents[0].n_turns, 8);  /* system, six turns of up to 13 tokens, system */
	assert_true(ents[0].last_use_ms == 1700000000123LL);
	struct stat st;
	assert_int_equal(stat(src, &st), 0);
	assert_true(ents[0].file_bytes == (uint64_t)st.st_size);
	assert_string_equal(ents[0].path, src);
	assert_string_equal(ents[1].id, "chat.1");
	assert_int_equal(ents[1].uid, 1001);
	assert_true(ents[1].fingerprint == (FP ^ 1));
	assert_int_equal(ents[1].n_tokens, 10);
	assert_int_equal(ents[1].n_cached, 0);
	assert_true(ents[1].last_use_ms == -5);
	store_entries_free(ents, cnt);

	assert_int_equal(r.n, 4);
	assert_non_null(reason_of(&r, "/.tmp-0-work.session.123.0"));
	assert_non_null(strstr(reason_of(&r, "/.tmp-0-work.session.123.0"), "removed"));
	assert_non_null(strstr(reason_of(&r, "/junk.session"), "bad magic"));
	assert_non_null(strstr(reason_of(&r, "/5-other.session"), "file name"));
	assert_non_null(strstr(reason_of(&r, "/7-f->dir.session"), "not a regular file"));
	assert_null(reason_of(&r, "notes.txt"));
	assert_int_equal(count_prefix(f->dir, ".tmp-"), 0);

	/* a second listing has nothing more to remove */
	r.n = 0;
	cnt = store_list(f->dir, &ents, NULL, NULL);
	assert_int_equal(cnt, 2);
	store_entries_free(ents, cnt);

	/* an empty folder, a missing one */
	char *empty = tmpdir_new();
	assert_int_equal(store_list(empty, &ents, on_report, &r), 0);
	assert_null(ents);
	store_entries_free(NULL, 0);
	tmpdir_free(empty);
	assert_int_equal(store_list("/nonexistent/llamad-state", &ents, NULL, NULL), -ENOENT);

	free(src);
}

/* Headers that store_list reports: corrupt, other version, truncated. */
static void test_list_bad_headers(void **state)
{
	struct fx *f = *state;
	size_t n;
	unsigned char *buf = read_file(f->path, &n);
	unsigned char *m = malloc(n);
	assert_non_null(m);

	struct reports r = { 0 };
	struct store_entry *ents;
	memcpy(m, buf, n);
	m[OFF_N_TOKENS] ^= 1;
	write_file(f->path, m, n);
	assert_int_equal(store_list(f->dir, &ents, on_report, &r), 0);
	assert_int_equal(r.n, 1);
	assert_string_equal(r.path[0], f->path);
	assert_non_null(strstr(r.reason[0], "corrupt header"));

	r.n = 0;
	memcpy(m, buf, n);
	sf_put(m + OFF_VERSION, 7, 4);
	fix_header_sum(m);
	write_file(f->path, m, n);
	assert_int_equal(store_list(f->dir, &ents, on_report, &r), 0);
	assert_int_equal(r.n, 1);
	assert_non_null(strstr(r.reason[0], "format version 7"));

	r.n = 0;
	write_file(f->path, buf, n - 1);
	assert_int_equal(store_list(f->dir, &ents, on_report, &r), 0);
	assert_int_equal(r.n, 1);
	assert_non_null(strstr(r.reason[0], "truncated"));

	free(m);
	free(buf);
}

/* ---- bad files ------------------------------------------------------------ */

static void test_corrupt_body(void **state)
{
	struct fx *f = *state;
	size_t n;
	unsigned char *buf = read_file(f->path, &n);
	/* one byte in the tokens, one in a text, one in the last K/V block */
	size_t offs[] = { HB + 1, HB + 75 * 4 + 12, n - 3 };
	for (size_t i = 0; i < sizeof(offs) / sizeof(offs[0]); i++) {
		buf[offs[i]] ^= 0x40;
		write_file(f->path, buf, n);
		char *cause;
		assert_int_equal(try_load(&f->e, f->path, 0, "work", FP, 0, &cause), -EBADMSG);
		assert_non_null(strstr(cause, "checksum mismatch"));
		free(cause);
		buf[offs[i]] ^= 0x40;
	}
	write_file(f->path, buf, n);
	assert_int_equal(try_load(&f->e, f->path, 0, "work", FP, 0, NULL), 0);
	free(buf);
}

/* The history alone (a transcript of a session on disk): the K/V is not
 * read, so damage there does not stop it, and damage to the history does;
 * no pool block is taken; any model's file. */
static void test_history_only(void **state)
{
	struct fx *f = *state;
	size_t n;
	unsigned char *buf = read_file(f->path, &n);
	int free0 = kvpool_n_free(f->e.pool);
	for (int round = 0; round < 4; round++) {
		unsigned char *m = malloc(n);
		assert_non_null(m);
		memcpy(m, buf, n);
		if (round == 1)
			m[n - 3] ^= 0x40;        /* the last K/V block: body checksum wrong */
		if (round == 2)
			m[HB + 5] ^= 0x40;       /* a token: both checksums wrong */
		if (round == 3) {                /* another model's file */
			sf_put(m + SF_FINGERPRINT, FP ^ 7, 8);
			sf_fix_header_sum(m);
		}
		write_file(f->path, m, n);
		free(m);
		struct session h;
		memset(&h, 0, sizeof(h));
		strcpy(h.id, "work");
		char *cause = NULL;
		int rc = store_load_history(f->path, &h, &cause);
		if (round == 2) {
			assert_int_equal(rc, -EBADMSG);
			assert_non_null(strstr(cause, "checksum mismatch"));
			assert_empty(&h);
		} else {
			assert_int_equal(rc, 0);
			assert_null(cause);
			assert_same(f->s, f->e.pool, &h, f->e.pool, 0);
		}
		free(cause);
		sess_clear_history(&f->e.t, &h);
		assert_int_equal(kvpool_n_free(f->e.pool), free0);
		/* a whole load checks every byte */
		assert_int_equal(try_load(&f->e2, f->path, 0, "work", FP, 0, NULL),
				 round == 0 ? 0 : round == 3 ? -ESTALE : -EBADMSG);
	}
	free(buf);
}

/* A version 1 image (written before turns had an end byte and the header
 * a meta_sum) of the version 2 image v2 (n bytes), by the documented
 * layouts; *out_n its size (malloc'd, at least n bytes). */
static unsigned char *to_version1(const unsigned char *v2, size_t n, size_t *out_n)
{
	uint32_t n_tokens = (uint32_t)sf_get(v2 + SF_N_TOKENS, 4);
	uint32_t n_turns = (uint32_t)sf_get(v2 + SF_N_TURNS, 4);
	unsigned char *v1 = calloc(1, n);
	assert_non_null(v1);
	memcpy(v1, v2, SF_CHECKSUM);
	size_t in = HB, out = HB;
	memcpy(v1 + out, v2 + in, 4 * (size_t)n_tokens);
	in += 4 * (size_t)n_tokens;
	out += 4 * (size_t)n_tokens;
	for (uint32_t i = 0; i < n_turns; i++) {
		memcpy(v1 + out, v2 + in, 5);   /* start, role; the end byte goes */
		uint32_t len = (uint32_t)sf_get(v2 + in + 6, 4);
		size_t text = len == 0xffffffffu ? 0 : len;
		memcpy(v1 + out + 5, v2 + in + 6, 4 + text);
		in += 10 + text;
		out += 9 + text;
	}
	memcpy(v1 + out, v2 + in, n - in);  /* system prompts and K/V */
	out += n - in;
	sf_put(v1 + SF_VERSION, 1, 4);
	sf_put(v1 + SF_BODY_BYTES, out - HB, 8);
	sf_put(v1 + SF_CHECKSUM, XXH64(v1 + HB, out - HB, 0), 8);
	sf_put(v1 + SF_HEADER_SUM_V1, XXH64(v1, SF_HEADER_SUM_V1, 0), 8);
	*out_n = out;
	return v1;
}

/* A version 1 file made from a version 2 image: it loads whole, K/V
 * included, with no turn ended; its history alone is checked by the body
 * checksum. */
static void test_version1_file(void **state)
{
	struct fx *f = *state;
	size_t n, out;
	unsigned char *v2 = read_file(f->path, &n);
	unsigned char *v1 = to_version1(v2, n, &out);
	write_file(f->path, v1, out);

	for (int i = 0; i < f->s->n_turns; i++)
		f->s->turns[i].end = 0;
	struct session *b = sess_create(&f->e2.t, 0, "work");
	char *cause = NULL;
	assert_int_equal(store_load(f->path, b, f->e2.pool, FP, 0, &cause), 0);
	assert_null(cause);
	assert_same(f->s, f->e.pool, b, f->e2.pool, 1);
	sess_drop(&f->e2.t, b);
	struct session h;
	memset(&h, 0, sizeof(h));
	strcpy(h.id, "work");
	assert_int_equal(store_load_history(f->path, &h, &cause), 0);
	assert_same(f->s, f->e.pool, &h, f->e.pool, 0);
	sess_clear_history(&f->e.t, &h);
	v1[out - 3] ^= 1;   /* K/V damage: version 1 has no checksum of the history alone */
	write_file(f->path, v1, out);
	memset(&h, 0, sizeof(h));
	strcpy(h.id, "work");
	assert_int_equal(store_load_history(f->path, &h, &cause), -EBADMSG);
	free(cause);
	free(v1);
	free(v2);
}

static void test_corrupt_header(void **state)
{
	struct fx *f = *state;
	size_t n;
	unsigned char *buf = read_file(f->path, &n);
	/* any byte after the version: a field, the id, a checksum, padding */
	size_t offs[] = { 12, 16, 40, 92, 100, 150, 229, 240, 250, 255 };
	for (size_t i = 0; i < sizeof(offs) / sizeof(offs[0]); i++) {
		buf[offs[i]] ^= 0x01;
		write_file(f->path, buf, n);
		char *cause;
		assert_int_equal(try_load(&f->e, f->path, 0, "work", FP, 0, &cause), -EBADMSG);
		assert_non_null(strstr(cause, "corrupt"));
		free(cause);
		buf[offs[i]] ^= 0x01;
	}
	/* consistent header sums but impossible counts */
	struct { int off; uint32_t v; } bad[] = {
		{ OFF_N_CACHED, 76 },           /* more cached than tokens */
		{ OFF_N_TOKENS, (1u << 24) + 1 },
		{ OFF_N_TURNS, 0xffffffffu },
		{ OFF_N_TURNS, 1000 },          /* body too small */
		{ 28, 0 },                      /* block_size 0 */
		{ 56, 9 },                      /* template */
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		unsigned char *m = malloc(n);
		memcpy(m, buf, n);
		sf_put(m + bad[i].off, bad[i].v, 4);
		fix_header_sum(m);
		write_file(f->path, m, n);
		assert_int_equal(try_load(&f->e, f->path, 0, "work", FP, 0, NULL), -EBADMSG);
		free(m);
	}
	free(buf);
}

/* Body fields that pass the checksums (a forged file) are still checked. */
static void test_forged_body(void **state)
{
	struct fx *f = *state;
	size_t n;
	unsigned char *buf = read_file(f->path, &n);
	unsigned char *m = malloc(n);
	assert_non_null(m);
	size_t turn0 = HB + 75 * 4;   /* the empty system turn at 0, text "be brief" */
	struct { size_t off; uint32_t v; int u8; const char *why; } bad[] = {
		{ HB, 0x80000000u, 0, "negative token" },
		{ turn0, 76, 0, "bad turn" },               /* start past the end */
		{ turn0 + 4, 4, 1, "bad turn" },             /* role */
		{ turn0 + 5, 6, 1, "bad turn" },             /* end: no such stop reason */
		{ turn0 + 6, 0xfffffff0u, 0, "text length" },
		{ turn0 + 6, 9, 0, NULL },                   /* text runs into the next turn */
		{ turn0 + 10, 0, 1, "NUL byte" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		memcpy(m, buf, n);
		if (bad[i].u8)
			m[bad[i].off] = (unsigned char)bad[i].v;
		else
			sf_put(m + bad[i].off, bad[i].v, 4);
		fix_sums(m, n);
		write_file(f->path, m, n);
		char *cause;
		assert_int_equal(try_load(&f->e, f->path, 0, "work", FP, 0, &cause), -EBADMSG);
		if (bad[i].why)
			assert_non_null(strstr(cause, bad[i].why));
		free(cause);
	}
	/* a larger body_bytes than the file: truncated */
	memcpy(m, buf, n);
	sf_put(m + OFF_BODY_BYTES, n - HB + 1, 8);
	fix_header_sum(m);
	write_file(f->path, m, n);
	char *cause;
	assert_int_equal(try_load(&f->e, f->path, 0, "work", FP, 0, &cause), -EBADMSG);
	assert_non_null(strstr(cause, "truncated"));
	free(cause);
	/* trailing bytes */
	unsigned char *longer = calloc(1, n + 3);
	memcpy(longer, buf, n);
	write_file(f->path, longer, n + 3);
	assert_int_equal(try_load(&f->e, f->path, 0, "work", FP, 0, NULL), -EBADMSG);
	free(longer);
	free(m);
	free(buf);
}

static void test_truncated(void **state)
{
	struct fx *f = *state;
	size_t n;
	unsigned char *buf = read_file(f->path, &n);
	size_t lens[] = { 0, 5, 10, HB - 1, HB, HB + 5, n / 2, n - 1 };
	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		write_file(f->path, buf, lens[i]);
		char *cause;
		assert_int_equal(try_load(&f->e, f->path, 0, "work", FP, 0, &cause), -EBADMSG);
		assert_non_null(strstr(cause, "truncated"));
		free(cause);
	}
	/* "truncated: N bytes, header says M" */
	write_file(f->path, buf, HB + 5);
	char *cause, want[64];
	try_load(&f->e, f->path, 0, "work", FP, 0, &cause);
	snprintf(want, sizeof(want), "truncated: %d bytes, header says %zu", HB + 5, n);
	assert_non_null(strstr(cause, want));
	free(cause);
	/* a file that does not exist */
	unlink(f->path);
	assert_int_equal(try_load(&f->e, f->path, 0, "work", FP, 0, NULL), -ENOENT);
	free(buf);
}

static void test_version_and_magic(void **state)
{
	struct fx *f = *state;
	size_t n;
	unsigned char *buf = read_file(f->path, &n);
	unsigned char *m = malloc(n);
	assert_non_null(m);
	char *cause;

	memcpy(m, buf, n);
	sf_put(m + OFF_VERSION, 7, 4);
	fix_header_sum(m);
	write_file(f->path, m, n);
	assert_int_equal(try_load(&f->e, f->path, 0, "work", FP, 0, &cause), -EPROTO);
	assert_non_null(strstr(cause, "newer"));
	assert_non_null(strstr(cause, "format version 7"));
	free(cause);

	memcpy(m, buf, n);
	sf_put(m + OFF_VERSION, 0, 4);
	write_file(f->path, m, n);
	assert_int_equal(try_load(&f->e, f->path, 0, "work", FP, 0, &cause), -EPROTO);
	assert_non_null(strstr(cause, "older"));
	assert_non_null(strstr(cause, "format version 0"));
	free(cause);

	memcpy(m, buf, n);
	m[0] = 'X';
	write_file(f->path, m, n);
	assert_int_equal(try_load(&f->e, f->path, 0, "work", FP, 0, &cause), -EPROTO);
	assert_non_null(strstr(cause, "magic"));
	free(cause);
	write_file(f->path, "GGUF....", 8);
	assert_int_equal(try_load(&f->e, f->path, 0, "work", FP, 0, NULL), -EPROTO);

	free(m);
	free(buf);
}

static void test_foreign_model(void **state)
{
	struct fx *f = *state;
	struct session *a = f->s;
	char *cause;
	assert_int_equal(try_load(&f->e2, f->path, 0, "work", FP + 1, 0, &cause), -ESTALE);
	assert_non_null(strstr(cause, "saved under a different model"));
	free(cause);

	struct session *b = sess_create(&f->e2.t, 0, "work");
	assert_int_equal(store_load(f->path, b, f->e2.pool, FP + 1, 1, &cause), 0);
	assert_same(a, f->e.pool, b, f->e2.pool, 0);
	assert_int_equal(kvpool_n_free(f->e2.pool), NB);
	/* history only: the body is still verified */
	sess_drop(&f->e2.t, b);
	size_t n;
	unsigned char *buf = read_file(f->path, &n);
	buf[n - 1] ^= 1;
	write_file(f->path, buf, n);
	assert_int_equal(try_load(&f->e2, f->path, 0, "work", FP + 1, 1, NULL), -EBADMSG);
	free(buf);
}

static void test_kv_shape_mismatch(void **state)
{
	struct fx *f = *state;
	struct session *a = f->s;
	int shapes[][3] = { { BS * 2, NL, KVD }, { BS, NL + 1, KVD }, { BS, NL, KVD * 2 } };
	for (int i = 0; i < 3; i++) {
		struct env e2;
		env_init(&e2, NB, shapes[i][0], shapes[i][1], shapes[i][2]);
		char *cause;
		assert_int_equal(try_load(&e2, f->path, 0, "work", FP, 0, &cause), -ESTALE);
		assert_non_null(strstr(cause, "KV layout"));
		free(cause);
		/* allowed: the history without the cache */
		struct session *b = sess_create(&e2.t, 0, "work");
		assert_int_equal(store_load(f->path, b, e2.pool, FP, 1, &cause), 0);
		assert_same(a, f->e.pool, b, e2.pool, 0);
		assert_int_equal(kvpool_n_free(e2.pool), NB);
		env_done(&e2);
	}
	/* nothing cached: the shape does not matter */
	struct session *c = make_session(&f->e, 0, "nocache", 20, 0, 0);
	char *cause = NULL;
	assert_int_equal(store_save(f->dir, c, f->e.pool, FP, &cause), 0);
	char *p2 = store_path(f->dir, 0, "nocache");
	struct env e3;
	env_init(&e3, NB, BS * 2, NL, KVD);
	assert_int_equal(try_load(&e3, p2, 0, "nocache", FP, 0, NULL), 0);
	env_done(&e3);
	free(p2);
}

/*
 * K/V element types: a session saved from an f32, f16 or q8_0 pool is
 * written in that type (the K/V part of the file 4, 2 or 1.25 bytes an
 * element at kv_dim 8: one f16 scale per 8 codes) and loads into a pool of
 * any of the three, converted: the loaded blocks hold exactly what storing
 * the file's (dequantized) rows in the pool's type gives. A file whose
 * type field names no type we know (bf16, a q8_0 group that does not
 * divide kv_dim) is refused, naming it.
 */
static void test_kv_types(void **state)
{
	(void)state;
	static const enum kt_dtype types[] = { KT_F32, KT_F16, KT_Q8_0 };
	char *dir = tmpdir_new();
	const int n_cached = 37, nb = (n_cached + BS - 1) / BS;
	float k[KVD], v[KVD], k2[KVD], v2[KVD];
	for (size_t si = 0; si < 3; si++)
		for (size_t li = 0; li < 3; li++) {
			struct env a, b;
			memset(&a, 0, sizeof(a));
			memset(&b, 0, sizeof(b));
			a.pool = kvpool_new_typed(NULL, types[si], KVD, NB, BS, NL, KVD);
			b.pool = kvpool_new_typed(NULL, types[li], KVD, NB, BS, NL, KVD);
			assert_non_null(a.pool);
			assert_non_null(b.pool);
			/* rows past n_cached are saved and converted too: make them
			 * zeros, not whatever the allocation held */
			memset(a.pool->kv.base, 0, kt_kv_block_bytes(&a.pool->kv) * NB);
			assert_int_equal(sess_table_init(&a.t, a.pool), 0);
			assert_int_equal(sess_table_init(&b.t, b.pool), 0);
			struct session *s = make_session(&a, 0, "typed", 40, 0, 0);
			assert_int_equal(kvseq_prepare(a.pool, &s->kv, n_cached, 0), 0);
			s->n_cached = n_cached;
			for (int p = 0; p < n_cached; p++)
				for (int l = 0; l < NL; l++) {
					for (int c = 0; c < KVD; c++) {
						k[c] = (float)((p * 31 + l * 7 + c * 13) % 97) / 9.0f - 5;
						v[c] = (float)((p * 17 + l * 5 + c * 11) % 89) / 7.0f - 6;
					}
					kt_kv_put(&a.pool->kv, s->kv.blocks[p / BS], l, p % BS, k, v);
				}
			char *cause = NULL;
			assert_int_equal(store_save(dir, s, a.pool, FP, &cause), 0);
			char *path = store_path(dir, 0, "typed");
			size_t len;
			unsigned char *file = read_file(path, &len);
			uint32_t dt = (uint32_t)file[24] | (uint32_t)file[25] << 8;
			assert_int_equal(dt & 0xff, types[si]);
			assert_int_equal(dt >> 8, types[si] == KT_Q8_0 ? 8 : 0);
			size_t elem4 = types[si] == KT_F32 ? 16 : types[si] == KT_F16 ? 8 : 5;
			uint64_t body = 0;
			for (int i = 0; i < 8; i++)
				body |= (uint64_t)file[OFF_BODY_BYTES + i] << (8 * i);
			uint64_t kv_part = (uint64_t)nb * BS * NL * 2 * KVD * elem4 / 4;
			assert_true(body > kv_part && body - kv_part < 4096);
			free(file);

			struct session *t = sess_create(&b.t, 0, "typed");
			assert_int_equal(store_load(path, t, b.pool, FP, 0, &cause), 0);
			assert_int_equal(t->n_cached, n_cached);
			/* the expected blocks: a's rows stored in b's type */
			struct kt_kv ref = b.pool->kv;
			ref.n_blocks = 1;
			ref.base = calloc(1, kt_kv_block_bytes(&ref));
			assert_non_null(ref.base);
			for (int i = 0; i < nb; i++) {
				for (int l = 0; l < NL; l++)
					for (int r = 0; r < BS; r++) {
						kt_kv_get_k(&a.pool->kv, s->kv.blocks[i], l, r, k2);
						kt_kv_get_v(&a.pool->kv, s->kv.blocks[i], l, r, v2);
						kt_kv_put(&ref, 0, l, r, k2, v2);
					}
				assert_memory_equal(ref.base, kt_kv_block(&b.pool->kv, t->kv.blocks[i]),
						    kt_kv_block_bytes(&ref));
			}
			free(ref.base);
			sess_drop(&b.t, t);
			sess_drop(&a.t, s);
			assert_int_equal(store_remove(dir, 0, "typed"), 0);
			free(path);
			env_done(&a);
			env_done(&b);
		}
	/* unknown types, a q8_0 group that does not divide kv_dim */
	struct env e;
	env_init(&e, NB, BS, NL, KVD);
	struct session *s = make_session(&e, 0, "badtype", 40, 37, 0);
	char *cause = NULL;
	assert_int_equal(store_save(dir, s, e.pool, FP, &cause), 0);
	char *path = store_path(dir, 0, "badtype");
	size_t len;
	unsigned char *orig = read_file(path, &len);
	static const uint32_t bad[] = { 2, 4, 3 | 12 << 8, 3 | 16 << 8, 1 | 8 << 8, 0x10000 };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		unsigned char *f = malloc(len);
		assert_non_null(f);
		memcpy(f, orig, len);
		for (int j = 0; j < 4; j++)
			f[24 + j] = (unsigned char)(bad[i] >> (8 * j));
		fix_header_sum(f);
		write_file(path, f, len);
		assert_int_equal(try_load(&e, path, 0, "badtype", FP, 1, &cause), -EPROTO);
		assert_non_null(strstr(cause, "KV element type"));
		free(cause);
		free(f);
	}
	free(orig);
	free(path);
	sess_drop(&e.t, s);
	env_done(&e);
	tmpdir_free(dir);
}

static void test_owner_mismatch(void **state)
{
	struct fx *f = *state;
	char *cause;
	assert_int_equal(try_load(&f->e, f->path, 0, "other", FP, 0, &cause), -EINVAL);
	assert_non_null(strstr(cause, "'work'"));
	free(cause);
	assert_int_equal(try_load(&f->e, f->path, 1000, "work", FP, 0, NULL), -EINVAL);
	/* a session that is not empty */
	struct session *s = sess_create(&f->e.t, 0, "work");
	int32_t t = 1;
	assert_int_equal(sess_append(s, &t, 1, CHAT_USER, NULL, 1), 0);
	assert_int_equal(store_load(f->path, s, f->e.pool, FP, 0, &cause), -EINVAL);
	assert_int_equal(s->n_tokens, 1);
	free(cause);
}

static void test_pool_full(void **state)
{
	struct fx *f = *state;
	/* the standard session: 5 blocks */
	struct env small;
	env_init(&small, 4, BS, NL, KVD);
	char *cause;
	assert_int_equal(try_load(&small, f->path, 0, "work", FP, 0, &cause), -ENOSPC);
	assert_non_null(strstr(cause, "the KV cache is full"));
	free(cause);
	env_done(&small);
	/* exactly enough free */
	struct env tight;
	env_init(&tight, 8, BS, NL, KVD);
	int32_t held[3];
	for (int i = 0; i < 3; i++)
		held[i] = kvpool_alloc(tight.pool);
	assert_int_equal(try_load(&tight, f->path, 0, "work", FP, 0, NULL), 0);
	kvpool_unref(tight.pool, held[0]);
	kvpool_unref(tight.pool, held[1]);
	held[0] = kvpool_alloc(tight.pool);
	held[1] = kvpool_alloc(tight.pool);
	(void)kvpool_alloc(tight.pool);   /* 4 free: one short */
	assert_int_equal(try_load(&tight, f->path, 0, "work", FP, 0, NULL), -ENOSPC);
	env_done(&tight);
}

/* ---- failed saves ----------------------------------------------------------- */

/* The file at path still loads as the standard session. */
static void assert_std_intact(const char *path)
{
	struct env e;
	env_init(&e, NB, BS, NL, KVD);
	struct session *s = sess_create(&e.t, 0, "work");
	char *cause = NULL;
	assert_int_equal(store_load(path, s, e.pool, FP, 0, &cause), 0);
	assert_int_equal(s->n_tokens, 75);
	assert_int_equal(s->n_cached, 75);
	env_done(&e);
}

static void test_save_errors(void **state)
{
	struct fx *f = *state;
	struct session *s = make_session(&f->e, 0, "work", 75, 75, 0);
	char *cause = NULL;

	/* the folder does not exist */
	assert_int_equal(store_save("/nonexistent/llamad-state", s, f->e.pool, FP, &cause), -ENOENT);
	assert_null(strstr(cause, "/nonexistent"));  /* the reason, not the path */
	assert_string_equal(cause, strerror(ENOENT));
	free(cause);

	/* a session whose block table does not cover its cache */
	s->n_cached = 75;
	struct kvseq saved = s->kv;
	s->kv.n_blocks = 2;
	assert_int_equal(store_save(f->dir, s, f->e.pool, FP, &cause), -EINVAL);
	assert_non_null(cause);
	free(cause);
	s->kv = saved;
	assert_int_equal(count_prefix(f->dir, ".tmp-"), 0);

	/* the final name is taken by a folder: rename fails, the temp goes */
	char *path = store_path(f->dir, 0, "work");
	assert_int_equal(mkdir(path, 0700), 0);
	int rc = store_save(f->dir, s, f->e.pool, FP, &cause);
	assert_true(rc == -EISDIR || rc == -EEXIST || rc == -ENOTEMPTY);
	assert_string_equal(cause, strerror(-rc));  /* the reason, no path */
	free(cause);
	assert_int_equal(count_prefix(f->dir, ".tmp-"), 0);
	assert_int_equal(rmdir(path), 0);

	/* a read-only folder (only stops non-root) */
	assert_int_equal(store_save(f->dir, s, f->e.pool, FP, &cause), 0);
	if (geteuid() != 0) {
		assert_int_equal(chmod(f->dir, 0500), 0);
		int32_t t = 5;
		assert_int_equal(sess_append(s, &t, 1, CHAT_USER, NULL, 1), 0);
		assert_int_equal(store_save(f->dir, s, f->e.pool, FP, &cause), -EACCES);
		free(cause);
		assert_int_equal(chmod(f->dir, 0700), 0);
		assert_std_intact(path);
	}
	free(path);
}

/* A full filesystem (a 64 KiB tmpfs; needs root and mount rights, else
 * skipped): -ENOSPC, the old file intact, no temporary left. */
static void test_save_enospc(void **state)
{
	struct fx *f = *state;
	if (geteuid() != 0 || mount("tmpfs", f->dir, "tmpfs", 0, "size=64k,mode=0700") != 0) {
		print_message("tmpfs mount not possible (%s): ENOSPC case skipped\n",
			      strerror(errno));
		skip();
	}
	f->mounted = 1;
	char *path = save_std(f->dir, &f->e, NULL);
	assert_std_intact(path);

	struct session *big = make_session(&f->e2, 0, "work", 75, 75, 200000);
	char *cause = NULL;
	assert_int_equal(store_save(f->dir, big, f->e2.pool, FP, &cause), -ENOSPC);
	assert_null(strstr(cause, f->dir));
	assert_non_null(strstr(cause, strerror(ENOSPC)));
	free(cause);
	assert_int_equal(count_prefix(f->dir, ".tmp-"), 0);
	assert_std_intact(path);

	/* a full disk: even a small session does not fit */
	char *filler = path_join(f->dir, "filler");
	int fd = open(filler, O_WRONLY | O_CREAT, 0600);
	assert_true(fd >= 0);
	char chunk[4096] = { 0 };
	while (write(fd, chunk, sizeof(chunk)) > 0)
		;
	close(fd);
	struct session *s2 = make_session(&f->e2, 0, "small", 5, 5, 0);
	assert_true(store_save(f->dir, s2, f->e2.pool, FP, &cause) == -ENOSPC);
	free(cause);
	assert_int_equal(count_prefix(f->dir, ".tmp-"), 0);
	assert_std_intact(path);
	free(filler);

	free(path);
	assert_int_equal(umount(f->dir), 0);
	f->mounted = 0;
}

/* ---- garbage ------------------------------------------------------------ */

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static uint32_t rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (uint32_t)(rng_state >> 16);
}

static void test_garbage(void **state)
{
	struct fx *f = *state;
	size_t n0;
	unsigned char *valid = read_file(f->path, &n0);
	unsigned char *m = malloc(n0 + 4096);
	assert_non_null(m);
	uint32_t header_fields[] = { 12, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60, 64, 92, 96 };
	int loaded = 0;
	for (int it = 0; it < 200; it++) {
		size_t n;
		switch (it % 6) {
		case 0:  /* random bytes */
			n = rnd() % 2048;
			for (size_t i = 0; i < n; i++)
				m[i] = (unsigned char)rnd();
			break;
		case 1:  /* our magic and version, random rest */
			n = rnd() % 1024;
			for (size_t i = 0; i < n; i++)
				m[i] = (unsigned char)rnd();
			memcpy(m, valid, n < 12 ? n : 12);
			break;
		case 2:  /* header bytes changed, header sum fixed */
			n = n0;
			memcpy(m, valid, n);
			for (int k = 1 + rnd() % 4; k > 0; k--)
				m[rnd() % SF_HEADER_SUM] ^= (unsigned char)(1 + rnd() % 255);
			fix_header_sum(m);
			break;
		case 3:  /* body bytes changed, both sums fixed: the parser sees it all */
			n = n0;
			memcpy(m, valid, n);
			for (int k = 1 + rnd() % 4; k > 0; k--)
				m[HB + rnd() % (n - HB)] ^= (unsigned char)(1 + rnd() % 255);
			fix_sums(m, n);
			break;
		case 4:  /* truncated or extended */
			n = rnd() % (n0 + 64);
			memcpy(m, valid, n < n0 ? n : n0);
			if (n > n0)
				memset(m + n0, 0, n - n0);
			break;
		default: /* a count or size field set to an extreme value */
			n = n0;
			memcpy(m, valid, n);
			{
				uint32_t v[] = { 0, 1, 0x7fffffffu, 0x80000000u, 0xffffffffu,
						 rnd(), rnd() % 200 };
				sf_put(m + header_fields[rnd() % 14], v[rnd() % 7], 4);
			}
			fix_sums(m, n);
			break;
		}
		write_file(f->path, m, n);
		int rc = try_load(&f->e, f->path, 0, "work", FP, it % 2, NULL);
		assert_true(rc <= 0);
		loaded += rc == 0;
		struct store_entry *ents;
		int cnt = store_list(f->dir, &ents, NULL, NULL);
		assert_true(cnt == 0 || cnt == 1);
		store_entries_free(ents, cnt);
	}
	print_message("garbage: %d of 200 files loaded (forged, consistent)\n", loaded);
	free(m);
	free(valid);
}

/* ---- version 3: shared blocks in block files ------------------------------ */

#define V3_UID 1000
#define V3_BASE 0x5eed5eedULL   /* the tables' name base (model and KV type) */

/* A session's chain: its seed and the names of its first n full blocks. */
struct chain {
	uint64_t seed;
	uint64_t names[8];
	int n;
};

/* make_session (uid V3_UID) in e with sharing on, and the chain of its
 * first n_refs blocks as the session names them. */
static struct session *make_v3(struct env *e, const char *id, int n_tokens, int n_cached,
			       size_t text_len, int n_refs, struct chain *c)
{
	sess_set_sharing(&e->t, 1, V3_BASE);
	struct session *s = make_session(e, V3_UID, id, n_tokens, n_cached, text_len);
	assert_true(n_refs <= 8);
	c->seed = sess_chain_seed(&e->t, s);
	c->n = n_refs;
	for (int i = 0; i < n_refs; i++) {
		c->names[i] = sess_block_name(&e->t, s, i);
		assert_true(c->names[i] != 0);
	}
	return s;
}

/* store_save_shared of s with chain c: rc, *written its count. */
static int save_v3(const char *dir, struct kvpool *pool, const struct session *s,
		   const struct chain *c, int *written, char **cause)
{
	struct store_chain ch = { .seed = c->seed, .names = c->names, .n = c->n };
	*written = -1;
	*cause = NULL;
	return store_save_shared(dir, s, pool, FP, &ch, written, cause);
}

static void must_save_v3(const char *dir, struct kvpool *pool, const struct session *s,
			 const struct chain *c, int want_written)
{
	char *cause;
	int written;
	assert_int_equal(save_v3(dir, pool, s, c, &written, &cause), 0);
	assert_null(cause);
	assert_int_equal(written, want_written);
}

/* "<dir>/blocks/<uid>-<name>.kvb", malloc'd. */
static char *block_path(const char *dir, uint32_t uid, uint64_t name)
{
	char f[64], *b = path_join(dir, BLK_DIR);
	blk_file_name(f, sizeof(f), uid, name);
	char *p = path_join(b, f);
	free(b);
	return p;
}

/* Entries of dir but "." and "..". */
static int dir_count(const char *dir)
{
	return count_prefix(dir, "") - 2;
}

/* store_load_ex into a new (V3_UID, id) session of t: the session (its
 * note in *note, the caller frees note->refs); asserts rc. */
static struct session *load_ex(struct sess_table *t, const char *path, const char *id,
			       struct store_note *note, int want_rc)
{
	struct session *s = sess_create(t, V3_UID, id);
	assert_non_null(s);
	char *cause = NULL;
	int rc = store_load_ex(path, s, t->pool, FP, 0, note, &cause);
	if (rc != want_rc)
		fail_msg("store_load_ex: %d (%s), expected %d", rc, cause ? cause : "-", want_rc);
	if (rc)
		assert_non_null(cause);
	else
		assert_null(cause);
	free(cause);
	return s;
}

/* The note of a load that kept only the history because of block file
 * `name` (of V3_UID), with a reason holding `why`. */
static void assert_bad_note(const struct store_note *note, uint64_t name, const char *why)
{
	char f[64];
	blk_file_name(f, sizeof(f), V3_UID, name);
	assert_true(note->bad_block);
	assert_int_equal(note->bad_uid, V3_UID);
	assert_true(note->bad_name == name);
	if (!strstr(note->bad_why, f) || !strstr(note->bad_why, why))
		fail_msg("note '%s': expected %s and '%s'", note->bad_why, f, why);
}

/*
 * Saved with 4 full blocks in block files (the fifth, partial, inline):
 * the state file is version 3 with the seed and names in its refs
 * section, each block file is header + tokens + one block, 0600. Loaded
 * into a pool without them: read from the files. Into the pool whose
 * session holds them named: shared (one more reference each), the block
 * files not needed (removed first), also once that session is gone and
 * they wait free under their names. Into a pool without them and without
 * the files: the history alone, the note naming block 0's file.
 */
static void test_v3_round_trip(void **state)
{
	struct fx *f = *state;
	struct chain c;
	struct session *a = make_v3(&f->e, "v3", 75, 75, 0, 4, &c);
	must_save_v3(f->dir, f->e.pool, a, &c, 4);
	char *path = store_path(f->dir, V3_UID, "v3"), *bdir = path_join(f->dir, BLK_DIR);
	size_t n;
	unsigned char *img = read_file(path, &n);
	size_t bb = kt_kv_block_bytes(&f->e.pool->kv);
	assert_int_equal(sf_get(img + SF_VERSION, 4), 3);
	assert_int_equal(sf_n_refs(img), 4);
	assert_int_equal(sf_kv_bytes(img), bb);          /* one block inline */
	size_t off = sf_refs_off(img, n);
	assert_true(off > HB);
	assert_true(sf_get(img + off, 8) == c.seed);
	for (int i = 0; i < 4; i++)
		assert_true(sf_get(img + off + 8 + 8 * (size_t)i, 8) == c.names[i]);
	free(img);
	struct stat st;
	for (int i = 0; i < 4; i++) {
		char *bp = block_path(f->dir, V3_UID, c.names[i]);
		assert_int_equal(stat(bp, &st), 0);
		assert_int_equal(st.st_size, BF_HEADER_BYTES + 4 * BS + bb);
		assert_int_equal(st.st_mode & 07777, 0600);
		size_t bn;
		unsigned char *b = read_file(bp, &bn);
		assert_memory_equal(b, "LLAMADB1", 8);
		assert_true(sf_get(b + BF_NAME, 8) == c.names[i]);
		assert_true(sf_get(b + BF_PARENT, 8) == (i ? c.names[i - 1] : c.seed));
		assert_memory_equal(b + BF_HEADER_BYTES, a->tokens + i * BS, 4 * BS);
		assert_memory_equal(b + BF_HEADER_BYTES + 4 * BS,
				    kt_kv_block(&f->e.pool->kv, a->kv.blocks[i]), bb);
		free(b);
		free(bp);
	}
	assert_int_equal(dir_count(bdir), 4);
	must_save_v3(f->dir, f->e.pool, a, &c, 0);       /* saved again: nothing new */
	assert_int_equal(dir_count(bdir), 4);
	assert_int_equal(count_prefix(f->dir, ".tmp-"), 0);

	/* a pool without the blocks: read from the files */
	struct store_note note;
	struct session *b = load_ex(&f->e2.t, path, "v3", &note, 0);
	assert_false(note.bad_block);
	assert_int_equal(note.n_refs, 4);
	assert_memory_equal(note.refs, c.names, sizeof(uint64_t) * 4);
	assert_same(a, f->e.pool, b, f->e2.pool, 1);
	free(note.refs);
	sess_drop(&f->e2.t, b);
	assert_int_equal(kvpool_n_free(f->e2.pool), NB);

	/* the pool holds them, named as a session's blocks are: shared */
	sess_name_blocks(&f->e.t, a);
	for (int i = 0; i < 4; i++)
		assert_true(f->e.pool->name[a->kv.blocks[i]] == c.names[i]);
	void *host = malloc(5 * bb);
	assert_non_null(host);
	assert_int_equal(kvseq_to_host(f->e.pool, &a->kv, host), 0);
	for (int i = 0; i < 4; i++) {
		char *bp = block_path(f->dir, V3_UID, c.names[i]);
		assert_int_equal(unlink(bp), 0);
		free(bp);
	}
	struct sess_table t2;
	assert_int_equal(sess_table_init(&t2, f->e.pool), 0);
	int free0 = kvpool_n_free(f->e.pool);
	b = load_ex(&t2, path, "v3", &note, 0);
	assert_false(note.bad_block);
	assert_int_equal(b->n_cached, 75);
	assert_int_equal(b->kv.n_blocks, 5);
	for (int i = 0; i < 4; i++) {
		assert_int_equal(b->kv.blocks[i], a->kv.blocks[i]);
		assert_int_equal(f->e.pool->refs[a->kv.blocks[i]], 2);
	}
	assert_true(b->kv.blocks[4] != a->kv.blocks[4]);
	assert_int_equal(f->e.pool->refs[b->kv.blocks[4]], 1);
	assert_memory_equal(kt_kv_block(&f->e.pool->kv, b->kv.blocks[4]), (char *)host + 4 * bb, bb);
	assert_int_equal(kvpool_n_free(f->e.pool), free0 - 1);
	free(note.refs);

	/* both gone: the named blocks wait free, and are taken again */
	sess_drop(&t2, b);
	sess_drop(&f->e.t, a);
	assert_int_equal(kvpool_n_cached(f->e.pool), 4);
	free0 = kvpool_n_free(f->e.pool);
	b = load_ex(&t2, path, "v3", &note, 0);
	assert_false(note.bad_block);
	assert_int_equal(b->n_cached, 75);
	assert_int_equal(kvpool_n_cached(f->e.pool), 0);
	assert_int_equal(kvpool_n_free(f->e.pool), free0 - 5);
	void *host2 = malloc(5 * bb);
	assert_non_null(host2);
	assert_int_equal(kvseq_to_host(f->e.pool, &b->kv, host2), 0);
	assert_memory_equal(host, host2, 5 * bb);
	free(note.refs);
	sess_drop(&t2, b);
	sess_table_done(&t2);

	/* neither the pool nor the folder has them: the history alone */
	b = load_ex(&f->e2.t, path, "v3", &note, 0);
	assert_bad_note(&note, c.names[0], strerror(ENOENT));
	assert_int_equal(b->n_cached, 0);
	assert_int_equal(b->kv.n_blocks, 0);
	assert_int_equal(b->n_tokens, 75);
	assert_int_equal(note.n_refs, 4);
	assert_int_equal(kvpool_n_free(f->e2.pool), NB);
	free(note.refs);
	sess_drop(&f->e2.t, b);
	free(host);
	free(host2);
	free(bdir);
	free(path);
}

/* Files of versions 2 and 1 load through store_load_ex: no names, no note.
 * A shared save without full blocks writes version 2. */
static void test_v3_old_versions(void **state)
{
	struct fx *f = *state;
	size_t n, n1;
	unsigned char *v2 = read_file(f->path, &n);
	assert_int_equal(sf_get(v2 + SF_VERSION, 4), 2);
	unsigned char *v1 = to_version1(v2, n, &n1);
	for (int round = 0; round < 2; round++) {
		if (round)
			write_file(f->path, v1, n1);
		struct session *b = sess_create(&f->e2.t, 0, "work");
		struct store_note note;
		char *cause = NULL;
		assert_int_equal(store_load_ex(f->path, b, f->e2.pool, FP, 0, &note, &cause), 0);
		assert_null(cause);
		assert_false(note.bad_block);
		assert_null(note.refs);
		assert_int_equal(note.n_refs, 0);
		assert_int_equal(b->n_cached, 75);
		assert_int_equal(b->n_tokens, 75);
		if (!round)
			assert_same(f->s, f->e.pool, b, f->e2.pool, 1);
		sess_drop(&f->e2.t, b);
	}
	free(v1);
	free(v2);

	struct chain c;
	struct session *s = make_v3(&f->e, "few", 40, 10, 0, 0, &c);  /* no full block */
	must_save_v3(f->dir, f->e.pool, s, &c, 0);
	char *p = store_path(f->dir, V3_UID, "few");
	unsigned char *img = read_file(p, &n);
	assert_int_equal(sf_get(img + SF_VERSION, 4), 2);
	free(img);
	free(p);
}

/* A version 3 file with no shared block (n_refs 0: the seed, no names;
 * the writer makes version 2 of such a session, the format allows it),
 * forged from a version 2 image: it loads whole, its history alone too,
 * and has no names. */
static void test_v3_no_refs(void **state)
{
	struct fx *f = *state;
	size_t n;
	unsigned char *v2 = read_file(f->path, &n);
	size_t meta_end = n - (size_t)sf_kv_bytes(v2);
	unsigned char *v3 = malloc(n + 8);
	assert_non_null(v3);
	memcpy(v3, v2, meta_end);
	sf_put(v3 + meta_end, 0x5eedULL, 8);
	memcpy(v3 + meta_end + 8, v2 + meta_end, n - meta_end);
	sf_put(v3 + SF_VERSION, 3, 4);
	sf_put(v3 + SF_N_REFS, 0, 4);
	sf_put(v3 + SF_BODY_BYTES, n + 8 - HB, 8);
	sf_reseal(v3, n + 8);
	assert_int_equal(sf_refs_off(v3, n + 8), meta_end);
	write_file(f->path, v3, n + 8);

	struct session *b = sess_create(&f->e2.t, 0, "work");
	struct store_note note;
	char *cause = NULL;
	int rc = store_load_ex(f->path, b, f->e2.pool, FP, 0, &note, &cause);
	if (rc)
		fail_msg("store_load_ex: %s", cause);
	assert_false(note.bad_block);
	assert_null(note.refs);
	assert_int_equal(note.n_refs, 0);
	assert_same(f->s, f->e.pool, b, f->e2.pool, 1);
	struct session h;
	memset(&h, 0, sizeof(h));
	strcpy(h.id, "work");
	assert_int_equal(store_load_history(f->path, &h, &cause), 0);
	assert_same(f->s, f->e.pool, &h, f->e.pool, 0);
	sess_clear_history(&f->e.t, &h);
	uint64_t *refs;
	int nr;
	assert_int_equal(store_read_refs(f->path, 0, "work", &refs, &nr, &cause), 0);
	assert_null(refs);
	assert_int_equal(nr, 0);
	free(v3);
	free(v2);
}

/* Block files damaged in every way the reader names: each gives a load of
 * the history alone with a note naming the file and why; the pool keeps
 * nothing of it. With the blocks before the bad one held by a session in
 * the same pool, those stay as they were. */
static void test_v3_bad_block_files(void **state)
{
	struct fx *f = *state;
	struct chain c;
	struct session *a = make_v3(&f->e, "v3", 75, 75, 0, 4, &c);
	must_save_v3(f->dir, f->e.pool, a, &c, 4);
	char *path = store_path(f->dir, V3_UID, "v3");
	size_t n, len[4];
	unsigned char *state_img = read_file(path, &n), *orig[4];
	char *bp[4];
	for (int i = 0; i < 4; i++) {
		bp[i] = block_path(f->dir, V3_UID, c.names[i]);
		orig[i] = read_file(bp[i], &len[i]);
	}
	enum { BODY, HEADER, RENAMED, UID, TOKENS, PARENT, MODEL, NAME, SHORT, MISSING, N_CASES };
	static const char *const why[N_CASES] = {
		[BODY] = "checksum mismatch", [HEADER] = "corrupt header",
		[RENAMED] = "its file name does not match its content",
		[UID] = "of uid 1001: its file name does not match",
		[TOKENS] = "holds other tokens", [PARENT] = "follows block",
		[MODEL] = "another model", [NAME] = "its name does not match its content",
		[SHORT] = "bytes, its header says 2208", [MISSING] = "No such file",
	};
	for (int k = 0; k < N_CASES; k++) {
		int v = k % 4;     /* the damaged block: each position in turn */
		for (int i = 0; i < 4; i++)
			write_file(bp[i], orig[i], len[i]);
		write_file(path, state_img, n);
		unsigned char *m = malloc(len[v]);
		assert_non_null(m);
		memcpy(m, orig[v], len[v]);
		size_t mlen = len[v];
		uint64_t bad = c.names[v];
		switch (k) {
		case BODY:
			m[mlen - 5] ^= 0x20;
			break;
		case HEADER:
			m[BF_BLOCK_SIZE] ^= 1;
			break;
		case RENAMED:  /* another block's file under this name */
			memcpy(m, orig[v ^ 1], len[v ^ 1]);
			break;
		case UID:
			sf_put(m + BF_UID, 1001, 4);
			bf_fix_header_sum(m);
			break;
		case TOKENS:
			sf_put(m + BF_HEADER_BYTES + 12, 77777, 4);
			bf_reseal(m, mlen);
			break;
		case PARENT:
			sf_put(m + BF_PARENT, sf_get(m + BF_PARENT, 8) ^ 4, 8);
			bf_fix_header_sum(m);
			break;
		case MODEL:
			sf_put(m + BF_FINGERPRINT, FP ^ 1, 8);
			bf_fix_header_sum(m);
			break;
		case NAME: {  /* file, header and state file agree on a name the
			       * tokens do not hash to */
			bad ^= 0xff00;
			sf_put(m + BF_NAME, bad, 8);
			bf_fix_header_sum(m);
			unsigned char *st = malloc(n);
			assert_non_null(st);
			memcpy(st, state_img, n);
			sf_put(st + sf_refs_off(st, n) + 8 + 8 * (size_t)v, bad, 8);
			sf_reseal(st, n);
			write_file(path, st, n);
			free(st);
			unlink(bp[v]);
			char *np = block_path(f->dir, V3_UID, bad);
			write_file(np, m, mlen);
			free(np);
			break;
		}
		case SHORT:
			mlen -= 1;
			break;
		}
		if (k == MISSING)
			assert_int_equal(unlink(bp[v]), 0);
		else if (k != NAME)
			write_file(bp[v], m, mlen);
		free(m);

		struct store_note note;
		struct session *b = load_ex(&f->e2.t, path, "v3", &note, 0);
		assert_bad_note(&note, bad, why[k]);
		assert_same(a, f->e.pool, b, f->e2.pool, 0);
		assert_int_equal(note.n_refs, 4);
		assert_int_equal(kvpool_n_free(f->e2.pool), NB);
		assert_int_equal(kvpool_n_cached(f->e2.pool), 0);
		free(note.refs);
		sess_drop(&f->e2.t, b);
		if (k == NAME) {
			char *np = block_path(f->dir, V3_UID, bad);
			unlink(np);
			free(np);
		}
	}

	/* blocks 0, 1 and 3 in the pool (a's, named), block 2's file bad:
	 * the shared blocks are taken and given back, nothing else changes */
	for (int i = 0; i < 4; i++)
		write_file(bp[i], orig[i], len[i]);
	write_file(path, state_img, n);
	orig[2][len[2] - 1] ^= 1;
	write_file(bp[2], orig[2], len[2]);
	sess_name_blocks(&f->e.t, a);
	kvpool_unname(f->e.pool, a->kv.blocks[2]);
	struct sess_table t2;
	assert_int_equal(sess_table_init(&t2, f->e.pool), 0);
	int free0 = kvpool_n_free(f->e.pool), cached0 = kvpool_n_cached(f->e.pool);
	struct store_note note;
	struct session *b = load_ex(&t2, path, "v3", &note, 0);
	assert_bad_note(&note, c.names[2], "checksum mismatch");
	assert_int_equal(b->n_cached, 0);
	assert_int_equal(kvpool_n_free(f->e.pool), free0);
	assert_int_equal(kvpool_n_cached(f->e.pool), cached0);
	for (int i = 0; i < 5; i++)
		assert_int_equal(f->e.pool->refs[a->kv.blocks[i]], 1);
	for (int i = 0; i < 4; i++)
		assert_true(f->e.pool->name[a->kv.blocks[i]] == (i == 2 ? 0 : c.names[i]));
	free(note.refs);
	sess_drop(&t2, b);
	sess_table_done(&t2);

	for (int i = 0; i < 4; i++) {
		free(orig[i]);
		free(bp[i]);
	}
	free(state_img);
	free(path);
}

/* inotify events waiting on fd (IN_NONBLOCK): their count. */
static int events(int fd)
{
	char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
	int n = 0;
	ssize_t got;
	while ((got = read(fd, buf, sizeof(buf))) > 0)
		for (char *p = buf; p < buf + got;
		     p += sizeof(struct inotify_event) + ((struct inotify_event *)p)->len)
			n++;
	return n;
}

/* A state file whose refs section is corrupt is refused (-EBADMSG) before
 * anything in the blocks folder is opened (inotify says), by store_load_ex,
 * store_load_history and store_read_refs alike. */
static void test_v3_corrupt_refs(void **state)
{
	struct fx *f = *state;
	struct chain c;
	struct session *a = make_v3(&f->e, "v3", 75, 75, 0, 4, &c);
	must_save_v3(f->dir, f->e.pool, a, &c, 4);
	char *path = store_path(f->dir, V3_UID, "v3"), *bdir = path_join(f->dir, BLK_DIR);
	int in = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	assert_true(in >= 0);
	assert_true(inotify_add_watch(in, bdir, IN_OPEN | IN_ACCESS) >= 0);
	struct store_note note;
	struct session *b = load_ex(&f->e2.t, path, "v3", &note, 0);   /* the control */
	assert_int_equal(b->n_cached, 75);
	free(note.refs);
	sess_drop(&f->e2.t, b);
	assert_true(events(in) >= 4);

	size_t n;
	unsigned char *orig = read_file(path, &n), *m = malloc(n);
	assert_non_null(m);
	size_t off = sf_refs_off(orig, n);
	struct { int field; uint64_t v; int reseal; const char *why; } bad[] = {
		{ 1, 1u << 8, 0, "checksum mismatch" },      /* a name's bit */
		{ 0, 1, 0, "checksum mismatch" },             /* the seed's */
		{ 2, 0, 1, "without a name" },                /* a name 0 */
		{ -1, 5, 2, "5 shared blocks" },              /* n_refs past the full blocks */
		{ -1, 3, 2, NULL },                           /* n_refs one short */
		{ -1, 0, 2, NULL },                           /* n_refs 0: no names */
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		memcpy(m, orig, n);
		if (bad[i].field >= 0) {
			unsigned char *p = m + off + 8 * (size_t)bad[i].field;
			sf_put(p, bad[i].reseal ? bad[i].v : sf_get(p, 8) ^ bad[i].v, 8);
		} else {
			sf_put(m + SF_N_REFS, bad[i].v, 4);
		}
		if (bad[i].reseal == 1)
			sf_reseal(m, n);
		else if (bad[i].reseal == 2)
			sf_fix_header_sum(m);
		write_file(path, m, n);
		b = sess_create(&f->e2.t, V3_UID, "v3");
		char *cause = NULL;
		assert_int_equal(store_load_ex(path, b, f->e2.pool, FP, 0, &note, &cause), -EBADMSG);
		if (bad[i].why && !strstr(cause, bad[i].why))
			fail_msg("case %zu: '%s', expected '%s'", i, cause, bad[i].why);
		free(cause);
		assert_false(note.bad_block);
		assert_null(note.refs);
		assert_empty(b);
		assert_int_equal(kvpool_n_free(f->e2.pool), NB);
		sess_drop(&f->e2.t, b);
		struct session h;
		memset(&h, 0, sizeof(h));
		strcpy(h.id, "v3");
		h.uid = V3_UID;
		assert_int_equal(store_load_history(path, &h, &cause), -EBADMSG);
		free(cause);
		uint64_t *refs = (uint64_t *)1;
		int nr = -1;
		assert_int_equal(store_read_refs(path, V3_UID, "v3", &refs, &nr, &cause), -EBADMSG);
		assert_null(refs);
		assert_int_equal(nr, 0);
		free(cause);
		assert_int_equal(events(in), 0);
	}
	close(in);
	free(m);
	free(orig);
	free(bdir);
	free(path);
}

/* store_read_refs: a version 3 file's names, without its block files; none
 * for a version 2 file; another owner's file refused. */
static void test_v3_read_refs(void **state)
{
	struct fx *f = *state;
	struct chain c;
	struct session *a = make_v3(&f->e, "v3", 75, 75, 0, 4, &c);
	must_save_v3(f->dir, f->e.pool, a, &c, 4);
	char *path = store_path(f->dir, V3_UID, "v3");
	for (int i = 0; i < 4; i++) {
		char *bp = block_path(f->dir, V3_UID, c.names[i]);
		assert_int_equal(unlink(bp), 0);
		free(bp);
	}
	uint64_t *refs;
	int n;
	char *cause = NULL;
	assert_int_equal(store_read_refs(path, V3_UID, "v3", &refs, &n, &cause), 0);
	assert_null(cause);
	assert_int_equal(n, 4);
	assert_memory_equal(refs, c.names, 4 * sizeof(uint64_t));
	free(refs);
	assert_int_equal(store_read_refs(path, V3_UID + 1, "v3", &refs, &n, &cause), -EINVAL);
	assert_null(refs);
	free(cause);
	assert_int_equal(store_read_refs(f->path, 0, "work", &refs, &n, &cause), 0);  /* v2 */
	assert_null(refs);
	assert_int_equal(n, 0);
	free(path);
}

/*
 * blk_collect with the references of the state files in the folder (as the
 * residency counts them at start): the block files of a session whose
 * state file is gone and the temporary files go; the referenced ones stay
 * (their sizes counted), as do names that are not block files' (a
 * set-aside file, upper-case hex, a folder that cannot be removed is
 * reported). Two sessions beginning alike share their block files.
 */
static void test_v3_collect(void **state)
{
	struct fx *f = *state;
	struct chain c, c2, c3;
	struct session *a = make_v3(&f->e, "a", 75, 75, 0, 4, &c);
	must_save_v3(f->dir, f->e.pool, a, &c, 4);
	struct session *b = make_v3(&f->e, "b", 41, 32, 0, 2, &c2);   /* a's first two */
	assert_memory_equal(c2.names, c.names, 2 * sizeof(uint64_t));
	must_save_v3(f->dir, f->e.pool, b, &c2, 0);
	struct session *g = make_session(&f->e, V3_UID + 1, "gone", 75, 75, 0);
	c3.seed = sess_chain_seed(&f->e.t, g);
	c3.n = 2;
	for (int i = 0; i < 2; i++)
		c3.names[i] = sess_block_name(&f->e.t, g, i);
	must_save_v3(f->dir, f->e.pool, g, &c3, 2);
	assert_int_equal(store_remove(f->dir, V3_UID + 1, "gone"), 0);

	char *bdir = path_join(f->dir, BLK_DIR), name[64];
	struct { const char *name; int dir, stays; } extra[] = {
		{ ".tmp-1000-0000000000000001.kvb.77.0", 0, 0 },
		{ "README", 0, 1 },
		{ NULL, 0, 1 },                            /* a's block 0, set aside */
		{ "1000-00000000000000AB.kvb", 0, 1 },     /* not one spelling of ours */
		{ "1001-00000000000000ff.kvb", 1, 1 },     /* a folder */
	};
	char aside[80];
	blk_file_name(name, sizeof(name), V3_UID, c.names[0]);
	snprintf(aside, sizeof(aside), "%s.corrupt", name);
	extra[2].name = aside;
	for (size_t i = 0; i < sizeof(extra) / sizeof(extra[0]); i++) {
		char *p = path_join(bdir, extra[i].name);
		if (extra[i].dir)
			assert_int_equal(mkdir(p, 0700), 0);
		else
			write_file(p, "x", 1);
		free(p);
	}
	assert_int_equal(dir_count(bdir), 4 + 2 + 5);

	/* the references, from the state files */
	struct blk_refs m = { 0 };
	struct store_entry *ents;
	int ne = store_list(f->dir, &ents, NULL, NULL);
	assert_int_equal(ne, 2);
	for (int i = 0; i < ne; i++) {
		uint64_t *refs;
		int nr;
		char *cause = NULL;
		assert_int_equal(store_read_refs(ents[i].path, ents[i].uid, ents[i].id, &refs, &nr,
						 &cause), 0);
		assert_int_equal(nr, (int)ents[i].n_refs);
		for (int k = 0; k < nr; k++)
			assert_int_equal(blk_refs_inc(&m, (uint32_t)ents[i].uid, refs[k]), 0);
		free(refs);
	}
	store_entries_free(ents, ne);
	assert_int_equal(m.n, 4);
	assert_int_equal(blk_refs_get(&m, V3_UID, c.names[0])->count, 2);

	struct reports r = { 0 };
	assert_int_equal(blk_collect(f->dir, &m, on_report, &r), 3);
	assert_int_equal(r.n, 4);
	assert_non_null(strstr(reason_of(&r, extra[0].name), "interrupted write"));
	for (int i = 0; i < 2; i++) {
		blk_file_name(name, sizeof(name), V3_UID + 1, c3.names[i]);
		assert_non_null(strstr(reason_of(&r, name), "no saved session refers to it"));
		char *p = path_join(bdir, name);
		assert_int_equal(access(p, F_OK), -1);
		free(p);
	}
	assert_non_null(strstr(reason_of(&r, extra[4].name), "cannot remove"));
	for (size_t i = 0; i < sizeof(extra) / sizeof(extra[0]); i++) {
		char *p = path_join(bdir, extra[i].name);
		assert_int_equal(access(p, F_OK) == 0, extra[i].stays);
		free(p);
	}
	uint64_t size = BF_HEADER_BYTES + 4 * BS + kt_kv_block_bytes(&f->e.pool->kv);
	for (int i = 0; i < 4; i++) {
		char *p = block_path(f->dir, V3_UID, c.names[i]);
		assert_int_equal(access(p, F_OK), 0);
		free(p);
		assert_true(blk_refs_get(&m, V3_UID, c.names[i])->bytes == size);
	}
	assert_true(m.bytes == 4 * size);
	assert_int_equal(dir_count(bdir), 4 + 4);

	r.n = 0;   /* again: nothing more to remove; the folder still said */
	assert_int_equal(blk_collect(f->dir, &m, on_report, &r), 0);
	assert_int_equal(r.n, 1);
	char *p = path_join(bdir, extra[4].name);
	assert_int_equal(rmdir(p), 0);
	free(p);
	/* dropping the last reference of a name forgets its entry */
	assert_int_equal(blk_refs_dec(&m, V3_UID, c.names[0]), 1);
	assert_int_equal(blk_refs_dec(&m, V3_UID, c.names[0]), 0);
	assert_null(blk_refs_get(&m, V3_UID, c.names[0]));
	assert_true(m.bytes == 3 * size);
	assert_int_equal(blk_refs_dec(&m, V3_UID, c.names[0]), -ENOENT);
	blk_refs_free(&m);

	char *empty = tmpdir_new();   /* no blocks folder */
	assert_int_equal(blk_collect(empty, &m, NULL, NULL), -ENOENT);
	tmpdir_free(empty);
	free(bdir);
}

/* Nothing a failed shared save wrote stays: no block file it added, no
 * temporary file; the block files that were there before, and the old
 * state file, do. */
static void assert_failed_save(const char *dir, const struct chain *c, int n_before,
			       int old_state)
{
	char *bdir = path_join(dir, BLK_DIR);
	assert_int_equal(count_prefix(bdir, ".tmp-"), 0);
	assert_int_equal(count_prefix(dir, ".tmp-"), 0);
	assert_int_equal(dir_count(bdir), n_before);
	for (int i = 0; i < c->n; i++) {
		char *p = block_path(dir, V3_UID, c->names[i]);
		assert_int_equal(access(p, F_OK) == 0, i < n_before);
		free(p);
	}
	char *path = store_path(dir, V3_UID, "v3");
	if (old_state) {  /* the old file, whole */
		uint64_t *refs;
		int nr;
		char *cause = NULL;
		assert_int_equal(store_read_refs(path, V3_UID, "v3", &refs, &nr, &cause), 0);
		assert_int_equal(nr, n_before);
		free(refs);
		struct env e;
		env_init(&e, NB, BS, NL, KVD);
		struct store_note note;
		struct session *s = load_ex(&e.t, path, "v3", &note, 0);
		assert_false(note.bad_block);
		assert_int_equal(s->n_cached, 75);
		free(note.refs);
		env_done(&e);
	} else {
		assert_int_equal(access(path, F_OK), -1);
	}
	free(path);
	free(bdir);
}

/* A read-only blocks folder (only stops non-root): the first block file
 * cannot be made. */
static void test_v3_save_readonly_blocks(void **state)
{
	struct fx *f = *state;
	if (geteuid() == 0) {
		print_message("root: a read-only folder does not stop it; case skipped\n");
		skip();
	}
	struct chain c;
	struct session *a = make_v3(&f->e, "v3", 75, 75, 0, 4, &c);
	char *bdir = path_join(f->dir, BLK_DIR);
	assert_int_equal(mkdir(bdir, 0500), 0);
	char *cause;
	int written;
	assert_int_equal(save_v3(f->dir, f->e.pool, a, &c, &written, &cause), -EACCES);
	assert_non_null(cause);
	free(cause);
	assert_int_equal(written, 0);
	assert_failed_save(f->dir, &c, 0, 0);
	assert_int_equal(chmod(bdir, 0700), 0);
	free(bdir);
}

/* On a 64 KiB tmpfs (root with mount rights, else skipped): a save of
 * blocks 0-3 over one that kept blocks 0 and 1, with one page free (block
 * 2's file fits, block 3's does not), then with three pages free and a
 * state file too big (both block files fit): each -ENOSPC, leaving what
 * was there before. */
static void test_v3_save_enospc(void **state)
{
	struct fx *f = *state;
	if (geteuid() != 0 || mount("tmpfs", f->dir, "tmpfs", 0, "size=64k,mode=0700") != 0) {
		print_message("tmpfs mount not possible (%s): ENOSPC case skipped\n",
			      geteuid() ? "not root" : strerror(errno));
		skip();
	}
	f->mounted = 1;
	struct chain c;
	struct session *a = make_v3(&f->e, "v3", 75, 75, 0, 4, &c);
	c.n = 2;
	must_save_v3(f->dir, f->e.pool, a, &c, 2);
	c.n = 4;
	char *filler = path_join(f->dir, "filler");
	int fd = open(filler, O_WRONLY | O_CREAT, 0600);
	assert_true(fd >= 0);
	char chunk[4096] = { 0 };
	while (write(fd, chunk, sizeof(chunk)) > 0)
		;
	struct stat st;
	assert_int_equal(fstat(fd, &st), 0);
	assert_int_equal(ftruncate(fd, st.st_size - 4096), 0);   /* one page */
	char *cause;
	int written;
	assert_int_equal(save_v3(f->dir, f->e.pool, a, &c, &written, &cause), -ENOSPC);
	assert_non_null(strstr(cause, strerror(ENOSPC)));
	free(cause);
	assert_int_equal(written, 1);   /* block 2 was written, and removed */
	assert_failed_save(f->dir, &c, 2, 1);

	assert_int_equal(ftruncate(fd, st.st_size - 4 * 4096), 0);   /* three pages */
	close(fd);
	struct chain cb;
	sess_set_sharing(&f->e2.t, 1, V3_BASE);
	struct session *big = make_v3(&f->e2, "v3", 75, 75, 100000, 4, &cb);
	assert_memory_equal(cb.names, c.names, sizeof(c.names[0]) * 4);
	assert_int_equal(save_v3(f->dir, f->e2.pool, big, &cb, &written, &cause), -ENOSPC);
	free(cause);
	assert_int_equal(written, 2);
	assert_failed_save(f->dir, &c, 2, 1);
	free(filler);
	assert_int_equal(umount(f->dir), 0);
	f->mounted = 0;
}

/* The state folder read-only but its blocks folder not (a tmpfs on each,
 * the first remounted read-only; root with mount rights, else skipped):
 * the block files are written, the state file's temporary cannot be
 * made. -EROFS, and none of the block files the save wrote stays. */
static void test_v3_save_readonly_state_dir(void **state)
{
	struct fx *f = *state;
	if (geteuid() != 0 || mount("tmpfs", f->dir, "tmpfs", 0, "size=1m,mode=0700") != 0) {
		print_message("tmpfs mount not possible (%s): case skipped\n",
			      geteuid() ? "not root" : strerror(errno));
		skip();
	}
	f->mounted = 1;
	char *bdir = path_join(f->dir, BLK_DIR);
	assert_int_equal(mkdir(bdir, 0700), 0);
	assert_int_equal(mount("tmpfs", bdir, "tmpfs", 0, "size=1m,mode=0700"), 0);
	assert_int_equal(mount("tmpfs", f->dir, "tmpfs", MS_REMOUNT | MS_RDONLY,
			       "size=1m,mode=0700"), 0);
	struct chain c;
	struct session *a = make_v3(&f->e, "v3", 75, 75, 0, 4, &c);
	char *cause;
	int written;
	assert_int_equal(save_v3(f->dir, f->e.pool, a, &c, &written, &cause), -EROFS);
	assert_non_null(cause);
	free(cause);
	assert_int_equal(written, 4);
	assert_failed_save(f->dir, &c, 0, 0);
	assert_int_equal(umount(bdir), 0);
	assert_int_equal(umount(f->dir), 0);
	f->mounted = 0;
	free(bdir);
}

/* A blocks folder that is a symbolic link (to where its maker would have
 * the daemon write) is not followed: the save fails saying so, and
 * nothing is written where it points; a blocks "folder" that is a file
 * likewise. */
static void test_v3_blocks_symlink(void **state)
{
	struct fx *f = *state;
	char *bdir = path_join(f->dir, BLK_DIR);
	char *elsewhere = tmpdir_new();
	assert_int_equal(symlink(elsewhere, bdir), 0);
	struct chain c;
	struct session *a = make_v3(&f->e, "v3", 75, 75, 0, 4, &c);
	char *cause = NULL;
	int written = -1;
	assert_int_equal(save_v3(f->dir, f->e.pool, a, &c, &written, &cause), -EIO);
	assert_non_null(cause);
	assert_non_null(strstr(cause, "symbolic link"));
	free(cause);
	assert_int_equal(written, 0);
	assert_int_equal(dir_count(elsewhere), 0);
	char *path = store_path(f->dir, V3_UID, "v3");
	assert_int_not_equal(access(path, F_OK), 0);
	free(path);
	/* a file in its place */
	assert_int_equal(unlink(bdir), 0);
	FILE *fp = fopen(bdir, "w");
	assert_non_null(fp);
	fclose(fp);
	cause = NULL;
	assert_int_equal(save_v3(f->dir, f->e.pool, a, &c, &written, &cause), -EIO);
	assert_non_null(cause);
	free(cause);
	unlink(bdir);
	rmdir(elsewhere);
	free(elsewhere);
	free(bdir);
}

/*
 * K/V element types: a version 3 file saved from an f32, f16 or q8_0 pool
 * has its block files in that type, and loads into a pool of any of the
 * three, shared blocks and inline one converted alike: each block holds
 * exactly what storing the file's rows in the pool's type gives.
 */
static void test_v3_kv_types(void **state)
{
	(void)state;
	static const enum kt_dtype types[] = { KT_F32, KT_F16, KT_Q8_0 };
	const int n_cached = 37, nb = 3;
	float k[KVD], v[KVD], k2[KVD], v2[KVD];
	for (size_t si = 0; si < 3; si++)
		for (size_t li = 0; li < 3; li++) {
			char *dir = tmpdir_new();
			struct env a, b;
			a.pool = kvpool_new_typed(NULL, types[si], KVD, NB, BS, NL, KVD);
			b.pool = kvpool_new_typed(NULL, types[li], KVD, NB, BS, NL, KVD);
			assert_non_null(a.pool);
			assert_non_null(b.pool);
			memset(a.pool->kv.base, 0, kt_kv_block_bytes(&a.pool->kv) * NB);
			assert_int_equal(sess_table_init(&a.t, a.pool), 0);
			assert_int_equal(sess_table_init(&b.t, b.pool), 0);
			struct chain c;
			struct session *s = make_v3(&a, "typed", 40, 0, 0, 2, &c);
			assert_int_equal(kvseq_prepare(a.pool, &s->kv, n_cached, 0), 0);
			s->n_cached = n_cached;
			for (int p = 0; p < n_cached; p++)
				for (int l = 0; l < NL; l++) {
					for (int ch = 0; ch < KVD; ch++) {
						k[ch] = (float)((p * 31 + l * 7 + ch * 13) % 97) / 9.0f - 5;
						v[ch] = (float)((p * 17 + l * 5 + ch * 11) % 89) / 7.0f - 6;
					}
					kt_kv_put(&a.pool->kv, s->kv.blocks[p / BS], l, p % BS, k, v);
				}
			must_save_v3(dir, a.pool, s, &c, 2);
			size_t bb = kt_kv_block_bytes(&a.pool->kv), len;
			char *path = store_path(dir, V3_UID, "typed");
			unsigned char *img = read_file(path, &len);
			assert_int_equal(sf_kv_bytes(img), bb);        /* store_file.h's sizes */
			assert_int_equal(sf_block_bytes(img), bb);
			free(img);
			for (int i = 0; i < 2; i++) {
				char *bp = block_path(dir, V3_UID, c.names[i]);
				img = read_file(bp, &len);
				assert_int_equal(len, BF_HEADER_BYTES + 4 * BS + bb);
				assert_int_equal(sf_get(img + BF_KV_DTYPE, 4),
						 types[si] | (types[si] == KT_Q8_0 ? 8 << 8 : 0));
				free(img);
				free(bp);
			}

			struct store_note note;
			struct session *t = load_ex(&b.t, path, "typed", &note, 0);
			assert_false(note.bad_block);
			assert_int_equal(t->n_cached, n_cached);
			struct kt_kv ref = b.pool->kv;
			ref.n_blocks = 1;
			ref.base = calloc(1, kt_kv_block_bytes(&ref));
			assert_non_null(ref.base);
			for (int i = 0; i < nb; i++) {
				for (int l = 0; l < NL; l++)
					for (int r = 0; r < BS; r++) {
						kt_kv_get_k(&a.pool->kv, s->kv.blocks[i], l, r, k2);
						kt_kv_get_v(&a.pool->kv, s->kv.blocks[i], l, r, v2);
						kt_kv_put(&ref, 0, l, r, k2, v2);
					}
				assert_memory_equal(ref.base, kt_kv_block(&b.pool->kv, t->kv.blocks[i]),
						    kt_kv_block_bytes(&ref));
			}
			free(ref.base);
			free(note.refs);
			free(path);
			env_done(&a);
			env_done(&b);
			tmpdir_free(dir);
		}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_round_trip_empty),
		cmocka_unit_test(test_round_trip_partial_cache),
		cmocka_unit_test(test_round_trip_long_texts),
		cmocka_unit_test(test_round_trip_big_blocks),
		cmocka_unit_test_setup_teardown(test_mode_and_replace, setup_env, teardown),
		cmocka_unit_test(test_store_path),
		cmocka_unit_test_setup_teardown(test_remove, setup_std, teardown),
		cmocka_unit_test_setup_teardown(test_list, setup_env, teardown),
		cmocka_unit_test_setup_teardown(test_list_bad_headers, setup_std, teardown),
		cmocka_unit_test_setup_teardown(test_corrupt_body, setup_std, teardown),
		cmocka_unit_test_setup_teardown(test_corrupt_header, setup_std, teardown),
		cmocka_unit_test_setup_teardown(test_history_only, setup_std, teardown),
		cmocka_unit_test_setup_teardown(test_version1_file, setup_std, teardown),
		cmocka_unit_test_setup_teardown(test_forged_body, setup_std, teardown),
		cmocka_unit_test_setup_teardown(test_truncated, setup_std, teardown),
		cmocka_unit_test_setup_teardown(test_version_and_magic, setup_std, teardown),
		cmocka_unit_test_setup_teardown(test_foreign_model, setup_std, teardown),
		cmocka_unit_test_setup_teardown(test_kv_shape_mismatch, setup_std, teardown),
		cmocka_unit_test(test_kv_types),
		cmocka_unit_test_setup_teardown(test_owner_mismatch, setup_std, teardown),
		cmocka_unit_test_setup_teardown(test_pool_full, setup_std, teardown),
		cmocka_unit_test_setup_teardown(test_save_errors, setup_env, teardown),
		cmocka_unit_test_setup_teardown(test_save_enospc, setup_env, teardown),
		cmocka_unit_test_setup_teardown(test_garbage, setup_std, teardown),
		cmocka_unit_test_setup_teardown(test_v3_round_trip, setup_env, teardown),
		cmocka_unit_test_setup_teardown(test_v3_old_versions, setup_std, teardown),
		cmocka_unit_test_setup_teardown(test_v3_no_refs, setup_std, teardown),
		cmocka_unit_test_setup_teardown(test_v3_bad_block_files, setup_env, teardown),
		cmocka_unit_test_setup_teardown(test_v3_corrupt_refs, setup_env, teardown),
		cmocka_unit_test_setup_teardown(test_v3_read_refs, setup_std, teardown),
		cmocka_unit_test_setup_teardown(test_v3_collect, setup_env, teardown),
		cmocka_unit_test_setup_teardown(test_v3_save_readonly_blocks, setup_env, teardown),
		cmocka_unit_test_setup_teardown(test_v3_save_enospc, setup_env, teardown),
		cmocka_unit_test_setup_teardown(test_v3_save_readonly_state_dir, setup_env, teardown),
		cmocka_unit_test_setup_teardown(test_v3_blocks_symlink, setup_env, teardown),
		cmocka_unit_test(test_v3_kv_types),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

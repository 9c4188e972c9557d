/*
 * tests/unit/test_residency.c — session/residency.c: where a session's K/V
 * lives (pool, host memory, disk), eviction order, the host-memory
 * accounting, saving, restoring, and kvpool's kvseq_to_host/from_host.
 *
 * Every session's blocks are filled with bytes derived from its id and
 * position, so a session that comes back from host memory or disk must
 * carry exactly its own K/V.
 */
#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "session/residency.h"
#include "session/store.h"

#define BS 16      /* positions per block */
#define NL 2       /* layers */
#define KVD 8      /* kv_dim */
#define FP 0x1234abcdull

struct fx {
	struct kvpool *pool;
	struct sess_table st;
	struct residency r;
	char dir[64];
	int reports[4];          /* by level */
	char last[512];
	char last_at[4][512];    /* the last of each level */
};

static void on_report(void *ctx, int level, const char *msg)
{
	struct fx *f = ctx;
	f->reports[level]++;
	snprintf(f->last, sizeof(f->last), "%s", msg);
	snprintf(f->last_at[level], sizeof(f->last_at[level]), "%s", msg);
}

/* A fixture: a pool of n_blocks, ram_cache bytes of host memory, and a
 * state directory when with_dir. */
static struct fx *fx_new(int n_blocks, size_t ram_cache, int with_dir)
{
	struct fx *f = calloc(1, sizeof(*f));
	assert_non_null(f);
	f->pool = kvpool_new(n_blocks, BS, NL, KVD);
	assert_non_null(f->pool);
	assert_int_equal(sess_table_init(&f->st, f->pool), 0);
	res_init(&f->r, &f->st, FP, 4096, 512, ram_cache, on_report, f);
	if (with_dir) {
		snprintf(f->dir, sizeof(f->dir), "/tmp/llamad-res-XXXXXX");
		assert_non_null(mkdtemp(f->dir));
		assert_int_equal(res_set_dir(&f->r, f->dir), 0);
		assert_string_equal(f->r.dir, f->dir);
	} else {
		assert_int_equal(res_set_dir(&f->r, "none"), 0);
		assert_null(f->r.dir);
	}
	return f;
}

static void fx_free(struct fx *f)
{
	if (f->dir[0]) {
		DIR *d = opendir(f->dir);   /* state files, files set aside, the lock */
		for (struct dirent *de; d && (de = readdir(d));) {
			char p[400];
			snprintf(p, sizeof(p), "%s/%s", f->dir, de->d_name);
			if (de->d_name[0] != '.')
				unlink(p);
		}
		if (d)
			closedir(d);
		rmdir(f->dir);
	}
	res_done(&f->r);
	sess_table_done(&f->st);
	kvpool_free(f->pool);
	free(f);
}

static uint8_t pattern(const char *id, int block, size_t i)
{
	return (uint8_t)(id[0] * 31 + block * 7 + (int)i * 3 + 1);
}

/* Session id with n_tok tokens, all cached, its blocks filled with its
 * pattern, last used at t (ms). */
static struct session *make(struct fx *f, const char *id, int n_tok, int64_t t)
{
	struct session *s = sess_create(&f->st, 1000, id);
	assert_non_null(s);
	int32_t *ids = malloc((size_t)n_tok * sizeof(int32_t));
	for (int i = 0; i < n_tok; i++)
		ids[i] = (i * 13 + id[0]) % 512;
	assert_int_equal(sess_append(s, ids, n_tok, CHAT_USER, "text", 1), 0);
	free(ids);
	assert_int_equal(kvseq_prepare(f->pool, &s->kv, n_tok, 0), 0);
	size_t bb = kt_kv_block_bytes(&f->pool->kv);
	for (int b = 0; b < s->kv.n_blocks; b++) {
		uint8_t *p = kvpool_host_block(f->pool, s->kv.blocks[b]);
		for (size_t i = 0; i < bb; i++)
			p[i] = pattern(id, b, i);
	}
	s->n_cached = n_tok;
	s->tmpl = CHAT_TEMPLATE_LLAMA2;
	s->policy = SESS_CTX_ERROR;
	s->dirty = 1;
	s->last_use_ms = t;
	return s;
}

/* s is in the pool with its own K/V and n_tok tokens. */
static void assert_own_kv(struct fx *f, struct session *s, int n_tok)
{
	assert_int_equal(s->loc, SESS_POOL);
	assert_int_equal(s->n_tokens, n_tok);
	assert_int_equal(s->n_cached, n_tok);
	assert_int_equal(s->kv.n_blocks, (n_tok + BS - 1) / BS);
	size_t bb = kt_kv_block_bytes(&f->pool->kv);
	for (int b = 0; b < s->kv.n_blocks; b++) {
		const uint8_t *p = kvpool_host_block(f->pool, s->kv.blocks[b]);
		for (size_t i = 0; i < bb; i++)
			if (p[i] != pattern(s->id, b, i))
				fail_msg("session %s block %d byte %zu", s->id, b, i);
	}
	for (int i = 0; i < n_tok; i++)
		assert_int_equal(s->tokens[i], (i * 13 + s->id[0]) % 512);
}

static void test_kvseq_host_round_trip(void **state)
{
	(void)state;
	struct fx *f = fx_new(8, 0, 0);
	struct session *s = make(f, "a", 40, 1);  /* 3 blocks */
	size_t bb = kt_kv_block_bytes(&f->pool->kv);
	uint8_t *buf = malloc(3 * bb);
	assert_int_equal(kvseq_to_host(f->pool, &s->kv, buf), 0);
	for (int b = 0; b < 3; b++)
		assert_int_equal(buf[(size_t)b * bb + 5], pattern("a", b, 5));
	struct kvseq k = { 0 };
	assert_int_equal(kvseq_from_host(f->pool, &k, buf, 6), -ENOSPC);  /* 5 free */
	assert_int_equal(k.n_blocks, 0);
	assert_int_equal(kvpool_n_free(f->pool), 5);
	assert_int_equal(kvseq_from_host(f->pool, &k, buf, 3), 0);
	assert_int_equal(k.n_blocks, 3);
	assert_int_equal(kvpool_n_free(f->pool), 2);
	for (int b = 0; b < 3; b++)
		assert_memory_equal(kvpool_host_block(f->pool, k.blocks[b]), buf + (size_t)b * bb, bb);
	kvseq_release(f->pool, &k);
	assert_int_equal(kvpool_n_free(f->pool), 5);
	free(buf);
	fx_free(f);
}

/* The least recently used idle session goes to host memory first; busy
 * and ephemeral ones never move; it comes back with its own K/V. */
static void test_evict_to_ram_lru(void **state)
{
	(void)state;
	struct fx *f = fx_new(6, 1 << 20, 0);
	size_t bb = kt_kv_block_bytes(&f->pool->kv);
	struct session *old = make(f, "old", 32, 100);     /* 2 blocks, oldest */
	struct session *busy = make(f, "busy", 16, 50);    /* older still, but busy */
	struct session *eph = make(f, "eph", 16, 10);
	struct session *newer = make(f, "new", 16, 200);
	busy->busy = 1;
	eph->ephemeral = 1;
	assert_int_equal(kvpool_n_free(f->pool), 1);
	assert_int_equal(res_reserve(&f->r, 3, NULL), 0);
	assert_int_equal(old->loc, SESS_RAM);
	assert_int_equal(newer->loc, SESS_POOL);
	assert_int_equal(busy->loc, SESS_POOL);
	assert_int_equal(eph->loc, SESS_POOL);
	assert_int_equal(f->r.ram_used, 2 * bb);
	assert_int_equal(old->ram_blocks, 2);
	assert_int_equal(f->r.n.evict_ram, 1);
	/* next: "new", and then nothing is left to move */
	assert_int_equal(res_reserve(&f->r, 4, NULL), 0);
	assert_int_equal(newer->loc, SESS_RAM);
	assert_int_equal(res_reserve(&f->r, 5, NULL), -ENOBUFS);
	/* keep: never the session being made room for */
	char *cause = NULL;
	assert_int_equal(res_ensure(&f->r, old, &cause), 0);
	assert_null(cause);
	assert_own_kv(f, old, 32);
	assert_int_equal(f->r.ram_used, bb);
	assert_int_equal(f->r.n.restores, 1);
	assert_int_equal(res_ensure(&f->r, newer, &cause), 0);
	assert_own_kv(f, newer, 16);
	assert_int_equal(f->r.ram_used, 0);
	fx_free(f);
}

/* Restoring needs room: with nothing to evict it fails and says so. */
static void test_restore_without_room(void **state)
{
	(void)state;
	struct fx *f = fx_new(3, 1 << 20, 0);
	struct session *a = make(f, "a", 32, 1);
	assert_int_equal(res_reserve(&f->r, 3, NULL), 0);
	assert_int_equal(a->loc, SESS_RAM);
	struct session *b = make(f, "b", 48, 2);  /* takes the whole pool */
	b->busy = 1;
	char *cause = NULL;
	assert_int_equal(res_ensure(&f->r, a, &cause), -ENOBUFS);
	assert_non_null(cause);
	assert_non_null(strstr(cause, "KV cache is full"));
	free(cause);
	assert_int_equal(a->loc, SESS_RAM);  /* nothing lost */
	b->busy = 0;
	assert_int_equal(res_ensure(&f->r, a, &cause), 0);
	assert_own_kv(f, a, 32);
	assert_int_equal(b->loc, SESS_RAM);
	fx_free(f);
}

/* Host memory full: saved sessions there move on to disk; a session that
 * cannot fit in host memory goes straight to disk; both come back whole. */
static void test_ram_full_to_disk(void **state)
{
	(void)state;
	struct fx *f = fx_new(8, 0, 1);
	size_t bb = kt_kv_block_bytes(&f->pool->kv);
	f->r.ram_cache = 2 * bb;
	struct session *a = make(f, "a", 32, 1);   /* 2 blocks */
	struct session *b = make(f, "b", 32, 2);
	struct session *c = make(f, "c", 48, 3);   /* 3 blocks: never fits in RAM */
	(void)c;
	assert_int_equal(res_reserve(&f->r, 3, NULL), 0);  /* 1 free: a leaves */
	assert_int_equal(a->loc, SESS_RAM);
	assert_false(a->dirty);             /* saved before it left */
	assert_true(a->file_bytes > 0);
	assert_int_equal(res_reserve(&f->r, 5, NULL), 0);  /* b to RAM, a to disk */
	assert_int_equal(b->loc, SESS_RAM);
	assert_int_equal(a->loc, SESS_DISK);
	assert_int_equal(a->disk_tokens, 32);
	assert_null(a->tokens);
	assert_int_equal(f->r.ram_used, 2 * bb);
	assert_int_equal(f->r.n.evict_disk, 1);
	assert_int_equal(res_reserve(&f->r, 8, NULL), 0);  /* c straight to disk */
	assert_int_equal(c->loc, SESS_DISK);
	char *cause = NULL;
	assert_int_equal(res_ensure(&f->r, a, &cause), 0);
	assert_own_kv(f, a, 32);
	assert_int_equal(res_ensure(&f->r, c, &cause), 0);
	assert_own_kv(f, c, 48);
	assert_int_equal(res_ensure(&f->r, b, &cause), 0);
	assert_own_kv(f, b, 32);
	assert_int_equal(f->r.ram_used, 0);
	assert_int_equal(f->r.n.restores, 3);
	fx_free(f);
}

/* Only saved sessions leave host memory for disk; a drop from there gives
 * its bytes back. */
static void test_dirty_ram_stays(void **state)
{
	(void)state;
	struct fx *f = fx_new(6, 0, 1);
	f->r.ram_cache = 2 * kt_kv_block_bytes(&f->pool->kv);
	struct session *a = make(f, "a", 32, 1);
	struct session *b = make(f, "b", 32, 2);
	assert_int_equal(res_reserve(&f->r, 4, NULL), 0);
	assert_int_equal(a->loc, SESS_RAM);
	a->dirty = 1;  /* as if changed since saved */
	assert_int_equal(res_reserve(&f->r, 6, NULL), 0);
	assert_int_equal(a->loc, SESS_RAM);
	assert_int_equal(b->loc, SESS_DISK);
	/* dropped from host memory: its bytes and its file go */
	char *path = store_path(f->dir, 1000, "a");
	assert_int_equal(access(path, F_OK), 0);
	res_drop(&f->r, a, 1);
	assert_int_equal(f->r.ram_used, 0);
	assert_int_equal(access(path, F_OK), -1);
	assert_null(sess_get(&f->st, 1000, "a"));
	assert_int_equal(f->st.count, 1);
	free(path);
	fx_free(f);  /* ASan: nothing leaked, nothing freed twice */
}

/* With a state directory, a session whose save fails stays in the pool. */
static void test_unsaved_never_leaves(void **state)
{
	(void)state;
	struct fx *f = fx_new(4, 1 << 20, 1);
	struct session *a = make(f, "a", 32, 1);
	make(f, "b", 32, 2);
	char *dir = f->r.dir;
	f->r.dir = strdup("/proc/llamad-no-such-dir");  /* every save fails */
	assert_int_equal(res_reserve(&f->r, 1, NULL), -ENOBUFS);
	assert_int_equal(a->loc, SESS_POOL);
	assert_true(a->dirty);
	assert_int_equal(a->save_fails, 1);
	assert_int_equal(f->r.n.save_errors, 2);
	assert_true(f->reports[RES_ERROR] >= 2);
	assert_non_null(strstr(f->last, "to evict it"));
	assert_non_null(strstr(f->last, "state file /proc/llamad-no-such-dir/"));
	assert_non_null(strstr(f->last, "automatic saves wait 0.1 s"));
	free(f->r.dir);
	f->r.dir = dir;
	/* at once again: both still wait, nothing is written */
	assert_int_equal(res_reserve(&f->r, 1, NULL), -ENOBUFS);
	assert_int_equal(f->r.n.save_errors, 2);
	assert_int_equal(f->r.n.saves, 0);
	usleep(150 * 1000);   /* the first wait is 0.1 s */
	assert_int_equal(res_reserve(&f->r, 1, NULL), 0);
	assert_int_equal(a->loc, SESS_RAM);
	assert_int_equal(a->save_fails, 0);
	assert_non_null(strstr(f->last_at[RES_INFO], "session a saved, after 1 failed attempt"));
	fx_free(f);
}

/* The wait after failed saves: 0.1 s doubling to 30 s, per session, one
 * report per failure; nothing is tried while it runs; a save that works
 * ends it. */
static void test_save_backoff(void **state)
{
	(void)state;
	struct fx *f = fx_new(4, 0, 1);
	struct session *a = make(f, "a", 32, 1);
	struct session *b = make(f, "b", 32, 2);
	char *dir = f->r.dir;
	f->r.dir = strdup("/proc/llamad-no-such-dir");
	double want = 0.1;
	for (int i = 0; i < 12; i++) {
		a->save_retry_s = b->save_retry_s = 0;   /* their waits are over */
		int errors = f->reports[RES_ERROR];
		assert_int_equal(res_reserve(&f->r, 1, NULL), -ENOBUFS);
		assert_int_equal(f->r.n.save_errors, 2 * (uint64_t)(i + 1));
		assert_int_equal(f->reports[RES_ERROR], errors + 2);   /* one line each */
		assert_int_equal(a->save_fails, i + 1);
		assert_true(a->save_wait_s > want * 0.999 && a->save_wait_s < want * 1.001);
		want = want * 2 < 30 ? want * 2 : 30;
	}
	assert_true(a->save_wait_s == 30);
	assert_true(b->save_wait_s == 30);
	/* while they wait, evictions and idle saves write nothing, say nothing */
	int errors = f->reports[RES_ERROR];
	for (int i = 0; i < 1000; i++) {
		assert_int_equal(res_reserve(&f->r, 1, NULL), -ENOBUFS);
		res_save_idle(&f->r, INT64_MAX);
	}
	assert_int_equal(f->r.n.save_errors, 24);
	assert_int_equal(f->reports[RES_ERROR], errors);
	/* a Save request tries all the same, and its failure lengthens nothing
	 * past the bound */
	struct res_saved sv = { 0 };
	res_save_all(&f->r, 0, 1, &sv);
	assert_int_equal(sv.errors, 2);
	free(sv.first_error);
	assert_int_equal(f->r.n.save_errors, 26);
	assert_true(a->save_wait_s == 30);
	/* the disk is back: a Save works and ends the waits */
	free(f->r.dir);
	f->r.dir = dir;
	memset(&sv, 0, sizeof(sv));
	res_save_all(&f->r, 0, 1, &sv);
	assert_int_equal(sv.n, 2);
	assert_int_equal(a->save_fails, 0);
	assert_true(a->save_wait_s == 0 && a->save_retry_s == 0);
	assert_false(b->dirty);
	assert_non_null(strstr(f->last_at[RES_INFO], "saved, after 13 failed attempts"));
	fx_free(f);
}

/* A state file that changed under the daemon: -EIO, a cause without the
 * path; saved under another model with refuse_foreign: -ESTALE. */
static void test_restore_errors(void **state)
{
	(void)state;
	struct fx *f = fx_new(4, 0, 1);
	struct session *a = make(f, "a", 32, 1);
	struct session *b = make(f, "b", 16, 2);
	assert_int_equal(res_reserve(&f->r, 4, NULL), 0);
	assert_int_equal(a->loc, SESS_DISK);
	assert_int_equal(b->loc, SESS_DISK);
	char *path = store_path(f->dir, 1000, "a");
	FILE *fp = fopen(path, "r+b");
	assert_non_null(fp);
	fseek(fp, 300, SEEK_SET);
	fputc(0x5a ^ fgetc(fp), fp);  /* one byte of the body */
	fclose(fp);
	char *cause = NULL;
	assert_int_equal(res_ensure(&f->r, a, &cause), -EIO);
	assert_non_null(cause);
	assert_non_null(strstr(cause, "cannot restore session 'a'"));
	assert_null(strstr(cause, f->dir));
	free(cause);
	assert_int_equal(a->loc, SESS_DISK);
	assert_non_null(strstr(f->last, path));  /* the log names the file */
	free(path);
	f->r.fingerprint = FP + 1;
	f->r.refuse_foreign = 1;
	assert_int_equal(res_ensure(&f->r, b, &cause), -ESTALE);
	assert_non_null(strstr(cause, "different model"));
	free(cause);
	f->r.refuse_foreign = 0;  /* recompute: the history only */
	assert_int_equal(res_ensure(&f->r, b, &cause), 0);
	assert_int_equal(b->loc, SESS_POOL);
	assert_int_equal(b->n_tokens, 16);
	assert_int_equal(b->n_cached, 0);
	assert_true(b->dirty);
	fx_free(f);
}

/* A restart: res_list makes disk stubs of the saved sessions. */
static void test_list_and_save_all(void **state)
{
	(void)state;
	struct fx *f = fx_new(8, 0, 1);
	make(f, "a", 32, 1);
	struct session *e = make(f, "e", 16, 2);
	e->ephemeral = 1;
	struct res_saved sv = { 0 };
	res_save_all(&f->r, 0, 1, &sv);
	assert_int_equal(sv.n, 1);  /* ephemeral: never saved */
	assert_int_equal(sv.errors, 0);
	assert_true(sv.bytes > 0);
	struct fx *g = fx_new(8, 0, 0);
	/* while f holds the folder, no other residency takes it: its lock
	 * file names f's pid */
	assert_int_equal(res_set_dir(&g->r, f->dir), -EBUSY);
	assert_int_equal(g->r.lock_holder, (long)getpid());
	close(f->r.lock_fd);   /* f's daemon ends: the kernel drops the lock */
	f->r.has_lock = 0;
	assert_int_equal(res_set_dir(&g->r, f->dir), 0);
	assert_int_equal(res_list(&g->r, 100), 1);
	struct session *a = sess_get(&g->st, 1000, "a");
	assert_non_null(a);
	assert_int_equal(a->loc, SESS_DISK);
	assert_int_equal(a->disk_tokens, 32);
	char *cause = NULL;
	assert_int_equal(res_ensure(&g->r, a, &cause), 0);
	assert_own_kv(g, a, 32);
	assert_int_equal(res_list(&g->r, 100), 0);  /* listed already */
	res_drop(&g->r, a, 1);  /* and its file goes with it */
	struct store_entry *ents = NULL;
	assert_int_equal(store_list(f->dir, &ents, NULL, NULL), 0);
	store_entries_free(ents, 0);
	fx_free(g);
	fx_free(f);
}

/* Write n bytes of src's file (a session saved in f's folder) to dst. */
static void copy_file_part(const char *src, const char *dst, long n)
{
	FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
	assert_non_null(in);
	assert_non_null(out);
	for (int c; n-- > 0 && (c = fgetc(in)) != EOF;)
		fputc(c, out);
	fclose(in);
	fclose(out);
}

static long file_size(const char *path)
{
	FILE *fp = fopen(path, "rb");
	if (!fp)
		return -1;
	fseek(fp, 0, SEEK_END);
	long n = ftell(fp);
	fclose(fp);
	return n;
}

/* A restart over refused files: each is moved to NAME.corrupt (then
 * .corrupt.1, ...), reported and counted; temporary files are only
 * removed; files set aside are never listed again. */
static void test_list_sets_aside(void **state)
{
	(void)state;
	struct fx *f = fx_new(8, 0, 1);
	make(f, "a", 32, 1);
	struct res_saved sv = { 0 };
	res_save_all(&f->r, 0, 1, &sv);
	char *pa = store_path(f->dir, 1000, "a"), *pt = store_path(f->dir, 1000, "t");
	long size = file_size(pa);
	assert_true(size > 300);
	copy_file_part(pa, pt, size - 100);   /* "a"'s file, truncated, as "t" */
	char tmp[400], aside[400], aside1[400];
	snprintf(tmp, sizeof(tmp), "%s/.tmp-1000-a.session.1.0", f->dir);
	copy_file_part(pa, tmp, 10);
	close(f->r.lock_fd);   /* f's daemon ends */
	f->r.has_lock = 0;

	struct fx *g = fx_new(8, 0, 0);
	assert_int_equal(res_set_dir(&g->r, f->dir), 0);
	assert_int_equal(res_list(&g->r, 100), 1);   /* "a" */
	assert_null(sess_get(&g->st, 1000, "t"));
	assert_int_equal(g->r.n.set_aside, 1);
	snprintf(aside, sizeof(aside), "%s%s", pt, STORE_ASIDE_SUFFIX);
	assert_int_equal(file_size(aside), size - 100);   /* whole, as it was */
	assert_int_equal(file_size(pt), -1);
	assert_int_equal(file_size(tmp), -1);             /* removed, not kept */
	assert_int_equal(g->reports[RES_WARN], 2);
	assert_int_equal(g->reports[RES_ERROR], 0);
	/* the same name refused again: .corrupt.1, the first one untouched */
	copy_file_part(pa, pt, 10);
	close(g->r.lock_fd);
	g->r.has_lock = 0;
	struct fx *h = fx_new(8, 0, 0);
	assert_int_equal(res_set_dir(&h->r, f->dir), 0);
	assert_int_equal(res_list(&h->r, 100), 1);
	assert_int_equal(h->r.n.set_aside, 1);
	assert_non_null(strstr(h->last_at[RES_WARN], "truncated"));
	assert_non_null(strstr(h->last_at[RES_WARN], "moved to"));
	snprintf(aside1, sizeof(aside1), "%s%s.1", pt, STORE_ASIDE_SUFFIX);
	assert_non_null(strstr(h->last_at[RES_WARN], aside1));
	assert_int_equal(file_size(aside1), 10);
	assert_int_equal(file_size(aside), size - 100);
	/* a new session "t" saved: the files set aside stay as they are */
	struct session *t = make(h, "t", 16, 5);
	memset(&sv, 0, sizeof(sv));
	res_save_all(&h->r, 0, 1, &sv);
	assert_int_equal(sv.n, 1);
	assert_true(file_size(pt) > 0);
	assert_int_equal(file_size(aside), size - 100);
	assert_int_equal(file_size(aside1), 10);
	(void)t;
	/* and no later listing reads them */
	close(h->r.lock_fd);
	h->r.has_lock = 0;
	struct fx *k = fx_new(8, 0, 0);
	assert_int_equal(res_set_dir(&k->r, f->dir), 0);
	assert_int_equal(res_list(&k->r, 100), 2);
	assert_int_equal(k->r.n.set_aside, 0);
	assert_int_equal(k->reports[RES_WARN], 0);
	free(pa);
	free(pt);
	fx_free(k);
	fx_free(h);
	fx_free(g);
	fx_free(f);
}

/* A file refused at a restore (corrupt body) stays; dropping its session
 * moves it aside rather than deleting it. A sound file goes with its
 * session. */
static void test_drop_refused(void **state)
{
	(void)state;
	struct fx *f = fx_new(4, 0, 1);
	struct session *a = make(f, "a", 32, 1);
	struct session *b = make(f, "b", 16, 2);
	assert_int_equal(res_reserve(&f->r, 4, NULL), 0);
	assert_int_equal(a->loc, SESS_DISK);
	char *pa = store_path(f->dir, 1000, "a"), *pb = store_path(f->dir, 1000, "b");
	FILE *fp = fopen(pa, "r+b");
	assert_non_null(fp);
	fseek(fp, 300, SEEK_SET);
	fputc(0x5a ^ fgetc(fp), fp);
	fclose(fp);
	long size = file_size(pa);
	char *cause = NULL;
	assert_int_equal(res_ensure(&f->r, a, &cause), -EIO);
	free(cause);
	assert_true(a->file_refused);
	assert_int_equal(file_size(pa), size);   /* stays for inspection */
	res_drop(&f->r, a, 1);
	char aside[400];
	snprintf(aside, sizeof(aside), "%s%s", pa, STORE_ASIDE_SUFFIX);
	assert_int_equal(file_size(aside), size);
	assert_int_equal(file_size(pa), -1);
	assert_int_equal(f->r.n.set_aside, 1);
	assert_non_null(strstr(f->last_at[RES_WARN], "refused when read, moved to"));
	res_drop(&f->r, b, 1);
	assert_int_equal(file_size(pb), -1);
	assert_int_equal(f->r.n.set_aside, 1);
	free(pa);
	free(pb);
	fx_free(f);
}

/* Idle saving: only changed pool sessions idle long enough. */
static void test_save_idle(void **state)
{
	(void)state;
	struct fx *f = fx_new(8, 0, 1);
	static const char *const ids[] = { "i0", "i1", "i2" };
	struct session *s[3];
	for (int i = 0; i < 3; i++)
		s[i] = make(f, ids[i], 16, 1000 + 2000 * i);  /* 1000, 3000, 5000 */
	s[1]->busy = 1;
	res_save_idle(&f->r, 3000);
	assert_false(s[0]->dirty);
	assert_true(s[1]->dirty);  /* busy */
	assert_true(s[2]->dirty);  /* not idle long enough */
	assert_int_equal(f->r.n.saves, 1);
	fx_free(f);
}

static void drop_all(struct session *s, void *ctx)
{
	res_drop(ctx, s, 0);
}

/* sess_foreach lets its callback drop the session it is given. */
static void test_foreach_drops(void **state)
{
	(void)state;
	struct fx *f = fx_new(256, 0, 0);
	char id[16];
	for (int i = 0; i < 200; i++) {
		snprintf(id, sizeof(id), "s%d", i);
		make(f, id, 1, i);
	}
	assert_int_equal(f->st.count, 200);
	sess_foreach(&f->st, 0, drop_all, &f->r);
	assert_int_equal(f->st.count, 0);
	assert_int_equal(kvpool_n_free(f->pool), 256);
	fx_free(f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_kvseq_host_round_trip),
		cmocka_unit_test(test_evict_to_ram_lru),
		cmocka_unit_test(test_restore_without_room),
		cmocka_unit_test(test_ram_full_to_disk),
		cmocka_unit_test(test_dirty_ram_stays),
		cmocka_unit_test(test_unsaved_never_leaves),
		cmocka_unit_test(test_save_backoff),
		cmocka_unit_test(test_list_sets_aside),
		cmocka_unit_test(test_drop_refused),
		cmocka_unit_test(test_restore_errors),
		cmocka_unit_test(test_list_and_save_all),
		cmocka_unit_test(test_save_idle),
		cmocka_unit_test(test_foreach_drops),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * tests/unit/test_persist.c — sessions that outlive the daemon: the state
 * directory, eviction from the KV pool to host memory and to disk, and what
 * happens when the state directory is damaged, full or unwritable.
 *
 * Every case starts real $BUILD/llamad processes (BUILD defaults to
 * "build") on the tiny model ($MODELS/stories260K.bin + tok512.model, MODELS
 * defaults to ../shared/models) on private sockets in one mkdtemp folder,
 * always with an explicit --state-dir, and restarts them between phases
 * with the same state directory (SIGTERM for an orderly stop, SIGKILL for a
 * crash). Each start writes its own log file; every stop checks the exit
 * status and greps the log for sanitizer reports, so the binary run with
 * BUILD=build-asan checks the sanitized daemon too.
 *
 * Equality of generated text is the yardstick: a restored session must
 * continue exactly as one that never left memory (greedy sampling, the
 * same requests on a daemon started with --state-dir none or a large pool).
 * The daemons run with one thread so that every run computes bit-identical
 * logits.
 *
 * KV sizes of stories260K: 5 layers x K,V x 16 positions x kv_dim 32 x 4
 * bytes = 20480 bytes per block of 16 tokens. kv_memory may not go below
 * 1 MiB (51 blocks, 816 tokens), so the eviction case uses sessions of
 * ~215 tokens (14 blocks): three fit in the pool.
 *
 * Case 3 kills the daemon at random delays after a Save (the seed is
 * printed; PERSIST_SEED=N repeats a run). Case 6a mounts a 64 KiB tmpfs
 * (needs root; skipped with a message if the mount fails). Set KEEP_LOG=1 to
 * keep the folder with the logs.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <xxhash.h>

#include "tests/unit/testutil.h"

#include "proto/frame.h"
#include "session/residency.h"

#define WAIT_MS 30000            /* longest wait for one reply */
#define RECV_MAX (64u << 20)

#include "tests/unit/daemon_harness.h"
#include "tests/unit/store_file.h"
#define BLOCK_BYTES 20480        /* stories260K: one KV block of 16 tokens */
#define MAX_DAEMONS 8

enum { L_POOL = LLAMAD__LOCATION__LOCATION_POOL, L_RAM = LLAMAD__LOCATION__LOCATION_RAM,
       L_DISK = LLAMAD__LOCATION__LOCATION_DISK };
enum { E_STORAGE = LLAMAD__ERROR_CODE__STORAGE,
       E_EXHAUSTED = LLAMAD__ERROR_CODE__RESOURCE_EXHAUSTED };

/* The state file header: store_file.h. */
enum {
	H_VERSION = SF_VERSION,
	H_FINGERPRINT = SF_FINGERPRINT,
	H_BODY_BYTES = SF_BODY_BYTES,
	H_ID = SF_ID,
	H_ID_BYTES = SF_ID_BYTES,
	HEADER_BYTES = SF_HEADER_BYTES,
};

static struct {
	char base[64];           /* the mkdtemp folder */
	char llamad[512], genmodel[512], model[512], tok[512];
	char mounted[128];       /* a tmpfs to unmount in teardown */
	int n_starts;
	uid_t uid;
	double t0;
} T;

static struct daemon *live[MAX_DAEMONS];

static void sleep_us(long us)
{
	struct timespec ts = { us / 1000000, (us % 1000000) * 1000L };
	nanosleep(&ts, NULL);
}

/* ---- files ------------------------------------------------------------------ */

/* malloc'd "<base>/<name>" */
static char *tpath(const char *name)
{
	return path_join(T.base, name);
}

/* malloc'd path of the state file of (our uid, id) in dir. */
static char *state_file(const char *dir, const char *id)
{
	char name[200];
	snprintf(name, sizeof(name), "%u-%s.session", (unsigned)T.uid, id);
	return path_join(dir, name);
}

static int exists(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0;
}

static void write_file(const char *path, const void *buf, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0)
		fail_msg("cannot create %s: %s", path, strerror(errno));
	assert_int_equal(write(fd, buf, len), (ssize_t)len);
	close(fd);
}

/* Names in dir, sorted, joined by " " (malloc'd); *n gets their count. */
static char *dir_names(const char *dir, int *n)
{
	DIR *d = opendir(dir);
	if (!d)
		fail_msg("cannot read %s: %s", dir, strerror(errno));
	char *names[256];
	int k = 0;
	struct dirent *de;
	while ((de = readdir(d)) && k < 256) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
		    !strcmp(de->d_name, LLAMAD_LOCK_FILE))   /* the daemon's, held while it runs */
			continue;
		if (!strcmp(de->d_name, BLK_DIR)) {  /* shared blocks: only temporary files */
			char sub[4096];
			snprintf(sub, sizeof(sub), "%s/%s", dir, BLK_DIR);
			DIR *b = opendir(sub);
			for (struct dirent *e; b && (e = readdir(b)) && k < 256;)
				if (!strncmp(e->d_name, ".tmp-", 5) &&
				    asprintf(&names[k], BLK_DIR "/%s", e->d_name) > 0)
					k++;
			if (b)
				closedir(b);
			continue;
		}
		names[k++] = strdup(de->d_name);
	}
	closedir(d);
	for (int i = 1; i < k; i++)
		for (int j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
			char *t = names[j];
			names[j] = names[j - 1];
			names[j - 1] = t;
		}
	size_t len = 1;
	for (int i = 0; i < k; i++)
		len += strlen(names[i]) + 1;
	char *out = calloc(1, len);
	assert_non_null(out);
	for (int i = 0; i < k; i++) {
		if (i)
			strcat(out, " ");
		strcat(out, names[i]);
		free(names[i]);
	}
	*n = k;
	return out;
}

/* Fail unless dir holds exactly the state files of the ids listed (NULL
 * ended): no temporary file, nothing else. */
static void expect_state_files(const char *dir, ...)
{
	char want[1024] = "";
	char *names[32];
	int k = 0;
	va_list ap;
	va_start(ap, dir);
	for (const char *id; (id = va_arg(ap, const char *)) && k < 32;) {
		char name[200];
		snprintf(name, sizeof(name), "%u-%s.session", (unsigned)T.uid, id);
		names[k++] = strdup(name);
	}
	va_end(ap);
	for (int i = 1; i < k; i++)
		for (int j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
			char *t = names[j];
			names[j] = names[j - 1];
			names[j - 1] = t;
		}
	for (int i = 0; i < k; i++) {
		if (i)
			strcat(want, " ");
		strcat(want, names[i]);
		free(names[i]);
	}
	int n;
	char *got = dir_names(dir, &n);
	if (strcmp(got, want))
		fail_msg("state directory %s holds [%s], expected [%s]", dir, got, want);
	free(got);
}

#define put_le sf_put
#define get_le sf_get

/* Recompute the checksums of a state file image, as a writer would. */
static void reseal(unsigned char *b, size_t len)
{
	assert_true(len >= HEADER_BYTES);
	sf_reseal(b, len);
}

/* ---- the daemon ---------------------------------------------------------- */

/* 1 if a line of d's log holds every one of the strings (NULL ended). */
static int log_line_has(const struct daemon *d, ...)
{
	size_t len;
	char *text = slurp(d->log, &len);
	if (!text)
		return 0;
	int found = 0;
	for (char *line = text, *nl; line && *line && !found; line = nl ? nl + 1 : NULL) {
		nl = strchr(line, '\n');
		if (nl)
			*nl = 0;
		found = 1;
		va_list ap;
		va_start(ap, d);
		for (const char *s; (s = va_arg(ap, const char *));)
			if (!strstr(line, s))
				found = 0;
		va_end(ap);
	}
	free(text);
	return found;
}

static void forget(struct daemon *d)
{
	for (int i = 0; i < MAX_DAEMONS; i++)
		if (live[i] == d)
			live[i] = NULL;
	d->pid = 0;
}

/*
 * Start llamad as d (tag names its socket and log) on model with
 * --state-dir state_dir and the extra options (NULL ended); return once its
 * socket accepts. Fails the case if it exits or does not listen.
 */
static void start_daemon(struct daemon *d, const char *tag, const char *model,
			 const char *state_dir, ...)
{
	/* f32 K/V unless the caller says otherwise (a later flag wins): the
	 * byte and block figures below are f32's */
	const char *extra[48] = { "--kv-type", "f32" };
	int n = 2;
	va_list ap;
	va_start(ap, state_dir);
	for (const char *a; (a = va_arg(ap, const char *)) && n < 47;)
		extra[n++] = a;
	va_end(ap);
	extra[n] = NULL;
	memset(d, 0, sizeof(*d));
	snprintf(d->tag, sizeof(d->tag), "%s", tag);
	snprintf(d->sock, sizeof(d->sock), "%s/%s.sock", T.base, tag);
	snprintf(d->log, sizeof(d->log), "%s/%02d-%s.log", T.base, ++T.n_starts, tag);
	assert_int_equal(daemon_spawn(d, T.llamad, model, T.tok, "1", state_dir, extra), 0);
	for (int i = 0; i < MAX_DAEMONS; i++)
		if (!live[i]) {
			live[i] = d;
			break;
		}
	int status = 0, rc = daemon_wait_listening(d, 30000, &status);
	if (rc == -ECHILD) {
		forget(d);
		daemon_dump_log_tail(d);
		fail_msg("llamad (%s) exited at startup (status 0x%x)", tag, status);
	}
	if (rc) {
		daemon_dump_log_tail(d);
		fail_msg("llamad (%s) did not listen within 30 s", tag);
	}
}

/* SIGTERM; the daemon must exit 0 within 20 s with a clean log. */
static void stop_daemon(struct daemon *d)
{
	assert_true(d->pid > 0);
	int status = daemon_stop(d, 20000);
	forget(d);
	int bad = daemon_log_has_sanitizer_report(d);
	if (!daemon_exited_ok(status) || bad) {
		daemon_dump_log_tail(d);
		fail_msg("llamad (%s): %s, status 0x%x%s", d->tag,
			 status == -1 ? "no exit within 20 s of SIGTERM" : "bad exit", status,
			 bad ? ", sanitizer report in its log" : "");
	}
}

/* SIGKILL: a crash. The log must hold no sanitizer report so far. */
static void kill_daemon(struct daemon *d)
{
	assert_true(d->pid > 0);
	kill(d->pid, SIGKILL);
	waitpid(d->pid, NULL, 0);
	forget(d);
	if (daemon_log_has_sanitizer_report(d)) {
		daemon_dump_log_tail(d);
		fail_msg("llamad (%s): sanitizer report in its log", d->tag);
	}
}

/* Fail unless r is the error `code` with a non-empty one-line message
 * that holds no path and contains `text` (may be NULL); free r. */
#define expect_error(r, code, text) expect_error_at((r), (code), (text), 1, __LINE__)

/* ---- requests -------------------------------------------------------------- */

static uint64_t save_send(struct cli *c, const char *name, int all)
{
	Llamad__Save s = LLAMAD__SAVE__INIT;
	s.session = (char *)name;
	PB_SET(&s, all, all != 0);
	Llamad__Request q = request_of(LLAMAD__REQUEST__OP_SAVE);
	q.save = &s;
	return cli_send(c, &q);
}

static Llamad__Response *op_save(struct cli *c, const char *name, int all)
{
	return cli_next(c, save_send(c, name, all));
}

static Llamad__Response *op_list(struct cli *c)
{
	Llamad__ListSessions l = LLAMAD__LIST_SESSIONS__INIT;
	Llamad__Request q = request_of(LLAMAD__REQUEST__OP_LIST);
	q.list = &l;
	return expect_body(cli_call(c, &q), LLAMAD__RESPONSE__BODY_SESSIONS);
}

/* Save name (or all) and expect Saved; returns the bytes reported. */
static uint64_t must_save(struct cli *c, const char *name, int all)
{
	Llamad__Response *r = expect_body(op_save(c, name, all), LLAMAD__RESPONSE__BODY_SAVED);
	uint64_t b = r->saved->bytes;
	rfree(r);
	return b;
}

/* The entry of `name` in a SessionList response (NULL if absent). */
static Llamad__SessionInfo *list_find(Llamad__Response *l, const char *name)
{
	for (size_t i = 0; i < l->sessions->n_sessions; i++)
		if (!strcmp(l->sessions->sessions[i]->session, name))
			return l->sessions->sessions[i];
	return NULL;
}

/* ---- fixtures ------------------------------------------------------------------ */

static int group_setup(void **state)
{
	(void)state;
	signal(SIGPIPE, SIG_IGN);
	const char *build = env_or("BUILD", "build");
	const char *models = env_or("MODELS", "../shared/models");
	snprintf(T.llamad, sizeof(T.llamad), "%s/llamad", build);
	snprintf(T.genmodel, sizeof(T.genmodel), "%s/llamad-genmodel", build);
	snprintf(T.model, sizeof(T.model), "%s/stories260K.bin", models);
	snprintf(T.tok, sizeof(T.tok), "%s/tok512.model", models);
	const char *need[] = { T.llamad, T.genmodel, T.model, T.tok };
	for (size_t i = 0; i < 4; i++)
		if (access(need[i], R_OK) != 0) {
			fprintf(stderr, "test_persist: missing %s (set BUILD, MODELS)\n", need[i]);
			return -1;
		}
	snprintf(T.base, sizeof(T.base), "/tmp/llamad-persist.XXXXXX");
	if (!mkdtemp(T.base)) {
		perror("mkdtemp");
		return -1;
	}
	T.uid = geteuid();
	return 0;
}

static void rm_rf(const char *path)
{
	struct stat st;
	if (lstat(path, &st) != 0)
		return;
	if (S_ISDIR(st.st_mode)) {
		DIR *d = opendir(path);
		struct dirent *de;
		while (d && (de = readdir(d))) {
			if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
				continue;
			char *p = path_join(path, de->d_name);
			rm_rf(p);
			free(p);
		}
		if (d)
			closedir(d);
		rmdir(path);
	} else {
		unlink(path);
	}
}

static int group_teardown(void **state)
{
	(void)state;
	if (!getenv("KEEP_LOG"))
		rm_rf(T.base);
	else
		fprintf(stderr, "test_persist: logs kept in %s\n", T.base);
	return 0;
}

static int case_setup(void **state)
{
	(void)state;
	T.t0 = now_ms();
	return 0;
}

/* Kill what a failed case left running (showing its log), unmount. */
static int case_teardown(void **state)
{
	(void)state;
	for (int i = 0; i < MAX_DAEMONS; i++) {
		struct daemon *d = live[i];
		if (!d)
			continue;
		kill(d->pid, SIGKILL);
		waitpid(d->pid, NULL, 0);
		daemon_dump_log_tail(d);
		live[i] = NULL;
	}
	if (T.mounted[0]) {
		if (umount(T.mounted) != 0)
			fprintf(stderr, "test_persist: cannot unmount %s: %s\n", T.mounted,
				strerror(errno));
		T.mounted[0] = 0;
	}
	print_message("  (%.0f ms)\n", now_ms() - T.t0);
	return 0;
}

/* ---- 1. restart without loss ------------------------------------------------ */

static const char *const SYSTEM = "You are a storyteller for small children.";
static const char *const TURN1 = "Tell me a story about a cat.";
static const char *const TURN2 = "What happened next?";
static const char *const TURN3 = "And then?";

/* The requests of case 1 up to the restart (both daemons make them). */
static void restart_workload(struct cli *c, struct gen g[3])
{
	must_open(c, "work", T_LLAMA2, 0, SYSTEM, 0);
	generate_ok(c, "work", GREEDY(TURN1, 30), &g[0], 1);
	generate_ok(c, "work", GREEDY(TURN2, 30), &g[1], 1);
	must_open(c, "raw", T_RAW, 0, NULL, 0);
	generate_ok(c, "raw", GREEDY(PROMPT, 40), &g[2], 0);
}

static void test_restart_without_loss(void **state)
{
	(void)state;
	char *dir = tpath("state1");
	struct daemon ref, d;
	start_daemon(&ref, "ref1", T.model, "none", NULL);
	start_daemon(&d, "d1", T.model, dir, NULL);
	struct cli *rc = cli_new(&ref), *c = cli_new(&d);
	struct gen rg[3], g[3];
	restart_workload(rc, rg);
	restart_workload(c, g);
	for (int i = 0; i < 3; i++)
		assert_same_gen(&rg[i], &g[i]);
	/* an ephemeral session is never written */
	rfree(expect_body(op_open(c, "eph", T_RAW, 0, NULL, 1), LLAMAD__RESPONSE__BODY_SESSION));
	expect_error(op_save(c, "eph", 0), LLAMAD__ERROR_CODE__BAD_REQUEST, "ephemeral");
	Llamad__Response *iw = must_info(c, "work"), *ir = must_info(c, "raw");
	uint32_t n_work = iw->session->tokens, n_raw = ir->session->tokens;
	assert_int_equal(n_raw, g[2].session_tokens);
	assert_int_equal(n_work, g[1].session_tokens);
	assert_int_equal(iw->session->location, L_POOL);
	rfree(iw);
	rfree(ir);
	cli_free(c);
	stop_daemon(&d);

	/* one file per session, mode 0600, in a folder only we can enter */
	expect_state_files(dir, "raw", "work", NULL);
	struct stat st;
	assert_int_equal(stat(dir, &st), 0);
	assert_int_equal(st.st_mode & 077, 0);
	char *fw = state_file(dir, "work"), *fr = state_file(dir, "raw");
	uint64_t size_raw;
	assert_int_equal(stat(fw, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0600);
	assert_int_equal(stat(fr, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0600);
	size_raw = (uint64_t)st.st_size;
	/* 45 tokens, 44 of them cached: 3 blocks of K/V, the 2 full ones in
	 * shared block files (blocks.h), the last in the state file */
	assert_true(size_raw > 1 * BLOCK_BYTES && size_raw < 2 * BLOCK_BYTES);
	{
		char bdir[4096];
		int n_blk = 0;
		snprintf(bdir, sizeof(bdir), "%s/%s", dir, BLK_DIR);
		DIR *b = opendir(bdir);
		assert_non_null(b);
		for (struct dirent *e; (e = readdir(b));) {
			char p[8192];
			snprintf(p, sizeof(p), "%s/%s", bdir, e->d_name);
			if (e->d_name[0] == '.')
				continue;
			assert_int_equal(stat(p, &st), 0);
			assert_int_equal(st.st_mode & 07777, 0600);
			assert_int_equal(st.st_size, BLK_HEADER_BYTES + 16 * 4 + BLOCK_BYTES);
			n_blk++;
		}
		closedir(b);
		assert_true(n_blk >= 2);
	}

	/* restart: both listed from their headers, nothing loaded */
	start_daemon(&d, "d1", T.model, dir, NULL);
	assert_true(log_line_has(&d, "2 saved sessions", NULL));
	c = cli_new(&d);
	Llamad__Response *l = op_list(c);
	assert_int_equal(l->sessions->n_sessions, 2);
	Llamad__SessionInfo *sw = list_find(l, "work"), *sr = list_find(l, "raw");
	assert_non_null(sw);
	assert_non_null(sr);
	assert_int_equal(sw->location, L_DISK);
	assert_int_equal(sr->location, L_DISK);
	assert_int_equal(sw->tokens, n_work);
	assert_int_equal(sr->tokens, n_raw);
	assert_true(sw->saved && sr->saved);
	assert_int_equal(sr->file_bytes, size_raw);
	assert_int_equal(sr->kv_blocks, 0);
	assert_int_equal(sr->cached_tokens, 0);
	assert_int_equal(sw->turns, 4);   /* the header's count, not the stub's 0 */
	assert_int_equal(sr->turns, 2);
	rfree(l);
	/* its transcript, read from the file without restoring it, equals the
	 * one of the same session in memory in the reference daemon */
	for (int k = 0; k < 2; k++) {
		const char *name = k ? "raw" : "work";
		Llamad__Response *a = expect_body(op_transcript(c, name, -1, 0, 1),
						  LLAMAD__RESPONSE__BODY_TRANSCRIPT);
		Llamad__Response *b = expect_body(op_transcript(rc, name, -1, 0, 1),
						  LLAMAD__RESPONSE__BODY_TRANSCRIPT);
		const Llamad__Transcript *ta = a->transcript, *tb = b->transcript;
		assert_int_equal(ta->location, L_DISK);
		assert_int_equal(tb->location, L_POOL);
		assert_int_equal(ta->turns, k ? 2 : 4);
		assert_int_equal(ta->n_items, tb->n_items);
		assert_int_equal(ta->next, tb->next);
		assert_true(!ta->system == !tb->system);
		if (ta->system)
			assert_string_equal(ta->system, tb->system);
		for (size_t i = 0; i < ta->n_items; i++) {
			const Llamad__Turn *x = ta->items[i], *y = tb->items[i];
			assert_string_equal(x->text, y->text);
			assert_int_equal(x->role, y->role);
			assert_int_equal(x->generated, y->generated);
			assert_int_equal(x->has_stop_reason, y->has_stop_reason);
			assert_int_equal(x->stop_reason, y->stop_reason);
			assert_int_equal(x->tokens, y->tokens);
			assert_int_equal(x->n_token_ids, y->n_token_ids);
			assert_memory_equal(x->token_ids, y->token_ids,
					    x->n_token_ids * sizeof(uint32_t));
		}
		assert_string_equal(ta->items[ta->n_items - 1]->text, g[k ? 2 : 1].text);
		rfree(a);
		rfree(b);
	}
	Llamad__Response *s0 = op_status(c);
	assert_int_equal(s0->status->counters->restores, 0);  /* transcripts restored nothing */
	assert_int_equal(s0->status->sessions_on_disk, 2);
	assert_int_equal(s0->status->kv_blocks_free, s0->status->kv_blocks_total);
	assert_string_equal(s0->status->state_dir, dir);
	rfree(s0);

	/* 20 more tokens: only the pending last token goes through the model */
	struct gen rmore, more;
	generate_ok(rc, "raw", GREEDY(NULL, 20), &rmore, 0);
	generate_ok(c, "raw", GREEDY(NULL, 20), &more, 0);
	assert_int_equal(more.prompt_tokens, 1);
	assert_int_equal(more.session_tokens, n_raw + 20);
	assert_same_gen(&rmore, &more);
	ir = must_info(c, "raw");
	assert_int_equal(ir->session->location, L_POOL);
	assert_int_equal(ir->session->cached_tokens, n_raw + 19);
	assert_false(ir->session->saved);
	rfree(ir);
	iw = must_info(c, "work");
	assert_int_equal(iw->session->location, L_DISK);
	rfree(iw);
	Llamad__Response *s1 = op_status(c);
	assert_int_equal(s1->status->counters->restores, 1);
	assert_int_equal(s1->status->sessions_on_disk, 1);
	rfree(s1);

	/* the chat session continues as if it had never left: turns, system
	 * prompt and the closing of the last answer come back with it */
	struct gen rthird, third;
	generate_ok(rc, "work", GREEDY(TURN3, 20), &rthird, 1);
	generate_ok(c, "work", GREEDY(TURN3, 20), &third, 1);
	assert_same_gen(&rthird, &third);
	assert_int_equal(rthird.prompt_tokens, third.prompt_tokens);
	iw = must_info(c, "work");
	assert_int_equal(iw->session->turns, 6);
	assert_string_equal(iw->session->system, SYSTEM);
	assert_int_equal(iw->session->template_, T_LLAMA2);
	rfree(iw);

	for (int i = 0; i < 3; i++) {
		gen_free(&rg[i]);
		gen_free(&g[i]);
	}
	gen_free(&rmore);
	gen_free(&more);
	gen_free(&rthird);
	gen_free(&third);
	cli_free(c);
	cli_free(rc);
	stop_daemon(&d);
	stop_daemon(&ref);
	free(fw);
	free(fr);
	free(dir);
}

/* ---- 2. idle save, then a crash ------------------------------------------- */

static void test_idle_save_then_crash(void **state)
{
	(void)state;
	char *dir = tpath("state2");
	char *file = state_file(dir, "idle");
	struct daemon d;
	start_daemon(&d, "d2", T.model, dir, "--save-delay", "1", NULL);
	struct cli *c = cli_new(&d);
	must_open(c, "idle", T_RAW, 0, NULL, 0);
	struct gen g;
	generate_ok(c, "idle", GREEDY(PROMPT, 30), &g, 0);
	uint32_t n1 = g.session_tokens;
	gen_free(&g);
	double t0 = now_ms();
	Llamad__Response *i;
	for (;;) {
		i = must_info(c, "idle");
		if (i->session->saved)
			break;
		rfree(i);
		if (now_ms() - t0 > 4000)
			fail_msg("not saved 4 s after the generation (save_delay 1)");
		sleep_ms(50);
	}
	double waited = now_ms() - t0;
	print_message("  idle save after %.0f ms\n", waited);
	assert_true(waited >= 800);   /* idle for save_delay first */
	struct stat st;
	assert_int_equal(stat(file, &st), 0);
	assert_int_equal(i->session->file_bytes, (uint64_t)st.st_size);
	rfree(i);
	Llamad__Response *s = op_status(c);
	assert_int_equal(s->status->counters->saves, 1);
	rfree(s);
	cli_free(c);
	kill_daemon(&d);

	/* nothing lost: it was saved while idle */
	start_daemon(&d, "d2", T.model, dir, "--save-delay", "1", NULL);
	c = cli_new(&d);
	i = must_info(c, "idle");
	assert_int_equal(i->session->tokens, n1);
	assert_int_equal(i->session->location, L_DISK);
	rfree(i);
	struct gen lost;
	generate_ok(c, "idle", GREEDY(NULL, 10), &lost, 0);
	assert_int_equal(lost.prompt_tokens, 1);
	cli_free(c);
	kill_daemon(&d);   /* before the idle save of that turn */

	/* only the unsaved turn is gone; the session works and the turn comes
	 * out the same again */
	start_daemon(&d, "d2", T.model, dir, "--save-delay", "1", NULL);
	c = cli_new(&d);
	i = must_info(c, "idle");
	assert_int_equal(i->session->tokens, n1);
	rfree(i);
	struct gen again;
	generate_ok(c, "idle", GREEDY(NULL, 10), &again, 0);
	assert_int_equal(again.prompt_tokens, 1);
	assert_same_gen(&lost, &again);
	gen_free(&lost);
	gen_free(&again);
	cli_free(c);
	stop_daemon(&d);
	free(file);
	free(dir);
}

/* ---- 3. a crash in the middle of a save ------------------------------------- */

#define KILL_ROUNDS 20
#define BIG_TOKENS 380
#define STEP_TOKENS 2

static uint64_t rng_state;

static uint32_t rng_next(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return (uint32_t)((z ^ (z >> 31)) >> 32);
}

static void test_kill_during_save(void **state)
{
	(void)state;
	char *dir = tpath("state3");
	rng_state = getenv("PERSIST_SEED") ? strtoull(getenv("PERSIST_SEED"), NULL, 10)
					   : (uint64_t)time(NULL);
	print_message("  kill delays from seed %llu (PERSIST_SEED)\n",
		      (unsigned long long)rng_state);

	/* what the session must hold at any time: a prefix of one greedy run */
	struct daemon ref, d;
	start_daemon(&ref, "ref3", T.model, "none", NULL);
	struct cli *rc = cli_new(&ref);
	must_open(rc, "big", T_RAW, 0, NULL, 0);
	struct gen want;
	uint32_t total = BIG_TOKENS + KILL_ROUNDS * STEP_TOKENS + 10;
	generate_ok(rc, "big", GREEDY(PROMPT, total), &want, 0);
	cli_free(rc);
	stop_daemon(&ref);

	start_daemon(&d, "d3", T.model, dir, "--save-delay", "3600", NULL);
	struct cli *c = cli_new(&d);
	must_open(c, "big", T_RAW, 0, NULL, 0);
	struct gen g;
	generate_ok(c, "big", GREEDY(PROMPT, BIG_TOKENS), &g, 0);
	uint32_t prompt = g.session_tokens - BIG_TOKENS;
	uint32_t *have = malloc(total * sizeof(uint32_t));   /* generated ids kept */
	assert_non_null(have);
	memcpy(have, g.toks, g.n * sizeof(uint32_t));
	uint32_t n_have = (uint32_t)g.n;
	gen_free(&g);
	must_save(c, "big", 0);
	cli_free(c);
	kill_daemon(&d);

	int n_new = 0, n_old = 0, n_tmp = 0, n_removed = 0;
	uint32_t pend[STEP_TOKENS];
	int have_pend = 0;
	for (int round = 0; round < KILL_ROUNDS; round++) {
		start_daemon(&d, "d3", T.model, dir, "--save-delay", "3600", NULL);
		/* whatever the kill interrupted, the restart leaves only the file */
		expect_state_files(dir, "big", NULL);
		n_removed += log_line_has(&d, ".tmp-", "interrupted write", NULL);
		c = cli_new(&d);
		Llamad__Response *i = must_info(c, "big");
		uint32_t t = i->session->tokens;
		rfree(i);
		if (have_pend && t == prompt + n_have + STEP_TOKENS) {
			memcpy(have + n_have, pend, sizeof(pend));
			n_have += STEP_TOKENS;
			n_new++;
		} else if (have_pend) {
			n_old++;
		}
		if (t != prompt + n_have)
			fail_msg("round %d: the session has %u tokens, expected %u (or %u)", round, t,
				 prompt + n_have, prompt + n_have + STEP_TOKENS);
		/* it loads, and without a re-prefill */
		generate_ok(c, "big", GREEDY(NULL, STEP_TOKENS), &g, 0);
		assert_int_equal(g.prompt_tokens, 1);
		memcpy(pend, g.toks, sizeof(pend));
		have_pend = 1;
		gen_free(&g);
		/* save, and crash up to 5 ms into it (every other round within
		 * the first millisecond, where the write is in progress) */
		save_send(c, "big", 0);
		sleep_us((long)(rng_next() % (round % 2 ? 5001 : 1001)));
		kill_daemon(&d);
		cli_free(c);
		int k;
		char *names = dir_names(dir, &k);
		n_tmp += strstr(names, ".tmp-") != NULL;
		free(names);
	}
	start_daemon(&d, "d3", T.model, dir, "--save-delay", "3600", NULL);
	expect_state_files(dir, "big", NULL);
	n_removed += log_line_has(&d, ".tmp-", "interrupted write", NULL);
	c = cli_new(&d);
	Llamad__Response *i = must_info(c, "big");
	if (i->session->tokens == prompt + n_have + STEP_TOKENS) {
		memcpy(have + n_have, pend, sizeof(pend));
		n_have += STEP_TOKENS;
		n_new++;
	} else {
		n_old++;
	}
	assert_int_equal(i->session->tokens, prompt + n_have);
	rfree(i);
	generate_ok(c, "big", GREEDY(NULL, 10), &g, 0);
	memcpy(have + n_have, g.toks, 10 * sizeof(uint32_t));
	n_have += 10;
	gen_free(&g);
	/* the history is exactly the greedy run's prefix: no file was torn */
	assert_true(n_have <= want.n);
	assert_memory_equal(have, want.toks, n_have * sizeof(uint32_t));
	print_message("  %d saves completed before the kill, %d interrupted; %d kills left a "
		      "temporary file, %d restarts removed one\n", n_new, n_old, n_tmp, n_removed);
	free(have);
	gen_free(&want);
	cli_free(c);
	stop_daemon(&d);
	free(dir);
}

/* ---- 4. damaged files ------------------------------------------------------ */

/* A raw session of PROMPT-like text + n greedy tokens. */
static void make_raw(struct cli *c, const char *name, const char *prompt, uint32_t n)
{
	must_open(c, name, T_RAW, 0, NULL, 0);
	struct gen g;
	generate_ok(c, name, GREEDY(prompt, n), &g, 0);
	gen_free(&g);
}

static void test_bad_files(void **state)
{
	(void)state;
	char *dir = tpath("state4");
	struct daemon d;
	start_daemon(&d, "d4", T.model, dir, NULL);
	struct cli *c = cli_new(&d);
	make_raw(c, "good1", PROMPT, 30);
	make_raw(c, "good2", "The little dog", 30);
	make_raw(c, "flip", "Lily and Ben", 30);
	make_raw(c, "vers", "One day", 30);
	Llamad__Response *i1 = must_info(c, "good1"), *i2 = must_info(c, "good2");
	uint32_t n_good1 = i1->session->tokens, n_good2 = i2->session->tokens;
	rfree(i1);
	rfree(i2);
	cli_free(c);
	stop_daemon(&d);
	expect_state_files(dir, "flip", "good1", "good2", "vers", NULL);

	char *p_good1 = state_file(dir, "good1"), *p_good2 = state_file(dir, "good2");
	char *p_flip = state_file(dir, "flip"), *p_vers = state_file(dir, "vers");
	char *p_trunc = state_file(dir, "trunc"), *p_alias = state_file(dir, "alias");
	char *p_garbage = state_file(dir, "garbage"), *p_tiny = state_file(dir, "tiny");
	char *p_oov = state_file(dir, "oov");
	size_t len;
	unsigned char *img = (unsigned char *)slurp(p_good1, &len);
	assert_non_null(img);
	assert_int_equal(get_le(img + H_BODY_BYTES, 8) + HEADER_BYTES, len);

	/* truncated: good1's file renamed to "trunc" (header id and checksum
	 * made consistent with the name), losing its last 100 bytes */
	unsigned char *t = malloc(len);
	memcpy(t, img, len);
	memset(t + H_ID, 0, H_ID_BYTES);
	memcpy(t + H_ID, "trunc", 5);
	reseal(t, len);
	write_file(p_trunc, t, len - 100);
	/* a token id outside the vocabulary, as from a foreign model with a
	 * bigger one (recompute: the history goes through the model), checksums
	 * right: only the daemon's own check can catch it */
	memcpy(t, img, len);
	memset(t + H_ID, 0, H_ID_BYTES);
	memcpy(t + H_ID, "oov", 3);
	put_le(t + H_FINGERPRINT, 0x0123456789abcdefull, 8);
	put_le(t + HEADER_BYTES + 4 * 3, 100000, 4);
	reseal(t, len);
	write_file(p_oov, t, len);
	free(t);
	free(img);
	/* good2's file under another name, untouched: its header says "good2" */
	img = (unsigned char *)slurp(p_good2, &len);
	write_file(p_alias, img, len);
	free(img);
	/* a flipped byte in the K/V at the end of the body */
	img = (unsigned char *)slurp(p_flip, &len);
	img[len - 7] ^= 0x10;
	write_file(p_flip, img, len);
	free(img);
	/* a future format version (header checksum made right) */
	img = (unsigned char *)slurp(p_vers, &len);
	put_le(img + H_VERSION, 7, 4);
	reseal(img, len);
	write_file(p_vers, img, len);
	free(img);
	/* garbage, and a file shorter than a header */
	unsigned char junk[3000];
	for (size_t k = 0; k < sizeof(junk); k++)
		junk[k] = (unsigned char)(k * 7919u >> 3);
	write_file(p_garbage, junk, sizeof(junk));
	write_file(p_tiny, "LLAMA", 5);

	/* what each refused file holds, to find it whole after */
	static const char *const why[][2] = {
		{ "trunc", "truncated" },
		{ "alias", "does not match" },
		{ "vers", "version 7" },
		{ "garbage", "magic" },
		{ "tiny", "truncated" },
	};
	enum { N_REFUSED = sizeof(why) / sizeof(why[0]) };
	char *bytes[N_REFUSED];
	size_t n_bytes[N_REFUSED];
	for (size_t k = 0; k < N_REFUSED; k++) {
		char *p = state_file(dir, why[k][0]);
		bytes[k] = slurp(p, &n_bytes[k]);
		assert_non_null(bytes[k]);
		free(p);
	}

	start_daemon(&d, "d4", T.model, dir, NULL);
	/* every bad file named in the log with its reason, and moved aside
	 * (NAME.corrupt) as it was: a new session of that name would
	 * overwrite it at its first save */
	for (size_t k = 0; k < N_REFUSED; k++) {
		char *p = state_file(dir, why[k][0]), aside[512];
		snprintf(aside, sizeof(aside), "%s.corrupt", p);
		if (!log_line_has(&d, p, why[k][1], "moved to", aside, NULL)) {
			daemon_dump_log_tail(&d);
			fail_msg("the log does not name %s with \"%s\", moved to %s", p, why[k][1],
				 aside);
		}
		size_t n;
		char *got = slurp(aside, &n);
		assert_non_null(got);
		assert_int_equal(n, n_bytes[k]);
		assert_memory_equal(got, bytes[k], n);
		assert_false(exists(p));
		free(got);
		free(p);
	}
	c = cli_new(&d);
	Llamad__Response *st = op_status(c);
	assert_int_equal(st->status->counters->files_set_aside, N_REFUSED);
	rfree(st);
	Llamad__Response *l = op_list(c);
	const char *listed[] = { "good1", "good2", "flip", "oov" };
	const char *unlisted[] = { "trunc", "alias", "vers", "garbage", "tiny" };
	assert_int_equal(l->sessions->n_sessions, 4);
	for (int k = 0; k < 4; k++)
		assert_non_null(list_find(l, listed[k]));
	for (int k = 0; k < 5; k++)
		assert_null(list_find(l, unlisted[k]));
	assert_int_equal(list_find(l, "good1")->tokens, n_good1);
	assert_int_equal(list_find(l, "good2")->tokens, n_good2);
	rfree(l);

	/* the good ones work */
	struct gen g;
	generate_ok(c, "good1", GREEDY(NULL, 5), &g, 0);
	assert_int_equal(g.prompt_tokens, 1);
	gen_free(&g);
	generate_ok(c, "good2", GREEDY(NULL, 5), &g, 0);
	assert_int_equal(g.prompt_tokens, 1);
	gen_free(&g);
	/* the corrupt body shows when it is used: STORAGE, the reason logged
	 * with the file's name; the file stays for inspection */
	generate(c, "flip", GREEDY(NULL, 5), &g);
	assert_int_equal(g.error, E_STORAGE);
	if (!strstr(g.msg, "flip") || !strstr(g.msg, "corrupt"))
		fail_msg("STORAGE message \"%s\" names neither the session nor the problem", g.msg);
	assert_null(strchr(g.msg, '/'));   /* no path on the wire */
	gen_free(&g);
	assert_true(log_line_has(&d, p_flip, "checksum", NULL));
	assert_true(exists(p_flip));
	Llamad__Response *i = must_info(c, "flip");
	assert_int_equal(i->session->location, L_DISK);
	rfree(i);
	/* a token outside the vocabulary is refused, not run; the session
	 * stays on disk */
	generate(c, "oov", GREEDY(NULL, 5), &g);
	if (g.error != E_STORAGE || !strstr(g.msg, "vocabulary"))
		fail_msg("oov: expected STORAGE naming the vocabulary, got %d: %s", g.error, g.msg);
	gen_free(&g);
	i = must_info(c, "oov");
	assert_int_equal(i->session->location, L_DISK);
	assert_int_equal(i->session->tokens, n_good1);
	rfree(i);
	/* the daemon is fine */
	generate_ok(c, "good1", GREEDY(NULL, 5), &g, 0);
	gen_free(&g);
	/* a new session under a refused file's name is saved beside the file
	 * set aside, which stays whole (before: the 264-byte file of a new
	 * session replaced a 451,598-byte one) */
	char aside[512];
	snprintf(aside, sizeof(aside), "%s.corrupt", p_trunc);
	make_raw(c, "trunc", "The little dog", 5);
	must_save(c, "trunc", 0);
	assert_true(exists(p_trunc));
	size_t n_aside;
	char *kept = slurp(aside, &n_aside);
	assert_int_equal(n_aside, n_bytes[0]);
	assert_memory_equal(kept, bytes[0], n_aside);
	free(kept);
	/* a file refused when it was read (the corrupt body): dropping its
	 * session moves it aside too, it is not deleted */
	size_t n_flip;
	char *flip_bytes = slurp(p_flip, &n_flip);
	must_drop(c, "flip");
	assert_false(exists(p_flip));
	snprintf(aside, sizeof(aside), "%s.corrupt", p_flip);
	kept = slurp(aside, &n_aside);
	assert_non_null(kept);
	assert_int_equal(n_aside, n_flip);
	assert_memory_equal(kept, flip_bytes, n_flip);
	free(kept);
	free(flip_bytes);
	assert_true(log_line_has(&d, "session flip dropped", "refused when read", aside, NULL));
	st = op_status(c);
	assert_int_equal(st->status->counters->files_set_aside, N_REFUSED + 1);
	rfree(st);
	cli_free(c);
	stop_daemon(&d);

	/* the files set aside are never read again: no report, no session;
	 * the same name refused once more goes to NAME.corrupt.1 */
	write_file(p_tiny, "LLAMA", 5);
	start_daemon(&d, "d4b", T.model, dir, NULL);
	assert_false(log_line_has(&d, ".corrupt:", NULL));
	char aside1[512];
	snprintf(aside1, sizeof(aside1), "%s.corrupt.1", p_tiny);
	assert_true(log_line_has(&d, p_tiny, "truncated", aside1, NULL));
	assert_true(exists(aside1));
	c = cli_new(&d);
	l = op_list(c);
	assert_int_equal(l->sessions->n_sessions, 4);   /* good1, good2, oov, trunc */
	assert_non_null(list_find(l, "trunc"));
	assert_null(list_find(l, "tiny"));
	rfree(l);
	st = op_status(c);
	assert_int_equal(st->status->counters->files_set_aside, 1);
	rfree(st);
	cli_free(c);
	stop_daemon(&d);

	for (size_t k = 0; k < N_REFUSED; k++)
		free(bytes[k]);
	free(p_good1);
	free(p_good2);
	free(p_flip);
	free(p_vers);
	free(p_trunc);
	free(p_alias);
	free(p_garbage);
	free(p_tiny);
	free(p_oov);
	free(dir);
}

/* ---- 5. a different model ------------------------------------------------- */

static void test_foreign_model(void **state)
{
	(void)state;
	char *dir = tpath("state5"), *other = tpath("random260K");
	/* same shapes as stories260K, other weights: another fingerprint */
	char cmd[2048];
	snprintf(cmd, sizeof(cmd), "'%s' --shape stories260K --seed 7 --out '%s' --tokenizer '%s' "
		 ">/dev/null 2>&1", T.genmodel, other, T.tok);
	if (system(cmd) != 0)
		fail_msg("%s failed", cmd);

	struct daemon d;
	start_daemon(&d, "d5", T.model, dir, NULL);
	struct cli *c = cli_new(&d);
	make_raw(c, "f1", PROMPT, 30);
	must_open(c, "f2", T_LLAMA2, 0, SYSTEM, 0);
	struct gen g;
	generate_ok(c, "f2", GREEDY(TURN1, 20), &g, 1);
	gen_free(&g);
	Llamad__Response *i1 = must_info(c, "f1"), *i2 = must_info(c, "f2");
	uint32_t n1 = i1->session->tokens, n2 = i2->session->tokens;
	rfree(i1);
	rfree(i2);
	cli_free(c);
	stop_daemon(&d);
	char *p1 = state_file(dir, "f1");
	size_t len0;
	char *before = slurp(p1, &len0);
	assert_non_null(before);

	/* refuse: the session is listed, but using it is a STORAGE error and
	 * its file is left alone */
	start_daemon(&d, "d5r", other, dir, "--foreign-cache", "refuse", NULL);
	assert_true(log_line_has(&d, "another model", NULL));
	c = cli_new(&d);
	Llamad__Response *l = op_list(c);
	assert_int_equal(l->sessions->n_sessions, 2);
	assert_int_equal(list_find(l, "f1")->tokens, n1);
	rfree(l);
	generate(c, "f1", GREEDY(NULL, 5), &g);
	assert_int_equal(g.error, E_STORAGE);
	if (!strstr(g.msg, "different model"))
		fail_msg("refusal \"%s\" does not mention a different model", g.msg);
	gen_free(&g);
	cli_free(c);
	stop_daemon(&d);
	size_t len1;
	char *after = slurp(p1, &len1);
	assert_int_equal(len0, len1);
	assert_memory_equal(before, after, len0);
	free(after);

	/* recompute (the default): the history comes back, the cache is
	 * rebuilt from all of it on the next generation */
	start_daemon(&d, "d5c", other, dir, NULL);
	c = cli_new(&d);
	/* a fork brings its source in without running anything: history, no
	 * cache */
	rfree(expect_body(op_fork(c, "f1", "f1-copy"), LLAMAD__RESPONSE__BODY_SESSION));
	Llamad__Response *i = must_info(c, "f1");
	assert_int_equal(i->session->location, L_POOL);
	assert_int_equal(i->session->tokens, n1);
	assert_int_equal(i->session->cached_tokens, 0);
	rfree(i);
	must_drop(c, "f1-copy");
	generate_ok(c, "f1", GREEDY(NULL, 5), &g, 0);
	assert_int_equal(g.prompt_tokens, n1);
	assert_int_equal(g.session_tokens, n1 + 5);
	gen_free(&g);
	i = must_info(c, "f1");
	assert_int_equal(i->session->cached_tokens, n1 + 4);
	rfree(i);
	generate_ok(c, "f2", GREEDY(TURN2, 5), &g, 1);
	assert_true(g.prompt_tokens > n2);   /* the whole history, then the turn */
	gen_free(&g);
	i = must_info(c, "f2");
	assert_int_equal(i->session->turns, 4);
	rfree(i);
	cli_free(c);
	stop_daemon(&d);

	/* written again under this model: now native, even with refuse */
	start_daemon(&d, "d5n", other, dir, "--foreign-cache", "refuse", NULL);
	c = cli_new(&d);
	generate_ok(c, "f1", GREEDY(NULL, 5), &g, 0);
	assert_int_equal(g.prompt_tokens, 1);
	gen_free(&g);
	cli_free(c);
	stop_daemon(&d);
	free(before);
	free(p1);
	free(other);
	free(dir);
}

/* ---- 6. full and unwritable state directories ---------------------------------- */

/* A tmpfs of `opts` mounted on a new folder `name` (unmounted by the
 * teardown), malloc'd; skips the test when it cannot be mounted. */
static char *tiny_fs(const char *name, const char *opts)
{
	char *dir = tpath(name);
	assert_int_equal(mkdir(dir, 0700), 0);
	if (mount("tmpfs", dir, "tmpfs", 0, opts) != 0) {
		print_message("  skipped: cannot mount a tmpfs on %s: %s (needs root)\n", dir,
			      strerror(errno));
		rmdir(dir);
		free(dir);
		skip();
	}
	snprintf(T.mounted, sizeof(T.mounted), "%s", dir);
	return dir;
}

static void test_full_state_dir(void **state)
{
	(void)state;
	char *dir = tiny_fs("tiny-fs", "size=64k,mode=0700");
	struct daemon d;
	start_daemon(&d, "d6a", T.model, dir, NULL);
	struct cli *c = cli_new(&d);
	/* a small session fits (1 block) */
	make_raw(c, "small", PROMPT, 5);
	must_save(c, "small", 0);
	/* 106 tokens: 7 blocks, 140 KiB of K/V */
	make_raw(c, "big", PROMPT, 100);
	expect_error(op_save(c, "big", 0), E_STORAGE, "session 'big': No space left");
	/* all: the others are still written */
	expect_error(op_save(c, NULL, 1), E_STORAGE, "session 'big': No space left");
	/* nothing half-written stays behind */
	expect_state_files(dir, "small", NULL);
	/* it keeps working in memory */
	struct gen g;
	generate_ok(c, "big", GREEDY(NULL, 10), &g, 0);
	assert_int_equal(g.prompt_tokens, 1);
	gen_free(&g);
	Llamad__Response *i = must_info(c, "big");
	assert_int_equal(i->session->location, L_POOL);
	assert_false(i->session->saved);
	rfree(i);
	Llamad__Response *s = op_status(c);
	assert_true(s->status->counters->save_errors >= 2);
	assert_int_equal(s->status->counters->saves, 2);   /* small, twice */
	rfree(s);
	cli_free(c);
	stop_daemon(&d);   /* the failed shutdown save does not fail the exit */
	assert_true(log_line_has(&d, "big", "No space left", NULL));
	expect_state_files(dir, "small", NULL);
	free(dir);
}

static char *fill_disk(const char *dir);

/* Block files (shared prefixes) on a full disk: a session saved with its
 * full blocks in block files, then grown, cannot be saved again; nothing of
 * the failed save stays (no new block file, no temporary file), and after
 * a restart the session is the one last saved, its cache loaded from its
 * block files (no re-prefill). */
static void test_full_disk_blocks(void **state)
{
	(void)state;
	char *dir = tiny_fs("tiny-fs2", "size=160k,mode=0700");
	struct daemon d;
	start_daemon(&d, "d6d", T.model, dir, "--save-delay", "3600", NULL);
	struct cli *c = cli_new(&d);
	/* ~40 tokens: 2 full blocks in block files, the rest in the state file */
	make_raw(c, "a", PROMPT, 30);
	must_save(c, "a", 0);
	Llamad__Response *i = must_info(c, "a");
	uint32_t saved = i->session->tokens;
	rfree(i);
	int n;
	char *bdir = path_join(dir, BLK_DIR);
	char *before = dir_names(bdir, &n);
	assert_true(n >= 2);
	/* room for one more block file (20.6 KiB), not two: the failed save
	 * writes one and must take it back */
	char *filler = fill_disk(dir);
	struct stat fst;
	assert_int_equal(stat(filler, &fst), 0);
	assert_int_equal(truncate(filler, fst.st_size - 24 * 1024), 0);
	struct gen g;
	generate_ok(c, "a", GREEDY(NULL, 40), &g, 0);   /* 2 or 3 more full blocks */
	gen_free(&g);
	expect_error(op_save(c, "a", 0), E_STORAGE, "session 'a': No space left");
	char *after = dir_names(bdir, &n);
	if (strcmp(before, after))
		fail_msg("a failed save left block files: [%s], before it [%s]", after, before);
	free(after);
	char want[64], *got = dir_names(dir, &n);
	snprintf(want, sizeof(want), "%u-a.session filler", (unsigned)T.uid);
	if (strcmp(got, want))
		fail_msg("state directory %s holds [%s], expected [%s]", dir, got, want);
	free(got);
	cli_free(c);
	kill_daemon(&d);

	start_daemon(&d, "d6d", T.model, dir, "--save-delay", "3600", NULL);
	c = cli_new(&d);
	i = must_info(c, "a");
	assert_int_equal(i->session->tokens, saved);
	rfree(i);
	generate_ok(c, "a", GREEDY(NULL, 5), &g, 0);
	assert_int_equal(g.prompt_tokens, 1);   /* its blocks loaded: no re-prefill */
	gen_free(&g);
	cli_free(c);
	kill_daemon(&d);
	after = dir_names(bdir, &n);
	if (strcmp(before, after))
		fail_msg("block files [%s] after the restart, [%s] before", after, before);
	free(after);
	free(before);
	free(bdir);
	unlink(filler);
	free(filler);
	free(dir);
}

static void test_unusable_state_dir(void **state)
{
	(void)state;
	char *file = tpath("not-a-dir");
	write_file(file, "x", 1);
	char *dir = path_join(file, "state");
	struct daemon d;
	start_daemon(&d, "d6b", T.model, dir, NULL);
	assert_true(log_line_has(&d, dir, "Not a directory", NULL));
	struct cli *c = cli_new(&d);
	Llamad__Response *s = op_status(c);
	assert_string_equal(s->status->state_dir, dir);
	rfree(s);
	make_raw(c, "mem", PROMPT, 20);
	expect_error(op_save(c, "mem", 0), E_STORAGE, NULL);
	struct gen g;
	generate_ok(c, "mem", GREEDY(NULL, 10), &g, 0);
	assert_int_equal(g.prompt_tokens, 1);
	gen_free(&g);
	s = op_status(c);
	assert_true(s->status->counters->save_errors >= 1);
	rfree(s);
	cli_free(c);
	stop_daemon(&d);
	free(dir);
	free(file);
}

/* Fill the file system of dir: a file "filler" in it, written until
 * ENOSPC. Returns its path (malloc'd). */
static char *fill_disk(const char *dir)
{
	char *p = path_join(dir, "filler");
	int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	static char chunk[4096];
	while (write(fd, chunk, sizeof(chunk)) > 0)
		;
	assert_int_equal(errno, ENOSPC);
	while (write(fd, chunk, 1) > 0)   /* the last bytes of a page */
		;
	close(fd);
	return p;
}

static uint64_t save_errors(struct cli *c)
{
	Llamad__Response *s = op_status(c);
	uint64_t n = s->status->counters->save_errors;
	rfree(s);
	return n;
}

/* Log lines holding every one of the strings (NULL ended). */
static int log_lines_with(const struct daemon *d, const char *a, const char *b)
{
	size_t len;
	char *text = slurp(d->log, &len);
	int n = 0;
	for (char *line = text, *nl; line && *line; line = nl ? nl + 1 : NULL) {
		nl = strchr(line, '\n');
		if (nl)
			*nl = 0;
		n += strstr(line, a) && strstr(line, b);
	}
	free(text);
	return n;
}

/*
 * A full disk under a daemon whose pool is full of unsaved sessions: every
 * request that needs blocks tries to evict them, and every idle scan to
 * save them. Failed saves back off (0.1 s doubling to 30 s, per session),
 * so for 10 s of such requests save_errors stays under 20 (before: each
 * request tried each session, hundreds a second, a log line each); once
 * space returns, the sessions are saved without a request.
 */
static void test_save_backoff(void **state)
{
	(void)state;
	char *dir = tiny_fs("full-fs", "size=4m,mode=0700");
	struct daemon d;
	/* s1 and s2 begin alike: each must hold its own blocks here */
	start_daemon(&d, "d6c", T.model, dir, "--prefix-sharing", "off", "--kv-memory", "1M",
		     "--ram-cache", "0",
		     "--save-delay", "1", NULL);
	char *filler = fill_disk(dir);
	struct cli *c = cli_new(&d);
	/* 395 tokens, 394 cached: 25 blocks each, 50 of the pool's 51 */
	make_raw(c, "s1", PROMPT, 390);
	make_raw(c, "s2", PROMPT, 390);
	uint64_t before = save_errors(c);
	/* 10 s of requests that need 3 blocks: each one fails, nothing can
	 * leave the pool */
	double t0 = now_ms();
	int requests = 0;
	while (now_ms() - t0 < 10000) {
		must_open(c, "h", T_RAW, 0, NULL, 1);
		struct gen g;
		generate(c, "h", GREEDY("Once upon a time there was a little girl named Lily. She "
					"loved to play outside in the park with her friends and "
					"her dog.", 1), &g);
		if (g.error != E_EXHAUSTED)
			fail_msg("expected RESOURCE_EXHAUSTED, got %d: %s", g.error, g.msg);
		gen_free(&g);
		must_drop(c, "h");
		requests++;
	}
	uint64_t errors = save_errors(c);
	int lines = log_lines_with(&d, "cannot save session s", "No space left");
	print_message("  %d requests in 10 s on a full disk: save_errors %llu (%llu before them), "
		      "%d log lines\n", requests, (unsigned long long)errors,
		      (unsigned long long)before, lines);
	assert_true(requests > 20);
	assert_true(errors >= 4);        /* it did try again */
	assert_true(errors < 20);
	assert_int_equal(lines, (int)errors);   /* one line a failure */
	assert_true(log_line_has(&d, "cannot save session s1", "automatic saves wait", NULL));

	/* space comes back: saved by the next try, without a request */
	assert_int_equal(unlink(filler), 0);
	double t1 = now_ms();
	int saved = 0;
	while (!saved && now_ms() - t1 < 40000) {
		sleep_us(250 * 1000);
		Llamad__Response *i1 = must_info(c, "s1"), *i2 = must_info(c, "s2");
		saved = i1->session->saved && i2->session->saved;
		rfree(i1);
		rfree(i2);
	}
	print_message("  saved %.1f s after space returned\n", (now_ms() - t1) / 1000);
	assert_true(saved);
	assert_true(log_line_has(&d, "session s1 saved, after", "failed attempt", NULL));
	expect_state_files(dir, "s1", "s2", NULL);
	cli_free(c);
	stop_daemon(&d);
	free(filler);
	free(dir);
}

/* ---- 7. more sessions than the pool holds ------------------------------------ */

#define N_MANY 12
#define MANY_FIRST 180
#define MANY_ROUNDS 3
#define MANY_STEP 10

static const char *const MANY_PROMPTS[N_MANY] = {
	"Once upon a time", "The little dog", "Lily and Ben", "One day, a girl",
	"The sun was hot", "Tom had a red ball", "A big cat", "In the park",
	"Sara liked to sing", "The old man", "There was a bird", "Mom said",
};

struct hist {
	uint32_t ids[512];
	size_t n;
	char text[8192];
};

static void hist_add(struct hist *h, const struct gen *g)
{
	assert_true(h->n + g->n <= 512);
	memcpy(h->ids + h->n, g->toks, g->n * sizeof(uint32_t));
	h->n += g->n;
	assert_true(strlen(h->text) + g->len < sizeof(h->text));
	strcat(h->text, g->text);
}

/* Twelve sessions, then round-robin turns, every other round backwards (so
 * that the session evicted last, the one in host memory, is the next one
 * used); h gets each one's output. With ram_check, the session evicted last
 * before the first backward round must be in host memory. */
static void many_workload(const struct daemon *d, struct hist *h, int ram_check)
{
	struct cli *c = cli_new(d);
	memset(h, 0, N_MANY * sizeof(*h));
	for (int k = 0; k < N_MANY; k++) {
		char name[16];
		snprintf(name, sizeof(name), "m%02d", k);
		must_open(c, name, T_RAW, 0, NULL, 0);
		struct gen g;
		generate_ok(c, name, GREEDY(MANY_PROMPTS[k], MANY_FIRST), &g, 0);
		hist_add(&h[k], &g);
		gen_free(&g);
	}
	for (int r = 0; r < MANY_ROUNDS; r++) {
		if (r == 1 && ram_check) {
			/* three sessions of 14 blocks fill the pool */
			Llamad__Response *i = must_info(c, "m08");
			assert_int_equal(i->session->location, L_RAM);
			rfree(i);
		}
		for (int kk = 0; kk < N_MANY; kk++) {
			int k = r % 2 ? N_MANY - 1 - kk : kk;
			char name[16];
			snprintf(name, sizeof(name), "m%02d", k);
			struct gen g;
			generate_ok(c, name, GREEDY(NULL, MANY_STEP), &g, 0);
			assert_int_equal(g.prompt_tokens, 1);  /* restored with its cache */
			hist_add(&h[k], &g);
			gen_free(&g);
		}
	}
	cli_free(c);
}

static void expect_same_hists(const struct hist *want, const struct hist *got, const char *run)
{
	for (int k = 0; k < N_MANY; k++)
		if (want[k].n != got[k].n || strcmp(want[k].text, got[k].text) ||
		    memcmp(want[k].ids, got[k].ids, want[k].n * sizeof(uint32_t)))
			fail_msg("%s: session m%02d differs from its run in a large pool:\n  \"%s\"\n"
				 "  \"%s\"", run, k, want[k].text, got[k].text);
}

static void test_more_sessions_than_pool(void **state)
{
	(void)state;
	static struct hist ref[N_MANY], got[N_MANY];
	struct daemon d;
	start_daemon(&d, "ref7", T.model, "none", NULL);
	many_workload(&d, ref, 0);
	stop_daemon(&d);

	/* 51 blocks hold three of these sessions (14 blocks each at the end) */
	char *dir = tpath("state7d");
	start_daemon(&d, "d7d", T.model, dir, "--kv-memory", "1M", "--ram-cache", "0", NULL);
	many_workload(&d, got, 0);
	expect_same_hists(ref, got, "ram_cache 0");
	struct cli *c = cli_new(&d);
	Llamad__Response *s = op_status(c);
	Llamad__Counters *k = s->status->counters;
	print_message("  straight to disk: %llu evictions to disk, %llu restores, %llu saves\n",
		      (unsigned long long)k->evictions_disk, (unsigned long long)k->restores,
		      (unsigned long long)k->saves);
	assert_int_equal(s->status->kv_blocks_total, 51);
	assert_true(k->evictions_disk > 0);
	assert_int_equal(k->evictions_ram, 0);
	assert_true(k->restores > 0);
	assert_int_equal(k->save_errors, 0);
	assert_true(s->status->sessions_on_disk > 0);
	rfree(s);
	cli_free(c);
	stop_daemon(&d);
	free(dir);

	/* host memory for one session, then disk */
	dir = tpath("state7r");
	char ram[32];
	snprintf(ram, sizeof(ram), "%d", 15 * BLOCK_BYTES);
	start_daemon(&d, "d7r", T.model, dir, "--kv-memory", "1M", "--ram-cache", ram, NULL);
	many_workload(&d, got, 1);
	expect_same_hists(ref, got, "ram_cache of one session");
	c = cli_new(&d);
	s = op_status(c);
	k = s->status->counters;
	print_message("  through host memory: %llu evictions to RAM, %llu to disk, %llu restores\n",
		      (unsigned long long)k->evictions_ram, (unsigned long long)k->evictions_disk,
		      (unsigned long long)k->restores);
	assert_true(k->evictions_ram > 0);
	assert_true(k->evictions_disk > 0);
	assert_true(k->restores > 0);
	assert_true(s->status->ram_bytes_used <= s->status->ram_bytes_total);
	assert_int_equal(s->status->ram_bytes_total, 15 * BLOCK_BYTES);
	rfree(s);
	cli_free(c);
	stop_daemon(&d);
	free(dir);

	/* no state directory, no host memory: a request that cannot get blocks
	 * fails cleanly and the daemon keeps serving */
	/* "late" begins as "hog": it must not share its blocks here */
	start_daemon(&d, "d7n", T.model, "none", "--prefix-sharing", "off", "--kv-memory", "1M",
		     "--ram-cache", "0", NULL);
	c = cli_new(&d);
	make_raw(c, "hog", PROMPT, 440);          /* 445 tokens: 28 blocks */
	must_open(c, "late", T_RAW, 0, NULL, 0);
	struct gen g;
	generate(c, "late", GREEDY(PROMPT, 440), &g);   /* 23 blocks left */
	assert_int_equal(g.error, E_EXHAUSTED);
	gen_free(&g);
	expect_error(op_save(c, "hog", 0), E_STORAGE, "persistence is off");
	must_drop(c, "late");
	make_raw(c, "after", "The little dog", 50);
	Llamad__Response *i = must_info(c, "hog");
	assert_int_equal(i->session->tokens, 445);
	rfree(i);
	cli_free(c);
	stop_daemon(&d);
}

/* ---- 8. limits ------------------------------------------------------------- */

static void test_limits(void **state)
{
	(void)state;
	char *dir = tpath("state8");
	char *pa = state_file(dir, "a"), *pb = state_file(dir, "b"), *pc = state_file(dir, "c");
	struct daemon d;
	/* the per-user session quota does not bind root (these tests run as
	 * root; tests/integration/fair_share.sh checks it, saved sessions
	 * included, for another uid) */
	start_daemon(&d, "d8", T.model, dir, "--max-sessions-per-uid", "2", NULL);
	struct cli *c = cli_new(&d);
	make_raw(c, "a", PROMPT, 10);
	make_raw(c, "b", "The little dog", 10);
	must_open(c, "x", T_RAW, 0, NULL, 0);
	must_drop(c, "x");
	must_save(c, "a", 0);
	assert_true(exists(pa));
	must_drop(c, "a");
	assert_false(exists(pa));
	make_raw(c, "c", "Lily and Ben", 10);
	cli_free(c);
	stop_daemon(&d);
	expect_state_files(dir, "b", "c", NULL);

	/* dropping a session on disk removes its file for good */
	start_daemon(&d, "d8", T.model, dir, "--max-sessions-per-uid", "2", NULL);
	c = cli_new(&d);
	must_drop(c, "b");
	assert_false(exists(pb));
	cli_free(c);
	stop_daemon(&d);
	start_daemon(&d, "d8", T.model, dir, "--max-sessions-per-uid", "2", NULL);
	c = cli_new(&d);
	Llamad__Response *l = op_list(c);
	assert_int_equal(l->sessions->n_sessions, 1);
	assert_non_null(list_find(l, "c"));
	rfree(l);
	expect_error(op_info(c, "b"), LLAMAD__ERROR_CODE__UNKNOWN_SESSION, NULL);
	cli_free(c);
	stop_daemon(&d);
	expect_state_files(dir, "c", NULL);
	assert_true(exists(pc));
	free(pa);
	free(pb);
	free(pc);
	free(dir);
}

/* ---- transcripts in small frames ------------------------------------------ */

/* A transcript reply never exceeds max_frame: turns that do not fit wait
 * for the next request (next says where), and a single turn larger than a
 * frame comes cut (truncated; no token ids). */
static void test_transcript_frames(void **state)
{
	(void)state;
	struct daemon d;
	start_daemon(&d, "d9", T.model, "none", "--max-frame", "1024", NULL);
	struct cli *c = cli_new(&d);
	/* three turns of 500 bytes: one per frame */
	must_open(c, "paged", T_RAW, 0, NULL, 0);
	static const char line[] = "Once upon a time, there was a little girl named Lily. ";
	char text[501];
	for (int k = 0; k < 3; k++) {
		for (size_t i = 0; i < 500; i++)
			text[i] = line[i % (sizeof(line) - 1)];
		text[0] = (char)('A' + k);
		text[500] = 0;
		rfree(expect_body(op_append(c, "paged", LLAMAD__ROLE__ROLE_RAW, text),
				  LLAMAD__RESPONSE__BODY_SESSION));
	}
	uint32_t from = 0;
	for (int k = 0; k < 3; k++) {
		Llamad__Response *r = expect_body(op_transcript(c, "paged", from, 0, 1),
						  LLAMAD__RESPONSE__BODY_TRANSCRIPT);
		assert_true(protobuf_c_message_get_packed_size(&r->base) + 4 <= 1024);
		const Llamad__Transcript *t = r->transcript;
		assert_int_equal(t->turns, 3);
		assert_int_equal(t->first, from);
		assert_int_equal(t->next, from + 1);
		assert_int_equal(t->n_items, 1);
		const Llamad__Turn *u = t->items[0];
		assert_false(u->truncated);
		assert_int_equal(strlen(u->text), 500);
		assert_int_equal(u->text[0], 'A' + k);
		assert_int_equal(u->n_token_ids, u->tokens);
		from = t->next;
		rfree(r);
	}
	/* an answer longer than a frame: cut, a prefix of what streamed */
	must_open(c, "long", T_RAW, 0, NULL, 0);
	struct gen g;
	generate_ok(c, "long", GREEDY(PROMPT, 480), &g, 0);
	assert_true(g.len > 1100);
	Llamad__Response *r = expect_body(op_transcript(c, "long", 1, 0, 1),
					  LLAMAD__RESPONSE__BODY_TRANSCRIPT);
	assert_true(protobuf_c_message_get_packed_size(&r->base) + 4 <= 1024);
	assert_int_equal(r->transcript->next, 2);
	const Llamad__Turn *u = r->transcript->items[0];
	assert_true(u->truncated);
	assert_int_equal(u->n_token_ids, 0);
	assert_true(strlen(u->text) > 500 && strlen(u->text) < g.len);
	assert_memory_equal(u->text, g.text, strlen(u->text));
	assert_int_equal(u->tokens, 480);
	rfree(r);
	gen_free(&g);
	cli_free(c);
	stop_daemon(&d);
}

/* ListSessions of page `after` (NULL: the first). */
static Llamad__Response *op_list_page(struct cli *c, const char *after)
{
	Llamad__ListSessions ls = LLAMAD__LIST_SESSIONS__INIT;
	ls.after = (char *)after;
	Llamad__Request q = request_of(LLAMAD__REQUEST__OP_LIST);
	q.list = &ls;
	return expect_body(cli_call(c, &q), LLAMAD__RESPONSE__BODY_SESSIONS);
}

/* The session list comes in pages of at most max_frame bytes, by name,
 * each system prompt cut to its first 256 bytes (system_cut; GetInfo has
 * it all); the cursor (next) stays good when sessions go between pages.
 * Before, one reply held every session with its whole system prompt: 70
 * sessions of a 1 MiB system prompt made root's list pass 64 MiB and the
 * daemon closed the connection. */
static void test_list_pages(void **state)
{
	(void)state;
	struct daemon d;
	start_daemon(&d, "d11", T.model, "none", "--max-frame", "4096", NULL);
	struct cli *c = cli_new(&d);
	enum { N = 60 };
	char sys[2001];
	memset(sys, 's', 2000);
	sys[2000] = 0;
	for (int k = 0; k < N; k++) {
		char name[64];
		snprintf(name, sizeof(name), "list-%02d-with-a-name-of-forty-characters", k);
		must_open(c, name, T_LLAMA2, 0, k % 10 == 0 ? sys : NULL, 0);
	}
	int seen[N] = { 0 }, pages = 0, dropped = 0;
	char last[128] = "", *after = NULL;
	do {
		Llamad__Response *r = op_list_page(c, after);
		assert_true(protobuf_c_message_get_packed_size(&r->base) + 4 <= 4096);
		const Llamad__SessionList *l = r->sessions;
		assert_true(l->n_sessions > 0);
		for (size_t i = 0; i < l->n_sessions; i++) {
			const Llamad__SessionInfo *s = l->sessions[i];
			int k = atoi(s->session + 5);
			assert_true(strcmp(s->session, last) > 0);   /* by name, no repeat */
			snprintf(last, sizeof(last), "%s", s->session);
			seen[k]++;
			if (k % 10 == 0) {
				assert_int_equal(strlen(s->system), 256);
				assert_true(s->has_system_cut && s->system_cut);
			} else {
				assert_false(s->system_cut);
			}
		}
		free(after);
		after = l->next ? strdup(l->next) : NULL;
		rfree(r);
		pages++;
		if (pages == 1) {   /* one of the next page's sessions goes */
			must_drop(c, "list-59-with-a-name-of-forty-characters");
			dropped = 1;
		}
	} while (after && pages < 100);
	assert_null(after);
	assert_true(pages >= 3);
	for (int k = 0; k < N; k++)
		assert_int_equal(seen[k], k == 59 && dropped ? 0 : 1);
	print_message("list: %d sessions in %d pages of at most 4096 bytes\n", N - dropped, pages);
	/* GetInfo has the whole system prompt */
	Llamad__Response *i = must_info(c, "list-00-with-a-name-of-forty-characters");
	assert_int_equal(strlen(i->session->system), 2000);
	assert_false(i->session->system_cut);
	rfree(i);
	cli_free(c);
	stop_daemon(&d);
}

/* ---- flow control ------------------------------------------------------- */

/* A connection may have at most 256 requests waiting for their last reply:
 * past that the daemon reads no more of its requests until replies go out
 * (nothing is refused; all are answered). */
static void test_flow_control(void **state)
{
	(void)state;
	struct daemon d;
	/* a slow model (5 ms a pass), so that the first generations outlast
	 * the reading of the pipeline */
	setenv("LLAMAD_TEST_STEP_DELAY_MS", "5", 1);
	start_daemon(&d, "d10", T.model, "none", NULL);
	unsetenv("LLAMAD_TEST_STEP_DELAY_MS");
	struct cli *c = cli_new(&d), *watch = cli_new(&d);
	enum { NS = 5, WAIT = 60 };
	char name[NS][16];
	for (int k = 0; k < NS; k++) {
		snprintf(name[k], sizeof(name[k]), "flow%d", k);
		must_open(c, name[k], T_RAW, 0, NULL, 0);
	}
	Llamad__Response *s0 = op_status(watch);
	uint64_t req0 = s0->status->counters->requests;
	rfree(s0);
	uint64_t ids[NS][WAIT + 1];
	cli_cork(c);
	for (int k = 0; k < NS; k++)
		ids[k][0] = gen_send(c, name[k], GREEDY(PROMPT, 200));
	for (int i = 1; i <= WAIT; i++)
		for (int k = 0; k < NS; k++)
			ids[k][i] = gen_send(c, name[k], GREEDY(NULL, 1));
	cli_uncork(c);
	sleep_ms(150);
	Llamad__Response *s1 = op_status(watch);
	uint64_t taken = s1->status->counters->requests - req0 - 1;  /* less the Status */
	rfree(s1);
	print_message("flow control: %llu of %d pipelined requests read while the first ran\n",
		      (unsigned long long)taken, NS * (WAIT + 1));
	assert_true(taken <= 256);
	assert_true(taken >= 200);
	for (int k = 0; k < NS; k++) {
		for (int i = 0; i <= WAIT; i++) {
			struct gen g = { 0 };
			gen_wait(c, ids[k][i], &g);
			if (g.error || g.generated != (i ? 1u : 200u))
				fail_msg("%s request %d: error %d (%s), %u tokens", name[k], i, g.error,
					 g.msg, g.generated);
			gen_free(&g);
		}
		must_drop(c, name[k]);
	}
	cli_free(watch);
	cli_free(c);
	stop_daemon(&d);

	/* and at most max_frame bytes of them: 30 KiB requests (a Generate
	 * padded with an unknown field) with a 64 KiB max_frame, three read */
	setenv("LLAMAD_TEST_STEP_DELAY_MS", "5", 1);
	start_daemon(&d, "d10b", T.model, "none", "--max-frame", "65536", NULL);
	unsetenv("LLAMAD_TEST_STEP_DELAY_MS");
	c = cli_new(&d);
	watch = cli_new(&d);
	s0 = op_status(watch);
	req0 = s0->status->counters->requests;
	rfree(s0);
	uint64_t big[NS];
	uint8_t *all = NULL;
	size_t all_len = 0, pad = 30 << 10;
	for (int k = 0; k < NS; k++) {
		Llamad__Generate g = LLAMAD__GENERATE__INIT;
		g.session = name[k];
		g.prompt = (char *)PROMPT;
		PB_SET(&g, max_tokens, 100);
		Llamad__Request q = request_of(LLAMAD__REQUEST__OP_GENERATE);
		q.generate = &g;
		PB_SET(&q, id, big[k] = 5000 + (uint64_t)k);
		size_t n = llamad__request__get_packed_size(&q);
		all = realloc(all, all_len + 4 + n + 3 + pad);
		assert_non_null(all);
		uint8_t *f = all + all_len;
		llamad__request__pack(&q, f + 4);
		uint8_t *u = f + 4 + n;   /* field 99, length-delimited, 30 KiB in all */
		size_t body = pad - 2;    /* 30718: a 3-byte varint */
		u[0] = 0x9a;
		u[1] = 0x06;
		u[2] = (uint8_t)(0x80 | (body & 0x7f));
		u[3] = (uint8_t)(0x80 | ((body >> 7) & 0x7f));
		u[4] = (uint8_t)(body >> 14);
		memset(u + 5, 'x', body);
		frame_put_len(f, (uint32_t)(n + 3 + pad));
		all_len += 4 + n + 3 + pad;
	}
	for (int k = 0; k < NS; k++)
		must_open(c, name[k], T_RAW, 0, NULL, 0);
	s0 = op_status(watch);
	req0 = s0->status->counters->requests;
	rfree(s0);
	assert_int_equal(frame_write_all(c->fd, all, all_len), 0);
	free(all);
	sleep_ms(150);
	s1 = op_status(watch);
	taken = s1->status->counters->requests - req0 - 1;
	rfree(s1);
	print_message("flow control: %llu of %d requests of 30 KiB read (max_frame 64 KiB)\n",
		      (unsigned long long)taken, NS);
	assert_int_equal(taken, 3);
	for (int k = 0; k < NS; k++) {
		struct gen g = { 0 };
		gen_wait(c, big[k], &g);
		if (g.error || g.generated != 100)
			fail_msg("padded request %d: error %d (%s), %u tokens", k, g.error, g.msg,
				 g.generated);
		gen_free(&g);
	}
	cli_free(watch);
	cli_free(c);
	stop_daemon(&d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_restart_without_loss, case_setup, case_teardown),
		cmocka_unit_test_setup_teardown(test_idle_save_then_crash, case_setup, case_teardown),
		cmocka_unit_test_setup_teardown(test_kill_during_save, case_setup, case_teardown),
		cmocka_unit_test_setup_teardown(test_bad_files, case_setup, case_teardown),
		cmocka_unit_test_setup_teardown(test_foreign_model, case_setup, case_teardown),
		cmocka_unit_test_setup_teardown(test_full_state_dir, case_setup, case_teardown),
		cmocka_unit_test_setup_teardown(test_full_disk_blocks, case_setup, case_teardown),
		cmocka_unit_test_setup_teardown(test_unusable_state_dir, case_setup, case_teardown),
		cmocka_unit_test_setup_teardown(test_save_backoff, case_setup, case_teardown),
		cmocka_unit_test_setup_teardown(test_more_sessions_than_pool, case_setup,
						case_teardown),
		cmocka_unit_test_setup_teardown(test_limits, case_setup, case_teardown),
		cmocka_unit_test_setup_teardown(test_transcript_frames, case_setup, case_teardown),
		cmocka_unit_test_setup_teardown(test_list_pages, case_setup, case_teardown),
		cmocka_unit_test_setup_teardown(test_flow_control, case_setup, case_teardown),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

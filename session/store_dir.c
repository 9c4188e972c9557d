/*
 * session/store_dir.c — the state folder (store.h): listing its files
 * with their headers, removing one, setting a refused file aside.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "session/store_int.h"
#include "util/file.h"

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
	else if ((got = st_pread_all(fd, hb, sizeof(hb), 0)) < 0)
		snprintf(why, whycap, "cannot read: %s", strerror((int)-got));
	else if (st_hdr_parse(hb, (size_t)got, (uint64_t)st.st_size, &h, why, whycap) == 0)
		rc = 0;
	close(fd);
	if (rc)
		return rc;
	/* The name must be the one store_path gives for its contents, or a save
	 * of that session would write a second file. */
	char want[NAME_MAX + 1];
	st_file_name(want, sizeof(want), (uid_t)h.uid, h.id);
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
		struct dirent *de = file_readdir(d, &rc);
		if (!de)
			break;
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

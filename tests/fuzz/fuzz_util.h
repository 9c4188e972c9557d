/*
 * tests/fuzz/fuzz_util.h — helpers shared by the libFuzzer targets: a
 * private temporary folder (in /dev/shm when there is one) and writing the
 * input bytes to a file in it. Any failure of the harness itself aborts.
 */
#ifndef LLAMAD_FUZZ_UTIL_H
#define LLAMAD_FUZZ_UTIL_H

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *fuzz_dir_;

static int fuzz_rm_(const char *p, const struct stat *st, int flag, struct FTW *f)
{
	(void)st;
	(void)flag;
	(void)f;
	return remove(p), 0;
}

static void fuzz_cleanup_(void)
{
	if (fuzz_dir_)
		nftw(fuzz_dir_, fuzz_rm_, 16, FTW_DEPTH | FTW_PHYS);
	free(fuzz_dir_);
	fuzz_dir_ = NULL;
}

/* A new private folder (one per process), removed with its files at exit.
 * The path is owned by this header. */
static inline char *fuzz_tmpdir(const char *tag)
{
	char t[256];
	if (fuzz_dir_)
		abort();
	const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
	snprintf(t, sizeof(t), "%s/llamad-%s.XXXXXX", base, tag);
	if (!mkdtemp(t))
		abort();
	fuzz_dir_ = strdup(t);
	atexit(fuzz_cleanup_);
	return fuzz_dir_;
}

/* "<dir>/<name>", malloc'd. */
static inline char *fuzz_join(const char *dir, const char *name)
{
	size_t n = strlen(dir) + strlen(name) + 2;
	char *p = malloc(n);
	if (!p)
		abort();
	snprintf(p, n, "%s/%s", dir, name);
	return p;
}

/* Replace the file at path by the n bytes at d. */
static inline void fuzz_write(const char *path, const void *d, size_t n)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0)
		abort();
	const char *p = d;
	while (n) {
		ssize_t w = write(fd, p, n);
		if (w <= 0)
			abort();
		p += w;
		n -= (size_t)w;
	}
	close(fd);
}

/* The shared models folder: $MODELS, else ../shared/models. */
static inline const char *fuzz_models(void)
{
	const char *m = getenv("MODELS");
	return m && *m ? m : "../shared/models";
}

#endif

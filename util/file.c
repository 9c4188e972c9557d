/*
 * util/file.c — see file.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/cause.h"
#include "util/file.h"

/* Read fd to its end into a buffer of hint + 1 bytes at first (the size
 * fstat gave; 0: unknown), grown by doubling up to max + 1. */
static int read_into(int fd, size_t max, size_t hint, char **buf, size_t *len)
{
	size_t cap = (hint < max ? hint : max) + 1, n = 0;
	char *b = malloc(cap);
	if (!b)
		return -ENOMEM;
	for (;;) {
		if (n + 1 == cap) {  /* full: at the end, or grow */
			char c;
			ssize_t r = read(fd, &c, 1);
			if (r < 0 && errno == EINTR)
				continue;
			if (r == 0)
				break;
			if (r < 0 || n >= max) {
				free(b);
				return r < 0 ? -errno : -EFBIG;
			}
			size_t nc = cap < 4096 ? 4096 : cap * 2;
			if (nc > max + 1)
				nc = max + 1;
			char *nb = realloc(b, nc);
			if (!nb) {
				free(b);
				return -ENOMEM;
			}
			b = nb;
			cap = nc;
			b[n++] = c;
			continue;
		}
		ssize_t r = read(fd, b + n, cap - n - 1);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			int e = errno;
			free(b);
			return -e;
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	b[n] = 0;
	*buf = b;
	*len = n;
	return 0;
}

int file_read_fd(int fd, size_t max, char **buf, size_t *len)
{
	return read_into(fd, max, 0, buf, len);
}

int file_read(const char *path, size_t max, char **buf, size_t *len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	struct stat st;
	int rc = 0;
	if (fstat(fd, &st) != 0)
		rc = -errno;
	else if (S_ISDIR(st.st_mode))
		rc = -EISDIR;
	else if (!S_ISREG(st.st_mode))
		rc = -EINVAL;
	else if ((uint64_t)st.st_size > max)
		rc = -EFBIG;
	else
		rc = read_into(fd, max, (size_t)st.st_size, buf, len);
	close(fd);
	return rc;
}

int file_map(const char *path, const uint8_t **data, size_t *len, char **cause)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		cause_set(cause, "%s: cannot open: %s", path, strerror(e));
		return -e;
	}
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		cause_set(cause, "%s: not a regular file", path);
		close(fd);
		return -EINVAL;
	}
	if (st.st_size == 0) {
		cause_set(cause, "%s: empty file", path);
		close(fd);
		return -EINVAL;
	}
	void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	int e = errno;
	close(fd);
	if (p == MAP_FAILED) {
		cause_set(cause, "%s: cannot map: %s", path, strerror(e));
		return -e;
	}
	*data = p;
	*len = (size_t)st.st_size;
	return 0;
}

void file_unmap(const uint8_t *data, size_t len)
{
	if (data)
		munmap((void *)data, len);
}

int file_has_magic(const char *path, const void *magic, size_t len)
{
	char b[16];
	if (len > sizeof b)
		return 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t r = read(fd, b, len);
	close(fd);
	return r == (ssize_t)len && memcmp(b, magic, len) == 0;
}

struct dirent *file_readdir(DIR *d, int *err)
{
	errno = 0;
	struct dirent *de = readdir(d);
	*err = !de && errno ? -errno : 0;
	return de;
}

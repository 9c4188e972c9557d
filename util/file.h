/*
 * util/file.h — reading whole files: into memory (tokenizer files, JSON
 * side files, a client's standard input) or mapped read-only (model files,
 * whose gigabytes are paged in as they are used); and a folder's entries.
 *
 * Errors are negative errno values; only file_map, whose callers name the
 * file to a user, also gives a cause (util/cause.h).
 */
#ifndef LLAMAD_UTIL_FILE_H
#define LLAMAD_UTIL_FILE_H

#include <dirent.h>
#include <stddef.h>
#include <stdint.h>

/* Read fd to its end into *buf (malloc'd, NUL-terminated; the caller frees
 * it), its length in *len. 0, or -EFBIG past max bytes, -ENOMEM, or the
 * read's -errno (EINTR is retried). */
int file_read_fd(int fd, size_t max, char **buf, size_t *len);

/* Read the regular file at path whole, as file_read_fd. 0, or -EISDIR (a
 * folder), -EINVAL (not a regular file), -EFBIG (over max bytes), or the
 * open's or read's -errno. */
int file_read(const char *path, size_t max, char **buf, size_t *len);

/* Map the regular, non-empty file at path read-only and shared: *data and
 * *len on success (file_unmap releases it). On failure a negative errno and
 * *cause "PATH: cannot open: REASON", "PATH: not a regular file", "PATH:
 * empty file" or "PATH: cannot map: REASON". */
int file_map(const char *path, const uint8_t **data, size_t *len, char **cause);
/* Unmap what file_map mapped; accepts NULL. */
void file_unmap(const uint8_t *data, size_t len);

/* 1 if the file at path starts with the len bytes of magic, else 0 (also
 * when it cannot be read). */
int file_has_magic(const char *path, const void *magic, size_t len);

/* The next entry of the folder d, or NULL: at its end (*err 0) or on a
 * read error (*err the -errno; readdir's end and its errors told apart). */
struct dirent *file_readdir(DIR *d, int *err);

#endif

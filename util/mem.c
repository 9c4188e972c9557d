/*
 * util/mem.c — see mem.h.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/mem.h"

/* The number that the file at path starts with (0 on success), or -1 (no
 * file, or not a number: cgroup v2 writes "max" for no limit). */
static int read_u64(const char *path, uint64_t *out)
{
	FILE *f = fopen(path, "re");
	unsigned long long v;
	int ok = f && fscanf(f, "%llu", &v) == 1;
	if (f)
		fclose(f);
	if (ok)
		*out = v;
	return ok ? 0 : -1;
}

/* The least headroom (limit - usage, files lim and use) of the cgroup rel
 * (a path from /proc/self/cgroup, "/..." ) under the hierarchy mounted at
 * root and of its ancestors up to the root: a parent's limit binds its
 * children. Levels that are not visible (a container sees its own cgroup as
 * the root) or have no limit are skipped. UINT64_MAX if none has a limit. */
static uint64_t cg_headroom(const char *root, const char *rel, const char *lim, const char *use)
{
	char cur[PATH_MAX], path[PATH_MAX + 64];
	uint64_t best = UINT64_MAX;
	if (snprintf(cur, sizeof(cur), "%s", rel) >= (int)sizeof(cur))
		return best;
	for (;;) {
		size_t n = strlen(cur);
		while (n > 0 && cur[n - 1] == '/')
			cur[--n] = 0;   /* "/a/b/" -> "/a/b"; "/" -> "" */
		uint64_t l, u;
		snprintf(path, sizeof(path), "%s%s/%s", root, cur, lim);
		if (read_u64(path, &l) == 0) {
			snprintf(path, sizeof(path), "%s%s/%s", root, cur, use);
			if (read_u64(path, &u) == 0 && (l > u ? l - u : 0) < best)
				best = l > u ? l - u : 0;
		}
		char *slash = strrchr(cur, '/');
		if (!slash)
			break;
		*slash = 0;
	}
	return best;
}

/* The headroom of this process's memory cgroups (v2, and v1's memory
 * controller), UINT64_MAX if unknown or unlimited. */
static uint64_t cgroup_headroom(void)
{
	FILE *f = fopen("/proc/self/cgroup", "re");
	char line[PATH_MAX + 64];
	uint64_t best = UINT64_MAX;
	while (f && fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = 0;
		/* "ID:CONTROLLERS:PATH"; v2 is "0::PATH" */
		char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
		if (!c2)
			continue;
		*c2 = 0;
		const char *ctl = c1 + 1, *rel = c2 + 1;
		uint64_t h = UINT64_MAX;
		if (!*ctl) {
			h = cg_headroom("/sys/fs/cgroup", rel, "memory.max", "memory.current");
		} else {
			/* v1: the controller list holds "memory" */
			char list[256];
			snprintf(list, sizeof(list), ",%s,", ctl);
			if (strstr(list, ",memory,"))
				h = cg_headroom("/sys/fs/cgroup/memory", rel, "memory.limit_in_bytes",
						"memory.usage_in_bytes");
		}
		if (h < best)
			best = h;
	}
	if (f)
		fclose(f);
	return best;
}

uint64_t mem_available(int *by_cgroup)
{
	FILE *f = fopen("/proc/meminfo", "re");
	char line[128];
	unsigned long long kb = 0;
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
			break;
	if (f)
		fclose(f);
	uint64_t avail = (uint64_t)kb * 1024;
	if (avail == 0) {   /* kernels before 3.14 */
		long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
		avail = pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : 0;
	}
	uint64_t cg = cgroup_headroom();
	int capped = cg < avail || (avail == 0 && cg != UINT64_MAX);
	if (capped)
		avail = cg;
	if (by_cgroup)
		*by_cgroup = capped;
	return avail;
}

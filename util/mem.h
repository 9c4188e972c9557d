/*
 * util/mem.h — the host memory this process may still take: what the
 * kernel calls available (MemAvailable: free memory plus the caches it can
 * drop), within the limit of the control groups the process runs in (a
 * systemd MemoryMax=, a container's memory limit), which MemAvailable does
 * not see. Read when sizing a default (kv_memory auto, "N%" settings).
 */
#ifndef LLAMAD_UTIL_MEM_H
#define LLAMAD_UTIL_MEM_H

#include <stdint.h>

/* Bytes available to this process now: MemAvailable from /proc/meminfo
 * (else the free physical pages), bounded by the headroom (limit minus
 * usage) of its memory cgroup and each ancestor that has a limit (cgroup
 * v2 memory.max, v1 memory.limit_in_bytes). 0 if unknown. *by_cgroup (may
 * be NULL) is set to 1 when a cgroup's limit is the bound, else 0. */
uint64_t mem_available(int *by_cgroup);

#endif

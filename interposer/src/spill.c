/* Oversubscription (MEMSLICE_OVERSUBSCRIBE=1): allocations past the quota are served from host memory, so
 * the container's HBM use stays within its quota and its neighbours are never squeezed.
 *
 * Mechanism, per route (docs/architecture.md, "Oversubscription", says why and what it costs):
 *  - cuMemAlloc*, pitched and stream-ordered allocations of at least the host granularity (2 MiB): host
 *    memory created by the driver for VMM (cuMemCreate with a HOST location) and mapped into a device address
 *    range of its own (cuMemAddressReserve + cuMemMap + cuMemSetAccess), the handle released at once so the
 *    unmapping frees it. Not one byte of HBM; kernels and the copy engines reach it over the bus at the
 *    link's speed through an ordinary device pointer (MEMORY_TYPE = DEVICE), so no copy, no staging and no
 *    CPU is on its access path. Why not cuMemHostAlloc(DEVICEMAP): on an H100 pinning fresh pages that way
 *    cost more than the copies themselves (a 3 GiB clone through spilled memory ran at 1.2 GiB/s against
 *    51 GB/s of zero-copy streaming), while VMM host allocations (elastic's moves) ran at ~23 GB/s
 *    allocation included; and a copy between two such host pointers is a host-to-host copy. Smaller
 *    allocations (and drivers without host VMM locations) keep mapped pinned host memory (cuMemHostAlloc with
 *    DEVICEMAP | PORTABLE): a page pinned costs little, and rounding them to 2 MiB would waste host memory.
 *    The simulated driver counts pins, host creations and copies (memsliceSimCounters), so the tests see
 *    which path served an allocation.
 *  - cuMemAllocManaged: managed memory advised to live on the CPU (PREFERRED_LOCATION = CPU) and mapped for
 *    the GPU (ACCESSED_BY), so pages are accessed remotely instead of migrating into HBM. The caller asked
 *    for managed memory and keeps its semantics (IS_MANAGED = 1).
 *  - cuMemCreate: the same allocation with a host location, mapped into the caller's VA range as usual.
 * Host bytes are charged on the region's host counter, capped by MEMSLICE_HOST_SPILL_LIMIT, and refused
 * when they would eat into the last margin of the container's memory cgroup (pinned pages count there and
 * cannot be swapped: running out means an OOM kill, which is worse than CUDA_ERROR_OUT_OF_MEMORY).
 * Never during stream capture (hooks_pool.c asks): freeing a spilled block needs a synchronize, which would
 * break the graph. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ms_size.h"
#include "shim.h"

/* ---- host memory headroom ("host memory is finite") -------------------------------------------------------
 * Pinned host pages are charged to the memory cgroup of the process that allocates them, and cannot be
 * swapped: a spill or an elastic move that overruns the cgroup ends in an OOM kill, worse than
 * CUDA_ERROR_OUT_OF_MEMORY. So before taking n bytes to host memory, this process checks its own cgroup
 * (with a margin) and the host's MemAvailable (with a slack). Every file is read with one bounded read into
 * a fixed buffer (never mapped); a value that is not a plain decimal number reads as unknown: no limit. */

/* A plain decimal number (optionally followed by a newline) in buf: 0, or -1 for anything else ('-', junk,
 * an overflow). "max" is unlimited. */
static int parse_u64(const char *buf, uint64_t *out) {
    if (strncmp(buf, "max", 3) == 0 && (buf[3] == 0 || buf[3] == '\n')) { *out = UINT64_MAX; return 0; }
    uint64_t v = 0;
    const char *p = buf;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > (UINT64_MAX - 9) / 10) return -1;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    if (p == buf || (*p && *p != '\n')) return -1;
    *out = v;
    return 0;
}

/* One bounded read of a short file at offset 0 into buf (NUL-terminated). Bytes read, or -1. */
static ssize_t read_small(int fd, char *buf, size_t cap) {
    ssize_t n = pread(fd, buf, cap - 1, 0);
    if (n < 0) return -1;
    buf[n] = 0;
    return n;
}

/* A cgroup file's number (see parse_u64). */
static int read_u64(const char *dir, const char *name, uint64_t *out) {
    char path[512], buf[64];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path) return -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return -1;
    ssize_t n = read_small(fd, buf, sizeof buf);
    close(fd);
    return n > 0 ? parse_u64(buf, out) : -1;
}

/* The cgroup directory of this process: MEMSLICE_CGROUP_DIR, else from /proc/self/cgroup (v2, then v1). */
static int cgroup_dir(char *out, size_t len, int *v1) {
    *v1 = 0;
    if (g_cfg.cgroup_dir[0]) {
        char probe[300];
        snprintf(probe, sizeof probe, "%s/memory.max", g_cfg.cgroup_dir);
        *v1 = access(probe, R_OK) != 0;
        snprintf(out, len, "%s", g_cfg.cgroup_dir);
        return 0;
    }
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (!f) return -1;
    char line[400];
    int found = -1;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (strncmp(line, "0::", 3) == 0 && found < 0) {
            if (snprintf(out, len, "/sys/fs/cgroup%s", line + 3) < (int)len) found = 0;
        } else if (strstr(line, ":memory:")) {
            if (snprintf(out, len, "/sys/fs/cgroup/memory%s", strstr(line, ":memory:") + 8) >= (int)len) continue;
            *v1 = 1;
            found = 0;
            break;
        }
    }
    fclose(f);
    return found;
}

/* The cgroup's files, resolved once. memory.current is kept open and re-read with one pread per check;
 * memory.max changes rarely (a resize) and is re-read at most once a second. */
static struct {
    pthread_mutex_t mu;
    int resolved, usable, v1, fd_current;
    char dir[256];
    uint64_t max, max_read_ns;
} g_cg = {.mu = PTHREAD_MUTEX_INITIALIZER, .fd_current = -1};

static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Current usage and limit of the memory cgroup. 0 on success, -1 if there is none to respect (no cgroup,
 * or a file that does not read as a number: unknown is no limit). Caller holds g_cg.mu. */
static int cgroup_usage(uint64_t *cur, uint64_t *max) {
    if (!g_cg.resolved) {
        g_cg.resolved = 1;
        if (cgroup_dir(g_cg.dir, sizeof g_cg.dir, &g_cg.v1) == 0) {
            char path[300];
            snprintf(path, sizeof path, "%s/%s", g_cg.dir, g_cg.v1 ? "memory.usage_in_bytes" : "memory.current");
            g_cg.fd_current = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
            g_cg.usable = g_cg.fd_current >= 0;
        }
    }
    if (!g_cg.usable) return -1;
    uint64_t now = mono_ns();
    if (!g_cg.max_read_ns || now - g_cg.max_read_ns > 1000000000ull) {
        if (read_u64(g_cg.dir, g_cg.v1 ? "memory.limit_in_bytes" : "memory.max", &g_cg.max) < 0) return -1;
        g_cg.max_read_ns = now;
    }
    char buf[64];
    if (read_small(g_cg.fd_current, buf, sizeof buf) <= 0 || parse_u64(buf, cur) < 0 || *cur == UINT64_MAX) return -1;
    *max = g_cg.max;
    return 0;
}

/* The meminfo file: /proc/meminfo; under the simulated GPU only (its driver exports memsliceSimCounters),
 * MEMSLICE_SIM_MEMINFO may name another, so tests can model a host short of memory. A tenant that sets it
 * on a real GPU changes nothing; on the simulator it changes only its own process's checks. */
static const char *meminfo_path(void) {
    static const char *path;
    if (!path) {
        const char *sim = real_cuda("memsliceSimCounters") ? getenv("MEMSLICE_SIM_MEMINFO") : NULL;
        path = sim && *sim ? sim : "/proc/meminfo";
    }
    return path;
}

/* One "Name:   N kB" line of meminfo, in bytes; -1 if absent or not a number. */
static int meminfo_field(const char *buf, const char *name, uint64_t *out) {
    size_t nl = strlen(name);
    for (const char *p = buf; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncmp(p, name, nl) != 0 || p[nl] != ':') continue;
        const char *q = p + nl + 1;
        while (*q == ' ' || *q == '\t') q++;
        uint64_t v = 0;
        const char *d = q;
        for (; *q >= '0' && *q <= '9'; q++) {
            if (v > (UINT64_MAX >> 12)) return -1;
            v = v * 10 + (uint64_t)(*q - '0');
        }
        if (q == d || strncmp(q, " kB", 3) != 0) return -1;
        *out = v << 10;
        return 0;
    }
    return -1;
}

/* The host's MemTotal and MemAvailable: one bounded read of meminfo (about 1.5 KiB). -1 if unknown. */
static int host_memory(uint64_t *total, uint64_t *avail) {
    char buf[8192];
    int fd = open(meminfo_path(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return -1;
    ssize_t n = read_small(fd, buf, sizeof buf);
    close(fd);
    if (n <= 0 || meminfo_field(buf, "MemTotal", total) < 0 || meminfo_field(buf, "MemAvailable", avail) < 0)
        return -1;
    return *avail <= *total ? 0 : -1;
}

/* What the host keeps available after a move (pure): 1/32 of its memory, at least 256 MiB, at most 2 GiB. */
static uint64_t host_slack(uint64_t total) {
    uint64_t s = total / 32;
    return s < (256ull << 20) ? 256ull << 20 : s > (2ull << 30) ? 2ull << 30 : s;
}

/* What the cgroup keeps free after a move (pure): MEMSLICE_CGROUP_MARGIN, else 10% of memory.max, at least
 * 256 MiB. */
static uint64_t cgroup_margin(uint64_t max) {
    if (g_cfg.cgroup_margin) return g_cfg.cgroup_margin;
    return max / 10 < (256ull << 20) ? 256ull << 20 : max / 10;
}

/* Whether n more bytes of pinned host memory fit: the cgroup first (its margin kept), then the host (its
 * slack kept). HOST_ROOM_OK, or the cause with its figures in *v. */
int host_room(uint64_t n, struct host_verdict *v) {
    uint64_t max, cur, total, avail;
    memset(v, 0, sizeof *v);
    pthread_mutex_lock(&g_cg.mu);
    int rc = cgroup_usage(&cur, &max);
    snprintf(v->where, sizeof v->where, "%s", g_cg.dir);
    pthread_mutex_unlock(&g_cg.mu);
    if (rc == 0 && max < (1ull << 62)) { /* huge or "max": unlimited */
        v->margin = cgroup_margin(max);
        if (cur > max || n > max || max - cur < n || max - cur - n < v->margin) {
            v->limit = max;
            v->used = cur;
            return v->cause = HOST_ROOM_CGROUP;
        }
    }
    if (host_memory(&total, &avail) == 0) {
        v->margin = host_slack(total);
        if (avail < n || avail - n < v->margin) {
            v->limit = total;
            v->used = total - avail;
            snprintf(v->where, sizeof v->where, "%s", meminfo_path());
            return v->cause = HOST_ROOM_HOST;
        }
    }
    return HOST_ROOM_OK;
}

/* The verdict in words, for a log line: "its memory cgroup (DIR): memory.max X, memory.current Y" or "host
 * memory: MemAvailable X of MemTotal Y". */
const char *host_room_text(const struct host_verdict *v, char *out, size_t len) {
    char a[32], b[32], c[32];
    if (v->cause == HOST_ROOM_CGROUP)
        snprintf(out, len, "memory cgroup %.200s: memory.max %s, memory.current %s, keeping %s free",
                 v->where, fmt_bytes(v->limit, a, sizeof a), fmt_bytes(v->used, b, sizeof b),
                 fmt_bytes(v->margin, c, sizeof c));
    else
        snprintf(out, len, "host memory: MemAvailable %s of MemTotal %s, keeping %s available",
                 fmt_bytes(v->limit - v->used, a, sizeof a), fmt_bytes(v->limit, b, sizeof b),
                 fmt_bytes(v->margin, c, sizeof c));
    return out;
}

/* 1 if n more bytes of pinned host memory leave the cgroup its margin and the host its slack; else 0 and
 * why. */
static int cgroup_allows(uint64_t n, char *why, size_t len) {
    struct host_verdict v;
    if (host_room(n, &v) == HOST_ROOM_OK) return 1;
    char a[32], b[32], t[400];
    snprintf(why, len, "spilling %s to host memory would leave less than %s %s (%s); refused to avoid an OOM "
             "kill: %s", fmt_bytes(n, a, sizeof a), fmt_bytes(v.margin, b, sizeof b),
             v.cause == HOST_ROOM_CGROUP ? "free in the container's memory cgroup" : "available on the host",
             host_room_text(&v, t, sizeof t),
             v.cause == HOST_ROOM_CGROUP ? "raise the pod's memory limit, or lower the GPU working set"
                                         : "the node is short of memory; lower the GPU working set");
    return 0;
}

/* ---- spilling ----------------------------------------------------------------------------------------- */
/* Charge n host bytes: the host's own memory first (the cgroup's margin, the host's slack), then the spill cap
 * (quota.c). 0, or -1 with the refusal counted and said. */
static int charge_host(int dev, uint64_t n, const char *call) {
    char why[768];
    return quota_charge_host(dev, n, call, cgroup_allows(n, why, sizeof why) ? NULL : why);
}

static int g_mapped_off; /* 1 once the driver has said it cannot map host memory: the pinned path only */

/* The size unit of host-located VMM allocations (cuMemGetAllocationGranularity, MINIMUM), read once; 0 when
 * the driver has no host VMM locations (then everything takes the pinned path). */
static uint64_t host_granularity(void) {
    static uint64_t g = UINT64_MAX;
    if (g != UINT64_MAX) return g;
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_HOST;
    size_t gran = 0;
    __auto_type get = REAL(cuMemGetAllocationGranularity);
    if (!get || get(&gran, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || gran == 0 || (gran & (gran - 1)))
        gran = 0;
    g = gran;
    return g;
}

/* Host memory for n bytes (a multiple of the granularity) mapped read-write for `ordinal` at a device address
 * range of its own; the handle is released once mapped, so cuMemUnmap frees the memory. */
static CUresult map_host(CUdeviceptr *va, uint64_t n, CUdevice ordinal) {
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_HOST; /* its id is ignored (cuda.h) */
    CUmemGenericAllocationHandle h;
    CUresult rc = REAL(cuMemCreate)(&h, n, &p, 0);
    if (rc != CUDA_SUCCESS) return rc;
    CUdeviceptr d = 0;
    if ((rc = REAL(cuMemAddressReserve)(&d, n, 0, 0, 0)) != CUDA_SUCCESS) {
        REAL(cuMemRelease)(h);
        return rc;
    }
    if ((rc = REAL(cuMemMap)(d, n, 0, h, 0)) == CUDA_SUCCESS) {
        CUmemAccessDesc a;
        memset(&a, 0, sizeof a);
        a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        a.location.id = ordinal;
        a.flags = 3; /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE */
        if ((rc = REAL(cuMemSetAccess)(d, n, &a, 1)) != CUDA_SUCCESS) REAL(cuMemUnmap)(d, n);
    }
    REAL(cuMemRelease)(h); /* the mapping keeps the memory alive; on failure this frees it */
    if (rc != CUDA_SUCCESS) REAL(cuMemAddressFree)(d, n);
    else *va = d;
    return rc;
}

/* The mapped path: `size` bytes (a multiple of the granularity) of host memory at device addresses.
 * CUDA_ERROR_NOT_SUPPORTED when the driver cannot create host memory this way (the caller falls back to the
 * pinned path). */
static CUresult spill_mapped(CUdeviceptr *dptr, uint64_t size, CUdevice ordinal, const char *call) {
    CUresult rc = map_host(dptr, size, ordinal);
    if (rc == CUDA_SUCCESS || rc == CUDA_ERROR_OUT_OF_MEMORY) return rc;
    if (rc == CUDA_ERROR_NOT_SUPPORTED && !__atomic_exchange_n(&g_mapped_off, 1, __ATOMIC_RELAXED))
        shim_log(LOG_INFO, "memslice: %s: the driver cannot map host memory at device addresses; spilled "
                 "memory is pinned host memory from now on (slower to allocate)", call);
    return CUDA_ERROR_NOT_SUPPORTED; /* this allocation tries the pinned path */
}

/* The pinned path: mapped pinned host memory of exactly n bytes (small allocations, old drivers), its host
 * pointer in *host. CUDA_SUCCESS or CUDA_ERROR_OUT_OF_MEMORY. */
static CUresult spill_pinned(CUdeviceptr *dptr, void **host, uint64_t n) {
    __auto_type host_alloc = REAL(cuMemHostAlloc);
    __auto_type devptr = REAL(cuMemHostGetDevicePointer_v2);
    __auto_type free_host = REAL(cuMemFreeHost);
    if (!host_alloc || !devptr || !free_host ||
        host_alloc(host, n, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE) != CUDA_SUCCESS)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (devptr(dptr, *host, 0) == CUDA_SUCCESS) return CUDA_SUCCESS;
    free_host(*host);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* Give back a spilled block of either path that could not be recorded. */
static void spill_undo(CUdeviceptr d, uint64_t size, void *host) {
    if (host) {
        REAL(cuMemFreeHost)(host);
    } else {
        REAL(cuMemUnmap)(d, size);
        REAL(cuMemAddressFree)(d, size);
    }
}

/* An allocation past the quota, served from host memory: mapped into device addresses when it is at least
 * the host granularity and the driver can, else pinned. The host bytes are charged once, for the mapped
 * size (the pinned path gives the rounding back), and recorded once. */
CUresult spill_alloc(CUdeviceptr *dptr, uint64_t n, int dev, CUdevice ordinal, const char *call) {
    uint64_t gran = n && !__atomic_load_n(&g_mapped_off, __ATOMIC_RELAXED) ? host_granularity() : 0;
    /* sizes past 2^62 (which no host has) go the pinned way, where the cap refuses them: rounding them up
     * would wrap around */
    int mapped = gran && n >= gran && n <= (1ull << 62);
    uint64_t size = mapped ? (n + gran - 1) & ~(gran - 1) : n;
    if (charge_host(dev, size, call) < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUdeviceptr d = 0;
    void *host = NULL;
    CUresult rc = mapped ? spill_mapped(&d, size, ordinal, call) : CUDA_ERROR_NOT_SUPPORTED;
    if (rc == CUDA_ERROR_NOT_SUPPORTED) {
        quota_uncharge_host(dev, size - n);
        size = n;
        rc = spill_pinned(&d, &host, n);
    }
    enum alloc_kind kind = host ? A_SPILL_HOST : A_SPILL_MAPPED;
    if (rc == CUDA_SUCCESS && track(d, size, dev, kind, (uint64_t)(uintptr_t)host) < 0) {
        spill_undo(d, size, host);
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (rc != CUDA_SUCCESS) {
        quota_uncharge_host(dev, size);
        return rc;
    }
    *dptr = d;
    if (g_cfg.log_level >= LOG_DEBUG) {
        char a[32];
        shim_log(LOG_DEBUG, "memslice: %s: %s served from host memory", call, fmt_bytes(n, a, sizeof a));
    }
    return CUDA_SUCCESS;
}

CUresult spill_alloc_managed(CUdeviceptr *dptr, uint64_t n, unsigned int flags, int dev, CUdevice ordinal,
                             const char *call) {
    if (charge_host(dev, n, call) < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    __auto_type alloc = REAL(cuMemAllocManaged);
    __auto_type advise2 = REAL(cuMemAdvise_v2);
    __auto_type advise1 = REAL(cuMemAdvise);
    CUdeviceptr p;
    CUresult rc = alloc(&p, n, flags);
    if (rc != CUDA_SUCCESS) {
        quota_uncharge_host(dev, n);
        return rc;
    }
    /* 3 = SET_PREFERRED_LOCATION, 5 = SET_ACCESSED_BY; -1 = CU_DEVICE_CPU for the old signature */
    CUmemLocation cpu = {CU_MEM_LOCATION_TYPE_HOST, 0}, gpu = {CU_MEM_LOCATION_TYPE_DEVICE, ordinal};
    rc = advise2 ? advise2(p, n, 3, cpu) : advise1 ? advise1(p, n, 3, -1) : CUDA_ERROR_NOT_SUPPORTED;
    if (rc == CUDA_SUCCESS) {
        if (advise2) advise2(p, n, 5, gpu);
        else advise1(p, n, 5, ordinal);
    }
    if (rc != CUDA_SUCCESS || track(p, n, dev, A_SPILL_MANAGED, 0) < 0) {
        REAL(cuMemFree_v2)(p);
        quota_uncharge_host(dev, n);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *dptr = p;
    return CUDA_SUCCESS;
}

/* A spilled VMM allocation: the same cuMemCreate with a host location. */
CUresult spill_vmm(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                   unsigned long long flags, int dev, const char *call) {
    if (prop->requestedHandleTypes) {
        quota_refuse(dev, size, call);
        shim_log(LOG_WARN, "memslice: %s: not spilled to host memory because shareable handles were requested "
                 "(host allocations cannot be exported)", call);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (charge_host(dev, size, call) < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUmemAllocationProp host = *prop;
    host.location.type = CU_MEM_LOCATION_TYPE_HOST;
    host.location.id = 0;
    CUresult rc = REAL(cuMemCreate)(h, size, &host, flags);
    if (rc != CUDA_SUCCESS) quota_uncharge_host(dev, size);
    return rc;
}

/* Free a spilled allocation of any kind. cuMemFree waits for the device; so does the mapped path before it
 * unmaps (an asynchronous free waits for its stream only). */
CUresult spill_free(const ms_rec *r, CUstream stream, int async) {
    if (async) { /* the stream may still use it: let it finish first (never captured: see hooks_pool.c) */
        __auto_type sync = REAL(cuStreamSynchronize);
        if (sync) sync(stream);
    } else if (r->kind == A_SPILL_MAPPED) {
        REAL(cuCtxSynchronize)();
    }
    CUresult rc;
    if (r->kind == A_SPILL_HOST) rc = REAL(cuMemFreeHost)((void *)(uintptr_t)r->aux);
    else if (r->kind == A_SPILL_MAPPED) {
        if ((rc = REAL(cuMemUnmap)(r->key, r->size)) == CUDA_SUCCESS) REAL(cuMemAddressFree)(r->key, r->size);
    } else rc = REAL(cuMemFree_v2)(r->key);
    if (rc == CUDA_SUCCESS) quota_uncharge_host(r->dev, r->size);
    else track(r->key, r->size, r->dev, (enum alloc_kind)r->kind, r->aux);
    return rc;
}

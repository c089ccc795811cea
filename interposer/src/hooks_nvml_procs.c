/* NVML process lists seen from a container: only the container's own processes, under the PIDs the
 * container knows them by.
 *
 * The driver reports every process on the GPU with its PID in the initial (host) PID namespace. A container
 * has its own namespace, so those PIDs mean nothing there — or, worse, name an unrelated process of the
 * container — and they reveal other tenants' processes and usage. The shim asks the driver, keeps the entries
 * whose host PID is the host_pid of a live slot of this container's region, rewrites each to the slot's pid
 * (the container's view), and answers with NVML's own count/INSUFFICIENT_SIZE rules.
 *
 * How host PIDs are learnt: each process records its own at slot claim (region.c, outer_pid): getpid() in the
 * initial namespace, or the first NSpid entry when its /proc belongs to an outer namespace. A container with
 * its own /proc cannot see its host PID; its slots keep host_pid 0 and its list is empty (what nvidia-smi shows
 * in a container today) until the node agent, which can see host PIDs (F_GETLK on a slot's liveness lock
 * answers the owner's PID in the asker's namespace), fills them — see docs/architecture.md.
 * This is a view, not a security boundary: a process can call the driver without the shim. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "shim.h"

#define MAX_PROCS 65536u /* bound on what the driver may ask us to buffer */

typedef nvmlReturn_t (*list_fn)(nvmlDevice_t, unsigned int *, void *);

/* The container's pid of the process the driver calls host_pid, or 0 if it is not one of ours. */
static unsigned int container_pid(unsigned int host_pid) {
    if (host_pid == 0) return 0;
    struct ms_region *r = g_region.r;
    uint32_t hwm = __atomic_load_n(&r->hdr.slot_hwm, __ATOMIC_ACQUIRE);
    if (hwm > MS_MAX_SLOTS) hwm = MS_MAX_SLOTS;
    for (uint32_t i = 0; i < hwm; i++) {
        struct ms_slot *s = &r->slot[i];
        if (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != MS_SLOT_LIVE) continue;
        if ((unsigned int)__atomic_load_n(&s->host_pid, __ATOMIC_RELAXED) != host_pid) continue;
        int32_t pid = __atomic_load_n(&s->pid, __ATOMIC_RELAXED);
        if (pid > 0) return (unsigned int)pid;
    }
    return 0;
}

/* The driver's whole list into a buffer of ours (grown as the driver asks, within MAX_PROCS). */
static nvmlReturn_t fetch(list_fn real, nvmlDevice_t d, size_t esz, char **out, unsigned int *n) {
    unsigned int cap = 64;
    for (int tries = 0; tries < 4; tries++) {
        char *buf = calloc(cap, esz);
        if (!buf) return NVML_ERROR_UNKNOWN;
        unsigned int got = cap;
        nvmlReturn_t rc = real(d, &got, buf);
        if (rc == NVML_SUCCESS) { *out = buf; *n = got; return rc; }
        free(buf);
        if (rc != NVML_ERROR_INSUFFICIENT_SIZE || got <= cap || got > MAX_PROCS) return rc;
        cap = got + 16; /* processes may start between the two calls */
    }
    return NVML_ERROR_INSUFFICIENT_SIZE;
}

/* Filter one list call: entries of esz bytes, the pid in the first 4 bytes (both NVML layouts). */
static nvmlReturn_t own_processes(list_fn real, nvmlDevice_t d, unsigned int *count, void *infos, size_t esz) {
    if (!real) return NVML_ERROR_FUNCTION_NOT_FOUND;
    if (!g_have_region || !count) return real(d, count, infos);
    char *buf = NULL;
    unsigned int n = 0, keep = 0;
    nvmlReturn_t rc = fetch(real, d, esz, &buf, &n);
    if (rc != NVML_SUCCESS) return rc;
    for (unsigned int i = 0; i < n; i++) {
        unsigned int host, mine;
        memcpy(&host, buf + (size_t)i * esz, sizeof host);
        if (!(mine = container_pid(host))) continue;
        memmove(buf + (size_t)keep * esz, buf + (size_t)i * esz, esz);
        memcpy(buf + (size_t)keep * esz, &mine, sizeof mine);
        keep++;
    }
    if (!infos || *count < keep) {
        rc = keep ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    } else {
        memcpy(infos, buf, (size_t)keep * esz);
    }
    *count = keep;
    free(buf);
    return rc;
}

/* Each hook has its exact prototype (cuda_api.h); the filter takes the entries as bytes of the entry's size.
 * The driver's function is called through list_fn, which differs only in the entry pointer's type. */
#define V1 nvmlProcessInfo_v1_t
#define V2 nvmlProcessInfo_t
#define LIST_HOOK(name, T)                                                                           \
    HOOK nvmlReturn_t DECLDIR name(nvmlDevice_t d, unsigned int *count, T *infos) {                 \
        NVML_PROLOGUE();                                                                              \
        return own_processes((list_fn)(void *)REAL_NVML(name), d, count, infos, sizeof(T));          \
    }

#define NVML_PROLOGUE()                                                                               \
    do {                                                                                              \
        ensure_init();                                                                                \
        if (UNLIKELY(g_cfg.mode == MODE_FAIL_CLOSED)) return NVML_ERROR_NO_PERMISSION;               \
    } while (0)

LIST_HOOK(nvmlDeviceGetComputeRunningProcesses, V1)
LIST_HOOK(nvmlDeviceGetComputeRunningProcesses_v2, V2)
LIST_HOOK(nvmlDeviceGetComputeRunningProcesses_v3, V2)
LIST_HOOK(nvmlDeviceGetGraphicsRunningProcesses, V1)
LIST_HOOK(nvmlDeviceGetGraphicsRunningProcesses_v2, V2)
LIST_HOOK(nvmlDeviceGetGraphicsRunningProcesses_v3, V2)
LIST_HOOK(nvmlDeviceGetMPSComputeRunningProcesses, V1)
LIST_HOOK(nvmlDeviceGetMPSComputeRunningProcesses_v2, V2)
LIST_HOOK(nvmlDeviceGetMPSComputeRunningProcesses_v3, V2)

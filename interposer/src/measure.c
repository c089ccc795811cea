/* Memory the driver takes outside allocation calls: contexts, context limits (the stack of every resident
 * thread), module and library globals. No argument says how much these take, so the shim measures it
 * around the call, the best way it can:
 *   1. NVML's per-process figure for this process (nvmlDeviceGetComputeRunningProcesses under its host pid):
 *      exact whatever other tenants do; what this process's other threads allocated meanwhile is taken out
 *      (their own charges over the same window), and what that leaves out is caught by the reconciliation
 *      that follows at once. The driver's free memory is read over the same window, less what NVML shows
 *      every other process gaining meanwhile, and the larger of the two figures is charged (an NVML that
 *      under-reports cannot lower a charge; a neighbour allocating meanwhile cannot raise it). NVML and the
 *      driver are the node's own libraries (nvml_path, cuda_path in the limits file: real.c), never a tenant's copy;
 *   2. NVML's free memory of the device, then cuMemGetInfo's (a context of that device current): other
 *      tenants' concurrent allocations make it larger (safe), their frees smaller, which is why a context
 *      measured this way is never charged below the last exact measurement (or MEMSLICE_CONTEXT_RESERVE);
 *   3. nothing readable: contexts are charged MEMSLICE_CONTEXT_RESERVE, the rest what NVML shows later.
 * Measured calls of one process are serialised (a process-wide mutex: they are rare and slow anyway). After
 * each, what NVML shows for the process is reconciled with what it has charged: memory the driver holds for
 * it that no call explains (cudart's own module registration, graphs) is charged too, so that NVML's
 * per-process figure never passes the quota for long. Each record of a measured charge is kept by handle
 * and given back when the handle is (module unloaded, context destroyed). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shim.h"

#ifndef NVML_VALUE_NOT_AVAILABLE
#define NVML_VALUE_NOT_AVAILABLE (~0ULL) /* nvml.h: a per-process figure NVML cannot give */
#endif

static pthread_mutex_t g_measure_mu = PTHREAD_MUTEX_INITIALIZER;
static ms_ptrmap g_taken;                      /* key: handle | kind << 56 -> bytes charged for it */
static uint64_t g_unexplained[MS_MAX_DEVICES]; /* charged by reconciliation (under g_measure_mu) */

/* A forked child holds none of its parent's measured memory (its driver state is its own). */
void measure_after_fork(void) {
    pthread_mutex_init(&g_measure_mu, NULL);
    memset(g_unexplained, 0, sizeof g_unexplained);
}

/* NVML started once for the shim's own readings; 0 when it cannot be. */
static int nvml_ready(void) {
    static int state; /* 0 unknown, 1 ready, -1 unusable */
    int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (s) return s > 0;
    __auto_type init = REAL_NVML(nvmlInit_v2);
    s = init && init() == NVML_SUCCESS ? 1 : -1;
    __atomic_store_n(&state, s, __ATOMIC_RELEASE);
    return s > 0;
}

/* The NVML handle of CUDA ordinal `ord` (by UUID: NVML's order need not be CUDA's), or NULL. */
static nvmlDevice_t nvml_device(CUdevice ord) {
    char uuid[MS_UUID_LEN];
    __auto_type by_uuid = REAL_NVML(nvmlDeviceGetHandleByUUID);
    nvmlDevice_t h = NULL;
    if (!nvml_ready() || !by_uuid || uuid_text(ord, uuid, sizeof uuid) < 0) return NULL;
    return by_uuid(uuid, &h) == NVML_SUCCESS ? h : NULL;
}

/* This process's pid as NVML reports it (cached per pid: a fork changes it), else what the node agent
 * wrote into the slot (it can see host PIDs when the container cannot), 0 when unknown. */
static uint32_t host_pid(void) {
    static int32_t for_pid, cached;
    int32_t me = (int32_t)getpid();
    if (__atomic_load_n(&for_pid, __ATOMIC_ACQUIRE) != me) {
        __atomic_store_n(&cached, region_host_pid(), __ATOMIC_RELAXED);
        __atomic_store_n(&for_pid, me, __ATOMIC_RELEASE);
    }
    int32_t v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (v <= 0 && g_region.slot >= 0) v = __atomic_load_n(&g_region.r->slot[g_region.slot].host_pid, __ATOMIC_RELAXED);
    return v > 0 ? (uint32_t)v : 0;
}

/* What NVML shows this process using on h, and every other process together (*others): 0 listed-or-absent
 * reads, -1 if the list cannot be read. A figure NVML cannot give (NVML_VALUE_NOT_AVAILABLE) counts 0. */
static int nvml_process_used(nvmlDevice_t h, uint32_t pid, uint64_t *out, uint64_t *others) {
    __auto_type list = REAL_NVML(nvmlDeviceGetComputeRunningProcesses_v3);
    nvmlProcessInfo_t small[64], *p = small;
    unsigned int n = 64;
    if (!list || !pid) return -1;
    nvmlReturn_t rc = list(h, &n, p);
    if (rc == NVML_ERROR_INSUFFICIENT_SIZE && n <= MS_MAX_SLOTS) {
        n += 16;
        if (!(p = calloc(n, sizeof *p))) return -1;
        rc = list(h, &n, p);
    }
    *out = *others = 0;
    for (unsigned i = 0; rc == NVML_SUCCESS && i < n; i++) {
        uint64_t used = p[i].usedGpuMemory == NVML_VALUE_NOT_AVAILABLE ? 0 : p[i].usedGpuMemory;
        *(p[i].pid == pid ? out : others) += used;
    }
    if (p != small) free(p);
    return rc == NVML_SUCCESS ? 0 : -1;
}

/* Free memory of the device by NVML (no context needed), or by the driver with a context of it current. */
static int free_memory(struct measure *m, int how, uint64_t *out) {
    if (how == M_NVML_FREE) {
        __auto_type info = REAL_NVML(nvmlDeviceGetMemoryInfo);
        nvmlMemory_t mem;
        if (!m->nvml || !info || info(m->nvml, &mem) != NVML_SUCCESS) return -1;
        *out = mem.free;
        return 0;
    }
    CUdevice cur;
    size_t f = 0, t = 0;
    __auto_type get_dev = REAL(cuCtxGetDevice);
    __auto_type get_info = REAL(cuMemGetInfo_v2);
    if (!get_dev || !get_info || get_dev(&cur) != CUDA_SUCCESS || cur != m->ord || get_info(&f, &t) != CUDA_SUCCESS)
        return -1;
    *out = f;
    return 0;
}

/* One reading by the given method. */
static int reading(struct measure *m, int how, uint64_t *out) {
    if (how == M_NVML_PROCESS) return m->nvml ? nvml_process_used(m->nvml, host_pid(), out, &m->others) : -1;
    return free_memory(m, how, out);
}

void measure_begin(struct measure *m, int dev, CUdevice ord) {
    pthread_mutex_lock(&g_measure_mu);
    *m = (struct measure){.dev = dev, .ord = ord, .how = M_NONE, .how_free = M_NONE, .nvml = nvml_device(ord)};
    m->charged = quota_mine(dev); /* its other threads' allocations are taken out */
    for (int how = M_NVML_PROCESS; how <= M_CUDA_FREE; how++)
        if (reading(m, how, &m->before) == 0) {
            m->how = how;
            break;
        }
    if (m->how != M_NVML_PROCESS) return;
    m->others_before = m->others;
    /* NVML's process figure is checked against the driver's free memory: the driver's own
     * (cuMemGetInfo) where a context of the GPU is current, else NVML's */
    for (int how = M_CUDA_FREE; how >= M_NVML_FREE; how--)
        if (reading(m, how, &m->free_before) == 0) {
            m->how_free = how;
            return;
        }
}

/* What the free-memory reading says was taken since begin (its own method), or 0 when it cannot be read. */
static int64_t free_taken(struct measure *m) {
    uint64_t after = 0;
    if (m->how_free == M_NONE || reading(m, m->how_free, &after) < 0) return 0;
    return (int64_t)(m->free_before - after);
}

/* What the call took: NVML's growth of this process's figure, or the drop in free memory where that is
 * larger. The drop counts what other processes on the GPU allocated meanwhile too (a container starting while
 * a neighbour allocates would be charged the neighbour's bytes, up to a refusal of its first context), so the
 * growth NVML shows for every other process over the window is taken out of it first; the free memory is read
 * before the process list, so a neighbour's allocation between the two readings is taken out without having
 * been counted (the drop is then lower, never higher, than this process's own). An NVML that under-reports
 * (a broken driver) shows no neighbour growing either, and the drop still overrules it. */
int64_t measure_end(struct measure *m) {
    uint64_t after = 0;
    int64_t by_free = m->how == M_NVML_PROCESS ? free_taken(m) : 0;
    if (m->how == M_NONE || reading(m, m->how, &after) < 0) {
        m->how = M_NONE;
        return 0;
    }
    m->after = after;
    int64_t others = (int64_t)(quota_mine(m->dev) - m->charged); /* this process's other threads, meanwhile */
    if (m->how != M_NVML_PROCESS) return (int64_t)(m->before - after) - others; /* free memory went down */
    int64_t by_nvml = (int64_t)(after - m->before);
    int64_t neighbours = (int64_t)(m->others - m->others_before);
    if (neighbours > 0) by_free -= neighbours;
    return (by_free > by_nvml ? by_free : by_nvml) - others;
}

/* Charge (or give back) what reconciliation found: NVML's figure for this process beyond its charges. */
static void reconcile(struct measure *m) {
    if (m->how != M_NVML_PROCESS || g_region.slot < 0 || m->dev < 0 || m->dev >= MS_MAX_DEVICES) return;
    uint64_t charged = quota_mine(m->dev);
    uint64_t *u = &g_unexplained[m->dev];
    if (m->after > charged) {
        uint64_t extra = m->after - charged;
        char a[32];
        shim_log(LOG_INFO, "memslice: NVML shows %s more on GPU %d than this process's charges explain; "
                 "charged", fmt_bytes(extra, a, sizeof a), m->ord);
        quota_force(m->dev, extra);
        *u += extra;
        quota_note_taken(m->dev, extra, 0);
    } else if (*u && charged - m->after > 0) {
        uint64_t back = charged - m->after < *u ? charged - m->after : *u;
        quota_uncharge(m->dev, back);
        *u -= back;
        quota_note_taken(m->dev, back, 1);
    }
}

void measure_done(struct measure *m) {
    reconcile(m);
    pthread_mutex_unlock(&g_measure_mu);
}

/* The record key of a handle's measured memory of one kind. */
static uint64_t taken_key(uint64_t handle, enum taken_kind kind) { return handle ^ ((uint64_t)kind << 56); }

/* Charge n bytes the driver took for a handle, and record them under it. */
CUresult taken_charge(int dev, uint64_t handle, enum taken_kind kind, uint64_t n, const char *call) {
    if (!n) return CUDA_SUCCESS;
    CUresult rc = quota_charge(dev, n, call, QUOTA_LOUD);
    if (rc != CUDA_SUCCESS) return rc;
    taken_record(dev, handle, kind, n);
    return CUDA_SUCCESS;
}

/* Record n bytes already charged (a context's charge taken before the driver call) under a handle. */
void taken_record(int dev, uint64_t handle, enum taken_kind kind, uint64_t n) {
    if (!n) return;
    ms_rec r;
    uint64_t key = taken_key(handle, kind), had = 0;
    if (ms_ptrmap_take(&g_taken, key, &r)) had = r.size;
    r = (ms_rec){.key = key, .size = had + n, .dev = dev, .kind = (uint32_t)kind};
    ms_ptrmap_put(&g_taken, &r);
    quota_note_taken(dev, n, 0);
}

/* Give back what a handle's record holds (at most at_most), uncharging it. */
uint64_t taken_release(uint64_t handle, enum taken_kind kind, uint64_t at_most) {
    ms_rec r;
    uint64_t key = taken_key(handle, kind);
    if (!ms_ptrmap_take(&g_taken, key, &r)) return 0;
    uint64_t back = r.size < at_most ? r.size : at_most;
    if (back < r.size) {
        r.size -= back;
        ms_ptrmap_put(&g_taken, &r);
    }
    quota_uncharge(r.dev, back);
    quota_note_taken(r.dev, back, 1);
    return back;
}

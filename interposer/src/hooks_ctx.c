/* Hooks for contexts and cuInit. Every context takes device memory the driver sets aside without an
 * allocation call (~520 MiB each on an H100 with driver 580, the 17th as much as the first): each one a
 * process creates (the primary context at its first retain, every cuCtxCreate) is charged what it took,
 * measured around the call (measure.c), MEMSLICE_CONTEXT_RESERVE only when nothing can be read.
 * The expected cost is charged BEFORE the driver call (the last measured context of the GPU, else the
 * reserve, else what is left of the quota), so that threads allocating meanwhile cannot take the room the
 * new context is about to occupy: physical memory never passes the quota, even for a moment. After the call
 * the charge is reconciled with the measurement. A context whose known cost does not fit is refused before
 * the driver makes it; one that turns out larger than what was held and does not fit is destroyed again;
 * both answer CUDA_ERROR_OUT_OF_MEMORY. The charge comes back when the context is destroyed (the primary:
 * released for the last time). */
#define _GNU_SOURCE
#include <string.h>

#include "shim.h"

#define MAX_ORD 64
static uint64_t g_exact[MAX_ORD];   /* the last context measured exactly (NVML per process), per ordinal */
static uint64_t g_primary[MAX_ORD]; /* the primary context's handle, once charged */

/* A forked child is a new process: it has charged no context. */
void ctx_after_fork(void) {
    memset(g_exact, 0, sizeof g_exact);
    memset(g_primary, 0, sizeof g_primary);
}

/* What a new context is charged from a measurement: exactly what NVML shows for the process; by free
 * memory (other tenants may have freed meanwhile) never less than the last exact figure or the reserve;
 * the reserve when nothing could be read. */
static uint64_t context_bytes(const struct measure *m, int64_t delta) {
    uint64_t floor = g_exact[m->ord] ? g_exact[m->ord] : g_cfg.context_reserve;
    if (m->how == M_NVML_PROCESS) return g_exact[m->ord] = delta > 0 ? (uint64_t)delta : 0;
    if (m->how == M_NONE) return floor;
    return delta > 0 && (uint64_t)delta > floor ? (uint64_t)delta : floor;
}

/* Undo a context the quota cannot hold. */
static void ctx_undo(CUcontext ctx, CUdevice ord, int primary) {
    if (primary) {
        __auto_type rel = REAL(cuDevicePrimaryCtxRelease_v2);
        if (rel) rel(ord);
    } else {
        __auto_type destroy = REAL(cuCtxDestroy_v2);
        if (destroy) destroy(ctx);
    }
}

/* After the driver made a context: charge what it took beyond what was held before the call (`held`), or
 * give the surplus back; undo the context when the rest does not fit. */
static CUresult ctx_account(struct measure *m, CUcontext ctx, int primary, uint64_t held, const char *call) {
    int64_t delta = measure_end(m);
    uint64_t n = context_bytes(m, delta), handle = (uint64_t)(uintptr_t)ctx;
    if (m->how != M_NONE) __atomic_store_n(&g_region.r->dev[m->dev].context_cost, n, __ATOMIC_RELAXED);
    if (n > held && quota_charge(m->dev, n - held, call, QUOTA_QUIET) != CUDA_SUCCESS) {
        quota_uncharge(m->dev, held); /* before the refusal, whose message says what the quota holds without it */
        quota_refuse(m->dev, n, call);
        ctx_undo(ctx, m->ord, primary);
        m->how = M_NONE; /* the reading was taken before the undo: nothing to reconcile */
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (n < held) quota_uncharge(m->dev, held - n);
    taken_record(m->dev, handle, T_CONTEXT, n);
    if (primary) g_primary[m->ord] = handle;
    return CUDA_SUCCESS;
}

/* What a new context of the GPU is expected to cost: this process's last exact measurement, else the last
 * one any process of the container recorded for the GPU (at most the quota: the region is tenant-writable);
 * 0 when none was ever measured. */
static uint64_t ctx_expected(int dev, CUdevice ord) {
    uint64_t e = g_exact[ord];
    if (!e) e = __atomic_load_n(&g_region.r->dev[dev].context_cost, __ATOMIC_RELAXED);
    return e < g_cfg.limit ? e : g_cfg.limit;
}

/* Hold the expected cost of a new context before the driver makes it. A known cost that does not fit is
 * refused (-1: the driver is not called). An unknown one holds the reserve, or when that does not fit what
 * is left of the quota (nothing left: refused). *held gets what was charged. */
static int ctx_hold(int dev, CUdevice ord, uint64_t *held) {
    uint64_t want = ctx_expected(dev, ord);
    *held = 0;
    if (want) {
        if (quota_charge(dev, want, NULL, QUOTA_QUIET) != CUDA_SUCCESS) return -1;
        *held = want;
        return 0;
    }
    want = g_cfg.context_reserve < g_cfg.limit ? g_cfg.context_reserve : g_cfg.limit;
    if (quota_charge(dev, want, NULL, QUOTA_QUIET) == CUDA_SUCCESS) { /* (reclaims dead processes once) */
        *held = want;
        return 0;
    }
    *held = quota_charge_left(dev, want);
    return *held ? 0 : -1;
}

/* Start measuring a context's creation with its expected cost held (see ctx_hold). CUDA_SUCCESS, or
 * CUDA_ERROR_OUT_OF_MEMORY (refused and counted; the measurement is already finished). */
static CUresult ctx_begin(struct measure *m, int dev, CUdevice ord, uint64_t *held, const char *call) {
    measure_begin(m, dev, ord);
    if (ctx_hold(dev, ord, held) == 0) {
        m->charged += *held; /* the hold is not another thread's allocation */
        return CUDA_SUCCESS;
    }
    uint64_t e = ctx_expected(dev, ord);
    quota_refuse(dev, e ? e : g_cfg.context_reserve, call);
    m->how = M_NONE;
    measure_done(m);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* Finish a context's creation: account for it when the driver made it, else give the hold back. */
static CUresult ctx_finish(struct measure *m, CUresult rc, CUcontext *pctx, int primary, uint64_t held,
                           const char *call) {
    if (rc == CUDA_SUCCESS) {
        rc = ctx_account(m, *pctx, primary, held, call);
    } else {
        quota_uncharge(m->dev, held);
        m->how = M_NONE;
    }
    measure_done(m);
    return rc;
}

/* Whether the ordinal's context is one to measure: accounting on, contexts charged (a context reserve of 0
 * turns that off: the quota then covers allocations alone), the GPU in the region. -1: refuse (the GPU
 * cannot be charged under a quota), 0: pass through, 1: measure (dev set). */
static int ctx_measured(CUdevice ord, int *dev) {
    if (!accounting() || !g_cfg.context_reserve || ord < 0 || ord >= MAX_ORD) return 0;
    *dev = dev_index(ord);
    if (*dev == DEV_UNCHARGEABLE) return -1;
    return *dev >= 0;
}

/* One hook per explicit context-creating entry point: measure the driver's call, charge it. */
#define CTX_HOOK(name, params, args, ord)                                                                  \
    HOOK CUresult CUDAAPI name params {                                                                    \
        PROLOGUE();                                                                                        \
        __auto_type real = REAL(name);                                                                     \
        if (!real) return CUDA_ERROR_NOT_SUPPORTED;                                                        \
        int ldev = -1, how = ctx_measured(ord, &ldev);                                                     \
        if (how < 0) return CUDA_ERROR_OUT_OF_MEMORY;                                                      \
        if (how == 0) return real args;                                                                    \
        struct measure m;                                                                                  \
        uint64_t held;                                                                                     \
        if (ctx_begin(&m, ldev, ord, &held, #name) != CUDA_SUCCESS) return CUDA_ERROR_OUT_OF_MEMORY;       \
        return ctx_finish(&m, real args, pctx, 0, held, #name);                                            \
    }

CTX_HOOK(cuCtxCreate, (CUcontext *pctx, unsigned int flags, CUdevice dev), (pctx, flags, dev), dev)
CTX_HOOK(cuCtxCreate_v2, (CUcontext *pctx, unsigned int flags, CUdevice dev), (pctx, flags, dev), dev)
CTX_HOOK(cuCtxCreate_v3, (CUcontext *pctx, CUexecAffinityParam *params, int n, unsigned int flags, CUdevice dev),
         (pctx, params, n, flags, dev), dev)
CTX_HOOK(cuCtxCreate_v4, (CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev),
         (pctx, params, flags, dev), dev)

/* Is the device's primary context alive in this process? */
static int primary_active(CUdevice ord) {
    __auto_type state = REAL(cuDevicePrimaryCtxGetState);
    unsigned int flags = 0;
    int active = 0;
    return state && state(ord, &flags, &active) == CUDA_SUCCESS && active;
}

/* The primary context costs memory when a retain creates it; later retains take nothing. */
HOOK CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice ord) {
    PROLOGUE();
    __auto_type real = REAL(cuDevicePrimaryCtxRetain);
    if (!real) return CUDA_ERROR_NOT_SUPPORTED;
    int dev = -1, how = ctx_measured(ord, &dev);
    if (how < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    if (how == 0 || primary_active(ord)) return real(pctx, ord);
    struct measure m;
    uint64_t held;
    if (ctx_begin(&m, dev, ord, &held, "cuDevicePrimaryCtxRetain") != CUDA_SUCCESS) return CUDA_ERROR_OUT_OF_MEMORY;
    return ctx_finish(&m, real(pctx, ord), pctx, 1, held, "cuDevicePrimaryCtxRetain");
}

/* A context's measured memory (itself and its limits) comes back when the driver frees it. */
static void ctx_gone(uint64_t handle) {
    taken_release(handle, T_CONTEXT, UINT64_MAX);
    taken_release(handle, T_LIMITS, UINT64_MAX);
}

/* The last release destroys the primary context: its charge comes back then. */
static CUresult primary_release(CUresult (*real)(CUdevice), CUdevice ord) {
    if (!real) return CUDA_ERROR_NOT_SUPPORTED;
    CUresult rc = real(ord);
    if (rc == CUDA_SUCCESS && ord >= 0 && ord < MAX_ORD && g_primary[ord] && !primary_active(ord)) {
        ctx_gone(g_primary[ord]);
        g_primary[ord] = 0;
    }
    return rc;
}
HOOK CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice ord) {
    PROLOGUE();
    return primary_release(REAL(cuDevicePrimaryCtxRelease), ord);
}
HOOK CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice ord) {
    PROLOGUE();
    return primary_release(REAL(cuDevicePrimaryCtxRelease_v2), ord);
}

/* Destroying an explicit context gives its memory back. */
static CUresult ctx_destroy(CUresult (*real)(CUcontext), CUcontext ctx) {
    if (!real) return CUDA_ERROR_NOT_SUPPORTED;
    CUresult rc = real(ctx);
    if (rc == CUDA_SUCCESS && ctx) ctx_gone((uint64_t)(uintptr_t)ctx);
    return rc;
}
HOOK CUresult CUDAAPI cuCtxDestroy(CUcontext ctx) { PROLOGUE(); return ctx_destroy(REAL(cuCtxDestroy), ctx); }
HOOK CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx) { PROLOGUE(); return ctx_destroy(REAL(cuCtxDestroy_v2), ctx); }

/* cuInit is hooked so that a bad configuration fails closed at the application's first driver call. */
HOOK CUresult CUDAAPI cuInit(unsigned int flags) {
    PROLOGUE();
    __auto_type real = REAL(cuInit);
    return real ? real(flags) : CUDA_ERROR_NOT_INITIALIZED;
}

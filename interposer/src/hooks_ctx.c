/* Hooks for contexts and cuInit. Every context takes device memory the driver sets aside without an
 * allocation call (~520 MiB each on an H100 with driver 580, the 17th as much as the first): each one a
 * process creates (the primary context at its first retain, every cuCtxCreate) is charged what it took,
 * measured around the call (measure.c), MEMSLICE_CONTEXT_RESERVE only when nothing can be read. A context
 * that does not fit the quota is destroyed again and the call answers CUDA_ERROR_OUT_OF_MEMORY; the charge
 * comes back when the context is destroyed (the primary: released for the last time). */
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

/* After the driver made a context: charge what it took, or undo it when that does not fit. */
static CUresult ctx_account(struct measure *m, CUcontext ctx, int primary, const char *call) {
    int64_t delta = measure_end(m);
    uint64_t n = context_bytes(m, delta);
    if (m->how != M_NONE) __atomic_store_n(&g_ledger.r->dev[m->dev].context_cost, n, __ATOMIC_RELAXED);
    CUresult rc = taken_charge(m->dev, (uint64_t)(uintptr_t)ctx, T_CONTEXT, n, call);
    if (rc != CUDA_SUCCESS) {
        ctx_undo(ctx, m->ord, primary);
        m->how = M_NONE; /* the reading was taken before the undo: nothing to reconcile */
    } else if (primary) {
        g_primary[m->ord] = (uint64_t)(uintptr_t)ctx;
    }
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
        measure_begin(&m, ldev, ord);                                                                      \
        CUresult rc = real args;                                                                           \
        if (rc == CUDA_SUCCESS) rc = ctx_account(&m, *pctx, 0, #name);                                     \
        else m.how = M_NONE;                                                                               \
        measure_done(&m);                                                                                  \
        return rc;                                                                                         \
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
    measure_begin(&m, dev, ord);
    CUresult rc = real(pctx, ord);
    if (rc == CUDA_SUCCESS) rc = ctx_account(&m, *pctx, 1, "cuDevicePrimaryCtxRetain");
    else m.how = M_NONE;
    measure_done(&m);
    return rc;
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

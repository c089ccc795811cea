/* Hooks for context creation and cuInit. Each process's first context on a GPU is charged
 * MEMSLICE_CONTEXT_RESERVE (what the driver itself takes there), reserved before the driver is called and
 * rolled back if it fails. */
#define _GNU_SOURCE
#include <string.h>

#include "shim.h"

#define MAX_ORD 64
static int g_ctx_charged[MAX_ORD];

/* A forked child is a new process: its first context on each GPU is charged again. */
void reset_ctx_after_fork(void) { memset(g_ctx_charged, 0, sizeof g_ctx_charged); }

/* Returns 1 if this call charged the reserve (to undo if the context fails), 0 if nothing to do. */
static int ctx_reserve(CUdevice ord, CUresult *rc) {
    *rc = CUDA_SUCCESS;
    if (!accounting() || !g_cfg.context_reserve || ord < 0 || ord >= MAX_ORD) return 0;
    int expect = 0;
    if (!__atomic_compare_exchange_n(&g_ctx_charged[ord], &expect, 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) return 0;
    int dev = dev_index(ord);
    if (dev == DEV_UNCHARGEABLE) {
        __atomic_store_n(&g_ctx_charged[ord], 0, __ATOMIC_SEQ_CST);
        *rc = CUDA_ERROR_OUT_OF_MEMORY;
        return 0;
    }
    if (dev < 0) return 0;
    if (g_cfg.context_reserve > g_cfg.limit) {
        char a[32], b[32];
        shim_log(LOG_ERROR, "memslice: the quota (%s, %s) is smaller than the per-process "
                 "context reserve (%s); raise the quota or lower MEMSLICE_CONTEXT_RESERVE",
                 g_cfg.limit_source, fmt_bytes(g_cfg.limit, a, sizeof a), fmt_bytes(g_cfg.context_reserve, b, sizeof b));
    }
    if ((*rc = charge(dev, g_cfg.context_reserve, "context creation (MEMSLICE_CONTEXT_RESERVE)")) != CUDA_SUCCESS) {
        __atomic_store_n(&g_ctx_charged[ord], 0, __ATOMIC_SEQ_CST);
        return 0;
    }
    return 1;
}

/* Undo ctx_reserve after the driver refused the context. */
static void ctx_unreserve(CUdevice ord) {
    int dev = dev_index(ord);
    if (dev >= 0) uncharge(dev, g_cfg.context_reserve);
    __atomic_store_n(&g_ctx_charged[ord], 0, __ATOMIC_SEQ_CST);
}

/* One hook per context-creating entry point: reserve, call the driver, undo the reserve if it failed. */
#define CTX_HOOK(name, params, args, ord)                                                                  \
    HOOK CUresult CUDAAPI name params {                                                                    \
        PROLOGUE();                                                                                        \
        __auto_type real = REAL(name);                                                                     \
        if (!real) return CUDA_ERROR_NOT_SUPPORTED;                                                        \
        CUresult rc;                                                                                       \
        int charged = ctx_reserve(ord, &rc);                                                               \
        if (rc != CUDA_SUCCESS) return rc;                                                                 \
        rc = real args;                                                                                    \
        if (rc != CUDA_SUCCESS && charged) ctx_unreserve(ord);                                             \
        return rc;                                                                                         \
    }

CTX_HOOK(cuDevicePrimaryCtxRetain, (CUcontext *pctx, CUdevice dev), (pctx, dev), dev)
CTX_HOOK(cuCtxCreate, (CUcontext *pctx, unsigned int flags, CUdevice dev), (pctx, flags, dev), dev)
CTX_HOOK(cuCtxCreate_v2, (CUcontext *pctx, unsigned int flags, CUdevice dev), (pctx, flags, dev), dev)
CTX_HOOK(cuCtxCreate_v3, (CUcontext *pctx, CUexecAffinityParam *params, int n, unsigned int flags, CUdevice dev),
         (pctx, params, n, flags, dev), dev)
CTX_HOOK(cuCtxCreate_v4, (CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev),
         (pctx, params, flags, dev), dev)

/* cuInit is hooked so that a bad configuration fails closed at the application's first driver call. */
HOOK CUresult CUDAAPI cuInit(unsigned int flags) {
    PROLOGUE();
    __auto_type real = REAL(cuInit);
    return real ? real(flags) : CUDA_ERROR_NOT_INITIALIZED;
}

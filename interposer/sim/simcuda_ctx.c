/* Simulated driver: primary and explicit contexts, and the current context of each thread. */
#define _GNU_SOURCE
#include <stdlib.h>

#include "sim_internal.h"
#include "simcuda.h"

static int g_primary_refs[SIM_MAX_GPUS];
static int g_ctx_charged[SIM_MAX_GPUS];

/* ---- contexts ----------------------------------------------------------------------------------- */
/* A process's first context on a GPU takes device memory, as on real hardware. */
static CUresult charge_context(int dev) {
    struct sim *s = S();
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&g_mu);
    if (!g_ctx_charged[dev]) {
        if (s->context_overhead && sim_charge(s, dev, s->context_overhead, 0) < 0) rc = CUDA_ERROR_OUT_OF_MEMORY;
        else g_ctx_charged[dev] = 1;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* The device's primary context; the process's first context on a GPU is charged. */
API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice d) {
    NEED_INIT();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    CUresult rc = charge_context(d);
    if (rc) return rc;
    __atomic_fetch_add(&g_primary_refs[d], 1, __ATOMIC_SEQ_CST);
    *pctx = (CUcontext)&g_primary[d];
    return CUDA_SUCCESS;
}

/* Drop one reference to the primary context (it stays usable, as on a real driver). */
API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    NEED_INIT();
    if (!valid_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    if (__atomic_load_n(&g_primary_refs[d], __ATOMIC_SEQ_CST) > 0)
        __atomic_fetch_sub(&g_primary_refs[d], 1, __ATOMIC_SEQ_CST);
    return CUDA_SUCCESS;
}
/* The legacy variant of cuDevicePrimaryCtxRelease_v2: the same call. */
API CUresult cuDevicePrimaryCtxRelease(CUdevice d) { return cuDevicePrimaryCtxRelease_v2(d); }
/* Accepted for a valid device; the simulator keeps no per-context state to reset. */
API CUresult cuDevicePrimaryCtxReset_v2(CUdevice d) { NEED_INIT(); return valid_dev(d) ? 0 : CUDA_ERROR_INVALID_DEVICE; }
/* The legacy variant of cuDevicePrimaryCtxReset_v2: the same call. */
API CUresult cuDevicePrimaryCtxReset(CUdevice d) { return cuDevicePrimaryCtxReset_v2(d); }
/* Flags are accepted and ignored (no scheduling to configure). */
API CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice d, unsigned int f) { (void)f; return cuDevicePrimaryCtxReset_v2(d); }
/* Whether the primary context is retained; flags are always 0. */
API CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned int *flags, int *active) {
    NEED_INIT();
    if (!valid_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    if (flags) *flags = 0;
    if (active) *active = __atomic_load_n(&g_primary_refs[d], __ATOMIC_SEQ_CST) > 0;
    return CUDA_SUCCESS;
}

/* An explicit context, made current for the calling thread (as cuCtxCreate does). */
static CUresult ctx_create(CUcontext *pctx, CUdevice d) {
    NEED_INIT();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    CUresult rc = charge_context(d);
    if (rc) return rc;
    struct sim_ctx *c = calloc(1, sizeof *c);
    if (!c) return CUDA_ERROR_OUT_OF_MEMORY;
    *c = (struct sim_ctx){CTX_MAGIC, d, 0};
    t_ctx = c;
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}
/* Legacy cuCtxCreate (flags ignored). */
API CUresult cuCtxCreate(CUcontext *p, unsigned int flags, CUdevice d) { (void)flags; return ctx_create(p, d); }
/* cuCtxCreate_v2 (flags ignored). */
API CUresult cuCtxCreate_v2(CUcontext *p, unsigned int flags, CUdevice d) { (void)flags; return ctx_create(p, d); }
/* cuCtxCreate_v3: execution-affinity parameters are ignored. */
API CUresult cuCtxCreate_v3(CUcontext *p, CUexecAffinityParam *params, int n, unsigned int flags, CUdevice d) {
    (void)params; (void)n; (void)flags; return ctx_create(p, d);
}
/* cuCtxCreate_v4 (CUDA 12.5+): creation parameters are ignored. */
API CUresult cuCtxCreate_v4(CUcontext *p, CUctxCreateParams *params, unsigned int flags, CUdevice d) {
    (void)params; (void)flags; return ctx_create(p, d);
}

/* The context behind a handle, or NULL if it is not one of ours. */
static struct sim_ctx *as_ctx(CUcontext c) {
    struct sim_ctx *x = (struct sim_ctx *)c;
    return x && x->magic == CTX_MAGIC ? x : NULL;
}

/* Destroy an explicit context (primary contexts cannot be destroyed). */
API CUresult cuCtxDestroy_v2(CUcontext c) {
    NEED_INIT();
    struct sim_ctx *x = as_ctx(c);
    if (!x || x->primary) return CUDA_ERROR_INVALID_CONTEXT;
    if (t_ctx == x) t_ctx = NULL;
    x->magic = 0;
    free(x);
    return CUDA_SUCCESS;
}
/* The legacy variant of cuCtxDestroy_v2: the same call. */
API CUresult cuCtxDestroy(CUcontext c) { return cuCtxDestroy_v2(c); }

/* Make a context the calling thread's current one (NULL: none). */
API CUresult cuCtxSetCurrent(CUcontext c) {
    NEED_INIT();
    if (c && !as_ctx(c)) return CUDA_ERROR_INVALID_CONTEXT;
    t_ctx = as_ctx(c);
    return CUDA_SUCCESS;
}
/* The calling thread's current context. */
API CUresult cuCtxGetCurrent(CUcontext *c) { NEED_INIT(); if (!c) return CUDA_ERROR_INVALID_VALUE; *c = (CUcontext)t_ctx; return 0; }
/* One current context per thread here: push makes it current. */
API CUresult cuCtxPushCurrent_v2(CUcontext c) { return cuCtxSetCurrent(c); }
/* Legacy variant of cuCtxPushCurrent_v2. */
API CUresult cuCtxPushCurrent(CUcontext c) { return cuCtxSetCurrent(c); }
/* The simulator keeps one current context per thread: pop returns it and clears it. */
API CUresult cuCtxPopCurrent_v2(CUcontext *c) { NEED_INIT(); if (c) *c = (CUcontext)t_ctx; t_ctx = NULL; return 0; }
/* The legacy variant of cuCtxPopCurrent_v2: the same call. */
API CUresult cuCtxPopCurrent(CUcontext *c) { return cuCtxPopCurrent_v2(c); }
/* The current context's device. */
API CUresult cuCtxGetDevice(CUdevice *d) { NEED_CTX(); if (!d) return CUDA_ERROR_INVALID_VALUE; *d = t_ctx->dev; return 0; }
/* A context's device (NULL: the current one), CUDA 13. */
API CUresult cuCtxGetDevice_v2(CUdevice *d, CUcontext c) {
    NEED_INIT();
    struct sim_ctx *x = c ? as_ctx(c) : t_ctx;
    if (!x) return CUDA_ERROR_INVALID_CONTEXT;
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    *d = x->dev;
    return CUDA_SUCCESS;
}

/* A context's device, or -1 when the handle is not a live context (sim_internal.h: streams and IPC). */
int sim_ctx_device(CUcontext c) { struct sim_ctx *x = as_ctx(c); return x ? x->dev : -1; }

/* Simulated driver: primary and explicit contexts, and the current context of each thread. */
#define _GNU_SOURCE
#include <stdlib.h>

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

API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    NEED_INIT();
    if (!valid_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    if (__atomic_load_n(&g_primary_refs[d], __ATOMIC_SEQ_CST) > 0)
        __atomic_fetch_sub(&g_primary_refs[d], 1, __ATOMIC_SEQ_CST);
    return CUDA_SUCCESS;
}
API CUresult cuDevicePrimaryCtxRelease(CUdevice d) { return cuDevicePrimaryCtxRelease_v2(d); }
API CUresult cuDevicePrimaryCtxReset_v2(CUdevice d) { NEED_INIT(); return valid_dev(d) ? 0 : CUDA_ERROR_INVALID_DEVICE; }
API CUresult cuDevicePrimaryCtxReset(CUdevice d) { return cuDevicePrimaryCtxReset_v2(d); }
API CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice d, unsigned int f) { (void)f; return cuDevicePrimaryCtxReset_v2(d); }
API CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned int *flags, int *active) {
    NEED_INIT();
    if (!valid_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    if (flags) *flags = 0;
    if (active) *active = __atomic_load_n(&g_primary_refs[d], __ATOMIC_SEQ_CST) > 0;
    return CUDA_SUCCESS;
}

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
API CUresult cuCtxCreate(CUcontext *p, unsigned int flags, CUdevice d) { (void)flags; return ctx_create(p, d); }
API CUresult cuCtxCreate_v2(CUcontext *p, unsigned int flags, CUdevice d) { (void)flags; return ctx_create(p, d); }
API CUresult cuCtxCreate_v3(CUcontext *p, CUexecAffinityParam *params, int n, unsigned int flags, CUdevice d) {
    (void)params; (void)n; (void)flags; return ctx_create(p, d);
}
API CUresult cuCtxCreate_v4(CUcontext *p, CUctxCreateParams *params, unsigned int flags, CUdevice d) {
    (void)params; (void)flags; return ctx_create(p, d);
}

static struct sim_ctx *as_ctx(CUcontext c) {
    struct sim_ctx *x = (struct sim_ctx *)c;
    return x && x->magic == CTX_MAGIC ? x : NULL;
}

API CUresult cuCtxDestroy_v2(CUcontext c) {
    NEED_INIT();
    struct sim_ctx *x = as_ctx(c);
    if (!x || x->primary) return CUDA_ERROR_INVALID_CONTEXT;
    if (t_ctx == x) t_ctx = NULL;
    x->magic = 0;
    free(x);
    return CUDA_SUCCESS;
}
API CUresult cuCtxDestroy(CUcontext c) { return cuCtxDestroy_v2(c); }

API CUresult cuCtxSetCurrent(CUcontext c) {
    NEED_INIT();
    if (c && !as_ctx(c)) return CUDA_ERROR_INVALID_CONTEXT;
    t_ctx = as_ctx(c);
    return CUDA_SUCCESS;
}
API CUresult cuCtxGetCurrent(CUcontext *c) { NEED_INIT(); if (!c) return CUDA_ERROR_INVALID_VALUE; *c = (CUcontext)t_ctx; return 0; }
API CUresult cuCtxPushCurrent_v2(CUcontext c) { return cuCtxSetCurrent(c); }
API CUresult cuCtxPushCurrent(CUcontext c) { return cuCtxSetCurrent(c); }
API CUresult cuCtxPopCurrent_v2(CUcontext *c) { NEED_INIT(); if (c) *c = (CUcontext)t_ctx; t_ctx = NULL; return 0; }
API CUresult cuCtxPopCurrent(CUcontext *c) { return cuCtxPopCurrent_v2(c); }
API CUresult cuCtxGetDevice(CUdevice *d) { NEED_CTX(); if (!d) return CUDA_ERROR_INVALID_VALUE; *d = t_ctx->dev; return 0; }
API CUresult cuCtxGetDevice_v2(CUdevice *d, CUcontext c) {
    NEED_INIT();
    struct sim_ctx *x = c ? as_ctx(c) : t_ctx;
    if (!x) return CUDA_ERROR_INVALID_CONTEXT;
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    *d = x->dev;
    return CUDA_SUCCESS;
}

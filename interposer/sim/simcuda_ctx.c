/* Simulated driver: primary and explicit contexts, and the current context of each thread. */
#define _GNU_SOURCE
#include <stdlib.h>

#include "sim_internal.h"
#include "simcuda.h"
#include "simtimeline.h"

static int g_primary_refs[SIM_MAX_GPUS];
static int g_primary_charged[SIM_MAX_GPUS];

/* ---- contexts ----------------------------------------------------------------------------------- */
/* Every context takes device memory, as on real hardware (an H100 took ~520 MiB for each of 17). */
static CUresult charge_context(int dev) {
    struct sim *s = S();
    return s->context_overhead && sim_charge(s, dev, s->context_overhead, 0) < 0 ? CUDA_ERROR_OUT_OF_MEMORY
                                                                                 : CUDA_SUCCESS;
}

/* The primary context is created (and charged) when a retain finds it inactive; the last release destroys it. */
static CUresult charge_primary(int dev) {
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&g_mu);
    if (!g_primary_charged[dev]) {
        rc = charge_context(dev);
        if (rc == CUDA_SUCCESS) g_primary_charged[dev] = 1;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* The device's primary context; the process's first context on a GPU is charged. */
API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice d) {
    NEED_INIT();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    CUresult rc = charge_primary(d);
    if (rc) return rc;
    pthread_mutex_lock(&g_mu);
    g_primary_refs[d]++;
    pthread_mutex_unlock(&g_mu);
    *pctx = (CUcontext)&g_primary[d];
    return CUDA_SUCCESS;
}

/* Drop one reference to the primary context (it stays usable, as on a real driver). */
API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    NEED_INIT();
    if (!valid_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_mu);
    if (g_primary_refs[d] > 0 && --g_primary_refs[d] == 0 && g_primary_charged[d]) {
        /* the last release destroys the primary context: its memory (and its limits') comes back, and its
         * queued kernels are dropped */
        tl_release_ctx(&g_primary[d]);
        sim_peer_forget(&g_primary[d]);
        sim_uncharge(S(), d, S()->context_overhead + g_primary[d].extra, 0);
        g_primary[d] = (struct sim_ctx){.magic = CTX_MAGIC, .dev = d, .primary = 1};
        g_primary_charged[d] = 0;
    }
    pthread_mutex_unlock(&g_mu);
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
    if (!c) {
        if (S()->context_overhead) sim_uncharge(S(), d, S()->context_overhead, 0);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *c = (struct sim_ctx){.magic = CTX_MAGIC, .dev = d};
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

/* Destroy an explicit context (primary contexts cannot be destroyed): its memory comes back. */
API CUresult cuCtxDestroy_v2(CUcontext c) {
    NEED_INIT();
    struct sim_ctx *x = as_ctx(c);
    if (!x || x->primary) return CUDA_ERROR_INVALID_CONTEXT;
    if (t_ctx == x) t_ctx = NULL;
    tl_release_ctx(x); /* its queued kernels are dropped with it */
    sim_peer_forget(x);
    sim_uncharge(S(), x->dev, S()->context_overhead + x->extra, 0);
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

/* ---- limits ------------------------------------------------------------------------------------------ */
/* The value of a limit (0 in the context: the default). */
static uint64_t limit_value(const struct sim_ctx *c, CUlimit l) {
    if (l == CU_LIMIT_STACK_SIZE) return c->stack ? c->stack : SIM_DEFAULT_STACK;
    if (l == CU_LIMIT_PRINTF_FIFO_SIZE) return c->fifo ? c->fifo : SIM_DEFAULT_FIFO;
    return c->heap ? c->heap : SIM_DEFAULT_HEAP;
}

/* Device memory the three limits take beyond the defaults (which the context overhead covers); saturates
 * rather than wraps on absurd values, which then cannot be charged. */
static uint64_t limits_extra(uint64_t stack, uint64_t fifo, uint64_t heap) {
    uint64_t st = stack > SIM_DEFAULT_STACK ? stack - SIM_DEFAULT_STACK : 0;
    uint64_t e = st > (UINT64_MAX >> 2) / SIM_RESIDENT_THREADS ? UINT64_MAX >> 2 : st * SIM_RESIDENT_THREADS;
    e += fifo > SIM_DEFAULT_FIFO ? (fifo - SIM_DEFAULT_FIFO) & (UINT64_MAX >> 3) : 0;
    e += heap > SIM_DEFAULT_HEAP ? (heap - SIM_DEFAULT_HEAP) & (UINT64_MAX >> 3) : 0;
    return e;
}

/* Set a limit of the current context: the memory it takes changes with it (charged before it is set, so a
 * limit the GPU cannot hold is refused with CUDA_ERROR_OUT_OF_MEMORY and the old one stays). */
API CUresult cuCtxSetLimit(CUlimit l, size_t value) {
    NEED_CTX();
    if ((unsigned)l > CU_LIMIT_MALLOC_HEAP_SIZE) return CUDA_ERROR_NOT_SUPPORTED;
    struct sim_ctx *c = t_ctx;
    pthread_mutex_lock(&g_mu);
    uint64_t st = l == CU_LIMIT_STACK_SIZE ? value : limit_value(c, CU_LIMIT_STACK_SIZE);
    uint64_t fi = l == CU_LIMIT_PRINTF_FIFO_SIZE ? value : limit_value(c, CU_LIMIT_PRINTF_FIFO_SIZE);
    uint64_t he = l == CU_LIMIT_MALLOC_HEAP_SIZE ? value : limit_value(c, CU_LIMIT_MALLOC_HEAP_SIZE);
    uint64_t extra = limits_extra(st, fi, he);
    CUresult rc = CUDA_SUCCESS;
    if (extra > c->extra && sim_charge(S(), c->dev, extra - c->extra, 0) < 0) rc = CUDA_ERROR_OUT_OF_MEMORY;
    else {
        if (extra < c->extra) sim_uncharge(S(), c->dev, c->extra - extra, 0);
        c->extra = extra;
        c->stack = st;
        c->fifo = fi;
        c->heap = he;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* A limit of the current context. */
API CUresult cuCtxGetLimit(size_t *v, CUlimit l) {
    NEED_CTX();
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    if ((unsigned)l > CU_LIMIT_MALLOC_HEAP_SIZE) return CUDA_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&g_mu);
    *v = (size_t)limit_value(t_ctx, l);
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

/* Hooks for every driver call that allocates or frees device memory.
 *
 * The rule everywhere: reserve in the ledger first, then call the driver, and roll the reservation back
 * if the driver fails — never check-then-charge. Frees call the driver first and release the charge only
 * once the driver has succeeded, so the device never holds more than what is charged. A free of a pointer
 * the shim never saw goes to the driver unchanged. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "ms_array.h"
#include "shim.h"

/* Reserve n bytes; in oversubscription mode a refusal is not logged here (the spill path decides). */
static CUresult reserve(int dev, uint64_t n, const char *call) {
    if (g_cfg.oversubscribe) return try_charge(dev, n) == 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    return charge(dev, n, call);
}

/* ---- contexts: each process's first context on a GPU is charged MEMSLICE_CONTEXT_RESERVE ----------- */
#define MAX_ORD 64
static int g_ctx_charged[MAX_ORD];

void reset_ctx_after_fork(void) { memset(g_ctx_charged, 0, sizeof g_ctx_charged); }

/* Returns 1 if this call charged the reserve (to undo if the context fails), 0 if nothing to do. */
static int ctx_reserve(CUdevice ord, CUresult *rc) {
    *rc = CUDA_SUCCESS;
    if (!accounting() || !g_cfg.context_reserve || ord < 0 || ord >= MAX_ORD) return 0;
    int expect = 0;
    if (!__atomic_compare_exchange_n(&g_ctx_charged[ord], &expect, 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) return 0;
    int dev = dev_index(ord);
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

static void ctx_unreserve(CUdevice ord) {
    int dev = dev_index(ord);
    if (dev >= 0) uncharge(dev, g_cfg.context_reserve);
    __atomic_store_n(&g_ctx_charged[ord], 0, __ATOMIC_SEQ_CST);
}

#define CTX_HOOK(name, params, args, ord)                                                                  \
    HOOK CUresult name params {                                                                            \
        PROLOGUE();                                                                                        \
        CUresult (*real) params = REAL(CUresult(*) params, name);                                          \
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
CTX_HOOK(cuCtxCreate_v3, (CUcontext *pctx, void *params, int n, unsigned int flags, CUdevice dev),
         (pctx, params, n, flags, dev), dev)
CTX_HOOK(cuCtxCreate_v4, (CUcontext *pctx, void *params, unsigned int flags, CUdevice dev), (pctx, params, flags, dev),
         dev)

HOOK CUresult cuInit(unsigned int flags) {
    PROLOGUE();
    CUresult (*real)(unsigned int) = REAL(CUresult(*)(unsigned int), cuInit);
    return real ? real(flags) : CUDA_ERROR_NOT_INITIALIZED;
}

/* ---- plain device allocations ---------------------------------------------------------------------- */
typedef CUresult (*alloc_v2_fn)(CUdeviceptr *, size_t);

static CUresult device_alloc(CUdeviceptr *dptr, size_t n, alloc_v2_fn real, const char *call) {
    CUdevice ord;
    int dev = accounting() && dptr && n ? current_dev(&ord) : -1;
    if (dev < 0) return real(dptr, n);
    CUresult rc = reserve(dev, n, call);
    if (rc != CUDA_SUCCESS) return g_cfg.oversubscribe ? spill_alloc(dptr, n, dev, ord, NULL, call) : rc;
    rc = real(dptr, n);
    if (rc != CUDA_SUCCESS || track(*dptr, n, dev, A_DEVICE, 0) < 0) {
        uncharge(dev, n);
        return rc;
    }
    return CUDA_SUCCESS;
}

HOOK CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t n) {
    PROLOGUE();
    return device_alloc(dptr, n, REAL(alloc_v2_fn, cuMemAlloc_v2), "cuMemAlloc_v2");
}

/* The legacy 32-bit entry point is counted like the others: it is not a way around the quota. */
HOOK CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int n) {
    PROLOGUE();
    CUresult (*real)(CUdeviceptr_v1 *, unsigned int) = REAL(CUresult(*)(CUdeviceptr_v1 *, unsigned int), cuMemAlloc);
    CUdevice ord;
    int dev = accounting() && dptr && n ? current_dev(&ord) : -1;
    if (dev < 0) return real(dptr, n);
    CUresult rc = reserve(dev, n, "cuMemAlloc");
    if (rc != CUDA_SUCCESS) return rc;
    rc = real(dptr, n);
    if (rc != CUDA_SUCCESS || track(*dptr, n, dev, A_DEVICE, 0) < 0) uncharge(dev, n);
    return rc;
}

/* Pitched allocations are charged what the driver actually allocates: rows of `pitch` bytes. The
 * reservation assumes 512-byte row alignment and is corrected once the driver reports the pitch.
 * `alloc` performs the real call (v2 or the legacy 32-bit v1) and reports address and pitch as 64-bit. */
typedef CUresult (*pitch_call)(void *args, uint64_t *ptr, uint64_t *pitch);

static CUresult pitched(uint64_t w, uint64_t h, int v2, pitch_call alloc, void *args, uint64_t *ptr, uint64_t *pitch,
                        const char *call) {
    CUdevice ord;
    int dev = accounting() && w && h ? current_dev(&ord) : -1;
    if (dev < 0) return alloc(args, ptr, pitch);
    uint64_t est = ((w + 511) & ~511ull) * h;
    CUresult rc = reserve(dev, est, call);
    if (rc != CUDA_SUCCESS && g_cfg.oversubscribe && v2) { /* host rows use the same 512-byte pitch */
        CUdeviceptr d;
        rc = spill_alloc(&d, est, dev, ord, NULL, call);
        if (rc == CUDA_SUCCESS) { *ptr = d; *pitch = (w + 511) & ~511ull; }
        return rc;
    }
    if (rc != CUDA_SUCCESS) return rc;
    if ((rc = alloc(args, ptr, pitch)) != CUDA_SUCCESS) {
        uncharge(dev, est);
        return rc;
    }
    uint64_t actual = *pitch * h;
    if (actual > est) force_charge(dev, actual - est);
    else uncharge(dev, est - actual);
    track(*ptr, actual, dev, A_DEVICE, 0);
    return CUDA_SUCCESS;
}

struct pitch_v2 { size_t w, h; unsigned int elem; };
static CUresult real_pitch_v2(void *args, uint64_t *ptr, uint64_t *pitch) {
    struct pitch_v2 *a = args;
    CUdeviceptr d;
    size_t p;
    CUresult rc = REAL(CUresult(*)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int), cuMemAllocPitch_v2)(
        &d, &p, a->w, a->h, a->elem);
    if (rc == CUDA_SUCCESS) { *ptr = d; *pitch = p; }
    return rc;
}

HOOK CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t w, size_t h, unsigned int elem) {
    PROLOGUE();
    struct pitch_v2 a = {w, h, elem};
    uint64_t p = 0, pt = 0;
    if (!dptr || !pitch) /* the driver says what is wrong with its arguments */
        return REAL(CUresult(*)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int), cuMemAllocPitch_v2)(
            dptr, pitch, w, h, elem);
    CUresult rc = pitched(w, h, 1, real_pitch_v2, &a, &p, &pt, "cuMemAllocPitch_v2");
    if (rc == CUDA_SUCCESS) { *dptr = p; *pitch = pt; }
    return rc;
}

struct pitch_v1 { unsigned int w, h, elem; };
static CUresult real_pitch_v1(void *args, uint64_t *ptr, uint64_t *pitch) {
    struct pitch_v1 *a = args;
    CUdeviceptr_v1 d;
    unsigned int p;
    CUresult rc = REAL(CUresult(*)(CUdeviceptr_v1 *, unsigned int *, unsigned int, unsigned int, unsigned int),
                       cuMemAllocPitch)(&d, &p, a->w, a->h, a->elem);
    if (rc == CUDA_SUCCESS) { *ptr = d; *pitch = p; }
    return rc;
}

HOOK CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int w, unsigned int h,
                              unsigned int elem) {
    PROLOGUE();
    if (!dptr || !pitch)
        return REAL(CUresult(*)(CUdeviceptr_v1 *, unsigned int *, unsigned int, unsigned int, unsigned int),
                    cuMemAllocPitch)(dptr, pitch, w, h, elem);
    struct pitch_v1 a = {w, h, elem};
    uint64_t p = 0, pt = 0;
    CUresult rc = pitched(w, h, 0, real_pitch_v1, &a, &p, &pt, "cuMemAllocPitch");
    if (rc == CUDA_SUCCESS) { *dptr = (CUdeviceptr_v1)p; *pitch = (unsigned int)pt; }
    return rc;
}

HOOK CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t n, unsigned int flags) {
    PROLOGUE();
    CUresult (*real)(CUdeviceptr *, size_t, unsigned int) =
        REAL(CUresult(*)(CUdeviceptr *, size_t, unsigned int), cuMemAllocManaged);
    CUdevice ord;
    int dev = accounting() && dptr && n ? current_dev(&ord) : -1;
    if (dev < 0) return real(dptr, n, flags);
    /* Managed pages may all migrate to the GPU, so they are charged as device memory. */
    CUresult rc = reserve(dev, n, "cuMemAllocManaged");
    if (rc != CUDA_SUCCESS)
        return g_cfg.oversubscribe ? spill_alloc_managed(dptr, n, flags, dev, ord, "cuMemAllocManaged") : rc;
    rc = real(dptr, n, flags);
    if (rc != CUDA_SUCCESS || track(*dptr, n, dev, A_MANAGED, 0) < 0) uncharge(dev, n);
    return rc;
}

/* Free of anything the shim tracks by pointer; unknown pointers go to the driver untouched. */
static CUresult free_tracked(CUdeviceptr p, CUresult (*real)(CUdeviceptr)) {
    ms_rec r;
    if (!p || !untrack(p, &r)) return real(p);
    if (r.kind == A_SPILL_HOST || r.kind == A_SPILL_MANAGED) return spill_free(&r, NULL, 0);
    if (r.kind == A_POOL) { /* stream-ordered memory freed synchronously: the driver decides */
        CUresult rc = real(p);
        if (rc != CUDA_SUCCESS) track(r.key, r.size, r.dev, (enum alloc_kind)r.kind, r.aux);
        return rc;
    }
    CUresult rc = real(p);
    if (rc == CUDA_SUCCESS) uncharge(r.dev, r.size);
    else track(r.key, r.size, r.dev, (enum alloc_kind)r.kind, r.aux);
    return rc;
}

HOOK CUresult cuMemFree_v2(CUdeviceptr p) {
    PROLOGUE();
    return free_tracked(p, REAL(CUresult(*)(CUdeviceptr), cuMemFree_v2));
}

static CUresult (*g_real_free_v1)(CUdeviceptr_v1);
static CUresult free_v1_adapter(CUdeviceptr p) { return g_real_free_v1((CUdeviceptr_v1)p); }
HOOK CUresult cuMemFree(CUdeviceptr_v1 p) {
    PROLOGUE();
    if (!g_real_free_v1) g_real_free_v1 = REAL(CUresult(*)(CUdeviceptr_v1), cuMemFree);
    return free_tracked(p, free_v1_adapter);
}

/* ---- stream-ordered allocations ------------------------------------------------------------------------
 * A pool keeps freed blocks reserved on the device, so what a pool occupies is its reserved size, not the
 * sum of live allocations. The shim therefore charges each pool what the driver says it reserves
 * (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT): an allocation reserves its size first (the pool may have to
 * grow by that much), then the charge is set to the pool's actual reservation. When the quota is
 * reached the pool is trimmed before the allocation is refused. Pools can thus never hold more than the
 * quota. Charges follow the pool down at synchronisation, trims and cuMemGetInfo. */
struct pool_rec { CUmemoryPool pool; int dev; uint64_t charged; pthread_mutex_t mu; };
#define MAX_POOLS 64
static struct pool_rec g_pools[MAX_POOLS];
static int g_npools;
static pthread_mutex_t g_pools_mu = PTHREAD_MUTEX_INITIALIZER;

static struct pool_rec *pool_rec(CUmemoryPool pool, int dev) {
    int n = __atomic_load_n(&g_npools, __ATOMIC_ACQUIRE);
    for (int i = 0; i < n; i++) if (g_pools[i].pool == pool) return &g_pools[i];
    pthread_mutex_lock(&g_pools_mu);
    struct pool_rec *pr = NULL;
    for (int i = 0; i < g_npools && !pr; i++) if (g_pools[i].pool == pool) pr = &g_pools[i];
    if (!pr && g_npools < MAX_POOLS) {
        pr = &g_pools[g_npools];
        pr->pool = pool;
        pr->dev = dev;
        pr->charged = 0;
        pthread_mutex_init(&pr->mu, NULL);
        __atomic_store_n(&g_npools, g_npools + 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_pools_mu);
    return pr;
}

static int pool_reserved(CUmemoryPool pool, uint64_t *out) {
    CUresult (*get)(CUmemoryPool, CUmemPool_attribute, void *) =
        REAL(CUresult(*)(CUmemoryPool, CUmemPool_attribute, void *), cuMemPoolGetAttribute);
    cuuint64_t v = 0;
    if (!get || get(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v) != CUDA_SUCCESS) return -1;
    *out = v;
    return 0;
}

/* Make the pool's charge equal its reservation. Caller holds pr->mu. */
static void reconcile_locked(struct pool_rec *pr) {
    uint64_t r;
    if (pool_reserved(pr->pool, &r) < 0) return;
    if (r > pr->charged) force_charge(pr->dev, r - pr->charged);
    else if (r < pr->charged) uncharge(pr->dev, pr->charged - r);
    pr->charged = r;
}

void reconcile_pools(void) {
    int n = __atomic_load_n(&g_npools, __ATOMIC_ACQUIRE);
    for (int i = 0; i < n; i++) {
        if (!g_pools[i].pool) continue;
        pthread_mutex_lock(&g_pools[i].mu);
        if (g_pools[i].pool) reconcile_locked(&g_pools[i]);
        pthread_mutex_unlock(&g_pools[i].mu);
    }
}

typedef CUresult (*async_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*frompool_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);

static CUresult pooled_alloc(CUdeviceptr *dptr, size_t n, CUmemoryPool pool, CUstream s, async_fn fa,
                             frompool_fn fp, const char *call) {
    CUdevice ord;
    int dev = accounting() && dptr && n ? current_dev(&ord) : -1;
    if (dev >= 0 && !pool) {
        CUresult (*getpool)(CUmemoryPool *, CUdevice) = REAL(CUresult(*)(CUmemoryPool *, CUdevice), cuDeviceGetMemPool);
        if (!getpool || getpool(&pool, ord) != CUDA_SUCCESS) dev = -1;
    }
    struct pool_rec *pr = dev >= 0 ? pool_rec(pool, dev) : NULL;
    if (!pr) return fp ? fp(dptr, n, pool, s) : fa(dptr, n, s);
    pthread_mutex_lock(&pr->mu);
    CUresult rc = try_charge(dev, n) == 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    if (rc != CUDA_SUCCESS) { /* give the pool's cached blocks back, then try again */
        CUresult (*trim)(CUmemoryPool, size_t) = REAL(CUresult(*)(CUmemoryPool, size_t), cuMemPoolTrimTo);
        if (trim) trim(pool, 0);
        reconcile_locked(pr);
        rc = reserve(dev, n, call);
    }
    if (rc != CUDA_SUCCESS) {
        pthread_mutex_unlock(&pr->mu);
        return g_cfg.oversubscribe ? spill_alloc(dptr, n, dev, ord, s, call) : rc;
    }
    rc = fp ? fp(dptr, n, pool, s) : fa(dptr, n, s);
    if (rc != CUDA_SUCCESS) {
        uncharge(dev, n);
    } else {
        pr->charged += n;
        reconcile_locked(pr);
        track(*dptr, n, dev, A_POOL, (uint64_t)(uintptr_t)pr);
    }
    pthread_mutex_unlock(&pr->mu);
    return rc;
}

HOOK CUresult cuMemAllocAsync(CUdeviceptr *d, size_t n, CUstream s) {
    PROLOGUE();
    return pooled_alloc(d, n, NULL, s, REAL(async_fn, cuMemAllocAsync), NULL, "cuMemAllocAsync");
}
HOOK CUresult cuMemAllocAsync_ptsz(CUdeviceptr *d, size_t n, CUstream s) {
    PROLOGUE();
    return pooled_alloc(d, n, NULL, s, REAL(async_fn, cuMemAllocAsync_ptsz), NULL, "cuMemAllocAsync_ptsz");
}
HOOK CUresult cuMemAllocFromPoolAsync(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s) {
    PROLOGUE();
    return pooled_alloc(d, n, p, s, NULL, REAL(frompool_fn, cuMemAllocFromPoolAsync), "cuMemAllocFromPoolAsync");
}
HOOK CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s) {
    PROLOGUE();
    return pooled_alloc(d, n, p, s, NULL, REAL(frompool_fn, cuMemAllocFromPoolAsync_ptsz),
                        "cuMemAllocFromPoolAsync_ptsz");
}

static CUresult free_async(CUdeviceptr p, CUstream s, CUresult (*real)(CUdeviceptr, CUstream)) {
    ms_rec r;
    if (!p || !untrack(p, &r)) return real(p, s);
    if (r.kind == A_SPILL_HOST || r.kind == A_SPILL_MANAGED) return spill_free(&r, s, 1);
    CUresult rc = real(p, s);
    if (rc != CUDA_SUCCESS) {
        track(r.key, r.size, r.dev, (enum alloc_kind)r.kind, r.aux);
        return rc;
    }
    /* Pool memory stays reserved by the pool (reconciled later); cuMemAlloc memory is released. */
    if (r.kind != A_POOL) uncharge(r.dev, r.size);
    return CUDA_SUCCESS;
}
HOOK CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) {
    PROLOGUE();
    return free_async(p, s, REAL(CUresult(*)(CUdeviceptr, CUstream), cuMemFreeAsync));
}
HOOK CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) {
    PROLOGUE();
    return free_async(p, s, REAL(CUresult(*)(CUdeviceptr, CUstream), cuMemFreeAsync_ptsz));
}

HOOK CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    PROLOGUE();
    CUresult rc = REAL(CUresult(*)(CUmemoryPool), cuMemPoolDestroy)(pool);
    if (rc != CUDA_SUCCESS || !accounting()) return rc;
    int n = __atomic_load_n(&g_npools, __ATOMIC_ACQUIRE);
    for (int i = 0; i < n; i++) {
        if (g_pools[i].pool != pool) continue;
        pthread_mutex_lock(&g_pools[i].mu);
        uncharge(g_pools[i].dev, g_pools[i].charged);
        g_pools[i].charged = 0;
        g_pools[i].pool = NULL;
        pthread_mutex_unlock(&g_pools[i].mu);
    }
    return rc;
}

HOOK CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
    PROLOGUE();
    CUresult rc = REAL(CUresult(*)(CUmemoryPool, size_t), cuMemPoolTrimTo)(pool, keep);
    if (rc == CUDA_SUCCESS && accounting()) reconcile_pools();
    return rc;
}

HOOK CUresult cuStreamSynchronize(CUstream s) {
    PROLOGUE();
    CUresult rc = REAL(CUresult(*)(CUstream), cuStreamSynchronize)(s);
    if (g_npools) reconcile_pools();
    return rc;
}
HOOK CUresult cuStreamSynchronize_ptsz(CUstream s) {
    PROLOGUE();
    CUresult rc = REAL(CUresult(*)(CUstream), cuStreamSynchronize_ptsz)(s);
    if (g_npools) reconcile_pools();
    return rc;
}
HOOK CUresult cuCtxSynchronize(void) {
    PROLOGUE();
    CUresult rc = REAL(CUresult(*)(void), cuCtxSynchronize)();
    if (g_npools) reconcile_pools();
    return rc;
}

/* ---- virtual memory management ----------------------------------------------------------------------
 * cuMemCreate with a device location is charged; the charge is released when the handle has been
 * released AND every mapping of it unmapped, which is when the driver frees the memory. */
struct vmm_rec { uint64_t handle, size; int dev; int maps; int released; int host; };
static pthread_mutex_t g_vmm_mu = PTHREAD_MUTEX_INITIALIZER;

HOOK CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                          unsigned long long flags) {
    PROLOGUE();
    CUresult (*real)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long) =
        REAL(CUresult(*)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long),
             cuMemCreate);
    int dev = accounting() && h && prop && size && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE
                  ? dev_index(prop->location.id) : -1;
    if (dev < 0) return real(h, size, prop, flags);
    struct vmm_rec *v = calloc(1, sizeof *v);
    if (!v) return CUDA_ERROR_OUT_OF_MEMORY;
    int host = 0;
    CUresult rc = reserve(dev, size, "cuMemCreate");
    if (rc != CUDA_SUCCESS && g_cfg.oversubscribe) {
        rc = spill_vmm(h, size, prop, flags, dev, "cuMemCreate");
        host = 1;
    } else if (rc == CUDA_SUCCESS) {
        rc = real(h, size, prop, flags);
        if (rc != CUDA_SUCCESS) uncharge(dev, size);
    }
    if (rc != CUDA_SUCCESS) {
        free(v);
        return rc;
    }
    *v = (struct vmm_rec){*h, size, dev, 0, 0, host};
    track(*h, size, dev, A_VMM_HANDLE, (uint64_t)(uintptr_t)v);
    return CUDA_SUCCESS;
}

/* The driver frees a VMM allocation once its handle is released and nothing maps it. Caller holds g_vmm_mu. */
static void vmm_maybe_done(struct vmm_rec *v) {
    if (!v->released || v->maps > 0) return;
    untrack(v->handle, NULL);
    if (v->host) uncharge_host(v->dev, v->size);
    else uncharge(v->dev, v->size);
    free(v);
}

HOOK CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    PROLOGUE();
    CUresult rc = REAL(CUresult(*)(CUmemGenericAllocationHandle), cuMemRelease)(h);
    ms_rec r;
    if (rc != CUDA_SUCCESS) return rc;
    pthread_mutex_lock(&g_vmm_mu);
    if (lookup(h, &r) && r.kind == A_VMM_HANDLE) {
        struct vmm_rec *v = (struct vmm_rec *)(uintptr_t)r.aux;
        v->released = 1;
        vmm_maybe_done(v);
    }
    pthread_mutex_unlock(&g_vmm_mu);
    return rc;
}

HOOK CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                       unsigned long long flags) {
    PROLOGUE();
    CUresult rc = REAL(CUresult(*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long),
                       cuMemMap)(ptr, size, offset, h, flags);
    ms_rec r;
    if (rc != CUDA_SUCCESS) return rc;
    pthread_mutex_lock(&g_vmm_mu);
    if (lookup(h, &r) && r.kind == A_VMM_HANDLE) {
        ((struct vmm_rec *)(uintptr_t)r.aux)->maps++;
        track(ptr, size, r.dev, A_VMM_MAP, r.aux);
    }
    pthread_mutex_unlock(&g_vmm_mu);
    return rc;
}

HOOK CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    PROLOGUE();
    CUresult rc = REAL(CUresult(*)(CUdeviceptr, size_t), cuMemUnmap)(ptr, size);
    ms_rec r;
    if (rc != CUDA_SUCCESS) return rc;
    pthread_mutex_lock(&g_vmm_mu);
    if (untrack(ptr, &r) && r.kind == A_VMM_MAP) {
        struct vmm_rec *v = (struct vmm_rec *)(uintptr_t)r.aux;
        v->maps--;
        vmm_maybe_done(v);
    }
    pthread_mutex_unlock(&g_vmm_mu);
    return rc;
}

/* ---- arrays: charged from the descriptor, corrected with cuArrayGetMemoryRequirements -------------- */
typedef struct { size_t size; size_t alignment; unsigned int reserved[4]; } array_reqs;

static void array_settle(int dev, CUdevice ord, uint64_t est, void *handle, int mipmap) {
    CUresult (*req)(array_reqs *, void *, CUdevice) =
        mipmap ? REAL(CUresult(*)(array_reqs *, void *, CUdevice), cuMipmappedArrayGetMemoryRequirements)
               : REAL(CUresult(*)(array_reqs *, void *, CUdevice), cuArrayGetMemoryRequirements);
    array_reqs q;
    uint64_t actual = est;
    if (req && req(&q, handle, ord) == CUDA_SUCCESS && q.size) actual = q.size;
    if (actual > est) force_charge(dev, actual - est);
    else if (actual < est) uncharge(dev, est - actual);
    track((uint64_t)(uintptr_t)handle, actual, dev, A_ARRAY, 0);
}

#define ARRAY_HOOK(name, desc_t, bytes_expr, mipmap, extra_params, extra_args)                             \
    HOOK CUresult name(void **h, const desc_t *d extra_params) {                                           \
        PROLOGUE();                                                                                        \
        CUresult (*real)(void **, const desc_t *extra_params) =                                            \
            REAL(CUresult(*)(void **, const desc_t *extra_params), name);                                  \
        CUdevice ord;                                                                                      \
        int dev = accounting() && h && d ? current_dev(&ord) : -1;                                         \
        if (dev < 0) return real(h, d extra_args);                                                         \
        uint64_t est = (bytes_expr);                                                                       \
        CUresult rc = reserve(dev, est, #name);                                                            \
        if (rc != CUDA_SUCCESS) return rc;                                                                 \
        rc = real(h, d extra_args);                                                                        \
        if (rc != CUDA_SUCCESS) uncharge(dev, est);                                                        \
        else array_settle(dev, ord, est, *h, mipmap);                                                      \
        return rc;                                                                                         \
    }
#define NOTHING
ARRAY_HOOK(cuArrayCreate_v2, CUDA_ARRAY_DESCRIPTOR, ms_array_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels),
           0, NOTHING, NOTHING)
ARRAY_HOOK(cuArrayCreate, CUDA_ARRAY_DESCRIPTOR_v1,
           ms_array_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels), 0, NOTHING, NOTHING)
ARRAY_HOOK(cuArray3DCreate_v2, CUDA_ARRAY3D_DESCRIPTOR,
           ms_array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels), 0, NOTHING, NOTHING)
ARRAY_HOOK(cuArray3DCreate, CUDA_ARRAY3D_DESCRIPTOR_v1,
           ms_array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels), 0, NOTHING, NOTHING)

HOOK CUresult cuMipmappedArrayCreate(void **h, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels) {
    PROLOGUE();
    CUresult (*real)(void **, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int) =
        REAL(CUresult(*)(void **, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int), cuMipmappedArrayCreate);
    CUdevice ord;
    int dev = accounting() && h && d ? current_dev(&ord) : -1;
    if (dev < 0) return real(h, d, levels);
    uint64_t est = ms_mipmap_bytes(d, levels);
    CUresult rc = reserve(dev, est, "cuMipmappedArrayCreate");
    if (rc != CUDA_SUCCESS) return rc;
    rc = real(h, d, levels);
    if (rc != CUDA_SUCCESS) uncharge(dev, est);
    else array_settle(dev, ord, est, *h, 1);
    return rc;
}

static CUresult array_destroy(void *h, CUresult (*real)(void *)) {
    ms_rec r;
    if (!h || !untrack((uint64_t)(uintptr_t)h, &r)) return real(h);
    CUresult rc = real(h);
    if (rc == CUDA_SUCCESS) uncharge(r.dev, r.size);
    else track(r.key, r.size, r.dev, (enum alloc_kind)r.kind, r.aux);
    return rc;
}
HOOK CUresult cuArrayDestroy(void *h) { PROLOGUE(); return array_destroy(h, REAL(CUresult(*)(void *), cuArrayDestroy)); }
HOOK CUresult cuMipmappedArrayDestroy(void *h) {
    PROLOGUE();
    return array_destroy(h, REAL(CUresult(*)(void *), cuMipmappedArrayDestroy));
}

/* ---- prefetch: a spilled managed range stays on the host -----------------------------------------------
 * Prefetching migrates pages whatever their preferred location, so an application prefetching its managed
 * memory to the GPU would pull spilled pages into HBM past the quota. For spilled ranges a prefetch to a
 * device is answered with success and not performed (the data stays reachable from the GPU through the
 * ACCESSED_BY mapping); everything else goes to the driver. */
static int spilled_managed(CUdeviceptr p) {
    ms_rec r;
    return accounting() && g_cfg.oversubscribe && lookup_range(p, &r) && r.kind == A_SPILL_MANAGED;
}

HOOK CUresult cuMemPrefetchAsync(CUdeviceptr p, size_t n, CUdevice dst, CUstream s) {
    PROLOGUE();
    if (dst >= 0 && spilled_managed(p)) return CUDA_SUCCESS;
    return REAL(CUresult(*)(CUdeviceptr, size_t, CUdevice, CUstream), cuMemPrefetchAsync)(p, n, dst, s);
}
HOOK CUresult cuMemPrefetchAsync_ptsz(CUdeviceptr p, size_t n, CUdevice dst, CUstream s) {
    PROLOGUE();
    if (dst >= 0 && spilled_managed(p)) return CUDA_SUCCESS;
    return REAL(CUresult(*)(CUdeviceptr, size_t, CUdevice, CUstream), cuMemPrefetchAsync_ptsz)(p, n, dst, s);
}
HOOK CUresult cuMemPrefetchAsync_v2(CUdeviceptr p, size_t n, CUmemLocation loc, unsigned int flags, CUstream s) {
    PROLOGUE();
    if (loc.type == CU_MEM_LOCATION_TYPE_DEVICE && spilled_managed(p)) return CUDA_SUCCESS;
    return REAL(CUresult(*)(CUdeviceptr, size_t, CUmemLocation, unsigned int, CUstream), cuMemPrefetchAsync_v2)(
        p, n, loc, flags, s);
}
HOOK CUresult cuMemPrefetchAsync_v2_ptsz(CUdeviceptr p, size_t n, CUmemLocation loc, unsigned int flags, CUstream s) {
    PROLOGUE();
    if (loc.type == CU_MEM_LOCATION_TYPE_DEVICE && spilled_managed(p)) return CUDA_SUCCESS;
    return REAL(CUresult(*)(CUdeviceptr, size_t, CUmemLocation, unsigned int, CUstream), cuMemPrefetchAsync_v2_ptsz)(
        p, n, loc, flags, s);
}

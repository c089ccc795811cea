/* Hooks for stream-ordered allocation: memory pools, their allocations and frees, and the synchronisation
 * points where a pool's charge follows its reservation down. */
#define _GNU_SOURCE
#include <pthread.h>

#include "place.h"


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

/* The shim's record of a pool, created on first use (lock-free lookup; creation under g_pools_mu). */
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

/* What the driver says the pool reserves on the device now. 0, or -1 if it cannot say. */
static int pool_reserved(CUmemoryPool pool, uint64_t *out) {
    __auto_type get = REAL(cuMemPoolGetAttribute);
    cuuint64_t v = 0;
    if (!get || get(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v) != CUDA_SUCCESS) return -1;
    *out = v;
    return 0;
}

/* Make the pool's charge equal its reservation. Caller holds pr->mu. */
static void reconcile_locked(struct pool_rec *pr) {
    uint64_t r;
    if (pool_reserved(pr->pool, &r) < 0) return;
    quota_settle(pr->dev, pr->charged, r);
    pr->charged = r;
}

/* Make every known pool's charge equal its reservation (after synchronisation, trims, cuMemGetInfo). */
void reconcile_pools(void) {
    int n = __atomic_load_n(&g_npools, __ATOMIC_ACQUIRE);
    for (int i = 0; i < n; i++) {
        if (!g_pools[i].pool) continue;
        pthread_mutex_lock(&g_pools[i].mu);
        if (g_pools[i].pool) reconcile_locked(&g_pools[i]);
        pthread_mutex_unlock(&g_pools[i].mu);
    }
}

/* One stream-ordered allocation call as the application made it: from the current pool (cuMemAllocAsync*,
 * fa) or from a given pool (cuMemAllocFromPoolAsync*, fp). */
struct pool_call {
    __typeof__(&cuMemAllocAsync) fa;
    __typeof__(&cuMemAllocFromPoolAsync) fp;
    CUmemoryPool pool;
    CUstream stream;
};

/* The driver's allocation, exactly as the application asked for it. */
static CUresult pool_driver(const struct pool_call *c, CUdeviceptr *dptr, size_t n) {
    return c->fp ? c->fp(dptr, n, c->pool, c->stream) : c->fa(dptr, n, c->stream);
}

/* The pool record an allocation placed on region device `dev` is charged to (the device's current pool for
 * cuMemAllocAsync), or NULL when the shim does not account for it (no pool, table full). */
static struct pool_rec *charged_pool(struct pool_call *c, CUdevice ord, int dev) {
    if (!c->pool) {
        __auto_type getpool = REAL(cuDeviceGetMemPool);
        if (!getpool || getpool(&c->pool, ord) != CUDA_SUCCESS) return NULL;
    }
    return pool_rec(c->pool, dev);
}

/* Charge n bytes for a pool that may grow by that much; when the quota is reached, the pool's cached
 * blocks are given back first and its charge follows (caller holds pr->mu). `quiet`: a refusal spills. */
static CUresult pool_charge(struct pool_rec *pr, int dev, size_t n, const char *call, int quiet) {
    if (quota_charge(dev, n, call, QUOTA_QUIET) == CUDA_SUCCESS) return CUDA_SUCCESS;
    __auto_type trim = REAL(cuMemPoolTrimTo);
    if (trim) trim(pr->pool, 0);
    reconcile_locked(pr);
    return quota_charge(dev, n, call, quiet);
}

/* Whether the stream is being captured into a graph. */
static int capturing(CUstream s) {
    __auto_type is_cap = REAL(cuStreamIsCapturing);
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    return is_cap && is_cap(s, &status) == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* Past the quota a stream-ordered allocation spills, except while its stream is being captured: freeing a
 * spilled block needs a synchronize, which would break the graph. */
static CUresult pool_spill(CUdeviceptr *dptr, size_t n, int dev, CUdevice ord, CUstream s, const char *call) {
    if (s && capturing(s)) {
        quota_refuse(dev, n, call);
        shim_log(LOG_WARN, "memslice: %s: not spilled to host memory because the stream is being captured", call);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return spill_alloc(dptr, n, dev, ord, call);
}

/* A stream-ordered allocation: charge, allocate, then set the pool's charge to what it really reserves. */
static CUresult pooled_alloc(CUdeviceptr *dptr, size_t n, struct pool_call c, const char *call) {
    CUdevice ord;
    struct placement p = place_current(dptr && n, n, PLACE_CAN_SPILL, &ord);
    if (p.to == PLACE_REFUSE) return CUDA_ERROR_OUT_OF_MEMORY;
    struct pool_rec *pr = p.to == PLACE_DRIVER ? NULL : charged_pool(&c, ord, p.dev);
    if (!pr) return pool_driver(&c, dptr, n);
    int dev = p.dev;
    pthread_mutex_lock(&pr->mu);
    CUresult rc = pool_charge(pr, dev, p.charge, call, p.spill);
    if (rc != CUDA_SUCCESS) {
        pthread_mutex_unlock(&pr->mu);
        return p.spill ? pool_spill(dptr, n, dev, ord, c.stream, call) : rc;
    }
    rc = pool_driver(&c, dptr, n);
    if (rc != CUDA_SUCCESS) {
        quota_uncharge(dev, n);
    } else {
        pr->charged += n;
        reconcile_locked(pr);
        track(*dptr, n, dev, A_POOL, (uint64_t)(uintptr_t)pr);
    }
    pthread_mutex_unlock(&pr->mu);
    return rc;
}

/* Stream-ordered allocation from the device's current pool. */
HOOK CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr *d, size_t n, CUstream s) {
    PROLOGUE();
    return pooled_alloc(d, n, (struct pool_call){.fa = REAL(cuMemAllocAsync), .stream = s}, "cuMemAllocAsync");
}
/* Per-thread-default-stream variant of cuMemAllocAsync. */
HOOK CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *d, size_t n, CUstream s) {
    PROLOGUE();
    return pooled_alloc(d, n, (struct pool_call){.fa = REAL(cuMemAllocAsync_ptsz), .stream = s},
                        "cuMemAllocAsync_ptsz");
}
/* Stream-ordered allocation from an explicit pool. */
HOOK CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s) {
    PROLOGUE();
    return pooled_alloc(d, n, (struct pool_call){.fp = REAL(cuMemAllocFromPoolAsync), .pool = p, .stream = s},
                        "cuMemAllocFromPoolAsync");
}
/* Per-thread-default-stream variant of cuMemAllocFromPoolAsync. */
HOOK CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s) {
    PROLOGUE();
    return pooled_alloc(d, n, (struct pool_call){.fp = REAL(cuMemAllocFromPoolAsync_ptsz), .pool = p, .stream = s},
                        "cuMemAllocFromPoolAsync_ptsz");
}

/* Stream-ordered free: pool memory stays charged to its pool; other memory is released. */
static CUresult free_async(CUdeviceptr p, CUstream s, __typeof__(&cuMemFreeAsync) real) {
    ms_rec r;
    if (!p || !untrack(p, &r)) return real(p, s);
    if (r.kind == A_SPILL_HOST || r.kind == A_SPILL_MANAGED || r.kind == A_SPILL_MAPPED) return spill_free(&r, s, 1);
    if (r.kind == A_ELASTIC) return elastic_free(&r); /* synchronises first, as a stream-ordered free must */
    CUresult rc = real(p, s);
    if (rc != CUDA_SUCCESS) {
        track(r.key, r.size, r.dev, (enum alloc_kind)r.kind, r.aux);
        return rc;
    }
    /* Pool memory stays reserved by the pool (reconciled later); cuMemAlloc memory is released. */
    if (r.kind != A_POOL) quota_uncharge(r.dev, r.size);
    return CUDA_SUCCESS;
}
/* Stream-ordered free. */
HOOK CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr p, CUstream s) {
    PROLOGUE();
    return free_async(p, s, REAL(cuMemFreeAsync));
}
/* Per-thread-default-stream variant of cuMemFreeAsync. */
HOOK CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) {
    PROLOGUE();
    return free_async(p, s, REAL(cuMemFreeAsync_ptsz));
}

/* A destroyed pool gives back everything it reserved: its whole charge goes. */
HOOK CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool pool) {
    PROLOGUE();
    CUresult rc = REAL(cuMemPoolDestroy)(pool);
    if (rc != CUDA_SUCCESS || !accounting()) return rc;
    int n = __atomic_load_n(&g_npools, __ATOMIC_ACQUIRE);
    for (int i = 0; i < n; i++) {
        if (g_pools[i].pool != pool) continue;
        pthread_mutex_lock(&g_pools[i].mu);
        quota_uncharge(g_pools[i].dev, g_pools[i].charged);
        g_pools[i].charged = 0;
        g_pools[i].pool = NULL;
        pthread_mutex_unlock(&g_pools[i].mu);
    }
    return rc;
}

/* A trim releases reserved memory: the charges follow it down. */
HOOK CUresult CUDAAPI cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
    PROLOGUE();
    CUresult rc = REAL(cuMemPoolTrimTo)(pool, keep);
    if (rc == CUDA_SUCCESS && accounting()) reconcile_pools();
    return rc;
}

/* Synchronisation is when pools release memory above their threshold: charges follow. */
HOOK CUresult CUDAAPI cuStreamSynchronize(CUstream s) {
    PROLOGUE();
    CUresult rc = REAL(cuStreamSynchronize)(s);
    if (g_npools) reconcile_pools();
    return rc;
}
/* Per-thread-default-stream variant of cuStreamSynchronize. */
HOOK CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream s) {
    PROLOGUE();
    CUresult rc = REAL(cuStreamSynchronize_ptsz)(s);
    if (g_npools) reconcile_pools();
    return rc;
}
/* Context-wide synchronisation: pools may shrink, as for cuStreamSynchronize. */
HOOK CUresult CUDAAPI cuCtxSynchronize(void) {
    PROLOGUE();
    CUresult rc = REAL(cuCtxSynchronize)();
    if (g_npools) reconcile_pools();
    return rc;
}
/* CUDA 13's variant of cuCtxSynchronize, for a given context (what cudaDeviceSynchronize of a CUDA 13 runtime
 * reaches through cuGetProcAddress): the same reconciliation. */
HOOK CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx) {
    PROLOGUE();
    __auto_type real = REAL(cuCtxSynchronize_v2);
    if (!real) return CUDA_ERROR_NOT_SUPPORTED;
    CUresult rc = real(ctx);
    if (g_npools) reconcile_pools();
    return rc;
}

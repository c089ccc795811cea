/* Hooks for stream-ordered allocation: memory pools, their allocations and frees, and the synchronisation
 * points where a pool's charge follows its reservation down. */
#define _GNU_SOURCE
#include <pthread.h>

#include "shim.h"


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

typedef __typeof__(&cuMemAllocAsync) async_fn;
typedef __typeof__(&cuMemAllocFromPoolAsync) frompool_fn;

static CUresult pooled_alloc(CUdeviceptr *dptr, size_t n, CUmemoryPool pool, CUstream s, async_fn fa,
                             frompool_fn fp, const char *call) {
    CUdevice ord;
    int dev = accounting() && dptr && n ? current_dev(&ord) : -1;
    if (dev >= 0 && !pool) {
        __auto_type getpool = REAL(cuDeviceGetMemPool);
        if (!getpool || getpool(&pool, ord) != CUDA_SUCCESS) dev = -1;
    }
    struct pool_rec *pr = dev >= 0 ? pool_rec(pool, dev) : NULL;
    if (!pr) return fp ? fp(dptr, n, pool, s) : fa(dptr, n, s);
    pthread_mutex_lock(&pr->mu);
    CUresult rc = try_charge(dev, n) == 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    if (rc != CUDA_SUCCESS) { /* give the pool's cached blocks back, then try again */
        __auto_type trim = REAL(cuMemPoolTrimTo);
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

HOOK CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr *d, size_t n, CUstream s) {
    PROLOGUE();
    return pooled_alloc(d, n, NULL, s, REAL(cuMemAllocAsync), NULL, "cuMemAllocAsync");
}
HOOK CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *d, size_t n, CUstream s) {
    PROLOGUE();
    return pooled_alloc(d, n, NULL, s, REAL(cuMemAllocAsync_ptsz), NULL, "cuMemAllocAsync_ptsz");
}
HOOK CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s) {
    PROLOGUE();
    return pooled_alloc(d, n, p, s, NULL, REAL(cuMemAllocFromPoolAsync), "cuMemAllocFromPoolAsync");
}
HOOK CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s) {
    PROLOGUE();
    return pooled_alloc(d, n, p, s, NULL, REAL(cuMemAllocFromPoolAsync_ptsz),
                        "cuMemAllocFromPoolAsync_ptsz");
}

static CUresult free_async(CUdeviceptr p, CUstream s, __typeof__(&cuMemFreeAsync) real) {
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
HOOK CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr p, CUstream s) {
    PROLOGUE();
    return free_async(p, s, REAL(cuMemFreeAsync));
}
HOOK CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) {
    PROLOGUE();
    return free_async(p, s, REAL(cuMemFreeAsync_ptsz));
}

HOOK CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool pool) {
    PROLOGUE();
    CUresult rc = REAL(cuMemPoolDestroy)(pool);
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

HOOK CUresult CUDAAPI cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
    PROLOGUE();
    CUresult rc = REAL(cuMemPoolTrimTo)(pool, keep);
    if (rc == CUDA_SUCCESS && accounting()) reconcile_pools();
    return rc;
}

HOOK CUresult CUDAAPI cuStreamSynchronize(CUstream s) {
    PROLOGUE();
    CUresult rc = REAL(cuStreamSynchronize)(s);
    if (g_npools) reconcile_pools();
    return rc;
}
HOOK CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream s) {
    PROLOGUE();
    CUresult rc = REAL(cuStreamSynchronize_ptsz)(s);
    if (g_npools) reconcile_pools();
    return rc;
}
HOOK CUresult CUDAAPI cuCtxSynchronize(void) {
    PROLOGUE();
    CUresult rc = REAL(cuCtxSynchronize)();
    if (g_npools) reconcile_pools();
    return rc;
}

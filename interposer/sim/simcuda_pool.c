/* Simulated driver: stream-ordered allocation (memory pools with reserved vs used memory). */
#define _GNU_SOURCE
#include <stdlib.h>

#include "simcuda.h"

/* ---- stream-ordered allocation (memory pools) ---------------------------------------------------- */
static struct sim_pool *as_pool(CUmemoryPool p) {
    struct sim_pool *x = (struct sim_pool *)p;
    return x && x->magic == POOL_MAGIC ? x : NULL;
}

/* Give cached (freed) blocks back to the device until the pool reserves at most `keep` bytes. */
void trim_pool(struct sim_pool *p, uint64_t keep) {
    struct pool_block **pb = &p->cached;
    while (*pb && p->reserved > keep) {
        struct pool_block *b = *pb;
        *pb = b->next;
        ms_rec r = {.key = b->ptr, .size = b->size, .dev = p->dev};
        sim_release(&r);
        p->reserved -= b->size;
        free(b);
    }
}

/* A cached (freed, still reserved) block of exactly n bytes, taken out of the pool's cache; 0 if none.
 * Caller holds g_mu. */
static uint64_t take_cached(struct sim_pool *p, size_t n) {
    for (struct pool_block **pb = &p->cached; *pb; pb = &(*pb)->next) {
        if ((*pb)->size != n) continue;
        struct pool_block *hit = *pb;
        uint64_t ptr = hit->ptr;
        *pb = hit->next;
        free(hit);
        return ptr;
    }
    return 0;
}

/* Grow the pool by n bytes of new device memory; a real pool frees its cache before failing. Caller holds
 * g_mu. */
static CUresult grow_pool(struct sim_pool *p, size_t n, CUdeviceptr *dptr) {
    if (p->max_size && p->reserved + n > p->max_size) return CUDA_ERROR_OUT_OF_MEMORY;
    struct sim *s = S();
    if (sim_charge(s, p->dev, n, 0) < 0) {
        trim_pool(p, 0);
        if (sim_charge(s, p->dev, n, 0) < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    }
    void *mem = backing_alloc(n);
    if (!mem) {
        sim_uncharge(s, p->dev, n, 0);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    p->reserved += n;
    if (p->reserved > p->reserved_high) p->reserved_high = p->reserved;
    *dptr = (CUdeviceptr)(uintptr_t)mem;
    return CUDA_SUCCESS;
}

/* Allocate n bytes from pool p: a cached block of that size if there is one, else new reserved memory. */
static CUresult pool_alloc(CUdeviceptr *dptr, size_t n, struct sim_pool *p) {
    NEED_CTX();
    if (!dptr || n == 0 || !p) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = CUDA_SUCCESS;
    uint64_t cached = take_cached(p, n);
    if (cached) *dptr = cached;
    else rc = grow_pool(p, n, dptr);
    if (rc == CUDA_SUCCESS) {
        ms_rec r = {.key = *dptr, .size = n, .dev = p->dev, .kind = K_POOL, .aux = (uint64_t)(uintptr_t)p};
        ms_ptrmap_put(&g_ptrs, &r);
        p->used += n;
        if (p->used > p->used_high) p->used_high = p->used;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* Stream-ordered allocation from the current pool of the context's device (streams are not modelled). */
API CUresult cuMemAllocAsync(CUdeviceptr *d, size_t n, CUstream s) {
    NEED_CTX();
    (void)s;
    return pool_alloc(d, n, g_current_pool[t_ctx->dev]);
}
/* The per-thread-default-stream variant of cuMemAllocAsync: the same call. */
API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *d, size_t n, CUstream s) { return cuMemAllocAsync(d, n, s); }
/* Stream-ordered allocation from an explicit pool. */
API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *d, size_t n, CUmemoryPool pool, CUstream s) {
    (void)s;
    if (!as_pool(pool)) return CUDA_ERROR_INVALID_VALUE;
    return pool_alloc(d, n, as_pool(pool));
}
/* Per-thread-default-stream variant of cuMemAllocFromPoolAsync. */
API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *d, size_t n, CUmemoryPool pool, CUstream s) {
    return cuMemAllocFromPoolAsync(d, n, pool, s);
}

/* Stream-ordered free: pool memory stays reserved in its pool until a synchronize or trim. */
API CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream s) {
    NEED_INIT();
    (void)s;
    ms_rec r;
    if (!ms_ptrmap_get(&g_ptrs, ptr, &r)) return CUDA_ERROR_INVALID_VALUE;
    if (r.kind == K_MANAGED) return CUDA_ERROR_INVALID_VALUE; /* documented: not for managed memory */
    if (r.kind == K_DEVICE) return free_ptr(ptr);            /* allowed for cuMemAlloc memory */
    if (r.kind != K_POOL) return CUDA_ERROR_INVALID_VALUE;
    ms_ptrmap_take(&g_ptrs, ptr, &r);
    struct sim_pool *p = (struct sim_pool *)(uintptr_t)r.aux;
    struct pool_block *b = malloc(sizeof *b);
    pthread_mutex_lock(&g_mu);
    p->used -= r.size;
    if (b) {
        *b = (struct pool_block){r.key, r.size, p->cached};
        p->cached = b; /* stays reserved until a synchronize trims the pool */
    } else {
        sim_release(&r);
        p->reserved -= r.size;
    }
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}
/* The per-thread-default-stream variant of cuMemFreeAsync: the same call. */
API CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { return cuMemFreeAsync(p, s); }

/* An explicit pool on a device (maxSize honoured). */
API CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    NEED_INIT();
    if (!pool || !props || props->location.type != CU_MEM_LOCATION_TYPE_DEVICE || !valid_dev(props->location.id))
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_pool *p = calloc(1, sizeof *p);
    if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
    *p = (struct sim_pool){.magic = POOL_MAGIC, .dev = props->location.id, .max_size = props->maxSize};
    *pool = (CUmemoryPool)p;
    return CUDA_SUCCESS;
}
/* Destroy an explicit pool: everything it reserves goes back to the device. */
API CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    NEED_INIT();
    struct sim_pool *p = as_pool(pool);
    if (!p || p == &g_default_pool[p->dev]) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    trim_pool(p, 0);
    if (g_current_pool[p->dev] == p) g_current_pool[p->dev] = &g_default_pool[p->dev];
    p->magic = 0;
    pthread_mutex_unlock(&g_mu);
    free(p);
    return CUDA_SUCCESS;
}
/* The device's default pool. */
API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice d) {
    NEED_INIT();
    if (!pool || !valid_dev(d)) return CUDA_ERROR_INVALID_VALUE;
    *pool = (CUmemoryPool)&g_default_pool[d];
    return CUDA_SUCCESS;
}
/* The device's current pool (what cuMemAllocAsync uses). */
API CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice d) {
    NEED_INIT();
    if (!pool || !valid_dev(d)) return CUDA_ERROR_INVALID_VALUE;
    *pool = (CUmemoryPool)g_current_pool[d];
    return CUDA_SUCCESS;
}
/* Make a pool of that device its current pool. */
API CUresult cuDeviceSetMemPool(CUdevice d, CUmemoryPool pool) {
    NEED_INIT();
    struct sim_pool *p = as_pool(pool);
    if (!p || !valid_dev(d) || p->dev != d) return CUDA_ERROR_INVALID_VALUE;
    g_current_pool[d] = p;
    return CUDA_SUCCESS;
}
/* Release cached blocks until the pool reserves at most `keep` bytes. */
API CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
    NEED_INIT();
    struct sim_pool *p = as_pool(pool);
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    trim_pool(p, keep);
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}
/* Release threshold, and resets of the high-water marks; other attributes accepted. */
API CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute a, void *v) {
    NEED_INIT();
    struct sim_pool *p = as_pool(pool);
    if (!p || !v) return CUDA_ERROR_INVALID_VALUE;
    if (a == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) p->threshold = *(cuuint64_t *)v;
    else if (a == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) p->reserved_high = p->reserved;
    else if (a == CU_MEMPOOL_ATTR_USED_MEM_HIGH) p->used_high = p->used;
    else if (a < 1 || a > 8) return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}
/* The pool's threshold, reserved and used memory and their high-water marks. */
API CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute a, void *v) {
    NEED_INIT();
    struct sim_pool *p = as_pool(pool);
    if (!p || !v) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    cuuint64_t x = 0;
    switch (a) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: x = p->threshold; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: x = p->reserved; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: x = p->reserved_high; break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: x = p->used; break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: x = p->used_high; break;
    default: *(int *)v = 1; pthread_mutex_unlock(&g_mu); return CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_mu);
    *(cuuint64_t *)v = x;
    return CUDA_SUCCESS;
}

/* Every pool down to its release threshold, as a synchronisation does on a real device. */
void trim_all_pools(void) {
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < SIM_MAX_GPUS; i++) trim_pool(&g_default_pool[i], g_default_pool[i].threshold);
    for (int i = 0; i < SIM_MAX_GPUS; i++)
        if (g_current_pool[i] != &g_default_pool[i]) trim_pool(g_current_pool[i], g_current_pool[i]->threshold);
    pthread_mutex_unlock(&g_mu);
}

/* Simulated driver: plain and pitched device allocations, their frees, and the memory info. */
#define _GNU_SOURCE
#include <limits.h>
#include <sys/mman.h>

#include "simcuda.h"

/* ---- device allocations ---------------------------------------------------------------------------- */
API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t n) {
    NEED_CTX();
    if (!dptr || n == 0) return CUDA_ERROR_INVALID_VALUE;
    return sim_alloc(dptr, n, t_ctx->dev, K_DEVICE, 0, 0);
}

/* v1: 32-bit pointers. Served from the low 4 GiB (MAP_32BIT) so the address fits, as old drivers did. */
API CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int n) {
    NEED_CTX();
    if (!dptr || n == 0) return CUDA_ERROR_INVALID_VALUE;
#ifdef MAP_32BIT
    struct sim *s = S();
    int dev = t_ctx->dev;
    if (sim_charge(s, dev, n, 0) < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_32BIT, -1, 0);
    if (p == MAP_FAILED) { sim_uncharge(s, dev, n, 0); return CUDA_ERROR_OUT_OF_MEMORY; }
    ms_rec r = {.key = (uint64_t)(uintptr_t)p, .size = n, .dev = dev, .kind = K_DEVICE, .aux = 1};
    ms_ptrmap_put(&g_ptrs, &r);
    *dptr = (CUdeviceptr_v1)(uintptr_t)p;
    return CUDA_SUCCESS;
#else
    return CUDA_ERROR_NOT_SUPPORTED;
#endif
}

/* Pitched allocation: rows padded to 512 bytes, like the real pitch; element sizes 4, 8 or 16. */
API CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t w, size_t h, unsigned int elem) {
    NEED_CTX();
    if (!dptr || !pitch || w == 0 || h == 0 || (elem != 4 && elem != 8 && elem != 16)) return CUDA_ERROR_INVALID_VALUE;
    size_t p = (w + 511) & ~(size_t)511; /* rows padded to 512 bytes, like the real driver's pitch */
    CUresult rc = sim_alloc(dptr, (uint64_t)p * h, t_ctx->dev, K_DEVICE, 0, 0);
    if (rc == CUDA_SUCCESS) *pitch = p;
    return rc;
}

/* Legacy 32-bit pitched allocation, from the low 4 GiB like cuMemAlloc. */
API CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int w, unsigned int h,
                             unsigned int elem) {
    NEED_CTX();
    if (!dptr || !pitch) return CUDA_ERROR_INVALID_VALUE;
    unsigned int p = (w + 511) & ~511u;
    CUdeviceptr_v1 d;
    CUresult rc = cuMemAlloc(&d, p * h);
    (void)elem;
    if (rc == CUDA_SUCCESS) { *dptr = d; *pitch = p; }
    return rc;
}

/* Free device or managed memory (v1 low mappings included); stream-ordered memory is refused. */
CUresult free_ptr(uint64_t ptr) {
    if (ptr == 0) return CUDA_SUCCESS;
    ms_rec r;
    if (!ms_ptrmap_get(&g_ptrs, ptr, &r)) return CUDA_ERROR_INVALID_VALUE;
    if (r.kind != K_DEVICE && r.kind != K_MANAGED && r.kind != K_POOL) return CUDA_ERROR_INVALID_VALUE;
    if (r.kind == K_POOL) return CUDA_ERROR_INVALID_VALUE; /* stream-ordered memory: cuMemFreeAsync */
    ms_ptrmap_take(&g_ptrs, ptr, &r);
    if (r.kind == K_DEVICE && r.aux == 1) { /* v1 low mapping */
        munmap((void *)(uintptr_t)r.key, r.size);
        sim_uncharge(S(), r.dev, r.size, 0);
        return CUDA_SUCCESS;
    }
    sim_release(&r);
    return CUDA_SUCCESS;
}

/* Free device or managed memory. */
API CUresult cuMemFree_v2(CUdeviceptr p) { NEED_INIT(); return free_ptr(p); }
/* Legacy 32-bit free. */
API CUresult cuMemFree(CUdeviceptr_v1 p) { NEED_INIT(); return free_ptr(p); }

/* ---- memory info ------------------------------------------------------------------------------------ */
API CUresult cuMemGetInfo_v2(size_t *freeb, size_t *total) {
    NEED_CTX();
    if (!freeb || !total) return CUDA_ERROR_INVALID_VALUE;
    struct sim *s = S();
    uint64_t cap = s->node->gpu[sim_phys(t_ctx->dev)].total;
    uint64_t used = sim_used(s, t_ctx->dev);
    *total = cap;
    *freeb = used < cap ? cap - used : 0;
    return CUDA_SUCCESS;
}
/* Legacy 32-bit memory info, clamped to 4 GiB. */
API CUresult cuMemGetInfo(unsigned int *freeb, unsigned int *total) {
    size_t f, t;
    CUresult rc = cuMemGetInfo_v2(&f, &t);
    if (rc == CUDA_SUCCESS) {
        *freeb = f > UINT_MAX ? UINT_MAX : (unsigned int)f;
        *total = t > UINT_MAX ? UINT_MAX : (unsigned int)t;
    }
    return rc;
}

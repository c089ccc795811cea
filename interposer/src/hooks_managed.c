/* Hooks for managed (unified) memory: its allocation, charged as device memory, and prefetches, which must
 * not pull a spilled range back into device memory. */
#define _GNU_SOURCE
#include "place.h"

/* Managed allocation: charged in full, since every page may migrate to the GPU. */
HOOK CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr *dptr, size_t n, unsigned int flags) {
    PROLOGUE();
    __auto_type real = REAL(cuMemAllocManaged);
    CUdevice ord;
    struct placement p = place_current(dptr && n, n, PLACE_CAN_SPILL, &ord);
    if (p.to == PLACE_DRIVER) return real(dptr, n, flags);
    if (p.to == PLACE_REFUSE) return CUDA_ERROR_OUT_OF_MEMORY;
    /* Managed pages may all migrate to the GPU, so they are charged as device memory. */
    CUresult rc = quota_charge(p.dev, p.charge, "cuMemAllocManaged", p.spill);
    if (rc != CUDA_SUCCESS)
        return p.spill ? spill_alloc_managed(dptr, n, flags, p.dev, ord, "cuMemAllocManaged") : rc;
    rc = real(dptr, n, flags);
    if (rc != CUDA_SUCCESS || track(*dptr, n, p.dev, A_MANAGED, 0) < 0) quota_uncharge(p.dev, p.charge);
    return rc;
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

/* Prefetch to a device ordinal (CUDA 8-12 signature). */
HOOK CUresult CUDAAPI cuMemPrefetchAsync(CUdeviceptr p, size_t n, CUdevice dst, CUstream s) {
    PROLOGUE();
    if (dst >= 0 && spilled_managed(p)) return CUDA_SUCCESS;
    return REAL(cuMemPrefetchAsync)(p, n, dst, s);
}
/* Per-thread-default-stream variant of cuMemPrefetchAsync. */
HOOK CUresult CUDAAPI cuMemPrefetchAsync_ptsz(CUdeviceptr p, size_t n, CUdevice dst, CUstream s) {
    PROLOGUE();
    if (dst >= 0 && spilled_managed(p)) return CUDA_SUCCESS;
    return REAL(cuMemPrefetchAsync_ptsz)(p, n, dst, s);
}
/* Prefetch to a location (CUDA 12.2+ signature). */
HOOK CUresult CUDAAPI cuMemPrefetchAsync_v2(CUdeviceptr p, size_t n, CUmemLocation loc, unsigned int flags,
                                             CUstream s) {
    PROLOGUE();
    if (loc.type == CU_MEM_LOCATION_TYPE_DEVICE && spilled_managed(p)) return CUDA_SUCCESS;
    return REAL(cuMemPrefetchAsync_v2)(p, n, loc, flags, s);
}
/* Per-thread-default-stream variant of cuMemPrefetchAsync_v2. */
HOOK CUresult CUDAAPI cuMemPrefetchAsync_v2_ptsz(CUdeviceptr p, size_t n, CUmemLocation loc, unsigned int flags,
                                                  CUstream s) {
    PROLOGUE();
    if (loc.type == CU_MEM_LOCATION_TYPE_DEVICE && spilled_managed(p)) return CUDA_SUCCESS;
    return REAL(cuMemPrefetchAsync_v2_ptsz)(p, n, loc, flags, s);
}

/* Simulated driver: managed memory, its residency (advice and prefetch). */
#define _GNU_SOURCE
#include "simcuda.h"

/* Residency model for managed memory. A real driver populates managed pages where they are first touched
 * and migrates them on access; the simulator runs no kernels, so a managed range is host-resident from
 * allocation and becomes device-resident when it is prefetched to a GPU or advised to prefer one, and
 * host-resident again when prefetched or advised to the CPU. Device- and host-resident bytes are counted
 * separately in the node's region. */
API CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t n, unsigned int flags) {
    NEED_CTX();
    if (!dptr || n == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)) return CUDA_ERROR_INVALID_VALUE;
    return sim_alloc(dptr, n, t_ctx->dev, K_MANAGED, 1, 0);
}

/* Move a managed range's residency (the whole allocation: the simulator does not split ranges). */
static CUresult migrate(CUdeviceptr p, size_t n, int to_host) {
    ms_rec r;
    if (!ms_ptrmap_find_range(&g_ptrs, p, &r) || r.kind != K_MANAGED || n > r.size) return CUDA_ERROR_INVALID_VALUE;
    if (to_host == rec_host(&r)) return CUDA_SUCCESS;
    struct sim *s = S();
    if (sim_charge(s, r.dev, r.size, to_host) < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    sim_uncharge(s, r.dev, r.size, !to_host);
    ms_ptrmap_take(&g_ptrs, r.key, &r);
    r.aux = (r.aux & ~(1ull << 63)) | ((uint64_t)to_host << 63);
    ms_ptrmap_put(&g_ptrs, &r);
    return CUDA_SUCCESS;
}

/* cuMemAdvise: SET_PREFERRED_LOCATION (3) moves residency to that location; other advice (including
 * ACCESSED_BY, which maps without migrating) is accepted and leaves residency alone. */
static CUresult advise(CUdeviceptr p, size_t n, int advice, int to_host, int to_device) {
    NEED_INIT();
    ms_rec r;
    if (!ms_ptrmap_find_range(&g_ptrs, p, &r) || r.kind != K_MANAGED || n > r.size) return CUDA_ERROR_INVALID_VALUE;
    if (advice != 3) return CUDA_SUCCESS;
    if (!to_host && !to_device) return CUDA_ERROR_INVALID_VALUE;
    return migrate(p, n, to_host);
}
/* Advice for a device ordinal (CU_DEVICE_CPU = -1 is the host). */
API CUresult cuMemAdvise(CUdeviceptr p, size_t n, CUmem_advise advice, CUdevice dev) {
    return advise(p, n, advice, dev == -1, dev >= 0);
}
/* Whether a location is host memory (any of the host location types). */
static int host_loc(CUmemLocation loc) {
    return loc.type == CU_MEM_LOCATION_TYPE_HOST || loc.type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
           loc.type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
}
/* Advice for a location (CUDA 12.2+). */
API CUresult cuMemAdvise_v2(CUdeviceptr p, size_t n, CUmem_advise advice, CUmemLocation loc) {
    return advise(p, n, advice, host_loc(loc), loc.type == CU_MEM_LOCATION_TYPE_DEVICE);
}

/* Prefetch migrates: to a device (dstDevice >= 0) or to the CPU (CU_DEVICE_CPU = -1). */
API CUresult cuMemPrefetchAsync(CUdeviceptr p, size_t n, CUdevice dst, CUstream s) {
    NEED_INIT();
    (void)s;
    if (dst != -1 && !valid_dev(dst)) return CUDA_ERROR_INVALID_DEVICE;
    return migrate(p, n, dst == -1);
}
/* The per-thread-default-stream variant of cuMemPrefetchAsync: the same call. */
API CUresult cuMemPrefetchAsync_ptsz(CUdeviceptr p, size_t n, CUdevice dst, CUstream s) {
    return cuMemPrefetchAsync(p, n, dst, s);
}
/* Prefetch to a location (CUDA 12.2+): migrates the range there. */
API CUresult cuMemPrefetchAsync_v2(CUdeviceptr p, size_t n, CUmemLocation loc, unsigned int flags, CUstream s) {
    NEED_INIT();
    (void)s;
    if (flags) return CUDA_ERROR_INVALID_VALUE;
    if (loc.type == CU_MEM_LOCATION_TYPE_DEVICE && !valid_dev(loc.id)) return CUDA_ERROR_INVALID_DEVICE;
    return migrate(p, n, host_loc(loc));
}
/* The per-thread-default-stream variant of cuMemPrefetchAsync_v2: the same call. */
API CUresult cuMemPrefetchAsync_v2_ptsz(CUdeviceptr p, size_t n, CUmemLocation loc, unsigned int flags, CUstream s) {
    return cuMemPrefetchAsync_v2(p, n, loc, flags, s);
}

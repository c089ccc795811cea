/* Simulated driver: pointer attributes and address ranges. */
#define _GNU_SOURCE
#include "simcuda.h"

/* ---- pointer attributes ------------------------------------------------------------------------------ */
API CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
    NEED_INIT();
    ms_rec r;
    if (!ms_ptrmap_find_range(&g_ptrs, p, &r) || r.kind == K_REGISTERED || r.kind == K_HOST) return CUDA_ERROR_NOT_FOUND;
    if (base) *base = r.key;
    if (size) *size = r.size;
    return CUDA_SUCCESS;
}

/* One attribute of the allocation containing p (as the real driver answers it). */
API CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr p) {
    NEED_INIT();
    ms_rec r;
    if (!data) return CUDA_ERROR_INVALID_VALUE;
    if (!ms_ptrmap_find_range(&g_ptrs, p, &r)) return CUDA_ERROR_INVALID_VALUE;
    int host = r.kind == K_HOST || r.kind == K_REGISTERED;
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned int *)data = host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE; break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(int *)data = r.kind == K_MANAGED; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = r.dev; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)data = p; break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (!host && r.kind != K_MANAGED) return CUDA_ERROR_INVALID_VALUE;
        *(void **)data = (void *)(uintptr_t)p;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = r.key; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = r.size; break;
    case CU_POINTER_ATTRIBUTE_MAPPED: *(int *)data = 1; break;
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = (CUcontext)&g_primary[r.dev]; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

/* Several attributes at once; stops at the first that fails. */
API CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute *attrs, void **data, CUdeviceptr p) {
    for (unsigned int i = 0; i < n; i++) {
        CUresult rc = cuPointerGetAttribute(data[i], attrs[i], p);
        if (rc) return rc;
    }
    return CUDA_SUCCESS;
}

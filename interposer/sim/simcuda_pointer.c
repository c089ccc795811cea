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

/* Whether a record is host memory (pinned or registered). */
static int is_host(const ms_rec *r) { return r->kind == K_HOST || r->kind == K_REGISTERED; }

/* The 32-bit attributes: memory type, managed, device ordinal, mapped. 1 if attr is one of them. */
static int int_attribute(CUpointer_attribute attr, const ms_rec *r, void *data) {
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = is_host(r) ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
        return 1;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(int *)data = r->kind == K_MANAGED; return 1;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = r->dev; return 1;
    case CU_POINTER_ATTRIBUTE_MAPPED: *(int *)data = 1; return 1;
    default: return 0;
    }
}

/* The pointer-sized attributes: addresses, range, context (host pointer: host or managed memory only). */
static CUresult addr_attribute(CUpointer_attribute attr, const ms_rec *r, CUdeviceptr p, void *data) {
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)data = p; break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (!is_host(r) && r->kind != K_MANAGED) return CUDA_ERROR_INVALID_VALUE;
        *(void **)data = (void *)(uintptr_t)p;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = r->key; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = r->size; break;
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = (CUcontext)&g_primary[r->dev]; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

/* One attribute of the allocation containing p (as the real driver answers it). */
API CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr p) {
    NEED_INIT();
    ms_rec r;
    if (!data || !ms_ptrmap_find_range(&g_ptrs, p, &r)) return CUDA_ERROR_INVALID_VALUE;
    return int_attribute(attr, &r, data) ? CUDA_SUCCESS : addr_attribute(attr, &r, p, data);
}

/* Several attributes at once; stops at the first that fails. */
API CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute *attrs, void **data, CUdeviceptr p) {
    for (unsigned int i = 0; i < n; i++) {
        CUresult rc = cuPointerGetAttribute(data[i], attrs[i], p);
        if (rc) return rc;
    }
    return CUDA_SUCCESS;
}

/* Simulated driver: pinned and registered host memory. */
#define _GNU_SOURCE
#include "simcuda.h"

/* ---- host memory ------------------------------------------------------------------------------------ */
API CUresult cuMemHostAlloc(void **pp, size_t n, unsigned int flags) {
    NEED_CTX();
    if (!pp || n == 0 || flags > 7) return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr d;
    CUresult rc = sim_alloc(&d, n, t_ctx->dev, K_HOST, 1, flags);
    if (rc == CUDA_SUCCESS) {
        *pp = (void *)(uintptr_t)d;
        sim_count(SIM_C_PINS, n);
    }
    return rc;
}
/* The newer variant of cuMemHostAlloc: the same call. */
API CUresult cuMemAllocHost_v2(void **pp, size_t n) { return cuMemHostAlloc(pp, n, 0); }
/* The legacy variant of cuMemHostAlloc: the same call. */
API CUresult cuMemAllocHost(void **pp, unsigned int n) { return cuMemHostAlloc(pp, n, 0); }

/* Free pinned host memory from cuMemHostAlloc. */
API CUresult cuMemFreeHost(void *p) {
    NEED_INIT();
    ms_rec r;
    if (!ms_ptrmap_get(&g_ptrs, (uint64_t)(uintptr_t)p, &r) || r.kind != K_HOST) return CUDA_ERROR_INVALID_VALUE;
    ms_ptrmap_take(&g_ptrs, r.key, &r);
    sim_release(&r);
    return CUDA_SUCCESS;
}

/* The device address of pinned or registered host memory: the same address (unified addressing). */
API CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned int flags) {
    NEED_INIT();
    ms_rec r;
    if (!d || flags != 0 || !ms_ptrmap_find_range(&g_ptrs, (uint64_t)(uintptr_t)p, &r) ||
        (r.kind != K_HOST && r.kind != K_REGISTERED))
        return CUDA_ERROR_INVALID_VALUE;
    *d = (CUdeviceptr)(uintptr_t)p; /* unified addressing: the same address */
    return CUDA_SUCCESS;
}
/* Legacy 32-bit variant of cuMemHostGetDevicePointer_v2. */
API CUresult cuMemHostGetDevicePointer(CUdeviceptr_v1 *d, void *p, unsigned int flags) {
    CUdeviceptr x;
    CUresult rc = cuMemHostGetDevicePointer_v2(&x, p, flags);
    if (rc == CUDA_SUCCESS) *d = (CUdeviceptr_v1)x;
    return rc;
}

/* Record a host range as registered (page-locked) memory; no device memory is charged. */
API CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned int flags) {
    NEED_CTX();
    (void)flags;
    if (!p || n == 0) return CUDA_ERROR_INVALID_VALUE;
    ms_rec r = {.key = (uint64_t)(uintptr_t)p, .size = n, .dev = t_ctx->dev, .kind = K_REGISTERED};
    if (ms_ptrmap_put(&g_ptrs, &r)) return CUDA_ERROR_OUT_OF_MEMORY;
    sim_count(SIM_C_PINS, n);
    return CUDA_SUCCESS;
}
/* The legacy variant of cuMemHostRegister_v2: the same call. */
API CUresult cuMemHostRegister(void *p, size_t n, unsigned int flags) { return cuMemHostRegister_v2(p, n, flags); }
/* Forget a registered host range. */
API CUresult cuMemHostUnregister(void *p) {
    NEED_INIT();
    ms_rec r;
    if (!ms_ptrmap_get(&g_ptrs, (uint64_t)(uintptr_t)p, &r) || r.kind != K_REGISTERED) return CUDA_ERROR_INVALID_VALUE;
    ms_ptrmap_take(&g_ptrs, r.key, &r);
    return CUDA_SUCCESS;
}

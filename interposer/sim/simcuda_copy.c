/* Simulated driver: copies and sets (all memory is host memory here). */
#define _GNU_SOURCE
#include <string.h>

#include "simcuda.h"

/* ---- copies and sets (all memory is host memory here) -------------------------------------------- */
API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    NEED_INIT();
    if ((!dst || !src) && n) return CUDA_ERROR_INVALID_VALUE;
    if (n) memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}
/* The per-thread-default-stream variant of cuMemcpy: the same call. */
API CUresult cuMemcpy_ptds(CUdeviceptr d, CUdeviceptr s, size_t n) { return cuMemcpy(d, s, n); }
/* Host to device copy (a memmove here). */
API CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *h, size_t n) { return cuMemcpy(d, (CUdeviceptr)(uintptr_t)h, n); }
/* The per-thread-default-stream variant of cuMemcpyHtoD_v2: the same call. */
API CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr d, const void *h, size_t n) { return cuMemcpyHtoD_v2(d, h, n); }
/* Device to host copy (a memmove here). */
API CUresult cuMemcpyDtoH_v2(void *h, CUdeviceptr d, size_t n) { return cuMemcpy((CUdeviceptr)(uintptr_t)h, d, n); }
/* The per-thread-default-stream variant of cuMemcpyDtoH_v2: the same call. */
API CUresult cuMemcpyDtoH_v2_ptds(void *h, CUdeviceptr d, size_t n) { return cuMemcpyDtoH_v2(h, d, n); }
/* Device to device copy. */
API CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) { return cuMemcpy(d, s, n); }
/* Asynchronous copy: synchronous here. */
API CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { (void)st; return cuMemcpy(d, s, n); }
/* The per-thread-default-stream variant of cuMemcpyAsync: the same call. */
API CUresult cuMemcpyAsync_ptsz(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { return cuMemcpyAsync(d, s, n, st); }
/* Asynchronous host to device copy: synchronous here. */
API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t n, CUstream st) { (void)st; return cuMemcpyHtoD_v2(d, h, n); }
/* Asynchronous device to host copy: synchronous here. */
API CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t n, CUstream st) { (void)st; return cuMemcpyDtoH_v2(h, d, n); }
/* Set n bytes. */
API CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) {
    NEED_INIT();
    if (!d && n) return CUDA_ERROR_INVALID_VALUE;
    memset((void *)(uintptr_t)d, v, n);
    return CUDA_SUCCESS;
}
/* The per-thread-default-stream variant of cuMemsetD8_v2: the same call. */
API CUresult cuMemsetD8_v2_ptds(CUdeviceptr d, unsigned char v, size_t n) { return cuMemsetD8_v2(d, v, n); }
/* Set n 32-bit words. */
API CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned int v, size_t n) {
    NEED_INIT();
    if (!d && n) return CUDA_ERROR_INVALID_VALUE;
    unsigned int *p = (unsigned int *)(uintptr_t)d;
    for (size_t i = 0; i < n; i++) p[i] = v;
    return CUDA_SUCCESS;
}

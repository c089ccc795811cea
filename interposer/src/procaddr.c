/* cuGetProcAddress routing. libcudart, cuda-python, PyTorch and NCCL obtain driver functions through
 * cuGetProcAddress[_v2] rather than by symbol, so the shim answers it: it asks the real driver (with the
 * caller's exact name, cudaVersion and flags, so the driver applies its own version and per-thread-stream
 * rules), maps the returned address back to the exact exported name, and substitutes the wrapper of that
 * name. The caller therefore always gets a wrapper with the ABI of the variant it asked for, and
 * symbolStatus is the driver's own. Unknown names, "" and cuGetExportTable pass through untouched. */
#define _GNU_SOURCE
#include "shim.h"

/* CUDA 12+ entry point of libcudart and PyTorch: the real answer, with our wrapper substituted. */
HOOK CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                  CUdriverProcAddressQueryResult *status) {
    ensure_init();
    __auto_type real = REAL(cuGetProcAddress_v2);
    if (!real) return CUDA_ERROR_NOT_SUPPORTED;
    CUresult rc = real(symbol, pfn, cudaVersion, flags, status);
    if (rc == CUDA_SUCCESS && pfn && *pfn) {
        void *h = hook_for_real(*pfn);
        if (h) *pfn = h;
    }
    return rc;
}

/* CUDA 11.3-11.8 signature (no symbolStatus), same routing. */
HOOK CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    ensure_init();
    __auto_type real = REAL(cuGetProcAddress);
    if (!real) return CUDA_ERROR_NOT_SUPPORTED;
    CUresult rc = real(symbol, pfn, cudaVersion, flags);
    if (rc == CUDA_SUCCESS && pfn && *pfn) {
        void *h = hook_for_real(*pfn);
        if (h) *pfn = h;
    }
    return rc;
}

/* Compiled (never run) by `make -C interposer check`: the prototypes of include/cuda_api.h bind the shim.
 * As is, this compiles; with -DBAD_HOOK (a hook whose signature differs from the driver's) or -DBAD_CALL
 * (a call through REAL() with arguments the driver's function does not take) it must not. */
#include "shim.h"

#ifdef BAD_HOOK
/* cuMemAlloc_v2 takes a size_t: an unsigned int here would truncate every request above 4 GiB. */
HOOK CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, unsigned int n);
#else
HOOK CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t n);
#endif

/* A call to the driver's cuMemFree_v2 through REAL(), typed from its prototype. */
CUresult free_through_real(CUdeviceptr p);
CUresult free_through_real(CUdeviceptr p) {
#ifdef BAD_CALL
    return REAL(cuMemFree_v2)(&p); /* a pointer where the driver takes a CUdeviceptr */
#else
    return REAL(cuMemFree_v2)(p);
#endif
}

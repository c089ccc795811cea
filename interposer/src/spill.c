/* Oversubscription: serve allocations past the quota from host memory. (Filled in by the
 * oversubscription work; until then a spill is a refusal.) */
#define _GNU_SOURCE
#include "shim.h"

CUresult spill_alloc(CUdeviceptr *dptr, uint64_t n, int dev, CUdevice ordinal, CUstream stream, const char *call) {
    (void)dptr; (void)ordinal; (void)stream;
    refuse(dev, n, call);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult spill_free(const ms_rec *r, CUstream stream, int async) {
    (void)r; (void)stream; (void)async;
    return CUDA_ERROR_INVALID_VALUE;
}

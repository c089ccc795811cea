/* Allocates through the driver API by direct symbol binding (cuda.h style names), as a C/C++ program
 * linked against libcuda does. Usage: alloc_direct MiB [MiB...]: allocates each size in turn, prints one
 * line per step, then the memory info, then frees everything. Exit code 0 unless the driver misbehaves. */
#include <stdio.h>
#include <stdlib.h>

#include "cuda_api.h"

int main(int argc, char **argv) {
    CUdevice dev;
    CUcontext ctx;
    CUresult rc = cuInit(0);
    printf("init %d\n", rc);
    if (rc) return 3;
    if (cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) { printf("ctx failed\n"); return 4; }
    CUdeviceptr p[64];
    int n = 0;
    for (int i = 1; i < argc && n < 64; i++) {
        size_t sz = (size_t)strtoull(argv[i], NULL, 10) << 20;
        rc = cuMemAlloc_v2(&p[n], sz);
        printf("alloc %s MiB -> %d\n", argv[i], rc);
        if (rc == CUDA_SUCCESS) {
            unsigned v = 0xabcd1234, back = 0;
            cuMemcpyHtoD_v2(p[n], &v, sizeof v);
            cuMemcpyDtoH_v2(&back, p[n], sizeof back);
            if (back != v) { printf("data mismatch\n"); return 5; }
            n++;
        }
    }
    size_t f, t, tm;
    cuMemGetInfo_v2(&f, &t);
    cuDeviceTotalMem_v2(&tm, dev);
    printf("info free=%zu total=%zu devtotal=%zu\n", f >> 20, t >> 20, tm >> 20);
    for (int i = 0; i < n; i++) if (cuMemFree_v2(p[i])) { printf("free failed\n"); return 6; }
    cuMemGetInfo_v2(&f, &t);
    printf("after free=%zu total=%zu\n", f >> 20, t >> 20);
    return 0;
}

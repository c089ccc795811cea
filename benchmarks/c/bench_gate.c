/* Cost of one gated driver call on the simulated driver: run without the shim, with it (no elastic mode: one
 * predictable branch) and in elastic mode (the gate's counters). The entry point is one of the first gated
 * ones (cuMemsetD8_v2 of 1 byte) or one gated later (cuMemsetD2D8Async of 1 x 1 byte, cuMemcpy2D_v2 of
 * 1 x 1 byte device to device): the same gate, so the same cost is expected.
 * Usage: bench_gate CALLS [set8|set2d8async|copy2d]   prints "ns_per_call X". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_api.h"

/* Time CALLS calls of one entry point on one device allocation. */
int main(int argc, char **argv) {
    long calls = argc > 1 ? atol(argv[1]) : 1000000;
    const char *which = argc > 2 ? argv[2] : "set8";
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate_v2(&ctx, 0, dev) || cuMemAlloc_v2(&p, 1 << 20)) return 1;
    CUDA_MEMCPY2D c;
    memset(&c, 0, sizeof c);
    c.srcMemoryType = c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    c.srcDevice = p; c.dstDevice = p + 64; c.srcPitch = c.dstPitch = 64; c.WidthInBytes = c.Height = 1;
    int mode = strcmp(which, "set2d8async") == 0 ? 1 : strcmp(which, "copy2d") == 0 ? 2 : 0;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < calls; i++) {
        if (mode == 0) cuMemsetD8_v2(p, (unsigned char)i, 1);
        else if (mode == 1) cuMemsetD2D8Async(p, 64, (unsigned char)i, 1, 1, NULL);
        else cuMemcpy2D_v2(&c);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) / (double)calls;
    printf("ns_per_call %.2f\n", ns);
    return 0;
}

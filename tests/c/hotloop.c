/* The shim's hot path, for counting its system calls: after a warm-up, N cuMemAlloc_v2 + cuMemFree_v2 pairs
 * of MiB each between two getppid() calls, which mark the loop's start and end in a trace (nothing else in
 * the process calls getppid). Usage: hotloop N MiB. Prints "pairs=<ok pairs>". */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cuda_api.h"

/* `n` alloc+free pairs of `size` bytes; how many both succeeded. */
static int pairs(int n, size_t size) {
    int ok = 0;
    for (int i = 0; i < n; i++) {
        CUdeviceptr p;
        if (cuMemAlloc_v2(&p, size) == CUDA_SUCCESS && cuMemFree_v2(p) == CUDA_SUCCESS) ok++;
    }
    return ok;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    int n = atoi(argv[1]);
    size_t size = (size_t)strtoull(argv[2], NULL, 10) << 20;
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) return 3;
    pairs(100, size); /* warm-up: the slot claimed, the region opened, the driver's tables grown */
    (void)getppid();
    int ok = pairs(n, size);
    (void)getppid();
    printf("pairs=%d\n", ok);
    return 0;
}

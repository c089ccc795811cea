/* Cost of one gated driver call (cuMemsetD8_v2 of 1 byte on the simulated driver): run without the shim,
 * with it (no elastic mode: one predictable branch) and in elastic mode (the gate's counters).
 * Usage: bench_gate CALLS   prints "ns_per_call X". */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cuda_api.h"

/* Time CALLS one-byte sets on one device allocation. */
int main(int argc, char **argv) {
    long calls = argc > 1 ? atol(argv[1]) : 1000000;
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate_v2(&ctx, 0, dev) || cuMemAlloc_v2(&p, 1 << 20)) return 1;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < calls; i++) cuMemsetD8_v2(p, (unsigned char)i, 1);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) / (double)calls;
    printf("ns_per_call %.2f\n", ns);
    return 0;
}

/* A GPU-time client for the compute share (issue 33): launches a `spin` kernel that occupies the GPU for a
 * given number of nanoseconds, back to back (saturating) or one at a time with a pause (latency mode), for a
 * given time, and prints key=value figures. The same program runs on the simulated GPU (any image: the
 * simulator's `spin` takes its first uint64 parameter as nanoseconds of GPU time) and on a real GPU (the PTX
 * below spins on %globaltimer).
 *   spin SECONDS KERNEL_US [PAUSE_US]     PAUSE_US given: latency mode (each launch synchronised and timed)
 * Output: launches=N wall_s=S, then in latency mode p50_us= p99_us= max_us=. Exit 0, or 1 with a message. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_api.h"

CUresult CUDAAPI cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name); /* as in cuda.h */

static const char PTX[] =
    ".version 7.0\n.target sm_70\n.address_size 64\n"
    ".visible .entry spin(.param .u64 ns)\n{\n"
    "  .reg .u64 %rd<5>;\n  .reg .pred %p1;\n"
    "  ld.param.u64 %rd1, [ns];\n  mov.u64 %rd2, %globaltimer;\n"
    "LOOP:\n  mov.u64 %rd3, %globaltimer;\n  sub.u64 %rd4, %rd3, %rd2;\n"
    "  setp.lt.u64 %p1, %rd4, %rd1;\n  @%p1 bra LOOP;\n  ret;\n}\n";

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int check(CUresult rc, const char *what) {
    if (rc == CUDA_SUCCESS) return 0;
    fprintf(stderr, "spin: %s failed: %d\n", what, rc);
    exit(1);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: spin SECONDS KERNEL_US [PAUSE_US]\n");
        return 1;
    }
    double seconds = atof(argv[1]);
    uint64_t ns = (uint64_t)(atof(argv[2]) * 1000.0);
    int latency = argc > 3;
    double pause_us = latency ? atof(argv[3]) : 0;
    unsigned grid = getenv("SPIN_GRID") ? (unsigned)atoi(getenv("SPIN_GRID")) : 1;
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    check(cuInit(0), "cuInit");
    check(cuDeviceGet(&dev, 0), "cuDeviceGet");
    check(cuCtxCreate_v2(&ctx, 0, dev), "cuCtxCreate");
    check(cuModuleLoadData(&mod, PTX), "cuModuleLoadData");
    check(cuModuleGetFunction(&f, mod, "spin"), "cuModuleGetFunction");
    size_t cap = latency ? (size_t)(seconds * 1e6 / (pause_us + 1)) + 16 : 1;
    double *lat = calloc(cap, sizeof *lat);
    uint64_t launches = 0;
    double t0 = now_s(), end = t0 + seconds;
    printf("started=1\n");
    fflush(stdout);
    while (now_s() < end) {
        void *params[] = {&ns};
        double a = now_s();
        check(cuLaunchKernel(f, grid, 1, 1, 128, 1, 1, 0, NULL, params, NULL), "cuLaunchKernel");
        launches++;
        if (!latency) continue;
        check(cuCtxSynchronize(), "cuCtxSynchronize");
        if (launches <= cap) lat[launches - 1] = (now_s() - a) * 1e6;
        struct timespec p = {0, (long)(pause_us * 1000)};
        nanosleep(&p, NULL);
    }
    check(cuCtxSynchronize(), "cuCtxSynchronize");
    printf("launches=%llu wall_s=%.3f\n", (unsigned long long)launches, now_s() - t0);
    if (latency && launches) {
        size_t n = launches < cap ? launches : cap;
        qsort(lat, n, sizeof *lat, cmp_double);
        printf("p50_us=%.1f p99_us=%.1f max_us=%.1f\n", lat[n / 2], lat[(size_t)(n * 0.99)], lat[n - 1]);
    }
    return 0;
}

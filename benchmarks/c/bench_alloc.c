/* Times alloc+free pairs through the driver API. THREADS threads each do PAIRS cuMemAlloc_v2 +
 * cuMemFree_v2 of SIZE bytes (after a warm-up), released together; prints the wall time per pair per
 * thread in ns. Usage: bench_alloc THREADS PAIRS SIZE [async]  ("async": cuMemAllocAsync/cuMemFreeAsync) */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_abi.h"

CUresult cuInit(unsigned int);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);

static CUcontext g_ctx;
static long g_pairs;
static size_t g_size;
static int g_async;
static pthread_barrier_t g_start;
static long g_failed;

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }

static void *worker(void *arg) {
    (void)arg;
    cuCtxSetCurrent(g_ctx);
    CUdeviceptr p;
    for (int i = 0; i < 1000; i++) { /* warm-up: tables sized, pages touched */
        if (cuMemAlloc_v2(&p, g_size) == CUDA_SUCCESS) cuMemFree_v2(p);
    }
    pthread_barrier_wait(&g_start);
    for (long i = 0; i < g_pairs; i++) {
        CUresult rc = g_async ? cuMemAllocAsync(&p, g_size, NULL) : cuMemAlloc_v2(&p, g_size);
        if (rc != CUDA_SUCCESS) { __atomic_add_fetch(&g_failed, 1, __ATOMIC_RELAXED); continue; }
        if (g_async) cuMemFreeAsync(p, NULL); else cuMemFree_v2(p);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    int threads = atoi(argv[1]);
    g_pairs = atol(argv[2]);
    g_size = (size_t)atol(argv[3]);
    g_async = argc > 4 && strcmp(argv[4], "async") == 0;
    CUdevice dev;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&g_ctx, dev)) { printf("setup failed\n"); return 3; }
    /* all processes of a contended run start together: wait for a line on stdin */
    printf("ready\n");
    fflush(stdout);
    char go[16];
    if (!fgets(go, sizeof go, stdin)) return 0;
    pthread_barrier_init(&g_start, NULL, (unsigned)threads + 1);
    pthread_t t[64];
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, worker, NULL);
    pthread_barrier_wait(&g_start);
    double t0 = now();
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    double ns = now() - t0;
    printf("ns_per_pair=%.1f failed=%ld\n", ns / (double)g_pairs, g_failed);
    return g_failed ? 1 : 0;
}

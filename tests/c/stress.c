/* Multi-threaded allocation stress: THREADS threads allocate and free blocks of random size (up to
 * MAX_MiB) at random for SECONDS, writing and checking a pattern in each block. Prints totals.
 * It creates its context, prints "ready", and starts when a line arrives on stdin.
 * Usage: stress THREADS SECONDS MAX_MiB SEED */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_api.h"

static CUcontext g_ctx;
static double g_seconds;
static unsigned g_max_mib;
static long g_ok, g_refused, g_other, g_corrupt;

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }

static void *worker(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    cuCtxSetCurrent(g_ctx);
    CUdeviceptr held[8] = {0};
    unsigned expect[8] = {0};
    double end = now() + g_seconds;
    while (now() < end) {
        int i = rand_r(&seed) % 8;
        if (held[i]) {
            if (*(volatile unsigned *)(uintptr_t)held[i] != expect[i]) __atomic_add_fetch(&g_corrupt, 1, __ATOMIC_RELAXED);
            cuMemFree_v2(held[i]);
            held[i] = 0;
        } else {
            size_t sz = ((size_t)(rand_r(&seed) % g_max_mib) + 1) << 20;
            CUresult rc = cuMemAlloc_v2(&held[i], sz);
            if (rc == CUDA_SUCCESS) {
                expect[i] = (unsigned)rand_r(&seed);
                *(volatile unsigned *)(uintptr_t)held[i] = expect[i];
                __atomic_add_fetch(&g_ok, 1, __ATOMIC_RELAXED);
            } else {
                held[i] = 0;
                __atomic_add_fetch(rc == CUDA_ERROR_OUT_OF_MEMORY ? &g_refused : &g_other, 1, __ATOMIC_RELAXED);
            }
        }
    }
    for (int i = 0; i < 8; i++) if (held[i]) cuMemFree_v2(held[i]);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 5) return 2;
    int threads = atoi(argv[1]);
    g_seconds = atof(argv[2]);
    g_max_mib = (unsigned)atoi(argv[3]);
    unsigned seed = (unsigned)atoi(argv[4]);
    CUdevice dev;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&g_ctx, dev)) { printf("setup failed\n"); return 3; }
    /* every process holds its context before anyone starts allocating: wait for a line on stdin */
    printf("ready\n");
    fflush(stdout);
    char go[16];
    if (!fgets(go, sizeof go, stdin)) return 0;
    pthread_t t[64];
    for (int i = 0; i < threads && i < 64; i++) pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(seed * 64 + i + 1));
    printf("started\n");
    fflush(stdout);
    for (int i = 0; i < threads && i < 64; i++) pthread_join(t[i], NULL);
    printf("ok=%ld refused=%ld other=%ld corrupt=%ld\n", g_ok, g_refused, g_other, g_corrupt);
    return g_other || g_corrupt ? 1 : 0;
}

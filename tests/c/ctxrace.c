/* Contexts created while other threads allocate (issue 35 item 7). THREADS threads keep the quota full with
 * 16 MiB blocks (allocating until refused, then freeing one and allocating again), while the main thread
 * creates and destroys contexts (cuCtxCreate_v2, cuCtxDestroy_v2; ROUNDS of them, once the quota is full). A shim that charged a
 * context only after the driver made it would let the simulated GPU's physical memory pass the quota by
 * a context for a moment, each time; the test reads the simulator's own high-water mark.
 * Prints contexts=<made> refused=<refused by the shim> other=<unexpected results> allocs=<successes>.
 * Usage: ctxrace THREADS ROUNDS */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_api.h"

static CUcontext g_primary;
static volatile int g_done, g_full;
static long g_allocs, g_other;

/* Keep the quota full: allocate until refused, then free the oldest block and go on. */
static void *filler(void *arg) {
    (void)arg;
    CUdeviceptr held[128] = {0};
    unsigned n = 0, head = 0;
    cuCtxSetCurrent(g_primary);
    while (!g_done) {
        CUdeviceptr p;
        CUresult rc = cuMemAlloc_v2(&p, 16u << 20);
        if (rc == CUDA_SUCCESS && n < 128) {
            held[(head + n++) % 128] = p;
            __atomic_add_fetch(&g_allocs, 1, __ATOMIC_RELAXED);
        } else if (rc == CUDA_SUCCESS) {
            cuMemFree_v2(p);
        } else if (rc != CUDA_ERROR_OUT_OF_MEMORY) {
            __atomic_add_fetch(&g_other, 1, __ATOMIC_RELAXED);
        }
        if (rc == CUDA_ERROR_OUT_OF_MEMORY) g_full = 1;
        if (rc != CUDA_SUCCESS && n) { /* full: make room for the next round */
            cuMemFree_v2(held[head]);
            head = (head + 1) % 128;
            n--;
        }
    }
    for (; n; n--, head = (head + 1) % 128) cuMemFree_v2(held[head]);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    int threads = atoi(argv[1]), rounds = atoi(argv[2]);
    CUdevice dev;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&g_primary, dev)) { printf("setup failed\n"); return 3; }
    cuCtxSetCurrent(g_primary);
    pthread_t t[16];
    for (int i = 0; i < threads && i < 16; i++) pthread_create(&t[i], NULL, filler, NULL);
    long made = 0, refused = 0;
    while (!g_full) sched_yield(); /* the contexts start once the fillers have filled the quota */
    for (int r = 0; r < rounds; r++) {
        CUcontext c;
        CUresult rc = cuCtxCreate_v2(&c, 0, dev);
        if (rc == CUDA_SUCCESS) {
            made++;
            cuCtxDestroy_v2(c);
        } else if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
            refused++;
        } else {
            g_other++;
        }
    }
    g_done = 1;
    for (int i = 0; i < threads && i < 16; i++) pthread_join(t[i], NULL);
    printf("contexts=%ld refused=%ld other=%ld allocs=%ld\n", made, refused, g_other, g_allocs);
    return 0;
}

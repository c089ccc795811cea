/* Times allocations and frees through the driver API. THREADS threads each do PAIRS cuMemAlloc_v2 +
 * cuMemFree_v2 of SIZE bytes (after a warm-up), in batches of 16 allocations then 16 frees, released
 * together; prints, per thread, the wall time per pair and the time spent allocating and freeing per call
 * (ns). Usage: bench_alloc THREADS PAIRS SIZE MODE BATCH   MODE: sync (cuMemAlloc_v2/cuMemFree_v2) or
 * async (cuMemAllocAsync/cuMemFreeAsync); BATCH: allocations made before they are freed (1..16). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_api.h"

static CUcontext g_ctx;
static long g_pairs;
static size_t g_size;
static int g_async, g_batch;
static pthread_barrier_t g_start;
static long g_failed;
static double g_alloc_ns, g_free_ns; /* summed over threads */
static pthread_mutex_t g_sum_mu = PTHREAD_MUTEX_INITIALIZER;

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }

static void *worker(void *arg) {
    (void)arg;
    cuCtxSetCurrent(g_ctx);
    CUdeviceptr p;
    for (int i = 0; i < 1000; i++) { /* warm-up: tables sized, pages touched */
        if (cuMemAlloc_v2(&p, g_size) == CUDA_SUCCESS) cuMemFree_v2(p);
    }
    pthread_barrier_wait(&g_start);
    CUdeviceptr batch[16];
    double alloc_ns = 0, free_ns = 0;
    for (long i = 0; i < g_pairs; i += g_batch) {
        int n = 0;
        double t0 = now();
        for (int k = 0; k < g_batch; k++) {
            CUresult rc = g_async ? cuMemAllocAsync(&batch[n], g_size, NULL) : cuMemAlloc_v2(&batch[n], g_size);
            if (rc == CUDA_SUCCESS) n++;
            else __atomic_add_fetch(&g_failed, 1, __ATOMIC_RELAXED);
        }
        double t1 = now();
        for (int k = 0; k < n; k++) {
            if (g_async) cuMemFreeAsync(batch[k], NULL); else cuMemFree_v2(batch[k]);
        }
        double t2 = now();
        alloc_ns += t1 - t0;
        free_ns += t2 - t1;
    }
    (void)p;
    pthread_mutex_lock(&g_sum_mu);
    g_alloc_ns += alloc_ns;
    g_free_ns += free_ns;
    pthread_mutex_unlock(&g_sum_mu);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    int threads = atoi(argv[1]);
    g_pairs = atol(argv[2]);
    g_size = (size_t)atol(argv[3]);
    g_async = argc > 4 && strcmp(argv[4], "async") == 0;
    g_batch = argc > 5 ? atoi(argv[5]) : 1;
    if (g_batch < 1 || g_batch > 16) g_batch = 1;
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
    long pairs = (g_pairs + g_batch - 1) / g_batch * g_batch;
    printf("ns_per_pair=%.1f alloc_ns=%.1f free_ns=%.1f failed=%ld\n", ns / (double)pairs,
           g_alloc_ns / threads / (double)pairs, g_free_ns / threads / (double)pairs, g_failed);
    return g_failed ? 1 : 0;
}

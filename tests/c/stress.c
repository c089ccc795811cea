/* Multi-threaded allocation stress: THREADS threads allocate and free blocks of random size (up to
 * MAX_MiB) at random for SECONDS, writing and checking a pattern in each block. Prints totals, and the
 * longest any one cuMemAlloc_v2/cuMemFree_v2 call took (maxcall_us): the bound the shim documents for a
 * call waiting on the region (MS_CALL_WAIT_MS) is checked against it.
 * A call during which this process itself was stopped (SIGSTOP, by the test) is not counted: a heartbeat
 * thread ticks every millisecond, and a call is left out (excluded=) when the heartbeat did not tick for
 * 50 ms somewhere inside it, i.e. when the whole process stood still, not just the calling thread.
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
static long g_ok, g_refused, g_other, g_corrupt, g_excluded;
static long g_maxcall_ns;
static long g_beat_ns;       /* the heartbeat's last tick */
static long g_stall_end_ns;  /* end of the latest stall (>= 50 ms without a tick) the heartbeat saw */
static volatile int g_done;

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static long now_ns(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000L + t.tv_nsec; }

/* Ticks every millisecond; a gap of 50 ms or more means the whole process was stopped (or starved). */
static void *heartbeat(void *arg) {
    (void)arg;
    while (!g_done) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
        long t = now_ns(), prev = __atomic_exchange_n(&g_beat_ns, t, __ATOMIC_SEQ_CST);
        if (t - prev >= 50000000L) __atomic_store_n(&g_stall_end_ns, t, __ATOMIC_SEQ_CST);
    }
    return NULL;
}

/* Record how long a call that started at t0 took, unless the process stood still meanwhile. */
static void timed(long t0) {
    long t1 = now_ns();
    if (__atomic_load_n(&g_stall_end_ns, __ATOMIC_SEQ_CST) >= t0 || t1 - __atomic_load_n(&g_beat_ns, __ATOMIC_SEQ_CST) >= 50000000L) {
        __atomic_add_fetch(&g_excluded, 1, __ATOMIC_RELAXED);
        return;
    }
    long d = t1 - t0, cur = __atomic_load_n(&g_maxcall_ns, __ATOMIC_RELAXED);
    while (d > cur && !__atomic_compare_exchange_n(&g_maxcall_ns, &cur, d, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
}

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
            long t0 = now_ns();
            cuMemFree_v2(held[i]);
            timed(t0);
            held[i] = 0;
        } else {
            size_t sz = ((size_t)(rand_r(&seed) % g_max_mib) + 1) << 20;
            long t0 = now_ns();
            CUresult rc = cuMemAlloc_v2(&held[i], sz);
            timed(t0);
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
    pthread_t t[64], hb;
    __atomic_store_n(&g_beat_ns, now_ns(), __ATOMIC_SEQ_CST);
    pthread_create(&hb, NULL, heartbeat, NULL);
    for (int i = 0; i < threads && i < 64; i++) pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(seed * 64 + i + 1));
    printf("started\n");
    fflush(stdout);
    for (int i = 0; i < threads && i < 64; i++) pthread_join(t[i], NULL);
    g_done = 1;
    pthread_join(hb, NULL);
    printf("ok=%ld refused=%ld other=%ld corrupt=%ld maxcall_us=%ld excluded=%ld\n", g_ok, g_refused, g_other,
           g_corrupt, g_maxcall_ns / 1000, g_excluded);
    return g_other || g_corrupt ? 1 : 0;
}

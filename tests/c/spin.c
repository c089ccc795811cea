/* A GPU-time client for the compute share (issue 33): launches a `spin` kernel worth KERNEL_US of GPU time,
 * back to back (saturating, at most 8 launches of its own in flight) or one at a time with a pause (latency
 * mode: each launch synchronised and timed), for SECONDS, and prints key=value figures.
 *   spin SECONDS KERNEL_US [PAUSE_US]
 * The same program runs on the simulated GPU and on a real one. The simulator's `spin` (its image) occupies
 * the GPU's timeline for its first uint64 parameter in ns. On a real GPU the PTX below runs a fixed number of
 * dependent FMAs, the first parameter read as iterations: SPIN_ITERS_PER_US (from `spin --calibrate`, alone)
 * converts, so a kernel is a fixed amount of work whatever its neighbours do (a time-based spin would finish
 * early after being time-sliced out).
 * Environment: SPIN_COUNT=N makes exactly N saturating launches instead (SECONDS ignored: for instruction
 * counts); SPIN_MARK_S=S prints `mark_launches=N` (launches completed by then) at S seconds, so a caller
 * can count the work done in [S, SECONDS], and SPIN_MARK2_S=S2 `mark2_launches=N` at S2 (a caller reads the
 * simulator's own figures between the two lines); SPIN_GRID blocks (default: the GPU's multiprocessor count);
 * SPIN_DEVICE=K runs on device K (default 0); SPIN_DEVICES=N also keeps devices K+1..K+N-1 saturated, one thread
 * and context each, until the main loop ends (a process driving several GPUs; their launches are not counted).
 * Output: `started=1`, then `mark_launches=`, `launches=N wall_s=S`, in latency mode `p50_us= p99_us= max_us=`;
 * with --calibrate, `iters_per_us=X`. Exit 0, or 1 with a message. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_api.h"

CUresult CUDAAPI cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name); /* as in cuda.h */

#define RING 8

static const char PTX[] =
    ".version 7.0\n.target sm_70\n.address_size 64\n"
    ".visible .entry spin(.param .u64 iters, .param .u64 sink)\n{\n"
    "  .reg .u64 %rd<5>;\n  .reg .pred %p<3>;\n  .reg .f32 %f<2>;\n"
    "  ld.param.u64 %rd1, [iters];\n  ld.param.u64 %rd4, [sink];\n"
    "  mov.u64 %rd2, 0;\n  mov.f32 %f1, 0f3F800000;\n"
    "LOOP:\n  fma.rn.f32 %f1, %f1, 0f3F7FFFFF, 0f3A800000;\n  add.u64 %rd2, %rd2, 1;\n"
    "  setp.lt.u64 %p1, %rd2, %rd1;\n  @%p1 bra LOOP;\n"
    "  setp.eq.f32 %p2, %f1, 0f47800000;\n  @%p2 st.global.f32 [%rd4], %f1;\n  ret;\n}\n";

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void check(CUresult rc, const char *what) {
    if (rc == CUDA_SUCCESS) return;
    fprintf(stderr, "spin: %s failed: %d\n", what, rc);
    exit(1);
}

struct client {
    CUfunction f;
    unsigned grid;
    uint64_t param;          /* ns (simulator) or iterations (real GPU) */
    uint64_t sink;
    CUevent ring[RING];
    uint64_t launched, done;
};

/* One launch and its event; waits for the launch RING back, so at most RING are in flight. Never inlined:
 * bench_compute.py counts its instructions with callgrind (--toggle-collect=launch). */
__attribute__((noinline)) static void launch(struct client *c) {
    void *params[] = {&c->param, &c->sink};
    int slot = (int)(c->launched % RING);
    if (c->launched >= RING) {
        check(cuEventSynchronize(c->ring[slot]), "cuEventSynchronize");
        c->done++;
    }
    check(cuLaunchKernel(c->f, c->grid, 1, 1, 128, 1, 1, 0, NULL, params, NULL), "cuLaunchKernel");
    check(cuEventRecord(c->ring[slot], NULL), "cuEventRecord");
    c->launched++;
}

/* Launches completed now: the ring's events that have fired. */
static uint64_t completed(const struct client *c) {
    uint64_t n = c->done;
    for (uint64_t i = c->done; i < c->launched; i++)
        if (cuEventQuery(c->ring[i % RING]) == CUDA_SUCCESS) n++;
        else break;
    return n;
}

static int is_simulated(CUdevice dev) {
    char name[256] = "";
    return cuDeviceGetName(name, sizeof name, dev) == CUDA_SUCCESS && strstr(name, "(memslice)") != NULL;
}

/* A context on device `ordinal`, current in this thread, with the spin kernel and the ring's events in c. */
static void setup(struct client *c, int ordinal, int *sim) {
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    check(cuDeviceGet(&dev, ordinal), "cuDeviceGet");
    check(cuCtxCreate_v2(&ctx, 0, dev), "cuCtxCreate");
    *sim = is_simulated(dev);
    static const unsigned char sim_image[16] = {'M', 'S', 'S', 'I', 'M', 'M', 'O', 'D'}; /* no globals */
    check(cuModuleLoadData(&mod, *sim ? (const void *)sim_image : (const void *)PTX), "cuModuleLoadData");
    check(cuModuleGetFunction(&c->f, mod, "spin"), "cuModuleGetFunction");
    for (int i = 0; i < RING; i++) check(cuEventCreate(&c->ring[i], 0), "cuEventCreate");
    int sms = 1;
    if (cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) != CUDA_SUCCESS || sms < 1) sms = 1;
    c->grid = getenv("SPIN_GRID") ? (unsigned)atoi(getenv("SPIN_GRID")) : (unsigned)sms;
}

/* SPIN_DEVICES: one more device kept saturated by its own thread and context until the main loop ends. */
struct side { int ordinal; double kernel_us; };
static int g_sides_stop;
static void *side_spin(void *arg) {
    const struct side *s = arg;
    struct client c = {0};
    int sim = 0;
    setup(&c, s->ordinal, &sim);
    c.param = (uint64_t)(s->kernel_us * 1000.0);
    while (!__atomic_load_n(&g_sides_stop, __ATOMIC_ACQUIRE)) launch(&c);
    check(cuCtxSynchronize(), "cuCtxSynchronize");
    return NULL;
}

int main(int argc, char **argv) {
    int calibrate = argc > 1 && strcmp(argv[1], "--calibrate") == 0;
    if (argc < 3 && !calibrate) {
        fprintf(stderr, "usage: spin SECONDS KERNEL_US [PAUSE_US] | spin --calibrate\n");
        return 1;
    }
    struct client c = {0};
    int sim = 0, device = getenv("SPIN_DEVICE") ? atoi(getenv("SPIN_DEVICE")) : 0;
    int devices = getenv("SPIN_DEVICES") ? atoi(getenv("SPIN_DEVICES")) : 1;
    check(cuInit(0), "cuInit");
    setup(&c, device, &sim);
    if (calibrate) {
        c.param = 1000000;
        CUevent a, b;
        float ms = 0;
        check(cuEventCreate(&a, 0), "cuEventCreate");
        check(cuEventCreate(&b, 0), "cuEventCreate");
        launch(&c);
        check(cuCtxSynchronize(), "cuCtxSynchronize");
        check(cuEventRecord(a, NULL), "cuEventRecord");
        launch(&c);
        check(cuEventRecord(b, NULL), "cuEventRecord");
        check(cuEventSynchronize(b), "cuEventSynchronize");
        check(cuEventElapsedTime(&ms, a, b), "cuEventElapsedTime");
        printf("iters_per_us=%.3f\n", ms > 0 ? 1e6 / (ms * 1000.0) : 0.0);
        return 0;
    }
    double seconds = atof(argv[1]), kernel_us = atof(argv[2]);
    double per_us = getenv("SPIN_ITERS_PER_US") ? atof(getenv("SPIN_ITERS_PER_US")) : 1000.0;
    c.param = sim ? (uint64_t)(kernel_us * 1000.0) : (uint64_t)(kernel_us * per_us);
    int latency = argc > 3;
    double pause_us = latency ? atof(argv[3]) : 0;
    double mark = getenv("SPIN_MARK_S") ? atof(getenv("SPIN_MARK_S")) : -1;
    double mark2 = getenv("SPIN_MARK2_S") ? atof(getenv("SPIN_MARK2_S")) : -1;
    size_t cap = latency ? (size_t)(seconds * 1e6 / (pause_us + kernel_us)) + 16 : 1;
    double *lat = calloc(cap, sizeof *lat);
    size_t nlat = 0;
    double t0 = now_s(), end = t0 + seconds;
    struct side sides[16];
    pthread_t side_threads[16];
    for (int i = 1; i < devices && i < 16; i++) {
        sides[i] = (struct side){device + i, kernel_us};
        if (pthread_create(&side_threads[i], NULL, side_spin, &sides[i]) != 0) check(999, "pthread_create");
    }
    printf("started=1 simulated=%d grid=%u\n", sim, c.grid);
    fflush(stdout);
    if (getenv("SPIN_COUNT")) {
        for (long n = atol(getenv("SPIN_COUNT")); n > 0; n--) launch(&c);
        check(cuCtxSynchronize(), "cuCtxSynchronize");
        printf("launches=%llu wall_s=%.3f\n", (unsigned long long)c.launched, now_s() - t0);
        return 0;
    }
    for (double t = t0; t < end; t = now_s()) {
        if (mark >= 0 && t - t0 >= mark) {
            printf("mark_launches=%llu\n", (unsigned long long)completed(&c));
            fflush(stdout);
            mark = -1;
        }
        if (mark2 >= 0 && t - t0 >= mark2) {
            printf("mark2_launches=%llu\n", (unsigned long long)completed(&c));
            fflush(stdout);
            mark2 = -1;
        }
        if (!latency) {
            launch(&c);
            continue;
        }
        double a = now_s();
        launch(&c);
        check(cuCtxSynchronize(), "cuCtxSynchronize");
        if (nlat < cap) lat[nlat++] = (now_s() - a) * 1e6;
        struct timespec p = {0, (long)(pause_us * 1000)};
        nanosleep(&p, NULL);
    }
    uint64_t at_end = completed(&c);
    __atomic_store_n(&g_sides_stop, 1, __ATOMIC_RELEASE);
    check(cuCtxSynchronize(), "cuCtxSynchronize");
    for (int i = 1; i < devices && i < 16; i++) pthread_join(side_threads[i], NULL);
    printf("launches=%llu wall_s=%.3f\n", (unsigned long long)at_end, now_s() - t0);
    if (nlat) {
        qsort(lat, nlat, sizeof *lat, cmp_double);
        printf("p50_us=%.1f p99_us=%.1f max_us=%.1f samples=%zu\n", lat[nlat / 2], lat[(size_t)((double)nlat * 0.99)],
               lat[nlat - 1], nlat);
    }
    return 0;
}

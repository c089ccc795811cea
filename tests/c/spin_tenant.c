/* A tenant that keeps a (simulated) GPU busy with `spin` kernels, for tests and benchmarks of compute sharing.
 *
 *   spin_tenant --ns N [--seconds T | --count K] [--gpu G] [--start-at MONO_NS] [--launch-only]
 *
 * Loads a simulator module image, then repeatedly launches spin(N ns) on a stream between two events and
 * synchronizes the stream, for T seconds (default 1) or K kernels. --start-at waits until CLOCK_MONOTONIC
 * reaches MONO_NS first (so several tenants start together); --launch-only launches K kernels (default 1),
 * prints {"launched": K} and waits to be killed. Prints one JSON object:
 *   kernels        kernels completed
 *   gpu_ns         GPU time they asked for (kernels * N)
 *   sim_busy_ns    GPU time the simulator's timeline charged to this process (memsliceSimTimeline), or -1
 *   wall_ns        from the first launch to the last completion
 *   lat_ns_p50/p99/max   wall time from launch to synchronize returning, per kernel
 *   gpu_ms_p50     cuEventElapsedTime between the events around each kernel (median)
 *   done_ns        CLOCK_MONOTONIC at each completion (at most 4096)
 * Exit status 0, or 1 with a message on stderr naming the failing call. Links the driver directly. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
CUresult cuInit(unsigned int flags);
CUresult cuDeviceGet(CUdevice *d, int ordinal);
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d);
CUresult cuCtxSetCurrent(CUcontext c);
CUresult cuModuleLoadData(CUmodule *m, const void *image);
CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name);
CUresult cuStreamCreate(CUstream *s, unsigned int flags);
CUresult cuEventCreate(CUevent *e, unsigned int flags);
CUresult cuEventRecord(CUevent e, CUstream s);
CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b);
CUresult cuStreamSynchronize(CUstream s);
CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                        unsigned int by, unsigned int bz, unsigned int shm, CUstream s, void **params, void **extra);

#define MAX_KERNELS 1000000
#define MAX_DONE 4096

struct opts { unsigned long long ns, count, start_at; double seconds; int gpu, launch_only; };

/* CLOCK_MONOTONIC in ns: the simulated GPU's clock. */
static uint64_t mono_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* Exit with the failing call named. */
static void check(CUresult rc, const char *what) {
    if (rc == 0) return;
    fprintf(stderr, "spin_tenant: %s failed: CUresult %d\n", what, rc);
    exit(1);
}

/* Parse the command line; exits with usage on anything unexpected. */
static struct opts parse(int argc, char **argv) {
    struct opts o = {.seconds = 1.0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--launch-only")) { o.launch_only = 1; continue; }
        if (!v) goto usage;
        if (!strcmp(a, "--ns")) o.ns = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--count")) o.count = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--seconds")) o.seconds = strtod(v, NULL);
        else if (!strcmp(a, "--gpu")) o.gpu = atoi(v);
        else if (!strcmp(a, "--start-at")) o.start_at = strtoull(v, NULL, 10);
        else goto usage;
        i++;
    }
    if (o.count > MAX_KERNELS || o.seconds <= 0 || o.seconds > 3600) goto usage;
    return o;
usage:
    fprintf(stderr, "usage: spin_tenant --ns N [--seconds T | --count K] [--gpu G] [--start-at MONO_NS] "
                    "[--launch-only]\n");
    exit(2);
}

/* qsort orders, for the percentiles. */
static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}
static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* This process's busy ns on GPU g by the simulator's own timeline, or -1 (not the simulator). */
static long long sim_busy(int g) {
    unsigned int (*fig)(unsigned int, unsigned long long *, unsigned int) =
        (unsigned int (*)(unsigned int, unsigned long long *, unsigned int))dlsym(RTLD_DEFAULT, "memsliceSimTimeline");
    unsigned long long v[4 + 3 * 64];
    if (!fig) return -1;
    unsigned int n = fig((unsigned int)g, v, sizeof v / sizeof v[0]);
    long long busy = 0;
    for (unsigned int k = 4; k + 2 < n && k + 2 < sizeof v / sizeof v[0]; k += 3)
        if (v[k] == (unsigned long long)getpid()) busy += (long long)v[k + 1];
    return busy;
}

/* Set up a context, a module, a stream and two events; spin; print the figures. */
int main(int argc, char **argv) {
    struct opts o = parse(argc, argv);
    static const unsigned char image[16] = {'M', 'S', 'S', 'I', 'M', 'M', 'O', 'D'}; /* no globals */
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction spin;
    CUstream s;
    CUevent e0, e1;
    check(cuInit(0), "cuInit");
    check(cuDeviceGet(&dev, o.gpu), "cuDeviceGet");
    check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    check(cuModuleLoadData(&mod, image), "cuModuleLoadData");
    check(cuModuleGetFunction(&spin, mod, "spin"), "cuModuleGetFunction");
    check(cuStreamCreate(&s, 0), "cuStreamCreate");
    check(cuEventCreate(&e0, 0), "cuEventCreate");
    check(cuEventCreate(&e1, 0), "cuEventCreate");
    unsigned long long ns = o.ns;
    void *params[] = {&ns};
    while (o.start_at && mono_ns() < o.start_at) {
        struct timespec nap = {0, 200000};
        nanosleep(&nap, NULL);
    }
    if (o.launch_only) {
        unsigned long long k = o.count ? o.count : 1;
        for (unsigned long long i = 0; i < k; i++)
            check(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, s, params, NULL), "cuLaunchKernel");
        printf("{\"launched\": %llu}\n", k);
        fflush(stdout);
        for (;;) pause();
    }
    uint64_t *lat = calloc(MAX_KERNELS, sizeof *lat), *done = calloc(MAX_DONE, sizeof *done);
    float *gpu_ms = calloc(MAX_KERNELS, sizeof *gpu_ms);
    if (!lat || !done || !gpu_ms) return 1;
    uint64_t start = mono_ns(), until = start + (uint64_t)(o.seconds * 1e9), n = 0, last = start;
    while (o.count ? n < o.count : mono_ns() < until) {
        uint64_t t0 = mono_ns();
        check(cuEventRecord(e0, s), "cuEventRecord");
        check(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, s, params, NULL), "cuLaunchKernel");
        check(cuEventRecord(e1, s), "cuEventRecord");
        check(cuStreamSynchronize(s), "cuStreamSynchronize");
        last = mono_ns();
        check(cuEventElapsedTime(&gpu_ms[n], e0, e1), "cuEventElapsedTime");
        lat[n] = last - t0;
        if (n < MAX_DONE) done[n] = last;
        if (++n >= MAX_KERNELS) break;
    }
    long long busy = sim_busy(o.gpu);
    qsort(lat, n, sizeof *lat, cmp_u64);
    qsort(gpu_ms, n, sizeof *gpu_ms, cmp_float);
    printf("{\"pid\": %d, \"kernels\": %llu, \"gpu_ns\": %llu, \"sim_busy_ns\": %lld, \"wall_ns\": %llu, "
           "\"lat_ns_p50\": %llu, \"lat_ns_p99\": %llu, \"lat_ns_max\": %llu, \"gpu_ms_p50\": %.6f, \"done_ns\": [",
           (int)getpid(), (unsigned long long)n, (unsigned long long)(n * ns), busy,
           (unsigned long long)(last - start), (unsigned long long)(n ? lat[n / 2] : 0),
           (unsigned long long)(n ? lat[(n * 99) / 100 < n ? (n * 99) / 100 : n - 1] : 0),
           (unsigned long long)(n ? lat[n - 1] : 0), n ? (double)gpu_ms[n / 2] : 0.0);
    for (uint64_t i = 0; i < n && i < MAX_DONE; i++) printf("%s%llu", i ? ", " : "", (unsigned long long)done[i]);
    printf("]}\n");
    return 0;
}

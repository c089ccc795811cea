/* Simulated driver: kernel launches in GPU time. A launch queues its kernel's duration on the timeline of
 * its context's GPU (simtimeline.h) and returns at once, as the real asynchronous launch does: `spin` takes
 * as many nanoseconds as its first parameter (a uint64, from kernelParams[0] or the `extra` buffer), any
 * other kernel SIM_KERNEL_NS. All the streams of one context share its queue (work runs in launch order);
 * a created stream remembers where its last launch completes, for stream queries and synchronisation; the
 * default streams complete with everything their context has queued. A host function runs in the calling
 * thread once its stream's queued work is done (ordered, but not asynchronous). */
#define _GNU_SOURCE
#include <string.h>

#include "sim_launch_api.h"
#include "simcuda.h"

/* cuLaunchKernelEx's CUlaunchConfig, as cuda.h lays it out (only read here). */
struct sim_launch_config {
    unsigned int gx, gy, gz, bx, by, bz, shm;
    CUstream stream;
    void *attrs;
    unsigned int nattrs;
};
#define PARAM_END ((void *)0x00)
#define PARAM_BUFFER_POINTER ((void *)0x01)
#define PARAM_BUFFER_SIZE ((void *)0x02)
#define EXTRA_MAX_PAIRS 16

/* A live function handle, or NULL. */
struct sim_func *sim_func_of(CUfunction f) {
    struct sim_func *x = (struct sim_func *)f;
    return x && x->magic == SIM_FUNC_MAGIC ? x : NULL;
}

/* The context and GPU whose queue stream s feeds. */
static CUresult stream_ctx(CUstream s, CUcontext *ctx, int *dev, struct sim_stream **x) {
    if (!sim_cuda_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    *x = sim_stream_of(s);
    if (!*x && (uintptr_t)s > 2) return CUDA_ERROR_INVALID_HANDLE;
    *ctx = *x ? (*x)->ctx : sim_current_ctx();
    *dev = *ctx ? sim_ctx_device(*ctx) : -1;
    return *dev < 0 ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS;
}

/* Where the work queued on s so far completes. */
CUresult sim_stream_point(CUstream s, struct tl_ref *ref, uint64_t *target) {
    CUcontext ctx;
    int dev;
    struct sim_stream *x;
    CUresult rc = stream_ctx(s, &ctx, &dev, &x);
    if (rc) return rc;
    tl_client(ctx, sim_phys(dev), ref);
    *target = x ? __atomic_load_n(&x->target, __ATOMIC_ACQUIRE) : tl_last(*ref);
    return CUDA_SUCCESS;
}

/* A launch on a created stream moves its completion point. */
void sim_stream_set_target(CUstream s, uint64_t target) {
    struct sim_stream *x = sim_stream_of(s);
    if (x) __atomic_store_n(&x->target, target, __ATOMIC_RELEASE);
}

/* Wait for the work queued on s (or, ctx_wide, on the whole context of s). */
CUresult sim_stream_drain(CUstream s, int ctx_wide) {
    struct tl_ref ref;
    uint64_t target;
    CUresult rc = sim_stream_point(s, &ref, &target);
    if (rc) return rc;
    if (ctx_wide) target = tl_last(ref);
    return tl_wait(ref, target, SIM_SYNC_NS) == 0 ? CUDA_SUCCESS : CUDA_ERROR_LAUNCH_TIMEOUT;
}

/* spin's duration: kernelParams[0] points at a uint64; or `extra` gives a buffer of at least 8 bytes. */
static int spin_ns(void **params, void **extra, uint64_t *ns) {
    if (params && params[0]) {
        memcpy(ns, params[0], sizeof *ns);
        return *ns <= SIM_SPIN_MAX_NS ? 0 : -1;
    }
    const void *buf = NULL;
    size_t size = 0;
    for (int i = 0; extra && i < 2 * EXTRA_MAX_PAIRS && extra[i] != PARAM_END; i += 2) {
        if (extra[i] == PARAM_BUFFER_POINTER) buf = extra[i + 1];
        else if (extra[i] == PARAM_BUFFER_SIZE && extra[i + 1]) memcpy(&size, extra[i + 1], sizeof size);
        else return -1;
    }
    if (!buf || size < sizeof *ns) return -1;
    memcpy(ns, buf, sizeof *ns);
    return *ns <= SIM_SPIN_MAX_NS ? 0 : -1;
}

/* Queue one kernel on its stream's context: checked as the driver checks a launch, then its GPU time. */
static CUresult launch(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                       unsigned int by, unsigned int bz, CUstream s, void **params, void **extra) {
    if (!sim_cuda_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    struct sim_func *fn = sim_func_of(f);
    if (!fn) return CUDA_ERROR_INVALID_HANDLE;
    if (!gx || !gy || !gz || !bx || !by || !bz || (uint64_t)bx * by * bz > 1024) return CUDA_ERROR_INVALID_VALUE;
    uint64_t ns = SIM_KERNEL_NS, target;
    if (fn->spin && spin_ns(params, extra, &ns) < 0) return CUDA_ERROR_INVALID_VALUE;
    struct tl_ref ref;
    CUresult rc = sim_stream_point(s, &ref, &target);
    if (rc) return rc;
    if (tl_submit(ref, ns, &target) == -2) return (CUresult)701; /* CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES */
    sim_stream_set_target(s, target);
    return CUDA_SUCCESS;
}

/* cuLaunchKernel and its per-thread-default-stream variant: shared memory does not change GPU time. */
API CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                            unsigned int by, unsigned int bz, unsigned int shm, CUstream s, void **params,
                            void **extra) {
    (void)shm;
    return launch(f, gx, gy, gz, bx, by, bz, s, params, extra);
}
API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                 unsigned int by, unsigned int bz, unsigned int shm, CUstream s, void **params,
                                 void **extra) {
    (void)shm;
    return launch(f, gx, gy, gz, bx, by, bz, s, params, extra);
}
/* The launch attributes (cluster shape, priority, ...) are accepted and do not change the GPU time. */
API CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra) {
    const struct sim_launch_config *c = (const struct sim_launch_config *)config;
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    return launch(f, c->gx, c->gy, c->gz, c->bx, c->by, c->bz, c->stream, params, extra);
}
/* Its per-thread-default-stream variant. */
API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **params, void **extra) {
    return cuLaunchKernelEx(config, f, params, extra);
}
/* A cooperative launch takes the same GPU time (grid-wide sync costs nothing here). */
API CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                       unsigned int bx, unsigned int by, unsigned int bz, unsigned int shm,
                                       CUstream s, void **params) {
    (void)shm;
    return launch(f, gx, gy, gz, bx, by, bz, s, params, NULL);
}
API CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                            unsigned int bx, unsigned int by, unsigned int bz, unsigned int shm,
                                            CUstream s, void **params) {
    (void)shm;
    return launch(f, gx, gy, gz, bx, by, bz, s, params, NULL);
}

/* A host function runs after the work queued before it on its stream: here, in the calling thread, once
 * that work is done (bounded by SIM_SYNC_NS). */
API CUresult cuLaunchHostFunc(CUstream s, CUhostFn fn, void *data) {
    if (!fn) return sim_cuda_initialized() ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = sim_stream_drain(s, 0);
    if (rc) return rc;
    fn(data);
    return CUDA_SUCCESS;
}
/* Its per-thread-default-stream variant. */
API CUresult cuLaunchHostFunc_ptsz(CUstream s, CUhostFn fn, void *data) { return cuLaunchHostFunc(s, fn, data); }

/* Simulated streams and events. Kernels do not run on the simulated GPU and every copy completes before its
 * call returns, so all work queued on a stream is already done: queries answer CUDA_SUCCESS, synchronizes
 * return at once, and an event's timestamp is the moment it was recorded (so cuEventElapsedTime measures the
 * host time between two records, as a profiler would see an idle GPU). What is modelled faithfully is the
 * handle bookkeeping clients check: flags, priorities within cuCtxGetStreamPriorityRange, the owning context,
 * per-thread and legacy default streams, unrecorded and timing-disabled events, invalid handles. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <time.h>

#include "sim_internal.h"
#include "sim_streams_api.h"
#include "simstate.h"

#define API SIM_EXPORT
#define EVENT_MAGIC 0x45564e54u
#define STREAM_LEGACY ((CUstream)0x1)
#define STREAM_PER_THREAD ((CUstream)0x2)
#define PRIO_LEAST 0      /* what an H100 reports: 0 is the default and lowest, -5 the highest */
#define PRIO_GREATEST (-5)
#define STREAM_NON_BLOCKING 0x1u
#define EVENT_BLOCKING_SYNC 0x1u
#define EVENT_DISABLE_TIMING 0x2u
#define EVENT_INTERPROCESS 0x4u

struct sim_evt { uint32_t magic; unsigned int flags; int recorded; int dev; uint64_t ns; };

static unsigned long long g_next_id = 100; /* stream IDs; small numbers are the default streams' */

/* Is the driver initialised and a context current (the precondition of most stream calls)? */
static CUresult need_ctx(void) {
    if (!sim_cuda_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    return sim_current_ctx() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

/* A created stream, or NULL for 0/legacy/per-thread and for anything that is not a live stream. */
struct sim_stream *sim_stream_of(CUstream s) {
    struct sim_stream *x = (struct sim_stream *)s;
    if ((uintptr_t)s <= 2) return NULL;
    return x->magic == SIM_STREAM_MAGIC ? x : NULL;
}

/* The default streams (NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD) are valid handles of every context. */
static int is_default(CUstream s) { return s == NULL || s == STREAM_LEGACY || s == STREAM_PER_THREAD; }

/* Validate a stream argument: a default stream (needs a current context) or a live created stream. */
static CUresult check_stream(CUstream s) {
    if (!sim_cuda_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (is_default(s)) return sim_current_ctx() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
    return sim_stream_of(s) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* ---- creation and properties ------------------------------------------------------------------------ */
API CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest) {
    CUresult rc = need_ctx();
    if (rc) return rc;
    if (least) *least = PRIO_LEAST;
    if (greatest) *greatest = PRIO_GREATEST;
    return CUDA_SUCCESS;
}

/* A stream of the current context; the priority is clamped into the range, as the driver does. */
API CUresult cuStreamCreateWithPriority(CUstream *ps, unsigned int flags, int priority) {
    CUresult rc = need_ctx();
    if (rc) return rc;
    if (!ps || (flags & ~STREAM_NON_BLOCKING)) return CUDA_ERROR_INVALID_VALUE;
    struct sim_stream *x = calloc(1, sizeof *x);
    if (!x) return CUDA_ERROR_OUT_OF_MEMORY;
    if (priority > PRIO_LEAST) priority = PRIO_LEAST; /* out-of-range priorities are clamped, as documented */
    if (priority < PRIO_GREATEST) priority = PRIO_GREATEST;
    CUcontext c = sim_current_ctx();
    *x = (struct sim_stream){SIM_STREAM_MAGIC, sim_ctx_device(c), 0, priority, flags, c,
                             __atomic_fetch_add(&g_next_id, 1, __ATOMIC_RELAXED)};
    *ps = (CUstream)x;
    return CUDA_SUCCESS;
}
API CUresult cuStreamCreate(CUstream *ps, unsigned int flags) { return cuStreamCreateWithPriority(ps, flags, 0); }

/* Destroy a created stream (the default streams cannot be). */
API CUresult cuStreamDestroy_v2(CUstream s) {
    if (!sim_cuda_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    struct sim_stream *x = sim_stream_of(s);
    if (!x) return CUDA_ERROR_INVALID_HANDLE;
    x->magic = 0;
    free(x);
    return CUDA_SUCCESS;
}
API CUresult cuStreamDestroy(CUstream s) { return cuStreamDestroy_v2(s); }

/* A created stream's priority; default streams have priority 0. */
API CUresult cuStreamGetPriority(CUstream s, int *priority) {
    CUresult rc = check_stream(s);
    if (rc) return rc;
    if (!priority) return CUDA_ERROR_INVALID_VALUE;
    struct sim_stream *x = sim_stream_of(s);
    *priority = x ? x->priority : 0;
    return CUDA_SUCCESS;
}
API CUresult cuStreamGetPriority_ptsz(CUstream s, int *p) { return cuStreamGetPriority(s, p); }

/* A created stream's flags; default streams have none. */
API CUresult cuStreamGetFlags(CUstream s, unsigned int *flags) {
    CUresult rc = check_stream(s);
    if (rc) return rc;
    if (!flags) return CUDA_ERROR_INVALID_VALUE;
    struct sim_stream *x = sim_stream_of(s);
    *flags = x ? x->flags : 0;
    return CUDA_SUCCESS;
}
API CUresult cuStreamGetFlags_ptsz(CUstream s, unsigned int *f) { return cuStreamGetFlags(s, f); }

/* Stream IDs: the legacy stream is 1 and the per-thread stream 2 in this model; created streams count up. */
API CUresult cuStreamGetId(CUstream s, unsigned long long *id) {
    CUresult rc = check_stream(s);
    if (rc) return rc;
    if (!id) return CUDA_ERROR_INVALID_VALUE;
    struct sim_stream *x = sim_stream_of(s);
    *id = x ? x->id : s == STREAM_PER_THREAD ? 2 : 1;
    return CUDA_SUCCESS;
}
API CUresult cuStreamGetId_ptsz(CUstream s, unsigned long long *id) { return cuStreamGetId(s, id); }

/* The owning context: a created stream's own, the current one for the default streams. */
API CUresult cuStreamGetCtx(CUstream s, CUcontext *pctx) {
    CUresult rc = check_stream(s);
    if (rc) return rc;
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    struct sim_stream *x = sim_stream_of(s);
    *pctx = x ? x->ctx : sim_current_ctx();
    return CUDA_SUCCESS;
}
API CUresult cuStreamGetCtx_ptsz(CUstream s, CUcontext *p) { return cuStreamGetCtx(s, p); }
/* 12.5: also the green context, which the simulator never creates. */
API CUresult cuStreamGetCtx_v2(CUstream s, CUcontext *pctx, void **green) {
    if (!pctx && !green) return CUDA_ERROR_INVALID_VALUE;
    CUcontext c = NULL;
    CUresult rc = cuStreamGetCtx(s, &c);
    if (rc) return rc;
    if (pctx) *pctx = c;
    if (green) *green = NULL;
    return CUDA_SUCCESS;
}
API CUresult cuStreamGetCtx_v2_ptsz(CUstream s, CUcontext *p, void **g) { return cuStreamGetCtx_v2(s, p, g); }

/* The device of the stream's context. */
API CUresult cuStreamGetDevice(CUstream s, CUdevice *dev) {
    CUcontext c = NULL;
    CUresult rc = cuStreamGetCtx(s, &c);
    if (rc) return rc;
    if (!dev) return CUDA_ERROR_INVALID_VALUE;
    *dev = sim_ctx_device(c);
    return CUDA_SUCCESS;
}
API CUresult cuStreamGetDevice_ptsz(CUstream s, CUdevice *d) { return cuStreamGetDevice(s, d); }

/* ---- completion: all queued work is already done ----------------------------------------------------- */
/* Done unless a stream wait is queued on it (simcuda_memop.c). */
API CUresult cuStreamQuery(CUstream s) {
    CUresult rc = check_stream(s);
    if (rc) return rc;
    return sim_waits_pending(s ? s : (CUstream)0x1) ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}
API CUresult cuStreamQuery_ptsz(CUstream s) { return cuStreamQuery(s); }

/* Nothing to wait for (all work is done); the arguments are still checked. */
API CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags) {
    CUresult rc = check_stream(s);
    if (rc) return rc;
    struct sim_evt *x = (struct sim_evt *)e;
    if (!x || x->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    return flags > 1 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}
API CUresult cuStreamWaitEvent_ptsz(CUstream s, CUevent e, unsigned int f) { return cuStreamWaitEvent(s, e, f); }

/* ---- events ------------------------------------------------------------------------------------------- */
static struct sim_evt *as_event(CUevent e) {
    struct sim_evt *x = (struct sim_evt *)e;
    return x && x->magic == EVENT_MAGIC ? x : NULL;
}

/* Monotonic nanoseconds: the clock an event's timestamp is taken from. */
static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* An event of the current context, with the documented flag rules. */
API CUresult cuEventCreate(CUevent *pe, unsigned int flags) {
    CUresult rc = need_ctx();
    if (rc) return rc;
    if (!pe || (flags & ~(EVENT_BLOCKING_SYNC | EVENT_DISABLE_TIMING | EVENT_INTERPROCESS)) ||
        ((flags & EVENT_INTERPROCESS) && !(flags & EVENT_DISABLE_TIMING)))
        return CUDA_ERROR_INVALID_VALUE; /* an interprocess event must disable timing */
    struct sim_evt *x = calloc(1, sizeof *x);
    if (!x) return CUDA_ERROR_OUT_OF_MEMORY;
    *x = (struct sim_evt){EVENT_MAGIC, flags, 0, sim_ctx_device(sim_current_ctx()), 0};
    *pe = (CUevent)x;
    return CUDA_SUCCESS;
}

/* Destroy an event. */
API CUresult cuEventDestroy_v2(CUevent e) {
    if (!sim_cuda_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    struct sim_evt *x = as_event(e);
    if (!x) return CUDA_ERROR_INVALID_HANDLE;
    x->magic = 0;
    free(x);
    return CUDA_SUCCESS;
}
API CUresult cuEventDestroy(CUevent e) { return cuEventDestroy_v2(e); }

/* Record: the event completes at once; its timestamp is now. */
API CUresult cuEventRecord(CUevent e, CUstream s) {
    CUresult rc = check_stream(s);
    if (rc) return rc;
    struct sim_evt *x = as_event(e);
    if (!x) return CUDA_ERROR_INVALID_HANDLE;
    x->ns = now_ns();
    __atomic_store_n(&x->recorded, 1, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}
API CUresult cuEventRecord_ptsz(CUevent e, CUstream s) { return cuEventRecord(e, s); }
/* Only CU_EVENT_RECORD_DEFAULT/EXTERNAL (0/1) exist. */
API CUresult cuEventRecordWithFlags(CUevent e, CUstream s, unsigned int flags) {
    return flags > 1 ? CUDA_ERROR_INVALID_VALUE : cuEventRecord(e, s);
}
API CUresult cuEventRecordWithFlags_ptsz(CUevent e, CUstream s, unsigned int f) {
    return cuEventRecordWithFlags(e, s, f);
}

/* An event's work is complete once recorded; an event never recorded also answers success (documented). */
API CUresult cuEventQuery(CUevent e) {
    if (!sim_cuda_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    return as_event(e) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
API CUresult cuEventSynchronize(CUevent e) { return cuEventQuery(e); }

/* Host time between two records; both must be recorded and timing-enabled. */
API CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end) {
    if (!sim_cuda_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    struct sim_evt *a = as_event(start), *b = as_event(end);
    if (!ms) return CUDA_ERROR_INVALID_VALUE;
    if (!a || !b || (a->flags & EVENT_DISABLE_TIMING) || (b->flags & EVENT_DISABLE_TIMING))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!__atomic_load_n(&a->recorded, __ATOMIC_ACQUIRE) || !__atomic_load_n(&b->recorded, __ATOMIC_ACQUIRE))
        return CUDA_ERROR_INVALID_HANDLE; /* the driver's answer for an event never recorded */
    *ms = (float)((double)((int64_t)(b->ns - a->ns)) / 1e6);
    return CUDA_SUCCESS;
}
API CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b) { return cuEventElapsedTime(ms, a, b); }

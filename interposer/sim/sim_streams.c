/* Simulated streams and events. Kernels run in GPU time on the timeline of their context's GPU
 * (simtimeline.h, simcuda_launch.c); every copy completes before its call returns. So a stream query answers
 * CUDA_ERROR_NOT_READY while the stream's kernels (or a queued stream wait, simcuda_memop.c) are in flight;
 * an event completes when the work queued before it does, and its timestamp is that moment on the GPU's
 * timeline (exact for up to TL_MARKS events in flight per context, else the moment it is first seen complete;
 * an event recorded behind no work is complete at once, stamped when recorded); cuStreamWaitEvent orders a
 * stream behind an event of another context by waiting for it (bounded); within one context, order holds
 * already (one queue). Also modelled: the handle bookkeeping clients check: flags, priorities within
 * cuCtxGetStreamPriorityRange, the owning context, per-thread and legacy default streams, unrecorded and
 * timing-disabled events, invalid handles. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <time.h>

#include "sim_internal.h"
#include "sim_launch_api.h"
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

struct sim_evt { uint32_t magic; unsigned int flags; int recorded; int dev; uint64_t ns; struct tl_point pt;
                 unsigned long long stream, mark; /* the created stream it was recorded on (0: a default one), and
                                                   * the copies booked before it (simcuda_inflight.c) */
                 uint64_t due; /* when those copies are due on the modelled link (0: at once) */ };

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
                             __atomic_fetch_add(&g_next_id, 1, __ATOMIC_RELAXED), 0};
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

/* ---- completion: on the GPU's timeline ------------------------------------------------------------------ */
/* Done unless a kernel or a stream wait (simcuda_memop.c) is still queued on it. */
API CUresult cuStreamQuery(CUstream s) {
    CUresult rc = check_stream(s);
    if (rc) return rc;
    struct tl_ref ref;
    uint64_t target;
    if (sim_stream_point(s, &ref, &target) == CUDA_SUCCESS && !tl_reached(ref, target)) return CUDA_ERROR_NOT_READY;
    if (sim_waits_pending(s ? s : (CUstream)0x1)) return CUDA_ERROR_NOT_READY;
    if (!sim_inflight_reached(sim_inflight_due_stream(s), 0)) return CUDA_ERROR_NOT_READY; /* copies on the link */
    sim_inflight_done(s); /* complete: its copies are too */
    return CUDA_SUCCESS;
}
API CUresult cuStreamQuery_ptsz(CUstream s) { return cuStreamQuery(s); }

/* Later work on s runs after the event: already so for an event of the same context (one queue); for an
 * event of another context, the caller waits for it here (bounded). */
API CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags) {
    CUresult rc = check_stream(s);
    if (rc) return rc;
    struct sim_evt *x = (struct sim_evt *)e;
    if (!x || x->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    if (flags > 1) return CUDA_ERROR_INVALID_VALUE;
    struct tl_ref ref;
    uint64_t target;
    if (!__atomic_load_n(&x->recorded, __ATOMIC_ACQUIRE) || x->pt.done || sim_stream_point(s, &ref, &target) ||
        (ref.gpu == x->pt.ref.gpu && ref.local == x->pt.ref.local))
        return CUDA_SUCCESS;
    return tl_wait(x->pt.ref, x->pt.target, SIM_SYNC_NS) == 0 ? CUDA_SUCCESS : CUDA_ERROR_LAUNCH_TIMEOUT;
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
    *x = (struct sim_evt){.magic = EVENT_MAGIC, .flags = flags, .dev = sim_ctx_device(sim_current_ctx())};
    *pe = (CUevent)x;
    return CUDA_SUCCESS;
}

/* Destroy an event. */
API CUresult cuEventDestroy_v2(CUevent e) {
    if (!sim_cuda_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    struct sim_evt *x = as_event(e);
    if (!x) return CUDA_ERROR_INVALID_HANDLE;
    x->magic = 0;
    if (x->recorded) tl_forget(&x->pt);
    free(x);
    return CUDA_SUCCESS;
}
API CUresult cuEventDestroy(CUevent e) { return cuEventDestroy_v2(e); }

/* Record: the event completes with the work queued on s so far (at once if there is none). */
API CUresult cuEventRecord(CUevent e, CUstream s) {
    CUresult rc = check_stream(s);
    if (rc) return rc;
    struct sim_evt *x = as_event(e);
    if (!x) return CUDA_ERROR_INVALID_HANDLE;
    struct tl_ref ref;
    uint64_t target;
    if (x->recorded) tl_forget(&x->pt);
    struct sim_stream *st = sim_stream_of(s);
    x->stream = st ? st->id : 0;
    x->mark = sim_inflight_mark();
    x->due = x->stream ? sim_inflight_due(x->stream, x->mark) : 0;
    if (sim_stream_point(s, &ref, &target) == CUDA_SUCCESS) tl_mark(ref, target, &x->pt);
    else x->pt = (struct tl_point){.ref = {-1, -1}, .mark = -1, .done = 1, .ns = now_ns()};
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

/* Complete once the work before it is; its completion time is then known (x->ns). Caller checked x. */
static int event_done(struct sim_evt *x) {
    uint64_t ns;
    if (!__atomic_load_n(&x->recorded, __ATOMIC_ACQUIRE)) return 1;
    if (!tl_point_time(&x->pt, &ns) || !sim_inflight_reached(x->due, 0)) return 0;
    x->ns = x->due > ns ? x->due : ns;
    if (x->stream) sim_inflight_done_id(x->stream, x->mark); /* the copies queued before it are complete */
    return 1;
}

/* NOT_READY while the work before the event runs; an event never recorded answers success (documented). */
API CUresult cuEventQuery(CUevent e) {
    if (!sim_cuda_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    struct sim_evt *x = as_event(e);
    if (!x) return CUDA_ERROR_INVALID_HANDLE;
    return event_done(x) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
/* Wait (bounded) until the event completes. */
API CUresult cuEventSynchronize(CUevent e) {
    if (!sim_cuda_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    struct sim_evt *x = as_event(e);
    if (!x) return CUDA_ERROR_INVALID_HANDLE;
    if (__atomic_load_n(&x->recorded, __ATOMIC_ACQUIRE) && !x->pt.done &&
        tl_wait(x->pt.ref, x->pt.target, SIM_SYNC_NS) < 0)
        return CUDA_ERROR_LAUNCH_TIMEOUT;
    if (__atomic_load_n(&x->recorded, __ATOMIC_ACQUIRE)) sim_inflight_reached(x->due, 1); /* copies on the link */
    return event_done(x) ? CUDA_SUCCESS : CUDA_ERROR_LAUNCH_TIMEOUT;
}

/* GPU time between the completions of two events; both must be recorded, complete and timing-enabled. */
API CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end) {
    if (!sim_cuda_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    struct sim_evt *a = as_event(start), *b = as_event(end);
    if (!ms) return CUDA_ERROR_INVALID_VALUE;
    if (!a || !b || (a->flags & EVENT_DISABLE_TIMING) || (b->flags & EVENT_DISABLE_TIMING))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!__atomic_load_n(&a->recorded, __ATOMIC_ACQUIRE) || !__atomic_load_n(&b->recorded, __ATOMIC_ACQUIRE))
        return CUDA_ERROR_INVALID_HANDLE; /* the driver's answer for an event never recorded */
    if (!event_done(a) || !event_done(b)) return CUDA_ERROR_NOT_READY;
    *ms = (float)((double)((int64_t)(b->ns - a->ns)) / 1e6);
    return CUDA_SUCCESS;
}
API CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b) { return cuEventElapsedTime(ms, a, b); }

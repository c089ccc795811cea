/* Simulated driver: streams, stream capture, and synchronisation (which trims the pools). */
#define _GNU_SOURCE
#include <stdlib.h>

#include "sim_internal.h"
#include "sim_launch_api.h"
#include "simcuda.h"

/* Stream objects live in sim_streams.c (creation, priorities, queries); capture state is kept here. */
static struct sim_stream *as_stream(CUstream s) { return sim_stream_of(s); }
/* Start capturing a stream (the legacy default stream cannot be captured). */
API CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) {
    NEED_INIT(); (void)mode;
    struct sim_stream *x = as_stream(s);
    if (!x) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    x->capturing = 1;
    return CUDA_SUCCESS;
}
/* Stop capturing; no graph is produced. */
API CUresult cuStreamEndCapture(CUstream s, CUgraph *graph) {
    NEED_INIT();
    struct sim_stream *x = as_stream(s);
    if (!x || !x->capturing) return CUDA_ERROR_INVALID_VALUE;
    x->capturing = 0;
    if (graph) *graph = NULL;
    return CUDA_SUCCESS;
}
/* Whether a stream is being captured. */
API CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *status) {
    NEED_INIT();
    if (!status) return CUDA_ERROR_INVALID_VALUE;
    struct sim_stream *x = as_stream(s);
    *status = x && x->capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}
/* The per-thread-default-stream variant of cuStreamIsCapturing: the same call. */
API CUresult cuStreamIsCapturing_ptsz(CUstream s, CUstreamCaptureStatus *status) { return cuStreamIsCapturing(s, status); }

/* Synchronising waits for the stream's kernels (their GPU time, sim_launch_api.h) and queued waits
 * (simcuda_memop.c), and is when a real pool gives memory above its release threshold back to the device. */
API CUresult cuStreamSynchronize(CUstream s) {
    NEED_INIT();
    CUresult rc = sim_stream_drain(s, 0);
    if (rc == CUDA_SUCCESS) rc = sim_waits_drain(s ? s : (CUstream)0x1);
    if (rc == CUDA_SUCCESS) sim_inflight_reached(sim_inflight_due_stream(s), 1); /* its copies on the link */
    if (rc == CUDA_SUCCESS) sim_inflight_done(s);
    trim_all_pools();
    return rc;
}
/* The per-thread-default-stream variant of cuStreamSynchronize: the same call. */
API CUresult cuStreamSynchronize_ptsz(CUstream s) { return cuStreamSynchronize(s); }
/* Context-wide synchronisation: every kernel of the context is done and every queued wait (simcuda_memop.c)
 * is met; pools give back memory above their thresholds. */
API CUresult cuCtxSynchronize(void) {
    NEED_INIT();
    CUresult rc = t_ctx ? sim_stream_drain(NULL, 1) : CUDA_SUCCESS;
    if (rc == CUDA_SUCCESS) rc = sim_waits_drain(NULL);
    if (rc == CUDA_SUCCESS) sim_inflight_reached(sim_inflight_due_stream(NULL), 1); /* every copy on the link */
    if (rc == CUDA_SUCCESS) sim_inflight_done(NULL);
    trim_all_pools();
    return rc;
}

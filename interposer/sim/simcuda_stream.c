/* Simulated driver: streams, stream capture, and synchronisation (which trims the pools). */
#define _GNU_SOURCE
#include <stdlib.h>

#include "simcuda.h"

struct sim_stream { uint32_t magic; int dev; int capturing; };
#define STREAM_MAGIC 0x5354524du

/* ---- streams --------------------------------------------------------------------------------------- */
static struct sim_stream *as_stream(CUstream s) {
    struct sim_stream *x = (struct sim_stream *)s;
    if ((uintptr_t)s <= 2) return NULL; /* NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD */
    return x->magic == STREAM_MAGIC ? x : NULL;
}
/* A stream on the current context's device (work is synchronous here). */
API CUresult cuStreamCreate(CUstream *ps, unsigned int flags) {
    NEED_CTX();
    (void)flags;
    struct sim_stream *x = calloc(1, sizeof *x);
    if (!ps || !x) { free(x); return CUDA_ERROR_INVALID_VALUE; }
    *x = (struct sim_stream){STREAM_MAGIC, t_ctx->dev, 0};
    *ps = (CUstream)x;
    return CUDA_SUCCESS;
}
/* Destroy a stream. */
API CUresult cuStreamDestroy_v2(CUstream s) {
    NEED_INIT();
    struct sim_stream *x = as_stream(s);
    if (!x) return CUDA_ERROR_INVALID_HANDLE;
    x->magic = 0;
    free(x);
    return CUDA_SUCCESS;
}
/* The legacy variant of cuStreamDestroy_v2: the same call. */
API CUresult cuStreamDestroy(CUstream s) { return cuStreamDestroy_v2(s); }
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

/* Synchronising is when a real pool gives memory above its release threshold back to the device. */
API CUresult cuStreamSynchronize(CUstream s) { NEED_INIT(); (void)s; trim_all_pools(); return CUDA_SUCCESS; }
/* The per-thread-default-stream variant of cuStreamSynchronize: the same call. */
API CUresult cuStreamSynchronize_ptsz(CUstream s) { return cuStreamSynchronize(s); }
/* Context-wide synchronisation: pools give back memory above their thresholds. */
API CUresult cuCtxSynchronize(void) { NEED_INIT(); trim_all_pools(); return CUDA_SUCCESS; }

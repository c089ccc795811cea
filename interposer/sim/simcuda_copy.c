/* Simulated driver: linear copies (host/device, device/device, peer, array/device) in every ABI variant of
 * cuda.h. "Device memory" is host memory here, so a copy is a memmove that completes before the call
 * returns (an Async copy is done when it returns; its stream is only checked). An address that is reserved
 * but has no physical memory mapped (cuMemAddressReserve without cuMemMap, or between cuMemUnmap and the
 * next cuMemMap + cuMemSetAccess) is PROT_NONE, so a copy touching it faults the process, as a GPU's MMU
 * fault kills the context: work submitted against memory in the middle of a remap does not go unnoticed.
 * The legacy 32-bit-ABI entry points (cuMemcpyHtoD, ...) take their pointers zero-extended. A synchronous
 * device-to-host copy returns only after the kernels queued before it (simcuda_launch.c), as on the legacy
 * default stream: that is how a program reads a kernel's result. */
#define _GNU_SOURCE
#include <string.h>

#include "sim_internal.h"
#include "sim_launch_api.h"
#include "simcuda.h"

/* ---- the one copy --------------------------------------------------------------------------------------- */
/* Copy n bytes between two addresses of this process's simulated memory (host or device alike). */
API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    NEED_INIT();
    if ((!dst || !src) && n) return CUDA_ERROR_INVALID_VALUE;
    if (n) memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    sim_count(SIM_C_COPIES, n);
    return CUDA_SUCCESS;
}
#define P(h) ((CUdeviceptr)(uintptr_t)(h))
/* The per-thread-default-stream variant of cuMemcpy: the same call. */
API CUresult cuMemcpy_ptds(CUdeviceptr d, CUdeviceptr s, size_t n) { return cuMemcpy(d, s, n); }
/* Asynchronous copy: done when it returns, and booked as in flight on its stream until that is synchronised
 * (simcuda_inflight.c), as a real GPU's would be. */
API CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) {
    CUresult rc = cuMemcpy(d, s, n);
    if (rc == CUDA_SUCCESS) sim_inflight_add(st, d, s, n);
    return rc;
}
/* The per-thread-default-stream variant of cuMemcpyAsync: the same call. */
API CUresult cuMemcpyAsync_ptsz(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) {
    return cuMemcpyAsync(d, s, n, st);
}

/* ---- host to device ----------------------------------------------------------------------------------- */
/* Host to device copy. */
API CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *h, size_t n) { return cuMemcpy(d, P(h), n); }
/* Its per-thread-default-stream variant. */
API CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr d, const void *h, size_t n) { return cuMemcpyHtoD_v2(d, h, n); }
/* Its legacy 32-bit ABI. */
API CUresult cuMemcpyHtoD(CUdeviceptr_v1 d, const void *h, unsigned int n) { return cuMemcpyHtoD_v2(d, h, n); }
/* Asynchronous host to device copy. */
API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t n, CUstream st) {
    return cuMemcpyAsync(d, P(h), n, st);
}
/* Its per-thread-default-stream variant. */
API CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr d, const void *h, size_t n, CUstream st) {
    return cuMemcpyHtoDAsync_v2(d, h, n, st);
}
/* Its legacy 32-bit ABI. */
API CUresult cuMemcpyHtoDAsync(CUdeviceptr_v1 d, const void *h, unsigned int n, CUstream st) {
    return cuMemcpyHtoDAsync_v2(d, h, n, st);
}

/* ---- device to host ----------------------------------------------------------------------------------- */
/* The kernels the current context queued before a synchronous copy are done first (one flag test in a
 * process that never launched one). */
static CUresult after_kernels(void) {
    return tl_launched() && t_ctx ? sim_stream_drain(NULL, 1) : CUDA_SUCCESS;
}
/* Device to host copy, after the context's queued kernels. */
API CUresult cuMemcpyDtoH_v2(void *h, CUdeviceptr d, size_t n) {
    CUresult rc = g_initialized ? after_kernels() : CUDA_SUCCESS;
    return rc ? rc : cuMemcpy(P(h), d, n);
}
/* Its per-thread-default-stream variant. */
API CUresult cuMemcpyDtoH_v2_ptds(void *h, CUdeviceptr d, size_t n) { return cuMemcpyDtoH_v2(h, d, n); }
/* Its legacy 32-bit ABI. */
API CUresult cuMemcpyDtoH(void *h, CUdeviceptr_v1 d, unsigned int n) { return cuMemcpyDtoH_v2(h, d, n); }
/* Asynchronous device to host copy. */
API CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t n, CUstream st) {
    return cuMemcpyAsync(P(h), d, n, st);
}
/* Its per-thread-default-stream variant. */
API CUresult cuMemcpyDtoHAsync_v2_ptsz(void *h, CUdeviceptr d, size_t n, CUstream st) {
    return cuMemcpyDtoHAsync_v2(h, d, n, st);
}
/* Its legacy 32-bit ABI. */
API CUresult cuMemcpyDtoHAsync(void *h, CUdeviceptr_v1 d, unsigned int n, CUstream st) {
    return cuMemcpyDtoHAsync_v2(h, d, n, st);
}

/* ---- device to device --------------------------------------------------------------------------------- */
/* Device to device copy. */
API CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) { return cuMemcpy(d, s, n); }
/* Its per-thread-default-stream variant. */
API CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr d, CUdeviceptr s, size_t n) { return cuMemcpyDtoD_v2(d, s, n); }
/* Its legacy 32-bit ABI. */
API CUresult cuMemcpyDtoD(CUdeviceptr_v1 d, CUdeviceptr_v1 s, unsigned int n) { return cuMemcpyDtoD_v2(d, s, n); }
/* Asynchronous device to device copy. */
API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) {
    return cuMemcpyAsync(d, s, n, st);
}
/* Its per-thread-default-stream variant. */
API CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) {
    return cuMemcpyDtoDAsync_v2(d, s, n, st);
}
/* Its legacy 32-bit ABI. */
API CUresult cuMemcpyDtoDAsync(CUdeviceptr_v1 d, CUdeviceptr_v1 s, unsigned int n, CUstream st) {
    return cuMemcpyDtoDAsync_v2(d, s, n, st);
}

/* ---- between contexts --------------------------------------------------------------------------------- */
/* A peer copy: both contexts must be live ones (of any simulated GPU; all share one address space here). */
API CUresult cuMemcpyPeer(CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n) {
    NEED_INIT();
    if (sim_ctx_device(dc) < 0 || sim_ctx_device(sc) < 0) return CUDA_ERROR_INVALID_CONTEXT;
    return cuMemcpy(d, s, n);
}
/* Its per-thread-default-stream variant. */
API CUresult cuMemcpyPeer_ptds(CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n) {
    return cuMemcpyPeer(d, dc, s, sc, n);
}
/* Asynchronous peer copy. */
API CUresult cuMemcpyPeerAsync(CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n, CUstream st) {
    (void)st;
    return cuMemcpyPeer(d, dc, s, sc, n);
}
/* Its per-thread-default-stream variant. */
API CUresult cuMemcpyPeerAsync_ptsz(CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n, CUstream st) {
    return cuMemcpyPeerAsync(d, dc, s, sc, n, st);
}

/* ---- arrays and device memory ------------------------------------------------------------------------- */
/* The address of byte `off` of an array, if off + n bytes lie inside it (offsets count bytes of the array's
 * row-major layout); 0 otherwise. */
static CUdeviceptr array_at(CUarray a, size_t off, size_t n) {
    struct sim_layout l;
    if (sim_array_layout(a, &l) < 0) return 0;
    uint64_t size = l.row_bytes * l.rows * l.layers;
    return off <= size && n <= size - off ? P(l.mem) + off : 0;
}
/* Array to device copy. */
API CUresult cuMemcpyAtoD_v2(CUdeviceptr d, CUarray a, size_t off, size_t n) {
    NEED_INIT();
    CUdeviceptr s = array_at(a, off, n);
    return s ? cuMemcpy(d, s, n) : CUDA_ERROR_INVALID_VALUE;
}
/* Its per-thread-default-stream variant. */
API CUresult cuMemcpyAtoD_v2_ptds(CUdeviceptr d, CUarray a, size_t off, size_t n) {
    return cuMemcpyAtoD_v2(d, a, off, n);
}
/* Its legacy 32-bit ABI. */
API CUresult cuMemcpyAtoD(CUdeviceptr_v1 d, CUarray a, unsigned int off, unsigned int n) {
    return cuMemcpyAtoD_v2(d, a, off, n);
}
/* Device to array copy. */
API CUresult cuMemcpyDtoA_v2(CUarray a, size_t off, CUdeviceptr s, size_t n) {
    NEED_INIT();
    CUdeviceptr d = array_at(a, off, n);
    return d ? cuMemcpy(d, s, n) : CUDA_ERROR_INVALID_VALUE;
}
/* Its per-thread-default-stream variant. */
API CUresult cuMemcpyDtoA_v2_ptds(CUarray a, size_t off, CUdeviceptr s, size_t n) {
    return cuMemcpyDtoA_v2(a, off, s, n);
}
/* Its legacy 32-bit ABI. */
API CUresult cuMemcpyDtoA(CUarray a, unsigned int off, CUdeviceptr_v1 s, unsigned int n) {
    return cuMemcpyDtoA_v2(a, off, s, n);
}

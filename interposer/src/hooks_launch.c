/* Work submission in elastic mode: every driver entry point that submits work which may read or write
 * device memory (kernel and graph launches, all copies with a linear-memory side, all sets, stream memory
 * operations, decompression) passes the work gate (elastic.c), so that none is submitted while this process
 * moves an elastic range between HBM and host memory, and each counts as activity (a process that makes none
 * for idle_after is idle). Without elastic mode the gate is one predictable branch. Every hook here forwards
 * its arguments unchanged. Which entry points are gated, and which deliberately not: docs/architecture.md,
 * "The work gate"; tests/elastic/test_elastic_gate.py checks the list against cuda.h's. */
#define _GNU_SOURCE
#include "shim.h"

/* One gated forwarder per entry point: PROLOGUE, the gate around the driver's own call. */
#define GATED(name, params, args)                                                                          \
    HOOK CUresult CUDAAPI name params {                                                                    \
        PROLOGUE();                                                                                        \
        __auto_type real = REAL(name);                                                                     \
        if (!real) return CUDA_ERROR_NOT_SUPPORTED;                                                        \
        work_enter();                                                                                      \
        CUresult rc = real args;                                                                           \
        work_exit();                                                                                       \
        return rc;                                                                                         \
    }

/* The stream of a cuLaunchKernelEx configuration: cuda.h's CUlaunchConfig starts with seven unsigned ints
 * (grid, block, shared memory) and then the stream (CUDA 12.0+); only that prefix is read. */
struct launch_config_head { unsigned int dims[7]; CUstream hStream; };
static CUstream launch_stream(const CUlaunchConfig *c) {
    return c ? ((const struct launch_config_head *)(const void *)c)->hStream : NULL;
}

/* Kernel and graph launches also pass the compute gate (compute.c): a bounded wait while the container is over
 * its compute limit or owes its neighbours GPU time, and events around the launch that measure its GPU time. */
#define LAUNCH(name, params, args, stream)                                                                \
    HOOK CUresult CUDAAPI name params {                                                                    \
        PROLOGUE();                                                                                        \
        __auto_type real = REAL(name);                                                                     \
        if (!real) return CUDA_ERROR_NOT_SUPPORTED;                                                        \
        CUstream s_ = (stream);                                                                            \
        int held_ = launch_enter(s_);                                                                      \
        work_enter();                                                                                      \
        CUresult rc = real args;                                                                           \
        work_exit();                                                                                       \
        launch_exit(held_, s_, rc);                                                                        \
        return rc;                                                                                         \
    }

/* Kernel launches: a kernel may read or write any elastic range. */
LAUNCH(cuLaunchKernel, (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                       unsigned int by, unsigned int bz, unsigned int shm, CUstream s, void **params, void **extra),
      (f, gx, gy, gz, bx, by, bz, shm, s, params, extra), s)
LAUNCH(cuLaunchKernel_ptsz, (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                            unsigned int by, unsigned int bz, unsigned int shm, CUstream s, void **params,
                            void **extra),
      (f, gx, gy, gz, bx, by, bz, shm, s, params, extra), s)
LAUNCH(cuLaunchKernelEx, (const CUlaunchConfig *c, CUfunction f, void **params, void **extra), (c, f, params, extra), launch_stream(c))
LAUNCH(cuLaunchKernelEx_ptsz, (const CUlaunchConfig *c, CUfunction f, void **params, void **extra),
      (c, f, params, extra), launch_stream(c))
LAUNCH(cuLaunchCooperativeKernel, (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                  unsigned int by, unsigned int bz, unsigned int shm, CUstream s, void **params),
      (f, gx, gy, gz, bx, by, bz, shm, s, params), s)
LAUNCH(cuLaunchCooperativeKernel_ptsz, (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                       unsigned int bx, unsigned int by, unsigned int bz, unsigned int shm,
                                       CUstream s, void **params),
      (f, gx, gy, gz, bx, by, bz, shm, s, params), s)
/* Graph launches: a graph's kernels and copies may touch any elastic range. */
LAUNCH(cuGraphLaunch, (CUgraphExec g, CUstream s), (g, s), s)
LAUNCH(cuGraphLaunch_ptsz, (CUgraphExec g, CUstream s), (g, s), s)
/* Copies: either side may be an elastic range. */
GATED(cuMemcpy, (CUdeviceptr d, CUdeviceptr s, size_t n), (d, s, n))
GATED(cuMemcpy_ptds, (CUdeviceptr d, CUdeviceptr s, size_t n), (d, s, n))
GATED(cuMemcpyAsync, (CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st), (d, s, n, st))
GATED(cuMemcpyAsync_ptsz, (CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st), (d, s, n, st))
GATED(cuMemcpyDtoD_v2, (CUdeviceptr d, CUdeviceptr s, size_t n), (d, s, n))
GATED(cuMemcpyHtoD_v2, (CUdeviceptr d, const void *h, size_t n), (d, h, n))
GATED(cuMemcpyHtoD_v2_ptds, (CUdeviceptr d, const void *h, size_t n), (d, h, n))
GATED(cuMemcpyDtoH_v2, (void *h, CUdeviceptr d, size_t n), (h, d, n))
GATED(cuMemcpyDtoH_v2_ptds, (void *h, CUdeviceptr d, size_t n), (h, d, n))
GATED(cuMemcpyHtoDAsync_v2, (CUdeviceptr d, const void *h, size_t n, CUstream st), (d, h, n, st))
GATED(cuMemcpyDtoHAsync_v2, (void *h, CUdeviceptr d, size_t n, CUstream st), (h, d, n, st))
/* Sets: the destination may be an elastic range. */
GATED(cuMemsetD8_v2, (CUdeviceptr d, unsigned char v, size_t n), (d, v, n))
GATED(cuMemsetD8_v2_ptds, (CUdeviceptr d, unsigned char v, size_t n), (d, v, n))
GATED(cuMemsetD32_v2, (CUdeviceptr d, unsigned int v, size_t n), (d, v, n))
/* Host-device and device-device copies not gated before (the legacy 32-bit ABI too). */
GATED(cuMemcpyDtoD, (CUdeviceptr_v1 dstDevice, CUdeviceptr_v1 srcDevice, unsigned int ByteCount),
      (dstDevice, srcDevice, ByteCount))
GATED(cuMemcpyDtoDAsync, (CUdeviceptr_v1 dstDevice, CUdeviceptr_v1 srcDevice, unsigned int ByteCount,
      CUstream hStream), (dstDevice, srcDevice, ByteCount, hStream))
GATED(cuMemcpyDtoDAsync_v2, (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream),
      (dstDevice, srcDevice, ByteCount, hStream))
GATED(cuMemcpyDtoDAsync_v2_ptsz, (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream),
      (dstDevice, srcDevice, ByteCount, hStream))
GATED(cuMemcpyDtoD_v2_ptds, (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount),
      (dstDevice, srcDevice, ByteCount))
GATED(cuMemcpyDtoH, (void *dstHost, CUdeviceptr_v1 srcDevice, unsigned int ByteCount),
      (dstHost, srcDevice, ByteCount))
GATED(cuMemcpyDtoHAsync, (void *dstHost, CUdeviceptr_v1 srcDevice, unsigned int ByteCount, CUstream hStream),
      (dstHost, srcDevice, ByteCount, hStream))
GATED(cuMemcpyDtoHAsync_v2_ptsz, (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream),
      (dstHost, srcDevice, ByteCount, hStream))
GATED(cuMemcpyHtoD, (CUdeviceptr_v1 dstDevice, const void *srcHost, unsigned int ByteCount),
      (dstDevice, srcHost, ByteCount))
GATED(cuMemcpyHtoDAsync, (CUdeviceptr_v1 dstDevice, const void *srcHost, unsigned int ByteCount, CUstream hStream),
      (dstDevice, srcHost, ByteCount, hStream))
GATED(cuMemcpyHtoDAsync_v2_ptsz, (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream),
      (dstDevice, srcHost, ByteCount, hStream))
/* Copies between a CUDA array and device memory. */
GATED(cuMemcpyAtoD, (CUdeviceptr_v1 dstDevice, CUarray srcArray, unsigned int srcOffset, unsigned int ByteCount),
      (dstDevice, srcArray, srcOffset, ByteCount))
GATED(cuMemcpyAtoD_v2, (CUdeviceptr dstDevice, CUarray srcArray, size_t srcOffset, size_t ByteCount),
      (dstDevice, srcArray, srcOffset, ByteCount))
GATED(cuMemcpyAtoD_v2_ptds, (CUdeviceptr dstDevice, CUarray srcArray, size_t srcOffset, size_t ByteCount),
      (dstDevice, srcArray, srcOffset, ByteCount))
GATED(cuMemcpyDtoA, (CUarray dstArray, unsigned int dstOffset, CUdeviceptr_v1 srcDevice, unsigned int ByteCount),
      (dstArray, dstOffset, srcDevice, ByteCount))
GATED(cuMemcpyDtoA_v2, (CUarray dstArray, size_t dstOffset, CUdeviceptr srcDevice, size_t ByteCount),
      (dstArray, dstOffset, srcDevice, ByteCount))
GATED(cuMemcpyDtoA_v2_ptds, (CUarray dstArray, size_t dstOffset, CUdeviceptr srcDevice, size_t ByteCount),
      (dstArray, dstOffset, srcDevice, ByteCount))
/* Copies between contexts (peer copies): either side may be an elastic range of this process. */
GATED(cuMemcpy3DPeer, (const CUDA_MEMCPY3D_PEER *pCopy), (pCopy))
GATED(cuMemcpy3DPeerAsync, (const CUDA_MEMCPY3D_PEER *pCopy, CUstream hStream), (pCopy, hStream))
GATED(cuMemcpy3DPeerAsync_ptsz, (const CUDA_MEMCPY3D_PEER *pCopy, CUstream hStream), (pCopy, hStream))
GATED(cuMemcpy3DPeer_ptds, (const CUDA_MEMCPY3D_PEER *pCopy), (pCopy))
GATED(cuMemcpyPeer, (CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext,
      size_t ByteCount), (dstDevice, dstContext, srcDevice, srcContext, ByteCount))
GATED(cuMemcpyPeerAsync, (CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext,
      size_t ByteCount, CUstream hStream), (dstDevice, dstContext, srcDevice, srcContext, ByteCount, hStream))
GATED(cuMemcpyPeerAsync_ptsz, (CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
      CUcontext srcContext, size_t ByteCount, CUstream hStream),
      (dstDevice, dstContext, srcDevice, srcContext, ByteCount, hStream))
GATED(cuMemcpyPeer_ptds, (CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext,
      size_t ByteCount), (dstDevice, dstContext, srcDevice, srcContext, ByteCount))
/* 2D and 3D copies: any operand of type DEVICE or UNIFIED may lie in an elastic range. */
GATED(cuMemcpy2D, (const CUDA_MEMCPY2D_v1 *pCopy), (pCopy))
GATED(cuMemcpy2DAsync, (const CUDA_MEMCPY2D_v1 *pCopy, CUstream hStream), (pCopy, hStream))
GATED(cuMemcpy2DAsync_v2, (const CUDA_MEMCPY2D *pCopy, CUstream hStream), (pCopy, hStream))
GATED(cuMemcpy2DAsync_v2_ptsz, (const CUDA_MEMCPY2D *pCopy, CUstream hStream), (pCopy, hStream))
GATED(cuMemcpy2DUnaligned, (const CUDA_MEMCPY2D_v1 *pCopy), (pCopy))
GATED(cuMemcpy2DUnaligned_v2, (const CUDA_MEMCPY2D *pCopy), (pCopy))
GATED(cuMemcpy2DUnaligned_v2_ptds, (const CUDA_MEMCPY2D *pCopy), (pCopy))
GATED(cuMemcpy2D_v2, (const CUDA_MEMCPY2D *pCopy), (pCopy))
GATED(cuMemcpy2D_v2_ptds, (const CUDA_MEMCPY2D *pCopy), (pCopy))
GATED(cuMemcpy3D, (const CUDA_MEMCPY3D_v1 *pCopy), (pCopy))
GATED(cuMemcpy3DAsync, (const CUDA_MEMCPY3D_v1 *pCopy, CUstream hStream), (pCopy, hStream))
GATED(cuMemcpy3DAsync_v2, (const CUDA_MEMCPY3D *pCopy, CUstream hStream), (pCopy, hStream))
GATED(cuMemcpy3DAsync_v2_ptsz, (const CUDA_MEMCPY3D *pCopy, CUstream hStream), (pCopy, hStream))
GATED(cuMemcpy3D_v2, (const CUDA_MEMCPY3D *pCopy), (pCopy))
GATED(cuMemcpy3D_v2_ptds, (const CUDA_MEMCPY3D *pCopy), (pCopy))
/* Batch and attributed copies (CUDA 12.8+). */
GATED(cuMemcpy3DBatchAsync, (size_t numOps, CUDA_MEMCPY3D_BATCH_OP *opList, size_t *failIdx, unsigned long long flags,
      CUstream hStream), (numOps, opList, failIdx, flags, hStream))
GATED(cuMemcpy3DBatchAsync_ptsz, (size_t numOps, CUDA_MEMCPY3D_BATCH_OP *opList, size_t *failIdx,
      unsigned long long flags, CUstream hStream), (numOps, opList, failIdx, flags, hStream))
GATED(cuMemcpy3DBatchAsync_v2, (size_t numOps, CUDA_MEMCPY3D_BATCH_OP *opList, unsigned long long flags,
      CUstream hStream), (numOps, opList, flags, hStream))
GATED(cuMemcpy3DBatchAsync_v2_ptsz, (size_t numOps, CUDA_MEMCPY3D_BATCH_OP *opList, unsigned long long flags,
      CUstream hStream), (numOps, opList, flags, hStream))
GATED(cuMemcpy3DWithAttributesAsync, (CUDA_MEMCPY3D_BATCH_OP *op, unsigned long long flags, CUstream hStream),
      (op, flags, hStream))
GATED(cuMemcpy3DWithAttributesAsync_ptsz, (CUDA_MEMCPY3D_BATCH_OP *op, unsigned long long flags, CUstream hStream),
      (op, flags, hStream))
GATED(cuMemcpyBatchAsync, (CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
      CUmemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs, size_t *failIdx, CUstream hStream),
      (dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, failIdx, hStream))
GATED(cuMemcpyBatchAsync_ptsz, (CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
      CUmemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs, size_t *failIdx, CUstream hStream),
      (dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, failIdx, hStream))
GATED(cuMemcpyBatchAsync_v2, (CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
      CUmemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs, CUstream hStream),
      (dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, hStream))
GATED(cuMemcpyBatchAsync_v2_ptsz, (CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
      CUmemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs, CUstream hStream),
      (dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, hStream))
GATED(cuMemcpyWithAttributesAsync, (CUdeviceptr dst, CUdeviceptr src, size_t size, CUmemcpyAttributes *attr,
      CUstream hStream), (dst, src, size, attr, hStream))
GATED(cuMemcpyWithAttributesAsync_ptsz, (CUdeviceptr dst, CUdeviceptr src, size_t size, CUmemcpyAttributes *attr,
      CUstream hStream), (dst, src, size, attr, hStream))
/* Sets of 8, 16 and 32-bit values, linear and 2D, synchronous and asynchronous. */
GATED(cuMemsetD16, (CUdeviceptr_v1 dstDevice, unsigned short us, unsigned int N), (dstDevice, us, N))
GATED(cuMemsetD16Async, (CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream),
      (dstDevice, us, N, hStream))
GATED(cuMemsetD16Async_ptsz, (CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream),
      (dstDevice, us, N, hStream))
GATED(cuMemsetD16_v2, (CUdeviceptr dstDevice, unsigned short us, size_t N), (dstDevice, us, N))
GATED(cuMemsetD16_v2_ptds, (CUdeviceptr dstDevice, unsigned short us, size_t N), (dstDevice, us, N))
GATED(cuMemsetD2D16, (CUdeviceptr_v1 dstDevice, unsigned int dstPitch, unsigned short us, unsigned int Width,
      unsigned int Height), (dstDevice, dstPitch, us, Width, Height))
GATED(cuMemsetD2D16Async, (CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width, size_t Height,
      CUstream hStream), (dstDevice, dstPitch, us, Width, Height, hStream))
GATED(cuMemsetD2D16Async_ptsz, (CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width,
      size_t Height, CUstream hStream), (dstDevice, dstPitch, us, Width, Height, hStream))
GATED(cuMemsetD2D16_v2, (CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width, size_t Height),
      (dstDevice, dstPitch, us, Width, Height))
GATED(cuMemsetD2D16_v2_ptds, (CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width, size_t Height),
      (dstDevice, dstPitch, us, Width, Height))
GATED(cuMemsetD2D32, (CUdeviceptr_v1 dstDevice, unsigned int dstPitch, unsigned int ui, unsigned int Width,
      unsigned int Height), (dstDevice, dstPitch, ui, Width, Height))
GATED(cuMemsetD2D32Async, (CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width, size_t Height,
      CUstream hStream), (dstDevice, dstPitch, ui, Width, Height, hStream))
GATED(cuMemsetD2D32Async_ptsz, (CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width, size_t Height,
      CUstream hStream), (dstDevice, dstPitch, ui, Width, Height, hStream))
GATED(cuMemsetD2D32_v2, (CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width, size_t Height),
      (dstDevice, dstPitch, ui, Width, Height))
GATED(cuMemsetD2D32_v2_ptds, (CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width, size_t Height),
      (dstDevice, dstPitch, ui, Width, Height))
GATED(cuMemsetD2D8, (CUdeviceptr_v1 dstDevice, unsigned int dstPitch, unsigned char uc, unsigned int Width,
      unsigned int Height), (dstDevice, dstPitch, uc, Width, Height))
GATED(cuMemsetD2D8Async, (CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width, size_t Height,
      CUstream hStream), (dstDevice, dstPitch, uc, Width, Height, hStream))
GATED(cuMemsetD2D8Async_ptsz, (CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width, size_t Height,
      CUstream hStream), (dstDevice, dstPitch, uc, Width, Height, hStream))
GATED(cuMemsetD2D8_v2, (CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width, size_t Height),
      (dstDevice, dstPitch, uc, Width, Height))
GATED(cuMemsetD2D8_v2_ptds, (CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width, size_t Height),
      (dstDevice, dstPitch, uc, Width, Height))
GATED(cuMemsetD32, (CUdeviceptr_v1 dstDevice, unsigned int ui, unsigned int N), (dstDevice, ui, N))
GATED(cuMemsetD32Async, (CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream),
      (dstDevice, ui, N, hStream))
GATED(cuMemsetD32Async_ptsz, (CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream),
      (dstDevice, ui, N, hStream))
GATED(cuMemsetD32_v2_ptds, (CUdeviceptr dstDevice, unsigned int ui, size_t N), (dstDevice, ui, N))
GATED(cuMemsetD8, (CUdeviceptr_v1 dstDevice, unsigned char uc, unsigned int N), (dstDevice, uc, N))
GATED(cuMemsetD8Async, (CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream),
      (dstDevice, uc, N, hStream))
GATED(cuMemsetD8Async_ptsz, (CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream),
      (dstDevice, uc, N, hStream))
/* Legacy launches (a kernel may touch any elastic range). */
LAUNCH(cuLaunch, (CUfunction f), (f), NULL)
GATED(cuLaunchCooperativeKernelMultiDevice, (CUDA_LAUNCH_PARAMS *launchParamsList, unsigned int numDevices,
      unsigned int flags), (launchParamsList, numDevices, flags))
LAUNCH(cuLaunchGrid, (CUfunction f, int grid_width, int grid_height), (f, grid_width, grid_height), NULL)
LAUNCH(cuLaunchGridAsync, (CUfunction f, int grid_width, int grid_height, CUstream hStream),
      (f, grid_width, grid_height, hStream), hStream)
/* Stream memory operations: the GPU writes or polls a device address. */
GATED(cuStreamBatchMemOp, (CUstream stream, unsigned int count, CUstreamBatchMemOpParams *paramArray,
      unsigned int flags), (stream, count, paramArray, flags))
GATED(cuStreamBatchMemOp_ptsz, (CUstream stream, unsigned int count, CUstreamBatchMemOpParams *paramArray,
      unsigned int flags), (stream, count, paramArray, flags))
GATED(cuStreamBatchMemOp_v2, (CUstream stream, unsigned int count, CUstreamBatchMemOpParams *paramArray,
      unsigned int flags), (stream, count, paramArray, flags))
GATED(cuStreamBatchMemOp_v2_ptsz, (CUstream stream, unsigned int count, CUstreamBatchMemOpParams *paramArray,
      unsigned int flags), (stream, count, paramArray, flags))
GATED(cuStreamWaitValue32, (CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags),
      (stream, addr, value, flags))
GATED(cuStreamWaitValue32_ptsz, (CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags),
      (stream, addr, value, flags))
GATED(cuStreamWaitValue32_v2, (CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags),
      (stream, addr, value, flags))
GATED(cuStreamWaitValue32_v2_ptsz, (CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags),
      (stream, addr, value, flags))
GATED(cuStreamWaitValue64, (CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags),
      (stream, addr, value, flags))
GATED(cuStreamWaitValue64_ptsz, (CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags),
      (stream, addr, value, flags))
GATED(cuStreamWaitValue64_v2, (CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags),
      (stream, addr, value, flags))
GATED(cuStreamWaitValue64_v2_ptsz, (CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags),
      (stream, addr, value, flags))
GATED(cuStreamWriteValue32, (CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags),
      (stream, addr, value, flags))
GATED(cuStreamWriteValue32_ptsz, (CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags),
      (stream, addr, value, flags))
GATED(cuStreamWriteValue32_v2, (CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags),
      (stream, addr, value, flags))
GATED(cuStreamWriteValue32_v2_ptsz, (CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags),
      (stream, addr, value, flags))
GATED(cuStreamWriteValue64, (CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags),
      (stream, addr, value, flags))
GATED(cuStreamWriteValue64_ptsz, (CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags),
      (stream, addr, value, flags))
GATED(cuStreamWriteValue64_v2, (CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags),
      (stream, addr, value, flags))
GATED(cuStreamWriteValue64_v2_ptsz, (CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags),
      (stream, addr, value, flags))
/* Decompression (CUDA 12.8+): the engine reads and writes device memory. */
GATED(cuMemBatchDecompressAsync, (CUmemDecompressParams *paramsArray, size_t count, unsigned int flags,
      size_t *errorIndex, CUstream stream), (paramsArray, count, flags, errorIndex, stream))
GATED(cuMemBatchDecompressAsync_ptsz, (CUmemDecompressParams *paramsArray, size_t count, unsigned int flags,
      size_t *errorIndex, CUstream stream), (paramsArray, count, flags, errorIndex, stream))

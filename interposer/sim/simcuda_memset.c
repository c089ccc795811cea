/* Simulated driver: memsets of 8, 16 and 32-bit values, linear and 2D, in every ABI variant of cuda.h. As
 * cuda.h documents: the destination of a 16-bit set must be two-byte aligned and of a 32-bit set four-byte
 * aligned; a 2D set writes Width elements in each of Height rows dstPitch bytes apart (the pitch is unused
 * when Height is 1). Done when the call returns (Async too); a set that touches reserved but unmapped
 * memory faults, like a copy (simcuda_copy.c). */
#define _GNU_SOURCE
#include <string.h>

#include "simcuda.h"

/* Height rows of width elements of `size` bytes (1, 2 or 4) set to v, rows pitch bytes apart. */
static CUresult set_rows(CUdeviceptr d, size_t pitch, unsigned int v, unsigned size, size_t width, size_t height) {
    NEED_INIT();
    if (!width || !height) return CUDA_SUCCESS;
    if (!d || d % size || (height > 1 && (pitch < width * size || pitch % size))) return CUDA_ERROR_INVALID_VALUE;
    for (size_t r = 0; r < height; r++) {
        unsigned char *row = (unsigned char *)(uintptr_t)(d + r * (height > 1 ? pitch : 0));
        if (size == 1) {
            memset(row, (int)(v & 0xff), width);
        } else if (size == 2) {
            unsigned short *p = (unsigned short *)row;
            for (size_t i = 0; i < width; i++) p[i] = (unsigned short)v;
        } else {
            unsigned int *p = (unsigned int *)row;
            for (size_t i = 0; i < width; i++) p[i] = v;
        }
    }
    return CUDA_SUCCESS;
}

/* ---- every ABI variant --------------------------------------------------------------------------------
 * Each width (8, 16, 32 bits) has the same five linear and five 2D entry points: the _v2 call that does the
 * work, its per-thread-default-stream variant (_ptds), the legacy 32-bit ABI, the Async call (done when it
 * returns, so the stream is not needed) and its per-thread variant (_ptsz). One macro per shape writes them,
 * so that the variants cannot drift apart. */
#define LINEAR_SETS(bits, T, size)                                                                          \
    API CUresult cuMemsetD##bits##_v2(CUdeviceptr d, T v, size_t n) { return set_rows(d, 0, v, size, n, 1); } \
    API CUresult cuMemsetD##bits##_v2_ptds(CUdeviceptr d, T v, size_t n) { return cuMemsetD##bits##_v2(d, v, n); } \
    API CUresult cuMemsetD##bits(CUdeviceptr_v1 d, T v, unsigned int n) { return cuMemsetD##bits##_v2(d, v, n); } \
    API CUresult cuMemsetD##bits##Async(CUdeviceptr d, T v, size_t n, CUstream s) {                          \
        (void)s;                                                                                           \
        return cuMemsetD##bits##_v2(d, v, n);                                                              \
    }                                                                                                      \
    API CUresult cuMemsetD##bits##Async_ptsz(CUdeviceptr d, T v, size_t n, CUstream s) {                     \
        return cuMemsetD##bits##Async(d, v, n, s);                                                         \
    }

#define SETS_2D(bits, T, size)                                                                              \
    API CUresult cuMemsetD2D##bits##_v2(CUdeviceptr d, size_t p, T v, size_t w, size_t h) {                 \
        return set_rows(d, p, v, size, w, h);                                                              \
    }                                                                                                      \
    API CUresult cuMemsetD2D##bits##_v2_ptds(CUdeviceptr d, size_t p, T v, size_t w, size_t h) {            \
        return cuMemsetD2D##bits##_v2(d, p, v, w, h);                                                      \
    }                                                                                                      \
    API CUresult cuMemsetD2D##bits(CUdeviceptr_v1 d, unsigned int p, T v, unsigned int w, unsigned int h) { \
        return cuMemsetD2D##bits##_v2(d, p, v, w, h);                                                      \
    }                                                                                                      \
    API CUresult cuMemsetD2D##bits##Async(CUdeviceptr d, size_t p, T v, size_t w, size_t h, CUstream s) {   \
        (void)s;                                                                                           \
        return cuMemsetD2D##bits##_v2(d, p, v, w, h);                                                      \
    }                                                                                                      \
    API CUresult cuMemsetD2D##bits##Async_ptsz(CUdeviceptr d, size_t p, T v, size_t w, size_t h, CUstream s) { \
        return cuMemsetD2D##bits##Async(d, p, v, w, h, s);                                                 \
    }

/* Set n bytes, 16-bit or 32-bit words. */
LINEAR_SETS(8, unsigned char, 1)
LINEAR_SETS(16, unsigned short, 2)
LINEAR_SETS(32, unsigned int, 4)
/* Set a w x h block of bytes, 16-bit or 32-bit words, rows p bytes apart. */
SETS_2D(8, unsigned char, 1)
SETS_2D(16, unsigned short, 2)
SETS_2D(32, unsigned int, 4)

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

/* ---- linear ------------------------------------------------------------------------------------------- */
/* Set n bytes. */
API CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { return set_rows(d, 0, v, 1, n, 1); }
/* Its per-thread-default-stream variant. */
API CUresult cuMemsetD8_v2_ptds(CUdeviceptr d, unsigned char v, size_t n) { return cuMemsetD8_v2(d, v, n); }
/* Its legacy 32-bit ABI. */
API CUresult cuMemsetD8(CUdeviceptr_v1 d, unsigned char v, unsigned int n) { return cuMemsetD8_v2(d, v, n); }
/* Asynchronous: done when it returns. */
API CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) {
    (void)s;
    return cuMemsetD8_v2(d, v, n);
}
/* Its per-thread-default-stream variant. */
API CUresult cuMemsetD8Async_ptsz(CUdeviceptr d, unsigned char v, size_t n, CUstream s) {
    return cuMemsetD8Async(d, v, n, s);
}
/* Set n 16-bit words. */
API CUresult cuMemsetD16_v2(CUdeviceptr d, unsigned short v, size_t n) { return set_rows(d, 0, v, 2, n, 1); }
/* Its per-thread-default-stream variant. */
API CUresult cuMemsetD16_v2_ptds(CUdeviceptr d, unsigned short v, size_t n) { return cuMemsetD16_v2(d, v, n); }
/* Its legacy 32-bit ABI. */
API CUresult cuMemsetD16(CUdeviceptr_v1 d, unsigned short v, unsigned int n) { return cuMemsetD16_v2(d, v, n); }
/* Asynchronous: done when it returns. */
API CUresult cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream s) {
    (void)s;
    return cuMemsetD16_v2(d, v, n);
}
/* Its per-thread-default-stream variant. */
API CUresult cuMemsetD16Async_ptsz(CUdeviceptr d, unsigned short v, size_t n, CUstream s) {
    return cuMemsetD16Async(d, v, n, s);
}
/* Set n 32-bit words. */
API CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned int v, size_t n) { return set_rows(d, 0, v, 4, n, 1); }
/* Its per-thread-default-stream variant. */
API CUresult cuMemsetD32_v2_ptds(CUdeviceptr d, unsigned int v, size_t n) { return cuMemsetD32_v2(d, v, n); }
/* Its legacy 32-bit ABI. */
API CUresult cuMemsetD32(CUdeviceptr_v1 d, unsigned int v, unsigned int n) { return cuMemsetD32_v2(d, v, n); }
/* Asynchronous: done when it returns. */
API CUresult cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream s) {
    (void)s;
    return cuMemsetD32_v2(d, v, n);
}
/* Its per-thread-default-stream variant. */
API CUresult cuMemsetD32Async_ptsz(CUdeviceptr d, unsigned int v, size_t n, CUstream s) {
    return cuMemsetD32Async(d, v, n, s);
}

/* ---- 2D ----------------------------------------------------------------------------------------------- */
/* Set a w x h block of bytes, rows p bytes apart. */
API CUresult cuMemsetD2D8_v2(CUdeviceptr d, size_t p, unsigned char v, size_t w, size_t h) {
    return set_rows(d, p, v, 1, w, h);
}
/* Its per-thread-default-stream variant. */
API CUresult cuMemsetD2D8_v2_ptds(CUdeviceptr d, size_t p, unsigned char v, size_t w, size_t h) {
    return cuMemsetD2D8_v2(d, p, v, w, h);
}
/* Its legacy 32-bit ABI. */
API CUresult cuMemsetD2D8(CUdeviceptr_v1 d, unsigned int p, unsigned char v, unsigned int w, unsigned int h) {
    return cuMemsetD2D8_v2(d, p, v, w, h);
}
/* Asynchronous: done when it returns. */
API CUresult cuMemsetD2D8Async(CUdeviceptr d, size_t p, unsigned char v, size_t w, size_t h, CUstream s) {
    (void)s;
    return cuMemsetD2D8_v2(d, p, v, w, h);
}
/* Its per-thread-default-stream variant. */
API CUresult cuMemsetD2D8Async_ptsz(CUdeviceptr d, size_t p, unsigned char v, size_t w, size_t h, CUstream s) {
    return cuMemsetD2D8Async(d, p, v, w, h, s);
}
/* Set a w x h block of 16-bit words, rows p bytes apart. */
API CUresult cuMemsetD2D16_v2(CUdeviceptr d, size_t p, unsigned short v, size_t w, size_t h) {
    return set_rows(d, p, v, 2, w, h);
}
/* Its per-thread-default-stream variant. */
API CUresult cuMemsetD2D16_v2_ptds(CUdeviceptr d, size_t p, unsigned short v, size_t w, size_t h) {
    return cuMemsetD2D16_v2(d, p, v, w, h);
}
/* Its legacy 32-bit ABI. */
API CUresult cuMemsetD2D16(CUdeviceptr_v1 d, unsigned int p, unsigned short v, unsigned int w, unsigned int h) {
    return cuMemsetD2D16_v2(d, p, v, w, h);
}
/* Asynchronous: done when it returns. */
API CUresult cuMemsetD2D16Async(CUdeviceptr d, size_t p, unsigned short v, size_t w, size_t h, CUstream s) {
    (void)s;
    return cuMemsetD2D16_v2(d, p, v, w, h);
}
/* Its per-thread-default-stream variant. */
API CUresult cuMemsetD2D16Async_ptsz(CUdeviceptr d, size_t p, unsigned short v, size_t w, size_t h, CUstream s) {
    return cuMemsetD2D16Async(d, p, v, w, h, s);
}
/* Set a w x h block of 32-bit words, rows p bytes apart. */
API CUresult cuMemsetD2D32_v2(CUdeviceptr d, size_t p, unsigned int v, size_t w, size_t h) {
    return set_rows(d, p, v, 4, w, h);
}
/* Its per-thread-default-stream variant. */
API CUresult cuMemsetD2D32_v2_ptds(CUdeviceptr d, size_t p, unsigned int v, size_t w, size_t h) {
    return cuMemsetD2D32_v2(d, p, v, w, h);
}
/* Its legacy 32-bit ABI. */
API CUresult cuMemsetD2D32(CUdeviceptr_v1 d, unsigned int p, unsigned int v, unsigned int w, unsigned int h) {
    return cuMemsetD2D32_v2(d, p, v, w, h);
}
/* Asynchronous: done when it returns. */
API CUresult cuMemsetD2D32Async(CUdeviceptr d, size_t p, unsigned int v, size_t w, size_t h, CUstream s) {
    (void)s;
    return cuMemsetD2D32_v2(d, p, v, w, h);
}
/* Its per-thread-default-stream variant. */
API CUresult cuMemsetD2D32Async_ptsz(CUdeviceptr d, size_t p, unsigned int v, size_t w, size_t h, CUstream s) {
    return cuMemsetD2D32Async(d, p, v, w, h, s);
}

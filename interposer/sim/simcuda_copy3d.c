/* Simulated driver: copies with descriptors (cuMemcpy2D, cuMemcpy2DUnaligned, cuMemcpy3D, cuMemcpy3DPeer,
 * their Async, per-thread and legacy 32-bit variants) and the batch and attributed copies of CUDA 12.8+
 * (cuMemcpyBatchAsync, cuMemcpy3DBatchAsync, cuMemcpy[3D]WithAttributesAsync), as cuda.h documents them:
 *  - each side is HOST (srcHost), DEVICE or UNIFIED (srcDevice), with srcPitch bytes per row and, in 3D,
 *    srcHeight rows per layer; or ARRAY (srcArray, whose own layout replaces pitch and height);
 *  - the copy starts at (srcXInBytes, srcY, srcZ) and is WidthInBytes x Height x Depth;
 *  - srcLOD/dstLOD must be 0 and reserved0/reserved1 NULL; a linear side's rows must hold X + WidthInBytes,
 *    an array side's extent must hold the whole copy; otherwise CUDA_ERROR_INVALID_VALUE;
 *  - batch copies: every attribute's srcAccessOrder is valid, attrsIdxs starts at 0 and increases, flags are
 *    0, the stream is not the NULL stream; 3D batch extents are in elements (1 byte pointer to pointer, the
 *    array's element otherwise), rowLength/layerHeight 0 mean tightly packed.
 * Pitches need no particular alignment here, so cuMemcpy2DUnaligned is cuMemcpy2D. Every copy is done when
 * the call returns, and a copy touching reserved but unmapped memory faults (simcuda_copy.c). */
#define _GNU_SOURCE
#include <stdint.h>
#include <string.h>

#include "sim_internal.h"
#include "simcuda.h"

/* One side of a copy, resolved: where element (0,0,0) is, bytes per row, rows per layer, and (arrays) the
 * extent it must stay inside (0 for linear memory, which the caller bounds). */
struct side { uintptr_t base; size_t pitch, height, x, y, z; uint64_t row_bytes, rows, layers; };

/* Resolve one side of a descriptor. 0, or -1 (bad memory type, null pointer, not an array, LOD != 0). */
static int side_of(int type, const void *host, CUdeviceptr dev, CUarray arr, size_t pitch, size_t height,
                   size_t x, size_t y, size_t z, size_t lod, struct side *s) {
    struct sim_layout l;
    *s = (struct side){0, pitch, height, x, y, z, 0, 0, 0};
    if (lod) return -1;
    switch (type) {
    case CU_MEMORYTYPE_HOST: s->base = (uintptr_t)host; break;
    case CU_MEMORYTYPE_DEVICE: case CU_MEMORYTYPE_UNIFIED: s->base = (uintptr_t)dev; break;
    case CU_MEMORYTYPE_ARRAY:
        if (sim_array_layout(arr, &l) < 0) return -1;
        *s = (struct side){(uintptr_t)l.mem, l.row_bytes, l.rows, x, y, z, l.row_bytes, l.rows, l.layers};
        break;
    default: return -1;
    }
    return s->base ? 0 : -1;
}

/* Whether a w-byte x h x d copy fits this side: rows hold x + w bytes (and, in 3D, layers y + h rows);
 * an array holds the whole box. */
static int fits(const struct side *s, size_t w, size_t h, size_t d) {
    if (s->row_bytes)
        return s->x + w <= s->row_bytes && s->y + h <= s->rows && s->z + d <= s->layers;
    if (h > 1 || d > 1 || s->y || s->z) {
        if (s->x + w > s->pitch) return 0;
        if (d > 1 || s->z) return s->y + h <= s->height;
    }
    return 1;
}

/* The copy itself, row by row (memmove: overlapping rows are undefined in CUDA, harmless here). */
static CUresult copy_box(const struct side *src, const struct side *dst, size_t w, size_t h, size_t d) {
    NEED_INIT();
    if (!w || !h || !d) return CUDA_SUCCESS;
    if (!fits(src, w, h, d) || !fits(dst, w, h, d)) return CUDA_ERROR_INVALID_VALUE;
    for (size_t k = 0; k < d; k++)
        for (size_t j = 0; j < h; j++) {
            uintptr_t so = ((src->z + k) * src->height + src->y + j) * src->pitch + src->x;
            uintptr_t dof = ((dst->z + k) * dst->height + dst->y + j) * dst->pitch + dst->x;
            memmove((void *)(dst->base + dof), (const void *)(src->base + so), w);
        }
    return CUDA_SUCCESS;
}

/* ---- 2D ----------------------------------------------------------------------------------------------- */
/* A 2D copy (one layer: heights do not matter). */
API CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D *c) {
    NEED_INIT();
    struct side s, d;
    if (!c || side_of(c->srcMemoryType, c->srcHost, c->srcDevice, c->srcArray, c->srcPitch, 1, c->srcXInBytes,
                      c->srcY, 0, 0, &s) < 0 ||
        side_of(c->dstMemoryType, c->dstHost, c->dstDevice, c->dstArray, c->dstPitch, 1, c->dstXInBytes, c->dstY,
                0, 0, &d) < 0)
        return CUDA_ERROR_INVALID_VALUE;
    s.height = c->srcY + c->Height; /* one layer: the layer stride is never used */
    d.height = c->dstY + c->Height;
    if (s.row_bytes) s.height = s.rows;
    if (d.row_bytes) d.height = d.rows;
    return copy_box(&s, &d, c->WidthInBytes, c->Height, 1);
}
/* Its per-thread-default-stream variant. */
API CUresult cuMemcpy2D_v2_ptds(const CUDA_MEMCPY2D *c) { return cuMemcpy2D_v2(c); }
/* The legacy 32-bit descriptor, widened. */
static CUDA_MEMCPY2D widen2d(const CUDA_MEMCPY2D_v1 *c) {
    return (CUDA_MEMCPY2D){c->srcXInBytes, c->srcY, c->srcMemoryType, c->srcHost, c->srcDevice, c->srcArray,
                           c->srcPitch, c->dstXInBytes, c->dstY, c->dstMemoryType, c->dstHost, c->dstDevice,
                           c->dstArray, c->dstPitch, c->WidthInBytes, c->Height};
}
/* Its legacy 32-bit ABI. */
API CUresult cuMemcpy2D(const CUDA_MEMCPY2D_v1 *c) {
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    CUDA_MEMCPY2D w = widen2d(c);
    return cuMemcpy2D_v2(&w);
}
/* No pitch alignment is required here: the same as cuMemcpy2D. */
API CUresult cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D *c) { return cuMemcpy2D_v2(c); }
/* Its per-thread-default-stream variant. */
API CUresult cuMemcpy2DUnaligned_v2_ptds(const CUDA_MEMCPY2D *c) { return cuMemcpy2D_v2(c); }
/* Its legacy 32-bit ABI. */
API CUresult cuMemcpy2DUnaligned(const CUDA_MEMCPY2D_v1 *c) { return cuMemcpy2D(c); }
/* Asynchronous: done when it returns. */
API CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *c, CUstream st) { (void)st; return cuMemcpy2D_v2(c); }
/* Its per-thread-default-stream variant. */
API CUresult cuMemcpy2DAsync_v2_ptsz(const CUDA_MEMCPY2D *c, CUstream st) { return cuMemcpy2DAsync_v2(c, st); }
/* Its legacy 32-bit ABI. */
API CUresult cuMemcpy2DAsync(const CUDA_MEMCPY2D_v1 *c, CUstream st) { (void)st; return cuMemcpy2D(c); }

/* ---- 3D ----------------------------------------------------------------------------------------------- */
/* A 3D copy. */
API CUresult cuMemcpy3D_v2(const CUDA_MEMCPY3D *c) {
    NEED_INIT();
    struct side s, d;
    if (!c || c->reserved0 || c->reserved1 ||
        side_of(c->srcMemoryType, c->srcHost, c->srcDevice, c->srcArray, c->srcPitch, c->srcHeight,
                c->srcXInBytes, c->srcY, c->srcZ, c->srcLOD, &s) < 0 ||
        side_of(c->dstMemoryType, c->dstHost, c->dstDevice, c->dstArray, c->dstPitch, c->dstHeight,
                c->dstXInBytes, c->dstY, c->dstZ, c->dstLOD, &d) < 0)
        return CUDA_ERROR_INVALID_VALUE;
    return copy_box(&s, &d, c->WidthInBytes, c->Height, c->Depth);
}
/* Its per-thread-default-stream variant. */
API CUresult cuMemcpy3D_v2_ptds(const CUDA_MEMCPY3D *c) { return cuMemcpy3D_v2(c); }
/* Its legacy 32-bit ABI, widened. */
API CUresult cuMemcpy3D(const CUDA_MEMCPY3D_v1 *c) {
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    CUDA_MEMCPY3D w = {c->srcXInBytes, c->srcY, c->srcZ, c->srcLOD, c->srcMemoryType, c->srcHost, c->srcDevice,
                       c->srcArray, c->reserved0, c->srcPitch, c->srcHeight, c->dstXInBytes, c->dstY, c->dstZ,
                       c->dstLOD, c->dstMemoryType, c->dstHost, c->dstDevice, c->dstArray, c->reserved1,
                       c->dstPitch, c->dstHeight, c->WidthInBytes, c->Height, c->Depth};
    return cuMemcpy3D_v2(&w);
}
/* Asynchronous: done when it returns. */
API CUresult cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D *c, CUstream st) { (void)st; return cuMemcpy3D_v2(c); }
/* Its per-thread-default-stream variant. */
API CUresult cuMemcpy3DAsync_v2_ptsz(const CUDA_MEMCPY3D *c, CUstream st) { return cuMemcpy3DAsync_v2(c, st); }
/* Its legacy 32-bit ABI. */
API CUresult cuMemcpy3DAsync(const CUDA_MEMCPY3D_v1 *c, CUstream st) { (void)st; return cuMemcpy3D(c); }

/* A 3D copy between contexts: both must be live; the rest is cuMemcpy3D. */
API CUresult cuMemcpy3DPeer(const CUDA_MEMCPY3D_PEER *c) {
    NEED_INIT();
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    if (sim_ctx_device(c->srcContext) < 0 || sim_ctx_device(c->dstContext) < 0) return CUDA_ERROR_INVALID_CONTEXT;
    CUDA_MEMCPY3D w = {c->srcXInBytes, c->srcY, c->srcZ, c->srcLOD, c->srcMemoryType, c->srcHost, c->srcDevice,
                       c->srcArray, NULL, c->srcPitch, c->srcHeight, c->dstXInBytes, c->dstY, c->dstZ, c->dstLOD,
                       c->dstMemoryType, c->dstHost, c->dstDevice, c->dstArray, NULL, c->dstPitch, c->dstHeight,
                       c->WidthInBytes, c->Height, c->Depth};
    return cuMemcpy3D_v2(&w);
}
/* Its per-thread-default-stream variant. */
API CUresult cuMemcpy3DPeer_ptds(const CUDA_MEMCPY3D_PEER *c) { return cuMemcpy3DPeer(c); }
/* Asynchronous: done when it returns. */
API CUresult cuMemcpy3DPeerAsync(const CUDA_MEMCPY3D_PEER *c, CUstream st) { (void)st; return cuMemcpy3DPeer(c); }
/* Its per-thread-default-stream variant. */
API CUresult cuMemcpy3DPeerAsync_ptsz(const CUDA_MEMCPY3D_PEER *c, CUstream st) { return cuMemcpy3DPeerAsync(c, st); }

/* ---- batch and attributed copies (CUDA 12.8+) ---------------------------------------------------------- */
/* A source access order the driver accepts. */
static int order_ok(CUmemcpySrcAccessOrder o) {
    return o == CU_MEMCPY_SRC_ACCESS_ORDER_STREAM || o == CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL ||
           o == CU_MEMCPY_SRC_ACCESS_ORDER_ANY;
}

/* A batch of linear copies; *fail (if given) is the failing copy's index, or SIZE_MAX when the batch as a
 * whole is invalid. */
static CUresult batch(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count, CUmemcpyAttributes *attrs,
                      size_t *idxs, size_t nattrs, size_t *fail, CUstream st) {
    NEED_INIT();
    if (fail) *fail = SIZE_MAX;
    if (!count || !dsts || !srcs || !sizes || !attrs || !idxs || !nattrs || nattrs > count || idxs[0] || !st)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < nattrs; i++)
        if (!order_ok(attrs[i].srcAccessOrder) || (i && idxs[i] <= idxs[i - 1]) || idxs[i] >= count)
            return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++) {
        CUresult rc = cuMemcpy(dsts[i], srcs[i], sizes[i]);
        if (rc != CUDA_SUCCESS) {
            if (fail) *fail = i;
            return rc;
        }
    }
    return CUDA_SUCCESS;
}
/* CUDA 12.8's batch copy (with failIdx). */
API CUresult cuMemcpyBatchAsync(CUdeviceptr *d, CUdeviceptr *s, size_t *n, size_t count, CUmemcpyAttributes *a,
                                size_t *ai, size_t na, size_t *fail, CUstream st) {
    return batch(d, s, n, count, a, ai, na, fail, st);
}
/* Its per-thread-default-stream variant. */
API CUresult cuMemcpyBatchAsync_ptsz(CUdeviceptr *d, CUdeviceptr *s, size_t *n, size_t count, CUmemcpyAttributes *a,
                                     size_t *ai, size_t na, size_t *fail, CUstream st) {
    return batch(d, s, n, count, a, ai, na, fail, st);
}
/* CUDA 13's batch copy (no failIdx). */
API CUresult cuMemcpyBatchAsync_v2(CUdeviceptr *d, CUdeviceptr *s, size_t *n, size_t count, CUmemcpyAttributes *a,
                                   size_t *ai, size_t na, CUstream st) {
    return batch(d, s, n, count, a, ai, na, NULL, st);
}
/* Its per-thread-default-stream variant. */
API CUresult cuMemcpyBatchAsync_v2_ptsz(CUdeviceptr *d, CUdeviceptr *s, size_t *n, size_t count,
                                        CUmemcpyAttributes *a, size_t *ai, size_t na, CUstream st) {
    return batch(d, s, n, count, a, ai, na, NULL, st);
}
/* One linear copy with attributes. */
API CUresult cuMemcpyWithAttributesAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUmemcpyAttributes *a, CUstream st) {
    NEED_INIT();
    if (!a || !order_ok(a->srcAccessOrder)) return CUDA_ERROR_INVALID_VALUE;
    (void)st;
    return cuMemcpy(d, s, n);
}
/* Its per-thread-default-stream variant. */
API CUresult cuMemcpyWithAttributesAsync_ptsz(CUdeviceptr d, CUdeviceptr s, size_t n, CUmemcpyAttributes *a,
                                              CUstream st) {
    return cuMemcpyWithAttributesAsync(d, s, n, a, st);
}

/* One side of a 3D batch operation, in bytes (elem: the copy's element size). 0, or -1. */
static int operand(const CUmemcpy3DOperand *o, const CUextent3D *e, unsigned elem, struct side *s) {
    if (o->type == CU_MEMCPY_OPERAND_TYPE_POINTER) {
        size_t row = o->op.ptr.rowLength, layer = o->op.ptr.layerHeight;
        if ((row && row < e->width) || (layer && layer < e->height) || !o->op.ptr.ptr) return -1;
        *s = (struct side){(uintptr_t)o->op.ptr.ptr, (row ? row : e->width) * elem, layer ? layer : e->height,
                           0, 0, 0, 0, 0, 0};
        return 0;
    }
    if (o->type != CU_MEMCPY_OPERAND_TYPE_ARRAY) return -1;
    const CUoffset3D *off = &o->op.array.offset;
    return side_of(CU_MEMORYTYPE_ARRAY, NULL, 0, o->op.array.array, 0, 0, off->x * elem, off->y, off->z, 0, s);
}

/* The element size of an operation: 1 byte pointer to pointer, else the array's (two arrays must agree). */
static unsigned op_elem(const CUDA_MEMCPY3D_BATCH_OP *op) {
    struct sim_layout a, b;
    int sa = op->src.type == CU_MEMCPY_OPERAND_TYPE_ARRAY && sim_array_layout(op->src.op.array.array, &a) == 0;
    int sb = op->dst.type == CU_MEMCPY_OPERAND_TYPE_ARRAY && sim_array_layout(op->dst.op.array.array, &b) == 0;
    if (sa && sb) return a.elem == b.elem ? a.elem : 0;
    return sa ? a.elem : sb ? b.elem : 1;
}

/* One 3D batch operation. */
static CUresult batch3d_one(const CUDA_MEMCPY3D_BATCH_OP *op) {
    const CUextent3D *e = &op->extent;
    unsigned elem = op_elem(op);
    struct side s, d;
    if (!order_ok(op->srcAccessOrder) || !e->width || !e->height || !e->depth || !elem ||
        operand(&op->src, e, elem, &s) < 0 || operand(&op->dst, e, elem, &d) < 0)
        return CUDA_ERROR_INVALID_VALUE;
    return copy_box(&s, &d, e->width * elem, e->height, e->depth);
}

/* A batch of 3D copies; *fail as for batch(). */
static CUresult batch3d(size_t n, CUDA_MEMCPY3D_BATCH_OP *ops, size_t *fail, unsigned long long flags, CUstream st) {
    NEED_INIT();
    if (fail) *fail = SIZE_MAX;
    if (!n || !ops || flags || !st) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < n; i++) {
        CUresult rc = batch3d_one(&ops[i]);
        if (rc != CUDA_SUCCESS) {
            if (fail) *fail = i;
            return rc;
        }
    }
    return CUDA_SUCCESS;
}
/* CUDA 12.8's 3D batch copy (with failIdx). */
API CUresult cuMemcpy3DBatchAsync(size_t n, CUDA_MEMCPY3D_BATCH_OP *ops, size_t *fail, unsigned long long flags,
                                  CUstream st) {
    return batch3d(n, ops, fail, flags, st);
}
/* Its per-thread-default-stream variant. */
API CUresult cuMemcpy3DBatchAsync_ptsz(size_t n, CUDA_MEMCPY3D_BATCH_OP *ops, size_t *fail, unsigned long long flags,
                                       CUstream st) {
    return batch3d(n, ops, fail, flags, st);
}
/* CUDA 13's 3D batch copy (no failIdx). */
API CUresult cuMemcpy3DBatchAsync_v2(size_t n, CUDA_MEMCPY3D_BATCH_OP *ops, unsigned long long flags, CUstream st) {
    return batch3d(n, ops, NULL, flags, st);
}
/* Its per-thread-default-stream variant. */
API CUresult cuMemcpy3DBatchAsync_v2_ptsz(size_t n, CUDA_MEMCPY3D_BATCH_OP *ops, unsigned long long flags,
                                          CUstream st) {
    return batch3d(n, ops, NULL, flags, st);
}
/* One 3D copy with attributes (flags must be 0). */
API CUresult cuMemcpy3DWithAttributesAsync(CUDA_MEMCPY3D_BATCH_OP *op, unsigned long long flags, CUstream st) {
    NEED_INIT();
    (void)st;
    if (!op || flags) return CUDA_ERROR_INVALID_VALUE;
    return batch3d_one(op);
}
/* Its per-thread-default-stream variant. */
API CUresult cuMemcpy3DWithAttributesAsync_ptsz(CUDA_MEMCPY3D_BATCH_OP *op, unsigned long long flags, CUstream st) {
    return cuMemcpy3DWithAttributesAsync(op, flags, st);
}

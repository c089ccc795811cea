/* Families of work-submission entry points for the elastic tenant (elastic.c, "busy THREADS FAMILY"), each
 * reached through a route real programs use: dlsym on dlopen("libcuda.so.1") (exact ABI names), or
 * cuGetProcAddress_v2 (itself found by dlsym, as libcudart does) with cudaVersion 13000 and the per-thread
 * default stream flag (so the _ptds/_ptsz variants). A round writes a whole block with the family's write
 * entry points and reads it back with its read ones; it returns the number of errors (a failed call or a
 * wrong byte). Under the elastic shim, a call that is not gated can land while the block moves between HBM
 * and host memory: it faults (the address is unmapped for a moment) or its bytes are lost (written to the old
 * physical memory after it was copied), and the round sees it. */
#ifndef MEMSLICE_TEST_GATE_H
#define MEMSLICE_TEST_GATE_H

#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

#include "cuda_api.h"

enum gate_route { GATE_DLSYM, GATE_PROCADDR_PTDS };
CUresult CUDAAPI cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name); /* as in cuda.h */

#define GATE_OPS(X)                                                                                        \
    X(cuMemcpy2D, cuMemcpy2D_v2) X(cuMemcpy2DAsync, cuMemcpy2DAsync_v2)                                    \
    X(cuMemcpy2DUnaligned, cuMemcpy2DUnaligned_v2) X(cuMemcpy3D, cuMemcpy3D_v2)                            \
    X(cuMemcpy3DAsync, cuMemcpy3DAsync_v2) X(cuMemcpyPeer, cuMemcpyPeer)                                   \
    X(cuMemcpyPeerAsync, cuMemcpyPeerAsync) X(cuMemcpy3DPeer, cuMemcpy3DPeer)                              \
    X(cuMemcpy3DPeerAsync, cuMemcpy3DPeerAsync) X(cuMemcpyDtoDAsync, cuMemcpyDtoDAsync_v2)                 \
    X(cuMemsetD8Async, cuMemsetD8Async) X(cuMemsetD16Async, cuMemsetD16Async)                              \
    X(cuMemsetD32Async, cuMemsetD32Async) X(cuMemsetD2D8Async, cuMemsetD2D8Async)                          \
    X(cuMemsetD2D16Async, cuMemsetD2D16Async) X(cuMemsetD2D32Async, cuMemsetD2D32Async)                    \
    X(cuMemsetD16, cuMemsetD16_v2) X(cuMemsetD2D32, cuMemsetD2D32_v2)                                      \
    X(cuStreamWriteValue32, cuStreamWriteValue32_v2) X(cuStreamWriteValue64, cuStreamWriteValue64_v2)      \
    X(cuStreamWaitValue32, cuStreamWaitValue32_v2) X(cuStreamBatchMemOp, cuStreamBatchMemOp_v2)            \
    X(cuMemcpyBatchAsync, cuMemcpyBatchAsync_v2) X(cuMemcpy3DBatchAsync, cuMemcpy3DBatchAsync_v2)          \
    X(cuMemcpyDtoH, cuMemcpyDtoH_v2) X(cuStreamSynchronize, cuStreamSynchronize)                          \
    X(cuLaunchKernel, cuLaunchKernel)

/* One function pointer per entry point, typed from the ABI name's prototype. */
struct gate_ops {
#define GATE_FIELD(base, abi) __typeof__(&abi) base;
    GATE_OPS(GATE_FIELD)
#undef GATE_FIELD
    CUstream stream; /* a created stream: the batch copies refuse the NULL stream */
};

/* Resolve every entry point through one route. 0, or -1 if one is missing. */
static int gate_resolve(struct gate_ops *o, enum gate_route route) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return -1;
    __typeof__(&cuGetProcAddress_v2) gp = (__typeof__(&cuGetProcAddress_v2))dlsym(lib, "cuGetProcAddress_v2");
    void *fn;
    CUdriverProcAddressQueryResult st;
#define GATE_GET(base, abi)                                                                                \
    fn = NULL;                                                                                             \
    if (route == GATE_DLSYM) fn = dlsym(lib, #abi);                                                        \
    else if (gp && gp(#base, &fn, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st) != CUDA_SUCCESS) \
        fn = NULL;                                                                                         \
    if (!fn) return -1;                                                                                    \
    o->base = (__typeof__(&abi))fn;
    GATE_OPS(GATE_GET)
#undef GATE_GET
    return cuStreamCreate(&o->stream, 0) == CUDA_SUCCESS ? 0 : -1;
}

/* Count the words of buf (n bytes) that differ from want. */
static long gate_diff(const uint32_t *buf, size_t n, uint32_t want) {
    for (size_t i = 0; i < n / 4; i++)
        if (buf[i] != want) return 1;
    return 0;
}

/* Read a block back (through the route's cuMemcpyDtoH) and compare every word with want. */
static long gate_check(struct gate_ops *o, CUdeviceptr p, size_t n, uint32_t want, uint32_t *buf) {
    return o->cuMemcpyDtoH(buf, p, n) != CUDA_SUCCESS ? 1 : gate_diff(buf, n, want);
}

#define GATE_PITCH ((size_t)64 << 10) /* 2D and 3D copies view a block as rows of 64 KiB, 16 rows a layer */

/* A CUDA_MEMCPY2D from host (h) to device (d), or back, of a whole n-byte block as 64 KiB rows. */
static CUDA_MEMCPY2D gate_2d(CUdeviceptr d, void *h, size_t n, int to_device) {
    CUDA_MEMCPY2D c;
    memset(&c, 0, sizeof c);
    c.srcMemoryType = to_device ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
    c.dstMemoryType = to_device ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
    if (to_device) { c.srcHost = h; c.dstDevice = d; } else { c.srcDevice = d; c.dstHost = h; }
    c.srcPitch = c.dstPitch = c.WidthInBytes = GATE_PITCH;
    c.Height = n / GATE_PITCH;
    return c;
}

/* copy2d: write with cuMemcpy2DAsync (HtoD), read with cuMemcpy2D or cuMemcpy2DUnaligned (DtoH). */
static long gate_round_copy2d(struct gate_ops *o, CUcontext ctx, CUdeviceptr p, CUdeviceptr p2, size_t n,
                              uint32_t v, uint32_t *buf) {
    (void)ctx; (void)p2;
    for (size_t i = 0; i < n / 4; i++) buf[i] = v;
    CUDA_MEMCPY2D w = gate_2d(p, buf, n, 1), r = gate_2d(p, buf, n, 0);
    if (o->cuMemcpy2DAsync(&w, o->stream) || o->cuStreamSynchronize(o->stream)) return 1;
    memset(buf, 0, n);
    if ((v & 1 ? o->cuMemcpy2DUnaligned : o->cuMemcpy2D)(&r)) return 1;
    return gate_diff(buf, n, v);
}

/* A CUDA_MEMCPY3D of a whole block as 64 KiB x 16-row layers, host to device or back. */
static CUDA_MEMCPY3D gate_3d(CUdeviceptr d, void *h, size_t n, int to_device) {
    CUDA_MEMCPY3D c;
    memset(&c, 0, sizeof c);
    c.srcMemoryType = to_device ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
    c.dstMemoryType = to_device ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
    if (to_device) { c.srcHost = h; c.dstDevice = d; } else { c.srcDevice = d; c.dstHost = h; }
    c.srcPitch = c.dstPitch = c.WidthInBytes = GATE_PITCH;
    c.srcHeight = c.dstHeight = c.Height = 16;
    c.Depth = n / (GATE_PITCH * 16);
    return c;
}

/* copy3d: write with cuMemcpy3D, read with cuMemcpy3DAsync; then a 3D batch copy (device to device within
 * the block: its first half onto its second half) checked with cuMemcpyDtoH. */
static long gate_round_copy3d(struct gate_ops *o, CUcontext ctx, CUdeviceptr p, CUdeviceptr p2, size_t n,
                              uint32_t v, uint32_t *buf) {
    (void)ctx; (void)p2;
    for (size_t i = 0; i < n / 4; i++) buf[i] = v;
    CUDA_MEMCPY3D w = gate_3d(p, buf, n, 1), r = gate_3d(p, buf, n, 0);
    if (o->cuMemcpy3D(&w)) return 1;
    memset(buf, 0, n);
    if (o->cuMemcpy3DAsync(&r, o->stream) || o->cuStreamSynchronize(o->stream) || gate_diff(buf, n, v)) return 1;
    if (o->cuMemsetD32Async(p, ~v, n / 8, o->stream)) return 1; /* first half: ~v */
    CUDA_MEMCPY3D_BATCH_OP op;
    memset(&op, 0, sizeof op);
    op.src.type = op.dst.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
    op.src.op.ptr.ptr = p;
    op.dst.op.ptr.ptr = p + n / 2;
    op.extent = (CUextent3D){GATE_PITCH, 16, n / 2 / (GATE_PITCH * 16)};
    op.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    if (o->cuMemcpy3DBatchAsync(1, &op, 0, o->stream) || o->cuStreamSynchronize(o->stream)) return 1;
    return gate_check(o, p, n, ~v, buf);
}

/* A CUDA_MEMCPY3D_PEER of a whole block from device s (context sc) to device d (context dc). */
static CUDA_MEMCPY3D_PEER gate_peer3d(CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n) {
    CUDA_MEMCPY3D_PEER c;
    memset(&c, 0, sizeof c);
    c.srcMemoryType = c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    c.srcDevice = s; c.dstDevice = d; c.srcContext = sc; c.dstContext = dc;
    c.srcPitch = c.dstPitch = c.WidthInBytes = GATE_PITCH;
    c.srcHeight = c.dstHeight = c.Height = 16;
    c.Depth = n / (GATE_PITCH * 16);
    return c;
}

/* peer: set block p to v (cuMemsetD32Async), copy it to the partner block with cuMemcpyPeer[Async], set p
 * to ~v and copy the partner back with cuMemcpy3DPeer[Async]; both blocks must read v. */
static long gate_round_peer(struct gate_ops *o, CUcontext ctx, CUdeviceptr p, CUdeviceptr p2, size_t n, uint32_t v,
                            uint32_t *buf) {
    if (p2 == p) return 0;
    if (o->cuMemsetD32Async(p, v, n / 4, o->stream)) return 1;
    if (v & 1 ? o->cuMemcpyPeerAsync(p2, ctx, p, ctx, n, o->stream) : o->cuMemcpyPeer(p2, ctx, p, ctx, n)) return 1;
    if (o->cuMemsetD32Async(p, ~v, n / 4, o->stream)) return 1;
    CUDA_MEMCPY3D_PEER c = gate_peer3d(p, ctx, p2, ctx, n);
    if (v & 2 ? o->cuMemcpy3DPeerAsync(&c, o->stream) : o->cuMemcpy3DPeer(&c)) return 1;
    if (o->cuStreamSynchronize(o->stream)) return 1;
    return gate_check(o, p, n, v, buf) + gate_check(o, p2, n, v, buf);
}

/* setasync: the block set by the asynchronous and 2D memsets of 8, 16 and 32 bits in turn (a value whose
 * bytes are all equal, so every width writes the same words), each checked. */
static long gate_round_setasync(struct gate_ops *o, CUcontext ctx, CUdeviceptr p, CUdeviceptr p2, size_t n,
                                uint32_t v, uint32_t *buf) {
    (void)ctx; (void)p2;
    uint32_t b = (v * 7 + 1) & 0xff, w = b * 0x01010101u;
    CUresult rc;
    switch (v % 6) {
    case 0: rc = o->cuMemsetD8Async(p, (unsigned char)b, n, o->stream); break;
    case 1: rc = o->cuMemsetD16Async(p, (unsigned short)(w & 0xffff), n / 2, o->stream); break;
    case 2: rc = o->cuMemsetD32Async(p, w, n / 4, o->stream); break;
    case 3: rc = o->cuMemsetD2D8Async(p, GATE_PITCH, (unsigned char)b, GATE_PITCH, n / GATE_PITCH, o->stream); break;
    case 4: rc = o->cuMemsetD2D16Async(p, GATE_PITCH, (unsigned short)(w & 0xffff), GATE_PITCH / 2,
                                       n / GATE_PITCH, o->stream); break;
    default: rc = o->cuMemsetD2D32Async(p, GATE_PITCH, w, GATE_PITCH / 4, n / GATE_PITCH, o->stream); break;
    }
    if (rc || o->cuStreamSynchronize(o->stream) || gate_check(o, p, n, w, buf)) return 1;
    /* and the synchronous 16-bit and 2D 32-bit sets */
    if ((v & 1 ? o->cuMemsetD16(p, (unsigned short)(~w & 0xffff), n / 2)
               : o->cuMemsetD2D32(p, GATE_PITCH, ~w, GATE_PITCH / 4, n / GATE_PITCH)))
        return 1;
    return gate_check(o, p, n, v & 1 ? (~w & 0xffff) * 0x10001u : ~w, buf);
}

/* memop: the block set to v, then one word per 64 KiB rewritten by a batch of stream write operations (and
 * the last one by cuStreamWriteValue64/32), waited on with cuStreamWaitValue32, then copied to the partner
 * block by a batch copy (cuMemcpyBatchAsync) and a device-to-device async copy; both checked word by word. */
static long gate_round_memop(struct gate_ops *o, CUcontext ctx, CUdeviceptr p, CUdeviceptr p2, size_t n, uint32_t v,
                             uint32_t *buf) {
    (void)ctx;
    enum { BATCH = 128 };
    CUstreamBatchMemOpParams ops[BATCH];
    if (o->cuMemsetD32Async(p, v, n / 4, o->stream)) return 1;
    size_t words = n / GATE_PITCH;
    for (size_t i = 0; i < words; i += BATCH) {
        unsigned k = 0;
        memset(ops, 0, sizeof ops);
        for (; k < BATCH && i + k < words; k++) {
            ops[k].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
            ops[k].writeValue.address = p + (i + k) * GATE_PITCH;
            ops[k].writeValue.value = ~v;
        }
        if (o->cuStreamBatchMemOp(o->stream, k, ops, 0)) return 1;
    }
    CUdeviceptr last = p + n - 8;
    if (o->cuStreamWriteValue64(o->stream, last, ((cuuint64_t)v << 32) | v, 0) ||
        o->cuStreamWriteValue32(o->stream, p + n - 4, ~v, 0) ||
        o->cuStreamWaitValue32(o->stream, p + n - 4, ~v, CU_STREAM_WAIT_VALUE_EQ))
        return 1;
    if (o->cuStreamSynchronize(o->stream) || o->cuMemcpyDtoH(buf, p, n)) return 1;
    for (size_t i = 0; i < n / 4; i++) {
        uint32_t want = (i * 4) % GATE_PITCH == 0 || i == n / 4 - 1 ? ~v : v;
        if (buf[i] != want) return 1;
    }
    if (p2 == p) return 0;
    CUdeviceptr dst[2] = {p2, p2 + n / 2}, src[2] = {p, p + n / 2};
    size_t sizes[2] = {n / 2, n / 2}, idx[1] = {0};
    CUmemcpyAttributes attr;
    memset(&attr, 0, sizeof attr);
    attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    if (v & 1 ? o->cuMemcpyBatchAsync(dst, src, sizes, 2, &attr, idx, 1, o->stream)
              : o->cuMemcpyDtoDAsync(p2, p, n, o->stream))
        return 1;
    if (o->cuStreamSynchronize(o->stream) || o->cuMemcpyDtoH(buf, p2, n)) return 1;
    for (size_t i = 0; i < n / 4; i++) {
        uint32_t want = (i * 4) % GATE_PITCH == 0 || i == n / 4 - 1 ? ~v : v;
        if (buf[i] != want) return 1;
    }
    return 0;
}

/* launch: the block set to v, then 16 kernel launches given the block's address (the simulated GPU's kernels
 * take GPU time and touch no memory: what matters is when each launch reaches the driver, which
 * tests/elastic/test_elastic_gate_launch.py traces), then the block checked. The function comes from a module
 * loaded once per thread. */
static long gate_round_launch(struct gate_ops *o, CUcontext ctx, CUdeviceptr p, CUdeviceptr p2, size_t n, uint32_t v,
                              uint32_t *buf) {
    (void)ctx; (void)p2;
    static __thread CUfunction fn;
    static const unsigned char image[16] = {'M', 'S', 'S', 'I', 'M', 'M', 'O', 'D'}; /* the simulator's, no globals */
    CUmodule mod;
    if (!fn && (cuModuleLoadData(&mod, image) || cuModuleGetFunction(&fn, mod, "touch"))) return 1;
    if (o->cuMemsetD16(p, (unsigned short)(v & 0xffff), n / 2)) return 1;
    void *params[] = {&p};
    for (int k = 0; k < 16; k++)
        if (o->cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, o->stream, params, NULL)) return 1;
    if (o->cuStreamSynchronize(o->stream)) return 1;
    return gate_check(o, p, n, (v & 0xffff) * 0x10001u, buf);
}

struct gate_family {
    const char *name;
    long (*round)(struct gate_ops *o, CUcontext ctx, CUdeviceptr p, CUdeviceptr p2, size_t n, uint32_t v,
                  uint32_t *buf);
};

/* The family of this name, or NULL. */
static const struct gate_family *gate_family(const char *name) {
    static const struct gate_family all[] = {
        {"copy2d", gate_round_copy2d}, {"copy3d", gate_round_copy3d}, {"peer", gate_round_peer},
        {"setasync", gate_round_setasync}, {"memop", gate_round_memop}, {"launch", gate_round_launch},
    };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (name && strcmp(all[i].name, name) == 0) return &all[i];
    return NULL;
}

#endif

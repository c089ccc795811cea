/* The simulated GPU's copies, sets and stream memory operations against cuda.h's documented semantics (for
 * tests/sim/test_sim_copies.py, with and without the shim preloaded): one line per check, "NAME ok" or
 * "NAME bad DETAIL". Descriptor copies honour pitch, offsets, heights and memory types (host, device,
 * unified, array); invalid descriptors are refused; memsets honour width, height, pitch and alignment; stream
 * writes and waits follow the documented comparisons; work on a reserved but unmapped address faults. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda_api.h"

static int g_bad;

/* Print one check's result. */
static void say(const char *name, int ok, const char *detail) {
    printf("%s %s%s%s\n", name, ok ? "ok" : "bad", ok ? "" : " ", ok ? "" : detail);
    g_bad += !ok;
}

/* Byte i of the source pattern. */
static unsigned char pat(size_t i) { return (unsigned char)(i * 131 + 7); }

/* 2D device to device with different pitches and offsets: exactly the box moves, nothing else is written. */
static void check_2d(void) {
    enum { SP = 100, DP = 120, ROWS = 16, W = 40, H = 7 };
    CUdeviceptr s, d;
    unsigned char host[DP * ROWS], want[DP * ROWS], src[SP * ROWS];
    for (size_t i = 0; i < sizeof src; i++) src[i] = pat(i);
    memset(want, 0xee, sizeof want);
    if (cuMemAlloc_v2(&s, sizeof src) || cuMemAlloc_v2(&d, sizeof want) || cuMemcpyHtoD_v2(s, src, sizeof src) ||
        cuMemcpyHtoD_v2(d, want, sizeof want)) { say("copy2d", 0, "setup"); return; }
    CUDA_MEMCPY2D c;
    memset(&c, 0, sizeof c);
    c.srcMemoryType = CU_MEMORYTYPE_DEVICE; c.srcDevice = s; c.srcPitch = SP; c.srcXInBytes = 3; c.srcY = 2;
    c.dstMemoryType = CU_MEMORYTYPE_UNIFIED; c.dstDevice = d; c.dstPitch = DP; c.dstXInBytes = 5; c.dstY = 1;
    c.WidthInBytes = W; c.Height = H;
    CUresult rc = cuMemcpy2D_v2(&c);
    for (int y = 0; y < H; y++) memcpy(want + (1 + y) * DP + 5, src + (2 + y) * SP + 3, W);
    cuMemcpyDtoH_v2(host, d, sizeof host);
    say("copy2d", rc == CUDA_SUCCESS && memcmp(host, want, sizeof host) == 0, "box");
    c.WidthInBytes = DP; /* dstX + width past the pitch */
    say("copy2d_width_past_pitch", cuMemcpy2D_v2(&c) == CUDA_ERROR_INVALID_VALUE, "accepted");
    c.WidthInBytes = W; c.dstMemoryType = 7;
    say("copy2d_bad_memory_type", cuMemcpy2DAsync_v2(&c, NULL) == CUDA_ERROR_INVALID_VALUE, "accepted");
    /* the legacy 32-bit descriptor, host to host (its device pointers are 32-bit) */
    CUDA_MEMCPY2D_v1 l;
    unsigned char out[SP * ROWS];
    memset(&l, 0, sizeof l);
    memset(out, 0, sizeof out);
    l.srcMemoryType = l.dstMemoryType = CU_MEMORYTYPE_HOST; l.srcHost = src; l.dstHost = out;
    l.srcPitch = l.dstPitch = SP; l.WidthInBytes = 10; l.Height = 3; l.srcY = 4;
    rc = cuMemcpy2D(&l);
    say("copy2d_legacy", rc == CUDA_SUCCESS && memcmp(out, src + 4 * SP, 10) == 0 && memcmp(out + 2 * SP, src + 6 * SP, 10) == 0
        && out[10] == 0 && out[3 * SP] == 0, "rows");
    cuMemFree_v2(s);
    cuMemFree_v2(d);
}

/* 3D host to device with layer heights and a z offset, back through an array and the 3D batch copy. */
static void check_3d(void) {
    enum { P = 64, HT = 5, D = 4, W = 20, H = 3, DEP = 2 };
    unsigned char src[P * HT * D], back[P * HT * D], want[P * HT * D];
    CUdeviceptr d;
    for (size_t i = 0; i < sizeof src; i++) src[i] = pat(i);
    memset(want, 0, sizeof want);
    if (cuMemAlloc_v2(&d, sizeof want) || cuMemcpyHtoD_v2(d, want, sizeof want)) { say("copy3d", 0, "setup"); return; }
    CUDA_MEMCPY3D c;
    memset(&c, 0, sizeof c);
    c.srcMemoryType = CU_MEMORYTYPE_HOST; c.srcHost = src; c.srcPitch = P; c.srcHeight = HT; c.srcZ = 1;
    c.dstMemoryType = CU_MEMORYTYPE_DEVICE; c.dstDevice = d; c.dstPitch = P; c.dstHeight = HT; c.dstY = 2;
    c.dstXInBytes = 1; c.WidthInBytes = W; c.Height = H; c.Depth = DEP;
    CUresult rc = cuMemcpy3D_v2(&c);
    for (int z = 0; z < DEP; z++)
        for (int y = 0; y < H; y++) memcpy(want + (z * HT + 2 + y) * P + 1, src + ((1 + z) * HT + y) * P, W);
    cuMemcpyDtoH_v2(back, d, sizeof back);
    say("copy3d", rc == CUDA_SUCCESS && memcmp(back, want, sizeof back) == 0, "box");
    c.srcLOD = 1;
    say("copy3d_lod", cuMemcpy3D_v2(&c) == CUDA_ERROR_INVALID_VALUE, "accepted");
    c.srcLOD = 0; c.reserved0 = &c;
    say("copy3d_reserved", cuMemcpy3D_v2(&c) == CUDA_ERROR_INVALID_VALUE, "accepted");
    c.reserved0 = NULL; c.dstY = HT - 1; /* rows past the layer height */
    say("copy3d_height_past_layer", cuMemcpy3D_v2(&c) == CUDA_ERROR_INVALID_VALUE, "accepted");

    /* an array: 16 x 4 x 2 of 4-byte elements (row 64 bytes); device -> array at (8 bytes, 1, 1), back */
    CUDA_ARRAY3D_DESCRIPTOR ad = {16, 4, 2, CU_AD_FORMAT_UNSIGNED_INT32, 1, 0};
    CUarray a;
    if (cuArray3DCreate_v2(&a, &ad)) { say("copy3d_array", 0, "create"); cuMemFree_v2(d); return; }
    memset(&c, 0, sizeof c);
    c.srcMemoryType = CU_MEMORYTYPE_HOST; c.srcHost = src; c.srcPitch = P; c.srcHeight = HT;
    c.dstMemoryType = CU_MEMORYTYPE_ARRAY; c.dstArray = a; c.dstXInBytes = 8; c.dstY = 1; c.dstZ = 1;
    c.WidthInBytes = 16; c.Height = 2; c.Depth = 1;
    rc = cuMemcpy3D_v2(&c);
    memset(back, 0, sizeof back);
    CUDA_MEMCPY3D r = c;
    r.srcMemoryType = CU_MEMORYTYPE_ARRAY; r.srcArray = a; r.srcXInBytes = 8; r.srcY = 1; r.srcZ = 1; r.srcHost = NULL;
    r.dstMemoryType = CU_MEMORYTYPE_HOST; r.dstHost = back; r.dstPitch = P; r.dstHeight = HT; r.dstArray = NULL;
    r.dstXInBytes = r.dstY = r.dstZ = 0;
    CUresult rc2 = cuMemcpy3D_v2(&r);
    say("copy3d_array", rc == CUDA_SUCCESS && rc2 == CUDA_SUCCESS && memcmp(back, src, 16) == 0 &&
        memcmp(back + P, src + P, 16) == 0 && back[16] == 0, "round trip");
    c.dstY = 3; /* two rows from row 3 of a 4-row array */
    say("copy3d_array_bounds", cuMemcpy3D_v2(&c) == CUDA_ERROR_INVALID_VALUE, "accepted");
    /* array <-> device linear, byte offsets */
    CUdeviceptr lin;
    unsigned char got[32];
    rc = cuMemAlloc_v2(&lin, 32) || cuMemcpyHtoD_v2(lin, src, 32) || cuMemcpyDtoA_v2(a, 100, lin, 32) ||
         cuMemcpyAtoD_v2(lin, a, 100, 32) || cuMemcpyDtoH_v2(got, lin, 32);
    say("copy_array_linear", rc == CUDA_SUCCESS && memcmp(got, src, 32) == 0, "round trip");
    say("copy_array_linear_bounds", cuMemcpyAtoD_v2(lin, a, 16 * 4 * 2 * 4 - 8, 32) == CUDA_ERROR_INVALID_VALUE, "accepted");
    /* the 3D batch copy: pointer to array, extent in the array's 4-byte elements */
    CUstream st;
    cuStreamCreate(&st, 0);
    CUDA_MEMCPY3D_BATCH_OP op;
    memset(&op, 0, sizeof op);
    op.src.type = CU_MEMCPY_OPERAND_TYPE_POINTER; op.src.op.ptr.ptr = lin;
    op.dst.type = CU_MEMCPY_OPERAND_TYPE_ARRAY; op.dst.op.array.array = a; op.dst.op.array.offset = (CUoffset3D){2, 3, 1};
    op.extent = (CUextent3D){4, 1, 1};
    op.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    rc = cuMemcpy3DBatchAsync_v2(1, &op, 0, st);
    memset(got, 0, sizeof got);
    rc2 = cuMemcpyAtoD_v2(lin, a, (1 * 4 + 3) * 64 + 2 * 4, 16) || cuMemcpyDtoH_v2(got, lin, 16);
    say("copy3d_batch_array", rc == CUDA_SUCCESS && rc2 == CUDA_SUCCESS && memcmp(got, src, 16) == 0, "elements");
    size_t fail = 7;
    say("copy3d_batch_null_stream", cuMemcpy3DBatchAsync(1, &op, &fail, 0, NULL) == CUDA_ERROR_INVALID_VALUE &&
        fail == SIZE_MAX, "accepted");
    op.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_INVALID;
    say("copy3d_batch_order", cuMemcpy3DBatchAsync(1, &op, &fail, 0, st) == CUDA_ERROR_INVALID_VALUE && fail == 0,
        "accepted");
    cuArrayDestroy(a);
    cuMemFree_v2(lin);
    cuMemFree_v2(d);
}

/* Batch copies, peer copies. */
static void check_batch_peer(CUcontext ctx) {
    CUdeviceptr a, b;
    unsigned char src[64], got[64];
    for (size_t i = 0; i < sizeof src; i++) src[i] = pat(i);
    CUstream st;
    if (cuStreamCreate(&st, 0) || cuMemAlloc_v2(&a, 64) || cuMemAlloc_v2(&b, 64) || cuMemcpyHtoD_v2(a, src, 64) ||
        cuMemsetD8_v2(b, 0, 64)) { say("batch", 0, "setup"); return; }
    CUdeviceptr dst[2] = {b, b + 32}, srcs[2] = {a + 32, a};
    size_t sizes[2] = {32, 32}, idx[2] = {0, 1};
    CUmemcpyAttributes at[2];
    memset(at, 0, sizeof at);
    at[0].srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    at[1].srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_ANY;
    CUresult rc = cuMemcpyBatchAsync_v2(dst, srcs, sizes, 2, at, idx, 2, st);
    cuMemcpyDtoH_v2(got, b, 64);
    say("batch", rc == CUDA_SUCCESS && memcmp(got, src + 32, 32) == 0 && memcmp(got + 32, src, 32) == 0, "swapped halves");
    size_t fail = 0, bad_idx[2] = {1, 1};
    say("batch_first_index", cuMemcpyBatchAsync(dst, srcs, sizes, 2, at, bad_idx, 2, &fail, st) ==
        CUDA_ERROR_INVALID_VALUE && fail == SIZE_MAX, "accepted");
    say("batch_null_stream", cuMemcpyBatchAsync_v2(dst, srcs, sizes, 2, at, idx, 2, NULL) == CUDA_ERROR_INVALID_VALUE,
        "accepted");
    rc = cuMemcpyPeer(b, ctx, a, ctx, 64) || cuMemcpyDtoH_v2(got, b, 64);
    say("peer", rc == CUDA_SUCCESS && memcmp(got, src, 64) == 0, "bytes");
    say("peer_bad_context", cuMemcpyPeerAsync(b, (CUcontext)&fail, a, ctx, 64, st) == CUDA_ERROR_INVALID_CONTEXT,
        "accepted");
    cuMemFree_v2(a);
    cuMemFree_v2(b);
}

/* Sets: widths, pitches, alignment. */
static void check_sets(void) {
    enum { P = 64, R = 4 };
    CUdeviceptr d;
    unsigned char got[P * R], want[P * R];
    if (cuMemAlloc_v2(&d, P * R) || cuMemsetD8_v2(d, 0x11, P * R)) { say("set2d", 0, "setup"); return; }
    CUresult rc = cuMemsetD2D32_v2(d + 4, P, 0xa1b2c3d4u, 3, R);
    memset(want, 0x11, sizeof want);
    for (int r = 0; r < R; r++)
        for (int i = 0; i < 3; i++) { uint32_t v = 0xa1b2c3d4u; memcpy(want + r * P + 4 + i * 4, &v, 4); }
    cuMemcpyDtoH_v2(got, d, sizeof got);
    say("set2d32", rc == CUDA_SUCCESS && memcmp(got, want, sizeof got) == 0, "box");
    rc = cuMemsetD2D8Async(d, P, 0x5a, 7, 2, NULL);
    for (int r = 0; r < 2; r++) memset(want + r * P, 0x5a, 7);
    cuMemcpyDtoH_v2(got, d, sizeof got);
    say("set2d8", rc == CUDA_SUCCESS && memcmp(got, want, sizeof got) == 0, "box");
    say("set16_unaligned", cuMemsetD16_v2(d + 1, 1, 4) == CUDA_ERROR_INVALID_VALUE, "accepted");
    say("set2d32_pitch_too_small", cuMemsetD2D32_v2(d, 8, 1, 3, 2) == CUDA_ERROR_INVALID_VALUE, "accepted");
    rc = cuMemsetD16Async(d, 0xbeef, 3, NULL);
    cuMemcpyDtoH_v2(got, d, 8);
    say("set16", rc == CUDA_SUCCESS && got[0] == 0xef && got[1] == 0xbe && got[4] == 0xef && got[6] == 0x5a, "words");
    cuMemFree_v2(d);
}

/* Stream writes and waits (comparisons as cuda.h documents them), and a batch. */
static void check_memops(void) {
    CUdeviceptr d;
    uint64_t got[2];
    if (cuMemAlloc_v2(&d, 16) || cuMemsetD8_v2(d, 0, 16)) { say("memop", 0, "setup"); return; }
    CUresult rc = cuStreamWriteValue32_v2(NULL, d, 0x10, 0) || cuStreamWriteValue64_v2(NULL, d + 8, 1ull << 40, 0);
    cuMemcpyDtoH_v2(got, d, 16);
    say("write_value", rc == CUDA_SUCCESS && got[0] == 0x10 && got[1] == 1ull << 40, "values");
    say("wait_geq_cyclic", cuStreamWaitValue32_v2(NULL, d, 0xfffffff0u, CU_STREAM_WAIT_VALUE_GEQ) == CUDA_SUCCESS, "waited");
    say("wait_eq", cuStreamWaitValue32(NULL, d, 0x10, CU_STREAM_WAIT_VALUE_EQ) == CUDA_SUCCESS, "waited");
    say("wait_and", cuStreamWaitValue64_v2(NULL, d + 8, 3ull << 39, CU_STREAM_WAIT_VALUE_AND) == CUDA_SUCCESS, "waited");
    say("wait_nor", cuStreamWaitValue32_v2(NULL, d, 0xffffff0fu, CU_STREAM_WAIT_VALUE_NOR) == CUDA_SUCCESS, "waited");
    say("write_unaligned", cuStreamWriteValue32_v2(NULL, d + 2, 1, 0) == CUDA_ERROR_INVALID_VALUE, "accepted");
    say("write_bad_flags", cuStreamWriteValue32_v2(NULL, d, 1, 4) == CUDA_ERROR_INVALID_VALUE, "accepted");
    CUstreamBatchMemOpParams ops[3];
    memset(ops, 0, sizeof ops);
    ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32; ops[0].writeValue.address = d + 4;
    ops[0].writeValue.value = 77;
    ops[1].memoryBarrier.operation = CU_STREAM_MEM_OP_BARRIER;
    ops[2].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32; ops[2].waitValue.address = d + 4;
    ops[2].waitValue.value = 77; ops[2].waitValue.flags = CU_STREAM_WAIT_VALUE_EQ;
    rc = cuStreamBatchMemOp_v2(NULL, 3, ops, 0);
    cuMemcpyDtoH_v2(got, d, 8);
    say("batch_memop", rc == CUDA_SUCCESS && got[0] == (77ull << 32 | 0x10), "values");
    ops[0].operation = CU_STREAM_MEM_OP_ATOMIC_REDUCTION;
    say("batch_memop_atomic", cuStreamBatchMemOp_v2(NULL, 1, ops, 0) == CUDA_ERROR_NOT_SUPPORTED, "accepted");
    cuMemFree_v2(d);
}

/* Work on a reserved address with nothing mapped (as an elastic range is for a moment while it moves)
 * faults: in a child, a 2D memset and a 2D copy each kill it (SIGSEGV). */
static void check_unmapped(void) {
    CUdeviceptr va;
    if (cuMemAddressReserve(&va, 2u << 20, 0, 0, 0)) { say("unmapped", 0, "reserve"); return; }
    for (int which = 0; which < 2; which++) {
        pid_t pid = fork();
        if (pid == 0) {
            char h[256] = {0};
            CUDA_MEMCPY2D c;
            memset(&c, 0, sizeof c);
            c.srcMemoryType = CU_MEMORYTYPE_HOST; c.srcHost = h; c.srcPitch = 128;
            c.dstMemoryType = CU_MEMORYTYPE_DEVICE; c.dstDevice = va; c.dstPitch = 4096;
            c.WidthInBytes = 128; c.Height = 2;
            CUresult rc = which ? cuMemcpy2D_v2(&c) : cuMemsetD2D8_v2(va, 4096, 1, 16, 2);
            _exit(rc == CUDA_SUCCESS ? 0 : 1);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        /* SIGSEGV; under AddressSanitizer its handler reports the SEGV and aborts (abort_on_error=1) */
        int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
        say(which ? "unmapped_copy2d_faults" : "unmapped_set2d_faults", sig == SIGSEGV || sig == SIGABRT, "no fault");
    }
    cuMemAddressFree(va, 2u << 20);
}

/* Run every check in a fresh context on GPU 0; exit 1 if any failed. */
int main(void) {
    CUdevice dev;
    CUcontext ctx;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate_v2(&ctx, 0, dev)) { printf("init failed\n"); return 2; }
    check_2d();
    check_3d();
    check_batch_peer(ctx);
    check_sets();
    check_memops();
    check_unmapped();
    printf("done bad=%d\n", g_bad);
    return g_bad ? 1 : 0;
}

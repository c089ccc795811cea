/* Simulated driver: stream memory operations (cuStreamWriteValue32/64, cuStreamWaitValue32/64,
 * cuStreamBatchMemOp; v1, _v2 and per-thread variants), as cuda.h documents them: a write stores the value
 * at a device address (4- or 8-byte aligned), a wait blocks the stream until the word at the address meets
 * the condition in the low bits of flags (GEQ: (int32_t)(*addr - value) >= 0, the cyclic comparison; EQ;
 * AND: (*addr & value) != 0; NOR: ~(*addr | value) != 0), FLUSH may be or-ed in.
 *
 * Work in flight: a cuStreamWaitValue* whose condition is not met when it is called returns at once, like the
 * real asynchronous call, and stays *queued* on its stream until the word meets the condition (written by a
 * cuStreamWriteValue* from any thread, or by a host store to mapped pinned memory). While it is queued,
 * cuStreamQuery on its stream answers CUDA_ERROR_NOT_READY and cuStreamSynchronize (that stream) and
 * cuCtxSynchronize (every stream) wait for it; this is how the simulator models a kernel or wait that runs
 * for N ms (a wait on a flag a host thread sets after N ms). A synchronize gives up after SIM_SYNC_MS with
 * CUDA_ERROR_LAUNCH_TIMEOUT (a real one waits on; a test hanging forever helps no one). What is not modelled:
 * later work on the same stream does not wait behind a queued wait (it runs when submitted), and memory
 * freed under a queued wait is the caller's bug, as in CUDA. A wait inside cuStreamBatchMemOp is done by the
 * calling thread (the batch's later operations are ordered after it), polling for at most SIM_WAIT_MS.
 * Flushes and barriers are no-ops (all memory is coherent here); the atomic reductions of CUDA 13 are not
 * modelled (CUDA_ERROR_NOT_SUPPORTED). An address in reserved but unmapped memory faults, like a copy
 * (simcuda_copy.c). */
#define _GNU_SOURCE
#include <pthread.h>
#include <time.h>

#include "sim_internal.h"
#include "simcuda.h"

#define SIM_WAIT_MS 10000
#define SIM_SYNC_MS 60000
#define MAX_QUEUED 64
#define WAIT_OP_MASK 0x3u

struct qwait { CUdeviceptr a; cuuint64_t v; unsigned size, op; CUstream s; };

static pthread_mutex_t g_qmu = PTHREAD_MUTEX_INITIALIZER;
static struct qwait g_q[MAX_QUEUED]; /* queued waits, under g_qmu */
static int g_nq;

/* Store a 32- or 64-bit value (flags: DEFAULT or NO_MEMORY_BARRIER). */
static CUresult write_value(CUdeviceptr a, cuuint64_t v, unsigned size, unsigned int flags) {
    NEED_INIT();
    if (!a || a % size || (flags & ~(unsigned)CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER)) return CUDA_ERROR_INVALID_VALUE;
    if (size == 4) __atomic_store_n((cuuint32_t *)(uintptr_t)a, (cuuint32_t)v, __ATOMIC_SEQ_CST);
    else __atomic_store_n((cuuint64_t *)(uintptr_t)a, v, __ATOMIC_SEQ_CST);
    return CUDA_SUCCESS;
}

/* Whether the word at a meets the wait condition. */
static int met(CUdeviceptr a, cuuint64_t v, unsigned size, unsigned op) {
    cuuint64_t x = size == 4 ? __atomic_load_n((cuuint32_t *)(uintptr_t)a, __ATOMIC_SEQ_CST)
                             : __atomic_load_n((cuuint64_t *)(uintptr_t)a, __ATOMIC_SEQ_CST);
    cuuint64_t mask = size == 4 ? 0xffffffffull : ~0ull;
    switch (op) {
    case CU_STREAM_WAIT_VALUE_GEQ:
        return size == 4 ? (int32_t)(uint32_t)(x - v) >= 0 : (int64_t)(x - v) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ: return ((x ^ v) & mask) == 0;
    case CU_STREAM_WAIT_VALUE_AND: return (x & v & mask) != 0;
    default: return (~(x | v) & mask) != 0; /* NOR */
    }
}

/* Wait (bounded) in the calling thread until the word at a meets the condition in flags (batches). */
static CUresult poll_wait(CUdeviceptr a, cuuint64_t v, unsigned size, unsigned int flags) {
    NEED_INIT();
    if (!a || a % size || (flags & ~(WAIT_OP_MASK | (unsigned)CU_STREAM_WAIT_VALUE_FLUSH)))
        return CUDA_ERROR_INVALID_VALUE;
    struct timespec nap = {0, 100000};
    for (long waited_us = 0; !met(a, v, size, flags & WAIT_OP_MASK); waited_us += 100) {
        if (waited_us >= SIM_WAIT_MS * 1000L) return CUDA_ERROR_LAUNCH_TIMEOUT;
        nanosleep(&nap, NULL);
    }
    return CUDA_SUCCESS;
}

/* A stream wait: done at once if the condition is met, else queued on s (work in flight) until it is; a full
 * queue makes the calling thread wait instead. */
static CUresult wait_value(CUstream s, CUdeviceptr a, cuuint64_t v, unsigned size, unsigned int flags) {
    NEED_INIT();
    if (!a || a % size || (flags & ~(WAIT_OP_MASK | (unsigned)CU_STREAM_WAIT_VALUE_FLUSH)))
        return CUDA_ERROR_INVALID_VALUE;
    if (met(a, v, size, flags & WAIT_OP_MASK)) return CUDA_SUCCESS;
    pthread_mutex_lock(&g_qmu);
    int queued = g_nq < MAX_QUEUED;
    if (queued) g_q[g_nq++] = (struct qwait){a, v, size, flags & WAIT_OP_MASK, s ? s : (CUstream)0x1};
    pthread_mutex_unlock(&g_qmu);
    return queued ? CUDA_SUCCESS : poll_wait(a, v, size, flags);
}

/* Drop the queued waits whose condition is now met; count those left on s (NULL: on any stream). Caller holds
 * g_qmu. */
static int sweep_waits(CUstream s) {
    int left = 0, k = 0;
    for (int i = 0; i < g_nq; i++) {
        if (met(g_q[i].a, g_q[i].v, g_q[i].size, g_q[i].op)) continue;
        g_q[k++] = g_q[i];
        if (!s || g_q[i].s == s) left++;
    }
    g_nq = k;
    return left;
}

/* How many waits are still queued on s (NULL: on any stream): cuStreamQuery's NOT_READY. */
int sim_waits_pending(CUstream s) {
    pthread_mutex_lock(&g_qmu);
    int n = sweep_waits(s);
    pthread_mutex_unlock(&g_qmu);
    return n;
}

/* Synchronize: wait until no wait is queued on s (NULL: on any stream), polling for at most SIM_SYNC_MS. */
CUresult sim_waits_drain(CUstream s) {
    struct timespec nap = {0, 200000};
    for (long waited_us = 0; sim_waits_pending(s); waited_us += 200) {
        if (waited_us >= SIM_SYNC_MS * 1000L) return CUDA_ERROR_LAUNCH_TIMEOUT;
        nanosleep(&nap, NULL);
    }
    return CUDA_SUCCESS;
}

/* ---- write and wait -----------------------------------------------------------------------------------
 * Each of the four calls (write or wait, 32 or 64 bits) has four names in cuda.h: the _v2 call that does
 * the work, its per-thread-default-stream variant, the older name of the same call and its per-thread
 * variant. One macro writes the three forwarders, so that they cannot drift apart. A write is done when it
 * returns (the stream is not needed); a wait not yet met stays queued on its stream (wait_value). */
#define MEMOP_NAMES(name, T)                                                                               \
    API CUresult name##_v2_ptsz(CUstream s, CUdeviceptr a, T v, unsigned int f) { return name##_v2(s, a, v, f); } \
    API CUresult name(CUstream s, CUdeviceptr a, T v, unsigned int f) { return name##_v2(s, a, v, f); }       \
    API CUresult name##_ptsz(CUstream s, CUdeviceptr a, T v, unsigned int f) { return name##_v2(s, a, v, f); }

/* Write a 32-bit value. */
API CUresult cuStreamWriteValue32_v2(CUstream s, CUdeviceptr a, cuuint32_t v, unsigned int f) {
    (void)s;
    return write_value(a, v, 4, f);
}
MEMOP_NAMES(cuStreamWriteValue32, cuuint32_t)
/* Write a 64-bit value. */
API CUresult cuStreamWriteValue64_v2(CUstream s, CUdeviceptr a, cuuint64_t v, unsigned int f) {
    (void)s;
    return write_value(a, v, 8, f);
}
MEMOP_NAMES(cuStreamWriteValue64, cuuint64_t)
/* Wait on a 32-bit value. */
API CUresult cuStreamWaitValue32_v2(CUstream s, CUdeviceptr a, cuuint32_t v, unsigned int f) {
    return wait_value(s, a, v, 4, f);
}
MEMOP_NAMES(cuStreamWaitValue32, cuuint32_t)
/* Wait on a 64-bit value. */
API CUresult cuStreamWaitValue64_v2(CUstream s, CUdeviceptr a, cuuint64_t v, unsigned int f) {
    return wait_value(s, a, v, 8, f);
}
MEMOP_NAMES(cuStreamWaitValue64, cuuint64_t)

/* ---- batches ------------------------------------------------------------------------------------------ */
/* Run a batch of memory operations in order (flags must be 0). */
API CUresult cuStreamBatchMemOp_v2(CUstream s, unsigned int count, CUstreamBatchMemOpParams *ops, unsigned int flags) {
    NEED_INIT();
    (void)s;
    if ((count && !ops) || flags) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned int i = 0; i < count; i++) {
        CUstreamBatchMemOpParams *p = &ops[i];
        CUresult rc;
        switch (p->operation) {
        case CU_STREAM_MEM_OP_WRITE_VALUE_32:
            rc = write_value(p->writeValue.address, p->writeValue.value, 4, p->writeValue.flags);
            break;
        case CU_STREAM_MEM_OP_WRITE_VALUE_64:
            rc = write_value(p->writeValue.address, p->writeValue.value64, 8, p->writeValue.flags);
            break;
        case CU_STREAM_MEM_OP_WAIT_VALUE_32:
            rc = poll_wait(p->waitValue.address, p->waitValue.value, 4, p->waitValue.flags);
            break;
        case CU_STREAM_MEM_OP_WAIT_VALUE_64:
            rc = poll_wait(p->waitValue.address, p->waitValue.value64, 8, p->waitValue.flags);
            break;
        case CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES: case CU_STREAM_MEM_OP_BARRIER: rc = CUDA_SUCCESS; break;
        case CU_STREAM_MEM_OP_ATOMIC_REDUCTION: rc = CUDA_ERROR_NOT_SUPPORTED; break;
        default: rc = CUDA_ERROR_INVALID_VALUE; break;
        }
        if (rc != CUDA_SUCCESS) return rc;
    }
    return CUDA_SUCCESS;
}
/* Its per-thread-default-stream variant. */
API CUresult cuStreamBatchMemOp_v2_ptsz(CUstream s, unsigned int n, CUstreamBatchMemOpParams *o, unsigned int f) {
    return cuStreamBatchMemOp_v2(s, n, o, f);
}
/* The older name of the same call. */
API CUresult cuStreamBatchMemOp(CUstream s, unsigned int n, CUstreamBatchMemOpParams *o, unsigned int f) {
    return cuStreamBatchMemOp_v2(s, n, o, f);
}
/* Its per-thread-default-stream variant. */
API CUresult cuStreamBatchMemOp_ptsz(CUstream s, unsigned int n, CUstreamBatchMemOpParams *o, unsigned int f) {
    return cuStreamBatchMemOp_v2(s, n, o, f);
}

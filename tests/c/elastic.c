/* An elastic-memory tenant for tests/elastic/test_elastic_swap.py and tests/elastic/test_elastic_gate.py, driven by commands
 * on stdin (one per line), each answered by one line on stdout:
 *   alloc MIB CHUNK_MIB   allocate MIB in blocks of CHUNK_MIB with cuMemAlloc_v2, fill every byte with a
 *                         pattern of (block, offset) through cuMemcpyHtoD: "allocated N" or "oom N"
 *   check                 read every byte back through the same pointers: "check ok BYTES" or "check bad ..."
 *   busy THREADS [FAMILY] start THREADS (at most 4) threads that keep rewriting the 4 newest blocks and reading
 *                         them back until "stop": "busy". FAMILY picks the entry points each round uses
 *                         (default set32: cuMemsetD32 + cuMemcpyDtoH by symbol; the others, in gate.h, reach
 *                         the driver through dlsym in even threads and through cuGetProcAddress_v2 with the
 *                         per-thread default stream flag in odd ones)
 *   stop                  stop them: "stopped ROUNDS ERRORS"
 *   device N              create a context on GPU N and make it current (later allocs are on GPU N): "device N"
 *   ptrs                  "ptrs P1 P2 ..." (the pointer values, to show they never change)
 *   inflight              work in flight that only a later call releases: a 4-byte flag (0) in device memory,
 *                         streams A and B, cuStreamWaitValue32(A, flag, 1, EQ): "inflight RC QUERY" (QUERY:
 *                         cuStreamQuery(A), 600 = CUDA_ERROR_NOT_READY while the wait is queued)
 *   release               from another thread: cuStreamWriteValue32(B, flag, 1), then cuStreamSynchronize(A):
 *                         "released RC RC" (the thread is joined, so a release stuck in the shim never answers)
 *   hold MS               a queued wait that runs MS ms, as a long kernel would: cuStreamWaitValue32 on a flag in
 *                         mapped pinned host memory that a plain host thread (no CUDA call) sets after MS ms:
 *                         "holding RC"
 *   held                  cuStreamSynchronize on the held stream: "held RC"
 *   slowest               the longest one block round of the busy threads took since the last "slowest", in ms
 *                         (how long a tenant thread was held up, e.g. at the work gate): "slowest MS"
 *   counters              the simulated driver's counters of this process (memsliceSimCounters, found with dlsym;
 *                         interposer/sim/simstate.h names them): "counters C0 C1 ...", or "counters none"
 *   free                  free everything: "freed RC"
 * Between commands the process makes no CUDA call at all (it becomes idle). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_api.h"
#include "gate.h"

#define MiB ((size_t)1 << 20)
#define MAXB 512
static CUdeviceptr g_ptr[MAXB];
static size_t g_size[MAXB];
static int g_n;
static volatile int g_stop;
static long g_rounds, g_errors;
static pthread_mutex_t g_stat = PTHREAD_MUTEX_INITIALIZER;
static CUcontext g_ctx;
static int g_nthreads;
static int g_first_rounds; /* busy threads that have finished a first round (atomic) */
static char g_family[32];  /* the busy threads' family of entry points ("" = set32) */
static uint64_t g_slowest_ns; /* the longest busy block round (atomic max) */
static CUdeviceptr g_flag;    /* inflight: the flag stream A waits on */
static CUstream g_sa, g_sb, g_sh;
static volatile uint32_t *g_hold; /* hold: the pinned flag */
static unsigned g_hold_ms;

CUresult CUDAAPI cuStreamQuery(CUstream hStream);

/* Monotonic time, for the busy rounds' durations. */
static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Record a busy round's duration: the slowest one is what "slowest" reports. */
static void note_round(uint64_t ns) {
    uint64_t cur = __atomic_load_n(&g_slowest_ns, __ATOMIC_RELAXED);
    while (ns > cur && !__atomic_compare_exchange_n(&g_slowest_ns, &cur, ns, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
}

/* inflight: stream A waits for a flag that only "release" sets, so A has work queued until then. */
static void cmd_inflight(void) {
    CUresult rc = cuMemAlloc_v2(&g_flag, 4);
    if (!rc) rc = cuMemsetD32_v2(g_flag, 0, 1);
    if (!rc) rc = cuStreamCreate(&g_sa, 0);
    if (!rc) rc = cuStreamCreate(&g_sb, 0);
    if (!rc) rc = cuStreamWaitValue32(g_sa, g_flag, 1, CU_STREAM_WAIT_VALUE_EQ);
    printf("inflight %d %d\n", rc, rc ? -1 : cuStreamQuery(g_sa));
}

/* release's thread: a second tenant thread writes the flag on stream B, then waits for stream A. */
static void *releaser(void *arg) {
    CUresult *rc = arg;
    cuCtxSetCurrent(g_ctx);
    rc[0] = cuStreamWriteValue32(g_sb, g_flag, 1, 0);
    rc[1] = cuStreamSynchronize(g_sa);
    return NULL;
}

/* hold's host thread: no CUDA call, only a store to the mapped pinned flag after g_hold_ms. */
static void *hold_setter(void *arg) {
    (void)arg;
    usleep(g_hold_ms * 1000u);
    __atomic_store_n(g_hold, 1u, __ATOMIC_SEQ_CST);
    return NULL;
}

/* hold: a queued wait on a host-written flag, the simulator's model of a kernel that runs MS ms. */
static void cmd_hold(unsigned ms) {
    void *h = NULL;
    CUdeviceptr d = 0;
    pthread_t t;
    CUresult rc = cuMemHostAlloc(&h, 4, CU_MEMHOSTALLOC_DEVICEMAP);
    if (!rc) {
        g_hold = h;
        *g_hold = 0;
        rc = cuMemHostGetDevicePointer_v2(&d, h, 0);
    }
    if (!rc) rc = cuStreamCreate(&g_sh, 0);
    if (!rc) rc = cuStreamWaitValue32(g_sh, d, 1, CU_STREAM_WAIT_VALUE_EQ);
    g_hold_ms = ms;
    if (!rc && pthread_create(&t, NULL, hold_setter, NULL) == 0) pthread_detach(t);
    printf("holding %d\n", rc);
}

/* The pattern: word i of block b. Distinct per block, so a block mapped at the wrong address shows. */
static uint32_t word(int b, size_t i) { return (uint32_t)(b * 2654435761u) ^ (uint32_t)i ^ 0xa5a5a5a5u; }

/* Fill a host buffer with block b's pattern. */
static void pattern(uint32_t *buf, int b, size_t bytes) {
    for (size_t i = 0; i < bytes / 4; i++) buf[i] = word(b, i);
}

/* alloc: blocks of chunk MiB until mib MiB, each filled with its pattern. */
static void cmd_alloc(size_t mib, size_t chunk) {
    uint32_t *buf = malloc(chunk * MiB);
    int made = 0;
    for (size_t done = 0; done < mib && g_n < MAXB; done += chunk) {
        CUresult rc = cuMemAlloc_v2(&g_ptr[g_n], chunk * MiB);
        if (rc != CUDA_SUCCESS) { printf("oom %d rc=%d\n", made, rc); free(buf); return; }
        g_size[g_n] = chunk * MiB;
        pattern(buf, g_n, chunk * MiB);
        if (cuMemcpyHtoD_v2(g_ptr[g_n], buf, chunk * MiB) != CUDA_SUCCESS) { printf("oom %d copy\n", made); free(buf); return; }
        g_n++;
        made++;
    }
    free(buf);
    printf("allocated %d\n", made);
}

/* check: every byte of every block read back and compared. One host buffer, as large as the largest block,
 * for all of them, kept for the next check and zeroed before each copy: a buffer per block (glibc maps each
 * 64 MiB one afresh) faulted in every page of every block again, half of an elastic test's page faults. */
static void cmd_check(void) {
    static uint32_t *buf;
    static size_t cap;
    size_t total = 0, need = 0;
    for (int b = 0; b < g_n; b++) need = g_size[b] > need ? g_size[b] : need;
    if (need > cap) {
        free(buf);
        buf = malloc(need);
        cap = buf ? need : 0;
        if (!buf) { printf("check no host memory for %zu\n", need); return; }
    }
    for (int b = 0; b < g_n; b++) {
        memset(buf, 0, g_size[b]); /* as a fresh buffer reads: a copy that moved nothing fails the check */
        CUresult rc = cuMemcpyDtoH_v2(buf, g_ptr[b], g_size[b]);
        for (size_t i = 0; rc == CUDA_SUCCESS && i < g_size[b] / 4; i++)
            if (buf[i] != word(b, i)) {
                printf("check bad block %d word %zu: %08x != %08x\n", b, i, buf[i], word(b, i));
                return;
            }
        if (rc != CUDA_SUCCESS) { printf("check bad block %d rc=%d\n", b, rc); return; }
        total += g_size[b];
    }
    printf("check ok %zu\n", total);
}

/* A busy thread: thread t owns the newest blocks n-1-t, n-1-t-THREADS, ... (the ones a bursting tenant gives
 * up first); each round sets a whole block to a new value (cuMemsetD32) and reads it all back
 * (cuMemcpyDtoH): a write that lands in memory the shim is moving away, or an access to an address between
 * two mappings, shows as an error or a crash. At the end the block's pattern is written back (for "check"). */
static void *busy(void *arg) {
    int id = (int)(intptr_t)arg;
    cuCtxSetCurrent(g_ctx);
    size_t cap = 0;
    for (int b = 0; b < g_n; b++) cap = g_size[b] > cap ? g_size[b] : cap;
    uint32_t *buf = malloc(cap);
    long rounds = 0, errors = 0;
    struct gate_ops ops;
    const struct gate_family *fam = gate_family(g_family);
    if (fam && gate_resolve(&ops, id % 2 ? GATE_PROCADDR_PTDS : GATE_DLSYM) < 0) { fam = NULL; errors++; g_stop = 1; }
    while (!g_stop) {
        for (int b = g_n - 1 - id; b >= 0 && b >= g_n - 4 && !g_stop; b -= g_nthreads) {
            uint32_t v = ((uint32_t)id << 24) | (uint32_t)(rounds & 0xffffff);
            uint64_t t0 = mono_ns();
            if (fam) { /* the partner block: the thread's other busy block (peer copies go between the two) */
                int b2 = b - g_nthreads >= 0 && b - g_nthreads >= g_n - 4 ? b - g_nthreads : g_n - 1 - id;
                errors += fam->round(&ops, g_ctx, g_ptr[b], g_ptr[b2], g_size[b], v, buf);
                note_round(mono_ns() - t0);
                continue;
            }
            if (cuMemsetD32_v2(g_ptr[b], v, g_size[b] / 4) || cuMemcpyDtoH_v2(buf, g_ptr[b], g_size[b])) { errors++; continue; }
            for (size_t i = 0; i < g_size[b] / 4; i++)
                if (buf[i] != v) { errors++; break; }
            note_round(mono_ns() - t0);
        }
        if (rounds++ == 0) __atomic_add_fetch(&g_first_rounds, 1, __ATOMIC_SEQ_CST);
    }
    for (int b = g_n - 1 - id; b >= 0 && b >= g_n - 4; b -= g_nthreads) {
        pattern(buf, b, g_size[b]);
        if (cuMemcpyHtoD_v2(g_ptr[b], buf, g_size[b])) errors++;
    }
    pthread_mutex_lock(&g_stat);
    g_rounds += rounds;
    g_errors += errors;
    pthread_mutex_unlock(&g_stat);
    free(buf);
    return NULL;
}

/* counters: the simulated driver's per-process counters (a real driver has no such symbol). */
static void cmd_counters(void) {
    unsigned (*fn)(unsigned long long *, unsigned) = (unsigned (*)(unsigned long long *, unsigned))dlsym(RTLD_DEFAULT,
                                                                                                       "memsliceSimCounters");
    unsigned long long c[32];
    if (!fn) { printf("counters none\n"); return; }
    unsigned n = fn(c, 32);
    printf("counters");
    for (unsigned i = 0; i < n && i < 32; i++) printf(" %llu", c[i]);
    printf("\n");
}

/* Run commands until stdin ends. */
int main(void) {
    CUdevice dev;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate_v2(&g_ctx, 0, dev)) { printf("init failed\n"); return 1; }
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready\n");
    char line[128];
    pthread_t th[8];
    int nth = 0;
    while (fgets(line, sizeof line, stdin)) {
        size_t a = 0, b = 0;
        if (sscanf(line, "alloc %zu %zu", &a, &b) == 2) cmd_alloc(a, b);
        else if (strncmp(line, "check", 5) == 0) cmd_check();
        else if (sscanf(line, "busy %zu", &a) == 1) {
            g_family[0] = 0;
            sscanf(line, "busy %*u %31s", g_family);
            if (strcmp(g_family, "set32") == 0) g_family[0] = 0;
            if (g_family[0] && !gate_family(g_family)) { printf("unknown family\n"); continue; }
            g_stop = 0;
            g_nthreads = a < 1 ? 1 : a > 4 ? 4 : (int)a;
            __atomic_store_n(&g_first_rounds, 0, __ATOMIC_SEQ_CST);
            for (nth = 0; nth < g_nthreads; nth++) pthread_create(&th[nth], NULL, busy, (void *)(intptr_t)nth);
            /* answer once every thread has done one whole round (so "stop" always reports work done),
             * waiting at most 60 s */
            for (int ms = 0; ms < 60000 && __atomic_load_n(&g_first_rounds, __ATOMIC_SEQ_CST) < g_nthreads; ms++)
                usleep(1000);
            printf("busy\n");
        } else if (strncmp(line, "stop", 4) == 0) {
            g_stop = 1;
            for (int i = 0; i < nth; i++) pthread_join(th[i], NULL);
            nth = 0;
            printf("stopped %ld %ld\n", g_rounds, g_errors);
        } else if (sscanf(line, "device %zu", &a) == 1) {
            CUdevice d;
            CUcontext c;
            if (cuDeviceGet(&d, (int)a) || cuCtxCreate_v2(&c, 0, d)) printf("device failed\n");
            else printf("device %zu\n", a);
        } else if (strncmp(line, "ptrs", 4) == 0) {
            printf("ptrs");
            for (int i = 0; i < g_n; i++) printf(" %llx", (unsigned long long)g_ptr[i]);
            printf("\n");
        } else if (strncmp(line, "inflight", 8) == 0) {
            cmd_inflight();
        } else if (strncmp(line, "release", 7) == 0) {
            CUresult rc[2] = {CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_NOT_SUPPORTED};
            pthread_t t;
            if (pthread_create(&t, NULL, releaser, rc) == 0) pthread_join(t, NULL);
            printf("released %d %d\n", rc[0], rc[1]);
        } else if (sscanf(line, "hold %zu", &a) == 1) {
            cmd_hold((unsigned)a);
        } else if (strncmp(line, "held", 4) == 0) {
            printf("held %d\n", cuStreamSynchronize(g_sh));
        } else if (strncmp(line, "slowest", 7) == 0) {
            printf("slowest %llu\n", (unsigned long long)(__atomic_exchange_n(&g_slowest_ns, 0, __ATOMIC_RELAXED) / 1000000ull));
        } else if (strncmp(line, "counters", 8) == 0) {
            cmd_counters();
        } else if (strncmp(line, "free", 4) == 0) {
            CUresult rc = CUDA_SUCCESS;
            for (int i = 0; i < g_n; i++) rc |= cuMemFree_v2(g_ptr[i]);
            g_n = 0;
            printf("freed %d\n", rc);
        } else {
            printf("unknown\n");
        }
    }
    return 0;
}

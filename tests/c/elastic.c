/* An elastic-memory tenant for tests/test_elastic_swap.py and tests/test_elastic_gate.py, driven by commands
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
 *   free                  free everything: "freed RC"
 * Between commands the process makes no CUDA call at all (it becomes idle). */
#define _GNU_SOURCE
#include <pthread.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* check: every byte of every block read back and compared. */
static void cmd_check(void) {
    size_t total = 0;
    for (int b = 0; b < g_n; b++) {
        uint32_t *buf = malloc(g_size[b]);
        CUresult rc = cuMemcpyDtoH_v2(buf, g_ptr[b], g_size[b]);
        for (size_t i = 0; rc == CUDA_SUCCESS && i < g_size[b] / 4; i++)
            if (buf[i] != word(b, i)) {
                printf("check bad block %d word %zu: %08x != %08x\n", b, i, buf[i], word(b, i));
                free(buf);
                return;
            }
        free(buf);
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
            if (fam) { /* the partner block: the thread's other busy block (peer copies go between the two) */
                int b2 = b - g_nthreads >= 0 && b - g_nthreads >= g_n - 4 ? b - g_nthreads : g_n - 1 - id;
                errors += fam->round(&ops, g_ctx, g_ptr[b], g_ptr[b2], g_size[b], v, buf);
                continue;
            }
            if (cuMemsetD32_v2(g_ptr[b], v, g_size[b] / 4) || cuMemcpyDtoH_v2(buf, g_ptr[b], g_size[b])) { errors++; continue; }
            for (size_t i = 0; i < g_size[b] / 4; i++)
                if (buf[i] != v) { errors++; break; }
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

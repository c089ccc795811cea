/* Oversubscription checks: allocates COUNT blocks of MiB through ROUTE, writes and reads back data
 * through every pointer, reports each pointer's memory type, then frees them in a shuffled order.
 * Usage: spill ROUTE COUNT MiB [hold|fill|prefetch]   ROUTE: plain pitch managed async vmm mixed capture
 * With "hold", prints "ready" after allocating and waits for a line on stdin before freeing; "fill" does the
 * same after writing every byte of each block as it is allocated (cuMemsetD8, so its pages exist); with
 * "prefetch", prefetches every block to the GPU before freeing. After allocating it prints the simulated
 * driver's counters (pins, host-located cuMemCreate, copies: memsliceSimCounters), or "counters none" on a
 * driver without them. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_api.h"

#define MiB ((size_t)1 << 20)
enum { R_PLAIN, R_PITCH, R_MANAGED, R_ASYNC, R_VMM };
struct block { int route; CUdeviceptr p; CUmemGenericAllocationHandle h; size_t size; };
static int g_fill; /* "fill": write every byte of each block once it is allocated */

/* Allocate one block of `size` bytes through `route`. */
static CUresult alloc_block(struct block *b, int route, size_t size) {
    b->route = route;
    b->size = size;
    switch (route) {
    case R_PLAIN: return cuMemAlloc_v2(&b->p, size);
    case R_PITCH: { size_t pitch; return cuMemAllocPitch_v2(&b->p, &pitch, 1024, size / 1024, 4); }
    case R_MANAGED: return cuMemAllocManaged(&b->p, size, CU_MEM_ATTACH_GLOBAL);
    case R_ASYNC: return cuMemAllocAsync(&b->p, size, NULL);
    default: {
        CUmemAllocationProp prop; memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED; prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        CUresult rc = cuMemCreate(&b->h, size, &prop, 0);
        if (rc) return rc;
        cuMemAddressReserve(&b->p, size, 0, 0, 0);
        cuMemMap(b->p, size, 0, b->h, 0);
        CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, 3};
        return cuMemSetAccess(b->p, size, &acc, 1);
    }
    }
}

/* Free a block the way its route requires (VMM: unmap, free the range, release the handle). */
static CUresult free_block(struct block *b) {
    switch (b->route) {
    case R_ASYNC: return cuMemFreeAsync(b->p, NULL);
    case R_VMM: cuMemUnmap(b->p, b->size); cuMemAddressFree(b->p, b->size); return cuMemRelease(b->h);
    default: return cuMemFree_v2(b->p);
    }
}

/* The route of block i for a ROUTE argument ("mixed" cycles through all five). */
static int route_of(const char *s, int i) {
    if (!strcmp(s, "mixed")) return i % 5;
    if (!strcmp(s, "pitch")) return R_PITCH;
    if (!strcmp(s, "managed")) return R_MANAGED;
    if (!strcmp(s, "async")) return R_ASYNC;
    if (!strcmp(s, "vmm")) return R_VMM;
    return R_PLAIN;
}

/* "capture": stream-ordered allocations while a stream is being captured must never spill. */
static int run_capture(int count, size_t size) {
    CUstream s;
    CUdeviceptr p;
    cuStreamCreate(&s, 0);
    cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
    CUresult rc = 0;
    for (int i = 0; i < count && rc == 0; i++) rc = cuMemAllocAsync(&p, size, s);
    cuStreamEndCapture(s, NULL);
    printf("capture last_rc=%d\n", rc);
    return 0;
}

/* Write a pattern to the first and last page of block i and read both back: the whole range is usable. */
static int data_ok(const struct block *b, int i) {
    unsigned char pattern[4096], back[4096];
    for (int k = 0; k < 4096; k++) pattern[k] = (unsigned char)(i * 31 + k);
    cuMemcpyHtoD_v2(b->p, pattern, 4096);
    cuMemcpyHtoD_v2(b->p + b->size - 4096, pattern, 4096);
    memset(back, 0, sizeof back);
    cuMemcpyDtoH_v2(back, b->p + b->size - 4096, 4096);
    int good = !memcmp(back, pattern, 4096);
    cuMemcpyDtoH_v2(back, b->p, 4096);
    return good && !memcmp(back, pattern, 4096);
}

/* Allocate block i through its route and print what it is (memory type, managed, data check). 1 if it
 * was allocated. */
static int alloc_and_report(struct block *b, int i, int route, size_t size) {
    CUresult rc = alloc_block(b, route, size);
    if (rc != CUDA_SUCCESS) {
        printf("alloc %d route=%d rc=%d\n", i, b->route, rc);
        b->p = 0;
        return 0;
    }
    unsigned int type = 0;
    int managed = 0;
    cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, b->p);
    cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, b->p);
    printf("alloc %d route=%d rc=0 type=%u managed=%d data=%s\n", i, b->route, type, managed,
           data_ok(b, i) ? "ok" : "BAD");
    if (g_fill) printf("fill %d rc=%d\n", i, (int)cuMemsetD8_v2(b->p, 0x5a, b->size));
    fflush(stdout);
    return 1;
}

/* The simulated driver's counters of what it did for this process (pins, host creations, copies). */
static void print_counters(void) {
    unsigned int (*get)(unsigned long long *, unsigned int);
    *(void **)&get = dlsym(RTLD_DEFAULT, "memsliceSimCounters");
    unsigned long long c[6] = {0};
    if (!get || get(c, 6) < 6) { printf("counters none\n"); return; }
    printf("counters pins=%llu pin_bytes=%llu host_creates=%llu host_create_bytes=%llu copies=%llu copy_bytes=%llu\n",
           c[0], c[1], c[2], c[3], c[4], c[5]);
}

/* "prefetch": prefetch every block to GPU 0 (spilled managed ranges must stay where they are). */
static void prefetch_all(const struct block *b, int count) {
    CUmemLocation gpu = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
    int bad = 0;
    for (int i = 0; i < count; i++)
        if (b[i].p && cuMemPrefetchAsync_v2(b[i].p, b[i].size, gpu, 0, NULL)) bad++;
    printf("prefetch bad=%d\n", bad);
}

/* Free every block in a shuffled order; returns how many frees failed. */
static int free_shuffled(struct block *b, int count) {
    srand(7);
    for (int i = count - 1; i > 0; i--) {
        int j = rand() % (i + 1);
        struct block x = b[i];
        b[i] = b[j];
        b[j] = x;
    }
    int bad = 0;
    for (int i = 0; i < count; i++)
        if (b[i].p && free_block(&b[i]) != CUDA_SUCCESS) bad++;
    return bad;
}

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    int count = atoi(argv[2]);
    size_t size = (size_t)atoi(argv[3]) * MiB;
    const char *mode = argc > 4 ? argv[4] : "";
    g_fill = !strcmp(mode, "fill");
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) return 3;
    if (!strcmp(argv[1], "capture")) return run_capture(count, size);
    struct block *b = calloc((size_t)count, sizeof *b);
    if (!b) return 4;
    int ok = 0;
    for (int i = 0; i < count; i++) ok += alloc_and_report(&b[i], i, route_of(argv[1], i), size);
    print_counters();
    if (!strcmp(mode, "prefetch")) prefetch_all(b, count);
    size_t f, t;
    cuMemGetInfo_v2(&f, &t);
    printf("info ok=%d free_mib=%zu total_mib=%zu\n", ok, f / MiB, t / MiB);
    fflush(stdout);
    if (!strcmp(mode, "hold") || g_fill) { /* wait for the test to look at the node, then free */
        printf("ready\n");
        fflush(stdout);
        char line[16];
        if (!fgets(line, sizeof line, stdin)) return 0;
    }
    int bad = free_shuffled(b, count);
    cuMemGetInfo_v2(&f, &t);
    printf("freed bad=%d free_mib=%zu\n", bad, f / MiB);
    free(b);
    return bad ? 1 : 0;
}

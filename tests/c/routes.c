/* Reaches the driver through each route real programs use, and prints key=value lines for the tests:
 *   dlsym     dlopen("libcuda.so.1") + dlsym, as Triton and old PyTorch do
 *   procaddr  only cuGetProcAddress_v2 from dlsym, then everything through the pointer returned for
 *             ("cuGetProcAddress", 12000), exactly as libcudart 12/13 does
 *   v1        the legacy 32-bit entry points
 * Usage: routes ROUTE MiB  (allocates MiB twice; with a quota below 2×MiB the second must be refused) */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_api.h"

typedef __typeof__(&cuGetProcAddress_v2) getproc_v2_t;
static void *lib;
static getproc_v2_t gp;

/* The file name of the object a function lives in ("none" if unknown). */
static const char *where(void *fn) {
    Dl_info info;
    if (!fn || !dladdr(fn, &info) || !info.dli_fname) return "none";
    const char *slash = strrchr(info.dli_fname, '/');
    return slash ? slash + 1 : info.dli_fname;
}

/* The exported name of the function at an address ("none" if unknown). */
static const char *sym_name(void *fn) {
    Dl_info info;
    return fn && dladdr(fn, &info) && info.dli_sname ? info.dli_sname : "none";
}

/* Resolve by the route under test. */
static void *get(const char *route, const char *base, const char *versioned, int ver, cuuint64_t flags) {
    if (strcmp(route, "procaddr") == 0) {
        void *fn = NULL;
        CUdriverProcAddressQueryResult st = 99;
        CUresult rc = gp(base, &fn, ver, flags, &st);
        printf("lookup %s@%d/%llu rc=%d status=%d lib=%s sym=%s\n", base, ver, flags, rc, st, where(fn), sym_name(fn));
        return fn;
    }
    return dlsym(lib, versioned);
}

/* The procaddr route's preamble, as libcudart 12/13 does it: only cuGetProcAddress_v2 from dlsym, then
 * its own cuGetProcAddress through it; prints what each look-up returns. */
static void procaddr_lookups(const char *route) {
    getproc_v2_t first = (getproc_v2_t)dlsym(lib, "cuGetProcAddress_v2");
    printf("dlsym cuGetProcAddress_v2 lib=%s\n", where((void *)first));
    void *fn = NULL;
    CUdriverProcAddressQueryResult st = 99;
    CUresult rc = first("", &fn, 0, 0, &st); /* cudart's first look-ups */
    printf("empty rc=%d fn=%s status=%d\n", rc, fn ? "set" : "null", st);
    first("cuInit", &fn, 2000, 0, &st);
    first("cuGetProcAddress", &fn, 11030, 0, &st);
    printf("getproc11030 lib=%s sym=%s\n", where(fn), sym_name(fn));
    first("cuGetProcAddress", &fn, 12000, 0, &st);
    printf("getproc12000 lib=%s sym=%s\n", where(fn), sym_name(fn));
    gp = (getproc_v2_t)fn;
    fn = (void *)1;
    rc = gp("cuNoSuchFunction", &fn, 12000, 0, &st);
    printf("unknown rc=%d fn=%s status=%d\n", rc, fn ? "set" : "null", st);
    rc = gp("cuMemAlloc", &fn, 99000, 0, &st);
    printf("toonew rc=%d\n", rc);
    rc = gp("cuMemAllocAsync", &fn, 11000, 0, &st);
    printf("notyet rc=%d fn=%s status=%d\n", rc, fn ? "set" : "null", st);
    rc = gp("cuGetExportTable", &fn, 3000, 0, &st);
    printf("exporttable lib=%s\n", where(fn));
    void *legacy = get(route, "cuMemAllocAsync", NULL, 11020, 0);
    void *ptds = get(route, "cuMemAllocAsync", NULL, 11020, 2);
    printf("async_distinct=%d\n", legacy != ptds);
    get(route, "cuCtxCreate", NULL, 3020, 0);
    get(route, "cuCtxCreate", NULL, 12050, 0);
    get(route, "cuMemcpy", NULL, 7000, 2);
    get(route, "cuStreamQuery", NULL, 7000, 2); /* not wrapped: the driver's own per-thread variant */
}

/* cuInit, device 0, its primary context made current, all found through the route. 0 on success. */
static int make_context(const char *route, CUdevice *dev) {
    __typeof__(&cuInit) init = get(route, "cuInit", "cuInit", 2000, 0);
    __typeof__(&cuDeviceGet) dget = get(route, "cuDeviceGet", "cuDeviceGet", 2000, 0);
    __typeof__(&cuDevicePrimaryCtxRetain) retain =
        get(route, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain", 7000, 0);
    __typeof__(&cuCtxSetCurrent) setcur = get(route, "cuCtxSetCurrent", "cuCtxSetCurrent", 4000, 0);
    CUcontext ctx;
    return init(0) || dget(dev, 0) || retain(&ctx, *dev) || setcur(ctx);
}

/* The legacy 32-bit entry points (by symbol): memory info, then two allocations of `mib`, the frees, and
 * a free of a pointer nobody allocated. r[] gets the three results. */
static void run_v1(CUdevice dev, size_t mib, CUresult r[3]) {
    __typeof__(&cuMemAlloc) alloc1 = dlsym(lib, "cuMemAlloc");
    __typeof__(&cuMemFree) free1 = dlsym(lib, "cuMemFree");
    __typeof__(&cuMemGetInfo) info1 = dlsym(lib, "cuMemGetInfo");
    __typeof__(&cuDeviceTotalMem) total1 = dlsym(lib, "cuDeviceTotalMem");
    unsigned f1 = 0, t1 = 0, dt1 = 0;
    info1(&f1, &t1);
    total1(&dt1, dev);
    printf("v1info free_mib=%u total_mib=%u devtotal_mib=%u\n", f1 >> 20, t1 >> 20, dt1 >> 20);
    CUdeviceptr_v1 a = 0, b = 0;
    r[0] = alloc1(&a, (unsigned)(mib << 20));
    r[1] = alloc1(&b, (unsigned)(mib << 20));
    if (r[0] == CUDA_SUCCESS) free1(a);
    if (r[1] == CUDA_SUCCESS) free1(b);
    r[2] = free1(0x1234);
}

/* The same through the route's 64-bit functions, with the memory info between. */
static void run_v2(const char *route, size_t mib, CUresult r[3]) {
    __typeof__(&cuMemAlloc_v2) alloc = get(route, "cuMemAlloc", "cuMemAlloc_v2", 3020, 0);
    __typeof__(&cuMemFree_v2) mfree = get(route, "cuMemFree", "cuMemFree_v2", 3020, 0);
    __typeof__(&cuMemGetInfo_v2) info = get(route, "cuMemGetInfo", "cuMemGetInfo_v2", 3020, 0);
    printf("alloc_fn lib=%s\n", where((void *)alloc));
    CUdeviceptr a = 0, b = 0;
    r[0] = alloc(&a, mib << 20);
    r[1] = alloc(&b, mib << 20);
    size_t f, t;
    info(&f, &t);
    printf("info free_mib=%zu total_mib=%zu\n", f >> 20, t >> 20);
    if (r[0] == CUDA_SUCCESS) mfree(a);
    if (r[1] == CUDA_SUCCESS) mfree(b);
    r[2] = mfree(0xdead0000ull); /* never allocated: must reach the driver, which says INVALID_VALUE */
}

int main(int argc, char **argv) {
    const char *route = argc > 1 ? argv[1] : "dlsym";
    size_t mib = argc > 2 ? strtoull(argv[2], NULL, 10) : 64;
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) { printf("dlopen failed: %s\n", dlerror()); return 2; }
    if (strcmp(route, "procaddr") == 0) procaddr_lookups(route);
    CUdevice dev;
    if (make_context(route, &dev)) { printf("setup failed\n"); return 3; }
    CUresult r[3];
    if (strcmp(route, "v1") == 0) run_v1(dev, mib, r);
    else run_v2(route, mib, r);
    printf("first=%d second=%d unknown_free=%d\n", r[0], r[1], r[2]);
    return 0;
}

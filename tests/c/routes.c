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

typedef CUresult (*getproc_v2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
static void *lib;
static getproc_v2_t gp;

static const char *where(void *fn) {
    Dl_info info;
    if (!fn || !dladdr(fn, &info) || !info.dli_fname) return "none";
    const char *slash = strrchr(info.dli_fname, '/');
    return slash ? slash + 1 : info.dli_fname;
}

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

int main(int argc, char **argv) {
    const char *route = argc > 1 ? argv[1] : "dlsym";
    size_t mib = argc > 2 ? strtoull(argv[2], NULL, 10) : 64;
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) { printf("dlopen failed: %s\n", dlerror()); return 2; }
    if (strcmp(route, "procaddr") == 0) {
        getproc_v2_t first = (getproc_v2_t)dlsym(lib, "cuGetProcAddress_v2");
        printf("dlsym cuGetProcAddress_v2 lib=%s\n", where((void *)first));
        void *fn = NULL;
        CUdriverProcAddressQueryResult st = 99;
        /* cudart's first look-ups */
        CUresult rc = first("", &fn, 0, 0, &st);
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
    }
    CUresult (*init)(unsigned) = get(route, "cuInit", "cuInit", 2000, 0);
    CUresult (*dget)(CUdevice *, int) = get(route, "cuDeviceGet", "cuDeviceGet", 2000, 0);
    CUresult (*retain)(CUcontext *, CUdevice) = get(route, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain", 7000, 0);
    CUresult (*setcur)(CUcontext) = get(route, "cuCtxSetCurrent", "cuCtxSetCurrent", 4000, 0);
    CUresult (*info)(size_t *, size_t *) = get(route, "cuMemGetInfo", "cuMemGetInfo_v2", 3020, 0);
    CUdevice dev;
    CUcontext ctx;
    if (init(0) || dget(&dev, 0) || retain(&ctx, dev) || setcur(ctx)) { printf("setup failed\n"); return 3; }
    CUresult r1, r2, rf;
    if (strcmp(route, "v1") == 0) {
        CUresult (*alloc1)(CUdeviceptr_v1 *, unsigned) = dlsym(lib, "cuMemAlloc");
        CUresult (*free1)(CUdeviceptr_v1) = dlsym(lib, "cuMemFree");
        CUresult (*info1)(unsigned *, unsigned *) = dlsym(lib, "cuMemGetInfo");
        CUresult (*total1)(unsigned *, CUdevice) = dlsym(lib, "cuDeviceTotalMem");
        unsigned f1 = 0, t1 = 0, dt1 = 0;
        info1(&f1, &t1);
        total1(&dt1, dev);
        printf("v1info free_mib=%u total_mib=%u devtotal_mib=%u\n", f1 >> 20, t1 >> 20, dt1 >> 20);
        CUdeviceptr_v1 a = 0, b = 0;
        r1 = alloc1(&a, (unsigned)(mib << 20));
        r2 = alloc1(&b, (unsigned)(mib << 20));
        if (r1 == CUDA_SUCCESS) free1(a);
        if (r2 == CUDA_SUCCESS) free1(b);
        rf = free1(0x1234);
    } else {
        CUresult (*alloc)(CUdeviceptr *, size_t) = get(route, "cuMemAlloc", "cuMemAlloc_v2", 3020, 0);
        CUresult (*mfree)(CUdeviceptr) = get(route, "cuMemFree", "cuMemFree_v2", 3020, 0);
        printf("alloc_fn lib=%s\n", where((void *)alloc));
        CUdeviceptr a = 0, b = 0;
        r1 = alloc(&a, mib << 20);
        r2 = alloc(&b, mib << 20);
        size_t f, t;
        info(&f, &t);
        printf("info free_mib=%zu total_mib=%zu\n", f >> 20, t >> 20);
        if (r1 == CUDA_SUCCESS) mfree(a);
        if (r2 == CUDA_SUCCESS) mfree(b);
        rf = mfree(0xdead0000ull); /* never allocated: must reach the driver, which says INVALID_VALUE */
    }
    printf("first=%d second=%d unknown_free=%d\n", r1, r2, rf);
    return 0;
}

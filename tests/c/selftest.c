/* Self-checking test of the shim on the simulated GPU, run by `make -C interposer check` (and its
 * sanitizer build) with the shim preloaded and MEMSLICE_GPU_MEM_LIMIT=1GiB on a 4 GiB simulated GPU.
 * For every allocation family: an allocation within the quota succeeds and is charged, one past what is
 * left is refused although the GPU has room, and freeing gives the charge back. Then the two routes a
 * program finds driver functions by (dlsym on libcuda, cuGetProcAddress) must hand out the shim's hooks.
 * Usage: selftest PATH_OF_LIBMEMSLICE. Prints one line per check; exit status 1 on the first failure. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_api.h"

#define MiB ((size_t)1 << 20)
#define QUOTA (1024 * MiB)
#define BLOCK (256 * MiB)

static int g_checks;

/* Report one check; stop the program at the first that fails. */
static void check(int ok, const char *what, long long got) {
    g_checks++;
    printf("%s %s (%lld)\n", ok ? "ok  " : "FAIL", what, got);
    if (!ok) exit(1);
}

/* Free bytes as the application is told: the quota minus what the container is charged. */
static size_t free_now(void) {
    size_t f = 0, t = 0;
    CUresult rc = cuMemGetInfo_v2(&f, &t);
    if (rc != CUDA_SUCCESS || t != QUOTA) check(0, "cuMemGetInfo_v2 succeeds and its total is the quota", (long long)t);
    return f;
}

/* One family: alloc(BLOCK) succeeds and is charged, alloc(left + 1 MiB) is refused, release() gives the
 * charge back. */
struct family {
    const char *name;
    CUresult (*alloc)(size_t n, void **state);
    CUresult (*release)(void *state);
};

/* Family cuMemAlloc_v2 / cuMemFree_v2. */
static CUresult dev_alloc(size_t n, void **s) { return cuMemAlloc_v2((CUdeviceptr *)s, n); }
/* Free for the device, pitched and managed families. */
static CUresult dev_free(void *s) { return cuMemFree_v2((CUdeviceptr)(uintptr_t)s); }
/* Family cuMemAllocPitch_v2: 4 KiB rows, n / 4096 of them. */
static CUresult pitch_alloc(size_t n, void **s) { size_t p; return cuMemAllocPitch_v2((CUdeviceptr *)s, &p, 4096, n / 4096, 4); }
/* Family cuMemAllocManaged. */
static CUresult managed_alloc(size_t n, void **s) { return cuMemAllocManaged((CUdeviceptr *)s, n, CU_MEM_ATTACH_GLOBAL); }
/* Family cuMemAllocAsync (default pool, legacy stream). */
static CUresult async_alloc(size_t n, void **s) { return cuMemAllocAsync((CUdeviceptr *)s, n, NULL); }
/* Stream-ordered free, then a synchronize so the pool gives the memory back. */
static CUresult async_free(void *s) {
    CUresult rc = cuMemFreeAsync((CUdeviceptr)(uintptr_t)s, NULL);
    return rc ? rc : cuStreamSynchronize(NULL); /* the pool gives its memory back at synchronisation */
}
/* Family cuMemCreate (physical VMM memory on device 0). */
static CUresult vmm_alloc(size_t n, void **s) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    return cuMemCreate((CUmemGenericAllocationHandle *)s, n, &prop, 0);
}
/* Release the VMM handle (never mapped, so the memory goes at once). */
static CUresult vmm_free(void *s) { return cuMemRelease((CUmemGenericAllocationHandle)(uintptr_t)s); }
/* Family cuArrayCreate_v2: 8192 x N 32-bit texels. */
static CUresult array_alloc(size_t n, void **s) {
    CUDA_ARRAY_DESCRIPTOR d = {.Width = 8192, .Height = n / (8192 * 4), .Format = CU_AD_FORMAT_UNSIGNED_INT32,
                               .NumChannels = 1};
    return cuArrayCreate_v2((CUarray *)s, &d);
}
/* Destroy the array. */
static CUresult array_free(void *s) { return cuArrayDestroy((CUarray)s); }

/* Within the quota: allowed and charged; past what is left: refused; freed: charge back. */
static void check_family(const struct family *f) {
    char what[160];
    size_t before = free_now();
    void *a = NULL, *b = NULL;
    snprintf(what, sizeof what, "%s: %zu MiB within the quota", f->name, BLOCK / MiB);
    check(f->alloc(BLOCK, &a) == CUDA_SUCCESS, what, 0);
    size_t after = free_now();
    snprintf(what, sizeof what, "%s: charged at least what was asked", f->name);
    check(before - after >= BLOCK, what, (long long)((before - after) / MiB));
    snprintf(what, sizeof what, "%s: %zu MiB (1 MiB past what is left) refused", f->name, after / MiB + 1);
    CUresult rc = f->alloc(((after / MiB) + 1) * MiB, &b);
    check(rc == CUDA_ERROR_OUT_OF_MEMORY, what, rc);
    snprintf(what, sizeof what, "%s: free succeeds", f->name);
    check(f->release(a) == CUDA_SUCCESS, what, 0);
    snprintf(what, sizeof what, "%s: the charge is given back", f->name);
    check(free_now() == before, what, (long long)(free_now() / MiB));
}

/* The object file a function lives in ("" if unknown). */
static const char *home(void *fn) {
    Dl_info info;
    return fn && dladdr(fn, &info) && info.dli_fname ? info.dli_fname : "";
}

/* The dlsym and cuGetProcAddress routes hand out the shim, and the 32-bit entry point is counted. */
static void check_routes(const char *shim) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    check(lib != NULL, "dlopen libcuda.so.1", 0);
    check(strcmp(home(dlsym(lib, "cuMemAlloc_v2")), shim) == 0, "dlsym(libcuda, cuMemAlloc_v2) is the hook", 0);
    void *fn = NULL;
    CUdriverProcAddressQueryResult st;
    CUresult rc = cuGetProcAddress_v2("cuMemAlloc", &fn, 12000, 0, &st);
    check(rc == CUDA_SUCCESS && strcmp(home(fn), shim) == 0, "cuGetProcAddress(cuMemAlloc) is the hook", rc);
    CUdeviceptr_v1 p1;
    rc = cuMemAlloc(&p1, (unsigned int)(2 * QUOTA > 0xffffffffu ? 0xfff00000u : 2 * QUOTA));
    check(rc == CUDA_ERROR_OUT_OF_MEMORY, "legacy 32-bit cuMemAlloc past the quota refused", rc);
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: selftest PATH_OF_LIBMEMSLICE\n"); return 2; }
    CUdevice dev;
    CUcontext ctx;
    check(cuInit(0) == CUDA_SUCCESS && cuDeviceGet(&dev, 0) == CUDA_SUCCESS, "cuInit and cuDeviceGet", 0);
    check(cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS && cuCtxSetCurrent(ctx) == CUDA_SUCCESS,
          "primary context", 0);
    size_t total = 0;
    check(cuDeviceTotalMem_v2(&total, dev) == CUDA_SUCCESS && total == QUOTA, "cuDeviceTotalMem_v2 is the quota",
          (long long)total);
    static const struct family families[] = {
        {"cuMemAlloc_v2", dev_alloc, dev_free},        {"cuMemAllocPitch_v2", pitch_alloc, dev_free},
        {"cuMemAllocManaged", managed_alloc, dev_free}, {"cuMemAllocAsync", async_alloc, async_free},
        {"cuMemCreate", vmm_alloc, vmm_free},           {"cuArrayCreate_v2", array_alloc, array_free},
    };
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++) check_family(&families[i]);
    check_routes(argv[1]);
    printf("selftest: %d checks passed\n", g_checks);
    return 0;
}

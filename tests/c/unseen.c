/* Calls that take device memory without being allocations (issue 23), then fills what is left, printing
 * after each step what the shim has left (cuMemGetInfo's free) and what NVML shows this process using on
 * GPU 0 (its per-process figure: the physical truth on the simulated GPU). Usage: unseen STEP..., in order:
 *   ctx N        N more contexts (cuCtxCreate_v2), kept; the primary context stays current
 *   stack KIB    cuCtxSetLimit(CU_LIMIT_STACK_SIZE, KIB KiB), then the limit as read back
 *   heap MIB     cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, MIB MiB)
 *   module MIB   cuModuleLoadData of a simulated image whose __device__ globals take MIB MiB
 *   library MIB  cuLibraryLoadData of the same
 *   modfile MIB PATH  cuModuleLoad of such an image written to PATH
 *   import MIB   cuMemCreate, export as a file descriptor, import, map the import, release the original
 *   fill         cuMemAlloc_v2 16 MiB at a time until refused (printing how much it got)
 *   unload       destroy, unload, unmap and release everything above
 *   hold         print "held" and wait for a line on stdin
 * A first argument "early MIB" loads a library of MIB MiB before any context exists (no context to
 * measure it in: only NVML's per-process figure shows it). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_api.h"

#define MiB (1ull << 20)
static CUcontext g_primary, g_ctx[32];
static int g_nctx, g_nmod, g_nlib, g_nimp;
static CUmodule g_mod[32];
static CUlibrary g_lib[32];
static struct { CUmemGenericAllocationHandle h; CUdeviceptr va; size_t size; } g_imp[8];
static CUdeviceptr g_fill[4096];
static int g_nfill;

/* NVML's per-process figure for this process on GPU 0 (MiB), through the libnvidia-ml.so.1 in the path. */
static long nvml_mib(void) {
    static __typeof__(&nvmlDeviceGetComputeRunningProcesses_v3) list;
    static nvmlDevice_t dev;
    if (!list) {
        void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
        __typeof__(&nvmlInit_v2) init = h ? (__typeof__(&nvmlInit_v2))dlsym(h, "nvmlInit_v2") : NULL;
        __typeof__(&nvmlDeviceGetHandleByIndex_v2) by_index =
            h ? (__typeof__(&nvmlDeviceGetHandleByIndex_v2))dlsym(h, "nvmlDeviceGetHandleByIndex_v2") : NULL;
        if (!init || !by_index || init() != 0 || by_index(0, &dev) != 0) return -1;
        list = (__typeof__(list))dlsym(h, "nvmlDeviceGetComputeRunningProcesses_v3");
        if (!list) return -1;
    }
    nvmlProcessInfo_t p[64];
    unsigned int n = 64;
    if (list(dev, &n, p) != 0) return -1;
    unsigned long long used = 0;
    for (unsigned i = 0; i < n; i++)
        if (p[i].pid == (unsigned)getpid()) used += p[i].usedGpuMemory;
    return (long)(used / MiB);
}

/* Free MiB as cuMemGetInfo_v2 reports it (the quota view under the shim). */
static long free_mib(void) { size_t f = 0, t = 0; cuMemGetInfo_v2(&f, &t); return (long)(f / MiB); }
static void report(const char *step, int rc) {
    printf("%s rc=%d free_mib=%ld nvml_mib=%ld\n", step, rc, free_mib(), nvml_mib());
    fflush(stdout);
}

/* A simulated module image (simcuda.h: SIM_MODULE_MAGIC, then the globals' bytes). */
static void image(unsigned char out[16], unsigned long long mib) {
    unsigned long long n = mib * MiB;
    memcpy(out, "MSSIMMOD", 8);
    memcpy(out + 8, &n, 8);
}

/* N more contexts, each kept; the primary context is made current again after. */
static void step_ctx(int n) {
    for (int i = 0; i < n && g_nctx < 32; i++) {
        CUresult rc = cuCtxCreate_v2(&g_ctx[g_nctx], 0, 0);
        if (rc == CUDA_SUCCESS) g_nctx++;
        cuCtxSetCurrent(g_primary);
        report("ctx", rc);
    }
}

/* A limit of the primary context, then its value read back. */
static void step_limit(const char *name, CUlimit which, size_t value) {
    CUresult rc = cuCtxSetLimit(which, value);
    size_t now = 0;
    cuCtxGetLimit(&now, which);
    printf("%s_value=%zu\n", name, now);
    report(name, rc);
}

static void step_module(unsigned long long mib, int library) {
    unsigned char img[16];
    image(img, mib);
    CUresult rc;
    if (library) {
        rc = cuLibraryLoadData(&g_lib[g_nlib], img, NULL, NULL, 0, NULL, NULL, 0);
        if (rc == CUDA_SUCCESS) g_nlib++;
    } else {
        rc = cuModuleLoadData(&g_mod[g_nmod], img);
        if (rc == CUDA_SUCCESS) g_nmod++;
    }
    report(library ? "library" : "module", rc);
}

static void step_modfile(unsigned long long mib, const char *path) {
    unsigned char img[16];
    image(img, mib);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(img, 1, sizeof img, f) != sizeof img) exit(3);
    fclose(f);
    CUresult rc = cuModuleLoad(&g_mod[g_nmod], path);
    if (rc == CUDA_SUCCESS) g_nmod++;
    report("modfile", rc);
}

/* Exported, imported, the import mapped, the original released: the memory lives through the import. */
static void step_import(unsigned long long mib) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location = (CUmemLocation){CU_MEM_LOCATION_TYPE_DEVICE, 0};
    size_t size = mib * MiB;
    CUmemGenericAllocationHandle h, imp;
    int fd = -1;
    CUresult rc = cuMemCreate(&h, size, &prop, 0);
    report("import_create", rc);
    if (rc) return;
    rc = cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (!rc) rc = cuMemImportFromShareableHandle(&imp, (void *)(long)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    report("import_import", rc);
    CUdeviceptr va = 0;
    if (!rc) rc = cuMemAddressReserve(&va, size, 0, 0, 0);
    if (!rc) rc = cuMemMap(va, size, 0, imp, 0);
    CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, 3};
    if (!rc) rc = cuMemSetAccess(va, size, &acc, 1);
    report("import_map", rc);
    CUresult rel = cuMemRelease(h);
    if (fd >= 0) close(fd);
    report("import_release_original", rel);
    if (!rc) g_imp[g_nimp++] = (__typeof__(g_imp[0])){imp, va, size};
}

static void step_fill(void) {
    CUresult rc = CUDA_SUCCESS;
    long got = 0;
    while (g_nfill < 4096 && (rc = cuMemAlloc_v2(&g_fill[g_nfill], 16 * MiB)) == CUDA_SUCCESS) {
        g_nfill++;
        got += 16;
    }
    printf("fill_got_mib=%ld\n", got);
    report("fill", rc);
}

static void step_unload(void) {
    CUresult rc = CUDA_SUCCESS;
    while (g_nfill) rc |= cuMemFree_v2(g_fill[--g_nfill]);
    while (g_nmod) rc |= cuModuleUnload(g_mod[--g_nmod]);
    while (g_nlib) rc |= cuLibraryUnload(g_lib[--g_nlib]);
    while (g_nctx) rc |= cuCtxDestroy_v2(g_ctx[--g_nctx]);
    cuCtxSetCurrent(g_primary);
    while (g_nimp) {
        g_nimp--;
        rc |= cuMemUnmap(g_imp[g_nimp].va, g_imp[g_nimp].size);
        rc |= cuMemRelease(g_imp[g_nimp].h);
        rc |= cuMemAddressFree(g_imp[g_nimp].va, g_imp[g_nimp].size);
    }
    rc |= cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 1024);
    report("unload", rc);
}

int main(int argc, char **argv) {
    CUresult rc = cuInit(0);
    int first = 1;
    if (argc > 2 && !strcmp(argv[1], "early")) {
        unsigned char img[16];
        image(img, strtoull(argv[2], NULL, 10));
        printf("early rc=%d\n", (int)cuLibraryLoadData(&g_lib[g_nlib++], img, NULL, NULL, 0, NULL, NULL, 0));
        first = 3;
    }
    if (!rc) rc = cuDevicePrimaryCtxRetain(&g_primary, 0);
    if (!rc) rc = cuCtxSetCurrent(g_primary);
    report("start", rc);
    if (rc) return 1;
    for (int i = first; i < argc; i++) {
        const char *s = argv[i];
        unsigned long long v = i + 1 < argc ? strtoull(argv[i + 1], NULL, 10) : 0;
        if (!strcmp(s, "ctx")) step_ctx((int)v), i++;
        else if (!strcmp(s, "stack")) step_limit("stack", CU_LIMIT_STACK_SIZE, v * 1024), i++;
        else if (!strcmp(s, "heap")) step_limit("heap", CU_LIMIT_MALLOC_HEAP_SIZE, v * MiB), i++;
        else if (!strcmp(s, "module")) step_module(v, 0), i++;
        else if (!strcmp(s, "library")) step_module(v, 1), i++;
        else if (!strcmp(s, "modfile") && i + 2 < argc) step_modfile(v, argv[i + 2]), i += 2;
        else if (!strcmp(s, "import")) step_import(v), i++;
        else if (!strcmp(s, "fill")) step_fill();
        else if (!strcmp(s, "unload")) step_unload();
        else if (!strcmp(s, "hold")) {
            char line[8];
            printf("held\n");
            fflush(stdout);
            if (!fgets(line, sizeof line, stdin)) return 0;
        } else {
            fprintf(stderr, "unknown step %s\n", s);
            return 2;
        }
    }
    return 0;
}

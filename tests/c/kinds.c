/* Allocates through every other route that takes device memory, printing what the container is charged
 * (free MiB as cuMemGetInfo reports it, and free bytes) after each step, next to what the simulated GPU
 * really holds on GPU 0 (its own ledger, read past the shim). Usage: kinds STEP... where STEP is one of
 * pitch managed async pool vmm array array3d mipmap hostalloc, run in order, each allocating and freeing. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_api.h"
#include "memslice_region.h"

#define MiB (1ull << 20)
/* Free MiB as cuMemGetInfo_v2 reports it (the quota view under the shim). */
static long free_mib(void) { size_t f, t; cuMemGetInfo_v2(&f, &t); return (long)(f / MiB); }
/* Free bytes as cuMemGetInfo_v2 reports them. */
static long long free_b(void) { size_t f, t; cuMemGetInfo_v2(&f, &t); return (long long)f; }

/* The simulated GPU's own figure: device bytes its usage ledger holds on GPU 0 (MEMSLICE_SIM_USAGE, else
 * <MEMSLICE_SIM_STATE>.usage), one pread; -1 without a simulator. The shim never sees this read. */
static long long phys_b(void) {
    char path[512];
    const char *usage = getenv("MEMSLICE_SIM_USAGE"), *state = getenv("MEMSLICE_SIM_STATE");
    if (usage) snprintf(path, sizeof path, "%s", usage);
    else if (state) snprintf(path, sizeof path, "%s.usage", state);
    else return -1;
    uint64_t used = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = pread(fd, &used, sizeof used, (off_t)offsetof(struct ms_region, dev[0].used));
    close(fd);
    return n == (ssize_t)sizeof used ? (long long)(used & ~MS_FROZEN) : -1;
}
#define STEP(name, rc) do { int rc_ = (int)(rc); printf("%s rc=%d free_mib=%ld free_b=%lld phys_b=%lld\n", name, \
                                                      rc_, free_mib(), free_b(), phys_b()); } while (0)

/* Each step allocates and frees through one route, printing the free memory after every call. */
static void step_pitch(void) {
    CUdeviceptr p;
    size_t pitch = 0;
    CUresult rc = cuMemAllocPitch_v2(&p, &pitch, 1000, 100 * 1024, 4); /* 1000 B rows -> 1024 B pitch */
    STEP("pitch_alloc", rc);
    printf("pitch=%zu\n", pitch);
    STEP("pitch_free", cuMemFree_v2(p));
}

/* Managed memory is charged in full. */
static void step_managed(void) {
    CUdeviceptr p;
    STEP("managed_alloc", cuMemAllocManaged(&p, 100 * MiB, CU_MEM_ATTACH_GLOBAL));
    STEP("managed_free", cuMemFree_v2(p));
}

/* A pool keeps freed memory reserved (and charged) until a synchronize. */
static void step_async(void) {
    CUdeviceptr p, q;
    STEP("async_alloc", cuMemAllocAsync(&p, 100 * MiB, NULL));
    STEP("async_free", cuMemFreeAsync(p, NULL));                 /* the pool keeps it reserved */
    STEP("async_realloc", cuMemAllocAsync(&q, 100 * MiB, NULL)); /* served from the pool's cache */
    STEP("async_free2", cuMemFreeAsync(q, NULL));
    STEP("async_sync", cuStreamSynchronize(NULL));               /* the pool gives it back */
}

/* Fill the quota from the pool, free without synchronising: a new allocation must still succeed (the
 * shim trims the pool before refusing). */
static void step_asyncbig(void) {
    CUdeviceptr p[16], q;
    int n = 0;
    CUresult rc = 0;
    while (n < 16 && (rc = cuMemAllocAsync(&p[n], 100 * MiB, NULL)) == CUDA_SUCCESS) n++;
    printf("asyncbig n=%d last_rc=%d free_mib=%ld free_b=%lld phys_b=%lld\n", n, rc, free_mib(), free_b(), phys_b());
    for (int k = 0; k < n; k++) cuMemFreeAsync(p[k], NULL);
    STEP("asyncbig_after", cuMemAllocAsync(&q, 100 * MiB, NULL));
    cuMemFreeAsync(q, NULL);
    STEP("asyncbig_sync", cuStreamSynchronize(NULL));
}

/* An explicit pool: its reservation is charged until the pool is destroyed. */
static void step_pool(void) {
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CUmemoryPool pool;
    CUdeviceptr p;
    STEP("pool_create", cuMemPoolCreate(&pool, &props));
    STEP("pool_alloc", cuMemAllocFromPoolAsync(&p, 64 * MiB, pool, NULL));
    STEP("pool_free", cuMemFreeAsync(p, NULL));
    STEP("pool_destroy", cuMemPoolDestroy(pool));
}

/* VMM memory stays charged while mapped, even after its handle is released. */
static void step_vmm(void) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CUmemGenericAllocationHandle h;
    CUdeviceptr va;
    size_t sz = 64 * MiB;
    STEP("vmm_create", cuMemCreate(&h, sz, &prop, 0));
    cuMemAddressReserve(&va, sz, 0, 0, 0);
    STEP("vmm_map", cuMemMap(va, sz, 0, h, 0));
    CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, 3};
    cuMemSetAccess(va, sz, &acc, 1);
    ((volatile char *)(uintptr_t)va)[123] = 7; /* usable */
    STEP("vmm_release", cuMemRelease(h));       /* still mapped: still charged */
    STEP("vmm_unmap", cuMemUnmap(va, sz));       /* now the driver frees it */
    cuMemAddressFree(va, sz);
}

/* A 2D array, charged from its descriptor. */
static void step_array(void) {
    CUDA_ARRAY_DESCRIPTOR d = {1000, 1000, CU_AD_FORMAT_FLOAT, 4}; /* 16,000,000 B */
    CUarray a;
    STEP("array_create", cuArrayCreate_v2(&a, &d));
    STEP("array_destroy", cuArrayDestroy(a));
}

/* A 3D array, charged from its descriptor. */
static void step_array3d(void) {
    CUDA_ARRAY3D_DESCRIPTOR d = {256, 256, 64, CU_AD_FORMAT_UNSIGNED_INT8, 4, 0}; /* 16 MiB */
    CUarray a;
    STEP("array3d_create", cuArray3DCreate_v2(&a, &d));
    STEP("array3d_destroy", cuArrayDestroy(a));
}

/* A mipmapped array: every level is charged. */
static void step_mipmap(void) {
    CUDA_ARRAY3D_DESCRIPTOR d = {1024, 1024, 0, CU_AD_FORMAT_FLOAT, 4, 0}; /* 16 MiB + 4 + 1 + ... */
    CUmipmappedArray m;
    STEP("mipmap_create", cuMipmappedArrayCreate(&m, &d, 4));
    STEP("mipmap_destroy", cuMipmappedArrayDestroy(m));
}

/* Pinned host memory is not charged to the GPU. */
static void step_hostalloc(void) {
    void *h;
    STEP("host_alloc", cuMemHostAlloc(&h, 100 * MiB, 0)); /* host memory: not charged to the GPU */
    STEP("host_free", cuMemFreeHost(h));
}

static const struct { const char *name; void (*run)(void); } STEPS[] = {
    {"pitch", step_pitch}, {"managed", step_managed}, {"async", step_async}, {"asyncbig", step_asyncbig},
    {"pool", step_pool},   {"vmm", step_vmm},         {"array", step_array}, {"array3d", step_array3d},
    {"mipmap", step_mipmap}, {"hostalloc", step_hostalloc},
};

/* The step called `name`, or NULL. */
static void (*step_named(const char *name))(void) {
    for (size_t i = 0; i < sizeof STEPS / sizeof STEPS[0]; i++)
        if (!strcmp(STEPS[i].name, name)) return STEPS[i].run;
    return NULL;
}

int main(int argc, char **argv) {
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) return 3;
    printf("start free_mib=%ld free_b=%lld phys_b=%lld\n", free_mib(), free_b(), phys_b());
    for (int i = 1; i < argc; i++) {
        void (*run)(void) = step_named(argv[i]);
        if (!run) {
            printf("unknown step %s\n", argv[i]);
            return 2;
        }
        run();
    }
    return 0;
}

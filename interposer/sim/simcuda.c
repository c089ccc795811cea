/* Simulated libcuda.so.1: the CUDA driver API's C ABI, backed by host memory.
 *
 * What it models: devices (from the shared node state), primary and explicit contexts (each process's
 * first context on a GPU takes MEMSLICE_SIM_CONTEXT_OVERHEAD of device memory), device, pitched, managed,
 * stream-ordered (pools with reserved vs used memory), VMM and array allocations, pinned host memory,
 * memcpy/memset, pointer attributes and cuGetProcAddress with the documented version/flag rules.
 * Physical capacity is shared by every process of the simulated node and is never exceeded: an allocation
 * that does not fit returns CUDA_ERROR_OUT_OF_MEMORY, exactly as a full GPU would.
 * Kernels do not exist here: "device memory" is host memory, so copies and memsets are memcpy/memset.
 * Linked with -Bsymbolic so that cuGetProcAddress hands out this library's own functions even when the
 * shim (which defines the same names) is preloaded. */
#define _GNU_SOURCE
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cuda_abi.h"
#include "ms_array.h"
#include "ms_ptrmap.h"
#include "sim_internal.h"
#include "sim_streams_api.h"
#include "simstate.h"

#define API SIM_EXPORT
#define SMALL_ALLOC (1u << 20)     /* below this, malloc; above, an mmap'd range */
#define VMM_GRANULARITY (2u << 20)

enum kind { K_DEVICE = 1, K_MANAGED, K_POOL, K_HOST, K_REGISTERED, K_VMM_RANGE, K_ARRAY, K_MIPMAP };

struct sim_ctx { uint32_t magic; int dev; int primary; };
struct pool_block { uint64_t ptr, size; struct pool_block *next; };
struct sim_pool {
    uint32_t magic; int dev; uint64_t reserved, used, reserved_high, used_high, threshold, max_size;
    struct pool_block *cached;
};
struct sim_vmm { uint32_t magic; int fd; int dev; int host; uint64_t size; int maps; int released;
                 CUmemAllocationProp prop; };
struct sim_array { uint32_t magic; int dev; uint64_t size; void *mem; };

#define CTX_MAGIC 0x43545831u
#define POOL_MAGIC 0x504f4f4cu
#define VMM_MAGIC 0x564d4d31u
#define ARRAY_MAGIC 0x41525259u

static ms_ptrmap g_ptrs;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER; /* contexts, pools, VMM mappings: slow paths */
static int g_initialized;
static struct sim_ctx g_primary[SIM_MAX_GPUS];
static int g_primary_refs[SIM_MAX_GPUS];
static int g_ctx_charged[SIM_MAX_GPUS];
static struct sim_pool g_default_pool[SIM_MAX_GPUS];
static struct sim_pool *g_current_pool[SIM_MAX_GPUS];
static __thread struct sim_ctx *t_ctx;
static pthread_once_t g_map_once = PTHREAD_ONCE_INIT;

static void map_init(void) {
    ms_ptrmap_init(&g_ptrs);
    for (int i = 0; i < SIM_MAX_GPUS; i++) {
        g_primary[i] = (struct sim_ctx){CTX_MAGIC, i, 1};
        g_default_pool[i] = (struct sim_pool){.magic = POOL_MAGIC, .dev = i};
        g_current_pool[i] = &g_default_pool[i];
    }
}

/* The simulator, or NULL with an explanation on stderr (once) if its state cannot be opened. */
static struct sim *S(void) {
    pthread_once(&g_map_once, map_init);
    struct sim *s = sim_get();
    static int warned;
    if (!s && !__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED)) fprintf(stderr, "%s\n", sim_error());
    return s;
}

static int ngpus(void) { struct sim *s = S(); return s ? (int)s->node->ngpus : 0; }
static int valid_dev(CUdevice d) { return d >= 0 && d < ngpus(); }

#define NEED_INIT() do { if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED; } while (0)
#define NEED_CTX() do { NEED_INIT(); if (!t_ctx) return CUDA_ERROR_INVALID_CONTEXT; } while (0)

/* ---- init, versions, devices ---------------------------------------------------------------------- */
API CUresult cuInit(unsigned int flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (!S()) return CUDA_ERROR_NO_DEVICE;
    g_initialized = 1;
    return CUDA_SUCCESS;
}

API CUresult cuDriverGetVersion(int *v) {
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    struct sim *s = S();
    *v = s ? s->driver_version : SIM_DRIVER_VERSION_DEFAULT;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetCount(int *n) { NEED_INIT(); if (!n) return CUDA_ERROR_INVALID_VALUE; *n = ngpus(); return 0; }

API CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    NEED_INIT();
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    NEED_INIT();
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    memset(name, 0, (size_t)len); /* the driver zero-fills the buffer: no stale bytes after the NUL */
    strncpy(name, S()->node->gpu[d].name, (size_t)len - 1);
    return CUDA_SUCCESS;
}

/* UUID bytes, parsed back from the "GPU-..." text the NVML side reports, so both always agree. */
static void uuid_bytes(int d, CUuuid *u) {
    const char *t = S()->node->gpu[d].uuid + 4;
    for (int i = 0; i < 16 && *t; i++) {
        if (*t == '-') t++;
        unsigned v = 0;
        sscanf(t, "%2x", &v);
        u->bytes[i] = (char)v;
        t += 2;
    }
}

API CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) {
    NEED_INIT();
    if (!u) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    uuid_bytes(d, u);
    return CUDA_SUCCESS;
}
API CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) { return cuDeviceGetUuid(u, d); }

API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
    NEED_INIT();
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = S()->node->gpu[d].total;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice d) {
    size_t b;
    CUresult rc = cuDeviceTotalMem_v2(&b, d);
    if (rc == CUDA_SUCCESS) *bytes = b > UINT_MAX ? UINT_MAX : (unsigned int)b;
    return rc;
}

API CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
    NEED_INIT();
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    switch (attr) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *v = 32; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *v = (int)S()->node->gpu[d].pci_bus; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: *v = 0; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; break;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *v = 1; break;
    default: *v = 0; break;
    }
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetPCIBusId(char *buf, int len, CUdevice d) {
    NEED_INIT();
    if (!buf || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(buf, (size_t)len, "%08X:%02X:%02X.0", 0u, S()->node->gpu[d].pci_bus, 0u);
    return CUDA_SUCCESS;
}

/* ---- contexts ----------------------------------------------------------------------------------- */
/* A process's first context on a GPU takes device memory, as on real hardware. */
static CUresult charge_context(int dev) {
    struct sim *s = S();
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&g_mu);
    if (!g_ctx_charged[dev]) {
        if (s->context_overhead && sim_charge(s, dev, s->context_overhead, 0) < 0) rc = CUDA_ERROR_OUT_OF_MEMORY;
        else g_ctx_charged[dev] = 1;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice d) {
    NEED_INIT();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    CUresult rc = charge_context(d);
    if (rc) return rc;
    __atomic_fetch_add(&g_primary_refs[d], 1, __ATOMIC_SEQ_CST);
    *pctx = (CUcontext)&g_primary[d];
    return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    NEED_INIT();
    if (!valid_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    if (__atomic_load_n(&g_primary_refs[d], __ATOMIC_SEQ_CST) > 0)
        __atomic_fetch_sub(&g_primary_refs[d], 1, __ATOMIC_SEQ_CST);
    return CUDA_SUCCESS;
}
API CUresult cuDevicePrimaryCtxRelease(CUdevice d) { return cuDevicePrimaryCtxRelease_v2(d); }
API CUresult cuDevicePrimaryCtxReset_v2(CUdevice d) { NEED_INIT(); return valid_dev(d) ? 0 : CUDA_ERROR_INVALID_DEVICE; }
API CUresult cuDevicePrimaryCtxReset(CUdevice d) { return cuDevicePrimaryCtxReset_v2(d); }
API CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice d, unsigned int f) { (void)f; return cuDevicePrimaryCtxReset_v2(d); }
API CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned int *flags, int *active) {
    NEED_INIT();
    if (!valid_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    if (flags) *flags = 0;
    if (active) *active = __atomic_load_n(&g_primary_refs[d], __ATOMIC_SEQ_CST) > 0;
    return CUDA_SUCCESS;
}

static CUresult ctx_create(CUcontext *pctx, CUdevice d) {
    NEED_INIT();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    CUresult rc = charge_context(d);
    if (rc) return rc;
    struct sim_ctx *c = calloc(1, sizeof *c);
    if (!c) return CUDA_ERROR_OUT_OF_MEMORY;
    *c = (struct sim_ctx){CTX_MAGIC, d, 0};
    t_ctx = c;
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}
API CUresult cuCtxCreate(CUcontext *p, unsigned int flags, CUdevice d) { (void)flags; return ctx_create(p, d); }
API CUresult cuCtxCreate_v2(CUcontext *p, unsigned int flags, CUdevice d) { (void)flags; return ctx_create(p, d); }
API CUresult cuCtxCreate_v3(CUcontext *p, void *params, int n, unsigned int flags, CUdevice d) {
    (void)params; (void)n; (void)flags; return ctx_create(p, d);
}
API CUresult cuCtxCreate_v4(CUcontext *p, void *params, unsigned int flags, CUdevice d) {
    (void)params; (void)flags; return ctx_create(p, d);
}

static struct sim_ctx *as_ctx(CUcontext c) {
    struct sim_ctx *x = (struct sim_ctx *)c;
    return x && x->magic == CTX_MAGIC ? x : NULL;
}

API CUresult cuCtxDestroy_v2(CUcontext c) {
    NEED_INIT();
    struct sim_ctx *x = as_ctx(c);
    if (!x || x->primary) return CUDA_ERROR_INVALID_CONTEXT;
    if (t_ctx == x) t_ctx = NULL;
    x->magic = 0;
    free(x);
    return CUDA_SUCCESS;
}
API CUresult cuCtxDestroy(CUcontext c) { return cuCtxDestroy_v2(c); }

API CUresult cuCtxSetCurrent(CUcontext c) {
    NEED_INIT();
    if (c && !as_ctx(c)) return CUDA_ERROR_INVALID_CONTEXT;
    t_ctx = as_ctx(c);
    return CUDA_SUCCESS;
}
API CUresult cuCtxGetCurrent(CUcontext *c) { NEED_INIT(); if (!c) return CUDA_ERROR_INVALID_VALUE; *c = (CUcontext)t_ctx; return 0; }
API CUresult cuCtxPushCurrent_v2(CUcontext c) { return cuCtxSetCurrent(c); }
API CUresult cuCtxPushCurrent(CUcontext c) { return cuCtxSetCurrent(c); }
API CUresult cuCtxPopCurrent_v2(CUcontext *c) { NEED_INIT(); if (c) *c = (CUcontext)t_ctx; t_ctx = NULL; return 0; }
API CUresult cuCtxPopCurrent(CUcontext *c) { return cuCtxPopCurrent_v2(c); }
API CUresult cuCtxGetDevice(CUdevice *d) { NEED_CTX(); if (!d) return CUDA_ERROR_INVALID_VALUE; *d = t_ctx->dev; return 0; }
API CUresult cuCtxGetDevice_v2(CUdevice *d, CUcontext c) {
    NEED_INIT();
    struct sim_ctx *x = c ? as_ctx(c) : t_ctx;
    if (!x) return CUDA_ERROR_INVALID_CONTEXT;
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    *d = x->dev;
    return CUDA_SUCCESS;
}

/* ---- physical accounting helpers ------------------------------------------------------------------ */
static void *backing_alloc(uint64_t n) {
    if (n == 0) n = 1;
    if (n < SMALL_ALLOC) {
        void *p = NULL;
        return posix_memalign(&p, 256, (n + 255) & ~255ull) == 0 ? p : NULL;
    }
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void backing_free(void *p, uint64_t n) {
    if (n == 0) n = 1;
    if (n < SMALL_ALLOC) free(p);
    else { sim_ipc_release((uint64_t)(uintptr_t)p); munmap(p, n); }
}

/* Allocate n bytes of simulated memory on dev (host=1: host-resident), recorded under `kind`. */
static CUresult sim_alloc(CUdeviceptr *dptr, uint64_t n, int dev, int kind, int host, uint64_t aux) {
    struct sim *s = S();
    if (sim_charge(s, dev, n, host) < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    void *p = backing_alloc(n);
    if (!p) {
        sim_uncharge(s, dev, n, host);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    ms_rec r = {.key = (uint64_t)(uintptr_t)p, .size = n, .aux = aux, .dev = dev, .kind = (uint32_t)kind};
    r.aux |= (uint64_t)host << 63;
    if (ms_ptrmap_put(&g_ptrs, &r) < 0) {
        backing_free(p, n);
        sim_uncharge(s, dev, n, host);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *dptr = r.key;
    return CUDA_SUCCESS;
}

static int rec_host(const ms_rec *r) { return (int)(r->aux >> 63); }

static void sim_release(const ms_rec *r) {
    backing_free((void *)(uintptr_t)r->key, r->size);
    sim_uncharge(S(), r->dev, r->size, rec_host(r));
}

/* ---- device allocations ---------------------------------------------------------------------------- */
API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t n) {
    NEED_CTX();
    if (!dptr || n == 0) return CUDA_ERROR_INVALID_VALUE;
    return sim_alloc(dptr, n, t_ctx->dev, K_DEVICE, 0, 0);
}

/* v1: 32-bit pointers. Served from the low 4 GiB (MAP_32BIT) so the address fits, as old drivers did. */
API CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int n) {
    NEED_CTX();
    if (!dptr || n == 0) return CUDA_ERROR_INVALID_VALUE;
#ifdef MAP_32BIT
    struct sim *s = S();
    int dev = t_ctx->dev;
    if (sim_charge(s, dev, n, 0) < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_32BIT, -1, 0);
    if (p == MAP_FAILED) { sim_uncharge(s, dev, n, 0); return CUDA_ERROR_OUT_OF_MEMORY; }
    ms_rec r = {.key = (uint64_t)(uintptr_t)p, .size = n, .dev = dev, .kind = K_DEVICE, .aux = 1};
    ms_ptrmap_put(&g_ptrs, &r);
    *dptr = (CUdeviceptr_v1)(uintptr_t)p;
    return CUDA_SUCCESS;
#else
    return CUDA_ERROR_NOT_SUPPORTED;
#endif
}

API CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t w, size_t h, unsigned int elem) {
    NEED_CTX();
    if (!dptr || !pitch || w == 0 || h == 0 || (elem != 4 && elem != 8 && elem != 16)) return CUDA_ERROR_INVALID_VALUE;
    size_t p = (w + 511) & ~(size_t)511; /* rows padded to 512 bytes, like the real driver's pitch */
    CUresult rc = sim_alloc(dptr, (uint64_t)p * h, t_ctx->dev, K_DEVICE, 0, 0);
    if (rc == CUDA_SUCCESS) *pitch = p;
    return rc;
}

API CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int w, unsigned int h,
                             unsigned int elem) {
    NEED_CTX();
    if (!dptr || !pitch) return CUDA_ERROR_INVALID_VALUE;
    unsigned int p = (w + 511) & ~511u;
    CUdeviceptr_v1 d;
    CUresult rc = cuMemAlloc(&d, p * h);
    (void)elem;
    if (rc == CUDA_SUCCESS) { *dptr = d; *pitch = p; }
    return rc;
}

static CUresult free_ptr(uint64_t ptr) {
    if (ptr == 0) return CUDA_SUCCESS;
    ms_rec r;
    if (!ms_ptrmap_get(&g_ptrs, ptr, &r)) return CUDA_ERROR_INVALID_VALUE;
    if (r.kind != K_DEVICE && r.kind != K_MANAGED && r.kind != K_POOL) return CUDA_ERROR_INVALID_VALUE;
    if (r.kind == K_POOL) return CUDA_ERROR_INVALID_VALUE; /* stream-ordered memory: cuMemFreeAsync */
    ms_ptrmap_take(&g_ptrs, ptr, &r);
    if (r.kind == K_DEVICE && r.aux == 1) { /* v1 low mapping */
        munmap((void *)(uintptr_t)r.key, r.size);
        sim_uncharge(S(), r.dev, r.size, 0);
        return CUDA_SUCCESS;
    }
    sim_release(&r);
    return CUDA_SUCCESS;
}

API CUresult cuMemFree_v2(CUdeviceptr p) { NEED_INIT(); return free_ptr(p); }
API CUresult cuMemFree(CUdeviceptr_v1 p) { NEED_INIT(); return free_ptr(p); }

/* Residency model for managed memory. A real driver populates managed pages where they are first touched
 * and migrates them on access; the simulator runs no kernels, so a managed range is host-resident from
 * allocation and becomes device-resident when it is prefetched to a GPU or advised to prefer one, and
 * host-resident again when prefetched or advised to the CPU. Device- and host-resident bytes are counted
 * separately in the node's ledger. */
API CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t n, unsigned int flags) {
    NEED_CTX();
    if (!dptr || n == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)) return CUDA_ERROR_INVALID_VALUE;
    return sim_alloc(dptr, n, t_ctx->dev, K_MANAGED, 1, 0);
}

/* Move a managed range's residency (the whole allocation: the simulator does not split ranges). */
static CUresult migrate(CUdeviceptr p, size_t n, int to_host) {
    ms_rec r;
    if (!ms_ptrmap_find_range(&g_ptrs, p, &r) || r.kind != K_MANAGED || n > r.size) return CUDA_ERROR_INVALID_VALUE;
    if (to_host == rec_host(&r)) return CUDA_SUCCESS;
    struct sim *s = S();
    if (sim_charge(s, r.dev, r.size, to_host) < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    sim_uncharge(s, r.dev, r.size, !to_host);
    ms_ptrmap_take(&g_ptrs, r.key, &r);
    r.aux = (r.aux & ~(1ull << 63)) | ((uint64_t)to_host << 63);
    ms_ptrmap_put(&g_ptrs, &r);
    return CUDA_SUCCESS;
}

/* cuMemAdvise: SET_PREFERRED_LOCATION (3) moves residency to that location; other advice (including
 * ACCESSED_BY, which maps without migrating) is accepted and leaves residency alone. */
static CUresult advise(CUdeviceptr p, size_t n, int advice, int to_host, int to_device) {
    NEED_INIT();
    ms_rec r;
    if (!ms_ptrmap_find_range(&g_ptrs, p, &r) || r.kind != K_MANAGED || n > r.size) return CUDA_ERROR_INVALID_VALUE;
    if (advice != 3) return CUDA_SUCCESS;
    if (!to_host && !to_device) return CUDA_ERROR_INVALID_VALUE;
    return migrate(p, n, to_host);
}
API CUresult cuMemAdvise(CUdeviceptr p, size_t n, int advice, CUdevice dev) {
    return advise(p, n, advice, dev == -1, dev >= 0);
}
static int host_loc(CUmemLocation loc) {
    return loc.type == CU_MEM_LOCATION_TYPE_HOST || loc.type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
           loc.type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
}
API CUresult cuMemAdvise_v2(CUdeviceptr p, size_t n, int advice, CUmemLocation loc) {
    return advise(p, n, advice, host_loc(loc), loc.type == CU_MEM_LOCATION_TYPE_DEVICE);
}

/* Prefetch migrates: to a device (dstDevice >= 0) or to the CPU (CU_DEVICE_CPU = -1). */
API CUresult cuMemPrefetchAsync(CUdeviceptr p, size_t n, CUdevice dst, CUstream s) {
    NEED_INIT();
    (void)s;
    if (dst != -1 && !valid_dev(dst)) return CUDA_ERROR_INVALID_DEVICE;
    return migrate(p, n, dst == -1);
}
API CUresult cuMemPrefetchAsync_ptsz(CUdeviceptr p, size_t n, CUdevice dst, CUstream s) {
    return cuMemPrefetchAsync(p, n, dst, s);
}
API CUresult cuMemPrefetchAsync_v2(CUdeviceptr p, size_t n, CUmemLocation loc, unsigned int flags, CUstream s) {
    NEED_INIT();
    (void)s;
    if (flags) return CUDA_ERROR_INVALID_VALUE;
    if (loc.type == CU_MEM_LOCATION_TYPE_DEVICE && !valid_dev(loc.id)) return CUDA_ERROR_INVALID_DEVICE;
    return migrate(p, n, host_loc(loc));
}
API CUresult cuMemPrefetchAsync_v2_ptsz(CUdeviceptr p, size_t n, CUmemLocation loc, unsigned int flags, CUstream s) {
    return cuMemPrefetchAsync_v2(p, n, loc, flags, s);
}

/* ---- host memory ------------------------------------------------------------------------------------ */
API CUresult cuMemHostAlloc(void **pp, size_t n, unsigned int flags) {
    NEED_CTX();
    if (!pp || n == 0 || flags > 7) return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr d;
    CUresult rc = sim_alloc(&d, n, t_ctx->dev, K_HOST, 1, flags);
    if (rc == CUDA_SUCCESS) *pp = (void *)(uintptr_t)d;
    return rc;
}
API CUresult cuMemAllocHost_v2(void **pp, size_t n) { return cuMemHostAlloc(pp, n, 0); }
API CUresult cuMemAllocHost(void **pp, unsigned int n) { return cuMemHostAlloc(pp, n, 0); }

API CUresult cuMemFreeHost(void *p) {
    NEED_INIT();
    ms_rec r;
    if (!ms_ptrmap_get(&g_ptrs, (uint64_t)(uintptr_t)p, &r) || r.kind != K_HOST) return CUDA_ERROR_INVALID_VALUE;
    ms_ptrmap_take(&g_ptrs, r.key, &r);
    sim_release(&r);
    return CUDA_SUCCESS;
}

API CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned int flags) {
    NEED_INIT();
    ms_rec r;
    if (!d || flags != 0 || !ms_ptrmap_find_range(&g_ptrs, (uint64_t)(uintptr_t)p, &r) ||
        (r.kind != K_HOST && r.kind != K_REGISTERED))
        return CUDA_ERROR_INVALID_VALUE;
    *d = (CUdeviceptr)(uintptr_t)p; /* unified addressing: the same address */
    return CUDA_SUCCESS;
}
API CUresult cuMemHostGetDevicePointer(CUdeviceptr_v1 *d, void *p, unsigned int flags) {
    CUdeviceptr x;
    CUresult rc = cuMemHostGetDevicePointer_v2(&x, p, flags);
    if (rc == CUDA_SUCCESS) *d = (CUdeviceptr_v1)x;
    return rc;
}

API CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned int flags) {
    NEED_CTX();
    (void)flags;
    if (!p || n == 0) return CUDA_ERROR_INVALID_VALUE;
    ms_rec r = {.key = (uint64_t)(uintptr_t)p, .size = n, .dev = t_ctx->dev, .kind = K_REGISTERED};
    return ms_ptrmap_put(&g_ptrs, &r) ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
}
API CUresult cuMemHostRegister(void *p, size_t n, unsigned int flags) { return cuMemHostRegister_v2(p, n, flags); }
API CUresult cuMemHostUnregister(void *p) {
    NEED_INIT();
    ms_rec r;
    if (!ms_ptrmap_get(&g_ptrs, (uint64_t)(uintptr_t)p, &r) || r.kind != K_REGISTERED) return CUDA_ERROR_INVALID_VALUE;
    ms_ptrmap_take(&g_ptrs, r.key, &r);
    return CUDA_SUCCESS;
}

/* ---- memory info ------------------------------------------------------------------------------------ */
API CUresult cuMemGetInfo_v2(size_t *freeb, size_t *total) {
    NEED_CTX();
    if (!freeb || !total) return CUDA_ERROR_INVALID_VALUE;
    struct sim *s = S();
    uint64_t cap = s->node->gpu[t_ctx->dev].total;
    uint64_t used = sim_used(s, t_ctx->dev);
    *total = cap;
    *freeb = used < cap ? cap - used : 0;
    return CUDA_SUCCESS;
}
API CUresult cuMemGetInfo(unsigned int *freeb, unsigned int *total) {
    size_t f, t;
    CUresult rc = cuMemGetInfo_v2(&f, &t);
    if (rc == CUDA_SUCCESS) {
        *freeb = f > UINT_MAX ? UINT_MAX : (unsigned int)f;
        *total = t > UINT_MAX ? UINT_MAX : (unsigned int)t;
    }
    return rc;
}

/* ---- copies and sets (all memory is host memory here) -------------------------------------------- */
API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    NEED_INIT();
    if ((!dst || !src) && n) return CUDA_ERROR_INVALID_VALUE;
    if (n) memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}
API CUresult cuMemcpy_ptds(CUdeviceptr d, CUdeviceptr s, size_t n) { return cuMemcpy(d, s, n); }
API CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *h, size_t n) { return cuMemcpy(d, (CUdeviceptr)(uintptr_t)h, n); }
API CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr d, const void *h, size_t n) { return cuMemcpyHtoD_v2(d, h, n); }
API CUresult cuMemcpyDtoH_v2(void *h, CUdeviceptr d, size_t n) { return cuMemcpy((CUdeviceptr)(uintptr_t)h, d, n); }
API CUresult cuMemcpyDtoH_v2_ptds(void *h, CUdeviceptr d, size_t n) { return cuMemcpyDtoH_v2(h, d, n); }
API CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) { return cuMemcpy(d, s, n); }
API CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { (void)st; return cuMemcpy(d, s, n); }
API CUresult cuMemcpyAsync_ptsz(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { return cuMemcpyAsync(d, s, n, st); }
API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t n, CUstream st) { (void)st; return cuMemcpyHtoD_v2(d, h, n); }
API CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t n, CUstream st) { (void)st; return cuMemcpyDtoH_v2(h, d, n); }
API CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) {
    NEED_INIT();
    if (!d && n) return CUDA_ERROR_INVALID_VALUE;
    memset((void *)(uintptr_t)d, v, n);
    return CUDA_SUCCESS;
}
API CUresult cuMemsetD8_v2_ptds(CUdeviceptr d, unsigned char v, size_t n) { return cuMemsetD8_v2(d, v, n); }
API CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned int v, size_t n) {
    NEED_INIT();
    if (!d && n) return CUDA_ERROR_INVALID_VALUE;
    unsigned int *p = (unsigned int *)(uintptr_t)d;
    for (size_t i = 0; i < n; i++) p[i] = v;
    return CUDA_SUCCESS;
}

/* ---- pointer attributes ------------------------------------------------------------------------------ */
API CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
    NEED_INIT();
    ms_rec r;
    if (!ms_ptrmap_find_range(&g_ptrs, p, &r) || r.kind == K_REGISTERED || r.kind == K_HOST) return CUDA_ERROR_NOT_FOUND;
    if (base) *base = r.key;
    if (size) *size = r.size;
    return CUDA_SUCCESS;
}

API CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p) {
    NEED_INIT();
    ms_rec r;
    if (!data) return CUDA_ERROR_INVALID_VALUE;
    if (!ms_ptrmap_find_range(&g_ptrs, p, &r)) return CUDA_ERROR_INVALID_VALUE;
    int host = r.kind == K_HOST || r.kind == K_REGISTERED;
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned int *)data = host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE; break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(int *)data = r.kind == K_MANAGED; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = r.dev; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)data = p; break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (!host && r.kind != K_MANAGED) return CUDA_ERROR_INVALID_VALUE;
        *(void **)data = (void *)(uintptr_t)p;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = r.key; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = r.size; break;
    case CU_POINTER_ATTRIBUTE_MAPPED: *(int *)data = 1; break;
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = (CUcontext)&g_primary[r.dev]; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

API CUresult cuPointerGetAttributes(unsigned int n, int *attrs, void **data, CUdeviceptr p) {
    for (unsigned int i = 0; i < n; i++) {
        CUresult rc = cuPointerGetAttribute(data[i], attrs[i], p);
        if (rc) return rc;
    }
    return CUDA_SUCCESS;
}

/* ---- streams --------------------------------------------------------------------------------------- */
/* Stream objects live in sim_streams.c (creation, priorities, queries); capture state is kept here. */
static struct sim_stream *as_stream(CUstream s) { return sim_stream_of(s); }
API CUresult cuStreamBeginCapture_v2(CUstream s, int mode) {
    NEED_INIT(); (void)mode;
    struct sim_stream *x = as_stream(s);
    if (!x) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    x->capturing = 1;
    return CUDA_SUCCESS;
}
API CUresult cuStreamEndCapture(CUstream s, void **graph) {
    NEED_INIT();
    struct sim_stream *x = as_stream(s);
    if (!x || !x->capturing) return CUDA_ERROR_INVALID_VALUE;
    x->capturing = 0;
    if (graph) *graph = NULL;
    return CUDA_SUCCESS;
}
API CUresult cuStreamIsCapturing(CUstream s, int *status) {
    NEED_INIT();
    if (!status) return CUDA_ERROR_INVALID_VALUE;
    struct sim_stream *x = as_stream(s);
    *status = x ? x->capturing : 0;
    return CUDA_SUCCESS;
}
API CUresult cuStreamIsCapturing_ptsz(CUstream s, int *status) { return cuStreamIsCapturing(s, status); }

static void trim_pool(struct sim_pool *p, uint64_t keep);
static void trim_all_pools(void) {
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < SIM_MAX_GPUS; i++) trim_pool(&g_default_pool[i], g_default_pool[i].threshold);
    for (int i = 0; i < SIM_MAX_GPUS; i++)
        if (g_current_pool[i] != &g_default_pool[i]) trim_pool(g_current_pool[i], g_current_pool[i]->threshold);
    pthread_mutex_unlock(&g_mu);
}
/* Synchronising is when a real pool gives memory above its release threshold back to the device. */
API CUresult cuStreamSynchronize(CUstream s) { NEED_INIT(); (void)s; trim_all_pools(); return CUDA_SUCCESS; }
API CUresult cuStreamSynchronize_ptsz(CUstream s) { return cuStreamSynchronize(s); }
API CUresult cuCtxSynchronize(void) { NEED_INIT(); trim_all_pools(); return CUDA_SUCCESS; }

/* ---- stream-ordered allocation (memory pools) ---------------------------------------------------- */
static struct sim_pool *as_pool(CUmemoryPool p) {
    struct sim_pool *x = (struct sim_pool *)p;
    return x && x->magic == POOL_MAGIC ? x : NULL;
}

/* Give cached (freed) blocks back to the device until the pool reserves at most `keep` bytes. */
static void trim_pool(struct sim_pool *p, uint64_t keep) {
    struct pool_block **pb = &p->cached;
    while (*pb && p->reserved > keep) {
        struct pool_block *b = *pb;
        *pb = b->next;
        ms_rec r = {.key = b->ptr, .size = b->size, .dev = p->dev};
        sim_release(&r);
        p->reserved -= b->size;
        free(b);
    }
}

static CUresult pool_alloc(CUdeviceptr *dptr, size_t n, struct sim_pool *p) {
    NEED_CTX();
    if (!dptr || n == 0 || !p) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&g_mu);
    struct pool_block **pb = &p->cached, *hit = NULL;
    for (; *pb; pb = &(*pb)->next)
        if ((*pb)->size == n) { hit = *pb; *pb = hit->next; break; }
    if (hit) {
        *dptr = hit->ptr;
        free(hit);
    } else if (p->max_size && p->reserved + n > p->max_size) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        struct sim *s = S();
        void *mem = NULL;
        if (sim_charge(s, p->dev, n, 0) < 0) {
            trim_pool(p, 0); /* a real pool frees its cache before failing */
            if (sim_charge(s, p->dev, n, 0) < 0) rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
        if (rc == CUDA_SUCCESS && !(mem = backing_alloc(n))) {
            sim_uncharge(s, p->dev, n, 0);
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
        if (rc == CUDA_SUCCESS) {
            p->reserved += n;
            if (p->reserved > p->reserved_high) p->reserved_high = p->reserved;
            *dptr = (CUdeviceptr)(uintptr_t)mem;
        }
    }
    if (rc == CUDA_SUCCESS) {
        ms_rec r = {.key = *dptr, .size = n, .dev = p->dev, .kind = K_POOL, .aux = (uint64_t)(uintptr_t)p};
        ms_ptrmap_put(&g_ptrs, &r);
        p->used += n;
        if (p->used > p->used_high) p->used_high = p->used;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

API CUresult cuMemAllocAsync(CUdeviceptr *d, size_t n, CUstream s) {
    NEED_CTX();
    (void)s;
    return pool_alloc(d, n, g_current_pool[t_ctx->dev]);
}
API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *d, size_t n, CUstream s) { return cuMemAllocAsync(d, n, s); }
API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *d, size_t n, CUmemoryPool pool, CUstream s) {
    (void)s;
    if (!as_pool(pool)) return CUDA_ERROR_INVALID_VALUE;
    return pool_alloc(d, n, as_pool(pool));
}
API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *d, size_t n, CUmemoryPool pool, CUstream s) {
    return cuMemAllocFromPoolAsync(d, n, pool, s);
}

API CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream s) {
    NEED_INIT();
    (void)s;
    ms_rec r;
    if (!ms_ptrmap_get(&g_ptrs, ptr, &r)) return CUDA_ERROR_INVALID_VALUE;
    if (r.kind == K_MANAGED) return CUDA_ERROR_INVALID_VALUE; /* documented: not for managed memory */
    if (r.kind == K_DEVICE) return free_ptr(ptr);            /* allowed for cuMemAlloc memory */
    if (r.kind != K_POOL) return CUDA_ERROR_INVALID_VALUE;
    ms_ptrmap_take(&g_ptrs, ptr, &r);
    struct sim_pool *p = (struct sim_pool *)(uintptr_t)r.aux;
    struct pool_block *b = malloc(sizeof *b);
    pthread_mutex_lock(&g_mu);
    p->used -= r.size;
    if (b) {
        *b = (struct pool_block){r.key, r.size, p->cached};
        p->cached = b; /* stays reserved until a synchronize trims the pool */
    } else {
        sim_release(&r);
        p->reserved -= r.size;
    }
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}
API CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { return cuMemFreeAsync(p, s); }

API CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    NEED_INIT();
    if (!pool || !props || props->location.type != CU_MEM_LOCATION_TYPE_DEVICE || !valid_dev(props->location.id))
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_pool *p = calloc(1, sizeof *p);
    if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
    *p = (struct sim_pool){.magic = POOL_MAGIC, .dev = props->location.id, .max_size = props->maxSize};
    *pool = (CUmemoryPool)p;
    return CUDA_SUCCESS;
}
API CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    NEED_INIT();
    struct sim_pool *p = as_pool(pool);
    if (!p || p == &g_default_pool[p->dev]) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    trim_pool(p, 0);
    if (g_current_pool[p->dev] == p) g_current_pool[p->dev] = &g_default_pool[p->dev];
    p->magic = 0;
    pthread_mutex_unlock(&g_mu);
    free(p);
    return CUDA_SUCCESS;
}
API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice d) {
    NEED_INIT();
    if (!pool || !valid_dev(d)) return CUDA_ERROR_INVALID_VALUE;
    *pool = (CUmemoryPool)&g_default_pool[d];
    return CUDA_SUCCESS;
}
API CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice d) {
    NEED_INIT();
    if (!pool || !valid_dev(d)) return CUDA_ERROR_INVALID_VALUE;
    *pool = (CUmemoryPool)g_current_pool[d];
    return CUDA_SUCCESS;
}
API CUresult cuDeviceSetMemPool(CUdevice d, CUmemoryPool pool) {
    NEED_INIT();
    struct sim_pool *p = as_pool(pool);
    if (!p || !valid_dev(d) || p->dev != d) return CUDA_ERROR_INVALID_VALUE;
    g_current_pool[d] = p;
    return CUDA_SUCCESS;
}
API CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
    NEED_INIT();
    struct sim_pool *p = as_pool(pool);
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    trim_pool(p, keep);
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}
API CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute a, void *v) {
    NEED_INIT();
    struct sim_pool *p = as_pool(pool);
    if (!p || !v) return CUDA_ERROR_INVALID_VALUE;
    if (a == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) p->threshold = *(cuuint64_t *)v;
    else if (a == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) p->reserved_high = p->reserved;
    else if (a == CU_MEMPOOL_ATTR_USED_MEM_HIGH) p->used_high = p->used;
    else if (a < 1 || a > 8) return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}
API CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute a, void *v) {
    NEED_INIT();
    struct sim_pool *p = as_pool(pool);
    if (!p || !v) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    cuuint64_t x = 0;
    switch (a) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: x = p->threshold; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: x = p->reserved; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: x = p->reserved_high; break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: x = p->used; break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: x = p->used_high; break;
    default: *(int *)v = 1; pthread_mutex_unlock(&g_mu); return CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_mu);
    *(cuuint64_t *)v = x;
    return CUDA_SUCCESS;
}

/* ---- virtual memory management --------------------------------------------------------------------- */
static struct sim_vmm *as_vmm(CUmemGenericAllocationHandle h) {
    struct sim_vmm *x = (struct sim_vmm *)(uintptr_t)h;
    return x && x->magic == VMM_MAGIC ? x : NULL;
}

API CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, int option) {
    NEED_INIT();
    (void)option;
    if (!g || !prop) return CUDA_ERROR_INVALID_VALUE;
    *g = VMM_GRANULARITY;
    return CUDA_SUCCESS;
}

API CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                         unsigned long long flags) {
    NEED_INIT();
    if (!h || !prop || flags || size == 0 || size % VMM_GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
    int host = prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE;
    int dev = host ? (t_ctx ? t_ctx->dev : 0) : prop->location.id;
    if (!valid_dev(dev) || prop->location.type == CU_MEM_LOCATION_TYPE_INVALID) return CUDA_ERROR_INVALID_VALUE;
    if (host && prop->requestedHandleTypes) return CUDA_ERROR_INVALID_VALUE; /* documented for HOST */
    struct sim *s = S();
    if (sim_charge(s, dev, size, host) < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    int fd = memfd_create("memslice-sim-vmm", MFD_CLOEXEC);
    struct sim_vmm *v = calloc(1, sizeof *v);
    if (fd < 0 || !v || ftruncate(fd, (off_t)size) < 0) {
        if (fd >= 0) close(fd);
        free(v);
        sim_uncharge(s, dev, size, host);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *v = (struct sim_vmm){.magic = VMM_MAGIC, .fd = fd, .dev = dev, .host = host, .size = size, .prop = *prop};
    *h = (CUmemGenericAllocationHandle)(uintptr_t)v;
    return CUDA_SUCCESS;
}

static void vmm_maybe_free(struct sim_vmm *v) {
    if (!v->released || v->maps > 0) return;
    close(v->fd);
    sim_uncharge(S(), v->dev, v->size, v->host);
    v->magic = 0;
    free(v);
}

/* Memory is given back when the handle is released and no mapping refers to it any more. */
API CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    struct sim_vmm *v = as_vmm(h);
    if (!v || v->released) { pthread_mutex_unlock(&g_mu); return CUDA_ERROR_INVALID_VALUE; }
    v->released = 1;
    vmm_maybe_free(v);
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

API CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle h) {
    NEED_INIT();
    struct sim_vmm *v = as_vmm(h);
    if (!v || !prop) return CUDA_ERROR_INVALID_VALUE;
    *prop = v->prop;
    return CUDA_SUCCESS;
}

API CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr,
                                 unsigned long long flags) {
    NEED_INIT();
    (void)addr;
    if (!ptr || size == 0 || flags || size % VMM_GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
    size_t a = align > VMM_GRANULARITY ? align : VMM_GRANULARITY;
    char *m = mmap(NULL, size + a, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t base = ((uintptr_t)m + a - 1) & ~(uintptr_t)(a - 1);
    if (base > (uintptr_t)m) munmap(m, base - (uintptr_t)m);
    uintptr_t end = (uintptr_t)m + size + a;
    if (end > base + size) munmap((void *)(base + size), end - (base + size));
    ms_rec r = {.key = base, .size = size, .kind = K_VMM_RANGE};
    ms_ptrmap_put(&g_ptrs, &r);
    *ptr = base;
    return CUDA_SUCCESS;
}

API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    NEED_INIT();
    ms_rec r;
    if (!ms_ptrmap_get(&g_ptrs, ptr, &r) || r.kind != K_VMM_RANGE || r.size != size) return CUDA_ERROR_INVALID_VALUE;
    ms_ptrmap_take(&g_ptrs, ptr, &r);
    munmap((void *)(uintptr_t)ptr, size);
    return CUDA_SUCCESS;
}

/* Mappings are kept in a small list: (address, size) -> handle, so cuMemUnmap finds what it unmaps. */
struct mapping { uint64_t ptr, size; struct sim_vmm *v; struct mapping *next; };
static struct mapping *g_maps;

API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                      unsigned long long flags) {
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    struct sim_vmm *v = as_vmm(h);
    CUresult rc = CUDA_SUCCESS;
    struct mapping *m = malloc(sizeof *m);
    if (!v || v->released || flags || !m || offset + size > v->size || size % VMM_GRANULARITY) rc = CUDA_ERROR_INVALID_VALUE;
    else if (mmap((void *)(uintptr_t)ptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, v->fd, (off_t)offset) ==
             MAP_FAILED) rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        *m = (struct mapping){ptr, size, v, g_maps};
        g_maps = m;
        v->maps++;
    } else {
        free(m);
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    struct mapping **pm = &g_maps;
    while (*pm && !((*pm)->ptr == ptr && (*pm)->size == size)) pm = &(*pm)->next;
    if (!*pm) { pthread_mutex_unlock(&g_mu); return CUDA_ERROR_INVALID_VALUE; }
    struct mapping *m = *pm;
    *pm = m->next;
    mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    m->v->maps--;
    vmm_maybe_free(m->v);
    free(m);
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
    NEED_INIT();
    (void)ptr; (void)size;
    if (!desc || count == 0) return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* ---- arrays ---------------------------------------------------------------------------------------- */
typedef struct { size_t size; size_t alignment; unsigned int reserved[4]; } CUDA_ARRAY_MEMORY_REQUIREMENTS;

static CUresult array_create(void **handle, uint64_t bytes, int kind) {
    NEED_CTX();
    if (!handle || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    bytes = (bytes + 511) & ~511ull; /* arrays are laid out in 512-byte aligned blocks */
    CUdeviceptr mem;
    CUresult rc = sim_alloc(&mem, bytes, t_ctx->dev, kind, 0, 0);
    if (rc) return rc;
    struct sim_array *a = calloc(1, sizeof *a);
    if (!a) { ms_rec r; ms_ptrmap_take(&g_ptrs, mem, &r); sim_release(&r); return CUDA_ERROR_OUT_OF_MEMORY; }
    *a = (struct sim_array){ARRAY_MAGIC, t_ctx->dev, bytes, (void *)(uintptr_t)mem};
    *handle = a;
    return CUDA_SUCCESS;
}

static CUresult array_destroy(void *handle) {
    NEED_INIT();
    struct sim_array *a = handle;
    ms_rec r;
    if (!a || a->magic != ARRAY_MAGIC || !ms_ptrmap_take(&g_ptrs, (uint64_t)(uintptr_t)a->mem, &r)) return CUDA_ERROR_INVALID_HANDLE;
    sim_release(&r);
    a->magic = 0;
    free(a);
    return CUDA_SUCCESS;
}

API CUresult cuArrayCreate_v2(CUarray *h, const CUDA_ARRAY_DESCRIPTOR *d) {
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    return array_create((void **)h, ms_array_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels), K_ARRAY);
}
API CUresult cuArrayCreate(CUarray *h, const CUDA_ARRAY_DESCRIPTOR_v1 *d) {
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    return array_create((void **)h, ms_array_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels), K_ARRAY);
}
API CUresult cuArray3DCreate_v2(CUarray *h, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    return array_create((void **)h, ms_array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels), K_ARRAY);
}
API CUresult cuArray3DCreate(CUarray *h, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d) {
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    return array_create((void **)h, ms_array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels), K_ARRAY);
}
API CUresult cuArrayDestroy(CUarray h) { return array_destroy(h); }
API CUresult cuMipmappedArrayCreate(CUmipmappedArray *h, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels) {
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    return array_create((void **)h, ms_mipmap_bytes(d, levels), K_MIPMAP);
}
API CUresult cuMipmappedArrayDestroy(CUmipmappedArray h) { return array_destroy(h); }
API CUresult cuArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *req, CUarray h, CUdevice d) {
    NEED_INIT();
    struct sim_array *a = (struct sim_array *)h;
    (void)d;
    if (!req || !a || a->magic != ARRAY_MAGIC) return CUDA_ERROR_INVALID_VALUE;
    memset(req, 0, sizeof *req);
    req->size = a->size;
    req->alignment = 512;
    return CUDA_SUCCESS;
}
API CUresult cuMipmappedArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *req, CUmipmappedArray h, CUdevice d) {
    return cuArrayGetMemoryRequirements(req, (CUarray)h, d);
}

/* ---- errors ------------------------------------------------------------------------------------------ */
API CUresult cuGetErrorName(CUresult e, const char **s) {
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    switch (e) {
    case CUDA_SUCCESS: *s = "CUDA_SUCCESS"; break;
    case CUDA_ERROR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *s = "CUDA_ERROR_NOT_INITIALIZED"; break;
    case CUDA_ERROR_NO_DEVICE: *s = "CUDA_ERROR_NO_DEVICE"; break;
    case CUDA_ERROR_INVALID_DEVICE: *s = "CUDA_ERROR_INVALID_DEVICE"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *s = "CUDA_ERROR_INVALID_CONTEXT"; break;
    case CUDA_ERROR_NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; break;
    case CUDA_ERROR_NOT_PERMITTED: *s = "CUDA_ERROR_NOT_PERMITTED"; break;
    case CUDA_ERROR_NOT_SUPPORTED: *s = "CUDA_ERROR_NOT_SUPPORTED"; break;
    default: *s = NULL; return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}
API CUresult cuGetErrorString(CUresult e, const char **s) { return cuGetErrorName(e, s); }

/* The private export tables libcudart asks for are undocumented: answer "not found", as a driver that
 * lacks one does. (So the real libcudart stops at cudaGetDeviceCount; see docs/architecture.md.) */
API CUresult cuGetExportTable(const void **table, const CUuuid *id) {
    (void)id;
    if (table) *table = NULL;
    return CUDA_ERROR_NOT_FOUND;
}

/* ---- cuGetProcAddress ---------------------------------------------------------------------------------
 * One row per exported variant: base name, the CUDA version that introduced it (the number in its
 * PFN_..._v<ver> typedef), whether it is the per-thread-default-stream variant, and the function. */
struct proc { const char *base; int ver; int ptds; void *fn; };
API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *status);
API CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
#define P(base, ver, fn) {base, ver, 0, (void *)fn}
#define T(base, ver, fn) {base, ver, 1, (void *)fn}
static const struct proc g_procs[] = {
    P("cuInit", 2000, cuInit), P("cuDriverGetVersion", 2020, cuDriverGetVersion),
    P("cuGetProcAddress", 11030, cuGetProcAddress), P("cuGetProcAddress", 12000, cuGetProcAddress_v2),
    P("cuGetExportTable", 3000, cuGetExportTable), P("cuGetErrorName", 6000, cuGetErrorName),
    P("cuGetErrorString", 6000, cuGetErrorString),
    P("cuDeviceGetCount", 2000, cuDeviceGetCount), P("cuDeviceGet", 2000, cuDeviceGet),
    P("cuDeviceGetName", 2000, cuDeviceGetName), P("cuDeviceGetUuid", 9020, cuDeviceGetUuid),
    P("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2), P("cuDeviceTotalMem", 2000, cuDeviceTotalMem),
    P("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2), P("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
    P("cuDeviceGetPCIBusId", 4010, cuDeviceGetPCIBusId),
    P("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    P("cuDevicePrimaryCtxRelease", 7000, cuDevicePrimaryCtxRelease),
    P("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
    P("cuDevicePrimaryCtxReset", 7000, cuDevicePrimaryCtxReset),
    P("cuDevicePrimaryCtxReset", 11000, cuDevicePrimaryCtxReset_v2),
    P("cuDevicePrimaryCtxSetFlags", 11000, cuDevicePrimaryCtxSetFlags_v2),
    P("cuDevicePrimaryCtxGetState", 7000, cuDevicePrimaryCtxGetState),
    P("cuCtxCreate", 2000, cuCtxCreate), P("cuCtxCreate", 3020, cuCtxCreate_v2),
    P("cuCtxCreate", 11040, cuCtxCreate_v3), P("cuCtxCreate", 12050, cuCtxCreate_v4),
    P("cuCtxDestroy", 2000, cuCtxDestroy), P("cuCtxDestroy", 4000, cuCtxDestroy_v2),
    P("cuCtxSetCurrent", 4000, cuCtxSetCurrent), P("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
    P("cuCtxPushCurrent", 2000, cuCtxPushCurrent), P("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2),
    P("cuCtxPopCurrent", 2000, cuCtxPopCurrent), P("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2),
    P("cuCtxGetDevice", 2000, cuCtxGetDevice), P("cuCtxGetDevice", 13000, cuCtxGetDevice_v2),
    P("cuCtxSynchronize", 2000, cuCtxSynchronize),
    P("cuMemAlloc", 2000, cuMemAlloc), P("cuMemAlloc", 3020, cuMemAlloc_v2),
    P("cuMemAllocPitch", 2000, cuMemAllocPitch), P("cuMemAllocPitch", 3020, cuMemAllocPitch_v2),
    P("cuMemFree", 2000, cuMemFree), P("cuMemFree", 3020, cuMemFree_v2),
    P("cuMemAllocManaged", 6000, cuMemAllocManaged),
    P("cuMemAdvise", 8000, cuMemAdvise), P("cuMemAdvise", 12020, cuMemAdvise_v2),
    P("cuMemPrefetchAsync", 8000, cuMemPrefetchAsync), T("cuMemPrefetchAsync", 8000, cuMemPrefetchAsync_ptsz),
    P("cuMemPrefetchAsync", 12020, cuMemPrefetchAsync_v2), T("cuMemPrefetchAsync", 12020, cuMemPrefetchAsync_v2_ptsz),
    P("cuMemGetInfo", 2000, cuMemGetInfo), P("cuMemGetInfo", 3020, cuMemGetInfo_v2),
    P("cuMemHostAlloc", 2020, cuMemHostAlloc), P("cuMemAllocHost", 2000, cuMemAllocHost),
    P("cuMemAllocHost", 3020, cuMemAllocHost_v2), P("cuMemFreeHost", 2000, cuMemFreeHost),
    P("cuMemHostGetDevicePointer", 2020, cuMemHostGetDevicePointer),
    P("cuMemHostGetDevicePointer", 3020, cuMemHostGetDevicePointer_v2),
    P("cuMemHostRegister", 4000, cuMemHostRegister), P("cuMemHostRegister", 6050, cuMemHostRegister_v2),
    P("cuMemHostUnregister", 4000, cuMemHostUnregister),
    P("cuMemcpy", 4000, cuMemcpy), T("cuMemcpy", 7000, cuMemcpy_ptds),
    P("cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2), T("cuMemcpyHtoD", 7000, cuMemcpyHtoD_v2_ptds),
    P("cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2), T("cuMemcpyDtoH", 7000, cuMemcpyDtoH_v2_ptds),
    P("cuMemcpyDtoD", 3020, cuMemcpyDtoD_v2), P("cuMemcpyAsync", 4000, cuMemcpyAsync),
    T("cuMemcpyAsync", 7000, cuMemcpyAsync_ptsz), P("cuMemcpyHtoDAsync", 3020, cuMemcpyHtoDAsync_v2),
    P("cuMemcpyDtoHAsync", 3020, cuMemcpyDtoHAsync_v2),
    P("cuMemsetD8", 3020, cuMemsetD8_v2), T("cuMemsetD8", 7000, cuMemsetD8_v2_ptds),
    P("cuMemsetD32", 3020, cuMemsetD32_v2),
    P("cuMemGetAddressRange", 3020, cuMemGetAddressRange_v2),
    P("cuPointerGetAttribute", 4000, cuPointerGetAttribute),
    P("cuPointerGetAttributes", 7000, cuPointerGetAttributes),
    P("cuStreamCreate", 2000, cuStreamCreate), P("cuStreamDestroy", 2000, cuStreamDestroy),
    P("cuStreamDestroy", 4000, cuStreamDestroy_v2), P("cuStreamSynchronize", 2000, cuStreamSynchronize),
    T("cuStreamSynchronize", 7000, cuStreamSynchronize_ptsz),
    P("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2), P("cuStreamEndCapture", 10000, cuStreamEndCapture),
    P("cuStreamIsCapturing", 10000, cuStreamIsCapturing), T("cuStreamIsCapturing", 10000, cuStreamIsCapturing_ptsz),
    P("cuMemAllocAsync", 11020, cuMemAllocAsync), T("cuMemAllocAsync", 11020, cuMemAllocAsync_ptsz),
    P("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync),
    T("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync_ptsz),
    P("cuMemFreeAsync", 11020, cuMemFreeAsync), T("cuMemFreeAsync", 11020, cuMemFreeAsync_ptsz),
    P("cuMemPoolCreate", 11020, cuMemPoolCreate), P("cuMemPoolDestroy", 11020, cuMemPoolDestroy),
    P("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool),
    P("cuDeviceGetMemPool", 11020, cuDeviceGetMemPool), P("cuDeviceSetMemPool", 11020, cuDeviceSetMemPool),
    P("cuMemPoolTrimTo", 11020, cuMemPoolTrimTo), P("cuMemPoolSetAttribute", 11020, cuMemPoolSetAttribute),
    P("cuMemPoolGetAttribute", 11020, cuMemPoolGetAttribute),
    P("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
    P("cuMemCreate", 10020, cuMemCreate), P("cuMemRelease", 10020, cuMemRelease),
    P("cuMemGetAllocationPropertiesFromHandle", 10020, cuMemGetAllocationPropertiesFromHandle),
    P("cuMemAddressReserve", 10020, cuMemAddressReserve), P("cuMemAddressFree", 10020, cuMemAddressFree),
    P("cuMemMap", 10020, cuMemMap), P("cuMemUnmap", 10020, cuMemUnmap), P("cuMemSetAccess", 10020, cuMemSetAccess),
    P("cuArrayCreate", 2000, cuArrayCreate), P("cuArrayCreate", 3020, cuArrayCreate_v2),
    P("cuArray3DCreate", 2000, cuArray3DCreate), P("cuArray3DCreate", 3020, cuArray3DCreate_v2),
    P("cuArrayDestroy", 2000, cuArrayDestroy),
    P("cuMipmappedArrayCreate", 5000, cuMipmappedArrayCreate),
    P("cuMipmappedArrayDestroy", 5000, cuMipmappedArrayDestroy),
    P("cuArrayGetMemoryRequirements", 11060, cuArrayGetMemoryRequirements),
    P("cuMipmappedArrayGetMemoryRequirements", 11060, cuMipmappedArrayGetMemoryRequirements),
};

/* Rules from cuda.h: newest variant introduced at or before cudaVersion; a PTDS request gets the _ptsz/
 * _ptds variant when one exists, else the legacy one; unknown names answer SUCCESS with NULL. */
API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *status) {
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    struct sim *s = sim_get();
    int drv = s ? s->driver_version : SIM_DRIVER_VERSION_DEFAULT;
    *pfn = NULL;
    if (cudaVersion > drv || flags > 3) {
        if (status) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_INVALID_VALUE;
    }
    int want_ptds = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const struct proc *best = NULL, *best_ptds = NULL;
    int known = 0;
    for (size_t i = 0; i < sizeof g_procs / sizeof g_procs[0]; i++) {
        const struct proc *p = &g_procs[i];
        if (strcmp(p->base, symbol) != 0) continue;
        known = 1;
        if (p->ver > cudaVersion) continue;
        if (p->ptds) { if (!best_ptds || p->ver > best_ptds->ver) best_ptds = p; }
        else if (!best || p->ver > best->ver) best = p;
    }
    const struct proc *pick = want_ptds && best_ptds ? best_ptds : best;
    if (pick) *pfn = pick->fn;
    else if (!known) *pfn = sim_proc_lookup(symbol, cudaVersion, want_ptds, &known); /* rest of cuda.h */
    if (status)
        *status = *pfn ? CU_GET_PROC_ADDRESS_SUCCESS
                       : known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_SUCCESS;
}

API CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}

/* ---- what the family files (sim_streams.c, sim_ipc.c) use; declared in sim_internal.h ---------------- */
/* cuInit's state, for the NEED_INIT checks of the other files. */
int sim_cuda_initialized(void) { return g_initialized; }
/* This thread's current context, so a new stream or event belongs to it. */
CUcontext sim_current_ctx(void) { return (CUcontext)t_ctx; }
/* A context's device, or -1 when the handle is not a live context. */
int sim_ctx_device(CUcontext c) { struct sim_ctx *x = as_ctx(c); return x ? x->dev : -1; }
/* The allocation map, for IPC: look up, record, remove. */
int sim_ptr_range(uint64_t addr, ms_rec *out) { pthread_once(&g_map_once, map_init); return ms_ptrmap_find_range(&g_ptrs, addr, out); }
int sim_ptr_put(const ms_rec *r) { pthread_once(&g_map_once, map_init); return ms_ptrmap_put(&g_ptrs, r); }
int sim_ptr_take(uint64_t base, ms_rec *out) { pthread_once(&g_map_once, map_init); return ms_ptrmap_take(&g_ptrs, base, out); }

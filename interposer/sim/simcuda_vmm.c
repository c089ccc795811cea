/* Simulated driver: virtual memory management (memfd-backed physical handles mapped into reserved ranges). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sim_internal.h"
#include "simcuda.h"

/* Physical memory (one memfd) is apart from the handles to it: cuMemImportFromShareableHandle gives a second
 * handle to the same memory, which lives while any handle or mapping of it does (`refs`), even after the
 * handle it was created with is released. Memory imported from another process is charged to the importer
 * (its pages stay alive through it whatever the exporter does), on the GPU the memory is on. */
struct sim_phys { int fd; int dev; int host; uint64_t size; int refs; CUmemAllocationProp prop; ino_t ino;
                  struct sim_phys *next; };
struct sim_vmm { uint32_t magic; struct sim_phys *p; };
#define VMM_MAGIC 0x564d4d31u
static struct sim_phys *g_phys; /* this process's physical allocations, for imports of its own exports */

/* ---- virtual memory management --------------------------------------------------------------------- */
static struct sim_vmm *as_vmm(CUmemGenericAllocationHandle h) {
    struct sim_vmm *x = (struct sim_vmm *)(uintptr_t)h;
    return x && x->magic == VMM_MAGIC ? x : NULL;
}

/* VMM granularity: 2 MiB, as on current GPUs. */
API CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
                                           CUmemAllocationGranularity_flags option) {
    NEED_INIT();
    (void)option;
    if (!g || !prop) return CUDA_ERROR_INVALID_VALUE;
    *g = VMM_GRANULARITY;
    return CUDA_SUCCESS;
}

/* The device a cuMemCreate property places memory on (host locations: the current context's GPU, whose
 * region counts host bytes), or -1 if the property is not one the driver accepts. */
static int vmm_device(const CUmemAllocationProp *prop, int host) {
    int dev = host ? (t_ctx ? t_ctx->dev : 0) : prop->location.id;
    if (!valid_dev(dev) || prop->location.type == CU_MEM_LOCATION_TYPE_INVALID) return -1;
    if (host && prop->requestedHandleTypes) return -1; /* documented for HOST locations */
    if (prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT) return -1; /* refused by cuMemCreate */
    return dev;
}

/* A new handle to p (which counts it), or NULL. */
static struct sim_vmm *new_handle(struct sim_phys *p) {
    struct sim_vmm *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    *v = (struct sim_vmm){.magic = VMM_MAGIC, .p = p};
    p->refs++;
    return v;
}

/* Physical memory for VMM: a memfd of `size` bytes, so every mapping of the handle aliases the same pages.
 * Charged to the device (or to host memory for a host location) before anything is created. */
API CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                         unsigned long long flags) {
    NEED_INIT();
    if (!h || !prop || flags || size == 0 || size % VMM_GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
    int host = prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE;
    int dev = vmm_device(prop, host);
    if (dev < 0) return CUDA_ERROR_INVALID_VALUE;
    struct sim *s = S();
    if (sim_charge(s, dev, size, host) < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    char name[40]; /* names the node GPU, so an importer in another process knows where the memory is */
    snprintf(name, sizeof name, host ? "memslice-sim-vmm" : "memslice-sim-vmm-g%d", sim_phys(dev));
    int fd = memfd_create(name, MFD_CLOEXEC);
    struct sim_phys *p = calloc(1, sizeof *p);
    struct stat st;
    if (fd < 0 || !p || ftruncate(fd, (off_t)size) < 0 || fstat(fd, &st) < 0) {
        if (fd >= 0) close(fd);
        free(p);
        sim_uncharge(s, dev, size, host);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *p = (struct sim_phys){.fd = fd, .dev = dev, .host = host, .size = size, .prop = *prop, .ino = st.st_ino};
    pthread_mutex_lock(&g_mu);
    struct sim_vmm *v = new_handle(p);
    if (v) {
        p->next = g_phys;
        g_phys = p;
    }
    pthread_mutex_unlock(&g_mu);
    if (!v) {
        close(fd);
        free(p);
        sim_uncharge(s, dev, size, host);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *h = (CUmemGenericAllocationHandle)(uintptr_t)v;
    if (host) {
        sim_count(SIM_C_HOST_CREATES, size);
        sim_cost(SIM_COST_PIN, size);
    }
    return CUDA_SUCCESS;
}

/* Free physical memory once no handle and no mapping refers to it (caller holds g_mu). */
static void phys_unref(struct sim_phys *p) {
    if (--p->refs > 0) return;
    struct sim_phys **pp = &g_phys;
    while (*pp && *pp != p) pp = &(*pp)->next;
    if (*pp) *pp = p->next;
    close(p->fd);
    sim_uncharge(S(), p->dev, p->size, p->host);
    free(p);
}

/* Releasing a handle frees the memory only once no other handle (an import) and no mapping refers to it. */
API CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    struct sim_vmm *v = as_vmm(h);
    if (!v) { pthread_mutex_unlock(&g_mu); return CUDA_ERROR_INVALID_VALUE; }
    v->magic = 0;
    int device = !v->p->host;
    if (v->p->host) {
        sim_count(SIM_C_HOST_RELEASES, v->p->size);
        sim_cost(SIM_COST_PIN, v->p->size);
    }
    phys_unref(v->p);
    free(v);
    pthread_mutex_unlock(&g_mu);
    if (device) sim_cost(SIM_COST_RELEASE, 0); /* the HBM is free (others see it) before the call returns */
    return CUDA_SUCCESS;
}

/* Export as a file descriptor (the only shareable type on Linux without a fabric), when the handle was
 * created asking for it, as the driver requires. */
API CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h, CUmemAllocationHandleType type,
                                          unsigned long long flags) {
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    struct sim_vmm *v = as_vmm(h);
    CUresult rc = CUDA_SUCCESS;
    if (!v || !out || flags) rc = CUDA_ERROR_INVALID_VALUE;
    else if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
             !(v->p->prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) rc = CUDA_ERROR_NOT_SUPPORTED;
    else if ((*(int *)out = fcntl(v->p->fd, F_DUPFD_CLOEXEC, 0)) < 0) rc = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* This process's physical allocation behind an exported descriptor, or NULL (caller holds g_mu). */
static struct sim_phys *phys_by_ino(ino_t ino) {
    for (struct sim_phys *p = g_phys; p; p = p->next)
        if (p->ino == ino) return p;
    return NULL;
}

/* The device ordinal of the GPU an exported descriptor's memory is on (its memfd's name says the node GPU),
 * else the current context's. */
static int exporter_device(int fd) {
    char path[64], target[96];
    int g;
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n > 0) {
        target[n] = 0;
        if (sscanf(target, "/memfd:memslice-sim-vmm-g%d", &g) == 1 && sim_ordinal(g) >= 0) return sim_ordinal(g);
    }
    return t_ctx ? t_ctx->dev : 0;
}

/* Import a descriptor from cuMemExportToShareableHandle: a new handle to the same memory (this process's
 * own, or another's, then charged here since its pages now live through this process). */
API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os, CUmemAllocationHandleType type) {
    NEED_INIT();
    int fd = (int)(intptr_t)os;
    struct stat st;
    if (!h || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 || st.st_size % VMM_GRANULARITY)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    struct sim_phys *p = phys_by_ino(st.st_ino);
    struct sim_vmm *v = NULL;
    if (p) v = new_handle(p);
    pthread_mutex_unlock(&g_mu);
    if (p) {
        if (!v) return CUDA_ERROR_OUT_OF_MEMORY;
        *h = (CUmemGenericAllocationHandle)(uintptr_t)v;
        return CUDA_SUCCESS;
    }
    int dev = exporter_device(fd);
    if (sim_charge(S(), dev, (uint64_t)st.st_size, 0) < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    p = calloc(1, sizeof *p);
    int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (!p || own < 0) {
        free(p);
        if (own >= 0) close(own);
        sim_uncharge(S(), dev, (uint64_t)st.st_size, 0);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *p = (struct sim_phys){.fd = own, .dev = dev, .size = (uint64_t)st.st_size, .ino = st.st_ino};
    p->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p->prop.location = (CUmemLocation){CU_MEM_LOCATION_TYPE_DEVICE, dev};
    p->prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    pthread_mutex_lock(&g_mu);
    v = new_handle(p);
    if (v) { p->next = g_phys; g_phys = p; }
    pthread_mutex_unlock(&g_mu);
    if (!v) {
        close(own);
        free(p);
        sim_uncharge(S(), dev, (uint64_t)st.st_size, 0);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *h = (CUmemGenericAllocationHandle)(uintptr_t)v;
    return CUDA_SUCCESS;
}

/* The properties a handle was created with. */
API CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle h) {
    NEED_INIT();
    struct sim_vmm *v = as_vmm(h);
    if (!v || !prop) return CUDA_ERROR_INVALID_VALUE;
    *prop = v->p->prop;
    return CUDA_SUCCESS;
}

/* Reserve an aligned virtual range (PROT_NONE) to map handles into. */
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

/* Give back a reserved virtual range. */
API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    NEED_INIT();
    ms_rec r;
    if (!ms_ptrmap_get(&g_ptrs, ptr, &r) || r.kind != K_VMM_RANGE || r.size != size) return CUDA_ERROR_INVALID_VALUE;
    ms_ptrmap_take(&g_ptrs, ptr, &r);
    munmap((void *)(uintptr_t)ptr, size);
    return CUDA_SUCCESS;
}

/* Mappings are kept in a small list: (address, size) -> handle, so cuMemUnmap finds what it unmaps. */
struct mapping { uint64_t ptr, size; struct sim_phys *p; struct mapping *next; };
static struct mapping *g_maps;

/* Map part of a handle's memfd at an address of a reserved range. As on the real driver, the mapping is not
 * accessible until cuMemSetAccess grants access (PROT_NONE until then). */
API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                      unsigned long long flags) {
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    struct sim_vmm *v = as_vmm(h);
    CUresult rc = CUDA_SUCCESS;
    struct mapping *m = malloc(sizeof *m);
    if (!v || flags || !m || offset + size > v->p->size || size % VMM_GRANULARITY) rc = CUDA_ERROR_INVALID_VALUE;
    else if (mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, v->p->fd, (off_t)offset) ==
             MAP_FAILED) rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        sim_cost(SIM_COST_VMM, 0);
        *m = (struct mapping){ptr, size, v->p, g_maps};
        g_maps = m;
        v->p->refs++;
    } else {
        free(m);
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* Whether [ptr, ptr + size) is made of whole mappings, with no hole and no mapping only partly inside (the
 * driver's rule: "cuMemUnmap cannot unmap a sub-range of an address range mapped by cuMemCreate / cuMemMap";
 * one call may unmap several adjacent mappings, as NVIDIA's vectorMemMap sample does). Caller holds g_mu. */
static int whole_mappings(uint64_t ptr, uint64_t size) {
    uint64_t covered = 0;
    for (struct mapping *m = g_maps; m; m = m->next) {
        int in = m->ptr >= ptr && m->ptr + m->size <= ptr + size;
        if (!in && m->ptr < ptr + size && ptr < m->ptr + m->size) return 0; /* partly inside */
        if (in) covered += m->size;
    }
    return covered == size;
}

/* Unmap a range of one or more whole mappings (back to PROT_NONE); the last unmapping of a released handle
 * frees it. */
API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    if (!size || !whole_mappings(ptr, size)) { pthread_mutex_unlock(&g_mu); return CUDA_ERROR_INVALID_VALUE; }
    sim_inflight_unmap(ptr, size);
    mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    uint64_t n = 0;
    for (struct mapping **pm = &g_maps; *pm;) {
        struct mapping *m = *pm;
        if (m->ptr < ptr || m->ptr + m->size > ptr + size) { pm = &m->next; continue; }
        *pm = m->next;
        phys_unref(m->p);
        free(m);
        n++;
    }
    sim_count(SIM_C_UNMAPS, size);
    sim_cost(SIM_COST_VMM, 0);
    if (n > 1) sim_count(SIM_C_RUN_UNMAPS, n);
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

/* Grant access to a mapped range: "the range must be a fully mapped address range" (cuda.h), and a mapping
 * is usable only once this has been called (the memory becomes readable, or readable and writable). */
API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
    NEED_INIT();
    if (!desc || count == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
    int prot = PROT_NONE;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type == CU_MEM_LOCATION_TYPE_DEVICE && !valid_dev(desc[i].location.id))
            return CUDA_ERROR_INVALID_DEVICE; /* a GPU this process does not see */
        if (desc[i].flags & 1) prot |= PROT_READ;
        if (desc[i].flags & 2) prot |= PROT_WRITE;
    }
    pthread_mutex_lock(&g_mu);
    uint64_t covered = 0;
    for (struct mapping *m = g_maps; m; m = m->next)
        if (m->ptr >= ptr && m->ptr + m->size <= ptr + size) covered += m->size;
    CUresult rc = covered == size && mprotect((void *)(uintptr_t)ptr, size, prot) == 0 ? CUDA_SUCCESS
                                                                                      : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) sim_cost(SIM_COST_VMM, 0);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

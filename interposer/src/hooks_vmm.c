/* Hooks for the virtual memory management API (cuMemCreate, cuMemMap, cuMemUnmap, cuMemRelease). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>

#include "place.h"
#include "hooks_peer.h"


/* ---- virtual memory management ----------------------------------------------------------------------
 * cuMemCreate with a device location is charged; the charge is released when the handle has been
 * released AND every mapping of it unmapped, which is when the driver frees the memory.
 * A handle imported with cuMemImportFromShareableHandle keeps the memory alive too, even after the handle
 * it was exported from is released (in this process or another): it is charged to the importer, on the GPU the
 * memory is on (hooks_peer.c), by what its mappings cover (no call tells its size before it is mapped), from
 * its first mapping until it is released and unmapped. While the original handle of the same process also lives, the memory is charged twice: an
 * over-charge for that time, never an under-charge. */
struct vmm_rec { uint64_t handle, size; int dev; int maps; int released; int host; int imported; };
static pthread_mutex_t g_vmm_mu = PTHREAD_MUTEX_INITIALIZER;

/* A physical VMM allocation on a device is charged when created (spilled to host when oversubscribing). */
HOOK CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                          unsigned long long flags) {
    PROLOGUE();
    __auto_type real = REAL(cuMemCreate);
    int dev = accounting() && h && prop && size && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE
                  ? dev_index(prop->location.id) : -1;
    struct placement p = place_on(dev, size, PLACE_CAN_SPILL);
    if (p.to == PLACE_REFUSE) return CUDA_ERROR_OUT_OF_MEMORY;
    if (p.to == PLACE_DRIVER) return real(h, size, prop, flags);
    struct vmm_rec *v = calloc(1, sizeof *v);
    if (!v) return CUDA_ERROR_OUT_OF_MEMORY;
    int host = 0;
    CUresult rc = quota_charge(dev, p.charge, "cuMemCreate", p.spill);
    if (rc != CUDA_SUCCESS && p.spill) {
        rc = spill_vmm(h, size, prop, flags, dev, "cuMemCreate");
        host = 1;
    } else if (rc == CUDA_SUCCESS) {
        rc = real(h, size, prop, flags);
        if (rc != CUDA_SUCCESS) quota_uncharge(dev, size);
    }
    if (rc != CUDA_SUCCESS) {
        free(v);
        return rc;
    }
    *v = (struct vmm_rec){.handle = *h, .size = size, .dev = dev, .host = host};
    track(*h, size, dev, A_VMM_HANDLE, (uint64_t)(uintptr_t)v);
    return CUDA_SUCCESS;
}

/* The driver frees a VMM allocation once its handle is released and nothing maps it. Caller holds g_vmm_mu. */
static void vmm_maybe_done(struct vmm_rec *v) {
    if (!v->released || v->maps > 0) return;
    untrack(v->handle, NULL);
    if (v->host) quota_uncharge_host(v->dev, v->size);
    else quota_uncharge(v->dev, v->size);
    free(v);
}

/* Releasing the handle frees the memory only once nothing maps it. */
HOOK CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle h) {
    PROLOGUE();
    CUresult rc = REAL(cuMemRelease)(h);
    ms_rec r;
    if (rc != CUDA_SUCCESS) return rc;
    pthread_mutex_lock(&g_vmm_mu);
    if (lookup(h, &r) && r.kind == A_VMM_HANDLE) {
        struct vmm_rec *v = (struct vmm_rec *)(uintptr_t)r.aux;
        v->released = 1;
        vmm_maybe_done(v);
    }
    pthread_mutex_unlock(&g_vmm_mu);
    return rc;
}

/* An imported handle: charged (on its memory's GPU) by what its mappings cover, once it is mapped. */
HOOK CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os,
                                                     CUmemAllocationHandleType type) {
    PROLOGUE();
    __auto_type real = REAL(cuMemImportFromShareableHandle);
    if (!real) return CUDA_ERROR_NOT_SUPPORTED;
    int dev = accounting() && h ? current_dev(NULL) : -1;
    if (dev == DEV_UNCHARGEABLE) return CUDA_ERROR_OUT_OF_MEMORY;
    struct vmm_rec *v = dev >= 0 ? calloc(1, sizeof *v) : NULL;
    if (dev >= 0 && !v) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real(h, os, type);
    if (rc != CUDA_SUCCESS || !v) {
        free(v);
        return rc;
    }
    dev = peer_handle_dev(*h, dev);
    *v = (struct vmm_rec){.handle = *h, .dev = dev, .imported = 1};
    track(*h, 0, dev, A_VMM_HANDLE, (uint64_t)(uintptr_t)v);
    return rc;
}

/* Before mapping an imported handle past what is charged for it: charge the rest (0, or a refusal). */
static CUresult import_extend(CUmemGenericAllocationHandle h, size_t size, size_t offset, uint64_t *added) {
    ms_rec r;
    *added = 0;
    pthread_mutex_lock(&g_vmm_mu);
    CUresult rc = CUDA_SUCCESS;
    if (lookup(h, &r) && r.kind == A_VMM_HANDLE) {
        struct vmm_rec *v = (struct vmm_rec *)(uintptr_t)r.aux;
        uint64_t end = (uint64_t)offset + size;
        if (v->imported && end > v->size) {
            rc = quota_charge(v->dev, end - v->size, "cuMemMap of an imported handle", QUOTA_LOUD);
            if (rc == CUDA_SUCCESS) {
                *added = end - v->size;
                v->size = end;
            }
        }
    }
    pthread_mutex_unlock(&g_vmm_mu);
    return rc;
}

/* Undo import_extend after the driver refused the mapping. */
static void import_shrink(CUmemGenericAllocationHandle h, uint64_t added) {
    ms_rec r;
    pthread_mutex_lock(&g_vmm_mu);
    if (added && lookup(h, &r) && r.kind == A_VMM_HANDLE) {
        struct vmm_rec *v = (struct vmm_rec *)(uintptr_t)r.aux;
        v->size -= added;
        quota_uncharge(v->dev, added);
    }
    pthread_mutex_unlock(&g_vmm_mu);
}

/* A mapping keeps the physical allocation alive: counted on its record. */
HOOK CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                       unsigned long long flags) {
    PROLOGUE();
    uint64_t added = 0;
    CUresult rc = import_extend(h, size, offset, &added);
    if (rc != CUDA_SUCCESS) return rc;
    rc = REAL(cuMemMap)(ptr, size, offset, h, flags);
    ms_rec r;
    if (rc != CUDA_SUCCESS) {
        import_shrink(h, added);
        return rc;
    }
    pthread_mutex_lock(&g_vmm_mu);
    if (lookup(h, &r) && r.kind == A_VMM_HANDLE) {
        ((struct vmm_rec *)(uintptr_t)r.aux)->maps++;
        track(ptr, size, r.dev, A_VMM_MAP, r.aux);
    }
    pthread_mutex_unlock(&g_vmm_mu);
    return rc;
}

/* The last unmapping of a released handle is when the driver frees it: the charge goes then. */
HOOK CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
    PROLOGUE();
    CUresult rc = REAL(cuMemUnmap)(ptr, size);
    ms_rec r;
    if (rc != CUDA_SUCCESS) return rc;
    pthread_mutex_lock(&g_vmm_mu);
    if (untrack(ptr, &r) && r.kind == A_VMM_MAP) {
        struct vmm_rec *v = (struct vmm_rec *)(uintptr_t)r.aux;
        v->maps--;
        vmm_maybe_done(v);
    }
    pthread_mutex_unlock(&g_vmm_mu);
    return rc;
}

/* Hooks for the virtual memory management API (cuMemCreate, cuMemMap, cuMemUnmap, cuMemRelease). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>

#include "shim.h"


/* ---- virtual memory management ----------------------------------------------------------------------
 * cuMemCreate with a device location is charged; the charge is released when the handle has been
 * released AND every mapping of it unmapped, which is when the driver frees the memory. */
struct vmm_rec { uint64_t handle, size; int dev; int maps; int released; int host; };
static pthread_mutex_t g_vmm_mu = PTHREAD_MUTEX_INITIALIZER;

/* A physical VMM allocation on a device is charged when created (spilled to host when oversubscribing). */
HOOK CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                          unsigned long long flags) {
    PROLOGUE();
    __auto_type real = REAL(cuMemCreate);
    int dev = accounting() && h && prop && size && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE
                  ? dev_index(prop->location.id) : -1;
    if (dev == DEV_UNCHARGEABLE) return CUDA_ERROR_OUT_OF_MEMORY;
    if (dev < 0) return real(h, size, prop, flags);
    struct vmm_rec *v = calloc(1, sizeof *v);
    if (!v) return CUDA_ERROR_OUT_OF_MEMORY;
    int host = 0;
    CUresult rc = reserve(dev, size, "cuMemCreate");
    if (rc != CUDA_SUCCESS && g_cfg.oversubscribe) {
        rc = spill_vmm(h, size, prop, flags, dev, "cuMemCreate");
        host = 1;
    } else if (rc == CUDA_SUCCESS) {
        rc = real(h, size, prop, flags);
        if (rc != CUDA_SUCCESS) uncharge(dev, size);
    }
    if (rc != CUDA_SUCCESS) {
        free(v);
        return rc;
    }
    *v = (struct vmm_rec){*h, size, dev, 0, 0, host};
    track(*h, size, dev, A_VMM_HANDLE, (uint64_t)(uintptr_t)v);
    return CUDA_SUCCESS;
}

/* The driver frees a VMM allocation once its handle is released and nothing maps it. Caller holds g_vmm_mu. */
static void vmm_maybe_done(struct vmm_rec *v) {
    if (!v->released || v->maps > 0) return;
    untrack(v->handle, NULL);
    if (v->host) uncharge_host(v->dev, v->size);
    else uncharge(v->dev, v->size);
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

/* A mapping keeps the physical allocation alive: counted on its record. */
HOOK CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                       unsigned long long flags) {
    PROLOGUE();
    CUresult rc = REAL(cuMemMap)(ptr, size, offset, h, flags);
    ms_rec r;
    if (rc != CUDA_SUCCESS) return rc;
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

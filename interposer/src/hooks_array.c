/* Hooks for CUDA arrays and mipmapped arrays: charged from the descriptor before the driver is called,
 * then corrected to what the driver reports it needs (cu*GetMemoryRequirements). */
#define _GNU_SOURCE
#include "ms_array.h"
#include "place.h"

/* What the driver says an array occupies, or the estimate when it cannot say (older drivers). */
static uint64_t array_need(CUarray a, CUdevice ord, uint64_t est) {
    __auto_type req = REAL(cuArrayGetMemoryRequirements);
    CUDA_ARRAY_MEMORY_REQUIREMENTS q;
    return req && req(&q, a, ord) == CUDA_SUCCESS && q.size ? q.size : est;
}

/* What the driver says a mipmapped array occupies (all levels), or the estimate. */
static uint64_t mipmap_need(CUmipmappedArray m, CUdevice ord, uint64_t est) {
    __auto_type req = REAL(cuMipmappedArrayGetMemoryRequirements);
    CUDA_ARRAY_MEMORY_REQUIREMENTS q;
    return req && req(&q, m, ord) == CUDA_SUCCESS && q.size ? q.size : est;
}

/* Correct the charge `est` to what the driver allocated, and remember the handle. */
static void settle(int dev, uint64_t est, uint64_t actual, uint64_t key) {
    quota_settle(dev, est, actual);
    track(key, actual, dev, A_ARRAY, 0);
}

/* One hook per array-creating entry point (they differ only in the descriptor type and its depth). */
#define ARRAY_HOOK(name, desc_t, depth)                                                                    \
    HOOK CUresult CUDAAPI name(CUarray *h, const desc_t *d) {                                              \
        PROLOGUE();                                                                                        \
        __auto_type real = REAL(name);                                                                     \
        CUdevice ord;                                                                                      \
        uint64_t est = h && d ? ms_array_bytes(d->Width, d->Height, (depth), d->Format, d->NumChannels) : 0; \
        struct placement p = place_current(h && d, est, 0, &ord); /* never spilled */                      \
        if (p.to == PLACE_REFUSE) return CUDA_ERROR_OUT_OF_MEMORY;                                        \
        if (p.to == PLACE_DRIVER) return real(h, d);                                                       \
        int dev = p.dev;                                                                                   \
        CUresult rc = quota_charge(dev, est, #name, QUOTA_LOUD);                                           \
        if (rc != CUDA_SUCCESS) return rc;                                                                 \
        rc = real(h, d);                                                                                   \
        if (rc != CUDA_SUCCESS) quota_uncharge(dev, est);                                                        \
        else settle(dev, est, array_need(*h, ord, est), (uint64_t)(uintptr_t)*h);                          \
        return rc;                                                                                         \
    }
ARRAY_HOOK(cuArrayCreate_v2, CUDA_ARRAY_DESCRIPTOR, 1)
ARRAY_HOOK(cuArrayCreate, CUDA_ARRAY_DESCRIPTOR_v1, 1)
ARRAY_HOOK(cuArray3DCreate_v2, CUDA_ARRAY3D_DESCRIPTOR, d->Depth)
ARRAY_HOOK(cuArray3DCreate, CUDA_ARRAY3D_DESCRIPTOR_v1, d->Depth)

/* A mipmapped array: every level, as ms_mipmap_bytes lays them out, then corrected like an array. */
HOOK CUresult CUDAAPI cuMipmappedArrayCreate(CUmipmappedArray *h, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                             unsigned int levels) {
    PROLOGUE();
    __auto_type real = REAL(cuMipmappedArrayCreate);
    CUdevice ord;
    uint64_t est = h && d ? ms_mipmap_bytes(d, levels) : 0;
    struct placement p = place_current(h && d, est, 0, &ord); /* never spilled */
    if (p.to == PLACE_REFUSE) return CUDA_ERROR_OUT_OF_MEMORY;
    if (p.to == PLACE_DRIVER) return real(h, d, levels);
    int dev = p.dev;
    CUresult rc = quota_charge(dev, est, "cuMipmappedArrayCreate", QUOTA_LOUD);
    if (rc != CUDA_SUCCESS) return rc;
    rc = real(h, d, levels);
    if (rc != CUDA_SUCCESS) quota_uncharge(dev, est);
    else settle(dev, est, mipmap_need(*h, ord, est), (uint64_t)(uintptr_t)*h);
    return rc;
}

/* After the driver destroyed (rc == success) or refused to destroy an array the shim took out of its
 * table: release the charge, or put the record back. */
static CUresult destroyed(int ours, const ms_rec *r, CUresult rc) {
    if (!ours) return rc;
    if (rc == CUDA_SUCCESS) quota_uncharge(r->dev, r->size);
    else track(r->key, r->size, r->dev, (enum alloc_kind)r->kind, r->aux);
    return rc;
}

/* Array destruction: the charge is released once the driver has freed the array. */
HOOK CUresult CUDAAPI cuArrayDestroy(CUarray h) {
    PROLOGUE();
    ms_rec r;
    int ours = h && untrack((uint64_t)(uintptr_t)h, &r);
    return destroyed(ours, &r, REAL(cuArrayDestroy)(h));
}

/* Mipmapped array destruction, as cuArrayDestroy. */
HOOK CUresult CUDAAPI cuMipmappedArrayDestroy(CUmipmappedArray h) {
    PROLOGUE();
    ms_rec r;
    int ours = h && untrack((uint64_t)(uintptr_t)h, &r);
    return destroyed(ours, &r, REAL(cuMipmappedArrayDestroy)(h));
}

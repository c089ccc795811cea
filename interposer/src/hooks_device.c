/* Hooks for plain and pitched device allocations (cuMemAlloc*, cuMemAllocPitch*) and their frees.
 *
 * The rule everywhere in the hooks: charge the quota first (quota.h), then call the driver, and give the
 * charge back if the driver fails — never check-then-charge. Frees call the driver first and release
 * the charge only once the driver has succeeded, so the device never holds more than what is charged. A
 * free of a pointer the shim never saw goes to the driver unchanged. */
#define _GNU_SOURCE
#include "place.h"

typedef __typeof__(&cuMemAlloc_v2) alloc_v2_fn;

/* device_alloc's placements other than HBM: the driver's call, a refusal, or elastic memory (charged, then
 * mapped by elastic.c). Out of line, so that the common placement keeps its few instructions. */
static __attribute__((noinline)) CUresult device_alloc_other(struct placement p, CUdeviceptr *dptr, size_t n,
                                                             CUdevice ord, alloc_v2_fn real, const char *call) {
    if (p.to == PLACE_DRIVER) return real(dptr, n);
    if (p.to == PLACE_REFUSE) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = quota_charge(p.dev, p.charge, call, p.spill);
    if (rc != CUDA_SUCCESS) return p.spill ? spill_alloc(dptr, n, p.dev, ord, call) : rc;
    if ((rc = elastic_alloc(dptr, p.charge, p.dev)) != CUDA_SUCCESS) quota_uncharge(p.dev, p.charge);
    return rc;
}

/* cuMemAlloc_v2: where it goes is place()'s (place.h); in HBM: charge, allocate, track; past the quota,
 * spill to host memory when the placement says so. */
static CUresult device_alloc(CUdeviceptr *dptr, size_t n, alloc_v2_fn real, const char *call) {
    CUdevice ord;
    struct placement p = place_current(dptr && n, n, PLACE_CAN_SPILL | PLACE_CAN_ELASTIC, &ord);
    if (p.to != PLACE_DEVICE) return device_alloc_other(p, dptr, n, ord, real, call);
    CUresult rc = quota_charge(p.dev, n, call, p.spill);
    if (rc != CUDA_SUCCESS) return p.spill ? spill_alloc(dptr, n, p.dev, ord, call) : rc;
    rc = real(dptr, n);
    if (rc != CUDA_SUCCESS || track(*dptr, n, p.dev, A_DEVICE, 0) < 0) {
        quota_uncharge(p.dev, n);
        return rc;
    }
    return CUDA_SUCCESS;
}

/* The 64-bit cuMemAlloc every modern program binds to. */
HOOK CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t n) {
    PROLOGUE();
    return device_alloc(dptr, n, REAL(cuMemAlloc_v2), "cuMemAlloc_v2");
}

/* The legacy 32-bit entry point is counted like the others: it is not a way around the quota. */
HOOK CUresult CUDAAPI cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int n) {
    PROLOGUE();
    __auto_type real = REAL(cuMemAlloc);
    CUdevice ord;
    struct placement p = place_current(dptr && n, n, 0, &ord); /* neither spilled nor elastic */
    if (p.to == PLACE_DRIVER) return real(dptr, n);
    if (p.to == PLACE_REFUSE) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = quota_charge(p.dev, p.charge, "cuMemAlloc", QUOTA_LOUD);
    if (rc != CUDA_SUCCESS) return rc;
    rc = real(dptr, n);
    if (rc != CUDA_SUCCESS || track(*dptr, n, p.dev, A_DEVICE, 0) < 0) quota_uncharge(p.dev, p.charge);
    return rc;
}

/* Pitched allocations are charged what the driver actually allocates: rows of `pitch` bytes. The
 * charge assumes 512-byte row alignment and is corrected once the driver reports the pitch.
 * `alloc` performs the real call (v2 or the legacy 32-bit v1) and reports address and pitch as 64-bit. */
typedef CUresult (*pitch_call)(void *args, uint64_t *ptr, uint64_t *pitch);

/* Both pitched entry points: charge the 512-byte-row estimate, then correct it to pitch x height. */
static CUresult pitched(uint64_t w, uint64_t h, int v2, pitch_call alloc, void *args, uint64_t *ptr, uint64_t *pitch,
                        const char *call) {
    CUdevice ord;
    uint64_t est = ((w + 511) & ~511ull) * h;
    struct placement p = place_current(w && h, est, v2 ? PLACE_CAN_SPILL : 0, &ord);
    if (p.to == PLACE_DRIVER) return alloc(args, ptr, pitch);
    if (p.to == PLACE_REFUSE) return CUDA_ERROR_OUT_OF_MEMORY;
    int dev = p.dev;
    CUresult rc = quota_charge(dev, est, call, p.spill);
    if (rc != CUDA_SUCCESS && p.spill) { /* host rows use the same 512-byte pitch */
        CUdeviceptr d;
        rc = spill_alloc(&d, est, dev, ord, call);
        if (rc == CUDA_SUCCESS) { *ptr = d; *pitch = (w + 511) & ~511ull; }
        return rc;
    }
    if (rc != CUDA_SUCCESS) return rc;
    if ((rc = alloc(args, ptr, pitch)) != CUDA_SUCCESS) {
        quota_uncharge(dev, est);
        return rc;
    }
    uint64_t actual = *pitch * h;
    quota_settle(dev, est, actual);
    track(*ptr, actual, dev, A_DEVICE, 0);
    return CUDA_SUCCESS;
}

struct pitch_v2 { size_t w, h; unsigned int elem; };
/* The driver's cuMemAllocPitch_v2, reporting address and pitch as 64-bit values. */
static CUresult real_pitch_v2(void *args, uint64_t *ptr, uint64_t *pitch) {
    struct pitch_v2 *a = args;
    CUdeviceptr d;
    size_t p;
    CUresult rc = REAL(cuMemAllocPitch_v2)(&d, &p, a->w, a->h, a->elem);
    if (rc == CUDA_SUCCESS) { *ptr = d; *pitch = p; }
    return rc;
}

/* Pitched 2D allocation (64-bit). */
HOOK CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t w, size_t h, unsigned int elem) {
    PROLOGUE();
    struct pitch_v2 a = {w, h, elem};
    uint64_t p = 0, pt = 0;
    if (!dptr || !pitch) /* the driver says what is wrong with its arguments */
        return REAL(cuMemAllocPitch_v2)(dptr, pitch, w, h, elem);
    CUresult rc = pitched(w, h, 1, real_pitch_v2, &a, &p, &pt, "cuMemAllocPitch_v2");
    if (rc == CUDA_SUCCESS) { *dptr = p; *pitch = pt; }
    return rc;
}

struct pitch_v1 { unsigned int w, h, elem; };
/* The driver's legacy 32-bit cuMemAllocPitch, reporting address and pitch as 64-bit values. */
static CUresult real_pitch_v1(void *args, uint64_t *ptr, uint64_t *pitch) {
    struct pitch_v1 *a = args;
    CUdeviceptr_v1 d;
    unsigned int p;
    CUresult rc = REAL(cuMemAllocPitch)(&d, &p, a->w, a->h, a->elem);
    if (rc == CUDA_SUCCESS) { *ptr = d; *pitch = p; }
    return rc;
}

/* Legacy 32-bit pitched allocation: counted like the 64-bit one. */
HOOK CUresult CUDAAPI cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int w, unsigned int h,
                              unsigned int elem) {
    PROLOGUE();
    if (!dptr || !pitch)
        return REAL(cuMemAllocPitch)(dptr, pitch, w, h, elem);
    struct pitch_v1 a = {w, h, elem};
    uint64_t p = 0, pt = 0;
    CUresult rc = pitched(w, h, 0, real_pitch_v1, &a, &p, &pt, "cuMemAllocPitch");
    if (rc == CUDA_SUCCESS) { *dptr = (CUdeviceptr_v1)p; *pitch = (unsigned int)pt; }
    return rc;
}

/* Free of anything the shim tracks by pointer; unknown pointers go to the driver untouched. */
static CUresult free_tracked(CUdeviceptr p, __typeof__(&cuMemFree_v2) real) {
    ms_rec r;
    if (!p || !untrack(p, &r)) return real(p);
    if (r.kind == A_SPILL_HOST || r.kind == A_SPILL_MANAGED || r.kind == A_SPILL_MAPPED) return spill_free(&r, NULL, 0);
    if (r.kind == A_ELASTIC) return elastic_free(&r);
    if (r.kind == A_POOL) { /* stream-ordered memory freed synchronously: the driver decides */
        CUresult rc = real(p);
        if (rc != CUDA_SUCCESS) track(r.key, r.size, r.dev, (enum alloc_kind)r.kind, r.aux);
        return rc;
    }
    CUresult rc = real(p);
    if (rc == CUDA_SUCCESS) quota_uncharge(r.dev, r.size);
    else track(r.key, r.size, r.dev, (enum alloc_kind)r.kind, r.aux);
    return rc;
}

/* Free of device, pitched or managed memory (or of a spilled block). */
HOOK CUresult CUDAAPI cuMemFree_v2(CUdeviceptr p) {
    PROLOGUE();
    return free_tracked(p, REAL(cuMemFree_v2));
}

static __typeof__(&cuMemFree) g_real_free_v1;
/* Calls the legacy 32-bit cuMemFree with free_tracked's 64-bit signature. */
static CUresult free_v1_adapter(CUdeviceptr p) { return g_real_free_v1((CUdeviceptr_v1)p); }
/* Legacy 32-bit free. */
HOOK CUresult CUDAAPI cuMemFree(CUdeviceptr_v1 p) {
    PROLOGUE();
    if (!g_real_free_v1) g_real_free_v1 = REAL(cuMemFree);
    return free_tracked(p, free_v1_adapter);
}

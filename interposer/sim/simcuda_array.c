/* Simulated driver: CUDA arrays and mipmapped arrays, 512-byte blocks of simulated device memory. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "ms_array.h"
#include "simcuda.h"

/* An array's bytes are laid out row by row, rows of a layer together, layers one after another (a real
 * driver's layout is opaque; copies address arrays only through offsets, so any fixed layout is faithful). */
struct sim_array { uint32_t magic; int dev; uint64_t size; void *mem; struct sim_layout lay; };
#define ARRAY_MAGIC 0x41525259u

/* ---- arrays ---------------------------------------------------------------------------------------- */
/* Level 0's layout from a descriptor: Height and Depth 0 mean one row and one layer (1D and 2D arrays). */
static struct sim_layout layout(uint64_t w, uint64_t h, uint64_t d, CUarray_format f, unsigned ch) {
    unsigned elem = (unsigned)(ms_format_bytes(f) * (ch ? ch : 1));
    return (struct sim_layout){NULL, w * elem, h ? h : 1, d ? d : 1, elem};
}

/* The layout of a live array (copies to and from arrays use it): 0, or -1 if h is not an array. */
int sim_array_layout(CUarray h, struct sim_layout *out) {
    struct sim_array *a = (struct sim_array *)h;
    if (!a || a->magic != ARRAY_MAGIC) return -1;
    *out = a->lay;
    return 0;
}

/* Create an array of `bytes` (a whole mipmapped array's, for K_MIPMAP) whose level 0 has layout `lay`. */
static CUresult array_create(void **handle, uint64_t bytes, int kind, struct sim_layout lay) {
    NEED_CTX();
    if (!handle || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    bytes = (bytes + 511) & ~511ull; /* arrays are laid out in 512-byte aligned blocks */
    CUdeviceptr mem;
    CUresult rc = sim_alloc(&mem, bytes, t_ctx->dev, kind, 0, 0);
    if (rc) return rc;
    struct sim_array *a = calloc(1, sizeof *a);
    if (!a) { ms_rec r; ms_ptrmap_take(&g_ptrs, mem, &r); sim_release(&r); return CUDA_ERROR_OUT_OF_MEMORY; }
    *a = (struct sim_array){ARRAY_MAGIC, t_ctx->dev, bytes, (void *)(uintptr_t)mem, lay};
    a->lay.mem = a->mem;
    *handle = a;
    return CUDA_SUCCESS;
}

/* Destroy an array or mipmapped array: its memory and charge go back. */
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

/* A 2D array, sized from its descriptor. */
API CUresult cuArrayCreate_v2(CUarray *h, const CUDA_ARRAY_DESCRIPTOR *d) {
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    return array_create((void **)h, ms_array_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels), K_ARRAY,
                        layout(d->Width, d->Height, 0, d->Format, d->NumChannels));
}
/* Legacy 32-bit-descriptor 2D array. */
API CUresult cuArrayCreate(CUarray *h, const CUDA_ARRAY_DESCRIPTOR_v1 *d) {
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    return array_create((void **)h, ms_array_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels), K_ARRAY,
                        layout(d->Width, d->Height, 0, d->Format, d->NumChannels));
}
/* A 3D array, sized from its descriptor. */
API CUresult cuArray3DCreate_v2(CUarray *h, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    return array_create((void **)h, ms_array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels), K_ARRAY,
                        layout(d->Width, d->Height, d->Depth, d->Format, d->NumChannels));
}
/* Legacy 32-bit-descriptor 3D array. */
API CUresult cuArray3DCreate(CUarray *h, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d) {
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    return array_create((void **)h, ms_array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels), K_ARRAY,
                        layout(d->Width, d->Height, d->Depth, d->Format, d->NumChannels));
}
/* Destroy an array. */
API CUresult cuArrayDestroy(CUarray h) { return array_destroy(h); }
/* A mipmapped array: every level, as ms_mipmap_bytes lays them out. */
API CUresult cuMipmappedArrayCreate(CUmipmappedArray *h, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels) {
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    return array_create((void **)h, ms_mipmap_bytes(d, levels), K_MIPMAP,
                        layout(d->Width, d->Height, d->Depth, d->Format, d->NumChannels));
}
/* Destroy a mipmapped array. */
API CUresult cuMipmappedArrayDestroy(CUmipmappedArray h) { return array_destroy(h); }
/* What an array occupies (the shim corrects its charge with this). */
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
/* What a mipmapped array occupies. */
API CUresult cuMipmappedArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *req, CUmipmappedArray h, CUdevice d) {
    return cuArrayGetMemoryRequirements(req, (CUarray)h, d);
}

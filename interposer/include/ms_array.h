/* Bytes an array occupies, from its descriptor: the shim charges this before creating one (and corrects
 * it afterwards with cuArrayGetMemoryRequirements when the driver has it); the simulator allocates it. */
#ifndef MEMSLICE_ARRAY_H
#define MEMSLICE_ARRAY_H

#include "cuda_abi.h"

static inline uint64_t ms_format_bytes(CUarray_format f) {
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2;
    default: return 4;
    }
}

static inline uint64_t ms_array_bytes(uint64_t w, uint64_t h, uint64_t d, CUarray_format f, unsigned ch) {
    return w * (h ? h : 1) * (d ? d : 1) * ms_format_bytes(f) * (ch ? ch : 1);
}

static inline uint64_t ms_mipmap_bytes(const CUDA_ARRAY3D_DESCRIPTOR *a, unsigned levels) {
    uint64_t total = 0, w = a->Width, h = a->Height, d = a->Depth;
    for (unsigned i = 0; i < (levels ? levels : 1); i++) {
        total += ms_array_bytes(w, h, d, a->Format, a->NumChannels);
        w = w > 1 ? w / 2 : 1; h = h > 1 ? h / 2 : h; d = d > 1 ? d / 2 : d;
    }
    return total;
}

#endif

/* Hooks for driver calls that take device memory without being allocations: context limits (the stack of
 * every resident thread: 256 KiB took 67,320 MiB on an H100; cudaDeviceSetLimit ends here), and module and
 * library loads (code and __device__ globals). Each is measured around the call (measure.c) and charged;
 * what does not fit the quota is undone (the old limit set again, the module unloaded) and the call answers
 * CUDA_ERROR_OUT_OF_MEMORY. Unloading gives the charge back; a lower limit gives back what it frees. */
#define _GNU_SOURCE
#include "shim.h"

/* Without any reading, a limit's memory is estimated from the device: the stack of every resident thread
 * (SMs x threads per SM), the heap and FIFO byte for byte. Signed: lowering gives memory back. */
static int64_t limit_estimate(CUdevice ord, CUlimit limit, size_t old, size_t value) {
    int64_t d = (int64_t)value - (int64_t)old;
    if (limit != CU_LIMIT_STACK_SIZE) return d;
    __auto_type attr = REAL(cuDeviceGetAttribute);
    int sms = 0, per_sm = 0;
    if (!attr || attr(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, ord) != CUDA_SUCCESS ||
        attr(&per_sm, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, ord) != CUDA_SUCCESS)
        return 0;
    return d * (int64_t)sms * (int64_t)per_sm;
}

/* After the driver set a limit: charge what it took (undo the limit if that does not fit), or give back
 * what it freed. Measured by free memory, never less than the estimate from the device's shape. */
static CUresult limit_account(struct measure *m, CUcontext ctx, CUlimit limit, int have_old, size_t old,
                              size_t value) {
    int64_t delta = measure_end(m);
    if (have_old && m->how != M_NVML_PROCESS) { /* free memory: other tenants' frees can hide some of it */
        int64_t est = limit_estimate(m->ord, limit, old, value);
        if (m->how == M_NONE || est > delta) delta = est;
    }
    if (delta < 0) {
        taken_release((uint64_t)(uintptr_t)ctx, T_LIMITS, (uint64_t)-delta);
        return CUDA_SUCCESS;
    }
    CUresult rc = taken_charge(m->dev, (uint64_t)(uintptr_t)ctx, T_LIMITS, (uint64_t)delta, "cuCtxSetLimit");
    if (rc != CUDA_SUCCESS) {
        if (have_old) REAL(cuCtxSetLimit)(limit, old);
        m->how = M_NONE;
    }
    return rc;
}

/* The stack, printf FIFO and malloc heap limits take device memory for the current context. */
HOOK CUresult CUDAAPI cuCtxSetLimit(CUlimit limit, size_t value) {
    PROLOGUE();
    __auto_type real = REAL(cuCtxSetLimit);
    if (!real) return CUDA_ERROR_NOT_SUPPORTED;
    CUdevice ord = 0;
    int dev = accounting() && (unsigned)limit <= CU_LIMIT_MALLOC_HEAP_SIZE ? current_dev(&ord) : -1;
    if (dev == DEV_UNCHARGEABLE) return CUDA_ERROR_OUT_OF_MEMORY;
    CUcontext ctx = NULL;
    __auto_type get_ctx = REAL(cuCtxGetCurrent);
    if (dev < 0 || !get_ctx || get_ctx(&ctx) != CUDA_SUCCESS || !ctx) return real(limit, value);
    size_t old = 0;
    __auto_type get_limit = REAL(cuCtxGetLimit);
    int have_old = get_limit && get_limit(&old, limit) == CUDA_SUCCESS;
    struct measure m;
    measure_begin(&m, dev, ord);
    CUresult rc = real(limit, value);
    if (rc == CUDA_SUCCESS) rc = limit_account(&m, ctx, limit, have_old, old, value);
    else m.how = M_NONE;
    measure_done(&m);
    return rc;
}

/* After a load: charge what it took, or unload it again when that does not fit. */
static CUresult load_account(struct measure *m, uint64_t handle, enum taken_kind kind, const char *call) {
    int64_t delta = measure_end(m);
    CUresult rc = delta > 0 ? taken_charge(m->dev, handle, kind, (uint64_t)delta, call) : CUDA_SUCCESS;
    if (rc == CUDA_SUCCESS) return rc;
    if (kind == T_MODULE) REAL(cuModuleUnload)((CUmodule)(uintptr_t)handle);
    else REAL(cuLibraryUnload)((CUlibrary)(uintptr_t)handle);
    m->how = M_NONE;
    return rc;
}

/* One hook per loading entry point: measured when a context of a charged GPU is current (a library loaded
 * without one takes its memory later, in contexts, and is caught by the reconciliation). */
#define LOAD_HOOK(name, kind, params, args)                                                                \
    HOOK CUresult CUDAAPI name params {                                                                    \
        PROLOGUE();                                                                                        \
        __auto_type real = REAL(name);                                                                     \
        if (!real) return CUDA_ERROR_NOT_SUPPORTED;                                                        \
        CUdevice ord = 0;                                                                                  \
        int dev = accounting() ? current_dev(&ord) : -1;                                                   \
        if (dev == DEV_UNCHARGEABLE) return CUDA_ERROR_OUT_OF_MEMORY;                                      \
        if (dev < 0) return real args;                                                                     \
        struct measure m;                                                                                  \
        measure_begin(&m, dev, ord);                                                                       \
        CUresult rc = real args;                                                                           \
        if (rc == CUDA_SUCCESS) rc = load_account(&m, (uint64_t)(uintptr_t)*out, kind, #name);           \
        else m.how = M_NONE;                                                                               \
        measure_done(&m);                                                                                  \
        return rc;                                                                                         \
    }

LOAD_HOOK(cuModuleLoad, T_MODULE, (CUmodule *out, const char *fname), (out, fname))
LOAD_HOOK(cuModuleLoadData, T_MODULE, (CUmodule *out, const void *image), (out, image))
LOAD_HOOK(cuModuleLoadDataEx, T_MODULE,
          (CUmodule *out, const void *image, unsigned int n, CUjit_option *o, void **v), (out, image, n, o, v))
LOAD_HOOK(cuModuleLoadFatBinary, T_MODULE, (CUmodule *out, const void *fat), (out, fat))
LOAD_HOOK(cuLibraryLoadData, T_LIBRARY,
          (CUlibrary *out, const void *code, CUjit_option *jo, void **jv, unsigned int jn, CUlibraryOption *lo,
           void **lv, unsigned int ln), (out, code, jo, jv, jn, lo, lv, ln))
LOAD_HOOK(cuLibraryLoadFromFile, T_LIBRARY,
          (CUlibrary *out, const char *path, CUjit_option *jo, void **jv, unsigned int jn, CUlibraryOption *lo,
           void **lv, unsigned int ln), (out, path, jo, jv, jn, lo, lv, ln))

/* Unloading gives the load's charge back. */
HOOK CUresult CUDAAPI cuModuleUnload(CUmodule mod) {
    PROLOGUE();
    __auto_type real = REAL(cuModuleUnload);
    CUresult rc = real ? real(mod) : CUDA_ERROR_NOT_SUPPORTED;
    if (rc == CUDA_SUCCESS) taken_release((uint64_t)(uintptr_t)mod, T_MODULE, UINT64_MAX);
    return rc;
}
HOOK CUresult CUDAAPI cuLibraryUnload(CUlibrary lib) {
    PROLOGUE();
    __auto_type real = REAL(cuLibraryUnload);
    CUresult rc = real ? real(lib) : CUDA_ERROR_NOT_SUPPORTED;
    if (rc == CUDA_SUCCESS) taken_release((uint64_t)(uintptr_t)lib, T_LIBRARY, UINT64_MAX);
    return rc;
}

/* Simulated driver: error names, export tables and cuGetProcAddress (which hands out this library's own
 * functions, by the documented version and per-thread-stream rules). */
#define _GNU_SOURCE
#include <string.h>

#include "sim_internal.h"
#include "simcuda.h"

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
/* The error's name stands in for its description. */
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
    /* copies, sets and stream memory operations: every variant, from the generated table (cuda_exports.def) */
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

/* The variant of `symbol` a caller built for cudaVersion gets: the newest introduced at or before that
 * version, the per-thread-default-stream one (_ptsz/_ptds) when asked for and one exists, else the legacy
 * one. NULL if none; *known says whether the name exists at all (for the query status). */
static const struct proc *pick_variant(const char *symbol, int cudaVersion, int want_ptds, int *known) {
    const struct proc *best = NULL, *best_ptds = NULL;
    *known = 0;
    for (size_t i = 0; i < sizeof g_procs / sizeof g_procs[0]; i++) {
        const struct proc *p = &g_procs[i];
        if (strcmp(p->base, symbol) != 0) continue;
        *known = 1;
        if (p->ver > cudaVersion) continue;
        const struct proc **slot = p->ptds ? &best_ptds : &best;
        if (!*slot || p->ver > (*slot)->ver) *slot = p;
    }
    return want_ptds && best_ptds ? best_ptds : best;
}

/* symbolStatus for a look-up: found, known but newer than the caller, or unknown. */
static CUdriverProcAddressQueryResult query_status(int found, int known) {
    if (found) return CU_GET_PROC_ADDRESS_SUCCESS;
    return known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
}

/* Rules from cuda.h: a cudaVersion above the driver's, or unknown flags, is an error; otherwise the answer
 * is SUCCESS, with NULL for a name this driver does not have (symbolStatus says why). */
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
    int known;
    int want_ptds = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const struct proc *pick = pick_variant(symbol, cudaVersion, want_ptds, &known);
    if (pick) *pfn = pick->fn;
    else if (!known) *pfn = sim_proc_lookup(symbol, cudaVersion, want_ptds, &known); /* rest of cuda.h */
    if (status) *status = query_status(*pfn != NULL, known);
    return CUDA_SUCCESS;
}

/* The CUDA 11.3-11.8 signature: the same rules, no symbolStatus. */
API CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}

/* What the application is told about memory: the quota is the GPU's size.
 * total = min(quota, physical); free = quota - what the container has charged, never below zero and
 * never above what the GPU really has free. cuMemGetInfo, cuDeviceTotalMem and NVML give the same
 * numbers from the same region, keyed by UUID. Without a quota these calls pass through untouched. */
#define _GNU_SOURCE
#include <limits.h>
#include <string.h>

#include "shim.h"

/* The smaller of two byte counts. */
static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* Apply the quota view to a (free, total) pair of the GPU with region index dev. */
static void quota_view(int dev, uint64_t *freeb, uint64_t *total) {
    uint64_t t = min_u64(g_cfg.limit, *total), used = quota_used(dev);
    uint64_t qfree = used < t ? t - used : 0;
    *freeb = min_u64(qfree, *freeb);
    *total = t;
}

/* Free and total as the container sees them: its quota, less what it has charged. */
HOOK CUresult CUDAAPI cuMemGetInfo_v2(size_t *freeb, size_t *total) {
    PROLOGUE();
    CUresult rc = REAL(cuMemGetInfo_v2)(freeb, total);
    if (rc != CUDA_SUCCESS || !enforcing()) return rc;
    int dev = current_dev(NULL);
    if (dev == DEV_UNCHARGEABLE) { /* under a quota, never the physical GPU: the quota, nothing free yet */
        *total = (size_t)min_u64(g_cfg.limit, *total);
        *freeb = 0;
        return rc;
    }
    if (dev < 0) return rc;
    reconcile_pools();
    uint64_t f = *freeb, t = *total;
    quota_view(dev, &f, &t);
    *freeb = f;
    *total = t;
    return rc;
}

/* Legacy 32-bit cuMemGetInfo: the same view, clamped to 4 GiB. */
HOOK CUresult CUDAAPI cuMemGetInfo(unsigned int *freeb, unsigned int *total) {
    PROLOGUE();
    __auto_type v2 = REAL(cuMemGetInfo_v2);
    if (!enforcing() || !v2 || !freeb || !total)
        return REAL(cuMemGetInfo)(freeb, total);
    size_t f, t;
    CUresult rc = cuMemGetInfo_v2(&f, &t);
    if (rc == CUDA_SUCCESS) {
        *freeb = f > UINT_MAX ? UINT_MAX : (unsigned int)f;
        *total = t > UINT_MAX ? UINT_MAX : (unsigned int)t;
    }
    return rc;
}

/* A GPU's size as the container sees it: at most its quota. */
HOOK CUresult CUDAAPI cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
    PROLOGUE();
    CUresult rc = REAL(cuDeviceTotalMem_v2)(bytes, d);
    if (rc == CUDA_SUCCESS && enforcing()) *bytes = min_u64(g_cfg.limit, *bytes);
    return rc;
}

/* Legacy 32-bit cuDeviceTotalMem, same view. */
HOOK CUresult CUDAAPI cuDeviceTotalMem(unsigned int *bytes, CUdevice d) {
    PROLOGUE();
    CUresult rc = REAL(cuDeviceTotalMem)(bytes, d);
    if (rc == CUDA_SUCCESS && enforcing()) *bytes = (unsigned int)min_u64(g_cfg.limit, *bytes);
    return rc;
}

/* ---- NVML ------------------------------------------------------------------------------------------ */
#define NVML_PROLOGUE()                                                                                    \
    do {                                                                                                   \
        ensure_init();                                                                                     \
        if (UNLIKELY(g_cfg.mode == MODE_FAIL_CLOSED)) return NVML_ERROR_NO_PERMISSION;                    \
    } while (0)

/* Region index of an NVML device (by UUID), or -1. */
static int nvml_dev(nvmlDevice_t d, uint64_t physical_total) {
    __auto_type uuid = REAL_NVML(nvmlDeviceGetUUID);
    char u[96];
    if (!uuid || uuid(d, u, sizeof u) != NVML_SUCCESS) return -1;
    return dev_index_by_uuid(u, physical_total);
}

/* The quota view of an NVML device's (total, free); 0 if it applies, -1 to leave the driver's numbers. */
static int nvml_view(nvmlDevice_t d, unsigned long long *total, unsigned long long *freeb) {
    if (!enforcing()) return -1;
    int dev = nvml_dev(d, *total);
    if (dev < 0) return -1;
    uint64_t f = *freeb, t = *total;
    quota_view(dev, &f, &t);
    *total = t;
    *freeb = f;
    return 0;
}

/* NVML memory info with the quota view (nvidia-smi and pynvml read this). */
HOOK nvmlReturn_t DECLDIR nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    NVML_PROLOGUE();
    nvmlReturn_t rc = REAL_NVML(nvmlDeviceGetMemoryInfo)(d, m);
    if (rc == NVML_SUCCESS && nvml_view(d, &m->total, &m->free) == 0) m->used = m->total - m->free;
    return rc;
}

/* Versioned NVML memory info, same view; nothing shown as reserved. */
HOOK nvmlReturn_t DECLDIR nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    NVML_PROLOGUE();
    nvmlReturn_t rc = REAL_NVML(nvmlDeviceGetMemoryInfo_v2)(d, m);
    if (rc == NVML_SUCCESS && nvml_view(d, &m->total, &m->free) == 0) {
        m->reserved = 0;
        m->used = m->total - m->free;
    }
    return rc;
}

/* Simulated driver: cuInit, the driver version, and the devices of the simulated node. */
#define _GNU_SOURCE
#include <limits.h>
#include <stdio.h>

#include "simcuda.h"

/* ---- init, versions, devices ---------------------------------------------------------------------- */
API CUresult cuInit(unsigned int flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (!S() || sim_visible_count() == 0) return CUDA_ERROR_NO_DEVICE;
    g_initialized = 1;
    return CUDA_SUCCESS;
}

/* The simulated driver version (MEMSLICE_SIM_DRIVER_VERSION, default 13000). */
API CUresult cuDriverGetVersion(int *v) {
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    struct sim *s = S();
    *v = s ? s->driver_version : SIM_DRIVER_VERSION_DEFAULT;
    return CUDA_SUCCESS;
}

/* How many GPUs the simulated node has. */
API CUresult cuDeviceGetCount(int *n) { NEED_INIT(); if (!n) return CUDA_ERROR_INVALID_VALUE; *n = ngpus(); return 0; }

/* The device of an ordinal. */
API CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    NEED_INIT();
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}

/* The GPU's name from the node state. */
API CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    NEED_INIT();
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    memset(name, 0, (size_t)len); /* the driver zero-fills the buffer: no stale bytes after the NUL */
    strncpy(name, SIM_GPU(d).name, (size_t)len - 1);
    return CUDA_SUCCESS;
}

/* UUID bytes, parsed back from the "GPU-..." text the NVML side reports, so both always agree. */
static void uuid_bytes(int d, CUuuid *u) {
    const char *t = SIM_GPU(d).uuid + 4;
    for (int i = 0; i < 16 && *t; i++) {
        if (*t == '-') t++;
        unsigned v = 0;
        sscanf(t, "%2x", &v);
        u->bytes[i] = (char)v;
        t += 2;
    }
}

/* The GPU's UUID bytes (the same UUID NVML reports as text). */
API CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) {
    NEED_INIT();
    if (!u) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    uuid_bytes(d, u);
    return CUDA_SUCCESS;
}
/* The newer variant of cuDeviceGetUuid: the same call. */
API CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) { return cuDeviceGetUuid(u, d); }

/* The GPU's capacity from the node state. */
API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
    NEED_INIT();
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = SIM_GPU(d).total;
    return CUDA_SUCCESS;
}

/* Legacy 32-bit cuDeviceTotalMem, clamped to 4 GiB. */
API CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice d) {
    size_t b;
    CUresult rc = cuDeviceTotalMem_v2(&b, d);
    if (rc == CUDA_SUCCESS) *bytes = b > UINT_MAX ? UINT_MAX : (unsigned int)b;
    return rc;
}

/* What every simulated GPU reports (an H100-like device with unified addressing, managed memory, pools
 * and VMM); attributes not listed read 0. The PCI bus ID comes from the node state. */
static const struct { CUdevice_attribute attr; int value; } g_attrs[] = {
    {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024},
    {CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32},
    {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 132},
    {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 2048},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0},
    {CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 1},
    {CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1},
    {CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 1},
    {CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 1},
    {CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1},
};

/* One device attribute of GPU d, from the table above (0 for anything else, as for PCI domain/device). */
API CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute attr, CUdevice d) {
    NEED_INIT();
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    *v = 0;
    if (attr == CU_DEVICE_ATTRIBUTE_PCI_BUS_ID) *v = (int)SIM_GPU(d).pci_bus;
    for (size_t i = 0; i < sizeof g_attrs / sizeof g_attrs[0]; i++)
        if (g_attrs[i].attr == attr) *v = g_attrs[i].value;
    return CUDA_SUCCESS;
}

/* The GPU's PCI bus ID, as NVML reports it. */
API CUresult cuDeviceGetPCIBusId(char *buf, int len, CUdevice d) {
    NEED_INIT();
    if (!buf || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(buf, (size_t)len, "%08X:%02X:%02X.0", 0u, SIM_GPU(d).pci_bus, 0u);
    return CUDA_SUCCESS;
}

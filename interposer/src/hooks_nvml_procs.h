/* The NVML process-list entry points the shim wraps (hooks_nvml_procs.c; names listed in hooks.def).
 * v1 entry points fill nvmlProcessInfo_v1_t, v2/v3 nvmlProcessInfo_t; `infos` is typed void * here because
 * one filter serves both layouts. */
#ifndef MEMSLICE_HOOKS_NVML_PROCS_H
#define MEMSLICE_HOOKS_NVML_PROCS_H

#include "cuda_abi.h"

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *count, void *infos);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *count, void *infos);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, void *infos);
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t d, unsigned int *count, void *infos);
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t d, unsigned int *count, void *infos);
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, void *infos);
nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t d, unsigned int *count, void *infos);
nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *count, void *infos);
nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, void *infos);

#endif

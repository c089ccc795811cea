/* What the simulated NVML's source files share (not exported). simnvml.c owns initialisation and the
 * device handles; simnvml_monitoring.c answers the monitoring queries through these. */
#ifndef MEMSLICE_SIM_NVML_H
#define MEMSLICE_SIM_NVML_H

#include <stdint.h>

#include "cuda_abi.h"

/* NVML_SUCCESS and the device's index, or NVML_ERROR_UNINITIALIZED / NVML_ERROR_INVALID_ARGUMENT. */
nvmlReturn_t sim_nvml_dev(nvmlDevice_t d, unsigned int *index);
/* Device memory in use on GPU g (all processes of the simulated node), in bytes. */
uint64_t sim_nvml_used(unsigned int g);
/* The compute-process list of simnvml.c, for the v3 graphics/compute entry points (v2 layout). */
nvmlReturn_t sim_nvml_processes(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos);

#endif

/* NVML entry points defined in simnvml_monitoring.c, and the nvml.h structures they fill.
 * Every exported function has its prototype here (the build uses -Wmissing-prototypes). Weak stubs of the
 * same names (sim_stubs_*.c) are replaced by these definitions at link time. */
#ifndef MEMSLICE_SIMNVML_MONITORING_API_H
#define MEMSLICE_SIMNVML_MONITORING_API_H

#include "cuda_abi.h"

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long bar1Total, bar1Free, bar1Used; } nvmlBAR1Memory_t;
typedef struct { unsigned int version; int sensorType; int temperature; } nvmlTemperature_t;
#define nvmlTemperature_v1 (unsigned int)(sizeof(nvmlTemperature_t) | (1u << 24))

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned int *mhz);
nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t d, int type, unsigned int *mhz);
nvmlReturn_t nvmlDeviceGetApplicationsClock(nvmlDevice_t d, int type, unsigned int *mhz);
nvmlReturn_t nvmlDeviceGetDefaultApplicationsClock(nvmlDevice_t d, int type, unsigned int *mhz);
nvmlReturn_t nvmlDeviceGetClock(nvmlDevice_t d, int type, int id, unsigned int *mhz);
nvmlReturn_t nvmlDeviceGetMaxCustomerBoostClock(nvmlDevice_t d, int type, unsigned int *mhz);
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long *reasons);
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long *r);
nvmlReturn_t nvmlDeviceGetSupportedClocksEventReasons(nvmlDevice_t d, unsigned long long *reasons);
nvmlReturn_t nvmlDeviceGetSupportedClocksThrottleReasons(nvmlDevice_t d, unsigned long long *r);
nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t d, int *p);
nvmlReturn_t nvmlDeviceGetPowerState(nvmlDevice_t d, int *p);
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *t);
nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t d, nvmlTemperature_t *t);
nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t d, int kind, unsigned int *t);
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw);
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *mw);
nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t d, unsigned int *mw);
nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t d, unsigned int *mw);
nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t d, unsigned int *lo, unsigned int *hi);
nvmlReturn_t nvmlDeviceGetPowerManagementMode(nvmlDevice_t d, int *mode);
nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d, unsigned long long *mj);
nvmlReturn_t nvmlDeviceGetNumFans(nvmlDevice_t d, unsigned int *n);
nvmlReturn_t nvmlDeviceGetFanSpeed_v2(nvmlDevice_t d, unsigned int fan, unsigned int *pct);
nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t d, unsigned int *pct);
nvmlReturn_t nvmlDeviceGetTargetFanSpeed(nvmlDevice_t d, unsigned int fan, unsigned int *pct);
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u);
nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t d, unsigned int *u, unsigned int *p);
nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t d, unsigned int *u, unsigned int *p);
nvmlReturn_t nvmlDeviceGetJpgUtilization(nvmlDevice_t d, unsigned int *u, unsigned int *p);
nvmlReturn_t nvmlDeviceGetOfaUtilization(nvmlDevice_t d, unsigned int *u, unsigned int *p);
nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t d, int counter, unsigned int *kbps);
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, void *samples, unsigned int *count, unsigned long long since);
nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t d, unsigned int *g);
nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t d, unsigned int *g);
nvmlReturn_t nvmlDeviceGetGpuMaxPcieLinkGeneration(nvmlDevice_t d, unsigned int *g);
nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t d, unsigned int *w);
nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t d, unsigned int *w);
nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t d, nvmlBAR1Memory_t *b);
nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t d, int *current, int *pending);
nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t d, int *mode);
nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t d, int *mode);
nvmlReturn_t nvmlDeviceGetDisplayMode(nvmlDevice_t d, int *mode);
nvmlReturn_t nvmlDeviceGetDisplayActive(nvmlDevice_t d, int *active);
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int type, int counter, unsigned long long *n);
nvmlReturn_t nvmlDeviceGetMemoryErrorCounter(nvmlDevice_t d, int type, int counter, int location, unsigned long long *n);
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *p);
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *p);
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v1_t *p);
nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *p);
nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *p);
nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v1_t *p);
nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int len);
nvmlReturn_t nvmlSystemGetNVMLVersion(char *buf, unsigned int len);

#endif

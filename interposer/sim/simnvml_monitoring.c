/* Simulated NVML monitoring: clocks, temperature, power, fans, utilization, ECC, persistence and compute
 * mode, PCIe, process lists (graphics, MPS, v3 layouts). Monitoring tools (nvitop, gpustat, DCGM-style
 * exporters) call all of these, and a tool that gets an error it does not expect prints a traceback.
 *
 * The values are those of an idle data-centre GPU of the H100 class, stable over time so tests and
 * dashboards are reproducible, except utilisation: the GPU's and each process's busy share of the last sample
 * period of the compute timeline (simtimeline.h), where kernels run in GPU time. Clocks sit at their idle
 * values; the performance state is P0 while any process holds device memory (a context is
 * resident) and P8 otherwise; power is an idle draw plus a small term per GiB resident, and the energy counter
 * integrates that since boot, so it only grows. No graphics or MPS clients exist on the simulated node. */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "sim_nvml.h"
#include "simnvml_monitoring_api.h"
#include "simstate.h"
#include "simtimeline.h"

#define API SIM_EXPORT
#define DEV(d, idx) unsigned int idx; { nvmlReturn_t rc_ = sim_nvml_dev(d, &idx); if (rc_) return rc_; }


enum { CLOCK_GRAPHICS = 0, CLOCK_SM = 1, CLOCK_MEM = 2, CLOCK_VIDEO = 3, CLOCK_COUNT = 4 };
static const unsigned int IDLE_MHZ[CLOCK_COUNT] = {345, 345, 2619, 765};
static const unsigned int MAX_MHZ[CLOCK_COUNT] = {1980, 1980, 2619, 1710};
static const unsigned int APP_MHZ[CLOCK_COUNT] = {1755, 1755, 2619, 1620};

#define IDLE_MW 69000u
#define LIMIT_MW 700000u
#define MIN_LIMIT_MW 200000u

/* ---- clocks ------------------------------------------------------------------------------------------- */
API nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned int *mhz) {
    DEV(d, i);
    (void)i;
    if (!mhz || type < 0 || type >= CLOCK_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    *mhz = IDLE_MHZ[type];
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t d, int type, unsigned int *mhz) {
    DEV(d, i);
    (void)i;
    if (!mhz || type < 0 || type >= CLOCK_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    *mhz = MAX_MHZ[type];
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetApplicationsClock(nvmlDevice_t d, int type, unsigned int *mhz) {
    DEV(d, i);
    (void)i;
    if (!mhz || type < 0 || type >= CLOCK_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    *mhz = APP_MHZ[type];
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetDefaultApplicationsClock(nvmlDevice_t d, int type, unsigned int *mhz) {
    return nvmlDeviceGetApplicationsClock(d, type, mhz);
}
/* clockId: 0 current, 1 application target, 2 application default, 3 customer boost max. */
API nvmlReturn_t nvmlDeviceGetClock(nvmlDevice_t d, int type, int id, unsigned int *mhz) {
    switch (id) {
    case 0: return nvmlDeviceGetClockInfo(d, type, mhz);
    case 1: case 2: return nvmlDeviceGetApplicationsClock(d, type, mhz);
    case 3: return nvmlDeviceGetMaxClockInfo(d, type, mhz);
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
}
API nvmlReturn_t nvmlDeviceGetMaxCustomerBoostClock(nvmlDevice_t d, int type, unsigned int *mhz) {
    return nvmlDeviceGetMaxClockInfo(d, type, mhz);
}
/* Idle: the clocks are low because the GPU is idle (nvmlClocksEventReasonGpuIdle = 1). */
API nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long *reasons) {
    DEV(d, i);
    (void)i;
    if (!reasons) return NVML_ERROR_INVALID_ARGUMENT;
    *reasons = 0x1ull;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long *r) {
    return nvmlDeviceGetCurrentClocksEventReasons(d, r);
}
API nvmlReturn_t nvmlDeviceGetSupportedClocksEventReasons(nvmlDevice_t d, unsigned long long *reasons) {
    DEV(d, i);
    (void)i;
    if (!reasons) return NVML_ERROR_INVALID_ARGUMENT;
    *reasons = 0x1ffull;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetSupportedClocksThrottleReasons(nvmlDevice_t d, unsigned long long *r) {
    return nvmlDeviceGetSupportedClocksEventReasons(d, r);
}

/* ---- performance state, temperature ------------------------------------------------------------------- */
/* P0 while a context (device memory) is resident, P8 when the GPU is empty. */
API nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t d, int *p) {
    DEV(d, i);
    if (!p) return NVML_ERROR_INVALID_ARGUMENT;
    *p = sim_nvml_used(i) ? 0 : 8;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetPowerState(nvmlDevice_t d, int *p) { return nvmlDeviceGetPerformanceState(d, p); }

/* A few degrees apart per GPU, as neighbouring boards are, and constant. */
static unsigned int temperature_of(unsigned int i) { return 31u + (i * 3u) % 7u; }

API nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *t) {
    DEV(d, i);
    if (!t || sensor != 0) return NVML_ERROR_INVALID_ARGUMENT; /* NVML_TEMPERATURE_GPU is the only sensor */
    *t = temperature_of(i);
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t d, nvmlTemperature_t *t) {
    DEV(d, i);
    if (!t) return NVML_ERROR_INVALID_ARGUMENT;
    if (t->version != nvmlTemperature_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (t->sensorType != 0) return NVML_ERROR_INVALID_ARGUMENT;
    t->temperature = (int)temperature_of(i);
    return NVML_SUCCESS;
}
/* Thresholds: 0 shutdown, 1 slowdown, 2 memory max, 3 GPU max; acoustic ones are not supported. */
API nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t d, int kind, unsigned int *t) {
    static const unsigned int values[] = {92, 89, 95, 87};
    DEV(d, i);
    (void)i;
    if (!t || kind < 0) return NVML_ERROR_INVALID_ARGUMENT;
    if (kind > 3) return NVML_ERROR_NOT_SUPPORTED;
    *t = values[kind];
    return NVML_SUCCESS;
}

/* ---- power -------------------------------------------------------------------------------------------- */
/* Idle draw plus 50 mW per GiB resident: stable for a given occupancy, higher when memory is held. */
static unsigned int power_mw(unsigned int i) { return IDLE_MW + (unsigned int)(sim_nvml_used(i) >> 30) * 50u; }

API nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
    DEV(d, i);
    if (!mw) return NVML_ERROR_INVALID_ARGUMENT;
    *mw = power_mw(i);
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *mw) {
    DEV(d, i);
    (void)i;
    if (!mw) return NVML_ERROR_INVALID_ARGUMENT;
    *mw = LIMIT_MW;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t d, unsigned int *mw) {
    return nvmlDeviceGetEnforcedPowerLimit(d, mw);
}
API nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t d, unsigned int *mw) {
    return nvmlDeviceGetEnforcedPowerLimit(d, mw);
}
API nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t d, unsigned int *lo, unsigned int *hi) {
    DEV(d, i);
    (void)i;
    if (!lo || !hi) return NVML_ERROR_INVALID_ARGUMENT;
    *lo = MIN_LIMIT_MW;
    *hi = LIMIT_MW;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetPowerManagementMode(nvmlDevice_t d, int *mode) {
    DEV(d, i);
    (void)i;
    if (!mode) return NVML_ERROR_INVALID_ARGUMENT;
    *mode = 1;
    return NVML_SUCCESS;
}
/* Millijoules since boot at the current draw: it only grows, at a plausible rate. */
API nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d, unsigned long long *mj) {
    DEV(d, i);
    if (!mj) return NVML_ERROR_INVALID_ARGUMENT;
    struct timespec t;
    clock_gettime(CLOCK_BOOTTIME, &t);
    *mj = (unsigned long long)power_mw(i) * (unsigned long long)t.tv_sec +
          (unsigned long long)power_mw(i) * (unsigned long long)(t.tv_nsec / 1000000) / 1000ull;
    return NVML_SUCCESS;
}

/* ---- fans --------------------------------------------------------------------------------------------- */
API nvmlReturn_t nvmlDeviceGetNumFans(nvmlDevice_t d, unsigned int *n) {
    DEV(d, i);
    (void)i;
    if (!n) return NVML_ERROR_INVALID_ARGUMENT;
    *n = 1;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetFanSpeed_v2(nvmlDevice_t d, unsigned int fan, unsigned int *pct) {
    DEV(d, i);
    if (!pct || fan != 0) return NVML_ERROR_INVALID_ARGUMENT;
    *pct = 30u + temperature_of(i) % 5u;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t d, unsigned int *pct) { return nvmlDeviceGetFanSpeed_v2(d, 0, pct); }
API nvmlReturn_t nvmlDeviceGetTargetFanSpeed(nvmlDevice_t d, unsigned int fan, unsigned int *pct) {
    return nvmlDeviceGetFanSpeed_v2(d, fan, pct);
}

/* ---- utilization: from the compute timeline ------------------------------------------------------------ */
/* The percentage of the last sample period (TL_PERIOD_NS) in which a kernel ran; memory: none measured. */
API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    DEV(d, i);
    if (!u) return NVML_ERROR_INVALID_ARGUMENT;
    u->gpu = tl_util((int)i);
    u->memory = 0;
    return NVML_SUCCESS;
}
/* Encoder, decoder, JPEG and OFA engines: idle, over NVML's usual 167 ms sampling period. */
static nvmlReturn_t engine_idle(nvmlDevice_t d, unsigned int *u, unsigned int *period) {
    DEV(d, i);
    (void)i;
    if (!u || !period) return NVML_ERROR_INVALID_ARGUMENT;
    *u = 0;
    *period = 167000;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t d, unsigned int *u, unsigned int *p) { return engine_idle(d, u, p); }
API nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t d, unsigned int *u, unsigned int *p) { return engine_idle(d, u, p); }
API nvmlReturn_t nvmlDeviceGetJpgUtilization(nvmlDevice_t d, unsigned int *u, unsigned int *p) { return engine_idle(d, u, p); }
API nvmlReturn_t nvmlDeviceGetOfaUtilization(nvmlDevice_t d, unsigned int *u, unsigned int *p) { return engine_idle(d, u, p); }
API nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t d, int counter, unsigned int *kbps) {
    DEV(d, i);
    (void)i;
    if (!kbps || counter < 0 || counter > 1) return NVML_ERROR_INVALID_ARGUMENT;
    *kbps = 0;
    return NVML_SUCCESS;
}
/* nvmlProcessUtilizationSample_t, as nvml.h lays it out. */
struct util_sample { unsigned int pid; unsigned long long ts; unsigned int sm, mem, enc, dec; };
struct util_arg { struct util_sample got[TL_CLIENTS]; unsigned int n; unsigned long long since; };

/* Keep one process's sample if it is newer than what the caller has seen. */
static void keep_sample(void *arg, uint32_t pid, unsigned int sm, uint64_t ts_us) {
    struct util_arg *a = arg;
    if (ts_us > a->since && a->n < TL_CLIENTS) a->got[a->n++] = (struct util_sample){pid, ts_us, sm, 0, 0, 0};
}

/* One sample per process that ran kernels in the last sample period (smUtil: its share of it), stamped
 * with the period's end; NOT_FOUND when none is newer than `since`. samples NULL: the count needed. */
API nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, void *samples, unsigned int *count,
                                                 unsigned long long since) {
    DEV(d, i);
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    struct util_arg a = {.since = since};
    tl_samples((int)i, keep_sample, &a);
    if (a.n == 0) {
        *count = 0;
        return NVML_ERROR_NOT_FOUND;
    }
    if (!samples || *count < a.n) {
        *count = a.n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    memcpy(samples, a.got, a.n * sizeof a.got[0]);
    *count = a.n;
    return NVML_SUCCESS;
}

/* ---- PCIe and BAR1 ------------------------------------------------------------------------------------ */
static nvmlReturn_t pcie_value(nvmlDevice_t d, unsigned int *v, unsigned int value) {
    DEV(d, i);
    (void)i;
    if (!v) return NVML_ERROR_INVALID_ARGUMENT;
    *v = value;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t d, unsigned int *g) { return pcie_value(d, g, 5); }
API nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t d, unsigned int *g) { return pcie_value(d, g, 5); }
API nvmlReturn_t nvmlDeviceGetGpuMaxPcieLinkGeneration(nvmlDevice_t d, unsigned int *g) { return pcie_value(d, g, 5); }
API nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t d, unsigned int *w) { return pcie_value(d, w, 16); }
API nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t d, unsigned int *w) { return pcie_value(d, w, 16); }

/* BAR1 as large as the memory it maps (resizable BAR), used as device memory is. */
API nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t d, nvmlBAR1Memory_t *b) {
    DEV(d, i);
    if (!b) return NVML_ERROR_INVALID_ARGUMENT;
    struct sim *s = sim_get();
    uint64_t total = s ? s->node->gpu[i].total : 0, used = sim_nvml_used(i);
    if (used > total) used = total;
    b->bar1Total = total;
    b->bar1Used = used;
    b->bar1Free = total - used;
    return NVML_SUCCESS;
}

/* ---- modes: ECC on, persistence on, compute mode default, no display ---------------------------------- */
static nvmlReturn_t mode_pair(nvmlDevice_t d, int *current, int *pending, int value) {
    DEV(d, i);
    (void)i;
    if (!current) return NVML_ERROR_INVALID_ARGUMENT;
    *current = value;
    if (pending) *pending = value;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t d, int *current, int *pending) {
    if (!pending) return NVML_ERROR_INVALID_ARGUMENT;
    return mode_pair(d, current, pending, 1);
}
API nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t d, int *mode) { return mode_pair(d, mode, NULL, 1); }
API nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t d, int *mode) { return mode_pair(d, mode, NULL, 0); }
API nvmlReturn_t nvmlDeviceGetDisplayMode(nvmlDevice_t d, int *mode) { return mode_pair(d, mode, NULL, 0); }
API nvmlReturn_t nvmlDeviceGetDisplayActive(nvmlDevice_t d, int *active) { return mode_pair(d, active, NULL, 0); }
/* No ECC error has ever happened on a simulated GPU (Xid injection aside, which is not an ECC count). */
API nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int type, int counter, unsigned long long *n) {
    DEV(d, i);
    (void)i;
    if (!n || type < 0 || type > 1 || counter < 0 || counter > 1) return NVML_ERROR_INVALID_ARGUMENT;
    *n = 0;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetMemoryErrorCounter(nvmlDevice_t d, int type, int counter, int location,
                                                 unsigned long long *n) {
    (void)location;
    return nvmlDeviceGetTotalEccErrors(d, type, counter, n);
}

/* ---- processes: compute from the node's region; no graphics or MPS clients exist here ----------------- */
API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *p) {
    DEV(d, i);
    (void)i; (void)p;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *p) {
    return nvmlDeviceGetGraphicsRunningProcesses_v3(d, c, p);
}
API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v1_t *p) {
    (void)p; /* v1 entries are smaller: never written, the list is empty */
    return nvmlDeviceGetGraphicsRunningProcesses_v3(d, c, NULL);
}
API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *p) {
    return nvmlDeviceGetGraphicsRunningProcesses_v3(d, c, p);
}
API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *p) {
    return nvmlDeviceGetGraphicsRunningProcesses_v3(d, c, p);
}
API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v1_t *p) {
    (void)p; /* v1 entries are smaller: never written, the list is empty */
    return nvmlDeviceGetGraphicsRunningProcesses_v3(d, c, NULL);
}

/* ---- system ------------------------------------------------------------------------------------------- */
/* The process's command name, as NVML reads it from the kernel. */
API nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int len) {
    if (!name || len == 0) return NVML_ERROR_INVALID_ARGUMENT;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%u/comm", pid);
    FILE *f = fopen(path, "re");
    if (!f) return NVML_ERROR_NOT_FOUND;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    buf[strcspn(buf, "\n")] = 0;
    if (strlen(buf) >= len) return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(name, len, "%s", buf);
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlSystemGetNVMLVersion(char *buf, unsigned int len) {
    if (!buf) return NVML_ERROR_INVALID_ARGUMENT;
    if (len < 16) return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(buf, len, "13.580.00");
    return NVML_SUCCESS;
}

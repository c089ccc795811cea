/* Simulated libnvidia-ml.so.1: NVML discovery, memory, processes and Xid events for the simulated node.
 * Reads the same shared state as the simulated libcuda, so UUIDs, PCI bus IDs and totals agree across
 * the two libraries (PyTorch and the node agent rely on that). Events are injected by
 * memsliceSimInjectXid (`memslice sim xid`) and delivered by nvmlEventSetWait_v2. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <string.h>
#include <time.h>

#include "cuda_api.h"
#include "sim_nvml.h"
#include "simstate.h"

#define API SIM_EXPORT
#define DEV_MAGIC 0x4e564d4cu
#define SET_MAGIC 0x45565331u

struct nvml_dev { uint32_t magic; unsigned index; };
struct nvml_set { uint32_t magic; uint64_t mask[SIM_MAX_GPUS]; uint64_t last_seq; };

static struct nvml_dev g_devs[SIM_MAX_GPUS];
static int g_inited;

static struct sim *node(void) { return g_inited ? sim_get() : NULL; }

static struct nvml_dev *dev_of(nvmlDevice_t d) {
    struct nvml_dev *x = (struct nvml_dev *)d;
    struct sim *s = node();
    return s && x && x->magic == DEV_MAGIC && x->index < s->node->ngpus ? x : NULL;
}

#define DEV_OR_FAIL(d, x) struct nvml_dev *x = dev_of(d); if (!g_inited) return NVML_ERROR_UNINITIALIZED; \
    if (!x) return NVML_ERROR_INVALID_ARGUMENT

API nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    struct sim *s = sim_get();
    if (!s) {
        fprintf(stderr, "%s\n", sim_error());
        return 9; /* NVML_ERROR_DRIVER_NOT_LOADED */
    }
    for (unsigned i = 0; i < SIM_MAX_GPUS; i++) g_devs[i] = (struct nvml_dev){DEV_MAGIC, i};
    g_inited = 1;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
API nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }
API nvmlReturn_t nvmlShutdown(void) { return g_inited ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED; }

API const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    default: return "Unknown Error";
    }
}

API nvmlReturn_t nvmlSystemGetDriverVersion(char *buf, unsigned int len) {
    if (!buf || len < 8) return NVML_ERROR_INVALID_ARGUMENT;
    snprintf(buf, len, "580.00.sim");
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) {
    if (!v) return NVML_ERROR_INVALID_ARGUMENT;
    struct sim *s = sim_get();
    *v = s ? s->driver_version : SIM_DRIVER_VERSION_DEFAULT;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { return nvmlSystemGetCudaDriverVersion_v2(v); }

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) {
    struct sim *s = node();
    if (!s) return NVML_ERROR_UNINITIALIZED;
    if (!n) return NVML_ERROR_INVALID_ARGUMENT;
    *n = s->node->ngpus;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { return nvmlDeviceGetCount_v2(n); }

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    struct sim *s = node();
    if (!s) return NVML_ERROR_UNINITIALIZED;
    if (!d || i >= s->node->ngpus) return NVML_ERROR_INVALID_ARGUMENT;
    *d = (nvmlDevice_t)&g_devs[i];
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d) { return nvmlDeviceGetHandleByIndex_v2(i, d); }

API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d) {
    struct sim *s = node();
    if (!s) return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !d) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < s->node->ngpus; i++)
        if (strcmp(s->node->gpu[i].uuid, uuid) == 0) { *d = (nvmlDevice_t)&g_devs[i]; return NVML_SUCCESS; }
    return NVML_ERROR_NOT_FOUND;
}

static void bus_id(unsigned i, char *buf, size_t len) {
    snprintf(buf, len, "%08X:%02X:%02X.0", 0u, sim_get()->node->gpu[i].pci_bus, 0u);
}

API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus, nvmlDevice_t *d) {
    struct sim *s = node();
    if (!s) return NVML_ERROR_UNINITIALIZED;
    if (!bus || !d) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < s->node->ngpus; i++) {
        char b[32];
        bus_id(i, b, sizeof b);
        if (strcasecmp(b, bus) == 0 || strcasecmp(b + 4, bus) == 0) { *d = (nvmlDevice_t)&g_devs[i]; return NVML_SUCCESS; }
    }
    return NVML_ERROR_NOT_FOUND;
}

API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *buf, unsigned int len) {
    DEV_OR_FAIL(d, x);
    if (!buf) return NVML_ERROR_INVALID_ARGUMENT;
    const char *name = node()->node->gpu[x->index].name;
    if (strlen(name) >= len) return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(buf, len, "%s", name);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *buf, unsigned int len) {
    DEV_OR_FAIL(d, x);
    if (!buf) return NVML_ERROR_INVALID_ARGUMENT;
    const char *u = node()->node->gpu[x->index].uuid;
    if (strlen(u) >= len) return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(buf, len, "%s", u);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *i) {
    DEV_OR_FAIL(d, x);
    if (!i) return NVML_ERROR_INVALID_ARGUMENT;
    *i = x->index;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *m) { return nvmlDeviceGetIndex(d, m); }

API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor) {
    DEV_OR_FAIL(d, x);
    (void)x;
    if (!major || !minor) return NVML_ERROR_INVALID_ARGUMENT;
    *major = 9;
    *minor = 0;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t d, unsigned int *numa) {
    DEV_OR_FAIL(d, x);
    if (!numa) return NVML_ERROR_INVALID_ARGUMENT;
    *numa = (unsigned int)node()->node->gpu[x->index].numa; /* as before: -1 reads back as -1 through a C int */
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending) {
    DEV_OR_FAIL(d, x);
    if (!current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    *current = *pending = node()->node->gpu[x->index].mig;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p) {
    DEV_OR_FAIL(d, x);
    if (!p) return NVML_ERROR_INVALID_ARGUMENT;
    memset(p, 0, sizeof *p);
    p->bus = node()->node->gpu[x->index].pci_bus;
    p->pciDeviceId = 0x233010de;
    bus_id(x->index, p->busId, sizeof p->busId);
    snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "%04X:%02X:%02X.0", 0u, p->bus, 0u);
    return NVML_SUCCESS;
}

/* Physical usage of a GPU, as the simulated node's region has it. */
static uint64_t used_on(unsigned g) {
    region_sweep(&node()->usage);
    return sim_used(node(), (int)g);
}

/* NVML v1, as the driver answers it: the total includes the memory the driver sets aside (reserved), and
 * `used` is "the sum of reserved and allocated" (nvml.h), so total - used is what can still be allocated. */
API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    DEV_OR_FAIL(d, x);
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    const struct sim_gpu *g = &node()->node->gpu[x->index];
    uint64_t cap = g->total, reserved = (uint64_t)g->reserved_mib << 20, used = used_on(x->index);
    if (used > cap) used = cap;
    m->total = cap + reserved;
    m->used = used + reserved;
    m->free = cap - used;
    return NVML_SUCCESS;
}

/* NVML v2 says apart what v1 adds up: total (with reserved), reserved, free, used (allocations only); on an
 * idle H100: 81,559 / 480 / 81,079 / 0 MiB. */
API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    DEV_OR_FAIL(d, x);
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    if (m->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlMemory_t v1;
    nvmlDeviceGetMemoryInfo(d, &v1);
    uint64_t reserved = (uint64_t)node()->node->gpu[x->index].reserved_mib << 20;
    m->total = v1.total;
    m->reserved = reserved;
    m->used = v1.used - reserved;
    m->free = v1.free;
    return NVML_SUCCESS;
}

/* Processes with device memory on GPU g, node-wide (simstate.c), under the PIDs the driver would report. */
struct proc_out { unsigned n, cap; void *infos; int v2; };

static void add_process(void *arg, uint32_t pid, uint64_t bytes) {
    struct proc_out *o = arg;
    if (o->n < o->cap) {
        if (o->v2) ((nvmlProcessInfo_t *)o->infos)[o->n] = (nvmlProcessInfo_t){pid, bytes, 0xFFFFFFFFu, 0xFFFFFFFFu};
        else ((nvmlProcessInfo_v1_t *)o->infos)[o->n] = (nvmlProcessInfo_v1_t){pid, bytes};
    }
    o->n++;
}

static nvmlReturn_t processes(nvmlDevice_t d, unsigned int *count, void *infos, int v2) {
    DEV_OR_FAIL(d, x);
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    struct proc_out o = {0, infos ? *count : 0, infos, v2};
    sim_for_each_process(node(), (int)x->index, add_process, &o);
    nvmlReturn_t rc = o.n > o.cap ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    *count = o.n;
    return rc;
}
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *p) {
    return processes(d, c, p, 1);
}
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *p) {
    return processes(d, c, p, 1);
}
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v1_t *p) {
    return processes(d, c, p, 0);
}

/* NVLink, PCIe topology and affinity: simnvml_topo.c */

/* ---- events -------------------------------------------------------------------------------------- */
static const uint64_t SUPPORTED = nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError |
                                  nvmlEventTypeXidCriticalError;

API nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types) {
    DEV_OR_FAIL(d, x);
    (void)x;
    if (!types) return NVML_ERROR_INVALID_ARGUMENT;
    *types = SUPPORTED;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    struct sim *s = node();
    if (!s) return NVML_ERROR_UNINITIALIZED;
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    struct nvml_set *x = calloc(1, sizeof *x);
    if (!x) return NVML_ERROR_UNKNOWN;
    x->magic = SET_MAGIC;
    sim_refresh_events(s);
    x->last_seq = __atomic_load_n(&s->node->event_seq, __ATOMIC_SEQ_CST); /* only events from now on */
    *set = (nvmlEventSet_t)x;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set) {
    DEV_OR_FAIL(d, x);
    struct nvml_set *es = (struct nvml_set *)set;
    if (!es || es->magic != SET_MAGIC) return NVML_ERROR_INVALID_ARGUMENT;
    if (types & ~SUPPORTED) return NVML_ERROR_NOT_SUPPORTED;
    es->mask[x->index] |= types;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    struct sim *s = node();
    struct nvml_set *es = (struct nvml_set *)set;
    if (!s) return NVML_ERROR_UNINITIALIZED;
    if (!es || es->magic != SET_MAGIC || !data) return NVML_ERROR_INVALID_ARGUMENT;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        sim_refresh_events(s); /* the node file is the only place events are written */
        uint64_t head = __atomic_load_n(&s->node->event_seq, __ATOMIC_SEQ_CST);
        if (head - es->last_seq > SIM_MAX_EVENTS) es->last_seq = head - SIM_MAX_EVENTS; /* overrun: oldest lost */
        while (es->last_seq < head) {
            uint64_t seq = ++es->last_seq;
            struct sim_event *e = &s->node->events[seq % SIM_MAX_EVENTS];
            uint64_t got = __atomic_load_n(&e->seq, __ATOMIC_SEQ_CST);
            if (got < seq) { es->last_seq = seq - 1; break; } /* still being written: look again soon */
            if (got != seq) continue;                          /* overwritten by a newer event */
            if (e->gpu >= s->node->ngpus || !(es->mask[e->gpu] & e->type)) continue;
            memset(data, 0, sizeof *data);
            data->device = (nvmlDevice_t)&g_devs[e->gpu];
            data->eventType = e->type;
            data->eventData = e->data;
            data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFFu;
            return NVML_SUCCESS;
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        long elapsed = (now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000;
        if (elapsed >= (long)timeoutms) return NVML_ERROR_TIMEOUT;
        struct timespec nap = {0, 5 * 1000 * 1000};
        nanosleep(&nap, NULL);
    }
}
API nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    return nvmlEventSetWait_v2(set, data, timeoutms);
}

API nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    struct nvml_set *es = (struct nvml_set *)set;
    if (!es || es->magic != SET_MAGIC) return NVML_ERROR_INVALID_ARGUMENT;
    es->magic = 0;
    free(es);
    return NVML_SUCCESS;
}

/* Simulator control: queue an Xid (critical error) event for GPU `index` on this simulated node.
 * Returns 0, or -1 if the simulator cannot start or the index is out of range. */
API int memsliceSimInjectXid(unsigned int index, unsigned long long xid) {
    struct sim *s = sim_get();
    return s ? sim_inject_xid(s, index, xid) : -1;
}

/* Simulator control: the state file's error, for tools that want to report it. */
API const char *memsliceSimError(void) { return sim_get() ? "" : sim_error(); }

/* ---- for simnvml_monitoring.c (sim_nvml.h) ------------------------------------------------------------ */
/* Validate a handle and give its index. */
nvmlReturn_t sim_nvml_dev(nvmlDevice_t d, unsigned int *index) {
    DEV_OR_FAIL(d, x);
    *index = x->index;
    return NVML_SUCCESS;
}
/* Physical usage, for the power and performance-state model. */
uint64_t sim_nvml_used(unsigned int g) { return used_on(g); }
/* The compute processes (v2/v3 layout). */
nvmlReturn_t sim_nvml_processes(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos) {
    return processes(d, count, infos, 1);
}

/* The simulated node: GPUs, physical usage and NVML events, shared by every process that loads the
 * simulated libcuda.so.1 or libnvidia-ml.so.1 with the same MEMSLICE_SIM_STATE file.
 * Physical usage lives in an ms_region (the same ledger as the shim: devices = the node's GPUs, limit =
 * capacity, one slot per process, dead processes reclaimed); the node description follows it. */
#ifndef MEMSLICE_SIMSTATE_H
#define MEMSLICE_SIMSTATE_H

#include <stdint.h>

#include "memslice_region.h"

#define SIM_MAX_GPUS 16
#define SIM_MAX_EVENTS 64
#define SIM_DRIVER_VERSION_DEFAULT 13000

struct sim_gpu {
    char uuid[48];
    char name[64];
    uint64_t total;        /* bytes */
    int32_t numa;
    uint32_t mig;          /* 1: MIG mode enabled */
    uint32_t pci_bus;
    uint32_t pad;
};

struct sim_event {
    uint64_t seq;          /* 1-based; 0 = empty */
    uint32_t gpu;
    uint32_t pad;
    uint64_t type;         /* nvmlEventType* */
    uint64_t data;         /* the Xid */
};

struct sim_node {
    uint32_t magic;
    uint32_t ngpus;
    char config[256];      /* MEMSLICE_SIM_GPUS as given at creation */
    struct sim_gpu gpu[SIM_MAX_GPUS];
    uint64_t event_seq;    /* events ever written */
    struct sim_event events[SIM_MAX_EVENTS];
};

struct sim {
    ms_ledger ledger;
    struct sim_node *node;
    uint64_t context_overhead;
    int driver_version;
    char error[512];       /* why the simulator could not start, for the first call that asks */
};

/* The process-wide simulator, opened on first use; NULL (and sim_error() says why) if it cannot start. */
struct sim *sim_get(void);
const char *sim_error(void);
/* Parse a MEMSLICE_SIM_GPUS value into node (used at creation). 0 or -1 with a message. */
int sim_parse_gpus(const char *spec, struct sim_node *node, char *err, size_t errlen);
/* Charge/uncharge physical memory to this process on GPU g. */
int sim_charge(struct sim *s, int g, uint64_t n, int host);
void sim_uncharge(struct sim *s, int g, uint64_t n, int host);

#define SIM_EXPORT __attribute__((visibility("default")))

/* Simulator control, exported by the simulated libnvidia-ml.so.1 (used by `memslice sim`). */
int memsliceSimInjectXid(unsigned int index, unsigned long long xid);
const char *memsliceSimError(void);

#endif

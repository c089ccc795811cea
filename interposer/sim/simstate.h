/* The simulated node, kept so that what one container can write is apart from what the others read:
 *  - the node description (MEMSLICE_SIM_STATE): GPUs and the Xid event ring, written by its creator (the
 *    node agent, or the first local process) and read-only to containers; every process reads it with a
 *    bounded pread into private memory and validates it, and never maps it;
 *  - each container's usage region (MEMSLICE_SIM_USAGE, default <state>.usage): an ms_region (devices = the
 *    node's GPUs, limit = capacity, one slot per process, dead processes reclaimed) that only that
 *    container's processes map and write;
 *  - the other containers' usage regions (files NAME.usage, or DIR/sim.usage, in MEMSLICE_SIM_PEERS), read with
 *    bounded preads and validated: a truncated, garbage, FIFO or symlinked file counts as empty and can
 *    neither crash nor hang the reader;
 *  - a node lock file (MEMSLICE_SIM_LOCK, default <state>.lock), used only for fcntl locks with a bounded
 *    wait, so that two containers' charges do not both take the last free bytes. */
#ifndef MEMSLICE_SIMSTATE_H
#define MEMSLICE_SIMSTATE_H

#include <stdint.h>

#include "memslice_region.h"

#define SIM_MAX_GPUS 16
#define SIM_MAX_EVENTS 64
#define SIM_DRIVER_VERSION_DEFAULT 13000
/* What a context costs on the simulated GPU unless MEMSLICE_SIM_CONTEXT_OVERHEAD says otherwise: what a
 * PyTorch context took on an H100 with driver 580 (518-523 MiB; shared/reference/real-gpu.md). */
#define SIM_CONTEXT_OVERHEAD_DEFAULT (520ull << 20)

struct sim_gpu {
    char uuid[48];
    char name[64];
    uint64_t total;        /* bytes */
    int32_t numa;
    uint32_t mig;          /* 1: MIG mode enabled */
    uint32_t pci_bus;
    uint32_t reserved_mib; /* memory the driver sets aside: in NVML's total, never allocatable (CUDA's total
                              is `total`); MEMSLICE_SIM_RESERVED, default 480 MiB per 80 GiB */
};

struct sim_event {
    uint64_t seq;          /* 1-based; 0 = empty */
    uint32_t gpu;
    uint32_t pad;
    uint64_t type;         /* nvmlEventType* */
    uint64_t data;         /* the Xid */
};

#define SIM_NODE_MAGIC 0x53494d32u /* "SIM2": the description-only node file */
#define SIM_TOPO_MAGIC 0x544f5031u /* "TOP1": the topology part is present */

/* How the GPUs are connected (MEMSLICE_SIM_GPUS `;nvlink=` and `;pcie=`, simtopo.c). Appended to the node file
 * after the event ring, so a file written before it existed reads as "no topology" (magic 0): every GPU on its
 * own PCIe switch, no NVLink. */
struct sim_topo {
    uint32_t magic;
    uint32_t pad;
    uint16_t nvlink[SIM_MAX_GPUS]; /* bit j of nvlink[i]: GPUs i and j are linked (symmetric, never i itself) */
    uint8_t pcie[SIM_MAX_GPUS];    /* PCIe switch group + 1 (0: a switch of its own) */
};

struct sim_node {
    uint32_t magic;
    uint32_t ngpus;
    char config[256];      /* MEMSLICE_SIM_GPUS as given at creation */
    struct sim_gpu gpu[SIM_MAX_GPUS];
    uint64_t event_seq;    /* events ever written */
    struct sim_event events[SIM_MAX_EVENTS];
    struct sim_topo topo;  /* last: see struct sim_topo */
};

struct sim {
    region_handle usage;       /* this container's usage region */
    struct sim_node *node; /* = &node_copy */
    struct sim_node node_copy; /* the validated description; events refreshed by sim_refresh_events */
    uint64_t context_overhead;
    int driver_version;
    int node_fd;           /* the description, read-only */
    int lock_fd;           /* the node lock, or -1 (then charges are not serialised across containers) */
    char state_path[256];
    char peers[256];       /* directory of the other containers' usage files; "" = none */
    char error[512];       /* why the simulator could not start, for the first call that asks */
};

/* The process-wide simulator, opened on first use; NULL (and sim_error() says why) if it cannot start. */
struct sim *sim_get(void);
const char *sim_error(void);
/* Parse a MEMSLICE_SIM_GPUS value into node (used at creation). 0 or -1 with a message. */
int sim_parse_gpus(const char *spec, struct sim_node *node, char *err, size_t errlen);
/* simtopo.c: parse the `;key=groups` options after the GPU list into node->topo (0, or -1 with a message), and
 * what the topology answers. GPU indices are the node's (NVML's), not CUDA ordinals. */
int sim_parse_topo(const char *opts, const char *spec, struct sim_node *node, char *err, size_t errlen);
int sim_topo_valid(const struct sim_node *node);
int sim_nvlinked(const struct sim_node *node, unsigned a, unsigned b);
/* nvmlGpuTopologyLevel_t of the path between a and b: 0 (the same GPU), 10 (one PCIe switch), 40 (the same NUMA
 * node), 50 (across NUMA nodes). */
int sim_topo_level(const struct sim_node *node, unsigned a, unsigned b);
/* Whether a may access b's memory directly (cuDeviceCanAccessPeer): NVLink, or PCIe within a NUMA node. */
int sim_p2p(const struct sim_node *node, unsigned a, unsigned b);
/* The GPU at the far end of GPU g's NVLink `link` (links numbered by peer index), or -1. */
int sim_nvlink_peer(const struct sim_node *node, unsigned g, unsigned link);
/* Charge/uncharge physical memory to this process on GPU g. */
int sim_charge(struct sim *s, int g, uint64_t n, int host);
void sim_uncharge(struct sim *s, int g, uint64_t n, int host);
/* Device bytes in use on GPU g across the node: this container's region plus its peers'. */
uint64_t sim_used(struct sim *s, int g);
/* Each live process of the node with device memory on GPU g: fn(arg, pid as the driver reports it, bytes). */
typedef void (*sim_process_fn)(void *arg, uint32_t pid, uint64_t bytes);
void sim_for_each_process(struct sim *s, int g, sim_process_fn fn, void *arg);
/* Re-read the node's event ring into s->node (bounded pread; a description that no longer validates is
 * ignored). */
void sim_refresh_events(struct sim *s);
/* Append an Xid event (needs write access to the description: the agent or the local user). 0 or -1. */
int sim_inject_xid(struct sim *s, unsigned int gpu, uint64_t xid);

#define SIM_EXPORT __attribute__((visibility("default")))

/* Simulator control, exported by the simulated libnvidia-ml.so.1 (used by `memslice sim`). */
int memsliceSimInjectXid(unsigned int index, unsigned long long xid);
const char *memsliceSimError(void);

/* Counters of the simulated libcuda.so.1 (simcuda_counters.c), per process, in this order: pins (cuMemHostAlloc
 * and cuMemHostRegister calls) and their bytes, host-located cuMemCreate calls and their bytes, copies
 * (cuMemcpy and every variant that reaches it) and their bytes; then (simcuda_inflight.c) asynchronous copies
 * and their bytes, unmaps of memory under a copy still in flight and their bytes, and the most copies in
 * flight at once on created streams (a high-water figure); then (simcuda_vmm.c) cuMemUnmap calls and their
 * bytes, and the calls among them that unmapped several mappings at once and how many mappings those were;
 * host-located handles released and their bytes (a pinned chunk given back). memsliceSimCounters(out, n) fills at most n
 * and returns how many there are; a program finds it with dlsym (a real driver has no such symbol). */
enum { SIM_C_PINS, SIM_C_PIN_BYTES, SIM_C_HOST_CREATES, SIM_C_HOST_CREATE_BYTES, SIM_C_COPIES, SIM_C_COPY_BYTES,
       SIM_C_ASYNC_COPIES, SIM_C_ASYNC_COPY_BYTES, SIM_C_UNMAPS_IN_FLIGHT, SIM_C_UNMAP_IN_FLIGHT_BYTES,
       SIM_C_ASYNC_IN_FLIGHT_MAX, SIM_C_UNMAPS, SIM_C_UNMAP_BYTES, SIM_C_RUN_UNMAPS, SIM_C_RUN_UNMAP_MAPPINGS,
       SIM_C_HOST_RELEASES, SIM_C_HOST_RELEASE_BYTES, SIM_COUNTERS };
unsigned int memsliceSimCounters(unsigned long long *out, unsigned int n);

#endif

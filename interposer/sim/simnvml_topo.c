/* Simulated NVML: the topology queries (PCIe common ancestor, P2P status, NVLink state and far ends, CPU and
 * memory affinity), answered from the node's topology (simtopo.c). What a node agent reads to publish which
 * GPUs are close: signatures and values as nvml.h (sim_topo.h). */
#define _GNU_SOURCE
#include <string.h>
#include <unistd.h>

#include "cuda_api.h"
#include "sim_nvml.h"
#include "sim_topo.h"
#include "simstate.h"

#define API SIM_EXPORT

/* The node description (valid once a handle has been checked by sim_nvml_dev). */
static const struct sim_node *nodedesc(void) { return sim_get()->node; }

/* Two handles' indices, or the error for the first bad one. */
static nvmlReturn_t two_devs(nvmlDevice_t d1, nvmlDevice_t d2, unsigned *a, unsigned *b) {
    nvmlReturn_t rc = sim_nvml_dev(d1, a);
    return rc != NVML_SUCCESS ? rc : sim_nvml_dev(d2, b);
}

/* The PCIe path between two GPUs (NVLink is not a PCIe level: see nvmlDeviceGetP2PStatus). */
API nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t d1, nvmlDevice_t d2, nvmlGpuTopologyLevel_t *path) {
    unsigned a, b;
    nvmlReturn_t rc = two_devs(d1, d2, &a, &b);
    if (rc != NVML_SUCCESS) return rc;
    if (!path) return NVML_ERROR_INVALID_ARGUMENT;
    *path = (nvmlGpuTopologyLevel_t)sim_topo_level(nodedesc(), a, b);
    return NVML_SUCCESS;
}

/* P2P between two GPUs: read/write/PCI over NVLink or within a NUMA node; NVLink and atomics over NVLink. */
API nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t d1, nvmlDevice_t d2, nvmlGpuP2PCapsIndex_t index,
                                        nvmlGpuP2PStatus_t *status) {
    unsigned a, b;
    nvmlReturn_t rc = two_devs(d1, d2, &a, &b);
    if (rc != NVML_SUCCESS) return rc;
    if (!status || (unsigned)index >= NVML_P2P_CAPS_INDEX_UNKNOWN) return NVML_ERROR_INVALID_ARGUMENT;
    const struct sim_node *n = nodedesc();
    int ok;
    if (index == NVML_P2P_CAPS_INDEX_NVLINK || index == NVML_P2P_CAPS_INDEX_ATOMICS) ok = sim_nvlinked(n, a, b);
    else ok = sim_p2p(n, a, b);
    if (ok) *status = NVML_P2P_STATUS_OK;
    else if (a != b && index != NVML_P2P_CAPS_INDEX_NVLINK && index != NVML_P2P_CAPS_INDEX_ATOMICS)
        *status = NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED; /* across NUMA nodes */
    else *status = NVML_P2P_STATUS_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

/* A GPU with no NVLink answers NOT_SUPPORTED (as a PCIe card does); link k is active when it has a far end. */
static nvmlReturn_t link_peer(nvmlDevice_t d, unsigned link, int *peer) {
    unsigned g;
    nvmlReturn_t rc = sim_nvml_dev(d, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (link >= NVML_NVLINK_MAX_LINKS) return NVML_ERROR_INVALID_ARGUMENT;
    if (!nodedesc()->topo.nvlink[g]) return NVML_ERROR_NOT_SUPPORTED;
    *peer = sim_nvlink_peer(nodedesc(), g, link);
    return NVML_SUCCESS;
}

/* Whether NVLink `link` of the GPU is active. */
API nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, nvmlEnableState_t *active) {
    int peer;
    nvmlReturn_t rc = link_peer(d, link, &peer);
    if (rc != NVML_SUCCESS) return rc;
    if (!active) return NVML_ERROR_INVALID_ARGUMENT;
    *active = peer >= 0 ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

/* What is at the far end of a link: a GPU (links are GPU to GPU here), unknown for an inactive link. */
API nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t d, unsigned int link, nvmlIntNvLinkDeviceType_t *type) {
    int peer;
    nvmlReturn_t rc = link_peer(d, link, &peer);
    if (rc != NVML_SUCCESS) return rc;
    if (!type) return NVML_ERROR_INVALID_ARGUMENT;
    *type = peer >= 0 ? NVML_NVLINK_DEVICE_TYPE_GPU : NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
    return NVML_SUCCESS;
}

/* The PCI identity of the GPU at the far end of a link (how a reader pairs links with GPUs). */
API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t d, unsigned int link, nvmlPciInfo_t *pci) {
    int peer;
    nvmlReturn_t rc = link_peer(d, link, &peer);
    if (rc != NVML_SUCCESS) return rc;
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    if (peer < 0) return NVML_ERROR_NOT_SUPPORTED;
    nvmlDevice_t far;
    rc = nvmlDeviceGetHandleByIndex_v2((unsigned)peer, &far);
    return rc != NVML_SUCCESS ? rc : nvmlDeviceGetPciInfo_v3(far, pci);
}

/* The host CPUs of NUMA node `numa`: the machine's CPUs split evenly over the node's NUMA nodes (0 .. the
 * highest a GPU names), at least one each. */
static void numa_cpus(int numa, long *first, long *count) {
    long cpus = sysconf(_SC_NPROCESSORS_CONF);
    int nodes = 1;
    const struct sim_node *n = nodedesc();
    for (unsigned i = 0; i < n->ngpus; i++)
        if (n->gpu[i].numa + 1 > nodes) nodes = n->gpu[i].numa + 1;
    if (cpus < 1) cpus = 1;
    *first = (long)numa * cpus / nodes;
    *count = (long)(numa + 1) * cpus / nodes - *first;
    if (*count < 1) {
        *first = numa % cpus;
        *count = 1;
    }
}

/* The CPUs near the GPU (its NUMA node's; a socket is a NUMA node here), 64 per unsigned long. */
API nvmlReturn_t nvmlDeviceGetCpuAffinityWithinScope(nvmlDevice_t d, unsigned int size, unsigned long *set,
                                                     nvmlAffinityScope_t scope) {
    unsigned g;
    nvmlReturn_t rc = sim_nvml_dev(d, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (!set || size == 0 || scope > NVML_AFFINITY_SCOPE_SOCKET) return NVML_ERROR_INVALID_ARGUMENT;
    long first, count;
    numa_cpus(nodedesc()->gpu[g].numa, &first, &count);
    memset(set, 0, size * sizeof *set);
    for (long c = first; c < first + count && (unsigned long)c < (unsigned long)size * 64; c++)
        set[c / 64] |= 1ul << (c % 64);
    return NVML_SUCCESS;
}

/* nvmlDeviceGetCpuAffinityWithinScope with the NUMA-node scope. */
API nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t d, unsigned int size, unsigned long *set) {
    return nvmlDeviceGetCpuAffinityWithinScope(d, size, set, NVML_AFFINITY_SCOPE_NODE);
}

/* The NUMA nodes near the GPU: its own. */
API nvmlReturn_t nvmlDeviceGetMemoryAffinity(nvmlDevice_t d, unsigned int size, unsigned long *set,
                                             nvmlAffinityScope_t scope) {
    unsigned g;
    nvmlReturn_t rc = sim_nvml_dev(d, &g);
    if (rc != NVML_SUCCESS) return rc;
    if (!set || size == 0 || scope > NVML_AFFINITY_SCOPE_SOCKET) return NVML_ERROR_INVALID_ARGUMENT;
    int numa = nodedesc()->gpu[g].numa;
    memset(set, 0, size * sizeof *set);
    if ((unsigned)numa < size * 64u) set[numa / 64] |= 1ul << (numa % 64);
    return NVML_SUCCESS;
}

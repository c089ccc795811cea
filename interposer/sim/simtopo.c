/* The simulated node's topology: which GPUs share an NVLink, which share a PCIe switch (MEMSLICE_SIM_GPUS
 * options after the GPU list), and what the CUDA and NVML topology queries answer from it. Built into both
 * simulated libraries; pure functions of the node description (validated on every read, simstate.c).
 *
 *   MEMSLICE_SIM_GPUS = GPUS [;nvlink=GROUPS] [;pcie=GROUPS]      GROUPS = GROUP[,GROUP...]  GROUP = i-j[-k...]
 *
 * nvlink: every two GPUs of a group are linked (`0-1,2-3` pairs; `0-1-2-3` all-to-all, as through an
 * NVSwitch); a GPU may be in several groups. pcie: the GPUs of a group sit behind one PCIe switch; a GPU is
 * in at most one group (else on a switch of its own). NUMA nodes are the GPUs' `:NUMA` fields. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "simstate.h"

#define LEVEL_SAME 0     /* NVML_TOPOLOGY_INTERNAL */
#define LEVEL_SWITCH 10  /* NVML_TOPOLOGY_SINGLE */
#define LEVEL_NUMA 40    /* NVML_TOPOLOGY_NODE */
#define LEVEL_SYSTEM 50  /* NVML_TOPOLOGY_SYSTEM */

/* One group "i-j[-k..]" into a bitmask of GPU indices (< ngpus, none twice, at least two); 0 if invalid. */
static uint32_t parse_group(const char *g, size_t len, unsigned ngpus) {
    uint32_t mask = 0;
    unsigned count = 0;
    const char *p = g, *end = g + len;
    while (p < end) {
        if (*p < '0' || *p > '9') return 0;
        unsigned v = 0;
        while (p < end && *p >= '0' && *p <= '9' && v < 100) v = v * 10 + (unsigned)(*p++ - '0');
        if (v >= ngpus || (mask & (1u << v))) return 0;
        mask |= 1u << v;
        count++;
        if (p < end && *p++ != '-') return 0;
        if (p == end && p[-1] == '-') return 0;
    }
    return count >= 2 ? mask : 0;
}

/* Apply one option's groups to the topology; the bad group (or NULL) is copied to `bad`. 0, or -1. */
static int apply_groups(int nvlink, const char *val, struct sim_node *node, char *bad, size_t badlen) {
    uint8_t next_switch = 1;
    const char *p = val;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        uint32_t mask = parse_group(p, len, node->ngpus);
        for (unsigned i = 0; mask && !nvlink && i < node->ngpus; i++)
            if ((mask & (1u << i)) && node->topo.pcie[i]) mask = 0; /* a GPU behind two switches */
        if (!mask) {
            snprintf(bad, badlen, "%.*s", (int)(len < 64 ? len : 64), p);
            return -1;
        }
        for (unsigned i = 0; i < node->ngpus; i++) {
            if (!(mask & (1u << i))) continue;
            if (nvlink) node->topo.nvlink[i] |= (uint16_t)(mask & ~(1u << i));
            else node->topo.pcie[i] = next_switch;
        }
        next_switch++;
        if (!comma) return 0;
        p = comma + 1;
    }
}

/* Parse "nvlink=GROUPS;pcie=GROUPS" (either, each at most once; NULL or "" = no topology). */
int sim_parse_topo(const char *opts, const char *spec, struct sim_node *node, char *err, size_t errlen) {
    memset(&node->topo, 0, sizeof node->topo);
    node->topo.magic = SIM_TOPO_MAGIC;
    char buf[256], bad[80] = "";
    snprintf(buf, sizeof buf, "%s", opts ? opts : "");
    int seen_nv = 0, seen_pcie = 0;
    char *save = NULL;
    for (char *opt = strtok_r(buf, ";", &save); opt; opt = strtok_r(NULL, ";", &save)) {
        int nv = strncmp(opt, "nvlink=", 7) == 0, pcie = strncmp(opt, "pcie=", 5) == 0;
        if ((!nv && !pcie) || (nv && seen_nv++) || (pcie && seen_pcie++)) {
            snprintf(err, errlen, "MEMSLICE_SIM_GPUS=%s: option %.40s is unknown or given twice; after the GPU list "
                     "use ;nvlink=GROUPS and ;pcie=GROUPS once each, e.g. 80GiB,80GiB;nvlink=0-1", spec, opt);
            return -1;
        }
        if (apply_groups(nv, strchr(opt, '=') + 1, node, bad, sizeof bad) < 0) {
            snprintf(err, errlen, "MEMSLICE_SIM_GPUS=%s: %s group '%s' is not valid; a group is two or more GPU "
                     "indices below %u joined by '-' (0-1 or 0-1-2-3), groups separated by ','%s", spec,
                     nv ? "nvlink" : "pcie", bad, node->ngpus, nv ? "" : ", each GPU in one pcie group at most");
            return -1;
        }
    }
    return 0;
}

/* Does a topology read from disk make sense (symmetric links, indices within the node)? No magic: none. */
int sim_topo_valid(const struct sim_node *node) {
    const struct sim_topo *t = &node->topo;
    if (t->magic == 0) {
        for (unsigned i = 0; i < SIM_MAX_GPUS; i++)
            if (t->nvlink[i] || t->pcie[i]) return 0;
        return 1;
    }
    if (t->magic != SIM_TOPO_MAGIC) return 0;
    for (unsigned i = 0; i < SIM_MAX_GPUS; i++) {
        if (i >= node->ngpus && (t->nvlink[i] || t->pcie[i])) return 0;
        if (t->nvlink[i] & (1u << i) || t->nvlink[i] >> node->ngpus) return 0;
        for (unsigned j = 0; j < node->ngpus; j++)
            if (((t->nvlink[i] >> j) & 1) != ((t->nvlink[j] >> i) & 1)) return 0;
    }
    return 1;
}

/* Whether GPUs a and b share an NVLink. */
int sim_nvlinked(const struct sim_node *node, unsigned a, unsigned b) {
    return a < node->ngpus && b < node->ngpus && ((node->topo.nvlink[a] >> b) & 1);
}

/* The PCIe path between a and b, as nvmlDeviceGetTopologyCommonAncestor names it. */
int sim_topo_level(const struct sim_node *node, unsigned a, unsigned b) {
    if (a == b) return LEVEL_SAME;
    if (node->topo.pcie[a] && node->topo.pcie[a] == node->topo.pcie[b]) return LEVEL_SWITCH;
    return node->gpu[a].numa == node->gpu[b].numa ? LEVEL_NUMA : LEVEL_SYSTEM;
}

/* Direct access between two different GPUs: over NVLink, or over PCIe without crossing NUMA nodes (the
 * inter-socket link does not carry P2P on most platforms). */
int sim_p2p(const struct sim_node *node, unsigned a, unsigned b) {
    if (a == b || a >= node->ngpus || b >= node->ngpus) return 0;
    return sim_nvlinked(node, a, b) || sim_topo_level(node, a, b) <= LEVEL_NUMA;
}

/* Link k of GPU g leads to its k-th linked GPU in index order. */
int sim_nvlink_peer(const struct sim_node *node, unsigned g, unsigned link) {
    if (g >= node->ngpus) return -1;
    unsigned k = 0;
    for (unsigned j = 0; j < node->ngpus; j++)
        if ((node->topo.nvlink[g] >> j) & 1) {
            if (k == link) return (int)j;
            k++;
        }
    return -1;
}

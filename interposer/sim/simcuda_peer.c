/* Simulated driver: several GPUs in one process. CUDA_VISIBLE_DEVICES (which GPUs of the node CUDA numbers, in
 * that order) and peer access between them, answered from the node's topology (simtopo.c).
 *
 * Visibility, as the driver reads it: a comma list of GPU indices or UUIDs ("GPU-" and a unique prefix); the
 * list ends at the first entry that names no GPU, or one already listed; unset = every GPU (or, as a container
 * runtime would give them, those NVIDIA_VISIBLE_DEVICES names); empty = none
 * (cuInit answers CUDA_ERROR_NO_DEVICE). Device ordinals (CUdevice) count the visible GPUs; what the node
 * keeps per GPU (memory, GPU time) is indexed by the node's index (sim_phys). NVML ignores the variable.
 *
 * Peer access is a property of a pair of contexts, one way (cuda.h): enabled by cuCtxEnablePeerAccess from the
 * current context to a peer context on another GPU that cuDeviceCanAccessPeer allows, disabled by
 * cuCtxDisablePeerAccess, dropped when either context is destroyed. It allocates no device memory. Copies
 * between GPUs (cuMemcpyPeer, cuMemcpy on unified addresses) work without it, as on the real driver, which
 * stages them; what it gates on hardware is kernels dereferencing peer memory, and kernels here touch no
 * memory. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "sim_internal.h"
#include "sim_topo.h"
#include "simcuda.h"

#define MAX_PEER_PAIRS 256  /* enabled (from, to) context pairs in a process */
#define MAX_PEERS_PER_CTX 8 /* hardware peer slots per context without NVSwitch (CUDA programming guide) */

/* ordinal -> node index: identity until cuInit reads the list (ordinals past it stay identity: callers validate) */
int g_vis[SIM_MAX_GPUS] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
int g_nvis;
static pthread_once_t g_vis_once = PTHREAD_ONCE_INIT;

/* The node GPU an entry names (an index, or a unique UUID prefix of at least "GPU-x"), or -1. */
static int visible_entry(const struct sim_node *n, const char *e, size_t len) {
    if (len == 0) return -1;
    if (strncmp(e, "GPU-", 4) == 0) {
        int found = -1;
        if (len < 5) return -1;
        for (unsigned g = 0; g < n->ngpus; g++)
            if (strncmp(n->gpu[g].uuid, e, len) == 0 && strlen(n->gpu[g].uuid) >= len) {
                if (found >= 0) return -1; /* ambiguous prefix */
                found = (int)g;
            }
        return found;
    }
    unsigned v = 0;
    for (size_t i = 0; i < len; i++) {
        if (e[i] < '0' || e[i] > '9' || v > 1000) return -1;
        v = v * 10 + (unsigned)(e[i] - '0');
    }
    return v < n->ngpus ? (int)v : -1;
}

/* The list a container's GPUs come from where CUDA_VISIBLE_DEVICES is unset: NVIDIA_VISIBLE_DEVICES naming GPUs
 * (UUIDs or indices), which on a real node the NVIDIA container runtime turns into the only device nodes the
 * container has; the simulator has no device nodes, so it applies the list itself. "all", "void", "none" and
 * empty restrict nothing here (the agent itself runs with "void" and reads the node through NVML). NULL: none. */
static const char *runtime_visible(void) {
    const char *v = getenv("NVIDIA_VISIBLE_DEVICES");
    if (!v || !*v || !strcmp(v, "all") || !strcmp(v, "void") || !strcmp(v, "none")) return NULL;
    return v;
}

/* Read CUDA_VISIBLE_DEVICES (else the runtime's list) once per process, as the driver does at initialisation. */
static void read_visible(void) {
    struct sim *s = sim_get();
    if (!s) return;
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (!v) v = runtime_visible();
    if (!v) {
        for (unsigned g = 0; g < s->node->ngpus; g++) g_vis[g] = (int)g;
        __atomic_store_n(&g_nvis, (int)s->node->ngpus, __ATOMIC_RELEASE);
        return;
    }
    const char *p = v;
    int n = 0;
    while (*p && n < SIM_MAX_GPUS) {
        while (*p == ' ') p++;
        size_t len = strcspn(p, ", ");
        int g = visible_entry(s->node, p, len);
        for (int i = 0; g >= 0 && i < n; i++)
            if (g_vis[i] == g) g = -1;
        if (g < 0) break;
        g_vis[n++] = g;
        p += len;
        while (*p == ' ') p++;
        if (*p != ',') break;
        p++;
    }
    __atomic_store_n(&g_nvis, n, __ATOMIC_RELEASE);
}

/* How many GPUs CUDA numbers in this process. */
int sim_visible_count(void) {
    pthread_once(&g_vis_once, read_visible);
    return g_nvis;
}

/* The node's index of device ordinal d (d itself where it is no visible ordinal: callers validate first). The
 * charges' fast path uses SIM_PHYS (simcuda.h), valid once cuInit has read the list. */
int sim_phys(int d) {
    pthread_once(&g_vis_once, read_visible);
    return d >= 0 && d < g_nvis ? g_vis[d] : d;
}

/* The device ordinal of node GPU g, or -1 if this process does not see it. */
int sim_ordinal(int g) {
    pthread_once(&g_vis_once, read_visible);
    for (int i = 0; i < g_nvis; i++)
        if (g_vis[i] == g) return i;
    return -1;
}

/* Whether memory on node GPU g can be mapped for context c: its own GPU, or one it may access as a peer. */
int sim_ctx_can_reach(CUcontext c, int g) {
    int d = sim_ctx_device(c);
    if (d < 0 || !S() || g < 0 || (unsigned)g >= S()->node->ngpus) return 0;
    return sim_phys(d) == g || sim_p2p(S()->node, (unsigned)sim_phys(d), (unsigned)g);
}

/* ---- peer capability ------------------------------------------------------------------------------------ */
/* Whether contexts on dev can access memory on peerDev (never a device itself: it needs no peer access). */
API CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer) {
    NEED_INIT();
    if (!can) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev) || !valid_dev(peer)) return CUDA_ERROR_INVALID_DEVICE;
    *can = sim_p2p(S()->node, (unsigned)sim_phys(dev), (unsigned)sim_phys(peer));
    return CUDA_SUCCESS;
}

/* Attributes of the link between two different devices: access and array access where P2P is possible,
 * native atomics over NVLink only, performance rank 0 (the best) over NVLink, 1 over PCIe. */
API CUresult cuDeviceGetP2PAttribute(int *value, CUdevice_P2PAttribute attrib, CUdevice src, CUdevice dst) {
    NEED_INIT();
    if (!valid_dev(src) || !valid_dev(dst) || src == dst) return CUDA_ERROR_INVALID_DEVICE;
    if (!value || attrib < CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK ||
        attrib > CU_DEVICE_P2P_ATTRIBUTE_ONLY_PARTIAL_NATIVE_ATOMIC_SUPPORTED)
        return CUDA_ERROR_INVALID_VALUE;
    const struct sim_node *n = S()->node;
    unsigned a = (unsigned)sim_phys(src), b = (unsigned)sim_phys(dst);
    int p2p = sim_p2p(n, a, b), nv = sim_nvlinked(n, a, b);
    switch (attrib) {
    case CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK: *value = p2p ? !nv : 0; break;
    case CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED: *value = nv; break;
    case CU_DEVICE_P2P_ATTRIBUTE_ONLY_PARTIAL_NATIVE_ATOMIC_SUPPORTED: *value = 0; break;
    default: *value = p2p; break;
    }
    return CUDA_SUCCESS;
}

/* ---- peer access between contexts ------------------------------------------------------------------------ */
struct pair { const void *from, *to; };
static struct pair g_pairs[MAX_PEER_PAIRS];
static pthread_mutex_t g_peer_mu = PTHREAD_MUTEX_INITIALIZER;

/* The slot of (from, to), or -1. Caller holds g_peer_mu. */
static int find_pair(const void *from, const void *to) {
    for (int i = 0; i < MAX_PEER_PAIRS; i++)
        if (g_pairs[i].from == from && g_pairs[i].to == to) return i;
    return -1;
}

/* How many peers `from` has enabled. Caller holds g_peer_mu. */
static int peers_of(const void *from) {
    int n = 0;
    for (int i = 0; i < MAX_PEER_PAIRS; i++) n += g_pairs[i].from == from;
    return n;
}

/* Enable access from the current context to peerContext's memory (see the file comment for the rules). */
API CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
    NEED_INIT();
    int pdev = sim_ctx_device(peer);
    if (!t_ctx || pdev < 0 || peer == (CUcontext)t_ctx) return CUDA_ERROR_INVALID_CONTEXT;
    if (flags) return CUDA_ERROR_INVALID_VALUE;
    if (pdev == t_ctx->dev ||
        !sim_p2p(S()->node, (unsigned)sim_phys(t_ctx->dev), (unsigned)sim_phys(pdev)))
        return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
    pthread_mutex_lock(&g_peer_mu);
    CUresult rc = CUDA_SUCCESS;
    int free_slot = find_pair(NULL, NULL);
    if (find_pair(t_ctx, peer) >= 0) rc = CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
    else if (free_slot < 0 || peers_of(t_ctx) >= MAX_PEERS_PER_CTX) rc = CUDA_ERROR_TOO_MANY_PEERS;
    else g_pairs[free_slot] = (struct pair){t_ctx, peer};
    pthread_mutex_unlock(&g_peer_mu);
    return rc;
}

/* Disable what cuCtxEnablePeerAccess enabled; CUDA_ERROR_PEER_ACCESS_NOT_ENABLED if it was not. */
API CUresult cuCtxDisablePeerAccess(CUcontext peer) {
    NEED_INIT();
    if (!t_ctx || sim_ctx_device(peer) < 0) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&g_peer_mu);
    int i = find_pair(t_ctx, peer);
    if (i >= 0) g_pairs[i] = (struct pair){NULL, NULL};
    pthread_mutex_unlock(&g_peer_mu);
    return i >= 0 ? CUDA_SUCCESS : CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
}

/* A context is destroyed: access from and to it goes with it. */
void sim_peer_forget(const void *ctx) {
    pthread_mutex_lock(&g_peer_mu);
    for (int i = 0; i < MAX_PEER_PAIRS; i++)
        if (g_pairs[i].from == ctx || g_pairs[i].to == ctx) g_pairs[i] = (struct pair){NULL, NULL};
    pthread_mutex_unlock(&g_peer_mu);
}

/* Private interface of the simulated libcuda.so.1 (sim/simcuda_*.c), one file per family of the driver
 * API: what the families share (the pointer table, the slow-path lock, the current context, the pools
 * that synchronisation trims, and the physical accounting helpers). Nothing here is exported; the
 * exported functions are declared once, in include/cuda_api.h.
 *
 * What the simulator models: devices (from the shared node state), primary and explicit contexts (each
 * process's first context on a GPU takes MEMSLICE_SIM_CONTEXT_OVERHEAD of device memory), device,
 * pitched, managed, stream-ordered (pools with reserved vs used memory), VMM and array allocations,
 * pinned host memory, memcpy/memset, pointer attributes and cuGetProcAddress with the documented
 * version/flag rules. Physical capacity is shared by every process of the simulated node and is never
 * exceeded: an allocation that does not fit returns CUDA_ERROR_OUT_OF_MEMORY, exactly as a full GPU
 * would. Kernels compute nothing but take GPU time on the node's shared timeline (simtimeline.h,
 * simcuda_launch.c): "device memory" is host memory, so copies and memsets are memcpy/memset. Linked with -Bsymbolic so that cuGetProcAddress hands out this library's own functions
 * even when the shim (which defines the same names) is preloaded. */
#ifndef MEMSLICE_SIMCUDA_H
#define MEMSLICE_SIMCUDA_H

#include <pthread.h>
#include <stdint.h>

#include "cuda_api.h"
#include "ms_ptrmap.h"
#include "simstate.h"

#define API SIM_EXPORT
#define SMALL_ALLOC (1u << 20)     /* below this, malloc; above, an mmap'd range */
#define VMM_GRANULARITY (2u << 20)

enum kind { K_DEVICE = 1, K_MANAGED, K_POOL, K_HOST, K_REGISTERED, K_VMM_RANGE, K_ARRAY, K_MIPMAP };

/* A context: its device and its limits (cuCtxSetLimit); `extra` is the device memory its limits take beyond
 * what the context overhead already covers (the defaults below). */
struct sim_ctx { uint32_t magic; int dev; int primary; uint64_t stack, fifo, heap, extra; };
/* Context limits as on an H100: local memory for the stack of every resident thread (132 SMs x 2048
 * threads: 256 KiB of stack takes 67,320 MiB more than the default 1 KiB), a printf FIFO and a malloc heap. */
#define SIM_RESIDENT_THREADS (132ull * 2048ull)
#define SIM_DEFAULT_STACK 1024ull
#define SIM_DEFAULT_FIFO (1ull << 20)
#define SIM_DEFAULT_HEAP (8ull << 20)
/* A module image the simulator recognises: these 8 bytes, then the bytes of its __device__ globals as a
 * little-endian uint64 (what cuModuleLoadData and cuLibraryLoadData take on the device). Any other image
 * is refused as CUDA_ERROR_INVALID_IMAGE, as the driver refuses what it cannot load. */
#define SIM_MODULE_MAGIC "MSSIMMOD"

struct pool_block { uint64_t ptr, size; struct pool_block *next; };
struct sim_pool {
    uint32_t magic; int dev; uint64_t reserved, used, reserved_high, used_high, threshold, max_size;
    struct pool_block *cached;
};

#define CTX_MAGIC 0x43545831u
#define POOL_MAGIC 0x504f4f4cu

#pragma GCC visibility push(hidden)
extern ms_ptrmap g_ptrs;                 /* every simulated allocation, by address */
extern pthread_mutex_t g_mu;             /* contexts, pools, VMM mappings: slow paths */
extern int g_initialized;                /* cuInit succeeded */
extern struct sim_ctx g_primary[SIM_MAX_GPUS];
extern struct sim_pool g_default_pool[SIM_MAX_GPUS];
extern struct sim_pool *g_current_pool[SIM_MAX_GPUS];
extern __thread struct sim_ctx *t_ctx;   /* the calling thread's current context */

/* simcuda_peer.c: CUDA_VISIBLE_DEVICES and peer access */
int sim_visible_count(void);             /* GPUs CUDA numbers in this process */
int sim_phys(int d);                     /* the node's index of device ordinal d */
extern int g_vis[SIM_MAX_GPUS];          /* ordinal -> node index (identity past the visible ones) */
void sim_peer_forget(const void *ctx);   /* a context is destroyed: drop peer access from and to it */

/* simcuda_core.c */
struct sim *S(void);                     /* the simulator, or NULL (said once on stderr) */
int ngpus(void);
int valid_dev(CUdevice d);
void *backing_alloc(uint64_t n);
CUresult sim_alloc(CUdeviceptr *dptr, uint64_t n, int dev, int kind, int host, uint64_t aux);
int rec_host(const ms_rec *r);           /* 1 if the record's bytes are charged as host-resident */
void sim_release(const ms_rec *r);       /* free the backing memory and its charge */

/* simcuda_counters.c: count one event of counter c (SIM_C_*, simstate.h) and its bytes */
void sim_count(int c, uint64_t bytes);
void sim_count_set(int c, uint64_t v);   /* a high-water figure: counter c set to v */

/* simcuda_array.c: where an array's bytes are (level 0 of a mipmapped array) */
struct sim_layout { void *mem; uint64_t row_bytes, rows, layers; unsigned elem; };
int sim_array_layout(CUarray h, struct sim_layout *out);

/* simcuda_alloc.c */
CUresult free_ptr(uint64_t ptr);         /* cuMemFree of device or managed memory */

/* simcuda_pool.c */
void trim_pool(struct sim_pool *p, uint64_t keep);   /* caller holds g_mu */
void trim_all_pools(void);               /* every pool down to its release threshold */
#pragma GCC visibility pop

/* Device ordinals here are CUDA's (the visible GPUs); what the node keeps per GPU is by the node's index. Charges
 * come after cuInit, which read the list: a load, not a call, on the allocation path. */
_Static_assert(SIM_MAX_GPUS == 16, "SIM_PHYS masks ordinals to 0..15");
#define SIM_PHYS(d) (g_vis[(unsigned)(d) & 15u])
#define sim_charge(s, g, n, host) (sim_charge)((s), SIM_PHYS(g), (n), (host))
#define sim_uncharge(s, g, n, host) (sim_uncharge)((s), SIM_PHYS(g), (n), (host))
#define sim_used(s, g) (sim_used)((s), SIM_PHYS(g))
#define SIM_GPU(d) (S()->node->gpu[sim_phys(d)])

#define NEED_INIT() do { if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED; } while (0)
#define NEED_CTX() do { NEED_INIT(); if (!t_ctx) return CUDA_ERROR_INVALID_CONTEXT; } while (0)

#endif

/* Internal interface of libmemslice.so (the LD_PRELOAD shim). Nothing here is exported: the export list
 * is src/exports.map. */
#ifndef MEMSLICE_SHIM_H
#define MEMSLICE_SHIM_H

#include <stdint.h>

#include "cuda_api.h"
#include "memslice_region.h"
#include "ms_ptrmap.h"
#include "quota.h"

#define HOOK __attribute__((visibility("default")))

/* The limits file (config.c): where the node agent's Allocate mounts it read-only, the name `memslice run`
 * gives it in its region directory, and its largest size. */
#define MS_LIMITS_PATH "/run/memslice/limits"
#define MS_LIMITS_FILE "memslice.limits"
#define MS_LIMITS_MAX 4096
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

enum log_level { LOG_ERROR = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 };
enum shim_mode { MODE_PASSTHROUGH = 0, MODE_OBSERVE, MODE_ENFORCE, MODE_FAIL_CLOSED };

/* What one allocation is, in the shim's pointer table. */
enum alloc_kind { A_DEVICE = 1, A_MANAGED, A_POOL, A_VMM_HANDLE, A_VMM_MAP, A_ARRAY, A_SPILL_HOST,
                  A_SPILL_MANAGED, A_SPILL_VMM, A_ELASTIC, A_SPILL_MAPPED };

struct shim_config {
    enum shim_mode mode;
    uint64_t limit;            /* bytes per GPU (MODE_ENFORCE), else "unlimited" */
    uint64_t context_reserve;  /* charged once per process per GPU, at its first context */
    int oversubscribe;         /* MEMSLICE_OVERSUBSCRIBE=1 */
    uint64_t spill_limit;      /* host_spill_limit / MEMSLICE_HOST_SPILL_LIMIT (bytes; 0 = nothing spills);
                                  UINT64_MAX >> 2 when unset: no cap beyond the cgroup margin */
    uint64_t cgroup_margin;    /* MEMSLICE_CGROUP_MARGIN (bytes); 0 = 10% of memory.max, at least 256 MiB */
    char cgroup_dir[256];      /* MEMSLICE_CGROUP_DIR, or the process's own cgroup */
    char region_path[512];     /* MEMSLICE_REGION_DIR/memslice.region, empty without one */
    char limit_source[512];    /* where the quota came from, for messages: "MEMSLICE_GPU_MEM_LIMIT=4GiB" or
                                  "gpu_mem_limit=4.0 GiB in /run/memslice/limits" */
    char spill_source[512];    /* the same for the host spill cap */
    enum log_level log_level;
    uint64_t request;          /* elastic mode (elastic.c): gpu_mem_request / MEMSLICE_GPU_MEM_REQUEST, bytes;
                                  elastic is on when 0 < request < limit */
    uint64_t idle_after_ms;    /* idle_after / MEMSLICE_IDLE_AFTER (seconds, default 300) */
    uint64_t yield_wait_ms;    /* MEMSLICE_YIELD_WAIT (seconds, default 3): bound on waiting for neighbours */
    uint64_t pool_keep_ms;     /* MEMSLICE_HOST_POOL_KEEP (seconds, default 3; 0: no pool): how long pinned host
                                  chunks no move uses are kept for the next move (elastic_pool.c) */
    char elastic_dir[256];     /* elastic_dir / MEMSLICE_ELASTIC_DIR: the node's per-GPU arbitration boards */
    int elastic_slot;          /* elastic_slot / MEMSLICE_ELASTIC_SLOT: the board slot the agent assigned, -1 none */
    int idle_release;          /* idle_release / MEMSLICE_IDLE_RELEASE=1: idle, the request may move too */
    int32_t priority;          /* priority / MEMSLICE_PRIORITY: the pod's PriorityClass value */
    char nvml_path[256];       /* nvml_path / MEMSLICE_NVML_PATH: the node's libnvidia-ml (absolute); "" = by name */
    char cuda_path[256];       /* cuda_path / MEMSLICE_CUDA_PATH: the node's libcuda (absolute); "" = by name */
    int compute_request;       /* gpu_compute_request / MEMSLICE_GPU_COMPUTE_REQUEST: percent 0..100, -1 none */
    int compute_limit;         /* gpu_compute_limit / MEMSLICE_GPU_COMPUTE_LIMIT: percent 1..100, 0 no cap */
    int compute_slot;          /* compute_slot / MEMSLICE_COMPUTE_SLOT: the slot the provisioner assigned, -1 */
    char compute_dir[256];     /* compute_dir / MEMSLICE_COMPUTE_DIR: the node's per-GPU compute boards */
    char error[640];           /* MODE_FAIL_CLOSED: the message naming the bad variable */
};

extern struct shim_config g_cfg;
extern region_handle g_region;
extern int g_have_region;

/* lifecycle.c: start-up (config, region, fork handler, elastic mode), once, at the first CUDA or NVML call */
void shim_init(void);
extern volatile int g_shim_ready;
CUresult fail_closed_result(void);
static inline void ensure_init(void) { if (UNLIKELY(!g_shim_ready)) shim_init(); }
/* First line of every CUDA wrapper: start the shim if needed, and fail closed on a bad configuration. */
#define PROLOGUE()                                                                                         \
    do {                                                                                                   \
        ensure_init();                                                                                     \
        if (UNLIKELY(g_cfg.mode == MODE_FAIL_CLOSED)) return fail_closed_result();                         \
    } while (0)
/* config.c: parsing only */
void config_load(void);                       /* g_cfg from the limits file and the environment */
void config_ensure(void);                     /* config_load once (start-up, or real.c, whichever is first) */
void config_fail_closed(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* log.c */
void shim_log(enum log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *fmt_bytes(uint64_t b, char *buf, unsigned len);

/* real.c: the driver's own functions */
void *real_cuda(const char *name);            /* dlsym in libcuda.so.1, cached by the caller */
void *real_nvml(const char *name);
void *real_dlsym_call(void *handle, const char *name);
/* The driver's own `name`, looked up once, typed from its prototype in cuda_api.h: a call with the wrong
 * arguments is a compile error, and no call site re-types the signature. NULL if the driver lacks it. */
#define REAL(name) ({ static __typeof__(&name) fp_; if (UNLIKELY(!fp_)) fp_ = (__typeof__(&name))real_cuda(#name); fp_; })
#define REAL_NVML(name) ({ static __typeof__(&name) fp_; if (UNLIKELY(!fp_)) fp_ = (__typeof__(&name))real_nvml(#name); fp_; })

/* Charging the quota, HBM and host: quota.h, the one door (included above).
 * accounting.c: the region opened, GPUs by UUID, and the table of what this process allocated. */
void accounting_open(void);                  /* start-up: the region and this process's slot (or fail closed) */
void accounting_at_exit(void);               /* atexit: this process's charges go back */
void accounting_after_fork(void);            /* a forked child claims a slot of its own */
/* A GPU the shim must charge but cannot enter into the region (its device table locked past the bound, or
 * full): under a quota the allocation is refused (out of memory) rather than let through uncharged. */
#define DEV_UNCHARGEABLE (-2)
int dev_index(CUdevice ordinal);             /* region index of a CUDA ordinal, -1 if unknown */
int uuid_text(CUdevice ordinal, char *buf, unsigned len);  /* "GPU-…" of an ordinal: 0, or -1 */
int current_dev(CUdevice *ordinal);          /* region index of the current context's device */
int dev_index_by_uuid(const char *uuid, uint64_t physical_total);
int track(uint64_t key, uint64_t size, int dev, enum alloc_kind kind, uint64_t aux);
int untrack(uint64_t key, ms_rec *out);      /* 1 if it was ours */
int lookup(uint64_t key, ms_rec *out);
int lookup_range(uint64_t addr, ms_rec *out);   /* the record containing addr (slow: prefetch only) */
int enforcing(void);
int accounting(void);

/* spill.c (oversubscription) */
CUresult spill_alloc(CUdeviceptr *dptr, uint64_t n, int dev, CUdevice ordinal, const char *call);
CUresult spill_free(const ms_rec *r, CUstream stream, int async);
CUresult spill_alloc_managed(CUdeviceptr *dptr, uint64_t n, unsigned int flags, int dev, CUdevice ordinal,
                             const char *call);
CUresult spill_vmm(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                   unsigned long long flags, int dev, const char *call);
/* Host memory headroom (spill.c): whether n more bytes of pinned host memory fit this process's
 * memory cgroup (keeping its margin) and the host's MemAvailable (keeping a slack). */
enum { HOST_ROOM_OK = 0, HOST_ROOM_CGROUP = 1, HOST_ROOM_HOST = 2 };
struct host_verdict {
    int cause;                    /* HOST_ROOM_* */
    uint64_t limit, used, margin; /* cgroup: memory.max, memory.current; host: MemTotal, MemTotal - MemAvailable */
    char where[256];              /* the cgroup directory, or the meminfo file */
};
int host_room(uint64_t n, struct host_verdict *v);
const char *host_room_text(const struct host_verdict *v, char *out, size_t len);

/* hooks_ctx.c */
void ctx_after_fork(void);                   /* a forked child has charged no context yet */

/* measure.c: memory the driver takes outside allocation calls (contexts, limits, modules), measured around
 * the call: NVML's per-process figure where it can be read, else free memory (NVML, then cuMemGetInfo). */
enum measure_how { M_NONE = 0, M_NVML_PROCESS, M_NVML_FREE, M_CUDA_FREE };
struct measure { int dev; CUdevice ord; int how; uint64_t before, after, charged; nvmlDevice_t nvml;
                 int how_free; uint64_t free_before; /* the driver's free memory beside NVML's process figure */
                 uint64_t others, others_before; /* NVML's figure for every other process on the GPU */ };
void measure_begin(struct measure *m, int dev, CUdevice ord); /* takes the process's measuring lock */
int64_t measure_end(struct measure *m);     /* bytes taken since begin (negative: given back); how = M_NONE
                                               when nothing could be read */
void measure_done(struct measure *m);       /* reconcile with NVML's per-process figure; drops the lock */
void measure_after_fork(void);
/* Measured charges, kept by handle and kind so that unloading or destroying it gives them back. */
enum taken_kind { T_CONTEXT = 1, T_LIMITS, T_MODULE, T_LIBRARY };
CUresult taken_charge(int dev, uint64_t handle, enum taken_kind kind, uint64_t n, const char *call);
void taken_record(int dev, uint64_t handle, enum taken_kind kind, uint64_t n); /* n already charged */
uint64_t taken_release(uint64_t handle, enum taken_kind kind, uint64_t at_most); /* bytes given back */

/* hooks_pool.c */
void reconcile_pools(void);                  /* make every pool's charge equal its reservation */

/* elastic*.c (elastic memory: requests and limits, idle swap-out; docs/architecture.md "Elastic memory"; the
 * parts share elastic.h). Where an allocation goes (device, spill, elastic, refusal) is place.h's place(). */
extern int g_elastic;                        /* 1 when elastic mode is on: read on the allocation paths */
#define MS_ELASTIC_MIN (2ull << 20)          /* smaller allocations stay on the plain path */
int elastic_bind(int dev, CUdevice ordinal);  /* a fact for place(): dev is this process's elastic GPU */
CUresult elastic_alloc(CUdeviceptr *dptr, uint64_t size, int dev); /* after place() and the charge */
CUresult elastic_free(const ms_rec *r);
void elastic_start(void);                    /* start-up (lifecycle.c), once the region is open */
void elastic_after_fork(void);
/* Work submission (launches, copies, sets, graph launches) waits while this process remaps memory, and
 * marks the process active. Free on the hot path when elastic mode is off. */
void elastic_gate_slow(void);
void elastic_gate_exit(void);
static inline void work_enter(void) { if (UNLIKELY(g_elastic)) elastic_gate_slow(); }
static inline void work_exit(void) { if (UNLIKELY(g_elastic)) elastic_gate_exit(); }

/* compute*.c (the compute share; docs/architecture.md "Compute share"): launches wait (bounded) while
 * the container is over its limit or owes its neighbours GPU time, and are measured with events. Free on the hot
 * path when no share is set. */
extern int g_compute;                        /* 1 when a compute share is set */
void compute_start(void);                    /* start-up (lifecycle.c) */
void compute_after_fork(void);
int compute_gate_slow(CUstream stream);      /* before a launch: 1 when compute_done_slow must follow */
void compute_done_slow(int held, CUstream stream, CUresult rc);
static inline int launch_enter(CUstream s) { return UNLIKELY(g_compute) ? compute_gate_slow(s) : 0; }
static inline void launch_exit(int held, CUstream s, CUresult rc) { if (UNLIKELY(held)) compute_done_slow(held, s, rc); }

/* routes.c */
void *hook_for_name(const char *name);       /* our wrapper for an exact exported name, or NULL */
void *hook_for_real(void *real_fn);          /* our wrapper for the driver function at this address */

#endif

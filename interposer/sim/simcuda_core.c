/* The simulated driver's shared state (pointer table, primary contexts, default pools) and the physical
 * accounting helpers every allocating family uses: backing memory plus a charge in the node's region. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "sim_internal.h"
#include "simcuda.h"

ms_ptrmap g_ptrs;
pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
int g_initialized;
struct sim_ctx g_primary[SIM_MAX_GPUS];
struct sim_pool g_default_pool[SIM_MAX_GPUS];
struct sim_pool *g_current_pool[SIM_MAX_GPUS];
__thread struct sim_ctx *t_ctx;
static pthread_once_t g_map_once = PTHREAD_ONCE_INIT;

/* The primary contexts and default pools exist from the start, one per possible GPU. */
static void map_init(void) {
    ms_ptrmap_init(&g_ptrs);
    for (int i = 0; i < SIM_MAX_GPUS; i++) {
        g_primary[i] = (struct sim_ctx){.magic = CTX_MAGIC, .dev = i, .primary = 1};
        g_default_pool[i] = (struct sim_pool){.magic = POOL_MAGIC, .dev = i};
        g_current_pool[i] = &g_default_pool[i];
    }
}

/* The simulator, or NULL with an explanation on stderr (once) if its state cannot be opened. */
struct sim *S(void) {
    pthread_once(&g_map_once, map_init);
    struct sim *s = sim_get();
    static int warned;
    if (!s && !__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED)) fprintf(stderr, "%s\n", sim_error());
    return s;
}

/* How many GPUs CUDA numbers (the visible ones; 0 if the simulator cannot start). */
int ngpus(void) { return S() ? sim_visible_count() : 0; }

/* A device ordinal this node has. */
int valid_dev(CUdevice d) { return d >= 0 && d < ngpus(); }

/* ---- physical accounting helpers ------------------------------------------------------------------ */
/* Host memory standing in for n bytes of device memory: malloc for small blocks, a lazily committed
 * mapping for large ones (so a simulated 80 GiB GPU costs only what is touched). */
void *backing_alloc(uint64_t n) {
    if (n == 0) n = 1;
    if (n < SMALL_ALLOC) {
        void *p = NULL;
        return posix_memalign(&p, 256, (n + 255) & ~255ull) == 0 ? p : NULL;
    }
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* Give back what backing_alloc(n) returned. */
static void backing_free(void *p, uint64_t n) {
    if (n == 0) n = 1;
    if (n < SMALL_ALLOC) free(p);
    else { sim_ipc_release((uint64_t)(uintptr_t)p); munmap(p, n); }
}

/* Allocate n bytes of simulated memory on dev (host=1: host-resident), recorded under `kind`. */
CUresult sim_alloc(CUdeviceptr *dptr, uint64_t n, int dev, int kind, int host, uint64_t aux) {
    struct sim *s = S();
    if (sim_charge(s, dev, n, host) < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    void *p = backing_alloc(n);
    if (!p) {
        sim_uncharge(s, dev, n, host);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    ms_rec r = {.key = (uint64_t)(uintptr_t)p, .size = n, .aux = aux, .dev = dev, .kind = (uint32_t)kind};
    r.aux |= (uint64_t)host << 63;
    if (ms_ptrmap_put(&g_ptrs, &r) < 0) {
        backing_free(p, n);
        sim_uncharge(s, dev, n, host);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *dptr = r.key;
    return CUDA_SUCCESS;
}

/* Whether a record is charged as host-resident (bit 63 of aux). */
int rec_host(const ms_rec *r) { return (int)(r->aux >> 63); }

/* Free a record's backing memory and its charge. */
void sim_release(const ms_rec *r) {
    backing_free((void *)(uintptr_t)r->key, r->size);
    sim_uncharge(S(), r->dev, r->size, rec_host(r));
}

/* ---- what the family files (sim_streams.c, sim_ipc.c) use; declared in sim_internal.h ---------------- */
/* cuInit's state, for the NEED_INIT checks of the other files. */
int sim_cuda_initialized(void) { return g_initialized; }
/* This thread's current context, so a new stream or event belongs to it. */
CUcontext sim_current_ctx(void) { return (CUcontext)t_ctx; }
/* The allocation map, for IPC: look up, record, remove. */
int sim_ptr_range(uint64_t addr, ms_rec *out) { pthread_once(&g_map_once, map_init); return ms_ptrmap_find_range(&g_ptrs, addr, out); }
int sim_ptr_put(const ms_rec *r) { pthread_once(&g_map_once, map_init); return ms_ptrmap_put(&g_ptrs, r); }
int sim_ptr_take(uint64_t base, ms_rec *out) { pthread_once(&g_map_once, map_init); return ms_ptrmap_take(&g_ptrs, base, out); }

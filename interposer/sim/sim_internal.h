/* What the simulated libcuda's source files share with each other (not exported: -fvisibility=hidden).
 * simcuda.c owns contexts and the allocation map; the family files (streams, IPC, generated stubs) reach
 * them only through these functions. */
#ifndef MEMSLICE_SIM_INTERNAL_H
#define MEMSLICE_SIM_INTERNAL_H

#include <stdint.h>

#include "cuda_abi.h"
#include "ms_ptrmap.h"

typedef struct CUevent_st *CUevent;
#define SIM_SMALL_ALLOC (1u << 20)  /* below this, device memory is malloc'd; from it up, an mmap'd range */
#define SIM_K_DEVICE 1              /* simcuda.c's record kind for cuMemAlloc memory */
#define SIM_K_IPC 32                /* a mapping opened by cuIpcOpenMemHandle */

/* ---- simcuda.c ---- */
int sim_cuda_initialized(void);          /* cuInit has succeeded in this process */
CUcontext sim_current_ctx(void);         /* this thread's current context, or NULL */
int sim_ctx_device(CUcontext c);         /* the context's device, or -1 if c is not a live context */
int sim_ptr_range(uint64_t addr, ms_rec *out);   /* the allocation containing addr: 1 found, 0 not */
int sim_ptr_put(const ms_rec *r);                /* record an allocation: 0, or -1 (no memory) */
int sim_ptr_take(uint64_t base, ms_rec *out);    /* remove the record at base: 1 found, 0 not */

/* ---- sim_streams.c: stream objects (simcuda.c's capture functions read them too) ---- */
#define SIM_STREAM_MAGIC 0x5354524du
struct sim_stream {
    uint32_t magic;
    int dev;
    int capturing;
    int priority;
    unsigned int flags;
    CUcontext ctx;
    unsigned long long id;
    uint64_t target;      /* where its last launch completes on its context's timeline (sim_launch_api.h) */
};
struct sim_stream *sim_stream_of(CUstream s);    /* NULL for the special handles and for garbage */


/* ---- simcuda_peer.c ---- */
int sim_phys(int d);                     /* the node's index of device ordinal d */
int sim_ordinal(int g);                  /* the device ordinal of node GPU g, or -1 if it is not visible */
int sim_ctx_can_reach(CUcontext c, int g); /* whether context c's GPU is node GPU g or may access it as a peer */
/* ---- simcuda_inflight.c: asynchronous copies in flight on created streams (a book, for the counters) ---- */
void sim_inflight_add(CUstream s, uint64_t dst, uint64_t src, uint64_t n);
void sim_inflight_done(CUstream s);              /* s's copies complete (NULL: every stream's) */
unsigned long long sim_inflight_mark(void);      /* where the book stands (an event's record) */
void sim_inflight_done_id(unsigned long long id, unsigned long long mark);
void sim_inflight_unmap(uint64_t ptr, uint64_t size);
/* The time model (off unless MEMSLICE_SIM_LINK_GBPS / _VMM_US / _PIN_US_PER_MIB are set): when copies are due */
uint64_t sim_inflight_due(unsigned long long id, unsigned long long mark);
uint64_t sim_inflight_due_stream(CUstream s);
int sim_inflight_reached(uint64_t due, int wait);
enum { SIM_COST_VMM, SIM_COST_PIN, SIM_COST_RELEASE };
void sim_cost(int kind, uint64_t bytes);

/* ---- sim_ipc.c ---- */
/* simcuda_memop.c: stream waits whose condition is not yet met stay queued (work in flight) */
int sim_waits_pending(CUstream s);       /* queued waits on s (NULL: on any stream) */
CUresult sim_waits_drain(CUstream s);    /* wait (bounded) for the queued waits on s (NULL: all) to be met */
void sim_ipc_release(uint64_t base);     /* an allocation is freed: drop its shareable backing, if any */

/* ---- sim_stubs_cuda.c (generated table, cuda_exports.def) ---- */
void *sim_proc_lookup(const char *symbol, int cuda_version, int want_ptds, int *known);

#endif

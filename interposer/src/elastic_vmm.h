/* Elastic memory's VMM helpers (elastic_vmm.c): physical allocations in HBM or host memory, mapping with
 * access, and the batched move of chunks between them at the same addresses. They know nothing of ranges,
 * asks or boards (elastic.h): the mover (elastic_move.c) decides what moves, these move it. */
#ifndef MEMSLICE_ELASTIC_VMM_H
#define MEMSLICE_ELASTIC_VMM_H

#include <time.h>

#include "shim.h"

/* Monotonic ns: idleness, bounded waits, the pool's keep time (elastic.h's users get it from here). */
static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#define ELASTIC_CHUNK (32ull << 20) /* a range's physical memory comes in chunks of this: the unit that moves, so
                                     * an answer moves at most one chunk more than it was asked (the slack) */
#define ELASTIC_STREAMS 2          /* copy streams per process: a batch's copies are all in flight at once; with
                                    * two, they complete about in order, so chunk k is remapped while chunk k+1's
                                    * copy still crosses the link (four sharing the link would complete four at a
                                    * time; the GPU kit's phase split is the measurement) */
#define ELASTIC_BATCH 32           /* chunks moved per batch (1 GiB of 32 MiB chunks): the gate closes once each */

/* One chunk to move: its address and length, the handle mapped there now and the one to map instead, and
 * where `to` is mapped for the copy (`at`: its pool slot, or the batch's staging range). `ok` says, after
 * elastic_move_remap, that `to` is mapped at va (then an HBM `from` was released there; finish gives back a host
 * one);
 * `owner`/`idx` are the caller's. */
struct elastic_move {
    CUdeviceptr va;
    uint64_t len;
    CUmemGenericAllocationHandle from, to;
    CUdeviceptr at;
    int to_pool, from_pool; /* the pool slot of to / from + 1 (0: not the pool's) */
    int staged;             /* `to` is mapped at `at` in the staging range (stage maps it, remap or finish unmaps) */
    int ok;
    void *owner;
    unsigned idx;
};

/* A batch: the moves, the staging range they use (ELASTIC_BATCH chunks of address space, reserved at the first
 * batch and kept: move k is staged at chunk k of it), and what the remap measured. */
struct elastic_batch {
    struct elastic_move mv[ELASTIC_BATCH];
    unsigned n;
    CUdeviceptr tmp;
    CUdevice ord;
    int to_host;                /* the direction: the old handles are HBM (released as soon as their chunk moved,
                                 * for the asker) or host (unpinned only in finish, with the gate open) */
    uint64_t copy_ns, remap_ns; /* set by elastic_move_remap: issuing and waiting for copies; unmap/map/access */
    uint64_t runs;              /* runs of chunks remapped with one unmap, ever (their copies all complete) */
};
/* The mover's copy streams, and one event per chunk of a batch (each recorded behind its chunk's copy, so that
 * chunk is remapped as soon as its own copy is complete, while the later ones are still crossing the link). */
struct elastic_streams { CUstream s[ELASTIC_STREAMS]; int n; CUevent ev[ELASTIC_BATCH]; int events; };

/* The pool of pinned host chunks (elastic_pool.c): one range of `slots` chunks, slot i at va + i chunks. */
struct elastic_pool_slot { CUmemGenericAllocationHandle h; int filled, used; uint64_t since; };
struct elastic_pool {
    CUdeviceptr va;
    unsigned slots;
    CUdevice ord;
    struct elastic_pool_slot *e;
    uint64_t pinned, pins, reuses; /* bytes pinned now; chunks pinned and reused, ever */
};

CUresult elastic_create_phys(CUmemGenericAllocationHandle *h, uint64_t size, int host, CUdevice ord);
CUresult elastic_map_rw(uint64_t va, uint64_t size, CUmemGenericAllocationHandle h, CUdevice ord);
uint64_t elastic_driver_free(void);
void elastic_streams_init(struct elastic_streams *st);
/* The three steps of a batch (elastic_vmm.c says what each may do with the gate open or closed). */
int elastic_move_stage(struct elastic_batch *b);
int elastic_move_remap(struct elastic_batch *b, const struct elastic_streams *st);
void elastic_move_finish(struct elastic_batch *b, struct elastic_pool *pool);
/* The pool (elastic_pool.c) */
void elastic_pool_init(struct elastic_pool *p, uint64_t limit, uint64_t keep_ms, CUdevice ord);
int elastic_pool_get(struct elastic_pool *p, CUmemGenericAllocationHandle *h, CUdeviceptr *at);
void elastic_pool_put(struct elastic_pool *p, int i);
uint64_t elastic_pool_free_bytes(const struct elastic_pool *p);
uint64_t elastic_pool_trim(struct elastic_pool *p, uint64_t keep_ms);

#endif

/* Elastic memory's VMM helpers (elastic_vmm.c): physical allocations in HBM or host memory, mapping with
 * access, and the batched move of chunks between them at the same addresses. They know nothing of ranges,
 * asks or boards (elastic.h): the mover (elastic_move.c) decides what moves, these move it. */
#ifndef MEMSLICE_ELASTIC_VMM_H
#define MEMSLICE_ELASTIC_VMM_H

#include "shim.h"

#define ELASTIC_STREAMS 4          /* copy streams per process: copies of a batch overlap on the copy engines */
#define ELASTIC_BATCH 32           /* chunks moved per batch (1 GiB of 32 MiB chunks): the gate closes once each */

/* One chunk to move: its address and length, the handle mapped there now and the one to map instead. `ok`
 * says, after elastic_move_remap, that `to` is mapped at va; `owner`/`idx` are the caller's. */
struct elastic_move {
    CUdeviceptr va;
    uint64_t len;
    CUmemGenericAllocationHandle from, to;
    uint64_t off;      /* where `to` is staged in the batch's temporary range */
    int ok;
    void *owner;
    unsigned idx;
};

/* A batch: the moves, their temporary range, and the streams their copies go on (created once, in the
 * mover's context, by elastic_streams_init). */
struct elastic_batch {
    struct elastic_move mv[ELASTIC_BATCH];
    unsigned n;
    CUdeviceptr tmp;
    uint64_t tmp_size;
    CUdevice ord;
    uint64_t copy_ns, remap_ns; /* set by elastic_move_remap: issuing and waiting for copies; unmap/map/access */
};
/* The mover's copy streams, and one event per chunk of a batch (each recorded behind its chunk's copy, so that
 * chunk is remapped as soon as its own copy is complete, while the later ones are still crossing the link). */
struct elastic_streams { CUstream s[ELASTIC_STREAMS]; int n; CUevent ev[ELASTIC_BATCH]; int events; };

CUresult elastic_create_phys(CUmemGenericAllocationHandle *h, uint64_t size, int host, CUdevice ord);
CUresult elastic_map_rw(uint64_t va, uint64_t size, CUmemGenericAllocationHandle h, CUdevice ord);
uint64_t elastic_driver_free(void);
void elastic_streams_init(struct elastic_streams *st);
/* The three steps of a batch (elastic_vmm.c says what each may do with the gate open or closed). */
int elastic_move_stage(struct elastic_batch *b);
int elastic_move_remap(struct elastic_batch *b, const struct elastic_streams *st);
void elastic_move_finish(struct elastic_batch *b);

#endif

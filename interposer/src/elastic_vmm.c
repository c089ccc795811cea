/* Elastic memory's VMM helpers: physical memory in HBM or host memory, mappings with access, and the batched
 * move of chunks at the same address (elastic_vmm.h).
 *
 * A batch moves up to ELASTIC_BATCH chunks in three steps, so that the work gate is closed only while bytes
 * cross the link and addresses change, and what is done with it closed hides behind the copies:
 *   stage (gate open)    map the new handles that are not mapped yet (HBM for a move back; host chunks come
 *                        from the pool, elastic_pool.c, mapped already) at their chunk of the staging range,
 *                        reserved once and kept, access granted once per run;
 *   remap (gate closed)  issue every chunk's copy, round robin over ELASTIC_STREAMS streams, all in flight at
 *                        once (cuMemcpyDtoDAsync_v2, each followed by its event); as each chunk's own copy
 *                        completes, unmap its old handle, map the new one at the same address, grant access,
 *                        release the old handle if HBM and unstage the new one, while the later copies still
 *                        cross the link; once every remaining copy is complete, the rest goes in runs of adjacent
 *                        chunks of one range: one cuMemUnmap for the run (cuMemUnmap takes a range made of
 *                        several whole mappings: NVIDIA's vectorMemMap sample unmaps its handles so; never
 *                        part of one), a cuMemMap per chunk, one cuMemSetAccess for the run;
 *   finish (gate open)   what did not move gives its new handle back; old host chunks return to the pool (or
 *                        are unpinned: not pooled).
 * A failure before the old mapping is unmapped leaves the old mapping and its bytes in place (cuMemUnmap
 * comes after the chunk's copy is complete: the driver's rule, a mapping under a copy in flight faults). */
#define _GNU_SOURCE
#include <string.h>
#include <time.h>

#include "elastic_vmm.h"

/* CLOCK_MONOTONIC in ns: the remap's two phases are timed (the mover reports them, elastic_move.c). */
static uint64_t vmm_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A physical allocation of `size` bytes on GPU `ord`, or in host memory. */
CUresult elastic_create_phys(CUmemGenericAllocationHandle *h, uint64_t size, int host, CUdevice ord) {
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = host ? CU_MEM_LOCATION_TYPE_HOST : CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = host ? 0 : ord;
    CUresult rc = REAL(cuMemCreate)(h, size, &p, 0);
    if (rc == CUDA_ERROR_INVALID_VALUE && host) { /* drivers before 12.2 know only HOST_NUMA */
        p.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
        rc = REAL(cuMemCreate)(h, size, &p, 0);
    }
    return rc;
}

/* The HBM the driver has free on the current context's GPU (the evidence that HBM is short, never a
 * neighbour's claim); UINT64_MAX if the driver cannot say (then nothing is decided on it). */
uint64_t elastic_driver_free(void) {
    size_t fr = 0, tot = 0;
    return REAL(cuMemGetInfo_v2)(&fr, &tot) == CUDA_SUCCESS ? (uint64_t)fr : UINT64_MAX;
}

/* Give GPU `ord` read-write access to [va, va + size), a fully mapped range of one or more mappings. */
static CUresult grant(uint64_t va, uint64_t size, CUdevice ord) {
    CUmemAccessDesc d;
    memset(&d, 0, sizeof d);
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = ord;
    d.flags = 3; /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE */
    return REAL(cuMemSetAccess)(va, size, &d, 1);
}

/* Map a handle at va and give GPU `ord` read-write access to it. */
CUresult elastic_map_rw(uint64_t va, uint64_t size, CUmemGenericAllocationHandle h, CUdevice ord) {
    CUresult rc = REAL(cuMemMap)(va, size, 0, h, 0);
    if (rc != CUDA_SUCCESS) return rc;
    rc = grant(va, size, ord);
    if (rc != CUDA_SUCCESS) REAL(cuMemUnmap)(va, size);
    return rc;
}

/* The mover's copy streams, created once in its context (non-blocking: they never wait for the tenant's legacy
 * stream, whose work the gate has drained before a copy is issued). Without any, copies go on the legacy
 * stream, one behind the other. */
void elastic_streams_init(struct elastic_streams *st) {
    st->n = 0;
    for (int i = 0; i < ELASTIC_STREAMS; i++)
        if (REAL(cuStreamCreate)(&st->s[st->n], 1 /* CU_STREAM_NON_BLOCKING */) == CUDA_SUCCESS) st->n++;
    st->events = 1;
    for (int i = 0; i < ELASTIC_BATCH && st->events; i++) /* CU_EVENT_DISABLE_TIMING: the cheapest kind */
        st->events = REAL(cuEventCreate)(&st->ev[i], 2) == CUDA_SUCCESS;
}

/* The moves in address order, so that adjacent chunks form runs (insertion sort: at most ELASTIC_BATCH). */
static void sort_moves(struct elastic_batch *b) {
    for (unsigned i = 1; i < b->n; i++) {
        struct elastic_move m = b->mv[i];
        unsigned j = i;
        for (; j > 0 && b->mv[j - 1].va > m.va; j--) b->mv[j] = b->mv[j - 1];
        b->mv[j] = m;
    }
}

/* Unmap the staged moves among [0, upto) from the staging range (the range itself is kept). */
static void unstage(struct elastic_batch *b, unsigned upto) {
    for (unsigned k = 0; k < upto; k++)
        if (b->mv[k].staged) {
            REAL(cuMemUnmap)(b->mv[k].at, b->mv[k].len);
            b->mv[k].staged = 0;
        }
}

/* Grant access to the staged moves, once per run of adjacent staging chunks (a chunk shorter than
 * ELASTIC_CHUNK ends a run: the staging range has a hole after it). 0, or -1. */
static int grant_staged(struct elastic_batch *b) {
    for (unsigned i = 0, j; i < b->n; i = j) {
        j = i + 1;
        if (!b->mv[i].staged) continue;
        while (j < b->n && b->mv[j].staged && b->mv[j - 1].len == ELASTIC_CHUNK) j++;
        uint64_t len = b->mv[j - 1].at + b->mv[j - 1].len - b->mv[i].at;
        if (grant(b->mv[i].at, len, b->ord) != CUDA_SUCCESS) return -1;
    }
    return 0;
}

/* Stage (gate open: nothing here touches the tenant's addresses): each new handle not mapped yet (not the
 * pool's) is mapped at its chunk of the staging range, reserved at the first batch and kept; access granted
 * once per run. 0, or -1 with nothing staged (the caller still owns the new handles). */
int elastic_move_stage(struct elastic_batch *b) {
    sort_moves(b);
    for (unsigned k = 0; k < b->n; k++) b->mv[k].ok = b->mv[k].staged = 0;
    if (!b->n) return -1;
    if (!b->tmp && REAL(cuMemAddressReserve)(&b->tmp, (uint64_t)ELASTIC_BATCH * ELASTIC_CHUNK, ELASTIC_CHUNK, 0,
                                             0) != CUDA_SUCCESS) {
        b->tmp = 0;
        return -1;
    }
    for (unsigned k = 0; k < b->n; k++) {
        struct elastic_move *m = &b->mv[k];
        if (m->to_pool) continue; /* mapped with access at its pool slot already */
        m->at = b->tmp + (uint64_t)k * ELASTIC_CHUNK;
        if (REAL(cuMemMap)(m->at, m->len, 0, m->to, 0) != CUDA_SUCCESS) {
            unstage(b, k);
            return -1;
        }
        m->staged = 1;
    }
    if (grant_staged(b) != 0) {
        unstage(b, b->n);
        return -1;
    }
    return 0;
}

/* Wait for every copy of the batch. 0 when they all completed, -1 otherwise. */
static int wait_all(const struct elastic_streams *st) {
    int ok = 1;
    for (int i = 0; i < st->n; i++) ok &= REAL(cuStreamSynchronize)(st->s[i]) == CUDA_SUCCESS;
    if (!st->n) ok &= REAL(cuStreamSynchronize)(NULL) == CUDA_SUCCESS;
    return ok ? 0 : -1;
}

/* Issue every chunk's copy, round robin over the streams, all in flight together, each followed by its event.
 * 0, or -1 when one could not be issued (then every stream is waited for: no copy is left in flight). */
static int copy_all(const struct elastic_batch *b, const struct elastic_streams *st) {
    int ok = 1;
    for (unsigned k = 0; k < b->n && ok; k++) {
        CUstream s = st->n ? st->s[k % (unsigned)st->n] : NULL;
        ok = REAL(cuMemcpyDtoDAsync_v2)(b->mv[k].at, b->mv[k].va, b->mv[k].len, s) == CUDA_SUCCESS &&
             (!st->events || REAL(cuEventRecord)(st->ev[k], s) == CUDA_SUCCESS);
    }
    if (!ok) wait_all(st);
    return ok ? 0 : -1;
}

/* Whether chunk k's copy is complete (its event; without events, every copy). */
static int copied(const struct elastic_streams *st, unsigned k) {
    return st->events ? REAL(cuEventSynchronize)(st->ev[k]) == CUDA_SUCCESS : wait_all(st) == 0;
}

/* Put move k's old handle back at its address after its new one could not be mapped or given access there. */
static void restore(struct elastic_move *m, CUdevice ord, int new_mapped) {
    if (new_mapped) REAL(cuMemUnmap)(m->va, m->len);
    if (elastic_map_rw(m->va, m->len, m->from, ord) != CUDA_SUCCESS) /* the old handle still holds the bytes */
        shim_log(LOG_ERROR, "memslice: elastic range at 0x%llx could not be mapped back", (unsigned long long)m->va);
    m->ok = 0;
}

/* Grant access to a run of adjacent moves [i, j) whose new handles are mapped: once for the run, else one
 * by one, a move whose grant fails getting its old handle back. */
static void grant_run(struct elastic_batch *b, unsigned i, unsigned j) {
    uint64_t len = b->mv[j - 1].va + b->mv[j - 1].len - b->mv[i].va;
    if (grant(b->mv[i].va, len, b->ord) == CUDA_SUCCESS) return;
    for (unsigned k = i; k < j; k++)
        if (grant(b->mv[k].va, b->mv[k].len, b->ord) != CUDA_SUCCESS) restore(&b->mv[k], b->ord, 1);
}

/* A moved chunk's leftovers, while later copies still cross the link: its new handle's staging mapping, and
 * its old handle if that is HBM (the asker's room). A host one waits for finish: unpinning is slow and the gate
 * is closed here (a pooled one is not unpinned at all). */
static void settle(const struct elastic_batch *b, struct elastic_move *m) {
    if (m->staged) {
        REAL(cuMemUnmap)(m->at, m->len);
        m->staged = 0;
    }
    if (b->to_host) REAL(cuMemRelease)(m->from);
}

/* Swap chunk k's handle at its address (its copy is complete): unmap the old, map the new, grant access, settle.
 * On a failure after the unmap the old handle goes back (the bytes are still in it). */
static void swap_one(struct elastic_batch *b, unsigned k) {
    struct elastic_move *m = &b->mv[k];
    if (REAL(cuMemUnmap)(m->va, m->len) != CUDA_SUCCESS) return; /* still mapped as it was */
    if (REAL(cuMemMap)(m->va, m->len, 0, m->to, 0) != CUDA_SUCCESS) {
        restore(m, b->ord, 0);
        return;
    }
    if (grant(m->va, m->len, b->ord) != CUDA_SUCCESS) {
        restore(m, b->ord, 1);
        return;
    }
    m->ok = 1;
    settle(b, m);
}

/* Whether moves [i, j) are adjacent chunks of one range (one cuMemUnmap may take them: whole mappings of one
 * reservation). */
static int one_run(const struct elastic_batch *b, unsigned i, unsigned j) {
    for (unsigned k = i + 1; k < j; k++)
        if (b->mv[k].owner != b->mv[i].owner || b->mv[k].va != b->mv[k - 1].va + b->mv[k - 1].len) return 0;
    return 1;
}

/* Remap moves [i, j), one run whose copies are all complete: one unmap, a map per chunk (a chunk whose map
 * fails gets its old handle back), access once per run of those mapped, then settle each. A run the driver
 * will not unmap at once goes chunk by chunk. */
static void swap_run(struct elastic_batch *b, unsigned i, unsigned j) {
    struct elastic_move *r = &b->mv[i];
    if (j - i < 2 || REAL(cuMemUnmap)(r->va, b->mv[j - 1].va + b->mv[j - 1].len - r->va) != CUDA_SUCCESS) {
        for (unsigned k = i; k < j; k++) swap_one(b, k);
        return;
    }
    b->runs++;
    for (unsigned k = i; k < j; k++) {
        b->mv[k].ok = REAL(cuMemMap)(b->mv[k].va, b->mv[k].len, 0, b->mv[k].to, 0) == CUDA_SUCCESS;
        if (!b->mv[k].ok) restore(&b->mv[k], b->ord, 0);
    }
    for (unsigned p = i, q; p < j; p = q) { /* runs of mapped moves */
        for (q = p + 1; q < j && b->mv[p].ok && b->mv[q].ok;) q++;
        if (b->mv[p].ok) grant_run(b, p, q);
    }
    for (unsigned k = i; k < j; k++)
        if (b->mv[k].ok) settle(b, &b->mv[k]);
}

/* Remap moves [k, n), every copy of which is complete, in runs of adjacent chunks of one range. */
static void swap_tail(struct elastic_batch *b, unsigned k) {
    for (unsigned i = k, j; i < b->n; i = j) {
        for (j = i + 1; j < b->n && one_run(b, i, j + 1);) j++;
        swap_run(b, i, j);
    }
}

/* Whether the copies of moves (k, n) are complete too (their events; without events, wait_all made them so). */
static int rest_copied(const struct elastic_batch *b, const struct elastic_streams *st, unsigned k) {
    for (unsigned q = k + 1; st->events && q < b->n; q++)
        if (REAL(cuEventQuery)(st->ev[q]) != CUDA_SUCCESS) return 0;
    return 1;
}

/* Remap (gate closed, the tenant's work drained): copy, then swap each address's handle as soon as its copy is
 * complete, the rest in runs once all of theirs are. The moves whose new handle is now mapped have ok set (and
 * their old handle released unless pooled). 0, or -1 when a copy failed (that chunk and the later ones stay as
 * they were); either way no copy is in flight on return. */
int elastic_move_remap(struct elastic_batch *b, const struct elastic_streams *st) {
    uint64_t t = vmm_ns(), t1;
    b->copy_ns = b->remap_ns = 0;
    int rc = copy_all(b, st);
    b->copy_ns += (t1 = vmm_ns()) - t;
    if (rc < 0) return -1;
    int done = 1; /* a failed copy: that chunk and the later ones stay as they were */
    for (unsigned k = 0; k < b->n && done; k++) {
        t = vmm_ns();
        done = copied(st, k);
        int tail = done && rest_copied(b, st, k);
        b->copy_ns += (t1 = vmm_ns()) - t;
        if (tail) swap_tail(b, k);
        else if (done) swap_one(b, k);
        b->remap_ns += vmm_ns() - t1;
        if (tail) break;
    }
    t1 = vmm_ns();
    rc = wait_all(st) == 0 && done ? 0 : -1; /* nothing in flight before a staging mapping goes */
    b->copy_ns += vmm_ns() - t1;
    return rc;
}

/* Finish (gate open): a move not done gives its new handle back (unstaged; to the pool if pooled, else
 * released); a move done back to HBM gives its old host handle back (to the pool if pooled, else unpinned; an
 * HBM one was released by the remap). The staging range is kept for the next batch. */
void elastic_move_finish(struct elastic_batch *b, struct elastic_pool *pool) {
    unstage(b, b->n);
    for (unsigned k = 0; k < b->n; k++) {
        struct elastic_move *m = &b->mv[k];
        if (m->ok) {
            if (m->from_pool) elastic_pool_put(pool, m->from_pool - 1);
            else if (!b->to_host) REAL(cuMemRelease)(m->from);
        } else if (m->to_pool) {
            elastic_pool_put(pool, m->to_pool - 1);
        } else {
            REAL(cuMemRelease)(m->to);
        }
    }
}

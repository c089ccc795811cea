/* Elastic memory's VMM helpers: physical memory in HBM or host memory, mappings with access, and the batched
 * move of chunks at the same address (elastic_vmm.h).
 *
 * A batch moves up to ELASTIC_BATCH chunks in three steps, so that the work gate is closed only while bytes
 * cross the link and addresses change:
 *   stage (gate open)    map every new handle into one temporary range and grant access once;
 *   remap (gate closed)  copy every chunk to its new handle, the copies spread over ELASTIC_STREAMS streams
 *                        and all in flight at once (cuMemcpyDtoDAsync_v2, each followed by its event); as
 *                        each chunk's own copy completes (its event), unmap its old handle and map the new
 *                        one at the same address while the later copies still cross the link; access is
 *                        granted once per run of adjacent chunks;
 *   finish (gate open)   unmap the temporary range and release the handles that no longer hold the bytes.
 * A failure before the old mapping is unmapped leaves the old mapping and its bytes in place (cuMemUnmap
 * comes after every copy is complete: the driver's rule, a mapping under a copy in flight faults). */
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

/* Unmap the first `mapped` moves' handles from the temporary range and give the range back. */
static void unstage(struct elastic_batch *b, unsigned mapped) {
    for (unsigned k = 0; k < mapped; k++) REAL(cuMemUnmap)(b->tmp + b->mv[k].off, b->mv[k].len);
    REAL(cuMemAddressFree)(b->tmp, b->tmp_size);
    b->tmp = 0;
}

/* Stage (gate open: nothing here touches the tenant's addresses): one temporary range holding every new
 * handle, access granted once. 0, or -1 with nothing staged (the caller still owns the new handles). */
int elastic_move_stage(struct elastic_batch *b) {
    sort_moves(b);
    b->tmp = 0;
    b->tmp_size = 0;
    for (unsigned k = 0; k < b->n; k++) {
        b->mv[k].off = b->tmp_size;
        b->mv[k].ok = 0;
        b->tmp_size += b->mv[k].len;
    }
    if (!b->n || REAL(cuMemAddressReserve)(&b->tmp, b->tmp_size, 0, 0, 0) != CUDA_SUCCESS) return -1;
    for (unsigned k = 0; k < b->n; k++)
        if (REAL(cuMemMap)(b->tmp + b->mv[k].off, b->mv[k].len, 0, b->mv[k].to, 0) != CUDA_SUCCESS) {
            unstage(b, k);
            return -1;
        }
    if (grant(b->tmp, b->tmp_size, b->ord) != CUDA_SUCCESS) {
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
        ok = REAL(cuMemcpyDtoDAsync_v2)(b->tmp + b->mv[k].off, b->mv[k].va, b->mv[k].len, s) == CUDA_SUCCESS &&
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

/* Remap (gate closed, the tenant's work drained): copy, then swap each address's handle as soon as its copy is
 * complete. The moves whose new handle is now mapped have ok set. 0, or -1 when a copy failed (that chunk and
 * the later ones stay as they were); either way no copy is in flight on return. */
int elastic_move_remap(struct elastic_batch *b, const struct elastic_streams *st) {
    uint64_t t = vmm_ns(), t1;
    b->copy_ns = b->remap_ns = 0;
    int rc = copy_all(b, st);
    b->copy_ns += (t1 = vmm_ns()) - t;
    if (rc < 0) return -1;
    int done = 1; /* a failed copy: that chunk and the later ones stay as they were */
    for (unsigned k = 0; k < b->n; k++) {
        struct elastic_move *m = &b->mv[k];
        t = vmm_ns();
        done = done && copied(st, k);
        b->copy_ns += (t1 = vmm_ns()) - t;
        if (done && REAL(cuMemUnmap)(m->va, m->len) == CUDA_SUCCESS) { /* else still mapped as it was */
            m->ok = REAL(cuMemMap)(m->va, m->len, 0, m->to, 0) == CUDA_SUCCESS;
            if (!m->ok) restore(m, b->ord, 0);
        }
        b->remap_ns += vmm_ns() - t1;
    }
    t = vmm_ns();
    for (unsigned i = 0, j; i < b->n; i = j) { /* runs of adjacent, remapped chunks */
        for (j = i + 1; j < b->n && b->mv[i].ok && b->mv[j].ok && b->mv[j].va == b->mv[j - 1].va + b->mv[j - 1].len;)
            j++;
        if (b->mv[i].ok) grant_run(b, i, j);
    }
    b->remap_ns += (t1 = vmm_ns()) - t;
    rc = wait_all(st) == 0 && done ? 0 : -1; /* nothing in flight before the temporary range goes */
    b->copy_ns += vmm_ns() - t1;
    return rc;
}

/* Finish (gate open): the temporary range goes; each handle that no longer holds the bytes is released (the
 * old one of a move done, the new one of a move not done). */
void elastic_move_finish(struct elastic_batch *b) {
    if (b->tmp) unstage(b, b->n);
    for (unsigned k = 0; k < b->n; k++) REAL(cuMemRelease)(b->mv[k].ok ? b->mv[k].from : b->mv[k].to);
}

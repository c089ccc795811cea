/* Elastic GPU memory (docs/architecture.md, "Elastic memory"): a container's request is
 * guaranteed in HBM, its limit is what it may hold; above the request it bursts into free HBM; idle tenants'
 * memory moves to host memory when a neighbour needs HBM, and back when they run again, pointers unchanged.
 *
 * Mechanism: VMM remapping. In elastic mode cuMemAlloc* of at least MS_ELASTIC_MIN bytes is served here with
 * cuMemAddressReserve + cuMemCreate + cuMemMap + cuMemSetAccess. To move chunks, this process (and only
 * it: mappings are per process) maps new physical allocations in the other place (a HOST location to swap
 * out, the device to swap in) at a temporary range, closes its work gate (hooks_launch.c: no launch, copy or
 * set is submitted), waits for what is in flight, copies every chunk to its new allocation (asynchronously,
 * on several streams, all in flight at once), and as each chunk's copy completes unmaps its old handle and
 * maps the new one at the same address, then opens the gate and releases the old handles (elastic_vmm.c).
 *
 * Who yields to whom is decided on the GPU's board (elastic_board.c): a tenant whose device allocation the
 * driver refuses asks for what it lacks, in shares: idle neighbours (longest idle first) for what they hold
 * above their request, then, for an allocation within its request or from a higher priority, bursting ones
 * for their burst; then waits at most yield_wait_ms; whoever has not acknowledged within ELASTIC_ACK_MS or
 * yielded by then is skipped and the allocation is served from host memory at once (and moved to HBM by
 * the background thread when HBM frees up). Each tenant answers asks from a background thread of its own,
 * moving only when the driver's free memory is below the asker's need, never below its request. Memory is
 * mapped in ELASTIC_CHUNK chunks: the unit that moves.
 *
 * Host memory is finite: the host memory of a move is created by the moving tenant's own thread,
 * so its pages are charged to that tenant's memory cgroup. Before a move the tenant checks its cgroup and the
 * host (host_room, spill.c); if they cannot take it, it moves nothing, answers at once and says why in its
 * host note on the board. An asker whose burst then cannot be had in HBM fails it with
 * CUDA_ERROR_OUT_OF_MEMORY naming the cause (its request is served from its own host memory, checked the
 * same way); nothing is OOM-killed.
 *
 * The parts, in one direction (ranges -> asks -> board): elastic.c starts elastic mode, binds the process's
 * elastic GPU, and allocates and frees ranges (placing each chunk, asking neighbours for room); elastic_move.c
 * is the mover, the background threads that answer asks (swap out) and bring memory back (swap in), in
 * batches; elastic_ask.c is this process on the board (publishing its slot, asking neighbours for room);
 * elastic_board.c is the board's files. Below them all, elastic_gate.c (the work gate on the hot path, and the
 * drainer) and elastic_vmm.c (physical memory, mappings, and a batch's move: copies on several streams, all in
 * flight, then the remaps) serve any of them and call none. The process's state is one struct, g_es
 * (elastic.h); the gate keeps its own. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "elastic.h"

int g_elastic;

struct elastic_state g_es = {.mu = PTHREAD_MUTEX_INITIALIZER, .ord = -1, .dev = -1,
                             .board = {.slot = -1}}; /* the board's files zeroed: closed */

/* Elastic mode is decided once the configuration is read: 0 < request < limit. */
void elastic_start(void) {
    if (!g_cfg.request || g_cfg.request >= g_cfg.limit) return;
    char a[32], b[32];
    g_elastic = 1;
    elastic_mark_active();
    shim_log(LOG_INFO, "memslice: elastic memory: request %s guaranteed in HBM, limit %s; idle after %llu ms; "
             "board in %s", fmt_bytes(g_cfg.request, a, sizeof a), fmt_bytes(g_cfg.limit, b, sizeof b),
             (unsigned long long)g_cfg.idle_after_ms, g_cfg.elastic_dir);
}

/* A forked child inherits no CUDA state: no ranges, no thread, no slot (its parent keeps its own). */
void elastic_after_fork(void) {
    elastic_board_close_after_fork(&g_es.board);
    struct elastic_board b = g_es.board;
    memset(&g_es, 0, sizeof g_es);
    g_es.board = b;
    g_es.ord = -1;
    g_es.dev = -1;
    pthread_mutex_init(&g_es.mu, NULL);
    elastic_gate_after_fork();
}

/* Elastic memory lives on one GPU per process (docs/architecture.md, "Elastic memory on one GPU per
 * process"): say once per other GPU that its allocations take the plain path. Caller holds g_es.mu. */
static void say_other_gpu(int dev) {
    static uint64_t said; /* ledger indices already named (one bit each) */
    if (dev < 0 || dev >= 64 || (said & (1ull << dev))) return;
    said |= 1ull << dev;
    shim_log(LOG_WARN, "memslice: elastic memory is on %s in this process (the first GPU it allocated on); its "
             "allocations on %s take the plain path: charged to the limit, never moved to host memory, and not "
             "on that GPU's board (neighbours there cannot ask it for HBM, nor it them)",
             g_region.r->dev[g_es.dev].uuid, g_region.r->dev[dev].uuid);
}

/* The first elastic allocation of the process: its GPU, context, board slot and background thread. Caller
 * holds g_es.mu. 0, or -1 (then allocations take the plain path). Without a slot (the assigned one held by
 * another process, or none free) the process stays elastic: it asks its neighbours for its request, it
 * just cannot be asked. */
static int elastic_setup(int dev, CUdevice ord) {
    if (g_es.started) {
        if (g_es.dev == dev) return 0;
        say_other_gpu(dev);
        return -1;
    }
    char err[512];
    if (REAL(cuCtxGetCurrent)(&g_es.ctx) != CUDA_SUCCESS || !g_es.ctx) return -1;
    int rc = elastic_board_open(&g_es.board, g_cfg.elastic_dir, g_region.r->dev[dev].uuid, g_cfg.elastic_slot, err,
                                sizeof err);
    if (rc < 0) {
        shim_log(LOG_ERROR, "memslice: elastic memory is off in this process: %s", err);
        g_elastic = 0;
        return -1;
    }
    if (rc > 0)
        shim_log(LOG_WARN, "memslice: elastic: %s; this process asks its neighbours for HBM but cannot be asked "
                 "(its memory above the request stays where it is)", err);
    g_es.dev = dev;
    g_es.ord = ord;
    if (elastic_drainer_start(g_es.ctx) < 0) return -1;
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &at, elastic_thread, NULL) != 0 ||
        (g_es.board.slot >= 0 && pthread_create(&t, &at, elastic_acker, NULL) != 0)) {
        pthread_attr_destroy(&at);
        return -1;
    }
    pthread_attr_destroy(&at);
    g_es.started = 1;
    elastic_publish(0);
    return 0;
}

/* A burst that could not be had because a neighbour could not take its share to host memory:
 * fail it, naming the cause, and count it in this process's host note. */
static CUresult burst_refused(uint64_t len, const struct elastic_refusal *ref) {
    char a[32], b[32], c[32], d[32];
    const struct elastic_hostnote *nt = &ref->note;
    int cg = nt->cause == ELASTIC_REFUSED_CGROUP;
    pthread_mutex_lock(&g_es.mu);
    g_es.note.bursts_failed++;
    elastic_board_put_note(&g_es.board, &g_es.note);
    pthread_mutex_unlock(&g_es.mu);
    shim_log(LOG_ERROR, "memslice: elastic: a burst of %s failed (CUDA_ERROR_OUT_OF_MEMORY): GPU memory is full and "
             "the tenant in slot %d of the board (pid %d) could not take %s to host memory: %s %s, %s %s; %s",
             fmt_bytes(len, a, sizeof a), ref->slot, (int)ref->pid,
             fmt_bytes((uint64_t)nt->want_mib << 20, b, sizeof b),
             cg ? "its memory cgroup's memory.max" : "the host's MemTotal", fmt_bytes(nt->limit, c, sizeof c),
             cg ? "memory.current" : "in use", fmt_bytes(nt->used, d, sizeof d),
             cg ? "raise that pod's memory limit" : "the node is short of host memory");
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* Host memory for a chunk this process places there itself: only if its own cgroup and the host can take it,
 * else CUDA_ERROR_OUT_OF_MEMORY naming why. */
static CUresult own_host(CUmemGenericAllocationHandle *h, uint64_t len) {
    struct host_verdict v;
    if (host_room(len, &v) == HOST_ROOM_OK) return elastic_create_phys(h, len, 1, g_es.ord);
    char a[32], t[400];
    shim_log(LOG_ERROR, "memslice: elastic: %s could not be had in GPU memory nor in host memory "
             "(CUDA_ERROR_OUT_OF_MEMORY): %s; %s", fmt_bytes(len, a, sizeof a), host_room_text(&v, t, sizeof t),
             v.cause == HOST_ROOM_CGROUP ? "raise this pod's memory limit" : "the node is short of memory");
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* Physical memory for chunk i of a new range: HBM if the driver has it, else (once per range: *asked) after
 * asking neighbours for what the range still lacks, else host memory at once; a burst fails instead if a
 * neighbour could not take its share to host memory. */
static CUresult place_chunk(struct elastic_range *r, unsigned i, int *asked) {
    uint64_t len = elastic_chunk_len(r, i);
    r->c[i].host = 0;
    if (elastic_create_phys(&r->c[i].h, len, 0, g_es.ord) == CUDA_SUCCESS) return CUDA_SUCCESS;
    uint64_t rest = r->size - (uint64_t)i * ELASTIC_CHUNK;
    pthread_mutex_lock(&g_es.mu);
    uint64_t held = g_es.resident + (uint64_t)i * ELASTIC_CHUNK;
    pthread_mutex_unlock(&g_es.mu);
    int guaranteed = held + len <= g_cfg.request;
    if (!*asked) {
        *asked = 1;
        /* the part within the request may take active tenants' bursts; a burst, only idle memory above its
         * owner's floor and lower priorities' bursts */
        uint64_t within = held < g_cfg.request ? g_cfg.request - held : 0;
        if (within > rest) within = rest;
        /* the request asks again (up to 3 rounds, each bounded) when another asker took the room first */
        struct elastic_refusal ref = {.slot = -1};
        for (int round = 0; round < (within ? 3 : 1); round++) {
            if (elastic_make_room(within ? within : rest, within > 0, 1, &ref) <= 0) break;
            if (elastic_create_phys(&r->c[i].h, len, 0, g_es.ord) == CUDA_SUCCESS) return CUDA_SUCCESS;
        }
        if (!within && ref.slot >= 0) return burst_refused(r->size, &ref);
    }
    char a[32];
    shim_log(LOG_INFO, "memslice: elastic: %s served from host memory (HBM is full%s)", fmt_bytes(len, a, sizeof a),
             guaranteed ? " and neighbours did not yield in time; it moves to HBM when HBM frees up" : "");
    r->c[i].host = 1;
    return own_host(&r->c[i].h, len);
}

/* Unmap and release chunks [0, upto) of a range (a pooled host chunk goes back to the pool, still pinned:
 * elastic_pool.c) and give back its address range. Caller holds g_es.mu if the range was listed. */
static void unmap_chunks(struct elastic_range *r, unsigned upto, int mapped) {
    for (unsigned i = 0; i < upto; i++) {
        if (mapped) REAL(cuMemUnmap)(r->va + (uint64_t)i * ELASTIC_CHUNK, elastic_chunk_len(r, i));
        if (r->c[i].pool) elastic_pool_put(&g_es.pool, r->c[i].pool - 1);
        else REAL(cuMemRelease)(r->c[i].h);
    }
    REAL(cuMemAddressFree)(r->va, r->size);
}

/* An address range with physical memory mapped chunk by chunk (the unit that moves: only what is
 * needed moves): HBM where it can be had, else host memory. g_es.mu is not held while neighbours are asked for
 * room, so this process's own thread still answers its neighbours. */
static CUresult map_new(struct elastic_range *r) {
    CUresult rc = REAL(cuMemAddressReserve)(&r->va, r->size, 0, 0, 0);
    if (rc != CUDA_SUCCESS) return rc;
    int asked = 0;
    for (unsigned i = 0; i < r->n; i++) {
        if ((rc = place_chunk(r, i, &asked)) != CUDA_SUCCESS) {
            unmap_chunks(r, i, 1);
            return rc;
        }
        uint64_t va = r->va + (uint64_t)i * ELASTIC_CHUNK;
        if ((rc = elastic_map_rw(va, elastic_chunk_len(r, i), r->c[i].h, g_es.ord)) != CUDA_SUCCESS) {
            REAL(cuMemRelease)(r->c[i].h);
            unmap_chunks(r, i, 1);
            return rc;
        }
    }
    return CUDA_SUCCESS;
}

/* Whether GPU `dev` is this process's elastic GPU, binding it at the first elastic allocation (its context,
 * board slot and background threads): a fact for place() (place.h). 0: the allocation takes the plain path
 * (another GPU than the elastic one, no context, no board). */
int elastic_bind(int dev, CUdevice ord) {
    pthread_mutex_lock(&g_es.mu);
    int ok = elastic_setup(dev, ord) == 0;
    pthread_mutex_unlock(&g_es.mu);
    return ok;
}

/* cuMemAlloc in elastic mode, once place() chose it and the quota (the limit) is charged `size` bytes (2 MiB
 * units): the memory placed chunk by chunk by place_chunk(), the range tracked for cuMemFree and for moving.
 * On failure nothing is held here; the caller gives the charge back. */
CUresult elastic_alloc(CUdeviceptr *dptr, uint64_t size, int dev) {
    unsigned chunks = (unsigned)((size + ELASTIC_CHUNK - 1) / ELASTIC_CHUNK);
    struct elastic_range *r = calloc(1, sizeof *r + chunks * sizeof r->c[0]);
    if (!r) return CUDA_ERROR_OUT_OF_MEMORY;
    r->size = size;
    r->n = chunks;
    CUresult rc = map_new(r);
    if (rc != CUDA_SUCCESS) {
        free(r);
        return rc;
    }
    pthread_mutex_lock(&g_es.mu);
    r->next = g_es.ranges;
    g_es.ranges = r;
    for (unsigned i = 0; i < r->n; i++) {
        if (r->c[i].host) g_es.swapped += elastic_chunk_len(r, i);
        else g_es.resident += elastic_chunk_len(r, i);
    }
    track(r->va, size, dev, A_ELASTIC, (uint64_t)(uintptr_t)r);
    elastic_publish(0);
    pthread_mutex_unlock(&g_es.mu);
    *dptr = r->va;
    return CUDA_SUCCESS;
}

/* cuMemFree of an elastic range: wherever its bytes are, unmap and release them, give the quota back. The
 * synchronize (cuMemFree waits for the device like this, too, without a bound) comes before g_es.mu, so a free
 * waiting for queued work never stops the background thread from answering neighbours; a move in between
 * is harmless (the range's current handles are read under g_es.mu). */
CUresult elastic_free(const ms_rec *rec) {
    struct elastic_range *r = (struct elastic_range *)(uintptr_t)rec->aux;
    REAL(cuCtxSynchronize)();
    pthread_mutex_lock(&g_es.mu);
    for (unsigned i = 0; i < r->n; i++) {
        if (r->c[i].host) g_es.swapped -= elastic_chunk_len(r, i);
        else g_es.resident -= elastic_chunk_len(r, i);
    }
    unmap_chunks(r, r->n, 1);
    for (struct elastic_range **p = &g_es.ranges; *p; p = &(*p)->next)
        if (*p == r) { *p = r->next; break; }
    elastic_publish(0);
    pthread_mutex_unlock(&g_es.mu);
    quota_uncharge(rec->dev, rec->size);
    free(r);
    return CUDA_SUCCESS;
}

/* Elastic GPU memory (issue 13; docs/architecture.md, "Elastic memory"): a container's request is
 * guaranteed in HBM, its limit is what it may hold; above the request it bursts into free HBM; idle tenants'
 * memory moves to host memory when a neighbour needs HBM, and back when they run again, pointers unchanged.
 *
 * Mechanism: VMM remapping. In elastic mode cuMemAlloc* of at least MS_ELASTIC_MIN bytes is served here with
 * cuMemAddressReserve + cuMemCreate + cuMemMap + cuMemSetAccess. To move a range, this process (and only
 * it: mappings are per process) closes its work gate (hooks_launch.c: no launch, copy or set is submitted),
 * waits for what is in flight, copies the bytes to a new physical allocation in the other place (a HOST
 * location to swap out, the device to swap in), unmaps the old handle, maps the new one at the same
 * address, releases the old one, and opens the gate.
 *
 * Who yields to whom is decided on the GPU's board (elastic_board.c): a tenant whose device allocation the
 * driver refuses asks for what it lacks, in shares: idle neighbours (longest idle first) for what they hold
 * above their request, then, for an allocation within its request or from a higher priority, bursting ones
 * for their burst; then waits at most yield_wait_ms; whoever has not acknowledged within EL_ACK_MS or
 * yielded by then is skipped and the allocation is served from host memory at once (and moved to HBM by
 * the background thread when HBM frees up). Each tenant answers asks from a background thread of its own,
 * moving only when the driver's free memory is below the asker's need, never below its request (issues 25,
 * 26). Memory is mapped in EL_CHUNK chunks: the unit that moves.
 *
 * Host memory is finite (issue 26): the host memory of a move is created by the moving tenant's own thread,
 * so its pages are charged to that tenant's memory cgroup. Before a move the tenant checks its cgroup and the
 * host (host_room, spill.c); if they cannot take it, it moves nothing, answers at once and says why in its
 * host note on the board. An asker whose burst then cannot be had in HBM fails it with
 * CUDA_ERROR_OUT_OF_MEMORY naming the cause (its request is served from its own host memory, checked the
 * same way); nothing is OOM-killed. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "elastic_board.h"
#include "shim.h"

#define TICK_MS 20
#define GATE_DRAIN_MS 2000         /* how long a remap waits for this process's calls and GPU work in flight */
#define EL_CHUNK (32ull << 20)     /* a range's physical memory comes in chunks of this: the unit that moves, so
                                    * an answer moves at most one chunk more than it was asked (the slack) */
#define EL_ACK_MS 1000             /* an asked neighbour acknowledges within a tick (or the move it is in) */
#define EL_YIELD_GAP_MS 100        /* a tenant moves memory for asks at most once per this (issue 25) */
#define EL_BACK_AFTER_MS 2000     /* memory yielded for an ask stays in host memory at least this long */
#define EL_SKIP_NOACK_MS 10000     /* a slot that did not acknowledge an ask is not asked again for this long */

int g_elastic;

struct echunk { CUmemGenericAllocationHandle h; int host; };
struct erange { CUdeviceptr va; uint64_t size; unsigned n; struct erange *next; struct echunk c[]; };

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;  /* the ranges, their placement, remaps */
static struct erange *g_ranges;                           /* newest first */
static uint64_t g_resident, g_swapped;                    /* bytes, under g_mu */
static CUcontext g_ctx;                                   /* the context of the first elastic allocation */
static CUdevice g_ord = -1;                               /* its device: elastic memory lives on one GPU */
static int g_dev = -1;                                    /* its ledger index */
static struct eb g_board = {-1, -1};                    /* slot -1: no slot (asks, cannot be asked) */
static struct eb_slot g_me;                               /* this process's slot, as last published */
static int g_thread_started;
static uint64_t g_yield_ns;                               /* when this process last gave HBM away */
static uint64_t g_acked;                                  /* the last ask the acker acknowledged (atomic) */
static uint64_t g_skip_until[EB_SLOTS];                   /* neighbours that did not answer in time: not asked again before */
static struct eb_hostnote g_note;                         /* this process's host note (board version 4), under g_mu */

/* A neighbour that could not take its share to host memory (issue 26), as an asker saw it. */
struct refusal { int slot; int32_t pid; struct eb_hostnote note; };

static uint64_t g_last_call_ns;                           /* CLOCK_MONOTONIC of the last gated call */
static int g_inflight;                                    /* gated calls in progress */
static int g_closed;                                      /* 1 while a remap runs */
static pthread_mutex_t g_gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_gate_cv = PTHREAD_COND_INITIALIZER;

/* The drainer (docs/architecture.md, "Waits and their bounds"): one thread that runs cuCtxSynchronize, which
 * has no bound of its own, for whoever must wait for the GPU work already queued; they wait for its answer
 * with a deadline. A drain asked is never asked again before it has finished. */
static pthread_mutex_t g_drain_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_drain_cv;                         /* CLOCK_MONOTONIC; both directions */
static uint64_t g_drain_asked, g_drain_done;              /* generations, under g_drain_mu */
static uint64_t g_drain_asked_ns;                         /* coarse clock of the last ask (atomic) */
static int g_drain_ok;                                    /* the last finished drain succeeded */
static int g_drainer_started;                             /* one drainer per process, ever */

/* Time for idleness and bounded waits. */
static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The gate's activity stamp: the coarse clock (a vDSO read of a few ns, resolution of a few ms, plenty for
 * idleness measured in seconds). Same time base as now_ns. */
static uint64_t coarse_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Sleeps in the background thread and bounded waits. */
static void sleep_ms(unsigned ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {}
}

/* Elastic mode is decided once the configuration is read: 0 < request < limit. */
void elastic_start(void) {
    if (!g_cfg.request || g_cfg.request >= g_cfg.limit) return;
    char a[32], b[32];
    g_elastic = 1;
    __atomic_store_n(&g_last_call_ns, now_ns(), __ATOMIC_RELAXED);
    shim_log(LOG_INFO, "memslice: elastic memory: request %s guaranteed in HBM, limit %s; idle after %llu ms; "
             "board in %s", fmt_bytes(g_cfg.request, a, sizeof a), fmt_bytes(g_cfg.limit, b, sizeof b),
             (unsigned long long)g_cfg.idle_after_ms, g_cfg.elastic_dir);
}

/* A forked child inherits no CUDA state: no ranges, no thread, no slot (its parent keeps its own). */
void elastic_after_fork(void) {
    eb_close_after_fork(&g_board);
    g_ranges = NULL;
    g_resident = g_swapped = 0;
    g_thread_started = 0;
    g_ctx = NULL;
    g_ord = -1;
    g_dev = -1;
    g_inflight = 0;
    g_closed = 0;
    g_drain_asked = g_drain_done = g_drain_asked_ns = 0;
    g_drain_ok = 0;
    g_drainer_started = 0;
    memset(&g_note, 0, sizeof g_note);
    pthread_mutex_init(&g_mu, NULL);
    pthread_mutex_init(&g_gate_mu, NULL);
    pthread_mutex_init(&g_drain_mu, NULL);
}

/* ---- the work gate -------------------------------------------------------------------------------------
 * Every launch, copy and set enters the gate: it counts as activity, and it waits while a remap has the
 * gate closed, so no work is ever submitted against an address that is between two physical allocations. */
/* Entering the gate: stamp activity, count the call in flight, wait while a remap has the gate closed. */
void elastic_gate_slow(void) {
    __atomic_store_n(&g_last_call_ns, coarse_ns(), __ATOMIC_RELAXED);
    for (;;) {
        __atomic_add_fetch(&g_inflight, 1, __ATOMIC_SEQ_CST);
        if (!__atomic_load_n(&g_closed, __ATOMIC_SEQ_CST)) return;
        __atomic_sub_fetch(&g_inflight, 1, __ATOMIC_SEQ_CST);
        pthread_mutex_lock(&g_gate_mu);
        while (__atomic_load_n(&g_closed, __ATOMIC_SEQ_CST)) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 50000000L;
            if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
            pthread_cond_timedwait(&g_gate_cv, &g_gate_mu, &ts);
        }
        pthread_mutex_unlock(&g_gate_mu);
    }
}

/* Leaving the gate: the call has been submitted (or done). */
void elastic_gate_exit(void) {
    __atomic_sub_fetch(&g_inflight, 1, __ATOMIC_SEQ_CST);
    __atomic_store_n(&g_last_call_ns, coarse_ns(), __ATOMIC_RELAXED);
}

/* Open the gate and wake the threads waiting at it. */
static void gate_open(void) {
    pthread_mutex_lock(&g_gate_mu);
    __atomic_store_n(&g_closed, 0, __ATOMIC_SEQ_CST);
    pthread_cond_broadcast(&g_gate_cv);
    pthread_mutex_unlock(&g_gate_mu);
}

/* ---- the drain -------------------------------------------------------------------------------------- */
/* The drainer thread: waits for a drain to be asked, runs cuCtxSynchronize in the elastic context (as long as
 * the driver takes: a wait released by a later call of the tenant's, a kernel that runs for minutes), says
 * it has finished. Blocked in the driver it is harmless: nobody waits for it past their deadline, and no
 * second drain is asked meanwhile. */
static void *drainer(void *arg) {
    (void)arg;
    REAL(cuCtxSetCurrent)(g_ctx);
    pthread_mutex_lock(&g_drain_mu);
    for (;;) {
        while (g_drain_done == g_drain_asked) /* idle until asked: a worker's wait, nobody waits on it */
            pthread_cond_wait(&g_drain_cv, &g_drain_mu);
        uint64_t gen = g_drain_asked;
        pthread_mutex_unlock(&g_drain_mu);
        CUresult rc = REAL(cuCtxSynchronize)();
        pthread_mutex_lock(&g_drain_mu);
        g_drain_done = gen;
        g_drain_ok = rc == CUDA_SUCCESS;
        pthread_cond_broadcast(&g_drain_cv);
    }
    return NULL;
}

/* Start the drainer (with the mover, in elastic_setup): its condition variable on the monotonic clock, so
 * deadlines do not move with the wall clock. 0, or -1. */
static int drainer_start(void) {
    if (g_drainer_started) return 0;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g_drain_cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &at, drainer, NULL);
    pthread_attr_destroy(&at);
    g_drainer_started = rc == 0;
    return rc == 0 ? 0 : -1;
}

/* Ask for a drain unless one is still running. Caller holds g_drain_mu. The generation asked, or 0 (busy). */
static uint64_t drain_ask_locked(void) {
    if (g_drain_done != g_drain_asked) return 0;
    __atomic_store_n(&g_drain_asked_ns, coarse_ns(), __ATOMIC_RELAXED);
    pthread_cond_broadcast(&g_drain_cv);
    return ++g_drain_asked;
}

/* Wait until the GPU work queued so far has finished, at most until `deadline` (now_ns). 0 when it has (and
 * the synchronize succeeded), -1 when a drain is still running (this one, or an earlier one nobody waits for
 * any more): then no range may move, and the process counts as busy for the next idle_after (it is not idle:
 * its work is in flight). */
static int drain_until(uint64_t deadline) {
    struct timespec ts = {(time_t)(deadline / 1000000000ull), (long)(deadline % 1000000000ull)};
    pthread_mutex_lock(&g_drain_mu);
    uint64_t gen = drain_ask_locked();
    while (gen && g_drain_done < gen && now_ns() < deadline)
        pthread_cond_timedwait(&g_drain_cv, &g_drain_mu, &ts);
    int ok = gen && g_drain_done >= gen && g_drain_ok;
    pthread_mutex_unlock(&g_drain_mu);
    if (!ok) __atomic_store_n(&g_last_call_ns, coarse_ns(), __ATOMIC_RELAXED);
    if (gen && !ok) /* once per drain: the moves tried while it still runs give up at once, silently */
        shim_log(LOG_INFO, "memslice: elastic: work queued on the GPU did not finish within %d ms; no memory "
                 "moves until it has (this process counts as busy meanwhile)", GATE_DRAIN_MS);
    return ok ? 0 : -1;
}

/* The idle test's half about work in flight, from the mover's tick: once no call has been made for half of
 * idle_after, ask (without waiting) for a drain unless one after the last call has succeeded, so that a
 * finished one says nothing is queued. */
static void drain_probe(void) {
    uint64_t last = __atomic_load_n(&g_last_call_ns, __ATOMIC_RELAXED);
    if (now_ns() - last < g_cfg.idle_after_ms * 1000000ull / 2) return;
    pthread_mutex_lock(&g_drain_mu);
    if (__atomic_load_n(&g_drain_asked_ns, __ATOMIC_RELAXED) <= last || !g_drain_ok) drain_ask_locked();
    pthread_mutex_unlock(&g_drain_mu);
}

/* No work in flight: a drain asked after the last call has finished, and succeeded. */
static int drained_since_last_call(void) {
    uint64_t last = __atomic_load_n(&g_last_call_ns, __ATOMIC_RELAXED);
    pthread_mutex_lock(&g_drain_mu);
    int ok = g_drain_done == g_drain_asked && g_drain_ok &&
             __atomic_load_n(&g_drain_asked_ns, __ATOMIC_RELAXED) > last;
    pthread_mutex_unlock(&g_drain_mu);
    return ok;
}

/* Close the gate, wait for gated calls in progress and then for the work already queued on the GPU, both
 * within one GATE_DRAIN_MS from closing: a tenant thread arriving at the gate waits at most that plus the
 * move. 0, or -1 with the gate open again (a call did not return, or the work did not drain, in time: this
 * move is given up; none is tried while that drain still runs). */
static int gate_close(void) {
    pthread_mutex_lock(&g_drain_mu);
    int busy = g_drain_done != g_drain_asked;
    pthread_mutex_unlock(&g_drain_mu);
    if (busy) return -1; /* an earlier drain is still blocked in the driver: work is in flight */
    __atomic_store_n(&g_closed, 1, __ATOMIC_SEQ_CST);
    uint64_t deadline = now_ns() + GATE_DRAIN_MS * 1000000ull;
    while (__atomic_load_n(&g_inflight, __ATOMIC_SEQ_CST) > 0) {
        if (now_ns() > deadline) {
            gate_open();
            return -1;
        }
        sleep_ms(1);
    }
    if (drain_until(deadline) < 0) {
        gate_open();
        return -1;
    }
    return 0;
}

/* ---- physical allocations and remapping ------------------------------------------------------------- */
/* A physical allocation of `size` bytes on this process's GPU, or in host memory. */
static CUresult create_phys(CUmemGenericAllocationHandle *h, uint64_t size, int host) {
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = host ? CU_MEM_LOCATION_TYPE_HOST : CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = host ? 0 : g_ord;
    CUresult rc = REAL(cuMemCreate)(h, size, &p, 0);
    if (rc == CUDA_ERROR_INVALID_VALUE && host) { /* drivers before 12.2 know only HOST_NUMA */
        p.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
        rc = REAL(cuMemCreate)(h, size, &p, 0);
    }
    return rc;
}

/* Map a handle at va and give this process's GPU read-write access to it. */
static CUresult map_rw(uint64_t va, uint64_t size, CUmemGenericAllocationHandle h) {
    CUresult rc = REAL(cuMemMap)(va, size, 0, h, 0);
    if (rc != CUDA_SUCCESS) return rc;
    CUmemAccessDesc d;
    memset(&d, 0, sizeof d);
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = g_ord;
    d.flags = 3; /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE */
    rc = REAL(cuMemSetAccess)(va, size, &d, 1);
    if (rc != CUDA_SUCCESS) REAL(cuMemUnmap)(va, size);
    return rc;
}

/* The HBM the driver has free on this process's GPU (the evidence that HBM is short, never a neighbour's
 * claim); UINT64_MAX if the driver cannot say (then nothing is decided on it). */
static uint64_t driver_free(void) {
    size_t fr = 0, tot = 0;
    return REAL(cuMemGetInfo_v2)(&fr, &tot) == CUDA_SUCCESS ? (uint64_t)fr : UINT64_MAX;
}

/* Chunk i of a range: its offset is i * EL_CHUNK, its length EL_CHUNK but for the last. */
static uint64_t chunk_len(const struct erange *r, unsigned i) {
    uint64_t off = (uint64_t)i * EL_CHUNK;
    return r->size - off < EL_CHUNK ? r->size - off : EL_CHUNK;
}

/* Move chunk i of a range to its new physical allocation nh (in host memory if to_host, else on the device),
 * at the same address; nh is released on failure. The gate is closed and g_mu held. The bytes are copied to
 * the new allocation through a temporary mapping first, so a failure at any step leaves the old mapping
 * (and the data) in place. 0, or -1. */
static int remap(struct erange *r, unsigned i, CUmemGenericAllocationHandle nh, int to_host) {
    CUdeviceptr tmp, va = r->va + (uint64_t)i * EL_CHUNK;
    uint64_t len = chunk_len(r, i), t0 = now_ns();
    if (REAL(cuMemAddressReserve)(&tmp, len, 0, 0, 0) != CUDA_SUCCESS) {
        REAL(cuMemRelease)(nh);
        return -1;
    }
    int ok = map_rw(tmp, len, nh) == CUDA_SUCCESS;
    if (ok) {
        ok = REAL(cuMemcpyDtoD_v2)(tmp, va, len) == CUDA_SUCCESS;
        REAL(cuCtxSynchronize)();
        REAL(cuMemUnmap)(tmp, len);
    }
    REAL(cuMemAddressFree)(tmp, len);
    if (ok && REAL(cuMemUnmap)(va, len) == CUDA_SUCCESS) {
        if (map_rw(va, len, nh) == CUDA_SUCCESS) {
            REAL(cuMemRelease)(r->c[i].h);
            r->c[i].h = nh;
            r->c[i].host = to_host;
            if (to_host) { g_resident -= len; g_swapped += len; }
            else { g_swapped -= len; g_resident += len; }
            uint64_t dt = now_ns() - t0;
            if (to_host) { g_me.swap_outs++; g_me.swap_out_ns += dt; }
            else { g_me.swap_ins++; g_me.swap_in_ns += dt; }
            return 0;
        }
        if (map_rw(va, len, r->c[i].h) != CUDA_SUCCESS) /* the old handle still holds the bytes */
            shim_log(LOG_ERROR, "memslice: elastic range at 0x%llx could not be mapped back", (unsigned long long)va);
    }
    REAL(cuMemRelease)(nh);
    return -1;
}

struct refusal;
static int make_room(uint64_t need, int guaranteed, int wait, struct refusal *ref);
static int is_idle(void);

/* ---- the board -------------------------------------------------------------------------------------- */
/* Publish this process's state on its GPU's board. Caller holds g_mu. */
static void publish(uint64_t done_seq) {
    uint64_t idle = (now_ns() - __atomic_load_n(&g_last_call_ns, __ATOMIC_RELAXED)) / 1000000ull;
    g_me.magic = EB_MAGIC;
    g_me.pid = getpid();
    g_me.state = is_idle() ? EB_IDLE : EB_ACTIVE;
    g_me.request = g_cfg.request;
    g_me.limit = g_cfg.limit;
    g_me.resident = g_resident;
    g_me.swapped = g_swapped;
    g_me.idle_ms = idle;
    g_me.priority = g_cfg.priority;
    g_me.flags = g_cfg.idle_release ? EB_F_IDLE_RELEASE : 0;
    if (done_seq) g_me.done_seq = done_seq;
    g_me.ack_seq = __atomic_load_n(&g_acked, __ATOMIC_RELAXED); /* the acker's (a stale one is rewritten next tick) */
    eb_publish(&g_board, &g_me);
}

/* Idle (the issue: no CUDA call and no work in flight): no gated call for idle_after, none in progress,
 * and the GPU work queued before the last call has drained. */
static int is_idle(void) {
    uint64_t last = __atomic_load_n(&g_last_call_ns, __ATOMIC_RELAXED);
    return __atomic_load_n(&g_inflight, __ATOMIC_SEQ_CST) == 0 &&
           now_ns() - last >= g_cfg.idle_after_ms * 1000000ull && drained_since_last_call();
}

/* What this process keeps in HBM whatever it is asked (issue 26): its request, always; idle, nothing only if
 * its pod opted in (idle_release). */
static uint64_t keep_floor(int idle) {
    return idle && g_cfg.idle_release ? 0 : g_cfg.request;
}

/* How much an ask makes this process move (pure): nothing if it may not take what this process holds above
 * its floor (an active tenant's burst goes only to an ask marked EB_ASK_BURST) or if HBM is not short (the
 * driver has the asker's whole need free: issue 25, an ask is no evidence); else the asked share, at most
 * what is still missing of the need, at most what lies above the floor. */
static uint64_t yield_amount(uint64_t bits, int idle, uint64_t free_b) {
    uint64_t share = EB_ASK_SHARE(bits) << 20, need = EB_ASK_NEED(bits) << 20, floor = keep_floor(idle);
    if ((!idle && !(bits & EB_ASK_BURST)) || g_resident <= floor || !share) return 0;
    if (free_b != UINT64_MAX && free_b >= need) return 0;
    uint64_t missing = free_b == UINT64_MAX ? share : need - free_b;
    uint64_t want = share < missing ? share : missing;
    return want < g_resident - floor ? want : g_resident - floor;
}

/* Record on the board that ask `seq` could not be taken to host memory, and why (issue 26): the asker reads
 * it before it fails its burst. Caller holds g_mu. */
static void note_refused(uint64_t seq, uint64_t bytes, const struct host_verdict *v) {
    char a[32], t[400];
    g_note.seq = seq;
    g_note.cause = v->cause == HOST_ROOM_CGROUP ? EB_REFUSED_CGROUP : EB_REFUSED_HOST;
    g_note.want_mib = (uint32_t)((bytes + (1ull << 20) - 1) >> 20);
    g_note.limit = v->limit;
    g_note.used = v->used;
    if (v->cause == HOST_ROOM_CGROUP) g_note.refused_cgroup++;
    else g_note.refused_host++;
    eb_put_note(&g_board, &g_note);
    shim_log(LOG_WARN, "memslice: elastic: could not take %s to host memory for a neighbour: %s; %s",
             fmt_bytes(bytes, a, sizeof a), host_room_text(v, t, sizeof t),
             v->cause == HOST_ROOM_CGROUP ? "raise this pod's memory limit" : "the node is short of memory");
}

/* Answer ask `seq`: move chunks to host memory (the newest range's last chunks first) until `yield_amount`
 * is covered (at most one chunk more: the slack), never below the floor; nothing if the host side cannot
 * take that many bytes (issue 26: this process's cgroup, the host's memory). Caller holds g_mu. The bytes
 * moved. */
static uint64_t yield(uint64_t bits, uint64_t seq) {
    int idle = is_idle();
    uint64_t want = yield_amount(bits, idle, driver_free()), floor = keep_floor(idle), given = 0;
    if (!want) return 0;
    struct host_verdict v;
    uint64_t most = (want + EL_CHUNK - 1) / EL_CHUNK * EL_CHUNK; /* what moving whole chunks may take */
    if (host_room(most, &v) != HOST_ROOM_OK) {
        note_refused(seq, most, &v);
        return 0;
    }
    if (gate_close() < 0) return 0;
    CUmemGenericAllocationHandle nh;
    for (struct erange *r = g_ranges; r && given < want; r = r->next)
        for (unsigned i = r->n; i-- > 0 && given < want;) {
            uint64_t len = chunk_len(r, i);
            if (r->c[i].host || g_resident < floor + len) continue;
            if (create_phys(&nh, len, 1) == CUDA_SUCCESS && remap(r, i, nh, 1) == 0) given += len;
        }
    gate_open();
    if (given) g_yield_ns = coarse_ns(); /* the same clock as the activity stamp it is compared with */
    char a[32], b[32];
    shim_log(LOG_INFO, "memslice: elastic: %s moved to host memory for a neighbour that asked for %s (%s)",
             fmt_bytes(given, a, sizeof a), fmt_bytes(want, b, sizeof b),
             idle ? "idle" : "above the request");
    return given;
}

static void apply_roster(struct eb_slot *s, int *live);

/* Whether another live tenant of the GPU goes first (then this process does not bring back bytes above its
 * own request, which would only be asked back): one short of its request (issue 26, "coming back": requests
 * first), or one with bytes in host memory that ran more recently than this process (bursts come back most
 * recently active tenant first). */
static int neighbour_first(uint64_t my_idle_ms) {
    static struct eb_slot s[EB_SLOTS];
    int live[EB_SLOTS];
    eb_read_all(&g_board, s, live);
    apply_roster(s, live);
    for (int i = 0; i < EB_SLOTS; i++) {
        if (!live[i] || !s[i].swapped || now_ns() < g_skip_until[i]) continue;
        if (s[i].resident < s[i].request || s[i].idle_ms < my_idle_ms) return 1;
    }
    return 0;
}

/* The oldest host-resident chunk (the list is newest first; within a range, the first chunk): the request
 * is what was allocated first, so it comes back first. */
static struct erange *oldest_host(unsigned *idx) {
    struct erange *pick = NULL;
    for (struct erange *r = g_ranges; r; r = r->next)
        for (unsigned i = r->n; i-- > 0;)
            if (r->c[i].host) { pick = r; *idx = i; }
    return pick;
}

/* Bring back one host-resident chunk when HBM has room (issue 26, "coming back"): the request first, then
 * the bursts, only when no neighbour is short of its request and no more recently active neighbour waits
 * for its own. Memory this process yielded stays out for EL_BACK_AFTER_MS after the move (the asker takes
 * the room it made; nothing ping-pongs). One chunk per tick, so the gate is closed briefly. Caller holds
 * g_mu. */
static void swap_in_one(void) {
    if (!g_swapped) return;
    unsigned i = 0;
    struct erange *pick = oldest_host(&i);
    if (!pick) return;
    uint64_t len = chunk_len(pick, i);
    if (g_resident + len > g_cfg.request && g_yield_ns && coarse_ns() - g_yield_ns < EL_BACK_AFTER_MS * 1000000ull)
        return; /* a burst it yielded: the asker takes the room first */
    uint64_t my_idle = (now_ns() - __atomic_load_n(&g_last_call_ns, __ATOMIC_RELAXED)) / 1000000ull;
    if (g_resident + len > g_cfg.request && neighbour_first(my_idle)) return;
    CUmemGenericAllocationHandle nh;
    static uint64_t last_ask;
    if (create_phys(&nh, len, 0) != CUDA_SUCCESS) { /* HBM full: nothing is gated */
        int within = g_resident + len <= g_cfg.request;
        if ((within || !is_idle()) && now_ns() - last_ask > 1000000000ull) {
            /* short of its request: ask neighbours, bursts included; active with bursts in host memory: idle
             * neighbours and lower priorities only (without waiting; retried at most once a second) */
            last_ask = now_ns();
            make_room(within ? g_cfg.request - g_resident : g_swapped, within, 0, NULL);
        }
        return;
    }
    if (gate_close() < 0) {
        REAL(cuMemRelease)(nh);
        return;
    }
    remap(pick, i, nh, 0);
    gate_open();
}

/* The background thread: publish, answer asks, bring memory back. It makes CUDA calls in the context of the
 * elastic allocations. An ask is acknowledged at once by the acker (askers skip a slot that does not ack
 * within EL_ACK_MS: issue 25, a forged slot that never answers costs them that much, once), answered at most
 * once per EL_YIELD_GAP_MS (issue 25: asks are rate-limited per slot; a newer ask replaces a waiting one),
 * the ticks between free for bringing this process's own memory back. */
static void *elastic_thread(void *arg) {
    (void)arg;
    REAL(cuCtxSetCurrent)(g_ctx);
    uint64_t handled = 0, answered_ns = 0;
    for (;;) {
        struct eb_ask a = eb_my_ask(&g_board);
        int answer = a.seq && a.seq != handled && now_ns() - answered_ns >= EL_YIELD_GAP_MS * 1000000ull;
        pthread_mutex_lock(&g_mu);
        uint64_t done = 0;
        if (answer) {
            uint64_t moved = yield(a.bytes, a.seq);
            answered_ns = now_ns();
            g_me.done_moved_mib = (uint32_t)((moved + (1ull << 20) - 1) >> 20);
            handled = done = a.seq;
        } else {
            swap_in_one();
        }
        drain_probe();
        publish(done);
        pthread_mutex_unlock(&g_mu);
        sleep_ms(TICK_MS);
    }
    return NULL;
}

/* The acker: acknowledges an ask as soon as it is posted, even while the background thread is in the middle
 * of a move (askers skip a slot that does not acknowledge within EL_ACK_MS). One pread per 10 ms. */
static void *acker_thread(void *arg) {
    (void)arg;
    uint64_t seen = 0;
    for (;;) {
        struct eb_ask a = eb_my_ask(&g_board);
        if (a.seq && a.seq != seen) {
            __atomic_store_n(&g_acked, a.seq, __ATOMIC_RELAXED);
            eb_ack(&g_board, a.seq);
            seen = a.seq;
        }
        sleep_ms(10);
    }
    return NULL;
}

/* Elastic memory lives on one GPU per process (docs/architecture.md, "Elastic memory on one GPU per
 * process"): say once per other GPU that its allocations take the plain path. Caller holds g_mu. */
static void say_other_gpu(int dev) {
    static uint64_t said; /* ledger indices already named (one bit each) */
    if (dev < 0 || dev >= 64 || (said & (1ull << dev))) return;
    said |= 1ull << dev;
    shim_log(LOG_WARN, "memslice: elastic memory is on %s in this process (the first GPU it allocated on); its "
             "allocations on %s take the plain path: charged to the limit, never moved to host memory, and not "
             "on that GPU's board (neighbours there cannot ask it for HBM, nor it them)",
             g_ledger.r->dev[g_dev].uuid, g_ledger.r->dev[dev].uuid);
}

/* The first elastic allocation of the process: its GPU, context, board slot and background thread. Caller
 * holds g_mu. 0, or -1 (then allocations take the plain path). Without a slot (the assigned one held by
 * another process, or none free) the process stays elastic: it asks its neighbours for its request, it
 * just cannot be asked. */
static int elastic_setup(int dev, CUdevice ord) {
    if (g_thread_started) {
        if (g_dev == dev) return 0;
        say_other_gpu(dev);
        return -1;
    }
    char err[512];
    if (REAL(cuCtxGetCurrent)(&g_ctx) != CUDA_SUCCESS || !g_ctx) return -1;
    int rc = eb_open(&g_board, g_cfg.elastic_dir, g_ledger.r->dev[dev].uuid, g_cfg.elastic_slot, err, sizeof err);
    if (rc < 0) {
        shim_log(LOG_ERROR, "memslice: elastic memory is off in this process: %s", err);
        g_elastic = 0;
        return -1;
    }
    if (rc > 0)
        shim_log(LOG_WARN, "memslice: elastic: %s; this process asks its neighbours for HBM but cannot be asked "
                 "(its memory above the request stays where it is)", err);
    g_dev = dev;
    g_ord = ord;
    if (drainer_start() < 0) return -1;
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &at, elastic_thread, NULL) != 0 ||
        (g_board.slot >= 0 && pthread_create(&t, &at, acker_thread, NULL) != 0)) {
        pthread_attr_destroy(&at);
        return -1;
    }
    pthread_attr_destroy(&at);
    g_thread_started = 1;
    publish(0);
    return 0;
}

/* What a live neighbour's slot says it could give (a claim, used only to choose whom to ask and for how
 * much; the driver's free memory is the evidence): pass 0, an idle tenant's bytes above its floor; pass 1,
 * an active tenant's burst, only for this process's request (`guaranteed`) or to a higher priority than the
 * neighbour's (issue 26: never the reverse; equal priorities, only for a request). */
static uint64_t claim_of(const struct eb_slot *s, int pass, int guaranteed) {
    if (pass == 0) {
        if (s->state != EB_IDLE) return 0;
        uint64_t floor = s->flags & EB_F_IDLE_RELEASE ? 0 : s->request;
        return s->resident > floor ? s->resident - floor : 0;
    }
    if (s->state != EB_ACTIVE || s->resident <= s->request) return 0;
    if (!guaranteed && s->priority >= g_cfg.priority) return 0; /* a burst takes only a lower priority's */
    return s->resident - s->request;
}

/* Claimed figures are not evidence (issue 25): where the agent wrote a roster, only the slots it assigned
 * may be asked, with the request, priority and opt-in it recorded, and what a slot says it holds is capped
 * by the limit it recorded. */
static void apply_roster(struct eb_slot *s, int *live) {
    struct eb_roster_ent ro[EB_SLOTS];
    if (!eb_read_roster(g_cfg.elastic_dir, g_ledger.r->dev[g_dev].uuid, ro)) return;
    for (int i = 0; i < EB_SLOTS; i++) {
        if (!(ro[i].flags & EB_R_ASSIGNED)) {
            live[i] = 0;
            continue;
        }
        uint64_t lim = (uint64_t)ro[i].limit_mib << 20;
        s[i].request = (uint64_t)ro[i].request_mib << 20;
        s[i].limit = lim;
        s[i].priority = ro[i].priority;
        s[i].flags = ro[i].flags & EB_R_IDLE_RELEASE ? EB_F_IDLE_RELEASE : 0;
        if (s[i].resident > lim) s[i].resident = lim;
    }
}

/* Choose whom to ask and for how much (issue 26: only what is needed, longest-idle first, then bursting
 * active tenants by lowest priority): asks go out in order until the claimed shares cover `left`. Slots
 * in `taken` (asked already, or skipped) are not asked; those asked are added. The bytes not covered. */
static uint64_t ask_more(struct eb_slot *s, int *live, int *taken, uint64_t seq, uint64_t left, uint64_t need,
                         int guaranteed, int *asked, int *n) {
    for (int pass = 0; pass < 2 && left; pass++)
        for (;;) {
            int best = -1;
            for (int i = 0; i < EB_SLOTS; i++) {
                if (!live[i] || taken[i] || !claim_of(&s[i], pass, guaranteed)) continue;
                if (best < 0 || (pass == 1 && s[i].priority < s[best].priority) ||
                    ((pass == 0 || s[i].priority == s[best].priority) && s[i].idle_ms > s[best].idle_ms)) best = i;
            }
            if (best < 0 || !left) break;
            uint64_t c = claim_of(&s[best], pass, guaranteed), share = c < left ? c : left;
            eb_ask(&g_board, best, seq, EB_ASK_PACK((share + (1ull << 20) - 1) >> 20, (need + (1ull << 20) - 1) >> 20,
                                                    pass == 1));
            taken[best] = 1;
            asked[(*n)++] = best;
            left -= share;
        }
    return left;
}

/* The asker's needed/moved figures (issue 26: metrics and `memslice top` show moved / needed per ask). */
static void count_ask(uint64_t need, const int *asked, int n, uint64_t seq) {
    uint64_t got = 0;
    for (int k = 0; k < n; k++) got += eb_moved_for(&g_board, asked[k], seq);
    pthread_mutex_lock(&g_mu);
    g_me.asks++;
    g_me.asked_mib += (uint32_t)((need + (1ull << 20) - 1) >> 20);
    g_me.got_mib += (uint32_t)got;
    publish(0);
    pthread_mutex_unlock(&g_mu);
    char a[32], b[32];
    shim_log(LOG_INFO, "memslice: elastic: asked %d neighbour(s) for %s; they moved %s", n,
             fmt_bytes(need, a, sizeof a), fmt_bytes(got << 20, b, sizeof b));
}

/* Ask neighbours for `need` bytes of HBM and wait (bounded) for their answers (issues 25, 26). Asks go
 * to idle tenants first, longest idle first, then (for an ask that may take bursts) bursting active ones,
 * each for a share of what is needed. Claimed figures are not evidence: the wait ends when the driver has
 * `need` free, when every asked slot has answered, or at the deadline; a slot that has not acknowledged
 * its ask within EL_ACK_MS is skipped (EL_SKIP_NOACK_MS, on every path) and its share asked of the next one. A
 * neighbour that has acknowledged but not answered by the deadline is skipped too. A neighbour that answered
 * it could not take its share to host memory is returned in *ref (ref->slot -1: none). Returns how many were
 * asked. */
static int make_room(uint64_t need, int guaranteed, int wait, struct refusal *ref) {
    struct eb_slot s[EB_SLOTS];
    int live[EB_SLOTS], taken[EB_SLOTS] = {0}, asked[EB_SLOTS], share_open[EB_SLOTS] = {0}, n = 0;
    uint64_t seq = now_ns(), t_ask[EB_SLOTS];
    eb_read_all(&g_board, s, live);
    apply_roster(s, live);
    for (int i = 0; i < EB_SLOTS; i++) taken[i] = g_skip_until[i] > seq;
    ask_more(s, live, taken, seq, need, need, guaranteed, asked, &n);
    for (int k = 0; k < n; k++) { t_ask[k] = seq; share_open[k] = 1; }
    uint64_t deadline = seq + (wait ? g_cfg.yield_wait_ms * 1000000ull : 0);
    while (wait && now_ns() < deadline) {
        sleep_ms(2);
        int pending = 0;
        uint64_t reask = 0;
        for (int k = 0; k < n; k++) {
            if (!share_open[k]) continue;
            int i = asked[k];
            if (!eb_alive(&g_board, i) || eb_done_seq(&g_board, i) >= seq) { share_open[k] = 0; continue; }
            if (eb_ack_seq(&g_board, i) < seq && now_ns() - t_ask[k] > EL_ACK_MS * 1000000ull) {
                share_open[k] = 0; /* forged or hung: its claimed share is asked of the next neighbour */
                g_skip_until[i] = now_ns() + EL_SKIP_NOACK_MS * 1000000ull;
                uint64_t c = claim_of(&s[i], s[i].state == EB_IDLE ? 0 : 1, guaranteed);
                reask += c < need ? c : need;
                shim_log(LOG_WARN, "memslice: elastic: the tenant in slot %d of the board did not acknowledge an ask "
                         "within %d ms; it is skipped for %d s", i, EL_ACK_MS, EL_SKIP_NOACK_MS / 1000);
                continue;
            }
            pending++;
        }
        if (reask) {
            int before = n;
            ask_more(s, live, taken, seq, reask, need, guaranteed, asked, &n);
            for (int k = before; k < n; k++) { t_ask[k] = now_ns(); share_open[k] = 1; pending++; }
        }
        if (!pending) break;
        uint64_t fr = driver_free();
        if (fr != UINT64_MAX && fr >= need) break;
    }
    for (int k = 0; wait && k < n; k++) /* not answered in time: not asked again for 30 s */
        if (share_open[k] && eb_alive(&g_board, asked[k]) && eb_done_seq(&g_board, asked[k]) < seq &&
            now_ns() >= deadline) {
            g_skip_until[asked[k]] = now_ns() + 30000000000ull;
            shim_log(LOG_WARN, "memslice: elastic: the tenant in slot %d of the board did not yield HBM within "
                     "%llu ms; it is skipped for 30 s and the allocation is served from host memory", asked[k],
                     (unsigned long long)g_cfg.yield_wait_ms);
        }
    if (ref) {
        ref->slot = -1;
        for (int k = 0; k < n && ref->slot < 0; k++)
            if (eb_note_for(&g_board, asked[k], seq, &ref->note)) {
                ref->slot = asked[k];
                ref->pid = s[asked[k]].pid;
            }
    }
    if (wait && n) count_ask(need, asked, n, seq);
    return n;
}

/* ---- allocation and free ---------------------------------------------------------------------------- */
/* A burst that could not be had because a neighbour could not take its share to host memory (issue 26):
 * fail it, naming the cause, and count it in this process's host note. */
static CUresult burst_refused(uint64_t len, const struct refusal *ref) {
    char a[32], b[32], c[32], d[32];
    const struct eb_hostnote *nt = &ref->note;
    int cg = nt->cause == EB_REFUSED_CGROUP;
    pthread_mutex_lock(&g_mu);
    g_note.bursts_failed++;
    eb_put_note(&g_board, &g_note);
    pthread_mutex_unlock(&g_mu);
    shim_log(LOG_ERROR, "memslice: elastic: a burst of %s failed (CUDA_ERROR_OUT_OF_MEMORY): GPU memory is full and "
             "the tenant in slot %d of the board (pid %d) could not take %s to host memory: %s %s, %s %s; %s",
             fmt_bytes(len, a, sizeof a), ref->slot, (int)ref->pid, fmt_bytes((uint64_t)nt->want_mib << 20, b, sizeof b),
             cg ? "its memory cgroup's memory.max" : "the host's MemTotal", fmt_bytes(nt->limit, c, sizeof c),
             cg ? "memory.current" : "in use", fmt_bytes(nt->used, d, sizeof d),
             cg ? "raise that pod's memory limit" : "the node is short of host memory");
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* Host memory for a chunk this process places there itself: only if its own cgroup and the host can take it
 * (issue 26), else CUDA_ERROR_OUT_OF_MEMORY naming why. */
static CUresult own_host(CUmemGenericAllocationHandle *h, uint64_t len) {
    struct host_verdict v;
    if (host_room(len, &v) == HOST_ROOM_OK) return create_phys(h, len, 1);
    char a[32], t[400];
    shim_log(LOG_ERROR, "memslice: elastic: %s could not be had in GPU memory nor in host memory "
             "(CUDA_ERROR_OUT_OF_MEMORY): %s; %s", fmt_bytes(len, a, sizeof a), host_room_text(&v, t, sizeof t),
             v.cause == HOST_ROOM_CGROUP ? "raise this pod's memory limit" : "the node is short of memory");
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* Physical memory for chunk i of a new range: HBM if the driver has it, else (once per range: *asked) after
 * asking neighbours for what the range still lacks, else host memory at once; a burst fails instead if a
 * neighbour could not take its share to host memory (issue 26). */
static CUresult place_chunk(struct erange *r, unsigned i, int *asked) {
    uint64_t len = chunk_len(r, i);
    r->c[i].host = 0;
    if (create_phys(&r->c[i].h, len, 0) == CUDA_SUCCESS) return CUDA_SUCCESS;
    uint64_t rest = r->size - (uint64_t)i * EL_CHUNK;
    pthread_mutex_lock(&g_mu);
    uint64_t held = g_resident + (uint64_t)i * EL_CHUNK;
    pthread_mutex_unlock(&g_mu);
    int guaranteed = held + len <= g_cfg.request;
    if (!*asked) {
        *asked = 1;
        /* the part within the request may take active tenants' bursts; a burst, only idle memory above its
         * owner's floor and lower priorities' bursts */
        uint64_t within = held < g_cfg.request ? g_cfg.request - held : 0;
        if (within > rest) within = rest;
        /* the request asks again (up to 3 rounds, each bounded) when another asker took the room first */
        struct refusal ref = {.slot = -1};
        for (int round = 0; round < (within ? 3 : 1); round++) {
            if (make_room(within ? within : rest, within > 0, 1, &ref) <= 0) break;
            if (create_phys(&r->c[i].h, len, 0) == CUDA_SUCCESS) return CUDA_SUCCESS;
        }
        if (!within && ref.slot >= 0) return burst_refused(rest, &ref);
    }
    char a[32];
    shim_log(LOG_INFO, "memslice: elastic: %s served from host memory (HBM is full%s)", fmt_bytes(len, a, sizeof a),
             guaranteed ? " and neighbours did not yield in time; it moves to HBM when HBM frees up" : "");
    r->c[i].host = 1;
    return own_host(&r->c[i].h, len);
}

/* Unmap and release chunks [0, upto) of a range and give back its address range. */
static void unmap_chunks(struct erange *r, unsigned upto, int mapped) {
    for (unsigned i = 0; i < upto; i++) {
        if (mapped) REAL(cuMemUnmap)(r->va + (uint64_t)i * EL_CHUNK, chunk_len(r, i));
        REAL(cuMemRelease)(r->c[i].h);
    }
    REAL(cuMemAddressFree)(r->va, r->size);
}

/* An address range with physical memory mapped chunk by chunk (the unit that moves: issue 26, only what is
 * needed moves): HBM where it can be had, else host memory. g_mu is not held while neighbours are asked for
 * room, so this process's own thread still answers its neighbours. */
static CUresult map_new(struct erange *r) {
    CUresult rc = REAL(cuMemAddressReserve)(&r->va, r->size, 0, 0, 0);
    if (rc != CUDA_SUCCESS) return rc;
    int asked = 0;
    for (unsigned i = 0; i < r->n; i++) {
        if ((rc = place_chunk(r, i, &asked)) != CUDA_SUCCESS) {
            unmap_chunks(r, i, 1);
            return rc;
        }
        if ((rc = map_rw(r->va + (uint64_t)i * EL_CHUNK, chunk_len(r, i), r->c[i].h)) != CUDA_SUCCESS) {
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
    pthread_mutex_lock(&g_mu);
    int ok = elastic_setup(dev, ord) == 0;
    pthread_mutex_unlock(&g_mu);
    return ok;
}

/* cuMemAlloc in elastic mode, once place() chose it and the quota (the limit) is charged `size` bytes (2 MiB
 * units): the memory placed chunk by chunk by place_chunk(), the range tracked for cuMemFree and for moving.
 * On failure nothing is held here; the caller gives the charge back. */
CUresult elastic_alloc(CUdeviceptr *dptr, uint64_t size, int dev) {
    unsigned chunks = (unsigned)((size + EL_CHUNK - 1) / EL_CHUNK);
    struct erange *r = calloc(1, sizeof *r + chunks * sizeof r->c[0]);
    if (!r) return CUDA_ERROR_OUT_OF_MEMORY;
    r->size = size;
    r->n = chunks;
    CUresult rc = map_new(r);
    if (rc != CUDA_SUCCESS) {
        free(r);
        return rc;
    }
    pthread_mutex_lock(&g_mu);
    r->next = g_ranges;
    g_ranges = r;
    for (unsigned i = 0; i < r->n; i++) {
        if (r->c[i].host) g_swapped += chunk_len(r, i);
        else g_resident += chunk_len(r, i);
    }
    track(r->va, size, dev, A_ELASTIC, (uint64_t)(uintptr_t)r);
    publish(0);
    pthread_mutex_unlock(&g_mu);
    *dptr = r->va;
    return CUDA_SUCCESS;
}

/* cuMemFree of an elastic range: wherever its bytes are, unmap and release them, give the quota back. The
 * synchronize (cuMemFree waits for the device like this, too, without a bound) comes before g_mu, so a free
 * waiting for queued work never stops the background thread from answering neighbours; a move in between
 * is harmless (the range's current handles are read under g_mu). */
CUresult elastic_free(const ms_rec *rec) {
    struct erange *r = (struct erange *)(uintptr_t)rec->aux;
    REAL(cuCtxSynchronize)();
    pthread_mutex_lock(&g_mu);
    for (unsigned i = 0; i < r->n; i++) {
        if (r->c[i].host) g_swapped -= chunk_len(r, i);
        else g_resident -= chunk_len(r, i);
    }
    unmap_chunks(r, r->n, 1);
    for (struct erange **p = &g_ranges; *p; p = &(*p)->next)
        if (*p == r) { *p = r->next; break; }
    publish(0);
    pthread_mutex_unlock(&g_mu);
    uncharge(rec->dev, rec->size);
    free(r);
    return CUDA_SUCCESS;
}

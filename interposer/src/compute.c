/* The compute share (docs/architecture.md "Compute share"): GPU time measured per process from the
 * shim's own events around each launch, a per-GPU board where each container publishes its recent share and
 * demand (compute_board.c), and a gate before each launch (compute_decide.c decides; this file waits).
 *
 * Per GPU: a process that launches on several GPUs is measured, gated and arbitrated on each GPU's board
 * separately (struct cs_dev), with the same request, limit and slot number (the limits file's are per GPU).
 *
 * Launch path (compute_gate_slow / compute_done_slow, only when a share is set): the current context's GPU (a
 * lock-free look-up; bound on its first launch there), a bounded wait while that GPU's verdict says so, then
 * under that GPU's mutex an event after the launch on its stream (and one before it when that stream has none
 * of our launches in flight: else the previous end is its start); at most CS_DEPTH launches are in flight per
 * process and GPU, so the GPU's queue stays short and the measured spans are this process's. No system call on
 * the common path (the clock is the vDSO's). Everything else runs on one board thread, every CS_TICK_NS: per
 * GPU it reaps completed launches (their GPU span, divided among the containers that had work on the GPU then:
 * the driver time-slices between them), publishes this process's record, reads the neighbours' and sets the
 * verdict. A board that cannot be used leaves the limit enforced from this process's own measurement and says
 * so once; every wait is bounded. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "compute_int.h"
#include "shim.h"

#define CS_DEPTH 4                          /* launches in flight per process */
#define CS_RING (2 * CS_DEPTH)              /* event slots: a slot is reused only after the one after it is reaped */
#define CS_BUCKETS 16
#define CS_BUCKET_NS 8000000ull             /* the share's window: 16 x 8 ms */
#define CS_TICK_NS 1000000ull               /* the board thread's period while the process launches */
#define CS_IDLE_TICK_NS 20000000ull         /* ... and while it has not for a second */
#define CS_DEMAND_NS 10000000ull            /* launched within this: demand */
#define CS_HOLD_MAX_NS 500000000ull         /* the longest one launch waits for neighbours */
#define CS_LIMIT_MAX_NS 2000000000ull       /* the longest one launch waits at its limit */
#define CS_POLL_NS 100000ull                /* how often a waiting launch looks at the verdict */
#define CS_RESCAN_NS 100000000ull           /* roster and new slot files, every 100 ms */
#define CS_REOPEN_NS 1000000000ull          /* every slot file reopened (a replaced one), every second */
#define CS_DEVS 16                          /* GPUs one process is measured on (more: unmeasured, said once) */

int g_compute;

/* One GPU's share in this process: the context measured there (its first launch's), the launches in flight, the
 * window of charged GPU time, the verdict and that GPU's board. The mutex covers the in-flight queue and the
 * counters the launch path and the board thread both touch. */
struct cs_dev {
    pthread_mutex_t mu;
    CUcontext ctx;                          /* the context the events belong to (the first launch's on this GPU) */
    CUdevice ord;
    int held;                               /* its index + 1: compute_gate_slow's answer while its mutex is held */
    int measuring, boarded;                 /* events usable; board open */
    CUevent ev_start[CS_RING], ev_end[CS_RING];
    CUstream stream[CS_RING];
    int own_start[CS_RING];                 /* 1: ev_start was recorded; 0: it starts at the previous end */
    int busy_at[CS_RING];                   /* n_busy when each in-flight launch was made */
    int head, count;                        /* the in-flight queue: count <= CS_DEPTH slots from head */
    uint64_t bucket[CS_BUCKETS], epoch[CS_BUCKETS], first_ns;
    uint64_t avg_ns;                        /* charged GPU time per launch, moving average (in-flight estimate) */
    uint64_t used_ns, throttled_ns, waited_ns, launches, last_launch_ns;
    uint64_t next_rescan, next_reopen;      /* the board thread's */
    int n_busy;                             /* containers with work on this GPU, this one included */
    int verdict;                            /* enum cs_verdict, set by the board thread */
    int waiting;                            /* launches waiting now (their demand counts) */
    struct cs_board board;
    char uuid[96];
};
_Static_assert(offsetof(struct cs_dev, mu) == 0, "dev_reset clears all but the mutex, the first member");

/* The compute share's state: one per process, one cs_dev per GPU it launched on (the same request, limit and
 * slot number on each GPU's board: the limits file's figures are per GPU). dev[0..n_dev) are bound; a slot is
 * filled under mu and published by the release store of n_dev, so the launch path finds its GPU without a lock. */
static struct compute {
    pthread_mutex_t mu;                     /* binding a GPU, starting the thread */
    int request, limit;                     /* percent; limit 100 when none */
    int started, n_dev, said_full;          /* thread running; GPUs bound; "more GPUs than CS_DEVS" said */
    struct cs_dev dev[CS_DEVS];
} g_cs = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* CLOCK_MONOTONIC in ns: the board's clock (the same for every process of the machine). */
static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(uint64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    nanosleep(&ts, NULL);
}

/* A GPU's state before its first launch (also a forked child's: no events, no board). */
static void dev_reset(struct cs_dev *d) {
    pthread_mutex_init(&d->mu, NULL);
    memset((char *)d + sizeof d->mu, 0, sizeof *d - sizeof d->mu);
    d->n_busy = 1;
    d->board.fd = -1;
    d->board.slot = -1;
}

/* Start-up (lifecycle.c): a share is on when the configuration names a request, a limit or a board. */
void compute_start(void) {
    const struct shim_config *c = &g_cfg;
    if (c->compute_request < 0 && !c->compute_limit && !c->compute_dir[0]) return;
    g_cs.request = c->compute_request > 0 ? c->compute_request : 0;
    g_cs.limit = c->compute_limit ? c->compute_limit : 100;
    for (int i = 0; i < CS_DEVS; i++) {
        dev_reset(&g_cs.dev[i]);
        g_cs.dev[i].held = i + 1;
    }
    __atomic_store_n(&g_compute, 1, __ATOMIC_RELEASE);
}

/* Charge GPU time to the bucket of `now` (the window slides by dropping buckets of older epochs). */
static void charge_locked(struct cs_dev *d, uint64_t ns, uint64_t now) {
    uint64_t ep = now / CS_BUCKET_NS;
    int i = (int)(ep % CS_BUCKETS);
    if (d->epoch[i] != ep) {
        d->epoch[i] = ep;
        d->bucket[i] = 0;
    }
    d->bucket[i] += ns;
    d->used_ns += ns;
}

/* Pop the launches that completed, oldest first, charging each its span divided by the containers that had
 * work on the GPU (the driver time-slices between contexts): their number when it was launched and now,
 * averaged. */
static void reap_locked(struct cs_dev *d, uint64_t now) {
    __auto_type query = REAL(cuEventQuery);
    __auto_type elapsed = REAL(cuEventElapsedTime);
    while (d->count && query && elapsed) {
        int i = d->head;
        CUevent start = d->own_start[i] ? d->ev_start[i] : d->ev_end[(i + CS_RING - 1) % CS_RING];
        CUresult r = query(d->ev_end[i]);
        if (r == CUDA_ERROR_NOT_READY) break;
        float ms = 0;
        if (r == CUDA_SUCCESS && elapsed(&ms, start, d->ev_end[i]) == CUDA_SUCCESS && ms > 0) {
            int n = __atomic_load_n(&d->n_busy, __ATOMIC_RELAXED) + d->busy_at[i];
            uint64_t ns = (uint64_t)((double)ms * 2e6 / (n > 1 ? n : 2));
            charge_locked(d, ns, now);
            d->avg_ns = d->avg_ns ? (d->avg_ns * 7 + ns) / 8 : ns;
        }
        d->head = (d->head + 1) % CS_RING;
        d->count--;
    }
}

/* This process's share of one GPU over the window, per mille; with `pending`, the launches still in flight
 * count at their average cost (what they will add: the gate then closes before a burst overshoots). */
static int own_share_pm(struct cs_dev *d, uint64_t now, int pending) {
    uint64_t cur = now / CS_BUCKET_NS, sum = 0;
    pthread_mutex_lock(&d->mu);
    for (int i = 0; i < CS_BUCKETS; i++)
        if (d->epoch[i] + CS_BUCKETS > cur && d->epoch[i] <= cur) sum += d->bucket[i];
    if (pending) sum += (uint64_t)d->count * d->avg_ns;
    uint64_t first = d->first_ns;
    pthread_mutex_unlock(&d->mu);
    uint64_t window = (CS_BUCKETS - 1) * CS_BUCKET_NS + now % CS_BUCKET_NS;
    if (now - first < window) window = now - first;
    if (window < CS_TICK_NS) window = CS_TICK_NS;
    uint64_t pm = sum * 1000 / window;
    return pm > 1000 ? 1000 : (int)pm;
}

/* This process's record on one GPU's board, as neighbours there read it. */
static void publish(struct cs_dev *d, uint64_t now, int share_pm, uint32_t extra) {
    struct cs_record r = {.magic = CS_RECORD_MAGIC, .version = CS_RECORD_VERSION, .pid = getpid(),
                          .request = (uint8_t)g_cs.request, .limit = (uint8_t)g_cs.limit,
                          .priority = g_cfg.priority, .share_pm = (uint32_t)share_pm, .stamp_ns = now};
    pthread_mutex_lock(&d->mu);
    int busy = d->count > 0;
    r.flags = (uint16_t)(extra | (busy ? CS_F_INFLIGHT : 0) |
                         (busy || __atomic_load_n(&d->waiting, __ATOMIC_RELAXED) ||
                          d->last_launch_ns + CS_DEMAND_NS > now ? CS_F_DEMAND : 0));
    r.used_ns = d->used_ns;
    r.throttled_ns = d->throttled_ns;
    r.waited_ns = d->waited_ns;
    r.launches = d->launches;
    pthread_mutex_unlock(&d->mu);
    cb_publish(&d->board, &r);
}

/* One round of the board thread for one GPU: reap, measure, read the neighbours there, decide, publish. */
static void board_round(struct cs_dev *d, uint64_t now) {
    pthread_mutex_lock(&d->mu);
    reap_locked(d, now);
    pthread_mutex_unlock(&d->mu);
    struct cs_peer me = {.request = g_cs.request, .limit = g_cs.limit, .priority = g_cfg.priority,
                        .share_pm = own_share_pm(d, now, 1)};
    int mine = own_share_pm(d, now, 0);
    static struct cs_peer peers[CS_SLOTS]; /* the board thread's only */
    int n = 0;
    if (d->boarded) {
        if (now >= d->next_rescan) {
            int reopen = now >= d->next_reopen;
            cb_read_roster(&d->board);
            cb_rescan(&d->board, reopen);
            d->next_rescan = now + CS_RESCAN_NS;
            if (reopen) d->next_reopen = now + CS_REOPEN_NS;
        }
        int siblings = 0;
        n = cb_read_peers(&d->board, now, peers, &siblings);  /* (theirs: completed work only) */
        me.share_pm += siblings;
        int busy = 1;
        for (int i = 0; i < n; i++) busy += peers[i].inflight;
        __atomic_store_n(&d->n_busy, busy, __ATOMIC_RELAXED);
    }
    __atomic_store_n(&d->verdict, (int)cs_decide(&me, peers, n), __ATOMIC_RELEASE);
    publish(d, now, mine, d->boarded ? 0 : CS_F_UNARBITRATED);
}

/* The board thread: a round on every bound GPU every tick (slower once the process has not launched anywhere
 * for a second). */
static void *board_thread(void *arg) {
    (void)arg;
    for (;;) {
        uint64_t now = mono_ns();
        int n = __atomic_load_n(&g_cs.n_dev, __ATOMIC_ACQUIRE), idle = 1;
        for (int i = 0; i < n; i++) {
            struct cs_dev *d = &g_cs.dev[i];
            board_round(d, now);
            /* (a launch may have stamped last_launch_ns after `now` was read: compare without subtracting) */
            idle &= __atomic_load_n(&d->last_launch_ns, __ATOMIC_RELAXED) + 1000000000ull < now && !d->count;
        }
        sleep_ns(idle ? CS_IDLE_TICK_NS : CS_TICK_NS);
    }
    return NULL;
}

/* A GPU's first launch (context `ctx` current, on GPU `ord`): create the events there and open that GPU's
 * board with the configured slot. Caller holds g_cs.mu; d is not published yet. */
static void dev_open(struct cs_dev *d, CUcontext ctx, CUdevice ord) {
    d->ord = ord;
    d->first_ns = mono_ns();
    __auto_type create = REAL(cuEventCreate);
    int ok = create != NULL;
    for (int i = 0; i < CS_RING && ok; i++)
        ok = create(&d->ev_start[i], 0 /* CU_EVENT_DEFAULT: timed */) == CUDA_SUCCESS &&
             create(&d->ev_end[i], 0 /* CU_EVENT_DEFAULT: timed */) == CUDA_SUCCESS;
    d->measuring = ok;
    if (uuid_text(ord, d->uuid, sizeof d->uuid) < 0) d->uuid[0] = 0;
    char err[400] = "no compute directory configured (compute_dir / MEMSLICE_COMPUTE_DIR)";
    if (!d->measuring) snprintf(err, sizeof err, "the launch's context has no usable events");
    else if (g_cfg.compute_dir[0] && d->uuid[0] &&
             cb_open(&d->board, g_cfg.compute_dir, d->uuid, g_cfg.compute_slot, err, sizeof err) == 0)
        d->boarded = 1;
    if (!d->boarded)
        shim_log(g_cfg.compute_dir[0] ? LOG_WARN : LOG_INFO, "memslice: compute share unarbitrated on %s (%s): this "
                 "process keeps its own limit of %d%% there, neighbours' shares are not seen; point compute_dir "
                 "(MEMSLICE_COMPUTE_DIR) at the node's compute directory to share the GPU by requests",
                 d->uuid[0] ? d->uuid : "its GPU", err, g_cs.limit);
    else
        shim_log(LOG_INFO, "memslice: compute share %d%%:%d%% on %s, slot %d%s", g_cs.request, g_cs.limit, d->uuid,
                 d->board.slot, d->board.have_roster ? " (rostered)" : "");
    __atomic_store_n(&d->ctx, ctx, __ATOMIC_RELEASE); /* last: dev_of finds it complete */
}

/* The board thread, once per process. Caller holds g_cs.mu. */
static void start_thread_locked(void) {
    g_cs.started = 1;
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &a, board_thread, NULL) != 0) shim_log(LOG_WARN, "memslice: compute: no board thread");
    pthread_attr_destroy(&a);
}

/* The GPU of a context met for the first time: its bound state (a second context on a bound GPU shares that
 * GPU's verdict, unmeasured), or a new one, or NULL (no device, or more GPUs than CS_DEVS: unmeasured). */
static struct cs_dev *dev_bind(CUcontext ctx) {
    CUdevice ord;
    __auto_type get_dev = REAL(cuCtxGetDevice);
    if (!get_dev || get_dev(&ord) != CUDA_SUCCESS) return NULL;
    pthread_mutex_lock(&g_cs.mu);
    struct cs_dev *d = NULL;
    int n = g_cs.n_dev;
    for (int i = 0; i < n && !d; i++)
        if (g_cs.dev[i].ctx == ctx || g_cs.dev[i].ord == ord) d = &g_cs.dev[i];
    if (!d && n < CS_DEVS) {
        d = &g_cs.dev[n];
        dev_open(d, ctx, ord);
        __atomic_store_n(&g_cs.n_dev, n + 1, __ATOMIC_RELEASE);
        if (!g_cs.started) start_thread_locked();
    } else if (!d && !g_cs.said_full) {
        g_cs.said_full = 1;
        shim_log(LOG_WARN, "memslice: compute: this process launches on more than %d GPUs; launches on the others "
                 "are neither measured nor limited", CS_DEVS);
    }
    pthread_mutex_unlock(&g_cs.mu);
    return d;
}

/* The bound GPU whose measured context is `ctx` (lock-free: a slot's ctx is stored last, with release, and
 * never changes until fork), or NULL. The first GPU is looked at first: one compare on a one-GPU process. */
static inline struct cs_dev *dev_of(CUcontext ctx) {
    if (__atomic_load_n(&g_cs.dev[0].ctx, __ATOMIC_ACQUIRE) == ctx) return &g_cs.dev[0];
    int n = __atomic_load_n(&g_cs.n_dev, __ATOMIC_ACQUIRE);
    for (int i = 1; i < n; i++)
        if (__atomic_load_n(&g_cs.dev[i].ctx, __ATOMIC_ACQUIRE) == ctx) return &g_cs.dev[i];
    return NULL;
}

/* Wait while the GPU's verdict (v, not CS_GO) says so, at most CS_HOLD_MAX_NS for neighbours and
 * CS_LIMIT_MAX_NS at the limit. */
__attribute__((noinline)) static void wait_verdict(struct cs_dev *d, int v) {
    uint64_t t0 = mono_ns(), now = t0, bound = v == CS_WAIT_LIMIT ? CS_LIMIT_MAX_NS : CS_HOLD_MAX_NS;
    __atomic_add_fetch(&d->waiting, 1, __ATOMIC_RELAXED);
    while (v != CS_GO && now - t0 < bound) {
        sleep_ns(CS_POLL_NS);
        v = __atomic_load_n(&d->verdict, __ATOMIC_ACQUIRE);
        now = mono_ns();
        if (v == CS_WAIT_LIMIT) bound = CS_LIMIT_MAX_NS; /* the bound of what it waits for now */
        else if (v != CS_GO) bound = CS_HOLD_MAX_NS;
    }
    __atomic_sub_fetch(&d->waiting, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&d->mu);
    if (bound == CS_LIMIT_MAX_NS) d->throttled_ns += now - t0;
    else d->waited_ns += now - t0;
    pthread_mutex_unlock(&d->mu);
    static uint64_t last_log;
    if (v != CS_GO && now - __atomic_load_n(&last_log, __ATOMIC_RELAXED) > 10000000000ull) {
        __atomic_store_n(&last_log, now, __ATOMIC_RELAXED);
        shim_log(LOG_WARN, "memslice: compute: a launch on %s waited %llu ms (the bound) for %s; it goes now", d->uuid,
                 (unsigned long long)((now - t0) / 1000000), bound == CS_LIMIT_MAX_NS ? "its limit" : "neighbours");
    }
}

/* Before a launch on `stream`: find the current context's GPU (bind it on its first launch), wait for that
 * GPU's verdict, then (on its measured context) take its mutex, make room in its in-flight queue and record the
 * start event. The GPU's index + 1 when its mutex is held for compute_done_slow, else 0. */
int compute_gate_slow(CUstream stream) {
    CUcontext cur = NULL;
    __auto_type get_ctx = REAL(cuCtxGetCurrent);
    if (!get_ctx || get_ctx(&cur) != CUDA_SUCCESS || !cur) return 0; /* no context: the launch fails on its own */
    struct cs_dev *d = dev_of(cur);
    if (!d && !(d = dev_bind(cur))) return 0;
    int v = __atomic_load_n(&d->verdict, __ATOMIC_ACQUIRE);
    if (UNLIKELY(v != CS_GO)) wait_verdict(d, v);
    pthread_mutex_lock(&d->mu);
    if (!d->measuring || d->ctx != cur) {
        d->launches++;
        __atomic_store_n(&d->last_launch_ns, mono_ns(), __ATOMIC_RELAXED);
        pthread_mutex_unlock(&d->mu);
        return 0;
    }
    for (int tries = 0; d->count == CS_DEPTH; tries++) {
        /* Full: wait for the oldest launch without the mutex, so the board thread keeps publishing. */
        __auto_type sync = REAL(cuEventSynchronize);
        CUevent oldest = d->ev_end[d->head];
        pthread_mutex_unlock(&d->mu);
        CUresult r = sync ? sync(oldest) : CUDA_ERROR_NOT_SUPPORTED;
        pthread_mutex_lock(&d->mu);
        reap_locked(d, mono_ns());
        if (d->count == CS_DEPTH && (r != CUDA_SUCCESS || tries > 8)) { /* unusable event: forget the oldest */
            d->head = (d->head + 1) % CS_RING;
            d->count--;
        }
    }
    int tail = (d->head + d->count) % CS_RING, prev = (tail + CS_RING - 1) % CS_RING;
    d->busy_at[tail] = __atomic_load_n(&d->n_busy, __ATOMIC_RELAXED);
    d->stream[tail] = stream;
    /* Behind a launch still in flight on the same stream, this one starts when that one ends: its end event is
     * this one's start (one event per launch on a busy stream); otherwise a start event of its own. */
    d->own_start[tail] = !(d->count && d->stream[prev] == stream);
    if (d->own_start[tail]) REAL(cuEventRecord)(d->ev_start[tail], stream);
    return d->held;
}

/* After the launch: record its end event on that GPU's queue (a failed launch queues nothing); drop its mutex. */
void compute_done_slow(int held, CUstream stream, CUresult rc) {
    if ((unsigned)held - 1 >= CS_DEVS) return;
    struct cs_dev *d = &g_cs.dev[held - 1];
    int tail = (d->head + d->count) % CS_RING;
    if (rc == CUDA_SUCCESS && REAL(cuEventRecord)(d->ev_end[tail], stream) == CUDA_SUCCESS) d->count++;
    d->launches++;
    __atomic_store_n(&d->last_launch_ns, mono_ns(), __ATOMIC_RELAXED);
    pthread_mutex_unlock(&d->mu);
}

/* A forked child has no CUDA state, no board thread and no claim on its parent's records. */
void compute_after_fork(void) {
    if (!g_compute) return;
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    g_cs.mu = fresh;
    for (int i = 0; i < g_cs.n_dev; i++)
        if (g_cs.dev[i].boarded) cb_close(&g_cs.dev[i].board);
    for (int i = 0; i < CS_DEVS; i++) {
        dev_reset(&g_cs.dev[i]);
        g_cs.dev[i].held = i + 1;
    }
    g_cs.started = g_cs.n_dev = 0;
}

/* The compute share (docs/architecture.md "Compute share"): GPU time measured per process from the
 * shim's own events around each launch, a per-GPU board where each container publishes its recent share and
 * demand (compute_board.c), and a gate before each launch (compute_decide.c decides; this file waits).
 *
 * Launch path (compute_gate_slow / compute_done_slow, only when a share is set): a bounded wait while the
 * verdict says so, then under one mutex an event after the launch on its stream (and one before it when that
 * stream has none of our launches in flight: else the previous end is its start); at most CS_DEPTH
 * launches are in flight per process, so the GPU's queue stays short and the measured spans are this
 * process's. No system call on the common path (the clock is the vDSO's). Everything else runs on one board
 * thread, every CS_TICK_NS: it reaps completed launches (their GPU span, divided among the containers that had
 * work on the GPU then: the driver time-slices between them), publishes this process's record, reads the
 * neighbours' and sets the verdict. A board that cannot be used leaves the limit enforced from this process's
 * own measurement and says so once; every wait is bounded. */
#define _GNU_SOURCE
#include <pthread.h>
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

int g_compute;

/* The compute share's state: one per process. The mutex covers the in-flight queue and the counters the
 * launch path and the board thread both touch. */
static struct compute {
    pthread_mutex_t mu;
    int request, limit;                     /* percent; limit 100 when none */
    int started, measuring, boarded;        /* thread running; events usable; board open */
    CUcontext ctx;                          /* the context the events belong to (the first launch's) */
    CUevent ev_start[CS_RING], ev_end[CS_RING];
    CUstream stream[CS_RING];
    int own_start[CS_RING];                 /* 1: ev_start was recorded; 0: it starts at the previous end */
    int busy_at[CS_RING];                   /* n_busy when each in-flight launch was made */
    int head, count;                        /* the in-flight queue: count <= CS_DEPTH slots from head */
    uint64_t bucket[CS_BUCKETS], epoch[CS_BUCKETS], first_ns;
    uint64_t avg_ns;                        /* charged GPU time per launch, moving average (in-flight estimate) */
    uint64_t used_ns, throttled_ns, waited_ns, launches, last_launch_ns;
    int n_busy;                             /* containers with work on the GPU, this one included */
    int verdict;                            /* enum cs_verdict, set by the board thread */
    int waiting;                            /* launches waiting now (their demand counts) */
    struct cs_board board;
    char uuid[96];
} g_cs = {.mu = PTHREAD_MUTEX_INITIALIZER, .n_busy = 1, .board = {.fd = -1, .slot = -1}};

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

/* Start-up (lifecycle.c): a share is on when the configuration names a request, a limit or a board. */
void compute_start(void) {
    const struct shim_config *c = &g_cfg;
    if (c->compute_request < 0 && !c->compute_limit && !c->compute_dir[0]) return;
    g_cs.request = c->compute_request > 0 ? c->compute_request : 0;
    g_cs.limit = c->compute_limit ? c->compute_limit : 100;
    __atomic_store_n(&g_compute, 1, __ATOMIC_RELEASE);
}

/* Charge GPU time to the bucket of `now` (the window slides by dropping buckets of older epochs). */
static void charge_locked(uint64_t ns, uint64_t now) {
    uint64_t ep = now / CS_BUCKET_NS;
    int i = (int)(ep % CS_BUCKETS);
    if (g_cs.epoch[i] != ep) {
        g_cs.epoch[i] = ep;
        g_cs.bucket[i] = 0;
    }
    g_cs.bucket[i] += ns;
    g_cs.used_ns += ns;
}

/* Pop the launches that completed, oldest first, charging each its span divided by the containers that had
 * work on the GPU (the driver time-slices between contexts): their number when it was launched and now,
 * averaged. */
static void reap_locked(uint64_t now) {
    __auto_type query = REAL(cuEventQuery);
    __auto_type elapsed = REAL(cuEventElapsedTime);
    while (g_cs.count && query && elapsed) {
        int i = g_cs.head;
        CUevent start = g_cs.own_start[i] ? g_cs.ev_start[i] : g_cs.ev_end[(i + CS_RING - 1) % CS_RING];
        CUresult r = query(g_cs.ev_end[i]);
        if (r == CUDA_ERROR_NOT_READY) break;
        float ms = 0;
        if (r == CUDA_SUCCESS && elapsed(&ms, start, g_cs.ev_end[i]) == CUDA_SUCCESS && ms > 0) {
            int n = __atomic_load_n(&g_cs.n_busy, __ATOMIC_RELAXED) + g_cs.busy_at[i];
            uint64_t ns = (uint64_t)((double)ms * 2e6 / (n > 1 ? n : 2));
            charge_locked(ns, now);
            g_cs.avg_ns = g_cs.avg_ns ? (g_cs.avg_ns * 7 + ns) / 8 : ns;
        }
        g_cs.head = (g_cs.head + 1) % CS_RING;
        g_cs.count--;
    }
}

/* This process's share of the GPU over the window, per mille; with `pending`, the launches still in flight
 * count at their average cost (what they will add: the gate then closes before a burst overshoots). */
static int own_share_pm(uint64_t now, int pending) {
    uint64_t cur = now / CS_BUCKET_NS, sum = 0;
    pthread_mutex_lock(&g_cs.mu);
    for (int i = 0; i < CS_BUCKETS; i++)
        if (g_cs.epoch[i] + CS_BUCKETS > cur && g_cs.epoch[i] <= cur) sum += g_cs.bucket[i];
    if (pending) sum += (uint64_t)g_cs.count * g_cs.avg_ns;
    uint64_t first = g_cs.first_ns;
    pthread_mutex_unlock(&g_cs.mu);
    uint64_t window = (CS_BUCKETS - 1) * CS_BUCKET_NS + now % CS_BUCKET_NS;
    if (now - first < window) window = now - first;
    if (window < CS_TICK_NS) window = CS_TICK_NS;
    uint64_t pm = sum * 1000 / window;
    return pm > 1000 ? 1000 : (int)pm;
}

/* This process's record, as neighbours read it. */
static void publish(uint64_t now, int share_pm, uint32_t extra) {
    struct cs_record r = {.magic = CS_RECORD_MAGIC, .version = CS_RECORD_VERSION, .pid = getpid(),
                          .request = (uint8_t)g_cs.request, .limit = (uint8_t)g_cs.limit,
                          .priority = g_cfg.priority, .share_pm = (uint32_t)share_pm, .stamp_ns = now};
    pthread_mutex_lock(&g_cs.mu);
    int busy = g_cs.count > 0;
    r.flags = (uint16_t)(extra | (busy ? CS_F_INFLIGHT : 0) |
                         (busy || __atomic_load_n(&g_cs.waiting, __ATOMIC_RELAXED) ||
                          g_cs.last_launch_ns + CS_DEMAND_NS > now ? CS_F_DEMAND : 0));
    r.used_ns = g_cs.used_ns;
    r.throttled_ns = g_cs.throttled_ns;
    r.waited_ns = g_cs.waited_ns;
    r.launches = g_cs.launches;
    pthread_mutex_unlock(&g_cs.mu);
    cb_publish(&g_cs.board, &r);
}

/* One round of the board thread: reap, measure, read the neighbours, decide, publish. */
static void board_round(uint64_t now, uint64_t *next_rescan, uint64_t *next_reopen) {
    pthread_mutex_lock(&g_cs.mu);
    reap_locked(now);
    pthread_mutex_unlock(&g_cs.mu);
    struct cs_peer me = {.request = g_cs.request, .limit = g_cs.limit, .priority = g_cfg.priority,
                        .share_pm = own_share_pm(now, 1)};
    int mine = own_share_pm(now, 0);
    static struct cs_peer peers[CS_SLOTS]; /* the board thread's only */
    int n = 0;
    if (g_cs.boarded) {
        if (now >= *next_rescan) {
            int reopen = now >= *next_reopen;
            cb_read_roster(&g_cs.board);
            cb_rescan(&g_cs.board, reopen);
            *next_rescan = now + CS_RESCAN_NS;
            if (reopen) *next_reopen = now + CS_REOPEN_NS;
        }
        int siblings = 0;
        n = cb_read_peers(&g_cs.board, now, peers, &siblings);  /* (theirs: completed work only) */
        me.share_pm += siblings;
        int busy = 1;
        for (int i = 0; i < n; i++) busy += peers[i].inflight;
        __atomic_store_n(&g_cs.n_busy, busy, __ATOMIC_RELAXED);
    }
    __atomic_store_n(&g_cs.verdict, (int)cs_decide(&me, peers, n), __ATOMIC_RELEASE);
    publish(now, mine, g_cs.boarded ? 0 : CS_F_UNARBITRATED);
}

/* The board thread: a round every tick (slower once the process has not launched for a second). */
static void *board_thread(void *arg) {
    (void)arg;
    uint64_t next_rescan = 0, next_reopen = 0;
    for (;;) {
        uint64_t now = mono_ns();
        board_round(now, &next_rescan, &next_reopen);
        /* (a launch may have stamped last_launch_ns after `now` was read: compare without subtracting) */
        int idle = __atomic_load_n(&g_cs.last_launch_ns, __ATOMIC_RELAXED) + 1000000000ull < now && !g_cs.count;
        sleep_ns(idle ? CS_IDLE_TICK_NS : CS_TICK_NS);
    }
    return NULL;
}

/* The first launch: bind to its context and GPU, create the events, open the board, start the thread. */
static void start_locked(void) {
    g_cs.started = 1;
    g_cs.first_ns = mono_ns();
    CUdevice dev;
    __auto_type get_ctx = REAL(cuCtxGetCurrent);
    __auto_type get_dev = REAL(cuCtxGetDevice);
    __auto_type create = REAL(cuEventCreate);
    if (get_ctx && get_ctx(&g_cs.ctx) == CUDA_SUCCESS && g_cs.ctx && create && get_dev && get_dev(&dev) == CUDA_SUCCESS) {
        int ok = 1;
        for (int i = 0; i < CS_RING && ok; i++)
            ok = create(&g_cs.ev_start[i], 0 /* CU_EVENT_DEFAULT: timed */) == CUDA_SUCCESS &&
                 create(&g_cs.ev_end[i], 0 /* CU_EVENT_DEFAULT: timed */) == CUDA_SUCCESS;
        g_cs.measuring = ok;
        if (uuid_text(dev, g_cs.uuid, sizeof g_cs.uuid) < 0) g_cs.uuid[0] = 0;
    }
    char err[400] = "no compute directory configured (compute_dir / MEMSLICE_COMPUTE_DIR)";
    if (!g_cs.measuring) snprintf(err, sizeof err, "the launch's context has no usable events");
    else if (g_cfg.compute_dir[0] && g_cs.uuid[0] &&
             cb_open(&g_cs.board, g_cfg.compute_dir, g_cs.uuid, g_cfg.compute_slot, err, sizeof err) == 0)
        g_cs.boarded = 1;
    if (!g_cs.boarded)
        shim_log(g_cfg.compute_dir[0] ? LOG_WARN : LOG_INFO, "memslice: compute share unarbitrated (%s): this process "
                 "keeps its own limit of %d%%, neighbours' shares are not seen; point compute_dir "
                 "(MEMSLICE_COMPUTE_DIR) at the node's compute directory to share the GPU by requests", err, g_cs.limit);
    else
        shim_log(LOG_INFO, "memslice: compute share %d%%:%d%% on %s, slot %d%s", g_cs.request, g_cs.limit, g_cs.uuid,
                 g_cs.board.slot, g_cs.board.have_roster ? " (rostered)" : "");
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &a, board_thread, NULL) != 0) shim_log(LOG_WARN, "memslice: compute: no board thread");
    pthread_attr_destroy(&a);
}

/* Wait while the verdict says so, at most CS_HOLD_MAX_NS for neighbours and CS_LIMIT_MAX_NS at the limit. */
static void wait_verdict(void) {
    int v = __atomic_load_n(&g_cs.verdict, __ATOMIC_ACQUIRE);
    if (v == CS_GO) return;
    uint64_t t0 = mono_ns(), now = t0, bound = v == CS_WAIT_LIMIT ? CS_LIMIT_MAX_NS : CS_HOLD_MAX_NS;
    __atomic_add_fetch(&g_cs.waiting, 1, __ATOMIC_RELAXED);
    while (v != CS_GO && now - t0 < bound) {
        sleep_ns(CS_POLL_NS);
        v = __atomic_load_n(&g_cs.verdict, __ATOMIC_ACQUIRE);
        now = mono_ns();
        if (v == CS_WAIT_LIMIT) bound = CS_LIMIT_MAX_NS; /* the bound of what it waits for now */
        else if (v != CS_GO) bound = CS_HOLD_MAX_NS;
    }
    __atomic_sub_fetch(&g_cs.waiting, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&g_cs.mu);
    if (bound == CS_LIMIT_MAX_NS) g_cs.throttled_ns += now - t0;
    else g_cs.waited_ns += now - t0;
    pthread_mutex_unlock(&g_cs.mu);
    static uint64_t last_log;
    if (v != CS_GO && now - last_log > 10000000000ull) {
        last_log = now;
        shim_log(LOG_WARN, "memslice: compute: a launch waited %llu ms (the bound) for %s; it goes now",
                 (unsigned long long)((now - t0) / 1000000), bound == CS_LIMIT_MAX_NS ? "its limit" : "neighbours");
    }
}

/* Before a launch on `stream`: wait for the verdict, then (on the measured context) take the mutex, make room
 * in the in-flight queue and record the start event. 1 when the mutex is held for compute_done_slow. */
int compute_gate_slow(CUstream stream) {
    if (g_cs.started) wait_verdict();
    pthread_mutex_lock(&g_cs.mu);
    if (!g_cs.started) start_locked();
    CUcontext cur = NULL;
    __auto_type get_ctx = REAL(cuCtxGetCurrent);
    if (!g_cs.measuring || !get_ctx || get_ctx(&cur) != CUDA_SUCCESS || cur != g_cs.ctx) {
        g_cs.launches++;
        __atomic_store_n(&g_cs.last_launch_ns, mono_ns(), __ATOMIC_RELAXED);
        pthread_mutex_unlock(&g_cs.mu);
        return 0;
    }
    for (int tries = 0; g_cs.count == CS_DEPTH; tries++) {
        /* Full: wait for the oldest launch without the mutex, so the board thread keeps publishing. */
        __auto_type sync = REAL(cuEventSynchronize);
        CUevent oldest = g_cs.ev_end[g_cs.head];
        pthread_mutex_unlock(&g_cs.mu);
        CUresult r = sync ? sync(oldest) : CUDA_ERROR_NOT_SUPPORTED;
        pthread_mutex_lock(&g_cs.mu);
        reap_locked(mono_ns());
        if (g_cs.count == CS_DEPTH && (r != CUDA_SUCCESS || tries > 8)) { /* unusable event: forget the oldest */
            g_cs.head = (g_cs.head + 1) % CS_RING;
            g_cs.count--;
        }
    }
    int tail = (g_cs.head + g_cs.count) % CS_RING, prev = (tail + CS_RING - 1) % CS_RING;
    g_cs.busy_at[tail] = __atomic_load_n(&g_cs.n_busy, __ATOMIC_RELAXED);
    g_cs.stream[tail] = stream;
    /* Behind a launch still in flight on the same stream, this one starts when that one ends: its end event is
     * this one's start (one event per launch on a busy stream); otherwise a start event of its own. */
    g_cs.own_start[tail] = !(g_cs.count && g_cs.stream[prev] == stream);
    if (g_cs.own_start[tail]) REAL(cuEventRecord)(g_cs.ev_start[tail], stream);
    return 1;
}

/* After the launch: record its end event and queue it (a failed launch queues nothing); drop the mutex. */
void compute_done_slow(int held, CUstream stream, CUresult rc) {
    if (!held) return;
    int tail = (g_cs.head + g_cs.count) % CS_RING;
    if (rc == CUDA_SUCCESS && REAL(cuEventRecord)(g_cs.ev_end[tail], stream) == CUDA_SUCCESS) g_cs.count++;
    g_cs.launches++;
    __atomic_store_n(&g_cs.last_launch_ns, mono_ns(), __ATOMIC_RELAXED);
    pthread_mutex_unlock(&g_cs.mu);
}

/* A forked child has no CUDA state, no board thread and no claim on its parent's record. */
void compute_after_fork(void) {
    if (!g_compute) return;
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    g_cs.mu = fresh;
    if (g_cs.boarded) cb_close(&g_cs.board);
    g_cs.started = g_cs.measuring = g_cs.boarded = 0;
    g_cs.head = g_cs.count = g_cs.waiting = 0;
    g_cs.verdict = CS_GO;
    g_cs.n_busy = 1;
    g_cs.used_ns = g_cs.throttled_ns = g_cs.waited_ns = g_cs.launches = 0;
    memset(g_cs.epoch, 0, sizeof g_cs.epoch);
}

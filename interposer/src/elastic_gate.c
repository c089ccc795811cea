/* Elastic memory's work gate (the hot path: every launch, copy and set enters it) and the drainer, which waits
 * for the GPU work already queued on behalf of whoever must wait for it with a bound. See elastic.c. */
#define _GNU_SOURCE
#include <pthread.h>
#include <unistd.h>

#include "elastic.h"

#define ELASTIC_DRAIN_MS 2000 /* how long a remap waits for this process's calls and GPU work in flight */

/* ---- the work gate -------------------------------------------------------------------------------------
 * Every launch, copy and set enters the gate: it counts as activity, and it waits while a remap has the
 * gate closed, so no work is ever submitted against an address that is between two physical allocations. */
/* The gate's state (and the drainer's), the gate's own: the hot path reads nothing else. */
static struct {
    uint64_t last_call_ns;                    /* CLOCK_MONOTONIC (coarse) of the last gated call */
    int inflight;                             /* gated calls in progress */
    int closed;                               /* 1 while a remap runs */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* The drainer (docs/architecture.md, "Waits and their bounds"): one thread that runs cuCtxSynchronize,
     * which has no bound of its own, for whoever must wait for the GPU work already queued; they wait for its
     * answer with a deadline. A drain asked is never asked again before it has finished. */
    pthread_mutex_t drain_mu;
    pthread_cond_t drain_cv;                  /* CLOCK_MONOTONIC; both directions */
    uint64_t drain_asked, drain_done;         /* generations, under drain_mu */
    uint64_t drain_asked_ns;                  /* coarse clock of the last ask (atomic) */
    int drain_ok;                             /* the last finished drain succeeded */
    int drainer_started;                      /* one drainer per process, ever */
    CUcontext ctx;                            /* the drainer's context */
} g_gate = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .drain_mu = PTHREAD_MUTEX_INITIALIZER};

/* When the last gated call was made (the idle test's clock; the mover and the board read it). */
uint64_t elastic_last_call_ns(void) {
    return __atomic_load_n(&g_gate.last_call_ns, __ATOMIC_RELAXED);
}

/* Count as a call now: elastic mode starting is not idleness. */
void elastic_mark_active(void) {
    __atomic_store_n(&g_gate.last_call_ns, now_ns(), __ATOMIC_RELAXED);
}

/* A forked child has no call in flight, no remap and no drainer (threads are not inherited). */
void elastic_gate_after_fork(void) {
    g_gate.inflight = 0;
    g_gate.closed = 0;
    g_gate.drain_asked = g_gate.drain_done = g_gate.drain_asked_ns = 0;
    g_gate.drain_ok = 0;
    g_gate.drainer_started = 0;
    pthread_mutex_init(&g_gate.mu, NULL);
    pthread_mutex_init(&g_gate.drain_mu, NULL);
}

/* Entering the gate: stamp activity, count the call in flight, wait while a remap has the gate closed. */
void elastic_gate_slow(void) {
    __atomic_store_n(&g_gate.last_call_ns, coarse_ns(), __ATOMIC_RELAXED);
    for (;;) {
        __atomic_add_fetch(&g_gate.inflight, 1, __ATOMIC_SEQ_CST);
        if (!__atomic_load_n(&g_gate.closed, __ATOMIC_SEQ_CST)) return;
        __atomic_sub_fetch(&g_gate.inflight, 1, __ATOMIC_SEQ_CST);
        pthread_mutex_lock(&g_gate.mu);
        while (__atomic_load_n(&g_gate.closed, __ATOMIC_SEQ_CST)) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 50000000L;
            if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
            pthread_cond_timedwait(&g_gate.cv, &g_gate.mu, &ts);
        }
        pthread_mutex_unlock(&g_gate.mu);
    }
}

/* Leaving the gate: the call has been submitted (or done). */
void elastic_gate_exit(void) {
    __atomic_sub_fetch(&g_gate.inflight, 1, __ATOMIC_SEQ_CST);
    __atomic_store_n(&g_gate.last_call_ns, coarse_ns(), __ATOMIC_RELAXED);
}

/* Open the gate and wake the threads waiting at it. */
void elastic_gate_open(void) {
    pthread_mutex_lock(&g_gate.mu);
    __atomic_store_n(&g_gate.closed, 0, __ATOMIC_SEQ_CST);
    pthread_cond_broadcast(&g_gate.cv);
    pthread_mutex_unlock(&g_gate.mu);
}

/* ---- the drain -------------------------------------------------------------------------------------- */
/* The drainer thread: waits for a drain to be asked, runs cuCtxSynchronize in the elastic context (as long as
 * the driver takes: a wait released by a later call of the tenant's, a kernel that runs for minutes), says
 * it has finished. Blocked in the driver it is harmless: nobody waits for it past their deadline, and no
 * second drain is asked meanwhile. */
static void *drainer(void *arg) {
    (void)arg;
    REAL(cuCtxSetCurrent)(g_gate.ctx);
    pthread_mutex_lock(&g_gate.drain_mu);
    for (;;) {
        while (g_gate.drain_done == g_gate.drain_asked) /* idle until asked: a worker's wait, nobody waits on it */
            pthread_cond_wait(&g_gate.drain_cv, &g_gate.drain_mu);
        uint64_t gen = g_gate.drain_asked;
        pthread_mutex_unlock(&g_gate.drain_mu);
        CUresult rc = REAL(cuCtxSynchronize)();
        pthread_mutex_lock(&g_gate.drain_mu);
        g_gate.drain_done = gen;
        g_gate.drain_ok = rc == CUDA_SUCCESS;
        pthread_cond_broadcast(&g_gate.drain_cv);
    }
    return NULL;
}

/* Start the drainer (with the mover, in elastic_setup): its condition variable on the monotonic clock, so
 * deadlines do not move with the wall clock. 0, or -1. */
int elastic_drainer_start(CUcontext ctx) {
    if (g_gate.drainer_started) return 0;
    g_gate.ctx = ctx;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g_gate.drain_cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &at, drainer, NULL);
    pthread_attr_destroy(&at);
    g_gate.drainer_started = rc == 0;
    return rc == 0 ? 0 : -1;
}

/* Ask for a drain unless one is still running. Caller holds g_gate.drain_mu. The generation asked, or 0 (busy). */
static uint64_t drain_ask_locked(void) {
    if (g_gate.drain_done != g_gate.drain_asked) return 0;
    __atomic_store_n(&g_gate.drain_asked_ns, coarse_ns(), __ATOMIC_RELAXED);
    pthread_cond_broadcast(&g_gate.drain_cv);
    return ++g_gate.drain_asked;
}

/* Wait until the GPU work queued so far has finished, at most until `deadline` (now_ns). 0 when it has (and
 * the synchronize succeeded), -1 when a drain is still running (this one, or an earlier one nobody waits for
 * any more): then no range may move, and the process counts as busy for the next idle_after (it is not idle:
 * its work is in flight). */
static int drain_until(uint64_t deadline) {
    struct timespec ts = {(time_t)(deadline / 1000000000ull), (long)(deadline % 1000000000ull)};
    pthread_mutex_lock(&g_gate.drain_mu);
    uint64_t gen = drain_ask_locked();
    while (gen && g_gate.drain_done < gen && now_ns() < deadline)
        pthread_cond_timedwait(&g_gate.drain_cv, &g_gate.drain_mu, &ts);
    int ok = gen && g_gate.drain_done >= gen && g_gate.drain_ok;
    pthread_mutex_unlock(&g_gate.drain_mu);
    if (!ok) __atomic_store_n(&g_gate.last_call_ns, coarse_ns(), __ATOMIC_RELAXED);
    if (gen && !ok) /* once per drain: the moves tried while it still runs give up at once, silently */
        shim_log(LOG_INFO, "memslice: elastic: work queued on the GPU did not finish within %d ms; no memory "
                 "moves until it has (this process counts as busy meanwhile)", ELASTIC_DRAIN_MS);
    return ok ? 0 : -1;
}

/* The idle test's half about work in flight, from the mover's tick: once no call has been made for half of
 * idle_after, ask (without waiting) for a drain unless one after the last call has succeeded, so that a
 * finished one says nothing is queued. */
void elastic_drain_probe(void) {
    uint64_t last = elastic_last_call_ns();
    if (now_ns() - last < g_cfg.idle_after_ms * 1000000ull / 2) return;
    pthread_mutex_lock(&g_gate.drain_mu);
    if (__atomic_load_n(&g_gate.drain_asked_ns, __ATOMIC_RELAXED) <= last || !g_gate.drain_ok) drain_ask_locked();
    pthread_mutex_unlock(&g_gate.drain_mu);
}

/* No work in flight: a drain asked after the last call has finished, and succeeded. */
static int drained_since_last_call(void) {
    uint64_t last = elastic_last_call_ns();
    pthread_mutex_lock(&g_gate.drain_mu);
    int ok = g_gate.drain_done == g_gate.drain_asked && g_gate.drain_ok &&
             __atomic_load_n(&g_gate.drain_asked_ns, __ATOMIC_RELAXED) > last;
    pthread_mutex_unlock(&g_gate.drain_mu);
    return ok;
}

/* Close the gate, wait for gated calls in progress and then for the work already queued on the GPU, both
 * within one ELASTIC_DRAIN_MS from closing: a tenant thread arriving at the gate waits at most that plus the
 * move. 0, or -1 with the gate open again (a call did not return, or the work did not drain, in time: this
 * move is given up; none is tried while that drain still runs). */
int elastic_gate_close(void) {
    pthread_mutex_lock(&g_gate.drain_mu);
    int busy = g_gate.drain_done != g_gate.drain_asked;
    pthread_mutex_unlock(&g_gate.drain_mu);
    if (busy) return -1; /* an earlier drain is still blocked in the driver: work is in flight */
    __atomic_store_n(&g_gate.closed, 1, __ATOMIC_SEQ_CST);
    uint64_t deadline = now_ns() + ELASTIC_DRAIN_MS * 1000000ull;
    while (__atomic_load_n(&g_gate.inflight, __ATOMIC_SEQ_CST) > 0) {
        if (now_ns() > deadline) {
            elastic_gate_open();
            return -1;
        }
        sleep_ms(1);
    }
    if (drain_until(deadline) < 0) {
        elastic_gate_open();
        return -1;
    }
    return 0;
}

/* Idle (no CUDA call and no work in flight): no gated call for idle_after, none in progress,
 * and the GPU work queued before the last call has drained. */
int elastic_is_idle(void) {
    uint64_t last = elastic_last_call_ns();
    return __atomic_load_n(&g_gate.inflight, __ATOMIC_SEQ_CST) == 0 &&
           now_ns() - last >= g_cfg.idle_after_ms * 1000000ull && drained_since_last_call();
}

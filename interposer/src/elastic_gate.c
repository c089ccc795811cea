/* Elastic memory's work gate (the hot path: every launch, copy and set enters it) and the drainer, which waits
 * for the GPU work already queued on behalf of whoever must wait for it with a bound. See elastic.c. */
#define _GNU_SOURCE
#include <pthread.h>
#include <unistd.h>

#include "elastic.h"

/* ---- the work gate -------------------------------------------------------------------------------------
 * Every launch, copy and set enters the gate: it counts as activity, and it waits while a remap has the
 * gate closed, so no work is ever submitted against an address that is between two physical allocations. */
uint64_t g_last_call_ns;
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

/* A forked child has no call in flight, no remap and no drainer (threads are not inherited). */
void el_gate_after_fork(void) {
    g_inflight = 0;
    g_closed = 0;
    g_drain_asked = g_drain_done = g_drain_asked_ns = 0;
    g_drain_ok = 0;
    g_drainer_started = 0;
    pthread_mutex_init(&g_gate_mu, NULL);
    pthread_mutex_init(&g_drain_mu, NULL);
}

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
void el_gate_open(void) {
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
int el_drainer_start(void) {
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
void el_drain_probe(void) {
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
int el_gate_close(void) {
    pthread_mutex_lock(&g_drain_mu);
    int busy = g_drain_done != g_drain_asked;
    pthread_mutex_unlock(&g_drain_mu);
    if (busy) return -1; /* an earlier drain is still blocked in the driver: work is in flight */
    __atomic_store_n(&g_closed, 1, __ATOMIC_SEQ_CST);
    uint64_t deadline = now_ns() + GATE_DRAIN_MS * 1000000ull;
    while (__atomic_load_n(&g_inflight, __ATOMIC_SEQ_CST) > 0) {
        if (now_ns() > deadline) {
            el_gate_open();
            return -1;
        }
        sleep_ms(1);
    }
    if (drain_until(deadline) < 0) {
        el_gate_open();
        return -1;
    }
    return 0;
}

/* Idle (the issue: no CUDA call and no work in flight): no gated call for idle_after, none in progress,
 * and the GPU work queued before the last call has drained. */
int el_is_idle(void) {
    uint64_t last = __atomic_load_n(&g_last_call_ns, __ATOMIC_RELAXED);
    return __atomic_load_n(&g_inflight, __ATOMIC_SEQ_CST) == 0 &&
           now_ns() - last >= g_cfg.idle_after_ms * 1000000ull && drained_since_last_call();
}

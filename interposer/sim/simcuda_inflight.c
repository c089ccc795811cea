/* Simulated driver: asynchronous copies in flight. A copy here is a memmove done before its call returns, but
 * on a real GPU an async copy on a created stream is only queued: it is in flight until its stream is
 * synchronised (cuStreamSynchronize, a successful cuStreamQuery, an event recorded behind it completing, or
 * cuCtxSynchronize). This file keeps that book, so a test can see what a real GPU would do with a program's
 * copies: how many were asynchronous, how many were in flight at once (several streams' copies overlap on a
 * real GPU's copy engines), and whether memory was unmapped under a copy still in flight (on a real GPU,
 * a fault or lost bytes). Counted in memsliceSimCounters (simstate.h, SIM_C_ASYNC_*). Copies on the default
 * streams are not booked: the legacy stream's implicit ordering makes them safe in ways this book does not
 * model.
 *
 * Time, when asked for (a benchmark's model of a real link; off by default, the copies then complete at once):
 * MEMSLICE_SIM_LINK_GBPS (decimal GB/s, > 0) makes the booked copies share one link of that bandwidth, in the
 * order issued: each is due when the link has carried it, and its stream, an event recorded behind it and a
 * context synchronisation are not complete before then (they wait for it, or answer CUDA_ERROR_NOT_READY).
 * MEMSLICE_SIM_VMM_US (µs per cuMemMap, cuMemUnmap, cuMemSetAccess call), MEMSLICE_SIM_RELEASE_US (µs per
 * cuMemRelease of GPU memory, paid after the memory is free as other processes see it) and
 * MEMSLICE_SIM_PIN_US_PER_MIB (µs per
 * MiB a host-located cuMemCreate pins, or its release unpins) give those calls a cost (sim_cost). A value that
 * is not a number in (0, 10^6] leaves that part of the model off. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "sim_internal.h"
#include "simcuda.h"

#define INFLIGHT_MAX 256
struct inflight { unsigned long long stream, seq; uint64_t dst, src, n, due; };
static struct { pthread_mutex_t mu; struct inflight e[INFLIGHT_MAX]; unsigned n; unsigned long long high, seq;
                uint64_t link_free; /* when the link has carried every copy issued so far */ }
    g_fl = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* Monotonic nanoseconds: the model's clock. */
static uint64_t fl_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* A positive number from the environment, at most 10^6, else 0 (that part of the model off). */
static double env_num(const char *name) {
    const char *v = getenv(name);
    char *end;
    if (!v || !*v) return 0;
    errno = 0;
    double x = strtod(v, &end);
    return errno || *end || !(x > 0 && x <= 1e6) ? 0 : x;
}

/* The model's figures, read once: link bytes per ns, µs per VMM call, µs per pinned MiB. */
static struct { pthread_once_t once; double link_bpns, vmm_us, pin_us_mib, release_us; } g_model = {PTHREAD_ONCE_INIT, 0, 0, 0, 0};
static void read_model(void) {
    g_model.link_bpns = env_num("MEMSLICE_SIM_LINK_GBPS"); /* GB/s = bytes per ns */
    g_model.vmm_us = env_num("MEMSLICE_SIM_VMM_US");
    g_model.pin_us_mib = env_num("MEMSLICE_SIM_PIN_US_PER_MIB");
    g_model.release_us = env_num("MEMSLICE_SIM_RELEASE_US");
}

/* Sleep until the monotonic time `due` (the model's figures bound it: the link's queue, one call's cost). */
static void sleep_until(uint64_t due) {
    for (uint64_t now = fl_now(); now < due; now = fl_now()) {
        struct timespec ts = {(time_t)((due - now) / 1000000000ull), (long)((due - now) % 1000000000ull)};
        nanosleep(&ts, NULL);
    }
}

/* The time a call of this kind costs in the model (SIM_COST_VMM: a map, unmap or access call; SIM_COST_PIN:
 * pinning or unpinning `bytes` of host memory; SIM_COST_RELEASE: releasing GPU memory); nothing when that part
 * of the model is off. */
void sim_cost(int kind, uint64_t bytes) {
    pthread_once(&g_model.once, read_model);
    double us = kind == SIM_COST_VMM       ? g_model.vmm_us
                : kind == SIM_COST_RELEASE ? g_model.release_us
                                           : g_model.pin_us_mib * (double)(bytes >> 20);
    if (us > 0) sleep_until(fl_now() + (uint64_t)(us * 1000.0));
}

/* When the copies of the stream with this id (0: every stream) booked up to `mark` are due (0: none, or no
 * link model). */
uint64_t sim_inflight_due(unsigned long long id, unsigned long long mark) {
    uint64_t due = 0;
    pthread_mutex_lock(&g_fl.mu);
    for (unsigned i = 0; i < g_fl.n; i++)
        if ((!id || g_fl.e[i].stream == id) && g_fl.e[i].seq <= mark && g_fl.e[i].due > due) due = g_fl.e[i].due;
    pthread_mutex_unlock(&g_fl.mu);
    return due;
}

/* Whether `due` (from sim_inflight_due) has passed; with wait, sleep until it has. */
int sim_inflight_reached(uint64_t due, int wait) {
    if (!due || fl_now() >= due) return 1;
    if (!wait) return 0;
    sleep_until(due);
    return 1;
}

/* When stream s's booked copies (s NULL: every stream's) are due. */
uint64_t sim_inflight_due_stream(CUstream s) {
    struct sim_stream *x = sim_stream_of(s);
    if (s && !x) return 0;
    return sim_inflight_due(x ? x->id : 0, ~0ull);
}

/* The high-water counter: in flight at once, ever (a max, not a sum). Caller holds g_fl.mu. */
static void note_high(void) {
    if (g_fl.n <= g_fl.high) return;
    g_fl.high = g_fl.n;
    sim_count_set(SIM_C_ASYNC_IN_FLIGHT_MAX, g_fl.high);
}

/* Book an asynchronous copy issued on stream s (a created stream; the default ones are not booked). */
void sim_inflight_add(CUstream s, uint64_t dst, uint64_t src, uint64_t n) {
    struct sim_stream *x = sim_stream_of(s);
    sim_count(SIM_C_ASYNC_COPIES, n);
    if (!x || !n) return;
    pthread_once(&g_model.once, read_model);
    pthread_mutex_lock(&g_fl.mu);
    uint64_t due = 0, now = fl_now();
    if (g_model.link_bpns > 0) { /* the link carries the copies one after the other, in the order issued */
        due = (g_fl.link_free > now ? g_fl.link_free : now) + (uint64_t)((double)n / g_model.link_bpns);
        g_fl.link_free = due;
    }
    if (g_fl.n < INFLIGHT_MAX) g_fl.e[g_fl.n++] = (struct inflight){x->id, ++g_fl.seq, dst, src, n, due};
    note_high();
    pthread_mutex_unlock(&g_fl.mu);
}

/* The copies of stream s are complete (s NULL: every stream's, a context-wide synchronisation). */
void sim_inflight_done(CUstream s) {
    struct sim_stream *x = sim_stream_of(s);
    if (s && !x) return;
    pthread_mutex_lock(&g_fl.mu);
    for (unsigned i = 0; i < g_fl.n;)
        if (!x || g_fl.e[i].stream == x->id) g_fl.e[i] = g_fl.e[--g_fl.n];
        else i++;
    pthread_mutex_unlock(&g_fl.mu);
}

/* Where the book stands: an event recorded now completes the copies booked up to here. */
unsigned long long sim_inflight_mark(void) {
    return __atomic_load_n(&g_fl.seq, __ATOMIC_RELAXED);
}

/* The copies of the stream with this id booked up to `mark` are complete (an event recorded behind them
 * completed). */
void sim_inflight_done_id(unsigned long long id, unsigned long long mark) {
    pthread_mutex_lock(&g_fl.mu);
    for (unsigned i = 0; i < g_fl.n;)
        if (g_fl.e[i].stream == id && g_fl.e[i].seq <= mark) g_fl.e[i] = g_fl.e[--g_fl.n];
        else i++;
    pthread_mutex_unlock(&g_fl.mu);
}

/* [ptr, ptr + size) is being unmapped: count it if a copy in flight reads or writes it. */
void sim_inflight_unmap(uint64_t ptr, uint64_t size) {
    int hit = 0;
    pthread_mutex_lock(&g_fl.mu);
    for (unsigned i = 0; i < g_fl.n && !hit; i++) {
        const struct inflight *f = &g_fl.e[i];
        hit = (f->dst < ptr + size && ptr < f->dst + f->n) || (f->src < ptr + size && ptr < f->src + f->n);
    }
    pthread_mutex_unlock(&g_fl.mu);
    if (hit) sim_count(SIM_C_UNMAPS_IN_FLIGHT, size);
}

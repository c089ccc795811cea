/* Simulated driver: asynchronous copies in flight. A copy here is a memmove done before its call returns, but
 * on a real GPU an async copy on a created stream is only queued: it is in flight until its stream is
 * synchronised (cuStreamSynchronize, a successful cuStreamQuery, an event recorded behind it completing, or
 * cuCtxSynchronize). This file keeps that book, so a test can see what a real GPU would do with a program's
 * copies: how many were asynchronous, how many were in flight at once (several streams' copies overlap on a
 * real GPU's copy engines), and whether memory was unmapped under a copy still in flight (on a real GPU,
 * a fault or lost bytes). Counted in memsliceSimCounters (simstate.h, SIM_C_ASYNC_*). Copies on the default
 * streams are not booked: the legacy stream's implicit ordering makes them safe in ways this book does not
 * model. */
#define _GNU_SOURCE
#include "sim_internal.h"
#include "simcuda.h"

#define INFLIGHT_MAX 256
struct inflight { unsigned long long stream, seq; uint64_t dst, src, n; };
static struct { pthread_mutex_t mu; struct inflight e[INFLIGHT_MAX]; unsigned n; unsigned long long high, seq; }
    g_fl = {.mu = PTHREAD_MUTEX_INITIALIZER};

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
    pthread_mutex_lock(&g_fl.mu);
    if (g_fl.n < INFLIGHT_MAX) g_fl.e[g_fl.n++] = (struct inflight){x->id, ++g_fl.seq, dst, src, n};
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

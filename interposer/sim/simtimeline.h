/* The simulated GPUs' compute timeline (simtimeline.c): ONE timeline per GPU, shared by every process of the
 * simulated node, in which kernels occupy the GPU for their duration.
 *
 * Model (what the driver does with contexts that share a GPU without MPS): each context with queued work is
 * a *client* of its GPU's timeline; work of one client runs in submission order (all its streams in one
 * queue); clients with queued work take turns in timeslices (TL_SLICE_NS, round-robin); a client alone keeps
 * the GPU; work of two clients never overlaps. GPU time is CLOCK_MONOTONIC, so wall time matches: spin(100
 * ms) alone completes 100 ms after it started, next to an equal neighbour about 200 ms after.
 *
 * The state lives in the node lock file (MEMSLICE_SIM_LOCK, default <state>.lock), which every container of
 * a simulated node already shares read-write: one block per GPU, read and written with pread/pwrite under an
 * OFD lock on one byte per GPU, waited for at most 200 ms (never mapped: a tenant can truncate that file).
 * The timeline is advanced lazily: whoever takes the lock first replays the time since the last update (the
 * schedule between two updates depends only on the state at the first, since every arrival takes the lock
 * and advances before it adds work). Each client holds an OFD lock on its own byte while it lives, so a
 * process that dies mid-kernel is dropped (its queued work vanishes) the next time the scheduler would give
 * it the GPU. A block that does not validate (a tenant wrote garbage) is reset: the simulator's worst case
 * is a timeline that forgets queued work, never a crash or a hang. Every wait is bounded. */
#ifndef MEMSLICE_SIMTIMELINE_H
#define MEMSLICE_SIMTIMELINE_H

#include <stdint.h>

#define TL_CLIENTS 32                       /* clients (contexts) per GPU */
#define TL_MARKS 32                         /* events in flight per client whose completion time is exact */
#define TL_SLICE_NS (2000ull * 1000)        /* the timeslice (the driver's default is of this order) */
#define TL_PERIOD_NS (166666667ull)         /* NVML's utilisation sample period (1/6 s) */
#define TL_MAX_PENDING_NS (600ull * 1000000000ull) /* work queued per client, at most */

/* A process's handle on its client for one context: `gpu`, and the local slot (opaque). */
struct tl_ref { int gpu; int local; };

/* An event's place on the timeline: complete once its client has consumed `target`; `mark` is the slot of the
 * shared record of its exact completion time (< 0: none, its time is when it is first seen complete). */
struct tl_point { struct tl_ref ref; uint64_t target; int mark; int done; uint64_t ns; };

/* The client of context key `ctx` on GPU gpu (claimed on first use): 0, or -1 (no timeline: work is done at
 * once). */
int tl_client(const void *ctx, int gpu, struct tl_ref *out);
/* Queue ns of work on the client; *target is its completion point. 0; -1: no timeline (the work is done at
 * once); -2: the client already has TL_MAX_PENDING_NS queued. */
int tl_submit(struct tl_ref r, uint64_t ns, uint64_t *target);
/* The client's last completion point (everything it has queued). */
uint64_t tl_last(struct tl_ref r);
/* 1 if the client has consumed target (or no longer exists), else 0. */
int tl_reached(struct tl_ref r, uint64_t target);
/* Wait, at most max_ns, until the client has consumed target. 0, or -1 on timeout. */
int tl_wait(struct tl_ref r, uint64_t target, uint64_t max_ns);
/* An event recorded now behind everything the client has queued up to target. */
void tl_mark(struct tl_ref r, uint64_t target, struct tl_point *p);
/* If p is complete: 1 and *ns its GPU time of completion; else 0. */
int tl_point_time(struct tl_point *p, uint64_t *ns);
/* The event holding p is destroyed or recorded again: p is no longer the owner of its mark. */
void tl_forget(struct tl_point *p);
/* Whether this process ever queued work (a flag: the copy paths test it and nothing more until then). */
int tl_launched(void);
/* The context is gone: its client and queued work are released. */
void tl_release_ctx(const void *ctx);

/* NVML: the GPU's busy percentage over the last complete sample period. */
unsigned int tl_util(int gpu);
/* NVML: each process busy in the last complete period: fn(arg, pid, sm percent, period end in CLOCK_REALTIME
 * microseconds). */
typedef void (*tl_sample_fn)(void *arg, uint32_t pid, unsigned int sm, uint64_t ts_us);
void tl_samples(int gpu, tl_sample_fn fn, void *arg);

/* Figures for tests (exported by both simulated libraries, found with dlsym): out[0] the GPU's busy ns since
 * the timeline began, out[1] the busy ns of clients since released, out[2] the timeline's time, out[3] the
 * number of live clients, then per live client: pid, busy ns, queued ns. Returns how many values exist. */
unsigned int memsliceSimTimeline(unsigned int gpu, unsigned long long *out, unsigned int n);

#endif

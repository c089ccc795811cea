/* Elastic memory's internals shared by its parts (elastic*.c; see elastic.c): the ranges, the process's state on
 * its GPU's board, and the functions one part calls in another. Not an API: shim.h declares what the hooks use. */
#ifndef MEMSLICE_ELASTIC_H
#define MEMSLICE_ELASTIC_H

#include <errno.h>
#include <pthread.h>
#include <time.h>

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

struct echunk { CUmemGenericAllocationHandle h; int host; int moving; /* in the mover's batch */ };
struct erange { CUdeviceptr va; uint64_t size; unsigned n; struct erange *next; struct echunk c[]; };
/* A neighbour that could not take its share to host memory (issue 26), as an asker saw it. */
struct refusal { int slot; int32_t pid; struct eb_hostnote note; };

/* elastic.c: the process's elastic state (g_mu guards the ranges, their placement and remaps) */
extern pthread_mutex_t g_mu;
extern struct erange *g_ranges;                  /* newest first */
extern uint64_t g_resident, g_swapped;           /* bytes, under g_mu */
extern CUcontext g_ctx;                          /* the context of the first elastic allocation */
extern CUdevice g_ord;                           /* its device: elastic memory lives on one GPU */
extern int g_dev;                                /* its ledger index */
extern struct eb g_board;                        /* slot -1: no slot (asks, cannot be asked) */
extern struct eb_slot g_me;                      /* this process's slot, as last published */
extern uint64_t g_yield_ns;                      /* when this process last gave HBM away */
extern uint64_t g_acked;                         /* the last ask the acker acknowledged (atomic) */
extern uint64_t g_skip_until[EB_SLOTS];          /* neighbours that did not answer in time: not asked again before */
extern struct eb_hostnote g_note;                /* this process's host note (board version 4), under g_mu */

/* Time for idleness and bounded waits. */
static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The gate's activity stamp: the coarse clock (a vDSO read of a few ns, resolution of a few ms, plenty for
 * idleness measured in seconds). Same time base as now_ns. */
static inline uint64_t coarse_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Sleeps in the background thread and bounded waits. */
static inline void sleep_ms(unsigned ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {}
}

/* Chunk i of a range: its offset is i * EL_CHUNK, its length EL_CHUNK but for the last. */
static inline uint64_t chunk_len(const struct erange *r, unsigned i) {
    uint64_t off = (uint64_t)i * EL_CHUNK;
    return r->size - off < EL_CHUNK ? r->size - off : EL_CHUNK;
}

/* elastic_gate.c: the work gate and the drainer */
extern uint64_t g_last_call_ns;                  /* CLOCK_MONOTONIC of the last gated call */
void el_gate_open(void);
int el_gate_close(void);                         /* 0, or -1 with the gate open again */
int el_drainer_start(void);
void el_drain_probe(void);
int el_is_idle(void);
void el_gate_after_fork(void);
/* elastic_move.c: physical memory, and the background threads that move it */
CUresult el_create_phys(CUmemGenericAllocationHandle *h, uint64_t size, int host);
CUresult el_map_rw(uint64_t va, uint64_t size, CUmemGenericAllocationHandle h);
uint64_t el_driver_free(void);
void *elastic_thread(void *arg);
void *elastic_acker(void *arg);
/* elastic_ask.c: this process on its GPU's board */
void el_publish(uint64_t done_seq);             /* caller holds g_mu */
void el_apply_roster(struct eb_slot *s, int *live);
/* who may ask this process (the roster's assigned slots, cached a second), and their limits */
struct el_askers { uint64_t at; int roster; struct eb_roster_ent ro[EB_SLOTS]; };
void el_askers(struct el_askers *c, int from[EB_SLOTS], struct eb_roster_ent ent[EB_SLOTS]);
uint64_t el_bound_ask(uint64_t bits, const struct eb_roster_ent *asker, uint64_t resident_mib, int32_t mine,
                      uint64_t gpu_mib);
int el_make_room(uint64_t need, int guaranteed, int wait, struct refusal *ref);

#endif

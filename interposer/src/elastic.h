/* Elastic memory's internals shared by its parts (elastic*.c; see elastic.c): the ranges, the process's one state
 * struct, and the functions one part calls in another. Not an API: shim.h declares what the hooks use. */
#ifndef MEMSLICE_ELASTIC_H
#define MEMSLICE_ELASTIC_H

#include <errno.h>
#include <pthread.h>
#include <time.h>

#include "elastic_board.h"
#include "elastic_vmm.h"
#include "shim.h"

#define ELASTIC_TICK_MS 20            /* the mover's tick */
#define ELASTIC_OWED_MS 120000       /* an ask answered after its wait is counted if the answer comes within this */
#define ELASTIC_ACK_MS 1000            /* an asked neighbour acknowledges within a tick (or the move it is in) */
#define ELASTIC_YIELD_GAP_MS 100       /* a tenant moves memory for asks at most once per this */
#define ELASTIC_BACK_AFTER_MS 2000     /* memory yielded for an ask stays in host memory at least this long */
#define ELASTIC_SKIP_NOACK_MS 10000    /* a slot that did not acknowledge an ask is not asked again for this long */

struct elastic_chunk { CUmemGenericAllocationHandle h; int host; int moving; /* in the mover's batch */
                       int pool; /* the host pool's slot of h + 1 (0: h is the chunk's own) */ };
struct elastic_range {
    CUdeviceptr va;
    uint64_t size;
    unsigned n;
    struct elastic_range *next;
    struct elastic_chunk c[];
};
/* Where a direction's moves spent their time (ns, summed over its batches; elastic_move.c logs them at info
 * after each batch, src/memslice/elastic.py parses that line): new handles created, staged (temporary map +
 * access), the gate's close (the tenant's work drained), copies (issued and waited for), remaps
 * (unmap/map/access at the tenant's addresses), finish (temporary range and old handles released). */
struct elastic_phases { uint64_t batches, chunks, create, stage, gate, copy, remap, finish; };
/* A neighbour that could not take its share to host memory, as an asker saw it. */
struct elastic_refusal { int slot; int32_t pid; struct elastic_hostnote note; };

/* The process's elastic state, all of it in one place (defined in elastic.c; the work gate keeps its own, in
 * elastic_gate.c). `mu` guards the ranges, their placement, the figures and the moves. */
struct elastic_state {
    pthread_mutex_t mu;
    struct elastic_range *ranges;             /* newest first */
    uint64_t resident, swapped;               /* bytes, under mu */
    CUcontext ctx;                            /* the context of the first elastic allocation */
    CUdevice ord;                             /* its device: elastic memory lives on one GPU */
    int dev;                                  /* its ledger index */
    int started;                              /* the background threads run (once per process) */
    struct elastic_board board;               /* slot -1: no slot (asks, cannot be asked) */
    struct elastic_slot me;                   /* this process's slot, as last published */
    struct elastic_hostnote note;             /* this process's host note (board version 4), under mu */
    uint64_t yield_ns;                        /* when this process last gave HBM away (coarse clock) */
    uint64_t acked;                           /* the last ask the acker acknowledged (atomic) */
    uint64_t skip_until[ELASTIC_SLOTS];       /* neighbours that did not answer in time: not asked again before */
    struct elastic_streams streams;           /* the mover's copy streams (elastic_move.c) */
    struct elastic_batch batch;               /* the mover's batch, under mu */
    uint64_t create_ns;                       /* creating the batch's new handles (the mover adds, under mu) */
    struct elastic_phases phases[2];          /* [1]: to host memory, [0]: back to HBM; under mu */
    struct elastic_pool pool;                 /* pinned host chunks kept across moves (elastic_pool.c), under mu */
    uint64_t move_ns;                         /* when the last batch moved (the pool's keep time counts from it) */
    uint64_t owed_seq[ELASTIC_SLOTS];         /* an ask of ours a neighbour had not answered when the wait ended
                                               * (the driver had room first): counted when it answers; under mu */
};
extern struct elastic_state g_es;

/* Time for idleness and bounded waits: now_ns (elastic_vmm.h). */

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

/* Chunk i of a range: its offset is i * ELASTIC_CHUNK, its length ELASTIC_CHUNK but for the last. */
static inline uint64_t elastic_chunk_len(const struct elastic_range *r, unsigned i) {
    uint64_t off = (uint64_t)i * ELASTIC_CHUNK;
    return r->size - off < ELASTIC_CHUNK ? r->size - off : ELASTIC_CHUNK;
}

/* The parts, in their one direction: ranges (elastic.c) -> the mover (elastic_move.c) -> asks (elastic_ask.c)
 * -> the board (elastic_board.h); each may use the gate (elastic_gate.c) and the VMM helpers (elastic_vmm.h),
 * which use none of them. */
/* elastic_gate.c: the work gate and the drainer (their state is the gate's own) */
void elastic_gate_open(void);
int elastic_gate_close(void);                /* 0, or -1 with the gate open again */
int elastic_drainer_start(CUcontext ctx);
void elastic_drain_probe(void);
int elastic_is_idle(void);
uint64_t elastic_last_call_ns(void);         /* CLOCK_MONOTONIC of the last gated call */
void elastic_mark_active(void);              /* count as a call now (elastic mode starting) */
void elastic_gate_after_fork(void);
/* elastic_move.c: the background threads that move chunks */
void *elastic_thread(void *arg);
void *elastic_acker(void *arg);
/* elastic_ask.c: asks whose answers came after the wait, counted by the mover's tick (caller holds mu) */
void elastic_settle_owed(void);
/* elastic_ask.c: this process on its GPU's board */
void elastic_publish(uint64_t done_seq);     /* caller holds g_es.mu */
void elastic_apply_roster(struct elastic_slot *s, int *live);
/* who may ask this process (the roster's assigned slots, cached while its file's stamp holds, a second at most),
 * and their limits */
struct elastic_askers {
    uint64_t at;
    int roster;
    struct elastic_roster_stamp stamp; /* the file's when it was read */
    struct elastic_roster_ent ro[ELASTIC_SLOTS];
};
void elastic_askers(struct elastic_askers *c, int from[ELASTIC_SLOTS], struct elastic_roster_ent ent[ELASTIC_SLOTS]);
void elastic_read_asks(struct elastic_askers *c, int from[ELASTIC_SLOTS], struct elastic_roster_ent ent[ELASTIC_SLOTS],
                       struct elastic_ask asks[ELASTIC_SLOTS]);
uint64_t elastic_bound_ask(uint64_t bits, const struct elastic_roster_ent *asker, uint64_t resident_mib, int32_t mine,
                           uint64_t gpu_mib);
int elastic_make_room(uint64_t need, int guaranteed, int wait, struct elastic_refusal *ref);

#endif

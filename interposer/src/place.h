/* Where an allocation goes, decided in one place (docs/architecture.md, "Oversubscription" and "Elastic
 * memory"): place() is the decision, pure, from the facts the hooks gather (place_current, place_on); the
 * hooks then act on it, the same way on every route:
 *   PLACE_DRIVER   not accounted (accounting off, no size, a GPU outside the region without a quota): the
 *                  driver's call, unchanged
 *   PLACE_REFUSE   a GPU the quota cannot charge (DEV_UNCHARGEABLE): out of memory, the driver not called
 *   PLACE_DEVICE   charge `charge` bytes to the quota, then the driver allocates in HBM
 *   PLACE_ELASTIC  charge `charge` bytes (2 MiB units), then elastic.c maps it: HBM where it can be had,
 *                  else host memory, movable later
 * and past the quota (the charge refused), `spill` says whether the route serves it from host memory
 * (spill.c) or answers out of memory. */
#ifndef MEMSLICE_PLACE_H
#define MEMSLICE_PLACE_H

#include "shim.h"

enum place_to { PLACE_DRIVER = 0, PLACE_REFUSE, PLACE_DEVICE, PLACE_ELASTIC };
/* What a route can do besides a plain device allocation. */
enum { PLACE_CAN_SPILL = 1, PLACE_CAN_ELASTIC = 2 };

struct place_facts {
    int dev;              /* region index of the GPU; -1 not accounted; DEV_UNCHARGEABLE */
    uint64_t n;           /* bytes asked */
    unsigned can;         /* PLACE_CAN_* of the route */
    int oversubscribe;    /* g_cfg.oversubscribe */
    int elastic_mode;     /* g_elastic */
    int elastic_gpu;      /* this GPU is the process's elastic one (elastic_bind; read only when it matters) */
};

/* 16 bytes: passed and returned in two registers. */
struct placement {
    uint64_t charge;      /* bytes charged to the quota before acting */
    int dev;              /* region index charged (PLACE_DEVICE, PLACE_ELASTIC) */
    unsigned char to;     /* enum place_to */
    unsigned char spill;  /* past the quota: serve from host memory (else out of memory) */
};

/* Whether elastic mode could take the allocation, so that the GPU's binding is worth asking for (binding the
 * first time opens the board and starts the elastic threads). Pure. */
static inline int place_elastic_candidate(const struct place_facts *f) {
    return f->elastic_mode && (f->can & PLACE_CAN_ELASTIC) && f->dev >= 0 && f->n >= MS_ELASTIC_MIN;
}

/* The decision (pure): see the top of this file. */
static inline struct placement place(const struct place_facts *f) {
    struct placement p = {.charge = f->n, .dev = f->dev, .to = PLACE_DEVICE, .spill = 0};
    if (UNLIKELY(f->dev < 0)) {
        p.to = f->dev == DEV_UNCHARGEABLE ? PLACE_REFUSE : PLACE_DRIVER;
        return p;
    }
    if (UNLIKELY(place_elastic_candidate(f)) && f->elastic_gpu) {
        p.to = PLACE_ELASTIC;
        p.charge = (f->n + (2ull << 20) - 1) & ~((2ull << 20) - 1);
    }
    p.spill = f->oversubscribe && (f->can & PLACE_CAN_SPILL) ? 1 : 0;
    return p;
}

/* The facts for an allocation of n bytes on GPU `dev` (a region index, or -1 / DEV_UNCHARGEABLE), and the
 * decision. Routes that name their device (cuMemCreate) come here directly. */
static inline struct placement place_on(int dev, uint64_t n, unsigned can) {
    struct place_facts f = {.dev = dev, .n = n, .can = can, .oversubscribe = g_cfg.oversubscribe};
    return place(&f);
}

/* The facts for an allocation of n bytes on the current context's GPU (its ordinal into *ord), and the
 * decision. `want`: the call is one to account (a pointer to fill, a size above zero). */
static inline struct placement place_current(int want, uint64_t n, unsigned can, CUdevice *ord) {
    struct place_facts f = {.dev = want && accounting() ? current_dev(ord) : -1, .n = n, .can = can,
                            .oversubscribe = g_cfg.oversubscribe, .elastic_mode = g_elastic};
    if (UNLIKELY(place_elastic_candidate(&f))) f.elastic_gpu = elastic_bind(f.dev, *ord);
    return place(&f);
}

#endif

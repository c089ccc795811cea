/* A pointer-keyed table (address -> allocation record), striped so that threads freeing different
 * pointers rarely meet on a lock. Header-only: the shim and the simulator each keep one per process.
 * Why hand-written: it sits on the alloc/free hot path of a preloaded C library, which may not link
 * anything beyond libc, and needs range lookups for interior pointers. */
#ifndef MEMSLICE_PTRMAP_H
#define MEMSLICE_PTRMAP_H

#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct ms_rec {
    uint64_t key;       /* base address or handle; 0 = empty, 1 = deleted */
    uint64_t size;      /* bytes charged / allocated */
    uint64_t aux;       /* kind-specific (pool, handle, host base...) */
    int32_t dev;        /* device (region) index */
    uint32_t kind;      /* caller-defined */
} ms_rec;

#define MS_PTRMAP_STRIPES 64
/* A stripe's lock is a test-and-test-and-set spinlock: the critical sections are a handful of probes, and
 * unlocking is a plain release store (a pthread mutex costs one more atomic per pair). It yields when
 * it has to wait long, so a preempted holder costs its waiters a time slice, not a spin. */
typedef struct ms_stripe {
    int lock;
    uint32_t cap, used, live;
    ms_rec *slots;
    char pad[40];
} ms_stripe;

static inline void ms_stripe_lock(ms_stripe *st) {
    for (unsigned spins = 0; __atomic_exchange_n(&st->lock, 1, __ATOMIC_ACQUIRE); spins++) {
        while (__atomic_load_n(&st->lock, __ATOMIC_RELAXED))
            if (++spins > 64) sched_yield();
    }
}
static inline void ms_stripe_unlock(ms_stripe *st) { __atomic_store_n(&st->lock, 0, __ATOMIC_RELEASE); }

typedef struct ms_ptrmap { ms_stripe s[MS_PTRMAP_STRIPES]; } ms_ptrmap;

static inline uint64_t ms_hash64(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
    return x;
}

/* A zeroed ms_ptrmap (static storage) is ready to use. */
static inline void ms_ptrmap_init(ms_ptrmap *m) { memset(m, 0, sizeof *m); }

static inline ms_stripe *ms_stripe_of(ms_ptrmap *m, uint64_t key) {
    return &m->s[ms_hash64(key) & (MS_PTRMAP_STRIPES - 1)];
}

/* Insert into a stripe's open-addressing table (caller holds the stripe lock). 0 or -1 (no memory). */
static inline int ms_stripe_put(ms_stripe *st, const ms_rec *r) {
    if ((st->used + 1) * 4 >= st->cap * 3) {
        uint32_t ncap = st->cap ? st->cap * 2 : 64;
        ms_rec *ns = calloc(ncap, sizeof *ns);
        if (!ns) return -1;
        for (uint32_t i = 0; i < st->cap; i++) {
            if (st->slots[i].key <= 1) continue;
            uint32_t j = (uint32_t)(ms_hash64(st->slots[i].key) >> 8) & (ncap - 1);
            while (ns[j].key) j = (j + 1) & (ncap - 1);
            ns[j] = st->slots[i];
        }
        free(st->slots);
        st->slots = ns;
        st->cap = ncap;
        st->used = st->live;
    }
    uint32_t j = (uint32_t)(ms_hash64(r->key) >> 8) & (st->cap - 1);
    while (st->slots[j].key > 1) j = (j + 1) & (st->cap - 1);
    if (st->slots[j].key == 0) st->used++;
    st->slots[j] = *r;
    st->live++;
    return 0;
}

static inline int ms_ptrmap_put(ms_ptrmap *m, const ms_rec *r) {
    ms_stripe *st = ms_stripe_of(m, r->key);
    ms_stripe_lock(st);
    int rc = ms_stripe_put(st, r);
    ms_stripe_unlock(st);
    return rc;
}

/* Index of `key` in the stripe's table, or -1 (caller holds the stripe lock). */
static inline int ms_stripe_find(const ms_stripe *st, uint64_t key) {
    if (!st->cap) return -1;
    uint32_t j = (uint32_t)(ms_hash64(key) >> 8) & (st->cap - 1);
    for (; st->slots[j].key; j = (j + 1) & (st->cap - 1))
        if (st->slots[j].key == key) return (int)j;
    return -1;
}

/* Copy the record of `key` to *out (if out), removing it when `take`. 1 if found, 0 if not. */
static inline int ms_ptrmap_find(ms_ptrmap *m, uint64_t key, ms_rec *out, int take) {
    ms_stripe *st = ms_stripe_of(m, key);
    ms_stripe_lock(st);
    int j = ms_stripe_find(st, key);
    if (j >= 0) {
        if (out) *out = st->slots[j];
        if (take) {
            st->slots[j].key = 1; /* tombstone: keeps later probes intact */
            st->live--;
        }
    }
    ms_stripe_unlock(st);
    return j >= 0;
}

static inline int ms_ptrmap_take(ms_ptrmap *m, uint64_t key, ms_rec *out) { return ms_ptrmap_find(m, key, out, 1); }
static inline int ms_ptrmap_get(ms_ptrmap *m, uint64_t key, ms_rec *out) { return ms_ptrmap_find(m, key, out, 0); }

/* The record whose [key, key+size) contains addr (interior pointers). Slow: scans every stripe. */
static inline int ms_ptrmap_find_range(ms_ptrmap *m, uint64_t addr, ms_rec *out) {
    if (ms_ptrmap_get(m, addr, out)) return 1;
    for (int i = 0; i < MS_PTRMAP_STRIPES; i++) {
        ms_stripe *st = &m->s[i];
        int found = 0;
        ms_stripe_lock(st);
        for (uint32_t j = 0; j < st->cap; j++) {
            ms_rec *r = &st->slots[j];
            if (r->key > 1 && addr >= r->key && addr < r->key + (r->size ? r->size : 1)) {
                *out = *r;
                found = 1;
                break;
            }
        }
        ms_stripe_unlock(st);
        if (found) return 1;
    }
    return 0;
}

#endif

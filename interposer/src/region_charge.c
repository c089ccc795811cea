/* The region's hot path: charging and uncharging a total lock-free (the op_active / CAS protocol described
 * in region.c), stepping aside, bounded, while a recount has the totals frozen. */
#define _GNU_SOURCE
#include <errno.h>

#include "region_int.h"


/* A recount has frozen this total: wait for it with a bounded backoff; finish it ourselves if its owner
 * died (the robust mutex says so); abandon it (unfreeze_all) once past `deadline`, since its owner is
 * stalled (stopped) or too slow. Returns with the word unfrozen at the time of the last load. */
static void wait_unfrozen(region_handle *l, uint64_t *word, uint64_t deadline) {
    for (unsigned step = 0; LOAD(word) & MS_FROZEN; step++) {
        backoff(step);
        if (step < 64 || (step & 7) != 0) continue;
        int rc = pthread_mutex_trylock(region_mutex(l));
        if (rc == EOWNERDEAD) {
            pthread_mutex_consistent(region_mutex(l));
            region_recount_locked(l, 1);
            region_mutex_unlock(l);
        } else if (rc == 0) {
            if (LOAD(word) & MS_FROZEN) region_unfreeze_all(l->r); /* frozen with no recount running: a leftover */
            region_mutex_unlock(l);
        } else if (now_ns() > deadline && (LOAD(word) & MS_FROZEN)) {
            region_unfreeze_all(l->r);
            ADD(&l->r->hdr.recount_aborts, 1);
        }
    }
}

/* begin_op's slow path: the total is frozen; step aside (op_active lowered) until the recount is done or
 * abandoned at *deadline (set at the first wait of this operation, so that all its waits share one).
 * Kept out of line so that the hot path stays a few instructions. */
static __attribute__((noinline)) uint64_t begin_op_frozen(region_handle *l, struct ms_slot *s, uint64_t *word,
                                                          uint64_t *deadline) {
    uint64_t cur = LOAD(word);
    while (cur & MS_FROZEN) {
        SUB(&s->op_active, 1u);
        if (!*deadline) *deadline = now_ns() + MS_NS(MS_FROZEN_WAIT_MS);
        wait_unfrozen(l, word, *deadline);
        ADD(&s->op_active, 1u);
        cur = LOAD(word);
    }
    return cur;
}

/* Load a total for an update by this process: op_active is raised first (the reclaimer's Dekker pair);
 * a frozen total (a recount) is the slow path. */
static inline __attribute__((always_inline)) uint64_t begin_op(region_handle *l, struct ms_slot *s, uint64_t *word,
                                                               uint64_t *deadline) {
    ADD(&s->op_active, 1u);
    uint64_t cur = LOAD(word);
    if (__builtin_expect(!(cur & MS_FROZEN), 1)) return cur;
    return begin_op_frozen(l, s, word, deadline);
}

/* Charge n bytes to device dev (its HBM total, or its host total) unless that passes `limit`: one CAS on the
 * total, then this slot's own count. 0, or -1 (over the limit, or the region was lost). */
int region_charge(region_handle *l, int dev, uint64_t n, uint64_t limit, int host) {
    struct ms_slot *s = &l->r->slot[l->slot];
    struct ms_device *dv = &l->r->dev[dev];
    uint64_t *word = host ? &dv->host_used : &dv->used;
    uint64_t deadline = 0, cur, next;
    for (;;) {
        cur = begin_op(l, s, word, &deadline);
        for (;;) {
            if (n > limit || cur > limit - n) break; /* a frozen value never passes: bit 63 is huge */
            next = cur + n;
            if (CAS(word, &cur, next)) goto charged;
        }
        SUB(&s->op_active, 1u);
        if (!(cur & MS_FROZEN)) return -1;
    }
charged:;
    uint64_t mine = ADD(host ? &s->host_bytes[dev] : &s->device_bytes[dev], n) + n;
    SUB(&s->op_active, 1u);
    /* statistics, off the critical section */
    uint64_t *peak = host ? &dv->host_peak : &dv->peak;
    uint64_t p = LOAD(peak);
    while (next > p && !CAS(peak, &p, next)) {}
    if (!host) {
        uint64_t sp = LOAD(&s->peak);
        while (mine > sp && !CAS(&s->peak, &sp, mine)) {}
    }
    return 0;
}

/* Give n bytes back: the total (never below zero), then this slot's count. */
void region_uncharge(region_handle *l, int dev, uint64_t n, int host) {
    struct ms_slot *s = &l->r->slot[l->slot];
    struct ms_device *dv = &l->r->dev[dev];
    uint64_t *word = host ? &dv->host_used : &dv->used;
    uint64_t deadline = 0, cur = begin_op(l, s, word, &deadline);
    for (;;) {
        if (cur & MS_FROZEN) { /* frozen between our load and our CAS: start over */
            SUB(&s->op_active, 1u);
            cur = begin_op(l, s, word, &deadline);
            continue;
        }
        if (CAS(word, &cur, cur > n ? cur - n : 0)) break;
    }
    SUB(host ? &s->host_bytes[dev] : &s->device_bytes[dev], n);
    SUB(&s->op_active, 1u);
}

/* Note that n bytes of this process's charge on dev are the driver's own (contexts, limits, modules), or
 * (give_back) no longer: the device's figure first, then the slot's, so that a death between the two leaves
 * the device's figure at least the sum of the slots' (a sweep lowers it by the slot's; a recount rebuilds it). */
void region_note_taken(region_handle *l, int dev, uint64_t n, int give_back) {
    if (l->slot < 0 || dev < 0 || dev >= MS_MAX_DEVICES || !n) return;
    uint64_t *total = &l->r->dev[dev].driver_taken, *mine = &l->r->slot[l->slot].driver_taken[dev];
    if (!give_back) {
        ADD(total, n);
        ADD(mine, n);
        return;
    }
    uint64_t cur = LOAD(mine);
    while (!CAS(mine, &cur, cur > n ? cur - n : 0)) {}
    cur = LOAD(total);
    while (!CAS(total, &cur, cur > n ? cur - n : 0)) {}
}

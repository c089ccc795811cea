/* Reclaiming dead processes: sweeps (exact, subtracting a dead slot's bytes) and recounts (rebuilding every
 * total from the live slots when a process died inside a charge), under the region's robust mutex. */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>

#include "region_int.h"


/* Take the slow-path mutex, waiting at most MS_LOCK_WAIT_MS. A previous holder that died leaves the
 * totals possibly frozen or half reclaimed: the caller is told (return 1) and must recount before
 * proceeding. -1 if it could not be taken (a stopped holder, or a mutex word a tenant garbled): the
 * caller skips its slow path, and l->lock_error says why. */
int region_mutex_lock(region_handle *l) {
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_nsec += (long)(MS_LOCK_WAIT_MS % 1000) * 1000000L;
    dl.tv_sec += MS_LOCK_WAIT_MS / 1000 + dl.tv_nsec / 1000000000L;
    dl.tv_nsec %= 1000000000L;
    int rc = pthread_mutex_clocklock(region_mutex(l), CLOCK_MONOTONIC, &dl);
    if (rc == EOWNERDEAD) {
        pthread_mutex_consistent(region_mutex(l));
        return 1;
    }
    if (rc == 0) return 0;
    l->lock_error = rc;
    return -1;
}

/* Give the slow-path mutex back. */
void region_mutex_unlock(region_handle *l) { pthread_mutex_unlock(region_mutex(l)); }

/* The slot high-water mark, clamped (the file is tenant-writable). */
static int slot_hwm(const struct ms_region *r) {
    uint32_t h = __atomic_load_n(&r->hdr.slot_hwm, __ATOMIC_SEQ_CST);
    return h > MS_MAX_SLOTS ? MS_MAX_SLOTS : (int)h;
}

/* Give a slot back: its counts first, its state last (claimers look at the state). */
void region_free_slot(struct ms_slot *s) {
    memset(s->device_bytes, 0, sizeof s->device_bytes);
    memset(s->host_bytes, 0, sizeof s->host_bytes);
    memset(s->driver_taken, 0, sizeof s->driver_taken);
    STORE(&s->op_active, 0u);
    s->pid = 0;
    s->refused = 0;
    s->peak = 0;
    STORE(&s->state, (uint32_t)MS_SLOT_FREE);
}

/* Clear the frozen bit of every total. Used by a recount that gives up, and by a waiter that abandons a
 * recount whose owner stalled: the totals return to their values before the freeze (which never
 * under-count), and the stalled owner's publishing CAS, expecting its frozen value, then fails. Only a
 * recount, under the mutex, sets the bit, so that value cannot come back while its owner holds it. */
void region_unfreeze_all(struct ms_region *r) {
    uint32_t nd = ndev(r);
    for (uint32_t d = 0; d < nd; d++) {
        __atomic_fetch_and(&r->dev[d].used, ~MS_FROZEN, __ATOMIC_SEQ_CST);
        __atomic_fetch_and(&r->dev[d].host_used, ~MS_FROZEN, __ATOMIC_SEQ_CST);
    }
}

/* Wait (bounded) until live slot s has no step in flight. 0, or -1 at the deadline. */
static int wait_quiet(const struct ms_slot *s, uint64_t deadline) {
    for (unsigned step = 0; LOAD(&s->op_active) != 0; step++) {
        if ((step & 15) == 15 && now_ns() > deadline) return -1;
        backoff(step);
    }
    return 0;
}

/* Rebuild every total from the live slots, dropping dead ones. Caller holds the region lock.
 * Each device's totals are published with a CAS from the frozen value set here, so a recount that was
 * abandoned (its owner stopped past MS_FROZEN_WAIT_MS) publishes nothing stale; a dead slot is cleared for
 * the devices whose totals were published, and freed when all were. Returns 0, or -1 if a live process
 * stayed inside a charge for MS_RECOUNT_WAIT_MS or the recount was abandoned (then the totals are as
 * before and a later sweep tries again, not before recount_retry_ns). */
int region_recount_locked(region_handle *l, int now_anyway) {
    struct ms_region *r = l->r;
    uint64_t now = now_ns();
    if (!now_anyway && now < LOAD(&r->hdr.recount_retry_ns)) return -1;
    uint32_t nd = ndev(r);
    uint64_t fu[MS_MAX_DEVICES], fh[MS_MAX_DEVICES];
    for (uint32_t d = 0; d < nd; d++) {
        fu[d] = __atomic_fetch_or(&r->dev[d].used, MS_FROZEN, __ATOMIC_SEQ_CST) | MS_FROZEN;
        fh[d] = __atomic_fetch_or(&r->dev[d].host_used, MS_FROZEN, __ATOMIC_SEQ_CST) | MS_FROZEN;
    }
    uint64_t deadline = now + MS_NS(MS_RECOUNT_WAIT_MS);
    static __thread unsigned char dead[MS_MAX_SLOTS];
    int hwm = slot_hwm(r);
    for (int i = 0; i < hwm; i++) {
        struct ms_slot *s = &r->slot[i];
        dead[i] = 0;
        if (LOAD(&s->state) != MS_SLOT_LIVE) continue;
        if (!region_slot_alive(l, i)) dead[i] = 1;
        else if (wait_quiet(s, deadline) < 0) { /* a live process between CAS and its slot update */
            region_unfreeze_all(r);
            STORE(&r->hdr.recount_retry_ns, now_ns() + MS_NS(MS_RECOUNT_WAIT_MS));
            return -1;
        }
    }
    uint64_t used[MS_MAX_DEVICES] = {0}, host[MS_MAX_DEVICES] = {0}, taken[MS_MAX_DEVICES] = {0};
    for (int i = 0; i < hwm; i++) {
        struct ms_slot *s = &r->slot[i];
        if (dead[i] || LOAD(&s->state) != MS_SLOT_LIVE) continue;
        for (uint32_t d = 0; d < nd; d++) {
            used[d] += LOAD(&s->device_bytes[d]);
            host[d] += LOAD(&s->host_bytes[d]);
            taken[d] += LOAD(&s->driver_taken[d]);
        }
    }
    for (uint32_t d = 0; d < nd; d++) STORE(&r->dev[d].driver_taken, taken[d]); /* a figure, never a limit */
    unsigned char pu[MS_MAX_DEVICES], ph[MS_MAX_DEVICES];
    int all = 1;
    for (uint32_t d = 0; d < nd; d++) { /* the new totals replace the frozen values (clearing the bit) */
        pu[d] = (unsigned char)CAS(&r->dev[d].used, &fu[d], used[d]);
        ph[d] = (unsigned char)CAS(&r->dev[d].host_used, &fh[d], host[d]);
        all &= pu[d] & ph[d];
    }
    /* Dead slots: each column whose total was published no longer counts them; the rest stay for a later
     * recount (the slot keeps op_active, so it stays ambiguous until then). */
    for (int i = 0; i < hwm; i++) {
        if (!dead[i]) continue;
        struct ms_slot *s = &r->slot[i];
        for (uint32_t d = 0; d < nd; d++) {
            if (pu[d]) STORE(&s->device_bytes[d], 0);
            if (pu[d]) STORE(&s->driver_taken[d], 0);
            if (ph[d]) STORE(&s->host_bytes[d], 0);
        }
        if (all) {
            region_free_slot(s);
            ADD(&r->hdr.reclaimed, 1);
        }
    }
    if (!all) return -1;
    ADD(&r->hdr.recounts, 1);
    return 0;
}

/* Subtract n from a total, never below zero (a corrupt slot must not wrap the counter). */
static void sub_total(uint64_t *word, uint64_t n) {
    uint64_t cur = LOAD(word);
    for (;;) {
        uint64_t b = region_bytes(cur), nb = b > n ? b - n : 0;
        if (CAS(word, &cur, (cur & MS_FROZEN) | nb)) return;
    }
}

/* Reclaim dead slots under the mutex: exactly (subtract their bytes) when none died inside a charge, else
 * by a recount. Returns how many were reclaimed. */
static int sweep_locked(region_handle *l, int needs_recount, int now_anyway) {
    struct ms_region *r = l->r;
    int n = 0, ambiguous = needs_recount, hwm = slot_hwm(r);
    for (int i = 0; i < hwm && !ambiguous; i++) {
        struct ms_slot *s = &r->slot[i];
        if (LOAD(&s->state) == MS_SLOT_LIVE && !region_slot_alive(l, i) && LOAD(&s->op_active) != 0) ambiguous = 1;
    }
    if (ambiguous && region_recount_locked(l, now_anyway) == 0) return 1;
    uint32_t nd = ndev(r);
    for (int i = 0; i < hwm; i++) {
        struct ms_slot *s = &r->slot[i];
        if (LOAD(&s->state) != MS_SLOT_LIVE || region_slot_alive(l, i)) continue;
        if (LOAD(&s->op_active) != 0) continue; /* died mid-charge and recount timed out: next sweep */
        for (uint32_t d = 0; d < nd; d++) {
            sub_total(&r->dev[d].used, LOAD(&s->device_bytes[d]));
            sub_total(&r->dev[d].host_used, LOAD(&s->host_bytes[d]));
            sub_total(&r->dev[d].driver_taken, LOAD(&s->driver_taken[d]));
        }
        region_free_slot(s);
        ADD(&r->hdr.reclaimed, 1);
        n++;
    }
    return n;
}

/* A sweep with the mutex taken within its bound (-1 without it), stamping the time for the periodic one. */
static int sweep(region_handle *l, int now_anyway) {
    int dirty = region_mutex_lock(l);
    if (dirty < 0) return -1;
    int n = sweep_locked(l, dirty, now_anyway);
    STORE(&l->r->hdr.swept_ns, now_ns());
    region_mutex_unlock(l);
    return n;
}

/* How many slots still belong to dead processes (claimed, their owner's lock gone): what a sweep left. */
int region_dead_slots(region_handle *l) {
    int n = 0, hwm = slot_hwm(l->r);
    for (int i = 0; i < hwm; i++)
        if (LOAD(&l->r->slot[i].state) == MS_SLOT_LIVE && !region_slot_alive(l, i)) n++;
    return n;
}

/* Reclaim dead processes; a recount is not retried before recount_retry_ns. */
int region_sweep(region_handle *l) { return sweep(l, 0); }
/* Reclaim dead processes now, recount included (exit, and the region library). */
int region_sweep_now(region_handle *l) { return sweep(l, 1); }

/* The periodic sweep: the first caller after MS_SWEEP_PERIOD_MS wins the turn with a CAS on swept_ns. */
void region_sweep_if_due(region_handle *l) {
    uint64_t now = now_ns(), last = LOAD(&l->r->hdr.swept_ns);
    if (now - last < MS_NS(MS_SWEEP_PERIOD_MS) && last <= now) return;
    if (!CAS(&l->r->hdr.swept_ns, &last, now)) return; /* another process (or thread) took this turn */
    int rc = pthread_mutex_trylock(region_mutex(l));   /* never wait here: the caller is allocating */
    if (rc == EOWNERDEAD) pthread_mutex_consistent(region_mutex(l));
    else if (rc != 0) return;
    sweep_locked(l, rc == EOWNERDEAD, 0);
    region_mutex_unlock(l);
}

/* The door to the container's quota (quota.h): the only file of the shim that charges or uncharges the
 * region (region_charge.c's lock-free totals), for HBM and for spilled host memory, that counts refusals and
 * says them, and that notes the driver's own memory. The hooks decide where an allocation goes (place.h) and
 * keep their records (accounting.c); what that costs the quota is asked here. */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "quota.h"
#include "shim.h"

/* Count a refusal on the device (HBM or host) and on this process's slot: the agent's metrics and `memslice
 * top` read them. */
static void count_refusal(int dev, int host) {
    struct ms_device *d = &g_region.r->dev[dev];
    __atomic_fetch_add(host ? &d->spill_refused : &d->refused, 1, __ATOMIC_SEQ_CST);
    if (g_region.slot >= 0) __atomic_fetch_add(&g_region.r->slot[g_region.slot].refused, 1, __ATOMIC_SEQ_CST);
}

/* A slot of this process in the region, claimed at the first charge after a fork: 0, or -1 (none free). */
static inline int have_slot(void) {
    return g_region.slot >= 0 || region_claim(&g_region) == 0 ? 0 : -1;
}

/* Reclaiming dead processes before refusing is what makes a killed neighbour's quota come back. In
 * oversubscription mode going over the quota is routine (it spills), so the sweep is rate-limited there
 * to one per 50 ms per process. */
static int sweep_due(void) {
    static uint64_t last;
    if (!g_cfg.oversubscribe) return 1;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    uint64_t prev = __atomic_load_n(&last, __ATOMIC_RELAXED);
    if (prev && now - prev < 50000000ull) return 0;
    return __atomic_compare_exchange_n(&last, &prev, now, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}

/* Once per process: say why dead processes could not be reclaimed before a refusal. */
static void note_sweep_failed(void) {
    static int said;
    if (__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED)) return;
    shim_log(LOG_WARN, "memslice: the region %s was locked for more than %d ms (%s; a stopped process of the "
             "container?): usage of dead processes could not be reclaimed before a refusal", g_cfg.region_path,
             MS_LOCK_WAIT_MS, strerror(g_region.lock_error));
}

/* The refusal's line, one per second at most, with how many refusals it stands for and what the container
 * uses of its quota. */
static void log_refusal(const char *call, uint64_t request, int dev) {
    static uint64_t last_ns;
    static unsigned suppressed;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    uint64_t prev = __atomic_load_n(&last_ns, __ATOMIC_RELAXED);
    if ((prev && now - prev < 1000000000ull) ||
        !__atomic_compare_exchange_n(&last_ns, &prev, now, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
        __atomic_fetch_add(&suppressed, 1, __ATOMIC_RELAXED);
        return;
    }
    unsigned more = __atomic_exchange_n(&suppressed, 0, __ATOMIC_RELAXED);
    char a[32], b[32], c[32];
    const struct ms_device *d = &g_region.r->dev[dev];
    char tail[64] = "";
    if (more) snprintf(tail, sizeof tail, " (+%u more refused since the last message)", more);
    shim_log(LOG_ERROR, "memslice: %s of %s refused on %.48s: the container uses %s of its %s quota (%s)%s",
             call, fmt_bytes(request, a, sizeof a), d->uuid, fmt_bytes(region_bytes(d->used), b, sizeof b),
             fmt_bytes(g_cfg.limit, c, sizeof c), g_cfg.limit_source, tail);
}

/* Past the quota: reclaim dead processes (rate-limited when oversubscribing); 1 when some were, so that the
 * charge is worth trying once more. Out of line: the hot path is quota_charge's first try. */
static __attribute__((noinline)) int swept_some(void) {
    if (!sweep_due()) return 0;
    int swept = region_sweep(&g_region);
    if (swept < 0) note_sweep_failed();
    return swept > 0;
}

/* Charge HBM under the quota (see quota.h); every 256th charge of a thread also runs the periodic sweep, so
 * dead processes' charges come back without anyone having to be refused first. */
CUresult quota_charge(int dev, uint64_t n, const char *call, int quiet) {
    static __thread __attribute__((tls_model("initial-exec"))) unsigned calls; /* preloaded: static TLS */
    if (__builtin_expect(have_slot() == 0, 1)) {
        if (UNLIKELY((++calls & 255) == 0)) region_sweep_if_due(&g_region);
        for (int tries = 0; tries < 2; tries++) {
            if (region_charge(&g_region, dev, n, g_cfg.limit, 0) == 0) return CUDA_SUCCESS;
            if (tries || !swept_some()) break; /* a second try only after dead processes were reclaimed */
        }
    }
    if (!quiet) quota_refuse(dev, n, call);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* Charge what is left of the quota, up to `want`: other threads move the total, so a few tries, then none. */
uint64_t quota_charge_left(int dev, uint64_t want) {
    if (have_slot() < 0) return 0;
    for (int tries = 0; tries < 8; tries++) {
        uint64_t used = quota_used(dev);
        if (used >= g_cfg.limit) return 0;
        uint64_t n = g_cfg.limit - used < want ? g_cfg.limit - used : want;
        if (region_charge(&g_region, dev, n, g_cfg.limit, 0) == 0) return n;
    }
    return 0;
}

/* Charge whatever the quota: the driver already took it. */
void quota_force(int dev, uint64_t n) {
    if (n && have_slot() == 0) region_charge(&g_region, dev, n, UINT64_MAX >> 2, 0);
}

/* The charge follows the driver's figure, up or down. */
void quota_settle(int dev, uint64_t had, uint64_t now) {
    if (now > had) quota_force(dev, now - had);
    else quota_uncharge(dev, had - now);
}

/* Give back; nothing was charged without a slot. */
void quota_uncharge(int dev, uint64_t n) {
    if (n && g_region.slot >= 0) region_uncharge(&g_region, dev, n, 0);
}

/* A refusal: counted in the region (metrics, `memslice top`), logged (rate-limited). */
void quota_refuse(int dev, uint64_t n, const char *call) {
    count_refusal(dev, 0);
    log_refusal(call, n, dev);
}

/* The host counter has its own cap (host_spill_limit; 0 means nothing spills). A refusal, the host's memory's
 * (`why_not`) or the cap's, is counted on the host counter's refusals. */
int quota_charge_host(int dev, uint64_t n, const char *call, const char *why_not) {
    uint64_t cap = g_cfg.spill_limit; /* UINT64_MAX >> 2 when no cap is set */
    if (!why_not) {
        if (have_slot() < 0) return -1; /* no slot: nothing can be charged, nothing to count it on */
        if (region_charge(&g_region, dev, n, cap, 1) == 0) return 0;
    }
    count_refusal(dev, 1);
    if (why_not) {
        shim_log(LOG_ERROR, "memslice: %s: %s", call, why_not);
        return -1;
    }
    char a[32], c[32];
    shim_log(LOG_ERROR, "memslice: %s of %s refused: over the quota, and the host spill would exceed its cap "
             "(%s%s; %s already spilled)", call, fmt_bytes(n, a, sizeof a), g_cfg.spill_source,
             cap ? "" : ": nothing may spill", fmt_bytes(region_bytes(g_region.r->dev[dev].host_used), c, sizeof c));
    return -1;
}

/* Give spilled bytes back to the host counter. */
void quota_uncharge_host(int dev, uint64_t n) {
    if (n && g_region.slot >= 0) region_uncharge(&g_region, dev, n, 1);
}

/* The driver's own share of this process's charge (measure.c). */
void quota_note_taken(int dev, uint64_t n, int give_back) { region_note_taken(&g_region, dev, n, give_back); }

/* The container's total on dev (frozen bit masked). */
uint64_t quota_used(int dev) { return region_bytes(__atomic_load_n(&g_region.r->dev[dev].used, __ATOMIC_SEQ_CST)); }

/* This process's own count on dev (its slot), 0 without one. */
uint64_t quota_mine(int dev) {
    if (g_region.slot < 0 || dev < 0 || dev >= MS_MAX_DEVICES) return 0;
    return __atomic_load_n(&g_region.r->slot[g_region.slot].device_bytes[dev], __ATOMIC_SEQ_CST);
}

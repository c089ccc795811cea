/* The region's truncation guard (see below): a region file truncated under a live process's mapping must not
 * kill it with SIGBUS. */
#define _GNU_SOURCE
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "region_int.h"

/* ---- the truncation guard ------------------------------------------------------------------------------
 * The region file is the tenant's: truncating it under a live process's MAP_SHARED mapping makes that
 * process's next access to the lost pages raise SIGBUS, which killed every CUDA process of the container.
 * A SIGBUS whose address lies in a guarded region mapping is handled here instead: the whole mapping is
 * replaced (MAP_FIXED) by a private anonymous one whose totals read MS_LOST_USED and whose recounts never
 * run, the faulting access is retried on it, and the process lives on with every further charge refused
 * (fail closed: it can free what it holds, never take more). Any other SIGBUS goes to the handler that was
 * there before (or kills the process as before). An application that installs its own SIGBUS handler
 * after the shim replaces this one. Not in libmemslice-region.so (its mappings live for one call). */
#ifndef MS_REGION_ONLY
#define MS_GUARDS 8
enum { GUARD_FREE, GUARD_ARMED, GUARD_REPLACING, GUARD_LOST };

struct guard {
    char *base;
    size_t size;
    region_handle *owner;
    int state;
};

static struct guard g_guards[MS_GUARDS];
static struct sigaction g_prev_bus;
static int g_bus_installed;

/* The totals of a lost region: over any quota, not frozen; no recount may rebuild them from its (empty)
 * slots. Runs in the signal handler: plain stores into fresh private memory only. */
static void poison(struct ms_region *r) {
    for (int d = 0; d < MS_MAX_DEVICES; d++) {
        r->dev[d].used = MS_LOST_USED;
        r->dev[d].host_used = MS_LOST_USED;
    }
    r->hdr.recount_retry_ns = UINT64_MAX;
    r->hdr.magic = MS_MAGIC;
}

/* Replace guard g's mapping by a poisoned private one (once; another thread faulting meanwhile retries its
 * access until it is done). 0, or -1 when the mapping could not be replaced (then the fault kills). */
static int replace_lost(struct guard *g) {
    int expect = GUARD_ARMED;
    if (!__atomic_compare_exchange_n(&g->state, &expect, GUARD_REPLACING, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
        return 0;
    void *m = mmap(g->base, g->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (m == MAP_FAILED) return -1;
    poison(m);
    g->owner->lost = 1;
    static const char msg[] = "memslice: the region file was truncated under this process; its GPU memory "
                              "allocations are refused from now on (restart the container's processes)\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    STORE(&g->state, GUARD_LOST);
    return 0;
}

/* Pass a SIGBUS that is not ours to the handler that was installed before, or let it kill. */
static void chain_bus(int sig, siginfo_t *si, void *uc) {
    if ((g_prev_bus.sa_flags & SA_SIGINFO) && g_prev_bus.sa_sigaction) {
        g_prev_bus.sa_sigaction(sig, si, uc);
    } else if (g_prev_bus.sa_handler != SIG_DFL && g_prev_bus.sa_handler != SIG_IGN) {
        g_prev_bus.sa_handler(sig);
    } else { /* the default action: the faulting access runs again and kills, as without the guard */
        signal(SIGBUS, SIG_DFL);
    }
}

/* The SIGBUS handler (see the guard's comment above). */
static void on_sigbus(int sig, siginfo_t *si, void *uc) {
    char *a = si->si_addr;
    for (int i = 0; i < MS_GUARDS; i++) {
        struct guard *g = &g_guards[i];
        if (LOAD(&g->state) == GUARD_FREE || a < g->base || a >= g->base + g->size) continue;
        if (LOAD(&g->state) == GUARD_LOST || replace_lost(g) == 0) return; /* retried on the private mapping */
        break;
    }
    chain_bus(sig, si, uc);
}

/* Guard a region's mapping: install the handler once per process, then record the mapping. */
void region_guard_mapping(region_handle *l) {
    int expect = 0;
    if (__atomic_compare_exchange_n(&g_bus_installed, &expect, 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_sigbus;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGBUS, &sa, &g_prev_bus);
    }
    for (int i = 0; i < MS_GUARDS; i++) {
        struct guard *g = &g_guards[i];
        if (LOAD(&g->state) != GUARD_FREE) continue;
        g->base = (char *)l->r;
        g->size = l->map_size;
        g->owner = l;
        STORE(&g->state, GUARD_ARMED);
        return;
    }
}
#else
/* libmemslice-region.so maps a region for one call at a time: nothing to guard. */
void region_guard_mapping(region_handle *l) { (void)l; }
#endif

/* Simulated driver: counters of the work the driver did for this process that costs time on a real GPU but
 * leaves no trace in the results: host memory pinned per allocation (cuMemHostAlloc, cuMemHostRegister),
 * host memory created for VMM mappings (cuMemCreate with a host location), and copies. Tests read them to
 * tell a slow path from a fast one that gives the same bytes (the oversubscription spill path: a mapping
 * kind and no copies of its own; tests/shim/test_oversubscribe.py). Exported as memsliceSimCounters. */
#define _GNU_SOURCE
#include "simcuda.h"

static unsigned long long g_counters[SIM_COUNTERS];

/* Count one event of counter c and its bytes in counter c + 1 (relaxed: only totals are read). */
void sim_count(int c, uint64_t bytes) {
    __atomic_add_fetch(&g_counters[c], 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&g_counters[c + 1], bytes, __ATOMIC_RELAXED);
}

/* Set a high-water figure (the caller keeps it monotonic). */
void sim_count_set(int c, uint64_t v) {
    __atomic_store_n(&g_counters[c], v, __ATOMIC_RELAXED);
}

/* The counters in their documented order (simstate.h), at most n of them; returns how many there are. */
API unsigned int memsliceSimCounters(unsigned long long *out, unsigned int n) {
    for (unsigned int i = 0; out && i < n && i < SIM_COUNTERS; i++) out[i] = __atomic_load_n(&g_counters[i], __ATOMIC_RELAXED);
    return SIM_COUNTERS;
}

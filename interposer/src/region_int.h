/* The region's internals shared by its parts (region*.c; the API is interposer/include/memslice_region.h):
 * atomics, bounded waiting, and the helpers more than one part uses. Not installed, not part of any API. */
#ifndef MEMSLICE_REGION_INT_H
#define MEMSLICE_REGION_INT_H

#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>

#include "memslice_region.h"

#define LOAD(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)
#define ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_SEQ_CST)
#define SUB(p, v) __atomic_fetch_sub((p), (v), __ATOMIC_SEQ_CST)
#define CAS(p, expp, v) __atomic_compare_exchange_n((p), (expp), (v), 1, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)

#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

#define MS_NS(ms) ((uint64_t)(ms) * 1000000ull)

/* Monotonic nanoseconds, for the bounded waits (CLOCK_MONOTONIC is one clock for every process of a
 * machine, so deadlines written in the region mean the same to all of them). */
static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* One step of a bounded backoff: spin a little, then yield, then sleep up to 1 ms per step, so that a
 * waiter never burns a core while a stopped process holds what it waits for. */
static inline void backoff(unsigned step) {
    if (step < 32) {
        cpu_relax();
    } else if (step < 64) {
        sched_yield();
    } else {
        unsigned us = step < 74 ? 1u << (step - 64) : 1000u; /* 1 us .. 512 us, then 1 ms */
        struct timespec ts = {0, (long)(us > 1000 ? 1000 : us) * 1000};
        nanosleep(&ts, NULL);
    }
}

/* The device count as stored, clamped: the file is tenant-writable and every loop bound read from it
 * must stay inside the mapping. */
static inline uint32_t ndev(const struct ms_region *r) {
    uint32_t n = __atomic_load_n(&r->hdr.ndevices, __ATOMIC_SEQ_CST);
    return n > MS_MAX_DEVICES ? MS_MAX_DEVICES : n;
}

/* The region's slow-path mutex (process-shared, robust), in its header. */
static inline pthread_mutex_t *region_mutex(const region_handle *l) { return (pthread_mutex_t *)l->r->hdr.lock; }

/* region.c: fcntl byte locks */
int region_byte_lock(int fd, uint64_t off, int type);
int region_byte_lock_bounded(int fd, uint64_t off);
long region_lock_holder(int fd, uint64_t off, uint64_t len);
/* region_guard.c: the SIGBUS guard of a read-write mapping (a no-op in libmemslice-region.so) */
void region_guard_mapping(region_handle *l);
/* region_sweep.c: the slow-path mutex, freeing slots, recounts */
int region_mutex_lock(region_handle *l);
void region_mutex_unlock(region_handle *l);
void region_free_slot(struct ms_slot *s);
void region_unfreeze_all(struct ms_region *r);
int region_recount_locked(region_handle *l, int now_anyway);

#endif

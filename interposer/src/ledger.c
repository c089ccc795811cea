/* The ledger: lock-free quota accounting in a shared file, with reclaim of dead processes.
 *
 * Used three times: by the shim (one ledger per container, the quota), by the simulated GPU (one per
 * simulated node, the physical capacity) and, built alone as libmemslice-region.so, by Python.
 *
 * Invariant: for every device d, dev[d].used == sum over live slots s of slot[s].device_bytes[d], at
 * every instant where no slot has op_active > 0. A charge is
 *     op_active++ ; CAS used: x -> x+n (only if x+n <= limit and not frozen) ; device_bytes += n ; op_active--
 * and an uncharge the same with -n. A process that dies with op_active == 0 is reclaimed by subtracting
 * its device_bytes; one that dies inside a charge (op_active > 0) is ambiguous, so the reclaimer instead
 * freezes the totals, waits for live processes to finish their in-flight step, and rebuilds the totals
 * from the live slots (a "recount"). Hot paths never take a lock. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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
static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* One step of a bounded backoff: spin a little, then yield, then sleep up to 1 ms per step, so that a
 * waiter never burns a core while a stopped process holds what it waits for. */
static void backoff(unsigned step) {
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
static uint32_t ndev(const struct ms_region *r) {
    uint32_t n = __atomic_load_n(&r->hdr.ndevices, __ATOMIC_SEQ_CST);
    return n > MS_MAX_DEVICES ? MS_MAX_DEVICES : n;
}

static pthread_mutex_t *region_lock(const ms_ledger *l) { return (pthread_mutex_t *)l->r->hdr.lock; }

/* fcntl byte lock helpers. POSIX record locks belong to the process, are dropped by the kernel when it
 * dies (kill -9 included) and are not inherited by fork: exactly the liveness token a slot needs. */
static int byte_lock(int fd, uint64_t off, int type) {
    struct flock fl = {.l_type = (short)type, .l_whence = SEEK_SET, .l_start = (off_t)off, .l_len = 1};
    int rc;
    do rc = fcntl(fd, F_SETLK, &fl); while (rc < 0 && errno == EINTR);
    return rc;
}

/* Take a byte lock, waiting at most MS_LOCK_WAIT_MS (F_SETLKW would wait forever behind a stopped holder).
 * 0, or -1 with errno (EAGAIN: still held at the deadline). */
static int byte_lock_bounded(int fd, uint64_t off) {
    uint64_t deadline = now_ns() + MS_NS(MS_LOCK_WAIT_MS);
    for (unsigned step = 0;; step++) {
        if (byte_lock(fd, off, F_WRLCK) == 0) return 0;
        if (errno != EAGAIN && errno != EACCES) return -1;
        if (now_ns() > deadline) {
            errno = EAGAIN;
            return -1;
        }
        backoff(step < 64 ? 64 : step);
    }
}

/* PID (in our namespace; 0 if not visible) of a process holding a write lock on [off, off+len), or -1 if
 * nobody does. */
static long lock_holder(int fd, uint64_t off, uint64_t len) {
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = (off_t)off, .l_len = (off_t)len};
    if (fcntl(fd, F_GETLK, &fl) < 0) return 0; /* cannot tell: assume held, never reinitialise wrongly */
    return fl.l_type == F_UNLCK ? -1 : (long)fl.l_pid;
}

int ms_slot_alive(const ms_ledger *l, int i) {
    if (i == l->slot) return 1;
    /* F_GETLK never reports the caller's own locks: a slot another handle of this process holds (the simulated
     * libcuda and libnvidia-ml each open the node's ledger) would look dead. Ours while we live. */
    if (LOAD(&l->r->slot[i].pid) == (int32_t)getpid()) return 1;
    return lock_holder(l->fd, MS_LOCK_BASE + (uint64_t)i, 1) != -1;
}

/* The mutex attributes every region uses: process-shared and robust. */
static void init_mutex(pthread_mutex_t *m) {
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(m, &a);
    pthread_mutexattr_destroy(&a);
}

/* Initialise a freshly created file. Called with the init byte lock held and no process in the file. */
static void init_region(struct ms_region *r, size_t extra_size) {
    /* the file was just sized from 0: all zero (and sparse), so only the header is written */
    r->hdr.version = MS_VERSION;
    r->hdr.header_size = sizeof(struct ms_header);
    r->hdr.device_size = sizeof(struct ms_device);
    r->hdr.slot_size = sizeof(struct ms_slot);
    r->hdr.max_devices = MS_MAX_DEVICES;
    r->hdr.max_slots = MS_MAX_SLOTS;
    r->hdr.created_at = (uint64_t)time(NULL);
    r->hdr.extra_size = extra_size;
    init_mutex((pthread_mutex_t *)r->hdr.lock);
    STORE(&r->hdr.magic, (uint32_t)MS_MAGIC);
}

/* The mutex word must be one this code initialised (a garbage kind could make glibc treat it as another
 * type of mutex). Only the kind is compared: the lock word itself changes as processes use it. */
static int mutex_sane(const struct ms_region *r) {
#ifdef __GLIBC__
    pthread_mutex_t ref;
    init_mutex(&ref);
    const pthread_mutex_t *m = (const pthread_mutex_t *)r->hdr.lock;
    return m->__data.__kind == ref.__data.__kind;
#else
    (void)r;
    return 1;
#endif
}

/* Check everything the header claims against what this code expects; 0, or -1 and one line in err. */
static int validate(const struct ms_region *r, size_t file_size, size_t extra_size, const char *path, char *err,
                    size_t errlen) {
    const struct ms_header *h = &r->hdr;
    const char *bad = NULL;
    if (LOAD(&h->magic) != MS_MAGIC) bad = "bad magic";
    else if (h->version != MS_VERSION) bad = "another layout version";
    else if (h->header_size != sizeof(struct ms_header) || h->device_size != sizeof(struct ms_device) ||
             h->slot_size != sizeof(struct ms_slot) || h->max_devices != MS_MAX_DEVICES ||
             h->max_slots != MS_MAX_SLOTS)
        bad = "record sizes that are not this version's";
    else if (h->extra_size != extra_size || file_size != sizeof(struct ms_region) + extra_size)
        bad = "a size that does not match its header";
    else if (LOAD(&h->ndevices) > MS_MAX_DEVICES) bad = "a device count out of range";
    else if (LOAD(&h->slot_hwm) > MS_MAX_SLOTS) bad = "a slot count out of range";
    else if (!mutex_sane(r)) bad = "a corrupt mutex";
    if (!bad) return 0;
    snprintf(err, errlen, "%s is not a valid version-%d memslice region (%s: magic %#x, version %u, %u devices, "
             "%zu bytes) and processes of the container use it; it was altered, or comes from another "
             "version: once none of them runs, the next process makes it fresh", path, MS_VERSION, bad, LOAD(&h->magic), h->version, LOAD(&h->ndevices), file_size);
    return -1;
}

/* Under the creation lock, a file some process of the container holds a slot in must be used as it is:
 * the right size, initialised (the caller then validates the rest). Re-initialising it would start a
 * second ledger beside theirs and double the quota. 0, or -1 with a message. */
static int open_in_use(int fd, const char *path, size_t size, off_t file_size, long holder, void **map, char *err,
                       size_t errlen) {
    if ((size_t)file_size != size) {
        snprintf(err, errlen, "%s is %lld bytes, not the %zu of a region: it was %s while processes of the "
                 "container use it (pid %ld among them); refusing to start a second ledger beside theirs (once "
                 "none of them runs, the next process makes it fresh)", path, (long long)file_size, size, file_size ? "truncated" : "emptied",
                 holder);
        return -1;
    }
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        snprintf(err, errlen, "cannot map %s: %s", path, strerror(errno));
        return -1;
    }
    *map = m;
    if (LOAD(&((struct ms_region *)m)->hdr.magic) != 0) return 0;
    snprintf(err, errlen, "%s was emptied while processes of the container use it (pid %ld among them); "
             "refusing to start a second ledger beside theirs (once none of them runs, the next process makes it "
             "fresh)", path, holder);
    return -1;
}

/* Under the creation lock: open the region, making it fresh when no process holds a slot in it (one
 * F_GETLK over the slot bytes) and it is not already a valid region: just created (empty), never finished
 * (its creator died half-way), of another layout version (an upgrade), or garbage. With nobody in it,
 * nobody's charges are lost. 0, or -1 with a message. */
static int create_if_new(int fd, const char *path, size_t size, size_t extra_size, ms_init_extra_fn init_extra,
                         void *arg, void **map, char *err, size_t errlen) {
    struct stat st;
    if (fstat(fd, &st) < 0) {
        snprintf(err, errlen, "cannot stat %s: %s", path, strerror(errno));
        return -1;
    }
    long holder = lock_holder(fd, MS_LOCK_BASE, MS_MAX_SLOTS);
    if (holder != -1) return open_in_use(fd, path, size, st.st_size, holder, map, err, errlen);
    char why[8];
    if ((size_t)st.st_size == size) {
        void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m != MAP_FAILED && LOAD(&((struct ms_region *)m)->hdr.magic) != 0 &&
            validate(m, size, extra_size, path, why, sizeof why) == 0) {
            *map = m;
            return 0;
        }
        if (m != MAP_FAILED) munmap(m, size);
    }
    int fresh = st.st_size == 0;
    if ((!fresh && ftruncate(fd, 0) < 0) || ftruncate(fd, (off_t)size) < 0) { /* zero-filled and sparse */
        snprintf(err, errlen, "cannot size %s: %s", path, strerror(errno));
        return -1;
    }
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        snprintf(err, errlen, "cannot map %s: %s", path, strerror(errno));
        return -1;
    }
    *map = m;
    if (init_extra && init_extra((char *)m + sizeof(struct ms_region), arg, err, errlen) != 0) return -1;
    init_region(m, extra_size);
    return 0;
}

/* Open for reading only (the region library's liveness query): no creation, same validation. */
static int open_readonly(ms_ledger *l, const char *path, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size < sizeof(struct ms_region)) {
        snprintf(err, errlen, "%s is not a memslice region (%s)", path,
                 fd < 0 ? strerror(errno) : "not a regular file of the right size");
        if (fd >= 0) close(fd);
        return -1;
    }
    size_t size = (size_t)st.st_size;
    void *m = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        snprintf(err, errlen, "cannot map %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    struct ms_region *r = m;
    if (validate(r, size, r->hdr.extra_size, path, err, errlen) < 0) {
        munmap(m, size);
        close(fd);
        return -1;
    }
    l->r = r;
    l->fd = fd;
    l->map_size = size;
    l->extra = r->hdr.extra_size ? (char *)m + sizeof(struct ms_region) : NULL;
    return 0;
}

/* ---- the truncation guard ------------------------------------------------------------------------------
 * The region file is the tenant's: truncating it under a live process's MAP_SHARED mapping makes that
 * process's next access to the lost pages raise SIGBUS, which killed every CUDA process of the container.
 * A SIGBUS whose address lies in a guarded ledger mapping is handled here instead: the whole mapping is
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
    ms_ledger *owner;
    int state;
};

static struct guard g_guards[MS_GUARDS];
static struct sigaction g_prev_bus;
static int g_bus_installed;

/* The totals of a lost ledger: over any quota, not frozen; no recount may rebuild them from its (empty)
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

/* Guard a ledger's mapping: install the handler once per process, then record the mapping. */
static void guard_mapping(ms_ledger *l) {
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
static void guard_mapping(ms_ledger *l) { (void)l; }
#endif

int ms_ledger_open(ms_ledger *l, const char *path, size_t extra_size, int readonly, ms_init_extra_fn init_extra,
                   void *arg, char *err, size_t errlen) {
    _Static_assert(sizeof(pthread_mutex_t) <= 64, "mutex fits the header");
    memset(l, 0, sizeof *l);
    l->fd = -1;
    l->slot = -1;
    if (readonly) return open_readonly(l, path, err, errlen);
    size_t size = sizeof(struct ms_region) + extra_size;
    /* O_NONBLOCK: a FIFO put in its place must not hang the open; O_NOFOLLOW: nor a symlink redirect it */
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0666);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "cannot open %s: %s", path, fd < 0 ? strerror(errno) : "not a regular file");
        if (fd >= 0) close(fd);
        return -1;
    }
    /* Creation is serialised by a byte lock so that two first processes do not both initialise. */
    if (byte_lock_bounded(fd, MS_INIT_LOCK_BYTE) < 0) {
        long holder = lock_holder(fd, MS_INIT_LOCK_BYTE, 1);
        snprintf(err, errlen, "%s is being opened by pid %ld, which has held its creation lock for %d ms (stopped?)",
                 path, holder, MS_LOCK_WAIT_MS);
        close(fd);
        return -1;
    }
    /* every process of the container, whatever its user, must be able to charge: the creator's umask
     * must not decide that (the file lives in the container's own region directory) */
    if (st.st_uid == geteuid() && (st.st_mode & 0666) != 0666) fchmod(fd, 0666);
    void *m = NULL;
    int rc = create_if_new(fd, path, size, extra_size, init_extra, arg, &m, err, errlen);
    if (rc == 0) rc = validate(m, size, extra_size, path, err, errlen);
    byte_lock(fd, MS_INIT_LOCK_BYTE, F_UNLCK);
    if (rc != 0) {
        if (m) munmap(m, size);
        close(fd);
        return -1;
    }
    l->r = m;
    l->fd = fd;
    l->map_size = size;
    l->extra = extra_size ? (char *)m + sizeof(struct ms_region) : NULL;
    guard_mapping(l);
    return 0;
}

/* Take the slow-path mutex, waiting at most MS_LOCK_WAIT_MS. A previous holder that died leaves the
 * totals possibly frozen or half reclaimed: the caller is told (return 1) and must recount before
 * proceeding. -1 if it could not be taken (a stopped holder, or a mutex word a tenant garbled): the
 * caller skips its slow path, and l->lock_error says why. */
static int lock_region(ms_ledger *l) {
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_nsec += (long)(MS_LOCK_WAIT_MS % 1000) * 1000000L;
    dl.tv_sec += MS_LOCK_WAIT_MS / 1000 + dl.tv_nsec / 1000000000L;
    dl.tv_nsec %= 1000000000L;
    int rc = pthread_mutex_clocklock(region_lock(l), CLOCK_MONOTONIC, &dl);
    if (rc == EOWNERDEAD) {
        pthread_mutex_consistent(region_lock(l));
        return 1;
    }
    if (rc == 0) return 0;
    l->lock_error = rc;
    return -1;
}

static void unlock_region(ms_ledger *l) { pthread_mutex_unlock(region_lock(l)); }

/* The slot high-water mark, clamped (the file is tenant-writable). */
static int slot_hwm(const struct ms_region *r) {
    uint32_t h = __atomic_load_n(&r->hdr.slot_hwm, __ATOMIC_SEQ_CST);
    return h > MS_MAX_SLOTS ? MS_MAX_SLOTS : (int)h;
}

/* Give a slot back: its counts first, its state last (claimers look at the state). */
static void free_slot(struct ms_slot *s) {
    memset(s->device_bytes, 0, sizeof s->device_bytes);
    memset(s->host_bytes, 0, sizeof s->host_bytes);
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
static void unfreeze_all(struct ms_region *r) {
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
static int recount_locked(ms_ledger *l, int now_anyway) {
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
        if (!ms_slot_alive(l, i)) dead[i] = 1;
        else if (wait_quiet(s, deadline) < 0) { /* a live process between CAS and its slot update */
            unfreeze_all(r);
            STORE(&r->hdr.recount_retry_ns, now_ns() + MS_NS(MS_RECOUNT_WAIT_MS));
            return -1;
        }
    }
    uint64_t used[MS_MAX_DEVICES] = {0}, host[MS_MAX_DEVICES] = {0};
    for (int i = 0; i < hwm; i++) {
        struct ms_slot *s = &r->slot[i];
        if (dead[i] || LOAD(&s->state) != MS_SLOT_LIVE) continue;
        for (uint32_t d = 0; d < nd; d++) {
            used[d] += LOAD(&s->device_bytes[d]);
            host[d] += LOAD(&s->host_bytes[d]);
        }
    }
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
            if (ph[d]) STORE(&s->host_bytes[d], 0);
        }
        if (all) {
            free_slot(s);
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
        uint64_t b = ms_bytes(cur), nb = b > n ? b - n : 0;
        if (CAS(word, &cur, (cur & MS_FROZEN) | nb)) return;
    }
}

/* Reclaim dead slots under the mutex: exactly (subtract their bytes) when none died inside a charge, else
 * by a recount. Returns how many were reclaimed. */
static int sweep_locked(ms_ledger *l, int needs_recount, int now_anyway) {
    struct ms_region *r = l->r;
    int n = 0, ambiguous = needs_recount, hwm = slot_hwm(r);
    for (int i = 0; i < hwm && !ambiguous; i++) {
        struct ms_slot *s = &r->slot[i];
        if (LOAD(&s->state) == MS_SLOT_LIVE && !ms_slot_alive(l, i) && LOAD(&s->op_active) != 0) ambiguous = 1;
    }
    if (ambiguous && recount_locked(l, now_anyway) == 0) return 1;
    uint32_t nd = ndev(r);
    for (int i = 0; i < hwm; i++) {
        struct ms_slot *s = &r->slot[i];
        if (LOAD(&s->state) != MS_SLOT_LIVE || ms_slot_alive(l, i)) continue;
        if (LOAD(&s->op_active) != 0) continue; /* died mid-charge and recount timed out: next sweep */
        for (uint32_t d = 0; d < nd; d++) {
            sub_total(&r->dev[d].used, LOAD(&s->device_bytes[d]));
            sub_total(&r->dev[d].host_used, LOAD(&s->host_bytes[d]));
        }
        free_slot(s);
        ADD(&r->hdr.reclaimed, 1);
        n++;
    }
    return n;
}

/* A sweep with the mutex taken within its bound (-1 without it), stamping the time for the periodic one. */
static int sweep(ms_ledger *l, int now_anyway) {
    int dirty = lock_region(l);
    if (dirty < 0) return -1;
    int n = sweep_locked(l, dirty, now_anyway);
    STORE(&l->r->hdr.swept_ns, now_ns());
    unlock_region(l);
    return n;
}

int ms_sweep(ms_ledger *l) { return sweep(l, 0); }
int ms_sweep_now(ms_ledger *l) { return sweep(l, 1); }

/* The periodic sweep: the first caller after MS_SWEEP_PERIOD_MS wins the turn with a CAS on swept_ns. */
void ms_sweep_if_due(ms_ledger *l) {
    uint64_t now = now_ns(), last = LOAD(&l->r->hdr.swept_ns);
    if (now - last < MS_NS(MS_SWEEP_PERIOD_MS) && last <= now) return;
    if (!CAS(&l->r->hdr.swept_ns, &last, now)) return; /* another process (or thread) took this turn */
    int rc = pthread_mutex_trylock(region_lock(l));   /* never wait here: the caller is allocating */
    if (rc == EOWNERDEAD) pthread_mutex_consistent(region_lock(l));
    else if (rc != 0) return;
    sweep_locked(l, rc == EOWNERDEAD, 0);
    unlock_region(l);
}

/* This process's pid in the initial PID namespace, the one the driver (and NVML) reports, or 0 when it
 * cannot be known from inside: it is getpid() in the initial namespace (inode 0xEFFFFFFC, fixed by the
 * kernel), else the first NSpid entry when this process's /proc shows more than one level (the /proc of an
 * outer namespace). A container with its own /proc shows one level only: then 0. */
static int32_t outer_pid(void) {
    char ns[64], buf[2048];
    ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
    if (n > 0) {
        ns[n] = 0;
        if (strcmp(ns, "pid:[4026531836]") == 0) return (int32_t)getpid();
    }
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    const char *line = strstr(buf, "\nNSpid:");
    if (!line) return 0;
    char *end;
    long first = strtol(line + 7, &end, 10);
    while (*end == ' ' || *end == '\t') end++;
    return (first > 0 && first <= INT32_MAX && *end >= '0' && *end <= '9') ? (int32_t)first : 0;
}

int32_t ms_host_pid(void) { return outer_pid(); }

static void fill_identity(struct ms_slot *s) {
    s->pid = (int32_t)getpid();
    s->host_pid = outer_pid();
    s->started_at = (uint64_t)time(NULL);
    memset(s->comm, 0, sizeof s->comm);
    FILE *f = fopen("/proc/self/comm", "re");
    if (f) {
        if (fgets(s->comm, sizeof s->comm, f)) s->comm[strcspn(s->comm, "\n")] = 0;
        fclose(f);
    }
}

/* Try to take slot i: its byte lock first (so two processes can never both own it), then its state. */
static int try_claim(ms_ledger *l, int i) {
    struct ms_slot *s = &l->r->slot[i];
    if (LOAD(&s->state) != MS_SLOT_FREE) return 0;
    if (byte_lock(l->fd, MS_LOCK_BASE + (uint64_t)i, F_WRLCK) < 0) return 0;
    uint32_t expect = MS_SLOT_FREE;
    if (!CAS(&s->state, &expect, (uint32_t)MS_SLOT_LIVE)) {
        byte_lock(l->fd, MS_LOCK_BASE + (uint64_t)i, F_UNLCK);
        return 0;
    }
    fill_identity(s);
    ADD(&s->generation, 1);
    uint32_t h = LOAD(&l->r->hdr.slot_hwm);
    while ((uint32_t)i + 1 > h && !CAS(&l->r->hdr.slot_hwm, &h, (uint32_t)i + 1)) {}
    l->slot = i;
    return 1;
}

int ms_ledger_claim(ms_ledger *l) {
    if (l->slot >= 0) return 0;
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < MS_MAX_SLOTS; i++)
            if (try_claim(l, i)) return 0;
        if (ms_sweep(l) <= 0) break; /* nothing reclaimed: the table is really full */
    }
    return -1;
}

void ms_ledger_forget_slot(ms_ledger *l) { l->slot = -1; }

void ms_ledger_release(ms_ledger *l) {
    if (!l->r || l->slot < 0) return;
    struct ms_slot *s = &l->r->slot[l->slot];
    uint32_t nd = ndev(l->r);
    for (uint32_t d = 0; d < nd; d++) {
        uint64_t b = LOAD(&s->device_bytes[d]), h = LOAD(&s->host_bytes[d]);
        if (b) ms_uncharge(l, (int)d, b, 0);
        if (h) ms_uncharge(l, (int)d, h, 1);
    }
    int i = l->slot;
    free_slot(s);
    l->slot = -1;
    byte_lock(l->fd, MS_LOCK_BASE + (uint64_t)i, F_UNLCK);
}

/* Appends to the device table take their own byte lock, not the region mutex: the mutex is held for
 * whole sweeps (a recount may wait MS_RECOUNT_WAIT_MS), and a process stopped in one must not keep the
 * container's other processes from registering a GPU. This lock is held for a few instructions, and the
 * kernel drops it if its holder dies (a half-written entry past ndevices is simply written again). */
int ms_ledger_device(ms_ledger *l, const char *uuid, uint64_t physical_total) {
    struct ms_region *r = l->r;
    uint32_t nd = ndev(r);
    for (uint32_t d = 0; d < nd; d++)
        if (strncmp(r->dev[d].uuid, uuid, MS_UUID_LEN) == 0) return (int)d;
    if (byte_lock_bounded(l->fd, MS_DEVICE_LOCK_BYTE) < 0) {
        l->lock_error = errno == EAGAIN ? ETIMEDOUT : errno;
        return -2;
    }
    int found = -1;
    nd = ndev(r);
    for (uint32_t d = 0; d < nd && found < 0; d++)
        if (strncmp(r->dev[d].uuid, uuid, MS_UUID_LEN) == 0) found = (int)d;
    if (found < 0 && nd < MS_MAX_DEVICES) {
        struct ms_device *dv = &r->dev[nd];
        snprintf(dv->uuid, sizeof dv->uuid, "%s", uuid);
        dv->physical_total = physical_total;
        STORE(&r->hdr.ndevices, nd + 1); /* published after the entry is complete */
        found = (int)nd;
    }
    byte_lock(l->fd, MS_DEVICE_LOCK_BYTE, F_UNLCK);
    return found;
}

/* A recount has frozen this total: wait for it with a bounded backoff; finish it ourselves if its owner
 * died (the robust mutex says so); abandon it (unfreeze_all) once past `deadline`, since its owner is
 * stalled (stopped) or too slow. Returns with the word unfrozen at the time of the last load. */
static void wait_unfrozen(ms_ledger *l, uint64_t *word, uint64_t deadline) {
    for (unsigned step = 0; LOAD(word) & MS_FROZEN; step++) {
        backoff(step);
        if (step < 64 || (step & 7) != 0) continue;
        int rc = pthread_mutex_trylock(region_lock(l));
        if (rc == EOWNERDEAD) {
            pthread_mutex_consistent(region_lock(l));
            recount_locked(l, 1);
            unlock_region(l);
        } else if (rc == 0) {
            if (LOAD(word) & MS_FROZEN) unfreeze_all(l->r); /* frozen with no recount running: a leftover */
            unlock_region(l);
        } else if (now_ns() > deadline && (LOAD(word) & MS_FROZEN)) {
            unfreeze_all(l->r);
            ADD(&l->r->hdr.recount_aborts, 1);
        }
    }
}

/* begin_op's slow path: the total is frozen; step aside (op_active lowered) until the recount is done or
 * abandoned at *deadline (set at the first wait of this operation, so that all its waits share one).
 * Kept out of line so that the hot path stays a few instructions. */
static __attribute__((noinline)) uint64_t begin_op_frozen(ms_ledger *l, struct ms_slot *s, uint64_t *word,
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
static inline __attribute__((always_inline)) uint64_t begin_op(ms_ledger *l, struct ms_slot *s, uint64_t *word,
                                                               uint64_t *deadline) {
    ADD(&s->op_active, 1u);
    uint64_t cur = LOAD(word);
    if (__builtin_expect(!(cur & MS_FROZEN), 1)) return cur;
    return begin_op_frozen(l, s, word, deadline);
}

int ms_charge(ms_ledger *l, int dev, uint64_t n, uint64_t limit, int host) {
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

void ms_uncharge(ms_ledger *l, int dev, uint64_t n, int host) {
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

void ms_note_refused(ms_ledger *l, int dev, int host) {
    ADD(host ? &l->r->dev[dev].spill_refused : &l->r->dev[dev].refused, 1);
    if (l->slot >= 0) ADD(&l->r->slot[l->slot].refused, 1);
}

#ifdef MS_REGION_ONLY
/* ---- libmemslice-region.so: what Python needs beyond reading the mapped struct ------------------ */
#define EXPORT __attribute__((visibility("default")))

/* Reclaim dead processes' usage in the region file at `path`. Returns the count, or -1. */
EXPORT int memslice_region_sweep(const char *path, char *err, size_t errlen) {
    ms_ledger l;
    if (ms_ledger_open(&l, path, 0, 0, NULL, NULL, err, errlen) < 0) {
        /* the simulator's file carries extra state: reopen with its recorded size */
        ms_ledger ro;
        if (ms_ledger_open(&ro, path, 0, 1, NULL, NULL, err, errlen) < 0) return -1;
        size_t extra = ro.r->hdr.extra_size;
        munmap(ro.r, ro.map_size);
        close(ro.fd);
        if (ms_ledger_open(&l, path, extra, 0, NULL, NULL, err, errlen) < 0) return -1;
    }
    int n = ms_sweep_now(&l);
    munmap(l.r, l.map_size);
    close(l.fd);
    return n;
}

/* Fill alive[i] (i < n) with 1 when slot i is held by a live process. Returns 0, or -1. */
EXPORT int memslice_region_liveness(const char *path, unsigned char *alive, int n, char *err, size_t errlen) {
    ms_ledger l;
    if (ms_ledger_open(&l, path, 0, 1, NULL, NULL, err, errlen) < 0) return -1;
    for (int i = 0; i < n && i < MS_MAX_SLOTS; i++)
        alive[i] = LOAD(&l.r->slot[i].state) == MS_SLOT_LIVE && ms_slot_alive(&l, i);
    munmap(l.r, l.map_size);
    close(l.fd);
    return 0;
}
#endif

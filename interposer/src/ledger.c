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

static const uint64_t RECOUNT_WAIT_NS = 200ull * 1000 * 1000;

/* Monotonic nanoseconds, for the bounded waits. */
static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static pthread_mutex_t *region_lock(const ms_ledger *l) { return (pthread_mutex_t *)l->r->hdr.lock; }

/* fcntl byte lock helpers. POSIX record locks belong to the process, are dropped by the kernel when it
 * dies (kill -9 included) and are not inherited by fork: exactly the liveness token a slot needs. */
static int byte_lock(int fd, uint64_t off, int type, int wait) {
    struct flock fl = {.l_type = (short)type, .l_whence = SEEK_SET, .l_start = (off_t)off, .l_len = 1};
    int rc;
    do rc = fcntl(fd, wait ? F_SETLKW : F_SETLK, &fl); while (rc < 0 && errno == EINTR);
    return rc;
}

int ms_slot_alive(const ms_ledger *l, int i) {
    if (i == l->slot) return 1;
    /* F_GETLK never reports the caller's own locks: a slot another handle of this process holds (the simulated
     * libcuda and libnvidia-ml each open the node's ledger) would look dead. Ours while we live. */
    if (LOAD(&l->r->slot[i].pid) == (int32_t)getpid()) return 1;
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = (off_t)(MS_LOCK_BASE + (uint64_t)i),
                       .l_len = 1};
    if (fcntl(l->fd, F_GETLK, &fl) < 0) return 1; /* cannot tell: assume alive, never reclaim wrongly */
    return fl.l_type != F_UNLCK;
}

/* Initialise a freshly created file. Called with the init byte lock held. */
static void init_region(struct ms_region *r, size_t extra_size) {
    memset(&r->hdr, 0, sizeof r->hdr);
    r->hdr.version = MS_VERSION;
    r->hdr.header_size = sizeof(struct ms_header);
    r->hdr.device_size = sizeof(struct ms_device);
    r->hdr.slot_size = sizeof(struct ms_slot);
    r->hdr.max_devices = MS_MAX_DEVICES;
    r->hdr.max_slots = MS_MAX_SLOTS;
    r->hdr.created_at = (uint64_t)time(NULL);
    r->hdr.extra_size = extra_size;
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init((pthread_mutex_t *)r->hdr.lock, &a);
    pthread_mutexattr_destroy(&a);
    STORE(&r->hdr.magic, (uint32_t)MS_MAGIC);
}

int ms_ledger_open(ms_ledger *l, const char *path, size_t extra_size, int readonly, ms_init_extra_fn init_extra,
                   void *arg, char *err, size_t errlen) {
    _Static_assert(sizeof(pthread_mutex_t) <= 64, "mutex fits the header");
    memset(l, 0, sizeof *l);
    l->fd = -1;
    l->slot = -1;
    size_t size = sizeof(struct ms_region) + extra_size;
    int fd = open(path, (readonly ? O_RDONLY : O_RDWR | O_CREAT) | O_CLOEXEC, 0666);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    if (!readonly) {
        /* Creation is serialised by a byte lock so that two first processes do not both initialise. */
        if (byte_lock(fd, MS_INIT_LOCK_BYTE, F_WRLCK, 1) < 0) {
            snprintf(err, errlen, "cannot lock %s: %s", path, strerror(errno));
            close(fd);
            return -1;
        }
        struct stat st;
        /* every process of the container, whatever its user, must be able to charge: the creator's umask
         * must not decide that (the file lives in the container's own region directory) */
        if (fstat(fd, &st) == 0 && st.st_uid == geteuid() && (st.st_mode & 0666) != 0666) fchmod(fd, 0666);
        if (fstat(fd, &st) == 0 && (size_t)st.st_size < size && ftruncate(fd, (off_t)size) < 0) {
            snprintf(err, errlen, "cannot size %s: %s", path, strerror(errno));
            close(fd);
            return -1;
        }
    } else {
        struct stat st;
        if (fstat(fd, &st) < 0 || (size_t)st.st_size < sizeof(struct ms_region)) {
            snprintf(err, errlen, "%s is not a memslice region (too small)", path);
            close(fd);
            return -1;
        }
        size = (size_t)st.st_size;
    }
    void *m = mmap(NULL, size, readonly ? PROT_READ : PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        snprintf(err, errlen, "cannot map %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    struct ms_region *r = m;
    if (!readonly) {
        int rc = 0;
        if (LOAD(&r->hdr.magic) == 0) {
            if (init_extra) rc = init_extra((char *)m + sizeof(struct ms_region), arg, err, errlen);
            if (rc == 0) init_region(r, extra_size);
        }
        byte_lock(fd, MS_INIT_LOCK_BYTE, F_UNLCK, 0);
        if (rc != 0) {
            munmap(m, size);
            close(fd);
            return -1;
        }
    }
    if (LOAD(&r->hdr.magic) != MS_MAGIC || r->hdr.version != MS_VERSION ||
        r->hdr.slot_size != sizeof(struct ms_slot) || r->hdr.extra_size != (readonly ? r->hdr.extra_size : extra_size)) {
        snprintf(err, errlen, "%s has an incompatible layout (version %u); remove it or use another directory",
                 path, r->hdr.version);
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

/* Take the slow-path mutex. A previous holder that died leaves the totals possibly frozen or half
 * reclaimed: the caller is told (return 1) and must recount before proceeding. */
static int lock_region(ms_ledger *l) {
    int rc = pthread_mutex_lock(region_lock(l));
    if (rc == EOWNERDEAD) {
        pthread_mutex_consistent(region_lock(l));
        return 1;
    }
    return 0;
}

static void unlock_region(ms_ledger *l) { pthread_mutex_unlock(region_lock(l)); }

static int slot_hwm(const struct ms_region *r) {
    uint32_t h = __atomic_load_n(&r->hdr.slot_hwm, __ATOMIC_SEQ_CST);
    return h > MS_MAX_SLOTS ? MS_MAX_SLOTS : (int)h;
}

static void free_slot(struct ms_slot *s) {
    memset(s->device_bytes, 0, sizeof s->device_bytes);
    memset(s->host_bytes, 0, sizeof s->host_bytes);
    STORE(&s->op_active, 0u);
    s->pid = 0;
    s->refused = 0;
    s->peak = 0;
    STORE(&s->state, (uint32_t)MS_SLOT_FREE);
}

/* Rebuild every total from the live slots, dropping dead ones. Caller holds the region lock.
 * Returns 0, or -1 if a live process stayed inside a charge for too long (then nothing changed). */
static int recount_locked(ms_ledger *l) {
    struct ms_region *r = l->r;
    uint32_t nd = LOAD(&r->hdr.ndevices);
    for (uint32_t d = 0; d < nd; d++) {
        __atomic_fetch_or(&r->dev[d].used, MS_FROZEN, __ATOMIC_SEQ_CST);
        __atomic_fetch_or(&r->dev[d].host_used, MS_FROZEN, __ATOMIC_SEQ_CST);
    }
    uint64_t deadline = now_ns() + RECOUNT_WAIT_NS;
    static __thread unsigned char dead[MS_MAX_SLOTS];
    int hwm = slot_hwm(r);
    for (int i = 0; i < hwm; i++) {
        struct ms_slot *s = &r->slot[i];
        dead[i] = 0;
        if (LOAD(&s->state) != MS_SLOT_LIVE) continue;
        if (!ms_slot_alive(l, i)) {
            dead[i] = 1;
            continue;
        }
        while (LOAD(&s->op_active) != 0) { /* a live process between CAS and its slot update */
            if (now_ns() > deadline) {
                for (uint32_t d = 0; d < nd; d++) {
                    __atomic_fetch_and(&r->dev[d].used, ~MS_FROZEN, __ATOMIC_SEQ_CST);
                    __atomic_fetch_and(&r->dev[d].host_used, ~MS_FROZEN, __ATOMIC_SEQ_CST);
                }
                return -1;
            }
            sched_yield();
        }
    }
    uint64_t used[MS_MAX_DEVICES] = {0}, host[MS_MAX_DEVICES] = {0};
    for (int i = 0; i < hwm; i++) {
        struct ms_slot *s = &r->slot[i];
        if (dead[i]) {
            free_slot(s);
            ADD(&r->hdr.reclaimed, 1);
            continue;
        }
        if (LOAD(&s->state) != MS_SLOT_LIVE) continue;
        for (uint32_t d = 0; d < nd; d++) {
            used[d] += LOAD(&s->device_bytes[d]);
            host[d] += LOAD(&s->host_bytes[d]);
        }
    }
    for (uint32_t d = 0; d < nd; d++) { /* storing the new totals also clears the frozen bit */
        STORE(&r->dev[d].used, used[d]);
        STORE(&r->dev[d].host_used, host[d]);
    }
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

static int sweep_locked(ms_ledger *l, int needs_recount) {
    struct ms_region *r = l->r;
    int n = 0, ambiguous = needs_recount, hwm = slot_hwm(r);
    for (int i = 0; i < hwm && !ambiguous; i++) {
        struct ms_slot *s = &r->slot[i];
        if (LOAD(&s->state) == MS_SLOT_LIVE && !ms_slot_alive(l, i) && LOAD(&s->op_active) != 0) ambiguous = 1;
    }
    if (ambiguous && recount_locked(l) == 0) return 1;
    uint32_t nd = LOAD(&r->hdr.ndevices);
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

int ms_sweep(ms_ledger *l) {
    int dirty = lock_region(l);
    int n = sweep_locked(l, dirty);
    unlock_region(l);
    return n;
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
    if (byte_lock(l->fd, MS_LOCK_BASE + (uint64_t)i, F_WRLCK, 0) < 0) return 0;
    uint32_t expect = MS_SLOT_FREE;
    if (!CAS(&s->state, &expect, (uint32_t)MS_SLOT_LIVE)) {
        byte_lock(l->fd, MS_LOCK_BASE + (uint64_t)i, F_UNLCK, 0);
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
    uint32_t nd = LOAD(&l->r->hdr.ndevices);
    for (uint32_t d = 0; d < nd; d++) {
        uint64_t b = LOAD(&s->device_bytes[d]), h = LOAD(&s->host_bytes[d]);
        if (b) ms_uncharge(l, (int)d, b, 0);
        if (h) ms_uncharge(l, (int)d, h, 1);
    }
    int i = l->slot;
    free_slot(s);
    l->slot = -1;
    byte_lock(l->fd, MS_LOCK_BASE + (uint64_t)i, F_UNLCK, 0);
}

int ms_ledger_device(ms_ledger *l, const char *uuid, uint64_t physical_total) {
    struct ms_region *r = l->r;
    uint32_t nd = LOAD(&r->hdr.ndevices);
    for (uint32_t d = 0; d < nd; d++)
        if (strncmp(r->dev[d].uuid, uuid, MS_UUID_LEN) == 0) return (int)d;
    int dirty = lock_region(l);
    if (dirty) sweep_locked(l, 1);
    int found = -1;
    nd = LOAD(&r->hdr.ndevices);
    for (uint32_t d = 0; d < nd && found < 0; d++)
        if (strncmp(r->dev[d].uuid, uuid, MS_UUID_LEN) == 0) found = (int)d;
    if (found < 0 && nd < MS_MAX_DEVICES) {
        struct ms_device *dv = &r->dev[nd];
        snprintf(dv->uuid, sizeof dv->uuid, "%s", uuid);
        dv->physical_total = physical_total;
        STORE(&r->hdr.ndevices, nd + 1); /* published after the entry is complete */
        found = (int)nd;
    }
    unlock_region(l);
    return found;
}

/* A recount is in progress: wait for it, and finish it ourselves if its owner died. */
static void wait_unfrozen(ms_ledger *l, uint64_t *word) {
    for (unsigned spins = 1; LOAD(word) & MS_FROZEN; spins++) {
        if (spins < 64) cpu_relax();
        else sched_yield();
        if ((spins & 1023) == 0) {
            int rc = pthread_mutex_trylock(region_lock(l));
            if (rc == EOWNERDEAD) {
                pthread_mutex_consistent(region_lock(l));
                recount_locked(l);
                unlock_region(l);
            } else if (rc == 0) {
                if (LOAD(word) & MS_FROZEN) recount_locked(l);
                unlock_region(l);
            }
        }
    }
}

/* Load a total for an update by this process: op_active is raised first (the reclaimer's Dekker pair),
 * and while a recount holds the total frozen we step aside (op_active lowered) until it is done. */
static uint64_t begin_op(ms_ledger *l, struct ms_slot *s, uint64_t *word) {
    ADD(&s->op_active, 1u);
    uint64_t cur = LOAD(word);
    while (cur & MS_FROZEN) {
        SUB(&s->op_active, 1u);
        wait_unfrozen(l, word);
        ADD(&s->op_active, 1u);
        cur = LOAD(word);
    }
    return cur;
}

int ms_charge(ms_ledger *l, int dev, uint64_t n, uint64_t limit, int host) {
    struct ms_slot *s = &l->r->slot[l->slot];
    struct ms_device *dv = &l->r->dev[dev];
    uint64_t *word = host ? &dv->host_used : &dv->used;
    uint64_t cur = begin_op(l, s, word), next;
    for (;;) {
        if (n > limit || cur > limit - n) { /* a frozen value can never pass this test: bit 63 is huge */
            SUB(&s->op_active, 1u);
            if (cur & MS_FROZEN) return ms_charge(l, dev, n, limit, host);
            return -1;
        }
        next = cur + n;
        if (CAS(word, &cur, next)) break;
    }
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
    uint64_t cur = begin_op(l, s, word);
    for (;;) {
        if (cur & MS_FROZEN) { /* frozen between our load and our CAS: start over */
            SUB(&s->op_active, 1u);
            cur = begin_op(l, s, word);
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
    int n = ms_sweep(&l);
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

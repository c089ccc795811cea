/* The region: lock-free quota accounting in a shared file, with reclaim of dead processes.
 *
 * Used three times: by the shim (one region per container, the quota), by the simulated GPU (one per
 * simulated node, the physical capacity) and, built alone as libmemslice-region.so, by Python.
 *
 * Invariant: for every device d, dev[d].used == sum over live slots s of slot[s].device_bytes[d], at
 * every instant where no slot has op_active > 0. A charge is
 *     op_active++ ; CAS used: x -> x+n (only if x+n <= limit and not frozen) ; device_bytes += n ; op_active--
 * and an uncharge the same with -n. A process that dies with op_active == 0 is reclaimed by subtracting
 * its device_bytes; one that dies inside a charge (op_active > 0) is ambiguous, so the reclaimer instead
 * freezes the totals, waits for live processes to finish their in-flight step, and rebuilds the totals
 * from the live slots (a "recount"). Hot paths never take a lock.
 *
 * The parts: region.c opens, creates and validates a region file (and holds the byte locks); region_guard.c
 * survives the file's truncation under a live mapping; region_slots.c is the process table (claiming,
 * releasing, identity, liveness; the device table; libmemslice-region.so's exports); region_charge.c the
 * hot path (charge, uncharge); region_sweep.c reclaims dead processes (sweeps and recounts). region_int.h
 * holds what they share. The shim charges only through its door, quota.c. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "region_int.h"


/* fcntl byte lock helpers. POSIX record locks belong to the process, are dropped by the kernel when it
 * dies (kill -9 included) and are not inherited by fork: exactly the liveness token a slot needs. */
int region_byte_lock(int fd, uint64_t off, int type) {
    struct flock fl = {.l_type = (short)type, .l_whence = SEEK_SET, .l_start = (off_t)off, .l_len = 1};
    int rc;
    do rc = fcntl(fd, F_SETLK, &fl); while (rc < 0 && errno == EINTR);
    return rc;
}

/* Take a byte lock, waiting at most MS_LOCK_WAIT_MS (F_SETLKW would wait forever behind a stopped holder).
 * 0, or -1 with errno (EAGAIN: still held at the deadline). */
int region_byte_lock_bounded(int fd, uint64_t off) {
    uint64_t deadline = now_ns() + MS_NS(MS_LOCK_WAIT_MS);
    for (unsigned step = 0;; step++) {
        if (region_byte_lock(fd, off, F_WRLCK) == 0) return 0;
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
long region_lock_holder(int fd, uint64_t off, uint64_t len) {
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = (off_t)off, .l_len = (off_t)len};
    if (fcntl(fd, F_GETLK, &fl) < 0) return 0; /* cannot tell: assume held, never reinitialise wrongly */
    return fl.l_type == F_UNLCK ? -1 : (long)fl.l_pid;
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
 * second region beside theirs and double the quota. 0, or -1 with a message. */
static int open_in_use(int fd, const char *path, size_t size, off_t file_size, long holder, void **map, char *err,
                       size_t errlen) {
    if ((size_t)file_size != size) {
        snprintf(err, errlen, "%s is %lld bytes, not the %zu of a region: it was %s while processes of the "
                 "container use it (pid %ld among them); refusing to start a second region beside theirs (once "
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
             "refusing to start a second region beside theirs (once none of them runs, the next process makes it "
             "fresh)", path, holder);
    return -1;
}

/* Under the creation lock: open the region, making it fresh when no process holds a slot in it (one
 * F_GETLK over the slot bytes) and it is not already a valid region: just created (empty), never finished
 * (its creator died half-way), of another layout version (an upgrade), or garbage. With nobody in it,
 * nobody's charges are lost. 0, or -1 with a message. */
static int create_if_new(int fd, const char *path, size_t size, size_t extra_size, region_init_extra_fn init_extra,
                         void *arg, void **map, char *err, size_t errlen) {
    struct stat st;
    if (fstat(fd, &st) < 0) {
        snprintf(err, errlen, "cannot stat %s: %s", path, strerror(errno));
        return -1;
    }
    long holder = region_lock_holder(fd, MS_LOCK_BASE, MS_MAX_SLOTS);
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
static int open_readonly(region_handle *l, const char *path, char *err, size_t errlen) {
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

/* Open (creating or making fresh when nobody is in it) the region file at path, validated, mapped and guarded;
 * readonly: only map an existing one. 0, or -1 with one line in err. */
int region_open(region_handle *l, const char *path, size_t extra_size, int readonly, region_init_extra_fn init_extra,
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
    if (region_byte_lock_bounded(fd, MS_INIT_LOCK_BYTE) < 0) {
        long holder = region_lock_holder(fd, MS_INIT_LOCK_BYTE, 1);
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
    region_byte_lock(fd, MS_INIT_LOCK_BYTE, F_UNLCK);
    if (rc != 0) {
        if (m) munmap(m, size);
        close(fd);
        return -1;
    }
    l->r = m;
    l->fd = fd;
    l->map_size = size;
    l->extra = extra_size ? (char *)m + sizeof(struct ms_region) : NULL;
    region_guard_mapping(l);
    return 0;
}

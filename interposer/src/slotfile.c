/* Per-slot files (layout and trust rules in slotfile.h): plain file I/O and POSIX locks, so a tenant that
 * truncates or fills its own file, or read-locks another's, can neither crash nor block a reader. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "slotfile.h"

/* The retry clock for missing peer files. */
static uint64_t sf_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A slot file's path; 0, or -1 if it does not fit. */
static int slot_path(const struct sf_dir *d, int i, char *out, size_t cap) {
    return snprintf(out, cap, "%s/%02d.slot", d->path, i) < (int)cap ? 0 : -1;
}

/* Open a file without following a link or blocking on a FIFO; only a regular file is kept. */
static int open_regular(const char *path, int flags) {
    int fd = open(path, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY, 0666);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* Take the write lock on the liveness byte: 0 taken, -1 held by another process (or read-locked). Never waits.
 * Classic POSIX, not OFD: F_GETLK names its holder. It is dropped if this process closes any descriptor of the
 * same file, which only sf_close does. */
static int take_live(int fd) {
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = SF_LIVE_OFF, .l_len = 1};
    return fcntl(fd, F_SETLK, &fl) == 0 ? 0 : -1;
}

/* Claim file i: open it read-write (created if `create`), take its lock, zero it. 0 held, 1 open without the
 * lock, -1 not openable. */
static int claim(struct sf_dir *d, int i, int create, size_t size) {
    char p[440];
    if (slot_path(d, i, p, sizeof p) < 0) return -1;
    int fd = open_regular(p, O_RDWR | (create ? O_CREAT : 0));
    if (fd < 0) return -1;
    if (take_live(fd) < 0) {
        d->own_fd = fd;
        d->own = i;
        return 1;
    }
    char zero[2048] = {0};
    for (size_t off = 0; off < size; off += sizeof zero)
        if (pwrite(fd, zero, size - off < sizeof zero ? size - off : sizeof zero, (off_t)off) < 0) break;
    d->own_fd = fd;
    d->own = i;
    d->held = 1;
    return 0;
}

/* Every slot but the assigned one is a peer; see slotfile.h for the return codes. */
int sf_open(struct sf_dir *d, const char *dir, int want, int create, size_t size, char *err, unsigned errlen) {
    memset(d, 0, sizeof *d);
    d->own_fd = d->own = -1;
    for (int i = 0; i < SF_SLOTS; i++) d->peer[i] = -1;
    d->open = 1;
    struct stat st;
    if (snprintf(d->path, sizeof d->path, "%s", dir) >= (int)sizeof d->path) {
        snprintf(err, errlen, "the slot directory %.200s... is too long", dir);
        return -1;
    }
    if (create && mkdir(dir, 0777) < 0 && errno != EEXIST) { /* then lstat says why */ }
    if (lstat(dir, &st) < 0 || !S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "the slot directory %.300s is not a directory (%s)", dir,
                 errno ? strerror(errno) : "another kind of file");
        return -1;
    }
    if (want >= SF_SLOTS) want = -1;
    if (want >= 0) {
        int rc = claim(d, want, create, size);
        return rc == 0 ? 0 : rc == 1 ? 1 : 2;
    }
    for (int i = 0; i < SF_SLOTS; i++) {
        int rc = claim(d, i, create, size);
        if (rc == 0) return 0;
        if (rc == 1) {
            close(d->own_fd);
            d->own_fd = d->own = -1;
        }
    }
    return 2;
}

/* A forked child's copy: every descriptor closed (POSIX locks are not inherited; the parent's stay). */
void sf_close(struct sf_dir *d) {
    if (!d->open) return;
    if (d->own_fd >= 0) close(d->own_fd);
    for (int i = 0; i < SF_SLOTS; i++)
        if (d->peer[i] >= 0) close(d->peer[i]);
    d->own_fd = d->own = -1;
    d->held = d->open = 0;
}

/* A new slot file (a process without an agent created it) is seen within 20 ms, not at the next once-a-second
 * retry: the directory's mtime changes when a file is created in it; one stat per 20 ms at most. */
static void refresh_dir(struct sf_dir *d, uint64_t now) {
    if (now - __atomic_load_n(&d->dir_seen_ns, __ATOMIC_RELAXED) < 20000000ull) return;
    __atomic_store_n(&d->dir_seen_ns, now, __ATOMIC_RELAXED);
    struct stat st;
    if (stat(d->path, &st) < 0) return;
    int64_t m = (int64_t)st.st_mtim.tv_sec * 1000000000ll + st.st_mtim.tv_nsec;
    if (m == __atomic_exchange_n(&d->dir_mtime_ns, m, __ATOMIC_RELAXED)) return;
    for (int i = 0; i < SF_SLOTS; i++) __atomic_store_n(&d->retry_ns[i], 0, __ATOMIC_RELAXED);
}

/* The descriptor of slot i's file: the own one, or a peer's opened read-only once (threads race with a CAS;
 * the loser closes its copy, which holds no lock). A missing file is looked for again at most once a second. */
static int fd_of(struct sf_dir *d, int i) {
    if (!d->open || i < 0 || i >= SF_SLOTS) return -1;
    if (i == d->own) return d->own_fd;
    int fd = __atomic_load_n(&d->peer[i], __ATOMIC_ACQUIRE);
    if (fd >= 0) return fd;
    uint64_t now = sf_now();
    refresh_dir(d, now);
    if (now < __atomic_load_n(&d->retry_ns[i], __ATOMIC_RELAXED)) return -1;
    char p[440];
    if (slot_path(d, i, p, sizeof p) < 0 || (fd = open_regular(p, O_RDONLY)) < 0) {
        __atomic_store_n(&d->retry_ns[i], now + 1000000000ull, __ATOMIC_RELAXED);
        return -1;
    }
    int none = -1;
    if (!__atomic_compare_exchange_n(&d->peer[i], &none, fd, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        close(fd);
        return none;
    }
    return fd;
}

/* One bounded pread: anything short is no record. */
int sf_read(struct sf_dir *d, int i, void *buf, size_t len, off_t off) {
    int fd = fd_of(d, i);
    return fd >= 0 && pread(fd, buf, len, off) == (ssize_t)len ? 0 : -1;
}

/* Only the own file is ever written. */
int sf_write_own(const struct sf_dir *d, const void *buf, size_t len, off_t off) {
    return d->open && d->own_fd >= 0 && pwrite(d->own_fd, buf, len, off) == (ssize_t)len ? 0 : -1;
}

/* Liveness is the kernel's word: a write lock (a squatter's read lock is not a live owner). */
int sf_alive(struct sf_dir *d, int i, int32_t *pid) {
    if (i == d->own && d->held) return 0;
    int fd = fd_of(d, i);
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = SF_LIVE_OFF, .l_len = 1};
    if (fd < 0 || fcntl(fd, F_GETLK, &fl) < 0 || fl.l_type != F_WRLCK) return 0;
    if (pid) *pid = fl.l_pid;
    return 1;
}

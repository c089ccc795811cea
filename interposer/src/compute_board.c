/* The compute share's files (compute.h has the layout): this process's record in its container's slot file,
 * and bounded reads of the roster and the neighbours' slot files. Every open refuses links and FIFOs, every
 * read is one bounded pread, and anything short or malformed reads as empty: a tenant that truncates, forges
 * or replaces its file costs only its own figures. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compute_int.h"

/* Open a regular file without following a link or blocking on a FIFO: the fd, or -1. */
static int open_regular(const char *path, int flags, mode_t mode) {
    int fd = open(path, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, mode);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))) {
        close(fd);
        return -1;
    }
    return fd;
}

/* One byte's OFD write lock (never waits): 0 taken, -1 held by another open file description. */
static int take_byte(int fd, off_t at) {
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = at, .l_len = 1};
    return fcntl(fd, F_OFD_SETLK, &fl);
}

/* A GPU uuid as a file name: letters, digits and '-' only, else empty (no board). */
static void safe_uuid(const char *uuid, char *out, size_t cap) {
    size_t i = 0;
    for (; uuid[i] && i + 1 < cap; i++) {
        char c = uuid[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-')) {
            out[0] = 0;
            return;
        }
        out[i] = c;
    }
    out[i] = 0;
}

/* The roster, reread every rescan: 1 with a whole one of the layout, else 0 (none: claims are used). */
int cb_read_roster(struct cs_board *b) {
    char path[sizeof b->gpu_dir + 24]; /* "/slot-" and an int: never truncated */
    unsigned char buf[CS_ROSTER_SIZE + 1];
    snprintf(path, sizeof path, "%s/roster", b->gpu_dir);
    int fd = open_regular(path, O_RDONLY, 0);
    ssize_t n = fd < 0 ? -1 : pread(fd, buf, sizeof buf, 0);
    if (fd >= 0) close(fd);
    uint64_t magic = 0;
    if (n == CS_ROSTER_SIZE) memcpy(&magic, buf, sizeof magic);
    b->have_roster = n == CS_ROSTER_SIZE && magic == CS_ROSTER_MAGIC;
    if (b->have_roster) memcpy(b->roster, buf + 8, sizeof b->roster);
    return b->have_roster;
}

/* Claim a record in slot file `fd`: the first whose lock byte is free, else (locks held by strangers: a
 * neighbour's read lock on a read-only view) one chosen by pid, so the process still publishes. */
static int claim_record(int fd) {
    for (int r = 0; r < CS_PROCS; r++)
        if (take_byte(fd, CS_SLOT_FILE_SIZE + r) == 0) return r;
    return (int)(getpid() % CS_PROCS);
}

/* Without an assigned slot (`memslice run`, no roster): the first slot file whose claim byte is free,
 * created mode 0600. The fd, or -1. */
static int claim_free_slot(struct cs_board *b) {
    for (int i = 0; i < CS_SLOTS; i++) {
        char path[sizeof b->gpu_dir + 24]; /* "/slot-" and an int: never truncated */
        snprintf(path, sizeof path, "%s/slot-%02d", b->gpu_dir, i);
        int fd = open_regular(path, O_RDWR | O_CREAT, 0600);
        if (fd < 0) continue;
        if (take_byte(fd, CS_CLAIM_BYTE) == 0) {
            b->slot = i;
            return fd;
        }
        close(fd);
    }
    return -1;
}

/* Open the board of GPU `uuid` under `dir`: this process's slot (`want`, or a free one) and record. 0, or -1
 * with the reason in err (the caller then runs unarbitrated on its own limit). */
int cb_open(struct cs_board *b, const char *dir, const char *uuid, int want, char *err, size_t errlen) {
    char name[80];
    safe_uuid(uuid, name, sizeof name);
    if (!name[0] || snprintf(b->gpu_dir, sizeof b->gpu_dir, "%s/%s", dir, name) >= (int)sizeof b->gpu_dir) {
        snprintf(err, errlen, "no usable board name for GPU '%.48s' under %.200s", uuid, dir);
        return -1;
    }
    if (want < 0 && mkdir(b->gpu_dir, 0755) < 0 && errno != EEXIST) {
        snprintf(err, errlen, "cannot create %.300s: %s", b->gpu_dir, strerror(errno));
        return -1;
    }
    struct stat st;
    if (lstat(b->gpu_dir, &st) < 0 || !S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "%.300s is not a directory", b->gpu_dir);
        return -1;
    }
    int fd = -1;
    if (want >= 0) {
        char path[sizeof b->gpu_dir + 24]; /* "/slot-" and an int: never truncated */
        snprintf(path, sizeof path, "%s/slot-%02d", b->gpu_dir, want);
        fd = open_regular(path, O_RDWR, 0);
        b->slot = want;
        if (fd < 0) snprintf(err, errlen, "cannot open the slot file %.300s writable", path);
    } else {
        fd = claim_free_slot(b);
        if (fd < 0) snprintf(err, errlen, "no free slot in %.300s (%d at most)", b->gpu_dir, CS_SLOTS);
    }
    if (fd < 0) return -1;
    b->fd = fd;
    b->rec = claim_record(fd);
    for (int i = 0; i < CS_SLOTS; i++) b->peer_fd[i] = -1;
    cb_read_roster(b);
    return 0;
}

/* Publish this process's record: one pwrite into its own place of its own slot file. */
void cb_publish(const struct cs_board *b, const struct cs_record *mine) {
    if (b->fd < 0) return;
    if (pwrite(b->fd, mine, sizeof *mine, (off_t)b->rec * (off_t)sizeof *mine) < 0) { /* best effort */ }
}

/* Whether slot i is a neighbour to read: the roster's assigned slots, else every slot file there. */
static int is_candidate(const struct cs_board *b, int i) {
    return !b->have_roster || (b->roster[i].flags & CS_R_ASSIGNED);
}

/* Open the slot files not open yet (new containers); with `reopen`, every one again (a replaced file). */
void cb_rescan(struct cs_board *b, int reopen) {
    for (int i = 0; i < CS_SLOTS; i++) {
        if ((!is_candidate(b, i) || reopen) && b->peer_fd[i] >= 0) {
            close(b->peer_fd[i]);
            b->peer_fd[i] = -1;
        }
        if (!is_candidate(b, i) || b->peer_fd[i] >= 0) continue;
        char path[sizeof b->gpu_dir + 24]; /* "/slot-" and an int: never truncated */
        snprintf(path, sizeof path, "%s/slot-%02d", b->gpu_dir, i);
        b->peer_fd[i] = open_regular(path, O_RDONLY, 0);
    }
}

/* Sum the fresh records of one slot file into a peer (skipping record `skip`, this process's own): shares
 * clamped to 100 each, flags ORed, the claims of the first fresh record. The number of fresh records. */
static int sum_records(int fd, int skip, uint64_t now, struct cs_peer *p) {
    struct cs_record r[CS_PROCS];
    ssize_t n = pread(fd, r, sizeof r, 0);
    int fresh = 0;
    for (int k = 0; k < CS_PROCS && n >= (ssize_t)((k + 1) * sizeof r[0]); k++) {
        /* a stamp a little ahead of `now` was written after we read the clock: fresh, as of now */
        uint64_t stamp = r[k].stamp_ns > now && r[k].stamp_ns - now <= CS_SKEW_NS ? now : r[k].stamp_ns;
        if (k == skip || r[k].magic != CS_RECORD_MAGIC || stamp > now || now - stamp > CS_FRESH_NS) continue;
        if (!fresh) {
            p->request = r[k].request <= 100 ? r[k].request : 0;
            p->limit = r[k].limit >= 1 && r[k].limit <= 100 ? r[k].limit : 100;
            p->priority = r[k].priority;
        }
        fresh++;
        p->share_pm += r[k].share_pm <= 1000 ? (int)r[k].share_pm : 1000;
        p->demand |= !!(r[k].flags & CS_F_DEMAND) && now - stamp <= CS_DEMAND_FRESH_NS;
        p->inflight |= !!(r[k].flags & CS_F_INFLIGHT) && now - stamp <= CS_DEMAND_FRESH_NS;
    }
    return fresh;
}

/* One round's view: the neighbours' bounded figures into peers (their count returned), and into *siblings the
 * share of this container's other processes. The roster's request, limit and priority replace claims. */
int cb_read_peers(const struct cs_board *b, uint64_t now, struct cs_peer peers[CS_SLOTS], int *siblings_pm) {
    int n = 0;
    struct cs_peer own = {0};
    sum_records(b->fd, b->rec, now, &own);
    *siblings_pm = own.share_pm;
    for (int i = 0; i < CS_SLOTS; i++) {
        if (i == b->slot || b->peer_fd[i] < 0) continue;
        struct cs_peer p = {0};
        if (!sum_records(b->peer_fd[i], -1, now, &p)) continue;
        if (b->have_roster) {
            const struct cs_roster_ent *e = &b->roster[i];
            p.request = e->request <= 100 ? (int)e->request : 0;
            p.limit = e->limit >= 1 && e->limit <= 100 ? (int)e->limit : 100;
            p.priority = e->priority;
        }
        if (p.share_pm > p.limit * 10) p.share_pm = p.limit * 10;
        peers[n++] = p;
    }
    return n;
}

/* A forked child must neither write its parent's record nor keep its locks' descriptions. */
void cb_close(struct cs_board *b) {
    if (b->fd >= 0) close(b->fd);
    for (int i = 0; i < CS_SLOTS; i++)
        if (b->peer_fd[i] >= 0) close(b->peer_fd[i]);
    memset(b, 0, sizeof *b);
    b->fd = -1;
    b->slot = -1;
    for (int i = 0; i < CS_SLOTS; i++) b->peer_fd[i] = -1;
}

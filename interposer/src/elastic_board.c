/* The per-GPU elastic arbitration board (layout and trust rules in elastic_board.h): plain file I/O and
 * open-file-description locks, so a tenant that truncates, fills or locks the file can neither crash nor
 * block another tenant: reads are bounded and short reads are empty slots, lock probes never wait. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "elastic_board.h"

/* Try the write lock on slot i's liveness byte: 0 taken, -1 held by another process. Never waits. A classic
 * POSIX lock, not an OFD one: F_GETLK then names its owner (the kernel's word, translated into the asker's
 * PID namespace), which is how the node agent tells whose slot it is without trusting the slot's bytes. Its
 * costs are acceptable here: it is not inherited by fork (the child closes its copy of the descriptor anyway,
 * eb_close_after_fork), and it is dropped if this process closes *any* descriptor of the board, which only
 * the shim opens (a process that does so only loses its own slot's liveness). */
static int take_live_lock(int fd, int i) {
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = EB_LIVE_OFF + i, .l_len = 1};
    return fcntl(fd, F_SETLK, &fl) == 0 ? 0 : -1;
}

/* A board file name keeps only the UUID's safe characters: a region's device table is written by tenants. */
static void safe_name(const char *uuid, char *out, unsigned cap) {
    unsigned n = 0;
    for (const char *p = uuid; *p && n + 1 < cap && n < 64; p++)
        if ((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '-')
            out[n++] = *p;
    out[n] = 0;
}

/* Claim the assigned slot, or (none assigned) the first whose liveness lock nobody holds: a dead tenant's slot
 * is free again at once. A slot held by another process leaves this one without a slot, not without a board:
 * taking every slot (issue 25) cannot stop a neighbour from asking for its request. */
int eb_open(struct eb *b, const char *dir, const char *uuid, int want, char *err, unsigned errlen) {
    char name[80], path[400];
    safe_name(uuid, name, sizeof name);
    b->fd = -1;
    b->slot = -1;
    if (!name[0] || snprintf(path, sizeof path, "%s/%s.board", dir, name) >= (int)sizeof path) {
        snprintf(err, errlen, "no usable board name for GPU '%.48s' in %.200s", uuid, dir);
        return -1;
    }
    int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0666);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "cannot open the elastic board %.300s: %s", path,
                 fd < 0 ? strerror(errno) : "not a regular file");
        if (fd >= 0) close(fd);
        return -1;
    }
    b->fd = fd;
    for (int i = want >= 0 ? want : 0; i < (want >= 0 ? want + 1 : EB_SLOTS) && i < EB_SLOTS; i++) {
        if (take_live_lock(fd, i) < 0) continue;
        b->slot = i;
        struct eb_ask zero = {0, 0};
        if (pwrite(fd, &zero, sizeof zero, EB_ASK_OFF + (off_t)i * sizeof zero) < 0) { /* a stale ask */ }
        return 0;
    }
    if (want >= 0) snprintf(err, errlen, "slot %d of the elastic board %.300s is held by another process", want, path);
    else snprintf(err, errlen, "the elastic board %.300s has no free slot (%d processes)", path, EB_SLOTS);
    return 1;
}

/* The ack: one 8-byte write into this process's own slot, without the slot's other fields. */
void eb_ack(const struct eb *b, uint64_t seq) {
    if (b->fd < 0 || b->slot < 0) return;
    off_t off = (off_t)b->slot * (off_t)sizeof(struct eb_slot) + (off_t)offsetof(struct eb_slot, ack_seq);
    if (pwrite(b->fd, &seq, sizeof seq, off) < 0) { /* best effort */ }
}

/* A neighbour's ack (0 if unreadable): read at every poll of a bounded wait. */
uint64_t eb_ack_seq(const struct eb *b, int slot) {
    struct eb_slot s;
    if (b->fd < 0 || pread(b->fd, &s, sizeof s, (off_t)slot * (off_t)sizeof s) != (ssize_t)sizeof s) return 0;
    return s.magic == EB_MAGIC ? s.ack_seq : 0;
}

/* What a neighbour moved for ask `seq` (MiB), for the asker's needed/moved figures. */
uint64_t eb_moved_for(const struct eb *b, int slot, uint64_t seq) {
    struct eb_slot s;
    if (b->fd < 0 || pread(b->fd, &s, sizeof s, (off_t)slot * (off_t)sizeof s) != (ssize_t)sizeof s) return 0;
    return s.magic == EB_MAGIC && s.done_seq == seq ? s.done_moved_mib : 0;
}

/* A forked child has no CUDA state and must not answer for its parent's slot (the parent keeps the lock). */
void eb_close_after_fork(struct eb *b) {
    if (b->fd >= 0) close(b->fd);
    b->fd = -1;
    b->slot = -1;
}

/* Only the owner writes its slot, so neighbours read a whole, recent record (torn reads: stats only). The
 * version is stamped here, so every record this build writes says which lock kind backs it. */
void eb_publish(const struct eb *b, const struct eb_slot *mine) {
    if (b->fd < 0 || b->slot < 0) return;
    struct eb_slot s = *mine;
    s.version = EB_VERSION;
    if (pwrite(b->fd, &s, sizeof s, (off_t)b->slot * (off_t)sizeof s) < 0) { /* best effort */ }
}

/* Liveness is the kernel's word (the owner's lock: an OFD probe sees POSIX and version 1 OFD locks alike),
 * never a pid a tenant could forge or reuse. */
int eb_alive(const struct eb *b, int slot) {
    if (b->fd < 0 || slot == b->slot) return 0;
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = EB_LIVE_OFF + slot, .l_len = 1};
    if (fcntl(b->fd, F_OFD_GETLK, &fl) < 0) return 0;
    return fl.l_type != F_UNLCK;
}

/* One bounded read of every slot; anything short, malformed or dead reads as empty. */
void eb_read_all(const struct eb *b, struct eb_slot out[EB_SLOTS], int live[EB_SLOTS]) {
    memset(out, 0, sizeof(struct eb_slot) * EB_SLOTS);
    ssize_t n = b->fd < 0 ? -1 : pread(b->fd, out, sizeof(struct eb_slot) * EB_SLOTS, 0);
    for (int i = 0; i < EB_SLOTS; i++) {
        int whole = n >= (ssize_t)((i + 1) * sizeof(struct eb_slot));
        live[i] = whole && out[i].magic == EB_MAGIC && eb_alive(b, i);
        if (!live[i]) memset(&out[i], 0, sizeof out[i]);
    }
}

/* What a neighbour has answered: polled by a tenant waiting (bounded) for HBM. */
uint64_t eb_done_seq(const struct eb *b, int slot) {
    struct eb_slot s;
    if (b->fd < 0 || pread(b->fd, &s, sizeof s, (off_t)slot * (off_t)sizeof s) != (ssize_t)sizeof s) return 0;
    return s.magic == EB_MAGIC ? s.done_seq : 0;
}

/* Asks are plain writes into the neighbour's ask slot: no lock a hostile tenant could hold. */
void eb_ask(const struct eb *b, int slot, uint64_t seq, uint64_t bytes) {
    struct eb_ask a = {seq, bytes};
    if (b->fd < 0) return;
    if (pwrite(b->fd, &a, sizeof a, EB_ASK_OFF + (off_t)slot * (off_t)sizeof a) < 0) { /* best effort */ }
}

/* The background thread's poll: the ask posted to this process's slot. */
struct eb_ask eb_my_ask(const struct eb *b) {
    struct eb_ask a = {0, 0};
    if (b->fd < 0 || b->slot < 0 || pread(b->fd, &a, sizeof a, EB_ASK_OFF + (off_t)b->slot * (off_t)sizeof a) != (ssize_t)sizeof a)
        memset(&a, 0, sizeof a);
    return a;
}

/* The owner's note (issue 26): one pwrite into its own record, never another's. */
void eb_put_note(const struct eb *b, const struct eb_hostnote *mine) {
    if (b->fd < 0 || b->slot < 0) return;
    if (pwrite(b->fd, mine, sizeof *mine, EB_NOTE_OFF + (off_t)b->slot * (off_t)sizeof *mine) < 0) { /* best effort */ }
}

/* A neighbour's note, read by an asker whose ask went unanswered in HBM: one bounded pread; a short read, an
 * unknown cause or another ask's note is no note. */
int eb_note_for(const struct eb *b, int slot, uint64_t seq, struct eb_hostnote *out) {
    if (b->fd < 0 || slot < 0 || slot >= EB_SLOTS ||
        pread(b->fd, out, sizeof *out, EB_NOTE_OFF + (off_t)slot * (off_t)sizeof *out) != (ssize_t)sizeof *out)
        return 0;
    return out->seq == seq && seq && (out->cause == EB_REFUSED_CGROUP || out->cause == EB_REFUSED_HOST);
}

/* The roster: opened without following a link or blocking on a FIFO, one bounded read; anything but the
 * agent's whole layout reads as no roster. */
int eb_read_roster(const char *dir, const char *uuid, struct eb_roster_ent out[EB_SLOTS]) {
    char name[80], path[400];
    unsigned char buf[EB_ROSTER_SIZE + 1];
    safe_name(uuid, name, sizeof name);
    if (!name[0] || snprintf(path, sizeof path, "%s/%s.roster", dir, name) >= (int)sizeof path) return 0;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return 0;
    struct stat st;
    ssize_t n = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? pread(fd, buf, sizeof buf, 0) : -1;
    close(fd);
    uint64_t magic;
    memcpy(&magic, buf, sizeof magic);
    if (n != EB_ROSTER_SIZE || magic != EB_ROSTER_MAGIC) return 0;
    memcpy(out, buf + 8, sizeof(struct eb_roster_ent) * EB_SLOTS);
    return 1;
}

/* The per-GPU elastic arbitration board (layout and trust rules in elastic_board.h), board version 5: one file
 * per slot (slotfile.c), each written by its owner only; plain file I/O and POSIX locks, so a tenant that
 * truncates or fills its own file, or locks another's, can neither crash nor block another tenant: reads are
 * bounded and short reads are empty slots, lock probes never wait. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "elastic_board.h"

/* A board name keeps only the UUID's safe characters: a region's device table is written by tenants. */
static void safe_name(const char *uuid, char *out, unsigned cap) {
    unsigned n = 0;
    for (const char *p = uuid; *p && n + 1 < cap && n < 64; p++)
        if ((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '-')
            out[n++] = *p;
    out[n] = 0;
}

/* Claim the assigned slot's file, or (none assigned: `memslice run`, no agent) the first free one, created as
 * needed. A slot held by another process leaves this one without a slot, not without a board. */
int elastic_board_open(struct elastic_board *b, const char *dir, const char *uuid, int want, char *err,
                       unsigned errlen) {
    char name[80], path[384];
    safe_name(uuid, name, sizeof name);
    b->slot = -1;
    if (!name[0] || snprintf(path, sizeof path, "%s/%s.board", dir, name) >= (int)sizeof path) {
        snprintf(err, errlen, "no usable board name for GPU '%.48s' in %.200s", uuid, dir);
        memset(&b->sf, 0, sizeof b->sf);
        return -1;
    }
    int rc = sf_open(&b->sf, path, want, 1, ELASTIC_FILE_SIZE, err, errlen);
    if (rc < 0) return -1;
    if (rc == 0) {
        b->slot = b->sf.own;
        return 0;
    }
    if (want >= 0 && rc == 1)
        snprintf(err, errlen, "slot %d of the elastic board %.300s is held by another process of this container",
                 want, path);
    else if (want >= 0)
        snprintf(err, errlen, "slot %d of the elastic board %.300s cannot be opened for writing (the node agent "
                 "mounts it; no slot: this process cannot ask its neighbours for HBM)", want, path);
    else snprintf(err, errlen, "the elastic board %.300s has no free slot (%d processes)", path, ELASTIC_SLOTS);
    return 1;
}

/* The ack: one 8-byte write into this process's own slot, without the slot's other fields. */
void elastic_board_ack(const struct elastic_board *b, uint64_t seq) {
    if (b->slot < 0) return;
    sf_write_own(&b->sf, &seq, sizeof seq, (off_t)offsetof(struct elastic_slot, ack_seq));
}

/* A neighbour's ack (0 if unreadable): read at every poll of a bounded wait. */
uint64_t elastic_board_ack_seq(struct elastic_board *b, int slot) {
    struct elastic_slot s;
    if (sf_read(&b->sf, slot, &s, sizeof s, 0) < 0) return 0;
    return s.magic == ELASTIC_MAGIC ? s.ack_seq : 0;
}

/* What a neighbour moved for the answer covering ask `seq` (MiB), for the asker's needed/moved figures. */
uint64_t elastic_board_moved_for(struct elastic_board *b, int slot, uint64_t seq) {
    struct elastic_answer a;
    if (sf_read(&b->sf, slot, &a, sizeof a, ELASTIC_ANSWER_OFF) < 0) return 0;
    return a.first_seq <= seq && seq <= a.seq ? a.moved_mib : 0;
}

/* A forked child has no CUDA state and must not answer for its parent's slot (the parent keeps the lock). */
void elastic_board_close_after_fork(struct elastic_board *b) {
    sf_close(&b->sf);
    b->slot = -1;
}

/* Only the owner writes its slot, so neighbours read a whole, recent record (torn reads: stats only). */
void elastic_board_publish(const struct elastic_board *b, const struct elastic_slot *mine) {
    if (b->slot < 0) return;
    struct elastic_slot s = *mine;
    s.version = ELASTIC_VERSION;
    sf_write_own(&b->sf, &s, sizeof s, 0);
}

/* Liveness is the kernel's word (the owner's write lock), never a pid a tenant could forge or reuse. */
int elastic_board_alive(struct elastic_board *b, int slot) {
    if (slot == b->slot || slot < 0 || slot >= ELASTIC_SLOTS) return 0;
    return sf_alive(&b->sf, slot, NULL);
}

/* One bounded read per slot file; anything short, malformed or dead reads as empty, and so does this process's own
 * container's file (held by another of its processes: never asked). */
void elastic_board_read_all(struct elastic_board *b, struct elastic_slot out[ELASTIC_SLOTS], int live[ELASTIC_SLOTS]) {
    memset(out, 0, sizeof(struct elastic_slot) * ELASTIC_SLOTS);
    for (int i = 0; i < ELASTIC_SLOTS; i++) {
        live[i] = i != b->slot && i != b->sf.own && sf_read(&b->sf, i, &out[i], sizeof out[i], 0) == 0 &&
                  out[i].magic == ELASTIC_MAGIC &&
                  elastic_board_alive(b, i);
        if (!live[i]) memset(&out[i], 0, sizeof out[i]);
    }
}

/* What a neighbour has answered: polled by a tenant waiting (bounded) for HBM. */
uint64_t elastic_board_done_seq(struct elastic_board *b, int slot) {
    struct elastic_slot s;
    if (sf_read(&b->sf, slot, &s, sizeof s, 0) < 0) return 0;
    return s.magic == ELASTIC_MAGIC ? s.done_seq : 0;
}

/* An ask is a write into the asker's own file, at the asked slot's entry: no lock, nobody else's file. */
int elastic_board_ask(const struct elastic_board *b, int slot, uint64_t seq, uint64_t bytes) {
    struct elastic_ask a = {seq, bytes};
    if (slot < 0 || slot >= ELASTIC_SLOTS) return -1;
    return sf_write_own(&b->sf, &a, sizeof a, ELASTIC_ASK_OFF + (off_t)slot * (off_t)sizeof a);
}

/* The background thread's and the acker's poll: the ask each neighbour in `from` addressed to this slot, one
 * bounded pread per file. */
void elastic_board_asks_for_me(struct elastic_board *b, const int from[ELASTIC_SLOTS],
                               struct elastic_ask out[ELASTIC_SLOTS]) {
    memset(out, 0, sizeof(struct elastic_ask) * ELASTIC_SLOTS);
    if (b->slot < 0) return;
    for (int j = 0; j < ELASTIC_SLOTS; j++)
        if (from[j] && j != b->slot &&
            sf_read(&b->sf, j, &out[j], sizeof out[j], ELASTIC_ASK_OFF + (off_t)b->slot * (off_t)sizeof out[j]) < 0)
            memset(&out[j], 0, sizeof out[j]);
}

/* The owner's answer record: one pwrite into its own file. */
void elastic_board_put_answer(const struct elastic_board *b, const struct elastic_answer *a) {
    if (b->slot >= 0) sf_write_own(&b->sf, a, sizeof *a, ELASTIC_ANSWER_OFF);
}

/* The owner's note: one pwrite into its own file, never another's. */
void elastic_board_put_note(const struct elastic_board *b, const struct elastic_hostnote *mine) {
    if (b->slot >= 0) sf_write_own(&b->sf, mine, sizeof *mine, ELASTIC_NOTE_OFF);
}

/* A neighbour's note, read by an asker whose ask went unanswered in HBM: one bounded pread; a short read, an
 * unknown cause or a note that does not cover this ask is no note. Only the neighbour can have written it. */
int elastic_board_note_for(struct elastic_board *b, int slot, uint64_t seq, struct elastic_hostnote *out) {
    if (slot < 0 || slot >= ELASTIC_SLOTS || sf_read(&b->sf, slot, out, sizeof *out, ELASTIC_NOTE_OFF) < 0) return 0;
    return seq && out->first_seq <= seq && seq <= out->seq &&
           (out->cause == ELASTIC_REFUSED_CGROUP || out->cause == ELASTIC_REFUSED_HOST);
}

/* The roster's path beside the boards (0: no usable name): one place for its reader and its stamp. */
static int roster_path(const char *dir, const char *uuid, char *path, unsigned cap) {
    char name[80];
    safe_name(uuid, name, sizeof name);
    return name[0] && snprintf(path, cap, "%s/%s.roster", dir, name) < (int)cap;
}

/* The roster: opened without following a link or blocking on a FIFO, one bounded read; anything but the
 * agent's whole layout reads as no roster. */
int elastic_board_read_roster(const char *dir, const char *uuid, struct elastic_roster_ent out[ELASTIC_SLOTS]) {
    char path[400];
    unsigned char buf[ELASTIC_ROSTER_SIZE + 1];
    if (!roster_path(dir, uuid, path, sizeof path)) return 0;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return 0;
    struct stat st;
    ssize_t n = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? pread(fd, buf, sizeof buf, 0) : -1;
    close(fd);
    uint64_t magic;
    memcpy(&magic, buf, sizeof magic);
    if (n != ELASTIC_ROSTER_SIZE || magic != ELASTIC_ROSTER_MAGIC) return 0;
    memcpy(out, buf + 8, sizeof(struct elastic_roster_ent) * ELASTIC_SLOTS);
    return 1;
}

/* The roster file's stamp: one lstat-like call (no link followed, nothing opened, so a FIFO cannot block it),
 * cheap enough for every tick, so a cached roster is re-read as soon as the agent replaces it. */
void elastic_board_roster_stamp(const char *dir, const char *uuid, struct elastic_roster_stamp *out) {
    char path[400];
    struct stat st;
    memset(out, 0, sizeof *out);
    if (!roster_path(dir, uuid, path, sizeof path) || fstatat(AT_FDCWD, path, &st, AT_SYMLINK_NOFOLLOW) != 0) return;
    *out = (struct elastic_roster_stamp){(uint64_t)st.st_dev, (uint64_t)st.st_ino, (uint64_t)st.st_size,
                                         (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec,
                                         (uint64_t)st.st_ctim.tv_sec * 1000000000ull + (uint64_t)st.st_ctim.tv_nsec};
}

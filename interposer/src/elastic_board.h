/* The elastic arbitration board of one GPU (elastic_board.c): a small file per GPU in the node's elastic
 * directory, <dir>/<GPU uuid>.board, through which the tenants of that GPU see each other and ask each other
 * to yield HBM. Read and written with pread/pwrite only (never mmap'd: any tenant can write or truncate it,
 * and a short read is an empty slot, never a fault). Layout (docs/architecture.md, "Elastic memory"):
 *   [0, EB_SLOTS*128)               one struct eb_slot per tenant process, written by its owner only
 *   [EB_ASK_OFF, +EB_SLOTS*16)      one struct eb_ask per slot, written by tenants that need HBM
 *   [EB_LIVE_OFF, +EB_SLOTS)        one byte per slot: its owner holds a classic POSIX (fcntl F_SETLK)
 *                                   write lock on it for life, so a slot is live exactly while its process
 *                                   is (the kernel drops the lock when the process dies, SIGKILL included),
 *                                   and F_GETLK names that process, in the asker's PID namespace: how the
 *                                   node agent attributes a slot to a container without trusting its bytes
 * Version 2 (EB_VERSION in each slot): the liveness lock is a POSIX lock (version 1: an OFD lock, whose
 * owner the kernel does not name). Version 3 uses the last 32 bytes (padding before): priority and flags,
 * the ack of an ask, what the last answer moved, and the owner's own asks (issues 25, 26). The offsets are
 * unchanged, so every version shares a board. Version 4 adds, after the liveness bytes, one struct
 * eb_hostnote per slot (written by its owner only): the last ask it could not take to host memory, and why
 * (issue 26, "host memory is finite"), with its refusal counts and its own bursts that failed for one.
 * An ask (struct eb_ask.bytes) packs the asker's share for this slot and its whole need, in MiB, and whether
 * the ask may take an active tenant's burst (for a request, or from a higher priority): EB_ASK_* below. */
#ifndef MEMSLICE_ELASTIC_BOARD_H
#define MEMSLICE_ELASTIC_BOARD_H

#include <stdint.h>

#define EB_SLOTS 64
#define EB_MAGIC 0x4c45534du        /* "MSEL" */
#define EB_VERSION 4u
#define EB_ASK_OFF (EB_SLOTS * 128)
#define EB_LIVE_OFF (EB_ASK_OFF + EB_SLOTS * 16)
#define EB_NOTE_OFF (EB_LIVE_OFF + EB_SLOTS)
#define EB_FILE_SIZE (EB_NOTE_OFF + EB_SLOTS * 48)

enum eb_state { EB_ACTIVE = 1, EB_IDLE = 2 };

struct eb_slot {
    uint32_t magic;
    uint32_t state;           /* enum eb_state, as its owner sees itself */
    int32_t pid;              /* in the owner's namespace: display only */
    uint32_t version;         /* EB_VERSION (0 from a version 1 shim) */
    uint64_t request, limit;  /* bytes */
    uint64_t resident;        /* elastic bytes in HBM */
    uint64_t swapped;         /* elastic bytes in host memory (swapped out, or served from host) */
    uint64_t idle_ms;         /* since the owner's last CUDA call */
    uint64_t done_seq;        /* the last ask the owner has answered */
    uint64_t swap_outs, swap_ins;   /* ranges moved, ever */
    uint64_t swap_out_ns, swap_in_ns; /* time spent moving them */
    int32_t priority;         /* the pod's PriorityClass value (version 3) */
    uint32_t flags;           /* EB_F_* */
    uint64_t ack_seq;         /* the last ask the owner has seen (answered or not yet) */
    uint32_t done_moved_mib;  /* what the owner moved to host memory for done_seq */
    uint32_t asks;            /* asks this owner made of its neighbours, ever */
    uint32_t asked_mib;       /* what those asks needed, ever (MiB, wraps at 4 PiB) */
    uint32_t got_mib;         /* what neighbours moved for them, ever (MiB) */
};
#define EB_F_IDLE_RELEASE 1u  /* idle, the owner gives up its request too (its pod opted in) */

#define EB_ASK_SHARE(b) ((b) & 0xffffffull)            /* MiB asked of this slot */
#define EB_ASK_NEED(b) (((b) >> 24) & 0xffffffull)     /* MiB the asker needs in all */
#define EB_ASK_BURST (1ull << 63)                      /* may take an active tenant's burst */
#define EB_ASK_PACK(share_mib, need_mib, burst) \
    (((share_mib) & 0xffffffull) | (((need_mib) & 0xffffffull) << 24) | ((burst) ? EB_ASK_BURST : 0))
_Static_assert(sizeof(struct eb_slot) == 128, "board slot is 128 bytes");

struct eb_ask { uint64_t seq, bytes; };

/* Why a slot's owner did not take an ask's bytes to host memory (version 4): its memory cgroup near its
 * limit, or the host low on memory. Figures as the owner read them (claims: shown, never acted on). */
enum eb_refused { EB_REFUSED_CGROUP = 1, EB_REFUSED_HOST = 2 };
struct eb_hostnote {
    uint64_t seq;             /* the ask refused last (0: none) */
    uint32_t cause;           /* enum eb_refused */
    uint32_t want_mib;        /* what that answer would have moved */
    uint64_t limit, used;     /* cgroup: memory.max, memory.current; host: MemTotal, MemTotal - MemAvailable */
    uint32_t refused_cgroup;  /* asks refused for the cgroup, ever */
    uint32_t refused_host;    /* asks refused for host memory, ever */
    uint32_t bursts_failed;   /* this owner's own burst allocations that failed for a neighbour's refusal */
    uint32_t reserved;
};
_Static_assert(sizeof(struct eb_hostnote) == 48, "host note is 48 bytes");

struct eb { int fd; int slot; };

/* The roster of a GPU's board (issue 25): <dir>/<GPU uuid>.roster, written by the node agent only (atomically,
 * by rename) in a directory tenants see read-only: which slots the agent assigned to containers, with the
 * container's request, limit, priority and idle-release opt-in from the agent's own records. Where a roster
 * exists, a tenant asks only assigned slots and takes their figures from it, not from the slots' claims.
 * Layout: 8 bytes EB_ROSTER_MAGIC, then EB_SLOTS entries of 16 bytes. Without one (`memslice run`), every
 * live slot may be asked, on its own claims. */
#define EB_ROSTER_MAGIC 0x3130524f5253534dull /* "MSSROR01" little-endian */
#define EB_ROSTER_SIZE (8 + EB_SLOTS * 16)
#define EB_R_ASSIGNED 1u
#define EB_R_IDLE_RELEASE 2u
struct eb_roster_ent { uint32_t flags; int32_t priority; uint32_t request_mib, limit_mib; };
_Static_assert(sizeof(struct eb_roster_ent) == 16, "roster entry is 16 bytes");
/* Read the roster of GPU `uuid` in `dir`: 1 with one, 0 without (absent, or not a whole regular file of the
 * layout: then nothing is filtered), never blocking. */
int eb_read_roster(const char *dir, const char *uuid, struct eb_roster_ent out[EB_SLOTS]);

/* Open (creating it if needed, mode 0666 & ~umask) the board of GPU `uuid` in `dir` and claim a slot: the
 * one assigned (`want` >= 0: the node agent's, from the limits file), else the first free one. 0 with a slot,
 * 1 without one (b->slot -1: the process still asks its neighbours, nobody can ask it), or -1 with a message
 * in err (no board). */
int eb_open(struct eb *b, const char *dir, const char *uuid, int want, char *err, unsigned errlen);
/* Say the ask `seq` has been seen (before it is answered): askers skip a slot that does not, within a tick. */
void eb_ack(const struct eb *b, uint64_t seq);
uint64_t eb_ack_seq(const struct eb *b, int slot);
/* What slot `slot` moved for its answer to `seq`, in MiB (0 if its last answer is another ask's). */
uint64_t eb_moved_for(const struct eb *b, int slot, uint64_t seq);
void eb_close_after_fork(struct eb *b);
/* Write this process's own slot. */
void eb_publish(const struct eb *b, const struct eb_slot *mine);
/* Read every slot; live[i] says whether slot i's owner is alive (and not this process). Slots with a bad
 * magic, and dead ones, come back zeroed. */
void eb_read_all(const struct eb *b, struct eb_slot out[EB_SLOTS], int live[EB_SLOTS]);
int eb_alive(const struct eb *b, int slot);
uint64_t eb_done_seq(const struct eb *b, int slot);
/* Ask slot `slot` to yield `bytes` of HBM; seq identifies the ask (a CLOCK_MONOTONIC time). */
void eb_ask(const struct eb *b, int slot, uint64_t seq, uint64_t bytes);
/* The ask posted to this process's own slot (zeroes if none). */
struct eb_ask eb_my_ask(const struct eb *b);
/* Write this process's own host note (no slot: nothing). */
void eb_put_note(const struct eb *b, const struct eb_hostnote *mine);
/* Slot `slot`'s host note if it refers to ask `seq`: 1 and *out, else 0. */
int eb_note_for(const struct eb *b, int slot, uint64_t seq, struct eb_hostnote *out);

#endif

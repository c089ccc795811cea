/* The elastic arbitration board of one GPU (elastic_board.c), board version 5: a directory
 * <dir>/<GPU uuid>.board/ of one file per slot (slotfile.h: "NN.slot", live while its owner holds the write lock
 * on its liveness byte), through which the tenants of that GPU see each other and ask each other to yield HBM.
 * Each file is written by its owner only: the node agent mounts only the container's own slot file read-write,
 * the directory and every other file read-only, so nobody can write a neighbour's figures, answers or notes.
 * Read with bounded preads only, never mapped (an owner may truncate its own file). Layout of a slot file:
 *   [0, 128)        struct elastic_slot: the owner's state and figures (claims: bounded by the roster)
 *   [128, 192)      struct elastic_hostnote: the last asks it could not take to host memory, and why
 *   [192, 224)      struct elastic_answer: which asks its last answer covered, and what it moved for them
 *   [256, +64*16)   struct elastic_ask per slot j: this owner's ask of slot j (an asker writes only its own file;
 *                   the asked slot reads the asks addressed to it from every assigned neighbour's file)
 * Versions 1-4 were one shared, tenant-writable file per GPU (<uuid>.board): a tenant could forge a neighbour's
 * answer and host note there; a version 5 shim does not read them.
 * An ask (struct elastic_ask.bytes) packs the asker's share for this slot and its whole need, in MiB, and whether
 * the ask may take an active tenant's burst (for a request, or from a higher priority): ELASTIC_ASK_* below. The
 * asked slot bounds the need by the asker's limit in the roster and by the GPU's size. */
#ifndef MEMSLICE_ELASTIC_BOARD_H
#define MEMSLICE_ELASTIC_BOARD_H

#include <stdint.h>

#include "slotfile.h"

#define ELASTIC_SLOTS 64
#define ELASTIC_MAGIC 0x4c45534du        /* "MSEL" */
#define ELASTIC_VERSION 5u
#define ELASTIC_NOTE_OFF 128
#define ELASTIC_ANSWER_OFF 192
#define ELASTIC_ASK_OFF 256
#define ELASTIC_FILE_SIZE (ELASTIC_ASK_OFF + ELASTIC_SLOTS * 16)

enum elastic_slot_state { ELASTIC_ACTIVE = 1, ELASTIC_IDLE = 2 };

struct elastic_slot {
    uint32_t magic;
    uint32_t state;           /* enum elastic_slot_state, as its owner sees itself */
    int32_t pid;              /* in the owner's namespace: display only */
    uint32_t version;         /* ELASTIC_VERSION (0 from a version 1 shim) */
    uint64_t request, limit;  /* bytes */
    uint64_t resident;        /* elastic bytes in HBM */
    uint64_t swapped;         /* elastic bytes in host memory (swapped out, or served from host) */
    uint64_t idle_ms;         /* since the owner's last CUDA call */
    uint64_t done_seq;        /* the last ask the owner has answered */
    uint64_t swap_outs, swap_ins;   /* chunks moved, ever */
    uint64_t swap_out_ns, swap_in_ns; /* time spent moving them (whole batches: staged, copied, remapped) */
    int32_t priority;         /* the pod's PriorityClass value (version 3) */
    uint32_t flags;           /* ELASTIC_F_* */
    uint64_t ack_seq;         /* the last ask the owner has seen (answered or not yet) */
    uint32_t done_moved_mib;  /* what the owner moved to host memory for done_seq */
    uint32_t asks;            /* asks this owner made of its neighbours, ever */
    uint32_t asked_mib;       /* what those asks needed, ever (MiB, wraps at 4 PiB) */
    uint32_t got_mib;         /* what neighbours moved for them, ever (MiB) */
};
#define ELASTIC_F_IDLE_RELEASE 1u  /* idle, the owner gives up its request too (its pod opted in) */

#define ELASTIC_ASK_SHARE(b) ((b) & 0xffffffull)            /* MiB asked of this slot */
#define ELASTIC_ASK_NEED(b) (((b) >> 24) & 0xffffffull)     /* MiB the asker needs in all */
#define ELASTIC_ASK_BURST (1ull << 63)                      /* may take an active tenant's burst */
#define ELASTIC_ASK_PACK(share_mib, need_mib, burst) \
    (((share_mib) & 0xffffffull) | (((need_mib) & 0xffffffull) << 24) | ((burst) ? ELASTIC_ASK_BURST : 0))
_Static_assert(sizeof(struct elastic_slot) == 128, "board slot is 128 bytes");

struct elastic_ask { uint64_t seq, bytes; };

/* Why a slot's owner did not take an ask's bytes to host memory (version 4): its memory cgroup near its
 * limit, or the host low on memory. Figures as the owner read them (claims: shown, never acted on). */
enum elastic_refused { ELASTIC_REFUSED_CGROUP = 1, ELASTIC_REFUSED_HOST = 2 };
struct elastic_hostnote {
    uint64_t seq;             /* the newest ask the last refusal covered (0: none) */
    uint64_t first_seq;       /* the oldest (asks of several neighbours are answered together) */
    uint32_t cause;           /* enum elastic_refused */
    uint32_t want_mib;        /* what that answer would have moved */
    uint64_t limit, used;     /* cgroup: memory.max, memory.current; host: MemTotal, MemTotal - MemAvailable */
    uint32_t refused_cgroup;  /* asks refused for the cgroup, ever */
    uint32_t refused_host;    /* asks refused for host memory, ever */
    uint32_t bursts_failed;   /* this owner's own burst allocations that failed for a neighbour's refusal */
    uint32_t reserved;
    uint64_t pad;
};
_Static_assert(sizeof(struct elastic_hostnote) == 64, "host note is 64 bytes");

/* The owner's last answer: it covered the asks first_seq..seq (of every asker) and moved moved_mib for them. */
struct elastic_answer { uint64_t first_seq, seq; uint32_t moved_mib, reserved; uint64_t pad; };
_Static_assert(sizeof(struct elastic_answer) == 32, "answer is 32 bytes");

/* A board: the slot files of one GPU. slot: the one whose lock this process holds (-1: none, nobody can ask
 * it); sf.own may still be >= 0 without it (another process of the container holds it): then it asks. */
struct elastic_board { struct sf_dir sf; int slot; };

/* The roster of a GPU's board: <dir>/<GPU uuid>.roster, written by the node agent only (atomically,
 * by rename) in a directory tenants see read-only: which slots the agent assigned to containers, with the
 * container's request, limit, priority and idle-release opt-in from the agent's own records. Where a roster
 * exists, a tenant asks only assigned slots and takes their figures from it, not from the slots' claims.
 * Layout: 8 bytes ELASTIC_ROSTER_MAGIC, then ELASTIC_SLOTS entries of 16 bytes. Without one (`memslice run`), every
 * live slot may be asked, on its own claims. */
#define ELASTIC_ROSTER_MAGIC 0x3130524f5253534dull /* "MSSROR01" little-endian */
#define ELASTIC_ROSTER_SIZE (8 + ELASTIC_SLOTS * 16)
#define ELASTIC_R_ASSIGNED 1u
#define ELASTIC_R_IDLE_RELEASE 2u
struct elastic_roster_ent { uint32_t flags; int32_t priority; uint32_t request_mib, limit_mib; };
_Static_assert(sizeof(struct elastic_roster_ent) == 16, "roster entry is 16 bytes");
/* Read the roster of GPU `uuid` in `dir`: 1 with one, 0 without (absent, or not a whole regular file of the
 * layout: then nothing is filtered), never blocking. */
int elastic_board_read_roster(const char *dir, const char *uuid, struct elastic_roster_ent out[ELASTIC_SLOTS]);
/* What tells a changed roster without reading it: the agent renames a new file into place (a new inode), a
 * rewrite in place changes its size or times. All zero: no roster file. */
struct elastic_roster_stamp { uint64_t dev, ino, size, mtime_ns, ctime_ns; };
void elastic_board_roster_stamp(const char *dir, const char *uuid, struct elastic_roster_stamp *out);

/* Open the board of GPU `uuid` in `dir` (without an agent: the directory and slot files created as needed, mode
 * 0777/0666 & ~umask) and claim a slot: the one assigned (`want` >= 0: the node agent's, from the limits file),
 * else the first free one. 0 with a slot, 1 without one (b->slot -1: the process still asks its neighbours if
 * it can write its container's slot file, nobody can ask it), or -1 with a message in err (no board). */
int elastic_board_open(struct elastic_board *b, const char *dir, const char *uuid, int want, char *err,
                       unsigned errlen);
/* Say the ask `seq` has been seen (before it is answered): askers skip a slot that does not, within a tick. */
void elastic_board_ack(const struct elastic_board *b, uint64_t seq);
uint64_t elastic_board_ack_seq(struct elastic_board *b, int slot);
/* What slot `slot` moved for its answer covering `seq`, in MiB (0 if its last answer covered other asks). */
uint64_t elastic_board_moved_for(struct elastic_board *b, int slot, uint64_t seq);
void elastic_board_close_after_fork(struct elastic_board *b);
/* Write this process's own slot. */
void elastic_board_publish(const struct elastic_board *b, const struct elastic_slot *mine);
/* Read every slot; live[i] says whether slot i's owner is alive (and not this process). Slots with a bad
 * magic, and dead ones, come back zeroed. */
void elastic_board_read_all(struct elastic_board *b, struct elastic_slot out[ELASTIC_SLOTS], int live[ELASTIC_SLOTS]);
int elastic_board_alive(struct elastic_board *b, int slot);
uint64_t elastic_board_done_seq(struct elastic_board *b, int slot);
/* Ask slot `slot` to yield `bytes` of HBM (written into this process's own file); seq identifies the ask (a
 * CLOCK_MONOTONIC time). 0, or -1 when this process has no file to write (then it cannot ask). */
int elastic_board_ask(const struct elastic_board *b, int slot, uint64_t seq, uint64_t bytes);
/* The asks addressed to this process's slot: out[j] is slot j's (zeroes if none, or j not in `from`). */
void elastic_board_asks_for_me(struct elastic_board *b, const int from[ELASTIC_SLOTS],
                               struct elastic_ask out[ELASTIC_SLOTS]);
/* Write this process's answer record (the asks it covered, what it moved). */
void elastic_board_put_answer(const struct elastic_board *b, const struct elastic_answer *a);
/* Write this process's own host note (no slot: nothing). */
void elastic_board_put_note(const struct elastic_board *b, const struct elastic_hostnote *mine);
/* Slot `slot`'s host note if it covers ask `seq`: 1 and *out, else 0. */
int elastic_board_note_for(struct elastic_board *b, int slot, uint64_t seq, struct elastic_hostnote *out);

#endif

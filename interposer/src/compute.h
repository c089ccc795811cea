/* The compute share's arbitration files (compute.c; src/memslice/compute.py is the Python side of the
 * same layout, docs/architecture.md "Compute share" the design). Per GPU, in the node's compute directory:
 *   <dir>/<GPU uuid>/roster    the provisioner's (node agent or `memslice run`), read-only to tenants: 8 bytes
 *                              CS_ROSTER_MAGIC, then CS_SLOTS entries of struct cs_roster_ent
 *   <dir>/<GPU uuid>/slot-NN   one file per slot (container), CS_PROCS records of struct cs_record, each
 *                              written by one process of that container (claimed by an OFD lock on byte
 *                              CS_SLOT_FILE_SIZE + record index); only its container has it writable
 * Read and written with pread/pwrite only (never mmap'd): a short read is an empty record. Every figure a
 * neighbour publishes is bounded before use: its share by its roster limit (or 100), its request, limit and
 * priority are the roster's where there is one. */
#ifndef MEMSLICE_COMPUTE_H
#define MEMSLICE_COMPUTE_H

#include <stdint.h>

#define CS_SLOTS 64
#define CS_PROCS 8
#define CS_RECORD_MAGIC 0x50434d53u              /* "MSCP" */
#define CS_RECORD_VERSION 1
#define CS_SLOT_FILE_SIZE (CS_PROCS * 64)
#define CS_CLAIM_BYTE (CS_SLOT_FILE_SIZE + CS_PROCS) /* without a roster: the lock that makes a slot file ours */
#define CS_ROSTER_MAGIC 0x3130534f5243534dull    /* "MSCROS01" little-endian */
#define CS_ROSTER_SIZE (8 + CS_SLOTS * 16)
#define CS_R_ASSIGNED 1u
#define CS_F_DEMAND 1u        /* work queued, waiting, or launched within CS_DEMAND_NS */
#define CS_F_INFLIGHT 2u      /* work on the GPU now */
#define CS_F_UNARBITRATED 4u  /* no usable board: this process runs on its own limit only */

struct cs_record {
    uint32_t magic;
    uint16_t version, flags;
    int32_t pid;              /* in the owner's PID namespace: display only */
    uint8_t request, limit;   /* the owner's own share (claims; the roster's figures win) */
    uint16_t reserved;
    int32_t priority;
    uint32_t share_pm;        /* GPU share over the last window, per mille */
    uint64_t stamp_ns;        /* CLOCK_MONOTONIC of this publish */
    uint64_t used_ns;         /* GPU time charged, ever */
    uint64_t throttled_ns;    /* time waited at the limit, ever */
    uint64_t waited_ns;       /* time waited for neighbours (share, priority), ever */
    uint64_t launches;
};
_Static_assert(sizeof(struct cs_record) == 64, "compute record is 64 bytes");

struct cs_roster_ent { uint32_t flags; int32_t priority; uint32_t request, limit; /* limit 0: none */ };
_Static_assert(sizeof(struct cs_roster_ent) == 16, "compute roster entry is 16 bytes");

/* What one arbitration round knows of a slot (a container): bounded figures only. */
struct cs_peer { int request, limit, priority, share_pm, demand, inflight; };

enum cs_verdict { CS_GO = 0, CS_WAIT_LIMIT = 1, CS_WAIT_SHARE = 2, CS_WAIT_PRIO = 3 };

/* The decision (compute_decide.c, pure): may a process of a container with share `me` launch now, given the
 * neighbours `peers[0..n)`? */
enum cs_verdict cs_decide(const struct cs_peer *me, const struct cs_peer *peers, int n);

#endif

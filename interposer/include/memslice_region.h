/* The shared accounting region: one mmap'd file per container (MEMSLICE_REGION_DIR/memslice.region),
 * shared by every process of the container; the simulated GPU keeps its node-wide physical region in the
 * same layout. This header is the only definition of the layout: the C code includes it and Python's
 * cffi parses the part between BEGIN CFFI and END CFFI, so keep that part plain C (no macros beyond
 * integer #defines, no attributes; padding is written out by hand).
 *
 * Concurrency, in short (region.c and region_charge.c have the details):
 *  - dev[i].used / dev[i].host_used are the only shared hot words. A charge is one CAS that checks the
 *    limit (charge before allocating, give back if the driver fails): never check-then-charge.
 *  - Each process owns one slot and records what it charged there; a slot's owner holds an fcntl lock on
 *    byte MS_LOCK_BASE + slot for its whole life, so a dead process (even kill -9) is recognised by its
 *    released lock, whatever PID namespace the observer is in.
 *  - Slow paths (claiming a slot, reclaiming dead ones, recount) take `lock`, a process-shared robust
 *    mutex, with a timed lock (MS_LOCK_WAIT_MS): a holder that dies is detected (EOWNERDEAD) and its work
 *    redone; a holder that is stopped (SIGSTOP, a debugger, the cgroup freezer) makes the others give up
 *    that slow path after the bound instead of waiting for it.
 *  - Bit 63 of used/host_used is the "frozen" bit: set only by a recount (under `lock`), which rebuilds
 *    the totals from the live slots and publishes each with a CAS from the frozen value it set; hot paths
 *    that see it back off, and after MS_FROZEN_WAIT_MS abandon the recount (clear the bit: the totals go
 *    back to their pre-recount values, and the stalled recounter's CAS then fails). No wait is unbounded.
 *
 * The file is tenant-writable: everything read from it is validated (on open: sizes, counts, the mutex
 * kind; later, every index read from it is clamped), and a file that is not exactly the expected size is
 * never re-initialised while a process of the container holds a slot (that would start a second region
 * and double the quota). A file truncated under the live processes' mappings (their next access would
 * raise SIGBUS) is caught by the region's SIGBUS guard (region_guard.c): that process's mapping is replaced
 * by a private one whose totals refuse every charge (fail closed), and it lives on. */
#ifndef MEMSLICE_REGION_H
#define MEMSLICE_REGION_H

#include <stdint.h>

#define MS_LOCK_BASE (1ull << 30)            /* fcntl lock byte of slot i is MS_LOCK_BASE + i */
#define MS_INIT_LOCK_BYTE (MS_LOCK_BASE - 1) /* serialises creation of the file */
#define MS_DEVICE_LOCK_BYTE (MS_LOCK_BASE - 2) /* serialises appends to dev[] (held for a few instructions) */
#define MS_FROZEN (1ull << 63)
#define MS_REGION_FILE "memslice.region"

/* Bounds on every wait (docs/architecture.md, "Shared region"). One allocation or free call waits at most
 * MS_CALL_WAIT_MS in total for the region, and only when another process of the container is stopped or
 * died at the wrong moment; otherwise it never waits. */
#define MS_LOCK_WAIT_MS 250     /* the region mutex, or the creation lock of the file */
#define MS_RECOUNT_WAIT_MS 200  /* a recount waits this long for live processes' in-flight steps */
#define MS_FROZEN_WAIT_MS 300   /* a charge waits this long for a recount before abandoning it */
#define MS_SWEEP_PERIOD_MS 1000 /* the periodic reclaim of dead processes (any process, while allocating) */
#define MS_CALL_WAIT_MS 1500

/* BEGIN CFFI */
#define MS_MAGIC 1297307971          /* "MSLC" */
#define MS_VERSION 3               /* 2: bounded recount (CAS publish, abort), swept_ns; 3: slot.driver_taken */
#define MS_MAX_DEVICES 16
#define MS_MAX_SLOTS 4096
#define MS_UUID_LEN 48
#define MS_SLOT_FREE 0
#define MS_SLOT_LIVE 2

struct ms_header {
    uint32_t magic;           /* MS_MAGIC once initialised (written last) */
    uint32_t version;         /* MS_VERSION */
    uint32_t header_size;     /* sizeof(struct ms_header), sizeof(struct ms_device), ... for checks */
    uint32_t device_size;
    uint32_t slot_size;
    uint32_t max_devices;
    uint32_t max_slots;
    uint32_t ndevices;        /* dev[] entries in use; append-only, under `lock` */
    uint64_t created_at;      /* unix seconds */
    uint64_t recounts;        /* how many recounts ran (statistics) */
    uint64_t reclaimed;       /* slots reclaimed from dead processes (statistics) */
    uint64_t extra_size;      /* bytes after the region proper (the simulator's node state) */
    uint8_t lock[64];         /* pthread_mutex_t, process-shared and robust: slow paths only */
    uint32_t slot_hwm;        /* 1 + the highest slot index ever claimed: scans stop there */
    uint32_t pad32;
    uint64_t swept_ns;        /* CLOCK_MONOTONIC ns of the last sweep (rate-limits the periodic one) */
    uint64_t recount_aborts;  /* recounts abandoned because their owner stalled (statistics) */
    uint64_t recount_retry_ns; /* after a recount timed out, none is tried before this (CLOCK_MONOTONIC) */
    uint8_t pad[96];
};

struct ms_device {
    /* line 0: identity, read-mostly */
    char uuid[48];            /* "GPU-xxxxxxxx-..."; devices are keyed by UUID, never by ordinal */
    uint64_t physical_total;  /* the GPU's capacity in bytes, as the driver reports it */
    uint64_t limit;           /* quota in bytes last set by a process of this container (display) */
    /* line 1: the hot words */
    uint64_t used;            /* device bytes charged: allocations + context reserves (bit 63: frozen) */
    uint64_t host_used;       /* bytes spilled to host memory in oversubscription mode (bit 63: frozen) */
    uint64_t pad1[6];
    /* line 2: statistics */
    uint64_t peak;            /* high-water mark of used */
    uint64_t host_peak;       /* high-water mark of host_used */
    uint64_t refused;         /* allocations refused because of the quota */
    uint64_t spill_refused;   /* spills refused (host cap or cgroup margin) */
    uint64_t context_cost;    /* what the last context created on this GPU took, as measured (bytes) */
    uint64_t driver_taken;    /* bytes of `used` the driver took outside allocation calls (contexts, limits,
                                 modules, and what NVML showed beyond the charges): the sum of the slots'
                                 driver_taken, lowered with them when a process exits or is swept */
    uint64_t pad2[2];
};

struct ms_slot {
    /* line 0: owner and state */
    uint32_t state;           /* MS_SLOT_FREE or MS_SLOT_LIVE */
    int32_t pid;              /* owner's pid in its own namespace (display only) */
    uint32_t op_active;       /* charges/uncharges of this process between their two steps */
    uint32_t generation;      /* bumped at each claim */
    uint64_t started_at;      /* unix seconds */
    char comm[16];            /* owner's command name */
    uint64_t refused;         /* this process's refused allocations */
    uint64_t peak;            /* this process's peak device bytes (summed over devices) */
    int32_t host_pid;         /* owner's pid in the initial PID namespace (what NVML reports), 0 = unknown */
    uint32_t pad0;
    /* lines 1-4: what this process has charged, per device index */
    uint64_t device_bytes[16];
    uint64_t host_bytes[16];
    /* lines 5-6: of device_bytes, what the driver took outside allocation calls (contexts, limits, modules,
       NVML's unexplained figure): kept per process so that it leaves the total with the process */
    uint64_t driver_taken[16];
};

struct ms_region {
    struct ms_header hdr;
    struct ms_device dev[16];
    struct ms_slot slot[4096];
};
/* END CFFI */

_Static_assert(sizeof(struct ms_header) == 256, "header layout");
_Static_assert(sizeof(struct ms_device) == 192, "device layout");
_Static_assert(sizeof(struct ms_slot) == 448, "slot layout");

/* ---- C API (region*.c), compiled into the shim, the simulator and the region library ---------------- */
#include <stddef.h>

typedef struct region_handle {
    struct ms_region *r;
    void *extra;              /* extra_size bytes after the region (simulator state), or NULL */
    size_t map_size;
    int fd;
    int slot;                 /* this process's slot, -1 until claimed */
    int lock_error;           /* errno of the last failed region-mutex wait (ETIMEDOUT: a stopped holder) */
    volatile int lost;        /* 1 once the file was truncated under the mapping: the mapping is now private and
                               * its totals read MS_LOST_USED, so every charge is refused (region_guard.c) */
} region_handle;

/* What a lost region's totals read: over any quota (every charge refused), not frozen. */
#define MS_LOST_USED (1ull << 62)

/* Open (creating if needed) the region file at `path`. When this call creates it, init_extra (if given)
 * fills the extra area first, under the creation lock. 0 on success; else -1 and a message in err. */
typedef int (*region_init_extra_fn)(void *extra, void *arg, char *err, size_t errlen);
int region_open(region_handle *l, const char *path, size_t extra_size, int readonly, region_init_extra_fn init_extra,
                   void *arg, char *err, size_t errlen);
/* Claim a slot for the calling process (reclaiming dead processes' slots if none is free). */
int region_claim(region_handle *l);
/* Forget the slot in a forked child (its parent owns it); the child claims its own when needed. */
void region_forget_slot(region_handle *l);
/* Release everything the calling process charged and free its slot (normal exit). */
void region_release(region_handle *l);
/* Index of the device with this UUID, adding it if new; -1 if the table is full, -2 if the device-table
 * lock could not be taken within MS_LOCK_WAIT_MS (l->lock_error says why). */
int region_device(region_handle *l, const char *uuid, uint64_t physical_total);
/* Charge n bytes to device dev (host=1: the host-spill counter) if the total stays <= limit.
 * 0 on success, -1 if it would exceed the limit (nothing changed). */
int region_charge(region_handle *l, int dev, uint64_t n, uint64_t limit, int host);
/* Undo a charge of n bytes. */
void region_uncharge(region_handle *l, int dev, uint64_t n, int host);
/* Record that n bytes of this process's charge on dev are memory the driver took outside allocation calls
 * (give_back=1: n of them came back). Kept per slot and device, swept with the slot. */
void region_note_taken(region_handle *l, int dev, uint64_t n, int give_back);
/* Reclaim the slots of dead processes. Returns how many were reclaimed, or -1 on error (the region mutex
 * was not free within MS_LOCK_WAIT_MS: l->lock_error). */
int region_sweep(region_handle *l);
/* The same, even within the pause that follows a recount that timed out (an explicit request: a process
 * exiting, the agent). */
int region_sweep_now(region_handle *l);
/* How many slots still belong to dead processes (what the last sweep could not reclaim). */
int region_dead_slots(region_handle *l);
/* The periodic sweep: at most once per MS_SWEEP_PERIOD_MS per region (any process), never waiting for the
 * mutex. Cheap when not due (one clock read). */
void region_sweep_if_due(region_handle *l);
/* 1 if slot i's owner is alive (holds its lock), 0 if not. */
int region_slot_alive(const region_handle *l, int i);
static inline uint64_t region_bytes(uint64_t word) { return word & ~MS_FROZEN; }

/* libmemslice-region.so's exports (region*.c built with MS_REGION_ONLY), for Python (interposer/region.py
 * declares the same two to cffi). */
int memslice_region_sweep(const char *path, char *err, size_t errlen);
/* The calling process's pid in the initial PID namespace (the one NVML reports), 0 when unknown. */
int32_t region_host_pid(void);
int memslice_region_liveness(const char *path, unsigned char *alive, int n, char *err, size_t errlen);

#endif

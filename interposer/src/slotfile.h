/* Per-slot files (slotfile.c): a directory of one small file per slot, each written only by the slot's owner
 * (the node agent mounts only that file read-write into the owner's container; the directory and every other
 * file are read-only there), read by everyone with bounded preads, never mapped (an owner may truncate its own
 * file). A slot is live while its owner holds a classic POSIX write lock on one byte of its file (SF_LIVE_OFF,
 * past the data): the kernel drops it when the process dies, F_GETLK names the holder, and a read lock (which a
 * read-only descriptor can take) never counts as live. Reusable by any per-GPU board (elastic memory's today).
 * Files are named "<dir>/NN.slot" (two decimal digits). */
#ifndef MEMSLICE_SLOTFILE_H
#define MEMSLICE_SLOTFILE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define SF_SLOTS 64
#define SF_LIVE_OFF 4096          /* the liveness byte of every slot file */

struct sf_dir {
    int open;                     /* set by sf_open: a zeroed struct is a closed one (no descriptor 0 touched) */
    char path[384];               /* the directory */
    int own_fd;                   /* this process's own file, read-write (-1: none) */
    int own;                      /* its index (-1: none); written by this process even without the lock */
    int held;                     /* this process holds own's liveness lock */
    int peer[SF_SLOTS];           /* read-only descriptors of the others' files, opened lazily (-1: not yet) */
    uint64_t retry_ns[SF_SLOTS];  /* a missing file is looked for again after this (CLOCK_MONOTONIC) */
    uint64_t dir_seen_ns;         /* when the directory's mtime was last read (at most every 20 ms) */
    int64_t dir_mtime_ns;         /* ... and what it was: a change means files came (missing ones are retried) */
};

/* Open `dir` (created 0777 & ~umask when `create` and missing) and this process's slot: `want` >= 0 the one
 * assigned (opened read-write, never created by a tenant of the agent's directory), else the first whose
 * lock nobody holds (files created as needed when `create`). 0 with the slot's lock held, 1 with a file to
 * write but no lock (held by another process: asks only), 2 with neither, -1 with a message in err (no
 * directory). `size` bytes are zeroed in a newly claimed file. */
int sf_open(struct sf_dir *d, const char *dir, int want, int create, size_t size, char *err, unsigned errlen);
/* Close every descriptor (a forked child: its parent keeps the slot). */
void sf_close(struct sf_dir *d);
/* Read exactly len bytes at off of slot i's file (own or peer): 0, or -1 (missing, short: an empty slot). */
int sf_read(struct sf_dir *d, int i, void *buf, size_t len, off_t off);
/* Write len bytes at off into this process's own file (best effort): 0, or -1. */
int sf_write_own(const struct sf_dir *d, const void *buf, size_t len, off_t off);
/* Whether slot i's owner is alive (a write lock on its liveness byte; never this process's own slot). With
 * `pid`, the holder as the kernel names it in this PID namespace. */
int sf_alive(struct sf_dir *d, int i, int32_t *pid);

#endif

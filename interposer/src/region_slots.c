/* The region's process table: claiming a slot (its byte lock is the process's liveness token), releasing it,
 * who holds it (identity, liveness), and the device table; and libmemslice-region.so's exports for Python
 * (a sweep, liveness of every slot). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "region_int.h"


/* Whether slot i's process lives: it holds the slot's byte lock (the kernel drops it when the process dies). */
int region_slot_alive(const region_handle *l, int i) {
    if (i == l->slot) return 1;
    /* F_GETLK never reports the caller's own locks: a slot another handle of this process holds (the simulated
     * libcuda and libnvidia-ml each open the node's region) would look dead. Ours while we live. */
    if (LOAD(&l->r->slot[i].pid) == (int32_t)getpid()) return 1;
    return region_lock_holder(l->fd, MS_LOCK_BASE + (uint64_t)i, 1) != -1;
}


/* This process's pid in the initial PID namespace, the one the driver (and NVML) reports, or 0 when it
 * cannot be known from inside: it is getpid() in the initial namespace (inode 0xEFFFFFFC, fixed by the
 * kernel), else the first NSpid entry when this process's /proc shows more than one level (the /proc of an
 * outer namespace). A container with its own /proc shows one level only: then 0. */
static int32_t outer_pid(void) {
    char ns[64], buf[2048];
    ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
    if (n > 0) {
        ns[n] = 0;
        if (strcmp(ns, "pid:[4026531836]") == 0) return (int32_t)getpid();
    }
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    const char *line = strstr(buf, "\nNSpid:");
    if (!line) return 0;
    char *end;
    long first = strtol(line + 7, &end, 10);
    while (*end == ' ' || *end == '\t') end++;
    return (first > 0 && first <= INT32_MAX && *end >= '0' && *end <= '9') ? (int32_t)first : 0;
}

/* This process's pid as the driver and NVML report it (0 when unknown). */
int32_t region_host_pid(void) { return outer_pid(); }

/* Who holds a slot, for people and the node agent: pids (ours and the host's), start time, command name. */
static void fill_identity(struct ms_slot *s) {
    s->pid = (int32_t)getpid();
    s->host_pid = outer_pid();
    s->started_at = (uint64_t)time(NULL);
    memset(s->comm, 0, sizeof s->comm);
    FILE *f = fopen("/proc/self/comm", "re");
    if (f) {
        if (fgets(s->comm, sizeof s->comm, f)) s->comm[strcspn(s->comm, "\n")] = 0;
        fclose(f);
    }
}

/* Try to take slot i: its byte lock first (so two processes can never both own it), then its state. */
static int try_claim(region_handle *l, int i) {
    struct ms_slot *s = &l->r->slot[i];
    if (LOAD(&s->state) != MS_SLOT_FREE) return 0;
    if (region_byte_lock(l->fd, MS_LOCK_BASE + (uint64_t)i, F_WRLCK) < 0) return 0;
    uint32_t expect = MS_SLOT_FREE;
    if (!CAS(&s->state, &expect, (uint32_t)MS_SLOT_LIVE)) {
        region_byte_lock(l->fd, MS_LOCK_BASE + (uint64_t)i, F_UNLCK);
        return 0;
    }
    fill_identity(s);
    ADD(&s->generation, 1);
    uint32_t h = LOAD(&l->r->hdr.slot_hwm);
    while ((uint32_t)i + 1 > h && !CAS(&l->r->hdr.slot_hwm, &h, (uint32_t)i + 1)) {}
    l->slot = i;
    return 1;
}

/* Claim a free slot for this process (sweeping dead ones once if the table is full). 0, or -1. */
int region_claim(region_handle *l) {
    if (l->slot >= 0) return 0;
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < MS_MAX_SLOTS; i++)
            if (try_claim(l, i)) return 0;
        if (region_sweep(l) <= 0) break; /* nothing reclaimed: the table is really full */
    }
    return -1;
}

/* A forked child: the slot is its parent's (the byte lock is not inherited); claim another when needed. */
void region_forget_slot(region_handle *l) { l->slot = -1; }

/* Give back everything this process's slot holds, and the slot itself (a normal exit). */
void region_release(region_handle *l) {
    if (!l->r || l->slot < 0) return;
    struct ms_slot *s = &l->r->slot[l->slot];
    uint32_t nd = ndev(l->r);
    for (uint32_t d = 0; d < nd; d++) {
        uint64_t b = LOAD(&s->device_bytes[d]), h = LOAD(&s->host_bytes[d]);
        region_note_taken(l, (int)d, LOAD(&s->driver_taken[d]), 1);
        if (b) region_uncharge(l, (int)d, b, 0);
        if (h) region_uncharge(l, (int)d, h, 1);
    }
    int i = l->slot;
    region_free_slot(s);
    l->slot = -1;
    region_byte_lock(l->fd, MS_LOCK_BASE + (uint64_t)i, F_UNLCK);
}

/* Appends to the device table take their own byte lock, not the region mutex: the mutex is held for
 * whole sweeps (a recount may wait MS_RECOUNT_WAIT_MS), and a process stopped in one must not keep the
 * container's other processes from registering a GPU. This lock is held for a few instructions, and the
 * kernel drops it if its holder dies (a half-written entry past ndevices is simply written again). */
int region_device(region_handle *l, const char *uuid, uint64_t physical_total) {
    struct ms_region *r = l->r;
    uint32_t nd = ndev(r);
    for (uint32_t d = 0; d < nd; d++)
        if (strncmp(r->dev[d].uuid, uuid, MS_UUID_LEN) == 0) return (int)d;
    if (region_byte_lock_bounded(l->fd, MS_DEVICE_LOCK_BYTE) < 0) {
        l->lock_error = errno == EAGAIN ? ETIMEDOUT : errno;
        return -2;
    }
    int found = -1;
    nd = ndev(r);
    for (uint32_t d = 0; d < nd && found < 0; d++)
        if (strncmp(r->dev[d].uuid, uuid, MS_UUID_LEN) == 0) found = (int)d;
    if (found < 0 && nd < MS_MAX_DEVICES) {
        struct ms_device *dv = &r->dev[nd];
        snprintf(dv->uuid, sizeof dv->uuid, "%s", uuid);
        dv->physical_total = physical_total;
        STORE(&r->hdr.ndevices, nd + 1); /* published after the entry is complete */
        found = (int)nd;
    }
    region_byte_lock(l->fd, MS_DEVICE_LOCK_BYTE, F_UNLCK);
    return found;
}

#ifdef MS_REGION_ONLY
/* ---- libmemslice-region.so: what Python needs beyond reading the mapped struct ------------------ */
#define EXPORT __attribute__((visibility("default")))

/* Reclaim dead processes' usage in the region file at `path`. Returns the count, or -1. */
EXPORT int memslice_region_sweep(const char *path, char *err, size_t errlen) {
    region_handle l;
    if (region_open(&l, path, 0, 0, NULL, NULL, err, errlen) < 0) {
        /* the simulator's file carries extra state: reopen with its recorded size */
        region_handle ro;
        if (region_open(&ro, path, 0, 1, NULL, NULL, err, errlen) < 0) return -1;
        size_t extra = ro.r->hdr.extra_size;
        munmap(ro.r, ro.map_size);
        close(ro.fd);
        if (region_open(&l, path, extra, 0, NULL, NULL, err, errlen) < 0) return -1;
    }
    int n = region_sweep_now(&l);
    munmap(l.r, l.map_size);
    close(l.fd);
    return n;
}

/* Fill alive[i] (i < n) with 1 when slot i is held by a live process. Returns 0, or -1. */
EXPORT int memslice_region_liveness(const char *path, unsigned char *alive, int n, char *err, size_t errlen) {
    region_handle l;
    if (region_open(&l, path, 0, 1, NULL, NULL, err, errlen) < 0) return -1;
    for (int i = 0; i < n && i < MS_MAX_SLOTS; i++)
        alive[i] = LOAD(&l.r->slot[i].state) == MS_SLOT_LIVE && region_slot_alive(&l, i);
    munmap(l.r, l.map_size);
    close(l.fd);
    return 0;
}
#endif

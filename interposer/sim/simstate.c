/* The simulated node's state (see simstate.h for the files and who writes which): opened once per process,
 * on first use, by either simulated library. */
#define _GNU_SOURCE
#include "simstate.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cuda_abi.h"
#include "ms_size.h"

static struct sim g_sim;
static struct sim *g_ready;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* The memory each GPU sets aside (NVML v2's `reserved`): MEMSLICE_SIM_RESERVED for every GPU, else 480 MiB
 * per 80 GiB as on an H100 (81,559 MiB in NVML, 81,079 MiB in CUDA). MiB, or -1 with a message. */
static long reserved_mib(uint64_t total, char *err, size_t errlen) {
    const char *v = getenv("MEMSLICE_SIM_RESERVED");
    uint64_t b = 0;
    if (!v || !*v) return (long)((total >> 20) * 3 / 512);
    if (strcmp(v, "0") != 0 && (ms_parse_size_n(v, -1, &b) < 0 || b > total)) {
        snprintf(err, errlen, "MEMSLICE_SIM_RESERVED=%s is not valid; use a size below the GPU's (%s)", v, MS_SIZE_HELP);
        return -1;
    }
    return (long)(b >> 20);
}

/* Parse "SIZE[:NUMA][:mig],...[;nvlink=..][;pcie=..]" — e.g. "16GiB,24GiB:1,80GiB:0:mig". SIZE is what CUDA
 * reports (the allocatable memory); NVML's total adds the reserved memory; the options after ';' are the
 * topology (simtopo.c). */
int sim_parse_gpus(const char *spec, struct sim_node *node, char *err, size_t errlen) {
    char list[sizeof node->config];
    if (strlen(spec) >= sizeof node->config) {
        snprintf(err, errlen, "MEMSLICE_SIM_GPUS is longer than %zu characters; describe fewer GPUs",
                 sizeof node->config - 1);
        return -1;
    }
    snprintf(list, sizeof list, "%s", spec);
    char *opts = strchr(list, ';');
    if (opts) *opts++ = 0;
    const char *p = list;
    unsigned n = 0;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char item[96];
        if (len == 0 || len >= sizeof item) goto bad;
        memcpy(item, p, len);
        item[len] = 0;
        if (n >= SIM_MAX_GPUS) {
            snprintf(err, errlen, "MEMSLICE_SIM_GPUS=%s lists more than %d GPUs", spec, SIM_MAX_GPUS);
            return -1;
        }
        struct sim_gpu *g = &node->gpu[n];
        memset(g, 0, sizeof *g);
        char *save = NULL, *tok = strtok_r(item, ":", &save);
        if (!tok || ms_parse_size(tok, &g->total) < 0 || g->total < (1ull << 20)) goto bad;
        while ((tok = strtok_r(NULL, ":", &save))) {
            if (strcmp(tok, "mig") == 0) g->mig = 1;
            else {
                char *end;
                long v = strtol(tok, &end, 10);
                if (*end || v < 0 || v > 63) goto bad;
                g->numa = (int32_t)v;
            }
        }
        unsigned char b[16];
        if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) {
            for (int i = 0; i < 16; i++) b[i] = (unsigned char)(rand() ^ getpid() ^ (i * 37));
        }
        b[6] = (unsigned char)((b[6] & 0x0f) | 0x40); /* shaped like a v4 UUID, as real ones are */
        b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
        snprintf(g->uuid, sizeof g->uuid,
                 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
                 b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
        snprintf(g->name, sizeof g->name, "Simulated GPU %lluGiB (memslice)",
                 (unsigned long long)(g->total >> 30));
        g->pci_bus = 0x10 + n * 0x10;
        long rmib = reserved_mib(g->total, err, errlen);
        if (rmib < 0) return -1;
        g->reserved_mib = (uint32_t)rmib;
        n++;
        if (!comma) break;
        p = comma + 1;
    }
    if (n == 0) goto bad;
    node->ngpus = n;
    snprintf(node->config, sizeof node->config, "%s", spec);
    return sim_parse_topo(opts, spec, node, err, errlen);
bad:
    snprintf(err, errlen,
             "MEMSLICE_SIM_GPUS=%s is not valid; use a comma list of SIZE[:NUMA][:mig], e.g. 16GiB,24GiB:1 "
             "(SIZE: " MS_SIZE_HELP "), optionally followed by ;nvlink=0-1,2-3;pcie=0-1", spec);
    return -1;
}


#define PEER_MAX_FILES 1024                 /* peers read per scan: bounds the work of one charge */
#define LOCK_WAIT_NS (200ull * 1000 * 1000)  /* the node lock is waited for at most this long */
#define OLD_FORMAT_MAGIC MS_MAGIC           /* the single read-write node file of earlier versions */

/* ---- the node description ------------------------------------------------------------------------- */
/* Is s a NUL-terminated string within n bytes? */
static int bounded_str(const char *s, size_t n) { return memchr(s, 0, n) != NULL; }

/* Does a description read from disk make sense? Everything a later call indexes or prints is checked. */
static int valid_node(const struct sim_node *n) {
    if (n->magic != SIM_NODE_MAGIC || n->ngpus == 0 || n->ngpus > SIM_MAX_GPUS) return 0;
    if (!bounded_str(n->config, sizeof n->config)) return 0;
    for (unsigned g = 0; g < n->ngpus; g++) {
        const struct sim_gpu *x = &n->gpu[g];
        if (!bounded_str(x->uuid, sizeof x->uuid) || strncmp(x->uuid, "GPU-", 4) != 0) return 0;
        if (!bounded_str(x->name, sizeof x->name)) return 0;
        if (x->total < (1ull << 20) || x->total > (1ull << 50) || x->numa < 0 || x->numa > 63 || x->mig > 1 ||
            x->reserved_mib > (x->total >> 20))
            return 0;
    }
    return sim_topo_valid(n);
}

/* pread exactly n bytes at off (a short file or an error is a failure). */
static int pread_full(int fd, void *buf, size_t n, off_t off) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, off + (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

/* Read a node description: a file written before the topology part existed (shorter by it) reads as one
 * without topology. 0, or -1 if the file is shorter still or unreadable. */
static int read_node(int fd, struct sim_node *n) {
    size_t got = 0, want = sizeof *n;
    while (got < want) {
        ssize_t r = pread(fd, (char *)n + got, want - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    if (got < offsetof(struct sim_node, topo)) return -1;
    if (got < want) memset(&n->topo, 0, sizeof n->topo);
    return 0;
}

/* Open a file for reading that someone else may have replaced with a symlink, FIFO or directory. */
static int open_regular(int dirfd, const char *path, int flags) {
    int fd = openat(dirfd, path, flags | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))) {
        close(fd);
        errno = EINVAL;
        return -1;
    }
    return fd;
}

/* Create the description once: written to a private file, then linked into place, so a reader never sees
 * a half-written one and two creators cannot both win (link fails with EEXIST for the second). */
static int create_node(const char *path, const char *spec, char *err, size_t errlen) {
    struct sim_node n;
    memset(&n, 0, sizeof n);
    if (sim_parse_gpus(spec, &n, err, errlen) < 0) return -1;
    n.magic = SIM_NODE_MAGIC;
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%.250s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(err, errlen, "cannot create %.250s: %s", path, strerror(errno));
        return -1;
    }
    int ok = write(fd, &n, sizeof n) == (ssize_t)sizeof n;
    close(fd);
    if (ok && link(tmp, path) < 0 && errno != EEXIST) ok = 0;
    unlink(tmp);
    if (!ok) snprintf(err, errlen, "cannot create %.250s: %s", path, strerror(errno));
    return ok ? 0 : -1;
}

/* Open and validate the description into s->node_copy; create it if absent. */
static int open_node(struct sim *s, const char *path, const char *spec) {
    char err[400];
    int fd = open_regular(AT_FDCWD, path, O_RDONLY);
    if (fd < 0 && errno == ENOENT) {
        if (create_node(path, spec, err, sizeof err) < 0) {
            snprintf(s->error, sizeof s->error, "memslice-sim: %s", err);
            return -1;
        }
        fd = open_regular(AT_FDCWD, path, O_RDONLY);
    }
    if (fd < 0) {
        snprintf(s->error, sizeof s->error, "memslice-sim: cannot open %.250s: %s", path, strerror(errno));
        return -1;
    }
    uint32_t magic = 0;
    if (read_node(fd, &s->node_copy) < 0 || !valid_node(&s->node_copy)) {
        pread_full(fd, &magic, sizeof magic, 0);
        snprintf(s->error, sizeof s->error,
                 magic == OLD_FORMAT_MAGIC
                     ? "memslice-sim: %s was written by an older memslice (one shared read-write file); delete it"
                     : "memslice-sim: %s is not a valid simulator node file (truncated or overwritten); "
                       "delete it to start a new simulated node",
                 path);
        close(fd);
        return -1;
    }
    s->node = &s->node_copy;
    s->node_fd = fd;
    return 0;
}

/* Events are appended by the agent (or `memslice sim xid`) to the node file: re-read the ring from it. */
void sim_refresh_events(struct sim *s) {
    struct sim_node fresh;
    if (read_node(s->node_fd, &fresh) < 0 || !valid_node(&fresh) ||
        fresh.ngpus != s->node->ngpus)
        return;
    for (int i = 0; i < SIM_MAX_EVENTS; i++) {
        struct sim_event *e = &s->node->events[i];
        if (__atomic_load_n(&e->seq, __ATOMIC_ACQUIRE) == fresh.events[i].seq) continue;
        __atomic_store_n(&e->seq, 0, __ATOMIC_RELEASE);
        e->gpu = fresh.events[i].gpu;
        e->type = fresh.events[i].type;
        e->data = fresh.events[i].data;
        __atomic_store_n(&e->seq, fresh.events[i].seq, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&s->node->event_seq, fresh.event_seq, __ATOMIC_RELEASE);
}

/* An OFD lock on one byte of fd, waited for at most LOCK_WAIT_NS; 0 if taken. */
static int lock_bounded(int fd, off_t byte) {
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = byte, .l_len = 1};
    struct timespec nap = {0, 1000 * 1000};
    for (uint64_t waited = 0; waited < LOCK_WAIT_NS; waited += (uint64_t)nap.tv_nsec) {
        if (fcntl(fd, F_OFD_SETLK, &fl) == 0) return 0;
        if (errno != EAGAIN && errno != EACCES && errno != EINTR) return -1;
        nanosleep(&nap, NULL);
    }
    return -1;
}

/* Release what lock_bounded took. */
static void unlock_byte(int fd, off_t byte) {
    struct flock fl = {.l_type = F_UNLCK, .l_whence = SEEK_SET, .l_start = byte, .l_len = 1};
    fcntl(fd, F_OFD_SETLK, &fl);
}

/* Append an Xid to the node file's ring under its lock: the event first, then the sequence that publishes it. */
int sim_inject_xid(struct sim *s, unsigned int gpu, uint64_t xid) {
    if (gpu >= s->node->ngpus) return -1;
    int fd = open_regular(AT_FDCWD, s->state_path, O_RDWR);
    if (fd < 0) return -1;
    int rc = -1;
    struct sim_node n;
    if (lock_bounded(fd, 0) == 0) {
        if (read_node(fd, &n) == 0 && valid_node(&n)) {
            uint64_t seq = n.event_seq + 1;
            struct sim_event e = {seq, gpu, 0, nvmlEventTypeXidCriticalError, xid};
            off_t slot = (off_t)offsetof(struct sim_node, events) + (off_t)((seq % SIM_MAX_EVENTS) * sizeof e);
            if (pwrite(fd, &e, sizeof e, slot) == (ssize_t)sizeof e &&
                pwrite(fd, &seq, sizeof seq, (off_t)offsetof(struct sim_node, event_seq)) == (ssize_t)sizeof seq)
                rc = 0;
        }
        unlock_byte(fd, 0);
    }
    close(fd);
    return rc;
}

/* ---- peers: the other containers' usage regions, read defensively -------------------------------------- */
struct peer_head { struct ms_header hdr; struct ms_device dev[MS_MAX_DEVICES]; };

/* Read and check a peer region's header and device table; 0 if usable. */
static int read_peer_head(int fd, struct peer_head *h) {
    if (pread_full(fd, h, sizeof *h, 0) < 0) return -1;
    if (h->hdr.magic != MS_MAGIC || h->hdr.header_size != sizeof(struct ms_header) ||
        h->hdr.device_size != sizeof(struct ms_device) || h->hdr.slot_size != sizeof(struct ms_slot) ||
        h->hdr.ndevices > MS_MAX_DEVICES || h->hdr.slot_hwm > MS_MAX_SLOTS)
        return -1;
    return 0;
}

/* Does any process still hold a slot lock in this region? (F_GETLK needs no write access.) */
static int peer_has_live_owner(int fd) {
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = (off_t)MS_LOCK_BASE,
                       .l_len = MS_MAX_SLOTS};
    if (fcntl(fd, F_GETLK, &fl) < 0) return 0;
    return fl.l_type != F_UNLCK;
}

/* Is peer slot i's owner alive (holds its lock byte)? A read-only fd is enough for F_GETLK. */
static int slot_alive_fd(int fd, int i) {
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = (off_t)(MS_LOCK_BASE + (uint64_t)i),
                       .l_len = 1};
    if (fcntl(fd, F_GETLK, &fl) < 0) return 0;
    return fl.l_type != F_UNLCK;
}

/* The peer's device entry for the node's GPU g (matched by UUID, never trusted by index), or -1. */
static int peer_dev(const struct sim *s, const struct peer_head *h, int g) {
    for (uint32_t d = 0; d < h->hdr.ndevices; d++)
        if (strncmp(h->dev[d].uuid, s->node->gpu[g].uuid, sizeof h->dev[d].uuid) == 0) return (int)d;
    return -1;
}

typedef void (*peer_fn)(struct sim *s, int fd, const struct peer_head *h, void *arg);

/* The peer regions, kept open between charges (a charge then costs one pread and one F_GETLK per peer, not a
 * directory listing and an open); the directory is re-listed at most once a second, so a container that has
 * just started is counted within a second. Holding these fds is harmless: this process holds no lock on a
 * peer's file, so closing one drops nothing. */
#define PEER_RESCAN_NS (1000ull * 1000 * 1000)
struct peer_fd { int fd; dev_t dev; ino_t ino; };
static struct peer_fd g_peer[PEER_MAX_FILES];
static int g_npeer;
static uint64_t g_peer_listed_ns; /* 0: never listed */
static pthread_mutex_t g_peer_mu = PTHREAD_MUTEX_INITIALIZER;

/* Monotonic nanoseconds, for the re-listing period. */
static uint64_t mono_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* The fd already open for this inode (taken out of the old list), or a new one; -1 if unusable. */
static int reuse_or_open(int dfd, const char *rel, const struct stat *st) {
    for (int k = 0; k < g_npeer; k++)
        if (g_peer[k].fd >= 0 && g_peer[k].dev == st->st_dev && g_peer[k].ino == st->st_ino) {
            int fd = g_peer[k].fd;
            g_peer[k].fd = -1;
            return fd;
        }
    int fd = open_regular(dfd, rel, O_RDONLY);
    struct stat now;
    if (fd >= 0 && (fstat(fd, &now) < 0 || now.st_dev != st->st_dev || now.st_ino != st->st_ino)) {
        close(fd); /* replaced between the stat and the open */
        fd = -1;
    }
    return fd;
}

/* Re-list the peers directory (NAME.usage or DIR/sim.usage entries). Called with g_peer_mu held. */
static void list_peers(struct sim *s) {
    static struct peer_fd next[PEER_MAX_FILES];
    int n = 0;
    DIR *dir = opendir(s->peers);
    struct stat own;
    int have_own = fstat(s->usage.fd, &own) == 0;
    struct dirent *de;
    for (int seen = 0; dir && seen < PEER_MAX_FILES && (de = readdir(dir)); seen++) {
        if (de->d_name[0] == '.') continue;
        char rel[300];
        size_t len = strlen(de->d_name);
        if (len > 6 && strcmp(de->d_name + len - 6, ".usage") == 0) snprintf(rel, sizeof rel, "%s", de->d_name);
        else snprintf(rel, sizeof rel, "%s/sim.usage", de->d_name);
        /* Our own region is skipped before it is opened: closing any fd of a file drops this process's POSIX
         * locks on it, and the slot lock is what tells others this process is alive. */
        struct stat st;
        if (fstatat(dirfd(dir), rel, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode) ||
            (have_own && st.st_dev == own.st_dev && st.st_ino == own.st_ino))
            continue;
        int fd = reuse_or_open(dirfd(dir), rel, &st);
        if (fd >= 0) next[n++] = (struct peer_fd){fd, st.st_dev, st.st_ino};
    }
    if (dir) closedir(dir);
    for (int k = 0; k < g_npeer; k++)
        if (g_peer[k].fd >= 0) close(g_peer[k].fd); /* gone or replaced */
    memcpy(g_peer, next, (size_t)n * sizeof next[0]);
    g_npeer = n;
}

/* Visit every valid peer region with a live owner (this container's own region excluded). `fresh`: list the
 * directory now (NVML and cuMemGetInfo, which must show a container that just started); charges accept a
 * listing up to a second old. */
static void scan_peers(struct sim *s, peer_fn fn, void *arg, int fresh) {
    if (!s->peers[0]) return;
    pthread_mutex_lock(&g_peer_mu);
    uint64_t now = mono_ns();
    if (fresh || !g_peer_listed_ns || now - g_peer_listed_ns >= PEER_RESCAN_NS) {
        list_peers(s);
        g_peer_listed_ns = now;
    }
    for (int k = 0; k < g_npeer; k++) {
        struct peer_head h;
        if (read_peer_head(g_peer[k].fd, &h) == 0 && peer_has_live_owner(g_peer[k].fd)) fn(s, g_peer[k].fd, &h, arg);
    }
    pthread_mutex_unlock(&g_peer_mu);
}

struct used_arg { int g; uint64_t sum; };

/* Add a peer's use of GPU g, clamped to the GPU's size (a garbage counter cannot overflow the sum). */
static void add_used(struct sim *s, int fd, const struct peer_head *h, void *arg) {
    (void)fd;
    struct used_arg *a = arg;
    int d = peer_dev(s, h, a->g);
    if (d < 0) return;
    uint64_t total = s->node->gpu[a->g].total, u = region_bytes(h->dev[d].used);
    if (u > total) u = total;
    a->sum = a->sum + u > total ? total : a->sum + u;
}

/* The other containers' device use of GPU g, clamped to its size. */
static uint64_t peers_used(struct sim *s, int g, int fresh) {
    struct used_arg a = {g, 0};
    scan_peers(s, add_used, &a, fresh);
    return a.sum;
}

/* Node-wide use of GPU g: what cuMemGetInfo and NVML report as used. */
uint64_t sim_used(struct sim *s, int g) {
    uint64_t own = region_bytes(__atomic_load_n(&s->usage.r->dev[g].used, __ATOMIC_SEQ_CST));
    return own + peers_used(s, g, 1);
}

struct proc_arg { int g; sim_process_fn fn; void *arg; };

/* Report one live slot's use of GPU g under the PID the driver would give (the host PID when known). */
static void report_slot(const struct ms_slot *sl, int d, struct proc_arg *a) {
    uint64_t b = __atomic_load_n(&sl->device_bytes[d], __ATOMIC_RELAXED);
    if (!b) return;
    int32_t pid = sl->host_pid > 0 ? sl->host_pid : sl->pid;
    if (pid > 0) a->fn(a->arg, (uint32_t)pid, b);
}

/* A peer's live processes: slots read in bounded chunks, liveness checked on each slot's lock byte. */
static void peer_processes(struct sim *s, int fd, const struct peer_head *h, void *arg) {
    struct proc_arg *a = arg;
    int d = peer_dev(s, h, a->g);
    if (d < 0) return;
    off_t base = (off_t)offsetof(struct ms_region, slot);
    for (uint32_t i = 0; i < h->hdr.slot_hwm; i++) {
        struct ms_slot sl;
        if (pread_full(fd, &sl, sizeof sl, base + (off_t)i * (off_t)sizeof sl) < 0) return;
        if (sl.state != MS_SLOT_LIVE || !slot_alive_fd(fd, (int)i)) continue;
        if (sl.device_bytes[d] > s->node->gpu[a->g].total) sl.device_bytes[d] = s->node->gpu[a->g].total;
        report_slot(&sl, d, a);
    }
}

/* This container's live processes (dead ones reclaimed first), then the peers'. */
void sim_for_each_process(struct sim *s, int g, sim_process_fn fn, void *arg) {
    struct proc_arg a = {g, fn, arg};
    region_sweep(&s->usage);
    uint32_t hwm = __atomic_load_n(&s->usage.r->hdr.slot_hwm, __ATOMIC_ACQUIRE);
    for (uint32_t i = 0; i < hwm && i < MS_MAX_SLOTS; i++) {
        struct ms_slot *sl = &s->usage.r->slot[i];
        if (__atomic_load_n(&sl->state, __ATOMIC_SEQ_CST) != MS_SLOT_LIVE || !region_slot_alive(&s->usage, (int)i))
            continue;
        report_slot(sl, g, &a);
    }
    scan_peers(s, peer_processes, &a, 1);
}

/* ---- opening ---------------------------------------------------------------------------------------------- */
/* This container's usage region: devices registered in the node's GPU order, so index g is GPU g. */
static int open_usage(struct sim *s, const char *path) {
    char err[400];
    if (region_open(&s->usage, path, 0, 0, NULL, NULL, err, sizeof err) < 0) {
        snprintf(s->error, sizeof s->error, "memslice-sim: %s", err);
        return -1;
    }
    for (unsigned g = 0; g < s->node->ngpus; g++)
        if (region_device(&s->usage, s->node->gpu[g].uuid, s->node->gpu[g].total) != (int)g) {
            snprintf(s->error, sizeof s->error, "memslice-sim: %.200s belongs to another simulated node (its GPU table "
                     "differs from %.200s); delete it", path, s->state_path);
            return -1;
        }
    return 0;
}

/* Read the configuration from the environment; 0, or -1 with s->error set. */
static int read_env(struct sim *s, const char **spec, char *usage, size_t ulen, char *lock, size_t llen) {
    *spec = getenv("MEMSLICE_SIM_GPUS");
    if (!*spec || !**spec) *spec = "16GiB";
    const char *path = getenv("MEMSLICE_SIM_STATE");
    const char *u = getenv("MEMSLICE_SIM_USAGE"), *l = getenv("MEMSLICE_SIM_LOCK"), *p = getenv("MEMSLICE_SIM_PEERS");
    const char *names[] = {"MEMSLICE_SIM_STATE", "MEMSLICE_SIM_USAGE", "MEMSLICE_SIM_LOCK", "MEMSLICE_SIM_PEERS"};
    const char *vals[] = {path, u, l, p};
    for (int i = 0; i < 4; i++)
        if (vals[i] && strlen(vals[i]) > 240) {
            snprintf(s->error, sizeof s->error, "memslice-sim: %s is longer than 240 characters; use a shorter path",
                     names[i]);
            return -1;
        }
    if (path && *path) snprintf(s->state_path, sizeof s->state_path, "%s", path);
    else snprintf(s->state_path, sizeof s->state_path, "/tmp/memslice-sim-%u.state", (unsigned)getuid());
    if (u && *u) snprintf(usage, ulen, "%s", u);
    else snprintf(usage, ulen, "%s.usage", s->state_path);
    if (l && *l) snprintf(lock, llen, "%s", l);
    else snprintf(lock, llen, "%s.lock", s->state_path);
    snprintf(s->peers, sizeof s->peers, "%s", p ? p : "");
    s->context_overhead = SIM_CONTEXT_OVERHEAD_DEFAULT;
    const char *ov = getenv("MEMSLICE_SIM_CONTEXT_OVERHEAD");
    if (ov && *ov && strcmp(ov, "0") == 0) s->context_overhead = 0;
    else if (ov && *ov && ms_parse_size_n(ov, -1, &s->context_overhead) < 0) {
        snprintf(s->error, sizeof s->error, "memslice-sim: MEMSLICE_SIM_CONTEXT_OVERHEAD=%s is not valid; use %s",
                 ov, MS_SIZE_HELP);
        return -1;
    }
    s->driver_version = SIM_DRIVER_VERSION_DEFAULT;
    const char *dv = getenv("MEMSLICE_SIM_DRIVER_VERSION");
    if (dv && *dv) s->driver_version = atoi(dv);
    return 0;
}

/* Open everything once per process; on failure s->error says why and g_ready stays NULL. */
static void open_sim(void) {
    struct sim *s = &g_sim;
    const char *spec;
    char usage[300], lock[300];
    s->node_fd = s->lock_fd = s->usage.fd = -1;
    if (read_env(s, &spec, usage, sizeof usage, lock, sizeof lock) < 0) return;
    if (open_node(s, s->state_path, spec) < 0) return;
    if (open_usage(s, usage) < 0) return;
    if (s->peers[0]) s->lock_fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0666);
    if (strcmp(s->node->config, spec) != 0 && getenv("MEMSLICE_SIM_GPUS"))
        fprintf(stderr, "memslice-sim: %s was created with MEMSLICE_SIM_GPUS=%s; ignoring %s\n", s->state_path,
                s->node->config, spec);
    g_ready = s;
}

/* A forked child does not own its parent's slot (the lock is not inherited): it claims its own. */
static void after_fork_child(void) {
    pthread_mutex_init(&g_peer_mu, NULL); /* another thread may have held it at the fork */
    if (g_ready) region_forget_slot(&g_ready->usage);
}

/* A normal exit returns this process's memory at once. */
static void release_at_exit(void) {
    if (g_ready) region_release(&g_ready->usage);
}

/* A real driver frees a process's memory the moment it dies; the simulator does it at the next
 * opportunity: when another process starts, when memory runs out, and when NVML is asked. */
static void init_once(void) {
    open_sim();
    if (g_ready) {
        region_sweep(&g_ready->usage);
        atexit(release_at_exit);
    }
    pthread_atfork(NULL, NULL, after_fork_child);
}

/* The process-wide simulator, opened on first use. */
struct sim *sim_get(void) {
    pthread_once(&g_once, init_once);
    return g_ready;
}

const char *sim_error(void) { return g_sim.error[0] ? g_sim.error : "memslice-sim: not initialised"; }

/* Charge device memory against what the node has left: the other containers' use is read under the node
 * lock (bounded wait; without it, two containers could both take the last free bytes), and this container's
 * region charges atomically against the rest. */
static int charge_device(struct sim *s, int g, uint64_t n) {
    if (!s->peers[0]) { /* one region for the whole node (local use): its atomic charge is exact, no lock */
        int rc = region_charge(&s->usage, g, n, s->node->gpu[g].total, 0);
        if (rc < 0 && region_sweep(&s->usage) > 0) rc = region_charge(&s->usage, g, n, s->node->gpu[g].total, 0);
        return rc;
    }
    int locked = s->lock_fd >= 0 && lock_bounded(s->lock_fd, 0) == 0;
    uint64_t total = s->node->gpu[g].total, others = peers_used(s, g, 0);
    uint64_t cap = others < total ? total - others : 0;
    int rc = region_charge(&s->usage, g, n, cap, 0);
    /* out of memory: a dead process may still be holding some, reclaim and retry once */
    if (rc < 0 && region_sweep(&s->usage) > 0) rc = region_charge(&s->usage, g, n, cap, 0);
    if (locked) unlock_byte(s->lock_fd, 0);
    return rc;
}

/* Physical charge for this process; claims the process's slot on first use. */
int sim_charge(struct sim *s, int g, uint64_t n, int host) {
    if (s->usage.slot < 0 && region_claim(&s->usage) < 0) return -1;
    if (host) return region_charge(&s->usage, g, n, UINT64_MAX >> 2, 1);
    return charge_device(s, g, n);
}

/* Undo a charge of this process. */
void sim_uncharge(struct sim *s, int g, uint64_t n, int host) {
    if (s->usage.slot >= 0) region_uncharge(&s->usage, g, n, host);
}

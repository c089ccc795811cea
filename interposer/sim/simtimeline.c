/* The simulated GPUs' compute timeline: see simtimeline.h for the model and where the state lives. Built into
 * both simulated libraries (libcuda submits and waits, libnvidia-ml reads utilisation); each library instance
 * of a process is its own set of clients. */
#define _GNU_SOURCE
#include "simtimeline.h"

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

#include "memslice_region.h"
#include "simstate.h"

#define TL_MAGIC 0x544c4e31u                    /* "TLN1" */
#define TL_NONE 0xffffffffu
#define TL_LOCK_BASE 1                           /* lock byte 1+g: GPU g's block (byte 0 is the node lock) */
#define TL_LIVE_BASE 4096                        /* lock byte LIVE_BASE + g*TL_CLIENTS + i: client i lives */
#define TL_DATA_BASE 65536                       /* GPU g's block at DATA_BASE + g*sizeof(struct tl_gpu) */
#define TL_LOCK_WAIT_NS (200ull * 1000 * 1000)
#define TL_MIN_NAP_NS (20ull * 1000)
#define TL_LOCALS 64

struct tl_mark_rec { uint64_t target, done; };   /* target 0: empty; done 0: not yet */
struct tl_client_rec {
    uint64_t token;                 /* the owning process's random token; 0: free */
    uint32_t pid, local;            /* pid as the driver reports it; the owner's local slot + 1 */
    uint64_t submitted, consumed;   /* cumulative ns of work queued and executed */
    uint64_t busy;                  /* ns executed since claimed */
    uint64_t bkt, bkt_busy, prev_busy; /* busy in sample period bkt, and in the one before it */
    uint64_t mark_seq;
    struct tl_mark_rec mark[TL_MARKS];
};
struct tl_gpu {
    uint32_t magic, cur;            /* cur: the client holding the timeslice, or TL_NONE */
    uint64_t last, slice_end;       /* advanced up to `last`; cur's slice ends at slice_end */
    uint64_t busy, retired;         /* ns executed in all; by clients since released */
    uint64_t bkt, bkt_busy, prev_busy;
    struct tl_client_rec c[TL_CLIENTS];
};

/* This process's side: the file, its token, and one local slot per (context, GPU). */
struct tl_local { const void *ctx; int gpu; int client; uint64_t last, seen; struct tl_point *owner[TL_MARKS]; };
struct tl_state {
    pthread_mutex_t mu;             /* the locals, the buffer, and the file session */
    int fd;                         /* the node lock file; -1 not open yet, -2 unusable */
    uint64_t token;
    struct tl_local local[TL_LOCALS];
    struct tl_gpu blk;              /* the block of the current session */
    int exit_hook;
    int launched;                   /* a submit happened (read without the lock) */
    int warned;                     /* said once that a GPU had no client left */
};
static struct tl_state g_tl = {.mu = PTHREAD_MUTEX_INITIALIZER, .fd = -1};

/* Monotonic nanoseconds: the GPU's clock. */
static uint64_t mono_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* A fresh random token (never 0), per process and again in a forked child. */
static uint64_t new_token(void) {
    uint64_t t = 0;
    if (getrandom(&t, sizeof t, 0) != (ssize_t)sizeof t) t = mono_ns() ^ ((uint64_t)getpid() << 32);
    return t ? t : 1;
}

/* ---- the file and its locks ---------------------------------------------------------------------------- */
/* A forked child shares its parent's open file description (and so its OFD locks): it opens its own. */
static void tl_after_fork(void) {
    pthread_mutex_init(&g_tl.mu, NULL);
    if (g_tl.fd >= 0) close(g_tl.fd);
    g_tl.fd = -1;
    g_tl.token = new_token();
    memset(g_tl.local, 0, sizeof g_tl.local);
}

static void tl_release_all(void);

/* Open the node lock file once (created if absent, as the node lock is); -1 if unusable. */
static int tl_fd(void) {
    if (g_tl.fd != -1) return g_tl.fd;
    g_tl.fd = -2;
    struct sim *s = sim_get();
    if (!s) return -1;
    char path[300];
    const char *l = getenv("MEMSLICE_SIM_LOCK");
    if (l && *l) snprintf(path, sizeof path, "%s", l);
    else snprintf(path, sizeof path, "%s.lock", s->state_path);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0666);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))) {
        close(fd);
        fd = -1;
    }
    if (fd < 0) return -1;
    g_tl.fd = fd;
    if (!g_tl.token) g_tl.token = new_token();
    if (!g_tl.exit_hook) {
        g_tl.exit_hook = 1;
        pthread_atfork(NULL, NULL, tl_after_fork);
        atexit(tl_release_all);
    }
    return fd;
}

/* An OFD lock operation on one byte (F_WRLCK/F_UNLCK), without waiting. */
static int byte_lock(int fd, off_t byte, short type) {
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = byte, .l_len = 1};
    return fcntl(fd, F_OFD_SETLK, &fl);
}

/* Take a byte lock, waiting at most TL_LOCK_WAIT_NS (naps from 5 us, doubling to 1 ms: sessions are short). */
static int byte_lock_bounded(int fd, off_t byte) {
    uint64_t nap = 5000, waited = 0;
    while (byte_lock(fd, byte, F_WRLCK) < 0) {
        if ((errno != EAGAIN && errno != EACCES && errno != EINTR) || waited >= TL_LOCK_WAIT_NS) return -1;
        struct timespec ts = {0, (long)nap};
        nanosleep(&ts, NULL);
        waited += nap;
        if (nap < 1000000) nap *= 2;
    }
    return 0;
}

/* Does another open file description hold client i's liveness byte? (its owner process is alive) */
static int byte_held(int fd, off_t byte) {
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = byte, .l_len = 1};
    if (fcntl(fd, F_OFD_GETLK, &fl) < 0) return 1; /* cannot tell: assume alive */
    return fl.l_type != F_UNLCK;
}

/* Where client i of GPU g's liveness lock byte and GPU g's block are in the file. */
static off_t live_byte(int g, uint32_t i) { return (off_t)(TL_LIVE_BASE + (uint64_t)g * TL_CLIENTS + i); }
static off_t block_off(int g) { return (off_t)(TL_DATA_BASE + (uint64_t)g * sizeof(struct tl_gpu)); }

/* ---- the block: validation, sample periods, scheduling ------------------------------------------------ */
/* Is the block read from the shared file consistent? (a tenant may have written anything there) */
static int valid_block(const struct tl_gpu *b, uint64_t now) {
    if (b->magic != TL_MAGIC || (b->cur != TL_NONE && b->cur >= TL_CLIENTS) || b->last > now ||
        b->slice_end > b->last + TL_SLICE_NS)
        return 0;
    for (int i = 0; i < TL_CLIENTS; i++) {
        const struct tl_client_rec *c = &b->c[i];
        if (c->token && (c->consumed > c->submitted || c->submitted - c->consumed > TL_MAX_PENDING_NS ||
                         c->local > TL_LOCALS))
            return 0;
    }
    return 1;
}

/* Add n busy ns in the sample period starting at p to a (period, busy, previous busy) triple. */
static void add_busy(uint64_t *bkt, uint64_t *busy, uint64_t *prev, uint64_t p, uint64_t n) {
    if (*bkt != p) {
        *prev = *bkt + TL_PERIOD_NS == p ? *busy : 0;
        *busy = 0;
        *bkt = p;
    }
    *busy += n;
}

/* Busy ns in the period before p_now, from a triple last written at any time. */
static uint64_t prev_busy(uint64_t bkt, uint64_t busy, uint64_t prev, uint64_t p_now) {
    if (bkt == p_now) return prev;
    return bkt + TL_PERIOD_NS == p_now ? busy : 0;
}

/* Client i executes from t for r ns: its counters, the sample periods, and the events it passes. */
static void run(struct tl_gpu *b, uint32_t i, uint64_t t, uint64_t r) {
    struct tl_client_rec *c = &b->c[i];
    uint64_t c0 = c->consumed;
    c->consumed += r;
    c->busy += r;
    b->busy += r;
    for (int k = 0; k < TL_MARKS; k++) {
        struct tl_mark_rec *m = &c->mark[k];
        if (m->target && !m->done && m->target <= c->consumed) m->done = t + (m->target > c0 ? m->target - c0 : 0);
    }
    for (uint64_t a = t, end = t + r; a < end;) {
        uint64_t p = a - a % TL_PERIOD_NS, seg = (p + TL_PERIOD_NS < end ? p + TL_PERIOD_NS : end) - a;
        add_busy(&b->bkt, &b->bkt_busy, &b->prev_busy, p, seg);
        add_busy(&c->bkt, &c->bkt_busy, &c->prev_busy, p, seg);
        a += seg;
    }
}

/* A client is released (its owner is gone or done with it): its queued work vanishes. */
static void drop(struct tl_gpu *b, uint32_t i) {
    b->retired += b->c[i].busy;
    memset(&b->c[i], 0, sizeof b->c[i]);
    if (b->cur == i) b->cur = TL_NONE;
}

/* Is client i's owner alive? Ours are; another's holds its byte. `seen` caches the answer per advance. */
static int alive(const struct tl_gpu *b, int g, uint32_t i, uint32_t *seen) {
    if (b->c[i].token == g_tl.token || (*seen & (1u << i))) return 1;
    if (!byte_held(g_tl.fd, live_byte(g, i))) return 0;
    *seen |= 1u << i;
    return 1;
}

/* The next client after `from` (round-robin, `from` itself last) with queued work and a live owner; dead
 * clients met on the way are dropped. */
static uint32_t next_client(struct tl_gpu *b, int g, uint32_t from, uint32_t *seen) {
    uint32_t start = from == TL_NONE ? TL_CLIENTS - 1 : from;
    for (uint32_t k = 1; k <= TL_CLIENTS; k++) {
        uint32_t i = (start + k) % TL_CLIENTS;
        struct tl_client_rec *c = &b->c[i];
        if (!c->token || c->submitted == c->consumed) continue;
        if (alive(b, g, i, seen)) return i;
        drop(b, i);
    }
    return TL_NONE;
}

/* Replay the GPU from b->last to now: the slice holder runs until its slice ends or its queue empties; then
 * the next client with work gets a slice; a client alone keeps the GPU. A dead client is dropped when found:
 * as the holder, at the start of a replay; otherwise when its turn comes. */
static void advance(struct tl_gpu *b, int g, uint64_t now) {
    uint64_t t = b->last;
    uint32_t seen = 0;
    /* a holder that died is dropped before the replay (it would otherwise keep an idle GPU busy) */
    if (b->cur != TL_NONE && b->c[b->cur].token && !alive(b, g, b->cur, &seen)) drop(b, b->cur);
    while (t < now) {
        struct tl_client_rec *c = b->cur == TL_NONE ? NULL : &b->c[b->cur];
        if (!c || c->submitted == c->consumed) {
            b->cur = next_client(b, g, b->cur, &seen);
            if (b->cur == TL_NONE) break;
            b->slice_end = t + TL_SLICE_NS;
            continue;
        }
        if (t >= b->slice_end) {
            uint32_t next = next_client(b, g, b->cur, &seen);
            /* alone, it keeps the GPU: for whole slices up to now (a replay costs O(1) per holder, not per slice) */
            uint64_t slices = next == b->cur && now - t > TL_SLICE_NS ? (now - t) / TL_SLICE_NS + 1 : 1;
            b->cur = next;
            b->slice_end = t + slices * TL_SLICE_NS;
            continue;
        }
        uint64_t r = (now < b->slice_end ? now : b->slice_end) - t, left = c->submitted - c->consumed;
        if (r > left) r = left;
        run(b, b->cur, t, r);
        t += r;
    }
    b->last = now;
}

/* ---- sessions: the block of GPU g, read, advanced to now, and written back, under its lock -------------- */
/* Begin a session on GPU g (caller holds g_tl.mu): 0 with g_tl.blk current and *now set, or -1. */
static int session_begin(int g, uint64_t *now) {
    struct sim *s = sim_get();
    int fd = tl_fd();
    if (!s || fd < 0 || g < 0 || (unsigned)g >= s->node->ngpus || byte_lock_bounded(fd, TL_LOCK_BASE + g) < 0)
        return -1;
    struct tl_gpu *b = &g_tl.blk;
    ssize_t got = pread(fd, b, sizeof *b, block_off(g));
    if (got < 0) got = 0;
    if ((size_t)got < sizeof *b) memset((char *)b + got, 0, sizeof *b - (size_t)got);
    *now = mono_ns();
    if (!valid_block(b, *now)) {
        memset(b, 0, sizeof *b);
        b->magic = TL_MAGIC;
        b->cur = TL_NONE;
        b->last = *now;
    }
    advance(b, g, *now);
    return 0;
}

/* Write the block back and unlock GPU g. */
static void session_end(int g) {
    ssize_t w = pwrite(g_tl.fd, &g_tl.blk, sizeof g_tl.blk, block_off(g));
    (void)w; /* a failed write loses this update, nothing more */
    byte_lock(g_tl.fd, TL_LOCK_BASE + g, F_UNLCK);
}

/* The local slot's client in the current block, or NULL if it has none (never claimed, or reset). */
static struct tl_client_rec *client_of(int local) {
    struct tl_local *L = &g_tl.local[local];
    if (L->client < 0 || L->client >= TL_CLIENTS) return NULL;
    struct tl_client_rec *c = &g_tl.blk.c[L->client];
    return c->token == g_tl.token && c->local == (uint32_t)local + 1 ? c : NULL;
}

/* Is client index i already used by another of this process's local slots? */
static int ours_elsewhere(int g, uint32_t i) {
    for (int k = 0; k < TL_LOCALS; k++)
        if (g_tl.local[k].ctx && g_tl.local[k].gpu == g && g_tl.local[k].client == (int)i) return 1;
    return 0;
}

/* Claim a client for a local slot: a free one, or one whose owner died; its counters continue the slot's. */
static struct tl_client_rec *claim(int g, int local) {
    struct tl_gpu *b = &g_tl.blk;
    struct tl_local *L = &g_tl.local[local];
    if (L->client >= 0) { /* its record was reset: the byte it still holds goes back */
        byte_lock(g_tl.fd, live_byte(g, (uint32_t)L->client), F_UNLCK);
        L->client = -1;
    }
    for (uint32_t i = 0; i < TL_CLIENTS; i++) {
        struct tl_client_rec *c = &b->c[i];
        if (c->token == g_tl.token || ours_elsewhere(g, i)) continue;
        if (c->token && byte_held(g_tl.fd, live_byte(g, i))) continue;
        if (byte_lock(g_tl.fd, live_byte(g, i), F_WRLCK) < 0) continue; /* a live owner whose record was reset */
        if (c->token) drop(b, i);
        memset(c, 0, sizeof *c);
        int32_t pid = region_host_pid();
        *c = (struct tl_client_rec){.token = g_tl.token, .pid = (uint32_t)(pid > 0 ? pid : getpid()),
                                    .local = (uint32_t)local + 1, .submitted = L->last, .consumed = L->last};
        L->client = (int)i;
        return c;
    }
    return NULL;
}

/* ---- the API ------------------------------------------------------------------------------------------- */
/* The local slot of (ctx, gpu), created on first use. */
int tl_client(const void *ctx, int gpu, struct tl_ref *out) {
    int free_slot = -1, found = -1;
    pthread_mutex_lock(&g_tl.mu);
    for (int k = 0; k < TL_LOCALS && found < 0; k++) {
        if (g_tl.local[k].ctx == ctx && g_tl.local[k].gpu == gpu) found = k;
        else if (!g_tl.local[k].ctx && free_slot < 0) free_slot = k;
    }
    if (found < 0 && free_slot >= 0) {
        found = free_slot;
        memset(&g_tl.local[found], 0, sizeof g_tl.local[found]);
        g_tl.local[found] = (struct tl_local){.ctx = ctx, .gpu = gpu, .client = -1};
    }
    pthread_mutex_unlock(&g_tl.mu);
    *out = (struct tl_ref){gpu, found};
    return found < 0 ? -1 : 0;
}

/* Queue ns of work behind everything the client has queued. */
int tl_submit(struct tl_ref r, uint64_t ns, uint64_t *target) {
    if (r.local < 0 || r.local >= TL_LOCALS) { *target = 0; return -1; }
    uint64_t now;
    int rc = -1;
    pthread_mutex_lock(&g_tl.mu);
    struct tl_local *L = &g_tl.local[r.local];
    if (session_begin(r.gpu, &now) == 0) {
        struct tl_client_rec *c = client_of(r.local);
        if (!c) c = claim(r.gpu, r.local);
        if (!c && !__atomic_exchange_n(&g_tl.warned, 1, __ATOMIC_RELAXED))
            fprintf(stderr, "memslice-sim: GPU %d already has %d contexts with kernels; this one's kernels take no "
                    "GPU time\n", r.gpu, TL_CLIENTS);
        if (c && c->submitted - c->consumed + ns > TL_MAX_PENDING_NS) rc = -2;
        else if (c) {
            __atomic_store_n(&g_tl.launched, 1, __ATOMIC_RELAXED);
            c->submitted += ns;
            L->last = c->submitted;
            rc = 0;
        }
        session_end(r.gpu);
    }
    *target = L->last;
    pthread_mutex_unlock(&g_tl.mu);
    return rc;
}

/* A relaxed flag: the copy paths' test costs one load. */
int tl_launched(void) { return __atomic_load_n(&g_tl.launched, __ATOMIC_RELAXED); }

/* The client's last completion point. */
uint64_t tl_last(struct tl_ref r) {
    if (r.local < 0 || r.local >= TL_LOCALS) return 0;
    pthread_mutex_lock(&g_tl.mu);
    uint64_t v = g_tl.local[r.local].last;
    pthread_mutex_unlock(&g_tl.mu);
    return v;
}

/* How much of target is left for the client (0: reached, gone, or the timeline cannot be read). Caller
 * holds g_tl.mu. */
static uint64_t left_locked(struct tl_ref r, uint64_t target, uint64_t *now) {
    struct tl_local *L = &g_tl.local[r.local];
    *now = mono_ns();
    if (target <= L->seen || session_begin(r.gpu, now) < 0) return 0;
    struct tl_client_rec *c = client_of(r.local);
    uint64_t left = c && c->consumed < target ? target - c->consumed : 0;
    if (c) L->seen = c->consumed;
    session_end(r.gpu);
    return left;
}

/* Whether the client has consumed target. */
int tl_reached(struct tl_ref r, uint64_t target) {
    if (r.local < 0 || r.local >= TL_LOCALS) return 1;
    uint64_t now;
    pthread_mutex_lock(&g_tl.mu);
    uint64_t left = left_locked(r, target, &now);
    pthread_mutex_unlock(&g_tl.mu);
    return left == 0;
}

/* Sleep until the client could at the earliest have consumed target (what is left, if it ran alone), then
 * look again: neighbours only make it later, so no wait oversleeps the completion. */
int tl_wait(struct tl_ref r, uint64_t target, uint64_t max_ns) {
    if (r.local < 0 || r.local >= TL_LOCALS) return 0;
    uint64_t start = mono_ns();
    for (;;) {
        uint64_t now;
        pthread_mutex_lock(&g_tl.mu);
        uint64_t left = left_locked(r, target, &now);
        pthread_mutex_unlock(&g_tl.mu);
        if (!left) return 0;
        if (now - start >= max_ns) return -1;
        uint64_t nap = left < TL_MIN_NAP_NS ? TL_MIN_NAP_NS : left;
        if (nap > max_ns - (now - start)) nap = max_ns - (now - start);
        struct timespec ts = {(time_t)(nap / 1000000000ull), (long)(nap % 1000000000ull)};
        nanosleep(&ts, NULL);
    }
}

/* Record an event: complete now if the client's queue is already past target, else a shared mark whose
 * completion time the scheduler fills in. A slot is reused only once its mark is complete; the event that
 * owned it gets that time first. */
void tl_mark(struct tl_ref r, uint64_t target, struct tl_point *p) {
    *p = (struct tl_point){.ref = r, .target = target, .mark = -1};
    uint64_t now = mono_ns();
    if (r.local < 0 || r.local >= TL_LOCALS) { p->done = 1; p->ns = now; return; }
    pthread_mutex_lock(&g_tl.mu);
    struct tl_local *L = &g_tl.local[r.local];
    struct tl_client_rec *c = NULL;
    int open = target > L->seen && session_begin(r.gpu, &now) == 0;
    if (open) c = client_of(r.local);
    if (!c || c->consumed >= target) {
        p->done = 1;
        p->ns = now;
    } else {
        int slot = (int)(c->mark_seq % TL_MARKS);
        struct tl_mark_rec *m = &c->mark[slot];
        struct tl_point *old = L->owner[slot];
        if (!m->target || m->done) {
            if (old && m->target && old->mark == slot && old->target == m->target && !old->done) {
                old->done = 1;
                old->ns = m->done;
            }
            *m = (struct tl_mark_rec){.target = target};
            c->mark_seq++;
            p->mark = slot;
            L->owner[slot] = p;
        }
    }
    if (open) session_end(r.gpu);
    pthread_mutex_unlock(&g_tl.mu);
}

/* The completion time of an event, once complete. */
int tl_point_time(struct tl_point *p, uint64_t *ns) {
    if (p->done) { *ns = p->ns; return 1; }
    struct tl_ref r = p->ref;
    uint64_t now;
    pthread_mutex_lock(&g_tl.mu);
    if (session_begin(r.gpu, &now) == 0) {
        struct tl_client_rec *c = client_of(r.local);
        if (!c || c->consumed >= p->target) {
            const struct tl_mark_rec *m = c && p->mark >= 0 ? &c->mark[p->mark] : NULL;
            p->ns = m && m->target == p->target && m->done ? m->done : now;
            p->done = 1;
        }
        session_end(r.gpu);
    } else {
        p->done = 1; /* no timeline to wait for */
        p->ns = mono_ns();
    }
    if (p->done && p->mark >= 0 && g_tl.local[r.local].owner[p->mark] == p) g_tl.local[r.local].owner[p->mark] = NULL;
    pthread_mutex_unlock(&g_tl.mu);
    *ns = p->ns;
    return p->done;
}

/* An event is destroyed (or re-recorded): its slot no longer names it. */
void tl_forget(struct tl_point *p) {
    pthread_mutex_lock(&g_tl.mu);
    if (p->ref.local >= 0 && p->ref.local < TL_LOCALS && p->mark >= 0 && g_tl.local[p->ref.local].owner[p->mark] == p)
        g_tl.local[p->ref.local].owner[p->mark] = NULL;
    pthread_mutex_unlock(&g_tl.mu);
}

/* Release one local slot's client (caller holds g_tl.mu). */
static void release_local(int k) {
    struct tl_local *L = &g_tl.local[k];
    uint64_t now;
    if (L->client >= 0 && session_begin(L->gpu, &now) == 0) {
        if (client_of(k)) drop(&g_tl.blk, (uint32_t)L->client);
        session_end(L->gpu);
    }
    if (L->client >= 0) byte_lock(g_tl.fd, live_byte(L->gpu, (uint32_t)L->client), F_UNLCK);
    memset(L, 0, sizeof *L);
}

/* A context is destroyed: its clients on every GPU go. */
void tl_release_ctx(const void *ctx) {
    pthread_mutex_lock(&g_tl.mu);
    for (int k = 0; k < TL_LOCALS; k++)
        if (g_tl.local[k].ctx == ctx) release_local(k);
    pthread_mutex_unlock(&g_tl.mu);
}

/* A normal exit releases every client at once (a killed process's are dropped when next scheduled). */
static void tl_release_all(void) {
    if (pthread_mutex_trylock(&g_tl.mu) != 0) return; /* another thread is mid-session: the kernel's unlock will do */
    for (int k = 0; k < TL_LOCALS; k++)
        if (g_tl.local[k].ctx) release_local(k);
    pthread_mutex_unlock(&g_tl.mu);
}

/* ---- NVML and figures ---------------------------------------------------------------------------------- */
/* The GPU's busy share of the last complete sample period, rounded to a percent. */
unsigned int tl_util(int gpu) {
    uint64_t now, busy = 0;
    pthread_mutex_lock(&g_tl.mu);
    if (session_begin(gpu, &now) == 0) {
        const struct tl_gpu *b = &g_tl.blk;
        busy = prev_busy(b->bkt, b->bkt_busy, b->prev_busy, now - now % TL_PERIOD_NS);
        session_end(gpu);
    }
    pthread_mutex_unlock(&g_tl.mu);
    uint64_t pct = (busy * 100 + TL_PERIOD_NS / 2) / TL_PERIOD_NS;
    return pct > 100 ? 100 : (unsigned int)pct;
}

/* The processes busy in the last complete period, summed over their clients (one sample per process). */
void tl_samples(int gpu, tl_sample_fn fn, void *arg) {
    uint32_t pid[TL_CLIENTS], n = 0, seen = 0;
    uint64_t busy[TL_CLIENTS], now, p_now = 0;
    pthread_mutex_lock(&g_tl.mu);
    if (session_begin(gpu, &now) == 0) {
        struct tl_gpu *b = &g_tl.blk;
        p_now = now - now % TL_PERIOD_NS;
        for (uint32_t i = 0; i < TL_CLIENTS; i++) {
            const struct tl_client_rec *c = &b->c[i];
            uint64_t v = c->token ? prev_busy(c->bkt, c->bkt_busy, c->prev_busy, p_now) : 0;
            if (c->token && !alive(b, gpu, i, &seen)) drop(b, i);
            if (!v || !c->token) continue;
            uint32_t k = 0;
            while (k < n && pid[k] != c->pid) k++;
            if (k == n) { pid[n] = c->pid; busy[n++] = 0; }
            busy[k] += v;
        }
        session_end(gpu);
    }
    pthread_mutex_unlock(&g_tl.mu);
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    uint64_t rt_ns = (uint64_t)rt.tv_sec * 1000000000ull + (uint64_t)rt.tv_nsec, mono = mono_ns();
    uint64_t ts_us = (rt_ns - (mono - p_now)) / 1000;
    for (uint32_t k = 0; k < n; k++) {
        uint64_t pct = (busy[k] * 100 + TL_PERIOD_NS / 2) / TL_PERIOD_NS;
        fn(arg, pid[k], pct > 100 ? 100 : (unsigned int)pct, ts_us);
    }
}

/* The timeline's figures for tests (simtimeline.h); dead clients found on the way are released first. */
SIM_EXPORT unsigned int memsliceSimTimeline(unsigned int gpu, unsigned long long *out, unsigned int n) {
    unsigned long long v[4 + 3 * TL_CLIENTS];
    unsigned int count = 0;
    uint64_t now;
    uint32_t seen = 0;
    pthread_mutex_lock(&g_tl.mu);
    if (gpu < SIM_MAX_GPUS && session_begin((int)gpu, &now) == 0) {
        struct tl_gpu *b = &g_tl.blk;
        v[0] = b->busy, v[1] = b->retired, v[2] = b->last, v[3] = 0, count = 4;
        for (uint32_t i = 0; i < TL_CLIENTS; i++) {
            const struct tl_client_rec *c = &b->c[i];
            if (c->token && !alive(b, (int)gpu, i, &seen)) drop(b, i);
            if (!c->token) continue;
            v[3]++;
            v[count++] = c->pid, v[count++] = c->busy, v[count++] = c->submitted - c->consumed;
        }
        session_end((int)gpu);
    }
    pthread_mutex_unlock(&g_tl.mu);
    for (unsigned int k = 0; k < count && k < n && out; k++) out[k] = v[k];
    return count;
}

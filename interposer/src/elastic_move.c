/* Elastic memory's mover: physical allocations in HBM or host memory, remapping a chunk at the same address,
 * and the background threads that answer neighbours' asks (swap out), bring memory back when HBM frees up
 * (swap in) and acknowledge asks at once. See elastic.c. */
#define _GNU_SOURCE
#include <string.h>
#include <unistd.h>

#include "elastic.h"
#include "elastic_vmm.h"

/* The mover's copy streams and its batch (only the background thread moves, under g_mu). */
static struct elastic_streams g_streams;
static struct elastic_batch g_batch;

/* A physical allocation of `size` bytes on this process's GPU, or in host memory. */
CUresult el_create_phys(CUmemGenericAllocationHandle *h, uint64_t size, int host) {
    return elastic_create_phys(h, size, host, g_ord);
}

/* Map a handle at va and give this process's GPU read-write access to it. */
CUresult el_map_rw(uint64_t va, uint64_t size, CUmemGenericAllocationHandle h) {
    return elastic_map_rw(va, size, h, g_ord);
}

/* The HBM the driver has free on this process's GPU (the evidence that HBM is short, never a neighbour's
 * claim); UINT64_MAX if the driver cannot say (then nothing is decided on it). */
uint64_t el_driver_free(void) {
    size_t fr = 0, tot = 0;
    return REAL(cuMemGetInfo_v2)(&fr, &tot) == CUDA_SUCCESS ? (uint64_t)fr : UINT64_MAX;
}

/* Add chunk i of r to the batch, to move to the new physical allocation nh. */
static void batch_add(struct erange *r, unsigned i, CUmemGenericAllocationHandle nh) {
    struct elastic_move *m = &g_batch.mv[g_batch.n++];
    *m = (struct elastic_move){.va = r->va + (uint64_t)i * EL_CHUNK, .len = chunk_len(r, i), .from = r->c[i].h,
                               .to = nh, .owner = r, .idx = i};
    r->c[i].moving = 1;
}

/* Move the batch's chunks to their new allocations (in host memory if to_host, else on the device) at the
 * same addresses (elastic_vmm.c: staged with the gate open, copied and remapped with it closed, cleaned up
 * with it open again); a chunk that could not move keeps its old mapping and bytes. Caller holds g_mu. The
 * bytes moved. */
static uint64_t move_batch(int to_host) {
    uint64_t t0 = now_ns(), moved = 0, n = 0;
    g_batch.ord = g_ord;
    if (elastic_move_stage(&g_batch) == 0) {
        if (el_gate_close() == 0) {
            elastic_move_remap(&g_batch, &g_streams);
            el_gate_open();
        }
    }
    for (unsigned k = 0; k < g_batch.n; k++) {
        struct elastic_move *m = &g_batch.mv[k];
        struct erange *r = m->owner;
        r->c[m->idx].moving = 0;
        if (!m->ok) continue;
        r->c[m->idx].h = m->to;
        r->c[m->idx].host = to_host;
        moved += m->len;
        n++;
    }
    elastic_move_finish(&g_batch);
    g_batch.n = 0;
    if (to_host) { g_resident -= moved; g_swapped += moved; }
    else { g_swapped -= moved; g_resident += moved; }
    if (!n) return 0;
    uint64_t dt = now_ns() - t0;
    if (to_host) { g_me.swap_outs += n; g_me.swap_out_ns += dt; }
    else { g_me.swap_ins += n; g_me.swap_in_ns += dt; }
    return moved;
}

/* What this process keeps in HBM whatever it is asked (issue 26): its request, always; idle, nothing only if
 * its pod opted in (idle_release). */
static uint64_t keep_floor(int idle) {
    return idle && g_cfg.idle_release ? 0 : g_cfg.request;
}

/* How much an ask makes this process move (pure): nothing if it may not take what this process holds above
 * its floor (an active tenant's burst goes only to an ask marked EB_ASK_BURST) or if HBM is not short (the
 * driver has the asker's whole need free: issue 25, an ask is no evidence); else the asked share, at most
 * what is still missing of the need, at most what lies above the floor. */
static uint64_t yield_amount(uint64_t bits, int idle, uint64_t free_b) {
    uint64_t share = EB_ASK_SHARE(bits) << 20, need = EB_ASK_NEED(bits) << 20, floor = keep_floor(idle);
    if ((!idle && !(bits & EB_ASK_BURST)) || g_resident <= floor || !share) return 0;
    if (free_b != UINT64_MAX && free_b >= need) return 0;
    uint64_t missing = free_b == UINT64_MAX ? share : need - free_b;
    uint64_t want = share < missing ? share : missing;
    return want < g_resident - floor ? want : g_resident - floor;
}

/* Record on the board that the asks first..seq could not be taken to host memory, and why (issue 26): their
 * askers read it before they fail a burst. Caller holds g_mu. */
static void note_refused(uint64_t first, uint64_t seq, uint64_t bytes, const struct host_verdict *v) {
    char a[32], t[400];
    g_note.seq = seq;
    g_note.first_seq = first;
    g_note.cause = v->cause == HOST_ROOM_CGROUP ? EB_REFUSED_CGROUP : EB_REFUSED_HOST;
    g_note.want_mib = (uint32_t)((bytes + (1ull << 20) - 1) >> 20);
    g_note.limit = v->limit;
    g_note.used = v->used;
    if (v->cause == HOST_ROOM_CGROUP) g_note.refused_cgroup++;
    else g_note.refused_host++;
    eb_put_note(&g_board, &g_note);
    shim_log(LOG_WARN, "memslice: elastic: could not take %s to host memory for a neighbour: %s; %s",
             fmt_bytes(bytes, a, sizeof a), host_room_text(v, t, sizeof t),
             v->cause == HOST_ROOM_CGROUP ? "raise this pod's memory limit" : "the node is short of memory");
}

/* The asks to answer now (issue 35: every assigned neighbour asks in its own file): those newer than the last
 * one answered from each asker, not from the future (a seq is the asker's CLOCK_MONOTONIC, the node's clock)
 * nor older than 30 s, each bounded by its asker's limit (el_bound_ask). What they want of this process is
 * the most any one of them wants; *first and *last span their seqs (0: none). */
static uint64_t pending_want(const struct eb_ask *asks, const struct eb_roster_ent *ent, uint64_t *handled, int idle,
                             uint64_t *first, uint64_t *last) {
    size_t fr = 0, tot = 0;
    int known = -1; /* the driver is asked only when an ask is pending (this runs every tick) */
    uint64_t now = now_ns(), want = 0, free_b = UINT64_MAX, gpu_mib = UINT32_MAX;
    *first = *last = 0;
    for (int j = 0; j < EB_SLOTS; j++) {
        uint64_t seq = asks[j].seq;
        if (!seq || seq <= handled[j] || seq > now || now - seq > 30000000000ull) continue;
        handled[j] = seq;
        if (known < 0 && (known = REAL(cuMemGetInfo_v2)(&fr, &tot) == CUDA_SUCCESS)) {
            free_b = (uint64_t)fr;
            gpu_mib = tot >> 20;
        }
        struct eb_slot s;
        uint64_t res = sf_read(&g_board.sf, j, &s, sizeof s, 0) == 0 && s.magic == EB_MAGIC && eb_alive(&g_board, j)
                       ? s.resident >> 20 : 0; /* a record nobody holds is no figure of the asker's */
        uint64_t w = yield_amount(el_bound_ask(asks[j].bytes, &ent[j], res, g_cfg.priority, gpu_mib), idle, free_b);
        if (w > want) want = w;
        if (!*first || seq < *first) *first = seq;
        if (seq > *last) *last = seq;
    }
    return want;
}

/* Answer the asks first..last: move chunks to host memory (the newest range's last chunks first) until `want`
 * is covered (at most one chunk more: the slack), never below the floor; nothing if the host side cannot
 * take that many bytes (issue 26: this process's cgroup, the host's memory). Caller holds g_mu. The bytes
 * moved. */
static uint64_t yield(uint64_t want, int idle, uint64_t first, uint64_t last) {
    uint64_t floor = keep_floor(idle), given = 0;
    if (!want) return 0;
    struct host_verdict v;
    uint64_t most = (want + EL_CHUNK - 1) / EL_CHUNK * EL_CHUNK; /* what moving whole chunks may take */
    if (host_room(most, &v) != HOST_ROOM_OK) {
        note_refused(first, last, most, &v);
        return 0;
    }
    CUmemGenericAllocationHandle nh;
    for (int more = 1; more && given < want;) { /* batches of ELASTIC_BATCH chunks */
        uint64_t planned = 0;
        for (struct erange *r = g_ranges; r && given + planned < want && g_batch.n < ELASTIC_BATCH; r = r->next)
            for (unsigned i = r->n; i-- > 0 && given + planned < want && g_batch.n < ELASTIC_BATCH;) {
                uint64_t len = chunk_len(r, i);
                if (r->c[i].host || r->c[i].moving || g_resident - planned < floor + len) continue;
                if (el_create_phys(&nh, len, 1) != CUDA_SUCCESS) continue;
                batch_add(r, i, nh);
                planned += len;
            }
        uint64_t moved = g_batch.n ? move_batch(1) : 0;
        given += moved;
        more = moved > 0;
    }
    if (given) g_yield_ns = coarse_ns(); /* the same clock as the activity stamp it is compared with */
    char a[32], b[32];
    shim_log(LOG_INFO, "memslice: elastic: %s moved to host memory for a neighbour that asked for %s (%s)",
             fmt_bytes(given, a, sizeof a), fmt_bytes(want, b, sizeof b),
             idle ? "idle" : "above the request");
    return given;
}

/* Whether another live tenant of the GPU goes first (then this process does not bring back bytes above its
 * own request, which would only be asked back): one short of its request (issue 26, "coming back": requests
 * first), or one with bytes in host memory that ran more recently than this process (bursts come back most
 * recently active tenant first). */
static int neighbour_first(uint64_t my_idle_ms, uint64_t len) {
    static struct eb_slot s[EB_SLOTS];
    int live[EB_SLOTS];
    uint64_t free_b = 0;
    eb_read_all(&g_board, s, live);
    el_apply_roster(s, live);
    for (int i = 0; i < EB_SLOTS; i++) {
        if (!live[i] || !s[i].swapped || now_ns() < g_skip_until[i]) continue;
        if (!(s[i].resident < s[i].request || s[i].idle_ms < my_idle_ms)) continue;
        /* a claim is no evidence (issue 35.4): wait only while HBM could not take both its bytes and this chunk */
        if (!free_b) free_b = el_driver_free();
        uint64_t theirs = s[i].resident < s[i].request ? s[i].request - s[i].resident : s[i].swapped;
        if (theirs > s[i].swapped) theirs = s[i].swapped;
        if (free_b == UINT64_MAX || free_b < theirs + len) return 1;
    }
    return 0;
}

/* The oldest host-resident chunk not already in the batch (the list is newest first; within a range, the
 * first chunk): the request is what was allocated first, so it comes back first. */
static struct erange *oldest_host(unsigned *idx) {
    struct erange *pick = NULL;
    for (struct erange *r = g_ranges; r; r = r->next)
        for (unsigned i = r->n; i-- > 0;)
            if (r->c[i].host && !r->c[i].moving) { pick = r; *idx = i; }
    return pick;
}

/* Whether a chunk of `len` may come back now, `planned` bytes being chosen already (issue 26, "coming back"):
 * within the request, always; a burst, only when this process did not yield it within EL_BACK_AFTER_MS (the
 * asker takes the room it made; nothing ping-pongs) and no neighbour goes first. *burst caches that answer
 * for the batch (-1: not asked yet; the board is read once). */
static int may_come_back(uint64_t planned, uint64_t len, int *burst) {
    if (g_resident + planned + len <= g_cfg.request) return 1;
    if (*burst < 0) {
        uint64_t my_idle = (now_ns() - __atomic_load_n(&g_last_call_ns, __ATOMIC_RELAXED)) / 1000000ull;
        uint64_t rest = g_swapped - planned, most = (uint64_t)ELASTIC_BATCH * EL_CHUNK;
        int yielded = g_yield_ns && coarse_ns() - g_yield_ns < EL_BACK_AFTER_MS * 1000000ull;
        *burst = !yielded && !neighbour_first(my_idle, rest < most ? rest : most);
    }
    return *burst;
}

/* HBM is full for the next chunk of `len` (nothing is gated): short of its request, ask neighbours, bursts
 * included; active with bursts in host memory, idle neighbours and lower priorities only (without waiting;
 * retried at most once a second). */
static void ask_for_room(uint64_t len) {
    static uint64_t last_ask;
    int within = g_resident + len <= g_cfg.request;
    if ((within || !el_is_idle()) && now_ns() - last_ask > 1000000000ull) {
        last_ask = now_ns();
        el_make_room(within ? g_cfg.request - g_resident : g_swapped, within, 0, NULL);
    }
}

/* Bring host-resident chunks back while HBM has room (issue 26, "coming back"): the request first, then the
 * bursts, only when no neighbour is short of its request and no more recently active neighbour waits for its
 * own; at most ELASTIC_BATCH chunks per tick, moved as one batch (the gate closes once, for the copies and the
 * remaps). Caller holds g_mu. */
static void swap_in(void) {
    if (!g_swapped) return;
    unsigned i = 0;
    uint64_t planned = 0;
    int burst = -1;
    struct erange *pick;
    CUmemGenericAllocationHandle nh;
    while (g_batch.n < ELASTIC_BATCH && (pick = oldest_host(&i))) {
        uint64_t len = chunk_len(pick, i);
        if (!may_come_back(planned, len, &burst)) break;
        if (el_create_phys(&nh, len, 0) != CUDA_SUCCESS) {
            if (!g_batch.n) ask_for_room(len);
            break;
        }
        batch_add(pick, i, nh);
        planned += len;
    }
    if (g_batch.n) move_batch(0);
}

/* The background thread: el_publish, answer asks, bring memory back. It makes CUDA calls in the context of the
 * elastic allocations. An ask is acknowledged at once by the acker (askers skip a slot that does not ack
 * within EL_ACK_MS: issue 25, a forged slot that never answers costs them that much, once), answered at most
 * once per EL_YIELD_GAP_MS (issue 25: asks are rate-limited; the asks of several neighbours pending at once
 * are answered together, each bounded by its asker's limit), the ticks between free for bringing this
 * process's own memory back. */
void *elastic_thread(void *arg) {
    (void)arg;
    REAL(cuCtxSetCurrent)(g_ctx);
    elastic_streams_init(&g_streams);
    uint64_t handled[EB_SLOTS] = {0}, answered_ns = 0;
    struct el_askers cache = {0};
    int from[EB_SLOTS];
    struct eb_roster_ent lim[EB_SLOTS];
    struct eb_ask asks[EB_SLOTS];
    for (;;) {
        int answer = now_ns() - answered_ns >= EL_YIELD_GAP_MS * 1000000ull;
        if (answer) {
            el_askers(&cache, from, lim);
            eb_asks_for_me(&g_board, from, asks);
        }
        pthread_mutex_lock(&g_mu);
        uint64_t done = 0, first = 0, last = 0;
        uint64_t want = answer ? pending_want(asks, lim, handled, el_is_idle(), &first, &last) : 0;
        if (last) {
            uint64_t moved = yield(want, el_is_idle(), first, last);
            answered_ns = now_ns();
            g_me.done_moved_mib = (uint32_t)((moved + (1ull << 20) - 1) >> 20);
            struct eb_answer an = {first, last, g_me.done_moved_mib, 0, 0};
            eb_put_answer(&g_board, &an);
            done = last;
        } else {
            swap_in();
        }
        el_drain_probe();
        el_publish(done);
        pthread_mutex_unlock(&g_mu);
        sleep_ms(TICK_MS);
    }
    return NULL;
}

/* The acker: acknowledges the newest ask addressed to this slot as soon as it is posted, even while the
 * background thread is in the middle of a move (askers skip a slot that does not acknowledge within
 * EL_ACK_MS). One pread per asking neighbour every 10 ms. */
void *elastic_acker(void *arg) {
    (void)arg;
    uint64_t seen = 0;
    struct el_askers cache = {0};
    int from[EB_SLOTS];
    struct eb_roster_ent lim[EB_SLOTS];
    struct eb_ask asks[EB_SLOTS];
    for (;;) {
        el_askers(&cache, from, lim);
        eb_asks_for_me(&g_board, from, asks);
        uint64_t now = now_ns(), newest = 0;
        for (int j = 0; j < EB_SLOTS; j++)
            if (asks[j].seq > newest && asks[j].seq <= now) newest = asks[j].seq;
        if (newest > seen) {
            __atomic_store_n(&g_acked, newest, __ATOMIC_RELAXED);
            eb_ack(&g_board, newest);
            seen = newest;
        }
        sleep_ms(10);
    }
    return NULL;
}

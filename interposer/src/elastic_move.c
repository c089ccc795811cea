/* Elastic memory's mover: the background threads that answer neighbours' asks (swap out), bring memory back when
 * HBM frees up (swap in) and acknowledge asks at once; what moves is decided here, chunks gathered into
 * batches of up to ELASTIC_BATCH, and each batch moved by elastic_vmm.c. See elastic.c. */
#define _GNU_SOURCE
#include <string.h>
#include <unistd.h>

#include "elastic.h"

/* Add chunk i of r to the batch, to move to the new physical allocation nh (pool slot `pool` - 1, mapped at
 * `at`; 0: nh is the chunk's own, staged by the move). */
static void batch_add(struct elastic_range *r, unsigned i, CUmemGenericAllocationHandle nh, int pool, CUdeviceptr at) {
    struct elastic_move *m = &g_es.batch.mv[g_es.batch.n++];
    *m = (struct elastic_move){.va = r->va + (uint64_t)i * ELASTIC_CHUNK, .len = elastic_chunk_len(r, i),
                               .from = r->c[i].h, .to = nh, .at = at, .to_pool = pool, .from_pool = r->c[i].pool,
                               .owner = r, .idx = i};
    r->c[i].moving = 1;
}

/* Say at info where a direction's moves spent their time so far (one line per batch; a stable format that
 * memslice.elastic.parse_move_phases reads: the GPU kit prints it). */
static void log_phases(int to_host, const struct elastic_phases *p) {
    shim_log(LOG_INFO,
             "memslice: elastic: move phases %s batches=%llu chunks=%llu create_ns=%llu stage_ns=%llu gate_ns=%llu "
             "copy_ns=%llu remap_ns=%llu finish_ns=%llu", to_host ? "out" : "in", (unsigned long long)p->batches,
             (unsigned long long)p->chunks, (unsigned long long)p->create, (unsigned long long)p->stage,
             (unsigned long long)p->gate, (unsigned long long)p->copy, (unsigned long long)p->remap,
             (unsigned long long)p->finish);
}

/* Create a new handle for a chunk of the batch, its time counted as the batch's create phase. */
static CUresult create_timed(CUmemGenericAllocationHandle *h, uint64_t len, int host) {
    uint64_t t = now_ns();
    CUresult rc = elastic_create_phys(h, len, host, g_es.ord);
    g_es.create_ns += now_ns() - t;
    return rc;
}

/* Host memory for chunk i of r moving out: a pooled chunk (pinned and mapped already, or pinned now into the
 * pool) for a whole chunk, else a handle of its own. Its time counts as the create phase. 0, or -1. */
static int host_chunk(struct elastic_range *r, unsigned i) {
    uint64_t len = elastic_chunk_len(r, i), t = now_ns();
    CUmemGenericAllocationHandle nh;
    CUdeviceptr at = 0;
    int slot = len == ELASTIC_CHUNK ? elastic_pool_get(&g_es.pool, &nh, &at) : -1;
    g_es.create_ns += now_ns() - t;
    if (slot < 0 && create_timed(&nh, len, 1) != CUDA_SUCCESS) return -1;
    batch_add(r, i, nh, slot + 1, at);
    return 0;
}

/* Move the batch's chunks to their new allocations (in host memory if to_host, else on the device) at the
 * same addresses (elastic_vmm.c: staged with the gate open, copied and remapped with it closed, cleaned up
 * with it open again); a chunk that could not move keeps its old mapping and bytes. Caller holds g_es.mu. The
 * bytes moved. */
static uint64_t move_batch(int to_host) {
    uint64_t t0 = now_ns(), moved = 0, n = 0, t1 = t0, t2 = t0;
    struct elastic_phases *ph = &g_es.phases[to_host ? 1 : 0];
    g_es.batch.ord = g_es.ord;
    g_es.batch.to_host = to_host;
    g_es.batch.copy_ns = g_es.batch.remap_ns = 0;
    if (elastic_move_stage(&g_es.batch) == 0) {
        t1 = t2 = now_ns();
        if (elastic_gate_close() == 0) {
            t2 = now_ns();
            elastic_move_remap(&g_es.batch, &g_es.streams);
            elastic_gate_open();
        } else t2 = now_ns();
    } else t1 = t2 = now_ns();
    for (unsigned k = 0; k < g_es.batch.n; k++) {
        struct elastic_move *m = &g_es.batch.mv[k];
        struct elastic_range *r = m->owner;
        r->c[m->idx].moving = 0;
        if (!m->ok) continue;
        r->c[m->idx].h = m->to;
        r->c[m->idx].pool = m->to_pool;
        r->c[m->idx].host = to_host;
        moved += m->len;
        n++;
    }
    uint64_t t3 = now_ns();
    elastic_move_finish(&g_es.batch, &g_es.pool);
    g_es.batch.n = 0;
    g_es.move_ns = now_ns();
    if (to_host) { g_es.resident -= moved; g_es.swapped += moved; }
    else { g_es.swapped -= moved; g_es.resident += moved; }
    uint64_t create = g_es.create_ns;
    g_es.create_ns = 0;
    if (!n) return 0;
    uint64_t t4 = now_ns(), dt = t4 - t0;
    if (to_host) { g_es.me.swap_outs += n; g_es.me.swap_out_ns += dt; }
    else { g_es.me.swap_ins += n; g_es.me.swap_in_ns += dt; }
    ph->batches++;
    ph->chunks += n;
    ph->create += create;
    ph->stage += t1 - t0;
    ph->gate += t2 - t1;
    ph->copy += g_es.batch.copy_ns;
    ph->remap += g_es.batch.remap_ns;
    ph->finish += t4 - t3;
    log_phases(to_host, ph);
    return moved;
}

/* What this process keeps in HBM whatever it is asked: its request, always; idle, nothing only if
 * its pod opted in (idle_release). */
static uint64_t keep_floor(int idle) {
    return idle && g_cfg.idle_release ? 0 : g_cfg.request;
}

/* How much an ask makes this process move (pure): nothing if it may not take what this process holds above
 * its floor (an active tenant's burst goes only to an ask marked ELASTIC_ASK_BURST) or if HBM is not short (the
 * driver has the asker's whole need free: an ask is no evidence); else the asked share, at most
 * what is still missing of the need, at most what lies above the floor. */
static uint64_t yield_amount(uint64_t bits, int idle, uint64_t free_b) {
    uint64_t share = ELASTIC_ASK_SHARE(bits) << 20, need = ELASTIC_ASK_NEED(bits) << 20, floor = keep_floor(idle);
    if ((!idle && !(bits & ELASTIC_ASK_BURST)) || g_es.resident <= floor || !share) return 0;
    if (free_b != UINT64_MAX && free_b >= need) return 0;
    uint64_t missing = free_b == UINT64_MAX ? share : need - free_b;
    uint64_t want = share < missing ? share : missing;
    return want < g_es.resident - floor ? want : g_es.resident - floor;
}

/* Record on the board that the asks first..seq could not be taken to host memory, and why: their
 * askers read it before they fail a burst. Caller holds g_es.mu. */
static void note_refused(uint64_t first, uint64_t seq, uint64_t bytes, const struct host_verdict *v) {
    char a[32], t[400];
    g_es.note.seq = seq;
    g_es.note.first_seq = first;
    g_es.note.cause = v->cause == HOST_ROOM_CGROUP ? ELASTIC_REFUSED_CGROUP : ELASTIC_REFUSED_HOST;
    g_es.note.want_mib = (uint32_t)((bytes + (1ull << 20) - 1) >> 20);
    g_es.note.limit = v->limit;
    g_es.note.used = v->used;
    if (v->cause == HOST_ROOM_CGROUP) g_es.note.refused_cgroup++;
    else g_es.note.refused_host++;
    elastic_board_put_note(&g_es.board, &g_es.note);
    shim_log(LOG_WARN, "memslice: elastic: could not take %s to host memory for a neighbour: %s; %s",
             fmt_bytes(bytes, a, sizeof a), host_room_text(v, t, sizeof t),
             v->cause == HOST_ROOM_CGROUP ? "raise this pod's memory limit" : "the node is short of memory");
}

/* The asks to answer now (every assigned neighbour asks in its own file): those newer than the last
 * one answered from each asker, not from the future (a seq is the asker's CLOCK_MONOTONIC, the node's clock)
 * nor older than 30 s, each bounded by its asker's limit (elastic_bound_ask). What they want of this process is
 * the most any one of them wants; *first and *last span their seqs (0: none). */
static uint64_t pending_want(const struct elastic_ask *asks, const struct elastic_roster_ent *ent, uint64_t *handled,
                             int idle, uint64_t *first, uint64_t *last) {
    size_t fr = 0, tot = 0;
    int known = -1; /* the driver is asked only when an ask is pending (this runs every tick) */
    uint64_t now = now_ns(), want = 0, free_b = UINT64_MAX, gpu_mib = UINT32_MAX;
    *first = *last = 0;
    for (int j = 0; j < ELASTIC_SLOTS; j++) {
        uint64_t seq = asks[j].seq;
        if (!seq || seq <= handled[j] || seq > now || now - seq > 30000000000ull) continue;
        handled[j] = seq;
        if (known < 0 && (known = REAL(cuMemGetInfo_v2)(&fr, &tot) == CUDA_SUCCESS)) {
            free_b = (uint64_t)fr;
            gpu_mib = tot >> 20;
        }
        struct elastic_slot s;
        uint64_t res = sf_read(&g_es.board.sf, j, &s, sizeof s, 0) == 0 && s.magic == ELASTIC_MAGIC &&
                       elastic_board_alive(&g_es.board, j)
                       ? s.resident >> 20 : 0; /* a record nobody holds is no figure of the asker's */
        uint64_t bits = elastic_bound_ask(asks[j].bytes, &ent[j], res, g_cfg.priority, gpu_mib);
        uint64_t w = yield_amount(bits, idle, free_b);
        if (w > want) want = w;
        if (!*first || seq < *first) *first = seq;
        if (seq > *last) *last = seq;
    }
    return want;
}

/* Answer the asks first..last: move chunks to host memory (the newest range's last chunks first) until `want`
 * is covered (at most one chunk more: the slack), never below the floor; nothing if the host side cannot
 * take that many bytes (this process's cgroup, the host's memory). Caller holds g_es.mu. The bytes
 * moved. */
static uint64_t yield(uint64_t want, int idle, uint64_t first, uint64_t last) {
    uint64_t floor = keep_floor(idle), given = 0;
    if (!want) return 0;
    struct host_verdict v;
    uint64_t most = (want + ELASTIC_CHUNK - 1) / ELASTIC_CHUNK * ELASTIC_CHUNK; /* what moving whole chunks may take */
    uint64_t pooled = elastic_pool_free_bytes(&g_es.pool); /* pinned already: charged to this cgroup */
    if (most > pooled && host_room(most - pooled, &v) != HOST_ROOM_OK) {
        note_refused(first, last, most, &v);
        return 0;
    }
    for (int more = 1; more && given < want;) { /* batches of ELASTIC_BATCH chunks */
        uint64_t planned = 0;
        for (struct elastic_range *r = g_es.ranges; r && given + planned < want && g_es.batch.n < ELASTIC_BATCH;
             r = r->next)
            for (unsigned i = r->n; i-- > 0 && given + planned < want && g_es.batch.n < ELASTIC_BATCH;) {
                uint64_t len = elastic_chunk_len(r, i);
                if (r->c[i].host || r->c[i].moving || g_es.resident - planned < floor + len) continue;
                if (host_chunk(r, i) == 0) planned += len;
            }
        uint64_t moved = g_es.batch.n ? move_batch(1) : 0;
        given += moved;
        more = moved > 0;
    }
    if (given) g_es.yield_ns = coarse_ns(); /* the same clock as the activity stamp it is compared with */
    char a[32], b[32];
    shim_log(LOG_INFO, "memslice: elastic: %s moved to host memory for a neighbour that asked for %s (%s)",
             fmt_bytes(given, a, sizeof a), fmt_bytes(want, b, sizeof b),
             idle ? "idle" : "above the request");
    return given;
}

/* Whether another live tenant of the GPU goes first (then this process does not bring back bytes above its
 * own request, which would only be asked back): one short of its request (requests
 * first), or one with bytes in host memory that ran more recently than this process (bursts come back most
 * recently active tenant first). */
static int neighbour_first(uint64_t my_idle_ms, uint64_t len) {
    static struct elastic_slot s[ELASTIC_SLOTS];
    int live[ELASTIC_SLOTS];
    uint64_t free_b = 0;
    elastic_board_read_all(&g_es.board, s, live);
    elastic_apply_roster(s, live);
    for (int i = 0; i < ELASTIC_SLOTS; i++) {
        if (!live[i] || !s[i].swapped || now_ns() < g_es.skip_until[i]) continue;
        if (!(s[i].resident < s[i].request || s[i].idle_ms < my_idle_ms)) continue;
        /* a claim is no evidence: wait only while HBM could not take both its bytes and this chunk */
        if (!free_b) free_b = elastic_driver_free();
        uint64_t theirs = s[i].resident < s[i].request ? s[i].request - s[i].resident : s[i].swapped;
        if (theirs > s[i].swapped) theirs = s[i].swapped;
        if (free_b == UINT64_MAX || free_b < theirs + len) return 1;
    }
    return 0;
}

/* The oldest host-resident chunk not already in the batch (the list is newest first; within a range, the
 * first chunk): the request is what was allocated first, so it comes back first. */
static struct elastic_range *oldest_host(unsigned *idx) {
    struct elastic_range *pick = NULL;
    for (struct elastic_range *r = g_es.ranges; r; r = r->next)
        for (unsigned i = r->n; i-- > 0;)
            if (r->c[i].host && !r->c[i].moving) { pick = r; *idx = i; }
    return pick;
}

/* Whether a chunk of `len` may come back now, `planned` bytes being chosen already ("coming back"):
 * within the request, always; a burst, only when this process did not yield it within ELASTIC_BACK_AFTER_MS (the
 * asker takes the room it made; nothing ping-pongs) and no neighbour goes first. *burst caches that answer
 * for the batch (-1: not asked yet; the board is read once). */
static int may_come_back(uint64_t planned, uint64_t len, int *burst) {
    if (g_es.resident + planned + len <= g_cfg.request) return 1;
    if (*burst < 0) {
        uint64_t my_idle = (now_ns() - elastic_last_call_ns()) / 1000000ull;
        uint64_t rest = g_es.swapped - planned, most = (uint64_t)ELASTIC_BATCH * ELASTIC_CHUNK;
        int yielded = g_es.yield_ns && coarse_ns() - g_es.yield_ns < ELASTIC_BACK_AFTER_MS * 1000000ull;
        *burst = !yielded && !neighbour_first(my_idle, rest < most ? rest : most);
    }
    return *burst;
}

/* HBM is full for the next chunk of `len` (nothing is gated): short of its request, ask neighbours, bursts
 * included; active with bursts in host memory, idle neighbours and lower priorities only (without waiting;
 * retried at most once a second). */
static void ask_for_room(uint64_t len) {
    static uint64_t last_ask;
    int within = g_es.resident + len <= g_cfg.request;
    if ((within || !elastic_is_idle()) && now_ns() - last_ask > 1000000000ull) {
        last_ask = now_ns();
        elastic_make_room(within ? g_cfg.request - g_es.resident : g_es.swapped, within, 0, NULL);
    }
}

/* Bring host-resident chunks back while HBM has room ("coming back"): the request first, then the
 * bursts, only when no neighbour is short of its request and no more recently active neighbour waits for its
 * own; at most ELASTIC_BATCH chunks per tick, moved as one batch (the gate closes once, for the copies and the
 * remaps). Caller holds g_es.mu. */
static void swap_in(void) {
    if (!g_es.swapped) return;
    unsigned i = 0;
    uint64_t planned = 0;
    int burst = -1;
    struct elastic_range *pick;
    CUmemGenericAllocationHandle nh;
    while (g_es.batch.n < ELASTIC_BATCH && (pick = oldest_host(&i))) {
        uint64_t len = elastic_chunk_len(pick, i);
        if (!may_come_back(planned, len, &burst)) break;
        if (create_timed(&nh, len, 0) != CUDA_SUCCESS) {
            if (!g_es.batch.n) ask_for_room(len);
            break;
        }
        batch_add(pick, i, nh, 0, 0);
        planned += len;
    }
    if (g_es.batch.n) move_batch(0);
}

/* Give back the pool's pinned host chunks unused for MEMSLICE_HOST_POOL_KEEP (no move for that long either: a
 * pool in use is kept whole). Caller holds g_es.mu. */
static void trim_pool(void) {
    uint64_t gone = elastic_pool_trim(&g_es.pool, g_cfg.pool_keep_ms);
    char a[32], b[32];
    if (gone)
        shim_log(LOG_INFO, "memslice: elastic: host pool: %s of pinned host memory given back (unused for %llu ms; "
                 "%s still pinned; %llu chunks pinned, %llu reused so far)", fmt_bytes(gone, a, sizeof a),
                 (unsigned long long)g_cfg.pool_keep_ms, fmt_bytes(g_es.pool.pinned, b, sizeof b),
                 (unsigned long long)g_es.pool.pins, (unsigned long long)g_es.pool.reuses);
}

/* The background thread: elastic_publish, answer asks, bring memory back. It makes CUDA calls in the context of the
 * elastic allocations. An ask is acknowledged at once by the acker (askers skip a slot that does not ack
 * within ELASTIC_ACK_MS: a forged slot that never answers costs them that much, once), answered at most
 * once per ELASTIC_YIELD_GAP_MS (asks are rate-limited; the asks of several neighbours pending at once
 * are answered together, each bounded by its asker's limit), the ticks between free for bringing this
 * process's own memory back. */
void *elastic_thread(void *arg) {
    (void)arg;
    REAL(cuCtxSetCurrent)(g_es.ctx);
    elastic_streams_init(&g_es.streams);
    pthread_mutex_lock(&g_es.mu);
    elastic_pool_init(&g_es.pool, g_cfg.limit, g_cfg.pool_keep_ms, g_es.ord);
    pthread_mutex_unlock(&g_es.mu);
    uint64_t handled[ELASTIC_SLOTS] = {0}, answered_ns = 0;
    struct elastic_askers cache = {0};
    int from[ELASTIC_SLOTS];
    struct elastic_roster_ent lim[ELASTIC_SLOTS];
    struct elastic_ask asks[ELASTIC_SLOTS];
    for (;;) {
        int answer = now_ns() - answered_ns >= ELASTIC_YIELD_GAP_MS * 1000000ull;
        if (answer) {
            elastic_read_asks(&cache, from, lim, asks);
        }
        pthread_mutex_lock(&g_es.mu);
        uint64_t done = 0, first = 0, last = 0;
        uint64_t want = answer ? pending_want(asks, lim, handled, elastic_is_idle(), &first, &last) : 0;
        if (last) {
            uint64_t moved = yield(want, elastic_is_idle(), first, last);
            answered_ns = now_ns();
            g_es.me.done_moved_mib = (uint32_t)((moved + (1ull << 20) - 1) >> 20);
            struct elastic_answer an = {first, last, g_es.me.done_moved_mib, 0, 0};
            elastic_board_put_answer(&g_es.board, &an);
            done = last;
        } else {
            swap_in();
        }
        if (g_es.pool.pinned && now_ns() - g_es.move_ns >= g_cfg.pool_keep_ms * 1000000ull) trim_pool();
        elastic_drain_probe();
        elastic_settle_owed();
        elastic_publish(done);
        pthread_mutex_unlock(&g_es.mu);
        sleep_ms(ELASTIC_TICK_MS);
    }
    return NULL;
}

/* The acker: acknowledges the newest ask addressed to this slot as soon as it is posted, even while the
 * background thread is in the middle of a move (askers skip a slot that does not acknowledge within
 * ELASTIC_ACK_MS). One pread per asking neighbour every 10 ms. */
void *elastic_acker(void *arg) {
    (void)arg;
    uint64_t seen = 0;
    struct elastic_askers cache = {0};
    int from[ELASTIC_SLOTS];
    struct elastic_roster_ent lim[ELASTIC_SLOTS];
    struct elastic_ask asks[ELASTIC_SLOTS];
    for (;;) {
        elastic_read_asks(&cache, from, lim, asks);
        uint64_t now = now_ns(), newest = 0;
        for (int j = 0; j < ELASTIC_SLOTS; j++)
            if (asks[j].seq > newest && asks[j].seq <= now) newest = asks[j].seq;
        if (newest > seen) {
            __atomic_store_n(&g_es.acked, newest, __ATOMIC_RELAXED);
            elastic_board_ack(&g_es.board, newest);
            seen = newest;
        }
        sleep_ms(10);
    }
    return NULL;
}

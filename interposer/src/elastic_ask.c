/* Elastic memory's side of the board protocol (elastic_board.c is the file): publishing this process's slot,
 * reading the agent's roster, and asking neighbours for room (whom, for how much, the bounded wait for their
 * answers). See elastic.c. */
#define _GNU_SOURCE
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "elastic.h"

/* Publish this process's state on its GPU's board. Caller holds g_es.mu. */
void elastic_publish(uint64_t done_seq) {
    uint64_t idle = (now_ns() - elastic_last_call_ns()) / 1000000ull;
    g_es.me.magic = ELASTIC_MAGIC;
    g_es.me.pid = getpid();
    g_es.me.state = elastic_is_idle() ? ELASTIC_IDLE : ELASTIC_ACTIVE;
    g_es.me.request = g_cfg.request;
    g_es.me.limit = g_cfg.limit;
    g_es.me.resident = g_es.resident;
    g_es.me.swapped = g_es.swapped;
    g_es.me.idle_ms = idle;
    g_es.me.priority = g_cfg.priority;
    g_es.me.flags = g_cfg.idle_release ? ELASTIC_F_IDLE_RELEASE : 0;
    if (done_seq) g_es.me.done_seq = done_seq;
    /* the acker's (a stale one is rewritten next tick) */
    g_es.me.ack_seq = __atomic_load_n(&g_es.acked, __ATOMIC_RELAXED);
    elastic_board_publish(&g_es.board, &g_es.me);
}

/* What a live neighbour's slot says it could give (a claim, used only to choose whom to ask and for how
 * much; the driver's free memory is the evidence): pass 0, an idle tenant's bytes above its floor; pass 1,
 * an active tenant's burst, only for this process's request (`guaranteed`) or to a higher priority than the
 * neighbour's (never the reverse; equal priorities, only for a request). */
static uint64_t claim_of(const struct elastic_slot *s, int pass, int guaranteed) {
    if (pass == 0) {
        if (s->state != ELASTIC_IDLE) return 0;
        uint64_t floor = s->flags & ELASTIC_F_IDLE_RELEASE ? 0 : s->request;
        return s->resident > floor ? s->resident - floor : 0;
    }
    if (s->state != ELASTIC_ACTIVE || s->resident <= s->request) return 0;
    if (!guaranteed && s->priority >= g_cfg.priority) return 0; /* a burst takes only a lower priority's */
    return s->resident - s->request;
}

/* Claimed figures are not evidence: where the agent wrote a roster, only the slots it assigned
 * may be asked, with the request, priority and opt-in it recorded, and what a slot says it holds is capped
 * by the limit it recorded. */
void elastic_apply_roster(struct elastic_slot *s, int *live) {
    struct elastic_roster_ent ro[ELASTIC_SLOTS];
    if (!elastic_board_read_roster(g_cfg.elastic_dir, g_region.r->dev[g_es.dev].uuid, ro)) return;
    for (int i = 0; i < ELASTIC_SLOTS; i++) {
        if (!(ro[i].flags & ELASTIC_R_ASSIGNED)) {
            live[i] = 0;
            continue;
        }
        uint64_t lim = (uint64_t)ro[i].limit_mib << 20;
        s[i].request = (uint64_t)ro[i].request_mib << 20;
        s[i].limit = lim;
        s[i].priority = ro[i].priority;
        s[i].flags = ro[i].flags & ELASTIC_R_IDLE_RELEASE ? ELASTIC_F_IDLE_RELEASE : 0;
        if (s[i].resident > lim) s[i].resident = lim;
        if (s[i].swapped > lim - s[i].resident) s[i].swapped = lim - s[i].resident;
    }
}

/* Who may ask this process, with the asker's limit in MiB: the slots the roster assigned, else (no agent)
 * every slot, bounded by nothing but the GPU. The cache is the caller's own (one per thread). The roster is
 * re-read as soon as its file's stamp changes (a slot the agent gave another pod is bounded by the new pod's
 * entry from its first ask: a roster cached for a second let the old entry, or none, bound it, and A moved
 * its whole burst with HBM free), and once a second anyway (a rewrite in place within the file system's time
 * granularity keeps the stamp); the stamp is taken before the read, so a change during the read is seen. */
void elastic_askers(struct elastic_askers *c, int from[ELASTIC_SLOTS], struct elastic_roster_ent ent[ELASTIC_SLOTS]) {
    uint64_t now = now_ns();
    const char *uuid = g_region.r->dev[g_es.dev].uuid;
    struct elastic_roster_stamp st;
    elastic_board_roster_stamp(g_cfg.elastic_dir, uuid, &st);
    if (!c->at || now - c->at > 1000000000ull || memcmp(&st, &c->stamp, sizeof st) != 0) {
        c->at = now;
        c->stamp = st;
        c->roster = elastic_board_read_roster(g_cfg.elastic_dir, uuid, c->ro);
    }
    for (int i = 0; i < ELASTIC_SLOTS; i++) {
        from[i] = !c->roster || (c->ro[i].flags & ELASTIC_R_ASSIGNED);
        ent[i] = c->roster ? c->ro[i]
                           : (struct elastic_roster_ent){ELASTIC_R_ASSIGNED, INT32_MAX, UINT32_MAX, UINT32_MAX};
    }
}

/* The askers, their roster entries and their asks to this slot, read so that the asks are bounded by the roster
 * as it was when they were read. Why again: the agent may rename a new roster into place between the roster's
 * stamp and the asks' read, and the new pod in the slot may ask at once; its first ask would be bounded by the
 * old pod's entry for this tick. One more round when the stamp moved; a change after that is the next tick's. */
void elastic_read_asks(struct elastic_askers *c, int from[ELASTIC_SLOTS], struct elastic_roster_ent ent[ELASTIC_SLOTS],
                       struct elastic_ask asks[ELASTIC_SLOTS]) {
    for (int round = 0; round < 2; round++) {
        elastic_askers(c, from, ent);
        elastic_board_asks_for_me(&g_es.board, from, asks);
        struct elastic_roster_stamp st;
        elastic_board_roster_stamp(g_cfg.elastic_dir, g_region.r->dev[g_es.dev].uuid, &st);
        if (memcmp(&st, &c->stamp, sizeof st) == 0) return;
    }
}

/* An ask as the asked slot trusts it (pure: a need of 16 TiB kept a neighbour's burst in host
 * memory): the need at most what the asker may still hold (its limit in the roster, less what it says is
 * resident, itself capped by that limit) and at most the GPU's size; an ask that may take a burst, from a
 * priority not above `mine`, at most what the asker lacks of its request; the share at most the need. */
uint64_t elastic_bound_ask(uint64_t bits, const struct elastic_roster_ent *asker, uint64_t resident_mib, int32_t mine,
                      uint64_t gpu_mib) {
    uint64_t need = ELASTIC_ASK_NEED(bits), share = ELASTIC_ASK_SHARE(bits);
    uint64_t lim = asker->limit_mib, req = asker->request_mib;
    if (resident_mib > lim) resident_mib = lim;
    if (need > lim - resident_mib) need = lim - resident_mib;
    if ((bits & ELASTIC_ASK_BURST) && asker->priority <= mine && need > (req > resident_mib ? req - resident_mib : 0))
        need = req > resident_mib ? req - resident_mib : 0;
    if (need > gpu_mib) need = gpu_mib;
    if (share > need) share = need;
    return ELASTIC_ASK_PACK(share, need, bits & ELASTIC_ASK_BURST);
}

/* Choose whom to ask and for how much (only what is needed, longest-idle first, then bursting
 * active tenants by lowest priority): asks go out in order until the claimed shares cover `left`. Slots
 * in `taken` (asked already, or skipped) are not asked; those asked are added. The bytes not covered. */
static uint64_t ask_more(struct elastic_slot *s, int *live, int *taken, uint64_t seq, uint64_t left, uint64_t need,
                         int guaranteed, int *asked, int *n) {
    for (int pass = 0; pass < 2 && left; pass++)
        for (;;) {
            int best = -1;
            for (int i = 0; i < ELASTIC_SLOTS; i++) {
                if (!live[i] || taken[i] || !claim_of(&s[i], pass, guaranteed)) continue;
                if (best < 0 || (pass == 1 && s[i].priority < s[best].priority) ||
                    ((pass == 0 || s[i].priority == s[best].priority) && s[i].idle_ms > s[best].idle_ms)) best = i;
            }
            if (best < 0 || !left) break;
            uint64_t c = claim_of(&s[best], pass, guaranteed), share = c < left ? c : left;
            taken[best] = 1;
            if (elastic_board_ask(&g_es.board, best, seq, ELASTIC_ASK_PACK((share + (1ull << 20) - 1) >> 20,
                                                        (need + (1ull << 20) - 1) >> 20, pass == 1)) < 0)
                return left; /* no slot file to write: this process cannot ask */
            asked[(*n)++] = best;
            left -= share;
        }
    return left;
}

/* The asker's needed/moved figures (metrics and `memslice top` show moved / needed per ask). The wait may end
 * when the driver has room, before a neighbour has written its answer (its copies free HBM chunk by chunk, the
 * answer comes after the batch): such an ask is owed, and counted by elastic_settle_owed when the answer is
 * there, so moved is not undercounted. */
static void count_ask(uint64_t need, const int *asked, int n, uint64_t seq) {
    uint64_t got = 0;
    int owed = 0;
    pthread_mutex_lock(&g_es.mu);
    for (int k = 0; k < n; k++) {
        int i = asked[k];
        if (elastic_board_done_seq(&g_es.board, i) >= seq || !elastic_board_alive(&g_es.board, i))
            got += elastic_board_moved_for(&g_es.board, i, seq);
        else
            g_es.owed_seq[i] = seq, owed++;
    }
    g_es.me.asks++;
    g_es.me.asked_mib += (uint32_t)((need + (1ull << 20) - 1) >> 20);
    g_es.me.got_mib += (uint32_t)got;
    elastic_publish(0);
    pthread_mutex_unlock(&g_es.mu);
    char a[32], b[32];
    shim_log(LOG_INFO, "memslice: elastic: asked %d neighbour(s) for %s; they moved %s%s", n,
             fmt_bytes(need, a, sizeof a), fmt_bytes(got << 20, b, sizeof b), owed ? " so far" : "");
}

/* Count what owed asks' neighbours moved once they have answered (or drop the ask: the neighbour is gone, or
 * it has not answered within ELASTIC_OWED_MS, or a newer answer of its replaced the one for this ask, which
 * moved_for then counts as 0). Runs on the mover's tick; bounded: one pread or two per owed slot. Caller holds
 * g_es.mu. */
void elastic_settle_owed(void) {
    uint64_t now = now_ns();
    for (int i = 0; i < ELASTIC_SLOTS; i++) {
        uint64_t seq = g_es.owed_seq[i];
        if (!seq) continue;
        int alive = elastic_board_alive(&g_es.board, i);
        if (alive && elastic_board_done_seq(&g_es.board, i) < seq) {
            if (now - seq > ELASTIC_OWED_MS * 1000000ull) g_es.owed_seq[i] = 0;
            continue;
        }
        g_es.me.got_mib += (uint32_t)elastic_board_moved_for(&g_es.board, i, seq);
        g_es.owed_seq[i] = 0;
    }
}

/* Ask neighbours for `need` bytes of HBM and wait (bounded) for their answers. Asks go
 * to idle tenants first, longest idle first, then (for an ask that may take bursts) bursting active ones,
 * each for a share of what is needed. Claimed figures are not evidence: the wait ends when the driver has
 * `need` free, when every asked slot has answered, or at the deadline; a slot that has not acknowledged
 * its ask within ELASTIC_ACK_MS is skipped (ELASTIC_SKIP_NOACK_MS, on every path) and its share asked of the next
 * one. A
 * neighbour that has acknowledged but not answered by the deadline is skipped too. A neighbour that answered
 * it could not take its share to host memory is returned in *ref (ref->slot -1: none). Returns how many were
 * asked. */
int elastic_make_room(uint64_t need, int guaranteed, int wait, struct elastic_refusal *ref) {
    struct elastic_slot s[ELASTIC_SLOTS];
    int live[ELASTIC_SLOTS], taken[ELASTIC_SLOTS] = {0}, asked[ELASTIC_SLOTS], share_open[ELASTIC_SLOTS] = {0}, n = 0;
    uint64_t seq = now_ns(), t_ask[ELASTIC_SLOTS];
    elastic_board_read_all(&g_es.board, s, live);
    elastic_apply_roster(s, live);
    for (int i = 0; i < ELASTIC_SLOTS; i++) taken[i] = g_es.skip_until[i] > seq;
    ask_more(s, live, taken, seq, need, need, guaranteed, asked, &n);
    for (int k = 0; k < n; k++) { t_ask[k] = seq; share_open[k] = 1; }
    uint64_t deadline = seq + (wait ? g_cfg.yield_wait_ms * 1000000ull : 0);
    while (wait && now_ns() < deadline) {
        sleep_ms(2);
        int pending = 0;
        uint64_t reask = 0;
        for (int k = 0; k < n; k++) {
            if (!share_open[k]) continue;
            int i = asked[k];
            if (!elastic_board_alive(&g_es.board, i) || elastic_board_done_seq(&g_es.board, i) >= seq) {
                share_open[k] = 0;
                struct elastic_hostnote nt;
                /* it could not (or says so): the next one is asked */
                if (elastic_board_note_for(&g_es.board, i, seq, &nt)) {
                    uint64_t c = claim_of(&s[i], s[i].state == ELASTIC_IDLE ? 0 : 1, guaranteed);
                    reask += c < need ? c : need;
                }
                continue;
            }
            if (elastic_board_ack_seq(&g_es.board, i) < seq && now_ns() - t_ask[k] > ELASTIC_ACK_MS * 1000000ull) {
                share_open[k] = 0; /* forged or hung: its claimed share is asked of the next neighbour */
                g_es.skip_until[i] = now_ns() + ELASTIC_SKIP_NOACK_MS * 1000000ull;
                uint64_t c = claim_of(&s[i], s[i].state == ELASTIC_IDLE ? 0 : 1, guaranteed);
                reask += c < need ? c : need;
                shim_log(LOG_WARN, "memslice: elastic: the tenant in slot %d of the board did not acknowledge an ask "
                         "within %d ms; it is skipped for %d s", i, ELASTIC_ACK_MS, ELASTIC_SKIP_NOACK_MS / 1000);
                continue;
            }
            pending++;
        }
        if (reask) {
            int before = n;
            ask_more(s, live, taken, seq, reask, need, guaranteed, asked, &n);
            for (int k = before; k < n; k++) { t_ask[k] = now_ns(); share_open[k] = 1; pending++; }
        }
        if (!pending) break;
        uint64_t fr = elastic_driver_free();
        if (fr != UINT64_MAX && fr >= need) break;
    }
    for (int k = 0; wait && k < n; k++) /* not answered in time: not asked again for 30 s */
        if (share_open[k] && elastic_board_alive(&g_es.board, asked[k]) &&
            elastic_board_done_seq(&g_es.board, asked[k]) < seq &&
            now_ns() >= deadline) {
            g_es.skip_until[asked[k]] = now_ns() + 30000000000ull;
            shim_log(LOG_WARN, "memslice: elastic: the tenant in slot %d of the board did not yield HBM within "
                     "%llu ms; it is skipped for 30 s and the allocation is served from host memory", asked[k],
                     (unsigned long long)g_cfg.yield_wait_ms);
        }
    if (ref) {
        ref->slot = -1;
        for (int k = 0; k < n && ref->slot < 0; k++)
            if (elastic_board_note_for(&g_es.board, asked[k], seq, &ref->note)) {
                ref->slot = asked[k];
                ref->pid = s[asked[k]].pid;
            }
    }
    if (wait && n) count_ask(need, asked, n, seq);
    return n;
}

/* The compute share's decision: pure arithmetic on bounded figures, no I/O. A container within its
 * request always goes (nobody can push it below its guarantee); over its limit it waits (the cap holds on an
 * idle GPU too); between the two it yields to a higher-priority neighbour with work, and to a neighbour that has
 * work but gets less than its entitlement (its request plus a weighted part of the unrequested rest, shared
 * among equal priorities; a lower priority is owed only its request). Alone it goes: a share nobody uses goes
 * to whoever runs. */
#include "compute.h"

#define CS_HYST_PM 10   /* one point of hysteresis on our own figure: no flapping at the target */

/* The weight of a share in dividing the unrequested rest: its request, and 1 for best effort. */
static long weight(const struct cs_peer *p) { return p->request > 0 ? p->request : 1; }

/* A slot's entitlement in per mille: its request plus its weighted part of `spare`, capped by its limit. */
static int entitled_pm(const struct cs_peer *p, int spare, long wsum) {
    long e = p->request * 10L + (wsum > 0 ? spare * 10L * weight(p) / wsum : 0);
    long cap = p->limit * 10L;
    return (int)(e < cap ? e : cap);
}

enum cs_verdict cs_decide(const struct cs_peer *me, const struct cs_peer *peers, int n) {
    if (me->share_pm > me->limit * 10) return CS_WAIT_LIMIT;
    if (me->request > 0 && me->share_pm <= me->request * 10) return CS_GO; /* best effort is never "within" */
    int spare = 100 - me->request;
    long wsum = weight(me);
    for (int i = 0; i < n; i++) {
        if (!peers[i].demand) continue;
        if (peers[i].priority > me->priority) return CS_WAIT_PRIO;
        spare -= peers[i].request;
        if (peers[i].priority == me->priority) wsum += weight(&peers[i]);
    }
    if (spare < 0) spare = 0;
    if (me->share_pm <= entitled_pm(me, spare, wsum) + CS_HYST_PM) return CS_GO;
    for (int i = 0; i < n; i++) {
        const struct cs_peer *p = &peers[i];
        /* an equal priority is owed its entitlement; a lower one only its request (it yields the rest to us) */
        int floor_pm = (p->request < p->limit ? p->request : p->limit) * 10;
        int owed = p->priority == me->priority ? entitled_pm(p, spare, wsum) : floor_pm;
        if (p->demand && p->share_pm < owed) return CS_WAIT_SHARE;
    }
    return CS_GO;
}

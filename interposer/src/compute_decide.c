/* The compute share's decision (issue 33): pure arithmetic on bounded figures, no I/O. A container within its
 * request always goes (nobody can push it below its guarantee); over its limit it waits (the cap holds on an
 * idle GPU too); between the two it yields to a higher-priority neighbour with work, and to a neighbour that has
 * work but gets less than its entitlement (its request plus a weighted part of the unrequested rest). Alone it
 * goes: a share nobody uses goes to whoever runs. */
#include "compute.h"

#define CS_HYST_PM 10   /* one point of hysteresis: no flapping on a figure at its target */

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
    if (me->share_pm <= me->request * 10) return CS_GO;
    int spare = 100 - me->request, active = 0;
    long wsum = weight(me);
    for (int i = 0; i < n; i++) {
        if (!peers[i].demand) continue;
        if (peers[i].priority > me->priority) return CS_WAIT_PRIO;
        spare -= peers[i].request;
        wsum += weight(&peers[i]);
        active++;
    }
    if (!active) return CS_GO;
    if (spare < 0) spare = 0;
    if (me->share_pm <= entitled_pm(me, spare, wsum) + CS_HYST_PM) return CS_GO;
    for (int i = 0; i < n; i++)
        if (peers[i].demand && peers[i].share_pm + CS_HYST_PM < entitled_pm(&peers[i], spare, wsum)) return CS_WAIT_SHARE;
    return CS_GO;
}

"""Decisions for pods that span GPUs (`memslice.io/gpu-count: N`, N > 1), pure functions of a NodeView, as
decisions.py's for one GPU (which call these when N > 1; a one-GPU pod never comes here).

Fit: N distinct healthy GPUs of the node each have the pod's per-GPU share free: its memory, its compute (the
GPU's compute requests plus the share at most 100) and, with the limit cap, its limit within R × the GPU's
memory; and the node's free memory, net of pods bound without the extender, covers N shares.

Choice among the fitting sets: the lowest contract.set_distance first (the sum over pairs of 0 NVLink, 1 the
same PCIe switch, 2 the same NUMA node, 3 otherwise: tensor-parallel traffic goes between every pair), then the
policy as for one GPU: binpack takes the set with the least free (the GPUs' free fractions summed, on a node with
compute shares their free compute fractions added), spread the most; then the lower indices. A node whose GPUs
are all equally close (one NVSwitch, or nothing known) takes the first N GPUs in the policy's order at once; else
the sets of a node's topology are made once, grouped by distance, while there are at most MAX_SETS (the usual
case, `_quick`, tests the GPUs with room as a bit mask against them, closest level first); beyond that
(a node of a dozen GPUs or more) the best of the sets grown greedily from the first MAX_SEEDS GPUs in the policy's
order (each step the GPU closest to those taken). A node of more than 64 GPUs is taken as all far apart
(state.MAX_TOPOLOGY_GPUS).

Score (0..10): 3/4 for closeness, 1/4 for packing: round(10 × (0.75 × (1 − distance / (3 × pairs)) + 0.25 ×
the mean over the set of the fraction used after placement (binpack) or left free (spread))). So a node with
an NVLink set free outscores one that has only GPUs across sockets, whatever the packing.

Preemption: for each candidate set of N healthy GPUs large enough, the lowest-priority pods holding memory on
those GPUs (the largest first within a priority) until each GPU of the set has room, then each given back
while it still fits, then made exact for the fewest victims and the least MiB (decisions.fewest_then_least, as for
one GPU; bounded: past MAX_VICTIM_SETS sets of pods the greedy's set stands); a victim spanning GPUs frees its
share on every one of them. Only pods holding memory on a GPU of the set are named. The set whose highest victim
priority is lowest wins, then the fewest victims, then the least MiB, then the closest set, then the lower indices.
Cost (issue 39; benchmarks/bench_preempt.py): a set whose Floor (a lower bound from memory alone) cannot beat the
best so far is not searched, and the greedy of each part of a set is kept across sets (Alone): the same victims
as searching every set. A decisions.SearchBudget (the preempt verb's, split over a request's nodes) stops the
search at the best set so far once spent.

The device order of the chosen GPUs (contract: devices 0..N-1 inside the container) is their index order.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from functools import reduce
from itertools import chain, combinations
from math import comb
from operator import add, itemgetter, truediv
from typing import TYPE_CHECKING

from memslice.contract import ANN_GPU_COUNT

from . import decisions as _d  # decisions imports this module too: attributes are read at call time only
from .constants import MAX_SCORE, MIN_SCORE
from .views import FAR, GpuRow, GpuView, NodeView

if TYPE_CHECKING:
    from .decisions import Fit, LimitNeed, SearchBudget, Verdict, VictimCandidate

MAX_SETS = 1024  # sets weighed one by one (8 GPUs: at most 70, sets of 4; beyond: grown greedily, see best_set)
MAX_PREEMPT_SETS = 128  # the same for preemption (each set is a search for victims)
MAX_SEEDS = 8  # GPUs a greedy search grows sets from (the first in the policy's order): bounded work per verdict
TOPOLOGY_WEIGHT = 0.75  # the score's part for closeness (the module's docstring)


def candidates(view: NodeView, need_mib: int, limit: LimitNeed | None, compute: int) -> list[int]:
    """Positions (in `rows`) of the healthy GPUs with the share free now: memory, compute and the cap."""
    capped = limit is not None and _d._capped(view, need_mib, limit)
    limit_sum, within_limit_cap = _d.limit_sum, _d.within_limit_cap
    cols = view.compute
    out = []
    for i, r in enumerate(view.rows):
        if not r[4] or r[6] < need_mib:
            continue
        if compute and cols is not None and cols[i] + compute > 100:
            continue
        if capped and not within_limit_cap(limit_sum(view, i), limit.mib, r[3], limit.ratio):  # type: ignore[union-attr]
            continue
        out.append(i)
    return out


def fit(view: NodeView, need_mib: int, limit: LimitNeed | None, compute: int, gpus: int) -> tuple[Fit, list[int]]:
    """Can the pod be placed here now, and on which GPUs could it go (positions in `rows`)?"""
    Fit = _d.Fit
    if view.error:
        return Fit(False, True, view.error), []
    if not view.rows:
        return Fit(False, True, "node advertises no memslice GPUs"), []
    ok = candidates(view, need_mib, limit, compute)
    if len(ok) < gpus:
        never = _never(view, need_mib, limit, gpus)
        if never is not None:
            return Fit(False, True, never), []
        cap = f" within the limit cap (--max-limit-ratio {float(limit.ratio):g})" if limit is not None and \
            _d._capped(view, need_mib, limit) else ""
        return Fit(False, False, _no_room(need_mib, compute, cap, gpus)), []
    if view.unplaced_mib and view.total_free_mib - view.unplaced_mib < need_mib * gpus:
        return Fit(False, False, f"pod needs {need_mib} MiB on each of {gpus} GPUs; the node's free GPU memory is "
                                 f"held by pods bound without the extender (GPU unknown)"), []
    return Fit(True, False, ""), ok


_NO_ROOM: dict[tuple[int, int, str, int], str] = {}  # the texts made, shared by every cell that holds one
MAX_NO_ROOM = 4096  # texts kept (pod sizes × counts met); emptied when full
# The texts of _no_room(need, 0, "", N) again, per N by need (no_room_texts): what the native fill and refresh write.
# Each N's dict lives as long as the module (emptied in place with _NO_ROOM), so the memo may hold it.
_NO_ROOM_BY_N: dict[int, dict[int, str]] = {}
MAX_NO_ROOM_N = 64  # Ns given a dict (state.MAX_TOPOLOGY_GPUS: no set is searched beyond it)


def _no_room(need_mib: int, compute: int, cap: str, gpus: int) -> str:
    """Why a node whose GPUs are large enough does not take the pod now (one text per cause: no node figure).
    Kept per cause: a node refusing a pod is refreshed in every table at each bind on it (issue 34)."""
    key = (need_mib, compute, cap, gpus)
    text = _NO_ROOM.get(key)
    if text is None:
        what = f"{need_mib} MiB" + (f" and {compute} percent compute" if compute else "")
        text = f"pod needs {what} on each of {gpus} GPUs ({ANN_GPU_COUNT}); fewer than {gpus} GPUs of the node " \
               f"have that free{cap} now"
        if len(_NO_ROOM) >= MAX_NO_ROOM:
            _NO_ROOM.clear()
            for texts in _NO_ROOM_BY_N.values():
                texts.clear()
        _NO_ROOM[key] = text
        if not compute and not cap and gpus in _NO_ROOM_BY_N:
            _NO_ROOM_BY_N[gpus][need_mib] = text
    return text


def no_room_texts(gpus: int) -> dict[int, str]:
    """need (MiB per GPU) -> _no_room(need, 0, "", gpus), for the texts made so far: the reasons the native fill and
    refresh (_nameids.span_fill, span_refresh) write for a cell that finds no room where _without_room's first
    branch holds (at least N healthy GPUs that large: it fails now, not for ever); a text not made yet is left to
    the caller's Python (resolve makes it, and it is here from then on). One dict per N for the module's life."""
    texts = _NO_ROOM_BY_N.get(gpus)
    if texts is None:  # (the texts made before: _no_room adds to an N's dict only once it is made)
        texts = {need: t for (need, compute, cap, n), t in _NO_ROOM.items() if n == gpus and not compute and not cap}
        if 1 <= gpus <= MAX_NO_ROOM_N:
            _NO_ROOM_BY_N[gpus] = texts
    return texts


def _never(view: NodeView, need_mib: int, limit: LimitNeed | None, gpus: int) -> str | None:
    """Why no N GPUs of this node could ever hold the pod (even empty), with the most it could ask for here and the
    fix; None when N could. The figures are the pod's and the node's board (its healthy GPUs, their sizes, the
    cap's ratio): nodes of one board type give one text, as the scheduler groups nodes by reason."""
    within_limit_cap = _d.within_limit_cap
    large = capped = 0  # healthy GPUs that large; of those, the ones whose cap takes the limit even empty
    for r in view.rows:
        if r[4] and r[3] >= need_mib:
            large += 1
            capped += limit is None or within_limit_cap(0, limit.mib, r[3], limit.ratio)
    if capped >= gpus:
        return None
    healthy = sorted((r[3] for r in view.rows if r[4]), reverse=True)
    if len(healthy) < gpus:
        fix = f"ask for at most {len(healthy)} or use" if healthy else "use"
        return (f"pod needs {gpus} GPUs ({ANN_GPU_COUNT}); the node has {len(healthy)} healthy memslice GPUs: "
                f"{fix} a node with {gpus}")
    if large >= gpus and limit is not None:
        most = sorted((_d.limit_cap_mib(r[3], limit.ratio) for r in view.rows if r[4] and r[3] >= need_mib),
                      reverse=True)[gpus - 1]
        return (f"pod's GPU memory limit of {limit.mib} MiB on each of {gpus} GPUs ({ANN_GPU_COUNT}) is above the "
                f"limit cap (--max-limit-ratio {float(limit.ratio):g}): fewer than {gpus} GPUs of the node could take "
                f"it even empty; ask for a limit of at most {most} MiB per GPU (memslice.io/gpu-mem-limit)")
    return (f"pod needs {need_mib} MiB on each of {gpus} GPUs ({ANN_GPU_COUNT}); fewer than {gpus} healthy "
            f"GPUs of the node are that large: ask for at most {healthy[gpus - 1]} MiB per GPU or use a node "
            f"with {gpus} such GPUs")


def distance(topo: object, positions: Iterable[int]) -> int:
    """contract.set_distance of the GPUs at these positions, from the view's topology."""
    ps = list(positions)
    if isinstance(topo, int):
        return topo * (len(ps) * (len(ps) - 1) // 2)
    return sum(topo[a][b] for a, b in combinations(ps, 2))  # type: ignore[index]


def _order_value(view: NodeView, i: int) -> float:
    """What the policy orders GPUs and sets by: the GPU's free fraction (memory, plus compute's when the node
    has a compute column); binpack takes the least, spread the most."""
    r = view.rows[i]
    value = r[6] / r[3]
    if view.compute is not None:
        value += (100 - view.compute[i]) / 100
    return value


def best_set(view: NodeView, ok: list[int], policy: str, gpus: int) -> tuple[int, tuple[int, ...]]:
    """(distance, positions in index order) of the set the policy takes among `ok` (len ≥ gpus): the closest,
    then the least (binpack) or most (spread) free fraction summed, then the lower indices."""
    sign = -1.0 if policy == "spread" else 1.0
    rows = view.rows
    value = {i: sign * _order_value(view, i) for i in ok}
    topo = view.topo
    plan = None if isinstance(topo, int) else _plan(topo, gpus)
    if plan is not None and plan[1] is not None:  # the sets by distance, made once per topology: the closest fitting
        mask = 0
        for i in ok:
            mask |= 1 << i
        closest = _closest(plan[1], plan[2], mask)
        assert closest is not None  # len(ok) >= gpus: a set of some level fits
        d, fitting = closest
        return d, min(fitting, key=lambda pos: (_added(value[i] for i in pos), _indices(rows, pos)))
    order = sorted(ok, key=lambda i: (value[i], rows[i][1]))
    if isinstance(topo, int):
        first = order[:gpus]
        return distance(topo, first), _by_index(view, first)
    if comb(len(order), gpus) <= MAX_SETS:
        sets: Iterable[tuple[int, ...]] = combinations(order, gpus)
    else:
        sets = (_grow(topo, order, seed, gpus) for seed in order[:MAX_SEEDS])
    best: tuple[int, float, tuple[int, ...]] | None = None  # (distance, packing, indices)
    chosen: tuple[int, ...] = ()
    for s in sets:
        d = sum(topo[a][b] for a, b in combinations(s, 2))
        if best is not None and d > best[0]:
            continue
        rank = (d, _added(value[i] for i in s), tuple(sorted(rows[i][1] for i in s)))
        if best is None or rank < best:
            best, chosen = rank, s
    assert best is not None
    return best[0], _by_index(view, chosen)


def _indices(rows: tuple[GpuRow, ...], pos: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(sorted(rows[i][1] for i in pos))


def _added(values: Iterable[float]) -> float:
    """The values added left to right from 0.0: how a set's free fractions are summed everywhere here and in C
    (_nameids.span_search). Not Python's sum: from 3.12 on it adds floats with compensation (other last bits than
    plain addition, so other ties), and the C twin and this reference must add one defined way."""
    return reduce(add, values, 0.0)


def _closeness(d: int, pairs: int) -> float:
    """The score's closeness part (TOPOLOGY_WEIGHT of it) for a set at distance d with this many pairs."""
    return TOPOLOGY_WEIGHT * (1 - d / (FAR * pairs) if pairs else 1.0)


Levels = tuple[tuple[int, tuple[tuple[int, tuple[int, ...]], ...]], ...]  # (distance, ((mask, positions), ...))
Closest = tuple[int, tuple[tuple[int, ...], ...]]  # (distance, the sets of the closest level that fit, in index order)
# (id(topology), N) -> (it, its levels, the closest fitting sets by mask of the GPUs with room, the score's
# closeness part by distance: _closeness for 0..FAR × pairs)
Plan = tuple[object, Levels | None, dict[int, Closest], tuple[float, ...]]
_LEVELS: dict[tuple[int, int], Plan] = {}
MAX_LEVELS_CACHED = 256  # topologies × counts kept (a cluster has a few board types); emptied when full
MAX_MASKS = 4096  # masks of GPUs with room kept per topology and N (8 GPUs: 256 at most); emptied when full


def plans() -> dict[tuple[int, int], Plan]:
    """The plans kept (_plan's, by (id(topology), N)), for _nameids.span_fill to read the kept masks of a node's
    topology as _native_search does (one dict, cleared in place: the object stays)."""
    return _LEVELS


def _levels(topo: tuple[tuple[int, ...], ...], gpus: int) -> Levels | None:
    """Every set of `gpus` positions of a node with this topology, as bit masks grouped by distance (closest
    first), each group in index order; None when there are more than MAX_SETS (best_set then grows them). Made
    once per topology object (state.py shares one per board type) and kept: a verdict then tests masks."""
    return _plan(topo, gpus)[1]


def _plan(topo: tuple[tuple[int, ...], ...], gpus: int) -> Plan:
    """_levels' entry: (the topology, its levels, the closest fitting sets kept by mask: see _closest, the
    closeness part by distance)."""
    key = (id(topo), gpus)
    hit = _LEVELS.get(key)
    if hit is not None and hit[0] is topo:
        return hit
    n = len(topo)
    levels: Levels | None = None
    if comb(n, gpus) <= MAX_SETS:
        by: dict[int, list[tuple[int, tuple[int, ...]]]] = {}
        for pos in combinations(range(n), gpus):
            d = sum(topo[a][b] for a, b in combinations(pos, 2))
            by.setdefault(d, []).append((sum(1 << i for i in pos), pos))
        levels = tuple((d, tuple(by[d])) for d in sorted(by))
    if len(_LEVELS) >= MAX_LEVELS_CACHED:
        _LEVELS.clear()
    pairs = gpus * (gpus - 1) // 2
    entry = _LEVELS[key] = (topo, levels, {}, tuple(_closeness(d, pairs) for d in range(FAR * pairs + 1)))
    return entry


def _closest(levels: Levels, by_mask: dict[int, Closest], mask: int) -> Closest | None:
    """The sets of the closest level whose GPUs are all in `mask` (positions with room), in index order, with
    that level's distance; None when no set fits. Kept by mask per topology and N (`by_mask`, from _plan): which
    GPUs have room is all it depends on, and a node of 8 GPUs has 256 such masks, so the levels are scanned once
    per mask met rather than at every verdict (issue 34: a bind refreshes a node's verdict in every table)."""
    hit = by_mask.get(mask)
    if hit is not None:
        return hit
    for d, members in levels:
        fitting = tuple(pos for m, pos in members if m & mask == m)
        if fitting:
            if len(by_mask) >= MAX_MASKS:
                by_mask.clear()
            by_mask[mask] = (d, fitting)
            return d, fitting
    return None


def _grow(topo: tuple[tuple[int, ...], ...], order: list[int], seed: int, gpus: int) -> tuple[int, ...]:
    """A set grown from `seed`: each step the GPU closest to those taken (ties: the policy's order)."""
    taken = [seed]
    rest = [i for i in order if i != seed]
    while len(taken) < gpus:
        nxt = min(rest, key=lambda i: sum(topo[i][t] for t in taken))  # min keeps the first: the policy's order
        taken.append(nxt)
        rest.remove(nxt)
    return tuple(taken)


def _by_index(view: NodeView, positions: Iterable[int]) -> tuple[int, ...]:
    return tuple(sorted(positions, key=lambda i: view.rows[i][1]))


# The usual case (no compute share, the limit cap changing nothing, no pods bound without the extender): the
# healthy GPUs with room, read off the view's free column (bisect), as a bit mask of their positions, tested
# against the node's sets grouped by distance (made once per topology, _levels), closest level first; the policy
# decides among that level's fitting sets. Nothing is built per view: a view is rebuilt at every charge.
_NOT_QUICK = (-1, ())


Quick = tuple[int, tuple[int, ...]] | None
# The last view _quick met and its answers by (N, policy, k): _quick's answer depends on the share only through
# k (how many healthy GPUs have less free than it), so the tables of one N and policy (one per per-GPU size)
# share one set search per view. Why: every charge rebuilds a node's view and the memo then refreshes its
# verdict in each table (FitMemo._refresh), 20 spanning tables in benchmarks/README.md's mix, one after another
# for that view (issue 34). One slot (the view held, compared by identity: a rebuilt view is another object),
# swapped whole, so a reader on another thread sees a view with its own answers or starts afresh.
_LAST_VIEW: list[tuple[NodeView | None, dict[tuple[int, str, int], Quick]]] = [(None, {})]


def forget_quick() -> None:
    """Drop _quick's kept answers (tests compare with a computation from scratch)."""
    _LAST_VIEW[0] = (None, {})


def _quick(view: NodeView, need_mib: int, policy: str, gpus: int) -> Quick:
    """best_set without the candidates' list: (distance, positions in index order); None when fewer than N
    healthy GPUs have the share free; _NOT_QUICK when the node has too many sets (the general path grows them).
    Kept per view (see _LAST_VIEW)."""
    keys = view.free_keys  # healthy GPUs by (free, index): those from k on have room
    k = bisect_left(keys, need_mib)
    if len(keys) - k < gpus:
        return None
    last = _LAST_VIEW[0]
    if last[0] is not view:
        last = _LAST_VIEW[0] = (view, {})
    answers = last[1]
    key = (gpus, policy, k)
    out = answers.get(key, _NOT_QUICK)
    if out is _NOT_QUICK and key not in answers:
        out = answers[key] = _scan(view, k, policy, gpus)
    return out


def _scan(view: NodeView, k: int, policy: str, gpus: int) -> Quick:
    """_quick's set search for the GPUs from k on in the view's free order (at least N of them)."""
    topo = view.topo
    rows = view.rows
    if rows[0][1] == 0 and rows[-1][1] == len(rows) - 1:  # indices 0..G-1 (sorted, distinct): index = position
        room = [r[1] for r in view.free_rows[k:]]
    else:
        position = {r[1]: p for p, r in enumerate(rows)}
        room = [position[r[1]] for r in view.free_rows[k:]]
    if isinstance(topo, int):  # all pairs alike: the first N in the policy's order
        chosen = room[:gpus] if policy != "spread" else sorted(room, key=lambda p: (-rows[p][6], rows[p][1]))[:gpus]
        return topo * (gpus * (gpus - 1) // 2), tuple(sorted(chosen))
    _, levels, by_mask, _ = _plan(topo, gpus)
    if levels is None:
        return _NOT_QUICK
    mask = 0
    for p in room:
        mask |= 1 << p
    closest = _closest(levels, by_mask, mask)
    if closest is None:  # pragma: no cover - N healthy GPUs with room form a set of some level
        return None
    d, fitting = closest
    if len(fitting) == 1:
        return d, fitting[0]
    sign = -1.0 if policy == "spread" else 1.0  # positions ascend with the GPU index (rows are by index)
    return d, min(fitting, key=lambda pos: (sign * _added(rows[p][6] / rows[p][3] for p in pos), pos))


def _most_free(r: GpuRow) -> tuple[int, int]:
    return -r[6], r[1]


def _pick(view: NodeView, need_mib: int, policy: str, limit: LimitNeed | None, compute: int, gpus: int
          ) -> tuple[Fit, int, tuple[int, ...]]:
    """fit, and where it fits the distance and positions (by index) of the set the policy takes."""
    if (not compute and not view.unplaced_mib and not view.error and view.rows
            and not (limit is not None and _d._capped(view, need_mib, limit))):
        quick = _quick(view, need_mib, policy, gpus)
        if quick is not None and quick is not _NOT_QUICK:
            return _d.FITS, quick[0], quick[1]
        if quick is None:  # no N GPUs have room: never (too few large enough) or not now
            never = _never(view, need_mib, limit, gpus)
            return _d.Fit(False, never is not None, never or _no_room(need_mib, compute, "", gpus)), 0, ()
    f, ok = fit(view, need_mib, limit, compute, gpus)
    if not f.ok:
        return f, 0, ()
    d, positions = best_set(view, ok, policy, gpus)
    return f, d, positions


def score_of(view: NodeView, positions: tuple[int, ...], d: int, need_mib: int, policy: str, compute: int) -> int:
    """The module's docstring: closeness (3/4) and packing (1/4), 0..10."""
    pairs = len(positions) * (len(positions) - 1) // 2
    close = 1 - d / (FAR * pairs) if pairs else 1.0
    rows, cols = view.rows, view.compute
    left = 0.0
    for i in positions:
        r = rows[i]
        free = (r[6] - need_mib) / r[3]
        if compute:
            free = (free + (100 - (cols[i] if cols is not None else 0) - compute) / 100) / 2
        left += free
    left /= len(positions)
    fraction = left if policy == "spread" else 1 - left
    value = TOPOLOGY_WEIGHT * close + (1 - TOPOLOGY_WEIGHT) * fraction
    return max(MIN_SCORE, min(MAX_SCORE, round(MAX_SCORE * value)))


def verdict(view: NodeView, need_mib: int, policy: str, limit: LimitNeed | None, compute: int,
            gpus: int) -> Verdict:
    """fit and score in one go (what the memo keeps)."""
    f, d, positions = _pick(view, need_mib, policy, limit, compute, gpus)
    if not f.ok:
        return False, f.unresolvable, f.reason, MIN_SCORE
    return True, False, "", score_of(view, positions, d, need_mib, policy, compute)


# What judge keeps per (N, policy) for one view: a list indexed by k (how many healthy GPUs have less free than the
# share: len(free_keys) + 1 entries), each None (not searched yet), False (the node has too many sets to weigh one
# by one: the general path answers) or, flat, (the score's closeness part, then the chosen set's free MiB and MiB per
# GPU). A caller may keep these for a view (the memo keeps them per node until its view changes:
# fitmemo.FitMemo._found). Flat, so that the native scores (_nameids.span_scores) read them as they are.
Chosen = tuple[object, ...] | bool | None
Found = dict[tuple[int, str], list[Chosen]]
_NO_SET: tuple[int, ...] = ()
_FREE, _MEM = itemgetter(6), itemgetter(3)  # a GpuRow's free MiB, its MiB
_FIT = tuple((True, False, "", s) for s in range(MAX_SCORE + 1))  # a fitting verdict, per score (shared)
# scores' codes beyond a score (0..MAX_SCORE): fewer than N healthy GPUs have the share free; k's set search not
# made yet; the general path (verdict) answers. Native twins in _nameids.c (SPAN_NO_ROOM, ...).
NO_ROOM, UNSEARCHED, GENERAL = 0xF0, 0xF1, 0xF2
Search = tuple[tuple[GpuRow, ...], tuple[GpuRow, ...], dict[int, Closest], tuple[float, ...]]  # _native_search
Scores = Callable[[tuple[int, ...], list[Chosen], Sequence[int], int, bool, "Search | None"], "bytes | None"]
ScoresEach = Callable[[list[tuple[int, ...]], list[list[Chosen]], int, int, bool], "bytes | None"]


def scores(keys: tuple[int, ...], chosen: list[Chosen], needs: Sequence[int], gpus: int, spread: bool) -> bytes:
    """For each need (MiB per GPU) on a view whose healthy GPUs' free MiB, sorted, are `keys` and whose set searches
    of one N and policy are `chosen` (see Found, len(keys) + 1 entries): its score (score_of for a pod without a
    compute share, written out: the same operations in the same order, the same floats), or NO_ROOM, UNSEARCHED,
    GENERAL. The reference of _nameids.span_scores (which answers None where it cannot be exact: the caller then
    asks this one); tests/extender/test_nameids.py checks they agree."""
    out = bytearray()
    weight = 1 - TOPOLOGY_WEIGHT
    for need in needs:
        k = bisect_left(keys, need)
        if len(keys) - k < gpus:
            out.append(NO_ROOM)
            continue
        at = chosen[k]
        if at is None:
            out.append(UNSEARCHED)
            continue
        if at is False:
            out.append(GENERAL)
            continue
        assert isinstance(at, tuple)
        left = 0.0
        for g in range(gpus):
            mem = at[2 + 2 * g]
            if mem <= 0:  # type: ignore[operator]
                break
            left += (at[1 + 2 * g] - need) / mem  # type: ignore[operator]
        else:
            left /= gpus
            scaled = MAX_SCORE * (at[0] + weight * (left if spread else 1 - left))  # type: ignore[operator]
            if math.isfinite(scaled):
                out.append(max(MIN_SCORE, min(MAX_SCORE, round(scaled))))
                continue
        out.append(GENERAL)
    return bytes(out)


def codes(view: NodeView, needs: Sequence[int], policy: str, gpus: int, found: Found,
          native: Scores | None = None) -> bytes:
    """scores() for each of `needs` on this view, the set searches it lacks made (_search) and kept in `found` (the
    caller's dict for this very view): a score, NO_ROOM or GENERAL per need (resolve() turns the last two into
    verdicts). `native`: _nameids.span_scores (None: the reference alone). Why codes, not verdicts: the memo's
    refresh compares a cell with its new score and writes only what changed (issue 34: a bind refreshes its node in
    every spanning table)."""
    if view.unplaced_mib or view.error or not view.rows:  # the general path: fit's checks
        return bytes((GENERAL,)) * len(needs)
    keys = view.free_keys
    chosen = found.get((gpus, policy))
    if chosen is None:
        chosen = found[gpus, policy] = [None] * (len(keys) + 1)
    spread = policy == "spread"
    out = native(keys, chosen, needs, gpus, spread, _native_search(view, gpus)) if native is not None else None
    if out is None:
        out = scores(keys, chosen, needs, gpus, spread)
    if UNSEARCHED in out:
        for need, code in zip(needs, out, strict=True):
            if code == UNSEARCHED:
                k = bisect_left(keys, need)
                if chosen[k] is None:
                    chosen[k] = _search(view, k, policy, gpus)
        again = native(keys, chosen, needs, gpus, spread, None) if native is not None else None
        out = again if again is not None else scores(keys, chosen, needs, gpus, spread)
    return out


def resolve(view: NodeView, need: int, policy: str, gpus: int, code: int) -> Verdict:
    """The verdict of a code codes() answered for `need` on this view."""
    if code <= MAX_SCORE:
        return _FIT[code]
    if code == NO_ROOM:
        return _without_room(view, need, gpus)
    return verdict(view, need, policy, None, 0, gpus)


def verdicts(view: NodeView, needs: list[int], policy: str, gpus: int, found: Found | None = None,
             native: Scores | None = None) -> list[Verdict]:
    """verdict(view, need, policy, None, 0, gpus) for each of `needs` (MiB per GPU) in one call: what the memo's
    tables of one N and policy (one per per-GPU size) hold for a node. `found`: the set searches kept for this very
    view (None: for this call only)."""
    if found is None:
        found = {}
    return [resolve(view, need, policy, gpus, c) for need, c in zip(needs, codes(view, needs, policy, gpus, found,
                                                                                native), strict=True)]


def judge(items: list[tuple[NodeView, int, Found]], policy: str, gpus: int,
          native: Scores | None = None) -> list[Verdict]:
    """verdict(view, need, policy, None, 0, gpus) for each (view, need, found) of `items`: codes() of each, resolved.
    Each size is a bisect (k: how many healthy GPUs have less free than it); the set search (_search) depends on
    the size only through k, so it is made once per (view, N, policy, k) and kept in the item's `found` (the
    caller's dict for that very view: another size, in this call or a later one, finds it there)."""
    return [resolve(view, need, policy, gpus, codes(view, (need,), policy, gpus, found, native)[0])
            for view, need, found in items]


def codes_each(views: list[NodeView], founds: list[Found], need: int, policy: str, gpus: int,
               native: ScoresEach | None = None, one: Scores | None = None) -> bytes:
    """codes(view, (need,), policy, gpus, found) for each view and its found, with one native call for all (the
    memo's fill of a spanning table: one size on the hundreds of nodes a request finds without a verdict).
    `native`: _nameids.span_scores_each (None: the reference alone); `one`: _nameids.span_scores, for the nodes
    whose set search is still to be made (natively where it can, as codes)."""
    at = gpus, policy
    keys_of: list[tuple[int, ...]] = []
    chosen_of: list[list[Chosen]] = []
    general: list[int] = []  # positions of views the general path answers (fit's checks)
    for view, found in zip(views, founds, strict=True):
        if view.unplaced_mib or view.error or not view.rows:
            general.append(len(keys_of))
            keys_of.append(())
            chosen_of.append([None])
            continue
        keys = view.free_keys
        chosen = found.get(at)
        if chosen is None:
            chosen = found[at] = [None] * (len(keys) + 1)
        keys_of.append(keys)
        chosen_of.append(chosen)
    spread = policy == "spread"
    out = native(keys_of, chosen_of, need, gpus, spread) if native is not None else None
    if out is None:
        out = bytes(scores(keys, chosen, (need,), gpus, spread)[0] for keys, chosen in zip(keys_of, chosen_of,
                                                                                             strict=True))
    if not general and UNSEARCHED not in out:
        return out
    fixed = bytearray(out)
    for p in general:
        fixed[p] = GENERAL
    for p, code in enumerate(out):
        if code == UNSEARCHED:  # the search made and kept, the code asked again
            fixed[p] = codes(views[p], (need,), policy, gpus, founds[p], one)[0]
    return bytes(fixed)


def _without_room(view: NodeView, need: int, gpus: int) -> Verdict:
    """judge's verdict where fewer than N healthy GPUs have `need` free: never (_never) or not now."""
    if sum(1 for r in view.rows if r[4] and r[3] >= need) >= gpus:  # N healthy GPUs that large: not never
        return False, False, _no_room(need, 0, "", gpus), MIN_SCORE
    never = _never(view, need, None, gpus)
    return False, never is not None, never or _no_room(need, 0, "", gpus), MIN_SCORE


def _search(view: NodeView, k: int, policy: str, gpus: int) -> Chosen:
    """judge's set search for the GPUs from k on in the view's free order (at least N of them, healthy, with
    room): _scan's answer, as the score needs it (see Found; False: the general path). When the GPU indices are
    0..G-1 (index = position) and the node's sets are few enough, the GPUs with room are a bit mask tested against
    the sets kept per mask (_closest), and the policy's choice among the closest fitting sets is _scan's min
    written out (the same sums of the same fractions in the same order, _added: the same floats, the same ties).
    The reference of _nameids.span_search (span_scores with a search, _native_search), which makes this path in C
    for a mask already kept; tests/extender/test_nameids.py checks they agree."""
    rows, topo = view.rows, view.topo
    pairs = gpus * (gpus - 1) // 2
    plan = None if isinstance(topo, int) else _plan(topo, gpus)
    d, positions = -1, _NO_SET
    if plan is not None and plan[1] is not None and rows[0][1] == 0 and rows[-1][1] == len(rows) - 1:
        mask = 0
        for r in view.free_rows[k:]:
            mask |= 1 << r[1]
        closest = _closest(plan[1], plan[2], mask)
        if closest is not None:
            d, fitting = closest
            if len(fitting) == 1:
                positions = fitting[0]
            else:  # min(fitting, key=(sign × the sum of the set's free fractions, the set)), as _scan
                fraction = list(map(truediv, map(_FREE, rows), map(_MEM, rows))).__getitem__
                sign = -1.0 if policy == "spread" else 1.0
                best = 0.0
                for pos in fitting:
                    value = sign * _added(map(fraction, pos))
                    if not positions or value < best or (value == best and pos < positions):
                        best, positions = value, pos
    else:
        quick = _scan(view, k, policy, gpus)
        if quick is not None and quick is not _NOT_QUICK:
            d, positions = quick
    if d < 0:
        return False
    return (_closeness(d, pairs), *chain.from_iterable((rows[i][6], rows[i][3]) for i in positions))


def _native_search(view: NodeView, gpus: int) -> Search | None:
    """What _nameids.span_scores needs to make _search's mask path natively (span_search): (rows, free_rows, the
    closest fitting sets kept per mask, the closeness part per distance); None where that path does not apply (the
    reference searches). The C reads the kept masks only: one not kept yet is left to _search (_closest keeps it)."""
    topo, rows = view.topo, view.rows
    if isinstance(topo, int) or rows[0][1] != 0 or rows[-1][1] != len(rows) - 1:
        return None
    plan = _plan(topo, gpus)
    if plan[1] is None:
        return None
    return rows, view.free_rows, plan[2], plan[3]


def choose(view: NodeView, need_mib: int, policy: str, limit: LimitNeed | None, compute: int,
           gpus: int) -> tuple[GpuView, ...] | None:
    """The GPUs the pod gets on this node, in device order (by index); None when it does not fit."""
    f, _, positions = _pick(view, need_mib, policy, limit, compute, gpus)
    if not f.ok:
        return None
    return tuple(GpuView._make(view.rows[i]) for i in positions)


# ------------------------------------------------------------------------------------------ preemption

Freed = dict[str, tuple[int, int, int]]  # GPU UUID -> (MiB, limit MiB above, compute percent) victims free there


def _uuids(v: VictimCandidate) -> tuple[str, ...]:
    return tuple(v.gpu_uuid.split(",")) if "," in v.gpu_uuid else (v.gpu_uuid,)


def _freed(victims: list[VictimCandidate]) -> Freed:
    """What evicting `victims` frees per GPU (a victim spanning GPUs frees its share on each)."""
    out: Freed = {}
    for v in victims:
        for u in _uuids(v):
            mib, over, compute = out.get(u, (0, 0, 0))
            out[u] = mib + v.mib, over + v.over, compute + v.compute
    return out


def _gpu_room(view: NodeView, i: int, need_mib: int, freed: Freed, limit: LimitNeed | None, compute: int) -> bool:
    """Would the GPU at position i take the pod's share once `freed` is gone: memory, compute, the cap?"""
    r = view.rows[i]
    mib, over, pct = freed.get(r[0], (0, 0, 0))
    if not r[4] or r[6] + mib < need_mib:
        return False
    if compute and (view.compute[i] if view.compute else 0) - pct + compute > 100:
        return False
    return limit is None or _d.within_limit_cap(_d.limit_sum(view, i) - mib - over, limit.mib, r[3], limit.ratio)


def _node_room(view: NodeView, gpus: int, need_mib: int, freed: Freed, freed_unplaced_mib: int) -> bool:
    """The node's free memory once `freed` is gone, net of pods bound without the extender, covers N shares."""
    total = view.total_free_mib
    for r in view.rows:
        f = freed.get(r[0])
        if f is not None and r[4]:
            total += max(r[6] + f[0], 0) - max(r[6], 0)
    return total - max(view.unplaced_mib - freed_unplaced_mib, 0) >= need_mib * gpus


def _room_after(view: NodeView, positions: tuple[int, ...], need_mib: int, victims: list[VictimCandidate],
                freed_unplaced_mib: int, limit: LimitNeed | None, compute: int) -> bool:
    """Would the pod fit on the GPUs at `positions` once `victims` are gone?"""
    return _room_freed(view, positions, need_mib, _freed(victims), freed_unplaced_mib, limit, compute)


def _room_freed(view: NodeView, positions: tuple[int, ...], need_mib: int, freed: Freed, freed_unplaced_mib: int,
                limit: LimitNeed | None, compute: int) -> bool:
    """_room_after with what the victims free per GPU given."""
    return (not view.error and all(_gpu_room(view, i, need_mib, freed, limit, compute) for i in positions)
            and _node_room(view, len(positions), need_mib, freed, freed_unplaced_mib))


def _charge(freed: Freed, v: VictimCandidate, sign: int) -> None:
    """`freed` with `v` evicted (sign 1) or given back (sign -1)."""
    for u in _uuids(v):
        mib, over, pct = freed.get(u, (0, 0, 0))
        freed[u] = mib + sign * v.mib, over + sign * v.over, pct + sign * v.compute


class Alone:
    """The greedy's victims of each part of a set of GPUs on its own, kept across the sets of one
    preemption_victims call (a part: GPUs linked by candidates holding two of them, e.g. an NVLink pair that
    2-GPU pods sit on; most sets share their parts with others).
    When it is exact: where no pod bound without the extender holds memory still (view.unplaced_mib ≤
    freed_unplaced_mib) and the node's free memory covers the pod already (total_free_mib ≥ N × need), _greedy on a
    set S takes and gives back the pods that _greedy on each part of S does, and its set is their union in
    _greedy_order. Proof: _node_room (total ≥ N × need) then holds with any victims (evicting only adds free
    memory), for S as for each part (|part| ≤ N), so a pod is never taken for the node's total and S has room iff
    each part has. (Where the total is short, _greedy takes every pod in order until it is not, whatever its GPU:
    a prefix of each set's own pods, which parts cannot share; the search is then Floor's alone.) A candidate holds
    GPUs of one part only, so taking or giving it back changes only that part's room. _greedy takes a pod iff a
    GPU of S it holds lacks room, a test on the pods of its part taken before it: the part's own test; stopping
    once S has room stops no part early (each has room, and takes nothing more). Giving back keeps S's room
    throughout, so a pod is given back iff its part keeps room without it: again the part's test, in the same
    order. A part that cannot get room: neither can S (None)."""

    def __init__(self, view: NodeView, need_mib: int, pods: list[VictimCandidate], limit: LimitNeed | None,
                 compute: int, freed_unplaced_mib: int, spanning: list[tuple[int, tuple[int, ...]]]) -> None:
        self.view, self.need_mib, self.pods, self.limit, self.compute = view, need_mib, pods, limit, compute
        self.freed_unplaced_mib = freed_unplaced_mib
        self.links = {where for _, where in spanning}
        self.kept: dict[tuple[int, ...], list[VictimCandidate] | None] = {}

    def parts(self, s: tuple[int, ...]) -> list[tuple[int, ...]]:
        """The set's GPUs grouped into parts (linked by a candidate holding two of them), each in set order."""
        group = {i: {i} for i in s}
        for where in self.links:
            inside = [i for i in where if i in group]
            for i in inside[1:]:
                if group[i] is not group[inside[0]]:
                    merged = group[inside[0]] | group[i]
                    for j in merged:
                        group[j] = merged
        out: list[tuple[int, ...]] = []
        seen: set[int] = set()
        for i in s:
            if i not in seen:
                out.append(tuple(j for j in s if j in group[i]))
                seen |= group[i]
        return out

    def greedy(self, part: tuple[int, ...]) -> list[VictimCandidate] | None:
        """_greedy on the part alone (the pods holding a GPU of it)."""
        key = tuple(sorted(part))
        if key in self.kept:
            return self.kept[key]
        uuids = {self.view.rows[i][0] for i in key}
        mine = [c for c in self.pods if any(u in uuids for u in _uuids(c))]
        chosen = _greedy(self.view, key, self.need_mib, mine, self.freed_unplaced_mib, self.limit, self.compute)
        self.kept[key] = chosen
        return chosen


def _giveback_order(v: VictimCandidate) -> tuple[int, int, str]:
    """The order the greedy gives victims back in: the highest priority first, the smallest first within one."""
    return -v.priority, v.mib, v.uid


def _greedy_order(v: VictimCandidate) -> tuple[int, int, str]:
    """The greedy's order of taking victims: the lowest priority first, the largest first within one."""
    return v.priority, -v.mib, v.uid


class Floor:
    """A lower bound on the rank (highest priority, count, MiB evicted) of ANY victims that make room on a set
    of GPUs, from memory alone, so that preemption_victims skips a set that cannot beat the best so far without
    searching it. Exact to skip: _victims_for_set's answer for a set makes room there, so its rank is at least
    the floor's, componentwise, hence in the issue's order (distance and indices, the rest of the rank, are
    the set's own); a skipped set would not have become the best, so every later set is searched with the
    same `beat` and answers the same: the verdict is the unpruned search's, also where MAX_VICTIM_SETS makes
    a set's answer its greedy's. For a set S, GPU i short of `short_i` = need − free MiB:
    - priority ≥ P = max over i of the lowest priority p whose pods on i (priority ≤ p) free short_i (none
      does: no victims make room there, and _victims_for_set answers None);
    - at that priority (a higher one ranks above the floor anyway), count ≥ c_i, the fewest pods of priority
      ≤ P on i freeing short_i (the largest first); and since a victim holding k GPUs of S counts on k of
      them, count ≥ Σ c_i − Σ (k − 1) over the pods of priority ≤ P holding k ≥ 2 GPUs of S;
    - MiB ≥ Σ least_i, least_i the smallest sum ≥ short_i of the MiB of pods of priority ≤ P on i (a subset sum,
      as a bit set; short_i itself past MAX_SUBSET_MIB): what leaves i is such a sum, and victim_mib counts a
      victim's share on each of its GPUs.
    Compute shares and the limit cap only ask for more victims: the floor holds with them too."""

    def __init__(self, view: NodeView, need_mib: int, pods: list[VictimCandidate]) -> None:
        at = {r[0]: i for i, r in enumerate(view.rows)}
        self.short = [max(need_mib - r[6], 0) for r in view.rows]
        self.on: list[list[tuple[int, int]]] = [[] for _ in view.rows]  # per GPU: (priority, MiB) of its pods
        self.spanning: list[tuple[int, tuple[int, ...]]] = []  # (priority, positions) of pods on 2+ GPUs here
        for v in pods:
            where = tuple(at[u] for u in _uuids(v) if u in at)
            for i in where:
                self.on[i].append((v.priority, v.mib))
            if len(where) > 1:
                self.spanning.append((v.priority, where))
        self.lowest = [self._lowest(i) for i in range(len(view.rows))]
        self.fewest: dict[tuple[int, int], int] = {}
        self.least: dict[tuple[int, int], int] = {}
        self.view = view

    def _lowest(self, i: int) -> int | None:
        """The lowest priority whose pods on GPU i (that priority or lower) free its shortfall; None: none do
        (MIN_PRIORITY when it has none)."""
        if not self.short[i]:
            return MIN_PRIORITY
        freed = 0
        for priority, mib in sorted(self.on[i]):
            freed += mib
            if freed >= self.short[i]:
                return priority
        return None

    def _count(self, i: int, top: int) -> int:
        """The fewest pods of priority ≤ top on GPU i that free its shortfall (the largest first)."""
        key = i, top
        hit = self.fewest.get(key)
        if hit is None:
            hit, freed = 0, 0
            for mib in sorted((m for p, m in self.on[i] if p <= top), reverse=True):
                if freed >= self.short[i]:
                    break
                freed += mib
                hit += 1
            self.fewest[key] = hit
        return hit

    def _least(self, i: int, top: int) -> int:
        """The smallest MiB ≥ GPU i's shortfall that pods of priority ≤ top on it add up to (its shortfall itself
        when their MiB add up to more than MAX_SUBSET_MIB: the bit set would be too large)."""
        key = i, top
        hit = self.least.get(key)
        if hit is None:
            short, sizes = self.short[i], [m for p, m in self.on[i] if p <= top]
            hit = short
            if short and 0 < sum(sizes) <= MAX_SUBSET_MIB:
                sums = 1  # bit k: some of the pods add up to k MiB
                for mib in sizes:
                    sums |= sums << mib
                above = sums >> short  # _lowest found them enough: a sum ≥ short exists
                hit = short + (above & -above).bit_length() - 1
            self.least[key] = hit
        return hit

    def may_beat(self, s: tuple[int, ...], best: tuple[int, int, int, int, tuple[int, ...]] | None) -> bool:
        """False when no victims can make room on the set at positions `s`, or none can rank below `best`."""
        top = MIN_PRIORITY
        for i in s:
            low = self.lowest[i]
            if low is None:
                return False
            top = max(top, low)
        if best is None:
            return True
        if top != best[0]:
            return top < best[0]
        members = set(s)
        held = (len(members.intersection(where)) for p, where in self.spanning if p <= top)
        extra = sum(k - 1 for k in held if k > 1)
        counts = [self._count(i, top) for i in s]
        count = max(max(counts), sum(counts) - extra)
        if (top, count) != best[:2]:
            return (top, count) < best[:2]
        least = sum(self._least(i, top) for i in s)
        if least != best[2]:
            return least < best[2]
        rows = self.view.rows
        return (distance(self.view.topo, s), tuple(sorted(rows[i][1] for i in s))) < best[3:]


MIN_PRIORITY = -(1 << 62)  # below any pod priority (int32 in Kubernetes)
MAX_SUBSET_MIB = 1 << 20  # the most MiB of one GPU's pods Floor._least sums as a bit set (1 TiB: 128 KiB of bits)


def _greedy(view: NodeView, positions: tuple[int, ...], need_mib: int, pods: list[VictimCandidate],
            freed_unplaced_mib: int, limit: LimitNeed | None, compute: int) -> list[VictimCandidate] | None:
    """_victims_for_set's greedy over `pods` (in _greedy_order): each taken while a GPU of the set it frees is still
    short (or the node's total is) until the set has room, then each given back (_giveback_order) while the set
    keeps room; None when all of them are not enough."""
    at = {view.rows[i][0]: i for i in positions}
    chosen: list[VictimCandidate] = []
    freed: Freed = {}
    args = view, positions, need_mib, freed, freed_unplaced_mib, limit, compute
    room = _room_freed(*args)
    for pod in pods:
        if room:
            break
        if (any(u in at and not _gpu_room(view, at[u], need_mib, freed, limit, compute) for u in _uuids(pod))
                or not _node_room(view, len(positions), need_mib, freed, freed_unplaced_mib)):
            chosen.append(pod)
            _charge(freed, pod, 1)
            room = _room_freed(*args)
    if not room:
        return None
    for pod in sorted(chosen, key=_giveback_order):
        _charge(freed, pod, -1)
        if _room_freed(*args):
            chosen = [v for v in chosen if v is not pod]
        else:
            _charge(freed, pod, 1)
    return chosen


def _victims_for_set(view: NodeView, positions: tuple[int, ...], need_mib: int, pods: list[VictimCandidate],
                     freed_unplaced_mib: int, limit: LimitNeed | None, compute: int,
                     beat: tuple[int, int, int] | None = None, ordered: bool = False,
                     alone: Alone | None = None, exact: bool = True) -> list[VictimCandidate] | None:
    """decisions._victims_on for a set of GPUs: the lowest priority first (the largest first within one) until
    the set has room, each taken only while a GPU of the set it frees is still short (or the node's total is);
    then each given back (highest priority first, then smallest) while the set still has room; then made exact
    for the fewest victims and the least MiB evicted (decisions.victim_mib: a victim spanning GPUs frees its share
    on each) by decisions.fewest_then_least, among the pods on a GPU of the set that lacks room (the others free
    nothing needed, but where pods bound without the extender hold memory of the node), bounded as there: past
    MAX_VICTIM_SETS sets of pods the greedy's set stands. `beat`: the (highest priority, count, MiB) of the best
    set so far: a set that cannot beat it answers its greedy set as it is. `ordered`: `pods` are in
    _greedy_order already. `alone`: the greedy's set is the union of each part's own (see Alone; the caller
    checked that it applies). `exact` False: the greedy's set as it is (a SearchBudget spent)."""
    if alone is not None:
        each = [alone.greedy(part) for part in alone.parts(positions)]
        if any(c is None for c in each):
            return None
        chosen = sorted(chain.from_iterable(each), key=_greedy_order)  # type: ignore[arg-type]
    else:
        found = _greedy(view, positions, need_mib, pods if ordered else sorted(pods, key=_greedy_order),
                        freed_unplaced_mib, limit, compute)
        if found is None:
            return None
        chosen = found
    if not chosen or not exact or (beat is not None and max(v.priority for v in chosen) > beat[0]):
        return chosen
    if view.unplaced_mib <= freed_unplaced_mib:
        short = {view.rows[i][0] for i in positions if not _gpu_room(view, i, need_mib, {}, limit, compute)}
        pods = [v for v in pods if any(u in short for u in _uuids(v))]
    lacking = sum(max(need_mib - view.rows[i][6], 0) for i in positions)  # what any set making room frees here
    return _d.fewest_then_least(pods, chosen, lambda c: _room_after(view, positions, need_mib, c, freed_unplaced_mib,
                                                                    limit, compute), _d.victim_mib, lacking,
                                None if beat is None or max(v.priority for v in chosen) < beat[0] else beat[1:])


def preemption_victims(view: NodeView, need_mib: int, candidates: list[VictimCandidate], freed_unplaced_mib: int,
                       limit: LimitNeed | None, compute: int, gpus: int, prune: bool = True,
                       budget: SearchBudget | None = None) -> tuple[str, ...] | None:
    """decisions.preemption_victims for a pod spanning `gpus` GPUs (the module's docstring). `prune` (the
    default): a set whose Floor cannot beat the best set so far is not searched, and a set's greedy victims are
    the union of its parts' own, kept across sets (the answer is the same: see Floor and Alone; False searches
    every set in full, the reference the tests compare with). `budget` (decisions.SearchBudget; None: no bound)
    bounds the sets searched by the pods they weigh."""
    if view.error:
        return None
    large = [i for i, r in enumerate(view.rows) if r[4] and r[3] >= need_mib]
    if len(large) < gpus:
        return None
    on_node = {r[0] for r in view.rows}
    pods = [c for c in candidates if any(u in on_node for u in _uuids(c))]
    if comb(len(large), gpus) <= MAX_PREEMPT_SETS:
        sets: Iterable[tuple[int, ...]] = combinations(large, gpus)
    else:  # grown greedily by closeness from the GPUs with the most free first (bounded as best_set's)
        topo = view.topo
        matrix = topo if not isinstance(topo, int) else tuple(tuple(topo for _ in view.rows) for _ in view.rows)
        large.sort(key=lambda i: (-view.rows[i][6], view.rows[i][1]))
        sets = (_grow(matrix, large, seed, gpus) for seed in large[:MAX_SEEDS])
    pods.sort(key=_greedy_order)  # each set's pods filtered from it keep this order (the sort is stable)
    floor = Floor(view, need_mib, pods) if prune else None
    alone = Alone(view, need_mib, pods, limit, compute, freed_unplaced_mib, floor.spanning) \
        if floor is not None and view.unplaced_mib <= freed_unplaced_mib and view.total_free_mib >= need_mib * gpus \
        else None
    best: tuple[tuple[int, int, int, int, tuple[int, ...]], tuple[str, ...]] | None = None
    for s in sets:
        if floor is not None and not floor.may_beat(s, best[0] if best is not None else None):
            continue
        exact = True
        if budget is not None and budget.units <= 0:
            budget.capped = True
            if best is not None:
                if any(_room_freed(view, rest, need_mib, {}, freed_unplaced_mib, limit, compute)
                       for rest in chain((s,), sets)):
                    return ()  # a set left has room already: no victims at all
                break
            exact = False  # none found yet: the greedy alone until one is
        if alone is not None:  # the greedy is Alone's; the exact search takes the pods on the set's short GPUs
            mine = pods
        else:
            uuids = {view.rows[i][0] for i in s}
            mine = [c for c in pods if any(u in uuids for u in _uuids(c))]
        if budget is not None:
            budget.units -= sum(len(floor.on[i]) for i in s) if floor is not None else len(mine)
        chosen = _victims_for_set(view, s, need_mib, mine, freed_unplaced_mib, limit, compute,
                                  best[0][:3] if best is not None else None, ordered=True, alone=alone, exact=exact)
        if chosen is None:
            continue
        if not chosen:
            return ()
        rank = (max(v.priority for v in chosen), len(chosen), sum(map(_d.victim_mib, chosen)),
                distance(view.topo, s), tuple(sorted(view.rows[i][1] for i in s)))
        if best is None or rank < best[0]:
            best = rank, tuple(v.uid for v in chosen)
    return best[1] if best is not None else None


def fits_after(view: NodeView, need_mib: int, limit: LimitNeed | None, compute: int, gpus: int) -> bool:
    """fit's answer alone (decisions.fits_without, on the view with the freed charges gone)."""
    return fit(view, need_mib, limit, compute, gpus)[0].ok

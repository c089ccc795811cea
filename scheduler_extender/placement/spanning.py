"""Decisions for pods that span GPUs (`memslice.io/gpu-count: N`, N > 1), pure functions of a NodeView, as
decisions.py's for one GPU (which call these when N > 1; a one-GPU pod never comes here).

Fit: N distinct healthy GPUs of the node each have the pod's per-GPU share free: its memory, its compute (the
GPU's compute requests plus the share at most 100) and, with the limit cap, its limit within R × the GPU's
memory; and the node's free memory, net of pods bound without the extender, covers N shares.

Choice among the fitting sets: the lowest contract.set_distance first (the sum over pairs of 0 NVLink, 1 the
same PCIe switch, 2 the same NUMA node, 3 otherwise: tensor-parallel traffic goes between every pair), then the
policy as for one GPU: binpack takes the set left with the least free memory (with a compute share, the free
memory and compute fractions added up), spread the most; then the lower indices. A node whose GPUs are all
equally close (one NVSwitch, or nothing known) takes the first N GPUs in the policy's order at once; else every
set is weighed while there are at most MAX_SETS, and beyond that (a node of a dozen GPUs or more) the best of the
sets grown greedily from the first MAX_SEEDS GPUs in the policy's order (each step the GPU closest to those
taken). A node of more than 64 GPUs is taken as all far apart (state.MAX_TOPOLOGY_GPUS).

Score (0..10): 3/4 for closeness, 1/4 for packing: round(10 × (0.75 × (1 − distance / (3 × pairs)) + 0.25 ×
the mean over the set of the fraction used after placement (binpack) or left free (spread))). So a node with
an NVLink set free outscores one that has only GPUs across sockets, whatever the packing.

Preemption: for each candidate set of N healthy GPUs large enough, the lowest-priority pods holding memory on
those GPUs (the largest first within a priority) until each GPU of the set has room, then each given back
while it still fits; a victim spanning GPUs frees its share on every one of them. Only pods holding memory on
a GPU of the set are named. The set whose highest victim priority is lowest wins, then the fewest victims,
then the least MiB, then the closest set, then the lower indices.

The device order of the chosen GPUs (contract: devices 0..N-1 inside the container) is their index order.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import combinations
from math import comb
from typing import TYPE_CHECKING

from memslice.contract import ANN_GPU_COUNT

from . import decisions as _d  # decisions imports this module too: attributes are read at call time only
from .constants import MAX_SCORE, MIN_SCORE
from .views import FAR, GpuView, NodeView

if TYPE_CHECKING:
    from .decisions import Fit, LimitNeed, Verdict, VictimCandidate

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
    never = _never(view, need_mib, limit, gpus)
    if never is not None:
        return Fit(False, True, never), []
    ok = candidates(view, need_mib, limit, compute)
    if len(ok) < gpus:
        what = f"{need_mib} MiB" + (f" and {compute} percent compute" if compute else "")
        cap = " within the limit cap (--max-limit-ratio)" if limit is not None and _d._capped(view, need_mib,
                                                                                              limit) else ""
        return Fit(False, False, f"pod needs {what} on each of {gpus} GPUs ({ANN_GPU_COUNT}); fewer than {gpus} "
                                 f"GPUs of the node have that free{cap} now"), []
    if view.unplaced_mib and view.total_free_mib - view.unplaced_mib < need_mib * gpus:
        return Fit(False, False, f"pod needs {need_mib} MiB on each of {gpus} GPUs; the node's free GPU memory is "
                                 f"held by pods bound without the extender (GPU unknown)"), []
    return Fit(True, False, ""), ok


def _never(view: NodeView, need_mib: int, limit: LimitNeed | None, gpus: int) -> str | None:
    """Why no N GPUs of this node could ever hold the pod (even empty); None when N could."""
    within_limit_cap = _d.within_limit_cap
    large = [r for r in view.rows if r[4] and r[3] >= need_mib]
    capped = [r for r in large if limit is None or within_limit_cap(0, limit.mib, r[3], limit.ratio)]
    if len(capped) >= gpus:
        return None
    if sum(1 for r in view.rows if r[4]) < gpus:  # no per-node figure: the scheduler groups nodes by reason
        return f"pod needs {gpus} GPUs ({ANN_GPU_COUNT}); the node has fewer healthy memslice GPUs"
    if len(large) >= gpus and limit is not None:
        return (f"pod's GPU memory limit of {limit.mib} MiB on each of {gpus} GPUs ({ANN_GPU_COUNT}) is above the "
                f"limit cap (--max-limit-ratio {float(limit.ratio):g}): fewer than {gpus} GPUs of the node could take "
                f"it even empty; ask for a lower limit")
    return (f"pod needs {need_mib} MiB on each of {gpus} GPUs ({ANN_GPU_COUNT}); fewer than {gpus} healthy "
            f"GPUs of the node are that large")


def distance(topo: object, positions: Iterable[int]) -> int:
    """contract.set_distance of the GPUs at these positions, from the view's topology."""
    ps = list(positions)
    if isinstance(topo, int):
        return topo * (len(ps) * (len(ps) - 1) // 2)
    return sum(topo[a][b] for a, b in combinations(ps, 2))  # type: ignore[index]


def _packing(view: NodeView, i: int, need_mib: int, compute: int) -> float:
    """The GPU's free fraction after placement (memory, plus compute's with a share): binpack takes the least."""
    r = view.rows[i]
    left = (r[6] - need_mib) / r[3]
    if compute:
        left += (100 - (view.compute[i] if view.compute is not None else 0) - compute) / 100
    return left


def best_set(view: NodeView, ok: list[int], need_mib: int, policy: str, compute: int, gpus: int
             ) -> tuple[int, float, tuple[int, ...]]:
    """(distance, packing sum, positions in index order) of the set the policy takes among `ok` (len ≥ gpus)."""
    sign = -1.0 if policy == "spread" else 1.0
    rows = view.rows
    value = {i: sign * _packing(view, i, need_mib, compute) for i in ok}
    order = sorted(ok, key=lambda i: (value[i], rows[i][1]))
    topo = view.topo
    if isinstance(topo, int):
        first = order[:gpus]
        return distance(topo, first), sum(value[i] for i in first), _by_index(view, first)
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
        rank = (d, sum(value[i] for i in s), tuple(sorted(rows[i][1] for i in s)))
        if best is None or rank < best:
            best, chosen = rank, s
    assert best is not None
    return best[0], best[1], _by_index(view, chosen)


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


def score_of(view: NodeView, positions: tuple[int, ...], d: int, need_mib: int, policy: str, compute: int) -> int:
    """The module's docstring: closeness (3/4) and packing (1/4), 0..10."""
    pairs = len(positions) * (len(positions) - 1) // 2
    close = 1 - d / (FAR * pairs) if pairs else 1.0
    left = sum(_packing(view, i, need_mib, compute) / (2 if compute else 1) for i in positions) / len(positions)
    fraction = left if policy == "spread" else 1 - left
    value = TOPOLOGY_WEIGHT * close + (1 - TOPOLOGY_WEIGHT) * fraction
    return max(MIN_SCORE, min(MAX_SCORE, round(MAX_SCORE * value)))


def verdict(view: NodeView, need_mib: int, policy: str, limit: LimitNeed | None, compute: int,
            gpus: int) -> Verdict:
    """fit and score in one go (what the memo keeps)."""
    f, ok = fit(view, need_mib, limit, compute, gpus)
    if not f.ok:
        return False, f.unresolvable, f.reason, MIN_SCORE
    d, _, chosen = best_set(view, ok, need_mib, policy, compute, gpus)
    return True, False, "", score_of(view, chosen, d, need_mib, policy, compute)


def choose(view: NodeView, need_mib: int, policy: str, limit: LimitNeed | None, compute: int,
           gpus: int) -> tuple[GpuView, ...] | None:
    """The GPUs the pod gets on this node, in device order (by index); None when it does not fit."""
    f, ok = fit(view, need_mib, limit, compute, gpus)
    if not f.ok:
        return None
    return tuple(GpuView._make(view.rows[i]) for i in best_set(view, ok, need_mib, policy, compute, gpus)[2])


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
    freed = _freed(victims)
    return (not view.error and all(_gpu_room(view, i, need_mib, freed, limit, compute) for i in positions)
            and _node_room(view, len(positions), need_mib, freed, freed_unplaced_mib))


def _victims_for_set(view: NodeView, positions: tuple[int, ...], need_mib: int, pods: list[VictimCandidate],
                     freed_unplaced_mib: int, limit: LimitNeed | None, compute: int) -> list[VictimCandidate] | None:
    """decisions._victims_on for a set of GPUs: the lowest priority first (the largest first within one) until
    the set has room, each taken only while a GPU of the set it frees is still short (or the node's total is);
    then each given back (highest priority first, then smallest) while the set still has room."""
    at = {view.rows[i][0]: i for i in positions}
    chosen: list[VictimCandidate] = []
    for pod in sorted(pods, key=lambda v: (v.priority, -v.mib, v.uid)):
        if _room_after(view, positions, need_mib, chosen, freed_unplaced_mib, limit, compute):
            break
        freed = _freed(chosen)
        if (any(u in at and not _gpu_room(view, at[u], need_mib, freed, limit, compute) for u in _uuids(pod))
                or not _node_room(view, len(positions), need_mib, freed, freed_unplaced_mib)):
            chosen.append(pod)
    if not _room_after(view, positions, need_mib, chosen, freed_unplaced_mib, limit, compute):
        return None
    for pod in sorted(chosen, key=lambda v: (-v.priority, v.mib, v.uid)):
        rest = [v for v in chosen if v is not pod]
        if _room_after(view, positions, need_mib, rest, freed_unplaced_mib, limit, compute):
            chosen = rest
    return chosen


def preemption_victims(view: NodeView, need_mib: int, candidates: list[VictimCandidate], freed_unplaced_mib: int,
                       limit: LimitNeed | None, compute: int, gpus: int) -> tuple[str, ...] | None:
    """decisions.preemption_victims for a pod spanning `gpus` GPUs (the module's docstring)."""
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
    best: tuple[tuple[int, int, int, int, tuple[int, ...]], tuple[str, ...]] | None = None
    for s in sets:
        uuids = {view.rows[i][0] for i in s}
        mine = [c for c in pods if any(u in uuids for u in _uuids(c))]
        chosen = _victims_for_set(view, s, need_mib, mine, freed_unplaced_mib, limit, compute)
        if chosen is None:
            continue
        if not chosen:
            return ()
        rank = (max(v.priority for v in chosen), len(chosen), sum(v.mib * len(_uuids(v)) for v in chosen),
                distance(view.topo, s), tuple(sorted(view.rows[i][1] for i in s)))
        if best is None or rank < best[0]:
            best = rank, tuple(v.uid for v in chosen)
    return best[1] if best is not None else None


def fits_after(view: NodeView, need_mib: int, limit: LimitNeed | None, compute: int, gpus: int) -> bool:
    """fit's answer alone (decisions.fits_without, on the view with the freed charges gone)."""
    return fit(view, need_mib, limit, compute, gpus)[0].ok

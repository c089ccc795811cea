"""Scheduling decisions as pure functions of a NodeView and a pod's need: does it fit (and if not, can it
ever), its score, and the GPU chosen at bind. Every rule is written here once; the memo (fitmemo.py) only
stores what `verdict` answers, per node and pod size, until the node's view changes.

Policies:
- binpack (default): the GPU left with the least free MiB that still fits (fewer GPUs touched, big holes
  kept for big pods); a node scores higher the fuller that GPU is after placement.
- spread: the GPU left with the most free MiB; a node scores higher the emptier that GPU stays.
Ties go to the lower GPU index. Scores are `round(10 × fraction)` of the chosen GPU's memory used (binpack)
or left free (spread) after placement, in the extender range 0..10.

Limit cap (`--max-limit-ratio R`, elastic memory; `within_limit_cap`): a GPU takes a pod only if the limits
of its pods (a pod without a limit annotation counts its request) plus the pod's limit stay within R × the
GPU's memory. Off (`limit` None) the rules above are untouched; on, it changes nothing on a node without
elastic pods for a pod without a limit (R ≥ 1: a GPU with room for the request is within the cap), so the
other GPUs are judged by the same O(1) path, and elsewhere GPUs breaking the cap are skipped by fit, pick and
score alike.

Compute share (`compute` > 0, the pod's effective `memslice.io/gpu-compute` percent): the GPU must have room
for the memory AND for the compute (its pods' compute requests plus the pod's at most 100), both on the SAME
GPU. Among those GPUs, binpack takes the one left with the least free memory and compute together (the sum of
the two free fractions after placement), spread the most; the score is 10 × the mean of the two fractions
used (binpack) or left free (spread). A pod without a compute share is decided on memory alone, as above.

Pods that span GPUs (`gpus` > 1, memslice.io/gpu-count): `need_mib`, `compute` and the limit are per GPU, and
spanning.py decides (N GPUs each with the share free, the closest set first); `gpus` = 1 (the default) is the
one-GPU path above, unchanged.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from itertools import combinations
from math import comb
from operator import itemgetter
from typing import NamedTuple

from . import spanning
from .constants import MAX_SCORE, MIN_SCORE
from .views import GpuRow, GpuView, NodeView


@dataclass(frozen=True, slots=True)
class Fit:
    ok: bool
    unresolvable: bool  # no GPU could ever hold the pod here: preemption must not try this node
    reason: str


FITS = Fit(True, False, "")


# What filter and prioritize need of one node for one pod size and policy: (fits, unresolvable, reason when
# it does not fit, score). A plain tuple of atoms: the memo keeps tens of thousands, which the cyclic
# garbage collector then never scans (fitmemo.py).
Verdict = tuple[bool, bool, str, int]


class LimitNeed(NamedTuple):
    """The limit cap's side of a decision: the pod's limit on a GPU of this node (MiB, at the node's unit)
    and the cap's ratio (`--max-limit-ratio`, ≥ 1). Decisions take None when the cap is off."""

    mib: int
    ratio: Fraction


def limit_cap_mib(mem_mib: int, ratio: Fraction) -> int:
    """A GPU's cap on the sum of its pods' limits: ratio × its memory, rounded down (exact: no float)."""
    return (ratio.numerator * mem_mib) // ratio.denominator


def within_limit_cap(limit_sum_mib: int, pod_limit_mib: int, mem_mib: int, ratio: Fraction) -> bool:
    """The --max-limit-ratio policy: may a pod whose limit is `pod_limit_mib` join a GPU of `mem_mib` whose
    pods' limits add up to `limit_sum_mib`?"""
    return limit_sum_mib + pod_limit_mib <= limit_cap_mib(mem_mib, ratio)


def limit_sum(view: NodeView, i: int) -> int:
    """The sum of the limits of the pods on the node's i-th GPU (in `rows` order)."""
    return view.rows[i][5] + (view.over[i] if view.over is not None else 0)


def _capped(view: NodeView, need_mib: int, limit: LimitNeed | None) -> bool:
    """Does the cap change anything here? Not for a pod whose limit is its request on a node whose pods
    have none above theirs: there limit sum = used, and room for the request keeps it within R ≥ 1."""
    return limit is not None and (view.over is not None or limit.mib > need_mib)


def _ratio_text(ratio: Fraction) -> str:
    return f"{float(ratio):g}"


def fit(view: NodeView, need_mib: int, limit: LimitNeed | None = None) -> Fit:
    """Can a pod needing `need_mib` MiB on one GPU be placed on this node now (within the limit cap when
    `limit` is given)?"""
    if limit is not None and _capped(view, need_mib, limit):
        return _capped_fit(view, need_mib, limit)[0]
    if view.max_free_mib >= need_mib and not view.unplaced_mib and not view.error:
        return FITS  # the common case, O(1)
    if view.error:
        return Fit(False, True, view.error)
    return _not_placeable(view, need_mib) or _no_room(view, need_mib) or FITS


def _not_placeable(view: NodeView, need_mib: int) -> Fit | None:
    """Why no GPU of this node could ever hold the pod; None when one could."""
    if not view.rows:
        return Fit(False, True, "node advertises no memslice GPUs")
    if not view.max_mem_mib:
        return Fit(False, True, f"all {len(view.rows)} memslice GPUs of the node are unhealthy")
    if view.max_mem_mib < need_mib:
        return Fit(False, True, f"pod needs {need_mib} MiB on one GPU; the largest healthy GPU here has "
                                f"{view.max_mem_mib} MiB")
    return None


def _no_room(view: NodeView, need_mib: int) -> Fit | None:
    """Why the pod does not fit now (other pods hold the room); None when it fits."""
    if view.max_free_mib < need_mib:
        return Fit(False, False, no_room_reason(need_mib))
    if view.total_free_mib - view.unplaced_mib < need_mib:
        return Fit(False, False, f"pod needs {need_mib} MiB; the node's free GPU memory is held by pods bound "
                                 f"without the extender (GPU unknown)")
    return None


# Refusal texts are one per cause, the same on every node that refuses for that cause: kube-scheduler's
# FailedScheduling event groups nodes by their text ("0/20 nodes are available: 14 <text>, 6 <text>."), so a
# per-node number (this node's most free GPU, its index) would give one line per node instead of one per cause.
# The numbers kept are the pod's and those shared by many nodes (a GPU model's size, the --max-limit-ratio).
def no_room_reason(need_mib: int) -> str:
    """Why a node whose GPUs are big enough does not take the pod now."""
    return f"pod needs {need_mib} MiB on one GPU; no GPU of the node has that much free now"


def _capped_fit(view: NodeView, need_mib: int, limit: LimitNeed) -> tuple[Fit, list[GpuRow]]:
    """fit under the cap, with the GPUs that may take the pod (for _pick: computed once)."""
    if view.error:
        return Fit(False, True, view.error), []
    refusal = _not_placeable(view, need_mib) or _never_within_cap(view, limit) or _no_room(view, need_mib)
    if refusal is not None:
        return refusal, []
    rows = _within_cap(view, need_mib, limit)
    return (FITS if rows else Fit(False, False, _cap_reason(view, need_mib, limit))), rows


def _never_within_cap(view: NodeView, limit: LimitNeed) -> Fit | None:
    """Why no GPU here could take the pod's limit even empty; None when one could. The cap grows with the
    GPU, and the largest healthy GPU can hold the request (_not_placeable): it alone decides."""
    largest = view.max_mem_mib
    if within_limit_cap(0, limit.mib, largest, limit.ratio):
        return None
    ratio = _ratio_text(limit.ratio)
    return Fit(False, True, f"pod's GPU memory limit of {limit.mib} MiB (memslice.io/gpu-mem-limit) is above "
                            f"the limit cap (--max-limit-ratio {ratio}) of every GPU here: the largest GPU's "
                            f"cap is {limit_cap_mib(largest, limit.ratio)} MiB ({ratio} × {largest} MiB); "
                            f"ask for a lower limit")


def _within_cap(view: NodeView, need_mib: int, limit: LimitNeed) -> list[GpuRow]:
    """The healthy GPUs with room for the request and for the limit under the cap."""
    over = view.over if view.over is not None else (0,) * len(view.rows)
    return [r for r, o in zip(view.rows, over, strict=True) if r[4] and r[6] >= need_mib
            and within_limit_cap(r[5] + o, limit.mib, r[3], limit.ratio)]


def _cap_reason(view: NodeView, need_mib: int, limit: LimitNeed) -> str:
    """Why the GPUs with room for the request refuse the limit: the one with the most headroom, named."""
    room = [(limit_cap_mib(r[3], limit.ratio) - limit_sum(view, i), r[1], i) for i, r in enumerate(view.rows)
            if r[4] and r[6] >= need_mib]
    _, index, i = max(room, key=lambda t: (t[0], -t[1]))
    mem, total, ratio = view.rows[i][3], limit_sum(view, i), _ratio_text(limit.ratio)
    return (f"limit cap (--max-limit-ratio {ratio}): pod's GPU memory limit of {limit.mib} MiB does not fit; "
            f"on GPU {index}, the one with the most headroom, the limits of its pods add up to {total} MiB "
            f"of a cap of {limit_cap_mib(mem, limit.ratio)} MiB ({ratio} × {mem} MiB)")


def _compute_fit(view: NodeView, need_mib: int, limit: LimitNeed | None, compute: int, policy: str
                 ) -> tuple[Fit, GpuView | None, int]:
    """fit, the GPU `policy` takes and the score for a pod with a compute share: among the GPUs with room for
    its memory (within the cap) AND its compute, the one left with the least (binpack) or most (spread) free
    memory and compute together (the two free fractions added up; ties to the lower index). One pass."""
    if limit is not None and _capped(view, need_mib, limit):
        f, rows = _capped_fit(view, need_mib, limit)
    else:
        f = fit(view, need_mib)
        rows = list(view.rows) if f.ok else []
    if not f.ok:
        return f, None, MIN_SCORE
    cols = view.compute_used() if view.compute is not None else {}
    sign = -1 if policy == "spread" else 1
    best = min(((sign * ((r[6] - need_mib) / r[3] + (100 - cols.get(r[0], 0) - compute) / 100), r[1], r)
                for r in rows if r[4] and r[6] >= need_mib and cols.get(r[0], 0) + compute <= 100), default=None)
    if best is None:
        return Fit(False, False, no_compute_reason(need_mib, compute)), None, MIN_SCORE
    left = sign * best[0] / 2  # the mean of the two free fractions after placement
    fraction = left if policy == "spread" else 1 - left
    return FITS, GpuView._make(best[2]), max(MIN_SCORE, min(MAX_SCORE, round(MAX_SCORE * fraction)))


def no_compute_reason(need_mib: int, compute: int) -> str:
    """Why a node with room for the pod's memory does not take its compute share now. No '%' sign: the
    kube-scheduler formats the reasons it is given (a '%' followed by a letter comes out as '%!c(MISSING)')."""
    return (f"pod needs {compute} percent compute (memslice.io/gpu-compute) on the GPU that holds its {need_mib} "
            f"MiB; no GPU of the node with that memory free has that compute free now (its pods' compute requests "
            f"would add up to over 100 percent)")


def _pick_of(rows: list[GpuRow], policy: str) -> GpuView | None:
    """The GPU `policy` takes among `rows` (those within the cap): the same order as _pick's."""
    if not rows:
        return None
    sign = -1 if policy == "spread" else 1  # spread: the most free; binpack: the least; ties to the lower index
    best: GpuRow = min(rows, key=lambda r: (sign * r[6], r[1]))
    return GpuView._make(best)


def _pick(view: NodeView, need_mib: int, policy: str) -> GpuView | None:
    """The GPU `policy` takes on a node where the pod fits (without the cap, or where it changes nothing)."""
    if policy == "spread":  # most free after placement; ties to the lower index
        return view.most_free
    i = bisect_left(view.free_keys, need_mib)  # binpack: least free that still fits; ties to the lower index
    return view.free_gpu(i) if i < len(view.free_keys) else None


def choose_gpus(view: NodeView, need_mib: int, policy: str, limit: LimitNeed | None = None, compute: int = 0,
                gpus: int = 1) -> tuple[GpuView, ...] | None:
    """The GPUs the pod gets on this node (`need_mib`, `compute`, `limit` per GPU), in device order; None when
    it does not fit."""
    if gpus > 1:
        return spanning.choose(view, need_mib, policy, limit, compute, gpus)
    gpu = choose_gpu(view, need_mib, policy, limit, compute)
    return (gpu,) if gpu is not None else None


def choose_gpu(view: NodeView, need_mib: int, policy: str, limit: LimitNeed | None = None,
               compute: int = 0) -> GpuView | None:
    """The GPU the pod gets on this node under `policy`; None when it does not fit."""
    if compute:
        return _compute_fit(view, need_mib, limit, compute, policy)[1]
    if limit is not None and _capped(view, need_mib, limit):
        return _pick_of(_capped_fit(view, need_mib, limit)[1], policy)
    return _pick(view, need_mib, policy) if fit(view, need_mib).ok else None


def _score_on(gpu: GpuView | None, need_mib: int, policy: str) -> int:
    if gpu is None:
        return MIN_SCORE
    free_after = gpu.free_mib - need_mib
    fraction = free_after / gpu.mem_mib if policy == "spread" else 1 - free_after / gpu.mem_mib
    return max(MIN_SCORE, min(MAX_SCORE, round(MAX_SCORE * fraction)))


def score(view: NodeView, need_mib: int, policy: str, limit: LimitNeed | None = None, compute: int = 0,
          gpus: int = 1) -> int:
    """0..10: how much `policy` likes placing the pod on this node (0 when it does not fit)."""
    if compute or gpus > 1:
        return verdict(view, need_mib, policy, limit, compute, gpus)[3]
    return _score_on(choose_gpu(view, need_mib, policy, limit), need_mib, policy)


def verdict(view: NodeView, need_mib: int, policy: str, limit: LimitNeed | None = None,
            compute: int = 0, gpus: int = 1) -> Verdict:
    """fit and score of one node in one go (what the memo keeps)."""
    if gpus > 1:
        return spanning.verdict(view, need_mib, policy, limit, compute, gpus)
    if compute:
        f, _, value = _compute_fit(view, need_mib, limit, compute, policy)
        return f.ok, f.unresolvable, f.reason, value
    if limit is not None and _capped(view, need_mib, limit):
        f, rows = _capped_fit(view, need_mib, limit)
        return f.ok, f.unresolvable, f.reason, _score_on(_pick_of(rows, policy), need_mib, policy)
    f = fit(view, need_mib)
    value = _score_on(_pick(view, need_mib, policy), need_mib, policy) if f.ok else MIN_SCORE
    return f.ok, f.unresolvable, f.reason, value


def fits_without(view: NodeView, need_mib: int, freed_mib: dict[str, int], freed_unplaced_mib: int,
                 limit: LimitNeed | None = None, freed_over: dict[str, int] | None = None, compute: int = 0,
                 freed_compute: dict[str, int] | None = None, count: int = 1) -> bool:
    """Would the pod fit if the charges in `freed_mib` (GPU UUID -> MiB; with `freed_over`, what their
    limits add above that; with `freed_compute`, their compute percent) and `freed_unplaced_mib` were gone?
    (Preemption: the scheduler proposes victims; the pod must fit once they are evicted.) A key naming
    several GPUs (a charge spanning GPUs: UUIDs joined by commas) frees its amount on each; `count` is the
    pod's own GPU count (memslice.io/gpu-count)."""
    freed_mib, freed_over, freed_compute = _per_gpu(freed_mib), _per_gpu(freed_over), _per_gpu(freed_compute)
    gpus = tuple(GpuView.of(g.uuid, g.index, g.model, g.mem_mib, g.healthy,
                            g.used_mib - freed_mib.get(g.uuid, 0)) for g in view.gpus)
    over = view.over
    if over is not None and freed_over:
        over = tuple(o - freed_over.get(r[0], 0) for o, r in zip(over, view.rows, strict=True))
    used = view.compute
    if used is not None and freed_compute:
        used = tuple(c - freed_compute.get(r[0], 0) for c, r in zip(used, view.rows, strict=True))
    after = NodeView.of(view.name, view.unit_mib, gpus, max(view.unplaced_mib - freed_unplaced_mib, 0),
                        view.error, over, used, view.topo)
    if count > 1:
        return spanning.fits_after(after, need_mib, limit, compute, count)
    if compute:
        return _compute_fit(after, need_mib, limit, compute, "binpack")[0].ok
    return fit(after, need_mib, limit).ok


def _per_gpu(freed: dict[str, int] | None) -> dict[str, int]:
    """`freed` with each key naming several GPUs (UUIDs joined by commas) spread over them."""
    if not freed:
        return {}
    if not any("," in k for k in freed):
        return freed
    out: dict[str, int] = {}
    for key, value in freed.items():
        for uuid in key.split(","):
            out[uuid] = out.get(uuid, 0) + value
    return out


class VictimCandidate(NamedTuple):
    """A pod preemption may evict to make room: its GPU charge on the node and its priority (lower than the
    preemptor's; the caller keeps only those). A pod spanning GPUs: `gpu_uuid` is their UUIDs joined by commas,
    and `mib`, `over`, `compute` what it holds on EACH."""

    uid: str
    gpu_uuid: str
    mib: int
    over: int  # what its elastic limits add above `mib` (the limit cap counts it)
    priority: int
    compute: int = 0  # its compute request in percent (the GPU's compute sum counts it)


def _room_after(view: NodeView, i: int, need_mib: int, victims: list[VictimCandidate], freed_unplaced_mib: int,
                limit: LimitNeed | None, compute: int = 0) -> bool:
    """Would the pod fit on the node's i-th GPU once `victims` (all on that GPU) are gone: its free memory,
    its compute (the GPU's requests at most 100 percent), the limit cap, and the node's total free memory net
    of pods bound without the extender (as `fit`)."""
    _, _, _, mem, healthy, _, free = view.rows[i]
    freed = sum(v.mib for v in victims)
    if view.error or not healthy or free + freed < need_mib:
        return False
    if compute and (view.compute[i] if view.compute else 0) - sum(v.compute for v in victims) + compute > 100:
        return False
    if limit is not None and not within_limit_cap(limit_sum(view, i) - freed - sum(v.over for v in victims),
                                                  limit.mib, mem, limit.ratio):
        return False
    total_after = view.total_free_mib - max(free, 0) + max(free + freed, 0)
    return total_after - max(view.unplaced_mib - freed_unplaced_mib, 0) >= need_mib


def _victims_on(view: NodeView, i: int, need_mib: int, pods: list[VictimCandidate], freed_unplaced_mib: int,
                limit: LimitNeed | None, compute: int = 0) -> list[VictimCandidate] | None:
    """The victims on the i-th GPU: the lowest-priority pods first (the largest first within a priority:
    fewer victims) until the pod fits, then each given back (highest priority first, then smallest) while it
    still fits, as the scheduler's own dry run reprieves. None when evicting every candidate is not enough."""
    chosen: list[VictimCandidate] = []
    for pod in sorted(pods, key=lambda v: (v.priority, -v.mib, v.uid)):
        if _room_after(view, i, need_mib, chosen, freed_unplaced_mib, limit, compute):
            break
        chosen.append(pod)
    if not _room_after(view, i, need_mib, chosen, freed_unplaced_mib, limit, compute):
        return None
    for pod in sorted(chosen, key=lambda v: (-v.priority, v.mib, v.uid)):
        rest = [v for v in chosen if v is not pod]
        if _room_after(view, i, need_mib, rest, freed_unplaced_mib, limit, compute):
            chosen = rest
    return fewest_then_least(pods, chosen, lambda c: _room_after(view, i, need_mib, c, freed_unplaced_mib, limit,
                                                                 compute), victim_mib, need_mib - view.rows[i][6])


MAX_VICTIM_SETS = 256  # sets of pods weighed by fewest_then_least (C(8, 4) = 70)


def victim_mib(v: VictimCandidate) -> int:
    """The MiB evicting `v` frees, the issue's "least memory": its charge on each of its GPUs."""
    return v.mib * (v.gpu_uuid.count(",") + 1)


def fewest_then_least(pods: list[VictimCandidate], chosen: list[VictimCandidate],
                      room: Callable[[list[VictimCandidate]], bool], cost: Callable[[VictimCandidate], int],
                      short: int, beat: tuple[int, int] | None = None) -> list[VictimCandidate]:
    """`chosen` (a greedy's set that makes `room`: the lowest highest priority, which the lowest-first greedy
    finds as room only grows with the victims; the largest pods first, so few of them) made exact for the issue's
    order among `pods` of no higher priority: the fewest victims, then the least `cost` (MiB evicted). Largest-first
    takes a 6 GiB pod where a 1 GiB one beside it is enough, and with compute shares or the limit cap it may take
    more pods than needed. Every set of up to len(chosen) of those pods is weighed, smallest first, while there are
    at most MAX_VICTIM_SETS of them (a GPU holds a few pods); beyond, the greedy's set stands. A set costing less
    than `short` (no set making room costs less) or no less than the best so far is passed over unweighed.
    `beat` (count, cost): only sets of at most that many victims costing at most that much matter (the best of
    another GPU or set already: chosen stands when none is found). One GPU (_victims_on) and a set of GPUs
    (spanning._victims_for_set) alike."""
    if not chosen:
        return chosen
    top = max(v.priority for v in chosen)
    pool = sorted(((cost(v), v) for v in pods if v.priority <= top), key=lambda t: (t[0], t[1].uid))
    most = len(chosen) if beat is None else min(len(chosen), beat[0])
    if sum(comb(len(pool), k) for k in range(1, most + 1)) > MAX_VICTIM_SETS:
        return chosen
    for k in range(1, most + 1):
        best_mib = sum(map(cost, chosen)) if k == len(chosen) else MAX_MIB_ANY
        if beat is not None and k == beat[0]:
            best_mib = min(best_mib, beat[1] + 1)
        best = None
        for c in combinations(pool, k):
            mib = sum(map(_first, c))
            if short <= mib < best_mib and room([t[1] for t in c]):
                best, best_mib = [t[1] for t in c], mib
        if best is not None:
            return best
    return chosen


MAX_MIB_ANY = 1 << 62  # above any sum of MiB
_first = itemgetter(0)


@dataclass(slots=True)
class SearchBudget:
    """What the N-GPU victim search may weigh on one node (spanning.preemption_victims): each GPU set searched
    spends the number of candidate pods holding its GPUs. The preempt verb splits its call's budget over the
    nodes it names; past a node's share the search stops at the best set found so far, or, where none has been
    found yet, searches on with each set's greedy alone (no exact search) until one is. Work, not time: the same
    request gets the same answer. `capped`: the share ran out before every set was searched."""

    units: int
    capped: bool = False


def preemption_victims(view: NodeView, need_mib: int, candidates: list[VictimCandidate],
                       freed_unplaced_mib: int = 0, limit: LimitNeed | None = None, compute: int = 0,
                       gpus: int = 1, budget: SearchBudget | None = None) -> tuple[str, ...] | None:
    """The pods to evict so that the pod fits on ONE GPU of this node: over every GPU, the set whose highest
    priority is lowest, then the fewest victims, then the least MiB evicted (victim_mib: a victim spanning GPUs
    frees its charge on each; ties to the lower GPU index).
    Only pods on that GPU are named, never one on a GPU the pod will not use (a victim spanning GPUs counts
    on each of its GPUs). None when no GPU can be freed enough; () when one has room already (with
    `freed_unplaced_mib` gone): no GPU pod needs evicting. A preemptor spanning `gpus` GPUs: spanning.py (N
    GPUs of one node freed, the same order, then the closest set; `budget` bounds that search: SearchBudget)."""
    if gpus > 1:
        return spanning.preemption_victims(view, need_mib, candidates, freed_unplaced_mib, limit, compute, gpus,
                                           budget=budget)
    best: tuple[tuple[int, int, int, int], tuple[str, ...]] | None = None
    for i, row in enumerate(view.rows):
        if not row[4] or row[3] < need_mib:
            continue
        chosen = _victims_on(view, i, need_mib, [c for c in candidates if c.gpu_uuid == row[0]
                                                 or ("," in c.gpu_uuid and row[0] in c.gpu_uuid.split(","))],
                             freed_unplaced_mib, limit, compute)
        if chosen is None:
            continue
        if not chosen:
            return ()
        rank = (max(v.priority for v in chosen), len(chosen), sum(map(victim_mib, chosen)), row[1])
        if best is None or rank < best[0]:
            best = rank, tuple(v.uid for v in chosen)
    return best[1] if best is not None else None

"""Scheduling decisions as pure functions of a NodeView and a pod's need: does it fit (and if not, can it
ever), its score, and the GPU chosen at bind. Every rule is written here once; the memo (fitmemo.py) only
stores what `verdict` answers, per node and pod size, until the node's view changes.

Policies:
- binpack (default): the GPU left with the least free MiB that still fits (fewer GPUs touched, big holes
  kept for big pods); a node scores higher the fuller that GPU is after placement.
- spread: the GPU left with the most free MiB; a node scores higher the emptier that GPU stays.
Ties go to the lower GPU index. Scores are `round(10 × fraction)` of the chosen GPU's memory used (binpack)
or left free (spread) after placement, in the extender range 0..10.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from memslice.scheduler_extender.constants import MAX_SCORE, MIN_SCORE
from memslice.scheduler_extender.views import GpuView, NodeView


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


def fit(view: NodeView, need_mib: int) -> Fit:
    """Can a pod needing `need_mib` MiB on one GPU be placed on this node now?"""
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
        best = view.most_free
        assert best is not None  # a healthy GPU exists (_not_placeable)
        return Fit(False, False, f"pod needs {need_mib} MiB on one GPU; the most free is "
                                 f"{max(best.free_mib, 0)} MiB (GPU {best.index})")
    if view.total_free_mib - view.unplaced_mib < need_mib:
        return Fit(False, False, f"pod needs {need_mib} MiB; {view.unplaced_mib} MiB of the node's free "
                                 f"memory is held by pods bound without the extender (GPU unknown)")
    return None


def _pick(view: NodeView, need_mib: int, policy: str) -> GpuView | None:
    """The GPU `policy` takes on a node where the pod fits."""
    if policy == "spread":  # most free after placement; ties to the lower index
        return view.most_free
    i = bisect_left(view.free_keys, need_mib)  # binpack: least free that still fits; ties to the lower index
    return view.free_gpu(i) if i < len(view.free_keys) else None


def choose_gpu(view: NodeView, need_mib: int, policy: str) -> GpuView | None:
    """The GPU the pod gets on this node under `policy`; None when it does not fit."""
    return _pick(view, need_mib, policy) if fit(view, need_mib).ok else None


def _score_on(gpu: GpuView | None, need_mib: int, policy: str) -> int:
    if gpu is None:
        return MIN_SCORE
    free_after = gpu.free_mib - need_mib
    fraction = free_after / gpu.mem_mib if policy == "spread" else 1 - free_after / gpu.mem_mib
    return max(MIN_SCORE, min(MAX_SCORE, round(MAX_SCORE * fraction)))


def score(view: NodeView, need_mib: int, policy: str) -> int:
    """0..10: how much `policy` likes placing the pod on this node (0 when it does not fit)."""
    return _score_on(choose_gpu(view, need_mib, policy), need_mib, policy)


def verdict(view: NodeView, need_mib: int, policy: str) -> Verdict:
    """fit and score of one node in one go (what the memo keeps)."""
    f = fit(view, need_mib)
    value = _score_on(_pick(view, need_mib, policy), need_mib, policy) if f.ok else MIN_SCORE
    return f.ok, f.unresolvable, f.reason, value


def fits_without(view: NodeView, need_mib: int, freed_mib: dict[str, int], freed_unplaced_mib: int) -> bool:
    """Would the pod fit if the charges in `freed_mib` (GPU UUID -> MiB) and `freed_unplaced_mib` were gone?
    (Preemption: the scheduler proposes victims; the pod must fit once they are evicted.)"""
    gpus = tuple(GpuView.of(g.uuid, g.index, g.model, g.mem_mib, g.healthy,
                            g.used_mib - freed_mib.get(g.uuid, 0)) for g in view.gpus)
    after = NodeView.of(view.name, view.unit_mib, gpus, max(view.unplaced_mib - freed_unplaced_mib, 0),
                        view.error)
    return fit(after, need_mib).ok

"""Scheduling decisions as pure functions of a NodeView and a pod's request: does it fit (and if not,
can it ever), its score, and the GPU chosen at bind.

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
from memslice.scheduler_extender.state import GpuView, NodeView


@dataclass(frozen=True, slots=True)
class Fit:
    ok: bool
    unresolvable: bool  # no GPU could ever hold the pod here: preemption must not try this node
    reason: str


FITS = Fit(True, False, "")


def fit(view: NodeView, need_mib: int) -> Fit:
    """Can a pod needing `need_mib` MiB on one GPU be placed on this node now?"""
    if view.max_free_mib >= need_mib and not view.unplaced_mib and not view.error:
        return FITS  # the common case, O(1)
    if view.error:
        return Fit(False, True, view.error)
    if not view.gpus:
        return Fit(False, True, "node advertises no memslice GPUs")
    if not view.max_mem_mib:
        return Fit(False, True, f"all {len(view.gpus)} memslice GPUs of the node are unhealthy")
    if view.max_mem_mib < need_mib:
        return Fit(False, True, f"pod needs {need_mib} MiB on one GPU; the largest healthy GPU here has "
                                f"{view.max_mem_mib} MiB")
    if view.max_free_mib < need_mib:
        best = max((g for g in view.gpus if g.healthy), key=lambda g: (g.free_mib, -g.index))
        return Fit(False, False, f"pod needs {need_mib} MiB on one GPU; the most free is "
                                 f"{max(best.free_mib, 0)} MiB (GPU {best.index})")
    if view.total_free_mib - view.unplaced_mib < need_mib:
        return Fit(False, False, f"pod needs {need_mib} MiB; {view.unplaced_mib} MiB of the node's free "
                                 f"memory is held by pods bound without the extender (GPU unknown)")
    return FITS


def choose_gpu(view: NodeView, need_mib: int, policy: str) -> GpuView | None:
    """The GPU the pod gets on this node under `policy`; None when it does not fit."""
    if not fit(view, need_mib).ok:
        return None
    if policy == "spread":  # most free after placement; ties to the lower index
        return view.most_free
    i = bisect_left(view.free_keys, need_mib)  # binpack: least free that still fits; ties to the lower index
    return view.by_free[i] if i < len(view.by_free) else None


def score(view: NodeView, need_mib: int, policy: str) -> int:
    """0..10: how much `policy` likes placing the pod on this node (0 when it does not fit)."""
    if view.max_free_mib >= need_mib and not view.unplaced_mib and not view.error:  # fit's fast path
        gpu = view.most_free if policy == "spread" else view.by_free[bisect_left(view.free_keys, need_mib)]
    else:
        gpu = choose_gpu(view, need_mib, policy)
    if gpu is None:
        return MIN_SCORE
    free_after = gpu.free_mib - need_mib
    fraction = free_after / gpu.mem_mib if policy == "spread" else 1 - free_after / gpu.mem_mib
    return max(MIN_SCORE, min(MAX_SCORE, round(MAX_SCORE * fraction)))


def fits_without(view: NodeView, need_mib: int, freed_mib: dict[str, int], freed_unplaced_mib: int) -> bool:
    """Would the pod fit if the charges in `freed_mib` (GPU UUID -> MiB) and `freed_unplaced_mib` were gone?
    (Preemption: the scheduler proposes victims; the pod must fit once they are evicted.)"""
    gpus = tuple(GpuView.of(g.uuid, g.index, g.model, g.mem_mib, g.healthy,
                            g.used_mib - freed_mib.get(g.uuid, 0)) for g in view.gpus)
    after = NodeView.of(view.name, view.unit_mib, gpus, max(view.unplaced_mib - freed_unplaced_mib, 0),
                        view.error)
    return fit(after, need_mib).ok

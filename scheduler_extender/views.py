"""Nodes as decisions see them: immutable views rebuilt from the inventory and the charges (state.py).

A NodeView carries what decisions.py needs in O(1): the largest free GPU, the largest GPU, the total free,
and the healthy GPUs sorted by free MiB (binpack's bisect). It is rebuilt when a charge on the node changes
(O(GPUs of the node)), so these stay current at every charge."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class GpuView(NamedTuple):
    """One GPU as decisions see it. A NamedTuple rather than a frozen dataclass: a node's view is rebuilt
    after every bind on it, and this is five times cheaper to build. Build with GpuView.of()."""

    uuid: str
    index: int
    model: str
    mem_mib: int
    healthy: bool
    used_mib: int
    free_mib: int  # mem - used (negative when over-committed)

    @classmethod
    def of(cls, uuid: str, index: int, model: str, mem_mib: int, healthy: bool, used_mib: int) -> GpuView:
        return cls(uuid, index, model, mem_mib, healthy, used_mib, mem_mib - used_mib)


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node as decisions see it. `error` is set when its inventory annotation is malformed.
    Build with NodeView.of(): the totals are computed once, so a fit check is O(1)."""

    name: str
    unit_mib: int
    gpus: tuple[GpuView, ...]
    unplaced_mib: int
    error: str | None
    max_free_mib: int  # over healthy GPUs
    max_mem_mib: int  # largest healthy GPU
    total_free_mib: int  # over healthy GPUs, negatives (over-commit) counted as 0
    healthy: tuple[GpuView, ...]  # in index order
    by_free: tuple[GpuView, ...]  # healthy GPUs sorted by (free, index): binpack takes the first that fits
    free_keys: tuple[int, ...]  # their free MiB, for bisect
    most_free: GpuView | None  # the healthy GPU with the most free MiB (lowest index on ties): spread's pick

    @classmethod
    def of(cls, name: str, unit_mib: int, gpus: tuple[GpuView, ...], unplaced_mib: int = 0,
           error: str | None = None) -> NodeView:
        healthy = tuple(sorted((g for g in gpus if g.healthy), key=lambda g: g.index))
        by_free = tuple(sorted(healthy, key=lambda g: (g.free_mib, g.index)))
        most_free = min(healthy, key=lambda g: (-g.free_mib, g.index)) if healthy else None
        return cls(name, unit_mib, gpus, unplaced_mib, error,
                   max((g.free_mib for g in healthy), default=0),
                   max((g.mem_mib for g in healthy), default=0),
                   sum(max(g.free_mib, 0) for g in healthy), healthy, by_free,
                   tuple(g.free_mib for g in by_free), most_free)

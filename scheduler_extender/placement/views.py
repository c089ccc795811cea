"""Nodes as decisions see them: immutable views rebuilt from the inventory and the charges (state.py).

A NodeView carries what decisions.py needs in O(1): the largest free GPU, the largest GPU, the total free,
and the healthy GPUs sorted by free MiB (binpack's bisect). It is rebuilt when a charge on the node changes
(O(GPUs of the node)), so these stay current at every charge."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from operator import itemgetter
from typing import NamedTuple


class GpuView(NamedTuple):
    """One GPU as decisions see it. A NamedTuple rather than a frozen dataclass: a node's view is rebuilt
    after every bind on it, and this is five times cheaper to build. Build with GpuView.of()."""

    uuid: str
    index: int  # type: ignore[assignment]  # the GPU's index; shadows tuple.index, never called on a view
    model: str
    mem_mib: int
    healthy: bool
    used_mib: int
    free_mib: int  # mem - used (negative when over-committed)

    @classmethod
    def of(cls, uuid: str, index: int, model: str, mem_mib: int, healthy: bool, used_mib: int) -> GpuView:
        return cls(uuid, index, model, mem_mib, healthy, used_mib, mem_mib - used_mib)


GpuRow = tuple[str, int, str, int, bool, int, int]  # a GpuView's fields as a plain tuple
# How close a node's GPUs are (contract.closeness: 0 NVLink, 1 same PCIe switch, 2 same NUMA node, 3 otherwise),
# for pods spanning GPUs: an int when every pair of the node's GPUs is that close (nothing known: 3), else the
# matrix in `rows` order. Made once per inventory (state.py) and shared by every view of the node.
Topology = int | tuple[tuple[int, ...], ...]
FAR = 3  # contract.closeness of two GPUs about which nothing is known
_mem, _healthy, _free, _free_then_index = itemgetter(3), itemgetter(4), itemgetter(6), itemgetter(6, 1)


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node as decisions see it. `error` is set when its inventory annotation is malformed.
    Build with NodeView.of(): the totals are computed once, so a fit check is O(1).

    The GPUs are kept as plain tuples of atoms (GpuViews are made when asked for): a view is rebuilt at
    every charge on its node, and the cyclic garbage collector stops tracking such tuples after their
    first collection, so 5,000 nodes' views cost its full collections 5,000 objects, not 60,000."""

    name: str
    unit_mib: int
    rows: tuple[GpuRow, ...]  # every GPU, as listed by the inventory
    unplaced_mib: int
    error: str | None
    max_free_mib: int  # over healthy GPUs
    max_mem_mib: int  # largest healthy GPU
    total_free_mib: int  # over healthy GPUs, negatives (over-commit) counted as 0
    free_rows: tuple[GpuRow, ...]  # healthy GPUs sorted by (free, index): binpack takes the first that fits
    free_keys: tuple[int, ...]  # their free MiB, for bisect
    most_free_row: GpuRow | None  # the healthy GPU with the most free MiB (lowest index on ties): spread's
    # Elastic memory: per GPU (in `rows` order) what its pods' limits add above their used MiB, so a GPU's
    # limit sum is used_mib + over[i] (decisions.limit_sum). None: no elastic pod here (limit sum = used).
    over: tuple[int, ...] | None = None
    # Compute share: per GPU (in `rows` order) the sum of its pods' compute requests in percent. None: no pod
    # with a compute share here (every GPU's compute is free).
    compute: tuple[int, ...] | None = None
    topo: Topology = FAR  # how close its GPUs are (Topology above): read only for pods spanning GPUs

    @classmethod
    def of(cls, name: str, unit_mib: int, gpus: tuple[GpuView, ...], unplaced_mib: int = 0,
           error: str | None = None, over: tuple[int, ...] | None = None,
           compute: tuple[int, ...] | None = None, topo: Topology = FAR) -> NodeView:
        return cls.of_rows(name, unit_mib, tuple(map(tuple, gpus)), unplaced_mib, error,  # type: ignore[arg-type]
                           over, compute, topo)

    @classmethod
    def of_rows(cls, name: str, unit_mib: int, rows: tuple[GpuRow, ...], unplaced_mib: int = 0,
                error: str | None = None, over: tuple[int, ...] | None = None,
                compute: tuple[int, ...] | None = None, topo: Topology = FAR) -> NodeView:
        # Built for every node at a restart and after every charge: one sort with a C key, and the totals
        # read off the sorted free column (the most free GPU: the first of the largest free, lowest index).
        healthy = rows if all(map(_healthy, rows)) else [r for r in rows if r[4]]
        by_free = tuple(sorted(healthy, key=_free_then_index))
        keys = tuple(map(_free, by_free))
        if not keys:
            return cls(name, unit_mib, rows, unplaced_mib, error, 0, 0, 0, (), (), None, over, compute, topo)
        top = keys[-1]
        return cls(name, unit_mib, rows, unplaced_mib, error, top, max(map(_mem, healthy)),
                   sum(k for k in keys if k > 0), by_free, keys, by_free[bisect_left(keys, top)], over, compute,
                   topo)

    @property
    def gpus(self) -> tuple[GpuView, ...]:
        return tuple(map(GpuView._make, self.rows))

    @property
    def healthy(self) -> tuple[GpuView, ...]:
        """Healthy GPUs in index order."""
        return tuple(sorted((g for g in self.gpus if g.healthy), key=lambda g: g.index))

    @property
    def by_free(self) -> tuple[GpuView, ...]:
        return tuple(map(GpuView._make, self.free_rows))

    @property
    def most_free(self) -> GpuView | None:
        return GpuView._make(self.most_free_row) if self.most_free_row is not None else None

    def compute_used(self) -> dict[str, int]:
        """GPU UUID -> the compute percent its pods' requests hold (absent: 0)."""
        if self.compute is None:
            return {}
        return {r[0]: c for r, c in zip(self.rows, self.compute, strict=True) if c}

    def free_gpu(self, i: int) -> GpuView:
        """The i-th healthy GPU by (free, index)."""
        return GpuView._make(self.free_rows[i])

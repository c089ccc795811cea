"""The preempt verb's cost (issue 39, item 3): the N-GPU search skips the GPU sets whose floor cannot beat the best
set so far (spanning.Floor) and answers exactly what the search of every set answers, also past
decisions.MAX_VICTIM_SETS (where a set's answer is its greedy's). The figures are benchmarks/bench_preempt.py's."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from memslice.contract import Gpu, Inventory
from memslice.scheduler_extender.placement import spanning
from memslice.scheduler_extender.placement.decisions import VictimCandidate
from memslice.scheduler_extender.placement.state import topology
from memslice.scheduler_extender.placement.views import GpuView, NodeView

GIB = 1024
MEM = 16 * GIB


def dense_node(n: int, spec: list[tuple[int, bool, int, int]], unplaced: int, shares: bool = False
               ) -> tuple[NodeView, list[VictimCandidate]]:
    """A node of n GPUs (NVLink pairs, a PCIe switch per four) filled by `spec`'s pods where they fit: (first GPU,
    on two GPUs (first, first ^ 1), MiB, priority); with `shares`, pod k also holds (k % 3) × 20 percent compute
    where the GPU has it (the node then has a compute column)."""
    gpus = [Gpu(f"GPU-{i}", i, "Sim", MEM, i * 2 // n, True, nvlink=(i ^ 1,), pcie=f"sw{i // 4}") for i in range(n)]
    used, pct = [0] * n, [0] * n
    pods = []
    for k, (first, two, mib, priority) in enumerate(spec):
        on = (first % n, (first % n) ^ 1) if two else (first % n,)
        share = (k % 3) * 20 if shares else 0
        if all(used[i] + mib <= MEM and pct[i] + share <= 100 for i in on):
            for i in on:
                used[i] += mib
                pct[i] += share
            pods.append(VictimCandidate(f"v{k}", ",".join(f"GPU-{i}" for i in on), mib, 0, priority, share))
    rows = tuple(GpuView.of(g.uuid, g.index, g.model, g.mem_mib, True, u) for g, u in zip(gpus, used, strict=True))
    return NodeView.of("n", 1, rows, unplaced, None, None, tuple(pct) if shares else None,
                       topology(Inventory(1, tuple(gpus)))), pods


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([4, 8]), st.sampled_from([2, 3, 4]),
       st.lists(st.tuples(st.integers(0, 7), st.booleans(), st.sampled_from([256, 512, GIB, 2 * GIB, 3 * GIB, 6 * GIB]),
                          st.integers(0, 3)), max_size=80),
       st.integers(1, 16 * 4), st.sampled_from([0, 0, 2 * GIB]), st.sampled_from([0, GIB]), st.sampled_from([0, 30]))
def test_pruned_sets_never_change_the_answer(n, gpus, spec, need_quarter_gib, unplaced, freed_unplaced, compute):
    """Dense nodes (up to 80 pods of 256 MiB to 6 GiB, some on two GPUs, four priorities; pods bound without the
    extender at times; compute shares at times): the pruned search (Floor) with each part's greedy kept (Alone)
    names exactly the victims the search of every set in full names, also where a set's pods are too many for
    the exact search (its greedy answer stands, and the `beat` a set is searched with depends on the sets before
    it)."""
    view, pods = dense_node(n, spec, unplaced, shares=bool(compute))
    need = need_quarter_gib * GIB // 4
    want = spanning.preemption_victims(view, need, list(pods), freed_unplaced, None, compute, gpus, prune=False)
    assert spanning.preemption_victims(view, need, list(pods), freed_unplaced, None, compute, gpus) == want


def test_dense_nodes_answer_as_the_full_search():
    """Nodes filled to the brim (bench_preempt.py's: 10 pods of 1-2 GiB per GPU, a fifth on an NVLink pair), where
    the node's free total is short and the greedy takes every pod until it is not: the same victims as the search
    of every set in full, for 2- and 4-GPU preemptors."""
    rng = random.Random(7)
    for _ in range(12):
        spec = [(rng.randrange(8), rng.random() < 0.2, rng.choice([GIB, 2 * GIB]), rng.randrange(3))
                for _ in range(160)]
        view, pods = dense_node(8, spec, 0)
        for gpus in (2, 4):
            want = spanning.preemption_victims(view, 10 * GIB, list(pods), 0, None, 0, gpus, prune=False)
            assert spanning.preemption_victims(view, 10 * GIB, list(pods), 0, None, 0, gpus) == want


def test_a_set_lacking_memory_its_pods_cannot_free_is_never_searched():
    """Floor.may_beat: a set with a GPU whose pods cannot free its shortfall is skipped (the search answers None
    there); a set at a higher floor priority than the best is skipped; one at a lower floor is searched."""
    # GPUs 0-1 full of priority-0 pods, GPUs 2-3 full of priority-5 pods, GPU 3 also 4 GiB held by nothing evictable
    spec = [(0, False, 4 * GIB, 0)] * 4 + [(1, False, 4 * GIB, 0)] * 4 + [(2, False, 4 * GIB, 5)] * 4 + \
        [(3, False, 4 * GIB, 5)] * 3
    view, pods = dense_node(4, spec, 0)
    view = NodeView.of("n", 1, tuple(GpuView.of(r[0], r[1], r[2], r[3], True, MEM) for r in view.rows), 0, None,
                       None, None, view.topo)  # GPU 3's last 4 GiB: no candidate holds it
    floor = spanning.Floor(view, 16 * GIB, pods)
    assert not floor.may_beat((2, 3), None)  # GPU 3 cannot be freed: 12 GiB of pods
    assert floor.may_beat((0, 1), None)
    best = (0, 8, 8 * 4 * GIB, 0, (0, 1))  # (priority, count, MiB, distance, indices) of the set (0, 1)
    assert not floor.may_beat((1, 2), best)  # needs priority 5
    assert not floor.may_beat((0, 2), best)
    assert spanning.preemption_victims(view, 16 * GIB, pods, 0, None, 0, 2) == tuple(f"v{k}" for k in range(8))

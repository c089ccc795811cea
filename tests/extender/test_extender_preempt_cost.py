"""The preempt verb's cost (issue 39, item 3): the N-GPU search skips the GPU sets whose floor cannot beat the best
set so far (spanning.Floor), keeps each part's greedy across sets (spanning.Alone), and answers exactly what the
search of every set answers, also past decisions.MAX_VICTIM_SETS (where a set's answer is its greedy's); a preempt
request's search is bounded by a budget of pods weighed, split over its nodes (decisions.SearchBudget), over real
HTTP. The figures are benchmarks/bench_preempt.py's."""

from __future__ import annotations

import logging
import random
from itertools import combinations

from hypothesis import given, settings
from hypothesis import strategies as st
from test_extender_support import node_obj, pod_obj, running_cluster

from memslice.contract import ANN_GPU_COUNT, Gpu, Inventory, Reservation
from memslice.scheduler_extender.placement import decisions, spanning
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


def _sets_with_room(view: NodeView, victims: list[VictimCandidate], need: int, gpus: int) -> list[tuple[int, ...]]:
    """The sets of `gpus` GPUs each with `need` free once `victims` are gone, every victim holding one of them."""
    on = [{int(u.split("-")[1]) for u in v.gpu_uuid.split(",")} for v in victims]
    freed = [0] * len(view.rows)
    for v, gs in zip(victims, on, strict=True):
        for g in gs:
            freed[g] += v.mib
    return [s for s in combinations(range(len(view.rows)), gpus)
            if all(gs & set(s) for gs in on) and all(view.rows[g][6] + freed[g] >= need for g in s)]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([2, 4]), st.integers(0, 400), st.integers(0, 2 ** 32 - 1))
def test_a_spent_budget_still_answers_valid_victims(gpus, units, seed):
    """decisions.SearchBudget of 0-400 pods on a node of 40-160 pods (8 GPUs, 1-2 GiB pods, a fifth on NVLink pairs):
    victims wherever the full search finds some, on `gpus` GPUs they all sit on, none of them needless there (none at
    all where a set has room already), never ranking better than the full search's; `capped` when the budget stopped
    the search. (Another set may have needed fewer: the search stopped before it.)"""
    rng = random.Random(seed)
    spec = [(rng.randrange(8), rng.random() < 0.2, rng.choice([GIB, 2 * GIB]), rng.randrange(3))
            for _ in range(rng.randrange(40, 160))]
    view, pods = dense_node(8, spec, 0)
    need = rng.choice([2, 6, 10, 16]) * GIB
    budget = decisions.SearchBudget(units)
    got = decisions.preemption_victims(view, need, pods, gpus=gpus, budget=budget)
    full = decisions.preemption_victims(view, need, pods, gpus=gpus)
    assert (got is None) == (full is None)
    if got is None or full is None:
        return
    by_uid = {v.uid: v for v in pods}
    chosen = [by_uid[u] for u in got]
    # on a set they all sit on, none of them needless there (each given back, that set lacks room)
    assert any(all(s not in _sets_with_room(view, chosen[:k] + chosen[k + 1:], need, gpus) for k in range(len(chosen)))
               for s in _sets_with_room(view, chosen, need, gpus)), got

    def rank(uids: tuple[str, ...]) -> tuple[int, int, int]:
        vs = [by_uid[u] for u in uids]
        return max((v.priority for v in vs), default=-1), len(vs), sum(map(decisions.victim_mib, vs))

    assert rank(full) <= rank(got)
    assert budget.capped or got == full


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


def _room_on(free: list[int], victims: list[tuple[int, ...]], mibs: list[int], need: int) -> list[tuple[int, int]]:
    """The 2-GPU sets that have `need` free on both GPUs once the victims (GPUs held, MiB on each) are gone, each
    victim holding a GPU of the set."""
    out = []
    for pair in combinations(range(len(free)), 2):
        after = list(free)
        for on, mib in zip(victims, mibs, strict=True):
            for g in on:
                after[g] += mib
        if all(set(on) & set(pair) for on in victims) and all(after[g] >= need for g in pair):
            out.append(pair)
    return out


def test_a_request_over_its_budget_answers_valid_victims_on_every_node(caplog):
    """Over HTTP: ten nodes of four full 16 GiB GPUs (1-2 GiB pods, 2 GiB pods on GPUs 2 and 3), a 2-GPU preemptor
    needing 10 GiB on each, every pod proposed. With the request's budget down to one pod, each node's search
    stops at the first set that makes room (GPUs 0 and 1, where the full search finds GPUs 2 and 3 better): every
    node still answers, with victims of that node that make room on
    two GPUs they all sit on, none of them needless (each given back, no two GPUs would have room), never ranking
    better than the full search's; the capped nodes are counted (/metrics) and logged."""
    need = 10 * GIB
    rng = random.Random(3)
    with running_cluster() as c:
        c.start()
        layout: dict[str, dict[str, tuple[tuple[int, ...], int]]] = {}  # node -> uid -> (GPUs, MiB on each)
        for n in range(10):
            node = f"n{n}"
            c.kube.put(node_obj(node, [MEM] * 4))
            used = [0] * 4
            pods = []
            for _ in range(2):  # on the last pair: the first set searched, GPUs 0 and 1, is not the best
                pods.append(((2, 3), 2 * GIB))
                used[2] += 2 * GIB
                used[3] += 2 * GIB
            for g in range(4):
                while used[g] < MEM:
                    mib = min(rng.choice([GIB, 2 * GIB]), MEM - used[g])
                    pods.append(((g,), mib))
                    used[g] += mib
            layout[node] = {}
            for k, (on, mib) in enumerate(pods):
                uuids = ",".join(f"GPU-{node}-{g}" for g in on)
                ann = Reservation(uuids, (("main", mib * len(on)),), None).format()
                if len(on) > 1:
                    ann[ANN_GPU_COUNT] = str(len(on))
                body = pod_obj(f"{node}-p{k}", {"main": mib * len(on)}, node=node, annotations=ann)
                body["spec"]["priority"] = k % 3
                layout[node][c.kube.put(body)["metadata"]["uid"]] = (on, mib)
        c.caught_up()
        urgent = pod_obj("urgent", {"main": 2 * need}, annotations={ANN_GPU_COUNT: "2"})
        urgent["spec"]["priority"] = 1000
        urgent = c.add_pod(urgent)
        meta = {node: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": 0} for node, uids in layout.items()}

        def ask() -> dict[str, list[str]]:
            status, body = c.c.post("preempt", {"Pod": urgent, "NodeNameToMetaVictims": meta})
            assert status == 200, body
            return {node: [p["UID"] for p in v["Pods"]] for node, v in body["NodeNameToMetaVictims"].items()}

        def capped() -> float:
            _, text, _ = c.c.raw("GET", "/metrics")
            name = "memslice_extender_preempt_capped_nodes_total"
            (line,) = [x for x in text.decode().splitlines() if x.startswith(name)]
            return float(line.split()[1])

        full = ask()
        assert capped() == 0
        assert c.ext is not None
        c.ext.verbs.preempt_budget = 1
        with caplog.at_level(logging.INFO, logger="memslice.scheduler_extender.edge.verbs"):
            cut = ask()
        assert capped() == 10 and "stopped at its share of the request's budget" in caplog.text
        assert set(cut) == set(full) == set(layout)
        for node, uids in cut.items():
            assert set(uids) <= set(layout[node]) and len(set(uids)) == len(uids)
            on = [layout[node][u][0] for u in uids]
            mib = [layout[node][u][1] for u in uids]
            free = [MEM - sum(m for o, m in layout[node].values() if g in o) for g in range(4)]
            assert _room_on(free, on, mib, need), (node, uids)  # room on two GPUs they all sit on
            for k in range(len(uids)):  # none needless
                assert not _room_on(free, on[:k] + on[k + 1:], mib[:k] + mib[k + 1:], need), (node, uids[k])

        def rank(node: str, chosen: list[str]) -> tuple[int, int, int]:
            """The issue's order: highest priority, count, MiB evicted."""
            prio = {p["metadata"]["uid"]: p["spec"]["priority"] for p in c.kube.list("Pod")}
            return (max(prio[u] for u in chosen), len(chosen),
                    sum(layout[node][u][1] * len(layout[node][u][0]) for u in chosen))

        assert all(rank(n, full[n]) <= rank(n, cut[n]) for n in layout)
        assert any(rank(n, full[n]) < rank(n, cut[n]) for n in layout)  # the cap made a difference

"""Preemption frees ONE GPU (issue 39, item 3): decisions.preemption_victims, a pure function of a node's view,
the pod's need and the pods preemption may evict, and the preempt verb over real HTTP against the API stand-in
(the victims' priorities read from it). The real kube-scheduler case is in test_real_scheduler.py."""

from __future__ import annotations

from fractions import Fraction
from itertools import combinations

from hypothesis import given, settings
from hypothesis import strategies as st
from test_extender_support import node_obj, pod_obj, running_cluster

from memslice.scheduler_extender.placement import decisions
from memslice.scheduler_extender.placement.decisions import LimitNeed, VictimCandidate
from memslice.scheduler_extender.placement.state import GpuView, NodeView

GIB = 1024


def node(*used: int, mem: int = 16 * GIB, unplaced: int = 0) -> NodeView:
    return NodeView.of("n", 1, tuple(GpuView.of(f"g{i}", i, "m", mem, True, u) for i, u in enumerate(used)),
                       unplaced)


def pod(uid: str, gpu: int, mib: int, priority: int = 0, over: int = 0) -> VictimCandidate:
    return VictimCandidate(uid, f"g{gpu}", mib, over, priority)


def test_two_pods_of_one_gpu_are_evicted_not_one_on_each():
    """The issue's case: 8 GiB pods on both GPUs, a 16 GiB pod: both pods of ONE GPU, none of the other."""
    view = node(16 * GIB, 16 * GIB)
    pods = [pod("a", 0, 8 * GIB, 10), pod("b", 0, 8 * GIB, 100), pod("c", 1, 8 * GIB, 10), pod("d", 1, 8 * GIB, 100)]
    assert decisions.preemption_victims(view, 16 * GIB, pods) == ("a", "b")
    assert decisions.preemption_victims(view, 8 * GIB, pods) == ("a",)  # one low pod is enough
    assert decisions.preemption_victims(view, 17 * GIB, pods) is None  # no GPU is that large


def test_lowest_priority_first_then_fewest_then_least_memory():
    view = node(16 * GIB, 16 * GIB, 16 * GIB)
    # GPU 0: one 16 GiB pod of priority 50; GPU 1: two 8 GiB pods of priority 10; GPU 2: 12 + 4 GiB of 10
    pods = [pod("big", 0, 16 * GIB, 50), pod("x", 1, 8 * GIB, 10), pod("y", 1, 8 * GIB, 10),
            pod("p", 2, 12 * GIB, 10), pod("q", 2, 4 * GIB, 10)]
    assert decisions.preemption_victims(view, 16 * GIB, pods) in {("x", "y"), ("p", "q")}  # priority 10 wins
    assert set(decisions.preemption_victims(view, 12 * GIB, pods) or ()) == {"p"}  # fewest: one pod of 12
    pods = [pod("a", 0, 10 * GIB), pod("b", 1, 12 * GIB), pod("r", 0, 6 * GIB, 5), pod("s", 1, 4 * GIB, 5)]
    assert decisions.preemption_victims(view, 10 * GIB, pods) == ("a",)  # one pod each: the least MiB
    # within a GPU, the lower-priority pods go first, and one not needed is given back
    pods = [pod("lo", 0, 4 * GIB, 1), pod("mid", 0, 8 * GIB, 5), pod("hi", 0, 4 * GIB, 9)]
    assert decisions.preemption_victims(node(16 * GIB), 8 * GIB, pods) == ("mid",)
    assert set(decisions.preemption_victims(node(16 * GIB), 12 * GIB, pods) or ()) == {"lo", "mid"}


def test_room_already_or_unhealthy_or_capped():
    assert decisions.preemption_victims(node(8 * GIB, 16 * GIB), 8 * GIB, [pod("a", 1, 8 * GIB)]) == ()
    sick = NodeView.of("n", 1, (GpuView.of("g0", 0, "m", 16 * GIB, False, 0),
                                GpuView.of("g1", 1, "m", 16 * GIB, True, 16 * GIB)))
    assert decisions.preemption_victims(sick, 8 * GIB, [pod("a", 1, 8 * GIB), pod("b", 1, 8 * GIB)]) in {
        ("a",), ("b",)}
    # a pod bound without the extender (GPU unknown) holds 8 GiB of the node: it may be on either GPU
    assert decisions.preemption_victims(node(16 * GIB, 0, unplaced=8 * GIB), 16 * GIB,
                                        [pod("a", 0, 16 * GIB)]) == ("a",)
    assert decisions.preemption_victims(node(16 * GIB, unplaced=8 * GIB), 16 * GIB, [pod("a", 0, 16 * GIB)]) is None
    full = node(16 * GIB, unplaced=16 * GIB)
    assert decisions.preemption_victims(full, 16 * GIB, [pod("a", 0, 16 * GIB)]) is None
    assert decisions.preemption_victims(full, 16 * GIB, [pod("a", 0, 16 * GIB)], freed_unplaced_mib=16 * GIB) == (
        "a",)
    # the limit cap (1.5 × 16 GiB): an elastic pod's limit counts until it is evicted too
    over = NodeView.of("n", 1, (GpuView.of("g0", 0, "m", 16 * GIB, True, 12 * GIB),), over=(12 * GIB,))
    need = LimitNeed(8 * GIB, Fraction(3, 2))
    pods = [pod("plain", 0, 4 * GIB, 1), pod("elastic", 0, 4 * GIB, 2, over=12 * GIB)]
    assert decisions.preemption_victims(over, 8 * GIB, pods) == ("plain",)
    assert decisions.preemption_victims(over, 8 * GIB, pods, limit=need) == ("elastic",)


def _fits(view: NodeView, need: int, victims: list[VictimCandidate]) -> bool:
    gpu = {v.gpu_uuid for v in victims}
    freed = {g: sum(v.mib for v in victims if v.gpu_uuid == g) for g in gpu}
    return len(gpu) <= 1 and any(r[4] and r[6] + freed.get(r[0], 0) >= need for r in view.rows)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 8), st.integers(0, 3)), max_size=7),
       st.integers(1, 16))
def test_the_choice_is_the_best_single_gpu_set_by_brute_force(spec, need):
    """Against every subset of the candidates: a set is returned iff one frees a GPU; it is on one GPU, makes
    room there, and no other feasible set has a lower (highest priority, count, MiB)."""
    pods = [pod(f"p{i}", g, gib * GIB, prio) for i, (g, gib, prio) in enumerate(spec)]
    used = [sum(p.mib for p in pods if p.gpu_uuid == f"g{g}") for g in range(3)]
    view = node(*used)
    got = decisions.preemption_victims(view, need * GIB, pods)
    feasible = [list(c) for n in range(len(pods) + 1) for c in combinations(pods, n)
                if _fits(view, need * GIB, list(c))]
    if not feasible:
        assert got is None
        return
    assert got is not None
    chosen = [p for p in pods if p.uid in got]
    assert len(chosen) == len(got) and _fits(view, need * GIB, chosen)
    if not chosen:
        assert [] in feasible
        return

    def rank(c: list[VictimCandidate]) -> tuple[int, int, int]:
        return (max(v.priority for v in c), len(c), sum(v.mib for v in c)) if c else (-1, 0, 0)

    # the order, whole: the lowest highest priority, then the fewest victims, then the least MiB
    assert rank(chosen) == min(rank(c) for c in feasible)


def test_of_equal_priority_and_count_the_least_memory_goes():
    """Issue 39.3's last rule within one GPU: a 6 GiB and a 1 GiB pod of one priority, the GPU 1 GiB short: the
    1 GiB pod goes (the largest first would evict 6 GiB for nothing); and of two pairs that make room, the
    smaller pair."""
    view = node(15 * GIB, 16 * GIB)
    pods = [pod("six", 0, 6 * GIB), pod("one", 0, 1 * GIB), pod("eight", 0, 8 * GIB)]
    assert decisions.preemption_victims(view, 2 * GIB, pods) == ("one",)
    view = node(16 * GIB)
    pods = [pod("a8", 0, 8 * GIB), pod("b6", 0, 6 * GIB), pod("c1", 0, 1 * GIB), pod("d5", 0, 5 * GIB),
            pod("e5", 0, 5 * GIB, 1)]
    # 10 GiB needed: no one pod frees it; of the pairs, 6 + 5 = 11 GiB (priority 0) rather than 8 + 6 = 14
    assert set(decisions.preemption_victims(view, 10 * GIB, pods) or ()) == {"b6", "d5"}


def test_preempt_verb_picks_both_pods_of_one_gpu_and_reads_their_priorities():
    """Over HTTP: the scheduler proposes one low pod on each GPU (what its node-wide dry run finds); the
    verb answers both pods of one GPU, reading the priorities from the API (stand-in) server."""
    with running_cluster() as c:
        c.start()
        c.add_node(node_obj("n", [16 * GIB, 16 * GIB]))
        pods = {}
        for name, priority in (("a", 10), ("b", 100), ("c", 10), ("d", 100)):
            body = pod_obj(name, {"main": 8 * GIB})
            body["spec"]["priority"] = priority
            pods[name] = c.add_pod(body)
            assert c.c.bind(pods[name], "n") == ""
        c.wait_used("n", [16 * GIB, 16 * GIB])
        uid = {n: p["metadata"]["uid"] for n, p in pods.items()}
        urgent = pod_obj("urgent", {"main": 16 * GIB})
        urgent["spec"]["priority"] = 1000
        urgent = c.add_pod(urgent)
        proposed = {"Pods": [{"UID": uid["a"]}, {"UID": uid["c"]}], "NumPDBViolations": 0}
        status, body = c.c.post("preempt", {"Pod": urgent, "NodeNameToMetaVictims": {"n": proposed}})
        assert status == 200, body
        (got,) = body["NodeNameToMetaVictims"].values()
        assert {p["UID"] for p in got["Pods"]} in ({uid["a"], uid["b"]}, {uid["c"], uid["d"]})
        # a preemptor of priority 50 may evict only the priority-10 pods: one per GPU is not room
        mid = pod_obj("mid", {"main": 16 * GIB})
        mid["spec"]["priority"] = 50
        status, body = c.c.post("preempt", {"Pod": c.add_pod(mid), "NodeNameToMetaVictims": {"n": proposed}})
        assert status == 200 and body["NodeNameToMetaVictims"] == {}


def test_preempt_reads_at_most_a_bounded_number_of_nodes_from_the_api():
    """A request naming many nodes where the proposed victims are not enough: at most PREEMPT_NODE_READS
    reads of the API server, whatever the request names."""
    from memslice.scheduler_extender.edge.verbs import PREEMPT_NODE_READS

    n = PREEMPT_NODE_READS + 4
    with running_cluster() as c:
        c.start()
        meta = {}
        for i in range(n):
            c.add_node(node_obj(f"n{i}", [16 * GIB]))
            uids = []
            for half in "ab":
                body = pod_obj(f"p{i}{half}", {"main": 8 * GIB})
                body["spec"]["priority"] = 10
                p = c.add_pod(body)
                assert c.c.bind(p, f"n{i}") == ""
                uids.append(p["metadata"]["uid"])
            meta[f"n{i}"] = {"Pods": [{"UID": uids[0]}], "NumPDBViolations": 0}  # one of two: not enough
        c.caught_up()
        urgent = pod_obj("urgent", {"main": 16 * GIB})
        urgent["spec"]["priority"] = 1000
        urgent = c.add_pod(urgent)
        c.kube.reset_counts()
        status, body = c.c.post("preempt", {"Pod": urgent, "NodeNameToMetaVictims": meta})
        assert status == 200, body
        assert len(body["NodeNameToMetaVictims"]) == PREEMPT_NODE_READS  # both pods of the node, where read
        assert all(len(v["Pods"]) == 2 for v in body["NodeNameToMetaVictims"].values())
        assert c.kube.request_counts[("list", "pods")] == PREEMPT_NODE_READS

"""The extender's watch cache at cluster scale: what it keeps per pod must not grow the work of the cyclic
garbage collector (whose full collections stop every verb), and the charges it derives are those of the
pods' reservations (no double counting when the same pods arrive again by a relist)."""

from __future__ import annotations

import gc
import json
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st
from test_extender_support import node_obj, pod_obj

from memslice.scheduler_extender.kubeio.annotations import reservation_annotations
from memslice.scheduler_extender.placement.state import ClusterState

PODS = 5000


def bound_pod(i: int, gpu: str, mib: int) -> dict:
    pod = pod_obj(f"p{i}", {"main": mib}, node="n", ns=f"team-{i % 7}",
                  annotations=reservation_annotations(gpu, {"main": mib}, 0))
    pod["metadata"].update(uid=f"uid-{i}", resourceVersion=str(i + 10))
    pod["status"] = {"phase": "Running"}
    return pod


def tracked_after(build: object) -> int:
    """Objects the cyclic collector tracks, once `build` has run and a full collection has passed."""
    gc.collect()
    before = len(gc.get_objects())
    keep = build()  # type: ignore[operator]
    gc.collect()
    grown = len(gc.get_objects()) - before
    del keep
    return grown


def test_watched_pods_leave_the_garbage_collector_nothing_to_scan() -> None:
    """5,000 bound GPU pods arriving by watch and a relist of them add a constant number of objects to
    what every full collection scans (the old per-pod dataclasses added four per pod: 0.45 s pauses at
    235,000 pods), and charge each GPU exactly once."""
    pods = [bound_pod(i, f"GPU-n-{i % 4}", 10) for i in range(PODS)]
    state = ClusterState()
    state.upsert_node(node_obj("n", [1 << 20] * 4))

    def watch() -> ClusterState:
        for pod in pods:
            state.upsert_pod(pod)
        return state

    assert tracked_after(watch) < 100
    assert [g.used_mib for g in state.view("n").gpus] == [PODS // 4 * 10] * 4
    relisted = ClusterState()
    relisted.upsert_node(node_obj("n", [1 << 20] * 4))

    def relist() -> ClusterState:
        from memslice.scheduler_extender.placement.state import pod_entry

        relisted.replace_pods([pod_entry(json.loads(json.dumps(p))) for p in pods], PODS + 10)
        relisted.replace_pods([pod_entry(p) for p in pods], PODS + 11)  # the same pods again: no double charge
        return relisted

    assert tracked_after(relist) < 100
    assert [g.used_mib for g in relisted.view("n").gpus] == [PODS // 4 * 10] * 4
    assert relisted.counts()["pods"] == PODS and relisted.pod("team-3", "p3").reservation == "GPU-n-3"


def test_node_views_and_their_memo_cost_the_collector_one_object_per_node() -> None:
    """Nodes of 8 GPUs, each charged (its view rebuilt) and filtered (memoised verdicts and JSON): about
    one object per node for the cyclic collector's full collections to scan (main: 22)."""
    from memslice.scheduler_extender.edge.metrics import Metrics
    from memslice.scheduler_extender.edge.verbs import Verbs

    def cluster(n: int) -> Callable[[], ClusterState]:
        """A fresh state and its verbs (made before measuring), and the build that measures them."""
        state = ClusterState()
        state.nodes_synced.set()
        state.pods_synced.set()
        verbs = Verbs(state, None, "binpack", Metrics(state))  # type: ignore[arg-type]  # no binds here
        names = [f"n{i}" for i in range(n)]

        def build() -> ClusterState:
            for i, name in enumerate(names):
                state.upsert_node(node_obj(name, [81920] * 8))
                pod = bound_pod(i, f"GPU-{name}-{i % 8}", 1000 + i % 50)
                pod["spec"]["nodeName"] = name
                state.upsert_pod(pod)
            for mib in (1024, 40960, 80000):
                assert verbs.filter({"Pod": pod_obj("x", {"main": mib}), "NodeNames": names})[0] == 200
            state.views()
            return state

        return build

    # The slope between two sizes: what code elsewhere in the process creates meanwhile (lazy imports,
    # caches, other tests' threads) is the same in both and cancels out; per node, main made 22 objects.
    cluster(20)()
    small, large = tracked_after(cluster(1000)), tracked_after(cluster(3000))
    assert (large - small) / 2000 <= 1.25, (small, large)


@given(app=st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(0, 5000), max_size=3),
       init=st.dictionaries(st.sampled_from(["i", "j"]), st.integers(0, 5000), max_size=2),
       sidecars=st.dictionaries(st.sampled_from(["s", "t"]), st.integers(0, 5000), max_size=2),
       reserved=st.sampled_from(["a", "i", "s", "gone"]), mib=st.integers(1, 80000), bound=st.booleans())
@settings(max_examples=200, deadline=None)
def test_a_single_reserved_amount_is_recorded_without_decoding_the_request(
        app: dict[str, int], init: dict[str, int], sidecars: dict[str, int], reserved: str, mib: int,
        bound: bool) -> None:
    """A pod whose reservation holds one amount (every pod the extender binds with one container, so nearly
    every running pod of a relist, and both watch events of each bind) is recorded without decoding its
    request, with the MiB the general rule (reservation_mib over its containers) gives: that amount."""
    from memslice.contract import Reservation
    from memslice.scheduler_extender.placement import records
    from memslice.scheduler_extender.placement.resources import RequestError, pod_request

    pod = pod_obj("p", dict(app) or {"main": None}, init=init, sidecars=sidecars, node="n1" if bound else None,
                  annotations=reservation_annotations("GPU-1", {reserved: mib}, 1.8e9))
    pod["metadata"]["uid"] = "u"
    if len(set(app) | set(init) | set(sidecars)) < len(app) + len(init) + len(sidecars):
        return  # a container name used twice: not a pod the API server accepts
    calls: list[int] = []
    original = records.pod_request
    records.pod_request = lambda obj: calls.append(1) or original(obj)  # type: ignore[assignment]
    try:
        record = records.pod_record(pod)
    finally:
        records.pod_request = original
    assert calls == []
    assert record is not None and record[records.MIB] == mib and record[records.GPU] == "GPU-1"
    reservation = Reservation.parse(pod["metadata"]["annotations"], with_time=False)
    assert reservation is not None
    try:
        request = pod_request(pod)
    except RequestError:
        request = None
    assert records.reservation_mib(reservation, request) == mib

"""Pure parts of the extender: quantities, pod requests (init containers), annotations, decisions, and
the state's accounting (pending charges, TTL of unbound reservations)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_extender_support import FakeClock, node_obj, pod_obj

from memslice.contract import Inventory, Reservation, format_time, parse_time
from memslice.errors import ContractError
from memslice.scheduler_extender.kubeio.annotations import reservation_annotations
from memslice.scheduler_extender.placement import decisions
from memslice.scheduler_extender.placement.resources import MAX_DEVICES, RequestError, parse_devices, pod_request
from memslice.scheduler_extender.placement.state import Charge, ClusterState, GpuView, NodeView


@pytest.mark.parametrize(("text", "devices"), [("4096", 4096), ("0", 0), ("4k", 4000), ("2Ki", 2048),
                                                ("1e3", 1000), ("+5", 5), ("1000m", 1), ("1.5k", 1500)])
def test_quantities(text, devices):
    assert parse_devices(text, "x") == devices


@pytest.mark.parametrize(("text", "words"), [("-1", "negative"), ("1.5", "whole"), ("500m", "whole"),
                                             ("abc", "quantity"), ("", "quantity"), ("1Ei", "absurd"),
                                             ("9" * 20, "absurd"), ("1e999", "absurd"), ("²", "quantity"),
                                             ("9" * 13, "absurd")])
def test_bad_quantities_name_the_value(text, words):
    with pytest.raises(RequestError) as exc:
        parse_devices(text, "Pod.spec.containers[0].resources.limits")
    assert words in str(exc.value) and repr(text) in str(exc.value)


@given(st.integers(min_value=0, max_value=MAX_DEVICES))
def test_integer_quantities_round_trip(n):
    assert parse_devices(str(n), "x") == n


def test_pod_without_gpu_mem_is_not_a_memslice_pod():
    assert pod_request(pod_obj("p")) is None


def test_multi_container_request_sums_app_containers():
    req = pod_request(pod_obj("p", {"a": 1000, "b": 2000, "cpu-only": None}))
    assert req is not None and req.devices == 3000
    assert req.container_mib(1) == {"a": 1000, "b": 2000}
    assert req.container_mib(4) == {"a": 4000, "b": 8000}


def test_init_containers_take_the_max_and_sidecars_add():
    # a regular init container runs alone: max(init, sum(app))
    assert pod_request(pod_obj("p", {"a": 1000, "b": 1000}, init={"i": 1500})).devices == 2000
    assert pod_request(pod_obj("p", {"a": 1000}, init={"i": 3000})).devices == 3000
    # a sidecar (restartPolicy Always) keeps running: it adds to the app containers and to later inits
    req = pod_request(pod_obj("p", {"a": 1000}, init={"i": 1500}, sidecars={"s": 700}))
    # spec order: regular inits first in pod_obj, then sidecars -> init peak 1500, app + sidecar 1700
    assert req.devices == 1700
    assert req.container_mib(1) == {"a": 1000, "i": 1500, "s": 700}


def test_request_errors():
    with pytest.raises(RequestError, match="differs from its limit"):
        pod = pod_obj("p", {"a": 10})
        pod["spec"]["containers"][0]["resources"]["requests"] = {"memslice.io/gpu-mem": "5"}
        pod_request(pod)
    with pytest.raises(RequestError, match="memslice.io/policy='fastest'"):
        pod_request(pod_obj("p", {"a": 10}, policy="fastest"))
    with pytest.raises(RequestError, match="used twice"):
        pod = pod_obj("p", {"a": 10})
        pod["spec"]["containers"].append(pod["spec"]["containers"][0])
        pod_request(pod)


def test_inventory_parsing_and_errors():
    inv = Inventory.parse("n", node_obj("n", [16384, 8192], unit=256)["metadata"]["annotations"])
    assert inv is not None and inv.unit_mib == 256 and [g.mem_mib for g in inv.gpus] == [16384, 8192]
    assert Inventory.parse("n", {}) is None
    for bad, words in [({"memslice.io/gpus": "not json"}, "not JSON"),
                       ({"memslice.io/gpus": "{}"}, "JSON list"),
                       ({"memslice.io/gpus": '[{"uuid": "", "index": 0, "memMiB": 1}]'}, "uuid"),
                       ({"memslice.io/gpus": '[{"uuid": "u", "index": 0, "memMiB": -1}]'}, "memMiB"),
                       ({"memslice.io/gpus": "[]", "memslice.io/unit-mib": "0"}, "unit-mib")]:
        with pytest.raises(ContractError, match=words):
            Inventory.parse("n", bad)


def test_reservation_annotations_round_trip():
    ann = reservation_annotations("GPU-1", {"b": 2, "a": 1}, 1_800_000_000.25)
    assert ann["memslice.io/gpu-mem-mib"] == '{"a":1,"b":2}'
    assert json.loads(ann["memslice.io/gpu-mem-mib"]) == {"a": 1, "b": 2}
    res = Reservation.parse(ann, "pod")
    assert res is not None and res.gpu_uuid == "GPU-1" and res.container_mib == (("a", 1), ("b", 2))
    assert res.assumed_ts == pytest.approx(1_800_000_000.25)
    at = parse_time("2026-01-02t03:04:05.5z")
    assert at == parse_time("2026-01-02T03:04:05.5Z") and at is not None and at.timestamp() == 1767323045.5
    assert parse_time(format_time(at)) == at and parse_time("garbage") is None
    with pytest.raises(ContractError, match="gpu-mem-mib"):
        Reservation.parse({"memslice.io/gpu-uuid": "GPU-1", "memslice.io/gpu-mem-mib": '{"a": -1}'}, "pod")


def view(*gpus: tuple[int, int], healthy: tuple[bool, ...] | None = None, unplaced: int = 0) -> NodeView:
    ok = healthy or (True,) * len(gpus)
    return NodeView.of("n", 1, tuple(GpuView.of(f"u{i}", i, "m", mem, ok[i], used)
                                     for i, (mem, used) in enumerate(gpus)), unplaced)


@given(st.lists(st.tuples(st.integers(1, 4), st.integers(-3, 5), st.booleans()), max_size=10))
def test_a_views_totals_are_those_of_its_gpus(gpus):
    """NodeView.of_rows reads its totals off one sort: they are the plain definitions over the healthy GPUs
    (ties on free MiB broken by the lower index; over-committed GPUs' negative free counted as 0)."""
    rows = tuple((f"u{i}", i, "m", mem, ok, mem - free, free) for i, (mem, free, ok) in enumerate(gpus))
    v = NodeView.of_rows("n", 1, rows)
    healthy = [r for r in rows if r[4]]
    by_free = sorted(healthy, key=lambda r: (r[6], r[1]))
    assert v.free_rows == tuple(by_free) and v.free_keys == tuple(r[6] for r in by_free)
    assert v.max_free_mib == max((r[6] for r in healthy), default=0)
    assert v.max_mem_mib == max((r[3] for r in healthy), default=0)
    assert v.total_free_mib == sum(max(r[6], 0) for r in healthy)
    assert v.most_free_row == (min(healthy, key=lambda r: (-r[6], r[1])) if healthy else None)


def test_fit_distinguishes_unresolvable_from_failed():
    v = view((8000, 0), (16000, 15000))
    assert decisions.fit(v, 8000).ok
    full = decisions.fit(v, 9000)
    assert not full.ok and not full.unresolvable
    assert full.reason == "pod needs 9000 MiB on one GPU; no GPU of the node has that much free now"
    never = decisions.fit(v, 20000)
    assert not never.ok and never.unresolvable and "largest healthy GPU here has 16000 MiB" in never.reason
    sick = decisions.fit(view((16000, 0), healthy=(False,)), 1)
    assert sick.unresolvable and "unhealthy" in sick.reason
    # memory of pods bound without the extender (GPU unknown) is subtracted from the node's total
    assert not decisions.fit(view((8000, 0), (8000, 0), unplaced=12000), 6000).ok
    assert decisions.fit(view((8000, 0), (8000, 0), unplaced=10000), 6000).ok


def test_a_cause_has_one_text_on_every_node():
    """kube-scheduler groups FailedScheduling by text: nodes refusing for one cause must say the same."""
    fulls = [view((8000, 7000), (16000, 15000)), view((24000, 23000)), view((16000, 12500), (16000, 16000))]
    assert len({decisions.fit(v, 4000).reason for v in fulls}) == 1
    held = [view((8000, 0), (8000, 0), unplaced=12000), view((8000, 0), (8000, 0), unplaced=11000)]
    assert len({decisions.fit(v, 6000).reason for v in held}) == 1
    assert "held by pods bound without the extender" in decisions.fit(held[0], 6000).reason


def test_binpack_and_spread_choose_opposite_gpus():
    v = view((16000, 10000), (16000, 2000), (16000, 15000))
    assert decisions.choose_gpu(v, 4000, "binpack").index == 0  # least free that still fits
    assert decisions.choose_gpu(v, 4000, "spread").index == 1
    assert decisions.choose_gpu(v, 15000, "binpack") is None


@given(st.lists(st.tuples(st.integers(1, 100_000), st.integers(0, 100_000)), min_size=1, max_size=8),
       st.integers(1, 100_000), st.sampled_from(["binpack", "spread"]))
def test_scores_stay_in_range_and_match_fit(gpus, need, policy):
    v = view(*gpus)
    s = decisions.score(v, need, policy)
    assert 0 <= s <= 10
    chosen = decisions.choose_gpu(v, need, policy)
    assert (chosen is not None) == decisions.fit(v, need).ok
    if chosen is not None:  # score() is an inlined choose_gpu(): both must pick the same GPU
        assert chosen.healthy and chosen.free_mib >= need
        after = (chosen.free_mib - need) / chosen.mem_mib
        assert s == max(0, min(10, round(10 * (after if policy == "spread" else 1 - after))))
    else:
        assert s == 0


def test_binpack_scores_fuller_nodes_higher():
    fuller, emptier = view((16000, 12000)), view((16000, 0))
    assert decisions.score(fuller, 2000, "binpack") > decisions.score(emptier, 2000, "binpack")
    assert decisions.score(fuller, 2000, "spread") < decisions.score(emptier, 2000, "spread")


def test_state_charges_bound_pods_and_expires_unbound_reservations():
    clock = FakeClock()
    state = ClusterState(assume_ttl=60, clock=clock)
    state.upsert_node(node_obj("n", [10000]))
    ann = reservation_annotations("GPU-n-0", {"main": 3000}, clock.now)
    bound = pod_obj("a", {"main": 3000}, node="n", annotations=ann)
    bound["metadata"].update(uid="uid-a", resourceVersion="5")
    unbound = pod_obj("b", {"main": 4000}, annotations=reservation_annotations("GPU-n-0", {"main": 4000},
                                                                                 clock.now))
    unbound["metadata"].update(uid="uid-b", resourceVersion="6")
    state.upsert_pod(bound)
    state.upsert_pod(unbound)
    assert [g.used_mib for g in state.view("n").gpus] == [7000]
    clock.now += 61
    state.expire()
    assert [g.used_mib for g in state.view("n").gpus] == [3000], "unbound reservation outlived its TTL"
    done = dict(bound, status={"phase": "Succeeded"})
    state.upsert_pod(done)
    assert [g.used_mib for g in state.view("n").gpus] == [0]


def test_pending_charge_holds_until_the_watch_catches_up():
    state = ClusterState()
    state.upsert_node(node_obj("n", [10000]))
    pod = pod_obj("a", {"main": 3000})
    pod["metadata"].update(uid="uid-a", resourceVersion="5")
    state.upsert_pod(pod)
    state.hold("uid-a", Charge("GPU-n-0", "n", 3000, 0, None))
    assert [g.used_mib for g in state.view("n").gpus] == [3000]
    state.confirm("uid-a", 7)
    state.upsert_pod(pod)  # an old version (rv 5) must not drop the hold
    assert [g.used_mib for g in state.view("n").gpus] == [3000]
    newer = json.loads(json.dumps(pod))
    newer["metadata"].update(resourceVersion="7", annotations=reservation_annotations(
        "GPU-n-0", {"main": 3000}, 0))
    newer["spec"]["nodeName"] = "n"
    state.upsert_pod(newer)
    assert [g.used_mib for g in state.view("n").gpus] == [3000]
    assert state.counts()["pending"] == 0
    # a failed bind whose undo reached version 9: old versions showing the reservation are ignored
    state.hold("uid-b", Charge("GPU-n-0", "n", 1000, 0, None))
    state.release("uid-b", 9)
    assert [g.used_mib for g in state.view("n").gpus] == [3000]
    state.delete_pod(newer)
    assert [g.used_mib for g in state.view("n").gpus] == [0]


def test_pod_bound_without_reservation_is_charged_to_the_node():
    state = ClusterState()
    state.upsert_node(node_obj("n", [8000, 8000], unit=2))
    pod = pod_obj("a", {"main": 4500}, node="n")  # 4500 devices × 2 MiB, on a GPU the extender can't know
    pod["metadata"].update(uid="uid-a", resourceVersion="3")
    state.upsert_pod(pod)
    v = state.view("n")
    assert v.unplaced_mib == 9000 and [g.used_mib for g in v.gpus] == [0, 0]
    assert not decisions.fit(v, 8000).ok and decisions.fit(v, 7000).ok

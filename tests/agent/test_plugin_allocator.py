"""Pure allocation decisions: preferred allocation, Allocate validation, reservations."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memslice.contract import ANN_ASSUMED_AT, ANN_GPU_MEM, ANN_GPU_UUID
from memslice.errors import ContractError
from memslice.plugin.deviceplugin.allocator import (
    RESOURCE_NAME,
    AllocationError,
    AvailableIds,
    PodInfo,
    ReservedPod,
    allocation_target,
    best_fit_gpu,
    choose_preferred,
    group_by_gpu,
    match_reservation,
    one_gpu_callers,
    parse_reservation,
    spanning_owner,
    spanning_refusal,
    split_units,
)
from memslice.plugin.deviceplugin.devices import DeviceIdError
from memslice.plugin.deviceplugin.inventory import container_asks, pod_info
from memslice.plugin.gpu.nvml import GpuInfo

GPUS = {0: GpuInfo(0, "GPU-a", "Sim", 1000, 0, False), 1: GpuInfo(1, "GPU-b", "Sim", 1000, 1, False)}
HEALTHY = {"GPU-a": True, "GPU-b": True}


def ids(gpu, numbers):
    return [f"g{gpu}-{n}" for n in numbers]


def test_allocate_maps_ids_to_their_gpu_and_quota():
    t = allocation_target(ids(1, range(10, 20)), GPUS, HEALTHY, 4)
    assert (t.gpu.uuid, t.mib, len(t.device_ids)) == ("GPU-b", 40, 10)


@pytest.mark.parametrize("request_ids, words", [
    (ids(0, range(4)) + ids(1, range(2)), ["span GPU 0 (4 MiB), GPU 1 (2 MiB), unevenly", "one GPU", "extender"]),
    ([], ["no memslice.io/gpu-mem devices"]),
    (["g0-1", "g0-1"], ["more than once", "g0-1"]),
    (["GPU-a-1"], ["'GPU-a-1'", "not a memslice device ID"]),
    (["g7-1"], ["GPU 7", "GPUs: 0, 1"]),
    (["g0-1000"], ["g0-1000", "beyond GPU 0's 1000 devices"]),
])
def test_bad_allocate_requests_are_refused_with_the_reason(request_ids, words):
    with pytest.raises(AllocationError) as exc:
        allocation_target(request_ids, GPUS, HEALTHY, 1)
    for w in words:
        assert w in str(exc.value)


def test_unhealthy_gpu_is_refused():
    with pytest.raises(AllocationError, match="Unhealthy"):
        allocation_target(ids(0, [1]), GPUS, {"GPU-a": False, "GPU-b": True}, 1)


def pod(uid="u1", name="p", gpu="GPU-b", mem=None, at="2026-01-01T00:00:00Z", raw=None):
    ann = {ANN_GPU_UUID: gpu, ANN_GPU_MEM: raw if raw is not None else json.dumps(mem or {"main": 100}),
           ANN_ASSUMED_AT: at}
    return PodInfo(uid=uid, namespace="ns", name=name, phase="Pending", annotations=ann)


def test_reservation_is_read_from_the_extender_annotations():
    r = parse_reservation(pod(mem={"b": 20, "a": 10}))
    assert r == ReservedPod("u1", "ns", "p", "GPU-b", (("a", 10), ("b", 20)),
                       datetime(2026, 1, 1, tzinfo=UTC))
    assert parse_reservation(PodInfo("u", "ns", "p", "Pending", {})) is None


@pytest.mark.parametrize("raw", ["", "[1]", '{"a": "10"}', '{"a": -1}', '{"a": true}', "{", "{}"])
def test_malformed_reservation_names_the_annotation(raw):
    with pytest.raises(ContractError, match=ANN_GPU_MEM):
        parse_reservation(pod(raw=raw))


def test_preferred_allocation_follows_the_reservation():
    available = ids(0, range(1000)) + ids(1, range(500, 1000))
    r = parse_reservation(pod(gpu="GPU-b", mem={"main": 100}))
    p = choose_preferred(available, [], 100, 1, GPUS, [r], set())
    assert p.gpu_index == 1 and p.reservation == r and p.container == "main"
    assert p.device_ids == tuple(ids(1, range(500, 600)))


def test_preferred_allocation_without_reservation_packs_the_fullest_gpu_that_fits():
    available = ids(0, range(300)) + ids(1, range(900))
    assert choose_preferred(available, [], 200, 1, GPUS, [], set()).gpu_index == 0
    assert choose_preferred(available, [], 400, 1, GPUS, [], set()).gpu_index == 1
    none = choose_preferred(available, [], 901, 1, GPUS, [], set())
    assert none.device_ids == () and "no single GPU" in none.reason


def test_reserved_gpu_without_room_falls_back_to_best_fit():
    available = ids(0, range(300)) + ids(1, range(50))
    r = parse_reservation(pod(gpu="GPU-b", mem={"main": 100}))
    p = choose_preferred(available, [], 100, 1, GPUS, [r], set())
    assert p.gpu_index == 0 and p.reservation is None and "only 50 free" in p.reason


def test_must_include_devices_are_kept_and_completed_from_their_gpu():
    p = choose_preferred(ids(0, range(10)) + ids(1, range(10)), ["g1-7"], 3, 1, GPUS, [], set())
    assert p.device_ids == ("g1-7", "g1-0", "g1-1")


def test_reservations_match_oldest_first_by_size_and_skip_taken_containers():
    old = parse_reservation(pod(uid="old", name="a", mem={"x": 100, "y": 200}, at="2026-01-01T00:00:00Z"))
    new = parse_reservation(pod(uid="new", name="b", mem={"x": 100}, at="2026-01-02T00:00:00Z"))
    assert match_reservation([new, old], 100, 1, set()) == (old, "x")
    assert match_reservation([new, old], 100, 1, {("old", "x")}) == (new, "x")
    assert match_reservation([new, old], 50, 4, set()) == (old, "y")  # 200 MiB = 50 units of 4 MiB
    assert match_reservation([new, old], 7, 1, set()) is None


def test_best_fit_prefers_the_tightest_gpu_and_the_lower_index_on_ties():
    assert best_fit_gpu({0: 10, 1: 5, 2: 5}, 5) == 1
    assert best_fit_gpu({0: 10}, 11) is None


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 300)), unique=True, max_size=200),
       st.integers(1, 50))
def test_available_index_agrees_with_parsing_each_id(pairs, size):
    ids = [f"g{g}-{n}" for g, n in pairs]
    avail = AvailableIds(ids, range(4))
    by_gpu = group_by_gpu(ids)
    assert avail.free == {g: len(by_gpu.get(g, [])) for g in range(4)}
    for g in range(4):
        assert avail.lowest(g, size) == tuple(f"g{g}-{n}" for n in by_gpu.get(g, [])[:size])


@pytest.mark.parametrize("bad", [["g0-1\ng0-2"], ["g0-1", ""], ["g0-1", "g1-x"]])
def test_available_index_names_the_bad_id(bad):
    with pytest.raises(DeviceIdError, match="not a memslice device ID"):
        AvailableIds(bad, range(2))


# --- pods that span GPUs (issue 34) ------------------------------------------------------------------------

def test_preferred_allocation_splits_a_spanning_pod_evenly_over_its_gpus_in_record_order():
    available = ids(0, range(1000)) + ids(1, range(500, 1000))
    r = parse_reservation(pod(gpu="GPU-b,GPU-a", mem={"main": 200}))  # device 0 is GPU-b
    p = choose_preferred(available, [], 200, 1, GPUS, [r], set())
    assert p.reservation == r and p.container == "main" and p.gpu_index == 1
    assert p.device_ids == tuple(ids(1, range(500, 600)) + ids(0, range(100)))
    # a GPU of the pair without its part: not the reservation (best fit of one GPU, said why)
    short = choose_preferred(ids(0, range(1000)) + ids(1, range(50)), [], 200, 1, GPUS, [r], set())
    assert short.reservation is None and "GPU-b" in short.reason and "only 50 free" in short.reason


def test_split_units_and_must_include_across_gpus():
    assert split_units(7, 2) == [4, 3] and split_units(8, 4) == [2] * 4
    p = choose_preferred(ids(0, range(10)) + ids(1, range(10)), ["g1-7", "g0-3"], 4, 1, GPUS, [], set())
    assert sorted(p.device_ids) == sorted(["g0-3", "g0-0", "g1-7", "g1-0"])


def test_allocate_ids_spread_evenly_over_gpus_give_the_per_gpu_quota_in_the_reservation_order():
    t = allocation_target(ids(1, range(10, 20)) + ids(0, range(10)), GPUS, HEALTHY, 4)
    assert [g.uuid for g in t.gpus] == ["GPU-a", "GPU-b"] and t.mib == 40  # 80 MiB over 2 GPUs
    r = parse_reservation(pod(gpu="GPU-b,GPU-a", mem={"main": 80}))
    assert spanning_owner(t, [r], 4, set()) == (r, "main")
    assert [g.uuid for g in t.ordered(r.gpu_uuids).gpus] == ["GPU-b", "GPU-a"]
    assert spanning_owner(t, [r], 4, {("u1", "main")}) is None  # already allocated
    assert spanning_owner(t, [parse_reservation(pod(gpu="GPU-b", mem={"main": 80}))], 4, set()) is None
    with pytest.raises(AllocationError, match="Unhealthy"):
        allocation_target(ids(1, range(2)) + ids(0, range(2)), GPUS, {"GPU-a": False, "GPU-b": True}, 4)


def asking(name, count=None, reserved=None, phase="Pending", asks=(("main", 512),), uid=None, unit=4):
    """A pod of the node asking `asks` devices; `count`: its memslice.io/gpu-count; `reserved`: its GPU UUIDs."""
    ann = {} if count is None else {"memslice.io/gpu-count": count}
    if reserved is not None:
        ann.update({ANN_GPU_UUID: reserved, ANN_GPU_MEM: json.dumps({c: n * unit for c, n in asks or ()})})
    return PodInfo(uid=uid or f"u-{name}", namespace="ns", name=name, phase=phase, annotations=ann, asks=asks)


def test_one_gpu_devices_are_refused_only_when_a_pod_spanning_gpus_is_the_only_possible_caller():
    tp = asking("tp", "2")
    found = one_gpu_callers([tp], 512, set())
    assert found.refused == (tp, "main", 2, ())
    msg = spanning_refusal(found, 512, 4)
    assert msg is not None
    for words in ("pod ns/tp container 'main' asks for 2048 MiB over 2 GPUs (memslice.io/gpu-count=2)",
                  "no memslice.io/gpu-uuid annotation", "the program would see 1 GPU, not 2",
                  "Schedule it with the memslice extender (spec.schedulerName: memslice-scheduler",
                  "or drop memslice.io/gpu-count"):
        assert words in msg
    # reserved on two GPUs, but its devices came on one (the agent found a reserved GPU short): refused too
    reserved = asking("tp", "2", reserved="GPU-a,GPU-b")
    found = one_gpu_callers([reserved], 512, set())
    assert found.refused == (reserved, "main", 2, ("GPU-a", "GPU-b"))
    assert "reserved on GPU-a, GPU-b, but this node's agent found a reserved GPU short of free units" in \
        (spanning_refusal(found, 512, 4) or "")
    # another size, a container already allocated, or a pod not being admitted: not the caller
    assert one_gpu_callers([tp], 256, set()).refused is None
    assert one_gpu_callers([tp], 512, {("u-tp", "main")}).refused is None
    for phase in ("Running", "Succeeded", "Failed"):
        assert one_gpu_callers([asking("tp", "2", phase=phase)], 512, set()).refused is None
    # reserved on one GPU, a malformed reservation, count 1, a malformed count, or sizes unknown: never refused
    for p in (asking("tp", "2", reserved="GPU-a"), asking("tp", "2", reserved="GPU-a,GPU-a"), asking("tp", "1"),
              asking("tp", "x"), asking("tp", "2", asks=None)):
        assert one_gpu_callers([p], 512, set()).refused is None
        assert spanning_refusal(one_gpu_callers([p], 512, set()), 512, 4) is None


@pytest.mark.parametrize("other", [
    asking("one"),  # a one-GPU pod of the same size: ambiguous, never refused
    asking("one", reserved="GPU-a"),  # reserved, and the kubelet did not take the agent's preference
    asking("one", phase="Running"),  # whatever the API says of its phase, it could be the caller
    asking("one", "2", reserved="GPU-a,GPU-a"),  # a malformed reservation: the agent serves it as unreserved
    asking("one", asks=None),  # its sizes unknown
])
def test_any_other_possible_caller_of_the_same_size_keeps_the_devices_from_being_refused(other):
    tp = asking("tp", "2")
    found = one_gpu_callers([tp, other], 512, set())
    assert found.spanning == ((tp, "main", 2, ()),) and found.other and found.refused is None
    # once that other pod's container holds its devices, the spanning pod is the only caller left
    if other.asks is not None:
        assert one_gpu_callers([tp, other], 512, {(other.uid, "main")}).refused == (tp, "main", 2, ())


def test_other_pods_of_other_sizes_do_not_hide_a_spanning_pod_and_several_are_counted():
    tp, tq = asking("tp", "2"), asking("tq", "4", asks=(("init", 8), ("main", 512)))
    found = one_gpu_callers([tq, asking("one", asks=(("main", 64),)), tp], 512, set())
    assert found.refused == (tp, "main", 2, ())  # by namespace and name
    assert "(1 more pod(s) like it ask for as many devices)" in (spanning_refusal(found, 512, 4) or "")
    assert one_gpu_callers([tq], 8, set()).refused == (tq, "init", 4, ())  # an init container is admitted too


@pytest.mark.parametrize("spec, asks", [
    ({"containers": [{"name": "main", "resources": {"limits": {RESOURCE_NAME: "512"}}}]}, (("main", 512),)),
    ({"initContainers": [{"name": "i", "resources": {"requests": {RESOURCE_NAME: "1Ki"}}}],
      "containers": [{"name": "main"}, {"name": "side", "resources": {"limits": {"cpu": "1"}}}]}, (("i", 1024),)),
    ({"containers": [{"name": "main", "resources": {"limits": {RESOURCE_NAME: "0"}}}]}, ()),
    ({"containers": [{"name": "main", "resources": {"limits": {RESOURCE_NAME: "1.5"}}}]}, None),
    ({"containers": [{"name": "main", "resources": {"limits": {RESOURCE_NAME: "1e99"}}}]}, None),
    ({"containers": [{"name": "main", "resources": {"limits": {RESOURCE_NAME: "-1"}}}]}, None),
    ({"containers": [{"name": "main", "resources": {"limits": {RESOURCE_NAME: 512}}}]}, (("main", 512),)),  # (extender)
    ({"containers": [{"name": "main", "resources": {"requests": {RESOURCE_NAME: "1"},
                                                    "limits": {RESOURCE_NAME: "2"}}}]}, None),  # differ
    ({"containers": [{"name": "main", "resources": {"limits": {RESOURCE_NAME: "9" * 70}}}]}, None),
    ({"containers": [{"name": "main", "resources": "x"}]}, None),
    ({"containers": [{"name": "main", "resources": {"limits": ["x"]}}]}, None),
    ({"containers": [{"resources": {}}]}, None),
    ({"containers": "x"}, None),
    ("x", None),
])
def test_container_asks_are_read_from_the_pod_spec_and_unknown_when_unreadable(spec, asks):
    assert container_asks(spec) == asks
    pod = pod_info({"metadata": {"uid": "u", "namespace": "ns", "name": "p"}, "spec": spec})
    assert pod.asks == asks

"""DRA decisions without a node: quantities, claim validation, the ResourceSlice shape, and the flag (pure
functions, no API). The slice publisher against the API stand-in only where the stand-in's hooks are the point:
feature gates off (the session's real API server runs with them on) and a torn or compacted watch. The
publisher against the real kube-apiserver: tests/dra/test_dra_slices_real.py."""

from __future__ import annotations

import argparse
import json
import time
from decimal import Decimal

import kube_standin_dra as dra
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kube_standin import KubeApiStandin

from memslice import contract
from memslice.plugin.config import ConfigError, add_arguments, resolve
from memslice.plugin.dra.kube import DraApi
from memslice.plugin.dra.prepare import (
    ClaimError,
    ClaimRef,
    Elastic,
    Share,
    check_fits,
    consumer_pods,
    consumers_priority,
    elastic_for,
    gpu_index_of,
    grants,
    mib_floor,
    pod_priority,
    quantity_bytes,
    shares_for,
    tolerates,
    unhealthy_warning,
)
from memslice.plugin.dra.slices import (
    Pci,
    SlicePublisher,
    device_entry,
    pci_bus_id,
    pcie_root,
    semver,
    slice_spec,
)
from memslice.plugin.gpu.nvml import GpuInfo

GPU = GpuInfo(index=0, uuid="GPU-00000000-0000-0000-0000-000000000000", model="NVIDIA H200", mem_mib=144384,
              numa=1, mig=False)
REF = ClaimRef("team", "nb", "3c1d1f4e-0000-4000-8000-000000000001")


@pytest.mark.parametrize("raw,mib", [("4Gi", 4096), ("4096Mi", 4096), ("4294967296", 4096), ("1.5Gi", 1536),
                                     ("5G", 4768), ("4e9", 3814), ("1048575", 0)])
def test_quantities(raw, mib) -> None:
    assert mib_floor(raw) == mib


@pytest.mark.parametrize("raw", ["", "Gi", "4 Gi", "4GiB", "-4Gi", "1e99999", "x" * 65, None, 4096, "4.5.6Gi"])
def test_bad_quantities_are_refused(raw) -> None:
    with pytest.raises(ValueError):
        quantity_bytes(raw)


@given(st.text(max_size=80))
def test_any_text_is_a_quantity_or_a_value_error(raw) -> None:
    try:
        v = quantity_bytes(raw)
    except ValueError:
        return
    assert isinstance(v, Decimal) and v < Decimal(10) ** 1000


def _claim(**result) -> dict:
    r = {"request": "gpu", "driver": "memslice.io", "pool": "node-a", "device": "gpu-0",
         "shareID": "8f0a1c2e-0000-4000-8000-000000000002", "consumedCapacity": {"memory": "4Gi"}}
    r.update(result)
    return {"metadata": {"uid": REF.uid}, "status": {"allocation": {"devices": {"results": [r]}}}}


def test_a_share_becomes_one_region_with_its_memory() -> None:
    [s] = shares_for(_claim(), REF, "node-a", {0: GPU}, {0: GPU.mem_mib}, {GPU.uuid: True})
    assert (s.mib, s.gpu_index, s.device, s.request) == (4096, 0, "gpu-0", "gpu")
    assert s.region_id.startswith("g0-") and len(s.region_id) == 15
    again = shares_for(_claim(), REF, "node-a", {0: GPU}, {0: GPU.mem_mib}, {GPU.uuid: True})
    assert again[0].region_id == s.region_id  # stable: a repeated prepare finds the same region


def test_unhealthy_gpu_is_refused() -> None:
    with pytest.raises(ClaimError, match="Unhealthy") as err:
        shares_for(_claim(), REF, "node-a", {0: GPU}, {0: GPU.mem_mib}, {GPU.uuid: False})
    assert "withdraw" not in str(err.value) and "memslice.io/unhealthy:NoSchedule" in str(err.value)


TAINT = {"key": "memslice.io/unhealthy", "value": "xid", "effect": "NoSchedule"}


@pytest.mark.parametrize("toleration,ok", [
    ({"key": "memslice.io/unhealthy", "operator": "Exists"}, True),
    ({"key": "memslice.io/unhealthy", "operator": "Exists", "effect": "NoSchedule"}, True),
    ({"key": "memslice.io/unhealthy", "value": "xid"}, True),  # operator Equal by default
    ({"key": "memslice.io/unhealthy", "operator": "Equal", "value": "other"}, False),
    ({"key": "memslice.io/unhealthy", "operator": "Exists", "effect": "NoExecute"}, False),
    ({"operator": "Exists"}, True),  # an empty key with Exists tolerates every taint
    ({"value": "xid"}, False),  # an empty key needs Exists
    ({"key": "other.io/x", "operator": "Exists"}, False),
    ("memslice.io/unhealthy", False),
])
def test_tolerations_match_the_unhealthy_taint_by_the_apis_rule(toleration, ok) -> None:
    assert tolerates([toleration], TAINT) is ok
    assert tolerates(None, TAINT) is False and tolerates("x", TAINT) is False


def test_a_claim_tolerating_the_unhealthy_taint_is_prepared_with_a_warning() -> None:
    """Issue 36.4: allocated on a tainted GPU because it tolerates the taint, it is prepared (refusing it left the
    pod in ContainerCreating for good), and the warning names the GPU and the toleration."""
    c = _claim(tolerations=[{"key": "memslice.io/unhealthy", "operator": "Exists"}])
    shares = shares_for(c, REF, "node-a", {0: GPU}, {0: GPU.mem_mib}, {GPU.uuid: False})
    warning = unhealthy_warning(REF, shares, {GPU.uuid: False})
    assert warning is not None and GPU.uuid in warning and "tolerates that taint" in warning
    assert unhealthy_warning(REF, shares, {GPU.uuid: True}) is None


def _elastic(*params: dict, source: str = "FromClaim") -> dict:
    """A 4Gi claim with these GpuMemConfig entries (class ones are written FromClass)."""
    c = _claim()
    c["status"]["allocation"]["devices"]["config"] = [
        {"source": source, "requests": ["gpu"], "opaque": {"driver": "memslice.io", "parameters": {
            "apiVersion": "memslice.io/v1alpha1", "kind": "GpuMemConfig", **p}}} for p in params]
    return c


def _elastic_for(claim: dict, cap: int = GPU.mem_mib):
    shares = shares_for(claim, REF, "node-a", {0: GPU}, {0: cap}, {GPU.uuid: True})
    [g] = grants(shares)
    return elastic_for(claim, REF, g, {0: cap})


def test_a_limit_above_the_request_makes_the_claim_elastic() -> None:
    assert _elastic_for(_claim()) is None  # no config: a plain quota of the request
    assert _elastic_for(_elastic({"limit": "6Gi"})) == Elastic(limit_mib=6144)
    assert _elastic_for(_elastic({"limit": "12Gi", "idleRelease": True})) == Elastic(12288, idle_release=True)
    assert _elastic_for(_elastic({"limit": "4096Mi"})) is None  # limit = request: not elastic
    assert _elastic_for(_elastic({"limit": "16Gi"}), cap=16384) == Elastic(16384)  # up to the whole GPU
    # the class's entry first, the claim's after it: the claim's limit wins, the class's idleRelease stays
    c = _elastic({"limit": "8Gi", "idleRelease": True}, {"limit": "6Gi"})
    c["status"]["allocation"]["devices"]["config"][0]["source"] = "FromClass"
    assert _elastic_for(c) == Elastic(6144, idle_release=True)
    # another driver's opaque config is not ours to read
    other = _elastic({"limit": "6Gi"})
    other["status"]["allocation"]["devices"]["config"].append(
        {"source": "FromClaim", "opaque": {"driver": "gpu.nvidia.com", "parameters": {"sharing": "x"}}})
    assert _elastic_for(other) == Elastic(6144)


@pytest.mark.parametrize("params,words", [
    ({"limit": "2Gi"}, 'limit 2048Mi is below the claim\'s request of 4096Mi (capacity.requests.memory, as '
                       'allocated on gpu-0); set limit to at least "4096Mi", or remove it'),
    ({"limit": "200Gi"}, 'limit 204800Mi is above the 144384Mi of gpu-0 (GPU-00000000-0000-0000-0000-000000000000), '
                         'the most it can ever hold; set limit to at most "144384Mi"'),
    ({"idleRelease": True}, "idleRelease: true without a limit above the claim's request (4096 MiB) has no effect"),
    ({"limit": "4Gi", "idleRelease": True}, "idleRelease: true without a limit above"),
    ({"limit": "lots"}, "limit='lots' is not a quantity"),
    ({"limit": "-8Gi"}, "(a limit cannot be negative)"),
    ({"elastic": {"limit": "8Gi"}}, "GpuMemConfig has no field(s) 'elastic'"),
])
def test_bad_elastic_configs_are_refused_naming_the_values_and_the_fix(params, words) -> None:
    with pytest.raises(ClaimError) as err:
        _elastic_for(_elastic(params))
    assert str(err.value).startswith(str(REF)) and words in str(err.value), str(err.value)


@pytest.mark.parametrize("raw", ["1E99", "9" * 64, "1e500", "99999999999999999999999999999999999999Ei"])
def test_huge_quantities_are_refused_by_name_not_crashed_on(raw) -> None:
    """Issue 35.9: Decimal's `//` raised DivisionImpossible (not a ValueError) for a quotient over 28 digits, so
    a limit or consumedCapacity of 1E99 made NodePrepareResources fail with gRPC UNKNOWN."""
    assert mib_floor(raw) > 1 << 30  # exact, in integers
    with pytest.raises(ClaimError, match=f"limit='{raw[:20]}.*is absurdly large"):
        _elastic_for(_elastic({"limit": raw}))
    with pytest.raises(ClaimError, match=r"consumedCapacity.memory .* does not fit gpu-0"):
        shares_for(_claim(consumedCapacity={"memory": raw}), REF, "node-a", {0: GPU}, {0: GPU.mem_mib},
                   {GPU.uuid: True})


def _scoped(requests: object, results: tuple[str, ...] = ("gpu",), limit: str = "6Gi") -> dict:
    """A claim of 4Gi per result with one GpuMemConfig entry scoped to `requests` (None: unscoped)."""
    c = _elastic({"limit": limit})
    rs = c["status"]["allocation"]["devices"]["results"]
    rs[:] = [{**rs[0], "request": r, "shareID": f"{rs[0]['shareID'][:-1]}{i}"} for i, r in enumerate(results)]
    entry = c["status"]["allocation"]["devices"]["config"][0]
    if requests is None:
        del entry["requests"]
    else:
        entry["requests"] = requests
    return c


def test_a_config_entry_applies_only_to_the_requests_it_names() -> None:
    """Issue 35.9: an entry scoped to another request's name (another driver's request, a subrequest that was
    not chosen) is not applied; unscoped or naming the request (or its chosen subrequest) it is."""
    assert _elastic_for(_scoped(["other"])) is None
    assert _elastic_for(_scoped(["gpu/large"], ("gpu/small",))) is None
    assert _elastic_for(_scoped(["gpu"])) == Elastic(6144)
    assert _elastic_for(_scoped(None)) == Elastic(6144)
    assert _elastic_for(_scoped([])) == Elastic(6144)
    assert _elastic_for(_scoped(["gpu"], ("gpu/small",))) == Elastic(6144)
    assert _elastic_for(_scoped(["gpu/small"], ("gpu/small",))) == Elastic(6144)
    assert _elastic_for(_scoped(["a", "b"], ("a", "b"), "12Gi")) == Elastic(12288)
    # naming one of two requests that share the claim's quota on its GPU: refused, not half applied
    with pytest.raises(ClaimError, match=r"applies to request\(s\) a but not b, which share its quota"):
        _elastic_for(_scoped(["a"], ("a", "b"), "12Gi"))
    with pytest.raises(ClaimError, match=r"requests=gpu is not a list of request names"):
        _elastic_for(_scoped("gpu"))


def test_a_bad_class_entry_is_refused_even_when_the_claims_entry_overrides_it() -> None:
    c = _elastic({"limit": "six"}, {"limit": "6Gi"})
    c["status"]["allocation"]["devices"]["config"][0]["source"] = "FromClass"
    with pytest.raises(ClaimError, match=r"opaque config 0 for memslice.io \(from FromClass\): limit='six'"):
        shares_for(c, REF, "node-a", {0: GPU}, {0: GPU.mem_mib}, {GPU.uuid: True})


def test_the_priority_of_an_elastic_claim_is_its_lowest_consumer_pods() -> None:
    claim = {"status": {"reservedFor": [
        {"resource": "pods", "name": "a", "uid": "u-a"}, {"resource": "pods", "name": "b", "uid": "u-b"},
        {"apiGroup": "batch", "resource": "jobs", "name": "j", "uid": "u-j"}, {"resource": "pods"}, "junk"]}}
    consumers = consumer_pods(claim)
    assert consumers == [("a", "u-a"), ("b", "u-b")]
    pods = {"a": {"metadata": {"uid": "u-a"}, "spec": {"priority": 1000}},
            "b": {"metadata": {"uid": "u-b"}, "spec": {"priority": -5}}}
    assert consumers_priority(REF, consumers, [pod_priority(pods[n], u) for n, u in consumers]) == -5
    assert pod_priority({"metadata": {"uid": "u-a"}, "spec": {}}, "u-a") == 0  # no PriorityClass
    assert pod_priority({"metadata": {"uid": "u-a"}, "spec": {"priority": 2**40}}, "u-a") == 2**31 - 1
    assert pod_priority({"metadata": {"uid": "u-a"}, "spec": {"priority": True}}, "u-a") == 0
    assert pod_priority({"metadata": {"uid": "other"}}, "u-a") is None  # re-created under the name
    assert pod_priority(None, "u-a") is None  # deleted
    assert consumers_priority(REF, [], []) == 0  # reserved for no pod
    with pytest.raises(ClaimError, match="reserved for pod\\(s\\) a, b in team, but none exists with its uid"):
        consumers_priority(REF, consumers, [None, None])
    assert len(consumer_pods({"status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}] * 1000}})) \
        == 256
    many = [(f"p{i}", f"u{i}") for i in range(17)]  # one GET each before the lock: bounded
    with pytest.raises(ClaimError, match="is elastic and reserved for 17 pods: the agent reads at most 16"):
        consumers_priority(REF, many, [0] * 16)


def test_shares_on_one_gpu_are_one_region_and_unequal_shares_on_two_gpus_are_refused() -> None:
    two = _claim(request="gpu/small")
    results = two["status"]["allocation"]["devices"]["results"]
    results.append({**results[0], "request": "other", "shareID": "second", "consumedCapacity": {"memory": "1Gi"}})
    shares = shares_for(two, REF, "node-a", {0: GPU}, {0: GPU.mem_mib}, {GPU.uuid: True})
    assert len({s.region_id for s in shares}) == 1
    [g] = grants(shares)
    assert (g.mib, g.requests, g.share_ids) == (5120, ("gpu", "other"), (results[0]["shareID"], "second"))
    other = GpuInfo(1, "GPU-1", "NVIDIA H200", 144384, None, False)
    results[1]["device"] = "gpu-1"
    with pytest.raises(ClaimError, match="holds different memory on its GPUs \\(gpu-0 4096 MiB, gpu-1 1024 MiB\\)"):
        shares_for(two, REF, "node-a", {0: GPU, 1: other}, {0: GPU.mem_mib, 1: other.mem_mib},
                   {GPU.uuid: True, "GPU-1": True})


def test_a_claim_on_two_gpus_is_one_region_with_the_same_quota_on_each_in_result_order() -> None:
    """Issue 34: `count: 2` (or requests kept apart by distinctAttribute) gets one region, device order the
    results', the quota per GPU; elastic limits are per GPU too, bounded by the smaller GPU."""
    other = GpuInfo(1, "GPU-1", "NVIDIA H200", 8192, None, False)
    gpus, caps, ok = {0: GPU, 1: other}, {0: GPU.mem_mib, 1: 8192}, {GPU.uuid: True, "GPU-1": True}
    two = _claim()
    results = two["status"]["allocation"]["devices"]["results"]
    results.insert(0, {**results[0], "device": "gpu-1", "shareID": "first"})  # gpu-1 is device 0
    shares = shares_for(two, REF, "node-a", gpus, caps, ok)
    [g] = grants(shares)
    assert ([d.device for d in g.devices], g.uuids, g.mib) == (["gpu-1", "gpu-0"], ("GPU-1", GPU.uuid), 4096)
    assert [d.share_ids for d in g.devices] == [("first",), (results[1]["shareID"],)]
    assert elastic_for(two, REF, g, caps, contract.GpuMemConfig(limit_mib=6144)) == Elastic(6144)
    with pytest.raises(ClaimError, match="above the 8192Mi of gpu-1 \\(GPU-1\\)"):
        elastic_for(two, REF, g, caps, contract.GpuMemConfig(limit_mib=9000))
    results[0]["consumedCapacity"] = {"memory": "4Gi", "compute": "30"}
    with pytest.raises(ClaimError, match="different compute on its GPUs \\(gpu-1 30%, gpu-0 0%\\)"):
        shares_for(two, REF, "node-a", gpus, caps, ok)


@pytest.mark.parametrize("name,index", [("gpu-0", 0), ("gpu-12", 12), ("gpu-0000", None), ("gpu-01", None),
                                        ("gpu-", None), ("gpu-99999", None)])
def test_device_names_are_read_exactly_as_published(name, index) -> None:
    assert gpu_index_of(name) == index


def test_over_allocation_is_refused() -> None:
    share = Share("gpu", "node-a", "gpu-0", "a", 100_000, 0, GPU.uuid, "g0-000000000000")
    with pytest.raises(ClaimError, match="over-allocated"):
        check_fits([share], [share], {0: GPU.mem_mib})
    check_fits([share], [], {0: GPU.mem_mib})


def test_device_entry_is_a_valid_consumable_capacity() -> None:
    d = device_entry(GPU, 144384, "570.133.07")
    assert d["attributes"]["driverVersion"] == {"version": "570.133.7"}
    assert d["attributes"]["numaNode"] == {"int": 1}
    cap = d["capacity"]["memory"]
    pol = cap["requestPolicy"]
    # API validation: default within [min, max], max <= value, min + step <= value, default a step multiple
    lo, hi = mib_floor(pol["validRange"]["min"]), mib_floor(pol["validRange"]["max"])
    assert lo <= mib_floor(pol["default"]) <= hi <= mib_floor(cap["value"]) and lo + 1 <= mib_floor(cap["value"])
    assert pol["validRange"]["step"] == "1Mi"
    assert semver("580.00.sim") == "580.0.0" and semver("abc") is None


def test_the_same_quantity_spelt_otherwise_is_the_same_slice() -> None:
    """The publisher compares what is stored with what it wants by value: a quantity written "144384Mi" where
    the API server's canonical form is "141Gi" is no change (no rewrite, no new generation)."""
    from memslice.plugin.dra.slices import same_devices

    want = slice_spec("node-a", [GPU], {GPU.uuid: True}, None, 0)
    stored = json.loads(json.dumps(want))
    assert stored["devices"][0]["capacity"]["memory"]["value"] == "141Gi"
    stored["devices"][0]["capacity"]["memory"]["value"] = "144384Mi"
    assert same_devices(stored, want)
    stored["devices"][0]["capacity"]["memory"]["value"] = "144383Mi"
    assert not same_devices(stored, want)


def test_unhealthy_gpus_are_tainted_or_left_out_where_taints_are_dropped() -> None:
    other = GpuInfo(1, "GPU-1", "NVIDIA H200", 144384, None, False)
    healthy = {GPU.uuid: True, "GPU-1": False}
    spec = slice_spec("node-a", [GPU, other], healthy, None, 3)
    assert [(d["name"], d.get("taints")) for d in spec["devices"]] == [
        ("gpu-0", None), ("gpu-1", [{"key": "memslice.io/unhealthy", "value": "xid", "effect": "NoSchedule"}])]
    assert spec["pool"] == {"name": "node-a", "generation": 3, "resourceSliceCount": 1}
    spec = slice_spec("node-a", [GPU, other], healthy, None, 3, taints=False)
    assert [d["name"] for d in spec["devices"]] == ["gpu-0"]


def _mine(kube: KubeApiStandin, node: str = "node-a") -> list[dict]:
    return [s for s in kube.list("ResourceSlice") if s["spec"]["nodeName"] == node]


def _publisher(kube: KubeApiStandin, healthy: dict, node: str = "node-a", **kw) -> SlicePublisher:
    return SlicePublisher(DraApi(kube.api_client()), node, lambda: [GPU], lambda: healthy, "570.1", lambda: "u1",
                          watch=False, **kw)


def test_consumable_capacity_gate_off_is_said_once_and_does_not_churn() -> None:
    """On the stand-in: it drops the gated fields as an API server with the gate off does (the session's real
    one has it on, and switches it per request nowhere).
    Issue 24.4: the API server drops allowMultipleAllocations/requestPolicy (gate off): the agent says what
    to turn on (log, Event, problem for /readyz) and stops rewriting the slice."""
    healthy = {GPU.uuid: True}
    said: list[str] = []
    with KubeApiStandin() as kube:
        dra.set_gates(kube, DRAConsumableCapacity=False)
        pub = _publisher(kube, healthy, on_problem=said.append)
        assert pub.sync_once() == "created"
        [s] = _mine(kube)
        assert "allowMultipleAllocations" not in s["spec"]["devices"][0]
        assert pub.problem and "DRAConsumableCapacity" in pub.problem and "--feature-gates" in pub.problem
        for _ in range(3):
            assert pub.sync_once() == "unchanged"
        [s] = _mine(kube)
        assert s["spec"]["pool"]["generation"] == 0 and said == [pub.problem]
        pub.mark_dirty(probe=True)  # the kubelet registered the driver again: offered once more, said no more
        assert pub.sync_once() == "updated" and pub.sync_once() == "unchanged" and len(said) == 1
        dra.set_gates(kube, DRAConsumableCapacity=True)
        pub.mark_dirty(probe=True)
        assert pub.sync_once() == "updated" and pub.problem is None
        [s] = _mine(kube)
        assert s["spec"]["devices"][0]["allowMultipleAllocations"] is True


def test_device_taints_gate_off_withdraws_the_unhealthy_gpu_without_churn() -> None:
    """On the stand-in: an API server with DRADeviceTaints off (the session's real one has it on).
    Issue 24.6: where the API server drops taints, an unhealthy GPU is withdrawn instead."""
    healthy = {GPU.uuid: True}
    with KubeApiStandin() as kube:
        dra.set_gates(kube, DRADeviceTaints=False)
        pub = _publisher(kube, healthy)
        assert pub.sync_once() == "created"
        healthy[GPU.uuid] = False
        assert pub.sync_once() == "updated"  # with the taint: dropped
        assert pub.sync_once() == "updated"  # the fallback: withdrawn
        assert _mine(kube)[0]["spec"]["devices"] == []
        assert pub.sync_once() == "unchanged" and pub.sync_once() == "unchanged"
        assert pub.problem is None


def test_pci_attributes(tmp_path) -> None:
    """Issue 24.8: the standard attributes, from NVML's bus ID and the sysfs link of the device."""
    assert pci_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert pci_bus_id("0001:c1:00.1") == "0001:c1:00.1"
    assert pci_bus_id("GPU-3b") is None and pci_bus_id("100000000:3B:00.0") is None
    dev = tmp_path / "devices" / "pci0000:3a" / "0000:3a:00.0" / "0000:3b:00.0"
    dev.mkdir(parents=True)
    (tmp_path / "bus" / "pci" / "devices").mkdir(parents=True)
    (tmp_path / "bus" / "pci" / "devices" / "0000:3b:00.0").symlink_to(dev)
    assert pcie_root("0000:3b:00.0", tmp_path) == "pci0000:3a"
    assert pcie_root("0000:3c:00.0", tmp_path) is None
    d = device_entry(GPU, 1024, None, Pci("0000:3b:00.0", "pci0000:3a"))
    assert d["attributes"]["resource.kubernetes.io/pciBusID"] == {"string": "0000:3b:00.0"}
    assert d["attributes"]["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:3a"}


def test_kubelet_api_flag() -> None:
    p = argparse.ArgumentParser()
    add_arguments(p)
    assert resolve(p.parse_args([]), {}).kubelet_api == "device-plugin"
    assert resolve(p.parse_args([]), {"MEMSLICE_KUBELET_API": "dra"}).kubelet_api == "dra"
    with pytest.raises(ConfigError, match="--kubelet-api='csi' is not valid: use one of device-plugin, dra"):
        resolve(p.parse_args(["--kubelet-api", "csi"]), {})


@pytest.mark.parametrize("visibility,preload", [("env", "file"), ("cdi", "env")])
def test_cdi_edits_carry_everything_allocate_carries(tmp_path, visibility, preload) -> None:
    from memslice.plugin.deviceplugin.allocator import Target
    from memslice.plugin.deviceplugin.server import container_response
    from memslice.plugin.dra.cdi import CdiDevice, CdiSpecs, extra_device_ids
    from memslice.plugin.response import ResponseConfig, container_edits

    rcfg = ResponseConfig(shim_host_dir=tmp_path / "lib", preload=preload, visibility=visibility)
    resp = container_response(Target(gpu=GPU, device_ids=(), mib=4096), tmp_path / "regions" / "g0-x", rcfg)
    assert container_edits([GPU.uuid], 4096, tmp_path / "regions" / "g0-x", rcfg).envs == dict(resp.envs)
    specs = CdiSpecs(tmp_path / "cdi")
    specs.prepare()
    dev = CdiDevice(f"{REF.uid}-share", container_edits([GPU.uuid], 4096, tmp_path / "regions" / "g0-x", rcfg))
    path = specs.write(REF.uid, [dev])
    doc = json.loads(path.read_text())
    assert doc["kind"] == "memslice.io/gpu-mem" and doc["cdiVersion"] == "0.5.0"
    edits = doc["devices"][0]["containerEdits"]
    assert sorted(edits["env"]) == sorted(f"{k}={v}" for k, v in resp.envs.items())
    assert {(m["hostPath"], m["containerPath"], "ro" in m["options"]) for m in edits["mounts"]} == {
        (m.host_path, m.container_path, m.read_only) for m in resp.mounts}
    assert all("bind" in m["options"] for m in edits["mounts"])
    want = [f"nvidia.com/gpu={GPU.uuid}"] if visibility == "cdi" else []
    assert extra_device_ids([dev]) == want
    assert specs.claim_uids() == [REF.uid]
    specs.remove(REF.uid)
    assert specs.claim_uids() == []


def test_the_watch_repairs_at_once_reconnects_and_stops_without_delay() -> None:
    """Issue 24.5: the publisher watches its slice (no 30 s LIST polling): a deletion is repaired within
    seconds, also after the API server dropped the watch and after its versions were compacted (410), and
    stop() ends the watch at once. On the stand-in: its restart() and compact() hooks are the point."""
    healthy = {GPU.uuid: True}
    with KubeApiStandin() as kube:
        pub = SlicePublisher(DraApi(kube.api_client()), "node-a", lambda: [GPU], lambda: healthy, "570.1",
                             lambda: "u1", resync_s=300)
        pub.start()
        try:
            assert pub.published.wait(10)
            for disrupt in (None, kube.restart, lambda: (kube.compact(), kube.restart())):
                if disrupt is not None:
                    disrupt()
                [s] = _mine(kube)
                t0 = time.monotonic()
                kube.delete("ResourceSlice", None, s["metadata"]["name"])
                assert kube.wait_for(lambda k: len(_mine(k)) == 1, 5)
                assert time.monotonic() - t0 < 5
            syncs = pub.syncs
            healthy[GPU.uuid] = True  # nothing changes: the watch sees only the publisher's own writes
        finally:
            t0 = time.monotonic()
            pub.stop()
            assert time.monotonic() - t0 < 3
            assert not pub._thread.is_alive() and pub._watcher is not None and not pub._watcher.is_alive()
        assert pub.syncs == syncs

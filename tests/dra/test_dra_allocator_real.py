"""The stand-in's copy of the DRA allocator (tests/support/kube_standin_dra.py `allocate`) against the real one.

The node-level DRA tests allocate claims with that Python copy; here the same cases go through the real
kube-scheduler (its DRA plugin, 1.37, consumable capacity on) allocating real ResourceClaims against the
ResourceSlice our publisher builds (`slice_spec`, stored by the real kube-apiserver), and the copy must give the
same allocation for each: the request (or `<request>/<subrequest>` of `firstAvailable`), driver, pool, device
and consumedCapacity of every result, in order, and the configs (class then claim) — or, where the real
scheduler leaves the pod Pending, the copy must refuse too. So the copy cannot drift from the allocator it
stands in for (it did: `count: 2` put both shares on one GPU, and results carried no compute).

Each case has its own node (two 16 GiB GPUs) so the cases run at once; a case of two claims allocates them in
order (the second sees the first's consumed capacity). One scheduler, under its own name, serves the module.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from typing import Any

import kube_standin_dra as dra
import pytest
from kube_real import SCHEDULER_TOKEN, RealCluster, wait_until
from kube_standin import KubeApiStandin

from memslice.plugin.dra.slices import slice_spec
from memslice.plugin.gpu.nvml import GpuInfo

pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("kube")]

NS = "dra-alloc"
CLASS = "alloc-check.memslice-test"  # not the deploy/ class: no claim policy of deploy/ applies to it
SCHEDULER = "memslice-alloc-check"
RC = "/apis/resource.k8s.io/v1"
CLASS_CONFIG = {"apiVersion": "memslice.io/v1alpha1", "kind": "GpuMemConfig", "idleRelease": True}
CLAIM_CONFIG = {"apiVersion": "memslice.io/v1alpha1", "kind": "GpuMemConfig", "limit": "8Gi"}
GPUS = [GpuInfo(index=i, uuid=f"GPU-a11c0000-0000-4000-8000-00000000000{i}", model="NVIDIA H200", mem_mib=16384,
                numa=None, mig=False) for i in range(2)]


def exactly(memory: str | None = None, count: int | None = None, compute: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"deviceClassName": CLASS}
    if count is not None:
        out["count"] = count
    requests = {k: v for k, v in (("memory", memory), ("compute", compute)) if v is not None}
    if requests:
        out["capacity"] = {"requests": requests}
    return out


def req(name: str, **kw: Any) -> dict[str, Any]:
    return {"name": name, "exactly": exactly(**kw)}


def first_available(name: str, *subs: tuple[str, str]) -> dict[str, Any]:
    return {"name": name, "firstAvailable": [{"name": s, **exactly(memory)} for s, memory in subs]}


# case -> the claims of its node, allocated in this order: (requests, the claim's opaque config or None)
CASES: dict[str, list[tuple[list[dict[str, Any]], dict[str, Any] | None]]] = {
    "a memory request": [([req("gpu", memory="4Gi")], None)],
    "no memory named: the requestPolicy default": [([req("gpu")], None)],
    "below validRange.min: raised to it": [([req("gpu", memory="100Mi")], None)],
    "between steps: rounded up to min + n*step": [([req("gpu", memory="307712Ki")], None)],
    "over validRange.max: not allocated": [([req("gpu", memory="17Gi")], None)],
    "memory and compute": [([req("gpu", memory="1Gi", compute="60")], None)],
    "firstAvailable: the first fits no GPU": [([first_available("gpu", ("huge", "64Gi"), ("small", "3Gi"))], None)],
    "firstAvailable: the first fits": [([first_available("gpu", ("big", "8Gi"), ("small", "1Gi"))], None)],
    "count 2: two GPUs": [([req("gpu", memory="2Gi", count=2)], None)],
    "count 3 on two GPUs: not allocated": [([req("gpu", memory="1Gi", count=3)], None)],
    "two requests: summed shares": [([req("a", memory="1Gi"), req("b", memory="2Gi")], None)],
    "the claim's config after the class's": [([req("gpu", memory="2Gi")], CLAIM_CONFIG)],
    "a second claim where the first left room": [([req("gpu", memory="12Gi")], None),
                                                 ([req("gpu", memory="8Gi")], None)],
    "a second claim that fits where the first is": [([req("gpu", memory="12Gi")], None),
                                                     ([req("gpu", memory="4Gi")], None)],
    "a second claim that fits nowhere": [([req("gpu", memory="12Gi", count=2)], None),
                                         ([req("gpu", memory="5Gi")], None)],
    "compute summed across claims": [([req("gpu", memory="1Gi", compute="60")], None),
                                     ([req("gpu", memory="1Gi", compute="50")], None)],
}
NODES = {case: f"alloc-{i:02d}" for i, case in enumerate(CASES)}


def device_class() -> dict[str, Any]:
    return dra.device_class(CLASS, config=CLASS_CONFIG)


def claim_body(case: str, step: int) -> dict[str, Any]:
    requests, config = CASES[case][step]
    devices: dict[str, Any] = {"requests": copy.deepcopy(requests)}
    if config is not None:
        devices["config"] = [{"opaque": {"driver": "memslice.io", "parameters": config}}]
    return {"apiVersion": dra.GROUP_VERSION, "kind": "ResourceClaim",
            "metadata": {"name": f"{NODES[case]}-{step}", "namespace": NS}, "spec": {"devices": devices}}


def pod_body(case: str, step: int) -> dict[str, Any]:
    name = f"{NODES[case]}-{step}"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"schedulerName": SCHEDULER, "nodeSelector": {"memslice-test/alloc": NODES[case]},
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                     "containers": [{"name": "main", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}]}}


def add_node(cluster: RealCluster, name: str) -> None:
    """A Ready node (no kubelet: the admin writes what its kubelet and node controller would)."""
    status, out = cluster.request("POST", "/api/v1/nodes", {"metadata": {"name": name, "labels": {
        "kubernetes.io/hostname": name, "memslice-test/alloc": name}}})
    assert status in (201, 409), out
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    res = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    cluster.ok("PATCH", f"/api/v1/nodes/{name}/status", {"status": {
        "capacity": res, "allocatable": res, "conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": now,
            "lastTransitionTime": now}]}},
               content_type="application/strategic-merge-patch+json")
    cluster.ok("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": None}},
               content_type="application/merge-patch+json")


def outcome(claim: dict[str, Any] | None) -> Any:
    """What an allocation decided, without its random parts (shareIDs): the results and configs in order."""
    if claim is None:
        return "not allocated"
    alloc = claim["status"]["allocation"]
    results = [(r["request"], r["driver"], r["pool"], r["device"], r["consumedCapacity"])
               for r in alloc["devices"]["results"]]
    configs = [(c["source"], c.get("requests"), c["opaque"]) for c in alloc["devices"].get("config") or []]
    [term] = alloc["nodeSelector"]["nodeSelectorTerms"]
    return results, configs, term


def placed(cluster: RealCluster, name: str) -> dict[str, Any] | None:
    """The pod once the scheduler decided: bound, or Unschedulable."""
    p = cluster.ok("GET", f"/api/v1/namespaces/{NS}/pods/{name}")
    if p["spec"].get("nodeName") or any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                                        for c in p.get("status", {}).get("conditions", [])):
        return dict(p)
    return None


@pytest.fixture(scope="module")
def real_outcomes(real_cluster: RealCluster) -> Iterator[tuple[dict[str, list[Any]], dict[str, Any]]]:
    """Every case allocated by the real scheduler: case -> the outcome of each claim; and the stored slices."""
    cluster = real_cluster
    cluster.ensure_namespace(NS)
    cluster.apply([device_class()])
    slices: dict[str, Any] = {}
    for case, node in NODES.items():
        add_node(cluster, node)
        body = {"apiVersion": dra.GROUP_VERSION, "kind": "ResourceSlice", "metadata": {"name": f"{node}-memslice.io"},
                "spec": slice_spec(node, GPUS, {g.uuid: True for g in GPUS}, "570.133.07", 0)}
        status, out = cluster.request("POST", f"{RC}/resourceslices", body)
        if status == 409:
            out = cluster.ok("GET", f"{RC}/resourceslices/{node}-memslice.io")
        else:
            assert status == 201, out
        slices[case] = out
    sched = cluster.start_scheduler({
        "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(cluster.kubeconfig("alloc-scheduler", SCHEDULER_TOKEN))},
        "leaderElection": {"leaderElect": False}, "profiles": [{"schedulerName": SCHEDULER}]}, SCHEDULER)
    try:
        got: dict[str, list[Any]] = {case: [] for case in CASES}
        for step in range(max(len(c) for c in CASES.values())):
            now = [case for case in CASES if len(CASES[case]) > step]
            for case in now:
                cluster.ok("POST", f"{RC}/namespaces/{NS}/resourceclaims", claim_body(case, step))
                cluster.ok("POST", f"/api/v1/namespaces/{NS}/pods", pod_body(case, step))
            for case in now:
                name = f"{NODES[case]}-{step}"
                p = wait_until(f"{name} ({case}) scheduled or unschedulable", lambda n=name: placed(cluster, n), 120,
                               0.2, sched.check_alive)
                claim = cluster.ok("GET", f"{RC}/namespaces/{NS}/resourceclaims/{name}")
                allocated = (claim.get("status") or {}).get("allocation")
                assert bool(p["spec"].get("nodeName")) == bool(allocated), (case, p.get("status"), claim)
                got[case].append(claim if allocated else None)
        yield got, slices
    finally:
        sched.stop()


@pytest.mark.parametrize("case", list(CASES))
def test_the_standin_allocates_as_the_real_scheduler_does(real_outcomes, case) -> None:
    got, slices = real_outcomes
    kube = KubeApiStandin()  # its store only (no HTTP): the copy reads and writes objects there
    kube.put(device_class())
    kube.put(copy.deepcopy(slices[case]))  # the slice as the real API server stored it
    predicted = []
    for step in range(len(CASES[case])):
        body = claim_body(case, step)
        kube.put(body)
        try:
            predicted.append(outcome(dra.allocate(kube, NS, body["metadata"]["name"], NODES[case])))
        except dra.Unschedulable:
            predicted.append(outcome(None))
    real = [outcome(c) for c in got[case]]
    assert predicted == real, f"{case}: the stand-in's copy {predicted} != the real allocator's {real}"


def test_the_real_allocations_are_what_the_cases_say(real_outcomes) -> None:
    """The real allocator's answers read directly, so the comparison above cannot pass on two equal mistakes."""
    got, _ = real_outcomes

    def results(case: str, step: int = 0) -> list[tuple[str, str, dict[str, str]]] | None:
        c = got[case][step]
        if c is None:
            return None
        return [(r["request"], r["device"], r["consumedCapacity"])
                for r in c["status"]["allocation"]["devices"]["results"]]

    assert results("a memory request") == [("gpu", "gpu-0", {"memory": "4Gi", "compute": "0"})]
    assert results("no memory named: the requestPolicy default") == [
        ("gpu", "gpu-0", {"memory": "1Gi", "compute": "0"})]
    assert results("below validRange.min: raised to it")[0][2]["memory"] == "256Mi"  # type: ignore[index]
    assert results("between steps: rounded up to min + n*step")[0][2]["memory"] == "301Mi"  # type: ignore[index]
    assert results("over validRange.max: not allocated") is None
    assert results("firstAvailable: the first fits no GPU") == [
        ("gpu/small", "gpu-0", {"memory": "3Gi", "compute": "0"})]
    assert results("firstAvailable: the first fits") == [("gpu/big", "gpu-0", {"memory": "8Gi", "compute": "0"})]
    assert [d for _, d, _ in results("count 2: two GPUs") or []] == ["gpu-0", "gpu-1"]
    assert results("count 3 on two GPUs: not allocated") is None
    assert [(r, d) for r, d, _ in results("two requests: summed shares") or []] == [("a", "gpu-0"), ("b", "gpu-0")]
    assert [d for _, d, _ in results("a second claim where the first left room", 1) or []] == ["gpu-1"]
    assert [d for _, d, _ in results("a second claim that fits where the first is", 1) or []] == ["gpu-0"]
    assert results("a second claim that fits nowhere", 1) is None
    assert [c["compute"] for _, _, c in results("compute summed across claims", 1) or []] == ["50"]
    assert results("compute summed across claims", 1)[0][1] == "gpu-1"  # type: ignore[index]  # 60 + 50 > 100

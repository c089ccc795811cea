"""DRA mode, a claim on two GPUs (issue 34), the real node agent against the real kube-apiserver and the kubelet
stand-in over real gRPC: ONE region for the claim, the same quota on each GPU, its elastic limit per GPU with ONE
board slot free on both GPUs' boards (that slot file writable on each), its compute share with ONE slot
provisioned on both GPUs' rosters, status.devices per share (written to the real API server); unprepare releases
both GPUs. (The real allocator, the claim policy on the real API server and a process under the shim on both
GPUs: tests/realcluster/test_real_dra.py.)"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import kube_standin_dra as dra
import pytest
from kube_real import RealCluster
from kube_real_objects import RealObjects
from test_dra_compute import limits_of
from test_dra_node import CLASS, DRIVER, NODE, NS, DraNode, node_on, prepared_spec, real_objects

from memslice import compute, elastic

pytestmark = pytest.mark.xdist_group("kube")
CONFIG = {"apiVersion": "memslice.io/v1alpha1", "kind": "GpuMemConfig"}


@pytest.fixture
def two_gpus(real_cluster: RealCluster) -> Iterator[tuple[RealObjects, DraNode]]:
    with real_objects(real_cluster) as kube, node_on(kube, gpus="8GiB,8GiB") as node:
        yield kube, node


def claim_on(kube: Any, name: str, devices: list[str], memory: str, compute_pct: str | None = None,
             config: dict | None = None, uneven: bool = False) -> dict:
    """A claim with one share on each of `devices`, in that order, as kube-scheduler writes `count: N` (the
    results written by hand, so that their order can differ from the devices'; stored by the real API server)."""
    kube.put(dra.claim(name, memory, namespace=NS, class_name=CLASS, config=config))

    def edit(c: dict) -> None:
        results = c["status"]["allocation"]["devices"]["results"]
        results[:] = [{**results[0], "device": d, "shareID": str(uuid.uuid4())} for d in devices]
        for r in results:
            if compute_pct is not None:
                r["consumedCapacity"] = {**r["consumedCapacity"], "compute": compute_pct}
        if uneven:  # what no allocator writes for one request: a smaller share on the second GPU
            results[1]["consumedCapacity"] = {**results[1]["consumedCapacity"], "memory": "1Gi"}

    return dra.allocate(kube, NS, name, NODE, edit=edit)


def test_a_claim_on_two_gpus_gets_one_region_and_one_slot_free_on_both(two_gpus) -> None:
    kube, node = two_gpus
    [sl] = node.slices()
    uuid = {d["name"]: d["attributes"]["uuid"]["string"] for d in sl["spec"]["devices"]}
    # a one-GPU elastic claim with a compute share takes slot 0 of gpu-0's board and roster
    one = claim_on(kube, "one", ["gpu-0"], "1Gi", "20", {**CONFIG, "limit": "2Gi"})
    assert node.kubelet.prepare(DRIVER, one).claims[one["metadata"]["uid"]].error == ""
    tp = claim_on(kube, "tp", ["gpu-1", "gpu-0"], "2Gi", "30", {**CONFIG, "limit": "3Gi", "computeLimit": 60})
    uid = tp["metadata"]["uid"]
    resp = node.kubelet.prepare(DRIVER, tp)
    entry = resp.claims[uid]
    assert entry.error == "", entry.error
    assert [d.device_name for d in entry.devices] == ["gpu-1", "gpu-0"]  # one Device per GPU, in result order
    assert [list(d.request_names) for d in entry.devices] == [["gpu"], ["gpu"]]
    assert [len(d.cdi_device_ids) for d in entry.devices] == [1, 0]  # the region's CDI device, once
    shares = [r["shareID"] for r in tp["status"]["allocation"]["devices"]["results"]]
    assert [d.share_id for d in entry.devices] == shares  # each GPU's own share (dra/v1)
    env, mounts = prepared_spec(node, resp, tp)
    assert env["NVIDIA_VISIBLE_DEVICES"] == f"{uuid['gpu-1']},{uuid['gpu-0']}"
    limits = limits_of(mounts)
    assert (limits["gpu_mem_limit"], limits["gpu_mem_request"]) == ("3072MiB", "2048MiB")  # per GPU
    assert (limits["elastic_slot"], limits["compute_slot"]) == ("1", "1")  # slot 0 is taken on gpu-0
    assert (limits["gpu_compute_request"], limits["gpu_compute_limit"]) == ("30", "60")
    for u in uuid.values():  # the one slot's files writable on each GPU's board and roster, nothing else of them
        board = f"{elastic.CONTAINER_ELASTIC_DIR}/{elastic.board_slot_path(u, 1)}"
        assert mounts[board] == (str(node.root / "elastic" / elastic.board_slot_path(u, 1)), False)
        assert mounts[f"{compute.CONTAINER_COMPUTE_DIR}/{u}/slot-01"][1] is False
        assert 1 in (compute.read_roster(node.root / "compute", u) or {})
        assert (elastic.read_roster(node.root / "elastic", u) or {})[1].limit_mib == 3072
    writable = [c for c, (_, ro) in mounts.items() if not ro and c.startswith(("/run/memslice/elastic",
                                                                                "/run/memslice/compute"))]
    assert len(writable) == 4
    assert len(list(node.regions.glob("*.limits"))) == 2  # one region per claim
    # status.devices: one entry per share, the quota per GPU
    stored = kube.get("ResourceClaim", NS, "tp")
    assert stored is not None
    ours = [d for d in stored["status"]["devices"] if d["driver"] == DRIVER]
    assert sorted((d["device"], d["data"]["quota"], d["data"]["limit"]) for d in ours) == [
        ("gpu-0", "2048Mi", "3072Mi"), ("gpu-1", "2048Mi", "3072Mi")]
    # unprepare releases both GPUs: the slot leaves both rosters, the region goes
    assert node.kubelet.unprepare(DRIVER, tp).claims[uid].error == ""
    assert set(compute.read_roster(node.root / "compute", uuid["gpu-0"]) or {}) == {0}
    assert not compute.read_roster(node.root / "compute", uuid["gpu-1"])
    assert set(elastic.read_roster(node.root / "elastic", uuid["gpu-1"]) or {}) == set()
    assert len(list(node.regions.glob("*.limits"))) == 1


def test_a_claim_with_unequal_gpus_is_refused_by_name_and_nothing_is_left(two_gpus) -> None:
    kube, node = two_gpus
    c = claim_on(kube, "uneven", ["gpu-0", "gpu-1"], "2Gi", uneven=True)
    err = node.kubelet.prepare(DRIVER, c).claims[c["metadata"]["uid"]].error
    assert "holds different memory on its GPUs (gpu-0 2048 MiB, gpu-1 1024 MiB)" in err, err
    assert "distinctAttribute" in err
    assert not list(node.regions.glob("*.limits")) and not list(node.cdi.glob("*.json"))

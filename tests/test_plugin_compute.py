"""The compute share on the device-plugin path (issue 33, items 2 and 6): the real node agent registers a second
extended resource, `memslice.io/gpu-compute` (100 devices per GPU), on its own socket with the kubelet stand-in;
a pod the real extender placed with a share is admitted over real gRPC, and the memory Allocate writes the
share from the reservation into the container's read-only limits file and provisions its slot in the GPU's
roster (src/memslice/compute.py), mounted read-only but for the container's own slot; the compute Allocate
refuses IDs that are not the agent's by name; the slot goes back when the pod is gone."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from kube_standin import KubeApiStandin
from test_e2e_cluster import RESOURCE, UNIT, GpuNode
from test_extender_support import Cluster, pod_obj

from memslice import compute, contract
from memslice.paths import lib_paths
from memslice.proto import api_pb2

NODE = "gpu-c"
COMPUTE = contract.RESOURCE_COMPUTE


@pytest.fixture
def world() -> Iterator[tuple[Cluster, GpuNode]]:
    lib_paths()
    root = Path(tempfile.mkdtemp(prefix="ms-cmp-", dir="/tmp"))  # short: Unix socket paths
    kube = KubeApiStandin().start()
    kubeconfig = kube.kubeconfig(str(root / "kubeconfig"))
    cluster = Cluster(kube)
    node = None
    try:
        kube.put({"kind": "Node", "apiVersion": "v1", "metadata": {"name": NODE}})
        node = GpuNode(root, NODE, "8GiB,8GiB", kubeconfig)
        cluster.start()
        node.kubelet.wait_registered(RESOURCE, timeout=30)
        assert cluster.state.wait_for(lambda st: node.alive() and (v := st.view(NODE)) is not None and v.gpus, 30), \
            "the node agent's inventory never reached the extender"
        yield cluster, node
    finally:
        cluster.stop()
        if node is not None:
            node.stop()
        kube.stop()
        shutil.rmtree(root, ignore_errors=True)


def admit(cluster: Cluster, node: GpuNode, name: str, mib: int, pct: int, limit: int | None = None
          ) -> tuple[dict[str, Any], api_pb2.ContainerAllocateResponse]:
    """Schedule a pod of `mib` MiB and `pct` percent (and a limit), admit both resources on the node as the
    kubelet does: the pod and the memory Allocate's answer."""
    obj = pod_obj(name, {"main": mib // UNIT},
                  annotations={contract.ANN_GPU_COMPUTE_LIMIT: str(limit)} if limit else None)
    obj["spec"]["containers"][0]["resources"]["limits"][COMPUTE] = str(pct)
    pod = cluster.add_pod(obj)
    assert cluster.c.filter(pod, [NODE])["NodeNames"] == [NODE]
    assert cluster.c.bind(pod, NODE) == ""
    node.wait_log(f"pod default/{name}: the extender reserved GPU", f"the node agent to see {name}'s reservation")
    uid = pod["metadata"]["uid"]
    resp = node.kubelet.admit(uid, "default", name, [("main", mib // UNIT)], RESOURCE)["main"]
    extra = node.kubelet.admit(uid, "default", name, [("main", pct)], COMPUTE)["main"]
    assert not extra.envs and not extra.mounts  # the share lives in the limits file, never in the env
    return pod, resp


def mounts(resp: api_pb2.ContainerAllocateResponse) -> dict[str, tuple[str, bool]]:
    return {m.container_path: (m.host_path, m.read_only) for m in resp.mounts}


def test_the_agent_advertises_compute_and_allocate_writes_the_share_and_provisions_the_slot(world) -> None:
    cluster, node = world
    ep = node.kubelet.wait_registered(COMPUTE, timeout=30)
    assert not ep.options.get_preferred_allocation_available
    assert node.kubelet.wait_for(lambda: node.kubelet.capacity(COMPUTE) == 200)
    assert node.kubelet.healthy_ids(COMPUTE) == {f"c{g}-{n}" for g in (0, 1) for n in range(100)}
    pod_a, a = admit(cluster, node, "a", 1024, 30, limit=60)
    pod_b, b = admit(cluster, node, "b", 1024, 50)
    ann = cluster.kube.get("Pod", "default", "a")["metadata"]["annotations"]
    assert json.loads(ann[contract.ANN_GPU_COMPUTE]) == {"main": [30, 60]}
    uuid = a.envs["NVIDIA_VISIBLE_DEVICES"]
    assert b.envs["NVIDIA_VISIBLE_DEVICES"] == uuid  # binpack on both: the same GPU (30 + 50 fits)
    texts = [Path(mounts(r)["/run/memslice/limits"][0]).read_text() for r in (a, b)]
    for text, (req, lim, slot) in zip(texts, ((30, 60, 0), (50, None, 1)), strict=True):
        keys = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
        assert keys["gpu_compute_request"] == str(req) and keys.get("gpu_compute_limit") == (
            str(lim) if lim else None), text
        assert keys["compute_dir"] == compute.CONTAINER_COMPUTE_DIR and keys["compute_slot"] == str(slot), text
    # the GPU's directory read-only (roster, neighbours), only the container's own slot writable on top
    m = mounts(a)
    gpu_dir, ro = m[f"{compute.CONTAINER_COMPUTE_DIR}/{uuid}"]
    assert ro and m[f"{compute.CONTAINER_COMPUTE_DIR}/{uuid}/slot-00"] == (f"{gpu_dir}/slot-00", False)
    assert f"{compute.CONTAINER_COMPUTE_DIR}/{uuid}/slot-01" not in m
    assert mounts(b)[f"{compute.CONTAINER_COMPUTE_DIR}/{uuid}/slot-01"] == (f"{gpu_dir}/slot-01", False)
    host_dir = Path(gpu_dir).parent
    roster = compute.read_roster(host_dir, uuid)
    assert roster == {0: compute.RosterEntry(0, 30, 60, 0), 1: compute.RosterEntry(1, 50, None, 0)}
    # the pod goes: its slot leaves the roster
    cluster.kube.delete("Pod", "default", "a")
    node.kubelet.remove_pod(pod_a["metadata"]["uid"])
    node.wait_log("removed region", "the gone pod's region removed")
    assert node.kubelet.wait_for(lambda: compute.read_roster(host_dir, uuid) == {
        1: compute.RosterEntry(1, 50, None, 0)})
    assert not (Path(gpu_dir) / "slot-00").exists()


BAD_IDS = [
    (["c9-0"], "compute device ID c9-0 names GPU 9, which this node does not have"),
    (["g0-1"], "'g0-1' is not a memslice compute device ID"),
    (["c0-100"], "'c0-100' is not a memslice compute device ID"),
    (["c0-01"], "'c0-01' is not a memslice compute device ID"),
    (["c0-1", "c0-1"], "compute device ID c0-1 is requested twice"),
    ([f"c0-{n}" for n in range(100)] + ["c1-0"], "101 compute devices requested for one container"),
]


def test_the_compute_allocate_refuses_ids_that_are_not_ours_by_name(world) -> None:
    _, node = world
    ep = node.kubelet.wait_registered(COMPUTE, timeout=30)
    for ids, named in BAD_IDS:
        with pytest.raises(grpc.RpcError) as exc:
            ep.stub.Allocate(api_pb2.AllocateRequest(container_requests=[
                api_pb2.ContainerAllocateRequest(devices_ids=ids)]), timeout=10)
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT and named in exc.value.details(), \
            exc.value.details()
    ok = ep.stub.Allocate(api_pb2.AllocateRequest(container_requests=[
        api_pb2.ContainerAllocateRequest(devices_ids=["c1-0", "c1-99"])]), timeout=10)
    assert len(ok.container_responses) == 1

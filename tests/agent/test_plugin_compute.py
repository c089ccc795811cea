"""The compute share on the device-plugin path (issue 33, items 2 and 6): the real node agent registers a second
extended resource, `memslice.io/gpu-compute` (100 devices per GPU), on its own socket with the kubelet stand-in;
a pod the real extender placed with a share is admitted over real gRPC, and the memory Allocate writes the
share from the reservation into the container's read-only limits file and provisions its slot in the GPU's
roster (src/memslice/compute.py), mounted read-only but for the container's own slot; the compute Allocate
refuses IDs that are not the agent's by name; the slot goes back when the pod is gone."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from kube_standin import KubeApiStandin
from prometheus_client.parser import text_string_to_metric_families
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
    check_metrics(node, Path(gpu_dir))
    # the pod goes: its slot leaves the roster
    cluster.kube.delete("Pod", "default", "a")
    node.kubelet.remove_pod(pod_a["metadata"]["uid"])
    node.wait_log("removed region", "the gone pod's region removed")
    assert node.kubelet.wait_for(lambda: compute.read_roster(host_dir, uuid) == {
        1: compute.RosterEntry(1, 50, None, 0)})
    assert not (Path(gpu_dir) / "slot-00").exists()


def publish(slot_file: Path, share_pm: int, used_ns: int, stop: threading.Event) -> None:
    """What a tenant's process does in its own (writable) slot file: publish its figures, fresh, every 50 ms,
    the way the shim does (memslice.compute's record layout)."""
    while not stop.is_set():
        rec = struct.pack("<IHHiBBHiIQQQQQ", compute.RECORD_MAGIC, compute.RECORD_VERSION, compute.F_INFLIGHT, 7,
                          100, 100, 0, 0, share_pm, time.monotonic_ns(), used_ns, 2_000_000_000, 3_000_000_000, 9)
        with open(slot_file, "r+b") as f:
            f.write(rec)
        stop.wait(0.05)


def scrape(node: GpuNode) -> dict[tuple[str, str], float]:
    """(family sample name, container) -> value of the agent's compute figures (real HTTP, prometheus parser)."""
    port = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/", node.log())
    assert port, node.log()
    with urllib.request.urlopen(f"http://127.0.0.1:{port.group(1)}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {(s.name, s.labels.get("pod", s.labels.get("uuid", ""))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples if "compute" in s.name}


def check_metrics(node: GpuNode, gpu_dir: Path) -> None:
    """Per container: the share it was given (the ledger's), and what its processes published, bounded by the
    roster: a (limit 60) claims 100 % and is reported at 60; b (no limit) at what it says."""
    stop = threading.Event()
    tenants = [threading.Thread(target=publish, args=(gpu_dir / f"slot-0{i}", pm, ns, stop), daemon=True)
               for i, pm, ns in ((0, 1000, 5_000_000_000), (1, 420, 1_000_000_000))]
    for t in tenants:
        t.start()
    try:
        deadline = time.monotonic() + 20
        while True:  # a scrape between two publishes of a loaded machine may find a record just stale
            m = scrape(node)
            if ("memslice_container_compute_share_percent", "b") in m or time.monotonic() > deadline:
                break
        while True:  # `memslice top` on the node: the same figures, named by the agent's records
            top = subprocess.run([sys.executable, "-m", "memslice", "top", "--region-root", str(node.dir / "regions"),
                                  "--json"], capture_output=True, text=True, timeout=60)
            rows = {r["owner"]: r for r in json.loads(top.stdout)["compute"]}
            if all(r["processes"] for r in rows.values()) or time.monotonic() > deadline:
                break
    finally:
        stop.set()
        for t in tenants:
            t.join()
    assert m[("memslice_container_compute_request_percent", "a")] == 30
    assert m[("memslice_container_compute_limit_percent", "a")] == 60
    assert ("memslice_container_compute_limit_percent", "b") not in m
    assert m[("memslice_container_compute_share_percent", "a")] == 60  # claimed 100, capped by the roster's 60
    assert m[("memslice_container_compute_share_percent", "b")] == 42
    assert m[("memslice_container_compute_used_seconds_total", "a")] == 5
    assert m[("memslice_container_compute_throttled_seconds_total", "b")] == 2
    assert m[("memslice_container_compute_waited_seconds_total", "b")] == 3
    assert [v for (n, _), v in m.items() if n == "memslice_gpu_compute_requested_percent"] == [80]
    assert top.returncode == 0, top.stderr
    a, b = rows["default/a/main"], rows["default/b/main"]
    assert (a["slot"], a["request"], a["limit"], a["share_pct"], a["used_s"]) == (0, 30, 60, 60.0, 5.0), a
    assert (b["slot"], b["request"], b["limit"], b["share_pct"], b["waited_s"]) == (1, 50, None, 42.0, 3.0), b
    text = subprocess.run([sys.executable, "-m", "memslice", "top", "--region-root", str(node.dir / "regions"),
                           "--once"], capture_output=True, text=True, timeout=60).stdout
    assert "default/a/main: share" in text and "of request 30% limit 60" in text, text


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

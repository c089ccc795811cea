"""Device-plugin mode, a pod spanning GPUs (issue 34): the node agent as a process, the kubelet stand-in over
real gRPC on Unix sockets, the pod's reservation from the API stand-in's pod watch, and a process under the real
shim on two simulated GPUs, held to the per-GPU quota on each (read back from the shim's region and from the
simulated GPU's own NVML figure)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from test_plugin_agent import RESOURCE
from test_plugin_agent import short_tmp as short_tmp
from test_plugin_kube import NS, REAL, pod, published, uid_of
from test_plugin_kube import cluster as cluster  # fixtures, shared
from test_plugin_kube import real_node as real_node
from test_plugin_quota import to_host

from memslice.proto import api_pb2

pytestmark = REAL  # the agent's API is the session's real kube-apiserver (test_plugin_kube's fixtures)

# Allocates on every visible device in turn (a context, then each size), one JSON line per step; holds the memory
# until stdin closes. ctypes over libcuda.so.1, so the preloaded shim sees every call.
TWO_DEVICES = r"""
import ctypes, json, sys
cuda = ctypes.CDLL("libcuda.so.1")
ptr = ctypes.c_ulonglong
cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ptr), ctypes.c_size_t]
assert cuda.cuInit(0) == 0
n = ctypes.c_int()
cuda.cuDeviceGetCount(ctypes.byref(n))
held = []
for d in range(n.value):
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    rc = cuda.cuDeviceGet(ctypes.byref(dev), d) or cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
    rc = rc or cuda.cuCtxSetCurrent(ctx)
    for mib in map(int, sys.argv[1:]):
        p = ptr()
        r = cuda.cuMemAlloc_v2(ctypes.byref(p), mib << 20)
        held.append(p)
        print(json.dumps({"device": d, "mib": mib, "result": rc or r}), flush=True)
print(json.dumps({"event": "ready", "devices": n.value}), flush=True)
sys.stdin.read()
"""


def asking(body: dict, total: int) -> dict:
    """`body` with its container asking for `total` devices (as deploy/core's memslice-gpu-count policy wants of a
    pod spanning GPUs, in force on the session's API server once a module has applied deploy/)."""
    body["spec"]["containers"][0]["resources"] = {"limits": {RESOURCE: str(total)}}
    return body


def two_gpu_pod(api, name: str, uuids: list[str], mib: int) -> str:
    body = asking(pod(name, ",".join(uuids), {"main": mib}), mib)
    body["metadata"]["annotations"]["memslice.io/gpu-count"] = str(len(uuids))
    api.put(body)
    return uid_of(api, name)


def test_a_pod_spanning_two_gpus_gets_both_in_record_order_each_with_its_quota(cluster):
    api, kubelet, make = cluster
    agent = make(sim_gpus="8GiB,8GiB", unit_mib=4, args=("--preload", "env"))
    gpus, _ = published(api, agent)
    a, b = gpus[0]["uuid"], gpus[1]["uuid"]
    uid = two_gpu_pod(api, "tp", [b, a], 2048)  # device 0 is GPU 1: the record's order, not the index
    agent.wait_log(f"{NS}/tp: the extender reserved GPU", "the pod watch")
    kubelet.wait_registered(RESOURCE)
    resp = kubelet.admit(uid, NS, "tp", [("main", 512)], RESOURCE)["main"]  # 2048 MiB in 4 MiB devices
    chosen = kubelet.pods[uid].containers["main"][RESOURCE]
    assert sorted({i.split("-")[0] for i in chosen}) == ["g0", "g1"]
    assert sum(i.startswith("g0-") for i in chosen) == sum(i.startswith("g1-") for i in chosen) == 256
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == f"{b},{a}"
    assert resp.envs["MEMSLICE_GPU_MEM_LIMIT"] == "1024"  # per GPU
    host = {m.container_path: m.host_path for m in resp.mounts}
    assert "gpu_mem_limit=1024MiB\n" in Path(host["/run/memslice/limits"]).read_text()  # the quota per GPU
    (record,) = [json.loads(p.read_text()) for p in agent.region_root.glob("*.json")]
    assert (record["gpu_uuid"], record["more_gpus"], record["mib"]) == (b, [[0, a]], 1024)
    assert (record["pod"], record["container"], record["pod_uid"]) == ("tp", "main", uid)
    # the ledger charges each GPU its part
    assert agent.sample("memslice_gpu_allocated_mib", gpu="0") == [1024.0]
    assert agent.sample("memslice_gpu_allocated_mib", gpu="1") == [1024.0]

    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSLICE_")}
    env.update({k: to_host(v, host) for k, v in resp.envs.items()})
    tenant = subprocess.Popen([sys.executable, "-c", TWO_DEVICES, "400", "600"], env=env, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert tenant.stdout is not None
        lines = []
        while not lines or lines[-1].get("event") != "ready":
            line = tenant.stdout.readline()
            assert line, f"tenant ended early: {tenant.stderr.read() if tenant.stderr else ''}"
            lines.append(json.loads(line))
        # on each GPU: its context (520 MiB, measured) + 400 MiB fit in 1024 MiB; 600 more do not (OOM = 2)
        assert [(x["device"], x["mib"], x["result"]) for x in lines[:-1]] == [(0, 400, 0), (0, 600, 2),
                                                                             (1, 400, 0), (1, 600, 2)]
        for uuid, index in ((a, "0"), (b, "1")):
            labels = {"pod": "tp", "container": "main", "gpu": uuid}
            assert agent.sample("memslice_container_quota_mib", **labels) == [1024.0]
            assert agent.sample("memslice_container_used_mib", **labels) == [520.0 + 400]
            assert agent.sample("memslice_container_refused_allocations_total", **labels) == [1.0]
            (physical,) = agent.sample("memslice_gpu_used_mib", gpu=index)  # the simulated GPU's own NVML figure
            assert 920 <= physical < 1024
    finally:
        tenant.communicate(timeout=30)
    # the pod goes: both GPUs get their part back
    kubelet.remove_pod(uid)
    api.delete("Pod", NS, "tp")
    agent.wait_log("removed region", "the region removed")
    assert agent.sample("memslice_gpu_allocated_mib", gpu="0") == [0.0]
    assert agent.sample("memslice_gpu_allocated_mib", gpu="1") == [0.0]


def test_ids_spanning_gpus_without_a_reservation_on_them_are_refused(cluster):
    api, kubelet, make = cluster
    agent = make(sim_gpus="8GiB,8GiB,8GiB", unit_mib=4)
    gpus, _ = published(api, agent)
    uid = two_gpu_pod(api, "tp", [gpus[0]["uuid"], gpus[1]["uuid"]], 64)
    agent.wait_log(f"{NS}/tp: the extender reserved GPU", "the pod watch")
    ep = kubelet.wait_registered(RESOURCE)
    # GPUs 0 and 2: not the pair reserved
    req = api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(
        devices_ids=[f"g0-{n}" for n in range(8)] + [f"g2-{n}" for n in range(8)])])
    with pytest.raises(grpc.RpcError) as exc:
        ep.stub.Allocate(req, timeout=10)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "no pod is reserved on exactly those GPUs" in exc.value.details()
    assert not list(agent.region_root.glob("*.json"))
    # the reserved pair, split evenly, is the pod's (matched without a preference: the kubelet skipped it)
    req = api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(
        devices_ids=[f"g1-{n}" for n in range(8)] + [f"g0-{n}" for n in range(8)])])
    resp = ep.stub.Allocate(req, timeout=10).container_responses[0]
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == f"{gpus[0]['uuid']},{gpus[1]['uuid']}"
    (record,) = [json.loads(p.read_text()) for p in agent.region_root.glob("*.json")]
    assert (record["pod_uid"], record["mib"]) == (uid, 32)


def test_compute_share_and_elastic_limit_of_a_spanning_pod_hold_one_slot_free_on_both_gpus(cluster):
    from memslice.compute import read_roster
    from memslice.elastic import board_slot_path

    api, kubelet, make = cluster
    agent = make(sim_gpus="8GiB,8GiB", unit_mib=4)
    gpus, _ = published(api, agent)
    a, b = gpus[0]["uuid"], gpus[1]["uuid"]
    one = pod("one", a, {"main": 256})
    one["metadata"]["annotations"]["memslice.io/gpu-compute-pct"] = json.dumps({"main": [20, None]})
    api.put(one)
    body = asking(pod("tp", f"{a},{b}", {"main": 2048}), 2048)
    body["metadata"]["annotations"].update({"memslice.io/gpu-count": "2",
                                            "memslice.io/gpu-compute-pct": json.dumps({"main": [30, 60]}),
                                            "memslice.io/gpu-mem-limit-mib": json.dumps({"main": 3072})})
    api.put(body)
    agent.wait_log(f"{NS}/tp: the extender reserved GPU", "the pod watch")
    kubelet.wait_registered(RESOURCE)
    kubelet.admit(uid_of(api, "one"), NS, "one", [("main", 64)], RESOURCE)
    uid = uid_of(api, "tp")
    resp = kubelet.admit(uid, NS, "tp", [("main", 512)], RESOURCE)["main"]
    compute_dir, elastic_dir = agent.root / "compute", agent.root / "elastic"
    # slot 0 is "one"'s on GPU 0: the spanning pod's one slot is 1, on both GPUs' rosters, with its per-GPU share
    assert {s: (e.request, e.limit) for s, e in (read_roster(compute_dir, a) or {}).items()} == {0: (20, None),
                                                                                                 1: (30, 60)}
    assert {s: (e.request, e.limit) for s, e in (read_roster(compute_dir, b) or {}).items()} == {1: (30, 60)}
    rw = {m.container_path: m.host_path for m in resp.mounts if not m.read_only}
    for uuid in (a, b):  # that slot's file writable on each GPU's board, nothing else of the boards
        assert rw[f"/run/memslice/compute/{uuid}/slot-01"] == str(compute_dir / uuid / "slot-01")
        assert rw[f"/run/memslice/elastic/{board_slot_path(uuid, 0)}"] == str(elastic_dir / board_slot_path(uuid, 0))
    host = {m.container_path: m.host_path for m in resp.mounts}
    limits = Path(host["/run/memslice/limits"]).read_text()
    for line in ("gpu_mem_limit=1536MiB", "gpu_mem_request=1024MiB", "compute_slot=1", "elastic_slot=0",
                 "gpu_compute_request=30", "gpu_compute_limit=60"):
        assert f"{line}\n" in limits, limits
    # `memslice top` names the container on both GPUs' slot from the agent's record
    from memslice.top import compute_owners

    owners = compute_owners(str(agent.region_root))
    assert owners[(a, 1)] == owners[(b, 1)] == f"{NS}/tp/main" and owners[(a, 0)] == f"{NS}/one/main"
    kubelet.remove_pod(uid)
    api.delete("Pod", NS, "tp")
    agent.wait_log("removed region", "the region removed")
    assert set(read_roster(compute_dir, a) or {}) == {0} and not read_roster(compute_dir, b)


def test_each_container_of_a_spanning_pod_gets_both_gpus_with_its_own_share(cluster):
    """A pod spanning two GPUs with two containers of different sizes (issue 34: "each with its own quota and its
    own limits/ledger entries"): each container sees both GPUs in the record's order, with its own per-GPU quota
    and its own region; the ledger charges each GPU the sum of the containers' shares."""
    api, kubelet, make = cluster
    agent = make(sim_gpus="8GiB,8GiB", unit_mib=4)
    gpus, _ = published(api, agent)
    a, b = gpus[0]["uuid"], gpus[1]["uuid"]
    body = pod("mix", f"{b},{a}", {"small": 1024, "large": 2048})  # totals over the two GPUs
    for c, total in zip(body["spec"]["containers"], (1024, 2048), strict=True):
        c["resources"] = {"limits": {RESOURCE: str(total)}}
    body["metadata"]["annotations"]["memslice.io/gpu-count"] = "2"
    api.put(body)
    agent.wait_log(f"{NS}/mix: the extender reserved GPU", "the pod watch")
    kubelet.wait_registered(RESOURCE)
    uid = uid_of(api, "mix")
    resp = kubelet.admit(uid, NS, "mix", [("small", 256), ("large", 512)], RESOURCE)
    for name, share in (("small", 512), ("large", 1024)):
        ids = kubelet.pods[uid].containers[name][RESOURCE]
        assert sum(i.startswith("g0-") for i in ids) == sum(i.startswith("g1-") for i in ids) == share // 4, name
        assert resp[name].envs["NVIDIA_VISIBLE_DEVICES"] == f"{b},{a}", name
        assert resp[name].envs["MEMSLICE_GPU_MEM_LIMIT"] == str(share), name
    records = {r["container"]: r for r in (json.loads(p.read_text()) for p in agent.region_root.glob("*.json"))}
    assert {n: (r["gpu_uuid"], r["more_gpus"], r["mib"]) for n, r in records.items()} == {
        "small": (b, [[0, a]], 512), "large": (b, [[0, a]], 1024)}
    assert agent.sample("memslice_gpu_allocated_mib", gpu="0") == [1536.0]
    assert agent.sample("memslice_gpu_allocated_mib", gpu="1") == [1536.0]

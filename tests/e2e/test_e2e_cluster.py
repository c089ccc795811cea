"""End to end: API stand-in + extender + node agents on simulated GPUs + kubelet stand-ins.

Pods are created in the API stand-in, scheduled through the extender's verbs the way kube-scheduler calls
them (filter with every node, prioritize the nodes that passed, bind to the best), admitted by the kubelet
stand-in of the chosen node (GetPreferredAllocation + one Allocate per container, answered by the real node
agent process), and then each container's process runs under its Allocate answer (env, region mount, the
shim the agent installed) on the node's simulated GPU. Checked: every pod is on a GPU that had room, the
agent gave each container the GPU and quota the extender reserved, and every process is held to its quota
while all of them hold their memory at the same time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ChildLog
from kube_standin import KubeApiStandin
from kubelet_standin import KubeletStandin
from sim_truth import gpu_truth
from test_extender_support import Cluster, plain_node, pod_obj

from memslice.paths import lib_paths

RESOURCE = "memslice.io/gpu-mem"
ROOT = Path(__file__).resolve().parents[2]
UNIT = 4  # MiB per device
CONTEXT_RESERVE_MIB = 520  # what a context takes on the simulated GPU (its default, an H100's), as the shim measures it
NODES = {"gpu-a": "16GiB,8GiB", "gpu-b": "24GiB"}

# A container's process: picks the CUDA device whose UUID is NVIDIA_VISIBLE_DEVICES (what the NVIDIA
# container runtime does by exposing only that GPU), allocates in 256 MiB steps until refused, reports,
# then holds its memory until stdin closes.
TENANT = r"""
import ctypes, json, os, sys
cuda = ctypes.CDLL("libcuda.so.1")
ptr = ctypes.c_ulonglong
cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ptr), ctypes.c_size_t]
cuda.cuMemFree_v2.argtypes = [ptr]
assert cuda.cuInit(0) == 0
count = ctypes.c_int()
cuda.cuDeviceGetCount(ctypes.byref(count))
want = os.environ["NVIDIA_VISIBLE_DEVICES"]
ordinal = None
for i in range(count.value):
    dev = ctypes.c_int()
    cuda.cuDeviceGet(ctypes.byref(dev), i)
    raw = (ctypes.c_ubyte * 16)()
    cuda.cuDeviceGetUuid(raw, dev)
    h = bytes(raw).hex()
    if f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}" == want:
        ordinal = dev
if ordinal is None:
    print(json.dumps({"error": f"no device with UUID {want}"}), flush=True)
    sys.exit(1)
ctx = ctypes.c_void_p()
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), ordinal) == 0 and cuda.cuCtxSetCurrent(ctx) == 0
held, refused = [], None
while refused is None and len(held) < 1000:
    p = ptr()
    rc = cuda.cuMemAlloc_v2(ctypes.byref(p), 256 << 20)
    if rc == 0:
        held.append(p)
    else:
        refused = rc
print(json.dumps({"allocated_mib": 256 * len(held), "refused_with": refused}), flush=True)
sys.stdin.read()
for p in held:
    cuda.cuMemFree_v2(p)
"""


class GpuNode:
    """A node agent process on a simulated node, next to its kubelet stand-in."""

    def __init__(self, root: Path, name: str, gpus: str, kubeconfig: str, extra: tuple[str, ...] = ()) -> None:
        self.name, self.gpus = name, gpus
        self.dir = root / name
        self.dir.mkdir()
        self.state = self.dir / "sim.state"
        self.log_path = self.dir / "agent.log"
        self.kubelet = KubeletStandin(self.dir / "dp", self.dir / "pr" / "kubelet.sock").start()
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("MEMSLICE_") and k not in ("KUBERNETES_SERVICE_HOST", "NODE_NAME")}
        env.update(MEMSLICE_SIM_STATE=str(self.state), KUBECONFIG=kubeconfig)
        self.env = env
        cmd = [sys.executable, "-m", "memslice", "node-agent", "--simulate", gpus, "--unit-mib", str(UNIT),
               "--device-plugin-dir", str(self.dir / "dp"), "--pod-resources-socket",
               str(self.dir / "pr" / "kubelet.sock"), "--region-root", str(self.dir / "regions"),
               "--shim-host-dir", str(self.dir / "lib"), "--metrics-address", "127.0.0.1", "--metrics-port",
               "0", "--reconcile-interval-s", "0.5", "--node-name", name, "--kubeconfig", kubeconfig, *extra]
        self.cmd, self.runs = cmd, 0
        self.start_agent()

    def start_agent(self) -> None:
        """A node agent process (again, after stop_agent: its pod replaced; a log file per process)."""
        self.runs += 1
        if self.runs > 1:
            self.log_path = self.dir / f"agent-{self.runs}.log"
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=self.env,
                                     cwd=ROOT)
        self.output = ChildLog(self.proc, self.log_path)

    def stop_agent(self) -> None:
        """The agent's pod goes away (SIGTERM, then SIGKILL after 10 s); the kubelet stand-in stays."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def log(self) -> str:
        return self.output.text()

    def wait_log(self, text: str, what: str) -> None:
        """Wait until the agent's output contains `text`; fails at once if the agent exits first."""
        self.output.wait_for(lambda out: text in out, 15, what)

    def alive(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"node agent {self.name} exited {self.proc.returncode}:\n{self.log()}")
        return True

    @staticmethod
    def to_host(value: str, mounts: dict[str, str]) -> str:
        """A container path (or a path under a mount) as the host path the mount gives it."""
        for cpath in sorted(mounts, key=len, reverse=True):
            if value == cpath or value.startswith(cpath + "/"):
                return mounts[cpath] + value[len(cpath):]
        return value

    def container_env(self, resp) -> dict[str, str]:
        """The environment of a process in the container this Allocate answer describes."""
        mounts = {m.container_path: m.host_path for m in resp.mounts}
        env = {k: v for k, v in self.env.items() if not k.startswith("MEMSLICE_") and k != "KUBECONFIG"}
        # the response's env as the container sees it, with each mounted path translated to the host's
        env.update({k: self.to_host(v, mounts) for k, v in resp.envs.items()})
        env["LD_PRELOAD"] = mounts["/usr/local/memslice/lib/libmemslice.so"]  # stands in for /etc/ld.so.preload
        return env

    def stop(self) -> None:
        self.stop_agent()
        self.kubelet.stop()


@pytest.fixture
def world() -> Iterator[tuple[Cluster, dict[str, GpuNode]]]:
    lib_paths()  # the shim and the simulated driver must be built
    root = Path(tempfile.mkdtemp(prefix="ms-e2e-", dir="/tmp"))  # short: Unix socket paths
    kube = KubeApiStandin().start()
    kubeconfig = kube.kubeconfig(str(root / "kubeconfig"))
    nodes: dict[str, GpuNode] = {}
    cluster = Cluster(kube)
    try:
        for name in NODES:
            kube.put(plain_node(name))
        for name, gpus in NODES.items():
            nodes[name] = GpuNode(root, name, gpus, kubeconfig)
        cluster.start()
        for n in nodes.values():
            n.kubelet.wait_registered(RESOURCE, timeout=30)
        assert cluster.state.wait_for(lambda state: all(n.alive() and (v := state.view(n.name)) is not None
                                                         and v.gpus for n in nodes.values()), 30), \
            "the node agents' inventories never reached the extender"
        yield cluster, nodes
    finally:
        cluster.stop()
        for n in nodes.values():
            n.stop()
        kube.stop()
        shutil.rmtree(root, ignore_errors=True)


def schedule(cluster: Cluster, pod: dict) -> str | None:
    """One scheduling cycle as kube-scheduler runs it with this extender; the node, or None."""
    names = sorted(NODES)
    result = cluster.c.filter(pod, names)
    assert result["Error"] == ""
    if not result["NodeNames"]:
        return None
    scores = cluster.c.prioritize(pod, result["NodeNames"])
    best = max(result["NodeNames"], key=lambda n: scores[n])
    assert cluster.c.bind(pod, best) == ""
    return best


def test_pods_scheduled_admitted_and_held_to_their_quota(world) -> None:
    cluster, nodes = world
    kube = cluster.kube
    wanted = [  # name, {container: devices}, policy
        ("train", {"main": 3000}, None),           # 12000 MiB: the 16 GiB or the 24 GiB GPU
        ("serve", {"main": 1024}, "spread"),       # 4096 MiB
        ("multi", {"model": 512, "tokenizer": 256}, None),  # 2048 + 1024 MiB on one GPU
        ("small", {"main": 600}, None),            # 2400 MiB
        ("fill", {"main": 3500}, None),            # 14000 MiB
        ("huge", {"main": 7000}, None),            # 28000 MiB: no GPU is that big
    ]
    placed: dict[str, str] = {}
    for name, containers, policy in wanted:
        pod = cluster.add_pod(pod_obj(name, containers, policy=policy))
        node = schedule(cluster, pod)
        if node is not None:
            placed[name] = node
    assert "huge" not in placed and set(placed) == {n for n, _, _ in wanted} - {"huge"}
    huge = kube.get("Pod", "default", "huge")
    assert not huge["spec"].get("nodeName") and "annotations" not in huge["metadata"]

    # every GPU holds no more than it has, by the reservations the extender wrote
    inventory = {g.uuid: (n, g.mem_mib) for n in NODES for g in cluster.state.view(n).gpus}
    reserved: dict[str, int] = {}
    for name in placed:
        ann = kube.get("Pod", "default", name)["metadata"]["annotations"]
        uuid = ann["memslice.io/gpu-uuid"]
        assert inventory[uuid][0] == placed[name], f"{name}: GPU {uuid} is not on {placed[name]}"
        reserved[uuid] = reserved.get(uuid, 0) + sum(json.loads(ann["memslice.io/gpu-mem-mib"]).values())
    assert all(mib <= inventory[uuid][1] for uuid, mib in reserved.items()), reserved

    # admission on each node, then the containers' processes, all running at the same time
    tenants = []
    started: list[tuple[dict[str, str], str, subprocess.Popen[str]]] = []  # (env, GPU uuid, process)
    try:
        for name, containers, _ in wanted:
            if name not in placed:
                continue
            node = nodes[placed[name]]
            pod = kube.get("Pod", "default", name)
            ann = pod["metadata"]["annotations"]
            seen = f"pod default/{name}: the extender reserved GPU"
            node.wait_log(seen, f"node agent {node.name} to see the reservation of {name}")
            responses = node.kubelet.admit(pod["metadata"]["uid"], "default", name, list(containers.items()),
                                           RESOURCE)
            mib = json.loads(ann["memslice.io/gpu-mem-mib"])
            for container, resp in responses.items():
                assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == ann["memslice.io/gpu-uuid"], (name, container)
                assert resp.envs["MEMSLICE_GPU_MEM_LIMIT"] == str(mib[container]) == str(
                    containers[container] * UNIT)
                env = node.container_env(resp)
                proc = subprocess.Popen([sys.executable, "-c", TENANT], env=env, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                tenants.append((name, container, mib[container], proc))
                started.append((env, ann["memslice.io/gpu-uuid"], proc))
        for name, container, limit, proc in tenants:
            line = proc.stdout.readline()
            assert line, f"{name}/{container} printed nothing: {proc.stderr.read() if proc.poll() else ''}"
            report = json.loads(line)
            assert "error" not in report, report
            # held to its quota: refused (CUDA_ERROR_OUT_OF_MEMORY) before the quota, after using nearly all
            assert report["refused_with"] == 2, (name, container, report)
            assert report["allocated_mib"] + CONTEXT_RESERVE_MIB <= limit, (name, container, report)
            assert report["allocated_mib"] + CONTEXT_RESERVE_MIB > limit - 256, (name, container, report)
        # the simulated GPUs' own figures (NVML past the shim, every process of the node): each process holds on
        # its GPU what its quota allows (its context, as the driver took it, and its allocations), no more
        envs = {proc.pid: (env, uuid) for env, uuid, proc in started}
        for name, container, limit, proc in tenants:
            env, uuid = envs[proc.pid]
            held = gpu_truth(env, uuid).processes.get(proc.pid, 0)
            assert limit - 256 < held >> 20 <= limit, (name, container, held >> 20, limit)

        # the biggest pod finishes: its container exits, the pod is deleted, and its room is handed out again
        fill_node = nodes[placed["fill"]]
        fill = kube.get("Pod", "default", "fill")
        nxt = cluster.add_pod(pod_obj("next", {"main": 3500}))
        assert cluster.c.filter(nxt, sorted(NODES))["NodeNames"] == [], "no GPU has 14000 MiB free yet"
        for name, _, _, proc in tenants:
            if name == "fill":
                proc.stdin.close()
                assert proc.wait(15) == 0
        fill_node.kubelet.remove_pod(fill["metadata"]["uid"])
        kube.delete("Pod", "default", "fill")
        cluster.caught_up()  # the watch delivers the deletion (before it, kube-scheduler would just retry)
        assert schedule(cluster, nxt) == placed["fill"]
        ann = kube.get("Pod", "default", "next")["metadata"]["annotations"]
        assert ann["memslice.io/gpu-uuid"] == fill["metadata"]["annotations"]["memslice.io/gpu-uuid"]
        fill_node.wait_log("pod default/next: the extender reserved GPU", "the node agent to see the new reservation")
        resp = fill_node.kubelet.admit(nxt["metadata"]["uid"], "default", "next", [("main", 3500)],
                                       RESOURCE)["main"]
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == ann["memslice.io/gpu-uuid"]
        proc = subprocess.Popen([sys.executable, "-c", TENANT], env=fill_node.container_env(resp),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        tenants.append(("next", "main", 14000, proc))
        report = json.loads(proc.stdout.readline())
        assert report["refused_with"] == 2 and 14000 - 256 < report["allocated_mib"] + CONTEXT_RESERVE_MIB <= 14000
        held = gpu_truth(fill_node.container_env(resp), ann["memslice.io/gpu-uuid"]).processes.get(proc.pid, 0)
        assert 14000 - 256 < held >> 20 <= 14000, held >> 20  # the GPU's own figure for it
    finally:
        for _, _, _, proc in tenants:
            if proc.poll() is None:
                proc.stdin.close()
        for _, _, _, proc in tenants:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()

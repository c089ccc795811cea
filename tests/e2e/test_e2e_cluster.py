"""End to end: the real kube-apiserver and kube-scheduler + extender + node agents on simulated GPUs + kubelet
stand-ins.

Pods are created in the real API server and scheduled by the real kube-scheduler with deploy/'s extender
configuration (filter, bind through the extender, over plain HTTP on loopback as deployed),
admitted by the kubelet stand-in of the chosen node (GetPreferredAllocation + one Allocate per container,
answered by the real node agent process), and then each container's process runs under its Allocate answer
(env, region mount, the shim the agent installed) on the node's simulated GPU. Checked: every pod is on a GPU
that had room, the agent gave each container the GPU and quota the extender reserved, and every process is
held to its quota while all of them hold their memory at the same time.
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
import yaml
from conftest import ChildLog
from extender_real import RealExtCluster, real_ext_cluster
from kube_real import SCHEDULER_TOKEN, Proc, RealCluster, stop_process, wait_until
from kubelet_standin import KubeletStandin
from sim_truth import gpu_truth
from test_extender_support import pod_obj as any_pod

from memslice.paths import lib_paths
from memslice.scheduler_extender.app import Config

RESOURCE = "memslice.io/gpu-mem"
ROOT = Path(__file__).resolve().parents[2]
UNIT = 4  # MiB per device
CONTEXT_RESERVE_MIB = 520  # what a context takes on the simulated GPU (its default, an H100's), as the shim measures it
NODES = {"gpu-42": "16GiB,8GiB", "gpu-43": "24GiB"}  # the real control plane's kubelet identities (KUBELET_NODES)
NS = "e2e-cluster"  # the module's namespace on the shared real API server
SCHEDULER = "memslice-e2e"  # this module's kube-scheduler profile (the extender serves its pods)
POOL = {"memslice-test/pool": "e2e-cluster"}  # NODES' label, the pods' nodeSelector: other modules' nodes stay out
# one real control plane (the session fixture real_cluster) serves the "kube" group: one xdist worker
pytestmark = pytest.mark.xdist_group("kube")

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
        stop_process(self.proc, 10)

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


def scheduler_config(cluster: RealCluster, ext_port: int) -> dict:
    """deploy/'s KubeSchedulerConfiguration with this module's profile, the API server's address, and the
    extender's port (on loopback over plain HTTP, as deploy/base runs it in the scheduler's pods)."""
    config = yaml.safe_load((ROOT / "deploy" / "base" / "scheduler" / "scheduler-config.yaml").read_text())
    config["clientConnection"] = {"kubeconfig": str(cluster.kubeconfig("kube-scheduler-e2e", SCHEDULER_TOKEN))}
    config["leaderElection"] = {"leaderElect": False}
    config["profiles"] = [{"schedulerName": SCHEDULER}]
    (ext,) = config["extenders"]
    assert ext["urlPrefix"] == "http://127.0.0.1:8888" and ext["enableHTTPS"] is False, ext
    ext["urlPrefix"] = f"http://127.0.0.1:{ext_port}"
    return config


@pytest.fixture
def world(real_cluster: RealCluster) -> Iterator[tuple[RealExtCluster, dict[str, GpuNode], Proc]]:
    from test_real_deploy import deploy, node_agent_token  # (it imports this module)

    lib_paths()  # the shim and the simulated driver must be built
    deploy(real_cluster, "base")
    root = Path(tempfile.mkdtemp(prefix="ms-e2e-", dir="/tmp"))  # short: Unix socket paths
    nodes: dict[str, GpuNode] = {}
    sched = None
    config = Config(address="127.0.0.1", port=0, watch_timeout=30, scheduler_names=(SCHEDULER,))
    with real_ext_cluster(real_cluster, NS, config) as cluster:
        try:
            for name, gpus in NODES.items():
                real_cluster.register_node(name, labels=POOL)
                cluster.kube.forget_inventory(name)  # an earlier agent's: this one writes its own
                kubeconfig = real_cluster.kubeconfig(f"agent-{name}", node_agent_token(real_cluster, name))
                nodes[name] = GpuNode(root, name, gpus, str(kubeconfig))
            cluster.start()
            for n in nodes.values():
                n.kubelet.wait_registered(RESOURCE, timeout=30)
                # the kubelet publishes the device plugin's devices as the node's capacity
                real_cluster.publish_capacity(n.name, {RESOURCE: str(n.kubelet.capacity(RESOURCE))},
                                              {RESOURCE: str(n.kubelet.allocatable(RESOURCE))})
            assert cluster.state.wait_for(lambda state: all(n.alive() and (v := state.view(n.name)) is not None
                                                             and v.gpus for n in nodes.values()), 30), \
                "the node agents' inventories never reached the extender"
            sched = real_cluster.start_scheduler(scheduler_config(real_cluster, cluster.ext.port), "kube-scheduler-e2e")
            yield cluster, nodes, sched
        finally:
            if sched is not None:
                sched.stop()  # this module's scheduler only: the session's API server goes on
                real_cluster.procs.remove(sched)
            for n in nodes.values():
                n.stop()
                cluster.kube.forget_inventory(n.name)
            shutil.rmtree(root, ignore_errors=True)


def pod_obj(name: str, containers: dict[str, int], policy: str | None = None) -> dict:
    obj = any_pod(name, containers, policy=policy, ns=NS, scheduler=SCHEDULER)
    obj["spec"]["nodeSelector"] = POOL
    return obj


def schedule(cluster: RealExtCluster, sched: Proc, pod: dict) -> str | None:
    """Create the pod and wait for kube-scheduler's verdict: the node it was bound to, or None when it reported
    the pod unschedulable (its PodScheduled condition)."""
    name = cluster.add_pod(pod)["metadata"]["name"]

    def verdict() -> str | None:
        got = cluster.kube.get("Pod", NS, name) or {}
        if (got.get("spec") or {}).get("nodeName"):
            return str(got["spec"]["nodeName"])
        cond = [c for c in (got.get("status") or {}).get("conditions", []) if c["type"] == "PodScheduled"]
        return "-" if cond and cond[0]["status"] == "False" and cond[0].get("reason") == "Unschedulable" else None

    node = wait_until(f"kube-scheduler's verdict on {name}", verdict, 60, 0.05, sched.check_alive)
    return None if node == "-" else node


def test_pods_scheduled_admitted_and_held_to_their_quota(world) -> None:
    cluster, nodes, sched = world
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
    for name, containers, policy in wanted:  # one at a time, as the hand-written cycle placed them
        node = schedule(cluster, sched, pod_obj(name, containers, policy=policy))
        if node is not None:
            placed[name] = node
    assert "huge" not in placed and set(placed) == {n for n, _, _ in wanted} - {"huge"}
    huge = kube.get("Pod", NS, "huge")
    assert not huge["spec"].get("nodeName") and "annotations" not in huge["metadata"]

    # every GPU holds no more than it has, by the reservations the extender wrote
    inventory = {g.uuid: (n, g.mem_mib) for n in NODES for g in cluster.state.view(n).gpus}
    reserved: dict[str, int] = {}
    for name in placed:
        ann = kube.get("Pod", NS, name)["metadata"]["annotations"]
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
            pod = kube.get("Pod", NS, name)
            ann = pod["metadata"]["annotations"]
            seen = f"pod {NS}/{name}: the extender reserved GPU"
            node.wait_log(seen, f"node agent {node.name} to see the reservation of {name}")
            responses = node.kubelet.admit(pod["metadata"]["uid"], NS, name, list(containers.items()),
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
        fill = kube.get("Pod", NS, "fill")
        nxt = pod_obj("next", {"main": 3500})
        assert cluster.c.filter(nxt, sorted(NODES))["NodeNames"] == [], "no GPU has 14000 MiB free yet"
        for name, _, _, proc in tenants:
            if name == "fill":
                proc.stdin.close()
                assert proc.wait(15) == 0
        fill_node.kubelet.remove_pod(fill["metadata"]["uid"])
        kube.delete("Pod", NS, "fill")
        cluster.caught_up()  # the watch delivers the deletion (before it, kube-scheduler would just retry)
        assert schedule(cluster, sched, nxt) == placed["fill"]
        nxt = kube.get("Pod", NS, "next")
        ann = kube.get("Pod", NS, "next")["metadata"]["annotations"]
        assert ann["memslice.io/gpu-uuid"] == fill["metadata"]["annotations"]["memslice.io/gpu-uuid"]
        fill_node.wait_log(f"pod {NS}/next: the extender reserved GPU", "the node agent to see the new reservation")
        resp = fill_node.kubelet.admit(nxt["metadata"]["uid"], NS, "next", [("main", 3500)],
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

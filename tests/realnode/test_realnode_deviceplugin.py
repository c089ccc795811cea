"""Device-plugin mode on a real node (issue 37, item 2): the real kubelet and containerd (tests/support/kube_node.py)
run memslice's pods.

The node agent runs as deploy/ runs it (its device-plugin socket in the kubelet's device-plugin directory, the
kubelet's PodResources socket, its ServiceAccount token bound to its pod on the node), and registers with the
real kubelet; the real kube-scheduler places a pod through the extender; the real kubelet calls
GetPreferredAllocation and Allocate; containerd and runc start the container with the answer's mounts and
env, and inside it a CUDA program on the simulated GPU is held to its quota by the shim that the mounted
/etc/ld.so.preload loads into every process. Then the kubelet restarts (the agent registers again, nothing is
handed out twice), the agent restarts (it recovers its ledger), and a deleted pod's region goes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kube_node import (
    CLIENT_SCRIPT,
    CONTEXT_MIB,
    DEVICE_PLUGIN_DIR,
    NodeAgent,
    RealNode,
    container_state,
    node_agent_token,
    node_images,
    pod,
)
from kube_node_images import TEST_IMAGE
from kube_real import RealCluster, wait_until
from test_deploy_render import NAMESPACE, RESOURCE, SCHEDULER_NAME, render
from test_real_scheduler import deploy_limit_ratio, extender_api, scheduler_config

from memslice.elastic import read_boards
from memslice.interposer.region import read_region_file
from memslice.plugin.regions import CONTAINER_SHIM
from memslice.scheduler_extender.app import Config, Extender

# One worker runs both real-node modules (one real node per machine at a time: tests/support/kube_node.py), one
# real node per module, after tests/dra/test_dra_node.py's agents on the same worker (xdist group "kube-dra"): they
# share that worker's session control plane (one kube-apiserver fewer: its start and ~1.7% of a core while the
# session lasts, ~13 CPU-s a run), and run beside the "kube" group's modules.
pytestmark = [pytest.mark.timeout(900), pytest.mark.xdist_group("kube-dra")]
NODE = "kubelet-dp"
NS = "realnode-dp"
UNIT = 4  # MiB per device
GPUS = "3GiB"  # one GPU: the simulated driver shows a container every GPU of the node, ordinal 0 first
GPU_MIB = 3 * 1024
QUOTA_MIB = 1024
CHECKPOINT = DEVICE_PLUGIN_DIR / "kubelet_internal_checkpoint"

class World:
    """A real node (`name`) with the node agent in device-plugin mode, the extender and the real scheduler; the
    module's pods in namespace `ns`."""

    def __init__(self, cluster: RealCluster, node: RealNode, agent: NodeAgent, ext: Extender, sched: Any,
                 name: str = "kubelet-dp", ns: str = "realnode-dp") -> None:
        self.cluster, self.node, self.agent, self.ext, self.sched = cluster, node, agent, ext, sched
        self.name, self.ns = name, ns

    def alive(self) -> None:
        self.node.check_alive()
        self.sched.check_alive()
        self.agent.check_alive()

    def allocatable(self) -> int:
        status = self.cluster.ok("GET", f"/api/v1/nodes/{self.name}")["status"]
        return int(status.get("allocatable", {}).get(RESOURCE, "0"))

    def create(self, name: str, units: int) -> dict[str, Any]:
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
                "spec": {"schedulerName": SCHEDULER_NAME, "hostNetwork": True, "automountServiceAccountToken": False,
                         "nodeSelector": {"kubernetes.io/hostname": NODE},  # not the API-only nodes of other modules
                         "terminationGracePeriodSeconds": 1, "restartPolicy": "Never",
                         "containers": [{"name": "cuda", "image": TEST_IMAGE, "imagePullPolicy": "Never",
                                         "command": ["/bin/sh", "-c", CLIENT_SCRIPT],
                                         "resources": {"limits": {RESOURCE: str(units)}}}]}}
        return dict(self.cluster.ok("POST", f"/api/v1/namespaces/{NS}/pods", body))

    def running(self, name: str) -> dict[str, Any]:
        return self.node.running_client(NS, name, self.alive)


def checkpoint_devices() -> dict[str, set[str]]:
    """The kubelet's device-manager checkpoint: pod UID -> the device IDs of RESOURCE it holds."""
    data = json.loads(CHECKPOINT.read_text())["Data"]
    out: dict[str, set[str]] = {}
    for entry in data.get("PodDeviceEntries") or []:
        if entry["ResourceName"] == RESOURCE:
            ids = out.setdefault(entry["PodUID"], set())
            for numa_ids in entry["DeviceIDs"].values():
                ids.update(numa_ids)
    return out


@contextmanager
def device_plugin_world(cluster: RealCluster, cbin: dict[str, str], tag: str, name: str, ns: str, gpus: str,
                        units: int, agent_args: list[str]) -> Iterator[World]:
    """deploy/ applied, a real node `name` with the agent in device-plugin mode on simulated `gpus`, the extender
    and a real scheduler through it; yielded once the kubelet advertises `units` devices; everything stopped and
    the namespace's pods deleted after. Skips where a real node cannot run here."""
    import kube_node

    why = kube_node.why_unavailable()
    if why:
        pytest.skip(why)
    objs = render("base")
    cluster.apply(sorted(objs, key=lambda o: o["kind"] != "Namespace"))
    cluster.ensure_namespace(ns)
    root = Path(tempfile.mkdtemp(prefix=f"ms-{tag}-", dir="/tmp"))  # short: Unix socket paths
    archives = node_images(root / "images", cbin)
    node = RealNode(cluster, root / "node", name)
    agent = ext = sched = None
    try:
        node.start(archives)
        kubeconfig = cluster.kubeconfig(f"agent-{name}", node_agent_token(cluster, name))
        agent = NodeAgent(root / "agent", name, kubeconfig, [
            "--simulate", gpus, "--unit-mib", str(UNIT), "--device-plugin-dir", str(DEVICE_PLUGIN_DIR),
            "--pod-resources-socket", str(node.pod_resources), "--reconcile-interval-s", "1", *agent_args])
        api = extender_api(cluster, f"{tag}-extender")
        config = Config(address="127.0.0.1", port=0, watch_timeout=60, max_limit_ratio=deploy_limit_ratio(objs))
        ext = Extender(api, config).start()
        assert ext.wait_synced(30), "extender did not sync"
        sched = cluster.start_scheduler(scheduler_config(cluster, int(ext.url.rsplit(":", 1)[1])),
                                        f"{tag}-memslice-scheduler")
        world = World(cluster, node, agent, ext, sched, name, ns)
        wait_until("the device plugin's devices in the Node's allocatable (kubelet)",
                   lambda: world.allocatable() == units, 120, 0.5, world.alive)
        yield world
    finally:
        status, pods = cluster.request("GET", f"/api/v1/namespaces/{ns}/pods")
        for p in pods.get("items", []) if status == 200 else []:
            cluster.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{p['metadata']['name']}")
        if sched is not None:
            sched.stop()
        if ext is not None:
            ext.stop()
        if agent is not None:
            agent.stop()
        node.stop()
        cluster.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/memslice-node-agent-{name}")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def world(real_cluster: RealCluster, cbin: dict[str, str]) -> Iterator[World]:
    with device_plugin_world(real_cluster, cbin, "rn", NODE, NS, GPUS, GPU_MIB // UNIT, ["--idle-after", "0.3"]) as w:
        yield w


def test_real_kubelet_allocates_and_containerd_runs_the_pod_held_to_its_quota(world: World) -> None:
    """The scheduler (through the extender) places the pod, the kubelet allocates its devices from the
    agent, containerd runs it: inside, the shim (loaded by the mounted, read-only /etc/ld.so.preload) holds a
    CUDA program to the pod's 1 GiB; the limits file is read-only; the GPU the container is given is the one
    the extender reserved; the kubelet's checkpoint and the agent's ledger agree on the size."""
    world.create("p1", QUOTA_MIB // UNIT)
    p = world.running("p1")
    assert p["spec"]["nodeName"] == NODE
    out = world.node.pod_log(p, "cuda")
    uuid = p["metadata"]["annotations"]["memslice.io/gpu-uuid"]
    assert f"preload={CONTAINER_SHIM}" in out, out
    assert f"limit-env={QUOTA_MIB} visible={uuid}" in out, out
    assert "preload-read-only" in out and "limits-read-only" in out, out
    # held to the quota: 400 MiB fit beside the context, 200 more do not, 100 more do; the device total is the
    # quota, and 4 MiB of it are left
    assert re.search(r"alloc 400 MiB -> 0\nalloc 200 MiB -> 2\nalloc 100 MiB -> 0\n",
                     world.node.pod_log(p, "cuda", "stdout")), out  # (the shim's refusal line is on stderr)
    assert "cuMemAlloc_v2 of 200.0 MiB refused" in world.node.pod_log(p, "cuda", "stderr"), out
    assert f"info free={QUOTA_MIB - CONTEXT_MIB - 500} total={QUOTA_MIB} devtotal={QUOTA_MIB}" in out, out
    assert "client-exit=0" in out, out
    # the kubelet asked the agent which devices to take (the extender's reservation decides), then allocated
    log = world.agent.output.text()
    assert f"GetPreferredAllocation: {QUOTA_MIB // UNIT} units -> GPU 0 (reserved by the extender for {NS}/p1 " \
           "container cuda)" in log, log
    assert re.search(rf"Allocate: {QUOTA_MIB} MiB of GPU 0 \({uuid}\) for {NS}/p1/cuda, region ", log), log
    held = checkpoint_devices()
    assert len(held[p["metadata"]["uid"]]) == QUOTA_MIB // UNIT
    assert world.agent.gauge("memslice_gpu_allocated_mib")[uuid] == QUOTA_MIB


def test_kubelet_restart_reregisters_and_hands_out_nothing_twice(world: World) -> None:
    """The kubelet restarts under a running pod: the agent registers again with the new kubelet, the Node's
    allocatable comes back, the running container is not restarted, and a new pod gets devices no other pod
    holds (the kubelet's checkpoint) while the agent's ledger counts both pods once."""
    p1 = pod(world.cluster, NS, "p1")
    assert p1 is not None
    before = world.agent.count(f"registered {RESOURCE} with the kubelet")
    world.node.restart_kubelet()
    world.agent.output.wait_for(lambda out: out.count(f"registered {RESOURCE} with the kubelet") > before, 120,
                                "the agent's registration with the restarted kubelet")
    wait_until("allocatable back after the kubelet restart", lambda: world.allocatable() == GPU_MIB // UNIT,
               120, 0.5, world.alive)
    world.create("p2", QUOTA_MIB // UNIT)
    p2 = world.running("p2")
    held = checkpoint_devices()
    one, two = held[p1["metadata"]["uid"]], held[p2["metadata"]["uid"]]
    assert len(one) == len(two) == QUOTA_MIB // UNIT and not one & two
    p1_now = pod(world.cluster, NS, "p1")
    assert p1_now is not None
    (status,) = p1_now["status"]["containerStatuses"]
    assert status["restartCount"] == 0 and "running" in status["state"]
    ledger = world.agent.gauge("memslice_gpu_allocated_mib")
    uuids = [p["metadata"]["annotations"]["memslice.io/gpu-uuid"] for p in (p1, p2)]
    want: dict[str, float] = {}
    for u, mib in zip(uuids, (QUOTA_MIB, QUOTA_MIB), strict=True):
        want[u] = want.get(u, 0) + mib
    assert {u: m for u, m in ledger.items() if m} == want
    # and at no moment did the agent drop p1's allocation (a restarted kubelet's first PodResources answers
    # lack the pods it has not admitted again: issue 37)
    assert f"of {NS}/p1/cuda" not in "".join(ln for ln in world.agent.output.text().splitlines(True)
                                           if "removed region" in ln)


def test_agent_restart_recovers_its_ledger(world: World) -> None:
    """The agent's pod is replaced: the new agent registers with the kubelet, recovers both pods'
    allocations (its region directories, checked against the kubelet's PodResources), and a new pod runs."""
    before = world.agent.gauge("memslice_gpu_allocated_mib")
    world.agent.stop()
    world.agent.start()
    world.agent.output.wait_for(lambda out: f"registered {RESOURCE} with the kubelet" in out, 60,
                                "the new agent's registration")
    wait_until("the new agent's ledger", lambda: world.agent.gauge("memslice_gpu_allocated_mib") == before, 60,
               0.5, world.alive)
    world.create("p3", QUOTA_MIB // UNIT)
    p3 = world.running("p3")
    out = world.node.pod_log(p3, "cuda")
    assert "client-exit=0" in out and "alloc 200 MiB -> 2" in out, out  # held to its own quota
    # the GPU is full now: three pods' devices, no device twice (the kubelet's checkpoint), all in the ledger
    held = checkpoint_devices()
    ids = [d for uid in held for d in held[uid]]
    assert len(held) == 3 and len(ids) == len(set(ids)) == GPU_MIB // UNIT
    assert sum(world.agent.gauge("memslice_gpu_allocated_mib").values()) == GPU_MIB


def test_deleted_pod_loses_its_region_and_ledger_entry(world: World) -> None:
    """A deleted pod: the kubelet stops its container, and the agent (PodResources no longer lists it)
    removes its region and its ledger entry; the other pods' stay."""
    p1 = pod(world.cluster, NS, "p1")
    assert p1 is not None
    uuid = p1["metadata"]["annotations"]["memslice.io/gpu-uuid"]
    before = world.agent.gauge("memslice_gpu_allocated_mib")
    world.cluster.ok("DELETE", f"/api/v1/namespaces/{NS}/pods/p1")
    wait_until("p1 gone", lambda: pod(world.cluster, NS, "p1") is None, 120, 0.5, world.alive)
    wait_until("p1's ledger entry gone", lambda: world.agent.gauge("memslice_gpu_allocated_mib")[uuid]
               == before[uuid] - QUOTA_MIB, 60, 0.5, world.alive)
    world.agent.output.wait_for(lambda out: re.search(rf"removed region \S+ of {NS}/p1\b", out), 30,
                                "p1's region removed")


class PodTenant:
    """The elastic tenant (tests/c/elastic.c) as a pod's container: its commands written into a FIFO on the
    host (a hostPath volume), its answers read from the container's log as the kubelet writes it."""

    def __init__(self, world: World, name: str, request_mib: int, limit_mib: int) -> None:
        self.world, self.name, self.seen = world, name, 0
        ctl = world.node.dir / f"ctl-{name}"
        ctl.mkdir()
        os.mkfifo(ctl / "in")
        self.fd = os.open(ctl / "in", os.O_RDWR)  # never blocks, and the tenant never reads an end of file
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": NS,
                             "annotations": {"memslice.io/gpu-mem-limit": str(limit_mib)}},
                "spec": {"schedulerName": SCHEDULER_NAME, "hostNetwork": True, "automountServiceAccountToken": False,
                         "nodeSelector": {"kubernetes.io/hostname": NODE}, "terminationGracePeriodSeconds": 1,
                         "restartPolicy": "Never",
                         "volumes": [{"name": "ctl", "hostPath": {"path": str(ctl), "type": "Directory"}}],
                         "containers": [{"name": "cuda", "image": TEST_IMAGE, "imagePullPolicy": "Never",
                                         "command": ["/bin/sh", "-c", "exec /bin/elastic < /ctl/in"],
                                         "env": [{"name": k, "value": v} for k, v in ELASTIC_ENV.items()],
                                         "volumeMounts": [{"name": "ctl", "mountPath": "/ctl"}],
                                         "resources": {"limits": {RESOURCE: str(request_mib // UNIT)}}}]}}
        world.cluster.ok("POST", f"/api/v1/namespaces/{NS}/pods", body)

        def up() -> dict[str, Any] | None:
            p = pod(world.cluster, NS, name)
            return p if p is not None and "running" in container_state(p, "cuda") else None
        self.pod = wait_until(f"pod {name} running", up, 180, 0.5, world.alive)
        assert self.answer() == "ready"

    def answer(self) -> str:
        """The tenant's next line (the shim's own lines, "memslice: ...", are skipped)."""
        def next_line() -> str | None:
            lines = [ln for ln in self.world.node.pod_log(self.pod, "cuda").splitlines()
                     if not ln.startswith("memslice:")]
            if len(lines) > self.seen:
                self.seen += 1
                return lines[self.seen - 1]
            return None
        return str(wait_until(f"{self.name}'s answer", next_line, 120, 0.1, self.world.alive))

    def cmd(self, line: str) -> str:
        os.write(self.fd, (line + "\n").encode())
        return self.answer()

    def usage(self) -> tuple[int, int]:
        """(device MiB, host MiB) physically held by this container's process (the simulator's ledger in its
        region directory, which the agent named after the pod)."""
        regions = self.world.agent.root / "regions"
        (rid,) = [f.stem for f in regions.glob("*.json")
                  if json.loads(f.read_text()).get("pod") == self.name]
        snap = read_region_file(str(regions / rid / "sim.usage"))
        assert snap is not None
        (proc,) = [p for p in snap.processes if p.alive]
        return proc.device_bytes // MiB, proc.host_bytes // MiB

    def cgroup_mib(self) -> int:
        """The memory its pod's cgroup is charged (cgroup v1, the kubelet's cgroupfs layout; BestEffort pod)."""
        uid = self.pod["metadata"]["uid"]
        path = Path("/sys/fs/cgroup/memory/kubepods/besteffort") / f"pod{uid}" / "memory.usage_in_bytes"
        return int(path.read_text()) // MiB

    def close(self) -> None:
        os.close(self.fd)


MiB = 1 << 20
# the pod spec's env, as in tests/e2e/test_e2e_elastic.py: no context reserve, a long wait for a neighbour's memory,
# and what a context takes on this simulated GPU
ELASTIC_ENV = {"MEMSLICE_CONTEXT_RESERVE": "0", "MEMSLICE_YIELD_WAIT": "60", "MEMSLICE_SIM_CONTEXT_OVERHEAD": "300MiB"}


def test_elastic_memory_moves_between_two_real_containers(world: World) -> None:
    """Item 4: two elastic pods on the node's 3 GiB GPU, each asking 512 MiB with a 2 GiB limit (the extender
    admits both by request). A fills 1.5 GiB and goes idle; B then gets 1.25 GiB in HBM: only what HBM lacked
    moved out of A (to host memory in A's own process, so A's pod cgroup is charged for it, not B's); both read
    every byte back; once B frees, A's memory comes back."""
    for p in world.cluster.ok("GET", f"/api/v1/namespaces/{NS}/pods")["items"]:  # the GPU to these two
        world.cluster.ok("DELETE", f"/api/v1/namespaces/{NS}/pods/{p['metadata']['name']}")
    wait_until("the earlier pods gone", lambda: not world.cluster.ok("GET", f"/api/v1/namespaces/{NS}/pods")["items"],
               120, 0.5, world.alive)
    edir = world.agent.root / "elastic"
    a = PodTenant(world, "ea", 512, 2048)
    b = None
    try:
        assert a.cmd("alloc 1536 64") == "allocated 24"
        wait_until("A idle on the node's board", lambda: [t.state for t in read_boards(edir)] == ["idle"], 60, 0.1,
                   world.alive)
        b = PodTenant(world, "eb", 512, 2048)
        assert b.cmd("alloc 1280 64") == "allocated 20"
        assert b.usage() == (300 + 1280, 0), "B's memory is all in HBM"
        dev, host = a.usage()
        needed = (300 + 1536) + (300 + 1280) - GPU_MIB  # 344 MiB
        assert dev + host == 300 + 1536 and needed <= host <= 1.25 * needed, (dev, host, needed)
        # A's data, wherever it is, is A's process's memory: its pod's cgroup is charged for it, B's is not
        assert a.cgroup_mib() >= 1536 and 1280 <= b.cgroup_mib() < 1280 + host
        assert b.cmd("check") == f"check ok {1280 * MiB}"
        assert a.cmd("check") == f"check ok {1536 * MiB}"
        assert b.cmd("free") == "freed 0"
        assert a.cmd("busy 1") == "busy"
        wait_until("A's memory back in HBM", lambda: a.usage() == (300 + 1536, 0), 60, 0.2, world.alive)
        rounds, errors = map(int, a.cmd("stop").split()[1:])
        assert rounds > 0 and errors == 0
        assert a.cmd("check") == f"check ok {1536 * MiB}"
    finally:
        a.close()
        if b is not None:
            b.close()

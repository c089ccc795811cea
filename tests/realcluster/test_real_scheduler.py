"""Device-plugin mode with the real kube-scheduler (issue 28, scenario 2).

kube-scheduler runs deploy/'s configuration (the memslice-scheduler profile, leader election in
memslice-system, the extender in plain HTTP on loopback as deploy/base runs it in the scheduler's pods) with
the memslice-scheduler ServiceAccount's token; the extender runs with the same (one pod, one account). Nodes are
API objects registered as kubelets register them (their own identities), each with 8 GPUs of one of four
sizes in the memslice.io/gpus annotation the node agent writes and the device plugin's count as capacity.
Hundreds of pods of mixed sizes: every bound pod is on a GPU of its node with room, no GPU over-committed,
every binding made by the extender (bind verb; the API server's audit log says which program, by user
agent), a pod that fits
nowhere gets a FailedScheduling event with one line per cause, and preemption by PriorityClass goes through
the preempt verb. Scenario 5: the extender, and a real node agent beside a kubelet stand-in, are replaced
mid-run. Scenario 4: deploy/examples' JupyterHub profiles, the elastic one included, as KubeSpawner makes
their pods.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
import shutil
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml
from kube_real import RealCluster, kubelet_token, wait_until
from prometheus_client import generate_latest
from test_deploy_render import (
    DEPLOY,
    NAMESPACE,
    RESOURCE,
    SCHEDULER_NAME,
    extender_container,
    find,
    render,
)
from test_e2e_cluster import UNIT, GpuNode
from test_real_deploy import node_agent_token

from memslice.kube.config import load_api_client
from memslice.paths import lib_paths
from memslice.scheduler_extender.app import Config, Extender
from memslice.scheduler_extender.cli import limit_ratio

# one real control plane (the session fixture real_cluster) serves the three test_real_* modules: one xdist worker
pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("kube")]
NS = "real-sched"
GIB = 1024
SIZES_GIB = (16, 24, 40, 80)  # node i has 8 GPUs of SIZES_GIB[i % 4]
NODES = [f"gpu-{i:02d}" for i in range(20)]
PREEMPT_NODE = "gpu-20"
RESTART_NODES = [f"gpu-{i}" for i in range(21, 24)]  # 3 × 8 × 24 GiB: 144 pods of 4 GiB
JHUB_NODE = "gpu-27"  # 8 × 16 GiB for the JupyterHub profiles' notebooks
AGENT_NODE = "gpu-28"  # a real node agent (simulated GPUs, 4 MiB units) that is replaced mid-run
AGENT_GPUS = "24GiB,16GiB"  # room for 20 pods of 2 GiB
ONE_GPU_NODE = "gpu-29"  # 2 × 16 GiB: preemption must free one GPU by evicting both its pods
AGENT_NS = "real-sched-agent"  # its pods, apart from NS's (check_no_overcommit knows NS's GPUs only)
FRAG_NODES = {"gpu-24": 10, "gpu-25": 11, "gpu-26": 12}  # 8 × 16 GiB; one pod of this many GiB per GPU
PODS = 520
SCHEDULER_USER = f"system:serviceaccount:{NAMESPACE}:memslice-scheduler"
EXTENDER_USER = SCHEDULER_USER  # deploy/base: the extender is a container of the scheduler's pods (one account)
KUBE_SCHEDULER_AGENT = "kube-scheduler/"  # kube-scheduler's user agent starts so; the extender's is the Python client's


def gpus_annotation(node: str, gib: int) -> str:
    return json.dumps([{"uuid": f"GPU-{node}-{i}", "index": i, "model": f"Sim-{gib}G", "memMiB": gib * GIB,
                        "numa": 0, "healthy": True} for i in range(8)])


def add_gpu_node(cluster: RealCluster, name: str, gib: int, pool: str) -> None:
    """A node as its kubelet registers it, its GPUs as its node agent publishes them (unit 1 MiB)."""
    cluster.register_node(name, labels={"memslice-test/pool": pool}, capacity={RESOURCE: str(8 * gib * GIB)})
    cluster.ok("PATCH", f"/api/v1/nodes/{name}", {"metadata": {"annotations": {
        "memslice.io/gpus": gpus_annotation(name, gib), "memslice.io/unit-mib": "1"}}}, content_type=
        "application/merge-patch+json")


def pod_body(name: str, mib: int, pool: str, priority: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulerName": SCHEDULER_NAME, "nodeSelector": {"memslice-test/pool": pool},
                            "containers": [{"name": "main", "image": "cuda",
                                            "resources": {"limits": {RESOURCE: str(mib)}}}]}
    if priority:
        spec["priorityClassName"] = priority
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS}, "spec": spec}


def deploy_limit_ratio(objs: list[dict[str, Any]]) -> Fraction:
    """The extender's --max-limit-ratio as deploy/ runs it."""
    _, _, c = extender_container(objs)
    (arg,) = [a for a in c.get("args", []) if a.startswith("--max-limit-ratio=")]
    return limit_ratio(arg.split("=", 1)[1])


def extender_api(cluster: RealCluster, name: str, pool_maxsize: int = 16) -> Any:
    """An API client with the token of the account deploy/base runs the extender under: the scheduler's."""
    api, _ = load_api_client(str(cluster.kubeconfig(name, cluster.token(NAMESPACE, "memslice-scheduler"))),
                             pool_maxsize=pool_maxsize)
    return api


def scheduler_config(cluster: RealCluster, ext_port: int) -> dict[str, Any]:
    """deploy/'s KubeSchedulerConfiguration, with what a pod's environment gives it changed: the API
    server's address (kubeconfig) and the extender's port (deploy/base: 127.0.0.1:8888 in the scheduler's own
    pod; here the extender the test started on loopback, in plain HTTP as there)."""
    cm = find(render("base"), "ConfigMap", next(o["metadata"]["name"] for o in render("base")
                                                 if o["metadata"]["name"].startswith("memslice-scheduler-config")))
    config = yaml.safe_load(cm["data"]["scheduler-config.yaml"])
    token = cluster.token(NAMESPACE, "memslice-scheduler")
    config["clientConnection"] = {"kubeconfig": str(cluster.kubeconfig("memslice-scheduler", token))}
    (ext,) = config["extenders"]
    assert ext["urlPrefix"] == "http://127.0.0.1:8888" and ext["enableHTTPS"] is False, ext
    ext["urlPrefix"] = f"http://127.0.0.1:{ext_port}"
    return config


class World:
    def __init__(self, cluster: RealCluster, ext: Extender, ext_config: Config, api: Any) -> None:
        self.cluster, self.ext, self.ext_config, self.api = cluster, ext, ext_config, api

    def restart_extender(self) -> None:
        """The extender's pod is replaced: a new process (here: a new Extender) on the same address, its
        state rebuilt from the API server alone."""
        port = int(self.ext.url.rsplit(":", 1)[1])
        self.ext.stop()
        self.ext = Extender(self.api, dataclasses.replace(self.ext_config, port=port)).start()
        assert self.ext.wait_synced(30), "restarted extender did not sync"

    def pods(self, ns: str = NS) -> list[dict[str, Any]]:
        return list(self.cluster.ok("GET", f"/api/v1/namespaces/{ns}/pods?limit=5000")["items"])

    def verb_calls(self, verb: str) -> float:
        text = generate_latest(self.ext.metrics.registry).decode()
        return sum(float(m.group(1)) for m in re.finditer(
            rf'memslice_extender_requests_total{{code="200",verb="{verb}"}} (\S+)', text))

    def create(self, bodies: list[dict[str, Any]], ns: str = NS) -> None:
        for b in bodies:
            b["metadata"]["namespace"] = ns
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda b: self.cluster.ok("POST", f"/api/v1/namespaces/{ns}/pods", b), bodies))


@pytest.fixture(scope="module")
def world(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    cluster = real_cluster
    objs = render("base")
    cluster.apply(sorted(objs, key=lambda o: o["kind"] != "Namespace"))
    cluster.ensure_namespace(NS)
    for i, name in enumerate(NODES):
        add_gpu_node(cluster, name, SIZES_GIB[i % 4], "main")
    add_gpu_node(cluster, PREEMPT_NODE, 16, "preempt")
    for name in RESTART_NODES:
        add_gpu_node(cluster, name, 24, "restart")
    for name in FRAG_NODES:
        add_gpu_node(cluster, name, 16, "frag")
    add_gpu_node(cluster, JHUB_NODE, 16, "jhub")
    api = extender_api(cluster, "sched-extender")
    config = Config(address="127.0.0.1", port=0, watch_timeout=60, max_limit_ratio=deploy_limit_ratio(objs))
    world = World(cluster, Extender(api, config).start(), config, api)
    sched = None
    try:
        ext = world.ext
        assert ext.wait_synced(30), "extender did not sync"
        assert ext.state.wait_for(lambda s: all(s.view(n) is not None for n in [*NODES, PREEMPT_NODE]), 30)
        port = int(ext.url.rsplit(":", 1)[1])
        sched = cluster.start_scheduler(scheduler_config(cluster, port), "memslice-scheduler")
        world.sched = sched  # type: ignore[attr-defined]
        yield world
    finally:
        if sched is not None:
            sched.stop()  # this module's scheduler only: the session's API server goes on
        world.ext.stop()


def settled(world: World, names: set[str], ns: str = NS) -> dict[str, dict[str, Any]] | None:
    """The pods by name once each is bound or marked unschedulable by the scheduler; None before."""
    pods = {p["metadata"]["name"]: p for p in world.pods(ns) if p["metadata"]["name"] in names}
    for p in pods.values():
        if p["spec"].get("nodeName"):
            continue
        conds = {c["type"]: c for c in p.get("status", {}).get("conditions", [])}
        if conds.get("PodScheduled", {}).get("reason") != "Unschedulable":
            return None
    return pods if len(pods) == len(names) else None


def check_no_overcommit(world: World, pods: list[dict[str, Any]]) -> dict[str, int]:
    """Every bound pod is on a GPU of its node that holds it; no GPU holds more than it has."""
    size = {f"GPU-{n}-{g}": SIZES_GIB[i % 4] * GIB for i, n in enumerate(NODES) for g in range(8)}
    size.update({f"GPU-{PREEMPT_NODE}-{g}": 16 * GIB for g in range(8)})
    size.update({f"GPU-{n}-{g}": 24 * GIB for n in RESTART_NODES for g in range(8)})
    size.update({f"GPU-{n}-{g}": 16 * GIB for n in [*FRAG_NODES, JHUB_NODE] for g in range(8)})
    size.update({f"GPU-{ONE_GPU_NODE}-{g}": 16 * GIB for g in range(2)})
    used: dict[str, int] = {}
    for p in pods:
        if not p["spec"].get("nodeName") or p["metadata"].get("deletionTimestamp"):
            continue
        ann = p["metadata"].get("annotations", {})
        uuid = ann.get("memslice.io/gpu-uuid")
        assert uuid, f"{p['metadata']['name']} was bound without the extender's reservation"
        assert uuid.startswith(f"GPU-{p['spec']['nodeName']}-"), (p["metadata"]["name"], uuid)
        used[uuid] = used.get(uuid, 0) + sum(json.loads(ann["memslice.io/gpu-mem-mib"]).values())
    over = {u: (m, size[u]) for u, m in used.items() if m > size[u]}
    assert not over, f"over-committed GPUs: {over}"
    return used


def test_hundreds_of_pods_through_the_real_scheduler(world: World) -> None:
    rng = random.Random(28)
    # ~93 % of the pool's GPU memory asked for: the last pods find no GPU with room
    sizes = [rng.choice((1, 2, 3, 4, 6, 8, 10, 12, 16, 20, 24, 32)) * GIB for _ in range(PODS)]
    names = {f"p{i:03d}" for i in range(PODS)}
    start = time.monotonic()
    world.create([pod_body(f"p{i:03d}", mib, "main") for i, mib in enumerate(sizes)])
    pods = wait_until("every pod bound or unschedulable", lambda: settled(world, names), 240, 1.0,
                      world.sched.check_alive)  # type: ignore[attr-defined]
    elapsed = time.monotonic() - start
    bound = [p for p in pods.values() if p["spec"].get("nodeName")]
    used = check_no_overcommit(world, list(pods.values()))
    total = sum(SIZES_GIB[i % 4] * GIB * 8 for i in range(len(NODES)))
    fill = sum(used.values()) / total
    print(f"\n{len(bound)}/{PODS} pods bound in {elapsed:.1f} s; GPU memory {fill:.0%} reserved")
    why = {c.get("message") for p in pods.values() for c in p.get("status", {}).get("conditions", [])
           if c["type"] == "PodScheduled" and c["status"] == "False"}
    assert len(bound) > PODS * 0.8 and fill > 0.85, (len(bound), fill, sorted(why)[:3])
    # brute force on the final state: no pod left pending would fit on any GPU of the pool (issue 39)
    size = {f"GPU-{n}-{g}": SIZES_GIB[i % 4] * GIB for i, n in enumerate(NODES) for g in range(8)}
    most_free = max(size[u] - used.get(u, 0) for u in size)
    pending = [p for p in pods.values() if not p["spec"].get("nodeName")]
    fit = [p["metadata"]["name"] for p in pending
           if int(p["spec"]["containers"][0]["resources"]["limits"][RESOURCE]) <= most_free]
    assert not fit, f"pending pods that fit a GPU with {most_free} MiB free: {fit}"
    # every binding is the extender's: the scheduler delegated them all (bindVerb); one account, two programs
    binders = {e.get("userAgent", "").startswith(KUBE_SCHEDULER_AGENT) for e in world.cluster.audit(SCHEDULER_USER)
               if e.get("objectRef", {}).get("subresource") == "binding" and e["verb"] == "create"}
    assert binders == {False}
    assert world.verb_calls("bind") >= len(bound)


def test_failed_scheduling_event_has_one_line_per_cause(world: World) -> None:
    """Three nodes whose GPUs each have 6, 5 and 4 GiB free (48, 40 and 32 GiB per node): a pod of 7 GiB
    passes kube-scheduler's own fit on all three and no GPU takes it. The event counts the three nodes under
    one text (it named each node's own most-free GPU before: three lines)."""
    bodies = []
    for node, gib in FRAG_NODES.items():
        for g in range(8):
            body = pod_body(f"f-{node}-{g}", gib * GIB, "frag")
            body["spec"]["nodeSelector"]["kubernetes.io/hostname"] = node
            bodies.append(body)
    world.create(bodies)
    names = {b["metadata"]["name"] for b in bodies}
    pods = wait_until("the frag pool's pods bound", lambda: settled(world, names), 120, 0.5)
    assert all(p["spec"].get("nodeName") for p in pods.values())
    world.create([pod_body("probe", 7 * GIB, "frag")])
    msg = failed_scheduling_event(world, "probe")
    assert "3 pod needs 7168 MiB on one GPU; no GPU of the node has that much free now" in msg, msg


def failed_scheduling_event(world: World, name: str) -> str:
    """The pod's FailedScheduling message, checked for the shape a person reads: a count per cause."""

    def event() -> str | None:
        evs = world.cluster.ok("GET", f"/api/v1/namespaces/{NS}/events?fieldSelector=involvedObject.name={name},"
                                      f"reason=FailedScheduling")["items"]
        return evs[-1]["message"] if evs else None

    msg = wait_until(f"FailedScheduling event of {name}", event, 30, 0.5)
    head = msg.split(" preemption:")[0]
    m = re.fullmatch(r"0/(\d+) nodes are available: (.*)\.", head)
    assert m, msg
    groups = re.findall(r"(?:^|, )(\d+) ", m.group(2))
    # the pool's nodes refuse for a few causes (full at node level, GPU too small, no GPU with room now); the
    # others for not matching the pod's selector: a handful of groups in all, not one per node
    assert 1 <= len(groups) <= 5, msg
    assert sum(int(g) for g in groups) == int(m.group(1)), msg
    assert len(msg) < 800, msg
    return str(msg)


def force_delete_terminating(cluster: RealCluster, node: str) -> int:
    """The kubelet's part of a pod deletion (no containers to stop here): pods on `node` marked for
    deletion are removed by the node's own identity."""
    n = 0
    for p in cluster.ok("GET", f"/api/v1/namespaces/{NS}/pods?fieldSelector=spec.nodeName={node}")["items"]:
        if p["metadata"].get("deletionTimestamp"):
            cluster.request("DELETE", f"/api/v1/namespaces/{NS}/pods/{p['metadata']['name']}",
                            {"gracePeriodSeconds": 0, "preconditions": {"uid": p["metadata"]["uid"]}},
                            kubelet_token(node))
            n += 1
    return n


def test_preemption_by_priorityclass_goes_through_the_preempt_verb(world: World) -> None:
    cluster = world.cluster
    cluster.apply([{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                    "metadata": {"name": "real-high"}, "value": 1000, "description": "test"}])
    low = {f"low{g}" for g in range(8)}
    world.create([pod_body(n, 16 * GIB, "preempt") for n in sorted(low)])
    pods = wait_until("8 whole-GPU pods bound", lambda: settled(world, low), 120, 0.5)
    assert all(p["spec"].get("nodeName") == PREEMPT_NODE for p in pods.values())
    before = world.verb_calls("preempt")
    world.create([pod_body("urgent", 16 * GIB, "preempt", "real-high")])

    def urgent_bound() -> bool:
        force_delete_terminating(cluster, PREEMPT_NODE)
        pod = cluster.ok("GET", f"/api/v1/namespaces/{NS}/pods/urgent")
        return bool(pod["spec"].get("nodeName"))

    wait_until("the urgent pod bound after preempting one", urgent_bound, 120, 0.5,
               world.sched.check_alive)  # type: ignore[attr-defined]
    assert world.verb_calls("preempt") > before
    left = [p for p in world.pods() if p["metadata"]["name"] in low]
    assert len(left) == 7, [p["metadata"]["name"] for p in left]
    check_no_overcommit(world, world.pods())


def test_preemption_frees_one_gpu_by_evicting_both_of_its_pods(world: World) -> None:
    """Issue 39: 2 × 16 GiB GPUs, each with a low- and a mid-priority 8 GiB pod (the node full for the
    scheduler too). For a 16 GiB high-priority pod the scheduler's node-wide dry run proposes the two
    low-priority pods, one on each GPU (the node was dropped then: Pending for good); the preempt verb answers
    both pods of ONE GPU, the scheduler evicts those, the pod is bound there, the other GPU's pods untouched."""
    cluster = world.cluster
    node = ONE_GPU_NODE
    cluster.register_node(node, labels={"memslice-test/pool": "one-gpu"}, capacity={RESOURCE: str(32 * GIB)})
    gpus = json.loads(gpus_annotation(node, 16))[:2]
    cluster.ok("PATCH", f"/api/v1/nodes/{node}", {"metadata": {"annotations": {
        "memslice.io/gpus": json.dumps(gpus), "memslice.io/unit-mib": "1"}}},
        content_type="application/merge-patch+json")
    assert world.ext.state.wait_for(lambda s: s.view(node) is not None, 30)
    cluster.apply([{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
                    "value": value, "description": "test"}
                   for name, value in (("one-gpu-low", 10), ("one-gpu-mid", 100), ("one-gpu-high", 1000))])
    where = {}
    for name, prio in (("og-a", "low"), ("og-b", "mid"), ("og-c", "low"), ("og-d", "mid")):  # binpack: a, b on 0
        world.create([pod_body(name, 8 * GIB, "one-gpu", f"one-gpu-{prio}")])
        pod = wait_until(f"{name} bound", lambda n=name: settled(world, {n}), 60, 0.2)[name]  # type: ignore[misc]
        assert pod["spec"].get("nodeName") == node, pod.get("status")
        where[name] = pod["metadata"]["annotations"]["memslice.io/gpu-uuid"]
    assert where["og-a"] == where["og-b"] != where["og-c"] == where["og-d"], where
    before = world.verb_calls("preempt")
    world.create([pod_body("og-urgent", 16 * GIB, "one-gpu", "one-gpu-high")])

    def urgent_bound() -> dict[str, Any] | None:
        force_delete_terminating(cluster, node)
        pod = cluster.ok("GET", f"/api/v1/namespaces/{NS}/pods/og-urgent")
        return pod if pod["spec"].get("nodeName") else None

    urgent = wait_until("the 16 GiB pod bound after its GPU was freed", urgent_bound, 120, 0.5,
                        world.sched.check_alive)  # type: ignore[attr-defined]
    assert world.verb_calls("preempt") > before
    left = {p["metadata"]["name"]: p for p in world.pods() if p["metadata"]["name"].startswith("og-")}
    assert set(left) == {"og-c", "og-d", "og-urgent"}, sorted(left)
    assert not any(left[n]["metadata"].get("deletionTimestamp") for n in ("og-c", "og-d"))
    assert urgent["metadata"]["annotations"]["memslice.io/gpu-uuid"] == where["og-a"]
    check_no_overcommit(world, world.pods())


def test_extender_restarts_mid_run_and_nothing_is_handed_out_twice(world: World) -> None:
    """Scenario 5: the extender goes away while pods are being scheduled and comes back with only what the
    API server holds; the scheduler retries (the extender is not ignorable) and every pod lands once."""
    names = {f"r{i:03d}" for i in range(150)}  # 6 more than fit: 144 bound, 6 unschedulable
    world.create([pod_body(n, 4 * GIB, "restart") for n in sorted(names)])
    wait_until("a first part bound", lambda: sum(1 for p in world.pods() if p["metadata"]["name"] in names
                                                 and p["spec"].get("nodeName")) >= 20, 120, 0.2)
    world.restart_extender()
    pods = wait_until("every restart-pool pod bound or unschedulable", lambda: settled(world, names), 240, 1.0,
                      world.sched.check_alive)  # type: ignore[attr-defined]
    bound = [p for p in pods.values() if p["spec"].get("nodeName")]
    assert len(bound) == 144, len(bound)
    used = check_no_overcommit(world, list(pods.values()))
    assert all(used[f"GPU-{n}-{g}"] == 24 * GIB for n in RESTART_NODES for g in range(8)), used


def kubelet_node_status(cluster: RealCluster, node: GpuNode) -> int:
    """The kubelet's node status from its device manager (pkg/kubelet/cm/devicemanager, v1.37 GetCapacity):
    capacity = the devices the plugin listed, allocatable = its healthy ones; when the resource's last plugin
    disconnects (its agent went away), PluginDisconnected marks all its devices unhealthy: allocatable 0,
    capacity kept. Returns the allocatable count published."""
    allocatable = node.kubelet.allocatable(RESOURCE)
    cluster.publish_capacity(node.name, {RESOURCE: str(node.kubelet.capacity(RESOURCE))},
                             {RESOURCE: str(allocatable)})
    return allocatable


def agent_gauge(node: GpuNode, name: str) -> dict[str, float]:
    """GPU UUID -> the running agent process's gauge `name`, from its /metrics."""
    port = node.output.wait_for(lambda out: re.search(r"metrics on http://127\.0\.0\.1:(\d+)/", out), 15,
                                "the agent's metrics address").group(1)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(rf'^{name}{{[^}}]*uuid="([^"]+)"[^}}]*}} (\S+)$',
                                                                text, re.M)}


def admit_in_reservation_order(node: GpuNode, pods: list[dict[str, Any]]) -> dict[str, str]:
    """The kubelet admits each pod (GetPreferredAllocation, Allocate) once the agent has seen its reservation,
    oldest reservation first (the agent hands a size to the oldest unallocated reservation of that size).
    Pod name -> the GPU the Allocate answer gives its container, checked against the reservation."""
    out = {}
    for p in sorted(pods, key=lambda p: (p["metadata"]["annotations"].get("memslice.io/assumed-at", ""),
                                         p["metadata"]["name"])):
        meta, ann = p["metadata"], p["metadata"]["annotations"]
        node.wait_log(f"pod {AGENT_NS}/{meta['name']}: the extender reserved GPU {ann['memslice.io/gpu-uuid']}",
                      f"the agent to see {meta['name']}'s reservation")
        (resp,) = node.kubelet.admit(meta["uid"], AGENT_NS, meta["name"], [("main", 2048 // UNIT)],
                                     RESOURCE).values()
        assert resp.envs["MEMSLICE_GPU_MEM_LIMIT"] == "2048", (meta["name"], dict(resp.envs))
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == ann["memslice.io/gpu-uuid"], (meta["name"], dict(resp.envs))
        out[meta["name"]] = ann["memslice.io/gpu-uuid"]
    return out


def why_unbound(world: World, sched: Any, names: set[str], ns: str) -> str:
    """For a wait that failed: each pod of `names` still unbound with its PodScheduled condition, and what the
    scheduler's log says about those pods (its last attempts and their causes: a pod the extender refused after
    the cluster's last event waits for kube-scheduler's 5-minute flush, one refused by its own plugins for the
    event their queueing hints name)."""
    out = []
    for p in world.pods(ns):
        name = p["metadata"]["name"]
        if name in names and not p["spec"].get("nodeName"):
            cond = next((c for c in p.get("status", {}).get("conditions", []) if c["type"] == "PodScheduled"), {})
            out.append(f"{name}: PodScheduled {cond.get('status')} {cond.get('reason')}: {cond.get('message')}")
    keys = tuple(f'pod="{ns}/{n}"' for n in names)
    lines = sched.log_path.read_text(errors="replace").splitlines()
    log = [ln for ln in lines if any(k in ln for k in keys)]
    head = (f"the scheduler's last {min(len(log), 40)} lines about them:" if log else
            "the scheduler's log names none of them (never attempted); its last 20 lines:")
    return "\n".join([*out, head, *(log[-40:] if log else lines[-20:])])


def wait_bound(world: World, what: str, predicate: Any, names: set[str], ns: str, timeout: float) -> Any:
    """wait_until for pods to bind; a failure says, pod by pod, why they are not (why_unbound)."""
    sched = world.sched  # type: ignore[attr-defined]
    try:
        return wait_until(what, predicate, timeout, 0.3, sched.check_alive)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{why_unbound(world, sched, names, ns)}") from None


def per_gpu(placed: dict[str, str], mib: int = 2048) -> dict[str, int]:
    out: dict[str, int] = {}
    for uuid in placed.values():
        out[uuid] = out.get(uuid, 0) + mib
    return out


def test_node_agent_restarts_mid_run_and_nothing_is_handed_out_twice(world: World) -> None:
    """Scenario 5, device-plugin mode: the real node agent of a node (simulated 24 and 16 GiB GPUs, beside
    the kubelet stand-in) is replaced while pods are being scheduled there. While it is away the kubelet
    marks its devices unhealthy (allocatable 0) and the real scheduler holds the pods that arrive; the new
    agent registers again, its inventory annotation is the same GPUs, capacity comes back, the scheduler
    retries and the pods bind. The new agent knows every reservation made before it started and every
    allocation the kubelet made from its predecessor; no GPU holds more than it has, in the extender's
    reservations or in the agent's allocations."""
    cluster = world.cluster
    lib_paths()
    cluster.ensure_namespace(AGENT_NS)
    cluster.register_node(AGENT_NODE, labels={"memslice-test/pool": "agent"})
    root = Path(tempfile.mkdtemp(prefix="ms-rs-", dir="/tmp"))  # short: Unix socket paths
    kubeconfig = cluster.kubeconfig(f"agent-{AGENT_NODE}", node_agent_token(cluster, AGENT_NODE))
    node = GpuNode(root, AGENT_NODE, AGENT_GPUS, str(kubeconfig))
    try:
        start = time.monotonic()
        node.kubelet.wait_registered(RESOURCE, timeout=30)
        assert kubelet_node_status(cluster, node) == (24 + 16) * GIB // UNIT

        def inventory() -> str | None:
            ann = cluster.ok("GET", f"/api/v1/nodes/{AGENT_NODE}")["metadata"].get("annotations", {})
            return str(ann["memslice.io/gpus"]) if "memslice.io/gpus" in ann else None

        def agent_alive() -> None:
            node.alive()

        before = wait_until("the agent's memslice.io/gpus on its node", inventory, 60, 0.3, agent_alive)
        size = {g["uuid"]: g["memMiB"] for g in json.loads(before)}
        assert sorted(size.values()) == [16 * GIB, 24 * GIB]
        assert world.ext.state.wait_for(lambda s: (v := s.view(AGENT_NODE)) is not None and len(v.gpus) == 2, 30)

        def body(name: str) -> dict[str, Any]:
            return pod_body(name, 2048 // UNIT, "agent")  # 2 GiB in the node's units

        first = {f"a{i:02d}" for i in range(10)}
        world.create([body(n) for n in sorted(first)], AGENT_NS)

        def first_bound() -> dict[str, dict[str, Any]] | None:
            ps = settled(world, first, AGENT_NS)
            return ps if ps and all(p["spec"].get("nodeName") for p in ps.values()) else None

        pods = wait_bound(world, "the first pods bound", first_bound, first, AGENT_NS, 120)
        admitted = admit_in_reservation_order(node, list(pods.values()))

        # the agent's pod is replaced; pods keep arriving while it is away
        registrations = node.kubelet.registrations
        node.stop_agent()
        assert node.kubelet.wait_for(lambda: node.kubelet.allocatable(RESOURCE) == 0, 10)
        assert kubelet_node_status(cluster, node) == 0
        rest = {f"b{i:02d}" for i in range(18)}  # 10 of them fit: 8 find no room
        world.create([body(n) for n in sorted(rest)], AGENT_NS)
        node.start_agent()
        node.kubelet.wait_registered(RESOURCE, after=registrations, timeout=30)
        assert kubelet_node_status(cluster, node) == (24 + 16) * GIB // UNIT

        names = first | rest

        def bound_count() -> int:
            return sum(1 for p in world.pods(AGENT_NS) if p["spec"].get("nodeName"))

        wait_bound(world, "20 pods bound (the GPUs full)", lambda: bound_count() >= 20, names, AGENT_NS, 90)
        pods = wait_until("the others unschedulable", lambda: settled(world, names, AGENT_NS), 30, 0.5)
        elapsed = time.monotonic() - start
        bound = [p for p in pods.values() if p["spec"].get("nodeName")]
        assert len(bound) == 20 and all(p["spec"]["nodeName"] == AGENT_NODE for p in bound)
        placed = {p["metadata"]["name"]: p["metadata"]["annotations"]["memslice.io/gpu-uuid"] for p in bound}
        assert set(placed.values()) <= set(size)
        assert per_gpu(placed) == size  # both GPUs full, none over

        # the new agent: the same GPUs published (by it), the node's capacity back, every earlier reservation
        # and every allocation the kubelet made from its predecessor known
        node.wait_log(f"published node inventory on {AGENT_NODE}", "the new agent publishing the inventory")
        assert inventory() == before
        status = cluster.ok("GET", f"/api/v1/nodes/{AGENT_NODE}")["status"]
        assert status["capacity"][RESOURCE] == status["allocatable"][RESOURCE] == str(40 * GIB // UNIT)
        for name, uuid in admitted.items():
            node.wait_log(f"pod {AGENT_NS}/{name}: the extender reserved GPU {uuid}", f"{name}'s reservation")
        # its ledger, restored before it serves (region directories, checked against the kubelet's record)
        assert {u: m for u, m in agent_gauge(node, "memslice_gpu_allocated_mib").items() if m} == per_gpu(admitted)

        # the kubelet admits the pods bound since: each gets the GPU the extender reserved for it
        admitted.update(admit_in_reservation_order(node, [p for p in bound if p["metadata"]["name"] not in admitted]))
        assert admitted == placed
        assert agent_gauge(node, "memslice_gpu_allocated_mib") == {u: float(m) for u, m in size.items()}
        print(f"\nnode agent restart: 20/{len(names)} pods bound and admitted in {elapsed:.1f} s")
    finally:
        node.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_jupyterhub_profiles_give_pods_the_real_scheduler_places_through_memslice(world: World) -> None:
    """Scenario 4: each profile of deploy/examples/jupyterhub-values.yaml, turned into a pod by KubeSpawner's
    own make_pod (the traits as KubeSpawner parses them), is placed by the real kube-scheduler through the
    extender on one GPU with the profile's slice. The elastic profile's notebook is placed by its request: the
    extender reserves 2 GiB on one GPU (not its 8 GiB limit), counts the limit apart (deploy/'s
    --max-limit-ratio cap) and records it on the pod for the node agent."""
    import asyncio

    from jupyterhub.traitlets import ByteSpecification
    from kubernetes_asyncio.client import ApiClient
    from kubespawner.objects import make_pod

    from memslice.contract import ANN_IDLE_RELEASE
    from memslice.elastic import ANN_LIMIT, ANN_LIMIT_RECORD

    async def serialized(pod: Any) -> dict[str, Any]:  # as KubeSpawner sends it (its asyncio client)
        async with ApiClient() as client:
            return dict(client.sanitize_for_serialization(pod))

    values = yaml.safe_load((DEPLOY / "examples" / "jupyterhub-values.yaml").read_text())
    wanted: dict[str, tuple[int, int | None]] = {}  # notebook pod -> (request MiB, elastic limit MiB)
    for profile in values["singleuser"]["profileList"]:
        o = dict(profile["kubespawner_override"])
        for trait in ("mem_limit", "mem_guarantee"):
            if trait in o:
                o[trait] = ByteSpecification().validate(None, o[trait])
        # KubeSpawner.get_pod_manifest hands its extra_annotations trait to make_pod as `annotations`
        o["annotations"] = o.pop("extra_annotations", {})
        name = f"jupyter-{profile['slug']}"
        pod = make_pod(name=name, cmd=["jupyterhub-singleuser"], port=8888, node_selector={
            "memslice-test/pool": "jhub"}, **o)
        body = asyncio.run(serialized(pod))
        assert body["spec"]["schedulerName"] == SCHEDULER_NAME
        body["metadata"]["namespace"] = NS
        world.cluster.ok("POST", f"/api/v1/namespaces/{NS}/pods", body)
        limit = o["annotations"].get(ANN_LIMIT)
        wanted[name] = (int(o["extra_resource_limits"][RESOURCE]), int(limit) if limit else None)
    assert sorted(wanted.values(), key=lambda v: v[0]) == [(2048, 8192), (4096, None), (8192, None), (16384, None)]
    pods = wait_until("the notebooks bound", lambda: settled(world, set(wanted)), 60, 0.5,
                      world.sched.check_alive)  # type: ignore[attr-defined]
    for name, (mib, limit) in wanted.items():
        pod = pods[name]
        assert pod["spec"].get("nodeName") == JHUB_NODE, pod.get("status")
        ann = pod["metadata"]["annotations"]
        assert json.loads(ann["memslice.io/gpu-mem-mib"]) == {"notebook": mib}  # the request, not the limit
        if limit is None:
            assert ANN_LIMIT_RECORD not in ann, ann
        else:  # the extender's record of the limit, which the node agent's Allocate reads
            assert json.loads(ann[ANN_LIMIT_RECORD]) == {"notebook": limit}
            assert ann[ANN_LIMIT] == str(limit) and ann[ANN_IDLE_RELEASE] == "true"  # the user's, as written
    used = check_no_overcommit(world, list(pods.values()))
    (elastic,) = [pods[n] for n, (_, limit) in wanted.items() if limit]
    gpu = elastic["metadata"]["annotations"]["memslice.io/gpu-uuid"]

    def charged() -> bool:  # the extender's own books: requests on each GPU, the limit's excess apart
        view = world.ext.state.view(JHUB_NODE)
        assert view is not None
        over = dict(zip((g.uuid for g in view.gpus), view.over or (), strict=False))
        return ({g.uuid: g.used_mib for g in view.gpus if g.used_mib} == used
                and {u: o for u, o in over.items() if o} == {gpu: 8192 - 2048})

    assert world.ext.state.wait_for(lambda _: charged(), 30), (world.ext.state.view(JHUB_NODE), used)


COMPUTE_NS = "real-sched-compute"  # its pods apart from NS's (check_no_overcommit knows NS's GPUs only)
COMPUTE_NODE = "gpu-30"  # GPU 0: 16 GiB, GPU 1: 32 GiB


def compute_pod(name: str, mib: int, pct: int) -> dict[str, Any]:
    body = pod_body(name, mib, "compute")
    body["spec"]["containers"][0]["resources"]["limits"]["memslice.io/gpu-compute"] = str(pct)
    return body


def test_memory_and_compute_fit_on_one_gpu_through_the_real_scheduler(world: World) -> None:
    """Issue 33: the real kube-scheduler (deploy/'s profile, memslice.io/gpu-compute a managed resource) and the
    real extender place a pod only on a GPU with room for its memory and its compute: a GPU with memory free
    but its compute taken is not chosen, and a pod no GPU has both for stays Pending with a FailedScheduling
    event naming the compute, though the node's counts (kube-scheduler's own fit) have room for it."""
    cluster = world.cluster
    cluster.ensure_namespace(COMPUTE_NS)
    cluster.register_node(COMPUTE_NODE, labels={"memslice-test/pool": "compute"},
                          capacity={RESOURCE: str(48 * GIB), "memslice.io/gpu-compute": "200"})
    gpus = [{"uuid": f"GPU-{COMPUTE_NODE}-{i}", "index": i, "model": "Sim", "memMiB": gib * GIB, "numa": 0,
             "healthy": True} for i, gib in enumerate((16, 32))]
    cluster.ok("PATCH", f"/api/v1/nodes/{COMPUTE_NODE}", {"metadata": {"annotations": {
        "memslice.io/gpus": json.dumps(gpus), "memslice.io/unit-mib": "1"}}},
        content_type="application/merge-patch+json")
    assert world.ext.state.wait_for(lambda s: s.view(COMPUTE_NODE) is not None, 30)

    def place(name: str, mib: int, pct: int) -> dict[str, Any]:
        world.create([compute_pod(name, mib, pct)], ns=COMPUTE_NS)
        pods = wait_until(f"{name} bound or unschedulable", lambda: settled(world, {name}, COMPUTE_NS), 60, 0.3,
                          world.sched.check_alive)  # type: ignore[attr-defined]
        return dict(pods[name])

    def gpu(pod: dict[str, Any]) -> str:
        assert pod["spec"].get("nodeName") == COMPUTE_NODE, pod["metadata"]["name"]
        return str(pod["metadata"]["annotations"]["memslice.io/gpu-uuid"])

    hog = place("hog", 4 * GIB, 80)
    assert gpu(hog) == f"GPU-{COMPUTE_NODE}-0"  # binpack: the smaller GPU
    assert json.loads(hog["metadata"]["annotations"]["memslice.io/gpu-compute-pct"]) == {"main": [80, None]}
    # 3 GiB and 30 %: GPU 0 has the memory (binpack on memory alone would take it) but not the compute
    assert gpu(place("p", 3 * GIB, 30)) == f"GPU-{COMPUTE_NODE}-1"
    assert gpu(place("q", 1 * GIB, 10)) == f"GPU-{COMPUTE_NODE}-0"  # bin-packing on both: 80 + 10
    assert gpu(place("r", 1 * GIB, 60)) == f"GPU-{COMPUTE_NODE}-1"  # 90 + 60 does not fit GPU 0; 30 + 60
    # 1 GiB and 20 %: memory on both GPUs, compute on neither (90 % each); the node's 200 counted leave 20
    # (kube-scheduler's own fit lets it through), the extender does not
    stuck = place("s", 1 * GIB, 20)
    assert not stuck["spec"].get("nodeName")

    def event() -> str | None:
        evs = cluster.ok("GET", f"/api/v1/namespaces/{COMPUTE_NS}/events?fieldSelector=involvedObject.name=s,"
                                f"reason=FailedScheduling")["items"]
        return evs[-1]["message"] if evs else None

    msg = wait_until("FailedScheduling event of s", event, 30, 0.5)
    assert "pod needs 20 percent compute (memslice.io/gpu-compute) on the GPU that holds its 1024 MiB" in msg, msg
    # a compute share without memory is refused by name (the extender sees it: a managed resource)
    body = pod_body("nomem", 1, "compute")
    body["spec"]["containers"][0]["resources"]["limits"] = {"memslice.io/gpu-compute": "10"}
    world.create([body], ns=COMPUTE_NS)
    msg = wait_until("FailedScheduling event of nomem", lambda: next(
        (e["message"] for e in cluster.ok("GET", f"/api/v1/namespaces/{COMPUTE_NS}/events?fieldSelector="
                                                 f"involvedObject.name=nomem,reason=FailedScheduling")["items"]),
        None), 30, 0.5)
    assert "asks for memslice.io/gpu-compute without memslice.io/gpu-mem" in msg, msg
    sums: dict[str, int] = {}
    for p in world.pods(COMPUTE_NS):
        ann = p["metadata"].get("annotations") or {}
        if p["spec"].get("nodeName") and "memslice.io/gpu-compute-pct" in ann:
            sums[ann["memslice.io/gpu-uuid"]] = sums.get(ann["memslice.io/gpu-uuid"], 0) + sum(
                r for r, _ in json.loads(ann["memslice.io/gpu-compute-pct"]).values())
    assert sums == {f"GPU-{COMPUTE_NODE}-0": 90, f"GPU-{COMPUTE_NODE}-1": 90}

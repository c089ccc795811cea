"""Pods that span GPUs with the real kube-scheduler (issue 34, item 5): deploy/'s scheduler configuration and
the extender over mutual TLS (as test_real_scheduler.py runs them) place 2- and 4-GPU pods (`memslice.io/gpu-count`)
among one-GPU pods on 8-GPU nodes whose inventories carry their topology (NVLink pairs, two PCIe switches, two
NUMA nodes, as the node agent publishes them): every pod on N distinct GPUs of its node, no GPU over capacity,
each 2-GPU pod on an NVLink pair and each 4-GPU pod under one PCIe switch; and a 2-GPU preemptor gets two whole
GPUs of one node through the preempt verb, its victims only on those two GPUs."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from kube_real import RealCluster, kubelet_token, wait_until
from prometheus_client import generate_latest
from test_deploy_render import RESOURCE, SCHEDULER_NAME, render
from test_real_scheduler import deploy_limit_ratio, extender_api, scheduler_config

from memslice.contract import ANN_GPU_COUNT, Gpu, Inventory, set_distance
from memslice.scheduler_extender.app import Config, Extender

pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("kube")]
NS = "real-span"
GIB = 1024
POOL = [f"gpu-{i}" for i in range(34, 38)]  # 4 nodes × 8 × 24 GiB (kube_real.KUBELET_NODES)
PREEMPT = "gpu-38"  # 4 × 16 GiB, NVLink pairs (0, 1) and (2, 3)


def topology_gpus(node: str, count: int, gib: int) -> list[Gpu]:
    """As the node agent publishes an 8-GPU board: NVLink pairs (0, 1), (2, 3), ...; a PCIe switch per four
    GPUs; a NUMA node per half."""
    return [Gpu(f"GPU-{node}-{i}", i, f"Sim-{gib}G", gib * GIB, i * 2 // count, True, nvlink=(i ^ 1,),
                pcie=f"{node}-sw{i // 4}") for i in range(count)]


def add_node(cluster: RealCluster, name: str, count: int, gib: int, pool: str) -> list[Gpu]:
    gpus = topology_gpus(name, count, gib)
    cluster.register_node(name, labels={"memslice-test/pool": pool}, capacity={RESOURCE: str(count * gib * GIB)})
    cluster.ok("PATCH", f"/api/v1/nodes/{name}", {"metadata": {"annotations": Inventory(1, tuple(gpus)).format()}},
               content_type="application/merge-patch+json")
    return gpus


def pod_body(name: str, mib: int, gpus: int, pool: str, priority: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulerName": SCHEDULER_NAME, "nodeSelector": {"memslice-test/pool": pool},
                            "containers": [{"name": "main", "image": "cuda",
                                            "resources": {"limits": {RESOURCE: str(mib)}}}]}
    if priority:
        spec["priorityClassName"] = priority
    meta: dict[str, Any] = {"name": name, "namespace": NS}
    if gpus > 1:
        meta["annotations"] = {ANN_GPU_COUNT: str(gpus)}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


class World:
    def __init__(self, cluster: RealCluster, ext: Extender, sched: Any, gpus: dict[str, Gpu]) -> None:
        self.cluster, self.ext, self.sched, self.gpus = cluster, ext, sched, gpus

    def pods(self) -> list[dict[str, Any]]:
        return list(self.cluster.ok("GET", f"/api/v1/namespaces/{NS}/pods?limit=5000")["items"])

    def create(self, bodies: list[dict[str, Any]]) -> None:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda b: self.cluster.ok("POST", f"/api/v1/namespaces/{NS}/pods", b), bodies))

    def verb_calls(self, verb: str) -> float:
        text = generate_latest(self.ext.metrics.registry).decode()
        return sum(float(m.group(1)) for m in re.finditer(
            rf'memslice_extender_requests_total{{code="200",verb="{verb}"}} (\S+)', text))

    def settled(self, names: set[str]) -> dict[str, dict[str, Any]] | None:
        """The pods by name once each is bound or marked unschedulable; None before."""
        pods = {p["metadata"]["name"]: p for p in self.pods() if p["metadata"]["name"] in names}
        for p in pods.values():
            conds = {c["type"]: c for c in p.get("status", {}).get("conditions", [])}
            if not p["spec"].get("nodeName") and conds.get("PodScheduled", {}).get("reason") != "Unschedulable":
                return None
        return pods if len(pods) == len(names) else None


@pytest.fixture(scope="module")
def world(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    cluster = real_cluster
    objs = render("base")
    cluster.apply(sorted(objs, key=lambda o: o["kind"] != "Namespace"))
    cluster.ensure_namespace(NS)
    gpus = {}
    for name in POOL:
        gpus.update({g.uuid: g for g in add_node(cluster, name, 8, 24, "span")})
    gpus.update({g.uuid: g for g in add_node(cluster, PREEMPT, 4, 16, "span-preempt")})
    api = extender_api(cluster, "span-extender")
    config = Config(address="127.0.0.1", port=0, watch_timeout=60, max_limit_ratio=deploy_limit_ratio(objs))
    ext = Extender(api, config).start()
    sched = None
    try:
        assert ext.wait_synced(30), "extender did not sync"
        assert ext.state.wait_for(lambda s: all(s.view(n) is not None for n in [*POOL, PREEMPT]), 30)
        sched_config = scheduler_config(cluster, int(ext.url.rsplit(":", 1)[1]))
        sched_config["leaderElection"] = {"leaderElect": False}  # this module's scheduler alone serves the name
        sched = cluster.start_scheduler(sched_config, "memslice-scheduler-span")
        yield World(cluster, ext, sched, gpus)
    finally:
        if sched is not None:
            sched.stop()
        ext.stop()


def placements(world: World, pods: list[dict[str, Any]]) -> dict[str, tuple[Gpu, ...]]:
    """Pod name -> its GPUs, each bound pod checked: as many distinct GPUs of its own node as it asked for,
    and no GPU holding more than it has (each GPU of a pod holds the pod's total / N)."""
    used: dict[str, int] = {}
    out = {}
    for p in pods:
        node = p["spec"].get("nodeName")
        if not node or p["metadata"].get("deletionTimestamp"):
            continue
        ann = p["metadata"].get("annotations", {})
        uuids = ann.get("memslice.io/gpu-uuid", "").split(",")
        want = int(ann.get(ANN_GPU_COUNT, "1"))
        name = p["metadata"]["name"]
        assert len(uuids) == want == len(set(uuids)), (name, uuids)
        assert all(u.startswith(f"GPU-{node}-") for u in uuids), (name, node, uuids)
        total = sum(json.loads(ann["memslice.io/gpu-mem-mib"]).values())
        assert total == int(p["spec"]["containers"][0]["resources"]["limits"][RESOURCE]), name
        for u in uuids:
            used[u] = used.get(u, 0) + total // want
        out[name] = tuple(world.gpus[u] for u in uuids)
    over = {u: (m, world.gpus[u].mem_mib) for u, m in used.items() if m > world.gpus[u].mem_mib}
    assert not over, f"over-committed GPUs: {over}"
    return out


def test_two_and_four_gpu_pods_among_one_gpu_pods(world: World) -> None:
    rng = random.Random(34)
    bodies = []
    for i in range(12):  # 2 GPUs × 4..8 GiB
        bodies.append(pod_body(f"tp2-{i:02d}", 2 * rng.choice((4, 6, 8)) * GIB, 2, "span"))
    for i in range(4):  # 4 GPUs × 2..6 GiB
        bodies.append(pod_body(f"tp4-{i:02d}", 4 * rng.choice((2, 4, 6)) * GIB, 4, "span"))
    for i in range(48):  # one GPU, 1..6 GiB
        bodies.append(pod_body(f"one-{i:02d}", rng.choice((1, 2, 3, 4, 6)) * GIB, 1, "span"))
    rng.shuffle(bodies)
    asked = sum(int(b["spec"]["containers"][0]["resources"]["limits"][RESOURCE]) for b in bodies)
    assert asked < 0.55 * len(POOL) * 8 * 24 * GIB  # room enough that a close set stays free on some node
    world.create(bodies)
    names = {b["metadata"]["name"] for b in bodies}
    pods = wait_until("every pod bound or unschedulable", lambda: world.settled(names), 240, 1.0,
                      world.sched.check_alive)
    unbound = sorted(n for n, p in pods.items() if not p["spec"].get("nodeName"))
    assert not unbound, unbound
    placed = placements(world, list(pods.values()))
    for name, gpus in placed.items():
        if name.startswith("tp2-"):  # an NVLink pair
            assert set_distance(gpus) == 0, (name, [g.uuid for g in gpus])
        elif name.startswith("tp4-"):  # two NVLink pairs under one PCIe switch
            assert set_distance(gpus) == 4 and len({g.pcie for g in gpus}) == 1, (name, [g.uuid for g in gpus])
        assert [g.index for g in gpus] == sorted(g.index for g in gpus)  # device order: by index


def force_delete_terminating(cluster: RealCluster, node: str) -> None:
    """The kubelet's part of a deletion (no containers here): pods on `node` marked for deletion go."""
    for p in cluster.ok("GET", f"/api/v1/namespaces/{NS}/pods?fieldSelector=spec.nodeName={node}")["items"]:
        if p["metadata"].get("deletionTimestamp"):
            cluster.request("DELETE", f"/api/v1/namespaces/{NS}/pods/{p['metadata']['name']}",
                            {"gracePeriodSeconds": 0, "preconditions": {"uid": p["metadata"]["uid"]}},
                            kubelet_token(node))


def test_a_two_gpu_preemptor_frees_two_whole_gpus(world: World) -> None:
    """4 × 16 GiB, each GPU with a low- and a mid-priority 8 GiB pod (binpack fills GPU by GPU). For a 2 × 16 GiB
    high-priority pod the scheduler's node-wide dry run proposes the four low pods, one per GPU (room on the
    node, none on any GPU); the preempt verb answers both pods of two GPUs, the NVLink pair (0, 1): all victims
    of equal rank, the closest set wins. The pods of GPUs 2 and 3 stay."""
    cluster = world.cluster
    cluster.apply([{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
                    "value": value, "description": "test"}
                   for name, value in (("span-low", 10), ("span-mid", 100), ("span-high", 1000))])
    where = {}
    for g in range(4):
        for prio in ("low", "mid"):
            name = f"pre-{g}-{prio}"
            world.create([pod_body(name, 8 * GIB, 1, "span-preempt", f"span-{prio}")])
            pod = wait_until(f"{name} bound", lambda n=name: world.settled({n}), 60, 0.2)[name]  # type: ignore[misc]
            assert pod["spec"].get("nodeName") == PREEMPT, pod.get("status")
            where[name] = pod["metadata"]["annotations"]["memslice.io/gpu-uuid"]
    assert [where[f"pre-{g}-low"] for g in range(4)] == [f"GPU-{PREEMPT}-{g}" for g in range(4)], where
    before = world.verb_calls("preempt")
    world.create([pod_body("urgent", 32 * GIB, 2, "span-preempt", "span-high")])

    def urgent_bound() -> dict[str, Any] | None:
        force_delete_terminating(cluster, PREEMPT)
        pod = cluster.ok("GET", f"/api/v1/namespaces/{NS}/pods/urgent")
        return pod if pod["spec"].get("nodeName") else None

    urgent = wait_until("the 2-GPU pod bound after two GPUs were freed", urgent_bound, 180, 0.5,
                        world.sched.check_alive)
    assert urgent["metadata"]["annotations"]["memslice.io/gpu-uuid"] == f"GPU-{PREEMPT}-0,GPU-{PREEMPT}-1"
    assert world.verb_calls("preempt") > before
    left = {p["metadata"]["name"] for p in world.pods() if p["metadata"]["name"].startswith("pre-")
            and not p["metadata"].get("deletionTimestamp")}
    assert left == {"pre-2-low", "pre-2-mid", "pre-3-low", "pre-3-mid"}, sorted(left)
    placements(world, world.pods())


def test_one_gpu_preemptors_take_the_lower_pairs_first_then_a_two_gpu_victim(world: World) -> None:
    """Issue 39.3 with a victim spanning GPUs (after the test above: the 2-GPU "urgent" (1000) on GPUs 0 and 1,
    a low (10) and a mid (100) 8 GiB pod on each of GPUs 2 and 3). A top-priority 16 GiB pod: both pods of GPU 2 (or
    3) go, highest priority 100, rather than urgent alone (1000): the lowest highest priority first, before the
    fewest victims. The second: the other pair. The third: only urgent is left to evict, and it goes whole (its
    share on both GPUs), the new pod on one of its GPUs."""
    cluster = world.cluster
    cluster.apply([{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "span-top"},
                    "value": 10000, "description": "test"}])

    def live() -> set[str]:
        return {p["metadata"]["name"] for p in world.pods() if p["spec"].get("nodeName") == PREEMPT
                and not p["metadata"].get("deletionTimestamp")}

    assert live() == {"urgent", "pre-2-low", "pre-2-mid", "pre-3-low", "pre-3-mid"}, sorted(live())
    gpu_of = {}
    for k in range(3):
        name = f"top-{k}"
        world.create([pod_body(name, 16 * GIB, 1, "span-preempt", "span-top")])

        def bound(n: str = name) -> dict[str, Any] | None:
            force_delete_terminating(cluster, PREEMPT)
            p = cluster.ok("GET", f"/api/v1/namespaces/{NS}/pods/{n}")
            return p if p["spec"].get("nodeName") else None

        p = wait_until(f"{name} bound after preemption", bound, 180, 0.5, world.sched.check_alive)
        gpu_of[name] = int(p["metadata"]["annotations"]["memslice.io/gpu-uuid"].rsplit("-", 1)[1])
        if k < 2:  # a pair of GPU 2 or 3 went; urgent stays
            assert "urgent" in live() and gpu_of[name] in (2, 3), (name, gpu_of, sorted(live()))
    assert sorted(gpu_of[f"top-{k}"] for k in range(2)) == [2, 3]
    assert gpu_of["top-2"] in (0, 1) and "urgent" not in live(), (gpu_of, sorted(live()))
    assert live() == {"top-0", "top-1", "top-2"}
    placements(world, world.pods())


def failed_scheduling(world: World, name: str) -> str:
    """The pod's latest FailedScheduling event message, once there is one."""
    def event() -> str | None:
        evs = world.cluster.ok("GET", f"/api/v1/namespaces/{NS}/events?fieldSelector=involvedObject.name={name},"
                                      f"reason=FailedScheduling")["items"]
        return evs[-1]["message"] if evs else None

    return str(wait_until(f"FailedScheduling event of {name}", event, 60, 0.5, world.sched.check_alive))


def dry_run(cluster: RealCluster, body: dict[str, Any]) -> tuple[int, str]:
    """Create `body` with dryRun=All (admission runs, nothing is stored): the status and, refused, the message."""
    status, out = cluster.request("POST", f"/api/v1/namespaces/{NS}/pods?dryRun=All", body)
    return status, " ".join(str(out.get("message", "") if isinstance(out, dict) else out).split())


SPLIT = "memslice.io/gpu-mem=4097 cannot be split evenly over memslice.io/gpu-count=2 GPUs; request a multiple of 2 " \
        "(e.g. 4098)"
POLICY_BINDING = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/memslice-gpu-count"


def test_a_total_not_divisible_is_refused_at_admission_and_at_filter_by_name(world: World) -> None:
    """Issue 34: the real API server refuses creating the pod (deploy/core's memslice-gpu-count policy, applied
    with deploy/base) in the extender's own words, and refuses `memslice.io/gpu-count: "2"` on a pod asking no
    memslice.io/gpu-mem (which the extender is never called for). Without the policy (its binding removed), the
    extender refuses the pod at filter: it stays Pending, its FailedScheduling event naming the figure and the fix."""
    cluster = world.cluster
    odd = pod_body("odd", 4097, 2, "span")

    def refused() -> tuple[int, str] | None:
        status, message = dry_run(cluster, odd)
        return None if status == 201 else (status, message)

    status, message = wait_until("the gpu-count policy in force", refused, 60, 0.5)
    assert status == 422 and f"container 'main': {SPLIT}" in message, (status, message)
    no_ask = pod_body("no-ask", 1, 2, "span")
    del no_ask["spec"]["containers"][0]["resources"]
    status, message = dry_run(cluster, no_ask)
    assert status == 422 and "asks no memslice.io/gpu-mem" in message and "count: 2 in the ResourceClaim" in message
    status, message = dry_run(cluster, {**odd, "metadata": {**odd["metadata"], "annotations": {ANN_GPU_COUNT: "0"}}})
    assert status == 422 and "annotation memslice.io/gpu-count='0' is not a whole number of GPUs" in message
    elastic = pod_body("elastic", 4096, 2, "span")
    elastic["metadata"]["annotations"]["memslice.io/gpu-mem-limit"] = "8191"
    status, message = dry_run(cluster, elastic)
    assert status == 422 and "container 'main': memslice.io/gpu-mem-limit (MiB)=8191 cannot be split evenly over " \
                             "memslice.io/gpu-count=2 GPUs; request a multiple of 2 (e.g. 8192)" in message, message
    assert dry_run(cluster, pod_body("even", 4098, 2, "span"))[0] == 201

    [binding] = [o for o in render("base") if o["kind"] == "ValidatingAdmissionPolicyBinding"
                 and o["metadata"]["name"] == "memslice-gpu-count"]
    cluster.ok("DELETE", POLICY_BINDING)
    try:
        wait_until("the gpu-count policy lifted", lambda: dry_run(cluster, odd)[0] == 201, 60, 0.5)
        world.create([odd])
        assert SPLIT in failed_scheduling(world, "odd")
        assert not world.cluster.ok("GET", f"/api/v1/namespaces/{NS}/pods/odd")["spec"].get("nodeName")
    finally:
        cluster.apply([binding])
    wait_until("the gpu-count policy in force again", lambda: dry_run(cluster, odd)[0] == 422, 60, 0.5)


def test_more_gpus_than_any_node_has_is_unschedulable_by_name(world: World) -> None:
    """Issue 34: 9 GPUs asked where every node has 8: Pending, the reason naming the count and the fix (unresolvable:
    the scheduler does not try preemption there)."""
    world.create([pod_body("nine", 9 * GIB, 9, "span")])
    message = failed_scheduling(world, "nine")
    assert "pod needs 9 GPUs (memslice.io/gpu-count); the node has 8 healthy memslice GPUs: ask for at most 8 or " \
        "use a node with 9" in message, message
    assert not world.cluster.ok("GET", f"/api/v1/namespaces/{NS}/pods/nine")["spec"].get("nodeName")

"""Elastic memory end to end (issue 13) on the whole Kubernetes path: the real kube-apiserver (Bindings, the
pod watches, the Events the agent writes, pod priority resolved by admission from a PriorityClass), the real
extender over HTTP, the real node agent on a simulated 4 GiB GPU with the kubelet stand-in, and the containers'
processes under the real shim with the environment Allocate gave them. Two notebooks whose limits add up to more than
the GPU are both scheduled (by request) and admitted; the idle one's memory moves to host memory so that the
other gets its burst in HBM; a bad limit annotation is an error and writes nothing."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from extender_real import RealExtCluster, real_ext_cluster
from kube_real import RealCluster
from prometheus_client.parser import text_string_to_metric_families
from test_e2e_cluster import RESOURCE, UNIT, GpuNode
from test_elastic_swap import Tenant, board_state, wait_for
from test_elastic_swap import tenant_bin as tenant_bin  # the fixture, shared
from test_extender_support import pod_obj as any_pod
from test_real_deploy import deploy, node_agent_token

from memslice.elastic import read_boards
from memslice.interposer.region import read_region_file
from memslice.paths import lib_paths

MiB = 1 << 20
NODE = "gpu-41"  # one of the real control plane's kubelet identities (kube_real.KUBELET_NODES)
NS = "e2e-elastic"  # this module's namespace on the shared real API server
PRIORITY_CLASS = "memslice-e2e-1000"
# one real control plane (the session fixture real_cluster) serves the "kube" group: one xdist worker
pytestmark = pytest.mark.xdist_group("kube")


def pod_obj(name: str, containers: dict[str, int], **kw) -> dict:
    return any_pod(name, containers, ns=NS, **kw)


@pytest.fixture(scope="module")
def agent_kubeconfig(real_cluster: RealCluster) -> str:
    """deploy/ applied, NODE registered by its kubelet, a PriorityClass; the node agent's kubeconfig: deploy/'s
    ServiceAccount token bound to the agent's pod on NODE."""
    deploy(real_cluster, "base")
    real_cluster.register_node(NODE)
    real_cluster.apply([{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                         "metadata": {"name": PRIORITY_CLASS}, "value": 1000}])
    return str(real_cluster.kubeconfig(f"agent-{NODE}", node_agent_token(real_cluster, NODE)))


@pytest.fixture
def world(real_cluster: RealCluster, agent_kubeconfig: str) -> Iterator[tuple[RealExtCluster, GpuNode]]:
    lib_paths()
    root = Path(tempfile.mkdtemp(prefix="ms-e2e-", dir="/tmp"))  # short: Unix socket paths
    node = None
    with real_ext_cluster(real_cluster, NS) as cluster:
        try:
            cluster.kube.forget_inventory(NODE)  # an earlier agent's, should one be left: this agent writes its own
            node = GpuNode(root, NODE, "4GiB", agent_kubeconfig, extra=("--idle-after", "0.3"))
            cluster.start()
            node.kubelet.wait_registered(RESOURCE, timeout=30)
            assert cluster.state.wait_for(lambda st: node.alive() and (v := st.view(NODE)) is not None and v.gpus,
                                          30), "the node agent's inventory never reached the extender"
            yield cluster, node
        finally:
            if node is not None:
                node.stop()
            cluster.kube.forget_inventory(NODE)
            shutil.rmtree(root, ignore_errors=True)


def usage(resp) -> dict[int, tuple[int, int]]:
    """pid -> (device MiB, host MiB) physically held by the container's processes (the simulator's ledger in
    the container's region directory)."""
    region = {m.container_path: m.host_path for m in resp.mounts}["/run/memslice/region"]
    snap = read_region_file(str(Path(region) / "sim.usage"))
    assert snap is not None
    return {p.pid: (p.device_bytes // MiB, p.host_bytes // MiB) for p in snap.processes if p.alive}


def notebook(cluster: RealExtCluster, node: GpuNode, name: str, limit_mib: int, priority: int | None = None,
             more: dict[str, str] | None = None):
    """Schedule a pod asking 512 MiB with this limit, admit it on the node: its Allocate answer."""
    ann = {"memslice.io/gpu-mem-limit": str(limit_mib), **(more or {})}
    obj = pod_obj(name, {"lab": 512 // UNIT}, annotations=ann)
    if priority is not None:  # admission resolves spec.priority from the pod's PriorityClass
        assert priority == 1000, "the module's PriorityClass has the value 1000"
        obj["spec"]["priorityClassName"] = PRIORITY_CLASS
    pod = cluster.add_pod(obj)
    assert cluster.c.filter(pod, [NODE])["NodeNames"] == [NODE]
    assert cluster.c.bind(pod, NODE) == ""
    ann = cluster.kube.get("Pod", NS, name)["metadata"]["annotations"]
    assert json.loads(ann["memslice.io/gpu-mem-limit-mib"]) == {"lab": limit_mib}
    node.wait_log(f"pod {NS}/{name}: the extender reserved GPU", f"the node agent to see {name}'s reservation")
    resp = node.kubelet.admit(pod["metadata"]["uid"], NS, name, [("lab", 512 // UNIT)], RESOURCE)["lab"]
    assert resp.envs["MEMSLICE_GPU_MEM_LIMIT"] == str(limit_mib) and resp.envs["MEMSLICE_GPU_MEM_REQUEST"] == "512MiB"
    return resp


def scrape(node: GpuNode, name: str, uuid: str) -> float | None:
    """One sample of the node agent's /metrics (real HTTP, parsed by prometheus_client)."""
    port = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/", node.log())
    assert port, node.log()
    with urllib.request.urlopen(f"http://127.0.0.1:{port.group(1)}/metrics", timeout=10) as r:
        text = r.read().decode()
    return next((s.value for fam in text_string_to_metric_families(text) for s in fam.samples
                 if s.name == name and s.labels.get("uuid") == uuid), None)


def test_two_elastic_notebooks_share_a_gpu_their_limits_exceed(world, tenant_bin) -> None:
    cluster, node = world
    a_resp = notebook(cluster, node, "a", 2560)
    b_resp = notebook(cluster, node, "b", 2048)  # 2560 + 2048 MiB of limits on a 4096 MiB GPU: both admitted
    assert cluster.state.view(NODE).gpus[0].used_mib == 1024  # only the requests are charged
    edir = Path({m.container_path: m.host_path for m in a_resp.mounts}["/run/memslice/elastic"])
    extra = {"MEMSLICE_CONTEXT_RESERVE": "0", "MEMSLICE_YIELD_WAIT": "60",  # the pod spec's env
             "MEMSLICE_SIM_CONTEXT_OVERHEAD": "300MiB"}  # what a context takes on this simulated GPU
    tenants: list[Tenant] = []
    try:
        a = Tenant(tenant_bin, {**node.container_env(a_resp), **extra})
        tenants.append(a)
        assert a.cmd("alloc 2048 64") == "allocated 32"  # beyond its request, up to its limit
        ptrs = a.cmd("ptrs")
        wait_for(lambda: board_state(edir, a.proc.pid) == "idle", "A idle on the node's board")
        b = Tenant(tenant_bin, {**node.container_env(b_resp), **extra})
        tenants.append(b)
        assert b.cmd("alloc 1792 64") == "allocated 28"
        assert usage(b_resp)[b.proc.pid] == (300 + 1792, 0), "B's memory is all in HBM"
        dev, host = usage(a_resp)[a.proc.pid]
        needed = 1792 - (4096 - 300 - 2048 - 300)  # issue 26: only what HBM lacked moves, A's request stays
        assert needed <= host <= 1.25 * needed and dev + host == 300 + 2048 and dev >= 300 + 512
        # the agent's metrics show it, from the node's board (A's bytes moved out, what B's asks needed)
        uuid = a_resp.envs["NVIDIA_VISIBLE_DEVICES"]
        # what A moved for B's asks is counted on B's board once A has answered, which may come after B's wait
        # ended on the driver's free memory (the shim's owed asks, elastic_settle_owed)
        wait_for(lambda: scrape(node, "memslice_gpu_elastic_swapped_mib", uuid) == host
                 and scrape(node, "memslice_gpu_elastic_swap_outs_total", uuid) >= 1
                 and scrape(node, "memslice_gpu_elastic_ask_moved_mib_total", uuid) == host,
                 "the swap in the metrics, and what A moved for B's asks")
        assert scrape(node, "memslice_gpu_elastic_resident_mib", uuid) >= 1792
        assert host <= 1.25 * scrape(node, "memslice_gpu_elastic_ask_needed_mib_total", uuid)
        # each container has its own board slot, assigned by the agent and named in its read-only limits file
        assert sorted(t.slot for t in read_boards(edir)) == [0, 1]
        assert b.cmd("check") == f"check ok {1792 * MiB}"
        assert a.cmd("check") == f"check ok {2048 * MiB}" and a.cmd("ptrs") == ptrs
    finally:
        for t in tenants:
            t.close()


def test_a_bad_limit_annotation_is_an_error_and_nothing_is_written(world) -> None:
    cluster, node = world
    ann = {"memslice.io/gpu-mem-limit.lab": "2.5Gi"}
    pod = cluster.add_pod(pod_obj("bad", {"lab": 512 // UNIT}, annotations=ann))
    result = cluster.c.filter(pod, [NODE])
    assert "annotation memslice.io/gpu-mem-limit.lab='2.5Gi' is not a whole number of MiB" in result["Error"]
    assert "memslice.io/gpu-mem-limit.lab" in cluster.c.bind(pod, NODE)
    stored = cluster.kube.get("Pod", NS, "bad")
    assert stored["metadata"]["annotations"] == ann and not stored["spec"].get("nodeName")
    assert cluster.state.view(NODE).gpus[0].used_mib == 0


def all_samples(node: GpuNode) -> list:
    """Every sample of the agent's /metrics (real HTTP, parsed by prometheus_client)."""
    port = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/", node.log())
    assert port, node.log()
    with urllib.request.urlopen(f"http://127.0.0.1:{port.group(1)}/metrics", timeout=10) as r:
        text = r.read().decode()
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


def samples(node: GpuNode, name: str) -> dict[tuple[str, str, str], float]:
    """(namespace, pod, gpu) -> value of one per-container metric of the containers named lab."""
    return {(s.labels["namespace"], s.labels["pod"], s.labels["gpu"]): s.value for s in all_samples(node)
            if s.name == name and s.labels.get("container") == "lab"}


def events(cluster: RealExtCluster, pod: str, reason: str) -> list[dict]:
    return [e for e in cluster.kube.list("Event", NS)
            if e["involvedObject"]["name"] == pod and e["reason"] == reason]


def test_per_container_swap_figures_and_pod_events(world, tenant_bin) -> None:
    """The agent attributes each board slot to its container by the kernel's word (who holds the slot's lock,
    who holds a slot of which region), exports resident/swapped bytes and swap counts and seconds per
    container and GPU, keeps the counters when the process exits, and puts one Event per kind on the pod."""
    cluster, node = world
    a_resp = notebook(cluster, node, "a", 2560)
    b_resp = notebook(cluster, node, "b", 2048)
    uuid = a_resp.envs["NVIDIA_VISIBLE_DEVICES"]
    edir = Path({m.container_path: m.host_path for m in a_resp.mounts}["/run/memslice/elastic"])
    extra = {"MEMSLICE_CONTEXT_RESERVE": "0", "MEMSLICE_YIELD_WAIT": "60",
             "MEMSLICE_SIM_CONTEXT_OVERHEAD": "300MiB"}  # what a context takes on this simulated GPU
    a_uid = cluster.kube.get("Pod", NS, "a")["metadata"]["uid"]
    tenants: list[Tenant] = []
    try:
        a = Tenant(tenant_bin, {**node.container_env(a_resp), **extra})
        tenants.append(a)
        assert a.cmd("alloc 2048 64") == "allocated 32"
        wait_for(lambda: board_state(edir, a.proc.pid) == "idle", "A idle on the node's board")
        b = Tenant(tenant_bin, {**node.container_env(b_resp), **extra})
        tenants.append(b)
        assert b.cmd("alloc 1792 64") == "allocated 28"
        ka, kb = (NS, "a", uuid), (NS, "b", uuid)
        host = usage(a_resp)[a.proc.pid][1]  # what HBM lacked for B (issue 26), in 32 MiB chunks
        assert 344 <= host <= 430 and host % 32 == 0
        wait_for(lambda: samples(node, "memslice_container_swapped_mib").get(ka) == host
                 and samples(node, "memslice_container_resident_mib").get(kb) == 1792, "per-container figures")
        assert samples(node, "memslice_container_resident_mib")[ka] == 2048 - host
        assert samples(node, "memslice_container_swapped_mib")[kb] == 0
        outs = samples(node, "memslice_container_swap_outs_total")
        assert outs[ka] == host // 32 and outs[kb] == 0, "A's chunks moved out, none of B's"
        assert samples(node, "memslice_container_swap_out_seconds_total")[ka] > 0
        procs = [s for s in all_samples(node) if s.name == "memslice_container_elastic_processes"
                 and s.labels["pod"] == "a" and s.value]
        assert [p.labels["state"] for p in procs] == ["idle"]
        # the Event on pod a: created by the agent through the API, about this pod (by uid), Normal
        wait_for(lambda: events(cluster, "a", "GPUMemorySwappedOut"), "the swap-out Event", timeout=30)
        (ev,) = events(cluster, "a", "GPUMemorySwappedOut")
        assert ev["type"] == "Normal" and ev["count"] == 1 and ev["involvedObject"]["uid"] == a_uid
        assert ev["involvedObject"]["kind"] == "Pod" and ev["source"]["host"] == NODE
        # (at the first move seen: B's asks come one per allocation, so the Event may count only the first)
        moved = re.search(r"container lab: (\d+) range\(s\) .* now (\d+) MiB in host memory", ev["message"])
        assert moved and 1 <= int(moved.group(1)) <= host // 32 and int(moved.group(2)) <= host
        assert uuid in ev["message"]
        assert not events(cluster, "b", "GPUMemorySwappedOut")
        # `memslice top --region-root` on the node: every container, named by the agent's records
        top = subprocess.run([sys.executable, "-m", "memslice", "top", "--json", "--region-root",
                              str(node.dir / "regions")], capture_output=True, text=True, timeout=60)
        assert top.returncode == 0, top.stderr
        shown = {r["owner"]["pod"]: r for r in json.loads(top.stdout)["regions"]}
        assert shown["a"]["owner"] == {"namespace": NS, "pod": "a", "container": "lab"}
        (ea,), (eb,) = shown["a"]["elastic"], shown["b"]["elastic"]
        assert (ea["gpu"], ea["swapped_bytes"], ea["processes"][0]["state"]) == (uuid, host * MiB, "idle")
        assert eb["elastic_resident_bytes"] == 1792 * MiB and eb["processes"][0]["host_pid"] == b.proc.pid
        # B frees, A runs again: its memory comes back to HBM; a swap-in Event, and the counters go on
        assert b.cmd("free") == "freed 0"
        assert a.cmd("check") == f"check ok {2048 * MiB}"
        wait_for(lambda: samples(node, "memslice_container_swap_ins_total").get(ka, 0) == host // 32, "A's swap-in")
        wait_for(lambda: events(cluster, "a", "GPUMemorySwappedIn"), "the swap-in Event", timeout=30)
        before = samples(node, "memslice_container_swap_ins_total")[ka]
        a.close()  # the process exits: its slot goes, its container's totals stay
        wait_for(lambda: not any(t.pid == a.proc.pid for t in read_boards(edir)), "A's slot gone")
        after = samples(node, "memslice_container_swap_ins_total")
        assert after[ka] >= before and samples(node, "memslice_container_swap_outs_total")[ka] == host // 32
        assert samples(node, "memslice_container_resident_mib")[ka] == 0
        # one Event per pod and kind per interval (60 s): however many ranges moved, no second one
        assert len(events(cluster, "a", "GPUMemorySwappedOut")) == 1
        assert len(events(cluster, "a", "GPUMemorySwappedIn")) == 1
    finally:
        for t in tenants:
            t.close()


def test_a_move_host_memory_cannot_take_fails_the_burst_with_an_event_and_a_metric(world, tenant_bin,
                                                                                    tmp_path) -> None:
    """Issue 26.5 on the whole path: A's memory cgroup is near its limit (a fake one: memory.max 4 GiB,
    memory.current 3.9 GiB), so idle A cannot take its bytes to host memory; B's burst past the free HBM
    fails at once with out-of-memory, A's bytes stay in HBM, and the real node agent writes an
    ElasticHostMemoryFull Warning on both pods and counts the refusal by cause on /metrics."""
    cluster, node = world
    a_resp = notebook(cluster, node, "a", 2560)
    b_resp = notebook(cluster, node, "b", 2048)
    uuid = a_resp.envs["NVIDIA_VISIBLE_DEVICES"]
    edir = Path({m.container_path: m.host_path for m in a_resp.mounts}["/run/memslice/elastic"])
    cg = tmp_path / "cg-a"
    cg.mkdir()
    (cg / "memory.max").write_text(f"{4 << 30}\n")
    (cg / "memory.current").write_text(f"{(39 << 30) // 10}\n")
    extra = {"MEMSLICE_CONTEXT_RESERVE": "0", "MEMSLICE_YIELD_WAIT": "120",
             "MEMSLICE_SIM_CONTEXT_OVERHEAD": "300MiB"}
    tenants: list[Tenant] = []
    try:
        a = Tenant(tenant_bin, {**node.container_env(a_resp), **extra, "MEMSLICE_CGROUP_DIR": str(cg)})
        tenants.append(a)
        assert a.cmd("alloc 2048 64") == "allocated 32"
        wait_for(lambda: board_state(edir, a.proc.pid) == "idle", "A idle on the node's board")
        b = Tenant(tenant_bin, {**node.container_env(b_resp), **extra})
        tenants.append(b)
        assert b.cmd("alloc 1792 64").startswith("oom 22 rc=2")
        assert usage(a_resp)[a.proc.pid] == (300 + 2048, 0), "A moved nothing"
        full = "ElasticHostMemoryFull"
        wait_for(lambda: events(cluster, "a", full) and events(cluster, "b", full), "the Events on both pods", 30)
        (ea,) = events(cluster, "a", full)
        (eb,) = events(cluster, "b", full)
        assert ea["type"] == eb["type"] == "Warning"
        assert "memory.max 4096 MiB, memory.current 3993 MiB" in ea["message"], ea["message"]
        assert "burst allocation(s) failed" in eb["message"], eb["message"]
        refused = {s.labels["cause"]: s.value for s in all_samples(node)
                   if s.name == "memslice_elastic_moves_refused_total" and s.labels.get("uuid") == uuid}
        assert refused == {"cgroup": 1, "host": 0}
        assert samples(node, "memslice_container_elastic_bursts_failed_total")[(NS, "b", uuid)] == 1
        assert a.cmd("check") == f"check ok {2048 * MiB}"
    finally:
        for t in tenants:
            t.close()


def test_the_agent_writes_slot_priority_and_idle_release_where_the_shim_reads_its_limits(world) -> None:
    """Issues 25.4, 26.1 and 26.3 on the Kubernetes path: each elastic container gets its own board slot, its
    pod's PriorityClass value and its idle-release opt-in (contract.ANN_IDLE_RELEASE) in its read-only limits
    file, and the GPU's roster (read-only to tenants) names the slots with the agent's own figures."""
    from memslice.contract import ANN_IDLE_RELEASE
    from memslice.elastic import parse_roster

    cluster, node = world
    a = notebook(cluster, node, "a", 2560, priority=1000, more={ANN_IDLE_RELEASE: "true"})
    b = notebook(cluster, node, "b", 2048)
    limits = [Path({m.container_path: m.host_path for m in r.mounts}["/run/memslice/limits"]).read_text()
              for r in (a, b)]
    assert "elastic_slot=0" in limits[0] and "priority=1000" in limits[0] and "idle_release=1" in limits[0]
    assert "elastic_slot=1" in limits[1] and "priority=" not in limits[1] and "idle_release" not in limits[1]
    mounts = {m.container_path: (m.host_path, m.read_only) for m in a.mounts}
    edir, ro = mounts["/run/memslice/elastic"]
    uuid = a.envs["NVIDIA_VISIBLE_DEVICES"]
    assert ro and mounts[f"/run/memslice/elastic/{uuid}.board/00.slot"] == (f"{edir}/{uuid}.board/00.slot", False)
    assert [k for k, (_, r) in mounts.items() if k.startswith("/run/memslice/elastic") and not r] == [
        f"/run/memslice/elastic/{uuid}.board/00.slot"], "only its own slot file is writable (issue 35.3)"
    roster = parse_roster((Path(edir) / f"{uuid}.roster").read_bytes())
    assert roster is not None
    assert {s: (e.request_mib, e.limit_mib, e.priority, e.idle_release) for s, e in roster.items()} == {
        0: (512, 2560, 1000, True), 1: (512, 2048, 0, False)}

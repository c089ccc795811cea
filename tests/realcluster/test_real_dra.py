"""DRA mode with the real kube-scheduler (issue 28, scenario 3).

deploy/overlays/dra on the real API server; the node agent (`--kubelet-api dra`, on a simulated node) runs
with its pod-bound ServiceAccount token and publishes its ResourceSlice through the API server's validation
and the overlay's admission policy; the kube-controller-manager's resourceclaim controller makes each pod's
ResourceClaim from deploy/'s ResourceClaimTemplate; the real kube-scheduler (default profile; DRA consumable
capacity is on by default in 1.36+) allocates several claims on one GPU; our kubelet DRA stand-in calls
NodePrepareResources with the claim as allocated, and the shim's quota in the prepared container is the
claim's consumed capacity. A pod whose claim does not fit is left Pending by the scheduler.
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
from typing import Any

import pytest
from conftest import ChildLog
from kube_real import SCHEDULER_TOKEN, RealCluster, kubelet_token, wait_until
from kubelet_dra_standin import KUBELET_SERVICES, KubeletDraStandin, container_cdi_ids
from sim_truth import gpu_truth
from test_agent_multigpu import TWO_DEVICES
from test_deploy_render import DEPLOY, NAMESPACE, load_yaml
from test_dra_node import CDI_KIND, DRIVER, to_host
from test_e2e_cluster import CONTEXT_RESERVE_MIB, TENANT
from test_real_deploy import deploy, node_agent_token
from waiting import stop_process

from memslice.paths import lib_paths

# one real control plane (the session fixture real_cluster) serves the three test_real_* modules: one xdist worker
pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("kube")]
ROOT = Path(__file__).resolve().parents[2]
NS = "real-dra"
NODE = "dra-00"
GPUS = "16GiB,16GiB"  # room for 8 claims of 4 GiB: 4 on each GPU
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


class KubeletApi:
    """What the kubelet stand-in asks of the API server, as the kubelet does: its node's ResourceSlices,
    with the node's own identity (the Node authorizer)."""

    def __init__(self, cluster: RealCluster, node: str) -> None:
        self.cluster, self.node = cluster, node

    def list(self, kind: str) -> list[dict[str, Any]]:
        assert kind == "ResourceSlice"
        return list(self.cluster.ok("GET", f"{SLICES}?fieldSelector=spec.nodeName={self.node}",
                                    token=kubelet_token(self.node))["items"])

    def delete(self, kind: str, namespace: str | None, name: str) -> None:
        assert kind == "ResourceSlice" and namespace is None
        self.cluster.ok("DELETE", f"{SLICES}/{name}", token=kubelet_token(self.node))


class Agent:
    """`memslice node-agent --kubelet-api dra` on a simulated node, with the kubelet's DRA stand-in."""

    def __init__(self, cluster: RealCluster, root: Path) -> None:
        self.root = root
        self.cdi = root / "cdi"
        self.kubelet = KubeletDraStandin(root / "registry", KUBELET_SERVICES, KubeletApi(cluster, NODE), NODE).start()
        kubeconfig = cluster.kubeconfig("dra-agent", node_agent_token(cluster, NODE))
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith("MEMSLICE_") and k not in ("KUBERNETES_SERVICE_HOST", "NODE_NAME")}
        self.env["MEMSLICE_SIM_STATE"] = str(root / "sim.state")
        cmd = [sys.executable, "-m", "memslice", "node-agent", "--kubelet-api", "dra", "--simulate", GPUS,
               "--plugins-registry-dir", str(root / "registry"), "--kubelet-plugins-dir", str(root / "plugins"),
               "--cdi-dir", str(self.cdi), "--region-root", str(root / "regions"), "--shim-host-dir",
               str(root / "lib"), "--metrics-address", "127.0.0.1", "--metrics-port", "0",
               "--node-name", NODE, "--kubeconfig", str(kubeconfig)]
        self.cmd, self.runs = cmd, 0
        self.launch()

    def launch(self) -> None:
        self.runs += 1
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=self.env,
                                     cwd=ROOT)
        self.output = ChildLog(self.proc, self.root / f"agent-{self.runs}.log")

    def restart(self) -> None:
        """The agent's pod is replaced (SIGTERM, then a new process); the kubelet stays."""
        self.proc.terminate()
        self.proc.wait(20)
        self.launch()

    def alive(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"node agent exited {self.proc.returncode}:\n{self.output.text()}")

    def stop(self) -> None:
        stop_process(self.proc, 10)
        self.kubelet.stop()

    def container_env(self, spec: dict[str, Any], device: str) -> dict[str, str]:
        """A container's environment with CDI device `device` applied (as in tests/dra/test_dra_node.py)."""
        edits = next(d for d in spec["devices"] if d["name"] == device)["containerEdits"]
        mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
        env = {k: v for k, v in self.env.items() if not k.startswith("MEMSLICE_")}
        for kv in edits["env"]:
            k, v = kv.split("=", 1)
            env[k] = to_host(v, mounts)
        preload = Path(mounts["/etc/ld.so.preload"]).read_text().split()
        env["LD_PRELOAD"] = ":".join(mounts[p] for p in preload)
        return env


@pytest.fixture(scope="module")
def dra(real_cluster: RealCluster) -> Iterator[tuple[RealCluster, Agent]]:
    cluster = real_cluster
    lib_paths()
    deploy(cluster, "overlays/dra")
    cluster.ensure_namespace(NS)
    cluster.register_node(NODE, labels={"memslice-test/pool": "dra"})
    (tmpl,) = load_yaml(DEPLOY / "overlays" / "dra" / "examples" / "resourceclaimtemplate.yaml")
    tmpl["metadata"]["namespace"] = NS
    cluster.apply([tmpl])
    # the resourceclaim controller, as kube-controller-manager runs it: its own ServiceAccount in kube-system
    status, out = cluster.request("POST", "/api/v1/namespaces/kube-system/serviceaccounts",
                                  {"metadata": {"name": "resource-claim-controller"}})
    assert status in (201, 409), out
    controller = cluster.start_resourceclaim_controller(cluster.token("kube-system", "resource-claim-controller"))
    sched = cluster.start_scheduler({
        "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(cluster.kubeconfig("kube-scheduler", SCHEDULER_TOKEN))},
        "leaderElection": {"leaderElect": False}}, "kube-scheduler")
    root = Path(tempfile.mkdtemp(prefix="ms-rdra-", dir="/tmp"))  # short: Unix socket paths
    agent = Agent(cluster, root)
    try:
        agent.kubelet.wait_registered(DRIVER, 60)
        wait_until("the agent's ResourceSlice", lambda: KubeletApi(cluster, NODE).list("ResourceSlice"), 60, 0.5,
                   agent.alive)
        yield cluster, agent
    finally:
        agent.stop()
        for p in (sched, controller):
            p.stop()
        shutil.rmtree(root, ignore_errors=True)


def notebook(name: str) -> dict[str, Any]:
    (pod,) = load_yaml(DEPLOY / "overlays" / "dra" / "examples" / "notebook.yaml")
    pod["metadata"] = {"name": name, "namespace": NS}
    pod["spec"]["nodeSelector"] = {"memslice-test/pool": "dra"}
    return pod


def claim_of(cluster: RealCluster, pod: dict[str, Any]) -> dict[str, Any]:
    [st] = pod["status"]["resourceClaimStatuses"]
    return dict(cluster.ok("GET", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/{st['resourceClaimName']}"))


# TENANT, waiting after its context for a line on stdin: the 8 tenants below make their contexts one at a time
# before any allocates, so that this test checks placement and quotas only. (A context made while neighbours
# allocate is measured net of their NVML growth: tests/shim/test_shim_context_among_neighbours.py.)
TENANT_AFTER_GO = TENANT.replace("held, refused = [], None", "print('context', flush=True)\nsys.stdin.readline()\n"
                                 "held, refused = [], None")
assert TENANT_AFTER_GO != TENANT


def test_real_scheduler_allocates_shares_and_the_shim_holds_each_to_its_claim(dra) -> None:
    cluster, agent = dra
    [sl] = KubeletApi(cluster, NODE).list("ResourceSlice")
    assert [d["capacity"]["memory"]["value"] for d in sl["spec"]["devices"]] == ["16Gi", "16Gi"]
    names = [f"nb{i}" for i in range(9)]
    for n in names:
        cluster.ok("POST", f"/api/v1/namespaces/{NS}/pods", notebook(n))

    def placed() -> dict[str, dict[str, Any]] | None:
        pods = {p["metadata"]["name"]: p for p in cluster.ok("GET", f"/api/v1/namespaces/{NS}/pods")["items"]}
        bound = {n: p for n, p in pods.items() if p["spec"].get("nodeName")}
        pending = [p for n, p in pods.items() if n not in bound and any(
            c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
            for c in p.get("status", {}).get("conditions", []))]
        return pods if len(bound) == 8 and len(pending) == 1 else None

    pods = wait_until("8 notebooks bound and one unschedulable", placed, 120, 0.5, agent.alive)
    [left] = [p for p in pods.values() if not p["spec"].get("nodeName")]
    per_device: dict[str, int] = {}
    claims = []
    for p in pods.values():
        if p is left:
            continue
        claim = claim_of(cluster, p)
        [res] = claim["status"]["allocation"]["devices"]["results"]
        assert res["driver"] == DRIVER and res["pool"] == NODE and res["consumedCapacity"]["memory"] == "4Gi"
        assert claim["status"]["reservedFor"][0]["name"] == p["metadata"]["name"]
        per_device[res["device"]] = per_device.get(res["device"], 0) + 1
        claims.append(claim)
    assert sorted(per_device.values()) == [4, 4], per_device  # several claims on one GPU, none over
    evs = cluster.ok("GET", f"/api/v1/namespaces/{NS}/events?fieldSelector=involvedObject.name="
                            f"{left['metadata']['name']},reason=FailedScheduling")["items"]
    assert evs and "cannot allocate all claims" in evs[-1]["message"], evs

    # the kubelet prepares the claims as allocated; the agent reads each with its own token
    resp = agent.kubelet.prepare(DRIVER, *claims)
    tenants: list[tuple[dict[str, str], subprocess.Popen[str]]] = []
    try:
        for claim in claims:
            uid = claim["metadata"]["uid"]
            entry = resp.claims[uid]
            assert entry.error == "", entry.error
            [device] = entry.devices
            [res] = claim["status"]["allocation"]["devices"]["results"]
            share = res["shareID"]
            assert (device.pool_name, device.device_name) == (NODE, res["device"])
            assert list(device.cdi_device_ids) == [f"{CDI_KIND}={uid}-{share}"]
            spec = json.loads((agent.cdi / f"memslice.io-{uid}.json").read_text())
            env = agent.container_env(spec, f"{uid}-{share}")
            assert env["MEMSLICE_GPU_MEM_LIMIT"] == "4096"  # the claim's consumedCapacity, in MiB
            assert device.share_id == share  # issue 36.7
            # issue 36.8: the API server (validation, granular status authorization) took the claim's
            # status.devices, keyed by the allocation result, saying what the node enforces
            got = cluster.ok("GET", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/"
                                    f"{claim['metadata']['name']}")
            [st] = got["status"]["devices"]
            assert (st["driver"], st["pool"], st["device"], st["shareID"]) == (DRIVER, NODE, res["device"], share)
            assert st["data"]["quota"] == "4096Mi" and st["data"]["gpuUUID"] == env["NVIDIA_VISIBLE_DEVICES"]
            assert [(c["type"], c["status"]) for c in st["conditions"]] == [("Ready", "True")]
        # a container's process for each of the 8 claims, all at once on the two simulated GPUs: each held to
        # its claim's 4 GiB by the shim, by its own report and by the GPU's own figures (NVML past the shim)
        for claim in claims:
            uid, share = claim["metadata"]["uid"], claim["status"]["allocation"]["devices"]["results"][0]["shareID"]
            spec = json.loads((agent.cdi / f"memslice.io-{uid}.json").read_text())
            env = agent.container_env(spec, f"{uid}-{share}")
            tenant = subprocess.Popen([sys.executable, "-c", TENANT_AFTER_GO], env=env, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            tenants.append((env, tenant))
            # one context at a time (see TENANT_AFTER_GO); then all 8 allocate at once
            assert tenant.stdout is not None and tenant.stdout.readline() == "context\n", tenant.stderr
        for _, tenant in tenants:
            assert tenant.stdin is not None
            tenant.stdin.write("go\n")
            tenant.stdin.flush()
        for _, tenant in tenants:
            line = tenant.stdout.readline() if tenant.stdout else ""
            assert line, f"exit {tenant.wait(30)}: {tenant.stderr.read() if tenant.stderr else ''}"
            report = json.loads(line)
            assert report["refused_with"] == 2, report
            assert 4096 - 256 < report["allocated_mib"] + CONTEXT_RESERVE_MIB <= 4096, report
        on_gpu: dict[str, list[int]] = {}
        for env, tenant in tenants:
            uuid = env["NVIDIA_VISIBLE_DEVICES"]
            held = gpu_truth(env, uuid).processes.get(tenant.pid, 0) >> 20
            assert 4096 - 256 < held <= 4096, (uuid, held)
            on_gpu.setdefault(uuid, []).append(held)
        assert sorted(len(v) for v in on_gpu.values()) == [4, 4] and all(sum(v) <= 16384 for v in on_gpu.values())
    finally:
        for _, tenant in tenants:
            tenant.communicate("", timeout=30)
    # Scenario 5: the agent restarts; the kubelet registers it again and its slice is back; what was prepared
    # stays prepared (the kubelet calls NodePrepareResources again at its restart: the same devices answer)
    before = {c["metadata"]["uid"]: list(resp.claims[c["metadata"]["uid"]].devices[0].cdi_device_ids) for c in claims}
    agent.restart()
    wait_until("the restarted agent's ResourceSlice", lambda: KubeletApi(cluster, NODE).list("ResourceSlice"), 60,
               0.5, agent.alive)
    again = wait_until("NodePrepareResources answered by the restarted agent",
                       lambda: _prepare_or_none(agent, claims), 60, 0.5, agent.alive)
    assert agent.runs == 2 and {uid: list(c.devices[0].cdi_device_ids) for uid, c in again.claims.items()} == before
    assert all(c.error == "" for c in again.claims.values())
    out = agent.kubelet.unprepare(DRIVER, *claims)
    assert all(out.claims[c["metadata"]["uid"]].error == "" for c in claims)
    # every call of this agent (its token names its node) was allowed by deploy/overlays/dra's RBAC and policy
    calls = [e for e in cluster.audit(f"system:serviceaccount:{NAMESPACE}:memslice-node-agent")
             if e["user"].get("extra", {}).get("authentication.kubernetes.io/node-name") == [NODE]]
    assert {(e["verb"], e["objectRef"]["resource"]) for e in calls} >= {("get", "resourceclaims"),
                                                                      ("create", "resourceslices"),
                                                                      ("patch", "resourceclaims")}
    assert [e["requestURI"] for e in calls if e.get("responseStatus", {}).get("code", 0) >= 400] == []


def _prepare_or_none(agent: Agent, claims: list[dict[str, Any]]) -> Any:
    """NodePrepareResources, or None while the agent's new socket does not answer yet."""
    import grpc

    try:
        return agent.kubelet.prepare(DRIVER, *claims)
    except (grpc.RpcError, AssertionError):
        return None


def test_an_elastic_claim_is_allocated_by_its_request_and_prepared_with_its_limit(dra) -> None:
    """Issue 26.6 on the real control plane: deploy/'s elastic example (a ResourceClaimTemplate asking 2Gi of
    consumable capacity, with the opaque GpuMemConfig limit 8Gi and idleRelease) passes the API server's
    validation and the overlay's claim policy; the real kube-scheduler allocates the claim by its request (the
    opaque config carried into the allocation); the agent reads the consumer pod (RBAC: pods get) for its
    PriorityClass value and prepares the claim elastic: the limits file and the CDI env carry request and
    limit, and the shim in the container holds its process to the limit, not the request."""
    cluster, agent = dra
    # the first test's notebooks fill both GPUs: delete them (no kubelet: at once); their claims go with them
    cluster.ok("DELETE", f"/api/v1/namespaces/{NS}/pods?gracePeriodSeconds=0")
    wait_until("the notebooks' claims deallocated", lambda: not [
        c for c in cluster.ok("GET", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims")["items"]
        if c.get("status", {}).get("allocation")], 120, 0.5, agent.alive)
    cluster.apply([{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                    "metadata": {"name": "memslice-dra-notebooks"}, "value": 1000}])
    tmpl, pod = load_yaml(DEPLOY / "overlays" / "dra" / "examples" / "notebook-elastic.yaml")
    tmpl["metadata"]["namespace"] = NS
    cluster.apply([tmpl])
    pod["metadata"] = {"name": "elastic", "namespace": NS}
    pod["spec"]["nodeSelector"] = {"memslice-test/pool": "dra"}
    pod["spec"]["priorityClassName"] = "memslice-dra-notebooks"
    cluster.ok("POST", f"/api/v1/namespaces/{NS}/pods", pod)

    def placed() -> dict[str, Any] | None:
        p = cluster.ok("GET", f"/api/v1/namespaces/{NS}/pods/elastic")
        return p if p["spec"].get("nodeName") else None

    bound = wait_until("the elastic notebook bound", placed, 120, 0.5, agent.alive)
    assert bound["spec"]["priority"] == 1000
    claim = claim_of(cluster, bound)
    [res] = claim["status"]["allocation"]["devices"]["results"]
    assert res["consumedCapacity"]["memory"] == "2Gi"  # the scheduler counts the request only
    [cfg] = claim["status"]["allocation"]["devices"]["config"]
    assert cfg["source"] == "FromClaim" and cfg["opaque"]["parameters"]["limit"] == "8Gi"
    resp = agent.kubelet.prepare(DRIVER, claim)
    uid = claim["metadata"]["uid"]
    assert resp.claims[uid].error == "", resp.claims[uid].error
    spec = json.loads((agent.cdi / f"memslice.io-{uid}.json").read_text())
    device = f"{uid}-{res['shareID']}"
    edits = next(d for d in spec["devices"] if d["name"] == device)["containerEdits"]
    mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
    limits = Path(mounts["/run/memslice/limits"]).read_text().splitlines()
    assert {"gpu_mem_limit=8192MiB", "gpu_mem_request=2048MiB", "priority=1000", "idle_release=1",
            "elastic_slot=0"} <= set(limits), limits
    env = agent.container_env(spec, device)
    assert (env["MEMSLICE_GPU_MEM_LIMIT"], env["MEMSLICE_GPU_MEM_REQUEST"]) == ("8192", "2048MiB")
    tenant = subprocess.Popen([sys.executable, "-c", TENANT], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = tenant.stdout.readline() if tenant.stdout else ""
        assert line, tenant.stderr.read() if tenant.stderr and tenant.poll() is not None else "no output"
        report = json.loads(line)
        assert report["refused_with"] == 2, report  # at the limit, well above the 2 GiB request
        assert 8192 - 256 < report["allocated_mib"] + CONTEXT_RESERVE_MIB <= 8192, report
        # the GPU's own figure (NVML past the shim): with HBM to spare, the whole limit is on the device
        assert 8192 - 256 < gpu_truth(env, env["NVIDIA_VISIBLE_DEVICES"]).processes[tenant.pid] >> 20 <= 8192
    finally:
        tenant.communicate("", timeout=60)
    assert agent.kubelet.unprepare(DRIVER, claim).claims[uid].error == ""
    calls = [e for e in cluster.audit(f"system:serviceaccount:{NAMESPACE}:memslice-node-agent")
             if e["user"].get("extra", {}).get("authentication.kubernetes.io/node-name") == [NODE]]
    assert ("get", "pods") in {(e["verb"], e["objectRef"]["resource"]) for e in calls}
    assert [e["requestURI"] for e in calls if e.get("responseStatus", {}).get("code", 0) >= 400] == []


# -- issue 36.1: more than one share in a claim, on the real allocator -----------------------------------------

UNCHECKED_CLASS = "unchecked-gpu-mem.memslice-test"  # the class's devices under a name the claim policy ignores


def _claim_body(name: str, requests: list[dict[str, Any]], cls: str = "gpu-mem.memslice.io",
                constraints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": [{"name": r.pop("name"), "exactly": {"deviceClassName": cls, **r}}
                                            for r in requests]}
    if constraints is not None:
        devices["constraints"] = constraints
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NS}, "spec": {"devices": devices}}


def _mem(q: str) -> dict[str, Any]:
    return {"capacity": {"requests": {"memory": q}}}


def _pod_with_claim(name: str, claim: str) -> dict[str, Any]:
    pod = notebook(name)
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
    return pod


def _scheduled_or_unschedulable(cluster: RealCluster, name: str) -> dict[str, Any] | None:
    p = cluster.ok("GET", f"/api/v1/namespaces/{NS}/pods/{name}")
    if p["spec"].get("nodeName") or any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                                        for c in p.get("status", {}).get("conditions", [])):
        return dict(p)
    return None


def _claim(cluster: RealCluster, name: str) -> dict[str, Any]:
    return dict(cluster.ok("GET", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/{name}"))


def _clear(cluster: RealCluster, agent: Agent) -> None:
    """No pod and no claim left in the namespace (no kubelet: pods go at once; the resourceclaim controller
    lifts the claims' protection once their pods are gone)."""
    cluster.ok("DELETE", f"/api/v1/namespaces/{NS}/pods?gracePeriodSeconds=0")
    wait_until("the namespace's pods gone", lambda: not cluster.ok("GET", f"/api/v1/namespaces/{NS}/pods")["items"],
               60, 0.5, agent.alive)
    cluster.ok("DELETE", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims")
    wait_until("the namespace's claims gone", lambda: not cluster.ok(
        "GET", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims")["items"], 120, 0.5, agent.alive)


def test_count_2_gets_two_gpus_with_a_quota_on_each_and_pinned_it_is_refused(dra) -> None:
    """Issues 36.1 and 34. The real kube-scheduler gives one request's devices as DIFFERENT devices (its
    allocator picks a request's next device after the previous one), and each GPU is one device: `count: 2`
    gets two GPUs of the node, which the agent prepares as ONE region with the request's capacity as the quota
    on EACH GPU (the shim holds a process on both to it, read back from the simulated GPU), and `count: 2`
    pinned by `matchAttribute: memslice.io/uuid` is never allocated, so the claim policy (real CEL, real API
    server) refuses it, and admits `count: 2` and the deploy/examples vLLM template. Requests kept apart by
    `distinctAttribute` with the same capacity land on two GPUs too. The forms for one GPU (the total in one
    request; two requests pinned to one GPU) are allocated on one GPU and prepared as one quota."""
    cluster, agent = dra
    _clear(cluster, agent)
    status, out = cluster.request("POST", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims",
                                  _claim_body("count2-pinned", [{"name": "gpu", "count": 2, **_mem("2Gi")}],
                                              constraints=[{"matchAttribute": "memslice.io/uuid"}]))
    assert status == 422 and "gets that many DIFFERENT GPUs from kube-scheduler" in " ".join(
        str(out.get("message", out)).split()), (status, out)
    tmpl, _ = load_yaml(ROOT / "deploy" / "examples" / "vllm-tp2-dra.yaml")
    tmpl["metadata"]["namespace"] = NS
    cluster.ok("POST", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaimtemplates", tmpl)

    # count 2, and two requests kept apart: two GPUs each, prepared as one region with 2 GiB on each GPU
    count2 = _claim_body("count2", [{"name": "gpu", "count": 2, **_mem("2Gi")}])
    apart = _claim_body("apart", [{"name": "a", **_mem("2Gi")}, {"name": "b", **_mem("2Gi")}],
                        constraints=[{"distinctAttribute": "memslice.io/uuid"}])
    for body in (count2, apart):
        cluster.ok("POST", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims", body)
        name = body["metadata"]["name"]
        cluster.ok("POST", f"/api/v1/namespaces/{NS}/pods", _pod_with_claim(name, name))
    for name in ("count2", "apart"):
        p = wait_until(f"{name} scheduled", lambda n=name: _scheduled_or_unschedulable(cluster, n), 120, 0.5,
                       agent.alive)
        assert p["spec"].get("nodeName") == NODE, p.get("status")
    claims = [_claim(cluster, "count2"), _claim(cluster, "apart")]
    for claim in claims:
        results = claim["status"]["allocation"]["devices"]["results"]
        assert sorted(r["device"] for r in results) == ["gpu-0", "gpu-1"], results  # two different GPUs
    [sl] = KubeletApi(cluster, NODE).list("ResourceSlice")
    uuid_of = {d["name"]: d["attributes"]["uuid"]["string"] for d in sl["spec"]["devices"]}
    resp = agent.kubelet.prepare(DRIVER, *claims)
    try:
        for claim in claims:
            uid = claim["metadata"]["uid"]
            entry = resp.claims[uid]
            assert entry.error == "", entry.error
            order = [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]
            assert [d.device_name for d in entry.devices] == order  # one Device per GPU, in result order
            assert len({tuple(d.request_names) for d in entry.devices}) == 1  # each names the whole claim
            assert [len(d.cdi_device_ids) for d in entry.devices] == [1, 0]  # one region, its CDI device once
            spec = json.loads((agent.cdi / f"memslice.io-{uid}.json").read_text())
            env = agent.container_env(spec, entry.devices[0].cdi_device_ids[0].split("=", 1)[1])
            assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuid_of[d] for d in order)
            assert env["MEMSLICE_GPU_MEM_LIMIT"] == "2048"  # per GPU
        env = agent.container_env(json.loads((agent.cdi / f"memslice.io-{claims[0]['metadata']['uid']}.json")
                                             .read_text()), resp.claims[claims[0]["metadata"]["uid"]].devices[0]
                                  .cdi_device_ids[0].split("=", 1)[1])
        tenant = subprocess.Popen([sys.executable, "-c", TWO_DEVICES, "1024", "1024"], env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            lines = []
            while not lines or lines[-1].get("event") != "ready":
                line = tenant.stdout.readline() if tenant.stdout else ""
                assert line, tenant.stderr.read() if tenant.stderr else "no output"
                lines.append(json.loads(line))
            # each GPU: its context (520 MiB) + 1024 MiB fit in 2048 MiB, the next 1024 do not (2: out of memory)
            assert [(x["device"], x["result"]) for x in lines[:-1]] == [(0, 0), (0, 2), (1, 0), (1, 2)], lines
        finally:
            tenant.communicate("", timeout=60)
    finally:
        out = agent.kubelet.unprepare(DRIVER, *claims)
        assert all(out.claims[c["metadata"]["uid"]].error == "" for c in claims)
        _clear(cluster, agent)
    cluster.ok("DELETE", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaimtemplates/{tmpl['metadata']['name']}")

    # count 2 pinned to one GPU (a class the policy does not match), on empty GPUs: never allocated
    [cls] = load_yaml(DEPLOY / "overlays" / "dra" / "deviceclass.yaml")
    cls["metadata"]["name"] = UNCHECKED_CLASS
    cluster.apply([cls])
    cluster.ok("POST", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims",
               _claim_body("why-pinned", [{"name": "gpu", "count": 2, **_mem("2Gi")}], UNCHECKED_CLASS,
                           [{"matchAttribute": "memslice.io/uuid"}]))
    cluster.ok("POST", f"/api/v1/namespaces/{NS}/pods", _pod_with_claim("why-pinned", "why-pinned"))
    pinned = wait_until("count 2 pinned: scheduled or unschedulable",
                        lambda: _scheduled_or_unschedulable(cluster, "why-pinned"), 120, 0.5, agent.alive)
    assert not pinned["spec"].get("nodeName") and not _claim(cluster, "why-pinned").get("status", {}).get(
        "allocation"), "the real allocator gave count 2 one GPU: the claim policy may admit it again"
    evs = cluster.ok("GET", f"/api/v1/namespaces/{NS}/events?fieldSelector=involvedObject.name=why-pinned,"
                            "reason=FailedScheduling")["items"]
    assert evs and "cannot allocate all claims" in evs[-1]["message"], evs
    _clear(cluster, agent)

    # what the messages recommend: the total in one request, or two requests pinned to one GPU
    pair = _claim_body("pair", [{"name": "a", **_mem("3Gi")}, {"name": "b", **_mem("2Gi")}],
                       constraints=[{"requests": ["a", "b"], "matchAttribute": "memslice.io/uuid"}])
    total = _claim_body("total", [{"name": "gpu", **_mem("5Gi")}])
    for body in (pair, total):
        cluster.ok("POST", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims", body)
        name = body["metadata"]["name"]
        cluster.ok("POST", f"/api/v1/namespaces/{NS}/pods", _pod_with_claim(name, name))
    for name in ("pair", "total"):
        p = wait_until(f"{name} scheduled", lambda n=name: _scheduled_or_unschedulable(cluster, n), 120, 0.5,
                       agent.alive)
        assert p["spec"].get("nodeName") == NODE, p.get("status")
    claims = [_claim(cluster, "pair"), _claim(cluster, "total")]
    results = claims[0]["status"]["allocation"]["devices"]["results"]
    assert len({r["device"] for r in results}) == 1, results  # both requests on one GPU
    assert sorted(r["consumedCapacity"]["memory"] for r in results) == ["2Gi", "3Gi"]
    resp = agent.kubelet.prepare(DRIVER, *claims)
    try:
        for claim in claims:
            uid = claim["metadata"]["uid"]
            entry = resp.claims[uid]
            assert entry.error == "", entry.error
            ids = {i for d in entry.devices for i in d.cdi_device_ids}
            assert len(ids) == 1, entry  # one region, whichever request a container names
            spec = json.loads((agent.cdi / f"memslice.io-{uid}.json").read_text())
            env = agent.container_env(spec, ids.pop().split("=", 1)[1])
            assert env["MEMSLICE_GPU_MEM_LIMIT"] == "5120"  # 3 GiB + 2 GiB; 5 GiB
            tenant = subprocess.Popen([sys.executable, "-c", TENANT], env=env, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                line = tenant.stdout.readline() if tenant.stdout else ""
                assert line, tenant.stderr.read() if tenant.stderr and tenant.poll() is not None else "no output"
                report = json.loads(line)
                assert report["refused_with"] == 2, report
                assert 5120 - 256 < report["allocated_mib"] + CONTEXT_RESERVE_MIB <= 5120, report
                held = gpu_truth(env, env["NVIDIA_VISIBLE_DEVICES"]).processes[tenant.pid] >> 20
                assert 5120 - 256 < held <= 5120, held  # the GPU's own figure, past the shim
            finally:
                tenant.communicate("", timeout=60)
    finally:
        out = agent.kubelet.unprepare(DRIVER, *claims)
        assert all(out.claims[c["metadata"]["uid"]].error == "" for c in claims)
        _clear(cluster, agent)


def compute_claim(name: str, pct: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": NS},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu-mem.memslice.io",
                "capacity": {"requests": {"memory": "1Gi", "compute": pct}}}}]}}}


def claim_pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"nodeSelector": {"memslice-test/pool": "dra"},
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                     "containers": [{"name": "main", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}]}}


def test_the_real_allocator_gives_memory_and_compute_of_one_gpu_and_no_claim_over_100(dra) -> None:
    """Issue 33 on the real control plane: the agent's ResourceSlice (two capacities per device, through the
    API server's validation) lets the real kube-scheduler allocate a claim's memory and compute on one device,
    keeping each device's compute within 100: claims of 60 and 50 % land on different GPUs, a third of 50
    beside the 50, and one of 41 % (memory free on both GPUs) and one of 101 % stay Pending. NodePrepareResources
    writes the allocated share into the limits file."""
    cluster, agent = dra
    cluster.ok("DELETE", f"/api/v1/namespaces/{NS}/pods?gracePeriodSeconds=0")
    wait_until("the earlier claims deallocated", lambda: not [
        c for c in cluster.ok("GET", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims")["items"]
        if c.get("status", {}).get("allocation")], 120, 0.5, agent.alive)
    [sl] = KubeletApi(cluster, NODE).list("ResourceSlice")
    for d in sl["spec"]["devices"]:  # as the API server stored it
        assert d["capacity"]["compute"]["value"] == "100", d
    placed: dict[str, dict[str, Any]] = {}
    for name, pct in (("c60", "60"), ("c50", "50"), ("c50b", "50")):
        cluster.ok("POST", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims", compute_claim(name, pct))
        cluster.ok("POST", f"/api/v1/namespaces/{NS}/pods", claim_pod(name))

        def bound(name: str = name) -> dict[str, Any] | None:
            p = cluster.ok("GET", f"/api/v1/namespaces/{NS}/pods/{name}")
            return p if p["spec"].get("nodeName") else None

        wait_until(f"{name} bound", bound, 120, 0.5, agent.alive)
        placed[name] = cluster.ok("GET", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/{name}")
    results = {n: c["status"]["allocation"]["devices"]["results"][0] for n, c in placed.items()}
    assert {n: r["consumedCapacity"]["compute"] for n, r in results.items()} == {"c60": "60", "c50": "50",
                                                                                  "c50b": "50"}
    assert results["c60"]["device"] != results["c50"]["device"]  # 60 + 50 > 100 on one GPU
    assert results["c50b"]["device"] == results["c50"]["device"]  # 50 + 50: the GPU the 60 is not on
    for name, pct in (("c41", "41"), ("c101", "101")):
        cluster.ok("POST", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims", compute_claim(name, pct))
        cluster.ok("POST", f"/api/v1/namespaces/{NS}/pods", claim_pod(name))
    for name in ("c41", "c101"):
        def unschedulable(name: str = name) -> bool:
            p = cluster.ok("GET", f"/api/v1/namespaces/{NS}/pods/{name}")
            conds = {c["type"]: c for c in p.get("status", {}).get("conditions", [])}
            return conds.get("PodScheduled", {}).get("reason") == "Unschedulable"

        wait_until(f"{name} unschedulable", unschedulable, 120, 0.5, agent.alive)
        claim = cluster.ok("GET", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/{name}")
        assert not claim.get("status", {}).get("allocation"), claim
    claim = placed["c60"]
    resp = agent.kubelet.prepare(DRIVER, claim)
    uid = claim["metadata"]["uid"]
    assert resp.claims[uid].error == "", resp.claims[uid].error
    spec = json.loads((agent.cdi / f"memslice.io-{uid}.json").read_text())
    device = f"{uid}-{results['c60']['shareID']}"
    edits = next(d for d in spec["devices"] if d["name"] == device)["containerEdits"]
    mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
    limits = set(Path(mounts["/run/memslice/limits"]).read_text().splitlines())
    assert {"gpu_compute_request=60", "compute_slot=0", "compute_dir=/run/memslice/compute"} <= limits, limits
    assert agent.kubelet.unprepare(DRIVER, claim).claims[uid].error == ""


def test_first_available_is_allocated_by_the_real_allocator_and_the_container_naming_its_request_is_held(
        dra) -> None:
    """`firstAvailable` on the real kube-scheduler (issue 24.1, checked before only against the stand-in's copy
    of the allocator): the first alternative (64 GiB) fits no 16 GiB GPU, so the real allocator gives the
    second, naming the subrequest ("gpu/small"); the kubelet matches the container's `request: gpu` against
    the driver's answer, so the agent answers the base name, and that container is held to the small share
    (its report and the GPU's own figure)."""
    cluster, agent = dra
    _clear(cluster, agent)
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "alt", "namespace": NS},
            "spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
                {"name": "huge", "deviceClassName": "gpu-mem.memslice.io", **_mem("64Gi")},
                {"name": "small", "deviceClassName": "gpu-mem.memslice.io", **_mem("3Gi")}]}]}}}
    cluster.ok("POST", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims", body)
    cluster.ok("POST", f"/api/v1/namespaces/{NS}/pods", _pod_with_claim("alt", "alt"))
    try:
        p = wait_until("alt scheduled", lambda: _scheduled_or_unschedulable(cluster, "alt"), 120, 0.5, agent.alive)
        assert p["spec"].get("nodeName") == NODE, p.get("status")
        claim = _claim(cluster, "alt")
        [res] = claim["status"]["allocation"]["devices"]["results"]
        assert res["request"] == "gpu/small" and res["consumedCapacity"]["memory"] == "3Gi", res
        uid = claim["metadata"]["uid"]
        entry = agent.kubelet.prepare(DRIVER, claim).claims[uid]
        assert entry.error == "", entry.error
        assert [list(d.request_names) for d in entry.devices] == [["gpu"]]
        [cdi_id] = container_cdi_ids(entry, "gpu")  # the container's resources.claims: [{name: gpu, request: gpu}]
        spec = json.loads((agent.cdi / f"memslice.io-{uid}.json").read_text())
        env = agent.container_env(spec, cdi_id.split("=", 1)[1])
        assert env["MEMSLICE_GPU_MEM_LIMIT"] == "3072"
        tenant = subprocess.Popen([sys.executable, "-c", TENANT], env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = tenant.stdout.readline() if tenant.stdout else ""
            assert line, tenant.stderr.read() if tenant.stderr and tenant.poll() is not None else "no output"
            report = json.loads(line)
            assert report["refused_with"] == 2 and 3072 - 256 < report["allocated_mib"] + CONTEXT_RESERVE_MIB <= 3072
            held = gpu_truth(env, env["NVIDIA_VISIBLE_DEVICES"]).processes[tenant.pid] >> 20
            assert 3072 - 256 < held <= 3072, held
        finally:
            tenant.communicate("", timeout=60)
        assert agent.kubelet.unprepare(DRIVER, claim).claims[uid].error == ""
    finally:
        _clear(cluster, agent)

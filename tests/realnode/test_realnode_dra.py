"""DRA mode on a real node (issue 37, item 3): the real kubelet and containerd (tests/support/kube_node.py) run a pod
whose GPU memory is a ResourceClaim.

The node agent runs as deploy/overlays/dra runs it (`--kubelet-api dra`, its registration socket in the
kubelet's plugin-watcher directory, its DRA socket under the kubelet's plugins directory, its CDI specs where
containerd reads them, its pod's UID for rolling updates); the real kubelet's plugin watcher registers it;
the resourceclaim controller makes the pod's claim from a ResourceClaimTemplate and the real kube-scheduler
allocates it; the real kubelet calls NodePrepareResources and hands the CDI device to containerd, which
injects it (the shim's mounts and env come from the CDI spec alone): inside, a CUDA program on the simulated
GPU is held to the claim's capacity. The device's health reaches the pod's status (allocatedResourcesStatus,
from the agent's health stream); a rolling update of the agent keeps the claim prepared; a deleted pod's
claim is unprepared.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kube_node import CLIENT_SCRIPT, CONTEXT_MIB, NodeAgent, RealNode, node_agent_token, node_images, pod
from kube_node_images import TEST_IMAGE
from kube_real import SCHEDULER_TOKEN, RealCluster, wait_until
from test_deploy_render import NAMESPACE, ROOT, load_yaml
from test_real_deploy import deploy
from test_realnode_multigpu import SCRIPT as TWO_GPU_SCRIPT

# One worker runs both real-node modules, with tests/dra/test_dra_node.py's (test_realnode_deviceplugin.py says why).
pytestmark = [pytest.mark.timeout(900), pytest.mark.xdist_group("kube-dra")]
NODE = "kubelet-dra"
NS = "realnode-dra"
GPUS = "8GiB,8GiB"
QUOTA_MIB = 1024
DRIVER = "memslice.io"
CDI_KIND = "memslice.io/gpu-mem"
TEMPLATE = "gpu-mem-1gi"


class World:
    def __init__(self, cluster: RealCluster, node: RealNode, agent: NodeAgent, procs: list[Any]) -> None:
        self.cluster, self.node, self.agent, self.procs = cluster, node, agent, procs

    def alive(self) -> None:
        self.node.check_alive()
        self.agent.check_alive()
        for p in self.procs:
            p.check_alive()

    def create(self, name: str) -> None:
        self.cluster.ok("POST", f"/api/v1/namespaces/{NS}/pods", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"hostNetwork": True, "automountServiceAccountToken": False, "restartPolicy": "Never",
                     "terminationGracePeriodSeconds": 1, "nodeSelector": {"kubernetes.io/hostname": NODE},
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": TEMPLATE}],
                     "containers": [{"name": "cuda", "image": TEST_IMAGE, "imagePullPolicy": "Never",
                                     "command": ["/bin/sh", "-c", CLIENT_SCRIPT],
                                     "resources": {"claims": [{"name": "gpu"}]}}]}})

    def claim(self, p: dict[str, Any]) -> dict[str, Any]:
        [st] = p["status"]["resourceClaimStatuses"]
        return dict(self.cluster.ok("GET", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/"
                                           f"{st['resourceClaimName']}"))

    def agent_args(self, pod_uid: str) -> list[str]:
        return ["--kubelet-api", "dra", "--simulate", GPUS, "--plugins-registry-dir", str(self.node.plugins_registry),
                "--kubelet-plugins-dir", str(self.node.kubelet_root / "plugins"), "--cdi-dir", str(self.node.cdi_dir),
                "--pod-uid", pod_uid]


def slices(cluster: RealCluster) -> list[dict[str, Any]]:
    items = cluster.ok("GET", f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName={NODE}")["items"]
    return list(items)


@pytest.fixture(scope="module")
def world(real_cluster: RealCluster, cbin: dict[str, str]) -> Iterator[World]:
    import kube_node

    why = kube_node.why_unavailable()
    if why:
        pytest.skip(why)
    cluster = real_cluster
    deploy(cluster, "overlays/dra")
    cluster.ensure_namespace(NS)
    cluster.apply([{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                    "metadata": {"name": TEMPLATE, "namespace": NS},
                    "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                        "deviceClassName": "gpu-mem.memslice.io",
                        "capacity": {"requests": {"memory": f"{QUOTA_MIB}Mi"}}}}]}}}}])
    status, out = cluster.request("POST", "/api/v1/namespaces/kube-system/serviceaccounts",
                                  {"metadata": {"name": "resource-claim-controller"}})
    assert status in (201, 409), out
    root = Path(tempfile.mkdtemp(prefix="ms-rnd-", dir="/tmp"))  # short: Unix socket paths
    archives = node_images(root / "images", cbin)
    node = RealNode(cluster, root / "node", NODE)
    procs: list[Any] = []
    agent = None
    try:
        node.start(archives)
        procs.append(cluster.start_resourceclaim_controller(cluster.token("kube-system", "resource-claim-controller")))
        procs.append(cluster.start_scheduler({
            "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(cluster.kubeconfig("kube-scheduler", SCHEDULER_TOKEN))},
            "leaderElection": {"leaderElect": False}}, "rn-kube-scheduler"))
        kubeconfig = cluster.kubeconfig(f"agent-{NODE}", node_agent_token(cluster, NODE))
        world = World(cluster, node, None, procs)  # type: ignore[arg-type]
        agent = NodeAgent(root / "agent", NODE, kubeconfig, world.agent_args("agent-a"), "agent-a")
        world.agent = agent
        agent.output.wait_for(lambda out: f"registered with the kubelet as DRA driver {DRIVER}" in out, 120,
                              "the kubelet's plugin watcher registering the agent")
        wait_until("the agent's ResourceSlice", lambda: slices(cluster), 60, 0.5, world.alive)
        yield world
    finally:
        status, pods = cluster.request("GET", f"/api/v1/namespaces/{NS}/pods")
        for p in pods.get("items", []) if status == 200 else []:
            cluster.request("DELETE", f"/api/v1/namespaces/{NS}/pods/{p['metadata']['name']}")
        if agent is not None:
            agent.stop()
            world.agent.stop()
        for p in procs:
            p.stop()
        node.stop()
        cluster.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/memslice-node-agent-{NODE}")
        for s in slices(cluster):
            cluster.request("DELETE", f"/apis/resource.k8s.io/v1/resourceslices/{s['metadata']['name']}")
        shutil.rmtree(root, ignore_errors=True)


def test_real_kubelet_prepares_the_claim_and_containerd_injects_it(world: World) -> None:
    """The scheduler allocates the pod's claim on the node; the kubelet prepares it through the agent and
    containerd applies the CDI device: the container's shim (preloaded by the CDI spec's read-only
    /etc/ld.so.preload mount) holds the CUDA program to the claim's 1 GiB."""
    world.create("d1")
    p = world.node.running_client(NS, "d1", world.alive)
    claim = world.claim(p)
    [res] = claim["status"]["allocation"]["devices"]["results"]
    assert (res["driver"], res["pool"], res["consumedCapacity"]["memory"]) == (DRIVER, NODE, "1Gi")
    uid = claim["metadata"]["uid"]
    spec = json.loads((world.node.cdi_dir / f"memslice.io-{uid}.json").read_text())
    assert spec["kind"] == CDI_KIND
    out = world.node.pod_log(p, "cuda")
    assert f"limit-env={QUOTA_MIB} " in out, out  # from the CDI spec: the pod spec sets no env
    assert "preload-read-only" in out and "limits-read-only" in out, out
    assert re.search(r"alloc 400 MiB -> 0\nalloc 200 MiB -> 2\nalloc 100 MiB -> 0\n",
                     world.node.pod_log(p, "cuda", "stdout")), out  # (the shim's refusal line is on stderr)
    assert "cuMemAlloc_v2 of 200.0 MiB refused" in world.node.pod_log(p, "cuda", "stderr"), out
    assert f"info free={QUOTA_MIB - CONTEXT_MIB - 500} total={QUOTA_MIB} devtotal={QUOTA_MIB}" in out, out


def test_a_count_2_claim_runs_on_two_gpus_each_held_to_its_capacity(world: World) -> None:
    """Issue 34, DRA mode with the real kubelet: deploy/examples/vllm-tp2-dra.yaml's template (`count: 2`, here
    1Gi on each GPU) is allocated on both GPUs by the real kube-scheduler, prepared by the real kubelet through the
    agent, and injected by containerd: the container sees both GPUs in the allocation's order, and the shim holds
    a CUDA program on each to 1 GiB. The pod's deletion unprepares the claim."""
    template, _ = load_yaml(ROOT / "deploy" / "examples" / "vllm-tp2-dra.yaml")
    template["metadata"]["namespace"] = NS
    [req] = template["spec"]["spec"]["devices"]["requests"]
    req["exactly"]["capacity"]["requests"]["memory"] = f"{QUOTA_MIB}Mi"
    world.cluster.apply([template])
    world.cluster.ok("POST", f"/api/v1/namespaces/{NS}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "tp", "namespace": NS},
        "spec": {"hostNetwork": True, "automountServiceAccountToken": False, "restartPolicy": "Never",
                 "terminationGracePeriodSeconds": 1, "nodeSelector": {"kubernetes.io/hostname": NODE},
                 "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": template["metadata"]["name"]}],
                 "containers": [{"name": "cuda", "image": TEST_IMAGE, "imagePullPolicy": "Never",
                                 "command": ["/bin/sh", "-c", TWO_GPU_SCRIPT],
                                 "resources": {"claims": [{"name": "gpus"}]}}]}})
    p = world.node.running_client(NS, "tp", world.alive)
    claim = world.claim(p)
    results = claim["status"]["allocation"]["devices"]["results"]
    assert sorted(r["device"] for r in results) == ["gpu-0", "gpu-1"], results
    [sl] = slices(world.cluster)
    uuid_of = {d["name"]: d["attributes"]["uuid"]["string"] for d in sl["spec"]["devices"]}
    out = world.node.pod_log(p, "cuda")
    assert f"limit-env={QUOTA_MIB} visible={','.join(uuid_of[r['device']] for r in results)}" in out, out
    stdout = world.node.pod_log(p, "cuda", "stdout")
    per_gpu = r"alloc 400 MiB -> 0\nalloc 200 MiB -> 2\nalloc 100 MiB -> 0\n" \
              rf"info free={QUOTA_MIB - CONTEXT_MIB - 500} total={QUOTA_MIB} devtotal={QUOTA_MIB}\n"
    assert re.search(rf"gpu=0\ninit 0\n{per_gpu}.*gpu0-exit=0\ngpu=1\ninit 0\n{per_gpu}.*gpu1-exit=0", stdout,
                     re.S), stdout
    spec = world.node.cdi_dir / f"memslice.io-{claim['metadata']['uid']}.json"
    assert spec.exists()
    world.cluster.ok("DELETE", f"/api/v1/namespaces/{NS}/pods/tp")
    wait_until("tp's claim unprepared (its CDI spec removed)", lambda: not spec.exists(), 120, 0.5, world.alive)
    wait_until("tp gone", lambda: pod(world.cluster, NS, "tp") is None, 120, 0.5, world.alive)


def test_device_health_reaches_the_pod_status(world: World) -> None:
    """The kubelet reads the agent's health stream: the container's allocatedResourcesStatus names the claim's
    CDI device, Healthy; after a critical Xid on its GPU (the simulated driver's event), Unhealthy."""
    p = pod(world.cluster, NS, "d1")
    assert p is not None
    claim = world.claim(p)
    [res] = claim["status"]["allocation"]["devices"]["results"]
    want = f"{CDI_KIND}={claim['metadata']['uid']}-{res['shareID']}"

    def health(state: str) -> list[Any] | None:
        q = pod(world.cluster, NS, "d1")
        [cs] = q["status"]["containerStatuses"] if q else [{}]
        got = cs.get("allocatedResourcesStatus") or []
        return got if [r.get("health") for g in got for r in g["resources"]] == [state] else None

    got = wait_until("allocatedResourcesStatus Healthy in d1's status", lambda: health("Healthy"), 120, 1.0,
                     world.alive)
    assert got == [{"name": "claim:gpu",  # the pod's name for the claim
                    "resources": [{"resourceID": want, "health": "Healthy"}]}], got
    gpu = int(res["device"].removeprefix("gpu-"))
    subprocess.run([sys.executable, "-m", "memslice", "sim", "xid", "--gpu", str(gpu), "--xid", "79", "--state",
                    str(world.agent.root / "sim" / "node.state")], check=True, timeout=60)  # fallen off the bus
    got = wait_until("allocatedResourcesStatus Unhealthy in d1's status", lambda: health("Unhealthy"), 120, 1.0,
                     world.alive)
    assert got[0]["resources"][0]["resourceID"] == want


def test_rolling_update_of_the_agent_keeps_the_claim_prepared(world: World) -> None:
    """A new agent pod (another UID) starts beside the old one, then the old one goes (deploy/'s maxSurge):
    the running pod is not restarted, and a new pod's claim is prepared by the new agent."""
    old = world.agent
    new = NodeAgent(old.root, NODE, Path(old.cmd[old.cmd.index("--kubeconfig") + 1]), world.agent_args("agent-b"),
                    "agent-b")
    world.agent = new
    new.output.wait_for(lambda out: f"registered with the kubelet as DRA driver {DRIVER}" in out, 120,
                        "the kubelet registering the new agent")
    old.stop()
    world.create("d2")
    p2 = world.node.running_client(NS, "d2", world.alive)
    assert "client-exit=0" in world.node.pod_log(p2, "cuda")
    assert f"prepared ResourceClaim {NS}/d2-gpu-" in new.output.text(), new.output.text()
    p1 = pod(world.cluster, NS, "d1")
    assert p1 is not None
    [cs] = p1["status"]["containerStatuses"]
    assert cs["restartCount"] == 0 and "running" in cs["state"]


def test_a_deleted_pod_is_unprepared(world: World) -> None:
    """The pod goes: the kubelet calls NodeUnprepareResources, the agent removes the claim's CDI spec."""
    p = pod(world.cluster, NS, "d1")
    assert p is not None
    uid = world.claim(p)["metadata"]["uid"]
    spec = world.node.cdi_dir / f"memslice.io-{uid}.json"
    assert spec.exists()
    world.cluster.ok("DELETE", f"/api/v1/namespaces/{NS}/pods/d1")
    wait_until("d1's claim unprepared (its CDI spec removed)", lambda: not spec.exists(), 120, 0.5, world.alive)
    wait_until("d1 gone", lambda: pod(world.cluster, NS, "d1") is None, 120, 0.5, world.alive)

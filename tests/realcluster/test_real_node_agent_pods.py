"""The device-plugin node agent and its node's pods on the real kube-apiserver, where the stand-in's API
behaviour differed (tests/agent/test_plugin_kube.py keeps the stand-in for its fault hooks: restarts, compaction,
injected errors):

- the reservation reaches the pod as the extender writes it, on a Binding: the API server copies the Binding's
  annotations onto the pod in the update that sets its node, and the agent's watch steers the kubelet to the
  reserved GPU from that;
- deleting a bound pod is graceful: it stays, terminating, until its kubelet reports its containers gone (the
  stand-in deleted at once). The agent must keep the container's region while the pod terminates (its
  processes still run and hold their ledger) and remove it once the pod object is gone.

The agent runs with deploy/'s ServiceAccount and RBAC, its token bound to its pod and node."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kube_real import RealCluster, wait_until
from kubelet_standin import KubeletStandin
from test_plugin_agent import RESOURCE, AgentProcess
from test_real_deploy import deploy, node_agent_token

from memslice.scheduler_extender.kubeio.annotations import reservation_annotations

# one real control plane (the session fixture real_cluster) serves the test_real_* modules: one xdist worker
pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("kube")]
NS = "real-agent-pods"
NODE = "real-d"


@pytest.fixture(scope="module")
def world(real_cluster: RealCluster) -> Iterator[tuple[RealCluster, KubeletStandin, AgentProcess, list[dict]]]:
    cluster = real_cluster
    deploy(cluster, "base")
    cluster.ensure_namespace(NS)
    cluster.register_node(NODE)
    root = Path(tempfile.mkdtemp(prefix="ms-ragent-", dir="/tmp"))  # short: Unix socket paths
    kubeconfig = cluster.kubeconfig(f"agent-{NODE}", node_agent_token(cluster, NODE))
    kubelet = KubeletStandin(root / "dp", root / "pr" / "kubelet.sock").start()
    # no PodResources socket: regions follow the pod watch alone (what this module checks)
    agent = AgentProcess(root, sim_gpus="16GiB,24GiB:1", unit_mib=4, args=(
        "--kubeconfig", str(kubeconfig), "--node-name", NODE, "--pod-resources-socket", "")).start()
    try:
        def gpus() -> list[dict[str, Any]] | None:
            ann = cluster.ok("GET", f"/api/v1/nodes/{NODE}")["metadata"].get("annotations", {})
            return json.loads(ann["memslice.io/gpus"]) if "memslice.io/gpus" in ann else None

        inventory = wait_until(f"the agent's inventory on {NODE}", gpus, 60, 0.5)
        kubelet.wait_registered(RESOURCE)
        yield cluster, kubelet, agent, inventory
    finally:
        agent.stop()
        kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)


def bound(cluster: RealCluster, name: str, gpu_uuid: str, mib: int) -> dict[str, Any]:
    """A pod created, then bound as the extender binds it: one Binding carrying the reservation."""
    cluster.ok("POST", f"/api/v1/namespaces/{NS}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
        "spec": {"schedulerName": "memslice-scheduler", "containers": [
            {"name": "main", "image": "cuda", "resources": {"limits": {RESOURCE: str(mib // 4)}}}]}})
    cluster.ok("POST", f"/api/v1/namespaces/{NS}/pods/{name}/binding", {
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": name, "annotations": reservation_annotations(gpu_uuid, {"main": mib}, 1.8e9)},
        "target": {"apiVersion": "v1", "kind": "Node", "name": NODE}})
    pod = dict(cluster.ok("GET", f"/api/v1/namespaces/{NS}/pods/{name}"))
    assert pod["spec"]["nodeName"] == NODE and pod["metadata"]["annotations"]["memslice.io/gpu-uuid"] == gpu_uuid
    return pod


def test_a_reservation_bound_by_the_api_server_steers_the_kubelet_and_a_terminating_pod_keeps_its_region(
        world) -> None:
    cluster, kubelet, agent, gpus = world
    big = gpus[1]["uuid"]  # best fit alone would choose GPU 0, the smaller one
    train = bound(cluster, "train", big, 400)
    agent.wait_log(f"pod {NS}/train: the extender reserved GPU {big}", "the reservation through the pod watch", 30)
    uid = train["metadata"]["uid"]
    resp = kubelet.admit(uid, NS, "train", [("main", 100)], RESOURCE)["main"]
    assert {i.split("-")[0] for i in kubelet.pods[uid].containers["main"][RESOURCE]} == {"g1"}
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == big and resp.envs["MEMSLICE_GPU_MEM_LIMIT"] == "400"
    region = Path(next(m.host_path for m in resp.mounts if m.container_path == "/run/memslice/region"))
    assert region.is_dir()

    gone = cluster.ok("DELETE", f"/api/v1/namespaces/{NS}/pods/train")  # graceful: it terminates, it stays
    assert gone["metadata"]["deletionTimestamp"]
    # a later event of the same watch: once the agent has it, it has had the deletionTimestamp update too
    bound(cluster, "later", gpus[0]["uuid"], 40)
    agent.wait_log(f"pod {NS}/later: the extender reserved GPU", "the later pod through the pod watch", 30)
    assert region.is_dir(), "the region of a pod still terminating (its processes may run) was removed"
    assert f"of {NS}/train/main" not in agent.log()

    # the kubelet's last word: the pod object goes; then its region goes
    cluster.ok("DELETE", f"/api/v1/namespaces/{NS}/pods/train?gracePeriodSeconds=0")
    agent.wait_log(f"removed region {region.name} of {NS}/train/main", "the removal, logged with its owner", 30)
    assert not region.exists()

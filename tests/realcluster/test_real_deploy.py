"""deploy/ on the real kube-apiserver (issue 28, scenario 1): the rendered manifests are accepted (strict
field validation, the real CEL type-checker for the admission policies); the node agent and the extender
run with the ServiceAccount tokens deploy/'s RBAC grants and the real authorizer allows every call they
make (read from the API server's audit log); the ValidatingAdmissionPolicies, evaluated by the real API
server, refuse a node agent writing another node's annotations or ResourceSlice.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kube_real import RealCluster, wait_until
from test_deploy_render import NAMESPACE, RESOURCE, SCHEDULER_NAME, find, pod_spec, render
from test_e2e_cluster import GpuNode
from test_extender_support import Client

from memslice.kube.config import load_api_client
from memslice.paths import lib_paths
from memslice.scheduler_extender.app import Config, Extender

# one real control plane (the session fixture real_cluster) serves the three test_real_* modules: one xdist worker
pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("kube")]
AGENT_USER = f"system:serviceaccount:{NAMESPACE}:memslice-node-agent"
# deploy/base: the extender is a container of the scheduler's pods, under its account (one pod, one account);
# its requests are told from kube-scheduler's by user agent
EXTENDER_USER = f"system:serviceaccount:{NAMESPACE}:memslice-scheduler"
KUBE_SCHEDULER_AGENT = "kube-scheduler/"
USER_NS = "real-deploy"


def deploy(cluster: RealCluster, rel: str) -> list[dict[str, Any]]:
    """`kubectl apply --server-side -k deploy/<rel>`, with strict field validation."""
    objs = render(rel)
    cluster.apply(sorted(objs, key=lambda o: o["kind"] != "Namespace"))
    return objs


def agent_pod(cluster: RealCluster, node: str) -> dict[str, Any]:
    """The DaemonSet's pod on `node`, as the API server would hold it once scheduled there (created by the
    admin: no DaemonSet controller here). Its token is what the agent runs with."""
    name = f"memslice-node-agent-{node}"
    status, out = cluster.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"serviceAccountName": "memslice-node-agent", "nodeName": node, "automountServiceAccountToken": False,
                 "containers": [{"name": "agent", "image": "memslice:0.1.0"}]}})
    assert status in (201, 409), out
    return dict(cluster.ok("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}"))


def node_agent_token(cluster: RealCluster, node: str) -> str:
    token = cluster.token(NAMESPACE, "memslice-node-agent", agent_pod(cluster, node))
    who = cluster.whoami(token)
    assert who["username"] == AGENT_USER
    assert who["extra"]["authentication.kubernetes.io/node-name"] == [node], who
    return token


def calls_of(cluster: RealCluster, user: str) -> list[dict[str, Any]]:
    """The audit events of `user`'s requests, but kube-scheduler's (the extender shares its account)."""
    return [e for e in cluster.audit(user) if not e.get("userAgent", "").startswith(KUBE_SCHEDULER_AGENT)]


def forbidden(cluster: RealCluster, user: str) -> list[str]:
    return [f"{e['verb']} {e['requestURI']}: {e['responseStatus']}" for e in calls_of(cluster, user)
            if e.get("responseStatus", {}).get("code") in (401, 403)]


@pytest.fixture(scope="module")
def base(real_cluster: RealCluster) -> list[dict[str, Any]]:
    objs = deploy(real_cluster, "base")
    real_cluster.ensure_namespace(USER_NS)
    for n in ("real-a", "real-b"):
        real_cluster.register_node(n)
    return objs


@pytest.fixture(scope="module")
def agent(real_cluster: RealCluster, base: list[dict[str, Any]]) -> Iterator[GpuNode]:
    lib_paths()
    root = Path(tempfile.mkdtemp(prefix="ms-real-", dir="/tmp"))  # short: Unix socket paths
    kubeconfig = real_cluster.kubeconfig("agent-real-a", node_agent_token(real_cluster, "real-a"))
    node = GpuNode(root, "real-a", "16GiB,8GiB", str(kubeconfig))
    try:
        node.kubelet.wait_registered(RESOURCE, timeout=30)
        # the kubelet publishes the device plugin's devices as the node's capacity
        real_cluster.publish_capacity("real-a", {RESOURCE: str(node.kubelet.capacity(RESOURCE))},
                                      {RESOURCE: str(node.kubelet.allocatable(RESOURCE))})
        yield node
    finally:
        node.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_every_rendered_object_is_stored_as_written(real_cluster: RealCluster, base: list[dict[str, Any]]) -> None:
    from kube_real import resource_path

    for obj in base:
        stored = real_cluster.ok("GET", resource_path(obj))
        assert stored["kind"] == obj["kind"] and stored["metadata"]["name"] == obj["metadata"]["name"]
    vap = real_cluster.ok("GET", "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/"
                                 "memslice-annotations-only")
    # the real CEL type-checker found nothing wrong in the policy's expressions
    assert not vap.get("status", {}).get("typeChecking", {}).get("expressionWarnings"), vap["status"]


def test_the_api_server_keeps_the_extender_a_native_sidecar(real_cluster: RealCluster,
                                                            base: list[dict[str, Any]]) -> None:
    """deploy/base's scheduler pods as the real kube-apiserver stores them: the extender an init container with
    restartPolicy Always and its startupProbe (an API server without the SidecarContainers feature would drop
    restartPolicy, and the extender, never completing, would keep kube-scheduler from ever starting); and a Pod
    of that template is admitted as written (a dry run, strict field validation) with its sidecar intact."""
    rendered = pod_spec(find(base, "Deployment", "memslice-scheduler"))
    assert rendered is not None
    (want,) = rendered["initContainers"]
    stored = real_cluster.ok("GET", f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/memslice-scheduler")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "memslice-scheduler-sidecar-check",
                                                           "namespace": NAMESPACE}, "spec": rendered}
    admitted = real_cluster.ok("POST", f"/api/v1/namespaces/{NAMESPACE}/pods?dryRun=All&fieldValidation=Strict",
                               pod)
    for spec in (stored["spec"]["template"]["spec"], admitted["spec"]):
        (ext,) = spec["initContainers"]
        assert (ext["name"], ext.get("restartPolicy")) == ("extender", "Always"), ext
        startup = ext["startupProbe"]
        assert startup["httpGet"] == {**want["startupProbe"]["httpGet"], "scheme": "HTTP"}, startup
        assert startup["failureThreshold"] == want["startupProbe"]["failureThreshold"]
        assert [c["name"] for c in spec["containers"]] == ["kube-scheduler"]


def test_node_agent_publishes_its_gpus_with_only_the_calls_rbac_grants(real_cluster: RealCluster,
                                                                       agent: GpuNode) -> None:
    def gpus() -> list[dict[str, Any]] | None:
        ann = real_cluster.ok("GET", "/api/v1/nodes/real-a")["metadata"].get("annotations", {})
        return json.loads(ann["memslice.io/gpus"]) if "memslice.io/gpus" in ann else None

    inventory = wait_until("the agent's memslice.io/gpus annotation on real-a", gpus, 60, 0.5, agent.alive)
    assert sorted(g["memMiB"] for g in inventory) == [8192, 16384]
    node = real_cluster.ok("GET", "/api/v1/nodes/real-a")
    assert node["status"]["allocatable"][RESOURCE] == str((16384 + 8192) // 4)
    calls = real_cluster.audit(AGENT_USER)
    assert {(e["verb"], e["objectRef"]["resource"]) for e in calls} >= {("patch", "nodes"), ("list", "pods"),
                                                                      ("watch", "pods")}
    assert forbidden(real_cluster, AGENT_USER) == []


def test_extender_binds_with_only_the_calls_rbac_grants(real_cluster: RealCluster, agent: GpuNode) -> None:
    token = real_cluster.token(NAMESPACE, "memslice-scheduler")  # the account of its pods (deploy/base)
    api, _ = load_api_client(str(real_cluster.kubeconfig("extender", token)))
    ext = Extender(api, Config(address="127.0.0.1", port=0, watch_timeout=30)).start()
    client = Client(ext.url)
    try:
        assert ext.wait_synced(30), "extender did not sync"
        assert ext.state.wait_for(lambda s: (v := s.view("real-a")) is not None and len(v.gpus) == 2, 30)
        pod = real_cluster.ok("POST", f"/api/v1/namespaces/{USER_NS}/pods", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "notebook", "namespace": USER_NS},
            "spec": {"schedulerName": SCHEDULER_NAME, "containers": [
                {"name": "main", "image": "cuda", "resources": {"limits": {RESOURCE: "1500"}}}]}})
        assert ext.state.wait_for(lambda s: s.last_rv["pods"] >= int(pod["metadata"]["resourceVersion"]), 30)
        assert client.filter(pod, ["real-a", "real-b"])["NodeNames"] == ["real-a"]
        assert client.bind(pod, "real-a") == ""
        stored = real_cluster.ok("GET", f"/api/v1/namespaces/{USER_NS}/pods/notebook")
        assert stored["spec"]["nodeName"] == "real-a"
        assert stored["metadata"]["annotations"]["memslice.io/gpu-uuid"].startswith("GPU-")
        agent.wait_log(f"pod {USER_NS}/notebook: the extender reserved GPU", "the agent to see the reservation")
    finally:
        client.close()
        ext.stop()
    calls = calls_of(real_cluster, EXTENDER_USER)
    assert {(e["verb"], e["objectRef"]["resource"], e["objectRef"].get("subresource")) for e in calls} >= {
        ("list", "nodes", None), ("watch", "pods", None), ("create", "pods", "binding")}
    assert ("patch", "pods", None) not in {(e["verb"], e["objectRef"]["resource"], e["objectRef"].get(
        "subresource")) for e in calls}  # one write per bind: the Binding carries the reservation (issue 39)
    assert forbidden(real_cluster, EXTENDER_USER) == []


def refusal(cluster: RealCluster, method: str, path: str, body: Any, token: str,
            content_type: str = "application/merge-patch+json") -> str:
    """The API server's refusal. A policy applied moments ago takes effect once admission has loaded it (its
    informers: ~1 s), so a request let through meanwhile is tried again, within a bound."""
    def attempt() -> str | None:  # a dry run: a request let through changes nothing, so it can be tried again
        status, out = cluster.request(method, path + "?dryRun=All", body, token, content_type)
        if status == 200:
            return None
        assert status == 403, f"{method} {path} was not refused: {status} {out}"
        return str(out["message"])

    return str(wait_until(f"{method} {path} refused", attempt, 60, 0.5))


def test_admission_policy_refuses_a_node_agent_writing_another_node(real_cluster: RealCluster,
                                                                    base: list[dict[str, Any]]) -> None:
    token = node_agent_token(real_cluster, "real-a")
    ann = {"metadata": {"annotations": {"memslice.io/gpus": "[]"}}}
    msg = refusal(real_cluster, "PATCH", "/api/v1/nodes/real-b", ann, token)
    assert "memslice-annotations-only" in msg and "a node agent may change only the Node it runs on" in msg
    msg = refusal(real_cluster, "PATCH", "/api/v1/nodes/real-a", {"metadata": {"labels": {"x": "y"}}}, token)
    assert "may not change labels" in msg
    msg = refusal(real_cluster, "PATCH", "/api/v1/nodes/real-a", {"metadata": {"annotations": {"x": "y"}}},
                  token)
    assert "may change only memslice.io/* annotations" in msg
    # and what it may do, it can
    real_cluster.ok("PATCH", "/api/v1/nodes/real-a", {"metadata": {"annotations": {"memslice.io/probe": "1"}}},
                    token, "application/merge-patch+json")


def test_the_extender_cannot_patch_pods_at_all(real_cluster: RealCluster, base: list[dict[str, Any]]) -> None:
    """Its reservation rides on the Binding (issue 39): RBAC no longer grants it pods: patch (nor does
    system:kube-scheduler, which the scheduler's account it runs under in deploy/base has too)."""
    token = real_cluster.token(NAMESPACE, "memslice-scheduler")
    real_cluster.ok("POST", f"/api/v1/namespaces/{USER_NS}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "victim", "namespace": USER_NS},
        "spec": {"containers": [{"name": "main", "image": "cuda"}]}})
    path = f"/api/v1/namespaces/{USER_NS}/pods/victim"
    for body in ({"metadata": {"labels": {"app": "x"}}}, {"metadata": {"annotations": {"memslice.io/x": "1"}}}):
        msg = refusal(real_cluster, "PATCH", path, body, token)
        assert 'cannot patch resource "pods"' in msg, msg


def test_dra_overlay_policy_refuses_another_nodes_resourceslice(real_cluster: RealCluster,
                                                                base: list[dict[str, Any]]) -> None:
    """Last in this module: the DRA overlay replaces the node agent's ClusterRole with DRA mode's."""
    deploy(real_cluster, "overlays/dra")
    token = node_agent_token(real_cluster, "real-a")

    def slice_of(node: str) -> dict[str, Any]:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": f"{node}-memslice.io-probe"},
                "spec": {"driver": "memslice.io", "nodeName": node,
                         "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                         "devices": [{"name": "gpu-0", "attributes": {}}]}}

    def refused() -> str | None:
        """The refusal once the API server's admission has loaded the new policy (its informers: ~1 s);
        a slice let through meanwhile is removed, by the admin."""
        status, out = real_cluster.request("POST", "/apis/resource.k8s.io/v1/resourceslices", slice_of("real-b"),
                                           token)
        if status == 201:
            real_cluster.ok("DELETE", "/apis/resource.k8s.io/v1/resourceslices/real-b-memslice.io-probe")
            return None
        assert status in (403, 422), out  # the policy's validations name no reason: Invalid (422)
        return str(out["message"])

    msg = wait_until("the overlay's policy refusing another node's slice", refused, 30, 0.5)
    assert "may not write ResourceSlices of node 'real-b'" in msg, msg
    real_cluster.ok("POST", "/apis/resource.k8s.io/v1/resourceslices", slice_of("real-a"), token)
    real_cluster.ok("DELETE", "/apis/resource.k8s.io/v1/resourceslices/real-a-memslice.io-probe", token=token)
    # an unbound token (no node) is refused with the policy's own reason
    loose = real_cluster.token(NAMESPACE, "memslice-node-agent")
    status, out = real_cluster.request("POST", "/apis/resource.k8s.io/v1/resourceslices", slice_of("real-a"), loose)
    assert status in (403, 422) and "no node association found" in out["message"], out

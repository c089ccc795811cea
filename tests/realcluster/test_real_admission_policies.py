"""deploy/'s ValidatingAdmissionPolicies on the real kube-apiserver (its CEL, its matching, its messages), where
the cel-python tests cannot vouch for them:

- issue 35.6: deploy/components/require-seccomp, built with deploy/overlays/dra, refuses DRA pods (any
  ResourceClaim) and device-plugin pods that could run a container unconfined, and admits the examples of both
  modes and deploy/examples/simulated-check.yaml, the pod the README tells users to run;
- issue 36.3: the migration recipe of docs/guide.md, its two kustomizations as the guide shows them, rendered
  and applied: the DRA side's agent (ServiceAccount memslice-node-agent-dra, token bound to its pod and node)
  may write its own node's ResourceSlice and is denied another node's, and a claim the agent could not serve
  is denied.

Requests that should be admitted are sent with dryRun=All (admission runs, nothing is stored), so that a policy
that let a forged write through would leave nothing behind.
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kube_real import RealCluster, wait_until
from test_deploy_examples import example
from test_deploy_migration import render_recipe, sa_username
from test_deploy_render import DEPLOY, NAMESPACE, load_yaml
from test_deploy_versions import build, combination, newest

pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("kube")]
NS = "real-policies"
SECCOMP = "memslice-require-seccomp"
DRA_EXAMPLES = DEPLOY / "overlays" / "dra" / "examples"
POLICY_DELAY_S = 60  # a new or changed policy reaches the API server's admission through an informer


def create(cluster: RealCluster, path: str, body: dict[str, Any], token: str | None = None) -> tuple[int, str]:
    """A dry-run create: the HTTP status and, when refused, the message."""
    kw = {} if token is None else {"token": token}
    status, out = cluster.request("POST", f"{path}?dryRun=All&fieldValidation=Strict", body, **kw)
    message = out.get("message", "") if isinstance(out, dict) else str(out)
    return status, " ".join(message.split())


def pods(ns: str = NS) -> str:
    return f"/api/v1/namespaces/{ns}/pods"


def no_profile(pod: dict[str, Any]) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["spec"].get("securityContext", {}).pop("seccompProfile", None)
    return pod


def dra_notebook() -> dict[str, Any]:
    (pod,) = load_yaml(DRA_EXAMPLES / "notebook.yaml")
    return dict(pod)


def dra_elastic() -> dict[str, Any]:
    _, pod = load_yaml(DRA_EXAMPLES / "notebook-elastic.yaml")
    return dict(pod)


@pytest.fixture(scope="module")
def seccomp(real_cluster: RealCluster) -> Iterator[RealCluster]:
    """require-seccomp as deploy/overlays/dra + the component renders it; removed afterwards (the other
    test_real_* modules create pods without a seccomp profile)."""
    cluster = real_cluster
    with tempfile.TemporaryDirectory() as tmp:
        objs = build(newest(), combination(Path(tmp), "overlays/dra", ("require-seccomp",)))
    mine = [o for o in objs if o["metadata"]["name"] == SECCOMP]
    assert sorted(o["kind"] for o in mine) == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    cluster.ensure_namespace(NS)
    cluster.apply(mine)
    try:
        wait_until("require-seccomp in force", lambda: create(cluster, pods(), no_profile(dra_notebook()))[0] == 403,
                   POLICY_DELAY_S, 0.5)
        yield cluster
    finally:
        for kind in ("validatingadmissionpolicybindings", "validatingadmissionpolicies"):
            cluster.request("DELETE", f"/apis/admissionregistration.k8s.io/v1/{kind}/{SECCOMP}")
        wait_until("require-seccomp gone", lambda: create(cluster, pods(), no_profile(dra_notebook()))[0] == 201,
                   POLICY_DELAY_S, 0.5)


def with_unconfined_init(pod: dict[str, Any]) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["spec"]["initContainers"] = [{"name": "setup", "image": "busybox",
                                      "securityContext": {"seccompProfile": {"type": "Unconfined"}}}]
    return pod


ADMITTED = {
    "DRA notebook example": dra_notebook,
    "DRA elastic example": dra_elastic,
    "simulated check pod (README)": lambda: example("simulated-check.yaml"),
    "device-plugin notebook example": lambda: example("notebook.yaml"),
    "2-GPU vLLM example (issue 34)": lambda: load_yaml(DEPLOY / "examples" / "vllm-tp2-dra.yaml")[1],
    "a pod without memslice, unconfined": lambda: {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
                                                   "spec": {"containers": [{"name": "web", "image": "nginx"}]}},
}
DENIED = {
    "DRA notebook, no profile": lambda: no_profile(dra_notebook()),
    "DRA elastic, unconfined init container": lambda: with_unconfined_init(dra_elastic()),
    "simulated check pod, no profile": lambda: no_profile(example("simulated-check.yaml")),
    "device-plugin notebook, no profile": lambda: no_profile(example("notebook.yaml")),
}


def test_require_seccomp_checks_dra_pods_and_admits_every_example(seccomp: RealCluster) -> None:
    for what, make in ADMITTED.items():
        assert create(seccomp, pods(), make()) == (201, ""), what
    for what, make in DENIED.items():
        status, message = create(seccomp, pods(), make())
        assert status == 403, (what, status, message)
        assert "must run every container under the RuntimeDefault" in message and "ld.so.preload" in message, what


# -- the migration recipe ---------------------------------------------------------------------------------------

AGENT_NODE, OTHER_NODE = "dra-06", "dra-07"


@pytest.fixture(scope="module")
def recipe(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    cluster = real_cluster
    rendered = render_recipe(tmp_path_factory.mktemp("recipe"))
    for side in ("my-memslice", "my-memslice-dra"):
        cluster.apply(sorted(rendered[side], key=lambda o: o["kind"] != "Namespace"))
    cluster.ensure_namespace(NS)
    for n in (AGENT_NODE, OTHER_NODE):
        cluster.register_node(n, labels={"memslice.io/kubelet-api": "dra"})
    return rendered


def dra_agent_token(cluster: RealCluster, ds: dict[str, Any], node: str) -> str:
    """The token of the DRA side's DaemonSet pod on `node` (created by the admin: no DaemonSet controller)."""
    sa = ds["spec"]["template"]["spec"]["serviceAccountName"]
    name = f"{ds['metadata']['name']}-{node}"
    status, out = cluster.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"serviceAccountName": sa, "nodeName": node, "automountServiceAccountToken": False,
                 "containers": [{"name": "agent", "image": "memslice:0.1.0"}]}})
    assert status in (201, 409), out
    pod = cluster.ok("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
    token = cluster.token(NAMESPACE, sa, pod)
    who = cluster.whoami(token)
    assert who["username"] == sa_username(ds) and who["extra"]["authentication.kubernetes.io/node-name"] == [node]
    return token


def slice_of(node: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-memslice.io-forged"},
            "spec": {"driver": "memslice.io", "nodeName": node, "devices": [{"name": "gpu-0"}],
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}}}


def test_the_migration_recipe_keeps_both_dra_policies_in_force(recipe: dict[str, list[dict[str, Any]]],
                                                               real_cluster: RealCluster) -> None:
    cluster = real_cluster
    (ds,) = [o for o in recipe["my-memslice-dra"] if o["kind"] == "DaemonSet"]
    stored = cluster.ok("GET", f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/{ds['metadata']['name']}")
    assert stored["spec"]["template"]["spec"]["serviceAccountName"] == "memslice-node-agent-dra"
    token = dra_agent_token(cluster, ds, AGENT_NODE)
    slices = "/apis/resource.k8s.io/v1/resourceslices"

    seen: list[tuple[int, str]] = []

    def forged_refused() -> tuple[int, str] | None:
        seen.append(create(cluster, slices, slice_of(OTHER_NODE), token))
        return seen[-1] if seen[-1][0] == 422 and "may not write ResourceSlices" in seen[-1][1] else None

    try:
        status, message = wait_until("the node policy denies the DRA side's agent another node's slice",
                                     forged_refused, POLICY_DELAY_S, 0.5)
    except AssertionError as err:
        raise AssertionError(f"{err}; the last answer: {seen[-1:]}") from None
    assert f"runs on node '{AGENT_NODE}' and may not write ResourceSlices of node '{OTHER_NODE}'" in message
    # its RBAC (the renamed ClusterRole, bound to the renamed account) lets it write its own node's slice
    assert create(cluster, slices, slice_of(AGENT_NODE), token) == (201, "")
    # the claim policy, matching the DeviceClass by its unchanged name
    [cls] = [o for o in recipe["my-memslice-dra"] if o["kind"] == "DeviceClass"]
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "two", "namespace": NS},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                 "deviceClassName": cls["metadata"]["name"], "count": 2,
                 "capacity": {"requests": {"memory": "4Gi"}}}}],
                 "constraints": [{"matchAttribute": "memslice.io/uuid"}]}}}  # count 2 on one GPU: never allocated
    status, message = create(cluster, f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims", claim)
    assert status == 422 and "gets that many DIFFERENT GPUs from kube-scheduler" in message, (status, message)
    del claim["spec"]["devices"]["constraints"]  # two GPUs of one node, one quota on each (issue 34)
    assert create(cluster, f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims", claim) == (201, "")

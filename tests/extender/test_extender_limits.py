"""The request limits against what kube-scheduler really sends (issue 11, item 2): with nodeCacheCapable
the filter and prioritize bodies are the Pod (as the API server serves it) and the names of the nodes
left after the scheduler's own filters, up to every node. At 50,000 nodes, with the longest node names
(63 characters), such a body is far inside the default --max-body-mib and the JSON value bound, and is
answered; docs/architecture.md, "Request limits", has the figures."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_deploy_examples import example
from test_extender_support import node_obj, running_cluster

from memslice.scheduler_extender.app import Config
from memslice.scheduler_extender.cli import DEFAULT_MAX_BODY_MIB
from memslice.scheduler_extender.edge.server import (
    BYTES_PER_VALUE,
    MAX_JSON_VALUES,
    SMALL_BODY,
    ByteBudget,
    json_values_bound,
    request_cost,
)

MIB = 1 << 20
NAME_STYLES: dict[str, Callable[[int], str]] = {
    "eks": lambda i: f"ip-10-{i >> 16 & 255}-{i >> 8 & 255}-{i & 255}.ec2.internal",  # 26-28 characters
    "gke": lambda i: f"gke-cluster-pool-{i % 9}-abcdef12-{i:04x}"[:32],  # 32
    "longest": lambda i: f"gke-production-ml-training-europe-west4-a100-pool-{i % 9}-{i:08x}-{i % 7:04d}"[:63],
}


def scheduler_pod() -> dict[str, Any]:
    """deploy/examples/notebook.yaml as kube-scheduler holds it: created with `kubectl apply` (the
    last-applied annotation), defaulted by the API server, service account volume, managedFields, status."""
    pod = example("notebook.yaml")
    applied = json.dumps(pod, separators=(",", ":"))
    md = pod["metadata"]
    md.update(namespace="team-ml", uid="5f0c9d6e-0b1a-4c2d-8e3f-9a8b7c6d5e4f", resourceVersion="123456789",
              creationTimestamp="2026-11-23T10:00:00Z",
              annotations={"kubectl.kubernetes.io/last-applied-configuration": applied + "\n"},
              managedFields=[{"manager": "kubectl-client-side-apply", "operation": "Update", "apiVersion": "v1",
                              "time": "2026-11-23T10:00:00Z", "fieldsType": "FieldsV1",
                              "fieldsV1": {"f:metadata": {"f:annotations": {".": {}, "f:kubectl.kubernetes.io/"
                                                                             "last-applied-configuration": {}},
                                                          "f:labels": {".": {}, "f:app": {}}},
                                           "f:spec": {"f:containers": {'k:{"name":"notebook"}': {
                                               ".": {}, "f:image": {}, "f:name": {}, "f:resources": {}}}}}}])
    spec = pod["spec"]
    spec.update(restartPolicy="Always", terminationGracePeriodSeconds=30, dnsPolicy="ClusterFirst",
                serviceAccountName="default", serviceAccount="default", priority=0,
                enableServiceLinks=True, preemptionPolicy="PreemptLowerPriority",
                tolerations=[{"key": f"node.kubernetes.io/{t}", "operator": "Exists", "effect": "NoExecute",
                              "tolerationSeconds": 300} for t in ("not-ready", "unreachable")],
                volumes=[{"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                        "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}])
    token = {"name": "kube-api-access-x7k2p", "readOnly": True,
             "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}
    for c in spec["containers"]:
        c.update(terminationMessagePath="/dev/termination-log", terminationMessagePolicy="File",
                 imagePullPolicy="Always", volumeMounts=[token])
    pod["status"] = {"phase": "Pending", "qosClass": "Burstable", "conditions": [{
        "type": "PodScheduled", "status": "False", "lastProbeTime": None,
        "lastTransitionTime": "2026-11-23T10:00:01Z", "reason": "Unschedulable",
        "message": "0/50000 nodes are available: 50000 Insufficient memslice.io/gpu-mem."}]}
    return pod


def filter_body(nodes: int, style: str) -> bytes:
    """ExtenderArgs as kube-scheduler's json.Marshal writes it in node-cache mode (compact, Nodes null)."""
    names = [NAME_STYLES[style](i) for i in range(nodes)]
    return json.dumps({"Pod": scheduler_pod(), "Nodes": None, "NodeNames": names}, separators=(",", ":")).encode()


@pytest.mark.parametrize("style", sorted(NAME_STYLES))
@pytest.mark.parametrize("nodes", [5_000, 50_000])
def test_real_filter_bodies_are_far_inside_the_limits(nodes: int, style: str) -> None:
    body = filter_body(nodes, style)
    assert len(body) * 2 <= DEFAULT_MAX_BODY_MIB * MIB, f"{len(body) / MIB:.2f} MiB: less than 2x margin"
    assert json_values_bound(body) * 4 <= MAX_JSON_VALUES
    assert request_cost(len(body)) <= 128 * MIB  # what one request may cost (issue 11)
    if nodes == 5_000 and style != "longest":  # the usual large cluster goes through the small budget
        assert len(body) <= SMALL_BODY


def test_the_default_limit_is_the_cli_default() -> None:
    assert Config().max_body_bytes == DEFAULT_MAX_BODY_MIB * MIB


def test_a_50000_node_filter_with_the_longest_names_is_answered() -> None:
    body = filter_body(50_000, "longest")
    with running_cluster() as c:
        c.start()
        c.add_node(node_obj(NAME_STYLES["longest"](7), [81920]))
        status, raw, _ = c.c.raw("POST", "/filter", body)
        assert status == 200, raw[:300]
        answer = json.loads(raw)
        assert answer["NodeNames"] == [NAME_STYLES["longest"](7)] and len(answer["FailedNodes"]) == 49_999


def count_values(v: Any) -> int:
    """JSON values and object keys in a parsed document."""
    if isinstance(v, dict):
        return 1 + sum(1 + count_values(x) for x in v.values())
    if isinstance(v, list):
        return 1 + sum(count_values(x) for x in v)
    return 1


json_docs = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=5) | st.dictionaries(st.text(max_size=5), kids, max_size=5), max_leaves=40)


@settings(max_examples=200, deadline=None)
@given(doc=json_docs, compact=st.booleans())
def test_the_value_bound_is_never_below_the_values_parsed(doc: Any, compact: bool) -> None:
    text = json.dumps(doc, separators=(",", ":") if compact else None).encode()
    assert json_values_bound(text) >= count_values(doc)
    assert request_cost(len(text)) >= len(text) + BYTES_PER_VALUE * count_values(doc)


def test_byte_budget_waits_with_a_bound_and_serves_in_turn() -> None:
    budget = ByteBudget(100)
    assert budget.acquire(1000, 0) == 100  # larger than the budget: runs alone
    assert budget.acquire(1, 0.05) is None  # bounded wait, then refused
    got: list[int | None] = []
    waiter = threading.Thread(target=lambda: got.append(budget.acquire(60, 10)))
    waiter.start()
    budget.release(100)
    waiter.join(10)
    assert got == [60] and budget.held == 60

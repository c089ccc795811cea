"""deploy/base's ValidatingAdmissionPolicy (issue 11, item 4): the extender's and the node agent's service
accounts may change only memslice.io/* annotations of pods and nodes. Its CEL is evaluated here with
cel-python on objects as the API server stores them (managedFields, resourceVersion, status), for the
writes the components really make and for the writes a compromised component would try."""

from __future__ import annotations

import copy
import json
import sys
from typing import Any

import celpy
import pytest
from test_deploy_examples import example
from test_deploy_render import NAMESPACE, Manifest, find, render

from memslice import contract

EXTENDER = f"system:serviceaccount:{NAMESPACE}:memslice-extender"
AGENT = f"system:serviceaccount:{NAMESPACE}:memslice-node-agent"
NODE_NAME_KEY = "authentication.kubernetes.io/node-name"


def policy() -> Manifest:
    objs = render("base")
    vap = find(objs, "ValidatingAdmissionPolicy", "memslice-annotations-only")
    binding = find(objs, "ValidatingAdmissionPolicyBinding", "memslice-annotations-only")
    assert binding["spec"]["policyName"] == vap["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"] and "matchResources" not in binding["spec"]
    assert vap["spec"]["failurePolicy"] == "Fail"
    return vap


def evaluate(expr: str, activation: dict[str, Any]) -> Any:
    limit = sys.getrecursionlimit()  # celpy.Environment() raises the process-wide limit: keep other tests' own
    try:
        env = celpy.Environment()
        return env.program(env.compile(expr)).evaluate(activation)
    finally:
        sys.setrecursionlimit(limit)


def admit(user: str, old: Manifest, new: Manifest, node_name: str | None = None) -> list[str]:
    """The messages of the validations that deny this UPDATE ([] = admitted), as the API server would
    evaluate the policy: match constraints, match conditions, variables in order, validations."""
    spec = policy()["spec"]
    kind = new["kind"]
    resource = {"Pod": "pods", "Node": "nodes"}[kind]
    if not any("UPDATE" in r["operations"] and resource in r["resources"]
               for r in spec["matchConstraints"]["resourceRules"]):
        return []
    extra = {NODE_NAME_KEY: [node_name]} if node_name else {}
    request = {"operation": "UPDATE", "kind": {"group": "", "version": "v1", "kind": kind},
               "resource": {"group": "", "version": "v1", "resource": resource},
               "userInfo": {"username": user, "groups": ["system:serviceaccounts"], "extra": extra}}
    act: dict[str, Any] = {"object": celpy.json_to_cel(new), "oldObject": celpy.json_to_cel(old),
                           "request": celpy.json_to_cel(request)}
    if not all(evaluate(c["expression"], act) for c in spec.get("matchConditions", [])):
        return []
    variables: dict[str, Any] = {}
    for v in spec.get("variables", []):
        variables[v["name"]] = evaluate(v["expression"], {**act, "variables": celpy.celtypes.MapType(variables)})
    act["variables"] = celpy.celtypes.MapType(variables)
    return [v["message"] for v in spec["validations"] if not evaluate(v["expression"], act)]


def stored(obj: Manifest, rv: int = 100) -> Manifest:
    """`obj` as the API server keeps it: server-set metadata and a status."""
    obj = copy.deepcopy(obj)
    md = obj["metadata"]
    md.setdefault("namespace", "default") if obj["kind"] == "Pod" else None
    md.update(uid="0d1f6c2e-8c4b-4d2a-9d6e-2b7f1c3a4e5f", resourceVersion=str(rv),
              creationTimestamp="2026-11-23T10:00:00Z",
              managedFields=[{"manager": "kubectl", "operation": "Update", "apiVersion": "v1",
                              "time": "2026-11-23T10:00:00Z", "fieldsType": "FieldsV1",
                              "fieldsV1": {"f:spec": {}}}])
    obj["status"] = ({"phase": "Pending", "qosClass": "Burstable"} if obj["kind"] == "Pod"
                     else {"capacity": {"memslice.io/gpu-mem": "16384"}, "conditions": [{"type": "Ready",
                                                                                          "status": "True"}]})
    return obj


def written(old: Manifest, change: Any, manager: str) -> Manifest:
    """`old` after a write: `change` applied, then what the API server adds (resourceVersion, managedFields)."""
    new = copy.deepcopy(old)
    change(new)
    md = new["metadata"]
    md["resourceVersion"] = str(int(old["metadata"]["resourceVersion"]) + 1)
    md["managedFields"] = [*old["metadata"]["managedFields"],
                           {"manager": manager, "operation": "Update", "apiVersion": "v1",
                            "time": "2026-11-23T10:00:01Z", "fieldsType": "FieldsV1",
                            "fieldsV1": {"f:metadata": {"f:annotations": {}}}}]
    return new


def pod() -> Manifest:
    p = example("notebook.yaml")
    p["metadata"]["annotations"] = {"team": "ml"}
    p["metadata"]["labels"] = {"app": "notebook"}
    return stored(p)


def node() -> Manifest:
    return stored({"apiVersion": "v1", "kind": "Node",
                   "metadata": {"name": "gpu-1", "labels": {"memslice.io/gpu": "true"}},
                   "spec": {"providerID": "aws:///us-east-1a/i-0abc"}})


def reserve(p: Manifest) -> None:
    p["metadata"]["annotations"].update({contract.ANN_GPU_UUID: "GPU-1", contract.ANN_GPU_MEM: '{"notebook":4096}',
                                         contract.ANN_ASSUMED_AT: "1790000000.0"})


def inventory(n: Manifest) -> None:
    n["metadata"].setdefault("annotations", {})[contract.ANN_GPUS] = json.dumps([{"uuid": "GPU-1"}])


ALLOWED = [
    ("extender writes a reservation", EXTENDER, pod, reserve, None),
    ("extender removes its reservation", EXTENDER,
     lambda: written(pod(), reserve, "memslice-extender"),
     lambda p: [p["metadata"]["annotations"].pop(k) for k in contract.RESERVATION_ANNOTATIONS], None),
    ("node agent writes its GPU inventory", AGENT, node, inventory, "gpu-1"),
    ("node agent without a node-bound token", AGENT, node, inventory, None),
    ("anyone else changes anything", "system:serviceaccount:kube-system:cluster-admin", node,
     lambda n: n["spec"].update(unschedulable=True), None),
]
DENIED = [
    ("extender changes a label", EXTENDER, pod, lambda p: p["metadata"]["labels"].update(app="x"), "labels"),
    ("extender changes an image", EXTENDER, pod,
     lambda p: p["spec"]["containers"][0].update(image="evil:latest"), "spec"),
    ("extender binds through spec.nodeName", EXTENDER, pod, lambda p: p["spec"].update(nodeName="gpu-1"), "spec"),
    ("extender adds another annotation", EXTENDER, pod,
     lambda p: p["metadata"]["annotations"].update({"kubectl.kubernetes.io/restartedAt": "x"}), "annotations"),
    ("extender removes another annotation", EXTENDER, pod, lambda p: p["metadata"]["annotations"].pop("team"),
     "annotations"),
    ("extender adds a finalizer", EXTENDER, pod, lambda p: p["metadata"].update(finalizers=["x/y"]), "finalizers"),
    ("extender sets an owner", EXTENDER, pod, lambda p: p["metadata"].update(ownerReferences=[
        {"apiVersion": "v1", "kind": "Pod", "name": "x", "uid": "u"}]), "owner"),
    ("node agent taints a node", AGENT, node,
     lambda n: n["spec"].update(taints=[{"key": "k", "effect": "NoSchedule"}]), "spec"),
    ("node agent cordons a node", AGENT, node, lambda n: n["spec"].update(unschedulable=True), "spec"),
    ("node agent relabels a node", AGENT, node, lambda n: n["metadata"]["labels"].pop("memslice.io/gpu"),
     "labels"),
    ("node agent writes another node's inventory", AGENT, node, inventory, "only the Node it runs on"),
]


@pytest.mark.parametrize(("case", "user", "old", "change", "node_name"), ALLOWED, ids=[c[0] for c in ALLOWED])
def test_the_components_writes_are_admitted(case: str, user: str, old: Any, change: Any,
                                           node_name: str | None) -> None:
    before = old()
    assert admit(user, before, written(before, change, "memslice"), node_name) == [], case


@pytest.mark.parametrize(("case", "user", "old", "change", "words"), DENIED, ids=[c[0] for c in DENIED])
def test_everything_else_they_could_write_is_denied(case: str, user: str, old: Any, change: Any,
                                                    words: str) -> None:
    before = old()
    node_name = "gpu-2" if "another node" in case else ("gpu-1" if before["kind"] == "Node" else None)
    denied = admit(user, before, written(before, change, "memslice"), node_name)
    assert denied and any(words in m for m in denied), (case, denied)


def test_binding_is_not_matched() -> None:
    """The extender's Binding is a CREATE of pods/binding: outside the policy's rules."""
    for rule in policy()["spec"]["matchConstraints"]["resourceRules"]:
        assert "CREATE" not in rule["operations"] and not any(r.startswith("pods/") for r in rule["resources"])

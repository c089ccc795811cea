"""deploy/overlays/dra's claim policy (issue 24.2, 24.8, 36.1, 34): what the node agent would refuse after binding
(unequal quotas on several GPUs, admin access), and what kube-scheduler would never allocate (count > 1 pinned to
one GPU), is refused at admission instead; claims on N GPUs of one node (count: N, requests kept apart with the
same capacity) are admitted. The policy's CEL is evaluated with cel-python as
the API server evaluates it (variables in order, then validations) on claims and templates."""

from __future__ import annotations

import copy
from typing import Any

import celpy
import pytest
from test_deploy_admission import evaluate
from test_deploy_render import Manifest, find, render

CLASS = "gpu-mem.memslice.io"


def policy() -> Manifest:
    objs = render("overlays/dra")
    vap = find(objs, "ValidatingAdmissionPolicy", "memslice-claims-one-gpu")
    binding = find(objs, "ValidatingAdmissionPolicyBinding", "memslice-claims-one-gpu")
    assert binding["spec"]["validationActions"] == ["Deny"] and vap["spec"]["failurePolicy"] == "Fail"
    return vap


def admit(obj: Manifest) -> list[str]:
    spec = policy()["spec"]
    resource = {"ResourceClaim": "resourceclaims", "ResourceClaimTemplate": "resourceclaimtemplates"}[obj["kind"]]
    assert any(resource in r["resources"] and "CREATE" in r["operations"]
               for r in spec["matchConstraints"]["resourceRules"])
    request = {"operation": "CREATE", "resource": {"group": "resource.k8s.io", "version": "v1",
                                                   "resource": resource}}
    act: dict[str, Any] = {"object": celpy.json_to_cel(obj), "request": celpy.json_to_cel(request)}
    variables: dict[str, Any] = {}
    for v in spec["variables"]:
        variables[v["name"]] = evaluate(v["expression"], {**act, "variables": celpy.celtypes.MapType(variables)})
    act["variables"] = celpy.celtypes.MapType(variables)
    return [v["message"] for v in spec["validations"] if not evaluate(v["expression"], act)]


def claim(*requests: dict[str, Any], constraints: list[dict[str, Any]] | None = None) -> Manifest:
    devices: dict[str, Any] = {"requests": list(requests)}
    if constraints is not None:
        devices["constraints"] = constraints
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "team"}, "spec": {"devices": devices}}


def template(c: Manifest) -> Manifest:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": c["metadata"],
            "spec": {"spec": copy.deepcopy(c["spec"])}}


def exactly(name: str, cls: str = CLASS, **kw: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": cls, "capacity": {"requests": {"memory": "4Gi"}}, **kw}}


PIN = [{"matchAttribute": "memslice.io/uuid"}]
APART = [{"distinctAttribute": "memslice.io/uuid"}]
ADMITTED = {
    "one share": claim(exactly("gpu")),
    "the total in one request": claim(exactly("gpu", capacity={"requests": {"memory": "8Gi"}})),
    "two requests pinned by name": claim(exactly("a"), exactly("b"),
                                         constraints=[{"requests": ["a", "b"], "matchAttribute": "memslice.io/uuid"}]),
    "first available, one device": claim({"name": "gpu", "firstAvailable": [
        {"name": "big", "deviceClassName": CLASS}, {"name": "small", "deviceClassName": CLASS}]}),
    "another class beside one share": claim(exactly("gpu"), exactly("nic", cls="nic.example.com", count=2)),
    "another class's subrequest of 2 beside ours": claim({"name": "gpu", "firstAvailable": [
        {"name": "ours", "deviceClassName": CLASS}, {"name": "nics", "deviceClassName": "nic.example.com",
                                                     "count": 2}]}),
    "no devices": {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                   "metadata": {"name": "c", "namespace": "team"}, "spec": {}},
    # issue 34: N GPUs of one node, one quota on each
    "count 2": claim(exactly("gpu", count=2)),
    "count 16": claim(exactly("gpu", count=16)),
    "subrequest of 2": claim({"name": "gpu", "firstAvailable": [{"name": "two", "deviceClassName": CLASS,
                                                                 "count": 2}]}),
    "two requests apart, same capacity": claim(exactly("a"), exactly("b"), constraints=APART),
    "two requests apart by name, one of count 2": claim(exactly("a", count=2), exactly("b"), constraints=[
        {"requests": ["a", "b"], "distinctAttribute": "memslice.io/uuid"}]),
}
SEVERAL = "requests in one claim are prepared as ONE quota per GPU"
MANY = "gets that many DIFFERENT GPUs from kube-scheduler"
ALL = "allocationMode All on gpu-mem.memslice.io would take a share of every GPU of the node"
OVER = "count over 16 on gpu-mem.memslice.io"
ADMIN = "adminAccess to gpu-mem.memslice.io devices is not served"
REFUSED = {
    # what the messages recommended before issue 36.1: kube-scheduler never allocates it (test_real_dra.py)
    "count 2 pinned": (claim(exactly("gpu", count=2), constraints=PIN), MANY),
    "count 2 pinned by name": (claim(exactly("gpu", count=2), constraints=[
        {"requests": ["gpu"], "matchAttribute": "memslice.io/uuid"}]), MANY),
    "count 17": (claim(exactly("gpu", count=17)), OVER),
    "all devices pinned": (claim(exactly("gpu", allocationMode="All"), constraints=PIN), ALL),
    "two requests": (claim(exactly("a"), exactly("b")), SEVERAL),
    "pinned to another attribute": (claim(exactly("a"), exactly("b"),
                                          constraints=[{"matchAttribute": "memslice.io/productName"}]), SEVERAL),
    "pin misses a request": (claim(exactly("a"), exactly("b"),
                                   constraints=[{"requests": ["a"], "matchAttribute": "memslice.io/uuid"}]), SEVERAL),
    "apart, different capacities": (claim(exactly("a"), exactly("b", capacity={"requests": {"memory": "8Gi"}}),
                                          constraints=APART), SEVERAL),
    "apart, one capacity unset": (claim(exactly("a"), {"name": "b", "exactly": {"deviceClassName": CLASS}},
                                        constraints=APART), SEVERAL),
    "apart misses a request": (claim(exactly("a"), exactly("b"), constraints=[
        {"requests": ["a"], "distinctAttribute": "memslice.io/uuid"}]), SEVERAL),
    "apart, a subrequest": (claim(exactly("a"), {"name": "b", "firstAvailable": [
        {"name": "x", "deviceClassName": CLASS}]}, constraints=APART), SEVERAL),
    "all devices": (claim(exactly("gpu", allocationMode="All")), ALL),
    "subrequest of 2 pinned": (claim({"name": "gpu", "firstAvailable": [
        {"name": "two", "deviceClassName": CLASS, "count": 2}]}, constraints=PIN), MANY),
    "admin access": (claim(exactly("gpu", adminAccess=True)), ADMIN),
}


@pytest.mark.parametrize("what", list(ADMITTED))
@pytest.mark.parametrize("wrap", [lambda c: c, template], ids=["claim", "template"])
def test_claims_the_agent_prepares_are_admitted(what, wrap) -> None:
    assert admit(wrap(ADMITTED[what])) == []


@pytest.mark.parametrize("what", list(REFUSED))
@pytest.mark.parametrize("wrap", [lambda c: c, template], ids=["claim", "template"])
def test_claims_the_agent_would_refuse_after_binding_are_refused_up_front(what, wrap) -> None:
    obj, message = REFUSED[what]
    [got] = admit(wrap(obj))
    assert message in " ".join(got.split())


def test_policy_objects_are_valid_v1() -> None:
    from test_deploy_manifests import validate_strict

    for obj in render("overlays/dra"):
        if obj["metadata"]["name"] == "memslice-claims-one-gpu":
            validate_strict(obj)
    for obj in (*ADMITTED.values(), *(o for o, _ in REFUSED.values())):
        if obj["spec"]:
            validate_strict(obj)
            validate_strict(template(obj))

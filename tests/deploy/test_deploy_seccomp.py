"""deploy/components/require-seccomp (issue 25 item 10, issue 35 item 6): pods that ask for memslice.io/gpu-mem,
or use ResourceClaims (DRA mode: a policy cannot see a claim's class), are admitted only when every container
runs under the RuntimeDefault (or a Localhost) seccomp profile, because under Unconfined a process can
`unshare -Urm` and bind-mount over /etc/ld.so.preload and the limits file. Its CEL is evaluated with cel-python
(test_deploy_admission's machinery) on real pods: the examples of both modes, and each way a pod could leave a
container unconfined; tests/realcluster/test_real_admission_policies.py runs it on the real kube-apiserver."""

from __future__ import annotations

import copy
from typing import Any

import celpy
import pytest
from test_deploy_admission import evaluate
from test_deploy_examples import example
from test_deploy_render import DEPLOY, RESOURCE, Manifest, find, load_yaml, render

REL = "overlays/require-seccomp"


def policy() -> Manifest:
    objs = render(REL)
    vap = find(objs, "ValidatingAdmissionPolicy", "memslice-require-seccomp")
    binding = find(objs, "ValidatingAdmissionPolicyBinding", "memslice-require-seccomp")
    assert binding["spec"]["policyName"] == vap["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"] and "matchResources" not in binding["spec"]
    assert vap["spec"]["failurePolicy"] == "Fail"
    return vap


def admit(pod: Manifest) -> list[str]:
    """The messages of the validations that deny creating `pod` ([] = admitted), evaluated as the API server
    does: match constraints, match conditions, variables in order, validations."""
    spec = policy()["spec"]
    if not any("CREATE" in r["operations"] and "pods" in r["resources"]
               for r in spec["matchConstraints"]["resourceRules"]):
        return []
    request = {"operation": "CREATE", "kind": {"group": "", "version": "v1", "kind": "Pod"},
               "userInfo": {"username": "alice", "groups": ["system:authenticated"]}}
    act: dict[str, Any] = {"object": celpy.json_to_cel(pod), "request": celpy.json_to_cel(request)}
    if not all(evaluate(c["expression"], act) for c in spec.get("matchConditions", [])):
        return []
    variables: dict[str, Any] = {}
    for v in spec.get("variables", []):
        variables[v["name"]] = evaluate(v["expression"], {**act, "variables": celpy.celtypes.MapType(variables)})
    act["variables"] = celpy.celtypes.MapType(variables)
    return [v["message"] for v in spec["validations"] if not evaluate(v["expression"], act)]


def notebook() -> Manifest:
    return example("notebook.yaml")


DRA_EXAMPLES = DEPLOY / "overlays" / "dra" / "examples"


def dra_notebook() -> Manifest:
    (pod,) = load_yaml(DRA_EXAMPLES / "notebook.yaml")
    return pod


def dra_elastic() -> Manifest:
    _, pod = load_yaml(DRA_EXAMPLES / "notebook-elastic.yaml")
    return pod


def unset_pod_profile(p: Manifest) -> Manifest:
    p["spec"]["securityContext"].pop("seccompProfile", None)
    return p


def with_container_profile(p: Manifest, kind: str, which: str = "containers") -> Manifest:
    for c in p["spec"].get(which, []):
        c.setdefault("securityContext", {})["seccompProfile"] = {"type": kind}
    return p


def with_init(p: Manifest, profile: str | None = None, gpu: bool = False) -> Manifest:
    c: dict[str, Any] = {"name": "setup", "image": "busybox"}
    if profile:
        c["securityContext"] = {"seccompProfile": {"type": profile}}
    if gpu:
        c["resources"] = {"limits": {RESOURCE: 1}}
    p["spec"]["initContainers"] = [c]
    return p


ADMITTED = [
    ("the example, RuntimeDefault for the pod", notebook),
    ("RuntimeDefault on each container, none for the pod", lambda: with_container_profile(
        unset_pod_profile(notebook()), "RuntimeDefault")),
    ("a Localhost profile", lambda: with_container_profile(unset_pod_profile(notebook()), "Localhost")),
    ("an init container inheriting the pod's", lambda: with_init(notebook())),
    ("DRA: the example, RuntimeDefault for the pod", dra_notebook),
    ("DRA: the elastic example", dra_elastic),
    ("DRA: RuntimeDefault on each container", lambda: with_container_profile(unset_pod_profile(dra_notebook()),
                                                                            "RuntimeDefault")),
    ("the simulated check pod the README tells users to run", lambda: example("simulated-check.yaml")),
    ("a pod without memslice memory, unconfined", lambda: {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
        "spec": {"containers": [{"name": "web", "image": "nginx", "resources": {"limits": {"cpu": "1"}}}]}}),
]

DENIED = [
    ("no profile at all (Unconfined, as Pod Security baseline allows)", lambda: unset_pod_profile(notebook())),
    ("Unconfined for the pod", lambda: {**notebook(), "spec": {
        **notebook()["spec"], "securityContext": {"seccompProfile": {"type": "Unconfined"}}}}),
    ("the pod's RuntimeDefault overridden by a container", lambda: with_container_profile(notebook(), "Unconfined")),
    ("an unconfined init container", lambda: with_init(notebook(), "Unconfined")),
    ("an unconfined ephemeral container", lambda: {**notebook(), "spec": {**notebook()["spec"], "ephemeralContainers": [
        {"name": "debug", "image": "busybox", "securityContext": {"seccompProfile": {"type": "Unconfined"}}}]}}),
    ("memory asked in requests only, no profile", lambda: _requests_only(unset_pod_profile(notebook()))),
    ("DRA: a pod with a claim, no profile", lambda: unset_pod_profile(dra_notebook())),
    ("DRA: the claim named by no container, no profile", lambda: _claim_unnamed(unset_pod_profile(dra_notebook()))),
    ("DRA: a claim by name, an unconfined sidecar", lambda: _by_name(with_container_profile(
        {**dra_notebook(), "spec": {**dra_notebook()["spec"], "containers": [
            *dra_notebook()["spec"]["containers"], {"name": "sidecar", "image": "busybox"}]}}, "Unconfined"))),
    ("DRA: an unconfined init container", lambda: with_init(dra_elastic(), "Unconfined")),
    ("memory asked by an init container, no profile", lambda: with_init(unset_pod_profile(
        {**notebook(), "spec": {**notebook()["spec"], "containers": [
            {"name": "main", "image": "busybox"}]}}), gpu=True)),
]


def _claim_unnamed(p: Manifest) -> Manifest:
    for c in p["spec"]["containers"]:
        c["resources"].pop("claims", None)
    return p


def _by_name(p: Manifest) -> Manifest:
    p["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "shared-gpu-mem"}]
    return p


def _requests_only(p: Manifest) -> Manifest:
    c = p["spec"]["containers"][0]
    c["resources"]["limits"].pop(RESOURCE)
    return p


@pytest.mark.parametrize(("case", "make"), ADMITTED, ids=[c for c, _ in ADMITTED])
def test_pods_under_runtime_default_or_without_memslice_are_admitted(case: str, make: Any) -> None:
    assert admit(copy.deepcopy(make())) == [], case


@pytest.mark.parametrize(("case", "make"), DENIED, ids=[c for c, _ in DENIED])
def test_memslice_pods_that_could_unshare_are_denied(case: str, make: Any) -> None:
    messages = admit(copy.deepcopy(make()))
    assert len(messages) == 1 and "RuntimeDefault" in messages[0] and "ld.so.preload" in messages[0], case


def test_every_example_pod_of_both_modes_passes() -> None:
    pods = [(name, example(name)) for name in ("notebook.yaml", "notebook-oversubscribed.yaml", "training-job.yaml",
                                               "simulated-check.yaml")]
    pods += [(p.name, o) for p in sorted(DRA_EXAMPLES.glob("*.yaml")) for o in load_yaml(p)
             if o.get("kind") in ("Pod", "Job")]
    assert {n for n, _ in pods} >= {"simulated-check.yaml", "notebook-elastic.yaml"}
    for name, obj in pods:
        pod = obj if obj["kind"] == "Pod" else {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                                                "spec": obj["spec"]["template"]["spec"]}
        assert admit(pod) == [], name


def test_the_option_adds_only_the_policy() -> None:
    base = {(o["kind"], o["metadata"]["name"]) for o in render("base")}
    assert {(o["kind"], o["metadata"]["name"]) for o in render(REL)} - base == {
        ("ValidatingAdmissionPolicy", "memslice-require-seccomp"),
        ("ValidatingAdmissionPolicyBinding", "memslice-require-seccomp")}
    # DRA mode: tests/deploy/test_deploy_versions.py builds deploy/overlays/dra with it


@pytest.mark.parametrize("values", [DEPLOY / "examples" / "jupyterhub-values.yaml",
                                    DRA_EXAMPLES / "jupyterhub-values.yaml"], ids=["device-plugin", "dra"])
def test_every_jupyterhub_profile_of_both_modes_passes(values) -> None:
    """Each profile's pod as KubeSpawner's make_pod builds it from the profile's traits and the values' hub-wide
    KubeSpawner config (pod_security_context), serialized as KubeSpawner sends it."""
    import asyncio

    import yaml
    from jupyterhub.traitlets import ByteSpecification
    from kubernetes_asyncio.client import ApiClient
    from kubespawner.objects import make_pod

    async def serialized(pod: Any) -> dict[str, Any]:
        async with ApiClient() as client:
            return dict(client.sanitize_for_serialization(pod))

    doc = yaml.safe_load(values.read_text())
    hub_wide = doc["hub"]["config"]["KubeSpawner"]
    profiles = doc["singleuser"]["profileList"]
    assert profiles
    for profile in profiles:
        o = {**hub_wide, **profile["kubespawner_override"]}
        for trait in ("mem_limit", "mem_guarantee"):
            if trait in o:
                o[trait] = ByteSpecification().validate(None, o[trait])
        o["annotations"] = o.pop("extra_annotations", {})
        pod = asyncio.run(serialized(make_pod(name="jupyter-u", cmd=["jupyterhub-singleuser"], port=8888,
                                              image=o.pop("image", "jupyter"), **o)))
        assert RESOURCE in str(pod) or pod["spec"].get("resourceClaims"), profile["display_name"]
        assert admit(pod) == [], profile["display_name"]
        assert admit(unset_pod_profile(pod)), profile["display_name"]  # without it: refused

"""deploy/core's memslice-gpu-count policy (issue 34, item 1: "a total not divisible by N is refused at admission
by name"): a pod carrying `memslice.io/gpu-count` is refused when it is created if the count is not 1..16, if a
container's memslice.io/gpu-mem or memslice.io/gpu-compute total does not split evenly over the N GPUs, or if N > 1
on a pod that asks no memslice.io/gpu-mem (a DRA pod: its claim's `count: N` decides). Its CEL is evaluated with
cel-python as the API server does (the Kubernetes CEL functions it uses, quantity() and the lists/strings
extensions, given here), and each refusal says what the extender says at filter for the same pod, so the two
cannot drift apart. tests/realcluster/test_realcluster_spanning.py runs the policy on the real kube-apiserver."""

from __future__ import annotations

import copy
import sys
from typing import Any

import celpy
import pytest
from celpy import celtypes
from kubernetes.utils import parse_quantity
from test_deploy_examples import example
from test_deploy_render import DEPLOY, RESOURCE, Manifest, find, load_yaml, render

from memslice.contract import ANN_GPU_COUNT, RESOURCE_COMPUTE
from memslice.scheduler_extender.placement.resources import RequestError, pod_request

POLICY = "memslice-gpu-count"
FUNCTIONS = {  # what the API server's CEL environment adds to the standard one, as far as the policy uses it
    "quantity": lambda s: celtypes.IntType(int(parse_quantity(str(s)))),
    "asInteger": lambda q: q,
    "indexOf": lambda xs, x: celtypes.IntType(list(xs).index(x)),
    "substring": lambda s, a, b: celtypes.StringType(str(s)[int(a):int(b)]),
}


def policy(rel: str = "base") -> Manifest:
    objs = render(rel)
    vap = find(objs, "ValidatingAdmissionPolicy", POLICY)
    binding = find(objs, "ValidatingAdmissionPolicyBinding", POLICY)
    assert binding["spec"]["policyName"] == POLICY and binding["spec"]["validationActions"] == ["Deny"]
    assert "matchResources" not in binding["spec"] and vap["spec"]["failurePolicy"] == "Fail"
    return vap


def evaluate(expr: str, activation: dict[str, Any]) -> Any:
    limit = sys.getrecursionlimit()  # celpy.Environment() raises the process-wide limit: keep other tests' own
    try:
        env = celpy.Environment()
        return env.program(env.compile(expr), functions=FUNCTIONS).evaluate(activation)
    finally:
        sys.setrecursionlimit(limit)


def admit(pod: Manifest, old: Manifest | None = None) -> list[str]:
    """The messages of the validations that deny creating `pod` (or updating `old` to it): [] = admitted."""
    spec = policy()["spec"]
    operation = "CREATE" if old is None else "UPDATE"
    assert any(operation in r["operations"] and "pods" in r["resources"]
               for r in spec["matchConstraints"]["resourceRules"])
    request = {"operation": operation, "kind": {"group": "", "version": "v1", "kind": "Pod"},
               "userInfo": {"username": "alice", "groups": ["system:authenticated"]}}
    act: dict[str, Any] = {"object": celpy.json_to_cel(pod), "request": celpy.json_to_cel(request),
                           "oldObject": celpy.json_to_cel(old)}
    if not all(evaluate(c["expression"], act) for c in spec.get("matchConditions", [])):
        return []
    variables: dict[str, Any] = {}
    for v in spec.get("variables", []):
        variables[v["name"]] = evaluate(v["expression"], {**act, "variables": celtypes.MapType(variables)})
    act["variables"] = celtypes.MapType(variables)
    return [" ".join(str(evaluate(v["messageExpression"], act)).split()) for v in spec["validations"]
            if not evaluate(v["expression"], act)]


def spanning(count: str | None, mem: dict[str, str | None], compute: dict[str, str] | None = None,
             init: dict[str, str] | None = None) -> Manifest:
    """A device-plugin pod: containers by name with their memslice.io/gpu-mem total (None: no memslice ask)."""
    def container(name: str, devices: str | None) -> dict[str, Any]:
        limits = {} if devices is None else {RESOURCE: devices}
        if compute and name in compute:
            limits[RESOURCE_COMPUTE] = compute[name]
        return {"name": name, "image": "vllm/vllm-openai", "resources": {"limits": limits}}

    pod: Manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "tp", "namespace": "default"},
                     "spec": {"schedulerName": "memslice-scheduler",
                              "containers": [container(n, d) for n, d in mem.items()]}}
    if init:
        pod["spec"]["initContainers"] = [container(n, d) for n, d in init.items()]
    if count is not None:
        pod["metadata"]["annotations"] = {ANN_GPU_COUNT: count}
    return pod


def extender_says(pod: Manifest) -> str:
    """What the extender answers at filter for the same pod (resources.pod_request)."""
    with pytest.raises(RequestError) as exc:
        pod_request(pod)
    return str(exc.value)


def refused_as(pod: Manifest, words: str | None) -> None:
    """The policy admits `pod` (words None; the extender then reads its request), or refuses it with one message
    starting with `words`, word for word what the extender says at filter."""
    got = admit(pod)
    if words is None:
        assert got == [] and pod_request(pod) is not None
        return
    [message] = got
    assert message.startswith(words), message
    assert extender_says(pod) == message


@pytest.mark.parametrize("pod", [
    spanning("2", {"serve": "32768"}),
    spanning("4", {"serve": "16Ki"}),  # 16384 devices, whatever the quantity's form
    spanning("1", {"serve": "4097"}),  # one GPU: nothing to split
    spanning("16", {"a": "1600", "b": None}),
    spanning("2", {"serve": "4096"}, compute={"serve": "60"}, init={"warm": "2048", "cpu": None}),
    spanning(None, {"serve": "4097"}),  # no annotation: not this policy's
    spanning("1", {"cpu": None}),  # one GPU, no memslice ask: harmless
], ids=["2", "quantity-form", "one", "sixteen", "init-and-compute", "no-annotation", "one-no-ask"])
def test_pods_that_can_work_are_admitted(pod: Manifest) -> None:
    assert admit(pod) == []


@pytest.mark.parametrize("raw", ["0", "17", "two", "1.5", "-2", "", " 2 x", "9" * 40])
def test_a_bad_count_is_refused_naming_the_value_and_the_fix(raw: str) -> None:
    pod = spanning(raw, {"serve": "4096"})
    [message] = admit(pod)
    assert message == f"annotation {ANN_GPU_COUNT}={raw[:16]!r} is not a whole number of GPUs between 1 and 16 " \
                      f"(e.g. \"2\"); fix or remove it"
    assert extender_says(pod).endswith(message)  # the extender's words at filter (after "pod: ")


@pytest.mark.parametrize("mem, init, compute, words", [
    ({"serve": "4097"}, None, None, "container 'serve': memslice.io/gpu-mem=4097 cannot be split evenly over "
                                    "memslice.io/gpu-count=2 GPUs; request a multiple of 2 (e.g. 4098)"),
    ({"a": "4096", "b": "1025"}, None, None, "container 'b': memslice.io/gpu-mem=1025"),
    ({"a": "4096"}, {"warm": "3Ki"}, None, None),  # 3072: divisible, admitted
    ({"a": "4096"}, {"warm": "1001"}, None, "container 'warm': memslice.io/gpu-mem=1001"),
    ({"a": "4096"}, None, {"a": "75"}, "container 'a': memslice.io/gpu-compute=75 cannot be split evenly over "
                                       "memslice.io/gpu-count=2 GPUs; request a multiple of 2 (e.g. 76)"),
])
def test_a_total_not_divisible_is_refused_at_admission_by_name(mem, init, compute, words) -> None:
    pod = spanning("2", mem, compute, init)
    refused_as(pod, words)


@pytest.mark.parametrize("annotations, words", [
    ({"memslice.io/gpu-mem-limit": "8191"}, "container 'lab': memslice.io/gpu-mem-limit (MiB)=8191 cannot be split "
                                            "evenly over memslice.io/gpu-count=2 GPUs; request a multiple of 2 "
                                            "(e.g. 8192)"),
    ({"memslice.io/gpu-mem-limit": "8192", "memslice.io/gpu-mem-limit.cpu": "3"}, None),  # cpu asks no memory
    ({"memslice.io/gpu-mem-limit.lab": "6145"}, "container 'lab': memslice.io/gpu-mem-limit (MiB)=6145"),
    ({"memslice.io/gpu-mem-limit": "8193", "memslice.io/gpu-mem-limit.lab": "8192"}, None),  # its own wins
])
def test_an_elastic_limit_not_divisible_is_refused_at_admission_by_name(annotations, words) -> None:
    """The elastic limit (MiB) is a total too (the pod-wide annotation, or the container's own)."""
    pod = spanning("2", {"lab": "2048", "cpu": None})
    pod["metadata"]["annotations"].update(annotations)
    refused_as(pod, words)


def test_gpu_count_on_a_pod_without_gpu_mem_names_the_claims_count() -> None:
    """A DRA pod (deploy/examples/vllm-tp2-dra.yaml) with `memslice.io/gpu-count: "2"`: kube-scheduler never calls
    the extender for it (no managed resource), so the annotation would be ignored; the policy refuses it."""
    _, pod = load_yaml(DEPLOY / "examples" / "vllm-tp2-dra.yaml")
    assert admit(pod) == []
    pod = copy.deepcopy(pod)
    pod["metadata"]["annotations"] = {ANN_GPU_COUNT: "2"}
    [message] = admit(pod)
    assert message.startswith("annotation memslice.io/gpu-count=2 asks for GPUs of one node for a pod that asks no "
                              "memslice.io/gpu-mem") and "ask for count: 2 in the ResourceClaim" in message
    assert pod_request(pod) is None  # what the extender would do: nothing (it is never called for this pod)


def test_an_update_is_checked_only_when_it_changes_the_count() -> None:
    good, odd = spanning("2", {"serve": "4096"}), spanning("2", {"serve": "4097"})
    assert admit(odd, old=odd) == []  # a pod from before the policy: other writers' updates go through
    bad = copy.deepcopy(good)
    bad["metadata"]["annotations"][ANN_GPU_COUNT] = "3"
    assert admit(bad, old=good) == ["container 'serve': memslice.io/gpu-mem=4096 cannot be split evenly over "
                                    "memslice.io/gpu-count=3 GPUs; request a multiple of 3 (e.g. 4098)"]
    plain = spanning(None, {"serve": "4096"})
    assert admit(bad, old=plain) and admit(good, old=plain) == []


def test_the_examples_are_admitted_and_both_modes_carry_the_policy() -> None:
    for name in ("notebook.yaml", "training-job.yaml", "simulated-check.yaml"):
        obj = example(name)
        pod = obj if obj["kind"] == "Pod" else {"kind": "Pod", "metadata": obj["spec"]["template"].get(
            "metadata", {}), "spec": obj["spec"]["template"]["spec"]}
        assert admit(pod) == []
    assert policy("overlays/dra")["spec"] == policy("base")["spec"]  # deploy/core: both modes

"""Elastic memory through the extender (issue 13): pods are scheduled by their request (memslice.io/gpu-mem),
the limit annotation is validated at filter and bind (a bad value: an Error naming the annotation and the fix,
nothing written), and bind records the limits for the node agent next to the reservation."""

from __future__ import annotations

import json

import pytest
from test_extender_support import node_obj, pod_obj, running_cluster

LIMIT_RECORD = "memslice.io/gpu-mem-limit-mib"


def test_pods_fit_by_request_and_bind_records_the_limits():
    """Two notebooks whose limits add up to more than the 4 GiB GPU both fit: only requests are charged."""
    with running_cluster() as cl:
        cl.start()
        cl.add_node(node_obj("n1", [4096]))
        a = cl.add_pod(pod_obj("a", {"lab": 512, "side": 256},
                               annotations={"memslice.io/gpu-mem-limit.lab": "2560"}))
        b = cl.add_pod(pod_obj("b", {"lab": 512}, annotations={"memslice.io/gpu-mem-limit": "2048"}))
        plain = cl.add_pod(pod_obj("plain", {"main": 1024}))
        for pod in (a, b, plain):
            assert cl.c.filter(pod, ["n1"])["NodeNames"] == ["n1"]
            assert cl.c.bind(pod, "n1") == ""
        cl.wait_used("n1", [512 + 256 + 512 + 1024])
        ann = {n: cl.kube.get("Pod", "default", n)["metadata"]["annotations"] for n in ("a", "b", "plain")}
        assert json.loads(ann["a"][LIMIT_RECORD]) == {"lab": 2560}   # "side" has no limit above its request
        assert json.loads(ann["b"][LIMIT_RECORD]) == {"lab": 2048}
        assert LIMIT_RECORD not in ann["plain"]
        assert json.loads(ann["a"]["memslice.io/gpu-mem-mib"]) == {"lab": 512, "side": 256}


@pytest.mark.parametrize("annotations, words", [
    ({"memslice.io/gpu-mem-limit": "8Gi"}, "annotation memslice.io/gpu-mem-limit='8Gi' is not a whole number"),
    ({"memslice.io/gpu-mem-limit.lab": "0"}, "annotation memslice.io/gpu-mem-limit.lab='0' is not a whole number"),
    ({"memslice.io/gpu-mem-limit": "99999999999"}, "between 1 and 1048576"),
])
def test_a_malformed_limit_is_an_error_at_filter_and_bind_and_nothing_is_written(annotations, words):
    with running_cluster() as cl:
        cl.start()
        cl.add_node(node_obj("n1", [4096]))
        pod = cl.add_pod(pod_obj("nb", {"lab": 512}, annotations=annotations))
        result = cl.c.filter(pod, ["n1"])
        assert words in result["Error"] and "fix or remove it" in result["Error"] and not result["NodeNames"]
        assert words in cl.c.bind(pod, "n1")
        stored = cl.kube.get("Pod", "default", "nb")
        assert not stored["spec"].get("nodeName") and stored["metadata"]["annotations"] == annotations
        assert cl.used("n1") == [0]


def test_a_limit_below_the_request_is_refused_at_bind_naming_both():
    with running_cluster() as cl:
        cl.start()
        cl.add_node(node_obj("n1", [4096]))
        pod = cl.add_pod(pod_obj("nb", {"lab": 1024}, annotations={"memslice.io/gpu-mem-limit": "512"}))
        error = cl.c.bind(pod, "n1")
        assert "is 512 MiB, below its request of 1024 MiB" in error and "at least the request" in error
        stored = cl.kube.get("Pod", "default", "nb")
        assert not stored["spec"].get("nodeName") and set(stored["metadata"]["annotations"]) == {
            "memslice.io/gpu-mem-limit"}
        assert cl.used("n1") == [0]

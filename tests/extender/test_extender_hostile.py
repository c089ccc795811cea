"""Malformed and hostile requests: never a crash, never a state change, always a 4xx or an `Error` that
says what is wrong. Property-based (hypothesis) for the JSON, plus the transport-level cases."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_extender_support import Cluster, node_obj, plain_node, pod_obj, running_cluster

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with running_cluster() as c:
        c.start()
        c.add_node(node_obj("n", [8000, 16000]))
        c.add_node(plain_node("cpu"))
        victim = c.add_pod(pod_obj("victim-7f3a", {"main": 1000}))
        assert c.c.bind(victim, "n") == ""
        c.wait_used("n", [1000, 0])
        # the bind's own writes seen too: until then its pending charge stands in for them, and the watch event
        # that retires it could land mid-test and change the snapshot the tests compare against
        c.caught_up()
        assert c.state.counts()["pending"] == 0, c.state.counts()
        yield c


def snapshot(c: Cluster) -> tuple:
    return c.kube.resource_version, [(v.name, v.gpus, v.unplaced_mib) for v in c.state.views()], \
        c.state.counts()


scalars = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) \
    | st.text(max_size=20)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=20)

field_names = st.sampled_from(["Pod", "NodeNames", "Nodes", "PodName", "PodNamespace", "PodUID", "Node",
                               "NodeNameToMetaVictims", "NodeNameToVictims", "pod", "nodenames", "metadata",
                               "spec", "containers"])
shaped = st.dictionaries(field_names, json_values, max_size=6)


def check_answer(verb: str, status: int, body) -> None:
    assert status in (200, 400), (status, body)
    if status == 400:
        assert isinstance(body, dict) and isinstance(body.get("Error"), str) and body["Error"], body
    elif verb == "filter":
        assert set(body) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    elif verb == "bind":
        assert set(body) == {"Error"}


@SETTINGS
@given(verb=st.sampled_from(["filter", "prioritize", "bind", "preempt"]), body=json_values | shaped)
def test_random_json_never_crashes_or_changes_state(cluster: Cluster, verb: str, body) -> None:
    before = snapshot(cluster)
    status, answer = cluster.c.post(verb, body)
    check_answer(verb, status, answer)
    assert snapshot(cluster) == before


quantities = st.one_of(st.integers(-2**66, 2**66).map(str), st.integers(-5, 10**6),
                       st.floats(allow_nan=False), st.text(max_size=12), st.none(),
                       st.lists(st.integers(), max_size=2),
                       st.sampled_from(["-1", "1e40", "0.5", "1Ei", "12Mi", "3k", "1e-3", "NaN", "", " 7 "]))


@SETTINGS
@given(qty=quantities, names=st.lists(st.text(min_size=1, max_size=30) | st.sampled_from(["n", "cpu"]),
                                       max_size=5))
def test_hostile_quantities_and_node_names(cluster: Cluster, qty, names) -> None:
    pod = pod_obj("hostile", {"main": 1})
    pod["spec"]["containers"][0]["resources"] = {"limits": {"memslice.io/gpu-mem": qty}}
    before = snapshot(cluster)
    status, body = cluster.c.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": names})
    check_answer("filter", status, body)
    if status == 200 and not body["Error"]:
        outcome = [n for n in names if n in (body["NodeNames"] or [])]
        assert all(n in names for n in body["NodeNames"])
        for n in names:  # every node is in exactly one bucket
            buckets = [n in outcome, n in body["FailedNodes"], n in body["FailedAndUnresolvableNodes"]]
            assert sum(buckets) == 1, (n, body)
    elif status == 200:
        assert "memslice.io/gpu-mem" in body["Error"] and body["NodeNames"] is None
    status, body = cluster.c.post("prioritize", {"Pod": pod, "Nodes": None, "NodeNames": names})
    assert status in (200, 400)
    if status == 200:
        assert [hp["Host"] for hp in body] == names and all(0 <= hp["Score"] <= 10 for hp in body)
    assert snapshot(cluster) == before


@pytest.mark.parametrize("bad", ["", 7, None, ["n"], {"n": 1}, "x" * 300, True])
@pytest.mark.parametrize("first", [True, False])
def test_a_bad_name_among_known_nodes_is_a_400(cluster: Cluster, bad, first: bool) -> None:
    """Names are looked up before they are checked one by one (a known node's name is valid by construction):
    a bad one still gets a 400 naming it, in filter and in the prioritize that follows a filter."""
    pod = pod_obj("mixed", {"main": 1000})
    pod["metadata"]["uid"] = "mixed-uid"
    names = [bad, "n"] if first else ["n", bad]
    where = f"NodeNames[{0 if first else 1}]"
    before = snapshot(cluster)
    assert cluster.c.filter(pod, ["n"])["NodeNames"] == ["n"]  # leaves a memo for prioritize
    status, body = cluster.c.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": names})
    assert status == 400 and where in body["Error"] and body["NodeNames"] is None, body
    assert cluster.c.filter(pod, ["n"])["NodeNames"] == ["n"]
    status, body = cluster.c.post("prioritize", {"Pod": pod, "Nodes": None, "NodeNames": names})
    assert status == 400 and where in body["Error"], body
    assert snapshot(cluster) == before


@pytest.mark.parametrize(("qty", "words"), [("-4096", "negative"), ("1e30", "absurdly large"),
                                            ("0.5", "whole number"), ("four", "not a Kubernetes quantity")])
def test_bad_quantity_is_an_error_naming_value_and_fix(cluster: Cluster, qty: str, words: str) -> None:
    pod = pod_obj("bad", {"main": 1})
    pod["spec"]["containers"][0]["resources"]["limits"]["memslice.io/gpu-mem"] = qty
    before = snapshot(cluster)
    body = cluster.c.filter(pod, ["n"])
    assert words in body["Error"] and repr(qty) in body["Error"] and body["NodeNames"] is None
    stored = cluster.kube.put(pod)  # a stand-in accepts what a real API server would refuse
    error = cluster.c.bind(stored, "n")
    assert words in error
    after = cluster.kube.get("Pod", "default", "bad")
    assert not after["spec"].get("nodeName") and "annotations" not in after["metadata"]
    cluster.kube.delete("Pod", "default", "bad")
    cluster.caught_up()
    assert snapshot(cluster)[1:] == before[1:]


def test_unknown_policy_and_unknown_bind_targets(cluster: Cluster) -> None:
    pod = cluster.add_pod(pod_obj("pol", {"main": 100}, policy="fastest"))
    body = cluster.c.filter(pod, ["n"])
    assert "memslice.io/policy='fastest'" in body["Error"] and "binpack, spread" in body["Error"]
    assert "policy" in cluster.c.bind(pod, "n")
    ok = cluster.add_pod(pod_obj("ok", {"main": 100}))
    assert "unknown to the extender" in cluster.c.bind(ok, "nowhere")
    assert "no memslice GPUs" in cluster.c.bind(ok, "cpu")
    ghost = pod_obj("ghost-pod", {"main": 1})
    ghost["metadata"]["uid"] = "ghost-uid"
    assert "does not exist" in cluster.c.bind(ghost, "n")
    assert not cluster.kube.get("Pod", "default", "ok")["spec"].get("nodeName")


def test_case_mismatch_gets_a_hint(cluster: Cluster) -> None:
    status, body = cluster.c.post("filter", {"pod": pod_obj("x", {"main": 1}), "nodenames": ["n"]})
    assert status == 400 and "'pod'" in body["Error"] and "case-sensitive" in body["Error"]
    status, body = cluster.c.post("bind", {"podName": "x", "PodNamespace": "d", "PodUID": "", "Node": "n"})
    assert status == 400 and "PodName" in body["Error"]


def raw_exchange(cluster: Cluster, data: bytes) -> tuple[int, bytes]:
    assert cluster.ext is not None
    with socket.create_connection(("127.0.0.1", cluster.ext.port), timeout=10) as s:
        s.sendall(data)
        chunks = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
            if b"\r\n\r\n" in b"".join(chunks):
                head, _, rest = b"".join(chunks).partition(b"\r\n\r\n")
                length = int(next((line.split(b":")[1] for line in head.split(b"\r\n")
                                   if line.lower().startswith(b"content-length")), b"0"))
                if len(rest) >= length:
                    return int(head.split(b" ")[1]), rest[:length]
    raise AssertionError("no answer")


def test_transport_level_abuse(cluster: Cluster) -> None:
    before = snapshot(cluster)
    status, body = raw_exchange(cluster, b"POST /filter HTTP/1.1\r\nHost: x\r\n"
                                         b"Content-Length: 999999999999\r\n\r\n")
    assert status == 413 and b"larger than the limit" in body
    status, body = raw_exchange(cluster, b"POST /filter HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status == 411 and b"Content-Length" in body
    status, body = raw_exchange(cluster, b"POST /bind HTTP/1.1\r\nHost: x\r\n"
                                         b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
    assert status == 411
    for data, code in [(b"not json", 400), (b"[" * 200_000, 400), (b'{"Pod": ' * 50_000, 400)]:
        status, raw, _ = cluster.c.raw("POST", "/filter", data)
        assert status == code and json.loads(raw)["Error"]
    assert cluster.c.raw("GET", "/filter")[0] == 405
    assert cluster.c.raw("POST", "/nonsense", b"{}")[0] == 404
    assert cluster.c.raw("DELETE", "/bind")[0] == 405
    status, body = cluster.c.post("filter", {"Pod": pod_obj("x", {"main": 1}), "NodeNames": ["n"] * 100_001})
    assert status == 400 and "at most" in body["Error"]
    for depth, code in ((300, 200), (1000, 400)):  # Nodes mode echoes the passing Node objects back
        node = json.dumps({**node_obj("n", [8000]), "status": "DEEP"})
        node = node.replace('"DEEP"', '{"x":' * depth + "{}" + "}" * depth)  # deeper than orjson writes
        body = f'{{"Pod":{json.dumps(pod_obj("x", {"main": 1}))},"Nodes":{{"items":[{node}]}}}}'.encode()
        status, raw, _ = cluster.c.raw("POST", "/filter", body)
        assert status == code, (depth, raw[:200])
        if code == 200:
            assert [n["metadata"]["name"] for n in json.loads(raw)["Nodes"]["items"]] == ["n"]
        else:
            assert "nested too deeply" in json.loads(raw)["Error"]
    # still serving, nothing changed
    assert cluster.c.filter(pod_obj("x", {"main": 1}), ["n"])["NodeNames"] == ["n"]
    assert snapshot(cluster) == before

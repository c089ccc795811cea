"""The extender's fast paths give the answers of the slow ones: memoised fit/score summaries in ClusterState
against decisions.py, prioritize reusing its filter's summaries against a fresh prioritize, the
hand-written HostPriorityList encoding against json, and the lean HTTP request parser against what the
stdlib accepts and refuses."""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_budget import QUICK, examples
from test_extender_support import Cluster, node_obj, plain_node, pod_obj, running_cluster

from memslice.lean_http import BoundedHTTPServer, ConnLimits, LeanRequestHandler
from memslice.scheduler_extender import wire
from memslice.scheduler_extender.app import Config
from memslice.scheduler_extender.edge.metrics import Metrics
from memslice.scheduler_extender.edge.verbs import Verbs
from memslice.scheduler_extender.index import nameids
from memslice.scheduler_extender.index.fitmemo import FitMemo
from memslice.scheduler_extender.kubeio.annotations import reservation_annotations
from memslice.scheduler_extender.placement import decisions
from memslice.scheduler_extender.placement.state import CHANGE_LOG, Charge, ClusterState

SIZES = (1, 500, 1000, 3000, 4000, 8000, 9000, 16000, 20000)


@pytest.fixture(autouse=True, params=["native", "python"])
def memo_index(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every memo test runs with both implementations of the node-name index (nameids.py): the C one the
    package builds, and the Python reference it falls back to."""
    if request.param == "python":
        monkeypatch.setattr(nameids, "_native", None)
    return str(request.param)


def check_summaries(state: ClusterState, names: list[str], memo: FitMemo | None = None) -> None:
    """The memo's verdicts, HostPriority JSON and fast path against decisions.py on the current views."""
    memo = memo or FitMemo(state)
    for devices in SIZES:
        for policy in ("binpack", "spread"):
            verdicts = memo.verdicts(names, (devices, policy))
            host_jsons = memo.host_json(names, (devices, policy))
            for name, verdict, host_json in zip(names, verdicts, host_jsons, strict=True):
                view = state.view(name)
                if view is None:
                    assert verdict is None and json.loads(host_json) == {"Host": name, "Score": 0}, name
                    continue
                need = devices * view.unit_mib
                f = decisions.fit(view, need)
                assert verdict == (f.ok, f.unresolvable, f.reason, decisions.score(view, need, policy)), name
                assert json.loads(host_json) == {"Host": name, "Score": decisions.score(view, need, policy)}
            fits = {n: v is not None and v[0] for n, v in zip(names, verdicts, strict=True)}
            split = memo.split(names, (devices, policy))  # filter's slow path: the same verdicts, split
            pairs = list(zip(names, verdicts, strict=True))
            assert split.passed == [n for n in names if fits[n]]
            assert split.failed == {n: v[2] for n, v in pairs if v and not v[0] and not v[1]}
            assert split.unresolvable == {n: v[2] for n, v in pairs if v and v[1]}
            assert split.unknown == [n for n, v in pairs if v is None]
            for some in (names, [n for n in names if fits[n]], *([n] for n in names)):
                # filter's fast path answers exactly when the pod fits on every node
                assert memo.all_fit(some, (devices, policy)) == all(fits[n] for n in some), (some, devices)


def test_memoised_fits_and_scores_follow_every_change() -> None:
    rng = random.Random(7)
    state = ClusterState()
    state.upsert_node(node_obj("a", [8000, 16000]))
    state.upsert_node(node_obj("b", [16000, 16000, 16000], unit=2))
    state.upsert_node(node_obj("c", [20000, 8000], healthy=[False, True]))
    state.upsert_node(plain_node("cpu"))
    state.upsert_node({"metadata": {"name": "bad", "annotations": {"memslice.io/gpus": "not json"}}})
    names = ["a", "b", "c", "cpu", "bad", "unknown"]
    memo = FitMemo(state)  # one memo all along: it must follow every change
    check_summaries(state, names, memo)
    gpus = {"a": ["GPU-a-0", "GPU-a-1"], "b": ["GPU-b-0", "GPU-b-1", "GPU-b-2"], "c": ["GPU-c-0", "GPU-c-1"]}
    holds: list[str] = []
    for step in range(300):
        op = rng.random()
        if op < 0.45 or not holds:  # an in-flight bind holds room on a GPU
            node = rng.choice(list(gpus))
            uid = f"u{step}"
            state.hold(uid, Charge(rng.choice(gpus[node]), node, rng.choice((500, 1000, 4000, 7000)), 0, None))
            holds.append(uid)
        elif op < 0.75:  # a failed bind lets go
            state.release(holds.pop(rng.randrange(len(holds))), None)
        elif op < 0.85:  # a pod bound without the extender: unplaced memory on the node
            pod = pod_obj(f"p{step}", {"main": rng.choice((100, 2000))}, node=rng.choice(list(gpus)))
            pod["metadata"].update(uid=f"p{step}", resourceVersion=str(step + 1))
            state.upsert_pod(pod)
            if rng.random() < 0.5:
                state.delete_pod(pod)
        elif op < 0.95:  # the node agent republishes the inventory (a GPU turns unhealthy and back)
            sick = rng.random() < 0.5
            state.upsert_node(node_obj("a", [8000, 16000], healthy=[True, not sick]))
        else:  # a node goes away and comes back
            state.delete_node("c")
            check_summaries(state, names, memo)
            state.upsert_node(node_obj("c", [20000, 8000], healthy=[False, True]))
        check_summaries(state, names, memo)
        check_summaries(state, names)  # and a fresh one agrees


def twelve_gpu_nodes(rng: random.Random) -> tuple[ClusterState, dict[str, list[str]]]:
    """A synced state of twelve nodes n0..n11 with 1-4 GPUs of 8, 16 or 40 GB each, and a node without GPUs
    ("cpu"); and each GPU node's GPU UUIDs."""
    state = ClusterState()
    gpus: dict[str, list[str]] = {}
    for i in range(12):
        sizes = [rng.choice((8000, 16000, 40000)) for _ in range(rng.randint(1, 4))]
        state.upsert_node(node_obj(f"n{i}", sizes))
        gpus[f"n{i}"] = [f"GPU-n{i}-{g}" for g in range(len(sizes))]
    state.upsert_node(plain_node("cpu"))
    state.nodes_synced.set()
    state.pods_synced.set()
    return state, gpus


def a_filter_request(rng: random.Random, step: int,
                     gpus: dict[str, list[str]]) -> tuple[dict[str, Any], list[str], bytes]:
    """Step `step`'s pod (1-30 GB, binpack or spread), the 1-12 names it is asked about (every third step with
    a node without GPUs and a name that is no node) and the request's bytes as kube-scheduler writes them."""
    names = rng.sample([*gpus, "cpu", "unknown"] if step % 3 == 0 else list(gpus), rng.randint(1, 12))
    pod = pod_obj(f"p{step}", {"main": rng.choice((1000, 7000, 15000, 30000))}, policy=rng.choice((None, "spread")))
    pod["metadata"]["uid"] = f"uid-{step}"
    return pod, names, scheduler_body(pod, names)


def test_prioritize_after_filter_answers_what_a_fresh_prioritize_answers() -> None:
    """Prioritize reads the verdicts its filter memoised, refreshed for the nodes whose views changed in
    between; whatever happens in between, its answer must be byte for byte a fresh one's. Half the time it
    is asked as the server asks it: first from the request's bytes (Verbs.prioritize_json), which answers
    only when the NodeNames array is exactly the JSON of what filter passed for the pod."""
    rng = random.Random(11)
    state, gpus = twelve_gpu_nodes(rng)
    verbs = Verbs(state, None, "binpack", Metrics(state))  # type: ignore[arg-type]  # no binds here
    holds: list[str] = []
    from_bytes = 0
    for step in range(400):
        names = rng.sample([*gpus, "cpu", "unknown"], rng.randint(1, 14))
        pod = pod_obj(f"p{step}", {"main": rng.choice((1000, 7000, 15000, 30000))},
                      policy=rng.choice((None, "spread")))
        pod["metadata"]["uid"] = f"uid-{step}"
        code, answer = verbs.filter({"Pod": pod, "NodeNames": names})
        assert code == 200
        for _ in range(rng.choice((0, 0, 1, 3, CHANGE_LOG + 1 if step % 97 == 0 else 2))):
            if rng.random() < 0.6 or not holds:  # binds of other pods land in between
                node = rng.choice(list(gpus))
                holds.append(f"h{step}-{len(holds)}")
                state.hold(holds[-1], Charge(rng.choice(gpus[node]), node, rng.choice((500, 4000, 9000)), 0, None))
            else:
                state.release(holds.pop(rng.randrange(len(holds))), None)
        passed = answer["NodeNames"] if rng.random() < 0.9 else names  # or the scheduler sends others
        args = {"Pod": pod, "NodeNames": passed}
        fresh = Verbs(state, None, "binpack", Metrics(state))  # type: ignore[arg-type]
        raw = None
        if step % 2:  # as kube-scheduler writes ExtenderArgs (Go: Pod, Nodes, NodeNames), and the server asks
            body = bytearray(orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": passed}))
            raw = verbs.prioritize_json(body)
            assert body == orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": passed})  # left as it was
            from_bytes += raw is not None
        assert ((200, raw) if raw is not None else verbs.prioritize(args)) == fresh.prioritize(args), step
    assert from_bytes > 30  # (filters with names that are no nodes keep no answer: 53 of 200 turns answered)


def test_prioritize_from_the_bytes_answers_only_its_pods_very_names() -> None:
    """Verbs.prioritize_json answers only for the pod whose filter kept those names, for the same pod size and
    policy, and only with the names byte for byte as filter's answer encodes them; anything else is left to
    the decoding path (None), which still finds the kept answer."""
    state, verbs, names = synced_cluster(6, [40000])
    pod = pod_obj("p", {"main": 1000})
    pod["metadata"]["uid"] = "uid-p"

    def body(p: dict, node_names: object, spaced: bool = False) -> bytearray:
        text = orjson.dumps({"Pod": p, "Nodes": None, "NodeNames": node_names})
        return bytearray(text.replace(b",", b", ") if spaced else text)

    def filtered(p: dict) -> list[str]:
        return verbs.filter({"Pod": p, "NodeNames": names})[1]["NodeNames"]  # type: ignore[no-any-return]

    assert filtered(pod) == names
    other = pod_obj("q", {"main": 1000})
    other["metadata"]["uid"] = "uid-q"
    bigger = pod_obj("p", {"main": 2000})
    bigger["metadata"]["uid"] = "uid-p"
    for miss in (body(other, names), body(bigger, names), body(pod, names[::-1]), body(pod, names[:-1]),
                 body(pod, names, spaced=True), bytearray(orjson.dumps({"NodeNames": names, "Pod": pod})),
                 bytearray(orjson.dumps({"Pod": pod, "nodenames": [], "NodeNames": names}))):
        assert verbs.prioritize_json(miss) is None
    decoded = verbs.prioritize({"Pod": pod, "NodeNames": names})[1]  # the kept answer: used up here
    assert verbs.prioritize_json(body(pod, names)) is None
    filtered(pod)
    answer = verbs.prioritize_json(body(pod, names))
    assert answer == decoded and orjson.loads(answer) == [{"Host": n, "Score": 0} for n in names]
    assert verbs.prioritize_json(body(pod, names)) is None  # used once


@settings(max_examples=examples(400), derandomize=QUICK, deadline=None)
@given(st.data())
def test_splitting_names_off_the_body_is_exact_or_refuses(data: st.DataObject) -> None:
    """wire.split_names_last on any bytes: None, or (head, array bytes) such that, whenever the array decodes
    on its own, the whole body decodes to the head plus NodeNames = that array; the body is left as it was.
    Bodies: encoded objects with NodeNames anywhere, strings that hold the ',"NodeNames":' text, then cut,
    spliced or mangled."""
    json_values = st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8)
                               | st.sampled_from([',"NodeNames":', '"]}', ',"NodeNames":[]}']),
                               lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                            max_size=3),
                               max_leaves=8)
    obj = data.draw(st.dictionaries(st.sampled_from(["Pod", "Nodes", "NodeNames", "nodeNames", "x"]),
                                    json_values, max_size=4))
    text = orjson.dumps(obj)
    text = data.draw(st.sampled_from([text, text[:-1] + b',"NodeNames":["a","b"]}', text + b',"NodeNames":[]}',
                                      b'{,"NodeNames":["a"]}', text[:-1] + b',"NodeNames":["a"],"x":["b"]}']))
    if text and data.draw(st.booleans()):
        at = data.draw(st.integers(0, len(text) - 1))
        text = text[:at] + data.draw(st.sampled_from([b"", b",", b'"', b"}", b"]", b"\\"])) + text[at + 1:]
    body = bytearray(text)
    split = wire.split_names_last(body)
    assert body == text
    if split is None:
        return
    head, array = split
    try:
        names = orjson.loads(array)
    except orjson.JSONDecodeError:
        return  # the caller only ever compares it with an encoded list of names, which decodes
    assert orjson.loads(text) == {**head, "NodeNames": names}


def synced_cluster(n: int, gpus_mib: list[int]) -> tuple[ClusterState, Verbs, list[str]]:
    """A synced state of n alike nodes n0.. (one GPU of each size in `gpus_mib`), its verbs (no binds) and
    the nodes' names."""
    state = ClusterState()
    for i in range(n):
        state.upsert_node(node_obj(f"n{i}", gpus_mib))
    state.nodes_synced.set()
    state.pods_synced.set()
    return state, Verbs(state, None, "binpack", Metrics(state)), [f"n{i}" for i in range(n)]  # type: ignore[arg-type]


def test_the_memo_holds_a_bounded_number_of_verdicts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The memo is bounded in verdicts held (hostile requests of 100,000 names and ever new pod sizes
    cannot pin memory): the least recently used pod size goes first; answers stay those of decisions.py."""
    from memslice.scheduler_extender.index import fitmemo

    monkeypatch.setattr(fitmemo, "MAX_ENTRIES", 30)
    state, verbs, names = synced_cluster(40, [16000])
    for step, (count, mib) in enumerate(((20, 1000), (20, 2000), (5, 1000), (31, 3000), (10, 4000))):
        pod = pod_obj(f"p{step}", {"main": mib})
        code, answer = verbs.filter({"Pod": pod, "NodeNames": names[:count]})
        assert code == 200 and answer["NodeNames"] == names[:count]
        assert verbs.memo.size() <= 30, step
    assert list(verbs.memo._tables) == [(3000, "binpack"), (4000, "binpack")]  # the 31-name one started afresh
    check_summaries(state, names[:20], verbs.memo)


def test_an_unchanged_charge_leaves_the_view_alone() -> None:
    """The watch delivering the pod a bind just wrote (same GPU, same MiB) must not rebuild the node's view
    nor drop its memoised summaries; a changed charge must."""
    state = ClusterState()
    state.upsert_node(node_obj("n", [10000, 10000]))
    pod = pod_obj("a", {"main": 3000})
    pod["metadata"].update(uid="uid-a", resourceVersion="5")
    state.upsert_pod(pod)
    state.hold("uid-a", Charge("GPU-n-0", "n", 3000, 0, None))
    state.confirm("uid-a", 6)
    before = state.view("n")
    memo = FitMemo(state)
    assert memo.host_json(["n"], (8000, "binpack")) == ['{"Host":"n","Score":8}']
    assert memo.all_fit(["n"], (8000, "binpack"))
    generation = _generation(state)
    reserved = json.loads(json.dumps(pod))  # the reservation patch, before the Binding
    reserved["metadata"].update(resourceVersion="6", annotations=reservation_annotations(
        "GPU-n-0", {"main": 3000}, state.clock()))
    state.upsert_pod(reserved)
    assert state.counts()["pending"] == 0 and state.charge_of("uid-a").expires is not None
    bound = json.loads(json.dumps(pod))
    bound["metadata"].update(resourceVersion="7", annotations=reservation_annotations("GPU-n-0", {"main": 3000}, 0))
    bound["spec"]["nodeName"] = "n"
    state.upsert_pod(bound)
    assert state.charge_of("uid-a").expires is None and state.changed_since(generation) == set()
    assert state.counts()["pending"] == 0
    assert state.view("n") is before and [g.used_mib for g in before.gpus] == [3000, 0]
    bound["metadata"]["resourceVersion"] = "8"
    bound["metadata"]["annotations"] = reservation_annotations("GPU-n-1", {"main": 3000}, 0)
    state.upsert_pod(bound)
    assert [g.used_mib for g in state.view("n").gpus] == [0, 3000]
    assert memo.host_json(["n"], (8000, "binpack")) == ['{"Host":"n","Score":8}']
    state.delete_pod(bound)
    assert [g.used_mib for g in state.view("n").gpus] == [0, 0]
    assert memo.host_json(["n"], (8000, "binpack")) == ['{"Host":"n","Score":8}']
    assert memo.host_json(["n"], (8000, "spread")) == ['{"Host":"n","Score":2}']


def _generation(state: ClusterState) -> int:
    with state.current() as generation:
        return generation


@given(st.lists(st.text(max_size=12), max_size=20), st.data())
def test_host_priority_list_encoding_is_json(hosts: list[str], data: st.DataObject) -> None:
    scores = data.draw(st.lists(st.integers(0, 10), min_size=len(hosts), max_size=len(hosts)))
    raw = wire.encode_host_priority_list(hosts, scores)
    assert json.loads(raw) == wire.host_priority_list(list(zip(hosts, scores, strict=True)))


# ------------------------------------------------------------------------------------------ lean HTTP parser

@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with running_cluster() as c:
        c.start()
        c.add_node(node_obj("n", [8000]))
        yield c


def exchange(cluster: Cluster, data: bytes) -> bytes:
    """Send raw bytes, read until the server closes the connection."""
    assert cluster.ext is not None
    with socket.create_connection(("127.0.0.1", cluster.ext.port), timeout=10) as s:
        s.sendall(data)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def filter_body() -> bytes:
    return json.dumps({"Pod": pod_obj("x", {"main": 1}), "NodeNames": ["n"]}).encode()


def test_header_names_are_case_insensitive_and_connection_close_closes(cluster: Cluster) -> None:
    body = filter_body()
    out = exchange(cluster, b"POST /filter HTTP/1.1\r\nhOsT: x\r\nCONTENT-LENGTH: " + str(len(body)).encode()
                   + b"\r\nconnection: Close\r\n\r\n" + body)
    head, _, rest = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"\r\nConnection: close\r\n" in head + b"\r\n"
    assert json.loads(rest)["NodeNames"] == ["n"]


def test_two_requests_on_one_connection_then_close(cluster: Cluster) -> None:
    body = filter_body()
    one = b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    out = exchange(cluster, one + one.replace(b"Host: x\r\n", b"Host: x\r\nConnection: close\r\n"))
    assert out.count(b"HTTP/1.1 200 OK\r\n") == 2


def test_expect_100_continue_is_answered(cluster: Cluster) -> None:
    body = filter_body()
    out = exchange(cluster, b"POST /filter HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nConnection: close\r\n"
                   b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    assert out.startswith(b"HTTP/1.1 100 Continue\r\n") and b"HTTP/1.1 200 OK\r\n" in out


def test_header_abuse_is_refused_and_changes_nothing(cluster: Cluster) -> None:
    before = cluster.kube.resource_version
    many = b"".join(b"X-%d: y\r\n" % i for i in range(101))
    assert exchange(cluster, b"POST /filter HTTP/1.1\r\n" + many + b"\r\n").startswith(b"HTTP/1.1 431 ")
    huge = b"X: " + b"y" * 70_000 + b"\r\n"
    assert exchange(cluster, b"POST /filter HTTP/1.1\r\n" + huge + b"\r\n").startswith(b"HTTP/1.1 431 ")
    folded = b"POST /filter HTTP/1.1\r\nHost: x\r\n continued\r\nContent-Length: 2\r\n\r\n{}"
    assert exchange(cluster, folded).startswith(b"HTTP/1.1 400 ")
    # not HTTP/1.1: the stdlib's parser, unchanged (HTTP/1.0 closes after the answer)
    body = filter_body()
    out = exchange(cluster, b"POST /filter HTTP/1.0\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n"
                   + body)
    assert out.startswith(b"HTTP/1.1 200 ") and json.loads(out.partition(b"\r\n\r\n")[2])["NodeNames"] == ["n"]
    assert b"Error code: 505" in exchange(cluster, b"POST /filter HTTP/2.0\r\n\r\n")  # stdlib: a bare page
    assert b"Error code: 400" in exchange(cluster, b"GARBAGE /x\r\n\r\n")
    assert cluster.kube.resource_version == before
    assert cluster.c.filter(pod_obj("x", {"main": 1}), ["n"])["NodeNames"] == ["n"]


def test_kept_filter_answers_are_bounded_and_replayed_only_while_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    """Filter's answers kept for the prioritize that follows are bounded in names held (hostile requests
    cannot pin memory), replayed only for the same pod, size and names, and never stale once a node changed."""
    from memslice.scheduler_extender.index import fitmemo

    monkeypatch.setattr(fitmemo, "REPLAY_NAMES", 30)
    state, verbs, names = synced_cluster(40, [16000])
    for step, count in enumerate((20, 20, 31, 10)):
        pod = pod_obj(f"p{step}", {"main": 1000})
        pod["metadata"]["uid"] = f"uid-{step}"
        verbs.filter({"Pod": pod, "NodeNames": names[:count]})
        assert verbs.memo._replay_names == sum(r[5] for r in verbs.memo._replays.values()) <= 30
    assert list(verbs.memo._replays) == ["uid-1", "uid-3"]  # oldest dropped first; the 31-name one never kept
    pod = pod_obj("p1", {"main": 1000})
    pod["metadata"]["uid"] = "uid-1"
    state.hold("other", Charge("GPU-n0-0", "n0", 15000, 0, None))  # n0 changes: no replay of uid-1's answer
    fresh = Verbs(state, None, "binpack", Metrics(state))  # type: ignore[arg-type]
    args = {"Pod": pod, "NodeNames": names[:20]}
    assert verbs.prioritize(args) == fresh.prioritize(args)
    assert b'{"Host":"n0","Score":10}' in fresh.prioritize(args)[1]  # n0 is fuller now: binpack likes it
    assert "uid-1" not in verbs.memo._replays  # taken by its prioritize


def count_recomputes_and_checks(monkeypatch: pytest.MonkeyPatch, verbs: Verbs) -> tuple[list[int], list[int]]:
    """Record, without changing what they do, how many names the memo recomputes prioritize's answer for
    (one entry per host_json call) and how many times request names are checked one by one."""
    asked: list[int] = []
    host_json = verbs.memo.host_json
    monkeypatch.setattr(verbs.memo, "host_json", lambda n, k: asked.append(len(n)) or host_json(n, k))
    checked: list[int] = []
    check_names = wire.check_names
    monkeypatch.setattr(wire, "check_names", lambda a: checked.append(1) or check_names(a))
    return asked, checked


def test_kept_answer_is_patched_for_the_nodes_that_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bind between filter and prioritize changes a node among the names: prioritize still answers from the
    node ids filter found (no name looked up or checked again), and the tables it reads were refreshed at
    the change, so the answer is byte for byte a fresh one; hostile names are still checked."""
    state, verbs, names = synced_cluster(40, [16000, 16000])
    verbs.filter({"Pod": pod_obj("first", {"main": 1000}), "NodeNames": names})  # fills the memo
    pod = pod_obj("p", {"main": 1000})
    pod["metadata"]["uid"] = "uid-p"
    assert verbs.filter({"Pod": pod, "NodeNames": names})[1]["NodeNames"] == names
    state.hold("other", Charge("GPU-n3-0", "n3", 15000, 0, None))  # n3 changes: binpack likes it now
    asked, checked = count_recomputes_and_checks(monkeypatch, verbs)
    code, answer = verbs.prioritize({"Pod": pod, "NodeNames": names})
    assert asked == [] and checked == []  # nothing recomputed from names, no name checked
    fresh = Verbs(state, None, "binpack", Metrics(state))  # type: ignore[arg-type]
    assert (code, answer) == fresh.prioritize({"Pod": pod, "NodeNames": names})
    assert json.loads(answer)[3] == {"Host": "n3", "Score": 10}
    bad = verbs.filter({"Pod": pod, "NodeNames": names[:5] + [["n1"]]})  # unhashable: refused, not a crash
    assert bad[0] == 400 and "NodeNames[5]" in bad[1]["Error"]
    assert verbs.prioritize({"Pod": pod, "NodeNames": ["n1", ""]})[0] == 400


def test_gpu_metrics_text_is_what_prometheus_client_writes_and_follows_the_state() -> None:
    """The per-GPU families written as text (metrics.gpu_text) are line for line what prometheus_client's
    GaugeMetricFamily writes for the same GPUs (hostile label text escaped alike, over-committed GPUs, odd
    sizes); a scrape of an unchanged state reuses the text, and a charge shows in the next scrape."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily

    from memslice.scheduler_extender.edge import metrics as metrics_mod

    state = ClusterState()
    state.upsert_node(node_obj("a", [16000, 2_000_000, 1]))
    state.upsert_node(node_obj("b", [8000], unit=2, healthy=[False]))
    state.hold("over", Charge("GPU-a-0", "a", 20000, 0, None))  # over-committed: negative free
    state.hold("elastic", Charge("GPU-a-1", "a", 1000, 0, None, 3000))  # limits 3,000 MiB above the request
    m = Metrics(state)

    def reference() -> set[bytes]:
        class Old:
            def collect(self):  # type: ignore[no-untyped-def]  # the old collector's code, verbatim
                free = GaugeMetricFamily("memslice_extender_gpu_free_mib",
                                         "GPU memory not reserved by any pod, per GPU (MiB)",
                                         labels=["node", "gpu", "uuid"])
                cap = GaugeMetricFamily("memslice_extender_gpu_capacity_mib", "GPU memory as the node agent "
                                        "publishes it (MiB)", labels=["node", "gpu", "uuid"])
                limits = GaugeMetricFamily("memslice_extender_gpu_limits_mib", "Sum of the GPU memory limits of "
                                           "the pods on each GPU (a pod without a limit counts its request; MiB)",
                                           labels=["node", "gpu", "uuid"])
                for view in state.views():
                    for i, g in enumerate(view.gpus):
                        labels = [view.name, str(g.index), g.uuid]
                        free.add_metric(labels, g.free_mib)
                        cap.add_metric(labels, g.mem_mib)
                        limits.add_metric(labels, g.used_mib + (view.over[i] if view.over is not None else 0))
                yield free
                yield cap
                yield limits

        registry = CollectorRegistry()
        registry.register(Old())  # type: ignore[arg-type]
        return set(generate_latest(registry).splitlines())

    first = m.gpu_text()
    assert set(first.splitlines()) == reference()
    assert b'memslice_extender_gpu_free_mib{gpu="0",node="a",uuid="GPU-a-0"} -4000.0' in first
    assert m.gpu_text() is first  # nothing changed: the same text, not rendered again
    state.hold("p", Charge("GPU-b-0", "b", 4000, 0, None))
    second = m.gpu_text()
    assert b'memslice_extender_gpu_free_mib{gpu="0",node="b",uuid="GPU-b-0"} 4000.0' in second
    assert set(second.splitlines()) == reference()
    assert b"memslice_extender_tracked" in m.render()[0] and second in m.render()[0]
    hostile = 'x"y\\z\nw'
    assert metrics_mod._label(hostile) == hostile.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def test_slow_path_keeps_its_answer_for_prioritize_and_still_checks_what_it_does_not_know(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Filter with a node that fails (the slow path) keeps the passing nodes' answer for the prioritize that
    follows, as the fast path does: prioritize of those names computes nothing afresh and checks no name. A
    name the memo does not know (garbage included) is still checked: 400, never a crash."""
    state, verbs, names = synced_cluster(10, [16000])
    state.hold("full", Charge("GPU-n0-0", "n0", 16000, 0, None))
    verbs.filter({"Pod": pod_obj("first", {"main": 1000}), "NodeNames": names})  # fills the memo
    pod = pod_obj("p", {"main": 1000})
    pod["metadata"]["uid"] = "uid-p"
    answer = verbs.filter({"Pod": pod, "NodeNames": names})[1]
    assert answer["NodeNames"] == names[1:] and list(answer["FailedNodes"]) == ["n0"]
    asked, checked = count_recomputes_and_checks(monkeypatch, verbs)
    code, scores = verbs.prioritize({"Pod": pod, "NodeNames": names[1:]})
    assert asked == [] and checked == []
    fresh = Verbs(state, None, "binpack", Metrics(state))  # type: ignore[arg-type]
    assert (code, scores) == fresh.prioritize({"Pod": pod, "NodeNames": names[1:]})
    for bad in (names + [""], names + ["x" * 300], names + [7], names + [{"a": 1}]):
        code, out = verbs.filter({"Pod": pod, "NodeNames": bad})
        assert code == 400 and "NodeNames[10]" in out["Error"], bad[-1]
    code, out = verbs.filter({"Pod": pod, "NodeNames": names + ["not-a-node"]})
    assert code == 200 and out["FailedNodes"]["not-a-node"].startswith("node is not (yet) known")


def test_node_ids_are_reused_safely_when_nodes_come_and_go() -> None:
    """The memo keeps each node's verdicts at a small integer id, and a node that goes frees its id for the
    next new node: a filter's answer kept for prioritize must then not be replayed (its ids may name other
    nodes now), no verdict of the old node may show for the new one, and every answer stays decisions.py's."""
    rng = random.Random(3)
    state, verbs, names = synced_cluster(12, [16000, 8000])
    live = list(names)
    pod = pod_obj("p", {"main": 9000})
    pod["metadata"]["uid"] = "uid-p"
    for step in range(60):
        answer = verbs.filter({"Pod": pod, "NodeNames": list(live)})[1]
        gone = rng.choice(live)
        live.remove(gone)
        state.delete_node(gone)
        new = f"m{step}"
        # the new node (at the id `gone` had, or another) is fuller: binpack scores it 8, an empty one 6
        state.upsert_node(node_obj(new, [16000, 8000]))
        state.hold(f"h{step}", Charge(f"GPU-{new}-0", new, 4000, 0, None))
        live.append(new)
        verbs.filter({"Pod": pod_obj("q", {"main": 1}), "NodeNames": [new]})  # the memo meets the new node
        fresh = Verbs(state, None, "binpack", Metrics(state))  # type: ignore[arg-type]
        args = {"Pod": pod, "NodeNames": list(answer["NodeNames"])}  # as kube-scheduler sends it: with `gone`
        assert verbs.prioritize(args) == fresh.prioritize(args), step
        assert b'{"Host":"%s","Score":0}' % gone.encode() in fresh.prioritize(args)[1]
        again = verbs.filter({"Pod": pod, "NodeNames": live})[1]
        assert again == fresh.filter({"Pod": pod, "NodeNames": live})[1]
        assert new in again["NodeNames"], step
        check_summaries(state, live[-3:], verbs.memo)


def test_prioritize_writes_node_names_json_must_escape_as_json() -> None:
    """A node whose name JSON must escape (the API server would refuse it, a hostile stand-in might not):
    prioritize's answer, written from the memo's per-node texts, is still valid JSON, equal to json's."""
    state, verbs, names = synced_cluster(3, [16000])
    odd = 'we"ird\\näme\x01'
    state.upsert_node(node_obj(odd, [16000]))
    pod = pod_obj("p", {"main": 1000})
    pod["metadata"]["uid"] = "uid-p"
    for asked in (names, [*names, odd]):
        verbs.filter({"Pod": pod, "NodeNames": asked})
        code, raw = verbs.prioritize({"Pod": pod, "NodeNames": asked})
        assert code == 200 and json.loads(raw) == [{"Host": n, "Score": 1} for n in asked]
        assert raw == wire.encode_host_priority_list(asked, [1] * len(asked))


_SHAPED_SIZES = ((8000, 8000), (8000, 16000), (16000, 8000), (8000, 8000, 8000))


@settings(max_examples=150, deadline=None)
@given(st.sampled_from((None, Fraction(1), Fraction(3, 2))), st.lists(st.sampled_from(_SHAPED_SIZES), min_size=1,
       max_size=6), st.lists(st.tuples(st.integers(0, 5), st.integers(0, 99), st.integers(0, 3)), max_size=40))
def test_verdicts_shared_by_node_shape_are_each_nodes_own(ratio: Fraction | None, sizes: list[tuple[int, ...]],
                                                           ops: list[tuple[int, int, int]]) -> None:
    """A memo's first fill shares a verdict among nodes of one shape (fitmemo.Shape): after any binds,
    releases, elastic charges, unplaced pods and inventory changes on nodes that start alike, every node's
    verdict, in a memo that followed the changes and in a fresh one, is decisions.verdict on its own view,
    with and without the limit cap."""
    state = ClusterState()
    nodes = [f"n{i}" for i in range(len(sizes))]
    for name, gpus in zip(nodes, sizes, strict=True):
        state.upsert_node(node_obj(name, list(gpus)))
    memo = FitMemo(state, ratio)
    keys = [(d, p) for d in (1, 2000, 7000, 8000, 9000) for p in ("binpack", "spread")]
    holds: list[str] = []

    def check() -> None:
        for m in (memo, FitMemo(state, ratio)):
            for key in keys:
                for name, got in zip(nodes, m.verdicts(nodes, key), strict=True):
                    view = state.view(name)
                    want = None if view is None else decisions.verdict(view, key[0] * view.unit_mib, key[1],
                                                                       m.limit_need(key, view))
                    assert got == want, (name, key, view)

    check()
    for step, (n, r, kind) in enumerate(ops):
        node = nodes[n % len(nodes)]
        gpus = sizes[n % len(sizes)]
        if kind <= 1 or not holds:  # a bind (kind 1: an elastic pod, its limit above its request)
            holds.append(f"h{step}")
            state.hold(holds[-1], Charge(f"GPU-{node}-{r % len(gpus)}", node, (r % 4 + 1) * 2000, 0, None,
                                         (r % 3) * 2000 if kind == 1 else 0))
        elif kind == 2:
            state.release(holds.pop(r % len(holds)), None)
        elif r % 2 == 0:  # a pod bound without the extender: unplaced memory
            pod = pod_obj(f"p{step}", {"main": (1000, 6000, 9000)[r % 3]}, node=node)
            pod["metadata"].update(uid=f"p{step}", resourceVersion=str(step + 1))
            state.upsert_node(node_obj(node, list(gpus)))
            state.upsert_pod(pod)
        else:  # the inventory changes: a GPU turns unhealthy, or the unit changes
            state.upsert_node(node_obj(node, list(gpus), unit=1 + r // 2 % 2,
                                       healthy=[i != r // 4 % (len(gpus) + 1) for i in range(len(gpus))]))
        check()


def test_nodes_alike_but_for_their_limit_sums_get_their_own_verdicts() -> None:
    """Two nodes with the same GPUs and used MiB, one of whose pods' limits fill the limit cap: a fresh memo
    (whose first fill shares verdicts by shape) must refuse the pod there and accept it on the other."""
    state = ClusterState()
    for name in ("a", "b"):
        state.upsert_node(node_obj(name, [8000]))
    state.hold("pa", Charge("GPU-a-0", "a", 4000, 0, None))
    state.hold("pb", Charge("GPU-b-0", "b", 4000, 0, None, 4000))  # limit 8,000: the cap (ratio 1) is full
    memo = FitMemo(state, Fraction(1))
    fits, refused = memo.verdicts(["a", "b"], (2000, "binpack"))
    assert fits is not None and fits[0] and refused is not None and not refused[0]
    assert "limit cap" in refused[2]


@pytest.mark.parametrize("trial", [32, 2])
def test_shape_numbers_started_afresh_never_mix_verdicts(monkeypatch: pytest.MonkeyPatch, trial: int) -> None:
    """More node shapes than the memo numbers at once (fitmemo.SHAPES_MAX): the numbering starts afresh in
    the middle of a fill, and no node may get the verdict of another shape that was given its old number.
    With a short trial (fitmemo.SHARE_TRIAL) the tables stop sharing in the middle of a fill: still right."""
    from memslice.scheduler_extender.index import fitmemo

    monkeypatch.setattr(fitmemo, "SHAPES_MAX", 3)
    monkeypatch.setattr(fitmemo, "SHARE_TRIAL", trial)
    state = ClusterState()
    names = [f"n{i}" for i in range(12)]
    for i, name in enumerate(names):
        state.upsert_node(node_obj(name, [16000]))
        state.hold(f"h{i}", Charge(f"GPU-{name}-0", name, 1000 * i, 0, None))  # twelve shapes
    memo = FitMemo(state)
    for key in ((5000, "binpack"), (9000, "binpack"), (5000, "spread"), (9000, "binpack")):
        for _ in range(2):
            got = memo.verdicts(names, key)
            for name, verdict in zip(names, got, strict=True):
                view = state.view(name)
                assert view is not None and verdict == decisions.verdict(view, key[0], key[1]), (name, key)
        state.hold(f"x{key}", Charge("GPU-n0-0", "n0", 1, 0, None))  # one view changes between keys
    assert all(t.sharing == (trial > 12) for t in memo._tables.values())


def test_the_memo_holds_a_bounded_number_of_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each pod size (and policy) has a table of arrays as long as the nodes: their number is bounded too
    (a pod size per request cannot pin memory), the least recently used goes first, answers stay right."""
    from memslice.scheduler_extender.index import fitmemo

    monkeypatch.setattr(fitmemo, "MAX_TABLES", 2)
    state, verbs, names = synced_cluster(5, [16000])
    for mib in (1000, 2000, 3000, 1000, 4000):
        code, answer = verbs.filter({"Pod": pod_obj(f"p{mib}", {"main": mib}), "NodeNames": names})
        assert code == 200 and answer["NodeNames"] == names
        assert len(verbs.memo._tables) <= 2
    assert list(verbs.memo._tables) == [(1000, "binpack"), (4000, "binpack")]
    assert verbs.memo.size() == 10
    check_summaries(state, names, verbs.memo)


def scheduler_body(pod: dict, names: object) -> bytearray:
    """ExtenderArgs as kube-scheduler writes them with nodeCacheCapable (Go: Pod, Nodes, NodeNames)."""
    return bytearray(orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}))


def test_filter_from_the_bytes_answers_what_filter_answers() -> None:
    """Verbs.filter_json (the names looked up from the request's bytes, echoed when every node passes) answers
    what a fresh filter() answers on the decoded request, whatever binds land in between; where it declines
    (names that are no nodes, a pod without memslice memory) the server's filter() answers. The prioritize that
    follows, from its own bytes, answers what a fresh prioritize answers."""
    rng = random.Random(39)
    state, gpus = twelve_gpu_nodes(rng)
    verbs = Verbs(state, None, "binpack", Metrics(state))  # type: ignore[arg-type]  # no binds here
    taken = {"echoed": 0, "whole": 0, "declined": 0}
    replayed = 0
    for step in range(300):
        pod, names, body = a_filter_request(rng, step, gpus)
        fresh = Verbs(state, None, "binpack", Metrics(state))  # type: ignore[arg-type]
        want = fresh.filter(orjson.loads(body))
        got = verbs.filter_json(body)
        assert body == scheduler_body(pod, names)  # left as it was
        if got is None:
            taken["declined"] += 1
            got = verbs.filter(orjson.loads(body))
        elif isinstance(got[1], wire.JsonParts):  # echoed (every node passed), or failing on some written whole
            taken["echoed" if got[1][2] == wire.FILTER_NAMES_TAIL else "whole"] += 1  # (_nameids.filter_answer)
        else:  # the split (without the native module)
            taken["whole"] += 1
        text = bytes(got[1]) if isinstance(got[1], wire.JsonParts) else orjson.dumps(got[1])
        assert (got[0], text) == (want[0], orjson.dumps(want[1]))  # byte for byte what the server sent
        for _ in range(rng.choice((0, 1, 2))):  # binds of other pods land in between
            node = rng.choice(list(gpus))
            state.hold(f"h{step}-{_}", Charge(rng.choice(gpus[node]), node, rng.choice((500, 4000)), 0, None))
        passed = want[1]["NodeNames"]
        if passed:
            answer = verbs.prioritize_json(scheduler_body(pod, passed))
            replayed += answer is not None
            assert ((200, answer) if answer is not None else verbs.prioritize({"Pod": pod, "NodeNames": passed})
                    ) == fresh.prioritize({"Pod": pod, "NodeNames": passed}), step
    assert min(taken.values()) > 10 and replayed > 100, (taken, replayed)


def test_a_failing_filter_written_whole_still_passes_a_pods_own_stale_reservation() -> None:
    """filter_json writes a filter failing on some names whole from the request's bytes (_nameids.filter_answer)
    unless the pod holds a reservation of its own that a failed bind left: its node then fails only because of it,
    and passes, as filter() answers; both answers are filter()'s byte for byte."""
    state, verbs, names = synced_cluster(3, [8000])
    pod, other = pod_obj("p", {"main": 6000}), pod_obj("o", {"main": 6000})
    pod["metadata"]["uid"], other["metadata"]["uid"] = "uid-p", "uid-o"
    verbs.filter({"Pod": pod, "NodeNames": names})  # the memo meets the nodes (filter_json declines first sight)
    state.hold("uid-p", Charge("GPU-n1-0", None, 6000, 0, time.time() + 60))  # written, bind failed, not undone
    native = verbs.memo._index.filter_answer is not None
    for who, passed, whole in ((other, ["n0", "n2"], native), (pod, names, False)):
        got = verbs.filter_json(scheduler_body(who, names))
        assert got is not None and isinstance(got[1], wire.JsonParts) == whole  # the pod's own: the split
        text = bytes(got[1]) if whole else orjson.dumps(got[1])
        want = Verbs(state, None, "binpack", Metrics(state)).filter({"Pod": who, "NodeNames": names})  # type: ignore[arg-type]
        assert (got[0], text) == (want[0], orjson.dumps(want[1]))
        assert orjson.loads(text)["NodeNames"] == passed


def test_filter_answering_the_best_passes_the_fitting_nodes_of_the_highest_score() -> None:
    """--filter-answers best (deploy/base: no prioritizeVerb): filter passes, of the nodes where the pod fits,
    exactly those its prioritize would score highest, ties kept, in the request's order, on every path (the
    bytes echoed or split, the decoded request, names that are no nodes), with binds landing in between; what
    failed, and why, is what filter answers with every fitting node passed."""
    rng = random.Random(3939)
    state, gpus = twelve_gpu_nodes(rng)
    best = Verbs(state, None, "binpack", Metrics(state), best=True)  # type: ignore[arg-type]  # no binds here
    taken = {"echoed": 0, "whole": 0, "declined": 0}
    shortened = kept_all = 0
    for step in range(300):
        pod, names, body = a_filter_request(rng, step, gpus)
        every = Verbs(state, None, "binpack", Metrics(state))  # type: ignore[arg-type]  # every fitting node
        code, want = every.filter(orjson.loads(body))
        passed = want["NodeNames"]
        if passed:
            answer = every.prioritize({"Pod": pod, "NodeNames": passed})[1]
            scores = {h["Host"]: h["Score"] for h in (orjson.loads(answer) if isinstance(answer, bytes) else answer)}
            top = max(scores.values())
            want = want | {"NodeNames": [n for n in passed if scores[n] == top]}
            shortened += len(want["NodeNames"]) < len(passed)
            kept_all += 1 < len(want["NodeNames"]) == len(passed)
        got = best.filter_json(body) if step % 4 else None
        if got is None:
            taken["declined"] += step % 4 != 0
            got = best.filter(orjson.loads(body))
        elif isinstance(got[1], wire.JsonParts) and got[1][2] != wire.FILTER_NAMES_TAIL:  # failing on some, whole
            taken["whole"] += 1
            assert bytes(got[1]) == orjson.dumps(want), step  # byte for byte what the split's dict encodes to
        else:  # echoed, its best names written (byte for byte, too), or (without the native module) the split
            taken["echoed" if isinstance(got[1], (bytes, wire.JsonParts)) else "whole"] += 1
            assert not isinstance(got[1], wire.JsonParts) or bytes(got[1]) == orjson.dumps(want), step
        text = bytes(got[1]) if isinstance(got[1], (bytes, wire.JsonParts)) else None
        assert (got[0], orjson.loads(text) if text is not None else got[1]) == (code, want), step
        for _ in range(rng.choice((0, 1, 2))):  # binds of other pods land in between
            node = rng.choice(list(gpus))
            state.hold(f"h{step}-{_}", Charge(rng.choice(gpus[node]), node, rng.choice((500, 4000)), 0, None))
    assert min(taken.values()) > 5 and shortened > 50 and kept_all > 5, (taken, shortened, kept_all)


def test_the_server_passes_the_best_nodes_unless_told_to_pass_all() -> None:
    """Through HTTP, as deploy/base runs it (the default) and with --filter-answers all: a pod of 4 GB fits on
    an empty GPU and on two half used; binpacking prefers the fuller two (a tie: both passed), and only they
    are, unless all are."""
    for answers, want in (("best", ["half-a", "half-b"]), ("all", ["empty", "half-a", "half-b"])):
        config = Config(address="127.0.0.1", port=0, watch_timeout=30, filter_answers=answers)
        with running_cluster(config) as c:
            c.start()
            for name in ("empty", "half-a", "half-b"):
                c.add_node(node_obj(name, [16000]))
            for name in ("half-a", "half-b"):
                c.add_pod(pod_obj(f"resident-{name}", {"main": 8000}, node=name, annotations=reservation_annotations(
                    f"GPU-{name}-0", {"main": 8000}, time.time())))
                c.wait_used(name, [8000])
            answer = c.c.filter(pod_obj("x", {"main": 4000}), ["half-a", "empty", "half-b"])
            assert sorted(answer["NodeNames"]) == want, answers
            assert answer["FailedNodes"] == {} and answer["Error"] == ""


def test_filter_from_the_bytes_echoes_the_array_and_declines_what_it_cannot_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every node passes: the answer's NodeNames are the request's array byte for byte (whitespace and all).
    Names with escapes, more names than wire.MAX_NODE_NAMES, a body not written as kube-scheduler writes it,
    nodes the memo meets for the first time (their ids are given on the decoding path): declined (None), so
    filter() judges them as before (the escaped name decoded, too many names refused)."""
    state, verbs, names = synced_cluster(3, [40000])
    pod = pod_obj("p", {"main": 1000})
    pod["metadata"]["uid"] = "uid-p"
    assert verbs.filter_json(scheduler_body(pod, names)) is None  # first sight
    verbs.filter({"Pod": pod, "NodeNames": names})
    body = scheduler_body(pod, names).replace(b'"NodeNames":["n0","n1","n2"]', b'"NodeNames":[ "n0",\n "n1" ,"n2"]')
    got = verbs.filter_json(body)
    assert got is not None and got[0] == 200 and isinstance(got[1], wire.JsonParts)
    assert b'"NodeNames":[ "n0",\n "n1" ,"n2"],' in bytes(got[1])
    assert orjson.loads(bytes(got[1])) == verbs.filter({"Pod": pod, "NodeNames": names})[1]
    escaped = scheduler_body(pod, names).replace(b'"n1"', b'"n\\u0031"')
    assert verbs.filter_json(escaped) is None
    assert verbs.filter(orjson.loads(escaped))[1]["NodeNames"] == names
    assert verbs.filter_json(bytearray(orjson.dumps({"NodeNames": names, "Pod": pod}))) is None
    assert verbs.filter_json(scheduler_body({"metadata": {}}, names)) is None  # filter() answers 400
    monkeypatch.setattr(wire, "MAX_NODE_NAMES", 2)
    assert verbs.filter_json(scheduler_body(pod, names)) is None
    assert verbs.filter(orjson.loads(scheduler_body(pod, names)))[0] == 400


def test_the_server_answers_filter_from_the_bytes(cluster: Cluster) -> None:
    """Through HTTP: the answer echoes the request's array as it was written (the bytes path served it, once
    the node has its id)."""
    body = orjson.dumps({"Pod": pod_obj("x", {"main": 1}), "Nodes": None, "NodeNames": ["n"]}).replace(
        b'["n"]', b'[ "n" ]')
    request = (b"POST /filter HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: "
               + str(len(body)).encode() + b"\r\n\r\n" + body)
    exchange(cluster, request)
    out = exchange(cluster, request)
    head, _, rest = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b'"NodeNames":[ "n" ],' in rest
    assert orjson.loads(rest) == {"Nodes": None, "NodeNames": ["n"], "FailedNodes": {},
                                  "FailedAndUnresolvableNodes": {}, "Error": ""}


def test_the_names_are_split_off_where_the_pod_ends_even_if_it_holds_their_key() -> None:
    """split_names_last seeks the cut from the start (the pod comes first: reading back from the end went over
    every name) and, when the head there does not decode (a "NodeNames" key inside the pod), from the end."""
    pod = pod_obj("x", {"main": 1})
    pod["metadata"]["labels"] = {"a": "b", "NodeNames": "not these"}
    body = bytearray(orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": ["n1", "n2"]}))
    assert body.find(wire.NAMES_LAST) < body.rfind(wire.NAMES_LAST)
    assert wire.split_names_last(body) == ({"Pod": pod, "Nodes": None}, b'["n1","n2"]')
    plain = bytearray(orjson.dumps({"Pod": pod_obj("x", {"main": 1}), "Nodes": None, "NodeNames": ["n1"]}))
    assert wire.split_names_last(plain) == ({"Pod": pod_obj("x", {"main": 1}), "Nodes": None}, b'["n1"]')


def test_a_head_holding_too_many_values_is_not_decoded_by_the_fast_paths() -> None:
    """The fast paths (filter_json, prioritize_json) run before the server counts the body's values: a head
    that may hold more than MAX_HEAD_VALUES is not decoded (None: the server then counts, and refuses what
    holds too many), so with the MAX_NODE_NAMES names they may read, nothing they serve holds more values than
    the server parses."""
    def body(values: int) -> bytearray:  # its head (up to the names) may hold `values` values
        pod = pod_obj("x", {"main": 1})
        pod["spec"]["x"] = []
        head = orjson.dumps({"Pod": pod, "Nodes": None})[:-1]
        pod["spec"]["x"] = [0] * (values - wire.json_values_bound(head) + 1)  # each 0 after the first: a comma
        return bytearray(orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": ["n"]}))

    big = body(wire.MAX_HEAD_VALUES + 1)
    assert wire.json_values_bound(big[:big.find(wire.NAMES_LAST)]) == wire.MAX_HEAD_VALUES + 1
    assert wire.split_names_last(big) is None
    small = body(wire.MAX_HEAD_VALUES)
    assert wire.split_names_last(small) is not None
    assert wire.MAX_HEAD_VALUES + wire.MAX_NODE_NAMES + 1 == wire.MAX_JSON_VALUES


def test_the_server_refuses_a_filter_with_too_many_values_that_the_fast_path_could_read(cluster: Cluster) -> None:
    """A filter whose pod holds more values than the server parses, followed by one known node's name: 413, as
    when every body was counted before anything was read from it (not answered by the bytes path)."""
    pod = pod_obj("x", {"main": 1})
    pod["spec"]["x"] = [0] * (wire.MAX_JSON_VALUES + 1)
    body = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": ["n"]})
    request = (b"POST /filter HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: "
               + str(len(body)).encode() + b"\r\n\r\n" + body)
    ok = orjson.dumps({"Pod": pod_obj("x", {"main": 1}), "Nodes": None, "NodeNames": ["n"]})
    assert exchange(cluster, b"POST /filter HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: "
                    + str(len(ok)).encode() + b"\r\n\r\n" + ok).startswith(b"HTTP/1.1 200 OK\r\n")
    out = exchange(cluster, request)
    assert out.startswith(b"HTTP/1.1 413 "), out[:200]
    assert b"JSON values" in out


# ------------------------------------------------------------------------ all names of 5,000 nodes (all5k)

@settings(max_examples=examples(400), derandomize=QUICK, deadline=None)
@given(st.data())
def test_the_names_after_a_kept_head_are_what_splitting_the_body_gives(data: st.DataObject) -> None:
    """wire.names_after_head(body, head), for a head split_names_last_at cut off some body: None, or exactly the
    array bytes split_names_last(body) gives, with the same head decoded (so prioritize may take the pod its
    filter decoded from those bytes). Bodies: the head's own with other arrays, spliced, cut or mangled, and
    bodies whose pod holds the ',"NodeNames":' text."""
    pod = data.draw(st.dictionaries(st.sampled_from(["a", "b", "NodeNames"]),
                                    st.text(max_size=4) | st.sampled_from([',"NodeNames":', '"]}', "x"]), max_size=3))
    names = data.draw(st.lists(st.sampled_from(["n0", "n1", 'x","NodeNames":["y']), max_size=3))
    first = bytearray(orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}))
    split = wire.split_names_last_at(first)
    if split is None:
        return
    head_obj, _, cut = split
    head = bytes(first[:cut])
    other = orjson.dumps(data.draw(st.lists(st.sampled_from(["n0", "n2", "]}", ',"NodeNames":']), max_size=3)))
    text = data.draw(st.sampled_from([bytes(first), head + b',"NodeNames":' + other + b"}", head + b"}",
                                      head + b',"NodeNames":' + other + b',"x":1}', head[:-1] + b',"NodeNames":[]}']))
    if data.draw(st.booleans()):
        at = data.draw(st.integers(0, len(text) - 1))
        text = text[:at] + data.draw(st.sampled_from([b"", b",", b'"', b"}", b"]"])) + text[at + 1:]
    body = bytearray(text)
    got = wire.names_after_head(body, head)
    assert body == text
    if got is None:
        return
    expected = wire.split_names_last(body)
    assert expected is not None and expected == (head_obj, got)


def test_prioritize_takes_its_filters_pod_without_decoding_it_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The prioritize that follows a filter with the same pod bytes (kube-scheduler's one cycle) reuses the pod
    filter decoded; any other pod bytes are decoded, and the answers are those of the decoding path."""
    state, verbs, names = synced_cluster(4, [40000])
    pods = []
    for i, mib in enumerate((1000, 3000)):
        pod = pod_obj(f"p{i}", {"main": mib})
        pod["metadata"]["uid"] = f"uid-{i}"
        pods.append(pod)

    def body(pod: dict) -> bytearray:
        return bytearray(orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}))

    decoded: list[object] = []
    decode = wire.decode_pod_of

    def counting(head: dict) -> dict:
        decoded.append(head)
        return decode(head)

    verbs.filter({"Pod": pods[0], "NodeNames": names})  # the nodes get their ids (the bytes path needs them)
    monkeypatch.setattr(wire, "decode_pod_of", counting)
    assert verbs.filter_json(body(pods[0])) is not None and len(decoded) == 1
    same = verbs.prioritize_json(body(pods[0]))
    assert len(decoded) == 1  # the filter's pod, not decoded again
    assert verbs.filter_json(body(pods[0])) is not None
    assert verbs.prioritize_json(body(pods[1])) is None  # another pod: decoded (its filter kept no answer)
    assert len(decoded) == 3
    fresh_state, fresh_verbs, _ = synced_cluster(4, [40000])
    assert same == fresh_verbs.prioritize({"Pod": pods[0], "NodeNames": names})[1]


def test_a_large_answer_and_the_next_arrive_whole_on_one_connection(cluster: Cluster) -> None:
    """Through HTTP on one keep-alive connection: a prioritize answer larger than LARGE_ANSWER (its head and
    body in one sendmsg, lean_http._write_parts), then a small one, each whole and framed by its
    Content-Length."""
    names = [f"absent-{i:05d}" for i in range(5000)]  # no such nodes: each scores 0
    pod = pod_obj("x", {"main": 1})
    body = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})
    small = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": ["n"]})
    assert cluster.ext is not None
    with socket.create_connection(("127.0.0.1", cluster.ext.port), timeout=10) as s:
        for data in (body, small):
            s.sendall(b"POST /prioritize HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(len(data)).encode()
                      + b"\r\n\r\n" + data)
        got = b""
        answers = []
        while len(answers) < 2:
            chunk = s.recv(1 << 16)
            assert chunk, "the connection closed before both answers"
            got += chunk
            while b"\r\n\r\n" in got:
                head, _, rest = got.partition(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length:")))
                if len(rest) < length:
                    break
                assert head.startswith(b"HTTP/1.1 200 OK\r\n")
                answers.append(orjson.loads(rest[:length]))
                got = rest[length:]
    assert answers[0] == [{"Host": n, "Score": 0} for n in names]
    assert len(answers[1]) == 1 and answers[1][0]["Host"] == "n"
    assert got == b""


PARTS = [bytes([65 + i % 26]) * (7_000 + 911 * i) for i in range(40)]  # ~1 MB in 40 parts of distinct bytes


class _SmallSendBuffer(LeanRequestHandler):
    """Answers GET with PARTS through a send buffer of a few KiB: the kernel takes the answer in many calls (a
    socket with a timeout, as the extender's: each call takes what fits and returns)."""

    timeout = 30

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)

    def do_GET(self) -> None:  # noqa: N802
        self.send_all(200, PARTS, "application/octet-stream")

    def log_message(self, fmt: str, *args: object) -> None:
        pass


def test_a_large_answer_in_parts_arrives_whole_through_a_small_send_buffer() -> None:
    """lean_http._write_parts sends all parts with sendmsg; what the kernel did not take (a send buffer of 4 KiB,
    a receive buffer of 4 KiB) is sent by the next call from where it stopped: the client reads the parts'
    bytes exactly, in order, then a second answer on the same connection."""
    httpd = BoundedHTTPServer(("127.0.0.1", 0), _SmallSendBuffer, ConnLimits())
    serving = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    serving.start()
    want = b"".join(PARTS)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.settimeout(10)
            s.connect(httpd.server_address[:2])
            for _ in range(2):
                s.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
                got = b""
                while b"\r\n\r\n" not in got:
                    chunk = s.recv(1 << 16)
                    assert chunk, "closed before the head"
                    got += chunk
                head, _, body = got.partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200") and f"Content-Length: {len(want)}".encode() in head
                while len(body) < len(want):
                    chunk = s.recv(1 << 16)
                    assert chunk, f"closed after {len(body)} of {len(want)} bytes"
                    body += chunk
                assert body == want
    finally:
        httpd.shutdown()
        httpd.server_close()

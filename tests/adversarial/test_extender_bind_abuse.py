"""/bind from a caller that is not kube-scheduler scheduling its own pod: every refusal is an `Error`, and
nothing is written (the API stand-in's resourceVersion does not move, the extender's state is unchanged).
Issue 11, item 1; docs/architecture.md, "Who may be bound"."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_extender_support import Cluster, node_obj, plain_node, pod_obj, running_cluster

from memslice.scheduler_extender.app import Config


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with running_cluster() as c:
        c.start()
        c.add_node(node_obj("gpu", [8000]))
        c.add_node(plain_node("cpu"))
        yield c


def snapshot(c: Cluster) -> tuple:
    return c.kube.resource_version, [(v.name, v.gpus, v.unplaced_mib) for v in c.state.views()], c.state.counts()


def bind(c: Cluster, pod: dict, node: str, uid: str | None = None) -> tuple[int, str]:
    meta = pod["metadata"]
    status, body = c.c.post("bind", {"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                     "PodUID": meta["uid"] if uid is None else uid, "Node": node})
    assert set(body) == {"Error"}, body
    return status, body["Error"]


def assert_nothing_written(c: Cluster, pod: dict, before: tuple) -> None:
    stored = c.kube.get("Pod", pod["metadata"]["namespace"], pod["metadata"]["name"])
    assert not stored["spec"].get("nodeName")
    assert not any(k.startswith("memslice.io/") for k in (stored["metadata"].get("annotations") or {}))
    assert snapshot(c) == before


@pytest.mark.parametrize(("case", "pod", "node", "uid", "status", "words"), [
    ("empty UID", pod_obj("gpu-a", {"main": 1000}), "gpu", "", 400, "PodUID must not be empty"),
    ("another pod's UID", pod_obj("gpu-b", {"main": 1000}), "gpu", "0c6f1a3e-not-this-pod", 200, "has UID"),
    ("GPU pod of the default scheduler", pod_obj("gpu-c", {"main": 1000}, ns="other", scheduler="default-scheduler"),
     "gpu", None, 200, "schedulerName 'default-scheduler'"),
    ("plain pod of another namespace and scheduler", pod_obj("web", ns="other", scheduler="default-scheduler"),
     "cpu", None, 200, "schedulerName 'default-scheduler'"),
    ("plain pod to a node that does not exist", pod_obj("plain"), "no-such-node", None, 200, "unknown"),
    ("GPU pod to a node without memslice GPUs", pod_obj("gpu-d", {"main": 1000}), "cpu", None, 200,
     "no memslice GPUs"),
    ("GPU pod larger than the node's GPU", pod_obj("gpu-e", {"main": 9000}), "gpu", None, 200, "no longer fits"),
])
def test_refused_with_an_error_and_nothing_written(cluster: Cluster, case: str, pod: dict, node: str,
                                                   uid: str | None, status: int, words: str) -> None:
    stored = cluster.add_pod(pod)
    before = snapshot(cluster)
    got_status, error = bind(cluster, stored, node, uid)
    assert (got_status, words in error) == (status, True), (case, error)
    assert_nothing_written(cluster, stored, before)


def test_the_same_pods_bind_when_the_request_is_right(cluster: Cluster) -> None:
    """The control: a served pod, its own UID, a known node with room."""
    pod = cluster.add_pod(pod_obj("good", {"main": 1000}))
    assert bind(cluster, pod, "gpu") == (200, "")
    assert cluster.kube.get("Pod", "default", "good")["spec"]["nodeName"] == "gpu"
    plain = cluster.add_pod(pod_obj("good-plain"))
    assert bind(cluster, plain, "cpu") == (200, "")


def test_scheduler_names_are_configurable() -> None:
    with running_cluster(Config(address="127.0.0.1", port=0, watch_timeout=30,
                                scheduler_names=("gpu-a", "gpu-b"))) as c:
        c.start()
        c.add_node(node_obj("gpu", [8000]))
        theirs = c.add_pod(pod_obj("b", {"main": 100}, scheduler="gpu-b"))
        ours_before = c.add_pod(pod_obj("m", {"main": 100}))  # memslice-scheduler: not served here
        assert bind(c, theirs, "gpu") == (200, "")
        status, error = bind(c, ours_before, "gpu")
        assert status == 200 and "gpu-a, gpu-b (--scheduler-names)" in error


def test_the_schedulers_own_pods_are_bound_from_the_watch_cache(cluster: Cluster) -> None:
    """The checks cost kube-scheduler's binds no API read: a pending pod of a served scheduler that the
    watch delivered is bound with its one write only, the Binding that carries the reservation (a pod of another
    scheduler is read, and refused)."""
    pod = cluster.add_pod(pod_obj("cached", {"main": 500}))
    cluster.kube.reset_counts()
    assert bind(cluster, pod, "gpu") == (200, "")
    assert cluster.kube.request_counts == {("create", "pods/binding"): 1}
    other = cluster.add_pod(pod_obj("other-cached", {"main": 500}, scheduler="default-scheduler"))
    cluster.kube.reset_counts()
    assert "schedulerName" in bind(cluster, other, "gpu")[1]
    assert cluster.kube.request_counts == {("get", "pods"): 1}

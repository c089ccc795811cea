"""The extender's state against a live API server: concurrent binds, pod deletion and completion, extender
restart, unbound reservations on the real kube-apiserver (its Binding, field-selected watch, status
subresource); failed binds and 410 Gone on the stand-in, whose fault hooks make them on demand. The API
server's own restart: tests/realcluster/test_real_apiserver_restart.py."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator

import pytest
from extender_real import RealExtCluster, real_ext_cluster
from kube_real import RealCluster, wait_until
from prometheus_client import generate_latest
from test_extender_support import Cluster, FakeClock, node_obj, running_cluster
from test_extender_support import pod_obj as any_pod

from memslice.scheduler_extender.app import Config
from memslice.scheduler_extender.kubeio.annotations import reservation_annotations

NS = "ext-cluster"  # this module's namespace on the shared real API server
REAL = pytest.mark.xdist_group("kube")  # one real control plane (the session fixture real_cluster): one worker


def pod_obj(name: str, containers: dict[str, int], **kw) -> dict:
    return any_pod(name, containers, ns=NS, **kw)


@pytest.fixture
def cluster(real_cluster: RealCluster) -> Iterator[RealExtCluster]:
    with real_ext_cluster(real_cluster, NS) as c:
        c.start()
        c.add_node(node_obj("ext-n", [10000]))
        yield c


@pytest.fixture
def standin() -> Iterator[Cluster]:
    """The stand-in, for the faults the real server cannot make on demand (injected errors, 410 Gone)."""
    with running_cluster() as c:
        c.start()
        c.add_node(node_obj("n", [10000]))
        yield c


def race(n: int, fn) -> list:
    """Run fn(i) for i in range(n) in threads released together; their results in order."""
    barrier = threading.Barrier(n)
    results: list = [None] * n

    def run(i: int) -> None:
        barrier.wait(10)
        results[i] = fn(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


@REAL
def test_two_binds_race_for_the_last_room_exactly_one_wins(cluster: RealExtCluster) -> None:
    a = cluster.add_pod(pod_obj("a", {"main": 6000}))
    b = cluster.add_pod(pod_obj("b", {"main": 6000}))
    errors = race(2, lambda i: cluster.c.__class__(cluster.ext.url).bind([a, b][i], "ext-n"))
    assert sorted(e == "" for e in errors) == [False, True], errors
    assert "no longer fits" in next(e for e in errors if e)
    bound = [p for p in ("a", "b") if cluster.kube.get("Pod", NS, p)["spec"].get("nodeName")]
    assert len(bound) == 1
    loser = "b" if bound == ["a"] else "a"
    assert "annotations" not in cluster.kube.get("Pod", NS, loser)["metadata"]
    cluster.wait_used("ext-n", [6000])


@REAL
def test_many_concurrent_binds_never_overcommit(cluster: RealExtCluster) -> None:
    pods = [cluster.add_pod(pod_obj(f"p{i}", {"main": 1500})) for i in range(12)]
    errors = race(12, lambda i: cluster.c.__class__(cluster.ext.url).bind(pods[i], "ext-n"))
    assert errors.count("") == 6  # 6 × 1500 = 9000 ≤ 10000 < 7 × 1500
    cluster.caught_up()
    cluster.wait_used("ext-n", [9000])
    bound = [i for i in range(12) if cluster.kube.get("Pod", NS, f"p{i}")["spec"].get("nodeName")]
    assert len(bound) == 6


# injected Binding errors: the stand-in's fault hook (the real server answers 500 or a 409 on its own terms only)
def test_failed_binding_leaves_nothing_charged(standin: Cluster) -> None:
    cluster = standin
    pod = cluster.add_pod(any_pod("p", {"main": 4000}))
    cluster.kube.fail_next("POST", "/pods/p/binding", 500)
    error = cluster.c.bind(pod, "n")
    assert "500" in error and "binding pod default/p to n failed" in error
    stored = cluster.kube.get("Pod", "default", "p")
    assert not stored["spec"].get("nodeName")
    assert not any(k.startswith("memslice.io/") for k in stored["metadata"].get("annotations", {}))
    cluster.caught_up()
    cluster.wait_used("n", [0])
    cluster.kube.fail_next("POST", "/pods/p/binding", 409)
    cluster.kube.fail_next("POST", "/pods/p/binding", 409)  # a conflict is retried once: twice fails the bind
    assert "409" in cluster.c.bind(pod, "n")
    cluster.caught_up()
    cluster.wait_used("n", [0])
    assert cluster.c.bind(pod, "n") == ""  # and the scheduler's retry succeeds
    cluster.wait_used("n", [4000])


# injected 409s on demand: the stand-in's fault hook
def test_binding_conflict_is_retried_once_with_a_fresh_read(standin: Cluster) -> None:
    cluster = standin
    pod = cluster.add_pod(any_pod("p", {"main": 4000}))
    cluster.kube.fail_next("POST", "/pods/p/binding", 409)
    assert cluster.c.bind(pod, "n") == ""
    stored = cluster.kube.get("Pod", "default", "p")
    assert stored["spec"]["nodeName"] == "n" and stored["metadata"]["annotations"]["memslice.io/gpu-uuid"]
    cluster.kube.put(any_pod("q", {"main": 1000}))
    q = cluster.kube.get("Pod", "default", "q")
    cluster.caught_up()
    cluster.kube.fail_next("POST", "/pods/q/binding", 409)
    cluster.kube.fail_next("POST", "/pods/q/binding", 409)
    assert "409" in cluster.c.bind(q, "n")
    cluster.caught_up()
    cluster.wait_used("n", [4000])


# a Binding's annotations dropped on the way (a mutating webhook on pods/binding): the stand-in's knob
def test_a_binding_whose_reservation_is_dropped_is_said_counted_and_overbooks_nothing(standin: Cluster,
                                                                                    caplog) -> None:
    """Issue 39.2: the reservation rides on the Binding. Should the API server drop its annotations, the pod is
    bound without a reservation: the extender says so (an error naming the pod, the node and the fix), counts it
    (memslice_extender_tracked{what="bound_without_reservation"}), and charges the pod to its node's memory as a pod
    bound without the extender, so nothing is overbooked."""
    cluster = standin
    cluster.kube.drop_binding_annotations = True
    pod = cluster.add_pod(any_pod("p", {"main": 4000}))
    with caplog.at_level(logging.ERROR, logger="memslice.scheduler_extender.placement.state"):
        assert cluster.c.bind(pod, "n") == ""
        stored = cluster.kube.get("Pod", "default", "p")
        assert stored["spec"]["nodeName"] == "n" and "memslice.io/gpu-uuid" not in stored["metadata"].get(
            "annotations", {})
        cluster.caught_up()
        wait_until("the dropped reservation counted", lambda: cluster.state.counts()["bound_without_reservation"] == 1,
                   10)
    assert any("pod default/p was bound to n WITHOUT its reservation" in r.getMessage() for r in caplog.records)
    assert 'memslice_extender_tracked{what="bound_without_reservation"} 1.0' in generate_latest(
        cluster.ext.metrics.registry).decode()
    cluster.wait_used("n", [0])
    assert cluster.state.view("n").unplaced_mib == 4000  # the node's memory: charged, on no GPU
    big = cluster.add_pod(any_pod("big", {"main": 7000}))  # 4000 + 7000 > 10000: refused
    assert not cluster.c.filter(big, ["n"])["NodeNames"]
    cluster.kube.drop_binding_annotations = False
    fits = cluster.add_pod(any_pod("fits", {"main": 6000}))
    assert cluster.c.bind(fits, "n") == ""
    cluster.caught_up()
    assert cluster.state.counts()["bound_without_reservation"] == 1  # a bind that kept its reservation: not counted


@REAL
def test_bind_refuses_a_recreated_pod(cluster: RealExtCluster) -> None:
    old = cluster.add_pod(pod_obj("p", {"main": 1000}))
    cluster.kube.delete("Pod", NS, "p")
    cluster.add_pod(pod_obj("p", {"main": 1000}))
    assert "deleted and re-created" in cluster.c.bind(old, "ext-n")
    assert not cluster.kube.get("Pod", NS, "p")["spec"].get("nodeName")


@REAL
def test_the_binding_carries_the_reservation_in_one_update_under_its_preconditions(cluster: RealExtCluster) -> None:
    """Issue 39.2, on the real kube-apiserver: what the binder's ONE write relies on. A Binding whose
    resourceVersion is stale, or whose UID is another pod's, is refused (409) and writes nothing: no node, no
    annotation (the two writes' guarantees: a pod changed or re-created meanwhile is never bound with a reservation
    made for what it was). The extender's Binding sets spec.nodeName and the reservation in ONE update: a watch
    from the pod's version before the bind sees one change, carrying both (never a pod bound without them)."""
    kube, api = cluster.kube, cluster.kube.cluster
    pod = cluster.add_pod(pod_obj("p", {"main": 1000}))
    meta = kube.get("Pod", NS, "p")["metadata"]
    binding = kube.path("Pod", NS, "p", "binding")
    reservation = reservation_annotations("GPU-ext-n-0", {"main": 1000}, time.time())

    def post(uid: str, rv: str) -> tuple[int, str]:
        status, out = api.request("POST", binding, {
            "apiVersion": "v1", "kind": "Binding", "target": {"apiVersion": "v1", "kind": "Node", "name": "ext-n"},
            "metadata": {"name": "p", "namespace": NS, "uid": uid, "resourceVersion": rv,
                         "annotations": reservation}})
        return status, str(out.get("message", "") if isinstance(out, dict) else out)

    touched = api.ok("PATCH", kube.path("Pod", NS, "p"), {"metadata": {"labels": {"touched": "yes"}}},
                     content_type="application/merge-patch+json")["metadata"]
    status, message = post(meta["uid"], meta["resourceVersion"])  # the version before the label
    assert status == 409 and "Precondition failed: ResourceVersion in precondition" in message, (status, message)
    status, message = post("00000000-0000-0000-0000-000000000000", touched["resourceVersion"])
    assert status == 409 and "UID in precondition" in message, (status, message)
    stored = kube.get("Pod", NS, "p")
    assert not stored["spec"].get("nodeName") and stored["metadata"].get("annotations") is None
    assert stored["metadata"]["resourceVersion"] == touched["resourceVersion"]  # nothing written

    assert cluster.c.bind(pod, "ext-n") == ""
    status, out = api.request("GET", kube.path("Pod", NS) + "?watch=1&fieldSelector=metadata.name%3Dp"
                                     f"&resourceVersion={touched['resourceVersion']}&timeoutSeconds=2")
    assert status == 200, out
    # one event decodes as one JSON object; several are one per line
    events = [out] if isinstance(out, dict) else [json.loads(line) for line in str(out).splitlines() if line.strip()]
    assert [e["type"] for e in events] == ["MODIFIED"], events
    bound = events[0]["object"]
    assert bound["spec"]["nodeName"] == "ext-n"
    assert bound["metadata"]["annotations"]["memslice.io/gpu-uuid"] == "GPU-ext-n-0"
    assert json.loads(bound["metadata"]["annotations"]["memslice.io/gpu-mem-mib"]) == {"main": 1000}
    cluster.wait_used("ext-n", [1000])


@REAL
def test_deleted_and_finished_pods_release_memory(cluster: RealExtCluster) -> None:
    """A deleted pod, and one whose kubelet reports it Succeeded (through the status subresource): the
    extender's field-selected watch hears "stopped matching" as a deletion and the memory comes back."""
    a = cluster.add_pod(pod_obj("a", {"main": 3000}))
    b = cluster.add_pod(pod_obj("b", {"main": 3000}))
    assert cluster.c.bind(a, "ext-n") == "" and cluster.c.bind(b, "ext-n") == ""
    cluster.wait_used("ext-n", [6000])
    cluster.kube.delete("Pod", NS, "a")
    cluster.wait_used("ext-n", [3000])
    done = cluster.kube.get("Pod", NS, "b")
    done["status"] = {"phase": "Succeeded"}
    cluster.kube.put(done)
    assert cluster.kube.get("Pod", NS, "b")["status"]["phase"] == "Succeeded"
    cluster.wait_used("ext-n", [0])


# 410 Gone on demand (compaction between two events of an open watch): the stand-in's fault hook
def test_410_gone_relists_and_sees_what_happened_meanwhile(standin: Cluster) -> None:
    cluster = standin
    a = cluster.add_pod(any_pod("a", {"main": 3000}))
    assert cluster.c.bind(a, "n") == ""
    cluster.wait_used("n", [3000])
    kube = cluster.kube
    with kube.store.cond:  # atomically: the open watch cannot deliver these events, only a 410
        kube.delete("Pod", "default", "a")
        kube.put(node_obj("n", [10000, 20000]))
        kube.compact()
    cluster.wait_used("n", [0, 0])
    assert cluster.state.wait_for(lambda s: s.last_rv["pods"] > 0, 5)
    status, text, _ = cluster.c.raw("GET", "/metrics")
    assert 'memslice_extender_watch_restarts_total{reason="gone",resource="pods"}' in text.decode()
    # and it keeps following afterwards
    b = cluster.add_pod(any_pod("b", {"main": 15000}))
    assert cluster.c.filter(b, ["n"])["NodeNames"] == ["n"]


@REAL
def test_extender_restart_rebuilds_state_and_never_hands_out_twice(real_cluster: RealCluster) -> None:
    with real_ext_cluster(real_cluster, NS) as c:
        c.start()
        c.add_node(node_obj("ext-n2", [8000, 8000]))
        pods = [c.add_pod(pod_obj(f"p{i}", {"main": 3000})) for i in range(4)]
        for p in pods:
            assert c.c.bind(p, "ext-n2") == ""
        c.wait_used("ext-n2", [6000, 6000])
        c.stop()
        c.start()  # a fresh extender: everything from the API server
        c.wait_used("ext-n2", [6000, 6000])
        big = c.add_pod(pod_obj("big", {"main": 3000}))
        assert c.c.filter(big, ["ext-n2"])["NodeNames"] == []
        assert "no longer fits" in c.c.bind(big, "ext-n2")
        small = c.add_pod(pod_obj("small", {"main": 2000}))
        assert c.c.bind(small, "ext-n2") == ""
        c.wait_used("ext-n2", [8000, 6000])


@REAL
def test_unbound_reservation_expires_after_the_ttl(real_cluster: RealCluster) -> None:
    """An extender that wrote a reservation and died before the Binding: the memory comes back."""
    clock = FakeClock()
    with real_ext_cluster(real_cluster, NS, Config(address="127.0.0.1", port=0, assume_ttl=60), clock) as c:
        c.kube.put(node_obj("ext-n3", [10000]))
        c.kube.put(pod_obj("orphan", {"main": 8000}, annotations=reservation_annotations(
            "GPU-ext-n3-0", {"main": 8000}, clock.now - 10)))
        c.start()  # the restarted extender counts the orphan while its reservation is fresh
        c.wait_used("ext-n3", [8000])
        pod = c.add_pod(pod_obj("p", {"main": 5000}))
        assert c.c.filter(pod, ["ext-n3"])["FailedNodes"].keys() == {"ext-n3"}
        clock.now += 51
        assert c.c.filter(pod, ["ext-n3"])["NodeNames"] == ["ext-n3"]
        c.wait_used("ext-n3", [0])
        assert c.c.bind(pod, "ext-n3") == ""
        c.wait_used("ext-n3", [5000])


@REAL
def test_a_pods_own_stale_reservation_does_not_stand_in_its_way(cluster: RealExtCluster) -> None:
    """A bind wrote the reservation, failed, and could not undo it: the pod's retry must still fit."""
    stale = reservation_annotations("GPU-ext-n-0", {"main": 6000}, time.time())
    pod = cluster.add_pod(pod_obj("p", {"main": 6000}, annotations=stale))
    cluster.wait_used("ext-n", [6000])  # counted (unbound, within the assume TTL): nobody else gets it
    other = cluster.add_pod(pod_obj("other", {"main": 6000}))
    assert cluster.c.filter(other, ["ext-n"])["NodeNames"] == []
    assert cluster.c.filter(pod, ["ext-n"])["NodeNames"] == ["ext-n"]
    assert cluster.c.bind(pod, "ext-n") == ""
    cluster.caught_up()
    cluster.wait_used("ext-n", [6000])  # once, not twice
    assert "no longer fits" in cluster.c.bind(other, "ext-n")

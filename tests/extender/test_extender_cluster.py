"""The extender's state against a live (stand-in) API server: concurrent binds, failed binds, pod
deletion and completion, 410 Gone, extender restart, unbound reservations. The API server's own restart runs
against the real kube-apiserver (tests/realcluster/test_real_apiserver_restart.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from test_extender_support import Cluster, FakeClock, node_obj, pod_obj, running_cluster

from memslice.scheduler_extender.app import Config
from memslice.scheduler_extender.kubeio.annotations import reservation_annotations


@pytest.fixture
def cluster() -> Iterator[Cluster]:
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


def test_two_binds_race_for_the_last_room_exactly_one_wins(cluster: Cluster) -> None:
    a = cluster.add_pod(pod_obj("a", {"main": 6000}))
    b = cluster.add_pod(pod_obj("b", {"main": 6000}))
    errors = race(2, lambda i: cluster.c.__class__(cluster.ext.url).bind([a, b][i], "n"))
    assert sorted(e == "" for e in errors) == [False, True], errors
    assert "no longer fits" in next(e for e in errors if e)
    bound = [p for p in ("a", "b") if cluster.kube.get("Pod", "default", p)["spec"].get("nodeName")]
    assert len(bound) == 1
    loser = "b" if bound == ["a"] else "a"
    assert "annotations" not in cluster.kube.get("Pod", "default", loser)["metadata"]
    cluster.wait_used("n", [6000])


def test_many_concurrent_binds_never_overcommit(cluster: Cluster) -> None:
    pods = [cluster.add_pod(pod_obj(f"p{i}", {"main": 1500})) for i in range(12)]
    errors = race(12, lambda i: cluster.c.__class__(cluster.ext.url).bind(pods[i], "n"))
    assert errors.count("") == 6  # 6 × 1500 = 9000 ≤ 10000 < 7 × 1500
    cluster.caught_up()
    cluster.wait_used("n", [9000])
    bound = [i for i in range(12) if cluster.kube.get("Pod", "default", f"p{i}")["spec"].get("nodeName")]
    assert len(bound) == 6


def test_failed_binding_leaves_nothing_charged(cluster: Cluster) -> None:
    pod = cluster.add_pod(pod_obj("p", {"main": 4000}))
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


def test_binding_conflict_is_retried_once_with_a_fresh_read(cluster: Cluster) -> None:
    pod = cluster.add_pod(pod_obj("p", {"main": 4000}))
    cluster.kube.fail_next("POST", "/pods/p/binding", 409)
    assert cluster.c.bind(pod, "n") == ""
    stored = cluster.kube.get("Pod", "default", "p")
    assert stored["spec"]["nodeName"] == "n" and stored["metadata"]["annotations"]["memslice.io/gpu-uuid"]
    cluster.kube.put(pod_obj("q", {"main": 1000}))
    q = cluster.kube.get("Pod", "default", "q")
    cluster.caught_up()
    cluster.kube.fail_next("POST", "/pods/q/binding", 409)
    cluster.kube.fail_next("POST", "/pods/q/binding", 409)
    assert "409" in cluster.c.bind(q, "n")
    cluster.caught_up()
    cluster.wait_used("n", [4000])


def test_bind_refuses_a_recreated_pod(cluster: Cluster) -> None:
    old = cluster.add_pod(pod_obj("p", {"main": 1000}))
    cluster.kube.delete("Pod", "default", "p")
    cluster.add_pod(pod_obj("p", {"main": 1000}))
    assert "deleted and re-created" in cluster.c.bind(old, "n")
    assert not cluster.kube.get("Pod", "default", "p")["spec"].get("nodeName")


def test_deleted_and_finished_pods_release_memory(cluster: Cluster) -> None:
    a = cluster.add_pod(pod_obj("a", {"main": 3000}))
    b = cluster.add_pod(pod_obj("b", {"main": 3000}))
    assert cluster.c.bind(a, "n") == "" and cluster.c.bind(b, "n") == ""
    cluster.wait_used("n", [6000])
    cluster.kube.delete("Pod", "default", "a")
    cluster.wait_used("n", [3000])
    done = cluster.kube.get("Pod", "default", "b")
    done["status"] = {"phase": "Succeeded"}
    cluster.kube.put(done)
    cluster.wait_used("n", [0])


def test_410_gone_relists_and_sees_what_happened_meanwhile(cluster: Cluster) -> None:
    a = cluster.add_pod(pod_obj("a", {"main": 3000}))
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
    b = cluster.add_pod(pod_obj("b", {"main": 15000}))
    assert cluster.c.filter(b, ["n"])["NodeNames"] == ["n"]


def test_extender_restart_rebuilds_state_and_never_hands_out_twice() -> None:
    with running_cluster() as c:
        c.start()
        c.add_node(node_obj("n", [8000, 8000]))
        pods = [c.add_pod(pod_obj(f"p{i}", {"main": 3000})) for i in range(4)]
        for p in pods:
            assert c.c.bind(p, "n") == ""
        c.wait_used("n", [6000, 6000])
        c.stop()
        c.start()  # a fresh extender: everything from the API server
        c.wait_used("n", [6000, 6000])
        big = c.add_pod(pod_obj("big", {"main": 3000}))
        assert c.c.filter(big, ["n"])["NodeNames"] == []
        assert "no longer fits" in c.c.bind(big, "n")
        small = c.add_pod(pod_obj("small", {"main": 2000}))
        assert c.c.bind(small, "n") == ""
        c.wait_used("n", [8000, 6000])


def test_unbound_reservation_expires_after_the_ttl() -> None:
    """An extender that wrote a reservation and died before the Binding: the memory comes back."""
    clock = FakeClock()
    with running_cluster(Config(address="127.0.0.1", port=0, assume_ttl=60), clock) as c:
        c.kube.put(node_obj("n", [10000]))
        c.kube.put(pod_obj("orphan", {"main": 8000}, annotations=reservation_annotations(
            "GPU-n-0", {"main": 8000}, clock.now - 10)))
        c.start()  # the restarted extender counts the orphan while its reservation is fresh
        c.wait_used("n", [8000])
        pod = c.add_pod(pod_obj("p", {"main": 5000}))
        assert c.c.filter(pod, ["n"])["FailedNodes"].keys() == {"n"}
        clock.now += 51
        assert c.c.filter(pod, ["n"])["NodeNames"] == ["n"]
        c.wait_used("n", [0])
        assert c.c.bind(pod, "n") == ""
        c.wait_used("n", [5000])


def test_a_pods_own_stale_reservation_does_not_stand_in_its_way(cluster: Cluster) -> None:
    """A bind wrote the reservation, failed, and could not undo it: the pod's retry must still fit."""
    stale = reservation_annotations("GPU-n-0", {"main": 6000}, time.time())
    pod = cluster.add_pod(pod_obj("p", {"main": 6000}, annotations=stale))
    cluster.wait_used("n", [6000])  # counted (unbound, within the assume TTL): nobody else gets it
    other = cluster.add_pod(pod_obj("other", {"main": 6000}))
    assert cluster.c.filter(other, ["n"])["NodeNames"] == []
    assert cluster.c.filter(pod, ["n"])["NodeNames"] == ["n"]
    assert cluster.c.bind(pod, "n") == ""
    cluster.caught_up()
    cluster.wait_used("n", [6000])  # once, not twice
    assert "no longer fits" in cluster.c.bind(other, "n")

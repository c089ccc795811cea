"""Filter waits while the gate's limit of binds is in flight (scheduler_extender/edge/gate.py, issue 39), over
real HTTP: the extender on the API stand-in, whose hook holds a Binding in the server until the test lets it
go (the real API server answers too fast to hold one there)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from test_extender_support import Cluster, node_obj, pod_obj, running_cluster
from waiting import wait_until

from memslice.scheduler_extender.edge.gate import BindGate


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with running_cluster() as c:
        c.start()
        c.add_node(node_obj("n", [16000]))
        yield c


class HeldBindings:
    """The stand-in's hook: each Binding waits in the server until `release` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.held = 0

    def __call__(self, method: str, path: str) -> None:
        if path.endswith("/binding"):
            self.held += 1
            self.release.wait(30)


def _in_thread(fn: Any, *args: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn(*args)))
    thread.start()
    return thread, out


def _a_bind_held(cluster: Cluster, max_wait_s: float) -> tuple[BindGate, dict[str, Any], HeldBindings,
                                                                threading.Thread, list[Any]]:
    """A gate of one bind in flight whose filters wait at most `max_wait_s`; pods a and b of 4,000 MiB; a's
    bind started on node n in a thread, its Binding to be held in the API server (the test releases it)."""
    assert cluster.ext is not None
    gate: BindGate = cluster.ext.verbs.gate
    gate.limit, gate.max_wait_s = 1, max_wait_s
    a = cluster.add_pod(pod_obj("a", {"main": 4000}))
    b = cluster.add_pod(pod_obj("b", {"main": 4000}))
    held = HeldBindings()
    cluster.kube.before_request = held
    binding, bound = _in_thread(cluster.c.bind, a, "n")
    return gate, b, held, binding, bound


def test_filter_waits_while_the_binds_in_flight_fill_the_gate(cluster: Cluster) -> None:
    """With one bind allowed in flight and its Binding held in the API server, the next pod's filter waits
    (the scheduler decides nothing meanwhile) and answers once the bind has ended; both pods fit."""
    gate, b, held, binding, bound = _a_bind_held(cluster, 60.0)  # the wait ends when the test lets it go
    try:
        wait_until("a's Binding held in the API server", lambda: held.held == 1, 10)
        assert gate.in_flight == 1
        filtering, filtered = _in_thread(cluster.c.filter, b, ["n"])
        wait_until("b's filter waiting at the gate", lambda: gate.waited == 1, 10)
        assert filtering.is_alive() and not filtered  # no answer while a's bind is in flight
        status, page, _ = cluster.c.raw("GET", "/metrics")  # a wait in progress is no outcome yet: the
        assert status == 200  # counters never fall back (Prometheus would read a reset)
        waits = "memslice_extender_filter_gate_waits_total"
        for line in (f'{waits}{{outcome="room"}} 0.0', f'{waits}{{outcome="timed_out"}} 0.0'):
            assert line in page.decode().splitlines(), line
    finally:
        held.release.set()
    binding.join(30)
    filtering.join(30)
    assert bound == [""] and filtered[0]["NodeNames"] == ["n"], (bound, filtered)
    assert (gate.in_flight, gate.got_room, gate.timed_out) == (0, 1, 0)
    assert cluster.c.bind(b, "n") == ""  # b's bind finds the gate open again
    cluster.caught_up()
    cluster.wait_used("n", [8000])


def test_filter_answers_after_its_bounded_wait_and_failed_binds_leave_the_gate(cluster: Cluster) -> None:
    """The wait is bounded: with the gate still full when it ends, filter answers anyway (counted as timed
    out, and so on /metrics). A bind that fails (its Binding refused) leaves the count, so filters stop waiting."""
    gate, b, held, binding, bound = _a_bind_held(cluster, 0.0)
    try:
        wait_until("a's Binding held in the API server", lambda: held.held == 1, 10)
        assert cluster.c.filter(b, ["n"])["NodeNames"] == ["n"]
        assert (gate.waited, gate.got_room, gate.timed_out, gate.in_flight) == (1, 0, 1, 1)
        status, page, _ = cluster.c.raw("GET", "/metrics")
        assert status == 200
        waits = "memslice_extender_filter_gate_waits_total"
        for line in ("memslice_extender_binds_in_flight 1.0", f'{waits}{{outcome="room"}} 0.0',
                     f'{waits}{{outcome="timed_out"}} 1.0'):
            assert line in page.decode().splitlines(), line
    finally:
        held.release.set()
    binding.join(30)
    assert bound == [""]
    cluster.kube.before_request = None
    cluster.kube.fail_next("POST", "/pods/b/binding", 500)
    assert "500" in cluster.c.bind(b, "n")
    assert gate.in_flight == 0
    assert cluster.c.filter(b, ["n"])["NodeNames"] == ["n"]
    assert (gate.waited, gate.timed_out) == (1, 1)  # the gate was open: no wait


def test_gate_refuses_a_limit_below_one() -> None:
    with pytest.raises(ValueError, match="limit of at least 1"):
        BindGate(limit=0)

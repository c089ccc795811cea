"""Swap Events through the official Kubernetes client against the API stand-in (real HTTP): the first notice
of a pod and kind creates a core/v1 Event, later ones patch its count, one that expired is created anew, and
an API server that refuses (403) or answers garbage costs a log line, never the loop."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from kube_standin import KubeApiStandin
from test_elastic_attribution import view_of
from waiting import wait_until

from memslice.plugin.elastic.events import OUT, SwapEvents
from memslice.plugin.elastic.metrics import Counts, ElasticView


class Swaps:
    """What the tracker would report: pod p swaps out `n` ranges more each time `more()` is called."""

    def __init__(self) -> None:
        self.n = 0
        self.lock = threading.Lock()

    def more(self) -> None:
        with self.lock:
            self.n += 4

    def view(self) -> ElasticView:
        with self.lock:
            return view_of({"p": Counts(self.n, 0, self.n * 0.01, 0)})


@pytest.fixture
def kube() -> Iterator[KubeApiStandin]:
    k = KubeApiStandin().start()
    yield k
    k.stop()


def test_events_are_created_then_patched_then_created_again(kube: KubeApiStandin, caplog) -> None:
    swaps = Swaps()
    ev = SwapEvents(kube.api_client(), "node-1", swaps.view, interval_s=1.0, poll_s=0.05)
    ev.start()
    try:
        wait_until("the baseline poll", lambda: ev.policy.seen, 20)
        swaps.more()
        wait_until("the first Event", lambda: kube.list("Event", "ns"), 20)
        (first,) = kube.list("Event", "ns")
        assert (first["reason"], first["type"], first["count"]) == (OUT, "Normal", 1)
        assert first["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "ns", "name": "p",
                                           "uid": "uid-p"}
        assert first["source"] == {"component": "memslice-node-agent", "host": "node-1"}
        assert "4 range(s)" in first["message"]
        swaps.more()
        swaps.more()
        wait_until("the Event's count patched", lambda: kube.list("Event", "ns")[0]["count"] == 2, 20)
        (again,) = kube.list("Event", "ns")
        assert again["metadata"]["name"] == first["metadata"]["name"] and "8 range(s)" in again["message"]
        assert kube.count("create", "events") == 1 and kube.count("patch", "events") == 1
        kube.delete("Event", "ns", first["metadata"]["name"])  # expired
        swaps.more()
        wait_until("a new Event", lambda: kube.list("Event", "ns"), 20)
        assert kube.list("Event", "ns")[0]["count"] == 1 and kube.count("create", "events") == 2
        # refused: one warning naming the RBAC fix, and the loop goes on
        kube.fail_next("POST", "/events", 403)
        kube.delete("Event", "ns", kube.list("Event", "ns")[0]["metadata"]["name"])
        swaps.more()
        wait_until("the 403 warning", lambda: "needs create/patch on events" in caplog.text, 20)
        swaps.more()
        wait_until("an Event after the refusal", lambda: kube.list("Event", "ns"), 20)
    finally:
        ev.stop()

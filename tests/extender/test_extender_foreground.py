"""Binds and watch events give way to the scheduling cycle's filter and prioritize (edge/foreground.py): through
the real HTTP server and the API stand-in's watch, a pod event that arrives while a filter is being served
waits for its answer (bounded), and is applied after it; the wait is bounded whatever the verbs do."""

from __future__ import annotations

import socket
import threading

import orjson
import pytest
from test_extender_support import node_obj, pod_obj, running_cluster
from waiting import wait_until

from memslice.scheduler_extender.edge import foreground
from memslice.scheduler_extender.edge.foreground import Foreground


def running_pod(name: str, node: str, gpu: str, mib: int) -> dict:
    pod = pod_obj(name, {"main": mib})
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Running"}
    pod["metadata"]["annotations"] = {"memslice.io/gpu-uuid": gpu,
                                      "memslice.io/gpu-mem-mib": orjson.dumps({"main": mib}).decode(),
                                      "memslice.io/assumed-at": "2026-01-01T00:00:00.000000Z"}
    return pod


def test_a_watch_event_waits_for_the_filter_being_served(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(foreground, "MAX_WAIT_S", 60.0)  # long enough to see the event wait
    with running_cluster() as c:
        c.start()
        c.add_node(node_obj("n", [8000]))
        assert c.ext is not None
        fg = c.ext.verbs.foreground
        body = orjson.dumps({"Pod": pod_obj("x", {"main": 2000}), "Nodes": None, "NodeNames": ["n"]})
        with socket.create_connection(("127.0.0.1", c.ext.port), timeout=30) as s:
            s.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: "
                      + str(len(body)).encode() + b"\r\n\r\n" + body[:10])
            wait_until("the filter is being served", fg.busy, 10)
            c.kube.put(running_pod("other", "n", "GPU-n-0", 7000))  # 7,000 of the GPU's 8,000 MiB taken
            wait_until("the pod's watch event waits for the filter", lambda: fg.waiting == 1, 10)
            assert c.state.pod("default", "other") is None  # not applied while the filter is served
            s.sendall(body[10:])
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
        head, _, rest = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK") and orjson.loads(rest)["NodeNames"] == ["n"]  # before it
        c.caught_up()  # then the event is applied: the next filter sees the GPU taken
        assert c.used("n") == [7000]
        assert c.c.filter(pod_obj("y", {"main": 2000}), ["n"])["NodeNames"] == []
        assert fg.waits >= 1 and fg.waiting == 0


def test_the_wait_is_bounded_and_ends_with_the_verb() -> None:
    fg = Foreground(max_wait_s=0.05, expect_s=0.0)
    assert fg.give_way() == 0.0 and fg.waits == 0  # nothing served: no wait, no lock
    fg.begin()
    assert fg.give_way() >= 0.05  # a verb that never ends holds nothing past the bound
    patient = Foreground(max_wait_s=60.0, expect_s=0.0)
    patient.begin()
    waited: list[float] = []
    t = threading.Thread(target=lambda: waited.append(patient.give_way()))
    t.start()
    wait_until("the bind waits", lambda: patient.waiting == 1, 10)
    assert t.is_alive()
    patient.end(expect_more=False)
    t.join(10)
    assert not t.is_alive() and waited and patient.waiting == 0

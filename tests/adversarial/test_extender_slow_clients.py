"""Slow and idle clients cannot hold the extender: a body that does not arrive in time gets 408 and frees
its budget, idle connections cost a thread each and nothing else, and kube-scheduler's requests are
answered meanwhile (issue 11, "slow clients"). docs/architecture.md, "Request limits"."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import pytest
from test_extender_support import Client, Cluster, node_obj, pod_obj, running_cluster

from memslice.scheduler_extender import app
from memslice.scheduler_extender.edge import server

BODY_TIMEOUT = 1.0


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    monkeypatch.setattr(server, "BODY_TIMEOUT_S", BODY_TIMEOUT)  # the default (10 s) makes a slow test
    # hostile clients from several addresses, as on a port reached over the network (mutual TLS): the caps per
    # address apply (on loopback in plain HTTP every client is the pod's own scheduler: test_extender_cli.py)
    monkeypatch.setattr(app, "verbs_limits", lambda address, tls: server.VERBS_LIMITS)
    with running_cluster() as c:
        c.start()
        c.add_node(node_obj("n", [8000]))
        yield c


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0))


def stalled(c: Cluster, length: int, sent: bytes, source: str = "127.0.0.1") -> socket.socket:
    """A connection that declared a body of `length` bytes, sent `sent` of it, and stopped."""
    assert c.ext is not None
    s = connect(c.ext.port, source)
    s.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % length + sent)
    return s


def answer(s: socket.socket) -> tuple[int, bytes]:
    f = s.makefile("rb")
    status = int(f.readline().split()[1])
    length = 0
    while (line := f.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        length = int(value) if name.lower() == "content-length" else length
    return status, f.read(length)


def test_a_stalled_body_gets_408_and_frees_the_large_budget(cluster: Cluster) -> None:
    big = 6 << 20  # a large body: it takes the large budget, which fits one such at a time
    slow = stalled(cluster, big, b'{"Pod":')
    names = [f"node-{i:06d}" for i in range(100_000)]
    body = json.dumps({"Pod": pod_obj("p", {"main": 1}), "NodeNames": names}).encode()
    body += b" " * (big - len(body))  # same size: it waits for the stalled one's budget
    got: list[int] = []

    def legit() -> None:
        status, _, _ = Client(cluster.ext.url).raw("POST", "/filter", body)  # type: ignore[union-attr]
        got.append(status)

    t = threading.Thread(target=legit)
    t.start()
    # meanwhile small requests are answered at once: they never wait behind large ones
    assert cluster.c.filter(pod_obj("small", {"main": 1}), ["n"])["NodeNames"] == ["n"]
    status, raw = answer(slow)
    assert status == 408 and b"did not arrive within" in raw
    slow.close()
    t.join(30)
    assert got == [200]  # it got the budget when the stalled body timed out (within WAIT_S)


def test_idle_and_trickling_connections_do_not_block_the_scheduler(cluster: Cluster) -> None:
    assert cluster.ext is not None
    cap = server.VERBS_LIMITS.per_peer
    idle = [connect(cluster.ext.port, "127.0.0.2") for _ in range(cap + 20)]
    trickling = [stalled(cluster, 1000, b"{" if i % 2 else b"", "127.0.0.3") for i in range(50)]  # part or none
    try:
        pod = cluster.add_pod(pod_obj("p", {"main": 100}))
        assert cluster.c.filter(pod, ["n"])["NodeNames"] == ["n"]
        assert cluster.c.bind(pod, "n") == ""
        for s in trickling:
            assert answer(s)[0] == 408
        for s in idle[cap:]:  # over the peer's cap: refused at once, before any request
            status, raw = answer(s)
            assert status == 503 and b"too many connections" in raw
    finally:
        for s in idle + trickling:
            s.close()

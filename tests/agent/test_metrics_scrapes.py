"""Scrapes are cheap and bounded (issue 25): however many scrape at once, the page is rendered for all of
them together, at most MAX_SCRAPES are answered at once (503 beyond, at once), and a scrape never gets a
page rendered before it arrived. The node agent's metrics server over real HTTP, with a collector the test
holds inside its render (so the overlap is certain, not timed)."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from memslice.lean_http import ConnLimits
from memslice.plugin.metrics import MAX_SCRAPES, HealthServer


class HeldCollector:
    """A gauge whose value is the number of renders so far; the first render waits for `release`."""

    def __init__(self) -> None:
        self.renders = 0
        self.inside = threading.Event()
        self.release = threading.Event()

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self.renders += 1
        if self.renders == 1:
            self.inside.set()
            assert self.release.wait(30)
        yield GaugeMetricFamily("test_renders", "renders so far", value=self.renders)


@pytest.fixture
def served() -> Iterator[tuple[HealthServer, HeldCollector]]:
    registry = CollectorRegistry()
    held = HeldCollector()
    registry.register(held)
    # all scrapers come from 127.0.0.1: room for them all, so that only the scrape bound refuses
    server = HealthServer(registry, lambda: True, lambda: True, "127.0.0.1", 0, ConnLimits(per_peer=32))
    server.start()
    yield server, held
    held.release.set()
    server.stop()


def scrape(port: int) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/metrics")
        r = conn.getresponse()
        return r.status, r.read().decode()
    finally:
        conn.close()


def test_twenty_scrapers_share_renders_and_the_excess_is_refused(served) -> None:
    server, held = served
    results: list[tuple[int, str]] = []
    first = threading.Thread(target=lambda: results.append(scrape(server.port)))
    first.start()
    assert held.inside.wait(30)  # the first scrape is rendering (and holds one of the slots)
    others = [threading.Thread(target=lambda: results.append(scrape(server.port))) for _ in range(19)]
    for t in others:
        t.start()
    # three more get slots and wait for a render that begins after they arrived; the 16 others are refused
    # at once, while the render is still held
    refused = lambda: sum(1 for s, _ in results if s == 503)  # noqa: E731
    deadline = threading.Event()
    for _ in range(600):
        if refused() == 19 - (MAX_SCRAPES - 1):
            break
        deadline.wait(0.05)
    assert refused() == 19 - (MAX_SCRAPES - 1), results
    assert all("too many scrapes in progress" in text for s, text in results if s == 503)
    held.release.set()
    for t in [first, *others]:
        t.join(30)
    ok = [text for s, text in results if s == 200]
    assert len(ok) == MAX_SCRAPES
    assert sum("test_renders 1.0" in t for t in ok) == 1
    assert held.renders == 2  # one for the first scrape, one shared by the three that arrived after it began
    assert sum("test_renders 2.0" in t for t in ok) == MAX_SCRAPES - 1
    status, text = scrape(server.port)  # a later scrape: a render that began after it arrived
    assert status == 200 and "test_renders 3.0" in text


def test_idle_connections_are_closed_at_the_idle_deadline() -> None:
    """A keep-alive connection after its answer, and one that never sends a byte: each is closed by the
    server once idle for idle_s (here 0.5 s; 30 s as deployed), the first after its answer."""
    registry = CollectorRegistry()
    server = HealthServer(registry, lambda: True, lambda: True, "127.0.0.1", 0, ConnLimits(idle_s=0.5))
    server.start()
    try:
        used = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        silent = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        t0 = time.monotonic()
        used.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = used.recv(4096)
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"ok\n")
        for s in (used, silent):
            assert s.recv(4096) == b""  # closed by the server (recv waits at most the socket's 10 s)
        assert time.monotonic() - t0 < 0.5 + 1.0
        used.close()
        silent.close()
    finally:
        server.stop()

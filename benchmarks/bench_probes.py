"""What the kubelet's probes and the scheduler's new TLS connections wait while attackers hold connections
(issue 35 items 1 and 5): the time of one kubelet-style probe (a new connection, GET /healthz, Connection:
close) and of one new mutual-TLS connection with one request, on an idle port and under the issue's attacks.

    .venv/bin/python benchmarks/bench_probes.py [--json] [--runs N]

Servers in this process, as the services build them (memslice.probe_http.ProbeServer; a BoundedHTTPServer
with METRICS_LIMITS; one with VERBS_LIMITS and the extender's TLS context); attackers from 127.0.0.2...,
reconnecting what the server closed before each timed call. Medians, milliseconds.
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from memslice.lean_http import BoundedHTTPServer, ConnLimits, LeanRequestHandler
from memslice.plugin.metrics import METRICS_LIMITS
from memslice.probe_http import ProbeServer
from memslice.scheduler_extender.edge.server import VERBS_LIMITS, tls_context


class Ok(LeanRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        self.send_all(200, b"ok\n", "text/plain")

    do_POST = do_GET  # noqa: N815

    def log_message(self, fmt: str, *args: object) -> None:
        pass


def serve(limits: ConnLimits, tls: ssl.SSLContext | None = None) -> tuple[BoundedHTTPServer, int]:
    httpd = BoundedHTTPServer(("127.0.0.1", 0), Ok, limits, tls)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    return httpd, int(httpd.server_address[1])


class Attackers:
    """`per_addr` connections from each of `addrs` addresses, each sending `opening`; refill() reconnects
    those the server closed."""

    def __init__(self, port: int, addrs: int, per_addr: int, opening: bytes) -> None:
        self.port, self.opening = port, opening
        self.sources = [f"127.0.0.{2 + i}" for i in range(addrs) for _ in range(per_addr)]
        self.socks: list[socket.socket | None] = [None] * len(self.sources)

    def refill(self) -> None:
        for i, s in enumerate(self.socks):
            if s is not None:
                try:
                    s.setblocking(False)
                    data = s.recv(4096)
                    if data and not data.startswith(b"HTTP/1.1 503"):
                        continue
                except BlockingIOError:
                    continue
                except OSError:
                    pass
                s.close()
            try:
                fresh = socket.create_connection(("127.0.0.1", self.port), timeout=10,
                                                 source_address=(self.sources[i], 0))
                if self.opening:
                    fresh.sendall(self.opening)
                self.socks[i] = fresh
            except OSError:
                self.socks[i] = None

    def close(self) -> None:
        for s in self.socks:
            if s is not None:
                s.close()


def probe(port: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/healthz", headers={"Connection": "close"})
    status = conn.getresponse().status
    conn.close()
    if status != 200:
        raise RuntimeError(f"probe answered {status}")


def timed(call: Callable[[], None], attack: Attackers | None, runs: int) -> dict[str, float]:
    times, failed = [], 0
    for _ in range(runs):
        if attack is not None:
            attack.refill()
        t0 = time.perf_counter()
        try:
            call()
        except (OSError, RuntimeError, http.client.HTTPException):
            failed += 1
            continue
        times.append((time.perf_counter() - t0) * 1000)
    return {"median_ms": statistics.median(times) if times else float("nan"), "failed": failed, "runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # the servers' refusal lines
    out: dict[str, dict[str, float]] = {}
    keepalive, stalled = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", b"GET /healthz HTTP/1.1\r\n"

    probes = ProbeServer("127.0.0.1", 0, lambda: True, lambda: True, "bench").start()
    metrics, mport = serve(METRICS_LIMITS)
    out["probe port, idle"] = timed(lambda: probe(probes.port), None, args.runs)
    for name, port, opening in (("metrics port, 5 x 8 keep-alives", mport, keepalive),
                                ("probe port, 5 x 8 stalled heads", probes.port, stalled)):
        attack = Attackers(port, 5, 8, opening)
        out[name] = timed(lambda port=port: probe(port), attack, args.runs)  # type: ignore[misc]
        attack.close()
    probes.stop()
    metrics.shutdown()
    metrics.server_close()

    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.executable, "-m", "memslice", "extender-certs", "--out-dir", d], check=True,
                       capture_output=True)
        pki = Path(d)
        httpd, port = serve(VERBS_LIMITS, tls_context(str(pki / "server.crt"), str(pki / "server.key"),
                                                      str(pki / "ca.crt")))
        client = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        client.check_hostname = False
        client.load_cert_chain(str(pki / "client.crt"), str(pki / "client.key"))

        def call() -> None:
            conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=30, context=client)
            conn.request("POST", "/filter", body=b"{}")
            status = conn.getresponse().status
            conn.close()
            if status != 200:
                raise RuntimeError(f"answered {status}")

        out["TLS port, idle: new connection + request"] = timed(call, None, args.runs)
        attack = Attackers(port, 5, 64, b"")
        out["TLS port, 5 x 64 stalled handshakes"] = timed(call, attack, args.runs)
        attack.close()
        httpd.shutdown()
        httpd.server_close()

    if args.json:
        print(json.dumps(out, indent=1))
        return
    for name, r in out.items():
        print(f"{name:45} {r['median_ms']:8.2f} ms median   {int(r['failed'])} of {int(r['runs'])} failed")


if __name__ == "__main__":
    main()

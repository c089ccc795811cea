"""The kubelet's probes on a listener of their own, for the node agent and the extender.

Why: on the port shared with Prometheus, five addresses holding 8 keep-alive connections each took every
connection slot, and the kubelet's probes got 503 until it restarted the service. Here:
- the port serves GET /healthz, /livez and /readyz and nothing else, answered from memory (no render, no
  lock another request holds), and closes every connection after one answer (the kubelet's prober sends
  `Connection: close` anyway), so no client keeps a connection between requests;
- PROBE_LIMITS: short deadlines (2 s to send a request head, 2 s to take the answer) and 4 connections per
  address; a newcomer over the total cap takes the place of a connection still waiting for its client
  (memslice.lean_http.pick_victim: of the address holding the most), so a probe, which sends its request at
  once, is answered however many addresses hold connections;
- deploy/ points both probes here and no NetworkPolicy rule admits a pod to the port: only the node (the
  kubelet) reaches it where the network plugin enforces NetworkPolicy.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from memslice.lean_http import BoundedHTTPServer, ConnLimits, LeanRequestHandler

log = logging.getLogger(__name__)

PROBE_LIMITS = ConnLimits(max_connections=16, per_peer=4, handshake_s=2.0, idle_s=2.0, head_s=2.0, answer_s=2.0,
                          pressure_idle_s=0.5)
PROBE_PATHS = ("/healthz", "/livez", "/readyz")

Live = Callable[[], bool]
Ready = Callable[[], bool | str]  # True, False, or why it is not ready


def probe_answer(path: str, live: Live, ready: Ready) -> tuple[int, bytes]:
    """(status, body) of a GET of `path` on the probe port."""
    path = path.split("?", 1)[0].rstrip("/") or "/"
    if path in ("/healthz", "/livez"):
        ok = live()
        return (200, b"ok\n") if ok else (503, b"not live: a loop of the service stalled\n")
    if path == "/readyz":
        state = ready()
        if state is True:
            return 200, b"ok\n"
        why = state if isinstance(state, str) and state else "not ready"
        return 503, why.encode()[:4096] + b"\n"
    return 404, b"not found: this port serves only the kubelet's probes, GET /healthz, /livez and /readyz\n"


class ProbeServer:
    """GET /healthz, /livez, /readyz on (host, port), one answer per connection, under PROBE_LIMITS."""

    def __init__(self, host: str, port: int, live: Live, ready: Ready, name: str,
                 limits: ConnLimits = PROBE_LIMITS) -> None:
        class Handler(LeanRequestHandler):
            server_version = name
            timeout = limits.head_s  # per read; the server's deadlines bound the whole request

            def do_GET(self) -> None:  # noqa: N802 (http.server API)
                self.close_connection = True
                code, body = probe_answer(self.path, live, ready)
                self.send_all(code, body, "text/plain")

            def log_message(self, fmt: str, *args: object) -> None:
                log.debug("probe http: " + fmt, *args)

        self.httpd = BoundedHTTPServer((host, port), Handler, limits)
        self.port = int(self.httpd.server_address[1])
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="probe-http", daemon=True)

    def start(self) -> ProbeServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self.httpd.shutdown()
        self.httpd.server_close()

"""HTTP(S) front of the extender: POST /filter /prioritize /bind /preempt (under any URL prefix, e.g.
/memslice/filter), GET /healthz /readyz /metrics.

Why the stdlib ThreadingHTTPServer: kube-scheduler keeps a few keep-alive connections and sends one
small JSON request at a time on each; a thread per connection fits that exactly, the verbs are CPU-bound
Python either way, and it adds no dependency (no framework is needed for four JSON endpoints). The
handler is memslice.lean_http's: the stdlib's with a faster header parser and one-write answers.

Hostile input: bodies need a Content-Length (411 otherwise) no larger than --max-body-mib (413, the
body is not read and the connection is closed); a body that is not JSON gets 400; reads time out after
30 s; any unexpected exception answers 500 with an `Error` and is logged; nothing crashes the server.
TLS (kube-scheduler's `enableHTTPS`): the handshake runs in the connection's thread, not in accept().
"""

from __future__ import annotations

import json
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from typing import Any

import orjson

from memslice.lean_http import LeanRequestHandler
from memslice.scheduler_extender.metrics import Metrics
from memslice.scheduler_extender.verbs import Verbs

log = logging.getLogger(__name__)
VERBS = ("filter", "prioritize", "bind", "preempt")


class ExtenderHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, address: tuple[str, int], verbs: Verbs, metrics: Metrics, ready: Callable[[], bool],
                 max_body: int, tls: ssl.SSLContext | None) -> None:
        self.verbs, self.metrics, self.ready, self.max_body, self.tls = verbs, metrics, ready, max_body, tls
        self.conns: set[socket.socket] = set()
        self.conns_lock = threading.Lock()
        self._children: dict[tuple[str, int], tuple[Any, Any]] = {}
        super().__init__(address, _Handler)

    def metric_children(self, verb: str, code: int) -> tuple[Any, Any]:
        """(requests counter, latency histogram) of this verb and code; `labels()` looked up once."""
        pair = self._children.get((verb, code))
        if pair is None:
            pair = self._children[(verb, code)] = (self.metrics.requests.labels(verb, str(code)),
                                                   self.metrics.latency.labels(verb))
        return pair

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = super().get_request()
        if self.tls is not None:
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.warning("connection from %s failed", client_address, exc_info=True)

    def close_connections(self) -> None:
        with self.conns_lock:
            conns = list(self.conns)
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _Handler(LeanRequestHandler):
    server: ExtenderHTTPServer
    server_version = "memslice-extender"
    disable_nagle_algorithm = True  # no delayed-ACK stalls on small answers
    timeout = 30
    # A filter call (a Pod and 500 node names: 8 to tens of KB) is read with one recv, not several: each
    # recv on a socket with a timeout gives up the GIL twice, and winning it back means queueing behind binds.
    rbufsize = 1 << 16

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s " + format, self.client_address[0], *args)

    def setup(self) -> None:
        super().setup()
        if isinstance(self.connection, ssl.SSLSocket):
            try:
                self.connection.do_handshake()
            except (ssl.SSLError, OSError) as exc:
                log.info("TLS handshake with %s failed: %s", self.client_address[0], exc)
                self.dead = True
        with self.server.conns_lock:
            self.server.conns.add(self.connection)

    dead = False

    def handle(self) -> None:
        if self.dead:
            return
        try:
            super().handle()
        except (ssl.SSLError, ConnectionError, TimeoutError, OSError):
            pass

    def finish(self) -> None:
        with self.server.conns_lock:
            self.server.conns.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_all(code, body, ctype)

    def _json(self, code: int, obj: Any) -> None:
        """`obj` as JSON; bytes are taken as JSON already encoded (prioritize's answer)."""
        if isinstance(obj, bytes):
            return self._send(code, obj)
        try:
            data = orjson.dumps(obj)
        except orjson.JSONEncodeError:  # deeper than orjson writes (254 levels): only echoed request objects
            try:
                data = json.dumps(obj, separators=(",", ":")).encode()
            except (RecursionError, ValueError) as exc:
                code, data = 400, orjson.dumps({"Error": f"the answer would echo objects of the request that are "
                                                         f"nested too deeply to encode ({exc})"})
        self._send(code, data)

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        path = self.path.split("?", 1)[0].rstrip("/")
        if path in ("/healthz", "/livez"):
            return self._send(200, b"ok\n", "text/plain")
        if path == "/readyz":
            ok = self.server.ready()
            return self._send(200 if ok else 503, b"ok\n" if ok else b"not synced with the API server\n",
                              "text/plain")
        if path == "/metrics":
            data, ctype = self.server.metrics.render()
            return self._send(200, data, ctype)
        verb = path.rsplit("/", 1)[-1]
        if verb in VERBS:
            return self._json(405, {"Error": f"/{verb} takes POST with a JSON body"})
        return self._json(404, {"Error": f"no such endpoint {path!r}; use POST /filter, /prioritize, /bind, "
                                         f"/preempt or GET /healthz, /readyz, /metrics"})

    def do_POST(self) -> None:  # noqa: N802
        t0 = time.perf_counter()
        verb = self.path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        if verb not in VERBS:
            verb_label = "unknown"
            code, obj = 404, {"Error": f"no such verb {self.path!r}; use /filter, /prioritize, /bind or "
                                       f"/preempt"}
            self._drain_or_close()
        else:
            verb_label = verb
            code, obj = self._handle_verb(verb)
        self._json(code, obj)
        requests, latency = self.server.metric_children(verb_label, code)
        requests.inc()
        latency.observe(time.perf_counter() - t0)

    def do_PUT(self) -> None:  # noqa: N802
        self._drain_or_close()
        self._json(405, {"Error": "use POST"})

    do_DELETE = do_PATCH = do_PUT  # noqa: N815

    def _drain_or_close(self) -> None:
        length = self.headers.get("Content-Length")
        if length and length.isdigit() and int(length) <= self.server.max_body:
            self.rfile.read(int(length))
        else:
            self.close_connection = True

    def _read_body(self) -> tuple[int, bytes | str]:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            self.close_connection = True
            return 411, "chunked request bodies are not accepted; send a Content-Length"
        length = self.headers.get("Content-Length")
        if length is None or not length.strip().isdigit():
            self.close_connection = True
            return 411, f"a Content-Length header is required (got {length!r})"
        n = int(length)
        if n > self.server.max_body:
            self.close_connection = True
            return 413, (f"request body of {n} bytes is larger than the limit of {self.server.max_body} "
                         f"bytes (--max-body-mib)")
        data = self.rfile.read(n)
        if len(data) != n:
            self.close_connection = True
            return 400, f"request body ended after {len(data)} of {n} bytes"
        return 200, data

    def _handle_verb(self, verb: str) -> tuple[int, Any]:
        status, data = self._read_body()
        if status != 200:
            assert isinstance(data, str)
            return status, _error_body(verb, data)
        assert isinstance(data, bytes)
        try:
            body = orjson.loads(data)
        except (ValueError, RecursionError) as exc:
            return 400, _error_body(verb, f"request body is not JSON: {exc}")
        handler = getattr(self.server.verbs, verb)
        try:
            return handler(body)
        except RecursionError:
            return 400, _error_body(verb, "request body is nested too deeply")
        except Exception as exc:  # noqa: BLE001 - never crash on a request
            log.exception("%s failed", verb)
            return 500, _error_body(verb, f"internal error in the memslice extender: "
                                          f"{type(exc).__name__}: {exc}")


def _error_body(verb: str, message: str) -> dict[str, Any]:
    if verb == "filter":
        return {"Nodes": None, "NodeNames": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
                "Error": message}
    if verb == "preempt":
        return {"NodeNameToMetaVictims": None, "Error": message}
    return {"Error": message}


def tls_context(cert_file: str, key_file: str, client_ca_file: str | None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_file, key_file)
    if client_ca_file:
        ctx.load_verify_locations(client_ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx

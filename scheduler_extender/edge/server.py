"""HTTP(S) front of the extender: POST /filter /prioritize /bind /preempt (under any URL prefix, e.g.
/memslice/filter), GET /healthz /readyz /metrics.

Why the stdlib ThreadingHTTPServer: kube-scheduler keeps a few keep-alive connections and sends one
small JSON request at a time on each; a thread per connection fits that exactly, the verbs are CPU-bound
Python either way, and it adds no dependency (no framework is needed for four JSON endpoints). The
handler is memslice.lean_http's: the stdlib's with a faster header parser and one-write answers.

Hostile input (docs/architecture.md, "Request limits"): bodies need exactly one Content-Length (411
otherwise; two, or one with Transfer-Encoding: 400) no larger than --max-body-mib (413, the body is not
read and the connection is closed). What parsing a body can cost is bounded before it is read:
`request_cost` (the body plus BYTES_PER_VALUE for each JSON value it can hold; once the body's values are
counted, only the body plus BYTES_PER_VALUE per value counted is kept) is taken from one of two
byte budgets, small bodies' and large bodies', so large requests queue among themselves (at most
WAIT_S, then 503) and never in front of small ones; before a body is parsed whole, one that may hold more
than MAX_JSON_VALUES values gets 413 unparsed (a few C-speed byte counts; filter's and prioritize's
reads of the request's bytes parse a bounded head only, wire.split_names_last), and nesting deeper than the parser's
1,024 levels gets 400. The whole body must arrive within BODY_TIMEOUT_S (a slow client holds its budget no
longer); idle reads time out after 30 s. Any unexpected exception answers 500 with an `Error` and is
logged; nothing crashes the server.
Every port has memslice.lean_http's bounds: the request head at most 8 KiB, deadlines on the TLS
handshake (5 s), the idle wait (30 s), the head (5 s from its first byte) and the answer, and a cap on
connections: VERBS_LIMITS on the verbs port (kube-scheduler's parallel binds come from one peer), the
defaults on the health port; one over the cap is refused in the accept loop (503, or closed under TLS)
without a thread. /metrics renders are spaced by ten times their cost, one for all waiting scrapers
(Metrics.page), and at most MAX_SCRAPES are answered at once (503 beyond): scraping cannot take the verbs' CPU.
TLS (kube-scheduler's `enableHTTPS`): the handshake runs in the connection's thread (BoundedHTTPServer's,
before the handler), not in accept().
With a client CA, a client without a certificate signed by it fails the handshake (CERT_REQUIRED).
A health-only server (--health-port) answers GET /healthz /readyz /metrics and nothing else; the kubelet's
probes have a port of their own (--probe-port, memslice.probe_http). On the TLS port, handshakes in progress
have a pool of their own (ConnLimits.handshakes, 16 per address), apart from VERBS_LIMITS' connections.
"""

from __future__ import annotations

import json
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson

from memslice.lean_http import BoundedHTTPServer, ConnLimits, LeanRequestHandler

from ..wire import MAX_JSON_VALUES, JsonParts, json_values_bound
from .metrics import Metrics
from .verbs import Verbs

log = logging.getLogger(__name__)
VERBS = ("filter", "prioritize", "bind", "preempt")

BYTES_PER_VALUE = 128  # Python memory per parsed JSON value, worst case (an empty list: 72 B) plus the verb's
SMALL_BODY = 256 << 10  # bodies up to this size use the small budget (a filter of 5,000 nodes: ~180 KiB)
SMALL_BUDGET = 64 << 20  # bytes of request_cost that small bodies may hold at once
WAIT_S = 10.0  # the longest a request waits for budget (kube-scheduler's httpTimeout in deploy/base)
BODY_TIMEOUT_S = 10.0  # the whole body must arrive within this
ANSWER_TIMEOUT_S = 10.0  # the whole answer must be taken within this (over TLS: each write)
LINGER_S, LINGER_BYTES = 2.0, 64 << 20  # what a refused body's sender may still send, dropped unread
# kube-scheduler sends filters and parallel binds (one connection each) from its one pod address
VERBS_LIMITS = ConnLimits(max_connections=256, per_peer=64)
HEALTH_LIMITS = ConnLimits()  # the kubelet's probes and a few Prometheus replicas


def request_cost(length: int) -> int:
    """The most memory a body of `length` bytes may take once read and parsed: itself, plus
    BYTES_PER_VALUE for each value it may hold (at least two bytes per value, at most MAX_JSON_VALUES)."""
    return length + BYTES_PER_VALUE * min(MAX_JSON_VALUES, length // 2 + 1)


class ByteBudget:
    """A semaphore counted in bytes: at most `capacity` bytes held at once. A request larger than the
    capacity takes all of it (it runs alone)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held = 0
        self._cond = threading.Condition()

    def acquire(self, n: int, timeout: float) -> int | None:
        """Take min(n, capacity) bytes within `timeout` seconds; the amount taken, or None."""
        n = min(n, self.capacity)
        with self._cond:
            if not self._cond.wait_for(lambda: self.held + n <= self.capacity, timeout):
                return None
            self.held += n
            return n

    def release(self, n: int) -> None:
        with self._cond:
            self.held -= n
            self._cond.notify_all()


class ExtenderHTTPServer(BoundedHTTPServer):
    def __init__(self, address: tuple[str, int], verbs: Verbs, metrics: Metrics, ready: Callable[[], bool],
                 max_body: int, tls: ssl.SSLContext | None, health_only: bool = False,
                 limits: ConnLimits | None = None) -> None:
        self.verbs, self.metrics, self.ready, self.max_body = verbs, metrics, ready, max_body
        self.health_only = health_only
        self.small_budget = ByteBudget(SMALL_BUDGET)
        self.large_budget = ByteBudget(request_cost(max_body))  # one body of the largest size at a time
        self.conns: set[socket.socket] = set()
        self.conns_lock = threading.Lock()
        self._children: dict[tuple[str, int], tuple[Any, Any]] = {}
        super().__init__(address, _Handler, limits or (HEALTH_LIMITS if health_only else VERBS_LIMITS), tls)

    def metric_children(self, verb: str, code: int) -> tuple[Any, Any]:
        """(requests counter, latency histogram) of this verb and code; `labels()` looked up once."""
        pair = self._children.get((verb, code))
        if pair is None:
            pair = self._children[(verb, code)] = (self.metrics.requests.labels(verb, str(code)),
                                                   self.metrics.latency.labels(verb))
        return pair

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

    def setup(self) -> None:  # the TLS handshake is done (BoundedHTTPServer.process_request_thread)
        super().setup()
        with self.server.conns_lock:
            self.server.conns.add(self.connection)

    def handle(self) -> None:
        try:
            super().handle()
        except (ssl.SSLError, ConnectionError, TimeoutError, OSError):
            pass

    unread = False  # the request declared a body this handler did not read (a refusal)

    def _linger(self) -> None:
        """Why: a client still sending a body that was refused would get a reset (and lose the answer) if the
        socket closed under it; so take in and drop what it sends, bounded in time and bytes, keeping none."""
        try:
            if not isinstance(self.connection, ssl.SSLSocket):
                self.connection.shutdown(socket.SHUT_WR)
            buf = bytearray(1 << 16)
            deadline, got = time.monotonic() + LINGER_S, 0
            while got < LINGER_BYTES and (left := deadline - time.monotonic()) > 0:
                self.connection.settimeout(left)
                n = self.connection.recv_into(buf)
                if not n:
                    break
                got += n
        except (OSError, ValueError):
            pass

    def finish(self) -> None:
        if self.unread and self.close_connection:
            self._linger()
        with self.server.conns_lock:
            self.server.conns.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    def _send(self, code: int, body: bytes | list[bytes], ctype: str = "application/json") -> None:
        self.send_all(code, body, ctype)

    def _json(self, code: int, obj: Any) -> None:
        """`obj` as JSON; bytes and JsonParts are taken as JSON already encoded (prioritize's and filter's
        answers from the request's bytes)."""
        if isinstance(obj, bytes):
            return self._send(code, obj)
        if isinstance(obj, JsonParts):
            return self._send(code, list(obj))
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
            return self._metrics()
        verb = path.rsplit("/", 1)[-1]
        if self.server.health_only:
            return self._json(404, {"Error": f"no such endpoint {path!r} on this port; it serves only GET "
                                             f"/healthz, /readyz and /metrics"})
        if verb in VERBS:
            return self._json(405, {"Error": f"/{verb} takes POST with a JSON body"})
        return self._json(404, {"Error": f"no such endpoint {path!r}; use POST /filter, /prioritize, /bind, "
                                         f"/preempt or GET /healthz, /readyz, /metrics"})

    def _metrics(self) -> None:
        """The page shared by all scrapers (Metrics.page); 503 while MAX_SCRAPES others are being answered."""
        scrapes = self.server.metrics.scrapes
        if not scrapes.acquire():
            self.close_connection = True
            return self._send(503, b"too many scrapes in progress; try again later\n", "text/plain")
        try:
            page = self.server.metrics.page()
            if page is None:
                self.close_connection = True
                return self._send(503, b"metrics are being rendered for others; try again\n", "text/plain")
            self._send(200, page[0], page[1])
        finally:
            scrapes.release()

    def do_POST(self) -> None:  # noqa: N802
        t0 = time.perf_counter()
        verb = self.path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        if self.server.health_only:
            self.close_connection = self.unread = True
            return self._json(404, {"Error": "this port serves only GET /healthz, /readyz and /metrics; the "
                                             "verbs are served on the extender's main port"})
        if verb not in VERBS:
            verb_label = "unknown"
            code, obj = 404, {"Error": f"no such verb {self.path!r}; use /filter, /prioritize, /bind or "
                                       f"/preempt"}
            self._drain_or_close()
            self._json(code, obj)
        else:
            verb_label = verb
            code = self._handle_verb(verb)
        requests, latency = self.server.metric_children(verb_label, code)
        requests.inc()
        latency.observe(time.perf_counter() - t0)

    def do_PUT(self) -> None:  # noqa: N802
        self._drain_or_close()
        self._json(405, {"Error": "use POST"})

    do_DELETE = do_PATCH = do_PUT  # noqa: N815

    def _drain_or_close(self) -> None:
        """After a request whose body nobody reads: keep the connection only when there is no body."""
        if (self.headers.get("Content-Length") or "0").strip() != "0" or "Transfer-Encoding" in self.headers:
            self.close_connection = self.unread = True

    def _read_body(self) -> tuple[int, bytearray | str]:
        """(200, body) or (status, message). The caller holds the budget for len(body) (see _handle_verb)."""
        n = int(self.headers.get("Content-Length") or 0)
        data = self._body_room(n)  # the budget covers it; filled in place, never copied
        view, got = memoryview(data), 0
        deadline = time.monotonic() + BODY_TIMEOUT_S
        timed = False
        try:
            while got < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                self.connection.settimeout(left)  # per read: the whole body within the deadline
                timed = True
                k = self.rfile.readinto1(view[got:])
                if not k:
                    break
                got += k
        except TimeoutError:
            self.close_connection = self.unread = True
            return 408, (f"request body of {n} bytes did not arrive within {BODY_TIMEOUT_S:g} s "
                         f"({got} bytes came)")
        finally:
            view.release()
            if timed:
                self.connection.settimeout(self.timeout)
        if got != n:
            self.close_connection = True
            return 400, f"request body ended after {got} of {n} bytes"
        return 200, data

    _room: bytearray | None = None  # this connection's body buffer (see _body_room)

    def _body_room(self, n: int) -> bytearray:
        """A bytearray of n bytes for a body to be read into: up to SMALL_BODY, this connection's, reused from
        its last request (every byte is written by the body before anything reads it: _read_body answers an
        error for a body that ends short); a larger one is fresh and not kept. Why: bytearray(n) zeroes its n
        bytes, 65 KB twice per pod with all 5,000 names (benchmarks/README.md, issue 39, fifth pass). Nothing
        keeps a body past its request (the verbs copy what they keep)."""
        if n > SMALL_BODY:
            return bytearray(n)
        room = self._room
        try:
            if room is None:
                room = self._room = bytearray(n)
            elif len(room) > n:
                del room[n:]
            elif len(room) < n:
                room.extend(bytes(n - len(room)))
        except BufferError:  # a view of the last body still held somewhere: that one is left to it
            room = self._room = bytearray(n)
        return room

    def _count_values(self, data: bytearray) -> str | None:
        """Before the body is parsed whole: why it is refused (too many JSON values), or None, and the budget
        then held for it cut to what its values may cost."""
        values = json_values_bound(data)
        if values > MAX_JSON_VALUES:
            return (f"request body may hold {values} JSON values; at most {MAX_JSON_VALUES} are parsed "
                    f"(a filter of 50,000 nodes holds about 52,000)")
        self._keep_only(len(data) + BYTES_PER_VALUE * values)
        return None

    def _length(self) -> tuple[int, int | str]:
        """(200, Content-Length) or (status, message) before anything is read."""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            self.close_connection = self.unread = True
            return 411, "chunked request bodies are not accepted; send a Content-Length"
        length = self.headers.get("Content-Length")
        if length is None or not length.strip().isdigit():
            self.close_connection = True
            return 411, f"a Content-Length header is required (got {length!r})"
        n = int(length)
        if n > self.server.max_body:
            self.close_connection = self.unread = True
            return 413, (f"request body of {n} bytes is larger than the limit of {self.server.max_body} "
                         f"bytes (--max-body-mib)")
        return 200, n

    def _handle_verb(self, verb: str) -> int:
        """Answer a verb; the status sent. The budget is held from before the body is read until the answer
        (built from it) has been written, which a slow reader may delay by ANSWER_TIMEOUT_S at most."""
        status, length = self._length()
        if status != 200:
            assert isinstance(length, str)
            self._json(status, _error_body(verb, length))
            return status
        assert isinstance(length, int)
        if verb == "filter":  # the next decision waits for the binds in flight (gate.py: why), bounded
            self.server.verbs.gate.wait_room()
        budget = self.server.small_budget if length <= SMALL_BODY else self.server.large_budget
        held = budget.acquire(request_cost(length), WAIT_S)
        if held is None:
            self.close_connection = self.unread = True
            self._json(503, _error_body(verb, f"the extender is busy with other large requests; a body of "
                                              f"{length} bytes waited {WAIT_S:g} s for memory (try again)"))
            return 503
        self._budget, self._held = budget, held
        try:
            code, obj = self._parse_and_run(verb)
            if budget is self.server.small_budget:  # an answer that fits the socket's buffers
                self._json(code, obj)
                return code
            self.connection.settimeout(ANSWER_TIMEOUT_S)  # sendall: a bound on the whole answer (TCP)
            try:
                self._json(code, obj)
            finally:
                self.connection.settimeout(self.timeout)
            return code
        finally:
            budget.release(self._held)

    _budget: ByteBudget
    _held = 0

    def _keep_only(self, cost: int) -> None:
        """Once the body is read and its values counted: give back what the request will not need."""
        if cost < self._held:
            self._budget.release(self._held - cost)
            self._held = cost

    def _parse_and_run(self, verb: str) -> tuple[int, Any]:
        status, data = self._read_body()
        if status != 200:
            assert isinstance(data, str)
            return status, _error_body(verb, data)
        assert isinstance(data, bytearray)
        handler: Callable[[Any], tuple[int, Any]] = getattr(self.server.verbs, verb)
        try:
            # The fast paths first, under the budget taken for the whole length (request_cost): they decode
            # the head only if it holds few enough values and read at most MAX_NODE_NAMES names
            # (wire.split_names_last), so what they serve the count below would have let through. Why: that
            # count goes over every byte (two bodies of 65 KB per pod with all 5,000 names).
            if verb == "prioritize" and (answer := self.server.verbs.prioritize_json(data)) is not None:
                return 200, answer  # its pod's filter answer, replayed from the request's bytes
            if verb == "filter" and (result := self.server.verbs.filter_json(data)) is not None:
                return result  # the names looked up from the request's bytes
            if (refused := self._count_values(data)) is not None:
                return 413, _error_body(verb, refused)
            try:
                body = orjson.loads(data)
            except (ValueError, RecursionError) as exc:
                return 400, _error_body(verb, f"request body is not JSON: {exc}")
            del data
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
    """The verbs port's TLS. No session tickets: kube-scheduler's extender client (client-go's
    restclient.TLSConfigFor) keeps no session cache, so it never resumes, and it dials a new connection whenever
    more than two of its requests are in flight (Go's MaxIdleConnsPerHost: 2; binds run in parallel): minting
    TLS 1.3's two tickets per handshake was half of each handshake's CPU (2.75 -> 1.38 ms alone, 2.2 -> 1.6 ms in
    a burst through the real scheduler; benchmarks/README.md, "The extender at a third of its CPU")."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.num_tickets = 0  # TLS 1.3
    ctx.options |= ssl.OP_NO_TICKET  # TLS 1.2
    ctx.load_cert_chain(cert_file, key_file)
    if client_ca_file:
        ctx.load_verify_locations(client_ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx

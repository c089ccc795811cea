"""A leaner `BaseHTTPRequestHandler` for the JSON servers (the extender; the tests' API stand-in).

Why (keep a hand-written piece only where a benchmark shows the library cannot meet the
extender's targets): per request the stdlib handler parses headers with the email package
(http.client.parse_headers, ~30 µs for five headers), formats the Date header with email.utils, and writes
status line, headers and body in separate calls. `benchmarks/bench_http.py` puts that at 63-79 µs of CPU
per filter request against 23-30 µs here; in the extender itself (bench_extender.py with and without
benchmarks/stdlib_http/ on PYTHONPATH, three interleaved pairs, 2-core machine, 2026-11-23) the stdlib
handler took the CPU per pod from 1.47 to 2.04 ms (medians), i.e. 490 pods per CPU-second: below the
extender's 500 pods/s target even on a whole core. So this stays (benchmarks/README.md, "HTTP pieces").
The framing checks below would be needed with either (the stdlib takes the first of several Content-Length
fields). This class keeps the stdlib server (threads, keep-alive, TLS wrapping, error pages) and changes
only these things:
- `parse_request`: a fast path for the usual request (`METHOD /path HTTP/1.1` and plain headers);
  anything else (other versions, odd request lines) takes the stdlib path. Both parse the head that
  `handle_one_request` read whole, at most MAX_HEAD_BYTES (431 beyond, 414 for a request line alone), at
  most 100 header lines; folded lines get 400.
- request framing is unambiguous or refused (400, connection closed), on both paths: more than one
  Content-Length field (equal or not), or Transfer-Encoding together with Content-Length (RFC 9112 §6.3:
  a proxy in front may frame the body otherwise than this server; the stdlib takes the first field).
- `send_all`: status line, headers and body in one write (one syscall, one TCP segment when small).
- the Date header is formatted once per second.

Bounds (anyone on the pod network reaches these ports, without credentials). With
`BoundedHTTPServer` as the server, every port of the extender and of the node agent has:
- a cap on the whole request head: request line and header lines together at most MAX_HEAD_BYTES (8 KiB;
  431 and close beyond), read before either parse path sees a byte, so the stdlib's slow path (HTTP/1.0, odd
  request lines) is held to it too;
- deadlines enforced by one watchdog thread per server, which shuts down the socket of a connection past
  its deadline (a blocked read or write returns at once): the TLS handshake (`handshake_s`), the wait for
  the first byte of the next request (`idle_s`), the whole head from that byte on (`head_s`: a slow
  dribble of header bytes buys no time), and the whole answer (`answer_s`: a reader that takes nothing);
  a body has its reader's own deadline (the extender's BODY_TIMEOUT_S);
- a cap on concurrent connections, per server and per peer address: one past it is refused in the accept
  loop, before any thread is started (plain HTTP: `503` with `Connection: close`; TLS: closed), so threads
  and memory are bounded by the caps whatever a client does;
- room for newcomers (five addresses holding 8 idle keep-alives each starved the kubelet's
  probes): a newcomer over the total cap (not its address's) takes the place of a connection waiting for its
  client (idle keep-alive, unfinished head, TLS handshake), the longest-waiting of the address holding the
  most (`pick_victim`), and while half the connections are held keep-alives idle pressure_idle_s at most;
- TLS handshakes in a pool of their own (`handshakes`, `handshakes_per_peer`, each within handshake_s),
  apart from the connections past theirs, so stalled handshakes cannot take the scheduler's capacity.
"""

from __future__ import annotations

import email.utils
import io
import logging
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)

MAX_HEADERS = 100  # as http.client
MAX_HEADER_LINE = 65536
MAX_HEAD_BYTES = 8 << 10  # request line + header lines of one request (kube-scheduler's: ~200 bytes)
LARGE_ANSWER = 64 << 10  # answers above this are written after their head, not copied into one buffer
MAX_SEND_PARTS = 64  # parts per sendmsg call (the kernel's IOV_MAX is 1,024)
JOIN_BELOW = 8 << 10  # answers up to this are joined to their head and written at once; larger ones are not copied
PHRASES = {int(s): s.phrase for s in HTTPStatus}
_date_cache: tuple[int, str] = (0, "")


def http_date() -> str:
    """The Date header for now, formatted once per second."""
    global _date_cache
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache = (now, email.utils.formatdate(now, usegmt=True))
    return _date_cache[1]


class Headers:
    """Request headers as handlers read them: case-insensitive get(); the first of repeated fields."""

    def __init__(self, fields: list[tuple[str, str]]) -> None:
        self._fields = fields
        self._first: dict[str, str] = {}
        self.lengths = 0  # Content-Length fields (framing_error's count, taken in the same pass)
        for name, value in fields:
            lower = name.lower()
            if lower == "content-length":
                self.lengths += 1
            self._first.setdefault(lower, value)

    def framing_error(self) -> str | None:
        """framing_error() of these fields."""
        if self.lengths > 1:
            return f"{self.lengths} Content-Length header fields; send exactly one"
        if self.lengths and "transfer-encoding" in self._first:
            return "both Transfer-Encoding and Content-Length; send a Content-Length only"
        return None

    def get(self, name: str, default: str | None = None) -> str | None:
        return self._first.get(name.lower(), default)

    def __getitem__(self, name: str) -> str | None:
        return self._first.get(name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._first

    def items(self) -> list[tuple[str, str]]:
        return list(self._fields)


def framing_error(fields: list[tuple[str, str]]) -> str | None:
    """Why these request headers frame the body ambiguously, or None when they do not."""
    lengths = sum(1 for name, _ in fields if name.lower() == "content-length")
    if lengths > 1:
        return f"{lengths} Content-Length header fields; send exactly one"
    if lengths and any(name.lower() == "transfer-encoding" for name, _ in fields):
        return "both Transfer-Encoding and Content-Length; send a Content-Length only"
    return None


@dataclass(frozen=True)
class ConnLimits:
    """What one server allows its clients (see the module docstring, "Bounds")."""

    max_connections: int = 32      # at once, on this port (TLS: past the handshake)
    per_peer: int = 8              # at once, from one address
    handshake_s: float = 5.0       # the TLS handshake, from accept
    idle_s: float = 30.0           # from the end of an answer (or the handshake) to the next request's first byte
    head_s: float = 5.0            # from a request's first byte to the end of its head
    answer_s: float = 30.0         # the whole answer taken by the client
    handshakes: int = 64           # TLS handshakes in progress at once, on this port (apart from max_connections)
    handshakes_per_peer: int = 16  # ... from one address
    pressure_idle_s: float = 1.0   # idle_s while at least half of max_connections are held


REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nRetry-After: 1\r\n"
           b"Connection: close\r\nContent-Length: 52\r\n\r\ntoo many connections to this server; try again later\n")

HANDSHAKE, WAITING, BUSY = "handshake", "waiting", "busy"  # the phases of a connection (_Conn.phase)


def pick_victim(candidates: list[tuple[str, float]], held: Counter[str]) -> int | None:
    """Which of these connections (peer, since when it waits) to close for a newcomer when a pool is full:
    one of the peer holding the most of the pool (`held`), the one waiting longest; None when there is none.
    Why: a peer that holds many idle or stalled connections pays for the newcomer, never the one-connection
    client (the kubelet's probe, the scheduler) that sends its request at once."""
    best: tuple[int, float] | None = None
    pick = None
    for i, (peer, since) in enumerate(candidates):
        key = (-held[peer], since)
        if best is None or key < best:
            best, pick = key, i
    return pick


@dataclass
class _Conn:
    """One admitted connection: its peer, phase and since when; `counted` until it is evicted or ends."""

    peer: str
    phase: str
    since: float
    counted: bool = True


class BoundedHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with capped connections and a watchdog for the deadlines (module docstring).

    Two pools, each with a total and a per-peer cap: connections past their TLS handshake (all, in plain
    HTTP) and TLS handshakes in progress, so stalled handshakes never take the capacity of clients that
    completed theirs. A newcomer over a pool's total cap (not its peer's) takes the place of a connection
    that waits for its client (handshake, idle keep-alive, unfinished head): pick_victim's, shut down at once.
    While half the connections are held, keep-alives idle for pressure_idle_s at most."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024  # a flood waits in the kernel, and is refused from the accept loop, not dropped

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], limits: ConnLimits,
                 tls: ssl.SSLContext | None = None) -> None:
        self.limits, self.tls = limits, tls
        self._guard = threading.Lock()
        self._deadlines: dict[socket.socket, float] = {}
        self._conns: dict[Any, _Conn] = {}
        self._peers: Counter[str] = Counter()  # connections past the handshake, per peer
        self._shaking: Counter[str] = Counter()  # handshakes in progress, per peer
        self.active = 0
        self.handshaking = 0
        self.refused = 0  # connections refused for the caps, since start
        self.evicted = 0  # connections closed for a newcomer, since start
        self._last_refusal_log = 0.0
        self._closed = threading.Event()
        super().__init__(address, handler)
        self._watchdog = threading.Thread(target=self._watch, name="http-watchdog", daemon=True)
        self._watchdog.start()

    # --- deadlines -----------------------------------------------------------------------------------------
    def arm(self, sock: socket.socket, seconds: float, waiting: bool = False) -> None:
        """`sock` is shut down if still armed `seconds` from now; `waiting`: for its client's next bytes (a
        newcomer may then take its place)."""
        with self._guard:
            self._deadlines[sock] = time.monotonic() + seconds
            self._set_phase(sock, WAITING if waiting else BUSY)

    def await_request(self, sock: socket.socket) -> None:
        """Arm `sock` for the wait for its next request: idle_s, or pressure_idle_s while half full."""
        with self._guard:
            self._deadlines[sock] = time.monotonic() + self._idle_s()
            self._set_phase(sock, WAITING)

    def disarm(self, sock: socket.socket) -> None:
        with self._guard:
            self._deadlines.pop(sock, None)
            self._set_phase(sock, BUSY)

    def _idle_s(self) -> float:
        if 2 * self.active >= self.limits.max_connections:
            return min(self.limits.idle_s, self.limits.pressure_idle_s)
        return self.limits.idle_s

    def _set_phase(self, sock: Any, phase: str) -> None:
        conn = self._conns.get(sock)
        if conn is not None and conn.phase != HANDSHAKE and conn.phase != phase:
            conn.phase, conn.since = phase, time.monotonic()

    def _watch(self) -> None:
        """Why a thread: a blocked recv/send (or TLS handshake) cannot watch its own total time; shutting the
        socket down from here ends it at once, whatever the client dribbles. Four scans a second."""
        while not self._closed.wait(0.25):
            now = time.monotonic()
            with self._guard:
                late = [s for s, t in self._deadlines.items() if t <= now]
                for s in late:
                    del self._deadlines[s]
            for s in late:
                _cut(s)

    # --- the connection caps -------------------------------------------------------------------------------
    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = super().get_request()
        if self.tls is not None:  # the handshake runs in the connection's thread, under handshake_s
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr

    def process_request(self, request: Any, client_address: Any) -> None:
        """Admit the connection (a thread, its first deadline) or refuse it here, in the accept loop."""
        peer = _peer(client_address)
        victim = None
        with self._guard:
            if self.tls is not None:
                why, victim = self._admit_handshake(peer)
            else:
                why, victim = self._admit(peer)
            if why is None:
                phase = HANDSHAKE if self.tls is not None else WAITING
                self._conns[request] = _Conn(peer, phase, time.monotonic())
                first = self.limits.handshake_s if self.tls is not None else self._idle_s()
                self._deadlines[request] = time.monotonic() + first
            else:
                self.refused += 1
        if victim is not None:
            _cut(victim)
        if why is not None:
            self._refuse(request, peer, why)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release(request)
            raise

    def _admit(self, peer: str) -> tuple[str | None, Any]:
        """(why refused or None, a connection to close for this one) past the handshake; under the guard.
        Admitting counts the connection."""
        lim = self.limits
        if self._peers[peer] >= lim.per_peer:
            return f"{self._peers[peer]} connections held by this peer (the cap is {lim.per_peer})", None
        victim = None
        if self.active >= lim.max_connections:
            victim = self._evict(WAITING, self._peers)
            if victim is None:
                return f"{self.active} connections held (the cap is {lim.max_connections})", None
        self.active += 1
        self._peers[peer] += 1
        return None, victim

    def _admit_handshake(self, peer: str) -> tuple[str | None, Any]:
        """_admit for a TLS handshake, in the handshakes' pool."""
        lim = self.limits
        if self._shaking[peer] >= lim.handshakes_per_peer:
            return (f"{self._shaking[peer]} TLS handshakes in progress from this peer (the cap is "
                    f"{lim.handshakes_per_peer})"), None
        victim = None
        if self.handshaking >= lim.handshakes:
            victim = self._evict(HANDSHAKE, self._shaking)
            if victim is None:
                return f"{self.handshaking} TLS handshakes in progress (the cap is {lim.handshakes})", None
        self.handshaking += 1
        self._shaking[peer] += 1
        return None, victim

    def _evict(self, phase: str, held: Counter[str]) -> Any:
        """pick_victim among the connections in `phase`, uncounted (its slot is the newcomer's); None if none.
        Under the guard; the caller shuts it down."""
        socks = [s for s, c in self._conns.items() if c.counted and c.phase == phase]
        i = pick_victim([(self._conns[s].peer, self._conns[s].since) for s in socks], held)
        if i is None:
            return None
        sock = socks[i]
        self._uncount(sock)
        self._deadlines.pop(sock, None)
        self.evicted += 1
        return sock

    def _uncount(self, sock: Any) -> None:
        """Give back the slot `sock` holds (if it still holds one); under the guard."""
        conn = self._conns.get(sock)
        if conn is None or not conn.counted:
            return
        conn.counted = False
        pool = self._shaking if conn.phase == HANDSHAKE else self._peers
        if conn.phase == HANDSHAKE:
            self.handshaking -= 1
        else:
            self.active -= 1
        pool[conn.peer] -= 1
        if pool[conn.peer] <= 0:
            del pool[conn.peer]

    def _handshake(self, request: ssl.SSLSocket, peer: str) -> bool:
        """Complete the TLS handshake (under handshake_s), then move the connection from the handshakes'
        pool to the connections' (or close it when that is full of busy ones); whether to serve it."""
        try:
            request.do_handshake()
        except (ssl.SSLError, OSError) as exc:
            log.debug("TLS handshake with %s failed: %s", peer, exc)  # an attacker could fill the log
            return False
        victim = None
        with self._guard:
            conn = self._conns.get(request)
            if conn is None or not conn.counted:  # evicted meanwhile
                return False
            self._uncount(request)
            why, victim = self._admit(peer)
            if why is None:
                conn.counted, conn.phase, conn.since = True, WAITING, time.monotonic()
                self._deadlines[request] = time.monotonic() + self._idle_s()
            else:
                self._deadlines.pop(request, None)
                self.refused += 1
        if victim is not None:
            _cut(victim)
        if why is not None:
            self._log_refusal(peer, why)
            return False
        return True

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            if isinstance(request, ssl.SSLSocket) and not self._handshake(request, _peer(client_address)):
                self.shutdown_request(request)
                return
            super().process_request_thread(request, client_address)
        finally:
            self._release(request)

    def _release(self, request: Any) -> None:
        with self._guard:
            self._deadlines.pop(request, None)
            self._uncount(request)
            self._conns.pop(request, None)

    def _log_refusal(self, peer: str, why: str) -> None:
        """One log line per 10 s at most."""
        now = time.monotonic()
        if now - self._last_refusal_log > 10:
            self._last_refusal_log = now
            log.warning("refusing connections from %s on port %s: %s (%d refused so far)", peer or "?",
                        self.server_address[1], why, self.refused)

    def _refuse(self, request: Any, peer: str, why: str) -> None:
        """A clear refusal that costs no thread: 503 and close (plain HTTP), close (TLS: nothing can be said
        before a handshake). What the client already sent is read first, without waiting, so that closing
        does not reset the connection under the answer."""
        self._log_refusal(peer, why)
        try:
            if not isinstance(request, ssl.SSLSocket):
                request.setblocking(False)
                try:
                    request.recv(MAX_HEAD_BYTES)
                except OSError:
                    pass
                request.send(REFUSAL)
                request.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self.shutdown_request(request)

    def server_close(self) -> None:
        self._closed.set()
        super().server_close()


def _peer(client_address: Any) -> str:
    return str(client_address[0]) if isinstance(client_address, tuple) else ""


def _cut(sock: Any) -> None:
    """End whatever the connection's thread waits on (a read, a write, a handshake) at once."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the base method: an SSLSocket's own drops its state
    except OSError:
        pass


class LeanRequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    raw_requestline: bytes  # set by the stdlib handler before parse_request (not declared in its stubs)
    max_head_bytes = MAX_HEAD_BYTES
    _head: list[bytes]  # the header lines of the request being parsed (read by handle_one_request)

    def _limits(self) -> ConnLimits | None:
        return self.server.limits if isinstance(self.server, BoundedHTTPServer) else None

    def _arm(self, seconds: float, waiting: bool = False) -> None:
        if isinstance(self.server, BoundedHTTPServer):
            self.server.arm(self.connection, seconds, waiting)

    def _disarm(self) -> None:
        if isinstance(self.server, BoundedHTTPServer):
            self.server.disarm(self.connection)

    def handle_one_request(self) -> None:
        """The stdlib's, with the head read whole, under MAX_HEAD_BYTES and the idle and head deadlines,
        before it is parsed; the deadlines are off while the request is handled (its body has its own)."""
        try:
            if isinstance(self.server, BoundedHTTPServer):
                self.server.await_request(self.connection)
                if not self.rfile.peek(1):  # type: ignore[attr-defined]  # a BufferedReader: waits for a byte
                    self.close_connection = True
                    return
                self._arm(self.server.limits.head_s, waiting=True)
            lines = self._read_head()
            if lines is None:
                return
            self.raw_requestline, self._head = lines[0], lines[1:]
            if not self.parse_request():
                return
            self._disarm()
            method = getattr(self, "do_" + self.command, None)
            if method is None:
                self.send_error(HTTPStatus.NOT_IMPLEMENTED, f"Unsupported method ({self.command!r})")
                return
            method()
            self.wfile.flush()
        except (TimeoutError, OSError, ValueError) as exc:  # a deadline or the peer ended the connection
            self.log_error("request ended: %r", exc)
            self.close_connection = True

    def _read_head(self) -> list[bytes] | None:
        """The request line and header lines up to the blank line, max_head_bytes in all; None when the
        connection ends first or the head is too large (431 or 414 sent, connection to be closed)."""
        cap = self.max_head_bytes
        first = self.rfile.readline(cap + 1)
        if not first:
            self.close_connection = True
            return None
        lines, total = [first], len(first)
        while total <= cap and first.endswith(b"\n"):
            raw = self.rfile.readline(cap + 1 - total)
            total += len(raw)
            lines.append(raw)
            if raw in (b"\r\n", b"\n", b""):
                break
        if total > cap or not lines[-1].endswith(b"\n"):
            self.requestline = self.request_version = self.command = ""
            self.close_connection = True
            if total > cap:
                self.send_error(HTTPStatus.REQUEST_URI_TOO_LONG if len(lines) == 1
                                else HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                                explain=f"the request head is over {cap} bytes")
            return None
        return lines

    def parse_request(self) -> bool:
        """The stdlib's parse_request with a fast path for the usual request (see the module); both read the
        head handle_one_request read (never the socket)."""
        line = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        words = line.split()
        if len(words) != 3 or words[2] != "HTTP/1.1" or words[1].startswith("//"):
            return self._stdlib_parse()
        self.requestline = line
        self.command, self.path, self.request_version = words
        self.close_connection = False
        fields: list[tuple[str, str]] = []
        for raw in self._head:
            if raw in (b"\r\n", b"\n", b""):
                break
            if len(fields) >= MAX_HEADERS or raw[:1] in (b" ", b"\t"):  # too many, or obsolete folding
                self.close_connection = True
                self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE if len(fields) >= MAX_HEADERS
                                else HTTPStatus.BAD_REQUEST, "Too many headers" if len(fields) >= MAX_HEADERS
                                else "Folded header lines are not accepted")
                return False
            name, _, value = str(raw, "iso-8859-1").partition(":")
            fields.append((name.strip(), value.strip()))
        headers = Headers(fields)
        if not self._framing_ok(headers.framing_error()):
            return False
        self.headers = headers  # type: ignore[assignment]
        if (self.headers.get("Connection") or "").lower() == "close":
            self.close_connection = True
        if (self.headers.get("Expect") or "").lower() == "100-continue":
            return self.handle_expect_100()
        return True

    def _stdlib_parse(self) -> bool:
        """The stdlib's parse_request on the head already read (its header parser reads from memory)."""
        rfile = self.rfile
        self.rfile = io.BytesIO(b"".join(self._head))
        try:
            ok = super().parse_request()
        finally:
            self.rfile = rfile
        return ok and self._framing_ok(framing_error(list(self.headers.items())))

    def _framing_ok(self, error: str | None) -> bool:
        """False (400 sent, connection to be closed) when the headers frame the body ambiguously (`error`)."""
        if error is None:
            return True
        self.close_connection = True
        self.send_error(HTTPStatus.BAD_REQUEST, error)
        return False

    def send_all(self, code: int, body: bytes | list[bytes], content_type: str) -> None:
        """Status line, headers and body (bytes, or parts sent one after the other) in one write: a small answer
        joined, a larger one as a vector of parts (never copied); one above LARGE_ANSWER within the server's
        answer_s."""
        self.log_request(code)
        parts = [body] if isinstance(body, bytes) else body
        length = sum(len(p) for p in parts)
        close = "Connection: close\r\n" if self.close_connection else ""
        head = (f"{self.protocol_version} {code} {PHRASES.get(code, '')}\r\nServer: {self.server_version}\r\n"
                f"Date: {http_date()}\r\nContent-Type: {content_type}\r\nContent-Length: {length}\r\n"
                f"{close}\r\n").encode("latin-1")
        if length <= JOIN_BELOW:  # a small answer: joined (cheaper than a vector of parts)
            self.wfile.write(head + b"".join(parts))
            return
        if length <= LARGE_ANSWER:  # fits the socket's buffers: no deadline armed, but not copied either
            self._write_parts([head, *parts])
            return
        limits = self._limits()
        if limits is not None:
            self._arm(limits.answer_s)
        try:
            self._write_parts([head, *parts])
        finally:
            self._disarm()

    def _write_parts(self, parts: list[bytes]) -> None:
        """Each part in turn, none copied. Why sendmsg on plain TCP: the parts leave in one system call (a
        socket's buffers take a 160 KB answer whole), so the head of a large answer does not leave alone
        (TCP_NODELAY) and wake the client for 150 bytes, and no part is joined to another first: one write and
        one wake-up per answer (benchmarks/README.md, "Where each pod's time goes" and "issue 39, fifth pass").
        What the kernel did not take is sent by the next call, from where it stopped (a slow reader: the
        caller's deadline bounds the whole answer). TLS sockets take no vectors, and a buffered wfile must keep
        its order: written through it as they come."""
        if self.wbufsize or isinstance(self.connection, ssl.SSLSocket) or not hasattr(self.connection, "sendmsg"):
            for part in parts:
                self.wfile.write(part)
            return
        views = [memoryview(part) for part in parts if part]
        while views:
            sent = self.connection.sendmsg(views[:MAX_SEND_PARTS])
            while sent and sent >= len(views[0]):
                sent -= len(views.pop(0))
            if sent:
                views[0] = views[0][sent:]


Render = Callable[[], bytes]


class RenderCache:
    """A rendered answer (a /metrics page) shared by its scrapers, never older than the scrape that gets it:
    a scrape is answered by a render that began after it arrived (or, when `key_complete` says the key is
    all the page depends on, by the last one if `key()` is unchanged). Renders are spaced: one begins at the
    earliest COST_FACTOR times the CPU the previous took after that one ended (the scrapers that arrive
    meanwhile wait for it, together), so scraping costs at most about 1/(COST_FACTOR+1) of a CPU however
    many scrape and however often, and a small page waits milliseconds. At most `max_scrapes` answers are in
    progress at once: `acquire` says no to one more (the caller answers 503); a scrape that cannot get its
    render within WAIT_S gets None (503 too)."""

    COST_FACTOR = 10.0
    MAX_SPACING_S = 5.0  # cap on the spacing after a costly render
    WAIT_S = 20.0  # the longest a scrape waits for its render (Prometheus' scrape timeout is 10 s by default)

    def __init__(self, render: Render, key: Callable[[], object] = lambda: None, key_complete: bool = False,
                 max_scrapes: int = 4, clock: Callable[[], float] = time.monotonic) -> None:
        self._render, self._key, self._clock, self.key_complete = render, key, clock, key_complete
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_scrapes)
        self._pause = threading.Event()  # never set: a bounded wait that is not a sleep
        # (key, render began at, render ended at, its CPU seconds, text)
        self._cached: tuple[object, float, float, float, bytes] | None = None
        self.renders = 0

    def reusable(self, arrived: float, key: object) -> bool:
        """Whether the cached page answers a scrape that arrived at `arrived`, the state's key being `key`."""
        if self._cached is None:
            return False
        ckey, began, _, _, _ = self._cached
        return began >= arrived or (self.key_complete and ckey == key)

    def next_render_at(self) -> float:
        """The earliest a render may begin (the previous one's spacing)."""
        if self._cached is None:
            return 0.0
        _, _, ended, cost, _ = self._cached
        return ended + min(self.MAX_SPACING_S, self.COST_FACTOR * cost)

    def get(self) -> bytes | None:
        """The page for a scrape arriving now, or None when it could not be had within WAIT_S."""
        arrived = self._clock()
        if not self._lock.acquire(timeout=self.WAIT_S):
            return None
        try:
            key = self._key()
            if not self.reusable(arrived, key):
                self._pause.wait(max(0.0, self.next_render_at() - self._clock()))
                began, t0 = self._clock(), time.thread_time()
                key = self._key()
                text = self._render()
                self._cached = (key, began, self._clock(), time.thread_time() - t0, text)
                self.renders += 1
            assert self._cached is not None
            return self._cached[4]
        finally:
            self._lock.release()

    def acquire(self) -> bool:
        """One answer slot, without waiting; release() it after the answer."""
        return self._slots.acquire(blocking=False)

    def release(self) -> None:
        self._slots.release()

"""The two writes of every bind (the reservation PATCH and the Binding POST), on keep-alive connections of
their own, with the official client's configuration.

Why not the client's own path for these two (the library is used unless a benchmark shows it cannot meet the
extender's targets; this is that case). `benchmarks/bench_http.py` measures the CPU of
one bind's two writes against the tests' API stand-in (medians of two runs, 2-core machine, 2026-11-23):
the generated `CoreV1Api` methods 710-960 µs (model serialisation, the answer deserialised into V1Pod), the
same requests straight on the client's urllib3 pool 475-520 µs (pool bookkeeping, http.client's request
building and its email-based header parser), this module 73-100 µs. In the extender itself
(bench_extender.py with and without benchmarks/urllib3_writes/ on PYTHONPATH, which sends these writes
through the client's urllib3 pool; three interleaved pairs) the pool took the CPU per pod from 1.16 to
2.13 ms and the throughput from 554 to 349 pods/s (medians), against a target of 500 pods/s
(benchmarks/README.md, "HTTP pieces"); the generated layer costs more still. So this module writes the
request line and headers itself (a fixed, small set), and leaves parsing the answer to `httptools` (llhttp,
the parser of Node.js, as uvicorn uses it): status, chunked or sized bodies (or one that ends when the
server closes), interim 1xx answers skipped, keep-alive; at most 1 MiB of headers and 16 MiB of body; one
deadline per call covers connecting, the TLS handshake, sending and the whole answer.

Everything else comes from the client's `Configuration`, as the generated code would use it:
- the server URL (with any path prefix), and TLS as `kubernetes.client.rest` sets up its pool and urllib3
  checks it: `verify_ssl`, `ssl_ca_cert` / `ca_cert_data`, client certificate and key, `tls_server_name`
  (SNI), `assert_hostname=False`; the name is checked against subjectAltNames only, never the subject CN;
- authentication from `Configuration.auth_settings()` (bearer tokens, exec plugins, refreshed tokens), read
  at most once a second: with a kubeconfig, each read re-applies the whole config;
- the client's default headers and user agent.
With a proxy configured, or `assert_hostname` set to a name (urllib3 checks the certificate against it),
the writes go through the client's urllib3 manager instead (the slower path, but both are rare between a
scheduler and its API server). Errors are the client's `ApiException`
(status, reason, body), so callers treat both paths alike; no answer at all raises `OSError` (or
`httptools.HttpParserError` for garbage). Writes are never retried here: a PATCH or POST whose answer was
lost is ambiguous, and the binder resolves it by reading the pod. An idle connection the server has closed
is noticed before it is reused (as urllib3 does) and replaced.

Connections are a bounded pool: at most MAX_CONNECTIONS open at once (idle or in use); a write that finds
none idle and the pool full waits for one within its own deadline (then TimeoutError: nothing was sent).
kube-scheduler binds in parallel (a goroutine per pod, unbounded), so without the bound a burst opened one
TLS connection per concurrent bind (55 new handshakes per 400 pods through the real scheduler, a quarter of
bind's CPU; benchmarks/README.md, "The extender as the scheduler's sidecar"); the API server serves them no
faster than a few at a time on a control-plane node anyway.

The methods are named and ordered (name, namespace, body) as the generated `CoreV1Api` methods they stand in
for, and make the same requests, so the RBAC test maps them to permissions like any other API call.
"""

from __future__ import annotations

import select
import socket
import ssl
import threading
import time
from collections import deque
from typing import Any
from urllib.parse import quote, urlsplit

import httptools
import orjson
import urllib3

AUTH_TTL = 1.0  # seconds an auth header is reused before auth_settings() is asked again
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
MAX_ANSWER = 16 << 20  # bytes of an answer body at most (a pod or a Status: kilobytes)
MAX_HEAD = 1 << 20  # bytes before the end of an answer's headers at most
MAX_CONNECTIONS = 16  # connections open at once, idle or in use: concurrent binds beyond it wait for one


class _Answer:
    """httptools callbacks for one HTTP response (interim 1xx answers are skipped, as http.client does)."""

    __slots__ = ("status", "reason", "chunks", "size", "head", "framed", "done", "keep", "parser")

    def __init__(self) -> None:
        self.parser: Any = None
        self.reset()

    def reset(self) -> None:
        self.status = 0
        self.reason = b""
        self.chunks: list[bytes] = []
        self.size = 0
        self.head = False  # the status line and headers are in
        self.framed = False  # by Content-Length or chunked; otherwise the body ends when the server closes
        self.done = False
        self.keep = False

    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self.framed = True

    def on_headers_complete(self) -> None:
        self.head = True
        self.status = self.parser.get_status_code()
        self.keep = self.parser.should_keep_alive()  # llhttp forgets it once the message is complete

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size > MAX_ANSWER:
            raise ValueError(f"the API server's answer is larger than {MAX_ANSWER} bytes")
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        if self.status < 200:  # 100 Continue, 103 Early Hints: the answer is still to come
            self.reset()
            return
        self.done = True


class _Connection:
    """One keep-alive connection to the API server and its response parser."""

    __slots__ = ("sock", "answer", "parser")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.answer = _Answer()
        self.parser = self.answer.parser = httptools.HttpResponseParser(self.answer)

    def exchange(self, request: bytes, deadline: float) -> tuple[int, bytes, bytes, bool]:
        """Send `request`, read its answer by `deadline` (time.monotonic()): (status, reason, body,
        keep-alive)."""
        answer = self.answer
        answer.reset()
        self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
        self.sock.sendall(request)
        received = 0
        while not answer.done:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no complete answer from the API server in time")
            self.sock.settimeout(left)
            data = self.sock.recv(1 << 16)
            if not data:
                if answer.head and not answer.framed and answer.status >= 200:  # body delimited by the close
                    answer.done, answer.keep = True, False
                    break
                raise ConnectionError("the API server closed the connection before answering")
            received += len(data)
            if not answer.head and received > MAX_HEAD:
                raise ValueError(f"the API server's answer has more than {MAX_HEAD} bytes of headers")
            self.parser.feed_data(data)
        return answer.status, answer.reason, b"".join(answer.chunks), answer.keep

    def dropped(self) -> bool:
        """Whether the server closed this idle connection (it is readable: EOF, or bytes it should not send)."""
        poller = select.poll()
        try:
            poller.register(self.sock, select.POLLIN)
            return bool(poller.poll(0))
        except (OSError, ValueError):
            return True

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _tls_context(conf: Any) -> ssl.SSLContext:
    """The client's TLS settings (kubernetes.client.rest builds its urllib3 pool from the same fields)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if conf.verify_ssl:
        if conf.ssl_ca_cert or conf.ca_cert_data:
            ctx.load_verify_locations(cafile=conf.ssl_ca_cert or None, cadata=conf.ca_cert_data or None)
        else:
            ctx.load_default_certs()
        ctx.check_hostname = conf.assert_hostname is not False
        ctx.hostname_checks_common_name = False  # subjectAltName only, as urllib3 checks
    else:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if conf.cert_file:
        ctx.load_cert_chain(conf.cert_file, conf.key_file or None)
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def _header_value(name: str, value: Any) -> str:
    text = str(value)
    if "\r" in text or "\n" in text:
        raise ValueError(f"the client configuration's {name} header contains a line break")
    return text


class PodWriter:
    def __init__(self, api_client: Any) -> None:
        self.conf = api_client.configuration
        self.host = str(self.conf.host).rstrip("/")
        url = urlsplit(self.host)
        self.prefix = url.path.rstrip("/")
        self.manager = api_client.rest_client.pool_manager
        # Our own connections unless the client goes through a proxy (then its proxy manager, by absolute URL)
        # or asserts a host name other than the one it connects to (urllib3's own check handles that).
        self.direct = type(self.manager) is urllib3.PoolManager and not isinstance(self.conf.assert_hostname, str)
        self.tls = _tls_context(self.conf) if url.scheme == "https" else None
        self.address = (url.hostname or "localhost", url.port or (443 if url.scheme == "https" else 80))
        self.server_name = (self.conf.tls_server_name or self.address[0]).rstrip(".")  # SNI as urllib3 sends it
        self.base_headers = {"Host": url.netloc.rpartition("@")[2], "Accept": "application/json",
                             "User-Agent": api_client.user_agent, **api_client.default_headers}
        self._auth: tuple[float, dict[str, str], str] = (-AUTH_TTL, {}, "")
        self._auth_lock = threading.Lock()
        self._idle: deque[_Connection] = deque()
        self._pool = threading.Condition(threading.Lock())
        self._open = 0  # connections open (idle or in use), at most MAX_CONNECTIONS
        self.waiting = 0  # writes waiting for a connection now (a test looks)

    def _auth_headers(self) -> tuple[dict[str, str], str]:
        """The client's auth headers (refreshed every AUTH_TTL seconds), and all fixed headers as HTTP text."""
        now = time.monotonic()
        at, headers, text = self._auth
        if now - at < AUTH_TTL:
            return headers, text
        with self._auth_lock:
            headers = {setting["key"]: setting["value"] for setting in self.conf.auth_settings().values()
                       if setting.get("in") == "header" and setting.get("value")}
            text = "".join(f"{k}: {_header_value(k, v)}\r\n" for k, v in (self.base_headers | headers).items())
            self._auth = (now, headers, text)
        return headers, text

    def _connect(self, deadline: float) -> _Connection:
        sock = socket.create_connection(self.address, timeout=max(deadline - time.monotonic(), 0.001))
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_hostname=self.server_name)
        except BaseException:
            sock.close()
            raise
        return _Connection(sock)

    def _take(self, deadline: float) -> _Connection:
        """An idle connection the server has not closed, else a new one while fewer than MAX_CONNECTIONS are
        open, else the first one given back before `deadline` (TimeoutError after it)."""
        with self._pool:
            while True:
                while self._idle:
                    conn = self._idle.pop()
                    if not conn.dropped():
                        return conn
                    conn.close()
                    self._open -= 1
                if self._open < MAX_CONNECTIONS:
                    self._open += 1
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no connection to the API server free in time: all {MAX_CONNECTIONS} "
                                       f"are busy with other writes")
                self.waiting += 1
                try:
                    self._pool.wait(left)
                finally:
                    self.waiting -= 1
        try:
            return self._connect(deadline)
        except BaseException:
            self._discard(None)
            raise

    def _give(self, conn: _Connection) -> None:
        with self._pool:
            self._idle.append(conn)
            self._pool.notify()

    def _discard(self, conn: _Connection | None) -> None:
        """Close `conn` (None: one that failed to open) and make room for another."""
        if conn is not None:
            conn.close()
        with self._pool:
            self._open -= 1
            self._pool.notify()

    def close(self) -> None:
        """Close the idle connections."""
        with self._pool:
            while self._idle:
                self._idle.pop().close()
                self._open -= 1
            self._pool.notify_all()

    def _request(self, method: str, path: str, body: Any, content_type: str, timeout: float) -> Any:
        """The decoded JSON answer; ApiException on an HTTP error; OSError when no answer came."""
        from kubernetes.client.exceptions import ApiException

        data = orjson.dumps(body)
        headers, fixed = self._auth_headers()
        if self.direct:
            head = (f"{method} {self.prefix}{path} HTTP/1.1\r\n{fixed}Content-Type: {content_type}\r\n"
                    f"Content-Length: {len(data)}\r\n\r\n")
            deadline = time.monotonic() + timeout
            conn = self._take(deadline)
            try:
                status, reason_bytes, answer, keep = conn.exchange(head.encode() + data, deadline)
            except BaseException:
                self._discard(conn)
                raise
            if keep:
                self._give(conn)
            else:
                self._discard(conn)
            reason = reason_bytes.decode("latin-1")
        else:
            resp = self.manager.urlopen(method, self.host + path, body=data,
                                        headers={**self.base_headers, **headers, "Content-Type": content_type},
                                        timeout=urllib3.Timeout(total=timeout))
            status, reason, answer = resp.status, resp.reason or "", resp.data
        if not 200 <= status < 300:
            raise ApiException(status=status, reason=reason, body=answer.decode("utf-8", "replace"))
        return orjson.loads(answer)

    @staticmethod
    def _pod_path(namespace: str, name: str) -> str:
        return f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"

    def patch_namespaced_pod(self, name: str, namespace: str, body: Any, content_type: str = MERGE_PATCH,
                             timeout: float = 10) -> dict[str, Any]:
        """PATCH the pod (merge patch, or JSON patch with JSON_PATCH); the pod as the server wrote it."""
        result: dict[str, Any] = self._request("PATCH", self._pod_path(namespace, name), body, content_type,
                                               timeout)
        return result

    def create_namespaced_pod_binding(self, name: str, namespace: str, body: dict[str, Any],
                                      timeout: float = 10) -> None:
        """POST the pod's Binding subresource (the server answers a Status)."""
        self._request("POST", self._pod_path(namespace, name) + "/binding", body, "application/json", timeout)

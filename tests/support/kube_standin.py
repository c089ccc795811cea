"""A Kubernetes API server stand-in for tests: real HTTP, the REST subset the official client uses.

Why hand-written: there is no kube-apiserver (nor etcd) on the test machines, and a mock of the client
would not test the real wire format. This speaks enough of core/v1 that the official `kubernetes`
Python client works unmodified against it:

- resources: nodes (cluster-scoped), pods, events, configmaps (namespaced); `status` subresources;
  `pods/binding`.
- list (`fieldSelector`, `labelSelector`, `resourceVersion` in list metadata, `limit`/`continue` pages
  from a consistent snapshot, 410 for a compacted continue token), get, create (409
  AlreadyExists), update/PUT (resourceVersion precondition → 409 Conflict), patch (json-patch,
  merge-patch, strategic-merge-patch (merged like merge-patch, lists of named objects merged by name);
  `metadata.resourceVersion` in the patch is a precondition → 409), delete (with preconditions).
- watch (`watch=true`, `resourceVersion`, `timeoutSeconds`, `allowWatchBookmarks`): a chunked stream
  of JSON lines `{"type", "object"}`; field/label selectors turn "stops matching" into DELETED and
  "starts matching" into ADDED, as the real watch cache does; a resourceVersion at or before the
  compaction point answers one ERROR event carrying a 410 Gone Status, as the real server does.
- binding: sets `spec.nodeName`, copies the Binding's annotations onto the pod, sets the PodScheduled
  condition; 409 if the pod is already bound or a uid/resourceVersion precondition fails.

Two layers: tests/support/kube_store.py is the store (objects, resourceVersions, the event log behind watches,
selectors, patches, preconditions; no HTTP) and this module is the HTTP layer (routing, request bodies,
Status answers, the chunked watch stream, connection hooks, fault injection, request counters).

Test hooks: `put`/`get`/`delete` bypass HTTP, `require_token` answers 401 to requests without that bearer
token, `start(tls)` serves HTTPS, `connections` and `proxied` count connections and absolute-URL
(proxy-form) requests, `restart()` drops every open connection (watch streams
included) but keeps state, `compact()` makes every resourceVersion so far too old, `fail_next()`
injects an error answer, `request_counts` counts requests per (verb, resource), and `before_request`
(a callable, or None) runs in a request's thread before it is served (a test holds answers with it).

Stdlib ThreadingHTTPServer: one thread per connection is exactly the model a watch stream wants, and it
needs no dependency; with memslice.lean_http's handler and orjson, because the extender benchmark runs this
stand-in on the same two cores as the extender it measures (benchmarks/bench_http.py measures the handler).
"""

from __future__ import annotations

import json
import re
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import orjson
from kube_store import (  # noqa: F401 - re-exported: the stand-in's public names live here too
    API_VERSIONS,
    KIND_TO_PLURAL,
    RESOURCES,
    ApiError,
    Event,
    Selector,
    Store,
    json_patch,
    merge_patch,
    parse_field_selector,
    parse_label_selector,
    status_object,
)

from memslice.lean_http import LeanRequestHandler

MAX_BODY = 3 * 1024 * 1024  # the real server's default request size limit


# ---------------------------------------------------------------------------------------------- server

class KubeApiStandin:
    """In-process Kubernetes API stand-in. `KubeApiStandin().start()`; `.url`; `.api_client()`."""

    def __init__(self) -> None:
        self.store = Store()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        self._faults: list[tuple[str, str, int]] = []
        self._counts: Counter[tuple[str, str]] = Counter()
        self.require_token: str | None = None  # set: API requests without `Bearer <it>` get 401
        self.connections = 0  # connections accepted so far
        self.proxied = 0  # requests whose target was an absolute URL (as a client sends them to a proxy)
        self.before_request: Callable[[str, str], None] | None = None  # (method, path), before serving it
        # True: a Binding's annotations are dropped before it binds (as a mutating webhook on pods/binding may)
        self.drop_binding_annotations = False
        self.url = ""

    # ---- lifecycle
    def start(self, tls: ssl.SSLContext | None = None) -> KubeApiStandin:
        """Serve on a free port of 127.0.0.1; over HTTPS with `tls` (a server-side context)."""
        standin = self

        class Handler(_Handler):
            owner = standin

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True
            request_queue_size = 128

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a dropped connection is normal here (restart(), clients going away)

        self._httpd = Server(("127.0.0.1", 0), Handler)
        if tls is not None:  # the handshake runs in accept(): fine for tests
            self._httpd.socket = tls.wrap_socket(self._httpd.socket, server_side=True)
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="kube-standin", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._drop_connections()
        self._httpd.server_close()
        self._httpd = None

    def __enter__(self) -> KubeApiStandin:
        return self.start() if self._httpd is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def restart(self) -> None:
        """Like an API-server restart: every open connection (watch streams included) is dropped;
        objects and resourceVersions are kept."""
        self.store.end_watches()
        self._drop_connections()

    def compact(self) -> int:
        """Every resourceVersion so far becomes too old: watches from them get 410 Gone.
        Returns the compaction point. Open watches are not affected (call restart() to force them to
        reconnect from their last resourceVersion)."""
        return self.store.compact()

    def _drop_connections(self) -> None:
        with self._conns_lock:
            conns = list(self._conns)
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # ---- configuration for clients
    def kubeconfig(self, path: str) -> str:
        cfg = {
            "apiVersion": "v1", "kind": "Config", "current-context": "standin",
            "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
            "users": [{"name": "standin", "user": {"token": "standin-token"}}],
            "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "standin"}}],
        }
        with open(path, "w") as f:
            json.dump(cfg, f)  # JSON is YAML
        return path

    def api_client(self) -> Any:
        import kubernetes.client

        conf = kubernetes.client.Configuration()
        conf.host = self.url
        return kubernetes.client.ApiClient(conf)

    # ---- faults and counters
    def fail_next(self, method: str, path_substring: str, status: int) -> None:
        """The next `method` request whose path contains `path_substring` answers `status` (a Status
        body) and changes nothing. Several calls queue several faults."""
        with self.store.cond:
            self._faults.append((method.upper(), path_substring, status))

    def _take_fault(self, method: str, path: str) -> int | None:
        with self.store.cond:
            for i, (m, sub, status) in enumerate(self._faults):
                if m == method and sub in path:
                    del self._faults[i]
                    return status
        return None

    @property
    def request_counts(self) -> Counter[tuple[str, str]]:
        """(verb, resource) -> count; verbs: get list watch create update patch delete; resource e.g.
        `pods`, `pods/binding`, `nodes/status`."""
        with self.store.cond:
            return Counter(self._counts)

    def count(self, verb: str, resource: str) -> int:
        with self.store.cond:
            return self._counts[(verb, resource)]

    def reset_counts(self) -> None:
        with self.store.cond:
            self._counts.clear()

    def _count(self, verb: str, resource: str) -> None:
        with self.store.cond:
            self._counts[(verb, resource)] += 1

    @property
    def resource_version(self) -> int:
        with self.store.cond:
            return self.store.rv

    # ---- direct access (no HTTP; the store's copies)
    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace a Node/Pod/... from a plain dict; returns the stored copy."""
        return self.store.put(obj)

    def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        return self.store.get(kind, namespace, name)

    def list(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        return self.store.list(kind, namespace)

    def delete(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        return self.store.drop(kind, namespace, name)

    def wait_for(self, predicate: Any, timeout: float = 10.0) -> bool:
        """Wait until `predicate(self)` is true (re-checked after every write), at most `timeout` s."""
        deadline = time.monotonic() + timeout
        with self.store.cond:
            while True:
                if predicate(self):
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.store.cond.wait(min(left, 0.2))


# ---------------------------------------------------------------------------------------------- HTTP

_PATH = re.compile(
    r"^(?:/api/v1|/apis/(?P<gv>[a-z0-9.\-]+/[a-z0-9]+))(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[a-z]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[a-z]+))?)?$")


class _Handler(LeanRequestHandler):
    owner: KubeApiStandin
    server_version = "kube-standin/1"
    disable_nagle_algorithm = True  # headers and body are separate writes: no 40 ms delayed-ACK stalls

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def setup(self) -> None:
        super().setup()
        with self.owner._conns_lock:
            self.owner._conns.add(self.connection)
            self.owner.connections += 1

    def handle(self) -> None:
        try:
            super().handle()
        except OSError:  # the client went away (or restart() dropped the connection)
            self.close_connection = True

    def finish(self) -> None:
        with self.owner._conns_lock:
            self.owner._conns.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    # ---- plumbing
    def _body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY:
            self.rfile.read(n)
            raise ApiError(413, "RequestEntityTooLarge", "request body too large")
        return self.rfile.read(n) if n else b""

    def _json_body(self, raw: bytes) -> Any:
        try:
            return orjson.loads(raw or b"null")
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"invalid JSON body: {exc}") from None

    def _send(self, code: int, obj: Any) -> None:
        self.send_all(code, orjson.dumps(obj), "application/json")

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch("PUT")

    def do_PATCH(self) -> None:  # noqa: N802
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        parts = urlsplit(self.path)
        if parts.scheme:
            self.owner.proxied += 1
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        try:
            raw = self._body()
            if parts.path in ("/healthz", "/readyz", "/livez"):
                return self._send_text("ok")
            if parts.path == "/version":
                return self._send(200, {"major": "1", "minor": "37", "gitVersion": "v1.37.0-standin"})
            token = self.owner.require_token
            if token is not None and self.headers.get("Authorization") != f"Bearer {token}":
                raise ApiError(401, "Unauthorized", "Unauthorized")
            m = _PATH.match(parts.path)
            if not m or m["plural"] not in RESOURCES or (m["gv"] or "v1") != API_VERSIONS.get(m["plural"], "v1"):
                raise ApiError(404, "NotFound", f"the server could not find the requested resource "
                                                f"({method} {parts.path})")
            plural, ns, name, sub = m["plural"], m["ns"], m["name"], m["sub"]
            ns = unquote(ns) if ns else None
            name = unquote(name) if name else None
            kind, namespaced = RESOURCES[plural]
            if not namespaced and ns is not None:
                raise ApiError(404, "NotFound", f"{plural} are not namespaced")
            if namespaced and name is not None and ns is None:
                raise ApiError(404, "NotFound", f"{plural} {name!r}: a namespace is required")
            if sub is not None and sub not in ("status", "binding"):
                raise ApiError(404, "NotFound", f"unknown subresource {sub!r}")
            if sub == "binding" and plural != "pods":
                raise ApiError(404, "NotFound", "binding is a pods subresource")
            watching = method == "GET" and query.get("watch") in ("true", "1")
            verb = {"GET": "watch" if watching else ("get" if name else "list"), "POST": "create",
                    "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]
            resource = plural + (f"/{sub}" if sub else "")
            hook = self.owner.before_request
            if hook is not None:
                hook(method, parts.path)
            self.owner._count(verb, resource)
            fault = self.owner._take_fault(method, parts.path)
            if fault is not None:
                raise ApiError(fault, {409: "Conflict", 404: "NotFound", 410: "Gone", 429: "TooManyRequests",
                                       403: "Forbidden"}.get(fault, "InternalError"),
                               f"injected fault {fault} for {method} {parts.path}", name or "", kind)
            if watching:
                return self._watch(plural, ns, query)
            store = self.owner.store
            if method == "GET":
                return self._send(200, store.read(plural, ns, name, query))
            if method == "POST":
                if sub == "binding":
                    body = self._json_body(raw)
                    meta = body.get("metadata") if isinstance(body, dict) else None
                    if self.owner.drop_binding_annotations and isinstance(meta, dict):
                        meta.pop("annotations", None)
                    return self._send(201, store.bind(ns, name, body))
                if name is not None:
                    raise ApiError(405, "MethodNotAllowed", "POST to a named object is not allowed")
                return self._send(201, store.create(plural, ns, self._json_body(raw)))
            if name is None:
                raise ApiError(405, "MethodNotAllowed", f"{method} needs an object name")
            if method == "PUT":
                return self._send(200, store.update(plural, ns, name, sub, self._json_body(raw)))
            if method == "PATCH":
                return self._send(200, store.patch(plural, ns, name, sub, self._json_body(raw),
                                                   self.headers.get("Content-Type", "")))
            if method == "DELETE":
                return self._send(200, store.delete(plural, ns, name, self._json_body(raw) if raw else None))
        except ApiError as exc:
            self._send(exc.code, exc.status())
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True

    def _send_text(self, text: str) -> None:
        self.send_all(200, text.encode(), "text/plain")

    # ---- verbs
    def _watch(self, plural: str, ns: str | None, query: dict[str, str]) -> None:
        sel = Store.selector(ns, query)
        timeout = query.get("timeoutSeconds")
        deadline = time.monotonic() + (float(timeout) if timeout else 1800.0)
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        rv_param = query.get("resourceVersion", "")
        if rv_param and not rv_param.isdigit():
            raise ApiError(400, "BadRequest", f"invalid resourceVersion {rv_param!r}")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for ev in self.owner.store.watch_events(plural, sel, rv_param, deadline, bookmarks):
                line = orjson.dumps(ev) + b"\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            self.close_connection = True

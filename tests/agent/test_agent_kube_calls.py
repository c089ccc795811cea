"""memslice.kube.calls makes the requests of the generated kubernetes client methods it stands in for: each method
of CoreV1ApiRaw and ResourceV1ApiRaw is called, and so is the generated method of the same name (CoreV1Api,
ResourceV1Api, `_preload_content=False`), with the same arguments and the credentials of one kubeconfig, against
a real HTTP server that records what arrives: the same method, path, query string (in the same order) and
headers, the same JSON body, and the same ApiException for an error answer.

The one difference, by design: a body goes as the dict it is, where the generated method re-serialises it from
its pydantic model (the keys in the model's order; a datetime written +00:00 where memslice writes Z): the
bodies are compared as JSON values, timestamps as instants.
"""

from __future__ import annotations

import inspect
import json
import threading
from collections.abc import Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import CoreV1Api, ResourceV1Api
from kubernetes.client.exceptions import ApiException

from memslice.kube.calls import CoreV1ApiRaw, ResourceV1ApiRaw
from memslice.kube.config import load_api_client

Request = tuple[str, str, dict[str, str], bytes]
STAMPS = ("firstTimestamp", "lastTimestamp", "eventTime")


class Recorder(BaseHTTPRequestHandler):
    """Records each request; answers 404 (a Status) where the path names `missing`, else a small JSON object."""

    protocol_version = "HTTP/1.1"
    seen: list[Request]

    def _answer(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
        self.server.seen.append((self.command, self.path, headers, body))  # type: ignore[attr-defined]
        missing = "missing" in self.path
        out = json.dumps({"kind": "Status", "code": 404, "message": "not found"} if missing else
                         {"kind": "X", "metadata": {"resourceVersion": "5"}, "items": []}).encode()
        self.send_response(404 if missing else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[Any, ThreadingHTTPServer]]:
    """An ApiClient from a kubeconfig with a token, for a recording HTTP server."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    srv.seen = []  # type: ignore[attr-defined]
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{srv.server_port}"}}],
        "users": [{"name": "u", "user": {"token": "the-token"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    client, _ = load_api_client(str(kubeconfig))
    try:
        yield client, srv
    finally:
        srv.shutdown()
        srv.server_close()


EVENT = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e", "namespace": "ns"},
         "involvedObject": {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "name": "c", "namespace": "ns",
                            "uid": "u-1"},
         "reason": "GPUUnhealthy", "message": "m", "type": "Warning", "count": 1,
         "firstTimestamp": "2026-11-28T10:00:00Z", "lastTimestamp": "2026-11-28T10:00:01Z",
         "source": {"component": "memslice-node-agent", "host": "n"},
         "reportingComponent": "memslice.io/node-agent", "reportingInstance": "n"}
SLICE = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
         "metadata": {"name": "n-memslice.io-x", "ownerReferences": [
             {"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "u-2", "controller": True}]},
         "spec": {"driver": "memslice.io", "nodeName": "n",
                  "pool": {"name": "n", "generation": 3, "resourceSliceCount": 1},
                  "devices": [{"name": "gpu-0", "allowMultipleAllocations": True,
                               "attributes": {"uuid": {"string": "GPU-1"}, "index": {"int": 0},
                                              "driverVersion": {"version": "580.1.0"}},
                               "capacity": {"memory": {"value": "16Gi", "requestPolicy": {
                                   "default": "1Gi", "validRange": {"min": "1Mi", "max": "16Gi", "step": "1Mi"}}}},
                               "taints": [{"key": "memslice.io/unhealthy", "effect": "NoSchedule"}]}]}}
MERGE = "application/merge-patch+json"
# method -> (args, keyword args): every public method of the two classes, as the agent calls it
CASES: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    "read_namespaced_pod": (("p", "ns"), {"_request_timeout": 10}),
    "list_pod_for_all_namespaces": ((), {"field_selector": "spec.nodeName=n", "limit": 500, "_continue": "tok",
                                         "_request_timeout": 60}),
    "read_node": (("n",), {}),
    "patch_node": (("n", {"metadata": {"annotations": {"memslice.io/gpus": "[]"}}}),
                   {"_content_type": MERGE, "_request_timeout": 10}),
    "create_namespaced_event": (("ns", EVENT), {"_request_timeout": 10}),
    "patch_namespaced_event": (("e", "ns", {"count": 2, "lastTimestamp": "2026-11-28T10:00:02Z", "message": "m2"}),
                               {"_content_type": MERGE}),
    "read_namespaced_resource_claim": (("c", "ns"), {"_request_timeout": 10.0}),
    "patch_namespaced_resource_claim_status": (
        ("c", "ns", {"metadata": {"resourceVersion": "7"}, "status": {"devices": [
            {"driver": "memslice.io", "pool": "n", "device": "gpu-0", "shareID": "s-1",
             "data": {"limitMiB": 4096}}]}}), {"_content_type": MERGE}),
    "list_resource_slice": ((), {"field_selector": "spec.nodeName=n,spec.driver=memslice.io"}),
    "create_resource_slice": ((SLICE,), {}),
    "replace_resource_slice": (("n-memslice.io-x", SLICE), {}),
    "delete_resource_slice": (("n-memslice.io-x",), {}),
}
WATCH = {"field_selector": "spec.nodeName=n", "watch": True, "resource_version": "7", "timeout_seconds": 5,
         "allow_watch_bookmarks": True, "_request_timeout": (10, 20)}


def public(cls: type) -> set[str]:
    return {name for name, _ in inspect.getmembers(cls, inspect.isfunction) if not name.startswith("_")}


def normal(body: bytes) -> Any:
    """A body as a JSON value, its timestamps as instants."""
    if not body:
        return None
    value = json.loads(body)
    for key in STAMPS:
        if isinstance(value, dict) and isinstance(value.get(key), str):
            value[key] = datetime.fromisoformat(value[key])
    return value


def request(srv: ThreadingHTTPServer, call: Any) -> Request:
    before = len(srv.seen)  # type: ignore[attr-defined]
    resp = call()
    resp.read()
    resp.release_conn()
    [req] = srv.seen[before:]  # type: ignore[attr-defined]
    return req


def test_every_method_of_the_two_classes_has_a_case() -> None:
    assert public(CoreV1ApiRaw) | public(ResourceV1ApiRaw) == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES) + ["list_pod_for_all_namespaces/watch", "list_resource_slice/watch"])
def test_each_call_makes_the_generated_methods_request(api: tuple[Any, ThreadingHTTPServer], name: str) -> None:
    client, srv = api
    method, _, watch = name.partition("/")
    args, kwargs = ((), WATCH) if watch else CASES[method]
    raw, generated = ((CoreV1ApiRaw(client), CoreV1Api(client)) if hasattr(CoreV1ApiRaw, method)
                      else (ResourceV1ApiRaw(client), ResourceV1Api(client)))
    want = request(srv, lambda: getattr(generated, method)(*args, _preload_content=False, **kwargs))
    got = request(srv, lambda: getattr(raw, method)(*args, **kwargs))
    assert got[:3] == want[:3]
    assert normal(got[3]) == normal(want[3])
    assert got[2]["authorization"] == "Bearer the-token"


def test_an_error_answer_raises_the_same_api_exception(api: tuple[Any, ThreadingHTTPServer]) -> None:
    client, srv = api
    excs = []
    for reader in (CoreV1ApiRaw(client), CoreV1Api(client)):
        with pytest.raises(ApiException) as exc:
            reader.read_namespaced_pod("missing", "ns", _preload_content=False)
        excs.append(exc.value)
    assert [(e.status, e.reason, e.body) for e in excs] == [(404, "Not Found", excs[1].body)] * 2
    assert json.loads(excs[0].body)["message"] == "not found"


def test_a_decoded_answer_or_an_unknown_argument_is_refused(api: tuple[Any, ThreadingHTTPServer]) -> None:
    """Raw answers only: `_preload_content=True` (the generated methods' default, a model) is refused by name, and
    so is a list argument the class does not carry, before any request."""
    client, srv = api
    with pytest.raises(ValueError, match="read_node returns raw answers only"):
        CoreV1ApiRaw(client).read_node("n", _preload_content=True)
    with pytest.raises(TypeError, match="unsupported argument.*send_initial_events"):
        ResourceV1ApiRaw(client).list_resource_slice(send_initial_events=True)
    assert srv.seen == []  # type: ignore[attr-defined]

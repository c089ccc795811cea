"""DRA: the agent's resource.k8s.io/v1 calls, through the official client's ApiClient with the requests of its
generated methods (memslice.kube.calls: CoreV1ApiRaw and ResourceV1ApiRaw, without the generated classes'
start-up cost), answers read as plain JSON (`_preload_content=False`): the decisions work on the API's own field
names, and a field this client version does not model yet is still seen. Every call has a timeout; an error
answer is a KubeError with the status and the server's message."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from memslice import errors
from memslice.kube.calls import CoreV1ApiRaw, ResourceV1ApiRaw

TIMEOUT_S = 10.0
MAX_BODY = 8 * 1024 * 1024  # one claim, or the slices of one node and driver: far less


class KubeError(errors.UnavailableError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


RAW: dict[str, Any] = {"_preload_content": False, "_request_timeout": TIMEOUT_S}


def _json(call: Callable[[], Any]) -> Any:
    """Make the call (a generated method called with **RAW) and decode its answer."""
    from kubernetes.client.exceptions import ApiException

    try:
        resp = call()
    except ApiException as exc:
        try:
            msg = json.loads(exc.body or b"{}").get("message") or exc.reason
        except (ValueError, AttributeError):
            msg = exc.reason
        raise KubeError(int(exc.status or 0), str(msg)) from None
    data = resp.read()
    if len(data) > MAX_BODY:
        raise KubeError(resp.status, f"answer of {len(data)} bytes is over {MAX_BODY}")
    return json.loads(data) if data else None


def _event(line: bytes) -> tuple[str, str]:
    try:
        ev = json.loads(line)
        obj = ev.get("object") or {}
        return str(ev.get("type")), str((obj.get("metadata") or {}).get("resourceVersion") or "")
    except (ValueError, AttributeError):
        return "ERROR", ""


class DraApi:
    """The calls DRA mode makes (deploy/overlays/dra/rbac.yaml grants exactly these)."""

    def __init__(self, api_client: Any) -> None:
        self.resource = ResourceV1ApiRaw(api_client)
        self.core = CoreV1ApiRaw(api_client)

    def claim(self, namespace: str, name: str) -> dict[str, Any]:
        out: dict[str, Any] = _json(lambda: self.resource.read_namespaced_resource_claim(name, namespace, **RAW))
        return out

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        """A consumer pod of an elastic claim (its spec.priority: the PriorityClass value)."""
        out: dict[str, Any] = _json(lambda: self.core.read_namespaced_pod(name, namespace, **RAW))
        return out

    def slices(self, field_selector: str) -> list[dict[str, Any]]:
        items = _json(lambda: self.resource.list_resource_slice(field_selector=field_selector, **RAW)).get("items")
        return items or []

    def slices_version(self, field_selector: str) -> str:
        """The resourceVersion to watch the selected slices from (a LIST of them)."""
        out = _json(lambda: self.resource.list_resource_slice(field_selector=field_selector, **RAW))
        return str(((out or {}).get("metadata") or {}).get("resourceVersion") or "")

    def watch_slices(self, field_selector: str, resource_version: str, timeout_s: int, max_line: int,
                     hold: Callable[[Any], None]) -> Iterator[tuple[str, str]]:
        """(event type, object resourceVersion) for each event of a watch from `resource_version`, ending
        after `timeout_s` (server side; the client gives up 15 s later). A line longer than `max_line` ends
        the watch (KubeError). `hold` receives the response first, so that another thread can shut it."""
        from kubernetes.client.exceptions import ApiException

        try:
            resp: Any = self.resource.list_resource_slice(
                field_selector=field_selector, watch=True, resource_version=resource_version,
                timeout_seconds=timeout_s, allow_watch_bookmarks=True, _preload_content=False,
                _request_timeout=(TIMEOUT_S, timeout_s + 15))
        except ApiException as exc:
            raise KubeError(int(exc.status or 0), str(exc.reason)) from None
        try:
            hold(resp)
            buf = b""
            for chunk in resp.stream(64 * 1024):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        yield _event(line)
                if len(buf) > max_line:
                    raise KubeError(resp.status, f"a watch event over {max_line} bytes")
        finally:
            resp.release_conn()

    def patch_claim_status(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        """A JSON merge patch of a ResourceClaim's status (its status.devices; resourceVersion in `body` makes
        it conditional: 409 when the claim changed meanwhile)."""
        _json(lambda: self.resource.patch_namespaced_resource_claim_status(
            name, namespace, body, _content_type="application/merge-patch+json", **RAW))

    def claim_event(self, namespace: str, body: dict[str, Any]) -> None:
        """A core/v1 Event about a ResourceClaim, in its namespace."""
        _json(lambda: self.core.create_namespaced_event(namespace, body, **RAW))

    def node_event(self, body: dict[str, Any]) -> None:
        """A core/v1 Event about this node (in namespace default, where the kubelet puts node events)."""
        _json(lambda: self.core.create_namespaced_event("default", body, **RAW))

    # The bodies are plain dicts, sent as they are (no model needed).
    def create_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = _json(lambda: self.resource.create_resource_slice(body, **RAW))
        return out

    def replace_slice(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = _json(lambda: self.resource.replace_resource_slice(name, body, **RAW))
        return out

    def delete_slice(self, name: str) -> None:
        _json(lambda: self.resource.delete_resource_slice(name, **RAW))

    def node_uid(self, name: str) -> str | None:
        return (_json(lambda: self.core.read_node(name, **RAW)).get("metadata") or {}).get("uid")

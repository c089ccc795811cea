"""DRA: the agent's resource.k8s.io/v1 calls, through the official client's generated methods, answers read
as plain JSON (`_preload_content=False`): the decisions work on the API's own field names, and a field this
client version does not model yet is still seen. Every call has a timeout; an error answer is a KubeError
with the status and the server's message."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from memslice import errors

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


class DraApi:
    """The calls DRA mode makes (deploy/overlays/dra/rbac.yaml grants exactly these)."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes.client import CoreV1Api, ResourceV1Api

        self.resource = ResourceV1Api(api_client)
        self.core = CoreV1Api(api_client)

    def claim(self, namespace: str, name: str) -> dict[str, Any]:
        out: dict[str, Any] = _json(lambda: self.resource.read_namespaced_resource_claim(name, namespace, **RAW))
        return out

    def slices(self, field_selector: str) -> list[dict[str, Any]]:
        items = _json(lambda: self.resource.list_resource_slice(field_selector=field_selector, **RAW)).get("items")
        return items or []

    # The bodies are plain dicts: the generated client serialises a dict as it is (no model needed).
    def create_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = _json(lambda: self.resource.create_resource_slice(body, **RAW))  # type: ignore[arg-type]
        return out

    def replace_slice(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = _json(
            lambda: self.resource.replace_resource_slice(name, body, **RAW))  # type: ignore[arg-type]
        return out

    def delete_slice(self, name: str) -> None:
        _json(lambda: self.resource.delete_resource_slice(name, **RAW))

    def node_uid(self, name: str) -> str | None:
        return (_json(lambda: self.core.read_node(name, **RAW)).get("metadata") or {}).get("uid")

"""DRA: resource.k8s.io/v1 calls as plain JSON through the official client's ApiClient (its auth, TLS and
proxy handling), without its generated models: a model of an older client drops the fields it does not know
(consumedCapacity, shareID, allowMultipleAllocations), and those are the fields memslice needs."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

GROUP_PATH = "/apis/resource.k8s.io/v1"
TIMEOUT_S = 10.0
MAX_BODY = 8 * 1024 * 1024  # a ResourceSlice list of one node and driver, or one claim: far less


class KubeError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


def request(api: Any, method: str, path: str, body: Any = None, query: Mapping[str, str] | None = None,
            timeout_s: float = TIMEOUT_S) -> Any:
    """One call; the decoded JSON answer, or KubeError(status, the server's message)."""
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    _m, url, headers, payload, _ = api.param_serialize(method=method, resource_path=path,
                                                       query_params=list((query or {}).items()) or None,
                                                       header_params=headers, body=body,
                                                       auth_settings=["BearerToken"])
    resp = api.call_api(method, url, header_params=headers, body=payload, _request_timeout=timeout_s)
    data = resp.read()
    if len(data) > MAX_BODY:
        raise KubeError(resp.status, f"answer of {len(data)} bytes is over {MAX_BODY}")
    try:
        doc = json.loads(data) if data else None
    except ValueError:
        doc = None
    if not 200 <= resp.status < 300:
        msg = doc.get("message") if isinstance(doc, dict) else data[:200].decode(errors="replace")
        raise KubeError(resp.status, str(msg))
    return doc


def claim_path(namespace: str, name: str) -> str:
    return f"{GROUP_PATH}/namespaces/{namespace}/resourceclaims/{name}"


def slices_path(name: str | None = None) -> str:
    return f"{GROUP_PATH}/resourceslices" + (f"/{name}" if name else "")

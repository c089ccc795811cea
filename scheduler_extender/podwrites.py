"""The two writes of every bind (the reservation PATCH and the Binding POST), made on the official client's
own connection pool.

Why not the generated `CoreV1Api` methods for these two: each generated call validates its arguments with
pydantic, serialises them through the model layer and re-resolves the pool per request; on this project's
benchmark machine that is 530 µs of CPU per call against 320 µs for the same request on the same pool
(`python benchmarks/bench_extender.py` makes two per pod, so it is a fifth of the extender's CPU per pod).
Everything that matters is still the client's: the urllib3 pool manager it built from the kubeconfig or
service account (TLS, client certificates, proxy, pool size, retries), the authentication it refreshes
(`Configuration.auth_settings()`, read as the generated code does, but at most once a second: with a
kubeconfig, each read re-applies the whole config and scans the environment for proxies), its default
headers and user agent. Errors are raised as the client's own `ApiException` (status, reason, body), so
callers handle both paths alike. Reads, lists and watches keep the generated API.

The methods are named and ordered (name, namespace, body) as the generated `CoreV1Api` methods they stand
in for, and make the same requests, so the RBAC test maps them to permissions like any other API call.
"""

from __future__ import annotations

import threading
import time
from typing import Any
from urllib.parse import quote

import orjson
import urllib3

AUTH_TTL = 1.0  # seconds an auth header is reused before auth_settings() is asked again
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class PodWriter:
    def __init__(self, api_client: Any) -> None:
        self.conf = api_client.configuration
        self.host = str(self.conf.host).rstrip("/")
        self.prefix = urllib3.util.parse_url(self.host).path or ""
        manager = api_client.rest_client.pool_manager
        self.manager = manager
        # a direct pool when there is no proxy (the usual case); a proxy manager needs absolute URLs
        self.pool = manager.connection_from_url(self.host) if type(manager) is urllib3.PoolManager else None
        self.base_headers = {"Accept": "application/json", "User-Agent": api_client.user_agent,
                             **api_client.default_headers}
        self._auth: tuple[float, dict[str, str]] = (-AUTH_TTL, {})
        self._auth_lock = threading.Lock()

    def _auth_headers(self) -> dict[str, str]:
        """The authentication headers of the client's configuration, refreshed every AUTH_TTL seconds."""
        now = time.monotonic()
        at, headers = self._auth
        if now - at < AUTH_TTL:
            return headers
        with self._auth_lock:
            headers = {setting["key"]: setting["value"] for setting in self.conf.auth_settings().values()
                       if setting.get("in") == "header" and setting.get("value")}
            self._auth = (now, headers)
        return headers

    def _headers(self, content_type: str) -> dict[str, str]:
        return {**self.base_headers, "Content-Type": content_type, **self._auth_headers()}

    def _request(self, method: str, path: str, body: Any, content_type: str, timeout: float) -> Any:
        """The decoded JSON answer; ApiException on an HTTP error, urllib3 errors when no answer came."""
        from kubernetes.client.exceptions import ApiException

        data = orjson.dumps(body)
        headers = self._headers(content_type)
        t = urllib3.Timeout(total=timeout)
        if self.pool is not None:
            resp = self.pool.urlopen(method, self.prefix + path, body=data, headers=headers, timeout=t)
        else:
            resp = self.manager.urlopen(method, self.host + path, body=data, headers=headers, timeout=t)
        if not 200 <= resp.status < 300:
            raise ApiException(status=resp.status, reason=resp.reason,
                               body=resp.data.decode("utf-8", "replace"))
        return orjson.loads(resp.data)

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

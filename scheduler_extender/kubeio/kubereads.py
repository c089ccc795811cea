"""The extender's three reads (list/watch nodes, list/watch pods, read one pod) through the official client's
`ApiClient`, without its generated `CoreV1Api` class.

Why: from kubernetes 37 on, the generated API classes are pydantic-validated, and importing `CoreV1Api`
builds the pydantic models of every type it names (about 0.5 s of CPU here, a fifth of a restart at 43,000
pods, where the first filter must be answered within 2 s), and every call goes through a pydantic
`validate_call` wrapper (~2 ms per list page). The extender asks for raw responses anyway
(`_preload_content=False`: the informer and the binder decode with orjson), so these methods make the
same request the generated ones make, through the same `ApiClient.param_serialize` (URL, query string,
default headers, authentication) and `ApiClient.call_api` (the client's urllib3 pool, TLS, timeouts), and
raise the client's `ApiException` for non-2xx answers as the generated code does with raw responses.
Before kubernetes 37 (no `param_serialize`, and API classes that are cheap to import) they delegate to
the generated `CoreV1Api`.

The methods are named and take arguments as the generated `CoreV1Api` methods they stand in for, so the RBAC
test maps them to permissions like any other API call (tests/deploy/test_deploy_rbac.py, "mirror" classes).
"""

from __future__ import annotations

from typing import Any

# keyword argument of the generated list methods -> its query parameter (the ones the extender uses)
_LIST_QUERY = {"field_selector": "fieldSelector", "label_selector": "labelSelector", "limit": "limit",
               "_continue": "continue", "resource_version": "resourceVersion", "watch": "watch",
               "timeout_seconds": "timeoutSeconds", "allow_watch_bookmarks": "allowWatchBookmarks"}


def _query(kwargs: dict[str, Any]) -> list[tuple[str, Any]]:
    unknown = set(kwargs) - set(_LIST_QUERY)
    if unknown:
        raise TypeError(f"unsupported list argument(s): {', '.join(sorted(unknown))}")
    return [(_LIST_QUERY[k], v) for k, v in kwargs.items() if v is not None]


class CoreReads:
    """`list_node`, `list_pod_for_all_namespaces` and `read_namespaced_pod` of `CoreV1Api`, raw responses only
    (the urllib3 response the generated methods return with `_preload_content=False`)."""

    def __init__(self, api_client: Any) -> None:
        self.api = api_client
        self._legacy: Any = None
        if not hasattr(api_client, "param_serialize"):  # kubernetes < 37: the generated class is cheap
            from kubernetes.client import CoreV1Api

            self._legacy = CoreV1Api(api_client)

    def _get(self, path: str, path_params: dict[str, str] | None, query: list[tuple[str, Any]],
             request_timeout: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        request = self.api.param_serialize("GET", path, path_params=path_params, query_params=query,
                                           header_params={"Accept": "application/json"},
                                           auth_settings=["BearerToken"])
        resp = self.api.call_api(*request, _request_timeout=request_timeout)
        if not 200 <= resp.status <= 299:
            resp.read()
            raise ApiException.from_response(http_resp=resp, body=None, data=None)
        return resp.response

    @staticmethod
    def _raw_only(preload: bool) -> None:
        if preload:
            raise ValueError("CoreReads returns raw responses only: pass _preload_content=False")

    def list_node(self, *, _preload_content: bool = False, _request_timeout: Any = None, **kwargs: Any) -> Any:
        self._raw_only(_preload_content)
        if self._legacy is not None:
            return self._legacy.list_node(_preload_content=False, _request_timeout=_request_timeout, **kwargs)
        return self._get("/api/v1/nodes", None, _query(kwargs), _request_timeout)

    def list_pod_for_all_namespaces(self, *, _preload_content: bool = False, _request_timeout: Any = None,
                                    **kwargs: Any) -> Any:
        self._raw_only(_preload_content)
        if self._legacy is not None:
            return self._legacy.list_pod_for_all_namespaces(_preload_content=False,
                                                            _request_timeout=_request_timeout, **kwargs)
        return self._get("/api/v1/pods", None, _query(kwargs), _request_timeout)

    def read_namespaced_pod(self, name: str, namespace: str, *, _preload_content: bool = False,
                            _request_timeout: Any = None) -> Any:
        self._raw_only(_preload_content)
        if self._legacy is not None:
            return self._legacy.read_namespaced_pod(name, namespace, _preload_content=False,
                                                    _request_timeout=_request_timeout)
        return self._get("/api/v1/namespaces/{namespace}/pods/{name}", {"name": name, "namespace": namespace},
                         [], _request_timeout)


NODE_PODS_LIMIT = 2000  # pods read per node at preemption (a kubelet runs at most a few hundred)
PRIORITY_RANGE = (-(2**31), 2**31 - 1)  # spec.priority is an int32


def pod_priority(pod: Any) -> int:
    """A pod's spec.priority (set by the API server from its PriorityClass); 0 when absent or not an int32."""
    spec = pod.get("spec") if isinstance(pod, dict) else None
    value = spec.get("priority") if isinstance(spec, dict) else None
    if not isinstance(value, int) or isinstance(value, bool):
        return 0
    return min(max(value, PRIORITY_RANGE[0]), PRIORITY_RANGE[1])


def node_pod_priorities(reads: CoreReads, node: str, timeout: float = 10.0) -> dict[str, int]:
    """UID -> priority of the pods bound to `node` and not being deleted (those preemption may still evict),
    read from the API server (the watch cache keeps no priorities). At most NODE_PODS_LIMIT pods."""
    import orjson

    resp = reads.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}", limit=NODE_PODS_LIMIT,
                                             _request_timeout=timeout)
    try:
        data = orjson.loads(resp.data)
    finally:
        resp.release_conn()
    out: dict[str, int] = {}
    items = data.get("items") if isinstance(data, dict) else None
    for pod in items if isinstance(items, list) else []:
        meta = pod.get("metadata") if isinstance(pod, dict) else None
        uid = meta.get("uid") if isinstance(meta, dict) else None
        if isinstance(uid, str) and uid and not meta.get("deletionTimestamp"):  # type: ignore[union-attr]
            out[uid] = pod_priority(pod)
    return out

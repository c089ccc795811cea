"""The node agent's Kubernetes API calls through the official client's `ApiClient`, without the generated API
classes they are named after (`CoreV1ApiRaw` stands in for `CoreV1Api`, `ResourceV1ApiRaw` for
`ResourceV1Api`; only the methods the agent calls).

Why: from kubernetes 37 on, the generated API classes are pydantic-validated, and constructing `CoreV1Api`
builds the validators of its methods and the models they name: about 0.9 CPU-seconds, `ResourceV1Api` 0.25,
on every agent start, before the agent answers the kubelet (benchmarks/README.md, "Node-agent start"). The
agent reads raw answers anyway (plain JSON). Each method makes the request of the generated method of the same
name, through the same `ApiClient.param_serialize` (URL, query string in the generated order, the client's
default headers, BearerToken authentication and its refresh) and `ApiClient.call_api` (the client's urllib3
pool, TLS, proxy, timeouts), and returns the urllib3 response, raising the client's `ApiException` for an answer
other than 2xx, as the generated methods do with `_preload_content=False`. One difference: a body goes as the
dict it is, where the generated methods first validate it into their model and serialise that (which refuses a
field this client version does not know, orders the keys as the model, writes datetimes with +00:00 for Z).
tests/agent/test_agent_kube_calls.py compares every request with the generated method's on a real HTTP server.
Before kubernetes 37 (no `param_serialize`; API classes that are cheap to import) the calls go to the generated
classes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

Timeout = float | tuple[float, float] | None

# keyword argument of the generated list methods -> query parameter, in the order the generated serializers
# append them (the ones the agent passes; `pretty` is never passed, and the only one whose place differs)
LIST_QUERY = (("allow_watch_bookmarks", "allowWatchBookmarks"), ("_continue", "continue"),
              ("field_selector", "fieldSelector"), ("label_selector", "labelSelector"), ("limit", "limit"),
              ("resource_version", "resourceVersion"), ("timeout_seconds", "timeoutSeconds"), ("watch", "watch"))
ACCEPT = "application/json"  # what the generated methods pick of the types they accept
PATCH_DEFAULT = "application/json-patch+json"  # the generated patch methods' Content-Type when none is given


def done(resp: Any) -> None:
    """Read a write's answer to its end and give its connection back (its body is not needed)."""
    try:
        resp.read()
    finally:
        resp.release_conn()


class _Raw:
    LEGACY = ""  # the generated class, used before kubernetes 37

    def __init__(self, api_client: ApiClient) -> None:
        self.api = api_client
        self._legacy: Any = None
        if not hasattr(api_client, "param_serialize"):  # kubernetes < 37: the generated class is cheap
            import kubernetes.client

            self._legacy = getattr(kubernetes.client, self.LEGACY)(api_client)

    def _call(self, op: str, http: str, path: str, path_args: dict[str, str], *, query: dict[str, Any] | None = None,
              body: Any = None, content_type: str | None = None, preload: bool = False,
              timeout: Timeout = None) -> Any:
        """The request of the generated method `op`; its raw answer."""
        if preload:
            raise ValueError(f"{type(self).__name__}.{op} returns raw answers only: pass _preload_content=False")
        query = query or {}
        unknown = set(query) - {k for k, _ in LIST_QUERY}
        if unknown:
            raise TypeError(f"{op}: unsupported argument(s) {', '.join(sorted(unknown))}")
        if self._legacy is not None:
            extra = {"body": body} if body is not None else {}
            if content_type is not None:
                extra["_content_type"] = content_type
            return getattr(self._legacy, op)(**path_args, **extra, **query, _preload_content=False,
                                             _request_timeout=timeout)
        from kubernetes.client.exceptions import ApiException

        headers = {"Accept": ACCEPT}
        if content_type is not None:
            headers["Content-Type"] = content_type
        request = self.api.param_serialize(
            http, path, path_params=path_args, query_params=[(p, query[k]) for k, p in LIST_QUERY
                                                             if query.get(k) is not None],
            header_params=headers, body=body, auth_settings=["BearerToken"])
        resp = self.api.call_api(*request, _request_timeout=timeout)
        if not 200 <= resp.status <= 299:
            resp.read()
            raise ApiException.from_response(http_resp=resp, body=None, data=None)
        return resp.response


class CoreV1ApiRaw(_Raw):
    """The agent's calls of the generated `CoreV1Api`, raw answers only."""

    LEGACY = "CoreV1Api"

    def read_namespaced_pod(self, name: str, namespace: str, *, _preload_content: bool = False,
                            _request_timeout: Timeout = None) -> Any:
        return self._call("read_namespaced_pod", "GET", "/api/v1/namespaces/{namespace}/pods/{name}",
                          {"name": name, "namespace": namespace}, preload=_preload_content,
                          timeout=_request_timeout)

    def list_pod_for_all_namespaces(self, *, _preload_content: bool = False, _request_timeout: Timeout = None,
                                    **query: Any) -> Any:
        return self._call("list_pod_for_all_namespaces", "GET", "/api/v1/pods", {}, query=query,
                          preload=_preload_content, timeout=_request_timeout)

    def read_node(self, name: str, *, _preload_content: bool = False, _request_timeout: Timeout = None) -> Any:
        return self._call("read_node", "GET", "/api/v1/nodes/{name}", {"name": name}, preload=_preload_content,
                          timeout=_request_timeout)

    def patch_node(self, name: str, body: Any, *, _content_type: str | None = None, _preload_content: bool = False,
                   _request_timeout: Timeout = None) -> Any:
        return self._call("patch_node", "PATCH", "/api/v1/nodes/{name}", {"name": name}, body=body,
                          content_type=_content_type or PATCH_DEFAULT, preload=_preload_content,
                          timeout=_request_timeout)

    def create_namespaced_event(self, namespace: str, body: Any, *, _preload_content: bool = False,
                                _request_timeout: Timeout = None) -> Any:
        return self._call("create_namespaced_event", "POST", "/api/v1/namespaces/{namespace}/events",
                          {"namespace": namespace}, body=body, preload=_preload_content, timeout=_request_timeout)

    def patch_namespaced_event(self, name: str, namespace: str, body: Any, *, _content_type: str | None = None,
                               _preload_content: bool = False, _request_timeout: Timeout = None) -> Any:
        return self._call("patch_namespaced_event", "PATCH", "/api/v1/namespaces/{namespace}/events/{name}",
                          {"name": name, "namespace": namespace}, body=body,
                          content_type=_content_type or PATCH_DEFAULT, preload=_preload_content,
                          timeout=_request_timeout)


class ResourceV1ApiRaw(_Raw):
    """The DRA driver's calls of the generated `ResourceV1Api` (resource.k8s.io/v1), raw answers only."""

    LEGACY = "ResourceV1Api"
    CLAIM = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
    SLICES = "/apis/resource.k8s.io/v1/resourceslices"

    def read_namespaced_resource_claim(self, name: str, namespace: str, *, _preload_content: bool = False,
                                       _request_timeout: Timeout = None) -> Any:
        return self._call("read_namespaced_resource_claim", "GET", self.CLAIM, {"name": name, "namespace": namespace},
                          preload=_preload_content, timeout=_request_timeout)

    def patch_namespaced_resource_claim_status(self, name: str, namespace: str, body: Any, *,
                                               _content_type: str | None = None, _preload_content: bool = False,
                                               _request_timeout: Timeout = None) -> Any:
        return self._call("patch_namespaced_resource_claim_status", "PATCH", self.CLAIM + "/status",
                          {"name": name, "namespace": namespace}, body=body,
                          content_type=_content_type or PATCH_DEFAULT, preload=_preload_content,
                          timeout=_request_timeout)

    def list_resource_slice(self, *, _preload_content: bool = False, _request_timeout: Timeout = None,
                            **query: Any) -> Any:
        return self._call("list_resource_slice", "GET", self.SLICES, {}, query=query, preload=_preload_content,
                          timeout=_request_timeout)

    def create_resource_slice(self, body: Any, *, _preload_content: bool = False,
                              _request_timeout: Timeout = None) -> Any:
        return self._call("create_resource_slice", "POST", self.SLICES, {}, body=body, preload=_preload_content,
                          timeout=_request_timeout)

    def replace_resource_slice(self, name: str, body: Any, *, _preload_content: bool = False,
                               _request_timeout: Timeout = None) -> Any:
        return self._call("replace_resource_slice", "PUT", self.SLICES + "/{name}", {"name": name}, body=body,
                          preload=_preload_content, timeout=_request_timeout)

    def delete_resource_slice(self, name: str, *, _preload_content: bool = False,
                              _request_timeout: Timeout = None) -> Any:
        return self._call("delete_resource_slice", "DELETE", self.SLICES + "/{name}", {"name": name},
                          preload=_preload_content, timeout=_request_timeout)

"""The real kube-apiserver behind the object calls the DRA node tests make of the API stand-in (`put`, `get`,
`list`, `delete`, `wait_for`, `kubeconfig`), so that the same test bodies run against the real server: its
validation, defaulting, canonical quantities, status subresource, resourceVersions and watches.

- `put` creates the object (POST) or replaces it (PUT, with the stored resourceVersion), in compact JSON as Go
  clients send it; an object with a `status` then gets it written through the status subresource, as the
  scheduler or the kubelet write theirs.
  A Pod's `spec.priority` becomes a PriorityClass of that value (the Priority admission plugin resolves
  the value from the class; it refuses a pod that sets it itself).
- every call is made as the cluster's admin; the node agent under test gets an admin kubeconfig (RBAC for the
  agent's own ServiceAccount is tests/realcluster/test_real_dra.py's).
- `clear(namespace, node)` removes what the DRA tests leave: the namespace's claims, pods and events, the
  node's ResourceSlices.
"""

from __future__ import annotations

import copy
import json
import urllib.parse
from typing import Any

from kube_real import ADMIN_TOKEN, RealCluster, resource_path
from waiting import wait_until

_API = {"Pod": ("v1", "pods", True), "Event": ("v1", "events", True), "Node": ("v1", "nodes", False),
        "ResourceClaim": ("resource.k8s.io/v1", "resourceclaims", True),
        "ResourceSlice": ("resource.k8s.io/v1", "resourceslices", False),
        "DeviceClass": ("resource.k8s.io/v1", "deviceclasses", False)}


def _collection(kind: str, namespace: str | None) -> str:
    api, plural, namespaced = _API[kind]
    base = f"/api/{api}" if "/" not in api else f"/apis/{api}"
    return f"{base}/namespaces/{namespace}/{plural}" if namespaced and namespace else f"{base}/{plural}"


def _compact(obj: dict[str, Any]) -> bytes:
    """JSON as Go clients write it (no spaces). The API server keeps an opaque config's bytes as sent and later
    compares them byte for byte: a claim sent with spaces fails every status patch as "changing the allocation"
    (Go re-encodes it compact), which no claim made by kube-controller-manager or kubectl does."""
    return json.dumps(obj, separators=(",", ":")).encode()


class RealObjects:
    def __init__(self, cluster: RealCluster) -> None:
        self.cluster = cluster

    def kubeconfig(self, path: str) -> str:
        return str(self.cluster.kubeconfig(path.replace("/", "-").strip("-")[-60:], ADMIN_TOKEN))

    def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        status, out = self.cluster.request("GET", f"{_collection(kind, namespace)}/{name}")
        if status == 404:
            return None
        assert status == 200, (kind, name, status, out)
        return dict(out)

    def list(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        out = self.cluster.ok("GET", _collection(kind, namespace))
        api, _, _ = _API[kind]
        return [{"apiVersion": api, "kind": kind, **o} for o in out["items"]]

    def delete(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        status, out = self.cluster.request("DELETE", f"{_collection(kind, namespace)}/{name}?gracePeriodSeconds=0")
        assert status in (200, 202, 404), (kind, name, status, out)
        return None if status == 404 else dict(out)

    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        kind = obj["kind"]
        obj.setdefault("apiVersion", _API[kind][0])
        meta = obj["metadata"]
        if kind == "Pod" and "priority" in obj.get("spec", {}):
            obj["spec"]["priorityClassName"] = self._priority_class(int(obj["spec"].pop("priority")))
        status_part = obj.pop("status", None)
        path = resource_path(obj)
        have = self.get(kind, meta.get("namespace"), meta["name"])
        if have is None:
            meta.pop("resourceVersion", None)
            meta.pop("uid", None)
            stored = self.cluster.ok("POST", path.rsplit("/", 1)[0], _compact(obj))
        else:
            meta["resourceVersion"] = have["metadata"]["resourceVersion"]
            stored = self.cluster.ok("PUT", path, _compact(obj))
        if status_part is not None and kind not in ("Event",):
            stored["status"] = status_part
            stored = self.cluster.ok("PUT", f"{path}/status", _compact(stored))
        return dict(stored)

    def _priority_class(self, value: int) -> str:
        name = f"memslice-test-priority-{value}".replace("--", "-minus-")
        status, out = self.cluster.request("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", {
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}, "value": value})
        assert status in (201, 409), out
        return name

    def wait_for(self, predicate: Any, timeout: float = 10.0) -> bool:
        """Wait until `predicate(self)` is true, polled every 50 ms (waiting.wait_until), at most `timeout` s;
        False when it is not (the stand-in's answer, which callers assert with their own message)."""
        try:
            wait_until("the API objects' condition", lambda: predicate(self), timeout)
        except AssertionError:
            return False
        return True

    def clear(self, namespace: str, node: str) -> None:
        """No claim, pod or event left in `namespace`, no ResourceSlice of `node` (claims written here carry no
        finalizer: the scheduler adds one, the resourceclaim controller lifts it; neither wrote these)."""
        for kind in ("ResourceClaim", "Pod", "Event"):
            self.cluster.ok("DELETE", f"{_collection(kind, namespace)}?gracePeriodSeconds=0")
        sel = urllib.parse.quote(f"spec.nodeName={node}")
        self.cluster.ok("DELETE", f"{_collection('ResourceSlice', None)}?fieldSelector={sel}")
        assert self.wait_for(lambda k: not k.list("ResourceClaim", namespace) and not k.list("Pod", namespace), 30)

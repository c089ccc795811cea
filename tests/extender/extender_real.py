"""The extender's tests on the real kube-apiserver (no tests here): `RealKube`, the test's hands on the real API
server with the stand-in's verbs (put, get, delete, list), and `RealExtCluster`, the `Cluster` of
test_extender_support.py whose extender lists, watches and binds through it.

Where the real server differs from the stand-in, the difference is the server's and the tests see it: a pod's
status is written through its `status` subresource (a PUT of the pod leaves it), a pod's spec is immutable but
for a few fields, a Binding is refused for a pod already bound, and deleting a bound pod is graceful (it stays,
terminating, until its kubelet confirms): `delete` here is the kubelet's last word (gracePeriodSeconds=0), the
object gone at once. The real control plane is shared by every "kube"-group test of the session: each test
module has its namespace, and `RealKube.clean()` removes the pods, Events and nodes a test made.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

from kube_real import RealCluster, wait_until
from test_extender_support import Cluster

from memslice.kube.config import load_api_client
from memslice.scheduler_extender.app import Config
from memslice.scheduler_extender.placement.state import ClusterState

PLURALS = {"Pod": "pods", "Node": "nodes", "Event": "events", "ConfigMap": "configmaps"}


class RealKube:
    """put/get/delete/list of plain dicts on the real API server (as the admin), remembering what it wrote so
    that a test can wait for an extender to have seen it (RealExtCluster.caught_up)."""

    def __init__(self, cluster: RealCluster, namespace: str) -> None:
        self.cluster, self.ns = cluster, namespace
        cluster.ensure_namespace(namespace)
        self.written = {"nodes": 0, "pods": 0}  # the newest resourceVersion written, per kind
        self.gone: set[tuple[str, str, str]] = set()  # (plural, namespace, name) deleted and not made again
        self.nodes: set[str] = set()  # the nodes made here, removed by clean()

    def api_client(self) -> Any:
        api, _ = load_api_client(str(self.cluster.admin_kubeconfig))
        return api

    def path(self, kind: str, ns: str | None, name: str | None = None, sub: str | None = None) -> str:
        plural = PLURALS[kind]
        base = "/api/v1" + (f"/namespaces/{ns}" if ns and kind != "Node" else "") + f"/{plural}"
        return base + (f"/{quote(name, safe='')}" if name else "") + (f"/{sub}" if sub else "")

    def _note(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        if plural in self.written:
            self.written[plural] = max(self.written[plural], int(obj["metadata"]["resourceVersion"]))
        return obj

    def get(self, kind: str, ns: str | None, name: str) -> dict[str, Any] | None:
        status, out = self.cluster.request("GET", self.path(kind, ns, name))
        if status == 404:
            return None
        assert status == 200, f"GET {kind} {ns}/{name}: {status} {out}"
        return dict(out)

    def list(self, kind: str, ns: str | None = None) -> list[dict[str, Any]]:
        return list(self.cluster.ok("GET", self.path(kind, ns))["items"])

    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create the object, or replace the stored one (unconditionally, as the stand-in's put); the fields of a
        pod's or node's `status` given are then written through the status subresource, as its kubelet does."""
        kind, meta = obj["kind"], obj["metadata"]
        ns = meta.get("namespace") if kind != "Node" else None
        plural = PLURALS[kind]
        body = copy.deepcopy(obj)
        status = body.pop("status", None)
        for field in ("resourceVersion", "uid", "creationTimestamp", "managedFields"):
            body["metadata"].pop(field, None)
        current = self.get(kind, ns, meta["name"])
        if current is None:
            out = self.cluster.ok("POST", self.path(kind, ns), body)
        else:
            out = self.cluster.ok("PUT", self.path(kind, ns, meta["name"]), body)
        if kind == "Node":
            self.nodes.add(meta["name"])
        self.gone.discard((plural, ns or "", meta["name"]))
        if status is not None and any((out.get("status") or {}).get(k) != v for k, v in status.items()):
            merged = {**out, "status": {**(out.get("status") or {}), **status}}  # the fields given, the rest kept
            out = self.cluster.ok("PUT", self.path(kind, ns, meta["name"], "status"), merged)
        return self._note(plural, dict(out))

    def delete(self, kind: str, ns: str | None, name: str) -> dict[str, Any] | None:
        """Delete at once (gracePeriodSeconds=0: for a bound pod, its kubelet's confirmation); None if absent."""
        status, out = self.cluster.request("DELETE", self.path(kind, ns, name) + "?gracePeriodSeconds=0")
        if status == 404:
            return None
        assert status == 200, f"DELETE {kind} {ns}/{name}: {status} {out}"
        self.gone.add((PLURALS[kind], ns or "", name))
        return dict(out)

    def wait_for(self, predicate: Callable[[RealKube], bool], timeout: float = 10.0) -> bool:
        """Whether `predicate(self)` came to hold within `timeout` s (polled every 0.1 s: each poll is a request
        on a new TLS connection to the real server)."""
        try:
            wait_until("the API server's objects", lambda: predicate(self), timeout, 0.1)
        except AssertionError:
            return False
        return True

    def requests_by(self, user: str, verb: str, resource: str) -> int:
        """How many `verb` requests on `resource` (e.g. "pods", "nodes/status") `user` has made so far, from
        the API server's audit log."""
        def of(ev: dict[str, Any]) -> str:
            ref = ev.get("objectRef") or {}
            return str(ref.get("resource", "")) + (f"/{ref['subresource']}" if ref.get("subresource") else "")

        return sum(1 for ev in self.cluster.audit(user) if ev.get("verb") == verb and of(ev) == resource)

    def forget_inventory(self, node: str) -> None:
        """Remove a node agent's annotations from `node` (for the next test's agent to write its own)."""
        obj = self.get("Node", None, node) or {}
        gone = {k: None for k in (obj.get("metadata", {}).get("annotations") or {}) if k.startswith("memslice.io/")}
        if gone:
            self.cluster.ok("PATCH", f"/api/v1/nodes/{node}", {"metadata": {"annotations": gone}},
                            content_type="application/merge-patch+json")

    def clean(self) -> None:
        """Remove the pods and Events of this namespace and the nodes made here (the next test starts from
        nothing)."""
        self.cluster.ok("DELETE", f"/api/v1/namespaces/{self.ns}/pods?gracePeriodSeconds=0")
        self.cluster.ok("DELETE", f"/api/v1/namespaces/{self.ns}/events")
        for name in sorted(self.nodes):
            status, out = self.cluster.request("DELETE", f"/api/v1/nodes/{name}")
            assert status in (200, 404), f"DELETE node {name}: {status} {out}"
        self.nodes.clear()


class RealExtCluster(Cluster):
    """A running extender on the real API server (the Cluster of test_extender_support.py)."""

    kube: RealKube  # type: ignore[assignment]
    BOUND = 30.0  # the failure deadline of a wait: a real API server on a loaded machine (never a measurement)

    def wait_used(self, node: str, expected: list[int], timeout: float = BOUND) -> None:
        super().wait_used(node, expected, timeout)

    def caught_up(self, timeout: float = BOUND) -> None:
        """Wait until the extender's watches have delivered every node and pod this test wrote: events of one
        watch come in resourceVersion order, so the newest version it has seen at or past a write's means
        that write is in; a deleted object is caught up when the extender no longer has it."""
        want, gone = dict(self.kube.written), set(self.kube.gone)

        def done(s: ClusterState) -> bool:
            return (all(s.last_rv[k] >= v for k, v in want.items())
                    and all((s.pod(ns, name) is None) if plural == "pods" else not s.knows_node(name)
                            for plural, ns, name in gone))

        ok = self.state.wait_for(done, timeout)
        assert ok, f"extender did not catch up with {want} and {sorted(gone)} gone: {self.state.last_rv}"


@contextmanager
def real_ext_cluster(cluster: RealCluster, namespace: str, config: Config | None = None,
                     clock: Any = None) -> Iterator[RealExtCluster]:
    """A RealExtCluster in `namespace` (not started); what the test made is removed afterwards."""
    kube = RealKube(cluster, namespace)
    ext = RealExtCluster(kube, config, clock)  # type: ignore[arg-type]
    try:
        yield ext
    finally:
        ext.stop()
        kube.clean()

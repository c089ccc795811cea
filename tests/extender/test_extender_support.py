"""Shared helpers for the extender tests (no tests here): objects, a running cluster, an HTTP client."""

from __future__ import annotations

import http.client
import json
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from kube_standin import KubeApiStandin

from memslice.scheduler_extender.app import Config, Extender
from memslice.scheduler_extender.placement.state import ClusterState

RESOURCE = "memslice.io/gpu-mem"


def node_obj(name: str, sizes_mib: list[int], unit: int = 1, healthy: list[bool] | None = None) -> dict:
    gpus = [{"uuid": f"GPU-{name}-{i}", "index": i, "model": "Sim", "memMiB": mib, "numa": 0,
             "healthy": True if healthy is None else healthy[i]} for i, mib in enumerate(sizes_mib)]
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {"memslice.io/gpus": json.dumps(gpus),
                                                       "memslice.io/unit-mib": str(unit)}}}


def plain_node(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


def pod_obj(name: str, containers: dict[str, int | str] | None = None, *, init: dict[str, int] | None = None,
            sidecars: dict[str, int] | None = None, policy: str | None = None, ns: str = "default",
            node: str | None = None, annotations: dict[str, str] | None = None,
            scheduler: str = "memslice-scheduler") -> dict:
    def c(cname: str, qty: int | str | None, **extra: Any) -> dict:
        res = {"limits": {RESOURCE: str(qty)}} if qty is not None else {}
        return {"name": cname, "image": "cuda", "resources": res, **extra}

    spec: dict[str, Any] = {"schedulerName": scheduler,
                            "containers": [c(n, q) for n, q in (containers or {"main": None}).items()]}
    inits = [c(n, q) for n, q in (init or {}).items()]
    inits += [c(n, q, restartPolicy="Always") for n, q in (sidecars or {}).items()]
    if inits:
        spec["initContainers"] = inits
    if node:
        spec["nodeName"] = node
    ann = dict(annotations or {})
    if policy:
        ann["memslice.io/policy"] = policy
    meta: dict[str, Any] = {"name": name, "namespace": ns}
    if ann:
        meta["annotations"] = ann
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


class Client:
    """Talks to the extender the way kube-scheduler does: POST JSON to <url>/<verb>, keep-alive."""

    def __init__(self, url: str, context: ssl.SSLContext | None = None) -> None:
        parts = urlsplit(url)
        self.host, self.port, self.https = parts.hostname or "", parts.port or 80, parts.scheme == "https"
        self.context = context
        self.local = threading.local()

    def _conn(self) -> http.client.HTTPConnection:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            if self.https:
                conn = http.client.HTTPSConnection(self.host, self.port, timeout=30, context=self.context)
            else:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
            self.local.conn = conn
        return conn

    def raw(self, method: str, path: str, body: bytes | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:
        for attempt in (1, 2):
            conn = self._conn()
            try:
                conn.request(method, path, body=body, headers=headers or {})
                resp = conn.getresponse()
                data = resp.read()
                if resp.getheader("Connection", "").lower() == "close":
                    conn.close()
                    self.local.conn = None
                return resp.status, data, dict(resp.getheaders())
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                conn.close()
                self.local.conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def post(self, verb: str, body: Any) -> tuple[int, Any]:
        data = json.dumps(body).encode()
        status, raw, _ = self.raw("POST", f"/{verb}", data, {"Content-Type": "application/json"})
        return status, json.loads(raw)

    def filter(self, pod: dict, names: list[str]) -> dict:
        status, body = self.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": names})
        assert status == 200, body
        return body

    def prioritize(self, pod: dict, names: list[str]) -> dict[str, int]:
        status, body = self.post("prioritize", {"Pod": pod, "Nodes": None, "NodeNames": names})
        assert status == 200, body
        return {hp["Host"]: hp["Score"] for hp in body}

    def bind(self, pod: dict, node: str) -> str:
        meta = pod["metadata"]
        status, body = self.post("bind", {"PodName": meta["name"],
                                          "PodNamespace": meta.get("namespace", "default"),
                                          "PodUID": meta.get("uid", ""), "Node": node})
        assert status == 200, body
        assert set(body) == {"Error"}
        return body["Error"]

    def close(self) -> None:
        conn = getattr(self.local, "conn", None)
        if conn is not None:
            conn.close()


class FakeClock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Cluster:
    """A Kubernetes API stand-in plus a running extender talking to it over real HTTP."""

    def __init__(self, kube: KubeApiStandin, config: Config | None = None, clock: Any = None) -> None:
        self.kube = kube
        self.config = config or Config(address="127.0.0.1", port=0, watch_timeout=30)
        self.clock = clock
        self.ext: Extender | None = None
        self.client: Client | None = None

    def start(self) -> Cluster:
        kwargs = {"clock": self.clock} if self.clock is not None else {}
        self.ext = Extender(self.kube.api_client(), self.config, **kwargs).start()
        assert self.ext.wait_synced(10), "extender did not sync"
        self.client = Client(self.ext.url)
        return self

    def stop(self) -> None:
        if self.client:
            self.client.close()
        if self.ext:
            self.ext.stop()
        self.ext = None

    @property
    def state(self) -> ClusterState:
        assert self.ext is not None
        return self.ext.state

    @property
    def c(self) -> Client:
        assert self.client is not None
        return self.client

    def add_node(self, obj: dict) -> dict:
        stored = self.kube.put(obj)
        self.caught_up()
        return stored

    def add_pod(self, obj: dict) -> dict:
        """Create a pod (as a user would) and wait until the extender has seen it."""
        stored = self.kube.put(obj)
        self.caught_up()
        return stored

    def caught_up(self, timeout: float = 10) -> None:
        """Wait until the extender's watches have delivered the stand-in's latest node and pod events
        (a pod event the extender's selector hides, e.g. a change to a finished pod, is never delivered)."""
        want: dict[str, int] = {}
        with self.kube.store.cond:
            for ev in self.kube.store.events:
                if ev.plural in ("nodes", "pods"):
                    want[ev.plural] = ev.rv
        ok = self.state.wait_for(lambda s: all(s.last_rv[k] >= v for k, v in want.items()), timeout)
        assert ok, f"extender did not catch up with {want}: {self.state.last_rv}"

    def used(self, node: str) -> list[int]:
        view = self.state.view(node)
        assert view is not None
        return [g.used_mib for g in view.gpus]

    def wait_used(self, node: str, expected: list[int], timeout: float = 10) -> None:
        ok = self.state.wait_for(lambda s: (v := s.view(node)) is not None
                                 and [g.used_mib for g in v.gpus] == expected, timeout)
        assert ok, f"used on {node}: {self.used(node)}, expected {expected}"

    def seen_rv(self, kind: str, name: str, ns: str = "default", timeout: float = 10) -> None:
        """Wait until the extender has seen the stand-in's current version of a pod."""
        obj = self.kube.get(kind, ns, name)
        assert obj is not None
        rv = int(obj["metadata"]["resourceVersion"])
        ok = self.state.wait_for(lambda s: (r := s.pod(ns, name)) is not None and r.rv >= rv, timeout)
        assert ok, f"extender did not see {ns}/{name} at resourceVersion {rv}"


@contextmanager
def running_cluster(config: Config | None = None, clock: Any = None) -> Iterator[Cluster]:
    kube = KubeApiStandin().start()
    cluster = Cluster(kube, config, clock)
    try:
        yield cluster
    finally:
        cluster.stop()
        kube.stop()

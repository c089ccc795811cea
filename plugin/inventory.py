"""The Kubernetes side: node inventory annotations (written) and the pods of this node (watched).

Uses the official `kubernetes` client. Its Watch gives raw events; the list-then-watch loop with
resourceVersion, 410 Gone relist and reconnect backoff is written here because the Python client has no
informer.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from memslice.plugin.allocator import ANN_GPU_MEM, ANN_GPU_UUID, PodInfo
from memslice.plugin.gpus import GpuInfo
from memslice.plugin.state import TERMINAL_PHASES, NodeState

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

log = logging.getLogger(__name__)

ANN_GPUS = "memslice.io/gpus"
ANN_UNIT = "memslice.io/unit-mib"


def inventory_annotations(gpus: Sequence[GpuInfo], healthy: Mapping[str, bool], unit_mib: int
                          ) -> dict[str, str]:
    """The node annotations the extender reads (see the architecture doc)."""
    items = [{"uuid": g.uuid, "index": g.index, "model": g.model, "memMiB": g.mem_mib, "numa": g.numa,
              "healthy": bool(healthy.get(g.uuid, False))} for g in sorted(gpus, key=lambda g: g.index)]
    return {ANN_GPUS: json.dumps(items, separators=(",", ":")), ANN_UNIT: str(unit_mib)}


def api_client(kubeconfig: str | None) -> tuple[ApiClient | None, str]:
    """An ApiClient from --kubeconfig/KUBECONFIG or the in-cluster service account; (None, why) otherwise."""
    from kubernetes import client, config

    cfg = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        return client.ApiClient(cfg), f"kubeconfig {kubeconfig}"
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=cfg)
        return client.ApiClient(cfg), "in-cluster service account"
    return None, ("no kubeconfig (--kubeconfig, KUBECONFIG) and not in a cluster "
                  "(KUBERNETES_SERVICE_HOST unset)")


def pod_info(pod: object) -> PodInfo:
    md = pod.metadata  # type: ignore[attr-defined]
    phase = pod.status.phase if pod.status is not None and pod.status.phase else "Pending"  # type: ignore
    return PodInfo(uid=md.uid, namespace=md.namespace, name=md.name, phase=phase,
                   annotations=dict(md.annotations or {}))


class InventoryPublisher:
    """Patches the node's annotations at start and whenever `mark_dirty` is called; retries with backoff."""

    def __init__(self, api: ApiClient, node: str, payload: Callable[[], dict[str, str]],
                 resync_s: float = 300.0) -> None:
        self.api = api
        self.resync_s = resync_s  # republish now and then: someone may have removed the annotations
        self.node = node
        self.payload = payload
        self.published = threading.Event()
        self._last: dict[str, str] = {}
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="inventory", daemon=True)

    def start(self) -> None:
        self._dirty.set()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._dirty.set()
        self._thread.join(timeout=10)

    def mark_dirty(self) -> None:
        self._dirty.set()

    def _run(self) -> None:
        from kubernetes.client import CoreV1Api
        from kubernetes.client.exceptions import ApiException

        v1 = CoreV1Api(self.api)
        backoff, failures = 0.5, 0
        while not self._stop.is_set():
            self._dirty.wait(self.resync_s)
            if self._stop.is_set():
                return
            self._dirty.clear()
            annotations = self.payload()
            try:
                v1.patch_node(self.node, {"metadata": {"annotations": annotations}},
                              _content_type="application/merge-patch+json", _request_timeout=10)
            except ApiException as exc:
                failures += 1
                hint = (f"node {self.node!r} does not exist: set --node-name (or NODE_NAME from the downward "
                        f"API, spec.nodeName)" if exc.status == 404 else
                        "the agent's service account needs get/patch on nodes" if exc.status == 403 else
                        f"{exc.status} {exc.reason}")
                self._retry(failures, backoff, hint)
                backoff = min(backoff * 2, 30.0)
                continue
            except Exception as exc:  # connection refused, timeouts: the API server is away
                failures += 1
                self._retry(failures, backoff, str(exc))
                backoff = min(backoff * 2, 30.0)
                continue
            if failures:
                log.info("node inventory published after %d failed attempts", failures)
            backoff, failures = 0.5, 0
            self.published.set()
            if annotations != self._last:
                log.info("published node inventory on %s: %s=%s", self.node, ANN_GPUS, annotations[ANN_GPUS])
            self._last = annotations

    def _retry(self, failures: int, backoff: float, why: str) -> None:
        (log.error if failures == 1 or failures % 20 == 0 else log.debug)(
            "publishing the node inventory failed (attempt %d): %s; retrying in %.1fs", failures, why,
            backoff)
        self._dirty.set()
        self._stop.wait(backoff)


class PodWatcher:
    """Keeps NodeState.pods equal to the pods bound to this node: list, then watch from its resourceVersion;
    relist on 410 Gone; reconnect with backoff when the API server goes away."""

    def __init__(self, api: ApiClient, node: str, state: NodeState, on_gone: Callable[[], None],
                 watch_timeout_s: int = 60) -> None:
        self.api = api
        self.node = node
        self.state = state
        self.on_gone = on_gone
        self.watch_timeout_s = watch_timeout_s
        self.synced = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)
        self._watch: object | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        w = self._watch
        if w is not None:
            w.stop()  # type: ignore[attr-defined]
        self._thread.join(timeout=0.5)  # a watch blocked in a read ends at its timeout; the thread is a daemon

    def _run(self) -> None:
        from kubernetes import watch
        from kubernetes.client import CoreV1Api
        from kubernetes.client.exceptions import ApiException

        v1 = CoreV1Api(self.api)
        selector = f"spec.nodeName={self.node}"
        rv: str | None = None
        backoff, failures = 0.2, 0
        while not self._stop.is_set():
            try:
                if rv is None:
                    pods = v1.list_pod_for_all_namespaces(field_selector=selector, _request_timeout=30)
                    infos = [pod_info(p) for p in pods.items]
                    for info in infos:
                        self._log_reservation(self.state.pods.get(info.uid), info)
                    self.state.pods_replace(infos)
                    rv = pods.metadata.resource_version
                    self.synced.set()
                    self.on_gone()  # pods may have gone while we were not watching
                    log.info("pod watch: %d pods on node %s (resourceVersion %s)", len(pods.items), self.node,
                             rv)
                w = watch.Watch()
                self._watch = w
                for ev in w.stream(v1.list_pod_for_all_namespaces, field_selector=selector,
                                   resource_version=rv, timeout_seconds=self.watch_timeout_s,
                                   allow_watch_bookmarks=True,
                                   _request_timeout=self.watch_timeout_s + 10):
                    if self._stop.is_set():
                        w.stop()
                        break
                    obj, kind = ev["object"], ev["type"]
                    rv = obj.metadata.resource_version or rv
                    if kind == "BOOKMARK":
                        continue
                    info = pod_info(obj)
                    if kind == "DELETED":
                        self.state.pod_delete(info.uid)
                        self.on_gone()
                    else:
                        self._log_reservation(self.state.pods.get(info.uid), info)
                        self.state.pod_upsert(info)
                        if info.phase in TERMINAL_PHASES:
                            self.on_gone()
                backoff, failures = 0.2, 0
            except ApiException as exc:
                if exc.status == 410:
                    log.info("pod watch: resourceVersion %s expired (410 Gone): listing again", rv)
                    rv = None
                    continue
                failures += 1
                self._fail(failures, backoff, f"{exc.status} {exc.reason}")
                backoff = min(backoff * 2, 10.0)
            except Exception as exc:  # API server restart, connection reset
                failures += 1
                self._fail(failures, backoff, str(exc))
                backoff = min(backoff * 2, 10.0)

    @staticmethod
    def _log_reservation(before: PodInfo | None, pod: PodInfo) -> None:
        keys = (ANN_GPU_UUID, ANN_GPU_MEM)
        now = tuple(pod.annotations.get(k) for k in keys)
        if now[0] is not None and (before is None or tuple(before.annotations.get(k) for k in keys) != now):
            log.info("pod %s/%s: the extender reserved GPU %s (%s=%s)", pod.namespace, pod.name, now[0],
                     ANN_GPU_MEM, now[1])

    def _fail(self, failures: int, backoff: float, why: str) -> None:
        (log.warning if failures == 1 or failures % 20 == 0 else log.debug)(
            "pod watch interrupted (attempt %d): %s; reconnecting in %.1fs", failures, why, backoff)
        self._stop.wait(backoff)

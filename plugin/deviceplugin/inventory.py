"""The Kubernetes side: node inventory annotations (written) and the pods of this node (watched).

Uses the official `kubernetes` client; the pods are listed and watched by the informer the extender uses
too (memslice.kube.informer: paged list, watch with bookmarks, 410 Gone relist, reconnect with
memslice.kube.backoff), since the Python client has none.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from memslice.contract import (
    ANN_GPU_MEM,
    ANN_GPU_UUID,
    ANN_GPUS,
    TERMINAL_PHASES,
    Gpu,
    Inventory,
    RequestError,
    container_devices,
)
from memslice.kube.backoff import Backoff
from memslice.kube.calls import CoreV1ApiRaw, done
from memslice.kube.informer import Informer

from ..gpu.nvml import GpuInfo
from .allocator import PodInfo
from .state import PluginState

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

log = logging.getLogger(__name__)


def inventory_annotations(gpus: Sequence[GpuInfo], healthy: Mapping[str, bool], unit_mib: int
                          ) -> dict[str, str]:
    """The node annotations the extender reads (memslice.contract.Inventory)."""
    return Inventory(unit_mib, tuple(Gpu(uuid=g.uuid, index=g.index, model=g.model, mem_mib=g.mem_mib, numa=g.numa,
                                         healthy=bool(healthy.get(g.uuid, False)),
                                         nvml_total_mib=g.nvml_total_mib or None, reserved_mib=g.reserved_mib,
                                         nvlink=g.nvlink, pcie=g.pcie)
                                     for g in gpus)).format()


def container_asks(spec: object) -> tuple[tuple[str, int], ...] | None:
    """Each container's (init ones too) memslice.io/gpu-mem devices from a pod spec, as the kubelet asks Allocate
    for them (the limit, else the request), for the containers asking some; None when any figure or container
    cannot be read (pure). The agent only uses them to recognise a pod spanning GPUs that Allocate must not give
    one GPU (allocator.one_gpu_callers), where unknown means "could be anyone's": never a refusal."""
    if not isinstance(spec, dict):
        return None
    out: list[tuple[str, int]] = []
    for field in ("initContainers", "containers"):
        containers = spec.get(field) or []
        if not isinstance(containers, list):
            return None
        for c in containers:
            if not isinstance(c, dict) or not isinstance(c.get("name"), str):
                return None
            try:
                n = container_devices(c, c["name"])  # as the extender reads it (the limit, else the request)
            except RequestError:
                return None
            if n:
                out.append((c["name"], n))
    return tuple(out)


def pod_info(pod: dict[str, Any]) -> PodInfo:
    """What the agent keeps of a pod, from its JSON as the API server sends it."""
    md = pod.get("metadata") or {}
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    spec = pod.get("spec") or {}
    prio = spec.get("priority") if isinstance(spec, dict) else None
    return PodInfo(uid=md.get("uid") or "", namespace=md.get("namespace") or "", name=md.get("name") or "",
                   phase=phase, annotations=dict(md.get("annotations") or {}),
                   priority=prio if type(prio) is int and -(2**31) <= prio < 2**31 else 0,
                   asks=container_asks(spec))


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
        from kubernetes.client.exceptions import ApiException

        v1 = CoreV1ApiRaw(self.api)  # CoreV1Api's requests, without its import (memslice.kube.calls)
        backoff = Backoff(initial=0.5, maximum=30.0)
        while not self._stop.is_set():
            self._dirty.wait(self.resync_s)
            if self._stop.is_set():
                return
            self._dirty.clear()
            annotations = self.payload()
            try:
                done(v1.patch_node(self.node, {"metadata": {"annotations": annotations}},
                                   _content_type="application/merge-patch+json", _request_timeout=10))
            except ApiException as exc:
                hint = (f"node {self.node!r} does not exist: set --node-name (or NODE_NAME from the downward "
                        f"API, spec.nodeName)" if exc.status == 404 else
                        "the agent's service account needs get/patch on nodes" if exc.status == 403 else
                        f"{exc.status} {exc.reason}")
                self._retry(backoff, hint)
                continue
            except Exception as exc:  # connection refused, timeouts: the API server is away
                self._retry(backoff, str(exc))
                continue
            if backoff.failures:
                log.info("node inventory published after %d failed attempts", backoff.failures)
            backoff.reset()
            self.published.set()
            if annotations != self._last:
                log.info("published node inventory on %s: %s=%s", self.node, ANN_GPUS, annotations[ANN_GPUS])
            self._last = annotations

    def _retry(self, backoff: Backoff, why: str) -> None:
        delay = backoff.delay()
        (log.error if backoff.failures == 1 or backoff.failures % 20 == 0 else log.debug)(
            "publishing the node inventory failed (attempt %d): %s; retrying in %.1fs", backoff.failures, why,
            delay)
        self._dirty.set()
        self._stop.wait(delay)


class PodWatcher:
    """Keeps PluginState.pods equal to the pods bound to this node (memslice.kube.informer: list, then watch
    from its resourceVersion; relist on 410 Gone; reconnect with backoff when the API server goes away)."""

    def __init__(self, api: ApiClient, node: str, state: PluginState, on_gone: Callable[[], None],
                 watch_timeout_s: int = 60) -> None:
        self.api = api
        self.node = node
        self.state = state
        self.on_gone = on_gone
        self.watch_timeout_s = watch_timeout_s
        self.synced = threading.Event()
        self._stop = threading.Event()
        self._informer: Informer | None = None

    def start(self) -> None:
        self._informer = Informer(
            "pods", CoreV1ApiRaw(self.api).list_pod_for_all_namespaces, on_replace=self._replace,
            on_upsert=self._upsert, on_delete=self._delete, synced=self.synced, stop=self._stop,
            field_selector=f"spec.nodeName={self.node}", watch_timeout=self.watch_timeout_s, convert=pod_info,
            backoff=Backoff(initial=0.2, maximum=10.0)).start()

    def stop(self) -> None:
        if self._informer is not None:
            self._informer.stop()
            self._informer.join(0.5)  # a watch blocked in a read ends at its timeout; the thread is a daemon

    def _replace(self, infos: list[PodInfo], rv: int) -> None:
        for info in infos:
            self._log_reservation(self.state.pods.get(info.uid), info)
        self.state.pods_replace(infos)
        self.on_gone()  # pods may have gone while we were not watching
        log.info("pod watch: %d pods on node %s (resourceVersion %s)", len(infos), self.node, rv)

    def _upsert(self, obj: dict[str, Any]) -> None:
        info = pod_info(obj)
        self._log_reservation(self.state.pods.get(info.uid), info)
        self.state.pod_upsert(info)
        if info.phase in TERMINAL_PHASES:
            self.on_gone()

    def _delete(self, obj: dict[str, Any]) -> None:
        self.state.pod_delete(pod_info(obj).uid)
        self.on_gone()

    @staticmethod
    def _log_reservation(before: PodInfo | None, pod: PodInfo) -> None:
        keys = (ANN_GPU_UUID, ANN_GPU_MEM)
        now = tuple(pod.annotations.get(k) for k in keys)
        if now[0] is not None and (before is None or tuple(before.annotations.get(k) for k in keys) != now):
            log.info("pod %s/%s: the extender reserved GPU %s (%s=%s)", pod.namespace, pod.name, now[0],
                     ANN_GPU_MEM, now[1])

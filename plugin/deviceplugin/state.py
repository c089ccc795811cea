"""Device-plugin mode's state: the shared state plus the device list and the node's pods.

One lock guards it (the shared one); `changed` is notified whenever the device list changes so ListAndWatch
streams wake.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from memslice.contract import TERMINAL_PHASES
from memslice.errors import ContractError
from memslice.proto import api_pb2

from ..gpu.health import HealthBook
from ..gpu.nvml import GpuInfo
from ..state import NodeState
from .allocator import PodInfo, ReservedPod, parse_reservation
from .devices import HEALTHY, UNHEALTHY, device_id, devices_per_gpu

log = logging.getLogger(__name__)


def build_device_list(gpus: Iterable[GpuInfo], healthy: dict[str, bool], unit_mib: int
                      ) -> api_pb2.ListAndWatchResponse:
    resp = api_pb2.ListAndWatchResponse()
    for gpu in gpus:
        health = HEALTHY if healthy.get(gpu.uuid, False) else UNHEALTHY
        topology = (api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=gpu.numa)])
                    if gpu.numa is not None else None)
        resp.devices.extend(api_pb2.Device(ID=device_id(gpu.index, n), health=health, topology=topology)
                            for n in range(devices_per_gpu(gpu.mem_mib, unit_mib)))
    return resp


class PluginState(NodeState):
    def __init__(self, gpus: list[GpuInfo], unit_mib: int, health: HealthBook) -> None:
        super().__init__(gpus, unit_mib, health)
        self.changed = threading.Condition(self.lock)
        self.version = 1
        self._list: tuple[int, api_pb2.ListAndWatchResponse] | None = None
        self.pods: dict[str, PodInfo] = {}
        self.gone_uids: set[str] = set()
        self._bad_reservations: set[str] = set()
        # device IDs the agent last preferred -> the reservation and container it chose them for
        self.preferred: dict[frozenset[str], tuple[ReservedPod, str]] = {}
        self.pods_version = 0  # bumped by every pod event, so a caller can wait for the watch to catch up
        # Allocate calls in flight by region ID (count), and when the last answer for each ended (monotonic):
        # the regions the kubelet may not have recorded yet (`young`), which reconciliation never removes
        self.answering: dict[str, int] = {}
        self.answered: dict[str, float] = {}

    # --- device list -------------------------------------------------------------------------------------
    def bump(self) -> None:
        """The device list changed (health): wake every ListAndWatch stream."""
        with self.changed:
            self.version += 1
            self.changed.notify_all()

    def device_list(self) -> tuple[int, api_pb2.ListAndWatchResponse]:
        """The current full list, built once per version and shared by all streams."""
        with self.lock:
            if self._list is None or self._list[0] != self.version:
                self._list = (self.version, build_device_list(self.gpus.values(), self.health.snapshot(),
                                                              self.unit_mib))
            return self._list

    # --- allocations being answered ------------------------------------------------------------------------
    def begin_answer(self, region_ids: Iterable[str]) -> None:
        """An Allocate call is about to create these regions: from now until `end_answer`, neither the orphan
        sweep nor reconciliation may remove them (their directories exist before their ledger entries do)."""
        with self.lock:
            for rid in region_ids:
                self.answering[rid] = self.answering.get(rid, 0) + 1

    def end_answer(self, region_ids: Iterable[str], at: float) -> None:
        """The Allocate call that began them ended at `at` (monotonic): answered, failed or cancelled."""
        with self.lock:
            for rid in region_ids:
                left = self.answering.get(rid, 0) - 1
                if left > 0:
                    self.answering[rid] = left
                else:
                    self.answering.pop(rid, None)
                self.answered[rid] = at

    def young(self, looked_at: float, grace_s: float) -> frozenset[str]:
        """Region IDs the kubelet may not have recorded at `looked_at` (monotonic): being answered, or answered
        less than `grace_s` before it. Stamps too old for any later look are forgotten (bounded)."""
        with self.lock:
            for rid in [r for r, t in self.answered.items() if looked_at - t >= grace_s]:
                del self.answered[rid]
            return frozenset(self.answering) | frozenset(self.answered)

    # --- pods ----------------------------------------------------------------------------------------------
    def pods_replace(self, pods: Iterable[PodInfo]) -> None:
        with self.changed:
            new = {p.uid: p for p in pods}
            self.gone_uids |= set(self.pods) - set(new)
            self.pods = new
            self._pods_changed()

    def pod_upsert(self, pod: PodInfo) -> None:
        with self.changed:
            self.pods[pod.uid] = pod
            if pod.phase in TERMINAL_PHASES:
                self.gone_uids.add(pod.uid)
            self._pods_changed()

    def pod_delete(self, uid: str) -> None:
        with self.changed:
            self.pods.pop(uid, None)
            self.gone_uids.add(uid)
            self._pods_changed()

    def _pods_changed(self) -> None:
        self.pods_version += 1
        self.changed.notify_all()

    def wait_pods_changed(self, since: int, timeout: float) -> bool:
        """Wait (at most `timeout` seconds) for a pod event after version `since`; whether one came."""
        with self.changed:
            return self.changed.wait_for(lambda: self.pods_version != since, timeout)

    def reservations(self) -> list[ReservedPod]:
        """Reservations of this node's pods that are not finished (a malformed one is logged once)."""
        out = []
        with self.lock:
            pods = list(self.pods.values())
        for pod in pods:
            if pod.phase in TERMINAL_PHASES:
                continue
            try:
                r = parse_reservation(pod)
            except ContractError as exc:
                if pod.uid not in self._bad_reservations:
                    self._bad_reservations.add(pod.uid)
                    log.error("%s", exc)
                continue
            if r is not None:
                out.append(r)
        return out

    def taken(self) -> set[tuple[str, str]]:
        """(pod UID, container) pairs that already hold an allocation."""
        with self.lock:
            return {(a.pod_uid, a.container) for a in self.ledger.values() if a.pod_uid}

    def running_uids(self) -> set[str]:
        """UIDs of this node's pods that the pod watch sees and that are not finished."""
        with self.lock:
            return {p.uid for p in self.pods.values() if p.phase not in TERMINAL_PHASES}

    def uid_of(self) -> dict[tuple[str, str], str]:
        with self.lock:
            return {(p.namespace, p.name): p.uid for p in self.pods.values()}

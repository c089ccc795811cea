"""Device-plugin mode of the node agent (`--kubelet-api device-plugin`): assembles the parts and owns their lifecycle.

Order matters: the ledger is recovered (region files, then the kubelet's PodResources record) before either
socket serves; the node inventory and the pod watch start before the services register; the reconcile loop
runs from then on, keeping the ledger equal to the kubelet's record.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import grpc

from memslice import errors
from memslice.contract import RESOURCE_COMPUTE

from ..compute_slots import release_all
from ..config import AgentConfig
from ..elastic.slots import write_roster
from ..gpu.health import HealthBook
from ..gpu.nvml import GpuInfo
from ..ledger import Allocation
from ..metrics import Metrics
from ..regions import RegionStore
from ..response import ResponseConfig
from .compute import ComputePluginService
from .devices import GpuShape, ListTooLarge, check_list_fits
from .inventory import InventoryPublisher, PodWatcher, inventory_annotations
from .podresources import PodResourcesClient
from .reconcile import reconcile
from .registration import COMPUTE_SOCKET, Registrar
from .server import DevicePluginService, PluginServer
from .state import PluginState

log = logging.getLogger(__name__)


class DevicePluginStartError(errors.UnavailableError):
    """Device-plugin mode cannot start; the message names the value or path and the fix."""


class DevicePluginMode:
    """The hooks NodeAgent.start calls in device-plugin mode (plugin/dra/agent.py DraMode is the other)."""

    needs_api = False  # standalone is allowed: no inventory, best-fit preferred allocation

    def __init__(self, cfg: AgentConfig, regions: RegionStore, metrics: Metrics) -> None:
        self.cfg = cfg
        self.regions = regions
        self.metrics = metrics
        self.state: PluginState | None = None
        self.registrar: Registrar | None = None
        self.compute_registrar: Registrar | None = None
        self.publisher: InventoryPublisher | None = None
        self.pod_watcher: PodWatcher | None = None
        self.podresources = PodResourcesClient(cfg.pod_resources_socket) if cfg.pod_resources_socket else None
        self._stop = threading.Event()
        self._reconcile_now = threading.Event()
        self._reconciler = threading.Thread(target=self._reconcile_loop, name="reconcile", daemon=True)
        self._reconcile_heartbeat = time.monotonic()
        self._pr_failing = False
        self._kept_in_use: set[str] = set()  # regions kept for a live process (said once each)

    # --- the hooks, in the order NodeAgent.start calls them ---------------------------------------------
    def check(self, gpus: list[GpuInfo]) -> None:
        """Before anything is installed: the device list fits the kubelet's message limit."""
        try:
            size = check_list_fits([GpuShape(g.index, g.mem_mib, g.numa) for g in gpus], self.cfg.unit_mib)
        except ListTooLarge as exc:
            raise DevicePluginStartError(str(exc)) from exc
        log.info("ListAndWatch message: at most %d bytes (kubelet limit 4194304) at --unit-mib %d", size,
                 self.cfg.unit_mib)

    def new_state(self, gpus: list[GpuInfo], health: HealthBook) -> PluginState:
        self.state = PluginState(gpus, self.cfg.unit_mib, health)
        return self.state

    def recover(self) -> None:
        """The ledger from the region files and the kubelet's record, before serving anything."""
        st = self._st()
        st.ledger.update(self.regions.load())
        self.reconcile_once()
        for g in st.gpus.values():  # the boards' rosters from the recovered ledger
            write_roster(self.cfg.elastic_dir, g.uuid, st.ledger_copy().values())

    def without_api(self, how: str) -> None:
        log.warning("standalone: %s. No node inventory is published and preferred allocation uses best "
                    "fit; the scheduler extender cannot place pods on this node", how)

    def watch(self, api: Any) -> None:
        """The node inventory (annotations the extender reads) and the pods of this node."""
        st = self._st()
        self.publisher = InventoryPublisher(api, self.cfg.node_name, lambda: inventory_annotations(
            list(st.gpus.values()), st.health.snapshot(), st.unit_mib))
        self.publisher.start()
        self.pod_watcher = PodWatcher(api, self.cfg.node_name, st, self._reconcile_now.set)
        self.pod_watcher.start()

    def serve(self, rcfg: ResponseConfig) -> None:
        """Both DevicePlugin services (memory; memslice.io/gpu-compute, 100 per GPU) and the reconcile loop."""
        cfg, st = self.cfg, self._st()
        try:
            cfg.device_plugin_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DevicePluginStartError(f"cannot use --device-plugin-dir {cfg.device_plugin_dir}: {exc}") from exc

        def make_server(sock: Path) -> PluginServer:
            return PluginServer(sock, DevicePluginService(st, self.regions, rcfg, self.metrics), cfg.grpc_workers)

        def make_compute_server(sock: Path) -> PluginServer:
            return PluginServer(sock, ComputePluginService(st, self.metrics), cfg.grpc_workers)

        self.registrar = Registrar(cfg.device_plugin_dir, make_server, self.metrics)
        self.registrar.start()
        self.compute_registrar = Registrar(cfg.device_plugin_dir, make_compute_server, self.metrics,
                                           socket_name=COMPUTE_SOCKET, resource=RESOURCE_COMPUTE, preferred=False,
                                           counted=False)
        self.compute_registrar.start()
        self._reconciler.start()

    def health_changed(self) -> None:
        self._st().bump()
        if self.publisher is not None:
            self.publisher.mark_dirty()

    def live(self) -> bool:
        now = time.monotonic()
        beats = [self._reconcile_heartbeat]
        if self.registrar is not None:
            beats.append(self.registrar.heartbeat)
        stale = max(30.0, 3 * self.cfg.reconcile_interval_s)
        return all(now - b < stale for b in beats)

    def ready(self) -> bool | str:
        return self.registrar is not None and self.registrar.registered.is_set()

    def stop(self) -> None:
        self._stop.set()
        self._reconcile_now.set()
        for part in (self.registrar, self.compute_registrar, self.pod_watcher, self.publisher):
            if part is not None:
                part.stop()
        if self._reconciler.is_alive():
            self._reconciler.join(timeout=5)

    def _st(self) -> PluginState:
        assert self.state is not None, "new_state() comes first"
        return self.state

    # --- reconciliation with the kubelet's record -------------------------------------------------------
    def _reconcile_loop(self) -> None:
        while not self._stop.is_set():
            self._reconcile_heartbeat = time.monotonic()
            self._reconcile_now.wait(self.cfg.reconcile_interval_s)
            self._reconcile_now.clear()
            if self._stop.is_set():
                return
            try:
                self.reconcile_once()
            except Exception:  # never let one bad pass stop cleanup for good
                log.exception("reconciling allocations failed; retrying at the next interval")

    def reconcile_once(self) -> None:
        st = self._st()
        grace = max(2 * self.cfg.reconcile_interval_s, 1.0)
        looked_at, wall = time.monotonic(), time.time()  # before the look: an answer ending after it is young
        live = None
        if self.podresources is not None:
            try:
                live = self.podresources.live_containers()
                if self._pr_failing:
                    log.info("PodResources API answers again")
                self._pr_failing = False
            except (grpc.RpcError, OSError) as exc:
                if not self._pr_failing:
                    detail = exc.details() if isinstance(exc, grpc.RpcError) else str(exc)
                    log.warning("PodResources API at %s unavailable (%s): allocations are tracked from "
                                "Allocate and the pod watch only", self.podresources.socket, detail)
                self._pr_failing = True
        with st.lock:
            ledger = dict(st.ledger)
            gone = set(st.gone_uids)
            uid_of = st.uid_of()
            running = frozenset(st.running_uids())
            young = st.young(looked_at, grace)
        uuid_of = {i: g.uuid for i, g in st.gpus.items()}
        result = reconcile(ledger, live, gone, uid_of, uuid_of, st.unit_mib, wall, grace, running, young)
        for a in result.recovered:
            self.regions.create(a)
            log.info("recovered from the kubelet's record: %d MiB of GPU %d for %s, region %s", a.mib,
                     a.gpu_index, a.owner(), a.region_id)
        for a in result.removed:
            self._remove_entry(a, a.region_id in result.unlisted)
        updated = []
        with st.lock:
            for rid, a in result.keep.items():
                before = ledger.get(rid)
                if before is None:
                    st.ledger.setdefault(rid, a)  # recovered
                elif a != before and st.ledger.get(rid) == before:  # owner learnt; not changed meanwhile
                    st.ledger[rid] = a
                    updated.append(a)
            st.gone_uids &= {a.pod_uid for a in st.ledger.values()}
        for a in updated:
            self.regions.save(a)
            log.info("region %s is %s's (learnt from the PodResources API)", a.region_id, a.owner())
        self._remove_orphans()

    def _in_use(self, rid: str, what: str) -> bool:
        """Whether a live process uses region `rid` (a write lock in its file: RegionStore.user), said once per
        region while it lasts: such a region is never removed on the record's silence or as an orphan."""
        pid = self.regions.user(rid)
        if pid is None:
            self._kept_in_use.discard(rid)
            return False
        if rid not in self._kept_in_use:
            self._kept_in_use.add(rid)
            log.warning("kept region %s (%s): process %s still uses it; removed once no process does", rid, what,
                        pid or "(not visible from here)")
        return True

    def _remove_entry(self, a: Allocation, unlisted: bool) -> None:
        """Remove a ledger entry reconciliation gave up, with its region, unless it changed meanwhile or is being
        answered again; one the record merely lacks (`unlisted`) stays while a live process uses its region."""
        st = self._st()
        rid = a.region_id
        if unlisted and self._in_use(rid, f"{a.owner()}, not in the kubelet's record"):
            return
        with st.lock:  # decided and done under the lock Allocate announces its regions under (begin_answer)
            if st.ledger.get(rid) != a or rid in st.answering:
                return
            self.regions.remove(rid)
            del st.ledger[rid]
        if a.compute_slot >= 0:  # the slot goes back (on each GPU), the rosters no longer count it
            release_all(self.cfg.compute_dir, a.uuids(), a.compute_slot)
        log.info("removed region %s of %s (%d MiB of GPU %s): the pod is gone", rid, a.owner(), a.mib,
                 ",".join(str(i) for i, _ in a.gpus()))

    def _remove_orphans(self) -> None:
        """Remove region directories no allocation holds: neither in the ledger nor being answered (checked
        under the lock Allocate announces its regions under, before it creates them, so a directory whose
        entry is not written yet is never taken for an orphan, however slow the writing) nor used by a live
        process. No age is involved: a directory's mtime is the tenant's to refresh and the disk's to delay."""
        st = self._st()
        dirs = self.regions.directories()
        self._kept_in_use &= set(dirs)
        for rid in dirs:
            with st.lock:
                if rid in st.ledger or rid in st.answering:
                    continue
            if self._in_use(rid, "no allocation holds it"):
                continue
            with st.lock:
                if rid in st.ledger or rid in st.answering:
                    continue
                self.regions.remove(rid)
            log.info("removed region %s: no allocation holds it", rid)

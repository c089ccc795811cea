"""The node agent: wires NVML, health, the plugin server, registration, regions, Kubernetes and metrics."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

import grpc

from memslice import errors
from memslice.contract import RESOURCE_COMPUTE
from memslice.kube.config import load_api_client
from memslice.probe_http import ProbeServer

from .compute_metrics import ComputeCollector
from .compute_slots import release_all
from .config import AgentConfig
from .deviceplugin.compute import ComputePluginService
from .deviceplugin.devices import GpuShape, ListTooLarge, check_list_fits
from .deviceplugin.inventory import InventoryPublisher, PodWatcher, inventory_annotations
from .deviceplugin.podresources import PodResourcesClient
from .deviceplugin.reconcile import reconcile
from .deviceplugin.registration import COMPUTE_SOCKET, Registrar
from .deviceplugin.server import DevicePluginService, PluginServer
from .deviceplugin.state import PluginState
from .dra.agent import DraParts, DraStartError, start_dra
from .elastic.events import SwapEvents
from .elastic.metrics import ElasticCollector, ElasticTracker, region_pid_reader
from .elastic.slots import write_roster
from .gpu.health import HealthBook, XidWatcher
from .gpu.nvml import GpuError, GpuInfo, Nvml
from .ledger import Allocation
from .metrics import HealthServer, Metrics, NodeCollector, host_pid_filler, region_reader
from .regions import RegionStore, dir_usage, install_shim, prepare_elastic_dir
from .response import ResponseConfig

log = logging.getLogger(__name__)


class StartupError(errors.UnavailableError):
    """The agent cannot start; the message says why and what to change."""


def usable_gpus(found: list[GpuInfo]) -> list[GpuInfo]:
    out = []
    for g in found:
        if g.mig:
            log.warning("GPU %d (%s, %s) has MIG enabled: skipped (memslice slices whole GPUs; disable MIG "
                        "with `nvidia-smi -i %d -mig 0` to share it)", g.index, g.uuid, g.model, g.index)
        else:
            out.append(g)
    return out


class NodeAgent:
    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.metrics = Metrics()
        self.nvml = Nvml(simulate=cfg.simulate)
        self.regions = RegionStore(cfg.region_root, idle_after_s=cfg.idle_after_s)
        self.state: PluginState | None = None
        self.registrar: Registrar | None = None
        self.compute_registrar: Registrar | None = None
        self.publisher: InventoryPublisher | None = None
        self.pod_watcher: PodWatcher | None = None
        self.http: HealthServer | None = None
        self.probes: ProbeServer | None = None
        self.podresources = PodResourcesClient(cfg.pod_resources_socket) if cfg.pod_resources_socket else None
        self._xid: XidWatcher | None = None
        self._stop = threading.Event()
        self._reconcile_now = threading.Event()
        self._reconciler = threading.Thread(target=self._reconcile_loop, name="reconcile", daemon=True)
        self._reconcile_heartbeat = time.monotonic()
        self._pr_failing = False
        self.api: object | None = None
        self.dra: DraParts | None = None
        self.elastic: ElasticTracker | None = None
        self.swap_events: SwapEvents | None = None

    # --- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> None:
        cfg = self.cfg
        if cfg.simulate and cfg.sim_gpus:
            os.environ["MEMSLICE_SIM_GPUS"] = cfg.sim_gpus
        if cfg.simulate:  # the containers' simulated usage lives in their region dirs: a node-wide NVML view
            os.environ.setdefault("MEMSLICE_SIM_PEERS", str(cfg.region_root))
        try:
            self.nvml.start()
            found = self.nvml.discover()
        except GpuError as exc:
            raise StartupError(str(exc)) from exc
        gpus = usable_gpus(found)
        for g in gpus:
            log.info("GPU %d: %s %s, %d MiB allocatable (NVML total %d MiB, reserved %s, CUDA total %s), NUMA %s, "
                     "PCIe switch %s, NVLink to %s", g.index, g.uuid, g.model, g.mem_mib, g.nvml_total_mib,
                     "unknown" if g.reserved_mib is None else f"{g.reserved_mib} MiB",
                     "unknown" if g.cuda_total_mib is None else f"{g.cuda_total_mib} MiB",
                     "unknown" if g.numa is None else g.numa, g.pcie or "unknown",
                     ",".join(map(str, g.nvlink)) or "none known")
        if not gpus:
            raise StartupError(f"no usable GPU on this node ({len(found)} found, all MIG-enabled or none): "
                               f"nothing to advertise")
        if cfg.kubelet_api == "device-plugin":
            try:
                size = check_list_fits([GpuShape(g.index, g.mem_mib, g.numa) for g in gpus], cfg.unit_mib)
            except ListTooLarge as exc:
                raise StartupError(str(exc)) from exc
            log.info("ListAndWatch message: at most %d bytes (kubelet limit 4194304) at --unit-mib %d", size,
                     cfg.unit_mib)
        self._install_shim()
        sim_lib_dir, sim_state = self._install_sim_driver() if cfg.simulate else (None, None)
        driver_libs = self._driver_libs(cfg.simulate)  # before any limits file is written (recovery included)
        health = HealthBook([g.uuid for g in gpus], cfg.ignored_xids, cfg.health_recovery_s)
        self.state = PluginState(gpus, cfg.unit_mib, health)
        try:
            self.regions.prepare()
        except OSError as exc:
            raise StartupError(f"cannot create --region-root {cfg.region_root}: {exc}") from exc
        self.regions.reaper.start()  # deletes removed regions in the background (and what a restart left)
        try:
            prepare_elastic_dir(cfg.elastic_dir, [g.uuid for g in gpus])
        except OSError as exc:
            raise StartupError(f"cannot create --elastic-dir {cfg.elastic_dir}: {exc}") from exc
        state = self.state

        def ledger() -> dict[str, Allocation]:
            with state.lock:
                return dict(state.ledger)

        self.elastic = ElasticTracker(cfg.elastic_dir, ledger,
                                      region_pid_reader(lambda rid: str(self.regions.dir_of(rid))),
                                      gpus=[g.uuid for g in gpus])
        if cfg.kubelet_api == "dra":
            self._start_kubernetes_dra()
        else:
            self.state.ledger.update(self.regions.load())
            self.reconcile_once()  # recover what the kubelet recorded before serving anything
            for g in gpus:  # the boards' rosters from the recovered ledger
                write_roster(cfg.elastic_dir, g.uuid, ledger().values())
            self._start_kubernetes()
        self._xid = XidWatcher(gpus, health, self.nvml.responds, self._health_changed)
        self._xid.start()
        self._start_http()
        rcfg = ResponseConfig(shim_host_dir=cfg.shim_host_dir, preload=cfg.preload, visibility=cfg.visibility,
                              cdi_kind=cfg.cdi_kind, sim_lib_dir=sim_lib_dir, sim_state=sim_state,
                              elastic_host_dir=cfg.elastic_dir, idle_after_s=cfg.idle_after_s,
                              driver_libs=driver_libs, compute_host_dir=cfg.compute_dir)
        if cfg.kubelet_api == "dra":
            try:
                self.dra = start_dra(cfg, self.state, self.regions, rcfg, self.api, self.metrics)
            except DraStartError as exc:
                raise StartupError(str(exc)) from exc
            return
        try:
            cfg.device_plugin_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StartupError(f"cannot use --device-plugin-dir {cfg.device_plugin_dir}: {exc}") from exc
        state = self.state

        def make_server(sock: Path) -> PluginServer:
            service = DevicePluginService(state, self.regions, rcfg, self.metrics)
            return PluginServer(sock, service, cfg.grpc_workers)

        def make_compute_server(sock: Path) -> PluginServer:
            return PluginServer(sock, ComputePluginService(state, self.metrics), cfg.grpc_workers)

        self.registrar = Registrar(cfg.device_plugin_dir, make_server, self.metrics)
        self.registrar.start()
        # memslice.io/gpu-compute, 100 per GPU, on its own socket and registration
        self.compute_registrar = Registrar(cfg.device_plugin_dir, make_compute_server, self.metrics,
                                           socket_name=COMPUTE_SOCKET, resource=RESOURCE_COMPUTE, preferred=False,
                                           counted=False)
        self.compute_registrar.start()
        self._reconciler.start()

    def stop(self) -> None:
        self._stop.set()
        self._reconcile_now.set()
        for part in (self.registrar, self.compute_registrar, self.pod_watcher, self.publisher, self.swap_events,
                     self.dra, self._xid, self.http, self.probes, self.regions.reaper):
            if part is not None:
                part.stop()
        if self._reconciler.is_alive():
            self._reconciler.join(timeout=5)
        self.nvml.stop()

    def wait(self) -> None:
        self._stop.wait()

    # --- parts -------------------------------------------------------------------------------------------
    def _install_shim(self) -> None:
        source = self.cfg.shim_source
        if source is None:
            from memslice.paths import LibraryMissing, lib_paths

            try:
                source = lib_paths().shim
            except LibraryMissing as exc:
                raise StartupError(f"{exc} (or pass --shim-source)") from exc
        try:
            target = install_shim(source, self.cfg.shim_host_dir)
        except OSError as exc:
            raise StartupError(f"cannot install the shim {source} into --shim-host-dir "
                               f"{self.cfg.shim_host_dir}: {exc}") from exc
        log.info("installed the shim at %s", target)

    def _driver_libs(self, simulate: bool) -> tuple[tuple[str, str], ...]:
        """The node's driver libraries for containers: the limits files name them (nvml_path,
        cuda_path), so a shim loads and measures with these, never a tenant's copy. Simulated: the mounted
        simulated driver. Else the files this agent loaded, mounted read-only under CONTAINER_DRIVER_DIR."""
        from memslice.limits import DRIVER_SONAMES

        from .gpu.nvml import driver_host_paths
        from .regions import CONTAINER_DRIVER_DIR, CONTAINER_SIM_LIB_DIR

        if simulate:
            paths = {soname: f"{CONTAINER_SIM_LIB_DIR}/{soname}" for soname in DRIVER_SONAMES}
            mounts: tuple[tuple[str, str], ...] = ()
        else:
            host = driver_host_paths()
            paths = {soname: f"{CONTAINER_DRIVER_DIR}/{soname}" for soname in host}
            mounts = tuple((paths[soname], path) for soname, path in sorted(host.items()))
        self.regions.nvml_path = paths.get("libnvidia-ml.so.1")
        self.regions.cuda_path = paths.get("libcuda.so.1")
        return mounts

    def _install_sim_driver(self) -> tuple[Path, Path]:
        """--simulate: put the simulated driver where Allocate mounts it from (beside the state file)."""
        from memslice.paths import lib_dir
        from memslice.simulator import state_path

        from .regions import install_sim_driver

        state = Path(state_path())
        try:
            target = install_sim_driver(lib_dir() / "sim", state)
        except OSError as exc:
            raise StartupError(f"cannot install the simulated driver beside {state}: {exc}") from exc
        log.info("simulated driver installed in %s for containers (node state %s)", target, state)
        return target, state

    def _start_kubernetes(self) -> None:
        assert self.state is not None
        try:
            api, how = load_api_client(self.cfg.kubeconfig)
        except Exception as exc:
            raise StartupError(f"cannot load the Kubernetes configuration: {exc}; fix --kubeconfig/"
                               f"KUBECONFIG or unset it to run standalone") from exc
        if api is None:
            log.warning("standalone: %s. No node inventory is published and preferred allocation uses best "
                        "fit; the scheduler extender cannot place pods on this node", how)
            return
        if not self.cfg.node_name:
            raise StartupError(f"a Kubernetes API is configured ({how}) but the node name is unknown: pass "
                               f"--node-name or set NODE_NAME (downward API fieldRef spec.nodeName)")
        log.info("Kubernetes API: %s; node %s", how, self.cfg.node_name)
        state = self.state
        self.publisher = InventoryPublisher(api, self.cfg.node_name, lambda: inventory_annotations(
            list(state.gpus.values()), state.health.snapshot(), state.unit_mib))
        self.publisher.start()
        self.pod_watcher = PodWatcher(api, self.cfg.node_name, state, self._reconcile_now.set)
        self.pod_watcher.start()
        if self.elastic is not None:  # Events on pods whose elastic memory is swapped out or back
            self.swap_events = SwapEvents(api, self.cfg.node_name, self.elastic.poll, self.cfg.swap_event_interval_s)
            self.swap_events.start()

    def _start_kubernetes_dra(self) -> None:
        try:
            api, how = load_api_client(self.cfg.kubeconfig)
        except Exception as exc:
            raise StartupError(f"cannot load the Kubernetes configuration: {exc}; fix --kubeconfig/"
                               f"KUBECONFIG") from exc
        if api is None:
            raise StartupError(f"--kubelet-api dra needs the Kubernetes API (to publish ResourceSlices and read "
                               f"ResourceClaims), but {how}")
        if not self.cfg.node_name:
            raise StartupError(f"a Kubernetes API is configured ({how}) but the node name is unknown: pass "
                               f"--node-name or set NODE_NAME (downward API fieldRef spec.nodeName)")
        log.info("Kubernetes API: %s; node %s; DRA driver memslice.io", how, self.cfg.node_name)
        self.api = api
        if self.elastic is not None:  # Events on elastic claims whose memory is swapped out or back
            self.swap_events = SwapEvents(api, self.cfg.node_name, self.elastic.poll, self.cfg.swap_event_interval_s)
            self.swap_events.start()

    def _start_http(self) -> None:
        assert self.state is not None
        reader = region_reader()
        fill = host_pid_filler(self.cfg.simulate) if reader is not None else None
        self.metrics.registry.register(NodeCollector(self.state, self.nvml.used_mib, reader,
                                                     lambda rid: str(self.regions.dir_of(rid)),
                                                     lambda d: dir_usage(Path(d)), self.regions.reaper.pending, fill))
        assert self.elastic is not None
        self.metrics.registry.register(ElasticCollector(self.elastic))
        state = self.state

        def ledger() -> dict[str, Allocation]:
            with state.lock:
                return dict(state.ledger)

        self.metrics.registry.register(ComputeCollector(ledger, self.cfg.compute_dir))
        try:
            self.http = HealthServer(self.metrics.registry, self.live, self.ready, self.cfg.metrics_address,
                                     self.cfg.metrics_port)
        except OSError as exc:
            raise StartupError(f"cannot serve metrics on {self.cfg.metrics_address}:{self.cfg.metrics_port}: "
                               f"{exc}; pick another --metrics-port") from exc
        self.http.start()
        log.info("metrics on http://%s:%d/metrics (also /healthz, /readyz)", self.cfg.metrics_address,
                 self.http.port)
        if self.cfg.probe_port is not None:  # the kubelet's probes, where no scraper can starve them
            try:
                self.probes = ProbeServer(self.cfg.metrics_address, self.cfg.probe_port, self.live, self.ready,
                                          "memslice-node-agent")
            except OSError as exc:
                raise StartupError(f"cannot serve probes on {self.cfg.metrics_address}:{self.cfg.probe_port}: "
                                   f"{exc}; pick another --probe-port") from exc
            self.probes.start()
            log.info("probes on http://%s:%d/healthz (also /readyz)", self.cfg.metrics_address, self.probes.port)

    def _health_changed(self) -> None:
        assert self.state is not None
        self.state.bump()
        if self.publisher is not None:
            self.publisher.mark_dirty()
        if self.dra is not None:
            self.dra.slices.mark_dirty()

    def live(self) -> bool:
        now = time.monotonic()
        beats = [self._reconcile_heartbeat]
        if self.registrar is not None:
            beats.append(self.registrar.heartbeat)
        if self.dra is not None:
            return True  # no reconcile loop in DRA mode: the kubelet's Unprepare calls clean up
        stale = max(30.0, 3 * self.cfg.reconcile_interval_s)
        return all(now - b < stale for b in beats)

    def ready(self) -> bool | str:
        if self.dra is not None:
            return self.dra.ready()
        return self.registrar is not None and self.registrar.registered.is_set()

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
        st = self.state
        assert st is not None
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
        uuid_of = {i: g.uuid for i, g in st.gpus.items()}
        grace = max(2 * self.cfg.reconcile_interval_s, 1.0)
        result = reconcile(ledger, live, gone, uid_of, uuid_of, st.unit_mib, time.time(), grace, running)
        for a in result.recovered:
            self.regions.create(a)
            log.info("recovered from the kubelet's record: %d MiB of GPU %d for %s, region %s", a.mib,
                     a.gpu_index, a.owner(), a.region_id)
        for a in result.removed:
            self.regions.remove(a.region_id)
            if a.compute_slot >= 0:  # the slot goes back (on each GPU), the rosters no longer count it
                release_all(self.cfg.compute_dir, a.uuids(), a.compute_slot)
            log.info("removed region %s of %s (%d MiB of GPU %s): the pod is gone", a.region_id, a.owner(),
                     a.mib, ",".join(str(i) for i, _ in a.gpus()))
        updated = []
        with st.lock:
            for a in result.removed:
                if st.ledger.get(a.region_id) == a:
                    del st.ledger[a.region_id]
            for rid, a in result.keep.items():
                before = ledger.get(rid)
                if before is None:
                    st.ledger.setdefault(rid, a)  # recovered
                elif a != before and st.ledger.get(rid) == before:  # owner learnt; not changed meanwhile
                    st.ledger[rid] = a
                    updated.append(a)
            st.gone_uids &= {a.pod_uid for a in st.ledger.values()}
            known = set(st.ledger)
        for a in updated:
            self.regions.save(a)
            log.info("region %s is %s's (learnt from the PodResources API)", a.region_id, a.owner())
        self._remove_orphans(known, grace)

    def _remove_orphans(self, known: set[str], grace: float) -> None:
        now = time.time()
        for rid in self.regions.directories():
            if rid in known:
                continue
            try:
                age = now - self.regions.dir_of(rid).stat().st_mtime
            except FileNotFoundError:
                continue
            if age >= grace:
                self.regions.remove(rid)
                log.info("removed region %s: no allocation holds it", rid)

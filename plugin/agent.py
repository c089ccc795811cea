"""The node agent: wires NVML, health, regions, Kubernetes and metrics, and one kubelet API's mode.

The mode (plugin/deviceplugin/agent.py or plugin/dra/agent.py) is chosen once, at construction; start()
calls its hooks in order (check, new_state, recover, watch or without_api, serve) and never asks which it is.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any, Protocol

from memslice import errors
from memslice.kube.config import load_api_client
from memslice.probe_http import ProbeServer

from .compute_metrics import ComputeCollector
from .config import AgentConfig
from .elastic.events import SwapEvents
from .elastic.metrics import ElasticCollector, ElasticTracker, region_pid_reader
from .gpu.health import HealthBook, XidWatcher
from .gpu.nvml import GpuError, GpuInfo, Nvml
from .metrics import HealthServer, Metrics, NodeCollector, host_pid_filler, region_reader
from .regions import RegionStore, dir_usage, install_shim, prepare_elastic_dir
from .response import ResponseConfig
from .state import NodeState

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


class Mode(Protocol):
    """One kubelet API's part of the agent: the hooks start() calls, in this order, then its lifecycle."""

    needs_api: bool  # False: without a Kubernetes API the mode runs standalone (without_api says so)

    def check(self, gpus: list[GpuInfo]) -> None: ...  # before anything is installed
    def new_state(self, gpus: list[GpuInfo], health: HealthBook) -> NodeState: ...
    def recover(self) -> None: ...  # what a restart left, before the Kubernetes API and serving
    def without_api(self, how: str) -> None: ...  # no Kubernetes API: log, or raise the mode's error
    def watch(self, api: Any) -> None: ...  # the Kubernetes API is there
    def serve(self, rcfg: ResponseConfig) -> None: ...
    def health_changed(self) -> None: ...
    def live(self) -> bool: ...
    def ready(self) -> bool | str: ...
    def stop(self) -> None: ...


def new_mode(cfg: AgentConfig, regions: RegionStore, metrics: Metrics) -> tuple[Mode, type[Exception]]:
    """The mode of cfg.kubelet_api and the error it raises when it cannot start. Only that mode's modules are
    imported: the other's would cost each start 25-35 ms of CPU for nothing."""
    if cfg.kubelet_api == "dra":
        from .dra.agent import DraMode, DraStartError

        return DraMode(cfg, regions, metrics), DraStartError
    from .deviceplugin.agent import DevicePluginMode, DevicePluginStartError

    return DevicePluginMode(cfg, regions, metrics), DevicePluginStartError


class NodeAgent:
    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.metrics = Metrics()
        self.nvml = Nvml(simulate=cfg.simulate)
        self.regions = RegionStore(cfg.region_root, idle_after_s=cfg.idle_after_s)
        self.mode: Mode
        self.mode, self._mode_error = new_mode(cfg, self.regions, self.metrics)
        self.state: NodeState | None = None
        self.http: HealthServer | None = None
        self.probes: ProbeServer | None = None
        self._xid: XidWatcher | None = None
        self._stop = threading.Event()
        self.elastic: ElasticTracker | None = None
        self.swap_events: SwapEvents | None = None

    # --- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> None:
        try:
            self._start()
        except self._mode_error as exc:
            raise StartupError(str(exc)) from exc

    def _start(self) -> None:
        cfg, mode = self.cfg, self.mode
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
        mode.check(gpus)
        self._install_shim()
        sim_lib_dir, sim_state = self._install_sim_driver() if cfg.simulate else (None, None)
        driver_libs = self._driver_libs(cfg.simulate)  # before any limits file is written (recovery included)
        health = HealthBook([g.uuid for g in gpus], cfg.ignored_xids, cfg.health_recovery_s)
        self.state = state = mode.new_state(gpus, health)
        try:
            self.regions.prepare()
        except OSError as exc:
            raise StartupError(f"cannot create --region-root {cfg.region_root}: {exc}") from exc
        self.regions.reaper.start()  # deletes removed regions in the background (and what a restart left)
        try:
            prepare_elastic_dir(cfg.elastic_dir, [g.uuid for g in gpus])
        except OSError as exc:
            raise StartupError(f"cannot create --elastic-dir {cfg.elastic_dir}: {exc}") from exc
        self.elastic = ElasticTracker(cfg.elastic_dir, state.ledger_copy,
                                      region_pid_reader(lambda rid: str(self.regions.dir_of(rid))),
                                      gpus=[g.uuid for g in gpus])
        mode.recover()
        self._start_kubernetes()
        self._xid = XidWatcher(gpus, health, self.nvml.responds, mode.health_changed)
        self._xid.start()
        self._start_http()
        mode.serve(ResponseConfig(shim_host_dir=cfg.shim_host_dir, preload=cfg.preload, visibility=cfg.visibility,
                                  cdi_kind=cfg.cdi_kind, sim_lib_dir=sim_lib_dir, sim_state=sim_state,
                                  elastic_host_dir=cfg.elastic_dir, idle_after_s=cfg.idle_after_s,
                                  driver_libs=driver_libs, compute_host_dir=cfg.compute_dir))

    def stop(self) -> None:
        self._stop.set()
        self.mode.stop()
        for part in (self.swap_events, self._xid, self.http, self.probes, self.regions.reaper):
            if part is not None:
                part.stop()
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
        """The Kubernetes API: the mode watches through it (and Events name pods whose elastic memory is
        swapped out or back), or runs without it where it can."""
        standalone = "" if self.mode.needs_api else " or unset it to run standalone"
        try:
            api, how = load_api_client(self.cfg.kubeconfig)
        except Exception as exc:
            raise StartupError(f"cannot load the Kubernetes configuration: {exc}; fix --kubeconfig/"
                               f"KUBECONFIG{standalone}") from exc
        if api is None:
            self.mode.without_api(how)
            return
        if not self.cfg.node_name:
            raise StartupError(f"a Kubernetes API is configured ({how}) but the node name is unknown: pass "
                               f"--node-name or set NODE_NAME (downward API fieldRef spec.nodeName)")
        log.info("Kubernetes API: %s; node %s", how, self.cfg.node_name)
        self.mode.watch(api)
        if self.elastic is not None:
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
        self.metrics.registry.register(ComputeCollector(self.state.ledger_copy, self.cfg.compute_dir))
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

    def live(self) -> bool:
        return self.mode.live()

    def ready(self) -> bool | str:
        return self.mode.ready()

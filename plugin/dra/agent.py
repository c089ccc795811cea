"""DRA mode of the node agent (`--kubelet-api dra`): assembles the parts and owns their lifecycle.

Order matters: the checkpoint is recovered (regions and CDI specs of prepared claims back, leftovers removed
unless a live process uses them) before the DRA socket serves; the DRA socket serves before the registration
socket appears (the kubelet dials the endpoint as soon as it reads GetInfo); the ResourceSlice is published (and
watched) in the background.

With --pod-uid (rolling updates) the sockets carry the pod UID and every call takes the flock
`<plugin dir>/serialize.lock`, so the old and the new instance serve side by side during a DaemonSet update
with maxSurge: 1; a cleanly stopping instance removes its own sockets and never deletes the slice.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import Any

from memslice import errors

from ..config import AgentConfig
from ..gpu.health import HealthBook
from ..gpu.nvml import GpuInfo
from ..metrics import Metrics
from ..regions import RegionStore
from ..response import ResponseConfig
from ..state import NodeState
from .cdi import CdiSpecs
from .checkpoint import Checkpoint, CheckpointError
from .kube import DraApi, KubeError
from .prepare import DRIVER, ClaimError
from .registration import RegistrationServer, RegistrationService
from .server import (
    LOCK_FILE,
    SERVICES,
    DraDriver,
    DraMetrics,
    DraServer,
    api_claim_reader,
    api_pod_reader,
    socket_name,
)
from .slices import Pci, SlicePublisher, capacities, pci_bus_id, pcie_root

log = logging.getLogger(__name__)

CHECKPOINT_NAME = "checkpoint.json"


class DraStartError(errors.UnavailableError):
    """DRA mode cannot start; the message names the path or value and the fix."""


def nvml_driver_version() -> str | None:
    """The NVIDIA driver version NVML reports (published as the driverVersion attribute), if any."""
    import pynvml

    try:
        v = pynvml.nvmlSystemGetDriverVersion()
    except pynvml.NVMLError as exc:
        log.warning("NVML does not report the driver version (%s): driverVersion is not published", exc)
        return None
    return v.decode() if isinstance(v, bytes) else str(v)


def nvml_pci(uuids: list[str]) -> dict[str, Pci]:
    """Each GPU's PCI address (NVML) and PCIe root (sysfs), for the standard attributes; what NVML cannot say
    is left out (logged)."""
    import pynvml

    out = {}
    for uuid in uuids:
        try:
            info = pynvml.nvmlDeviceGetPciInfo(pynvml.nvmlDeviceGetHandleByUUID(uuid))
            raw = info.busId.decode() if isinstance(info.busId, bytes) else str(info.busId)
        except pynvml.NVMLError as exc:
            log.warning("NVML does not report the PCI address of %s (%s): pciBusID is not published", uuid, exc)
            continue
        bdf = pci_bus_id(raw)
        if bdf is None:
            log.warning("NVML reports PCI address %r for %s: not a PCI address, not published", raw, uuid)
            continue
        out[uuid] = Pci(bdf, pcie_root(bdf))
    return out


def gate_event(node: str, node_uid: str | None, message: str) -> dict[str, Any]:
    """A Warning Event on the Node saying which feature gate to turn on (pure)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    involved = {"apiVersion": "v1", "kind": "Node", "name": node, **({"uid": node_uid} if node_uid else {})}
    return {"apiVersion": "v1", "kind": "Event", "metadata": {"generateName": "memslice-dra-", "namespace": "default"},
            "involvedObject": involved, "reason": "DRAConsumableCapacityOff", "message": message[:1024],
            "type": "Warning", "count": 1, "firstTimestamp": now, "lastTimestamp": now,
            "source": {"component": "memslice-node-agent", "host": node},
            "reportingComponent": "memslice.io/node-agent", "reportingInstance": node}


@dataclass
class DraParts:
    driver: DraDriver
    server: DraServer
    registration: RegistrationServer
    slices: SlicePublisher

    def ready(self) -> bool | str:
        """True, or why not: a feature gate that is off is said here, on /readyz."""
        if self.slices.problem:
            return self.slices.problem
        return self.registration.service.registered.is_set() and self.slices.published.is_set()

    def stop(self) -> None:
        self.registration.stop()  # the kubelet stops calling before the DRA socket closes
        self.server.stop()
        self.slices.stop()


def start_dra(cfg: AgentConfig, state: NodeState, regions: RegionStore, rcfg: ResponseConfig, api: Any,
              metrics: Metrics) -> DraParts:
    node = cfg.node_name
    if cfg.pod_uid and not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,63}", cfg.pod_uid):
        raise DraStartError(f"--pod-uid={cfg.pod_uid[:80]!r} is not a pod UID: set MEMSLICE_POD_UID from the downward "
                            f"API (fieldRef metadata.uid), or leave it empty for fixed socket names")
    plugin_dir = cfg.kubelet_plugins_dir / DRIVER
    specs = CdiSpecs(cfg.cdi_dir)
    try:
        plugin_dir.mkdir(parents=True, exist_ok=True)
        specs.prepare()
    except OSError as exc:
        raise DraStartError(f"cannot create {plugin_dir} or --cdi-dir {cfg.cdi_dir}: {exc}; mount "
                            f"--kubelet-plugins-dir and --cdi-dir read-write from the host") from exc
    kube = DraApi(api)
    gpus = list(state.gpus.values())
    caps = capacities(gpus)
    dra_metrics = DraMetrics(metrics.registry)
    driver = DraDriver(state, regions, specs, Checkpoint(plugin_dir / CHECKPOINT_NAME), rcfg,
                       api_claim_reader(kube), pool=node, capacity_mib=lambda: caps,
                       lock_file=plugin_dir / LOCK_FILE if cfg.pod_uid else None, read_pod=api_pod_reader(kube),
                       post_event=kube.claim_event, node=node, write_status=kube.patch_claim_status,
                       metrics=dra_metrics)
    try:
        driver.recover()
    except (CheckpointError, ClaimError) as exc:  # ClaimError: serialize.lock held by the other instance too long
        raise DraStartError(str(exc)) from exc
    except OSError as exc:
        raise DraStartError(f"cannot restore the prepared claims' regions or CDI specs: {exc}") from exc

    def node_uid() -> str | None:
        try:
            return kube.node_uid(node)
        except (KubeError, OSError) as exc:
            log.warning("cannot read node %s (%s): the ResourceSlice gets no owner reference", node, exc)
            return None

    def said(problem: str) -> None:  # once per agent start, from the publisher's thread
        try:
            kube.node_event(gate_event(node, node_uid(), problem))
        except (KubeError, OSError) as exc:
            log.warning("cannot post the Event about the feature gate on node %s: %s", node, exc)

    slices = SlicePublisher(kube, node, lambda: gpus, state.health.snapshot, nvml_driver_version(), node_uid,
                            pci=nvml_pci([g.uuid for g in gpus]), on_problem=said, instance=cfg.pod_uid)
    slices.start()
    server = DraServer(plugin_dir / socket_name(cfg.pod_uid), driver, cfg.grpc_workers, dra_metrics)
    try:
        server.start()
    except OSError as exc:
        slices.stop()
        raise DraStartError(str(exc)) from exc
    def on_status(registered: bool) -> None:
        metrics.registered.set(1 if registered else 0)  # the device-plugin mode's metrics, same meaning
        (metrics.registrations if registered else metrics.registration_errors).inc()
        if registered:
            # A starting kubelet deletes every ResourceSlice of its node, then registers the drivers again:
            # publish at once rather than at the next resync.
            slices.mark_dirty(probe=True)

    registration = RegistrationServer(cfg.plugins_registry_dir,
                                      RegistrationService(DRIVER, server.socket_path, SERVICES, on_status),
                                      pod_uid=cfg.pod_uid)
    try:
        registration.start()
    except OSError as exc:
        server.stop()
        slices.stop()
        raise DraStartError(str(exc)) from exc
    log.info("DRA driver %s: serving %s on %s, registration socket %s", DRIVER, ", ".join(SERVICES),
             server.socket_path, registration.socket)
    return DraParts(driver, server, registration, slices)


class DraMode:
    """The hooks NodeAgent.start calls in DRA mode (plugin/deviceplugin/agent.py DevicePluginMode is the other)."""

    needs_api = True  # ResourceSlices are published and ResourceClaims read through it

    def __init__(self, cfg: AgentConfig, regions: RegionStore, metrics: Metrics) -> None:
        self.cfg = cfg
        self.regions = regions
        self.metrics = metrics
        self.state: NodeState | None = None
        self.api: Any = None
        self.parts: DraParts | None = None

    def check(self, gpus: list[GpuInfo]) -> None:
        """Nothing to check before installing: a ResourceSlice has no size limit memslice can reach."""

    def new_state(self, gpus: list[GpuInfo], health: HealthBook) -> NodeState:
        self.state = NodeState(gpus, self.cfg.unit_mib, health)
        return self.state

    def recover(self) -> None:
        """Nothing yet: the checkpoint is recovered in serve(), before the DRA socket serves."""

    def without_api(self, how: str) -> None:
        raise DraStartError(f"--kubelet-api dra needs the Kubernetes API (to publish ResourceSlices and read "
                            f"ResourceClaims), but {how}")

    def watch(self, api: Any) -> None:
        self.api = api

    def serve(self, rcfg: ResponseConfig) -> None:
        assert self.state is not None, "new_state() comes first"
        self.parts = start_dra(self.cfg, self.state, self.regions, rcfg, self.api, self.metrics)

    def health_changed(self) -> None:
        if self.parts is not None:
            self.parts.slices.mark_dirty()

    def live(self) -> bool:
        return True  # no reconcile loop in DRA mode: the kubelet's Unprepare calls clean up

    def ready(self) -> bool | str:
        return self.parts.ready() if self.parts is not None else False

    def stop(self) -> None:
        if self.parts is not None:
            self.parts.stop()

"""A kubelet stand-in for DRA drivers: the plugin watcher and the DRA plugin manager over real gRPC.

What the kubelet does (pkg/kubelet/pluginmanager, pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go):

- watches the plugins_registry directory for sockets (here: polled every 50 ms); for a new one calls
  `pluginregistration.Registration/GetInfo`, checks the type ("DRAPlugin"), picks the first of the plugin's
  `supported_versions` that it supports itself (kubelet 1.34-1.37: "v1.DRAPlugin", "v1beta1.DRAPlugin"),
  refuses an endpoint already registered for the driver, and answers `NotifyRegistrationStatus`;
- calls `NodePrepareResources` / `NodeUnprepareResources` on the registered endpoint through the chosen
  service, with the claims by reference (namespace, name, uid), 45 s timeout;
- a registration that fails (socket not answering yet: a stale file of a killed plugin) is retried, as the
  plugin manager's reconciler retries what is in its desired state (here: at the next poll, 50 ms);
- several plugins may be registered for one driver (a rolling update: each instance has its own sockets);
  calls go to the most recently registered one (DRAPluginManager.get: the newest, preferring connected
  ones); a socket that disappears deregisters that plugin only; when the last plugin of a driver is gone,
  the driver's ResourceSlices are wiped after `wipe_delay_s` (the kubelet's 30 s), unless a plugin of the
  driver registers again before (pendingWipes);
- `restart()`: the kubelet goes away and comes back; registrations are rebuilt from the sockets present.
  Given the API stand-in and the node name, a (re)starting kubelet first deletes every ResourceSlice of its
  node, as DRAPluginManager does at start-up ("better to not advertise any local resources" until the
  drivers are back).

`services` picks what this kubelet supports (e.g. only v1beta1, an older kubelet).

`container_cdi_ids()` is what the kubelet hands the runtime for one container's `resources.claims[]` entry
(pkg/kubelet/cm/dra/claiminfo.go cdiDevicesAsList): the CDI IDs of every Device whose request_names contain
the container's `request` exactly (or all, when the container names no request or the Device lists none).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from memslice.proto import (
    dra_health_v1_pb2,
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    dra_health_v1beta1_pb2,
    dra_health_v1beta1_pb2_grpc,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)

KUBELET_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")  # servicesSupportedByKubelet, newest first
_MODULES = {"v1.DRAPlugin": (dra_v1_pb2, dra_v1_pb2_grpc), "v1beta1.DRAPlugin": (dra_v1beta1_pb2,
                                                                                  dra_v1beta1_pb2_grpc)}
CALL_TIMEOUT_S = 45.0  # defaultClientCallTimeout


# healthServicesSupportedByKubelet, newest first (a kubelet of 1.34 knows only v1alpha1)
HEALTH_SERVICES = ("v1.DRAResourceHealth", "v1beta1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
HEALTH_MODULES = {"v1.DRAResourceHealth": (dra_health_v1_pb2, dra_health_v1_pb2_grpc),
                  "v1beta1.DRAResourceHealth": (dra_health_v1beta1_pb2, dra_health_v1beta1_pb2_grpc),
                  "v1alpha1.DRAResourceHealth": (dra_health_v1alpha1_pb2, dra_health_v1alpha1_pb2_grpc)}


@dataclass
class Registered:
    driver: str
    endpoint: str
    service: str
    socket: Path
    health: str = ""  # the health service chosen from supported_versions (pickHealthService), "" if none
    advertised: tuple[str, ...] = ()  # GetInfo's supported_versions


def container_cdi_ids(entry: Any, request: str = "") -> list[str]:
    """The CDI device IDs the kubelet gives a container that names this claim (and `request`, if any)."""
    out: list[str] = []
    for d in entry.devices:
        if not request or not d.request_names or request in d.request_names:
            out.extend(d.cdi_device_ids)  # no de-duplication, as in the kubelet
    return out


class KubeletDraStandin:
    def __init__(self, registry_dir: Path, services: tuple[str, ...] = KUBELET_SERVICES, kube: Any = None,
                 node: str = "", wipe_delay_s: float = 30.0) -> None:
        self.registry_dir = registry_dir
        self.kube, self.node = kube, node
        self.services = services
        self.wipe_delay_s = wipe_delay_s
        self.plugins: dict[str, list[Registered]] = {}  # driver -> plugins, in registration order
        self.pending_wipes: dict[str, threading.Timer] = {}
        self.wiped: list[str] = []  # drivers whose slices were wiped
        self.refusals: list[str] = []
        self.cond = threading.Condition()
        self._seen: dict[Path, tuple[int, int]] = {}  # socket -> (inode, ctime) handled
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def registered(self) -> dict[str, Registered]:
        """The plugin each driver's calls go to (the newest)."""
        with self.cond:
            return {d: p[-1] for d, p in self.plugins.items() if p}

    def start(self) -> KubeletDraStandin:
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        if self.kube is not None:  # wipeResourceSlices("" = all drivers) at kubelet start
            for sl in self.kube.list("ResourceSlice"):
                if sl["spec"].get("nodeName") == self.node:
                    self.kube.delete("ResourceSlice", None, sl["metadata"]["name"])
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="kubelet-dra", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        with self.cond:
            for t in self.pending_wipes.values():
                t.cancel()
            self.pending_wipes.clear()

    def restart(self) -> None:
        """The kubelet process restarts: registrations are gone, then rebuilt from the registry directory."""
        self.stop()
        with self.cond:
            self.plugins.clear()
            self._seen.clear()
        self.start()

    # --- plugin watcher ----------------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stop.wait(0.05):
            present = {}
            for p in self.registry_dir.glob("*.sock"):
                try:
                    st = p.stat()
                    present[p] = (st.st_ino, st.st_ctime_ns)
                except FileNotFoundError:
                    continue
            for p, ino in present.items():
                if self._seen.get(p) != ino:
                    self._seen[p] = ino
                    if not self._register(p):
                        del self._seen[p]  # retried at the next poll
            for p in list(self._seen):
                if p not in present:
                    del self._seen[p]
                    with self.cond:
                        for name, plugins in self.plugins.items():
                            plugins[:] = [r for r in plugins if r.socket != p]
                            if not plugins and name not in self.pending_wipes:
                                self._schedule_wipe(name)
                        self.cond.notify_all()

    def _register(self, sock: Path) -> bool:
        """GetInfo + NotifyRegistrationStatus; False when the socket did not answer (to be retried)."""
        try:
            with grpc.insecure_channel(f"unix:{sock}") as ch:
                stub = pluginregistration_pb2_grpc.RegistrationStub(ch)
                info = stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=10)
                error = ""
                chosen = next((s for s in info.supported_versions if s in self.services), None)
                if info.type != "DRAPlugin":
                    error = f"plugin type {info.type!r} is not DRAPlugin"
                elif chosen is None:
                    error = (f"none of services supported by the plugin ({list(info.supported_versions)}) are "
                             f"supported by the kubelet ({list(self.services)})")
                elif any(r.endpoint == info.endpoint and r.socket != sock
                         for r in self.plugins.get(info.name, [])):
                    error = f"endpoint {info.endpoint} already registered for DRA driver plugin {info.name}"
                stub.NotifyRegistrationStatus(pluginregistration_pb2.RegistrationStatus(
                    plugin_registered=not error, error=error), timeout=10)
        except grpc.RpcError as exc:
            with self.cond:
                self.refusals[:] = [*self.refusals[-20:], f"{sock}: {exc.code().name} {exc.details()}"]
                self.cond.notify_all()
            return False
        with self.cond:
            if error:
                self.refusals.append(error)
            else:
                assert chosen is not None
                plugins = self.plugins.setdefault(info.name, [])
                plugins[:] = [r for r in plugins if r.socket != sock]
                health = next((h for h in HEALTH_SERVICES if h in info.supported_versions), "")
                plugins.append(Registered(info.name, info.endpoint, chosen, sock, health,
                                          tuple(info.supported_versions)))
                wipe = self.pending_wipes.pop(info.name, None)
                if wipe is not None:
                    wipe.cancel()  # usable again: the driver's slices stay
            self.cond.notify_all()
        return True

    def _schedule_wipe(self, driver: str) -> None:
        """Caller holds cond. After wipe_delay_s: delete the node's slices of `driver` (DeleteCollection by
        field selector spec.nodeName, spec.driver)."""
        if self.kube is None:
            return

        def wipe() -> None:
            with self.cond:
                if self.pending_wipes.get(driver) is not timer:
                    return
                del self.pending_wipes[driver]
                self.wiped.append(driver)
            for sl in self.kube.list("ResourceSlice"):
                if sl["spec"].get("nodeName") == self.node and sl["spec"].get("driver") == driver:
                    self.kube.delete("ResourceSlice", None, sl["metadata"]["name"])

        timer = threading.Timer(self.wipe_delay_s, wipe)
        timer.daemon = True
        self.pending_wipes[driver] = timer
        timer.start()

    def wait_registered(self, driver: str, timeout: float = 20.0, endpoint: str | None = None) -> Registered:
        """The driver's newest plugin (the one at `endpoint`, if given), once registered."""
        deadline = time.monotonic() + timeout

        def find() -> Registered | None:
            plugins = self.plugins.get(driver) or []
            if endpoint is None:
                return plugins[-1] if plugins else None
            return next((r for r in plugins if r.endpoint == endpoint), None)

        with self.cond:
            while (found := find()) is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"DRA driver {driver} did not register within {timeout} s "
                                         f"(refusals: {self.refusals})")
                self.cond.wait(left)
            return found

    # --- DRA calls ---------------------------------------------------------------------------------------
    def _call(self, driver: str, method: str, claims: list[dict[str, Any]], endpoint: str | None = None) -> Any:
        r = self.wait_registered(driver, 5, endpoint)
        pb, pb_grpc = _MODULES[r.service]
        req_type = getattr(pb, f"{method}Request")
        req = req_type(claims=[pb.Claim(namespace=c["metadata"]["namespace"], name=c["metadata"]["name"],
                                        uid=c["metadata"]["uid"]) for c in claims])
        with grpc.insecure_channel(f"unix:{r.endpoint}") as ch:
            return getattr(pb_grpc.DRAPluginStub(ch), method)(req, timeout=CALL_TIMEOUT_S)

    def prepare(self, driver: str, *claims: dict[str, Any], endpoint: str | None = None) -> Any:
        """NodePrepareResources for these claims (API objects with metadata namespace/name/uid), through the
        driver's newest plugin or the one at `endpoint`."""
        return self._call(driver, "NodePrepareResources", list(claims), endpoint)

    def unprepare(self, driver: str, *claims: dict[str, Any], endpoint: str | None = None) -> Any:
        return self._call(driver, "NodeUnprepareResources", list(claims), endpoint)

    def health_stream(self, driver: str, timeout: float, service: str = "v1alpha1.DRAResourceHealth"
                      ) -> tuple[grpc.Channel, Any]:
        """`service`/NodeWatchResources on the driver's newest plugin, as a kubelet with the ResourceHealthStatus
        gate opens it: (channel, the stream, which ends after `timeout` s). The driver must advertise `service`.
        Close the channel when done."""
        r = self.wait_registered(driver, 5)
        assert service in r.advertised, f"{driver} does not advertise {service} ({r.advertised})"
        pb, pb_grpc = HEALTH_MODULES[service]
        ch = grpc.insecure_channel(f"unix:{r.endpoint}")
        stub = pb_grpc.DRAResourceHealthStub(ch)
        return ch, stub.NodeWatchResources(pb.NodeWatchResourcesRequest(), timeout=timeout)

"""DRA: registration with the kubelet's plugin watcher.

The agent serves the `pluginregistration.Registration` service on `<--plugins-registry-dir>/memslice.io-reg.sock`.
The kubelet finds the socket (at start-up and whenever it appears), calls GetInfo (type "DRAPlugin", the driver
name, the DRA socket's absolute path, the DRA gRPC services served there, newest first), dials that endpoint
and answers NotifyRegistrationStatus. A restarted kubelet rescans the directory, so nothing is needed on the
agent's side then; if the socket file disappears (directory wiped), the server is started again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent import futures
from pathlib import Path

import grpc

from memslice.proto import pluginregistration_pb2, pluginregistration_pb2_grpc

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"


def registration_socket_name(driver: str, pod_uid: str = "") -> str:
    """`<driver>-reg.sock`; with rolling updates `<driver>-<pod uid>-reg.sock` (the kubeletplugin helper's
    names), so that the old and the new instance are registered side by side."""
    return f"{driver}-{pod_uid}-reg.sock" if pod_uid else f"{driver}-reg.sock"


class RegistrationService(pluginregistration_pb2_grpc.RegistrationServicer):
    def __init__(self, driver: str, endpoint: Path, services: Sequence[str],
                 on_status: Callable[[bool], None] | None = None) -> None:
        self.on_status = on_status  # told every status the kubelet reports (metrics)
        self.info = pluginregistration_pb2.PluginInfo(type=PLUGIN_TYPE, name=driver, endpoint=str(endpoint),
                                                      supported_versions=list(services))
        self.registered = threading.Event()
        self.last_error = ""

    def GetInfo(self, request: pluginregistration_pb2.InfoRequest, context: grpc.ServicerContext  # noqa: N802
                ) -> pluginregistration_pb2.PluginInfo:
        return self.info

    def NotifyRegistrationStatus(self, request: pluginregistration_pb2.RegistrationStatus,  # noqa: N802
                                 context: grpc.ServicerContext
                                 ) -> pluginregistration_pb2.RegistrationStatusResponse:
        if request.plugin_registered:
            if not self.registered.is_set():
                log.info("registered with the kubelet as DRA driver %s (services %s)", self.info.name,
                         ", ".join(self.info.supported_versions))
            self.last_error = ""
            self.registered.set()
            if self.on_status is not None:
                self.on_status(True)
        else:
            self.registered.clear()
            self.last_error = request.error[:1000]
            log.error("the kubelet refused DRA driver %s: %s (this kubelet needs one of the DRA services %s: "
                      "Kubernetes >= 1.32, DynamicResourceAllocation enabled)", self.info.name, self.last_error,
                      ", ".join(self.info.supported_versions))
            if self.on_status is not None:
                self.on_status(False)
        return pluginregistration_pb2.RegistrationStatusResponse()


class RegistrationServer:
    """Serves RegistrationService on the registry socket; restarts it when the socket file goes away."""

    def __init__(self, registry_dir: Path, service: RegistrationService, poll_s: float = 0.5,
                 pod_uid: str = "") -> None:
        self.socket = registry_dir / registration_socket_name(service.info.name, pod_uid)
        self.service = service
        self.poll_s = poll_s
        self._server: grpc.Server | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="dra-registration", daemon=True)

    def start(self) -> None:
        self._serve()
        self._thread.start()

    def _serve(self) -> None:
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        if self.socket.exists() or self.socket.is_symlink():
            self.socket.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="dra-reg"),
                             options=[("grpc.so_reuseport", 0)])
        pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(self.service, server)
        if server.add_insecure_port(f"unix:{self.socket}") == 0:
            raise OSError(f"cannot listen on {self.socket}: is --plugins-registry-dir writable?")
        server.start()
        self._server = server

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            if self.socket.exists():
                continue
            log.warning("registration socket %s disappeared: serving it again", self.socket)
            self.service.registered.clear()
            old, self._server = self._server, None
            if old is not None:
                old.stop(grace=0)
            try:
                self._serve()
            except OSError as exc:
                log.error("%s; retrying", exc)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if self._server is not None:
            self._server.stop(grace=0).wait(5)
            self._server = None
        # the kubelet deregisters the plugin when its registration socket goes away
        self.socket.unlink(missing_ok=True)

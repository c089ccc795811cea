"""Registration with the kubelet, and re-registration whenever the kubelet restarts.

The kubelet dials the plugin back inside Register, so the plugin's server must already be serving (with free
workers) when Register is called. A kubelet restart recreates kubelet.sock and deletes plugin sockets; both
signs are checked every `poll_s` (two stat calls; no inotify dependency needed for a sub-second reaction).
On either, the agent replaces its gRPC server (which also severs a stale ListAndWatch stream, see the
kubelet's same-socket re-registration trap) and registers again, retrying with backoff.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from memslice.proto import api_pb2, api_pb2_grpc

from ..metrics import Metrics
from .allocator import RESOURCE_NAME
from .server import PluginServer

log = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"
PLUGIN_SOCKET = "memslice-gpu-mem.sock"
API_VERSION = "v1beta1"


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_ctime_ns


COMPUTE_SOCKET = "memslice-gpu-compute.sock"  # the second plugin: memslice.io/gpu-compute


def register(kubelet_socket: Path, endpoint: str, timeout_s: float = 15.0, resource: str = RESOURCE_NAME,
             preferred: bool = True) -> None:
    """One Register call; raises grpc.RpcError with the kubelet's reason on refusal."""
    with grpc.insecure_channel(f"unix:{kubelet_socket}") as channel:
        api_pb2_grpc.RegistrationStub(channel).Register(api_pb2.RegisterRequest(
            version=API_VERSION, endpoint=endpoint, resource_name=resource,
            options=api_pb2.DevicePluginOptions(pre_start_required=False,
                                                get_preferred_allocation_available=preferred)),
            timeout=timeout_s)


class Registrar:
    """Background loop that keeps one registered server per kubelet instance."""

    def __init__(self, plugin_dir: Path, make_server: Callable[[Path], PluginServer], metrics: Metrics,
                 poll_s: float = 0.1, socket_name: str = PLUGIN_SOCKET, resource: str = RESOURCE_NAME,
                 preferred: bool = True, counted: bool = True) -> None:
        self.plugin_dir = plugin_dir
        self.kubelet_socket = plugin_dir / KUBELET_SOCKET
        self.socket = plugin_dir / socket_name
        self.resource, self.preferred = resource, preferred
        self.counted = counted  # the registration metrics are the memory resource's (the compute one: logs only)
        self.make_server = make_server
        self.metrics = metrics
        self.poll_s = poll_s
        self.registered = threading.Event()
        self.heartbeat = time.monotonic()  # the loop's last turn (liveness)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"registrar-{socket_name}", daemon=True)
        self._server: PluginServer | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        if self._server is not None:
            self._server.stop()
            self._server = None
        self.socket.unlink(missing_ok=True)

    def _run(self) -> None:
        kubelet_id: tuple[int, int] | None = None  # the kubelet.sock we registered with
        backoff, next_try, waiting_logged, failures = 0.1, 0.0, False, 0
        while not self._stop.is_set():
            self.heartbeat = time.monotonic()
            current = _identity(self.kubelet_socket)
            ours_present = self.socket.exists()
            if self.registered.is_set() and (current != kubelet_id or not ours_present):
                if current is None:
                    why = "kubelet.sock is gone"
                elif current != kubelet_id:
                    why = "kubelet.sock was recreated (kubelet restart)"
                else:
                    why = f"{self.socket} was deleted (kubelet restart)"
                log.warning("%s: registering again", why)
                self.registered.clear()
                self._count(self.metrics.registered.set, 0)
                backoff, next_try = 0.1, 0.0
            if not self.registered.is_set():
                if current is None:
                    if not waiting_logged:
                        log.info("waiting for the kubelet: %s does not exist yet", self.kubelet_socket)
                        waiting_logged = True
                elif time.monotonic() >= next_try:
                    waiting_logged = False
                    try:
                        self._serve_and_register()
                        kubelet_id = current
                        self.registered.set()
                        self._count(self.metrics.registered.set, 1)
                        self._count(self.metrics.registrations.inc)
                        failures = 0
                        log.info("registered %s with the kubelet (%s, endpoint %s)", self.resource,
                                 self.kubelet_socket, self.socket.name)
                    except (grpc.RpcError, OSError) as exc:
                        failures += 1
                        self._count(self.metrics.registration_errors.inc)
                        detail = exc.details() if isinstance(exc, grpc.RpcError) else str(exc)
                        (log.error if failures in (1, 10) or failures % 100 == 0 else log.debug)(
                            "registering with the kubelet at %s failed (attempt %d): %s; retrying in %.1fs",
                            self.kubelet_socket, failures, detail, backoff)
                        next_try = time.monotonic() + backoff
                        backoff = min(backoff * 2, 5.0)
            self._stop.wait(self.poll_s)

    def _count(self, update: Callable[..., None], *args: int) -> None:
        if self.counted:
            update(*args)

    def _serve_and_register(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        server = self.make_server(self.socket)
        server.start()
        self._server = server
        register(self.kubelet_socket, self.socket.name, resource=self.resource, preferred=self.preferred)

"""The extender as one object: state + informers + binder + HTTP server. Used by the CLI and the tests."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memslice.scheduler_extender.binder import Binder
from memslice.scheduler_extender.metrics import Metrics
from memslice.scheduler_extender.podwrites import PodWriter
from memslice.scheduler_extender.server import ExtenderHTTPServer, tls_context
from memslice.scheduler_extender.state import ClusterState, pod_entry, resource_version
from memslice.scheduler_extender.verbs import Verbs

from memslice.kube.informer import Informer

log = logging.getLogger(__name__)

# Pods that finished release their memory: with this selector the API server turns "became Succeeded or
# Failed" into a DELETED event for the watch.
POD_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"


@dataclass(frozen=True)
class Config:
    address: str = "0.0.0.0"
    port: int = 8888
    policy: str = "binpack"
    assume_ttl: float = 120.0
    max_body_bytes: int = 16 << 20
    watch_timeout: int = 300
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_client_ca_file: str | None = None


class Extender:
    def __init__(self, api_client: Any, config: Config, clock: Callable[[], float] = time.time) -> None:
        from kubernetes import client

        self.config = config
        self.core = client.CoreV1Api(api_client)
        self.state = ClusterState(assume_ttl=config.assume_ttl, clock=clock)
        self.metrics = Metrics(self.state)
        self.writer = PodWriter(api_client)
        self.binder = Binder(self.core, self.writer, self.state, config.policy, clock)
        self.verbs = Verbs(self.state, self.binder, config.policy, self.metrics)
        self._stop = threading.Event()
        restart = self.metrics.watch_restarts

        def on_restart(kind: str, reason: str) -> None:
            restart.labels(kind, reason).inc()

        self.informers = [
            Informer("nodes", self.core.list_node,
                     on_replace=self.state.replace_nodes,
                     on_upsert=self.state.upsert_node,
                     on_delete=lambda obj: self.state.delete_node(
                         (obj.get("metadata") or {}).get("name", ""),
                         resource_version(obj.get("metadata") or {})),
                     synced=self.state.nodes_synced, stop=self._stop, watch_timeout=config.watch_timeout,
                     on_restart=on_restart),
            Informer("pods", self.core.list_pod_for_all_namespaces, on_replace=self.state.replace_pods,
                     on_upsert=self.state.upsert_pod, on_delete=self.state.delete_pod,
                     synced=self.state.pods_synced, stop=self._stop, field_selector=POD_SELECTOR,
                     watch_timeout=config.watch_timeout, on_restart=on_restart, convert=pod_entry),
        ]
        tls = None
        if config.tls_cert_file or config.tls_key_file:
            if not (config.tls_cert_file and config.tls_key_file):
                raise ValueError("TLS needs both --tls-cert-file and --tls-key-file")
            tls = tls_context(config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file)
        self.httpd = ExtenderHTTPServer((config.address, config.port), self.verbs, self.metrics,
                                        lambda: self.state.synced, config.max_body_bytes, tls)
        self._serve: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def url(self) -> str:
        scheme = "https" if self.httpd.tls else "http"
        host = self.config.address if self.config.address not in ("0.0.0.0", "") else "127.0.0.1"
        return f"{scheme}://{host}:{self.port}"

    def start(self) -> Extender:
        for inf in self.informers:
            inf.start()
        self._serve = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                       name="extender-http", daemon=True)
        self._serve.start()
        log.info("memslice extender listening on %s (policy %s)", self.url, self.config.policy)
        return self

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        return (self.state.nodes_synced.wait(timeout)
                and self.state.pods_synced.wait(max(deadline - time.monotonic(), 0)))

    def stop(self) -> None:
        self._stop.set()
        for inf in self.informers:
            inf.stop()
        if self._serve is not None:  # shutdown() waits for serve_forever(), which only start() runs
            self.httpd.shutdown()
            self._serve = None
        self.httpd.close_connections()
        self.httpd.server_close()
        self.writer.close()
        for inf in self.informers:
            inf.join(5)

    def __enter__(self) -> Extender:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

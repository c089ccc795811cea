"""The extender as one object: state + informers + binder + HTTP server. Used by the CLI and the tests."""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from memslice.kube.informer import Informer
from memslice.lean_http import ConnLimits
from memslice.probe_http import ProbeServer

from .edge.metrics import Metrics
from .edge.server import VERBS_LIMITS, ExtenderHTTPServer, tls_context
from .edge.verbs import Verbs
from .kubeio.binder import DEFAULT_SCHEDULER_NAMES, Binder, ServedPods
from .kubeio.kubereads import CoreReads, node_pod_priorities
from .kubeio.podwrites import PodWriter
from .placement.state import ClusterState, pod_entry, resource_version

log = logging.getLogger(__name__)

# Pods that finished release their memory: with this selector the API server turns "became Succeeded or
# Failed" into a DELETED event for the watch.
POD_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"


def is_loopback(address: str) -> bool:
    """Whether `address` is a loopback address (127.0.0.0/8, ::1, or the name localhost); False for anything
    else, names included (what a name resolves to can change)."""
    try:
        return address == "localhost" or ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def verbs_limits(address: str, tls: bool) -> ConnLimits:
    """The verbs port's connection caps. Why: served in plain HTTP on loopback (deploy/base: the scheduler's
    pod), every client is that pod's kube-scheduler, one peer whose parallel binds may all be in flight at once
    (it dials a connection for each request beyond its 2 idle ones), so a per-peer cap below the port's only
    refuses the scheduler's own binds (seen at 64 in flight under load: bench_real_scheduler.py). Elsewhere
    the per-peer cap keeps one host from holding the whole port."""
    if tls or not is_loopback(address):
        return VERBS_LIMITS
    return dataclasses.replace(VERBS_LIMITS, per_peer=VERBS_LIMITS.max_connections)


FILTER_ANSWERS = ("best", "all")  # Config.filter_answers


@dataclass(frozen=True)
class Config:
    address: str = "0.0.0.0"  # the verbs port's (the CLI allows plain HTTP only on loopback: cli.plain_http_refusal)
    health_address: str | None = None  # --health-port's and --probe-port's (None: `address`)
    port: int = 8888
    policy: str = "binpack"
    assume_ttl: float = 120.0
    max_body_bytes: int = 8 << 20
    watch_timeout: int = 300
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_client_ca_file: str | None = None
    scheduler_names: tuple[str, ...] = DEFAULT_SCHEDULER_NAMES  # /bind serves pods of these schedulers only
    health_port: int | None = None  # plain-HTTP /healthz /readyz /metrics only (None: none)
    probe_port: int | None = None  # plain-HTTP /healthz /readyz alone, for the kubelet (None: none)
    max_limit_ratio: Fraction | None = None  # cap on a GPU's sum of limits, × its memory (None: no cap)
    # filter passes "best": only the fitting nodes of the highest score (no prioritizeVerb needed: deploy/base),
    # or "all": every fitting node (scored by the prioritize verb, which the scheduler must then call)
    filter_answers: str = "best"


class Extender:
    def __init__(self, api_client: Any, config: Config, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.core = CoreReads(api_client)  # not the generated CoreV1Api: see kubereads.py
        self.state = ClusterState(assume_ttl=config.assume_ttl, clock=clock)
        self.metrics = Metrics(self.state)
        self.writer = PodWriter(api_client)
        if not config.scheduler_names:
            raise ValueError("no scheduler names to serve; give --scheduler-names NAME[,NAME...] (the "
                             "schedulerName of the memslice scheduler profile)")
        self.served = ServedPods(frozenset(config.scheduler_names))
        if config.max_limit_ratio is not None and not config.max_limit_ratio >= 1:
            raise ValueError(f"--max-limit-ratio={float(config.max_limit_ratio):g} is below 1: a GPU could not "
                             f"take pods whose limits are their requests; give a ratio of at least 1, or none")
        self.binder = Binder(self.core, self.writer, self.state, config.policy, clock, self.served,
                             config.max_limit_ratio)
        if config.filter_answers not in FILTER_ANSWERS:
            raise ValueError(f"--filter-answers={config.filter_answers[:32]!r} (or $MEMSLICE_EXTENDER_FILTER_ANSWERS) "
                             f"is not one of {', '.join(FILTER_ANSWERS)}; give best (the scheduler's configuration "
                             f"without prioritizeVerb) or all (with prioritizeVerb)")
        self.verbs = Verbs(self.state, self.binder, config.policy, self.metrics, config.max_limit_ratio,
                           lambda node: node_pod_priorities(self.core, node), best=config.filter_answers == "best")
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
            Informer("pods", self.core.list_pod_for_all_namespaces, on_replace=self._replace_pods,
                     on_upsert=self._upsert_pod, on_delete=self._delete_pod,
                     synced=self.state.pods_synced, stop=self._stop, field_selector=POD_SELECTOR,
                     watch_timeout=config.watch_timeout, on_restart=on_restart, convert=self._pod_entry),
        ]
        tls = None
        if config.tls_client_ca_file and not config.tls_cert_file:
            raise ValueError("--tls-client-ca-file needs --tls-cert-file and --tls-key-file: client certificates "
                             "are checked only over TLS")
        if config.tls_cert_file or config.tls_key_file:
            if not (config.tls_cert_file and config.tls_key_file):
                raise ValueError("TLS needs both --tls-cert-file and --tls-key-file")
            tls = tls_context(config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file)
        self.httpd = ExtenderHTTPServer((config.address, config.port), self.verbs, self.metrics,
                                        lambda: self.state.synced, config.max_body_bytes, tls,
                                        limits=verbs_limits(config.address, tls is not None))
        health_address = config.address if config.health_address is None else config.health_address
        self.health_httpd = None if config.health_port is None else ExtenderHTTPServer(
            (health_address, config.health_port), self.verbs, self.metrics, lambda: self.state.synced, 0, None,
            health_only=True)
        self.probes = None if config.probe_port is None else ProbeServer(
            health_address, config.probe_port, lambda: True,
            lambda: True if self.state.synced else "not synced with the API server", "memslice-extender")
        self._serve: list[threading.Thread] = []

    # The pod watch feeds ServedPods (which pods the binder may take from its cache) before the state, so a
    # pod the state has is one ServedPods has seen too.
    def _pod_entry(self, obj: dict[str, Any]) -> Any:
        self.served.note(obj)
        return pod_entry(obj)

    def _replace_pods(self, entries: list[Any], rv: int) -> None:
        self.served.keep_only(e[0] for e in entries if e is not None)
        self.state.replace_pods(entries, rv)

    def _upsert_pod(self, obj: dict[str, Any]) -> None:
        self.served.note(obj)
        self.state.upsert_pod(obj)

    def _delete_pod(self, obj: dict[str, Any]) -> None:
        self.served.forget(obj)
        self.state.delete_pod(obj)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def url(self) -> str:
        scheme = "https" if self.httpd.tls else "http"
        host = self.config.address if self.config.address not in ("0.0.0.0", "") else "127.0.0.1"
        return f"{scheme}://{host}:{self.port}"

    def _health_host(self) -> str:
        address = self.config.address if self.config.health_address is None else self.config.health_address
        return address if address not in ("0.0.0.0", "") else "127.0.0.1"

    @property
    def health_url(self) -> str | None:
        """http://host:port of the health-only server (--health-port), or None."""
        if self.health_httpd is None:
            return None
        return f"http://{self._health_host()}:{self.health_httpd.server_address[1]}"

    @property
    def probe_url(self) -> str | None:
        """http://host:port of the probes' server (--probe-port), or None."""
        if self.probes is None:
            return None
        return f"http://{self._health_host()}:{self.probes.port}"

    def _servers(self) -> list[ExtenderHTTPServer]:
        return [self.httpd] + ([self.health_httpd] if self.health_httpd is not None else [])

    def start(self) -> Extender:
        for inf in self.informers:
            inf.start()
        for httpd in self._servers():
            thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                      name="extender-http", daemon=True)
            thread.start()
            self._serve.append(thread)
        if self.probes is not None:
            self.probes.start()
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
        for httpd in self._servers():
            if self._serve:  # shutdown() waits for serve_forever(), which only start() runs
                httpd.shutdown()
            httpd.close_connections()
            httpd.server_close()
        self._serve = []
        if self.probes is not None:
            self.probes.stop()
        self.writer.close()
        for inf in self.informers:
            inf.join(5)

    def __enter__(self) -> Extender:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

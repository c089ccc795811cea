"""Prometheus metrics and the liveness/readiness endpoints of the agent.

The per-GPU and per-container figures are computed at scrape time by a custom collector (no background
polling). prometheus_client's own HTTP server serves only metrics, so a small http.server handler adds
/healthz and /readyz next to /metrics.

The port is reachable from the pod network: it is memslice.lean_http's bounded server
(8 KiB request heads, deadlines on the idle wait, the head and the answer, at most 32 connections and 8 per
peer, refused with 503 without a thread, a newcomer taking a waiting connection's place), and the page
is shared by its scrapers (lean_http.RenderCache: each scrape gets a render begun after it arrived, renders
spaced by ten times their CPU cost, one for all the scrapers waiting), at most MAX_SCRAPES answered at
once, so scrapes cannot take the CPU Allocate needs.
The kubelet's probes have a port of their own too (--probe-port, memslice.probe_http).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from memslice.lean_http import BoundedHTTPServer, ConnLimits, LeanRequestHandler, RenderCache

from .ledger import Allocation, allocated_mib
from .state import NodeState

if TYPE_CHECKING:
    from memslice.interposer.region import RegionSnapshot

    from .regions import DirUsage

log = logging.getLogger(__name__)

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
MiB = 1 << 20
MAX_SCRAPES = 4  # /metrics answers in progress at once; 503 beyond
METRICS_LIMITS = ConnLimits()  # the kubelet's probes and a few Prometheus replicas


class Metrics:
    """The agent's own instruments, in a registry of their own (several agents may share a process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.allocate_seconds = Histogram("memslice_allocate_seconds", "Allocate handling time",
                                          buckets=_LATENCY_BUCKETS, registry=r)
        self.preferred_seconds = Histogram("memslice_preferred_allocation_seconds",
                                           "GetPreferredAllocation handling time", buckets=_LATENCY_BUCKETS,
                                           registry=r)
        self.allocate_errors = Counter("memslice_allocate_errors", "Allocate calls refused", registry=r)
        self.streams = Gauge("memslice_listandwatch_streams", "Open ListAndWatch streams", registry=r)
        self.registered = Gauge("memslice_kubelet_registered",
                                "1 while the agent is registered with the kubelet", registry=r)
        self.registrations = Counter("memslice_kubelet_registrations", "Successful Register calls",
                                     registry=r)
        self.registration_errors = Counter("memslice_kubelet_registration_errors", "Failed Register calls",
                                           registry=r)


RegionReader = Callable[[str], "RegionSnapshot | None"]
DirUsageReader = Callable[[str], "DirUsage"]


class NodeCollector:
    """Per-GPU capacity/allocated/used and per-container quota/used/peak/refused, read at scrape time.

    Each container's region file is the tenant's to write: it is read through the defensive reader, and a
    region that cannot be read costs only its own figures (memslice_container_region_error 1, one log line
    when its problem appears or changes), never the scrape."""

    def __init__(self, state: NodeState, used_mib: Callable[[str], int | None],
                 read_region: RegionReader | None, region_dir: Callable[[str], str],
                 dir_usage: DirUsageReader | None = None, trash_items: Callable[[], int] | None = None,
                 fill_pids: Callable[[str], int] | None = None) -> None:
        self.state = state
        self.fill_pids = fill_pids
        self.dir_usage = dir_usage
        self.trash_items = trash_items
        self.used_mib = used_mib
        self.read_region = read_region
        self.region_dir = region_dir
        self._errors: dict[str, str] = {}  # region ID -> its last logged problem
        self._errors_lock = threading.Lock()

    def describe(self) -> list[Metric]:
        return []  # computed at scrape time; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        st = self.state
        with st.lock:
            gpus = list(st.gpus.values())
            ledger = dict(st.ledger)
        healthy = st.health.snapshot()
        alloc = allocated_mib(ledger)
        labels = ["gpu", "uuid", "model"]
        cap = GaugeMetricFamily("memslice_gpu_capacity_mib", "GPU memory advertised (whole units)",
                                labels=labels)
        can = GaugeMetricFamily("memslice_gpu_allocatable_mib",
                                "GPU memory processes can allocate: NVML's total less the driver's reserved "
                                "memory, at most CUDA's total", labels=labels)
        nvml_total = GaugeMetricFamily("memslice_gpu_nvml_total_mib",
                                       "NVML's total (v1), the driver's reserved memory included", labels=labels)
        reserved = GaugeMetricFamily("memslice_gpu_reserved_mib",
                                     "Memory the driver reserves (nvmlDeviceGetMemoryInfo_v2)", labels=labels)
        used_alloc = GaugeMetricFamily("memslice_gpu_allocated_mib", "GPU memory handed to containers",
                                       labels=labels)
        used = GaugeMetricFamily("memslice_gpu_used_mib", "GPU memory in use (NVML)", labels=labels)
        health = GaugeMetricFamily("memslice_gpu_healthy", "1 when the GPU is advertised Healthy",
                                   labels=labels)
        for g in gpus:
            lv = [str(g.index), g.uuid, g.model]
            cap.add_metric(lv, (g.mem_mib // st.unit_mib) * st.unit_mib)
            can.add_metric(lv, g.mem_mib)
            if g.nvml_total_mib:
                nvml_total.add_metric(lv, g.nvml_total_mib)
            if g.reserved_mib is not None:
                reserved.add_metric(lv, g.reserved_mib)
            used_alloc.add_metric(lv, alloc.get(g.index, 0))
            u = self.used_mib(g.uuid)
            if u is not None:
                used.add_metric(lv, u)
            health.add_metric(lv, 1 if healthy.get(g.uuid) else 0)
        yield from (cap, can, nvml_total, reserved, used_alloc, used, health)
        yield from self._containers(ledger)
        if self.dir_usage is not None:
            yield from self._dirs(ledger, self.dir_usage)
        if self.trash_items is not None:
            yield GaugeMetricFamily("memslice_region_trash_items",
                                    "Removed region directories still being deleted in the background",
                                    value=self.trash_items())

    def _dirs(self, ledger: dict[str, Allocation], usage: DirUsageReader) -> Iterator[Metric]:
        """What each container keeps in its (read-write, host-disk) region directory: a tenant can fill the
        node's disk there, so this is what to alert on. A bounded walk: lower bounds past its limit."""
        labels = ["namespace", "pod", "container", "region", "gpu"]
        entries = GaugeMetricFamily("memslice_container_region_dir_entries",
                                    "Files and directories in the container's region directory (a bounded "
                                    "count: see memslice_container_region_dir_complete)", labels=labels)
        size = GaugeMetricFamily("memslice_container_region_dir_bytes",
                                 "Disk space the container's region directory uses (st_blocks; bounded "
                                 "count)", labels=labels)
        complete = GaugeMetricFamily("memslice_container_region_dir_complete",
                                     "0 when the region directory holds more than the scrape counts (the two "
                                     "figures are then lower bounds)", labels=labels)
        for a in ledger.values():
            lv = [a.namespace, a.pod, a.container, a.region_id, a.gpu_uuid]  # one directory: device 0's GPU
            try:
                u = usage(self.region_dir(a.region_id))
            except OSError as exc:  # never the scrape: this region's figures are left out
                log.debug("region directory of %s not counted: %s", a.region_id, exc)
                continue
            entries.add_metric(lv, u.entries)
            size.add_metric(lv, u.bytes)
            complete.add_metric(lv, 1 if u.complete else 0)
        yield from (entries, size, complete)

    def _containers(self, ledger: dict[str, Allocation]) -> Iterator[Metric]:
        labels = ["namespace", "pod", "container", "region", "gpu"]
        quota = GaugeMetricFamily("memslice_container_quota_mib", "Container GPU memory quota", labels=labels)
        used = GaugeMetricFamily("memslice_container_used_mib",
                                 "Container GPU memory held by its live processes (shim region)", labels=labels)
        peak = GaugeMetricFamily("memslice_container_peak_mib", "Container GPU memory peak (shim region)",
                                 labels=labels)
        refused = CounterMetricFamily("memslice_container_refused_allocations",
                                      "Allocations the shim refused for going over the quota", labels=labels)
        ctx = GaugeMetricFamily("memslice_container_context_cost_mib",
                                "What a CUDA context took on the container's GPU, as the shim measured it at the "
                                "last context creation (charged to the quota per context)", labels=labels)
        taken = GaugeMetricFamily("memslice_container_driver_taken_mib",
                                  "Container GPU memory the driver took outside allocation calls (contexts, "
                                  "limits, modules), charged to the quota", labels=labels)
        error = GaugeMetricFamily("memslice_container_region_error",
                                  "1 when the container's region file cannot be read or is not a valid region "
                                  "(the agent log names the problem)", labels=labels)
        for a in ledger.values():
            snap, failed = self._read(a.region_id)
            for uuid in a.uuids():  # one series per container and GPU (a pod spanning GPUs: its quota on each)
                lv = [a.namespace, a.pod, a.container, a.region_id, uuid]
                quota.add_metric(lv, a.mib)
                error.add_metric(lv, 1 if failed else 0)
                dev = None if snap is None else next((d for d in snap.devices if d.uuid == uuid), None)
                if dev is not None:
                    used.add_metric(lv, dev.used_bytes / MiB)
                    peak.add_metric(lv, dev.peak_bytes / MiB)
                    refused.add_metric(lv, dev.refused)
                    ctx.add_metric(lv, dev.context_cost_bytes / MiB)
                    taken.add_metric(lv, dev.driver_taken_bytes / MiB)
        self._forget(set(ledger))
        yield from (quota, used, peak, refused, ctx, taken, error)

    def _read(self, region_id: str) -> tuple[RegionSnapshot | None, bool]:
        """(snapshot or None, whether the region is damaged); logs a region's problem once per change."""
        if self.read_region is None:
            return None, False
        try:
            if self.fill_pids is not None:  # host PIDs for the shim's NVML filter (bounded, before the read)
                self.fill_pids(self.region_dir(region_id))
            snap = self.read_region(self.region_dir(region_id))
        except Exception as exc:  # a damaged region must not break the scrape (RegionError, or worse)
            problem = str(exc) or type(exc).__name__
            with self._errors_lock:
                changed = self._errors.get(region_id) != problem
                self._errors[region_id] = problem
            if changed:
                log.warning("region %s cannot be read, its usage metrics are left out: %s", region_id, problem)
            return None, True
        with self._errors_lock:
            was = self._errors.pop(region_id, None)
        if was is not None:
            log.info("region %s is readable again", region_id)
        return snap, False

    def _forget(self, known: set[str]) -> None:
        with self._errors_lock:
            for rid in set(self._errors) - known:
                del self._errors[rid]


def region_reader() -> RegionReader | None:
    """memslice.interposer.region.read_region, or None (container usage metrics off) when unavailable."""
    try:
        from memslice.interposer.region import layout, read_region

        layout()  # the header is parsed now: a broken install shows at start, not at every scrape
    except Exception as exc:  # header missing, cffi missing, ...
        log.warning("container usage metrics are off: the region reader is unavailable (%s)", exc)
        return None
    return read_region


def host_pid_filler(simulate: bool) -> Callable[[str], int]:
    """For each scraped region directory: fill the host PIDs of live slots that have none (see
    memslice.interposer.region.fill_host_pids), in the region file and, on a simulated node, in the simulated
    driver's usage file (the driver reports processes by those PIDs, as a real one does by host PID)."""
    from memslice.interposer.region import REGION_FILE, RegionError, fill_host_pids

    names = (REGION_FILE, "sim.usage") if simulate else (REGION_FILE,)

    def fill(region_dir: str) -> int:
        n = 0
        for name in names:
            try:
                n += fill_host_pids(os.path.join(region_dir, name))
            except (RegionError, OSError) as exc:  # the read that follows reports a damaged region
                log.debug("host PIDs of %s/%s not filled: %s", region_dir, name, exc)
        return n

    return fill


class HealthServer:
    """GET /metrics, /healthz (the agent's loops are alive) and /readyz (registered with the kubelet)."""

    def __init__(self, registry: CollectorRegistry, live: Callable[[], bool], ready: Callable[[], bool | str],
                 host: str, port: int, limits: ConnLimits = METRICS_LIMITS) -> None:
        page = RenderCache(lambda: generate_latest(registry), max_scrapes=MAX_SCRAPES)
        self.page = page

        class Handler(LeanRequestHandler):
            server_version = "memslice-node-agent"
            timeout = 30  # per read; the server's deadlines bound the whole request

            def do_GET(self) -> None:  # noqa: N802 (http.server API)
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    if not page.acquire():
                        self.close_connection = True
                        return self.send_all(503, b"too many scrapes in progress; try again later\n",
                                             "text/plain")
                    try:
                        text = page.get()
                        if text is None:
                            self.close_connection = True
                            return self.send_all(503, b"metrics are being rendered for others; try again\n",
                                                 "text/plain")
                        return self.send_all(200, text, CONTENT_TYPE_LATEST)
                    finally:
                        page.release()
                if path in ("/healthz", "/livez"):
                    ok = live()
                    body = b"ok\n" if ok else b"agent loop stalled\n"
                    ctype, code = "text/plain", 200 if ok else 503
                elif path == "/readyz":
                    state = ready()  # True, False, or why it is not ready
                    why = state if isinstance(state, str) and state else "not registered with the kubelet"
                    body = b"ok\n" if state is True else why.encode()[:4096] + b"\n"
                    ctype, code = "text/plain", 200 if state is True else 503
                else:
                    body, ctype, code = b"not found: try /metrics, /healthz, /readyz\n", "text/plain", 404
                self.send_all(code, body, ctype)

            def log_message(self, fmt: str, *args: object) -> None:
                log.debug("http: " + fmt, *args)

        self._httpd = BoundedHTTPServer((host, port), Handler, limits)
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="metrics-http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

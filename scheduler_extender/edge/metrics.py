"""Prometheus metrics of the extender (prometheus_client, one registry per extender instance).

- memslice_extender_requests_total{verb,code}, memslice_extender_request_seconds{verb} (histogram)
- memslice_extender_pods_bound_total, memslice_extender_bind_failures_total{reason}
- memslice_extender_gpu_free_mib{node,gpu,uuid} and memslice_extender_gpu_capacity_mib{node,gpu,uuid},
  computed from the state at scrape time (no cost per scheduling decision), and
  memslice_extender_gpu_limits_mib{node,gpu,uuid}: the sum of the limits of the pods on each GPU (elastic
  memory; a pod without a limit counts its request), what --max-limit-ratio caps
- memslice_extender_watch_restarts_total{resource,reason}, memslice_extender_tracked{what}
- memslice_extender_preempt_capped_nodes_total: nodes of preempt requests whose N-GPU victim search stopped at
  its share of the request's budget (verbs.PREEMPT_SEARCH_BUDGET; decisions.SearchBudget)
- memslice_extender_binds_in_flight, memslice_extender_filter_gate_waits_total{outcome}: filters that found the
  bind gate full (gate.py) and then got room, or answered after its bounded wait ("timed_out")

The per-GPU families are 80,000 samples each at 5,000 nodes × 8 GPUs. Through prometheus_client's collector
API each sample is a label dict and a Sample tuple, objects the cyclic garbage collector tracks: a scrape
took ~1 s of CPU and set off full collections while the verbs were serving. So they are
written as text straight from the views' plain tuples (the same exposition lines prometheus_client writes:
labels sorted, values as Go floats, label values escaped), and the text is kept until the state's generation
changes (a scrape of an idle cluster is a lookup). What is kept is one bytes object (~6.5 MiB at 5,000 × 8).
While the cluster changes (every bind does), renders are spaced by ten times their CPU cost
(memslice.lean_http.RenderCache; ~0.1 s at 5,000 × 8, so a scrape may wait ~1 s) and one serves every
scraper that arrived before it began: 20 scrapers raised filter p50 from 11 to 104 ms when each rendered its
own. The other families are small and written fresh at each scrape; the page is sent as parts,
never joined into one copy.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from memslice.lean_http import RenderCache

from ..placement.state import ClusterState
from ..placement.views import NodeView
from .gate import BindGate

MAX_SCRAPES = 4  # /metrics answers in progress at once (a Prometheus pair and two more); 503 beyond
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class GaugeText(NamedTuple):
    """A per-GPU gauge family written as text by gpu_text()."""

    name: str
    help: str
    field: int  # the field of a view's GPU row (views.GpuRow) it reports


GPU_FAMILIES = (GaugeText("memslice_extender_gpu_free_mib", "GPU memory not reserved by any pod, per GPU (MiB)", 6),
                GaugeText("memslice_extender_gpu_capacity_mib", "GPU memory as the node agent publishes it (MiB)", 3))
# field 5 is used_mib, to which gpu_text adds the view's `over` (not a plain field of the row)
LIMITS = GaugeText("memslice_extender_gpu_limits_mib", "Sum of the GPU memory limits of the pods on each GPU (a pod "
                   "without a limit counts its request; MiB)", 5)


def _label(value: str) -> str:
    """A label value escaped as the exposition format (and prometheus_client) escapes it."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _go_float(value: int) -> str:
    """floatToGoString(value) (prometheus_client's value format): an int below 10**6 is `<int>.0`."""
    if type(value) is int and -(10**15) < value < 10**6:
        return f"{value}.0"
    text: str = floatToGoString(value)  # type: ignore[no-untyped-call]  # prometheus_client's own, untyped
    return text


def gpu_text(views: list[NodeView]) -> bytes:
    """The per-GPU families in the Prometheus text format (0.0.4), every GPU of every view. Only strings are
    made per GPU (no tuple, list or dict that the cyclic garbage collector would track)."""
    rows: list[Any] = [r for v in views for r in v.rows]  # GpuRows: the gauges' fields are ints
    labels = [f'{{gpu="{r[1]}",node="{_label(v.name)}",uuid="{_label(r[0])}"}} ' for v in views for r in v.rows]
    out: list[str] = []
    for name, help_text, field in GPU_FAMILIES:
        out.append(f"# HELP {name} {help_text}\n# TYPE {name} gauge\n")
        out.extend(f"{name}{text}{_go_float(row[field])}\n" for text, row in zip(labels, rows, strict=True))
    # the limit sum (decisions.limit_sum): used MiB plus what the GPU's elastic pods' limits add above it
    limits = [r[5] + (v.over[i] if v.over is not None else 0) for v in views for i, r in enumerate(v.rows)]
    out.append(f"# HELP {LIMITS.name} {LIMITS.help}\n# TYPE {LIMITS.name} gauge\n")
    out.extend(f"{LIMITS.name}{text}{_go_float(mib)}\n" for text, mib in zip(labels, limits, strict=True))
    return "".join(out).encode()


class _StateCollector(Collector):
    def __init__(self, state: ClusterState) -> None:
        self.state = state

    def collect(self) -> Iterator[Any]:
        tracked = GaugeMetricFamily("memslice_extender_tracked", "Objects the extender tracks",
                                    labels=["what"])
        for what, n in self.state.counts().items():
            tracked.add_metric([what], n)
        yield tracked


class _GateCollector(Collector):
    """The bind gate's figures (gate.py), read at scrape time from whichever gate the verbs use."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Any]:
        gate = self.metrics.gate
        if gate is None:
            return
        yield GaugeMetricFamily("memslice_extender_binds_in_flight", "Binds in flight now (filter waits while "
                                "they reach the bind gate's limit)", value=gate.in_flight)
        waits = CounterMetricFamily("memslice_extender_filter_gate_waits", "Filters that found the bind gate "
                                    "full, by how the wait ended", labels=["outcome"])
        waits.add_metric(["room"], gate.got_room)  # not waited - timed_out: a wait in progress would count
        waits.add_metric(["timed_out"], gate.timed_out)  # as room, then fall back when it times out
        yield waits


class Metrics:
    def __init__(self, state: ClusterState) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("memslice_extender_requests", "Extender requests by verb and HTTP code",
                                ["verb", "code"], registry=self.registry)
        self.latency = Histogram("memslice_extender_request_seconds", "Extender request latency by verb",
                                 ["verb"], buckets=BUCKETS, registry=self.registry)
        self.bound = Counter("memslice_extender_pods_bound", "Pods bound by the extender",
                             registry=self.registry)
        self.bind_failures = Counter("memslice_extender_bind_failures", "Binds that failed, by reason",
                                     ["reason"], registry=self.registry)
        self.preempt_capped = Counter("memslice_extender_preempt_capped_nodes",
                                      "Nodes of preempt requests whose GPU-set search stopped at its share of the "
                                      "request's budget", registry=self.registry)
        self.watch_restarts = Counter("memslice_extender_watch_restarts", "List/watch restarts",
                                      ["resource", "reason"], registry=self.registry)
        self.registry.register(_StateCollector(state))
        self.gate: BindGate | None = None  # set by Verbs
        self.registry.register(_GateCollector(self))
        self.state = state
        self.scrapes = RenderCache(lambda: gpu_text(self.state.snapshot()[1]), key=lambda: self.state.snapshot()[0],
                                   key_complete=True, max_scrapes=MAX_SCRAPES)

    def gpu_text(self) -> bytes | None:
        """gpu_text() of the views, shared by scrapers (see the module docstring); None when it could not be
        had within RenderCache.WAIT_S."""
        return self.scrapes.get()

    def page(self) -> tuple[list[bytes], str] | None:
        """The /metrics page as parts to send one after the other, and its content type; None as gpu_text."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        gpus = self.gpu_text()
        return None if gpus is None else ([generate_latest(self.registry), gpus], CONTENT_TYPE_LATEST)

    def render(self) -> tuple[bytes, str]:
        """The page as one bytes object (tests, tools)."""
        page = self.page()
        if page is None:
            raise TimeoutError("the per-GPU metrics could not be rendered in time")
        return b"".join(page[0]), page[1]

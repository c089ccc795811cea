"""Prometheus metrics of the extender (prometheus_client, one registry per extender instance).

- memslice_extender_requests_total{verb,code}, memslice_extender_request_seconds{verb} (histogram)
- memslice_extender_pods_bound_total, memslice_extender_bind_failures_total{reason}
- memslice_extender_gpu_free_mib{node,gpu,uuid} and memslice_extender_gpu_capacity_mib{node,gpu,uuid},
  computed from the state at scrape time (no cost per scheduling decision), and
  memslice_extender_gpu_limits_mib{node,gpu,uuid}: the sum of the limits of the pods on each GPU (elastic
  memory; a pod without a limit counts its request), what --max-limit-ratio caps
- memslice_extender_watch_restarts_total{resource,reason}, memslice_extender_tracked{what}
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from memslice.scheduler_extender.state import ClusterState

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class _StateCollector(Collector):
    def __init__(self, state: ClusterState) -> None:
        self.state = state

    def collect(self) -> Iterator[Any]:
        free = GaugeMetricFamily("memslice_extender_gpu_free_mib",
                                 "GPU memory not reserved by any pod, per GPU (MiB)",
                                 labels=["node", "gpu", "uuid"])
        cap = GaugeMetricFamily("memslice_extender_gpu_capacity_mib", "GPU memory as the node agent "
                                "publishes it (MiB)", labels=["node", "gpu", "uuid"])
        limits = GaugeMetricFamily("memslice_extender_gpu_limits_mib", "Sum of the GPU memory limits of the pods "
                                   "on each GPU (a pod without a limit counts its request; MiB)",
                                   labels=["node", "gpu", "uuid"])
        for view in self.state.views():
            for i, g in enumerate(view.gpus):
                labels = [view.name, str(g.index), g.uuid]
                free.add_metric(labels, g.free_mib)
                cap.add_metric(labels, g.mem_mib)
                limits.add_metric(labels, g.used_mib + (view.over[i] if view.over is not None else 0))
        tracked = GaugeMetricFamily("memslice_extender_tracked", "Objects the extender tracks",
                                    labels=["what"])
        for what, n in self.state.counts().items():
            tracked.add_metric([what], n)
        yield free
        yield cap
        yield limits
        yield tracked


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
        self.watch_restarts = Counter("memslice_extender_watch_restarts", "List/watch restarts",
                                      ["resource", "reason"], registry=self.registry)
        self.registry.register(_StateCollector(state))

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST

"""Per-container compute-share figures, read at scrape time from the node's compute directory.

What a container was given (request, limit) is the agent's own ledger; what it achieved, how long it waited at
its limit (throttled) and for its neighbours (waited) is what its processes publish in their slot file. Those
files are the tenants' to write: memslice.compute reads them bounded (preads of a fixed size, never mapped) and
clamps every figure by the roster the agent wrote, so a tenant can lie only about itself, within its own limit.
A GPU directory that cannot be read costs only its own figures, never the scrape.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from memslice.compute import ComputeShareError, SlotFigures, read_gpu

from .ledger import Allocation

log = logging.getLogger(__name__)
LABELS = ["namespace", "pod", "container", "region", "gpu"]


class ComputeCollector:
    def __init__(self, ledger: Callable[[], dict[str, Allocation]], compute_dir: Path) -> None:
        self.ledger = ledger
        self.compute_dir = compute_dir

    def describe(self) -> list[Metric]:
        return []  # computed at scrape time

    def _figures(self, uuid: str) -> dict[int, SlotFigures]:
        try:
            return {f.slot: f for f in read_gpu(self.compute_dir, uuid)}
        except (OSError, ComputeShareError) as exc:
            log.debug("compute figures of GPU %s unreadable: %s", uuid, exc)
            return {}

    def collect(self) -> Iterator[Metric]:
        req = GaugeMetricFamily("memslice_container_compute_request_percent",
                                "Container's compute request (guaranteed share under contention), percent of one GPU",
                                labels=LABELS)
        lim = GaugeMetricFamily("memslice_container_compute_limit_percent",
                                "Container's compute limit (a cap even on an idle GPU), percent; absent: no cap",
                                labels=LABELS)
        share = GaugeMetricFamily("memslice_container_compute_share_percent",
                                  "GPU time the container's processes got over the shim's recent window, percent "
                                  "of one GPU (at most its limit)", labels=LABELS)
        used = CounterMetricFamily("memslice_container_compute_used_seconds", "GPU time the container was charged",
                                   labels=LABELS)
        throttled = CounterMetricFamily("memslice_container_compute_throttled_seconds",
                                        "Time the container's launches waited at its compute limit", labels=LABELS)
        waited = CounterMetricFamily("memslice_container_compute_waited_seconds",
                                     "Time the container's launches waited for its neighbours (contention, "
                                     "priority)", labels=LABELS)
        gpu_req = GaugeMetricFamily("memslice_gpu_compute_requested_percent",
                                    "Sum of the compute requests of the GPU's containers, percent", labels=["uuid"])
        per_gpu: dict[str, list[Allocation]] = {}
        for a in self.ledger().values():
            if a.compute_slot >= 0:
                for gpu in a.uuids():  # a container spanning GPUs holds its share on each
                    per_gpu.setdefault(gpu, []).append(a)
        for uuid, allocs in sorted(per_gpu.items()):
            figures = self._figures(uuid)
            gpu_req.add_metric([uuid], sum(a.compute_request for a in allocs))
            for a in allocs:
                lv = [a.namespace, a.pod, a.container, a.region_id, uuid]
                req.add_metric(lv, a.compute_request)
                if a.compute_limit:
                    lim.add_metric(lv, a.compute_limit)
                f = figures.get(a.compute_slot)
                if f is None:
                    continue
                share.add_metric(lv, f.share_pct)
                used.add_metric(lv, f.used_s)
                throttled.add_metric(lv, f.throttled_s)
                waited.add_metric(lv, f.waited_s)
        yield from (req, lim, share, used, throttled, waited, gpu_req)

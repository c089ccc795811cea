"""Elastic-memory figures per GPU, from the node's boards (memslice.elastic.read_boards), at scrape time.

The boards are the tenants' to write: each is read with one bounded pread and lock probes that never wait,
and the figures are what the tenants published (a tenant can misstate its own slot, never another's). A
board's slot names a process by its PID in its own container's namespace, which does not tell containers
apart, so the figures are per GPU (summed over its live tenants), not per container.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from memslice.elastic import Tenant, read_boards

log = logging.getLogger(__name__)
MiB = 1 << 20


def per_gpu(tenants: list[Tenant]) -> dict[str, dict[str, float]]:
    """GPU uuid -> summed figures of its live tenants (pure)."""
    out: dict[str, dict[str, float]] = {}
    for t in tenants:
        g = out.setdefault(t.gpu, dict.fromkeys(("resident", "swapped", "active", "idle", "swap_outs", "swap_ins",
                                                 "swap_out_s", "swap_in_s"), 0.0))
        g["resident"] += t.resident_bytes / MiB
        g["swapped"] += t.swapped_bytes / MiB
        g[t.state] += 1
        g["swap_outs"] += t.swap_outs
        g["swap_ins"] += t.swap_ins
        g["swap_out_s"] += t.swap_out_seconds
        g["swap_in_s"] += t.swap_in_seconds
    return out


class ElasticCollector:
    """memslice_gpu_elastic_* per GPU from the boards in `directory` (nothing when there are none)."""

    def __init__(self, directory: Path, read: Callable[[Path], list[Tenant]] = read_boards) -> None:
        self.directory = directory
        self.read = read
        self._failing = False

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        try:
            tenants = self.read(self.directory)
        except Exception as exc:  # noqa: BLE001 - a damaged board must not break the scrape
            if not self._failing:
                log.warning("elastic boards in %s cannot be read, their metrics are left out: %s",
                            self.directory, exc)
            self._failing = True
            return
        self._failing = False
        figures = per_gpu(tenants)
        lb = ["uuid"]
        resident = GaugeMetricFamily("memslice_gpu_elastic_resident_mib",
                                     "Elastic tenants' memory in GPU memory (their boards)", labels=lb)
        swapped = GaugeMetricFamily("memslice_gpu_elastic_swapped_mib",
                                    "Elastic tenants' memory in host memory: swapped out or served from host",
                                    labels=lb)
        tenants_g = GaugeMetricFamily("memslice_gpu_elastic_tenants", "Live elastic processes by state",
                                      labels=["uuid", "state"])
        outs = CounterMetricFamily("memslice_gpu_elastic_swap_outs", "Ranges moved to host memory (live "
                                   "processes)", labels=lb)
        ins = CounterMetricFamily("memslice_gpu_elastic_swap_ins", "Ranges moved back to GPU memory (live "
                                  "processes)", labels=lb)
        out_s = CounterMetricFamily("memslice_gpu_elastic_swap_out_seconds", "Time spent moving to host memory",
                                    labels=lb)
        in_s = CounterMetricFamily("memslice_gpu_elastic_swap_in_seconds", "Time spent moving back to GPU "
                                   "memory", labels=lb)
        for uuid, f in sorted(figures.items()):
            resident.add_metric([uuid], f["resident"])
            swapped.add_metric([uuid], f["swapped"])
            for state in ("active", "idle"):
                tenants_g.add_metric([uuid, state], f[state])
            outs.add_metric([uuid], f["swap_outs"])
            ins.add_metric([uuid], f["swap_ins"])
            out_s.add_metric([uuid], f["swap_out_s"])
            in_s.add_metric([uuid], f["swap_in_s"])
        yield from (resident, swapped, tenants_g, outs, ins, out_s, in_s)

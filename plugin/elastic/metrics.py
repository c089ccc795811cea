"""Elastic-memory figures per GPU and per container, from the node's boards, at scrape time.

The boards are the tenants' to write: each is read with one bounded pread and lock probes that never wait
(memslice.elastic.scan_boards; a board that cannot be read costs only its own tenants). Whose a slot is comes
from the kernel, never from the slot's bytes: F_GETLK names the holder of the slot's liveness lock in the
agent's PID namespace, and the same probe on each container's region file names that container's live
processes (memslice.elastic.owners/attribute). The agent sees those PIDs only in the host PID namespace
(deploy/overlays/host-pids); elsewhere the kernel names nobody, every slot stays unattributed
(memslice_gpu_elastic_unattributed_tenants) and only the per-GPU figures are exported.

The figures themselves are what the slots say: each tenant writes only its own slot file (board version 5),
but what it writes there is its claim, bounded by the agent's roster where one exists (memslice.elastic.bound).
So the agent bounds them too: a container's resident and swapped bytes are each
at most its limit, and a process's swap counters may only grow, and account for no more moving time than the
process has lived (its age from the kernel's /proc; `plausible`). Counters stay monotonic when a process
exits: its last accepted counts are kept in its container's total for as long as the container is in the
agent's ledger.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from memslice.elastic import BoardScan, HostNote, Tenant, attribute, owners, scan_boards

from ..ledger import Allocation

log = logging.getLogger(__name__)
MiB = 1 << 20
MAX_MOVES_PER_S = 100_000  # a move is at least 2 MiB: 200 GB/s, beyond any host link
STATES = ("active", "idle", "swapped-out")


@dataclass(frozen=True)
class Counts:
    """A process's (or a container's) swap counters."""

    outs: int = 0
    ins: int = 0
    out_s: float = 0.0
    in_s: float = 0.0
    refused_cgroup: int = 0  # asks it could not take to host memory: its cgroup
    refused_host: int = 0    # ... the host's memory
    bursts_failed: int = 0   # its own bursts that failed for a neighbour's refusal

    def __add__(self, o: Counts) -> Counts:
        return Counts(self.outs + o.outs, self.ins + o.ins, self.out_s + o.out_s, self.in_s + o.in_s,
                      self.refused_cgroup + o.refused_cgroup, self.refused_host + o.refused_host,
                      self.bursts_failed + o.bursts_failed)

    @staticmethod
    def of(t: Tenant) -> Counts:
        n = t.note
        return Counts(t.swap_outs, t.swap_ins, t.swap_out_seconds, t.swap_in_seconds,
                      n.refused_cgroup if n else 0, n.refused_host if n else 0, n.bursts_failed if n else 0)

    def events(self) -> int:
        """Refusals and failed bursts: each is an answer to an ask or an allocation, at most as many as moves."""
        return self.refused_cgroup + self.refused_host + self.bursts_failed


def plausible(prev: Counts, cur: Counts, base: Counts, span_s: float) -> bool:
    """Whether a live process's counters may read `cur` after `prev` (pure): none went down, and since `base`
    its moves took no more than `span_s` seconds (one thread moves, out and in alike) and were no more than
    MAX_MOVES_PER_S allows in that time. `span_s` is the process's age (the kernel's) with `base` zero, or,
    where the age cannot be read, the time since the agent first saw the process plus a minute with `base`
    what it showed then. A slot failing this was written by someone else."""
    if (cur.outs < prev.outs or cur.ins < prev.ins or cur.out_s < prev.out_s or cur.in_s < prev.in_s
            or cur.refused_cgroup < prev.refused_cgroup or cur.refused_host < prev.refused_host
            or cur.bursts_failed < prev.bursts_failed):
        return False
    secs = (cur.out_s + cur.in_s) - (base.out_s + base.in_s)
    moves = (cur.outs + cur.ins) - (base.outs + base.ins)
    return (secs <= span_s and moves <= span_s * MAX_MOVES_PER_S
            and cur.events() - base.events() <= span_s * MAX_MOVES_PER_S)


def process_age(pid: int, proc: str = "/proc") -> float | None:
    """Seconds since process `pid` (in this process's PID namespace) started, from the kernel
    (/proc/PID/stat starttime against CLOCK_BOOTTIME); None when it cannot be read."""
    try:
        with open(f"{proc}/{int(pid)}/stat", "rb") as f:
            raw = f.read(4096)
        fields = raw[raw.rindex(b")") + 2:].split()  # the command may hold spaces and parentheses
        start = int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return max(time.clock_gettime(time.CLOCK_BOOTTIME) - start, 0.0)


Instance = tuple[str, int, int]  # (GPU uuid, board slot, kernel-named PID): one process's life in one slot
Key = tuple[str, str]            # (region ID, GPU uuid): one container on one GPU
UNKNOWN_AGE_SLACK_S = 60.0


@dataclass
class Accumulator:
    """Monotonic swap totals per container and GPU across process exits (pure state, no I/O)."""

    last: dict[Instance, tuple[Key, Counts]] = field(default_factory=dict)
    first: dict[Instance, tuple[float, Counts]] = field(default_factory=dict)  # first sight: when, what
    retired: dict[Key, Counts] = field(default_factory=dict)
    rejected: int = 0  # implausible updates ignored, ever

    def advance(self, current: Mapping[Instance, tuple[Key, Counts]], now: float,
                ages: Mapping[Instance, float | None], known: set[str]) -> dict[Key, Counts]:
        """Fold one poll's live processes in (`ages`: each one's age, None if unknown); the totals per
        container key. `known` are the region IDs still in the ledger: the totals of the others are
        forgotten."""
        nxt: dict[Instance, tuple[Key, Counts]] = {}
        for inst, (key, counts) in self.last.items():
            if inst not in current or current[inst][0] != key:  # exited (or its PID now another's)
                self.retired[key] = self.retired.get(key, Counts()) + counts
                self.first.pop(inst, None)
        for inst, (key, counts) in current.items():
            seen = self.last.get(inst)
            if seen is None or seen[0] != key:
                self.first[inst] = (now, counts)
                seen = (key, Counts())
            age = ages.get(inst)
            if age is not None:
                base, span = Counts(), age + 1.0
            else:
                at, base = self.first[inst]
                span = now - at + UNKNOWN_AGE_SLACK_S
            if not plausible(seen[1], counts, base, span):
                self.rejected += 1
                counts = seen[1]
            nxt[inst] = (key, counts)
        self.last = nxt
        self.retired = {k: v for k, v in self.retired.items() if k[0] in known}
        totals = dict(self.retired)
        for key, counts in nxt.values():
            totals[key] = totals.get(key, Counts()) + counts
        return totals


@dataclass(frozen=True)
class ContainerElastic:
    """One container's elastic figures on one GPU."""

    alloc: Allocation
    gpu: str
    resident_bytes: int
    swapped_bytes: int
    processes: dict[str, int]  # state -> live processes
    totals: Counts
    note: HostNote | None = None  # the last host-memory refusal of its processes, as they wrote it


@dataclass(frozen=True)
class ElasticView:
    tenants: list[Tenant]
    containers: dict[Key, ContainerElastic]
    unattributed: dict[str, int]  # GPU uuid -> live tenants of no known container
    errors: list[tuple[str, str]]
    caps: dict[str, int] = field(default_factory=dict)  # GPU uuid -> sum of its elastic containers' limits, bytes


def container_figures(alloc: Allocation, gpu: str, tenants: list[Tenant], totals: Counts) -> ContainerElastic:
    """Summed figures of one container's processes on one GPU, each bounded by the container's limit, which
    the agent knows (pure)."""
    cap = max(alloc.limit_mib, alloc.mib) * MiB
    states = dict.fromkeys(STATES, 0)
    for t in tenants:
        states[t.shown_state] += 1
    note = next((t.note for t in tenants if t.note is not None and t.note.cause), None)
    return ContainerElastic(alloc, gpu, min(sum(t.resident_bytes for t in tenants), cap),
                            min(sum(t.swapped_bytes for t in tenants), cap), states, totals, note)


RegionPids = Callable[[str], list[int]]


class ElasticTracker:
    """Reads the boards and the containers' regions, attributes slots, keeps the monotonic totals. poll() is
    called at each scrape and by the swap Events loop (under one lock)."""

    def __init__(self, directory: Path, ledger: Callable[[], dict[str, Allocation]], region_pids: RegionPids,
                 scan: Callable[[Path], BoardScan] | None = None, clock: Callable[[], float] = time.monotonic,
                 age: Callable[[int], float | None] = process_age, gpus: list[str] | None = None) -> None:
        self.directory = directory
        self.gpus = gpus  # only the boards named after this node's GPUs are read
        self.ledger = ledger
        self.region_pids = region_pids
        self.scan = scan if scan is not None else (lambda d: scan_boards(d, self.gpus))
        self.clock = clock
        self.age = age
        self.acc = Accumulator()
        self._lock = threading.Lock()
        self._problems: dict[str, str] = {}

    def poll(self) -> ElasticView:
        with self._lock:
            return self._poll()

    def _poll(self) -> ElasticView:
        scan = self.scan(self.directory)
        self._log_problems(scan.errors)
        ledger = self.ledger()
        pids: dict[str, list[int]] = {}
        # only elastic containers have the board mounted; with no tenant on any board, no region is read
        for rid in (r for r, a in ledger.items() if a.limit_mib > a.mib) if scan.tenants else ():
            try:
                pids[rid] = self.region_pids(rid)
            except Exception as exc:  # noqa: BLE001 - a damaged region attributes nothing, the rest goes on
                log.debug("region %s: no process attributed: %s", rid, exc)
        mine, unknown = attribute(scan.tenants, owners(pids))
        by_key: dict[Key, list[Tenant]] = {}
        current: dict[Instance, tuple[Key, Counts]] = {}
        for rid, ts in mine.items():
            for t in ts:
                key = (rid, t.gpu)
                by_key.setdefault(key, []).append(t)
                current[(t.gpu, t.slot, t.owner_pid)] = (key, Counts.of(t))
        ages = {inst: self.age(inst[2]) for inst in current}
        totals = self.acc.advance(current, self.clock(), ages, set(ledger))
        containers = {key: container_figures(ledger[key[0]], key[1], by_key.get(key, []), c)
                      for key, c in totals.items() if key[0] in ledger}
        unattributed: dict[str, int] = {}
        for t in unknown:
            unattributed[t.gpu] = unattributed.get(t.gpu, 0) + 1
        caps: dict[str, int] = {}
        for a in ledger.values():
            for uuid in a.uuids():
                caps[uuid] = caps.get(uuid, 0) + max(a.limit_mib, a.mib) * MiB
        return ElasticView(scan.tenants, containers, unattributed, scan.errors, caps)

    def _log_problems(self, errors: list[tuple[str, str]]) -> None:
        now = dict(errors)
        for path, problem in now.items():
            if self._problems.get(path) != problem:
                log.warning("elastic board %s cannot be read, its tenants are left out: %s", path, problem)
        self._problems = now


def per_gpu(tenants: list[Tenant], caps: Mapping[str, int] | None = None) -> dict[str, dict[str, float]]:
    """GPU uuid -> summed figures of its live tenants (pure). With `caps` (GPU uuid -> bytes the node's limits
    allow there: slots are the tenants' to write), resident and swapped are each at most that."""
    out: dict[str, dict[str, float]] = {}
    for t in tenants:
        g = out.setdefault(t.gpu, dict.fromkeys(("resident", "swapped", "active", "idle", "swap_outs", "swap_ins",
                                                 "swap_out_s", "swap_in_s", "asks", "asked", "got",
                                                 "refused_cgroup", "refused_host", "bursts_failed"), 0.0))
        if t.note is not None:
            g["refused_cgroup"] += t.note.refused_cgroup
            g["refused_host"] += t.note.refused_host
            g["bursts_failed"] += t.note.bursts_failed
        g["asks"] += t.asks
        g["asked"] += t.asked_mib
        g["got"] += t.got_mib
        g["resident"] += t.resident_bytes / MiB
        g["swapped"] += t.swapped_bytes / MiB
        g[t.state] += 1
        g["swap_outs"] += t.swap_outs
        g["swap_ins"] += t.swap_ins
        g["swap_out_s"] += t.swap_out_seconds
        g["swap_in_s"] += t.swap_in_seconds
    for uuid, g in out.items() if caps is not None else ():
        cap = (caps or {}).get(uuid, 0) / MiB
        g["resident"] = min(g["resident"], cap)
        g["swapped"] = min(g["swapped"], cap)
    return out


class ElasticCollector:
    """memslice_gpu_elastic_* per GPU and memslice_container_* elastic figures per container and GPU."""

    def __init__(self, tracker: ElasticTracker) -> None:
        self.tracker = tracker

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        try:
            view = self.tracker.poll()
        except Exception as exc:  # noqa: BLE001 - the boards must never break the scrape
            log.warning("elastic figures left out of this scrape: %s", exc)
            return
        yield from self._gpus(view)
        yield from self._containers(view)

    @staticmethod
    def _gpus(view: ElasticView) -> Iterator[Metric]:
        lb = ["uuid"]
        resident = GaugeMetricFamily("memslice_gpu_elastic_resident_mib",
                                     "Elastic tenants' memory in GPU memory (their boards)", labels=lb)
        swapped = GaugeMetricFamily("memslice_gpu_elastic_swapped_mib",
                                    "Elastic tenants' memory in host memory: swapped out or served from host",
                                    labels=lb)
        tenants_g = GaugeMetricFamily("memslice_gpu_elastic_tenants", "Live elastic processes by state",
                                      labels=["uuid", "state"])
        unknown = GaugeMetricFamily("memslice_gpu_elastic_unattributed_tenants",
                                    "Live elastic processes the agent cannot attribute to a container (the kernel "
                                    "names no PID outside the host PID namespace)", labels=lb)
        outs = CounterMetricFamily("memslice_gpu_elastic_swap_outs", "Ranges moved to host memory (live "
                                   "processes)", labels=lb)
        ins = CounterMetricFamily("memslice_gpu_elastic_swap_ins", "Ranges moved back to GPU memory (live "
                                  "processes)", labels=lb)
        out_s = CounterMetricFamily("memslice_gpu_elastic_swap_out_seconds", "Time spent moving to host memory",
                                    labels=lb)
        in_s = CounterMetricFamily("memslice_gpu_elastic_swap_in_seconds", "Time spent moving back to GPU "
                                   "memory", labels=lb)
        asks = CounterMetricFamily("memslice_gpu_elastic_asks", "Asks tenants made of their neighbours for GPU "
                                   "memory (live processes)", labels=lb)
        asked = CounterMetricFamily("memslice_gpu_elastic_ask_needed_mib", "GPU memory those asks needed",
                                    labels=lb)
        got = CounterMetricFamily("memslice_gpu_elastic_ask_moved_mib", "GPU memory neighbours moved to host "
                                  "memory for those asks (moved / needed)", labels=lb)
        refused = CounterMetricFamily("memslice_elastic_moves_refused", "Asks for GPU memory a tenant could not "
                                      "take to host memory: its memory cgroup near its limit, or the host low on "
                                      "memory (live processes)", labels=["uuid", "cause"])
        failed = CounterMetricFamily("memslice_elastic_bursts_failed", "Burst allocations that failed with "
                                     "CUDA_ERROR_OUT_OF_MEMORY because a neighbour could not take its memory to "
                                     "host memory (live processes)", labels=lb)
        figures = per_gpu(view.tenants, view.caps)
        for uuid, f in sorted(figures.items()):
            resident.add_metric([uuid], f["resident"])
            swapped.add_metric([uuid], f["swapped"])
            for state in ("active", "idle"):
                tenants_g.add_metric([uuid, state], f[state])
            unknown.add_metric([uuid], view.unattributed.get(uuid, 0))
            outs.add_metric([uuid], f["swap_outs"])
            ins.add_metric([uuid], f["swap_ins"])
            out_s.add_metric([uuid], f["swap_out_s"])
            in_s.add_metric([uuid], f["swap_in_s"])
            asks.add_metric([uuid], f["asks"])
            asked.add_metric([uuid], f["asked"])
            got.add_metric([uuid], f["got"])
            refused.add_metric([uuid, "cgroup"], f["refused_cgroup"])
            refused.add_metric([uuid, "host"], f["refused_host"])
            failed.add_metric([uuid], f["bursts_failed"])
        yield from (resident, swapped, tenants_g, unknown, outs, ins, out_s, in_s, asks, asked, got, refused, failed)

    @staticmethod
    def _containers(view: ElasticView) -> Iterator[Metric]:
        lb = ["namespace", "pod", "container", "region", "gpu"]
        resident = GaugeMetricFamily("memslice_container_resident_mib",
                                     "Container's elastic memory in GPU memory (HBM)", labels=lb)
        swapped = GaugeMetricFamily("memslice_container_swapped_mib",
                                    "Container's elastic memory in host memory: swapped out, or served from "
                                    "host memory while HBM was full", labels=lb)
        procs = GaugeMetricFamily("memslice_container_elastic_processes",
                                  "Container's live elastic processes by state (active, idle, swapped-out)",
                                  labels=[*lb, "state"])
        outs = CounterMetricFamily("memslice_container_swap_outs",
                                   "Ranges of the container's memory moved from GPU to host memory", labels=lb)
        ins = CounterMetricFamily("memslice_container_swap_ins",
                                  "Ranges of the container's memory moved back to GPU memory", labels=lb)
        out_s = CounterMetricFamily("memslice_container_swap_out_seconds",
                                    "Time the container's processes spent moving memory to host memory", labels=lb)
        in_s = CounterMetricFamily("memslice_container_swap_in_seconds",
                                   "Time the container's processes spent moving memory back to GPU memory",
                                   labels=lb)
        refused = CounterMetricFamily("memslice_container_elastic_moves_refused",
                                      "Asks for GPU memory the container's processes could not take to host "
                                      "memory, by cause (cgroup: its memory limit; host: the node's memory)",
                                      labels=[*lb, "cause"])
        failed = CounterMetricFamily("memslice_container_elastic_bursts_failed",
                                     "The container's burst allocations that failed because a neighbour could not "
                                     "take its memory to host memory", labels=lb)
        for (_, gpu), c in sorted(view.containers.items()):
            a = c.alloc
            lv = [a.namespace, a.pod, a.container, a.region_id, gpu]
            resident.add_metric(lv, c.resident_bytes / MiB)
            swapped.add_metric(lv, c.swapped_bytes / MiB)
            for state in STATES:
                procs.add_metric([*lv, state], c.processes[state])
            outs.add_metric(lv, c.totals.outs)
            ins.add_metric(lv, c.totals.ins)
            out_s.add_metric(lv, c.totals.out_s)
            in_s.add_metric(lv, c.totals.in_s)
            refused.add_metric([*lv, "cgroup"], c.totals.refused_cgroup)
            refused.add_metric([*lv, "host"], c.totals.refused_host)
            failed.add_metric(lv, c.totals.bursts_failed)
        yield from (resident, swapped, procs, outs, ins, out_s, in_s, refused, failed)


def region_pid_reader(region_dir: Callable[[str], str]) -> RegionPids:
    """region ID -> the kernel-named PIDs of its live processes (the region's slot locks)."""
    from memslice.interposer.region import read_region

    def pids(rid: str) -> list[int]:
        snap = read_region(region_dir(rid), with_processes=False)  # the scrape's cost: no process list
        return [] if snap is None else snap.owner_pids

    return pids


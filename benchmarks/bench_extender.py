"""Benchmark of the memslice scheduler extender on a simulated cluster, from empty to full.

    .venv/bin/python benchmarks/bench_extender.py [--json] [--nodes 5000] [--gpus 8] [--filter-nodes 500]
        [--bands 0,10,30,50,70,90,95] [--per-band 300] [--warmup 0] [--restart] [--scrapers 0]
        [--multi-gpu PCT] [--topology]

Three processes, so that the extender's figures are its own:
- the Kubernetes API stand-in (tests/support/kube_standin.py) with N nodes × G GPUs of 80 GiB (the node agent's
  annotations); on command it adds running pods (1–40 GiB, most of them small, bound with reservations) on
  random GPUs with room, until the cluster is filled to a given fraction: a random, fragmented prefill that
  the extender receives by watch, as it would in a cluster where other schedulers or restarts placed pods;
- the extender (`memslice extender`, started through this file so that a gc.callbacks hook can log every
  garbage collection's pause), which lists and watches the stand-in like a real cluster;
- this process, calling the extender the way kube-scheduler does: for each pending pod, `filter` with the
  nodes that passed the scheduler's own filters (--filter-nodes random names, 0 = all: kube-scheduler's
  adaptive percentageOfNodesToScore sends 500 of 5,000), `prioritize` with the nodes that passed, then
  `bind` to the best one (so the extender's own binpacking fills the cluster further). Filter and
  prioritize are serial (one scheduling cycle at a time); binds go on their own connections without
  waiting (up to --bind-workers in flight), as kube-scheduler's binding cycles run in goroutines.

Per fill band (the prefill brings the cluster to the band's lower edge, then --per-band pods are scheduled
through the extender): filter+prioritize median and p99 per pod, pods/s through all three verbs, the
extender's CPU per pod (the figure to compare: wall-clock figures on a shared machine are noisy), its
longest garbage-collection pause, its RSS, and how long the extender's, the client's and the stand-in's
threads waited runnable for a CPU per pod (on a shared machine, the other jobs' share of the chain). With
--restart, the extender is then restarted on the full cluster: seconds from start to the first answered
filter, RSS after the relist, and a check of every GPU (no reservation double-counted or lost: 0
over-committed GPUs). `--restart-at FRACTION` only restarts, on a
cluster prefilled to FRACTION, `--restarts` times, alternating with `--alt-pythonpath` (another tree of the
package, e.g. main's). BENCH_PYSPY=file records the extender with py-spy (BENCH_PYSPY_RATE: samples/s, 250;
BENCH_PYSPY_SCOPE=bands: only while the bands' pods are scheduled, the steady state without start-up and
warm-up; each band overwrites the file). BENCH_PERF=file records the extender's threads with `perf record -g`
while each band's pods are scheduled (C and kernel frames: what py-spy, GIL holders only, leaves out; each band
overwrites the file). BENCH_CALLGRIND=1 runs the extender under valgrind's callgrind with instrumentation off, and
on only while each band's pods are scheduled: the band then reports `instructions_per_pod` (the extender's,
all threads, load-independent; the run is ~50× slower, so its wall-clock figures say nothing) and leaves the
dump in the run's directory (its path in `callgrind_file`; kept). BENCH_BREAKDOWN=1: each band also reports
the extender's thread CPU per pod by activity (`breakdown_cpu_ms_per_pod`: each verb's handling, the connection
threads in all, the watch events; bench_real_scheduler.install_breakdown), which a loaded machine's waits leave
out.
The extender's modules are compiled into a bytecode cache of the run's own before any start is timed, as an
image's install compiles them (a shell's PYTHONDONTWRITEBYTECODE would otherwise make every start of an
editable install compile our sources again).

--scrapers N (issue 25): N Prometheus-like clients in a process of their own scrape the extender's /metrics
in a loop (keep-alive, each answer read whole; after a 503, a second's pause) while each band's pods are
scheduled; the band then also
reports the filter median alone and the scrapes answered (200) and refused (503) per second.

--multi-gpu PCT (issue 34): that percent of the scheduled pods span 2 or 4 GPUs (`memslice.io/gpu-count`, half
each, up to 20 GiB on each GPU); --topology publishes NVLink pairs and a PCIe switch per four GPUs on every node.
Compare `--topology --multi-gpu 20` with `--topology` (all one-GPU pods) on the same machine: `--multi-gpu 0,20
--rounds 3` runs each mix 3 times, interleaved (0, 20, 20, 0, 0, 20: each a fresh stand-in and extender), and
reports per band the medians of pods/s and CPU ms per pod of each mix and the ratio of each to the first's.

--client go: the serial chain per pod runs in benchmarks/goclient (Go, stdlib only; `go build` into
build/bench-goclient on each run, ~0.2 s when cached) instead of this process: kube-scheduler's HTTPExtender
as it speaks to a nodeCacheCapable extender (net/http, HTTP/1.1 keep-alive, Go's default of 2 idle
connections per host unless --go-idle-conns, each bind in a goroutine), reading the answers as the Python
client does (--go-decode bytes) or, as kube-scheduler does, decoding them whole with encoding/json and
encoding prioritize's names again (--go-decode full: ~7 ms of Go CPU per pod at 5,000 names here).
Everything else (the stand-in, the pods, the filter bodies and their random names, the catch-up probe, the
figures) is this file's, so the two clients' figures compare; the band adds the Go client's step times and
the connections it dialed.

The load client stays cheap so as not to take the cores from the extender: the filter bodies are encoded
before the clock starts, and it is one thread speaking HTTP/1.1 over plain sockets (see Client), with
orjson; it reads prioritize's best host off the answer's bytes with numpy (best_host; numpy comes with the test
extras) and echoes filter's names unparsed (passed_names). The extender's work is untouched: every call is a
full HTTP request, every bind makes its two writes to the stand-in, and the watch delivers every event.
"""

from __future__ import annotations

import argparse
import fcntl
import http.client
import json
import os
import random
import select
import selectors
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from memslice.scheduler_extender.placement.constants import MAX_SCORE

ROOT = Path(__file__).resolve().parent.parent
GPU_MIB = 81920
# Pod sizes (GiB) and weights: 1-40 GiB, most of them small (mean ~12 GiB: 95 % of 5,000 × 8 GPUs of 80 GiB
# is ~250,000 pods, the size of the cluster in issue 15's load test).
SIZES_GIB = (1, 2, 3, 4, 6, 8, 10, 12, 16, 20, 24, 32, 40)
WEIGHTS = (10, 12, 8, 10, 8, 10, 6, 6, 8, 6, 5, 6, 5)
# Bytes asked of each recv(): an answer (up to ~20 KB for 500 nodes) in one or two reads. Not 1 MiB: CPython
# allocates the whole size for every recv() (an mmap and munmap at that size), 20 us per call here.
RECV_BYTES = 1 << 16
TARGETS = {"filter_prioritize_p99_ms": 10.0, "pods_per_s_500_names": 500.0, "pods_per_s_all_names": 500.0,
           "cpu_full_over_empty": 1.5, "rss_mib": 300.0, "gc_pause_ms": 50.0, "restart_to_filter_s": 2.0}


# --------------------------------------------------------------------------------------------- stand-in side

def _gpu_pod(name: str, namespace: str, mib: int, node: str | None = None, gpu: str | None = None,
             gpus: int = 1) -> dict:
    meta: dict = {"name": name, "namespace": namespace}
    if gpus > 1:  # a pod spanning GPUs (--multi-gpu): `mib` is its total, split evenly over them
        meta["annotations"] = {"memslice.io/gpu-count": str(gpus)}
    if gpu is not None:
        meta["annotations"] = {"memslice.io/gpu-uuid": gpu, "memslice.io/gpu-mem-mib": json.dumps({"main": mib}),
                               "memslice.io/assumed-at": "2026-01-01T00:00:00.000000Z"}
    pod = {"kind": "Pod", "metadata": meta, "spec": {
        "schedulerName": "memslice-scheduler",  # the extender binds only its scheduler's pods
        "containers": [{"name": "main", "image": "cuda", "resources": {"limits": {"memslice.io/gpu-mem": str(mib)}}}]}}
    if node is not None:
        pod["spec"]["nodeName"] = node
        pod["status"] = {"phase": "Running"}
    return pod


class Cluster:
    """The stand-in's side: nodes, the prefill, pending pods and the final check, on command (stdin)."""

    def __init__(self, args: argparse.Namespace) -> None:
        sys.path.insert(0, str(ROOT / "tests"))
        __import__("testpaths").add()  # the test folders (tests/testpaths.py)
        from kube_standin import KubeApiStandin

        self.args = args
        self.rng = random.Random(args.seed)
        self.kube = KubeApiStandin().start()
        self.gpus = [f"GPU-{n:05d}-{g}" for n in range(args.nodes) for g in range(args.gpus)]
        for n in range(args.nodes):
            gpus = [{"uuid": f"GPU-{n:05d}-{g}", "index": g, "model": "Sim H100 80GB", "memMiB": GPU_MIB,
                     "numa": g // 4, "healthy": True} for g in range(args.gpus)]
            if args.topology:  # as an HGX board without NVSwitch: NVLink pairs, a PCIe switch per four GPUs
                for g in gpus:
                    g.update({"nvlink": [g["index"] ^ 1], "pcie": f"sw{g['index'] // 4}"})
            self.kube.put({"kind": "Node", "metadata": {"name": f"node-{n:05d}", "labels": {
                "memslice.io/gpu": "true"}, "annotations": {"memslice.io/gpus": json.dumps(gpus),
                                                           "memslice.io/unit-mib": "1"}}})
        self.prefilled = 0

    def used(self) -> dict[str, int]:
        """MiB reserved per GPU, read back from every pod in the store (the extender's binds included)."""
        used: dict[str, int] = {}
        for pod in self.kube.list("Pod"):
            ann = pod["metadata"].get("annotations") or {}
            if "memslice.io/gpu-uuid" in ann:
                uuids = ann["memslice.io/gpu-uuid"].split(",")  # a pod spanning GPUs: its total / N on each
                for uuid in uuids:
                    used[uuid] = used.get(uuid, 0) + sum(json.loads(ann["memslice.io/gpu-mem-mib"]).values()) // len(
                        uuids)
        return used

    def fill(self, fraction: float) -> dict:
        """Add running pods on random GPUs with room until `fraction` of all GPU memory is reserved."""
        used = self.used()
        capacity = len(self.gpus) * GPU_MIB
        total = sum(used.values())
        misses = 0
        while total < fraction * capacity and misses < 200:
            mib = self.rng.choices(SIZES_GIB, WEIGHTS)[0] * 1024
            for _ in range(50):
                gpu = self.rng.choice(self.gpus)
                if used.get(gpu, 0) + mib <= GPU_MIB:
                    break
            else:
                misses += 1
                continue
            used[gpu] = used.get(gpu, 0) + mib
            total += mib
            node = "node-" + gpu.split("-")[1]
            self.kube.put(_gpu_pod(f"run-{self.prefilled:06d}", f"team-{self.prefilled % 50}", mib, node, gpu))
            self.prefilled += 1
        return {"fill": total / capacity, "pods": len(self.kube.list("Pod"))}

    def pending(self, namespace: str, count: int) -> list[dict]:
        """`count` pending pods; --multi-gpu percent of them span 2 or 4 GPUs (half each), each GPU holding a
        size drawn as for one-GPU pods (at most 20 GiB each: tensor-parallel shards)."""
        for i in range(count):
            mib = self.rng.choices(SIZES_GIB, WEIGHTS)[0] * 1024
            gpus = 1
            if self.rng.random() * 100 < self.args.multi_gpu:
                gpus = self.rng.choice((2, 4))
                mib = min(mib, 20 * 1024) * gpus
            self.kube.put(_gpu_pod(f"new-{i:05d}", namespace, mib, gpus=gpus))
        return self.kube.list("Pod", namespace)

    def sentinel(self) -> str:
        """A new one-GPU node, then a pod that reserves all of that GPU: once the extender refuses a pod on
        that node, its watch has delivered every pod written before (the watch delivers them in order)."""
        name = f"sentinel-{self.prefilled}"
        self.prefilled += 1
        gpus = [{"uuid": f"GPU-{name}", "index": 0, "model": "Sim", "memMiB": GPU_MIB, "numa": 0, "healthy": True}]
        self.kube.put({"kind": "Node", "metadata": {"name": name, "annotations": {
            "memslice.io/gpus": json.dumps(gpus), "memslice.io/unit-mib": "1"}}})
        self.kube.put(_gpu_pod(name, "sentinels", GPU_MIB, name, f"GPU-{name}"))
        return name

    def check(self) -> dict:
        used = self.used()
        free = [GPU_MIB - used.get(g, 0) for g in self.gpus]
        return {"over_committed_gpus": sum(1 for v in used.values() if v > GPU_MIB),
                # binpacking quality: GPUs that can still take the largest pod (40 GiB), and the wholly empty
                "gpus_with_40gib_free": sum(1 for f in free if f >= 40 * 1024),
                "empty_gpus": sum(1 for f in free if f == GPU_MIB),
                "fill": sum(used.values()) / (len(self.gpus) * GPU_MIB), "pods": len(self.kube.list("Pod"))}


def serve_standin(args: argparse.Namespace) -> None:
    """Child process: the simulated cluster; one JSON answer line per command line on stdin."""
    cluster = Cluster(args)
    print(json.dumps({"url": cluster.kube.url}), flush=True)
    for line in sys.stdin:
        cmd, *rest = line.split()
        if cmd == "fill":
            out: object = cluster.fill(float(rest[0]))
        elif cmd == "pending":
            out = cluster.pending(rest[0], int(rest[1]))
        elif cmd == "sentinel":
            out = cluster.sentinel()
        else:
            out = cluster.check()
        print(json.dumps(out), flush=True)
    cluster.kube.stop()


def install_timeline() -> Any:
    """BENCH_BREAKDOWN: when each request's head was read, its verb began and ended, and its answer was written
    (time.perf_counter: CLOCK_MONOTONIC, the client's clock too), per request; returns a function that hands
    over (and forgets) those recorded since its last call: [[verb, head, verb start, verb end, sent], ...]."""
    from memslice import lean_http
    from memslice.scheduler_extender.edge import server

    rows: list[list[Any]] = []
    local = threading.local()
    read_head, handle_verb, send_all = (lean_http.LeanRequestHandler._read_head, server._Handler._handle_verb,
                                        lean_http.LeanRequestHandler.send_all)

    def timed_head(self: Any) -> Any:
        local.row = [None, time.perf_counter(), 0.0, 0.0, 0.0]
        return read_head(self)

    def timed_verb(self: Any, verb: str) -> int:
        row = getattr(local, "row", None) or [None, 0.0, 0.0, 0.0, 0.0]
        row[0], row[2] = verb, time.perf_counter()
        try:
            return handle_verb(self, verb)
        finally:
            rows.append(row)

    def timed_send(self: Any, *a: Any) -> None:
        row = getattr(local, "row", None)
        if row is not None:
            row[3] = time.perf_counter()
        send_all(self, *a)
        if row is not None:
            row[4] = time.perf_counter()

    lean_http.LeanRequestHandler._read_head = timed_head  # type: ignore[method-assign]
    server._Handler._handle_verb = timed_verb  # type: ignore[method-assign]
    lean_http.LeanRequestHandler.send_all = timed_send  # type: ignore[method-assign]

    def take() -> list[list[Any]]:
        out = rows[:]
        del rows[:len(out)]
        return out

    return take


def serve_extender(gc_log: str, argv: list[str]) -> int:
    """Child process: the extender, with every garbage collection's pause appended to `gc_log` (ms, gen)."""
    import gc

    from memslice.cli import main as cli_main

    log = open(gc_log, "a", buffering=1)  # noqa: SIM115 - open for the process's life
    started = [0.0, 0.0]
    gc_cpu: dict[str, list[float]] = {}  # generation -> [CPU seconds, collections] (BENCH_BREAKDOWN)

    def on_gc(phase: str, info: dict) -> None:
        # wall ms (includes the process being descheduled on a loaded machine) and the collecting thread's
        # CPU ms (the collection itself: it holds the GIL throughout)
        if phase == "start":
            started[0], started[1] = time.perf_counter(), time.thread_time()
            return
        spent = gc_cpu.setdefault(f"gc, generation {info['generation']}", [0.0, 0])
        spent[0] += time.thread_time() - started[1]
        spent[1] += 1
        if (ms := (time.perf_counter() - started[0]) * 1000) >= 1.0 or info["generation"] == 2:
            log.write(f"{ms:.2f} {info['generation']} {(time.thread_time() - started[1]) * 1000:.2f}\n")

    gc.callbacks.append(on_gc)
    if os.environ.get("BENCH_CALLGRIND"):  # ~50x slower: the client's idle bind connections would pass idle_s
        import dataclasses

        from memslice.scheduler_extender import app
        from memslice.scheduler_extender.edge import server

        app.VERBS_LIMITS = dataclasses.replace(app.VERBS_LIMITS, idle_s=3600.0, head_s=600.0, answer_s=600.0)
        server.BODY_TIMEOUT_S = server.ANSWER_TIMEOUT_S = server.WAIT_S = 600.0  # valgrind runs one thread at a time
        server._Handler.timeout = 3600  # the connections' socket timeout (an idle keep-alive's read)
    if os.environ.get("BENCH_BREAKDOWN"):  # each activity's thread CPU, written to gc_log.breakdown on SIGUSR1
        import signal as signals

        from bench_real_scheduler import install_breakdown

        acct = install_breakdown(requests=True)
        timeline = install_timeline()

        def dump(*_: object) -> None:
            Path(gc_log + ".breakdown.tmp").write_text(json.dumps({**acct(), **gc_cpu, "timeline": timeline()}))
            os.replace(gc_log + ".breakdown.tmp", gc_log + ".breakdown")

        signals.signal(signals.SIGUSR1, dump)
    if not os.environ.get("BENCH_PROFILE"):
        return cli_main(argv)
    import cProfile  # BENCH_PROFILE=path: where the extender's CPU goes, for pstats

    with cProfile.Profile() as prof:
        rc = cli_main(argv)
    prof.dump_stats(os.environ["BENCH_PROFILE"])
    return rc


# --------------------------------------------------------------------------------------------- client side

def _request(verb: str, body: bytes) -> bytes:
    return (f"POST /{verb} HTTP/1.1\r\nHost: extender\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


class _Answers:
    """Splits the bytes read from one keep-alive connection into complete answers (status, body). Each
    answer's head is parsed once and its body collected in one growing bytearray: a 160 KB answer arrives in
    several reads, and re-joining and re-scanning the whole buffer at every read cost the client ~0.1 ms."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.head: tuple[int, int, int] | None = None  # (status, body start, body length) of the answer read

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        if not data:
            raise ConnectionError("the extender closed the connection")
        self.buf += data
        out = []
        while True:
            if self.head is None:
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    return out
                lines = bytes(self.buf[:end]).split(b"\r\n")
                length = next(int(v) for k, _, v in (line.partition(b":") for line in lines[1:])
                              if k.strip().lower() == b"content-length")
                self.head = (int(lines[0].split()[1]), end + 4, length)
            status, start, length = self.head
            if len(self.buf) < start + length:
                return out
            with memoryview(self.buf) as view:  # copied once (a bytearray's slice is a copy, then bytes() another)
                out.append((status, bytes(view[start:start + length])))
            del self.buf[:start + length]
            self.head = None


class Client:
    """The scheduler's side, in one thread, written by hand: http.client's Python (email-based header
    parsing) and a thread per bind cost the load client more CPU per pod than the extender's filter, on the
    same 2 cores. One keep-alive connection carries the serial filter and prioritize calls; `bind_conns`
    more carry the binds, each sent without waiting (kube-scheduler's binding goroutines): while the
    scheduling cycle waits for an answer, the answers to binds in flight are read as they come, so their
    latencies are the extender's. Every call is still a complete HTTP/1.1 request with a JSON body."""

    def __init__(self, host: str, port: int, bind_conns: int) -> None:
        self.addr = (host, port)
        self.serial = self._connect()
        self.serial_answers = _Answers()
        self.sel = selectors.DefaultSelector()
        self.idle: list[socket.socket] = []
        for _ in range(bind_conns):
            sock = self._connect()
            self.sel.register(sock, selectors.EVENT_READ, [_Answers(), 0.0])
            self.idle.append(sock)
        self.busy: set[socket.socket] = set()  # bind connections with a bind in flight
        self.queued: deque[bytes] = deque()  # binds waiting for a free connection
        self.bind_latencies: list[float] = []
        self.bind_errors: list[str] = []
        self.last_sent = self.last_answered = 0.0  # the last serial call's (perf_counter)
        self.redialed = 0  # idle bind connections the extender closed, dialed again

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(self.addr, timeout=60)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def post(self, verb: str, body: object, raw: bool = False) -> tuple[float, object]:
        """A serial call: (seconds, decoded answer, or its bytes with `raw`). Bind answers arriving meanwhile
        are taken in."""
        sent = body if isinstance(body, bytes) else orjson.dumps(body)
        t0 = time.perf_counter()
        self.last_sent = t0
        self.serial.sendall(_request(verb, sent))
        while True:
            readable, _, _ = select.select([self.serial, *self.busy], [], [], 60)
            if not readable:
                raise TimeoutError(f"{verb}: no answer in 60 s")
            for sock in readable:
                if sock is not self.serial:
                    self._bind_answer(sock)
            if self.serial in readable and (answers := self.serial_answers.feed(self.serial.recv(RECV_BYTES))):
                status, data = answers[0]
                self.last_answered = time.perf_counter()
                dt = self.last_answered - t0
                if status != 200:
                    raise RuntimeError(f"{verb}: HTTP {status} {data[:200]!r}")
                return dt, data if raw else orjson.loads(data)

    def bind(self, body: dict) -> None:
        """Send a bind without waiting for its answer (queued while every bind connection is busy)."""
        self.queued.append(_request("bind", orjson.dumps(body)))
        self._send_queued()

    def _send_queued(self) -> None:
        while self.queued and self.idle:
            sock = self.idle.pop()
            self.busy.add(sock)
            self.sel.get_key(sock).data[1] = time.perf_counter()
            sock.sendall(self.queued.popleft())

    def _bind_answer(self, sock: socket.socket) -> None:
        answers, t0 = self.sel.get_key(sock).data
        data = sock.recv(RECV_BYTES)
        if not data and sock not in self.busy:  # an idle connection the extender closed: dial again, as Go does
            self.sel.unregister(sock)
            self.idle.remove(sock)
            sock.close()
            fresh = self._connect()
            self.sel.register(fresh, selectors.EVENT_READ, [_Answers(), 0.0])
            self.idle.append(fresh)
            self.redialed += 1
            return
        for status, raw in answers.feed(data):
            self.bind_latencies.append(time.perf_counter() - t0)
            res = orjson.loads(raw)
            if status != 200 or res.get("Error"):
                self.bind_errors.append(res.get("Error") or f"HTTP {status}")
            self.idle.append(sock)
            self.busy.discard(sock)
        self._send_queued()

    def drain(self) -> None:
        """Wait for every bind in flight or queued."""
        while self.queued or self.busy:
            for key, _ in self.sel.select(60):
                self._bind_answer(key.fileobj)  # type: ignore[arg-type]


def rss_kib(pid: int) -> tuple[int, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads)."""
    return sum(cpu_split(pid))


def cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def runqueue_s(pid: int) -> float:
    """Seconds the process's live threads have waited on a run queue (runnable, no CPU free: the machine's other
    jobs, or our other processes), from /proc/PID/task/*/schedstat; 0 where the kernel keeps no schedstats."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):  # a thread that ended meanwhile
            continue
    return total / 1e9


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def _get(port: int, path: str) -> bytes:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", path)
    return c.getresponse().read()


def caught_up(bench: Bench, timeout: float = 900) -> None:
    """Until the extender's watch has delivered everything the stand-in holds now (bounded): a sentinel
    pod fills a new node's only GPU; the extender has it once a 1 GiB pod fails there (FailedNodes). (Not
    /metrics: rendering 80,000 GPU samples would itself load the extender and its garbage collector.)"""
    node = bench.cmd("sentinel")
    body = orjson.dumps({"Pod": {**pending_pod("probe", 1024), "metadata": {"name": "probe", "uid": "probe"}},
                         "NodeNames": [node]})
    client = Client("127.0.0.1", bench.port, 0)
    deadline = time.monotonic() + timeout
    while node not in (client.post("filter", body)[1] or {}).get("FailedNodes", {}):  # type: ignore[attr-defined]
        if time.monotonic() > deadline:
            raise TimeoutError(f"the extender did not catch up with the stand-in in {timeout} s")
        time.sleep(0.05)


class Bench:
    """The stand-in and the extender processes, and the calls between them."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        # Bytecode as a deployment has it: the image's `pip install` compiles every module, so an extender
        # start never compiles one. A development shell may set PYTHONDONTWRITEBYTECODE (this workplace
        # does), and with an editable install every start would then compile our sources again (~0.1 s of
        # a restart): here bytecode goes to a cache of the run's own, filled before anything is timed
        # (warm_bytecode).
        self.tmp = Path(tempfile.mkdtemp())
        self.env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        self.env.update(PYTHONUNBUFFERED="1", PYTHONPYCACHEPREFIX=str(self.tmp / "pycache"))
        self.standin = subprocess.Popen([sys.executable, __file__, "--_standin", "--nodes", str(args.nodes),
                                         "--gpus", str(args.gpus), "--seed", str(args.seed),
                                         "--multi-gpu", str(args.multi_gpu)] + (["--topology"] if args.topology
                                                                                 else []),
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=self.env)
        self.gc_log = self.tmp / "gc.log"
        self.gc_seen = 0
        self.ext: subprocess.Popen | None = None
        self.spy: subprocess.Popen | None = None
        self.callgrind_out = self.tmp / "callgrind.out"
        self.port = 0
        self.start_cpu_s = 0.0
        url = json.loads(self.read_standin())["url"]
        self.kubeconfig = self.tmp / "kubeconfig"
        self.kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "bench",
            "clusters": [{"name": "bench", "cluster": {"server": url}}],
            "users": [{"name": "bench", "user": {"token": "bench"}}],
            "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}]}))

    def read_standin(self) -> str:
        assert self.standin.stdout is not None
        line = self.standin.stdout.readline()
        if not line:
            raise RuntimeError("the API stand-in stopped")
        return line

    def cmd(self, line: str) -> Any:
        assert self.standin.stdin is not None
        self.standin.stdin.write(line + "\n")
        self.standin.stdin.flush()
        return json.loads(self.read_standin())

    def warm_bytecode(self, pythonpath: str | None = None) -> None:
        """Compile the extender's modules (of this tree, or of `pythonpath`'s) into the run's bytecode cache,
        untimed, as an image's install does."""
        env = self.env if pythonpath is None else dict(self.env, PYTHONPATH=pythonpath)
        subprocess.run([sys.executable, "-c", "import memslice.cli, memslice.scheduler_extender.cli, "
                        "memslice.scheduler_extender.app, memslice.kube.config, kubernetes"],
                       env=env, check=True, timeout=120)

    def start_extender(self, pythonpath: str | None = None) -> float:
        """Start the extender (with `pythonpath`: another tree of the package, e.g. main's); seconds from its
        start to the first filter it answers (not 'not synced'); the extender's CPU seconds until then in
        self.start_cpu_s. BENCH_PYSPY=path records it with py-spy (raw samples, GIL holders only)."""
        env = self.env if pythonpath is None else dict(self.env, PYTHONPATH=pythonpath)
        argv = [sys.executable, __file__, "--_extender", str(self.gc_log), "extender",
                "--kubeconfig", str(self.kubeconfig), "--address", "127.0.0.1", "--port", "0",
                "--log-level", "warning"]
        if pythonpath is None or self.args.filter_answers != "all":  # a tree from before the flag passes all
            argv += ["--filter-answers", self.args.filter_answers]
        if os.environ.get("BENCH_CALLGRIND"):
            self.callgrind_out = Path(tempfile.mkdtemp(prefix="bench-callgrind-")) / "callgrind.out"
            argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--dump-instr=no",
                    f"--callgrind-out-file={self.callgrind_out}", *argv]
        t0 = time.monotonic()
        self.ext = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
        if os.environ.get("BENCH_PYSPY") and os.environ.get("BENCH_PYSPY_SCOPE") != "bands":
            self.spy = self.record()  # until the extender exits; each start overwrites the file
        assert self.ext.stdout is not None
        line = self.ext.stdout.readline()
        if "serving" not in line:
            raise RuntimeError(f"the extender did not start: {line!r}")
        self.port = int(line.split("serving ", 1)[1].split()[0].rsplit(":", 1)[1])
        probe = orjson.dumps({"Pod": {**pending_pod("probe", 1024), "metadata": {"name": "probe", "uid": "probe"}},
                              "NodeNames": ["node-00000"]})
        client = Client("127.0.0.1", self.port, 0)
        while True:
            _, answer = client.post("filter", probe)
            if not answer.get("Error"):  # type: ignore[union-attr]
                self.start_cpu_s = cpu_s(self.ext.pid)
                return time.monotonic() - t0
            if time.monotonic() - t0 > (3000 if os.environ.get("BENCH_CALLGRIND") else 600):
                raise TimeoutError("the extender did not sync in 600 s")
            time.sleep(0.01)

    def record(self) -> subprocess.Popen:
        """py-spy recording the extender into BENCH_PYSPY (raw samples, GIL holders only), from now until it
        exits or the recorder gets SIGINT."""
        assert self.ext is not None
        rate = os.environ.get("BENCH_PYSPY_RATE", "250")  # samples per second
        return subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--nonblocking",
                                 "-r", rate, "-f", "raw", "-g", "-o", os.environ["BENCH_PYSPY"],
                                 "--pid", str(self.ext.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def perf(self) -> subprocess.Popen:
        """`perf record -g` of the extender's threads into BENCH_PERF until SIGINT (the threads must exist: the
        client's connections are made before)."""
        assert self.ext is not None
        return subprocess.Popen(["perf", "record", "-F", "1999", "-g", "-o", os.environ["BENCH_PERF"],
                                 "-p", str(self.ext.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def callgrind(self, what: str) -> None:
        """callgrind_control on the extender: `zero_on` (counts zeroed, collection on), `dump_off`."""
        assert self.ext is not None
        steps = [["-z"], ["-i", "on"]] if what == "zero_on" else [["-i", "off"], ["-d"]]
        for step in steps:
            subprocess.run(["callgrind_control", *step, str(self.ext.pid)], check=True, timeout=600,
                           stdout=subprocess.DEVNULL)

    def callgrind_instructions(self) -> tuple[int, str]:
        """(instructions, file) of the newest callgrind dump (its `totals:` line)."""
        dumps = sorted(self.callgrind_out.parent.glob("callgrind.out*"), key=lambda f: f.stat().st_mtime)
        for line in dumps[-1].read_text().splitlines():
            if line.startswith("totals:"):  # every thread's (the dump's "summary:" may say 0)
                return int(line.split()[1]), str(dumps[-1])
        raise RuntimeError(f"no totals in {dumps[-1]}")

    def breakdown(self) -> dict[str, list[float]]:
        """BENCH_BREAKDOWN: the extender's thread CPU per activity so far ({activity: [seconds, calls]}), asked
        by SIGUSR1 (its main thread answers within a second)."""
        assert self.ext is not None
        out = Path(str(self.gc_log) + ".breakdown")
        before = out.stat().st_mtime_ns if out.exists() else 0
        self.ext.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 30
        while not out.exists() or out.stat().st_mtime_ns == before:
            if time.monotonic() > deadline:
                raise TimeoutError("the extender wrote no breakdown in 30 s")
            time.sleep(0.02)
        return json.loads(out.read_text())

    def stop_extender(self) -> None:
        if self.ext is not None:
            self.ext.terminate()
            self.ext.wait(30)
            if self.spy is not None:
                self.spy.wait(60)
                self.spy = None
            self.ext = None

    def gc_pauses(self) -> list[tuple[float, int]]:
        """The garbage collections logged since the last call: (wall ms, generation)."""
        return [(ms, gen) for ms, gen, _ in self.gc_log_since()]

    def gc_log_since(self) -> list[tuple[float, int, float]]:
        """The garbage collections logged since the last call: (wall ms, generation, CPU ms)."""
        lines = self.gc_log.read_text().splitlines() if self.gc_log.exists() else []
        new, self.gc_seen = lines[self.gc_seen:], len(lines)
        return [(float(f[0]), int(f[1]), float(f[2]) if len(f) > 2 else float("nan"))
                for f in (line.split() for line in new)]

    def close(self) -> None:
        self.stop_extender()
        if self.standin.stdin:
            self.standin.stdin.close()
        self.standin.wait(60)
        shutil.rmtree(self.tmp, ignore_errors=True)


def pending_pod(name: str, mib: int) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "bench"},
            "spec": {"schedulerName": "memslice-scheduler",  # the extender binds only its scheduler's pods
                     "containers": [{"name": "main", "image": "cuda",
                                     "resources": {"limits": {"memslice.io/gpu-mem": str(mib)}}}]}}


SCRAPER = r"""
import socket, sys, threading, time
port, n = int(sys.argv[1]), int(sys.argv[2])
counts = {200: 0, 503: 0, "error": 0}
lock = threading.Lock()
stop = threading.Event()

def scrape_loop():
    buf = bytearray(1 << 20)
    while not stop.is_set():
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            f = s.makefile("rb")
            while not stop.is_set():
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nAccept-Encoding: identity\r\n\r\n")
                code = int(f.readline().split()[1])
                length, close = 0, False
                while (line := f.readline()) not in (b"\r\n", b""):
                    name, _, value = line.partition(b":")
                    if name.lower() == b"content-length":
                        length = int(value)
                    close = close or (name.lower() == b"connection" and value.strip().lower() == b"close")
                while length > 0:
                    length -= f.readinto(memoryview(buf)[:min(length, len(buf))])
                with lock:
                    counts[code] = counts.get(code, 0) + 1
                if code == 503:
                    stop.wait(1.0)  # as its Retry-After says (Prometheus itself waits a whole interval)
                if close:
                    break
            s.close()
        except (OSError, ValueError, IndexError):
            with lock:
                counts["error"] += 1
            stop.wait(0.05)

threads = [threading.Thread(target=scrape_loop, daemon=True) for _ in range(n)]
for t in threads:
    t.start()
sys.stdin.readline()  # a line: print the counts so far
print(counts[200], counts.get(503, 0), counts["error"], flush=True)
sys.stdin.readline()
stop.set()
"""


def start_scrapers(bench: Bench) -> subprocess.Popen[str] | None:
    """--scrapers clients scraping /metrics in a loop, in a process of their own; None without."""
    if not bench.args.scrapers:
        return None
    proc = subprocess.Popen([sys.executable, "-c", SCRAPER, str(bench.port), str(bench.args.scrapers)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return proc


def stop_scrapers(proc: subprocess.Popen[str] | None, wall: float) -> dict:
    """Scrapes per second answered (200) and refused (503), and connection errors."""
    if proc is None:
        return {}
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("\n")
    proc.stdin.flush()
    ok, refused, errors = (int(x) for x in proc.stdout.readline().split())
    proc.stdin.write("\n")
    proc.stdin.close()
    proc.wait(30)
    return {"scrapers": bench_scrapers(proc), "scrapes_200_per_s": round(ok / wall, 2),
            "scrapes_503_per_s": round(refused / wall, 2), "scrape_errors": errors}


def bench_scrapers(proc: subprocess.Popen[str]) -> int:
    return int(proc.args[-1])  # type: ignore[index]


FILTER_HEAD = b'{"Nodes":null,"NodeNames":['
FILTER_TAIL = b'],"FailedNodes":{},"FailedAndUnresolvableNodes":{},"Error":""}'


def first_name(names_json: bytes) -> str:
    """The first name of a JSON array of node names (names hold no quote or backslash: wire's plain names)."""
    start = names_json.index(b'"') + 1
    return names_json[start:names_json.index(b'"', start)].decode()


def passed_names(answer: bytes) -> tuple[bytes, int]:
    """(NodeNames as JSON, how many) of a filter answer. When every node passed, the extender's answer is
    FILTER_HEAD + the request's names + FILTER_TAIL (wire.filter_names_answer): those bytes are taken as they
    are (node names hold no quote or comma), as kube-scheduler's Go code would encode the same names again;
    any other answer is decoded."""
    if answer.startswith(FILTER_HEAD) and answer.endswith(FILTER_TAIL):
        names = answer[len(FILTER_HEAD) - 1:len(answer) - len(FILTER_TAIL) + 1]
        return names, (names.count(b'","') + 1 if len(names) > 2 else 0)
    passed = orjson.loads(answer)["NodeNames"] or []
    return orjson.dumps(passed), len(passed)


def best_host(answer: bytes, hosts: int) -> str:
    """The first host with the highest score in a HostPriorityList answer, as `max(decoded, key=Score)` picks
    it, read from the bytes in a few numpy passes: the extender writes each entry as {"Host":"name","Score":n}
    (wire.host_priority_json; a node's name holds no colon), so every second colon precedes a score (0..10).
    Why: decoding 5,000 entries into dicts (0.9 ms) and taking their max (0.16 ms) cost this one-threaded
    client more than the extender's whole filter and prioritize, in the serial chain that bounds pods/s
    (0.12-0.16 ms here). Any other layout (a colon count that does not match) is decoded."""
    arr = np.frombuffer(answer, np.uint8)
    colons = np.flatnonzero(arr == ord(":"))
    if hosts and len(colons) == 2 * hosts:
        at = colons[1::2] + 1
        scores = (arr[at] - ord("0")).astype(np.int16)
        scores[arr[np.minimum(at + 1, len(arr) - 1)] == ord("0")] = MAX_SCORE  # "10": the only two-digit score
        k = int(np.argmax(scores))
        return str(orjson.loads(answer[colons[2 * k] + 1:colons[2 * k + 1] - len(b',"Score"')]))
    decoded = orjson.loads(answer)
    if len(decoded) != hosts:
        raise RuntimeError(f"prioritize answered {len(decoded)} hosts for {hosts}")
    return str(max(decoded, key=itemgetter("Score"))["Host"])


GO_CLIENT_SRC = ROOT / "benchmarks" / "goclient"
GO_CLIENT_BIN = ROOT / "build" / "bench-goclient"


def build_go_client() -> Path:
    """`go build` of benchmarks/goclient into build/bench-goclient (stdlib only: nothing is downloaded; a
    no-op build is ~0.2 s from Go's build cache). Fails naming the fix when Go is missing."""
    go = shutil.which("go")
    if go is None:
        raise SystemExit("--client go needs the Go toolchain: `go` (1.22 or later) is not on PATH. Install it "
                         "(https://go.dev/dl/, or the distribution's golang package) or run with --client python.")
    GO_CLIENT_BIN.parent.mkdir(exist_ok=True)
    with open(GO_CLIENT_BIN.parent / "bench-goclient.lock", "w") as lock:  # one build at a time (test workers)
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = subprocess.run([go, "build", "-o", str(GO_CLIENT_BIN), "."], cwd=GO_CLIENT_SRC, capture_output=True,
                              text=True, timeout=600, env=dict(os.environ, GOTOOLCHAIN="local", GOFLAGS="-mod=mod"))
    if done.returncode != 0:
        raise SystemExit(f"go build of {GO_CLIENT_SRC} failed:\n{done.stderr}")
    return GO_CLIENT_BIN


def go_job_line(pod: dict, pod_text: bytes, filter_body: bytes) -> bytes:
    """One pod's job for the Go client: its bind's names, the pod's JSON, the filter request as sent."""
    meta = pod["metadata"]
    return (b'{"PodName":' + orjson.dumps(meta["name"]) + b',"PodNamespace":' + orjson.dumps(meta["namespace"])
            + b',"PodUID":' + orjson.dumps(meta["uid"]) + b',"Pod":' + pod_text + b',"Filter":' + filter_body
            + b"}\n")


class GoClient:
    """benchmarks/goclient as the load client (--client go): the serial per-pod chain in Go over net/http,
    as kube-scheduler's HTTPExtender runs it. Started and given every pod's job before the clock starts;
    `run` starts the chain and returns (wall seconds, per-pod results, summary); its CPU is read from /proc
    before `close` lets it exit."""

    def __init__(self, port: int, jobs: list[bytes], bind_workers: int, idle_conns: int, decode: str = "bytes",
                 passed_names: bool = False) -> None:
        binary = build_go_client()
        self.jobs = Path(tempfile.mkstemp(prefix="goclient-", suffix=".jsonl")[1])
        self.jobs.write_bytes(b"".join(jobs))
        self.proc = subprocess.Popen([str(binary), "-addr", f"127.0.0.1:{port}", "-jobs", str(self.jobs),
                                      "-bind-workers", str(bind_workers), "-idle-conns", str(idle_conns),
                                      "-decode", decode]
                                     + (["-passed-names"] if passed_names else []),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.pid = self.proc.pid
        self.buf = bytearray()
        line = self._line()
        if line.strip() != "ready":
            self.close()
            raise RuntimeError(f"the Go client did not start: {line!r}")

    def _line(self, timeout: float = 900) -> str:
        """The next line the Go client printed ("" when it closed its output), waiting at most `timeout` s
        for it: read off the pipe's descriptor (a buffered reader's lines would hide from select)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while (end := self.buf.find(b"\n")) < 0:
            if not select.select([self.proc.stdout], [], [], max(deadline - time.monotonic(), 0))[0]:
                raise TimeoutError(f"the Go client printed no line in {timeout} s")
            data = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not data:
                return ""
            self.buf += data
        line = bytes(self.buf[:end + 1])
        del self.buf[:end + 1]
        return line.decode()

    def run(self) -> tuple[list[dict], dict]:
        """Run the chain for every pod and wait for every bind: (per-pod results, summary)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        results = []
        while True:
            line = self._line()
            if not line:
                raise RuntimeError("the Go client stopped without a summary")
            out = json.loads(line)
            if "done" in out or "error" in out:
                if out.get("error"):
                    raise RuntimeError(f"the Go client failed: {out['error']}")
                return results, out
            results.append(out)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(30)
            self.jobs.unlink(missing_ok=True)


def schedule(bench: Bench, pods: list[dict], names: list[str], k: int, rng: random.Random) -> dict:
    """Schedule `pods` through filter, prioritize and bind (--filter-answers best: filter and bind, the first
    of filter's best nodes taken, as deploy/'s kube-scheduler configuration calls no prioritize); figures of the
    extender meanwhile."""
    assert bench.ext is not None
    if getattr(bench.args, "client", "python") == "go":
        return schedule_go(bench, pods, names, k, rng)
    pid = bench.ext.pid
    # The scheduler's side of the work that is not the extender's (its own filters choosing the candidate
    # nodes, encoding the pod) is done before the clock starts: kube-scheduler does it in Go, and on this
    # 2-core machine the client's Python would otherwise compete with the extender for CPU.
    filter_bodies = [orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": rng.sample(names, k)}) for pod in pods]
    pod_json = [orjson.dumps(pod) for pod in pods]
    # connected after the bodies are encoded: encoding thousands of them may take longer than the extender
    # keeps an idle connection (30 s), and it would close them before the first call
    conn = Client("127.0.0.1", bench.port, bench.args.bind_workers)
    lat_fp: list[float] = []
    lat_f: list[float] = []
    unschedulable = 0
    scrapers = start_scrapers(bench)
    spy = bench.record() if os.environ.get("BENCH_PYSPY") and os.environ.get("BENCH_PYSPY_SCOPE") == "bands" else None
    perf = bench.perf() if os.environ.get("BENCH_PERF") else None
    if spy is not None or perf is not None:
        time.sleep(0.5)  # py-spy attaches (the benchmark's own pause, before its clock starts)
    if os.environ.get("BENCH_CALLGRIND"):
        bench.callgrind("zero_on")
    acct0 = bench.breakdown() if os.environ.get("BENCH_BREAKDOWN") else None
    bench.gc_pauses()
    (user0, sys0), t0 = cpu_split(pid), time.perf_counter()
    cpu0, client0, standin0 = user0 + sys0, time.process_time(), cpu_s(bench.standin.pid)
    waits0 = [runqueue_s(p) for p in (pid, os.getpid(), bench.standin.pid)]
    steps: list[list[float]] = []  # per pod: filter sent, answered, prioritize sent, answered, bind sent
    only_filter = bench.args.filter_answers == "best"
    for pod, filter_body, pod_text in zip(pods, filter_bodies, pod_json, strict=True):
        dt_f, res = conn.post("filter", filter_body, raw=True)
        step = [conn.last_sent, conn.last_answered, 0.0, 0.0, 0.0]
        steps.append(step)
        lat_f.append(dt_f)
        passed_json, hosts = passed_names(res)  # type: ignore[arg-type]
        if not hosts:
            lat_fp.append(dt_f)
            unschedulable += 1
            continue
        if only_filter:  # the best nodes only (ties kept): kube-scheduler scores them with its own plugins
            step[2] = step[3] = step[1]
            lat_fp.append(dt_f)
            best = first_name(passed_json)
            step[4] = time.perf_counter()
            conn.bind({"PodName": pod["metadata"]["name"], "PodNamespace": pod["metadata"]["namespace"],
                       "PodUID": pod["metadata"]["uid"], "Node": best})
            continue
        body = b'{"Pod":' + pod_text + b',"Nodes":null,"NodeNames":' + passed_json + b"}"
        dt_p, answer = conn.post("prioritize", body, raw=True)
        step[2], step[3] = conn.last_sent, conn.last_answered
        lat_fp.append(dt_f + dt_p)
        best = best_host(answer, hosts)  # type: ignore[arg-type]
        step[4] = time.perf_counter()
        conn.bind({"PodName": pod["metadata"]["name"], "PodNamespace": pod["metadata"]["namespace"],
                   "PodUID": pod["metadata"]["uid"], "Node": best})
    conn.drain()
    wall, (user1, sys1) = time.perf_counter() - t0, cpu_split(pid)
    client, standin = time.process_time() - client0, cpu_s(bench.standin.pid) - standin0
    waits = [runqueue_s(p) - w for p, w in zip((pid, os.getpid(), bench.standin.pid), waits0, strict=True)]
    scraped = stop_scrapers(scrapers, wall)
    for recorder in (spy, perf):
        if recorder is not None:
            recorder.send_signal(signal.SIGINT)
            recorder.wait(60)
    extra: dict[str, Any] = {}
    if acct0 is not None:
        acct1 = bench.breakdown()
        rows = acct1.pop("timeline")
        acct0.pop("timeline", None)
        extra["breakdown_cpu_ms_per_pod"] = {
            k: [round((v[0] - acct0.get(k, [0, 0])[0]) * 1000 / len(pods), 3), v[1] - acct0.get(k, [0, 0])[1]]
            for k, v in sorted(acct1.items(), key=lambda kv: -kv[1][0])}
        extra["timeline_ms"] = timeline(steps, rows)
    if os.environ.get("BENCH_CALLGRIND"):
        bench.callgrind("dump_off")
        instructions, dump = bench.callgrind_instructions()
        extra = {"instructions_per_pod": round(instructions / len(pods)), "callgrind_file": dump}
    return extra | figures(bench, pods, lat_f, lat_fp, conn.bind_latencies, conn.bind_errors, unschedulable, wall,
                   (user1 + sys1 - cpu0, user1 - user0, sys1 - sys0), client, standin, waits, scraped)


def timeline(steps: list[list[float]], rows: list[list[Any]]) -> dict[str, float]:
    """Medians (ms) of each step of the serial chain per pod, from the client's timestamps (`steps`: filter
    sent, answered, prioritize sent, answered, bind sent) and the extender's (`rows`, install_timeline: verb,
    head read, verb began, answer began, answer written), matched by verb and time (one serial call at a
    time). Steps: client → extender (the request sent until the extender has read its head: the wake-up of
    its thread, the GIL, a CPU), the head until the verb (parsing), the verb (the body read and the work), the
    answer written, extender → client (until the client has the whole answer), and the client's own steps."""
    by_verb: dict[str, list[list[Any]]] = {"filter": [], "prioritize": []}
    for row in rows:
        if row[0] in by_verb and row[1]:
            by_verb[row[0]].append(row)
    for v in by_verb.values():
        v.sort(key=lambda r: r[1])
    segs: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        segs.setdefault(key, []).append(value * 1000)

    def match(verb: str, sent: float, answered: float) -> list[Any] | None:
        for row in by_verb[verb]:
            if sent <= row[1] <= answered:
                return row
        return None

    for i, (f_sent, f_done, p_sent, p_done, b_sent) in enumerate(steps):
        if not p_sent:
            continue
        for verb, sent, done in (("filter", f_sent, f_done), ("prioritize", p_sent, p_done)):
            row = match(verb, sent, done)
            if row is None:
                continue
            add(f"{verb}: client -> extender head read", row[1] - sent)
            add(f"{verb}: head -> verb", row[2] - row[1])
            add(f"{verb}: verb (body read, work)", row[3] - row[2])
            add(f"{verb}: answer written", row[4] - row[3])
            add(f"{verb}: extender -> client has the answer", done - row[4])
            add(f"{verb}: in all, as the client sees it", done - sent)
        add("client: filter answer -> prioritize sent", p_sent - f_done)
        add("client: prioritize answer -> best host, bind sent", b_sent - p_done)
        if i + 1 < len(steps):
            add("client: bind sent -> next filter sent", steps[i + 1][0] - b_sent)
            add("per pod, in all", steps[i + 1][0] - f_sent)
    return {k: round(statistics.median(v), 3) for k, v in segs.items()}


def schedule_go(bench: Bench, pods: list[dict], names: list[str], k: int, rng: random.Random) -> dict:
    """`schedule` with the Go client (--client go): the same pods, the same filter bodies (the same random
    names), the same chain per pod; the Go process's CPU is the client's (this process only waits on a pipe
    meanwhile, and its own CPU is added too). Also per pod: the step times (`steps_ms` medians: filter,
    prioritize, the host picked and the bind body encoded) and the connections the Go transport dialed."""
    assert bench.ext is not None
    pid = bench.ext.pid
    filter_bodies = [orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": rng.sample(names, k)}) for pod in pods]
    jobs = [go_job_line(pod, orjson.dumps(pod), body) for pod, body in zip(pods, filter_bodies, strict=True)]
    client = GoClient(bench.port, jobs, bench.args.bind_workers, bench.args.go_idle_conns, bench.args.go_decode)
    try:
        scrapers = start_scrapers(bench)
        bench.gc_pauses()
        (user0, sys0), t0 = cpu_split(pid), time.perf_counter()
        cpu0, own0, go0, standin0 = user0 + sys0, time.process_time(), cpu_s(client.pid), cpu_s(bench.standin.pid)
        waits0 = [runqueue_s(p) for p in (pid, client.pid, bench.standin.pid)]
        results, summary = client.run()
        wall, (user1, sys1) = time.perf_counter() - t0, cpu_split(pid)
        go_cpu, standin = cpu_s(client.pid) - go0, cpu_s(bench.standin.pid) - standin0
        own = time.process_time() - own0
        waits = [runqueue_s(p) - w for p, w in zip((pid, client.pid, bench.standin.pid), waits0, strict=True)]
    finally:
        client.close()
    scraped = stop_scrapers(scrapers, wall)
    lat_f = [r["filter_s"] for r in results]
    lat_fp = [r["filter_s"] + r["prioritize_s"] for r in results]
    binds = [r for r in results if r["passed"]]
    out = figures(bench, pods, lat_f, lat_fp, [r["bind_s"] for r in binds],
                  [r["bind_error"] for r in binds if r.get("bind_error")], len(results) - len(binds), wall,
                  (user1 + sys1 - cpu0, user1 - user0, sys1 - sys0), go_cpu + own, standin, waits, scraped)
    ms = 1000.0
    out.update(client="go", go_decode=bench.args.go_decode, go_wall_s=round(summary["wall_s"], 3),
               connections_dialed=summary["connections_dialed"],
               client_cpu_ms_per_pod_split={"go": round(go_cpu / len(pods) * ms, 3),
                                            "python_waiting": round(own / len(pods) * ms, 3)},
               steps_ms={key: round(statistics.median(r[key] for r in binds) * ms, 3) if binds else None
                         for key in ("filter_s", "prioritize_s", "pick_s")})
    return out


def figures(bench: Bench, pods: list[dict], lat_f: list[float], lat_fp: list[float], bind_latencies: list[float],
            bind_errors: list[str], unschedulable: int, wall: float, ext_cpu: tuple[float, float, float],
            client: float, standin: float, waits: list[float], scraped: dict) -> dict:
    """A band's figures from what either client measured (seconds)."""
    assert bench.ext is not None
    cpu, user, system = ext_cpu
    pid = bench.ext.pid
    gc_log = bench.gc_log_since()
    gcs = [(ms, gen) for ms, gen, _ in gc_log]
    bound = len(bind_latencies) - len(bind_errors)
    ms = 1000.0
    return {"pods": len(pods), "bound": bound, "unschedulable": unschedulable,
            "bind_errors": len(bind_errors), "first_errors": bind_errors[:3],
            "filter_prioritize_ms": {"median": round(statistics.median(lat_fp) * ms, 2),
                                     "p99": round(pct(lat_fp, 99) * ms, 2)},
            "filter_ms": {"median": round(statistics.median(lat_f) * ms, 2), "p99": round(pct(lat_f, 99) * ms, 2)},
            **scraped,
            "bind_ms": {"median": round(statistics.median(bind_latencies or [0]) * ms, 2),
                        "p99": round(pct(bind_latencies, 99) * ms, 2)},
            "pods_per_s": round(len(pods) / wall, 1), "wall_s": round(wall, 2),
            "cpu_ms_per_pod": round(cpu / len(pods) * ms, 3),
            "cpu_user_sys_ms_per_pod": [round(user / len(pods) * ms, 3), round(system / len(pods) * ms, 3)],
            "client_cpu_ms_per_pod": round(client / len(pods) * ms, 3),
            "standin_cpu_ms_per_pod": round(standin / len(pods) * ms, 3),
            # runnable but waiting for a CPU, per pod: the extender's threads, the client's, the stand-in's
            "runqueue_wait_ms_per_pod": {k: round(w / len(pods) * ms, 3)
                                         for k, w in zip(("extender", "client", "standin"), waits, strict=True)},
            "load_avg_1m": round(os.getloadavg()[0], 2),
            "gc_max_pause_ms": round(max((p for p, _ in gcs), default=0.0), 1),
            "gc_max_pause_cpu_ms": round(max((c for _, _, c in gc_log), default=0.0), 1),
            "gc_full_collections": sum(1 for _, g in gcs if g == 2),
            "rss_mib": round(rss_kib(pid)[0] / 1024, 1)}


def restarts(args: argparse.Namespace) -> dict:
    """--restart-at: prefill the stand-in (no extender running), then start the extender --restarts times on
    it, alternating with --alt-pythonpath's tree when given: seconds and extender CPU to the first answered
    filter, RSS then; medians per tree."""
    bench = Bench(args)
    try:
        state = bench.cmd(f"fill {args.restart_at}")
        trees: list[str | None] = [None] + ([args.alt_pythonpath] if args.alt_pythonpath else [])
        for tree in trees:
            bench.warm_bytecode(tree)
        runs: dict[str, list[dict]] = {str(t or "this tree"): [] for t in trees}
        for i in range(args.restarts):
            for tree in trees if i % 2 == 0 else trees[::-1]:
                standin0 = cpu_s(bench.standin.pid)
                wall = bench.start_extender(tree)
                rss = rss_kib(bench.ext.pid)[0] / 1024  # type: ignore[union-attr]
                runs[str(tree or "this tree")].append({"to_first_filter_s": round(wall, 3),
                                                        "cpu_s": round(bench.start_cpu_s, 3),
                                                        "standin_cpu_s": round(cpu_s(bench.standin.pid) - standin0, 3),
                                                        "rss_mib": round(rss, 1)})
                bench.stop_extender()
        return {"restart_at": {"pods": state["pods"], "fill_pct": round(state["fill"] * 100, 1),
                               "nodes": args.nodes, "load_avg_1m": os.getloadavg()[0]},
                "runs": runs,
                "medians": {tree: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for tree, rs in runs.items()},
                "targets": {"restart_to_filter_s": TARGETS["restart_to_filter_s"]}}
    finally:
        bench.close()


def run(args: argparse.Namespace) -> dict:
    bench = Bench(args)
    try:
        names = [f"node-{n:05d}" for n in range(args.nodes)]
        k = min(args.filter_nodes, len(names)) or len(names)
        rng = random.Random(args.seed + 1)
        tree = getattr(args, "tree", None)
        bench.warm_bytecode(tree)
        sync_s = bench.start_extender(tree)
        first_cpu = bench.start_cpu_s
        if args.warmup:  # the memo's first pass over each pod size and node, before anything is measured
            pods = bench.cmd(f"pending warmup {args.warmup}")
            caught_up(bench)
            schedule(bench, pods, names, k, rng)
        bands = []
        for i, level in enumerate(int(b) for b in args.bands.split(",")):
            t0 = time.monotonic()
            state = bench.cmd(f"fill {level / 100}")
            pods = bench.cmd(f"pending band{i} {args.per_band}")
            caught_up(bench)
            grown_s = time.monotonic() - t0
            grown_log = bench.gc_log_since()  # while the pods arrived by watch (the extender serves meanwhile)
            grown_gcs = [(ms, gen) for ms, gen, _ in grown_log]
            figures = schedule(bench, pods, names, k, rng)
            bands.append({"band_pct": level, "fill_pct": round(state["fill"] * 100, 1),
                          "running_pods": state["pods"], "prefill_by_watch_s": round(grown_s, 1),
                          "gc_max_pause_ms_while_growing": round(max((p for p, _ in grown_gcs), default=0.0), 1),
                          "gc_max_pause_cpu_ms_while_growing": round(max((c for _, _, c in grown_log), default=0.0), 1),
                          "gc_full_collections_while_growing": sum(1 for _, g in grown_gcs if g == 2), **figures})
            print(f"  [band {level}%: fill {bands[-1]['fill_pct']}%, {state['pods']} pods in the cluster before the "
                  f"band, {figures['pods']} scheduled: {figures['pods_per_s']} pods/s, "
                  f"{figures['cpu_ms_per_pod']} ms CPU/pod (client "
                  f"{figures['client_cpu_ms_per_pod']}, API stand-in {figures['standin_cpu_ms_per_pod']}), filter p50 "
                  f"{figures['filter_ms']['median']} ms"
                  + (f", {figures['instructions_per_pod']:,} instructions/pod (callgrind)"
                     if "instructions_per_pod" in figures else "")
                  + (f", {figures['scrapers']} scrapers: {figures['scrapes_200_per_s']} scrapes/s answered, "
                     f"{figures['scrapes_503_per_s']}/s refused" if "scrapers" in figures else "")
                  + (f"; Go client: steps {figures['steps_ms']} ms, {figures['connections_dialed']} connections "
                     f"dialed" if "steps_ms" in figures else "") + "]",
                  file=sys.stderr)
        restart = None
        if args.restart:
            bench.stop_extender()
            first_s = bench.start_extender(tree)
            rss_after = rss_kib(bench.ext.pid)[0] / 1024  # type: ignore[union-attr]
            pods = bench.cmd(f"pending restart {max(args.per_band // 3, 1)}")
            figures = schedule(bench, pods, names, k, rng)
            restart = {"pods": bench.cmd("check")["pods"], "to_first_filter_s": round(first_s, 2),
                       "extender_cpu_s_to_first_filter": round(bench.start_cpu_s, 2),
                       "rss_after_relist_mib": round(rss_after, 1), "then": figures}
        check = bench.cmd("check")
        return {"cluster": {"nodes": args.nodes, "gpus_per_node": args.gpus, "filter_nodes_per_call": k,
                            "filter_answers": args.filter_answers,
                            "pods_per_band": args.per_band, "warmup_pods": args.warmup,
                            "multi_gpu_pct": args.multi_gpu, "topology": args.topology},
                "first_sync_s": round(sync_s, 2), "first_sync_cpu_s": round(first_cpu, 2),
                "bands": bands, "restart": restart,
                "final": {"fill_pct": round(check["fill"] * 100, 1), "pods": check["pods"],
                          "over_committed_gpus": check["over_committed_gpus"],
                          "gpus_with_40gib_free": check["gpus_with_40gib_free"], "empty_gpus": check["empty_gpus"]},
                "targets": TARGETS}
    finally:
        bench.close()


def report(r: dict) -> None:
    c = r["cluster"]
    print(f"memslice extender benchmark: {c['nodes']} nodes × {c['gpus_per_node']} GPUs, "
          f"{c['filter_nodes_per_call']} names per filter, {c['pods_per_band']} pods scheduled per band "
          f"(first sync {r['first_sync_s']} s)"
          + (f", {c['multi_gpu_pct']:g}% of them on 2 or 4 GPUs" if c.get("multi_gpu_pct") else "")
          + (", GPU topology published" if c.get("topology") else "")
          + ("; filter answers its best nodes, no prioritize (f+p: filter alone)" if c.get("filter_answers") == "best"
             else "; filter answers every node that fits, then prioritize"))
    print("  band  fill%  running  f+p p50  f+p p99   pods/s  CPU ms/pod  max GC ms  full GCs  RSS MiB"
          "  (while growing by watch: max GC ms, full GCs)")
    for b in r["bands"]:
        fp = b["filter_prioritize_ms"]
        print(f"  {b['band_pct']:>3}%  {b['fill_pct']:5.1f}  {b['running_pods']:>7}  {fp['median']:7.2f}  "
              f"{fp['p99']:7.2f}  {b['pods_per_s']:7.1f}  {b['cpu_ms_per_pod']:10.3f}  {b['gc_max_pause_ms']:9.1f}"
              f"  {b['gc_full_collections']:8}  {b['rss_mib']:7.1f}"
              f"  ({b.get('gc_max_pause_ms_while_growing', '-')}, {b.get('gc_full_collections_while_growing', '-')})"
              + (f"  ({b['unschedulable']} unschedulable)" if b["unschedulable"] else "")
              + (f"  bind errors: {b['first_errors']}" if b["bind_errors"] else ""))
    if len(r["bands"]) > 1:
        empty, full = r["bands"][0]["cpu_ms_per_pod"], r["bands"][-1]["cpu_ms_per_pod"]
        print(f"  CPU per pod, fullest band / emptiest: {full / empty:.2f}× "
              f"(target ≤ {TARGETS['cpu_full_over_empty']})")
    if r["restart"]:
        rs = r["restart"]
        print(f"  restart at {rs['pods']} pods: first filter answered after {rs['to_first_filter_s']} s "
              f"({rs.get('extender_cpu_s_to_first_filter', '-')} s of extender CPU), RSS "
              f"{rs['rss_after_relist_mib']} MiB after the relist; then {rs['then']['bound']} pods bound, "
              f"{rs['then']['bind_errors']} bind errors")
    f = r["final"]
    print(f"  final: {f['fill_pct']}% full, {f['pods']} pods, {f['over_committed_gpus']} over-committed GPUs; "
          f"{f['gpus_with_40gib_free']} GPUs with 40 GiB free, {f['empty_gpus']} empty")


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--_extender":
        return serve_extender(sys.argv[2], sys.argv[3:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--filter-nodes", type=int, default=500, help="node names per filter call (0: all)")
    p.add_argument("--bands", default="0,10,30,50,70,90,95",
                   help="fill levels (%%) to prefill to, in order; pods are scheduled at each")
    p.add_argument("--per-band", type=int, default=300, help="pods scheduled through the extender per band")
    p.add_argument("--warmup", type=int, default=0, help="pods scheduled before the first band, not measured")
    p.add_argument("--restart", action="store_true", help="restart the extender at the end (relist timing)")
    p.add_argument("--bind-workers", type=int, default=16, help="binds in flight at most (one connection each)")
    p.add_argument("--client", choices=("python", "go"), default="python",
                   help="the load client: this process's Python (default), or benchmarks/goclient (built with "
                        "`go build` into build/; kube-scheduler's HTTP client behaviour)")
    p.add_argument("--filter-answers", choices=("best", "all"), default="best",
                   help="the extender's --filter-answers: best (deploy/'s default: filter passes its best-scoring "
                        "nodes, no prioritize call follows, the first of them bound) or all (every node that "
                        "fits passed, then prioritize and the best-scored host bound; the earlier configuration)")
    p.add_argument("--go-idle-conns", type=int, default=2,
                   help="--client go: idle keep-alive connections kept per host (kube-scheduler: Go's default, 2)")
    p.add_argument("--go-decode", choices=("bytes", "full"), default="bytes",
                   help="--client go: read the answers as the Python client does (bytes: filter's names echoed, "
                        "the best host scanned off the bytes), or decode them whole with encoding/json as "
                        "kube-scheduler's HTTPExtender does (full)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--scrapers", type=int, default=0, help="clients scraping /metrics in a loop meanwhile")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--restart-at", type=float, default=None, metavar="FRACTION",
                   help="only restarts: prefill to FRACTION (0.15: ~43,000 pods at 5,000 nodes), then start the "
                        "extender --restarts times and time each to its first answered filter")
    p.add_argument("--restarts", type=int, default=3, help="starts with --restart-at (per tree)")
    p.add_argument("--tree", default=None, metavar="DIR",
                   help="run the extender from this tree of the package (its PYTHONPATH: a copy at another commit, "
                        "for runs alternated with this tree's)")
    p.add_argument("--alt-pythonpath", default=None, metavar="DIR",
                   help="with --restart-at: alternate with the package tree in DIR (e.g. a copy of main's)")
    p.add_argument("--multi-gpu", default="0", metavar="PCT[,PCT...]",
                   help="percent of the scheduled pods that span 2 or 4 GPUs (memslice.io/gpu-count; issue 34); "
                        "several: each mix run in turn (see --rounds)")
    p.add_argument("--rounds", type=int, default=1,
                   help="runs of each --multi-gpu mix, interleaved; medians per band and mix")
    p.add_argument("--topology", action="store_true",
                   help="nodes publish their GPUs' topology (NVLink pairs, a PCIe switch per four GPUs)")
    p.add_argument("--_standin", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.client == "go" and args.filter_answers == "best":
        p.error("--client go calls prioritize after filter: run it with --filter-answers all")
    mixes = [float(m) for m in str(args.multi_gpu).split(",")]
    if args._standin:
        args.multi_gpu = mixes[0]
        serve_standin(args)
        return 0
    if args.restart_at is not None:
        args.multi_gpu = mixes[0]
        print(json.dumps(restarts(args), indent=2))
        return 0
    if len(mixes) > 1 or args.rounds > 1:
        compared = compare(args, mixes)
        if args.json:
            print(json.dumps(compared, indent=2))
        else:
            report_compare(compared)
        return 0
    args.multi_gpu = mixes[0]
    result = run(args)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        report(result)
    return 0


def compare(args: argparse.Namespace, mixes: list[float]) -> dict:
    """--rounds runs of each mix, interleaved (the order reversed every other round, so that neither mix
    always runs first on a machine whose load drifts); per band and mix the medians of pods/s and CPU ms per
    pod, and their ratio to the first mix's (pods/s: ≥ 1 is as fast; CPU: ≤ 1 is as cheap)."""
    runs: dict[str, list[dict]] = {f"{m:g}": [] for m in mixes}
    for r in range(args.rounds):
        for m in mixes if r % 2 == 0 else mixes[::-1]:
            result = run(argparse.Namespace(**{**vars(args), "multi_gpu": m}))
            runs[f"{m:g}"].append({"load_avg_1m": round(os.getloadavg()[0], 2), "bands": [
                {k: b[k] for k in ("band_pct", "fill_pct", "pods_per_s", "cpu_ms_per_pod", "unschedulable",
                                   "bind_errors", "client_cpu_ms_per_pod", "standin_cpu_ms_per_pod",
                                   "runqueue_wait_ms_per_pod", "filter_ms")} for b in result["bands"]],
                "over_committed_gpus": result["final"]["over_committed_gpus"]})
    medians: dict[str, list[dict]] = {}
    for mix, rs in runs.items():
        medians[mix] = [{"band_pct": rs[0]["bands"][i]["band_pct"],
                         "pods_per_s": statistics.median(x["bands"][i]["pods_per_s"] for x in rs),
                         "cpu_ms_per_pod": round(statistics.median(x["bands"][i]["cpu_ms_per_pod"] for x in rs), 3),
                         "pods_per_s_range": [min(x["bands"][i]["pods_per_s"] for x in rs),
                                              max(x["bands"][i]["pods_per_s"] for x in rs)],
                         "extender_cpu_per_client_standin_cpu": round(statistics.median(
                             _extender_share(x["bands"][i]) for x in rs), 2)}
                        for i in range(len(rs[0]["bands"]))]
    first = medians[f"{mixes[0]:g}"]
    ratios = {mix: [{"band_pct": b["band_pct"], "pods_per_s": round(b["pods_per_s"] / f["pods_per_s"], 2),
                     "cpu_ms_per_pod": round(b["cpu_ms_per_pod"] / f["cpu_ms_per_pod"], 2),
                     "extender_cpu_per_client_standin_cpu": round(b["extender_cpu_per_client_standin_cpu"]
                                                                  / f["extender_cpu_per_client_standin_cpu"], 2)}
                    for b, f in zip(bands, first, strict=True)] for mix, bands in medians.items()}
    return {"cluster": {"nodes": args.nodes, "gpus_per_node": args.gpus, "filter_nodes_per_call": args.filter_nodes,
                        "filter_answers": args.filter_answers,
                        "pods_per_band": args.per_band, "topology": args.topology, "rounds": args.rounds},
            "runs": runs, "medians": medians, "ratio_to_first_mix": ratios,
            "over_committed_gpus": max(x["over_committed_gpus"] for rs in runs.values() for x in rs)}


def _extender_share(band: dict[str, Any]) -> float:
    """The extender's CPU per pod over the client's and the stand-in's together, in one run's band. Why: on a
    shared machine one process's CPU time per pod varies up to 2x between runs of the same work (the client's
    and the stand-in's, identical per pod in both mixes, vary with it, run by run); this quotient keeps the
    extender's cost and drops most of the machine's (benchmarks/README.md, "the 90 % band")."""
    others = band["client_cpu_ms_per_pod"] + band["standin_cpu_ms_per_pod"]
    return band["cpu_ms_per_pod"] / others if others else 0.0


def report_compare(c: dict) -> None:
    cl = c["cluster"]
    print(f"memslice extender benchmark, mixes compared: {cl['nodes']} nodes × {cl['gpus_per_node']} GPUs, "
          f"{cl['pods_per_band']} pods per band, medians of {cl['rounds']} interleaved rounds"
          + (", GPU topology published" if cl["topology"] else ""))
    print("  % on 2-4 GPUs  band   pods/s  (runs' range)  CPU ms/pod  ext/(client+stand-in) CPU"
          "   (ratio to the first mix: pods/s, CPU, ext share)")
    for mix, bands in c["medians"].items():
        for b, r in zip(bands, c["ratio_to_first_mix"][mix], strict=True):
            lo, hi = b["pods_per_s_range"]
            print(f"  {mix:>13}  {b['band_pct']:>3}%  {b['pods_per_s']:7.1f}  ({lo:5.0f}-{hi:5.0f})  "
                  f"{b['cpu_ms_per_pod']:10.3f}  {b['extender_cpu_per_client_standin_cpu']:24.2f}   "
                  f"({r['pods_per_s']:.2f}×, {r['cpu_ms_per_pod']:.2f}×, "
                  f"{r['extender_cpu_per_client_standin_cpu']:.2f}×)")
    print(f"  over-committed GPUs (most in any run): {c['over_committed_gpus']}")


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark of the memslice scheduler extender on a simulated cluster.

    .venv/bin/python benchmarks/bench_extender.py [--json] [--nodes 5000] [--gpus 8] [--pods 40000]

Three processes, so that the extender's figures are its own:
- the Kubernetes API stand-in (tests/kube_standin.py), filled with N nodes × G GPUs (80 GiB each, with the
  node agent's annotations) and P running pods bound with reservations, plus the pending pods to schedule;
- the extender (`memslice extender`), which lists and watches it like a real cluster;
- this process, calling the extender the way kube-scheduler does: for each pending pod, `filter` with the
  nodes that passed the scheduler's own filters (by default 500 random nodes: kube-scheduler's adaptive
  percentageOfNodesToScore for 5,000 nodes is 10 %), `prioritize` with the nodes that passed, then `bind`
  to the best one. Filter and prioritize are serial (one scheduling cycle at a time); binds are sent on
  their own connections without waiting (up to --bind-workers in flight), as kube-scheduler's binding
  cycles run in goroutines.

Printed: median and p99 latency of filter, prioritize, filter+prioritize (per pod) and bind; sustained
pods/s through all three verbs; the CPU each process spent in that phase (the extender's also split into
user/system, and per pod for filter+prioritize alone in the serial phase), so that a machine too small to
run all three at full speed still shows what the extender itself costs per pod; the extender's resident
memory (now and peak) and its initial sync time.

The load client stays cheap so as not to take the cores from the extender: the filter bodies (pod + 500
sampled node names) are encoded before the clock starts, and it is one thread speaking HTTP/1.1 over plain
sockets (see Client), with orjson. The extender's work is untouched: every call is a full HTTP request,
every bind makes its two writes to the stand-in, and the watch delivers every event.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import select
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from operator import itemgetter
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
GPU_MIB = 81920
# Bytes asked of each recv(): an answer (up to ~20 KB for 500 nodes) in one or two reads. Not 1 MiB: CPython
# allocates the whole size for every recv() (an mmap and munmap at that size), 20 us per call here.
RECV_BYTES = 1 << 16
TARGETS = {"filter_prioritize_p99_ms": 10.0, "pods_per_s": 500.0, "rss_mib": 400.0}


# --------------------------------------------------------------------------------------------- stand-in side

def serve_standin(args: argparse.Namespace) -> None:
    """Child process: build the simulated cluster in the API stand-in and serve it until stdin closes."""
    sys.path.insert(0, str(ROOT / "tests"))
    from kube_standin import KubeApiStandin

    rng = random.Random(args.seed)
    kube = KubeApiStandin().start()
    used: dict[tuple[int, int], int] = {}
    for n in range(args.nodes):
        gpus = [{"uuid": f"GPU-{n:05d}-{g}", "index": g, "model": "Sim H100 80GB", "memMiB": GPU_MIB,
                 "numa": g // 4, "healthy": True} for g in range(args.gpus)]
        kube.put({"kind": "Node", "metadata": {"name": f"node-{n:05d}", "labels": {"memslice.io/gpu": "true"},
                  "annotations": {"memslice.io/gpus": json.dumps(gpus), "memslice.io/unit-mib": "1"}}})
    sizes = (2048, 4096, 8192, 12288, 16384, 24576)
    for i in range(args.pods):
        mib = rng.choice(sizes)
        while True:
            n, g = rng.randrange(args.nodes), rng.randrange(args.gpus)
            if used.get((n, g), 0) + mib <= GPU_MIB:
                break
        used[(n, g)] = used.get((n, g), 0) + mib
        kube.put({"kind": "Pod", "metadata": {
            "name": f"run-{i:06d}", "namespace": f"team-{i % 50}", "annotations": {
                "memslice.io/gpu-uuid": f"GPU-{n:05d}-{g}", "memslice.io/gpu-mem-mib": json.dumps({"main": mib}),
                "memslice.io/assumed-at": "2026-01-01T00:00:00.000000Z"}},
            "spec": {"nodeName": f"node-{n:05d}", "containers": [
                {"name": "main", "image": "cuda", "resources": {"limits": {"memslice.io/gpu-mem": str(mib)}}}]},
            "status": {"phase": "Running"}})
    for i in range(args.pending):
        mib = rng.choice(sizes)
        kube.put({"kind": "Pod", "metadata": {"name": f"new-{i:06d}", "namespace": "bench"},
                  "spec": {"schedulerName": "memslice-scheduler",  # the extender binds only its scheduler's pods
                           "containers": [{"name": "main", "image": "cuda", "resources": {
                               "limits": {"memslice.io/gpu-mem": str(mib)}}}]}})
    print(kube.url, flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    kube.stop()


# --------------------------------------------------------------------------------------------- client side

def _request(verb: str, body: bytes) -> bytes:
    return (f"POST /{verb} HTTP/1.1\r\nHost: extender\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


class _Answers:
    """Splits the bytes read from one keep-alive connection into complete answers (status, body)."""

    def __init__(self) -> None:
        self.buf = b""

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        if not data:
            raise ConnectionError("the extender closed the connection")
        self.buf += data
        out = []
        while True:
            head, sep, rest = self.buf.partition(b"\r\n\r\n")
            if not sep:
                return out
            lines = head.split(b"\r\n")
            length = next(int(v) for k, _, v in (line.partition(b":") for line in lines[1:])
                          if k.strip().lower() == b"content-length")
            if len(rest) < length:
                return out
            out.append((int(lines[0].split()[1]), rest[:length]))
            self.buf = rest[length:]


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

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(self.addr, timeout=60)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def post(self, verb: str, body: object) -> tuple[float, object]:
        """A serial call: (seconds, decoded answer). Bind answers arriving meanwhile are taken in."""
        data = body if isinstance(body, bytes) else orjson.dumps(body)
        t0 = time.perf_counter()
        self.serial.sendall(_request(verb, data))
        while True:
            readable, _, _ = select.select([self.serial, *self.busy], [], [], 60)
            if not readable:
                raise TimeoutError(f"{verb}: no answer in 60 s")
            for sock in readable:
                if sock is not self.serial:
                    self._bind_answer(sock)
            if self.serial in readable and (answers := self.serial_answers.feed(self.serial.recv(RECV_BYTES))):
                status, raw = answers[0]
                dt = time.perf_counter() - t0
                if status != 200:
                    raise RuntimeError(f"{verb}: HTTP {status} {raw[:200]!r}")
                return dt, orjson.loads(raw)

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
        for status, raw in answers.feed(sock.recv(RECV_BYTES)):
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


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def pending_pod(name: str, mib: int) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "bench"},
            "spec": {"schedulerName": "memslice-scheduler",  # the extender binds only its scheduler's pods
                     "containers": [{"name": "main", "image": "cuda",
                                     "resources": {"limits": {"memslice.io/gpu-mem": str(mib)}}}]}}


def run(args: argparse.Namespace) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    t_build = time.monotonic()
    standin = subprocess.Popen([sys.executable, __file__, "--_standin", "--nodes", str(args.nodes),
                                "--gpus", str(args.gpus), "--pods", str(args.pods), "--pending", str(args.pending),
                                "--seed", str(args.seed)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                               env=env)
    ext = None
    try:
        assert standin.stdout is not None
        url = standin.stdout.readline().strip()
        if not url.startswith("http"):
            raise RuntimeError("the API stand-in did not start")
        build_s = time.monotonic() - t_build
        kubeconfig = Path(tempfile.mkdtemp()) / "kubeconfig"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "bench",
            "clusters": [{"name": "bench", "cluster": {"server": url}}],
            "users": [{"name": "bench", "user": {"token": "bench"}}],
            "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}]}))
        t_sync = time.monotonic()
        ext = subprocess.Popen([sys.executable, "-m", "memslice", "extender", "--kubeconfig", str(kubeconfig),
                                "--address", "127.0.0.1", "--port", "0", "--log-level", "warning"],
                               stdout=subprocess.PIPE, text=True, env=env)
        assert ext.stdout is not None
        line = ext.stdout.readline()
        if "serving" not in line:
            raise RuntimeError(f"the extender did not start: {line!r}")
        port = int(line.split("serving ", 1)[1].split()[0].rsplit(":", 1)[1])
        conn = Client("127.0.0.1", port, args.bind_workers)
        if "synced" not in ext.stdout.readline():  # printed once its first list of nodes and pods is in
            raise RuntimeError("the extender stopped before it synced with the API stand-in")
        sync_s = time.monotonic() - t_sync
        rss_synced, _ = rss_kib(ext.pid)

        rng = random.Random(args.seed + 1)
        names = [f"node-{n:05d}" for n in range(args.nodes)]
        k = min(args.filter_nodes, len(names))

        # Phase 1: latency of filter + prioritize alone (no binds running), serial like a scheduling cycle
        lat_f: list[float] = []
        lat_p: list[float] = []
        cpu_fp0 = cpu_s(ext.pid)
        for i in range(args.latency_samples):
            pod = pending_pod(f"probe-{i}", rng.choice((2048, 4096, 8192, 16384)))
            pod["metadata"]["uid"] = f"probe-{i}"
            dt_f, res = conn.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": rng.sample(names, k)})
            passed = res["NodeNames"] or []
            dt_p, _ = conn.post("prioritize", {"Pod": pod, "Nodes": None, "NodeNames": passed})
            lat_f.append(dt_f)
            lat_p.append(dt_p)
        lat_fp = [a + b for a, b in zip(lat_f, lat_p, strict=True)]
        cpu_fp = cpu_s(ext.pid) - cpu_fp0

        # Phase 2: sustained scheduling of the pending pods through filter, prioritize and bind
        lat_f2: list[float] = []
        lat_p2: list[float] = []
        failures: list[str] = []
        pods = json.loads(_get(url, "/api/v1/namespaces/bench/pods"))["items"]
        # The scheduler's side of the work that is not the extender's (its own filters choosing the 500
        # candidate nodes, encoding the pod) is done before the clock starts: kube-scheduler does it in Go,
        # and on this 2-core machine the client's Python would otherwise compete with the extender for CPU.
        filter_bodies = [orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": rng.sample(names, k)})
                         for pod in pods]
        by_score = itemgetter("Score")
        pod_json = [orjson.dumps(pod) for pod in pods]
        split0 = cpu_split(ext.pid)
        cpu0 = {"extender": cpu_s(ext.pid), "standin": cpu_s(standin.pid), "client": time.process_time()}
        t0 = time.perf_counter()
        for pod, filter_body, pod_text in zip(pods, filter_bodies, pod_json, strict=True):
            dt_f, res = conn.post("filter", filter_body)
            passed = res["NodeNames"] or []  # type: ignore[index]
            lat_f2.append(dt_f)
            if not passed:
                failures.append("no node passed filter")
                continue
            body = b'{"Pod":' + pod_text + b',"Nodes":null,"NodeNames":' + orjson.dumps(passed) + b"}"
            dt_p, scores = conn.post("prioritize", body)
            lat_p2.append(dt_p)
            best = max(scores, key=by_score)["Host"]  # type: ignore[arg-type]
            conn.bind({"PodName": pod["metadata"]["name"], "PodNamespace": "bench",
                       "PodUID": pod["metadata"]["uid"], "Node": best})
        conn.drain()
        wall = time.perf_counter() - t0
        lat_b = conn.bind_latencies
        failures += conn.bind_errors
        cpu = {"extender": cpu_s(ext.pid) - cpu0["extender"], "standin": cpu_s(standin.pid) - cpu0["standin"],
               "client": time.process_time() - cpu0["client"]}
        split = [b - a for a, b in zip(split0, cpu_split(ext.pid), strict=True)]
        rss_now, rss_peak = rss_kib(ext.pid)
        bound = len(lat_b) - len(conn.bind_errors)

        ms = 1000.0
        return {
            "cluster": {"nodes": args.nodes, "gpus_per_node": args.gpus, "running_pods": args.pods,
                        "scheduled_pods": len(pods), "filter_nodes_per_call": k},
            "setup_s": {"build_standin": round(build_s, 1), "extender_initial_sync": round(sync_s, 1)},
            "latency_ms_idle": {
                "filter": {"median": statistics.median(lat_f) * ms, "p99": pct(lat_f, 99) * ms},
                "prioritize": {"median": statistics.median(lat_p) * ms, "p99": pct(lat_p, 99) * ms},
                "filter+prioritize": {"median": statistics.median(lat_fp) * ms, "p99": pct(lat_fp, 99) * ms}},
            "latency_ms_under_load": {
                "filter": {"median": statistics.median(lat_f2) * ms, "p99": pct(lat_f2, 99) * ms},
                "prioritize": {"median": statistics.median(lat_p2) * ms, "p99": pct(lat_p2, 99) * ms},
                "bind": {"median": statistics.median(lat_b) * ms, "p99": pct(lat_b, 99) * ms}},
            "throughput": {"pods_bound": bound, "bind_errors": len(failures), "wall_s": round(wall, 2),
                           "pods_per_s": round(bound / wall, 1),
                           "cpu_s": {k: round(v, 2) for k, v in cpu.items()},
                           "extender_cpu_user_sys_s": [round(v, 2) for v in split],
                           "extender_cpu_ms_per_pod": round(cpu["extender"] / max(bound, 1) * 1000, 2),
                           "pods_per_extender_cpu_s": round(bound / max(cpu["extender"], 1e-9), 1),
                           "extender_cpu_ms_per_filter_prioritize": round(
                               cpu_fp / max(args.latency_samples, 1) * 1000, 2)},
            "extender_rss_mib": {"after_sync": round(rss_synced / 1024, 1), "end": round(rss_now / 1024, 1),
                                 "peak": round(rss_peak / 1024, 1)},
            "targets": TARGETS,
            "first_errors": failures[:3],
        }
    finally:
        if ext is not None:
            ext.terminate()
            ext.wait(10)
        if standin.stdin:
            standin.stdin.close()
        standin.wait(30)


def _get(url: str, path: str) -> bytes:
    host, port = url.split("//", 1)[1].split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=60)
    c.request("GET", path)
    return c.getresponse().read()


def report(r: dict) -> None:
    c = r["cluster"]
    print(f"memslice extender benchmark: {c['nodes']} nodes × {c['gpus_per_node']} GPUs, {c['running_pods']} "
          f"running pods, {c['scheduled_pods']} pods scheduled, {c['filter_nodes_per_call']} nodes per filter")
    print(f"  setup: stand-in built in {r['setup_s']['build_standin']} s, extender synced in "
          f"{r['setup_s']['extender_initial_sync']} s")
    for phase, title in (("latency_ms_idle", "latency, serial (ms)"),
                         ("latency_ms_under_load", "latency while scheduling with binds in flight (ms)")):
        print(f"  {title}:")
        for verb, v in r[phase].items():
            print(f"    {verb:<18} median {v['median']:7.2f}   p99 {v['p99']:7.2f}")
    t = r["throughput"]
    print(f"  throughput: {t['pods_bound']} pods bound in {t['wall_s']} s = {t['pods_per_s']} pods/s "
          f"({t['bind_errors']} errors)")
    print(f"  CPU in that phase: extender {t['cpu_s']['extender']} s, API stand-in {t['cpu_s']['standin']} s, "
          f"benchmark client {t['cpu_s']['client']} s on {os.cpu_count()} cores; the extender spent "
          f"{t['extender_cpu_ms_per_pod']} ms CPU per pod = {t['pods_per_extender_cpu_s']} pods per CPU-second "
          f"(user {t['extender_cpu_user_sys_s'][0]} s, system {t['extender_cpu_user_sys_s'][1]} s; filter + "
          f"prioritize alone: {t['extender_cpu_ms_per_filter_prioritize']} ms CPU per pod in the serial phase)")
    m = r["extender_rss_mib"]
    print(f"  extender RSS: {m['after_sync']} MiB after sync, {m['end']} MiB at the end, peak {m['peak']} MiB")
    fp99 = r["latency_ms_idle"]["filter+prioritize"]["p99"]
    print(f"  targets: filter+prioritize p99 {fp99:.2f} ms < {TARGETS['filter_prioritize_p99_ms']} ms: "
          f"{'met' if fp99 < TARGETS['filter_prioritize_p99_ms'] else 'MISSED'}; "
          f"{t['pods_per_s']} pods/s >= {TARGETS['pods_per_s']}: "
          f"{'met' if t['pods_per_s'] >= TARGETS['pods_per_s'] else 'MISSED'}; "
          f"peak RSS {m['peak']} MiB < {TARGETS['rss_mib']}: {'met' if m['peak'] < TARGETS['rss_mib'] else 'MISSED'}")
    if r["first_errors"]:
        print(f"  first errors: {r['first_errors']}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--pods", type=int, default=40000, help="running pods (bound, with reservations)")
    p.add_argument("--pending", type=int, default=3000, help="pods to schedule in the throughput phase")
    p.add_argument("--filter-nodes", type=int, default=500, help="node names per filter call")
    p.add_argument("--latency-samples", type=int, default=1000)
    p.add_argument("--bind-workers", type=int, default=16, help="binds in flight at most (one connection each)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--_standin", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._standin:
        serve_standin(args)
        return 0
    result = run(args)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Pods per second through the real kube-scheduler, with and without the memslice extender, and what the
extender costs (issues 28 and 39).

One real control plane (tests/support/kube_real.py: kube-apiserver with an embedded etcd, built by `make
kubecluster`), N nodes with 8 GPUs each (as tests/realcluster/test_real_scheduler.py registers them),
then two runs on the
same cluster, one after the other:

- extender: deploy/base's scheduler configuration (the memslice-scheduler profile, the extender with filter,
  bind and preempt in plain HTTP on loopback, as the container beside kube-scheduler in its pod is reached,
  under the scheduler's account; filter passes only its best-scoring nodes, no prioritize); the extender is a
  process of its own (this script with --serve-extender), so its CPU time is its own; `--also-all` adds runs
  as before that (filter passes every fitting node, prioritize at weight 5), interleaved;
- with `--mtls`, also an extender run in the shape of deploy/components/standalone-extender (its own account,
  mutual TLS, the certificates its Job makes, the component's scheduler configuration), for comparison;
- plain: the same kube-scheduler binary with deploy/'s configuration minus the extender (the scheduler's own
  node-level fit of memslice.io/gpu-mem only, its own binding).

Each run creates P pending pods (sizes drawn as in the test) before its scheduler starts, then starts it and
waits until every pod is bound. Figures, per run, from the API server's audit log (its own timestamps):
pods/s = (bindings - 1) / (last binding - first binding), and each Binding's latency in the API server. For
the extender run also: its CPU per pod (the process's user+system time over the burst / P), and its bind
latency (the whole bind verb, the API write included, as the scheduler waits for it). Then the ratios the
issue's goals are stated in: pods/s with / without; bind p99 - the plain scheduler's Binding p99; and the
correctness of the placement (every pod bound, on a GPU of its node, no GPU over its memory).

The same point on both sides (issue 39): kube-scheduler's own metrics, read from its /metrics before it stops
(each run's scheduler is a process of its own): the attempt (`scheduler_scheduling_attempt_duration_seconds`,
result "scheduled": its algorithm and its binding, which holds the plain scheduler's wait in its client's QPS
limiter and the extender's whole bind verb), the algorithm alone, the SLI, and the Bind extension point (the bind
plugins only: an extender's bind never reaches it, and its buckets end at 204.8 ms); the API server's own
histogram of Bindings (the difference over the run); in the extender, each bind write's wait for a connection of
its pool and its exchange with the API server. The load average at the start and the end is recorded.
`--also-gate N [N...]` adds sidecar runs whose filter is gated at N binds in flight (edge/gate.py; 0: no gate, as
before), interleaved; `--bind-gate N` sets the first sidecar run's.

`--pprof DIR` writes Go CPU profiles of the API server and each run's kube-scheduler (`go tool pprof -top FILE`).

`--rounds N` repeats the runs (interleaved: sidecar, mTLS, plain; round after round on the same cluster) and
reports each figure's median. New connections are counted in the extender: those kube-scheduler opened to it,
and those its bind writes opened to the API server (podwrites.PodWriter). `--cpus 0` pins everything (API
server, schedulers, extender, this process) to those CPUs (sched_setaffinity before anything starts; children
inherit it). `--breakdown` has the extender account its CPU by activity
(TLS handshakes, each verb's request, watch events) and prints it; `--profile FILE` writes a pstats file of
its connection threads and watch events, timed by CPU. `--json` prints one JSON object.

    .venv/bin/python benchmarks/bench_real_scheduler.py [--nodes 20] [--pods 400] [--cpus 0] [--breakdown]
        [--mtls] [--rounds 2] [--also-all] [--also-gate 4 0] [--extender-only] [--pprof DIR] [--json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import selectors
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import psutil
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
__import__("testpaths").add()  # the test folders (tests/testpaths.py)

GIB = 1024
EXTENDER_START_S = 120.0


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


# ------------------------------------------------------------------------------------- the components' metrics
# Names and labels from the source of the version built (k8s.io/kubernetes v1.37.2): pkg/scheduler/metrics/
# metrics.go and k8s.io/apiserver pkg/endpoints/metrics/metrics.go.
SCHED_EXTENSION_POINT = "scheduler_framework_extension_point_duration_seconds"  # buckets 0.1 ms × 2^k, k < 12
SCHED_ATTEMPT = "scheduler_scheduling_attempt_duration_seconds"  # algorithm + binding; 1 ms × 2^k, k < 15
SCHED_ALGORITHM = "scheduler_scheduling_algorithm_duration_seconds"
SCHED_SLI = "scheduler_pod_scheduling_sli_duration_seconds"  # first attempt to bound; 10 ms × 2^k, k < 20
API_REQUEST = "apiserver_request_duration_seconds"  # 5 ms .. 60 s, 23 fixed buckets


def histograms(text: str, name: str, **labels: str) -> dict[float, float]:
    """The cumulative bucket counts {upper bound: count} of metric `name` in a Prometheus text page, summed
    over the series whose labels include `labels`."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name != name + "_bucket" or any(sample.labels.get(k) != v for k, v in labels.items()):
                continue
            le = float(sample.labels["le"])
            out[le] = out.get(le, 0.0) + sample.value
    return out


def histogram_delta(after: dict[float, float], before: dict[float, float]) -> dict[float, float]:
    return {le: n - before.get(le, 0.0) for le, n in after.items()}


def histogram_quantile(q: float, buckets: dict[float, float]) -> float:
    """Prometheus' histogram_quantile: linear within the bucket the rank falls in; +inf when it falls in the
    last one (above the largest finite bound: the histogram cannot say how far), nan when empty."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return float("nan")
    rank, lower, below = q * total, 0.0, 0.0
    for le in bounds:
        if buckets[le] >= rank:
            if le == float("inf"):
                return le
            return lower + (le - lower) * (rank - below) / max(buckets[le] - below, 1e-9)
        lower, below = le, buckets[le]
    return float("inf")


def histogram_figures(prefix: str, buckets: dict[float, float]) -> dict[str, float]:
    """Count, p50 and p99 (ms) of a histogram's buckets."""
    return {f"{prefix}_count": buckets.get(float("inf"), 0.0),
            f"{prefix}_ms_p50": 1000 * histogram_quantile(0.5, buckets),
            f"{prefix}_ms_p99": 1000 * histogram_quantile(0.99, buckets)}


def apiserver_bindings(cluster: Any) -> dict[float, float]:
    """The API server's own latency histogram of Binding creations (POST pods/binding), all callers."""
    return histograms(cluster.ok("GET", "/metrics"), API_REQUEST, verb="POST", resource="pods",
                      subresource="binding")


SCHEDULER_METRICS_FLAGS = ("--bind-address=127.0.0.1", "--authorization-always-allow-paths=/healthz,/readyz,"
                           "/livez,/metrics,/debug/pprof/*")


class GoProfiles:
    """`--pprof DIR`: CPU profiles (Go's /debug/pprof/profile, `go tool pprof` reads them) of the API server and
    of the run's kube-scheduler (its profiling is on by default; the benchmark allows the path), each over the
    same `seconds` from the moment the scheduler's port answers, written as DIR/<run>-<process>.pb.gz."""

    def __init__(self, cluster: Any, sched_port: int, out: Path | None, run: str, seconds: float) -> None:
        self.threads: list[threading.Thread] = []
        if out is None:
            return
        import ssl

        out.mkdir(parents=True, exist_ok=True)
        insecure = ssl.create_default_context()
        insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE  # the scheduler's self-signed cert
        sched = f"https://127.0.0.1:{sched_port}"
        self._wait_port(sched + "/healthz", insecure)
        query = f"/debug/pprof/profile?seconds={seconds:g}"
        from kube_real import ADMIN_TOKEN

        for name, url, ctx, headers in (
                ("kube-scheduler", sched + query, insecure, {}),
                ("kube-apiserver", cluster.url + query, cluster.ssl_context(),
                 {"Authorization": f"Bearer {ADMIN_TOKEN}"})):
            t = threading.Thread(target=self._fetch, args=(url, ctx, headers, out / f"{run}-{name}.pb.gz",
                                                           seconds + 60), daemon=True)
            t.start()
            self.threads.append(t)

    @staticmethod
    def _wait_port(url: str, ctx: Any) -> None:
        import urllib.request

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, context=ctx, timeout=5):
                    return
            except OSError:
                time.sleep(0.05)  # polling a port until it serves (bounded by the deadline)
        raise AssertionError(f"{url} did not answer within 60 s")

    @staticmethod
    def _fetch(url: str, ctx: Any, headers: dict[str, str], path: Path, timeout: float) -> None:
        import urllib.request

        req = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(req, context=ctx, timeout=timeout) as resp:
            path.write_bytes(resp.read())

    def join(self) -> None:
        for t in self.threads:
            t.join(120)


def scheduler_metrics(port: int, profile: str) -> dict[str, float]:
    """kube-scheduler's own view of its pods (its /metrics on `port`, one process per run): the Bind extension
    point (the bind plugins only: an extender's bind is called before them and is not in it, schedule_one.go
    `bind`), the whole attempt (algorithm + binding, the same point on both sides), the algorithm alone, and
    the SLI (first attempt to bound)."""
    import ssl
    import urllib.request

    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # its self-signed serving certificate, loopback
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=ctx, timeout=30) as resp:
        text = resp.read().decode()
    out = histogram_figures("sched_bind_extension_point", histograms(
        text, SCHED_EXTENSION_POINT, extension_point="Bind", status="Success", profile=profile))
    out |= histogram_figures("sched_attempt", histograms(text, SCHED_ATTEMPT, result="scheduled", profile=profile))
    out |= histogram_figures("sched_algorithm", histograms(text, SCHED_ALGORITHM))
    out |= histogram_figures("sched_sli", histograms(text, SCHED_SLI))
    return out


# ---------------------------------------------------------------------------------------------- the extender
def serve_extender(args: argparse.Namespace) -> int:
    """The extender as deploy/ runs it (plain HTTP on loopback; with --tls-dir, mutual TLS), in this process;
    prints its port, then READY once synced. On SIGTERM writes {"binds": [seconds of each bind verb],
    "connections": {...}, "breakdown": {...}} to --times-out and exits."""
    from memslice.kube.config import load_api_client
    from memslice.scheduler_extender.app import Config, Extender

    acct = install_breakdown() if args.breakdown else None
    dump = install_profile() if args.profile else None
    connections = count_connections()
    phases = time_bind_phases()
    if args.write_pool:
        from memslice.scheduler_extender.kubeio import podwrites

        podwrites.MAX_CONNECTIONS = args.write_pool
    api, _ = load_api_client(args.kubeconfig, pool_maxsize=16)
    tls = Path(args.tls_dir) if args.tls_dir else None
    files = {} if tls is None else dict(tls_cert_file=str(tls / "tls.crt"), tls_key_file=str(tls / "tls.key"),
                                        tls_client_ca_file=str(tls / "ca.crt"))
    ext = Extender(api, Config(address="127.0.0.1", port=0, filter_answers=args.filter_answers, **files)).start()
    if args.bind_gate is not None:  # 0: no gate (filter never waits), as before it
        ext.verbs.gate.limit = args.bind_gate or 1 << 30
    binds: list[float] = []
    inner = ext.verbs.bind

    def bind(body: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return inner(body)
        finally:
            binds.append(time.perf_counter() - t0)

    ext.verbs.bind = bind  # type: ignore[method-assign]  # the server looks the verb up on the instance
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    print(f"PORT {ext.port}", flush=True)
    if not ext.wait_synced(60):
        print("NOT SYNCED", flush=True)
        return 1
    print("READY", flush=True)
    while not done.wait(1.0):
        pass
    Path(args.times_out).write_bytes(orjson.dumps({"binds": binds, "connections": dict(connections),
                                                   "phases": phases, "breakdown": acct() if acct else {},
                                                   "gate": {"waited": ext.verbs.gate.waited,
                                                            "timed_out": ext.verbs.gate.timed_out}}))
    if dump is not None:
        dump(args.profile)
    ext.stop()
    return 0


def count_connections() -> Counter[str]:
    """Count the connections kube-scheduler opens to the extender (each gets a thread) and those the bind
    writes open to the API server."""
    from memslice import lean_http
    from memslice.scheduler_extender.kubeio import podwrites

    counts: Counter[str] = Counter()

    def wrap(cls: Any, name: str, key: str) -> None:
        inner = getattr(cls, name)

        def counted(self: Any, *a: Any) -> Any:
            counts[key] += 1  # Counter += under the GIL: one bytecode-level race at worst; a count, not a lock
            return inner(self, *a)

        setattr(cls, name, counted)

    wrap(lean_http.BoundedHTTPServer, "process_request_thread", "scheduler_to_extender")
    wrap(podwrites.PodWriter, "_connect", "bind_writes_to_api_server")
    return counts


def time_bind_phases() -> dict[str, list[float]]:
    """Seconds of each bind write's two phases in the extender: taking a connection of the write pool (waiting
    for one while all MAX_CONNECTIONS are busy, or opening one), and the exchange with the API server (send the
    Binding, read the answer). The rest of a bind verb is the extender's own (the pod's facts, the choice)."""
    from memslice.scheduler_extender.kubeio import podwrites

    phases: dict[str, list[float]] = {"pool_wait": [], "api_exchange": []}

    def wrap(cls: Any, name: str, key: str) -> None:
        inner = getattr(cls, name)

        def timed(self: Any, *a: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return inner(self, *a)
            finally:
                phases[key].append(time.perf_counter() - t0)  # list.append: atomic under the GIL

        setattr(cls, name, timed)

    wrap(podwrites.PodWriter, "_take", "pool_wait")
    wrap(podwrites._Connection, "exchange", "api_exchange")
    return phases


def install_breakdown(requests: bool = False) -> Any:
    """Wrap the extender's handlers to add each one's thread CPU time to a counter; returns a snapshot function
    ({activity: [seconds, calls]}). `requests`: also each whole request on a connection (its head read and
    parsed, the verb, the answer written: "request, in all")."""
    from memslice import lean_http
    from memslice.kube import informer
    from memslice.scheduler_extender.edge import server

    cpu: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    lock = threading.Lock()

    def wrap(cls: Any, name: str, label: Any) -> None:
        inner = getattr(cls, name)

        def timed(self: Any, *a: Any) -> Any:
            t0 = time.thread_time()
            try:
                return inner(self, *a)
            finally:
                key = label(self)
                with lock:
                    cpu[key] += time.thread_time() - t0
                    calls[key] += 1

        setattr(cls, name, timed)

    wrap(lean_http.BoundedHTTPServer, "_handshake", lambda s: "TLS handshake")
    wrap(lean_http.BoundedHTTPServer, "process_request_thread", lambda s: "connection threads, in all")
    wrap(server._Handler, "do_POST", lambda s: "verb " + s.path.rsplit("/", 1)[-1])
    wrap(informer.Informer, "_event", lambda s: "watch event, " + s.kind)
    if requests:
        wrap(lean_http.LeanRequestHandler, "handle_one_request", lambda s: "request, in all")
    return lambda: {k: [cpu[k], calls[k]] for k in cpu}


def install_profile() -> Any:
    """cProfile, timed by each thread's CPU clock, around every connection's thread and the watch threads'
    event handling; returns a function that writes the merged pstats to a file."""
    import cProfile
    import pstats

    from memslice import lean_http
    from memslice.kube import informer

    profiles: list[cProfile.Profile] = []
    lock = threading.Lock()

    def wrap(cls: Any, name: str) -> None:
        inner = getattr(cls, name)

        def profiled(self: Any, *a: Any) -> Any:
            prof = cProfile.Profile(time.thread_time)
            try:
                return prof.runcall(inner, self, *a)
            finally:
                with lock:
                    profiles.append(prof)

        setattr(cls, name, profiled)

    wrap(lean_http.BoundedHTTPServer, "process_request_thread")
    wrap(informer.Informer, "_event")

    def dump(path: str) -> None:
        with lock:
            stats = pstats.Stats(profiles[0])
            for prof in profiles[1:]:
                stats.add(prof)
        stats.dump_stats(path)

    return dump


class ExtenderProc:
    def __init__(self, kubeconfig: Path, tls: Path | None, out: Path, breakdown: bool, profile: str | None,
                 write_pool: int | None = None, bind_gate: int | None = None, filter_answers: str = "best") -> None:
        self.out = out
        cmd = [sys.executable, __file__, "--serve-extender", "--kubeconfig", str(kubeconfig), "--times-out",
               str(out)] + (["--tls-dir", str(tls)] if tls else []) + (["--breakdown"] if breakdown else []) + (
               ["--profile", profile] if profile else []) + (["--write-pool", str(write_pool)] if write_pool else [])
        cmd += ["--bind-gate", str(bind_gate)] if bind_gate is not None else []
        cmd += ["--filter-answers", filter_answers]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        self.ps = psutil.Process(self.proc.pid)
        self.port = int(self._line("PORT").split()[1])
        self._line("READY")

    def _line(self, prefix: str) -> str:
        """The child's next line, which must start with `prefix`, within EXTENDER_START_S."""
        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        if not sel.select(EXTENDER_START_S):
            raise AssertionError(f"the extender printed no {prefix} within {EXTENDER_START_S:g} s")
        line = self.proc.stdout.readline()
        if not line.startswith(prefix):
            raise AssertionError(f"the extender printed {line!r}, expected {prefix}")
        return line

    def cpu_s(self) -> float:
        t = self.ps.cpu_times()
        return float(t.user + t.system)

    def stop(self) -> dict[str, Any]:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        return dict(orjson.loads(self.out.read_bytes())) if self.out.exists() else {}


# ---------------------------------------------------------------------------------------------- the runs
def create_pending(cluster: Any, n: int, scheduler_name: str, seed: int) -> None:
    from test_real_scheduler import NS, pod_body

    rng = random.Random(seed)
    bodies = []
    for i in range(n):
        body = pod_body(f"b{i:05d}", rng.choice((1, 2, 4, 6, 8)) * GIB, "main")
        body["spec"]["schedulerName"] = scheduler_name
        bodies.append(body)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda b: cluster.ok("POST", f"/api/v1/namespaces/{NS}/pods", b), bodies))


def wait_all_bound(cluster: Any, timeout: float) -> float:
    """Seconds until no pod of the namespace is unbound (one cheap list per poll: limit=1)."""
    from kube_real import wait_until
    from test_real_scheduler import NS

    start = time.monotonic()
    wait_until("every pod bound", lambda: not cluster.ok(
        "GET", f"/api/v1/namespaces/{NS}/pods?fieldSelector=spec.nodeName%3D&limit=1")["items"], timeout, 0.1)
    return time.monotonic() - start


def _ts(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def bindings(cluster: Any, user: str, since: float) -> list[tuple[float, float]]:
    """(completed at, latency s) of each successful Binding of the namespace's pods made by `user` after
    `since` (epoch seconds), from the API server's audit log."""
    from test_real_scheduler import NS

    out = []
    with cluster.audit_log.open("rb") as f:
        for line in f:
            if b'"binding"' not in line:
                continue
            ev = orjson.loads(line)
            ref = ev.get("objectRef") or {}
            if (ev.get("stage") != "ResponseComplete" or ev.get("verb") != "create" or ref.get("subresource") !=
                    "binding" or ref.get("namespace") != NS or (ev.get("user") or {}).get("username") != user
                    or (ev.get("responseStatus") or {}).get("code") != 201):
                continue
            done = _ts(ev["stageTimestamp"])
            if done >= since:
                out.append((done, done - _ts(ev["requestReceivedTimestamp"])))
    return sorted(out)


def run_figures(binds: list[tuple[float, float]], pods: int) -> dict[str, float]:
    done = [b[0] for b in binds]
    lat = [b[1] for b in binds]
    span = done[-1] - done[0] if len(done) > 1 else float("nan")
    return {"bindings": len(binds), "pods_per_s": (len(done) - 1) / span if span else float("nan"),
            "burst_s": span, "binding_ms_p50": 1000 * quantile(lat, 0.5), "binding_ms_p99": 1000 * quantile(lat, 0.99),
            "bound_all": float(len(binds) == pods)}


def check_placement(cluster: Any, nodes: int) -> int:
    """Every pod bound on a GPU of its node, no GPU over its memory; the number of GPUs used."""
    from test_real_scheduler import NS, SIZES_GIB

    size = {f"GPU-gpu-{i:02d}-{g}": SIZES_GIB[i % 4] * GIB for i in range(nodes) for g in range(8)}
    used: dict[str, int] = {}
    for p in cluster.ok("GET", f"/api/v1/namespaces/{NS}/pods?limit=10000")["items"]:
        node = p["spec"].get("nodeName")
        ann = p["metadata"].get("annotations") or {}
        uuid = ann.get("memslice.io/gpu-uuid", "")
        assert node and uuid.startswith(f"GPU-{node}-"), (p["metadata"]["name"], node, uuid)
        used[uuid] = used.get(uuid, 0) + sum(json.loads(ann["memslice.io/gpu-mem-mib"]).values())
    over = {u: (m, size[u]) for u, m in used.items() if m > size[u]}
    assert not over, f"GPUs over their memory: {over}"
    return len(used)


def delete_pods(cluster: Any) -> None:
    from kube_real import wait_until
    from test_real_scheduler import NS

    cluster.ok("DELETE", f"/api/v1/namespaces/{NS}/pods", {"gracePeriodSeconds": 0})
    wait_until("pods deleted", lambda: not cluster.ok("GET", f"/api/v1/namespaces/{NS}/pods?limit=1")["items"],
               120, 0.5)


class Processes:
    """CPU time of each process of a run from now on: the API server, the scheduler, the extender, this one."""

    def __init__(self, cluster: Any, sched: Any, ext: psutil.Process | None) -> None:
        self.procs = {"kube-apiserver": psutil.Process(cluster.procs[0].proc.pid),
                      "kube-scheduler": psutil.Process(sched.proc.pid), "benchmark client": psutil.Process()}
        if ext is not None:
            self.procs["extender"] = ext
        self.t0 = time.monotonic()
        self.start = {k: self._cpu(p) for k, p in self.procs.items()}

    @staticmethod
    def _cpu(p: psutil.Process) -> float:
        t = p.cpu_times()
        return float(t.user + t.system + t.children_user + t.children_system)

    def ms_per_pod(self, pods: int) -> dict[str, float]:
        """Each process's CPU ms per pod since __init__, and the wall time × the CPUs it could use, per pod."""
        out = {k: round(1000 * (self._cpu(p) - self.start[k]) / pods, 2) for k, p in self.procs.items()}
        out["wall x CPUs"] = round(1000 * (time.monotonic() - self.t0) * len(os.sched_getaffinity(0)) / pods, 2)
        return out


def tls_files(cluster: Any, out: Path) -> Path:
    """`memslice extender-certs` as deploy/components/standalone-extender's Job runs it (its ServiceAccount's
    token), then the two Secrets' files as the extender's and the scheduler's volumes mount them."""
    import base64

    from test_deploy_render import NAMESPACE

    kc = cluster.kubeconfig("extender-certs", cluster.token(NAMESPACE, "memslice-extender-certs"))
    run = subprocess.run([sys.executable, "-m", "memslice", "extender-certs", "--kubeconfig", str(kc)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    for secret in ("memslice-extender-tls", "memslice-scheduler-extender-client"):
        data = cluster.ok("GET", f"/api/v1/namespaces/{NAMESPACE}/secrets/{secret}")["data"]
        (out / secret).mkdir(parents=True)
        for key, value in data.items():
            (out / secret / key).write_bytes(base64.b64decode(value))
    return out


def mtls_scheduler_config(cluster: Any, ext_port: int, tls: Path) -> dict[str, Any]:
    """deploy/components/standalone-extender's scheduler configuration: the extender's Service name checked
    against its certificate (serverName), reached on loopback here, with the scheduler's client certificate."""
    import re

    from test_deploy_render import NAMESPACE, render

    objs = render("overlays/standalone-extender")
    cm = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith(
        "memslice-scheduler-config"))
    config = yaml.safe_load(cm["data"]["scheduler-config.yaml"])
    token = cluster.token(NAMESPACE, "memslice-scheduler")
    config["clientConnection"] = {"kubeconfig": str(cluster.kubeconfig("memslice-scheduler", token))}
    (ext,) = config["extenders"]
    host = re.fullmatch(r"https://([^:/]+):8888", ext["urlPrefix"])
    assert host, ext["urlPrefix"]
    ext["urlPrefix"] = f"https://127.0.0.1:{ext_port}"
    client = tls / "memslice-scheduler-extender-client"
    ext["tlsConfig"] = {"certFile": str(client / "tls.crt"), "keyFile": str(client / "tls.key"),
                        "caFile": str(client / "ca.crt"), "serverName": host.group(1)}
    return config


def extender_run(args: argparse.Namespace, cluster: Any, tmp: Path, shape: str, n: int) -> dict[str, Any]:
    """One burst through kube-scheduler and the extender in `shape` ("sidecar": deploy/base; "mtls":
    deploy/components/standalone-extender); the pods are deleted after it."""
    import test_real_scheduler as rs
    from kube_real import free_port
    from test_deploy_render import NAMESPACE

    out: dict[str, Any] = {}
    tls: Path | None = None
    account = "memslice-scheduler"  # deploy/base: the account of the scheduler's pods, the extender's too
    if shape == "mtls":
        tls, account = tmp / "tls", "memslice-extender"
        if not tls.exists():
            tls_files(cluster, tls)
    kubeconfig = cluster.kubeconfig(f"ext-{shape}", cluster.token(NAMESPACE, account))
    server = None if tls is None else tls / "memslice-extender-tls"
    ext = ExtenderProc(kubeconfig, server, tmp / f"ext-{shape}-{n}.json", args.breakdown, args.profile,
                       args.write_pool, int(shape[12:]) if shape.startswith("sidecar-gate") else args.bind_gate,
                       "all" if shape == "sidecar-all" else "best")
    try:
        if tls is None:
            config = rs.scheduler_config(cluster, ext.port)
        else:
            config = mtls_scheduler_config(cluster, ext.port, tls)
        if shape == "sidecar-all":  # as before: filter passes every fitting node, prioritize ranks them
            config["extenders"][0] |= {"prioritizeVerb": "prioritize", "weight": 5}
        create_pending(cluster, args.pods, "memslice-scheduler", 1)
        cpu0, since, api0 = ext.cpu_s(), time.time(), apiserver_bindings(cluster)
        port = free_port()
        sched = cluster.start_scheduler(config, "memslice-scheduler", f"--secure-port={port}",
                                        *SCHEDULER_METRICS_FLAGS)
        procs = Processes(cluster, sched, ext.ps)
        prof = GoProfiles(cluster, port, args.pprof, f"{shape}-{n}", args.pprof_seconds)
        out["wall_s"] = wait_all_bound(cluster, 600)
        cpu1 = ext.cpu_s()
        out["cpu_by_process_ms_per_pod"] = procs.ms_per_pod(args.pods)
        out.update(scheduler_metrics(port, "memslice-scheduler"))
        out.update(histogram_figures("api_binding", histogram_delta(apiserver_bindings(cluster), api0)))
        prof.join()
        sched.stop()
        out["extender_cpu_ms_per_pod"] = 1000 * (cpu1 - cpu0) / args.pods
        out["gpus_used"] = check_placement(cluster, args.nodes)
    finally:
        child = ext.stop()
    out.update(run_figures(bindings(cluster, f"system:serviceaccount:{NAMESPACE}:{account}", since), args.pods))
    verb = child.get("binds") or []
    out.update({"bind_verb_ms_p50": 1000 * quantile(verb, 0.5), "bind_verb_ms_p99": 1000 * quantile(verb, 0.99),
                "bind_verbs": len(verb), "new_connections": child.get("connections") or {}})
    out.update({f"gate_{k}": v for k, v in (child.get("gate") or {}).items()})
    for phase, values in (child.get("phases") or {}).items():
        out[f"{phase}_ms_p50"], out[f"{phase}_ms_p99"] = 1000 * quantile(values, 0.5), 1000 * quantile(values, 0.99)
    if child.get("breakdown"):
        out["breakdown"] = {k: {"ms_per_pod": 1000 * v[0] / args.pods, "calls": v[1]}
                            for k, v in sorted(child["breakdown"].items(), key=lambda kv: -kv[1][0])}
    delete_pods(cluster)
    return out


def plain_run(args: argparse.Namespace, cluster: Any, n: int) -> dict[str, Any]:
    """The same burst through kube-scheduler alone (deploy/'s configuration minus the extender)."""
    import test_real_scheduler as rs
    from kube_real import free_port

    create_pending(cluster, args.pods, "plain-scheduler", 1)
    plain = dict(rs.scheduler_config(cluster, 1), extenders=[], profiles=[{"schedulerName": "plain-scheduler"}])
    plain["leaderElection"] = {"leaderElect": False}
    since, api0, port = time.time(), apiserver_bindings(cluster), free_port()
    sched = cluster.start_scheduler(plain, "plain-scheduler", f"--secure-port={port}", *SCHEDULER_METRICS_FLAGS)
    procs = Processes(cluster, sched, None)
    prof = GoProfiles(cluster, port, args.pprof, f"plain-{n}", args.pprof_seconds)
    out: dict[str, Any] = {"wall_s": wait_all_bound(cluster, 600)}
    out["cpu_by_process_ms_per_pod"] = procs.ms_per_pod(args.pods)
    out.update(scheduler_metrics(port, "plain-scheduler"))
    out.update(histogram_figures("api_binding", histogram_delta(apiserver_bindings(cluster), api0)))
    prof.join()
    sched.stop()
    out.update(run_figures(bindings(cluster, rs.SCHEDULER_USER, since), args.pods))
    delete_pods(cluster)
    return out


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each numeric figure's median over the runs (nested dicts too); other values from the first run."""
    out: dict[str, Any] = {}
    for key, first in runs[0].items():
        values = [r[key] for r in runs if key in r]
        if isinstance(first, dict):
            out[key] = medians(values)
        elif isinstance(first, (int, float)) and not isinstance(first, bool):
            out[key] = statistics.median(values)
        else:
            out[key] = first
    return out


def bench(args: argparse.Namespace) -> dict[str, Any]:
    import test_real_scheduler as rs
    from kube_real import running
    from test_deploy_render import render

    shapes = ["sidecar"] + (["sidecar-all"] if args.also_all else []) + [f"sidecar-gate{n}" for n in args.also_gate]
    shapes += ["mtls"] if args.mtls else []
    out: dict[str, Any] = {"nodes": args.nodes, "pods": args.pods, "cpus": sorted(os.sched_getaffinity(0)),
                           "rounds": args.rounds, "shapes": shapes, "write_pool": args.write_pool,
                           "bind_gate": args.bind_gate, "load_average": os.getloadavg()}
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in [*shapes, "plain"]}
    with tempfile.TemporaryDirectory(prefix="ms-bench-") as tmp, running(
            Path(tmp) / "kube", ("--profiling=true",) if args.pprof else ()) as cluster:
        cluster.apply(sorted(render("base"), key=lambda o: o["kind"] != "Namespace"))
        if args.mtls:  # the standalone extender's account and certificate Job (the sidecar keeps kube-scheduler's)
            cluster.apply(sorted(render("overlays/standalone-extender"), key=lambda o: o["kind"] != "Namespace"))
        cluster.ensure_namespace(rs.NS)
        for i in range(args.nodes):
            rs.add_gpu_node(cluster, f"gpu-{i:02d}", rs.SIZES_GIB[i % 4], "main")
        for n in range(args.rounds):
            for shape in shapes:
                runs[shape].append(extender_run(args, cluster, Path(tmp), shape, n))
            if not args.extender_only:
                runs["plain"].append(plain_run(args, cluster, n))
    out["load_average_end"] = os.getloadavg()
    for key, values in runs.items():
        if values:
            out[key] = medians(values)
            out[key]["runs"] = values
    if runs["plain"]:
        for shape in shapes:
            ratios = [e["pods_per_s"] / p["pods_per_s"] for e, p in zip(runs[shape], runs["plain"], strict=True)]
            over = [e["bind_verb_ms_p99"] - p["binding_ms_p99"] for e, p in zip(runs[shape], runs["plain"],
                                                                                 strict=True)]
            # the same point on both sides: kube-scheduler's attempt (its algorithm + its binding, which holds the
            # plain scheduler's wait in its client's QPS limiter and the extender's whole bind verb)
            attempt = [e["sched_attempt_ms_p99"] - p["sched_attempt_ms_p99"] for e, p in zip(runs[shape], runs["plain"],
                                                                                             strict=True)]
            out[shape]["ratio_pods_per_s"] = statistics.median(ratios)
            out[shape]["bind_p99_over_plain_ms"] = statistics.median(over)
            out[shape]["attempt_p99_over_plain_ms"] = statistics.median(attempt)
    return out


def report(out: dict[str, Any]) -> None:
    print(f"{out['pods']} pending pods on {out['nodes']} nodes × 8 GPUs, real kube-scheduler, CPUs {out['cpus']}, "
          f"medians of {out['rounds']} round(s):")
    names = {"sidecar": "extender, sidecar (plain HTTP on loopback)", "mtls": "extender, standalone (mutual TLS)"}
    names |= {s: f"extender, sidecar, filter gated at {s[12:]} binds in flight" for s in out["shapes"]
              if s.startswith("sidecar-gate")}
    names["sidecar-all"] = "extender, sidecar, filter passing every fitting node and prioritize called (weight 5)"
    names["sidecar-gate0"] = "extender, sidecar, filter not gated by the binds in flight (as before issue 39)"
    for shape in out["shapes"]:
        e = out[shape]
        print(f"  {names[shape]}: {e['pods_per_s']:.1f} pods/s (all bound {e['wall_s']:.1f} s after the scheduler "
              f"started); extender CPU {e['extender_cpu_ms_per_pod']:.2f} ms per pod; {e['gpus_used']} GPUs used, "
              f"none over its memory")
        print(f"    bind verb p50 {e['bind_verb_ms_p50']:.1f} ms, p99 {e['bind_verb_ms_p99']:.1f} ms; its Binding in "
              f"the API server p50 {e['binding_ms_p50']:.1f} ms, p99 {e['binding_ms_p99']:.1f} ms")
        if "pool_wait_ms_p50" in e:
            print(f"    bind write in the extender: pool wait p50 {e['pool_wait_ms_p50']:.1f} ms, p99 "
                  f"{e['pool_wait_ms_p99']:.1f} ms; API exchange p50 {e['api_exchange_ms_p50']:.1f} ms, p99 "
                  f"{e['api_exchange_ms_p99']:.1f} ms")
        same_point(e)
        print("    new connections: " + ", ".join(f"{k} {v:g}" for k, v in e["new_connections"].items()))
        print("    CPU ms per pod: " + ", ".join(f"{k} {v:.2f}" for k, v in e["cpu_by_process_ms_per_pod"].items()))
        if "ratio_pods_per_s" in e:
            print(f"    ratio pods/s with/without {e['ratio_pods_per_s']:.2f}; bind p99 - plain Binding p99 "
                  f"{e['bind_p99_over_plain_ms']:+.1f} ms; kube-scheduler's attempt p99 - plain's "
                  f"{e['attempt_p99_over_plain_ms']:+.1f} ms")
        for k, v in (e.get("breakdown") or {}).items():
            print(f"    {k:32s} {v['ms_per_pod']:6.3f} ms per pod ({v['calls']:g} calls)")
    if "plain" in out:
        p = out["plain"]
        print(f"  without the extender: {p['pods_per_s']:.1f} pods/s (all bound {p['wall_s']:.1f} s after the "
              f"scheduler started); Binding p50 {p['binding_ms_p50']:.1f} ms, p99 {p['binding_ms_p99']:.1f} ms")
        print("    CPU ms per pod: " + ", ".join(f"{k} {v:.2f}" for k, v in p["cpu_by_process_ms_per_pod"].items()))
        same_point(p)


def _ms(value: float, bound: float) -> str:
    return f"> {bound:g}" if value == float("inf") else f"{value:.0f}"


def same_point(run: dict[str, Any]) -> None:
    """The figures measured at the same point for every run: kube-scheduler's metrics and the API server's."""
    if "sched_attempt_ms_p99" not in run:
        return
    print(f"    kube-scheduler: attempt (algorithm + binding) p50 {_ms(run['sched_attempt_ms_p50'], 16384)} ms, "
          f"p99 {_ms(run['sched_attempt_ms_p99'], 16384)} ms; algorithm p99 "
          f"{_ms(run['sched_algorithm_ms_p99'], 16384)} ms; SLI p99 {_ms(run['sched_sli_ms_p99'], 5242880)} ms; "
          f"Bind extension point {run['sched_bind_extension_point_count']:g} calls, p50 "
          f"{_ms(run['sched_bind_extension_point_ms_p50'], 204.8)} ms, p99 "
          f"{_ms(run['sched_bind_extension_point_ms_p99'], 204.8)} ms")
    print(f"    API server's histogram of Bindings: {run['api_binding_count']:g}, p50 "
          f"{_ms(run['api_binding_ms_p50'], 60000)} ms, p99 {_ms(run['api_binding_ms_p99'], 60000)} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=20)
    ap.add_argument("--pods", type=int, default=400)
    ap.add_argument("--cpus", default=None, help="pin everything to these CPUs (e.g. 0, or 0,1)")
    ap.add_argument("--breakdown", action="store_true", help="the extender's CPU by activity")
    ap.add_argument("--profile", metavar="FILE", help="the extender's connection threads and watch events under "
                    "cProfile (CPU time), merged pstats written to FILE")
    ap.add_argument("--mtls", action="store_true", help="also run the extender in the shape of "
                    "deploy/components/standalone-extender (mutual TLS), for comparison")
    ap.add_argument("--rounds", type=int, default=1, help="repeat the runs, interleaved; figures are medians")
    ap.add_argument("--plain-http", action="store_true", help="the extender in plain HTTP on loopback: the default "
                    "since deploy/base runs it so (kept for the commands of earlier figures)")
    ap.add_argument("--write-pool", type=int, default=None, metavar="N", help="an experiment: the extender's "
                    "connections for bind writes (podwrites.MAX_CONNECTIONS) instead of its own bound")
    ap.add_argument("--bind-gate", type=int, default=None, metavar="N", help="an experiment: the binds in flight "
                    "before the extender's filter waits (edge/gate.py) instead of its own LIMIT; 0: no gate")
    ap.add_argument("--also-gate", type=int, nargs="+", default=[], metavar="N", help="also run the sidecar with "
                    "its filter gated at N binds in flight (0: no gate, as before issue 39), interleaved, to compare")
    ap.add_argument("--pprof", type=Path, default=None, metavar="DIR", help="CPU profiles of the API server and "
                    "kube-scheduler in each run (go tool pprof), written to DIR")
    ap.add_argument("--pprof-seconds", type=float, default=5.0, metavar="S", help="each profile's length, from "
                    "the scheduler's start (default 5)")
    ap.add_argument("--also-all", action="store_true", help="also run the sidecar as before filter answered only "
                    "the best nodes: --filter-answers all and prioritizeVerb (weight 5), interleaved, to compare")
    ap.add_argument("--filter-answers", default="best", help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--extender-only", action="store_true", help="skip the run without the extender")
    ap.add_argument("--serve-extender", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    ap.add_argument("--tls-dir", help=argparse.SUPPRESS)
    ap.add_argument("--times-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_extender:
        return serve_extender(args)
    if args.nodes > 40:
        ap.error("--nodes: at most 40 (the nodes tests/kube_real.py gives kubelet identities: gpu-00..gpu-39)")
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    out = bench(args)
    if args.json:
        print(json.dumps(out))
    else:
        report(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Pods per second through the real kube-scheduler, with and without the memslice extender (issue 28).

One real control plane (tests/support/kube_real.py: kube-apiserver with an embedded etcd, built by `make
kubecluster`), N nodes with 8 GPUs each (as tests/realcluster/test_real_scheduler.py registers them),
then two runs on the
same cluster, one after the other:

- extender: deploy/'s scheduler configuration (the memslice-scheduler profile, the extender over mutual TLS
  with filter, prioritize, bind and preempt), the extender in this process;
- plain: the same kube-scheduler binary with deploy/'s configuration minus the extender (the scheduler's own
  node-level fit of memslice.io/gpu-mem only, its own binding).

Each run creates P pods (sizes drawn as in the test) and times from the first create to the last binding;
pods are deleted between runs. Prints pods/s for both (`--json` for a machine-readable form), and the
extender's bind latency (the Binder's whole bind: choosing the GPU and its API write(s); median, p90, p99,
mean over every bind of the run; issue 39). `--extender-only` skips the plain run.

    .venv/bin/python benchmarks/bench_real_scheduler.py [--nodes 20] [--pods 500] [--extender-only] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
__import__("testpaths").add()  # the test folders (tests/testpaths.py)

from kube_real import RealCluster, running, wait_until  # noqa: E402
from test_deploy_render import NAMESPACE, render  # noqa: E402
from test_real_scheduler import NS, SIZES_GIB, add_gpu_node, pod_body, scheduler_config, tls_files  # noqa: E402

from memslice.kube.config import load_api_client  # noqa: E402
from memslice.scheduler_extender.app import Config, Extender  # noqa: E402

GIB = 1024


def bound_count(cluster: RealCluster) -> int:
    pods = cluster.ok("GET", f"/api/v1/namespaces/{NS}/pods?limit=10000")["items"]
    return sum(1 for p in pods if p["spec"].get("nodeName"))


def run_pods(cluster: RealCluster, n: int, scheduler_name: str, seed: int) -> float:
    """Create n pods for `scheduler_name`; seconds until all are bound."""
    from concurrent.futures import ThreadPoolExecutor

    rng = random.Random(seed)
    bodies = []
    for i in range(n):
        body = pod_body(f"b{i:05d}", rng.choice((1, 2, 4, 6, 8)) * GIB, "main")
        body["spec"]["schedulerName"] = scheduler_name
        bodies.append(body)
    start = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda b: cluster.ok("POST", f"/api/v1/namespaces/{NS}/pods", b), bodies))
    wait_until(f"{n} pods bound by {scheduler_name}", lambda: bound_count(cluster) >= n, 600, 0.2)
    return time.monotonic() - start


def timed_binds(ext: Extender) -> list[float]:
    """Seconds of every bind the extender makes from now on (its Binder's bind, wrapped on the instance)."""
    times: list[float] = []
    inner = ext.binder.bind

    def bind(args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return inner(args)
        finally:
            times.append(time.perf_counter() - t0)

    ext.binder.bind = bind  # type: ignore[method-assign]
    return times


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def delete_pods(cluster: RealCluster) -> None:
    cluster.ok("DELETE", f"/api/v1/namespaces/{NS}/pods", {"gracePeriodSeconds": 0})
    wait_until("pods deleted", lambda: not cluster.ok("GET", f"/api/v1/namespaces/{NS}/pods")["items"], 120, 0.5)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=20)
    ap.add_argument("--pods", type=int, default=500)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--extender-only", action="store_true", help="skip the run without the extender")
    args = ap.parse_args()
    out: dict[str, Any] = {"nodes": args.nodes, "pods": args.pods}
    with tempfile.TemporaryDirectory(prefix="ms-bench-") as tmp, running(Path(tmp) / "kube") as cluster:
        cluster.apply(sorted(render("base"), key=lambda o: o["kind"] != "Namespace"))
        cluster.ensure_namespace(NS)
        for i in range(args.nodes):
            add_gpu_node(cluster, f"gpu-{i:02d}", SIZES_GIB[i % 4], "main")
        tls = tls_files(cluster, Path(tmp) / "tls")
        server = tls / "memslice-extender-tls"
        api, _ = load_api_client(str(cluster.kubeconfig("ext", cluster.token(NAMESPACE, "memslice-extender"))),
                                 pool_maxsize=16)
        ext = Extender(api, Config(address="127.0.0.1", port=0, tls_cert_file=str(server / "tls.crt"),
                                   tls_key_file=str(server / "tls.key"),
                                   tls_client_ca_file=str(server / "ca.crt"))).start()
        try:
            assert ext.wait_synced(30)
            config = scheduler_config(cluster, int(ext.url.rsplit(":", 1)[1]), tls)
            sched = cluster.start_scheduler(config, "memslice-scheduler")
            binds = timed_binds(ext)
            out["extender_s"] = run_pods(cluster, args.pods, "memslice-scheduler", 1)
            sched.stop()
            out["binds"] = len(binds)
            for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
                out[f"bind_ms_{name}"] = 1000 * quantile(binds, q)
            out["bind_ms_mean"] = 1000 * sum(binds) / len(binds)
            if not args.extender_only:
                delete_pods(cluster)
                plain = dict(config, extenders=[], profiles=[{"schedulerName": "plain-scheduler"}])
                plain["leaderElection"] = {"leaderElect": False}
                sched = cluster.start_scheduler(plain, "plain-scheduler")
                out["plain_s"] = run_pods(cluster, args.pods, "plain-scheduler", 1)
                sched.stop()
        finally:
            ext.stop()
    out["extender_pods_per_s"] = args.pods / out["extender_s"]
    if "plain_s" in out:
        out["plain_pods_per_s"] = args.pods / out["plain_s"]
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{args.pods} pods on {args.nodes} nodes × 8 GPUs, real kube-scheduler:")
        print(f"  with the extender (filter/prioritize/bind over mTLS): {out['extender_pods_per_s']:.1f} pods/s "
              f"({out['extender_s']:.1f} s)")
        if "plain_s" in out:
            print(f"  without (scheduler's own fit and binding):           {out['plain_pods_per_s']:.1f} pods/s "
                  f"({out['plain_s']:.1f} s)")
        print(f"  extender bind latency over {out['binds']} binds: p50 {out['bind_ms_p50']:.1f} ms, p90 "
              f"{out['bind_ms_p90']:.1f} ms, p99 {out['bind_ms_p99']:.1f} ms, mean {out['bind_ms_mean']:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Node-agent benchmark: ListAndWatch message size per node shape, Allocate / GetPreferredAllocation latency
with 100 pods on the node, kubelet-restart re-registration time, the agent's resident memory, the time to
answer hostile Allocate requests of 60,000 IDs (valid, with one duplicate, all aliases); in DRA mode
(--kubelet-api dra) NodePrepareResources / NodeUnprepareResources latency with 100 claims on an 8x141GiB node
and the size of that node's ResourceSlice.

    .venv/bin/python benchmarks/bench_node_agent.py [--json] [--pods N] [--only device-plugin|dra|hostile]

The agent runs as a real `memslice node-agent --simulate` process next to the kubelet stand-in (real gRPC on
Unix sockets, the kubelet's 4 MiB receive limit) and, for the latency runs, the Kubernetes API stand-in
holding the pods' reservations. Latencies are measured in the kubelet stand-in around each call.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
__import__("testpaths").add()  # the test folders (tests/testpaths.py)
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # the stand-ins' channels see GOAWAY on every restart

import kube_standin_dra  # noqa: E402
from kube_standin import KubeApiStandin  # noqa: E402
from kubelet_standin import KubeletStandin  # noqa: E402
from test_plugin_agent import RESOURCE, AgentProcess  # noqa: E402

from memslice.plugin.deviceplugin.devices import (  # noqa: E402
    KUBELET_MAX_MESSAGE_BYTES,
    GpuShape,
    list_and_watch_bytes,
    smallest_fitting_unit,
    worst_case_bytes,
)

GiB = 1024
T = TypeVar("T")
SHAPES = {  # name -> (MEMSLICE_SIM_GPUS, shapes for the arithmetic); 8-GPU nodes: 4 GPUs per NUMA node
    "1x16GiB": ("16GiB", [GpuShape(0, 16 * GiB, 0)]),
    "1x80GiB": ("80GiB", [GpuShape(0, 80 * GiB, 0)]),
    "8x80GiB": (",".join(f"80GiB:{i // 4}" for i in range(8)),
                [GpuShape(i, 80 * GiB, i // 4) for i in range(8)]),
    "8x141GiB": (",".join(f"141GiB:{i // 4}" for i in range(8)),
                 [GpuShape(i, 141 * GiB, i // 4) for i in range(8)]),
}


def wait_for(fn: Callable[[], T], timeout: float, what: str) -> T:
    """fn()'s first truthy value, polled for at most `timeout` seconds (a benchmark, not a test)."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout} s")
        time.sleep(0.05)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


class Node:
    """A temporary node: kubelet stand-in, optional API stand-in, one agent."""

    def __init__(self, sim_gpus: str, unit: int, api: KubeApiStandin | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="msb-", dir="/tmp"))
        self.kubelet = KubeletStandin(self.dir / "dp", self.dir / "pr" / "kubelet.sock").start()
        args: tuple[str, ...] = ("--reconcile-interval-s", "10")
        if api is not None:
            args += ("--kubeconfig", api.kubeconfig(str(self.dir / "kc")), "--node-name", "bench")
        self.agent = AgentProcess(self.dir, sim_gpus=sim_gpus, unit_mib=unit, args=args)

    def __enter__(self) -> Node:
        return self

    def __exit__(self, *exc: object) -> None:
        self.agent.stop()
        self.kubelet.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def message_sizes() -> list[dict]:
    rows = []
    for name, (sim, shapes) in SHAPES.items():
        fit = smallest_fitting_unit(shapes)
        row = {"node": name, "memMiB": sum(g.mem_mib for g in shapes),
               "bytes_unit1_healthy": list_and_watch_bytes(shapes, 1),
               "bytes_unit1_worst": worst_case_bytes(shapes, 1),
               "fits_unit1": worst_case_bytes(shapes, 1) <= KUBELET_MAX_MESSAGE_BYTES,
               "smallest_unit": fit, "devices_at_unit": sum(g.mem_mib // fit for g in shapes),
               "bytes_at_unit_computed": list_and_watch_bytes(shapes, fit)}
        if not row["fits_unit1"]:  # the agent must refuse to start at unit 1
            with Node(sim, 1) as node:
                node.agent.start()
                row["unit1_refused_at_start"] = node.agent.wait_exit() == 1 and \
                    f"--unit-mib {fit} or larger" in node.agent.log()
        with Node(sim, fit) as node:
            t0 = time.monotonic()
            node.agent.start()
            ep = node.kubelet.wait_registered(RESOURCE, timeout=120)
            row["start_to_list_s"] = round(time.monotonic() - t0, 2)
            row["bytes_at_unit_received"] = ep.last_message_bytes
            row["agent_rss_mib"] = round(rss_mib(node.agent.proc.pid), 1)  # type: ignore[union-attr]
        rows.append(row)
    return rows


def latency(sim: str, unit: int, shapes: list[GpuShape], pods: int) -> dict:
    per_pod_units = max(1, min(g.mem_mib for g in shapes) // unit // (pods // len(shapes) + 2))
    with KubeApiStandin() as api:
        api.put({"kind": "Node", "apiVersion": "v1", "metadata": {"name": "bench"}})
        with Node(sim, unit, api) as node:
            node.agent.start()
            node.kubelet.wait_registered(RESOURCE, timeout=120)
            gpus = wait_for(lambda: json.loads((api.get("Node", None, "bench") or {}).get("metadata", {})
                                               .get("annotations", {}).get("memslice.io/gpus", "null")),
                            timeout=60, what="inventory")
            for i in range(pods):
                g = gpus[i % len(gpus)]  # type: ignore[index]
                api.put({"kind": "Pod", "apiVersion": "v1",
                         "metadata": {"name": f"p{i}", "namespace": "bench", "annotations": {
                             "memslice.io/gpu-uuid": g["uuid"],
                             "memslice.io/gpu-mem-mib": json.dumps({"main": per_pod_units * unit}),
                             "memslice.io/assumed-at": f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}Z"}},
                         "spec": {"nodeName": "bench", "containers": [{"name": "main", "image": "x"}]},
                         "status": {"phase": "Pending"}})
            wait_for(lambda: node.agent.log().count("the extender reserved GPU") >= pods, timeout=60,
                     what="the pod watch")
            on_reserved = 0
            for i in range(pods):
                obj = api.get("Pod", "bench", f"p{i}")
                assert obj is not None
                uid = obj["metadata"]["uid"]
                node.kubelet.admit(uid, "bench", f"p{i}", [("main", per_pod_units)], RESOURCE)
                ids = node.kubelet.pods[uid].containers["main"][RESOURCE]
                on_reserved += {x.split("-")[0] for x in ids} == {f"g{i % len(gpus)}"}  # type: ignore[arg-type]
            t = node.kubelet.call_seconds
            ms = {k: [v * 1000 for v in vals] for k, vals in t.items()}
            restarts = []
            for _ in range(5):
                before = node.kubelet.registrations
                t0 = time.monotonic()
                node.kubelet.restart()
                node.kubelet.wait_registered(RESOURCE, after=before, timeout=30)
                restarts.append(time.monotonic() - t0)
            return {
                "node": f"{len(shapes)}x{shapes[0].mem_mib // GiB}GiB", "unit_mib": unit, "pods": pods,
                "mib_per_pod": per_pod_units * unit,
                "available_ids_per_request_first": sum(g.mem_mib // unit for g in shapes),
                "preferred_ms_median": round(statistics.median(ms["GetPreferredAllocation"]), 2),
                "preferred_ms_p99": round(pct(ms["GetPreferredAllocation"], 99), 2),
                "allocate_ms_median": round(statistics.median(ms["Allocate"]), 2),
                "allocate_ms_p99": round(pct(ms["Allocate"], 99), 2),
                "pods_on_reserved_gpu": on_reserved,
                "reregister_s_median": round(statistics.median(restarts), 3),
                "reregister_s_max": round(max(restarts), 3),
                "agent_rss_mib_after": round(rss_mib(node.agent.proc.pid), 1),  # type: ignore[union-attr]
            }


def hostile_allocate(n: int = 60_000, runs: int = 5) -> dict:
    """Median Allocate time (ms, in the client) for `n` IDs of one 80 GiB GPU at unit 1: all valid (accepted),
    with one ID repeated (refused; was O(n^2): 76 s), all written with a leading zero (aliases, refused)."""
    import grpc

    from memslice.proto import api_pb2

    cases = {"valid": [f"g0-{i}" for i in range(n)],
             "one_duplicate": [f"g0-{i}" for i in range(n)] + ["g0-5"],
             "aliases": [f"g0-0{i}" for i in range(n)]}
    out: dict = {"ids": n}
    with Node(SHAPES["1x80GiB"][0], 1) as node:
        node.agent.start()
        stub = node.kubelet.wait_registered(RESOURCE, timeout=120).stub
        for name, ids in cases.items():
            req = api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)])
            times = []
            for _ in range(runs):
                t0 = time.perf_counter()
                try:
                    stub.Allocate(req, timeout=300)
                    ok = True
                except grpc.RpcError as exc:
                    ok = False
                    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc
                times.append((time.perf_counter() - t0) * 1000)
            out[f"{name}_ms_median"] = round(statistics.median(times), 1)
            out[f"{name}_accepted"] = ok
    return out


def dra(sim: str, claims: int) -> dict:
    """NodePrepareResources / NodeUnprepareResources latency (one claim per call, as the kubelet sends one
    pod's claims) measured around each gRPC call in the kubelet DRA stand-in, and the ResourceSlice size."""
    from test_dra_node import DRIVER, NODE, DraNode

    root = Path(tempfile.mkdtemp(prefix="msb-dra-", dir="/tmp"))
    with KubeApiStandin() as api:
        api.put({"kind": "Node", "metadata": {"name": NODE}})
        api.put(kube_standin_dra.device_class())
        node = DraNode(root, api, gpus=sim)
        try:
            t0 = time.monotonic()
            node.start()
            start_s = time.monotonic() - t0
            [sl] = node.slices()
            slice_bytes = len(json.dumps(sl, separators=(",", ":")))
            gpus = len(sl["spec"]["devices"])
            per_claim = "4Gi"  # 100 claims: 400 GiB of the node's 1128 GiB, first-fit over the 8 devices
            objs = []
            for i in range(claims):
                api.put(kube_standin_dra.claim(f"c{i}", per_claim, namespace="bench"))
                objs.append(kube_standin_dra.allocate(api, "bench", f"c{i}", NODE))
            prep, unprep = [], []
            for c in objs:
                t = time.perf_counter()
                resp = node.kubelet.prepare(DRIVER, c)
                prep.append((time.perf_counter() - t) * 1000)
                assert resp.claims[c["metadata"]["uid"]].error == "", resp
            rss = rss_mib(node.proc.pid)  # type: ignore[union-attr]
            for c in objs:
                t = time.perf_counter()
                node.kubelet.unprepare(DRIVER, c)
                unprep.append((time.perf_counter() - t) * 1000)
            return {"node": sim, "claims": claims, "memory_per_claim": per_claim, "devices": gpus,
                    "resourceslice_bytes": slice_bytes, "start_to_registered_s": round(start_s, 2),
                    "prepare_ms_median": round(statistics.median(prep), 2),
                    "prepare_ms_p99": round(pct(prep, 99), 2),
                    "unprepare_ms_median": round(statistics.median(unprep), 2),
                    "unprepare_ms_p99": round(pct(unprep, 99), 2), "agent_rss_mib_after": round(rss, 1)}
        finally:
            node.stop()
            shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    ap.add_argument("--pods", type=int, default=100, help="pods admitted in the latency runs (default 100)")
    ap.add_argument("--only", choices=("device-plugin", "dra", "hostile"), help="run only one set of measurements")
    ap.add_argument("--hostile-only", action="store_true", help="the same as --only hostile")
    a = ap.parse_args()
    if a.hostile_only:
        a.only = "hostile"
    hostile = hostile_allocate() if a.only in (None, "hostile") else None
    if a.only == "hostile":
        print(json.dumps(hostile) if a.json else _hostile_line(hostile))
        return 0
    dra_rows = [dra(SHAPES["8x141GiB"][0], a.pods)] if a.only != "device-plugin" else []
    if a.only == "dra":
        sizes, lat = [], []
    else:
        sizes = message_sizes()
        lat = [latency(SHAPES["1x80GiB"][0], 1, SHAPES["1x80GiB"][1], a.pods),
               latency(SHAPES["8x80GiB"][0], smallest_fitting_unit(SHAPES["8x80GiB"][1]), SHAPES["8x80GiB"][1],
                       a.pods)]
    if a.json:
        print(json.dumps({"listandwatch": sizes, "latency": lat, "dra": dra_rows, "hostile_allocate": hostile},
                         indent=2))
        return 0
    if dra_rows:
        print("DRA mode, one claim per NodePrepareResources call (ms, measured in the kubelet DRA stand-in; "
              "target p99 < 50 ms)")
        print(f"{'node':<10}{'claims':>7}{'each':>9}{'slice bytes':>13}{'prep p50':>10}{'prep p99':>10}"
              f"{'unprep p50':>12}{'unprep p99':>12}{'RSS MiB':>9}")
        for r in dra_rows:
            print(f"{'8x141GiB':<10}{r['claims']:>7}{r['memory_per_claim']:>9}{r['resourceslice_bytes']:>13}"
                  f"{r['prepare_ms_median']:>10}{r['prepare_ms_p99']:>10}{r['unprepare_ms_median']:>12}"
                  f"{r['unprepare_ms_p99']:>12}{r['agent_rss_mib_after']:>9}")
        if a.only == "dra":
            return 0
        print()
    print(f"ListAndWatch message (kubelet limit {KUBELET_MAX_MESSAGE_BYTES} bytes; 'unit1 bytes' is the worst "
          f"case, every device Unhealthy; 'refused': the agent exits at --unit-mib 1 naming the unit)")
    print(f"{'node':<10}{'unit1 bytes':>13}{'fits':>6}{'refused':>9}{'unit':>6}{'devices':>9}{'bytes':>10}"
          f"{'received':>10}{'start s':>9}{'RSS MiB':>9}")
    for r in sizes:
        refused = {True: "yes", False: "NO"}.get(r.get("unit1_refused_at_start"), "-")  # type: ignore[arg-type]
        print(f"{r['node']:<10}{r['bytes_unit1_worst']:>13}{'yes' if r['fits_unit1'] else 'no':>6}{refused:>9}"
              f"{r['smallest_unit']:>6}{r['devices_at_unit']:>9}{r['bytes_at_unit_computed']:>10}"
              f"{r['bytes_at_unit_received']:>10}{r['start_to_list_s']:>9}{r['agent_rss_mib']:>9}")
    print(f"\nLatency with {a.pods} pods (ms, measured in the kubelet stand-in)")
    print(f"{'node':<10}{'unit':>5}{'pref p50':>10}{'pref p99':>10}{'alloc p50':>11}{'alloc p99':>11}"
          f"{'on reserved':>13}{'rereg p50 s':>13}{'RSS MiB':>9}")
    for r in lat:
        print(f"{r['node']:<10}{r['unit_mib']:>5}{r['preferred_ms_median']:>10}{r['preferred_ms_p99']:>10}"
              f"{r['allocate_ms_median']:>11}{r['allocate_ms_p99']:>11}"
              f"{str(r['pods_on_reserved_gpu']) + '/' + str(r['pods']):>13}{r['reregister_s_median']:>13}"
              f"{r['agent_rss_mib_after']:>9}")
    if hostile is not None:
        print("\n" + _hostile_line(hostile))
    return 0


def _hostile_line(h: dict) -> str:
    return (f"Allocate of {h['ids']} IDs (ms, median of 5): valid {h['valid_ms_median']} "
            f"({'accepted' if h['valid_accepted'] else 'REFUSED'}), one duplicate {h['one_duplicate_ms_median']} "
            f"(refused), all aliases {h['aliases_ms_median']} (refused)")


if __name__ == "__main__":
    sys.exit(main())

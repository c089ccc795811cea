"""The preempt verb's cost (issue 39, item 3): CPU per node of the victim search, and one whole verb call.

    .venv/bin/python benchmarks/bench_preempt.py [--json] [--nodes 20] [--reps 3] [--densities 4,10,16]
        [--e2e-nodes 100] [--e2e-density 16] [--calls 5] [--no-e2e | --no-per-node]

Nodes of 8 GPUs of 16 GiB (NVLink pairs, a PCIe switch per four GPUs), filled at random with pods of the
density's sizes (4 pods/GPU: 2-6 GiB; 10: 1-2 GiB; 16: 1 GiB), a fifth of them on an NVLink pair (2-GPU pods),
three priorities; every pod is a candidate victim. The preemptor needs 12, 10 or 16 GiB on each of 1, 2 or 4 GPUs
(the density's): every GPU must be emptied in part or whole.

- Per node: decisions.preemption_victims for each node (--reps times each), process CPU time, median and max in
  ms, for 1-, 2- and 4-GPU preemptors; for N GPUs also the search of every set in full (`prune=False`: the
  exact search before Floor and Alone, the reference the tests compare with) and the count of nodes whose
  answers differ (must be 0).
- End to end: the real extender (`memslice extender`, started as bench_extender.py starts it) listing an API
  stand-in in this process that holds --e2e-nodes such nodes at --e2e-density; one `POST /preempt` naming every
  node with all its pods as victims (as kube-scheduler sends NodeNameToMetaVictims) per preemptor size, --calls
  times: wall median per call, the extender's CPU per call (/proc), and the nodes whose search stopped at their
  share of the request's budget (verbs.PREEMPT_SEARCH_BUDGET; memslice_extender_preempt_capped_nodes_total).
  kube-scheduler's extender httpTimeout (deploy/: 10 s) bounds a whole call.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))
__import__("testpaths").add()  # the test folders (tests/testpaths.py): the API stand-in

import bench_extender  # noqa: E402 - after the path set-up above

from memslice.contract import ANN_GPU_COUNT, Gpu, Inventory  # noqa: E402
from memslice.scheduler_extender.placement import decisions, spanning  # noqa: E402
from memslice.scheduler_extender.placement.decisions import VictimCandidate  # noqa: E402
from memslice.scheduler_extender.placement.state import topology  # noqa: E402
from memslice.scheduler_extender.placement.views import GpuView, NodeView  # noqa: E402

GIB = 1024
GPUS = 8
GPU_MIB = 16 * GIB
DENSITIES = {4: ((2 * GIB, 3 * GIB, 4 * GIB, 6 * GIB), 12 * GIB), 10: ((GIB, 2 * GIB), 10 * GIB),
             16: ((GIB,), 16 * GIB)}  # pods per GPU -> (pod sizes, the preemptor's need per GPU)
TWO_GPU_SHARE = 0.2


def board() -> list[Gpu]:
    return [Gpu(f"GPU-{i}", i, "Sim", GPU_MIB, i * 2 // GPUS, True, nvlink=(i ^ 1,), pcie=f"sw{i // 4}")
            for i in range(GPUS)]


def fill(rng: random.Random, per_gpu: int) -> tuple[list[int], list[tuple[tuple[int, ...], int, int]]]:
    """Used MiB per GPU and the pods ((GPU indices), MiB on each, priority) of one random node."""
    sizes = DENSITIES[per_gpu][0]
    used = [0] * GPUS
    pods = []
    for _ in range(GPUS * per_gpu * 2):
        g = rng.randrange(GPUS)
        on = (g, g ^ 1) if rng.random() < TWO_GPU_SHARE else (g,)
        mib = rng.choice(sizes)
        if all(used[i] + mib <= GPU_MIB for i in on):
            for i in on:
                used[i] += mib
            pods.append((on, mib, rng.randrange(3)))
    return used, pods


def view_of(used: list[int], uuid: str = "GPU") -> NodeView:
    gpus = board()
    rows = tuple(GpuView.of(f"{uuid}-{g.index}", g.index, g.model, g.mem_mib, True, u)
                 for g, u in zip(gpus, used, strict=True))
    return NodeView.of("n", 1, rows, 0, None, None, None, topology(Inventory(1, tuple(gpus))))


def per_node(args: argparse.Namespace) -> dict[str, Any]:
    """decisions.preemption_victims per node: {"<N> GPU, <d> pods/GPU": {median_ms, max_ms[, full_*]}}."""
    out: dict[str, Any] = {}
    for gpus in (1, 2, 4):
        for density in args.densities:
            rng = random.Random(args.seed)
            need = DENSITIES[density][1]
            times: list[float] = []
            full: list[float] = []
            differ = 0
            for _ in range(args.nodes):
                used, spec = fill(rng, density)
                view = view_of(used)
                pods = [VictimCandidate(f"p{k}", ",".join(f"GPU-{i}" for i in on), mib, 0, prio)
                        for k, (on, mib, prio) in enumerate(spec)]
                for _ in range(args.reps):
                    t = time.process_time()
                    got = decisions.preemption_victims(view, need, pods, gpus=gpus)
                    times.append(time.process_time() - t)
                    if gpus > 1:
                        t = time.process_time()
                        want = spanning.preemption_victims(view, need, list(pods), 0, None, 0, gpus, prune=False)
                        full.append(time.process_time() - t)
                        differ += got != want
            row = {"median_ms": round(statistics.median(times) * 1e3, 3), "max_ms": round(max(times) * 1e3, 3)}
            if full:
                row.update(full_median_ms=round(statistics.median(full) * 1e3, 3),
                           full_max_ms=round(max(full) * 1e3, 3), answers_differing=differ)
            out[f"{gpus} GPU, {density} pods/GPU"] = row
    return out


class PreemptBench(bench_extender.Bench):
    """bench_extender.Bench's extender (its start, bytecode cache and stop) against an API stand-in in this
    process (the nodes and pods written straight into its store), instead of the stand-in process Bench starts."""

    def __init__(self, kube: Any) -> None:  # noqa: D107 - Bench.__init__ without its stand-in process
        self.args = argparse.Namespace(filter_answers="all")
        self.tmp = Path(tempfile.mkdtemp())
        self.env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        self.env.update(PYTHONUNBUFFERED="1", PYTHONPYCACHEPREFIX=str(self.tmp / "pycache"))
        self.gc_log = self.tmp / "gc.log"
        self.gc_seen = 0
        self.ext = self.spy = None
        self.callgrind_out = self.tmp / "callgrind.out"
        self.port = 0
        self.start_cpu_s = 0.0
        self.kubeconfig = Path(kube.kubeconfig(str(self.tmp / "kubeconfig")))

    def close(self) -> None:
        self.stop_extender()
        shutil.rmtree(self.tmp, ignore_errors=True)


def populate(kube: Any, args: argparse.Namespace) -> dict[str, list[str]]:
    """--e2e-nodes nodes filled at --e2e-density, bound with their reservations; node -> its pods' UIDs."""
    rng = random.Random(args.seed)
    victims: dict[str, list[str]] = {}
    for n in range(args.e2e_nodes):
        name = f"node-{n:05d}"
        gpus = [g._replace(uuid=f"GPU-{n:05d}-{g.index}") for g in board()]
        kube.put({"kind": "Node", "metadata": {"name": name, "labels": {"memslice.io/gpu": "true"},
                                               "annotations": {**Inventory(1, tuple(gpus)).format(),
                                                               "memslice.io/unit-mib": "1"}}})
        _, spec = fill(rng, args.e2e_density)
        uids = []
        for k, (on, mib, priority) in enumerate(spec):
            pod = bench_extender._gpu_pod(f"run-{n}-{k}", "bench", mib * len(on), name,
                                          ",".join(gpus[i].uuid for i in on))
            if len(on) > 1:
                pod["metadata"]["annotations"][ANN_GPU_COUNT] = str(len(on))
            pod["spec"]["priority"] = priority
            uids.append(kube.put(pod)["metadata"]["uid"])
        victims[name] = uids
    return victims


def end_to_end(args: argparse.Namespace) -> dict[str, Any]:
    """One preempt call naming every node, per preemptor size: wall median and the extender's CPU per call."""
    from kube_standin import KubeApiStandin

    kube = KubeApiStandin().start()
    bench = PreemptBench(kube)
    try:
        victims = populate(kube, args)
        bench.warm_bytecode()
        bench.start_extender()
        assert bench.ext is not None
        client = bench_extender.Client("127.0.0.1", bench.port, 0)
        meta = {node: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": 0} for node, uids in victims.items()}
        need = DENSITIES[args.e2e_density][1]
        out: dict[str, Any] = {"nodes": args.e2e_nodes, "pods_per_gpu": args.e2e_density,
                               "pods": sum(map(len, victims.values()))}
        seen_capped = [0.0]

        def capped(bench: PreemptBench) -> float:
            """Nodes capped by the search budget since the last call (memslice_extender_preempt_capped_nodes)."""
            for line in bench_extender._get(bench.port, "/metrics").decode().splitlines():
                if line.startswith("memslice_extender_preempt_capped_nodes_total"):
                    return float(line.split()[1]) - seen_capped[0]
            return float("nan")

        for gpus in (1, 2, 4):
            pod = bench_extender.pending_pod(f"urgent-{gpus}", need * gpus)
            pod["metadata"]["uid"] = f"urgent-{gpus}"
            pod["spec"]["priority"] = 1000
            if gpus > 1:
                pod["metadata"]["annotations"] = {ANN_GPU_COUNT: str(gpus)}
            body = {"Pod": pod, "NodeNameToMetaVictims": meta}
            walls, cpus, answered = [], [], 0
            for _ in range(args.calls):
                before = bench_extender.cpu_s(bench.ext.pid)
                wall, answer = client.post("preempt", body)
                cpus.append(bench_extender.cpu_s(bench.ext.pid) - before)
                walls.append(wall)
                answered = len(answer["NodeNameToMetaVictims"])  # type: ignore[index]
            out[f"{gpus} GPU"] = {"wall_median_s": round(statistics.median(walls), 3),
                                  "wall_max_s": round(max(walls), 3),
                                  "extender_cpu_median_s": round(statistics.median(cpus), 3),
                                  "nodes_answered": answered, "capped_nodes_per_call": capped(bench) / args.calls}
            seen_capped[0] += out[f"{gpus} GPU"]["capped_nodes_per_call"] * args.calls
        return out
    finally:
        bench.close()
        kube.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=20, help="random nodes per case (per node figures)")
    p.add_argument("--reps", type=int, default=3, help="calls per node")
    p.add_argument("--densities", default="4,10,16", help="pods per GPU (of 4, 10, 16)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--e2e-nodes", type=int, default=100, help="nodes named in the end-to-end preempt call")
    p.add_argument("--e2e-density", type=int, default=16, choices=sorted(DENSITIES))
    p.add_argument("--calls", type=int, default=5, help="end-to-end calls per preemptor size")
    p.add_argument("--no-e2e", action="store_true", help="the per-node figures only")
    p.add_argument("--no-per-node", action="store_true", help="the end-to-end figures only")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    args.densities = [int(d) for d in args.densities.split(",")]
    result: dict[str, Any] = {"per_node": {} if args.no_per_node else per_node(args)}
    if not args.no_e2e:
        result["end_to_end"] = end_to_end(args)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print("per node (CPU ms): search [full search of every set]")
    for case, row in result["per_node"].items():
        full = (f"   full median {row['full_median_ms']:8.2f}  max {row['full_max_ms']:8.2f}  "
                f"differing {row['answers_differing']}") if "full_median_ms" in row else ""
        print(f"  {case:22s} median {row['median_ms']:8.2f}  max {row['max_ms']:8.2f}{full}")
    if "end_to_end" in result:
        e = result["end_to_end"]
        print(f"end to end: one preempt call naming {e['nodes']} nodes ({e['pods_per_gpu']} pods/GPU, "
              f"{e['pods']} pods)")
        for gpus in (1, 2, 4):
            r = e[f"{gpus} GPU"]
            print(f"  {gpus} GPU: wall median {r['wall_median_s']:.3f} s (max {r['wall_max_s']:.3f}), extender CPU "
                  f"median {r['extender_cpu_median_s']:.3f} s, {r['nodes_answered']} nodes answered, "
                  f"{r['capped_nodes_per_call']:g} capped by the search budget")
    return 0


if __name__ == "__main__":
    sys.exit(main())

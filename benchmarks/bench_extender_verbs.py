"""Filter + prioritize of the memslice extender alone, in one process: CPU time per pod.

    .venv/bin/python benchmarks/bench_extender_verbs.py [--nodes 5000] [--fill 0.9] [--names 500]
        [--warmup 1000] [--pods 200] [--cold] [--max-limit-ratio R] [--elastic 0.3] [--compute 0.3]
        [--multi-gpu 0.2] [--topology] [--json]

No HTTP, no bind writes, no watch: `Verbs.filter` and `Verbs.prioritize` on a `ClusterState` of N nodes ×
8 GPUs of 80 GiB, filled at random to `--fill` by charges (1–40 GiB, as bench_extender.py), each request
decoded from and answered to JSON with orjson as the server does (filter and prioritize first from the
request's bytes, Verbs.filter_json and Verbs.prioritize_json, where the version has them); after each pod,
its own binpack choice is charged (the view rebuilt, the memo refreshed), as a bind would. The figure to
compare between versions (run them alternately: `PYTHONPATH=<a tree of the old package>` for the old one),
since it leaves out the machine's HTTP and scheduling noise that bench_extender.py's end-to-end figures carry.

Elastic memory: with `--elastic F` that share of the fill charges and of the pods has a limit of 2 × its
request (`memslice.io/gpu-mem-limit`); with `--max-limit-ratio R` the extender caps each GPU's sum of limits
at R × its memory (as `memslice extender --max-limit-ratio`). Without both, the run is the one above.

Compute share (issue 33): with `--compute F` that share of the fill charges and of the pods also holds or asks
for 10-50 % of its GPU's time (`memslice.io/gpu-compute`): such a pod is fitted on memory and compute of one
GPU (decisions' compute path), the others as before. Without it, the run is the one above (the figure that
tells a pod without a share costs what it did).

Pods that span GPUs (issue 34): with `--multi-gpu F` that share of the pods asks for 2 or 4 GPUs
(`memslice.io/gpu-count`, half each; up to 20 GiB on each GPU), and `--topology` gives every node NVLink pairs and a
PCIe switch per four GPUs (the closest set is then looked for). Compare with `--topology` alone.

`--instructions` (callgrind; needs valgrind): the same run under valgrind's callgrind, PYTHONHASHSEED=0, counting
only the measured pods (their filter, prioritize and charge, called through sys.call_tracing and counted with
`--toggle-collect=sys_call_tracing`): instructions per pod, deterministic where CPU time on a shared machine is not.
Issue 34's comparison: `--nodes 1000 --warmup 300 --pods 300 --topology --fill F [--multi-gpu 0.2] --instructions`
for F in 0, 0.5, 0.9. `--instructions-in METHOD` counts only the calls of that FitMemo method made by the measured
pods (each call through sys.call_tracing; the window itself is not): where the instructions per pod go, e.g.
`--instructions-in _refresh_groups` (a method that calls itself would stop counting inside). `--instructions-in
extender` counts only the extender's own calls: filter and prioritize (from the request's bytes, or decoded), the
bind's view, GPU choice and charge; not this harness's decoding of the answers (a client's work: a spanning pod's
answer names ~3× the failing nodes, and decoding it was a third of the spanning mix's excess; issue 34, seventh round).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
SIZES_GIB = (1, 2, 3, 4, 6, 8, 10, 12, 16, 20, 24, 32, 40)
GPU_MIB = 81920


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--fill", type=float, default=0.0, help="fraction of all GPU memory charged first")
    p.add_argument("--names", type=int, default=500, help="node names per filter (0: all)")
    p.add_argument("--warmup", type=int, default=1000, help="pods scheduled before measuring")
    p.add_argument("--pods", type=int, default=200, help="pods measured")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-limit-ratio", default=None, help="cap on a GPU's sum of limits (default: none)")
    p.add_argument("--elastic", type=float, default=0.0, help="share of charges and pods with limit = 2 × request")
    p.add_argument("--hot", action="store_true",
                   help="instead: one pod's filter + prioritize (JSON both ways) in a warm loop, best of 15 × 20: "
                        "the data structures' cost without the cache misses and scheduling noise of a shared "
                        "machine (alternate old and new with it)")
    p.add_argument("--cold", action="store_true",
                   help="measure the first --pods pods on a fresh memo (no warmup; the views are built first, as "
                        "the extender's sync builds them, so the figure is the memo's cold cost)")
    p.add_argument("--compute", type=float, default=0.0, help="share of charges and pods with a compute share")
    p.add_argument("--multi-gpu", type=float, default=0.0, help="share of pods on 2 or 4 GPUs (gpu-count)")
    p.add_argument("--topology", action="store_true", help="nodes publish NVLink pairs and PCIe switches")
    p.add_argument("--instructions", action="store_true",
                   help="count instructions per measured pod with callgrind instead (needs valgrind)")
    p.add_argument("--instructions-in", default="", metavar="METHOD",
                   help="with --instructions: count only the calls of this FitMemo method (e.g. _refresh_groups), "
                        "or with 'extender' the extender's calls only (not the harness's decoding of answers)")
    p.add_argument("--_callgrind", action="store_true", help=argparse.SUPPRESS)  # the run under callgrind
    p.add_argument("--best", action="store_true", help="filter as deploy/ runs it since issue 39: only the "
                   "best-scoring nodes passed (--filter-answers best), no prioritize")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.instructions:
        return instructions(args)
    sys.path.insert(0, str(ROOT / "tests"))
    __import__("testpaths").add()  # the test folders (tests/testpaths.py)
    from test_extender_support import node_obj, pod_obj

    from memslice.scheduler_extender.edge.metrics import Metrics
    from memslice.scheduler_extender.edge.verbs import Verbs
    from memslice.scheduler_extender.placement import decisions
    from memslice.scheduler_extender.placement.state import Charge, ClusterState

    rng = random.Random(args.seed)
    state = ClusterState()
    names = [f"node-{n:05d}" for n in range(args.nodes)]
    for name in names:
        node = node_obj(name, [GPU_MIB] * 8)
        if args.topology:  # as an HGX board without NVSwitch: NVLink pairs, a PCIe switch per four GPUs
            gpus = json.loads(node["metadata"]["annotations"]["memslice.io/gpus"])
            for g in gpus:
                g.update({"nvlink": [g["index"] ^ 1], "pcie": f"sw{g['index'] // 4}", "numa": g["index"] // 4})
            node["metadata"]["annotations"]["memslice.io/gpus"] = json.dumps(gpus)
        state.upsert_node(node)
    state.nodes_synced.set()
    state.pods_synced.set()
    ratio = Fraction(args.max_limit_ratio) if args.max_limit_ratio else None
    cap = {"limit_ratio": ratio} if ratio is not None else {}  # (older versions have no such argument)
    if args.best:  # filter passes its best-scoring nodes only (--filter-answers best); no prioritize follows
        cap["best"] = True  # type: ignore[assignment]
    verbs = Verbs(state, None, "binpack", Metrics(state), **cap)  # type: ignore[arg-type]  # binds charged here
    used: dict[tuple[int, int], int] = {}
    total, i = 0, 0
    while total < args.fill * args.nodes * 8 * GPU_MIB:
        mib, n, g = rng.choice(SIZES_GIB) * 1024, rng.randrange(args.nodes), rng.randrange(8)
        if used.get((n, g), 0) + mib <= GPU_MIB:
            used[(n, g)] = used.get((n, g), 0) + mib
            total += mib
            over = (mib,) if args.elastic and rng.random() < args.elastic else ()  # limit 2 × request
            if args.compute and rng.random() < args.compute:  # (older versions have no compute charge)
                over = (over[0] if over else 0, rng.choice((10, 20, 30, 40, 50)))
            state.hold(f"fill-{i}", Charge(f"GPU-{names[n]}-{g}", names[n], mib, 0, None, *over))
            i += 1
    k = min(args.names, args.nodes) or args.nodes
    if args.cold:
        args.warmup = 0
    with state.current():  # every view built now, not inside the first pod's filter
        pass
    if args.hot:
        return hot_loop(verbs, names, k, rng, args)
    bodies = []
    for j in range(args.warmup + args.pods):
        mib = rng.choice(SIZES_GIB) * 1024
        elastic = args.elastic and rng.random() < args.elastic
        pod = pod_obj(f"p{j}", {"main": mib}, annotations={"memslice.io/gpu-mem-limit": str(2 * mib)} if elastic
                      else None)
        pod["metadata"]["uid"] = f"p{j}"
        if args.multi_gpu and rng.random() < args.multi_gpu:
            count = rng.choice((2, 4))
            pod["metadata"].setdefault("annotations", {})["memslice.io/gpu-count"] = str(count)
            pod["spec"]["containers"][0]["resources"]["limits"]["memslice.io/gpu-mem"] = str(min(mib, 20480) * count)
        if args.compute and rng.random() < args.compute:
            pod["spec"]["containers"][0]["resources"]["limits"]["memslice.io/gpu-compute"] = str(
                rng.choice((10, 20, 30, 40, 50)))
        bodies.append((pod, orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": rng.sample(names, k)})))

    raw_prioritize = getattr(verbs, "prioritize_json", None)  # (older versions decode every body)
    raw_filter = getattr(verbs, "filter_json", None)

    def schedule(batch: list[tuple[dict, bytes]]) -> tuple[float, float]:
        cpu_f = cpu_p = 0.0
        for pod, raw in batch:
            t0 = time.process_time()
            result = raw_filter(bytearray(raw)) if raw_filter is not None else None  # as the server: bytes first
            if result is None:
                result = verbs.filter(orjson.loads(raw))
            out = (result[1] if isinstance(result[1], bytes) else bytes(result[1]) if isinstance(result[1], tuple)
                   else orjson.dumps(result[1]))  # JsonParts: the parts the server sends
            t1 = time.process_time()
            cpu_f += t1 - t0
            answer = orjson.loads(out)
            if not answer["NodeNames"]:
                continue
            if not args.best:  # --best: no prioritize (the pod goes to the first of the best, below)
                body = bytearray(orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": answer["NodeNames"]}))
                t2 = time.process_time()
                if raw_prioritize is None or raw_prioritize(body) is None:  # as the server: from the bytes if it can
                    verbs.prioritize(orjson.loads(body))
                cpu_p += time.process_time() - t2
            node = answer["NodeNames"][0]
            view = state.view(node)
            mib = int(pod["spec"]["containers"][0]["resources"]["limits"]["memslice.io/gpu-mem"])
            limited = "annotations" in pod["metadata"]
            pct = int(pod["spec"]["containers"][0]["resources"]["limits"].get("memslice.io/gpu-compute", 0))
            need = decisions.LimitNeed((1 + limited) * mib, ratio) if ratio is not None else None
            more = {"compute": pct} if pct else {}  # (older versions have no compute)
            count = int(pod["metadata"].get("annotations", {}).get("memslice.io/gpu-count", 1))
            if count > 1:  # (older versions have no pods spanning GPUs)
                mib //= count
                gpus = decisions.choose_gpus(view, mib, "binpack", need, gpus=count, **more)
                gpu_uuid = ",".join(g.uuid for g in gpus) if gpus else None
            else:
                gpu = decisions.choose_gpu(view, mib, "binpack", need, **more)
                gpu_uuid = gpu.uuid if gpu is not None else None
            if gpu_uuid is not None:
                over = (mib if limited else 0, pct) if pct else (mib,) if limited else ()
                state.hold(pod["metadata"]["uid"], Charge(gpu_uuid, node, mib, 0, None, *over))
        return cpu_f, cpu_p

    schedule(bodies[:args.warmup])
    if args._callgrind:  # counted: callgrind collects inside sys.call_tracing only (instructions())
        if args.instructions_in == "extender":  # the calls schedule() makes into the extender, each counted alone
            verbs, state, decisions, raw_filter, raw_prioritize = extender_calls(verbs, state, decisions, raw_filter,
                                                                                 raw_prioritize)
            schedule(bodies[args.warmup:])
        elif args.instructions_in:  # only that method's calls from here on
            count_calls_of(args.instructions_in)
            schedule(bodies[args.warmup:])
        else:
            sys.call_tracing(schedule, (bodies[args.warmup:],))
        return 0
    cpu_f, cpu_p = schedule(bodies[args.warmup:])
    result = {"nodes": args.nodes, "fill": args.fill, "names": k, "pods": args.pods,
              "max_limit_ratio": args.max_limit_ratio, "elastic": args.elastic, "compute": args.compute,
              "multi_gpu": args.multi_gpu, "topology": args.topology,
              "filter_cpu_ms_per_pod": round(cpu_f / args.pods * 1000, 3),
              "prioritize_cpu_ms_per_pod": round(cpu_p / args.pods * 1000, 3)}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{args.nodes} nodes, fill {args.fill:.0%}, {k} names: filter {result['filter_cpu_ms_per_pod']} ms "
              f"+ prioritize {result['prioritize_cpu_ms_per_pod']} ms CPU per pod")
    return 0


def counted(f: Any) -> Any:
    """f called through sys.call_tracing (callgrind counts inside it only), or None for None."""
    if f is None:
        return None
    return lambda *a, **kw: sys.call_tracing(functools.partial(f, **kw) if kw else f, a)


def extender_calls(verbs: Any, state: Any, decisions: Any, raw_filter: Any, raw_prioritize: Any) -> tuple[Any, ...]:
    """--instructions-in extender: what schedule() calls of the extender, each call counted (stand-ins with those
    attributes; the extender's own calls inside them go to the real objects, so no count nests in another)."""
    from types import SimpleNamespace

    return (SimpleNamespace(filter=counted(verbs.filter), prioritize=counted(verbs.prioritize)),
            SimpleNamespace(view=counted(state.view), hold=counted(state.hold)),
            SimpleNamespace(choose_gpus=counted(decisions.choose_gpus), choose_gpu=counted(decisions.choose_gpu),
                            LimitNeed=decisions.LimitNeed),
            counted(raw_filter), counted(raw_prioritize))


def count_calls_of(method: str) -> None:
    """--instructions-in: every later call of FitMemo.<method> made through sys.call_tracing (callgrind counts
    inside it only)."""
    from memslice.scheduler_extender.index.fitmemo import FitMemo

    inner = getattr(FitMemo, method, None)
    if not callable(inner):
        raise SystemExit(f"--instructions-in {method!r}: FitMemo has no such method (e.g. _refresh_groups)")

    def counted(*a: Any, **kw: Any) -> Any:
        return sys.call_tracing(functools.partial(inner, **kw) if kw else inner, a)

    setattr(FitMemo, method, counted)


def instructions(args: argparse.Namespace) -> int:
    """--instructions: this run again under callgrind, collecting only while the measured pods are scheduled
    (sys.call_tracing around them), with a fixed hash seed; the total divided by the pods."""
    argv = [a for a in sys.argv[1:] if a != "--instructions" and a != "--json"]
    with tempfile.TemporaryDirectory(prefix="memslice-bench-") as tmp:
        out = os.path.join(tmp, "callgrind.out")
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        p = subprocess.run(["valgrind", "--tool=callgrind", "--collect-atstart=no", "--toggle-collect=sys_call_tracing",
                            f"--callgrind-out-file={out}", sys.executable, __file__, *argv, "--_callgrind"],
                           env=env, capture_output=True, text=True, timeout=3600)
        if p.returncode != 0:
            raise RuntimeError(f"callgrind run failed: {p.stderr[-2000:]}")
        total = None
        with open(out) as f:
            for line in f:
                if line.startswith(("summary:", "totals:")):
                    total = int(line.split()[1])
        if total is None:
            raise RuntimeError(f"no instruction total in {out}")
    result = {"nodes": args.nodes, "fill": args.fill, "names": min(args.names, args.nodes) or args.nodes,
              "pods": args.pods, "multi_gpu": args.multi_gpu, "topology": args.topology,
              "best": args.best, "instructions_in": args.instructions_in or None,
              "instructions_per_pod": round(total / args.pods)}
    what = ("(the extender's calls: filter, prioritize, charge" if args.instructions_in == "extender"
            else f"(in FitMemo.{args.instructions_in}" if args.instructions_in else "(filter, prioritize, charge")
    print(json.dumps(result) if args.json else f"{args.nodes} nodes, fill {args.fill:.0%}, multi-GPU "
          f"{args.multi_gpu:.0%}: {result['instructions_per_pod'] / 1e6:.3f} M instructions per pod {what}; "
          f"callgrind)")
    return 0


def hot_loop(verbs: Any, names: list[str], k: int, rng: random.Random, args: argparse.Namespace) -> int:
    """--hot: the same pod (16 GiB) filtered and prioritized over the same names, again and again."""
    import timeit

    from test_extender_support import pod_obj

    pod = pod_obj("hot", {"main": 16 * 1024})
    pod["metadata"]["uid"] = "hot"
    body = orjson.dumps({"Pod": pod, "NodeNames": rng.sample(names, k)})
    verbs.filter(orjson.loads(body))  # fills the memo for this size

    def one() -> None:
        _, answer = verbs.filter(orjson.loads(body))
        orjson.dumps(answer)
        verbs.prioritize(orjson.loads(orjson.dumps({"Pod": pod, "NodeNames": answer["NodeNames"]})))

    ms = min(timeit.repeat(one, number=20, repeat=15)) / 20 * 1000
    result = {"nodes": args.nodes, "fill": args.fill, "names": k, "hot_filter_prioritize_ms": round(ms, 3)}
    print(json.dumps(result) if args.json else f"{args.nodes} nodes, fill {args.fill:.0%}, {k} names: filter + "
          f"prioritize (JSON both ways) {ms:.3f} ms, warm loop (best of 15 × 20)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

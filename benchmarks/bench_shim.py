"""Cost of the shim on the allocation hot path, and of oversubscription.

1. Median ns per cuMemAlloc_v2+cuMemFree_v2 pair on the simulated driver, without and with libmemslice.so
   preloaded: 1 thread in 1 process, and 8 threads in 4 processes (2 threads each) charging one shared
   quota (the contended case).
2. Oversubscription: an allocation that fits in the quota vs one that is spilled to host memory (every
   allocation spills: the quota is smaller than one block), timed separately from the free of each: the
   spill path's own cost (host-cap and cgroup checks, host-counter accounting, pinned host allocation and
   its device pointer) and the bookkeeping on free of a spilled pointer. The simulator's host and device
   allocations cost the same, so the difference is the shim's.
Each configuration is run --repeats times, interleaved; the figure is the median of the runs
(ns per pair, per thread: each thread's wall time / its pairs). All in one run of this command.
3. --instructions: instructions executed per alloc+free pair (one thread), without and with the shim,
   counted by valgrind's callgrind (the difference between runs of 20,000 and 60,000 pairs, so start-up
   cancels out). Deterministic: it compares builds on a loaded machine, where wall time does not.

usage: python benchmarks/bench_shim.py [--json] [--pairs N] [--repeats N] [--instructions]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from memslice.paths import lib_paths

HERE = os.path.dirname(os.path.abspath(__file__))


def build(tmp: str) -> str:
    libs = lib_paths()
    exe = os.path.join(tmp, "bench_alloc")
    subprocess.run(["cc", "-O2", f"-I{libs.include}", os.path.join(HERE, "c", "bench_alloc.c"), "-o", exe,
                    "-L", libs.sim_dir, "-l:libcuda.so.1", "-lpthread"], check=True)
    return exe


def env_for(tmp: str, shim: bool, tag: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    libs = lib_paths()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSLICE_") and k != "LD_PRELOAD"}
    env.update(MEMSLICE_SIM_STATE=os.path.join(tmp, f"{tag}.state"), MEMSLICE_SIM_GPUS="80GiB",
               MEMSLICE_SIM_CONTEXT_OVERHEAD="0", LD_LIBRARY_PATH=libs.sim_dir)
    if shim:
        region = os.path.join(tmp, f"{tag}-region")
        os.makedirs(region, exist_ok=True)
        env.update(LD_PRELOAD=libs.shim, MEMSLICE_GPU_MEM_LIMIT="64GiB", MEMSLICE_REGION_DIR=region,
                   MEMSLICE_CONTEXT_RESERVE="0")
    env.update(extra or {})
    return env


def run_once(exe: str, env: dict[str, str], procs: int, threads: int, pairs: int, size: int,
             mode: str = "sync", field: str = "ns_per_pair", batch: int = 1) -> float:
    """Start `procs` processes, release them together, return the median of their `field` (ns)."""
    ps = [subprocess.Popen([exe, str(threads), str(pairs), str(size), mode, str(batch)], env=env, stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True) for _ in range(procs)]
    for p in ps:
        line = p.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"benchmark process failed to start: {line!r}")
    for p in ps:
        p.stdin.write("go\n")
        p.stdin.flush()
    values = []
    for p in ps:
        out, _ = p.communicate(timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"benchmark process failed: {out}")
        values.append(float(out.split(f"{field}=")[1].split()[0]))
    return statistics.median(values)


def measure(exe: str, tmp: str, procs: int, threads: int, pairs: int, repeats: int, size: int,
            mode: str = "sync", extra: dict[str, str] | None = None) -> dict[str, float]:
    base, shim = [], []
    for r in range(repeats):  # interleaved, so drift affects both sides alike
        base.append(run_once(exe, env_for(tmp, False, f"b{procs}{threads}{mode}{r}"), procs, threads, pairs, size,
                             mode))
        shim.append(run_once(exe, env_for(tmp, True, f"s{procs}{threads}{mode}{r}", extra), procs, threads, pairs,
                             size, mode))
    b, s = statistics.median(base), statistics.median(shim)
    return {"without_shim_ns": round(b, 1), "with_shim_ns": round(s, 1), "added_ns": round(s - b, 1),
            "ratio": round(s / b, 3)}


def measure_spill(exe: str, tmp: str, procs: int, threads: int, pairs: int, repeats: int,
                  size: int) -> dict[str, float]:
    cgroup = os.path.join(tmp, "cgroup")
    os.makedirs(cgroup, exist_ok=True)
    for name, value in (("memory.max", "max"), ("memory.current", "0")):
        with open(os.path.join(cgroup, name), "w") as f:
            f.write(value + "\n")
    spill = {"MEMSLICE_OVERSUBSCRIBE": "1", "MEMSLICE_CGROUP_DIR": cgroup}
    runs: dict[str, list[float]] = {k: [] for k in ("fit_alloc", "fit_free", "spill_alloc", "spill_free")}
    for r in range(repeats):
        tag = f"{procs}{threads}{r}"
        for case, extra in (("fit", spill), ("spill", {**spill, "MEMSLICE_GPU_MEM_LIMIT": f"{size // 2}B"})):
            env = env_for(tmp, True, f"{case}{tag}", extra)
            for phase in ("alloc", "free"):
                runs[f"{case}_{phase}"].append(run_once(exe, env, procs, threads, pairs, size, field=f"{phase}_ns",
                                                        batch=8))
    m = {k: statistics.median(v) for k, v in runs.items()}
    return {"alloc_fits_ns": round(m["fit_alloc"], 1), "alloc_spills_ns": round(m["spill_alloc"], 1),
            "free_fitted_ns": round(m["fit_free"], 1), "free_spilled_ns": round(m["spill_free"], 1),
            "spill_alloc_extra_ns": round(m["spill_alloc"] - m["fit_alloc"], 1),
            "spill_free_extra_ns": round(m["spill_free"] - m["fit_free"], 1)}


def instructions(exe: str, tmp: str, shim: bool, pairs: int) -> int:
    """Instructions callgrind counts for one single-thread run of `pairs` pairs."""
    out = os.path.join(tmp, f"cg-{int(shim)}-{pairs}.out")
    env = env_for(tmp, shim, f"i{int(shim)}{pairs}")
    p = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", exe, "1", str(pairs), "4096",
                        "sync", "1"], env=env, input="go\n", capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"callgrind run failed: {p.stderr[-2000:]}")
    with open(out) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError(f"no instruction total in {out}")


def measure_instructions(exe: str, tmp: str) -> dict[str, float]:
    per = {}
    for shim in (False, True):
        lo, hi = instructions(exe, tmp, shim, 20_000), instructions(exe, tmp, shim, 60_000)
        per[shim] = (hi - lo) / 40_000
    return {"without_shim": round(per[False], 1), "with_shim": round(per[True], 1),
            "added": round(per[True] - per[False], 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--pairs", type=int, default=200_000, help="alloc+free pairs per thread per run")
    ap.add_argument("--repeats", type=int, default=7, help="runs per configuration (median reported)")
    ap.add_argument("--size", type=int, default=4096, help="bytes per allocation")
    ap.add_argument("--spill-size", type=int, default=65536, help="bytes per allocation in the spill comparison")
    ap.add_argument("--instructions", action="store_true",
                    help="only count instructions per pair with callgrind (needs valgrind)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="memslice-bench-") as tmp:
        exe = build(tmp)
        if args.instructions:
            ins = measure_instructions(exe, tmp)
            if args.json:
                print(json.dumps({"benchmark": "shim alloc+free pair, instructions", "results": ins}, indent=2))
            else:
                print("instructions per cuMemAlloc_v2+cuMemFree_v2 pair of 4096 B (callgrind, one thread)")
                print(f"without shim {ins['without_shim']}, with shim {ins['with_shim']}, added {ins['added']}")
            return 0
        results = {
            "1 thread, 1 process": measure(exe, tmp, 1, 1, args.pairs, args.repeats, args.size),
            "8 threads in 4 processes": measure(exe, tmp, 4, 2, args.pairs // 4, args.repeats, args.size),
        }
        spill_pairs = max(1000, args.pairs // 4)
        spill = {
            "1 thread, 1 process": measure_spill(exe, tmp, 1, 1, spill_pairs, args.repeats, args.spill_size),
            "8 threads in 4 processes": measure_spill(exe, tmp, 4, 2, spill_pairs // 4, args.repeats,
                                                      args.spill_size),
        }
    if args.json:
        print(json.dumps({"benchmark": "shim alloc+free pair", "size_bytes": args.size, "repeats": args.repeats,
                          "results": results,
                          "oversubscription": {"size_bytes": args.spill_size, "results": spill}}, indent=2))
        return 0
    print(f"alloc+free pair of {args.size} B, median of {args.repeats} runs (ns per pair per thread)")
    print(f"{'case':<26} {'without shim':>13} {'with shim':>10} {'added':>8} {'ratio':>6}")
    for name, r in results.items():
        print(f"{name:<26} {r['without_shim_ns']:>13} {r['with_shim_ns']:>10} {r['added_ns']:>8} {r['ratio']:>6}")
    print(f"\noversubscription: {args.spill_size} B blocks under the shim, ns per call per thread")
    print(f"{'case':<26} {'alloc fits':>11} {'alloc spills':>13} {'extra':>8} {'free':>8} {'free spilled':>13} "
          f"{'extra':>8}")
    for name, r in spill.items():
        print(f"{name:<26} {r['alloc_fits_ns']:>11} {r['alloc_spills_ns']:>13} {r['spill_alloc_extra_ns']:>8} "
              f"{r['free_fitted_ns']:>8} {r['free_spilled_ns']:>13} {r['spill_free_extra_ns']:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

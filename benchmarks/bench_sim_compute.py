"""Kernels in GPU time on the simulated GPU (issue 33 item 4): does wall time match the model?

With tests/c/spin_tenant (no shim) on a fresh simulated node, --repeats times, medians:
  alone_ms       wall time from launching spin(100 ms) to its synchronize returning, one process alone
  pair_ms        the same for two processes launching together (time-sliced: about twice)
  share_a/b      GPU share each of two tenants got over --seconds of back-to-back spin(1 ms) kernels
  roundtrip_us   record + launch spin(0) + record + synchronize + elapsed-time of one process alone (the
                 simulator's own cost per kernel: a timeline session per call)

usage: python benchmarks/bench_sim_compute.py [--json] [--repeats N] [--seconds T]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from memslice.paths import lib_paths

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MS = 1_000_000


def build(tmp: str) -> str:
    exe = os.path.join(tmp, "spin_tenant")
    paths = lib_paths()
    subprocess.run(["cc", "-O2", os.path.join(ROOT, "tests", "c", "spin_tenant.c"), "-o", exe, "-L", paths.sim_dir,
                    "-l:libcuda.so.1", "-ldl"], check=True)
    return exe


def node_env(tmp: str, name: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSLICE_") and k != "LD_PRELOAD"}
    env.update(MEMSLICE_SIM_STATE=os.path.join(tmp, f"{name}.state"), MEMSLICE_SIM_GPUS="80GiB",
               MEMSLICE_SIM_CONTEXT_OVERHEAD="0", LD_LIBRARY_PATH=lib_paths().sim_dir)
    return env


def tenants(exe: str, env: dict[str, str], n: int, args: list[str]) -> list[dict[str, Any]]:
    """n spin_tenants starting together (1 s from now), their figures."""
    start = time.clock_gettime_ns(time.CLOCK_MONOTONIC) + 1_000 * MS
    ps = [subprocess.Popen([exe, *args, "--start-at", str(start)], env=env, stdout=subprocess.PIPE, text=True)
          for _ in range(n)]
    out = []
    for p in ps:
        stdout, _ = p.communicate(timeout=600)
        if p.returncode != 0:
            raise RuntimeError("a spin tenant failed")
        out.append(json.loads(stdout))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()
    runs: dict[str, list[float]] = {k: [] for k in ("alone_ms", "pair_ms", "share_a", "share_b", "roundtrip_us")}
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(tmp)
        for r in range(args.repeats):
            env = node_env(tmp, f"n{r}")
            alone = tenants(exe, env, 1, ["--ns", str(100 * MS), "--count", "5"])[0]
            runs["alone_ms"].append(alone["lat_ns_p50"] / MS)
            pair = tenants(exe, env, 2, ["--ns", str(100 * MS), "--count", "5"])
            runs["pair_ms"].append(statistics.median(t["lat_ns_p50"] for t in pair) / MS)
            a, b = tenants(exe, env, 2, ["--ns", str(MS), "--seconds", str(args.seconds)])
            runs["share_a"].append(a["gpu_ns"] / a["wall_ns"])
            runs["share_b"].append(b["gpu_ns"] / b["wall_ns"])
            rt = tenants(exe, env, 1, ["--ns", "0", "--count", "5000"])[0]
            runs["roundtrip_us"].append(rt["lat_ns_p50"] / 1000)
    results = {k: round(statistics.median(v), 3) for k, v in runs.items()}
    if args.json:
        print(json.dumps(results))
    else:
        print(f"spin(100 ms) alone, launch to synchronize:        {results['alone_ms']:.1f} ms")
        print(f"the same next to an equal neighbour:               {results['pair_ms']:.1f} ms")
        print(f"shares of two back-to-back spin(1 ms) tenants:     {results['share_a']:.3f} / {results['share_b']:.3f}")
        print(f"round trip of an empty kernel (record, launch, record, sync): {results['roundtrip_us']:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Cost of a simulated-GPU allocation as the node fills with containers.

On the simulated overlay each container keeps its own usage ledger and a device charge reads the other
containers' (bounded, validated preads of their headers, with a liveness check) under the node lock. This
measures the median ns per cuMemAlloc_v2+cuMemFree_v2 pair (4 KiB, 1 thread, no shim) on the simulated
driver alone, with 0 (local use: one ledger, no lock), 8 and 32 live peer containers, --repeats runs
interleaved, all in one run of this command.

usage: python benchmarks/bench_sim_peers.py [--json] [--pairs N] [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from bench_shim import build, run_once

from memslice.paths import lib_paths


def peer_env(tmp: str, name: str, peers: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSLICE_") and k != "LD_PRELOAD"}
    env.update(MEMSLICE_SIM_STATE=os.path.join(tmp, "node.state"), MEMSLICE_SIM_GPUS="80GiB",
               MEMSLICE_SIM_CONTEXT_OVERHEAD="0", LD_LIBRARY_PATH=lib_paths().sim_dir)
    if peers:
        os.makedirs(os.path.join(tmp, "regions", name), exist_ok=True)
        env.update(MEMSLICE_SIM_PEERS=os.path.join(tmp, "regions"),
                   MEMSLICE_SIM_USAGE=os.path.join(tmp, "regions", name, "sim.usage"))
    return env


def start_peers(tmp: str, n: int) -> list[subprocess.Popen[str]]:
    """n containers, each one process holding 16 MiB, until their stdin closes."""
    ps = [subprocess.Popen([sys.executable, "-m", "memslice.tenant", "16"], env=peer_env(tmp, f"peer{i}", True),
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for i in range(n)]
    for p in ps:
        if '"result": 0' not in p.stdout.readline():
            raise RuntimeError("a peer container failed to allocate")
    return ps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--pairs", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(tmp)
        runs: dict[str, list[float]] = {"0 peers (local)": [], "8 peers": [], "32 peers": []}
        peers: list[subprocess.Popen[str]] = []
        try:
            for label, n in (("8 peers", 8), ("32 peers", 32)):
                peers += start_peers(tmp, n - len(peers))
                for _ in range(args.repeats):
                    runs["0 peers (local)"].append(run_once(exe, peer_env(tmp, "local", False), 1, 1, args.pairs,
                                                            4096))
                    runs[label].append(run_once(exe, peer_env(tmp, "me", True), 1, 1, args.pairs, 4096))
        finally:
            for p in peers:
                p.stdin.close()
                p.wait(timeout=30)
        results = {k: statistics.median(v) for k, v in runs.items()}
    if args.json:
        print(json.dumps({"ns_per_alloc_free_pair": results}))
    else:
        for k, v in results.items():
            print(f"{k:>18}: {v / 1000:8.1f} us per cuMemAlloc_v2+cuMemFree_v2 (median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The compute share (issue 33): shares achieved, work conservation, the limit, priority latency, and the shim's
added cost per launch. One command; the simulated GPU by default, a real GPU with --real (the kit runs it so).

Each tenant is tests/c/spin.c: saturating launches of a `spin` kernel worth KERNEL_US of GPU time (at most 8 of
its own in flight), or one synchronised launch at a time (latency mode). A tenant's share over a window is the
work its kernels completed in it (launches x KERNEL_US, counted by the client itself between a mark at
--warmup seconds and the end) over the window: on the simulated GPU that is the GPU time the simulator gave it
(its timeline runs `spin` for exactly its parameter); on a real GPU the kernel is a fixed amount of work
calibrated alone, so it is the share of the GPU's capacity the tenant got.

1. bare: one tenant without the shim (the GPU's capacity, ~100 %)
2. alone: one tenant with the shim, request 30, no limit: work-conserving, target >= 95 % of bare
3. limit: one tenant alone with limit 40: target <= 45 %
4. pairs 70/30 and 50/50, both saturating: target each within +-5 points of its request
5. priority: a 50 us kernel of a tenant with priority 1000 (request 10), one every 1 ms, next to a hog
   (best effort, limit 90, priority 0): its p99 latency next to the hog over its p99 alone (target <= 2), and
   the hog's share meanwhile (priority is strict above a request: the hog waits while the other has work)
6. instructions per cuLaunchKernel, without and with the shim (callgrind, --toggle-collect=cuLaunchKernel, the
   difference between 2,000 and 6,000 launches so start-up cancels out); skipped without valgrind

usage: python benchmarks/bench_compute.py [--json] [--window S] [--warmup S] [--kernel-us US] [--real]
                                           [--repeats N] [--no-instructions]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

from memslice.paths import lib_paths

HERE = os.path.dirname(os.path.abspath(__file__))
SPIN_C = os.path.join(HERE, "..", "tests", "c", "spin.c")


def build(tmp: str, real: bool) -> str:
    libs = lib_paths()
    exe = os.path.join(tmp, "spin")
    link = ["-l:libcuda.so.1"] if real else ["-L", libs.sim_dir, "-l:libcuda.so.1"]
    subprocess.run(["cc", "-O2", f"-I{libs.include}", SPIN_C, "-o", exe, *link], check=True)
    return exe


@dataclass
class Bench:
    exe: str
    tmp: str
    real: bool
    kernel_us: float
    warmup: float
    window: float
    base: dict[str, str] = field(default_factory=dict)
    runs: int = 0

    def env(self, shim: bool, compute_dir: str, **share: str) -> dict[str, str]:
        env = dict(self.base)
        if shim:
            env["LD_PRELOAD"] = lib_paths().shim
            env["MEMSLICE_COMPUTE_DIR"] = compute_dir
            env.update(share)
        return env

    def start(self, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([self.exe, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def board(self) -> str:
        self.runs += 1
        d = os.path.join(self.tmp, f"compute-{self.runs}")
        os.makedirs(d, mode=0o700)
        return d


def kv(text: str) -> dict[str, str]:
    return dict(tok.split("=", 1) for line in text.splitlines() for tok in line.split() if "=" in tok)


def finish(p: subprocess.Popen[str], timeout: float) -> dict[str, str]:
    out, err = p.communicate(timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"spin failed ({p.returncode}): {err[-1500:]}")
    return kv(out)


def saturating(b: Bench, envs: list[dict[str, str]]) -> list[float]:
    """Each tenant's share (percent) over the window, all running at once."""
    total = b.warmup + b.window
    procs = [b.start({**e, "SPIN_MARK_S": str(b.warmup)}, str(total), str(b.kernel_us)) for e in envs]
    shares = []
    for p in procs:
        r = finish(p, total + 120)
        work_us = (int(r["launches"]) - int(r["mark_launches"])) * b.kernel_us
        window = float(r["wall_s"]) - b.warmup
        shares.append(100.0 * work_us / (window * 1e6))
    return shares


def latency(b: Bench, hog: dict[str, str] | None, hi: dict[str, str], seconds: float) -> dict[str, float]:
    """The high-priority tenant's latency figures (50 us kernel every 1 ms), alone or next to the hog, and the
    hog's share meanwhile (the work done between marks at 1 s and at `seconds`: while the other one runs)."""
    hog_p = b.start({**hog, "SPIN_MARK_S": "1", "SPIN_MARK2_S": str(seconds)}, str(seconds + 1), str(b.kernel_us)) \
        if hog else None
    try:
        r = finish(b.start(hi, str(seconds), "50", "1000"), seconds + 120)
    finally:
        h = finish(hog_p, seconds + 120) if hog_p else None
    out = {k: float(r[k]) for k in ("p50_us", "p99_us", "max_us")}
    if h:
        out["hog_share_pct"] = 100.0 * (int(h["mark2_launches"]) - int(h["mark_launches"])) * b.kernel_us / (
            (seconds - 1) * 1e6)
    return out


def instructions(b: Bench, shim: bool, n: int) -> int:
    out = os.path.join(b.tmp, f"cg-{int(shim)}-{n}.out")
    env = {**b.env(shim, b.board(), MEMSLICE_GPU_COMPUTE_REQUEST="30"), "SPIN_COUNT": str(n)}
    p = subprocess.run(["valgrind", "--tool=callgrind", "--toggle-collect=cuLaunchKernel",
                        f"--callgrind-out-file={out}", b.exe, "1", "0"], env=env, capture_output=True, text=True,
                       timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"callgrind run failed: {p.stderr[-2000:]}")
    with open(out) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError(f"no instruction total in {out}")


def measure(b: Bench, repeats: int, with_instructions: bool) -> dict[str, object]:
    med = statistics.median
    res: dict[str, object] = {}
    bare = med([saturating(b, [b.env(False, "")])[0] for _ in range(repeats)])
    alone = med([saturating(b, [b.env(True, b.board(), MEMSLICE_GPU_COMPUTE_REQUEST="30")])[0]
                 for _ in range(repeats)])
    res["bare_share_pct"] = round(bare, 1)
    res["alone_request30_share_pct"] = round(alone, 1)
    res["alone_vs_bare"] = round(alone / bare, 3) if bare else 0.0
    res["limit40_alone_share_pct"] = round(med([saturating(
        b, [b.env(True, b.board(), MEMSLICE_GPU_COMPUTE_REQUEST="0", MEMSLICE_GPU_COMPUTE_LIMIT="40")])[0]
        for _ in range(repeats)]), 1)
    for a, c in ((70, 30), (50, 50)):
        runs = []
        for _ in range(repeats):
            d = b.board()
            runs.append(saturating(b, [b.env(True, d, MEMSLICE_GPU_COMPUTE_REQUEST=str(a)),
                                       b.env(True, d, MEMSLICE_GPU_COMPUTE_REQUEST=str(c))]))
        res[f"pair_{a}_{c}_shares_pct"] = [round(med([r[0] for r in runs]), 1), round(med([r[1] for r in runs]), 1)]
    seconds = max(b.window, 5.0)
    alone_runs, next_runs = [], []
    for _ in range(repeats):  # interleaved: the host's load hits both alike
        d = b.board()
        hi = b.env(True, d, MEMSLICE_GPU_COMPUTE_REQUEST="10", MEMSLICE_PRIORITY="1000")
        hog = b.env(True, d, MEMSLICE_GPU_COMPUTE_REQUEST="0", MEMSLICE_GPU_COMPUTE_LIMIT="90", MEMSLICE_PRIORITY="0")
        alone_runs.append(latency(b, None, hi, seconds))
        next_runs.append(latency(b, hog, hi, seconds))
    alone_lat = {k: round(med([r[k] for r in alone_runs]), 1) for k in alone_runs[0]}
    next_lat = {k: round(med([r[k] for r in next_runs]), 1) for k in next_runs[0]}
    res["priority_alone_us"] = alone_lat
    res["priority_next_to_hog_us"] = next_lat
    res["priority_p99_ratio"] = round(next_lat["p99_us"] / alone_lat["p99_us"], 2) if alone_lat["p99_us"] else 0.0
    res["priority_p50_ratio"] = round(next_lat["p50_us"] / alone_lat["p50_us"], 2) if alone_lat["p50_us"] else 0.0
    if with_instructions and shutil.which("valgrind") and not b.real:
        per = {}
        for shim in (False, True):
            per[shim] = (instructions(b, shim, 6000) - instructions(b, shim, 2000)) / 4000
        res["instructions_per_launch"] = {"without_shim": round(per[False], 1), "with_shim": round(per[True], 1),
                                          "added": round(per[True] - per[False], 1)}
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--window", type=float, default=10.0, help="seconds each share is measured over")
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds before the window starts")
    ap.add_argument("--kernel-us", type=float, default=1000.0, help="GPU time of one saturating kernel")
    ap.add_argument("--repeats", type=int, default=1, help="runs per configuration (median reported)")
    ap.add_argument("--real", action="store_true", help="the real GPU (libcuda.so.1 of this machine)")
    ap.add_argument("--no-instructions", action="store_true", help="skip the callgrind count")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="memslice-bench-compute-") as tmp:
        exe = build(tmp, args.real)
        base = {k: v for k, v in os.environ.items() if not k.startswith("MEMSLICE_") and k != "LD_PRELOAD"}
        if not args.real:
            from memslice.simulator import sim_env

            base = sim_env("80GiB", state=os.path.join(tmp, "gpu.state"), base=base)
        else:
            cal = kv(subprocess.run([exe, "--calibrate"], env=base, capture_output=True, text=True, timeout=120,
                                    check=True).stdout)
            base["SPIN_ITERS_PER_US"] = cal["iters_per_us"]
        b = Bench(exe, tmp, args.real, args.kernel_us, args.warmup, args.window, base)
        res = measure(b, args.repeats, not args.no_instructions)
    doc = {"benchmark": "compute share", "gpu": "real" if args.real else "simulated", "window_s": args.window,
           "kernel_us": args.kernel_us, "repeats": args.repeats, "results": res}
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"compute share on the {doc['gpu']} GPU: {args.window:g} s windows, {args.kernel_us:g} us kernels")
    for k, v in res.items():
        print(f"  {k:<28} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Elastic GPU memory on the simulated GPU (issue 13), in one run:

1. Gated call cost: ns per call without the shim, with it (no elastic: the gate is one branch), and in
   elastic mode (the gate's counters), for cuMemsetD8_v2 (1 byte; gated from the start) and two entry points
   gated later, cuMemsetD2D8Async and cuMemcpy2D_v2 (1 x 1 byte). Median of --repeats interleaved runs.
   --gate-only measures this alone; --instructions counts instructions per call instead (valgrind's
   callgrind, the difference between runs of 20,000 and 60,000 calls: deterministic on a loaded machine).
2. Swap time per GiB: tenant A fills --swap-mib, goes idle; B needs HBM, A moves to host memory; A runs
   again and moves back. Seconds per GiB from A's own counters on the board (swap_out_ns / swap_in_ns).
   The simulator's "HBM" is host memory, so this is the shim's and the copy's cost, not PCIe's; what carries
   over to a real GPU is the structure (issue 39 item 4), from the simulated driver's counters of A
   (memsliceSimCounters): chunk moves each way, asynchronous copies, the most copies in flight at once (on
   several streams: they overlap on a real GPU's copy engines), unmaps under a copy still in flight (0).
   --swap-only measures this alone. The link rate on a real GPU is the GPU kit's
   (tests/gpu/run.sh -k elastic). Two cycles out and back: "cold" (A pins its host chunks) and "warm" (A's
   pinned host pool is reused: MEMSLICE_HOST_POOL_KEEP=600), each with its GB/s, its phase split (A's log at
   MEMSLICE_LOG=info, memslice.elastic.parse_move_phases) and its data check. With the simulator's time
   model (--link-gbps: a link of that bandwidth every async copy crosses; --vmm-us: a cost per map/unmap/
   access call; --pin-us-per-mib: a cost per pinned or unpinned MiB; interposer/sim/simcuda_inflight.c) the
   figures show the overlap: "critical ÷ link" is A's move time over the time the link alone needs for the
   bytes moved (1.0: every other phase hidden behind the copies).
3. Density (issue 26.7): notebook tenants on one simulated GPU (--gpu-mib), each a trace of bursts and idle
   gaps (working set per burst drawn from {typical 60%, 2x typical 30%, peak 10%}; gaps exponential with mean
   --gap s; idle after 0.3 s; time compressed). Static slices admit floor(GPU / peak) tenants (quota = peak).
   "elastic" (requests stay in HBM, idle or not) admits floor(--headroom x GPU / typical) with request =
   typical, limit = peak: the rest of HBM is for bursts. "elastic-release" (notebooks that opted in to giving
   up their request while idle, MEMSLICE_IDLE_RELEASE=1) admits floor(GPU / typical). Reported per mode:
   tenants admitted, OOMs, data errors (every burst writes a pattern and reads every byte back), p50/p95
   seconds from waking (the burst's first call) to fully resident, mean HBM occupancy (sampled), moved /
   needed (what neighbours moved for the tenants' asks over what those asks needed, from the board), and the
   request-residency check: each 0.1 s, for every tenant that did not opt in, its bytes in the simulator's
   device memory against min(request, what it holds): the samples where its request was not all resident.
   A tenant in the middle of its own `free` is not sampled: it is releasing its request itself, range by
   range, so for a moment it holds bursts in host memory and less than its request in HBM (issue 26.7: all
   the misses of the earlier runs were such samples).

4. Skip time (issue 35.10; --skip-only): how long a tenant's allocation within its request takes when the
   neighbour it asks does not answer: "stopped" (the bursting neighbour is SIGSTOPped: skipped after the ack
   bound, the request served from host memory) and "squatted" (the 62 other slots of the board held by a
   process that forged them idle, claiming the whole GPU, and never answers; the roster names the real
   neighbour, which yields). Median seconds of --repeats fresh runs each; the tests assert what is skipped
   and why (tests/elastic/test_elastic_swap.py, tests/elastic/test_elastic_board_attacks.py), this measures how long.

usage: python benchmarks/bench_elastic.py [--json] [--gate-only] [--repeats N] [--swap-mib N] [--gpu-mib N]
                                          [--duration S] [--skip-only] [--swap-only] [--link-gbps G]
                                          [--vmm-us U] [--pin-us-per-mib U]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from memslice.elastic import LIVE_OFF, MOVE_PHASE_KEYS, RosterEntry, parse_move_phases, read_boards, render_roster
from memslice.interposer.region import read_region_file
from memslice.paths import lib_paths

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MiB = 1 << 20


def build(tmp: Path) -> dict[str, str]:
    libs = lib_paths()
    out = {}
    for name, src in (("gate", HERE / "c" / "bench_gate.c"), ("tenant", ROOT / "tests" / "c" / "elastic.c")):
        exe = tmp / name
        subprocess.run(["cc", "-O2", f"-I{libs.include}", str(src), "-o", str(exe), "-L", libs.sim_dir,
                        "-l:libcuda.so.1", "-lpthread", "-ldl"], check=True)
        out[name] = str(exe)
    return out


def node_env(tmp: Path, gpus: str, ctx: str = "0") -> dict[str, str]:
    libs = lib_paths()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSLICE_") and k != "LD_PRELOAD"}
    env.update(MEMSLICE_SIM_STATE=str(tmp / "node.state"), MEMSLICE_SIM_GPUS=gpus,
               MEMSLICE_SIM_CONTEXT_OVERHEAD=ctx, LD_LIBRARY_PATH=libs.sim_dir, MEMSLICE_CONTEXT_RESERVE="0")
    return env


def tenant_env(base: dict[str, str], region: Path, limit: int, request: int | None, edir: Path,
               release: bool = False) -> dict[str, str]:
    region.mkdir(parents=True, exist_ok=True)
    env = dict(base, LD_PRELOAD=lib_paths().shim, MEMSLICE_REGION_DIR=str(region),
               MEMSLICE_GPU_MEM_LIMIT=f"{limit}MiB", MEMSLICE_ELASTIC_DIR=str(edir), MEMSLICE_IDLE_AFTER="0.3",
               MEMSLICE_YIELD_WAIT="10", MEMSLICE_IDLE_RELEASE="1" if release else "0")
    if request is not None:
        env["MEMSLICE_GPU_MEM_REQUEST"] = f"{request}MiB"
    return env


class Tenant:
    def __init__(self, exe: str, env: dict[str, str], stderr: object = subprocess.DEVNULL) -> None:
        self.p = subprocess.Popen([exe], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  stderr=stderr)  # type: ignore[call-overload]
        if self.read() != "ready":
            raise RuntimeError("tenant did not start")

    def read(self) -> str:
        assert self.p.stdout is not None
        return self.p.stdout.readline().strip()

    def cmd(self, line: str) -> str:
        assert self.p.stdin is not None
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        return self.read()

    def stop(self) -> None:
        if self.p.stdin:
            self.p.stdin.close()
        self.p.wait(timeout=120)


GATE_CALLS = {"set8": "cuMemsetD8_v2", "set2d8async": "cuMemsetD2D8Async", "copy2d": "cuMemcpy2D_v2"}


def gate_cost(exe: str, tmp: Path, repeats: int, calls: int) -> dict[str, dict[str, float]]:
    base = node_env(tmp / "gate-run", "4GiB")
    (tmp / "gate-run").mkdir()
    envs = {"no shim": base,
            "shim, not elastic": tenant_env(base, tmp / "gate-run" / "r1", 1024, None, tmp),
            "shim, elastic": tenant_env(base, tmp / "gate-run" / "r2", 1024, 512, tmp)}
    got: dict[tuple[str, str], list[float]] = {(c, k): [] for c in GATE_CALLS for k in envs}
    for _ in range(repeats):
        for (call, k) in got:
            out = subprocess.run([exe, str(calls), call], env=envs[k], capture_output=True, text=True,
                                 check=True).stdout
            got[call, k].append(float(out.split()[1]))
    return {name: {k: round(statistics.median(got[call, k]), 1) for k in envs} for call, name in GATE_CALLS.items()}


def callgrind_total(cmd: list[str], env: dict[str, str], out: Path) -> int:
    """Instructions callgrind counts for one run of cmd (all threads)."""
    p = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *cmd], env=env,
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"callgrind run failed: {p.stderr[-2000:]}")
    for line in out.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"no instruction total in {out}")


def gate_instructions(exe: str, tmp: Path) -> dict[str, dict[str, float]]:
    """Instructions per gated call, per entry point and configuration (the 1 MiB buffer stays on the plain
    path, so no elastic background thread runs: the count is deterministic)."""
    base = node_env(tmp / "gate-cg", "4GiB")
    (tmp / "gate-cg").mkdir()
    envs = {"no shim": base,
            "shim, not elastic": tenant_env(base, tmp / "gate-cg" / "r1", 1024, None, tmp),
            "shim, elastic": tenant_env(base, tmp / "gate-cg" / "r2", 1024, 512, tmp)}
    res: dict[str, dict[str, float]] = {}
    for call, name in GATE_CALLS.items():
        res[name] = {}
        for k, env in envs.items():
            lo, hi = (callgrind_total([exe, str(n), call], env, tmp / f"cg-{call}-{len(res[name])}-{n}.out")
                      for n in (20_000, 60_000))
            res[name][k] = round((hi - lo) / 40_000, 1)
    return res


# memsliceSimCounters' order (interposer/sim/simstate.h)
SIM_HOST_CREATES, SIM_ASYNC_COPIES, SIM_UNMAPS_IN_FLIGHT, SIM_IN_FLIGHT_MAX = 2, 6, 8, 10
SIM_RUN_UNMAPS, SIM_HOST_RELEASES = 13, 15


def sim_counters(t: Tenant) -> list[int]:
    out = t.cmd("counters").split()
    return [int(x) for x in out[1:]] if len(out) > SIM_IN_FLIGHT_MAX + 1 else []


def phase_delta(after: dict[str, int], before: dict[str, int]) -> dict[str, float]:
    """One cycle's phases: the difference of two cumulative snapshots, times in ms."""
    return {k.removesuffix("_ns"): (round((after.get(k, 0) - before.get(k, 0)) / 1e6, 1) if k.endswith("_ns")
                                    else after.get(k, 0) - before.get(k, 0)) for k in MOVE_PHASE_KEYS}


def swap_cycle(exe: str, a: Tenant, name: str, base: dict[str, str], d: Path, mib: int, edir: Path,
               log: Path, link_gbps: float) -> dict[str, object]:
    """A idle; B needs HBM (A moves out); B leaves, A runs (A moves back): A's figures for this cycle."""
    wait(lambda: any(t.pid == a.p.pid and t.state == "idle" for t in read_boards(edir)), 60)
    me0 = next(t for t in read_boards(edir) if t.pid == a.p.pid)
    ph0 = parse_move_phases(log.read_text())
    c0 = sim_counters(a)
    b = Tenant(exe, tenant_env(base, d / name, mib, 64, edir))
    assert b.cmd(f"alloc {mib} {mib}").startswith("allocated")
    c1 = sim_counters(a)  # before B leaves: A brings its chunks back as soon as HBM has room
    b.stop()
    check = a.cmd("check")
    wait(lambda: any(t.pid == a.p.pid and t.swapped_bytes == 0 for t in read_boards(edir)), 120)
    me = next(t for t in read_boards(edir) if t.pid == a.p.pid)
    wait(lambda: parse_move_phases(log.read_text()).get("in", {}).get("chunks", 0) >=
         ph0.get("in", {}).get("chunks", 0) + me.swap_ins - me0.swap_ins, 30)
    ph = parse_move_phases(log.read_text())
    c2 = sim_counters(a)
    out_n, in_n = me.swap_outs - me0.swap_outs, me.swap_ins - me0.swap_ins
    out_s, in_s = me.swap_out_seconds - me0.swap_out_seconds, me.swap_in_seconds - me0.swap_in_seconds
    res: dict[str, object] = {
        "chunk_moves_out": out_n, "chunk_moves_in": in_n,
        "out_gb_per_s": round(out_n * 32 * MiB / out_s / 1e9, 3) if out_s else None,
        "in_gb_per_s": round(in_n * 32 * MiB / in_s / 1e9, 3) if in_s else None,
        "phases_out_ms": phase_delta(ph.get("out", {}), ph0.get("out", {})),
        "phases_in_ms": phase_delta(ph.get("in", {}), ph0.get("in", {})),
        "data_intact": check.startswith("check ok") and a.cmd("check").startswith("check ok")}
    if link_gbps and out_s and in_s:
        res["critical_over_link_out"] = round(out_s / (out_n * 32 * MiB / (link_gbps * 1e9)), 2)
        res["critical_over_link_in"] = round(in_s / (in_n * 32 * MiB / (link_gbps * 1e9)), 2)
    if c0 and c1 and c2:
        res.update(async_copies_out=c1[SIM_ASYNC_COPIES] - c0[SIM_ASYNC_COPIES],
                   async_copies_in=c2[SIM_ASYNC_COPIES] - c1[SIM_ASYNC_COPIES],
                   copies_in_flight_max=c2[SIM_IN_FLIGHT_MAX],
                   unmaps_under_a_copy_in_flight=c2[SIM_UNMAPS_IN_FLIGHT])
        if len(c2) > SIM_HOST_RELEASES:
            res.update(host_chunks_pinned=c2[SIM_HOST_CREATES] - c0[SIM_HOST_CREATES],
                       host_chunks_unpinned=c2[SIM_HOST_RELEASES] - c0[SIM_HOST_RELEASES],
                       run_unmaps=c2[SIM_RUN_UNMAPS] - c0[SIM_RUN_UNMAPS])
    return res


def swap_time(exe: str, tmp: Path, mib: int, model: dict[str, float] | None = None) -> dict[str, object]:
    d = tmp / "swap"
    edir = d / "elastic"
    edir.mkdir(parents=True)
    gpu = mib + mib // 2
    model = model or {}
    base = node_env(d, f"{gpu}MiB")
    for var, key in (("MEMSLICE_SIM_LINK_GBPS", "link_gbps"), ("MEMSLICE_SIM_VMM_US", "vmm_us"),
                     ("MEMSLICE_SIM_PIN_US_PER_MIB", "pin_us_per_mib")):
        if model.get(key):  # the simulated driver reads these (interposer/sim/simcuda_inflight.c)
            base[var] = str(model[key])
    log = d / "a.log"
    with log.open("w") as err:
        a = Tenant(exe, dict(tenant_env(base, d / "a", mib, 64, edir), MEMSLICE_LOG="info",
                             MEMSLICE_HOST_POOL_KEEP=str(model.get("pool_keep", 600))), stderr=err)
        try:
            assert a.cmd(f"alloc {mib} {mib}").startswith("allocated")  # one range: one ask, one answer
            res = {"cold": swap_cycle(exe, a, "b", base, d, mib, edir, log, model.get("link_gbps", 0)),
                   "warm": swap_cycle(exe, a, "b2", base, d, mib, edir, log, model.get("link_gbps", 0))}
        finally:
            a.stop()
    return {"model": model, **res}


SQUATTER = """
import fcntl, os, struct, sys
board, first = sys.argv[1], int(sys.argv[2])
forged = struct.pack("<IIiI10QiIQIIII", 0x4C45534D, 2, 1, 5, 0, 1 << 40, 1 << 40, 0, 86_400_000, *[0] * 12)
for i in range(first, 64):
    fd = os.open(os.path.join(board, "%02d.slot" % i), os.O_RDWR | os.O_CREAT)
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, {live}, 0)
    os.pwrite(fd, forged, 0)
print("in", flush=True)
sys.stdin.read()
"""


def skip_once(exe: str, d: Path, case: str) -> float:
    """Seconds B's 768 MiB request takes when the neighbour asked does not answer (see the docstring, 4)."""
    edir = d / "elastic"
    edir.mkdir(parents=True)
    base = node_env(d, "2GiB", "64MiB")
    a = Tenant(exe, dict(tenant_env(base, d / "a", 1536, 128, edir), MEMSLICE_ELASTIC_SLOT="0",
                         MEMSLICE_IDLE_AFTER="0.3" if case == "stopped" else "600"))
    sq: subprocess.Popen[str] | None = None
    b: Tenant | None = None
    try:
        assert a.cmd("alloc 1280 64") == "allocated 20"
        if case == "stopped":
            wait(lambda: any(t.pid == a.p.pid and t.state == "idle" for t in read_boards(edir)), 60)
            os.kill(a.p.pid, 19)  # SIGSTOP
        else:
            board = next(edir.glob("*.board"))
            (edir / f"{board.name.removesuffix('.board')}.roster").write_bytes(
                render_roster([RosterEntry(0, 128, 1536), RosterEntry(1, 768, 1024)]))
            sq = subprocess.Popen([sys.executable, "-c", SQUATTER.format(live=LIVE_OFF), str(board), "2"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert sq.stdout is not None and sq.stdout.readline() == "in\n"
        b = Tenant(exe, dict(tenant_env(base, d / "b", 1024, 768, edir), MEMSLICE_ELASTIC_SLOT="1",
                             MEMSLICE_YIELD_WAIT="30"))
        t0 = time.monotonic()
        assert b.cmd("alloc 768 32") == "allocated 24"
        return time.monotonic() - t0
    finally:
        if case == "stopped":
            os.kill(a.p.pid, 18)  # SIGCONT
        if sq is not None and sq.stdin is not None:
            sq.stdin.close()
            sq.wait(timeout=60)
        for t in (b, a):
            if t is not None:
                t.stop()


def skip_time(exe: str, tmp: Path, repeats: int) -> dict[str, float]:
    return {case: round(statistics.median(skip_once(exe, tmp / f"skip-{case}-{i}", case) for i in range(repeats)), 2)
            for case in ("stopped", "squatted")}


def wait(cond, timeout: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark condition not reached")
        time.sleep(0.02)


def request_misses(snap_procs: dict[int, tuple[int, int]], pids: list[int], request: int) -> int:
    """Tenants whose request is not all in device memory in one sample (pure): device < min(request, held)."""
    return sum(1 for p in pids if p in snap_procs and snap_procs[p][0] < min(request, sum(snap_procs[p])))


def freeing_during(before: list[int], after: list[int], pids: list[int]) -> set[int]:
    """The tenants that were in their own `free` at some point of a sample (pure): each one's free counter
    (odd while freeing) read before and after the snapshot; odd on either side, or changed, means it was."""
    return {p for p, b, a in zip(pids, before, after, strict=True) if b % 2 or a % 2 or a != b}


def density(exe: str, tmp: Path, mode: str, gpu_mib: int, peak: int, typical: int, duration: float, gap: float,
            seed: int, headroom: float = 0.75) -> dict[str, object]:
    d = tmp / f"density-{mode}"
    edir = d / "elastic"
    edir.mkdir(parents=True)
    base = node_env(d, f"{gpu_mib}MiB")
    admitted = {"static": gpu_mib // peak, "elastic": int(headroom * gpu_mib) // typical,
                "elastic-release": gpu_mib // typical}[mode]
    release = mode == "elastic-release"
    tenants = [Tenant(exe, tenant_env(base, d / f"t{i}", peak, None if mode == "static" else typical, edir, release))
               for i in range(admitted)]
    pids = [t.p.pid for t in tenants]
    ooms = errors = 0
    wake: list[float] = []
    occupancy: list[float] = []
    residency = {"samples": 0, "misses": 0, "freeing": 0}
    frees = [0] * len(tenants)  # per tenant: +1 when it starts its own free, +1 when done (odd: freeing)
    late = [0]  # wakes not fully resident within 30 s
    asks = {"asked_mib": 0, "moved_mib": 0}
    lock = threading.Lock()
    stop = time.monotonic() + duration

    def run(i: int, t: Tenant) -> None:
        nonlocal ooms, errors
        r = random.Random(seed * 1000 + i)
        while time.monotonic() < stop:
            time.sleep(r.expovariate(1 / gap))
            ws = r.choices([typical, 2 * typical, peak], [0.6, 0.3, 0.1])[0]
            t0 = time.monotonic()
            chk = t.cmd("check")               # the wake: reads the previous working set
            if mode == "elastic":
                try:
                    wait(lambda: all(x.swapped_bytes == 0 for x in read_boards(edir) if x.pid == t.p.pid), 30)
                    dt: float | None = time.monotonic() - t0
                except TimeoutError:
                    dt = None
                    with lock:
                        late[0] += 1
            else:
                dt = time.monotonic() - t0
            frees[i] += 1
            t.cmd("free")
            frees[i] += 1
            out = t.cmd(f"alloc {ws} 32")
            chk2 = t.cmd("check")
            with lock:
                errors += (not chk.startswith("check ok")) + (not chk2.startswith("check ok"))
                ooms += out.startswith("oom")
                if dt is not None:
                    wake.append(dt)

    def sample() -> None:
        while time.monotonic() < stop:
            before = list(frees)
            snap = read_region_file(str(d / "node.state.usage"))
            if snap and snap.devices:
                occupancy.append(snap.devices[0].used_bytes / (gpu_mib * MiB))
                if mode == "elastic":
                    procs = {p.pid: (p.device_bytes, p.host_bytes) for p in snap.processes if p.alive}
                    busy = freeing_during(before, list(frees), pids)
                    steady = [p for p in pids if p not in busy]
                    residency["samples"] += len(steady)
                    residency["freeing"] += len(busy)
                    residency["misses"] += request_misses(procs, steady, typical * MiB)
            if mode != "static":  # the tenants' own ask counters (monotonic while they live)
                live = [t for t in read_boards(edir) if t.pid in pids]
                asks["asked_mib"] = max(asks["asked_mib"], sum(t.asked_mib for t in live))
                asks["moved_mib"] = max(asks["moved_mib"], sum(t.got_mib for t in live))
            time.sleep(0.1)

    threads = [threading.Thread(target=run, args=(i, t)) for i, t in enumerate(tenants)]
    threads.append(threading.Thread(target=sample))
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for t in tenants:
        t.stop()
    wake.sort()
    q = (lambda f: round(wake[min(len(wake) - 1, int(f * len(wake)))], 3)) if wake else (lambda f: None)
    out: dict[str, object] = {
        "tenants_admitted": admitted, "ooms": ooms, "data_errors": errors, "bursts": len(wake),
        "wake_to_resident_p50_s": q(0.5), "wake_to_resident_p95_s": q(0.95),
        "hbm_occupancy_mean": round(statistics.mean(occupancy), 3) if occupancy else None,
        "wakes_not_resident_in_30s": late[0]}
    if mode != "static":
        out.update(ask_needed_mib=asks["asked_mib"], ask_moved_mib=asks["moved_mib"],
                   moved_over_needed=round(asks["moved_mib"] / asks["asked_mib"], 3) if asks["asked_mib"] else None)
    if mode == "elastic":
        out.update(request_residency_samples=residency["samples"], request_not_resident=residency["misses"],
                   samples_left_out_freeing=residency["freeing"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--calls", type=int, default=300_000)
    ap.add_argument("--swap-mib", type=int, default=1024)
    ap.add_argument("--gpu-mib", type=int, default=1024)
    ap.add_argument("--peak-mib", type=int, default=256)
    ap.add_argument("--typical-mib", type=int, default=64)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--gap", type=float, default=2.0, help="mean idle gap between bursts, seconds")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--headroom", type=float, default=0.75,
                    help="elastic mode: the share of HBM the admitted tenants' requests may fill")
    ap.add_argument("--gate-only", action="store_true", help="only the gated call cost (figure 1)")
    ap.add_argument("--density-only", action="store_true", help="only the density trace (figure 3)")
    ap.add_argument("--instructions", action="store_true",
                    help="only the gated call cost, in instructions per call (callgrind; needs valgrind)")
    ap.add_argument("--swap-only", action="store_true", help="only the swap figures (figure 2, issue 39 item 4)")
    ap.add_argument("--link-gbps", type=float, default=0.0, help="swap: the simulated link's GB/s (0: off)")
    ap.add_argument("--vmm-us", type=float, default=0.0, help="swap: simulated us per map/unmap/access call")
    ap.add_argument("--pin-us-per-mib", type=float, default=0.0, help="swap: simulated us per pinned MiB")
    ap.add_argument("--pool-keep", type=float, default=600.0,
                    help="swap: MEMSLICE_HOST_POOL_KEEP for A, seconds (0: no host pool, each move pins its own)")
    ap.add_argument("--skip-only", action="store_true",
                    help="only the skip time of an unanswered ask (figure 4, issue 35.10)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-elastic-") as t:
        tmp = Path(t)
        exes = build(tmp)
        res: dict[str, object] = {}
        model = {"link_gbps": a.link_gbps, "vmm_us": a.vmm_us, "pin_us_per_mib": a.pin_us_per_mib,
                 "pool_keep": a.pool_keep}
        if a.swap_only:
            res["swap"] = swap_time(exes["tenant"], tmp, a.swap_mib, model)
        elif a.skip_only:
            res["skip_seconds"] = skip_time(exes["tenant"], tmp, a.repeats)
        elif a.instructions:
            res["gate_instructions_per_call"] = gate_instructions(exes["gate"], tmp)
        elif not a.density_only:
            res["gate_ns_per_call"] = gate_cost(exes["gate"], tmp, a.repeats, a.calls)
        if not (a.gate_only or a.instructions or a.skip_only or a.swap_only):
            if not a.density_only:
                res["swap"] = swap_time(exes["tenant"], tmp, a.swap_mib, model)
            res["density"] = {m: density(exes["tenant"], tmp, m, a.gpu_mib, a.peak_mib, a.typical_mib, a.duration,
                                         a.gap, a.seed, a.headroom) for m in ("static", "elastic", "elastic-release")}
    if a.json:
        print(json.dumps(res, indent=2))
    else:
        for k, v in res.items():
            print(f"{k}: {json.dumps(v)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Stopped and killed processes under stress (issue 11, items 7 and 8).

8 processes x 4 threads allocate and free at random on one 1 GiB quota while the test SIGKILLs random
processes (and starts new ones in their place) and SIGSTOPs others for 0.3-2 s before continuing them, for
MEMSLICE_CHAOS_SECONDS (default 20: some 20 kills and 30 stops, while its 32 busy threads take every core of
a 2-core machine; issue 11's figures are from a 60 s run). Checked: the quota is never exceeded (the ledger's
high-water mark), no allocation or free call in a running process took longer than the documented bound
(MS_CALL_WAIT_MS, measured by the C program itself around each call), nothing was corrupted, and once all have
exited the usage is back to zero, reclaimed by the shim itself (no sweep from the test).

The rare "825 MiB still charged" failure (issue 35 item 8) was a process killed inside a charge whose slot no
exit reclaimed: the processes still running all exit at the end together, and each made ONE sweep, which
failed on the region mutex (another exiting process held it for its recount) or abandoned its recount (a
neighbour was inside its own uncharge for 200 ms on a starved machine). An exit now retries its sweep while
dead slots remain (MS_CALL_WAIT_MS at most) and otherwise names what it left and why on stderr, which the
assertion below prints (tests/adversarial/test_shim_stopped.py reproduces the stuck case deterministically)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time

from conftest import kv
from sim_truth import GpuWatch, gpu_truth

from memslice.interposer.region import read_region

CALL_WAIT_US = 1_500_000  # MS_CALL_WAIT_MS in interposer/include/memslice_region.h
QUOTA_MIB = 1024


class Fleet:
    """The stressing processes: started on one quota, each running until `end` (monotonic)."""

    def __init__(self, exe: str, env: dict[str, str], end: float, log: str) -> None:
        self.exe, self.env, self.end, self.log = exe, env, end, log
        self.running: list[subprocess.Popen[str]] = []
        self.finished: list[subprocess.Popen[str]] = []
        self.killed = self.stopped = self.refused_start = 0
        self.seed = 0
        self.errors = open(log, "a")  # the shim's warnings of every process: the diagnosis of a failure

    def start(self) -> None:
        """Start one more; it may be refused its context when the quota is full (then it is not added)."""
        self.seed += 1
        seconds = max(self.end - time.monotonic(), 1.0)
        p = subprocess.Popen([self.exe, "4", f"{seconds:.2f}", "96", str(self.seed)], env=self.env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors, text=True)
        assert p.stdout is not None and p.stdin is not None
        line = p.stdout.readline().strip()
        if line == "setup failed":  # its context reserve did not fit: an out-of-memory refusal, not a fault
            assert p.wait(timeout=30) == 3
            self.refused_start += 1
            return
        assert line == "ready", line
        p.stdin.write("go\n")
        p.stdin.flush()
        self.running.append(p)

    def kill_one(self, rng: random.Random, stopped: dict[int, float]) -> None:
        candidates = [p for p in self.running if p.pid not in stopped]
        if not candidates:
            return
        p = rng.choice(candidates)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        self.running.remove(p)
        self.killed += 1

    def stop_one(self, rng: random.Random, stopped: dict[int, float]) -> None:
        candidates = [p for p in self.running if p.pid not in stopped]
        if candidates:
            p = rng.choice(candidates)
            p.send_signal(signal.SIGSTOP)
            stopped[p.pid] = time.monotonic() + rng.uniform(0.3, 2.0)
            self.stopped += 1


def test_kill_and_stop_under_stress(node, cbin, tmp_path):
    seconds = float(os.environ.get("MEMSLICE_CHAOS_SECONDS", "20"))
    n = node(context_overhead="32MiB")
    region = tmp_path / "c"
    env = n.container(region, f"{QUOTA_MIB}MiB", MEMSLICE_CONTEXT_RESERVE="32MiB")
    rng = random.Random(11)
    log = str(tmp_path / "shim.log")
    watch = GpuWatch(env)  # the simulated GPU's own figure, sampled past the shim
    fleet = Fleet(cbin["stress"], env, time.monotonic() + seconds, log)
    for _ in range(8):
        fleet.start()
    stopped: dict[int, float] = {}
    pace = threading.Event()  # never set: its timed wait paces the faults
    try:
        while time.monotonic() < fleet.end:
            pace.wait(rng.uniform(0.05, 0.3))
            now = time.monotonic()
            for p in fleet.running:
                if stopped.get(p.pid, now + 1) <= now:
                    p.send_signal(signal.SIGCONT)
                    del stopped[p.pid]
            if len(fleet.running) < 8 and time.monotonic() < fleet.end - 1:
                fleet.start()
            r = rng.random()
            if r < 0.25:
                fleet.kill_one(rng, stopped)
            elif r < 0.6:
                fleet.stop_one(rng, stopped)
    finally:
        for p in fleet.running:
            p.send_signal(signal.SIGCONT)
    outputs = [(p, p.communicate(timeout=120)[0]) for p in fleet.running]
    physical_peak, samples = watch.stop()
    fleet.errors.close()
    with open(log) as f:
        said = {line.strip() for line in f if "memslice" in line}
    warnings = sorted(said, key=lambda w: ("region" not in w and "lock" not in w, w))[:12]  # the ledger's first
    assert fleet.killed >= seconds / 10 and fleet.stopped >= seconds / 10  # the faults really happened
    worst = 0
    for p, text in outputs:
        assert p.returncode == 0, text
        got = kv(text)
        assert got["corrupt"] == "0" and got["other"] == "0", text
        worst = max(worst, int(got["maxcall_us"]))
    print(f"chaos: {seconds:.0f} s, {fleet.killed} killed, {fleet.stopped} stopped, {fleet.refused_start} "
          f"refused a context; longest call {worst} us")
    assert worst <= CALL_WAIT_US, f"a call took {worst} us, over the {CALL_WAIT_US} us bound"
    snap = read_region(region)
    dev = snap.devices[0]
    assert 0 < dev.peak_bytes <= QUOTA_MIB << 20
    assert dev.refused > 0  # the quota was contended
    if dev.charged_bytes:
        # The last processes exit together; each retries its sweep of killed ones for MS_CALL_WAIT_MS, and one
        # that cannot (a neighbour held the region past the bound on a starved machine) must say so. What it
        # left is a dead slot, which the container's next process reclaims as it starts: never lost for good.
        assert any("reclaim" in w or "locked for more than" in w for w in warnings), (
            f"{dev.charged_bytes >> 20} MiB still charged after every process exited, and no shim said why; "
            f"{snap.processes}; the shim said: {warnings}")
        nxt = subprocess.run([cbin["alloc_direct"], "1"], env=env, capture_output=True, text=True, timeout=120)
        assert nxt.returncode == 0, nxt.stderr
        snap = read_region(region)
        dev = snap.devices[0]
    assert dev.charged_bytes == 0, (f"{dev.charged_bytes >> 20} MiB still charged after every process exited and "
                                    f"a new one started; {snap.processes}; the shim said: {warnings}")
    assert not [p for p in snap.processes if p.alive or p.device_bytes]
    # the GPU's own figures: what live processes held never went past the quota at any sample, and once all
    # exited the GPU holds nothing and lists no process
    print(f"physical: {samples} samples, highest {physical_peak >> 20} MiB")
    assert samples >= seconds and 0 < physical_peak <= QUOTA_MIB << 20, (physical_peak, samples)
    truth = gpu_truth(env)
    assert truth.used_bytes == 0 and truth.processes == {}, truth

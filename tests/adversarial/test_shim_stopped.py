"""A process of the container stopped (SIGSTOP, a debugger, the cgroup freezer) at the worst moment must
not wedge the others: every wait in the shim is bounded (docs/architecture.md, "Shared region").

The stopped process is tests/c/holdlock.c: it takes the region mutex, optionally freezes the totals as a
recount does, and stops itself. Before this was bounded, the others' allocations spun or blocked forever
(these tests then fail on their subprocess timeouts)."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest
from conftest import run
from shim_helpers import build_with_region, wait_stopped
from sim_truth import gpu_truth

from memslice.interposer.region import read_region

CALL_WAIT_S = 1.5  # MS_CALL_WAIT_MS in interposer/include/memslice_region.h


@pytest.fixture(scope="module")
def holdlock(libs, tmp_path_factory) -> str:
    return build_with_region(libs, "holdlock", tmp_path_factory.mktemp("holdlock"))


def stopped_holder(holdlock: str, region, mode: str) -> subprocess.Popen[str]:
    p = subprocess.Popen([holdlock, str(region / "memslice.region"), mode], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    wait_stopped(p.pid)
    return p


def end(p: subprocess.Popen[str]) -> None:
    p.send_signal(signal.SIGKILL)
    p.send_signal(signal.SIGCONT)
    p.wait(timeout=30)


@pytest.mark.parametrize("mode", ["lock", "recount"])
def test_stopped_holder_does_not_wedge_the_container(mode, node, cbin, holdlock, tmp_path):
    """With the mutex held (and the totals frozen) by a stopped process, allocations that fit still succeed,
    one that does not is refused instead of hanging, and frees go through."""
    n = node()
    region = tmp_path / "c"
    env = n.container(region, "1GiB", MEMSLICE_CONTEXT_RESERVE="0")
    assert "alloc 10 MiB -> 0" in run([cbin["alloc_direct"], "10"], env).stdout  # the region and its GPU exist
    holder = stopped_holder(holdlock, region, mode)
    try:
        t0 = time.monotonic()
        out = run([cbin["alloc_direct"], "300", "300", "900"], env, timeout=60)
        took = time.monotonic() - t0
        assert out.returncode == 0, out.stdout + out.stderr
        assert "alloc 300 MiB -> 0" in out.stdout and "alloc 900 MiB -> 2" in out.stdout, out.stdout + out.stderr
        assert "after free=1024" in out.stdout  # the frees went through: the whole quota is free again
        assert "cuMemAlloc_v2 of 900.0 MiB refused" in out.stderr
        if mode == "lock":
            assert "was locked for more than 250 ms" in out.stderr
        # each of the calls may wait its bound, never more (generous: the machine is shared)
        assert took < 4 * CALL_WAIT_S + 10, f"{took:.1f} s"
        # the simulated GPU's own figures: the refused 900 MiB never reached it
        assert (10 + 64) << 20 < n.physical()[0].peak_bytes <= 1 << 30
    finally:
        end(holder)
    assert read_region(region).devices[0].charged_bytes == 0
    truth = gpu_truth(env)
    assert truth.used_bytes == 0 and truth.processes == {}, truth


def test_an_exit_that_cannot_reclaim_a_killed_process_retries_then_says_why(node, cbin, holdlock, tmp_path):
    """Issue 35 item 8: the chaos test's rare "825 MiB still charged" was a killed process's charge that no
    exiting process reclaimed (each exit's one sweep failed on the region mutex or on a neighbour inside an
    uncharge). An exit now retries its sweep for MS_CALL_WAIT_MS while dead slots remain, and names what is
    left and why; the container's next process reclaims it."""
    n = node()
    region = tmp_path / "c"
    env = n.container(region, "1GiB", MEMSLICE_CONTEXT_RESERVE="0")
    killed = subprocess.Popen([cbin["unseen"], "fill", "hold"], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert killed.stdout is not None and any(line.startswith("held") for line in killed.stdout)
    killed.kill()
    killed.wait(timeout=30)
    holder = stopped_holder(holdlock, region, "lock")
    try:
        out = run([cbin["alloc_direct"], "10"], env, timeout=60)
        assert "exiting with 1 dead processes' charges unreclaimed" in out.stderr, out.stderr
        assert "Connection timed out" in out.stderr, out.stderr  # ETIMEDOUT: the mutex's holder is stopped
        assert read_region(region).devices[0].charged_bytes == 1 << 30  # the killed process's fill, still
        # the GPU itself freed it when the process died: the ledger over-counts (refuses more), never under
        truth = gpu_truth(env)
        assert truth.used_bytes == 0 and truth.processes == {}, truth
    finally:
        end(holder)
    out = run([cbin["alloc_direct"], "10"], env, timeout=60)  # the next process reclaims it (the holder died)
    assert "alloc 10 MiB -> 0" in out.stdout, out.stdout + out.stderr
    assert read_region(region).devices[0].charged_bytes == 0

"""Per-container elastic figures (issue 13, "Visibility"): whose a board slot is comes from the kernel (the
holder of the slot's lock, and the region whose slot lock that same process holds), never from the slot's
bytes; a tampered board neither crashes the agent's tracker nor moves figures between containers; swap
counters stay monotonic; Events are one per pod and kind per interval whatever a tenant does.

Real shimmed processes on the simulated GPU, real board and region files, real kernel locks."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

from conftest import MiB
from test_elastic_swap import elastic as elastic  # noqa: F401 - the fixture, shared
from test_elastic_swap import tenant_bin as tenant_bin  # noqa: F401 - the fixture, shared
from test_elastic_swap import wait_for

from memslice.elastic import LIVE_OFF, read_boards
from memslice.plugin.elastic.events import IN, OUT, SwapEventPolicy
from memslice.plugin.elastic.metrics import (
    ContainerElastic,
    Counts,
    ElasticTracker,
    ElasticView,
    plausible,
    process_age,
    region_pid_reader,
)
from memslice.plugin.ledger import Allocation


def alloc(rid: str, pod: str, mib: int = 256, limit: int = 1024) -> Allocation:
    return Allocation(region_id=rid, gpu_index=0, gpu_uuid="", device_ids=("g0-1",), mib=mib, created_at=0.0,
                      namespace="ns", pod=pod, container="c", pod_uid=f"uid-{pod}", limit_mib=limit)


def tracker(edir: Path, regions: Path, ledger: dict[str, Allocation]) -> ElasticTracker:
    return ElasticTracker(edir, lambda: ledger, region_pid_reader(lambda rid: str(regions / rid)))


def slot_of(edir: Path, pid: int) -> int:
    return next(t.slot for t in read_boards(edir) if t.owner_pid == pid)


def test_slots_go_to_the_container_whose_region_their_lock_holder_holds(elastic, tmp_path) -> None:
    a = elastic("a", "1GiB", "256MiB", gpus="2GiB", ctx="64MiB")
    b = elastic("b", "1GiB", "256MiB", gpus="2GiB", ctx="64MiB")
    assert a.cmd("alloc 256 32") == "allocated 8" and b.cmd("alloc 128 32") == "allocated 4"
    edir = elastic.edir
    wait_for(lambda: len(read_boards(edir)) == 2, "both on the board")
    ledger = {"a": alloc("a", "pa"), "b": alloc("b", "pb")}
    tr = tracker(edir, tmp_path, ledger)
    view = tr.poll()
    (uuid,) = {t.gpu for t in view.tenants}
    assert {k: c.resident_bytes // MiB for k, c in view.containers.items()} == {("a", uuid): 256, ("b", uuid): 128}
    assert view.unattributed == {}

    # A forges its own slot: B's pid, an absurd resident size, absurd counters. Stopped, it cannot republish.
    sa = slot_of(edir, a.proc.pid)
    board = next(edir.glob("*.board"))
    os.kill(a.proc.pid, signal.SIGSTOP)
    try:
        forged = struct.pack("<IIiI12Q", 0x4C45534D, 1, b.proc.pid, 2, 0, 1 << 40, 1 << 40, 0, 0, 0,
                             10 ** 12, 10 ** 12, 10 ** 18, 10 ** 18, 0, 0)
        with open(board / f"{sa:02d}.slot", "r+b") as f:  # its own slot file: all a tenant can write
            f.write(forged)
        view = tr.poll()
        c = view.containers[("a", uuid)]
        assert c.resident_bytes == 1024 * MiB, "bounded by the container's limit, which the agent knows"
        assert c.totals == Counts(), "counters that jump past what a move can take are not believed"
        assert tr.acc.rejected >= 1
        assert view.containers[("b", uuid)].resident_bytes == 128 * MiB, "B's figures are B's own"
    finally:
        os.kill(a.proc.pid, signal.SIGCONT)

    # a process of no container takes a free slot's lock and writes a slot naming A's pid: attributed to nobody
    free = next(i for i in range(64) if i not in {t.slot for t in read_boards(edir)})
    squatter = subprocess.Popen([sys.executable, "-c", f"""
import fcntl, os, struct, sys
fd = os.open({str(board / f"{free:02d}.slot")!r}, os.O_RDWR | os.O_CREAT)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, {LIVE_OFF}, 0)
forged = struct.pack("<IIiI12Q", 0x4C45534D, 2, {a.proc.pid}, 2, 0, 1 << 30, 1 << 30, 0, 0, 0, 5, 5, 0, 0, 0, 0)
os.pwrite(fd, forged.ljust(128, b"\\0"), 0)
print("in", flush=True)
sys.stdin.read()
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert squatter.stdout is not None and squatter.stdout.readline() == "in\n"
        view = tr.poll()
        assert view.unattributed == {uuid: 1}
        assert view.containers[("b", uuid)].resident_bytes == 128 * MiB
        assert view.containers[("a", uuid)].resident_bytes <= 1024 * MiB
    finally:
        squatter.stdin.close()  # type: ignore[union-attr]
        squatter.wait(timeout=30)

    # a board that is not a directory (a version 4 board file) costs only itself
    (edir / "GPU-zzz.board").write_bytes(b"")
    view = tr.poll()
    assert [p for p, _ in view.errors] == [str(edir / "GPU-zzz.board")]
    assert ("b", uuid) in view.containers


def test_counters_stay_monotonic_when_a_process_exits(elastic, tmp_path) -> None:
    """A's memory is swapped out for B, then A exits: its container's totals keep its swaps. (A 2 GiB GPU: how
    much moves is not the point; what is filled and read is the test's CPU time.)"""
    a = elastic("a", "1536MiB", "256MiB", gpus="2GiB", ctx="64MiB")
    assert a.cmd("alloc 1280 64") == "allocated 20"
    edir = elastic.edir
    wait_for(lambda: any(t.state == "idle" for t in read_boards(edir)), "A idle")
    ledger = {"a": alloc("a", "pa", 256, 1536), "b": alloc("b", "pb", 256, 1024)}
    tr = tracker(edir, tmp_path, ledger)
    tr.poll()
    b = elastic("b", "1GiB", "256MiB", gpus="2GiB", ctx="64MiB")
    assert b.cmd("alloc 896 64") == "allocated 14"  # 256 MiB more than HBM has free: A moves them
    uuid = read_boards(edir)[0].gpu
    outs = next(t.swap_outs for t in read_boards(edir) if t.pid == a.proc.pid)
    assert outs > 0, "A moved chunks for B"
    wait_for(lambda: tr.poll().containers[("a", uuid)].totals.outs == outs, "A's swaps in its container's totals")
    a.close()
    wait_for(lambda: len(read_boards(edir)) == 1, "A's slot gone")
    c = tr.poll().containers[("a", uuid)]
    assert c.totals.outs == outs and c.resident_bytes == 0 and c.swapped_bytes == 0
    assert sum(c.processes.values()) == 0
    del ledger["a"]  # the container is gone from the agent's ledger: so are its series
    assert ("a", uuid) not in tr.poll().containers


def test_plausible_counters() -> None:
    base = Counts(10, 5, 1.0, 0.5)
    zero = Counts()
    assert plausible(base, Counts(40, 5, 4.5, 0.5), zero, span_s=10.0), "a batch of moves between two polls"
    assert not plausible(base, Counts(9, 5, 1.0, 0.5), zero, span_s=10.0), "a live process's counter never goes down"
    assert not plausible(base, Counts(10, 5, 9.0, 2.0), zero, span_s=10.0), "more move time than it has lived"
    assert not plausible(base, Counts(10 ** 9, 5, 1.0, 0.5), zero, span_s=10.0), "more moves than any link allows"
    assert plausible(base, Counts(10, 5, 30.0, 0.5), Counts(0, 0, 25.0, 0), span_s=10.0), "since first sight"


def test_process_age_is_the_kernels() -> None:
    child = subprocess.Popen(["sleep", "60"])
    try:
        mine, its = process_age(os.getpid()), process_age(child.pid)
        assert mine is not None and its is not None and 0 <= its <= mine, "a child is younger than its parent"
    finally:
        child.kill()
        child.wait()
    assert process_age(2 ** 22 + 7) is None  # no such PID (above pid_max)


def view_of(totals: dict[str, Counts]) -> ElasticView:
    cs = {(f"r-{pod}", "GPU-1"): ContainerElastic(alloc(f"r-{pod}", pod), "GPU-1", 0, 64 * MiB,
                                                  {"active": 0, "idle": 1, "swapped-out": 0}, c)
          for pod, c in totals.items()}
    return ElasticView([], cs, {}, [])


def test_events_are_one_per_pod_and_kind_per_interval_however_fast_a_tenant_swaps() -> None:
    policy = SwapEventPolicy(interval_s=60, max_per_step=20)
    assert policy.step(0, view_of({"p": Counts()})) == [], "the first poll is a baseline"
    sent = []
    for t in range(1, 200):  # a swap out and in every second, for 200 s
        sent += [(t, n.reason) for n in policy.step(t, view_of({"p": Counts(t * 3, t * 2, t * 0.1, t * 0.1)}))]
    outs = [t for t, r in sent if r == OUT]
    assert outs == [1, 61, 121, 181] and [t for t, r in sent if r == IN] == outs
    # the swaps between two notices are summed into the next one
    n = policy.step(241, view_of({"p": Counts(241 * 3, 241 * 2, 24.1, 24.1)}))
    by = {x.reason: x for x in n}
    assert set(by) == {OUT, IN}
    assert "container c: 180 range(s) of its GPU memory moved to host memory" in by[OUT].message
    assert (by[OUT].namespace, by[OUT].pod, by[OUT].pod_uid) == ("ns", "p", "uid-p")


def test_events_per_step_are_bounded_for_the_whole_node() -> None:
    policy = SwapEventPolicy(interval_s=60, max_per_step=20)
    pods = [f"p{i:03}" for i in range(100)]
    policy.step(0, view_of(dict.fromkeys(pods, Counts())))
    busy = dict.fromkeys(pods, Counts(1, 0, 0.1, 0))
    counts = [len(policy.step(t, view_of(busy))) for t in range(1, 8)]
    assert counts == [20, 20, 20, 20, 20, 0, 0], "20 a poll until every pod has had its notice"


def test_top_groups_elastic_processes_under_their_containers(elastic, tmp_path) -> None:
    """`memslice top` (JSON and text) per container and GPU: bytes in GPU memory, swapped out and spilled
    apart, and per process its state and time since its last CUDA call; a process of no region shown is
    listed apart, never under a container. (A 2 GiB GPU, as in the test above.)"""
    a = elastic("a", "1536MiB", "256MiB", gpus="2GiB", ctx="64MiB")
    assert a.cmd("alloc 1280 64") == "allocated 20"
    edir = elastic.edir
    wait_for(lambda: any(t.state == "idle" for t in read_boards(edir)), "A idle")
    b = elastic("b", "1GiB", "256MiB", gpus="2GiB", ctx="64MiB")
    assert b.cmd("alloc 896 64") == "allocated 14"  # needs 256 MiB of A's
    # A writes its swapped bytes as each range goes out and B its "got" as the answer reaches it: the two
    # figures agree once the last answer has landed (bounded wait; they must agree, not merely both be set)
    def settled() -> bool:
        now = {t.pid: t for t in read_boards(edir)}
        a_out = now[a.proc.pid].swapped_bytes if a.proc.pid in now else 0
        return a_out > 0 and b.proc.pid in now and now[b.proc.pid].got_mib << 20 == a_out
    wait_for(settled, "A's burst partly swapped out, and B told how much")
    mine = {t.pid: t for t in read_boards(edir)}
    moved, outs = mine[a.proc.pid].swapped_bytes, mine[a.proc.pid].swap_outs
    assert 256 * MiB <= moved <= 320 * MiB and mine[b.proc.pid].got_mib << 20 == moved

    def top(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "memslice", "top", "--elastic-dir", str(edir), *args],
                              capture_output=True, text=True, timeout=60)

    out = top("--json", str(tmp_path / "a"), str(tmp_path / "b"))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    ra, rb = doc["regions"]
    (ea,), (eb,) = ra["elastic"], rb["elastic"]
    assert (ea["device_bytes"], ea["swapped_bytes"], ea["spilled_bytes"]) == (1280 * MiB - moved, moved, 0)
    assert (eb["device_bytes"], eb["elastic_resident_bytes"], eb["swapped_bytes"]) == (896 * MiB, 896 * MiB, 0)
    (pa,) = ea["processes"]
    assert (pa["host_pid"], pa["state"], pa["region"]) == (a.proc.pid, "idle", ra["region"])
    assert pa["seconds_since_last_call"] > 0 and pa["swap_outs"] == outs
    (pb,) = eb["processes"]
    assert pb["host_pid"] == b.proc.pid and pb["asks"] > 0 and pb["moved_for_asks_bytes"] == moved
    assert pb["asked_bytes"] >= 256 * MiB and moved <= 1.25 * pb["asked_bytes"]
    assert {e["host_pid"]: e["region"] for e in doc["elastic"]} == {a.proc.pid: ra["region"],
                                                                    b.proc.pid: rb["region"]}

    text = top("--once", str(tmp_path / "a")).stdout  # B's region not shown: B is listed apart
    region_a, rest = text.split("elastic processes of no region shown")
    assert "idle, last CUDA call" in region_a
    assert f"swapped out to host memory, 0B spilled to host memory; swaps {outs} out" in region_a
    assert str(b.proc.pid) in rest and str(b.proc.pid) not in region_a


def test_a_container_that_appears_after_the_first_poll_is_announced_from_zero() -> None:
    """Its swaps happened while the agent watched (the first poll alone is a baseline)."""
    policy = SwapEventPolicy(interval_s=60)
    assert policy.step(0, view_of({"old": Counts(7, 0, 1.0, 0)})) == []
    (n,) = policy.step(2, view_of({"old": Counts(7, 0, 1.0, 0), "new": Counts(32, 0, 0.5, 0)}))
    assert (n.pod, n.reason) == ("new", OUT) and "32 range(s)" in n.message


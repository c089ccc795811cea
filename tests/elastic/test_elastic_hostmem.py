"""Host memory is finite (issue 26.5): the host memory of an elastic move is created by the tenant whose bytes
move (its own background thread), so it is charged to that tenant's memory cgroup. Before a move the tenant
checks its cgroup (memory.max, memory.current, keeping a margin) and the host's MemAvailable (keeping a
slack); when they cannot take it, nothing moves, the tenant says why on the board, and the neighbour's burst
fails at once with CUDA_ERROR_OUT_OF_MEMORY naming the cause; its request is still served (from its own host
memory, checked the same way). The same check guards spills. Real shimmed processes on the simulated GPU;
the cgroups are fake directories (MEMSLICE_CGROUP_DIR: a tenant can point only its own checks anywhere, which
lets it refuse its own moves, nothing more), host memory a fake meminfo (MEMSLICE_SIM_MEMINFO, honoured only
under the simulated driver)."""

from __future__ import annotations

import pathlib
import time

import pytest
from conftest import MiB
from test_elastic_swap import board_state, per_process, wait_for
from test_elastic_swap import elastic as elastic  # noqa: F401 - the fixture, shared
from test_elastic_swap import tenant_bin as tenant_bin  # noqa: F401 - the fixture, shared

from memslice.elastic import read_boards

GiB = 1 << 30
# The scenario, a quarter of the 4 GiB one (what is checked is the cgroup and host-memory decision, not
# volume; filling and checking bytes is what costs): a 1056 MiB GPU, 64 MiB contexts; A (limit 640 MiB, request
# 128 MiB) holds 512 MiB in 64 MiB blocks, idle; 416 MiB of HBM are free: B's 768 MiB in 64 MiB blocks lack
# NEEDED MiB, its 7th block is the first burst past the free HBM.
SIM = dict(gpus="1056MiB", ctx="64MiB")
CTX, A_MIB, FIT, NEEDED = 64, 512, 6, 352


def fake_cgroup(where: pathlib.Path, max_: str, current: str) -> pathlib.Path:
    where.mkdir(parents=True, exist_ok=True)
    (where / "memory.max").write_text(max_ + "\n")
    (where / "memory.current").write_text(current + "\n")
    return where


def fake_meminfo(where: pathlib.Path, total_kib: int, avail_kib: int) -> pathlib.Path:
    where.write_text(f"MemTotal:       {total_kib} kB\nMemFree:        {avail_kib} kB\n"
                     f"MemAvailable:   {avail_kib} kB\nBuffers:            0 kB\n")
    return where


def idle_a(elastic, tmp_path: pathlib.Path, **env: str):  # noqa: ANN001, ANN201
    """The scenario's idle tenant: A (limit 640 MiB, request 128 MiB) holds 512 MiB, idle."""
    a = elastic("a", "640MiB", "128MiB", stderr=(tmp_path / "a.err").open("w"), **SIM, **env)
    assert a.cmd("alloc 512 64") == "allocated 8"
    wait_for(lambda: board_state(elastic.edir, a.proc.pid) == "idle", "A idle on the board")
    return a


@pytest.mark.parametrize("cause", ["cgroup", "host"])
def test_a_burst_fails_naming_the_cause_when_the_idle_tenant_cannot_take_it_to_host(elastic, tmp_path, cause):
    """A's cgroup (memory.max 4 GiB, memory.current 3.9 GiB) or the host (200 MiB available) cannot take
    A's bytes: B's burst past the free HBM fails with CUDA_ERROR_OUT_OF_MEMORY at once (not after the 120 s B
    would wait for a yield that is not coming), the log names A's slot and the cause; A's bytes are intact and
    still in HBM; B's memory is all in HBM (none spilled to host)."""
    if cause == "cgroup":
        env = {"MEMSLICE_CGROUP_DIR": str(fake_cgroup(tmp_path / "cg-a", str(4 * GiB), str(39 * GiB // 10)))}
    else:
        env = {"MEMSLICE_SIM_MEMINFO": str(fake_meminfo(tmp_path / "meminfo", 64 << 20, 200 << 10))}
    a = idle_a(elastic, tmp_path, **env)
    b = elastic("b", "1GiB", "128MiB", stderr=(tmp_path / "b.err").open("w"), wait="120",
                MEMSLICE_CGROUP_DIR=str(fake_cgroup(tmp_path / "cg-b", "max", "0")))
    t0 = time.monotonic()
    out = b.cmd("alloc 768 64")
    took = time.monotonic() - t0
    assert out.startswith(f"oom {FIT} rc=2"), out  # 6 x 64 MiB fit the free 416 MiB; the 7th is a burst
    assert took < 60, f"the burst failed after {took:.1f} s: the asker waited for the 120 s deadline"
    use = per_process(elastic.node().state)
    assert use[a.proc.pid] == (CTX + A_MIB, 0), "A moved nothing"
    assert use[b.proc.pid] == (CTX + FIT * 64, 0), "B's burst was not served from host memory"
    assert a.cmd("check") == f"check ok {A_MIB * MiB}"
    b.close()
    err = (tmp_path / "b.err").read_text()
    slot = next(t.slot for t in read_boards(elastic.edir) if t.pid == a.proc.pid)
    assert "a burst of 64.0 MiB failed (CUDA_ERROR_OUT_OF_MEMORY)" in err, err
    assert f"slot {slot} of the board (pid {a.proc.pid}) could not take 32.0 MiB to host memory" in err, err
    if cause == "cgroup":
        assert "memory cgroup's memory.max 4.0 GiB, memory.current 3.9 GiB; raise that pod's memory limit" in err
    else:
        assert "the host's MemTotal 64.0 GiB, in use 63.8 GiB; the node is short of host memory" in err
    a_err = (tmp_path / "a.err").read_text()
    assert "could not take 32.0 MiB to host memory for a neighbour" in a_err, a_err


def test_a_request_is_served_from_the_askers_own_host_memory_when_the_idle_tenant_cannot_take_it(elastic,
                                                                                                   tmp_path):
    """B's allocation within its request (768 MiB) is guaranteed: A cannot take its bytes to host memory
    (its cgroup is full), so what HBM lacks is served from B's own host memory, which B's cgroup can take."""
    a = idle_a(elastic, tmp_path, MEMSLICE_CGROUP_DIR=str(fake_cgroup(tmp_path / "cg-a", str(4 * GiB),
                                                                        str(4 * GiB))))
    b = elastic("b", "1GiB", "768MiB", MEMSLICE_CGROUP_DIR=str(fake_cgroup(tmp_path / "cg-b", "max", "0")))
    assert b.cmd("alloc 768 64") == "allocated 12"
    use = per_process(elastic.node().state)
    assert use[a.proc.pid] == (CTX + A_MIB, 0)
    dev, host = use[b.proc.pid]
    assert dev + host == CTX + 768 and host >= NEEDED
    assert b.cmd("check") == f"check ok {768 * MiB}" and a.cmd("check") == f"check ok {A_MIB * MiB}"


def test_the_askers_own_host_memory_is_checked_too(elastic, tmp_path):
    """B's request cannot be had in HBM nor in host memory (B's own cgroup is full): the allocation fails
    with CUDA_ERROR_OUT_OF_MEMORY naming B's cgroup; no OOM kill, B still runs."""
    a = idle_a(elastic, tmp_path, MEMSLICE_CGROUP_DIR=str(fake_cgroup(tmp_path / "cg-a", str(4 * GiB),
                                                                        str(4 * GiB))))
    b = elastic("b", "1GiB", "768MiB", stderr=(tmp_path / "b.err").open("w"),
                MEMSLICE_CGROUP_DIR=str(fake_cgroup(tmp_path / "cg-b", str(GiB), str(GiB - 100 * MiB))))
    assert b.cmd("alloc 768 64").startswith(f"oom {FIT} rc=2")
    assert b.cmd("check") == f"check ok {FIT * 64 * MiB}"
    assert a.proc.poll() is None
    b.close()
    assert "could not be had in GPU memory nor in host memory" in (tmp_path / "b.err").read_text()


def test_with_headroom_the_move_happens_as_before(elastic, tmp_path):
    """A's cgroup has room (memory.max 8 GiB, memory.current 1 GiB) and so has the host: A moves what B lacks
    (at most a chunk more), B's burst is all in HBM."""
    a = idle_a(elastic, tmp_path, MEMSLICE_CGROUP_DIR=str(fake_cgroup(tmp_path / "cg-a", str(8 * GiB), str(GiB))),
               MEMSLICE_SIM_MEMINFO=str(fake_meminfo(tmp_path / "meminfo", 64 << 20, 32 << 20)))
    b = elastic("b", "1GiB", "128MiB")
    assert b.cmd("alloc 768 64") == "allocated 12"
    use = per_process(elastic.node().state)
    assert use[b.proc.pid] == (CTX + 768, 0)
    assert NEEDED <= use[a.proc.pid][1] <= NEEDED + 32
    assert a.cmd("check") == f"check ok {A_MIB * MiB}"


@pytest.mark.parametrize(("max_", "current"), [("garbage", "0"), ("4294967296", "-5")])
def test_hostile_cgroup_values_read_as_no_limit(elastic, tmp_path, max_, current):
    """A cgroup file that is not a plain number reads as unknown, which is no limit: the move happens, nothing
    crashes or hangs (every hostile form: tests/shim/test_oversubscribe.py, through the same check)."""
    a = idle_a(elastic, tmp_path, MEMSLICE_CGROUP_DIR=str(fake_cgroup(tmp_path / "cg-a", max_, current)))
    b = elastic("b", "1GiB", "128MiB")
    assert b.cmd("alloc 768 64") == "allocated 12"
    assert per_process(elastic.node().state)[a.proc.pid][1] >= NEEDED
    assert a.cmd("check") == f"check ok {A_MIB * MiB}"


def test_a_cgroup_file_removed_after_start_reads_as_no_limit(elastic, tmp_path):
    cg = fake_cgroup(tmp_path / "cg-a", str(4 * GiB), str(4 * GiB))
    a = idle_a(elastic, tmp_path, MEMSLICE_CGROUP_DIR=str(cg))
    (cg / "memory.max").unlink()
    b = elastic("b", "1GiB", "128MiB")
    assert b.cmd("alloc 768 64") == "allocated 12"
    assert per_process(elastic.node().state)[a.proc.pid][1] >= NEEDED


def test_the_agent_writes_an_event_and_counts_the_refusal(elastic, tmp_path):
    """The node agent's real path: its tracker reads the board (A's host note, B's failed burst), the Events
    loop writes an ElasticHostMemoryFull Warning on both pods through the official client to the API stand-in
    (real HTTP), and the collector exports the refusal by cause."""
    from kube_standin import KubeApiStandin
    from test_elastic_attribution import alloc, tracker

    from memslice.plugin.elastic.events import FULL, SwapEvents
    from memslice.plugin.elastic.metrics import ElasticCollector

    idle_a(elastic, tmp_path, MEMSLICE_CGROUP_DIR=str(fake_cgroup(tmp_path / "cg-a", str(4 * GiB),
                                                                    str(39 * GiB // 10))))
    ledger = {"a": alloc("a", "pa", 128, 640), "b": alloc("b", "pb", 128, 1024)}
    tr = tracker(elastic.edir, tmp_path, ledger)
    kube = KubeApiStandin().start()
    ev = SwapEvents(kube.api_client(), "node-1", tr.poll, interval_s=1.0, poll_s=0.05)
    ev.start()
    try:
        wait_for(lambda: ev.policy.seen, "the agent's baseline poll")
        b = elastic("b", "1GiB", "128MiB", MEMSLICE_CGROUP_DIR=str(fake_cgroup(tmp_path / "cg-b", "max", "0")))
        assert b.cmd("alloc 768 64").startswith(f"oom {FIT} rc=2")
        wait_for(lambda: len([e for e in kube.list("Event", "ns") if e["reason"] == FULL]) == 2, "two Events")
        by_pod = {e["involvedObject"]["name"]: e for e in kube.list("Event", "ns") if e["reason"] == FULL}
        assert by_pod["pa"]["type"] == "Warning"
        assert ("could not take its GPU memory to host memory for a neighbour" in by_pod["pa"]["message"]
                and "memory.max 4096 MiB, memory.current 3993 MiB" in by_pod["pa"]["message"]
                and "raise the pod's memory limit" in by_pod["pa"]["message"]), by_pod["pa"]["message"]
        assert "1 burst allocation(s) failed" in by_pod["pb"]["message"], by_pod["pb"]["message"]
    finally:
        ev.stop()
        kube.stop()
    metrics = {(m.name, s.labels.get("cause", ""), s.labels.get("pod", "")): s.value
               for m in ElasticCollector(tr).collect() for s in m.samples}
    uuid = read_boards(elastic.edir)[0].gpu
    assert metrics[("memslice_elastic_moves_refused", "cgroup", "")] == 1
    assert metrics[("memslice_elastic_moves_refused", "host", "")] == 0
    assert metrics[("memslice_elastic_bursts_failed", "", "")] == 1
    assert metrics[("memslice_container_elastic_moves_refused", "cgroup", "pa")] == 1
    assert metrics[("memslice_container_elastic_bursts_failed", "", "pb")] == 1
    assert tr.poll().containers[("a", uuid)].note.cause == "cgroup"
    from memslice.top import elastic_json
    shown = {t["pid"]: t for t in elastic_json(read_boards(elastic.edir))}
    a_pid = next(t.pid for t in read_boards(elastic.edir) if t.limit_bytes == 640 * MiB)
    assert shown[a_pid]["refused_to_host"] == {"cgroup": 1, "host": 0}
    assert shown[a_pid]["last_refusal"] == {"cause": "cgroup", "bytes": 32 * MiB, "limit_bytes": 4 * GiB,
                                            "used_bytes": 39 * GiB // 10}
    assert sum(t["bursts_failed"] for t in shown.values()) == 1

"""The elastic move's drain is bounded (issue 13; docs/architecture.md, "Waits and their bounds"): before
moving a range the shim waits for the GPU work already queued, but never without a bound, and never holds a
tenant's threads at the work gate longer than the drain bound plus the move itself. Real processes under the
real shim on the simulated GPU, whose queued stream waits are work in flight (interposer/sim/simcuda_memop.c):
- a correct program whose queued work only a later call of its own releases (cuStreamWaitValue32 on stream A,
  cuStreamWriteValue32 on stream B from another thread) neither deadlocks nor loses data, and the neighbour
  that asked for HBM still gets its guaranteed allocation (from host memory at once, then in HBM);
- a process with work in flight is not idle, however long since its last call;
- a queued wait that runs for seconds (a long kernel) does not stall the tenant's other threads past the bound.
On code without the bound the first two hang (the release never returns within the test's deadline), the third
shows the busy thread held at the gate for the whole wait."""

from __future__ import annotations

from conftest import MiB
from test_elastic_swap import board_state, elastic, per_process, tenant_bin, wait_for  # noqa: F401  (fixtures)

from memslice.interposer.region import read_region_file

NOT_READY = 600  # CUDA_ERROR_NOT_READY: cuStreamQuery on a stream with queued work
HOLD_MS = 8000  # the long-running queued wait of the last test
# docs/architecture.md, "Waits and their bounds": a tenant thread waits at the gate at most the drain bound
# (2 s) plus the move itself (a few 64 MiB ranges here); the slack covers a loaded test machine.
GATE_HOLD_BOUND_MS = 5000
# The scenario of every test here: a 1 GiB GPU, 64 MiB contexts; A (request 128 MiB) holds 640 MiB, B's request
# (384 MiB) lacks 128 MiB of HBM (two of A's 64 MiB ranges). Half the bytes of the 2 GiB one it was: what is
# judged is the drain's bound and who waits, not volume.


def test_work_released_by_a_later_call_does_not_deadlock_a_move(elastic):  # noqa: F811  (the fixture)
    """A bursts above its request and has a stream wait queued that only its own later cuStreamWriteValue32
    (another thread, another stream) releases. B's guaranteed allocation asks A for HBM: A cannot drain, so
    it gives the move up within the bound and B is served from host memory at once; A's release then
    completes (under an unbounded drain it blocks at the closed gate forever), and once A's work has drained
    it yields and B's memory moves to HBM. Both sides' bytes are intact."""
    a = elastic("a", "768MiB", "128MiB", gpus="1GiB", ctx="64MiB", idle="600")
    assert a.cmd("alloc 640 64") == "allocated 10"
    assert a.cmd("inflight") == f"inflight 0 {NOT_READY}"
    state = elastic.node().state
    b = elastic("b", "512MiB", "384MiB", gpus="1GiB", ctx="64MiB", wait="3")
    assert b.cmd("alloc 384 64") == "allocated 6"
    dev, host = per_process(state)[b.proc.pid]
    assert host > 0 and dev + host == 64 + 384, "what HBM could not hold was served from host memory"
    # all of A's bytes still in HBM (its host figure may hold pinned chunks kept for a move that was given up)
    assert per_process(state)[a.proc.pid][0] == 64 + 640, "A moved nothing while its work could run"
    a.send("release")
    assert a.say_nothing(timeout=20) == "released 0 0", "A's second thread got past the gate and A's work drained"
    wait_for(lambda: per_process(state)[b.proc.pid] == (64 + 384, 0), "B's request all in HBM")
    assert a.cmd("check") == f"check ok {640 * MiB}"
    assert b.cmd("check") == f"check ok {384 * MiB}"
    assert read_region_file(state + ".usage").devices[0].peak_bytes <= 1024 * MiB


def test_a_process_with_work_in_flight_is_not_idle(elastic):  # noqa: F811  (the fixture)
    """A makes no call for far longer than idle_after but has a stream wait queued: it is not idle (the
    issue: idle is no CUDA call *and* no work in flight), so it is not swapped out for B; B is served from
    host memory. Once A's work drains A is idle, yields everything, and B's memory moves to HBM."""
    a = elastic("a", "768MiB", "128MiB", gpus="1GiB", ctx="64MiB", idle="0.3")
    assert a.cmd("alloc 640 64") == "allocated 10"
    assert a.cmd("inflight") == f"inflight 0 {NOT_READY}"
    state = elastic.node().state
    b = elastic("b", "512MiB", "384MiB", gpus="1GiB", ctx="64MiB", wait="3")
    assert b.cmd("alloc 384 64") == "allocated 6"
    assert board_state(elastic.edir, a.proc.pid) == "active", "work in flight: A is not idle"
    assert per_process(state)[a.proc.pid][0] == 64 + 640, "nothing of A's moved while its work could run"
    a.send("release")
    assert a.say_nothing(timeout=20) == "released 0 0"
    wait_for(lambda: board_state(elastic.edir, a.proc.pid) == "idle", "A idle once its work drained")
    wait_for(lambda: per_process(state)[b.proc.pid] == (64 + 384, 0), "B's request all in HBM")
    assert a.cmd("check") == f"check ok {640 * MiB}"
    assert b.cmd("check") == f"check ok {384 * MiB}"


def test_long_running_work_does_not_stall_the_tenants_other_threads(elastic):  # noqa: F811  (the fixture)
    """A has a queued wait that runs HOLD_MS (a long kernel) and a thread rewriting its blocks. B's guaranteed
    allocation asks A for HBM: A's move waits for the drain at most its bound, so no round of the busy thread
    is held at the gate for the whole wait; the busy thread's data stays correct."""
    a = elastic("a", "768MiB", "128MiB", gpus="1GiB", ctx="64MiB", idle="600")
    assert a.cmd("alloc 640 64") == "allocated 10"
    assert a.cmd(f"hold {HOLD_MS}") == "holding 0"
    assert a.cmd("busy 1") == "busy"
    a.cmd("slowest")  # from here on
    b = elastic("b", "512MiB", "384MiB", gpus="1GiB", ctx="64MiB", wait="3")
    assert b.cmd("alloc 384 64") == "allocated 6"
    a.send("held")
    assert a.say_nothing(timeout=HOLD_MS / 1000 + 60) == "held 0"
    rounds, errors = map(int, a.cmd("stop").split()[1:])
    assert rounds > 0 and errors == 0
    slowest = int(a.cmd("slowest").split()[1])
    assert slowest < GATE_HOLD_BOUND_MS, f"a busy round was held {slowest} ms (the wait ran {HOLD_MS} ms)"
    state = elastic.node().state
    wait_for(lambda: per_process(state)[b.proc.pid] == (64 + 384, 0), "B's request all in HBM")
    assert a.cmd("check") == f"check ok {640 * MiB}"
    assert b.cmd("check") == f"check ok {384 * MiB}"

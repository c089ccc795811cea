"""Elastic moves overlap (issue 39 item 4): a tenant's chunks move between HBM and host memory in batches,
their copies asynchronous on several streams and all in flight together, every old mapping unmapped only
once its copy is complete, the bytes and pointers unchanged and the request still in HBM. The simulated
driver books each asynchronous copy as a real GPU would run it (interposer/sim/simcuda_inflight.c): the
tenant reads that book (memsliceSimCounters), the physical placement comes from the simulator's own ledger."""

from __future__ import annotations

import pytest
from conftest import MiB
from test_elastic_swap import elastic, per_process, tenant_bin, wait_for  # noqa: F401  (fixtures)

from memslice.elastic import read_boards

# memsliceSimCounters' order (interposer/sim/simstate.h)
HOST_CREATES, COPIES, ASYNC_COPIES, ASYNC_BYTES, UNMAPS_IN_FLIGHT, IN_FLIGHT_MAX = 2, 4, 6, 7, 8, 10
UNMAPS, RUN_UNMAPS, RUN_UNMAP_MAPPINGS, HOST_RELEASES = 11, 13, 14, 15
CHUNK_MIB = 32
# The scenario of the tests here, a quarter of the 4 GiB one (the bytes the tenants fill, check and move
# cost CPU; what the assertions count is chunks, batches and copies in flight): a 1056 MiB GPU, 64 MiB contexts.
# A (request 128 MiB) fills 512 MiB in 64 MiB blocks and goes idle; B fills two 384 MiB ranges, the second of
# which lacks 1056 - 64 - 512 - 64 - 384 - 384 = -352 MiB of HBM: A moves 11 chunks out in one answer.
GPU, CTX = dict(gpus="1056MiB", ctx="64MiB"), 64
A_MIB, NEEDED = 512, 352


def counters(t) -> list[int]:
    out = t.cmd("counters").split()
    assert out[0] == "counters" and len(out) > IN_FLIGHT_MAX + 1, out
    return [int(x) for x in out[1:]]


def board(edir, pid: int):
    return next(t for t in read_boards(edir) if t.pid == pid)


def test_chunks_move_in_batches_of_overlapping_copies_with_every_byte(elastic):  # noqa: F811
    """A (request 128 MiB) fills 512 MiB and goes idle; B's second 384 MiB range lacks 352 MiB of HBM, so A
    moves 11+ chunks out in one answer: each is copied asynchronously, several copies in flight at once, none
    unmapped under a copy in flight; the bytes and pointers are unchanged and A's request is still in HBM
    (the simulator's ledger). Once B frees, A's chunks come back the same way."""
    a = elastic("a", "768MiB", "128MiB", **GPU)
    assert a.cmd("alloc 512 64") == "allocated 8"
    ptrs = a.cmd("ptrs")
    state = elastic.node().state
    before = counters(a)
    wait_for(lambda: board(elastic.edir, a.proc.pid).state == "idle", "A idle on the board")
    b = elastic("b", "1GiB", "128MiB", **GPU)
    assert b.cmd("alloc 768 384") == "allocated 2"  # the second range lacks 352 MiB: one ask, one answer
    dev, host = per_process(state)[a.proc.pid]
    assert host >= NEEDED and dev >= CTX + 128, f"A moved {host} MiB out and keeps {dev} MiB in HBM"
    out = counters(a)
    moved_chunks = host // CHUNK_MIB
    assert out[ASYNC_COPIES] - before[ASYNC_COPIES] >= moved_chunks, (before, out)
    assert out[ASYNC_BYTES] - before[ASYNC_BYTES] >= host * MiB, (before, out)
    assert moved_chunks >= 11 and out[IN_FLIGHT_MAX] >= 4, f"copies in flight at once: {out[IN_FLIGHT_MAX]}"
    assert out[UNMAPS_IN_FLIGHT] == 0, "a mapping was unmapped under a copy still in flight"
    assert out[COPIES] - before[COPIES] == out[ASYNC_COPIES] - before[ASYNC_COPIES], "a move copied synchronously"
    assert a.cmd("check") == f"check ok {A_MIB * MiB}"
    assert a.cmd("ptrs") == ptrs
    # B frees: A's chunks come back in batches of overlapping copies too
    assert b.cmd("free") == "freed 0"
    assert a.cmd("check") == f"check ok {A_MIB * MiB}"  # a CUDA call: A is active, its bursts come back
    wait_for(lambda: per_process(state)[a.proc.pid] == (CTX + A_MIB, 0), "A's memory back in HBM")
    back = counters(a)
    assert back[ASYNC_BYTES] - out[ASYNC_BYTES] >= host * MiB, (out, back)
    assert back[UNMAPS_IN_FLIGHT] == 0
    tb = board(elastic.edir, a.proc.pid)
    # a batch per tick: fewer moves than chunks would take one per tick (the board counts chunks and time)
    assert tb.swap_ins >= moved_chunks and tb.swap_outs >= moved_chunks, tb
    assert a.cmd("check") == f"check ok {A_MIB * MiB}"
    assert a.cmd("ptrs") == ptrs
    a.close()
    b.close()


@pytest.mark.parametrize("synchronised", [True, False])
def test_the_simulator_books_async_copies_until_their_stream_is_synchronised(node, tmp_path, synchronised):
    """The model the test above relies on: an async copy on a created stream is in flight until the stream is
    synchronised; unmapping its memory before that is counted (on a real GPU, a fault or lost bytes)."""
    import subprocess
    import sys

    prog = r"""
import ctypes, sys
cu = ctypes.CDLL("libcuda.so.1")
U64 = ctypes.c_uint64
for f in ("cuMemAddressReserve", "cuMemMap", "cuMemUnmap", "cuMemSetAccess", "cuMemcpyDtoDAsync_v2"):
    getattr(cu, f).restype = ctypes.c_int
cu.cuMemAddressReserve.argtypes = [ctypes.POINTER(U64), ctypes.c_size_t, ctypes.c_size_t, U64, ctypes.c_ulonglong]
cu.cuMemMap.argtypes = [U64, ctypes.c_size_t, ctypes.c_size_t, U64, ctypes.c_ulonglong]
cu.cuMemUnmap.argtypes = [U64, ctypes.c_size_t]
cu.cuMemSetAccess.argtypes = [U64, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t]
cu.cuMemcpyDtoDAsync_v2.argtypes = [U64, U64, ctypes.c_size_t, ctypes.c_void_p]
dev, ctx, st = ctypes.c_int(), ctypes.c_void_p(), [ctypes.c_void_p(), ctypes.c_void_p()]
assert cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
for s in st:
    assert cu.cuStreamCreate(ctypes.byref(s), 1) == 0
class Loc(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]
class Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("handleTypes", ctypes.c_int), ("location", Loc), ("win32", ctypes.c_void_p),
                ("flags", ctypes.c_ubyte * 8)]
class Access(ctypes.Structure):
    _fields_ = [("location", Loc), ("flags", ctypes.c_int)]
size = 2 << 20
va = [U64(), U64()]
for k in range(2):
    h = U64()
    p = Prop(type=1, location=Loc(type=1, id=0))
    assert cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(size), ctypes.byref(p), ctypes.c_ulonglong(0)) == 0
    assert cu.cuMemAddressReserve(ctypes.byref(va[k]), size, 0, 0, 0) == 0
    assert cu.cuMemMap(va[k], size, 0, h, 0) == 0
    acc = Access(location=Loc(type=1, id=0), flags=3)
    assert cu.cuMemSetAccess(va[k], size, ctypes.byref(acc), 1) == 0
assert cu.cuMemcpyDtoDAsync_v2(va[1], va[0], size // 2, st[0]) == 0
assert cu.cuMemcpyDtoDAsync_v2(va[1].value + size // 2, va[0].value + size // 2, size // 2, st[1]) == 0
if sys.argv[1] == "sync":
    for s in st:
        assert cu.cuStreamSynchronize(s) == 0
assert cu.cuMemUnmap(va[0], size) == 0
c = (ctypes.c_ulonglong * 32)()
n = min(cu.memsliceSimCounters(c, 32), 32)
print(" ".join(str(c[i]) for i in range(n)))
"""
    n = node(gpus="1GiB")
    out = subprocess.run([sys.executable, "-c", prog, "sync" if synchronised else "nosync"], env=n.env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    c = [int(x) for x in out.stdout.split()]
    assert c[ASYNC_COPIES] == 2 and c[ASYNC_BYTES] == 2 << 20
    assert c[IN_FLIGHT_MAX] == 2, "two copies on two streams are in flight together"
    assert c[UNMAPS_IN_FLIGHT] == (0 if synchronised else 1)


def test_moves_report_where_their_time_went_per_phase(elastic, tmp_path):  # noqa: F811
    """At MEMSLICE_LOG=info the mover logs, after each batch, its per-phase time so far for that direction
    (create, stage, gate, copy, remap, finish; what the GPU kit prints): the out figures count the chunks the
    simulator's ledger says moved, in at least one batch, and each phase took some time."""
    from memslice.elastic import MOVE_PHASE_KEYS, parse_move_phases

    err = (tmp_path / "a.err").open("w+")
    a = elastic("a", "768MiB", "128MiB", **GPU, stderr=err, MEMSLICE_LOG="info")
    assert a.cmd("alloc 512 64") == "allocated 8"
    state = elastic.node().state
    wait_for(lambda: board(elastic.edir, a.proc.pid).state == "idle", "A idle on the board")
    b = elastic("b", "1GiB", "128MiB", **GPU)
    assert b.cmd("alloc 768 384") == "allocated 2"
    _, host = per_process(state)[a.proc.pid]
    wait_for(lambda: "out" in parse_move_phases((tmp_path / "a.err").read_text()), "A's out phases logged")
    out = parse_move_phases((tmp_path / "a.err").read_text())["out"]
    assert out["chunks"] == host // CHUNK_MIB == board(elastic.edir, a.proc.pid).swap_outs, out
    assert 1 <= out["batches"] <= out["chunks"], out
    assert all(out[k] > 0 for k in MOVE_PHASE_KEYS), out
    assert b.cmd("free") == "freed 0"
    assert a.cmd("check") == f"check ok {A_MIB * MiB}"
    wait_for(lambda: per_process(state)[a.proc.pid] == (CTX + A_MIB, 0), "A's memory back in HBM")
    wait_for(lambda: parse_move_phases((tmp_path / "a.err").read_text()).get("in", {}).get("chunks") == out["chunks"],
             "A's in phases logged")
    back = parse_move_phases((tmp_path / "a.err").read_text())["in"]
    assert all(back[k] > 0 for k in MOVE_PHASE_KEYS), back


def move_out_for(elastic, name: str) -> object:  # noqa: F811
    """A neighbour whose second 384 MiB range lacks HBM: one ask, one answer from A."""
    b = elastic(name, "1GiB", "128MiB", **GPU)
    assert b.cmd("alloc 768 384") == "allocated 2"
    return b


def test_moves_reuse_pinned_host_chunks_and_unmap_runs_at_once(elastic, tmp_path):  # noqa: F811
    """The host pool (interposer/src/elastic_pool.c): A's first move out pins its host chunks once; the move back
    unpins nothing (the chunks stay pinned, A's own host memory in the simulator's ledger, as on a real node's
    cgroup); the next move out pins nothing more and lands in the same chunks. Chunks whose copies are all
    complete are unmapped in runs (one cuMemUnmap for several adjacent mappings), never under a copy in flight;
    every byte and pointer is unchanged."""
    err = (tmp_path / "a.err").open("w+")
    a = elastic("a", "768MiB", "128MiB", **GPU, stderr=err, MEMSLICE_LOG="info", MEMSLICE_HOST_POOL_KEEP="600")
    assert a.cmd("alloc 512 64") == "allocated 8"
    ptrs = a.cmd("ptrs")
    state = elastic.node().state
    c0 = counters(a)
    wait_for(lambda: board(elastic.edir, a.proc.pid).state == "idle", "A idle on the board")
    b = move_out_for(elastic, "b")
    dev, host = per_process(state)[a.proc.pid]
    chunks = host // CHUNK_MIB
    c1 = counters(a)
    assert chunks >= 11 and c1[HOST_CREATES] - c0[HOST_CREATES] == chunks, (chunks, c0, c1)
    assert c1[RUN_UNMAPS] > c0[RUN_UNMAPS] and c1[RUN_UNMAP_MAPPINGS] - c0[RUN_UNMAP_MAPPINGS] >= 2, (c0, c1)
    assert c1[UNMAPS_IN_FLIGHT] == 0
    assert a.cmd("check") == f"check ok {A_MIB * MiB}"
    assert b.cmd("free") == "freed 0"
    b.close()
    # back in HBM; the host chunks stay pinned for the next move (nothing unpinned)
    wait_for(lambda: per_process(state)[a.proc.pid] == (CTX + A_MIB, host), "A back in HBM, its host chunks kept")
    c2 = counters(a)
    assert c2[HOST_RELEASES] == c1[HOST_RELEASES], "a move back unpinned host memory"
    assert a.cmd("check") == f"check ok {A_MIB * MiB}"
    # idle again: the next move out reuses the pinned chunks
    wait_for(lambda: board(elastic.edir, a.proc.pid).state == "idle", "A idle again")
    b2 = move_out_for(elastic, "b2")
    assert per_process(state)[a.proc.pid] == (dev, host), "the same chunks moved out, into the same host memory"
    c3 = counters(a)
    assert c3[HOST_CREATES] == c2[HOST_CREATES], "the second move out pinned host memory again"
    assert c3[UNMAPS_IN_FLIGHT] == 0
    assert a.cmd("check") == f"check ok {A_MIB * MiB}"
    assert a.cmd("ptrs") == ptrs
    b2.close()
    a.close()


def test_the_pool_gives_pinned_chunks_back_once_unused(elastic, tmp_path):  # noqa: F811
    """MEMSLICE_HOST_POOL_KEEP bounds how long pinned chunks no move uses are kept: once A's memory is back
    in HBM, its pinned host chunks go back to the driver (the ledger's host figure drops to 0) and A says so."""
    err = (tmp_path / "a.err").open("w+")
    a = elastic("a", "768MiB", "128MiB", **GPU, stderr=err, MEMSLICE_LOG="info", MEMSLICE_HOST_POOL_KEEP="0.2")
    assert a.cmd("alloc 512 64") == "allocated 8"
    state = elastic.node().state
    wait_for(lambda: board(elastic.edir, a.proc.pid).state == "idle", "A idle on the board")
    b = move_out_for(elastic, "b")
    host = per_process(state)[a.proc.pid][1]
    c1 = counters(a)
    assert b.cmd("free") == "freed 0"
    assert a.cmd("check") == f"check ok {A_MIB * MiB}"
    wait_for(lambda: per_process(state)[a.proc.pid] == (CTX + A_MIB, 0), "A back in HBM, its pinned chunks given back")
    assert counters(a)[HOST_RELEASES] - c1[HOST_RELEASES] == host // CHUNK_MIB
    wait_for(lambda: "host pool: " in (tmp_path / "a.err").read_text(), "A says it gave pinned memory back")
    assert f"{host}.0 MiB of pinned host memory given back" in (tmp_path / "a.err").read_text()
    b.close()
    a.close()


def test_the_simulated_link_delays_completion_and_unmaps_whole_mappings_only(node):
    """The simulator's model the benchmark relies on (interposer/sim/simcuda_inflight.c, simcuda_vmm.c): with
    MEMSLICE_SIM_LINK_GBPS an async copy's event is not complete until the link has carried the copy (its
    synchronisation waits at least that long), and cuMemUnmap takes a range of several whole mappings at once but
    never part of one."""
    import subprocess
    import sys

    prog = r"""
import ctypes, time
cu = ctypes.CDLL("libcuda.so.1")
U64 = ctypes.c_uint64
cu.cuMemAddressReserve.argtypes = [ctypes.POINTER(U64), ctypes.c_size_t, ctypes.c_size_t, U64, ctypes.c_ulonglong]
cu.cuMemMap.argtypes = [U64, ctypes.c_size_t, ctypes.c_size_t, U64, ctypes.c_ulonglong]
cu.cuMemUnmap.argtypes = [U64, ctypes.c_size_t]
cu.cuMemSetAccess.argtypes = [U64, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t]
cu.cuMemcpyDtoDAsync_v2.argtypes = [U64, U64, ctypes.c_size_t, ctypes.c_void_p]
dev, ctx, st, ev = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
assert cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
assert cu.cuStreamCreate(ctypes.byref(st), 1) == 0 and cu.cuEventCreate(ctypes.byref(ev), 2) == 0
class Loc(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]
class Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("handleTypes", ctypes.c_int), ("location", Loc), ("win32", ctypes.c_void_p),
                ("flags", ctypes.c_ubyte * 8)]
class Access(ctypes.Structure):
    _fields_ = [("location", Loc), ("flags", ctypes.c_int)]
size = 2 << 20
va = U64()
assert cu.cuMemAddressReserve(ctypes.byref(va), 3 * size, 0, 0, 0) == 0
for k in range(3):
    h = U64()
    prop = Prop(type=1, location=Loc(1, 0))
    assert cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(size), ctypes.byref(prop), 0) == 0
    assert cu.cuMemMap(va.value + k * size, size, 0, h, 0) == 0
assert cu.cuMemSetAccess(va, 3 * size, ctypes.byref(Access(location=Loc(1, 0), flags=3)), 1) == 0
t0 = time.monotonic()
assert cu.cuMemcpyDtoDAsync_v2(va.value + size, va, size, st) == 0 and cu.cuEventRecord(ev, st) == 0
first = cu.cuEventQuery(ev)
assert cu.cuEventSynchronize(ev) == 0
waited = time.monotonic() - t0
print(first, cu.cuEventQuery(ev), round(waited, 3),
      cu.cuMemUnmap(va, size + size // 2),       # part of the second mapping: refused
      cu.cuMemUnmap(va.value + size, 2 * size),  # the second and third whole: one call
      cu.cuMemUnmap(va, size))
"""
    n = node(gpus="1GiB")
    env = {**n.env, "MEMSLICE_SIM_LINK_GBPS": "0.001"}  # 2 MiB take 2.1 s on this link
    out = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    first, after, waited, partial, run, single = out.stdout.split()
    assert (int(first), int(after)) == (600, 0), "NOT_READY while the link carries the copy, then complete"
    assert float(waited) >= (2 << 20) / 1e6, "the synchronisation returned before the link carried the copy"
    assert (int(partial), int(run), int(single)) == (1, 0, 0)

"""Issue 33 item 4: the simulated GPU runs kernels in GPU time, on ONE timeline per GPU shared by every process.

Real processes on a simulated node: tests/c/spin_tenant (spin kernels through the driver API) and a ctypes
client. What is asserted comes from the simulator's own figures (memsliceSimTimeline, NVML, event times on
the GPU's timeline), never from wall-clock bounds: every ns of work asked for is run and charged to its
context, contexts with work take turns (an equal neighbour halves a kernel's share), NVML reports the
busy share, and a killed process's queued work vanishes."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import PRELOAD_FIRST, run
from sim_compute import CUDA_BINDINGS_SPIN, Spinner, driver_env, monotonic_ns, nvml_util, poll, timeline

MS = 1_000_000

API = r"""
import ctypes, json, os
cu = ctypes.CDLL("libcuda.so.1")
V, U64 = ctypes.c_void_p, ctypes.c_ulonglong
def ok(rc, what):
    assert rc == 0, f"{what}: CUresult {rc}"
def figures():
    v = (U64 * 256)()
    n = cu.memsliceSimTimeline(0, v, 256)
    mine = [v[5 + 3 * i: 7 + 3 * i] for i in range(v[3]) if v[4 + 3 * i] == os.getpid()]
    return v[0], (mine[0][1] if mine else 0)
dev, ctx, mod = ctypes.c_int(), V(), V()
ok(cu.cuInit(0), "cuInit")
ok(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
ok(cu.cuModuleLoadData(ctypes.byref(mod), ctypes.create_string_buffer(b"MSSIMMOD" + bytes(8), 16)), "load")
def func(name):
    f = V()
    ok(cu.cuModuleGetFunction(ctypes.byref(f), mod, name.encode()), name)
    return f
spin, other = func("spin"), func("any_name_at_all")
stream = V()
ok(cu.cuStreamCreate(ctypes.byref(stream), 0), "cuStreamCreate")
def launch(f, params=None, extra=None):
    return cu.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, stream, params, extra)
res = {"same_handle": func("spin").value == spin.value}
busy0, _ = figures()
for _ in range(1000):
    ok(launch(other), "launch other")
ok(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
res["other_ns"] = figures()[0] - busy0
ns = U64(200_000_000)
params = (V * 1)(ctypes.cast(ctypes.byref(ns), V))
e0, e1 = V(), V()
ok(cu.cuEventCreate(ctypes.byref(e0), 0), "cuEventCreate")
ok(cu.cuEventCreate(ctypes.byref(e1), 0), "cuEventCreate")
ok(cu.cuEventRecord(e0, stream), "cuEventRecord")
ok(launch(spin, params), "launch spin")
ok(cu.cuEventRecord(e1, stream), "cuEventRecord")
res["stream_query_running"] = cu.cuStreamQuery(stream)
res["event_query_running"] = cu.cuEventQuery(e1)
ms = ctypes.c_float()
res["elapsed_running"] = cu.cuEventElapsedTime(ctypes.byref(ms), e0, e1)
ok(cu.cuEventSynchronize(e1), "cuEventSynchronize")
res["event_query_done"] = cu.cuEventQuery(e1)
res["stream_query_done"] = cu.cuStreamQuery(stream)
ok(cu.cuEventElapsedTime(ctypes.byref(ms), e0, e1), "cuEventElapsedTime")
res["elapsed_ms"] = ms.value
buf, size = U64(30_000_000), ctypes.c_size_t(8)
extra = (V * 5)(1, ctypes.cast(ctypes.byref(buf), V), 2, ctypes.cast(ctypes.byref(size), V), 0)
busy1, _ = figures()
ok(launch(spin, None, extra), "launch spin (extra)")
ok(cu.cuCtxSynchronize(), "cuCtxSynchronize")
res["extra_ns"] = figures()[0] - busy1
seen = {}
CB = ctypes.CFUNCTYPE(None, V)
cb = CB(lambda _: seen.setdefault("queued", figures()[1]))
ok(launch(spin, params), "launch spin")
res["queued_after_launch"] = figures()[1]
ok(cu.cuLaunchHostFunc(stream, cb, None), "cuLaunchHostFunc")
res["queued_in_host_fn"] = seen["queued"]
res["spin_without_argument"] = launch(spin)
cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(U64), ctypes.c_size_t]
cu.cuMemcpyDtoH_v2.argtypes = [V, U64, ctypes.c_size_t]
dptr, host = U64(), ctypes.create_string_buffer(64)
ok(cu.cuMemAlloc_v2(ctypes.byref(dptr), 64), "cuMemAlloc_v2")
ok(launch(spin, params), "launch spin")
ok(cu.cuMemcpyDtoH_v2(host, dptr, 64), "cuMemcpyDtoH_v2")
res["queued_after_sync_copy"] = figures()[1]
attr = ctypes.c_int()
ok(cu.cuFuncGetAttribute(ctypes.byref(attr), 0, spin), "cuFuncGetAttribute")
res["max_threads"] = attr.value
print(json.dumps(res))
"""


HELD = 'import ctypes; print(ctypes.CDLL("libcuda.so.1").memsliceSimTimeline(0, None, 0))'


@pytest.fixture
def sim(node):
    return node(gpus="4GiB", context_overhead="0")


def spinner(cbin, sim) -> Spinner:
    return Spinner(cbin["spin_tenant"], sim.env)


def consistent(tl: dict) -> bool:
    """The timeline's busy time is exactly what its clients (live and released) were charged."""
    return bool(tl["busy"] == tl["retired"] + sum(c["busy"] for c in tl["clients"]))


def test_kernels_take_their_gpu_time_and_completion_is_observed(sim):
    out = run([sys.executable, "-c", API], sim.env)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["same_handle"]
    assert r["other_ns"] == 1000 * 2000  # any other kernel: a fixed 2 us
    assert r["stream_query_running"] == 600 and r["event_query_running"] == 600  # CUDA_ERROR_NOT_READY
    assert r["elapsed_running"] == 600
    assert r["event_query_done"] == 0 and r["stream_query_done"] == 0
    assert r["elapsed_ms"] >= 200.0  # the GPU time between the events covers the whole kernel
    assert r["extra_ns"] == 30 * MS  # the parameter read from the `extra` buffer form
    assert 0 < r["queued_after_launch"] <= 200 * MS  # asynchronous: the launch returned with the work queued
    assert r["queued_in_host_fn"] == 0  # the host function ran after the work before it
    assert r["spin_without_argument"] == 1  # CUDA_ERROR_INVALID_VALUE
    assert r["queued_after_sync_copy"] == 0  # a synchronous copy to the host came after the kernel
    assert r["max_threads"] == 1024


def test_alone_a_spin_is_charged_exactly_its_duration(cbin, sim):
    before = timeline(sim.env)
    got = spinner(cbin, sim).run(50 * MS, count=3)
    after = timeline(sim.env)
    assert got["kernels"] == 3 and got["gpu_ns"] == 150 * MS and got["sim_busy_ns"] == 150 * MS
    assert after["busy"] - before["busy"] == 150 * MS
    assert after["retired"] - before["retired"] == 150 * MS  # its client was released at exit
    assert after["now"] - before["now"] >= 150 * MS
    assert got["gpu_ms_p50"] >= 50.0
    assert after["clients"] == [] and consistent(after)


def test_two_contexts_take_turns_and_every_ns_is_accounted(cbin, sim):
    hog = spinner(cbin, sim).queue(100 * MS, count=100)  # 10 s of work queued, never synchronized
    try:
        before = timeline(sim.env)
        got = spinner(cbin, sim).run(50 * MS, count=4)
        during = timeline(sim.env)
        assert got["kernels"] == 4 and got["sim_busy_ns"] == 200 * MS
        # each 50 ms kernel shared the GPU with the hog's queue: it took about twice its work in GPU time
        assert got["gpu_ms_p50"] >= 95.0
        hog_client = [c for c in during["clients"] if c["pid"] == hog.pid]
        assert hog_client and hog_client[0]["queued"] > 0 and hog_client[0]["busy"] >= 190 * MS
        # the GPU never ran two contexts at once, and ran one whenever one had work: busy == elapsed
        assert during["busy"] - before["busy"] == during["now"] - before["now"]
        assert consistent(during)
    finally:
        hog.kill()


def test_equal_neighbours_share_in_timeslices(cbin, sim):
    a = spinner(cbin, sim).queue(100 * MS, count=100)
    b = spinner(cbin, sim).queue(100 * MS, count=100)
    try:
        def busy_of(tl: dict) -> dict[int, int]:
            return {c["pid"]: c["busy"] for c in tl["clients"]}
        first = poll(lambda: (lambda tl: tl if all(busy_of(tl).get(p, 0) > 0 for p in (a.pid, b.pid)) else None)(
            timeline(sim.env)), "both tenants run")
        second = poll(lambda: (lambda tl: tl if tl["now"] - first["now"] >= 200 * MS else None)(timeline(sim.env)),
                      "200 ms more of the timeline")
        da, db = (busy_of(second)[p] - busy_of(first)[p] for p in (a.pid, b.pid))
        # both had work all along: the GPU ran one of them all the time, each got half, give or take a slice
        assert da + db == second["now"] - first["now"]
        assert abs(da - db) <= 2 * 2 * MS
        assert consistent(first) and consistent(second)
    finally:
        a.kill()
        b.kill()


def test_completions_of_equal_neighbours_interleave(cbin, sim):
    start = monotonic_ns() + 1_500 * MS  # both processes are up and waiting by then
    a = spinner(cbin, sim).start(50 * MS, count=4, start_at=start)
    b = spinner(cbin, sim).start(50 * MS, count=4, start_at=start)
    ra, rb = a.wait(), b.wait()
    assert ra["sim_busy_ns"] == rb["sim_busy_ns"] == 200 * MS
    # neither ran its four kernels before the other began: their completions interleave
    assert min(ra["done_ns"][-1], rb["done_ns"][-1]) > max(ra["done_ns"][0], rb["done_ns"][0])
    # each kernel took about twice its work in GPU time: the other context had work too
    assert ra["gpu_ms_p50"] >= 75.0 and rb["gpu_ms_p50"] >= 75.0


def test_nvml_reports_the_timeline(cbin, sim):
    a = spinner(cbin, sim).queue(100 * MS, count=100)
    b = spinner(cbin, sim).queue(100 * MS, count=100)
    try:
        def shared() -> dict | None:
            # (the period in which the second one started shows the first ahead: wait for a full shared one)
            u = nvml_util(sim.env)
            halves = all(45 <= u["procs"].get(p, 0) <= 55 for p in (a.pid, b.pid))
            return u if u["gpu"] == 100 and halves else None
        u = poll(shared, "NVML shows a busy GPU shared half and half by both")
        assert set(u["procs"]) == {a.pid, b.pid}
    finally:
        a.kill()
        b.kill()
    idle = poll(lambda: (lambda u: u if u["gpu"] == 0 else None)(nvml_util(sim.env)), "NVML shows an idle GPU")
    assert idle["procs"] == {}


def test_a_killed_process_frees_the_gpu_and_its_queue_vanishes(cbin, sim):
    hog = spinner(cbin, sim).queue(100 * MS, count=100)
    poll(lambda: any(c["pid"] == hog.pid and c["busy"] > 0 for c in timeline(sim.env)["clients"]), "the hog runs")
    before = timeline(sim.env)
    queued = next(c["queued"] for c in before["clients"] if c["pid"] == hog.pid)
    hog.kill()  # mid-kernel, with seconds of work queued
    got = spinner(cbin, sim).run(50 * MS, count=2)  # not stuck behind the dead process's queue
    after = timeline(sim.env)
    assert got["kernels"] == 2 and got["sim_busy_ns"] == 100 * MS
    assert all(c["pid"] != hog.pid for c in after["clients"])
    assert after["busy"] - before["busy"] < queued  # the dead process's queued work was never run
    assert consistent(after)
    idle = timeline(sim.env)
    again = spinner(cbin, sim).run(50 * MS, count=2)
    assert again["sim_busy_ns"] == 100 * MS
    assert timeline(sim.env)["busy"] - idle["busy"] == 100 * MS  # alone now: nobody else is charged


def test_a_tenant_wrecking_the_timeline_stalls_no_one(cbin, sim, tmp_path):
    import fcntl
    import os

    lock = sim.state + ".lock"  # the node lock file: every container of the node can write it
    victim = spinner(cbin, sim).start(20 * MS, count=100)
    poll(lambda: timeline(sim.env)["clients"], "the victim runs")
    with open(lock, "r+b") as f:
        for attack in range(6):
            if attack % 3 == 0:
                os.truncate(lock, 0)
            elif attack % 3 == 1:
                f.seek(0)
                f.write(os.urandom(1 << 17))
                f.flush()
            else:
                fcntl.lockf(f, fcntl.LOCK_EX, 1, 1)  # the GPU's timeline lock byte, held a while
                held = run([sys.executable, "-c", HELD], driver_env(sim.env))
                assert held.stdout.strip() == "0", held.stderr  # the reader gave up (bounded) instead of hanging
                fcntl.lockf(f, fcntl.LOCK_UN, 1, 1)
    got = victim.wait()
    assert got["kernels"] == 100  # every kernel completed: lost queued work counts as done, no wait hangs
    before = timeline(sim.env)
    again = spinner(cbin, sim).run(20 * MS, count=5)
    assert again["sim_busy_ns"] == 100 * MS and timeline(sim.env)["busy"] - before["busy"] == 100 * MS


@pytest.mark.skipif(bool(PRELOAD_FIRST), reason="memslice run puts the shim before the sanitizer runtime")
def test_the_python_spin_tenant_runs_under_memslice_run(tmp_path):
    """The demo path: `memslice run --simulate-gpu` and `python -m memslice.spin` (the shim preloaded)."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSLICE_") and k != "LD_PRELOAD"}
    env["MEMSLICE_SIM_STATE"] = str(tmp_path / "node.state")
    cmd = [sys.executable, "-m", "memslice", "run", "--gpu-mem", "1GiB", "--simulate-gpu", "4GiB",
           "--region-dir", str(tmp_path / "region"), "--", sys.executable, "-m", "memslice.spin", "--ns",
           str(20 * MS), "--count", "5"]
    out = run(cmd, env)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["kernels"] == 5 and got["gpu_ns"] == 100 * MS
    assert 0 < got["share"] <= 1.0


def test_spin_figures_are_computed_from_latencies():
    from memslice.spin import figures, percentile

    assert percentile([], 50) == 0 and percentile([5, 1, 3], 50) == 3 and percentile(list(range(100)), 99) == 99
    assert figures([10, 30, 20], 10, 60) == {"kernels": 3, "gpu_ns": 30, "wall_ns": 60, "lat_ns_p50": 20,
                                             "lat_ns_p99": 30, "share": 0.5}


def test_cuda_bindings_launch_spin_kernels(sim):
    """NVIDIA's Python bindings (every entry point through cuGetProcAddress) launch spin on the simulator."""
    before = timeline(sim.env)
    out = run([sys.executable, "-c", CUDA_BINDINGS_SPIN, str(20 * MS), "3"], sim.env)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["query_running"] == 600 and got["gpu_ms"] >= 60.0
    assert timeline(sim.env)["busy"] - before["busy"] == 60 * MS


def test_each_gpu_has_its_own_timeline(cbin, node):
    two = node(gpus="4GiB,4GiB", context_overhead="0")
    a = Spinner(cbin["spin_tenant"], two.env).queue(100 * MS, count=100, gpu=0)
    b = Spinner(cbin["spin_tenant"], two.env).queue(100 * MS, count=100, gpu=1)
    try:
        def alone_on_each() -> bool:
            t0, t1 = timeline(two.env, 0), timeline(two.env, 1)
            return [c["pid"] for c in t0["clients"]] == [a.pid] and [c["pid"] for c in t1["clients"]] == [b.pid]
        poll(alone_on_each, "each tenant alone on its GPU")
        busy = poll(lambda: (lambda u: u if u[0]["gpu"] == 100 and u[1]["gpu"] == 100 else None)(
            [nvml_util(two.env, 0), nvml_util(two.env, 1)]), "both GPUs fully busy")
        assert busy[0]["procs"] == {a.pid: 100} and busy[1]["procs"] == {b.pid: 100}
    finally:
        a.kill()
        b.kill()


EVENTS = r"""
import ctypes, json
cu = ctypes.CDLL("libcuda.so.1")
V, U64 = ctypes.c_void_p, ctypes.c_ulonglong
def ok(rc):
    assert rc == 0, rc
dev, ctx, mod, fn, st = ctypes.c_int(), V(), V(), V(), V()
ok(cu.cuInit(0)); ok(cu.cuDeviceGet(ctypes.byref(dev), 0))
ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)); ok(cu.cuCtxSetCurrent(ctx))
ok(cu.cuModuleLoadData(ctypes.byref(mod), ctypes.create_string_buffer(b"MSSIMMOD" + bytes(8), 16)))
ok(cu.cuModuleGetFunction(ctypes.byref(fn), mod, b"spin")); ok(cu.cuStreamCreate(ctypes.byref(st), 0))
head, ns = U64(300_000_000), U64(5_000_000)
events = [V() for _ in range(32)]
for e in events:
    ok(cu.cuEventCreate(ctypes.byref(e), 0))
ok(cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, st, (V * 1)(ctypes.cast(ctypes.byref(head), V)), None))
params = (V * 1)(ctypes.cast(ctypes.byref(ns), V))
in_flight = []
for e in events:
    ok(cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, st, params, None))
    ok(cu.cuEventRecord(e, st))
    in_flight.append(cu.cuEventQuery(e) == 600)  # CUDA_ERROR_NOT_READY: recorded behind work still queued
ok(cu.cuStreamSynchronize(st))
ms = ctypes.c_float()
gaps = []
for a, b in zip(events, events[1:]):
    ok(cu.cuEventElapsedTime(ctypes.byref(ms), a, b))
    gaps.append(ms.value)
print(json.dumps({"gaps": gaps, "in_flight": in_flight}))
"""


def test_events_in_flight_are_stamped_when_the_timeline_reaches_them(sim):
    """32 kernels of 5 ms queued behind one of 300 ms, an event after each: between two events recorded while
    their kernels were still queued (cuEventQuery: not ready) the gap is exactly one kernel, never the host's
    pace; an event recorded behind finished work is stamped when recorded (as on a GPU), so no gap is shorter."""
    out = run([sys.executable, "-c", EVENTS], sim.env)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    gaps, queued = got["gaps"], got["in_flight"]
    assert len(gaps) == 31 and all(g > 5.0 - 0.001 for g in gaps), gaps
    exact = [g for k, g in enumerate(gaps) if queued[k] and queued[k + 1]]
    assert exact, f"no two events were recorded behind queued work: {got}"
    assert all(abs(g - 5.0) < 0.001 for g in exact), got

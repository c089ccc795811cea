"""Bad configuration fails closed with a message a person can act on; dead processes lose nothing; many
processes and threads hammering one quota never push the GPU past it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from conftest import run
from sim_truth import GpuWatch, gpu_truth

BAD_ENV = [
    ("MEMSLICE_GPU_MEM_LIMIT", "4GB", "decimal units are ambiguous"),
    ("MEMSLICE_GPU_MEM_LIMIT", "lots", "MEMSLICE_GPU_MEM_LIMIT='lots' is not a valid size"),
    ("MEMSLICE_GPU_MEM_LIMIT", "0", "greater than zero"),
    ("MEMSLICE_GPU_MEM_LIMIT", "", "is not a valid size"),
    ("MEMSLICE_GPU_MEM_LIMIT", "-1", "is not a valid size"),
    ("MEMSLICE_GPU_MEM_LIMIT", "1.5GiB", "is not a valid size"),
    ("MEMSLICE_GPU_MEM_LIMIT", "99999999999999999999TiB", "is not a valid size"),
    ("MEMSLICE_CONTEXT_RESERVE", "big", "MEMSLICE_CONTEXT_RESERVE='big'"),
    ("MEMSLICE_LOG", "verbose", "MEMSLICE_LOG='verbose' is not a log level"),
    ("MEMSLICE_OVERSUBSCRIBE", "yes", "MEMSLICE_OVERSUBSCRIBE='yes' is not valid"),
    ("MEMSLICE_HOST_SPILL_LIMIT", "a lot", "MEMSLICE_HOST_SPILL_LIMIT='a lot'"),
    ("MEMSLICE_REGION_DIR", "/nonexistent/memslice", "MEMSLICE_REGION_DIR='/nonexistent/memslice' is not a writable"),
    # a cgroup directory that is not one used to turn the spill margin off silently
    ("MEMSLICE_CGROUP_DIR", "/nonexistent/cg", "MEMSLICE_CGROUP_DIR='/nonexistent/cg' is not a readable memory"),
    ("MEMSLICE_CGROUP_DIR", "/tmp", "MEMSLICE_CGROUP_DIR='/tmp' is not a readable memory cgroup directory"),
    ("MEMSLICE_CGROUP_DIR", "/" + "c" * 300, "path too long"),
]


@pytest.mark.parametrize(("var", "value", "message"), BAD_ENV, ids=[f"{v}={x!r}" for v, x, _ in BAD_ENV])
def test_bad_environment_fails_closed(var, value, message, node, cbin, tmp_path):
    n = node()
    env = n.container(tmp_path / "c", "1GiB", **{var: value})
    out = run([cbin["alloc_direct"], "10"], env)
    assert out.stdout.startswith("init 800"), out.stdout  # CUDA_ERROR_NOT_PERMITTED: nothing runs unlimited
    assert message in out.stderr
    assert "Every CUDA call fails until this is fixed." in out.stderr
    assert n.physical() == [] or all(d.used_bytes == 0 for d in n.physical())


def test_quota_without_region_dir_fails_closed(node, cbin, tmp_path):
    n = node()
    env = n.container(tmp_path / "c", "1GiB")
    del env["MEMSLICE_REGION_DIR"]
    out = run([cbin["alloc_direct"], "10"], env)
    assert out.stdout.startswith("init 800")
    assert "MEMSLICE_REGION_DIR is not" in out.stderr


def test_without_a_quota_the_shim_only_observes(node, cbin, tmp_path):
    from memslice.interposer.region import read_region

    n = node(context_overhead="0")  # a context that takes nothing: only the allocation is used
    region = tmp_path / "c"
    env = n.container(region, None, MEMSLICE_CONTEXT_RESERVE="0")
    holder = subprocess.Popen([sys.executable, "-m", "memslice.tenant", "3000"], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        line = holder.stdout.readline() + holder.stdout.readline()
        assert '"result": 0' in line and '"total_mib": 16384' in line
        snap = read_region(region)
        assert snap.devices[0].used_bytes == 3000 << 20 and snap.devices[0].limit_bytes == 0
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


def start_holder(env, mib):
    p = subprocess.Popen([sys.executable, "-m", "memslice.tenant", str(mib)], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    first = p.stdout.readline()
    assert '"result": 0' in first, first
    assert '"ready"' in p.stdout.readline()
    return p


def test_kill_9_usage_is_reclaimed(node, cbin, tmp_path):
    from memslice.interposer.region import read_region

    n = node()
    region = tmp_path / "c"
    env = n.container(region, "1GiB", MEMSLICE_CONTEXT_RESERVE="64MiB")
    victim = start_holder(env, 800)
    assert read_region(region).devices[0].used_bytes == (800 + 64) << 20
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    # the dead process's 864 MiB come back: a new process gets the whole quota again
    out = run([cbin["alloc_direct"], "900"], env)
    assert "alloc 900 MiB -> 0" in out.stdout, out.stdout + out.stderr
    snap = read_region(region)
    assert snap.reclaimed >= 1
    assert snap.devices[0].charged_bytes == 0  # the shared total, not only what live processes hold
    # and the simulated GPU took its physical memory back too (the dead process's context included)
    assert n.physical()[0].charged_bytes == 0


def start_stress(cbin, env, seconds):
    """8 stress processes, each holding its context, released together."""
    procs = [subprocess.Popen([cbin["stress"], "4", str(seconds), "96", str(i)], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for i in range(8)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    return procs


def test_stress_many_processes_never_exceed_quota(node, cbin, tmp_path):
    """8 processes x 4 threads allocate and free at random; the simulator's physical high-water mark
    proves the container never held more than its quota on the GPU."""
    from memslice.interposer.region import read_region

    quota_mib, reserve = 1024, 32
    n = node(context_overhead=f"{reserve}MiB")
    region = tmp_path / "c"
    env = n.container(region, f"{quota_mib}MiB", MEMSLICE_CONTEXT_RESERVE=f"{reserve}MiB")
    procs = start_stress(cbin, env, seconds=3)
    results = [p.communicate(timeout=120)[0] for p in procs]
    for p, text in zip(procs, results, strict=True):
        assert p.returncode == 0, text
        assert "corrupt=0" in text and "other=0" in text
    refused = sum(int(t.split("refused=")[1].split()[0]) for t in results)
    assert refused > 0  # the quota was actually contended
    peak = n.physical()[0].peak_bytes
    assert 0 < peak <= quota_mib << 20, f"physical peak {peak >> 20} MiB over the {quota_mib} MiB quota"
    assert read_region(region).devices[0].charged_bytes == 0  # everyone exited and gave everything back


def test_kill_9_during_stress_loses_nothing(node, cbin, tmp_path):
    """Two of the 8 stressing processes are killed mid-run (possibly inside a charge). The others finish
    without deadlock or corruption, and once everyone is gone the whole quota is back."""
    from memslice.interposer.region import read_region, sweep

    n = node(context_overhead="32MiB")
    region = tmp_path / "c"
    env = n.container(region, "1GiB", MEMSLICE_CONTEXT_RESERVE="32MiB")
    watch = GpuWatch(env)  # the simulated GPU's own figure, sampled past the shim
    procs = start_stress(cbin, env, seconds=2)
    for p in procs[:2]:
        assert p.stdout.readline().strip() == "started"
        p.send_signal(signal.SIGKILL)
    results = [p.communicate(timeout=120)[0] for p in procs]
    physical_peak, samples = watch.stop()
    for p, text in zip(procs[2:], results[2:], strict=True):
        assert p.returncode == 0, text
        assert "corrupt=0" in text and "other=0" in text
    sweep(region)
    snap = read_region(region)
    assert snap.devices[0].used_bytes == 0
    assert not [p for p in snap.processes if p.alive or p.device_bytes]
    # the GPU's own figures: live processes never held more than the quota, and nothing is left on it
    assert samples > 0 and 0 < physical_peak <= 1 << 30, (physical_peak >> 20, samples)
    truth = gpu_truth(env)
    assert truth.used_bytes == 0 and truth.processes == {}, truth


def test_stress_without_shim_exceeds_the_same_budget(node, cbin):
    """Control: the same load without the shim goes past 1 GiB, so the test above can fail."""
    n = node(context_overhead="32MiB")
    for p in start_stress(cbin, n.env, seconds=1):
        p.communicate(timeout=120)
    assert n.physical()[0].peak_bytes > 1024 << 20


def test_processes_in_one_container_share_the_quota(node, cbin, tmp_path):
    n = node()
    env = n.container(tmp_path / "c", "1GiB", MEMSLICE_CONTEXT_RESERVE="64MiB")
    first = start_holder(env, 600)
    try:
        out = run([cbin["alloc_direct"], "600", "200"], env)
        assert "alloc 600 MiB -> 2" in out.stdout and "alloc 200 MiB -> 0" in out.stdout
    finally:
        first.stdin.close()
        first.wait(timeout=30)


def test_many_processes_each_get_a_slot(node, cbin, tmp_path):
    """A thousand processes in one container: slots are claimed and given back (normal exit)."""
    from memslice.interposer.region import read_region

    n = node(context_overhead="0")
    region = tmp_path / "c"
    env = n.container(region, "64GiB", MEMSLICE_CONTEXT_RESERVE="0")
    script = "for i in $(seq 1000); do \"$1\" 1 >/dev/null & if [ $((i % 50)) = 0 ]; then wait; fi; done; wait"
    out = subprocess.run(["bash", "-c", script, "x", cbin["alloc_direct"]], env=env, capture_output=True, timeout=240)
    assert out.returncode == 0
    snap = read_region(region)
    assert snap.devices[0].used_bytes == 0 and snap.devices[0].peak_bytes >= 1 << 20
    assert not [p for p in snap.processes if p.alive]


def test_env_is_read_once(node, cbin, tmp_path):
    """Changing the environment after start cannot lift the quota (read once, at the first CUDA call)."""
    code = ("import ctypes, os; c = ctypes.CDLL('libcuda.so.1'); c.cuInit(0); "
            "os.environ['MEMSLICE_GPU_MEM_LIMIT'] = '64GiB'; d = ctypes.c_int(); x = ctypes.c_void_p(); "
            "c.cuDeviceGet(ctypes.byref(d), 0); c.cuDevicePrimaryCtxRetain(ctypes.byref(x), d); c.cuCtxSetCurrent(x); "
            "p = ctypes.c_ulonglong(); print(c.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(2 << 30)))")
    n = node()
    out = run([sys.executable, "-c", code], n.container(tmp_path / "c", "1GiB"))
    assert out.stdout.strip() == "2"


def test_fork_child_gets_its_own_slot(node, tmp_path):
    from memslice.interposer.region import read_region

    code = textwrap.dedent("""
        import ctypes, os, sys
        c = ctypes.CDLL("libcuda.so.1")
        c.cuInit(0)
        d, x, p = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_ulonglong()
        c.cuDeviceGet(ctypes.byref(d), 0)
        c.cuDevicePrimaryCtxRetain(ctypes.byref(x), d)
        c.cuCtxSetCurrent(x)
        c.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(100 << 20))
        pid = os.fork()
        if pid == 0:
            q = ctypes.c_ulonglong()
            os._exit(c.cuMemAlloc_v2(ctypes.byref(q), ctypes.c_size_t(50 << 20)))
        _, st = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(st), flush=True)
        input()
    """)
    n = node(context_overhead="0")  # contexts take nothing here: the slots hold the allocations alone
    region = tmp_path / "c"
    env = n.container(region, "1GiB", MEMSLICE_CONTEXT_RESERVE="0")
    p = subprocess.Popen([sys.executable, "-c", code], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout.readline().strip() == "child 0"
        from memslice.interposer.region import sweep

        snap = read_region(region)
        # the child charged its own slot, not its parent's (os._exit skips the exit-time release, like a crash)
        assert sorted((q.alive, q.device_bytes) for q in snap.processes) == [(False, 50 << 20), (True, 100 << 20)]
        assert sweep(region) == 1
        assert read_region(region).devices[0].used_bytes == 100 << 20
    finally:
        p.stdin.close()
        p.wait(timeout=30)


def test_region_dir_shared_by_unrelated_environment_is_not_required(tmp_path):
    """Sanity: the test environment itself never preloads the shim."""
    assert "libmemslice" not in os.environ.get("LD_PRELOAD", "")


def test_region_file_is_usable_by_every_user_of_the_container(node, cbin, tmp_path):
    """The first process's umask must not lock other users of the container out of the quota."""
    n = node()
    region = tmp_path / "c"
    env = n.container(region, "1GiB")
    out = subprocess.run(["sh", "-c", 'umask 077; exec "$0" 1', cbin["alloc_direct"]], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert (region / "memslice.region").stat().st_mode & 0o777 == 0o666


def test_kill_9_charge_is_reclaimed_without_a_refusal(node, cbin, tmp_path):
    """A killed process's charge no longer waits for some later refusal: the next process to start (or
    exit) reclaims it, so the ledger (and `top`, and the metrics) are right at once."""
    from memslice.interposer.region import read_region

    n = node()
    region = tmp_path / "c"
    env = n.container(region, "1GiB", MEMSLICE_CONTEXT_RESERVE="64MiB")
    victim = start_holder(env, 800)
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    before = read_region(region).devices[0]
    assert before.charged_bytes == (800 + 64) << 20  # the shared total: nobody has reclaimed it yet
    assert before.used_bytes == 0  # what readers report: live processes only
    out = run([cbin["alloc_direct"], "1"], env)  # fits even beside the dead charge: no refusal, no retry
    assert "alloc 1 MiB -> 0" in out.stdout and "refused" not in out.stderr
    snap = read_region(region)
    assert snap.devices[0].charged_bytes == 0 and snap.reclaimed == 1


def test_running_process_reclaims_dead_neighbours_periodically(node, cbin, tmp_path):
    """A process that keeps allocating reclaims a killed neighbour within about a second
    (MS_SWEEP_PERIOD_MS), even when nothing is refused and no process starts or exits."""
    import threading
    import time

    from memslice.interposer.region import read_region

    n = node(context_overhead="0")
    region = tmp_path / "c"
    env = n.container(region, "8GiB", MEMSLICE_CONTEXT_RESERVE="0")
    victim = start_holder(env, 500)
    busy = subprocess.Popen([cbin["stress"], "2", "8", "4", "1"], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert busy.stdout.readline().strip() == "ready"
        busy.stdin.write("go\n")
        busy.stdin.flush()
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)
        deadline, pace = time.monotonic() + 5, threading.Event()
        while read_region(region).reclaimed == 0 and time.monotonic() < deadline:
            pace.wait(0.05)  # bounded wait for the event: the busy process's periodic sweep
        assert busy.poll() is None  # it was the running process, not its exit, that reclaimed
        assert read_region(region).reclaimed == 1
    finally:
        busy.communicate(timeout=60)

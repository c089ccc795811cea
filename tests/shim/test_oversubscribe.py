"""Oversubscription: past the quota, allocations are served from host memory; the container's device
bytes stay within its quota, its neighbours are never squeezed, and host memory has its own limits."""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import Iterator

import pytest
from conftest import run

from memslice.interposer.region import read_region

MiB = 1 << 20
QUOTA = 256


@pytest.fixture
def cgroup(tmp_path):
    """A fake cgroup v2 directory (unlimited unless a test writes limits)."""
    d = tmp_path / "cgroup"
    d.mkdir()
    (d / "memory.max").write_text("max\n")
    (d / "memory.current").write_text("0\n")
    return d


def spill_env(node, tmp_path, cgroup, region="c", quota=QUOTA, **extra):
    n = node(context_overhead="0")
    env = n.container(tmp_path / region, f"{quota}MiB", MEMSLICE_CONTEXT_RESERVE="0", MEMSLICE_OVERSUBSCRIBE="1",
                      MEMSLICE_CGROUP_DIR=str(cgroup), **extra)
    return n, env


@contextlib.contextmanager
def holding(cmd: list[str], env: dict[str, str]) -> Iterator[list[str]]:
    """Run a `spill ... hold` program until it has allocated (yields its output so far); free on exit."""
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        while not lines or lines[-1] != "ready":
            line = proc.stdout.readline()
            assert line, f"{cmd} ended before it was ready: {lines}"
            lines.append(line.strip())
        yield lines
    finally:
        if proc.poll() is None:
            proc.stdin.write("go\n")
            proc.stdin.close()
        proc.wait(timeout=60)


def allocs(text: str) -> list[dict[str, str]]:
    return [dict(t.split("=", 1) for t in line.split()[2:]) for line in text.splitlines() if line.startswith("alloc ")]


def counters(text: str) -> dict[str, int]:
    """The simulated driver's counters as the spill program prints them (memsliceSimCounters)."""
    [line] = [line for line in text.splitlines() if line.startswith("counters ")]
    return {k: int(v) for k, v in (t.split("=", 1) for t in line.split()[1:])}


@pytest.mark.parametrize("route", ["plain", "pitch", "async"])
def test_spill_maps_host_memory_into_device_addresses_without_pins_or_copies(route, node, cbin, tmp_path, cgroup):
    """Issue 23: spilled memory ran at 1.2 GiB/s on an H100 because every spilled allocation pinned fresh host
    pages (cuMemHostAlloc). A spill of 2 MiB or more is host memory the driver creates for VMM (cuMemCreate with
    a HOST location) mapped at a device address: nothing pinned per allocation, and not one copy of the shim's
    own — the driver copies exactly what the program asked (4 per block: first and last page, there and back)."""
    _, env = spill_env(node, tmp_path, cgroup)
    out = run([cbin["spill"], route, "7", "64"], env)  # 448 MiB against a 256 MiB quota: 3 blocks spill
    assert out.returncode == 0, out.stdout + out.stderr
    assert all(b["data"] == "ok" for b in allocs(out.stdout))
    c = counters(out.stdout)
    assert c["pins"] == 0 and c["pin_bytes"] == 0, c
    assert c["host_creates"] == 3 and c["host_create_bytes"] == 3 * 64 * MiB, c
    assert c["copies"] == 7 * 4 and c["copy_bytes"] == 7 * 4 * 4096, c


def test_small_spills_stay_pinned_and_exact(node, cbin, tmp_path, cgroup):
    """Below the host granularity (2 MiB) a spill is pinned host memory of exactly its size: rounding each to
    2 MiB would charge (and take) twice the host memory of 1 MiB blocks."""
    _, env = spill_env(node, tmp_path, cgroup, quota=4)
    out = run([cbin["spill"], "plain", "7", "1"], env)  # 7 x 1 MiB against a 4 MiB quota: 3 spill
    assert out.returncode == 0, out.stdout + out.stderr
    blocks = allocs(out.stdout)
    assert all(b["data"] == "ok" for b in blocks) and [b["type"] for b in blocks] == ["2"] * 4 + ["1"] * 3, out.stdout
    c = counters(out.stdout)
    assert c["pins"] == 3 and c["pin_bytes"] == 3 * MiB and c["host_creates"] == 0, c
    assert read_region(tmp_path / "c").devices[0].host_peak_bytes == 3 * MiB


@pytest.mark.parametrize("route", ["plain", "pitch", "managed", "async", "vmm", "mixed"])
def test_spill_past_the_quota_keeps_device_bytes_within_it(route, node, cbin, tmp_path, cgroup):
    n, env = spill_env(node, tmp_path, cgroup)
    out = run([cbin["spill"], route, "7", "64"], env)  # 448 MiB against a 256 MiB quota
    assert out.returncode == 0, out.stdout + out.stderr
    blocks = allocs(out.stdout)
    assert [b["rc"] for b in blocks] == ["0"] * 7
    assert all(b["data"] == "ok" for b in blocks)          # every pointer is usable, first and last page
    if route in ("plain", "pitch", "async"):                # spilled ones: host memory at device addresses
        assert [b["type"] for b in blocks] == ["2"] * 7  # CU_MEMORYTYPE_DEVICE
    if route == "managed":
        assert all(b["managed"] == "1" for b in blocks)     # managed stays managed
    assert "info ok=7 free_mib=0 total_mib=256" in out.stdout  # frameworks see the quota, device headroom only
    assert "freed bad=0" in out.stdout
    dev = n.physical()[0]
    assert dev.peak_bytes <= QUOTA * MiB, f"device peak {dev.peak_bytes // MiB} MiB over the quota"
    region = read_region(tmp_path / "c").devices[0]
    assert region.host_peak_bytes == 3 * 64 * MiB and region.peak_bytes == QUOTA * MiB
    assert region.used_bytes == 0 and region.host_bytes == 0     # nothing leaks after free and exit
    assert dev.used_bytes == 0 and dev.host_bytes == 0


def test_spill_cap(node, cbin, tmp_path, cgroup):
    n, env = spill_env(node, tmp_path, cgroup, MEMSLICE_HOST_SPILL_LIMIT="100MiB")
    out = run([cbin["spill"], "plain", "6", "64"], env)
    assert [b["rc"] for b in allocs(out.stdout)] == ["0", "0", "0", "0", "0", "2"]
    assert "MEMSLICE_HOST_SPILL_LIMIT=100.0 MiB" in out.stderr and "64.0 MiB already spilled" in out.stderr
    assert read_region(tmp_path / "c").devices[0].spill_refused == 1
    # the simulated driver's own figures: it created 64 MiB of host memory for the one spill and no more (the
    # refused one never reached it), and its ledger's host high-water mark is that, the device's the quota
    c = counters(out.stdout)
    assert c["host_creates"] == 1 and c["host_create_bytes"] == 64 * MiB and c["pin_bytes"] == 0, c
    dev = n.physical()[0]
    assert dev.host_peak_bytes == 64 * MiB and dev.peak_bytes == QUOTA * MiB, dev


@pytest.mark.parametrize(("files", "margin", "expect"), [
    ({"memory.max": "2147483648", "memory.current": "1879048192"}, None, "2"),   # 1.75 of 2 GiB: margin 256 MiB
    ({"memory.max": "2147483648", "memory.current": "1610612736"}, None, "0"),   # 1.5 of 2 GiB: room left
    ({"memory.max": "2147483648", "memory.current": "1610612736"}, "512MiB", "2"),
    ({"memory.limit_in_bytes": "2147483648", "memory.usage_in_bytes": "1879048192"}, None, "2"),  # cgroup v1
    # hostile values (issue 26.5): not a plain number reads as unknown, which is no limit; never a crash
    ({"memory.max": "garbage", "memory.current": "0"}, None, "0"),
    ({"memory.max": "-1", "memory.current": "0"}, None, "0"),
    ({"memory.max": "2147483648", "memory.current": "-5"}, None, "0"),
    ({"memory.max": "2147483648", "memory.current": "2147483648abc"}, None, "0"),
    ({"memory.max": "99999999999999999999999", "memory.current": "0"}, None, "0"),
    ({"memory.max": "18446744073709551615", "memory.current": "18446744073709551614"}, None, "0"),
    ({"memory.max": "", "memory.current": "0"}, None, "0"),
    ({"memory.max": "\0\0\0", "memory.current": "0"}, None, "0"),
    ({"memory.max": "2147483648", "memory.current": "4294967296"}, None, "2"),  # over its limit already
    ({"memory.max": "max", "memory.current": "4294967296"}, None, "0"),
])
def test_spill_never_eats_the_cgroup_margin(files, margin, expect, node, cbin, tmp_path):
    cg = tmp_path / "cg"
    cg.mkdir()
    for name, value in files.items():
        (cg / name).write_text(value + "\n")
    extra = {"MEMSLICE_CGROUP_MARGIN": margin} if margin else {}
    _, env = spill_env(node, tmp_path, cg, **extra)
    out = run([cbin["spill"], "plain", "5", "64"], env)
    assert allocs(out.stdout)[4]["rc"] == expect
    if expect == "2":
        assert "would leave less than" in out.stderr and "refused to avoid an OOM kill" in out.stderr
        assert str(cg) in out.stderr


@pytest.mark.parametrize(("avail_kib", "expect"), [(300 << 10, "2"), (8 << 20, "0"), (None, "0")])
def test_spill_never_eats_the_hosts_last_memory(avail_kib, expect, node, cbin, tmp_path, cgroup):
    """The host's MemAvailable (a fake meminfo: MEMSLICE_SIM_MEMINFO, honoured under the simulated driver
    only) keeps a slack (1/32 of MemTotal, at least 256 MiB): 300 MiB available refuses a 64 MiB spill by
    name; 8 GiB does not; a meminfo without MemAvailable is unknown, no limit."""
    info = tmp_path / "meminfo"
    info.write_text(f"MemTotal:       {16 << 20} kB\n" +
                    (f"MemAvailable:   {avail_kib} kB\n" if avail_kib is not None else "MemFree: 5 kB\n"))
    _, env = spill_env(node, tmp_path, cgroup, MEMSLICE_SIM_MEMINFO=str(info))
    out = run([cbin["spill"], "plain", "5", "64"], env)
    assert allocs(out.stdout)[4]["rc"] == expect
    if expect == "2":
        assert "would leave less than 512.0 MiB available on the host" in out.stderr, out.stderr
        assert "MemAvailable 300.0 MiB of MemTotal 16.0 GiB" in out.stderr


def test_spilling_tenant_never_squeezes_its_neighbour(node, cbin, tmp_path, cgroup):
    """A 1 GiB GPU shared by two 512 MiB quotas: one spills 1.5 GiB, the other still gets all of its own."""
    n = node(gpus="1GiB", context_overhead="0")
    heavy_env = n.container(tmp_path / "heavy", "512MiB", MEMSLICE_CONTEXT_RESERVE="0", MEMSLICE_OVERSUBSCRIBE="1",
                            MEMSLICE_CGROUP_DIR=str(cgroup))
    with holding([cbin["spill"], "mixed", "24", "64", "hold"], heavy_env) as lines:
        assert all(b["rc"] == "0" for b in allocs("\n".join(lines)))
        light_env = n.container(tmp_path / "light", "512MiB", MEMSLICE_CONTEXT_RESERVE="0")
        out = run([cbin["spill"], "plain", "8", "64"], light_env)
        assert [b["rc"] for b in allocs(out.stdout)] == ["0"] * 8, out.stderr
        assert n.physical()[0].peak_bytes <= 1024 * MiB


def test_kill_9_of_a_spilling_process_reclaims_device_and_host(node, cbin, tmp_path, cgroup):
    n, env = spill_env(node, tmp_path, cgroup)
    victim = subprocess.Popen([cbin["spill"], "plain", "8", "64", "hold"], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    while victim.stdout.readline().strip() != "ready":
        pass
    region = read_region(tmp_path / "c").devices[0]
    assert region.used_bytes == QUOTA * MiB and region.host_bytes == 4 * 64 * MiB
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    out = run([cbin["spill"], "plain", "4", "64"], env)  # a new process has the whole quota again
    assert [b["type"] for b in allocs(out.stdout)] == ["2"] * 4
    region = read_region(tmp_path / "c").devices[0]
    assert region.used_bytes == 0 and region.host_bytes == 0
    dev = n.physical()[0]
    assert dev.used_bytes == 0 and dev.host_bytes == 0


def test_no_spill_during_stream_capture(node, cbin, tmp_path, cgroup):
    _, env = spill_env(node, tmp_path, cgroup)
    out = run([cbin["spill"], "capture", "6", "64"], env)
    assert "capture last_rc=2" in out.stdout
    assert "stream is being captured" in out.stderr


def test_prefetch_cannot_pull_spilled_managed_memory_into_the_gpu(node, cbin, tmp_path, cgroup):
    n, env = spill_env(node, tmp_path, cgroup)
    out = run([cbin["spill"], "managed", "7", "64", "prefetch"], env)
    assert "prefetch bad=0" in out.stdout
    assert n.physical()[0].peak_bytes <= QUOTA * MiB


def test_prefetch_without_the_shim_would_exceed(node, cbin, tmp_path):
    """Control: the simulator does migrate prefetched managed memory, so the test above can fail."""
    n = node(context_overhead="0")
    out = run([cbin["spill"], "managed", "7", "64", "prefetch"], n.env)
    assert "prefetch bad=0" in out.stdout
    assert n.physical()[0].peak_bytes == 7 * 64 * MiB


def test_top_reports_host_bytes_and_spill_ratio(node, cbin, tmp_path, cgroup):
    import json
    import sys

    _, env = spill_env(node, tmp_path, cgroup)
    with holding([cbin["spill"], "plain", "6", "64", "hold"], env):
        top = subprocess.run([sys.executable, "-m", "memslice", "top", "--json", str(tmp_path / "c")],
                             capture_output=True, text=True, timeout=60)
        (proc,) = json.loads(top.stdout)["regions"][0]["processes"]
        assert proc["device_bytes"] == 256 * MiB and proc["host_bytes"] == 128 * MiB
        assert proc["spill_ratio"] == round(128 / 384, 4)


NVML_VIEW = """
import pynvml
pynvml.nvmlInit()
m = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0))
print(m.total >> 20, m.used >> 20, m.free >> 20)
"""


def test_nvml_reports_the_quota_and_device_headroom_only(node, cbin, tmp_path, cgroup):
    import sys

    _, env = spill_env(node, tmp_path, cgroup)
    with holding([cbin["spill"], "plain", "6", "64", "hold"], env):
        out = run([sys.executable, "-c", NVML_VIEW], env)
        assert out.stdout.split() == ["256", "256", "0"]  # 128 MiB on the host are not GPU memory


def test_memslice_run_oversubscribe(cbin, tmp_path, cgroup):
    import os
    import sys

    env = {"PATH": os.environ["PATH"], "MEMSLICE_SIM_STATE": str(tmp_path / "n.state"),
           "MEMSLICE_SIM_CONTEXT_OVERHEAD": "0", "MEMSLICE_CONTEXT_RESERVE": "0", "MEMSLICE_CGROUP_DIR": str(cgroup)}
    cmd = [sys.executable, "-m", "memslice", "run", "--gpu-mem", "256MiB", "--simulate-gpu", "1GiB",
           "--oversubscribe=100MiB", "--", cbin["spill"], "plain", "6", "64"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert [b["rc"] for b in allocs(out.stdout)] == ["0"] * 5 + ["2"]
    assert "host_spill_limit=100.0 MiB in " in out.stderr and "/memslice.limits;" in out.stderr


def test_spill_limit_zero_means_nothing_spills(node, cbin, tmp_path, cgroup):
    """MEMSLICE_HOST_SPILL_LIMIT=0 is a cap of zero (it used to mean "no cap": 256 GiB spilled under a 1 GiB
    quota): with oversubscription on, what does not fit the quota is refused, and not one byte spills."""
    _, env = spill_env(node, tmp_path, cgroup, MEMSLICE_HOST_SPILL_LIMIT="0")
    out = run([cbin["spill"], "plain", "6", "64"], env)  # 4 x 64 MiB fit the 256 MiB quota
    assert [b["rc"] for b in allocs(out.stdout)] == ["0"] * 4 + ["2"] * 2
    assert "nothing may spill" in out.stderr and "MEMSLICE_HOST_SPILL_LIMIT=0.0 MiB" in out.stderr
    assert read_region(tmp_path / "c").devices[0].host_peak_bytes == 0


def test_memslice_run_oversubscribe_zero_is_the_same(cbin, tmp_path, cgroup):
    """`memslice run --oversubscribe=0` is accepted and means what MEMSLICE_HOST_SPILL_LIMIT=0 means."""
    import os
    import sys

    region = tmp_path / "r"
    env = {"PATH": os.environ["PATH"], "MEMSLICE_SIM_STATE": str(tmp_path / "n.state"),
           "MEMSLICE_SIM_CONTEXT_OVERHEAD": "0", "MEMSLICE_CONTEXT_RESERVE": "0", "MEMSLICE_CGROUP_DIR": str(cgroup)}
    cmd = [sys.executable, "-m", "memslice", "run", "--gpu-mem", "256MiB", "--simulate-gpu", "1GiB",
           "--oversubscribe=0", "--region-dir", str(region), "--", cbin["spill"], "plain", "6", "64"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert [b["rc"] for b in allocs(out.stdout)] == ["0"] * 4 + ["2"] * 2, out.stderr
    assert "host_spill_limit=0.0 MiB in " in out.stderr and "nothing may spill" in out.stderr
    assert read_region(region).devices[0].host_peak_bytes == 0


CGROUP_V1 = "/sys/fs/cgroup/memory"


def can_make_memory_cgroup() -> bool:
    import os

    return os.geteuid() == 0 and os.access(CGROUP_V1, os.W_OK) and os.path.exists(f"{CGROUP_V1}/cgroup.procs")


@pytest.fixture
def memory_cgroup(tmp_path) -> Iterator[str]:
    """A real cgroup v1 memory cgroup of 1 GiB (a child of the hierarchy's root), removed afterwards."""
    import os

    d = f"{CGROUP_V1}/memslice-test-{os.getpid()}-{tmp_path.name}"[:200]
    os.mkdir(d)
    try:
        with open(f"{d}/memory.limit_in_bytes", "w") as f:
            f.write(str(1 << 30))
        yield d
    finally:
        os.rmdir(d)  # empty once the test's process has exited


@pytest.mark.skipif(not can_make_memory_cgroup(), reason="needs root and a writable cgroup v1 memory hierarchy")
def test_spill_is_counted_in_the_real_memory_cgroup_and_stops_at_its_margin(node, cbin, tmp_path, memory_cgroup):
    """The spilling process runs in a real memory cgroup (1 GiB; no MEMSLICE_CGROUP_DIR: the shim finds it in
    /proc/self/cgroup) and writes every block it gets. The kernel counts what it holds (memory.usage_in_bytes:
    on this simulated GPU device blocks are host memory too, so both kinds count), and the shim refuses the
    spill that would leave less than the margin (10 %, at least 256 MiB) free, instead of an OOM kill."""
    n = node(context_overhead="0")
    env = n.container(tmp_path / "c", f"{QUOTA}MiB", MEMSLICE_CONTEXT_RESERVE="0", MEMSLICE_OVERSUBSCRIBE="1")
    cmd = ["sh", "-c", f'echo $$ > {memory_cgroup}/cgroup.procs && exec "$@"', "sh", cbin["spill"], "plain", "16",
           "64", "fill"]
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        while not lines or lines[-1] != "ready":
            line = proc.stdout.readline()
            assert line, f"spill ended before it was ready: {lines} {proc.stderr.read() if proc.stderr else ''}"
            lines.append(line.strip())
        with open(f"{memory_cgroup}/memory.usage_in_bytes") as f:
            usage = int(f.read())
        with open(f"{memory_cgroup}/memory.failcnt") as f:
            failcnt = int(f.read())
        region = read_region(tmp_path / "c").devices[0]
        physical = n.physical()[0]  # the simulated driver's own ledger of what it holds
    finally:
        out, err = proc.communicate("go\n", timeout=60)
    rcs = [b["rc"] for b in allocs("\n".join(lines))]
    held = rcs.count("0")
    # the quota's 4 blocks on the device, then spills until the margin: the kernel counts every byte written
    assert rcs == ["0"] * held + ["2"] * (16 - held) and 4 < held < 16, rcs
    assert all(f"fill {i} rc=0" in lines for i in range(held)), lines
    assert usage >= held * 64 * MiB, (usage >> 20, held)
    assert usage + 64 * MiB > (1 << 30) - 256 * MiB, (usage >> 20, held)  # the next spill would eat the margin
    assert failcnt == 0 and proc.returncode == 0, (failcnt, proc.returncode, err)  # never at the limit: no OOM
    assert region.host_bytes == physical.host_bytes == (held - 4) * 64 * MiB, (region, physical)
    assert physical.used_bytes == QUOTA * MiB
    print(f"cgroup: {held} blocks held, usage {usage >> 20} MiB of 1024")
    assert "would leave less than" in err and memory_cgroup in err, err

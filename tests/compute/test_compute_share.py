"""The compute share (issue 33): a request and a limit of GPU time per container, priority, no idle waste.

The real shim in real processes on the simulated GPU, whose `spin` kernel occupies one shared GPU timeline
for as many nanoseconds as its first parameter: shares are asserted on the simulator's own GPU-time figures
per process (with tolerances), never on wall-clock limits. The contract pieces (share validation, the roster
layout the shim reads, provisioning, the limits-file keys) are asserted through src/memslice/compute.py and
the shim's own refusals."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import C_DIR, PRELOAD_FIRST, preload, run
from sim_compute import timeline

from memslice import compute
from memslice.limits import Limits, render


# ---- the share and its files (src/memslice/compute.py) ----------------------------------------------------
@pytest.mark.parametrize(("text", "share"), [("30", (30, None)), ("20:40", (20, 40)), ("0", (0, None)),
                                             ("0:40", (0, 40)), ("100:100", (100, 100)), (" 30% ", (30, None))])
def test_share_parses(text, share):
    assert compute.parse_share(text) == compute.Share(*share)


@pytest.mark.parametrize(("text", "message"), [
    ("120", "--gpu-compute 120: a share is a percent of one GPU, 0 to 100"),
    ("50:40", "the limit 40 is below the request 50; the limit must be at least the request"),
    ("30:0", "the limit is a percent of one GPU, 1 to 100"),
    ("30:101", "the limit is a percent of one GPU, 1 to 100"),
    ("-5", "is not a whole percent"),
    ("thirty", "is not a whole percent; write REQUEST[:LIMIT]"),
    ("", "is not a whole percent"),
])
def test_bad_share_is_refused_by_name(text, message):
    with pytest.raises(compute.ComputeShareError) as e:
        compute.parse_share(text)
    assert message in str(e.value)


def test_roster_round_trip_and_layout():
    entries = [compute.RosterEntry(0, 70, None, 1000), compute.RosterEntry(5, 30, 40, -3)]
    raw = compute.render_roster(entries)
    assert len(raw) == compute.ROSTER_SIZE == 8 + 64 * 16
    assert compute.parse_roster(raw) == {0: entries[0], 5: entries[1]}
    # the C layout (interposer/src/compute.h: struct cs_roster_ent {flags, priority, request, limit})
    assert struct.unpack_from("<IiII", raw, 8 + 5 * 16) == (compute.R_ASSIGNED, -3, 30, 40)
    assert compute.parse_roster(raw[:-1]) is None and compute.parse_roster(b"x" * len(raw)) is None
    forged = bytearray(raw)
    struct.pack_into("<IiII", forged, 8 + 7 * 16, 1, 0, 150, 0)  # a request over 100: not an assignment
    assert 7 not in (compute.parse_roster(bytes(forged)) or {})


def test_record_layout_matches_the_shim():
    rec = struct.pack("<IHHiBBHiIQQQQQ", compute.RECORD_MAGIC, 1, compute.F_DEMAND, 42, 30, 40, 0, 7, 412, 5, 6, 7,
                      8, 9)
    r = compute.parse_record(rec)
    assert r is not None and (r.pid, r.request, r.limit, r.priority, r.share_pct) == (42, 30, 40, 7, 41.2)
    assert (r.stamp_ns, r.used_ns, r.throttled_ns, r.waited_ns, r.launches) == (5, 6, 7, 8, 9)
    assert compute.parse_record(rec[:-1]) is None


def test_provision_assigns_slots_and_refuses_requests_over_100(tmp_path):
    d, gpu = tmp_path / "compute", "GPU-0000aaaa-0000-4000-8000-000000000001"
    a = compute.provision(d, gpu, compute.Share(70), priority=10)
    b = compute.provision(d, gpu, compute.Share(30, 40))
    assert (a.slot, b.slot) == (0, 1)
    assert a.slot_file.stat().st_size == compute.SLOT_FILE_SIZE and oct(a.slot_file.stat().st_mode & 0o777) == "0o666"
    assert oct((a.gpu_dir / "roster").stat().st_mode & 0o777) == "0o444"
    assert compute.read_roster(d, gpu) == {0: compute.RosterEntry(0, 70, None, 10), 1: compute.RosterEntry(1, 30, 40)}
    with pytest.raises(compute.ComputeShareError, match="does not fit on .*100% of it is already requested"):
        compute.provision(d, gpu, compute.Share(1))
    best_effort = compute.provision(d, gpu, compute.Share(0))  # best effort always fits
    assert best_effort.slot == 2
    with pytest.raises(compute.ComputeShareError, match="slot 1 .* already assigned"):
        compute.provision(d, gpu, compute.Share(0), slot=1)
    compute.release(d, gpu, 0)
    assert sorted(compute.read_roster(d, gpu) or {}) == [1, 2] and not a.slot_file.exists()
    assert compute.provision(d, gpu, compute.Share(60)).slot == 0
    with pytest.raises(compute.ComputeShareError, match="not a plain name"):
        compute.provision(d, "../etc", compute.Share(10))


def test_limits_file_keys_render():
    text = render(Limits(gpu_mem_bytes=1 << 30, gpu_compute_request=20, gpu_compute_limit=40,
                         compute_dir="/run/memslice/compute", compute_slot=3, priority=100))
    assert {"gpu_compute_request=20", "gpu_compute_limit=40", "compute_dir=/run/memslice/compute", "compute_slot=3",
            "priority=100"} <= set(text.split())
    with pytest.raises(compute.ComputeShareError, match="below the request"):
        render(Limits(gpu_mem_bytes=1 << 30, gpu_compute_request=50, gpu_compute_limit=40))
    with pytest.raises(ValueError, match="compute_slot=64"):
        render(Limits(gpu_mem_bytes=1 << 30, compute_slot=64))


# ---- the shim refuses bad values (fail closed, naming them) --------------------------------------------------
BAD_FILE = [
    ("gpu_compute_request=120", "gpu_compute_request='120': a share is a percent of one GPU, 0 to 100"),
    ("gpu_compute_limit=0", "gpu_compute_limit='0': a share is a percent of one GPU, 1 to 100"),
    ("gpu_compute_request=30%", "gpu_compute_request='30%'"),
    ("gpu_compute_request=50\ngpu_compute_limit=40", "gpu_compute_limit=40 is below gpu_compute_request=50"),
    ("compute_slot=64", "compute_slot='64' is not an integer from 0 to 63"),
    ("compute_dir=relative/dir", "compute_dir='relative/dir' is not an absolute directory path"),
    ("gpu_compute_request=10\ngpu_compute_request=20", "gpu_compute_request appears twice"),
]


@pytest.mark.parametrize(("lines", "message"), BAD_FILE, ids=[b[0].split("\n")[-1] for b in BAD_FILE])
def test_bad_limits_file_values_fail_closed(lines, message, node, cbin, tmp_path):
    n = node()
    region = tmp_path / "c"
    env = n.container(region, None)
    (region / "memslice.limits").write_text(f"gpu_mem_limit=1GiB\n{lines}\n")
    out = run([cbin["alloc_direct"], "10"], env)
    assert out.stdout.startswith("init 800"), out.stdout  # CUDA_ERROR_NOT_PERMITTED: nothing runs unshared
    assert message in out.stderr, out.stderr
    assert "Every CUDA call fails until this is fixed." in out.stderr


@pytest.mark.parametrize(("var", "value", "message"), [
    ("MEMSLICE_GPU_COMPUTE_REQUEST", "101", "MEMSLICE_GPU_COMPUTE_REQUEST='101': a share is a percent of one GPU"),
    ("MEMSLICE_GPU_COMPUTE_LIMIT", "half", "MEMSLICE_GPU_COMPUTE_LIMIT='half'"),
    ("MEMSLICE_COMPUTE_SLOT", "-1", "MEMSLICE_COMPUTE_SLOT='-1' is not an integer from 0 to 63"),
])
def test_bad_compute_environment_fails_closed(var, value, message, node, cbin, tmp_path):
    n = node()
    env = n.container(tmp_path / "c", "1GiB", **{var: value})
    out = run([cbin["alloc_direct"], "10"], env)
    assert out.stdout.startswith("init 800"), out.stdout
    assert message in out.stderr, out.stderr


@pytest.mark.skipif(bool(PRELOAD_FIRST), reason="memslice run puts the shim before the sanitizer runtime")
def test_memslice_run_writes_the_share_and_refuses_bad_ones(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSLICE_")}
    env["MEMSLICE_COMPUTE_DIR"] = str(tmp_path / "compute")
    region = tmp_path / "r"
    out = subprocess.run([sys.executable, "-m", "memslice.cli", "run", "--gpu-mem", "1GiB", "--gpu-compute", "20:40",
                          "--region-dir", str(region), "--", "cat", str(region / "memslice.limits")],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert {"gpu_compute_request=20", "gpu_compute_limit=40", f"compute_dir={tmp_path / 'compute'}"} <= set(
        out.stdout.split())
    assert oct((tmp_path / "compute").stat().st_mode & 0o777) == "0o700"
    for bad, message in (("120", "--gpu-compute 120: a share is a percent of one GPU, 0 to 100"),
                         ("50:20", "--gpu-compute 50:20: the limit 20 is below the request 50")):
        out = subprocess.run([sys.executable, "-m", "memslice.cli", "run", "--gpu-mem", "1GiB", "--gpu-compute", bad,
                              "--", "true"], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and message in out.stderr, out.stderr
    helptext = subprocess.run([sys.executable, "-m", "memslice.cli", "run", "--help"], env=env, capture_output=True,
                              text=True, timeout=60).stdout
    assert "--gpu-compute REQUEST[:LIMIT]" in helptext and "--gpu-compute 20:40" in helptext


def test_read_gpu_bounds_claims_by_the_roster(tmp_path):
    d, gpu = tmp_path / "compute", "GPU-0000aaaa-0000-4000-8000-000000000002"
    p = compute.provision(d, gpu, compute.Share(10, 20))
    now = 10**12
    rec = struct.pack("<IHHiBBHiIQQQQQ", compute.RECORD_MAGIC, 1, compute.F_DEMAND, 1, 100, 100, 0, 99999, 1000,
                      now, 5 * 10**9, 0, 0, 10)
    os.chmod(p.slot_file, 0o644)
    with open(p.slot_file, "r+b") as f:
        f.write(rec)
    (fig,) = compute.read_gpu(d, gpu, now_ns=now)
    assert (fig.request, fig.limit, fig.priority, fig.share_pct) == (10, 20, 0, 20.0)  # the roster's, not the claims
    assert fig.processes == 1 and fig.used_s == 5.0 and fig.rostered
    assert compute.read_gpu(d, gpu, now_ns=now + compute.FRESH_NS + 1)[0].processes == 0  # stale: not live


# ---- shares on the simulated GPU: the real shim in real processes -------------------------------------------
KERNEL_US = 1000          # one saturating kernel: 1 ms of GPU time
MARK_S, MARK2_S = 1.5, 5.0  # a tenant's share is its GPU time between the marks
RUN_S = MARK2_S + 2.5       # the reading at the second mark (a probe process) ends while every tenant still runs


@pytest.fixture(scope="module")
def spin(tmp_path_factory, libs):
    """tests/c/spin.c, linked against the simulated driver."""
    exe = tmp_path_factory.mktemp("spin") / "spin"
    subprocess.run(["cc", "-O2", "-Wall", "-Werror", f"-I{libs.include}", str(C_DIR / "spin.c"),
                    "-o", str(exe), "-L", libs.sim_dir, "-l:libcuda.so.1"], check=True)
    return str(exe)


class Tenants:
    """Tenants on one simulated GPU, each with its own share, sharing one compute directory. Their shares are
    the simulator's own figures (memsliceSimTimeline: GPU ns each process's context got on the GPU's one
    timeline), read when the first tenant passes MARK_S and again at MARK2_S, while all of them still run."""

    def __init__(self, node, spin, tmp_path, compute_dir=None):
        self.node, self.spin = node, spin
        self.dir = compute_dir or tmp_path / "compute"
        self.dir.mkdir(exist_ok=True, mode=0o700)
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, *args: str, shim: bool = True, **share: str) -> subprocess.Popen[str]:
        env = dict(self.node.env)
        if shim:
            env.update(LD_PRELOAD=preload(self.node.libs.shim), MEMSLICE_COMPUTE_DIR=str(self.dir), **share)
        env.update(SPIN_MARK_S=str(MARK_S), SPIN_MARK2_S=str(MARK2_S))
        p = subprocess.Popen([self.spin, *(args or (str(RUN_S), str(KERNEL_US)))], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.procs.append(p)
        return p

    def _line(self, key: str) -> str:
        """The first tenant's stdout up to its `key=` line (bounded: the tenant ends within RUN_S)."""
        p = self.procs[0]
        assert p.stdout
        seen = ""
        for line in p.stdout:
            seen += line
            if line.startswith(key + "="):
                return seen
        raise AssertionError(f"the tenant ended before printing {key}: {seen!r} {p.stderr.read() if p.stderr else ''}")

    def results(self, timeout: float = 120) -> list[tuple[float, str]]:
        """(share %, stderr) of each tenant in start order, from the simulator's figures between the marks."""
        head = self._line("mark_launches")
        t1 = timeline(self.node.env)
        head += self._line("mark2_launches")
        t2 = timeline(self.node.env)
        busy = [{c["pid"]: c["busy"] for c in t["clients"]} for t in (t1, t2)]
        out = []
        for i, p in enumerate(self.procs):
            stdout, stderr = p.communicate(timeout=timeout)
            assert p.returncode == 0, stderr
            if i == 0:
                stdout = head + stdout
            assert "launches=" in stdout, stdout
            assert p.pid in busy[0] and p.pid in busy[1], f"tenant {p.pid} was not running at both readings: {busy}"
            share = (busy[1][p.pid] - busy[0][p.pid]) / (t2["now"] - t1["now"])
            out.append((100 * share, stderr))
        return out


def shares(node, spin, tmp_path, *envs: dict[str, str]) -> list[float]:
    t = Tenants(node(), spin, tmp_path)
    for e in envs:
        t.start(**e)
    return [s for s, _ in t.results()]


@pytest.mark.parametrize(("a", "b"), [(70, 30), (50, 50)])
def test_requests_hold_under_contention(a, b, node, spin, tmp_path):
    got = shares(node, spin, tmp_path, {"MEMSLICE_GPU_COMPUTE_REQUEST": str(a)},
                 {"MEMSLICE_GPU_COMPUTE_REQUEST": str(b)})
    assert abs(got[0] - a) <= 8 and abs(got[1] - b) <= 8, got
    assert sum(got) >= 90, got  # and the GPU is not left idle


def test_without_shares_the_gpu_is_split_evenly(node, spin, tmp_path):
    """Control for the test above: the same two tenants without the shim split the GPU evenly (the simulator
    time-slices), so a 70/30 split is the shim's doing."""
    t = Tenants(node(), spin, tmp_path)
    t.start(shim=False)
    t.start(shim=False)
    got = [s for s, _ in t.results()]
    assert abs(got[0] - got[1]) <= 10, got


def test_a_limit_holds_on_an_idle_gpu(node, spin, tmp_path):
    (got,) = shares(node, spin, tmp_path, {"MEMSLICE_GPU_COMPUTE_LIMIT": "40"})
    assert 30 <= got <= 45, got


def test_work_conserving_a_tenant_alone_gets_far_more_than_its_request(node, spin, tmp_path):
    (got,) = shares(node, spin, tmp_path, {"MEMSLICE_GPU_COMPUTE_REQUEST": "30"})
    assert got >= 85, got


def test_priority_orders_who_waits(node, spin, tmp_path):
    """Two best-effort tenants: the one whose pod has the higher priority gets the GPU; the other still ends
    (its waits are bounded: results() asserts both exit 0)."""
    got = shares(node, spin, tmp_path, {"MEMSLICE_GPU_COMPUTE_REQUEST": "0", "MEMSLICE_PRIORITY": "1000"},
                 {"MEMSLICE_GPU_COMPUTE_REQUEST": "0", "MEMSLICE_PRIORITY": "0"})
    assert got[0] >= 75 and got[0] >= got[1] + 50, got


def test_a_request_is_kept_under_a_higher_priority(node, spin, tmp_path):
    """Priority takes only what is above a tenant's request: the low-priority tenant keeps its 40."""
    got = shares(node, spin, tmp_path, {"MEMSLICE_GPU_COMPUTE_REQUEST": "0", "MEMSLICE_PRIORITY": "1000"},
                 {"MEMSLICE_GPU_COMPUTE_REQUEST": "40", "MEMSLICE_PRIORITY": "0"})
    assert got[1] >= 32, got


def test_a_missing_board_degrades_to_the_own_limit(node, spin, tmp_path):
    t = Tenants(node(), spin, tmp_path)
    t.dir = tmp_path / "no" / "such" / "dir"
    t.start(MEMSLICE_GPU_COMPUTE_LIMIT="40")
    ((got, stderr),) = t.results()
    assert "compute share unarbitrated" in stderr and "cannot create" in stderr, stderr
    assert got <= 45, got


def _gpu_dir(compute_dir: Path, timeout: float = 30) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dirs = [d for d in compute_dir.iterdir() if d.is_dir()]
        if dirs:
            return dirs[0]
        time.sleep(0.05)
    raise AssertionError(f"no GPU directory appeared in {compute_dir}")


def _forge(gpu_dir: Path, stop: threading.Event) -> None:
    """A hostile neighbour without a roster: slot files claiming the highest priority, demand, work on the GPU
    and a share of 0, restamped every 10 ms; plus a FIFO, a link and garbage where slot files go."""
    os.mkfifo(gpu_dir / "slot-05")
    (gpu_dir / "slot-06").symlink_to("/dev/zero")
    (gpu_dir / "slot-07").write_bytes(os.urandom(compute.SLOT_FILE_SIZE))
    liar = gpu_dir / "slot-09"
    while not stop.is_set():
        rec = struct.pack("<IHHiBBHiIQQQQQ", compute.RECORD_MAGIC, 1, compute.F_DEMAND | compute.F_INFLIGHT, 1, 100,
                          100, 0, 2**31 - 1, 0, time.monotonic_ns(), 0, 0, 0, 0)
        liar.write_bytes(rec * compute.PROCS)
        stop.wait(0.01)


def test_a_forged_board_slows_a_tenant_but_never_below_its_request_nor_forever(node, spin, tmp_path):
    n = node()
    t = Tenants(n, spin, tmp_path)
    probe = t.start("0.2", "10")  # creates this GPU's directory
    probe.wait(timeout=60)
    t.procs.clear()
    stop = threading.Event()
    forger = threading.Thread(target=_forge, args=(_gpu_dir(t.dir), stop), daemon=True)
    forger.start()
    try:
        t.start(MEMSLICE_GPU_COMPUTE_REQUEST="30")
        ((got, stderr),) = t.results()
    finally:
        stop.set()
        forger.join(timeout=10)
    assert got >= 25, (got, stderr)  # its request, measured with the liar's in-flight claim halving its spans


def test_a_roster_bounds_what_a_neighbour_claims(node, spin, tmp_path):
    """The node agent's path: slots provisioned with a roster. A neighbour's slot file claiming the highest
    priority does not hold back a tenant: its priority is the roster's (0)."""
    n = node()
    t = Tenants(n, spin, tmp_path)
    probe = t.start("0.2", "10")
    probe.wait(timeout=60)
    t.procs.clear()
    gpu = _gpu_dir(t.dir)
    for f in gpu.iterdir():
        f.unlink()
    mine = compute.provision(t.dir, gpu.name, compute.Share(30), priority=0)
    liar = compute.provision(t.dir, gpu.name, compute.Share(0), priority=0)
    stop = threading.Event()

    def lie() -> None:
        while not stop.is_set():
            rec = struct.pack("<IHHiBBHiIQQQQQ", compute.RECORD_MAGIC, 1, compute.F_DEMAND, 1, 100, 100, 0,
                              2**31 - 1, 1000, time.monotonic_ns(), 0, 0, 0, 0)
            with open(liar.slot_file, "r+b") as fh:
                fh.write(rec)
            stop.wait(0.01)

    th = threading.Thread(target=lie, daemon=True)
    th.start()
    try:
        t.start(MEMSLICE_GPU_COMPUTE_REQUEST="30", MEMSLICE_COMPUTE_SLOT=str(mine.slot))
        ((got, stderr),) = t.results()
    finally:
        stop.set()
        th.join(timeout=10)
    assert got >= 80, (got, stderr)
    figures = {s.slot: s for s in compute.read_gpu(t.dir, gpu.name, now_ns=-1)}
    assert figures[liar.slot].priority == 0 and figures[liar.slot].share_pct <= 100
    assert figures[mine.slot].used_s > 0  # the tenant published its GPU time in its own slot file

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

import pytest
from conftest import run

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

"""A region read under churn never shows more than the quota (issue 25 item 9). The reader copies the slots
while processes charge and uncharge; a process between the two steps of an operation (its charge already in
the shared total, not yet in its slot, or the reverse) made the sum of the slots disagree with the total:
4,108-4,245 MiB of a 4,096 MiB quota in one of ~8,500 samples. Now a copy counts only when it is settled
(two copies agree, no live slot inside an operation), and an unsettled one is capped by the shared total.

Two ways: the exact state a torn read caught, written into a region whose slots are held by live processes
(deterministic); and real processes under the shim allocating and freeing at random on the simulated GPU
while the reader samples (the way the agent's scrape and `memslice top` read)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from memslice.interposer.region import REGION_FILE, layout, read_region

MiB = 1 << 20
HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, int(sys.argv[2]), 0)
print("held", flush=True)
sys.stdin.read()
"""


def region(used: int, slots: list[tuple[int, int]], limit: int) -> bytes:
    """A region of one device: the shared total `used`, and live slots of (bytes, op_active)."""
    lo = layout()
    ffi = lo.ffi
    buf = bytearray(lo.region_size)
    h = ffi.from_buffer("struct ms_header *", buf)
    h.magic, h.version, h.ndevices, h.slot_hwm = lo.magic, lo.version, 1, len(slots)
    h.header_size, h.device_size, h.slot_size = lo.header_size, lo.device_size, lo.slot_size
    h.max_devices, h.max_slots = lo.max_devices, lo.max_slots
    dev = ffi.from_buffer("struct ms_device[]", memoryview(buf)[lo.devices_offset:lo.slots_offset])[0]
    ffi.memmove(dev.uuid, b"GPU-torn", 8)
    dev.used, dev.limit, dev.physical_total = used, limit, 16 << 30
    s = ffi.from_buffer("struct ms_slot[]", memoryview(buf)[lo.slots_offset:])
    for i, (nbytes, op) in enumerate(slots):
        s[i].state, s[i].device_bytes[0], s[i].op_active = lo.slot_live, nbytes, op
    return bytes(buf)


@pytest.fixture
def held(tmp_path: Path) -> Iterator[tuple[Path, list[subprocess.Popen[str]]]]:
    """A region directory whose slots 0 and 1 are held by two live processes (their fcntl lock bytes)."""
    path = tmp_path / REGION_FILE
    path.write_bytes(region(0, [], 1))
    procs = [subprocess.Popen([sys.executable, "-c", HOLDER, str(path), str(layout().lock_base + i)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for i in range(2)]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "held"
    yield tmp_path, procs
    for p in procs:
        p.kill()
        p.wait(30)


def rewrite(path: Path, data: bytes) -> None:
    """Overwrite in place (the holders' locks are on this inode)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, 0)
    finally:
        os.close(fd)


def test_a_process_inside_an_uncharge_does_not_show_more_than_the_quota(held) -> None:
    """Process A has taken 600 MiB off the total and not yet off its slot (op_active 1); B then charged
    600 MiB. The slots sum to 1,200 MiB of a 1,024 MiB quota; what is held is 600."""
    d, _ = held
    rewrite(d / REGION_FILE, region(600 * MiB, [(600 * MiB, 1), (600 * MiB, 0)], 1024 * MiB))
    dev = read_region(d).devices[0]
    assert dev.used_bytes <= dev.limit_bytes == 1024 * MiB
    assert dev.used_bytes == 600 * MiB  # capped by the shared total
    assert dev.peak_bytes <= 1024 * MiB


def test_a_settled_region_reads_the_live_slots(held) -> None:
    d, procs = held
    rewrite(d / REGION_FILE, region(900 * MiB, [(300 * MiB, 0), (600 * MiB, 0)], 1024 * MiB))
    assert read_region(d).devices[0].used_bytes == 900 * MiB
    procs[0].kill()  # a dead process stops counting at once, before its charge is reclaimed
    procs[0].wait(30)
    snap = read_region(d).devices[0]
    assert snap.used_bytes == 600 * MiB and snap.charged_bytes == 900 * MiB


def test_no_sample_under_churn_shows_more_than_the_quota(node, cbin, tmp_path) -> None:
    """8 processes × 4 threads allocate and free at random (up to 96 MiB each) in a 1,024 MiB quota, for
    4 s, while this process samples the region as fast as it can."""
    quota, reserve = 1024 * MiB, 32
    n = node(context_overhead=f"{reserve}MiB")
    where = tmp_path / "c"
    env = n.container(where, "1024MiB", MEMSLICE_CONTEXT_RESERVE=f"{reserve}MiB")
    procs = [subprocess.Popen([cbin["stress"], "4", "4", "96", str(i)], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for i in range(8)]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        samples, over, busy = 0, [], 0
        while any(p.poll() is None for p in procs) and samples < 200_000:
            snap = read_region(where, with_processes=False)
            if snap is None or not snap.devices:
                continue
            used = snap.devices[0].used_bytes
            samples += 1
            busy += used > quota // 2
            if used > quota:
                over.append(used // MiB)
        results = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait(30)
    for text in results:
        assert "corrupt=0" in text and "other=0" in text, text
    assert sum(int(t.split("refused=")[1].split()[0]) for t in results) > 0  # the quota was contended
    assert samples > 200 and busy > samples // 4, (samples, busy)  # sampled while it was full
    assert not over, f"{len(over)} of {samples} samples over the quota (MiB): {over[:10]}"

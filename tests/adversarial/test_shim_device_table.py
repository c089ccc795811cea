"""A process of the container that holds the region's device-table lock (a stopped process, or one that
takes the fcntl byte itself: the file is the container's) must not let a new process allocate uncharged.
Before, a GPU that could not be entered into the region within the lock's bound was simply not accounted
for: every allocation on it went to the driver with no quota at all."""

from __future__ import annotations

import fcntl
import os
import struct

from conftest import run

from memslice.interposer.region import read_region

MS_DEVICE_LOCK_BYTE = (1 << 30) - 2  # interposer/include/memslice_region.h


def hold_device_lock(region_file) -> int:
    """Take the device-table byte lock as a hostile process of the container would; returns the fd."""
    fd = os.open(region_file, os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.fcntl(fd, fcntl.F_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, MS_DEVICE_LOCK_BYTE, 1, 0))
    return fd


def test_gpu_that_cannot_be_entered_is_refused_not_uncharged(node, cbin, tmp_path):
    n = node()
    region = tmp_path / "c"
    env = n.container(region, "1GiB", MEMSLICE_CONTEXT_RESERVE="0")
    fd = hold_device_lock(region / "memslice.region")  # before any process has entered the GPU
    try:
        out = run([cbin["alloc_direct"], "100"], env)
        assert "alloc 100 MiB -> 2" in out.stdout, out.stdout + out.stderr  # CUDA_ERROR_OUT_OF_MEMORY
        assert "its device table was locked" in out.stderr
        assert "devtotal=1024" in out.stdout and "info free=0 total=1024" in out.stdout, out.stdout  # the quota
    finally:
        os.close(fd)  # closing any descriptor of the file drops this process's locks
    out = run([cbin["alloc_direct"], "100"], env)
    assert "alloc 100 MiB -> 0" in out.stdout, out.stdout + out.stderr  # the lock is gone: charged as usual
    snap = read_region(region)
    assert snap is not None and snap.devices[0].limit_bytes == 1 << 30

"""Reading a shared accounting region from Python (cffi, ABI mode).

The layout comes from the same header the C code uses (include/memslice_region.h, the part between
BEGIN CFFI and END CFFI), so Python and C cannot drift apart. Reading is a plain mmap of the file; what
needs the C protocol (is a slot's owner alive, reclaiming dead processes) goes through the small
libmemslice-region.so.
"""

from __future__ import annotations

import mmap
import os
import pathlib
import re
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import cffi

from memslice import errors

REGION_FILE = "memslice.region"
_HEADER = pathlib.Path(__file__).resolve().parent / "include" / "memslice_region.h"


@dataclass(frozen=True)
class DeviceUsage:
    uuid: str
    physical_bytes: int
    limit_bytes: int
    used_bytes: int
    host_bytes: int
    peak_bytes: int
    refused: int
    spill_refused: int
    host_peak_bytes: int = 0


@dataclass(frozen=True)
class ProcessUsage:
    pid: int
    comm: str
    alive: bool
    device_bytes: int
    host_bytes: int
    peak_bytes: int
    refused: int
    per_device: dict[str, tuple[int, int]] = field(default_factory=dict)  # uuid -> (device, host)


@dataclass(frozen=True)
class RegionSnapshot:
    path: str
    devices: list[DeviceUsage]
    processes: list[ProcessUsage]
    recounts: int
    reclaimed: int


class RegionError(errors.UnavailableError):
    pass


@cache
def _ffi() -> cffi.FFI:
    text = _HEADER.read_text()
    m = re.search(r"/\* BEGIN CFFI \*/(.*)/\* END CFFI \*/", text, re.S)
    if not m:
        raise RegionError(f"{_HEADER}: no BEGIN CFFI/END CFFI section")
    ffi = cffi.FFI()
    ffi.cdef(m.group(1))
    ffi.cdef("""
        int memslice_region_sweep(const char *path, char *err, size_t errlen);
        int memslice_region_liveness(const char *path, unsigned char *alive, int n, char *err, size_t errlen);
    """)
    return ffi


@cache
def _lib() -> Any:  # cffi library: its functions and constants are only known at run time
    from memslice.paths import lib_dir

    return _ffi().dlopen(str(lib_dir() / "libmemslice-region.so"))


FROZEN = 1 << 63


def _text(chars: Any, on_error: str = "strict") -> str:
    """A NUL-terminated C char array as text."""
    raw = _ffi().string(chars)
    return raw.decode(errors=on_error) if isinstance(raw, bytes) else str(raw)


def region_path(region_dir: str | os.PathLike[str]) -> str:
    return os.path.join(os.fspath(region_dir), REGION_FILE)


def _liveness(path: str, n: int) -> list[bool]:
    ffi = _ffi()
    alive = ffi.new("unsigned char[]", n)
    err = ffi.new("char[]", 512)
    if _lib().memslice_region_liveness(path.encode(), alive, n, err, 512) < 0:
        raise RegionError(_text(err))
    return [bool(a) for a in alive]


def read_region(region_dir: str | os.PathLike[str]) -> RegionSnapshot | None:
    """Snapshot of the region in `region_dir`, or None if no process has created it yet."""
    return read_region_file(region_path(region_dir))


def read_region_file(path: str) -> RegionSnapshot | None:
    if not os.path.exists(path):
        return None
    ffi = _ffi()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < ffi.sizeof("struct ms_region"):
            raise RegionError(f"{path} is not a memslice region ({size} bytes)")
        mm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    lib = _lib()
    buf = ffi.from_buffer(mm)
    try:
        r: Any = ffi.cast("struct ms_region *", buf)  # fields from the header, unknown to mypy
        if r.hdr.magic != lib.MS_MAGIC:
            return None  # being created
        nd = r.hdr.ndevices
        devices = []
        uuids = []
        for d in range(nd):
            dv = r.dev[d]
            uuid = _text(dv.uuid)
            uuids.append(uuid)
            devices.append(DeviceUsage(uuid=uuid, physical_bytes=dv.physical_total, limit_bytes=dv.limit,
                                       used_bytes=dv.used & ~FROZEN, host_bytes=dv.host_used & ~FROZEN,
                                       peak_bytes=dv.peak, refused=dv.refused, spill_refused=dv.spill_refused,
                                       host_peak_bytes=dv.host_peak))
        live_state = lib.MS_SLOT_LIVE
        candidates = [i for i in range(r.hdr.max_slots) if r.slot[i].state == live_state]
        alive = _liveness(path, (max(candidates) + 1) if candidates else 0) if candidates else []
        procs = []
        for i in candidates:
            s = r.slot[i]
            per = {uuids[d]: (int(s.device_bytes[d]), int(s.host_bytes[d])) for d in range(nd)}
            procs.append(ProcessUsage(pid=s.pid, comm=_text(s.comm, "replace"),
                                      alive=alive[i], device_bytes=sum(v[0] for v in per.values()),
                                      host_bytes=sum(v[1] for v in per.values()), peak_bytes=s.peak,
                                      refused=s.refused, per_device=per))
        return RegionSnapshot(path=path, devices=devices, processes=procs, recounts=r.hdr.recounts,
                              reclaimed=r.hdr.reclaimed)
    finally:
        ffi.release(buf)
        mm.close()


def sweep(region_dir: str | os.PathLike[str]) -> int:
    """Reclaim the usage of dead processes in the region; returns how many were reclaimed."""
    path = region_path(region_dir)
    if not os.path.exists(path):
        return 0
    ffi = _ffi()
    err = ffi.new("char[]", 512)
    n = _lib().memslice_region_sweep(path.encode(), err, 512)
    if n < 0:
        raise RegionError(_text(err))
    return int(n)


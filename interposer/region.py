"""Reading a shared accounting region from Python (cffi, ABI mode), defensively.

The layout comes from the same header the C code uses (include/memslice_region.h, the part between
BEGIN CFFI and END CFFI), so Python and C cannot drift apart.

The region file lives in a directory the container mounts read-write: every byte of it, its size and even
its type are the tenant's to choose. The node agent and `memslice top` read it for other people, so the
reader must not be crashable or stallable by it:

- open with O_RDONLY|O_NOFOLLOW|O_NONBLOCK|O_CLOEXEC (a symlink is refused, a FIFO does not block), then
  fstat on the descriptor: only a regular file of exactly the size the header announces is read;
- no mmap (a file truncated under a mapping raises SIGBUS in the reader): two bounded preads copy the
  header + device table, then the slots in use, into private buffers, and cffi parses those copies;
- every field is checked (magic, version, record sizes, maxima, counts, NUL-terminated UUIDs) and any
  inconsistency is one RegionError naming the file and the field, never an exception from deep inside;
- whether a slot's owner is alive is an fcntl F_GETLK query on the read-only descriptor (a lock held by
  the owner on byte MS_LOCK_BASE + slot): nothing is written, no lock is taken.

Caveat: the slot locks are classic POSIX record locks, which a process loses on *any* close of the file. A
process that itself holds a slot in a region (it used CUDA under the shim) must therefore not read that
region with this module; the agent and `memslice top` never use CUDA.

"Used" is what the live processes hold: the sum of the live slots' charges. A process killed with SIGKILL
stops counting at once, even before the shim of a later allocation reclaims its charge from the shared
totals (those totals, dead charges included, are kept as `charged_bytes`).

Consistency: the slots change while they are copied, and a process between the two steps
of a charge or an uncharge (the total moved, its slot not yet: op_active > 0) makes the slots' sum disagree
with the total; a sum taken then showed more than the quota (4,108 MiB of 4,096 in one of ~8,500 samples
under churn). So the slots are copied twice, and a copy counts only when both agree and no live slot is
inside an operation; at most READ_TRIES times. When no copy settles (a process stopped mid-operation, or
endless churn), each device's live figure is capped by its shared total (`charged_bytes`, which the shim
never lets past the quota and which includes every live charge once the operations settle).
"""

from __future__ import annotations

import errno
import fcntl
import os
import pathlib
import re
import stat
import struct
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import cffi

from memslice import errors

REGION_FILE = "memslice.region"
_HEADER = pathlib.Path(__file__).resolve().parent / "include" / "memslice_region.h"
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_UUID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*\Z")
# The simulator keeps its node state after the region proper (hdr.extra_size); nothing else may be large.
MAX_EXTRA_BYTES = 64 << 20
READ_TRIES = 8  # copies of the slots tried before the capped figures are used (see the module docstring)
# struct flock on 64-bit Linux: short l_type, short l_whence, off_t l_start, off_t l_len, pid_t l_pid.
_FLOCK = struct.Struct("hhqqi4x")


@dataclass(frozen=True)
class DeviceUsage:
    uuid: str
    physical_bytes: int
    limit_bytes: int
    used_bytes: int        # held by live processes (sum of their slots)
    host_bytes: int        # spilled to host memory by live processes
    peak_bytes: int
    refused: int
    spill_refused: int
    host_peak_bytes: int = 0
    charged_bytes: int = 0  # the shared total, dead processes' unreclaimed charges included
    context_cost_bytes: int = 0  # what the last context created on the GPU took, as the shim measured it
    driver_taken_bytes: int = 0  # of charged_bytes, what the driver took outside allocation calls


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
    owner_pid: int = 0  # the slot lock's holder as the kernel names it in the reader's PID namespace; 0 unknown


@dataclass(frozen=True)
class RegionSnapshot:
    path: str
    devices: list[DeviceUsage]
    processes: list[ProcessUsage]
    recounts: int
    reclaimed: int
    owner_pids: list[int] = field(default_factory=list)  # the kernel's PIDs of the live slots' holders (0s left out)


class RegionError(errors.UnavailableError):
    """A region file that cannot be read or is not a valid region; the message names the file."""


@dataclass(frozen=True)
class Layout:
    """The region layout as the header defines it (sizes, maxima, constants), computed once."""

    ffi: cffi.FFI
    magic: int
    version: int
    max_devices: int
    max_slots: int
    slot_live: int
    lock_base: int
    header_size: int
    device_size: int
    slot_size: int
    devices_offset: int
    slots_offset: int
    region_size: int
    state_offset: int         # within a slot
    device_bytes_offset: int  # within a slot
    host_bytes_offset: int    # within a slot
    op_active_offset: int     # within a slot
    driver_taken_offset: int = 0  # within a slot


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
    """)
    return ffi


@cache
def layout() -> Layout:
    ffi = _ffi()
    consts: Any = ffi.dlopen(None)  # the cdef's #define integers; no library is needed for them
    text = _HEADER.read_text()
    m = re.search(r"#define MS_LOCK_BASE \(1ull << (\d+)\)", text)
    if not m:
        raise RegionError(f"{_HEADER}: MS_LOCK_BASE is not of the form (1ull << N)")
    return Layout(ffi=ffi, magic=consts.MS_MAGIC, version=consts.MS_VERSION, max_devices=consts.MS_MAX_DEVICES,
                  max_slots=consts.MS_MAX_SLOTS, slot_live=consts.MS_SLOT_LIVE, lock_base=1 << int(m.group(1)),
                  header_size=ffi.sizeof("struct ms_header"), device_size=ffi.sizeof("struct ms_device"),
                  slot_size=ffi.sizeof("struct ms_slot"), devices_offset=ffi.offsetof("struct ms_region", "dev"),
                  slots_offset=ffi.offsetof("struct ms_region", "slot"),
                  region_size=ffi.sizeof("struct ms_region"),
                  state_offset=ffi.offsetof("struct ms_slot", "state"),
                  device_bytes_offset=ffi.offsetof("struct ms_slot", "device_bytes"),
                  host_bytes_offset=ffi.offsetof("struct ms_slot", "host_bytes"),
                  driver_taken_offset=ffi.offsetof("struct ms_slot", "driver_taken"),
                  op_active_offset=ffi.offsetof("struct ms_slot", "op_active"))


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


def read_region(region_dir: str | os.PathLike[str], with_processes: bool = True) -> RegionSnapshot | None:
    """Snapshot of the region in `region_dir`, or None if no process has created it yet."""
    return read_region_file(region_path(region_dir), with_processes)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def _open(path: str) -> int | None:
    """A read-only descriptor of the region file; None when there is none; RegionError when unsafe."""
    try:
        return os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RegionError(f"{path} is a symbolic link; a region file is never one (refused)") from None
        raise RegionError(f"{path} cannot be opened: {exc.strerror}") from None


def _pread(fd: int, path: str, n: int, offset: int) -> bytearray:
    """Exactly n bytes at offset into a private buffer (the file may shrink meanwhile: then RegionError)."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = os.preadv(fd, [view[got:]], offset + got)
        if k == 0:
            raise RegionError(f"{path} shrank while being read ({offset + got} of {offset + n} bytes)")
        got += k
    return buf


def check_header(h: Any, size: int, path: str, lo: Layout) -> None:
    """Raise RegionError naming the first header field that does not describe a region of this layout."""
    if h.version != lo.version:
        raise RegionError(f"{path}: layout version {h.version}, this reader knows version {lo.version} "
                          f"(agent and shim of different releases?)")
    for name, want in (("header_size", lo.header_size), ("device_size", lo.device_size),
                       ("slot_size", lo.slot_size), ("max_devices", lo.max_devices), ("max_slots", lo.max_slots)):
        if getattr(h, name) != want:
            raise RegionError(f"{path}: header field {name} is {getattr(h, name)}, expected {want}")
    if h.ndevices > lo.max_devices:
        raise RegionError(f"{path}: {h.ndevices} devices, over the maximum of {lo.max_devices}")
    if h.slot_hwm > lo.max_slots:
        raise RegionError(f"{path}: slot high-water mark {h.slot_hwm}, over the maximum of {lo.max_slots}")
    if h.extra_size > MAX_EXTRA_BYTES or size != lo.region_size + h.extra_size:
        raise RegionError(f"{path}: {size} bytes, but the header announces {lo.region_size} + {h.extra_size} "
                          f"(resized or damaged)")


def _uuid(raw: bytes, path: str, d: int) -> str:
    end = raw.find(b"\0")
    text = raw[:end].decode("ascii", "replace") if end > 0 else ""
    if end < 0 or not _UUID.match(text):
        raise RegionError(f"{path}: device {d} has no valid UUID (NUL-terminated, [A-Za-z0-9._:-])")
    return text


def _comm(raw: bytes) -> str:
    """A command name for display: up to the NUL, undecodable bytes and control characters as '?'."""
    end = raw.find(b"\0")
    text = (raw if end < 0 else raw[:end]).decode("utf-8", "replace")
    return "".join(c if c.isprintable() else "?" for c in text)


def _owner(fd: int, lock_byte: int) -> tuple[bool, int]:
    """(is the slot's fcntl lock byte held, its holder's PID in this process's PID namespace or 0). F_GETLK
    works on a read-only descriptor; the PID is the kernel's, so it tells whose process a slot is."""
    query = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, lock_byte, 1, 0)
    try:
        l_type, _, _, _, l_pid = _FLOCK.unpack(fcntl.fcntl(fd, fcntl.F_GETLK, query))
    except OSError:
        return True, 0  # cannot tell: count it (never under-report what a process may hold)
    return l_type != fcntl.F_UNLCK, max(int(l_pid), 0) if l_type != fcntl.F_UNLCK else 0


def user_of(region_dir: str | os.PathLike[str]) -> int | None:
    """Whether a live process uses the region in `region_dir`: the PID (in the caller's PID namespace; 0 when not
    visible there, or when the kernel cannot say) of a process holding a write lock anywhere in the region
    file, or None when nobody does or there is no regular region file there.

    A process of the container holds one for as long as it uses the region (its slot's byte; the creation byte
    while it makes the file), and the kernel drops it when the process dies, kill -9 included: liveness that no
    clock and no byte of the file decides. Only a descriptor open for writing can take a write lock, so a mere
    reader of the file (the read-only peers' mount of a simulated node) cannot pose as a user. The probe is a
    read lock over the whole file, which only write locks conflict with; nothing is taken, and nothing but a
    regular file is opened (probed through O_PATH first, as for the PID fill)."""
    try:
        probe = os.open(region_path(region_dir), os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None  # no file (or no directory)
    try:
        st = os.fstat(probe)
        if not stat.S_ISREG(st.st_mode):
            return None  # a link, a FIFO, a directory...: no process of ours uses that
        fd = os.open(f"/proc/self/fd/{probe}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        # refused (a mode the tenant chose) reads as unused; anything else (out of descriptors) cannot tell:
        # counted as used, and asked again at the next look
        return None if exc.errno in (errno.EACCES, errno.EPERM) else 0
    finally:
        os.close(probe)
    try:
        query = _FLOCK.pack(fcntl.F_RDLCK, os.SEEK_SET, 0, 0, 0)  # l_len 0: the whole file, however long
        l_type, _, _, _, l_pid = _FLOCK.unpack(fcntl.fcntl(fd, fcntl.F_GETLK, query))
    except OSError:
        return 0
    finally:
        os.close(fd)
    return None if l_type == fcntl.F_UNLCK else max(int(l_pid), 0)


def read_region_file(path: str, with_processes: bool = True) -> RegionSnapshot | None:
    """Snapshot of the region file at `path`: None if absent or still being created; RegionError (naming the
    file and what is wrong) for anything that is not a valid region. with_processes=False leaves the process
    list empty (the device figures, live usage included, are the same): what the agent's scrape needs."""
    fd = _open(path)
    if fd is None:
        return None
    try:
        return _read_fd(fd, path, layout(), with_processes)
    finally:
        os.close(fd)


def _slots(fd: int, raw: bytearray, hwm: int, nd: int, uuids: list[str], lo: Layout, with_processes: bool
           ) -> tuple[list[ProcessUsage], list[int], list[int], list[int], list[int]]:
    """(processes, live device bytes per device, live host bytes per device, the kernel-named PIDs of the live
    slots' holders, live driver-taken bytes per device) from the copied slots. The counters are read as machine
    words straight from the copy: 4096 live slots cost milliseconds."""
    u32, u64 = memoryview(raw).cast("I"), memoryview(raw).cast("Q")
    w32, w64 = lo.slot_size // 4, lo.slot_size // 8
    state, dev_at, host_at = lo.state_offset // 4, lo.device_bytes_offset // 8, lo.host_bytes_offset // 8
    taken_at = lo.driver_taken_offset // 8
    procs: list[ProcessUsage] = []
    live_dev, live_host, live_taken = [0] * nd, [0] * nd, [0] * nd
    owners: list[int] = []
    slots = lo.ffi.from_buffer("struct ms_slot[]", raw) if with_processes and hwm else None
    for i in range(hwm):
        if u32[i * w32 + state] != lo.slot_live:
            continue
        alive, owner_pid = _owner(fd, lo.lock_base + i)
        base = i * w64
        dev_b = u64[base + dev_at:base + dev_at + nd].tolist()
        host_b = u64[base + host_at:base + host_at + nd].tolist()
        if alive:
            if owner_pid > 0:
                owners.append(owner_pid)
            live_dev = [a + b for a, b in zip(live_dev, dev_b, strict=True)]
            live_host = [a + b for a, b in zip(live_host, host_b, strict=True)]
            taken_b = u64[base + taken_at:base + taken_at + nd].tolist()
            live_taken = [a + min(b, c) for a, b, c in zip(live_taken, taken_b, dev_b, strict=True)]
        if slots is not None:
            s = slots[i]
            procs.append(ProcessUsage(pid=int(s.pid), comm=_comm(bytes(lo.ffi.buffer(s.comm))), alive=alive,
                                      device_bytes=sum(dev_b), host_bytes=sum(host_b), peak_bytes=int(s.peak),
                                      refused=int(s.refused),
                                      per_device={u: (dev_b[d], host_b[d]) for d, u in enumerate(uuids)},
                                      owner_pid=owner_pid))
    return procs, live_dev, live_host, owners, live_taken


def in_operation(raw: bytes | bytearray, hwm: int, lo: Layout) -> bool:
    """Whether a live slot of this copy is between the two steps of a charge or uncharge (op_active > 0)."""
    u32 = memoryview(raw).cast("I")
    w32 = lo.slot_size // 4
    states = u32[lo.state_offset // 4::w32][:hwm].tolist()
    ops = u32[lo.op_active_offset // 4::w32][:hwm].tolist()
    return any(op and st == lo.slot_live for st, op in zip(states, ops, strict=True))


def _settled_slots(fd: int, path: str, hwm: int, lo: Layout) -> tuple[bytearray, bool]:
    """A copy of the first `hwm` slots, and whether it is consistent: two copies in a row agree and no live
    slot is inside an operation (at most READ_TRIES tries; else the last copy, False)."""
    if not hwm:
        return bytearray(), True
    raw = _pread(fd, path, hwm * lo.slot_size, lo.slots_offset)
    for _ in range(READ_TRIES):
        again = _pread(fd, path, hwm * lo.slot_size, lo.slots_offset)
        if again == raw and not in_operation(raw, hwm, lo):
            return raw, True
        raw = again
    return raw, False


def _read_fd(fd: int, path: str, lo: Layout, with_processes: bool = True) -> RegionSnapshot | None:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise RegionError(f"{path} is {_kind(st.st_mode)}, not a region file (refused)")
    if st.st_size == 0:
        return None  # created, not yet sized
    if st.st_size < lo.region_size:
        raise RegionError(f"{path}: {st.st_size} bytes, shorter than a region ({lo.region_size}): truncated")
    ffi = lo.ffi
    head = _pread(fd, path, lo.slots_offset, 0)
    h: Any = ffi.from_buffer("struct ms_header *", head)  # fields from the header, unknown to mypy
    if h.magic == 0:
        return None  # being initialised (the magic is written last)
    if h.magic != lo.magic:
        raise RegionError(f"{path}: bad magic {h.magic:#x}, not a memslice region")
    check_header(h, st.st_size, path, lo)
    nd = h.ndevices
    devs = ffi.from_buffer("struct ms_device[]", memoryview(head)[lo.devices_offset:])
    uuids = [_uuid(bytes(ffi.buffer(devs[d].uuid)), path, d) for d in range(nd)]
    if len(set(uuids)) != nd:  # the shims add each UUID once: a repeat is tampering (and would double a series)
        raise RegionError(f"{path}: a device UUID is listed twice")
    hwm = h.slot_hwm
    raw, settled = _settled_slots(fd, path, hwm, lo)
    procs, live_dev, live_host, owners, live_taken = _slots(fd, raw, hwm, nd, uuids, lo, with_processes)
    if not settled:  # no consistent copy: never more than the shared totals (module docstring)
        live_dev = [min(v, int(devs[d].used) & ~FROZEN) for d, v in enumerate(live_dev)]
        live_host = [min(v, int(devs[d].host_used) & ~FROZEN) for d, v in enumerate(live_host)]
    devices = []
    for d in range(nd):
        dv = devs[d]
        devices.append(DeviceUsage(uuid=uuids[d], physical_bytes=int(dv.physical_total), limit_bytes=int(dv.limit),
                                   used_bytes=live_dev[d], host_bytes=live_host[d],
                                   peak_bytes=max(int(dv.peak), live_dev[d]), refused=int(dv.refused),
                                   spill_refused=int(dv.spill_refused),
                                   host_peak_bytes=max(int(dv.host_peak), live_host[d]),
                                   charged_bytes=int(dv.used) & ~FROZEN,
                                   context_cost_bytes=min(int(dv.context_cost), int(dv.physical_total)),
                                   driver_taken_bytes=min(live_taken[d], live_dev[d])))
    return RegionSnapshot(path=path, devices=devices, processes=procs, recounts=int(h.recounts),
                          reclaimed=int(h.reclaimed), owner_pids=owners)


def sweep(region_dir: str | os.PathLike[str]) -> int:
    """Reclaim the usage of dead processes in the region; returns how many were reclaimed.

    This joins the region's write protocol through the C library (it maps the file read-write, as the shim
    does): for tools and tests run by the region's own user, never for the node agent, which only reads."""
    path = region_path(region_dir)
    if not os.path.exists(path):
        return 0
    ffi = _ffi()
    err = ffi.new("char[]", 512)
    n = _lib().memslice_region_sweep(path.encode(), err, 512)
    if n < 0:
        raise RegionError(_text(err))
    return int(n)


# ---- host PIDs: the one thing the node agent writes into a region ----------------------------------------
_HOST_PID = struct.Struct("<i")
MAX_HOST_PID_FILLS = 64  # slots filled per file per call: a scrape's cost stays bounded


def _lock_owner(fd: int, lock_byte: int) -> int:
    """The PID (in the caller's PID namespace; 0 if not visible there) of the process holding the slot's lock
    byte, or 0 when nobody holds it or the kernel cannot say."""
    query = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, lock_byte, 1, 0)
    try:
        l_type, _, _, _, l_pid = _FLOCK.unpack(fcntl.fcntl(fd, fcntl.F_GETLK, query))
    except OSError:
        return 0
    return int(l_pid) if l_type != fcntl.F_UNLCK and l_pid > 0 else 0


def _open_for_pid_write(path: str) -> int | None:
    """A read-write descriptor of the regular file at `path`, never through a link, and without opening
    anything else first (a FIFO or a device node planted by a tenant is refused on an O_PATH descriptor,
    before any open that could have side effects). None when absent; RegionError when unsafe."""
    try:
        probe = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RegionError(f"{path} cannot be opened: {exc.strerror}") from None
    try:
        st = os.fstat(probe)
        if not stat.S_ISREG(st.st_mode):
            raise RegionError(f"{path} is {_kind(st.st_mode)}, not a region file (refused)")
        # the same inode, now readable and writable (the magic link names the probed file, not the path)
        fd = os.open(f"/proc/self/fd/{probe}", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise RegionError(f"{path} cannot be opened for writing: {exc.strerror}") from None
    finally:
        os.close(probe)
    st2 = os.fstat(fd)
    if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(st2.st_mode):
        os.close(fd)
        raise RegionError(f"{path} changed while being opened (refused)")
    return fd


def fill_host_pids(path: str, limit: int = MAX_HOST_PID_FILLS) -> int:
    """Write each live slot's owner PID, as this process's PID namespace sees it, into slots whose host_pid is
    0 (owners in a container with its own /proc cannot learn it themselves). Returns how many were filled.

    Meant for the node agent running in the host PID namespace: F_GETLK on a slot's lock byte reports the
    owner's PID translated into the asker's namespace (0 when the owner is not visible there: then nothing is
    written). The file is the tenant's: it is validated as read_region_file does (regular file, exact size,
    header), never mapped, and the only bytes written are 4-byte pwrites at a slot's host_pid offset, computed
    from the layout. A tenant can make the figure wrong for its own slots only (it could write host_pid
    itself); NVML's process filter is a view, not a boundary. A slot whose owner changes between the query and
    the write is rewritten once with the new owner (or 0)."""
    fd = _open_for_pid_write(path)
    if fd is None:
        return 0
    lo = layout()
    try:
        st = os.fstat(fd)
        if st.st_size < lo.region_size:
            return 0  # being created (or truncated: the reader reports that)
        head = _pread(fd, path, lo.slots_offset, 0)
        h: Any = lo.ffi.from_buffer("struct ms_header *", head)
        if h.magic != lo.magic:
            return 0
        check_header(h, st.st_size, path, lo)
        hwm = int(h.slot_hwm)
        raw = _pread(fd, path, hwm * lo.slot_size, lo.slots_offset) if hwm else bytearray()
        u32 = memoryview(raw).cast("I")
        w32, state_at = lo.slot_size // 4, lo.state_offset // 4
        host_pid_at = lo.ffi.offsetof("struct ms_slot", "host_pid")
        filled = 0
        for i in range(hwm):
            if filled >= limit:
                break
            at = i * lo.slot_size + host_pid_at
            if u32[i * w32 + state_at] != lo.slot_live or _HOST_PID.unpack_from(raw, at)[0] != 0:
                continue
            owner = _lock_owner(fd, lo.lock_base + i)
            if owner == 0:
                continue
            os.pwrite(fd, _HOST_PID.pack(owner), lo.slots_offset + at)
            now = _lock_owner(fd, lo.lock_base + i)
            if now != owner:  # the slot changed hands meanwhile: never leave another process's PID in it
                os.pwrite(fd, _HOST_PID.pack(now), lo.slots_offset + at)
            filled += 1
        return filled
    finally:
        os.close(fd)

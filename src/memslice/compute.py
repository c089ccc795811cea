"""A container's compute share: validation, and the per-GPU arbitration files the shim reads.

One module for everything that provisions a share on a node, used by `memslice run` and by the node agent.
A share is a percent of one GPU: a request (0..100, the guaranteed part under contention and the weight for
what is left; 0 = best effort) and an optional limit (1..100, a cap that holds even on an idle GPU; >= the
request). The limits-file keys are `gpu_compute_request`, `gpu_compute_limit`, `compute_dir`, `compute_slot`
and `priority` (src/memslice/limits.py).

Layout of a node's compute directory (interposer/src/compute.h has the C side; docs/architecture.md,
"Compute share"):

    <compute_dir>/<GPU uuid>/roster    written by the provisioner only (atomically, mode 0444): which slots
                                       are assigned, with each one's request, limit and priority. Tenants see
                                       the GPU directory read-only: they can neither write it nor add files.
    <compute_dir>/<GPU uuid>/slot-NN   one file per slot (NN = 00..63), SLOT_FILE_SIZE bytes, created by the
                                       provisioner; only the owner's container gets it mounted writable. It
                                       holds PROCS records of RECORD_SIZE bytes, one per process of that
                                       container, each written by its process only.

Every figure a tenant publishes is bounded by the roster: its share from the slot file is clamped to the
roster's limit, and its request, limit and priority are the roster's, never the file's. Without a roster
(`memslice run` on a workstation, where every session is the same user) the shim claims a free slot itself and
neighbours' claims are only clamped to 0..100. Files are read with bounded preads, never mapped.
"""

from __future__ import annotations

import fcntl
import os
import stat
import struct
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from . import errors

SLOTS = 64
PROCS = 8                      # process records per slot file
RECORD_SIZE = 64
SLOT_FILE_SIZE = PROCS * RECORD_SIZE
RECORD_MAGIC = 0x50434D53      # "MSCP"
RECORD_VERSION = 1
ROSTER_MAGIC = 0x3130534F5243534D  # "MSCROS01" little-endian
ROSTER_SIZE = 8 + SLOTS * 16
R_ASSIGNED = 1
FRESH_NS = 500_000_000         # a record older than this is a process that stopped publishing (not live)
SKEW_NS = 10_000_000           # ... and one stamped up to this far ahead was written as the reader read the clock
CONTAINER_COMPUTE_DIR = "/run/memslice/compute"  # where the agent mounts the node's compute directory
ENV_DIR = "MEMSLICE_COMPUTE_DIR"
F_DEMAND = 1                   # record flags: the process has work queued or waiting
F_INFLIGHT = 2                 # ... work on the GPU now
F_UNARBITRATED = 4             # ... it could not read the board and runs on its own limit only

# magic version flags pid request limit reserved priority usage_pm stamp used throttled waited launches
_RECORD = struct.Struct("<IHHiBBHiIQQQQQ")
_ROSTER_ENT = struct.Struct("<IiII")  # flags priority request limit(0 = none)
assert _RECORD.size == RECORD_SIZE


class ComputeShareError(errors.ConfigError):
    """A bad compute share (a request or limit out of range, a limit below the request, requests over 100 on
    one GPU); the message names the value and the fix."""


@dataclass(frozen=True)
class Share:
    request: int               # percent of one GPU, 0..100 (0: best effort)
    limit: int | None = None   # percent, 1..100 (None: no cap)

    @property
    def cap(self) -> int:
        return 100 if self.limit is None else self.limit


def check_share(request: int, limit: int | None, what: str = "--gpu-compute") -> Share:
    """The share, or ComputeShareError naming `what`, the value and the fix (pure)."""
    if type(request) is not int or not 0 <= request <= 100:
        raise ComputeShareError(f"{what} {request}: a share is a percent of one GPU, 0 to 100 (e.g. {what} 30)")
    if limit is not None:
        if type(limit) is not int or not 1 <= limit <= 100:
            raise ComputeShareError(f"{what} {request}:{limit}: the limit is a percent of one GPU, 1 to 100 "
                                    f"(e.g. {what} {request}:{max(request, 40)})")
        if limit < request:
            raise ComputeShareError(f"{what} {request}:{limit}: the limit {limit} is below the request {request}; "
                                    f"the limit must be at least the request (e.g. {what} {request}:{request})")
    return Share(request, limit)


def _percent(text: str, what: str, whole: str) -> int:
    t = text.strip().removesuffix("%")
    if not t.isascii() or not t.isdigit() or len(t) > 6:
        raise ComputeShareError(f"{what} {whole}: {text!r} is not a whole percent; write REQUEST[:LIMIT] in percent "
                                f"of one GPU, e.g. {what} 30 or {what} 20:40")
    return int(t)


def parse_share(text: str, what: str = "--gpu-compute") -> Share:
    """REQUEST[:LIMIT] in percent of one GPU ("30", "20:40", "30%"); ComputeShareError naming the value."""
    whole = text.strip()[:32]
    req_text, sep, lim_text = text.partition(":")
    request = _percent(req_text, what, whole)
    limit = _percent(lim_text, what, whole) if sep else None
    if request > 100:
        raise ComputeShareError(f"{what} {whole}: a share is a percent of one GPU, 0 to 100")
    return check_share(request, limit, what)


# ---- the roster ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RosterEntry:
    slot: int
    request: int
    limit: int | None = None
    priority: int = 0

    @property
    def share(self) -> Share:
        return Share(self.request, self.limit)


def render_roster(entries: Iterable[RosterEntry]) -> bytes:
    """A roster file's bytes (pure); ComputeShareError for a bad slot or share; priorities clamp to int32."""
    body = bytearray(SLOTS * 16)
    for e in entries:
        if not 0 <= e.slot < SLOTS:
            raise ComputeShareError(f"compute slot {e.slot} is not between 0 and {SLOTS - 1}")
        check_share(e.request, e.limit, f"compute slot {e.slot}:")
        prio = max(min(e.priority, 2**31 - 1), -(2**31))
        _ROSTER_ENT.pack_into(body, e.slot * 16, R_ASSIGNED, prio, e.request, e.limit or 0)
    return struct.pack("<Q", ROSTER_MAGIC) + bytes(body)


def parse_roster(raw: bytes) -> dict[int, RosterEntry] | None:
    """Slot -> entry of a roster's bytes; None unless it is exactly the layout (pure). Out-of-range figures
    (never written by render_roster) make the entry unassigned."""
    if len(raw) != ROSTER_SIZE or struct.unpack_from("<Q", raw)[0] != ROSTER_MAGIC:
        return None
    out = {}
    for i in range(SLOTS):
        flags, prio, req, lim = _ROSTER_ENT.unpack_from(raw, 8 + i * 16)
        if flags & R_ASSIGNED and req <= 100 and lim <= 100 and (lim == 0 or lim >= req):
            out[i] = RosterEntry(i, req, lim or None, prio)
    return out


def requests_fit(roster: Mapping[int, RosterEntry], share: Share, gpu: str = "this GPU") -> None:
    """ComputeShareError when the requests on one GPU would sum over 100 (pure)."""
    taken = sum(e.request for e in roster.values())
    if taken + share.request > 100:
        raise ComputeShareError(f"a compute request of {share.request}% does not fit on {gpu}: {taken}% of it is "
                                f"already requested ({100 - taken}% left); the requests on one GPU sum to at most "
                                "100: ask for less, or another GPU")


def free_slot(roster: Mapping[int, RosterEntry]) -> int:
    """The lowest slot the roster does not assign (pure); ComputeShareError when all 64 are."""
    for i in range(SLOTS):
        if i not in roster:
            return i
    raise ComputeShareError(f"all {SLOTS} compute slots of the GPU are assigned; release one first")


# ---- the files -------------------------------------------------------------------------------------------
def gpu_dir(compute_dir: str | os.PathLike[str], uuid: str) -> Path:
    """<compute_dir>/<uuid>; ComputeShareError for a uuid that is not a plain file name."""
    if not uuid or len(uuid) > 64 or not all(c.isalnum() or c in "-_." for c in uuid) or uuid.startswith("."):
        raise ComputeShareError(f"GPU uuid {uuid[:70]!r} is not a plain name (letters, digits, - _ .)")
    return Path(compute_dir) / uuid


def slot_path(compute_dir: str | os.PathLike[str], uuid: str, slot: int) -> Path:
    if not 0 <= slot < SLOTS:
        raise ComputeShareError(f"compute slot {slot} is not between 0 and {SLOTS - 1}")
    return gpu_dir(compute_dir, uuid) / f"slot-{slot:02d}"


def _read_small(path: Path, cap: int) -> bytes | None:
    """At most `cap` bytes of a regular file (no symlink, no FIFO); None when it is absent or not one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.pread(fd, cap, 0)
    finally:
        os.close(fd)


def read_roster(compute_dir: str | os.PathLike[str], uuid: str) -> dict[int, RosterEntry] | None:
    raw = _read_small(gpu_dir(compute_dir, uuid) / "roster", ROSTER_SIZE + 1)
    return None if raw is None else parse_roster(raw)


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.write(fd, data)
        os.fsync(fd)
        os.fchmod(fd, mode)
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        Path(tmp).unlink(missing_ok=True)
        raise


def ensure_dir(path: str | os.PathLike[str], mode: int = 0o755) -> Path:
    """A directory of ours (created with `mode` if missing); ComputeShareError for a symlink or someone else's."""
    p = Path(path)
    if not p.is_absolute():
        raise ComputeShareError(f"the compute directory {str(p)!r} is not an absolute path")
    p.mkdir(mode=mode, parents=True, exist_ok=True)
    st = os.lstat(p)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise ComputeShareError(f"the compute directory {p} is not a directory of yours; remove it or choose "
                                f"another ({ENV_DIR})")
    return p


@dataclass(frozen=True)
class Provision:
    slot: int
    slot_file: Path   # mount it writable into the container (only its own)
    gpu_dir: Path     # mount it read-only (the roster and every neighbour's slot file)


def provision(compute_dir: str | os.PathLike[str], uuid: str, share: Share, priority: int = 0,
              slot: int | None = None, slot_mode: int = 0o666) -> Provision:
    """Give a container a compute share on GPU `uuid`: a slot (the one given, else the lowest free one), its
    entry in the roster and its empty slot file. Refuses (ComputeShareError) a sum of requests over 100 and a
    slot already assigned. Concurrent provisioners serialise on an flock of <gpu dir>/.lock."""
    check_share(share.request, share.limit)
    d = gpu_dir(ensure_dir(compute_dir), uuid)
    ensure_dir(d)
    with open(d / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        roster = read_roster(compute_dir, uuid) or {}
        if slot is None:
            slot = free_slot(roster)
        elif slot in roster:
            raise ComputeShareError(f"compute slot {slot} of {uuid} is already assigned; release it first")
        requests_fit(roster, share, uuid)
        path = slot_path(compute_dir, uuid, slot)
        _write_atomic(path, bytes(SLOT_FILE_SIZE), slot_mode)
        roster[slot] = RosterEntry(slot, share.request, share.limit, priority)
        _write_atomic(d / "roster", render_roster(roster.values()), 0o444)
    return Provision(slot, path, d)


def release(compute_dir: str | os.PathLike[str], uuid: str, slot: int) -> None:
    """Take a slot out of the roster and remove its file (nothing if it was not assigned)."""
    d = gpu_dir(compute_dir, uuid)
    if not d.is_dir():
        return
    with open(d / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        roster = read_roster(compute_dir, uuid) or {}
        if roster.pop(slot, None) is not None:
            _write_atomic(d / "roster", render_roster(roster.values()), 0o444)
        slot_path(compute_dir, uuid, slot).unlink(missing_ok=True)


# ---- reading what tenants publish (metrics, `memslice top`, tests) -------------------------------------------
@dataclass(frozen=True)
class ProcRecord:
    pid: int            # in the tenant's PID namespace: display only
    flags: int
    request: int        # the process's own claim (the roster's figure wins where there is one)
    limit: int
    priority: int
    share_pct: float    # GPU share over the shim's recent window, clamped to 0..100
    stamp_ns: int       # CLOCK_MONOTONIC of its last publish
    used_ns: int        # GPU time it was charged, ever
    throttled_ns: int   # time it waited at its limit, ever
    waited_ns: int      # time it waited for neighbours (contention, priority), ever
    launches: int


def parse_record(raw: bytes) -> ProcRecord | None:
    """One process record (pure); None for a short, empty or malformed one."""
    if len(raw) < RECORD_SIZE:
        return None
    f = _RECORD.unpack_from(raw)
    if f[0] != RECORD_MAGIC:
        return None
    return ProcRecord(pid=f[3], flags=f[2], request=min(f[4], 100), limit=min(f[5], 100), priority=f[7],
                      share_pct=min(f[8], 1000) / 10, stamp_ns=f[9], used_ns=f[10], throttled_ns=f[11],
                      waited_ns=f[12], launches=f[13])


def read_slot(path: str | os.PathLike[str], now_ns: int | None = None) -> list[ProcRecord]:
    """The fresh process records of one slot file (published within FRESH_NS); with now_ns=-1, all of them."""
    raw = _read_small(Path(path), SLOT_FILE_SIZE) or b""
    now = time.monotonic_ns() if now_ns is None else now_ns
    recs = [parse_record(raw[i * RECORD_SIZE:(i + 1) * RECORD_SIZE]) for i in range(PROCS)]
    return [r for r in recs if r is not None and (now < 0 or -SKEW_NS <= now - r.stamp_ns <= FRESH_NS)]


@dataclass(frozen=True)
class SlotFigures:
    slot: int
    request: int
    limit: int | None
    priority: int
    share_pct: float     # the container's processes together, bounded by its limit
    used_s: float
    throttled_s: float
    waited_s: float
    launches: int
    processes: int       # fresh records
    rostered: bool       # figures from the roster (True) or from the tenant's own claims


def slot_figures(slot: int, records: list[ProcRecord], entry: RosterEntry | None) -> SlotFigures:
    """A slot's figures (pure): the roster's share where there is one, the claims bounded by it."""
    if entry is not None:
        request, limit, prio = entry.request, entry.limit, entry.priority
    else:
        first = records[0] if records else None
        request = first.request if first else 0
        limit = first.limit if first and first.limit else None
        prio = first.priority if first else 0
    share = min(sum(r.share_pct for r in records), float(limit or 100))
    return SlotFigures(slot, request, limit, prio, share, sum(r.used_ns for r in records) / 1e9,
                       sum(r.throttled_ns for r in records) / 1e9, sum(r.waited_ns for r in records) / 1e9,
                       sum(r.launches for r in records), len(records), entry is not None)


def read_gpu(compute_dir: str | os.PathLike[str], uuid: str, now_ns: int | None = None) -> list[SlotFigures]:
    """Every slot of one GPU: with a roster, its assigned slots only; without one, every slot file there."""
    roster = read_roster(compute_dir, uuid)
    d = gpu_dir(compute_dir, uuid)
    slots = sorted(roster) if roster is not None else [
        i for i in range(SLOTS) if (d / f"slot-{i:02d}").is_file()]
    return [slot_figures(i, read_slot(d / f"slot-{i:02d}", now_ns), roster.get(i) if roster else None)
            for i in slots]


def default_dir(environ: Mapping[str, str]) -> str:
    """This user's compute directory on a workstation (`memslice run`): MEMSLICE_COMPUTE_DIR, else
    $XDG_RUNTIME_DIR/memslice/compute or /tmp/memslice-UID/compute."""
    return environ.get(ENV_DIR) or os.path.join(
        environ.get("XDG_RUNTIME_DIR") or f"/tmp/memslice-{os.getuid()}", "memslice", "compute")

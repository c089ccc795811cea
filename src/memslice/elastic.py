"""Reading the elastic arbitration boards (interposer/src/elastic_board.h has the layout), and telling whose
process each slot is.

Board version 5: one directory per GPU in the node's elastic directory, `<GPU uuid>.board/`, of one
file per slot (memslice.slotfile: `NN.slot`), each written by its owner only (the agent mounts only a
container's own slot file read-write), live while its owner holds the write lock on its liveness byte. An owner
can write anything into its own file, so everything read here is bounded and validated (one bounded pread per
file, never mapped), and where the agent's roster (`<GPU uuid>.roster`) exists every figure is bounded by what
the agent recorded there: only assigned slots count, request, limit and priority are the roster's, resident and
swapped at most the limit.

Whose a slot is comes from the kernel, never from the slot's bytes: the liveness lock is a classic POSIX lock,
and F_GETLK names its holder in the *reader's* PID namespace (0 when the holder is not visible there). A region
file (one per container, mounted only into that container) names its live processes the same way. So `owners`
maps a PID the kernel gave for a region's lock to that container, and `attribute` gives a board slot to the
container whose region its lock holder holds; a PID that holds locks in two regions, or that the kernel did not
name, attributes nothing.
"""

from __future__ import annotations

import json
import os
import stat
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import errors, slotfile

MiB = 1 << 20

SLOTS = slotfile.SLOTS
SLOT_SIZE = 128
MAGIC = 0x4C45534D
VERSION = 5          # 2: the liveness lock is a POSIX lock whose holder F_GETLK names (1: an OFD lock); 3: the
#                      priority, flags, ack and the owner's asks (needed/moved) in the last 32 bytes; 4: a host
#                      note per slot ("host memory is finite"); 5: one file per slot, each written by
#                      its owner only
NOTE_OFF = 128       # in a slot file: struct elastic_slot, struct elastic_hostnote, elastic_answer, the asks
NOTE_SIZE = 64
ANSWER_OFF = 192
ASK_OFF = 256
FILE_SIZE = ASK_OFF + SLOTS * 16
LIVE_OFF = slotfile.LIVE_OFF
_NOTE = struct.Struct("<QQIIQQIIII8x")  # seq first_seq cause want_mib limit used refused_cgroup refused_host
#                                         bursts_failed -
NOTE_CAUSES = {1: "cgroup", 2: "host"}
MAX_BOARDS = 64
_SLOT = struct.Struct("<IIiI10QiIQIIII")  # magic state pid version; request limit resident swapped idle_ms
#     done_seq swap_outs swap_ins swap_out_ns swap_in_ns; priority flags ack_seq done_moved_mib asks asked_mib got_mib
F_IDLE_RELEASE = 1
STATES = {1: "active", 2: "idle"}


@dataclass(frozen=True)
class Tenant:
    gpu: str
    slot: int
    pid: int            # as the tenant wrote it (its own PID namespace): display only
    state: str
    request_bytes: int
    limit_bytes: int
    resident_bytes: int
    swapped_bytes: int
    idle_ms: int
    swap_outs: int
    swap_ins: int
    swap_out_seconds: float
    swap_in_seconds: float
    version: int = 0
    owner_pid: int = 0  # the slot lock's holder as the kernel names it in the reader's PID namespace; 0 unknown
    priority: int = 0
    idle_release: bool = False
    asks: int = 0        # asks this tenant made of its neighbours, ever
    asked_mib: int = 0   # what they needed, ever
    got_mib: int = 0     # what neighbours moved for them, ever (moved / needed per ask)
    note: HostNote | None = None  # board version 4: moves it could not take to host memory

    @property
    def shown_state(self) -> str:
        """active, idle, or swapped-out (all its elastic memory in host memory)."""
        return "swapped-out" if self.swapped_bytes and not self.resident_bytes else self.state


@dataclass(frozen=True)
class HostNote:
    """What a tenant could not take to host memory (elastic_board.h, struct elastic_hostnote): the cause and figures
    of its last refusal as it read them (claims: shown, never acted on), its refusal counts by cause, and its
    own bursts that failed because a neighbour refused."""

    cause: str           # "cgroup", "host", or "" (no refusal yet)
    want_mib: int
    limit_bytes: int     # cgroup: memory.max; host: MemTotal
    used_bytes: int      # cgroup: memory.current; host: MemTotal - MemAvailable
    refused_cgroup: int
    refused_host: int
    bursts_failed: int


def parse_note(raw: bytes) -> HostNote | None:
    """A slot's host note (pure), None for a short or empty one; an unknown cause reads as none."""
    if len(raw) < _NOTE.size:
        return None
    seq, _, cause, want, limit, used, n_cg, n_host, failed, _ = _NOTE.unpack_from(raw)
    if not (seq or n_cg or n_host or failed):
        return None
    return HostNote(NOTE_CAUSES.get(cause, ""), want, limit, used, n_cg, n_host, failed)


def parse_slot(gpu: str, index: int, raw: bytes) -> Tenant | None:
    """One slot's tenant, or None for an empty or malformed slot (pure; raw is the slot's 128 bytes)."""
    if len(raw) < _SLOT.size:
        return None
    f = _SLOT.unpack_from(raw)
    if f[0] != MAGIC or f[1] not in STATES:
        return None
    return Tenant(gpu=gpu, slot=index, pid=f[2], state=STATES[f[1]], request_bytes=f[4], limit_bytes=f[5],
                  resident_bytes=f[6], swapped_bytes=f[7], idle_ms=f[8], swap_outs=f[10], swap_ins=f[11],
                  swap_out_seconds=f[12] / 1e9, swap_in_seconds=f[13] / 1e9, version=f[3], priority=f[14],
                  idle_release=bool(f[15] & F_IDLE_RELEASE), asks=f[18], asked_mib=f[19], got_mib=f[20])


def lock_holder(fd: int, offset: int = LIVE_OFF) -> tuple[bool, int]:
    """(held by a write lock, holder PID): memslice.slotfile.lock_holder."""
    return slotfile.lock_holder(fd, offset)


# ---- the roster (interposer/src/elastic_board.h): which slots the node agent assigned, with its own figures ----
ROSTER_MAGIC = 0x3130524F5253534D
ROSTER_SIZE = 8 + SLOTS * 16
R_ASSIGNED = 1
R_IDLE_RELEASE = 2
_ROSTER_ENT = struct.Struct("<IiII")  # flags priority request_mib limit_mib


@dataclass(frozen=True)
class RosterEntry:
    slot: int
    request_mib: int
    limit_mib: int
    priority: int = 0
    idle_release: bool = False


def render_roster(entries: Iterable[RosterEntry]) -> bytes:
    """A roster file's bytes (pure): the agent's assigned slots and their figures; priorities clamp to int32."""
    body = bytearray(SLOTS * 16)
    for e in entries:
        if not 0 <= e.slot < SLOTS:
            raise ValueError(f"board slot {e.slot} is not between 0 and {SLOTS - 1}")
        prio = max(min(e.priority, 2**31 - 1), -(2**31))
        _ROSTER_ENT.pack_into(body, e.slot * 16, R_ASSIGNED | (R_IDLE_RELEASE if e.idle_release else 0), prio,
                              min(e.request_mib, 2**32 - 1), min(e.limit_mib, 2**32 - 1))
    return struct.pack("<Q", ROSTER_MAGIC) + bytes(body)


def parse_roster(raw: bytes) -> dict[int, RosterEntry] | None:
    """Slot -> entry of a roster's bytes, None unless it is exactly the layout (pure)."""
    if len(raw) != ROSTER_SIZE or struct.unpack_from("<Q", raw)[0] != ROSTER_MAGIC:
        return None
    out = {}
    for i in range(SLOTS):
        flags, prio, req, lim = _ROSTER_ENT.unpack_from(raw, 8 + i * 16)
        if flags & R_ASSIGNED:
            out[i] = RosterEntry(i, req, lim, prio, bool(flags & R_IDLE_RELEASE))
    return out


def board_slot_path(gpu: str, slot: int) -> str:
    """A slot file's path relative to the elastic directory: `<GPU uuid>.board/NN.slot` (the agent mounts it
    read-write into the slot's container only)."""
    return f"{gpu}.board/{slotfile.slot_name(slot)}"


def board_gpu(path: str | os.PathLike[str]) -> str:
    return Path(path).name.removesuffix(".board")


def read_roster(directory: str | os.PathLike[str], gpu: str) -> dict[int, RosterEntry] | None:
    """GPU `gpu`'s roster in an elastic directory (None without one, or with anything but the layout): opened
    without following a link or blocking, one bounded read."""
    try:
        fd = os.open(Path(directory) / f"{gpu}.roster", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return parse_roster(os.pread(fd, ROSTER_SIZE + 1, 0)) if stat.S_ISREG(os.fstat(fd).st_mode) else None
    finally:
        os.close(fd)


def bound(t: Tenant, e: RosterEntry) -> Tenant:
    """A slot's figures bounded by the agent's roster entry (pure): request, limit, priority and
    opt-in are the agent's; resident at most the limit, swapped at most the rest of it, a host note's figure at
    most the limit."""
    lim = e.limit_mib * MiB
    resident = min(t.resident_bytes, lim)
    note = t.note
    if note is not None:
        note = replace(note, want_mib=min(note.want_mib, e.limit_mib))
    return replace(t, request_bytes=e.request_mib * MiB, limit_bytes=lim, priority=e.priority,
                   idle_release=e.idle_release, resident_bytes=resident,
                   swapped_bytes=min(t.swapped_bytes, lim - resident), note=note)


def read_board(path: str | os.PathLike[str]) -> list[Tenant]:
    """The live tenants of one board directory (OSError if it is not a directory), bounded by the roster beside
    it when there is one (then only the slots it assigned)."""
    gpu = board_gpu(path)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(f"{path} is not a board directory (refused; a board before version 5 was a file)")
    roster = read_roster(Path(path).parent, gpu)
    out = []
    for i in range(SLOTS):
        if roster is not None and i not in roster:
            continue
        got = slotfile.read_slot(path, i, NOTE_OFF + NOTE_SIZE)
        if got is None:
            continue
        raw, held, pid = got
        t = parse_slot(gpu, i, raw[:SLOT_SIZE])
        if t is None or not held:
            continue
        t = replace(t, owner_pid=pid, note=parse_note(raw[NOTE_OFF:NOTE_OFF + NOTE_SIZE]))
        out.append(bound(t, roster[i]) if roster is not None else t)
    return out


def board_paths(directory: str | os.PathLike[str], gpus: Iterable[str] | None = None) -> list[Path]:
    """The boards of an elastic directory (at most MAX_BOARDS, sorted); with `gpus` (the node's GPU uuids:
    tenants can name a board anything) only the boards named after them, whatever else is there."""
    if gpus is not None:
        return [Path(directory) / f"{g}.board" for g in sorted(set(gpus))[:MAX_BOARDS]]
    return sorted(p for p in Path(directory).glob("*.board"))[:MAX_BOARDS]


def read_boards(directory: str | os.PathLike[str]) -> list[Tenant]:
    """Every live tenant of every GPU board in an elastic directory (at most 64 boards); OSError on the first
    board that cannot be read (scan_boards reports per board instead)."""
    return [t for b in board_paths(directory) if b.is_dir() and not b.is_symlink() for t in read_board(b)]


@dataclass
class BoardScan:
    tenants: list[Tenant] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)  # (board path, problem)


def scan_boards(directory: str | os.PathLike[str], gpus: Iterable[str] | None = None) -> BoardScan:
    """Every live tenant of every readable board (with `gpus`, of those GPUs' boards only); a board that
    cannot be read costs only its own tenants (one (path, problem) entry), never the others'."""
    scan = BoardScan()
    try:
        paths = board_paths(directory, gpus)
    except OSError as exc:
        scan.errors.append((str(directory), str(exc)))
        return scan
    for b in paths:
        try:
            scan.tenants.extend(read_board(b))
        except OSError as exc:
            scan.errors.append((str(b), exc.strerror or str(exc)))
    return scan


# ---- whose is a slot: kernel-named PIDs of regions' and boards' locks -----------------------------------------
def owners(region_pids: Mapping[str, Iterable[int]]) -> dict[int, str]:
    """Kernel-named PID -> the one container key (a region) whose region file that process holds a slot lock
    in (pure). PIDs the kernel did not name (0) and PIDs found in two regions (a descriptor passed between
    containers) are left out: they attribute nothing."""
    seen: dict[int, str] = {}
    twice: set[int] = set()
    for key, pids in region_pids.items():
        for pid in set(pids):
            if pid <= 0:
                continue
            if pid in seen and seen[pid] != key:
                twice.add(pid)
            seen[pid] = key
    return {pid: key for pid, key in seen.items() if pid not in twice}


def attribute(tenants: Iterable[Tenant], owner_of: Mapping[int, str]) -> tuple[dict[str, list[Tenant]], list[Tenant]]:
    """(container key -> its tenants, tenants of no known container) (pure): a slot is a container's when the
    kernel named its lock holder and that PID holds a slot of that container's region."""
    mine: dict[str, list[Tenant]] = {}
    unknown: list[Tenant] = []
    for t in tenants:
        key = owner_of.get(t.owner_pid) if t.owner_pid > 0 else None
        if key is None:
            unknown.append(t)
        else:
            mine.setdefault(key, []).append(t)
    return mine, unknown


# ---- the Kubernetes side: the limit annotation (for the extender's filter and the agent's Allocate) ----------
ANN_LIMIT = "memslice.io/gpu-mem-limit"    # pod-wide; ANN_LIMIT + "." + container wins for that container
MAX_LIMIT_MIB = 1 << 20                      # 1 TiB: anything larger is a typo


class LimitAnnotationError(errors.InputError):
    """A bad `memslice.io/gpu-mem-limit[.<container>]` value; the message names the annotation and the fix."""


def limit_mib(annotations: dict[str, str], container: str, request_mib: int) -> int | None:
    """The container's GPU memory limit in MiB from the pod's annotations, or None without one (limit =
    request: not elastic). Pure; raises LimitAnnotationError for a value that is not a whole number of MiB
    (1..MAX_LIMIT_MIB) or that is below the request (`memslice.io/gpu-mem`)."""
    key = f"{ANN_LIMIT}.{container}"
    if key not in annotations:
        key = ANN_LIMIT
    raw = annotations.get(key)
    if raw is None:
        return None
    text = raw.strip()
    if not text.isascii() or not text.isdigit() or not 0 < int(text) <= MAX_LIMIT_MIB:
        raise LimitAnnotationError(f"annotation {key}={raw[:32]!r} is not a whole number of MiB between 1 and "
                                   f"{MAX_LIMIT_MIB} (e.g. \"8192\"); fix or remove it")
    mib = int(text)
    if mib < request_mib:
        raise LimitAnnotationError(f"annotation {key}={mib} is below the container {container!r}'s request of "
                                   f"{request_mib} MiB (memslice.io/gpu-mem); the limit must be at least the request")
    return mib


# The extender's record of the limits at bind, next to `memslice.io/gpu-mem-mib`: a JSON object of container
# name to limit MiB, only for containers whose limit is above their request. The agent reads it from the
# reservation (it does not parse users' annotations again when the record is there).
ANN_LIMIT_RECORD = "memslice.io/gpu-mem-limit-mib"
CONTAINER_ELASTIC_DIR = "/run/memslice/elastic"  # where Allocate mounts the node's elastic directory


def pod_limits(annotations: dict[str, str], request_mib: dict[str, int]) -> dict[str, int]:
    """Container -> limit MiB for the containers whose limit is above their request (pure; raises
    LimitAnnotationError as `limit_mib` does). Empty: nothing elastic."""
    out = {}
    for container, mib in sorted(request_mib.items()):
        lim = limit_mib(annotations, container, mib)
        if lim is not None and lim > mib:
            out[container] = lim
    return out


def parse_limit_record(raw: str) -> dict[str, int]:
    """The extender's ANN_LIMIT_RECORD value; LimitAnnotationError naming it when it is not a JSON object of
    container name to MiB in 1..MAX_LIMIT_MIB (bounded: at most 4096 characters)."""
    try:
        value = json.loads(raw) if len(raw) <= 4096 else None
    except ValueError:
        value = None
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and type(v) is int and 0 < v <= MAX_LIMIT_MIB for k, v in value.items()):
        raise LimitAnnotationError(f"annotation {ANN_LIMIT_RECORD}={raw[:64]!r} is not a JSON object of container "
                                   f"name to MiB (e.g. {{\"main\": 8192}}); the extender writes it at bind: "
                                   f"delete the pod so it is scheduled again")
    return dict(value)


# The mover's per-phase line (interposer/src/elastic_move.c, log_phases), logged at MEMSLICE_LOG=info after
# each batch: the figures so far, summed over that direction's batches.
MOVE_PHASES_PREFIX = "memslice: elastic: move phases "
MOVE_PHASE_KEYS = ("batches", "chunks", "create_ns", "stage_ns", "gate_ns", "copy_ns", "remap_ns", "finish_ns")


def parse_move_phases(log: str) -> dict[str, dict[str, int]]:
    """The last move-phases figures per direction ("out", "in") in a tenant's log (the shim's stderr at
    MEMSLICE_LOG=info); lines that do not parse whole are skipped (bounded: each line's first 400 characters)."""
    out: dict[str, dict[str, int]] = {}
    for line in log.splitlines():
        at = line.find(MOVE_PHASES_PREFIX)
        if at < 0:
            continue
        words = line[at + len(MOVE_PHASES_PREFIX):at + 400].split()
        if len(words) != 1 + len(MOVE_PHASE_KEYS) or words[0] not in ("out", "in"):
            continue
        pairs = [w.partition("=") for w in words[1:]]
        if [k for k, _, _ in pairs] != list(MOVE_PHASE_KEYS) or not all(
                v.isdigit() and len(v) <= 20 for _, _, v in pairs):
            continue
        out[words[0]] = {k: int(v) for k, _, v in pairs}
    return out

"""Reading the elastic arbitration boards (interposer/src/elastic_board.h has the layout).

One file per GPU in the node's elastic directory, `<GPU uuid>.board`: a slot of 128 bytes per tenant process,
live while its owner holds an OFD lock on the slot's liveness byte. Tenants can write these files, so
everything read here is bounded and validated; the file is read with one bounded read, never mapped.
"""

from __future__ import annotations

import fcntl
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from memslice import errors

SLOTS = 64
SLOT_SIZE = 128
MAGIC = 0x4C45534D
LIVE_OFF = SLOTS * SLOT_SIZE + SLOTS * 16
FILE_SIZE = LIVE_OFF + SLOTS
_SLOT = struct.Struct("<IIiI12Q")  # magic state pid pad; request limit resident swapped idle_ms done_seq
#                                    swap_outs swap_ins swap_out_ns swap_in_ns (+2 of pad2 unread)
STATES = {1: "active", 2: "idle"}


@dataclass(frozen=True)
class Tenant:
    gpu: str
    slot: int
    pid: int
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


def parse_slot(gpu: str, index: int, raw: bytes) -> Tenant | None:
    """One slot's tenant, or None for an empty or malformed slot (pure; raw is the slot's 128 bytes)."""
    if len(raw) < _SLOT.size:
        return None
    f = _SLOT.unpack_from(raw)
    if f[0] != MAGIC or f[1] not in STATES:
        return None
    return Tenant(gpu=gpu, slot=index, pid=f[2], state=STATES[f[1]], request_bytes=f[4], limit_bytes=f[5],
                  resident_bytes=f[6], swapped_bytes=f[7], idle_ms=f[8], swap_outs=f[10], swap_ins=f[11],
                  swap_out_seconds=f[12] / 1e9, swap_in_seconds=f[13] / 1e9)


def _alive(fd: int, index: int) -> bool:
    """Whether slot `index`'s owner holds its liveness lock (an OFD lock probe: never waits)."""
    probe = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, LIVE_OFF + index, 1, 0)
    got = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, probe)
    kind: int = struct.unpack("hhqqi4x", got)[0]
    return kind != fcntl.F_UNLCK


def read_board(path: str | os.PathLike[str]) -> list[Tenant]:
    """The live tenants of one board file."""
    gpu = Path(path).name.removesuffix(".board")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        raw = os.pread(fd, SLOTS * SLOT_SIZE, 0)
        out = []
        for i in range(SLOTS):
            t = parse_slot(gpu, i, raw[i * SLOT_SIZE:(i + 1) * SLOT_SIZE])
            if t is not None and _alive(fd, i):
                out.append(t)
        return out
    finally:
        os.close(fd)


def read_boards(directory: str | os.PathLike[str]) -> list[Tenant]:
    """Every live tenant of every GPU board in an elastic directory (at most 64 boards)."""
    boards = sorted(Path(directory).glob("*.board"))[:64]
    return [t for b in boards if b.is_file() and not b.is_symlink() for t in read_board(b)]


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

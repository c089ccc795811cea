"""The node agent's side of the elastic boards: boards prepared without ever blocking, a board slot
assigned to each elastic container (named in its limits file), and the roster that says which slots are
assigned, with the agent's own figures, so a tenant can neither take a neighbour's slot nor make claims count.

The elastic directory is the agent's: containers see it read-only, with only their own slot file mounted
read-write on top (plugin/response.py), so no tenant can replace a board or the roster, nor write a neighbour's
slot (board version 5).
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Iterable
from pathlib import Path

from memslice import slotfile
from memslice.elastic import FILE_SIZE, SLOTS, RosterEntry, render_roster

from ..ledger import Allocation

log = logging.getLogger(__name__)


def prepare_board(directory: Path, uuid: str) -> None:
    """The board of GPU `uuid` (version 5): a directory `<uuid>.board/` (0755) of one slot file per
    slot (0666; who may write one is decided by what is mounted read-write: its container alone). Opened
    without following a link or blocking on a FIFO; anything else in place (a version 4 board file, a FIFO, a
    symlink) is moved aside first, so no agent start ever hangs or exits on what was left there."""
    slotfile.prepare(directory / f"{uuid}.board", FILE_SIZE)


def prepare(directory: Path, gpu_uuids: Iterable[str]) -> None:
    """The node's elastic directory, 0755 and the agent's, with one board per GPU."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o755)
    for uuid in gpu_uuids:
        prepare_board(directory, uuid)


def assign_slot(alloc: Allocation, ledger: Iterable[Allocation]) -> int:
    """The board slot of a new elastic container (pure): the lowest one no other elastic container of its GPU
    in the agent's ledger holds (a container spanning GPUs: free on every one of its GPUs' boards, so one
    number in its limits file names its slot on each); -1 when the board is full (the container is still
    elastic: it asks its neighbours, it cannot be asked)."""
    mine = set(alloc.uuids())
    taken = {a.elastic_slot for a in ledger
             if a.region_id != alloc.region_id and a.elastic_slot >= 0 and not mine.isdisjoint(a.uuids())}
    return next((i for i in range(SLOTS) if i not in taken), -1)


def roster_of(uuid: str, ledger: Iterable[Allocation]) -> list[RosterEntry]:
    """The roster entries of GPU `uuid` from the agent's ledger (pure)."""
    return [RosterEntry(a.elastic_slot, a.mib, max(a.limit_mib, a.mib), a.priority, a.idle_release)
            for a in ledger if a.on_gpu(uuid) and a.elastic_slot >= 0 and a.limit_mib > a.mib]


def write_roster(directory: Path, uuid: str, ledger: Iterable[Allocation]) -> None:
    """Write GPU `uuid`'s roster atomically (a temporary file renamed over it), mode 0444."""
    data = render_roster(roster_of(uuid, ledger))
    tmp = directory / f".{uuid}.roster.{secrets.token_hex(6)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444)
    try:
        os.write(fd, data)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, directory / f"{uuid}.roster")

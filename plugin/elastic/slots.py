"""The node agent's side of the elastic boards (issue 25): boards prepared without ever blocking, a board slot
assigned to each elastic container (named in its limits file), and the roster that says which slots are
assigned, with the agent's own figures, so a tenant can neither take a neighbour's slot nor make claims count.

The elastic directory is the agent's: containers see it read-only, with only their GPU's board file mounted
read-write on top (plugin/response.py), so no tenant can replace a board or the roster.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from collections.abc import Iterable
from pathlib import Path

from memslice.elastic import SLOTS, RosterEntry, render_roster

from ..ledger import Allocation

log = logging.getLogger(__name__)
_OPEN = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


def prepare_board(directory: Path, uuid: str) -> None:
    """The board of GPU `uuid`: a regular file, mode 0666. Opened without following a link or blocking on a
    FIFO; anything else in its place (FIFO, directory, symlink, socket) is moved aside and a fresh board put
    there by an atomic rename, so no agent start ever hangs or exits on what a tenant left."""
    board = directory / f"{uuid}.board"
    try:
        fd = os.open(board, _OPEN, 0o666)
    except OSError as exc:
        log.warning("elastic board %s is not a regular file (%s); replacing it", board, exc.strerror)
        fd = -1
    if fd >= 0:
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                os.fchmod(fd, 0o666)
                return
        finally:
            os.close(fd)
        log.warning("elastic board %s is not a regular file; replacing it", board)
    tmp = directory / f".{uuid}.board.{secrets.token_hex(6)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    try:
        os.fchmod(fd, 0o666)
    finally:
        os.close(fd)
    try:
        os.replace(tmp, board)
    except IsADirectoryError:  # a directory (or one a tenant filled) in its place: moved aside first
        os.rename(board, directory / f".{uuid}.board.aside.{secrets.token_hex(6)}")
        os.replace(tmp, board)


def prepare(directory: Path, gpu_uuids: Iterable[str]) -> None:
    """The node's elastic directory, 0755 and the agent's, with one board per GPU."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o755)
    for uuid in gpu_uuids:
        prepare_board(directory, uuid)


def assign_slot(alloc: Allocation, ledger: Iterable[Allocation]) -> int:
    """The board slot of a new elastic container (pure): the lowest one no other elastic container of the same
    GPU in the agent's ledger holds; -1 when the board is full (the container is still elastic: it asks its
    neighbours, it cannot be asked)."""
    taken = {a.elastic_slot for a in ledger
             if a.gpu_uuid == alloc.gpu_uuid and a.region_id != alloc.region_id and a.elastic_slot >= 0}
    return next((i for i in range(SLOTS) if i not in taken), -1)


def roster_of(uuid: str, ledger: Iterable[Allocation]) -> list[RosterEntry]:
    """The roster entries of GPU `uuid` from the agent's ledger (pure)."""
    return [RosterEntry(a.elastic_slot, a.mib, max(a.limit_mib, a.mib), a.priority, a.idle_release)
            for a in ledger if a.gpu_uuid == uuid and a.elastic_slot >= 0 and a.limit_mib > a.mib]


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

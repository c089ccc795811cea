"""Per-slot files (interposer/src/slotfile.h, the C side): a directory of one small file per slot, `NN.slot`, each
written only by its slot's owner (the node agent mounts only that file read-write into the owner's container, the
directory and every other file read-only). A slot is live while its owner holds a POSIX *write* lock on the byte
at LIVE_OFF (a read lock, which anyone who can read the file can take, is not a live owner); F_GETLK names the
holder in the reader's PID namespace. Readers use bounded preads only, never mmap (an owner may truncate its
own file). Reusable by any per-GPU board; memslice.elastic's board is the first.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import stat
import struct
from pathlib import Path

SLOTS = 64
LIVE_OFF = 4096
_FLOCK = struct.Struct("hhqqi4x")  # struct flock on 64-bit Linux
_RDONLY = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


def slot_name(i: int) -> str:
    if not 0 <= i < SLOTS:
        raise ValueError(f"slot {i} is not between 0 and {SLOTS - 1}")
    return f"{i:02d}.slot"


def lock_holder(fd: int, offset: int = LIVE_OFF) -> tuple[bool, int]:
    """(held by a write lock, holder PID) for a write-lock probe of one byte (F_GETLK: never waits, takes nothing,
    works on a read-only descriptor). The PID is the kernel's, in this process's PID namespace: 0 when the holder
    is not visible here. A read lock is not a live owner: (False, 0). A probe that fails: (True, 0)."""
    probe = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0)
    try:
        kind, _, _, _, pid = _FLOCK.unpack(fcntl.fcntl(fd, fcntl.F_GETLK, probe))
    except OSError:
        return True, 0
    if kind != fcntl.F_WRLCK:
        return False, 0
    return True, max(int(pid), 0)


def read_slot(directory: str | os.PathLike[str], i: int, size: int) -> tuple[bytes, bool, int] | None:
    """Slot i's first `size` bytes (fewer if its owner truncated it), whether it is live and its holder's PID;
    None when the file is missing or not a regular file. One bounded pread, never a mapping, never blocking."""
    try:
        fd = os.open(Path(directory) / slot_name(i), _RDONLY)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        raw = os.pread(fd, size, 0)
        held, pid = lock_holder(fd)
        return raw, held, pid
    finally:
        os.close(fd)


def prepare(directory: Path, size: int) -> None:
    """The agent's slot directory (0755) with every slot file a regular file of `size` bytes, mode 0666 (the
    mount decides who may write it: its owner's container alone). Anything else in place of the directory or a
    file (a FIFO, a link, a file where the directory goes) is moved aside first, without blocking."""
    try:
        st = os.lstat(directory)
        if not stat.S_ISDIR(st.st_mode):
            os.rename(directory, directory.with_name(f".{directory.name}.aside.{secrets.token_hex(6)}"))
    except FileNotFoundError:
        pass
    directory.mkdir(mode=0o755, exist_ok=True)
    os.chmod(directory, 0o755)
    for i in range(SLOTS):
        path = directory / slot_name(i)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY,
                         0o666)
        except OSError:
            fd = -1
        if fd >= 0:
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    os.fchmod(fd, 0o666)
                    if os.fstat(fd).st_size < size:
                        os.ftruncate(fd, size)
                    continue
            finally:
                os.close(fd)
        os.rename(path, directory / f".{slot_name(i)}.aside.{secrets.token_hex(6)}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        try:
            os.fchmod(fd, 0o666)
            os.ftruncate(fd, size)
        finally:
            os.close(fd)

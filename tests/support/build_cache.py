"""A build output cached across test runs, keyed by the hash of everything that goes into it.

Why: a fixture that builds something slow from unchanged sources (the image prefix: minutes) should build
it once per change, not once per run. The entry is ~/.cache/memslice-tests/<kind>/<digest>/ (XDG_CACHE_HOME
honoured), built in place (a virtualenv's scripts name their own path, so an entry is never moved) and
marked complete only when the build returned. Runs in other checkouts share the cache: a shared lock on the
entry is held while a run uses it, an exclusive one while it is built or pruned, so no run deletes what
another is using, and two runs never build the same entry at once. MEMSLICE_TEST_BUILD_CACHE=0 turns the
cache off (every run builds afresh into a temporary directory).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

KEEP = 3  # entries kept per kind (the newest by last use); older ones are pruned when nobody uses them...
# ...unless used within RECENT_S, up to KEEP_RECENT entries in all (211 MB each for the image): on a machine
# where several checkouts run the tests (each its own digest), three entries were pruned within the hour, so a
# checkout's second `make test` built its prefix again (95 s of a worker, 60 CPU-s).
RECENT_S = 6 * 3600
KEEP_RECENT = 10
SKIP_DIRS = frozenset({"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".hypothesis"})


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "memslice-tests"


def enabled() -> bool:
    return os.environ.get("MEMSLICE_TEST_BUILD_CACHE", "1") != "0"


def tree_digest(root: Path, paths: Iterable[str], skip: Callable[[str], bool], extra: Iterable[str] = ()) -> str:
    """sha256 over the relative path and bytes of every file under root/paths (sorted, links as their
    target's name) that `skip(relative path)` keeps, and the `extra` strings (toolchain versions...)."""
    h = hashlib.sha256()
    for e in extra:
        h.update(b"x\0" + e.encode() + b"\0")
    files: list[str] = []
    for p in paths:
        top = root / p
        if top.is_file():
            files.append(p)
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            rel_dir = os.path.relpath(dirpath, root)
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not skip(os.path.join(rel_dir, d)))
            files.extend(os.path.join(rel_dir, f) for f in filenames)
    for rel in sorted(f for f in files if not skip(f)):
        full = root / rel
        h.update(b"f\0" + rel.encode() + b"\0")
        if full.is_symlink():
            h.update(b"l\0" + os.readlink(full).encode())
        else:
            h.update(hashlib.sha256(full.read_bytes()).digest())
    return h.hexdigest()[:32]


def _lock(fd: int, mode: int, timeout: float, what: str) -> None:
    """flock with a bound: a run that holds the entry longer than `timeout` fails this one, naming it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: locked by another test run for over {timeout:g} s") from None
            time.sleep(0.2)


def last_use(entry: Path) -> float:
    """When a run last used the entry (0 for an incomplete one)."""
    try:
        return (entry / ".complete").stat().st_mtime
    except FileNotFoundError:  # incomplete, or pruned meanwhile by another run
        return 0.0


def to_prune(entries: list[tuple[str, float]], now: float) -> list[str]:
    """Which of the other entries (name, last use) to delete: all but the KEEP - 1 most recently used, and those
    used within RECENT_S up to KEEP_RECENT - 1 (the entry in use is the other one kept)."""
    ranked = sorted(entries, key=lambda e: e[1], reverse=True)
    return [name for i, (name, used) in enumerate(ranked)
            if i >= KEEP - 1 and not (i < KEEP_RECENT - 1 and used > 0 and now - used < RECENT_S)]


def _prune(kind_dir: Path, keep: str) -> None:
    """Delete the entries to_prune names (incomplete ones among them) that no run holds."""
    others = [(d.name, last_use(d)) for d in kind_dir.iterdir() if d.is_dir() and d.name != keep]
    for d in (kind_dir / name for name in to_prune(others, time.time())):
        fd = os.open(kind_dir / f"{d.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(d, ignore_errors=True)
        except BlockingIOError:
            pass  # in use by another run: left for a later prune
        finally:
            os.close(fd)


@contextmanager
def cached_build(kind: str, digest: str, build: Callable[[Path], None], fresh: Path,
                 timeout: float = 900.0) -> Iterator[tuple[Path, bool]]:
    """(entry directory, whether it was built now), held for the with-block. `build(dir)` fills an empty
    directory and raises on failure (the entry then stays incomplete and is rebuilt next time). With the
    cache off, builds into `fresh` instead."""
    if not enabled():
        fresh.mkdir(parents=True, exist_ok=True)
        build(fresh)
        yield fresh, True
        return
    kind_dir = cache_root() / kind
    kind_dir.mkdir(parents=True, exist_ok=True)
    entry, done = kind_dir / digest, kind_dir / digest / ".complete"
    fd = os.open(kind_dir / f"{digest}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        built = False
        _lock(fd, fcntl.LOCK_SH, timeout, f"cache entry {entry}")
        if not done.exists():
            fcntl.flock(fd, fcntl.LOCK_UN)
            _lock(fd, fcntl.LOCK_EX, timeout, f"cache entry {entry}")
            if not done.exists():
                shutil.rmtree(entry, ignore_errors=True)
                entry.mkdir()
                build(entry)
                done.write_text(digest + "\n")
                built = True
            fcntl.flock(fd, fcntl.LOCK_SH)
        os.utime(done)  # last use, for pruning
        _prune(kind_dir, digest)
        yield entry, built
    finally:
        os.close(fd)

"""Host files the agent owns: the installed shim, and one region directory per container.

Layout under the region root (default /var/lib/memslice/regions):
  <region-id>/        mounted read-write at /run/memslice/region in the container; the shim creates
                      memslice.region inside
  <region-id>.json    the agent's record of that allocation (GPU, devices, MiB, owner); not mounted, so
                      the container cannot alter it
  <region-id>.limits  the limits the shim enforces (quota, context reserve, region directory), mounted
                      read-only at /run/memslice/limits: the shim takes them from there, not from the
                      environment a process can change (memslice.limits has the format)
  .trash/             region directories being deleted: `remove` renames a directory here (one rename,
                      whatever the tenant put in it) and the Reaper deletes the contents in the background, in
                      bounded slices, without following symbolic links; what is left at a restart is resumed
"""

from __future__ import annotations

import errno
import json
import logging
import os
import secrets
import stat
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from memslice.compute import CONTAINER_COMPUTE_DIR
from memslice.elastic import CONTAINER_ELASTIC_DIR
from memslice.interposer.region import user_of
from memslice.limits import CONTAINER_LIMITS, Limits
from memslice.limits import write as write_limits

from .elastic.slots import prepare as prepare_boards
from .ledger import REGION_ID, Allocation

log = logging.getLogger(__name__)

SHIM_NAME = "libmemslice.so"
PRELOAD_NAME = "ld.so.preload"
CONTAINER_SHIM = "/usr/local/memslice/lib/libmemslice.so"
CONTAINER_PRELOAD = "/etc/ld.so.preload"
CONTAINER_REGION_DIR = "/run/memslice/region"
CONTAINER_LIMITS_FILE = CONTAINER_LIMITS
# Simulated GPU (--simulate): the node's driver libraries and its state file, as containers see them.
SIM_LIB_NAMES = ("libcuda.so.1", "libnvidia-ml.so.1")
CONTAINER_SIM_LIB_DIR = "/usr/local/memslice/sim/lib"
CONTAINER_SIM_STATE = "/usr/local/memslice/sim/node.state"      # read-only: the node's GPUs and events
CONTAINER_SIM_LOCK = "/usr/local/memslice/sim/node.lock"        # read-write: fcntl locks and the compute timelines
CONTAINER_SIM_PEERS = "/usr/local/memslice/sim/peers"           # read-only: every container's region dir
SIM_USAGE_NAME = "sim.usage"  # a container's own simulated usage, in its (read-write) region dir
# The node's driver libraries, mounted read-only here from the files the agent resolved at start; the limits
# file names them (nvml_path, cuda_path) so no tenant's copy answers the shim.
CONTAINER_DRIVER_DIR = "/usr/local/memslice/driver"


def _atomic_write(path: Path, data: bytes, mode: int) -> None:
    """Write to a temporary file in the same directory, then rename over `path` (readers never see half)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def install_shim(source: str, host_dir: Path) -> Path:
    """Copy the shim into `host_dir` atomically and write the ld.so.preload file beside it."""
    host_dir.mkdir(parents=True, exist_ok=True)
    target = host_dir / SHIM_NAME
    _atomic_write(target, Path(source).read_bytes(), 0o755)
    _atomic_write(host_dir / PRELOAD_NAME, f"{CONTAINER_SHIM}\n".encode(), 0o644)
    return target


def install_sim_driver(source_dir: Path, state: Path) -> Path:
    """Give containers the simulated driver: copy its libraries atomically into `<state dir>/simlib`, keep the
    node's description readable by any container user but writable only here, and create the node lock
    file (any user may lock and write it: the locks, and the GPUs' compute timelines, which every reader
    validates). Containers write only their own usage (in their region dir)."""
    lib_dir = state.parent / "simlib"
    lib_dir.mkdir(parents=True, exist_ok=True)
    for name in SIM_LIB_NAMES:
        _atomic_write(lib_dir / name, (source_dir / name).read_bytes(), 0o755)
    os.chmod(state, 0o644)
    lock = sim_lock_path(state)
    lock.touch(exist_ok=True)
    os.chmod(lock, 0o666)
    return lib_dir


def sim_lock_path(state: Path) -> Path:
    """The node lock beside the description (the simulator's default, <state>.lock)."""
    return state.with_name(state.name + ".lock")


TRASH = ".trash"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def _open_dir(name: str, dir_fd: int) -> int | None:
    """A descriptor of directory `name` under dir_fd, never through a symbolic link; None if it is not a
    directory (or is gone)."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None
        raise


def _unlink_entry(name: str, dir_fd: int) -> None:
    """Remove a non-directory entry (a symbolic link itself, never its target)."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except IsADirectoryError:  # replaced by a directory meanwhile: the next slice treats it as one
        pass


def _empty_item(item: str, trash_fd: int, budget: int) -> tuple[int, bool]:
    """Delete up to `budget` entries of one trash item; (entries removed, item gone)."""
    fd = _open_dir(item, trash_fd)
    if fd is None:  # not a directory (or a link to one): the entry itself goes
        _unlink_entry(item, trash_fd)
        return 1, True
    done = 0
    try:
        with os.scandir(fd) as it:
            for e in it:
                if done >= budget:
                    return done, False
                if e.is_dir(follow_symlinks=False):
                    os.rename(e.name, f"d.{secrets.token_hex(8)}", src_dir_fd=fd, dst_dir_fd=trash_fd)
                else:
                    _unlink_entry(e.name, fd)
                done += 1
    finally:
        os.close(fd)
    try:
        os.rmdir(item, dir_fd=trash_fd)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno != errno.ENOTEMPTY:  # ENOTEMPTY: something was added meanwhile; the next pass
            raise
        return done, False
    return done + 1, True


def delete_slice(trash_fd: int, budget: int) -> tuple[int, bool]:
    """Delete at most about `budget` entries under the trash directory; (entries removed, trash now empty).

    Depth is always one: a subdirectory met inside a trash item is renamed up to the top of the trash (same
    filesystem, one renameat) and deleted as an item of its own, so a tree of any depth needs no recursion
    and no descriptor per level. Nothing is followed: directories are opened with O_NOFOLLOW relative to
    their parent's descriptor, and anything that is not a directory (a symbolic link to anywhere on the host
    included) is unlinked itself. A directory swapped for a link during the walk fails the
    O_DIRECTORY|O_NOFOLLOW open and is unlinked as a link. Directories are read lazily (never listed whole),
    and the walk keeps no state: a restart simply calls it again."""
    done = 0
    while done < budget:
        before = done
        with os.scandir(trash_fd) as top:
            for e in top:
                n, _ = _empty_item(e.name, trash_fd, budget - done)
                done += n
                if done >= budget:
                    return done, False
        if done == before:  # a pass over the whole trash found nothing: empty (or nothing removable)
            with os.scandir(trash_fd) as top:
                return done, next(iter(top), None) is None
    return done, False


class Reaper:
    """Deletes what RegionStore.remove put in the trash, in the background: `slice_entries` entries at a time,
    with a pause between slices, so neither the reconcile loop nor Allocate ever waits on a tenant's files
    (a tenant can create millions). Started with the agent: trash left by a previous run is resumed."""

    def __init__(self, root: Path, slice_entries: int = 2000, pause_s: float = 0.005) -> None:
        self.trash = root / TRASH
        self.slice_entries = slice_entries
        self.pause_s = pause_s
        self.removed = 0  # entries deleted since start (a counter for /metrics)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="region-reaper", daemon=True)
        self._failing: str | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def wake(self) -> None:
        self._wake.set()

    def pending(self, at_most: int = 10_000) -> int:
        """Top-level items waiting in the trash, counted up to `at_most` (0 when there is no trash)."""
        n = 0
        try:
            with os.scandir(self.trash) as it:
                for _ in it:
                    n += 1
                    if n >= at_most:
                        break
        except OSError:
            pass
        return n

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            empty = self._drain()
            # an empty trash waits for the next remove; a failing one retries at a slow pace
            self._wake.wait(None if empty else 10.0)

    def _drain(self) -> bool:
        """Delete slices until the trash is empty (True) or stops shrinking (False: logged, retried later)."""
        while not self._stop.is_set():
            try:
                fd = os.open(self.trash, _DIR_FLAGS)
            except FileNotFoundError:
                return True
            except OSError as exc:
                return self._failed(f"cannot open {self.trash}: {exc.strerror}")
            try:
                n, empty = delete_slice(fd, self.slice_entries)
            except OSError as exc:
                return self._failed(f"cannot delete under {self.trash}: {exc}")
            finally:
                os.close(fd)
            self.removed += n
            if empty:
                if self._failing:
                    log.info("region trash %s is empty again", self.trash)
                self._failing = None
                return True
            if n == 0:
                return self._failed(f"nothing under {self.trash} could be deleted")
            self._stop.wait(self.pause_s)  # yield the disk and the GIL between slices
        return True

    def _failed(self, why: str) -> bool:
        if why != self._failing:
            log.warning("%s; retrying every 10 s (remove it by hand if it persists)", why)
        self._failing = why
        return False


@dataclass(frozen=True)
class DirUsage:
    """What a region directory holds, counted by a bounded walk (lower bounds when `complete` is False)."""

    entries: int
    bytes: int  # allocated on disk (st_blocks), not apparent sizes: a sparse file costs what it uses
    complete: bool


@dataclass
class _Budget:
    left: int
    truncated: bool = False


def _walk(fd: int, budget: _Budget, depth: int) -> Iterator[os.stat_result]:
    """lstat results of the entries under the directory fd, a level at a time, while the budget lasts."""
    subdirs = []
    with os.scandir(fd) as it:
        for e in it:
            if budget.left <= 0:
                budget.truncated = True
                return
            budget.left -= 1
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            yield st
            if stat.S_ISDIR(st.st_mode):
                subdirs.append(e.name)
    if depth <= 1:
        budget.truncated |= bool(subdirs)  # deeper than we look: the figures are lower bounds
        return
    for name in subdirs:
        sub = _open_dir(name, fd)
        if sub is not None:
            try:
                yield from _walk(sub, budget, depth - 1)
            finally:
                os.close(sub)


def dir_usage(path: Path, max_entries: int = 1024, max_depth: int = 8) -> DirUsage:
    """Entries and disk bytes under a region directory, visiting at most `max_entries` entries and
    `max_depth` levels without following a symbolic link: a scrape stays cheap whatever a tenant created."""
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError:
        return DirUsage(0, 0, True)
    budget = _Budget(max_entries)
    entries = size = 0
    try:
        for st in _walk(fd, budget, max_depth):
            entries += 1
            size += st.st_blocks * 512
    finally:
        os.close(fd)
    return DirUsage(entries, size, not budget.truncated)


def compute_keys(alloc: Allocation) -> dict[str, Any]:
    """The compute-share fields of the container's limits file: its share, its GPU's compute
    directory as mounted in the container, its slot and priority; none without a provisioned slot."""
    if alloc.compute_slot < 0:
        return {}
    return {"gpu_compute_request": alloc.compute_request, "gpu_compute_limit": alloc.compute_limit or None,
            "compute_dir": CONTAINER_COMPUTE_DIR, "compute_slot": alloc.compute_slot, "priority": alloc.priority}


def prepare_elastic_dir(directory: Path, gpu_uuids: list[str]) -> None:
    """The node's elastic directory (mounted read-only at CONTAINER_ELASTIC_DIR in elastic containers, their
    GPU's board read-write on top) with one board per GPU, mode 0666 whatever the container's user: the
    directory itself is 0755 (only the agent adds or replaces boards and rosters). Never blocks on what is
    there (plugin/elastic/slots.py). The agent reads the boards only for metrics (bounded reads)."""
    prepare_boards(directory, gpu_uuids)


class RegionStore:
    def __init__(self, root: Path, idle_after_s: float = 300.0) -> None:
        self.root = root
        self.reaper = Reaper(root)
        self.idle_after_s = idle_after_s  # elastic containers' idle_after (node-agent --idle-after)
        # the driver libraries as containers see them (nvml_path, cuda_path), set by the agent at start
        self.nvml_path: str | None = None
        self.cuda_path: str | None = None

    def prepare(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    def dir_of(self, region_id: str) -> Path:
        return self.root / region_id

    def limits_of(self, region_id: str) -> Path:
        return self.root / f"{region_id}.limits"

    def create(self, alloc: Allocation) -> Path:
        """Create (or keep, for a re-sent request) the region directory and record the allocation."""
        d = self.dir_of(alloc.region_id)
        d.mkdir(exist_ok=True)
        # Any user of the container must be able to create the region file; only this container mounts it.
        os.chmod(d, 0o1777)
        write_limits(self.limits_of(alloc.region_id), self.limits(alloc))
        self.save(alloc)
        return d

    def limits(self, alloc: Allocation) -> Limits:
        """The quota; elastic (the limit, the request guaranteed in HBM) when the limit is above the request;
        oversubscription always stated (off unless the pod's annotation asked), so no process turns it on or
        raises its cap through its environment."""
        over = alloc.spill is not None
        cap = alloc.spill if alloc.spill is not None and alloc.spill >= 0 else None
        return replace(self._memory_limits(alloc, over, cap), **compute_keys(alloc))

    def _memory_limits(self, alloc: Allocation, over: bool, cap: int | None) -> Limits:
        if alloc.limit_mib > alloc.mib:
            return Limits(gpu_mem_bytes=alloc.limit_mib << 20, region_dir=CONTAINER_REGION_DIR,
                          gpu_mem_request_bytes=alloc.mib << 20, elastic_dir=CONTAINER_ELASTIC_DIR,
                          idle_after_s=self.idle_after_s, oversubscribe=over, host_spill_limit_bytes=cap,
                          elastic_slot=alloc.elastic_slot if alloc.elastic_slot >= 0 else None,
                          idle_release=alloc.idle_release, priority=alloc.priority,
                          nvml_path=self.nvml_path, cuda_path=self.cuda_path)
        return Limits(gpu_mem_bytes=alloc.mib << 20, region_dir=CONTAINER_REGION_DIR, oversubscribe=over,
                      host_spill_limit_bytes=cap, nvml_path=self.nvml_path, cuda_path=self.cuda_path)

    def save(self, alloc: Allocation) -> None:
        _atomic_write(self.root / f"{alloc.region_id}.json", json.dumps(asdict(alloc)).encode(), 0o644)

    def remove(self, region_id: str) -> None:
        """Forget a region in constant time: the record and limits are unlinked, the directory (whatever a
        tenant put in it) is renamed into the trash, which the Reaper empties in the background."""
        if not REGION_ID.match(region_id):  # never remove anything the agent did not name
            raise ValueError(f"refusing to remove {region_id!r}: not a region ID")
        # the record first: a directory left behind without one is swept as an orphan later
        (self.root / f"{region_id}.json").unlink(missing_ok=True)
        self.limits_of(region_id).unlink(missing_ok=True)
        trash = self.root / TRASH
        trash.mkdir(mode=0o700, exist_ok=True)
        try:
            os.rename(self.dir_of(region_id), trash / f"{region_id}.{secrets.token_hex(6)}")
        except FileNotFoundError:
            return
        except OSError as exc:  # left in place: without a record it is retried as an orphan
            log.warning("cannot move region directory %s to %s: %s; retried at the next sweep",
                        self.dir_of(region_id), trash, exc.strerror)
            return
        self.reaper.wake()

    def user(self, region_id: str) -> int | None:
        """The PID of a live process using the region (0: one does, its PID not visible here), or None
        (memslice.interposer.region.user_of: a write lock only a live process of the container can hold)."""
        if not REGION_ID.match(region_id):
            raise ValueError(f"refusing to look at {region_id!r}: not a region ID")
        return user_of(self.dir_of(region_id))

    def load(self) -> dict[str, Allocation]:
        """The recorded allocations (a record that cannot be read is logged and skipped)."""
        out = {}
        for meta in sorted(self.root.glob("*.json")):
            if not REGION_ID.match(meta.stem):
                continue
            try:
                raw = json.loads(meta.read_text())
                raw["device_ids"] = tuple(raw["device_ids"])
                raw["more_gpus"] = tuple((int(i), str(u)) for i, u in raw.get("more_gpus", ()))
                alloc = Allocation(**raw)
            except (OSError, ValueError, TypeError, KeyError) as exc:
                log.warning("region record %s cannot be read (%s); it will be rebuilt from the kubelet's "
                            "PodResources or removed", meta, exc)
                continue
            out[alloc.region_id] = alloc
        return out

    def directories(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and REGION_ID.match(p.name))

"""Host files the agent owns: the installed shim, and one region directory per container.

Layout under the region root (default /var/lib/memslice/regions):
  <region-id>/        mounted read-write at /run/memslice/region in the container; the shim creates
                      memslice.region inside
  <region-id>.json    the agent's record of that allocation (GPU, devices, MiB, owner); not mounted, so
                      the container cannot alter it
  <region-id>.limits  the limits the shim enforces (quota, context reserve, region directory), mounted
                      read-only at /run/memslice/limits: the shim takes them from there, not from the
                      environment a process can change (memslice.limits has the format)
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

from memslice.elastic import CONTAINER_ELASTIC_DIR
from memslice.limits import CONTAINER_LIMITS, Limits
from memslice.limits import write as write_limits
from memslice.plugin.ledger import REGION_ID, Allocation

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
CONTAINER_SIM_LOCK = "/usr/local/memslice/sim/node.lock"        # read-write, used only for fcntl locks
CONTAINER_SIM_PEERS = "/usr/local/memslice/sim/peers"           # read-only: every container's region dir
SIM_USAGE_NAME = "sim.usage"  # a container's own simulated usage, in its (read-write) region dir


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
    file (content-free, any user may lock it). Containers write only their own usage (in their region dir)."""
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


def prepare_elastic_dir(directory: Path, gpu_uuids: list[str]) -> None:
    """The node's elastic directory (mounted read-write at CONTAINER_ELASTIC_DIR in elastic containers) with
    one board per GPU created here, mode 0666 whatever the container's user, so tenants never create files:
    the directory itself is 0755 (only the agent adds or replaces boards). The agent reads them only for metrics
    (plugin/elastic_metrics.py, bounded reads)."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o755)
    for uuid in gpu_uuids:
        board = directory / f"{uuid}.board"
        fd = os.open(board, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        try:
            os.fchmod(fd, 0o666)
        finally:
            os.close(fd)


class RegionStore:
    def __init__(self, root: Path, idle_after_s: float = 300.0) -> None:
        self.root = root
        self.idle_after_s = idle_after_s  # elastic containers' idle_after (node-agent --idle-after)

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
        """The quota; elastic (the limit, the request guaranteed in HBM) when the limit is above the request."""
        if alloc.limit_mib > alloc.mib:
            return Limits(gpu_mem_bytes=alloc.limit_mib << 20, region_dir=CONTAINER_REGION_DIR,
                          gpu_mem_request_bytes=alloc.mib << 20, elastic_dir=CONTAINER_ELASTIC_DIR,
                          idle_after_s=self.idle_after_s)
        return Limits(gpu_mem_bytes=alloc.mib << 20, region_dir=CONTAINER_REGION_DIR)

    def save(self, alloc: Allocation) -> None:
        _atomic_write(self.root / f"{alloc.region_id}.json", json.dumps(asdict(alloc)).encode(), 0o644)

    def remove(self, region_id: str) -> None:
        if not REGION_ID.match(region_id):  # never rmtree anything the agent did not name
            raise ValueError(f"refusing to remove {region_id!r}: not a region ID")
        # the record first: a directory left behind without one is swept as an orphan later
        (self.root / f"{region_id}.json").unlink(missing_ok=True)
        self.limits_of(region_id).unlink(missing_ok=True)
        shutil.rmtree(self.dir_of(region_id), ignore_errors=True)

    def load(self) -> dict[str, Allocation]:
        """The recorded allocations (a record that cannot be read is logged and skipped)."""
        out = {}
        for meta in sorted(self.root.glob("*.json")):
            if not REGION_ID.match(meta.stem):
                continue
            try:
                raw = json.loads(meta.read_text())
                raw["device_ids"] = tuple(raw["device_ids"])
                alloc = Allocation(**raw)
            except (OSError, ValueError, TypeError, KeyError) as exc:
                log.warning("region record %s cannot be read (%s); it will be rebuilt from the kubelet's "
                            "PodResources or removed", meta, exc)
                continue
            out[alloc.region_id] = alloc
        return out

    def directories(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and REGION_ID.match(p.name))

"""The Allocate response for one container: env, mounts and GPU visibility (see the architecture doc)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from memslice.compute import CONTAINER_COMPUTE_DIR
from memslice.elastic import CONTAINER_ELASTIC_DIR, SLOTS, board_slot_path

from .regions import (
    CONTAINER_LIMITS_FILE,
    CONTAINER_PRELOAD,
    CONTAINER_REGION_DIR,
    CONTAINER_SHIM,
    CONTAINER_SIM_LIB_DIR,
    CONTAINER_SIM_LOCK,
    CONTAINER_SIM_PEERS,
    CONTAINER_SIM_STATE,
    PRELOAD_NAME,
    SHIM_NAME,
    SIM_USAGE_NAME,
    sim_lock_path,
)


@dataclass(frozen=True)
class ResponseConfig:
    shim_host_dir: Path
    preload: str = "file"       # "file": mount ld.so.preload; "env": set LD_PRELOAD
    visibility: str = "env"     # "env": NVIDIA_VISIBLE_DEVICES=<uuid>; "cdi": CDI device <cdi_kind>=<uuid>
    cdi_kind: str = "nvidia.com/gpu"
    sim_lib_dir: Path | None = None   # --simulate: host dir of the simulated libcuda/libnvidia-ml
    sim_state: Path | None = None     # --simulate: the node's simulator state file
    elastic_host_dir: Path | None = None  # the node's elastic directory (--elastic-dir)
    idle_after_s: float = 300.0           # --idle-after
    driver_libs: tuple[tuple[str, str], ...] = ()  # (container path, host file): the node's driver, read-only
    compute_host_dir: Path | None = None  # the node's compute directory (--compute-dir)


@dataclass(frozen=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True)
class Edits:
    """What a container gets, in neither kubelet API's wire form: Allocate wraps it in its protobuf
    (plugin/deviceplugin/server.py container_response), DRA writes it as a CDI device's containerEdits
    (plugin/dra/cdi.py)."""

    envs: dict[str, str]
    mounts: tuple[Mount, ...]
    cdi_devices: tuple[str, ...]  # fully qualified CDI device names the runtime must add (--visibility cdi)


def container_edits(uuids: Sequence[str], mib: int, region_host_dir: Path, cfg: ResponseConfig, limit_mib: int = 0,
                    elastic_slot: int = -1, compute_slot: int = -1) -> Edits:
    """Env and mounts of a container holding `mib` MiB (its quota per GPU) on the GPUs `uuids` (device order:
    a container spanning GPUs sees them as devices 0..N-1), its region directory, its elastic limit per GPU
    and board slot, its compute slot (one number, free on each of its GPUs)."""
    # The env states the quota for people and older shims; the shim enforces the read-only limits file
    # (RegionStore.create wrote it beside the region directory), which a process cannot change.
    envs = {"MEMSLICE_GPU_MEM_LIMIT": str(mib), "MEMSLICE_REGION_DIR": CONTAINER_REGION_DIR}
    mounts = [Mount(container_path=CONTAINER_SHIM, host_path=str(cfg.shim_host_dir / SHIM_NAME),
                            read_only=True),
              Mount(container_path=CONTAINER_REGION_DIR, host_path=str(region_host_dir),
                            read_only=False),
              Mount(container_path=CONTAINER_LIMITS_FILE,
                            host_path=str(region_host_dir.parent / f"{region_host_dir.name}.limits"),
                            read_only=True)]
    if limit_mib > mib and cfg.elastic_host_dir is not None:
        # Elastic memory: the limit is the quota, the request (what was scheduled) is guaranteed in HBM; the
        # node's boards are shared by every elastic container of the node (docs/architecture.md)
        envs.update(MEMSLICE_GPU_MEM_LIMIT=str(limit_mib), MEMSLICE_GPU_MEM_REQUEST=f"{mib}MiB",
                    MEMSLICE_ELASTIC_DIR=CONTAINER_ELASTIC_DIR, MEMSLICE_IDLE_AFTER=f"{cfg.idle_after_s:g}")
        # the directory (every GPU's board, every slot file, the rosters) read-only, so no
        # tenant can replace a board or a roster, nor write a neighbour's slot; only this container's own slot
        # file read-write on top of it (none assigned, the board full: it can neither ask nor be asked)
        mounts.append(Mount(container_path=CONTAINER_ELASTIC_DIR, host_path=str(cfg.elastic_host_dir),
                                    read_only=True))
        for uuid in uuids if 0 <= elastic_slot < SLOTS else ():  # its slot on each of its GPUs' boards
            own = board_slot_path(uuid, elastic_slot)
            mounts.append(Mount(container_path=f"{CONTAINER_ELASTIC_DIR}/{own}",
                                        host_path=str(cfg.elastic_host_dir / own), read_only=False))
    for uuid in uuids if compute_slot >= 0 and cfg.compute_host_dir is not None else ():
        # the GPU's compute directory (roster, every neighbour's slot) read-only, only this
        # container's own slot file writable on top of it (a tenant writes only its own slot); a container
        # spanning GPUs: the same slot number on each of its GPUs
        assert cfg.compute_host_dir is not None
        gpu = f"{CONTAINER_COMPUTE_DIR}/{uuid}"
        host = cfg.compute_host_dir / uuid
        mounts.append(Mount(container_path=gpu, host_path=str(host), read_only=True))
        mounts.append(Mount(container_path=f"{gpu}/slot-{compute_slot:02d}",
                                    host_path=str(host / f"slot-{compute_slot:02d}"), read_only=False))
    mounts += [Mount(container_path=c, host_path=h, read_only=True) for c, h in cfg.driver_libs]
    if cfg.preload == "env":
        envs["LD_PRELOAD"] = CONTAINER_SHIM
    else:
        mounts.append(Mount(container_path=CONTAINER_PRELOAD,
                                    host_path=str(cfg.shim_host_dir / PRELOAD_NAME), read_only=True))
    if cfg.sim_lib_dir is not None and cfg.sim_state is not None:
        # The simulated driver stands in for the one the NVIDIA runtime would mount. What a container can
        # write is apart from what the others read: the node's description is read-only, the container's own
        # usage lives in its region dir, the other containers' usage is read (validated) through a read-only
        # view of the region root, and the node lock holds only fcntl locks and the GPUs' compute timelines
        # (one shared simulated GPU; every reader validates them).
        ro = [(CONTAINER_SIM_LIB_DIR, cfg.sim_lib_dir), (CONTAINER_SIM_STATE, cfg.sim_state),
              (CONTAINER_SIM_PEERS, region_host_dir.parent)]
        mounts += [Mount(container_path=c, host_path=str(h), read_only=True) for c, h in ro]
        mounts.append(Mount(container_path=CONTAINER_SIM_LOCK, host_path=str(sim_lock_path(cfg.sim_state)),
                                    read_only=False))
        envs.update(LD_LIBRARY_PATH=CONTAINER_SIM_LIB_DIR, MEMSLICE_SIM_STATE=CONTAINER_SIM_STATE,
                    MEMSLICE_SIM_USAGE=f"{CONTAINER_REGION_DIR}/{SIM_USAGE_NAME}",
                    MEMSLICE_SIM_PEERS=CONTAINER_SIM_PEERS, MEMSLICE_SIM_LOCK=CONTAINER_SIM_LOCK)
    cdi: tuple[str, ...] = ()
    if cfg.visibility == "cdi":
        cdi = tuple(f"{cfg.cdi_kind}={uuid}" for uuid in uuids)
    else:
        envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(uuids)
    return Edits(envs=envs, mounts=tuple(mounts), cdi_devices=cdi)

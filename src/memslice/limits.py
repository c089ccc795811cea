"""The limits file: the limits the shim enforces, in a file the container's processes cannot change.

The node agent's Allocate mounts it read-only at CONTAINER_LIMITS; `memslice run` writes LIMITS_FILE in
its region directory before the command starts. Where the shim finds one, the environment's values for
what it sets are ignored (docs/architecture.md, "Limits file", has the format and the rules).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

CONTAINER_LIMITS = "/run/memslice/limits"  # the shim's fixed path for the agent's file (MS_LIMITS_PATH)
LIMITS_FILE = "memslice.limits"             # its name in a region directory (MS_LIMITS_FILE)
MAX_BYTES = 4096                            # the shim refuses a larger file (MS_LIMITS_MAX)
MiB = 1 << 20


@dataclass(frozen=True)
class Limits:
    gpu_mem_bytes: int
    context_reserve_bytes: int | None = None   # None: the shim's default (300 MiB), whatever the env says
    oversubscribe: bool | None = None          # None: oversubscription is left to the environment
    host_spill_limit_bytes: int | None = None  # with oversubscribe: None = no cap; 0 = nothing spills
    region_dir: str | None = None              # required in the agent's file, absent in `memslice run`'s
    gpu_mem_request_bytes: int | None = None   # elastic memory: guaranteed in HBM; on when < gpu_mem_bytes
    elastic_dir: str | None = None             # elastic memory: the node's per-GPU arbitration boards
    idle_after_s: float | None = None          # elastic memory: idle after this long without a CUDA call
    elastic_slot: int | None = None            # elastic memory: the board slot the agent assigned (0..63)
    idle_release: bool = False                 # elastic memory: idle, the request may move too
    priority: int = 0                          # elastic memory: the pod's PriorityClass value
    nvml_path: str | None = None               # the node's libnvidia-ml.so.1 as the container sees it
    cuda_path: str | None = None               # the node's libcuda.so.1 as the container sees it
    gpu_compute_request: int | None = None     # compute share: percent of one GPU, 0..100
    gpu_compute_limit: int | None = None       # compute share: cap in percent 1..100 (None: no cap)
    compute_dir: str | None = None             # compute share: the node's per-GPU arbitration directory
    compute_slot: int | None = None            # compute share: the slot the provisioner assigned (0..63)


def _size(n: int) -> str:
    return f"{n // MiB}MiB" if n % MiB == 0 else f"{n}B"


def _elastic_lines(limits: Limits) -> list[str]:
    """The elastic-memory keys (docs/architecture.md, "Elastic memory"), validated."""
    req = limits.gpu_mem_request_bytes
    if req is None:
        return []
    if not 0 < req <= limits.gpu_mem_bytes:
        raise ValueError(f"the GPU memory request ({req // MiB} MiB) must be more than 0 and at most the limit "
                         f"({limits.gpu_mem_bytes // MiB} MiB)")
    lines = [f"gpu_mem_request={_size(req)}"]
    if req < limits.gpu_mem_bytes and not limits.elastic_dir:
        raise ValueError("a request below the limit (elastic memory) needs elastic_dir")
    if limits.elastic_dir:
        lines.append(f"elastic_dir={limits.elastic_dir}")
    if limits.idle_after_s is not None:
        if not 0 <= limits.idle_after_s <= 604800:
            raise ValueError(f"idle_after={limits.idle_after_s} is not between 0 and 604800 seconds")
        lines.append(f"idle_after={limits.idle_after_s:g}")
    if limits.elastic_slot is not None:
        if not 0 <= limits.elastic_slot < 64:
            raise ValueError(f"elastic_slot={limits.elastic_slot} is not between 0 and 63")
        lines.append(f"elastic_slot={limits.elastic_slot}")
    if limits.idle_release:
        lines.append("idle_release=1")
    return lines


def _compute_lines(limits: Limits) -> list[str]:
    """The compute-share keys (docs/architecture.md, "Compute share"), validated by src/memslice/compute.py."""
    from .compute import SLOTS, check_share

    lines = []
    if limits.gpu_compute_request is not None or limits.gpu_compute_limit is not None:
        share = check_share(limits.gpu_compute_request or 0, limits.gpu_compute_limit, "gpu_compute_request:limit")
        lines.append(f"gpu_compute_request={share.request}")
        if share.limit is not None:
            lines.append(f"gpu_compute_limit={share.limit}")
    if limits.compute_dir is not None:
        if not limits.compute_dir.startswith("/") or "\n" in limits.compute_dir:
            raise ValueError(f"compute_dir={limits.compute_dir!r} is not an absolute path")
        lines.append(f"compute_dir={limits.compute_dir}")
    if limits.compute_slot is not None:
        if not 0 <= limits.compute_slot < SLOTS:
            raise ValueError(f"compute_slot={limits.compute_slot} is not between 0 and {SLOTS - 1}")
        lines.append(f"compute_slot={limits.compute_slot}")
    return lines


MAX_LIB_PATH = 255  # the shim's bound on nvml_path/cuda_path (shim_config's nvml_path[256])


def lib_path_problem(key: str, path: str) -> str | None:
    """Why `path` cannot be a driver library key's value (the shim's rule: absolute, at most MAX_LIB_PATH
    characters, no `..` component, nothing a key=value line cannot hold), or None. Pure: whether the file
    exists is the shim's check, in the container's view."""
    if not path.startswith("/"):
        return f"{key}={path[:64]!r} is not an absolute path"
    if len(path.encode()) > MAX_LIB_PATH:
        return f"{key} is {len(path.encode())} bytes long; at most {MAX_LIB_PATH}"
    if ".." in path.split("/"):
        return f"{key}={path[:64]!r} has a .. component"
    if any(c in path for c in "\n\r\0") or path != path.strip():
        return f"{key}={path[:64]!r} holds a line break, a NUL or surrounding blanks"
    return None


DRIVER_SONAMES = ("libnvidia-ml.so.1", "libcuda.so.1")  # what nvml_path and cuda_path name


def mapped_library(maps: str, soname: str) -> str | None:
    """The file a process mapped for the library `soname` (libnvidia-ml.so.1 matches libnvidia-ml.so.580.65),
    from its /proc/<pid>/maps text; None when none is mapped. Pure: the agent and `memslice run` read their
    own maps after loading the driver."""
    stem = soname.rsplit(".so", 1)[0] + ".so"
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/"):
            name = os.path.basename(parts[5])
            if name == soname or (name.startswith(stem + ".") and name[len(stem) + 1:][:1].isdigit()):
                return parts[5]
    return None


def own_mapped_libraries(sonames: tuple[str, ...] = DRIVER_SONAMES) -> dict[str, str]:
    """The real paths of the driver libraries this process has loaded, by soname (read from /proc/self/maps,
    at most 4 MiB of it); a library not loaded is left out."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            maps = f.read(4 << 20)
    except OSError:
        return {}
    found = {soname: mapped_library(maps, soname) for soname in sonames}
    return {soname: os.path.realpath(path) for soname, path in found.items() if path}


def _driver_lines(limits: Limits) -> list[str]:
    """The driver library keys: the libraries the shim loads and measures with."""
    lines = []
    for key, path in (("nvml_path", limits.nvml_path), ("cuda_path", limits.cuda_path)):
        if path is None:
            continue
        problem = lib_path_problem(key, path)
        if problem:
            raise ValueError(problem)
        lines.append(f"{key}={path}")
    return lines


def render(limits: Limits) -> str:
    """The file's text: `key=value` lines, sizes with a binary unit."""
    if limits.host_spill_limit_bytes is not None and limits.oversubscribe is None:
        raise ValueError("host_spill_limit needs oversubscribe")
    lines = ["# memslice limits: written before the container started; read-only to it",
             f"gpu_mem_limit={_size(limits.gpu_mem_bytes)}"]
    if limits.context_reserve_bytes is not None:
        lines.append(f"context_reserve={_size(limits.context_reserve_bytes)}")
    if limits.oversubscribe is not None:
        lines.append(f"oversubscribe={int(limits.oversubscribe)}")
    if limits.host_spill_limit_bytes is not None:
        lines.append(f"host_spill_limit={_size(limits.host_spill_limit_bytes)}")
    if limits.region_dir is not None:
        lines.append(f"region_dir={limits.region_dir}")
    lines.extend(_elastic_lines(limits))
    if limits.priority:
        lines.append(f"priority={max(min(limits.priority, 2**31 - 1), -(2**31))}")
    lines.extend(_compute_lines(limits))
    lines.extend(_driver_lines(limits))
    text = "\n".join(lines) + "\n"
    if len(text.encode()) > MAX_BYTES:
        raise ValueError(f"limits file of {len(text)} bytes is over {MAX_BYTES}")
    return text


def write(path: Path, limits: Limits) -> None:
    """Write the file atomically (a temporary file renamed over `path`), mode 0444."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(render(limits))
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o444)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

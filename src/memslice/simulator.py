"""The simulated GPU from Python: environment for processes that should use it, and its controls."""

from __future__ import annotations

import ctypes
import hashlib
import os
import tempfile

from .paths import lib_paths
from .sizes import SizeError, parse_size, size_hint

MAX_SIM_GPU = 16 << 40  # bytes: no GPU made has a tenth of it; a larger simulated GPU is a typo


def default_state_path(gpus: str) -> str:
    """One simulated node per GPU list: the same `--simulate-gpu` value shares one node (and its usage)."""
    digest = hashlib.sha256(gpus.encode()).hexdigest()[:12]
    return os.path.join(tempfile.gettempdir(), f"memslice-sim-{os.getuid()}-{digest}.state")


def state_files() -> list[str]:
    """This user's simulated nodes, newest first: every state file a default path can name (`memslice run
    --simulate-gpu` makes one per GPU list; a bare process under the simulated driver uses the C default)."""
    import glob

    found = [p for p in glob.glob(os.path.join(tempfile.gettempdir(), f"memslice-sim-{os.getuid()}*.state"))
             if os.path.isfile(p) and not os.path.islink(p)]
    return sorted(found, key=lambda p: -os.stat(p).st_mtime)


def state_path(env: dict[str, str] | None = None) -> str:
    """The state file a process with this environment uses (the C default when MEMSLICE_SIM_STATE is unset)."""
    env = dict(os.environ) if env is None else env
    return env.get("MEMSLICE_SIM_STATE") or os.path.join("/tmp", f"memslice-sim-{os.getuid()}.state")


def usage_path(state: str, env: dict[str, str] | None = None) -> str:
    """The usage region of the processes with this environment (physical usage; the C default is
    <state>.usage). Locally every process shares it; in a cluster each container has its own."""
    env = dict(os.environ) if env is None else env
    return env.get("MEMSLICE_SIM_USAGE") or f"{state}.usage"


def validate_gpus(spec: str) -> None:
    """Raise ValueError naming the bad entry unless spec is SIZE[:NUMA][:mig](,…)."""
    if not spec.strip():
        raise ValueError("the simulated GPU list is empty; give each GPU's size, e.g. --simulate-gpu 16GiB")
    for item in spec.split(","):
        parts = item.split(":")
        try:
            size = parse_size(parts[0], allow_zero=True)
        except SizeError:
            raise SizeError(f"simulated GPU {parts[0]!r} (in {spec!r}) is not a GPU size{size_hint(parts[0])}; use "
                            "SIZE[:NUMA][:mig] per GPU, SIZE as 16GiB or 16384 (MiB), e.g. 16GiB or 16GiB,24GiB:1"
                            ) from None
        if size == 0:
            raise ValueError(f"simulated GPU {parts[0]!r} (in {spec!r}) has no memory: give its size, e.g. 16GiB "
                             "(a bare number is MiB)")
        if size > MAX_SIM_GPU:
            raise ValueError(f"simulated GPU {parts[0]!r} (in {spec!r}) is larger than any GPU (at most 16TiB); "
                             "give a GPU's size, e.g. 80GiB")
        for extra in parts[1:]:
            if extra != "mig" and not (extra.isdigit() and int(extra) < 64):
                raise ValueError(f"simulated GPU {item!r}: {extra!r} is neither a NUMA node (0-63) nor 'mig'; "
                                 "use SIZE[:NUMA][:mig], e.g. 16GiB or 80GiB:1")


def sim_env(gpus: str, state: str | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment that makes a process load the simulated libcuda/libnvidia-ml for this node."""
    validate_gpus(gpus)
    env = dict(os.environ if base is None else base)
    paths = lib_paths()
    env["MEMSLICE_SIM_GPUS"] = gpus
    env["MEMSLICE_SIM_STATE"] = state or env.get("MEMSLICE_SIM_STATE") or default_state_path(gpus)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (paths.sim_dir, env.get("LD_LIBRARY_PATH", "")) if p)
    return env


def inject_xid(gpu: int, xid: int, state: str) -> None:
    """Queue an Xid critical-error event on a simulated GPU (delivered by nvmlEventSetWait_v2)."""
    old = os.environ.get("MEMSLICE_SIM_STATE")
    os.environ["MEMSLICE_SIM_STATE"] = state
    try:
        lib = ctypes.CDLL(lib_paths().sim_nvml)
        lib.memsliceSimInjectXid.argtypes = [ctypes.c_uint, ctypes.c_ulonglong]
        if lib.memsliceSimInjectXid(gpu, xid) != 0:
            raise ValueError(f"cannot inject Xid {xid} on GPU {gpu} of {state}: no such GPU "
                             "(or the state file is unusable)")
    finally:
        if old is None:
            os.environ.pop("MEMSLICE_SIM_STATE", None)
        else:
            os.environ["MEMSLICE_SIM_STATE"] = old

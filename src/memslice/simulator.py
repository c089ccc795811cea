"""The simulated GPU from Python: environment for processes that should use it, and its controls."""

from __future__ import annotations

import ctypes
import hashlib
import os
import tempfile
from typing import TypedDict

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


SPEC_MAX = 255  # characters: what the node file keeps of MEMSLICE_SIM_GPUS
TOPO_HINT = ("a group is two or more GPU indices joined by '-' (0-1 or 0-1-2-3), groups separated by ',', e.g. "
             "80GiB,80GiB,80GiB,80GiB;nvlink=0-1,2-3;pcie=0-1,2-3")


def gpu_list(spec: str) -> list[str]:
    """The GPU entries of a MEMSLICE_SIM_GPUS value (the part before the topology options)."""
    return spec.split(";", 1)[0].split(",")


def parse_topology(spec: str) -> dict[str, list[list[int]]]:
    """The `;nvlink=GROUPS;pcie=GROUPS` options of a MEMSLICE_SIM_GPUS value, as the simulated driver reads them
    (interposer/sim/simtopo.c): each key at most once; a group has two or more distinct GPU indices below the GPU
    count; a GPU is in one pcie group at most. ValueError naming the bad option or group and the fix."""
    count = len(gpu_list(spec))
    out: dict[str, list[list[int]]] = {}
    for opt in spec.split(";")[1:]:
        key, _, value = opt.partition("=")
        if key not in ("nvlink", "pcie") or key in out or not _:
            raise ValueError(f"MEMSLICE_SIM_GPUS={spec}: option {opt} is unknown or given twice; after the GPU list "
                             "use ;nvlink=GROUPS and ;pcie=GROUPS once each, e.g. 80GiB,80GiB;nvlink=0-1")
        groups: list[list[int]] = []
        for group in value.split(","):
            ids = [int(x) if x.isdigit() and len(x) <= 3 else -1 for x in group.split("-")]
            taken = {i for g in groups for i in g} if key == "pcie" else set()
            if (len(ids) < 2 or len(set(ids)) != len(ids) or any(not 0 <= i < count for i in ids)
                    or taken & set(ids)):
                raise ValueError(f"MEMSLICE_SIM_GPUS={spec}: {key} group '{group}' is not valid; {TOPO_HINT} "
                                 f"(GPU indices below {count}{'' if key == 'nvlink' else ', each in one pcie group'})")
            groups.append(ids)
        out[key] = groups
    return out


def validate_gpus(spec: str) -> None:
    """Raise ValueError naming the bad entry unless spec is SIZE[:NUMA][:mig](,…) and valid topology options."""
    if not spec.strip():
        raise ValueError("the simulated GPU list is empty; give each GPU's size, e.g. --simulate-gpu 16GiB")
    if len(spec) > SPEC_MAX:
        raise ValueError(f"the simulated GPU list is longer than {SPEC_MAX} characters; describe fewer GPUs")
    if len(gpu_list(spec)) > 16:
        raise ValueError(f"the simulated GPU list {spec!r} has more than 16 GPUs; the simulated node has at most 16")
    for item in gpu_list(spec):
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
    parse_topology(spec)


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


class Topology(TypedDict):
    matrix: list[list[str]]  # per pair of GPUs: NV, or the PCIe level's word
    numa: list[int]


# nvmlGpuTopologyLevel_t (nvml.h) -> the words of `nvidia-smi topo -m`
LEVEL_WORDS = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


def read_topology(state: str) -> Topology:
    """The simulated node's topology as NVML answers it (the calls a node agent makes): per pair of GPUs the
    PCIe level word and NVLink (P2P status of NVML_P2P_CAPS_INDEX_NVLINK), and each GPU's NUMA node."""
    old = os.environ.get("MEMSLICE_SIM_STATE")
    os.environ["MEMSLICE_SIM_STATE"] = state
    try:
        lib = ctypes.CDLL(lib_paths().sim_nvml)
        if lib.nvmlInit_v2() != 0:
            raise ValueError(f"the simulated NVML cannot read {state}; check the file (or delete it to start anew)")
        count = ctypes.c_uint()
        lib.nvmlDeviceGetCount_v2(ctypes.byref(count))
        handles = []
        for i in range(count.value):
            h = ctypes.c_void_p()
            lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h))
            handles.append(h)
        level, status, numa = ctypes.c_int(), ctypes.c_int(), ctypes.c_uint()
        words: list[list[str]] = []
        for a in handles:
            row = []
            for b in handles:
                lib.nvmlDeviceGetTopologyCommonAncestor(a, b, ctypes.byref(level))
                lib.nvmlDeviceGetP2PStatus(a, b, 2, ctypes.byref(status))  # NVML_P2P_CAPS_INDEX_NVLINK
                row.append("NV" if status.value == 0 and a is not b else LEVEL_WORDS.get(level.value, "?"))
            words.append(row)
        numas = []
        for h in handles:
            lib.nvmlDeviceGetNumaNodeId(h, ctypes.byref(numa))
            numas.append(int(numa.value))
        return Topology(matrix=words, numa=numas)
    finally:
        if old is None:
            os.environ.pop("MEMSLICE_SIM_STATE", None)
        else:
            os.environ["MEMSLICE_SIM_STATE"] = old


def render_topology(topo: Topology) -> str:
    """`nvidia-smi topo -m`'s picture: NV (NVLink), PIX (one PCIe switch), NODE (one NUMA node), SYS (across)."""
    matrix = topo["matrix"]
    n = len(matrix)
    lines = ["      " + "".join(f"GPU{j:<4}" for j in range(n)) + "NUMA"]
    for i, row in enumerate(matrix):
        lines.append(f"GPU{i:<3}" + "".join(f"{w:<7}" for w in row) + str(topo["numa"][i]))
    lines.append("NV: NVLink  PIX: one PCIe switch  NODE: one NUMA node  SYS: across NUMA nodes")
    return "\n".join(lines)

"""The node's GPUs through NVML (pynvml): discovery, memory use, and Xid event waiting.

This is the only module that talks to NVML. With the simulated backend the simulated libnvidia-ml.so.1 is
loaded into the process (RTLD_GLOBAL) before pynvml opens the library by its SONAME, so pynvml uses it.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import threading
from dataclasses import dataclass

from memslice import errors
from memslice.limits import DRIVER_SONAMES, own_mapped_libraries

log = logging.getLogger(__name__)

DEFAULT_SIM_GPUS = "16GiB"


class GpuError(errors.UnavailableError):
    """NVML is missing or failing; the message says what to check."""


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    model: str
    mem_mib: int  # what can be allocated, and what is advertised: allocatable_mib()
    numa: int | None  # None when NVML does not know (no topology is advertised then)
    mig: bool
    nvml_total_mib: int = 0  # NVML's total (v1), the driver's reserved memory included; 0: not read
    reserved_mib: int | None = None  # nvmlDeviceGetMemoryInfo_v2's reserved; None: the driver lacks v2
    cuda_total_mib: int | None = None  # cuDeviceTotalMem_v2; None: libcuda could not be read
    nvlink: tuple[int, ...] = ()  # indices of the GPUs it reaches by NVLink (NVML P2P status); () also unknown
    pcie: str | None = None  # its PCIe switch label (GPUs with the same one share a switch); None: unknown


@dataclass(frozen=True)
class XidEvent:
    uuid: str
    xid: int


def allocatable_mib(nvml_total: int, reserved: int | None, cuda_total: int | None) -> int:
    """What processes can allocate on a GPU (bytes in, MiB out): NVML's total less the memory the driver
    reserves (an H100: 81,559 - 480 = 81,079 MiB), never more than CUDA's own total where it could be
    read; NVML's total alone only when neither can be (an old driver without the v2 call, no libcuda)."""
    can = nvml_total - reserved if reserved is not None else nvml_total
    if cuda_total is not None and 0 < cuda_total < can:
        can = cuda_total
    return max(can, 0) >> 20


# nvml.h: nvmlGpuTopologyLevel_t (SINGLE/MULTIPLE: the two GPUs share a PCIe switch, or several without crossing
# the host bridge; INTERNAL: one board) and nvmlGpuP2PCapsIndex_t's NVLINK, nvmlGpuP2PStatus_t's OK
TOPOLOGY_MULTIPLE = 20
P2P_CAPS_INDEX_NVLINK = 2
P2P_STATUS_OK = 0
MAX_TOPOLOGY_GPUS = 64  # pairs asked of NVML grow as the square: a node with more GPUs publishes no topology


def topology(indices: list[int], levels: dict[tuple[int, int], int | None],
             nvlink: dict[tuple[int, int], bool | None]) -> dict[int, tuple[tuple[int, ...], str | None]]:
    """Each GPU's NVLink peers and PCIe switch label (contract.Gpu.nvlink / .pcie) from what NVML answered for
    each pair (i < j): the common ancestor's level, and whether P2P over NVLink is OK (None: NVML could not say).
    Pure. GPUs whose common ancestor is at most NVML_TOPOLOGY_MULTIPLE share a switch, transitively, and are
    labelled by the lowest index of their group ("pcie<i>"); a GPU whose pairs were all unanswered gets None
    (unknown), as does every GPU when no pair was answered."""
    group = {i: i for i in indices}

    def root(i: int) -> int:
        while group[i] != i:
            i = group[i]
        return i

    known: set[int] = set()
    for (i, j), level in levels.items():
        if level is None:
            continue
        known.update((i, j))
        if level <= TOPOLOGY_MULTIPLE:
            a, b = root(i), root(j)
            group[max(a, b)] = min(a, b)
    peers: dict[int, list[int]] = {i: [] for i in indices}
    for (i, j), ok in nvlink.items():
        if ok:
            peers[i].append(j)
            peers[j].append(i)
    return {i: (tuple(sorted(peers[i])), f"pcie{root(i)}" if i in known else None) for i in indices}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class Nvml:
    """A process-wide NVML session. `simulate` loads memslice's simulated driver first."""

    _lock = threading.Lock()
    _sim_loaded: str | None = None

    def __init__(self, *, simulate: bool) -> None:
        self.simulate = simulate
        self._started = False

    def start(self) -> None:
        import pynvml

        with Nvml._lock:
            if self.simulate and Nvml._sim_loaded is None:
                from memslice.paths import lib_dir

                path = str(lib_dir() / "sim" / "libnvidia-ml.so.1")
                if not os.path.exists(path):
                    raise GpuError(f"simulated NVML {path} is missing: build it with `make -C interposer`")
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                Nvml._sim_loaded = path
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as exc:
                hint = ("the simulated NVML failed to start; check MEMSLICE_SIM_GPUS and MEMSLICE_SIM_STATE"
                        if self.simulate else
                        "is the NVIDIA driver installed and the container started with the NVIDIA runtime "
                        "(libnvidia-ml.so.1 visible)? Use --simulate to run without a GPU")
                raise GpuError(f"NVML initialisation failed: {exc}; {hint}") from exc
            self._started = True

    def stop(self) -> None:
        import pynvml

        if self._started:
            self._started = False
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError as exc:
                log.debug("nvmlShutdown: %s", exc)

    def discover(self) -> list[GpuInfo]:
        """Every GPU NVML sees, MIG-enabled ones included (the caller decides what to skip)."""
        import pynvml

        try:
            return self._discover()
        except pynvml.NVMLError as exc:
            raise GpuError(f"NVML could not describe the GPUs: {exc}; check `nvidia-smi` on the node"
                           ) from exc

    def _discover(self) -> list[GpuInfo]:
        import pynvml

        cuda_totals = _cuda_totals(self.simulate)
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            try:
                raw = int(pynvml.nvmlDeviceGetNumaNodeId(h))
                numa: int | None = raw if raw >= 0 else None
            except (pynvml.NVMLError, AttributeError):
                numa = None
            try:
                current, _pending = pynvml.nvmlDeviceGetMigMode(h)
                mig = current == pynvml.NVML_DEVICE_MIG_ENABLE
            except pynvml.NVMLError:
                mig = False  # not supported on this GPU
            total, reserved = _memory(h)
            uuid = _text(pynvml.nvmlDeviceGetUUID(h))
            cuda = cuda_totals.get(uuid)
            if cuda is not None and reserved is not None and abs(total - reserved - cuda) > 64 << 20:
                log.warning("GPU %s: NVML's total less reserved (%d MiB) is not CUDA's total (%d MiB); "
                            "advertising the smaller", uuid, (total - reserved) >> 20, cuda >> 20)
            out.append(GpuInfo(index=int(pynvml.nvmlDeviceGetIndex(h)), uuid=uuid,
                               model=_text(pynvml.nvmlDeviceGetName(h)),
                               mem_mib=allocatable_mib(total, reserved, cuda), numa=numa, mig=mig,
                               nvml_total_mib=total >> 20, reserved_mib=None if reserved is None else reserved >> 20,
                               cuda_total_mib=None if cuda is None else cuda >> 20))
        return _with_topology(out)

    def used_mib(self, uuid: str) -> int | None:
        """Physical memory in use on the GPU, or None when NVML cannot answer for it."""
        import pynvml

        try:
            h = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            try:  # v2: allocations only (v1's used adds the driver's reserved memory)
                return int(pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).used) >> 20
            except pynvml.NVMLError:
                return int(pynvml.nvmlDeviceGetMemoryInfo(h).used) >> 20
        except pynvml.NVMLError:
            return None

    def responds(self, uuid: str) -> bool:
        return self.used_mib(uuid) is not None


def _with_topology(gpus: list[GpuInfo]) -> list[GpuInfo]:
    """The GPUs with their NVLink peers and PCIe switch from NVML (nvmlDeviceGetTopologyCommonAncestor,
    nvmlDeviceGetP2PStatus with NVML_P2P_CAPS_INDEX_NVLINK), asked once per pair; a pair NVML cannot answer
    (NOT_SUPPORTED, an old driver, a simulator without topology) is unknown, never a failure."""
    import pynvml

    if not 1 < len(gpus) <= MAX_TOPOLOGY_GPUS:
        if len(gpus) > MAX_TOPOLOGY_GPUS:
            log.warning("%d GPUs: more than %d, no topology is published", len(gpus), MAX_TOPOLOGY_GPUS)
        return gpus
    handles = {g.index: pynvml.nvmlDeviceGetHandleByUUID(g.uuid) for g in gpus}
    levels: dict[tuple[int, int], int | None] = {}
    nvlink: dict[tuple[int, int], bool | None] = {}
    failures: set[str] = set()
    for i in handles:
        for j in handles:
            if i >= j:
                continue
            try:
                levels[(i, j)] = int(pynvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j]))
            except pynvml.NVMLError as exc:
                levels[(i, j)] = None
                failures.add(f"common ancestor: {exc}")
            try:
                nvlink[(i, j)] = int(pynvml.nvmlDeviceGetP2PStatus(handles[i], handles[j],
                                                                   P2P_CAPS_INDEX_NVLINK)) == P2P_STATUS_OK
            except pynvml.NVMLError as exc:
                nvlink[(i, j)] = None
                failures.add(f"NVLink P2P status: {exc}")
    if failures:
        log.info("GPU topology partly unknown (%s): the scheduler extender prefers GPUs by what is known",
                 "; ".join(sorted(failures)))
    topo = topology(sorted(handles), levels, nvlink)
    return [dataclasses.replace(g, nvlink=topo[g.index][0], pcie=topo[g.index][1]) for g in gpus]


def _memory(h: object) -> tuple[int, int | None]:
    """NVML's total and reserved bytes of a GPU; reserved is None when the driver has no v2 call."""
    import pynvml

    total = int(pynvml.nvmlDeviceGetMemoryInfo(h).total)
    try:
        return total, int(pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).reserved)
    except pynvml.NVMLError as exc:
        log.debug("nvmlDeviceGetMemoryInfo_v2: %s; advertising NVML's total less nothing", exc)
        return total, None


def _cuda_totals(simulate: bool) -> dict[str, int]:
    """cuDeviceTotalMem_v2 of every GPU the driver shows, by NVML-style UUID: the cross-check of what NVML
    says can be allocated. Empty when libcuda.so.1 cannot be loaded or answers an error (logged)."""
    try:
        if simulate:
            from memslice.paths import lib_dir

            cuda = ctypes.CDLL(str(lib_dir() / "sim" / "libcuda.so.1"))
        else:
            cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        log.info("libcuda.so.1 cannot be loaded (%s): capacity from NVML alone", exc)
        return {}
    count, total = ctypes.c_int(0), ctypes.c_size_t(0)
    uuid = (ctypes.c_ubyte * 16)()
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        log.info("libcuda.so.1 did not start: capacity from NVML alone")
        return {}
    out = {}
    for i in range(count.value):
        dev = ctypes.c_int(0)
        if (cuda.cuDeviceGet(ctypes.byref(dev), i) != 0 or cuda.cuDeviceGetUuid_v2(uuid, dev) != 0
                or cuda.cuDeviceTotalMem_v2(ctypes.byref(total), dev) != 0):
            continue
        out[uuid_text(bytes(uuid))] = int(total.value)
    return out


def uuid_text(raw: bytes) -> str:
    """NVML's spelling of a 16-byte CUDA UUID: GPU-8-4-4-4-12 lower-case hex."""
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class XidEventSet:
    """An NVML event set registered for critical-Xid events on the given GPUs."""

    def __init__(self, gpus: list[GpuInfo]) -> None:
        import pynvml

        self._set = pynvml.nvmlEventSetCreate()
        self.registered: list[str] = []
        for gpu in gpus:
            h = pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
            try:
                supported = pynvml.nvmlDeviceGetSupportedEventTypes(h)
                if not supported & pynvml.nvmlEventTypeXidCriticalError:
                    log.warning("GPU %d (%s) does not report Xid events; its health is not watched",
                                gpu.index, gpu.uuid)
                    continue
                pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, self._set)
                self.registered.append(gpu.uuid)
            except pynvml.NVMLError as exc:
                log.warning("GPU %d (%s): cannot register for Xid events (%s); its health is not watched",
                            gpu.index, gpu.uuid, exc)

    def wait(self, timeout_ms: int) -> XidEvent | None:
        """One event, or None when `timeout_ms` passes without one."""
        import pynvml

        try:
            data = pynvml.nvmlEventSetWait_v2(self._set, timeout_ms)
        except pynvml.NVMLError_Timeout:
            return None
        if data.eventType != pynvml.nvmlEventTypeXidCriticalError:
            return None
        return XidEvent(uuid=_text(pynvml.nvmlDeviceGetUUID(data.device)), xid=int(data.eventData))

    def close(self) -> None:
        import pynvml

        try:
            pynvml.nvmlEventSetFree(self._set)
        except pynvml.NVMLError as exc:
            log.debug("nvmlEventSetFree: %s", exc)


def driver_host_paths() -> dict[str, str]:
    """The node's driver libraries this agent loaded (NVML at start, libcuda for the capacity check), by
    soname: what each container's shim must load and measure with, never a tenant's copy.
    A library not loaded is left out (logged: those containers' shims find it by name)."""
    out = own_mapped_libraries()
    for soname in DRIVER_SONAMES:
        if soname not in out:
            log.warning("%s is not loaded in the agent: containers' shims find it by name", soname)
    return out

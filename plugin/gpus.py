"""The node's GPUs through NVML (pynvml): discovery, memory use, and Xid event waiting.

This is the only module that talks to NVML. With the simulated backend the simulated libnvidia-ml.so.1 is
loaded into the process (RTLD_GLOBAL) before pynvml opens the library by its SONAME, so pynvml uses it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from dataclasses import dataclass

from memslice import errors
from memslice.plugin.devices import GpuShape

log = logging.getLogger(__name__)

DEFAULT_SIM_GPUS = "16GiB"


class GpuError(errors.UnavailableError):
    """NVML is missing or failing; the message says what to check."""


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    model: str
    mem_mib: int
    numa: int | None  # None when NVML does not know (no topology is advertised then)
    mig: bool

    def shape(self) -> GpuShape:
        return GpuShape(index=self.index, mem_mib=self.mem_mib, numa=self.numa)


@dataclass(frozen=True)
class XidEvent:
    uuid: str
    xid: int


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
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            out.append(GpuInfo(index=int(pynvml.nvmlDeviceGetIndex(h)),
                               uuid=_text(pynvml.nvmlDeviceGetUUID(h)),
                               model=_text(pynvml.nvmlDeviceGetName(h)), mem_mib=int(mem.total) >> 20,
                               numa=numa, mig=mig))
        return out

    def used_mib(self, uuid: str) -> int | None:
        """Physical memory in use on the GPU, or None when NVML cannot answer for it."""
        import pynvml

        try:
            h = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            return int(pynvml.nvmlDeviceGetMemoryInfo(h).used) >> 20
        except pynvml.NVMLError:
            return None

    def responds(self, uuid: str) -> bool:
        return self.used_mib(uuid) is not None


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

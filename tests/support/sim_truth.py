"""What the simulated GPU itself says, read past the shim: the physical truth tests compare the quota with.

`gpu_truth(env)` asks the simulated NVML in a fresh process with no shim loaded (as `nvidia-smi` on the node
would): the device's used memory (NVML v2: reserved memory apart) and its process list. The simulator reclaims
the memory of processes that died (as the driver frees a dead process's memory) before it answers.
`env` is a tenant's environment (its MEMSLICE_SIM_* keys and LD_LIBRARY_PATH name the simulated node); the
GPU-memory keys and the preload are dropped."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

from conftest import preload

_PROBE = """import ctypes, json, os, sys, pynvml
ctypes.CDLL(os.path.join(os.environ['LD_LIBRARY_PATH'].split(':')[0], 'libnvidia-ml.so.1'), mode=ctypes.RTLD_GLOBAL)
pynvml.nvmlInit()
g = sys.argv[1]
h = pynvml.nvmlDeviceGetHandleByUUID(g) if g.startswith("GPU-") else pynvml.nvmlDeviceGetHandleByIndex(int(g))
procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
mem = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
print(json.dumps({"used": mem.used, "total": mem.total, "procs": {p.pid: p.usedGpuMemory for p in procs}}))
"""


@dataclass(frozen=True)
class GpuTruth:
    used_bytes: int                # allocated on the device, node-wide (NVML v2 used)
    total_bytes: int
    processes: dict[int, int]      # pid -> device bytes, as the driver lists them

    @property
    def used_mib(self) -> int:
        return self.used_bytes >> 20


def gpu_truth(env: dict[str, str], gpu: int | str = 0) -> GpuTruth:
    """GPU `gpu` (an index, or a UUID) as the simulated NVML reports it to a process without the shim."""
    plain = {k: v for k, v in env.items() if not k.startswith(("MEMSLICE_GPU", "MEMSLICE_REGION"))}
    plain["LD_PRELOAD"] = preload()  # only the sanitizer runtime, in the sanitizer run
    if not plain["LD_PRELOAD"]:
        del plain["LD_PRELOAD"]
    out = subprocess.run([sys.executable, "-c", _PROBE, str(gpu)], env=plain, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    return GpuTruth(got["used"], got["total"], {int(pid): b for pid, b in got["procs"].items()})


_WATCH = """import ctypes, json, os, select, sys, pynvml
ctypes.CDLL(os.path.join(os.environ['LD_LIBRARY_PATH'].split(':')[0], 'libnvidia-ml.so.1'), mode=ctypes.RTLD_GLOBAL)
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(int(sys.argv[1]))
peak = samples = 0
print("watching", flush=True)
while not select.select([sys.stdin], [], [], float(sys.argv[2]))[0]:
    pynvml.nvmlDeviceGetComputeRunningProcesses(h)  # the simulator reclaims dead processes' memory first
    peak = max(peak, pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).used)
    samples += 1
print(json.dumps({"peak": peak, "samples": samples}))
"""


class GpuWatch:
    """Samples GPU `gpu`'s used memory through the simulated NVML, from a process without the shim, every
    `period` s until `stop()`, which returns (highest used bytes seen, samples). The simulator counts a killed
    process's memory until a sweep reclaims it (the driver frees it at the process's exit); each sample sweeps
    first, so what it sees is what live processes hold, as on a real GPU."""

    def __init__(self, env: dict[str, str], gpu: int = 0, period: float = 0.05) -> None:
        plain = {k: v for k, v in env.items() if not k.startswith(("MEMSLICE_GPU", "MEMSLICE_REGION"))}
        plain.pop("LD_PRELOAD", None)
        if preload():
            plain["LD_PRELOAD"] = preload()
        self.proc = subprocess.Popen([sys.executable, "-c", _WATCH, str(gpu), str(period)], env=plain,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "watching"

    def stop(self) -> tuple[int, int]:
        out, _ = self.proc.communicate("stop\n", timeout=60)
        got = json.loads(out)
        return int(got["peak"]), int(got["samples"])

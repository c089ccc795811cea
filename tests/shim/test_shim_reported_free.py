"""What a program is told is free: `free = min(quota - charged, physical free)` (docs/architecture.md,
"Interposer"), from CUDA and NVML alike. A quota's headroom is not free memory when a neighbour has taken the
GPU's: the program is told the smaller of the two, so a framework never sizes a pool to memory that is not
there. The physical figure is the simulated driver's own, asked by processes without the shim."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import preload, run

QUOTA_MIB = 4096
NVML_FREE = """import ctypes, json, os, pynvml
ctypes.CDLL(os.path.join(os.environ['LD_LIBRARY_PATH'], 'libnvidia-ml.so.1'), mode=ctypes.RTLD_GLOBAL)
pynvml.nvmlInit()
m = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0))
print(json.dumps({"free_mib": m.free >> 20, "total_mib": m.total >> 20}))
"""


def tenant(env: dict[str, str], *mib: int) -> tuple[subprocess.Popen[str], dict[str, int]]:
    """`memslice.tenant` holding `mib`, once it has said "ready", and what cuMemGetInfo told it (MiB)."""
    p = subprocess.Popen([sys.executable, "-m", "memslice.tenant", *map(str, mib)], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    for line in p.stdout:
        event = json.loads(line)
        assert event.get("result", 0) == 0, event
        if event["event"] == "ready":
            return p, {"free_mib": event["free_mib"], "total_mib": event["total_mib"]}
    raise AssertionError(f"the tenant ended: {p.wait(30)}")


def told(env: dict[str, str]) -> tuple[dict[str, int], dict[str, int]]:
    """(CUDA's cuMemGetInfo, NVML's nvmlDeviceGetMemoryInfo) in MiB, for a new process with this env."""
    proc, cuda = tenant(env)
    proc.communicate("", timeout=30)
    out = run([sys.executable, "-c", NVML_FREE], env)
    assert out.returncode == 0, out.stderr
    return cuda, json.loads(out.stdout)


def test_free_is_the_smaller_of_the_quotas_headroom_and_the_gpus_free_memory(node, tmp_path):
    n = node(context_overhead="0")  # contexts take nothing: the figures are the allocations'
    plain = dict(n.env, LD_PRELOAD=preload()) if preload() else n.env  # the driver's own view, past the shim
    env = n.container(tmp_path / "c", f"{QUOTA_MIB}MiB", MEMSLICE_CONTEXT_RESERVE="0")
    mine, _ = tenant(env, 100)  # the container is charged 100 MiB
    try:
        # the GPU has room: the quota's side of the min
        cuda, nvml = told(env)
        gpu_cuda, gpu_nvml = told(plain)
        assert gpu_cuda["free_mib"] == 16384 - 100 and gpu_cuda["free_mib"] > QUOTA_MIB - 100
        assert (cuda["free_mib"], cuda["total_mib"]) == (QUOTA_MIB - 100, QUOTA_MIB)
        assert (nvml["free_mib"], nvml["total_mib"]) == (QUOTA_MIB - 100, QUOTA_MIB)
        # a neighbour outside the container takes 14000 MiB of the GPU: the GPU's side of the min
        neighbour, _ = tenant(plain, 14000)
        try:
            cuda, nvml = told(env)
            gpu_cuda, gpu_nvml = told(plain)
            assert gpu_cuda["free_mib"] == 16384 - 14100 < QUOTA_MIB - 100
            assert cuda["free_mib"] == gpu_cuda["free_mib"] and cuda["total_mib"] == QUOTA_MIB, (cuda, gpu_cuda)
            assert nvml["free_mib"] == gpu_nvml["free_mib"] and nvml["total_mib"] == QUOTA_MIB, (nvml, gpu_nvml)
        finally:
            neighbour.communicate("", timeout=30)
        cuda, nvml = told(env)  # and back to the quota's side once it leaves
        assert cuda["free_mib"] == nvml["free_mib"] == QUOTA_MIB - 100
    finally:
        mine.communicate("", timeout=30)

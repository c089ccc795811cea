"""The shim against the real driver: NVML inside the shim reports the quota and outside it the GPU; the real
context size against MEMSLICE_CONTEXT_RESERVE; every name the shim routes exists in the real libcuda, and no
versioned variant of a routed function is left unrouted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from gpukit import QUOTA_MIB, last_json, memslice_run, no_gpu_reason, physical_total_mib, real_env, report

# Skipped, saying why, without an NVIDIA driver and a GPU (make gpu-check runs these).
pytestmark = pytest.mark.skipif(no_gpu_reason() is not None, reason=no_gpu_reason() or "")

HOOKS = Path(__file__).resolve().parents[2] / "interposer" / "src" / "hooks.def"

NVML = r"""
import json, pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
print(json.dumps({"total": n.nvmlDeviceGetMemoryInfo(h).total >> 20}))
"""


def test_nvml_inside_the_shim_is_the_quota_outside_the_gpu(tmp_path):
    inside = last_json(memslice_run(tmp_path / "region", NVML))
    outside = subprocess.run([sys.executable, "-c", NVML], env=real_env(), capture_output=True, text=True,
                             timeout=120)
    assert inside["total"] == QUOTA_MIB
    assert last_json(outside)["total"] == physical_total_mib()


CONTEXT = r"""
import ctypes, json, pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
before = pynvml.nvmlDeviceGetMemoryInfo(h).used
cuda = ctypes.CDLL("libcuda.so.1")
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
cuda.cuInit(0); cuda.cuDeviceGet(ctypes.byref(dev), 0); cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
cuda.cuCtxSetCurrent(ctx)
mine = [p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
after = pynvml.nvmlDeviceGetMemoryInfo(h).used
print(json.dumps({"delta": (after - before) >> 20, "listed": [m >> 20 for m in mine if m]}))
"""


def test_context_size_against_the_reserve():
    got = last_json(subprocess.run([sys.executable, "-c", CONTEXT], env=real_env(), capture_output=True, text=True,
                                   timeout=120))
    reserve = 300  # MEMSLICE_CONTEXT_RESERVE's default, MiB (docs/architecture.md)
    report("context size", measured_mib=got["delta"], nvml_listed_mib=got["listed"], reserve_mib=reserve)
    assert 0 < got["delta"] <= 2 * reserve, "the default reserve is far from what a context takes here"


def real_libcuda() -> str:
    out = subprocess.run([sys.executable, "-c", "import ctypes, os; ctypes.CDLL('libcuda.so.1');"
                          "print([l.split()[-1] for l in open('/proc/self/maps') if 'libcuda.so' in l][0])"],
                         env=real_env(), capture_output=True, text=True, timeout=60)
    return out.stdout.strip()


def test_real_libcuda_exports_against_the_shims_routes():
    lib = real_libcuda()
    names = set(subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True,
                               check=True).stdout.split())
    routed = re.findall(r"^HOOK_ENTRY\((cu\w+)\)", HOOKS.read_text(), re.M)
    missing = [n for n in routed if n not in names]
    assert not missing, f"the shim routes names the real driver lacks: {missing}"
    bases = {re.sub(r"(_v\d+)?(_ptsz|_ptds)?$", "", n) for n in routed}
    variants = {n for n in names if re.sub(r"(_v\d+)?(_ptsz|_ptds)?$", "", n) in bases}
    unrouted = sorted(variants - set(routed))
    report("real libcuda", path=lib, routed=len(routed), unrouted_variants=unrouted)
    assert not unrouted, f"versioned variants of routed functions that bypass the shim: {unrouted}"

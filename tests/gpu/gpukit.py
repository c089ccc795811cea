"""Helpers of the real-GPU check kit (`make gpu-check`): tests that need an NVIDIA driver and a GPU, run
through the real shim with `memslice run`. Without a driver every test here is skipped, saying why; with one,
each checks a framework or a figure on real hardware (docs/operations.md, "Checking a real GPU")."""

from __future__ import annotations

import ctypes
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

QUOTA_MIB = 2048


@functools.cache
def no_gpu_reason() -> str | None:
    """Why the real-GPU checks cannot run here, or None when an NVIDIA driver with a GPU is present."""
    from memslice.paths import lib_paths

    sim_dir = os.path.realpath(lib_paths().sim_dir)
    probe = r"""
import ctypes, sys
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError as e:
    print("no NVIDIA driver: libcuda.so.1 cannot be loaded (%s)" % e); sys.exit()
n, name = ctypes.c_int(), ctypes.create_string_buffer(256)
rc = cuda.cuInit(0)
if rc != 0:
    print("no usable NVIDIA driver: cuInit returned %d" % rc); sys.exit()
if cuda.cuDeviceGetCount(ctypes.byref(n)) != 0 or n.value == 0:
    print("the NVIDIA driver sees no GPU"); sys.exit()
cuda.cuDeviceGetName(name, 256, 0)
if b"(memslice)" in name.value:
    print("libcuda.so.1 is memslice's simulated GPU, not a real driver"); sys.exit()
print("")
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSLICE_") and k != "LD_PRELOAD"}
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep)
                                             if p and os.path.realpath(p) != sim_dir)
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        return f"the driver probe crashed: {out.stderr.strip()[-300:]}"
    return out.stdout.strip() or None


def real_env() -> dict[str, str]:
    """The caller's environment without memslice settings or the simulated driver."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSLICE_") and k != "LD_PRELOAD"}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def memslice_run(region: Path, script: str, *args: str, quota_mib: int = QUOTA_MIB, extra: tuple[str, ...] = (),
                 env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run `python -c script args` under the real shim with a quota (and extra `memslice run` options)."""
    cmd = [sys.executable, "-m", "memslice.cli", "run", "--gpu-mem", f"{quota_mib}MiB", "--region-dir",
           str(region), *extra, "--", sys.executable, "-c", script, *args]
    return subprocess.run(cmd, env=env or real_env(), capture_output=True, text=True, timeout=timeout)


def last_json(out: subprocess.CompletedProcess[str]) -> dict:
    """The script's result: its last stdout line, JSON (the whole output on failure, for the report)."""
    assert out.returncode == 0, f"rc={out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(name: str, **figures: object) -> None:
    """Figures a person reads (pytest -s, or the -rA summary): printed, never asserted on."""
    print(f"\n[gpu-check] {name}: " + ", ".join(f"{k}={v}" for k, v in figures.items()))


def physical_total_mib() -> int:
    cuda = ctypes.CDLL("libcuda.so.1")
    t, f = ctypes.c_size_t(), ctypes.c_size_t()
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    cuda.cuInit(0)
    cuda.cuDeviceGet(ctypes.byref(dev), 0)
    cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
    cuda.cuCtxSetCurrent(ctx)
    cuda.cuMemGetInfo_v2(ctypes.byref(f), ctypes.byref(t))
    return t.value >> 20

"""Helpers for compute on the simulated GPU (issue 33): spin tenants and the simulator's own figures.

`Spinner` runs tests/c/spin_tenant (the `cbin["spin_tenant"]` program): spin(N ns) kernels in a loop, or a
queue of them left running (`launch_only`), in a real process on the simulated GPU (the shim preloaded if
the environment says so). `timeline(env, gpu)` reads the GPU's compute timeline from the simulator itself
(memsliceSimTimeline), `nvml_util(env, gpu)` what NVML reports from it."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from waiting import wait_until

TIMELINE = r"""
import ctypes, json, sys
lib = ctypes.CDLL("libcuda.so.1")
v = (ctypes.c_ulonglong * 256)()
n = lib.memsliceSimTimeline(int(sys.argv[1]), v, 256)
assert n >= 4, n
c = [{"pid": v[4 + 3 * i], "busy": v[5 + 3 * i], "queued": v[6 + 3 * i]} for i in range(v[3])]
print(json.dumps({"busy": v[0], "retired": v[1], "now": v[2], "clients": c}))
"""

NVML_UTIL = r"""
import json, sys
import pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(int(sys.argv[1]))
try:
    procs = {s.pid: s.smUtil for s in n.nvmlDeviceGetProcessUtilization(h, 0)}
except n.NVMLError_NotFound:
    procs = {}
print(json.dumps({"gpu": n.nvmlDeviceGetUtilizationRates(h).gpu, "procs": procs}))
"""


# The same through NVIDIA's Python bindings (cuda.bindings.driver, which resolves every entry point with
# cuGetProcAddress): argv[1] spin ns, argv[2] count; prints {"kernels", "query_running", "gpu_ms"}.
CUDA_BINDINGS_SPIN = r"""
import json, sys
import numpy as np
from cuda.bindings import driver as d
def ok(r):
    assert r[0] == d.CUresult.CUDA_SUCCESS, r
    return r[1] if len(r) == 2 else None
ok(d.cuInit(0))
ctx = ok(d.cuDevicePrimaryCtxRetain(ok(d.cuDeviceGet(0))))
ok(d.cuCtxSetCurrent(ctx))
fn = ok(d.cuModuleGetFunction(ok(d.cuModuleLoadData(b"MSSIMMOD" + bytes(8))), b"spin"))
st = ok(d.cuStreamCreate(0))
e0, e1 = ok(d.cuEventCreate(0)), ok(d.cuEventCreate(0))
arg = np.array([int(sys.argv[1])], dtype=np.uint64)
params = np.array([arg.ctypes.data], dtype=np.uint64)
ok(d.cuEventRecord(e0, st))
for _ in range(int(sys.argv[2])):
    ok(d.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, st, params.ctypes.data, 0))
ok(d.cuEventRecord(e1, st))
running = int(d.cuStreamQuery(st)[0])
ok(d.cuStreamSynchronize(st))
print(json.dumps({"kernels": int(sys.argv[2]), "query_running": running, "gpu_ms": ok(d.cuEventElapsedTime(e0, e1))}))
"""


def driver_env(env: dict[str, str]) -> dict[str, str]:
    """The driver's own view (no shim; the sanitizer runtime first in the sanitizer run): the simulator's figures."""
    out = {k: v for k, v in env.items() if k != "LD_PRELOAD"}
    first = os.environ.get("MEMSLICE_TEST_PRELOAD_FIRST", "")
    if first:
        out["LD_PRELOAD"] = first
    return out


def _probe(script: str, env: dict[str, str], gpu: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", script, str(gpu)], env=driver_env(env), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def timeline(env: dict[str, str], gpu: int = 0) -> dict[str, Any]:
    """busy (ns the GPU ran kernels), retired (busy of clients since released), now (the timeline's time),
    clients (live ones: pid, busy ns, queued ns). Invariant: busy == retired + sum of the clients' busy."""
    return _probe(TIMELINE, env, gpu)


def nvml_util(env: dict[str, str], gpu: int = 0) -> dict[str, Any]:
    """gpu: nvmlDeviceGetUtilizationRates().gpu; procs: {pid: smUtil} from nvmlDeviceGetProcessUtilization."""
    got = _probe(NVML_UTIL, env, gpu)
    got["procs"] = {int(k): v for k, v in got["procs"].items()}
    return got


def poll(fn: Any, what: str, deadline_s: float = 20.0) -> Any:
    """fn() until it returns something truthy, for at most deadline_s (tests/support/waiting.py)."""
    return wait_until(what, fn, deadline_s)


@dataclass
class Spinner:
    """One spin_tenant process."""

    exe: str
    env: dict[str, str]
    proc: subprocess.Popen[str] | None = None

    def run(self, ns: int, count: int | None = None, seconds: float | None = None, gpu: int = 0,
            start_at: int | None = None, timeout: float = 120) -> dict[str, Any]:
        """Run spin(ns) kernels (synchronizing after each) and return the program's JSON figures."""
        args = self._args(ns, count, seconds, gpu, start_at)
        out = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=timeout)
        assert out.returncode == 0, out.stderr
        result: dict[str, Any] = json.loads(out.stdout)
        return result

    def start(self, ns: int, count: int | None = None, seconds: float | None = None, gpu: int = 0,
              start_at: int | None = None) -> Spinner:
        """Start it in the background (collect with wait())."""
        self.proc = subprocess.Popen(self._args(ns, count, seconds, gpu, start_at), env=self.env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        return self

    def queue(self, ns: int, count: int, gpu: int = 0) -> Spinner:
        """Launch count spin(ns) kernels without waiting for them, and keep the process alive (kill() it)."""
        self.proc = subprocess.Popen([*self._args(ns, count, None, gpu, None), "--launch-only"], env=self.env,
                                     text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert self.proc.stdout
        ready, _, _ = select.select([self.proc.stdout], [], [], 60)
        line = self.proc.stdout.readline() if ready else ""
        assert line.startswith('{"launched"'), f"the tenant did not launch: {line!r} {self._stderr()}"
        return self

    def wait(self, timeout: float = 120) -> dict[str, Any]:
        assert self.proc
        out, err = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, err
        result: dict[str, Any] = json.loads(out)
        return result

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
        if self.proc:
            self.proc.wait(timeout=30)

    @property
    def pid(self) -> int:
        assert self.proc
        return self.proc.pid

    def _stderr(self) -> str:
        if self.proc and self.proc.poll() is not None and self.proc.stderr:
            return self.proc.stderr.read()
        return ""

    def _args(self, ns: int, count: int | None, seconds: float | None, gpu: int, start_at: int | None) -> list[str]:
        args = [self.exe, "--ns", str(ns), "--gpu", str(gpu)]
        if count is not None:
            args += ["--count", str(count)]
        if seconds is not None:
            args += ["--seconds", str(seconds)]
        if start_at is not None:
            args += ["--start-at", str(start_at)]
        return args


def monotonic_ns() -> int:
    """The simulated GPU's clock (CLOCK_MONOTONIC), for --start-at."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)
